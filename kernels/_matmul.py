"""The matmul both epilogue families share (softmax regression, linear + activation): a grouped,
tiled Triton matmul whose epilogue can add a bias and apply an activation before its one store,
with the device pieces the fused kernels reuse, and the host-side checks and tile heuristics.

Precision: float32 inputs take "ieee" or "tf32" (`input_precision`; each family picks its default);
float16/bfloat16 dots run in that dtype with float32 accumulation. Tile sizes come from
deterministic heuristics (no autotuning), overridable by keyword.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._buffers import empty
from ._checks import check_pow2, check_same, check_tensor, check_warps
from ._device import INTERPRETER_SM_COUNT, has_tma, sm_count_of
from ._tiles import cdiv, next_pow2
from ._plans import plan_strides
from ._launch import descriptor, launch
from ._dot import dot as _dot
from ._dot import upcast_bf16 as _upcast_bf16

PRECISIONS = ("ieee", "tf32")
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh")
# Super-grouping of row blocks (Triton's matmul tutorial): programs that run together share
# weight tiles in L2.
GROUP = 8

NEG_INF = tl.constexpr(float("-inf"))

# ------------------------------------------------------------------------------------------------
# Shared device pieces




@triton.jit
def _grouped(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile (pid_m, pid_n) of program pid, GROUP_M row blocks at a time down each column block,
    so concurrently running programs reuse the same x rows and weight columns from L2."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m
    return pid_m, pid_n


@triton.jit
def _mm_tile(a_ptr, b_ptr, pid_m, pid_n, M, N, K, s_am, s_ak, s_bk, s_bn,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             EVEN_K: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """float32 tile a[rows] @ b[:, cols]; returns (acc, rows, cols), rows/cols not wrapped.

    As in Triton's matmul tutorial, rows and columns are wrapped modulo M and N so every load is in
    bounds and only K needs a mask; the wrapped rows/columns are masked by the caller.
    """
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_ld = tl.max_contiguous(tl.multiple_of(rows % M, BLOCK_M), BLOCK_M)
    cols_ld = tl.max_contiguous(tl.multiple_of(cols % N, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # int64 before the stride multiply: M * s_am can pass 2**31.
    a_ptrs = a_ptr + rows_ld.to(tl.int64)[:, None] * s_am + offs_k[None, :] * s_ak
    b_ptrs = b_ptr + offs_k[:, None] * s_bk + cols_ld.to(tl.int64)[None, :] * s_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_ok = offs_k < K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        acc = _dot(a, b, acc, INPUT_PRECISION, UPCAST)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk
    return acc, rows, cols


@triton.jit
def tma_tile(a_desc, b_desc, off_m, off_n, k_tiles, A_T: tl.constexpr, B_T: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """float32 tile a[off_m:, :] @ b[:, off_n:] read through host descriptors (see
    _matmul_tma_kernel for A_T, B_T); parts past the tensors' edges read as zeros."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(k_tiles):
        off_k = k * BLOCK_K
        if A_T:
            a = a_desc.load([off_k, off_m]).T
        else:
            a = a_desc.load([off_m, off_k])
        if B_T:
            b = b_desc.load([off_n, off_k]).T
        else:
            b = b_desc.load([off_k, off_n])
        acc = _dot(a, b, acc, INPUT_PRECISION, UPCAST)
    return acc


@triton.jit
def _add_bias(acc, bias_ptr, cols, N, s_bias, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        # Masked, not wrapped: a wrapped index would defeat the vectorisation hints of _mm_tile.
        bias = tl.load(bias_ptr + cols * s_bias, mask=cols < N, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
    return acc


@triton.jit
def _activate(h, ACTIVATION: tl.constexpr):
    """The activation on a float32 tile."""
    if ACTIVATION == "relu":
        h = tl.maximum(h, 0.0)
    elif ACTIVATION == "gelu":
        h = 0.5 * h * (1.0 + tl.erf(h * 0.7071067811865476))  # exact: x * Phi(x)
    elif ACTIVATION == "gelu_tanh":
        # 0.5 * (1 + tanh(u)) = sigmoid(2u), u = sqrt(2/pi) * (h + 0.044715 h^3)
        h = h * tl.sigmoid(1.5957691216057308 * (h + 0.044715 * h * h * h))
    return h


# ------------------------------------------------------------------------------------------------
# The matmul kernel: plain (unfused baselines) or with a bias + activation epilogue (linear_act)


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_bias,
                   s_cm, s_cn, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                   UPCAST: tl.constexpr):
    pid_m, pid_n = _grouped(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc, rows, cols = _mm_tile(a_ptr, b_ptr, pid_m, pid_n, M, N, K, s_am, s_ak, s_bk, s_bn,
                               BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INPUT_PRECISION, UPCAST)
    acc = _add_bias(acc, bias_ptr, cols, N, s_bias, HAS_BIAS)
    acc = _activate(acc, ACTIVATION)
    # One rounding to the output dtype, at the store.
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * s_cm + cols[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _matmul_tma_kernel(a_desc, b_desc, c_desc, bias_ptr, M, N, K, s_bias, HAS_BIAS: tl.constexpr,
                       ACTIVATION: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, SPLIT_STORE: tl.constexpr, FLATTEN: tl.constexpr,
                       INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """The same matmul and epilogue as _matmul_kernel on Hopper's TMA: persistent (one program
    per SM walks the tiles in _grouped order), tiles loaded through host tensor descriptors
    (out-of-bounds elements read as zeros, so no masks), the result stored through one. A_T: a's
    descriptor is over x transposed (K, M), an x whose K dim is contiguous; B_T: b's is over the
    weight transposed (N, K), nn.Linear's layout. SPLIT_STORE: the tile stored as two halves,
    which halves the shared memory the store stages through (Triton's persistent-matmul
    tutorial)."""
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)  # TMA reads past K as zeros: no mask on the last tile
    for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n = _grouped(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tma_tile(a_desc, b_desc, off_m, off_n, k_tiles, A_T, B_T, BLOCK_M, BLOCK_N,
                       BLOCK_K, INPUT_PRECISION, UPCAST)
        # One rounding to the output dtype, at the store; rows and columns past M, N are not
        # written (TMA clips them).
        if SPLIT_STORE:
            # The epilogue on one half at a time: over the whole 128 x 256 tile, erf's
            # temporaries pushed the kernel past 255 registers into spills (docs/linear_act.md).
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            half_cols = off_n + tl.arange(0, BLOCK_N // 2)
            left = _activate(_add_bias(left, bias_ptr, half_cols, N, s_bias, HAS_BIAS),
                             ACTIVATION)
            c_desc.store([off_m, off_n], left.to(c_desc.dtype))
            right = _activate(_add_bias(right, bias_ptr, half_cols + BLOCK_N // 2, N, s_bias,
                                        HAS_BIAS), ACTIVATION)
            c_desc.store([off_m, off_n + BLOCK_N // 2], right.to(c_desc.dtype))
        else:
            acc = _add_bias(acc, bias_ptr, off_n + tl.arange(0, BLOCK_N), N, s_bias, HAS_BIAS)
            acc = _activate(acc, ACTIVATION)
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


@triton.jit
def _activation_kernel(h_ptr, out_ptr, n, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr):
    """The unfused activation: out = act(h), flat and contiguous, math in float32."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    h = tl.load(h_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, _activate(h, ACTIVATION).to(out_ptr.dtype.element_ty), mask=mask)



# ------------------------------------------------------------------------------------------------
# Host side: checks and plans


def _check_operands(x, weight, bias, k_name="K", n_name="C"):
    check_tensor("x", x, ndim=2)
    check_tensor("weight", weight, ndim=2)
    check_same([("x", x), ("weight", weight)])
    if x.shape[1] != weight.shape[0]:
        raise ValueError(
            f"x is (rows, {k_name}) and weight is ({k_name}, {n_name}): x's {k_name}={x.shape[1]} "
            f"but weight has {weight.shape[0]} rows (got x {tuple(x.shape)}, weight "
            f"{tuple(weight.shape)}; an F.linear weight (out, in) must be passed transposed)"
        )
    if bias is not None:
        check_tensor("bias", bias, ndim=1)
        check_same([("x", x), ("bias", bias)])
        if bias.shape[0] != weight.shape[1]:
            raise ValueError(f"bias must have shape ({weight.shape[1]},) to match weight's "
                             f"{n_name}={weight.shape[1]}, got {tuple(bias.shape)}")


def _precision(x, input_precision, default):
    """The dot precision to compile with; only float32 operands have a choice."""
    if input_precision is None:
        input_precision = default
    if input_precision not in PRECISIONS:
        raise ValueError(f"input_precision must be one of {PRECISIONS}, got {input_precision!r}")
    return input_precision if x.dtype == torch.float32 else "tf32"


def _precision_class(dtype, precision):
    return precision if dtype == torch.float32 else "half"


def _pow2(n, lo, hi):
    """The power of two covering n, clamped to [lo, hi]."""
    return max(lo, min(hi, next_pow2(max(int(n), 1))))


def _launch_opts(num_warps, num_stages):
    if not isinstance(num_stages, int) or isinstance(num_stages, bool) or num_stages < 1:
        raise ValueError(f"num_stages must be a positive int, got {num_stages!r}")
    return check_warps(num_warps), num_stages


class GemmConfig(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


def gemm_config(M, N, K, dtype, precision, sm_count=INTERPRETER_SM_COUNT) -> GemmConfig:
    """Default tiles of the matmul kernel: the tutorial's H100 fp16 config (128x256x64, 8 warps,
    3 stages), half as deep for tf32 (twice the bytes an element: 128x256x32, faster than
    128x128x32; docs/linear_act.md), a 64x128 FMA tile for IEEE float32. Clamped to the problem,
    then halved while the grid would not fill the SMs."""
    if dtype != torch.float32:
        bm, bn, bk, warps = 128, 256, 64, 8
    elif precision == "tf32":
        bm, bn, bk, warps = 128, 256, 32, 8
    else:
        bm, bn, bk, warps = 64, 128, 32, 4
    bm, bn, bk = _pow2(M, 16, bm), _pow2(N, 16, bn), _pow2(K, 16, bk)
    while cdiv(M, bm) * cdiv(N, bn) < sm_count and max(bm, bn) > 64:
        if bn >= bm:
            bn //= 2
        else:
            bm //= 2
    if bm * bn <= 64 * 64:
        warps = 4
    return GemmConfig(bm, bn, bk, GROUP, warps, 3)


class GemmLaunch(NamedTuple):
    """How `run_gemm` launches _matmul_kernel for one layout (a caller may cache it): the grid
    (None: M or N is 0, nothing to launch), the sizes and strides it passes, and the kernel's
    constexprs and options."""

    grid: tuple | None
    sizes_strides: tuple  # M, N, K, x's, weight's, bias's and out's strides
    kwargs: dict
    # Copy x / weight to K-contiguous first (tf32: see gemm_launch); the strides are the copies'.
    copies: tuple = (False, False)
    # The persistent TMA kernel's launch where the device has TMA and the layouts allow it (run_gemm
    # still takes _matmul_kernel for a call whose tensors are not 16-byte aligned).
    tma: TmaLaunch | None = None


class TmaLaunch(NamedTuple):
    """How run_gemm launches _matmul_tma_kernel: the grid (one program per SM), the
    (shape, strides, block shape) of the descriptors over x (or x transposed), the weight (or its
    transpose) and the output, and the kernel's constexprs and options."""

    grid: tuple
    specs: tuple
    kwargs: dict


def gemm_launch(x, weight, bias, out_strides, activation, precision, block_m, block_n, block_k,
                group_m, num_warps, num_stages, split_store=None, flatten=False) -> GemmLaunch:
    """The tiles (gemm_config's unless given: checked), grid and arguments of act(x @ weight +
    bias) into an (M, N) output of out_strides."""
    M, K = x.shape
    N = weight.shape[1]
    cfg = gemm_config(M, N, K, x.dtype, precision, sm_count_of(x.device))
    bm = check_pow2("block_m", cfg.block_m if block_m is None else block_m)
    bn = check_pow2("block_n", cfg.block_n if block_n is None else block_n)
    bk = check_pow2("block_k", cfg.block_k if block_k is None else block_k)
    gm = check_pow2("group_m", cfg.group_m if group_m is None else group_m, lo=1)
    warps, stages = _launch_opts(cfg.num_warps if num_warps is None else num_warps,
                                 cfg.num_stages if num_stages is None else num_stages)
    has_bias = bias is not None
    copies = tf32_copies(x, weight, precision)
    strides = operand_strides(x, weight, copies)
    s_bias = plan_strides(bias)[0] if has_bias else 0
    common = dict(HAS_BIAS=has_bias, ACTIVATION=activation, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                  GROUP_M=gm, INPUT_PRECISION=precision, UPCAST=_upcast_bf16(x.dtype),
                  num_warps=warps, num_stages=stages)
    tma = None
    specs, a_t, b_t = tma_specs(x, weight, strides, out_strides, (bm, bn, bk))
    tiles = cdiv(M, bm) * cdiv(N, bn)
    # Below one tile per SM a call is launch-bound: the pointer kernel's launch is the cheaper
    # (no descriptors to make and encode), and persistence has nothing to walk.
    if (specs is not None and precision != "ieee" and tiles >= sm_count_of(x.device)
            and has_tma(x.device)):
        split = split_store if split_store is not None else bn >= 64
        tma = TmaLaunch(
            (sm_count_of(x.device),),
            specs if not split else (*specs[:2], (*specs[2][:2], [bm, bn // 2])),
            dict(common, A_T=a_t, B_T=b_t, SPLIT_STORE=split, FLATTEN=bool(flatten)))
    return GemmLaunch(
        None if M == 0 or N == 0 else (cdiv(M, bm) * cdiv(N, bn),),
        (M, N, K, *strides, s_bias, *out_strides),
        dict(common, EVEN_K=K % bk == 0), copies, tma)


def tma_specs(x, weight, strides, out_strides, blocks) -> tuple:
    """((shape, strides, block shape) of the descriptors over x (M, K), weight (K, N) and the
    (M, N) output (none if out_strides is None), each over the tensor or its transpose, whichever
    has a unit last stride; whether x's is over x transposed; whether the weight's is). Specs are
    None where a layout cannot be read through TMA: no unit stride, another stride not a multiple
    of 16 bytes or overlapping rows (an expanded tensor), an empty dim or one of 2**31 elements or
    more. (The bases' alignment is a property of each call's tensors: run_gemm checks it.)"""
    (M, K), N = x.shape, weight.shape[1]
    bm, bn, bk = blocks
    size = x.element_size()
    specs, flipped = [], []
    for (rows, cols), (s_r, s_c), (b_r, b_c) in (((M, K), strides[0:2], (bm, bk)),
                                                  ((K, N), strides[2:4], (bk, bn)),
                                                  ((M, N), out_strides or (0, 0), (bm, bn))):
        if len(specs) == 2 and out_strides is None:
            break
        # Empty, or past what a descriptor's i32 shape and TMA's i32 coordinates address.
        if min(rows, cols) == 0 or max(rows, cols) >= 2**31:
            return None, False, False
        if s_c == 1 and s_r >= cols and (s_r * size) % 16 == 0:
            specs.append(([rows, cols], [s_r, 1], [b_r, b_c]))
        elif s_r == 1 and s_c >= rows and (s_c * size) % 16 == 0 and len(specs) < 2:
            specs.append(([cols, rows], [s_c, 1], [b_c, b_r]))
            flipped.append(len(specs) - 1)
        else:
            return None, False, False
    return tuple(specs), 0 in flipped, 1 in flipped


def tf32_copies(x, weight, precision) -> tuple:
    """(copy x, copy weight) before a tf32 dot of x (M, K) by weight (K, N). Hopper's tf32 wgmma
    takes both operands K-major only: with a K-strided operand (x transposed, or weight stored
    (K, N) row-major) Triton falls back to a path several times slower (docs/linear_act.md), so
    such an operand is first copied K-contiguous (`k_major`: a copy of its size, far cheaper
    than the slow path). 16-bit and IEEE operands are read as they are."""
    if x.dtype != torch.float32 or precision != "tf32" or x.shape[1] <= 1:
        return (False, False)
    return (x.stride(1) != 1, weight.stride(0) != 1)


def operand_strides(x, weight, copies) -> tuple:
    """x's and weight's strides as the kernel reads them: those of their copies where copied."""
    K = x.shape[1]
    return (*((K, 1) if copies[0] else plan_strides(x)),
            *((1, K) if copies[1] else plan_strides(weight)))


def k_major(x, weight, copies) -> tuple:
    """x and weight, copied K-contiguous where `tf32_copies` says."""
    if copies[0]:
        x = x.contiguous()
    if copies[1]:
        weight = weight.t().contiguous().t()
    return x, weight


def run_gemm(x, weight, bias, out, how: GemmLaunch):
    """Launch _matmul_kernel as `how` says: out = act(x @ weight + bias)."""
    if how.grid is None:
        return out
    x, weight = k_major(x, weight, how.copies)
    tma = how.tma
    if tma is not None and not (x.data_ptr() | weight.data_ptr() | out.data_ptr()) & 15:
        (a_spec, b_spec, c_spec), M, N, K = tma.specs, *how.sizes_strides[:3]
        launch(_matmul_tma_kernel, tma.grid, descriptor(x, *a_spec), descriptor(weight, *b_spec),
               descriptor(out, *c_spec), x if bias is None else bias, M, N, K,
               how.sizes_strides[7], **tma.kwargs)
    else:
        launch(_matmul_kernel, how.grid, x, weight, x if bias is None else bias, out,
               *how.sizes_strides, **how.kwargs)
    return out


def _gemm(x, weight, bias, out, activation, precision, block_m, block_n, block_k, group_m,
          num_warps, num_stages):
    """Launch _matmul_kernel: out = act(x @ weight + bias); out is (M, N), any strides."""
    return run_gemm(x, weight, bias, out, gemm_launch(
        x, weight, bias, out.stride(), activation, precision, block_m, block_n, block_k, group_m,
        num_warps, num_stages))


def matmul(x, weight, bias=None, *, activation="none", input_precision=None, block_m=None,
           block_n=None, block_k=None, group_m=None, num_warps=None, num_stages=None):
    """act(x @ weight + bias) in one Triton matmul, x (M, K), weight (K, N), any strides.

    The kernel shared by every path here: activation "none" and no bias is a plain matmul.
    float32 defaults to IEEE here (the unfused matmul_softmax baseline); linear_act passes tf32.
    """
    _check_operands(x, weight, bias, "K", "N")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    precision = _precision(x, input_precision, "ieee")
    out = empty((x.shape[0], weight.shape[1]), x.dtype, x.device)
    return _gemm(x, weight, bias, out, activation, precision, block_m, block_n, block_k, group_m,
                 num_warps, num_stages)
