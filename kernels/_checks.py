"""Input checks, output allocation and the device facts the plans read, shared by every family.

Every public kernel checks its inputs here and raises an error that names the problem, instead of
launching on something it cannot handle. Outputs are allocated through `empty` (or `empty_like`),
which fills them with NaN while `poisoned_outputs()` is active, so a test (or the sweep's
correctness check) sees any element a kernel forgot to write.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false
import triton
import triton.language as tl
from triton import knobs

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter

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
    ~19 us on the autograd engine's worker thread against ~5 on the main one (docs/layernorm.md,
    "Per call: the host").
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


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return bool(knobs.runtime.interpret)


def cpu_tensors_run() -> bool:
    """Whether a kernel may take a CPU tensor: under the interpreter only. (The test suite makes it
    False in tests that do not take its `device` fixture, so that CPU tensors they build fail on
    the CPU as they would on a GPU.)"""
    return interpreting()


def check_tensor(name: str, t, *, dtypes=FLOAT_DTYPES, ndim=None, min_ndim=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; supported: {names}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dims, got shape {tuple(t.shape)}")
    if t.device.type == "cpu" and not cpu_tensors_run():
        raise ValueError(
            f"{name} is on the CPU: Triton kernels need a CUDA tensor, or TRITON_INTERPRET=1 set "
            "before triton is imported to run them through the interpreter"
        )
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} is on device {t.device}; only cuda (or cpu under the interpreter)")


def is_fake(t: torch.Tensor) -> bool:
    """A tensor without data (torch.compile's and opcheck's fake tensors): checks that read an
    address skip it."""
    from torch._subclasses.fake_tensor import is_fake as _is_fake

    return _is_fake(t)


def check_contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(
            f"{name} is not contiguous (strides {tuple(t.stride())}); call .contiguous() first"
        )


def check_same(names_tensors, *, dtype=True) -> None:
    """All tensors on one device and, unless dtype=False, of one dtype (no silent casts)."""
    (n0, t0), *rest = names_tensors
    for n, t in rest:
        if t.device != t0.device:
            raise ValueError(f"{n} is on {t.device} but {n0} is on {t0.device}")
        if dtype and t.dtype != t0.dtype:
            raise TypeError(
                f"{n} has dtype {str(t.dtype).replace('torch.', '')} but {n0} has "
                f"{str(t0.dtype).replace('torch.', '')}; cast explicitly, nothing is cast silently"
            )


def upcast_bf16(dtype: torch.dtype) -> bool:
    """Triton 3.6's interpreter multiplies bfloat16 tiles as their raw uint16 bits (numpy has no
    bfloat16), so under it bfloat16 dots take float32 operands; exact, as bf16 products fit fp32."""
    return dtype == torch.bfloat16 and interpreting()


@triton.jit
def dot(a, b, acc, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """tl.dot, with the interpreter's bfloat16 workaround (see upcast_bf16) compiled in or out."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=INPUT_PRECISION)


def as_rows(name: str, x, checked: bool = False) -> tuple[torch.Tensor | None, int, int]:
    """Check x (unless `checked`) and view it as (rows, cols) without a copy; None for the view
    when x is empty.

    Rows may be strided (e.g. a slice x[:, :k]) as long as the last dim is contiguous and the
    leading dims merge into one row stride."""
    if not checked:
        check_tensor(name, x, min_ndim=1)
    n_cols = x.shape[-1]
    n_rows = math.prod(x.shape[:-1])
    empty = x.numel() == 0
    if empty.__class__ is not bool:
        # Symbolic sizes (a fake implementation under torch.compile): a data-dependent row count
        # (x[mask], nonzero) cannot be guarded on; take it as non-empty, as the view below and
        # the fake's output are right either way.
        empty = guard_or_false(empty)
    if empty:
        return None, n_rows, n_cols
    if n_cols > 1 and x.stride(-1) != 1:
        raise ValueError(f"{name}'s last dim is not contiguous (strides {tuple(x.stride())}); "
                         "call .contiguous() first")
    try:
        rows = x.view(n_rows, n_cols)
    except RuntimeError:
        raise ValueError(f"{name} of shape {tuple(x.shape)} and strides {tuple(x.stride())} cannot "
                         "be viewed as rows without a copy; call .contiguous() first") from None
    return rows, n_rows, n_cols


def cdiv(a: int, b: int) -> int:
    """Ceiling division on the host (triton.cdiv is a constexpr function: microseconds a call)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), on the host (see cdiv)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


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


def check_pow2(name: str, value, lo: int = 16, why: str = "") -> int:
    """A block size (or group size) given by the caller: a power of two >= lo."""
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= {lo}{why}, got {value!r}")
    return value


def check_warps(num_warps) -> int:
    if (not isinstance(num_warps, int) or isinstance(num_warps, bool) or not 1 <= num_warps <= 32
            or num_warps & (num_warps - 1)):
        raise ValueError(f"num_warps must be a power of two from 1 to 32, got {num_warps!r}")
    return num_warps


def default_warps(block: int) -> int:
    """One warp per 256 elements of a 1-D block, between 1 and 16."""
    return max(1, min(16, block // 256))


# The unfused baselines' tile: one row's worth up to this, then loops over tiles of this width.
UNFUSED_BLOCK = 4096


def unfused_tile(n_cols: int, block=None, num_warps=None) -> tuple[int, int]:
    """(block, num_warps) of an unfused baseline's kernels: the row rounded up to a power of two
    (at most UNFUSED_BLOCK) unless given, warps from the block unless given; both checked."""
    block = min(UNFUSED_BLOCK, max(16, next_pow2(n_cols))) if block is None else block
    check_pow2("block", block)
    num_warps = default_warps(block) if num_warps is None else num_warps
    check_warps(num_warps)
    return block, num_warps



