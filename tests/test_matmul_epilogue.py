import pytest
import torch
import torch.nn.functional as F

from triton_fusion_report import kernels
from triton_fusion_report.kernels import _buffers, _device, _launch
from triton_fusion_report.kernels.families import linear_act as la
from triton_fusion_report.kernels import _matmul as mc
from triton_fusion_report.kernels.families import matmul_softmax as sr
from triton_fusion_report.kernels import _stored_softmax as stored_softmax

from conftest import FULL, fast_cases, full, rel_err

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# max |out - ref| / max |ref| against float64, by dtype (float32: by dot precision). The
# interpreter truncates float32 to bfloat16 (up to 2**-7 = 7.8e-3 off); a GPU rounds to nearest.
TOL = {"ieee": 1e-5, "tf32": 3e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}
# The seed's sizes scaled down for the interpreter, plus odd and degenerate ones: (B, K, C).
MS_SHAPES = [(64, 128, 10), (33, 70, 50), (1, 1, 1), (7, 3, 17), (5, 40, 300)]
FUSED_METHODS = ["simple", "tiled", "online", "two_pass_store", "store_softmax", "split_k"]
# The methods that round the logits to the input dtype in memory (as eager does).
STORED = ("unfused", "two_pass_store", "store_softmax")


def tol(dtype, precision="ieee", stored=False):
    """stored: the path rounds an intermediate (the pre-activation) to a half dtype, a second
    rounding, as PyTorch eager does."""
    if dtype == torch.float32:
        return TOL[precision]
    return TOL[dtype] * (2 if stored else 1)


def ms_inputs(B, K, C, dtype, device, bias=True, scale=1.0):
    # Logits of order one (softmax regression's regime): x / sqrt(K), weights and bias halved.
    x = (torch.randn(B, K, device=device) * (scale / max(K, 1) ** 0.5)).to(dtype)
    w = (torch.randn(K, C, device=device) * 0.5).to(dtype)
    b = (torch.randn(C, device=device) * 0.5).to(dtype) if bias else None
    return x, w, b


def ms_ref64(x, w, b):
    logits = x.double() @ w.double()
    if b is not None:
        logits = logits + b.double()
    return torch.softmax(logits, -1)


def check_probs(out, x, w, b, limit, stored=False):
    """stored: the logits went through memory in x's dtype (as in eager). Rounding a logit s
    moves its probability by up to eps * |s| relatively, which adds to the limit."""
    B, C = x.shape[0], w.shape[1]
    assert out.shape == (B, C) and out.dtype == x.dtype
    ref = ms_ref64(x, w, b)
    if stored and x.dtype != torch.float32 and out.numel():
        logits = x.double() @ w.double() + (0 if b is None else b.double())
        limit += torch.finfo(x.dtype).eps * logits.abs().max().item()
    assert rel_err(out, ref) <= limit
    if B and C:
        # Every row is a distribution.
        assert (out.double().sum(-1) - 1).abs().max().item() <= max(limit, 1e-5) * 2


# --------------------------------------------------------------------------- matmul + softmax


@fast_cases()
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", MS_SHAPES)
@pytest.mark.parametrize("method", FUSED_METHODS + ["auto", "unfused", "public"])
def test_matmul_softmax_matches_float64(method, shape, dtype, device):
    x, w, b = ms_inputs(*shape, dtype, device)
    if method == "unfused":
        out = sr.triton_unfused(x, w, b)
    elif method == "public":
        out = kernels.matmul_softmax(x, w, b)
    elif method in ("online", "two_pass_store"):
        # Small class tiles: C = 300 spans five tiles to combine.
        out = sr.triton_fused(x, w, b, method=method, block_c=64)
    else:
        out = sr.triton_fused(x, w, b, method=None if method == "auto" else method)
    check_probs(out, x, w, b, tol(dtype), stored=method in STORED)


@fast_cases(lambda method: method == "online")
@pytest.mark.parametrize("method", FUSED_METHODS + ["unfused"])
def test_matmul_softmax_without_bias(method, device):
    x, w, _ = ms_inputs(33, 70, 50, torch.float32, device)
    if method == "unfused":
        out = sr.triton_unfused(x, w)
    else:
        out = sr.triton_fused(x, w, None, method=method)
    check_probs(out, x, w, None, TOL["ieee"])


@fast_cases(lambda method, dtype: (method, dtype) == ("online", torch.float32))
@pytest.mark.parametrize("method", ["online", "two_pass_store"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_softmax_multi_tile_blocks(method, dtype, device):
    """Several row blocks (partial last), class tiles and K steps (K not a multiple of block_k)."""
    x, w, b = ms_inputs(37, 70, 300, dtype, device)
    out = sr.triton_fused(x, w, b, method=method, block_b=16, block_c=32, block_k=16)
    check_probs(out, x, w, b, tol(dtype), stored=method == "two_pass_store")


@pytest.mark.parametrize("method", [*full("online"), "two_pass_store"])
def test_matmul_softmax_many_class_tiles(method, device):
    """More than 128 class tiles: the combine kernel loops over them."""
    x, w, b = ms_inputs(3, 5, 2100, torch.float32, device)
    out = sr.triton_fused(x, w, b, method=method, block_c=16)
    check_probs(out, x, w, b, TOL["ieee"])


@fast_cases(lambda method: method == "two_pass_store")
@pytest.mark.parametrize("method", FUSED_METHODS)
def test_matmul_softmax_masked_class_tile(method, device):
    """Whole class tiles of -inf logits (a -inf bias masking classes; float16 logits that round
    to -inf in two_pass_store's stored logits) give 0 there and finite rows, as torch does: the
    multi-tile methods' per-tile partials were -inf - -inf = NaN."""
    x, w, b = ms_inputs(5, 16, 40, torch.float16, device)
    b[:20] = float("-inf")  # class tile 0 of 16 (and part of tile 1)
    kw = dict(block_c=16) if method in ("online", "two_pass_store") else {}
    out = sr.triton_fused(x, w, b, method=method, **kw)
    check_probs(out, x, w, b, tol(torch.float16))
    w[:, 16:32] = -5000.0  # logits ~ -80000 * |x|: past float16's range
    x = x.abs() + 1
    out = sr.triton_fused(x, w, None, method=method, **kw)
    assert torch.isfinite(out).all() and not out[:, 16:32].any()


@FULL
def test_matmul_softmax_tiled_blocks(device):
    x, w, b = ms_inputs(50, 70, 129, torch.float16, device)
    out = sr.triton_fused(x, w, b, method="tiled", block_b=16, block_k=16, num_warps=2,
                                  num_stages=2)
    check_probs(out, x, w, b, tol(torch.float16))
    out = sr.triton_fused(x, w, b, method="simple", block_k=8)
    check_probs(out, x, w, b, tol(torch.float16))


def test_matmul_softmax_unfused_long_rows(device):
    """The unfused softmax's multi-tile (online) path, forced with a small tile."""
    x, w, b = ms_inputs(9, 20, 300, torch.float32, device)
    out = sr.triton_unfused(x, w, b, softmax_block=64, block_m=16, block_n=32,
                                    block_k=16, group_m=2)
    check_probs(out, x, w, b, TOL["ieee"])


@fast_cases(lambda method: method == "tiled")
@pytest.mark.parametrize("method", FUSED_METHODS + ["unfused"])
def test_matmul_softmax_tf32(method, device):
    x, w, b = ms_inputs(33, 70, 50, torch.float32, device)
    if method == "unfused":
        out = sr.triton_unfused(x, w, b, input_precision="tf32")
    else:
        out = sr.triton_fused(x, w, b, method=method, input_precision="tf32")
    check_probs(out, x, w, b, TOL["tf32"])


@fast_cases(lambda method: method == "two_pass_store")
@pytest.mark.parametrize("method", FUSED_METHODS + ["unfused"])
def test_matmul_softmax_strided_operands(method, device):
    """Any strides: an F.linear-layout weight passed transposed, column-major x, strided bias."""
    x_t, w_t, b2 = ms_inputs(40, 33, 24, torch.float32, device)
    x = x_t.t().contiguous().t()
    w = w_t.t().contiguous().t()
    b = torch.stack([b2, b2], 1)[:, 0]
    assert not (x.is_contiguous() or w.is_contiguous() or b.is_contiguous())
    if method == "unfused":
        out = sr.triton_unfused(x, w, b)
    else:
        out = sr.triton_fused(x, w, b, method=method, block_c=16 if method in (
            "online", "two_pass_store") else None)
    check_probs(out, x, w, b, TOL["ieee"])


@fast_cases(lambda method: method in ("split_k", "unfused"))
@pytest.mark.parametrize("method", FUSED_METHODS + ["unfused"])
def test_matmul_softmax_empty_dims(method, device):
    fused = method != "unfused"

    def run(x, w, b):
        if fused:
            return sr.triton_fused(x, w, b, method=method)
        return sr.triton_unfused(x, w, b)

    x, w, b = ms_inputs(0, 8, 5, torch.float32, device)
    assert run(x, w, b).shape == (0, 5)
    x, w, b = ms_inputs(4, 8, 0, torch.float32, device)
    assert run(x, w, b).shape == (4, 0)
    # K = 0: the logits are the bias alone.
    x, w, b = ms_inputs(4, 0, 5, torch.float32, device)
    check_probs(run(x, w, b), x, w, b, TOL["ieee"])


@fast_cases(lambda method, dtype: (method, dtype) == ("online", torch.bfloat16))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("method", ["tiled", "online"])
def test_fused_half_is_no_worse_than_eager(method, dtype, device):
    """Fused logits stay in float32; eager rounds them (and the bias sum) to the half dtype."""
    x, w, b = ms_inputs(64, 64, 200, dtype, device, scale=4.0)
    ref = ms_ref64(x, w, b)
    eager = rel_err(sr.reference(x, w, b), ref)
    fused = rel_err(sr.triton_fused(x, w, b, method=method, block_c=64
                                            if method == "online" else None), ref)
    assert fused <= eager


@pytest.mark.parametrize("dtype", [torch.float32, *full(torch.float16, torch.bfloat16)])
def test_matmul_softmax_split_k(dtype, device, monkeypatch):
    """split_k: two K slices, the second shorter and ending in a partial K tile (K = 300: 10 tiles
    of 32, slices of 160 and 140), x transposed (K strided), a strided bias, several class tiles
    (C = 300 by 128); poisoned outputs."""
    monkeypatch.setattr(_device, "SM_COUNT_OVERRIDE", 2)
    monkeypatch.setattr(sr, "empty", lambda shape, dt, dev: torch.full(shape, float("nan"),
                                                                      dtype=dt, device=dev))
    B, K, C = 20, 300, 300
    x, w, _ = ms_inputs(B, K, C, dtype, device)
    x = x.t().contiguous().t()
    b = (torch.randn(2 * C, device=device) * 0.5).to(dtype)[::2]
    plan = sr.matmul_softmax_plan(B, K, C, dtype, method="split_k", block_c=128, block_k=32,
                                  sm_count=2)
    assert plan.splits == 2  # two programs per SM over 3 class tiles: 2 slices of >= 4 K tiles
    out = sr.triton_fused(x, w, b, method="split_k", block_c=128, block_k=32)
    check_probs(out, x, w, b, TOL["ieee" if dtype == torch.float32 else dtype])


def test_matmul_softmax_split_k_plan():
    plan = sr.matmul_softmax_plan
    # Few row blocks and a long K: ~2 programs an SM; each slice >= 4 K tiles; none empty.
    p = plan(512, 4096, 200, torch.float16, method="split_k", sm_count=132)
    assert (p.block_b, p.block_c, p.block_k) == (64, 128, 64) and p.splits == 16
    assert plan(65536, 1024, 100, torch.float16, method="split_k", sm_count=132).splits == 1
    assert plan(64, 100, 10, torch.float32, method="split_k", sm_count=132).splits == 1
    for K in (65, 1000, 4097):
        p = plan(16, K, 16, torch.float32, method="split_k", sm_count=132)
        k_tiles = -(-K // p.block_k)
        assert p.splits >= 1 and (p.splits - 1) * -(-k_tiles // p.splits) < k_tiles

    # method=None: split_k where the method it would take leaves over half the SMs idle and K
    # is long (the shapes measured on the H100), not at a short K, with explicit tiles, with
    # many rows, or for a problem small enough for "simple".
    assert plan(512, 4096, 200, torch.float16, sm_count=132).method == "split_k"
    assert plan(1024, 1024, 100, torch.float32, sm_count=132).method == "split_k"
    assert plan(2048, 256, 1000, torch.float16, sm_count=132).method == "store_softmax"
    assert plan(512, 4096, 200, torch.float16, block_b=32, sm_count=132).method == "tiled"
    assert plan(512, 4096, 200, torch.float16, num_warps=4, sm_count=132).method == "tiled"
    assert plan(16384, 4096, 4096, torch.float16, sm_count=132).method == "store_softmax"
    assert plan(16, 1024, 16, torch.float32, sm_count=132).method == "simple"
    assert plan(512, 4096, 200, torch.float16, sm_count=8).method == "tiled"
    # Many rows (or classes) in few large tiles: split_k would take fewer than 4 K slices.
    assert plan(8192, 1024, 256, torch.float16, sm_count=132).method == "tiled"
    assert plan(1024, 1024, 2048, torch.float16, sm_count=132).method == "store_softmax"


def test_matmul_softmax_default_split_k_matches_float64(device, monkeypatch):
    """The default plan's split_k (few rows, a long K, more work than "simple" takes), poisoned
    outputs."""
    monkeypatch.setattr(sr, "empty", lambda shape, dt, dev: torch.full(shape, float("nan"),
                                                                      dtype=dt, device=dev))
    B, K, C = 48, 1100, 330
    assert sr.matmul_softmax_plan(B, K, C, torch.float32, sm_count=132).method == "split_k"
    monkeypatch.setattr(_device, "SM_COUNT_OVERRIDE", 132)
    x, w, b = ms_inputs(B, K, C, torch.float32, device)
    check_probs(sr.triton_fused(x, w, b), x, w, b, TOL["ieee"])


def test_matmul_softmax_plan_defaults():
    plan = sr.matmul_softmax_plan
    assert plan(65536, 256, 512, torch.float16).method == "tiled"
    assert plan(256, 512, 50, torch.float16).method == "simple"  # small: one launch, no staging
    assert plan(1024, 1024, 100, torch.float32, method=None, block_b=16).method == "tiled"
    assert plan(256, 512, 50, torch.float16, block_b=32).method == "tiled"  # block_b: not simple
    assert plan(4096, 128, 32000, torch.float16).method == "online"
    # Rows the softmax holds in one tile: the plain matmul, then the softmax in place; wider
    # ones: the matmul's epilogue keeps the row partials (two_pass_store).
    assert plan(16384, 1024, 32000, torch.float16).method == "two_pass_store"
    assert plan(16384, 4096, 4096, torch.float16).method == "store_softmax"
    assert plan(4096, 1024, 16384, torch.float16).method == "store_softmax"
    assert plan(4096, 1024, 16385, torch.float16).method == "two_pass_store"
    assert plan(1024, 128, 4096, torch.float32).method == "store_softmax"  # IEEE: FMA-bound
    assert plan(1024, 128, 4096, torch.float32, input_precision="tf32").method == "online"
    p = plan(16384, 4096, 4096, torch.float16)
    assert (p.block_b, p.block_c, p.block_k, p.num_warps, p.num_stages) == (128, 256, 64, 8, 3)
    p = plan(65536, 256, 512, torch.float16)
    assert p.block_c == 512 and p.block_b * p.block_c <= 32768
    # Few row blocks: smaller ones, 8 warps in half precision; K = 256 stores the logits.
    # (tiled by name: the default takes split_k at these few-row shapes)
    p = plan(1024, 1024, 100, torch.float16, method="tiled", sm_count=132)
    assert (p.method, p.block_b, p.num_warps) == ("tiled", 32, 8)
    assert plan(1024, 1024, 100, torch.float32, method="tiled", sm_count=132).block_b == 16
    assert plan(65536, 1024, 100, torch.float16, sm_count=132).block_b == 128
    assert plan(512, 4096, 200, torch.float16, method="tiled", sm_count=132).block_b == 128
    assert plan(2048, 256, 1000, torch.float16).method == "store_softmax"
    assert plan(8, 8, 8, torch.float32, method="simple").block_c == 16
    assert plan(8, 8, 8, torch.bfloat16).precision == "tf32"  # half dtypes: the flag is moot


# --------------------------------------------------------------------------- linear + activation


def la_inputs(M, K, N, dtype, device, bias=True):
    x = torch.randn(M, K, device=device).to(dtype)
    w = (torch.randn(K, N, device=device) / max(K, 1) ** 0.5).to(dtype)
    b = torch.randn(N, device=device).to(dtype) if bias else None
    return x, w, b


def la_ref64(x, w, b, activation):
    return la.linear_act_reference(x.double(), w.double(), None if b is None else b.double(),
                                   activation)


@fast_cases(lambda impl, bias, activation, dtype: (impl, bias, activation, dtype) in (
    ("fused", True, "relu", torch.float32), ("unfused", False, "gelu", torch.float16),
    ("public", True, "gelu_tanh", torch.bfloat16)))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "none"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("impl", ["fused", "unfused", "public"])
def test_linear_act_matches_float64(impl, bias, activation, dtype, device):
    x, w, b = la_inputs(33, 70, 50, dtype, device, bias)
    if impl == "fused":
        out = la.linear_act_fused(x, w, b, activation)
    elif impl == "unfused":
        out = la.linear_act_unfused(x, w, b, activation)
    else:
        out = kernels.linear_act(x, w, b, activation=activation)
    assert out.shape == (33, 50) and out.dtype == dtype
    # float32 defaults to tf32 here (the interpreter computes it in full float32).
    limit = tol(dtype, "tf32", stored=impl == "unfused" and activation not in ("relu", "none"))
    assert rel_err(out, la_ref64(x, w, b, activation)) <= limit


@pytest.mark.parametrize("impl", [la.linear_act_fused, *full(la.linear_act_unfused)])
def test_linear_act_ieee_and_blocks(impl, device):
    """IEEE float32; several tiles in both dims, partial groups, K not a multiple of block_k."""
    x, w, b = la_inputs(70, 40, 50, torch.float32, device)
    out = impl(x, w, b, "gelu", input_precision="ieee", block_m=16, block_n=16, block_k=16,
               group_m=2, num_warps=2, num_stages=2)
    assert rel_err(out, la_ref64(x, w, b, "gelu")) <= TOL["ieee"]


@pytest.mark.parametrize("shape", [(1, 1, 1), *full((64, 128, 10), (7, 3, 17), (0, 4, 5)),
                                   (4, 0, 5)])
def test_linear_act_odd_shapes(shape, device):
    x, w, b = la_inputs(*shape, torch.float32, device)
    for impl in (la.linear_act_fused, la.linear_act_unfused):
        out = impl(x, w, b, "relu", input_precision="ieee")
        assert out.shape == (shape[0], shape[2])
        if out.numel():
            assert rel_err(out, la_ref64(x, w, b, "relu")) <= TOL["ieee"]


def test_linear_act_takes_transposed_linear_weight(device):
    lin = torch.nn.Linear(24, 40).to(device)
    x = torch.randn(9, 24, device=device)
    with torch.no_grad():
        out = kernels.linear_act(x, lin.weight.t(), lin.bias, "gelu")
        ref = F.gelu(x.double() @ lin.weight.double().t() + lin.bias.double())
    assert rel_err(out, ref) <= TOL["tf32"]


@fast_cases(lambda x_t, w_t: x_t and w_t)
@pytest.mark.parametrize("x_t, w_t", [(False, False), (True, False), (False, True), (True, True)])
def test_tf32_operands_copied_k_major(x_t, w_t, device):
    """tf32 wgmma takes K-major operands only: a K-strided x or weight is copied K-contiguous
    first (the plan says which), with the same result; 16-bit and IEEE operands never are."""
    M, K, N = 33, 40, 24
    x = torch.randn(K, M, device=device).t() if x_t else torch.randn(M, K, device=device)
    w = torch.randn(N, K, device=device).t() if w_t else torch.randn(K, N, device=device)
    b = torch.randn(N, device=device)
    how = mc.gemm_launch(x, w, b, (N, 1), "gelu", "tf32", None, None, None, None, None, None)
    assert how.copies == (x_t, not w_t)
    assert how.sizes_strides[3:7] == (K, 1, 1, K)  # the strides the kernel reads: the copies'
    for impl in (la.linear_act_fused, la.linear_act_unfused):
        assert rel_err(impl(x, w, b), la_ref64(x, w, b, "gelu")) <= TOL["tf32"]
    assert mc.gemm_launch(x, w, b, (N, 1), "gelu", "ieee", None, None, None, None, None,
                          None).copies == (False, False)
    assert mc.gemm_launch(x.half(), w.half(), b.half(), (N, 1), "gelu", "tf32", None, None,
                          None, None, None, None).copies == (False, False)
    # matmul + softmax: its fused kernels read the same way as the unfused baseline's matmul.
    for method in ("tiled", "online", "two_pass_store"):
        how = sr._fused_launch(x, w, b, method, None, None, None, "tf32", None, None)
        assert how.copies == (x_t, not w_t) and how.strides[:4] == (K, 1, 1, K)
        got = sr.triton_fused(x, w, b, method=method, input_precision="tf32")
        ref = torch.softmax(x.double() @ w.double() + b.double(), -1)
        assert rel_err(got, ref) <= TOL["tf32"]
    assert sr._fused_launch(x, w, b, "simple", None, None, None, "tf32", None,
                            None).copies == (False, False)


def _kernels_run(monkeypatch):
    """The names of the kernels the matmul families launch from now on."""
    names = []
    real = _launch.launch

    def spy(kernel, *args, **kwargs):
        names.append(getattr(kernel, "fn", kernel).__name__)
        return real(kernel, *args, **kwargs)

    for module in (mc, sr):
        monkeypatch.setattr(module, "launch", spy)
    return names


@fast_cases(lambda dtype, x_t, w_t, split, flatten: (dtype, x_t, w_t, split) in (
    (torch.float32, False, False, True), (torch.float16, True, True, False)))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_t, w_t", [(False, False), (True, True), (False, True)])
@pytest.mark.parametrize("split, flatten", [(True, False), (False, True)])
def test_tma_matmul_matches_float64(dtype, x_t, w_t, split, flatten, device, monkeypatch):
    """The persistent TMA kernel (sm_90+, and the interpreter): partial M and N tiles with
    16-byte rows, both operand layouts, several tiles per program (3 programs, 15 tiles), a partial K
    tile (K=48 with 32-deep tiles), the split store; poisoned outputs catch an unwritten tile."""
    monkeypatch.setattr(_device, "SM_COUNT_OVERRIDE", 3)
    M, K, N = 72, 48, 40
    x = torch.randn(K, M, device=device).t() if x_t else torch.randn(M, K, device=device)
    w = torch.randn(N, K, device=device).t() if w_t else torch.randn(K, N, device=device)
    x, w, b = x.to(dtype), (w / K ** 0.5).to(dtype), torch.randn(N, device=device).to(dtype)
    how = mc.gemm_launch(x, w, b, (N, 1), "gelu", "tf32", 16, 16, 32, 2, 4, 2, split, flatten)
    assert how.tma is not None and how.tma.grid == (3,)
    names = _kernels_run(monkeypatch)
    out = mc.run_gemm(x, w, b, mc.empty((M, N), dtype, x.device), how)
    assert names == ["_matmul_tma_kernel"]
    assert rel_err(out, la_ref64(x, w, b, "gelu")) <= tol(dtype, "tf32")


@fast_cases()
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("w_t", [False, True])
@pytest.mark.parametrize("method", ["online", "two_pass_store", "tiled"])
def test_tma_matmul_softmax(method, w_t, dtype, device, monkeypatch):
    """matmul+softmax's tensor-core methods through the persistent TMA kernels: several tiles
    per program, a partial class tile and (but "tiled", which takes TMA from K = 256) a partial K
    tile, both weight layouts."""
    monkeypatch.setattr(_device, "SM_COUNT_OVERRIDE", 3)
    B, K, C = (72, 256, 96) if method == "tiled" else (72, 48, 600)
    x, w, b = ms_inputs(B, K, C, dtype, device)
    if w_t:
        w = w.t().contiguous().t()
    names = _kernels_run(monkeypatch)
    blocks = dict(block_b=16) if method == "tiled" else dict(block_b=32, block_c=128)
    out = sr.triton_fused(x, w, b, method=method, block_k=32, input_precision="tf32",
                                  **blocks)
    if method == "tiled":
        assert names == ["_ms_tiled_tma_kernel"]
    else:
        assert names[0] == "_ms_pass_tma_kernel"
        assert names[-1] == ("_ms_pass_tma_kernel" if method == "online"
                             else "_ms_normalize_kernel")
    check_probs(out, x, w, b, tol(dtype, "tf32"), stored=method == "two_pass_store")


def test_tma_matmul_falls_back(device, monkeypatch):
    """Layouts TMA cannot read take _matmul_kernel: rows not a multiple of 16 bytes (the plan
    knows), a base off 16 bytes (the call's tensors: checked at each call), IEEE float32; so does
    a grid of fewer tiles than SMs (launch-bound)."""
    names = _kernels_run(monkeypatch)
    x, w, b = la_inputs(34, 64, 48, torch.float16, device)
    assert mc.gemm_launch(x, w, b, (48, 1), "relu", "tf32", *[None] * 6).tma is None  # 132 SMs
    monkeypatch.setattr(_device, "SM_COUNT_OVERRIDE", 1)
    assert mc.gemm_launch(x, w, b, (48, 1), "relu", "tf32", *[None] * 6).tma.grid == (1,)
    x, w, b = la_inputs(33, 70, 50, torch.float16, device)  # 140-byte rows
    assert mc.gemm_launch(x, w, b, (50, 1), "relu", "tf32", *[None] * 6).tma is None
    la.linear_act_fused(x, w, b, "relu")
    assert names.pop() == "_matmul_kernel"
    x, w, b = la_inputs(34, 64, 48, torch.float16, device)
    x = x[1:]  # 128-byte rows, base 128 bytes in: aligned
    la.linear_act_fused(x, w, b, "relu")
    assert names.pop() == "_matmul_tma_kernel"
    flat = torch.randn(33 * 64 + 1, device=device).half()
    x_off = flat[1:].view(33, 64)  # 2 bytes in: the same layout, an unaligned base
    out = la.linear_act_fused(x_off, w, b, "relu")
    assert names.pop() == "_matmul_kernel"
    assert rel_err(out, la_ref64(x_off, w, b, "relu")) <= TOL[torch.float16]
    huge = torch.empty(2**31, 8, device="meta", dtype=torch.float16)  # i32 shapes, coordinates
    assert mc.tma_specs(huge, w[:8], (8, 1, 48, 1), (48, 1), (128, 128, 16))[0] is None
    x32, w32, b32 = la_inputs(33, 64, 48, torch.float32, device)
    la.linear_act_fused(x32, w32, b32, "relu", input_precision="ieee")
    assert names.pop() == "_matmul_kernel"


def test_matmul_helper(device):
    x, w, b = la_inputs(20, 30, 40, torch.float16, device)
    assert rel_err(mc.matmul(x, w), x.double() @ w.double()) <= TOL[torch.float16]
    assert rel_err(mc.matmul(x, w, b, activation="relu"), la_ref64(x, w, b, "relu")) <= 1e-2


def test_gemm_config_defaults():
    cfg = mc.gemm_config(8192, 8192, 8192, torch.float16, "tf32")
    assert cfg == mc.GemmConfig(128, 256, 64, 8, 8, 3)
    assert mc.gemm_config(8192, 8192, 8192, torch.float32, "tf32")[:3] == (128, 256, 32)
    small = mc.gemm_config(512, 512, 512, torch.float16, "tf32")
    assert small.block_m * small.block_n <= 64 * 128  # shrunk to give the SMs work
    assert mc.gemm_config(5, 7, 3, torch.float16, "tf32")[:3] == (16, 16, 16)


# --------------------------------------------------------------------------- bad inputs


def _ones(*shape, dtype=torch.float32, device="cpu"):
    return torch.ones(*shape, dtype=dtype, device=device)


BAD = [
    (lambda d: ([1.0], _ones(3, 4, device=d)), {}, TypeError, "x must be a torch.Tensor"),
    (lambda d: (_ones(3, device=d), _ones(3, 4, device=d)), {}, ValueError, "x must be 2-D"),
    (lambda d: (_ones(2, 3, device=d), _ones(3, 4, 1, device=d)), {}, ValueError,
     "weight must be 2-D"),
    (lambda d: (_ones(2, 3, device=d), _ones(4, 5, device=d)), {}, ValueError,
     "weight has 4 rows"),
    (lambda d: (_ones(2, 3, device=d), _ones(3, 4, device=d), _ones(5, device=d)), {},
     ValueError, r"bias must have shape \(4,\)"),
    (lambda d: (_ones(2, 3, device=d), _ones(3, 4, device=d), _ones(1, 4, device=d)), {},
     ValueError, "bias must be 1-D"),
    (lambda d: (_ones(2, 3, device=d), _ones(3, 4, device=d, dtype=torch.float16)), {},
     TypeError, "float16"),
    (lambda d: (_ones(2, 3, device=d), _ones(3, 4, device=d),
                _ones(4, device=d, dtype=torch.bfloat16)), {}, TypeError, "bfloat16"),
    (lambda d: (_ones(2, 3, device=d, dtype=torch.int32), _ones(3, 4, device=d)), {},
     TypeError, "int32"),
    (lambda d: (_ones(2, 3, device=d), _ones(3, 4, device=d)), {"input_precision": "tf32x3"},
     ValueError, "input_precision"),
]


@pytest.mark.parametrize("args, kwargs, exc, words", BAD)
@pytest.mark.parametrize("fn", [sr.triton_fused, sr.triton_unfused,
                                la.linear_act_fused, la.linear_act_unfused])
def test_bad_inputs_raise(fn, args, kwargs, exc, words, device):
    with pytest.raises(exc, match=words):
        fn(*args(device), **kwargs)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"method": "flash"}, "method must be one of"),
        ({"method": "simple", "C": 1025}, "exceeds 1024"),
        ({"method": "tiled", "C": 600}, "exceeds 512"),
        ({"method": "online", "block_c": 100}, "block_c must be a power of two"),
        ({"method": "tiled", "block_c": 64}, "block_c does not apply"),
        ({"method": "simple", "block_b": 16}, "block_b does not apply"),
        ({"method": "tiled", "block_k": 8}, "block_k must be a power of two >= 16"),
        ({"num_warps": 3}, "num_warps must be a power of two"),
        ({"num_stages": 0}, "num_stages must be a positive int"),
    ],
)
def test_bad_matmul_softmax_options_raise(kwargs, words, device):
    kwargs = dict(kwargs)
    x, w, b = ms_inputs(2, 3, kwargs.pop("C", 8), torch.float32, device)
    with pytest.raises(ValueError, match=words):
        sr.triton_fused(x, w, b, **kwargs)


def test_bad_linear_act_options_raise(device):
    x, w, b = la_inputs(2, 3, 4, torch.float32, device)
    for fn in (kernels.linear_act, la.linear_act_unfused):
        with pytest.raises(ValueError, match="activation must be one of"):
            fn(x, w, b, "silu")
    with pytest.raises(ValueError, match="block_m must be a power of two"):
        la.linear_act_fused(x, w, b, block_m=48)
    with pytest.raises(ValueError, match="softmax_block must be a power of two"):
        sr.triton_unfused(x, w, b, softmax_block=10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU for a second device")
def test_device_mismatch_raises():
    with pytest.raises(ValueError, match="is on"):
        kernels.matmul_softmax(torch.ones(2, 3, device="cuda"), torch.ones(3, 4))


@pytest.mark.parametrize("method", ["tiled", *full("two_pass_store")])
def test_many_rows_unaligned_classes(method, device):
    """B >= 4096 with C = 10: the weight's 20-byte rows are re-laid out in a padded buffer first."""
    x, w, b = ms_inputs(4096, 16, 10, torch.float16, device)
    kw = {"block_c": 16} if method == "two_pass_store" else {}
    out = sr.triton_fused(x, w, b, method=method, **kw)
    check_probs(out, x, w, b, TOL[torch.float16], stored=method == "two_pass_store")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="the TMA kernels on a GPU with TMA (sm_90+)")
@fast_cases(lambda op, shape, kernel: op == "linear_act")
@pytest.mark.parametrize("op, shape, kernel", [
    ("linear_act", (2048, 64, 2048), "_matmul_tma_kernel"),
    ("matmul_softmax", (2048, 512, 4096), "_matmul_tma_kernel"),  # store_softmax
    ("matmul_softmax", (1024, 512, 20480), "_ms_pass_tma_kernel"),  # two_pass_store
    ("matmul_softmax", (2048, 128, 4096), "_ms_pass_tma_kernel"),  # online
    ("matmul_softmax", (17000, 256, 96), "_ms_tiled_tma_kernel")])
def test_tma_kernels_in_cuda_graphs_and_compile(op, shape, kernel, monkeypatch):
    """Natively, at sizes that take the TMA kernels (a tile per SM): captured in a CUDA graph
    and replayed on new inputs (the descriptors are encoded at capture, over the static
    tensors), and under torch.compile(fullgraph=True), each as the eager call."""
    M, K, N = shape
    fn = getattr(kernels, op)
    make = lambda: (torch.randn(M, K, device="cuda").half(),  # noqa: E731
                    (torch.randn(K, N, device="cuda") * K ** -0.5).half(),
                    torch.randn(N, device="cuda").half())
    names = _kernels_run(monkeypatch)
    static = make()
    want = fn(*static)
    assert kernel in names
    ref = (la.linear_act_reference(*(t.double() for t in static)) if op == "linear_act"
           else sr.reference(*(t.double() for t in static)))
    assert rel_err(want, ref) <= 2e-2
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(*static)
    fresh = make()
    for s, f in zip(static, fresh):
        s.copy_(f)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(captured, fn(*fresh)) <= 1e-6
    compiled = torch.compile(lambda *a: fn(*a) * 2, fullgraph=True)
    assert rel_err(compiled(*fresh), fn(*fresh) * 2) <= 1e-6


def test_store_softmax_is_the_matmul_then_the_softmax_in_place(device, monkeypatch):
    """store_softmax: _matmul's matmul writes the logits into the output, which the row
    softmax rewrites in place (no second buffer); the matmul's own tiles, so tile options are
    refused. A row wider than the softmax's one tile is read twice and still right."""
    monkeypatch.setattr(sr, "STORE_SOFTMAX_MAX_C", 64)
    for B, K, C in ((37, 70, 50), (9, 33, 300)):
        x, w, b = ms_inputs(B, K, C, torch.float16, device)
        names = _kernels_run(monkeypatch)
        monkeypatch.setattr(stored_softmax, "launch", sr.launch)  # the spy
        allocated, softmaxed = [], []
        for module in (sr, stored_softmax):
            monkeypatch.setattr(module, "empty", lambda *a: allocated.append(a) or _buffers.empty(*a))
        monkeypatch.setattr(sr, "softmax_rows", lambda t, o=None, **kw: softmaxed.append(
            (t.data_ptr(), None if o is None else o.data_ptr()))
            or stored_softmax.softmax_rows(t, o, **kw))
        out = sr.triton_fused(x, w, b, method="store_softmax")
        assert names[0].startswith("_matmul") and names[-1] == "_softmax_rows_kernel"
        assert len(allocated) == 1 and softmaxed == [(out.data_ptr(), out.data_ptr())]
        check_probs(out, x, w, b, tol(torch.float16), stored=True)
    with pytest.raises(ValueError, match="store_softmax"):
        sr.triton_fused(x, w, b, method="store_softmax", block_c=16)
