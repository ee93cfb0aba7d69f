"""Attention, softmax(q k^T * scale) v over (batch, heads, seq, head_dim): the public op (a
PyTorch custom op with its fused backward) and the family's parts: `forward` (reference,
triton_unfused, and triton_fused: FlashAttention-2 with its plan), `gluon` (a FlashAttention-3-style
forward for sm_90, which that plan times among its candidates), `backward` (FlashAttention-2's)
and `decoding` (one query against a KV cache, keys split across programs)."""
from __future__ import annotations

import torch

from ..._autograd import _PLAIN, NS, _direct, _no_double_backward
from . import backward as _fab
from . import forward as _fa
from .forward import default_config, default_scale, reference, triton_fused, triton_unfused

__all__ = ["attention", "default_config", "default_scale", "reference", "triton_fused",
           "triton_unfused"]

# ------------------------------------------------------------------------------------------------
# attention


@torch.library.custom_op(f"{NS}::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  sm_scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, per-row log-sum-exp for the backward)."""
    return _fa.triton_fused(q, k, v, causal, sm_scale, return_lse=True)


@_attention_op.register_fake
def _(q, k, v, causal, sm_scale):
    _fa._check_inputs(q, k, v, causal, sm_scale)
    batch, heads, seq, _ = q.shape
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty((batch * heads, seq), dtype=torch.float32))


@torch.library.custom_op(f"{NS}::attention_backward", mutates_args=())
def _attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                           lse: torch.Tensor, dout: torch.Tensor, causal: bool,
                           sm_scale: float | None
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sm_scale None: the forward's default, 1/sqrt(head_dim)."""
    if sm_scale is None:
        sm_scale = _fa.default_scale(q.shape[-1])
    return _fab.attention_backward(q, k, v, out, lse, dout, causal, sm_scale)


@_attention_backward_op.register_fake
def _(q, k, v, out, lse, dout, causal, sm_scale):
    # Contiguous, as the kernels write them (empty_like would keep the strides of a dense view
    # such as (batch, seq, heads, dim).transpose(1, 2), which Inductor then asserts on).
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _attention_setup(ctx, inputs, output):
    q, k, v, causal, sm_scale = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.causal = causal
    # None stays None (the backward op computes the default): math.sqrt of a symbolic head_dim
    # here, under AOTAutograd, would specialise it.
    ctx.sm_scale = sm_scale


def _attention_backward(ctx, dout, _dlse):
    """FlashAttention-2's backward kernels (kernels.families.attention.backward)."""
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = _attention_backward_op(q, k, v, out, lse, dout, ctx.causal, ctx.sm_scale)
    return dq, dk, dv, None, None


_attention_op.register_autograd(_attention_backward, setup_context=_attention_setup)
_attention_backward_op.register_autograd(_no_double_backward("attention's backward"))


class _Attention(torch.autograd.Function):
    """Eager autograd without the dispatcher: the same kernels as the registered op, at less host
    cost a call."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale):
        out, lse = _fa.triton_fused(q, k, v, causal, sm_scale, return_lse=True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.sm_scale = causal, sm_scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: the registered op (no 2nd derivative)
            dq, dk, dv = _attention_backward_op(q, k, v, out, lse, dout, ctx.causal, ctx.sm_scale)
        else:
            scale = _fa.default_scale(q.shape[-1]) if ctx.sm_scale is None else ctx.sm_scale
            dq, dk, dv = _fab.attention_backward(q, k, v, out, lse, dout, ctx.causal, scale)
        return dq, dk, dv, None, None


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
    if _direct(q, k, v):
        return _fa.triton_fused(q, k, v, causal, sm_scale)
    causal, sm_scale = bool(causal), None if sm_scale is None else float(sm_scale)
    if not torch.compiler.is_compiling() and all(type(t) in _PLAIN for t in (q, k, v)):
        return _Attention.apply(q, k, v, causal, sm_scale)
    return _attention_op(q, k, v, causal, sm_scale)[0]
