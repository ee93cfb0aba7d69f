"""LayerNorm's fused backward. Per row,
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
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..._buffers import empty, empty_like, scratch
from ..._device import sm_count_of
from ..._tiles import cdiv, next_pow2
from ..._plans import cached, layout_key, plan_cache
from ..._launch import launch

# Longest row the backward keeps whole in registers (x, dy and two partial-sum rows); wider rows
# take the split kernel, BWD_SPLIT_BLOCK columns a program.
BWD_MAX_ONE_TILE = 8192
BWD_SPLIT_BLOCK = 8192
# Register tiles are [ROWS, BLOCK] with ROWS > 1 (at most MAX_TILE_ROWS) for rows shorter than
# BWD_TILE elements; the warps and the prefetch per tile are in `bwd_plan` (ptxas's register
# counts for sm_90, no spills).
BWD_TILE = 4096
MAX_TILE_ROWS = 64
# Groups: one program per SM, all resident at once, but at least MIN_ROWS_PER_GROUP rows each, so
# the partial sums (2 x groups x N float32, written and read back) stay small next to x, dy and dx
# (16 * groups / (6 * rows) of them in 16-bit dtypes: 9% at 4096 rows).
GROUPS_PER_SM = 1
MIN_ROWS_PER_GROUP = 8
# Elements a program of the kernel that sums the partials over groups loads per step
# (REDUCE_TILE // BLOCK_N groups of BLOCK_N columns).
REDUCE_TILE = 4096

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
# Plan and launch.


class _BwdPlan(NamedTuple):
    block: int  # the row (one_tile) or the column segment of a split program
    rows: int
    num_warps: int
    one_tile: bool
    prefetch: bool


@functools.lru_cache(maxsize=None)
def bwd_plan(n_cols: int, itemsize: int, block=None, num_warps=None) -> _BwdPlan:
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
        # Unvectorised loads (see forward.fwd_plan): half the tile, and 32 warps at 8192, to keep the
        # spills away (8192 still spills 128 bytes a thread).
        tile = BWD_TILE // 2
        if num_warps is None and block >= 8192:
            num_warps = 32
    rows = max(1, min(MAX_TILE_ROWS, tile // block))
    if num_warps is None:
        num_warps = max(1, min(16, rows * block // 256))
    prefetch = block <= 4096 and rows * block * itemsize <= 16 * 1024
    return _BwdPlan(block, rows, num_warps, True, prefetch)


def bwd_groups(n_rows: int, device=None) -> int:
    """Number of programs (row groups, partial-sum rows) the backward uses for n_rows rows by
    default: one per SM, at least MIN_ROWS_PER_GROUP rows each. (The split kernel, for rows over
    BWD_MAX_ONE_TILE, runs cdiv(N, BWD_SPLIT_BLOCK) programs per group, each owning a column
    segment of the same partial rows.)"""
    sms = sm_count_of(None if device is None else torch.device(device))
    return max(1, min(GROUPS_PER_SM * sms, cdiv(n_rows, MIN_ROWS_PER_GROUP)))


class _BwdLaunch(NamedTuple):
    """How `backward` runs one layout (cached): the rows, x's row stride, the plan, the groups,
    the partial buffers and the column tile of the sum over groups."""

    n_rows: int
    n_cols: int
    x_row_stride: int
    plan: _BwdPlan
    groups: int
    n_parts: int
    block_n: int


def _bwd_launch(dy, x, block, num_warps, groups, need_dw, need_db) -> _BwdLaunch | None:
    """The backward's plan for this layout of x and dy; None where x is empty. Raises where dy
    cannot be read as x's rows."""
    # x was checked by the forward (this is the host path of every backward call: kept short).
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols if n_cols else math.prod(x.shape[:-1])
    if not x.numel():
        return None
    rows = x.view(n_rows, n_cols)
    dy.contiguous().view(n_rows, n_cols)  # dy holds x's rows (else raises as the view would)
    plan = bwd_plan(n_cols, x.element_size(), block, num_warps)
    # At most one group a row: every group has rows, so every partial row gets written.
    groups = bwd_groups(n_rows, x.device) if groups is None else min(groups, n_rows)
    # A contiguous x's rows are n_cols apart (whatever the strides of its size-1 dims).
    return _BwdLaunch(n_rows, n_cols, n_cols if x.is_contiguous() else rows.stride(0), plan,
                      groups, int(need_dw) + int(need_db),
                      min(128, max(32, next_pow2(n_cols) // 128)))


_PLANS = plan_cache()


def backward(dy, x, weight, stats, need_dw, need_db, block, num_warps, groups, db_dtype=None,
             shared_dwdb=False):
    """(dx, dweight or None, dbias or None) of the fused LayerNorm; dweight in weight's dtype,
    dbias in db_dtype (the bias's: default x's). The plan is remembered per layout of x, dy and
    weight. shared_dwdb: dweight and dbias of one dtype may be two views of one allocation (an
    autograd.Function may return such gradients; a custom op's outputs must not alias)."""
    db_dtype = x.dtype if db_dtype is None else db_dtype
    key = layout_key((x, dy, weight), (block, num_warps, groups))
    how = cached(_PLANS, None if key is None else (key, need_dw, need_db), _bwd_launch, dy, x,
                 block, num_warps, groups, need_dw, need_db)
    dx = empty_like(x)
    if how is None:  # no rows: dx is empty, the column sums are zeros
        n_cols = x.shape[-1]
        return (dx, torch.zeros(n_cols, dtype=weight.dtype, device=x.device) if need_dw else None,
                torch.zeros(n_cols, dtype=db_dtype, device=x.device) if need_db else None)
    # x, dy and dx are passed as they are (dy and dx contiguous): the kernels see their rows
    # through the row strides.
    dy = dy.contiguous()
    n_rows, n_cols, _, plan, groups, n_parts, block_n = how
    # Partial sums: buffer 0 dweight, then dbias (only those needed); every (group, column) slot
    # is written by exactly one program. (part[0] starts where part does.) A scratch buffer
    # reused across calls: this runs on the autograd worker thread, where allocations are dear.
    part, part_k = scratch((n_parts, groups, n_cols), torch.float32, x.device) if n_parts \
        else (x, None)
    has_w = weight is not None
    args = (x, dy, dx, weight if has_w else x, stats, part if need_dw else x,
            (part_k[1] if need_dw else part) if need_db else x, n_rows, n_cols, groups,
            how.x_row_stride, n_cols, n_cols)
    # No FMA contraction (see the module docstring).
    if plan.one_tile:
        launch(_ln_bwd_kernel, (groups,), *args, HAS_W=has_w, DW=need_dw, DB=need_db,
               ROWS=plan.rows, BLOCK=plan.block, PREFETCH=plan.prefetch, num_warps=plan.num_warps,
               enable_fp_fusion=False)
    else:
        launch(_ln_bwd_split_kernel, (cdiv(n_cols, plan.block), groups), *args, HAS_W=has_w,
               DW=need_dw, DB=need_db, BLOCK=plan.block, num_warps=plan.num_warps,
               enable_fp_fusion=False)
    if n_parts == 0:
        return dx, None, None
    if shared_dwdb and need_dw and need_db and weight.dtype == db_dtype:
        dw, db = empty((2, n_cols), db_dtype, x.device).unbind(0)  # one allocation, two views
    else:
        dw = empty((n_cols,), weight.dtype, x.device) if need_dw else None
        db = empty((n_cols,), db_dtype, x.device) if need_db else None
    launch(_sum_groups_kernel, (cdiv(n_cols, block_n), n_parts), part, x if dw is None else dw,
           x if db is None else db, groups, n_cols, DW=need_dw, DB=need_db,
           BLOCK_G=REDUCE_TILE // block_n, BLOCK_N=block_n, num_warps=4)
    return dx, dw, db
