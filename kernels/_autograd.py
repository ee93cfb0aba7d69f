"""The public ops, registered with PyTorch (`torch.library.custom_op`, namespace `triton_fusion`),
so that a model calling them compiles with `torch.compile(fullgraph=True)`, captures in a CUDA
graph and passes `torch.library.opcheck`.

Each op has its Triton implementation (the family module's fused version), a fake
implementation (the same input checks, then an empty result of the right shape: errors surface
at trace time with the messages of eager) and an autograd formula. softmax, LayerNorm and
attention have backward kernels; the others' backward is written in PyTorch ops (correct, not
fused).
Backward ops have no second derivative: differentiating through one raises. Forward-mode AD
(dual tensors) raises too.

The public functions (`kernels.softmax` ...) call the Triton implementation directly when nothing
needs the dispatcher (eager, no input requiring grad, plain tensors or nn.Parameters): a custom
op's Python dispatch costs tens of microseconds a call, more than a small kernel's launch. Under
torch.compile, export and fake tensors they call the registered op; in eager autograd (an input
requiring grad) LayerNorm, softmax and attention take an autograd.Function instead: the same
kernels at less host cost a call, whose backward calls the registered backward op under
create_graph (so a second derivative still raises).
"""
from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad


NS = "triton_fusion"


# Tensors the implementations may take without the dispatcher: nn.Parameter (a model's weights)
# is a plain tensor to every op (it overrides no torch function).
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _direct(*tensors) -> bool:
    """True where the op's implementation may be called without the dispatcher."""
    if torch.compiler.is_compiling():
        return False
    if _fwad._current_level >= 0:
        _refuse_tangents(tensors)
    grad = torch.is_grad_enabled()
    for t in tensors:
        if isinstance(t, torch.Tensor) and (type(t) not in _PLAIN or (grad and t.requires_grad)):
            return False
    return True


def _refuse_tangents(tensors) -> None:
    """Forward-mode AD has no formula here: an input with a tangent raises rather than return a
    result whose tangent is silently dropped."""
    if any(isinstance(t, torch.Tensor) and _fwad.unpack_dual(t).tangent is not None
           for t in tensors):
        raise NotImplementedError(
            "forward-mode AD (torch.autograd.forward_ad) is not implemented for the Triton ops: "
            "the tangent would be dropped; use the PyTorch reference (each family module's "
            "`reference`) for jvp")


def _no_double_backward(name):
    def backward(ctx, *grads):
        raise RuntimeError(f"{name}: the second derivative is not implemented (the backward "
                           "kernel is not differentiable); use the PyTorch reference for "
                           "double backward")
    return backward


def _empty_like_rows(x):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)
