"""Every chapter's cells, run in order in one namespace per chapter as Quarto's Jupyter engine
runs them, against many results folders: the committed references, a CPU smoke run, GPU smoke
runs (complete and stopped part way), and the reference with random subsets of its rows,
configurations, implementations or whole families removed (fixed seeds). A cell may say that
the data lack something; it may not fail. Quarto itself is not needed.

Set BOOK_FIGURES_DIR to keep the figures as PNG files to look at."""
import contextlib
import io
import os
import re
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

from triton_fusion_report.analysis import book  # noqa: E402
from triton_fusion_report.analysis.book import data as D  # noqa: E402
from triton_fusion_report.analysis.schema import FAMILY_SHAPES  # noqa: E402

from conftest import FULL  # noqa: E402
from qmd import cells, chapters, inline_expressions, prose, run_cell  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = chapters(ROOT)
SMOKE = ROOT / "tests" / "data"
REFERENCE = D.REFERENCE


def run_chapter(qmd: Path, results) -> dict:
    """Run every cell of a chapter and every inline expression; return what they made."""
    text = qmd.read_text()
    ns: dict = {}
    made = {"figures": 0, "tables": 0, "inline": [], "table_text": [], "printed": []}
    for cell in cells(text):
        code = cell.code
        if "parameters" in (cell.options.get("tags") or []):
            code = f"results = {None if results is None else str(results)!r}"
        plt.close("all")
        with contextlib.redirect_stdout(io.StringIO()) as printed:  # an `output: asis` cell's text
            out = run_cell(code, ns)
        made["printed"].append(printed.getvalue())
        label = str(cell.options.get("label", ""))
        if label.startswith("fig-"):
            figs = [plt.figure(n) for n in plt.get_fignums()]
            assert len(figs) == 1, f"{qmd.name} {label}: {len(figs)} figures, not one"
            # A figure the cell also returns would be shown twice (the inline backend shows it).
            assert not hasattr(out, "savefig"), f"{qmd.name} {label}: assign the figure, don't return it"
            made["figures"] += 1
            if os.environ.get("BOOK_FIGURES_DIR"):
                target = Path(os.environ["BOOK_FIGURES_DIR"])
                target.mkdir(exist_ok=True)
                figs[0].savefig(target / f"{label}.png", dpi=70)
        if label.startswith("tbl-"):
            assert out is not None and "|" in str(out), f"{qmd.name} {label}: no table"
            made["tables"] += 1
            made["table_text"].append(str(out))
    for expr in inline_expressions(text):
        value = str(eval(expr, ns))
        assert value.strip(), f"{qmd.name}: `{expr}` is empty"
        assert not re.search(r"(?<![\w.])(nan|inf)(?![\w])", value, re.I), f"{qmd.name}: `{expr}` -> {value}"
        made["inline"].append(value)
    plt.close("all")
    return made


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch, tmp_path):
    """No chapter cache; the data appendix's CSV files in the test's own folder, not in
    report/data/, which a render running beside the tests (CI) copies into its output."""
    from triton_fusion_report.analysis.book import data_tables, lm_head

    monkeypatch.setattr(book, "CACHE", False)
    monkeypatch.setattr(data_tables, "CSV_DIR", tmp_path / "csv")
    monkeypatch.setattr(lm_head, "FIG_DIR", tmp_path / "figures")


def test_chapters_are_the_files():
    on_disk = set((ROOT / "report").glob("*.qmd")) | {ROOT / "index.qmd"}
    assert on_disk == set(CHAPTERS), "a .qmd is missing from _quarto.yml or vice versa"


@pytest.mark.parametrize("qmd", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_on_the_references(qmd):
    made = run_chapter(qmd, os.pathsep.join(str(p) for p in D.results_dirs(None)))
    lack = [s for s in made["inline"] if LACK_LINE.search(s)]
    assert not lack, f"{qmd.name}: the reference lacks something a sentence needs: {lack}"


@pytest.mark.parametrize("qmd", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_on_a_cpu_smoke_run(qmd):
    run_chapter(qmd, SMOKE / "smoke")


GPU_SMOKES = sorted(p for p in SMOKE.glob("smoke_*") if (p / "limits.parquet").exists())


@pytest.mark.parametrize("folder", GPU_SMOKES, ids=lambda p: p.name)
@pytest.mark.parametrize("qmd", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_on_a_gpu_smoke_run(qmd, folder):
    run_chapter(qmd, folder)


def _config_keys(family: str, df: pd.DataFrame) -> list[str]:
    return [c for c in ["op", "dtype", "precision", "sweep", *FAMILY_SHAPES[family]] if c in df]


def _without(tmp: Path, seed: int, how: str) -> Path:
    """The H100 reference with rows removed at random (fixed seed)."""
    rng = np.random.default_rng(seed)
    for path in REFERENCE.iterdir():
        shutil.copy(path, tmp / path.name)
    families = [f for f in FAMILY_SHAPES if (REFERENCE / f"{f}.parquet").exists()]
    if how == "families":
        for family in rng.choice(families, size=rng.integers(1, len(families)), replace=False):
            (tmp / f"{family}.parquet").unlink()
        for extra in ("profile.parquet", "profile_details.parquet", "launch_cost.csv",
                      "host_overhead.csv", "model_check.csv", "seed002.parquet"):
            if rng.random() < 0.5 and (tmp / extra).exists():
                (tmp / extra).unlink()
        return tmp
    for family in families:
        path = tmp / f"{family}.parquet"
        df = pd.read_parquet(path)
        if how == "rows":
            keep = rng.random(len(df)) > rng.uniform(0.2, 0.8)
        elif how == "configs":
            keys = df[_config_keys(family, df)].astype(str).agg("|".join, axis=1)
            gone = set(rng.choice(keys.unique(), size=len(keys.unique()) // 2, replace=False))
            keep = ~keys.isin(gone)
        elif how == "impls":
            impls = df["impl"].unique()
            keep = ~df["impl"].isin(rng.choice(impls, size=rng.integers(1, len(impls)), replace=False))
        else:  # "failed": a random half of the rows failed (no timings)
            hit = rng.random(len(df)) < 0.5
            df.loc[hit, "status"] = "oom"
            df.loc[hit, D.TIMING_COLUMNS + ["max_rel_err"]] = float("nan")
            keep = np.ones(len(df), bool)
        df[keep].reset_index(drop=True).to_parquet(path)
    return tmp


# Whole families removed in `make test`; every kind and seed in `make test-all`.
REMOVALS = [pytest.param(how, seed, id=f"{how}-{seed}",
                         marks=[] if (how, seed) == ("families", 0) else [FULL])
            for how in ("families", "rows", "configs", "impls", "failed") for seed in (0, 1)]


@pytest.mark.parametrize("how,seed", REMOVALS)
def test_every_chapter_with_rows_removed(tmp_path, how, seed):
    folder = _without(tmp_path, seed, how)
    for qmd in CHAPTERS:
        run_chapter(qmd, folder)


BOOKKEEPING = [
    (re.compile(r"\b20\d{6}T\d{6}Z"), "a run id"),
    (re.compile(r"(?<![\w/])[0-9a-f]{7,40}(?![\w/])"), "a commit or hash"),
    (re.compile(r"NOTES"), "a pointer to the notes"),
    (re.compile(r"\b(target|goal)s?\b.*\b(met|missed)\b|\bnot met\b", re.I), "a verdict on a target"),
]


# What a reader of a chapter is not asked to read as words: file names, dates, code identifiers.
# Code spans (`two_pass_store`, `F.scaled_dot_product_attention`) name code on purpose.
AS_WORDS = [
    (re.compile(r"[\w./-]+\.(?:py|csv|parquet|md|ya?ml|toml|json)\b"), "a file name"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}\b"), "a date"),
    (re.compile(r"\b(?!head_dim\b)[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b"), "a code identifier as a word"),
]
# head_dim: the attention head's width, named as the attention APIs and the tables name it.
CODE_SPAN = re.compile(r"`[^`]*`")


def as_words(text: str) -> str:
    """Text a reader reads as words: without code spans, inline expressions and the {#...}
    attributes of headings and tables."""
    return re.sub(r"\{#[^}]*\}", " ", CODE_SPAN.sub(" ", text))


@pytest.mark.parametrize("qmd", [q for q in CHAPTERS if "report/" not in str(q)
                                 or q.stem not in ("reproducibility", "data", "methods")],
                         ids=lambda p: p.stem)
def test_no_bookkeeping_in_the_chapters(qmd):
    """Run ids, commits, the notes and verdicts on project targets belong to the appendix: not
    in a chapter's prose, nor in what its cells print. Nor do file names, dates and code
    identifiers used as words, in the prose, the captions, the computed sentences or the tables
    (the reproducibility appendix has them)."""
    source = qmd.read_text()
    text = prose(source)
    captions = " ".join(str(c.options.get(k, "")) for c in cells(source)
                        for k in ("fig-cap", "tbl-cap"))
    made = run_chapter(qmd, None)
    printed = " ".join(made["inline"])
    for pattern, what in BOOKKEEPING:
        for where, body in (("prose", text), ("computed text", printed)):
            hit = pattern.search(body)
            assert not hit, f"{qmd.name}: {what} in its {where}: {hit.group(0)!r}"
    for pattern, what in AS_WORDS:
        for where, body in (("prose", text), ("captions", captions), ("computed text", printed),
                            ("tables", " ".join(made["table_text"]))):
            hit = pattern.search(as_words(body))
            assert not hit, f"{qmd.name}: {what} in its {where}: {hit.group(0)!r}"


def test_summary_comes_first():
    assert CHAPTERS[0] == ROOT / "index.qmd"
    text = CHAPTERS[0].read_text()
    assert "tbl-headline" in text and "fig-predicted" in text


def test_host_cost_keeps_second_cases_apart(tmp_path):
    """A second case of an op (nn.Parameter weights, a new length) is never averaged into the
    op's figure."""
    from triton_fusion_report.analysis.book import across

    def row(op, shape, impl, us):
        return dict(op=op, shape=shape, impl=impl, host_us=us, host_us_min=us, host_us_max=us,
                    gpu_us=2.0, first_ms=1.0, error=None)
    pd.DataFrame([row("raw launch", "1 arg", "triton_noop", 10.0),
                  row("raw launch", "10 args", "triton_noop", 20.0),
                  row("layer_norm", "8x1024", "torch_eager", 15.0),
                  row("layer_norm", "8x1024", "public", 30.0),
                  row("layer_norm", "8x1024 (nn.Parameter weights, no_grad)", "public", 90.0),
                  row("attention", "1x2x128x64", "public", 24.0),
                  row("attention", "1x2x120x64 (new length, same bucket)", "public", 25.0)]
                 ).to_csv(tmp_path / "launch_cost.csv", index=False)
    lc = across.launch(tmp_path)
    assert lc["host"]["public"].to_dict() == {"layer_norm": 30.0, "attention": 24.0}
    assert lc["floor_10"] == 20.0
    assert "1 of 1 ops" in across.launch_say(lc)


def test_lm_head_section_only_where_its_rows_are(tmp_path):
    """The matmul chapter's LM head section: absent from a folder without the family's rows,
    present with its table and sentence where it has them (the H100 reference, a made-up run)."""
    from triton_fusion_report.analysis.book import lm_head

    assert lm_head.compute([REFERENCE])["say"]["section"].startswith("## The LM head")
    (tmp_path / "none").mkdir()
    assert lm_head.compute([tmp_path / "none"])["say"]["section"] == ""
    impls = ["torch_eager", "torch_compile", "liger", "triton_fused"]
    rows = pd.DataFrame(dict(
        family="linear_cross_entropy", op="linear_cross_entropy_fwd_bwd", impl=impls,
        dtype="bfloat16", precision="bfloat16", tokens=8192, hidden=768, vocab=50257,
        status="ok", sweep="size", gpu="NVIDIA H100 80GB HBM3", run_id="r",
        ms_median=[22.2, 4.5, 26.9, 3.9], peak_mib=[4626.0, 860.0, 12.0, 300.0]))
    rows.to_parquet(tmp_path / "linear_cross_entropy.parquet")
    c = lm_head.compute([tmp_path])
    section = c["say"]["section"]
    assert section.startswith("## The LM head and its loss")
    assert "ours takes 3.90 ms, torch.compile 4.50 ms (ours at a speedup of 1.15×)" in section
    assert "300 MiB against torch.compile's 860" in section
    # Liger's chunks by its own rule; no limits in the folder: no bytes nor model time.
    assert "and is slow by its design" in section and "At 8192×768×50257: 64 chunks of 128 rows." in section and "GB" not in section
    assert list(c["table"].columns)[2:] == ["PyTorch eager", "torch.compile", "Liger-Kernel",
                                            "Triton fused"]


def _front_csv(folder: Path, compile_at=(5.0, 500.0), default=True) -> None:
    """A made-up LM head front at one shape, with and without a bias: ours at 1, 2 and 4 chunks
    (512 rows, 2 chunks, its default), eager, torch.compile (`compile_at`: ms, MiB), Liger-Kernel,
    and Cut Cross-Entropy without a bias."""
    rows = []
    for bias in (True, False):
        points = [("torch_eager", None, 10.0, 1000.0), ("torch_compile", None, *compile_at),
                  ("triton_fused", 1024, 3.0, 520.0), ("triton_fused", 512, 3.2, 300.0),
                  ("triton_fused", 256, 4.0, 200.0), ("liger", None, 12.0, 160.0)]
        points += [] if bias else [("cce", None, 8.0, 150.0)]
        rows += [dict(gpu="NVIDIA H100 80GB HBM3", tokens=1024, hidden=64, vocab=1000, bias=bias,
                      impl=impl, dtype="bfloat16", chunk_rows=chunk, status="ok", ms=ms,
                      peak_mib=mib, **({"default_chunk_rows": 512} if default else {}))
                 for impl, chunk, ms, mib in points]
    rows.append(dict(rows[0], impl="torch_compile", status="oom", ms=None, peak_mib=None))
    pd.DataFrame(rows).to_csv(folder / "lm_head_front.csv", index=False)


def test_lm_head_front_where_the_step_ran(tmp_path):
    """The LM head's time-memory front: a figure and a paragraph where the folder has the step's
    file; whether a peer beats any of our chunkings on both counts; the least memory; our
    default's place (from the step's rows, else the sweep's); max-autotune's point from the
    sweep; nothing without the file."""
    from triton_fusion_report.analysis.book import lm_head

    (tmp_path / "none").mkdir()
    c = lm_head.compute([tmp_path / "none"])
    assert not len(c["front"]) and c["say"]["front"] == "" and lm_head.front_figure(c) == ""
    _front_csv(tmp_path)
    c = lm_head.compute([tmp_path])
    text = c["say"]["front"]
    assert c["say"]["section"].startswith("## The LM head and its loss")  # no sweep rows
    assert ("At 1024×64×1000, no other implementation is both faster and smaller than ours at any "
            "chunking, and at some chunking ours is both faster and smaller than PyTorch eager "
            "and torch.compile.") in text
    assert ("The least memory is Cut Cross-Entropy's, 150 MiB at 8.00 ms without a bias, against "
            "ours at 4 chunks: 200 MiB at 4.00 ms.") in text
    assert ("Our default, 2 chunks of 512 rows (1 MiB of logits a chunk), is on the front without "
            "a bias: 3.20 ms and 300 MiB, against 3.00 ms and 520 MiB at 1 chunk and 4.00 ms and "
            "200 MiB at 4 chunks.") in text
    assert "@fig-lm-front" in text and "nearer their peak" in text
    assert c["front"]["default"].sum() == 2 and not c["front"]["from_sweep"].any()
    for pattern, what in AS_WORDS:  # a reader's words: no file names nor identifiers
        for body in (text, lm_head.FRONT_CAPTION):
            assert not pattern.search(as_words(body)), (what, pattern.search(as_words(body)))
    md = lm_head.front_figure(c, tmp_path / "figures")
    assert md.startswith("![The LM head and its loss in bfloat16")
    assert "](figures/lm-head-front.svg){#fig-lm-front width=100%}" in md and text in md
    assert (tmp_path / "figures" / "lm-head-front.svg").stat().st_size > 1000
    assert not plt.get_fignums()  # drawn, written and closed: the cell shows no figure itself

    # torch.compile both faster and smaller than ours at one and two chunks: said, with numbers.
    _front_csv(tmp_path, compile_at=(2.5, 250.0))
    text = lm_head.compute([tmp_path])["say"]["front"]
    assert "no other implementation is both faster and smaller" not in text
    assert ("torch.compile is both faster and smaller than ours at 1 chunk with a bias (2.50 "
            "against 3.00 ms, 250 against 520 MiB); torch.compile is both faster and smaller than "
            "ours at 2 chunks with a bias (2.50 against 3.20 ms, 250 against 300 MiB)") in text
    assert "is off the front without a bias" in text

    # The default from the sweep's rows of ours, and max-autotune's point (with a bias) from them.
    _front_csv(tmp_path, default=False)
    sweep = pd.DataFrame(dict(
        family="linear_cross_entropy", op="linear_cross_entropy_fwd_bwd",
        impl=["triton_fused", "torch_compile_max"], variant=["chunks of 512 rows", None],
        dtype="bfloat16", precision="bfloat16", tokens=1024, hidden=64, vocab=1000, status="ok",
        sweep="size", gpu="NVIDIA H100 80GB HBM3", run_id="r", ms_median=[3.1, 2.9],
        peak_mib=[310.0, 400.0]))
    sweep.to_parquet(tmp_path / "linear_cross_entropy.parquet")
    c = lm_head.compute([tmp_path])
    pts = c["front"]
    assert pts["default"].sum() == 2 and set(pts[pts["default"]]["rows"]) == {512}
    autotune = pts[pts["impl"] == "torch_compile_max"]
    assert len(autotune) == 1 and autotune["bias"].all() and autotune["from_sweep"].all()
    assert ("torch.compile max-autotune is both faster and smaller than ours at 1 chunk with a "
            "bias") in c["say"]["front"]
    fig = lm_head.fig_front(pts)
    assert len(fig.axes) == 1 and fig.axes[0].get_title() == "1024×64×1000"
    plt.close(fig)


def test_lm_head_front_in_the_chapter(tmp_path):
    """The matmul chapter prints the front's figure and paragraph after the LM head's table where
    the folder has the step's file (the reference, and one with the test's file), nothing where
    it has none."""
    import shutil as sh

    from triton_fusion_report.analysis.book import lm_head

    qmd = ROOT / "report" / "matmul.qmd"
    folder = tmp_path / "ref"
    sh.copytree(REFERENCE, folder)
    (folder / "lm_head_front.csv").unlink(missing_ok=True)
    printed = "".join(run_chapter(qmd, folder)["printed"])
    assert "{#tbl-lm-head}" in printed and "fig-lm-front" not in printed
    shape = pd.read_parquet(REFERENCE / "linear_cross_entropy.parquet").iloc[0]
    _front_csv(folder)
    front = pd.read_csv(folder / "lm_head_front.csv")
    front[["tokens", "hidden", "vocab"]] = shape[["tokens", "hidden", "vocab"]].to_list()
    front.to_csv(folder / "lm_head_front.csv", index=False)
    printed = "".join(run_chapter(qmd, folder)["printed"])
    assert printed.index("{#tbl-lm-head}") < printed.index("{#fig-lm-front width=100%}")
    assert (lm_head.FIG_DIR / lm_head.FIG_NAME).exists()  # the test's folder (_no_cache)
    if (REFERENCE / "lm_head_front.csv").exists():
        printed = "".join(run_chapter(qmd, REFERENCE)["printed"])
        assert printed.index("{#tbl-lm-head}") < printed.index("{#fig-lm-front width=100%}")


def test_model_section_reads_the_model_check(tmp_path):
    """The GPT-2 section: tokens/s against eager, the GPU's split, the host table and the training
    distance from a run's CSVs; a folder without them says what is lacking."""
    from triton_fusion_report.analysis.book import model

    empty = model.compute([tmp_path])["say"]
    assert empty["section"] == "" and "GPT-2 timings" in empty["gpt2"].what
    timing = dict(kind="timing", status="ok", batch=8, seq=1024, ops="attention head layer_norm mlp")
    pd.DataFrame([
        dict(timing, impl="torch_eager", tokens_per_s=100e3, step_ms=80.0, gpu_ms=70.0,
             peak_mib=8192.0),
        dict(timing, impl="triton_fused", tokens_per_s=150e3, step_ms=53.0, gpu_ms=30.0,
             peak_mib=4096.0),
        dict(timing, impl="torch_compile", tokens_per_s=200e3, step_ms=40.0, gpu_ms=35.0,
             peak_mib=6144.0),
        dict(timing, impl="torch_compile_triton_head", tokens_per_s=220e3, step_ms=36.0,
             gpu_ms=32.0, peak_mib=5120.0),
        dict(kind="check", check="fwd+bwd loss vs float32", passed=True, status=None)]
    ).to_csv(tmp_path / "model_check.csv", index=False)
    pd.DataFrame(dict(impl=["torch_eager", "triton_fused"], kind=["attention", "attention"],
                      gpu_ms=[2.0, 3.0])).to_csv(tmp_path / "model_ops.csv", index=False)
    pd.DataFrame(dict(step=[0, 1], torch_distance=[0.01, 0.02], triton_distance=[0.005, 0.04])
                 ).to_csv(tmp_path / "model_train.csv", index=False)
    host = [("layer_norm fwd+bwd", "8x1024", {"torch_eager": 140.0, "public": 280.0,
                                              "python_floor": 119.0}),
            ("attention fwd+bwd", "1x2x128x64", {"torch_eager": 200.0, "public": 260.0,
                                                 "python_floor": 110.0})]
    pd.DataFrame([dict(op=op, shape=shape, impl=i, host_us=us) for op, shape, impls in host
                  for i, us in impls.items()]).to_csv(tmp_path / "launch_cost.csv", index=False)
    text = model.compute([tmp_path])["say"]["section"]
    assert "| LayerNorm 8×1024 | 140 | 280 | 119 |" in text
    assert "costs LayerNorm 85%, attention 55% of eager's whole forward + backward" in text
    assert "fit in the 21 to 90 µs that eager's op costs above that floor; ours take 150 to 161" \
        in text
    lc = pd.read_csv(tmp_path / "launch_cost.csv")
    lc[~((lc["impl"] == "public") & lc["op"].str.startswith("layer_norm"))
       & ~((lc["impl"] == "python_floor") & lc["op"].str.startswith("attention"))
       ].to_csv(tmp_path / "launch_cost.csv", index=False)
    assert model._floor_sentence(tmp_path) == ""  # no op has all three: no sentence
    assert "1.50× eager's tokens/s" in text and "(1.10×)" in text
    assert "from 6.0 to 5.0 GiB" in text and "at 1 of 2 steps" in text
    assert "| eager + our ops | 150k | 1.50 |" in text and "1 of 1 checks" in text
    assert "garbage collector" not in text  # the run did not say how it timed
    c = pd.read_csv(tmp_path / "model_check.csv")
    c.loc[c["kind"] == "timing", "gc"] = "off"
    c.to_csv(tmp_path / "model_check.csv", index=False)
    assert "garbage collector off" in model.compute([tmp_path])["say"]["section"]
    from triton_fusion_report.analysis.book import summary

    finding = summary._model(model.timings(tmp_path))
    assert ("runs at 1.50× eager PyTorch's tokens/s in 0.50× its peak memory; its GPU is busy "
            "30.0 of each 53.0 ms step (eager's 70.0 of 80.0)") in finding
    assert "alone make it 1.10× faster (@sec-model)." in finding
    assert isinstance(summary._model(model.timings(tmp_path / "none")), D.Lack)
    # Each variant's slowest and fastest step, where the run recorded them, and the GPU.
    c["gpu"] = "NVIDIA H100 80GB HBM3"
    c["tokens_per_s_min"], c["tokens_per_s_max"] = c["tokens_per_s"] * 0.8, c["tokens_per_s"] * 1.2
    c.to_csv(tmp_path / "model_check.csv", index=False)
    text = model.compute([tmp_path])["say"]["section"]
    assert "| eager + our ops | 150k (120–180k) | 1.50 |" in text
    assert ("Each variant's tokens/s is the median of its timed steps, one run on one H100: ours "
            "ranged over 120k to 180k tokens/s from step to step, eager's over 80k to 120k.") in text
    assert ("Those are median steps: ours ranged over 120k to 180k tokens/s, eager's 80k to "
            "120k.") in summary._model(model.timings(tmp_path))


def test_model_section_compares_captured_steps_with_pytorchs_fastest(tmp_path):
    """Captured whole steps: ours against PyTorch's fastest captured variant (not eager's), × eager
    against eager of the same kind of step, the kernel kind that holds a slower one of ours back,
    and chapter 1's finding led by the captured verdict."""
    from triton_fusion_report.analysis.book import model, summary

    timing = dict(kind="timing", status="ok", batch=8, seq=1024)
    rows = [("torch_eager", 100e3, 4000.0), ("triton_fused", 150e3, 3000.0),
            ("torch_eager_graph", 110e3, 5000.0), ("torch_compile_graph", 300e3, 6000.0),
            ("triton_fused_graph", 270e3, 4500.0), ("torch_compile_triton_graph", 360e3, 4800.0)]
    pd.DataFrame([dict(timing, impl=i, tokens_per_s=t, step_ms=8e6 / t, gpu_ms=7e6 / t,
                       peak_mib=m) for i, t, m in rows]).to_csv(tmp_path / "model_check.csv",
                                                                 index=False)
    pd.DataFrame(dict(impl=["torch_compile_graph"] * 2 + ["triton_fused_graph"] * 2,
                      kind=["other", "attention"] * 2, gpu_ms=[2.0, 4.0, 9.0, 3.0])
                 ).to_csv(tmp_path / "model_ops.csv", index=False)
    text = model.compute([tmp_path])["say"]["section"]
    assert ("PyTorch's fastest, torch.compile, runs at 300k tokens/s in 5.9 GiB; torch.compile + "
            "all our ops at 360k in 4.7 GiB (a speedup of 1.20×); eager + our ops at 270k in 4.4 "
            "GiB (a speedup of 0.90×).") in text
    assert ("What holds eager + our ops back is other kernels: 9.0 ms of GPU time a step "
            "against 2.0.") in text
    assert "| torch.compile, captured | 300k | 2.73 |" in text  # against eager captured
    assert "| eager + our ops | 150k | 1.50 |" in text
    finding = summary._model(model.timings(tmp_path))
    assert finding.startswith("**In a model, once the host is out, our kernels pay.** With its "
                              "whole training step captured as one CUDA graph, GPT-2 small runs "
                              "at a speedup of 1.20× with torch.compile + all our ops over "
                              "PyTorch's fastest captured step, torch.compile's, in 0.80× its "
                              "peak memory.")
    c = pd.read_csv(tmp_path / "model_check.csv")
    c.loc[c["impl"] == "torch_compile_triton_graph", "tokens_per_s"] = 200e3
    c.to_csv(tmp_path / "model_check.csv", index=False)
    assert summary._model(model.timings(tmp_path)).startswith(
        "**In a model, once the host is out, our kernels lose.**")


def test_training_table_reads_the_training_rows(tmp_path):
    """The model section's training-shape table: ms per forward + backward call by op and shape,
    each implementation's and ours over the fastest other's; none from CPU rows (no timings)."""
    from triton_fusion_report.analysis.book import model

    smoke = Path(__file__).parent / "data" / "smoke"
    shutil.copy(smoke / "training.parquet", tmp_path / "training.parquet")
    assert not len(model.training(tmp_path))  # the interpreter's times are not findings
    r = pd.read_parquet(tmp_path / "training.parquet")
    r["gpu"] = "NVIDIA H100 80GB HBM3"
    r["status"] = "ok"
    ms = {"torch_eager": 0.2, "torch_compile": 0.3, "liger": 0.25, "triton_fused": 0.1}
    r["ms_median"] = r["impl"].map(ms)
    r.to_parquet(tmp_path / "training.parquet")
    t = model.training(tmp_path)
    assert list(t.columns) == ["op, forward + backward", "eager", "torch.compile", "Liger",
                               "ours", "speedup"]
    assert len(t) == r.groupby(["op", "dtype", "rows", "width"]).ngroups
    assert set(t["speedup"]) == {"2.00×"} and t.iloc[0]["ours"] == "0.100"


def test_gluon_table_only_where_the_kernel_sweep_is(tmp_path):
    """The attention chapter's Gluon subsection: on a folder that predates the kernel sweep (the
    H100 reference without its rows forced to each kernel) no table and one sentence that says
    so; with the sweep's rows (made up here from the tuned rows' times), the table of TFLOP/s per
    head_dim x causal and sentences that say where Gluon beats the `tl` kernels, where it trails
    and where it does not apply, every figure from the rows. The reference itself has the table."""
    from triton_fusion_report.analysis.book import attention

    assert len(attention.compute([REFERENCE])["gluon"]) == 4
    qmd = ROOT / "report" / "attention.qmd"
    for path in REFERENCE.iterdir():
        shutil.copy(path, tmp_path / path.name)
    df = pd.read_parquet(REFERENCE / "attention.parquet")
    df = df[df["sweep"] != "kernel"]
    df.to_parquet(tmp_path / "attention.parquet")
    c = attention.compute([tmp_path])
    assert not len(c["gluon"]) and c["say"]["gluon"] == attention.PREDATES_GLUON
    made = run_chapter(qmd, tmp_path)
    assert attention.PREDATES_GLUON in made["inline"]
    assert "tbl-attn-gluon" not in "".join(made["printed"])

    tuned = df[(df["op"] == "attention_fwd") & (df["impl"] == "triton_fused")
               & (df["sweep"] == "size") & (df["seq"] == 4096) & df["head_dim"].isin([64, 128])]
    assert len(tuned) == 4
    # Gluon's speed over tl's (the tl rows: the tuned rows' times): None, it does not apply.
    speed = {(128, False): 1.25, (128, True): 0.8, (64, False): 0.9, (64, True): None}
    forced = []
    for _, r in tuned.iterrows():
        tl, gluon = r.copy(), r.copy()
        tl["sweep"] = gluon["sweep"] = "kernel"
        tl["variant"], gluon["variant"] = "tl", "gluon"
        s = speed[(int(r["head_dim"]), bool(r["causal"]))]
        if s is None:
            gluon["status"] = "unsupported"
            gluon[D.TIMING_COLUMNS] = float("nan")
        else:
            gluon[["ms_median", "ms_device"]] = r[["ms_median", "ms_device"]] / s
        forced += [tl, gluon]
    pd.concat([df, pd.DataFrame(forced)]).to_parquet(tmp_path / "attention.parquet")

    c = attention.compute([tmp_path])
    table = c["gluon"]
    assert list(table.columns) == ["head_dim", "causal", "Gluon", "tl", "tuned", "cuDNN",
                                   "Gluon / cuDNN", "Gluon / tl"]
    assert [(r.head_dim, r.causal) for r in table.itertuples()] == [
        (128, "no"), (128, "yes"), (64, "no"), (64, "yes")]
    assert table["Gluon / tl"].round(6).tolist()[:3] == [1.25, 0.8, 0.9]
    assert table["Gluon"].isna().tolist() == [False, False, False, True]
    assert (table["tl"] == table["tuned"]).all()
    cudnn = df[(df["op"] == "attention_fwd") & (df["impl"] == "sdpa_cudnn") & (df["seq"] == 4096)
               & (df["head_dim"] == 128) & ~df["causal"] & (df["sweep"] == "size")]
    gluon_ms = tuned[(tuned["head_dim"] == 128) & ~tuned["causal"]]["ms_device"].iloc[0] / 1.25
    vs_cudnn = cudnn["ms_device"].min() / gluon_ms
    assert table["Gluon / cuDNN"].iloc[0] == pytest.approx(vs_cudnn)
    say = c["say"]["gluon"]
    assert say == (
        "In @tbl-attn-gluon (sequences of 4,096 tokens) the Gluon forward beats the `tl` kernels at head_dim "
        f"128 (non-causal), at 1.25× their speed ({vs_cudnn:.2f}× cuDNN's), though the tuned op "
        "ran at the `tl` kernels' speed there (its own timing chose them). It trails them at "
        "head_dim 128 (causal) and head_dim 64 (non-causal), at 0.80 to 0.90× their speed, and "
        "the tuned op runs at theirs there. At head_dim 64 (causal) it does not apply.")
    # The tuned op at Gluon's speed where Gluon wins; a Gluon row that failed is named.
    ran = pd.DataFrame(dict(head_dim=[128, 64], seq=[4096, 4096], causal=[False, True],
                            gluon=[500.0, float("nan")], tl=[400.0, 300.0], tuned=[495.0, 300.0],
                            cuDNN=[600.0, 400.0], **{"gluon status": ["ok", "wrong_result"]}))
    ran = ran.assign(**{"Gluon / cuDNN": ran["gluon"] / ran["cuDNN"],
                        "Gluon / tl": ran["gluon"] / ran["tl"]})
    assert attention._gluon_sentence(ran) == (
        "In @tbl-attn-gluon (sequences of 4,096 tokens) the Gluon forward beats the `tl` kernels "
        "at head_dim 128 (non-causal), at 1.25× their speed (0.83× cuDNN's), and the tuned op "
        "runs at its speed there. At head_dim 64 (causal) its row failed (wrong_result).")
    # The tuned op below both kernels it picks between: how far, and why that is a tie.
    tie = ran.iloc[:1].assign(tl=480.0, tuned=465.0, **{
        "gluon per call": 1.02, "tl per call": 1.03, "tuned per call": 1.0, "trial spread": 0.08,
        "one run": True})
    assert attention._below_both(tie, tie) == (
        " At head_dim 128 (non-causal) the tuned op measures 0.93× the faster kernel's speed, "
        "below both kernels it picks between although it runs one of them: the three rows come "
        "from one run on one GPU, but each row's device time comes from one of its trials, and "
        "in time per call (the median of its trials) the tuned op is the fastest of the three. "
        "The rows' trials spread by up to 8% and the two kernels differ by 4%: a tie, which "
        "the tuner's own timing may break either way.")
    assert attention._below_both(ran, ran) == ""  # the tuned op at Gluon's speed: nothing to say
    apart = tie.assign(**{"trial spread": 0.02})  # the kernels further apart than the trials
    assert attention._below_both(apart, apart).endswith("although it runs one of them.")
    made = run_chapter(qmd, tmp_path)
    assert say in made["inline"] and attention.PREDATES_GLUON not in made["inline"]
    printed = "".join(made["printed"])
    assert "| head_dim | causal | Gluon |" in printed and "{#tbl-attn-gluon}" in printed


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


# A ratio the other way round from the book's one convention (a speedup is the other's time over
# ours): ours or the fused kernel in a numerator, "its time" multiples, "N× slower than".
# (Counted bytes over the model's, "fused/model", are not a speedup.)
OTHER_WAY = re.compile(r"\b(fused|ours)('s)?( kernel's)?( device)?( time)?\s*/\s*(?!model)[a-z]"
                       r"|×\s+its time|×\s+slower|× the fused kernel's time(?! \(its speedup)",
                       re.I)


@pytest.mark.parametrize("qmd", CHAPTERS, ids=lambda p: p.stem)
def test_one_ratio_convention(qmd):
    """Captions, prose, table headers and computed sentences state every ratio as a speedup (the
    other's time over ours, above 1: ours faster), never the other way round."""
    made = run_chapter(qmd, None)
    for where, body in (("source", qmd.read_text()), ("computed text", " ".join(made["inline"])),
                        ("tables", " ".join(made["table_text"]))):
        hit = OTHER_WAY.search(body)
        assert not hit, f"{qmd.name}: a ratio the other way round in its {where}: {hit.group(0)!r}"


def test_the_appendix_says_which_peer_library_was_not_installed(tmp_path):
    """A folder whose peer rows say `unsupported` because the library was not installed gets a
    note naming it and how many configurations lack it; one that failed for another reason, or
    measured them, gets none."""
    from triton_fusion_report.analysis.book import reproducibility as R

    smoke = Path(__file__).parent / "data" / "smoke"
    note = R.peers_note(R.folders_of([smoke])[0])
    assert "Liger-Kernel (" in note and "not installed" in note and "make setup" in note
    for path in smoke.glob("*.parquet"):
        df = pd.read_parquet(path)
        if "impl" in df:
            df.loc[df["impl"] == "liger", "error"] = "RuntimeError: no kernel for this shape"
        df.to_parquet(tmp_path / path.name)
    assert R.peers_note(R.folders_of([tmp_path])[0]) == ""


# --- partial and toy-size folders (issue 55) ------------------------------------------------------

# A chapter's one line on what its data lack (data.lacks_line), and the banner of the findings.
LACK_LINE = re.compile(r"Not in these data|lack what \d+ of this chapter")
# Sentences that say nothing at toy sizes: rates and shares that print as zero, claims of what
# bounds a kernel or of launches that do not weigh.
NONSENSE = re.compile(r"(?<![\d.,])0 / 0\b|(?<![\d.,])0 GFLOP|(?<![\d.,])0 MiB|(?<![\d.,])0\.0 GiB"
                      r"|(?<![\d.,])0% of|0\.0\d TB/s|bound by the tensor cores|launches do not weigh"
                      r"|buys what the bytes say|the bytes set the time|a matmul sets the time"
                      r"|Time follows the matmul|stay behind cuDNN|, the fastest here,\.")
BANNER = re.compile(r"## (What these data lack|These data time nothing)")
PARTIAL = [SMOKE / "smoke", SMOKE / "smoke_h100", SMOKE / "smoke_h100_partial"]


def _text(made: dict) -> list[str]:
    """What a reader reads of a chapter: its computed sentences and what its cells print."""
    return [s for s in made["inline"] + made["printed"] if s.strip() and s != D.NOTHING]


@pytest.mark.parametrize("folder", PARTIAL, ids=lambda p: p.name)
def test_partial_folders_read_sensibly(folder):
    """From the smoke folders (a CPU run, a complete GPU run at toy sizes, one stopped part way):
    one banner atop the findings naming what the folder lacks and whether its run stopped; at
    most one line per chapter on what its data lack; no sentence out of its regime (rates that
    print as zero, bandwidth, compute or launch claims at sizes under data.SMALL_MS); the
    headline table and the predicted-vs-measured figure on the same families."""
    from triton_fusion_report.analysis.book import summary

    for qmd in CHAPTERS:
        made = run_chapter(qmd, folder)
        text = _text(made)
        banners = [s for s in text if BANNER.search(s)]
        if qmd.stem == "index":
            assert len(banners) == 1, f"{folder.name}: {len(banners)} banners in the findings"
            banner = banners[0]
            if D.gpu_timed(folder):
                assert "the Nsight Compute profile" in banner and "the GPT-2 check" in banner
                assert "LM head + loss" in banner and "toy-sized" in banner
            assert ("stopped part way" in banner) == (folder.name == "smoke_h100_partial")
            if folder.name == "smoke_h100_partial":
                assert "softmax(X) @ V and matmul + softmax, which its run was to measure" in banner
            assert not any(LACK_LINE.search(s) for s in text if s != banner), qmd.name
        else:
            assert not banners, f"{qmd.name}: a banner outside the findings"
            lines = [s for s in text if LACK_LINE.search(s)]
            assert len(lines) <= 1, f"{qmd.name} on {folder.name}: {lines}"
        for s in text:
            assert "These data hold no" not in s and "not available here" not in s, (qmd.name, s)
            hit = NONSENSE.search(s)
            assert not hit, f"{qmd.name} on {folder.name}: {hit.group(0)!r} in {s[:300]!r}"
    c = summary.compute(D.results_dirs(folder))
    assert set(c["table"]["_family"] if len(c["table"]) else []) == set(c["pvm"]["family"])


@pytest.mark.parametrize("how,seed", REMOVALS)
def test_headline_table_and_figure_show_the_same_families(tmp_path, how, seed):
    from triton_fusion_report.analysis.book import summary

    c = summary.compute([_without(tmp_path, seed, how)])
    assert set(c["table"]["_family"] if len(c["table"]) else []) == set(c["pvm"]["family"])


def test_the_references_banner_names_only_what_they_lack():
    """The committed references: a note on the H100's missing profile at most, nothing else."""
    from triton_fusion_report.analysis.book import summary, verdict

    for folder in D.results_dirs(None)[:1]:
        text = summary.banner(folder, verdict.every_case(folder))
        assert "stopped" not in text and "toy-sized" not in text and "the rows of" not in text
        assert not text or "Nsight Compute profile" in text
