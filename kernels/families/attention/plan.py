"""What the attention forward runs for a layout of q, k, v and its options (`_plan`): the route
(decoding, padding, empty, no keys, the main kernels), plain loads or TMA descriptors, the
kernel's constexprs, and either a fixed launch config or the key and candidates the tuner times
(`forward._tune`). The candidates and thresholds are here; forward.py checks, tunes and launches.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..._bmm import DOT_MIN
from ..._checks import check_pow2
from ..._device import has_tma, interpreting
from ..._tiles import next_pow2
from ..._dot import upcast_bf16 as _upcast_bf16
from . import decoding as flash_decoding
from . import gluon as _gluon

# Candidates for an H100 (block_m, block_n, num_warps, num_stages), few so that a new key tunes
# quickly. 8 warps only with 128x128 tiles, as tutorial 06 prunes for Hopper; all have
# block_n <= block_m, which causal masking needs (a diagonal block spans whole key tiles).
# Configs that overflow shared memory (large head_dim) fail to compile and are skipped.
CONFIGS = [  # (BLOCK_M, BLOCK_N, num_warps, num_stages); causal needs BLOCK_M % BLOCK_N == 0
    (128, 64, 4, 3), (128, 64, 4, 4), (128, 128, 8, 2), (128, 128, 8, 3),
    (64, 64, 4, 2), (64, 64, 4, 3),
]
# _attn_fwd_ws's config, a candidate where it applies (`_ws_applies`): the one that compiled and
# was right and fastest in the probe (docs/attention.md); its 5th entry marks the kernel. Four
# warps compute (one warp group) beside the producer; one stage: the pass buffers the tiles.
WS_CONFIG = (128, 128, 4, 1, "ws")
# The Gluon forward's candidate where `gluon.applies` on the TMA path: 2 * BM queries and BN keys
# a tile, 4 warps a consumer warpgroup, its ring's stages set by head_dim (gluon.STAGES), the
# ping-pong schedule (the fastest of its three on an H100, docs/attention.md).
GLUON_CONFIG = (2 * _gluon.BM, _gluon.BN, 4, None, "gluon")
# What triton_fused's private `_kernel` may force (the bench times each alone): None, the tuned
# choice; "tl", the tuning without the Gluon candidate; "gluon", the Gluon forward (ValueError
# where it does not apply).
KERNELS = (None, "tl", "gluon")


# Host descriptors from this much work up (FLOPs of the non-causal product, 4 * batch * heads *
# seq_q * seq_k * head_dim); below it, plain loads. The launcher turns each host descriptor into
# a TMA descriptor at every call, which costs the host more than plain loads lose on the GPU for
# a problem of a few microseconds of tensor-core work (docs/attention.md, "Measurements behind
# the constants"). 0 under the interpreter, whose tests cover descriptors at small shapes.
TMA_FROM_FLOPS = 0 if interpreting() else 2**32


def seq_bucket(seq: int) -> int:
    return max(64, next_pow2(seq))


def _ws_applies(q, k, v, causal, strided) -> bool:
    """Whether _attn_fwd_ws may run: Hopper (sm_90; the pass is Hopper's), not causal, contiguous,
    head_dim 128 (measured there; 64 gained nothing), both lengths multiples of its blocks."""
    if causal or strided or q.shape[-1] != 128 or q.device.type != "cuda":
        return False
    return (tuple(torch.cuda.get_device_capability(q.device)) == (9, 0)
            and q.shape[2] % WS_CONFIG[0] == 0 and k.shape[2] % WS_CONFIG[1] == 0)


def default_config(seq: int, head_dim: int, causal: bool) -> dict:
    """A fixed launch config when not autotuning: (block_m, block_n, num_warps, num_stages)."""
    if interpreting():
        # The interpreter's cost is per program and per tile: small tiles, still several of them.
        return dict(block_m=16, block_n=16, num_warps=4, num_stages=1)
    block_d = max(16, next_pow2(head_dim))
    if seq <= 64:
        return dict(block_m=64, block_n=64, num_warps=4, num_stages=2)
    if block_d <= 64:
        return dict(block_m=128, block_n=64, num_warps=4, num_stages=3)
    if block_d <= 128:
        return dict(block_m=128, block_n=128, num_warps=8, num_stages=2)
    return dict(block_m=64, block_n=64, num_warps=4, num_stages=2)


class _Plan(NamedTuple):
    """What triton_fused does for one layout of q, k, v with its options. route: "decode"
    (flash_decoding), "pad" (head_dim padded to a multiple of 8 for TMA, then "main"), "empty"
    (no output element), "no_keys" (seq_k = 0: zeros) or "main"; host: through host tensor
    descriptors (TMA), else plain loads; strided: 4-D descriptors; consts: the kernel's
    constexprs but the blocks; cfg: (block_m, block_n, num_warps, num_stages) or GLUON_CONFIG,
    or None to take the tuned config under tune_key (WS_CONFIG among the candidates where ws,
    GLUON_CONFIG where gluon)."""
    route: str
    host: bool = False
    strided: bool = False
    consts: dict | None = None
    cfg: tuple | None = None
    tune_key: tuple | None = None
    ws: bool = False  # WS_CONFIG (_attn_fwd_ws) is a candidate
    gluon: bool = False  # GLUON_CONFIG (the Gluon forward) is a candidate


def _plan(q, k, v, causal, sm_scale, options, return_lse, kernel=None) -> _Plan:
    """triton_fused's plan for inputs that passed _check_inputs (see _Plan); raises on bad
    launch options, and where `kernel` (KERNELS) forces the Gluon forward on inputs it refuses."""
    block_m, block_n, num_warps, num_stages = options
    if kernel not in KERNELS:
        raise ValueError(f"_kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "gluon":
        why = ("it takes no launch options" if any(p is not None for p in options)
               else _gluon.refusal(q, k, v, causal))
        if why:
            raise ValueError(f"the Gluon attention forward does not take these inputs: {why}")
    if k.shape[2] == 0 and q.numel():
        # No key at all: softmax over nothing, zeros as torch's sdpa and `reference` give (the
        # kernels would divide 0 by 0, the decoding split count by a chunk of 0 keys).
        return _Plan("no_keys")
    if flash_decoding.applies(q, k) and all(p is None for p in options):
        return _Plan("decode")
    batch, heads, seq, head_dim = q.shape
    small = 4 * batch * heads * seq * k.shape[2] * head_dim < TMA_FROM_FLOPS
    host = has_tma(q.device) and not small
    if head_dim % 8 and host:
        return _Plan("pad")
    if q.numel() == 0:
        return _Plan("empty")
    contiguous = all(t.is_contiguous() for t in (q, k, v))
    strided = host and not contiguous
    block_d = max(16, next_pow2(head_dim))
    consts = dict(HEAD_DIM=head_dim, BLOCK_D=block_d, CAUSAL=causal,
                  UPCAST=_upcast_bf16(q.dtype), SCALE_POS=sm_scale >= 0,
                  STORE_LSE=return_lse)
    if host:
        consts["MODE"] = 1 if strided else 0
    elif small and contiguous:
        consts["MODE"] = 2  # _attn_fwd without descriptors; otherwise _attn_fwd_pointers
    if kernel == "gluon":
        return _Plan("main", host, strided, consts, GLUON_CONFIG)
    # Tuned where the work is larger than what a launch costs the host; below it the configs
    # differ by less than that, and timing them would cost a first call seconds.
    if not interpreting() and all(p is None for p in options) and not small:
        ws = host and _ws_applies(q, k, v, causal, strided)
        # In the key: lengths of one bucket may differ in whether the Gluon forward takes them,
        # and a choice is only ever one of its key's candidates.
        gluon = host and kernel is None and _gluon.applies(q, k, v, causal)
        tune_key = (seq_bucket(seq), seq_bucket(k.shape[2]), head_dim, causal, q.dtype, q.device,
                    host, ws, consts.get("MODE") == 2, gluon)
        return _Plan("main", host, strided, consts, None, tune_key, ws, gluon)
    d = default_config(seq, head_dim, causal)
    block_m = check_pow2("block_m", d["block_m"] if block_m is None else block_m, why=DOT_MIN)
    block_n = check_pow2("block_n", d["block_n"] if block_n is None else block_n, why=DOT_MIN)
    if causal and block_m % block_n:
        raise ValueError(f"causal attention needs block_m to be a multiple of block_n, got "
                         f"block_m={block_m}, block_n={block_n}")
    cfg = (block_m, block_n, d["num_warps"] if num_warps is None else num_warps,
           d["num_stages"] if num_stages is None else num_stages)
    return _Plan("main", host, strided, consts, cfg)
