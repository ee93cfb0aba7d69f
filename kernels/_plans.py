"""Plans and launch settings, remembered: `cached` keeps a family's checks and plan per input
layout (`layout_key`), `fastest` times candidate launch settings once per key (on disk with
TRITON_CACHE_AUTOTUNING=1). Small calls are host-bound: this keeps their host work short.
"""
from __future__ import annotations

import torch
import triton
from triton import knobs

from . import _device
from ._checks import _Parameter, _Tensor
from ._device import _capability

# ------------------------------------------------------------------------------------------------
# Plans and checks, remembered. A public function checks its inputs and plans its launches on
# every call: for small tensors that Python costs more than the kernel runs. `cached` remembers
# the outcome per key: whatever the checks and the plan read (shapes, dtypes, devices, contiguity
# or strides, the options).

# Entries a cache holds; a full cache is emptied and refills.
PLAN_CACHE_MAX = 4096
_PLAN_CACHES: list[dict] = []
_plans_made_with = None  # the (_device.SM_COUNT_OVERRIDE, _device.NO_TMA) the cached plans saw


def layout_key(tensors, options=()) -> tuple | None:
    """The key for `cached` of the tensors' layouts (shape, dtype, device, and strides unless
    contiguous; None for None) and the options; None (compute without the cache) where a tensor
    is not a plain tensor (a subclass, a number) or an option is not None, an int or a str (a
    16.0 or a True must not find 16's entry and skip the check that refuses it)."""
    key = []
    append = key.append
    for t in tensors:
        if t is None:
            append(None)
            continue
        cls = t.__class__
        if cls is not _Tensor and cls is not _Parameter:
            return None
        append(t.shape)
        append(t.dtype)
        append(t.device)
        append(None if t.is_contiguous() else t.stride())
    for o in options:
        if o is not None and o.__class__ is not int and o.__class__ is not str:
            return None
        append(o)
    return tuple(key)


def plan_strides(t) -> tuple:
    """t's strides as a plan cached under `layout_key` can hold them: a non-contiguous t's (the
    key holds them), a contiguous t's as torch.empty makes them (the key holds its shape). A
    contiguous t may have other strides on its size-1 dims, which the kernels multiply by 0 only:
    they read the same elements."""
    if not t.is_contiguous():
        return t.stride()
    strides, step = [], 1
    for n in reversed(t.shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def plan_cache() -> dict:
    """A new cache for `cached` (emptied with the others when _device.SM_COUNT_OVERRIDE or _device.NO_TMA
    changes)."""
    cache: dict = {}
    _PLAN_CACHES.append(cache)
    return cache


def cached(cache: dict, key, compute, *args):
    """cache[key], else compute(*args), remembered under key.

    compute must depend on nothing but what key holds, and on _device.SM_COUNT_OVERRIDE and _device.NO_TMA (a
    change empties every cache). It raises on inputs it refuses: nothing is remembered then, so
    such inputs raise on every call. A key of None, or one that cannot be hashed (symbolic sizes
    while tracing), computes every time."""
    global _plans_made_with
    if key is None:
        return compute(*args)
    made_with = (_device.SM_COUNT_OVERRIDE, _device.NO_TMA)
    if made_with != _plans_made_with:
        for c in _PLAN_CACHES:
            c.clear()
        _plans_made_with = made_with
    try:
        return cache[key]
    except KeyError:
        pass
    except TypeError:
        return compute(*args)
    value = compute(*args)
    if len(cache) >= PLAN_CACHE_MAX:
        cache.clear()
    cache[key] = value
    return value

# ------------------------------------------------------------------------------------------------
# Launch settings timed on the device (attention's config, LayerNorm's forward plan).


TUNING_ROUNDS = 3


def fastest(memo: dict, key: tuple, candidates: list, time_ms, kernels, device):
    """The fastest of `candidates` for `key`: memo[key], else the choice a process on the same
    kind of GPU kept on disk, else timed now (`time_ms(candidate)` -> ms, the median of
    TUNING_ROUNDS interleaved rounds; a candidate that does not compile for this GPU, for shared
    memory, registers or a compiler pass that refuses it, is skipped) and remembered.

    The disk copy follows Triton's own autotuner: only with TRITON_CACHE_AUTOTUNING=1, in
    Triton's cache, named by Triton's version, the GPU (name, SM count, capability), the
    kernels' sources, the cache-invalidating environment, this module's overrides, the key and
    the candidates, so that a changed kernel or candidate list never takes an old choice. The
    choice is one of `candidates` whatever the file says: at worst a slower one, never a wrong
    result."""
    choice = memo.get(key)
    if choice is not None:
        return choice
    disk = _tuning_file(key, candidates, kernels, device) if knobs.autotuning.cache else None
    if disk is not None:
        choice = disk.load()
    if choice is None:
        runs = {}
        for cand in candidates:
            try:
                runs[cand] = [time_ms(cand)]
            except (triton.runtime.errors.OutOfResources,
                    triton.compiler.errors.CompilationError):
                continue
            except RuntimeError as e:  # an MLIR pass refusing the kernel (warp specialisation)
                if "PassManager::run failed" not in str(e):
                    raise
        if not runs:
            raise RuntimeError(f"no candidate compiles for {key}")
        # More rounds, interleaved: one timing per candidate moves by more than the candidates
        # differ (clocks and power settle while they run; docs/attention.md, tuner noise).
        for _ in range(TUNING_ROUNDS - 1):
            for cand, times in runs.items():
                times.append(time_ms(cand))
        timings = {cand: sorted(times)[len(times) // 2] for cand, times in runs.items()}
        choice = min(timings, key=timings.get)
        if disk is not None:
            disk.store(choice, timings)
    memo[key] = choice
    return choice


class _TuningFile:
    """One tuning choice in Triton's cache: the winner's index among the candidates, with every
    candidate's time for the record."""

    def __init__(self, digest: str, candidates: list):
        from triton.runtime.cache import get_cache_manager

        self.cache = get_cache_manager(digest)
        self.candidates = candidates

    def load(self):
        import json

        path = self.cache.get_file("tuning.json")
        if path is None:
            return None
        try:
            with open(path) as f:
                index = json.load(f)["choice"]
            return self.candidates[index] if 0 <= index < len(self.candidates) else None
        except (OSError, ValueError, KeyError, TypeError):  # unreadable: time again
            return None

    def store(self, choice, timings: dict) -> None:
        import json

        self.cache.put(json.dumps({
            "choice": self.candidates.index(choice),
            "candidates": [repr(c) for c in self.candidates],
            "ms": [timings.get(c) for c in self.candidates]}), "tuning.json", binary=False)


def _tuning_file(key, candidates, kernels, device) -> _TuningFile:
    import hashlib

    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime.cache import triton_key

    device = torch.device(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu = (props.name, props.multi_processor_count, _capability(device))
    else:
        gpu = (device.type,)
    sources = [getattr(k, "cache_key", None) or _source_digest(k) for k in kernels]
    # The device's index is not part of the choice: GPUs of one kind share it.
    plain_key = tuple(d.type if isinstance(d, torch.device) else d for d in key)
    parts = [triton_key(), repr(gpu), *sources,
             repr(sorted(get_cache_invalidating_env_vars().items())),
             repr((_device.SM_COUNT_OVERRIDE, _device.NO_TMA, _device.MAX_SHARED)), repr(plain_key),
             *(repr(c) for c in candidates)]
    return _TuningFile(hashlib.sha256("-".join(parts).encode()).hexdigest(), candidates)


def _source_digest(kernel) -> str:
    """A kernel without Triton's cache key (the interpreter's): its module's source."""
    import hashlib
    import inspect
    import sys

    fn = getattr(kernel, "fn", kernel)
    return hashlib.sha256(inspect.getsource(sys.modules[fn.__module__]).encode()).hexdigest()



