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
