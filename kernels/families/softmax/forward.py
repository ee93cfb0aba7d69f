"""Softmax over the last dim, any row length: `exp(x - max) / sum(exp(x - max))` per row.

The input is viewed as rows (all leading dims flattened); the math runs in float32 and the output,
of x's shape and dtype, is rounded once at the store.

Unfused (three kernels) the row max and the row sum are separate passes over x and the
exponentials are recomputed for the output: x is read three times and written once (4N element
moves). Fused, `plan` (in `planning`, with the thresholds it reads) picks one of four paths:

- "one_pass": one program per row holds the whole row in registers: x read once, written once (2N).
  Up to MAX_ONE_PASS elements, the longest row 16 warps hold without spilling.
- "online": one program per row loops over tiles keeping a running max m and sum s (rescaling s
  when m grows), then a second loop writes exp(x - m) / s: x read twice (3N). The second loop walks
  the tiles backwards, so the tiles read last, the likeliest still in L2, are read again first.
  The default for rows of up to ONLINE_MAX_ROW_BYTES (and for wide 16-bit rows, and float32 rows
  the coop kernel could not load in vectors): with one row per SM in flight, most of the second read
  comes from L2. 16-bit rows that are not whole vectors are walked in 16-byte aligned coordinates
  (VEC, `vector_width`), so that their loads and stores stay vectorised.
- "coop": longer float32 rows, where Triton loads them in vectors (COOP_ALIGN: a width and row
  stride of 16-element multiples, an aligned base). A persistent grid of one program per SM; each
  row is shared by a group of programs that each hold a chunk in registers, exchange their
  partial (max, sum) through memory, wait for each other at a per-row counter and write their
  chunk from registers: 2N, like one_pass, for rows of up to MAX_COOP_SPLITS * COOP_BLOCK
  elements.
- "split": for long rows and fewer rows than SMs, where one program per row would leave most of
  the GPU idle: several programs per row each reduce a chunk to a partial (max, sum), and a second
  kernel combines a row's partials and writes its chunk. Also 3N, but the whole GPU works; when the
  tensor fits in L2, the second read comes from there.

An all -inf row gives NaN, as torch.softmax does (there is no max to subtract); a row with some
-inf gives exact zeros there. A NaN or +inf in a row makes that row NaN, as in torch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._buffers import empty, empty_like
from ..._checks import as_rows
from ..._device import interpreting, sm_count_of
from ..._tiles import cdiv, next_pow2, unfused_tile
from ..._plans import cached, layout_key, plan_cache
from ..._launch import launch
from .planning import COOP, ONE_PASS, ONLINE, SPLIT, Plan, plan  # noqa: F401 - SPLIT: callers'

# A constexpr: the only kind of global a @triton.jit function may read.
NEG_INF = tl.constexpr(float("-inf"))


def reference(x: torch.Tensor) -> torch.Tensor:
    """The semantics, in PyTorch eager."""
    return torch.softmax(x, -1)


# ------------------------------------------------------------------------------------------------
# Shared pieces of the fused kernels.


@triton.jit
def _online_step(m, s, x):
    """The running (max, sum of exp(x - max)) after one more tile x."""
    m_new = tl.maximum(m, tl.max(x, axis=0))
    # Until a finite value is seen m_new is -inf and x - m_new would be NaN; shifting by 0
    # instead keeps s at exactly 0 (exp(-inf) = 0) and the rescale factor finite.
    shift = tl.where(m_new == NEG_INF, 0.0, m_new)
    return m_new, s * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), axis=0)


@triton.jit
def _online_max_sum(x_row, start, end, BLOCK: tl.constexpr):
    """Running (max, sum of exp(x - max)) over x_row[start:end], tile by tile."""
    cols = tl.arange(0, BLOCK)
    m = tl.full((), NEG_INF, tl.float32)
    s = tl.full((), 0.0, tl.float32)
    for tile_start in range(start, end, BLOCK):
        offs = tile_start + cols
        # evict_last: the row is read again by the write loop; ask L2 to keep it.
        x = tl.load(x_row + offs, mask=offs < end, other=NEG_INF,
                    eviction_policy="evict_last").to(tl.float32)
        m, s = _online_step(m, s, x)
    return m, s


@triton.jit
def _write_normalised(x_row, out_row, start, end, m, s, BLOCK: tl.constexpr):
    """out_row[start:end] = exp(x - m) / s, walking the tiles last to first (see docstring)."""
    cols = tl.arange(0, BLOCK)
    inv_s = 1.0 / s  # one division per row; a multiply per element
    n_tiles = tl.cdiv(end - start, BLOCK)
    for i in range(0, n_tiles):
        offs = start + (n_tiles - 1 - i) * BLOCK + cols
        mask = offs < end
        # evict_first: this is the row's last read.
        x = tl.load(x_row + offs, mask=mask, other=NEG_INF,
                    eviction_policy="evict_first").to(tl.float32)
        # An all -inf row has m = -inf: x - m is NaN, the row NaN, as in torch.
        y = tl.exp(x - m) * inv_s
        tl.store(out_row + offs, y.to(out_row.dtype.element_ty), mask=mask)


@triton.jit
def _row_bounds(lead, n, VEC: tl.constexpr):
    """A row of n elements starting `lead` elements past a VEC-aligned address, in coordinates
    from that address: (its end, the end of its last vector, the start of its first whole
    vector, the end of its last whole vector). The last three are multiples of VEC, so masks
    against them hold for whole vectors and the accesses they guard are vectorised."""
    end = lead + n
    return end, tl.cdiv(end, VEC) * VEC, tl.cdiv(lead, VEC) * VEC, (end // VEC) * VEC


@triton.jit
def _aligned_max_sum(x_al, lead, n, BLOCK: tl.constexpr, VEC: tl.constexpr):
    """_online_max_sum of the row x_al[lead:lead + n], x_al VEC-aligned: every load a whole
    aligned vector, the elements around the row (its neighbours', or past the last row but
    within its 16-byte vector) read and set to -inf."""
    cols = tl.arange(0, BLOCK)
    end, end_v, _, _ = _row_bounds(lead, n, VEC)
    m = tl.full((), NEG_INF, tl.float32)
    s = tl.full((), 0.0, tl.float32)
    for tile_start in range(0, end_v, BLOCK):
        k = tile_start + cols
        x = tl.load(x_al + k, mask=k < end_v, other=NEG_INF,
                    eviction_policy="evict_last").to(tl.float32)
        m, s = _online_step(m, s, tl.where((k >= lead) & (k < end), x, NEG_INF))
    return m, s


@triton.jit
def _aligned_write(x_al, out_al, lead, n, m, s, BLOCK: tl.constexpr, VEC: tl.constexpr):
    """_write_normalised of the row at x_al[lead:lead + n] into out_al (the same offsets): the
    row's whole vectors in tiles, last to first, with 16-byte accesses; then its partial vectors
    at either end, element by element (a store must not touch the neighbouring rows)."""
    cols = tl.arange(0, BLOCK)
    inv_s = 1.0 / s
    end, _, lo, hi = _row_bounds(lead, n, VEC)
    n_tiles = tl.cdiv(hi, BLOCK)
    for i in range(0, n_tiles):
        k = (n_tiles - 1 - i) * BLOCK + cols
        body = (k >= lo) & (k < hi)
        x = tl.load(x_al + k, mask=body, other=NEG_INF,
                    eviction_policy="evict_first").to(tl.float32)
        tl.store(out_al + k, (tl.exp(x - m) * inv_s).to(out_al.dtype.element_ty), mask=body)
    e = tl.arange(0, VEC)
    _write_part(x_al, out_al, e, (e >= lead) & (e < lo) & (e < end), m, inv_s)
    _write_part(x_al, out_al, hi + e, (hi + e >= lo) & (hi + e < end), m, inv_s)


@triton.jit
def _write_part(x_al, out_al, k, part, m, inv_s):
    x = tl.load(x_al + k, mask=part, other=NEG_INF).to(tl.float32)
    tl.store(out_al + k, (tl.exp(x - m) * inv_s).to(out_al.dtype.element_ty), mask=part)


@triton.jit
def _softmax_one_pass_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride,
                             BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    # -inf in the padding: it never wins the max and its exp is 0.
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=NEG_INF).to(tl.float32)
    m = tl.max(x, axis=0)
    e = tl.exp(x - m)
    y = e * (1.0 / tl.sum(e, axis=0))
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_online_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride,
                           BLOCK: tl.constexpr, VEC: tl.constexpr):
    """VEC > 1 (elements in 16 bytes): x and out have 16-byte aligned bases and one row stride,
    and the rows are walked in VEC-aligned coordinates. At a row length that is not a multiple
    of VEC the plain masked tiles compile to 2-byte accesses (16-bit rows; docs/softmax.md)."""
    row = tl.program_id(0).to(tl.int64)
    if VEC == 1:
        x_row = x_ptr + row * x_row_stride
        m, s = _online_max_sum(x_row, 0, n_cols, BLOCK)
        _write_normalised(x_row, out_ptr + row * out_row_stride, 0, n_cols, m, s, BLOCK)
    else:
        start = row * x_row_stride
        lead = start % VEC
        base = tl.multiple_of(start - lead, VEC)
        m, s = _aligned_max_sum(x_ptr + base, lead, n_cols, BLOCK, VEC)
        _aligned_write(x_ptr + base, out_ptr + base, lead, n_cols, m, s, BLOCK, VEC)


@triton.jit
def _softmax_split_partial_kernel(x_ptr, pmax_ptr, psum_ptr, n_cols, x_row_stride, chunk, n_splits,
                                  BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    start = split * chunk
    end = tl.minimum(start + chunk, n_cols)
    m, s = _online_max_sum(x_ptr + row * x_row_stride, start, end, BLOCK)
    tl.store(pmax_ptr + row * n_splits + split, m)
    tl.store(psum_ptr + row * n_splits + split, s)


@triton.jit
def _softmax_split_write_kernel(x_ptr, out_ptr, pmax_ptr, psum_ptr, n_cols, x_row_stride,
                                out_row_stride, chunk, n_splits, SPLITS_P2: tl.constexpr,
                                BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    # Every program of a row combines the row's few partials itself: cheaper than a third kernel.
    idx = tl.arange(0, SPLITS_P2)
    pmask = idx < n_splits
    pm = tl.load(pmax_ptr + row * n_splits + idx, mask=pmask, other=NEG_INF)
    ps = tl.load(psum_ptr + row * n_splits + idx, mask=pmask, other=0.0)
    m = tl.max(pm, axis=0)
    # A chunk (or padding) with partial max -inf has partial sum 0 and adds exactly 0.
    s = tl.sum(ps * tl.exp(pm - m), axis=0)
    start = split * chunk
    end = tl.minimum(start + chunk, n_cols)
    _write_normalised(x_ptr + row * x_row_stride, out_ptr + row * out_row_stride, start, end, m, s,
                      BLOCK)


@triton.jit
def _softmax_coop_kernel(x_ptr, out_ptr, pmax_ptr, psum_ptr, count_ptr, n_rows, n_cols,
                         x_row_stride, out_row_stride, chunk, SPLITS: tl.constexpr,
                         GROUPS: tl.constexpr, BLOCK: tl.constexpr, ONE_TILE: tl.constexpr):
    """Persistent and co-operative: GROUPS x SPLITS programs, all resident at once (grid <= SMs).
    A group walks rows; its SPLITS programs each take a chunk of the row, publish their partial
    (max, sum), wait at a per-row counter for the others, combine, and normalise their chunk.
    ONE_TILE (chunk <= BLOCK): the chunk stays in registers across the wait, so x is read from
    memory exactly once. Otherwise the chunk is read twice, the second time while it is still in
    L2 (the chunks in flight fit the L2 by construction).

    The wait assumes a row's SPLITS programs all get an SM eventually, which holds with one
    program per SM on the whole device; where fewer SMs are usable than the device reports (an
    MPS active-thread limit), pass path="online" instead."""
    pid = tl.program_id(0)
    group = pid // SPLITS
    split = pid % SPLITS
    start = split * chunk
    end = tl.minimum(start + chunk, n_cols)
    idx = tl.arange(0, SPLITS)
    cols = tl.arange(0, BLOCK)
    for row in range(group, n_rows, GROUPS):
        row64 = tl.zeros((), tl.int64) + row  # 64-bit offsets (also under the interpreter)
        x_row = x_ptr + row64 * x_row_stride
        if ONE_TILE:
            offs = start + cols
            mask = offs < end
            x = tl.load(x_row + offs, mask=mask, other=NEG_INF,
                        eviction_policy="evict_first").to(tl.float32)
            m = tl.max(x, axis=0)
            # An all -inf chunk: shift by 0, so s is exactly 0 (see _online_max_sum).
            s = tl.sum(tl.exp(x - tl.where(m == NEG_INF, 0.0, m)), axis=0)
        else:
            m, s = _online_max_sum(x_row, start, end, BLOCK)
        if SPLITS > 1:
            tl.store(pmax_ptr + row64 * SPLITS + split, m)
            tl.store(psum_ptr + row64 * SPLITS + split, s)
            # Release our partials, then wait until every split of the row has released its own.
            seen = tl.atomic_add(count_ptr + row64, 1, sem="acq_rel") + 1
            while seen < SPLITS:
                seen = tl.atomic_add(count_ptr + row64, 0, sem="acquire")
            pm = tl.load(pmax_ptr + row64 * SPLITS + idx, volatile=True)
            ps = tl.load(psum_ptr + row64 * SPLITS + idx, volatile=True)
            m = tl.max(pm, axis=0)
            s = tl.sum(ps * tl.exp(pm - m), axis=0)
        if ONE_TILE:
            # An all -inf row has m = -inf: x - m is NaN, the row NaN, as in torch.
            y = tl.exp(x - m) * (1.0 / s)
            tl.store(out_ptr + row64 * out_row_stride + offs, y.to(out_ptr.dtype.element_ty),
                     mask=mask)
        else:
            _write_normalised(x_row, out_ptr + row64 * out_row_stride, start, end, m, s, BLOCK)


# ------------------------------------------------------------------------------------------------
# The unfused baseline: three kernels, each intermediate stored.


@triton.jit
def _row_max_kernel(x_ptr, max_ptr, n_cols, x_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    # Lane-wise max across tiles, one reduction at the end.
    acc = tl.full([BLOCK], NEG_INF, tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        x = tl.load(x_ptr + row * x_row_stride + offs, mask=offs < n_cols, other=NEG_INF)
        acc = tl.maximum(acc, x.to(tl.float32))
    tl.store(max_ptr + row, tl.max(acc, axis=0))


@triton.jit
def _row_exp_sum_kernel(x_ptr, max_ptr, sum_ptr, n_cols, x_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = tl.load(max_ptr + row)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        x = tl.load(x_ptr + row * x_row_stride + offs, mask=offs < n_cols, other=NEG_INF)
        acc += tl.exp(x.to(tl.float32) - m)
    tl.store(sum_ptr + row, tl.sum(acc, axis=0))


@triton.jit
def _normalise_kernel(x_ptr, max_ptr, sum_ptr, out_ptr, n_cols, x_row_stride, out_row_stride,
                      BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    m = tl.load(max_ptr + row)
    inv_s = 1.0 / tl.load(sum_ptr + row)
    x = tl.load(x_ptr + row * x_row_stride + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + row * out_row_stride + offs,
             (tl.exp(x - m) * inv_s).to(out_ptr.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------------------------------
# Host side.


def _rows_plan(x, block, num_warps, path, splits) -> tuple[int, int, int | None, Plan]:
    """as_rows' checks and `plan`: (n_rows, n_cols, x's row stride or None when x is empty, Plan).
    The plan reads x's base alignment: a cache key for it must hold that too (triton_fused)."""
    rows, n_rows, n_cols = as_rows("x", x)
    # A contiguous x's rows are n_cols apart (whatever the strides of its size-1 dims).
    x_row_stride = None if rows is None else n_cols if x.is_contiguous() else rows.stride(0)
    p = plan(n_rows, n_cols, itemsize=x.element_size(), device=x.device, row_stride=x_row_stride,
             aligned=not x.data_ptr() & 15, block=block, num_warps=num_warps, path=path,
             splits=splits)
    if p.path == COOP and p.splits > 1 and interpreting():
        # A row's programs wait for each other; the interpreter runs one program at a time, so
        # the first would spin forever.
        raise ValueError(f"path='coop' with splits={p.splits} needs a GPU: under the interpreter "
                         "a row cannot be shared (use splits=1)")
    return n_rows, n_cols, x_row_stride, p


_PLANS = plan_cache()


def triton_fused(x: torch.Tensor, *, block=None, num_warps=None, path=None,
                 splits=None) -> torch.Tensor:
    """Fused softmax: one kernel (one_pass, online, coop) or two (split); see `plan` for the
    choice.

    block: for one_pass the register block (>= the row length rounded up to a power of two), else
    the tile of the loops (coop: a chunk of at most block elements is held in registers). path:
    force "one_pass", "online", "split" or "coop". splits: programs per row for the split and coop
    paths."""
    key = layout_key((x,), (block, num_warps, path, splits))
    if key is not None:  # a plain tensor: the plan also reads whether its base is aligned
        key += (not x.data_ptr() & 15,)
    n_rows, n_cols, x_row_stride, p = cached(_PLANS, key, _rows_plan, x, block, num_warps, path,
                                             splits)
    out = empty_like(x)
    if x_row_stride is None:
        return out
    # x and out are passed as they are: the kernels see their (rows, n_cols) layout through the
    # row strides (out is contiguous).
    args = (n_cols, x_row_stride, n_cols)
    if p.path == ONE_PASS:
        launch(_softmax_one_pass_kernel, (n_rows,), x, out, *args, BLOCK=p.block,
               num_warps=p.num_warps)
    elif p.path == ONLINE:
        launch(_softmax_online_kernel, (n_rows,), x, out, *args, BLOCK=p.block,
               VEC=p.vec, num_warps=p.num_warps)
    elif p.path == COOP:
        # One program per SM at most, launched co-operatively: CUDA starts the grid only when all
        # its programs can be resident at once, even beside another stream's kernels, so the
        # spin-wait for a row's other programs always returns.
        groups = max(1, min(n_rows, sm_count_of(x.device) // p.splits))
        pmax = torch.empty((n_rows, p.splits), dtype=torch.float32, device=x.device)
        psum = torch.empty((n_rows, p.splits), dtype=torch.float32, device=x.device)
        count = torch.zeros((n_rows,), dtype=torch.int32, device=x.device)
        launch(_softmax_coop_kernel, (groups * p.splits,), x, out, pmax, psum, count, n_rows,
               *args, p.chunk, SPLITS=p.splits, GROUPS=groups, BLOCK=p.block,
               ONE_TILE=p.chunk <= p.block, num_warps=p.num_warps, launch_cooperative_grid=True)
    else:
        # Every (row, split) slot is written by the first kernel.
        pmax = empty((n_rows, p.splits), torch.float32, x.device)
        psum = empty((n_rows, p.splits), torch.float32, x.device)
        grid = (n_rows, p.splits)
        launch(_softmax_split_partial_kernel, grid, x, pmax, psum, n_cols, x_row_stride, p.chunk,
               p.splits, BLOCK=p.block, num_warps=p.num_warps)
        launch(_softmax_split_write_kernel, grid, x, out, pmax, psum, *args, p.chunk, p.splits,
               SPLITS_P2=next_pow2(p.splits), BLOCK=p.block, num_warps=p.num_warps)
    return out


def triton_unfused(x: torch.Tensor, *, block=None, num_warps=None) -> torch.Tensor:
    """Three Triton kernels: row max (stored), row sum of exp(x - max) (stored), then
    out = exp(x - max) / sum. block: the tile of every kernel (any row length)."""
    rows, n_rows, n_cols = as_rows("x", x)
    block, num_warps = unfused_tile(n_cols, block, num_warps)
    out = empty(x.shape, x.dtype, x.device)
    if rows is None:
        return out
    out2 = out.view(n_rows, n_cols)
    row_max = empty((n_rows,), torch.float32, x.device)
    row_sum = empty((n_rows,), torch.float32, x.device)
    launch(_row_max_kernel, (n_rows,), rows, row_max, n_cols, rows.stride(0), BLOCK=block,
           num_warps=num_warps)
    launch(_row_exp_sum_kernel, (n_rows,), rows, row_max, row_sum, n_cols, rows.stride(0),
           BLOCK=block, num_warps=num_warps)
    launch(_normalise_kernel, (n_rows, cdiv(n_cols, block)), rows, row_max, row_sum, out2, n_cols,
           rows.stride(0), out2.stride(0), BLOCK=block, num_warps=num_warps)
    return out
