"""What the report's cells call: find and load a results folder, describe where the data comes
from, and small helpers (markdown tables, formatting). Thin cells, logic here, tested here."""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pandas as pd

from .. import schema
from ..families import FAMILIES
from ..model.roofline import limit  # noqa: F401 - the chapters call it as data.limit

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "results" / "reference" / "h100"
IMPL_ORDER = ["torch_eager", "torch_compile", "torch_compile_max", "triton_unfused",
              "triton_fused"]
IMPL_LABEL = {
    "torch_eager": "PyTorch eager",
    "torch_compile": "torch.compile",
    "torch_compile_max": "torch.compile max-autotune",
    "liger": "Liger-Kernel",
    "cce": "Cut Cross-Entropy",
    "flag_gems": "FlagGems",
    "cublaslt": "cuBLASLt epilogue",
    "triton_unfused": "Triton unfused",
    "triton_fused": "Triton fused",
    "sdpa_flash": "SDPA flash (FA2)",
    "sdpa_cudnn": "SDPA cuDNN",
    "sdpa_efficient": "SDPA mem-efficient",
    "cublas": "cuBLAS matmul alone",
}
# Column heads narrow enough for a table of every implementation on a (PDF) page.
SHORT_LABEL = {"torch_eager": "eager", "torch_compile": "compile",
               "torch_compile_max": "max-autotune", "triton_unfused": "unfused",
               "triton_fused": "fused", "sdpa_flash": "FA2", "sdpa_cudnn": "cuDNN",
               "sdpa_efficient": "mem-eff.", "cublas": "cuBLAS alone", "cublaslt": "cuBLASLt",
               "liger": "Liger", "cce": "CCE", "flag_gems": "FlagGems"}
# Dtype names short enough for a label.
SHORT_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}



def results_dirs(results: str | os.PathLike | None = None) -> list[Path]:
    """Every folder a render shows: the `results` parameter if given, else $FUSION_RESULTS (set
    by `make render`; several folders separated by os.pathsep), else the committed references:
    the H100's, then the H200's where it exists. The chapters read the first; the across-families
    chapter compares them all."""
    default = os.pathsep.join(str(p) for p in (REFERENCE, REFERENCE.parent / "h200")
                              if (p / "limits.parquet").exists()) or str(REFERENCE)
    chosen = str(results or os.environ.get("FUSION_RESULTS") or default)
    paths = []
    for item in filter(None, chosen.split(os.pathsep)):
        path = Path(item)
        if not path.is_absolute():
            path = ROOT / path
        if not (path / "limits.parquet").exists():
            raise FileNotFoundError(f"no results in {path} (limits.parquet missing)")
        paths.append(path)
    return paths



def gpu_of(results: Path) -> str:
    """The GPU a folder's limits were measured on (the most frequent, where runs differ)."""
    gpus = pd.read_parquet(Path(results) / "limits.parquet", columns=["gpu"])["gpu"]
    return str(gpus.mode().iloc[0]) if len(gpus) else "unknown GPU"


def gpu_label(gpu: str) -> str:
    """A GPU's short name for a column or a list: "NVIDIA H100 80GB HBM3" -> "H100"."""
    return str(gpu).replace("NVIDIA ", "").split()[0]


def data_file(results: Path, name: str) -> Path:
    """results/name (which may not exist: a run that did not measure it)."""
    return Path(results) / name


# What a run on the CPU (Triton's interpreter) measures is the interpreter's wall clock: not a time.
TIMING_COLUMNS = ["ms_median", "ms_mean", "ms_std", "ms_min", "ms_graph", "ms_device", "gbps",
                  "tflops", "pct_copy_bw", "pct_matmul_peak", "peak_mib", "ms_trial_min",
                  "ms_trial_max"]


def on_cpu(df: pd.DataFrame) -> bool:
    return len(df) > 0 and str(df["gpu"].iloc[0]).startswith("cpu")


def load(results: Path, family: str, op: str | None = None) -> pd.DataFrame:
    """A family's rows: those of `op`, by default the family's main op (its `primary_op`:
    attention's file also holds forward+backward and decoding rows, softmax's the backward's, op
    "softmax_bwd"); empty where the folder has none (the chapters then say what is missing).
    Rows measured on the CPU keep their correctness check but lose their timings (NaN): the
    interpreter's speed is not a finding."""
    path = Path(results) / f"{family}.parquet"
    df = _rows_of(path, family, op or FAMILIES[family].primary_op)
    if on_cpu(df):
        for column in TIMING_COLUMNS:
            if column in df:
                df[column] = float("nan")
    return df


def _rows_of(path: Path, family: str, op: str | None) -> pd.DataFrame:
    """The rows of `op` (all of them for None) in a family's file, with the columns added since
    it was written filled in (see `schema.with_added_columns`)."""
    if not path.exists():  # the family was not measured: no rows, every column
        return schema.family_schema(family).empty_table().to_pandas()
    df = schema.with_added_columns(pd.read_parquet(path), family)
    if op is not None:
        df = df[df["op"] == op].reset_index(drop=True)
    if family == "attention":
        # Rows from before grouped heads and KV caches: as many k/v heads and keys as queries.
        for col, same in (("kv_heads", "heads"), ("seq_k", "seq")):
            df[col] = df[col].fillna(df[same]) if col in df else df[same]
    if "ms_device" not in df:
        df["ms_device"] = float("nan")  # data from before device time was measured
    return df


def load_csv(results: Path, name: str) -> pd.DataFrame:
    """A CSV table of a run (e.g. host_overhead.csv); empty where the run did not write it."""
    path = Path(results) / f"{name}.csv"
    return pd.read_csv(path) if path.exists() else pd.DataFrame()



def load_limits(results: Path) -> pd.DataFrame:
    """The limits measured by every run in the folder."""
    return pd.read_parquet(Path(results) / "limits.parquet").drop_duplicates(
        ["run_id", "metric", "precision"])


def run_of(df: pd.DataFrame) -> str:
    """The run of one configuration's rows (every implementation of a configuration is measured
    in one run, on one GPU)."""
    return str(df["run_id"].iloc[0])


def runs_of(df: pd.DataFrame) -> list[str]:
    """The runs a family's rows come from: one for a one-GPU bench, one per worker (and per
    resume) for a multi-GPU one. `limit` of them is the highest of their limits."""
    return sorted(set(df["run_id"].dropna().astype(str)))



# Parquet files of a results folder that hold no family's sweep rows.
NOT_FAMILY_FILES = ("limits", "runs", "profile", "profile_details")


def family_rows(results: Path) -> pd.DataFrame:
    """Every row of every family file in a results folder, `data` naming its file (a column
    some files lack is empty in their rows)."""
    frames = [pd.read_parquet(path).assign(data=path.stem)
              for path in sorted(Path(results).glob("*.parquet"))
              if path.stem not in NOT_FAMILY_FILES]
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)



def short_commit(commit: str) -> str:
    dirty = commit.endswith("-dirty")
    return commit.removesuffix("-dirty")[:12] + ("-dirty" if dirty else "")




def ratio_range(r: pd.Series) -> str:
    """The span of a series of ratios: "1.05 to 1.27×"."""
    return range_text(r.min(), r.max(), ".2f") + "×"


def range_text(lo: float, hi: float, fmt: str) -> str:
    """"lo to hi" in fmt, or the one value where both read the same (a range of one run, of
    equal values, never "7.5 to 7.5")."""
    a, b = format(lo, fmt), format(hi, fmt)
    return a if a == b else f"{a} to {b}"



def main_rows(df: pd.DataFrame) -> pd.DataFrame:
    """A reduction family's rows at its largest row count, where the width sweeps run (4096 in
    the grid); the few-row shapes (e.g. 8 x 50257) are other problems, shown apart. Frames
    without a `rows` column pass through."""
    if "rows" not in df or not len(df):
        return df
    return df[df["rows"] == df["rows"].max()]


def ok_rows(df: pd.DataFrame, sweep: str = "size") -> pd.DataFrame:
    return df[(df["status"] == "ok") & (df["sweep"] == sweep)]



def num(v: float, digits: int = 3) -> str:
    """A number for people: `digits` significant digits, thousands separated, no exponent."""
    if v is None or pd.isna(v):
        return "—"
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    places = max(0, digits - 1 - int(math.floor(math.log10(abs(v)))))
    return f"{v:,.{places}f}"


def md_table(df: pd.DataFrame, floatfmt: str | None = None, index: bool = False) -> "Markdown":
    """A pipe table (Quarto renders it in HTML and typst alike), with no extra dependency.
    Floats as `num` gives them unless `floatfmt` is given."""
    if df is None or len(df) == 0:
        return Markdown("| data |\n|:---|\n| none in this results folder |")
    if index:
        df = df.reset_index()
    def cell(v):
        if isinstance(v, float):
            return "—" if pd.isna(v) else (format(v, floatfmt) if floatfmt else num(v))
        # "@" would start a citation in Pandoc's markdown (softmax(X)@V); "|" a new column.
        return str(v).replace("@", "\\@").replace("|", "\\|")
    head = "| " + " | ".join(map(str, df.columns)) + " |"
    body = [[cell(v) for v in row] for row in df.itertuples(index=False)]

    def width(i, name):
        # Pandoc sizes a wide table's columns by the dashes of this rule: each column by its
        # longest entry (up to a cap, past which text wraps at spaces) and at least its heading's
        # longest word and its cells' (a shape, 8192×768×50257, never breaks), plus the padding.
        longest = max((len(r[i]) for r in body), default=3)
        word = max((len(w) for r in body for w in r[i].split()), default=3)
        return 3 + max(3, len(max(str(name).split() or [""], key=len)), word, min(18, longest))
    rule = "|" + "|".join(("-" * width(i, c) + ":") if pd.api.types.is_numeric_dtype(df[c])
                          else (":" + "-" * width(i, c)) for i, c in enumerate(df.columns)) + "|"
    rows = ["| " + " | ".join(r) + " |" for r in body]
    return Markdown("\n".join([head, rule, *rows]))


def pow2(n: int, plot: bool = False) -> str:
    """2^k for exact powers of two (markdown superscript, or mathtext for a plot), else the number
    with thousands separators."""
    if missing(n):
        return "—"
    n = int(n)
    if n > 0 and n & (n - 1) == 0:
        k = n.bit_length() - 1
        return f"$2^{{{k}}}$" if plot else f"2^{k}^"
    return f"{n:,}"


def tbps(gbps: float) -> str:
    return "—" if missing(gbps) else f"{gbps / 1000:.2f} TB/s"


def missing(value) -> bool:
    """A value the data does not hold: NaN or None."""
    if value is None:
        return True
    try:
        return math.isnan(value)
    except TypeError:
        return False



class AmbiguousRows(Exception):
    """A selection meant to pick one configuration matched several: a book bug (e.g. a width
    measured at two row counts), never read as "not measured"."""


class Markdown(str):
    """A string that Jupyter displays as markdown: inline `{python}` values render without quotes,
    and a cell ending in one shows a table. (IPython's own Markdown would need IPython, which the
    GPU machine that runs the tests may lack.)"""

    def _repr_markdown_(self):
        return str(self)


_NAN = re.compile(r"(?<![\w.])-?(nan|inf)(?![\w])", re.I)


def md(value, fmt: str | None = None) -> Markdown:
    """Format a value for inline use in prose: `{python} md(x, '.2f')`. A value the data lacks
    (NaN, inf), also inside an already formatted string, shows as "—"."""
    if missing(value) or (isinstance(value, str) and not value.strip()):
        return Markdown("—")
    text = format(value, fmt) if fmt else str(value)
    return Markdown(_NAN.sub("—", text))



def device_ms(df: pd.DataFrame) -> pd.Series:
    """ms per call of each row: the device time (CUDA-graph replay) where measured, else the
    per-call median."""
    if "ms_device" not in df:
        return df["ms_median"]
    return df["ms_device"].fillna(df["ms_median"])


def timed(df: pd.DataFrame, sweep: str = "size", **where) -> pd.DataFrame:
    """The rows of one sweep that ran and were timed, matching `where`, with `t_ms` (device
    time where measured, else per call) and `device` (whether t_ms is device time)."""
    sel = ok_rows(df, sweep) if len(df) else df
    for k, v in where.items():
        sel = sel[sel[k] == v]
    if not len(sel):
        return sel.assign(t_ms=pd.Series(dtype=float), device=pd.Series(dtype=bool))
    sel = sel.assign(t_ms=device_ms(sel),
                     device=sel["ms_device"].notna() if "ms_device" in sel else False)
    return sel[sel["t_ms"].notna()]


class Lack(str):
    """What a finding needs and the data lack. It prints as nothing: a folder that lacks a family
    would otherwise say so in every sentence; the chapter names its lacks once (`lacks_line`) and
    the findings' banner names the folder's (summary.banner)."""

    def __new__(cls, what: str):
        self = super().__new__(cls, "")
        self.what = what
        return self

    def __reduce__(self):  # the chapter cache pickles it
        return Lack, (self.what,)


# An inline value that renders as nothing in HTML and PDF alike (Quarto shows the source of an
# empty one).
NOTHING = "<!-- -->"


def lacking(what: str) -> Lack:
    """Where a chapter's data lack what a finding needs: no sentence, a note of what is missing."""
    return Lack(what)


def lacks_line(says, folder) -> str:
    """A chapter's one line on what its data lack (empty where they lack nothing it needs)."""
    whats = list(dict.fromkeys(s.what for s in says if isinstance(s, Lack)))
    if not whats:
        return ""
    if not gpu_timed(folder):
        return ("*Not in these data: GPU timings (a run on the CPU checks correctness only), which "
                "the findings of this chapter need.*")
    if len(whats) > 3:  # a missing family takes many findings: the banner names it
        return (f"*These data lack what {len(whats)} of this chapter's findings need "
                f"(@sec-findings says what the folder lacks), among them: "
                + "; ".join(whats[:3]) + ".*")
    return "*Not in these data, so not said here: " + "; ".join(whats) + ".*"


def gpu_timed(folder) -> bool:
    """Whether a folder's runs timed anything: a run on the CPU (Triton's interpreter) does not."""
    return not gpu_of(folder).startswith("cpu")


# Below this much device time per call, a kernel's fixed costs (its launch, the clocks' ramp, a
# partial wave of programs) outweigh its bytes and FLOPs: a case this small is decided by them
# (verdict's "small" regime), and the book makes no bandwidth, compute-bound or launch-free
# claim about it. A smoke run's toy sizes all fall below it.
SMALL_MS = 0.02


def toy(ms) -> bool:
    """Whether a fused call of `ms` (device time) is too small for a bandwidth or compute claim."""
    return missing(ms) or ms < SMALL_MS


# The files of the steps a bench runs after its sweep (analysis/bench/steps.py's TAIL_STEPS;
# the book does not import the bench) and of its profile, as the banner names them.
TAIL_FILES = {"seed002.parquet": "the second seed of softmax(X) @ V",
              "launch_cost.csv": "the launch costs", "model_check.csv": "the GPT-2 check",
              "lm_head_front.csv": "the LM head's time-memory front"}
PROFILE_FILE = "profile.parquet"


def stopped_runs(folder) -> pd.DataFrame:
    """The runs of a folder that did not finish and that no later run (a --resume) finished: a
    bench stopped part way (its status "running" or "stopped"), or one still running."""
    path = Path(folder) / "runs.parquet"
    if not path.exists():
        return pd.DataFrame()
    runs = pd.read_parquet(path)
    done = runs[runs["status"] == "finished"]["started_at"].astype(str)
    last = done.max() if len(done) else ""
    return runs[(runs["status"] != "finished") & (runs["started_at"].astype(str) > last)]


def times(rows: pd.DataFrame) -> dict:
    """impl -> t_ms over `timed` rows of one configuration (the fastest row of an impl)."""
    return rows.groupby("impl")["t_ms"].min().to_dict() if len(rows) else {}
