"""Attention, softmax(q k^T * scale) v over (batch, heads, seq, head_dim): the public op (a
PyTorch custom op with its fused backward) and the family's parts: `forward` (reference,
triton_unfused, and triton_fused: FlashAttention-2 with its plan), `gluon` (a FlashAttention-3-style
forward for sm_90, which that plan times among its candidates), `backward` (FlashAttention-2's)
and `decoding` (one query against a KV cache, keys split across programs)."""
from __future__ import annotations

import torch

from ..._autograd import LOWER, declare
from . import backward as _fab
from . import forward as _fa
from .forward import default_config, default_scale, reference, triton_fused, triton_unfused

__all__ = ["attention", "default_config", "default_scale", "reference", "triton_fused",
           "triton_unfused"]

# ------------------------------------------------------------------------------------------------
# attention


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
             sm_scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, per-row log-sum-exp for the backward)."""
    return _fa.triton_fused(q, k, v, causal, sm_scale, return_lse=True)


def _fake(q, k, v, causal, sm_scale):
    _fa._check_inputs(q, k, v, causal, sm_scale)
    batch, heads, seq, _ = q.shape
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty((batch * heads, seq), dtype=torch.float32))


def _backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, dout: torch.Tensor, causal: bool, sm_scale: float | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention-2's backward kernels; sm_scale None: the forward's default,
    1/sqrt(head_dim)."""
    if sm_scale is None:
        sm_scale = _fa.default_scale(q.shape[-1])
    return _fab.attention_backward(q, k, v, out, lse, dout, causal, sm_scale)


def _backward_fake(q, k, v, out, lse, dout, causal, sm_scale):
    # Contiguous, as the kernels write them (empty_like would keep the strides of a dense view
    # such as (batch, seq, heads, dim).transpose(1, 2), which Inductor then asserts on).
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _setup(ctx, inputs, output):
    q, k, v, causal, sm_scale = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.causal = causal
    # None stays None (the backward op computes the default): math.sqrt of a symbolic head_dim
    # here, under AOTAutograd, would specialise it.
    ctx.sm_scale = sm_scale


def _backward(ctx, bwd, dout, *_):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = bwd(q, k, v, out, lse, dout, ctx.causal, ctx.sm_scale)
    return dq, dk, dv, None, None


def _prepare(q, k, v, causal, sm_scale):
    return q, k, v, bool(causal), None if sm_scale is None else float(sm_scale)


_ATTENTION = declare("attention", _forward, _fake, setup=_setup, backward=_backward,
                     backward_op=_backward_op, backward_fake=_backward_fake,
                     direct=_fa.triton_fused, prepare=_prepare, function=True,
                     autocast=LOWER)  # as SDPA


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              sm_scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * sm_scale [causal mask]) @ v in one fused Triton kernel; differentiable
    (FlashAttention-2 backward kernels: dq, dk, dv from the saved log-sum-exp).

    q: (batch, heads, seq_q, head_dim); k, v: (batch, kv_heads, seq_k, head_dim) with kv_heads
    dividing heads (grouped-query attention; k and v are not repeated in memory). Contiguous,
    float16 or bfloat16, head_dim up to 256, any lengths; on CUDA (or the CPU
    under TRITON_INTERPRET=1). sm_scale: any finite real, default 1/sqrt(head_dim). causal: query
    i sees keys j <= i + seq_k - seq_q, aligned to the bottom right as FlashAttention and
    PyTorch's `causal_lower_right` define it for a KV cache (the same as top-left when
    seq_q == seq_k); more queries than keys is refused.
    """
    return _ATTENTION(q, k, v, causal, sm_scale)
