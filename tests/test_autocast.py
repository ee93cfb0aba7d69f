"""The ops inside `torch.autocast` against the PyTorch ops they stand beside, inside the same
autocast: the same output dtype, values within the dtype's tolerance, gradients reaching float32
leaves in float32; every path (direct, autograd, compiled) giving the bits of the op called on the
inputs autocast would cast (kernels/_autograd.py applies the policy each op declares)."""
import pytest
import torch
import torch.nn.functional as F

from triton_fusion_report import kernels

from conftest import DEVICE, TOL, rel_err

pytestmark = pytest.mark.usefixtures("device")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles afresh (one lambda's code object per op would meet the recompile
    limit)."""
    torch._dynamo.reset()

# bfloat16 everywhere (the interpreter runs it on the CPU); float16 where CUDA's autocast runs.
DTYPES = [torch.bfloat16] + ([torch.float16] if DEVICE.type == "cuda" else [])
FLOAT32_OPS = DEVICE.type == "cuda"  # CUDA's autocast runs layer_norm and softmax in float32


def _r(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEVICE, dtype=dtype)


def _cases():
    """name: (the project's call, PyTorch's, float32 inputs (None: not differentiable), and
    half: which inputs enter as autocast's dtype (a model's activations after a matmul))."""
    t = torch.randint(0, 30, (12,), device=DEVICE)
    return {
        "add_mul": (kernels.add_mul, lambda x, y, z: (x + y) * z, (_r(3, 40), _r(3, 40), _r(40)),
                    {0}),
        "add_mul_scalar": (lambda x, y: kernels.add_mul(x, y, 1.5), lambda x, y: (x + y) * 1.5,
                           (_r(3, 40), _r(3, 40)), set()),
        "softmax": (kernels.softmax, lambda x: torch.softmax(x, -1), (_r(3, 40),), set()),
        "softmax_half": (kernels.softmax, lambda x: torch.softmax(x, -1), (_r(3, 40),), {0}),
        "layer_norm": (kernels.layer_norm, lambda x, w, b: F.layer_norm(x, (40,), w, b),
                       (_r(3, 40), _r(40), _r(40)), set()),
        "layer_norm_half": (kernels.layer_norm, lambda x, w, b: F.layer_norm(x, (40,), w, b),
                            (_r(3, 40), _r(40), _r(40)), {0}),
        "softmax_matmul": (kernels.softmax_matmul, lambda x, v: torch.softmax(x, -1) @ v,
                           (_r(2, 9, 20), _r(2, 20, 16)), set()),
        "attention": (lambda q, k, v: kernels.attention(q, k, v, True),
                      lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                      tuple(_r(1, 2, 24, 16) for _ in range(3)), set()),
        "matmul_softmax": (kernels.matmul_softmax,
                           lambda x, w, b: torch.softmax(F.linear(x, w.t(), b), -1),
                           (_r(12, 16), _r(16, 24), _r(24)), set()),
        "linear_act": (kernels.linear_act, lambda x, w, b: F.gelu(F.linear(x, w.t(), b)),
                       (_r(12, 16), _r(16, 24), _r(24)), set()),
        "linear_cross_entropy": (
            lambda x, w, b: kernels.linear_cross_entropy(x, w, t, b),
            lambda x, w, b: F.cross_entropy(F.linear(x, w, b), t),
            (_r(12, 16), _r(30, 16), _r(30)), set()),
    }


NAMES = sorted(_cases())


def _expected_dtype(name, dtype):
    """What PyTorch's op gives in an autocast region of `dtype` on this suite's device."""
    if name.startswith("add_mul") or name == "linear_cross_entropy":
        return torch.float32  # promotion to float32; the loss in float32
    if name.startswith(("softmax_half", "layer_norm")) or name == "softmax":
        if FLOAT32_OPS:
            return torch.float32
        return dtype if name.endswith("_half") else torch.float32
    if name == "matmul_softmax" and FLOAT32_OPS:
        return torch.float32
    return dtype


def _run(fn, leaves, half, dtype):
    """fn on the leaves (those in `half` cast to dtype first, as a model's activations), in an
    autocast region of dtype; the output, and the leaves' gradients of a fixed random weighting
    of it (backward outside the region, as a training step calls it)."""
    args = [a.to(dtype) if i in half else a for i, a in enumerate(leaves)]
    with torch.autocast(DEVICE.type, dtype=dtype):
        out = fn(*args)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(out)
    grads = torch.autograd.grad(out, leaves, g)
    return out, grads


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_autocast_like_pytorch(name, dtype):
    ours, theirs, inputs, half = _cases()[name]
    leaves = [a.requires_grad_() for a in inputs]
    out, grads = _run(ours, leaves, half, dtype)
    want, want_grads = _run(theirs, leaves, half, dtype)
    assert out.dtype == want.dtype == _expected_dtype(name, dtype)
    # Both round their inputs as autocast casts them; they differ in accumulation and rounding.
    assert rel_err(out, want.double()) <= 2 * TOL[dtype]
    for got, w, leaf in zip(grads, want_grads, leaves, strict=True):
        assert got.dtype == leaf.dtype == torch.float32
        assert rel_err(got, w.double()) <= 8 * TOL[dtype]


def _cast_as_autocast(name, args, dtype):
    """The inputs the op runs on in an autocast region of dtype (the policy, spelt out)."""
    if name.startswith("add_mul"):
        wide = torch.float32 if any(a.dtype == torch.float32 for a in args) else dtype
        return [a.to(wide) for a in args]
    if name.startswith(("softmax_half", "layer_norm")) or name == "softmax":
        return [a.float() for a in args] if FLOAT32_OPS else args
    return [a.to(dtype) for a in args]


@pytest.mark.parametrize("name", NAMES)
def test_every_path_casts_then_runs_the_op(name):
    """In an autocast region, the direct call (no grad), the eager autograd path and a fullgraph
    compile (the registered op's Autocast kernel) each give the bits of the op on the inputs cast
    as the policy says, outside autocast: the cast is the only change, the kernels' own PyTorch
    ops are not cast."""
    dtype = torch.bfloat16
    ours, _, inputs, half = _cases()[name]
    args = [a.to(dtype) if i in half else a for i, a in enumerate(inputs)]
    want = ours(*_cast_as_autocast(name, args, dtype))
    if name == "matmul_softmax" and FLOAT32_OPS:
        want = want.float()
    compiled = torch.compile(lambda *a: ours(*a), backend="aot_eager", fullgraph=True)
    with torch.autocast(DEVICE.type, dtype=dtype):
        with torch.no_grad():
            direct = ours(*args)
        leaves = [a.detach().clone().requires_grad_() for a in args]
        grad_path = ours(*leaves)
        traced = compiled(*[a.detach().clone().requires_grad_() for a in args])
    for got in (direct, grad_path, traced):
        assert got.dtype == want.dtype
        if name.startswith("layer_norm") and got is not direct:
            # Statistics kept for a backward: another specialisation of the forward kernel,
            # which a GPU's compiler may round differently in the last bit (test_ops.py).
            assert rel_err(got, want) <= TOL[torch.float32]
        else:
            assert torch.equal(got, want)
    grad_path.float().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == t.dtype for t in leaves)


def test_autocast_of_another_device_casts_nothing():
    """Autocast on for another device type only leaves the call as it is (as torch's ops)."""
    other = "cpu" if DEVICE.type == "cuda" else "cuda"
    x, w, b = _r(12, 16), _r(16, 24), _r(24)
    was = torch.is_autocast_enabled(other)
    torch.set_autocast_enabled(other, True)  # (a region would disable itself without a CUDA)
    try:
        out = kernels.linear_act(x, w, b)
    finally:
        torch.set_autocast_enabled(other, was)
    assert out.dtype == torch.float32 and torch.equal(out, kernels.linear_act(x, w, b))


def test_attention_still_refuses_float32_outside_autocast():
    q = _r(1, 2, 8, 16)
    with pytest.raises(TypeError, match="float32"):
        kernels.attention(q, q, q)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        assert kernels.attention(q, q, q).dtype == torch.bfloat16
