"""A FlashAttention-3-style attention forward for Hopper (sm_90) in Triton's Gluon: one more
candidate of `forward`'s tuning where `applies`, beside the `tl` kernels (`kernels`).

Per program (one (batch, head) and 2 * BM queries): one producer warp (24 registers,
setmaxnreg) streams K and V tiles by TMA into a ring of STAGES shared-memory slots guarded by
mbarriers; two consumer warpgroups (4 warps each, 240 registers) own BM queries each, compute
S = Q K^T by asynchronous wgmma from shared memory, the online softmax in registers (base 2,
scale folded in), and O += P V with P taken from registers, then store O by TMA through their Q
tile's shared memory. Causal (bottom-right) masks the diagonal tile. Grouped-query heads index
their key/value head in place. Three schedules of the consumers (VARIANTS): one tile after
another; overlapped (FlashAttention-3's intra-warpgroup pipelining: S_j's product is issued with
O += P_(j-1) V_(j-1), and the softmax of S_j runs while the latter does); and ping-pong on top
(the two consumers take turns issuing their products, ordered by two mbarriers, as
FlashAttention-3 orders them by named barriers). The plan runs ping-pong.

What it takes (`refusal` says why not): sm_90, not the interpreter, float16 or bfloat16,
contiguous 16-byte aligned (batch, heads, seq, head_dim) tensors, head_dim 64 or 128, seq_q a
multiple of 2 * BM, seq_k a multiple of BN, and for causal seq_q <= seq_k with seq_k - seq_q a
multiple of BN (the two consumers then need the same key tiles). The log-sum-exp it stores is
the `tl` kernels' (base 2, (batch * heads, seq_q), float32): their backward takes it unchanged.

Imported by `forward` whatever the machine: where Triton has no Gluon the kernels below stay
plain functions and `applies` is False.
"""
from __future__ import annotations

import torch
import triton

from ..._device import _capability, interpreting
from ..._launch import launch as launch_kernel
from .kernels import _needs_allocator

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    MISSING = None
except ImportError as exc:  # a Triton without Gluon: nothing below is compiled
    MISSING = f"this Triton has no Gluon ({exc})"

    class gluon:  # noqa: N801 - stands in for the module: the kernels stay plain functions
        jit = staticmethod(lambda fn: fn)

LOG2E = 1.4426950408889634
# The schedules, (overlap, pingpong): one tile after another; S_j's product during the softmax of
# S_(j-1); and the two consumers taking turns at the tensor cores as well.
VARIANTS = {"in order": (False, False), "overlapped": (True, False),
            "ping-pong": (True, True)}
BM, BN = 64, 128  # queries per consumer warpgroup, keys per tile
# K/V ring slots per head_dim: 3 x 64 KiB at 128 (+ 32 KiB of Q, 229,584 B of the 232,448 an
# sm_90 block may have). Overlapped, a consumer holds two slots (V_(j-1), K_j): the third
# is the one loading.
STAGES = {64: 4, 128: 3}


@gluon.jit
def _producer(k_desc, v_desc, k_ring, v_ring, ready, empty, kv_row, n_kv, BN: gl.constexpr,
              STAGES: gl.constexpr):
    for i in range(n_kv):
        s = i % STAGES
        # A slot is free once both consumers released it (empty counts 2); the first round's
        # wait on the opposite parity returns at once.
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + i * BN, 0], ready.index(s),
                                        k_ring.index(s))
        tma.async_copy_global_to_shared(v_desc, [kv_row + i * BN, 0], ready.index(s),
                                        v_ring.index(s))


@gluon.jit
def _qk(q_smem, k_ring, ready, j, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
        s_layout: gl.constexpr):
    """Issue S = Q K_j^T (async) once key tile j has landed; the wgmma's token."""
    st = j % STAGES
    mbarrier.wait(ready.index(st), (j // STAGES) & 1)
    s = gl.zeros((BM, BN), dtype=gl.float32, layout=s_layout)
    return warpgroup_mma(q_smem, k_ring.index(st).permute((1, 0)), s, use_acc=False,
                         is_async=True)


@gluon.jit
def _softmax(s, m_i, l_i, j, offs_m, shift, qk_scale, n_unmasked, BN: gl.constexpr,
             MASK: gl.constexpr, s_layout: gl.constexpr):
    """The online softmax of key tile j's scores: P, the rescale factor, the new max and sum."""
    s = s * qk_scale  # scaled, base 2: any sign of the scale
    if MASK:  # tiles from n_unmasked on: query q sees keys k <= q + shift
        offs_n = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
        keep = (offs_n[None, :] <= offs_m[:, None] + shift) | (j < n_unmasked)
        s = gl.where(keep, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    p = gl.exp2(s - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _tile(q_smem, k_ring, v_ring, ready, empty, acc, m_i, l_i, j, offs_m, shift, qk_scale,
          n_unmasked, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
          STAGES: gl.constexpr, MASK: gl.constexpr):
    """One key tile, in order: S = Q K^T, the online softmax, O += P V; the slot released."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s = _qk(q_smem, k_ring, ready, j, BM, BN, STAGES, s_layout)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, j, offs_m, shift, qk_scale, n_unmasked, BN, MASK,
                                  s_layout)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p = gl.convert_layout(p.to(q_smem.dtype), p_layout)
    acc = warpgroup_mma(p, v_ring.index(j % STAGES), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(empty.index(j % STAGES), count=1)
    return acc, m_i, l_i


@gluon.jit
def _overlapped_step(q_smem, k_ring, v_ring, ready, empty, turn, turn_other, acc, p, m_i, l_i, j,
                     offs_m, n_unmasked, shift, qk_scale, BM: gl.constexpr, BN: gl.constexpr,
                     D: gl.constexpr, STAGES: gl.constexpr, MASK: gl.constexpr,
                     PINGPONG: gl.constexpr, FIRST: gl.constexpr, s_layout: gl.constexpr,
                     o_layout: gl.constexpr, p_layout: gl.constexpr):
    """Key tile j of `_overlapped`: S_j = Q K_j^T issued with O += P_(j-1) V_(j-1), the softmax
    of S_j while the latter runs; (acc, P_j, m, l)."""
    if PINGPONG:
        mbarrier.wait(turn, FIRST ^ (j & 1))
    s = _qk(q_smem, k_ring, ready, j, BM, BN, STAGES, s_layout)
    pv = gl.convert_layout(p.to(q_smem.dtype), p_layout)
    acc = warpgroup_mma(pv, v_ring.index((j - 1) % STAGES), acc, is_async=True)
    if PINGPONG:
        mbarrier.arrive(turn_other, count=1)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))  # S_j; P V may still run
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, j, offs_m, shift, qk_scale, n_unmasked, BN, MASK,
                                  s_layout)
    acc, pv = warpgroup_mma_wait(num_outstanding=0, deps=(acc, pv))
    mbarrier.arrive(empty.index((j - 1) % STAGES), count=1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    return acc, p, m_i, l_i


@gluon.jit
def _overlapped(q_smem, k_ring, v_ring, ready, empty, turn, turn_other, acc, m_i, l_i, offs_m,
                n_unmasked, n_kv, shift, qk_scale, BM: gl.constexpr, BN: gl.constexpr,
                D: gl.constexpr, STAGES: gl.constexpr, MASK: gl.constexpr,
                PINGPONG: gl.constexpr, FIRST: gl.constexpr):
    """Every key tile, FlashAttention-3's way within a warpgroup: S_j = Q K_j^T is issued with
    O += P_(j-1) V_(j-1) and computed while the softmax of S_j runs. PINGPONG: the two
    consumers take turns issuing their products (the `turn` mbarriers; FIRST: this one goes
    first), so that one's softmax runs while the other's products use the tensor cores."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    if PINGPONG:  # a fresh mbarrier counts as having completed parity 1
        mbarrier.wait(turn, FIRST ^ 0)
    s = _qk(q_smem, k_ring, ready, 0, BM, BN, STAGES, s_layout)
    if PINGPONG:
        mbarrier.arrive(turn_other, count=1)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, 0, offs_m, shift, qk_scale, n_unmasked, BN,
                                  MASK, s_layout)
    # Causal: the mask's arithmetic only on the diagonal tiles (from n_unmasked on).
    for j in range(1, gl.maximum(n_unmasked, 1)):
        acc, p, m_i, l_i = _overlapped_step(q_smem, k_ring, v_ring, ready, empty, turn,
                                            turn_other, acc, p, m_i, l_i, j, offs_m, n_unmasked,
                                            shift, qk_scale, BM, BN, D, STAGES, False, PINGPONG,
                                            FIRST, s_layout, o_layout, p_layout)
    for j in range(gl.maximum(n_unmasked, 1), n_kv):
        acc, p, m_i, l_i = _overlapped_step(q_smem, k_ring, v_ring, ready, empty, turn,
                                            turn_other, acc, p, m_i, l_i, j, offs_m, n_unmasked,
                                            shift, qk_scale, BM, BN, D, STAGES, MASK, PINGPONG,
                                            FIRST, s_layout, o_layout, p_layout)
    if PINGPONG:
        mbarrier.wait(turn, FIRST ^ (n_kv & 1))
    pv = gl.convert_layout(p.to(q_smem.dtype), p_layout)
    acc = warpgroup_mma(pv, v_ring.index((n_kv - 1) % STAGES), acc, is_async=True)
    if PINGPONG:
        mbarrier.arrive(turn_other, count=1)
    acc, pv = warpgroup_mma_wait(num_outstanding=0, deps=(acc, pv))
    mbarrier.arrive(empty.index((n_kv - 1) % STAGES), count=1)
    return acc, m_i, l_i


@gluon.jit
def _consumer(q_smem, k_ring, v_ring, ready, empty, turn, turn_other, o_desc, lse_ptr, q_row,
              q_pos, n_unmasked, n_kv, shift, qk_scale, BM: gl.constexpr, BN: gl.constexpr,
              D: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
              STORE_LSE: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr,
              FIRST: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, D, 16])
    offs_m = q_pos + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.full([BM], 0.0, gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros((BM, D), dtype=gl.float32, layout=o_layout)
    if OVERLAP:
        acc, m_i, l_i = _overlapped(q_smem, k_ring, v_ring, ready, empty, turn, turn_other, acc,
                                    m_i, l_i, offs_m, n_unmasked, n_kv, shift, qk_scale, BM, BN,
                                    D, STAGES, CAUSAL, PINGPONG, FIRST)
    else:
        for j in range(0, n_unmasked):
            acc, m_i, l_i = _tile(q_smem, k_ring, v_ring, ready, empty, acc, m_i, l_i, j,
                                  offs_m, shift, qk_scale, n_unmasked, BM, BN, D, STAGES, False)
        for j in range(n_unmasked, n_kv):  # causal: the diagonal tile
            acc, m_i, l_i = _tile(q_smem, k_ring, v_ring, ready, empty, acc, m_i, l_i, j,
                                  offs_m, shift, qk_scale, n_unmasked, BM, BN, D, STAGES, True)
    acc = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    if STORE_LSE:  # the row's log-sum-exp of scaled scores, base 2, as the `tl` kernel stores it
        gl.store(lse_ptr + q_row + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout)),
                 m_i + gl.log2(l_i))
    q_smem.store(acc.to(q_smem.dtype))  # Q is read for the last time: its tile holds O
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row, 0], q_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def attn_fwd(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, qk_scale, SEQ, SEQ_K, H, GROUP, ROWS_Q, ROWS_K,
             D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
             CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr, OVERLAP: gl.constexpr,
             PINGPONG: gl.constexpr):
    """Grid (seq_q / (2 BM), batch * heads); q, o viewed as (ROWS_Q, D), k, v as (ROWS_K, D)."""
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    q_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D], dtype)
    kv_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], dtype)
    q_desc = tma.make_tensor_descriptor(q_ptr, [ROWS_Q, D], [D, 1], [BM, D], q_l)
    k_desc = tma.make_tensor_descriptor(k_ptr, [ROWS_K, D], [D, 1], [BN, D], kv_l)
    v_desc = tma.make_tensor_descriptor(v_ptr, [ROWS_K, D], [D, 1], [BN, D], kv_l)
    o_desc = tma.make_tensor_descriptor(o_ptr, [ROWS_Q, D], [D, 1], [BM, D], q_l)
    if CAUSAL:  # the longest rows first: the last wave then holds the shortest
        start = (gl.num_programs(0) - 1 - gl.program_id(0)) * (2 * BM)
    else:
        start = gl.program_id(0) * (2 * BM)
    bh = gl.program_id(1)
    h = bh % H
    q_row = bh * SEQ + start
    kv_row = ((bh // H) * (H // GROUP) + h // GROUP) * SEQ_K
    shift = SEQ_K - SEQ
    if CAUSAL:
        n_kv = gl.cdiv(start + 2 * BM + shift, BN)
        n_unmasked0 = (start + shift + 1) // BN
        n_unmasked1 = (start + BM + shift + 1) // BN
    else:
        n_kv = SEQ_K // BN
        n_unmasked0 = n_kv
        n_unmasked1 = n_kv
    q0 = gl.allocate_shared_memory(dtype, [BM, D], q_l)
    q1 = gl.allocate_shared_memory(dtype, [BM, D], q_l)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], bar, q0)
    tma.async_copy_global_to_shared(q_desc, [q_row + BM, 0], bar, q1)
    mbarrier.wait(bar, 0)
    mbarrier.invalidate(bar)  # its shared memory is reused (the K/V ring)
    k_ring = gl.allocate_shared_memory(dtype, [STAGES, BN, D], kv_l)
    v_ring = gl.allocate_shared_memory(dtype, [STAGES, BN, D], kv_l)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # both consumers release a slot
    for c in gl.static_range(2):
        mbarrier.init(turns.index(c), count=1)
    gl.warp_specialize([
        (_consumer, (q0, k_ring, v_ring, ready, empty, turns.index(0), turns.index(1), o_desc,
                     lse_ptr, q_row, start, n_unmasked0, n_kv, shift, qk_scale, BM, BN, D,
                     STAGES, CAUSAL, STORE_LSE, OVERLAP, PINGPONG, 1)),
        (_consumer, (q1, k_ring, v_ring, ready, empty, turns.index(1), turns.index(0), o_desc,
                     lse_ptr, q_row + BM, start + BM, n_unmasked1, n_kv, shift, qk_scale, BM, BN,
                     D, STAGES, CAUSAL, STORE_LSE, OVERLAP, PINGPONG, 0)),
        (_producer, (k_desc, v_desc, k_ring, v_ring, ready, empty, kv_row, n_kv, BN, STAGES)),
    ], [4, 1], [240, 24])


# ------------------------------------------------------------------------------------ host


def refusal(q, k, v, causal, capability=None) -> str | None:
    """Why attn_fwd cannot take these inputs (None: it can). capability: the GPU's compute
    capability, None to read q's device's (none for a tensor off CUDA)."""
    if MISSING:
        return MISSING
    if triton.__version__.split(".")[:2] != ["3", "6"]:  # Gluon's API changes between versions
        return f"written for Triton 3.6's Gluon, not {triton.__version__}"
    if interpreting():
        return "the interpreter runs no Gluon"
    if capability is None:
        capability = _capability(q.device) if q.device.type == "cuda" else None
    if tuple(capability or ()) != (9, 0):
        return "not an sm_90 GPU"  # sm_100's tensor cores take other instructions (tcgen05)
    if q.dtype not in (torch.float16, torch.bfloat16) or not q.dtype == k.dtype == v.dtype \
            or not q.device == k.device == v.device:
        return "dtype: float16 or bfloat16, the same for q, k, v, on one device"
    if not all(t.dim() == 4 for t in (q, k, v)):
        return "(batch, heads, seq, head_dim) tensors"
    (b, h, s, d), (bk, hk, sk, dk) = q.shape, k.shape
    if v.shape != k.shape or bk != b or dk != d or d not in STAGES or not hk or h % hk:
        return "shapes: head_dim 64 or 128, k and v alike, heads a multiple of the kv heads"
    if s % (2 * BM) or sk % BN or not s or not sk or not b * h:
        return f"seq_q a multiple of {2 * BM}, seq_k a multiple of {BN}, no dim 0"
    if max(b * h * s, b * hk * sk) >= 2**31 or b * h > 65535:
        return "batch * heads * seq < 2**31 (32-bit rows), batch * heads <= 65535 (the grid)"
    if not all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in (q, k, v)):
        return "contiguous tensors, 16-byte aligned (what TMA reads)"
    if causal and (s > sk or (sk - s) % BN):
        return f"causal: seq_q <= seq_k, seq_k - seq_q a multiple of {BN}"
    return None


def applies(q, k, v, causal, capability=None) -> bool:
    """Whether attn_fwd can take these inputs (`refusal` says why not)."""
    return refusal(q, k, v, causal, capability) is None


def launch_args(q, k, causal, store_lse, overlap=True, pingpong=True) -> tuple:
    """(grid, the runtime ints after qk_scale, the keywords) of attn_fwd for q, k."""
    b, h, s, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    ints = (s, sk, h, h // hk, b * h * s, b * hk * sk)
    kwargs = dict(D=d, BM=BM, BN=BN, STAGES=STAGES[d], CAUSAL=causal, STORE_LSE=store_lse,
                  OVERLAP=overlap, PINGPONG=overlap and pingpong, num_warps=4)
    return (s // (2 * BM), b * h), ints, kwargs


def launch(q, k, v, out, lse, sm_scale, causal, overlap=True, pingpong=True) -> None:
    """softmax(q k^T * sm_scale (+ causal mask)) v into `out` (contiguous, q's shape), and with
    `lse` ((batch * heads, seq_q) float32; or None) the rows' base-2 log-sum-exp; ValueError on
    inputs `refusal` names. overlap: S_j's product runs during the softmax of S_(j-1) (else one
    tile after another); pingpong (with overlap): the two consumers take turns at the tensor
    cores."""
    why = refusal(q, k, v, causal)
    if why:
        raise ValueError(f"the Gluon attention forward does not take these inputs: {why}")
    grid, ints, kwargs = launch_args(q, k, causal, lse is not None, overlap, pingpong)
    _needs_allocator()  # the device-side TMA descriptors' scratch
    launch_kernel(attn_fwd, grid, q, k, v, out, out if lse is None else lse,
                  float(sm_scale) * LOG2E, *ints, **kwargs)


def compile_sm90(head_dim: int, causal: bool, dtype: str = "fp16", store_lse: bool = True,
                 overlap: bool = True, pingpong: bool = True):
    """attn_fwd compiled for sm_90 without a GPU (not under the interpreter, whose Gluon
    functions the compiler refuses): the CompiledKernel, its PTX in .asm["ptx"]."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = dict(q_ptr=f"*{dtype}", k_ptr=f"*{dtype}", v_ptr=f"*{dtype}", o_ptr=f"*{dtype}",
               lse_ptr="*fp32", qk_scale="fp32", SEQ="i32", SEQ_K="i32", H="i32", GROUP="i32",
               ROWS_Q="i32", ROWS_K="i32")
    consts = dict(D=head_dim, BM=BM, BN=BN, STAGES=STAGES[head_dim], CAUSAL=causal,
                  STORE_LSE=store_lse, OVERLAP=overlap, PINGPONG=overlap and pingpong)
    src = GluonASTSource(attn_fwd, signature={**sig, **{k: "constexpr" for k in consts}},
                         constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


__all__ = ["VARIANTS", "applies", "attn_fwd", "compile_sm90", "launch", "launch_args", "refusal"]
