"""softmax(x, dim): the public function (any dim; the registered custom op and the kernels
work over the last dim, with a fused backward),
and the family's implementations side by side: `forward` (reference, triton_unfused,
triton_fused and the plan that picks the path: one pass, online, split or co-operative rows) and
`backward` (the same for dx = y * (dy - sum(y * dy)))."""
from __future__ import annotations

import operator

import torch

from ..._autograd import FLOAT32, _empty_like_rows, declare
from ..._checks import as_rows
from . import backward as _smb
from . import forward as _sm
from .forward import plan, reference, triton_fused, triton_unfused

__all__ = ["plan", "reference", "softmax", "triton_fused", "triton_unfused"]


# ------------------------------------------------------------------------------------------------
# softmax over the last dim; fused backward


def _forward(x: torch.Tensor) -> torch.Tensor:
    return _sm.triton_fused(x)


def _fake(x):
    as_rows("x", x)
    return _empty_like_rows(x)


def _backward_impl(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    return _smb.softmax_backward(y, dy)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _backward(ctx, bwd, dy):
    (y,) = ctx.saved_tensors
    return bwd(y, dy.contiguous())


# The Function's backward without a graph: its own y skips softmax_backward's checks.
_SOFTMAX = declare("softmax", _forward, _fake, setup=_setup, backward=_backward,
                   backward_op=_backward_impl, backward_fake=lambda y, dy: _empty_like_rows(y),
                   eager_backward=_smb.own_output_backward,
                   direct=_sm.triton_fused, function=True,
                   # CUDA's autocast runs softmax in float32; CPU's leaves it in x's dtype.
                   autocast={"cuda": FLOAT32, "cpu": None})


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax over dimension `dim` of x (as `torch.softmax(x, dim)`) in fused Triton kernels (see
    `forward.plan` for which); differentiable (one fused backward kernel).

    x: float32, float16 or bfloat16, at least 1-D, on CUDA (or on the CPU under TRITON_INTERPRET=1),
    any strides. Any row length. Math in float32, output in x's dtype and shape. The kernels read
    rows whose elements are adjacent: over another dim, or where the rows cannot be viewed in
    place (a non-contiguous last dim, leading dims that do not merge), x is first copied into
    that layout (one more read and write of x, as a transpose costs)."""
    if dim.__class__ is not int:
        dim = operator.index(dim)  # an integer (numpy's, a SymInt) or TypeError, as torch
    if dim != -1 and isinstance(x, torch.Tensor) and x.ndim:
        if not -x.ndim <= dim < x.ndim:
            raise ValueError(f"dim must be an int in [{-x.ndim}, {x.ndim}), got {dim!r}")
        if dim % x.ndim != x.ndim - 1:
            return softmax(x.movedim(dim, -1), -1).movedim(-1, dim)
    if isinstance(x, torch.Tensor) and not x.is_contiguous() and not _rows_in_place(x):
        x = x.contiguous()
    return _SOFTMAX(x)


def _rows_in_place(x: torch.Tensor) -> bool:
    """Whether x's rows (its last dim) can be viewed as a (rows, cols) matrix without a copy."""
    if x.ndim == 0 or x.shape[-1] > 1 and x.stride(-1) != 1:
        return x.ndim == 0  # a 0-d x: refused by the kernel's checks, as it is
    try:
        x.view(-1, x.shape[-1])
    except RuntimeError:
        return False
    return True
