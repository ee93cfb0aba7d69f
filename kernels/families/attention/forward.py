"""Attention forward, `softmax(q k^T * scale [+ causal mask]) @ v`, q k v (batch, heads, seq, dim).

Unfused, the (seq, seq) score and probability matrices of every head make round trips through
device memory (written by one kernel, read by the next): O(seq^2) traffic. Fused (FlashAttention-2
forward), each program holds BLOCK_M queries and walks the keys/values in BLOCK_N tiles with the
online softmax: running max m, running sum l, and an output accumulator rescaled by
2^(m_old - m_new) when the max grows. Scores live only in registers, traffic is O(seq * head_dim).

The fused kernel follows Triton's tutorial 06 ("fused attention") for Hopper: tiles are read
through host tensor descriptors (TMA) on sm_90+ and through plain masked loads on older GPUs (the
same program; TRITON_FUSION_NO_TMA=1 runs that path on a Hopper too, and problems too small to
repay the host's descriptors take it everywhere: TMA_FROM_FLOPS), the scale is folded into
the exponent (exp2 of qk * sm_scale * log2(e)), and causal attention loops only up to the
diagonal, masking the diagonal tiles alone. Beyond the tutorial: any sequence length (the key tail
is masked, the query tail is not stored) and any head_dim up to 256 (non-powers of two are padded
to the next one inside the kernel, where the loads zero-fill the columns past head_dim; for TMA,
head dims that are not a multiple of 8 are first padded on the host, as descriptor rows need 16
bytes), fewer key/value heads than query heads (grouped-query attention, read in place), and fewer
queries than keys (a KV cache; causal aligned to the bottom right). float16 and bfloat16 only.

On sm_90, non-causal attention at head_dim 128 with both lengths multiples of 128 also tunes
_attn_fwd_ws, the same loop under Triton's automatic warp specialisation (a producer warp feeds
TMA loads to the computing warps). Its descriptors are made on the device, which takes scratch
memory from Triton's allocator: where the caller has set none, torch's is set (per thread).
On sm_90 the tuning also times the Gluon forward (`gluon`: FlashAttention-3's schedule written
by hand) wherever `gluon.applies` (contiguous, head_dim 64 or 128, lengths in whole tiles): it
runs where it measures fastest, and stores the same log-sum-exp for the same backward.
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch
import torch.nn.functional as F
from triton.tools.tensor_descriptor import TensorDescriptor

from ..._checks import (cdiv, check_pow2, check_same, check_tensor, empty, empty_like, has_tma,
                        interpreting, is_fake, next_pow2)
from ..._plans import cached, fastest, layout_key, plan_cache
from ..._timer import time_ms
from ..._launch import descriptor, launch
from . import decoding as flash_decoding
from . import gluon as _gluon
from ..._bmm import DOT_MIN
from ..._checks import upcast_bf16 as _upcast_bf16
from .kernels import _attn_fwd, _attn_fwd_pointers, _attn_fwd_ws, _needs_allocator
from ..._bmm import _bmm
from ..._stored_softmax import softmax_rows

DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256


def default_scale(head_dim) -> float:
    """1 / sqrt(head_dim), the scale when none is given. torch.sym_sqrt: on an int it is
    math.sqrt; on a symbolic head_dim (a fake implementation under torch.compile) math.sqrt would
    specialise it (a recompile per head_dim, an error where it is marked dynamic)."""
    return 1.0 / torch.sym_sqrt(head_dim)


def reference(q, k, v, causal=False, sm_scale=None) -> torch.Tensor:
    """Naive PyTorch: materialised scores, in float32 (float64 if given), cast to q.dtype.
    k and v may have fewer heads than q (each serving heads / kv_heads query heads); causal is
    aligned to the bottom right (query i sees keys j <= i + seq_k - seq_q)."""
    if sm_scale is None:
        sm_scale = default_scale(q.shape[-1])
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    s = (q.to(ct) @ k.to(ct).transpose(-2, -1)) * sm_scale
    if causal:
        n_q, n_k = s.shape[-2:]
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).tril(n_k - n_q)
        s = s.masked_fill(~keep, float("-inf"))
    return (torch.softmax(s, dim=-1) @ v.to(ct)).to(q.dtype)


def _descriptor_pre_hook(nargs):
    """Host descriptors carry their block shape: set it from the config to be launched."""
    if isinstance(nargs["Q"], TensorDescriptor):
        block_d = nargs["BLOCK_D"]
        lead = [1, 1] if len(nargs["Q"].shape) == 4 else []  # one (batch, head) a tile
        nargs["Q"].block_shape = lead + [nargs["BLOCK_M"], block_d]
        nargs["K"].block_shape = lead + [nargs["BLOCK_N"], block_d]
        nargs["V"].block_shape = lead + [nargs["BLOCK_N"], block_d]


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


# The tuned config per (sequence bucket, head_dim, causal, dtype, device). Sequence lengths share
# a bucket up to the next power of two, so a model whose length changes every call tunes once
# per bucket, not once per length.
_TUNED: dict = {}


# Host descriptors from this much work up (FLOPs of the non-causal product, 4 * batch * heads *
# seq_q * seq_k * head_dim); below it, plain loads. The launcher turns each host descriptor into
# a TMA descriptor at every call: the descriptor launch cost 26 us a call against 14 for an empty
# kernel of ten arguments, while plain loads ran at 0.91-1.03x of TMA's speed on an H100
# (docs/attention.md). 2^32 FLOPs is ~10 us of tensor-core work, where 10% of it is less than
# what the host saves. 0 under the interpreter, whose tests cover descriptors at small shapes.
TMA_FROM_FLOPS = 0 if interpreting() else 2**32


def seq_bucket(seq: int) -> int:
    return max(64, next_pow2(seq))


def _bench(fn) -> float:
    """Median ms of fn (a module attribute so that the tests can replace the timing)."""
    return time_ms(fn, warmup_ms=10, rep_ms=40)


def _tune(key, seq, run, device, ws=False, gluon=False) -> tuple:
    """The fastest candidate (128-row blocks only when there are 128 queries to fill them; ws:
    WS_CONFIG too; gluon: GLUON_CONFIG too), timed once per key (see `fastest`: kept on disk
    with TRITON_CACHE_AUTOTUNING=1)."""
    candidates = [c for c in CONFIGS if c[0] <= max(64, seq)] + ([WS_CONFIG] if ws else [])
    kernels = (_attn_fwd, _attn_fwd_pointers, _attn_fwd_ws)
    if gluon:
        candidates.append(GLUON_CONFIG)
        kernels += (_gluon.attn_fwd,)
    return fastest(_TUNED, key, candidates, lambda cfg: _bench(lambda: run(cfg)), kernels,
                   device)


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


_CHECKED = plan_cache()  # layouts (with causal and sm_scale) that passed _check_layout


def _check_inputs(q, k, v, causal, sm_scale, with_key=False):
    """Validate; return sm_scale as a float (with_key: and the key the layout was checked under,
    None where it is not cached). What depends on the layouts alone is checked once per layout
    (shapes, dtypes, devices, strides, causal, sm_scale: a bool or a NaN is never a key, so it is
    checked, and refused, every time); the data's alignment every call."""
    key = layout_key((q, k, v))
    if key is not None and causal.__class__ is bool and (
            sm_scale is None or sm_scale.__class__ is float or sm_scale.__class__ is int):
        key = key + (causal, sm_scale.__class__, sm_scale)
    else:
        key = None
    scale = cached(_CHECKED, key, _check_layout, q, k, v, causal, sm_scale)
    if key is not None and not (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15:
        return (scale, key) if with_key else scale  # plain tensors (the key says so), aligned
    for name, t in (("q", q), ("k", k), ("v", v)):
        # Fake tensors (torch.compile's tracing) have no address to check.
        if (type(t) is torch.Tensor or not is_fake(t)) and t.data_ptr() % 16:
            raise ValueError(f"{name}'s data is not 16-byte aligned (a sliced view?); call "
                             f".clone() first")
    return (scale, key) if with_key else scale


def _check_layout(q, k, v, causal, sm_scale):
    """Everything _check_inputs checks but the data's alignment; returns sm_scale as a float."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if isinstance(t, torch.Tensor) and t.dtype in (torch.float32, torch.float64):
            dt = str(t.dtype).replace("torch.", "")
            raise TypeError(
                f"{name} has dtype {dt}; the attention kernel runs on float16 or bfloat16 "
                f"(tensor-core inputs): cast with .half() or .bfloat16(), or use "
                f"kernels.families.attention.reference for {dt}"
            )
        check_tensor(name, t, dtypes=DTYPES, ndim=4)
    check_same([("q", q), ("k", k), ("v", v)])
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] \
            or k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"q must be (batch, heads, seq_q, head_dim) and k, v (batch, kv_heads, seq_k, "
            f"head_dim), one shape, with kv_heads dividing heads; got q {tuple(q.shape)}, k "
            f"{tuple(k.shape)}, v {tuple(v.shape)}")
    if causal and q.shape[2] > k.shape[2]:
        raise ValueError(
            f"causal attention with more queries ({q.shape[2]}) than keys ({k.shape[2]}): aligned "
            f"to the bottom right, the first queries would see no key")
    head_dim = q.shape[-1]
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be between 1 and {MAX_HEAD_DIM}, got {head_dim}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        # Any strides with a unit last dim (e.g. views of one QKV projection), read in place
        # through 4-D tensor descriptors, whose strides and base must be multiples of 16 bytes.
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{name}'s last dim is not contiguous (strides {tuple(t.stride())}); "
                             f"call .contiguous() first")
        if not t.is_contiguous() and any(st * t.element_size() % 16 for st in t.stride()[:-1]):
            raise ValueError(f"{name}'s strides {tuple(t.stride())} are not multiples of 16 "
                             f"bytes, which tensor descriptors need; call .contiguous() first")
    if max(t.shape[0] * t.shape[1] * t.shape[2] for t in (q, k)) >= 2**31:
        raise ValueError(f"batch * heads * seq must be < 2**31, got q {tuple(q.shape)}, k "
                         f"{tuple(k.shape)}")
    if q.shape[0] * q.shape[1] > 65535:
        raise ValueError(f"batch * heads must be <= 65535 (a CUDA grid dimension), got shape "
                         f"{tuple(q.shape)}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if sm_scale is None:
        return default_scale(head_dim)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real) \
            or not math.isfinite(sm_scale):
        raise TypeError(f"sm_scale must be a finite real number or None, got {sm_scale!r}")
    return float(sm_scale)


def triton_fused(q, k, v, causal=False, sm_scale=None, *, block_m=None, block_n=None,
                 num_warps=None, num_stages=None, return_lse=False, _kernel=None):
    """FlashAttention-2 forward in one Triton kernel; grid (seq / block_m, batch * heads).
    return_lse: also return each query row's log-sum-exp of scaled scores (float32, base 2,
    (batch * heads, seq)), which the backward needs.

    With every launch parameter None on a GPU, the config is tuned over CONFIGS once per
    (seq_bucket of the query and of the key length, head_dim, causal, dtype, device): the first
    call per key pays for the search. On sm_90 the candidates include _attn_fwd_ws and the Gluon
    forward where they apply. Otherwise the missing parameters come from default_config, as
    they always do under the interpreter. _kernel (private, for the bench): see KERNELS.

    Few queries per key/value head (seq_q * heads / kv_heads <= 16: decoding with a KV cache)
    and no launch parameter given: the keys are split across programs instead
    (`decoding`), so that one query per head still fills the GPU.
    """
    sm_scale, key = _check_inputs(q, k, v, causal, sm_scale, with_key=True)
    return_lse = bool(return_lse)
    options = (block_m, block_n, num_warps, num_stages)
    if key is not None and (options == _NO_OPTIONS
                            or all(o is None or o.__class__ is int for o in options)):
        key = key + options + (return_lse, _kernel)
        tuned = _TUNED_PLANS.get(key)
        if tuned is not None:
            return tuned(q, k, v, sm_scale)
    else:
        key = None  # (an option of another type is checked, and refused, every call)
    plan = cached(_PLANS, key, _plan, q, k, v, causal, sm_scale, options, return_lse, _kernel)
    if plan.route == "decode":
        out, lse = flash_decoding.attention(q, k, v, causal, sm_scale, return_lse=return_lse)
        return (out, lse) if return_lse else out
    if plan.route == "pad":
        # Tensor descriptors need rows of 16 bytes: zero columns up to a multiple of 8 change no
        # dot product (a copy of q, k, v; only for such head dims, only where TMA reads them).
        pad = 8 - q.shape[-1] % 8
        res = triton_fused(*(F.pad(t, (0, pad)) for t in (q, k, v)), causal, sm_scale,
                           block_m=block_m, block_n=block_n, num_warps=num_warps,
                           num_stages=num_stages, return_lse=return_lse, _kernel=_kernel)
        out, lse = res if return_lse else (res, None)
        out = out[..., :q.shape[-1]].contiguous()
        return (out, lse) if return_lse else out
    batch, heads, seq, head_dim = q.shape
    out = empty(q.shape, q.dtype, q.device)
    lse = empty((batch * heads, seq), torch.float32, q.device) if return_lse else None
    if plan.route == "empty":
        return (out, lse) if return_lse else out
    if plan.route == "no_keys":
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))  # the log of an empty sum
        return (out, lse) if return_lse else out
    sizes = (seq, k.shape[2], heads, heads // k.shape[1])
    if plan.host and plan.strided:
        # Block shapes are filled in just before each launch (_descriptor_pre_hook).
        q_arg, k_arg, v_arg = (descriptor(t, list(t.shape), list(t.stride())) for t in (q, k, v))
    elif plan.host:
        q_arg, k_arg, v_arg = (descriptor(t, [t.shape[0] * t.shape[1] * t.shape[2], head_dim],
                                           [head_dim, 1]) for t in (q, k, v))
    else:  # no TMA: pointers (and the strides of batch, head and row, unless MODE 2)
        q_arg, k_arg, v_arg = q, k, v
        if "MODE" not in plan.consts:
            sizes += tuple(s for t in (q, k, v) for s in t.stride()[:3])
    kernel = _attn_fwd if "MODE" in plan.consts else _attn_fwd_pointers
    args = (q_arg, k_arg, v_arg, out, out if lse is None else lse, sm_scale, *sizes)
    consts = plan.consts

    def run(cfg):
        if cfg == GLUON_CONFIG:
            _gluon.launch(q, k, v, out, lse, sm_scale, causal)
            return
        if len(cfg) == 5:  # WS_CONFIG
            _launch_ws(q, k, v, out, lse, sm_scale, cfg, consts)
            return
        bm, bn, warps, stages = cfg
        if plan.host:
            _descriptor_pre_hook(dict(Q=q_arg, K=k_arg, V=v_arg, BLOCK_M=bm, BLOCK_N=bn,
                                      BLOCK_D=consts["BLOCK_D"]))
        launch(kernel, (cdiv(seq, bm), batch * heads), *args, **consts, BLOCK_M=bm,
               BLOCK_N=bn, num_warps=warps, num_stages=stages)

    cfg = plan.cfg or _TUNED.get(plan.tune_key) or _tune(plan.tune_key, seq, run, q.device,
                                                           plan.ws, plan.gluon)
    run(cfg)
    if key is not None:
        if len(_TUNED_PLANS) >= TUNED_PLANS_MAX:
            _TUNED_PLANS.clear()
        _TUNED_PLANS[key] = _TunedPlan(plan, cfg, q, k, v, return_lse)
    return (out, lse) if return_lse else out


def _ws_launch(q, k, cfg, consts) -> tuple:
    """_attn_fwd_ws's grid, runtime ints and keywords for q, k (contiguous) and WS_CONFIG."""
    bm, bn, warps, stages, _ = cfg
    batch, heads, seq, head_dim = q.shape
    ints = (seq, k.shape[2], heads, heads // k.shape[1], batch * heads * seq,
            k.shape[0] * k.shape[1] * k.shape[2])
    kwargs = dict(HEAD_DIM=head_dim, UPCAST=consts["UPCAST"], SCALE_POS=consts["SCALE_POS"],
                  STORE_LSE=consts["STORE_LSE"], BLOCK_M=bm, BLOCK_N=bn, num_warps=warps,
                  num_stages=stages)
    return (cdiv(seq, bm), batch * heads), ints, kwargs


def _launch_ws(q, k, v, out, lse, sm_scale, cfg, consts):
    grid, ints, kwargs = _ws_launch(q, k, cfg, consts)
    _needs_allocator()
    launch(_attn_fwd_ws, grid, q, k, v, out, out if lse is None else lse, sm_scale, *ints,
           **kwargs)


class _TunedPlan:
    """The plan of one layout once its config is tuned: what the general path works out each
    call (grid, launch keywords, descriptor shapes, strides and blocks), worked out once and kept
    in a plan cache as every family's plans are, so that a call only allocates, makes three
    descriptors (none on the plain path) and calls `launch` (the one launcher and its one cache
    of compiled kernels). The same kernel and arguments as the general path."""

    __slots__ = ("kernel", "grid", "kwargs", "blocks", "specs", "lse_shape", "ints", "ws",
                 "scale")

    def __init__(self, plan, cfg, q, k, v, return_lse):
        # ws: a kernel that makes its descriptors on the device (_attn_fwd_ws, the Gluon
        # forward), given the tensors themselves; scale: what sm_scale is multiplied by for it.
        self.ws = len(cfg) == 5
        self.scale = 1.0
        self.lse_shape = (q.shape[0] * q.shape[1], q.shape[2]) if return_lse else None
        if cfg == GLUON_CONFIG:  # the Gluon forward takes the scale in base 2
            self.kernel, self.scale = _gluon.attn_fwd, _gluon.LOG2E
            self.grid, self.ints, self.kwargs = _gluon.launch_args(q, k, plan.consts["CAUSAL"],
                                                                   return_lse)
            return
        if self.ws:  # _attn_fwd_ws: the tensors themselves, no host descriptor
            self.kernel = _attn_fwd_ws
            self.grid, self.ints, self.kwargs = _ws_launch(q, k, cfg, plan.consts)
            return
        bm, bn, warps, stages = cfg
        batch, heads, seq, head_dim = q.shape
        block_d = plan.consts["BLOCK_D"]
        self.kernel = _attn_fwd if "MODE" in plan.consts else _attn_fwd_pointers
        self.grid = (cdiv(seq, bm), batch * heads)
        self.kwargs = dict(plan.consts, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps,
                           num_stages=stages)
        self.ints = (seq, k.shape[2], heads, heads // k.shape[1])
        self.blocks = self.specs = None  # plain loads: no descriptor
        if not plan.host:
            if self.kernel is _attn_fwd_pointers:  # the layout (so its strides) is the key's
                self.ints += tuple(s for t in (q, k, v) for s in t.stride()[:3])
            return
        lead = [1, 1] if plan.strided else []
        self.blocks = (lead + [bm, block_d], lead + [bn, block_d], lead + [bn, block_d])
        if not plan.strided:  # else 4-D descriptors with each tensor's own shape and strides
            rows_q = batch * heads * seq
            rows_kv = k.shape[0] * k.shape[1] * k.shape[2]
            self.specs = (([rows_q, head_dim], [head_dim, 1], self.blocks[0]),
                          ([rows_kv, head_dim], [head_dim, 1], self.blocks[1]),
                          ([rows_kv, head_dim], [head_dim, 1], self.blocks[2]))

    def __call__(self, q, k, v, sm_scale):
        out = empty_like(q)  # contiguous, q's shape: half the host cost of empty(shape, ...)
        lse = None if self.lse_shape is None else empty(self.lse_shape, torch.float32, q.device)
        if self.ws:
            _needs_allocator()
            tensors = (q, k, v)
        elif self.specs is not None:
            tensors = [descriptor(t, *spec) for t, spec in zip((q, k, v), self.specs)]
        elif self.blocks is not None:
            tensors = [descriptor(t, list(t.shape), list(t.stride()), b)
                       for t, b in zip((q, k, v), self.blocks)]
        else:
            tensors = (q, k, v)
        launch(self.kernel, self.grid, *tensors, out, out if lse is None else lse,
               sm_scale * self.scale, *self.ints, **self.kwargs)
        return out if lse is None else (out, lse)


_NO_OPTIONS = (None, None, None, None)

# Tuned plans by triton_fused's key (layout, causal, scale, options, return_lse); a plan cache,
# emptied with the others, and when full.
_TUNED_PLANS = plan_cache()
TUNED_PLANS_MAX = 1024


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


_PLANS = plan_cache()

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


# ---------------------------------------------------------------------------------- unfused


def triton_unfused(q, k, v, causal=False, sm_scale=None) -> torch.Tensor:
    """The naive algorithm as three Triton kernels, each writing its result to memory:
    S = q k^T * scale (q's dtype), P = softmax(S) with the causal mask, O = P v.

    The matmul kernel is kernels._bmm's, the row softmax kernels._stored_softmax's.
    """
    sm_scale = _check_inputs(q, k, v, causal, sm_scale)
    batch, heads, seq, head_dim = q.shape
    if q.numel() == 0 or k.shape[2] == 0:
        return reference(q, k, v, causal, sm_scale) if q.numel() else empty(q.shape, q.dtype,
                                                                              q.device)
    # Grouped heads: k and v repeated per query head (a copy; this is the naive baseline).
    group = heads // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) if group > 1 else t for t in (k, v))
    seq_k = k.shape[2]
    q3 = q.reshape(batch * heads, seq, head_dim)
    k3, v3 = (t.reshape(batch * heads, seq_k, head_dim) for t in (k, v))
    s = _bmm(q3, k3.transpose(1, 2), alpha=sm_scale)
    p = softmax_rows(s, causal=causal, causal_shift=seq_k - seq, max_warps=8)
    return _bmm(p, v3).view(q.shape)


__all__ = ["default_config", "reference", "triton_fused", "triton_unfused"]
