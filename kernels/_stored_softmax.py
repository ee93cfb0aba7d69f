"""The row softmax that other families' unfused baselines run between their matmuls, storing the
probabilities: softmax(X) @ V's, attention's (with its causal mask) and matmul + softmax's.

One kernel for all three. (The softmax family's own unfused version is a different thing on
purpose: three kernels, max, exp-sum and normalise, each result stored.)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._buffers import empty
from ._tiles import next_pow2
from ._launch import launch

NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _scaled(ptrs, mask, scale):
    """scale * x in float32, -inf where masked (after the scale: a negative one must not turn
    the padding into +inf)."""
    x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    return tl.where(mask, x * scale, NEG_INF)


@triton.jit
def _softmax_rows_kernel(x_ptr, out_ptr, d1, d2, sx_b, sx_1, sx_2, so_b, so_1, so_2, scale,
                         shift, CAUSAL: tl.constexpr, BLOCK: tl.constexpr,
                         ONE_TILE: tl.constexpr):
    """softmax(scale * x) over the last dim of a (batch, d1, d2) tensor, one program per row
    (grid: d1, batch), written in out's dtype. CAUSAL masks the columns past the row's index
    plus shift (row r keeps columns j <= r + shift).
    ONE_TILE (d2 <= BLOCK): the row in registers, read once. Else a lane-wise online (max, sum)
    over BLOCK-wide tiles, then a second read to write."""
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    x_row = x_ptr + b * sx_b + r * sx_1
    o_row = out_ptr + b * so_b + r * so_1
    offs = tl.arange(0, BLOCK).to(tl.int64)
    n = d2
    if CAUSAL:
        n = tl.minimum(d2, r + 1 + shift)
    if ONE_TILE:
        s = _scaled(x_row + offs * sx_2, offs < n, scale)
        p = tl.exp(s - tl.max(s, 0))
        tl.store(o_row + offs * so_2, (p * (1.0 / tl.sum(p, 0))).to(out_ptr.dtype.element_ty),
                 mask=offs < d2)
    else:
        m = tl.full([BLOCK], NEG_INF, tl.float32)
        l = tl.zeros([BLOCK], tl.float32)
        for start in tl.range(0, n, BLOCK):
            ks = start + offs
            m, l = online_step(m, l, _scaled(x_row + ks * sx_2, ks < n, scale))
        m_row, inv_l = online_finish(m, l)
        for start in tl.range(0, d2, BLOCK):
            ks = start + offs
            s = _scaled(x_row + ks * sx_2, ks < n, scale)
            tl.store(o_row + ks * so_2, (tl.exp(s - m_row) * inv_l).to(out_ptr.dtype.element_ty),
                     mask=ks < d2)


@triton.jit
def online_step(m, l, s):
    """One chunk of a per-lane online softmax: each lane's running max m and sum of exp l, updated
    with scores s. Lanes that have seen only -inf shift by 0, not -inf (no NaN from -inf - -inf)."""
    m_new = tl.maximum(m, s)
    shift = tl.where(m_new == NEG_INF, 0.0, m_new)
    return m_new, l * tl.exp(m - shift) + tl.exp(s - shift)


@triton.jit
def online_finish(m, l):
    """The row's max and 1 / (sum of exp) from the lanes' (m, l) of online_step."""
    m_row = tl.max(m, 0)
    return m_row, 1.0 / tl.sum(l * tl.exp(m - m_row), 0)


def softmax_rows(x: torch.Tensor, out: torch.Tensor | None = None, *, scale: float = 1.0,
                 causal: bool = False, causal_shift: int = 0, block: int | None = None,
                 max_block: int = 4096, max_warps: int = 16) -> torch.Tensor:
    """softmax(scale * x, -1) of a 2-D or 3-D tensor (any strides) into `out` (default: a new
    tensor of x's dtype). block: the tile, a power of two (default the row's next power of two,
    at most max_block; a row that fits is read once). Warps: one per 256 elements of the tile, at
    most max_warps."""
    out = empty(x.shape, x.dtype, x.device) if out is None else out
    x3, o3 = (x, out) if x.dim() == 3 else (x.unsqueeze(0), out.unsqueeze(0))
    batch, d1, d2 = x3.shape
    if x.numel() == 0:
        return out
    block = min(max(16, next_pow2(d2)), max_block) if block is None else block
    num_warps = max(1, min(max_warps, block // 256))
    launch(_softmax_rows_kernel, (d1, batch), x3, o3, d1, d2, *x3.stride(), *o3.stride(),
           float(scale), causal_shift, CAUSAL=causal, BLOCK=block, ONE_TILE=d2 <= block,
           num_warps=num_warps)
    return out
