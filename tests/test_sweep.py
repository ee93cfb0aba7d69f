"""The sweep: each implementation of a problem checked, timed and written as a row as it is
measured (failures as rows), the grids and which problems a run takes, and the provenance each
row records."""

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from triton_fusion_report.analysis.bench import __main__ as cli
from triton_fusion_report.analysis import schema
from triton_fusion_report.analysis.bench import families
from triton_fusion_report.analysis.bench.sweep import Problem, Variant, run

from conftest import FULL


def test_sink_keeps_rows_when_a_sweep_dies(tmp_path, device):
    """Rows are on disk as they are measured: a crash in the second problem loses nothing of the
    first (a problem's timed rows are written after its last trial, its failures at once)."""
    def fine(x):
        return x * 2

    def boom(x):
        raise KeyboardInterrupt  # not an Exception: the runner must not swallow it

    def problem(n, variants):
        return Problem(
            family="elementwise", op="add_mul", dtype=torch.float32, precision="ieee",
            shape=dict(n=n, z_kind="scalar"), make_inputs=lambda d: (torch.randn(n, device=d),),
            reference=lambda x: x * 2, bytes_model=64, flops_model=8, tolerance=1e-6,
            variants=variants)
    problems = [problem(8, [Variant("torch_eager", fine), Variant("torch_compile", fine)]),
                problem(16, [Variant("torch_eager", fine), Variant("triton_fused", boom)])]
    meta = dict(run_id="r", started_at="t", git_commit="c", gpu="g", sm_count=None, torch="x",
                triton="y", cuda="z")
    with pytest.raises(KeyboardInterrupt):
        run(problems, tmp_path, device, meta, [], progress=False)
    rows = pd.read_parquet(tmp_path / "elementwise.parquet")
    assert rows["n"].tolist() == [8, 8] and (rows["status"] == "ok").all()


def test_trials_are_interleaved_on_fresh_inputs(tmp_path, device):
    """Every variant is timed once per trial, the variants taking turns, each trial on inputs made
    afresh; the row keeps the median of the trial medians and the lowest and highest. A
    problem's own trial count (the reference grid's, where the book reads the spread) overrides
    the grid's."""
    calls, made = [], []

    def make(d):
        made.append(1)
        return (torch.randn(8, device=d),)

    def traced(name):
        def fn(x):
            calls.append((name, len(made)))
            return x * 2
        return fn

    problem = Problem(
        family="elementwise", op="add_mul", dtype=torch.float32, precision="ieee",
        shape=dict(n=8, z_kind="scalar"), make_inputs=make, reference=lambda x: x * 2,
        bytes_model=64, flops_model=8, tolerance=1e-6, graph=False,
        variants=[Variant("torch_eager", traced("a")), Variant("triton_fused", traced("b"))],
        trials=3)
    meta = dict(run_id="r", started_at="t", git_commit="c", gpu="g", sm_count=None, torch="x",
                triton="y", cuda="z")
    run([problem], tmp_path, device, meta, [], progress=False, trials=1)
    assert len(made) == 3
    # The checks, then per trial both variants on that trial's inputs (order rotated).
    timed = [c for c in calls[2:] if device.type == "cpu"] or calls[2:]
    rounds = [sorted({name for name, m in timed if m == k}) for k in (1, 2, 3)]
    assert rounds == [["a", "b"]] * 3
    firsts = [next(name for name, m in timed if m == k) for k in (1, 2, 3)]
    assert firsts[:2] == ["a", "b"]
    rows = pd.read_parquet(tmp_path / "elementwise.parquet")
    assert (rows["n_trials"] == 3).all() and (rows["wall_s"] > 0).all()
    assert (rows["ms_trial_min"] <= rows["ms_median"]).all()
    assert (rows["ms_median"] <= rows["ms_trial_max"]).all()
    assert rows.set_index("impl").loc["triton_fused", "kernel_hash"]
    assert pd.isna(rows.set_index("impl").loc["torch_eager", "kernel_hash"])


@FULL
def test_compiled_variants_of_one_problem_compile_once_each(tmp_path, device):
    """Two compiled variants of one function in one problem: each traced once over the check and
    every trial (a Dynamo reset between them would drop the first one's graph and compile it
    again); the next problem starts afresh."""
    from triton_fusion_report.analysis.bench.sweep import MAX_AUTOTUNE, Compiled

    from torch._dynamo.utils import counters

    def f(x):
        return x * 2

    def traced():
        return counters["stats"]["unique_graphs"]

    def problem(n):
        return Problem(
            family="elementwise", op="add_mul", dtype=torch.float32, precision="ieee",
            shape=dict(n=n, z_kind="scalar"), make_inputs=lambda d: (torch.randn(n, device=d),),
            reference=lambda x: x * 2, bytes_model=64, flops_model=8, tolerance=1e-6,
            graph=False, variants=[Variant("torch_compile", Compiled(f)),
                                   Variant("torch_compile_max", Compiled(f, MAX_AUTOTUNE))])
    meta = dict(run_id="r", started_at="t", git_commit="c", gpu="g", sm_count=None, torch="x",
                triton="y", cuda="z")
    before = traced()
    run([problem(8)], tmp_path, device, meta, [], progress=False, trials=3)
    assert traced() - before == 2
    run([problem(8)], tmp_path, device, meta, [], progress=False, trials=1)
    assert traced() - before == 4  # a new problem: compiled afresh, not served by the last one's graphs
    rows = pd.read_parquet(tmp_path / "elementwise.parquet")
    assert (rows["status"] == "ok").all()


def test_median_settled():
    from triton_fusion_report.analysis.bench.timing import median_settled

    steady = [1.0 + 0.001 * (i % 5) for i in range(20)]
    assert median_settled(steady)
    noisy = [1.0 + 0.1 * (i % 5) for i in range(20)]
    assert not median_settled(noisy)
    # Outliers beyond the median's interval do not keep it from settling.
    assert median_settled(steady[:17] + [5.0, 9.0, 0.2])


def test_failures_become_rows(tmp_path, device):
    def wrong(x):
        return x * 3

    def refused(x):
        raise ValueError("x is refused")

    problem = Problem(
        family="elementwise", op="add_mul", dtype=torch.float32, precision="ieee",
        shape=dict(n=8, z_kind="scalar"), make_inputs=lambda d: (torch.randn(8, device=d),),
        reference=lambda x: x * 2, bytes_model=64, flops_model=8, tolerance=1e-6,
        variants=[Variant("triton_unfused", wrong), Variant("triton_fused", refused)])
    meta = dict(run_id="r", started_at="t", git_commit="c", gpu="g", sm_count=None, torch="x",
                triton="y", cuda="z")
    run([problem], tmp_path, device, meta, [], progress=False)
    rows = pd.read_parquet(tmp_path / "elementwise.parquet").set_index("impl")
    assert rows.loc["triton_unfused", "status"] == "wrong_result"
    assert pd.isna(rows.loc["triton_unfused", "ms_median"])
    assert rows.loc["triton_fused", "status"] == "unsupported"
    assert "x is refused" in rows.loc["triton_fused", "error"]


def test_fresh_inputs_that_fail_become_rows(tmp_path, device):
    """A later trial's fresh inputs that cannot be made (an OOM, say) are failure rows of the
    problem's variants; the sweep goes on with the next problem instead of dying."""
    made = []

    def make(d):
        made.append(1)
        if len(made) == 2:  # the second trial's inputs
            raise RuntimeError("CUDA out of memory")
        return (torch.randn(8, device=d),)

    def problem(n, make_inputs):
        return Problem(
            family="elementwise", op="add_mul", dtype=torch.float32, precision="ieee",
            shape=dict(n=n, z_kind="scalar"), make_inputs=make_inputs, reference=lambda x: x * 2,
            bytes_model=64, flops_model=8, tolerance=1e-6, graph=False,
            variants=[Variant("torch_eager", lambda x: x * 2)])
    meta = dict(run_id="r", started_at="t", git_commit="c", gpu="g", sm_count=None, torch="x",
                triton="y", cuda="z")
    run([problem(8, make), problem(16, lambda d: (torch.randn(16, device=d),))], tmp_path,
        device, meta, [], progress=False, trials=3)
    rows = pd.read_parquet(tmp_path / "elementwise.parquet").set_index("n")
    assert rows.loc[8, "status"] == "oom" and "out of memory" in rows.loc[8, "error"]
    assert rows.loc[16, "status"] == "ok"


def test_half_precision_rows_get_the_matmul_peak(device):
    """The limits name the fp16/bf16 matmul peaks by their short label; rows by dtype."""
    from triton_fusion_report.analysis.bench.sweep import limits_lookup, measure

    problem = Problem(
        family="elementwise", op="add_mul", dtype=torch.float16, precision="float16",
        shape=dict(n=8, z_kind="scalar"), make_inputs=None, reference=None, bytes_model=64,
        flops_model=8, tolerance=1e-3, graph=False)
    x = torch.randn(8, device=device, dtype=torch.float16)
    limits = limits_lookup([dict(metric="matmul_peak", precision="fp16", value=500.0),
                            dict(metric="copy_bw", precision="ieee", value=3000.0)])
    row = measure(problem, Variant("torch_eager", lambda t: t * 2), (x,), x.double() * 2, device,
                  limits)
    assert row["status"] == "ok" and row["pct_matmul_peak"] > 0 and row["pct_copy_bw"] > 0


def test_failures_are_classified():
    """A library's refusal of a shape is `unsupported`, not a compile error of ours; an
    unknown failure of the first call stays `compile_error`."""
    import torch

    from triton_fusion_report.analysis.bench.sweep import classify

    liger = RuntimeError("Cannot launch Triton kernel since n = 131072 exceeds the recommended "
                         "Triton blocksize = 65536.")
    assert classify(liger) == "unsupported"
    assert classify(RuntimeError("No available kernel. Aborting execution.")) == "unsupported"
    assert classify(ValueError("head_dim 512")) == "unsupported"
    assert classify(torch.cuda.OutOfMemoryError("CUDA out of memory")) == "oom"
    assert classify(RuntimeError("PassManager::run failed")) == "compile_error"


def test_sweep_smoke_writes_full_schema(tmp_path, capsys, device):  # the bench's device
    """`python -m triton_fusion_report.analysis.bench --grid smoke` end to end on this machine (interpreter on a CPU)."""
    out = tmp_path / "run"
    assert cli.main(["--out", str(out), "--grid", "smoke", "--family", "elementwise",
                     "--no-progress", "--workers", "1"]) == 0  # one run (two GPUs: two workers)
    table = pq.read_table(out / "elementwise.parquet")
    assert table.schema.names == schema.family_schema("elementwise").names
    for column in ["run_id", "git_commit", "gpu", "torch", "triton", "family", "op", "impl",
                   "dtype", "precision", "status", "ms_median", "n_reps", "bytes_model", "gbps",
                   "max_rel_err"]:
        assert column in table.schema.names
    df = table.to_pandas()
    # No max-autotune in the smoke grid: its search would be most of a toy run's time.
    assert set(df["impl"]) == {"torch_eager", "torch_compile", "triton_unfused", "triton_fused"}
    assert (df["status"] == "ok").all(), df[df["status"] != "ok"][["impl", "error"]]
    assert (df["ms_median"] > 0).all() and (df["max_rel_err"] < 1e-3).all()
    assert set(df["sweep"]) == {"size", "block"}
    assert pq.read_table(out / "limits.parquet").num_rows >= 1
    assert "triton_fused" in capsys.readouterr().out  # the summary table
    runs = pd.read_parquet(out / "runs.parquet")
    assert len(runs) == 1 and runs["status"].iloc[0] == "finished"
    assert runs["rows"].iloc[0] == len(df) and runs["run_id"].iloc[0] == df["run_id"].iloc[0]
    assert runs["finished_at"].iloc[0] >= runs["started_at"].iloc[0]
    assert runs["families"].iloc[0] == "elementwise" and "--grid smoke" in runs["argv"].iloc[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="peak memory is measured on a GPU")
def test_peak_memory_never_falls_below_the_base():
    """A tensor freed during the measured call (or by the garbage collector between the reads)
    cannot make the recorded peak negative; a call that allocates 4 MiB records at least that."""
    from triton_fusion_report.analysis.bench import timing

    device = torch.device("cuda")
    held = [torch.empty(2**20, device=device)]  # 4 MiB, freed by the call below

    def frees():
        held.clear()
        return None

    assert timing.peak_mib(frees, device) >= 0
    assert timing.peak_mib(lambda: torch.empty(2**20, device=device), device) >= 4


def test_softmax_backward_problems():
    """The forward's grid, backward: op softmax_bwd, direction bwd, after every forward problem
    (each forward problem keeps its index, which seeds the fingerprint's inputs)."""
    from triton_fusion_report.analysis.bench import reductions
    from triton_fusion_report.kernels.families.softmax import backward as smb

    problems = reductions.softmax_problems("smoke")
    ops = [p.op for p in problems]
    n_shapes = sum(len(v) for v in reductions.GRIDS["smoke"]["softmax"].values())
    assert ops == ["softmax"] * n_shapes + ["softmax_bwd"] * n_shapes
    assert {p.shape["direction"] for p in problems if p.op == "softmax"} == {"fwd"}
    for p in problems[n_shapes:]:
        rows, width, s = p.shape["rows"], p.shape["width"], p.dtype.itemsize
        e = rows * width * s
        assert p.shape["direction"] == "bwd" and p.bytes_model == 3 * e
        by_impl = {v.impl: v for v in p.variants}
        assert set(by_impl) == {"torch_eager", "torch_compile", "torch_compile_max",
                                "triton_unfused", "triton_fused", "liger", "flag_gems"}
        assert by_impl["triton_unfused"].bytes_impl == 5 * e + 2 * rows * 4  # + the row sums
        fused = by_impl["triton_fused"]
        assert fused.variant == smb.plan(width).path
        assert fused.bytes_impl == (5 if width > smb.MAX_ONE_TILE else 3) * e


def test_select_ops():
    from triton_fusion_report.analysis.bench import reductions

    problems = reductions.softmax_problems("smoke") + reductions.layernorm_problems("smoke")
    assert families.select_ops(problems, None) == problems
    kept = families.select_ops(problems, ["softmax_bwd", "layer_norm_bwd"])
    assert kept and {p.op for p in kept} == {"softmax_bwd", "layer_norm_bwd"}
    with pytest.raises(ValueError, match="--op softmax_backward: no such op.*softmax_bwd"):
        families.select_ops(problems, ["softmax", "softmax_backward"])


def test_where_selects_shapes():
    """--where COL=VALUE keeps the problems with that value (COL=V1,V2: either); several keys
    must all hold; a problem without the column is left out."""
    from triton_fusion_report.analysis.bench.families import select_shapes
    from triton_fusion_report.analysis.bench import matmul_epilogue as me

    problems = me.matmul_softmax_problems("full")
    assert [p.shape["n"] for p in select_shapes(problems, ["m=4096"])] == [128256, 50257]
    both = select_shapes(problems, ["m=16384,4096", "k=1024"])
    assert [(p.shape["m"], p.shape["n"]) for p in both] == [(16384, 32000), (4096, 128256)]
    assert select_shapes(problems, ["seq=4096"]) == []


def test_book_grid_is_the_full_grid_thinned_with_search_at_the_headline_only():
    """The default grid: each family's problems a subset of the full grid's, its headline case
    among them with every baseline, and the searching baselines nowhere else."""
    from types import SimpleNamespace

    def key(p):
        return (p.op, p.precision, tuple(sorted(p.shape.items())))

    for family in families.PROBLEMS:
        args = SimpleNamespace(grid="book", family=[family], op=None, where=None)
        book = families.select_problems(args)
        full = {key(p): p for p in families.PROBLEMS[family]("full")}
        assert book and all(key(p) in full for p in book), family
        heads = [p for p in book if families.is_headline(p)]
        assert heads, f"{family}: the book grid lacks its headline case"
        for p in book:
            impls = {v.impl for v in p.variants}
            searching = {i for f, i in families.SEARCHING if f == family}
            left_out = {i for f, i in families.BOOK_LEAVES_OUT if f == family}
            if p in heads:
                want = {v.impl for v in full[key(p)].variants} - left_out
                assert want == impls, family
            else:
                assert not impls & (searching | left_out), (family, p.shape)
    assert families.TRIALS == {"book": 1, "reference": 1, "full": 3, "smoke": 1}
    # The full grid keeps every baseline but attention's searching ones off its headline.
    everything = families.PROBLEMS["attention"]("full")
    chosen = families.select_problems(SimpleNamespace(grid="full", family=["attention"], op=None,
                                                      where=None))
    dropped = {i for f, i in families.FULL_SEARCHES_HEADLINE_ONLY if f == "attention"}
    assert len(chosen) == len(everything)
    for p, whole in zip(chosen, everything):
        impls, before = {v.impl for v in p.variants}, {v.impl for v in whole.variants}
        assert impls == (before if families.is_headline(p) else before - dropped)
    assert any(dropped <= {v.impl for v in p.variants} for p in chosen)


def test_reference_grid_is_the_book_grid_with_its_baselines_and_trials_where_read():
    """The reference grid: the book's problems, each with every baseline of the book's sizes
    (attention's searching ones at its headline, FlagGems' there with either mask), three trials
    where the book reads the trials' spread (each headline case, every linear + activation
    shape) and the grid's one elsewhere."""
    from types import SimpleNamespace

    def key(p):
        return (p.op, p.precision, tuple(sorted(p.shape.items())))

    for family in families.PROBLEMS:
        def chosen(grid):
            return families.select_problems(SimpleNamespace(grid=grid, family=[family], op=None,
                                                            where=None))
        reference, book = chosen("reference"), chosen("book")
        assert [key(p) for p in reference] == [key(p) for p in book], family
        whole = families.PROBLEMS[family]("book")
        for p, all_of in zip(reference, whole):
            impls, every = [v.impl for v in p.variants], [v.impl for v in all_of.variants]
            left = {i for i in every if i not in impls}
            if families.is_headline(p) or family != "attention":
                assert impls == every, (family, p.shape)
            else:
                searching = {i for f, i in families.FULL_SEARCHES_HEADLINE_ONLY if f == family}
                assert left <= searching, (family, p.shape)
                if families.is_headline(p, ignore=("causal",)):
                    assert "flag_gems" in impls or "flag_gems" not in every
            assert p.trials == (families.SPREAD_TRIALS if families.spread_read(p) else None)
        assert any(p.trials for p in reference), family  # its headline at least
    linear = families.select_problems(SimpleNamespace(grid="reference", family=["linear_act"],
                                                      op=None, where=None))
    assert all(p.trials == 3 for p in linear)
    assert families.TRIALS["reference"] == 1


def test_provenance(tmp_path, monkeypatch):
    """A run records the full commit as git says it (no label typed by hand), and a hash of the
    sources that changes with them; a copy outside a git checkout records no borrowed commit."""
    from triton_fusion_report.analysis.bench import machine

    commit = machine.git_commit()
    assert commit == "unknown" or len(commit.removesuffix("-dirty")) == 40
    monkeypatch.setenv("GIT_COMMIT", "a" * 40)  # no longer a way to type a label
    assert machine.git_commit() == commit
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.py").write_text("x = 1\n")
    monkeypatch.setattr(machine, "ROOT", tmp_path)
    assert machine.git_commit() == "unknown"
    before = machine.source_hash()
    assert len(before) == 16 and machine.source_hash() == before
    (tmp_path / "kernels" / "k.py").write_text("x = 2\n")
    assert machine.source_hash() != before
    meta = machine.run_metadata(torch.device("cpu"))
    assert meta["source_hash"] == machine.source_hash()
    assert set(schema.PROVENANCE) - {"kernel_hash"} <= set(meta)  # kernel_hash: per row


def test_kernel_hash_follows_the_family_code_not_its_files(tmp_path, monkeypatch):
    """A family's kernel hash changes with the code its op and the private modules it imports
    run, not with another family's, nor with comments, docstrings, imports or a file's name."""
    from triton_fusion_report.analysis import sources

    k = tmp_path / "kernels"
    (k / "families" / "softmax").mkdir(parents=True)
    files = {"__init__": "from .families import add_mul\n", "_checks": "x = 1\n",
             "_helper": "y = 1\n", "families/__init__": "",
             "families/add_mul": "from .._checks import x\nfrom .._helper import y\n",
             "families/softmax/__init__": "from . import forward\n",
             "families/softmax/forward": ""}
    for name, text in files.items():
        (k / f"{name}.py").write_text(text)
    monkeypatch.setattr(sources, "ROOT", tmp_path)
    before = {f: sources.kernel_hash(f) for f in ("elementwise", "softmax")}
    (k / "_helper.py").write_text("y = 2\n")
    assert sources.kernel_hash("elementwise") != before["elementwise"]
    assert sources.kernel_hash("softmax") == before["softmax"]
    forward = k / "families" / "softmax" / "forward.py"
    forward.write_text("z = 0\n")
    assert sources.kernel_hash("softmax") != before["softmax"]
    # Comments and docstrings are not the code a row ran: editing them keeps the hash.
    edited = sources.kernel_hash("softmax")
    forward.write_text('"""µs-long rows."""\n# why\nz = 0  # 1 µs\n\n\n'
                       'def f():\n    """Doc."""\n    return "# kept"\n')
    with_f = sources.kernel_hash("softmax")
    assert with_f != edited  # a function added
    forward.write_text('z = 0\n\ndef f():\n    """Other doc, ×."""\n'
                       '    return "# kept"  # another comment\n')
    assert sources.kernel_hash("softmax") == with_f
    # f moved to a module of its own: the same code, the same hash.
    forward.write_text("from ._f import f\nz = 0\n")
    (k / "families" / "softmax" / "_f.py").write_text('def f():\n    return "# kept"\n')
    assert sources.kernel_hash("softmax") == with_f
    forward.write_text('z = 0\ndef f():\n    return "# changed"\n')
    assert sources.kernel_hash("softmax") != with_f  # a string that is code, not a docstring
