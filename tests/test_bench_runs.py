"""The bench as a command: --op and --where, several workers, a stopped run resumed, a folder
that is refused."""

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from triton_fusion_report.analysis.bench import __main__ as cli
from triton_fusion_report.analysis import schema
from triton_fusion_report.analysis.bench import families

from conftest import FULL


def ok_or_peer_missing(df, recorded=False) -> bool:
    """Every row ok, but a peer library's where it is not installed here (unsupported, saying so);
    `recorded`: rows of a committed run, whose machine, not this one, lacked the library."""
    from triton_fusion_report.analysis.bench import peers

    absent = df["impl"].isin([i for i in peers.PINNED if recorded or peers._load(i)[0] is None])
    missing = absent & (df["status"] == "unsupported") & df["error"].str.contains(
        "not installed|does not import", na=False)
    return bool(((df["status"] == "ok") | missing).all())


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


def test_op_filter_refuses_an_unknown_op_before_measuring(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--out", str(tmp_path / "run"), "--family", "softmax", "--op", "sofmax_bwd"])
    assert exit_.value.code == 2
    assert "--op sofmax_bwd: no such op" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # nothing measured, nothing written


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
