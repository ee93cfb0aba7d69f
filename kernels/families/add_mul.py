"""Add-multiply, `(x + y) * z`: the simplest fusion.

Unfused, the sum `x + y` makes a round trip through device memory between two kernels; fused, it
stays in registers. With z a full tensor that is 6N element moves against 4N; with z a scalar,
5N against 3N (see analysis/model/traffic.py).

z is a tensor broadcastable to x, or a Python number. A one-element z is loaded once per program;
a z whose shape is a suffix of x's (e.g. a (H,) z for a (N, H) x) is read with a modulo index;
any other broadcast is materialised with `expand().contiguous()` first (one extra pass, rare).
"""
from __future__ import annotations

import functools
import math
import numbers

import torch
from torch._prims_common import is_contiguous_or_false
from torch.fx.experimental.symbolic_shapes import guard_or_false
import triton
import triton.language as tl

from .._buffers import empty_like
from .._checks import check_contiguous, check_pow2, check_same, check_tensor, check_warps
from .._tiles import cdiv, default_warps
from .._plans import cached, layout_key, plan_cache
from .._launch import launch
from .._autograd import PROMOTE, _empty_like_rows, declare

DEFAULT_BLOCK = 2048

# How the kernels read z.
Z_FULL, Z_ONE, Z_PERIODIC, Z_SCALAR = 0, 1, 2, 3


def reference(x: torch.Tensor, y: torch.Tensor, z) -> torch.Tensor:
    """The semantics, in PyTorch eager (two kernels: an add, then a multiply)."""
    return (x + y) * z


@triton.jit
def _load_z(z_ptr, z_scalar, offs, mask, z_period, Z_MODE: tl.constexpr):
    if Z_MODE == 0:
        z = tl.load(z_ptr + offs, mask=mask).to(tl.float32)
    elif Z_MODE == 1:
        z = tl.load(z_ptr).to(tl.float32)
    elif Z_MODE == 2:
        z = tl.load(z_ptr + offs % z_period, mask=mask).to(tl.float32)
    else:
        z = z_scalar
    return z


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (x + y).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _mul_kernel(t_ptr, z_ptr, z_scalar, out_ptr, n, z_period, Z_MODE: tl.constexpr,
                BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    t = tl.load(t_ptr + offs, mask=mask).to(tl.float32)
    z = _load_z(z_ptr, z_scalar, offs, mask, z_period, Z_MODE)
    tl.store(out_ptr + offs, (t * z).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _add_mul_kernel(x_ptr, y_ptr, z_ptr, z_scalar, out_ptr, n, z_period, Z_MODE: tl.constexpr,
                    BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    z = _load_z(z_ptr, z_scalar, offs, mask, z_period, Z_MODE)
    # One rounding to the output dtype, at the store.
    tl.store(out_ptr + offs, ((x + y) * z).to(out_ptr.dtype.element_ty), mask=mask)


@functools.lru_cache(maxsize=1024)
def _z_layout(z_shape, z_contiguous, x_shape):
    """(mode, period, expand first) for a z tensor of this shape against x's; cached, as the
    broadcast check costs more host time than a small kernel's launch."""
    try:
        broadcast = torch.broadcast_shapes(z_shape, x_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != x_shape:
        raise ValueError(f"z of shape {z_shape} does not broadcast to x's {x_shape}")
    n = math.prod(z_shape)
    # guard_or_false: plain ints compare as ever; under torch.compile a data-dependent size
    # (rows selected by a mask) cannot be guarded on, and each choice taken for "not equal" is
    # still right (a full z read with period n, or an expanded copy).
    if guard_or_false(n == 1):
        return Z_ONE, 1, False
    suffix = list(z_shape)
    while suffix and guard_or_false(suffix[0] == 1):
        suffix.pop(0)
    if z_contiguous and tuple(suffix) == x_shape[len(x_shape) - len(suffix):]:
        return (Z_FULL if guard_or_false(n == math.prod(x_shape)) else Z_PERIODIC), n, False
    return Z_FULL, math.prod(x_shape), True


def _check_layout(x, y, z):
    """Validate; return (z mode, z period, expand z first)."""
    check_tensor("x", x)
    check_tensor("y", y)
    check_same([("x", x), ("y", y)])
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    check_contiguous("x", x)
    check_contiguous("y", y)
    if isinstance(z, torch.Tensor):
        check_tensor("z", z)
        check_same([("x", x), ("z", z)])
        # A z read as not contiguous is expanded into a contiguous copy first: right whatever
        # its layout, so under torch.compile a contiguity that hangs on a data-dependent size
        # (z[m][:, :1]) is taken as False instead of guarded on (which raises).
        contiguous = z.is_contiguous() if z.__class__ is torch.Tensor else is_contiguous_or_false(z)
        key = (tuple(z.shape), contiguous, tuple(x.shape))
        try:
            return _z_layout(*key)
        except TypeError:  # symbolic sizes (tracing with dynamic shapes) do not hash
            return _z_layout.__wrapped__(*key)
    if isinstance(z, bool) or not isinstance(z, numbers.Real):
        raise TypeError(f"z must be a tensor or a real Python number, got {type(z).__name__}")
    return Z_SCALAR, 1, False


def _z_args(x, z, mode, expand):
    """(z tensor, z scalar) for the kernels."""
    if mode == Z_SCALAR:
        return x, float(z)  # x stands in for the unused z pointer
    return (z.expand(x.shape).contiguous() if expand else z), 0.0


def _check_inputs(x, y, z):
    """Validate, and return (z_tensor, z_scalar, z_period, z_mode)."""
    mode, period, expand = _check_layout(x, y, z)
    return (*_z_args(x, z, mode, expand), period, mode)


def _launch_args(x, block, num_warps):
    block = check_pow2("block", DEFAULT_BLOCK if block is None else block)
    num_warps = default_warps(block) if num_warps is None else check_warps(num_warps)
    return block, num_warps, (cdiv(x.numel(), block),)


def _plan(x, y, z, block, num_warps):
    """The checks, then (z mode, z period, expand z, block, num_warps, grid)."""
    return (*_check_layout(x, y, z), *_launch_args(x, block, num_warps))


_PLANS = plan_cache()


def _prepare(x, y, z, block, num_warps):
    """(z tensor, z scalar, z period, z mode, block, num_warps, grid) of a launch; the checks and
    the plan remembered per layout of x, y, z (a number z: per type; its value is read every
    call)."""
    if isinstance(z, torch.Tensor):
        key = layout_key((x, y, z), (block, num_warps))
    else:
        key = layout_key((x, y), (block, num_warps))
        key = None if key is None else (key, z.__class__)
    mode, period, expand, block, num_warps, grid = cached(_PLANS, key, _plan, x, y, z, block,
                                                          num_warps)
    return (*_z_args(x, z, mode, expand), period, mode, block, num_warps, grid)


def triton_unfused(x, y, z, *, block=None, num_warps=None) -> torch.Tensor:
    """Two Triton kernels: t = x + y (stored), then out = t * z."""
    z_t, z_s, period, mode, block, num_warps, grid = _prepare(x, y, z, block, num_warps)
    t = empty_like(x)
    out = empty_like(x)
    n = x.numel()
    if n:
        launch(_add_kernel, grid, x, y, t, n, BLOCK=block, num_warps=num_warps)
        launch(_mul_kernel, grid, t, z_t, z_s, out, n, period, Z_MODE=mode, BLOCK=block,
               num_warps=num_warps)
    return out


def triton_fused(x, y, z, *, block=None, num_warps=None) -> torch.Tensor:
    """One Triton kernel: out = (x + y) * z, the sum kept in registers, math in float32."""
    z_t, z_s, period, mode, block, num_warps, grid = _prepare(x, y, z, block, num_warps)
    out = empty_like(x)
    n = x.numel()
    if n:
        launch(_add_mul_kernel, grid, x, y, z_t, z_s, out, n, period, Z_MODE=mode, BLOCK=block,
               num_warps=num_warps)
    return out


# ------------------------------------------------------------------------------------------------
# add_mul: (x + y) * z


def _forward(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return triton_fused(x, y, z)


def _forward_scalar(x: torch.Tensor, y: torch.Tensor, z: float) -> torch.Tensor:
    return triton_fused(x, y, z)


def _fake(x, y, z):
    _check_inputs(x, y, z)
    return _empty_like_rows(x)


def _add_mul_setup(ctx, inputs, output):
    x, y, z = inputs
    if isinstance(z, torch.Tensor):
        ctx.save_for_backward(x, y, z)
    else:
        ctx.save_for_backward(x, y)
    ctx.z = None if isinstance(z, torch.Tensor) else z


def _add_mul_backward(ctx, dout):
    """d/dx = d/dy = dout * z; d/dz = dout * (x + y), summed over z's broadcast dims."""
    if ctx.z is not None:
        x, y = ctx.saved_tensors
        g = (dout.float() * ctx.z).to(x.dtype)
        return g, g, None
    x, y, z = ctx.saved_tensors
    g = (dout.float() * z.float()).to(x.dtype)
    dz = None
    if ctx.needs_input_grad[2]:
        full = dout.float() * (x.float() + y.float())
        lead = full.dim() - z.dim()
        # guard_or_false: a data-dependent size of z (rows selected by a mask, under
        # torch.compile) cannot be guarded on; it is taken as not broadcast, as PyTorch's own
        # broadcasting takes it.
        dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(z.shape)
                                          if guard_or_false(s == 1))
        dz = (full.sum(dims, keepdim=True) if dims else full).reshape(z.shape).to(z.dtype)
    return g, g, dz


def _prepare_scalar(x, y, z):
    if isinstance(z, bool) or not isinstance(z, (int, float)):
        _check_inputs(x, y, z)  # raises the direct path's error
    return x, y, float(z)


# Under autocast, as torch's elementwise ops: no cast; mixed floating dtypes promoted.
_ADD_MUL = declare("add_mul", _forward, _fake, setup=_add_mul_setup, backward=_add_mul_backward,
                   direct=triton_fused, autocast=PROMOTE)
_ADD_MUL_SCALAR = declare("add_mul_scalar", _forward_scalar, _fake, setup=_add_mul_setup,
                          backward=_add_mul_backward, direct=triton_fused,
                          prepare=_prepare_scalar, autocast=PROMOTE)


def add_mul(x: torch.Tensor, y: torch.Tensor, z) -> torch.Tensor:
    """`(x + y) * z` in one fused Triton kernel; differentiable.

    x, y: contiguous tensors of one shape and dtype (float32, float16 or bfloat16), on CUDA (or on
    the CPU under TRITON_INTERPRET=1). z: a tensor of the same dtype broadcastable to x, or a Python
    number. The sum and product are computed in float32 and rounded once to x's dtype.
    """
    return (_ADD_MUL if isinstance(z, torch.Tensor) else _ADD_MUL_SCALAR)(x, y, z)
