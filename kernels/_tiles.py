"""Host arithmetic for tiles and grids, and the default tiles every family shares."""
from __future__ import annotations

from ._checks import check_pow2, check_warps


def cdiv(a: int, b: int) -> int:
    """Ceiling division on the host (triton.cdiv is a constexpr function: microseconds a call)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), on the host (see cdiv)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


def default_warps(block: int) -> int:
    """One warp per 256 elements of a 1-D block, between 1 and 16."""
    return max(1, min(16, block // 256))


# The unfused baselines' tile: one row's worth up to this, then loops over tiles of this width.
UNFUSED_BLOCK = 4096


def unfused_tile(n_cols: int, block=None, num_warps=None) -> tuple[int, int]:
    """(block, num_warps) of an unfused baseline's kernels: the row rounded up to a power of two
    (at most UNFUSED_BLOCK) unless given, warps from the block unless given; both checked."""
    block = min(UNFUSED_BLOCK, max(16, next_pow2(n_cols))) if block is None else block
    check_pow2("block", block)
    num_warps = default_warps(block) if num_warps is None else num_warps
    check_warps(num_warps)
    return block, num_warps
