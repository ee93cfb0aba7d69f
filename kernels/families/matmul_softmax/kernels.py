"""softmax(x @ W + b)'s Triton programs, one per method (see the package's docstring); `plan`
picks the method and tiles, the package launches them."""
from __future__ import annotations


import triton
import triton.language as tl

from ..._stored_softmax import online_finish, online_step
from ..._matmul import NEG_INF, _add_bias, _grouped, _mm_tile, tma_tile


# ------------------------------------------------------------------------------------------------
# Fused matmul + softmax kernels


@triton.jit
def _ms_simple_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, C, K, s_xb, s_xk, s_wk, s_wc, s_bias, s_ob,
                      HAS_BIAS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_C)
    col_ok = cols < C
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_C], tl.float32)
    for start in tl.range(0, K, BLOCK_K):
        ks = (start + offs_k).to(tl.int64)
        k_ok = ks < K
        xk = tl.load(x_ptr + row * s_xb + ks * s_xk, mask=k_ok, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + ks[:, None] * s_wk + cols[None, :] * s_wc,
                    mask=k_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        # A (BLOCK_K, BLOCK_C) broadcast product reduced over K: float32 FMAs, no tensor cores.
        acc += tl.sum(xk[:, None] * w, 0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols * s_bias, mask=col_ok, other=0.0).to(tl.float32)
    s = tl.where(col_ok, acc, NEG_INF)
    p = tl.exp(s - tl.max(s, 0))
    tl.store(out_ptr + row * s_ob + cols, (p * (1.0 / tl.sum(p, 0))).to(out_ptr.dtype.element_ty),
             mask=col_ok)


@triton.jit
def _tiled_epilogue(acc, rows, cols, bias_ptr, out_ptr, B, C, s_bias, s_ob,
                    HAS_BIAS: tl.constexpr):
    """The bias and the row softmax of a tile holding all C logits of its rows; one store."""
    acc = _add_bias(acc, bias_ptr, cols, C, s_bias, HAS_BIAS)
    # Padding classes (wrapped, finite values, or TMA's zeros) are -inf: no weight in the max or
    # the sum.
    s = tl.where((cols < C)[None, :], acc, NEG_INF)
    p = tl.exp(s - tl.max(s, 1)[:, None])
    p = p * (1.0 / tl.sum(p, 1))[:, None]
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * s_ob + cols[None, :],
             p.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < B) & (cols[None, :] < C))


@triton.jit
def _ms_tiled_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, B, C, K, s_xb, s_xk, s_wk, s_wc, s_bias,
                     s_ob, HAS_BIAS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_C: tl.constexpr,
                     BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                     UPCAST: tl.constexpr):
    acc, rows, cols = _mm_tile(x_ptr, w_ptr, tl.program_id(0), 0, B, C, K, s_xb, s_xk, s_wk, s_wc,
                               BLOCK_B, BLOCK_C, BLOCK_K, EVEN_K, INPUT_PRECISION, UPCAST)
    _tiled_epilogue(acc, rows, cols, bias_ptr, out_ptr, B, C, s_bias, s_ob, HAS_BIAS)


@triton.jit
def _ms_tiled_tma_kernel(a_desc, b_desc, bias_ptr, out_ptr, B, C, K, s_bias, s_ob,
                         HAS_BIAS: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr,
                         BLOCK_B: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
                         INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """_ms_tiled_kernel on Hopper's TMA, persistent over the row blocks."""
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tl.cdiv(B, BLOCK_B), tl.num_programs(0)):
        acc = tma_tile(a_desc, b_desc, tile * BLOCK_B, 0, k_tiles, A_T, B_T, BLOCK_B, BLOCK_C,
                       BLOCK_K, INPUT_PRECISION, UPCAST)
        _tiled_epilogue(acc, tile * BLOCK_B + tl.arange(0, BLOCK_B), tl.arange(0, BLOCK_C),
                        bias_ptr, out_ptr, B, C, s_bias, s_ob, HAS_BIAS)


@triton.jit
def _stats_epilogue(acc, rows, cols, pid_c, bias_ptr, out_ptr, m_part, l_part, B, C, s_bias,
                    s_ob, n_tiles, HAS_BIAS: tl.constexpr, STORE_LOGITS: tl.constexpr):
    """Pass 1's epilogue on a logits tile: the bias; with STORE_LOGITS the logits stored in out;
    per row the tile's max and sum of exp."""
    acc = _add_bias(acc, bias_ptr, cols, C, s_bias, HAS_BIAS)
    row_ok = rows < B
    col_ok = cols < C
    if STORE_LOGITS:
        logits = acc.to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * s_ob + cols[None, :], logits,
                 mask=row_ok[:, None] & col_ok[None, :])
        # The partials describe the rounded logits that pass 2 reads, so each row sums to 1.
        acc = logits.to(tl.float32)
    s = tl.where(col_ok[None, :], acc, NEG_INF)
    m = tl.max(s, 1)
    # -inf where every class of the tile is -inf (a -inf bias masking them, or float16 logits
    # rounded to -inf): shift by 0 there, so l = 0 instead of NaN from -inf - -inf.
    l = tl.sum(tl.exp(s - tl.where(m == NEG_INF, 0.0, m)[:, None]), 1)
    part = rows.to(tl.int64) * n_tiles + pid_c
    tl.store(m_part + part, m, mask=row_ok)
    tl.store(l_part + part, l, mask=row_ok)


@triton.jit
def _ms_stats_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, m_part, l_part, B, C, K, s_xb, s_xk, s_wk,
                     s_wc, s_bias, s_ob, n_tiles, HAS_BIAS: tl.constexpr,
                     STORE_LOGITS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_C: tl.constexpr,
                     BLOCK_K: tl.constexpr, GROUP_B: tl.constexpr, EVEN_K: tl.constexpr,
                     INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Pass 1 of "online" and "two_pass_store": per (row, C tile) max and sum of exp."""
    pid_b, pid_c = _grouped(tl.program_id(0), B, C, BLOCK_B, BLOCK_C, GROUP_B)
    acc, rows, cols = _mm_tile(x_ptr, w_ptr, pid_b, pid_c, B, C, K, s_xb, s_xk, s_wk, s_wc,
                               BLOCK_B, BLOCK_C, BLOCK_K, EVEN_K, INPUT_PRECISION, UPCAST)
    _stats_epilogue(acc, rows, cols, pid_c, bias_ptr, out_ptr, m_part, l_part, B, C, s_bias, s_ob,
                    n_tiles, HAS_BIAS, STORE_LOGITS)


@triton.jit
def _ms_combine_kernel(m_part, l_part, m_ptr, il_ptr, B, n_tiles, BLOCK_R: tl.constexpr,
                       BLOCK_T: tl.constexpr):
    """Per row: m = max of the tiles' maxima, 1/l with l = sum(l_t * exp(m_t - m))."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < B
    offs_t = tl.arange(0, BLOCK_T)
    m = tl.full([BLOCK_R], NEG_INF, tl.float32)
    l = tl.zeros([BLOCK_R], tl.float32)
    for start in tl.range(0, n_tiles, BLOCK_T):
        ts = start + offs_t
        ok = row_ok[:, None] & (ts < n_tiles)[None, :]
        idx = rows.to(tl.int64)[:, None] * n_tiles + ts[None, :]
        mt = tl.load(m_part + idx, mask=ok, other=NEG_INF)
        lt = tl.load(l_part + idx, mask=ok, other=0.0)
        m_new = tl.maximum(m, tl.max(mt, 1))
        # Rows past B see only -inf: shift by 0 there (no NaN from -inf - -inf).
        shift = tl.where(m_new == NEG_INF, 0.0, m_new)
        l = l * tl.exp(m - shift) + tl.sum(lt * tl.exp(mt - shift[:, None]), 1)
        m = m_new
    tl.store(m_ptr + rows, m, mask=row_ok)
    tl.store(il_ptr + rows, 1.0 / tl.where(row_ok, l, 1.0), mask=row_ok)


@triton.jit
def _probs_epilogue(acc, rows, cols, bias_ptr, out_ptr, m_ptr, il_ptr, B, C, s_bias, s_ob,
                    HAS_BIAS: tl.constexpr):
    """Pass 2's epilogue of "online" on a recomputed logits tile: exp(s - m) / l stored."""
    acc = _add_bias(acc, bias_ptr, cols, C, s_bias, HAS_BIAS)
    row_ok = rows < B
    m = tl.load(m_ptr + rows, mask=row_ok, other=0.0)
    il = tl.load(il_ptr + rows, mask=row_ok, other=0.0)
    p = tl.exp(acc - m[:, None]) * il[:, None]
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * s_ob + cols[None, :],
             p.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & (cols < C)[None, :])


@triton.jit
def _ms_probs_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, m_ptr, il_ptr, B, C, K, s_xb, s_xk, s_wk,
                     s_wc, s_bias, s_ob, HAS_BIAS: tl.constexpr, BLOCK_B: tl.constexpr,
                     BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_B: tl.constexpr,
                     EVEN_K: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Pass 2 of "online": recompute the logits tile, write exp(s - m) / l."""
    pid_b, pid_c = _grouped(tl.program_id(0), B, C, BLOCK_B, BLOCK_C, GROUP_B)
    acc, rows, cols = _mm_tile(x_ptr, w_ptr, pid_b, pid_c, B, C, K, s_xb, s_xk, s_wk, s_wc,
                               BLOCK_B, BLOCK_C, BLOCK_K, EVEN_K, INPUT_PRECISION, UPCAST)
    _probs_epilogue(acc, rows, cols, bias_ptr, out_ptr, m_ptr, il_ptr, B, C, s_bias, s_ob,
                    HAS_BIAS)


@triton.jit
def _ms_pass_tma_kernel(a_desc, b_desc, bias_ptr, out_ptr, m_ptr, l_ptr, B, C, K, s_bias, s_ob,
                        n_tiles, HAS_BIAS: tl.constexpr, PROBS: tl.constexpr,
                        STORE_LOGITS: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr,
                        BLOCK_B: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_B: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                        UPCAST: tl.constexpr):
    """Pass 1 (_ms_stats_kernel: m_ptr, l_ptr the partials) or, with PROBS, pass 2 of "online"
    (_ms_probs_kernel: m_ptr, l_ptr each row's m and 1/l) on Hopper's TMA, persistent (as
    _matmul._matmul_tma_kernel)."""
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tl.cdiv(B, BLOCK_B) * n_tiles, tl.num_programs(0)):
        pid_b, pid_c = _grouped(tile, B, C, BLOCK_B, BLOCK_C, GROUP_B)
        acc = tma_tile(a_desc, b_desc, pid_b * BLOCK_B, pid_c * BLOCK_C, k_tiles, A_T, B_T,
                       BLOCK_B, BLOCK_C, BLOCK_K, INPUT_PRECISION, UPCAST)
        rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
        cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        if PROBS:
            _probs_epilogue(acc, rows, cols, bias_ptr, out_ptr, m_ptr, l_ptr, B, C, s_bias, s_ob,
                            HAS_BIAS)
        else:
            _stats_epilogue(acc, rows, cols, pid_c, bias_ptr, out_ptr, m_ptr, l_ptr, B, C, s_bias,
                            s_ob, n_tiles, HAS_BIAS, STORE_LOGITS)


@triton.jit
def _ms_split_kernel(x_ptr, w_ptr, part_ptr, B, C, K, k_split, s_xb, s_xk, s_wk, s_wc,
                     BLOCK_B: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_B: tl.constexpr, EVEN_K: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                     UPCAST: tl.constexpr):
    """Pass 1 of "split_k": the float32 logits tile of K slice program_id(1) (k_split long, a
    multiple of BLOCK_K; the last one shorter) into part[split] (splits, B, C)."""
    pid_b, pid_c = _grouped(tl.program_id(0), B, C, BLOCK_B, BLOCK_C, GROUP_B)
    split = tl.program_id(1).to(tl.int64)
    k0 = split * k_split
    acc, rows, cols = _mm_tile(x_ptr + k0 * s_xk, w_ptr + k0 * s_wk, pid_b, pid_c, B, C,
                               tl.minimum(k_split, K - k0), s_xb, s_xk, s_wk, s_wc, BLOCK_B,
                               BLOCK_C, BLOCK_K, EVEN_K, INPUT_PRECISION, UPCAST)
    rows64 = rows.to(tl.int64)
    tl.store(part_ptr + (split * B + rows64)[:, None] * C + cols[None, :], acc,
             mask=(rows < B)[:, None] & (cols < C)[None, :])


@triton.jit
def _ms_split_softmax_kernel(part_ptr, bias_ptr, out_ptr, B, C, n_splits, s_bias, s_ob,
                             HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pass 2 of "split_k", one program per row: logits = the splits' sum + bias, then the row's
    softmax (online max and sum over BLOCK_N chunks, then exp(s - m) / l written)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    m = tl.full([BLOCK_N], NEG_INF, tl.float32)
    l = tl.zeros([BLOCK_N], tl.float32)
    for start in tl.range(0, C, BLOCK_N):
        cols = start + offs
        m, l = online_step(m, l, _split_logits(part_ptr, bias_ptr, row, cols, B, C, n_splits,
                                               s_bias, HAS_BIAS, BLOCK_N))
    m_row, il = online_finish(m, l)
    for start in tl.range(0, C, BLOCK_N):
        cols = start + offs
        s = _split_logits(part_ptr, bias_ptr, row, cols, B, C, n_splits, s_bias, HAS_BIAS, BLOCK_N)
        tl.store(out_ptr + row * s_ob + cols, (tl.exp(s - m_row) * il).to(out_ptr.dtype.element_ty),
                 mask=cols < C)


@triton.jit
def _split_logits(part_ptr, bias_ptr, row, cols, B, C, n_splits, s_bias, HAS_BIAS: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """One row's logits at cols (-inf past C): the sum of its split partials, plus the bias."""
    ok = cols < C
    s = tl.zeros([BLOCK_N], tl.float32)
    ptrs = part_ptr + row * C + cols
    plane = (row * 0 + B) * C  # one split's B * C elements, in int64 as row is
    for _ in tl.range(0, n_splits):
        s += tl.load(ptrs, mask=ok, other=0.0)
        ptrs += plane
    if HAS_BIAS:
        s += tl.load(bias_ptr + cols * s_bias, mask=ok, other=0.0).to(tl.float32)
    return tl.where(ok, s, NEG_INF)


@triton.jit
def _ms_normalize_kernel(p_ptr, m_ptr, il_ptr, B, C, s_pb, BLOCK_R: tl.constexpr,
                         BLOCK_N: tl.constexpr):
    """Pass 2 of "two_pass_store": logits -> probs in place, exp(s - m) / l."""
    n_col = tl.cdiv(C, BLOCK_N)
    # Last tile first: pass 1 wrote the last row blocks last, the likeliest still in L2.
    t = tl.num_programs(0) - 1 - tl.program_id(0)
    rows = (t // n_col) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = (t % n_col) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < B
    mask = row_ok[:, None] & (cols < C)[None, :]
    ptrs = p_ptr + rows.to(tl.int64)[:, None] * s_pb + cols[None, :]
    s = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + rows, mask=row_ok, other=0.0)
    il = tl.load(il_ptr + rows, mask=row_ok, other=0.0)
    tl.store(ptrs, (tl.exp(s - m[:, None]) * il[:, None]).to(p_ptr.dtype.element_ty), mask=mask)
