"""Softmax regression, `matmul_softmax(x, weight, bias)` = softmax(x @ weight + bias, -1): x (B, K),
weight (K, C), bias (C,). Unfused, the (B, C) logits are written by the matmul (the bias in its
epilogue, as cuBLAS's addmm does) and read back by a softmax kernel; fused, only the probabilities
are written. The matmul is kernels.matmul_core's.
matmul_softmax's fused methods (`METHODS`; `method=None` picks, see `matmul_softmax_plan`):

- "simple": one program per row, all C logits of the row in registers, the product as broadcast
  multiply + tl.sum over K chunks (no tl.dot, no tensor cores). For C <= 1024; the seed's kernel.
- "tiled": a (block_b, all C) tile per program, tl.dot over K, bias + row softmax in registers, one
  store. Reads x once, writes probs once: the traffic floor. For C <= 512 (the tile must fit).
- "online": for large C, a 2-D grid of (row block, C tile) programs and no logits in memory.
  Pass 1 computes each logits tile and stores only its per-row (max, sum of exp) partials; a tiny
  kernel combines a row's partials into (m, 1/l); pass 2 recomputes each logits tile and writes
  exp(s - m) / l. 2x the matmul FLOPs (2BCK extra), no (B, C) intermediate.
- "two_pass_store": pass 1 is the same matmul but also stores the logits, in the output buffer in
  the output dtype; pass 2 is a light elementwise kernel that rewrites that buffer in place as
  probs. One matmul; the logits cost one extra write and read (2BC elements) but no separate
  max/sum reduction pass (the partials come from the matmul's epilogue).
- "store_softmax": for C up to STORE_SOFTMAX_MAX_C, pass 1 is kernels.matmul_core's matmul (the
  bias in its epilogue, its own tiles) writing the logits into the output buffer; pass 2 the row
  softmax (kernels.stored_softmax) rewrites it in place, each row read once. The same traffic as
  "two_pass_store" and as the unfused pair (whose logits buffer it saves), without computing
  the row partials in the matmul's epilogue: on Hopper that epilogue runs while the tensor cores
  idle (no warp specialisation in Triton 3.6), and the unfused pair was 4-91% faster than
  "two_pass_store" wherever a row fits the softmax's one tile (C = 1000 to 4096, H100,
  docs/matmul_softmax.md). Wider rows would be read twice by the softmax: there "two_pass_store"'s
  partials pay (0.96x of the unfused pair at C = 32000 and 128256).
- "split_k": for few rows and a long K, where the other methods leave most SMs idle (a grid of a
  handful of row blocks): pass 1 splits K across programs, each storing its float32 partial
  logits tile; pass 2, one program per row, sums the splits, adds the bias and writes the
  softmax. The partials cost splits * B * C * 4 bytes of memory and traffic; `method=None`
  takes it for few rows and a long K (`SPLIT_K_MIN_K`).

Recompute vs store: "online" pays 2BCK FLOPs, "two_pass_store" pays 2BC*e bytes (e bytes an
element); recomputing wins while K / peak_flops < e / bandwidth, i.e. K below ~2*665/3.0 ~ 440 for
fp16 on an H100 (less for IEEE float32, whose FMA peak is ~10x lower). `ONLINE_MAX_K` holds the
thresholds that `method=None` uses.

Precision: float32 inputs take `input_precision="ieee"` by default, matching PyTorch's default
(torch.backends.cuda.matmul.allow_tf32=False; the caller controls that flag for the reference),
"tf32" on request. float16/bfloat16 dots run in that dtype with float32 accumulation. The softmax
runs in float32; outputs are in the input dtype.

Tile sizes come from deterministic heuristics (no autotuning), overridable by keyword.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._common import (INTERPRETER_SM_COUNT, cached, cdiv, check_pow2, descriptor, empty, has_tma,
                      launch, layout_key, plan_cache, plan_strides, sm_count_of)
from ._common import upcast_bf16 as _upcast_bf16
from .stored_softmax import online_finish, online_step, softmax_rows
from .matmul_core import (GROUP, NEG_INF, PRECISIONS, _add_bias, _check_operands, _gemm, _grouped,
                          _launch_opts, _mm_tile, _precision, _precision_class, _pow2, gemm_launch,
                          k_major, operand_strides, run_gemm, tf32_copies, tma_specs, tma_tile)

SIMPLE, TILED, ONLINE, TWO_PASS_STORE, STORE_SOFTMAX, SPLIT_K = (
    "simple", "tiled", "online", "two_pass_store", "store_softmax", "split_k")
METHODS = (SIMPLE, TILED, ONLINE, TWO_PASS_STORE, STORE_SOFTMAX, SPLIT_K)

# Largest class tile each single-tile method accepts (after padding C to a power of two).
MAX_SIMPLE_C = 1024
MAX_TILED_C = 512
# method=None recomputes the logits ("online") up to this K, else stores them (module docstring).
# Half precision: "two_pass_store" won at K = 256 (2048 x 256 x 1000: 30 against 42 us device).
ONLINE_MAX_K = {"half": 128, "tf32": 256, "ieee": 64}
# method=None stores the logits with "store_softmax" up to this C (the softmax's one-tile width:
# each row read once), with "two_pass_store" above it.
STORE_SOFTMAX_MAX_C = 16384
# method=None takes "simple" up to this many multiply-adds (B * K * C): one launch, no tensor-core
# staging and no operand copy. Measured on the H100 (sweep of 2026-11-25, per call): simple beat
# tiled at 64x128x10 and 256x512x50 in every precision (e.g. fp16 10.9 against 44.5 us, tf32 4.8
# against 58.5), tiled won from 1024x1024x100 (fp16 57.5 against 123.6) and at 65536x128x10.
SIMPLE_MAX_WORK = 1 << 24
# method=None takes "split_k" from this K when the method it would take fills fewer than half the
# SMs with programs. Measured on the H100 (2026-11-25, device us): 512x4096x200 fp16 23.6 against
# tiled's 192; 1024x1024x100 fp16 18.6 against 33.0, IEEE 18.5 against 29.6, TF32 17.4 against
# 21.7; at K = 256 (2048x256x1000 fp16) a tie with two_pass_store (28.7 against 29.7).
SPLIT_K_MIN_K = 1024
SPLIT_K_MIN_SLICES = 4


def matmul_softmax_reference(x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """The semantics, in PyTorch eager (matmul, bias add and softmax: three kernels).

    float32 inputs follow torch.backends.cuda.matmul.allow_tf32, which the caller controls
    (False, IEEE, is PyTorch's default).
    """
    logits = x @ weight
    if bias is not None:
        logits = logits + bias
    return torch.softmax(logits, -1)


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
    matmul_core._matmul_tma_kernel)."""
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


# ------------------------------------------------------------------------------------------------
# matmul + softmax


class MatmulSoftmaxPlan(NamedTuple):
    """How matmul_softmax_fused runs a shape: the method and its launch parameters."""

    method: str
    precision: str
    block_b: int
    block_c: int
    block_k: int
    num_warps: int
    num_stages: int
    splits: int = 1  # "split_k": K slices (each a multiple of block_k)


def matmul_softmax_plan(B, K, C, dtype, *, method=None, input_precision=None, block_b=None,
                        block_c=None, block_k=None, num_warps=None, num_stages=None,
                        sm_count=INTERPRETER_SM_COUNT) -> MatmulSoftmaxPlan:
    """The method and tiles matmul_softmax_fused uses (defaults filled in, overrides checked).

    method=None: "simple" for small problems (B * K * C <= SIMPLE_MAX_WORK, C <= MAX_SIMPLE_C), else
    "tiled" when C fits one tile (C <= MAX_TILED_C), else "online" when K is small
    enough that recomputing the matmul is cheaper than storing the logits (ONLINE_MAX_K), else
    "store_softmax" up to STORE_SOFTMAX_MAX_C classes and "two_pass_store" above; then "split_k"
    instead when K >= SPLIT_K_MIN_K, that method's grid fills
    fewer than half of sm_count SMs and split_k's plan takes at least SPLIT_K_MIN_SLICES K
    slices. Explicit tiles or launch options keep the first choice; an explicit block_c asks for
    one of the multi-tile methods (split_k only by name).
    """
    if input_precision is None:
        input_precision = "ieee"
    if input_precision not in PRECISIONS:
        raise ValueError(f"input_precision must be one of {PRECISIONS}, got {input_precision!r}")
    precision = input_precision if dtype == torch.float32 else "tf32"
    half = dtype != torch.float32
    c_pow2 = _pow2(C, 16, 1 << 30)
    if method is None:
        if (block_b is None and block_c is None and c_pow2 <= MAX_SIMPLE_C
                and B * K * C <= SIMPLE_MAX_WORK):
            method = SIMPLE
        elif block_c is None and c_pow2 <= MAX_TILED_C:
            method = TILED
        elif K <= ONLINE_MAX_K[_precision_class(dtype, precision)]:
            method = ONLINE
        elif C <= STORE_SOFTMAX_MAX_C:
            method = STORE_SOFTMAX
        else:
            method = TWO_PASS_STORE
        overrides = (block_b, block_c, block_k, num_warps, num_stages)
        if method != SIMPLE and K >= SPLIT_K_MIN_K and all(o is None for o in overrides):
            plan = matmul_softmax_plan(B, K, C, dtype, method=method,
                                       input_precision=input_precision, sm_count=sm_count)
            if cdiv(B, plan.block_b) * cdiv(C, plan.block_c) >= sm_count // 2:
                return plan
            split = matmul_softmax_plan(B, K, C, dtype, method=SPLIT_K,
                                        input_precision=input_precision, sm_count=sm_count)
            # Measured wins had 4-16 K slices; with fewer (many rows or classes) the partials'
            # round trip is not known to pay.
            return split if split.splits >= SPLIT_K_MIN_SLICES else plan
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS} or None, got {method!r}")
    if method == STORE_SOFTMAX and any(o is not None for o in (block_b, block_c, block_k,
                                                                num_warps, num_stages)):
        raise ValueError("method 'store_softmax' runs kernels.matmul_core's matmul with that "
                         "module's own tiles and launch options: block_b, block_c, block_k, "
                         "num_warps and num_stages do not apply")
    stages = 3
    if method == SIMPLE:
        if c_pow2 > MAX_SIMPLE_C:
            raise ValueError(f"method 'simple' keeps a whole row of logits in registers: C={C} "
                             f"(padded {c_pow2}) exceeds {MAX_SIMPLE_C}; use 'tiled', 'online' "
                             f"or 'two_pass_store'")
        bc = c_pow2
        # A (BLOCK_K, BLOCK_C) product of at most 8192 elements per step.
        bb, bk = 1, _pow2(K, 8, max(8, 8192 // bc))
        warps, stages = (4 if bc <= 256 else 8), 1
    elif method == TILED:
        if c_pow2 > MAX_TILED_C:
            raise ValueError(f"method 'tiled' keeps all C logits of a row block in registers: "
                             f"C={C} (padded {c_pow2}) exceeds {MAX_TILED_C}; use 'online' or "
                             f"'two_pass_store'")
        bc = c_pow2
        # 32768 float32 accumulators per program (the 128x256 of the tutorial's 8-warp config).
        bb = _pow2(B, 16, max(16, min(128, 32768 // bc)))
        # One program per row block: with few rows, smaller blocks so the grid covers more SMs.
        # Measured on the H100 (docs/matmul_softmax.md): float32 down to 16 rows (1024 x 1024 x
        # 100: 114 -> 41 us); half precision down to 32 rows with 8 warps, for up to 128 classes
        # (59 -> 34 us there; 4 warps: 67). At 256 classes the sweep measured 32 rows slower (512
        # x 4096 x 200: 411 against 195 us), so wider tiles keep their rows.
        full_rows = bb
        while cdiv(B, bb) < sm_count and bb > (32 if half else 16) and (not half or bc <= 128):
            bb //= 2
        wide = bc >= 512 if half else bc >= 256
        bk = _pow2(K, 16, (32 if wide else 64) if half else (16 if wide else 32))
        warps = 8 if (half and bb < full_rows) or bb * bc >= 16384 else 4
    elif method == SPLIT_K:
        bb, bc, bk = (64, 128, 64) if half else (64, 128 if precision == "tf32" else 64, 32)
        bb, bc, bk = _pow2(B, 16, bb), _pow2(C, 16, bc), _pow2(K, 16, bk)
        warps = 8 if bb * bc >= 16384 else 4
    else:  # online, two_pass_store; for store_softmax only what the split_k choice compares
        if half:
            bb, bc, bk = 128, 256, 64
        elif precision == "tf32":
            bb, bc, bk = 128, 128, 32
        else:
            bb, bc, bk = 64, 128, 32
        bb, bc, bk = _pow2(B, 16, bb), _pow2(C, 16, bc), _pow2(K, 16, bk)
        warps = 8 if bb * bc >= 16384 else 4
    if block_b is not None:
        if method == SIMPLE:
            raise ValueError("method 'simple' runs one row per program: block_b does not apply")
        bb = check_pow2("block_b", block_b)
    if block_c is not None:
        if method in (SIMPLE, TILED):
            raise ValueError(f"method {method!r} covers all C in one tile: block_c does not apply")
        bc = check_pow2("block_c", block_c)
    if block_k is not None:
        bk = check_pow2("block_k", block_k, lo=8 if method == SIMPLE else 16)
    warps, stages = _launch_opts(warps if num_warps is None else num_warps,
                                 stages if num_stages is None else num_stages)
    splits = 1
    if method == SPLIT_K:
        # About two programs per SM, each with at least 4 K tiles.
        k_tiles = cdiv(K, bk)
        want = min(cdiv(2 * sm_count, max(1, cdiv(B, bb) * cdiv(C, bc))), max(1, k_tiles // 4))
        splits = cdiv(k_tiles, cdiv(k_tiles, want)) if k_tiles else 1  # no empty slice
    return MatmulSoftmaxPlan(method, precision, bb, bc, bk, warps, stages, splits)


def _aligned_rows(weight: torch.Tensor, B: int) -> torch.Tensor:
    """weight with 16-byte-aligned rows: a (K, C) weight whose row pitch is not a multiple of 16
    bytes (C = 10, 50, 100 in half precision) cannot be read with vector loads. With many rows of x
    to amortise it, copy it once into a zero-padded (K, C rounded up) buffer and use a view."""
    pitch = weight.stride(0) * weight.element_size()
    if weight.stride(1) != 1 or pitch % 16 == 0 or B < 4096:
        return weight
    per_row = 16 // weight.element_size()
    padded = torch.zeros(weight.shape[0], cdiv(weight.shape[1], per_row) * per_row,
                         dtype=weight.dtype, device=weight.device)
    padded[:, :weight.shape[1]] = weight
    return padded[:, :weight.shape[1]]


class _FusedLaunch(NamedTuple):
    """How matmul_softmax_fused runs one layout (cached): the plan, whether weight is copied into
    16-byte-aligned rows first (_aligned_rows), the strides the kernels take (x's, the weight's
    they read, bias's, out's row), their dot constexprs and options, and which operands are
    copied K-contiguous first (matmul_core.tf32_copies)."""

    plan: MatmulSoftmaxPlan
    pad_weight: bool
    strides: tuple
    dot_args: dict
    options: dict
    copies: tuple
    # The multi-tile methods on Hopper's TMA: (descriptor specs of x and the weight, A_T, B_T) as
    # matmul_core.tma_specs gives them, where the layouts allow it; the call still takes the
    # pointer kernels if its tensors are not 16-byte aligned.
    tma: tuple | None = None
    # store_softmax: matmul_core's launch of the logits' matmul into the output.
    gemm: object = None


def _fused_launch(x, weight, bias, method, block_b, block_c, block_k, input_precision, num_warps,
                  num_stages) -> _FusedLaunch:
    _check_operands(x, weight, bias)
    B, K = x.shape
    C = weight.shape[1]
    plan = matmul_softmax_plan(B, K, C, x.dtype, method=method, input_precision=input_precision,
                               block_b=block_b, block_c=block_c, block_k=block_k,
                               num_warps=num_warps, num_stages=num_stages,
                               sm_count=sm_count_of(x.device))
    # The simple method's products are not tensor-core dots: nothing to copy for it. The matmul
    # of store_softmax makes its own copies: the weight is padded only where it reads it as is.
    copies = ((False, False) if plan.method in (SIMPLE, STORE_SOFTMAX)
              else tf32_copies(x, weight, plan.precision))
    copied = copies[1] or (plan.method == STORE_SOFTMAX
                           and tf32_copies(x, weight, plan.precision)[1])
    aligned = weight if copied else _aligned_rows(weight, B)
    strides = (*operand_strides(x, aligned, copies),
               plan_strides(bias)[0] if bias is not None else 0, C)  # out: a new contiguous (B, C)
    tma = None
    tiles = cdiv(B, plan.block_b) * cdiv(C, plan.block_c)
    # As matmul_core.gemm_launch: TMA where the grid holds at least one tile per SM. "tiled" only
    # from K = 256 and up to 128 classes: measured on the H100 (fp16, 65536 rows;
    # docs/matmul_softmax.md) TMA took 63 against 88 us at K 512, C 50 and 93 against 234 at
    # K 1024, C 100, but 48 against 33 at K 128, C 10 (two K tiles: nothing to pipeline) and 68
    # against 61 at K 512, C 256.
    if (plan.method not in (SIMPLE, SPLIT_K, STORE_SOFTMAX) and plan.precision != "ieee"
            and tiles >= sm_count_of(x.device)
            and (plan.method != TILED or (plan.block_c <= 128 and K >= 256))
            and has_tma(x.device)):
        specs, a_t, b_t = tma_specs(x, aligned, strides[:4], None,
                                    (plan.block_b, plan.block_c, plan.block_k))
        tma = None if specs is None else (specs, a_t, b_t)
    gemm = None
    if plan.method == STORE_SOFTMAX:
        gemm = gemm_launch(x, aligned, bias, (C, 1), "none", plan.precision, None, None, None,
                           None, None, None)
    return _FusedLaunch(plan, aligned is not weight, strides,
                        dict(INPUT_PRECISION=plan.precision, UPCAST=_upcast_bf16(x.dtype),
                             EVEN_K=K % plan.block_k == 0),
                        dict(num_warps=plan.num_warps, num_stages=plan.num_stages), copies, tma,
                        gemm)


_PLANS = plan_cache()


def matmul_softmax_fused(x, weight, bias=None, *, method=None, block_b=None, block_c=None,
                         block_k=None, input_precision=None, num_warps=None,
                         num_stages=None) -> torch.Tensor:
    """softmax(x @ weight + bias, -1) with the logits never stored as a separate intermediate
    (for "two_pass_store" and "store_softmax", stored once in the output buffer and rewritten in
    place).

    x (B, K), weight (K, C), bias (C,) or None, any strides; output (B, C) in x's dtype. The
    methods and the plan are described in the module docstring and `matmul_softmax_plan`. The
    checks and the plan are remembered per layout of x, weight, bias.
    """
    options = (method, block_b, block_c, block_k, input_precision, num_warps, num_stages)
    how = cached(_PLANS, layout_key((x, weight, bias), options), _fused_launch, x, weight, bias,
                 *options)
    plan, strides, dot_args, options = how.plan, how.strides, how.dot_args, how.options
    B, K = x.shape
    C = weight.shape[1]
    x, weight = k_major(x, weight, how.copies)
    if how.pad_weight:
        weight = _aligned_rows(weight, B)
    out = empty((B, C), x.dtype, x.device)
    if plan.method == STORE_SOFTMAX:
        run_gemm(x, weight, bias, out, how.gemm)
        return out if B == 0 or C == 0 else softmax_rows(out, out, max_block=STORE_SOFTMAX_MAX_C)
    if B == 0 or C == 0:
        return out
    has_bias = bias is not None
    bias_arg = bias if has_bias else x
    if plan.method == SIMPLE:
        launch(_ms_simple_kernel, (B,), x, weight, bias_arg, out, C, K, *strides, HAS_BIAS=has_bias,
               BLOCK_C=plan.block_c, BLOCK_K=plan.block_k, num_warps=plan.num_warps)
        return out
    if plan.method == SPLIT_K:
        k_split = cdiv(cdiv(K, plan.block_k), plan.splits) * plan.block_k
        n_splits = cdiv(K, k_split) if K else 1
        part = empty((n_splits, B, C), torch.float32, x.device)
        if K == 0:
            part.zero_()
        else:
            launch(_ms_split_kernel, (cdiv(B, plan.block_b) * cdiv(C, plan.block_c), n_splits),
                   x, weight, part, B, C, K, k_split, *strides[:4], BLOCK_B=plan.block_b,
                   BLOCK_C=plan.block_c, BLOCK_K=plan.block_k, GROUP_B=GROUP, **dot_args,
                   **options)
        block_n = _pow2(C, 16, 4096)
        launch(_ms_split_softmax_kernel, (B,), part, bias_arg, out, B, C, n_splits, strides[4],
               strides[5], HAS_BIAS=has_bias, BLOCK_N=block_n, num_warps=4 if block_n <= 1024 else 8)
        return out
    tma = how.tma
    if tma is not None and (x.data_ptr() | weight.data_ptr()) & 15:
        tma = None  # this call's bases are not 16-byte aligned: the pointer kernels
    if tma is not None:
        (a_spec, b_spec), a_t, b_t = tma
        descs = (descriptor(x, *a_spec), descriptor(weight, *b_spec))
        tma_grid = (sm_count_of(x.device),)
        tma_args = dict(A_T=a_t, B_T=b_t, INPUT_PRECISION=dot_args["INPUT_PRECISION"],
                        UPCAST=dot_args["UPCAST"], BLOCK_B=plan.block_b, BLOCK_C=plan.block_c,
                        BLOCK_K=plan.block_k, **options)
    if plan.method == TILED:
        if tma is not None:
            launch(_ms_tiled_tma_kernel, tma_grid, *descs, bias_arg, out, B, C, K, strides[4],
                   strides[5], HAS_BIAS=has_bias, **tma_args)
        else:
            launch(_ms_tiled_kernel, (cdiv(B, plan.block_b),), x, weight, bias_arg, out, B, C,
                   K, *strides, HAS_BIAS=has_bias, BLOCK_B=plan.block_b, BLOCK_C=plan.block_c,
                   BLOCK_K=plan.block_k, **dot_args, **options)
        return out
    # online / two_pass_store: per-(row, C tile) partials, combined per row.
    n_tiles = cdiv(C, plan.block_c)
    grid = (cdiv(B, plan.block_b) * n_tiles,)
    m_part = empty((B, n_tiles), torch.float32, x.device)
    l_part = empty((B, n_tiles), torch.float32, x.device)
    store = plan.method == TWO_PASS_STORE
    blocks = dict(BLOCK_B=plan.block_b, BLOCK_C=plan.block_c, BLOCK_K=plan.block_k, GROUP_B=GROUP)
    if tma is not None:
        launch(_ms_pass_tma_kernel, tma_grid, *descs, bias_arg, out, m_part, l_part, B, C, K,
               strides[4], strides[5], n_tiles, HAS_BIAS=has_bias, PROBS=False,
               STORE_LOGITS=store, GROUP_B=GROUP, **tma_args)
    else:
        launch(_ms_stats_kernel, grid, x, weight, bias_arg, out, m_part, l_part, B, C, K,
               *strides, n_tiles, HAS_BIAS=has_bias, STORE_LOGITS=store, **blocks, **dot_args,
               **options)
    m = empty((B,), torch.float32, x.device)
    inv_l = empty((B,), torch.float32, x.device)
    block_t = _pow2(n_tiles, 16, 128)
    launch(_ms_combine_kernel, (cdiv(B, 32),), m_part, l_part, m, inv_l, B, n_tiles,
           BLOCK_R=32, BLOCK_T=block_t, num_warps=4)
    if store:
        block_n = _pow2(C, 16, 1024)
        block_r = max(1, 8192 // block_n)
        launch(_ms_normalize_kernel, (cdiv(B, block_r) * cdiv(C, block_n),), out, m,
               inv_l, B, C, C, BLOCK_R=block_r, BLOCK_N=block_n, num_warps=8)
    elif tma is not None:
        launch(_ms_pass_tma_kernel, tma_grid, *descs, bias_arg, out, m, inv_l, B, C, K,
               strides[4], strides[5], n_tiles, HAS_BIAS=has_bias, PROBS=True,
               STORE_LOGITS=False, GROUP_B=GROUP, **tma_args)
    else:
        launch(_ms_probs_kernel, grid, x, weight, bias_arg, out, m, inv_l, B, C, K, *strides,
               HAS_BIAS=has_bias, **blocks, **dot_args, **options)
    return out


def matmul_softmax_unfused(x, weight, bias=None, *, input_precision=None, block_m=None,
                           block_n=None, block_k=None, group_m=None, num_warps=None,
                           num_stages=None, softmax_block=None) -> torch.Tensor:
    """Two Triton kernels: logits = x @ weight + bias (the bias in the matmul's epilogue), stored
    (B, C) in x's dtype; then a row softmax of them. The block/warp/stage options go to the matmul;
    softmax_block is the softmax's tile (default: the whole row up to 16384, else online tiles).
    """
    _check_operands(x, weight, bias)
    precision = _precision(x, input_precision, "ieee")
    if softmax_block is not None:
        check_pow2("softmax_block", softmax_block)  # before the matmul runs
    B, C = x.shape[0], weight.shape[1]
    logits = empty((B, C), x.dtype, x.device)
    out = empty((B, C), x.dtype, x.device)
    _gemm(x, weight, bias, logits, "none", precision, block_m, block_n, block_k, group_m,
          num_warps, num_stages)
    if B == 0 or C == 0:
        return out
    return softmax_rows(logits, out, block=softmax_block, max_block=16384)


IMPLS = {"reference": matmul_softmax_reference, "triton_unfused": matmul_softmax_unfused,
         "triton_fused": matmul_softmax_fused}
