"""Forward + backward through autograd at training shapes, per call: the public ops as a model's
training step calls them (LayerNorm with its weight and bias trained, softmax) against eager,
torch.compile and Liger-Kernel. The times are wall time per call (ms_*): the autograd engine runs
a backward on a thread of its own, which a CUDA graph cannot capture, so these rows have no
ms_device, and each call's host cost counts, as it does in a step (docs/bench.md, "Where the
host's time goes"). The GPU side alone of each direction is in the softmax and layernorm
families' rows."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ... import kernels
from ..model import traffic
from . import peers
from .reductions import EPS, TOLERANCE, _itemsize, _ln_inputs, _ln_reference_bwd, _precision
from .sweep import Compiled, Problem, Variant

# (rows, width) per dtype: the shapes issue 40 names (GPT-2's 768 and wider hidden sizes, a
# vocabulary-free softmax of 4096).
GRIDS = {
    "full": dict(layer_norm={torch.bfloat16: [(4096, 1024), (4096, 4096), (32768, 768)]},
                 softmax={torch.float32: [(4096, 4096)], torch.bfloat16: [(4096, 4096)]}),
    "book": dict(layer_norm={torch.bfloat16: [(4096, 1024), (32768, 768)]},
                 softmax={torch.bfloat16: [(4096, 4096)]}),
    "smoke": dict(layer_norm={torch.float32: [(5, 300)]}, softmax={torch.float16: [(3, 257)]}),
}


def _fwd_bwd(forward, n_leaves: int):
    """(*inputs, dy) -> the gradients of the first n_leaves inputs: the forward, then its backward
    through autograd, as a training step runs them."""
    def call(*args):
        leaves = [t.detach().requires_grad_() for t in args[:n_leaves]]
        return torch.autograd.grad(forward(*leaves), leaves, args[-1])
    return call


def _ln_eager(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


def _ln_ours(x, w, b):
    return kernels.layer_norm(x, w, b, EPS)


def _ln_liger(x, w, b):
    return peers.liger_layer_norm(x, w, b, EPS)


def _softmax_eager(x):
    return torch.softmax(x, -1)


def _softmax_inputs(rows, width, dtype, device):
    return (torch.randn(rows, width, device=device, dtype=dtype) * 4,
            torch.randn(rows, width, device=device, dtype=dtype))


def _softmax_grad_reference(x, dy):
    """float64 inputs in: (dx,) of softmax's forward + backward."""
    y = torch.softmax(x, -1)
    return (y * (dy - (y * dy).sum(-1, keepdim=True)),)


def _variants(eager, ours, liger, n_leaves: int) -> list[Variant]:
    return [Variant("torch_eager", _fwd_bwd(eager, n_leaves)),
            Variant("torch_compile", _fwd_bwd(Compiled(eager), n_leaves)),
            Variant("liger", _fwd_bwd(liger, n_leaves), variant=peers.label("liger")),
            Variant("triton_fused", _fwd_bwd(ours, n_leaves), variant="public op")]


def problems(grid: str = "full") -> list[Problem]:
    g = GRIDS[grid]
    out = []
    for dtype, shapes in g["layer_norm"].items():
        s = _itemsize(dtype)
        for rows, width in shapes:
            kinds = [k for d in ("fwd", "bwd")
                     for k in traffic.layer_norm_kernels(rows, width, s, "triton_fused", d)]
            out.append(Problem(
                family="training", op="layer_norm_fwd_bwd", dtype=dtype,
                precision=_precision(dtype), shape=dict(rows=rows, width=width),
                make_inputs=functools.partial(_ln_inputs, rows, width, dtype),
                reference=_ln_reference_bwd, bytes_model=traffic.total(kinds),
                flops_model=(traffic.layer_norm_flops(rows, width, "fwd")
                             + traffic.layer_norm_flops(rows, width, "bwd")),
                tolerance=TOLERANCE[dtype] * 4,
                variants=_variants(_ln_eager, _ln_ours, _ln_liger, 3), graph=False))
    for dtype, shapes in g["softmax"].items():
        s = _itemsize(dtype)
        for rows, width in shapes:
            kinds = (traffic.softmax_kernels(rows, width, s, "triton_fused")
                     + traffic.softmax_backward_kernels(rows, width, s, "triton_fused"))
            out.append(Problem(
                family="training", op="softmax_fwd_bwd", dtype=dtype,
                precision=_precision(dtype), shape=dict(rows=rows, width=width),
                make_inputs=functools.partial(_softmax_inputs, rows, width, dtype),
                reference=_softmax_grad_reference, bytes_model=traffic.total(kinds),
                flops_model=(traffic.softmax_flops(rows, width)
                             + traffic.softmax_backward_flops(rows, width)),
                tolerance=TOLERANCE[dtype] * 4,
                variants=_variants(_softmax_eager, kernels.softmax, peers.liger_softmax_autograd,
                                   1), graph=False))
    return out
