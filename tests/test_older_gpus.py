"""What runs on GPUs older or smaller than the H100 the plans are tuned on: without TMA (before
Hopper: the attention forward's plain-load path, see test_attention.test_without_tma) and with less
shared memory a block (an A100's 164 KB, a consumer card's 99): `launch` takes one pipeline stage
off at a time until a kernel fits. On a GPU the whole profile of a consumer card is forced
(NO_TMA, MAX_SHARED) and every op checked against float64 at shapes whose H100 plans pipeline
deepest."""
import pytest
import torch
import triton

from triton_fusion_report import kernels
from triton_fusion_report.kernels import _device, _launch
from triton_fusion_report.kernels.families.attention import forward as flash_attention
from triton_fusion_report.kernels.families import softmax_matmul as softmax_v

from conftest import FULL, TOL, rel_err

CONSUMER_CARD_SHARED = 101376  # bytes a block may use on sm_86 / sm_89 (RTX 30xx / 40xx)


class _Kernel:
    """A stand-in for a JIT kernel whose launches need `need` bytes a stage of shared memory."""

    def __init__(self, need, limit=232448, error="shared memory"):
        self.need, self.limit, self.error, self.tried = need, limit, error, []

    def __getitem__(self, grid):
        def run(*args, num_stages, **kwargs):
            self.tried.append(num_stages)
            if num_stages * self.need > self.limit:
                raise triton.runtime.errors.OutOfResources(num_stages * self.need, self.limit,
                                                           self.error)
            return "compiled"
        return run


def test_a_kernel_too_big_for_shared_memory_runs_with_fewer_stages():
    kernel = _Kernel(need=70_000)
    compiled, ran_with = _launch._fitted(kernel, (1,), (), dict(num_stages=4, BLOCK=64))
    assert compiled == "compiled" and ran_with == dict(num_stages=3, BLOCK=64)
    assert kernel.tried == [4, 3]


@pytest.mark.parametrize("kernel, stages", [
    (_Kernel(need=300_000), 1),  # not even one stage fits: the error stands
    (_Kernel(need=70_000, error="registers"), 4),  # not a shared-memory shortage
])
def test_what_fewer_stages_cannot_fix_still_raises(kernel, stages):
    with pytest.raises(triton.runtime.errors.OutOfResources):
        _launch._fitted(kernel, (1,), (), dict(num_stages=stages))


@FULL
@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiles for a real GPU's shared memory")
def test_every_op_on_a_consumer_card_profile(monkeypatch):
    """NO_TMA and 99 KB of shared memory a block on this GPU: the deepest-pipelined plans (d3 =
    512 for softmax(X)@V, head_dim 128 attention, 128 x 256 matmul tiles) still run, and agree
    with float64."""
    monkeypatch.setattr(_device, "NO_TMA", True)
    monkeypatch.setattr(_device, "MAX_SHARED", CONSUMER_CARD_SHARED)
    monkeypatch.setattr(flash_attention, "_TUNED", {})
    dev = torch.device("cuda")
    torch.manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(2, 256, 512, device=dev, dtype=dtype)
        v = torch.randn(2, 512, 512, device=dev, dtype=dtype)
        assert rel_err(kernels.softmax_matmul(x, v),
                       softmax_v.reference(x.double(), v.double())) <= 3 * TOL[dtype]
        q, k, vv = (torch.randn(2, 4, 300, 128, device=dev, dtype=dtype) for _ in range(3))
        for causal in (False, True):
            want = flash_attention.reference(q.double(), k.double(), vv.double(), causal)
            assert rel_err(kernels.attention(q, k, vv, causal), want) <= 3 * TOL[dtype]
        a = torch.randn(512, 1024, device=dev, dtype=dtype)
        w = torch.randn(1024, 768, device=dev, dtype=dtype) / 32
        b = torch.randn(768, device=dev, dtype=dtype)
        want = torch.nn.functional.gelu(a.double() @ w.double() + b.double())
        assert rel_err(kernels.linear_act(a, w, b), want) <= 4 * TOL[dtype]
        want = torch.softmax(a.double() @ w.double() + b.double(), -1)
        assert rel_err(kernels.matmul_softmax(a, w, b), want) <= 4 * TOL[dtype]
        rows = torch.randn(64, 50257, device=dev, dtype=dtype)
        assert rel_err(kernels.softmax(rows), torch.softmax(rows.double(), -1)) <= 2 * TOL[dtype]
        ln = torch.randn(64, 8192, device=dev, dtype=dtype)
        want = torch.nn.functional.layer_norm(ln.double(), (8192,))
        assert rel_err(kernels.layer_norm(ln), want) <= 2 * TOL[dtype]
