"""Triton kernels: one module (or small subpackage) per public op under `families/`, each holding
`reference`, `triton_unfused` and `triton_fused` side by side with the plan that picks blocks and
the op itself (a PyTorch custom op, differentiable; linear_cross_entropy, new, has no unfused
Triton version yet: its baseline is the reference); shared private pieces beside this file
(`_checks`, `_buffers`, `_device`, `_tiles`, `_dot`, `_plans`, `_timer`, `_launch`, `_matmul`,
`_bmm`, `_stored_softmax`, `_autograd`); the ops as nn.Modules (`modules`) and `swap_in`, which
puts them into a model (`swap`)."""
from ._autograd import REGISTERED
from ._buffers import poisoned_outputs
from .families.add_mul import add_mul
from .families.attention import attention
from .families.layer_norm import layer_norm
from .families.linear_act import linear_act
from .families.linear_cross_entropy import linear_cross_entropy
from .families.matmul_softmax import matmul_softmax
from .families.softmax import softmax
from .families.softmax_matmul import softmax_matmul
from .modules import Attention, LayerNorm, LinearAct, LinearCrossEntropy
from .swap import SwapReport, swap_in

# What torch.library registered, by name (a backward op as "<op>_backward"; the tests run
# opcheck on each): every op the families declared.
OPS = dict(REGISTERED)

__all__ = [
    "OPS", "add_mul", "attention", "layer_norm", "linear_act", "linear_cross_entropy",
    "matmul_softmax",
    "poisoned_outputs", "softmax", "softmax_matmul",
    # nn.Module forms (kernels/modules.py) and the swap into a model (kernels/swap.py)
    "Attention", "LayerNorm", "LinearAct", "LinearCrossEntropy", "SwapReport", "swap_in",
]
