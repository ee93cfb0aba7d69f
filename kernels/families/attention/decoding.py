"""Attention for few queries against many keys (decoding with a KV cache), split along the keys.

With one query per head (Sq = 1), FlashAttention's grid (query tiles, batch * heads) has one
program per head: batch 1 with 32 heads fills 32 of an H100's 132 SMs, and a 64-row query tile
holds one useful row. Flash-decoding splits the keys instead: program (split, batch * kv head)
walks one chunk of the keys for every query that reads that key/value head (the GROUP query
heads of grouped-query attention times the few queries, packed as the rows of one tile, so k
and v are read once per kv head, not once per query head) and stores its partial output and
log-sum-exp; a second kernel merges the splits: with lse_s the chunks' log-sum-exps (base 2),
out = sum_s 2^(lse_s - L) o_s with L = log2(sum_s 2^lse_s).

Pointer loads with the tensors' own strides (views of a KV cache need no copy), any head_dim up
to 256 (masked to the next power of two). One split stores the final output directly.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..._buffers import empty, scratch
from ..._device import interpreting, sm_count_of
from ..._tiles import cdiv, next_pow2
from ..._plans import cached, layout_key, plan_cache, plan_strides
from ..._launch import launch
from ..._dot import dot as _dot
from ..._dot import upcast_bf16 as _upcast_bf16

MAX_ROWS = 16  # seq_q * (heads / kv_heads) up to this: decoding (one query, a few with speculation)
MIN_CHUNK = 256  # keys per split, at least


@triton.jit
def _decode_split(Q, K, V, O, LSE, sm_scale, SEQ, SEQ_K, H_KV, GROUP, CHUNK,
                  sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
                  so_b, so_h, so_s, so_x, sl_x,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                  UPCAST: tl.constexpr, FINAL: tl.constexpr, STORE_LSE: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program (split, batch * kv head). Row r of the tile is query r % SEQ of query head
    kv_head * GROUP + r // SEQ. FINAL (one split): O is the output (batch, heads, seq, dim) and
    LSE (batch * heads, seq); else O is the float32 partials (split, batch * kv heads, rows, dim),
    LSE (split, batch * kv heads, rows), at strides so_x and sl_x per split."""
    split = tl.program_id(0)
    off_kv = tl.program_id(1)
    b = off_kv // H_KV
    kv_h = off_kv % H_KV
    rows = tl.arange(0, BLOCK_M)
    q_i = rows % SEQ
    q_h = kv_h * GROUP + rows // SEQ
    row_ok = rows < SEQ * GROUP
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < HEAD_DIM
    q_ptrs = (Q + b.to(tl.int64) * sq_b + q_h[:, None].to(tl.int64) * sq_h
              + q_i[:, None].to(tl.int64) * sq_s + cols[None, :])
    q = tl.load(q_ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    k_base = K + b.to(tl.int64) * sk_b + kv_h.to(tl.int64) * sk_h
    v_base = V + b.to(tl.int64) * sv_b + kv_h.to(tl.int64) * sv_h
    qk_scale = sm_scale * 1.44269504  # log2(e)
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, SEQ_K)
    if CAUSAL:
        last = q_i + SEQ_K - SEQ  # bottom-right aligned: query i sees keys j <= i + SEQ_K - SEQ
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for start in tl.range(lo, hi, BLOCK_N):
        keys = start + offs_n
        kv_mask = (keys < hi)[:, None] & col_ok[None, :]
        k = tl.load(k_base + keys[:, None].to(tl.int64) * sk_s + cols[None, :], mask=kv_mask,
                    other=0.0)
        v = tl.load(v_base + keys[:, None].to(tl.int64) * sv_s + cols[None, :], mask=kv_mask,
                    other=0.0)
        qk = _dot(q, k.T, None, "tf32", UPCAST)
        keep = (keys < hi)[None, :]
        if CAUSAL:
            keep = keep & (keys[None, :] <= last[:, None])
        s = tl.where(keep, qk * qk_scale, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(s, 1))
        m_sub = tl.where(m_ij == float("-inf"), 0.0, m_ij)  # no key yet: no NaN
        p = tl.math.exp2(s - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], "tf32", UPCAST)
        m_i = m_ij
    # A row that saw no key in this chunk (causal, or past the end) has l = 0: output 0, lse -inf.
    seen = l_i > 0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    if FINAL:
        o_ptrs = (O + b.to(tl.int64) * so_b + q_h[:, None].to(tl.int64) * so_h
                  + q_i[:, None].to(tl.int64) * so_s + cols[None, :])
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
        if STORE_LSE:
            heads = H_KV * GROUP
            tl.store(LSE + (b * heads + q_h).to(tl.int64) * SEQ + q_i, lse, mask=row_ok)
    else:
        part = split.to(tl.int64) * so_x + off_kv.to(tl.int64) * BLOCK_M * BLOCK_D
        tl.store(O + part + rows[:, None] * BLOCK_D + cols[None, :], out)
        tl.store(LSE + split.to(tl.int64) * sl_x + off_kv.to(tl.int64) * BLOCK_M + rows, lse)


@triton.jit
def _decode_merge(P, PL, O, LSE, SEQ, H_KV, GROUP, N_SPLITS, so_b, so_h, so_s, so_x, sl_x,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_S: tl.constexpr, STORE_LSE: tl.constexpr):
    """Program (batch * kv head): the rows of one tile, merged over the splits."""
    off_kv = tl.program_id(0)
    b = off_kv // H_KV
    kv_h = off_kv % H_KV
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    splits = tl.arange(0, BLOCK_S)
    lse = tl.load(PL + splits[:, None].to(tl.int64) * sl_x + off_kv * BLOCK_M + rows[None, :],
                  mask=(splits < N_SPLITS)[:, None], other=float("-inf"))  # [S, M]
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.math.exp2(lse - top[None, :])
    total = tl.sum(w, 0)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for s in range(N_SPLITS):
        w_s = tl.math.exp2(tl.load(PL + s * sl_x + off_kv * BLOCK_M + rows) - top)
        o_s = tl.load(P + s * so_x.to(tl.int64) + off_kv.to(tl.int64) * BLOCK_M * BLOCK_D
                      + rows[:, None] * BLOCK_D + cols[None, :])
        acc += w_s[:, None] * o_s
    out = acc / total[:, None]
    q_i = rows % SEQ
    q_h = kv_h * GROUP + rows // SEQ
    row_ok = rows < SEQ * GROUP
    o_ptrs = (O + b.to(tl.int64) * so_b + q_h[:, None].to(tl.int64) * so_h
              + q_i[:, None].to(tl.int64) * so_s + cols[None, :])
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & (cols < HEAD_DIM)[None, :])
    if STORE_LSE:
        heads = H_KV * GROUP
        tl.store(LSE + (b * heads + q_h).to(tl.int64) * SEQ + q_i, top + tl.math.log2(total),
                 mask=row_ok)


def applies(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Few enough query rows per key/value head for one tile."""
    return q.shape[2] * (q.shape[1] // k.shape[1]) <= MAX_ROWS


def default_splits(batch_kv_heads: int, seq_k: int, device) -> int:
    """Enough programs to fill the SMs once, each with MIN_CHUNK keys at least. (Not twice: each
    split pays a fixed cost and the merge reads every split; docs/attention.md, "Decoding
    splits".)"""
    if interpreting():
        return min(4, max(1, cdiv(seq_k, 16)))
    want = cdiv(sm_count_of(device), batch_kv_heads)
    return max(1, min(want, seq_k // MIN_CHUNK))


def attention(q, k, v, causal: bool, sm_scale: float, *, num_splits=None, block_n=None,
              num_warps=None, num_stages=None, return_lse=True):
    """out (q's shape and dtype) and lse (float32 (batch * heads, seq_q), base 2; None unless
    return_lse), inputs checked by forward._check_inputs. num_splits: chunks of the keys
    (None: default_splits)."""
    options = (num_splits, block_n, num_warps, num_stages)
    key = layout_key((q, k, v), options)
    return_lse = bool(return_lse)
    plan = cached(_PLANS, None if key is None else key + (causal, return_lse), _plan, q, k, v,
                  causal, options, return_lse)
    out = empty(q.shape, q.dtype, q.device)
    lse = (empty((q.shape[0] * q.shape[1], q.shape[2]), torch.float32, q.device) if return_lse
           else None)
    if plan is None:
        return out, lse
    if plan.final:
        part, part_lse = out, out if lse is None else lse
    else:
        # The partials are read back by the merge alone, in stream order: kept between calls.
        part = scratch(plan.part_shape, torch.float32, q.device)[0]
        part_lse = scratch(plan.part_shape[:3], torch.float32, q.device)[0]
    launch(_decode_split, plan.grid, q, k, v, part, part_lse, sm_scale, *plan.split_args,
           **plan.split_consts)
    if not plan.final:
        launch(_decode_merge, plan.merge_grid, part, part_lse, out, out if lse is None else lse,
               *plan.merge_args, **plan.merge_consts)
    return out, lse


class _Plan(NamedTuple):
    grid: tuple
    split_args: tuple  # after sm_scale
    split_consts: dict
    final: bool  # one split: the split kernel stores the output
    part_shape: tuple
    merge_grid: tuple
    merge_args: tuple  # after lse
    merge_consts: dict


_PLANS = plan_cache()


def _plan(q, k, v, causal, options, return_lse) -> _Plan | None:
    """The launches for one layout of q, k, v (None: no output element)."""
    num_splits, block_n, num_warps, num_stages = options
    batch, heads, seq, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    group = heads // kv_heads
    if q.numel() == 0:
        return None
    block_m = max(16, next_pow2(seq * group))
    block_d = max(16, next_pow2(head_dim))
    if block_n is None:
        block_n = 16 if interpreting() else (64 if block_d <= 128 else 32)
    splits = num_splits or default_splits(batch * kv_heads, seq_k, q.device)
    # Chunks of whole key tiles; the count is what those chunks need (never an empty split).
    chunk = cdiv(cdiv(seq_k, splits), block_n) * block_n
    splits = cdiv(seq_k, chunk)
    final = splits == 1
    part_shape = (splits, batch * kv_heads, block_m, block_d)
    # The partials' per-split strides (contiguous, as `empty` makes them); 0 when final.
    sx, slx = (0, 0) if final else (math.prod(part_shape[1:]), math.prod(part_shape[1:3]))
    out_strides = (heads * seq * head_dim, seq * head_dim, head_dim)  # out: contiguous
    split_args = (seq, seq_k, kv_heads, group, chunk, *plan_strides(q)[:3], *plan_strides(k)[:3],
                  *plan_strides(v)[:3], *out_strides, sx, slx)
    split_consts = dict(HEAD_DIM=head_dim, BLOCK_D=block_d, CAUSAL=causal,
                        UPCAST=_upcast_bf16(q.dtype), FINAL=final, STORE_LSE=return_lse,
                        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps or 4,
                        num_stages=num_stages or (1 if interpreting() else 3))
    merge_args = (seq, kv_heads, group, splits, *out_strides, sx, slx)
    merge_consts = dict(HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=block_m,
                        BLOCK_S=max(2, next_pow2(splits)), STORE_LSE=return_lse, num_warps=4)
    return _Plan((splits, batch * kv_heads), split_args, split_consts, final, part_shape,
                 (batch * kv_heads,), merge_args, merge_consts)


__all__ = ["applies", "attention", "default_splits"]
