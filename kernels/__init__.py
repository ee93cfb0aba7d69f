"""Triton kernels, one module per fusion family; each holds `reference`, `triton_unfused` and
`triton_fused` side by side. The public API is the plain functions re-exported here."""
from ._common import poisoned_outputs
from .elementwise import add_mul
from .layernorm import layer_norm
from .matmul_epilogue import linear_act, matmul_softmax
from .softmax import softmax
from .softmax_matmul import softmax_matmul
from .attention import attention

__all__ = [
    "add_mul", "attention", "layer_norm", "linear_act", "matmul_softmax", "poisoned_outputs",
    "softmax", "softmax_matmul",
]
