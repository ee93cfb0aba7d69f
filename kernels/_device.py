"""The device facts the plans read: whether kernels run through the interpreter, the SM count,
TMA, and the overrides that make one GPU plan as another (the tests' SM count, an older GPU's
missing TMA or smaller shared memory). Read them through this module (`_device.NO_TMA`): the tests
replace them here.
"""
from __future__ import annotations

import functools
import os

import torch
from triton import knobs


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return bool(knobs.runtime.interpret)


# The SM count plans assume where there is no GPU to ask (Triton's interpreter on the CPU): an H100
# SXM's, so that the interpreter plans, and the tests check, what an H100 would run.
INTERPRETER_SM_COUNT = 132
# When set, every plan takes this SM count instead of the device's (the tests set it small so that
# persistent programs loop over several tiles or rows).
SM_COUNT_OVERRIDE: int | None = None


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(device: torch.device) -> int:
    # Cached: plans read it on every call's host path, which small launches cannot hide.
    return torch.cuda.get_device_properties(device).multi_processor_count


# Run as on a GPU without Hopper's TMA (TRITON_FUSION_NO_TMA=1): the kernels that read through
# host tensor descriptors take their plain-load path, as on an A100 or a consumer card, so that the
# path such GPUs run is tested on one that has TMA. With TRITON_FUSION_MAX_SHARED=<bytes>, kernels
# fit that much shared memory a block instead of the device's (an A100's 166912, a consumer
# card's 101376), as `launch` fits them.
NO_TMA = os.environ.get("TRITON_FUSION_NO_TMA", "0") == "1"
MAX_SHARED: int | None = int(os.environ.get("TRITON_FUSION_MAX_SHARED", "0")) or None


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device) -> tuple:
    return torch.cuda.get_device_capability(device)


def has_tma(device) -> bool:
    """Whether kernels may read through host tensor descriptors on `device`: TMA, sm_90+ (the
    interpreter emulates them), unless NO_TMA."""
    if NO_TMA:
        return False
    device = torch.device(device)
    return device.type != "cuda" or _capability(device)[0] >= 9


def sm_count_of(device=None) -> int:
    """The number of SMs of `device` (a CUDA device), else INTERPRETER_SM_COUNT (either way
    SM_COUNT_OVERRIDE when set)."""
    if SM_COUNT_OVERRIDE is not None:
        return SM_COUNT_OVERRIDE
    if device is not None and torch.device(device).type == "cuda":
        return _cuda_sm_count(torch.device(device))
    return INTERPRETER_SM_COUNT
