"""The row softmax that the unfused baselines of softmax(X) @ V, attention and matmul + softmax
store between their matmuls (kernels._stored_softmax)."""
import pytest
import torch

from triton_fusion_report.kernels._stored_softmax import softmax_rows

from conftest import TOL, fast_cases, full, rel_err


def ref64(x, scale=1.0, causal=False):
    s = x.double() * scale
    if causal:
        d1, d2 = s.shape[-2:]
        s = s.masked_fill(torch.ones(d1, d2, dtype=torch.bool).triu(1).to(s.device), float("-inf"))
    return torch.softmax(s, -1)


@fast_cases(lambda d2, block, dtype: (d2, block, dtype) in ((37, None, torch.float16),
                                                           (300, 64, torch.float32)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d2, block", [(1, None), (37, None), (300, 64), (300, None)])
def test_matches_float64(d2, block, dtype, device):
    """One tile (the row read once) and several (online max and sum, then a second read)."""
    x = (torch.randn(2, 5, d2, device=device) * 3).to(dtype)
    assert rel_err(softmax_rows(x, block=block), ref64(x)) <= TOL[dtype]


@pytest.mark.parametrize("block", [*full(None), 16])
def test_causal_scaled_strided(block, device):
    """A transposed view (no unit stride), a scale and the causal mask: rows past the diagonal
    are exactly zero; a negative scale is not a special case."""
    base = torch.randn(3, 40, 33, device=device)
    x = base.transpose(1, 2)  # (3, 33, 40), last stride 33
    for scale in (0.3, -1.5):
        got = softmax_rows(x, scale=scale, causal=True, block=block)
        assert rel_err(got, ref64(x, scale, causal=True)) <= TOL[torch.float32]
        assert not got.triu(1).any()


def test_two_d_into_out(device):
    """A 2-D input, written into a given (strided) output."""
    x = torch.randn(7, 100, device=device)
    out = torch.full((7, 128), 5.0, device=device)[:, :100]
    assert softmax_rows(x, out, block=32) is out
    assert rel_err(out, ref64(x)) <= TOL[torch.float32]


def test_empty(device):
    assert softmax_rows(torch.randn(2, 0, 5, device=device)).shape == (2, 0, 5)
