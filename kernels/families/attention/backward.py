"""Attention backward, FlashAttention-2 style: dq, dk, dv without the (seq, seq) matrices.

The forward saves, per query row, the log-sum-exp of its scaled scores (base 2, as the forward
computes them). The backward recomputes each probability tile from it, p = 2^(q k^T * scale *
log2(e) - lse), instead of storing P, in three kernels:
- preprocess: delta = rowsum(dO * O), per query row (the softmax Jacobian's correction term);
- dk, dv: one program per key tile (of a key/value head) walks the query tiles of every query
  head that shares it (grouped-query attention; only the tiles at or below the diagonal when
  causal): dv += p^T dO, dk += scale * ds^T q with ds = p * (dO v^T - delta);
- dq: one program per query tile walks the key tiles: dq += scale * ds k.
Tiles hold q, k, v, dO in their dtype and accumulate in float32; p and ds are rounded to the
input dtype for the tensor-core products (as FlashAttention does). Pointer loads with masks at
each input's own strides (views of one QKV projection are read in place), so any sequence length
and any head_dim up to 256 (padded to a power of two inside the kernel).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._buffers import empty, scratch
from ..._device import interpreting
from ..._tiles import cdiv, next_pow2
from ..._launch import launch
from ..._dot import dot as _dot
from ..._dot import upcast_bf16 as _upcast_bf16


@triton.jit
def _load_tile(ptr, base, rows, cols, seq, head_dim, row_stride):
    """A [rows, cols] tile of a (seq, head_dim) matrix at base with rows row_stride apart, zeros
    outside."""
    mask = (rows < seq)[:, None] & (cols < head_dim)[None, :]
    return tl.load(ptr + base + rows[:, None] * row_stride + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _head_base(b, h, stride_b, stride_h):
    return b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h


@triton.jit
def _attn_bwd_preprocess(O, DO, Delta, SEQ, H, so_b, so_h, so_s, sdo_b, sdo_h, sdo_s,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    off_hz = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    b, h = off_hz // H, off_hz % H
    o = _load_tile(O, _head_base(b, h, so_b, so_h), rows, cols, SEQ, HEAD_DIM, so_s)
    do = _load_tile(DO, _head_base(b, h, sdo_b, sdo_h), rows, cols, SEQ, HEAD_DIM, sdo_s)
    o = o.to(tl.float32)
    do = do.to(tl.float32)
    tl.store(Delta + off_hz.to(tl.int64) * SEQ + rows, tl.sum(o * do, 1), mask=rows < SEQ)


@triton.jit
def _attn_bwd_dkdv(Q, K, V, DO, LSE, Delta, DK, DV, sm_scale, SEQ, SEQ_K, H, GROUP,
                   sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sdo_b, sdo_h, sdo_s,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                   UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dk, dv of one key tile of one key/value head: the query tiles that see it, of each of the
    GROUP query heads that share the head, one at a time (transposed scores). Inputs at their
    strides; dk and dv contiguous."""
    off_kv = tl.program_id(1)
    start_n = tl.program_id(0) * BLOCK_N
    kv_heads = H // GROUP
    b, h_kv = off_kv // kv_heads, off_kv % kv_heads
    offs_n = start_n + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    k = _load_tile(K, _head_base(b, h_kv, sk_b, sk_h), offs_n, cols, SEQ_K, HEAD_DIM, sk_s)
    v = _load_tile(V, _head_base(b, h_kv, sv_b, sv_h), offs_n, cols, SEQ_K, HEAD_DIM, sv_s)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    qk_scale = sm_scale * 1.44269504
    # Causal, aligned to the bottom right: query m sees key n when m + shift >= n, so queries
    # before the tile's first key minus shift see none of it.
    shift = SEQ_K - SEQ
    lo = tl.maximum(start_n - shift, 0) // BLOCK_M * BLOCK_M if CAUSAL else 0
    for g in range(GROUP):
        h = h_kv * GROUP + g
        base_q = _head_base(b, h, sq_b, sq_h)
        base_do = _head_base(b, h, sdo_b, sdo_h)
        row0 = (b * H + h).to(tl.int64) * SEQ
        for start_m in tl.range(lo, SEQ, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            q = _load_tile(Q, base_q, offs_m, cols, SEQ, HEAD_DIM, sq_s)
            do = _load_tile(DO, base_do, offs_m, cols, SEQ, HEAD_DIM, sdo_s)
            lse = tl.load(LSE + row0 + offs_m, mask=offs_m < SEQ, other=0.0)
            delta = tl.load(Delta + row0 + offs_m, mask=offs_m < SEQ, other=0.0)
            keep = (offs_m < SEQ)[None, :]
            if CAUSAL:
                keep = keep & (offs_m[None, :] + shift >= offs_n[:, None])
            qk_t = _dot(k, tl.trans(q), None, "tf32", UPCAST)
            p_t = tl.where(keep, tl.math.exp2(qk_t * qk_scale - lse[None, :]), 0.0)
            dv = _dot(p_t.to(do.dtype), do, dv, "tf32", UPCAST)
            dp_t = _dot(v, tl.trans(do), None, "tf32", UPCAST)
            ds_t = p_t * (dp_t - delta[None, :])
            dk = _dot(ds_t.to(q.dtype), q, dk, "tf32", UPCAST)
    mask = (offs_n < SEQ_K)[:, None] & (cols < HEAD_DIM)[None, :]
    out = off_kv.to(tl.int64) * SEQ_K * HEAD_DIM + offs_n[:, None] * HEAD_DIM + cols[None, :]
    tl.store(DK + out, (dk * sm_scale).to(DK.dtype.element_ty), mask=mask)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=mask)


@triton.jit
def _attn_bwd_dq(Q, K, V, DO, LSE, Delta, DQ, sm_scale, SEQ, SEQ_K, H, GROUP,
                 sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sdo_b, sdo_h, sdo_s,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                 UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dq of one query tile: the key tiles it sees, one at a time. Inputs at their strides; dq
    contiguous."""
    off_hz = tl.program_id(1)
    start_m = tl.program_id(0) * BLOCK_M
    b, h = off_hz // H, off_hz % H
    base_k = _head_base(b, h // GROUP, sk_b, sk_h)
    base_v = _head_base(b, h // GROUP, sv_b, sv_h)
    row0 = off_hz.to(tl.int64) * SEQ
    offs_m = start_m + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    q = _load_tile(Q, _head_base(b, h, sq_b, sq_h), offs_m, cols, SEQ, HEAD_DIM, sq_s)
    do = _load_tile(DO, _head_base(b, h, sdo_b, sdo_h), offs_m, cols, SEQ, HEAD_DIM, sdo_s)
    lse = tl.load(LSE + row0 + offs_m, mask=offs_m < SEQ, other=0.0)
    delta = tl.load(Delta + row0 + offs_m, mask=offs_m < SEQ, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    qk_scale = sm_scale * 1.44269504
    shift = SEQ_K - SEQ
    hi = tl.minimum(start_m + BLOCK_M + shift, SEQ_K) if CAUSAL else SEQ_K
    for start_n in tl.range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(K, base_k, offs_n, cols, SEQ_K, HEAD_DIM, sk_s)
        v = _load_tile(V, base_v, offs_n, cols, SEQ_K, HEAD_DIM, sv_s)
        keep = (offs_n < SEQ_K)[None, :]
        if CAUSAL:
            keep = keep & (offs_m[:, None] + shift >= offs_n[None, :])
        qk = _dot(q, tl.trans(k), None, "tf32", UPCAST)
        p = tl.where(keep, tl.math.exp2(qk * qk_scale - lse[:, None]), 0.0)
        dp = _dot(do, tl.trans(v), None, "tf32", UPCAST)
        ds = p * (dp - delta[:, None])
        dq = _dot(ds.to(k.dtype), k, dq, "tf32", UPCAST)
    mask = (offs_m < SEQ)[:, None] & (cols < HEAD_DIM)[None, :]
    tl.store(DQ + off_hz.to(tl.int64) * SEQ * HEAD_DIM + offs_m[:, None] * HEAD_DIM + cols[None, :],
             (dq * sm_scale).to(DQ.dtype.element_ty), mask=mask)


def default_blocks(head_dim: int) -> dict:
    """Launch settings of the two kernels: {"dkdv": {...}, "dq": {...}}, each with block_m,
    block_n, num_warps, num_stages. dk/dv keep a key tile resident and walk query tiles; dq the
    reverse."""
    if interpreting():
        one = dict(block_m=16, block_n=16, num_warps=4, num_stages=1)
        return dict(dkdv=one, dq=one)
    if next_pow2(head_dim) > 128:
        one = dict(block_m=32, block_n=32, num_warps=4, num_stages=1)
        return dict(dkdv=one, dq=one)
    # dq gains from 128-query tiles (8 warps), dk/dv from a third stage at head_dim 64 only
    # (docs/attention.md, "Measurements behind the constants").
    dq = dict(block_m=128, block_n=64, num_warps=8, num_stages=3)
    if next_pow2(head_dim) <= 64:
        return dict(dkdv=dict(block_m=64, block_n=64, num_warps=4, num_stages=3), dq=dq)
    return dict(dkdv=dict(block_m=64, block_n=64, num_warps=4, num_stages=2), dq=dq)


def attention_backward(q, k, v, out, lse, dout, causal: bool, sm_scale: float, blocks=None):
    """(dq, dk, dv) of attention, from the forward's inputs, output and per-row log-sum-exp
    (float32, (batch * heads, seq_q), base 2). q, out (batch, heads, seq_q, dim); k, v (batch,
    kv_heads, seq_k, dim), one dtype, any strides (read in place where the last dim is unit-stride).
    Causal is aligned to the bottom right, as in the forward. blocks: default_blocks' form
    (None: default_blocks(head_dim))."""
    batch, heads, seq, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    # Read at their own strides (views of one QKV projection need no copy); copied only where the
    # last dim is strided or a row offset could pass int32 inside the kernels.
    q, k, v, out, dout = (t if t.stride(-1) == 1 and t.stride(2) * t.shape[2] < 2**31
                          else t.contiguous() for t in (q, k, v, out, dout))
    dq, dk, dv = (empty(t.shape, t.dtype, t.device) for t in (q, k, v))
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    block_d = max(16, next_pow2(head_dim))
    cfg = blocks or default_blocks(head_dim)
    # A temporary: reused across calls (an allocation on the autograd worker thread costs the
    # host ~4x one on the main thread, _buffers.scratch).
    delta = scratch((batch * heads, seq), torch.float32, q.device)[0]
    strides = tuple(st for t in (q, k, v, dout) for st in t.stride()[:3])
    launch(_attn_bwd_preprocess, (cdiv(seq, 64), batch * heads), out, dout, delta, seq, heads,
           *out.stride()[:3], *dout.stride()[:3], HEAD_DIM=head_dim, BLOCK_M=64,
           BLOCK_D=block_d, num_warps=4)
    consts = dict(HEAD_DIM=head_dim, BLOCK_D=block_d, CAUSAL=causal,
                  UPCAST=_upcast_bf16(q.dtype))
    sizes = (seq, seq_k, heads, heads // kv_heads)

    def launch_args(c):
        return dict(BLOCK_M=c["block_m"], BLOCK_N=c["block_n"], num_warps=c["num_warps"],
                    num_stages=c["num_stages"])
    kv, qc = cfg["dkdv"], cfg["dq"]
    launch(_attn_bwd_dkdv, (cdiv(seq_k, kv["block_n"]), batch * kv_heads),
        q, k, v, dout, lse, delta, dk, dv, float(sm_scale), *sizes, *strides, **consts,
        **launch_args(kv))
    launch(_attn_bwd_dq, (cdiv(seq, qc["block_m"]), batch * heads),
        q, k, v, dout, lse, delta, dq, float(sm_scale), *sizes, *strides, **consts,
        **launch_args(qc))
    return dq, dk, dv


__all__ = ["attention_backward", "default_blocks"]
