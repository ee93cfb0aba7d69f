"""The memory-traffic model: bytes each kernel of each implementation must read and write, and FLOPs.

Counts are the compulsory traffic of each kernel (every input read once, every output written
once), not measured bytes. Achieved GB/s in the data divides `bytes_model`, the fused (fewest
possible) bytes of the op, by the measured time, so every implementation is scored against the
same work; `bytes_impl` is what that implementation's own kernels move by this model.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

# Which implementations keep intermediates on chip (one kernel) and which round-trip them.
FUSED_IMPLS = {"torch_compile", "triton_fused"}
UNFUSED_IMPLS = {"torch_eager", "triton_unfused"}


@dataclass(frozen=True)
class Kernel:
    name: str
    read: int  # bytes
    written: int  # bytes
    flops: float = 0  # the kernel's matmul FLOPs (elementwise work is left out: never the limit)

    @property
    def total(self) -> int:
        return self.read + self.written


def add_mul_kernels(n: int, itemsize: int, z_kind: str, fused: bool) -> list[Kernel]:
    """(x + y) * z over n elements. z_kind: 'tensor' (n elements) or 'scalar' (a register)."""
    if z_kind not in ("tensor", "scalar"):
        raise ValueError(f"z_kind must be 'tensor' or 'scalar', got {z_kind!r}")
    z_bytes = n * itemsize if z_kind == "tensor" else 0
    e = n * itemsize
    if fused:
        return [Kernel("(x + y) * z", read=2 * e + z_bytes, written=e)]
    return [Kernel("t = x + y", read=2 * e, written=e), Kernel("t * z", read=e + z_bytes, written=e)]


def add_mul_bytes(n: int, itemsize: int, z_kind: str, impl: str) -> int:
    fused = impl in FUSED_IMPLS
    return sum(k.total for k in add_mul_kernels(n, itemsize, z_kind, fused))


def add_mul_flops(n: int) -> int:
    return 2 * n


def add_mul_table(n: int, itemsize: int) -> pd.DataFrame:
    """One row per kernel of each variant: what the report's traffic table shows."""
    rows = []
    for z_kind in ("tensor", "scalar"):
        for fused in (False, True):
            for k in add_mul_kernels(n, itemsize, z_kind, fused):
                rows.append(dict(z=z_kind, variant="fused" if fused else "unfused", kernel=k.name,
                                 read_elems=k.read // itemsize, written_elems=k.written // itemsize,
                                 bytes=k.total))
    return pd.DataFrame(rows)


# --- Reductions: softmax and LayerNorm over the last dim of a (rows, width) tensor ---------------
STAT = 4  # per-row statistics (max, sum, mean, rstd) are float32


def softmax_kernels(rows: int, width: int, itemsize: int, impl: str, online: bool = False) \
        -> list[Kernel]:
    """Unfused Triton: row max, exp-sum, normalise as three kernels (x read three times, the
    statistics round-trip). Fused: read once, write once; the online path (rows wider than one
    block) reads the row a second time to normalise (from L2 when it is still there)."""
    e = rows * width * itemsize
    if impl == "triton_unfused":
        return [Kernel("row max", e, rows * STAT),
                Kernel("exp-sum", e + rows * STAT, rows * STAT),
                Kernel("normalise", e + 2 * rows * STAT, e)]
    if impl == "triton_fused" and online:
        return [Kernel("online softmax: stats pass + normalise pass", 2 * e, e)]
    # torch_eager and torch_compile are single kernels too; counted at the compulsory traffic.
    return [Kernel("softmax", e, e)]


def softmax_backward_kernels(rows: int, width: int, itemsize: int, impl: str,
                             two_pass: bool = False) -> list[Kernel]:
    """dx = y * (dy - sum(y * dy)) per row. Unfused Triton: a row-sum kernel (y, dy read; the sums
    stored) and an elementwise kernel (y, dy read again with the sums; dx written). Fused: y and
    dy read once, dx written once; the two-pass path (rows longer than one tile) reads y and dy a
    second time to write dx (from L2 when they are still there)."""
    e = rows * width * itemsize
    if impl == "triton_unfused":
        return [Kernel("row sums of y * dy", 2 * e, rows * STAT),
                Kernel("dx = y * (dy - sum)", 2 * e + rows * STAT, e)]
    if impl == "triton_fused" and two_pass:
        return [Kernel("two passes: row sums, then dx", 4 * e, e)]
    # torch_eager (_softmax_backward_data) and torch_compile are single kernels too.
    return [Kernel("softmax backward", 2 * e, e)]


def layer_norm_kernels(rows: int, width: int, itemsize: int, impl: str, direction: str = "fwd",
                       groups: int = 0) -> list[Kernel]:
    """LayerNorm with weight and bias of `width` elements. Forward unfused follows seed 001's five
    steps (mean, variance, normalise, scale, shift), each a kernel with its intermediate in memory.
    Backward (fused): dx per row, and dweight/dbias as per-group float32 partial sums (groups x
    width) reduced by a second kernel."""
    e = rows * width * itemsize
    p = width * itemsize
    if direction == "fwd":
        if impl == "triton_unfused":
            return [Kernel("mean", e, rows * STAT),
                    Kernel("variance", e + rows * STAT, rows * STAT),
                    Kernel("normalise", e + 2 * rows * STAT, e),
                    Kernel("scale", e + p, e),
                    Kernel("shift", e + p, e)]
        return [Kernel("layer norm (+ mean, rstd)", e + 2 * p, e + 2 * rows * STAT)]
    if direction != "bwd":
        raise ValueError(f"direction must be 'fwd' or 'bwd', got {direction!r}")
    partials = 2 * groups * width * STAT
    return [Kernel("dx, partial dw/db", 2 * e + p + 2 * rows * STAT, e + partials),
            Kernel("reduce dw, db", partials, 2 * p)]


def softmax_flops(rows: int, width: int) -> int:
    return 5 * rows * width  # max, subtract, exp, sum, divide


def softmax_backward_flops(rows: int, width: int) -> int:
    return 4 * rows * width  # multiply, sum, subtract, multiply


def layer_norm_flops(rows: int, width: int, direction: str = "fwd") -> int:
    return (8 if direction == "fwd" else 12) * rows * width


def total(kernels: list[Kernel]) -> int:
    return sum(k.total for k in kernels)


# --- softmax(X) @ V and attention ------------------------------------------------------------------

def softmax_matmul_kernels(batch, d1, d2, d3, itemsize, impl) -> list[Kernel]:
    """Unfused: P = softmax(X) is written (x's dtype) and read back by the matmul; fused: never."""
    x, v, o = batch * d1 * d2 * itemsize, batch * d2 * d3 * itemsize, batch * d1 * d3 * itemsize
    mm = 2 * batch * d1 * d2 * d3
    if impl in UNFUSED_IMPLS:
        return [Kernel("P = softmax(X)", x, x), Kernel("O = P @ V", x + v, o, mm)]
    return [Kernel("O = softmax(X) @ V", x + v, o, mm)]


def softmax_matmul_flops(batch, d1, d2, d3) -> int:
    return 2 * batch * d1 * d2 * d3 + 5 * batch * d1 * d2


def attention_kernels(batch, heads, seq, head_dim, itemsize, impl, score_bytes=None) -> list[Kernel]:
    """Naive (materialised) attention writes and reads the batch*heads*seq^2 scores S and
    probabilities P (in the input dtype unless `score_bytes` says otherwise; PyTorch eager also
    scales S in a kernel of its own, as a user's code does); fused reads Q, K, V and writes O
    only."""
    qkv = batch * heads * seq * head_dim * itemsize
    mm = 2 * batch * heads * seq * seq * head_dim  # one of the two products, non-causal
    if impl in ("torch_eager", "triton_unfused"):
        s = batch * heads * seq * seq * (score_bytes or itemsize)
        scale = [Kernel("S *= scale", s, s)] if impl == "torch_eager" else []
        return [Kernel("S = Q K^T", 2 * qkv, s, mm), *scale, Kernel("P = softmax(S)", s, s),
                Kernel("O = P V", s + qkv, qkv, mm)]
    return [Kernel("O = attention(Q, K, V)", 3 * qkv, qkv, 2 * mm)]


def attention_flops(batch, heads, seq, head_dim, causal: bool) -> float:
    """4 B H N^2 D (two matmuls), halved for causal: the convention FlashAttention reports in."""
    return 4 * batch * heads * seq * seq * head_dim * (0.5 if causal else 1.0)


def attention_fwd_bwd_kernels(batch, heads, seq, head_dim, itemsize) -> list[Kernel]:
    """Fused forward (reads Q, K, V; writes O and the log-sum-exp) and FlashAttention-2 backward
    (reads Q, K, V, O, dO and the log-sum-exp; writes dQ, dK, dV; the row terms delta are
    negligible): what must move at least, whichever backend."""
    qkv = batch * heads * seq * head_dim * itemsize
    lse = batch * heads * seq * 4
    return [Kernel("O = attention(Q, K, V)", 3 * qkv, qkv + lse, 0),
            Kernel("dQ, dK, dV", 5 * qkv + lse, 3 * qkv, 0)]


def attention_fwd_bwd_flops(batch, heads, seq, head_dim, causal: bool) -> float:
    """Forward 2 matmuls, backward 5 (recomputing S, then dV, dP, dQ, dK): 3.5x the forward."""
    return 3.5 * attention_flops(batch, heads, seq, head_dim, causal)


def attention_decode_kernels(batch, heads, kv_heads, seq_k, head_dim, itemsize) -> list[Kernel]:
    """One query per head against a KV cache: K and V read once (a grouped head once for all the
    query heads that share it), q read and the output written (small)."""
    q = batch * heads * head_dim * itemsize
    kv = batch * kv_heads * seq_k * head_dim * itemsize
    return [Kernel("o = attention(q, K cache, V cache)", q + 2 * kv, q,
                   4 * batch * heads * seq_k * head_dim)]


# --- Matmul epilogues ------------------------------------------------------------------------------

def matmul_softmax_kernels(B, K, C, itemsize, impl, method=None, splits=1) -> list[Kernel]:
    """x (B, K) @ W (K, C) + b, then a row softmax. Unfused (and eager): the logits are written and
    read back. Fused: read x, W, b, write the probabilities; the "online" method reads x and W a
    second time to recompute the logits (twice the FLOPs) instead of storing them;
    "two_pass_store" writes the logits into the output and rewrites them in place, as does
    "store_softmax" (the same bytes as the unfused pair, without the row partials); "split_k"
    writes `splits` float32 partial logits and reads them back twice."""
    x, w, b, o = B * K * itemsize, K * C * itemsize, C * itemsize, B * C * itemsize
    stats = B * 4 * 2
    mm = 2 * B * K * C
    if impl == "cublas":
        return [Kernel("logits = x @ W + b", x + w + b, o, mm)]
    if impl in UNFUSED_IMPLS:
        return [Kernel("logits = x @ W + b", x + w + b, o, mm), Kernel("softmax(logits)", o, o)]
    if method == "online":
        return [Kernel("pass 1: logits tiles -> row max, sum", x + w + b, stats, mm),
                Kernel("pass 2: recompute logits, write probs", x + w + b + stats, o, mm)]
    if method == "two_pass_store":
        return [Kernel("pass 1: logits -> out, row max, sum", x + w + b, o + stats, mm),
                Kernel("pass 2: normalise in place", o + stats, o)]
    if method == "store_softmax":
        return [Kernel("pass 1: logits = x @ W + b -> out", x + w + b, o, mm),
                Kernel("pass 2: softmax in place", o, o)]
    if method == "split_k":
        # The row pass reads the partials (and the bias) twice: for the max and sum, then to write.
        parts = splits * B * C * 4
        return [Kernel("pass 1: partial logits per K slice", x + w, parts, mm),
                Kernel("pass 2: sum slices + b, softmax", 2 * (parts + b), o)]
    return [Kernel("softmax(x @ W + b)", x + w + b, o, mm)]


def matmul_softmax_flops(B, K, C) -> int:
    return 2 * B * K * C + 5 * B * C


def linear_act_kernels(M, K, N, itemsize, impl) -> list[Kernel]:
    x, w, b, o = M * K * itemsize, K * N * itemsize, N * itemsize, M * N * itemsize
    mm = 2 * M * K * N
    if impl == "cublas":
        return [Kernel("x @ W", x + w, o, mm)]
    if impl in UNFUSED_IMPLS:
        return [Kernel("h = x @ W + b", x + w + b, o, mm), Kernel("act(h)", o, o)]
    return [Kernel("act(x @ W + b)", x + w + b, o, mm)]


def linear_cross_entropy_kernels(N, H, V, itemsize, impl, chunks: int = 1) -> list[Kernel]:
    """The LM head and its loss, forward and backward, over N tokens, hidden size H and a
    vocabulary of V: the logits' matmul, the loss and the logits' gradient, and the two gradient
    matmuls (dx = G W, dW = G^T x). Unfused (eager, compile): the logits and their gradient make
    round trips through memory (the loss reads the logits, the backward writes G and both
    matmuls read it). Fused (triton_fused, Liger's): per chunk of rows the same traffic on a
    chunk-sized buffer, the weight read again by each chunk's three matmuls and dW read and
    written once per chunk (accumulated in the weight's dtype)."""
    x, w, logits = N * H * itemsize, V * H * itemsize, N * V * itemsize
    mm = 2 * N * H * V
    if impl in ("triton_fused", "liger"):
        return [Kernel("logits = x W^T (per chunk)", x + chunks * w, logits, mm),
                Kernel("loss; G over the logits", logits, logits),
                Kernel("dx = G W (per chunk)", logits + chunks * w, x, mm),
                Kernel("dW += G^T x (per chunk)", logits + x + chunks * w, chunks * w, mm)]
    return [Kernel("logits = x W^T", x + w, logits, mm),
            Kernel("loss (log-softmax)", logits, 4 * N),
            Kernel("G = softmax - onehot", logits, logits),
            Kernel("dx = G W", logits + w, x, mm),
            Kernel("dW = G^T x", logits + x, w, mm)]


def liger_lce_chunks(N, H, V) -> int:
    """The chunks of rows Liger-Kernel's fused linear cross-entropy takes (0.8.5, its default
    chunk_mem_const of 1): a chunk's logits about as many elements as x, i.e. the next power of
    two of ceil(N / ceil(V / H)) rows (at most N), e.g. 128 rows at 8192 x 768 x 50257."""
    if N <= 0:
        return 1
    rows = -(-N // -(-V // H))
    rows = min(1 << (rows - 1).bit_length(), N)
    return -(-N // rows)


def linear_cross_entropy_flops(N, H, V) -> float:
    """The three matmuls: 6 N H V."""
    return 6 * N * H * V
