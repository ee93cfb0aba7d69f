"""How `forward.triton_fused` runs a layout: the one place where the softmax's path, tiles, warps,
splits and vector width are decided (`plan`), from the row count and width, the element size, the
row stride and whether x's base is 16-byte aligned. Nothing the launch does overrides it.

The thresholds were measured on an H100; docs/softmax.md has the measurements behind each.
(Named `planning`, not `plan`: the family's package exports the function `plan`, which a module
of that name would shadow.)
"""
from __future__ import annotations

from typing import NamedTuple

from ..._checks import check_pow2, check_warps
from ..._device import interpreting, sm_count_of
from ..._tiles import cdiv, default_warps, next_pow2

ONE_PASS, ONLINE, SPLIT, COOP = "one_pass", "online", "split", "coop"
PATHS = (ONE_PASS, ONLINE, SPLIT, COOP)

# Longest row the one-pass kernel keeps whole in registers: 16 warps hold it without spilling,
# twice the row would not (docs/softmax.md, "the four paths").
MAX_ONE_PASS = 32768
# Default tile of the online kernel: 16 warps, 64 float32 a thread. The largest tile measured
# fastest: more bytes in flight per SM, and a row of two tiles is re-read from L2.
ONLINE_BLOCK = 32768
# Rows up to this many bytes take the online kernel by default; longer float32 rows the coop
# path, which overtakes online where one row per SM in flight no longer fits the L2. 16-bit rows
# stay online: a 32768-element chunk is only 64 KiB there, too few bytes in flight for one
# program per SM.
ONLINE_MAX_ROW_BYTES = 384 * 1024
# 16-bit rows longer than the smallest of these tiles, on the online path: the largest tile that
# leaves at most this share of the padded row masked (a half-masked last tile costs more than a
# smaller tile does).
HALF_ONLINE_TILES = ((32768, 16), (16384, 16), (8192, 8))
HALF_ONLINE_MAX_PAD = 0.15

# The coop kernel's register tile is loaded in 16-byte vectors only where Triton can prove the
# rows aligned: a width and row stride that are multiples of 16 elements (what it hints an int
# argument by) and an aligned base. Otherwise every load is one element, several times slower
# than the online path: such rows take the online path.
COOP_ALIGN = 16

# Tile of the split path: smaller, so that a few long rows still make enough programs.
SPLIT_BLOCK = 8192
# The split path aims at this many programs per SM in all.
SPLIT_PROGRAMS_PER_SM = 2

# The coop path splits a row into chunks of at most COOP_BLOCK elements, so each chunk stays in
# registers (one program per SM, like the one-pass kernel at MAX_ONE_PASS) and x is read once.
# Rows too long for that (more than MAX_COOP_SPLITS chunks) loop over their chunks and read them
# twice; then the chunks read by all programs at once are kept within COOP_L2_BUDGET bytes, so
# the second read comes from the 50 MB L2 of an H100 rather than from memory.
COOP_BLOCK = 32768
MAX_COOP_SPLITS = 16
COOP_L2_BUDGET = 40 * 2**20


class Plan(NamedTuple):
    """How `triton_fused` runs a layout: which kernel, its block (whole row or tile), its warps,
    how many programs share a row (1 but for the split and coop paths), the columns each one
    owns, and the online kernel's VEC (see `vector_width`; 1 on the other paths)."""

    path: str
    block: int
    num_warps: int
    splits: int
    chunk: int
    vec: int = 1


def half_online_tile(n_cols: int) -> tuple[int, int]:
    """(block, num_warps) of the online path for a row of n_cols 16-bit elements."""
    for block, warps in HALF_ONLINE_TILES:
        padded = cdiv(n_cols, block) * block
        if padded - n_cols <= HALF_ONLINE_MAX_PAD * padded:
            return block, warps
    return HALF_ONLINE_TILES[-1]


def coop_splits(n_cols: int, itemsize: int, device=None, block: int = COOP_BLOCK) -> int:
    """Programs per row for the coop path (a power of two): enough that each chunk fits one tile
    of `block` elements (in registers), and that one chunk per SM fits COOP_L2_BUDGET; at most
    MAX_COOP_SPLITS. Under the interpreter programs run one after another, so a row cannot be
    shared (1)."""
    if interpreting():
        return 1
    sms = sm_count_of(device)
    need = max(cdiv(n_cols, block), cdiv(n_cols * itemsize * sms, COOP_L2_BUDGET))
    # A power of two no larger than the SM count: every program must be resident at once.
    return min(next_pow2(need), MAX_COOP_SPLITS, 1 << (sms.bit_length() - 1))


def one_pass_warps(block: int, itemsize: int) -> int:
    """Warps of a one-pass program where rows outnumber the SMs: from a block of 1024 on, one per
    1024 elements (16-bit at least 2), at most 16; smaller blocks (not timed) one per 256. Fewer
    warps a program, more programs an SM, more bytes in flight (docs/softmax.md)."""
    if block < 1024:
        return default_warps(block)
    return max(2 if itemsize <= 2 else 1, min(16, block // 1024))


def loaded_in_vectors(n_cols: int, row_stride: int) -> bool:
    """Whether Triton loads rows of this width and row stride in 16-byte vectors as they are: both
    multiples of COOP_ALIGN elements (what it hints an int argument by; a multiple of 8 alone
    gets 2-byte accesses), given an aligned base."""
    return not (n_cols % COOP_ALIGN or row_stride % COOP_ALIGN)


def vector_width(itemsize: int, n_cols: int, strides: tuple, aligned: bool) -> int:
    """The kernels' VEC, elements in 16 bytes, where rows of n_cols 16-bit elements are better
    walked in aligned coordinates: one row stride in all the tensors (`strides`), every base
    16-byte aligned (`aligned`), and the rows not already loaded in vectors. Else 1 (the plain
    masked tiles). float32 rows keep the plain tiles: the aligned walk measured slower there."""
    stride = strides[0]
    if (itemsize != 2 or loaded_in_vectors(n_cols, stride) or any(s != stride for s in strides)
            or not aligned):
        return 1
    return 16 // itemsize


def aligned_vector(n_cols: int, strides: tuple, tensors: tuple) -> int:
    """`vector_width` of `tensors` (their row strides `strides`): the backward's VEC."""
    size = tensors[0].element_size()
    if size != 2:  # 1 whatever the bases: no need to read them
        return 1
    return vector_width(size, n_cols, strides, not any(t.data_ptr() & 15 for t in tensors))


def plan(n_rows: int, n_cols: int, *, itemsize: int = 4, device=None, row_stride=None,
         aligned: bool = True, block=None, num_warps=None, path=None, splits=None) -> Plan:
    """The path, block, warps, splits and VEC `triton_fused` uses for (n_rows, n_cols) of elements
    of `itemsize` bytes, x's rows `row_stride` apart (None: n_cols, packed) and x's base 16-byte
    aligned or not (`aligned`; the output, a fresh contiguous allocation, always is), with any of
    block, num_warps, path and splits forced. Raises ValueError on a choice that cannot work."""
    row_stride = n_cols if row_stride is None else row_stride
    if path is None:
        if n_cols <= MAX_ONE_PASS:
            path = ONE_PASS
        elif n_rows < sm_count_of(device):
            path = SPLIT
        elif n_cols * itemsize <= ONLINE_MAX_ROW_BYTES or itemsize < 4 or n_cols % COOP_ALIGN:
            path = ONLINE
        elif splits is None and not (loaded_in_vectors(n_cols, row_stride) and aligned):
            # See COOP_ALIGN. Splits given ask for the coop kernel: they keep it.
            path = ONLINE
        else:
            path = COOP
    if path not in PATHS:
        raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
    whole_row = max(16, next_pow2(n_cols))
    if path == ONE_PASS:
        block = whole_row if block is None else block
        check_pow2("block", block)
        if block < whole_row:
            raise ValueError(
                f"the one-pass kernel holds the whole row: block must be >= {whole_row} for rows "
                f"of {n_cols}, got {block} (path='online' loops over tiles of block)")
    else:
        default = {COOP: COOP_BLOCK, SPLIT: SPLIT_BLOCK, ONLINE: ONLINE_BLOCK}[path]
        if (path == ONLINE and itemsize < 4 and block is None
                and n_cols > HALF_ONLINE_TILES[-1][0]):
            block, warps = half_online_tile(n_cols)
            num_warps = warps if num_warps is None else num_warps
        block = min(default, whole_row) if block is None else block
        check_pow2("block", block)
    if num_warps is None:
        num_warps = (one_pass_warps(block, itemsize) if path == ONE_PASS
                     and n_rows >= sm_count_of(device) else default_warps(block))
    check_warps(num_warps)
    n_splits, chunk, vec = 1, n_cols, 1
    if path == SPLIT:
        tiles = max(1, cdiv(n_cols, block))  # an empty row: one tile (no division by 0 below)
        if splits is None:
            splits = cdiv(SPLIT_PROGRAMS_PER_SM * sm_count_of(device), max(n_rows, 1))
        if not isinstance(splits, int) or splits < 1:
            raise ValueError(f"splits must be a positive int, got {splits}")
        # Whole tiles per chunk; then drop splits that would get no columns.
        chunk = cdiv(tiles, min(splits, tiles)) * block
        n_splits = max(1, cdiv(n_cols, chunk))
    elif path == COOP:
        n_splits = coop_splits(n_cols, itemsize, device, block) if splits is None else splits
        if not isinstance(n_splits, int) or n_splits < 1 or n_splits & (n_splits - 1):
            raise ValueError(f"splits must be a power of two for path='coop', got {splits}")
        tiles = cdiv(n_cols, block)
        chunk = cdiv(tiles, n_splits) * block
    elif splits is not None:
        raise ValueError(f"splits only applies to path='split' or 'coop', not {path!r}")
    if path == ONLINE:
        # x's rows and out's (x's shape, packed: n_cols apart).
        vec = vector_width(itemsize, n_cols, (row_stride, n_cols), aligned)
    return Plan(path, block, num_warps, n_splits, chunk, vec)
