"""LayerNorm over the last dim: `(x - mean) / sqrt(var + eps) * weight + bias`, per row.

The input is viewed as rows (all leading dims flattened); statistics and arithmetic run in float32
and every output is rounded once to its dtype. weight and bias are optional (None: no scale, no
shift). var is the biased variance (divided by N), as in torch. The fused forward takes its
statistics of x minus the row's first element, so a mean far above the spread loses no precision.

Unfused (forward only: five kernels, the steps one would write without fusion) every step
round-trips through memory: mean (x read), variance (x read again), normalise (x read, xhat
written), scale (xhat read, written), shift (read, written).

Fused forward, one kernel: reads x once, writes y once (plus 8 bytes of mean, rstd a row).
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

The fused version is differentiable (`torch.autograd.Function`). Backward, per row,
    xhat = (x - mean) * rstd,  g = dy * weight,
    dx = (g - xhat * mean(g * xhat) - mean(g)) * rstd,
and dweight = sum over rows of dy * xhat, dbias = sum of dy. Those column sums are reduced in two
stages without locks or atomics: each of `groups` row groups (`bwd_groups`: one per SM, all
resident at once) is a contiguous range of rows that owns one row of a float32 (groups, N)
partial-sum buffer for each of dweight and dbias; a second kernel sums the partials over groups.
The first kernel reads x and dy from memory once and writes dx once:
- rows up to BWD_MAX_ONE_TILE elements: one program a group holds ROWS rows at a time in
  registers, issues the next tile's load before reducing the current one, and accumulates the
  partial sums in registers across its rows, stored once at the end;
- longer rows (the split kernel): cdiv(N, BWD_SPLIT_BLOCK) programs a group, each owning a column
  segment of the group's rows (and of its partial rows). Per row each sums g * xhat and g over the
  whole row, then reads its own segment again (from L1), writes dx there and accumulates the
  partial sums in registers. The programs of a group are launched next to each other, so they read
  the same rows at about the same time: L2 serves all but the first read of each row.
The backward kernels are compiled without FMA contraction, and divide the row sums by N correctly
rounded: with contraction, `dy * w - mean(g)` became one fused multiply-add against the rounded
`dy * w` that mean(g) was summed from, so a one-column row (where dx is exactly 0) got a rounding
residual instead of 0.
"""
from __future__ import annotations

import functools
import math
import numbers
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._common import (FLOAT_DTYPES, as_rows, cdiv, check_contiguous, check_pow2, check_same,
                      check_tensor, check_warps, default_warps, empty, next_pow2, sm_count_of)

# Longest row the forward keeps whole in registers (a persistent program per SM, 32 warps).
MAX_ONE_TILE = 16384
# Longest row the backward keeps whole in registers (x, dy and two partial-sum rows); wider rows
# take the split kernel, BWD_SPLIT_BLOCK columns a program.
BWD_MAX_ONE_TILE = 8192
BWD_SPLIT_BLOCK = 8192
# Tile of the forward's looping kernel (rows over MAX_ONE_TILE, or an explicit smaller block).
LOOP_BLOCK = 4096
UNFUSED_BLOCK = 4096
# Register tiles are [ROWS, BLOCK]: ROWS > 1 (at most MAX_TILE_ROWS) for rows shorter than
# FWD_TILE (BWD_TILE) elements, so each load of a program moves enough bytes. The warps and the
# other switches per tile are in `_fwd_plan` and `_bwd_plan`, chosen from ptxas's register counts
# for sm_90 (no spills).
FWD_TILE = 4096
BWD_TILE = 4096
MAX_TILE_ROWS = 64
# Backward groups: one program per SM, all resident at once, but at least MIN_ROWS_PER_GROUP rows
# each, so the partial sums (2 x groups x N float32, written and read back) stay small next to x,
# dy and dx (16 * groups / (6 * rows) of them in 16-bit dtypes: 9% at 4096 rows).
GROUPS_PER_SM = 1
MIN_ROWS_PER_GROUP = 8
# SM_COUNT, when set, overrides the device's own count (the tests set it small so that programs
# loop over several tiles or rows).
SM_COUNT: int | None = None
# Elements a program of the kernel that sums the partials over groups loads per step
# (REDUCE_TILE // BLOCK_N groups of BLOCK_N columns).
REDUCE_TILE = 4096


def reference(x: torch.Tensor, weight, bias, eps: float = 1e-5) -> torch.Tensor:
    """The semantics, in PyTorch eager."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


# ------------------------------------------------------------------------------------------------
# Fused forward.


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
                   ROWS: tl.constexpr, BLOCK: tl.constexpr, WB_PER_TILE: tl.constexpr,
                   PREFETCH: tl.constexpr):
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
                        BLOCK: tl.constexpr):
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
    tl.store(stats_ptr + row, shift + d)
    tl.store(stats_ptr + n_rows + row, rstd)


# ------------------------------------------------------------------------------------------------
# Fused backward.


@triton.jit
def _load_bwd_rows(x_ptr, dy_ptr, stats_ptr, rows, cols, end, n_rows, n_cols, x_row_stride,
                   dy_row_stride):
    """x and dy tiles (zeros outside), mean and rstd of rows [.., end): what a row tile needs."""
    row_mask = rows < end
    mask = row_mask[:, None] & (cols < n_cols)[None, :]
    x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0,
                eviction_policy="evict_first")
    dy = tl.load(dy_ptr + rows[:, None] * dy_row_stride + cols[None, :], mask=mask, other=0.0,
                 eviction_policy="evict_first")
    mean = tl.load(stats_ptr + rows, mask=row_mask, other=0.0)
    rstd = tl.load(stats_ptr + n_rows + rows, mask=row_mask, other=0.0)
    return x, dy, mean, rstd


@triton.jit
def _ln_bwd_kernel(x_ptr, dy_ptr, dx_ptr, w_ptr, stats_ptr, dw_part_ptr, db_part_ptr, n_rows,
                   n_cols, n_groups, x_row_stride, dy_row_stride, dx_row_stride,
                   HAS_W: tl.constexpr, DW: tl.constexpr, DB: tl.constexpr, ROWS: tl.constexpr,
                   BLOCK: tl.constexpr, PREFETCH: tl.constexpr):
    """dx of a contiguous range of rows, ROWS at a time in registers, and the range's partial
    dweight, dbias (accumulated in registers, stored once into this program's partial rows)."""
    group = tl.program_id(0)
    # Rows [first, end): the ranges of consecutive groups differ by at most one row, none empty.
    first = group.to(tl.int64) * n_rows // n_groups
    end = (group + 1).to(tl.int64) * n_rows // n_groups
    # tl.cast, not n_cols.to: Triton specialises an int argument equal to 1 into a constexpr (a
    # Python int, which has no .to), so one-column rows would not compile.
    n_f = tl.cast(n_cols, tl.float32)
    cols = tl.arange(0, BLOCK)
    col_mask = cols < n_cols
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([ROWS, BLOCK], tl.float32)
    db_acc = tl.zeros([ROWS, BLOCK], tl.float32)
    r = tl.arange(0, ROWS)
    if PREFETCH:
        x, dy, mean, rstd = _load_bwd_rows(x_ptr, dy_ptr, stats_ptr, first + r, cols, end,
                                           n_rows, n_cols, x_row_stride, dy_row_stride)
    for start in range(first, end, ROWS):
        rows = start + r
        if PREFETCH:
            # The next tile's load goes out before this one is reduced.
            nx, ndy, nmean, nrstd = _load_bwd_rows(x_ptr, dy_ptr, stats_ptr, rows + ROWS, cols,
                                                   end, n_rows, n_cols, x_row_stride,
                                                   dy_row_stride)
        else:
            x, dy, mean, rstd = _load_bwd_rows(x_ptr, dy_ptr, stats_ptr, rows, cols, end, n_rows,
                                               n_cols, x_row_stride, dy_row_stride)
        mask = (rows < end)[:, None] & col_mask[None, :]
        dyf = dy.to(tl.float32)
        xhat = tl.where(mask, (x.to(tl.float32) - mean[:, None]) * rstd[:, None], 0.0)
        g = dyf
        if HAS_W:
            g = g * w[None, :]
        # Correctly rounded: a one-column row gets c2 == g exactly, hence dx == 0.
        c1 = tl.div_rn(tl.sum(xhat * g, axis=1), n_f)
        c2 = tl.div_rn(tl.sum(g, axis=1), n_f)
        dx = (g - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(dx_ptr + rows[:, None] * dx_row_stride + cols[None, :],
                 dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if DW:
            dw_acc += dyf * xhat
        if DB:
            db_acc += dyf
        if PREFETCH:
            x = nx
            dy = ndy
            mean = nmean
            rstd = nrstd
    # This program's own row of each partial buffer: no other program writes it.
    part_row = group.to(tl.int64) * n_cols
    if DW:
        tl.store(dw_part_ptr + part_row + cols, tl.sum(dw_acc, axis=0), mask=col_mask)
    if DB:
        tl.store(db_part_ptr + part_row + cols, tl.sum(db_acc, axis=0), mask=col_mask)


@triton.jit
def _ln_bwd_split_kernel(x_ptr, dy_ptr, dx_ptr, w_ptr, stats_ptr, dw_part_ptr, db_part_ptr,
                         n_rows, n_cols, n_groups, x_row_stride, dy_row_stride, dx_row_stride,
                         HAS_W: tl.constexpr, DW: tl.constexpr, DB: tl.constexpr,
                         BLOCK: tl.constexpr):
    """Rows longer than a register tile: program (s, group) owns column segment s (BLOCK wide)
    of its group's rows (grid: cdiv(N, BLOCK) segments x groups). Per row it sums g * xhat and g
    over the whole row (every segment, a tile at a time: the group's other programs read the same
    row at about the same time, so L2 serves all but the first read), then reads its own segment
    again (from L1), writes dx there and adds dy * xhat, dy to partial sums held in registers,
    stored once at the end."""
    seg = tl.program_id(0)
    n_seg = tl.num_programs(0)
    group = tl.program_id(1)
    first = group.to(tl.int64) * n_rows // n_groups
    end = (group + 1).to(tl.int64) * n_rows // n_groups
    # tl.cast, not n_cols.to: Triton specialises an int argument equal to 1 into a constexpr (a
    # Python int, which has no .to), so one-column rows would not compile.
    n_f = tl.cast(n_cols, tl.float32)
    cols = tl.arange(0, BLOCK)
    own = seg * BLOCK + cols
    own_mask = own < n_cols
    dw_acc = tl.zeros([BLOCK], tl.float32)
    db_acc = tl.zeros([BLOCK], tl.float32)
    for row in range(first, end):
        x_row = x_ptr + row * x_row_stride
        dy_row = dy_ptr + row * dy_row_stride
        mean = tl.load(stats_ptr + row)
        rstd = tl.load(stats_ptr + n_rows + row)
        acc_gx = tl.zeros([BLOCK], tl.float32)
        acc_g = tl.zeros([BLOCK], tl.float32)
        # Segments in the order seg + 1, seg + 2, ..., seg (own last): the group's programs start
        # on different segments (one fetches from DRAM what the others then find in L2), and the
        # own segment, read last, is still in L1 when it is read again below.
        for i in range(1, n_seg + 1):
            offs = ((seg + i) % n_seg) * BLOCK + cols
            mask = offs < n_cols
            x = tl.load(x_row + offs, mask=mask, other=0.0)
            dy = tl.load(dy_row + offs, mask=mask, other=0.0)
            xhat = tl.where(mask, (x.to(tl.float32) - mean) * rstd, 0.0)
            g = dy.to(tl.float32)
            if HAS_W:
                g = g * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            acc_gx += g * xhat
            acc_g += g
        c1 = tl.div_rn(tl.sum(acc_gx, axis=0), n_f)
        c2 = tl.div_rn(tl.sum(acc_g, axis=0), n_f)
        x = tl.load(x_row + own, mask=own_mask, other=0.0)
        dyf = tl.load(dy_row + own, mask=own_mask, other=0.0).to(tl.float32)
        xhat = tl.where(own_mask, (x.to(tl.float32) - mean) * rstd, 0.0)
        g = dyf
        if HAS_W:
            g = g * tl.load(w_ptr + own, mask=own_mask, other=0.0).to(tl.float32)
        dx = (g - (xhat * c1 + c2)) * rstd
        tl.store(dx_ptr + row * dx_row_stride + own, dx.to(dx_ptr.dtype.element_ty),
                 mask=own_mask)
        if DW:
            dw_acc += dyf * xhat
        if DB:
            db_acc += dyf
    part_row = group.to(tl.int64) * n_cols
    if DW:
        tl.store(dw_part_ptr + part_row + own, dw_acc, mask=own_mask)
    if DB:
        tl.store(db_part_ptr + part_row + own, db_acc, mask=own_mask)


@triton.jit
def _sum_groups_kernel(part_ptr, dw_ptr, db_ptr, n_groups, n_cols, DW: tl.constexpr,
                       DB: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr):
    """dweight, dbias [c] = sum over groups of the partials: the second stage of the column sums.
    Program (i, k) sums columns tile i of partial buffer k (dweight first when there is one)."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    k = tl.program_id(1)
    base = part_ptr + k.to(tl.int64) * n_groups * n_cols
    acc = tl.zeros([BLOCK_G, BLOCK_N], tl.float32)
    for g0 in range(0, n_groups, BLOCK_G):
        gs = g0 + tl.arange(0, BLOCK_G)
        mask = (gs < n_groups)[:, None] & col_mask[None, :]
        acc += tl.load(base + gs[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)
    total = tl.sum(acc, axis=0)
    if DW and DB:
        if k == 0:
            tl.store(dw_ptr + cols, total.to(dw_ptr.dtype.element_ty), mask=col_mask)
        else:
            tl.store(db_ptr + cols, total.to(db_ptr.dtype.element_ty), mask=col_mask)
    elif DW:
        tl.store(dw_ptr + cols, total.to(dw_ptr.dtype.element_ty), mask=col_mask)
    else:
        tl.store(db_ptr + cols, total.to(db_ptr.dtype.element_ty), mask=col_mask)


# ------------------------------------------------------------------------------------------------
# The unfused baseline (forward only): five kernels, each step stored. Per-row statistics are
# float32; the per-element intermediates are in x's dtype, as separate eager ops would keep them.


@triton.jit
def _row_mean_kernel(x_ptr, mean_ptr, n_cols, x_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        acc += tl.load(x_ptr + row * x_row_stride + offs, mask=offs < n_cols,
                       other=0.0).to(tl.float32)
    tl.store(mean_ptr + row, tl.sum(acc, axis=0) / n_cols)


@triton.jit
def _row_var_kernel(x_ptr, mean_ptr, var_ptr, n_cols, x_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mean = tl.load(mean_ptr + row)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        mask = offs < n_cols
        x = tl.load(x_ptr + row * x_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
        d = tl.where(mask, x - mean, 0.0)
        acc += d * d
    tl.store(var_ptr + row, tl.sum(acc, axis=0) / n_cols)


@triton.jit
def _normalise_kernel(x_ptr, mean_ptr, var_ptr, out_ptr, n_cols, x_row_stride, eps,
                      BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * x_row_stride + offs, mask=mask).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.load(var_ptr + row) + eps)
    xhat = (x - tl.load(mean_ptr + row)) * rstd
    tl.store(out_ptr + row * n_cols + offs, xhat.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _column_op_kernel(t_ptr, p_ptr, out_ptr, n, n_cols, SCALE: tl.constexpr,
                      BLOCK: tl.constexpr):
    """One elementwise step with a per-column vector p: t * p (SCALE, the weight) or t + p (the
    bias). Two separate launches, as two separate eager ops would be."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    t = tl.load(t_ptr + offs, mask=mask).to(tl.float32)
    p = tl.load(p_ptr + offs % n_cols, mask=mask).to(tl.float32)
    out = t * p if SCALE else t + p
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------------------------------
# Host side.


def _plainly_valid(x, weight, bias) -> bool:
    """The common case, checked cheaply (this runs on every call's host path): CUDA tensors of
    one float dtype and device, weight and bias contiguous (N,). Anything else goes through the
    full checks, which name the problem."""
    if not (isinstance(x, torch.Tensor) and x.is_cuda and x.dtype in FLOAT_DTYPES and x.dim()):
        return False
    for p in (weight, bias):
        if p is not None and not (isinstance(p, torch.Tensor) and p.dtype == x.dtype
                                  and p.dim() == 1 and p.shape[0] == x.shape[-1]
                                  and p.is_contiguous() and p.device == x.device):
            return False
    return True


def _check_inputs(x, weight, bias, eps):
    plain = _plainly_valid(x, weight, bias)
    rows, n_rows, n_cols = as_rows("x", x, checked=plain)
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None or plain:
            continue
        check_tensor(name, p, ndim=1)
        check_same([("x", x), (name, p)])
        if p.shape[0] != n_cols:
            raise ValueError(f"{name} must have shape ({n_cols},) to match x's last dim, got "
                             f"{tuple(p.shape)}")
        check_contiguous(name, p)
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    return rows, n_rows, n_cols


def _check_options(block, num_warps, groups=None) -> None:
    if block is not None:
        check_pow2("block", block)
    if num_warps is not None:
        check_warps(num_warps)
    if groups is not None and (isinstance(groups, bool) or not isinstance(groups, int)
                               or groups < 1):
        raise ValueError(f"groups must be a positive int, got {groups}")


class _FwdPlan(NamedTuple):
    block: int
    rows: int  # rows a tile (one_tile only)
    num_warps: int
    one_tile: bool  # the row in registers (else two passes over block-wide tiles)
    wb_per_tile: bool  # weight, bias loaded for each tile instead of held (saves registers)
    prefetch: bool  # the next tile's x in flight while this one is reduced


@functools.lru_cache(maxsize=None)
def _fwd_plan(n_cols: int, itemsize: int, block=None, num_warps=None) -> _FwdPlan:
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


class _BwdPlan(NamedTuple):
    block: int  # the row (one_tile) or the column segment of a split program
    rows: int
    num_warps: int
    one_tile: bool
    prefetch: bool


@functools.lru_cache(maxsize=None)
def _bwd_plan(n_cols: int, itemsize: int, block=None, num_warps=None) -> _BwdPlan:
    """How the backward runs rows of n_cols elements (one program per SM). Registers a thread
    (ptxas, sm_90, 16 warps, no FMA contraction) and x + dy in flight an SM (this tile and the
    next, or this tile alone without the prefetch):
      fp16: 1024 (4 rows) 109, 32 KB;  4096 (2 rows) 128, 64 KB;  8192 (no prefetch) 128, 32 KB.
      fp32: 1024 (4 rows) 119, 64 KB;  4096 116, 64 KB;  8192 (no prefetch) 123, 64 KB.
    Wider rows: the split kernel, segments of BWD_SPLIT_BLOCK at 32 warps, 64 registers. No
    spills in any (for N a multiple of 16)."""
    if block is None:
        block = (max(16, next_pow2(n_cols)) if n_cols <= BWD_MAX_ONE_TILE
                 else BWD_SPLIT_BLOCK)
    if block < n_cols:
        return _BwdPlan(block, 1, num_warps or max(1, min(32, block // 256)), False, False)
    tile = 2 * BWD_TILE if itemsize <= 2 and block >= 4096 else BWD_TILE
    if n_cols % 16:
        # Unvectorised loads (see _fwd_plan): half the tile, and 32 warps at 8192, to keep the
        # spills away (8192 still spills 128 bytes a thread).
        tile = BWD_TILE // 2
        if num_warps is None and block >= 8192:
            num_warps = 32
    rows = max(1, min(MAX_TILE_ROWS, tile // block))
    if num_warps is None:
        num_warps = max(1, min(16, rows * block // 256))
    prefetch = block <= 4096 and rows * block * itemsize <= 16 * 1024
    return _BwdPlan(block, rows, num_warps, True, prefetch)


def _sm_count(device=None) -> int:
    return SM_COUNT if SM_COUNT is not None else sm_count_of(device)


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


def bwd_groups(n_rows: int, device=None) -> int:
    """Number of programs (row groups, partial-sum rows) the backward uses for n_rows rows by
    default: one per SM, at least MIN_ROWS_PER_GROUP rows each. (The split kernel, for rows over
    BWD_MAX_ONE_TILE, runs cdiv(N, BWD_SPLIT_BLOCK) programs per group, each owning a column
    segment of the same partial rows.)"""
    sms = _sm_count(None if device is None else torch.device(device))
    return max(1, min(GROUPS_PER_SM * sms, cdiv(n_rows, MIN_ROWS_PER_GROUP)))


def _forward(rows, n_rows, n_cols, weight, bias, eps, block, num_warps, y2):
    """Run the fused forward into the (rows, cols) view y2; return float32 (mean, rstd) rows."""
    plan = _fwd_plan(n_cols, rows.element_size(), block, num_warps)
    stats = empty((2, n_rows), torch.float32, rows.device)
    # A stand-in pointer where weight or bias is None (never read: HAS_W/HAS_B are constexpr).
    args = (rows, y2, rows if weight is None else weight, rows if bias is None else bias, stats,
            n_rows, n_cols, rows.stride(0), y2.stride(0), float(eps))
    has_w, has_b = weight is not None, bias is not None
    if not plan.one_tile:
        _ln_fwd_loop_kernel[(n_rows,)](*args, HAS_W=has_w, HAS_B=has_b, BLOCK=plan.block,
                                       num_warps=plan.num_warps)
        return stats
    # Per compiled variant: Triton specialises on each integer's and pointer's divisibility by 16
    # (which changes the registers: unaligned rows load an element at a time).
    key = (rows.device, rows.dtype, has_w, has_b, plan, n_rows % 16 == 0, n_cols % 16 == 0,
           rows.stride(0) % 16 == 0, y2.stride(0) % 16 == 0)
    per_sm = _RESIDENT.get(key)
    grid = min(cdiv(n_rows, plan.rows), _sm_count(rows.device) * (per_sm or 1))
    compiled = _ln_fwd_kernel[(grid,)](
        *args, HAS_W=has_w, HAS_B=has_b, ROWS=plan.rows, BLOCK=plan.block,
        WB_PER_TILE=plan.wb_per_tile, PREFETCH=plan.prefetch, num_warps=plan.num_warps)
    if per_sm is None:
        _RESIDENT[key] = _resident_programs(compiled, rows.device, plan.num_warps)
    return stats


def _backward(dy, x, weight, stats, need_dw, need_db, block, num_warps, groups):
    """(dx, dweight or None, dbias or None) of the fused LayerNorm."""
    # x was checked by the forward (this is the host path of every backward call: kept short).
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols if n_cols else math.prod(x.shape[:-1])
    rows = x.view(n_rows, n_cols) if x.numel() else None
    dx = empty(x.shape, x.dtype, x.device)
    if rows is None:  # no rows: dx is empty, the column sums are zeros
        zeros = torch.zeros(n_cols, dtype=x.dtype, device=x.device)
        return dx, zeros if need_dw else None, zeros.clone() if need_db else None
    dy2 = dy.contiguous().view(n_rows, n_cols)
    dx2 = dx.view(n_rows, n_cols)
    plan = _bwd_plan(n_cols, rows.element_size(), block, num_warps)
    # At most one group a row: every group has rows, so every partial row gets written.
    groups = bwd_groups(n_rows, x.device) if groups is None else min(groups, n_rows)
    # Partial sums: buffer 0 dweight, then dbias (only those needed); every (group, column) slot
    # is written by exactly one program.
    n_parts = int(need_dw) + int(need_db)
    part = empty((n_parts, groups, n_cols), torch.float32, x.device) if n_parts else rows
    has_w = weight is not None
    args = (rows, dy2, dx2, weight if has_w else rows, stats, part[0] if need_dw else rows,
            part[-1] if need_db else rows, n_rows, n_cols, groups, rows.stride(0), dy2.stride(0),
            dx2.stride(0))
    # No FMA contraction (see the module docstring).
    if plan.one_tile:
        _ln_bwd_kernel[(groups,)](
            *args, HAS_W=has_w, DW=need_dw, DB=need_db, ROWS=plan.rows, BLOCK=plan.block,
            PREFETCH=plan.prefetch, num_warps=plan.num_warps, enable_fp_fusion=False)
    else:
        _ln_bwd_split_kernel[(cdiv(n_cols, plan.block), groups)](
            *args, HAS_W=has_w, DW=need_dw, DB=need_db, BLOCK=plan.block,
            num_warps=plan.num_warps, enable_fp_fusion=False)
    if n_parts == 0:
        return dx, None, None
    dw = empty((n_cols,), weight.dtype, x.device) if need_dw else None
    db = empty((n_cols,), x.dtype, x.device) if need_db else None
    block_n = min(128, max(32, next_pow2(n_cols) // 128))
    _sum_groups_kernel[(cdiv(n_cols, block_n), n_parts)](
        part, rows if dw is None else dw, rows if db is None else db, groups, n_cols, DW=need_dw,
        DB=need_db, BLOCK_G=REDUCE_TILE // block_n, BLOCK_N=block_n, num_warps=4)
    return dx, dw, db


def _fused_forward(x, weight, bias, eps, block, num_warps, groups):
    """(y, per-row float32 mean and rstd) after checking every input and option."""
    rows, n_rows, n_cols = _check_inputs(x, weight, bias, eps)
    _check_options(block, num_warps, groups)
    y = empty(x.shape, x.dtype, x.device)
    if rows is None:
        return y, torch.empty((2, 0), dtype=torch.float32, device=x.device)
    return y, _forward(rows, n_rows, n_cols, weight, bias, eps, block, num_warps,
                       y.view(n_rows, n_cols))


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, block, num_warps, groups):
        y, stats = _fused_forward(x, weight, bias, eps, block, num_warps, groups)
        ctx.save_for_backward(x, weight, stats)
        ctx.has_bias = bias is not None
        ctx.options = (block, num_warps, groups)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, stats = ctx.saved_tensors
        need_dw = weight is not None and ctx.needs_input_grad[1]
        need_db = ctx.has_bias and ctx.needs_input_grad[2]
        dx, dw, db = _backward(dy, x, weight, stats, need_dw, need_db, *ctx.options)
        return dx, dw, db, None, None, None, None


def triton_fused(x: torch.Tensor, weight=None, bias=None, eps: float = 1e-5, *, block=None,
                 num_warps=None, groups=None) -> torch.Tensor:
    """Fused LayerNorm, differentiable: one forward kernel; backward one kernel for dx and the
    partial dweight/dbias, one more for their sum over groups.

    block: the tile; a block >= the row length keeps the row in registers (the default up to
    MAX_ONE_TILE forward, BWD_MAX_ONE_TILE backward), a smaller one loops. num_warps: of the
    forward and backward's first kernel. groups: programs of the backward (default `bwd_groups`;
    at most one per row)."""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in (x, weight, bias)):
        return _LayerNorm.apply(x, weight, bias, eps, block, num_warps, groups)
    # Nothing to differentiate: skip the autograd.Function's bookkeeping (host time).
    return _fused_forward(x, weight, bias, eps, block, num_warps, groups)[0]


def triton_unfused(x: torch.Tensor, weight=None, bias=None, eps: float = 1e-5, *, block=None,
                   num_warps=None) -> torch.Tensor:
    """Forward only (no autograd): five Triton kernels, mean -> variance -> normalise -> scale
    -> shift, each result stored and read back by the next (scale/shift skipped for None)."""
    rows, n_rows, n_cols = _check_inputs(x, weight, bias, eps)
    _check_options(block, num_warps)
    block = min(UNFUSED_BLOCK, max(16, next_pow2(n_cols))) if block is None else block
    num_warps = default_warps(block) if num_warps is None else num_warps
    if rows is None:
        return empty(x.shape, x.dtype, x.device)
    mean = empty((n_rows,), torch.float32, x.device)
    var = empty((n_rows,), torch.float32, x.device)
    _row_mean_kernel[(n_rows,)](rows, mean, n_cols, rows.stride(0), BLOCK=block,
                                num_warps=num_warps)
    _row_var_kernel[(n_rows,)](rows, mean, var, n_cols, rows.stride(0), BLOCK=block,
                               num_warps=num_warps)
    t = empty(x.shape, x.dtype, x.device)
    _normalise_kernel[(n_rows, cdiv(n_cols, block))](
        rows, mean, var, t, n_cols, rows.stride(0), float(eps), BLOCK=block, num_warps=num_warps)
    n = x.numel()
    for scale, p in ((True, weight), (False, bias)):
        if p is not None:
            out = empty(x.shape, x.dtype, x.device)
            _column_op_kernel[(cdiv(n, block),)](t, p, out, n, n_cols, SCALE=scale, BLOCK=block,
                                                 num_warps=num_warps)
            t = out
    return t


def layer_norm(x: torch.Tensor, weight=None, bias=None, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dim of x in fused Triton kernels; differentiable.

    x: float32, float16 or bfloat16, at least 1-D, on CUDA (or on the CPU under TRITON_INTERPRET=1),
    last dim contiguous. weight, bias: None or contiguous (N,) tensors of x's dtype and device, N
    = x.shape[-1]. Statistics and math in float32; output (and gradients) in x's dtype."""
    return triton_fused(x, weight, bias, eps)
