"""Triton kernels, one module per fusion family; each holds `reference`, `triton_unfused` and
`triton_fused` side by side. The public API is the functions of `ops` (registered as PyTorch
custom ops, differentiable), re-exported here."""
from ._common import poisoned_outputs
from .ops import add_mul, attention, layer_norm, linear_act, matmul_softmax, softmax, softmax_matmul

__all__ = [
    "add_mul", "attention", "layer_norm", "linear_act", "matmul_softmax", "poisoned_outputs",
    "softmax", "softmax_matmul",
]
