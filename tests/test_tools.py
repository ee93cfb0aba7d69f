"""The maintainers' tools on results folders: appending a run, promoting one to a reference,
comparing two runs, comparing kernel fingerprints."""

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from triton_fusion_report.analysis import schema

from conftest import tool


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


def _a_finished_run(dst: Path, commit: str = "c" * 40, run_id: str = "20261126T000000Z-abcdef"):
    """The smoke run's files relabelled as one finished run of the reference grid at one clean
    commit, its Triton rows of this checkout's kernels."""
    import shutil

    kernel_hash = tool("promote").kernel_hash  # cached: the checkout's, once per family
    smoke = Path(__file__).parent / "data" / "smoke"
    dst.mkdir(parents=True, exist_ok=True)
    for path in smoke.glob("*.parquet"):
        df = pd.read_parquet(path)
        df["run_id"], df["git_commit"] = run_id, commit
        if path.name == "runs.parquet":  # a smoke run, relabelled as the reference grid's
            df["git_clean"] = True
            df["argv"] = df["argv"].str.replace("--grid smoke", "--grid reference")
        elif "kernel_hash" in df and "impl" in df:
            triton = df["impl"].str.startswith("triton")
            df.loc[triton, "kernel_hash"] = kernel_hash(path.stem)
        df.to_parquet(dst / path.name)
    shutil.copy(smoke / "limits.parquet", dst / "limits.parquet")
    lim = pd.read_parquet(dst / "limits.parquet").assign(run_id=run_id, git_commit=commit)
    lim.to_parquet(dst / "limits.parquet")
    (dst / "launch_cost.csv").write_text(f"run_id,git_commit,op,us\nx,{commit},softmax,1\n")
    return dst


def test_promote_replaces_the_reference_with_one_clean_run(tmp_path, capsys):
    """Every data file of the reference that the run lacks is removed, an Nsight Compute document
    of another commit too (issue 59); what the run lacks (its profile) is said, not refused."""
    promote = tool("promote")

    run = _a_finished_run(tmp_path / "run")
    into = tmp_path / "ref"
    into.mkdir()
    for name in ("softmax.parquet", "old_only.parquet", "host_overhead.csv", "ncu_x_abc.csv"):
        (into / name).write_text("old")
    assert promote.problems(run) == []
    assert promote.main([str(run), str(into)]) == 0
    names = {p.name for p in into.iterdir()}
    assert not names & {"old_only.parquet", "host_overhead.csv", "ncu_x_abc.csv"}
    assert {"launch_cost.csv", "softmax.parquet", "runs.parquet"} <= names
    assert pd.read_parquet(into / "softmax.parquet")["run_id"].unique().tolist() == \
        ["20261126T000000Z-abcdef"]
    assert "note: no profile.parquet" in capsys.readouterr().err


def test_promote_refuses_a_patchwork(tmp_path):
    promote = tool("promote")

    run = _a_finished_run(tmp_path / "run")
    df = pd.read_parquet(run / "softmax.parquet")
    df.loc[df.index[0], "run_id"] = "20261125T000000Z-other0"
    df.to_parquet(run / "softmax.parquet")
    rec = pd.read_parquet(run / "runs.parquet").assign(status="running")
    rec.to_parquet(run / "runs.parquet")
    (run / "attention.parquet").unlink()
    why = "\n".join(promote.problems(run))
    for expected in ("running", "attention.parquet is missing", "softmax.parquet: run_id"):
        assert expected in why
    into = tmp_path / "ref"
    into.mkdir()
    (into / "softmax.parquet").write_text("old")
    assert promote.main([str(run), str(into)]) == 1
    assert (into / "softmax.parquet").read_text() == "old"


def test_promote_refuses_a_changed_tree(tmp_path):
    """A run from a tree with uncommitted changes (make reference FORCE=1) is refused."""
    promote = tool("promote")

    run = _a_finished_run(tmp_path / "run")
    rec = pd.read_parquet(run / "runs.parquet").assign(git_clean=False)
    rec.to_parquet(run / "runs.parquet")
    assert any("the tree was not clean" in w for w in promote.problems(run))


def test_promote_takes_the_reference_grids_only(tmp_path):
    """The reference grid and the full grid are promotable; the book's and the smoke grid, and a
    bench of some families only, are not."""
    promote = tool("promote")

    run = _a_finished_run(tmp_path / "run")
    rec = pd.read_parquet(run / "runs.parquet")
    for grid, ok in (("reference", True), ("full", True), ("book", False), ("smoke", False)):
        rec.assign(argv=rec["argv"].str.replace("--grid reference", f"--grid {grid}")).to_parquet(
            run / "runs.parquet")
        why = promote.problems(run)
        assert (why == []) == ok, (grid, why)
        assert ok or any(f"the {grid} grid, not a reference grid" in w for w in why)
    rec.assign(families="softmax,elementwise").to_parquet(run / "runs.parquet")
    assert any("not every family" in w for w in promote.problems(run))


def test_promote_refuses_later_steps_of_another_commit(tmp_path):
    """The later steps' files (the profile's, seed 002's, the launch costs' CSV) are the run's
    commit or refused, whatever changed between the commits; a file without a commit (a CSV of
    numbers, an ncu log) is taken as it is."""
    promote = tool("promote")

    run = _a_finished_run(tmp_path / "run")
    later = "d" * 40
    pd.DataFrame(dict(git_commit=["c" * 40], family=["attention"], status=["ok"])).to_parquet(
        run / "profile_details.parquet")
    (run / "seed002_ieee.csv").write_text("batch_size,d1\n16,2048\n")
    (run / "ncu_softmax_v_x.csv").write_text("==PROF== Connected to process 1\n")
    assert promote.problems(run) == []
    for name in ("profile_details.parquet", "seed002.parquet"):
        pd.DataFrame(dict(git_commit=[later], family=["attention"])).to_parquet(run / name)
        assert any(w.startswith(f"{name}: git_commit ['{later}']") for w in promote.problems(run))
        (run / name).unlink()
    (run / "launch_cost.csv").write_text(f"run_id,git_commit,op\nx,{later},softmax\n")
    assert any(w.startswith("launch_cost.csv: git_commit") for w in promote.problems(run))
    (run / "launch_cost.csv").write_text(f"run_id,git_commit,op\nx,{'c' * 40}-dirty,softmax\n")
    assert any(w.startswith("launch_cost.csv: git_commit") for w in promote.problems(run))


def test_promote_refuses_kernels_other_than_the_checkouts(tmp_path):
    """A family whose Triton rows ran other kernel sources than this checkout's (their kernel
    hash), or record none, is refused: the book would show other kernels than the code's."""
    promote = tool("promote")

    run = _a_finished_run(tmp_path / "run")
    df = pd.read_parquet(run / "softmax.parquet")
    triton = df["impl"].str.startswith("triton")
    df.loc[triton, "kernel_hash"] = "0123456789abcdef"
    df.to_parquet(run / "softmax.parquet")
    assert any(w.startswith("softmax.parquet: Triton rows of kernel sources ['0123456789abcdef']")
               for w in promote.problems(run))
    df.loc[triton, "kernel_hash"] = None
    df.to_parquet(run / "softmax.parquet")
    assert any("softmax.parquet: Triton rows without a kernel hash" in w
               for w in promote.problems(run))


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


def test_fingerprint_compare_lists_every_difference():
    compare = tool("fingerprint").compare

    a = {"k1": dict(launches=[dict(kernel="x", grid=[1])], out="ab"), "k2": dict(out="cd")}
    assert compare(a, dict(a)) == []
    b = dict(a, k1=dict(launches=[dict(kernel="x", grid=[2])], out="ab"), k3=dict(out="ef"))
    diffs = compare(a, b)
    assert len(diffs) == 2 and "only in one: k3" in diffs[0] and "differs: k1" in diffs[1]
