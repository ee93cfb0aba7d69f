"""Softmax's backward: dx = y * (dy - sum(y * dy)) per row, from the saved output y.

Memory-bound. Fused (`triton_fused`, the kernel the registered op runs), y and dy are read once
and dx written once (three tensors' bytes), as eager PyTorch's `_softmax_backward_data` does in
one kernel. Rows of up to MAX_ONE_TILE elements are held in registers, ROWS rows a program
("one_tile"); longer rows are read twice in tiles of LOOP_TILES (a pass for the row's sum, a pass
to write: "two_pass"), the second read mostly from L2.

Unfused (`triton_unfused`, the apples-to-apples baseline): a row-sum kernel stores each row's
sum(y * dy) in float32, then an elementwise kernel reads y, dy and the sums and writes dx: y and
dy are read twice (five tensors' bytes against three).
"""
from __future__ import annotations

import functools

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..._buffers import empty
from ..._checks import as_rows, check_same
from ..._tiles import cdiv, next_pow2, unfused_tile
from ..._launch import launch
from .forward import _row_bounds
from .planning import aligned_vector

MAX_ONE_TILE = 16384
# Tiles of the two-pass kernel, 32 warps: float32 rows take the largest; 16-bit rows the largest
# that leaves at most LOOP_MAX_PAD of the padded row masked (a half-masked last tile costs more
# than a smaller tile; docs/softmax.md has the sweep).
LOOP_TILES = (16384, 8192, 4096)
LOOP_MAX_PAD = 0.15
LOOP_WARPS = 32
# Elements a program holds (ROWS rows of a short row length).
TILE = 4096

ONE_TILE, TWO_PASS = "one_tile", "two_pass"


@triton.jit
def _softmax_bwd_kernel(y_ptr, dy_ptr, dx_ptr, n_rows, n_cols, y_stride, dy_stride, dx_stride,
                        ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    y = tl.load(y_ptr + rows[:, None] * y_stride + cols[None, :], mask=mask, other=0.0)
    dy = tl.load(dy_ptr + rows[:, None] * dy_stride + cols[None, :], mask=mask, other=0.0)
    y = y.to(tl.float32)
    dy = dy.to(tl.float32)
    dot = tl.sum(y * dy, axis=1)
    dx = y * (dy - dot[:, None])
    tl.store(dx_ptr + rows[:, None] * dx_stride + cols[None, :], dx.to(dx_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _softmax_bwd_loop_kernel(y_ptr, dy_ptr, dx_ptr, n_cols, y_stride, dy_stride, dx_stride,
                             BLOCK: tl.constexpr, VEC: tl.constexpr):
    """VEC > 1: one row stride and 16-byte aligned bases, the rows walked in aligned coordinates
    (as the forward's online kernel)."""
    row = tl.program_id(0).to(tl.int64)
    if VEC > 1:
        start = row * y_stride
        lead = start % VEC
        base = tl.multiple_of(start - lead, VEC)
        _aligned_bwd_row(y_ptr + base, dy_ptr + base, dx_ptr + base, lead, n_cols, BLOCK, VEC)
        return
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        mask = offs < n_cols
        y = tl.load(y_ptr + row * y_stride + offs, mask=mask, other=0.0,
                    eviction_policy="evict_last")
        dy = tl.load(dy_ptr + row * dy_stride + offs, mask=mask, other=0.0,
                     eviction_policy="evict_last")
        acc += y.to(tl.float32) * dy.to(tl.float32)
    dot = tl.sum(acc, axis=0)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        mask = offs < n_cols
        y = tl.load(y_ptr + row * y_stride + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * dy_stride + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + row * dx_stride + offs, (y * (dy - dot)).to(dx_ptr.dtype.element_ty),
                 mask=mask)


@triton.jit
def _aligned_bwd_row(y_al, dy_al, dx_al, lead, n, BLOCK: tl.constexpr, VEC: tl.constexpr):
    """dx of the row at [lead, lead + n) past the VEC-aligned y_al, dy_al, dx_al: the sum over
    whole aligned vectors (the elements around the row read and zeroed), then dx's whole vectors
    with 16-byte accesses and its partial vectors at either end element by element."""
    cols = tl.arange(0, BLOCK)
    end, end_v, lo, hi = _row_bounds(lead, n, VEC)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, end_v, BLOCK):
        k = start + cols
        y = tl.load(y_al + k, mask=k < end_v, other=0.0, eviction_policy="evict_last")
        dy = tl.load(dy_al + k, mask=k < end_v, other=0.0, eviction_policy="evict_last")
        acc += tl.where((k >= lead) & (k < end), y.to(tl.float32) * dy.to(tl.float32), 0.0)
    dot = tl.sum(acc, axis=0)
    for start in range(0, hi, BLOCK):
        k = start + cols
        _write_dx(y_al, dy_al, dx_al, k, (k >= lo) & (k < hi), dot)
    e = tl.arange(0, VEC)
    _write_dx(y_al, dy_al, dx_al, e, (e >= lead) & (e < lo) & (e < end), dot)
    _write_dx(y_al, dy_al, dx_al, hi + e, (hi + e >= lo) & (hi + e < end), dot)


@triton.jit
def _write_dx(y_al, dy_al, dx_al, k, part, dot):
    y = tl.load(y_al + k, mask=part, other=0.0).to(tl.float32)
    dy = tl.load(dy_al + k, mask=part, other=0.0).to(tl.float32)
    tl.store(dx_al + k, (y * (dy - dot)).to(dx_al.dtype.element_ty), mask=part)


def reference(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """The semantics, in PyTorch eager (what autograd runs for torch.softmax)."""
    return torch.ops.aten._softmax_backward_data(dy, y, -1, y.dtype)


class Plan(NamedTuple):
    """How `softmax_backward` runs a row length: which kernel, its block (the padded row, or the
    loop's tile), rows per program and warps."""

    path: str
    block: int
    rows: int
    num_warps: int


@functools.lru_cache(maxsize=None)
def plan(n_cols: int, itemsize: int = 4) -> Plan:
    if n_cols <= MAX_ONE_TILE:
        block = max(16, next_pow2(n_cols))
        rows = max(1, TILE // block)
        return Plan(ONE_TILE, block, rows, max(1, min(16, rows * block // 256)))
    block = LOOP_TILES[0] if itemsize == 4 else next(
        (b for b in LOOP_TILES if cdiv(n_cols, b) * b - n_cols <= LOOP_MAX_PAD * cdiv(n_cols, b) * b),
        LOOP_TILES[-1])
    return Plan(TWO_PASS, block, 1, LOOP_WARPS)


def _check_pair(y: torch.Tensor, dy: torch.Tensor):
    """y and dy as rows (None when empty), after checking they match; and the row count and length."""
    y_rows, n_rows, n_cols = as_rows("y", y)
    dy_rows, _, _ = as_rows("dy", dy)
    check_same([("y", y), ("dy", dy)])
    if dy.shape != y.shape:
        raise ValueError(f"dy must have y's shape {tuple(y.shape)}, got {tuple(dy.shape)}")
    return y_rows, dy_rows, n_rows, n_cols


def softmax_backward(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dx of softmax over the last dim, given its output y and the incoming gradient dy (one shape
    and dtype; last dims contiguous). Math in float32, dx in y's dtype."""
    y_rows, dy_rows, n_rows, n_cols = _check_pair(y, dy)
    return _backward_rows(y, y_rows, dy_rows, n_rows, n_cols)


def own_output_backward(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """softmax_backward for the autograd Function's own y (contiguous, as the forward writes it)
    and a gradient of y's shape and dtype: the checks are skipped (host time on every backward)
    where both are contiguous, else made."""
    if not (dy.shape == y.shape and dy.dtype == y.dtype and y.is_contiguous()
            and dy.is_contiguous() and y.numel()):
        return softmax_backward(y, dy)
    n_cols = y.shape[-1]
    n_rows = y.numel() // n_cols
    return _backward_rows(y, y.view(n_rows, n_cols), dy.view(n_rows, n_cols), n_rows, n_cols)


def _backward_rows(y, y_rows, dy_rows, n_rows, n_cols) -> torch.Tensor:
    dx = empty(y.shape, y.dtype, y.device)
    if y_rows is None:
        return dx
    dx_rows = dx.view(n_rows, n_cols)
    strides = (y_rows.stride(0), dy_rows.stride(0), dx_rows.stride(0))
    p = plan(n_cols, y.element_size())
    if p.path == ONE_TILE:
        launch(_softmax_bwd_kernel, (cdiv(n_rows, p.rows),), y_rows, dy_rows, dx_rows, n_rows,
               n_cols, *strides, ROWS=p.rows, BLOCK=p.block, num_warps=p.num_warps)
    else:
        launch(_softmax_bwd_loop_kernel, (n_rows,), y_rows, dy_rows, dx_rows, n_cols, *strides,
               BLOCK=p.block, VEC=aligned_vector(n_cols, strides, (y_rows, dy_rows, dx_rows)),
               num_warps=p.num_warps)
    return dx


triton_fused = softmax_backward


# ------------------------------------------------------------------------------------------------
# The unfused baseline: the row sums stored between two kernels.


@triton.jit
def _row_dot_kernel(y_ptr, dy_ptr, dot_ptr, n_cols, y_stride, dy_stride, BLOCK: tl.constexpr):
    """dot[row] = sum(y * dy) over the row, in float32."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    # Lane-wise sums across tiles, one reduction at the end.
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        mask = offs < n_cols
        y = tl.load(y_ptr + row * y_stride + offs, mask=mask, other=0.0)
        dy = tl.load(dy_ptr + row * dy_stride + offs, mask=mask, other=0.0)
        acc += y.to(tl.float32) * dy.to(tl.float32)
    tl.store(dot_ptr + row, tl.sum(acc, axis=0))


@triton.jit
def _scale_by_residual_kernel(y_ptr, dy_ptr, dot_ptr, dx_ptr, n_cols, y_stride, dy_stride,
                              dx_stride, BLOCK: tl.constexpr):
    """dx = y * (dy - dot[row]), one tile of one row a program."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    dot = tl.load(dot_ptr + row)
    y = tl.load(y_ptr + row * y_stride + offs, mask=mask).to(tl.float32)
    dy = tl.load(dy_ptr + row * dy_stride + offs, mask=mask).to(tl.float32)
    tl.store(dx_ptr + row * dx_stride + offs, (y * (dy - dot)).to(dx_ptr.dtype.element_ty),
             mask=mask)


def triton_unfused(y: torch.Tensor, dy: torch.Tensor, *, block=None, num_warps=None) -> torch.Tensor:
    """Two Triton kernels: the row sums of y * dy (stored, float32), then dx = y * (dy - sum).
    block: the tile of both kernels (any row length)."""
    y_rows, dy_rows, n_rows, n_cols = _check_pair(y, dy)
    block, num_warps = unfused_tile(n_cols, block, num_warps)
    dx = empty(y.shape, y.dtype, y.device)
    if y_rows is None:
        return dx
    dx_rows = dx.view(n_rows, n_cols)
    dot = empty((n_rows,), torch.float32, y.device)
    launch(_row_dot_kernel, (n_rows,), y_rows, dy_rows, dot, n_cols, y_rows.stride(0),
           dy_rows.stride(0), BLOCK=block, num_warps=num_warps)
    launch(_scale_by_residual_kernel, (n_rows, cdiv(n_cols, block)), y_rows, dy_rows, dot, dx_rows,
           n_cols, y_rows.stride(0), dy_rows.stride(0), dx_rows.stride(0), BLOCK=block,
           num_warps=num_warps)
    return dx
