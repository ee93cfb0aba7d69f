"""The memory-traffic model: bytes each kernel of each implementation must read and write, and FLOPs.

Counts are the compulsory traffic of each kernel (every input read once, every output written
once), not measured bytes. Achieved GB/s in the data divides `bytes_model`, the fused (fewest
possible) bytes of the op, by the measured time, so every implementation is scored against the
same work; `bytes_impl` is what that implementation's own kernels move by this model.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

# Which implementations keep intermediates on chip (one kernel) and which round-trip them.
FUSED_IMPLS = {"torch_compile", "triton_fused"}
UNFUSED_IMPLS = {"torch_eager", "triton_unfused"}


@dataclass(frozen=True)
class Kernel:
    name: str
    read: int  # bytes
    written: int  # bytes

    @property
    def total(self) -> int:
        return self.read + self.written


def add_mul_kernels(n: int, itemsize: int, z_kind: str, fused: bool) -> list[Kernel]:
    """(x + y) * z over n elements. z_kind: 'tensor' (n elements) or 'scalar' (a register)."""
    if z_kind not in ("tensor", "scalar"):
        raise ValueError(f"z_kind must be 'tensor' or 'scalar', got {z_kind!r}")
    z_bytes = n * itemsize if z_kind == "tensor" else 0
    e = n * itemsize
    if fused:
        return [Kernel("(x + y) * z", read=2 * e + z_bytes, written=e)]
    return [Kernel("t = x + y", read=2 * e, written=e), Kernel("t * z", read=e + z_bytes, written=e)]


def add_mul_bytes(n: int, itemsize: int, z_kind: str, impl: str) -> int:
    fused = impl in FUSED_IMPLS
    return sum(k.total for k in add_mul_kernels(n, itemsize, z_kind, fused))


def add_mul_flops(n: int) -> int:
    return 2 * n


def add_mul_table(n: int, itemsize: int) -> pd.DataFrame:
    """One row per kernel of each variant: what the report's traffic table shows."""
    rows = []
    for z_kind in ("tensor", "scalar"):
        for fused in (False, True):
            for k in add_mul_kernels(n, itemsize, z_kind, fused):
                rows.append(dict(z=z_kind, variant="fused" if fused else "unfused", kernel=k.name,
                                 read_elems=k.read // itemsize, written_elems=k.written // itemsize,
                                 bytes=k.total))
    return pd.DataFrame(rows)
