import pytest
import torch

from triton_fusion_report import kernels
from triton_fusion_report.kernels.families import add_mul as ew

from conftest import TOL, fast_cases, full, rel_err

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# length 1, odd, a power of two and one past it, several blocks
LENGTHS = [1, 7, 1000, 4096, 4097, 3 * 2048 + 5]


def ref64(x, y, z):
    z64 = z.double() if isinstance(z, torch.Tensor) else z
    return (x.double() + y.double()) * z64


@fast_cases()
@pytest.mark.parametrize("impl", [ew.triton_fused, ew.triton_unfused, kernels.add_mul])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("z_kind", ["tensor", "scalar"])
def test_matches_float64(impl, dtype, n, z_kind, device):
    x = torch.randn(n, device=device, dtype=dtype)
    y = torch.randn(n, device=device, dtype=dtype)
    z = torch.randn(n, device=device, dtype=dtype) if z_kind == "tensor" else -1.75
    out = impl(x, y, z)
    assert out.shape == x.shape and out.dtype == dtype
    assert rel_err(out, ref64(x, y, z)) <= 2 * TOL[dtype]


@pytest.mark.parametrize("block", full(16, 128, 1024, 4096))
def test_block_sizes(block, device):
    x, y, z = (torch.randn(5003, device=device) for _ in range(3))
    for impl in (ew.triton_fused, ew.triton_unfused):
        assert rel_err(impl(x, y, z, block=block), ref64(x, y, z)) <= TOL[torch.float32]


# One of each z layout: one element, periodic (a row), expanded first (a column).
@pytest.mark.parametrize("z_shape", [(), (33,), (5, 1), *full((1,), (1, 1), (1, 33), (5, 33))])
def test_broadcast_z(z_shape, device):
    x = torch.randn(5, 33, device=device)
    y = torch.randn(5, 33, device=device)
    z = torch.randn(z_shape, device=device)
    for impl in (ew.triton_fused, ew.triton_unfused):
        out = impl(x, y, z)
        assert out.shape == x.shape
        assert rel_err(out, ref64(x, y, z)) <= TOL[torch.float32]


def test_nd_and_empty(device):
    x = torch.randn(3, 4, 5, device=device)
    y = torch.randn(3, 4, 5, device=device)
    assert rel_err(kernels.add_mul(x, y, 2), ref64(x, y, 2)) <= TOL[torch.float32]
    e = torch.empty(0, 3, device=device)
    assert kernels.add_mul(e, e, 1.0).shape == (0, 3)


def test_int_scalar_and_special_values(device):
    x = torch.tensor([1.0, float("inf"), -2.0, 0.5], device=device)
    y = torch.tensor([2.0, 1.0, float("-inf"), 0.25], device=device)
    out = kernels.add_mul(x, y, 3)
    assert torch.equal(out.cpu(), torch.tensor([9.0, float("inf"), float("-inf"), 2.25]))


def test_half_precision_is_rounded_once(device):
    """Fused math runs in float32 and rounds once: never worse than eager's two roundings."""
    x = torch.randn(4096, device=device, dtype=torch.float16) * 100
    y = torch.randn(4096, device=device, dtype=torch.float16)
    z = torch.randn(4096, device=device, dtype=torch.float16)
    ref = ref64(x, y, z)
    assert rel_err(kernels.add_mul(x, y, z), ref) <= rel_err(ew.reference(x, y, z), ref)


@pytest.mark.parametrize(
    "args, exc, words",
    [
        (lambda d: ([1.0], torch.ones(3, device=d), 1.0), TypeError, "x must be a torch.Tensor"),
        (lambda d: (torch.ones(3, device=d, dtype=torch.int32),) * 2 + (1.0,), TypeError, "int32"),
        (lambda d: (torch.ones(3, device=d), torch.ones(3, device=d, dtype=torch.float16), 1.0),
         TypeError, "float16"),
        (lambda d: (torch.ones(3, device=d), torch.ones(4, device=d), 1.0), ValueError, "same shape"),
        (lambda d: (torch.ones(3, device=d), torch.ones(3, device=d), torch.ones(4, device=d)),
         ValueError, "does not broadcast"),
        (lambda d: (torch.ones(3, device=d), torch.ones(3, device=d),
                    torch.ones(3, device=d, dtype=torch.float64)), TypeError, "float64"),
        (lambda d: (torch.ones(3, device=d), torch.ones(3, device=d), "2"), TypeError, "str"),
        (lambda d: (torch.ones(3, device=d), torch.ones(3, device=d), True), TypeError, "bool"),
        (lambda d: (torch.ones(4, 4, device=d).t(), torch.ones(4, 4, device=d), 1.0),
         ValueError, "not contiguous"),
    ],
)
def test_bad_inputs_raise(args, exc, words, device):
    with pytest.raises(exc, match=words):
        kernels.add_mul(*args(device))


def test_bad_block_raises(device):
    x = torch.ones(8, device=device)
    with pytest.raises(ValueError, match="power of two"):
        ew.triton_fused(x, x, 1.0, block=100)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU for a second device")
def test_device_mismatch_raises():
    with pytest.raises(ValueError, match="is on"):
        kernels.add_mul(torch.ones(3, device="cuda"), torch.ones(3, device="cuda"),
                        torch.ones(3))
