import pytest
import torch
import torch.nn.functional as F

from triton_fusion_report import kernels
from triton_fusion_report.kernels import _device, _plans
from triton_fusion_report.kernels.families import layer_norm as ln
from triton_fusion_report import kernels as ops
from triton_fusion_report.kernels.families.layer_norm import backward as lnb
from triton_fusion_report.kernels.families.layer_norm import forward as lnf

from conftest import TOL, fast_cases, full, rel_err

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# length 1, odd, a power of two and one past it, a multiple of a tile plus a remainder
WIDTHS = [1, 7, 256, 1025, 3 * 64 + 5]
# The unfused version stores two rounded intermediates (xhat, xhat * weight) before its output.
UNFUSED_SLACK = 4
AFFINE = ["weight+bias", "weight", "bias", "none"]


def make(shape, dtype, device, affine="weight+bias", offset=0.5, scale=2.0):
    n = shape[-1]
    x = (torch.randn(shape, device=device) * scale + offset).to(dtype)
    w = torch.randn(n, device=device).to(dtype) if "weight" in affine else None
    b = torch.randn(n, device=device).to(dtype) if "bias" in affine else None
    return x, w, b


def ref64(x, w, b, eps=1e-5):
    w, b = (None if t is None else t.double() for t in (w, b))
    return F.layer_norm(x.double(), (x.shape[-1],), w, b, eps)


def grads(fn, x, w, b, dy, dtype=None):
    """(y, dx, dw, db) of fn on leaf copies of x, w, b (cast to dtype if given)."""
    def leaf(t):
        if t is None:
            return None
        return (t if dtype is None else t.to(dtype)).clone().requires_grad_()

    x, w, b = leaf(x), leaf(w), leaf(b)
    y = fn(x, w, b)
    y.backward(dy if dtype is None else dy.to(dtype))
    return y, x.grad, None if w is None else w.grad, None if b is None else b.grad


def assert_close_grads(got, want, dtype):
    for name, g, r in zip(("y", "dx", "dweight", "dbias"), got, want):
        assert (g is None) == (r is None), name
        if g is not None:
            assert g.dtype == dtype, name
            assert rel_err(g, r) <= 2 * TOL[dtype], name


def check_one_column_dbias(got, want, dy, dtype):
    """dbias of a single column is one sum of dy over rows: it may cancel to far below its terms,
    so its error is bounded by the terms' size (sum |dy|), not by the result's own."""
    assert got.dtype == dtype
    bound = 2 * TOL[dtype] * dy.double().abs().sum().item()
    assert (got.double() - want).abs().max().item() <= bound


@fast_cases(lambda impl, dtype, n: (impl, dtype, n) in (
    (ln.triton_fused, torch.float32, 1025), (ln.triton_unfused, torch.float16, 7),
    (kernels.layer_norm, torch.bfloat16, 3 * 64 + 5)))
@pytest.mark.parametrize("impl", [ln.triton_fused, ln.triton_unfused, kernels.layer_norm])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", WIDTHS)
def test_forward_matches_float64(impl, dtype, n, device):
    x, w, b = make((5, n), dtype, device)
    out = impl(x, w, b)
    assert out.shape == x.shape and out.dtype == dtype
    slack = UNFUSED_SLACK if impl is ln.triton_unfused else 2
    assert rel_err(out, ref64(x, w, b)) <= slack * TOL[dtype]


@fast_cases(lambda impl, affine, block: (impl, affine, block) in (
    (ln.triton_fused, "bias", 16), (ln.triton_unfused, "none", None)))
@pytest.mark.parametrize("impl", [ln.triton_fused, ln.triton_unfused])
@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("block", [None, 16])
def test_forward_affine_and_tiles(impl, affine, block, device):
    """weight and/or bias None; block=16 makes the fused forward loop (two passes a row)."""
    x, w, b = make((4, 100), torch.float32, device, affine)
    out = impl(x, w, b, 1e-3, block=block)
    assert rel_err(out, ref64(x, w, b, 1e-3)) <= UNFUSED_SLACK * TOL[torch.float32]


@fast_cases(lambda dtype, n: (dtype, n) in ((torch.float32, 1), (torch.bfloat16, 1025)))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 256, 1025])
def test_backward_matches_float64(dtype, n, device):
    """dx, dweight, dbias against float64 autograd; 37 rows make several partial-sum groups (and
    at 1025 columns, several 2-row tiles a group: the prefetch of the next tile)."""
    assert ln.bwd_groups(37) > 1
    x, w, b = make((37, n), dtype, device)
    dy = torch.randn(37, n, device=device).to(dtype)
    got = grads(ln.triton_fused, x, w, b, dy)
    want = grads(ln.reference, x, w, b, dy, torch.float64)
    if n == 1:
        # One column: xhat = 0 and y = bias whatever x, so dx and dweight are exactly 0 (float64
        # autograd leaves ~1e-13 of rounding, which a relative error would blow up). On a GPU this
        # holds only without FMA contraction: fma(dy, w, -c2) against c2 = round(dy * w) left the
        # rounding residual of dy * w (the backward kernels are compiled without it).
        assert torch.equal(got[1], torch.zeros_like(got[1]))
        assert torch.equal(got[2], torch.zeros_like(got[2]))
        check_one_column_dbias(got[3], want[3], dy, dtype)
        got, want = (got[0], None, None, None), (want[0], None, None, None)
    assert_close_grads(got, want, dtype)


@fast_cases(lambda affine, n, dtype: (affine, dtype) == ("none", torch.float32))
@pytest.mark.parametrize(
    "affine, n, dtype",
    [(a, 50 if a == "weight+bias" else 40, torch.float32) for a in AFFINE]
    + [("weight+bias", 17, torch.float16), ("weight+bias", 17, torch.bfloat16),
       ("bias", 40, torch.bfloat16)],
)
def test_backward_looping(affine, n, dtype, device):
    """block=16 forces the wide-row backward (the split kernel: 2 to 4 programs a group, each
    owning 16 columns) on short rows."""
    x, w, b = make((21, n), dtype, device, affine)
    dy = torch.randn(21, n, device=device).to(dtype)
    fused = lambda x, w, b: ln.triton_fused(x, w, b, block=16)  # noqa: E731
    assert_close_grads(grads(fused, x, w, b, dy), grads(ln.reference, x, w, b, dy, torch.float64),
                       dtype)


@fast_cases(lambda n, dtype, sms: (n, dtype, sms) in ((300, torch.float32, 1),
                                                     (1025, torch.bfloat16, 3)))
@pytest.mark.parametrize("sms", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 40, 300, 1025])
def test_few_programs(n, dtype, sms, device, monkeypatch):
    """With the SM count set to 1 or 3, the persistent forward's programs loop over several row
    tiles (prefetching the next) and the backward's groups span many rows and tiles."""
    monkeypatch.setattr(_device, "SM_COUNT_OVERRIDE", sms)
    x, w, b = make((45, n), dtype, device)
    dy = torch.randn(45, n, device=device).to(dtype)
    got = grads(ln.triton_fused, x, w, b, dy)
    want = grads(ln.reference, x, w, b, dy, torch.float64)
    if n == 1:  # see test_backward_matches_float64
        assert not got[1].any() and not got[2].any()
        check_one_column_dbias(got[3], want[3], dy, dtype)
        got, want = (got[0], None, None, None), (want[0], None, None, None)
    assert_close_grads(got, want, dtype)
    if dtype == torch.float32:
        # Rows of far-apart means: each tile must centre on its own rows' first elements.
        xs = x + 1e4 * torch.arange(45, device=device)[:, None]
        assert rel_err(ln.triton_fused(xs, w, b), ref64(xs, w, b)) <= 2 * TOL[dtype]


@fast_cases(lambda rows, n, sms: sms is None)
@pytest.mark.parametrize("rows, n, sms", [(37, 7, None), (45, 300, 3), (50, 40, 100)])
def test_bwd_groups_is_what_backward_uses(rows, n, sms, device, monkeypatch):
    """bwd_groups(rows) (the traffic model's partial-sum rows) is the partial buffer's size,
    whether the SMs or the rows (MIN_ROWS_PER_GROUP each) limit it."""
    monkeypatch.setattr(_device, "SM_COUNT_OVERRIDE", sms)
    shapes = []

    def spy(shape, dtype, dev):
        shapes.append(tuple(shape))
        return real(shape, dtype, dev)

    real = lnb.scratch
    monkeypatch.setattr(lnb, "scratch", spy)
    x, w, b = make((rows, n), torch.float32, device)
    grads(ln.triton_fused, x, w, b, torch.randn(rows, n, device=device))
    assert (2, ln.bwd_groups(rows, device), n) in shapes


@fast_cases(lambda groups, block: (groups, block) in ((3, None), (100, 16)))
@pytest.mark.parametrize("groups", [1, 3, 21, 100])
@pytest.mark.parametrize("block", [None, 16])
def test_backward_groups(groups, block, device):
    """Any number of groups, more than rows included, sums the same dweight and dbias."""
    x, w, b = make((21, 40), torch.float32, device)
    dy = torch.randn(21, 40, device=device)
    fused = lambda x, w, b: ln.triton_fused(x, w, b, block=block, groups=groups)  # noqa: E731
    assert_close_grads(grads(fused, x, w, b, dy), grads(ln.reference, x, w, b, dy, torch.float64),
                       torch.float32)


@fast_cases(lambda n, dtype: (n, dtype) == (20_000, torch.bfloat16))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [16381, 20_000])
def test_long_rows(n, dtype, device):
    """16381 columns: the forward's widest register tile (weight and bias loaded per tile, no
    prefetch: an unaligned row), the backward's split kernel (2 programs a row). 20,000 columns:
    past MAX_ONE_TILE and BWD_MAX_ONE_TILE, so the forward loops and the backward splits each row
    over 3 programs of BWD_SPLIT_BLOCK columns."""
    assert 20_000 > ln.MAX_ONE_TILE >= 16381 > ln.BWD_MAX_ONE_TILE
    x, w, b = make((3, n), dtype, device)
    dy = torch.randn(3, n, device=device).to(dtype)
    want = grads(ln.reference, x, w, b, dy, torch.float64)
    assert_close_grads(grads(ln.triton_fused, x, w, b, dy), want, dtype)
    assert rel_err(ln.triton_unfused(x, w, b), want[0]) <= UNFUSED_SLACK * TOL[dtype]


def test_grad_of_only_some_inputs(device):
    """Gradients are computed for what requires them; a stride-0 dy (from .sum()) is fine."""
    x, w, b = make((9, 40), torch.float32, device)
    xg = x.clone().requires_grad_()
    kernels.layer_norm(xg, w, b).sum().backward()
    x64 = x.double().requires_grad_()
    ref64(x64, w, b).sum().backward()
    assert rel_err(xg.grad, x64.grad) <= 2 * TOL[torch.float32]
    wg = w.clone().requires_grad_()
    kernels.layer_norm(x, wg, b).sum().backward()
    w64 = w.double().requires_grad_()
    F.layer_norm(x.double(), (40,), w64, b.double()).sum().backward()
    assert rel_err(wg.grad, w64.grad) <= 2 * TOL[torch.float32]


@fast_cases(lambda offset, dtype, block: (offset, dtype, block) == (1e6, torch.float32, None))
@pytest.mark.parametrize("offset", [1e2, 1e4, 1e6])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", [None, 16])
def test_large_mean(offset, dtype, block, device):
    """A mean far above the spread. The fused forward centres on the row's first element, so it
    keeps full precision (eager PyTorch in float32 loses ~offset * 2**-24). The unfused baseline
    subtracts a float32 mean like eager does: it is held to that, which still catches the
    catastrophic cancellation of a sum of squares minus the square of the sum."""
    # Only where the dtype still resolves the spread (1) at that offset: in bfloat16 1e4 +- 1
    # rounds to one value (steps of 64), in float16 too (steps of 8), and 1e6 is past float16's
    # max (inf). A constant row is no test of precision: every mean's rounding error over
    # sqrt(eps) becomes an O(1) error in y, whatever the method.
    if offset * torch.finfo(dtype).eps > 1.0:
        pytest.skip(f"{dtype} cannot hold a spread of 1 at {offset:g}")
    x, w, b = make((4, 300), dtype, device, offset=offset, scale=1.0)
    ref = ref64(x, w, b)
    assert rel_err(ln.triton_fused(x, w, b, block=block), ref) <= 2 * TOL[dtype]
    bar = max(UNFUSED_SLACK * TOL[dtype], 4 * offset * 2.0**-24)
    assert rel_err(ln.triton_unfused(x, w, b, block=block), ref) <= bar


@pytest.mark.parametrize("impl", [ln.triton_fused, *full(ln.triton_unfused)])
def test_shapes_and_strides(impl, device):
    x3, w, b = make((2, 3, 33), torch.float32, device)
    assert rel_err(impl(x3, w, b), ref64(x3, w, b)) <= 2 * TOL[torch.float32]
    x1, w1, b1 = make((40,), torch.float32, device)
    assert rel_err(impl(x1, w1, b1), ref64(x1, w1, b1)) <= 2 * TOL[torch.float32]
    base, _, _ = make((4, 64), torch.float16, device)
    xs = base[:, 5:50]  # strided rows, read in place
    w45, b45 = torch.randn(45, device=device).half(), torch.randn(45, device=device).half()
    out = impl(xs, w45, b45)
    assert out.is_contiguous() and rel_err(out, ref64(xs, w45, b45)) <= 4 * TOL[torch.float16]


def test_strided_backward(device):
    base = torch.randn(4, 64, device=device)
    w, b = torch.randn(45, device=device), torch.randn(45, device=device)
    dy = torch.randn(4, 45, device=device)
    got = grads(lambda x, w, b: ln.triton_fused(x[:, 5:50], w, b), base, w, b, dy)
    want = grads(lambda x, w, b: ln.reference(x[:, 5:50], w, b), base, w, b, dy, torch.float64)
    assert_close_grads(got, want, torch.float32)


@pytest.mark.parametrize("shape", [(0, 5), (3, 0)])
def test_empty(shape, device):
    x, w, b = make(shape, torch.float32, device)
    assert ln.triton_unfused(x, w, b).shape == shape
    y, dx, dw, db = grads(ln.triton_fused, x, w, b, torch.ones(shape, device=device))
    assert y.shape == shape and dx.shape == shape
    assert torch.equal(dw.cpu(), torch.zeros(shape[-1])) and torch.equal(db.cpu(), dw.cpu())


def test_zero_length_rows_through_the_registered_op(device):
    """The op's statistics have one (mean, rstd) column per row, as its fake implementation
    says, rows of zero length included (opcheck compares the two)."""
    x, w, b = (t.requires_grad_() for t in make((3, 0), torch.float32, device))
    torch.library.opcheck(ops.OPS["layer_norm"], (x, w, b, 1e-5))


@pytest.mark.parametrize(
    "args, exc, words",
    [
        (lambda d: ([1.0], None, None), TypeError, "x must be a torch.Tensor"),
        (lambda d: (torch.ones(3, 4, device=d, dtype=torch.int64), None, None), TypeError,
         "int64"),
        (lambda d: (torch.tensor(1.0, device=d), None, None), ValueError, "at least 1 dims"),
        (lambda d: (torch.ones(4, 5, device=d).t(), None, None), ValueError,
         "last dim is not contiguous"),
        (lambda d: (torch.ones(3, 4, 8, device=d).transpose(0, 1), None, None), ValueError,
         "cannot be viewed as rows"),
        (lambda d: (torch.ones(3, 4, device=d), torch.ones(5, device=d), None), ValueError,
         r"weight must have shape \(4,\)"),
        (lambda d: (torch.ones(3, 4, device=d), None, torch.ones(1, 4, device=d)), ValueError,
         "bias must be 1-D"),
        (lambda d: (torch.ones(3, 4, device=d), torch.ones(4, device=d).half(), None), TypeError,
         "weight has dtype float16 but x has float32"),
        (lambda d: (torch.ones(3, 4, device=d), torch.ones(8, device=d)[::2], None), ValueError,
         "weight is not contiguous"),
        (lambda d: (torch.ones(3, 4, device=d), None, [0.0] * 4), TypeError,
         "bias must be a torch.Tensor"),
    ],
)
@pytest.mark.parametrize("impl", [ln.triton_fused, ln.triton_unfused, kernels.layer_norm])
def test_bad_inputs_raise(impl, args, exc, words, device):
    with pytest.raises(exc, match=words):
        impl(*args(device))


@pytest.mark.parametrize(
    "kw, exc, words",
    [
        (dict(eps="1e-5"), TypeError, "eps must be a real number"),
        (dict(eps=-1.0), ValueError, "eps must be >= 0"),
        (dict(block=100), ValueError, "power of two"),
        (dict(num_warps=5), ValueError, "num_warps must be a power of two"),
        (dict(groups=0), ValueError, "groups must be a positive int"),
    ],
)
def test_bad_options_raise(kw, exc, words, device):
    x = torch.ones(3, 4, device=device)
    with pytest.raises(exc, match=words):
        ln.triton_fused(x, None, None, **kw)
    if "groups" not in kw:
        with pytest.raises(exc, match=words):
            ln.triton_unfused(x, None, None, **kw)


@pytest.mark.parametrize("eps, exc", [(True, TypeError), ("1e-5", TypeError), (-1.0, ValueError)])
def test_bad_eps_raises_with_parameters(eps, exc, device):
    """nn.LayerNorm's weight and bias (Parameters that require grad) take the registered op's
    path: eps is checked there too, not turned into a float (True would run as eps = 1)."""
    m = torch.nn.LayerNorm(4).to(device)
    with pytest.raises(exc, match="eps must be"):
        kernels.layer_norm(torch.ones(3, 4, device=device), m.weight, m.bias, eps)


def test_programs_per_sm():
    """The persistent forward's grid: blocks an H100 SM holds at once (65536 registers in units of
    256 a warp, 2048 threads, 32 blocks, 228 KiB of shared memory)."""
    assert lnf._programs_per_sm(64, 32, 8) == 4
    assert lnf._programs_per_sm(80, 2048, 8) == 3  # 80 * 256 * 3 <= 65536 < 80 * 256 * 4
    assert lnf._programs_per_sm(86, 64, 16) == 1
    assert lnf._programs_per_sm(64, 128, 32) == 1
    assert lnf._programs_per_sm(16, 0, 1) == 32  # the block limit
    assert lnf._programs_per_sm(32, 100 * 1024, 2) == 2  # the shared-memory limit
    assert lnf._programs_per_sm(255, 0, 32) == 1  # never 0


def test_forward_plan_is_tuned_on_the_device(device, monkeypatch):
    """tuned_launch times fwd_plan's plan and its neighbours once per key (the timing replaced by
    one plain run each here) and keeps the fastest, which computes the same LayerNorm; a row count
    in the same power-of-two bucket takes the choice without timing again."""
    runs = []

    def one_run(fn):
        fn()
        runs.append(1)
        return 10.0 - len(runs)  # the last candidate is the fastest

    monkeypatch.setattr(lnf, "_bench", one_run)
    monkeypatch.setattr(lnf, "_TUNED", {})
    x, w, b = make((20, 256), torch.float16, device)
    how = lnf.fwd_launch(x.dtype, x.device, 20, 256, 256, 256, True, True)
    candidates = lnf.plan_candidates(how.plan)
    assert candidates[0] == how.plan and len(candidates) == len(set(candidates)) > 1
    tuned = lnf.tuned_launch(x, 20, 256, 256, w, b, how)
    timed = len(candidates) * _plans.TUNING_ROUNDS
    assert len(runs) == timed and tuned.plan == candidates[-1] != how.plan
    y = torch.full_like(x, float("nan"))
    lnf.run_forward(x, y, 20, 256, 256, 256, w, b, 1e-5, tuned, stats=False)
    assert rel_err(y, ref64(x, w, b)) <= 2 * TOL[torch.float16]
    x2 = x[:17]
    again = lnf.tuned_launch(x2, 17, 256, 256, w, b, lnf.fwd_launch(x.dtype, x.device, 17, 256,
                                                                    256, 256, True, True))
    assert len(runs) == timed and again.plan == tuned.plan
    # The loop over tiles (rows past MAX_ONE_TILE) has no neighbours to time.
    assert lnf.plan_candidates(lnf.fwd_plan(40000, 2)) == [lnf.fwd_plan(40000, 2)]
