"""What the report's cells call: find and load a results folder, describe where the data comes
from, and small helpers (markdown tables, formatting). Thin cells, logic here, tested here."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "results" / "reference" / "h100"
IMPL_ORDER = ["torch_eager", "torch_compile", "triton_unfused", "triton_fused"]
IMPL_LABEL = {
    "torch_eager": "PyTorch eager",
    "torch_compile": "torch.compile",
    "triton_unfused": "Triton unfused",
    "triton_fused": "Triton fused",
    "sdpa_flash": "SDPA flash (FA2)",
    "sdpa_cudnn": "SDPA cuDNN",
    "sdpa_efficient": "SDPA mem-efficient",
    "cublas": "cuBLAS matmul alone",
}


def results_dir(results: str | os.PathLike | None = None) -> Path:
    """The folder a chapter reads: the `results` parameter if given, else $FUSION_RESULTS (set by
    `make render`), else the committed reference measured on an H100."""
    chosen = results or os.environ.get("FUSION_RESULTS") or REFERENCE
    path = Path(chosen)
    if not path.is_absolute():
        path = ROOT / path
    if not (path / "limits.parquet").exists():
        raise FileNotFoundError(f"no results in {path} (limits.parquet missing)")
    return path


def data_file(results: Path, name: str) -> Path:
    """results/name, or the committed reference's copy when a partial run (`make bench
    BENCH_ARGS='--family ...'`) did not measure it; `note(df)` says so in the chapter."""
    path = Path(results) / name
    return path if path.exists() else REFERENCE / name


def load(results: Path, family: str) -> pd.DataFrame:
    path = data_file(results, f"{family}.parquet")
    df = pd.read_parquet(path)
    df.attrs["from_reference"] = path.parent.resolve() != Path(results).resolve()
    return df


def load_csv(results: Path, name: str) -> pd.DataFrame:
    """A CSV table of a run (e.g. host_overhead.csv), or the reference's copy (see `data_file`)."""
    return pd.read_csv(data_file(results, f"{name}.csv"))


def source_line(table: pd.DataFrame) -> str:
    """Where a CSV table (see `load_csv`) was measured: GPU, date, versions."""
    r = table.iloc[0]
    return (f"Measured on {r['gpu']} on {str(r['date'])[:10]}, torch {r['torch']}, "
            f"triton {r['triton']}.")


def data_line(**frames: pd.DataFrame) -> "Markdown":
    """The chapter's provenance sentence: GPU and date of each family's run, and a warning for a
    family whose data came from the committed reference (see `load`)."""
    parts, fallback = [], []
    for name, df in frames.items():
        parts.append(f"{name} measured on {df['gpu'].iloc[0]} on {str(df['started_at'].iloc[0])[:10]}"
                     f" (run {df['run_id'].iloc[0]})")
        if df.attrs.get("from_reference"):
            fallback.append(name)
    text = "Data: " + "; ".join(parts) + "."
    if fallback:
        text += (" This results folder has no data for " + ", ".join(fallback)
                 + ": those figures come from the committed reference.")
    return Markdown(text)


def load_limits(results: Path) -> pd.DataFrame:
    """The limits of every run in the folder, and of the reference's runs (which a chapter falls
    back to, see `load`)."""
    frames = [pd.read_parquet(Path(results) / "limits.parquet")]
    if (REFERENCE / "limits.parquet").resolve() != (Path(results) / "limits.parquet").resolve():
        frames.append(pd.read_parquet(REFERENCE / "limits.parquet"))
    return pd.concat(frames).drop_duplicates(["run_id", "metric", "precision"])


def limit(limits: pd.DataFrame, metric: str, precision: str = "ieee", run_id=None) -> float:
    """One measured limit (GB/s for copy_bw, TFLOP/s for matmul_peak) of the run `run_id` (the
    run a family's rows came from), else of the latest run; NaN if not measured."""
    if run_id is None:
        run_id = limits["run_id"].max()
    hit = limits[(limits["metric"] == metric) & (limits["precision"] == precision)
                 & (limits["run_id"] == run_id)]["value"]
    return float(hit.iloc[0]) if len(hit) and pd.notna(hit.iloc[0]) else float("nan")


def run_of(df: pd.DataFrame) -> str:
    """The run a family's rows come from (one family is measured in one run)."""
    return str(df["run_id"].iloc[0])


def provenance(results: Path, limits: pd.DataFrame) -> dict:
    """Where the data come from, for the report's first page: the latest run in the folder
    (`runs` counts them; each family's chapter names its own run)."""
    row = limits.sort_values("run_id").iloc[-1]
    return dict(
        gpu=row["gpu"], date=str(row["started_at"])[:10], started_at=row["started_at"],
        torch=row["torch"], triton=row["triton"], cuda=row["cuda"], commit=row["git_commit"],
        run_id=row["run_id"], folder=str(Path(results).resolve().relative_to(ROOT))
        if Path(results).resolve().is_relative_to(ROOT) else str(results),
        is_reference=Path(results).resolve().is_relative_to(REFERENCE.parent.resolve()),
        runs=int(limits["run_id"].nunique()),
        first_date=str(limits["started_at"].min())[:10],
    )


def ok_rows(df: pd.DataFrame, sweep: str = "size") -> pd.DataFrame:
    return df[(df["status"] == "ok") & (df["sweep"] == sweep)]


def pivot(df: pd.DataFrame, index, value: str = "ms_median") -> pd.DataFrame:
    """Implementations as columns, in the report's order."""
    p = df.pivot_table(index=index, columns="impl", values=value, aggfunc="first")
    return p[[c for c in IMPL_ORDER if c in p.columns] + [c for c in p.columns if c not in IMPL_ORDER]]


def md_table(df: pd.DataFrame, floatfmt: str = ".3g", index: bool = False) -> "Markdown":
    """A pipe table (Quarto renders it in HTML and typst alike), with no extra dependency."""
    if index:
        df = df.reset_index()
    def cell(v):
        if isinstance(v, float):
            return "" if pd.isna(v) else format(v, floatfmt)
        return str(v)
    head = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(df[c]) else ":---"
                          for c in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return Markdown("\n".join([head, rule, *body]))


def pow2(n: int, plot: bool = False) -> str:
    """2^k for exact powers of two (markdown superscript, or mathtext for a plot), else the number
    with thousands separators."""
    n = int(n)
    if n > 0 and n & (n - 1) == 0:
        k = n.bit_length() - 1
        return f"$2^{{{k}}}$" if plot else f"2^{k}^"
    return f"{n:,}"


def tbps(gbps: float) -> str:
    return f"{gbps / 1000:.2f} TB/s"


class Markdown(str):
    """A string that Jupyter displays as markdown: inline `{python}` values render without quotes,
    and a cell ending in one shows a table. (IPython's own Markdown would need IPython, which the
    GPU machine that runs the tests may lack.)"""

    def _repr_markdown_(self):
        return str(self)


def md(value, fmt: str | None = None) -> Markdown:
    """Format a value for inline use in prose: `{python} md(x, '.2f')`."""
    return Markdown(format(value, fmt) if fmt else str(value))


def targets(rows: list[dict]) -> pd.DataFrame:
    """The target table of a chapter: one row per target with what was wanted, what this data
    measured, and whether it holds ("**no**" in bold where it does not)."""
    t = pd.DataFrame(rows, columns=["target", "at", "wanted", "measured", "met"])
    t["met"] = t["met"].map(lambda ok: "yes" if ok else ("**no**" if ok is not None else "n/a"))
    return t


def value_at(df: pd.DataFrame, impl: str, column: str = "ms_median", **where) -> float:
    """The one value of `column` for `impl` in the rows matching `where` (NaN if none ran)."""
    sel = df[df["impl"] == impl]
    for k, v in where.items():
        sel = sel[sel[k] == v]
    sel = sel[sel["status"] == "ok"]
    return float(sel[column].iloc[0]) if len(sel) else float("nan")
