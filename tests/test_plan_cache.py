"""The public functions' checks and plans remembered per layout (kernels._plans.cached): a
remembered plan never lets an input through that the checks refuse, and gives the results of
the uncached path."""
import pytest
import torch

from triton_fusion_report import kernels
from triton_fusion_report.kernels import _device, _launch, _plans
from triton_fusion_report.kernels.families import add_mul as ew
from triton_fusion_report.kernels.families.attention import forward as fa
from triton_fusion_report.kernels.families import layer_norm as ln
from triton_fusion_report.kernels.families import linear_act as la
from triton_fusion_report.kernels.families.softmax import forward as sm
from triton_fusion_report.kernels.families import matmul_softmax as sr
from triton_fusion_report.kernels.families import softmax_matmul as sv

from conftest import full


def r(*shape, device, dtype=torch.float32):
    return torch.randn(*shape, device=device, dtype=dtype)


def test_layout_key_takes_plain_tensors_and_options_only(device):
    x = r(4, 8, device=device)
    assert _plans.layout_key((x, None), (16, "a", None)) == (x.shape, x.dtype, x.device, None, None,
                                                        16, "a", None)
    assert _plans.layout_key((x.t(),))[3] == (1, 8)  # strides where not contiguous
    assert _plans.layout_key((torch.nn.Parameter(x),)) == _plans.layout_key((x,))
    for option in (16.0, True, [16], torch.float32):
        assert _plans.layout_key((x,), (option,)) is None
    assert _plans.layout_key((3.0,)) is None

    class Sub(torch.Tensor):
        pass

    assert _plans.layout_key((x.as_subclass(Sub),)) is None


def test_cached_remembers_results_not_errors():
    cache = _plans.plan_cache()
    calls = []

    def compute(v):
        calls.append(v)
        if v < 0:
            raise ValueError("negative")
        return v * 2

    assert _plans.cached(cache, ("k", 3), compute, 3) == 6
    assert _plans.cached(cache, ("k", 3), compute, 3) == 6
    for _ in range(2):
        with pytest.raises(ValueError):
            _plans.cached(cache, ("k", -1), compute, -1)
    assert _plans.cached(cache, None, compute, 5) == 10  # no key: computed
    assert _plans.cached(cache, ([1],), compute, 7) == 14  # unhashable: computed
    assert calls == [3, -1, -1, 5, 7]


def test_sm_count_override_empties_the_caches(monkeypatch):
    cache = _plans.plan_cache()
    _plans.cached(cache, "k", lambda: 1)
    monkeypatch.setattr(_device, "SM_COUNT_OVERRIDE", 3)
    assert _plans.cached(cache, "k", lambda: 2) == 2


def test_a_remembered_plan_lets_no_refused_input_through(device):
    x = r(4, 32, device=device)
    sm.triton_fused(x)
    with pytest.raises(ValueError, match="last dim is not contiguous"):
        sm.triton_fused(r(32, 4, device=device).t())
    # Options of another kind that equal a remembered one (16.0 == 16, True == 1) are checked.
    ew.triton_fused(x, x, x, block=16)
    with pytest.raises(ValueError, match="block must be a power of two"):
        ew.triton_fused(x, x, x, block=16.0)
    sm.triton_fused(x, num_warps=1)
    with pytest.raises(ValueError, match="num_warps must be a power of two"):
        sm.triton_fused(x, num_warps=True)
    # z's type is part of add_mul's key; eps's value is checked on every call.
    kernels.add_mul(x, x, 2.0)
    with pytest.raises(TypeError, match="z must be a tensor or a real Python number"):
        kernels.add_mul(x, x, True)
    w, b = r(32, device=device), r(32, device=device)
    kernels.layer_norm(x, w, b, 1e-5)
    for eps, error in ((True, TypeError), (-1.0, ValueError), (float("nan"), ValueError)):
        with pytest.raises(error, match="eps must be"):
            kernels.layer_norm(x, w, b, eps)
    with pytest.raises(TypeError, match="bias has dtype"):
        kernels.layer_norm(x, w, b.double())
    kernels.layer_norm(x, w, b, 0)  # an int eps is fine


def _odd_strides(t):
    """t (with a leading size-1 dim) with another stride on that dim: still contiguous."""
    odd = t.as_strided(t.shape, (t.numel() * 3 + 5,) + t.stride()[1:])
    assert odd.is_contiguous() and odd.stride() != t.stride()
    return odd


@pytest.mark.parametrize("fast_launch", [True, *full(False)])
def test_cached_and_uncached_paths_agree(device, fast_launch, monkeypatch):
    """Each public function on layouts that share a key's shape (contiguous with other strides
    on a size-1 dim, strided rows, a transposed weight), twice (the second call from the
    caches), against the uncached path (caches emptied before every call)."""
    monkeypatch.setattr(_launch, "FAST_LAUNCH", fast_launch)
    base = r(1, 6, 40, device=device)
    x3 = r(3, 6, 48, device=device)
    w, b = r(40, device=device), r(40, device=device)
    xm, wm, bm = r(8, 24, device=device), r(24, 40, device=device), r(40, device=device)
    small, v5, wt = r(1, 6, 8, device=device), r(1, 8, 5, device=device), r(40, 24, device=device)
    cases = [
        lambda: kernels.softmax(base), lambda: kernels.softmax(_odd_strides(base)),
        lambda: kernels.softmax(x3[:, :, :33]),
        lambda: kernels.add_mul(base, base, w), lambda: kernels.add_mul(base, base, 0.5),
        lambda: kernels.layer_norm(_odd_strides(base), w, b),
        lambda: kernels.layer_norm(x3[:, :, :40], w, None),  # strided rows
        lambda: kernels.softmax_matmul(x3[:, :, :24], xm.expand(3, 8, 24).transpose(1, 2)),
        lambda: kernels.softmax_matmul(_odd_strides(small), v5),
        lambda: kernels.matmul_softmax(xm, wm, bm), lambda: kernels.matmul_softmax(xm, wm.t().t()),
        lambda: kernels.linear_act(xm, wt.t(), bm, "relu"),
        lambda: kernels.linear_act(xm[:, :16], wm[:16], None, "gelu_tanh"),
    ]
    h = torch.float16
    q, k, v = (r(1, 2, 40, 16, device=device, dtype=h) for _ in range(3))
    qkv = r(2, 40, 3, 4, 16, device=device, dtype=h)
    kv2 = r(2, 2, 56, 16, device=device, dtype=h)
    cases += [
        lambda: kernels.attention(q, k, v), lambda: kernels.attention(q, k, v, causal=True),
        lambda: kernels.attention(_odd_strides(q), k, v, sm_scale=-0.3),
        lambda: kernels.attention(*(qkv[:, :, i].transpose(1, 2) for i in range(3))),
        lambda: kernels.attention(qkv[:, :, 0].transpose(1, 2), kv2, kv2, causal=True),
        lambda: fa.triton_fused(q, k, v, return_lse=True)[1],
    ]
    caches = [ew._PLANS, sm._PLANS, ln._PLANS, sv._PLANS, la._PLANS, sr._PLANS, fa._PLANS,
              fa._TUNED_PLANS]
    for case in cases:
        for cache in caches:
            cache.clear()
        uncached = case()
        assert torch.equal(case(), uncached) and torch.equal(case(), uncached)


def test_layer_norm_backward_from_the_cache(device):
    x, w, b = r(6, 40, device=device), r(40, device=device), r(40, device=device)
    dy = r(6, 40, device=device)

    def grads():
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        return torch.autograd.grad(kernels.layer_norm(*leaves), leaves, dy)

    ln._PLANS.clear()
    from triton_fusion_report.kernels.families.layer_norm import backward as lnb

    lnb._PLANS.clear()
    first = grads()
    for got in (grads(), grads()):
        assert all(torch.equal(g, f) for g, f in zip(got, first))
    with pytest.raises(RuntimeError):  # dy must hold x's rows, remembered plan or not
        lnb.backward(r(5, 40, device=device), x, w, torch.zeros(2, 6, device=device), True,
                     True, None, None, None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA events time a GPU")
def test_tuner_timing_allocates_no_flush_buffer():
    """The tuners' timer runs the candidate back to back, with no L2 flush buffer (do_bench's
    256 MB made a tuned op's first call at a new shape allocate it)."""
    from triton_fusion_report.kernels._timer import time_ms

    x = torch.randn(1024, device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    assert time_ms(lambda: x.mul_(1.0), warmup_ms=1, rep_ms=2) > 0
    assert torch.cuda.max_memory_allocated() - before < 2**20
