"""The ops as `nn.Module`s, where PyTorch has a module for them, holding their parameters under
PyTorch's names and shapes, so that a state dict saved from PyTorch's module loads as it is:

- `LayerNorm`: an nn.LayerNorm (its subclass: the same parameters, options and initialisation)
  whose forward is `kernels.layer_norm`;
- `LinearAct`: nn.Linear's `weight` (out, in) and `bias`, then an activation, as one
  `kernels.linear_act` (which takes the weight as (in, out): it is given `weight.t()`);
- `LinearCrossEntropy`: an LM head (nn.Linear's `weight` (classes, in) and `bias`) that, given
  targets, returns their cross-entropy loss without making the logits (`linear_cross_entropy`);
  without targets it returns the logits, as the nn.Linear it stands for;
- `Attention`: SDPA's core, softmax(q k^T * scale) v, no parameters.

Each takes leading dims as PyTorch's modules do, and autocast as the ops do (kernels/_autograd.py).
`from_torch` / `from_linear` make one from a PyTorch module, sharing its parameters (tied weights
and an optimizer's references stay valid): `kernels.swap_in` builds on them.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .families.attention import attention
from .families.layer_norm import layer_norm
from .families.linear_act import linear_act
from .families.linear_cross_entropy import REDUCTIONS, linear_cross_entropy

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "none")

__all__ = ["ACTIVATIONS", "Attention", "LayerNorm", "LinearAct", "LinearCrossEntropy"]


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm over the last dim in the project's fused kernels (forward and backward).

    The arguments, parameters (`weight`, `bias`; None without elementwise_affine or bias) and
    initialisation are nn.LayerNorm's; normalized_shape must be one size (the kernels normalise
    the last dim only)."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device=device,
                         dtype=dtype)
        if len(self.normalized_shape) != 1:
            raise ValueError("LayerNorm normalises over the last dim only: normalized_shape must "
                             f"be one size, got {tuple(self.normalized_shape)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)

    @classmethod
    def from_torch(cls, ln: nn.LayerNorm) -> "LayerNorm":
        """The same LayerNorm, sharing ln's parameters."""
        new = cls(ln.normalized_shape, ln.eps, ln.elementwise_affine, ln.bias is not None,
                  device="meta")
        new.weight, new.bias = ln.weight, ln.bias
        return new


def _linear_parameters(module, in_features, out_features, bias, device, dtype) -> None:
    module.in_features, module.out_features = in_features, out_features
    module.weight = nn.Parameter(torch.empty((out_features, in_features), device=device,
                                             dtype=dtype))
    if bias:
        module.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
    else:
        module.register_parameter("bias", None)
    _reset_linear(module)


def _reset_linear(module) -> None:
    """nn.Linear's initialisation."""
    if module.weight.is_meta:
        return
    nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5))
    if module.bias is not None:
        fan_in = module.weight.shape[1]
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        nn.init.uniform_(module.bias, -bound, bound)


def _share(new, linear: nn.Linear):
    new.weight, new.bias = linear.weight, linear.bias
    return new


class LinearAct(nn.Module):
    """act(F.linear(x, weight, bias)) in one fused Triton matmul: an nn.Linear and the activation
    after it. weight (out_features, in_features) and bias (out_features) or None, as nn.Linear's,
    initialised as its; activation "relu", "gelu" (exact erf), "gelu_tanh" or "none". x (...,
    in_features) -> (..., out_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 activation: str = "gelu", device=None, dtype=None):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.activation = activation
        _linear_parameters(self, in_features, out_features, bias, device, dtype)

    reset_parameters = _reset_linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = linear_act(x.reshape(-1, x.shape[-1]), self.weight.t(), self.bias, self.activation)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, activation={self.activation!r}")

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation: str) -> "LinearAct":
        """linear followed by activation, sharing linear's parameters."""
        return _share(cls(linear.in_features, linear.out_features, linear.bias is not None,
                          activation, device="meta"), linear)


class LinearCrossEntropy(nn.Module):
    """An LM head and its loss: `forward(x, target)` is F.cross_entropy(F.linear(x, weight,
    bias), target) without the (tokens, classes) logits ever held (`linear_cross_entropy`);
    `forward(x)` returns the logits, F.linear(x, weight, bias), as the nn.Linear it replaces.

    weight (out_features, in_features) and bias (out_features) or None, as nn.Linear's. x (...,
    in_features), target (...) int64 class indices; ignore_index, reduction ("mean" or "sum")
    and label_smoothing as F.cross_entropy's. The loss is float32."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0, device=None, dtype=None):
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing = label_smoothing
        _linear_parameters(self, in_features, out_features, bias, device, dtype)

    reset_parameters = _reset_linear

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None,
                reduction: str | None = None) -> torch.Tensor:
        """reduction: this call's, instead of the module's."""
        if target is None:
            return F.linear(x, self.weight, self.bias)
        return linear_cross_entropy(x.reshape(-1, x.shape[-1]), self.weight, target.reshape(-1),
                                    self.bias, self.ignore_index, reduction or self.reduction,
                                    self.label_smoothing)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, reduction={self.reduction!r}")

    @classmethod
    def from_linear(cls, linear: nn.Linear, **loss_options) -> "LinearCrossEntropy":
        """linear as an LM head with its loss, sharing linear's parameters."""
        return _share(cls(linear.in_features, linear.out_features, linear.bias is not None,
                          device="meta", **loss_options), linear)


class Attention(nn.Module):
    """softmax(q k^T * scale [causal mask]) v, as F.scaled_dot_product_attention(q, k, v,
    is_causal=causal, scale=scale) without a mask or dropout; no parameters. q (batch, heads,
    seq_q, head_dim), k and v (batch, kv_heads, seq_k, head_dim): see `kernels.attention` (a
    causal mask aligned to the bottom right where seq_q < seq_k)."""

    def __init__(self, causal: bool = False, scale: float | None = None):
        super().__init__()
        self.causal, self.scale = causal, scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attention(q, k, v, self.causal, self.scale)

    def extra_repr(self) -> str:
        return f"causal={self.causal}, scale={self.scale}"
