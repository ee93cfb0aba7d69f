"""Linear + activation, `linear_act(x, weight, bias, activation)` = act(x @ weight + bias): x (M, K),
weight (K, N), i.e. `x @ weight`, NOT F.linear's (N, K) layout (pass `linear.weight.t()`, any
strides work). Unfused, the pre-activation (bias added in the matmul's epilogue) makes a round
trip through memory, stored in the input dtype as PyTorch eager stores it; fused, the bias and
activation are applied to the float32 accumulator before the single store. Both use
kernels._matmul's matmul. float32 defaults to "tf32" here (what fast float32 GEMMs use; label
such rows tf32), "ieee" on request.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .._buffers import empty
from .._checks import check_pow2
from .._tiles import cdiv, default_warps
from .._plans import cached, layout_key, plan_cache
from .._launch import launch
from .._matmul import (ACTIVATIONS, GemmLaunch, _activation_kernel, _check_operands, _gemm,
                          _precision, gemm_launch, run_gemm)
from .._autograd import LOWER, declare


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


@triton.jit
def _activation_grad_kernel(h_ptr, dy_ptr, dh_ptr, n, ACTIVATION: tl.constexpr,
                            BLOCK: tl.constexpr):
    """dh = dy * act'(h), flat and contiguous, math in float32."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    h = tl.load(h_ptr + offs, mask=mask).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask).to(tl.float32)
    if ACTIVATION == "relu":
        d = tl.where(h > 0, 1.0, 0.0)
    elif ACTIVATION == "gelu":  # Phi(h) + h phi(h)
        d = 0.5 * (1.0 + tl.erf(h * 0.7071067811865476)) + h * tl.exp(-0.5 * h * h) * \
            0.3989422804014327
    elif ACTIVATION == "gelu_tanh":  # 0.5 (1 + t) + 0.5 h (1 - t^2) u', t = tanh(u)
        u = 0.7978845608028654 * (h + 0.044715 * h * h * h)
        t = 2.0 * tl.sigmoid(2.0 * u) - 1.0
        d = 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * 0.7978845608028654 * (
            1.0 + 0.134145 * h * h)
    else:
        d = tl.full([BLOCK], 1.0, tl.float32)
    tl.store(dh_ptr + offs, (dy * d).to(dh_ptr.dtype.element_ty), mask=mask)


def backward(dy, x, weight, bias, activation, need_dx, need_dw, need_db) -> tuple:
    """(dx, dweight, dbias), None where not needed: h = x W + b recomputed by cuBLAS in the input
    dtype (as eager would have stored it); dh = dy * act'(h) in one Triton pass; dx = dh W^T,
    dW = x^T dh, db = sum dh (cuBLAS)."""
    h = torch.mm(x, weight) if bias is None else torch.addmm(bias, x, weight)
    dy = dy.contiguous()
    dh = torch.empty_like(h)
    block = 1024
    launch(_activation_grad_kernel, (cdiv(h.numel(), block),), h, dy, dh, h.numel(),
           ACTIVATION=activation, BLOCK=block)
    return (dh @ weight.t() if need_dx else None, x.t() @ dh if need_dw else None,
            dh.sum(0, dtype=torch.float32).to(bias.dtype) if need_db else None)


def _forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
             activation: str) -> torch.Tensor:
    return linear_act_fused(x, weight, bias, activation)


def _fake(x, weight, bias, activation):
    _check_operands(x, weight, bias, "K", "N")
    _check_activation(activation)
    return x.new_empty((x.shape[0], weight.shape[1]))


def _backward_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None, activation: str, need_dx: bool, need_dw: bool,
                 need_db: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`backward` as an op (for torch.compile and create_graph): a gradient not needed is an
    empty tensor (a custom op's outputs cannot be None)."""
    grads = backward(dy, x, weight, bias, activation, need_dx, need_dw, need_db)
    return tuple(x.new_empty((0,)) if g is None else g for g in grads)


def _backward_fake(dy, x, weight, bias, activation, need_dx, need_dw, need_db):
    none = x.new_empty((0,))
    return (x.new_empty(x.shape) if need_dx else none,
            weight.new_empty(weight.shape) if need_dw else none.clone(),
            bias.new_empty(bias.shape) if need_db else none.clone())


def _setup(ctx, inputs, output):
    x, weight, bias, activation = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.activation = activation


def _backward(ctx, bwd, dy):
    x, weight, bias = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dw, db = bwd(dy, x, weight, bias, ctx.activation, need[0], need[1],
                     bias is not None and need[2])
    return (dx if need[0] else None, dw if need[1] else None,
            db if bias is not None and need[2] else None, None)


_LINEAR_ACT = declare("linear_act", _forward, _fake, setup=_setup, backward=_backward,
                      backward_op=_backward_op, backward_fake=_backward_fake,
                      eager_backward=backward, direct=linear_act_fused, function=True,
                      autocast=LOWER)  # as F.linear


def linear_act(x: torch.Tensor, weight: torch.Tensor, bias=None,
               activation: str = "gelu") -> torch.Tensor:
    """act(x @ weight + bias) in one fused Triton matmul; differentiable (the backward recomputes
    the pre-activation with cuBLAS, one Triton pass makes its gradient, cuBLAS the two products).

    x (M, K), weight (K, N) -- x @ weight, not F.linear's (N, K): pass `linear.weight.t()` --,
    bias (N,) or None; activation "relu", "gelu" (exact erf), "gelu_tanh" or "none". One dtype for
    all (float32, float16, bfloat16), any strides. float32 runs the matmul in TF32.
    """
    return _LINEAR_ACT(x, weight, bias, activation)
