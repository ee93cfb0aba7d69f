"""How matmul_softmax runs a shape: the method (simple, tiled, online, two-pass, stored softmax,
split-K), its tiles and warps, from deterministic heuristics whose thresholds were measured
(docs/matmul_softmax.md)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..._checks import check_pow2
from ..._device import INTERPRETER_SM_COUNT
from ..._tiles import cdiv
from ..._matmul import PRECISIONS, _launch_opts, _precision_class, _pow2


SIMPLE, TILED, ONLINE, TWO_PASS_STORE, STORE_SOFTMAX, SPLIT_K = (
    "simple", "tiled", "online", "two_pass_store", "store_softmax", "split_k")
METHODS = (SIMPLE, TILED, ONLINE, TWO_PASS_STORE, STORE_SOFTMAX, SPLIT_K)

# Largest class tile each single-tile method accepts (after padding C to a power of two).
MAX_SIMPLE_C = 1024
MAX_TILED_C = 512
# method=None recomputes the logits ("online") up to this K, else stores them (module docstring;
# in half precision "two_pass_store" already wins at K = 256: docs/matmul_softmax.md).
ONLINE_MAX_K = {"half": 128, "tf32": 256, "ieee": 64}
# method=None stores the logits with "store_softmax" up to this C (the softmax's one-tile width:
# each row read once), with "two_pass_store" above it.
STORE_SOFTMAX_MAX_C = 16384
# method=None takes "simple" up to this many multiply-adds (B * K * C): one launch, no tensor-core
# staging and no operand copy, which beats "tiled" on small problems in every precision; tiled
# wins from about 1024 x 1024 x 100 (docs/matmul_softmax.md).
SIMPLE_MAX_WORK = 1 << 24
# method=None takes "split_k" from this K when the method it would take fills fewer than half the
# SMs with programs: there K slices fill the GPU and win in every precision, while at K = 256 they
# only tie with two_pass_store (docs/matmul_softmax.md).
SPLIT_K_MIN_K = 1024
SPLIT_K_MIN_SLICES = 4


# ------------------------------------------------------------------------------------------------
# matmul + softmax


class MatmulSoftmaxPlan(NamedTuple):
    """How triton_fused runs a shape: the method and its launch parameters."""

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
    """The method and tiles triton_fused uses (defaults filled in, overrides checked).

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
        raise ValueError("method 'store_softmax' runs kernels._matmul's matmul with that "
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
        # One program per row block: with few rows, smaller blocks so the grid covers more SMs:
        # float32 down to 16 rows; half precision down to 32 rows with 8 warps, for up to 128
        # classes. At 256 classes 32 rows were slower, so wider tiles keep their rows
        # (docs/matmul_softmax.md).
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
