"""The fused LM head + cross-entropy (kernels.linear_cross_entropy) against float64: the loss and
the gradients of x, weight and bias, over reductions, label smoothing, ignored targets, a
vocabulary that is a multiple of 8 or not (split in two matmuls), and chunks of rows."""
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from triton_fusion_report import kernels
from triton_fusion_report.kernels.families import linear_cross_entropy as lce

from conftest import FULL, full

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _inputs(n, hidden, vocab, dtype, device, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, hidden, generator=g).to(device, dtype)
    w = (torch.randn(vocab, hidden, generator=g) * hidden**-0.5 * 3).to(device, dtype)
    b = (0.1 * torch.randn(vocab, generator=g)).to(device, dtype) if bias else None
    t = torch.randint(0, vocab, (n,), generator=g).to(device)
    t[::7] = -100  # ignored
    return x, w, b, t


def _want(x, w, b, t, **kw):
    """The loss and the gradients of x, weight, bias in float64."""
    leaves = [a.double().requires_grad_() if a is not None else None for a in (x, w, b)]
    logits = leaves[0] @ leaves[1].t() + (leaves[2] if b is not None else 0)
    loss = F.cross_entropy(logits, t, **kw)
    loss.backward()
    return loss.detach(), [a.grad if a is not None else None for a in leaves]


def _rel(a, b):
    return ((a.double() - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("smoothing", [0.0, *full(0.1)])
@pytest.mark.parametrize("vocab", [300, *full(320)])  # split 296 + 4 / a multiple of 8
@pytest.mark.parametrize("bias", [True, *full(False)])
def test_loss_and_gradients_match_float64(reduction, smoothing, vocab, bias, device):
    x, w, b, t = _inputs(37, 24, vocab, torch.float32, device, bias)
    want, grads = _want(x, w, b, t, reduction=reduction, label_smoothing=smoothing)
    leaves = [a.clone().requires_grad_() if a is not None else None for a in (x, w, b)]
    loss = kernels.linear_cross_entropy(leaves[0], leaves[1], t, leaves[2], reduction=reduction,
                                        label_smoothing=smoothing)
    loss.backward()
    assert abs(loss.item() - want.item()) <= TOL[torch.float32] * abs(want.item())
    for got, ref in zip(leaves, grads):
        if ref is not None:
            assert _rel(got.grad, ref) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype, device):
    x, w, b, t = _inputs(20, 32, 130, dtype, device)
    want, grads = _want(x, w, b, t)
    leaves = [a.clone().requires_grad_() for a in (x, w, b)]
    loss = kernels.linear_cross_entropy(*leaves[:2], t, leaves[2])
    loss.backward()
    assert loss.dtype == torch.float32  # as a model's loss on float32 logits
    assert abs(loss.double().item() - want.item()) <= 2 * TOL[dtype] * abs(want.item())
    for got, ref in zip(leaves, grads):
        assert _rel(got.grad, ref) < 4 * TOL[dtype]


@pytest.mark.parametrize("chunk_rows", [1, 5, 64])
def test_chunks_give_the_same_result(chunk_rows, device):
    """The rows go through in chunks: any chunking, the same loss and gradients (to rounding)."""
    x, w, b, t = _inputs(23, 16, 77, torch.float32, device)
    want, grads = _want(x, w, b, t)
    loss, dx, dw, db = lce.triton_fused(x, w, t, b, chunk_rows=chunk_rows, block=32)
    assert abs(loss.item() - want.item()) <= TOL[torch.float32] * abs(want.item())
    for got, ref in zip((dx, dw, db), grads):
        assert _rel(got, ref) < TOL[torch.float32]


def test_without_grad_only_the_loss(device):
    x, w, b, t = _inputs(9, 16, 50, torch.float32, device)
    with torch.no_grad():
        loss = kernels.linear_cross_entropy(x, w, t, b)
    assert abs(loss.item() - _want(x, w, b, t)[0].item()) < 1e-4
    assert lce.triton_fused(x, w, t, b, with_grad=False)[1:] == (None, None, None)


def test_every_target_ignored_is_nan_as_torch(device):
    """The mean over no target: a nan loss and zero gradients, as torch's (an all-padding batch
    must not turn the weights into nan)."""
    x, w, b, t = _inputs(5, 16, 40, torch.float32, device)
    t[:] = -100
    leaves = [a.clone().requires_grad_() for a in (x, w, b)]
    loss = kernels.linear_cross_entropy(*leaves[:2], t, leaves[2])
    assert torch.isnan(loss) and torch.isnan(F.cross_entropy(x @ w.t() + b, t))
    loss.backward()
    assert all(torch.equal(a.grad, torch.zeros_like(a)) for a in leaves)


def test_no_rows_give_zero_gradients(device):
    """No token at all: no chunk runs, and dweight (written by the first chunk otherwise) is
    zeros, as torch's."""
    x, w, b, t = _inputs(5, 16, 41, torch.float32, device)
    leaves = [x[:0].clone().requires_grad_(), w.clone().requires_grad_()]
    loss = kernels.linear_cross_entropy(*leaves, t[:0], reduction="sum")
    loss.backward()
    assert loss.item() == 0 and torch.equal(leaves[1].grad, torch.zeros_like(w))


def test_a_retained_graph_backpropagates_again(device):
    """A second backward of a retained graph accumulates the same gradients again (the first
    returns the gradients made in the forward, later ones copies)."""
    x, w, b, t = _inputs(9, 16, 40, torch.float32, device)
    _, grads = _want(x, w, b, t)
    leaves = [a.clone().requires_grad_() for a in (x, w, b)]
    loss = kernels.linear_cross_entropy(*leaves[:2], t, leaves[2])
    loss.backward(retain_graph=True)
    loss.backward()
    for got, ref in zip(leaves, grads):
        assert _rel(got.grad, 2 * ref) < TOL[torch.float32]


def test_a_retained_graph_after_a_loss_gradient_backpropagates_at_another_scale(device):
    """The first backward with a loss's gradient (1) hands out the gradients made in the
    forward; a later one returns copies at its own scale: the sum of both."""
    x, w, b, t = _inputs(9, 16, 40, torch.float32, device)
    _, grads = _want(x, w, b, t)
    leaves = [a.clone().requires_grad_() for a in (x, w, b)]
    loss = kernels.linear_cross_entropy(*leaves[:2], t, leaves[2])
    loss.backward(retain_graph=True)
    (0.5 * loss).backward()
    for got, ref in zip(leaves, grads):
        assert _rel(got.grad, 1.5 * ref) < TOL[torch.float32]


@pytest.mark.parametrize("first", [2.0, 0.0])
def test_a_retained_graph_after_another_gradient_raises(first, device):
    """A first incoming gradient other than 1 scales the saved gradients in place (no host
    sync): they are that gradient's, and a second backward raises rather than guess them back
    (a float16 one may have underflowed)."""
    x, w, b, t = _inputs(9, 16, 40, torch.float32, device)
    _, grads = _want(x, w, b, t)
    x = x.clone().requires_grad_()
    loss = kernels.linear_cross_entropy(x, w, t, b)
    (first * loss).backward(retain_graph=True)
    assert _rel(x.grad, first * grads[0]) < TOL[torch.float32] if first else \
        torch.equal(x.grad, torch.zeros_like(x))
    with pytest.raises(RuntimeError, match="not 1, cannot be differentiated again"):
        loss.backward()


@FULL
def test_a_bad_target_is_a_device_side_assert_on_the_gpu():
    """On a GPU the target's range is checked on the device, as torch's cross-entropy does (a
    host check would stall the step): the process's CUDA context is lost, so in a child."""
    if not torch.cuda.is_available():
        pytest.skip("a GPU's check (on the CPU the check raises ValueError, tested above)")
    code = ("import torch; from triton_fusion_report import kernels\n"
            "x = torch.randn(8, 16, device='cuda'); w = torch.randn(40, 16, device='cuda')\n"
            "t = torch.full((8,), 1000, device='cuda')\n"
            "kernels.linear_cross_entropy(x, w, t); torch.cuda.synchronize()\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode != 0 and "outside [0, 40)" in run.stderr + run.stdout


@pytest.mark.parametrize("change, exc, words", [
    (dict(reduction="none"), ValueError, "reduction must be one of"),
    (dict(label_smoothing=1.5), ValueError, "label_smoothing"),
    (dict(target=lambda t: t.clamp(min=0) + 1000), ValueError, "outside"),
    (dict(target=lambda t: t[:-1]), ValueError, "entries for"),
    (dict(weight=lambda w: w.t()), ValueError, "as nn.Linear stores it"),
    (dict(bias=lambda b: b[:-1]), ValueError, "bias must be"),
    (dict(x=lambda x: x.double()), TypeError, "float64"),
])
def test_bad_inputs_raise(change, exc, words, device):
    if words == "outside" and device.type == "cuda":
        pytest.skip("on a GPU a device-side assert (test_a_bad_target_is_a_device_side_assert_...)")
    x, w, b, t = _inputs(8, 16, 40, torch.float32, device)
    args = dict(x=x, weight=w, target=t, bias=b, reduction="mean", label_smoothing=0.0)
    for k, v in change.items():
        args[k] = v(args[k]) if callable(v) else v
    with pytest.raises(exc, match=words):
        kernels.linear_cross_entropy(**args)


def test_a_masked_class_and_a_strided_target(device):
    """A -inf bias (a class masked out) keeps the loss finite without label smoothing, as in
    torch; a strided target and bias are read as their values."""
    x, w, b, t = _inputs(12, 16, 40, torch.float32, device)
    b[3] = float("-inf")
    t = torch.where(t == 3, 4, t)
    t2 = torch.stack([t, t], 1).reshape(-1)[::2]  # strided, the same values
    b2 = torch.stack([b, -b], 1).reshape(-1)[::2]  # and a strided bias
    want = F.cross_entropy(x @ w.t() + b, t)
    got = kernels.linear_cross_entropy(x, w, t2, b2)
    assert torch.isfinite(got) and abs(got.item() - want.item()) < 1e-4


def test_second_derivative_raises(device):
    x, w, b, t = _inputs(6, 16, 40, torch.float32, device)
    x = x.requires_grad_()
    loss = kernels.linear_cross_entropy(x, w, t, b)
    with pytest.raises(RuntimeError, match="second derivative"):
        torch.autograd.grad(loss, x, create_graph=True)


def test_float16_gradients_do_not_underflow(device):
    """The mean's 1/count is split between the row kernel (R/count, at least 1) and the matmuls'
    alpha (1/R, in float32): with many tokens, a float16 gradient is no more often zero than the
    float64 one rounded to float16."""
    x, w, b, t = _inputs(256, 32, 300, torch.float16, device)
    want, grads = _want(x, w, b, t)
    leaves = [a.clone().requires_grad_() for a in (x, w, b)]
    kernels.linear_cross_entropy(*leaves[:2], t, leaves[2]).backward()
    for got, ref in zip(leaves, grads):
        assert (got.grad == 0).sum() <= (ref.half() == 0).sum() + got.grad.numel() // 100


def test_an_incoming_gradient_scales_the_gradients(device):
    """The gradients made in the forward are returned as they are for a loss's gradient of 1 and
    scaled by any other (a loss scaled for float16 training, a weighted sum of losses)."""
    x, w, b, t = _inputs(11, 16, 40, torch.float32, device)
    _, grads = _want(x, w, b, t)
    leaves = [a.clone().requires_grad_() for a in (x, w, b)]
    (2.5 * kernels.linear_cross_entropy(*leaves[:2], t, leaves[2])).backward()
    for got, ref in zip(leaves, grads):
        assert _rel(got.grad, 2.5 * ref) < TOL[torch.float32]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("dtype", [torch.float16, *full(torch.bfloat16)])
def test_compiles_without_graph_breaks_forward_and_backward(backend, dtype, device):
    """The loss inside torch.compile(fullgraph=True) (a graph break raises; aot_eager traces its
    backward too), with ignored rows: the gradients of eager's."""
    x, w, b, t = _inputs(24, 16, 40, dtype, device)
    _, grads = _want(x, w, b, t)
    leaves = [a.clone().requires_grad_() for a in (x, w, b)]
    loss = torch.compile(kernels.linear_cross_entropy, fullgraph=True, backend=backend)
    torch._dynamo.reset()
    loss(leaves[0], leaves[1], t, leaves[2]).backward()
    for got, ref in zip(leaves, grads):
        assert _rel(got.grad, ref) < TOL[dtype]


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_captures_in_a_cuda_graph_forward_and_backward(dtype, device):
    """No host sync (CUDA's sync debug mode raises on one), so the loss and its backward capture
    in one CUDA graph; replayed on fresh targets (ignored rows, then every row ignored), the
    captured loss and gradients are eager's."""
    x, w, b, t = _inputs(96, 32, 300, dtype, device)
    leaves = [a.clone().requires_grad_() for a in (x, w, b)]

    def step():
        loss = kernels.linear_cross_entropy(leaves[0], leaves[1], t, leaves[2])
        loss.backward()
        return loss.detach()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compile and plan outside the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for a in leaves:
            a.grad = None
        step()
        torch.cuda.synchronize()
        for a in leaves:
            a.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss = step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for fresh in (torch.randint(0, 300, (96,), device=device), torch.full_like(t, -100)):
        fresh[::5] = -100
        t.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        want, grads = _want(x, w, b, t)
        if torch.isnan(want):
            assert torch.isnan(loss)
            assert all(torch.equal(a.grad, torch.zeros_like(a)) for a in leaves)
            continue
        assert abs(loss.item() - want.item()) < 1e-2 * max(1.0, abs(want.item()))
        for got, ref in zip(leaves, grads):
            assert _rel(got.grad, ref) < TOL[dtype]
