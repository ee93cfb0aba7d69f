"""Input checks and output allocation shared by every kernel family.

Every public kernel checks its inputs here and raises an error that names the problem, instead of
launching on something it cannot handle. Outputs are allocated through `empty`, which fills them
with NaN while `poisoned_outputs()` is active, so a test (or the sweep's correctness check) sees any
element a kernel forgot to write.
"""
from __future__ import annotations

import contextlib
import functools
import math

import torch
import triton
import triton.language as tl

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

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


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1 at import)."""
    from triton import knobs

    return bool(knobs.runtime.interpret)


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
    if t.device.type == "cpu" and not interpreting():
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
    if x.numel() == 0:
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


__all__ = [
    "FLOAT_DTYPES",
    "INTERPRETER_SM_COUNT",
    "as_rows",
    "cdiv",
    "check_contiguous",
    "check_pow2",
    "check_same",
    "check_tensor",
    "check_warps",
    "default_warps",
    "dot",
    "empty",
    "interpreting",
    "is_fake",
    "next_pow2",
    "poisoned_outputs",
    "sm_count_of",
    "triton",
    "upcast_bf16",
]
