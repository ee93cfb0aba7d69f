"""The add-multiply family's sweep grids: sizes 2^12..2^28, block sizes 128..4096."""
from __future__ import annotations

import functools
import random

import torch

from ...kernels.families import add_mul as ew

from ..model import traffic
from .sweep import Problem, Variant, compiled_variants

FAMILY = "elementwise"
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

GRIDS = {
    # sizes with default launch settings, per dtype; block sweep sizes; blocks
    "full": dict(
        # 10**8: a size that is no power of two (a tail in every program's last block).
        sizes={torch.float32: [2**k for k in range(12, 29)] + [10**8],
               torch.float16: [2**20, 2**24, 2**27], torch.bfloat16: [2**20, 2**24, 2**27]},
        block_sizes=[2**20, 2**24, 2**27],
        blocks=[128, 256, 512, 1024, 2048, 4096],
    ),
    # What the book shows: every other size of the full grid's range, the other dtypes at the
    # headline size, the block sweep at one size.
    "book": dict(
        sizes={torch.float32: [2**12, 2**16, 2**20, 2**24, 2**27, 2**28],
               torch.float16: [2**27], torch.bfloat16: [2**27]},
        block_sizes=[2**24],
        blocks=[128, 256, 512, 1024, 2048, 4096],
    ),
    # For the CPU interpreter: odd sizes, a couple of blocks.
    "smoke": dict(
        sizes={torch.float32: [1000, 4097], torch.float16: [1000]},
        block_sizes=[4097],
        blocks=[128, 1024],
    ),
}


def _inputs(n: int, dtype: torch.dtype, z_kind: str, device: torch.device):
    x = torch.randn(n, device=device, dtype=dtype)
    y = torch.randn(n, device=device, dtype=dtype)
    z = torch.randn(n, device=device, dtype=dtype) if z_kind == "tensor" else random.uniform(0.5, 2)
    return x, y, z


def _variants(n, itemsize, z_kind, blocks, sweep):
    out = []
    if sweep == "size":
        out.append(Variant("torch_eager", ew.reference,
                           bytes_impl=traffic.add_mul_bytes(n, itemsize, z_kind, "torch_eager")))
    for impl, fn in (("triton_unfused", ew.triton_unfused), ("triton_fused", ew.triton_fused)):
        for block in blocks:
            warps = ew.default_warps(block)
            out.append(Variant(impl, functools.partial(fn, block=block, num_warps=warps),
                               block=block, num_warps=warps, sweep=sweep,
                               bytes_impl=traffic.add_mul_bytes(n, itemsize, z_kind, impl)))
    if sweep == "size":
        out += compiled_variants(ew.reference,
                                 traffic.add_mul_bytes(n, itemsize, z_kind, "torch_compile"))
    return out


def problems(grid: str = "full") -> list[Problem]:
    g = GRIDS[grid]
    out = []
    for dtype, sizes in g["sizes"].items():
        itemsize = torch.empty((), dtype=dtype).element_size()
        precision = "ieee" if dtype == torch.float32 else str(dtype).replace("torch.", "")
        for z_kind in ("tensor", "scalar"):
            for n in sizes:
                sweeps = [("size", [ew.DEFAULT_BLOCK])]
                if dtype == torch.float32 and n in g["block_sizes"]:
                    sweeps.append(("block", g["blocks"]))
                variants = [v for sweep, blocks in sweeps
                            for v in _variants(n, itemsize, z_kind, blocks, sweep)]
                # torch.compile last, so no compilation work overlaps the others' timing.
                variants.sort(key=lambda v: v.impl.startswith("torch_compile"))
                out.append(Problem(
                    family=FAMILY, op="add_mul", dtype=dtype, precision=precision,
                    shape=dict(n=n, z_kind=z_kind),
                    make_inputs=functools.partial(_inputs, n, dtype, z_kind),
                    reference=ew.reference,
                    bytes_model=traffic.add_mul_bytes(n, itemsize, z_kind, "triton_fused"),
                    flops_model=traffic.add_mul_flops(n),
                    tolerance=TOLERANCE[dtype], variants=variants, graph=True))
    return out
