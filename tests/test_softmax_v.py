
import pytest
import torch
import torch.nn.functional as F

from triton_fusion_report import kernels

from conftest import FULL, TOL, fast_cases, full, rel_err

from triton_fusion_report.kernels.families import softmax_matmul as sm

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# float32 runs IEEE products: near its TOL. Half precision rounds p to the input dtype before the
# product with v (as FlashAttention does): a few ulps of the dtype on max|ref|.
FUSED_TOL = {torch.float32: 10 * TOL[torch.float32], torch.float16: 3 * TOL[torch.float16],
             torch.bfloat16: 3 * TOL[torch.bfloat16]}
TF32_TOL = 3e-3
# (batch, d1, d2, d3): all ones, odd sizes, several d2 chunks, a d3 past one tile
SHAPES = [(1, 1, 1, 1), (2, 17, 33, 19), (1, 64, 128, 32), (3, 5, 200, 7), (1, 20, 40, 150)]


def ref64(x, v):
    return F.softmax(x.double(), dim=-1) @ v.double()


def inputs(shape, dtype, device, scale=1.0):
    b, d1, d2, d3 = shape
    x = torch.randn(b, d1, d2, device=device, dtype=dtype) * scale
    v = torch.randn(b, d2, d3, device=device, dtype=dtype)
    return x, v


@fast_cases(lambda impl, dtype, shape: (impl, dtype, shape) in (
    (sm.triton_fused, torch.float32, SHAPES[1]), (sm.triton_unfused, torch.float16, SHAPES[3]),
    (kernels.softmax_matmul, torch.bfloat16, SHAPES[4])))
@pytest.mark.parametrize("impl", [sm.triton_fused, sm.triton_unfused, kernels.softmax_matmul])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float64(impl, dtype, shape, device):
    x, v = inputs(shape, dtype, device)
    out = impl(x, v)
    b, d1, _, d3 = shape
    assert out.shape == (b, d1, d3) and out.dtype == dtype
    assert rel_err(out, ref64(x, v)) <= FUSED_TOL[dtype]


@fast_cases(lambda block_1, block_2, block_3: block_1 == block_2 == block_3 == 16)
@pytest.mark.parametrize("block_1, block_2, block_3", [(16, 16, 16), (32, 64, 16), (16, 32, 64),
                                                       (64, 16, 32)])
def test_block_sizes(block_1, block_2, block_3, device):
    """Blocks smaller and larger than the odd dims: masking on every edge, d3 in several tiles."""
    x, v = inputs((2, 37, 70, 45), torch.float32, device)
    out = sm.triton_fused(x, v, block_1=block_1, block_2=block_2, block_3=block_3)
    assert rel_err(out, ref64(x, v)) <= FUSED_TOL[torch.float32]


@FULL
def test_unfused_block_sizes(device):
    x, v = inputs((2, 37, 70, 45), torch.float32, device)
    out = sm.triton_unfused(x, v, block_m=16, block_n=32, block_k=16)
    assert rel_err(out, ref64(x, v)) <= FUSED_TOL[torch.float32]


@pytest.mark.parametrize("dtype", [*full(torch.float32), torch.float16, *full(torch.bfloat16)])
def test_d3_tiled(dtype, device):
    """d3 = 300 with block_3 = 128: three d3 tiles, each recomputing the row softmax."""
    x, v = inputs((1, 16, 48, 300), dtype, device)
    out = sm.triton_fused(x, v, block_3=128)
    assert rel_err(out, ref64(x, v)) <= FUSED_TOL[dtype]


@fast_cases(lambda impl, dtype: (impl, dtype) == (sm.triton_fused, torch.float16))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("impl", [sm.triton_fused, sm.triton_unfused])
def test_large_scores_are_stable(impl, dtype, device):
    """Scores around 1e3 overflow exp without the running max; the max also jumps between
    d2 chunks (the largest score sits in the last chunk), exercising the rescaling."""
    x, v = inputs((2, 16, 100, 24), dtype, device, scale=1e3)
    x[:, :, -1] = 2e3
    out = impl(x, v) if impl is sm.triton_unfused else impl(x, v, block_2=16)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref64(x, v)) <= FUSED_TOL[dtype]


@pytest.mark.parametrize("impl", [sm.triton_fused, *full(sm.triton_unfused)])
def test_tf32(impl, device):
    x, v = inputs((2, 17, 65, 33), torch.float32, device)
    assert rel_err(impl(x, v, input_precision="tf32"), ref64(x, v)) <= TF32_TOL


def test_strided_inputs(device):
    """Strides go to the kernel: transposed and broadcast views need no copy."""
    x = torch.randn(2, 40, 17, device=device).transpose(1, 2)  # (2, 17, 40), d2 stride 17
    v = torch.randn(1, 19, 40, device=device).transpose(1, 2).expand(2, 40, 19)
    assert not x.is_contiguous() and not v.is_contiguous()
    for impl in (sm.triton_fused, sm.triton_unfused):
        assert rel_err(impl(x, v), ref64(x, v)) <= FUSED_TOL[torch.float32]


def _tma_calls(monkeypatch):
    """The TMA constexpr of each fused launch from now on."""
    seen = []
    real = sm.launch

    def spy(kernel, *args, **kwargs):
        seen.append(kwargs.get("TMA"))
        return real(kernel, *args, **kwargs)

    monkeypatch.setattr(sm, "launch", spy)
    return seen


@fast_cases(lambda dtype, blocks: (dtype, blocks[0]) in ((torch.float32, 16),
                                                        (torch.bfloat16, None)))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("blocks", [(16, 32, 32), (None, None, None)])
def test_tma_matches_float64(dtype, blocks, device, monkeypatch):
    """The TMA path (sm_90+, and the interpreter): 16-byte rows with a partial tile on every dim
    (d1 = 40, d2 = 200 against 32-wide chunks, d3 = 72), a batch of 2 (a descriptor's first dim),
    rows of a transposed x's storage; poisoned outputs catch an unwritten element."""
    seen = _tma_calls(monkeypatch)
    b1, b2, b3 = blocks
    x, v = inputs((2, 40, 200, 72), dtype, device, scale=4.0)
    monkeypatch.setattr(sm, "empty", lambda *a: torch.full(a[0], float("nan"), dtype=a[1],
                                                           device=a[2]))
    out = sm.triton_fused(x, v, block_1=b1, block_2=b2, block_3=b3, tma=True)
    assert rel_err(out, ref64(x, v)) <= FUSED_TOL[dtype]
    assert seen == [sm.has_tma(x.device)]


def test_tma_falls_back(device, monkeypatch):
    """Layouts TMA cannot read, or bases off 16 bytes, take the pointer path (same results);
    float32 reads through pointers unless asked."""
    seen = _tma_calls(monkeypatch)
    x, v = inputs((2, 16, 64, 24), torch.float16, device)
    odd = torch.randn(2, 16, 33, device=device, dtype=torch.float16)[..., :32]  # rows of 66 bytes
    shifted = torch.randn(2 * 16 * 64 + 1, device=device, dtype=torch.float16)[1:].view(2, 16, 64)
    broadcast = v[:1].expand(2, 64, 24)  # batch stride 0
    for a, b in ((odd, v[:, :32]), (shifted, v), (x, broadcast), (x.float(), v.float())):
        assert rel_err(sm.triton_fused(a, b), ref64(a, b)) <= FUSED_TOL[a.dtype]
    tma = sm.has_tma(x.device)
    assert seen == [False, False, False, False]
    sm.triton_fused(x, v)
    sm.triton_fused(x.float(), v.float(), tma=True)
    assert seen[4:] == [tma, tma]
    with pytest.raises(ValueError, match="tma must be"):
        sm.triton_fused(x, v, tma="yes")


def test_tma_spec_limits():
    """Strides of 2**40 bytes or more are past TMA's reach; a contiguous tensor is described by the
    strides the plan cache's key implies (a size-1 dim's stride can be anything)."""
    h = torch.float16
    big = torch.empty_strided((2, 16, 64), (2**39, 64, 1), device="meta", dtype=h)
    assert sm._tma_spec(big, (16, 16)) is None
    ok = torch.empty_strided((2, 16, 64), (2**39 - 8, 64, 1), device="meta", dtype=h)
    assert sm._tma_spec(ok, (16, 16))[1] == [2**39 - 8, 64, 1]
    one = torch.empty_strided((1, 16, 64), (2**45, 64, 1), device="meta", dtype=h)
    assert one.is_contiguous() and sm._tma_spec(one, (16, 16))[1] == [1024, 64, 1]
    odd = torch.empty_strided((2, 1, 64), (64, 1, 1), device="meta", dtype=h)  # contiguous too
    assert sm._tma_spec(odd, (16, 16))[1] == [64, 64, 1]


def test_seed_names(device):
    x, v = inputs((2, 17, 33, 19), torch.float32, device)
    assert torch.allclose(sm.softmax_mult(x, v), F.softmax(x, dim=-1) @ v)
    assert torch.equal(sm.reference(x, v), sm.softmax_mult(x, v))
    out = sm.fused_softmax(x, v, BLOCK_1=16, BLOCK_2=16)
    assert rel_err(out, ref64(x, v)) <= FUSED_TOL[torch.float32]


def test_empty_dims(device):
    x, v = inputs((2, 0, 5, 3), torch.float32, device)
    assert sm.triton_fused(x, v).shape == (2, 0, 3)
    # softmax over an empty d2 times an empty v: zeros, as in torch
    x, v = inputs((2, 3, 0, 4), torch.float32, device)
    for impl in (sm.triton_fused, sm.triton_unfused):
        assert torch.equal(impl(x, v), sm.reference(x, v))


@pytest.mark.parametrize(
    "args, exc, words",
    [
        (lambda d: (torch.ones(3, 4, device=d), torch.ones(1, 4, 2, device=d)), ValueError, "3-D"),
        (lambda d: (torch.ones(2, 3, 4, device=d), torch.ones(3, 4, 2, device=d)), ValueError,
         "batch"),
        (lambda d: (torch.ones(2, 3, 4, device=d), torch.ones(2, 5, 2, device=d)), ValueError,
         "d2"),
        (lambda d: (torch.ones(1, 3, 4, device=d), torch.ones(1, 4, 2, device=d).half()),
         TypeError, "float16"),
        (lambda d: (torch.ones(1, 3, 4, device=d, dtype=torch.int32),) * 2, TypeError, "int32"),
        (lambda d: ([[[1.0]]], torch.ones(1, 1, 1, device=d)), TypeError, "x must be a torch"),
    ],
)
def test_bad_inputs_raise(args, exc, words, device):
    with pytest.raises(exc, match=words):
        kernels.softmax_matmul(*args(device))


def test_bad_options_raise(device):
    x, v = inputs((1, 4, 4, 4), torch.float32, device)
    with pytest.raises(ValueError, match="input_precision"):
        sm.triton_fused(x, v, input_precision="bf16x3")
    with pytest.raises(ValueError, match="block_2 must be a power of two >= 16"):
        sm.triton_fused(x, v, block_2=8)
    with pytest.raises(ValueError, match="block_3 must be a power of two"):
        sm.triton_fused(x, v, block_3=48)
