"""softmax(x, dim): the public function (any dim; the registered custom op and the kernels
work over the last dim, with a fused backward),
and the family's implementations side by side: `forward` (reference, triton_unfused,
triton_fused and the plan that picks the path: one pass, online, split or co-operative rows) and
`backward` (the same for dx = y * (dy - sum(y * dy)))."""
from __future__ import annotations

import operator

import torch

from ..._autograd import _PLAIN, NS, _direct, _empty_like_rows, _no_double_backward
from ..._checks import as_rows
from . import backward as _smb
from . import forward as _sm
from .forward import plan, reference, triton_fused, triton_unfused

__all__ = ["plan", "reference", "softmax", "triton_fused", "triton_unfused"]


# ------------------------------------------------------------------------------------------------
# softmax over the last dim; fused backward


@torch.library.custom_op(f"{NS}::softmax", mutates_args=())
def _softmax_op(x: torch.Tensor) -> torch.Tensor:
    return _sm.triton_fused(x)


@_softmax_op.register_fake
def _(x):
    as_rows("x", x)
    return _empty_like_rows(x)


@torch.library.custom_op(f"{NS}::softmax_backward", mutates_args=())
def _softmax_backward_op(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    return _smb.softmax_backward(y, dy)


@_softmax_backward_op.register_fake
def _(y, dy):
    return _empty_like_rows(y)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _softmax_backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return _softmax_backward_op(y, dy.contiguous())


_softmax_op.register_autograd(_softmax_backward, setup_context=_softmax_setup)
_softmax_backward_op.register_autograd(_no_double_backward("softmax's backward"))


class _Softmax(torch.autograd.Function):
    """Eager autograd without the dispatcher: the same kernels as the registered op, at less host
    cost a call (the custom op's autograd goes through the dispatcher twice a direction)."""

    @staticmethod
    def forward(ctx, x):
        y = _sm.triton_fused(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        if torch.is_grad_enabled():
            # create_graph=True: the registered backward op keeps dx connected to its inputs, so
            # a second derivative through it raises instead of being silently missing.
            return _softmax_backward_op(y, dy.contiguous())
        return _smb.own_output_backward(y, dy.contiguous())


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
    if _direct(x):
        return _sm.triton_fused(x)
    if not torch.compiler.is_compiling() and type(x) in _PLAIN:
        return _Softmax.apply(x)
    return _softmax_op(x)


def _rows_in_place(x: torch.Tensor) -> bool:
    """Whether x's rows (its last dim) can be viewed as a (rows, cols) matrix without a copy."""
    if x.ndim == 0 or x.shape[-1] > 1 and x.stride(-1) != 1:
        return x.ndim == 0  # a 0-d x: refused by the kernel's checks, as it is
    try:
        x.view(-1, x.shape[-1])
    except RuntimeError:
        return False
    return True
