"""The batched matmul the unfused paths run (softmax(X) @ V's and attention's): c[b] = alpha *
a[b] @ b[b], one Triton kernel, float32 accumulation, any strides."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._buffers import empty
from ._tiles import cdiv
from ._dot import dot as _dot
from ._dot import upcast_bf16 as _upcast_bf16
from ._launch import launch

DOT_MIN = " (tl.dot's minimum)"


@triton.jit
def _bmm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sa_b, sa_m, sa_k, sb_b, sb_k, sb_n, sc_b, sc_m, sc_n,
                alpha, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """c[b] = alpha * a[b] @ b[b], float32 accumulation, any strides (so b may be a transpose)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    bi = tl.program_id(2).to(tl.int64)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K).to(tl.int64)
    a_rows = a_ptr + bi * sa_b + rm[:, None] * sa_m
    b_cols = b_ptr + bi * sb_b + rn[None, :] * sb_n
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in tl.range(0, K, BLOCK_K):
        ks = start + rk
        a = tl.load(a_rows + ks[None, :] * sa_k, mask=(rm[:, None] < M) & (ks[None, :] < K),
                    other=0.0)
        bt = tl.load(b_cols + ks[:, None] * sb_k, mask=(ks[:, None] < K) & (rn[None, :] < N),
                     other=0.0)
        acc = _dot(a, bt, acc, INPUT_PRECISION, UPCAST)
    tl.store(c_ptr + bi * sc_b + rm[:, None] * sc_m + rn[None, :] * sc_n,
             (acc * alpha).to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def _bmm(a: torch.Tensor, b: torch.Tensor, *, alpha: float = 1.0, input_precision="ieee",
         block_m=64, block_n=64, block_k=32, num_warps=4, num_stages=3) -> torch.Tensor:
    """a @ b for 3-D a (batch, M, K) and b (batch, K, N), output in a's dtype."""
    batch, m, k = a.shape
    n = b.shape[2]
    c = empty((batch, m, n), a.dtype, a.device)
    grid = (cdiv(m, block_m), cdiv(n, block_n), batch)
    launch(_bmm_kernel, grid, a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(), float(alpha),
           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, INPUT_PRECISION=input_precision,
           UPCAST=_upcast_bf16(a.dtype), num_warps=num_warps, num_stages=num_stages)
    return c
