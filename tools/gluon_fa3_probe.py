"""Compile-only probe, no GPU needed: whether Triton's Gluon builds a FlashAttention-3-style forward
schedule for Hopper (sm_90), the first step of a Gluon attention kernel (issue 41).

    python tools/gluon_fa3_probe.py

The schedule: one producer warp (its own register budget) streams K and V tiles by TMA into a
ring of shared-memory stages guarded by mbarriers; two consumer partitions of 4 warps (240
registers each, setmaxnreg) each own a Q tile, compute S = Q K^T by asynchronous wgmma from
shared memory, the online softmax in registers, and O += P V with P passed from registers, then
store O by TMA. It prints the cubin's size, shared memory, and counts of wgmma, setmaxnreg and
TMA instructions in the PTX. Not checked here: results (never run), causal masking, GQA,
batch and heads, lengths that are not multiples of the tiles, the ping-pong order of the two
consumers (Gluon has no named barriers: mbarriers would order them), speed."""
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import (
    tma, mbarrier, fence_async_shared, warpgroup_mma, warpgroup_mma_wait)

BM, BN, D, STAGES = 64, 128, 128, 2


@gluon.jit
def _load(k_desc, v_desc, k_ring, v_ring, ready, empty, n_kv, BN: gl.constexpr,
          STAGES: gl.constexpr):
    for i in range(n_kv):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [i * BN, 0], ready.index(s), k_ring.index(s))
        tma.async_copy_global_to_shared(v_desc, [i * BN, 0], ready.index(s), v_ring.index(s))


@gluon.jit
def _softmax_mma(q_smem, k_ring, v_ring, ready, empty, o_desc, o_smem, n_kv, off_m, qk_scale,
                 BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.full([BM], 0.0, gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros((BM, D), dtype=gl.float32, layout=o_layout)
    for i in range(n_kv):
        st = i % STAGES
        mbarrier.wait(ready.index(st), (i // STAGES) & 1)
        s = gl.zeros((BM, BN), dtype=gl.float32, layout=s_layout)
        s = warpgroup_mma(q_smem, k_ring.index(st).permute((1, 0)), s, use_acc=False,
                          is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p = gl.exp2(s * qk_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, 1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        acc = warpgroup_mma(gl.convert_layout(p.to(gl.float16), p_layout), v_ring.index(st), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(st), count=1)
        m_i = m_new
    acc = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    o_smem.store(acc.to(gl.float16))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [off_m, 0], o_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def fa_probe(q_ptr, k_ptr, v_ptr, o_ptr, seq, qk_scale, BM: gl.constexpr, BN: gl.constexpr,
             D: gl.constexpr, STAGES: gl.constexpr):
    q_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D], gl.float16)
    kv_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], gl.float16)
    q_desc = tma.make_tensor_descriptor(q_ptr, [seq, D], [D, 1], [BM, D], q_l)
    k_desc = tma.make_tensor_descriptor(k_ptr, [seq, D], [D, 1], [BN, D], kv_l)
    v_desc = tma.make_tensor_descriptor(v_ptr, [seq, D], [D, 1], [BN, D], kv_l)
    o_desc = tma.make_tensor_descriptor(o_ptr, [seq, D], [D, 1], [BM, D], q_l)
    off = gl.program_id(0) * 2 * BM
    q0 = gl.allocate_shared_memory(gl.float16, [BM, D], q_l)
    q1 = gl.allocate_shared_memory(gl.float16, [BM, D], q_l)
    o0 = gl.allocate_shared_memory(gl.float16, [BM, D], q_l)
    o1 = gl.allocate_shared_memory(gl.float16, [BM, D], q_l)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [off, 0], bar, q0)
    tma.async_copy_global_to_shared(q_desc, [off + BM, 0], bar, q1)
    mbarrier.wait(bar, 0)
    k_ring = gl.allocate_shared_memory(gl.float16, [STAGES, BN, D], kv_l)
    v_ring = gl.allocate_shared_memory(gl.float16, [STAGES, BN, D], kv_l)
    ready0 = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty0 = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready0.index(s), count=1)
        mbarrier.init(empty0.index(s), count=2)  # both consumers release a stage
    n_kv = gl.cdiv(seq, BN)
    gl.warp_specialize([
        (_softmax_mma, (q0, k_ring, v_ring, ready0, empty0, o_desc, o0, n_kv, off, qk_scale,
                        BM, BN, D, STAGES)),
        (_softmax_mma, (q1, k_ring, v_ring, ready0, empty0, o_desc, o1, n_kv, off + BM,
                        qk_scale, BM, BN, D, STAGES)),
        (_load, (k_desc, v_desc, k_ring, v_ring, ready0, empty0, n_kv, BN, STAGES)),
    ], [4, 1], [240, 24])


src = GluonASTSource(fa_probe, signature={"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16",
                                          "o_ptr": "*fp16", "seq": "i32", "qk_scale": "fp32",
                                          "BM": "constexpr", "BN": "constexpr", "D": "constexpr",
                                          "STAGES": "constexpr"},
                     constexprs={"BM": BM, "BN": BN, "D": D, "STAGES": STAGES})
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
ptx = k.asm["ptx"]
print("compiled for sm_90:", len(k.asm["cubin"]), "bytes of cubin; shared", k.metadata.shared,
      "; wgmma", ptx.count("wgmma.mma_async"), "; setmaxnreg", ptx.count("setmaxnreg"),
      "; TMA loads", ptx.count("cp.async.bulk.tensor"))
