"""Linear + activation, `linear_act(x, weight, bias, activation)` = act(x @ weight + bias): x (M, K),
weight (K, N), i.e. `x @ weight`, NOT F.linear's (N, K) layout (pass `linear.weight.t()`, any
strides work). Unfused, the pre-activation (bias added in the matmul's epilogue) makes a round
trip through memory, stored in the input dtype as PyTorch eager stores it; fused, the bias and
activation are applied to the float32 accumulator before the single store. Both use
kernels._matmul's matmul. float32 defaults to "tf32" here (what fast float32 GEMMs use; label
such rows tf32), "ieee" on request.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._checks import cdiv, check_pow2, default_warps, empty
from .._plans import cached, layout_key, plan_cache
from .._launch import launch
from .._matmul import (ACTIVATIONS, GemmLaunch, _activation_kernel, _check_operands, _gemm,
                          _precision, gemm_launch, run_gemm)
from .._autograd import NS, _direct


def linear_act_reference(x: torch.Tensor, weight: torch.Tensor, bias=None,
                         activation: str = "gelu") -> torch.Tensor:
    """act(x @ weight + bias) in PyTorch eager; weight is (K, N). Same tf32 caveat as above."""
    h = x @ weight
    if bias is not None:
        h = h + bias
    if activation == "relu":
        return torch.relu(h)
    if activation == "gelu":
        return F.gelu(h)
    if activation == "gelu_tanh":
        return F.gelu(h, approximate="tanh")
    if activation == "none":
        return h
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


# ------------------------------------------------------------------------------------------------
# linear + activation


def _check_activation(activation):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def _fused_launch(x, weight, bias, activation, input_precision, block_m, block_n, block_k,
                  group_m, num_warps, num_stages) -> GemmLaunch:
    _check_operands(x, weight, bias, "K", "N")
    _check_activation(activation)
    precision = _precision(x, input_precision, "tf32")
    return gemm_launch(x, weight, bias, (weight.shape[1], 1), activation, precision, block_m,
                       block_n, block_k, group_m, num_warps, num_stages)


_PLANS = plan_cache()


def linear_act_fused(x, weight, bias=None, activation="gelu", *, input_precision=None,
                     block_m=None, block_n=None, block_k=None, group_m=None, num_warps=None,
                     num_stages=None) -> torch.Tensor:
    """One Triton matmul; bias and activation on the float32 accumulator before the one store.

    float32 defaults to input_precision="tf32" (what fast float32 GEMMs use); "ieee" on request.
    Defaults for the tiles: `gemm_config`. The checks and the plan are remembered per layout of
    x, weight, bias.
    """
    options = (activation, input_precision, block_m, block_n, block_k, group_m, num_warps,
               num_stages)
    how = cached(_PLANS, layout_key((x, weight, bias), options), _fused_launch, x, weight, bias,
                 *options)
    # A new contiguous (M, N) output: the strides the plan passes.
    out = empty((x.shape[0], weight.shape[1]), x.dtype, x.device)
    return run_gemm(x, weight, bias, out, how)


def linear_act_unfused(x, weight, bias=None, activation="gelu", *, input_precision=None,
                       block_m=None, block_n=None, block_k=None, group_m=None, num_warps=None,
                       num_stages=None, block=None) -> torch.Tensor:
    """Two Triton kernels: h = x @ weight + bias (bias in the matmul's epilogue) stored in x's
    dtype, then out = act(h) elementwise (block: its 1-D block). Same precision as the fused."""
    _check_operands(x, weight, bias, "K", "N")
    _check_activation(activation)
    precision = _precision(x, input_precision, "tf32")
    M, N = x.shape[0], weight.shape[1]
    h = empty((M, N), x.dtype, x.device)
    out = empty((M, N), x.dtype, x.device)
    _gemm(x, weight, bias, h, "none", precision, block_m, block_n, block_k, group_m, num_warps,
          num_stages)
    block = check_pow2("block", 2048 if block is None else block)
    if h.numel():
        launch(_activation_kernel, (cdiv(h.numel(), block),), h, out, h.numel(),
               ACTIVATION=activation, BLOCK=block, num_warps=default_warps(block))
    return out


IMPLS = {"reference": linear_act_reference, "triton_unfused": linear_act_unfused,
         "triton_fused": linear_act_fused}


# ------------------------------------------------------------------------------------------------
# act(x @ weight + bias)


@torch.library.custom_op(f"{NS}::linear_act", mutates_args=())
def _linear_act_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   activation: str) -> torch.Tensor:
    return linear_act_fused(x, weight, bias, activation)


@_linear_act_op.register_fake
def _(x, weight, bias, activation):
    _check_operands(x, weight, bias, "K", "N")
    _check_activation(activation)
    return x.new_empty((x.shape[0], weight.shape[1]))


def _linear_act_setup(ctx, inputs, output):
    x, weight, bias, activation = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.activation = activation


def _activation_grad(h, activation):
    """d act(h) / dh, float32."""
    if activation == "none":
        return torch.ones_like(h)
    if activation == "relu":
        return (h > 0).to(h.dtype)
    if activation == "gelu":
        return 0.5 * (1 + torch.erf(h / math.sqrt(2))) + h * torch.exp(-0.5 * h * h) / math.sqrt(
            2 * math.pi)
    # gelu_tanh: 0.5 h (1 + tanh(u)), u = sqrt(2/pi) (h + 0.044715 h^3)
    c = math.sqrt(2 / math.pi)
    t = torch.tanh(c * (h + 0.044715 * h ** 3))
    return 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * c * (1 + 3 * 0.044715 * h * h)


def _linear_act_backward(ctx, dy):
    """h = x W + b recomputed in float32; dh = dy * act'(h); dx = dh W^T, dW = x^T dh,
    db = sum dh."""
    x, weight, bias = ctx.saved_tensors
    xf, wf = x.float(), weight.float()
    h = xf @ wf
    if bias is not None:
        h = h + bias.float()
    dh = dy.float() * _activation_grad(h, ctx.activation)
    dx = (dh @ wf.t()).to(x.dtype) if ctx.needs_input_grad[0] else None
    dw = (xf.t() @ dh).to(weight.dtype) if ctx.needs_input_grad[1] else None
    db = dh.sum(0).to(bias.dtype) if bias is not None and ctx.needs_input_grad[2] else None
    return dx, dw, db, None


_linear_act_op.register_autograd(_linear_act_backward, setup_context=_linear_act_setup)


def linear_act(x: torch.Tensor, weight: torch.Tensor, bias=None,
               activation: str = "gelu") -> torch.Tensor:
    """act(x @ weight + bias) in one fused Triton matmul; differentiable (backward in PyTorch ops).

    x (M, K), weight (K, N) -- x @ weight, not F.linear's (N, K): pass `linear.weight.t()` --,
    bias (N,) or None; activation "relu", "gelu" (exact erf), "gelu_tanh" or "none". One dtype for
    all (float32, float16, bfloat16), any strides. float32 runs the matmul in TF32.
    """
    if _direct(x, weight, bias):
        return linear_act_fused(x, weight, bias, activation)
    return _linear_act_op(x, weight, bias, activation)
