import gc
import math

import pytest
import torch

from triton_fusion_report import kernels
from triton_fusion_report.analysis.bench.timing import peak_mib

from conftest import DEVICE, FULL, TOL, fast_cases, full, rel_err

from triton_fusion_report.kernels import _plans
from triton_fusion_report.kernels.families.attention import forward as at
from triton_fusion_report.kernels.families.attention import plan as atp

DTYPES = [torch.float16, torch.bfloat16]
# Fused: p is rounded to the input dtype before p @ v (as in FlashAttention), scores stay float32.
FUSED_TOL = {torch.float16: 3 * TOL[torch.float16], torch.bfloat16: 3 * TOL[torch.bfloat16]}
# Unfused stores the scores and probabilities in the input dtype: two more roundings.
UNFUSED_TOL = {torch.float16: 6 * TOL[torch.float16], torch.bfloat16: 8 * TOL[torch.bfloat16]}
SEQS = [1, 37, 100]  # one query, and lengths that are not multiples of any block
HEAD_DIMS = [16, 64, 80]  # 80 is padded to 128 inside the kernel


def ref64(q, k, v, causal=False, sm_scale=None):
    return at.reference(q.double(), k.double(), v.double(), causal, sm_scale)


def ones(shape, device):
    return torch.ones(shape, device=device, dtype=torch.float16)


def qkv(shape, dtype, device, scale=1.0):
    return tuple(torch.randn(shape, device=device, dtype=dtype) * scale for _ in range(3))


@fast_cases()
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq", SEQS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_fused_matches_float64(dtype, causal, seq, head_dim, device):
    q, k, v = qkv((1, 2, seq, head_dim), dtype, device)
    out = at.triton_fused(q, k, v, causal)
    assert out.shape == q.shape and out.dtype == dtype
    assert rel_err(out, ref64(q, k, v, causal)) <= FUSED_TOL[dtype]


@fast_cases(lambda dtype, causal, seq: (dtype, causal, seq) == (torch.bfloat16, True, 100))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq", [37, 100])
def test_unfused_matches_float64(dtype, causal, seq, device):
    q, k, v = qkv((2, 1, seq, 32), dtype, device)
    out = at.triton_unfused(q, k, v, causal)
    assert out.shape == q.shape and out.dtype == dtype
    assert rel_err(out, ref64(q, k, v, causal)) <= UNFUSED_TOL[dtype]


@pytest.mark.parametrize("causal", [*full(False), True])
def test_public_function(causal, device):
    q, k, v = qkv((2, 3, 50, 64), torch.float16, device)
    out = kernels.attention(q, k, v, causal=causal)
    assert rel_err(out, ref64(q, k, v, causal)) <= FUSED_TOL[torch.float16]


@fast_cases(lambda block_m, block_n, causal: (block_m, block_n, causal) == (32, 16, True))
@pytest.mark.parametrize("block_m, block_n", [(16, 16), (32, 16), (64, 32), (64, 64), (16, 32)])
@pytest.mark.parametrize("causal", [False, True])
def test_block_sizes(block_m, block_n, causal, device):
    """Blocks below and above seq, block_n < block_m (several key tiles per diagonal block)."""
    if causal and block_m % block_n:
        pytest.skip("causal needs block_m to be a multiple of block_n (tested below)")
    q, k, v = qkv((1, 2, 100, 32), torch.float16, device)
    out = at.triton_fused(q, k, v, causal, block_m=block_m, block_n=block_n, num_warps=4,
                          num_stages=2)
    assert rel_err(out, ref64(q, k, v, causal)) <= FUSED_TOL[torch.float16]


@pytest.mark.parametrize("head_dim", [8, *full(32, 96, 128), 256])
def test_head_dims(head_dim, device):
    """Powers of two run natively; 8 and 96 are padded (to 16 and 128) with zero columns."""
    q, k, v = qkv((1, 1, 40, head_dim), torch.bfloat16, device)
    out = at.triton_fused(q, k, v, causal=True)
    assert rel_err(out, ref64(q, k, v, True)) <= FUSED_TOL[torch.bfloat16]


def _views_of_one_projection(batch, seq, heads, dim, device, dtype=torch.float16):
    qkv_ = torch.randn(batch, seq, 3, heads, dim, device=device, dtype=dtype)
    return tuple(qkv_[:, :, i].transpose(1, 2) for i in range(3))


@fast_cases(lambda layout, causal: (layout, causal) == ("grouped_kv_cache", True))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "qkv_views", "grouped_kv_cache", "head_dim_20"])
def test_without_tma(layout, causal, device, monkeypatch):
    """The path of GPUs without TMA (before Hopper), forced with NO_TMA: plain masked loads at
    the tensors' own strides (views read in place, no copy), any head_dim without host padding;
    the same results as the descriptor path, against float64."""
    from triton_fusion_report.kernels import _device

    monkeypatch.setattr(_device, "NO_TMA", True)
    if layout == "qkv_views":
        q, k, v = _views_of_one_projection(2, 37, 2, 32, device)
    elif layout == "grouped_kv_cache":
        q = torch.randn(1, 4, 19, 32, device=device, dtype=torch.bfloat16)
        k, v = (torch.randn(1, 2, 45, 32, device=device, dtype=torch.bfloat16) for _ in range(2))
    else:
        q, k, v = qkv((2, 2, 37, 20 if layout == "head_dim_20" else 80), torch.float16, device)
    plan = atp._plan(q, k, v, causal, 0.1, (32, 16, None, None), False)
    assert plan.route == "main" and not plan.host
    out = at.triton_fused(q, k, v, causal, block_m=32, block_n=16)
    assert out.is_contiguous() and out.shape == q.shape
    assert rel_err(out, ref64(q, k, v, causal)) <= FUSED_TOL[q.dtype]
    dout = torch.randn_like(out)
    got, want = _public_and_float64_grads(q, k, v, dout, causal)
    for g, w in zip(got, want):
        assert rel_err(g, w) <= 2 * FUSED_TOL[q.dtype]


@fast_cases(lambda layout, causal: (layout, causal) in (("contiguous", True), ("qkv_views", False)))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "qkv_views", "grouped_kv_cache", "head_dim_20"])
def test_small_problems_skip_descriptors(layout, causal, device, monkeypatch):
    """Below TMA_FROM_FLOPS the forward reads through plain loads even where TMA exists (three
    host descriptors cost more than a small problem's GPU time): contiguous tensors through
    _attn_fwd's MODE 2 (strides from the sizes), views through _attn_fwd_pointers (their own
    strides), head dims not a multiple of 8 without the host's padding. The first call and the
    steady path after it agree with float64, with and without the log-sum-exp."""
    monkeypatch.setattr(atp, "TMA_FROM_FLOPS", 2**40)
    for cache in ("_PLANS", "_TUNED_PLANS", "_CHECKED"):
        monkeypatch.setattr(at, cache, {})
    if layout == "qkv_views":
        q, k, v = _views_of_one_projection(2, 37, 2, 32, device)
    elif layout == "grouped_kv_cache":  # two batches: the key heads' batch stride is read
        q = torch.randn(2, 4, 19, 32, device=device, dtype=torch.bfloat16)
        k, v = (torch.randn(2, 2, 45, 32, device=device, dtype=torch.bfloat16) for _ in range(2))
    else:
        q, k, v = qkv((2, 2, 37, 20 if layout == "head_dim_20" else 64), torch.float16, device)
    plan = atp._plan(q, k, v, causal, 0.1, (None,) * 4, False)
    assert plan.route == "main" and not plan.host
    assert plan.consts.get("MODE") == (None if layout == "qkv_views" else 2)
    want = ref64(q, k, v, causal)
    for _ in range(2):  # planned, then the steady launcher
        out, lse = at.triton_fused(q, k, v, causal, return_lse=True)
        assert rel_err(out, want) <= FUSED_TOL[q.dtype]
        out = at.triton_fused(q, k, v, causal)
        assert out.is_contiguous() and rel_err(out, want) <= FUSED_TOL[q.dtype]
    assert len(at._TUNED_PLANS) == 2
    scores = (q.double() @ k.double().repeat_interleave(q.shape[1] // k.shape[1], 1)
              .transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        shift = k.shape[2] - q.shape[2]
        keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=device).tril(shift)
        scores = scores.masked_fill(~keep, float("-inf"))
    want_lse = (torch.logsumexp(scores, -1) / math.log(2)).reshape(lse.shape)
    assert (lse.double() - want_lse).abs().max() <= 1e-3 * want_lse.abs().max() + 1e-3


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real tuning")
@pytest.mark.parametrize("causal", [False, *full(True)])
def test_tuned_launch(causal, device, monkeypatch):
    """The GPU's default path (tuning, descriptor blocks, pruning) under the interpreter, with
    the timing replaced by one plain run of each config; a new length in the same bucket reuses
    the choice, a longer one tunes again."""
    runs = []

    def one_run(fn):
        fn()
        runs.append(1)
        return float(len(runs))  # the first candidate is the fastest

    monkeypatch.setattr(atp, "interpreting", lambda: False)
    monkeypatch.setattr(at, "_bench", one_run)
    monkeypatch.setattr(at, "_TUNED", {})
    monkeypatch.setattr(at, "_PLANS", {})  # plans made under the interpreter use fixed configs
    monkeypatch.setattr(at, "_TUNED_PLANS", {})
    q, k, v = qkv((1, 2, 100, 64), torch.float16, device)
    out = kernels.attention(q, k, v, causal=causal)
    # seq 100 prunes the 128-row configs: two 64-row ones are left, timed in rounds
    assert len(runs) == 2 * _plans.TUNING_ROUNDS
    assert list(at._TUNED.values()) == [atp.CONFIGS[4]]
    assert rel_err(out, ref64(q, k, v, causal)) <= FUSED_TOL[torch.float16]
    q, k, v = qkv((1, 2, 120, 64), torch.float16, device)  # same bucket (128): no tuning
    assert rel_err(kernels.attention(q, k, v, causal=causal), ref64(q, k, v, causal)) <= \
        FUSED_TOL[torch.float16]
    assert len(runs) == 2 * _plans.TUNING_ROUNDS
    assert atp.seq_bucket(100) == atp.seq_bucket(128) == 128 < atp.seq_bucket(129)


@pytest.mark.parametrize("causal", [False, *full(True)])
def test_large_scores_are_stable(causal, device):
    """Scores of several hundred (exp overflows float32 without the running max); the largest
    key comes last, so the max jumps between tiles and the accumulator must be rescaled."""
    q, k, v = qkv((1, 2, 64, 64), torch.float16, device, scale=4.0)
    k[:, :, -1] = q[:, :, -1] * 2
    out = at.triton_fused(q, k, v, causal, block_m=16, block_n=16)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref64(q, k, v, causal)) <= FUSED_TOL[torch.float16]


def test_sm_scale(device):
    q, k, v = qkv((1, 2, 37, 64), torch.float16, device)
    for scale in (0.5, 1, 1 / math.sqrt(64)):
        out = kernels.attention(q, k, v, sm_scale=scale)
        assert rel_err(out, ref64(q, k, v, False, scale)) <= FUSED_TOL[torch.float16]
    # None means 1/sqrt(head_dim)
    assert torch.equal(kernels.attention(q, k, v), kernels.attention(q, k, v, sm_scale=0.125))


@fast_cases(lambda scale, causal, impl: (scale, causal, impl) == (-2.0, True, "fused"))
@pytest.mark.parametrize("impl", ["fused", "unfused"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [-0.125, -2.0, 0.0])
def test_negative_and_zero_scale(scale, causal, impl, device):
    """q = k = v (tied, as in self-attention of one tensor): with a negative scale each row's
    largest score times the scale is its smallest scaled score, so a kernel that takes the max
    before scaling overflows to NaN. Unmasked tiles (seq 256, whole tiles) and masked ones."""
    if impl == "unfused" and abs(scale) > 1:
        pytest.skip("the unfused version stores the scores in float16: at |scores| ~ 128 their "
                    "rounding alone moves the weights by ~6%")
    (x,) = qkv((1, 2, 256, 64), torch.float16, device)[:1]
    fn = at.triton_fused if impl == "fused" else at.triton_unfused
    out = fn(x, x, x, causal, scale)
    assert torch.isfinite(out).all()
    tol = (FUSED_TOL if impl == "fused" else UNFUSED_TOL)[torch.float16]
    assert rel_err(out, ref64(x, x, x, causal, scale)) <= tol


def _grads(fn, q, k, v, dout):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    fn(*leaves).backward(dout)
    return [t.grad for t in leaves]


def _public_and_float64_grads(q, k, v, dout, causal):
    """The gradients of q, k, v through kernels.attention, and through the float64 reference."""
    got = _grads(lambda a, b, c: kernels.attention(a, b, c, causal), q, k, v, dout)
    want = _grads(lambda a, b, c: at.reference(a, b, c, causal),
                  *(t.double() for t in (q, k, v)), dout.double())
    return got, want


@fast_cases(lambda shape, causal, dtype: (shape, causal, dtype) == ((2, 1, 64, 80), True,
                                                                   torch.bfloat16))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 2, 37, 64), (2, 1, 64, 80), (1, 1, 5, 16)])
def test_backward_matches_float64(shape, causal, dtype, device):
    """dq, dk, dv of the FlashAttention-2 backward against float64 autograd: a sequence length
    not a multiple of the tiles, a head_dim padded to a power of two, a sequence shorter than one
    tile."""
    q, k, v = qkv(shape, dtype, device)
    dout = torch.randn(shape, device=device, dtype=dtype)
    got, want = _public_and_float64_grads(q, k, v, dout, causal)
    for g, w in zip(got, want):
        assert g.dtype == dtype and g.shape == w.shape
        assert rel_err(g, w) <= 2 * FUSED_TOL[dtype]


@pytest.mark.parametrize("scale", [-0.5, *full(0.3)])
def test_backward_scale(scale, device):
    q, k, v = qkv((1, 2, 40, 32), torch.float16, device)
    dout = torch.randn_like(q)
    got = _grads(lambda a, b, c: kernels.attention(a, b, c, True, scale), q, k, v, dout)
    want = _grads(lambda a, b, c: at.reference(a, b, c, True, scale),
                  *(t.double() for t in (q, k, v)), dout.double())
    for g, w in zip(got, want):
        assert rel_err(g, w) <= 2 * FUSED_TOL[torch.float16]


# (q shape, k/v shape): grouped heads (4 query heads on 2 and on 1 key/value heads), a KV cache
# (fewer queries than keys, one query: decoding), both.
GQA_SHAPES = [((1, 4, 37, 32), (1, 2, 37, 32)), ((2, 4, 20, 16), (2, 1, 20, 16)),
              ((1, 2, 24, 32), (1, 2, 70, 32)), ((1, 2, 1, 64), (1, 2, 45, 64)),
              ((2, 4, 5, 16), (2, 2, 33, 16))]


@fast_cases(lambda q_shape, kv_shape, causal, impl: (q_shape, causal, impl) == (
    GQA_SHAPES[4][0], True, "unfused"))  # the fused forward: in the backward's test below
@pytest.mark.parametrize("impl", ["fused", "unfused"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q_shape, kv_shape", GQA_SHAPES)
def test_grouped_heads_and_kv_cache(q_shape, kv_shape, causal, impl, device):
    """Forward against float64: kv_heads dividing heads (no copy of k, v in the fused kernel),
    seq_q != seq_k with the causal mask aligned to the bottom right."""
    q = torch.randn(q_shape, device=device, dtype=torch.float16)
    k, v = (torch.randn(kv_shape, device=device, dtype=torch.float16) for _ in range(2))
    fn = at.triton_fused if impl == "fused" else at.triton_unfused
    out = fn(q, k, v, causal)
    tol = (FUSED_TOL if impl == "fused" else UNFUSED_TOL)[torch.float16]
    assert out.shape == q.shape and rel_err(out, ref64(q, k, v, causal)) <= tol


@fast_cases(lambda q_shape, kv_shape, causal: (q_shape, causal) == (GQA_SHAPES[4][0], True))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q_shape, kv_shape", GQA_SHAPES)
def test_grouped_heads_and_kv_cache_backward(q_shape, kv_shape, causal, device):
    """dq, dk, dv against float64: dk and dv of a shared head sum over its query heads."""
    q = torch.randn(q_shape, device=device, dtype=torch.float16)
    k, v = (torch.randn(kv_shape, device=device, dtype=torch.float16) for _ in range(2))
    dout = torch.randn_like(q)
    got, want = _public_and_float64_grads(q, k, v, dout, causal)
    for g, w in zip(got, want):
        assert g.shape == w.shape and rel_err(g, w) <= 2 * FUSED_TOL[torch.float16]


# (q shape, k/v shape) of decoding: one query (grouped heads or not), a few queries (speculative
# decoding) with head dims that are not powers of two.
DECODE_SHAPES = [((1, 4, 1, 64), (1, 1, 300, 64)), ((2, 2, 3, 40), (2, 2, 150, 40)),
                 ((1, 8, 2, 16), (1, 4, 129, 16))]


@fast_cases(lambda q_shape, kv_shape, causal, splits: (q_shape, causal, splits) in (
    (DECODE_SHAPES[1][0], True, 1), (DECODE_SHAPES[2][0], False, 3)))
@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q_shape, kv_shape", DECODE_SHAPES)
def test_decoding_split_keys(q_shape, kv_shape, causal, splits, device):
    """Few queries against many keys take the split-key path (its own kernels): output and
    log-sum-exp against float64, whatever the number of splits (one split stores directly)."""
    from triton_fusion_report.kernels.families.attention import decoding as fd

    q = torch.randn(q_shape, device=device, dtype=torch.float16)
    k, v = (torch.randn(kv_shape, device=device, dtype=torch.float16) for _ in range(2))
    assert fd.applies(q, k)
    scale = q.shape[-1] ** -0.5
    out, lse = fd.attention(q, k, v, causal, scale, num_splits=splits)
    assert rel_err(out, ref64(q, k, v, causal)) <= FUSED_TOL[torch.float16]
    group = q.shape[1] // k.shape[1]
    s = (q.double() @ k.double().repeat_interleave(group, 1).transpose(-2, -1)) * scale
    if causal:
        n_q, n_k = s.shape[-2:]
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(n_k - n_q)
        s = s.masked_fill(~keep, float("-inf"))
    want_lse = torch.logsumexp(s, -1).flatten(0, 1) / math.log(2)
    assert (lse.double() - want_lse).abs().max().item() <= 1e-3


def test_decoding_is_the_default_for_few_queries(device, monkeypatch):
    """triton_fused dispatches one query per head to the split-key kernels, and a strided view of
    a longer KV cache (the cache's first seq_k positions) is read in place."""
    from triton_fusion_report.kernels.families.attention import decoding as fd

    calls = []
    real = fd.attention
    monkeypatch.setattr(fd, "attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    cache = torch.randn(2, 2, 2, 400, 32, device=device, dtype=torch.float16)  # (k|v, b, h, s, d)
    k, v = cache[0, :, :, :257], cache[1, :, :, :257]
    assert not k.is_contiguous()
    q = torch.randn(2, 4, 1, 32, device=device, dtype=torch.float16)
    out = at.triton_fused(q, k, v)
    assert calls and rel_err(out, ref64(q, k, v)) <= FUSED_TOL[torch.float16]


@pytest.mark.parametrize("causal", [*full(False), True])
def test_decoding_backward(causal, device):
    """Gradients through the split-key forward (the backward reads its log-sum-exp)."""
    q = torch.randn(1, 4, 2, 32, device=device, dtype=torch.float16)
    k, v = (torch.randn(1, 2, 90, 32, device=device, dtype=torch.float16) for _ in range(2))
    dout = torch.randn_like(q)
    got, want = _public_and_float64_grads(q, k, v, dout, causal)
    for g, w in zip(got, want):
        assert g.shape == w.shape and rel_err(g, w) <= 2 * FUSED_TOL[torch.float16]


def test_bottom_right_causal_matches_sdpa(device):
    """The causal alignment is PyTorch's causal_lower_right (what a KV cache needs)."""
    from torch.nn.attention.bias import causal_lower_right

    q = torch.randn(1, 2, 5, 32, device=device)
    k, v = (torch.randn(1, 2, 12, 32, device=device) for _ in range(2))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                            attn_mask=causal_lower_right(5, 12))
    assert rel_err(at.reference(q, k, v, True), want) <= 1e-5


@fast_cases(lambda head_dim, causal: (head_dim, causal) == (100, True))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [1, 3, 20, 100])
def test_any_head_dim(head_dim, causal, device):
    """Head dims that are not a multiple of 8 (padded on the host for the forward's descriptors;
    the backward's masked loads take them as they are): forward and gradients."""
    q, k, v = qkv((1, 2, 19, head_dim), torch.float16, device)
    out = kernels.attention(q, k, v, causal)
    assert out.shape == q.shape and out.is_contiguous()
    assert rel_err(out, ref64(q, k, v, causal)) <= FUSED_TOL[torch.float16]
    dout = torch.randn_like(q)
    got, want = _public_and_float64_grads(q, k, v, dout, causal)
    for g, w in zip(got, want):
        assert g.shape == w.shape and rel_err(g, w) <= 2 * FUSED_TOL[torch.float16]


@pytest.mark.parametrize("causal", [*full(False), True])
def test_views_of_one_qkv_projection(causal, device):
    """q, k, v as views of one (batch, seq, 3, heads, dim) projection, the layout of nearly every
    model: read in place (no copy), forward and gradients as for contiguous copies."""
    q, k, v = _views_of_one_projection(2, 37, 4, 32, device)
    assert not q.is_contiguous()
    out = kernels.attention(q, k, v, causal)
    assert rel_err(out, ref64(q, k, v, causal)) <= FUSED_TOL[torch.float16]
    dout = torch.randn_like(out)
    got, want = _public_and_float64_grads(q, k, v, dout, causal)
    for g, w in zip(got, want):
        assert rel_err(g, w) <= 2 * FUSED_TOL[torch.float16]


@pytest.mark.parametrize("causal", [False, *full(True)])
def test_backward_reads_strided_views(causal, device):
    """The backward kernels read q, k, v and dout at their own strides: grouped heads from views of
    one projection, a transposed dout, and a KV cache longer than the queries; gradients against
    float64 and contiguous, whatever the layouts."""
    from triton_fusion_report.kernels.families.attention import forward as fa
    from triton_fusion_report.kernels.families.attention import backward as fab

    batch, seq, seq_k, dim = 2, 21, 40, 16
    qp = torch.randn(batch, seq, 4, dim + 8, device=device, dtype=torch.float16)[..., :dim]
    kvp = torch.randn(batch, seq_k, 2, 2, dim, device=device, dtype=torch.float16)
    q = qp.transpose(1, 2)
    k, v = (kvp[:, :, i].transpose(1, 2) for i in range(2))
    dout = torch.randn(batch, seq, 4, dim, device=device, dtype=torch.float16).transpose(1, 2)
    assert not any(t.is_contiguous() for t in (q, k, v, dout))
    out, lse = fa.triton_fused(q, k, v, causal, return_lse=True)
    got = fab.attention_backward(q, k, v, out, lse, dout, causal, dim ** -0.5)
    want = _grads(lambda a, b, c: at.reference(a, b, c, causal),
                  *(t.double() for t in (q, k, v)), dout.double())
    for g, w in zip(got, want):
        assert g.is_contiguous() and rel_err(g, w) <= 2 * FUSED_TOL[torch.float16]


def test_one_query_attends_to_itself(device):
    """Causal row 0 sees key 0 only: its output is v[0] exactly."""
    q, k, v = qkv((1, 1, 37, 16), torch.float16, device)
    out = kernels.attention(q, k, v, causal=True)
    assert torch.equal(out[..., 0, :], v[..., 0, :])


def test_empty(device):
    q, k, v = qkv((0, 2, 8, 16), torch.float16, device)
    assert at.triton_fused(q, k, v).shape == (0, 2, 8, 16)


@pytest.mark.parametrize("seq_q", [1, 20])  # the decoding route, the main kernel
def test_no_keys(seq_q, device):
    """seq_k = 0 (an empty KV cache): zeros and zero gradients, as torch's sdpa gives (raised
    ZeroDivisionError or a TMA assertion, or returned NaN without TMA)."""
    q = torch.randn(1, 2, seq_q, 16, device=device, dtype=torch.float16, requires_grad=True)
    k, v = (torch.randn(1, 2, 0, 16, device=device, dtype=torch.float16, requires_grad=True)
            for _ in range(2))
    assert torch.equal(at.triton_fused(q.detach(), k.detach(), v.detach()),
                       torch.zeros_like(q))
    out = kernels.attention(q, k, v)
    assert torch.equal(out, torch.zeros_like(q))
    out.backward(torch.ones_like(out))
    assert torch.equal(q.grad, torch.zeros_like(q)) and k.grad.shape == k.shape


def test_reference_is_naive_torch(device):
    q, k, v = qkv((1, 2, 9, 16), torch.float32, device)
    expected = torch.softmax(q @ k.transpose(-2, -1) / 4.0, dim=-1) @ v
    assert torch.allclose(at.reference(q, k, v), expected, atol=1e-6)


def test_default_config_interpreted():
    if torch.cuda.is_available():
        pytest.skip("the interpreter's fixed config")
    assert at.default_config(100, 64, False)["block_m"] == 16


@pytest.mark.parametrize(
    "args, exc, words",
    [
        (lambda d: qkv((1, 1, 8, 16), torch.float32, d), TypeError, "float16 or bfloat16"),
        (lambda d: qkv((1, 8, 16), torch.float16, d), ValueError, "4-D"),
        (lambda d: qkv((1, 1, 8, 16), torch.float16, d)[:2] + (ones((1, 1, 9, 16), d),),
         ValueError, "one shape"),
        (lambda d: (ones((1, 3, 8, 16), d), ones((1, 2, 8, 16), d), ones((1, 2, 8, 16), d)),
         ValueError, "kv_heads dividing heads"),
        (lambda d: (ones((1, 2, 8, 16), d), ones((2, 2, 8, 16), d), ones((2, 2, 8, 16), d)),
         ValueError, "one shape"),
        (lambda d: (ones((1, 2, 9, 16), d), ones((1, 2, 8, 16), d), ones((1, 2, 8, 16), d), True),
         ValueError, "more queries"),
        (lambda d: qkv((1, 1, 8, 16), torch.float16, d)[:2] + (ones((1, 1, 8, 16), d).bfloat16(),),
         TypeError, "bfloat16"),
        (lambda d: qkv((1, 1, 8, 512), torch.float16, d), ValueError, "head_dim"),
        (lambda d: tuple(t.transpose(2, 3) for t in qkv((1, 2, 16, 16), torch.float16, d)),
         ValueError, "last dim is not contiguous"),
        (lambda d: tuple(t[:, :, :, :12] for t in qkv((1, 2, 8, 14), torch.float16, d)),
         ValueError, "multiples of 16 bytes"),
        (lambda d: (torch.ones(1, 1, 8, 16, dtype=torch.int32, device=d),) * 3, TypeError,
         "int32"),
    ],
)
def test_bad_inputs_raise(args, exc, words, device):
    with pytest.raises(exc, match=words):
        kernels.attention(*args(device))


def test_bad_options_raise(device):
    q, k, v = qkv((1, 1, 8, 16), torch.float16, device)
    with pytest.raises(TypeError, match="sm_scale"):
        kernels.attention(q, k, v, sm_scale="0.1")
    with pytest.raises(TypeError, match="causal must be a bool"):
        kernels.attention(q, k, v, causal=1)
    with pytest.raises(ValueError, match="multiple of block_n"):
        at.triton_fused(q, k, v, causal=True, block_m=16, block_n=32)
    with pytest.raises(ValueError, match="block_m must be a power of two"):
        at.triton_fused(q, k, v, block_m=48)


def test_cached_checks_still_refuse(device):
    """After a valid call has cached its layout's checks, what the cache must not let through is
    still refused: misaligned data of the same layout, a NaN or bool scale, a non-bool causal."""
    q, k, v = qkv((1, 2, 24, 16), torch.float16, device)
    at.triton_fused(q, k, v, False, 0.5)
    buf = torch.randn(q.numel() + 1, device=device, dtype=torch.float16)
    shifted = buf[1:].view(q.shape)  # same layout, data 2 bytes off
    with pytest.raises(ValueError, match="16-byte aligned"):
        at.triton_fused(shifted, k, v, False, 0.5)
    with pytest.raises(TypeError, match="sm_scale"):
        at.triton_fused(q, k, v, False, float("nan"))
    with pytest.raises(TypeError, match="sm_scale"):
        at.triton_fused(q, k, v, False, True)
    with pytest.raises(TypeError, match="causal"):
        at.triton_fused(q, k, v, 0, 0.5)


@fast_cases(lambda causal, no_tma: causal and not no_tma)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("no_tma", [False, True])
def test_climbing_scores_match_float64(causal, no_tma, device, monkeypatch):
    """Scores that climb along the keys (the running max grows at every tile), grouped heads,
    odd lengths (a partial key tile, a diagonal), and the log-sum-exp the backward reads."""
    from triton_fusion_report.kernels import _device

    monkeypatch.setattr(_device, "NO_TMA", no_tma)
    monkeypatch.setattr(at, "_PLANS", {})
    monkeypatch.setattr(at, "_TUNED_PLANS", {})
    q, k, v = qkv((1, 4, 40, 16), torch.float16, device)
    k, v = k[:, :2, :].contiguous(), v[:, :2, :].contiguous()
    q[..., 0] = 1.0
    k[0, 0, :, 0] = torch.linspace(0, 90, 40, device=device).to(k.dtype)  # climbs ~2.3 a key
    out, lse = at.triton_fused(q, k, v, causal=causal, return_lse=True)
    assert rel_err(out, ref64(q, k, v, causal)) <= FUSED_TOL[torch.float16]
    scores = (q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2)) / 4.0
    if causal:
        scores = scores.masked_fill(torch.ones(40, 40, device=device).triu(1).bool(), -math.inf)
    want = torch.logsumexp(scores, -1).flatten(0, 1) / math.log(2)  # base 2
    assert torch.allclose(lse.double(), want, rtol=1e-3, atol=1e-3)


@fast_cases(lambda dtype, shape, kv_heads, sm_scale, lse: (dtype, lse, sm_scale) in (
    (torch.bfloat16, True, None), (torch.float16, False, -0.05)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,kv_heads,sm_scale,lse", [
    ((1, 2, 256, 128), 2, None, False),
    ((2, 4, 128, 128), 2, None, True),  # grouped-query attention, log-sum-exp stored
    ((1, 2, 128, 128), 1, -0.05, False),  # a negative scale: the row max is the smallest score
])
def test_warp_specialised_kernel(dtype, shape, kv_heads, sm_scale, lse, device):
    """_attn_fwd_ws (Hopper's automatic warp specialisation; the interpreter runs the same
    program) against float64: q of `shape`, k and v with kv_heads heads and 256 keys, every
    output element written (poisoned first)."""
    batch, heads, seq, head_dim = shape
    q = torch.randn(shape, device=device, dtype=dtype)
    k, v = (torch.randn(batch, kv_heads, 256, head_dim, device=device, dtype=dtype)
            for _ in range(2))
    out = torch.full_like(q, float("nan"))
    lse_out = torch.full((batch * heads, seq), float("nan"), device=device) if lse else None
    scale = at.default_scale(head_dim) if sm_scale is None else sm_scale
    consts = dict(UPCAST=atp._upcast_bf16(dtype), SCALE_POS=scale >= 0, STORE_LSE=lse)
    at._launch_ws(q, k, v, out, lse_out, scale, atp.WS_CONFIG, consts)
    group = heads // kv_heads
    kr, vr = (t.repeat_interleave(group, dim=1) for t in (k, v))
    assert rel_err(out, ref64(q, kr, vr, False, scale)) <= FUSED_TOL[dtype]
    if lse:
        s = (q.double() @ kr.double().transpose(-1, -2)) * scale
        want = torch.logsumexp(s, -1).flatten(0, 1) / math.log(2)
        assert torch.allclose(lse_out.double(), want, atol=1e-2, rtol=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="peak memory is measured on a GPU")
def test_a_first_call_allocates_as_a_later_one(monkeypatch):
    """The first forward + backward at a new shape, its tuning included, peaks at no more than
    1.2x a later call's memory above the inputs: the tuner times on the call's own buffers (it
    once allocated do_bench's 256 MB L2 flush: 264 MiB against 32 at 1x8x8192x64)."""
    from triton_fusion_report.kernels import _buffers

    for name in ("_TUNED", "_PLANS", "_TUNED_PLANS"):
        monkeypatch.setattr(at, name, {})
    # An empty scratch cache: a full one is emptied by the next call that adds to it, freeing
    # other tests' buffers mid-call, below the peak's base (a later call then read 2.2 MB).
    monkeypatch.setattr(_buffers, "_SCRATCH", {})
    q, k, v = (torch.randn(1, 8, 2048, 64, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)

    def peak() -> float:
        # Earlier tests' cyclic garbage collected before the call; peak_mib keeps the collector
        # off during it (freed mid-call, garbage lowers the peak below the base).
        gc.collect()
        return peak_mib(lambda: torch.autograd.grad(kernels.attention(q, k, v, causal=True),
                                                    (q, k, v), do), q.device) * 2**20

    # The steady peak: the highest of three later calls.
    first = peak()
    later = max(peak() for _ in range(3))
    # A call's peak holds at least its three gradients: below that, the measurement is wrong.
    assert later >= 3 * q.numel() * q.element_size(), later
    assert at._TUNED, "the first call did not tune: nothing was checked"
    assert first <= 1.2 * later + 2**20, (first, later)


HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(not HOPPER, reason="the Gluon kernel is for sm_90 (no interpreter runs Gluon)")
@pytest.mark.parametrize("shape, kv, causal, dtype", [
    ((2, 4, 256, 64), (4, 256), False, torch.float16),
    ((2, 4, 256, 64), (4, 256), True, torch.float16),
    ((1, 8, 512, 128), (2, 512), True, torch.bfloat16),  # grouped-query heads
    ((1, 2, 384, 128), (2, 512), True, torch.float16),  # bottom-right: seq_k - seq_q = 128
    ((1, 2, 128, 128), (1, 1024), False, torch.bfloat16)])
@pytest.mark.parametrize("schedule", ["ping-pong", *full("in order", "overlapped")])
def test_gluon_forward_matches_float64(shape, kv, causal, dtype, schedule):
    """The Gluon forward (kernels/families/attention/gluon.py), each schedule, output and
    log-sum-exp (against the `tl` kernels'), every element written (poisoned first), against
    float64; inputs it does not take are refused with the reason."""
    from triton_fusion_report.kernels.families.attention import gluon

    overlap, pingpong = gluon.VARIANTS[schedule]
    b, h, s, d = shape
    q = torch.randn(shape, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, kv[0], kv[1], d, device="cuda", dtype=dtype) for _ in range(2))
    assert gluon.applies(q, k, v, causal)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((b * h, s), float("nan"), device="cuda")
    gluon.launch(q, k, v, out, lse, at.default_scale(d), causal, overlap=overlap,
                 pingpong=pingpong)
    assert rel_err(out, ref64(q, k, v, causal)) <= FUSED_TOL[dtype]
    _, want = at.triton_fused(q, k, v, causal, return_lse=True, _kernel="tl")
    assert (lse - want).abs().max() <= 1e-3 * want.abs().max() + 1e-3
    with pytest.raises(ValueError, match="seq_q a multiple"):
        gluon.launch(q[:, :, :100], k, v, out, None, 0.1, False)


@pytest.mark.skipif(not HOPPER, reason="the Gluon kernel is for sm_90 (no interpreter runs Gluon)")
@pytest.mark.parametrize("causal", [False, True])
def test_gluon_forward_feeds_the_tl_backward(causal):
    """The log-sum-exp of a Gluon forward (forced, as the bench forces it) is the one the
    backward reads: gradients from it, grouped heads and a KV cache longer than the queries,
    against float64."""
    from triton_fusion_report.kernels.families.attention import backward as fab

    q = torch.randn(1, 4, 256, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, 384, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn_like(q)
    out, lse = at.triton_fused(q, k, v, causal, return_lse=True, _kernel="gluon")
    assert lse.shape == (4, 256) and lse.dtype == torch.float32
    got = fab.attention_backward(q, k, v, out, lse, dout, causal, at.default_scale(64))
    want = _grads(lambda a, b, c: at.reference(a, b, c, causal),
                  *(t.double() for t in (q, k, v)), dout.double())
    for g, w in zip(got, want):
        assert rel_err(g, w) <= 2 * FUSED_TOL[torch.bfloat16]


@FULL  # tunes at real sizes: 26 s of a cold `make test` on an H100
@pytest.mark.skipif(not HOPPER, reason="the Gluon kernel is for sm_90 (no interpreter runs Gluon)")
def test_tuning_may_pick_the_gluon_kernel_on_hopper(monkeypatch):
    """Where the Gluon forward applies it is one of the tuning's candidates; chosen (here by a
    timing that makes it the fastest), the first call and the steady path after it launch it,
    with and without the log-sum-exp, and agree with float64."""
    launched = []
    real_launch = at.launch

    def counting(kernel, *args, **kwargs):
        launched.append(kernel)
        return real_launch(kernel, *args, **kwargs)

    def gluon_fastest(fn):
        before = len(launched)
        fn()
        return 0.5 if at._gluon.attn_fwd in launched[before:] else 1.0

    for name, value in (("launch", counting), ("_bench", gluon_fastest), ("_TUNED", {}),
                        ("_PLANS", {}), ("_TUNED_PLANS", {})):
        monkeypatch.setattr(at, name, value)
    monkeypatch.setattr(at._gluon, "launch_kernel", counting)  # the Gluon module's own launch
    q, k, v = qkv((2, 16, 1024, 128), torch.float16, "cuda")
    for causal in (False, True):
        plan = atp._plan(q, k, v, causal, 0.1, (None,) * 4, False)
        assert plan.gluon and plan.tune_key[-1] is True
        for steady in (False, True):  # the first call (it tunes), then the steady path
            launched.clear()
            out, lse = at.triton_fused(q, k, v, causal, return_lse=True)
            assert launched[-1] is at._gluon.attn_fwd and (len(launched) == 1 or not steady)
            assert rel_err(out, ref64(q, k, v, causal)) <= FUSED_TOL[torch.float16]
            _, want = at.triton_fused(q, k, v, causal, return_lse=True, _kernel="tl")
            assert (lse - want).abs().max() <= 1e-3 * want.abs().max() + 1e-3
    assert {cfg for key, cfg in at._TUNED.items() if key[-1]} == {atp.GLUON_CONFIG}


def _gluon_inputs(q_shape=(1, 4, 128, 64), kv_shape=(1, 2, 256, 64), dtype=torch.float16):
    q = torch.randn(q_shape, dtype=dtype)
    k, v = (torch.randn(kv_shape, dtype=dtype) for _ in range(2))
    return q, k, v


def test_gluon_refuses_what_it_does_not_take(monkeypatch):
    """gluon.applies on CPU tensors, with the device's capability given: the inputs it takes
    (sm_90, float16/bfloat16, head_dim 64 or 128, lengths in whole tiles, contiguous and
    aligned, causal with no more queries than keys), and each condition refused with its reason."""
    from triton_fusion_report.kernels.families.attention import gluon

    monkeypatch.setattr(gluon, "interpreting", lambda: False)
    q, k, v = _gluon_inputs()
    for causal in (False, True):
        assert gluon.applies(q, k, v, causal, capability=(9, 0))
    assert gluon.applies(*_gluon_inputs((2, 2, 256, 128), (2, 2, 256, 128), torch.bfloat16), True,
                         capability=(9, 0))
    buf = torch.randn(q.numel() + 1, dtype=torch.float16)
    refused = {
        "not an sm_90 GPU": [(q, k, v, False, (8, 0)), (q, k, v, False, (10, 0)),
                             (q, k, v, False, (8, 9)), (q, k, v, False, None)],  # None: a CPU
        "dtype": [(*_gluon_inputs(dtype=torch.float32), False, (9, 0)),
                  (q, k.bfloat16(), v.bfloat16(), False, (9, 0))],
        "batch, heads, seq, head_dim": [(q[0], k[0], v[0], False, (9, 0))],
        "head_dim 64 or 128": [(*_gluon_inputs((1, 4, 128, 32), (1, 2, 256, 32)), False, (9, 0)),
                               (*_gluon_inputs((1, 4, 128, 80), (1, 2, 256, 80)), False, (9, 0)),
                               (*_gluon_inputs((1, 4, 128, 64), (1, 3, 256, 64)), False, (9, 0)),
                               (q, k, v[:, :, :128], False, (9, 0))],
        "seq_q a multiple": [(*_gluon_inputs((1, 4, 100, 64)), False, (9, 0)),
                             (*_gluon_inputs(kv_shape=(1, 2, 200, 64)), False, (9, 0)),
                             (*_gluon_inputs((0, 4, 128, 64), (0, 2, 256, 64)), False, (9, 0))],
        "contiguous": [(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, False, (9, 0)),
                       (buf[1:].view(q.shape), k, v, False, (9, 0))],  # 2 bytes off
        "causal: seq_q <= seq_k": [(*_gluon_inputs((1, 4, 384, 64)), True, (9, 0))],
    }
    for words, cases in refused.items():
        for *tensors, causal, capability in cases:
            why = gluon.refusal(*tensors, causal, capability=capability)
            assert why is not None and words in why, (words, why)
            assert not gluon.applies(*tensors, causal, capability=capability)
    assert gluon.applies(*_gluon_inputs((1, 4, 384, 64)), False, capability=(9, 0))
    monkeypatch.setattr(gluon, "interpreting", lambda: True)
    assert "interpreter" in gluon.refusal(q, k, v, False, capability=(9, 0))
    monkeypatch.setattr(gluon, "MISSING", "this Triton has no Gluon")
    assert "no Gluon" in gluon.refusal(q, k, v, False, capability=(9, 0))


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0),
                    reason="off sm_90 only")
@pytest.mark.parametrize("causal", [False, True])
def test_plan_off_sm90_never_picks_gluon(causal, device, monkeypatch):
    """Inputs the Gluon forward would take on an H100, on this device (a CPU under the
    interpreter, or a GPU other than sm_90): neither the interpreter's fixed config nor the GPU's
    tuning (here with the timing replaced by one run) has it among its candidates, and forcing it
    is refused, as the bench records it (unsupported)."""
    from triton_fusion_report.analysis.bench.sweep import classify

    q, k, v = qkv((1, 2, 128, 64), torch.float16, device)
    assert not at._gluon.applies(q, k, v, causal)
    plan = atp._plan(q, k, v, causal, 0.125, (None,) * 4, False)
    assert not plan.gluon and plan.cfg != atp.GLUON_CONFIG
    with pytest.raises(ValueError, match="Gluon") as refused:
        at.triton_fused(q, k, v, causal, _kernel="gluon")
    assert classify(refused.value) == "unsupported"
    timed = []
    real_tune = at._tune

    def recorded(key, seq, run, device_, ws=False, gluon=False):
        timed.append(gluon)
        return real_tune(key, seq, run, device_, ws, gluon)

    for name, value in (("interpreting", lambda: False), ("TMA_FROM_FLOPS", 0)):
        monkeypatch.setattr(atp, name, value)
    for name, value in (("_bench", lambda fn: 1.0), ("_TUNED", {}), ("_PLANS", {}),
                        ("_TUNED_PLANS", {}), ("_tune", recorded)):
        monkeypatch.setattr(at, name, value)
    # Refused for the device (no sm_90), not for the interpreter.
    monkeypatch.setattr(at._gluon, "interpreting", lambda: False)
    assert at._gluon.refusal(q, k, v, causal) in ("not an sm_90 GPU", at._gluon.MISSING)
    plan = atp._plan(q, k, v, causal, 0.125, (None,) * 4, False)
    assert plan.tune_key is not None and not plan.gluon and plan.tune_key[-1] is False
    out = kernels.attention(q, k, v, causal=causal)
    assert timed == [False] and atp.GLUON_CONFIG not in at._TUNED.values()
    assert rel_err(out, ref64(q, k, v, causal)) <= FUSED_TOL[torch.float16]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real kernel")
def test_tuning_may_pick_the_gluon_kernel(device, monkeypatch):
    """The plan's plumbing for the Gluon candidate under the interpreter, which runs no Gluon:
    `applies` replaced (true), and its launch by one that writes the float64 result from the
    arguments it is given (so they are checked: tensors, the base-2 scale, the lengths and
    heads). Chosen by a timing that makes it the fastest, the first call and the steady path
    after it launch it, the tune key says so, and forcing `tl` tunes without it."""
    from triton_fusion_report.kernels.families.attention import gluon

    real_launch = at.launch
    gluon_runs, runs, timing = [], [], []

    def launch(kernel, grid, *args, **kwargs):
        if kernel is not gluon.attn_fwd:  # the `tl` kernels run, but for the timing's runs
            return None if timing else real_launch(kernel, grid, *args, **kwargs)
        q_, k_, v_, out, lse, qk_scale, seq, seq_k, heads, group, rows_q, rows_k = args
        assert grid == (seq // (2 * gluon.BM), q_.shape[0] * heads)
        assert (seq, seq_k, heads, group) == (q_.shape[2], k_.shape[2], q_.shape[1],
                                              q_.shape[1] // k_.shape[1])
        assert rows_q == q_.numel() // q_.shape[-1] and rows_k == k_.numel() // k_.shape[-1]
        scale = qk_scale / gluon.LOG2E
        out.copy_(at.reference(q_, k_, v_, kwargs["CAUSAL"], scale))
        if kwargs["STORE_LSE"]:
            kr = k_.double().repeat_interleave(group, 1)
            s = (q_.double() @ kr.transpose(-1, -2)) * scale
            if kwargs["CAUSAL"]:
                keep = torch.ones(seq, seq_k, dtype=torch.bool).tril(seq_k - seq)
                s = s.masked_fill(~keep, float("-inf"))
            lse.copy_((torch.logsumexp(s, -1) / math.log(2)).reshape(lse.shape))
        gluon_runs.append(1)

    def gluon_fastest(fn):
        before = len(gluon_runs)
        timing.append(1)
        fn()
        timing.pop()
        runs.append(1)
        return 0.5 if len(gluon_runs) > before else 1.0

    for name, value in (("interpreting", lambda: False), ("TMA_FROM_FLOPS", 0)):
        monkeypatch.setattr(atp, name, value)
    for name, value in (("_bench", gluon_fastest), ("_TUNED", {}), ("_PLANS", {}),
                        ("_TUNED_PLANS", {}), ("launch", launch)):
        monkeypatch.setattr(at, name, value)
    monkeypatch.setattr(gluon, "applies", lambda q, k, v, causal, capability=None: True)
    monkeypatch.setattr(gluon, "refusal", lambda q, k, v, causal, capability=None: None)
    monkeypatch.setattr(gluon, "launch_kernel", launch)  # gluon.launch's, as the plan calls it
    q = torch.randn(1, 4, 128, 64, device=device, dtype=torch.float16)
    k, v = (torch.randn(1, 2, 256, 64, device=device, dtype=torch.float16) for _ in range(2))
    plan = atp._plan(q, k, v, True, 0.125, (None,) * 4, False)
    assert plan.gluon and plan.tune_key[-1] is True
    out = kernels.attention(q, k, v, causal=True)
    # six CONFIGS (no 128-row one pruned: 128 queries) and GLUON_CONFIG, each timed every round
    assert list(at._TUNED.values()) == [atp.GLUON_CONFIG] and len(runs) == 7 * _plans.TUNING_ROUNDS
    assert rel_err(out, ref64(q, k, v, True)) <= FUSED_TOL[torch.float16]
    for _ in range(2):  # the steady path, with the log-sum-exp as the backward takes it
        n = len(gluon_runs)
        out, lse = at.triton_fused(q, k * 0.5, v, True, return_lse=True)
        assert len(gluon_runs) == n + 1 and lse.shape == (4, 128) and lse.dtype == torch.float32
        assert rel_err(out, ref64(q, k * 0.5, v, True)) <= FUSED_TOL[torch.float16]
    # the log-sum-exp as the `tl` kernels store it: the scale reached the launch in base 2
    lse_tl = at.triton_fused(q, k * 0.5, v, True, return_lse=True, _kernel="tl")[1]
    assert torch.allclose(lse, lse_tl, atol=2e-2, rtol=0)
    n = len(gluon_runs)
    out = at.triton_fused(q, k, v, True, _kernel="tl")
    assert len(gluon_runs) == n and rel_err(out, ref64(q, k, v, True)) <= FUSED_TOL[torch.float16]
    assert atp._plan(q, k, v, True, 0.125, (None,) * 4, False, "tl").tune_key[-1] is False


def test_bench_times_each_forward_kernel_alone(device):  # the bench's device
    """The bench's attention grid has, at its kernel shapes, the forward with the Gluon kernel
    and with the `tl` kernels forced (sweep "kernel", variant "gluon" / "tl"); on this device
    the `tl` one matches float64 and the Gluon one is refused where it does not apply."""
    from triton_fusion_report.analysis.bench import attention as bench
    from triton_fusion_report.analysis.bench.sweep import classify

    for grid in ("book", "full"):
        shapes = {(p.shape["head_dim"], p.shape["seq"], p.shape["causal"])
                  for p in bench.attention_problems(grid)
                  if any(v.sweep == "kernel" for v in p.variants)}
        assert shapes == {(d, 4096, c) for d in (64, 128) for c in (False, True)}
    for problem in bench.attention_problems("smoke"):
        forced = {v.variant: v for v in problem.variants if v.sweep == "kernel"}
        assert set(forced) == {"gluon", "tl"}
        assert all(v.impl == "triton_fused" for v in forced.values())
        q, k, v = problem.make_inputs(DEVICE)
        out = forced["tl"].fn(q, k, v)
        assert rel_err(out, ref64(q, k, v, problem.shape["causal"])) <= problem.tolerance
        if not at._gluon.applies(q, k, v, problem.shape["causal"]):
            with pytest.raises(ValueError) as refused:
                forced["gluon"].fn(q, k, v)
            assert classify(refused.value) == "unsupported"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real tuning")
def test_a_problem_under_tma_from_flops_is_not_tuned(device, monkeypatch):
    """Below TMA_FROM_FLOPS (a few us of work: configs differ by less than a launch's host
    time) the GPU's default path takes default_config without timing a candidate."""
    def never(fn):
        raise AssertionError("a small problem was tuned")

    for name, value in (("interpreting", lambda: False), ("TMA_FROM_FLOPS", 2**32)):
        monkeypatch.setattr(atp, name, value)
    for name, value in (("_bench", never), ("_TUNED", {}), ("_PLANS", {}), ("_TUNED_PLANS", {})):
        monkeypatch.setattr(at, name, value)
    q, k, v = qkv((1, 2, 100, 64), torch.float16, device)
    for causal in (False, True):
        assert rel_err(kernels.attention(q, k, v, causal=causal), ref64(q, k, v, causal)) <= \
            FUSED_TOL[torch.float16]
    assert at._TUNED == {}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real tuning")
def test_tuning_may_pick_the_warp_specialised_kernel(device, monkeypatch):
    """Where _attn_fwd_ws applies it is one more candidate of the tuning; chosen (here by a
    timing that makes it the fastest), the first call and the steady path after it run it."""
    runs, ws_runs = [], []
    launch_ws = at._launch_ws

    def counted(*a):
        ws_runs.append(1)
        return launch_ws(*a)

    def ws_fastest(fn):
        before = len(ws_runs)
        fn()
        runs.append(1)
        return 0.5 if len(ws_runs) > before else 1.0

    for name, value in (("interpreting", lambda: False),
                        ("_ws_applies", lambda q, k, v, causal, strided: not causal)):
        monkeypatch.setattr(atp, name, value)
    for name, value in (("_bench", ws_fastest), ("_TUNED", {}), ("_PLANS", {}),
                        ("_TUNED_PLANS", {}), ("_launch_ws", counted)):
        monkeypatch.setattr(at, name, value)
    q, k, v = qkv((1, 2, 128, 128), torch.float16, device)
    out = kernels.attention(q, k, v)
    # six CONFIGS and WS_CONFIG, each timed in every round
    assert list(at._TUNED.values()) == [atp.WS_CONFIG] and len(runs) == 7 * _plans.TUNING_ROUNDS
    assert rel_err(out, ref64(q, k, v)) <= FUSED_TOL[torch.float16]
    out2 = kernels.attention(q, k * 0.5, v)  # the steady path, same layout
    assert len(at._TUNED_PLANS) == 1 and rel_err(out2, ref64(q, k * 0.5, v)) <= FUSED_TOL[torch.float16]
