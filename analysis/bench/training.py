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
from . import peers, reductions
from .reductions import EPS
from .sweep import Compiled, Problem, Variant, fwd_bwd

# (rows, width) per dtype: the shapes issue 40 names (GPT-2's 768 and wider hidden sizes, a
# vocabulary-free softmax of 4096).
GRIDS = {
    "full": dict(layer_norm={torch.bfloat16: [(4096, 1024), (4096, 4096), (32768, 768)]},
                 softmax={torch.float32: [(4096, 4096)], torch.bfloat16: [(4096, 4096)]}),
    "book": dict(layer_norm={torch.bfloat16: [(4096, 1024), (32768, 768)]},
                 softmax={torch.bfloat16: [(4096, 4096)]}),
    "smoke": dict(layer_norm={torch.float32: [(5, 300)]}, softmax={torch.float16: [(3, 257)]}),
}


def _ln_eager(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


def _ln_ours(x, w, b):
    return kernels.layer_norm(x, w, b, EPS)


def _ln_liger(x, w, b):
    return peers.liger_layer_norm(x, w, b, EPS)


def _softmax_eager(x):
    return torch.softmax(x, -1)


def _softmax_inputs(rows, width, dtype, device):
    """The softmax family's x, and an incoming gradient."""
    return (*reductions._softmax_inputs(rows, width, dtype, device),
            torch.randn(rows, width, device=device, dtype=dtype))


def _softmax_grad_reference(x, dy):
    """float64 inputs in: (dx,) of softmax's forward + backward."""
    return (reductions._softmax_bwd_reference(torch.softmax(x, -1), dy),)


def _layer_norm_model(rows, width, s):
    kinds = [k for d in ("fwd", "bwd")
             for k in traffic.layer_norm_kernels(rows, width, s, "triton_fused", d)]
    return traffic.total(kinds), sum(traffic.layer_norm_flops(rows, width, d)
                                     for d in ("fwd", "bwd"))


def _softmax_model(rows, width, s):
    kinds = (traffic.softmax_kernels(rows, width, s, "triton_fused")
             + traffic.softmax_backward_kernels(rows, width, s, "triton_fused"))
    return (traffic.total(kinds),
            traffic.softmax_flops(rows, width) + traffic.softmax_backward_flops(rows, width))


# op: (grid key, inputs, float64 reference, (bytes, FLOPs) model, eager, ours, Liger)
OPS = {
    "layer_norm_fwd_bwd": ("layer_norm", reductions._ln_inputs, reductions._ln_reference_bwd,
                           _layer_norm_model, _ln_eager, _ln_ours, _ln_liger),
    "softmax_fwd_bwd": ("softmax", _softmax_inputs, _softmax_grad_reference, _softmax_model,
                        _softmax_eager, kernels.softmax, peers.liger_softmax_autograd),
}


def problems(grid: str = "full") -> list[Problem]:
    out = []
    for op, (key, inputs, reference, model, eager, ours, liger) in OPS.items():
        for dtype, shapes in GRIDS[grid][key].items():
            for rows, width in shapes:
                nbytes, flops = model(rows, width, reductions._itemsize(dtype))
                out.append(Problem(
                    family="training", op=op, dtype=dtype,
                    precision=reductions._precision(dtype), shape=dict(rows=rows, width=width),
                    make_inputs=functools.partial(inputs, rows, width, dtype),
                    reference=reference, bytes_model=nbytes, flops_model=flops,
                    tolerance=reductions.TOLERANCE[dtype] * 4, graph=False,
                    variants=[Variant("torch_eager", fwd_bwd(eager)),
                              Variant("torch_compile", fwd_bwd(Compiled(eager))),
                              Variant("liger", fwd_bwd(liger), variant=peers.label("liger")),
                              Variant("triton_fused", fwd_bwd(ours), variant="public op")]))
    return out
