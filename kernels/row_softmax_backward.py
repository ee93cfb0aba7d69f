"""Softmax's backward, fused: dx = y * (dy - sum(y * dy)) per row, from the saved output y.

Memory-bound: reads y and dy once and writes dx once (three tensors' bytes), where eager PyTorch's
`_softmax_backward_data` does the same in one kernel and an unfused version would store y * dy
and the row sums between steps. Rows of up to MAX_ONE_TILE elements are held in registers, ROWS
rows a program; longer rows are read twice in LOOP_BLOCK tiles (a pass for the row's sum, a pass
to write), the second read mostly from L2.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import as_rows, cdiv, check_same, empty, launch, next_pow2

MAX_ONE_TILE = 16384
LOOP_BLOCK = 4096
# Elements a program holds (ROWS rows of a short row length).
TILE = 4096


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
                             BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
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


def reference(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """The semantics, in PyTorch eager (what autograd runs for torch.softmax)."""
    return torch.ops.aten._softmax_backward_data(dy, y, -1, y.dtype)


def softmax_backward(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dx of softmax over the last dim, given its output y and the incoming gradient dy (one shape
    and dtype; last dims contiguous). Math in float32, dx in y's dtype."""
    y_rows, n_rows, n_cols = as_rows("y", y)
    dy_rows, _, _ = as_rows("dy", dy)
    check_same([("y", y), ("dy", dy)])
    if dy.shape != y.shape:
        raise ValueError(f"dy must have y's shape {tuple(y.shape)}, got {tuple(dy.shape)}")
    dx = empty(y.shape, y.dtype, y.device)
    if y_rows is None:
        return dx
    dx_rows = dx.view(n_rows, n_cols)
    strides = (y_rows.stride(0), dy_rows.stride(0), dx_rows.stride(0))
    if n_cols <= MAX_ONE_TILE:
        block = max(16, next_pow2(n_cols))
        rows = max(1, TILE // block)
        warps = max(1, min(16, rows * block // 256))
        launch(_softmax_bwd_kernel, (cdiv(n_rows, rows),), y_rows, dy_rows, dx_rows, n_rows, n_cols,
               *strides, ROWS=rows, BLOCK=block, num_warps=warps)
    else:
        launch(_softmax_bwd_loop_kernel, (n_rows,), y_rows, dy_rows, dx_rows, n_cols, *strides,
               BLOCK=LOOP_BLOCK, num_warps=16)
    return dx
