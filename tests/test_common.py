"""The checks, allocation, device facts and launch settings every family shares (kernels/_checks.py,
_buffers.py, _device.py, _plans.py)."""
import pytest
import torch

from triton_fusion_report import kernels
from triton_fusion_report.kernels import _buffers, _checks, _device, _plans


@pytest.mark.parametrize("value", [0, 8, 17, 100, 16.0, True, "32", None])
def test_check_pow2_refuses_what_is_not_a_power_of_two_over_the_minimum(value):
    with pytest.raises(ValueError, match="blk must be a power of two >= 16"):
        _checks.check_pow2("blk", value)


def test_check_pow2_takes_powers_of_two_and_says_why():
    assert _checks.check_pow2("blk", 16) == 16 and _checks.check_pow2("g", 1, lo=1) == 1
    with pytest.raises(ValueError, match=r">= 16 \(why\), got 8"):
        _checks.check_pow2("blk", 8, why=" (why)")


@pytest.mark.parametrize("value", [0, 3, 64, -2, 4.0, False])
def test_check_warps(value):
    with pytest.raises(ValueError, match="num_warps must be a power of two from 1 to 32"):
        _checks.check_warps(value)
    assert _checks.check_warps(8) == 8


def test_sm_count_is_the_devices_or_the_named_stand_in(device):
    if device.type == "cuda":
        expected = torch.cuda.get_device_properties(device).multi_processor_count
        assert _device.sm_count_of(device) == expected
    assert _device.sm_count_of(None) == _device.sm_count_of("cpu") == _device.INTERPRETER_SM_COUNT


def test_no_module_carries_an_ops_name():
    """`kernels.softmax` is the op; a module of that name would be shadowed by it."""
    import importlib.util

    from triton_fusion_report import kernels

    ops = [name for name in kernels.__all__ if callable(getattr(kernels, name))]
    for name in ops:
        spec = importlib.util.find_spec(f"triton_fusion_report.kernels.{name}")
        assert spec is None, f"kernels/{name}.py shadows the op"


def test_scratch_is_reused_per_shape_and_poisoned_when_asked(device):
    t, views = _buffers.scratch((2, 3, 5), torch.float32, device)
    again, views_again = _buffers.scratch((2, 3, 5), torch.float32, device)
    assert again is t and views_again is views and len(views) == 2
    assert views[1].data_ptr() == t.data_ptr() + 15 * 4
    other, _ = _buffers.scratch((2, 3, 6), torch.float32, device)
    assert other.data_ptr() != t.data_ptr()
    with _buffers.poisoned_outputs():
        t.zero_()
        assert torch.isnan(_buffers.scratch((2, 3, 5), torch.float32, device)[0]).all()


def test_layer_norm_backward_twice_with_a_reused_scratch(device):
    """The partial sums live in a scratch buffer kept across calls: a second backward of the same
    shape on other data must not see the first one's partials."""
    from triton_fusion_report.kernels.families import layer_norm as ln
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


def test_fastest_keeps_the_choice_on_disk_like_tritons_autotuner(tmp_path, monkeypatch):
    """With TRITON_CACHE_AUTOTUNING=1 a choice timed by one process is taken by the next without
    timing; other candidates or another key time again; an unreadable file is timed again; a
    candidate that does not compile is skipped; without the knob nothing is written."""
    import triton
    from triton import knobs

    from triton_fusion_report.kernels.families.attention import forward as flash_attention

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(knobs.autotuning, "cache", True)
    kernels, cpu = (flash_attention._attn_fwd,), torch.device("cpu")
    ms = {(64, 32): 2.0, (128, 64): 1.0, (32, 32): 3.0}
    timed = []

    def time_ms(c):
        timed.append(c)
        if c == (32, 32):
            raise triton.runtime.errors.OutOfResources(1, 0, "shared memory")
        if c == (16, 16):
            raise RuntimeError("PassManager::run failed")
        if c == (8, 8):
            raise RuntimeError("an illegal memory access")
        return ms[c]

    cands = list(ms) + [(16, 16)]  # (16, 16): a pass refuses it, skipped as well
    rounds = _plans.TUNING_ROUNDS
    all3 = 4 + 2 * (rounds - 1)  # (32, 32), (16, 16) fail their first round, not timed again
    assert _plans.fastest({}, ("k", cpu), cands, time_ms, kernels, cpu) == (128, 64)
    assert len(timed) == all3
    memo = {}
    assert _plans.fastest(memo, ("k", cpu), cands, time_ms, kernels, cpu) == (128, 64)
    assert len(timed) == all3 and memo == {("k", cpu): (128, 64)}  # from disk
    assert _plans.fastest({}, ("k", cpu), cands[:1], time_ms, kernels, cpu) == (64, 32)
    assert _plans.fastest({}, ("other", cpu), cands, time_ms, kernels, cpu) == (128, 64)
    assert len(timed) == all3 + rounds + all3
    files = list(tmp_path.rglob("tuning.json"))
    assert len(files) == 3
    for f in files:
        f.write_text("{not json")
    assert _plans.fastest({}, ("k", cpu), cands, time_ms, kernels, cpu) == (128, 64)
    assert len(timed) == 3 * all3 + rounds
    monkeypatch.setattr(knobs.autotuning, "cache", False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "off"))
    assert _plans.fastest({}, ("k", cpu), cands, time_ms, kernels, cpu) == (128, 64)
    assert not (tmp_path / "off").exists()
    with pytest.raises(RuntimeError, match="no candidate compiles"):
        _plans.fastest({}, ("k", cpu), [(32, 32)], time_ms, kernels, cpu)
    with pytest.raises(RuntimeError, match="illegal memory"):  # not a compile failure: raised
        _plans.fastest({}, ("k", cpu), [(8, 8)], time_ms, kernels, cpu)


def test_fastest_takes_the_median_of_interleaved_rounds():
    """One slow or fast outlier (a clock change mid-tuning) does not decide: each candidate is
    timed in TUNING_ROUNDS interleaved rounds and the medians compared."""
    cpu = torch.device("cpu")
    from triton_fusion_report.kernels.families.attention import forward as flash_attention

    order = []
    times = {"a": iter([0.5, 2.0, 2.0]), "b": iter([1.0, 1.0, 1.0])}  # a's first run an outlier

    def time_ms(c):
        order.append(c)
        return next(times[c])

    assert _plans.TUNING_ROUNDS == 3
    assert _plans.fastest({}, ("m", cpu), ["a", "b"], time_ms, (flash_attention._attn_fwd,), cpu) == "b"
    assert order == ["a", "b"] * 3


def test_kernels_refuse_cpu_tensors_a_test_did_not_build_on_its_device():
    """conftest's guard: a test without the `device` fixture that hands a kernel CPU tensors sees
    them refused, under the interpreter as on a GPU (so such a test cannot pass only in CI)."""
    with pytest.raises(ValueError, match="is on the CPU"):
        kernels.softmax(torch.randn(2, 8))
