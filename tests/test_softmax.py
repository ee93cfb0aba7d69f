
import math

import pytest
import torch

from triton_fusion_report import kernels
from triton_fusion_report.kernels._device import interpreting

from conftest import FULL, TOL, fast_cases, full, rel_err

from triton_fusion_report.kernels.families.softmax import forward as sm
from triton_fusion_report.kernels.families.softmax import planning as smp

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# length 1, odd, a power of two and one past it, a multiple of a tile plus a remainder
WIDTHS = [1, 7, 256, 1025, 3 * 64 + 5]
IMPLS = [sm.triton_fused, sm.triton_unfused, kernels.softmax]


def ref64(x):
    return torch.softmax(x.double(), -1)


def rand(shape, dtype, device, scale=3.0):
    return (torch.randn(shape, device=device) * scale).to(dtype)


@fast_cases(lambda impl, dtype, n: (impl, dtype, n) in (
    (sm.triton_fused, torch.float32, 1025), (sm.triton_unfused, torch.float16, 7),
    (kernels.softmax, torch.bfloat16, 3 * 64 + 5)))
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", WIDTHS)
def test_matches_float64(impl, dtype, n, device):
    x = rand((5, n), dtype, device)
    out = impl(x)
    assert out.shape == x.shape and out.dtype == dtype
    assert rel_err(out, ref64(x)) <= 2 * TOL[dtype]


@fast_cases(lambda kw, n, dtype: (kw.get("block"), kw.get("splits"), n, dtype) in (
    (16, None, 100, torch.float32), (64, None, 1000, torch.bfloat16),
    (16, 3, 17, torch.float16), (16, 100, 1000, torch.float32)))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 16, 17, 100, 1000])
@pytest.mark.parametrize("kw", [dict(path="online", block=16), dict(path="online", block=64),
                                dict(path="split", block=16, splits=3),
                                dict(path="split", block=16, splits=100)])
def test_looping_paths_at_small_widths(kw, n, dtype, device):
    """The online and split kernels forced on short rows, with tiles small enough to loop."""
    x = rand((3, n), dtype, device)
    assert rel_err(sm.triton_fused(x, **kw), ref64(x)) <= 2 * TOL[dtype]


@fast_cases(lambda block, dtype: (block, dtype) == (16, torch.float32))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", [16, 32, 128])
def test_unfused_tiles(block, dtype, device):
    x = rand((3, 300), dtype, device)
    assert rel_err(sm.triton_unfused(x, block=block), ref64(x)) <= 2 * TOL[dtype]


@fast_cases(lambda kw, dtype: (kw.get("path"), dtype) in ((None, torch.float32),
                                                            ("online", torch.bfloat16)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kw", [{}, dict(path="online"), dict(path="split")])
def test_long_rows(kw, dtype, device):
    """70,001 columns: past MAX_ONE_PASS, so the default plan loops (split, for so few rows)."""
    x = rand((2, 70_001), dtype, device)
    assert smp.plan(2, 70_001).path == smp.SPLIT
    assert rel_err(sm.triton_fused(x, **kw), ref64(x)) <= 2 * TOL[dtype]


@FULL
def test_long_rows_unfused(device):
    x = rand((2, 70_001), torch.float32, device)
    assert rel_err(sm.triton_unfused(x), ref64(x)) <= 2 * TOL[torch.float32]


@pytest.mark.parametrize("block", [1024, *full(2048)])
def test_one_pass_blocks(block, device):
    x = rand((3, 1000), torch.float32, device)
    assert rel_err(sm.triton_fused(x, block=block, num_warps=2), ref64(x)) <= TOL[torch.float32]


STABILITY_IMPLS = [sm.triton_fused, sm.triton_unfused,
                   lambda x: sm.triton_fused(x, path="online", block=16),
                   lambda x: sm.triton_fused(x, path="split", block=16, splits=4)]


@fast_cases()
@pytest.mark.parametrize("impl", STABILITY_IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_large_values(impl, dtype, device):
    """Values around 1e4 (exp would overflow without subtracting the max) and a wide spread."""
    x = torch.randn(4, 70, device=device)
    x = torch.cat([1e4 + x[:2], x[2:] * 1e4]).to(dtype)
    out = impl(x)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref64(x)) <= 2 * TOL[dtype]


# The all -inf row computes -inf - (-inf) on purpose; numpy warns about it under the interpreter.
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@fast_cases()
@pytest.mark.parametrize("impl", STABILITY_IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_minus_inf(impl, dtype, device):
    """-inf entries give exact zeros; whole -inf tiles before the first finite value (tile 16)
    must not poison the running sum; an all -inf row is NaN, as in torch."""
    x = torch.randn(4, 70, device=device)
    x[0, :40] = float("-inf")  # the first tiles all -inf
    x[1, ::3] = float("-inf")
    x[2, :69] = float("-inf")  # one finite value, last
    x[3] = float("-inf")
    x = x.to(dtype)
    out = impl(x)
    ref = ref64(x)
    assert rel_err(out[:3], ref[:3]) <= 2 * TOL[dtype]
    assert torch.all(out[:3][x[:3] == float("-inf")] == 0)
    assert out[2, 69] == 1
    assert torch.isnan(out[3]).all()
    assert torch.isnan(sm.reference(x)[3]).all()  # torch agrees


@pytest.mark.parametrize("impl", [*full(sm.triton_fused, sm.triton_unfused), kernels.softmax])
def test_shapes_and_strides(impl, device):
    x3 = rand((2, 3, 33), torch.float32, device)
    assert impl(x3).shape == x3.shape
    assert rel_err(impl(x3), ref64(x3)) <= TOL[torch.float32]
    x1 = rand((40,), torch.float32, device)
    assert rel_err(impl(x1), ref64(x1)) <= TOL[torch.float32]
    # Strided rows (a column slice): read in place, output contiguous.
    base = rand((4, 64), torch.float16, device)
    xs = base[:, 5:50]
    out = impl(xs)
    assert out.is_contiguous() and rel_err(out, ref64(xs)) <= 2 * TOL[torch.float16]
    # A width-1 column of a transposed tensor: its last dim has stride 4, harmless for one element.
    col = rand((1, 4), torch.float32, device).t()
    assert torch.equal(impl(col).cpu(), torch.ones(4, 1))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (2, 0, 7)])
def test_empty(impl, shape, device):
    x = torch.empty(shape, device=device)
    out = impl(x)
    assert out.shape == x.shape and out.dtype == x.dtype


def test_split_path_on_empty_rows(device):
    """Rows of zero length forced onto the split path: no tiles to share out, no division by 0."""
    assert sm.triton_fused(torch.empty(5, 0, device=device), path="split").shape == (5, 0)


def test_plan(device):
    assert smp.plan(4096, 1024) == smp.Plan(smp.ONE_PASS, 1024, 1, 1, 1024)
    # One-pass warps: one per 1024 elements where rows outnumber the SMs (16-bit: at least 2),
    # one per 256 for fewer rows; given warps win.
    assert [smp.plan(4096, w, itemsize=2).num_warps for w in (768, 4096, 32768)] == [2, 4, 16]
    assert smp.plan(8, 4096).num_warps == 16 and smp.plan(4096, 4096, num_warps=8).num_warps == 8
    assert smp.plan(4096, smp.MAX_ONE_PASS).path == smp.ONE_PASS
    assert smp.plan(4096, smp.MAX_ONE_PASS + 1).path == smp.ONLINE
    # Wide rows: online while a row is at most ONLINE_MAX_ROW_BYTES, then coop (float32 only).
    assert smp.plan(4096, smp.ONLINE_MAX_ROW_BYTES // 4).path == smp.ONLINE
    assert smp.plan(4096, smp.ONLINE_MAX_ROW_BYTES // 4 + 16).path == smp.COOP
    assert smp.plan(4096, 262_144, itemsize=2).path == smp.ONLINE
    assert smp.plan(4096, 262_144, path="online") == smp.Plan(smp.ONLINE, smp.ONLINE_BLOCK, 16,
                                                              1, 262_144)
    assert smp.plan(4096, 262_144, path="coop", splits=8) == smp.Plan(
        smp.COOP, smp.COOP_BLOCK, 16, 8, 32_768)
    p = smp.plan(8, 262_144)  # 8 rows on 132 SMs: split each row
    assert p.path == smp.SPLIT and p.splits > 1 and p.chunk % p.block == 0
    assert (p.splits - 1) * p.chunk < 262_144 <= p.splits * p.chunk
    # Splits that would get no columns are dropped.
    assert smp.plan(2, 100, path="split", block=16, splits=50).splits == 7
    # 16-bit rows on the online path: the largest tile leaving at most 15% of the padded row
    # masked; rows up to the smallest tile as before (the row's power of two).
    assert smp.plan(4096, 1000, itemsize=2, path="online")[1:3] == (1024, 4)
    assert smp.plan(4096, 0, itemsize=2, path="online")[1] == 16
    assert smp.plan(4096, 50257, itemsize=2)[:3] == (smp.ONLINE, 8192, 8)
    assert smp.plan(4096, 100_000, itemsize=2)[:3] == (smp.ONLINE, 16384, 16)
    assert smp.plan(4096, 131_072, itemsize=2)[:3] == (smp.ONLINE, 32768, 16)
    assert smp.plan(4096, 50257, itemsize=2, num_warps=4)[:3] == (smp.ONLINE, 8192, 4)
    assert smp.plan(4096, 50257, itemsize=2, block=32768)[:3] == (smp.ONLINE, 32768, 16)
    assert smp.plan(4096, 50257, itemsize=4)[1] == smp.ONLINE_BLOCK  # float32 keeps its tile
    # Wide float32 rows go coop only where Triton can load them in vectors (COOP_ALIGN).
    assert smp.plan(4096, 100000, itemsize=4).path == smp.COOP
    assert smp.plan(4096, 100003, itemsize=4).path == smp.ONLINE
    assert smp.plan(4096, 100004, itemsize=4).path == smp.ONLINE
    assert smp.plan(4096, 100000, row_stride=100008).path == smp.ONLINE
    assert smp.plan(4096, 100000, aligned=False).path == smp.ONLINE
    assert smp.plan(4096, 100000, aligned=False, splits=1).path == smp.COOP  # splits ask for coop
    # The online kernel's VEC: 16-bit rows not already loaded in vectors, one row stride (out's
    # rows are n_cols apart), an aligned base.
    assert smp.plan(4096, 50257, itemsize=2).vec == 8
    assert smp.plan(4096, 50264, itemsize=2).vec == 8  # a multiple of 8, not of 16
    assert smp.plan(4096, 50272, itemsize=2).vec == 1  # whole vectors already
    assert smp.plan(4096, 50257, itemsize=2, aligned=False).vec == 1
    assert smp.plan(4096, 50257, itemsize=2, row_stride=50264).vec == 1
    assert smp.plan(4096, 50257, itemsize=4).vec == 1
    assert smp.plan(4096, 1000, itemsize=2).vec == 1  # one_pass


@pytest.mark.parametrize(
    "x, exc, words",
    [
        (lambda d: [1.0, 2.0], TypeError, "x must be a torch.Tensor"),
        (lambda d: torch.ones(3, device=d, dtype=torch.int32), TypeError, "int32"),
        (lambda d: torch.ones(3, device=d, dtype=torch.float64), TypeError, "float64"),
        (lambda d: torch.tensor(1.0, device=d), ValueError, "at least 1 dims"),
        (lambda d: torch.ones(4, 5, device=d).t(), ValueError, "last dim is not contiguous"),
        (lambda d: torch.ones(3, 4, 8, device=d).transpose(0, 1), ValueError,
         "cannot be viewed as rows"),
    ],
)
@pytest.mark.parametrize("impl", IMPLS)
def test_bad_inputs_raise(impl, x, exc, words, device):
    if impl is kernels.softmax and ("contiguous" in words or "viewed" in words):
        return  # the public op takes any layout (a copy where it must): the test below
    with pytest.raises(exc, match=words):
        impl(x(device))


@pytest.mark.parametrize("dim", [0, 1, -1, -2])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "unmergeable", "sliced"])
def test_public_softmax_takes_any_dim_and_strides(dim, layout, device):
    """kernels.softmax(x, dim) as torch.softmax(x, dim): any dim, any strides, forward and
    backward against float64."""
    base = torch.randn(6, 5, 40, device=device) * 3
    x = {"contiguous": base, "transposed": base.transpose(1, 2)[:, :, :5],
         "unmergeable": base.transpose(0, 1), "sliced": base[:, :, 3:30]}[layout]
    x = x.detach().requires_grad_()
    y = kernels.softmax(x, dim)
    want = torch.softmax(x.detach().double(), dim)
    assert y.shape == x.shape and (y.double() - want).abs().max() < 1e-5
    dy = torch.randn_like(y)
    y.backward(dy)
    xd = x.detach().double().requires_grad_()
    torch.softmax(xd, dim).backward(dy.double())
    assert (x.grad.double() - xd.grad).abs().max() < 1e-5
    with pytest.raises(ValueError, match="dim must be an int"):
        kernels.softmax(x, 3)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(block=100), "power of two"),
        (dict(block=512), "block must be >= 1024"),
        (dict(path="two_pass"), "path must be one of"),
        (dict(num_warps=3), "num_warps must be a power of two"),
        (dict(path="online", splits=2), "splits only applies"),
        (dict(path="split", splits=0), "splits must be a positive int"),
    ],
)
def test_bad_options_raise(kw, words, device):
    with pytest.raises(ValueError, match=words):
        sm.triton_fused(torch.ones(2, 1000, device=device), **kw)


def test_bad_unfused_block_raises(device):
    with pytest.raises(ValueError, match="power of two"):
        sm.triton_unfused(torch.ones(2, 10, device=device), block=24)


@fast_cases(lambda shape, dtype, block: shape[0] in (5, 200) and (dtype, block) in (
    (torch.float32, 256), (torch.float16, 4096)) and (shape[0] == 5) == (block == 256))
@pytest.mark.parametrize("block", [256, 4096])  # chunks looped over, or held in registers
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(5, 3000), (200, 1000), (3, 1)])
def test_coop_path(shape, dtype, block, device):
    """The persistent, co-operative path (one split per row under the interpreter)."""
    x = torch.randn(*shape, device=device, dtype=dtype) * 4
    x[-1, : shape[1] // 2] = float("-inf")
    out = sm.triton_fused(x, path="coop", block=block)
    assert rel_err(out, torch.softmax(x.double(), -1)) <= TOL[dtype]


def test_coop_splits():
    # Chunks of at most COOP_BLOCK, a power of two of them, no more than MAX_COOP_SPLITS.
    if interpreting():
        assert smp.coop_splits(262_144, 4) == 1
        return
    assert smp.coop_splits(262_144, 4) == 8
    assert smp.coop_splits(70_000, 4) == 4
    assert smp.coop_splits(1 << 24, 4) == smp.MAX_COOP_SPLITS


def test_coop_only_for_rows_loaded_in_vectors(monkeypatch, device):
    """The default sends wide float32 rows to the coop kernel only where Triton loads them in
    vectors: width and row stride multiples of COOP_ALIGN, base 16-byte aligned; else online."""
    from triton_fusion_report.kernels import _device

    monkeypatch.setattr(_device, "SM_COUNT_OVERRIDE", 4)
    launched = []
    monkeypatch.setattr(sm, "launch", lambda kernel, grid, *a, **k: launched.append(kernel))
    n = smp.ONLINE_MAX_ROW_BYTES // 4 + smp.COOP_ALIGN
    wide = torch.randn(8, n + smp.COOP_ALIGN, device=device)
    flat = torch.randn(8 * n + 1, device=device)
    coop, online = sm._softmax_coop_kernel, sm._softmax_online_kernel
    for x, kernel in ((wide[:, :n], coop), (wide[:, :n].contiguous(), coop),
                      (torch.randn(8, n + 3, device=device)[:, :n], online),  # row stride off 16
                      (torch.randn(8, n + 4, device=device), online),  # width off 16
                      # One layout, its base aligned, then not: the plan cache tells them apart.
                      (flat[:-1].view(8, n), coop), (flat[1:].view(8, n), online)):
        launched.clear()
        sm.triton_fused(x)
        assert launched == [kernel]


@pytest.mark.skipif(not interpreting(), reason="the interpreter runs one program at a time")
def test_coop_shared_rows_refused_under_the_interpreter(device):
    """A row shared by programs that wait for each other would hang there: refused (checked on
    the plan, so that a regression fails instead of hanging)."""
    x = torch.randn(2, 100, device=device)
    with pytest.raises(ValueError, match="needs a GPU"):
        sm._rows_plan(x, 16, None, "coop", 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="row sharing needs co-resident programs")
@pytest.mark.parametrize("splits", [2, 4, *full(8)])  # looped chunks (2), in registers (4, 8)
def test_coop_shared_rows(splits, device):
    x = torch.randn(300, 70_001, device=device) * 4
    x[7, :40_000] = float("-inf")
    out = sm.triton_fused(x, path="coop", splits=splits)
    assert rel_err(out, torch.softmax(x.double(), -1)) <= TOL[torch.float32]


_BESIDE_A_LONG_KERNEL = """
import torch
from triton_fusion_report.kernels.families.softmax import forward as sm
dev = torch.device("cuda")
a = torch.randn(12288, 12288, device=dev)
x = torch.randn(64, 262_144, device=dev)
want = torch.softmax(x, -1)
busy, one, two = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
torch.cuda.synchronize()
for _ in range(3):
    with torch.cuda.stream(busy):
        for _ in range(4):
            a @ a  # fills every SM for ~100 ms
    outs = []
    for s in (one, two, one, two):  # two co-operative grids in flight at once
        with torch.cuda.stream(s):
            outs.append(sm.triton_fused(x, path="coop"))
    torch.cuda.synchronize()
    assert max((o - want).abs().max().item() for o in outs) < 1e-6
print("ok")
"""


@FULL
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU and a second stream")
def test_coop_beside_another_stream():
    """The co-operative path waits for a row's other programs. Launched twice at once on two
    streams while a long matmul occupies the GPU from a third, each grid must still finish
    (co-operative launch: all of a grid's programs resident at once; otherwise two half-resident
    grids could each spin forever) and be right. A hang fails through the subprocess's timeout."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _BESIDE_A_LONG_KERNEL], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


# --- The backward: dx = y * (dy - sum(y * dy)), fused and unfused ---------------------------------

from triton_fusion_report.kernels.families.softmax import backward as smb  # noqa: E402

BWD_IMPLS = [smb.triton_fused, smb.triton_unfused]


def bwd_inputs(shape, dtype, device):
    y = torch.softmax(torch.randn(shape, device=device) * 3, -1).to(dtype)
    return y, torch.randn(shape, device=device).to(dtype)


def bwd_ref64(y, dy):
    y, dy = y.double(), dy.double()
    return y * (dy - (y * dy).sum(-1, keepdim=True))


@fast_cases()
@pytest.mark.parametrize("impl", BWD_IMPLS, ids=["fused", "unfused"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 37, 1025])
def test_backward_matches_float64(impl, dtype, n, device):
    y, dy = bwd_inputs((5, n), dtype, device)
    dx = impl(y, dy)
    assert dx.shape == y.shape and dx.dtype == dtype
    assert rel_err(dx, bwd_ref64(y, dy)) <= 4 * TOL[dtype]


@pytest.mark.parametrize("block", [16, *full(64)])
def test_backward_unfused_tiles(block, device):
    """Tiles smaller than the row: the row-sum kernel loops, the elementwise grid has columns."""
    y, dy = bwd_inputs((3, 300), torch.float16, device)
    assert rel_err(smb.triton_unfused(y, dy, block=block), bwd_ref64(y, dy)) <= 4 * TOL[torch.float16]


def test_backward_strided_and_empty(device):
    base_y, base_dy = bwd_inputs((4, 64), torch.float32, device)
    y, dy = base_y[:, 5:50], base_dy[:, 5:50]  # column slices, read in place
    for impl in BWD_IMPLS:
        dx = impl(y, dy)
        assert dx.is_contiguous() and rel_err(dx, bwd_ref64(y, dy)) <= 4 * TOL[torch.float32]
        empty = torch.empty(3, 0, device=device)
        assert impl(empty, empty).shape == (3, 0)


def test_backward_plan():
    assert smb.plan(1000) == smb.Plan(smb.ONE_TILE, 1024, 4, 16)
    assert smb.plan(smb.MAX_ONE_TILE).path == smb.ONE_TILE
    assert smb.plan(smb.MAX_ONE_TILE + 1) == smb.Plan(smb.TWO_PASS, 16384, 1, smb.LOOP_WARPS)
    # 16-bit rows: the largest tile that pads the row by at most LOOP_MAX_PAD.
    assert [smb.plan(n, 2).block for n in (20000, 24000, 32768, 50257, 100003)] == [
        4096, 8192, 16384, 8192, 16384]


@pytest.mark.parametrize("impl", BWD_IMPLS, ids=["fused", "unfused"])
def test_backward_bad_inputs_raise(impl, device):
    y = torch.ones(2, 8, device=device)
    with pytest.raises(ValueError, match="dy must have y's shape"):
        impl(y, torch.ones(2, 9, device=device))
    with pytest.raises(TypeError, match="dy has dtype float16 but y has float32"):
        impl(y, y.half())


@pytest.mark.parametrize("kw, words", [(dict(block=24), "power of two"),
                                       (dict(num_warps=3), "num_warps must be a power of two")])
def test_backward_unfused_bad_options_raise(kw, words, device):
    y = torch.ones(2, 8, device=device)
    with pytest.raises(ValueError, match=words):
        smb.triton_unfused(y, y, **kw)


def test_own_output_backward_checks_what_it_cannot_assume(device):
    """The autograd Function's backward skips the checks only for a contiguous y and a contiguous
    dy of y's shape and dtype; anything else goes through softmax_backward's checks."""
    from triton_fusion_report.kernels.families.softmax import backward as smb

    y = torch.softmax(torch.randn(4, 6, device=device), -1)
    dy = torch.randn(4, 6, device=device)
    want = smb.reference(y.double(), dy.double())
    assert rel_err(smb.own_output_backward(y, dy), want) <= 4 * TOL[torch.float32]
    with pytest.raises(ValueError, match="shape"):
        smb.own_output_backward(y, torch.randn(6, 4, device=device))
    yt = torch.softmax(torch.randn(6, 4, device=device), 0).t()  # rows strided: checked, refused
    with pytest.raises(ValueError, match="contiguous"):
        smb.own_output_backward(yt, dy)


@fast_cases(lambda dtype, n: (dtype, n) in ((torch.bfloat16, 37), (torch.float32, 7)))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 37, 64])
def test_rows_walked_in_aligned_vectors(dtype, n, device, monkeypatch):
    """The online forward and the looping backward walk rows in 16-byte aligned coordinates
    (VEC > 1) where 16-bit rows are not whole vectors: nine rows of an odd width start at every
    offset within a vector, rows shorter than a vector included. Where a base is not aligned, the
    row strides differ or the rows are float32 they take the plain tiles (VEC 1). Outputs start as NaN, so an
    element left unwritten (or a neighbour's written) fails."""
    guarded = []  # outputs inside NaN buffers: a write past either end of one fails

    def nan_output(shape, dtype, device, pad=16):
        n = math.prod(shape)
        buf = torch.full((n + 2 * pad,), float("nan"), dtype=dtype, device=device)
        guarded.append((buf, pad, n))
        return buf[pad:pad + n].view(shape)
    monkeypatch.setattr(sm, "empty_like", lambda t: nan_output(t.shape, t.dtype, t.device))
    monkeypatch.setattr(smb, "empty", nan_output)
    monkeypatch.setattr(smb, "plan", lambda n_cols, itemsize=4: smb.Plan(smb.TWO_PASS, 16, 1, 4))
    size = torch.tensor([], dtype=dtype).element_size()
    vec = 16 // size
    flat = rand((9 * n + 1,), dtype, device)
    aligned, shifted = flat[:-1].view(9, n), flat[1:].view(9, n)  # base 16-byte aligned / not
    assert smp.aligned_vector(n, (n, n), (aligned, aligned)) == (
        vec if size == 2 and n % 16 else 1)
    # A multiple of 8 but not of 16 elements: Triton would not load it in vectors.
    assert smp.aligned_vector(24, (24, 24), (flat, flat)) == (vec if size == 2 else 1)
    assert smp.aligned_vector(n, (n, n), (shifted, aligned)) == 1
    assert smp.aligned_vector(n, (n + 8, n), (aligned, aligned)) == 1
    for x in (aligned, shifted):  # one layout: the plan, and the cache, read the base too
        assert sm._rows_plan(x, 16, None, "online", None)[3].vec == (
            vec if size == 2 and n % 16 and x is aligned else 1)
        assert rel_err(sm.triton_fused(x, path="online", block=16), ref64(x)) <= 2 * TOL[dtype]
    y, dy = bwd_inputs((9, n), dtype, device)
    wide_dy = bwd_inputs((9, n + 3), dtype, device)[1]
    for dy_ in (dy, wide_dy[:, :n]):  # one row stride, or dy's rows n + 3 apart
        assert rel_err(smb.triton_fused(y, dy_), bwd_ref64(y, dy_)) <= 4 * TOL[dtype]
    assert len(guarded) == 4
    for buf, pad, n_out in guarded:
        assert buf[:pad].isnan().all() and buf[pad + n_out:].isnan().all()
