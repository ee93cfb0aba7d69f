"""The LM head and its loss as one op: `cross_entropy(x @ weight.T + bias, target)` that never
holds the (tokens, vocabulary) logits, forward and backward.

Unfused (eager, torch.compile), a training step writes the logits (8192 x 50257 in bf16: 0.8 GB),
reads them for the loss, keeps them (or float32 copies) for the backward, and writes their
gradient. Here the tokens go through in chunks of rows: for each chunk the logits are one matmul
(cuBLAS) into a chunk-sized buffer, one Triton kernel per row turns them into the loss and, in
the same buffer, into their gradient (softmax minus the smoothed one-hot, scaled), and two more
matmuls take that gradient to dx and into dweight (and its column sums into dbias). The gradients
are computed during the forward (Liger-Kernel's fused linear cross-entropy does the same); the
backward only scales them by the incoming gradient. Memory: one chunk of logits, whatever the
token count. Three matmuls (the logits and the two gradient products) are the floor; the row
kernel reads and writes each chunk's logits once more.

A vocabulary that is not a multiple of 8 (GPT-2's 50257) takes cuBLAS off its fast path (5-7x
slower on an H100) in each matmul that has it as a dimension: each matmul is split at the largest
multiple of 8 (50256) and the few classes left (one) go through a thin matmul of their own; the
logits' rows are padded in the buffer (16-byte aligned rows). dweight accumulates over the chunks
in the weight's dtype
(cuBLAS adds in float32 and rounds once per chunk, as Liger does: its error grows with the number
of chunks). The mean's 1/count stays on the GPU and scales the gradient in the row kernel (in
float16 split in two: R/count there, R a power of two from the row count, and 1/R as the matmuls'
alpha, so that the gradient stored in float16 neither underflows nor overflows); a target out of
range is a device-side assert, as in torch: no host sync stalls a training step, and the op
captures in a CUDA graph.

Reductions "mean" (over the targets that are not `ignore_index`, as torch) and "sum"; label
smoothing as torch's. float16, bfloat16 (logits in the input dtype, as cuBLAS writes them; the
softmax and the loss in float32) and float32 (matmuls in TF32 where PyTorch allows it).
"""
from __future__ import annotations

import operator

import torch
import triton
from torch._subclasses.fake_tensor import is_fake
import triton.language as tl

from .._autograd import LOWER, declare
from .._buffers import empty
from .._checks import check_pow2, check_same, check_tensor
from .._tiles import next_pow2
from .._launch import launch
from .softmax.forward import _online_step
from .softmax.planning import ONLINE_BLOCK, half_online_tile

REDUCTIONS = ("mean", "sum")
CHUNK_BYTES = 256 * 2**20  # one chunk of logits (and their gradient, in place): at most this
PAD_TO = 64  # the logits buffer's rows: the vocabulary padded to a multiple of this


def reference(x, weight, target, bias=None, ignore_index=-100, reduction="mean",
              label_smoothing=0.0):
    """The semantics, in PyTorch eager: the logits, then F.cross_entropy on them in float32 (as
    models compute their loss); the loss is float32."""
    logits = x @ weight.t()
    if bias is not None:
        logits = logits + bias
    return torch.nn.functional.cross_entropy(logits.float(), target, ignore_index=ignore_index,
                                             reduction=reduction, label_smoothing=label_smoothing)


@triton.jit
def _logits_tile(base, bias_ptr, c, V, P, HAS_BIAS: tl.constexpr, EVICT: tl.constexpr):
    """Columns c of a row of logits in float32, the bias added; -inf past V (the padding holds
    whatever the buffer held). Read over P columns: see _ce_rows_kernel."""
    z = tl.load(base + c, mask=c < P, other=0.0, eviction_policy=EVICT).to(tl.float32)
    if HAS_BIAS:
        z += tl.load(bias_ptr + c, mask=c < P, other=0.0).to(tl.float32)
    return tl.where(c < V, z, float("-inf"))


@triton.jit
def _ce_rows_kernel(logits_ptr, bias_ptr, target_ptr, loss_ptr, scale_ptr, V, P, stride_row,
                    ignore_index, smoothing, HAS_BIAS: tl.constexpr, SMOOTH: tl.constexpr,
                    WITH_GRAD: tl.constexpr, SCALED: tl.constexpr, BLOCK: tl.constexpr):
    """One row of logits: its loss, and (WITH_GRAD) their gradient written over them:
    softmax - (1 - smoothing) onehot(target) - smoothing / V; 0 where the target is ignored;
    times *scale_ptr (on the device: the mean's 1/count, or in float16 R/count, see the module's
    docstring) if SCALED, else unscaled. The
    bias (HAS_BIAS, padded to P with zeros) is added here, to the logits as read. The row is read
    and written over P columns, a multiple of 64 (the buffer's padded row; the gradient is 0
    past V): a mask at an odd V would cut every access to single elements, and scattered 2-byte
    stores ran the gradient loop at under half the copy's speed. As the softmax family's
    online kernel: a running (max, sum) over the tiles, then the
    gradient loop walks them last to first, so the tiles read last, the likeliest still in L2,
    are read again first.
    """
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    target = tl.load(target_ptr + row)
    cols = tl.arange(0, BLOCK)
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.full((), 0.0, tl.float32)
    total = tl.full((), 0.0, tl.float32)
    for start in range(0, V, BLOCK):
        c = start + cols
        # evict_last: the gradient loop reads the row again.
        z = _logits_tile(base, bias_ptr, c, V, P, HAS_BIAS, "evict_last")
        m, s = _online_step(m, s, z)
        if SMOOTH:  # only then: a -inf logit (a masked class) would make 0 * -inf below
            total += tl.sum(tl.where(c < V, z, 0.0), 0)
    lse = m + tl.log(s)
    ignored = target == ignore_index
    z_target = tl.load(base + target, mask=target != ignore_index, other=0.0).to(tl.float32)
    if HAS_BIAS:
        z_target += tl.load(bias_ptr + target, mask=target != ignore_index, other=0.0).to(
            tl.float32)
    loss = lse - (1.0 - smoothing) * z_target
    if SMOOTH:
        loss -= smoothing / V * total
    tl.store(loss_ptr + row, tl.where(ignored, 0.0, loss))
    if WITH_GRAD:
        row_scale = tl.where(ignored, 0.0, tl.load(scale_ptr) if SCALED else 1.0)
        n_tiles = tl.cdiv(V, BLOCK)
        for i in range(0, n_tiles):
            c = (n_tiles - 1 - i) * BLOCK + cols
            z = _logits_tile(base, bias_ptr, c, V, P, HAS_BIAS, "evict_first")
            g = (tl.exp(z - lse) - smoothing / V - (1.0 - smoothing) * (c == target)) * row_scale
            g = tl.where(c < V, g, 0.0)
            tl.store(base + c, g.to(logits_ptr.dtype.element_ty), mask=c < P)


def row_tile(vocab: int, itemsize: int) -> tuple[int, int]:
    """(block, num_warps) of the row kernel: the softmax family's online tiles (16-bit rows:
    `half_online_tile`; float32: ONLINE_BLOCK), no larger than the row."""
    block, warps = half_online_tile(vocab) if itemsize < 4 else (ONLINE_BLOCK, 16)
    block = min(block, max(16, next_pow2(vocab)))
    return block, max(4, min(warps, block // 1024))


def padded_width(vocab: int) -> int:
    """The logits buffer's row length: the vocabulary, padded to a multiple of PAD_TO."""
    return -(-vocab // PAD_TO) * PAD_TO


def default_chunk_rows(n: int, vocab: int, itemsize: int) -> int:
    """Rows per chunk: as few chunks as CHUNK_BYTES of logits allow, of equal rows (no short last
    chunk, whose matmuls run below speed and still read and write all of dweight)."""
    most = max(1, CHUNK_BYTES // (padded_width(vocab) * itemsize))
    chunks = max(1, -(-n // most))
    return max(1, -(-n // chunks))


def _check(x, weight, target, bias, ignore_index, reduction, label_smoothing):
    check_tensor("x", x, ndim=2)
    check_tensor("weight", weight, ndim=2)
    check_same([("x", x), ("weight", weight)] + ([("bias", bias)] if bias is not None else []))
    check_tensor("target", target, dtypes=(torch.int64, torch.int32), ndim=1)
    if target.device != x.device:
        raise ValueError(f"target is on {target.device}, x on {x.device}")
    if weight.shape[1] != x.shape[1]:
        raise ValueError(f"weight must be (vocabulary, {x.shape[1]}) as nn.Linear stores it, "
                         f"got {tuple(weight.shape)}")
    if target.shape[0] != x.shape[0]:
        raise ValueError(f"target has {target.shape[0]} entries for {x.shape[0]} rows of x")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must be ({weight.shape[0]},), got {tuple(bias.shape)}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS} (for per-token losses, "
                         f"F.cross_entropy on the logits), got {reduction!r}")
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    operator.index(ignore_index)  # an int (or an integer numpy scalar), else TypeError


def triton_fused(x, weight, target, bias=None, ignore_index=-100, reduction="mean",
                 label_smoothing=0.0, *, with_grad=True, chunk_rows=None, block=None):
    """(loss, dx, dweight, dbias): the loss and, with_grad, its gradients (dbias None without a
    bias), the logits never held beyond one chunk of `chunk_rows` rows (default: CHUNK_BYTES of
    them); block: the row kernel's tile (default `row_tile`)."""
    _check(x, weight, target, bias, ignore_index, reduction, label_smoothing)
    if block is not None:
        check_pow2("block", block)
    n, hidden = x.shape
    vocab = weight.shape[0]
    # cuBLAS is several times slower where a matmul's dimension is the vocabulary and that is not a
    # multiple of 8 (docs/linear_cross_entropy.md): every matmul is split into the first `v8`
    # classes and the rest.
    v8 = vocab - vocab % 8
    padded = padded_width(vocab)
    target = target.contiguous()  # the kernel reads one index per row, adjacent
    kept = target != ignore_index
    bad = (kept & ((target < 0) | (target >= vocab))).sum()
    outside = (f"target holds class indices outside [0, {vocab}) that are not ignore_index "
               f"({ignore_index})")
    count = kept.sum()
    # On a GPU nothing here waits for the GPU (a sync would stall a training step's launches, and
    # cannot be captured in a CUDA graph): a bad target is a device-side assert, as in torch's own
    # cross-entropy, and the mean's 1/count stays on the device, applied in the row kernel. In
    # float16 the row kernel applies R/count and the matmuls 1/R (their alpha, in float32): the
    # stored gradient, softmax - onehot in [-1, 1], times R/count, is not scaled down (R/count
    # >= 1 up to 2^15 rows: no more underflow than unscaled) and cannot overflow (R <= 2^15). On
    # the CPU (the interpreter) a sync costs nothing and a bad target raises.
    if x.device.type != "cuda":
        if bad.item():
            raise ValueError(outside)
    else:
        torch._assert_async(bad == 0, outside)
    scale, scale_t = 1.0, None
    if reduction == "mean":
        if x.dtype == torch.float16:
            scale = 1.0 / min(next_pow2(max(n, 1)), 2**15)
        scale_t = torch.where(count > 0, 1.0 / (scale * count.clamp_min(1)), 0.0).float()
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(n, vocab, x.element_size())
    buffer = torch.empty((min(n, chunk_rows), padded), dtype=x.dtype, device=x.device)
    losses = empty((n,), torch.float32, x.device)
    dx = torch.empty_like(x) if with_grad else None
    # In the weight's dtype (see the module's docstring): a float32 copy would double its size.
    # The first chunk writes it (beta=0), so it needs no zeros but where no chunk runs.
    dw = None
    if with_grad:
        dw = (torch.zeros((vocab, hidden), dtype=weight.dtype, device=x.device) if n == 0
              else empty((vocab, hidden), weight.dtype, x.device))
    db = torch.zeros((vocab,), dtype=torch.float32, device=x.device) \
        if with_grad and bias is not None else None
    parts = [p for p in (slice(0, v8), slice(v8, vocab)) if p.stop > p.start]
    bias_p = None  # the bias padded with zeros, as the logits' rows are (see _ce_rows_kernel)
    if bias is not None:
        bias_p = bias.new_zeros((padded,))
        bias_p[:vocab] = bias
    tile, warps = row_tile(vocab, x.element_size())
    if block is not None:
        tile = min(block, tile)
    for start in range(0, n, chunk_rows):
        rows = slice(start, min(n, start + chunk_rows))
        xc = x[rows]
        logits = buffer[:xc.shape[0], :vocab]
        for p in parts:
            torch.mm(xc, weight[p].t(), out=logits[:, p])
        launch(_ce_rows_kernel, (logits.shape[0],), logits, bias_p, target[rows], losses[rows],
               losses if scale_t is None else scale_t, vocab, padded, logits.stride(0),
               int(ignore_index), float(label_smoothing), HAS_BIAS=bias is not None,
               SMOOTH=float(label_smoothing) > 0, WITH_GRAD=with_grad, SCALED=scale_t is not None,
               BLOCK=tile, num_warps=warps)
        if with_grad:  # the gradient is in `logits` now; `scale` (1/R) is cuBLAS's alpha
            # The thin part first: the large one then adds to it, rounding dx once.
            for i, p in enumerate(reversed(parts)):
                torch.addmm(dx[rows], logits[:, p], weight[p], beta=1 if i else 0, alpha=scale,
                            out=dx[rows])
                torch.addmm(dw[p], logits[:, p].t(), xc, beta=1 if start else 0, alpha=scale,
                            out=dw[p])
            if db is not None:
                db += logits.sum(0, dtype=torch.float32)
    # The mean over no target: 0 / 0, nan, as torch's.
    loss = losses.sum() / count if reduction == "mean" else losses.sum()
    if not with_grad:
        return loss, None, None, None
    return loss, dx, dw, None if db is None else db.mul_(scale).to(bias.dtype)


# ------------------------------------------------------------------------------------------------
# the op: the gradients made in the forward, scaled in the backward


def _forward(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
             bias: torch.Tensor | None, ignore_index: int, reduction: str, label_smoothing: float
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    loss, dx, dw, db = triton_fused(x, weight, target, bias, ignore_index, reduction,
                                    label_smoothing)
    return loss, dx, dw, db if db is not None else x.new_empty(0)


def _fake(x, weight, target, bias, ignore_index, reduction, label_smoothing):
    _check(x, weight, target, bias, ignore_index, reduction, label_smoothing)
    return (x.new_empty((), dtype=torch.float32), torch.empty_like(x), weight.new_empty(weight.shape),
            bias.new_empty(bias.shape) if bias is not None else x.new_empty(0))


def _setup(ctx, inputs, output):
    _, dx, dw, db = output
    ctx.has_bias = inputs[3] is not None
    ctx.first = True
    ctx.save_for_backward(dx, dw, db)
    # The gradients the op returns are never used: no zeros in their place (a copy of dW).
    ctx.set_materialize_grads(False)


def _backward(ctx, dloss, _dx, _dw, _db):
    if torch.is_grad_enabled():  # create_graph=True: the saved gradients have no derivative
        raise RuntimeError("linear_cross_entropy: the second derivative is not implemented (its "
                           "gradients are made in the forward); use the PyTorch reference")
    dx, dw, db = ctx.saved_tensors
    if dloss is None:  # the loss did not reach the outputs differentiated
        return (None,) * 7
    grads = (dx, dw, db) if ctx.has_bias else (dx, dw)
    if ctx.first and not is_fake(dloss):
        # The graph's first backward: the gradients made in the forward, scaled in place by the
        # incoming gradient unless it is 1 (a loss's own), decided on the device: no host sync.
        # They become the .grad tensors.
        ctx.first = False
        ctx.first_dloss = dloss.detach().float().clone()
        for t in grads:
            _scale_unless_one(t, ctx.first_dloss)
        return dx, dw, None, db if ctx.has_bias else None, None, None, None
    # A later backward of a retained graph (it may sync: it is rare): scaled copies of the saved
    # gradients, exact where the first incoming gradient was 1 (they were left as made); else they
    # hold that scale, rounded in their dtype (a float16 one may have underflowed), and cannot be
    # taken back. (Autograd raises if such a .grad was changed in place since.)
    first = getattr(ctx, "first_dloss", None)
    if first is not None and first.item() != 1.0:
        raise RuntimeError("linear_cross_entropy: a retained graph whose first backward's incoming "
                           f"gradient was {first.item():g}, not 1, cannot be differentiated again "
                           "(its gradients were scaled in place); use the PyTorch reference")
    g = dloss.to(dx.dtype)
    return (dx * g, dw * g, None, db * g if ctx.has_bias else None, None, None, None)


@triton.jit
def _scale_unless_one_kernel(x_ptr, g_ptr, n, BLOCK: tl.constexpr):
    g = tl.load(g_ptr)
    if g != 1.0:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(x_ptr + offs, (v.to(tl.float32) * g).to(x_ptr.dtype.element_ty), mask=offs < n)


def _scale_unless_one(t: torch.Tensor, g: torch.Tensor, block: int = 4096) -> None:
    """t *= g in place unless the float32 scalar g is 1 (then one load per program, no write).
    t dense: contiguous, or a 2-D one transposed (dx is laid out as x)."""
    assert t.is_contiguous() or (t.dim() == 2 and t.t().is_contiguous())
    if t.numel():
        launch(_scale_unless_one_kernel, (triton.cdiv(t.numel(), block),), t, g, t.numel(),
               BLOCK=block)


def _direct_loss(x, weight, target, bias, ignore_index, reduction, label_smoothing):
    return triton_fused(x, weight, target, bias, ignore_index, reduction, label_smoothing,
                        with_grad=False)[0]


def _prepare(x, weight, target, bias, ignore_index, reduction, label_smoothing):
    return x, weight, target, bias, ignore_index, reduction, float(label_smoothing)


# Under autocast as F.cross_entropy(F.linear(x, weight, bias), target): the matmuls in
# autocast's dtype, the loss in float32.
_LINEAR_CROSS_ENTROPY = declare("linear_cross_entropy", _forward, _fake, setup=_setup,
                                backward=_backward, direct=_direct_loss, prepare=_prepare,
                                autocast=LOWER)


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         bias=None, ignore_index: int = -100, reduction: str = "mean",
                         label_smoothing: float = 0.0) -> torch.Tensor:
    """`F.cross_entropy(x @ weight.T + bias, target)` (an LM head and its loss) without holding
    the logits; differentiable in x, weight and bias (gradients made during the forward).

    x (N, H), weight (V, H) as nn.Linear stores it, bias (V,) or None, target (N,) int64 class
    indices (ignore_index: no loss, no gradient; any other index outside [0, V) raises
    ValueError, except on a GPU, where it is a device-side assert as in torch's cross-entropy). reduction "mean" or "sum". One float dtype for x, weight and bias;
    the loss is float32 (as a model's loss on float32 logits). A retained graph may be
    differentiated again where the first backward's incoming gradient was 1 (a loss's own)."""
    return _LINEAR_CROSS_ENTROPY(x, weight, target, bias, ignore_index, reduction,
                                 label_smoothing)


__all__ = ["linear_cross_entropy", "reference", "triton_fused"]
