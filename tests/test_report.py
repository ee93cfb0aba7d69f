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
import pytest  # noqa: E402

from analysis import report as R  # noqa: E402

from qmd import cells, chapters, inline_expressions, prose, run_cell  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = chapters(ROOT)


def test_every_chapter_is_rendered():
    on_disk = set((ROOT / "report").glob("*.qmd"))
    assert on_disk == set(CHAPTERS), "a .qmd in report/ is missing from _quarto.yml or vice versa"


@pytest.mark.parametrize("qmd", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_cells_run(qmd, tmp_path, monkeypatch):
    monkeypatch.chdir(qmd.parent)  # Quarto runs a chapter's cells from its own folder
    # REPORT_TEST_RESULTS: try the chapters on another results folder (default: the reference).
    monkeypatch.setenv("FUSION_RESULTS", os.environ.get("REPORT_TEST_RESULTS", str(R.REFERENCE)))
    figures_dir = Path(os.environ.get("REPORT_FIGURES_DIR", tmp_path))
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
        assert "nan" not in shown.lower() and "None" not in shown, f"{qmd.name}: `{expr}` -> {shown}"
        if isinstance(value, float):
            assert math.isfinite(value)


NUMBER_WITH_UNIT = re.compile(
    r"\d+(\.\d+)?\s?(x faster|× faster|TB/s|GB/s|TFLOP/s|ms\b|µs\b|%)")


@pytest.mark.parametrize("qmd", CHAPTERS, ids=lambda p: p.stem)
def test_prose_types_no_measured_numbers(qmd):
    """Measured numbers in prose come from `{python}` expressions, never typed in."""
    text = re.sub(r"`\{python\}[^`]*`", "", prose(qmd.read_text()))
    assert not NUMBER_WITH_UNIT.findall(text), NUMBER_WITH_UNIT.search(text).group(0)


@pytest.mark.parametrize("qmd", CHAPTERS, ids=lambda p: p.stem)
def test_cross_references_resolve(qmd):
    """Every @fig-/@tbl- reference in the prose names a labelled cell of the same chapter."""
    text = qmd.read_text()
    labels = {str(c.options.get("label")) for c in cells(text)}
    for ref in re.findall(r"@((?:fig|tbl)-[A-Za-z0-9_-]+)", prose(text)):
        assert ref.rstrip(".-") in labels, f"{qmd.name}: @{ref} has no cell"


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
