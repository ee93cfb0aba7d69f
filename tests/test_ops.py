"""The registered ops (each op's module under kernels/families/): opcheck, torch.compile without graph breaks, gradients
against float64, and the refusals (double backward)."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from triton_fusion_report import kernels
from triton_fusion_report import kernels as ops
from triton_fusion_report.kernels.families.softmax.backward import softmax_backward

from conftest import DEVICE, FULL, TOL, fast_cases, full, rel_err

# Every tensor here is built on DEVICE, the suite's device (the `device` fixture's value).
pytestmark = pytest.mark.usefixtures("device")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles afresh: several compile one lambda's code object once per op, which
    would otherwise meet Dynamo's recompile limit in a worker that ran the others first."""
    torch._dynamo.reset()

def _r(*shape, dtype=torch.float32, grad=False):
    t = torch.randn(*shape, device=DEVICE, dtype=dtype)
    return t.requires_grad_() if grad else t


def _cases():
    """(op name, public function, args for the registered op, args for the public function)."""
    x, y, z = _r(3, 40), _r(3, 40), _r(40)
    w, b = _r(40), _r(40)
    q, k, v = (_r(1, 2, 24, 16, dtype=torch.float16) for _ in range(3))
    xm, wm, bm = _r(12, 16), _r(16, 24), _r(24)
    xs, vs = _r(2, 9, 20), _r(2, 20, 16)
    wv, tv, bv = _r(30, 16), torch.randint(0, 30, (12,), device=DEVICE), _r(30)
    return [
        ("add_mul", kernels.add_mul, (x, y, z), (x, y, z)),
        ("add_mul_scalar", kernels.add_mul, (x, y, 1.5), (x, y, 1.5)),
        ("softmax", kernels.softmax, (x,), (x,)),
        ("softmax_backward", None, (torch.softmax(x, -1), y), None),
        ("layer_norm", kernels.layer_norm, (x, w, b, 1e-5), (x, w, b)),
        ("softmax_matmul", kernels.softmax_matmul, (xs, vs), (xs, vs)),
        ("attention", kernels.attention, (q, k, v, True, None), (q, k, v, True)),
        ("matmul_softmax", kernels.matmul_softmax, (xm, wm, bm), (xm, wm, bm)),
        ("linear_act", kernels.linear_act, (xm, wm, bm, "gelu"), (xm, wm, bm, "gelu")),
        ("linear_cross_entropy", kernels.linear_cross_entropy,
         (xm, wv, tv, bv, -100, "mean", 0.0), (xm, wv, tv, bv)),
    ]


CASES = {c[0]: c for c in _cases()}


def test_every_op_is_checked():
    assert set(CASES) | {"layer_norm_backward", "attention_backward", "linear_act_backward"} \
        == set(ops.OPS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_opcheck(name):
    """Schema, fake tensors, autograd registration and AOT dispatch, as torch.library checks them
    (inputs that require grad where the op is differentiable)."""
    _, _, args, _ = CASES[name]
    if name != "softmax_backward":
        args = tuple(a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor)
                     and a.is_floating_point() else a for a in args)
    torch.library.opcheck(ops.OPS[name], args)


@fast_cases(lambda need_dw, need_db: need_dw and need_db)
@pytest.mark.parametrize("need_dw, need_db", [(True, True), (True, False), (False, False)])
def test_opcheck_layer_norm_backward(need_dw, need_db):
    """Including the empty stand-ins for gradients not needed (outputs may not alias)."""
    x, w, b = _r(3, 40), _r(40), _r(40)
    _, stats = ops.OPS["layer_norm"](x, w, b, 1e-5)
    torch.library.opcheck(ops.OPS["layer_norm_backward"],
                          (_r(3, 40), x, w, b, stats, need_dw, need_db))


@pytest.mark.parametrize("need", [(True, True, True), (False, True, False)])
def test_opcheck_linear_act_backward(need):
    x, w, b = _r(12, 16), _r(16, 24), _r(24)
    torch.library.opcheck(ops.OPS["linear_act_backward"], (_r(12, 24), x, w, b, "gelu", *need))


def test_opcheck_attention_backward():
    q, k, v = (_r(1, 2, 24, 16, dtype=torch.float16) for _ in range(3))
    out, lse = ops.OPS["attention"](q, k, v, True, None)
    dout = _r(1, 2, 24, 16, dtype=torch.float16)
    torch.library.opcheck(ops.OPS["attention_backward"], (q, k, v, out, lse, dout, True, 0.25))


@FULL
def test_opcheck_attention_backward_of_transposed_views():
    """q, k, v as (batch, seq, heads, dim).transpose(1, 2), dense but not contiguous: the fake
    gradients are contiguous like the real ones (were q's strides: Inductor's stride assertion
    failed in a compiled backward)."""
    q, k, v = (_r(1, 24, 2, 16, dtype=torch.float16).transpose(1, 2) for _ in range(3))
    out, lse = ops.OPS["attention"](q, k, v, True, None)
    dout = _r(1, 2, 24, 16, dtype=torch.float16)
    torch.library.opcheck(ops.OPS["attention_backward"], (q, k, v, out, lse, dout, True, 0.25))


@pytest.mark.parametrize("name", [n for n in sorted(CASES) if CASES[n][1] is not None])
def test_compiles_without_graph_breaks(name):
    """The public function inside a compiled function (fullgraph: a graph break raises), forward
    and backward, with Dynamo's eager backend (Inductor's is checked on the GPU)."""
    _, fn, _, args = CASES[name]
    leaves = [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor)
              and a.is_floating_point() else a for a in args]

    def f(*a):
        return fn(*a) * 2

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    out = compiled(*leaves)
    want = fn(*args) * 2
    assert rel_err(out, want) <= 1e-6
    out.float().sum().backward()
    assert all(t.grad is not None for t in leaves if isinstance(t, torch.Tensor)
               and t.is_floating_point())


def test_compile_errors_keep_their_messages():
    """The fake implementation checks like eager, so a bad input fails at trace time with the
    eager message."""
    compiled = torch.compile(lambda a, b: kernels.softmax_matmul(a, b), fullgraph=True,
                             backend="eager")
    with pytest.raises(Exception, match="must equal v's dim 1"):
        compiled(_r(2, 3, 5), _r(2, 4, 6))



@pytest.mark.parametrize("backend", [*full("eager"), "aot_eager"])
def test_attention_head_dim_stays_dynamic(backend):
    """head_dim marked dynamic compiles (was specialised: the default scale, 1/sqrt(head_dim),
    took math.sqrt of the symbolic size, in the fake's checks and, under AOTAutograd, in the
    backward's setup: ConstraintViolationError here, a recompile per head_dim otherwise), and one
    graph serves two head dims, forward and backward, default scale."""
    calls = []

    def counting(gm, inputs):
        calls.append(gm)
        return gm if backend == "eager" else torch._dynamo.backends.debugging.aot_eager(gm, inputs)
    compiled = torch.compile(lambda q, k, v: kernels.attention(q, k, v, True), fullgraph=True,
                             backend=counting)
    for dim in (16, 32):
        q, k, v = (_r(2, 3, 8, dim, dtype=torch.float16, grad=True) for _ in range(3))
        for t in (q, k, v):
            torch._dynamo.mark_dynamic(t, 3)
        out = compiled(q, k, v)
        ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
        want = _ref_attention(*ref, causal=True)
        assert rel_err(out, want) <= 4 * TOL[torch.float16]
        out.float().sum().backward()
        want.sum().backward()
        for t, r in zip((q, k, v), ref):
            assert rel_err(t.grad, r.grad) <= 20 * TOL[torch.float16]
    assert len(calls) == 1

_MASKED = {  # (the public function on rows x[m], the float64 reference); z: a second input
    "softmax": (lambda x, z, m: kernels.softmax(x[m]), lambda x, z, m: torch.softmax(x[m], -1)),
    "layer_norm": (lambda x, z, m: kernels.layer_norm(x[m], z[0]),
                   lambda x, z, m: F.layer_norm(x[m], (x.shape[-1],), z[0])),
    "add_mul": (lambda x, z, m: kernels.add_mul(x[m], x[m], z[m][:, :1]),
                lambda x, z, m: (x[m] + x[m]) * z[m][:, :1]),
}


@pytest.mark.parametrize("name", sorted(_MASKED))
def test_compiles_with_data_dependent_rows(name):
    """Rows selected by a mask (x[m]: a size known only at run time) inside a fullgraph compile,
    forward and backward through AOTAutograd: the checks and the backward take such a size
    without guarding on it (raised "Could not guard on data-dependent expression"), for any
    count of rows, none and one included."""
    fn, ref = _MASKED[name]
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        for bits in ([1, 0, 1, 1, 0], [0] * 5, [0, 1, 0, 0, 0]):
            m = torch.tensor(bits, dtype=torch.bool, device=DEVICE)
            x, z = _r(5, 40, grad=True), _r(5, 40, grad=True)
            xd, zd = (t.detach().double().requires_grad_() for t in (x, z))
            out, want = compiled(x, z, m), ref(xd, zd, m)
            assert out.shape == want.shape and rel_err(out, want) <= 4 * TOL[torch.float32]
            g = torch.randn(out.shape, dtype=torch.float64, device=DEVICE)
            out.backward(g.float())
            want.backward(g)
            assert rel_err(x.grad, xd.grad) <= 20 * TOL[torch.float32]
            if zd.grad is not None:
                assert rel_err(z.grad, zd.grad) <= 20 * TOL[torch.float32]

def _grads(fn, args, dtype=None):
    leaves = [a.detach().to(dtype or a.dtype).requires_grad_() if isinstance(a, torch.Tensor)
              and a.is_floating_point() else a for a in args]
    out = fn(*leaves)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    out.backward(g.to(out.device, out.dtype))
    return [t.grad for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _ref_attention(q, k, v, causal=False):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


REFS = {
    "add_mul": lambda x, y, z: (x + y) * z,
    "add_mul_scalar": lambda x, y, z: (x + y) * z,
    "softmax": lambda x: torch.softmax(x, -1),
    "layer_norm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
    "softmax_matmul": lambda x, v: torch.softmax(x, -1) @ v,
    "attention": _ref_attention,
    "matmul_softmax": lambda x, w, b: torch.softmax(x @ w + b, -1),
    "linear_act": lambda x, w, b, a: F.gelu(x @ w + b),
}


@pytest.mark.parametrize("name", sorted(REFS))
def test_gradients_match_float64(name):
    _, fn, _, args = CASES[name]
    got = _grads(fn, args)
    want = _grads(REFS[name], args, torch.float64)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert rel_err(g, w) <= 20 * TOL[torch.float16 if name == "attention" else torch.float32]


@pytest.mark.parametrize("activation", ["none", "relu", "gelu_tanh"])
def test_linear_act_gradients(activation):
    x, w, b = _r(12, 16), _r(16, 24), _r(24)
    acts = {"none": lambda h: h, "relu": torch.relu,
            "gelu_tanh": lambda h: F.gelu(h, approximate="tanh")}
    got = _grads(lambda *a: kernels.linear_act(*a, activation), (x, w, b))
    want = _grads(lambda x, w, b: acts[activation](x @ w + b), (x, w, b), torch.float64)
    for g, ww in zip(got, want):
        assert rel_err(g, ww) <= 20 * TOL[torch.float32]


@pytest.mark.parametrize("z_shape", [(1,), (40,), (3, 1), (3, 40)])
def test_add_mul_broadcast_gradients(z_shape):
    x, y, z = _r(3, 40), _r(3, 40), _r(*z_shape)
    got = _grads(kernels.add_mul, (x, y, z))
    want = _grads(REFS["add_mul"], (x, y, z), torch.float64)
    assert got[2].shape == z.shape
    for g, w in zip(got[:2], want[:2]):
        assert rel_err(g, w) <= 4 * TOL[torch.float32]
    # z's gradient sums g (x + y) over the broadcast dims: float32's rounding scales with the
    # sum of the terms' magnitudes, which cancellation can make far larger than the sum itself.
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    magnitude = (g * (x + y).double().cpu()).abs().sum_to_size(z.shape)
    error = (got[2].double().cpu() - want[2].cpu()).abs()
    assert (error <= 4 * TOL[torch.float32] * magnitude).all()


@fast_cases(lambda n, dtype: (n, dtype) in ((1024, torch.float32), (20_000, torch.bfloat16)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 37, 1024, 20_000])
def test_softmax_backward_kernel(n, dtype):
    """One tile (rows in registers) and the two-pass loop past MAX_ONE_TILE."""
    y = torch.softmax(_r(5, n) * 3, -1).to(dtype)
    dy = _r(5, n).to(dtype)
    want = torch.ops.aten._softmax_backward_data(dy.double(), y.double(), -1, torch.float64)
    assert rel_err(softmax_backward(y, dy), want) <= 4 * TOL[dtype]


@fast_cases()
@pytest.mark.parametrize("path", ["eager", "registered_op"])
@pytest.mark.parametrize("only_term", [True, False])
def test_layer_norm_double_backward_refused(only_term, path):
    """create_graph=True, then a second derivative: refused with a message, whether LayerNorm's
    term is the only one or others carry the graph (a gradient penalty); on the eager path
    (autograd.Function) and through the registered op."""
    x, w = _r(4, 40, grad=True), _r(40, grad=True)
    if path == "eager":
        y = kernels.layer_norm(x, w).pow(2).sum()
    else:
        y = ops.OPS["layer_norm"](x, w, None, 1e-5)[0].pow(2).sum()
    if not only_term:
        y = y + (x ** 3).sum()
    (gx,) = torch.autograd.grad(y, x, create_graph=True)
    with pytest.raises(RuntimeError, match="second derivative is not implemented"):
        torch.autograd.grad(gx.sum(), (x, w))
    if not only_term:  # the other term alone reaches x: still refused, never a partial answer
        with pytest.raises(RuntimeError, match="second derivative is not implemented"):
            torch.autograd.grad(gx.sum(), x)


@pytest.mark.parametrize("path", ["eager", "registered_op"])
def test_linear_act_double_backward_refused(path):
    """create_graph=True, then a second derivative: refused with a message on the eager path
    (autograd.Function) and through the registered op."""
    x, w, b = _r(6, 16, grad=True), _r(16, 24, grad=True), _r(24, grad=True)
    f = kernels.linear_act if path == "eager" else ops.OPS["linear_act"]
    y = f(x, w, b, "gelu").pow(2).sum()
    (gx,) = torch.autograd.grad(y, x, create_graph=True)
    with pytest.raises(RuntimeError, match="second derivative is not implemented"):
        torch.autograd.grad(gx.sum(), (x, w))


@pytest.mark.parametrize("dtype", [*full(torch.float16), torch.bfloat16])
def test_layer_norm_float32_weight(dtype):
    """fp32 weight and bias with half x, as F.layer_norm takes them: y and dx in x's dtype,
    dweight and dbias in float32."""
    x, w, b = _r(6, 40).to(dtype), _r(40), _r(40)
    want = F.layer_norm(x.double(), (40,), w.double(), b.double())
    y = kernels.layer_norm(x, w, b)
    assert y.dtype == dtype and rel_err(y, want) <= TOL[dtype]
    got = _grads(kernels.layer_norm, (x, w, b))
    ref = _grads(lambda x, w, b: F.layer_norm(x, (40,), w, b), (x, w, b), torch.float64)
    assert [g.dtype for g in got] == [dtype, torch.float32, torch.float32]
    for g, r in zip(got, ref):
        assert rel_err(g, r) <= 4 * TOL[dtype]
    with pytest.raises(TypeError, match="of x's dtype or float32"):
        kernels.layer_norm(x.float(), w.to(dtype))


needs_gpu = pytest.mark.skipif(DEVICE.type != "cuda", reason="Inductor and CUDA graphs need a GPU")


@needs_gpu
@fast_cases(lambda name: name == "attention")  # Inductor compiles each afresh: minutes in all
@pytest.mark.parametrize("name", [n for n in sorted(CASES) if CASES[n][1] is not None])
def test_inductor_and_cuda_graph(name):
    """On the GPU: fullgraph compile with Inductor (forward and backward) and capture of the
    public function in a CUDA graph, both matching the eager call."""
    _, fn, _, args = CASES[name]
    want = fn(*args)
    leaves = [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor)
              and a.is_floating_point() else a for a in args]  # (the loss's targets: ints)
    compiled = torch.compile(lambda *a: fn(*a) * 2, fullgraph=True)
    out = compiled(*leaves)
    assert rel_err(out, want * 2) <= 1e-6
    out.float().sum().backward()
    assert all(t.grad is not None for t in leaves if isinstance(t, torch.Tensor)
               and t.is_floating_point())
    static = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    fn(*static)  # compile and plan outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(*static)
    fresh = [torch.randn_like(a) if isinstance(a, torch.Tensor) and a.is_floating_point()
             else a.flip(0) if isinstance(a, torch.Tensor) else a for a in args]
    for s, f in zip(static, fresh):
        if isinstance(s, torch.Tensor):
            s.copy_(f)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(captured, fn(*fresh)) <= 1e-6


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c[1] is not None])
def test_forward_mode_ad_is_refused(name):
    """A tangent on any tensor input raises (it would be dropped: no jvp formula); inputs
    without one still run inside a dual level."""
    import torch.autograd.forward_ad as fwAD

    _, public, _, args = CASES[name]
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)
               and a.is_floating_point()]
    with fwAD.dual_level():
        for i in tensors:
            dual = list(args)
            dual[i] = fwAD.make_dual(args[i], torch.randn_like(args[i]))
            with pytest.raises(NotImplementedError, match="forward-mode AD"):
                public(*dual)
        assert public(*args) is not None


class _Dispatched(TorchDispatchMode):
    """Records the triton_fusion ops that reach the dispatcher while it is active (a direct call
    or the autograd.Function's never do: they launch the kernels themselves)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "triton_fusion":
            self.ops.append(func.name().split("::")[1])
        return func(*args, **(kwargs or {}))


def _bitwise(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


def _leaves(args):
    return [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor)
            and a.is_floating_point() else a for a in args]


def _out_and_grads(fn, args, create_graph=False):
    leaves = _leaves(args)
    out = fn(*leaves)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(out)
    wrt = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
    return out, torch.autograd.grad(out, wrt, g, create_graph=create_graph)


# The ops with an autograd.Function (eager autograd without the dispatcher).
FUNCTIONS = {"softmax", "layer_norm", "attention", "linear_act"}
# The ops whose direct call (nothing to differentiate) skips the statistics a backward would read.
NO_STATISTICS = {"layer_norm"}


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c[1] is not None])
def test_every_path_gives_the_same_bits(name):
    """Each op through each path the public function can take (direct; the autograd.Function or
    the registered op's autograd, forward and backward; the registered op called itself; a
    fullgraph compile through AOTAutograd) gives the same bits, forward and gradients, and
    takes the path it should: no dispatcher on the direct call, nor on the Function's."""
    _, public, op_args, args = CASES[name]
    op = ops.OPS[name]

    def registered(*a):
        out = op(*a)
        return out[0] if isinstance(out, tuple) else out
    with torch.no_grad(), _Dispatched() as seen:
        direct = public(*args)
    assert seen.ops == []
    with torch.no_grad():
        want_out = registered(*op_args)
    if name in NO_STATISTICS:
        # Without grad LayerNorm's direct call runs the forward kernel that stores no statistics:
        # another specialisation, which a GPU's compiler may round differently in the last bit.
        assert rel_err(direct, want_out) <= TOL[torch.float32]
    else:
        _bitwise(want_out, direct)

    with _Dispatched() as seen:
        out, grads = _out_and_grads(public, args)
    assert seen.ops == ([] if name in FUNCTIONS else [name])
    _bitwise(out, want_out)
    want = _out_and_grads(registered, op_args)[1]
    for got, w in zip(grads, want, strict=True):
        _bitwise(got, w)
    if name in FUNCTIONS:  # create_graph: the Function's backward is the registered backward op
        with _Dispatched() as seen:
            graph_grads = _out_and_grads(public, args, create_graph=True)[1]
        assert seen.ops == [f"{name}_backward"]
        for got, w in zip(graph_grads, want, strict=True):
            _bitwise(got.detach(), w)

    compiled = torch.compile(lambda *a: public(*a), backend="aot_eager", fullgraph=True)
    out, grads = _out_and_grads(compiled, args)
    _bitwise(out, want_out)
    for got, w in zip(grads, want, strict=True):
        _bitwise(got, w)


def test_parameters_take_the_direct_path():
    """nn.Parameter weights (a model's) are plain tensors: without grad the implementation is
    called directly, with grad the autograd.Function runs, forward and backward; never the
    dispatcher (which `_Dispatched` sees, as it sees matmul_softmax's, which has no Function)."""
    x, w, b = _r(3, 40), torch.nn.Parameter(_r(40)), torch.nn.Parameter(_r(40))
    xm, wm, bm = _r(12, 16), torch.nn.Parameter(_r(16, 24)), torch.nn.Parameter(_r(24))
    want = F.layer_norm(x.double(), (40,), w.double(), b.double())
    with torch.no_grad(), _Dispatched() as seen:
        assert rel_err(kernels.layer_norm(x, w, b), want) <= 2 * TOL[torch.float32]
        kernels.linear_act(xm, wm, bm)
        kernels.matmul_softmax(xm, wm, bm)
    assert seen.ops == []
    with _Dispatched() as seen:
        y = kernels.layer_norm(x, w, b)
        y.backward(torch.ones_like(y))
        kernels.linear_act(xm, wm, bm).sum().backward()
    assert seen.ops == [] and w.grad is not None and b.grad is not None and bm.grad is not None
    with _Dispatched() as seen:
        kernels.matmul_softmax(xm, wm, bm)
    assert seen.ops == ["matmul_softmax"]
