"""Softmax then matmul, `softmax(x, -1) @ v`, for x (batch, d1, d2) and v (batch, d2, d3).

Unfused, the (batch, d1, d2) probability matrix makes a round trip through device memory: the
softmax kernel writes it, the matmul kernel reads it back. Fused, each program keeps a block of
rows' probabilities in registers only: it walks d2 in chunks with the online-softmax recurrence
(running max m, running sum l, and an output accumulator rescaled by exp(m_old - m_new) whenever
the max grows, as in FlashAttention) and divides by l once at the end.

Any d1, d2, d3 (masking, never refusing non-multiples), any strides, float32/float16/bfloat16.
float32 matmuls run with `input_precision="ieee"` by default, like PyTorch's default; pass "tf32"
for the tensor-core path. Half-precision probabilities are rounded to the input dtype before the
product with v (as FlashAttention does) and accumulated in float32.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .._buffers import empty
from .._checks import check_pow2, check_same, check_tensor
from .._device import has_tma
from .._tiles import cdiv, next_pow2
from .._plans import cached, layout_key, plan_cache, plan_strides
from .._launch import descriptor, launch
from .._dot import dot as _dot
from .._dot import upcast_bf16 as _upcast_bf16
from .._bmm import DOT_MIN, _bmm
from .._stored_softmax import softmax_rows
from .._autograd import LOWER, declare

PRECISIONS = ("ieee", "tf32")


def reference(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The semantics, in PyTorch eager: the softmax matrix is materialised."""
    return F.softmax(x, dim=-1) @ v


def softmax_mult(x: torch.Tensor, V: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The seed's PyTorch reference, kept under its own name."""
    return F.softmax(x, dim) @ V


# ------------------------------------------------------------------------------------ fused


@triton.jit
def _softmax_matmul_kernel(x_ptr, v_ptr, out_ptr, x_desc, v_desc, d1, d2, d3,
                           sx_b, sx_1, sx_2, sv_b, sv_2, sv_3, so_b, so_1, so_3,
                           BLOCK_1: tl.constexpr, BLOCK_2: tl.constexpr, BLOCK_3: tl.constexpr,
                           INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr):
    """TMA: x and v tiles come through 3-D host descriptors (x_desc, v_desc; elements past a
    batch's d1, d2 or d3 read as zeros), else through pointers with masks."""
    pid_1 = tl.program_id(0)
    pid_3 = tl.program_id(1)
    b32 = tl.program_id(2)
    b = b32.to(tl.int64)
    # int64 row/column offsets: a (d1, d2) slice can exceed 2**31 elements.
    rows = (pid_1 * BLOCK_1 + tl.arange(0, BLOCK_1)).to(tl.int64)
    cols3 = (pid_3 * BLOCK_3 + tl.arange(0, BLOCK_3)).to(tl.int64)
    offs_2 = tl.arange(0, BLOCK_2).to(tl.int64)
    row_ok = rows < d1
    col3_ok = cols3 < d3
    x_rows = x_ptr + b * sx_b + rows[:, None] * sx_1
    v_cols = v_ptr + b * sv_b + cols3[None, :] * sv_3

    m = tl.full([BLOCK_1], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_1], tl.float32)
    acc = tl.zeros([BLOCK_1, BLOCK_3], tl.float32)
    for start in tl.range(0, d2, BLOCK_2):
        ks = start + offs_2
        k_ok = ks < d2
        # Masked scores are -inf, so they add exp(-inf) = 0 to the sum and nothing to acc.
        if TMA:
            s = x_desc.load([b32, pid_1 * BLOCK_1, start]).reshape(BLOCK_1, BLOCK_2)
            s = tl.where(k_ok[None, :], s.to(tl.float32), float("-inf"))
            vt = v_desc.load([b32, start, pid_3 * BLOCK_3]).reshape(BLOCK_2, BLOCK_3)
        else:
            s = tl.load(x_rows + ks[None, :] * sx_2, mask=row_ok[:, None] & k_ok[None, :],
                        other=float("-inf")).to(tl.float32)
            vt = tl.load(v_cols + ks[:, None] * sv_2, mask=k_ok[:, None] & col3_ok[None, :],
                         other=0.0)
        m_new = tl.maximum(m, tl.max(s, 1))
        # Rows past d1 are all -inf: subtract 0 there instead of -inf (which would give NaN).
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_sub)
        p = tl.exp(s - m_sub[:, None])
        l = l * alpha + tl.sum(p, 1)
        # p in v's dtype: fp16/bf16 runs on tensor cores, fp32 keeps full precision (or tf32).
        acc = _dot(p.to(vt.dtype), vt, acc * alpha[:, None], INPUT_PRECISION, UPCAST)
        m = m_new
    # Rows past d1 have l = 0; dividing them by 1 keeps 0/0 warnings out of the interpreter.
    out = acc / tl.where(row_ok, l, 1.0)[:, None]
    tl.store(out_ptr + b * so_b + rows[:, None] * so_1 + cols3[None, :] * so_3,
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col3_ok[None, :])


# ------------------------------------------------------------------------------- public API


def _check_inputs(x, v, input_precision):
    """Validate; return the dot precision to compile with."""
    check_tensor("x", x, ndim=3)
    check_tensor("v", v, ndim=3)
    check_same([("x", x), ("v", v)])
    if x.shape[0] != v.shape[0]:
        raise ValueError(f"x and v must have the same batch size, got x {tuple(x.shape)} and "
                         f"v {tuple(v.shape)}")
    if x.shape[2] != v.shape[1]:
        raise ValueError(f"x's last dim (d2={x.shape[2]}) must equal v's dim 1 (got {v.shape[1]}): "
                         f"x is (batch, d1, d2), v is (batch, d2, d3)")
    if x.shape[0] > 65535:
        raise ValueError(f"batch must be <= 65535 (a CUDA grid dimension), got {x.shape[0]}")
    if input_precision is None:
        input_precision = "ieee"
    if input_precision not in PRECISIONS:
        raise ValueError(f"input_precision must be one of {PRECISIONS}, got {input_precision!r}")
    # Only float32 operands have a choice; for halves "tf32" is just the compiler default.
    return input_precision if x.dtype == torch.float32 else "tf32"


def _pow2_block(n, lo, hi):
    return min(max(lo, next_pow2(n)), hi)


def _trivial(x, v):
    """The output when a dim is empty (no launch), or None. An empty d2 gives zeros, like torch."""
    batch, d1, d2 = x.shape
    d3 = v.shape[2]
    if batch * d1 * d3 == 0 or d2 == 0:
        out = empty((batch, d1, d3), x.dtype, x.device)
        return out.zero_()
    return None


def _default_tiles(dtype, d1, d2, d3) -> tuple:
    """(block_1, block_2, block_3, num_warps, num_stages) of the fused kernel, from config
    searches on the H100 (docs/softmax_matmul.md). float16/bfloat16 with d3 > 64: one program holds
    64 rows by all of d3 up to 512 (x read once; 8 warps: 16 x 2048 x d2 x 512 fp16 in 0.74 ms
    against 0.84 with 16 warps at d2 = 8192, 0.11 against 0.12 at 1024, bf16 alike), or 128 rows
    by d3 up to 256, with 64-key chunks: 16 x 2048 x 8192 x 128 in 0.36 ms against 0.59 with the
    float32 tiles. float32 (and d3 <=
    64): 32 x 32 score tiles by a 256-wide slice of d3 (ahead of larger tiles by ~2x at d3 = 512,
    where larger float32 tiles run out of registers or shared memory)."""
    if dtype != torch.float32 and d3 > 64:
        block_3 = _pow2_block(d3, 16, 512)
        if block_3 >= 512:
            return _pow2_block(d1, 16, 64), _pow2_block(d2, 16, 64), block_3, 8, 3
        return _pow2_block(d1, 16, 128), _pow2_block(d2, 16, 64), block_3, 8, 3
    return _pow2_block(d1, 16, 32), _pow2_block(d2, 16, 32), _pow2_block(d3, 16, 256), 4, 2


class _FusedLaunch(NamedTuple):
    """How triton_fused runs one layout (cached): no launch (a dim is empty: zeros), else the
    grid, the sizes and strides it passes and the kernel's constexprs and options."""

    trivial: bool
    out_shape: tuple
    grid: tuple
    sizes_strides: tuple  # d1, d2, d3, x's, v's and out's strides
    kwargs: dict
    # (shape, strides, block shape) of x's and v's descriptors where the kernel reads through TMA
    # (triton_fused still takes the pointer path for a call whose bases are not 16-byte aligned).
    tma: tuple | None = None


def _tma_spec(t, block) -> tuple | None:
    """A 3-D descriptor's (shape, strides, block shape) over t, or None where TMA cannot read t:
    last dim not contiguous, another stride not a positive multiple of 16 bytes or of 2**40 bytes
    or more (the hardware's limits), a dim of 2**31 or more (TMA coordinates are i32). The
    strides are `plan_strides`' (what the plan cache's key says about t), so that every tensor
    that finds this plan has a layout it describes."""
    strides = plan_strides(t)
    *outer, last = strides
    size = t.element_size()
    if last != 1 or max(t.shape) >= 2**31 or any(
            s <= 0 or (s * size) % 16 or s * size >= 2**40 for s in outer):
        return None
    return list(t.shape), list(strides), [1, *block]


def _fused_launch(x, v, block_1, block_2, block_3, input_precision, num_warps, num_stages,
                  tma) -> _FusedLaunch:
    precision = _check_inputs(x, v, input_precision)
    if tma not in (None, True, False):
        raise ValueError(f"tma must be None, True or False, got {tma!r}")
    batch, d1, d2 = x.shape
    d3 = v.shape[2]
    d_1, d_2, d_3, d_warps, d_stages = _default_tiles(x.dtype, d1, d2, d3)
    block_1 = check_pow2("block_1", d_1 if block_1 is None else block_1, why=DOT_MIN)
    block_2 = check_pow2("block_2", d_2 if block_2 is None else block_2, why=DOT_MIN)
    block_3 = check_pow2("block_3", d_3 if block_3 is None else block_3, why=DOT_MIN)
    num_warps = d_warps if num_warps is None else num_warps
    num_stages = d_stages if num_stages is None else num_stages
    out_shape = (batch, d1, d3)
    trivial = batch * d1 * d3 == 0 or d2 == 0
    out_strides = (d1 * d3, d3, 1)  # a new contiguous tensor's
    # TMA by default but for IEEE float32 (not measured there; half precision and tf32 gain
    # 6-19%: docs/softmax_matmul.md); tma=True asks for it there too.
    specs = None
    if (precision != "ieee" if tma is None else tma) and has_tma(x.device) and not trivial:
        specs = (_tma_spec(x, (block_1, block_2)), _tma_spec(v, (block_2, block_3)))
        specs = None if None in specs else specs
    return _FusedLaunch(
        trivial, out_shape, (cdiv(d1, block_1), cdiv(d3, block_3), batch),
        (d1, d2, d3, *plan_strides(x), *plan_strides(v), *out_strides),
        dict(BLOCK_1=block_1, BLOCK_2=block_2, BLOCK_3=block_3, INPUT_PRECISION=precision,
             UPCAST=_upcast_bf16(x.dtype), num_warps=num_warps, num_stages=num_stages),
        specs)


_PLANS = plan_cache()


def triton_fused(x, v, *, block_1=None, block_2=None, block_3=None, input_precision=None,
                 num_warps=None, num_stages=None, tma=None) -> torch.Tensor:
    """One Triton kernel: online softmax over d2 chunks, p @ v accumulated in float32.

    Grid: (d1 blocks, d3 tiles, batch). block_3 tiles d3 so the (block_1, block_3) accumulator
    fits in registers; each d3 tile recomputes the row softmax (cheap next to the matmul while
    d3 / block_3 is small). Tiles are read through TMA on GPUs that have it where the layouts
    allow (tma=None: but for IEEE float32; True: there too; False: never). The checks and the
    plan are remembered per layout of x and v.
    """
    how = cached(_PLANS, layout_key((x, v), (block_1, block_2, block_3, input_precision,
                                             num_warps, num_stages, tma)),
                 _fused_launch, x, v, block_1, block_2, block_3, input_precision, num_warps,
                 num_stages, tma)
    out = empty(how.out_shape, x.dtype, x.device)
    if how.trivial:  # an empty d2 gives zeros, like torch
        return out.zero_()
    if how.tma is not None and not (x.data_ptr() | v.data_ptr()) & 15:
        descs = (descriptor(x, *how.tma[0]), descriptor(v, *how.tma[1]))
        launch(_softmax_matmul_kernel, how.grid, x, v, out, *descs, *how.sizes_strides,
               TMA=True, **how.kwargs)
    else:
        launch(_softmax_matmul_kernel, how.grid, x, v, out, None, None, *how.sizes_strides,
               TMA=False, **how.kwargs)
    return out


def triton_unfused(x, v, *, block_m=None, block_n=None, block_k=None, input_precision=None,
                   num_warps=None, num_stages=None) -> torch.Tensor:
    """Two Triton kernels: P = softmax(x) (stored, x's dtype), then P @ v (same dot precision)."""
    precision = _check_inputs(x, v, input_precision)
    batch, d1, d2 = x.shape
    block_m = check_pow2("block_m", 64 if block_m is None else block_m, why=DOT_MIN)
    block_n = check_pow2("block_n", 64 if block_n is None else block_n, why=DOT_MIN)
    block_k = check_pow2("block_k", 32 if block_k is None else block_k, why=DOT_MIN)
    trivial = _trivial(x, v)
    if trivial is not None:
        return trivial
    p = softmax_rows(x, max_warps=8)
    return _bmm(p, v, input_precision=precision, block_m=block_m, block_n=block_n, block_k=block_k,
                num_warps=4 if num_warps is None else num_warps,
                num_stages=3 if num_stages is None else num_stages)


def fused_softmax(x, V, BLOCK_1=16, BLOCK_2=16, input_precision=None) -> torch.Tensor:
    """The seed's fused kernel under its own name and block arguments (= triton_fused)."""
    return triton_fused(x, V, block_1=BLOCK_1, block_2=BLOCK_2, input_precision=input_precision)


__all__ = ["fused_softmax", "reference", "softmax_mult", "triton_fused", "triton_unfused"]


# ------------------------------------------------------------------------------------------------
# softmax(x) @ v


def _forward(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return triton_fused(x, v)


def _fake(x, v):
    _check_inputs(x, v, None)
    return x.new_empty((x.shape[0], x.shape[1], v.shape[2]))


def _softmax_matmul_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _softmax_matmul_backward(ctx, dout):
    """P = softmax(x) recomputed in float32: dv = P^T dout, dx = P * (dP - rowsum(dP * P)) with
    dP = dout v^T."""
    x, v = ctx.saved_tensors
    p = torch.softmax(x.float(), -1)
    g = dout.float()
    dv = (p.transpose(1, 2) @ g).to(v.dtype)
    dp = g @ v.float().transpose(1, 2)
    dx = (p * (dp - (dp * p).sum(-1, keepdim=True))).to(x.dtype)
    return dx, dv


_SOFTMAX_MATMUL = declare("softmax_matmul", _forward, _fake, setup=_softmax_matmul_setup,
                          backward=_softmax_matmul_backward, direct=triton_fused,
                          autocast=LOWER)  # as torch.softmax(x, -1) @ v: the matmul's dtype


def softmax_matmul(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`softmax(x, -1) @ v` in one fused Triton kernel, the softmax matrix never stored;
    differentiable (backward in PyTorch ops).

    x: (batch, d1, d2), v: (batch, d2, d3), one dtype (float32, float16 or bfloat16), any strides,
    on CUDA (or on the CPU under TRITON_INTERPRET=1). float32 uses IEEE products, like PyTorch's
    default; see triton_fused for tf32 and block sizes. Returns (batch, d1, d3) in x's
    dtype.
    """
    return _SOFTMAX_MATMUL(x, v)
