"""Sweep grids of the reduction families: softmax and LayerNorm over the last dim of
(rows, width) tensors."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ...kernels.families import layer_norm as ln
from ...kernels.families.layer_norm import backward as lnb
from ...kernels.families.softmax import forward as sm
from ...kernels.families.softmax import backward as smb

from ..model import traffic
from . import peers
from .sweep import MAX_AUTOTUNE, Compiled, Problem, Variant, compiled_variants

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

GRIDS = {
    "full": dict(
        # Besides powers of two: a 5120 hidden size, GPT-2's 50257-wide vocabulary, and few rows
        # (8 or 16: decoding's logits), where a row is split across programs.
        softmax={torch.float32: [(4096, 2**k) for k in range(10, 19)]
                 + [(4096, 5120), (4096, 50257), (8, 50257), (8, 262144)],
                 torch.float16: [(4096, 4096), (4096, 65536), (4096, 50257), (16, 50257)],
                 torch.bfloat16: [(4096, 4096), (4096, 65536), (4096, 50257)]},
        # (rows, width) where the block / warps / path sweep runs (fp32)
        softmax_sweep=[(4096, 4096), (4096, 65536), (4096, 262144)],
        warps=[1, 2, 4, 8, 16, 32],
        tiles=[1024, 2048, 4096, 8192, 16384, 32768],
        layernorm={torch.float16: [(4096, w) for w in (1024, 2048, 4096, 8192, 16384)]
                   + [(4096, 5120), (8, 5120)],
                   torch.float32: [(4096, 1024), (4096, 4096), (4096, 16384)],
                   torch.bfloat16: [(4096, 4096), (4096, 5120)]},
    ),
    # What the book shows: the width sweep at every other power of two, the odd widths, float16
    # at the vocabulary's width; the paths against each other at their default tiles (no tile
    # or warps sweep); bfloat16 (which tracks float16) left out.
    "book": dict(
        softmax={torch.float32: [(4096, 2**k) for k in (10, 12, 14, 16, 18)]
                 + [(4096, 50257), (8, 50257)],
                 torch.float16: [(4096, 50257)]},
        softmax_sweep=[],
        warps=[1, 2, 4, 8, 16, 32],
        tiles=[1024, 2048, 4096, 8192, 16384, 32768],
        layernorm={torch.float16: [(4096, w) for w in (1024, 4096, 16384)] + [(8, 5120)]},
    ),
    "smoke": dict(
        softmax={torch.float32: [(3, 1000), (2, 40000)], torch.float16: [(5, 257)]},
        softmax_sweep=[(3, 1000)],
        warps=[1, 4],
        tiles=[256],
        layernorm={torch.float32: [(5, 300)], torch.float16: [(3, 1000)]},
    ),
}


def _precision(dtype):
    return "ieee" if dtype == torch.float32 else str(dtype).replace("torch.", "")


def _itemsize(dtype):
    return torch.empty((), dtype=dtype).element_size()


# --- softmax ------------------------------------------------------------------------------------

def _softmax_inputs(rows, width, dtype, device):
    return (torch.randn(rows, width, device=device, dtype=dtype) * 4,)


def _reads_twice(p: "sm.Plan") -> bool:
    """Whether a softmax plan reads x twice (online, split, coop with chunks over one tile)."""
    return p.path in (sm.ONLINE, sm.SPLIT) or (p.path == sm.COOP and p.chunk > p.block)


def softmax_problems(grid: str = "full") -> list[Problem]:
    g = GRIDS[grid]
    out = []
    for dtype, shapes in g["softmax"].items():
        s = _itemsize(dtype)
        for rows, width in shapes:
            p = sm.plan(rows, width, itemsize=s)
            online = _reads_twice(p)

            def impl_bytes(impl, online=online, rows=rows, width=width, s=s):
                return traffic.total(traffic.softmax_kernels(rows, width, s, impl, online))

            variants = [
                Variant("torch_eager", sm.reference, bytes_impl=impl_bytes("torch_eager")),
                Variant("triton_unfused", sm.triton_unfused, bytes_impl=impl_bytes("triton_unfused")),
                Variant("triton_fused", sm.triton_fused, block=p.block, num_warps=p.num_warps,
                        variant=p.path, bytes_impl=impl_bytes("triton_fused")),
            ]
            if p.path != sm.ONE_PASS and (rows, width) not in g["softmax_sweep"]:
                # The other wide-row paths (one row per program, co-operative) at their default
                # tiles against the default at every wide row.
                for other in (sm.ONLINE, sm.COOP):
                    if other == p.path:
                        continue
                    q = sm.plan(rows, width, itemsize=s, path=other)
                    variants.append(Variant(
                        "triton_fused", functools.partial(sm.triton_fused, path=other),
                        block=q.block, num_warps=q.num_warps, sweep="block", variant=other,
                        bytes_impl=traffic.total(traffic.softmax_kernels(
                            rows, width, s, "triton_fused", online=_reads_twice(q)))))
            if dtype == torch.float32 and (rows, width) in g["softmax_sweep"]:
                variants += _softmax_sweep_variants(rows, width, s, g)
            variants += compiled_variants(sm.reference, impl_bytes("torch_compile"))
            variants += peers.softmax_variants(impl_bytes("triton_fused"))
            out.append(Problem(
                family="softmax", op="softmax", dtype=dtype, precision=_precision(dtype),
                shape=dict(rows=rows, width=width, direction="fwd"),
                make_inputs=functools.partial(_softmax_inputs, rows, width, dtype),
                reference=sm.reference,
                bytes_model=traffic.total(traffic.softmax_kernels(rows, width, s, "triton_fused")),
                flops_model=traffic.softmax_flops(rows, width),
                tolerance=TOLERANCE[dtype], variants=variants))
    # After the forward problems, so that each forward problem keeps its index (the fingerprint
    # seeds its inputs by it).
    return out + softmax_backward_problems(grid)


def _softmax_sweep_variants(rows, width, s, g):
    """Warps for the default path; tile sizes (and warps) for the looping paths."""
    out = []
    default = sm.plan(rows, width, itemsize=s)
    for warps in g["warps"]:
        if warps != default.num_warps:
            out.append(Variant("triton_fused", functools.partial(sm.triton_fused, num_warps=warps),
                               block=default.block, num_warps=warps, sweep="block",
                               variant=default.path))
    for path in (sm.ONLINE, sm.SPLIT, sm.COOP):
        for tile in g["tiles"]:
            if tile > width:
                continue
            p = sm.plan(rows, width, itemsize=s, path=path, block=tile)
            out.append(Variant("triton_fused",
                               functools.partial(sm.triton_fused, path=path, block=tile),
                               block=tile, num_warps=p.num_warps, sweep="block", variant=path,
                               bytes_impl=traffic.total(traffic.softmax_kernels(
                                   rows, width, s, "triton_fused", online=_reads_twice(p)))))
    return out


# --- softmax backward ------------------------------------------------------------------------------
# op "softmax_bwd", direction "bwd": dx = y * (dy - sum(y * dy)) from the forward's output y, each
# implementation called directly (no autograd engine), so every call is captured for ms_device.

def _softmax_bwd_inputs(rows, width, dtype, device):
    """y: a softmax output of the forward's inputs (rows summing to 1); dy: the incoming gradient."""
    x = torch.randn(rows, width, device=device, dtype=torch.float32) * 4
    y = torch.softmax(x, -1).to(dtype)
    return y, torch.randn(rows, width, device=device, dtype=dtype)


def _softmax_bwd_formula(y, dy):
    """The backward as a formula for torch.compile: float32 math, dx in y's dtype (as PyTorch's
    decomposition of _softmax_backward_data, and as our kernels, compute it)."""
    y32, dy32 = y.float(), dy.float()
    return (y32 * (dy32 - (y32 * dy32).sum(-1, keepdim=True))).to(y.dtype)


def _softmax_bwd_reference(y, dy):
    """float64 inputs in, float64 dx out."""
    return y * (dy - (y * dy).sum(-1, keepdim=True))


def softmax_backward_problems(grid: str = "full") -> list[Problem]:
    """The forward's (rows, width, dtype) grid, backward: eager, compiled, unfused, fused."""
    out = []
    for dtype, shapes in GRIDS[grid]["softmax"].items():
        s = _itemsize(dtype)
        for rows, width in shapes:
            p = smb.plan(width, s)

            def impl_bytes(impl, rows=rows, width=width, s=s, p=p):
                return traffic.total(traffic.softmax_backward_kernels(
                    rows, width, s, impl, two_pass=p.path == smb.TWO_PASS))

            variants = [
                Variant("torch_eager", smb.reference, bytes_impl=impl_bytes("torch_eager")),
                Variant("triton_unfused", smb.triton_unfused, bytes_impl=impl_bytes("triton_unfused")),
                Variant("triton_fused", smb.triton_fused, block=p.block, num_warps=p.num_warps,
                        variant=p.path, bytes_impl=impl_bytes("triton_fused")),
                *compiled_variants(_softmax_bwd_formula, impl_bytes("torch_compile")),
                *peers.softmax_backward_variants(impl_bytes("triton_fused")),
            ]
            out.append(Problem(
                family="softmax", op="softmax_bwd", dtype=dtype, precision=_precision(dtype),
                shape=dict(rows=rows, width=width, direction="bwd"),
                make_inputs=functools.partial(_softmax_bwd_inputs, rows, width, dtype),
                reference=_softmax_bwd_reference,
                bytes_model=traffic.total(traffic.softmax_backward_kernels(rows, width, s,
                                                                           "triton_fused")),
                flops_model=traffic.softmax_backward_flops(rows, width),
                tolerance=TOLERANCE[dtype] * 4, variants=variants))
    return out


# --- LayerNorm ------------------------------------------------------------------------------------

EPS = 1e-5


def _ln_inputs(rows, width, dtype, device):
    x = torch.randn(rows, width, device=device, dtype=dtype) * 2 + 0.5
    w = 1 + 0.1 * torch.randn(width, device=device, dtype=dtype)
    b = 0.1 * torch.randn(width, device=device, dtype=dtype)
    dy = torch.randn(rows, width, device=device, dtype=dtype)
    return x, w, b, dy


def _ln_forward(fn):
    def forward(x, w, b, dy):
        return fn(x, w, b, EPS)
    return forward


def _ln_reference_fwd(x, w, b, dy):
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


class _Backward:
    """Times the backward alone: the forward graph is built once (first call), then every call
    runs autograd.grad on it (retain_graph) and returns (dx, dweight, dbias)."""

    def __init__(self, forward):
        self.forward, self.graph = forward, None

    def __call__(self, x, w, b, dy):
        if self.graph is None:
            leaves = [t.detach().requires_grad_() for t in (x, w, b)]
            self.graph = (self.forward(*leaves, EPS), leaves)
        y, leaves = self.graph
        return torch.autograd.grad(y, leaves, dy, retain_graph=True)


class _DirectBackward:
    """The backward's kernels called directly, without the autograd engine (which runs a backward
    on its own thread, so a CUDA graph cannot capture it): what ms_device replays for the backward.
    The forward's saved statistics are computed once, at the first call.
    kind: "eager" (aten.native_layer_norm_backward), "compile" (the same op through torch.compile:
    Inductor's decomposition, as in a compiled model's backward) or "fused" (ours)."""

    def __init__(self, kind, mode=None):
        self.kind, self.saved = kind, None
        self.compiled = Compiled(_aten_ln_backward, mode) if kind == "compile" else None

    def __call__(self, x, w, b, dy):
        n = x.shape[-1]
        if self.saved is None:
            if self.kind == "fused":
                self.saved = ln._fused_forward(x, w, b, EPS, None, None, None)[1]
            else:
                self.saved = torch.ops.aten.native_layer_norm(x, [n], w, b, EPS)[1:]
        if self.kind == "fused":
            return lnb.backward(dy, x, w, self.saved, True, True, None, None, None)
        fn = self.compiled if self.kind == "compile" else _aten_ln_backward
        return fn(dy, x, *self.saved, w, b)


def _aten_ln_backward(dy, x, mean, rstd, w, b):
    return torch.ops.aten.native_layer_norm_backward(dy, x, [x.shape[-1]], mean, rstd, w, b,
                                                     [True, True, True])


def _ln_reference_bwd(x, w, b, dy):
    leaves = [t.detach().requires_grad_() for t in (x, w, b)]
    y = F.layer_norm(leaves[0], (x.shape[-1],), leaves[1], leaves[2], EPS)
    return torch.autograd.grad(y, leaves, dy)


def _torch_ln(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def layernorm_problems(grid: str = "full") -> list[Problem]:
    g = GRIDS[grid]
    out = []
    for dtype, shapes in g["layernorm"].items():
        s = _itemsize(dtype)
        for rows, width in shapes:
            for direction in ("fwd", "bwd"):
                def impl_bytes(impl, rows=rows, width=width, s=s, direction=direction):
                    groups = ln.bwd_groups(rows) if direction == "bwd" else 0
                    if impl != "triton_fused":
                        groups = 0
                    return traffic.total(traffic.layer_norm_kernels(rows, width, s, impl,
                                                                    direction, groups))
                if direction == "fwd":
                    variants = [
                        Variant("torch_eager", _ln_forward(_torch_ln), bytes_impl=impl_bytes("torch_eager")),
                        Variant("triton_unfused", _ln_forward(ln.triton_unfused),
                                bytes_impl=impl_bytes("triton_unfused")),
                        Variant("triton_fused", _ln_forward(ln.triton_fused),
                                bytes_impl=impl_bytes("triton_fused")),
                        *compiled_variants(_ln_forward(_torch_ln), impl_bytes("torch_compile")),
                        Variant("liger", _ln_forward(peers.liger_layer_norm),
                                variant=peers.label("liger"), bytes_impl=impl_bytes("triton_fused")),
                        Variant("flag_gems", _ln_forward(peers.flag_gems_layer_norm),
                                variant=peers.label("flag_gems"),
                                bytes_impl=impl_bytes("triton_fused")),
                    ]
                    reference = _ln_reference_fwd
                else:
                    # Timed per call through autograd (ms_*) and, for the GPU side alone, as the
                    # backward's kernels called directly under graph replay (ms_device).
                    variants = [
                        Variant("torch_eager", _Backward(_torch_ln), bytes_impl=impl_bytes("torch_eager"),
                                graph_fn=_DirectBackward("eager")),
                        Variant("triton_fused", _Backward(ln.triton_fused),
                                bytes_impl=impl_bytes("triton_fused"),
                                graph_fn=_DirectBackward("fused")),
                        Variant("torch_compile", _Backward(Compiled(_torch_ln)),
                                bytes_impl=impl_bytes("torch_compile"),
                                graph_fn=_DirectBackward("compile")),
                        Variant("torch_compile_max", _Backward(Compiled(_torch_ln, MAX_AUTOTUNE)),
                                variant=MAX_AUTOTUNE, bytes_impl=impl_bytes("torch_compile"),
                                graph_fn=_DirectBackward("compile", MAX_AUTOTUNE)),
                        Variant("liger", _Backward(peers.liger_layer_norm),
                                variant=peers.label("liger"), bytes_impl=impl_bytes("triton_fused"),
                                graph_fn=peers.LigerLayerNormBackward(EPS)),
                        # Called directly: FlagGems' autograd needs its aten patches on.
                        Variant("flag_gems", peers.FlagGemsLayerNormBackward(EPS),
                                variant=peers.label("flag_gems"),
                                bytes_impl=impl_bytes("triton_fused")),
                    ]
                    reference = _ln_reference_bwd
                out.append(Problem(
                    family="layernorm", op=f"layer_norm_{direction}", dtype=dtype,
                    precision=_precision(dtype),
                    shape=dict(rows=rows, width=width, direction=direction),
                    make_inputs=functools.partial(_ln_inputs, rows, width, dtype),
                    reference=reference,
                    bytes_model=traffic.total(traffic.layer_norm_kernels(rows, width, s,
                                                                         "triton_fused", direction)),
                    flops_model=traffic.layer_norm_flops(rows, width, direction),
                    tolerance=TOLERANCE[dtype] * (4 if direction == "bwd" else 1),
                    variants=variants, graph=True))
    return out
