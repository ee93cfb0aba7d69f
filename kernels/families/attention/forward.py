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

What runs for a layout (route, loads or descriptors, constexprs, a fixed config or the tuner's key
and candidates) is decided in `plan` (`_plan`); this module checks, tunes and launches.
"""
from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from triton.tools.tensor_descriptor import TensorDescriptor

from ..._buffers import empty, empty_like
from ..._checks import check_same, check_tensor, is_fake
from ..._tiles import cdiv
from ..._plans import cached, fastest, layout_key, plan_cache
from ..._timer import time_ms
from ..._launch import descriptor, launch
from . import decoding as flash_decoding
from . import gluon as _gluon
from .kernels import _attn_fwd, _attn_fwd_pointers, _attn_fwd_ws, _needs_allocator
from .plan import CONFIGS, GLUON_CONFIG, WS_CONFIG, _plan
from .plan import default_config  # noqa: F401 - the family's public name, exported from here
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


# The tuned config per (sequence bucket, head_dim, causal, dtype, device). Sequence lengths share
# a bucket up to the next power of two, so a model whose length changes every call tunes once
# per bucket, not once per length.
_TUNED: dict = {}


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


_PLANS = plan_cache()

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
