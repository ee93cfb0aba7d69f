"""LayerNorm over the last dim: `(x - mean) / sqrt(var + eps) * weight + bias`, per row.

The input is viewed as rows (all leading dims flattened); statistics and arithmetic run in float32
and every output is rounded once to its dtype. weight and bias are optional (None: no scale, no
shift). var is the biased variance (divided by N), as in torch.

This module holds the reference, the unfused baseline, the checks and the public, differentiable
functions; the fused kernels and their plans are in `forward` (one kernel: x read once,
y written once) and `backward` (one kernel for dx and partial dweight/dbias, one to sum
the partials).

Unfused (forward only: five kernels, the steps one would write without fusion) every step
round-trips through memory: mean (x read), variance (x read again), normalise (x read, xhat
written), scale (xhat read, written), shift (read, written).
"""
from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..._buffers import empty, empty_like
from ..._checks import (FLOAT_DTYPES, as_rows, check_contiguous, check_pow2, check_same,
                        check_tensor, check_warps, is_fake)
from ..._device import interpreting
from ..._tiles import cdiv, unfused_tile
from ..._plans import cached, layout_key, plan_cache
from ..._launch import launch
from .backward import BWD_MAX_ONE_TILE, bwd_groups
from .forward import MAX_ONE_TILE, TUNE_FROM_BYTES, fwd_launch, run_forward, tuned_launch
from ..._autograd import FLOAT32, _empty_like_rows, declare
from . import backward as _bwd


def reference(x: torch.Tensor, weight, bias, eps: float = 1e-5) -> torch.Tensor:
    """The semantics, in PyTorch eager."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


# ------------------------------------------------------------------------------------------------
# The unfused baseline (forward only): five kernels, each step stored. Per-row statistics are
# float32; the per-element intermediates are in x's dtype, as separate eager ops would keep them.


@triton.jit
def _row_mean_kernel(x_ptr, mean_ptr, n_cols, x_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        acc += tl.load(x_ptr + row * x_row_stride + offs, mask=offs < n_cols,
                       other=0.0).to(tl.float32)
    tl.store(mean_ptr + row, tl.sum(acc, axis=0) / n_cols)


@triton.jit
def _row_var_kernel(x_ptr, mean_ptr, var_ptr, n_cols, x_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mean = tl.load(mean_ptr + row)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        mask = offs < n_cols
        x = tl.load(x_ptr + row * x_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
        d = tl.where(mask, x - mean, 0.0)
        acc += d * d
    tl.store(var_ptr + row, tl.sum(acc, axis=0) / n_cols)


@triton.jit
def _normalise_kernel(x_ptr, mean_ptr, var_ptr, out_ptr, n_cols, x_row_stride, eps,
                      BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * x_row_stride + offs, mask=mask).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.load(var_ptr + row) + eps)
    xhat = (x - tl.load(mean_ptr + row)) * rstd
    tl.store(out_ptr + row * n_cols + offs, xhat.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _column_op_kernel(t_ptr, p_ptr, out_ptr, n, n_cols, SCALE: tl.constexpr,
                      BLOCK: tl.constexpr):
    """One elementwise step with a per-column vector p: t * p (SCALE, the weight) or t + p (the
    bias). Two separate launches, as two separate eager ops would be."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    t = tl.load(t_ptr + offs, mask=mask).to(tl.float32)
    p = tl.load(p_ptr + offs % n_cols, mask=mask).to(tl.float32)
    out = t * p if SCALE else t + p
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------------------------------
# Host side.


def _plainly_valid(x, weight, bias) -> bool:
    """The common case, checked cheaply (this runs on every call's host path): CUDA tensors of
    one float dtype and device (weight and bias in it or in float32), weight and bias contiguous
    (N,). Anything else goes through the full checks, which name the problem."""
    if not (isinstance(x, torch.Tensor) and x.is_cuda and x.dtype in FLOAT_DTYPES and x.dim()):
        return False
    for p in (weight, bias):
        if p is not None and not (isinstance(p, torch.Tensor)
                                  and (p.dtype == x.dtype or p.dtype == torch.float32)
                                  and p.dim() == 1 and p.shape[0] == x.shape[-1]
                                  and p.is_contiguous() and p.device == x.device):
            return False
    return True


def _check_inputs(x, weight, bias, eps):
    plain = _plainly_valid(x, weight, bias)
    rows, n_rows, n_cols = as_rows("x", x, checked=plain)
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None or plain:
            continue
        check_tensor(name, p, ndim=1)
        check_same([("x", x), (name, p)], dtype=False)
        if p.dtype not in (x.dtype, torch.float32):
            raise TypeError(f"{name} has dtype {str(p.dtype)[6:]} but x has {str(x.dtype)[6:]}; "
                            f"{name} must be of x's dtype or float32 (nothing is cast silently)")
        if p.shape[0] != n_cols:
            raise ValueError(f"{name} must have shape ({n_cols},) to match x's last dim, got "
                             f"{tuple(p.shape)}")
        check_contiguous(name, p)
    _check_eps(eps)
    return rows, n_rows, n_cols


def _check_eps(eps) -> None:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")


def _check_options(block, num_warps, groups=None) -> None:
    if block is not None:
        check_pow2("block", block)
    if num_warps is not None:
        check_warps(num_warps)
    if groups is not None and (isinstance(groups, bool) or not isinstance(groups, int)
                               or groups < 1):
        raise ValueError(f"groups must be a positive int, got {groups}")


def _forward_plan(x, weight, bias, eps, block, num_warps, groups):
    """Every check, then (n_rows, n_cols, x's row stride, FwdLaunch), or None for an empty x."""
    rows, n_rows, n_cols = _check_inputs(x, weight, bias, eps)
    _check_options(block, num_warps, groups)
    if rows is None:
        return None
    # A contiguous x's rows are n_cols apart (whatever the strides of its size-1 dims); y is
    # contiguous.
    x_row_stride = n_cols if x.is_contiguous() else rows.stride(0)
    how = fwd_launch(x.dtype, x.device, n_rows, n_cols, x_row_stride, n_cols,
                     weight is not None, bias is not None, block, num_warps)
    # The default plan is tuned on the GPU it runs on (not while a CUDA graph is captured, nor
    # for tracing's fake tensors, nor below TUNE_FROM_BYTES, where a launch's host time is
    # longer than the kernel: they take fwd_plan's first guess).
    if (block is None and num_warps is None and x.is_cuda and not interpreting()
            and n_rows * n_cols * x.element_size() >= TUNE_FROM_BYTES
            and not is_fake(x) and not torch.cuda.is_current_stream_capturing()):
        how = tuned_launch(x, n_rows, n_cols, x_row_stride, weight, bias, how)
    return n_rows, n_cols, x_row_stride, how


_PLANS = plan_cache()


def _fused_forward(x, weight, bias, eps, block, num_warps, groups, stats=True):
    """(y, per-row float32 mean and rstd) after checking every input and option; the checks and
    the plan are remembered per layout of x, weight, bias (eps is a value: checked every call).
    stats=False (no backward follows): (y, None), the statistics neither stored nor allocated."""
    fwd = cached(_PLANS, layout_key((x, weight, bias), (block, num_warps, groups)), _forward_plan,
                 x, weight, bias, eps, block, num_warps, groups)
    if eps.__class__ is not float or not eps >= 0.0:
        _check_eps(eps)
    y = empty_like(x)
    if fwd is None:
        # One (mean, rstd) column per row, as the op's fake implementation says: rows of zero
        # length (x of shape (3, 0)) are rows too. Never read (the backward has nothing to do);
        # zeros, not empty, so that two calls return the same (opcheck compares them).
        n_rows = math.prod(x.shape[:-1])
        return y, torch.zeros((2, n_rows), dtype=torch.float32, device=x.device) if stats else None
    n_rows, n_cols, x_row_stride, how = fwd
    # x and y are passed as they are: the kernels see their rows through the row strides.
    return y, run_forward(x, y, n_rows, n_cols, x_row_stride, n_cols, weight, bias, eps, how,
                          stats)


def triton_fused(x: torch.Tensor, weight=None, bias=None, eps: float = 1e-5, *, block=None,
                 num_warps=None, groups=None) -> torch.Tensor:
    """Fused LayerNorm, differentiable: one forward kernel; backward one kernel for dx and the
    partial dweight/dbias, one more for their sum over groups.

    block: the tile; a block >= the row length keeps the row in registers (the default up to
    MAX_ONE_TILE forward, BWD_MAX_ONE_TILE backward), a smaller one loops. num_warps: of the
    forward and backward's first kernel. groups: programs of the backward (default `bwd_groups`;
    at most one per row)."""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in (x, weight, bias)):
        return _LAYER_NORM.function.apply(x, weight, bias, eps, block, num_warps, groups)
    # Nothing to differentiate: skip the autograd.Function's bookkeeping (host time) and the
    # statistics.
    return _fused_forward(x, weight, bias, eps, block, num_warps, groups, stats=False)[0]


def triton_unfused(x: torch.Tensor, weight=None, bias=None, eps: float = 1e-5, *, block=None,
                   num_warps=None) -> torch.Tensor:
    """Forward only (no autograd): five Triton kernels, mean -> variance -> normalise -> scale
    -> shift, each result stored and read back by the next (scale/shift skipped for None)."""
    rows, n_rows, n_cols = _check_inputs(x, weight, bias, eps)
    _check_options(block, num_warps)
    block, num_warps = unfused_tile(n_cols, block, num_warps)
    if rows is None:
        return empty(x.shape, x.dtype, x.device)
    mean = empty((n_rows,), torch.float32, x.device)
    var = empty((n_rows,), torch.float32, x.device)
    launch(_row_mean_kernel, (n_rows,), rows, mean, n_cols, rows.stride(0), BLOCK=block,
           num_warps=num_warps)
    launch(_row_var_kernel, (n_rows,), rows, mean, var, n_cols, rows.stride(0), BLOCK=block,
           num_warps=num_warps)
    t = empty(x.shape, x.dtype, x.device)
    launch(_normalise_kernel, (n_rows, cdiv(n_cols, block)), rows, mean, var, t, n_cols,
           rows.stride(0), float(eps), BLOCK=block, num_warps=num_warps)
    n = x.numel()
    for scale, p in ((True, weight), (False, bias)):
        if p is not None:
            out = empty(x.shape, x.dtype, x.device)
            launch(_column_op_kernel, (cdiv(n, block),), t, p, out, n, n_cols, SCALE=scale,
                   BLOCK=block, num_warps=num_warps)
            t = out
    return t


# The plans' limits and the backward's group count, for the tests, the sweep and the traffic model.
__all__ = ["BWD_MAX_ONE_TILE", "MAX_ONE_TILE", "bwd_groups", "reference",
           "triton_fused", "triton_unfused"]


# ------------------------------------------------------------------------------------------------
# LayerNorm; fused forward and backward


def _forward(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
             eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _fused_forward(x, weight, bias, eps, None, None, None)


def _fake(x, weight, bias, eps):
    _, n_rows, _ = _check_inputs(x, weight, bias, eps)
    return _empty_like_rows(x), x.new_empty((2, n_rows), dtype=torch.float32)


def _backward_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                 bias: torch.Tensor | None, stats: torch.Tensor, need_dw: bool, need_db: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """bias is passed for its dtype only (dbias is returned in it)."""
    dx, dw, db = _bwd.backward(dy, x, weight, stats, need_dw, need_db, None, None, None,
                               None if bias is None else bias.dtype)
    # A custom op's outputs cannot be None (nor alias each other): an empty tensor of its own
    # stands for "not needed".
    return (dx, x.new_empty((0,)) if dw is None else dw, x.new_empty((0,)) if db is None else db)


def _backward_fake(dy, x, weight, bias, stats, need_dw, need_db):
    n = x.shape[-1]
    dw = x.new_empty((n,), dtype=weight.dtype) if need_dw else x.new_empty((0,))
    db = x.new_empty((n,), dtype=bias.dtype) if need_db else x.new_empty((0,))
    return _empty_like_rows(x), dw, db


def _eager_backward(dy, x, weight, bias, stats, need_dw, need_db, block=None, num_warps=None,
                    groups=None):
    """The Function's, without a graph: its options, and dweight and dbias in one allocation."""
    return _bwd.backward(dy, x, weight, stats, need_dw, need_db, block, num_warps, groups,
                         None if bias is None else bias.dtype, shared_dwdb=True)


def _setup(ctx, inputs, output):
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight, bias, output[1])


def _backward(ctx, bwd, dy, *_):
    x, weight, bias, stats = ctx.saved_tensors
    need_dw = weight is not None and ctx.needs_input_grad[1]
    need_db = bias is not None and ctx.needs_input_grad[2]
    dx, dw, db = bwd(dy.contiguous(), x, weight, bias, stats, need_dw, need_db)
    return dx, dw if need_dw else None, db if need_db else None, None


def _forward_only(x, weight, bias, eps):
    """The direct path: nothing to differentiate, no statistics stored."""
    return _fused_forward(x, weight, bias, eps, None, None, None, stats=False)[0]


def _prepare(x, weight, bias, eps):
    # float() would take True, "1e-5" or a tensor: refuse them as the direct path does (this path
    # also takes nn.Parameter weights); a float's value is checked by the op.
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        _check_eps(eps)
    return x, weight, bias, float(eps)


_LAYER_NORM = declare(
    "layer_norm", _forward, _fake, setup=_setup, backward=_backward, backward_op=_backward_op,
    backward_fake=_backward_fake, eager_backward=_eager_backward, direct=_forward_only,
    prepare=_prepare, function=True, forward_with_options=_fused_forward,
    # CUDA's autocast runs layer_norm in float32; CPU's leaves the dtypes as they are.
    autocast={"cuda": FLOAT32, "cpu": None})


def layer_norm(x: torch.Tensor, weight=None, bias=None, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dim of x in fused Triton kernels; differentiable (fused backward;
    no second derivative).

    x: float32, float16 or bfloat16, at least 1-D, on CUDA (or on the CPU under TRITON_INTERPRET=1),
    last dim contiguous. weight, bias: None or contiguous (N,) tensors on x's device, N =
    x.shape[-1], of x's dtype or float32 (as F.layer_norm takes them in mixed precision).
    Statistics and math in float32; output and dx in x's dtype, dweight and dbias in theirs."""
    return _LAYER_NORM(x, weight, bias, eps)
