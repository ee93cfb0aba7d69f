"""make profile: Nsight Compute's CSV parsed, its kernels attributed to the implementations, the
cases run, failures kept as rows; and what the counters say against the model."""

import sys
from pathlib import Path

import pandas as pd
import pytest


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
    """Recorded details pages (ncu --page details --csv on the H100, kept in tests/data: a
    reference folder holds its own commit's files only): one row per kernel,
    units converted (ns -> us, bytes -> kB, thousands separators), sections not collected
    missing; detail_view names every kernel or refuses."""
    from triton_fusion_report.analysis.bench import profile as P

    folder = Path(__file__).parent / "data"
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
    folder = Path(__file__).parent / "data"
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


def test_profile_reads_what_the_book_reads():
    """The DRAM pass profiles ours and eager only (the book reads the unfused over the fused
    bytes, and eager's backward against ours); the details pass, without the sweep's rows, every
    possible rival of ours.
    The LayerNorm backward's kernels are profiled through their direct call (graph_fn), not the
    autograd engine's thread."""
    from triton_fusion_report.analysis.bench import profile as P

    for case in P.CASES:
        problem = P.find_problem(case)
        dram = [v.impl for v in P.profiled_variants(problem, P.DRAM_IMPLS)]
        assert set(dram) <= set(P.DRAM_IMPLS) and {"torch_eager", "triton_fused"} <= set(dram)
        details = {v.impl for v in P.profiled_variants(problem, skip=P.DETAIL_SKIP)}
        assert "triton_fused" in details and not details & {"triton_unfused", "cublas"}
    ln_bwd = P.find_problem(next(c for c in P.CASES if c[1] == "layer_norm_bwd"))
    assert all(v.graph_fn is not None for v in P.profiled_variants(ln_bwd, P.DRAM_IMPLS))


def _fake_ncu(tmp_path, argv_log):
    """A stand-in for ncu that records the worker's options and writes what a worker would: an
    order file with one profiled implementation and a log with its kernel between markers."""
    fake = tmp_path / "ncu"
    fake.write_text("#!" + sys.executable + "\nimport json, sys\na = sys.argv\n"
                    f"open({str(argv_log)!r}, 'a').write(' '.join(a) + '\\n')\n"
                    "open(a[a.index('--order') + 1], 'w').write(json.dumps(dict(order=["
                    "'triton_fused'], failed={}, variants={}, bytes_impl={'triton_fused': 1})))\n"
                    "open(a[a.index('--log-file') + 1], 'w').write("
                    "'\"ID\",\"Kernel Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"\\n'"
                    " + '\"0\",\"profile_marker\",\"dram__bytes_read.sum\",\"byte\",\"1\"\\n'"
                    " + '\"1\",\"k\",\"dram__bytes_read.sum\",\"byte\",\"8\"\\n'"
                    " + '\"1\",\"k\",\"dram__bytes_write.sum\",\"byte\",\"4\"\\n')\n")
    fake.chmod(0o755)
    return fake


def test_profile_budget_skips_what_it_cannot_run_and_resume_runs_only_that(tmp_path,
                                                                           monkeypatch):
    """Under a budget each case's time is the budget's rest at most; cases after the budget are
    `skipped` rows (not dropped); --resume runs the cases not held in full at this commit (skipped,
    failed as a whole, another commit's, missing) and keeps the others' rows."""
    import time

    from triton_fusion_report.analysis.bench import profile as P

    argv_log = tmp_path / "argv.txt"
    ncu = str(_fake_ncu(tmp_path, argv_log))
    meta = dict(git_commit="c" * 40, gpu="x")
    path = tmp_path / "out" / "profile.parquet"
    rows = P.run_pass(P.profile_case, path, [0, 1], ncu, tmp_path, meta,
                      deadline=time.monotonic() + 120)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert "--impls torch_eager,triton_unfused,triton_fused" in argv_log.read_text()
    rows = P.run_pass(P.profile_case, path, [0, 1, 2], ncu, tmp_path, meta,
                      deadline=time.monotonic() - 1)
    assert [r["status"] for r in rows] == ["skipped"] * 3
    assert "budget was spent" in rows[0]["error"]
    assert pd.read_parquet(path)["status"].tolist() == ["skipped"] * 3

    # A file of: case 0 done, 1 skipped, 2 failed as a whole, 3 of another commit.
    base = [P._case_base(i, meta) for i in range(4)]
    pd.DataFrame([dict(base[0], impl="triton_fused", status="ok"),
                  dict(base[1], impl=None, status="skipped"),
                  dict(base[2], impl=None, status="failed"),
                  dict(base[3], impl="triton_fused", status="ok", git_commit="d" * 40)]
                 ).to_parquet(path)
    assert P.done_cases(path, [0, 1, 2, 3], meta["git_commit"]) == {0}
    ran = []
    monkeypatch.setattr(P, "profile_case", lambda i, *a, **k: ran.append((i, k["timeout"])) or
                        [dict(P._case_base(i, meta), impl="triton_fused", status="ok")])
    rows = P.run_pass(P.profile_case, path, [0, 1, 2, 3], ncu, tmp_path, meta,
                      deadline=time.monotonic() + 1000, resume=True)
    assert [i for i, _ in ran] == [1, 2, 3] and all(t == P.CASE_TIMEOUT_S for _, t in ran)
    assert sorted(r["op"] for r in rows) == sorted(c[1] for c in P.CASES[:4])
    assert {r["status"] for r in rows} == {"ok"}
    # Cut by the budget: skipped (resumed later), but for the command's first case: failed.
    monkeypatch.setattr(P, "profile_case", lambda i, *a, **k: [dict(
        P._case_base(i, meta), impl=None, status="skipped", error="cut")])
    rows = P.run_pass(P.profile_case, path, [0, 1], ncu, tmp_path, meta,
                      deadline=time.monotonic() + 1000)
    assert [r["status"] for r in rows] == ["failed", "skipped"]


def test_profile_case_cut_by_the_budget_is_skipped_a_stall_failed(tmp_path, monkeypatch):
    """A case that the budget's shorter time limit cuts is `skipped` (to be resumed); one past
    its own CASE_TIMEOUT_S is `failed`, as a stall is."""
    from triton_fusion_report.analysis.bench import profile as P

    hung = tmp_path / "ncu_hangs"
    hung.write_text("#!/bin/sh\necho 'profile worker: warming torch_eager' >&2\nsleep 60\n")
    hung.chmod(0o755)
    rows = P.profile_case(0, str(hung), tmp_path, dict(gpu="x"), timeout=1)
    assert rows[0]["status"] == "skipped" and "cut at the profile's budget" in rows[0]["error"]
    monkeypatch.setattr(P, "CASE_TIMEOUT_S", 1)
    rows = P.profile_case(0, str(hung), tmp_path, dict(gpu="x"))
    assert rows[0]["status"] == "failed" and "ran past 1 s" in rows[0]["error"]


def test_profile_details_take_the_sweeps_fastest_other(tmp_path, monkeypatch):
    """Where the folder holds the sweep's rows at a details case's configuration, the details
    pass profiles ours and the fastest other there by device time (each implementation's
    fastest row, as the book's verdict; never the unfused version, a failed row, a row without
    a time, another op, dtype, shape or commit); else every rival. make profile's --details
    hands the pass its folder."""
    from triton_fusion_report.analysis.bench import profile as P

    i = next(i for i, c in enumerate(P.CASES) if c[0] == "attention")
    family, op, dtype, _ = P.CASES[i]
    shape = P.find_problem(P.CASES[i]).shape
    row = dict(op=op, dtype=dtype, sweep="size", status="ok", git_commit="c", ms_device=None,
               **shape)
    rows = [dict(row, impl="triton_fused", ms_median=ms) for ms in (0.9, 1.0, 1.1)]
    rows += [dict(row, impl="sdpa_cudnn", ms_median=ms, ms_device=dev)
             for ms, dev in ((0.9, 0.85), (0.95, 0.84), (2.0, None))]
    rows += [dict(row, impl="torch_compile", ms_median=0.86),  # its device time, 0.845, counts
             dict(row, impl="torch_compile", ms_median=0.86, ms_device=0.845),
             dict(row, impl="triton_unfused", ms_median=0.1),  # not a rival
             dict(row, impl="sdpa_flash", ms_median=0.01, status="failed"),
             dict(row, impl="sdpa_efficient", ms_median=None),
             dict(row, impl="torch_eager", ms_median=0.01, sweep="block"),
             dict(row, impl="torch_eager", ms_median=0.01, op="attention_bwd"),
             dict(row, impl="torch_eager", ms_median=0.01, dtype="bfloat16"),
             dict(row, impl="torch_eager", ms_median=0.01, git_commit="older"),
             dict(row, impl="flag_gems", ms_median=0.01, seq=shape["seq"] // 2)]
    calls = []
    monkeypatch.setattr(P, "_ncu_run", lambda *a: calls.append(a[-1]) or (None, "no ncu"))
    assert P.sweep_pair(tmp_path, P.CASES[i]) is None  # no rows: every rival
    P.details_case(i, "ncu", tmp_path, dict(gpu="x"), out=tmp_path)
    pd.DataFrame(rows).to_parquet(tmp_path / f"{family}.parquet")
    assert P.sweep_pair(tmp_path, P.CASES[i], "c") == ("triton_fused", "sdpa_cudnn")
    assert P.sweep_pair(tmp_path, P.CASES[i]) == ("triton_fused", "torch_eager")  # any commit
    P.details_case(i, "ncu", tmp_path, dict(gpu="x", git_commit="c"), out=tmp_path)
    P.details_case(i, "ncu", tmp_path, dict(gpu="x", git_commit="c"), out=tmp_path,
                   all_impls=True)
    assert calls == [("--skip", ",".join(P.DETAIL_SKIP)),
                     ("--impls", "triton_fused,sdpa_cudnn"), ()]
    pd.DataFrame([r for r in rows if r["impl"] != "triton_fused"]).to_parquet(
        tmp_path / f"{family}.parquet")
    assert P.sweep_pair(tmp_path, P.CASES[i], "c") is None  # ours not measured: every rival

    # make profile --details: the pass is given the folder (here without rows: every rival).
    import types

    from triton_fusion_report.analysis.bench import machine

    monkeypatch.setattr(P.shutil, "which", lambda name: "/usr/bin/ncu")
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(device=lambda name: name))
    monkeypatch.setattr(machine, "run_metadata", lambda device: dict.fromkeys(
        ("run_id", "started_at", "git_commit", "gpu", "torch", "triton"), "x"))
    seen = []
    monkeypatch.setattr(P, "details_case",
                        lambda *a, out=None, **k: seen.append(out) or [dict(status="failed")])
    monkeypatch.setattr(P, "details_summary", lambda rows: rows)
    assert P.main(["--out", str(tmp_path / "run"), "--details", "--case", str(i)]) == 0
    assert seen == [tmp_path / "run"]
