"""Input checks, shared by every family.

Every public kernel checks its inputs here and raises an error that names the problem, instead of
launching on something it cannot handle. (Allocation is `_buffers`, the device facts `_device`,
host tile arithmetic `_tiles`.)
"""
from __future__ import annotations

import math

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false

from ._device import interpreting

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The classes of a plain tensor, compared by identity on the host's hot paths (a plan cache's key,
# the launcher's arguments): anything else takes the checked, slower path.
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter


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
