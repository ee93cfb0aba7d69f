"""Output and scratch allocation, shared by every family.

Outputs are allocated through `empty` (or `empty_like`), which fills them with NaN while
`poisoned_outputs()` is active, so a test (or the sweep's correctness check) sees any element a
kernel forgot to write; `scratch` keeps intermediate buffers across calls.
"""
from __future__ import annotations

import contextlib
import math

import torch

_poison = False


@contextlib.contextmanager
def poisoned_outputs(enabled: bool = True):
    """While active, every output tensor starts as NaN instead of uninitialised memory."""
    global _poison
    previous, _poison = _poison, enabled
    try:
        yield
    finally:
        _poison = previous


def empty(shape, dtype, device) -> torch.Tensor:
    out = torch.empty(shape, dtype=dtype, device=device)
    if _poison:
        out.fill_(math.nan)
    return out


# Scratch tensors kept across calls, per (device, stream, shape, dtype); a full table is emptied.
SCRATCH_MAX_ENTRIES = 64
_SCRATCH: dict = {}


def scratch(shape, dtype, device) -> tuple:
    """(t, t.unbind(0)): a tensor for intermediate results that one call writes and reads back
    on the current stream, with its first-dim views, both made once per device, stream, shape
    and dtype and reused by later calls: stream order makes the reuse safe (a later call's
    writes queue behind this call's reads), and it saves the host an allocation, which costs
    several times more on the autograd engine's worker thread than on the main one
    (docs/bench.md, "Host cost a call").
    Fresh while the stream is being captured into a CUDA graph (the graph keeps its own)."""
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            t = empty(shape, dtype, device)
            return t, t.unbind(0)
        index = device.index
        if index is None:  # torch.device("cuda"): the current device
            index = torch.cuda.current_device()
            device = torch.device("cuda", index)
        stream = torch._C._cuda_getCurrentRawStream(index)
    else:
        stream = 0
    key = (device, stream, shape, dtype)
    entry = _SCRATCH.get(key)
    if entry is None:
        if len(_SCRATCH) >= SCRATCH_MAX_ENTRIES:
            _SCRATCH.clear()
        t = torch.empty(shape, dtype=dtype, device=device)
        entry = _SCRATCH[key] = (t, t.unbind(0))
    if _poison:
        entry[0].fill_(math.nan)
    return entry


def empty_like(x: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor of x's shape, dtype and device, as `empty` makes it; costs the
    host about half of `empty(x.shape, x.dtype, x.device)` (no shape, dtype, device to parse)."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if _poison:
        out.fill_(math.nan)
    return out
