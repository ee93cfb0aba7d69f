"""Triton kernels: one module (or small subpackage) per public op under `families/`, each holding
`reference`, `triton_unfused` and `triton_fused` side by side with the plan that picks blocks and
the op itself (a PyTorch custom op, differentiable; linear_cross_entropy, new, has no unfused
Triton version yet: its baseline is the reference); shared private pieces beside this file
(`_checks`, `_buffers`, `_device`, `_tiles`, `_dot`, `_plans`, `_timer`, `_launch`, `_matmul`,
`_bmm`, `_stored_softmax`, `_autograd`)."""
from ._buffers import poisoned_outputs
from .families.add_mul import _add_mul_op, _add_mul_scalar_op, add_mul
from .families.attention import _attention_backward_op, _attention_op, attention
from .families.layer_norm import _layer_norm_backward_op, _layer_norm_op, layer_norm
from .families.linear_act import _linear_act_backward_op, _linear_act_op, linear_act
from .families.linear_cross_entropy import _linear_cross_entropy_op, linear_cross_entropy
from .families.matmul_softmax import _matmul_softmax_op, matmul_softmax
from .families.softmax import _softmax_backward_op, _softmax_op, softmax
from .families.softmax_matmul import _softmax_matmul_op, softmax_matmul

# What torch.library registered, by public name (the tests run opcheck on each).
OPS = {"add_mul": _add_mul_op, "add_mul_scalar": _add_mul_scalar_op, "softmax": _softmax_op,
       "softmax_backward": _softmax_backward_op, "layer_norm": _layer_norm_op,
       "layer_norm_backward": _layer_norm_backward_op, "softmax_matmul": _softmax_matmul_op,
       "attention": _attention_op, "attention_backward": _attention_backward_op,
       "matmul_softmax": _matmul_softmax_op, "linear_act": _linear_act_op,
       "linear_act_backward": _linear_act_backward_op,
       "linear_cross_entropy": _linear_cross_entropy_op}

__all__ = [
    "OPS", "add_mul", "attention", "layer_norm", "linear_act", "linear_cross_entropy",
    "matmul_softmax",
    "poisoned_outputs", "softmax", "softmax_matmul",
]
