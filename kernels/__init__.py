"""Triton kernels, one module per fusion family; each holds `reference`, `triton_unfused` and
`triton_fused` side by side. The public API is the plain functions re-exported here."""
from ._common import poisoned_outputs
from .elementwise import add_mul
from .layernorm import layer_norm
from .linear_activation import linear_act
from .softmax_regression import matmul_softmax
from .row_softmax import softmax
from .softmax_v import softmax_matmul
from .flash_attention import attention

__all__ = [
    "add_mul", "attention", "layer_norm", "linear_act", "matmul_softmax", "poisoned_outputs",
    "softmax", "softmax_matmul",
]
