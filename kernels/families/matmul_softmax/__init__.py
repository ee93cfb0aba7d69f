"""Softmax regression, `matmul_softmax(x, weight, bias)` = softmax(x @ weight + bias, -1): x (B, K),
weight (K, C), bias (C,). Unfused, the (B, C) logits are written by the matmul (the bias in its
epilogue, as cuBLAS's addmm does) and read back by a softmax kernel; fused, only the probabilities
are written. The matmul is kernels._matmul's.
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
- "store_softmax": for C up to STORE_SOFTMAX_MAX_C, pass 1 is kernels._matmul's matmul (the
  bias in its epilogue, its own tiles) writing the logits into the output buffer; pass 2 the row
  softmax (kernels._stored_softmax) rewrites it in place, each row read once. The same traffic as
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

from ..._buffers import empty
from ..._checks import check_pow2
from ..._device import has_tma, sm_count_of
from ..._tiles import cdiv
from ..._plans import cached, layout_key, plan_cache, plan_strides
from ..._launch import descriptor, launch
from ..._dot import upcast_bf16 as _upcast_bf16
from ..._stored_softmax import softmax_rows
from ..._matmul import (GROUP, _check_operands, _gemm, _precision, _pow2, gemm_launch, k_major,
                        operand_strides, run_gemm, tf32_copies, tma_specs)

from ..._autograd import LOWER, declare
from .kernels import (_ms_combine_kernel, _ms_normalize_kernel, _ms_pass_tma_kernel,
                      _ms_probs_kernel, _ms_simple_kernel, _ms_split_kernel,
                      _ms_split_softmax_kernel, _ms_stats_kernel, _ms_tiled_kernel,
                      _ms_tiled_tma_kernel)
from .plan import (METHODS, MatmulSoftmaxPlan, ONLINE, SIMPLE, SPLIT_K, STORE_SOFTMAX,
                   STORE_SOFTMAX_MAX_C, TILED, TWO_PASS_STORE, matmul_softmax_plan)

__all__ = ["METHODS", "MatmulSoftmaxPlan", "ONLINE", "SIMPLE", "SPLIT_K", "STORE_SOFTMAX", "TILED",
           "TWO_PASS_STORE", "matmul_softmax", "matmul_softmax_plan", "reference", "triton_fused",
           "triton_unfused"]

def reference(x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """The semantics, in PyTorch eager (matmul, bias add and softmax: three kernels).

    float32 inputs follow torch.backends.cuda.matmul.allow_tf32, which the caller controls
    (False, IEEE, is PyTorch's default).
    """
    logits = x @ weight
    if bias is not None:
        logits = logits + bias
    return torch.softmax(logits, -1)


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
    """How triton_fused runs one layout (cached): the plan, whether weight is copied into
    16-byte-aligned rows first (_aligned_rows), the strides the kernels take (x's, the weight's
    they read, bias's, out's row), their dot constexprs and options, and which operands are
    copied K-contiguous first (_matmul.tf32_copies)."""

    plan: MatmulSoftmaxPlan
    pad_weight: bool
    strides: tuple
    dot_args: dict
    options: dict
    copies: tuple
    # The multi-tile methods on Hopper's TMA: (descriptor specs of x and the weight, A_T, B_T) as
    # _matmul.tma_specs gives them, where the layouts allow it; the call still takes the
    # pointer kernels if its tensors are not 16-byte aligned.
    tma: tuple | None = None
    # store_softmax: _matmul's launch of the logits' matmul into the output.
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
    # As _matmul.gemm_launch: TMA where the grid holds at least one tile per SM. "tiled" only
    # from K = 256 (fewer K tiles leave nothing to pipeline) and up to 128 classes, where TMA
    # measured faster than pointer loads (docs/matmul_softmax.md).
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


def triton_fused(x, weight, bias=None, *, method=None, block_b=None, block_c=None, block_k=None,
                 input_precision=None, num_warps=None, num_stages=None) -> torch.Tensor:
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


def triton_unfused(x, weight, bias=None, *, input_precision=None, block_m=None, block_n=None,
                   block_k=None, group_m=None, num_warps=None, num_stages=None,
                   softmax_block=None) -> torch.Tensor:
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


IMPLS = {"reference": reference, "triton_unfused": triton_unfused, "triton_fused": triton_fused}


# ------------------------------------------------------------------------------------------------
# softmax(x @ weight + bias)


def _forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return triton_fused(x, weight, bias)


def _fake(x, weight, bias):
    _check_operands(x, weight, bias)
    return x.new_empty((x.shape[0], weight.shape[1]))


def _matmul_softmax_setup(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight, output)
    ctx.has_bias = bias is not None


def _matmul_softmax_backward(ctx, dy):
    """From the saved probabilities y: dz = y * (dy - rowsum(dy * y)); dx = dz W^T, dW = x^T dz,
    dbias = column sums of dz (float32 math, results in the inputs' dtypes)."""
    x, weight, y = ctx.saved_tensors
    yf = y.float()
    g = dy.float()
    dz = yf * (g - (g * yf).sum(-1, keepdim=True))
    dx = (dz @ weight.float().t()).to(x.dtype) if ctx.needs_input_grad[0] else None
    dw = (x.float().t() @ dz).to(weight.dtype) if ctx.needs_input_grad[1] else None
    db = dz.sum(0).to(x.dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return dx, dw, db


# Under autocast as torch.softmax(F.linear(x, weight.T, bias), -1): the matmul's inputs in
# autocast's dtype, the probabilities in the dtype softmax gives there (float32 on CUDA).
_MATMUL_SOFTMAX = declare("matmul_softmax", _forward, _fake, setup=_matmul_softmax_setup,
                          backward=_matmul_softmax_backward, direct=triton_fused,
                          autocast=LOWER, autocast_output={"cuda": torch.float32})


def matmul_softmax(x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """`softmax(x @ weight + bias, -1)` with the matmul and the softmax fused (see
    `plan.matmul_softmax_plan`); differentiable (backward in PyTorch ops).

    x (B, K), weight (K, C), bias (C,) or None; one dtype (float32, float16, bfloat16), on CUDA (or
    on the CPU under TRITON_INTERPRET=1). Returns (B, C) probabilities in x's dtype."""
    return _MATMUL_SOFTMAX(x, weight, bias)
