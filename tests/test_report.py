"""Every chapter's python cells run in order, in one namespace per chapter (as Quarto's Jupyter
engine runs them) against the committed reference data; every figure cell makes a figure, every
table cell a table, every inline expression a value. Quarto itself is absent here and in CI.

Set REPORT_FIGURES_DIR to keep the figures as PNG files to look at."""
import math
import os
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from triton_fusion_report.analysis import report as R  # noqa: E402

from conftest import reference_before_softmax_backward  # noqa: E402
from qmd import cells, chapters, inline_expressions, prose, run_cell  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = chapters(ROOT)


def test_every_chapter_is_rendered():
    on_disk = set((ROOT / "report").glob("*.qmd"))
    assert on_disk == set(CHAPTERS), "a .qmd in report/ is missing from report/_quarto.yml or vice versa"


SMOKE = ROOT / "tests" / "data" / "smoke"  # `python -m triton_fusion_report.analysis --grid smoke` on a CPU


def _folder_with_failed_rows(tmp: Path) -> Path:
    """The reference, with every row at each family's largest size turned into an OOM row."""
    import shutil

    import pandas as pd

    from triton_fusion_report.analysis.schema import FAMILY_SHAPES

    for path in R.REFERENCE.iterdir():
        shutil.copy(path, tmp / path.name)
    for family, shape in FAMILY_SHAPES.items():
        df = pd.read_parquet(tmp / f"{family}.parquet")
        size = next(c for c in shape if pd.api.types.is_numeric_dtype(df[c]))
        hit = df[size] == df[size].max()
        df.loc[hit, "status"] = "oom"
        df.loc[hit, "error"] = "torch.OutOfMemoryError: CUDA out of memory (test)"
        df.loc[hit, R.TIMING_COLUMNS + ["max_rel_err"]] = float("nan")
        df.to_parquet(tmp / f"{family}.parquet")
    return tmp


def _folder_missing_families(tmp: Path) -> Path:
    """A smoke run of some families only: the others come from the reference, and say so."""
    import shutil

    for name in ("limits", "elementwise", "layernorm", "matmul_softmax"):
        shutil.copy(SMOKE / f"{name}.parquet", tmp / f"{name}.parquet")
    return tmp


def _folder_with_softmax_backward(tmp: Path) -> Path:
    """The reference before its softmax backward rows, with timed backward rows appended as a
    second run (made up from the forward's rows), as `append_run` adds a GPU run's."""
    import pandas as pd

    from triton_fusion_report.analysis.append_run import append_run

    into, run = tmp / "with_backward", tmp / "backward_run"
    reference_before_softmax_backward(into)
    run.mkdir()
    fwd = pd.read_parquet(into / "softmax.parquet")
    bwd = fwd[fwd["sweep"] == "size"].assign(run_id="backward-run", op="softmax_bwd",
                                             direction="bwd", bytes_model=fwd["bytes_model"] * 1.5)
    fused = bwd["impl"] == "triton_fused"
    bwd.loc[fused, "variant"] = ["one_tile" if w <= 16384 else "two_pass" for w in bwd.loc[fused, "width"]]
    bwd.to_parquet(run / "softmax.parquet")
    limits = pd.read_parquet(R.REFERENCE / "limits.parquet")
    limits[limits["run_id"] == fwd["run_id"].iloc[0]].assign(run_id="backward-run").to_parquet(
        run / "limits.parquet")
    append_run(run, into)
    return into


def _folder_with_user_shapes(tmp: Path) -> Path:
    """The reference with the grid's shapes that are not width sweeps: every softmax and
    LayerNorm row again at 8 rows (a width then comes at two row counts, as 8 x 50257 beside
    4096 x 50257 does), and the narrowest width again as 5120 (a hidden size)."""
    import shutil

    for path in R.REFERENCE.iterdir():
        shutil.copy(path, tmp / path.name)
    for family in ("softmax", "layernorm"):
        df = pd.read_parquet(tmp / f"{family}.parquet")
        if (df["rows"] == 8).any() and (df["width"] == 5120).any():
            continue  # a reference measured on the grid that has them
        few = df.assign(rows=8, ms_median=df["ms_median"] / 100, ms_device=df["ms_device"] / 100)
        narrow = df[df["width"] == df["width"].min()].assign(width=5120)
        pd.concat([df, few, narrow], ignore_index=True).to_parquet(tmp / f"{family}.parquet")
    return tmp


DATASETS = {
    "reference": lambda tmp: R.REFERENCE,
    "user_shapes": _folder_with_user_shapes,
    "smoke": lambda tmp: SMOKE,
    "families_missing": _folder_missing_families,
    "failed_rows": _folder_with_failed_rows,
    "softmax_backward": _folder_with_softmax_backward,
}


def test_smoke_fixture_matches_the_schema():
    """tests/data/smoke is what `python -m triton_fusion_report.analysis --grid smoke` writes on a CPU; regenerate it
    (`make smoke-data`) when the schema changes."""
    import pyarrow.parquet as pq

    from triton_fusion_report.analysis.schema import FAMILY_SHAPES, family_schema

    for family in FAMILY_SHAPES:
        names = pq.read_schema(SMOKE / f"{family}.parquet").names
        assert names == family_schema(family).names, f"{family}: run `make smoke-data`"


# The chapters that read the softmax family's rows: the others gain nothing from its backward.
SOFTMAX_CHAPTERS = {"reductions", "synthesis"}
CHAPTER_DATASETS = [(qmd, dataset) for dataset in DATASETS for qmd in CHAPTERS
                    if dataset != "softmax_backward" or qmd.stem in SOFTMAX_CHAPTERS]


@pytest.mark.parametrize("qmd, dataset", CHAPTER_DATASETS,
                         ids=[f"{q.stem}-{d}" for q, d in CHAPTER_DATASETS])
def test_chapter_cells_run(qmd, dataset, tmp_path, monkeypatch):
    folder = DATASETS[dataset](tmp_path)
    monkeypatch.chdir(qmd.parent)  # Quarto runs a chapter's cells from its own folder
    monkeypatch.setenv("FUSION_RESULTS", str(folder))
    figures_dir = Path(os.environ.get("REPORT_FIGURES_DIR", tmp_path / "figures")) / dataset
    figures_dir.mkdir(parents=True, exist_ok=True)
    text = qmd.read_text()
    chunks = cells(text)
    assert chunks and "parameters" in chunks[0].options.get("tags", []), \
        "the first cell must be the `parameters` cell"
    namespace = {"__name__": "__main__"}
    for cell in chunks:
        plt.close("all")
        value = run_cell(cell.code, namespace)
        label = str(cell.options.get("label", ""))
        if label.startswith("fig-"):
            assert plt.get_fignums(), f"{qmd.name}: cell {label} made no figure"
            assert value is None, f"{qmd.name}: {label} would also print {type(value).__name__}"
            assert cell.options.get("fig-cap"), f"{qmd.name}: {label} has no caption"
            for i, num in enumerate(plt.get_fignums()):
                plt.figure(num).savefig(figures_dir / f"{qmd.stem}-{label}-{i}.png", dpi=80)
        if label.startswith("tbl-"):
            markdown = value._repr_markdown_() if hasattr(value, "_repr_markdown_") else None
            assert isinstance(markdown, str) and markdown.count("\n|") >= 2, \
                f"{qmd.name}: cell {label} shows no table with rows"
            assert "nan" not in markdown.lower(), f"{qmd.name}: {label} shows a NaN"
    plt.close("all")
    for expr in inline_expressions(text):
        value = eval(expr, namespace)
        shown = str(value)
        assert shown.strip(), f"{qmd.name}: `{expr}` renders empty"
        assert not re.search(r"\b(nan|inf)\b", shown, re.I) and "None" not in shown, \
            f"{qmd.name}: `{expr}` -> {shown}"
        if isinstance(value, float):
            assert math.isfinite(value)
        # Quarto shows a value without a markdown form by its repr.
        assert "np." not in repr(value), f"{qmd.name}: `{expr}` shows as {value!r}"
        # The data line names the rows that failed (the reference's: a peer library refusing a
        # configuration, test_reference_failures_are_peer_refusals) and says they show as —.
        if dataset in ("reference", "softmax_backward") and not expr.startswith("R.data_line("):
            assert "—" not in shown, f"{qmd.name}: `{expr}` lacks data in the reference"


def test_reference_failures_are_peer_refusals():
    """In the committed reference every row of ours and of PyTorch's measured; a row that did not
    is a peer library refusing the configuration (Liger-Kernel past 65536 columns)."""
    from triton_fusion_report.analysis.__main__ import FAMILIES

    for family in FAMILIES:
        path = R.REFERENCE / f"{family}.parquet"
        df = pd.read_parquet(path)
        failed = df[df["status"] != "ok"]
        assert set(failed["impl"]) <= set(R.PEERS), (path.name, failed[["impl", "status"]])
        assert all("blocksize" in e or "not supported" in e.lower() or "unsupported" in e.lower()
                   for e in failed["error"]), (path.name, failed["error"].unique())


NUMBER_WITH_UNIT = re.compile(
    r"\d+(\.\d+)?\s?(x faster|× faster|TB/s|GB/s|TFLOP/s|ms\b|µs\b|%)")


@pytest.mark.parametrize("qmd", CHAPTERS, ids=lambda p: p.stem)
def test_prose_types_no_measured_numbers(qmd):
    """Measured numbers in prose come from `{python}` expressions, never typed in."""
    text = re.sub(r"`\{python\}[^`]*`", "", prose(qmd.read_text()))
    assert not NUMBER_WITH_UNIT.findall(text), NUMBER_WITH_UNIT.search(text).group(0)


def _labels(qmd: Path) -> list[str]:
    """The cross-reference targets a chapter defines: its cells' labels and its headings' ids."""
    text = qmd.read_text()
    return ([str(c.options["label"]) for c in cells(text) if "label" in c.options]
            + re.findall(r"^#+ .*\{#((?:sec)-[A-Za-z0-9_-]+)", prose(text), re.M))


def test_cross_reference_labels_are_unique_across_the_book():
    seen = [label for qmd in CHAPTERS for label in _labels(qmd)]
    assert len(seen) == len(set(seen)), sorted(l for l in seen if seen.count(l) > 1)


@pytest.mark.parametrize("qmd", CHAPTERS, ids=lambda p: p.stem)
def test_cross_references_resolve(qmd):
    """Every @fig-/@tbl-/@sec- reference in the prose names a label somewhere in the book."""
    labels = {label for chapter in CHAPTERS for label in _labels(chapter)}
    for ref in re.findall(r"@((?:fig|tbl|sec)-[A-Za-z0-9_-]+)", prose(qmd.read_text())):
        assert ref.rstrip(".-") in labels, f"{qmd.name}: @{ref} has no target"


def test_partial_results_fall_back_to_the_reference(tmp_path, monkeypatch):
    """A folder from `make bench BENCH_ARGS='--family elementwise'` still renders every chapter:
    the missing families come from the reference, and the chapter says so."""
    import shutil

    for name in ("limits.parquet", "elementwise.parquet"):
        shutil.copy(R.REFERENCE / name, tmp_path / name)
    qmd = ROOT / "report" / "reductions.qmd"
    monkeypatch.chdir(qmd.parent)
    monkeypatch.setenv("FUSION_RESULTS", str(tmp_path))
    namespace = {"__name__": "__main__"}
    text = qmd.read_text()
    for cell in cells(text):
        run_cell(cell.code, namespace)
        plt.close("all")
    lines = [str(eval(e, namespace)) for e in inline_expressions(text) if "data_line" in e]
    assert lines and "committed reference" in lines[0]
    assert "committed reference" not in str(R.data_line(elementwise=R.load(tmp_path, "elementwise")))


def _one_clean_run(src, dst, names):
    """Copies of the reference's files `names` into dst, relabelled as one run at one commit
    with one kernel source per family."""
    import shutil

    for name in names:
        if not name.endswith(".parquet") or name.startswith(("limits", "runs")):
            shutil.copy(src / name, dst / name)
            continue
        df = pd.read_parquet(src / name)
        df["run_id"], df["git_commit"] = "20261125T000000Z-abcdef", "a" * 40
        if "kernel_hash" in df:
            df["kernel_hash"] = "k"
        df.to_parquet(dst / name)


def test_mixture_flags_commits_and_fallback(tmp_path):
    """The first page's warning: the committed reference (one clean run, `promote` makes sure)
    is not flagged, nor is one clean run of every family; one clean run of some families is,
    naming the families that come from the reference instead."""
    assert not R.mixture(R.REFERENCE)["mixed"] and len(R.mixture(R.REFERENCE)["commits"]) == 1
    assert R.mixture(R.REFERENCE)["fallback"] == []
    families = sorted(p.name for p in R.REFERENCE.glob("*.parquet")
                      if p.stem not in R.NOT_FAMILY_FILES)
    full, part = tmp_path / "full", tmp_path / "part"
    full.mkdir(), part.mkdir()
    later = [n for n in ("profile.parquet", "profile_details.parquet")
             if (R.REFERENCE / n).exists()]
    _one_clean_run(R.REFERENCE, full, families + ["limits.parquet", *later, *R.BENCH_CSVS])
    assert not R.mixture(full)["mixed"] and str(R.mixture_note(full)) == ""
    _one_clean_run(R.REFERENCE, part, ["elementwise.parquet", "limits.parquet"])
    m = R.mixture(part)
    assert m["mixed"] and "attention" in m["fallback"] and "elementwise" not in m["fallback"]
    note = str(R.mixture_note(part))
    assert "not one clean run" in note and "one run at commit aaaaaaaaaaaa" in note
    assert "it lacks attention" in note and "committed reference" in note
    assert "launch_cost.csv" in m["fallback"] and "profile" in m["fallback"]


def test_md_table_escapes_markdown():
    """A cell's "@" would become a citation (and break the PDF: "softmax(X)@V"), a "|" a column;
    a missing number shows as a dash."""
    import pandas as pd

    from triton_fusion_report.analysis import report as R

    text = R.md_table(pd.DataFrame({"op": ["softmax(X)@V", "a|b"], "x": [1.0, float("nan")]}))
    assert "softmax(X)\\@V" in text and "a\\|b" in text and "| —" in text


def test_limits_by_run_puts_one_run_and_gpu_on_a_line():
    """Two GPUs of one run are two lines; a limit a run did not measure is NaN, not another
    run's value; span reads the lowest and highest, NaN for an absent column."""
    import pandas as pd

    from triton_fusion_report.analysis import report as R

    def row(run, gpu, metric, prec, value):
        return dict(run_id=run, started_at=f"2026-11-2{run}T10:00:00", gpu_index=gpu,
                    metric=metric, precision=prec, value=value, detail=f"{metric} of run {run}")
    limits = pd.DataFrame([row(1, 0, "copy_bw", "ieee", 3000.0), row(1, 0, "matmul_peak", "fp16", 700.0),
                           row(1, 1, "copy_bw", "ieee", 2990.0), row(1, 1, "matmul_peak", "fp16", 760.0),
                           row(2, 0, "copy_bw", "ieee", 3010.0), row(2, 0, "stream_bw", "ieee", 3100.0)])
    wide = R.limits_by_run(limits)
    assert list(wide.columns) == ["run (UTC)", "GPU", "copy", "stream", "fp16"]
    assert wide["GPU"].tolist() == ["#0", "#1", "#0"]
    assert wide["fp16"].tolist()[:2] == [700.0, 760.0] and math.isnan(wide["fp16"].iloc[2])
    assert R.span(wide, "copy") == (2990.0, 3010.0)
    assert all(math.isnan(v) for v in R.span(wide, "TF32"))
    how = R.limit_methods(limits)
    assert how["limit"].tolist() == ["copy", "stream", "fp16"]
    assert how["how"].tolist()[0] == "copy_bw of run 2"  # the latest run's detail


def _chapter_namespace(qmd: Path, folder: Path, monkeypatch) -> dict:
    """Run a chapter's cells against `folder`; its namespace."""
    monkeypatch.chdir(qmd.parent)
    monkeypatch.setenv("FUSION_RESULTS", str(folder))
    namespace = {"__name__": "__main__"}
    for cell in cells(qmd.read_text()):
        run_cell(cell.code, namespace)
        plt.close("all")
    return namespace


def test_softmax_backward_findings_without_backward_rows(tmp_path, monkeypatch):
    """A reference without backward rows: the section says so, from the data; a folder without
    them says that neither it nor the reference has any."""
    import shutil

    from triton_fusion_report.analysis import findings as F

    old = reference_before_softmax_backward(tmp_path / "reference")
    monkeypatch.setattr(R, "REFERENCE", old)
    limits = R.load_limits(old)
    smb = R.load(old, "softmax", op="softmax_bwd")
    assert len(smb) == 0 and len(R.load(old, "softmax")) > 0
    said = str(F.softmax_backward_findings(smb, limits)["measured"])
    assert said.startswith("No softmax backward rows were measured in this reference:")
    assert "--op softmax_bwd" in said
    assert "none in this results folder" in R.md_table(F.softmax_backward_table(smb, limits))
    run = tmp_path / "run"
    run.mkdir()
    for name in ("limits.parquet", "softmax.parquet"):
        shutil.copy(old / name, run / name)
    said = F.softmax_backward_findings(R.load(run, "softmax", op="softmax_bwd"), limits)
    assert "in this results folder, nor in the committed reference" in said["measured"]


def test_softmax_backward_in_the_reference():
    """The committed reference carries measured (GPU) softmax backward rows for every impl."""
    smb = R.load(R.REFERENCE, "softmax", op="softmax_bwd")
    ok = smb[smb["status"] == "ok"]
    assert set(ok["impl"]) >= {"torch_eager", "torch_compile", "triton_unfused", "triton_fused"}
    assert ok["ms_median"].notna().all() and set(ok["direction"]) == {"bwd"}


def test_softmax_backward_findings_on_cpu_rows():
    """The smoke run's backward rows were checked, not timed: the section says so."""
    from triton_fusion_report.analysis import findings as F

    from test_analysis import ok_or_peer_missing

    smb = R.load(SMOKE, "softmax", op="softmax_bwd")
    assert len(smb) and ok_or_peer_missing(smb, recorded=True)
    said = str(F.softmax_backward_findings(smb, R.load_limits(SMOKE))["measured"])
    assert said.startswith(f"The {len(smb)} softmax backward rows here were not timed (a run on the CPU")


def test_softmax_backward_section_with_backward_rows(tmp_path, monkeypatch):
    """With backward rows of a second run: the forward's values stay the forward's, the section
    quotes the backward's, against the copy bandwidth of the backward's run."""
    from triton_fusion_report.analysis import findings as F

    ns = _chapter_namespace(ROOT / "report" / "reductions.qmd",
                            _folder_with_softmax_backward(tmp_path), monkeypatch)
    assert set(ns["sm"]["direction"]) == {"fwd"} and set(ns["smb"]["direction"]) == {"bwd"}
    reference_fwd = R.load(reference_before_softmax_backward(tmp_path / "old"), "softmax")
    assert ns["fs"]["best"] == F.softmax_findings(reference_fwd, ns["copy_bw"])["best"]
    fb = ns["fb"]
    assert str(fb["measured"]).startswith("On the GPU alone (device time)")
    assert fb["widest_one_tile"] == 16384 and fb["widest_vs_unfused"] > 0
    # The made-up rows move 1.5 times the forward's model bytes in the forward's time.
    fwd_fused = ns["sm32"][ns["sm32"]["impl"] == "triton_fused"].set_index("width")["device_tbps"]
    assert fb["gbps"][1024] == pytest.approx(1.5 * fwd_fused[1024] * 1000)
    table = F.softmax_backward_table(ns["smb"], ns["limits"])
    assert len(table) == ns["smb"][["dtype", "rows", "width"]].drop_duplicates().shape[0]
    assert table["fused %"].notna().all()


def test_synthesis_keeps_the_softmax_forward(tmp_path):
    """The synthesis chapter's softmax (headline, model against measurement) is the forward's,
    whether or not backward rows share its file."""
    from triton_fusion_report.analysis import synthesis as S

    def tables(folder):
        frames = {"softmax": R.load(folder, "softmax")}
        limits = R.load_limits(folder)
        return S.headline_table(frames, limits), S.predicted_vs_measured(frames, limits)

    old = reference_before_softmax_backward(tmp_path / "old")
    (head, pvm), (head_b, pvm_b) = tables(old), tables(_folder_with_softmax_backward(tmp_path))
    assert len(head) == 1 and len(pvm) > 0
    assert head.equals(head_b) and pvm.equals(pvm_b)


def _faster_gpu_copy(tmp_path, families=("elementwise",), speed=1.4):
    """A results folder as if a GPU with `speed` times the bandwidth had run the reference's
    `families`: its limits and rows with the GPU renamed, bandwidth up and times down by `speed`."""
    import pandas as pd

    folder = tmp_path / "h200"
    folder.mkdir()
    limits = pd.read_parquet(R.REFERENCE / "limits.parquet")
    limits["gpu"] = "NVIDIA H200"
    limits.loc[limits["metric"] == "copy_bw", "value"] *= speed
    limits.to_parquet(folder / "limits.parquet")
    for family in families:
        df = pd.read_parquet(R.REFERENCE / f"{family}.parquet")
        df["gpu"] = "NVIDIA H200"
        for col in ("ms_median", "ms_device"):
            df[col] = df[col] / speed
        df.to_parquet(folder / f"{family}.parquet")
    return folder


def test_several_results_folders(tmp_path, monkeypatch):
    """`make render RESULTS="a b"`: the chapters read the first folder, the synthesis compares
    the GPUs of all, each with its own rows only (never the reference's that a chapter falls
    back to)."""
    from triton_fusion_report.analysis import synthesis as S

    other = _faster_gpu_copy(tmp_path)
    both = f"{R.REFERENCE}{os.pathsep}{other}"
    assert R.results_dirs(both) == [R.REFERENCE, other]
    monkeypatch.setenv("FUSION_RESULTS", both)
    assert R.results_dir() == R.REFERENCE
    with pytest.raises(FileNotFoundError):
        R.results_dirs(f"{R.REFERENCE}{os.pathsep}{tmp_path / 'none'}")
    # Nothing chosen: every committed reference, the H100's first (the H200's where it exists).
    with monkeypatch.context() as m:
        m.delenv("FUSION_RESULTS")
        assert R.results_dirs()[0] == R.REFERENCE
        refs = tmp_path / "reference"
        for gpu in ("h100", "h200"):
            (refs / gpu).mkdir(parents=True)
            (refs / gpu / "limits.parquet").write_bytes(
                (R.REFERENCE / "limits.parquet").read_bytes())
        m.setattr(R, "REFERENCE", refs / "h100")
        assert R.results_dirs() == [refs / "h100", refs / "h200"]
    cmp = S.gpu_comparison(R.results_dirs())
    assert set(cmp[cmp["gpu"] == "NVIDIA H200"]["_family"]) == {"elementwise"}
    shown = S.gpu_comparison_display(cmp)
    assert len(shown) == 1 and any("H200" in c for c in shown.columns)
    said = S.bandwidth_finding(cmp)
    assert "1.40×" in said and "about as much" in said
    assert "One GPU" in S.bandwidth_finding(S.gpu_comparison([R.REFERENCE]))
    # Every case of the size sweep, per GPU: the same rows 1.4× faster on both sides of each
    # ratio hold their place exactly as on the first GPU; the first page names the other folder.
    place = S.place_against_best(R.results_dirs())
    first, second = (place[place["family"] == "add-mul"].set_index("GPU").loc[g] for g in
                     ("H100", "H200"))
    assert first["cases"] == second["cases"] > 0
    assert first["held"] == second["held"]
    assert abs(first["median fused / best"] - second["median fused / best"]) < 1e-9
    assert "on the H200 at" in S.place_finding(place)
    line = R.others_line(R.results_dirs())
    assert "NVIDIA H200" in line and "the same Triton kernel source" in line
    assert R.others_line([R.REFERENCE]) == ""
    # The whole synthesis chapter runs on the pair.
    monkeypatch.chdir(R.ROOT / "report")
    namespace = {"__name__": "__main__"}
    for cell in cells((R.ROOT / "report" / "synthesis.qmd").read_text()):
        value = run_cell(cell.code, namespace)
        if cell.options.get("label") == "tbl-gpus":
            assert "H200" in value._repr_markdown_()
    plt.close("all")


def test_place_against_best_finds_a_slow_case(tmp_path):
    """A fused kernel made 3× slower at one case of the copy loses its place there, and only
    there: one case fewer held, and that case named as the worst with its ratio and the winner."""
    import pandas as pd
    from triton_fusion_report.analysis import synthesis as S

    other = _faster_gpu_copy(tmp_path)
    df = pd.read_parquet(other / "elementwise.parquet")
    sel = (df["impl"] == "triton_fused") & (df["sweep"] == "size") & (df["status"] == "ok")
    n = int(df.loc[sel, "n"].max())
    case = sel & (df["n"] == n) & (df["dtype"] == "float32") & (df["z_kind"] == "tensor")
    assert case.sum() == 1
    df.loc[case, ["ms_device", "ms_median"]] *= 3
    df.to_parquet(other / "elementwise.parquet")
    place = S.place_against_best([R.REFERENCE, other]).set_index(["family", "GPU"])
    before, after = place.loc[("add-mul", "H100")], place.loc[("add-mul", "H200")]
    assert after["cases"] == before["cases"]
    assert after["held"] == before["held"] - 1
    worst = after["farthest behind (fused / best, the best)"]
    assert f"add_mul fp32 {n} tensor" in worst and "×, " in worst
    assert float(worst.split("(")[-1].split("×")[0]) > 2.5


def test_targets_are_checked_against_the_data():
    """Each target gets the fused kernel's figure at its configuration and is met exactly when
    that figure is on the right side of the goal; a configuration without a fused row says so
    instead of passing or failing."""
    from triton_fusion_report.analysis import synthesis as S

    frames = {name: R.load(R.REFERENCE, name) for name in S.FAMILY_LABEL}
    table = S.target_table(frames)
    assert len(table) == len(S.TARGETS) and table["met"].notna().all()
    for r in table.itertuples():
        assert r.met == (r.fused >= r.goal if r.unit == "TFLOP/s" else r.fused <= r.goal)
    # softmax(X) @ V fp16 at half the goal's time is met; without its fused row, no data.
    first = S.TARGETS[0]
    df = frames[first.family].copy()
    at = (df["impl"] == "triton_fused") & (df["sweep"] == "size")
    for k, v in first.where.items():
        at &= df[k] == v
    assert at.sum() >= 1
    df.loc[at, ["ms_device", "ms_median"]] = first.goal / 2
    met = S.target_table({**frames, first.family: df})
    assert bool(met["met"].iloc[0]) and met["fused"].iloc[0] == pytest.approx(first.goal / 2)
    gone = S.target_table({**frames, first.family: df[~at]})
    assert gone["met"].iloc[0] is None
    assert S.target_display(gone)["met"].iloc[0] == "no data"
    said = S.target_findings(gone)
    assert said["no_data"] == 1 and said["known"] == len(S.TARGETS) - 1
    assert said["met"] + said["missed"] == said["known"] and first.label not in said["misses"]
    assert S.target_findings(met)["missed"] == S.target_findings(table)["missed"] - (
        not table["met"].iloc[0])


def test_stale_note_names_families_measured_with_other_kernels(tmp_path):
    """The first page says which families' Triton rows ran kernel sources other than this
    checkout's, and which record none; rows of the current sources raise no note."""
    from triton_fusion_report.analysis import machine

    folder = tmp_path / "run"
    folder.mkdir()
    _one_clean_run(R.REFERENCE, folder, ["elementwise.parquet", "limits.parquet"])
    assert R.stale_kernels(folder) == dict(changed=["elementwise"], unrecorded=[])
    note = str(R.stale_note(folder))
    assert "predate this checkout's kernels" in note and "elementwise" in note
    df = pd.read_parquet(folder / "elementwise.parquet")
    df["kernel_hash"] = machine.kernel_hash("elementwise")
    df.to_parquet(folder / "elementwise.parquet")
    assert R.stale_kernels(folder) == dict(changed=[], unrecorded=[])
    assert str(R.stale_note(folder)) == ""
    df["kernel_hash"] = None
    df.to_parquet(folder / "elementwise.parquet")
    assert R.stale_kernels(folder)["unrecorded"] == ["elementwise"]


def _with_few_rows(df: pd.DataFrame, rows: int = 8) -> pd.DataFrame:
    """The reference's softmax rows plus a copy of them at `rows` rows, times halved: one width
    now measured at two row counts, as the grid's few-row shapes are."""
    if (df["rows"] == rows).any():
        return df  # a reference measured on the grid that has them
    few = df.assign(rows=rows, ms_median=df["ms_median"] / 2, ms_device=df["ms_device"] / 2)
    return pd.concat([df, few], ignore_index=True)


def test_a_width_at_two_row_counts_is_never_read_as_one():
    """A width measured at 4096 and 8 rows: a selection by width alone raises (it used to take
    whichever row came first); main_rows keeps the width sweep's rows, and
    the chapter's findings read the 4096-row values."""
    from triton_fusion_report.analysis import findings as F
    from triton_fusion_report.analysis import synthesis

    sm = R.load(R.REFERENCE, "softmax")
    both = _with_few_rows(sm)
    width = int(R.ok_rows(sm)["width"].max())
    with pytest.raises(R.AmbiguousRows):
        R.value_at(R.ok_rows(both), "triton_fused", width=width)
    with pytest.raises(R.AmbiguousRows):
        synthesis.times_of(both, dict(dtype="float32", width=width))
    with pytest.raises(R.AmbiguousRows):
        R.pivot(R.ok_rows(both), ["dtype", "width"])
    assert set(R.main_rows(both)["rows"]) == {4096}
    copy_bw = R.limit(R.load_limits(R.REFERENCE), "copy_bw", run_id=R.run_of(sm))
    assert F.softmax_findings(both, copy_bw)["fused_gbps"] == F.softmax_findings(sm, copy_bw)["fused_gbps"]


def test_user_shapes_time_the_few_row_and_odd_width_rows():
    """Every shape of the table is a few-row shape or a width that is not a power of two (the
    width sweep's power-of-two widths at the main row count are not), each with the fused
    kernel's time and the fastest other implementation's, read back from the rows."""
    from triton_fusion_report.analysis import findings as F
    from triton_fusion_report.analysis import synthesis

    sm = _with_few_rows(R.load(R.REFERENCE, "softmax"))
    table = F.user_shapes({"softmax": sm})
    assert len(table) and (table["shape"].str.startswith("8×")).any()
    main = int(R.main_rows(R.ok_rows(sm))["rows"].iloc[0])
    ok = R.ok_rows(sm)
    ok = ok[ok["sweep"] == "size"].assign(t=synthesis.device_time)
    long_dtype = {v: k for k, v in R.SHORT_DTYPE.items()}
    for row in table.to_dict("records"):
        rows, width = (int(v) for v in row["shape"].split("×"))
        assert rows != main or width & (width - 1), row["shape"]
        op = "softmax_bwd" if " bwd " in row["op"] else "softmax"
        dtype = long_dtype.get(row["op"].split()[-1], row["op"].split()[-1])
        g = ok[(ok["op"] == op) & (ok["dtype"] == dtype) & (ok["rows"] == rows)
               & (ok["width"] == width)].set_index("impl")["t"]
        others = g.drop(["triton_fused", "triton_unfused"], errors="ignore").dropna()
        assert row["ours µs"] == pytest.approx(1e3 * g["triton_fused"])
        assert row["its / ours"] == pytest.approx(others.min() / g["triton_fused"])
    assert "fastest" in F.user_shapes_sentence(table)
    assert "none" in F.user_shapes_sentence(table.iloc[:0])


def test_bench_cost_sums_the_rows_wall_time():
    """Minutes per family and the shares of max-autotune, the libraries and our fused rows, from
    the rows' own wall_s; rows without it count nowhere."""
    rows = pd.DataFrame({
        "data": ["a", "a", "a", "b", "b"],
        "impl": ["torch_compile_max", "liger", "triton_fused", "torch_eager", "triton_fused"],
        "run_id": ["r"] * 5,
        "wall_s": [60.0, 30.0, 30.0, 60.0, float("nan")]})
    cost = R.bench_cost(rows).set_index("family")
    assert cost.loc["a", "minutes"] == pytest.approx(2.0)
    assert cost.loc["a", "max-autotune %"] == pytest.approx(50.0)
    assert cost.loc["a", "libraries %"] == pytest.approx(25.0)
    assert cost.loc["b", "rows"] == 1 and cost.loc["b", "fused %"] == 0
    assert cost.loc["all", "minutes"] == pytest.approx(3.0)
    assert R.bench_cost(rows.assign(wall_s=float("nan"))).empty


def test_trial_spread_names_the_widest_op():
    """The op whose long rows spread the most is named, with the others' 95th percentile."""
    n = 40
    df = pd.DataFrame({
        "status": "ok", "n_trials": 3, "gpu": "NVIDIA H100", "ms_median": 1.0,
        "op": ["a"] * n + ["b"] * n,
        "ms_trial_min": 1.0,
        "ms_trial_max": [1.01] * n + [2.0] * n})
    sp = R.trial_spread(df)
    assert sp["widest"]["op"] == "b"
    assert sp["widest"]["p95"] == pytest.approx(2.0)
    assert sp["widest"]["rest_p95"] == pytest.approx(1.01)
    assert "widest" not in R.trial_spread(df[df["op"] == "a"])


def test_cache_line_says_cold_or_warm(tmp_path):
    """The run record's cache counts become a sentence, the runs of a bench's workers (started
    together on one cache) counted once; older records say nothing was recorded."""
    runs = pd.DataFrame({"run_id": ["a", "b", "c", "d"],
                         "started_at": ["2026-11-26T01", "2026-11-26T01", "2026-11-26T02",
                                        "2026-11-26T03"],
                         "inductor_cache_files_start": [0, 0, 500, 700],
                         "inductor_cache_files_end": [None, None, 510, None]})
    runs.to_parquet(tmp_path / "runs.parquet")
    line = str(R.cache_line(tmp_path))
    assert line.startswith("Its 4 runs started with these numbers of files in Inductor's cache")
    assert line.endswith(": 2 runs with 0, 1 run with 500 (510 at the end), 1 run with 700."), line
    runs.iloc[2:3].to_parquet(tmp_path / "runs.parquet")
    assert str(R.cache_line(tmp_path)).startswith("Its run started with 500 files in Inductor's")
    runs.drop(columns=["inductor_cache_files_start"]).to_parquet(tmp_path / "runs.parquet")
    assert "not recorded" in str(R.cache_line(tmp_path))


def test_run_record_counts_the_caches():
    """A run record carries the caches' state at its start, in the runs schema."""
    import torch

    from triton_fusion_report.analysis import machine, schema

    meta = dict(run_id="r", git_commit="a" * 40)
    row = machine.run_record(meta, torch.device("cpu"), "start")
    for key in ("inductor_cache_files_start", "triton_cache_kernels_start",
                "flaggems_cache_files_start"):
        assert key in row and key in schema.RUNS


def test_targets_section_reads_the_kernels_counters(tmp_path, monkeypatch):
    """With profile_details.parquet in the results folder, the targets section puts our fused
    kernel beside the fastest other one per family, from the counters, and says by how much;
    without it (the reference before such a profile) it says none were measured."""
    import shutil

    from triton_fusion_report.analysis import profile as P

    qmd = next(q for q in CHAPTERS if q.stem == "synthesis")
    ref = ROOT / "results" / "reference" / "h100"
    folder = tmp_path / "run"
    shutil.copytree(ref, folder)
    page = P.ncu_details((ref / "ncu_softmax_v_5cbecbb.csv").read_text())
    meta = dict(gpu="NVIDIA H100 80GB HBM3", started_at="2026-11-26T06:00:00+00:00",
                git_commit="d3667c4b9eb213d90ad96ef04b4ca00b8937f752", status="ok",
                family="softmax_matmul", op="softmax_matmul")
    rows = [dict(meta, impl=impl, kernel=r["kernel"],
                 **{m: r[m] for m in P.DETAIL_METRICS.values() if m in r})
            for impl, r in zip(["triton_fused", "torch_compile"], page.to_dict("records"))]
    pd.DataFrame(rows).to_parquet(folder / "profile_details.parquet")
    ns = _chapter_namespace(qmd, folder, monkeypatch)
    assert list(ns["counters"]["impl"]) == ["triton_fused", "torch_compile"]
    assert ns["counter_text"].startswith("softmax(X) @ V: ours takes")
    assert "d3667c4b9eb2" in ns["det_src"]
    display = ns["S"].counter_display(ns["counters"])
    assert list(display["implementation"]) == ["fused", "compile"]
    assert "—" not in str(R.md_table(display))
    # The details are no sweep rows: one run still, nothing mixed, no row counted as untimed.
    assert R.provenance(folder, R.load_limits(folder))["runs"] == R.provenance(
        ref, R.load_limits(ref))["runs"]
    assert R.mixture(folder)["mixed"] == R.mixture(ref)["mixed"]
    assert len(R.family_rows(folder)) == len(R.family_rows(ref))
    # Only failed rows: the section says the profile failed, and why.
    pd.DataFrame([dict(meta, impl=None, status="failed", error="ERR_NVGPUCTRPERM")]).to_parquet(
        folder / "profile_details.parquet")
    ns = _chapter_namespace(qmd, folder, monkeypatch)
    assert ns["counters"] is None and "ERR_NVGPUCTRPERM" in ns["counter_text"]
    if not (ref / "profile_details.parquet").exists():
        ns = _chapter_namespace(qmd, ref, monkeypatch)
        assert ns["counters"] is None and "no such counters" in ns["counter_text"]


def test_conclusions_count_every_whole_op_library_and_ignore_ties():
    """The synthesis conclusions: cuBLASLt's epilogue and the peer libraries are libraries of
    the whole op (a loss to one is named); a library within the noise margin of ours is a tie,
    not "ahead"."""
    from triton_fusion_report.analysis import synthesis as S

    assert {"cublaslt", "liger", "flag_gems", "sdpa_cudnn"} <= set(S.LIBRARIES)
    table = pd.DataFrame([
        {"family": "softmax", "vs Triton unfused": 2.0, "vs eager": 1.2, "vs torch.compile": 1.0,
         "vs best library": 0.998, "best library": "Liger-Kernel"},
        {"family": "linear + GELU", "vs Triton unfused": 1.01, "vs eager": 0.99,
         "vs torch.compile": 1.02, "vs best library": 0.96, "best library": "cuBLASLt epilogue"},
    ])
    said = S.conclusions(table)
    assert said["library_ahead"] == "linear + GELU (0.96×)"
    assert said["loses"] == "linear + GELU (cuBLASLt epilogue 1.04× faster)"


def test_introduction_names_a_bench_spread_over_gpus(monkeypatch):
    """Rows of one commit measured by a bench's workers on several GPUs (a run each, the H100
    reference's case): the first page says so, rather than calling them runs of separate
    families; a one-device run (the CPU smoke run) says nothing of GPUs."""
    ref = ROOT / "results" / "reference" / "h100"
    src = R.provenance(ref, R.load_limits(ref))
    assert src["runs"] > 1 and src["gpus"] > 1 and len(R.mixture(ref)["commits"]) == 1
    ns = _chapter_namespace(ROOT / "report" / "index.qmd", ref, monkeypatch)
    assert f"the workers of one bench spread over {src['gpus']} GPUs" in ns["runs_text"]
    smoke = R.provenance(SMOKE, R.load_limits(SMOKE))
    assert (smoke["runs"], smoke["gpus"]) == (1, 0)
    ns = _chapter_namespace(ROOT / "report" / "index.qmd", SMOKE, monkeypatch)
    assert "spread over" not in ns["runs_text"]


def test_methods_give_a_multi_gpu_sweep_its_wall_time(monkeypatch):
    """A sweep spread over GPUs (the H100 reference's): the methods chapter gives the busiest
    GPU's minutes (the wall time), not only the sum over all of them; a one-device run does not."""
    ref = ROOT / "results" / "reference" / "h100"
    gpus = R.provenance(ref, R.load_limits(ref))["gpus"]
    ns = _chapter_namespace(ROOT / "report" / "methods.qmd", ref, monkeypatch)
    assert f"Spread over {gpus} GPUs, the busiest one's rows took" in str(ns["cost_sentence"])
    assert "15 minutes on one GPU: " in str(ns["cost_sentence"])
    assert "minutes of rows alone miss it on this folder's GPU" in str(ns["cost_sentence"])
    ns = _chapter_namespace(ROOT / "report" / "methods.qmd", SMOKE, monkeypatch)
    assert "Spread over" not in str(ns["cost_sentence"])


def test_bench_goal_line_says_met_or_missed():
    """The bench goal from the rows' own wall time: missed above the goal's minutes, met at or
    under it (with what the rows leave out), nothing without a timed row."""
    import pandas as pd

    rows = pd.DataFrame(dict(wall_s=[400.0, 500.0], gpu_index=[0, 1]))
    assert "15 minutes of rows alone meet it" in R.bench_goal_line(rows)
    slow = rows.assign(wall_s=[600.0, 400.0])
    assert "17 minutes of rows alone miss it" in R.bench_goal_line(slow)
    assert R.bench_goal_line(rows.assign(wall_s=float("nan"))) == ""


def test_methods_put_each_gpus_counters_side_by_side(monkeypatch):
    """Both references: the counters' fusion ratios of each GPU's own profile stand side by side
    (every op profiled on both); one folder keeps one set of columns."""
    import os

    both = os.pathsep.join(str(ROOT / "results" / "reference" / g) for g in ("h100", "h200"))
    ns = _chapter_namespace(ROOT / "report" / "methods.qmd", Path(both), monkeypatch)
    assert ns["gpus_named"] == "H100 and H200"
    ratios = ns["ratios"]
    assert {"measured_ratio (H100)", "measured_ratio (H200)"} <= set(ratios.columns)
    assert ratios[["measured_ratio (H100)", "measured_ratio (H200)"]].notna().all().all()
    ns = _chapter_namespace(ROOT / "report" / "methods.qmd", SMOKE, monkeypatch)
    assert "measured_ratio" in ns["ratios"].columns


def test_limit_of_several_runs_is_their_highest():
    """A multi-GPU bench's family spans several runs, each with its own limits: a figure's one
    line is the highest of those runs'; one run's is its own; a run it lacks gives NaN."""
    import pandas as pd

    limits = pd.DataFrame(dict(run_id=["a", "b", "c"], metric="matmul_peak", precision="fp16",
                               value=[700.0, 760.0, 900.0]))
    assert R.limit(limits, "matmul_peak", "fp16", run_id="a") == 700.0
    assert R.limit(limits, "matmul_peak", "fp16", run_id=["a", "b"]) == 760.0
    assert R.limit(limits, "matmul_peak", "fp16", run_id=["zz"]) != R.limit(
        limits, "matmul_peak", "fp16", run_id=["zz"])
    assert R.runs_of(pd.DataFrame(dict(run_id=["b", "a", "b"]))) == ["a", "b"]


def test_a_target_that_rounds_to_its_goal_shows_the_digits_that_decide():
    """469.99 TFLOP/s against a goal of 470 is a miss: the table must not print "470"."""
    import pandas as pd

    from triton_fusion_report.analysis import synthesis as S

    table = pd.DataFrame([
        dict(target="a", family="attention", unit="TFLOP/s", goal_impl=None, goal=470.0,
             fused=469.99, method=None, best_other=None, best_other_value=float("nan"), met=False),
        dict(target="b", family="attention", unit="TFLOP/s", goal_impl=None, goal=470.0,
             fused=516.2, method=None, best_other=None, best_other_value=float("nan"), met=False),
        dict(target="c", family="matmul_softmax", unit="ms", goal_impl=None, goal=0.9,
             fused=0.891, method="store_softmax", best_other=None, best_other_value=float("nan"),
             met=True)])
    shown = S.target_display(table)["Triton fused"].tolist()
    assert shown == ["469.99", "516", "0.891"]
    assert "store_softmax" in S.target_findings(table)["met_by_pair"]
