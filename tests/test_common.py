"""The checks and launch settings every family shares (kernels/_common.py)."""
import pytest
import torch

from triton_fusion_report.kernels import _common as C


@pytest.mark.parametrize("value", [0, 8, 17, 100, 16.0, True, "32", None])
def test_check_pow2_refuses_what_is_not_a_power_of_two_over_the_minimum(value):
    with pytest.raises(ValueError, match="blk must be a power of two >= 16"):
        C.check_pow2("blk", value)


def test_check_pow2_takes_powers_of_two_and_says_why():
    assert C.check_pow2("blk", 16) == 16 and C.check_pow2("g", 1, lo=1) == 1
    with pytest.raises(ValueError, match=r">= 16 \(why\), got 8"):
        C.check_pow2("blk", 8, why=" (why)")


@pytest.mark.parametrize("value", [0, 3, 64, -2, 4.0, False])
def test_check_warps(value):
    with pytest.raises(ValueError, match="num_warps must be a power of two from 1 to 32"):
        C.check_warps(value)
    assert C.check_warps(8) == 8


def test_sm_count_is_the_devices_or_the_named_stand_in(device):
    if device.type == "cuda":
        expected = torch.cuda.get_device_properties(device).multi_processor_count
        assert C.sm_count_of(device) == expected
    assert C.sm_count_of(None) == C.sm_count_of("cpu") == C.INTERPRETER_SM_COUNT


def test_no_module_carries_an_ops_name():
    """`kernels.softmax` is the op; a module of that name would be shadowed by it."""
    import importlib.util

    from triton_fusion_report import kernels

    ops = [name for name in kernels.__all__ if callable(getattr(kernels, name))]
    for name in ops:
        spec = importlib.util.find_spec(f"triton_fusion_report.kernels.{name}")
        assert spec is None, f"kernels/{name}.py shadows the op"


def test_scratch_is_reused_per_shape_and_poisoned_when_asked(device):
    t, views = C.scratch((2, 3, 5), torch.float32, device)
    again, views_again = C.scratch((2, 3, 5), torch.float32, device)
    assert again is t and views_again is views and len(views) == 2
    assert views[1].data_ptr() == t.data_ptr() + 15 * 4
    other, _ = C.scratch((2, 3, 6), torch.float32, device)
    assert other.data_ptr() != t.data_ptr()
    with C.poisoned_outputs():
        t.zero_()
        assert torch.isnan(C.scratch((2, 3, 5), torch.float32, device)[0]).all()


def test_layer_norm_backward_twice_with_a_reused_scratch(device):
    """The partial sums live in a scratch buffer kept across calls: a second backward of the same
    shape on other data must not see the first one's partials."""
    from triton_fusion_report.kernels import layernorm as ln
    for seed in (0, 1):
        torch.manual_seed(seed)
        x, w, b, dy = (torch.randn(*s, device=device, dtype=torch.float32)
                       for s in ((37, 70), (70,), (70,), (37, 70)))
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        got = torch.autograd.grad(ln.triton_fused(*leaves), leaves, dy)
        ref_leaves = [t.double().requires_grad_() for t in (x, w, b)]
        ref = torch.autograd.grad(
            torch.nn.functional.layer_norm(ref_leaves[0], (70,), *ref_leaves[1:]), ref_leaves,
            dy.double())
        for g, r in zip(got, ref):
            assert torch.allclose(g.double(), r, rtol=1e-4, atol=1e-4)
