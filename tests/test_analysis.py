"""The traffic model's numbers, the Parquet sink, and a sweep smoke run on a tiny grid."""
import os
import re
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from triton_fusion_report.analysis.bench import __main__ as cli
from triton_fusion_report.analysis import schema
from triton_fusion_report.analysis.bench import families
from triton_fusion_report.analysis.bench.sweep import Problem, Variant, run
from triton_fusion_report.analysis.model import traffic

from conftest import FULL, tool


@pytest.mark.parametrize("itemsize", [2, 4])
def test_add_mul_traffic(itemsize):
    n = 1000
    e = n * itemsize
    assert traffic.add_mul_bytes(n, itemsize, "tensor", "triton_unfused") == 6 * e
    assert traffic.add_mul_bytes(n, itemsize, "tensor", "torch_eager") == 6 * e
    assert traffic.add_mul_bytes(n, itemsize, "tensor", "triton_fused") == 4 * e
    assert traffic.add_mul_bytes(n, itemsize, "tensor", "torch_compile") == 4 * e
    assert traffic.add_mul_bytes(n, itemsize, "scalar", "triton_unfused") == 5 * e
    assert traffic.add_mul_bytes(n, itemsize, "scalar", "triton_fused") == 3 * e
    unfused = traffic.add_mul_kernels(n, itemsize, "tensor", fused=False)
    assert [(k.read, k.written) for k in unfused] == [(2 * e, e), (2 * e, e)]
    assert traffic.add_mul_flops(n) == 2 * n
    with pytest.raises(ValueError, match="z_kind"):
        traffic.add_mul_bytes(n, itemsize, "vector", "triton_fused")


def test_traffic_table_totals():
    t = traffic.add_mul_table(10, 4)
    totals = t.groupby(["z", "variant"])["bytes"].sum()
    assert totals[("tensor", "unfused")] == 6 * 40 and totals[("scalar", "fused")] == 3 * 40


def ok_or_peer_missing(df, recorded=False) -> bool:
    """Every row ok, but a peer library's where it is not installed here (unsupported, saying so);
    `recorded`: rows of a committed run, whose machine, not this one, lacked the library."""
    from triton_fusion_report.analysis.bench import peers

    absent = df["impl"].isin([i for i in peers.PINNED if recorded or peers._load(i)[0] is None])
    missing = absent & (df["status"] == "unsupported") & df["error"].str.contains(
        "not installed|does not import", na=False)
    return bool(((df["status"] == "ok") | missing).all())


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
    afresh; the row keeps the median of the trial medians and the lowest and highest."""
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
        variants=[Variant("torch_eager", traced("a")), Variant("triton_fused", traced("b"))])
    meta = dict(run_id="r", started_at="t", git_commit="c", gpu="g", sm_count=None, torch="x",
                triton="y", cuda="z")
    run([problem], tmp_path, device, meta, [], progress=False, trials=3)
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


def test_fingerprint_compare_lists_every_difference():
    compare = tool("fingerprint").compare

    a = {"k1": dict(launches=[dict(kernel="x", grid=[1])], out="ab"), "k2": dict(out="cd")}
    assert compare(a, dict(a)) == []
    b = dict(a, k1=dict(launches=[dict(kernel="x", grid=[2])], out="ab"), k3=dict(out="ef"))
    diffs = compare(a, b)
    assert len(diffs) == 2 and "only in one: k3" in diffs[0] and "differs: k1" in diffs[1]


# --- The softmax backward's problems, the --op filter, appending a run to a folder -----------------

def test_softmax_backward_traffic():
    rows, width, s = 3, 1000, 2
    e = rows * width * s
    fused = traffic.softmax_backward_kernels(rows, width, s, "triton_fused")
    assert traffic.total(fused) == 3 * e  # read y, dy; write dx
    assert traffic.total(traffic.softmax_backward_kernels(rows, width, s, "torch_eager")) == 3 * e
    unfused = traffic.softmax_backward_kernels(rows, width, s, "triton_unfused")
    # y and dy read twice, the float32 row sums written once and read once.
    assert [(k.read, k.written) for k in unfused] == [(2 * e, 4 * rows), (2 * e + 4 * rows, e)]
    two_pass = traffic.softmax_backward_kernels(rows, width, s, "triton_fused", two_pass=True)
    assert traffic.total(two_pass) == 5 * e
    assert traffic.softmax_backward_flops(rows, width) == 4 * rows * width


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


def smoke_problems(family, op=None):
    """The problems `--grid smoke --family FAMILY [--op OP]` measures, with the variants the run
    takes (families.select_problems: no max-autotune in the smoke grid)."""
    from types import SimpleNamespace

    args = SimpleNamespace(grid="smoke", family=[family], op=[op] if op else None, where=None)
    return families.select_problems(args)


def bwd_rows():
    """The rows of the first softmax_bwd problem of the smoke grid: one per implementation."""
    return len(smoke_problems("softmax", "softmax_bwd")[0].variants)


def all_bwd_rows():
    """The rows of every softmax_bwd problem of the smoke grid (the baselines but ours and eager
    at the first shape only)."""
    return sum(len(p.variants) for p in smoke_problems("softmax", "softmax_bwd"))


@pytest.fixture
def tiny_softmax_grid(monkeypatch):
    """Two shapes: a one-tile row (float16) and a two-pass row (float32) of the fused backward."""
    from triton_fusion_report.analysis.bench import reductions

    monkeypatch.setitem(reductions.GRIDS["smoke"], "softmax",
                        {torch.float32: [(1, 16400)], torch.float16: [(3, 33)]})


@FULL
def test_op_filter_sweeps_the_softmax_backward_alone(tmp_path, tiny_softmax_grid, device):
    """`--op softmax_bwd`: only the backward's rows, every implementation checked against float64
    through the interpreter and ok."""
    out = tmp_path / "run"
    assert cli.main(["--out", str(out), "--grid", "smoke", "--family", "softmax",
                     "--op", "softmax_bwd", "--no-progress",
                     "--workers", "1"]) == 0  # one process: the patched grid reaches it
    table = pq.read_table(out / "softmax.parquet")
    assert table.schema.names == schema.family_schema("softmax").names
    df = table.to_pandas()
    assert set(df["op"]) == {"softmax_bwd"} and set(df["direction"]) == {"bwd"}
    assert ok_or_peer_missing(df), df[df["status"] != "ok"][["impl", "error"]]
    assert len(df) == all_bwd_rows()
    fused = df[df["impl"] == "triton_fused"].set_index("width")["variant"]
    assert fused.to_dict() == {16400: "two_pass", 33: "one_tile"}
    assert (df["bytes_model"] == 3 * df["rows"] * df["width"] * df["dtype"].map(
        {"float32": 4, "float16": 2})).all()


def test_select_ops():
    from triton_fusion_report.analysis.bench import reductions

    problems = reductions.softmax_problems("smoke") + reductions.layernorm_problems("smoke")
    assert families.select_ops(problems, None) == problems
    kept = families.select_ops(problems, ["softmax_bwd", "layer_norm_bwd"])
    assert kept and {p.op for p in kept} == {"softmax_bwd", "layer_norm_bwd"}
    with pytest.raises(ValueError, match="--op softmax_backward: no such op.*softmax_bwd"):
        families.select_ops(problems, ["softmax", "softmax_backward"])


def test_op_filter_refuses_an_unknown_op_before_measuring(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--out", str(tmp_path / "run"), "--family", "softmax", "--op", "sofmax_bwd"])
    assert exit_.value.code == 2
    assert "--op sofmax_bwd: no such op" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # nothing measured, nothing written


def _fake_run(folder, run_id, rows):
    """A results folder of one run: the given softmax rows and a copy-bandwidth limit."""
    from triton_fusion_report.analysis.schema import ParquetSink, family_schema, limits_schema

    folder.mkdir()
    sink = ParquetSink(folder / "softmax.parquet", family_schema("softmax"))
    for row in rows:
        sink.append(dict(row, run_id=run_id, family="softmax", status="ok", sweep="size"))
    ParquetSink(folder / "limits.parquet", limits_schema()).append(
        dict(run_id=run_id, metric="copy_bw", precision="ieee", value=3000.0))


def test_append_run(tmp_path):
    """The backward's rows added to a folder whose softmax rows predate the direction column:
    the old rows read as the forward's, nothing else of them changes, the limits follow."""
    from triton_fusion_report.analysis.bench.append import append_run

    into = tmp_path / "into"
    into.mkdir()
    old = pd.DataFrame([dict(run_id="old", family="softmax", op="softmax", impl=i, dtype="float32",
                             rows=4, width=8, status="ok", sweep="size", block=None, ms_median=1.0)
                        for i in ("torch_eager", "triton_fused")])
    old.to_parquet(into / "softmax.parquet")  # no direction column, not every column
    pd.DataFrame([dict(run_id="old", metric="copy_bw", precision="ieee", value=2000.0)]).to_parquet(
        into / "limits.parquet")
    bwd = [dict(op="softmax_bwd", impl=i, dtype="float32", rows=4, width=8, direction="bwd",
                block=16 if i == "triton_fused" else None, ms_median=2.0)
           for i in ("torch_eager", "triton_fused")]
    _fake_run(tmp_path / "run", "new", bwd)

    assert append_run(tmp_path / "run", into) == {"softmax": 2, "limits": 1}
    table = pq.read_table(into / "softmax.parquet")
    assert table.schema.names == schema.family_schema("softmax").names
    df = table.to_pandas()
    assert df["direction"].tolist() == ["fwd", "fwd", "bwd", "bwd"]
    assert df["op"].tolist() == ["softmax", "softmax", "softmax_bwd", "softmax_bwd"]
    assert df["block"].isna().tolist() == [True, True, True, False]
    assert pd.read_parquet(into / "limits.parquet")["run_id"].tolist() == ["old", "new"]
    assert not (into / "runs.parquet").exists()  # the run has no run records to carry
    # A run with its record: the record follows its rows.
    _fake_run(tmp_path / "third", "third", [dict(bwd[0], rows=8)])
    pd.DataFrame([dict(run_id="third", status="finished", git_commit="a" * 40)]).to_parquet(
        tmp_path / "third" / "runs.parquet")
    assert append_run(tmp_path / "third", into) == {"softmax": 1, "limits": 1, "runs": 1}
    assert pd.read_parquet(into / "runs.parquet")["status"].tolist() == ["finished"]

    before = (into / "softmax.parquet").read_bytes()
    with pytest.raises(ValueError, match="already holds rows of run"):
        append_run(tmp_path / "run", into)
    # A new run of a configuration already there (its block column without nulls: int, not float).
    _fake_run(tmp_path / "again", "again", bwd[1:])
    with pytest.raises(ValueError, match="1 rows .* repeat configurations"):
        append_run(tmp_path / "again", into)
    assert (into / "softmax.parquet").read_bytes() == before  # a refusal changes nothing


def test_load_reads_old_softmax_rows_as_the_forward(tmp_path):
    """Rows from before the direction column are the forward's; a part the folder lacks (the
    backward) is empty, with every column, never borrowed from the reference."""
    import shutil

    from triton_fusion_report.analysis.book import data as D

    from conftest import reference_before_softmax_backward

    old = reference_before_softmax_backward(tmp_path / "old")
    shutil.copy(old / "limits.parquet", tmp_path / "limits.parquet")
    shutil.copy(old / "softmax.parquet", tmp_path / "softmax.parquet")
    assert "direction" not in pq.read_schema(tmp_path / "softmax.parquet").names
    fwd = D.load(tmp_path, "softmax")
    assert len(fwd) == pq.read_metadata(tmp_path / "softmax.parquet").num_rows
    assert (fwd["direction"] == "fwd").all()
    bwd = D.load(tmp_path, "softmax", op="softmax_bwd")
    assert len(bwd) == 0 and "ms_device" in bwd and "width" in bwd


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


def test_profile_parses_ncu_csv_and_attributes_kernels():
    """ncu's CSV (one line per kernel and metric, values with thousands separators, units that
    may be scaled) becomes one row per kernel in bytes; the marker kernels split them among the
    implementations in the order they ran."""
    from triton_fusion_report.analysis.bench import profile as P
    from triton_fusion_report.analysis.model import counters

    text = (Path(__file__).parent / "data" / "ncu_synthetic.csv").read_text()
    kernels = P.parse_ncu_csv(text)
    assert kernels["id"].tolist() == [0, 1, 2, 3, 4]
    assert kernels.loc[1, "dram__bytes_read.sum"] == 2**29
    assert kernels.loc[4, "dram__bytes_write.sum"] == pytest.approx(2**28)
    rows = P.attribute(kernels, ["torch_eager", "triton_fused"])
    assert rows["impl"].tolist() == ["torch_eager", "torch_eager", "triton_fused"]
    with pytest.raises(ValueError, match="2 marker kernels for 3"):
        P.attribute(kernels, ["a", "b", "c"])
    with pytest.raises(ValueError, match="no ncu CSV"):
        P.parse_ncu_csv("==PROF== nothing profiled\n")
    table = pd.DataFrame([dict(family="elementwise", op="add_mul", impl=r["impl"],
                               kernel=r["kernel"], dram_read=r["dram__bytes_read.sum"],
                               dram_write=r["dram__bytes_write.sum"], status="ok",
                               bytes_model_impl={"torch_eager": 6, "triton_fused": 4}[r["impl"]]
                               * 2**28, bytes_model=4 * 2**28)
                          for r in rows.to_dict("records")])
    s = counters.summary(table).set_index("impl")
    assert s.loc["torch_eager", "kernels"] == 2
    assert s.loc["torch_eager", "measured_over_model"] == pytest.approx(1.0)
    assert s.loc["triton_fused", "measured"] == 4 * 2**28


def test_profile_fusion_ratios_side_by_side_per_gpu():
    """Two GPUs' profiles give one row per op: the model's ratio once, each GPU's counters beside
    it under its own label; an op only one GPU profiled keeps its row with a gap for the other."""
    from triton_fusion_report.analysis.bench import profile as P
    from triton_fusion_report.analysis.model import counters

    def rows(op_bytes):
        return pd.DataFrame([dict(family="f", op=op, impl=impl, kernel="k", dram_read=b,
                                  dram_write=0.0, status="ok", bytes_model_impl=model,
                                  bytes_model=100.0)
                             for op, (un, fu) in op_bytes.items()
                             for impl, b, model in (("triton_unfused", un, 300.0),
                                                    ("triton_fused", fu, 100.0))])

    h100 = rows({"a": (300.0, 100.0), "b": (400.0, 200.0)})
    h200 = rows({"a": (330.0, 110.0)})
    one = counters.fusion_ratios_by_gpu({"H100": h100})
    assert list(one.columns) == ["op", "model_ratio", "measured_ratio", "fused_measured_over_model"]
    both = counters.fusion_ratios_by_gpu({"H100": h100, "H200": h200}).set_index("op")
    assert list(both.columns) == ["model_ratio", "measured_ratio (H100)",
                                  "fused_measured_over_model (H100)", "measured_ratio (H200)",
                                  "fused_measured_over_model (H200)"]
    assert both.loc["a", "model_ratio"] == pytest.approx(3.0)
    assert both.loc["a", "fused_measured_over_model (H200)"] == pytest.approx(1.1)
    assert both.loc["b", "measured_ratio (H100)"] == pytest.approx(2.0)
    assert pd.isna(both.loc["b", "measured_ratio (H200)"])


def test_profile_cases_exist_in_the_grids():
    """Every profiled configuration is one the sweep measures."""
    from triton_fusion_report.analysis.bench import profile as P

    for case in P.CASES:
        problem = P.find_problem(case)
        assert {"triton_fused", "torch_eager"} <= {v.impl for v in P.profiled_variants(problem)}


def test_profile_case_past_its_time_is_killed_with_its_children(tmp_path, monkeypatch):
    """A case that hangs under ncu (its worker stuck) is killed, process group and all, and
    returns why, so that the next case runs; a failing ncu returns its output."""
    import time

    from triton_fusion_report.analysis.bench import profile as P

    hung = tmp_path / "ncu_hangs"
    hung.write_text("#!/bin/sh\necho 'profile worker: warming liger' >&2\nsleep 60 &\nsleep 60\n")
    failing = tmp_path / "ncu_fails"
    failing.write_text("#!/bin/sh\necho 'ncu: no such device' >&2\nexit 3\n")
    for f in (hung, failing):
        f.chmod(0o755)
    monkeypatch.setattr(P, "CASE_TIMEOUT_S", 1)
    t0 = time.perf_counter()
    info, why = P._ncu_run(0, str(hung), tmp_path, [], "")
    assert info is None and time.perf_counter() - t0 < 10
    assert "ran past 1 s" in why and "warming liger" in why
    info, why = P._ncu_run(0, str(failing), tmp_path, [], "")
    assert info is None and "no such device" in why


def test_profile_parses_a_recorded_ncu_run():
    """ncu 2025 on the H100 (make profile, add-mul at 2^26 float32, five implementations): the
    fused kernel reads x, y and z once (the model's 805 MB) and the unfused pair 1074 MB."""
    import json

    from triton_fusion_report.analysis.bench import profile as P

    kernels = P.parse_ncu_csv((Path(__file__).parent / "data" / "ncu_add_mul_h100.csv").read_text())
    order = ["torch_eager", "triton_unfused", "triton_fused", "torch_compile", "torch_compile_max"]
    rows = P.attribute(kernels, order)
    per = rows.groupby("impl", sort=False)
    assert per.size().to_dict() == {"torch_eager": 2, "triton_unfused": 2, "triton_fused": 1,
                                    "torch_compile": 1, "torch_compile_max": 1}
    read = per["dram__bytes_read.sum"].sum() / 2**20
    assert read["triton_fused"] == pytest.approx(3 * 256, rel=0.01)
    assert read["triton_unfused"] == pytest.approx(4 * 256, rel=0.01)
    json.dumps(rows.to_dict("records"))  # plain values


def test_profile_reads_ncu_details_pages():
    """The committed details pages (ncu --page details --csv on the H100): one row per kernel,
    units converted (ns -> us, bytes -> kB, thousands separators), sections not collected
    missing; detail_view names every kernel or refuses."""
    from triton_fusion_report.analysis.bench import profile as P

    folder = Path(__file__).parents[1] / "results" / "reference" / "h100"
    before = P.ncu_details((folder / "ncu_linear_gelu_5cbecbb.csv").read_text())
    after = P.ncu_details((folder / "ncu_linear_gelu_c94faa2.csv").read_text())
    assert list(before["kernel"]) == ["_matmul_tma_kernel"] * 2 + ["_activation_kernel"]
    assert before.loc[0, "duration_us"] == pytest.approx(1732.032)
    assert before.loc[0, "spill_requests"] == 1033248 and after.loc[0, "spill_requests"] == 0
    assert before.loc[0, "registers"] == 255 and before.loc[0, "smem_kb"] == pytest.approx(180.248)
    assert "occupancy_pct" in before and "occupancy_pct" not in after
    view = P.detail_view(after, ["fused", "matmul", "activation"])
    assert list(view["kernel"]) == ["fused", "matmul", "activation"] and "spills" in view
    with pytest.raises(ValueError, match="2 labels for 3"):
        P.detail_view(after, ["a", "b"])
    with pytest.raises(ValueError, match="no ncu CSV"):
        P.ncu_details("==PROF== nothing\n")


def _details_with_markers(text: str) -> str:
    """A recorded details page with a marker kernel before each of its kernels (as the profile
    worker launches them), the IDs renumbered."""
    import csv
    import io

    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    reader = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=reader.fieldnames, quoting=csv.QUOTE_ALL)
    writer.writeheader()
    last = None
    for row in reader:
        kid = int(row["ID"])
        if kid != last:
            marker = {k: "" for k in reader.fieldnames}
            marker.update({"ID": str(2 * kid), "Kernel Name": "profile_marker",
                           "Metric Name": "Duration", "Metric Unit": "ns",
                           "Metric Value": "1,500"})
            writer.writerow(marker)
            last = kid
        writer.writerow(dict(row, ID=str(2 * kid + 1)))
    return "\n".join(lines[:start]) + "\n" + out.getvalue()


def test_profile_details_pair_our_kernel_with_the_fastest_other():
    """--details: the details page's kernels split among the implementations by the markers
    (which are dropped), one row per kernel with its metrics, failures as rows of their own;
    target_counters keeps our fused kernel and the fastest other implementation."""
    from triton_fusion_report.analysis.bench import profile as P
    from triton_fusion_report.analysis.model import counters as K
    folder = Path(__file__).parents[1] / "results" / "reference" / "h100"
    recorded = P.ncu_details((folder / "ncu_softmax_v_5cbecbb.csv").read_text())
    details = P.ncu_details(_details_with_markers(
        (folder / "ncu_softmax_v_5cbecbb.csv").read_text()))
    assert len(details) == 2 * len(recorded) == 4
    info = dict(order=["triton_fused", "sdpa_cudnn"], failed={"flag_gems": "ImportError: no"},
                variants={"triton_fused": None, "sdpa_cudnn": "cudnn"})
    base = dict(family="softmax_matmul", op="softmax_matmul", gpu="NVIDIA H100 80GB HBM3")
    rows = pd.DataFrame(P.details_rows(base, details, info))
    assert rows["impl"].tolist() == ["triton_fused", "sdpa_cudnn", "flag_gems"]
    assert rows["status"].tolist() == ["ok", "ok", "failed"]
    assert rows.loc[0, "duration_us"] == pytest.approx(recorded.loc[0, "duration_us"])
    assert rows.loc[1, "registers"] == recorded.loc[1, "registers"]
    assert "profile_marker" not in set(rows["kernel"].dropna())
    # A third implementation, slower than cuDNN: the pair is still ours and the fastest other.
    slow = rows.iloc[[1]].assign(impl="torch_eager", duration_us=1e6)
    unfused = rows.iloc[[1]].assign(impl="triton_unfused", duration_us=1.0)
    alone = rows.iloc[[1]].assign(impl="cublas", duration_us=1.0)  # the matmul alone: no rival
    counters = K.target_counters(pd.concat([rows, slow, unfused, alone], ignore_index=True))
    assert counters["impl"].tolist() == ["triton_fused", "sdpa_cudnn"]
    # A kernel of unknown duration leaves its implementation out; no ok row, an empty table.
    unknown = rows.iloc[[1]].assign(impl="torch_compile", duration_us=float("nan"))
    assert "torch_compile" not in set(K.details_summary(pd.concat([rows, unknown]))["impl"])
    failed = rows[rows["status"] == "failed"]
    assert len(K.target_counters(failed)) == 0 and "impl" in K.target_counters(failed)
    assert len(K.details_summary(pd.DataFrame([dict(status="failed")]))) == 0



def test_profile_details_case_reports_a_failed_ncu(tmp_path):
    """An ncu that fails (no counters allowed, a bad section) is a failed row with its message,
    not a crash that loses the other cases."""
    from triton_fusion_report.analysis.bench import profile as P

    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\necho '==ERROR== ERR_NVGPUCTRPERM: no permission' >&2\nexit 1\n")
    fake.chmod(0o755)
    case = next(i for i, c in enumerate(P.CASES) if c[0] == "attention")
    rows = P.details_case(case, str(fake), tmp_path, dict(gpu="x"))
    assert len(rows) == 1 and rows[0]["status"] == "failed"
    assert "ERR_NVGPUCTRPERM" in rows[0]["error"] and rows[0]["family"] == "attention"
    assert {c[0] for c in P.CASES if c[0] in P.DETAIL_FAMILIES} == set(P.DETAIL_FAMILIES)
    # ncu exits 0 but its log holds no table: a failed row too, the other cases go on.
    fake.write_text("#!" + sys.executable + "\nimport json, sys\na = sys.argv\n"
                    "open(a[a.index('--log-file') + 1], 'w').write('==PROF== nothing\\n')\n"
                    "open(a[a.index('--order') + 1], 'w').write(json.dumps(dict(order=['x'], "
                    "failed={}, variants={}, bytes_impl={})))\n")
    rows = P.details_case(case, str(fake), tmp_path, dict(gpu="x"))
    assert len(rows) == 1 and rows[0]["status"] == "failed" and "no ncu CSV" in rows[0]["error"]
    rows = P.profile_case(case, str(fake), tmp_path, dict(gpu="x"))
    assert len(rows) == 1 and rows[0]["status"] == "failed" and "no ncu CSV" in rows[0]["error"]


def test_profile_by_case_keeps_the_other_cases(tmp_path):
    """A pass split over calls (--case): the rows of the cases not run again stay in the file,
    those of the cases run again are replaced."""
    from triton_fusion_report.analysis.bench import profile as P

    path = tmp_path / "profile_details.parquet"
    assert P.kept_rows(path, [0]) == []
    rows = [dict(family=f, op=o, dtype=d, impl="triton_fused", status="ok")
            for f, o, d, _ in P.CASES[:3]]
    pd.DataFrame(rows).to_parquet(path)
    kept = P.kept_rows(path, [1])
    assert [r["op"] for r in kept] == [P.CASES[0][1], P.CASES[2][1]]


def test_each_worker_keeps_its_own_cpus():
    """Workers on one host take disjoint, equal slices of its CPUs (so one's compiles cannot
    steal another's timing thread), and share them all where there are too few to split."""
    from triton_fusion_report.analysis.bench.workers import cpu_share

    cpus = set(range(64))
    slices = [cpu_share(cpus, k, 4) for k in range(4)]
    assert [len(s) for s in slices] == [16] * 4
    assert sorted(c for s in slices for c in s) == sorted(cpus)
    assert cpu_share({0, 1, 2, 3, 4, 5, 6}, 2, 3) == [4, 5, 6]
    assert cpu_share({0, 1, 2}, 1, 2) == [0, 1, 2]


# Workers are processes on GPUs of their own; on the CPU (the interpreter) they share it.
two_workers = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2,
                                 reason="two workers need two GPUs")


def test_more_workers_than_gpus_is_refused(tmp_path, monkeypatch, capsys):
    """Two workers on one GPU would time each other's kernels: refused with the arguments, before
    anything (a --resume's merge included) touches the folder."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--out", str(tmp_path / "run"), "--grid", "smoke", "--family", "elementwise",
                  "--device", "cuda", "--workers", "2", "--no-progress"])
    assert exit_.value.code == 2 and "--workers 2: 1 GPU(s) visible" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@FULL
@two_workers
def test_workers_share_the_problems_and_merge(tmp_path):
    """--workers 2: each configuration measured once, by one of two processes (each its own run,
    limits and run record), merged into the folder as one run's files; no parts left behind."""
    out = tmp_path / "run"
    assert cli.main(["--out", str(out), "--grid", "smoke", "--family", "elementwise",
                     "--workers", "2", "--no-progress"]) == 0
    df = pd.read_parquet(out / "elementwise.parquet")
    expected = sum(len(p.variants) for p in smoke_problems("elementwise"))
    keys = ["op", "impl", "dtype", "n", "z_kind", "sweep", "block"]
    assert len(df) == expected and not df.duplicated(keys).any()
    assert (df["status"] == "ok").all(), df[df["status"] != "ok"][["impl", "error"]]
    runs = pd.read_parquet(out / "runs.parquet")
    assert len(runs) == 2 and (runs["status"] == "finished").all()
    assert set(df["run_id"]) <= set(runs["run_id"]) and runs["rows"].sum() == len(df)
    assert set(pd.read_parquet(out / "limits.parquet")["run_id"]) == set(runs["run_id"])
    assert not (out / ".parts").exists()


def _dies_in_the_second_problem(monkeypatch):
    """A sweep stopped part way: sweep._run_problem raises after the first row of the second
    problem from now on. Returns the real one (to put back for the resume)."""
    from triton_fusion_report.analysis.bench import sweep

    real = sweep._run_problem
    seen = []

    def dies_in_the_second(problem, *args):
        seen.append(problem)
        for i, row in enumerate(real(problem, *args)):
            if len(seen) == 2 and i == 1:
                raise RuntimeError("killed")
            yield row

    monkeypatch.setattr(sweep, "_run_problem", dies_in_the_second)
    return real


@FULL
@two_workers
def test_resume_with_workers_after_a_stopped_bench(tmp_path, monkeypatch, capsys):
    """A multi-worker bench killed part way leaves its parts unmerged: --resume --workers 2 merges
    them, marks the unfinished run stopped, drops its half-written problem and has new workers
    measure only that one; every configuration ends up in the folder once. (The workers are
    spawned processes: they build the real smoke grid, so the test uses it too.) A part that is
    already merged (a failed worker's) is not merged twice."""
    from triton_fusion_report.analysis.bench import run as bench_run, sweep

    out = tmp_path / "run"
    base = ["--grid", "smoke", "--family", "softmax", "--op", "softmax_bwd", "--no-progress",
            "--workers", "1"]  # one process unless a test says more (a later --workers wins)
    problems = smoke_problems("softmax", "softmax_bwd")
    assert len(problems) >= 2
    real = _dies_in_the_second_problem(monkeypatch)
    part = out / ".parts" / "worker0"
    with pytest.raises(RuntimeError, match="killed"):  # as worker 0 of a bench, then stopped
        cli.main(["--out", str(part), *base])
    stopped = pd.read_parquet(part / "runs.parquet")["run_id"].iloc[0]
    monkeypatch.setattr(sweep, "_run_problem", real)
    bench_run.merge([part], out)  # as a failed worker's part: in the folder already

    assert cli.main(["--out", str(out), *base, "--workers", "2", "--resume"]) == 0
    assert f"1 of {len(problems)} problems done" in capsys.readouterr().out
    df = pd.read_parquet(out / "softmax.parquet")
    n = [len(p.variants) for p in problems]
    keys = ["impl", "dtype", "rows", "width", "variant"]
    assert len(df) == sum(n) and not df.duplicated(keys).any()
    new = df[df["run_id"] != stopped]
    shapes = {(p.shape["rows"], p.shape["width"], str(p.dtype)[6:]) for p in problems[1:]}
    assert len(new) == sum(n[1:])
    assert set(zip(new["rows"], new["width"], new["dtype"])) == shapes
    assert (df["run_id"] == stopped).sum() == n[0]  # its finished problem kept, not the partial
    runs = pd.read_parquet(out / "runs.parquet").set_index("run_id")
    assert runs.loc[stopped, "status"] == "stopped" and len(runs) == 3
    assert (runs.drop(index=stopped)["status"] == "finished").all()
    assert not (out / ".parts").exists()
    with pytest.raises(SystemExit, match="no unfinished run"):
        cli.main(["--out", str(out), *base, "--workers", "2", "--resume"])


@FULL
@pytest.mark.parametrize("worker_finished", [True, False])
def test_resume_after_a_bench_stopped_in_its_merge(tmp_path, tiny_softmax_grid, monkeypatch,
                                                   capsys, worker_finished):
    """The bench stopped in its final merge (the family files written, not yet the limits and
    run records): --resume merges the parts once (no row twice, so nothing measured again), and
    where every worker had finished it completes the folder instead of refusing ("none
    running") and leaving it without limits."""
    from triton_fusion_report.analysis.bench import append, run as bench_run, sweep

    out = tmp_path / "run"
    base = ["--grid", "smoke", "--family", "softmax", "--op", "softmax_bwd", "--no-progress",
            "--workers", "1"]  # one process unless a test says more (a later --workers wins)
    part = out / ".parts" / "worker0"
    real = _dies_in_the_second_problem(monkeypatch) if not worker_finished else None
    if worker_finished:
        assert cli.main(["--out", str(part), *base]) == 0
    else:
        with pytest.raises(RuntimeError, match="killed"):
            cli.main(["--out", str(part), *base])
        monkeypatch.setattr(sweep, "_run_problem", real)

    def stopped(*args, **kw):
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(append, "merged_by_run", stopped)
        with pytest.raises(KeyboardInterrupt):
            bench_run.merge([part], out)
    assert (out / "softmax.parquet").exists() and not (out / "runs.parquet").exists()
    capsys.readouterr()
    if worker_finished:
        with pytest.raises(SystemExit, match="merged .*nothing to measure"):
            cli.main(["--out", str(out), *base, "--resume"])
    else:
        assert cli.main(["--out", str(out), *base, "--resume"]) == 0
        assert "1 of 2 problems done" in capsys.readouterr().out
    df = pd.read_parquet(out / "softmax.parquet")
    assert len(df) == all_bwd_rows()
    assert not df.duplicated(["impl", "dtype", "rows", "width"]).any()
    assert pd.read_parquet(out / "limits.parquet").run_id.nunique() == 1
    assert not (out / ".parts").exists()


def _workers_in_this_process(monkeypatch):
    """workers.run's processes run in this process, one after the other (so a test's patches
    reach them); a worker that raises exits as a process that died."""
    import copy
    import multiprocessing
    import queue as queues

    from triton_fusion_report.analysis.bench import workers

    class InProcess:
        def __init__(self, target, args, daemon):  # its own copy of the options, as a spawn's
            k, options, *shared = args
            self.target, self.args, self.exitcode = target, (k, copy.copy(options), *shared), None

        def start(self):
            # A worker sets its GPU as the current device: in this process that would outlive
            # the test (and a CUDA graph replayed by a later test on two GPUs crashed).
            before = torch.cuda.current_device() if torch.cuda.is_available() else None
            try:
                self.target(*self.args)
                self.exitcode = 0
            except Exception:  # noqa: BLE001 - as a process that died
                self.exitcode = 1
            finally:
                if before is not None:
                    torch.cuda.set_device(before)

        def is_alive(self):
            return False

    class Context:
        Process, Queue, Value = InProcess, queues.Queue, staticmethod(multiprocessing.Value)

    monkeypatch.setattr(workers.mp, "get_context", lambda _: Context)


@FULL
@two_workers
def test_a_worker_that_dies_fails_the_bench(tmp_path, tiny_softmax_grid, monkeypatch, capsys):
    """A worker that dies (its problem half done, taken off the queue: no one measures it) makes
    the bench exit non-zero, so `make bench`/`make report` stop rather than render a folder with
    configurations missing; what was measured is merged and --resume measures the rest. (The
    workers run in this process here, one after the other, so the patched sweep reaches them.)"""
    from triton_fusion_report.analysis.bench import sweep

    _workers_in_this_process(monkeypatch)
    real = _dies_in_the_second_problem(monkeypatch)  # worker 0 dies in the second problem
    out = tmp_path / "run"
    argv = ["--out", str(out), "--grid", "smoke", "--family", "softmax", "--op", "softmax_bwd",
            "--no-progress", "--workers", "2"]
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code not in (0, None) and "workers [0] failed" in str(exit_.value.code)
    assert len(pd.read_parquet(out / "softmax.parquet")) == bwd_rows() + 1
    monkeypatch.setattr(sweep, "_run_problem", real)
    assert cli.main(argv + ["--resume"]) == 0
    assert len(pd.read_parquet(out / "softmax.parquet")) == all_bwd_rows()


@two_workers
def test_workers_that_all_die_before_a_row_fail_the_bench(tmp_path, monkeypatch):
    """Every worker dead before its first row: the bench exits non-zero with its own message (no
    parts to keep), the folder holds no family file."""
    from triton_fusion_report.analysis.bench import workers

    _workers_in_this_process(monkeypatch)

    def dies_at_once(*args):
        raise RuntimeError("CUDA unavailable")

    monkeypatch.setattr(workers, "_worker", dies_at_once)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--out", str(out), "--grid", "smoke", "--family", "softmax", "--op",
                  "softmax_bwd", "--no-progress", "--workers", "2"])
    assert str(exit_.value.code) == ("workers [0, 1] failed: none wrote a row; --resume "
                                     "measures what is missing")
    assert not (out / "softmax.parquet").exists() and not (out / ".parts-merged").exists()


@two_workers
def test_resume_refused_leaves_the_folder_as_it_was(tmp_path, tiny_softmax_grid, monkeypatch):
    """A resume refused (another commit) changes nothing: the stopped parts stay unmerged."""
    from triton_fusion_report.analysis.bench import machine, sweep

    out = tmp_path / "run"
    base = ["--grid", "smoke", "--family", "softmax", "--op", "softmax_bwd", "--no-progress",
            "--workers", "1"]  # one process unless a test says more (a later --workers wins)
    real = sweep._run_problem

    def dies(problem, *args):
        yield next(real(problem, *args))
        raise RuntimeError("killed")

    monkeypatch.setattr(sweep, "_run_problem", dies)
    with pytest.raises(RuntimeError, match="killed"):
        cli.main(["--out", str(out / ".parts" / "worker0"), *base])
    meta = machine.run_metadata
    monkeypatch.setattr(machine, "run_metadata", lambda d: {**meta(d), "git_commit": "0" * 40})
    for extra in (["--workers", "2"], ["--workers", "1"]):
        with pytest.raises(SystemExit, match="git_commit"):
            cli.main(["--out", str(out), *base, *extra, "--resume"])
        assert (out / ".parts" / "worker0" / "softmax.parquet").exists()
        assert not (out / "softmax.parquet").exists()


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


def test_where_that_matches_nothing_is_refused_before_measuring(tmp_path, capsys):
    """A --where column or value that no problem has is an error naming the columns there are,
    not a run that measures nothing and says it finished."""
    for where in ("sequ=4096", "rows=123456789"):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["--out", str(tmp_path / "run"), "--grid", "smoke", "--family", "softmax",
                      "--where", where, "--no-progress"])
        assert exit_.value.code == 2
        assert f"--where {where}: no problem" in capsys.readouterr().err
        assert not (tmp_path / "run").exists()


def test_a_new_run_into_a_folder_with_its_family_is_refused(tmp_path, tiny_softmax_grid,
                                                           capsys, monkeypatch):
    """A run (not --resume) into a folder that holds rows of its family, or a stopped bench's
    parts, is refused before measuring: it would start the family's file afresh and drop the
    earlier run's rows (whose record would still say it finished)."""
    from triton_fusion_report.analysis.bench import machine

    # The machine's limits are beside the point here (on a GPU, seconds of copies and matmuls).
    monkeypatch.setattr(machine, "measure_limits", lambda device, meta: [dict(
        meta, metric="copy_bw", dtype="float32", precision="ieee", value=None, unit="GB/s",
        detail="not measured in this test")])
    out = tmp_path / "run"
    base = ["--out", str(out), "--grid", "smoke", "--family", "softmax", "--where", "width=33",
            "--no-progress", "--workers", "1"]  # one process: the patched grid reaches it
    assert cli.main(base + ["--op", "softmax_bwd"]) == 0
    before = (out / "softmax.parquet").read_bytes()
    for workers in ("1", "2"):
        with pytest.raises(SystemExit) as exit_:
            cli.main(base + ["--op", "softmax", "--workers", workers])
        assert exit_.value.code == 2 and "already holds softmax rows" in capsys.readouterr().err
    assert (out / "softmax.parquet").read_bytes() == before
    (out / "softmax.parquet").rename(tmp_path / "kept.parquet")
    (out / ".parts" / "worker0").mkdir(parents=True)
    with pytest.raises(SystemExit):
        cli.main(base + ["--op", "softmax", "--workers", "2"])
    assert "--resume continues it" in capsys.readouterr().err
    assert (out / ".parts" / "worker0").exists()


def test_resume_continues_the_same_run(tmp_path, tiny_softmax_grid, monkeypatch, capsys):
    """A run stopped half way (here after the first problem and one row of the second) is
    continued by --resume: the same run id and limits, the finished problem not measured again,
    the partial one measured afresh, every configuration once; a finished run or another commit
    is refused."""
    from triton_fusion_report.analysis.bench import machine, sweep

    out = tmp_path / "run"
    argv = ["--out", str(out), "--grid", "smoke", "--family", "softmax", "--op", "softmax_bwd",
            "--no-progress", "--workers", "1"]  # one process: the patches reach it
    real = _dies_in_the_second_problem(monkeypatch)
    with pytest.raises(RuntimeError, match="killed"):
        cli.main(argv)
    first = pd.read_parquet(out / "softmax.parquet")
    run_id = first["run_id"].iloc[0]
    assert len(first) == bwd_rows() + 1
    assert pd.read_parquet(out / "runs.parquet")["status"].tolist() == ["running"]
    n_limits = len(pd.read_parquet(out / "limits.parquet"))

    monkeypatch.setattr(sweep, "_run_problem", real)
    assert cli.main(argv + ["--resume"]) == 0
    assert "1 of 2 problems done" in capsys.readouterr().out
    df = pd.read_parquet(out / "softmax.parquet")
    assert set(df["run_id"]) == {run_id} and len(df) == all_bwd_rows()
    assert not df.duplicated(["impl", "dtype", "rows", "width", "variant"]).any()
    assert len(pd.read_parquet(out / "limits.parquet")) == n_limits  # not measured again
    runs = pd.read_parquet(out / "runs.parquet")
    assert runs["status"].tolist() == ["finished"] and runs["rows"].iloc[0] == all_bwd_rows()
    assert runs["argv"].iloc[0].count("--op softmax_bwd") == 2

    with pytest.raises(SystemExit, match="no unfinished run"):
        cli.main(argv + ["--resume"])
    runs_sink = schema.ParquetSink(out / "runs.parquet", schema.runs_schema(), keep_existing=True)
    runs_sink.rows[0]["status"] = "running"
    runs_sink.flush()
    other = machine.run_metadata
    monkeypatch.setattr(machine, "run_metadata",
                        lambda d: dict(other(d), git_commit="0" * 40))
    with pytest.raises(SystemExit, match="git_commit"):
        cli.main(argv + ["--resume"])


@FULL
def test_a_folder_being_written_is_refused_to_a_second_process(tmp_path, tiny_softmax_grid,
                                                              monkeypatch):
    """A --resume (or run) into a folder whose run is still going (a session thought lost) is
    refused: both rewriting the files from their own rows lost one's rows (7 of 14 left, the
    record saying 14)."""
    from triton_fusion_report.analysis.bench import sweep

    out = tmp_path / "run"
    argv = ["--out", str(out), "--grid", "smoke", "--family", "softmax", "--op", "softmax_bwd",
            "--no-progress", "--workers", "1"]  # one process: the patches reach it
    real, calls, refused = sweep._run_problem, [], []

    def second_process_meanwhile(problem, *args):
        calls.append(problem)
        if len(calls) == 2:  # the first problem's rows are written: a resume is started
            with pytest.raises(SystemExit, match="being written by another process") as exc:
                cli.main(argv + ["--resume"])
            refused.append(exc)
        return real(problem, *args)

    monkeypatch.setattr(sweep, "_run_problem", second_process_meanwhile)
    assert cli.main(argv) == 0
    assert refused
    assert len(pd.read_parquet(out / "softmax.parquet")) == all_bwd_rows()
    assert pd.read_parquet(out / "runs.parquet")["rows"].tolist() == [all_bwd_rows()]


@FULL
@two_workers
def test_resume_with_workers_after_a_worker_stopped_in_its_limits(tmp_path, monkeypatch, capsys):
    """A worker killed while it measured the limits left a running record and nothing else:
    --resume --workers 2 takes it as stopped (it has no rows to check or adopt) and measures
    everything, once (it was refused with "git_commit=None")."""
    from triton_fusion_report.analysis.bench import machine

    out = tmp_path / "run"
    base = ["--grid", "smoke", "--family", "softmax", "--op", "softmax_bwd", "--no-progress",
            "--workers", "1"]  # one process unless a test says more (a later --workers wins)
    problems = smoke_problems("softmax", "softmax_bwd")
    real = machine.measure_limits

    def killed(*args, **kwargs):
        raise RuntimeError("killed while measuring the limits")
    monkeypatch.setattr(machine, "measure_limits", killed)
    part = out / ".parts" / "worker0"
    with pytest.raises(RuntimeError, match="killed"):
        cli.main(["--out", str(part), *base])
    monkeypatch.setattr(machine, "measure_limits", real)
    assert cli.main(["--out", str(out), *base, "--workers", "2", "--resume"]) == 0
    df = pd.read_parquet(out / "softmax.parquet")
    assert len(df) == sum(len(p.variants) for p in problems)
    assert not df.duplicated(["impl", "dtype", "rows", "width", "variant"]).any()


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


def _a_finished_run(dst: Path, commit: str = "c" * 40, run_id: str = "20261126T000000Z-abcdef"):
    """The smoke run's files relabelled as one finished run at one clean commit."""
    import shutil

    smoke = Path(__file__).parent / "data" / "smoke"
    dst.mkdir(parents=True, exist_ok=True)
    for path in smoke.glob("*.parquet"):
        df = pd.read_parquet(path)
        df["run_id"], df["git_commit"] = run_id, commit
        if path.name == "runs.parquet":  # a smoke run, relabelled as the full grid's too
            df["git_clean"] = True
            df["argv"] = df["argv"].str.replace("--grid smoke", "--grid full")
        df.to_parquet(dst / path.name)
    shutil.copy(smoke / "limits.parquet", dst / "limits.parquet")
    lim = pd.read_parquet(dst / "limits.parquet").assign(run_id=run_id, git_commit=commit)
    lim.to_parquet(dst / "limits.parquet")
    (dst / "launch_cost.csv").write_text("op,us\nsoftmax,1\n")
    return dst


def test_promote_replaces_the_reference_with_one_clean_run(tmp_path):
    promote = tool("promote")

    run = _a_finished_run(tmp_path / "run")
    into = tmp_path / "ref"
    into.mkdir()
    for name in ("softmax.parquet", "old_only.parquet", "host_overhead.csv", "ncu_x_abc.csv"):
        (into / name).write_text("old")
    assert promote.problems(run) == []
    assert promote.main([str(run), str(into)]) == 0
    names = {p.name for p in into.iterdir()}
    assert "old_only.parquet" not in names and "host_overhead.csv" not in names
    assert {"ncu_x_abc.csv", "launch_cost.csv", "softmax.parquet", "runs.parquet"} <= names
    assert pd.read_parquet(into / "softmax.parquet")["run_id"].unique().tolist() == \
        ["20261126T000000Z-abcdef"]


def test_promote_refuses_a_patchwork(tmp_path):
    promote = tool("promote")

    run = _a_finished_run(tmp_path / "run")
    df = pd.read_parquet(run / "softmax.parquet")
    df.loc[df.index[0], "run_id"] = "20261125T000000Z-other0"
    df.to_parquet(run / "softmax.parquet")
    rec = pd.read_parquet(run / "runs.parquet").assign(status="running", git_clean=False)
    rec["argv"] = rec["argv"].str.replace("--grid full", "--grid book")
    rec.to_parquet(run / "runs.parquet")
    (run / "attention.parquet").unlink()
    why = "\n".join(promote.problems(run))
    for expected in ("running", "not clean", "attention.parquet is missing", "softmax.parquet: run_id",
                     "not the full grid"):
        assert expected in why
    into = tmp_path / "ref"
    into.mkdir()
    (into / "softmax.parquet").write_text("old")
    assert promote.main([str(run), str(into)]) == 1
    assert (into / "softmax.parquet").read_text() == "old"


def test_promote_takes_a_later_step_only_where_it_measures_the_same(tmp_path, monkeypatch):
    """A later step's file (the profile's details) from another commit is accepted where what it
    measures is the same at both commits, refused where it differs or no commit is recorded;
    the sweep's files must be the run's commit whatever the code."""
    promote = tool("promote")

    run = _a_finished_run(tmp_path / "run")
    later = "d" * 40
    pd.DataFrame(dict(git_commit=[later], family=["attention"])).to_parquet(
        run / "profile_details.parquet")
    same = {("c" * 40, later)}
    monkeypatch.setattr(promote, "same_measured", lambda a, b, name="": (a, b) in same)
    assert promote.problems(run) == []
    same.clear()
    assert any("profile_details.parquet: git_commit" in w and "measures differs" in w
               for w in promote.problems(run))
    same.add(("c" * 40, later))
    pd.DataFrame(dict(git_commit=[None], family=["attention"])).to_parquet(
        run / "profile_details.parquet")
    assert any("no commit recorded" in w for w in promote.problems(run))
    pd.DataFrame(dict(git_commit=[later], family=["attention"])).to_parquet(
        run / "profile_details.parquet")
    df = pd.read_parquet(run / "softmax.parquet").assign(git_commit=later)
    df.to_parquet(run / "softmax.parquet")
    assert any(w.startswith("softmax.parquet: git_commit") for w in promote.problems(run))


def test_promote_asks_git_what_changed():
    """same_measured on this repository's history: d3667c4 and 45020ef differ in kernels/
    (refused); d3667c4 and f00a44d differ only in modules that measure nothing (the profile's
    reader, promote, the report): accepted; by 95ab8e4 timing.py changed, which seed 002's
    benchmark uses (refused for it, not for the profile's details); an unknown commit: refused."""
    promote = tool("promote")

    import subprocess

    from triton_fusion_report.analysis.bench import machine

    full = {}
    for short in ("d3667c4", "45020ef", "f00a44d", "95ab8e4"):
        try:
            full[short] = machine.git("rev-parse", "--verify", "--quiet", f"{short}^{{commit}}")
        except (OSError, subprocess.CalledProcessError):
            pytest.skip("not a checkout with this repository's history")
    assert promote.same_measured(full["d3667c4"], full["d3667c4"])
    assert not promote.same_measured(full["d3667c4"], full["45020ef"])
    assert promote.same_measured(full["d3667c4"], full["f00a44d"], "profile_details.parquet")
    assert promote.same_measured(full["d3667c4"], full["95ab8e4"], "profile_details.parquet")
    assert not promote.same_measured(full["d3667c4"], full["95ab8e4"], "seed002.parquet")
    assert not promote.same_measured(full["d3667c4"], "0" * 40)


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


def _worker_runs(run: Path, parts: int = 2, workers: int = 2, last: str = "finished"):
    """`run`'s one record replaced by those of a `--workers` bench resumed `parts - 1` times,
    each worker's rows labelled with its last run's id."""
    base = pd.read_parquet(run / "runs.parquet").iloc[0]
    records = []
    for part in range(parts):
        for gpu in range(workers):
            r = base.copy()
            r["run_id"] = f"20261126T00000{part}Z-w{gpu}p{part}xx"
            r["started_at"] = f"2026-11-26T00:0{part}:00+00:00"
            r["gpu_index"] = gpu
            r["argv"] = ("python -m triton_fusion_report.analysis.bench --out x "
                         f"{'--resume ' if part else ''}--workers {workers}")
            r["status"] = last if part == parts - 1 else "stopped"
            records.append(r)
    rec = pd.DataFrame(records).reset_index(drop=True)
    rec.to_parquet(run / "runs.parquet")
    for path in run.glob("*.parquet"):
        if path.name != "runs.parquet":
            df = pd.read_parquet(path)
            if "run_id" in df:
                df["run_id"] = [rec["run_id"].iloc[i % len(rec)] for i in range(len(df))]
                df.to_parquet(path)
    return rec


def test_promote_takes_one_multi_gpu_bench_and_its_resumes(tmp_path):
    """The runs of one `--workers` bench (a run per GPU, again per --resume) make one reference
    where each GPU's last run finished; several separate runs, or an unfinished bench, do not."""
    promote = tool("promote")

    run = _a_finished_run(tmp_path / "run")
    _worker_runs(run)
    assert promote.problems(run) == []
    _worker_runs(run, last="stopped")
    assert any("stopped, not finished" in w for w in promote.problems(run))
    rec = _worker_runs(run)
    rec["argv"] = "python -m triton_fusion_report.analysis.bench --out x"
    rec.to_parquet(run / "runs.parquet")
    assert any("not the runs of one multi-GPU bench" in w for w in promote.problems(run))
    rec = _worker_runs(run)
    rec.loc[rec.index[-1], "git_commit"] = "d" * 40
    rec.to_parquet(run / "runs.parquet")
    assert any("different git_commit" in w for w in promote.problems(run))
    rec = _worker_runs(run)
    rec.loc[rec.index[-1], "argv"] = "python -m triton_fusion_report.analysis.bench --out x --workers 2"
    rec.to_parquet(run / "runs.parquet")
    assert any("started afresh" in w for w in promote.problems(run))


def test_compare_runs_pairs_configurations_and_reads_workers_parts(tmp_path, capsys):
    """Two folders' rows are paired by configuration: a family slowed by 10% on half its rows
    agrees on the other half; rows still in a worker's part count; a failed row and rows under the
    floor are left out; folders with nothing in common are an error."""
    C = tool("compare_runs")

    ref = Path(__file__).resolve().parent.parent / "results" / "reference" / "h200"
    b = tmp_path / "b"
    (b / ".parts" / "worker0").mkdir(parents=True)
    ew = pd.read_parquet(ref / "elementwise.parquet").sample(frac=1.0, random_state=0)
    slow = ew.index[: len(ew) // 2]
    ew.loc[slow, ["ms_median", "ms_device"]] *= 1.10
    ew.to_parquet(b / "elementwise.parquet")
    sm = pd.read_parquet(ref / "softmax.parquet")
    sm.loc[sm.index[0], "status"] = "error"
    sm.to_parquet(b / ".parts" / "worker0" / "softmax.parquet")

    table = C.compare(ref, b, floor_us=0.0).set_index("family")
    assert list(table.index) == ["elementwise", "softmax", "all"]
    base = pd.read_parquet(ref / "elementwise.parquet")
    ok = base[base["status"] == "ok"]
    assert table.loc["elementwise", "ms_median n"] == len(ok)
    expected = (~ok.index.isin(slow)).mean()
    assert table.loc["elementwise", "ms_median within"] == pytest.approx(expected)
    assert table.loc["elementwise", "ms_median p95"] == pytest.approx(1.10)
    assert table.loc["softmax", "ms_median n"] == (pd.read_parquet(ref / "softmax.parquet")[
        "status"] == "ok").sum() - 1
    assert table.loc["softmax", "ms_median within"] == 1.0
    floor = C.compare(ref, b, floor_us=50.0).set_index("family")
    assert floor.loc["elementwise", "ms_median n"] == (ok["ms_median"] >= 0.05).sum()

    empty = tmp_path / "empty"
    empty.mkdir()
    assert C.main([str(ref), str(empty)]) == 1
    assert C.main([str(ref), str(b)]) == 0
    assert "within" in capsys.readouterr().out


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
    assert families.TRIALS == {"book": 1, "full": 3, "smoke": 1}
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


def test_warm_calls_the_compiling_variants_and_keeps_no_choice(monkeypatch):
    """The warm-up calls each Triton, torch.compile and peer variant (and its graph_fn) once,
    and turns off every disk copy of a tuning choice."""
    from types import SimpleNamespace

    from triton_fusion_report.analysis.bench import warm

    args = SimpleNamespace(grid="smoke", family=["layernorm"], op=None, where=None)
    problem = families.select_problems(args)[0]
    called = []
    for v in problem.variants:
        v.fn = (lambda name: lambda *a: called.append(name))(v.impl)
        v.graph_fn = None
    assert warm.warm_problem(problem, torch.device("cpu")) == (len(called), 0)
    assert sorted(called) == sorted(v.impl for v in problem.variants if v.impl in warm.WARMED)
    assert set(called) <= set(warm.WARMED) and "torch_compile" in called
    compiled = next(v for v in problem.variants if v.impl == "torch_compile")
    compiled.fn = lambda *a: 1 / 0  # a failed first call (the pass is then not marked)
    ran = len(called) - 1
    assert warm.warm_problem(problem, torch.device("cpu")) == (ran, 1)
    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "1")
    monkeypatch.setenv("FLAGGEMS_DB_URL", "")  # restored after the test
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config, "autotune_local_cache", True)
    warm.no_kept_choices()
    from triton import knobs

    assert not knobs.autotuning.cache and not inductor_config.autotune_local_cache
    assert __import__("os").environ["FLAGGEMS_DB_URL"] == "sqlite:///:memory:"
    with warm.no_cached_graph():  # around a max-autotune graph, whose pick it holds
        assert not inductor_config.fx_graph_cache


def test_warm_tail_steps_name_their_first_calls(monkeypatch):
    """Each TAIL entry names a tail step module whose warm(device, arg) makes its first calls
    (the GPT-2 check's takes each compiled variant it times); a step that raises is reported,
    not fatal."""
    import importlib

    from triton_fusion_report.analysis.bench import model_check, warm

    called = []
    for step, arg in warm.TAIL:
        module = importlib.import_module(f"triton_fusion_report.analysis.bench.{step}")
        monkeypatch.setattr(module, "warm", lambda device, a, step=step: called.append((step, a)))
        assert step != "model_check" or arg in model_check.DEFAULT_TIMINGS
    for entry in warm.TAIL:
        warm.warm_tail(*entry, torch.device("cpu"))
    assert called == list(warm.TAIL)
    monkeypatch.setattr(model_check, "warm", lambda device, a: 1 / 0)
    warm.warm_tail("model_check", "torch_compile", torch.device("cpu"))  # reported, not raised


def test_the_bench_runs_as_a_module():
    """`python -m triton_fusion_report.analysis.bench` (what make bench runs) reaches main."""
    import subprocess

    run = subprocess.run([sys.executable, "-m", "triton_fusion_report.analysis.bench", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "--tail" in run.stdout


def test_tail_steps_all_run_when_one_fails(tmp_path, capsys, monkeypatch):
    """make bench's steps after the sweep (cli.TAIL_STEPS) start before it, each in a process of
    its own with its --out, and run in turn once told; one that fails (in its main, or at its
    import, before its turn) is reported, the next ones still run, and the bench fails. A step
    never told to go exits without running."""
    steps = tmp_path / "steps"
    steps.mkdir()
    (steps / "__init__.py").write_text("")
    for step, _ in cli.TAIL_STEPS:  # stand-ins: each records its argv; seed002 fails
        (steps / f"{step}.py").write_text(
            "import pathlib, sys\n"
            "def main(argv):\n"
            f"    pathlib.Path({str(tmp_path)!r}, '{step}.ran').write_text(' '.join(argv))\n"
            f"    return {int(step == 'seed002')}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setattr(cli, "__package__", "steps")
    out = tmp_path / "run"
    assert cli.run_tail(cli.start_tail(out)) == 1
    assert (tmp_path / "launch_cost.ran").read_text() == f"--out {out / 'launch_cost.csv'}"
    assert all((tmp_path / f"{s}.ran").exists() for s, _ in cli.TAIL_STEPS)
    printed = capsys.readouterr().out
    assert "bench: seed002" in printed and "FAILED" in printed and "bench: model_check" in printed
    for step in (tmp_path / f"{s}.ran" for s, _ in cli.TAIL_STEPS):
        step.unlink()
    waiting = cli.start_tail(out)
    for _, proc in waiting:
        proc.stdin.close()
    assert [proc.wait(timeout=60) for _, proc in waiting] == [2, 2, 2]
    assert not list(tmp_path.glob("*.ran"))
    (steps / "launch_cost.py").write_text("raise RuntimeError('a step that fails to import')\n")
    assert cli.run_tail(cli.start_tail(out)) == 1  # it died before its turn: the rest still run
    assert (tmp_path / "model_check.ran").exists() and not (tmp_path / "launch_cost.ran").exists()
    assert re.search(r"bench: launch_cost \d+ s FAILED", capsys.readouterr().out)


def test_a_finished_compile_pass_is_not_run_again(monkeypatch, tmp_path):
    """A compile pass that ran to its end marks both caches; the same bench then skips it, not
    another grid's problems, nor one with the tail steps, nor after either cache is emptied."""
    from types import SimpleNamespace

    from triton_fusion_report.analysis.bench import warm

    folders = [tmp_path / "triton", tmp_path / "inductor"]
    monkeypatch.setattr(warm, "cache_folders", lambda: folders)
    args = SimpleNamespace(grid="smoke", family=["elementwise"], op=None, where=None)
    problems = families.select_problems(args)
    assert not warm.already_warm(args, problems, False)
    warm.mark_warm(args, problems, False)
    assert warm.already_warm(args, problems, False)
    assert not warm.already_warm(args, problems, True)
    assert not warm.already_warm(args, problems[1:], False)
    next(folders[0].glob("fusion-warm-*")).unlink()  # Triton's cache emptied
    assert not warm.already_warm(args, problems, False)


@FULL
def test_warm_processes_run_the_smoke_grid(tmp_path, monkeypatch):
    """Two spawned processes warm the elementwise smoke grid (the interpreter: the machinery),
    and the finished pass marks the caches."""
    from types import SimpleNamespace

    from triton_fusion_report.analysis.bench import warm

    monkeypatch.setattr(warm, "cache_folders", lambda: [tmp_path / "triton", tmp_path / "ind"])
    args = SimpleNamespace(grid="smoke", family=["elementwise"], op=None, where=None,
                           device="cpu", no_progress=True)
    problems = families.select_problems(args)
    took, longest = warm.run(args, problems, 2)
    assert took > 0 and "a process's start" in longest and "add_mul" in longest, longest
    assert warm.already_warm(args, problems, False)
