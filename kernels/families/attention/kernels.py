"""The fused attention forward's Triton programs (FlashAttention-2, Triton's tutorial 06 for
Hopper): the host side that plans and launches them is `forward`."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime import _allocation

from ..._dot import dot as _dot
from ..._device import interpreting


def _torch_allocator(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda" if not interpreting() else "cpu")


def _needs_allocator():
    """Device-side descriptors (_attn_fwd_ws's, the Gluon forward's) take global scratch from
    Triton's allocator: torch's where the caller has set none (stream-ordered, so the scratch
    lives as long as the launch needs)."""
    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(_torch_allocator)


# ------------------------------------------------------------------------------------ fused


@triton.jit
def _load_rows(src, b, h, row, offset_y, row_stride, n_rows, MODE: tl.constexpr,
               ROWS: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr):
    """ROWS rows of one head from `row` on. MODE 0: a 2-D host descriptor over the contiguous
    (batch * heads * seq, head_dim) view, row offset_y + row; 1: a 4-D host descriptor (any
    strides), (batch, head, row); 2 (GPUs without TMA): src points at the head's first row,
    rows row_stride elements apart, n_rows of them; masked loads, zeros past the ends."""
    if MODE == 0:
        return src.load([offset_y + row, 0])
    elif MODE == 1:
        return src.load([b, h, row, 0]).reshape([ROWS, BLOCK_D])
    else:
        rows = row + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_D)
        return tl.load(src + rows.to(tl.int64)[:, None] * row_stride + cols[None, :],
                       mask=(rows < n_rows)[:, None] & (cols < HEAD_DIM)[None, :], other=0.0)


@triton.jit
def _scores(q, src_k, kv_b, kv_h, start_n, offset_y, k_stride, seq, MODE: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
            UPCAST: tl.constexpr):
    """q k^T for the key tile at start_n (float32, unscaled)."""
    k = _load_rows(src_k, kv_b, kv_h, start_n, offset_y, k_stride, seq, MODE, BLOCK_N, BLOCK_D,
                   HEAD_DIM)
    return _dot(q, k.T, None, "tf32", UPCAST)


@triton.jit
def _masked_scores(qk, qk_scale, start_n, offs_m, offs_n, seq, shift, MASK: tl.constexpr):
    """Scaled scores with -inf for keys past seq and, MASK 1 (causal), past each query's
    diagonal (query i sees keys j <= i + shift)."""
    cols = start_n + offs_n
    keep = (cols < seq)[None, :]
    if MASK == 1:
        keep = keep & (offs_m[:, None] + shift >= cols[None, :])
    return tl.where(keep, qk * qk_scale, float("-inf"))


@triton.jit
def _unmasked_exp(qk, m_i, qk_scale, SCALE_POS: tl.constexpr):
    """(p, alpha, new max) of the online softmax for a tile with no masked score: the scale
    folded into the max and one FMA, base-2 exponent throughout. SCALE_POS: qk_scale >= 0 (else
    the row's largest scaled score is its smallest score times the scale)."""
    if SCALE_POS:
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    else:
        m_ij = tl.maximum(m_i, tl.min(qk, 1) * qk_scale)
    return tl.math.exp2(qk * qk_scale - m_ij[:, None]), tl.math.exp2(m_i - m_ij), m_ij


@triton.jit
def _attn_inner(acc, l_i, m_i, q, src_k, src_v, kv_b, kv_h, offset_y, k_stride, v_stride, lo,
                hi, offs_m, offs_n, qk_scale, seq, shift, BLOCK_N: tl.constexpr,
                MASK: tl.constexpr, UPCAST: tl.constexpr, SCALE_POS: tl.constexpr,
                MODE: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Key/value tiles [lo, hi). MASK: 0 none; 1 causal (query i sees keys j <= i + shift) and
    keys past seq; 2 keys past seq. SCALE_POS: see _unmasked_exp."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        qk = _scores(q, src_k, kv_b, kv_h, start_n, offset_y, k_stride, seq, MODE, BLOCK_N,
                     BLOCK_D, HEAD_DIM, UPCAST)
        if MASK == 0:
            p, alpha, m_ij = _unmasked_exp(qk, m_i, qk_scale, SCALE_POS)
        else:
            qk = _masked_scores(qk, qk_scale, start_n, offs_m, offs_n, seq, shift, MASK)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            # A row with every key so far masked subtracts 0, not -inf (which gives NaN).
            m_sub = tl.where(m_ij == float("-inf"), 0.0, m_ij)
            p = tl.math.exp2(qk - m_sub[:, None])
            alpha = tl.math.exp2(m_i - m_sub)
        l_ij = tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = _load_rows(src_v, kv_b, kv_h, start_n, offset_y, v_stride, seq, MODE, BLOCK_N,
                       BLOCK_D, HEAD_DIM)
        # p rounded to v's dtype for the tensor-core product, accumulated in float32.
        acc = _dot(p.to(v.dtype), v, acc, "tf32", UPCAST)
        # Updated last, to shorten the live ranges inside the loop (as the tutorial does).
        l_i = l_i * alpha + l_ij
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _attn_program(Q, K, V, O, LSE, sm_scale, SEQ, SEQ_K, H, GROUP, sqb, sqh, sqs, skb, skh, sks,
                  svb, svh, svs, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                  CAUSAL: tl.constexpr, UPCAST: tl.constexpr, SCALE_POS: tl.constexpr,
                  STORE_LSE: tl.constexpr, MODE: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """One program of the forward: query tile program_id(0) of (batch * head) program_id(1).
    SEQ queries, SEQ_K keys; the H query heads of a batch share H / GROUP key/value heads (GROUP
    query heads each: grouped-query attention). Q, K, V as _load_rows's MODE takes them; the
    strides (elements; batch, head, row) are read in MODE 2 alone."""
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_kv = (off_hz // H) * (H // GROUP) + (off_hz % H) // GROUP
    b = off_hz // H
    h = off_hz % H
    kv_b = off_kv // (H // GROUP)
    kv_h = off_kv % (H // GROUP)
    if MODE == 2:
        Q = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
        K = K + kv_b.to(tl.int64) * skb + kv_h.to(tl.int64) * skh
        V = V + kv_b.to(tl.int64) * svb + kv_h.to(tl.int64) * svh
    # In MODE 0 a tile past the end of one head reads the next head's rows (masked or not
    # stored) or zeros past the tensor, never out of bounds.
    offset_kv = off_kv * SEQ_K
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    qk_scale = sm_scale * 1.44269504  # log2(e): exp(x) = exp2(x * log2(e))
    # Columns past head_dim load as zeros, so the padded dot products are exact.
    q = _load_rows(Q, b, h, start_m * BLOCK_M, off_hz * SEQ, sqs, SEQ, MODE, BLOCK_M, BLOCK_D,
                   HEAD_DIM)
    if CAUSAL:
        # Aligned to the bottom right (a KV cache: the last query sees every key): query i sees
        # keys j <= i + shift. Tiles every query of the block sees need no mask; those past the
        # last query's diagonal are skipped.
        shift = SEQ_K - SEQ
        lo = (start_m * BLOCK_M + shift + 1) // BLOCK_N * BLOCK_N
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, K, V, kv_b, kv_h, offset_kv, sks, svs, 0,
                                    lo, offs_m, offs_n, qk_scale, SEQ_K, shift, BLOCK_N, 0,
                                    UPCAST, SCALE_POS, MODE, BLOCK_D, HEAD_DIM)
        hi = tl.minimum(start_m * BLOCK_M + BLOCK_M + shift, SEQ_K)
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, K, V, kv_b, kv_h, offset_kv, sks, svs, lo,
                                    hi, offs_m, offs_n, qk_scale, SEQ_K, shift, BLOCK_N, 1,
                                    UPCAST, SCALE_POS, MODE, BLOCK_D, HEAD_DIM)
    else:
        # Whole tiles unmasked, then the partial last tile (if any) with keys past seq masked.
        n_full = SEQ_K - SEQ_K % BLOCK_N
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, K, V, kv_b, kv_h, offset_kv, sks, svs, 0,
                                    n_full, offs_m, offs_n, qk_scale, SEQ_K, 0, BLOCK_N, 0,
                                    UPCAST, SCALE_POS, MODE, BLOCK_D, HEAD_DIM)
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, K, V, kv_b, kv_h, offset_kv, sks, svs,
                                    n_full, SEQ_K, offs_m, offs_n, qk_scale, SEQ_K, 0, BLOCK_N, 2,
                                    UPCAST, SCALE_POS, MODE, BLOCK_D, HEAD_DIM)
    acc = acc / l_i[:, None]
    # A masked pointer store: rows past seq belong to the next head, columns past head_dim to
    # the next row (the epilogue is one tile per program, a small share of the traffic).
    offs_d = tl.arange(0, BLOCK_D)
    o_ptrs = (O + off_hz.to(tl.int64) * SEQ * HEAD_DIM + offs_m[:, None] * HEAD_DIM
              + offs_d[None, :])
    tl.store(o_ptrs, acc.to(O.dtype.element_ty),
             mask=(offs_m < SEQ)[:, None] & (offs_d < HEAD_DIM)[None, :])
    if STORE_LSE:
        # The row's log-sum-exp of scaled scores, base 2: what the backward recomputes P from.
        tl.store(LSE + off_hz.to(tl.int64) * SEQ + offs_m, m_i + tl.math.log2(l_i),
                 mask=offs_m < SEQ)


@triton.jit
def _attn_fwd(Q, K, V, O, LSE, sm_scale, SEQ, SEQ_K, H, GROUP,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
              UPCAST: tl.constexpr, SCALE_POS: tl.constexpr, STORE_LSE: tl.constexpr,
              MODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The forward over contiguous q, k, v or host tensor descriptors: grid (query tiles,
    batch * heads). MODE 0: q, k, v are 2-D descriptors over contiguous tensors (TMA; sm_90+ and
    the interpreter); 1: 4-D descriptors over tensors of any strides; 2: the contiguous tensors
    themselves, read through plain masked loads (small problems, see TMA_FROM_FLOPS: their
    strides follow from the sizes, so the launch passes no more arguments than with
    descriptors)."""
    if MODE == 2:
        _attn_program(Q, K, V, O, LSE, sm_scale, SEQ, SEQ_K, H, GROUP, H * SEQ * HEAD_DIM,
                      SEQ * HEAD_DIM, HEAD_DIM, H // GROUP * SEQ_K * HEAD_DIM, SEQ_K * HEAD_DIM,
                      HEAD_DIM, H // GROUP * SEQ_K * HEAD_DIM, SEQ_K * HEAD_DIM, HEAD_DIM,
                      HEAD_DIM, BLOCK_D, CAUSAL, UPCAST, SCALE_POS, STORE_LSE, 2, BLOCK_M,
                      BLOCK_N)
    else:
        _attn_program(Q, K, V, O, LSE, sm_scale, SEQ, SEQ_K, H, GROUP, 0, 0, 0, 0, 0, 0, 0, 0,
                      0, HEAD_DIM, BLOCK_D, CAUSAL, UPCAST, SCALE_POS, STORE_LSE, MODE, BLOCK_M,
                      BLOCK_N)


@triton.jit
def _attn_fwd_pointers(Q, K, V, O, LSE, sm_scale, SEQ, SEQ_K, H, GROUP, sqb, sqh, sqs, skb, skh,
                       sks, svb, svh, svs, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                       CAUSAL: tl.constexpr, UPCAST: tl.constexpr, SCALE_POS: tl.constexpr,
                       STORE_LSE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The same forward through plain masked loads, for GPUs without TMA (before Hopper): q, k,
    v of any strides (elements: batch, head, row; the last dim contiguous), read in place."""
    _attn_program(Q, K, V, O, LSE, sm_scale, SEQ, SEQ_K, H, GROUP, sqb, sqh, sqs, skb, skh, sks,
                  svb, svh, svs, HEAD_DIM, BLOCK_D, CAUSAL, UPCAST, SCALE_POS, STORE_LSE, 2,
                  BLOCK_M, BLOCK_N)


@triton.jit
def _attn_fwd_ws(Q, K, V, O, LSE, sm_scale, SEQ, SEQ_K, H, GROUP, ROWS_Q, ROWS_KV,
                 HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr, SCALE_POS: tl.constexpr,
                 STORE_LSE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The non-causal forward with Triton's automatic warp specialisation on Hopper
    (`warp_specialize=True`: a producer warp feeds the key/value tiles through TMA while the
    consumer warps compute, as FlashAttention-3 does by hand). For what the pass compiles in
    Triton 3.6: one loop, no masks (contiguous q, k, v with seq and seq_k multiples of the
    blocks, head_dim a power of two), descriptors made on the device (host ones fail in the
    pass). Q, K, V are the tensors, viewed as (ROWS_Q or ROWS_KV, HEAD_DIM)."""
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_kv = (off_hz // H) * (H // GROUP) + (off_hz % H) // GROUP
    desc_q = tl.make_tensor_descriptor(Q, shape=[ROWS_Q, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])
    desc_k = tl.make_tensor_descriptor(K, shape=[ROWS_KV, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    desc_v = tl.make_tensor_descriptor(V, shape=[ROWS_KV, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    qk_scale = sm_scale * 1.44269504  # log2(e)
    q = desc_q.load([off_hz * SEQ + start_m * BLOCK_M, 0])
    row_kv = off_kv * SEQ_K
    for start_n in tl.range(0, SEQ_K, BLOCK_N, warp_specialize=True):
        k = desc_k.load([row_kv + start_n, 0])
        qk = _dot(q, k.T, None, "tf32", UPCAST)
        p, alpha, m_ij = _unmasked_exp(qk, m_i, qk_scale, SCALE_POS)
        l_ij = tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = desc_v.load([row_kv + start_n, 0])
        acc = _dot(p.to(v.dtype), v, acc, "tf32", UPCAST)
        l_i = l_i * alpha + l_ij
        m_i = m_ij
    acc = acc / l_i[:, None]
    offs_d = tl.arange(0, HEAD_DIM)
    tl.store(O + off_hz.to(tl.int64) * SEQ * HEAD_DIM + offs_m[:, None] * HEAD_DIM
             + offs_d[None, :], acc.to(O.dtype.element_ty))
    if STORE_LSE:
        tl.store(LSE + off_hz.to(tl.int64) * SEQ + offs_m, m_i + tl.math.log2(l_i))
