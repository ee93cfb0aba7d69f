"""LayerNorm's fused forward: one kernel reads x once and writes y once (plus 8 bytes of float32
mean and rstd a row, which the backward reads). Statistics and arithmetic in float32; y rounded
once to x's dtype. Statistics are taken of x minus the row's first element, so a mean far above
the spread loses no precision.

- Rows of up to MAX_ONE_TILE elements are held in registers, ROWS rows at a time (a [ROWS, BLOCK]
  tile): two reductions over registers, the mean, then the sum of squares of (x - mean); no second
  pass over memory. The grid is persistent (as many programs as fit on the GPU at once, learnt from
  the compiled kernel's registers, each striding over the row tiles): weight and bias are loaded
  once per program (or, where registers are short, per tile from L1) instead of once per row from
  L2, and the next tile's load is issued before the current one is reduced, so an SM always has
  bytes in flight.
- Longer rows, one program a row, are read twice in tiles of LOOP_BLOCK: a first pass combines
  per-tile (mean, M2) into the row's (Chan et al.'s parallel variance: stable, unlike sum of squares
  minus square of sum), a second normalises and writes. The first pass asks L2 to keep the row.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..._buffers import empty
from ..._device import sm_count_of
from ..._tiles import cdiv, default_warps, next_pow2
from ..._plans import fastest
from ..._timer import time_ms
from ..._launch import launch

# Longest row the forward keeps whole in registers (a persistent program per SM, 32 warps).
MAX_ONE_TILE = 16384
# Tile of the looping kernel (rows over MAX_ONE_TILE, or an explicit smaller block).
LOOP_BLOCK = 4096
# Register tiles are [ROWS, BLOCK]: ROWS > 1 (at most MAX_TILE_ROWS) for rows shorter than
# FWD_TILE elements, so each load of a program moves enough bytes. The warps and the other
# switches per tile are in `fwd_plan`, chosen from ptxas's register counts for sm_90 (no spills).
FWD_TILE = 4096
MAX_TILE_ROWS = 64

@triton.jit
def _load_rows(x_ptr, rows, cols, n_rows, n_cols, x_row_stride):
    """A [ROWS, BLOCK] tile of x (zeros outside) and each row's first element, in x's dtype."""
    row_mask = rows < n_rows
    row_ptrs = x_ptr + rows * x_row_stride
    mask = row_mask[:, None] & (cols < n_cols)[None, :]
    # Streamed: evict_first keeps weight and bias (read for every tile) in L1.
    x = tl.load(row_ptrs[:, None] + cols[None, :], mask=mask, other=0.0,
                eviction_policy="evict_first")
    first = tl.load(row_ptrs, mask=row_mask, other=0.0)
    return x, first


@triton.jit
def _ln_fwd_kernel(x_ptr, y_ptr, w_ptr, b_ptr, stats_ptr, n_rows, n_cols, x_row_stride,
                   y_row_stride, eps, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                   STATS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                   WB_PER_TILE: tl.constexpr, PREFETCH: tl.constexpr):
    """Rows held in registers, ROWS at a time; a persistent grid strides over the row tiles."""
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    col_mask = cols < n_cols
    # Loaded once per program and held, or (WB_PER_TILE, where registers are short) loaded again
    # for each tile, from L1.
    if not WB_PER_TILE:
        if HAS_W:
            w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        if HAS_B:
            b = tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    r = tl.arange(0, ROWS)
    # int64 rows: row * stride may pass 2**31.
    step = n_prog.to(tl.int64) * ROWS
    rows = pid.to(tl.int64) * ROWS + r
    if PREFETCH:
        x, first = _load_rows(x_ptr, rows, cols, n_rows, n_cols, x_row_stride)
    for _ in range(pid, tl.cdiv(n_rows, ROWS), n_prog):
        if PREFETCH:
            # The next tile's load goes out before this one is reduced (none past the last row).
            next_x, next_first = _load_rows(x_ptr, rows + step, cols, n_rows, n_cols,
                                            x_row_stride)
        else:
            x, first = _load_rows(x_ptr, rows, cols, n_rows, n_cols, x_row_stride)
        if WB_PER_TILE:
            if HAS_W:
                w_raw = tl.load(w_ptr + cols, mask=col_mask, other=0.0,
                                eviction_policy="evict_last")
            if HAS_B:
                b_raw = tl.load(b_ptr + cols, mask=col_mask, other=0.0,
                                eviction_policy="evict_last")
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask[None, :]
        # Statistics of x - shift, shift = the row's first element: near the mean, x - shift is
        # exact and small, so a mean far above the spread (1e4 +- 1) costs no digits, as it would if
        # the float32 mean itself were subtracted (its rounding alone is ~ulp(mean) / 2).
        shift = first.to(tl.float32)
        xs = tl.where(mask, x.to(tl.float32) - shift[:, None], 0.0)
        d = tl.sum(xs, axis=1) / n_cols
        # Centre before squaring (no cancellation); zero padding.
        xc = tl.where(mask, xs - d[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / n_cols + eps)
        y = xc * rstd[:, None]
        if WB_PER_TILE:
            if HAS_W:
                y = y * w_raw.to(tl.float32)[None, :]
            if HAS_B:
                y = y + b_raw.to(tl.float32)[None, :]
        else:
            if HAS_W:
                y = y * w[None, :]
            if HAS_B:
                y = y + b[None, :]
        tl.store(y_ptr + rows[:, None] * y_row_stride + cols[None, :],
                 y.to(y_ptr.dtype.element_ty), mask=mask)
        if STATS:
            # The backward recomputes xhat from this float32 mean (as eager PyTorch does).
            tl.store(stats_ptr + rows, shift + d, mask=row_mask)
            tl.store(stats_ptr + n_rows + rows, rstd, mask=row_mask)
        rows += step
        if PREFETCH:
            x = next_x
            first = next_first


@triton.jit
def _ln_fwd_loop_kernel(x_ptr, y_ptr, w_ptr, b_ptr, stats_ptr, n_rows, n_cols, x_row_stride,
                        y_row_stride, eps, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                        STATS: tl.constexpr, BLOCK: tl.constexpr):
    """Rows longer than a tile, one program a row: two passes over BLOCK-column tiles."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    cols = tl.arange(0, BLOCK)
    shift = tl.load(x_row).to(tl.float32)  # as in _ln_fwd_kernel
    count = tl.full((), 0.0, tl.float32)
    d = tl.full((), 0.0, tl.float32)
    m2 = tl.full((), 0.0, tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        mask = offs < n_cols
        # evict_last: the second pass reads the row again.
        x = tl.load(x_row + offs, mask=mask, eviction_policy="evict_last").to(tl.float32)
        xs = tl.where(mask, x - shift, 0.0)
        n_tile = tl.minimum(n_cols - start, BLOCK).to(tl.float32)
        tile_mean = tl.sum(xs, axis=0) / n_tile
        dev = tl.where(mask, xs - tile_mean, 0.0)
        # Chan's update of the running (count, mean, M2) with the tile's own.
        total = count + n_tile
        delta = tile_mean - d
        d += delta * (n_tile / total)
        m2 += tl.sum(dev * dev, axis=0) + delta * delta * (count * n_tile / total)
        count = total
    rstd = 1.0 / tl.sqrt(m2 / n_cols + eps)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        mask = offs < n_cols
        x = tl.load(x_row + offs, mask=mask, other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
        y = ((x - shift) - d) * rstd
        if HAS_W:
            y = y * tl.load(w_ptr + offs, mask=mask).to(tl.float32)
        if HAS_B:
            y = y + tl.load(b_ptr + offs, mask=mask).to(tl.float32)
        tl.store(y_row + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    if STATS:
        tl.store(stats_ptr + row, shift + d)
        tl.store(stats_ptr + n_rows + row, rstd)


# ------------------------------------------------------------------------------------------------
# Plan and launch.


class _FwdPlan(NamedTuple):
    block: int
    rows: int  # rows a tile (one_tile only)
    num_warps: int
    one_tile: bool  # the row in registers (else two passes over block-wide tiles)
    wb_per_tile: bool  # weight, bias loaded for each tile instead of held (saves registers)
    prefetch: bool  # the next tile's x in flight while this one is reduced


@functools.lru_cache(maxsize=None)
def fwd_plan(n_cols: int, itemsize: int, block=None, num_warps=None) -> _FwdPlan:
    """How the forward runs rows of n_cols elements. Registers a thread on sm_90 (ptxas, weight
    and bias present), programs an SM fits at once, x in flight an SM (this tile and the next):
      fp16: 1024 (4 rows, 8 warps) 80, 3, 48 KB;  4096 (8 warps) 64, 4, 64 KB;
            8192 (16 warps) 86, 1, 32 KB;  16384 (32 warps, weight/bias per tile) 64, 1, 64 KB.
      fp32: 1024 (4 rows, 8 warps) 71, 3, 96 KB;  4096 (8 warps) 127, 2, 64 KB;
            8192 (16 warps) 107, 1, 64 KB;  16384 (32 warps, no prefetch) 64, 1, 64 KB.
    No spills in any (for N a multiple of 16)."""
    if block is None:
        block = max(16, next_pow2(n_cols)) if n_cols <= MAX_ONE_TILE else LOOP_BLOCK
    if block < n_cols:
        return _FwdPlan(block, 1, num_warps or default_warps(block), False, False, False)
    # Rows under 1024: half the tile, 8 elements a thread (more spill at 64 rows and up).
    rows = max(1, min(MAX_TILE_ROWS, (FWD_TILE if block >= 1024 else FWD_TILE // 2) // block))
    if num_warps is None:
        num_warps = max(1, min(32, rows * block // (512 if block >= 1024 else 256)))
    wb_per_tile = block >= 16384 or (itemsize <= 2 and 2048 <= block <= 4096)
    prefetch = rows * block * itemsize <= 32 * 1024
    if n_cols % 16 and block >= 16384:
        # Rows not a multiple of 16 elements cannot be loaded 16 bytes at a time: an address a
        # value costs registers (at 16384, 72 bytes of spills with the prefetch).
        prefetch = False
    return _FwdPlan(block, rows, num_warps, True, wb_per_tile, prefetch)


# Programs of the persistent forward kernel that fit on one SM at once, per compiled variant,
# learnt from the registers and shared memory of its first launch (which runs one program per
# SM: the kernel is correct for any grid).
_RESIDENT: dict = {}


def _resident_programs(compiled, device, num_warps) -> int:
    try:
        n_regs, smem = compiled.n_regs, compiled.metadata.shared
        props = torch.cuda.get_device_properties(device)
    except Exception:  # noqa: BLE001 - no launch metadata (the interpreter): stay at one
        return 1
    return _programs_per_sm(n_regs, smem, num_warps,
                            getattr(props, "regs_per_multiprocessor", 65536),
                            getattr(props, "max_threads_per_multi_processor", 2048),
                            getattr(props, "shared_memory_per_multiprocessor", 228 * 1024))


def _programs_per_sm(n_regs, smem, num_warps, regs_sm=65536, threads_sm=2048,
                     smem_sm=228 * 1024) -> int:
    """Blocks of num_warps warps, n_regs registers a thread and smem bytes of shared memory that
    an SM holds at once (an H100's limits by default; at least 1)."""
    # Registers are allocated per warp in units of 256.
    regs_per_warp = -(-max(1, n_regs) * 32 // 256) * 256
    fit = min(regs_sm // regs_per_warp // num_warps, threads_sm // (32 * num_warps), 32)
    if smem:
        fit = min(fit, smem_sm // (smem + 1024))  # 1 KiB a block is reserved by the driver
    return max(1, fit)


class FwdLaunch(NamedTuple):
    """How `run_forward` launches one layout (a caller may cache it): the plan, the row tiles, the
    SM count and the key of the resident-programs table."""

    plan: _FwdPlan
    row_tiles: int
    sms: int
    resident_key: tuple


def fwd_launch(dtype, device, n_rows, n_cols, x_row_stride, y_row_stride, has_w, has_b,
               block=None, num_warps=None, plan=None) -> FwdLaunch:
    plan = plan or fwd_plan(n_cols, dtype.itemsize, block, num_warps)
    # Per compiled variant: Triton specialises on each integer's and pointer's divisibility by 16
    # (which changes the registers: unaligned rows load an element at a time).
    key = (device, dtype, has_w, has_b, plan, n_rows % 16 == 0, n_cols % 16 == 0,
           x_row_stride % 16 == 0, y_row_stride % 16 == 0)
    return FwdLaunch(plan, cdiv(n_rows, plan.rows), sm_count_of(device), key)


def plan_candidates(plan: _FwdPlan) -> list[_FwdPlan]:
    """`fwd_plan`'s register-tile plan (first) and its neighbours that `tuned_launch` times: twice
    the rows (up to 16384 elements a tile), 4 to 32 warps (at least 4 elements a thread)."""
    if not plan.one_tile:
        return [plan]
    out = [plan]
    for rows in dict.fromkeys((plan.rows, 2 * plan.rows)):
        if rows * plan.block > max(16384, plan.rows * plan.block):
            continue
        for warps in (4, 8, 16, 32):
            if 128 * warps <= rows * plan.block:
                out.append(plan._replace(rows=rows, num_warps=warps))
    return list(dict.fromkeys(out))


# The plan that ran fastest, per (device, dtype, n_cols, weight?, bias?, rows up to a power of
# two): the H100's register counts give a first guess, but the best tile differs between GPUs
# (on an H200 fp16 rows of 5120-8192 run 14-25% faster with 4 warps than with fwd_plan's 16).
_TUNED: dict = {}
# Inputs smaller than this are not tuned: 4 MiB is ~1.3 us of an H100's bandwidth, less than a
# launch's host time, so the candidates would differ by less than what timing them measures.
TUNE_FROM_BYTES = 4 * 2**20


def _bench(fn) -> float:
    """Median ms of fn (a module attribute so that the tests can replace the timing)."""
    return time_ms(fn, warmup_ms=5, rep_ms=20)


def tuned_launch(x, n_rows, n_cols, x_row_stride, weight, bias, how: FwdLaunch) -> FwdLaunch:
    """`how` with the fastest of `plan_candidates(how.plan)` on this device, timed once per key on
    x itself (into a scratch output) at its first call (see `fastest`: kept on disk with
    TRITON_CACHE_AUTOTUNING=1); later calls of the key take the choice."""
    candidates = plan_candidates(how.plan)
    if len(candidates) == 1:
        return how
    key = (x.device, x.dtype, n_cols, weight is not None, bias is not None,
           min(4096, 1 << max(0, n_rows - 1).bit_length()))
    plan = _TUNED.get(key)
    if plan is None:
        y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)

        def time_ms(cand):
            cand_how = fwd_launch(x.dtype, x.device, n_rows, n_cols, x_row_stride, n_cols,
                                  weight is not None, bias is not None, plan=cand)
            return _bench(lambda: run_forward(x, y, n_rows, n_cols, x_row_stride, n_cols, weight,
                                              bias, 1e-5, cand_how, stats=False))
        plan = fastest(_TUNED, key, candidates, time_ms, (_ln_fwd_kernel,), x.device)
    return fwd_launch(x.dtype, x.device, n_rows, n_cols, x_row_stride, n_cols,
                      weight is not None, bias is not None, plan=plan)


def run_forward(x, y, n_rows, n_cols, x_row_stride, y_row_stride, weight, bias, eps,
                how: FwdLaunch, stats=True):
    """Run the fused forward from the rows of x (x_row_stride elements apart) into those of y;
    return float32 (mean, rstd) rows, or None with stats=False (no backward follows: nothing
    allocated, nothing stored)."""
    plan = how.plan
    out = empty((2, n_rows), torch.float32, x.device) if stats else None
    # A stand-in pointer where weight, bias or the statistics are absent (never touched: HAS_W,
    # HAS_B and STATS are constexpr).
    args = (x, y, x if weight is None else weight, x if bias is None else bias,
            x if out is None else out, n_rows, n_cols, x_row_stride, y_row_stride, float(eps))
    has_w, has_b = weight is not None, bias is not None
    if not plan.one_tile:
        launch(_ln_fwd_loop_kernel, (n_rows,), *args, HAS_W=has_w, HAS_B=has_b, STATS=stats,
               BLOCK=plan.block, num_warps=plan.num_warps)
        return out
    resident_key = (how.resident_key, stats)
    per_sm = _RESIDENT.get(resident_key)
    grid = min(how.row_tiles, how.sms * (per_sm or 1))
    compiled = launch(_ln_fwd_kernel, (grid,), *args, HAS_W=has_w, HAS_B=has_b, STATS=stats,
                      ROWS=plan.rows, BLOCK=plan.block, WB_PER_TILE=plan.wb_per_tile,
                      PREFETCH=plan.prefetch, num_warps=plan.num_warps)
    if per_sm is None:
        _RESIDENT[resident_key] = _resident_programs(compiled, x.device, plan.num_warps)
    return out


def forward(rows, n_rows, n_cols, weight, bias, eps, block, num_warps, y2, stats=True):
    """Run the fused forward into the (rows, cols) view y2; return float32 (mean, rstd) rows
    (None with stats=False)."""
    how = fwd_launch(rows.dtype, rows.device, n_rows, n_cols, rows.stride(0), y2.stride(0),
                     weight is not None, bias is not None, block, num_warps)
    return run_forward(rows, y2, n_rows, n_cols, rows.stride(0), y2.stride(0), weight, bias, eps,
                       how, stats)
