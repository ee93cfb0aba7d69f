"""What the report's cells call: find and load a results folder, describe where the data comes
from, and small helpers (markdown tables, formatting). Thin cells, logic here, tested here."""
from __future__ import annotations

import math
import os
import re
from collections import Counter
from pathlib import Path

import pandas as pd

from .. import schema

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "results" / "reference" / "h100"
IMPL_ORDER = ["torch_eager", "torch_compile", "torch_compile_max", "triton_unfused",
              "triton_fused"]
IMPL_LABEL = {
    "torch_eager": "PyTorch eager",
    "torch_compile": "torch.compile",
    "torch_compile_max": "torch.compile max-autotune",
    "liger": "Liger-Kernel",
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
               "liger": "Liger", "flag_gems": "FlagGems"}
# Dtype names short enough for a label.
SHORT_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
# The Triton kernel libraries measured beside PyTorch where they have the op (analysis/peers.py).
PEERS = ["liger", "flag_gems"]


def short_columns(impls) -> dict:
    """Renames a distance table's "<label> %" columns to the short labels."""
    return {IMPL_LABEL.get(i, i) + " %": SHORT_LABEL.get(i, i) + " %" for i in impls}


def results_dirs(results: str | os.PathLike | None = None) -> list[Path]:
    """Every folder a render shows: the `results` parameter if given, else $FUSION_RESULTS (set
    by `make render`; several folders separated by os.pathsep), else the committed references:
    the H100's, then the H200's where it exists. The chapters read the first; the synthesis
    compares them all."""
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


def results_dir(results: str | os.PathLike | None = None) -> Path:
    """The folder the chapters read: the first of `results_dirs`."""
    return results_dirs(results)[0]


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


# Families whose file holds several ops: what `load` gives unless another op is asked for.
PRIMARY_OP = {"attention": "attention_fwd", "softmax": "softmax"}


def load(results: Path, family: str, op: str | None = None) -> pd.DataFrame:
    """A family's rows: those of `op`, by default the family's main op (PRIMARY_OP: attention's
    file also holds forward+backward and decoding rows, softmax's the backward's, op
    "softmax_bwd"); empty where the folder has none (the chapters then say what is missing).
    Rows measured on the CPU keep their correctness check but lose their timings (NaN): the
    interpreter's speed is not a finding."""
    path = Path(results) / f"{family}.parquet"
    df = _rows_of(path, family, op or PRIMARY_OP.get(family))
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


def source_line(table: pd.DataFrame) -> str:
    """Where a CSV table (see `load_csv`) was measured: GPU, date, versions."""
    r = table.iloc[0]
    commit = f" at commit {str(r['git_commit'])[:12]}" if "git_commit" in r and pd.notna(
        r["git_commit"]) else ""
    return (f"Measured on {r['gpu']} on {str(r['date'])[:10]}{commit}, torch {r['torch']}, "
            f"triton {r['triton']}.")


def data_line(**frames: pd.DataFrame) -> "Markdown":
    """The chapter's provenance sentence: GPU and date of each family's run, and a warning for a
    family whose data came from the committed reference (see `load`). An empty frame (a part no
    run measured, see `load`) is left out: the chapter says so where it would show it."""
    frames = {name: df for name, df in frames.items() if len(df)}
    parts, fallback = [], []
    for name, df in frames.items():
        runs = runs_of(df)
        gpus = df["gpu_index"].dropna().nunique() if "gpu_index" in df else 1
        where = (f"run {runs[0]}" if len(runs) == 1 else
                 f"{len(runs)} runs" + (f" on {gpus} GPUs" if gpus > 1 else "")
                 + f", {runs[0]} to {runs[-1]}")
        parts.append(f"{name} measured on {df['gpu'].iloc[0]} on {str(df['started_at'].iloc[0])[:10]}"
                     f" ({where})")
        if df.attrs.get("from_reference"):
            fallback.append(name)
    text = "Data: " + "; ".join(parts) + "."
    if fallback:
        text += (" This results folder has no data for " + ", ".join(fallback)
                 + ": those figures come from the committed reference.")
    cpu = [name for name, df in frames.items() if df.attrs.get("on_cpu")]
    if cpu:
        text += (" The " + ", ".join(cpu) + " rows were run on the CPU through Triton's "
                 "interpreter: every output was checked against float64, but nothing was timed, "
                 "so the figures and values that need a time are empty (shown as —).")
    for name, df in frames.items():
        failed = df[df["status"] != "ok"]
        if len(failed):
            counts = ", ".join(
                f"{len(g)} {status} of " + ", ".join(IMPL_LABEL.get(i, i) for i in g["impl"].unique())
                for status, g in failed.groupby("status"))
            text += (f" {len(failed)} of the {len(df)} {name} rows failed ({counts}): they are "
                     "missing from the figures, and values that need them are shown as —.")
    return Markdown(text)


def load_limits(results: Path) -> pd.DataFrame:
    """The limits measured by every run in the folder."""
    return pd.read_parquet(Path(results) / "limits.parquet").drop_duplicates(
        ["run_id", "metric", "precision"])


def limit(limits: pd.DataFrame, metric: str, precision: str = "ieee", run_id=None) -> float:
    """One measured limit (GB/s for copy_bw, TFLOP/s for matmul_peak) of the run `run_id` (the
    run a family's rows came from), else of the latest run; NaN if not measured. Given several
    runs (`runs_of`: the workers of a multi-GPU bench), the highest of theirs: one line a figure
    can draw that none of those runs measured above."""
    if run_id is None:
        run_id = limits["run_id"].max()
    ids = [run_id] if isinstance(run_id, str) else list(run_id)
    hit = limits[(limits["metric"] == metric) & (limits["precision"] == precision)
                 & (limits["run_id"].isin(ids))]["value"].dropna()
    return float(hit.max()) if len(hit) else float("nan")


def run_of(df: pd.DataFrame) -> str:
    """The run of one configuration's rows (every implementation of a configuration is measured
    in one run, on one GPU)."""
    return str(df["run_id"].iloc[0])


def runs_of(df: pd.DataFrame) -> list[str]:
    """The runs a family's rows come from: one for a one-GPU bench, one per worker (and per
    resume) for a multi-GPU one. `limit` of them is the highest of their limits."""
    return sorted(set(df["run_id"].dropna().astype(str)))


def provenance(results: Path, limits: pd.DataFrame) -> dict:
    """Where the data come from, for the report's first page: the latest run in the folder
    (`runs` counts them; each family's chapter names its own run)."""
    # The runs the folder's own data rows come from (`limits` also holds the reference's runs,
    # and runs that measured nothing else); the latest of them describes the data.
    rows = family_rows(results)
    # Seed 002's benchmark (its own protocol, a run of its own) is not one of the sweep's runs.
    if "data" in rows:
        rows = rows[rows["data"] != "seed002"]
    # Rows measured on several GPUs: at one commit (`mixture`), a bench's workers, a run each.
    gpus = int(rows["gpu_index"].nunique()) if "gpu_index" in rows and len(rows) else 1
    rows = rows[["run_id", "started_at"]] if {"run_id", "started_at"} <= set(rows) else rows.iloc[:0]
    own = pd.read_parquet(Path(results) / "limits.parquet")
    with_rows = own[own["run_id"].isin(set(rows["run_id"]))]
    row = (with_rows if len(with_rows) else own if len(own) else limits).sort_values(
        "run_id").iloc[-1]
    return dict(
        gpu=row["gpu"], date=str(row["started_at"])[:10], started_at=row["started_at"],
        torch=row["torch"], triton=row["triton"], cuda=row["cuda"], commit=row["git_commit"],
        run_id=row["run_id"], folder=str(Path(results).resolve().relative_to(ROOT))
        if Path(results).resolve().is_relative_to(ROOT) else str(results),
        is_reference=Path(results).resolve().is_relative_to(REFERENCE.parent.resolve()),
        runs=int(rows["run_id"].nunique()) if len(rows) else int(limits["run_id"].nunique()),
        first_date=str((rows if len(rows) else limits)["started_at"].min())[:10],
        gpus=gpus,
    )


def others_line(folders: list) -> str:
    """For the first page where a render compares several folders: each further folder's GPU,
    runs, commit and dates, and whether its Triton rows ran the same kernel source as the
    first folder's (empty for one folder)."""
    def kernels(folder):
        rows = family_rows(folder)
        return set(rows["kernel_hash"].dropna()) if "kernel_hash" in rows else set()

    first = kernels(folders[0]) if folders else set()
    parts = []
    for folder in folders[1:]:
        src = provenance(folder, load_limits(folder))
        own = kernels(folder)
        when = (f"on {src['date']}" if src["first_date"] == src["date"]
                else f"from {src['first_date']} to {src['date']}")
        parts.append(f"**{src['gpu']}** from `{src['folder']}` ({src['runs']} runs at commit "
                     f"`{str(src['commit'])[:12]}`, {when}; "
                     + ("the same Triton kernel source" if own and own == first else
                        "**another Triton kernel source**") + ")")
    if not parts:
        return ""
    return ("The synthesis chapter compares this GPU with " + "; ".join(parts) + ".")


# The CSV tables of a full `make bench` beside the sweep's Parquet files.
BENCH_CSVS = ("host_overhead.csv", "launch_cost.csv", "model_check.csv", "model_train.csv",
              "seed002_ieee.csv", "seed002_tf32.csv")
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


def bench_cost(rows: pd.DataFrame) -> pd.DataFrame:
    """Where a sweep's time goes: per family (the `data` column of `family_rows`), the minutes its
    rows took (each row's wall_s: checking, warm-up, trials, and for torch.compile and the
    libraries their compiles and autotuning; not the limits or process start-up), and the share
    of torch.compile's max-autotune rows, of the peer libraries' and of our fused kernels'
    (their per-shape tuning included). Rows without wall_s (runs before it was recorded) count
    nowhere; a last row sums the families."""
    cols = ["family", "rows", "minutes", "max-autotune %", "libraries %", "fused %"]
    if not len(rows) or "wall_s" not in rows or rows["wall_s"].isna().all():
        return pd.DataFrame(columns=cols)
    timed = rows.dropna(subset=["wall_s"])

    def line(name, g):
        total = g["wall_s"].sum()
        share = lambda sel: 100 * g.loc[sel, "wall_s"].sum() / total if total else float("nan")
        return {"family": name, "rows": len(g), "minutes": total / 60,
                "max-autotune %": share(g["impl"] == "torch_compile_max"),
                "libraries %": share(g["impl"].isin(PEERS)),
                "fused %": share(g["impl"] == "triton_fused")}

    out = [line(name, g) for name, g in timed.groupby("data")]
    out.append(line("all", timed))
    return pd.DataFrame(out, columns=cols)


# Issue 15's goal for a full `make bench` (the whole grid, three trials, max-autotune included).
BENCH_GOAL_MINUTES = 15


def bench_goal_line(rows: pd.DataFrame) -> str:
    """Whether a folder's rows fit the bench goal on one GPU: their minutes of sweep in all, a
    floor for one GPU (start-up, limits and the extras after the sweep come on top). Empty where
    no row recorded its wall time."""
    timed = rows.dropna(subset=["wall_s"]) if len(rows) and "wall_s" in rows else rows.iloc[:0]
    if not len(timed):
        return ""
    total = timed["wall_s"].sum() / 60
    verdict = ("meet it, before start-up, limits and the extras" if total <= BENCH_GOAL_MINUTES
               else "miss it on this folder's GPU")
    return (f"The goal for a full `make bench` is {BENCH_GOAL_MINUTES} minutes on one GPU: "
            f"{total:.0f} minutes of rows alone {verdict}.")


def mixture(results: Path) -> dict:
    """What a results folder mixes: its commits, whether any run came from a changed tree or
    from outside a git checkout, the families whose Triton rows ran more than one kernel source
    (a data file assembled from several runs), and `fallback`: the data files of a bench it lacks,
    which the chapters take from the committed reference (see `data_file`). `mixed` is true if
    any."""
    rows = family_rows(results)
    fallback = [] if Path(results).resolve() == REFERENCE.resolve() else sorted(
        path.name.removesuffix(".parquet") for path in REFERENCE.iterdir()
        if (path.suffix == ".parquet" and path.stem not in ("limits", "runs")
            or path.name in BENCH_CSVS) and not (Path(results) / path.name).exists())
    if not len(rows):
        return dict(mixed=bool(fallback), commits=[], unclean=[], families=[], runs=0,
                    fallback=fallback)
    commits = sorted(rows["git_commit"].dropna().astype(str).unique())
    unclean = [c for c in commits if c.endswith("-dirty") or c == "unknown"]
    families = []
    if "kernel_hash" in rows:
        triton = rows[rows["impl"].astype(str).str.startswith("triton")]
        for family, g in triton.groupby("family"):
            # Rows without a recorded hash (older data, seed 002's) are judged by their commit.
            hashes = g["kernel_hash"].dropna().unique()
            if len(hashes) > 1:
                families.append(family)
    return dict(mixed=len(commits) > 1 or bool(unclean) or bool(families) or bool(fallback),
                commits=commits, unclean=unclean, families=families,
                runs=int(rows["run_id"].nunique()), fallback=fallback)


def short_commit(commit: str) -> str:
    dirty = commit.endswith("-dirty")
    return commit.removesuffix("-dirty")[:12] + ("-dirty" if dirty else "")


def mixture_note(results: Path) -> "Markdown":
    """The first page's warning where a folder is not one clean run (empty otherwise)."""
    m = mixture(results)
    if not m["mixed"]:
        return Markdown("")
    parts = []
    if len(m["commits"]) > 1:
        parts.append(f"its rows come from {m['runs']} runs at {len(m['commits'])} commits "
                     f"({', '.join(short_commit(c) for c in m['commits'])})")
    elif m["commits"]:
        runs = "one run" if m["runs"] == 1 else f"{m['runs']} runs"
        parts.append(f"its rows come from {runs} at commit {short_commit(m['commits'][0])}")
    if m["unclean"]:
        parts.append(f"{len(m['unclean'])} of these commits marked as a tree with uncommitted "
                     "changes or as unknown")
    if m["families"]:
        parts.append("the Triton rows of " + ", ".join(m["families"]) + " ran more than one "
                     "version of their kernels")
    if m["fallback"]:
        parts.append("it lacks " + ", ".join(m["fallback"]) + ": those data come from the "
                     "committed reference, measured at other commits and times")
    text = "; ".join(parts)
    return Markdown("::: {.callout-warning}\n## This results folder is not one clean run\n"
                    + text[:1].upper() + text[1:] + ". Figures that compare rows of different "
                    "runs also compare different code; the methods chapter lists the runs.\n:::")


def stale_kernels(results: Path) -> dict:
    """The families whose Triton rows were measured with other kernel sources than this
    checkout's (`changed`: a recorded kernel hash differs from `machine.kernel_hash` now), and
    those whose rows record none (`unrecorded`: measured before the hash was recorded)."""
    from . import machine

    rows = family_rows(results)
    changed, unrecorded = [], []
    if len(rows) and "family" in rows:
        triton = rows[rows["impl"].astype(str).str.startswith("triton")]
        for family, g in triton.groupby("family"):
            if family not in machine.FAMILY_KERNELS:
                continue
            hashes = set(g["kernel_hash"].dropna()) if "kernel_hash" in g else set()
            if not hashes:
                unrecorded.append(family)
            elif hashes != {machine.kernel_hash(family)}:
                changed.append(family)
    return dict(changed=sorted(changed), unrecorded=sorted(unrecorded))


def stale_note(results: Path) -> "Markdown":
    """The first page's note where the data's Triton rows did not run this checkout's kernels
    (empty otherwise)."""
    s = stale_kernels(results)
    parts = []
    if s["changed"]:
        parts.append("the Triton rows of " + ", ".join(s["changed"]) + " were measured with "
                     "other kernel sources than this checkout's (their recorded kernel hashes "
                     "differ)")
    if s["unrecorded"]:
        parts.append("those of " + ", ".join(s["unrecorded"]) + " record no kernel hash "
                     "(measured before it was recorded)")
    if not parts:
        return Markdown("")
    text = "; ".join(parts)
    return Markdown("::: {.callout-warning}\n## These data predate this checkout's kernels\n"
                    + text[:1].upper() + text[1:] + ". Their figures describe the kernels that "
                    "ran then; `make bench` measures this checkout's.\n:::")


def cache_line(results: Path) -> "Markdown":
    """How warm the compile caches were when the folder's runs started (runs.parquet's
    inductor_cache_files and triton_cache_kernels), which sets how long max-autotune and the
    libraries' autotuning take: a sentence."""
    path = Path(results) / "runs.parquet"
    runs = pd.read_parquet(path) if path.exists() else pd.DataFrame()
    col = "inductor_cache_files_start"
    if col not in runs or runs[col].isna().all():
        return Markdown("Whether its runs started with warm compile caches (Inductor's, Triton's, "
                        "FlagGems' on disk) was not recorded.")
    runs = runs.dropna(subset=[col]).sort_values("started_at")
    # A bench's workers start together on one cache: one phrase per (start, end), in order.
    ends = runs["inductor_cache_files_end"]
    groups = Counter(zip(runs[col].astype(int), [None if pd.isna(e) else int(e) for e in ends]))

    def at_end(end):
        return "" if end is None else f" ({end} at the end)"
    what = "Inductor's cache (FX graphs and autotuning results; a cold cache holds none)"
    if len(runs) == 1:
        start, end = next(iter(groups))
        return Markdown(f"Its run started with {start} files in {what}{at_end(end)}.")
    return Markdown(f"Its {len(runs)} runs started with these numbers of files in {what}: "
                    + ", ".join(f"{n} {'run' if n == 1 else 'runs'} with {start}{at_end(end)}"
                                for (start, end), n in groups.items()) + ".")


def gpu_states(results: Path) -> pd.DataFrame:
    """One line per run in the folder's runs.parquet: the GPU's state at its start and end."""
    path = Path(results) / "runs.parquet"
    if not path.exists():
        return pd.DataFrame()
    runs = pd.read_parquet(path).sort_values("started_at")

    def pair(r, key, maxkey=None):
        def one(end):
            v = r[f"{key}_{end}"]
            if maxkey is not None:
                return f"{md(v, '.0f')}/{md(r[f'{maxkey}_{end}'], '.0f')}"
            return str(md(v, ".0f"))
        return f"{one('start')} → {one('end')}"
    return pd.DataFrame([{
        "run (UTC)": f"{str(r.started_at)[:10]} {str(r.started_at)[11:16]}", "status": r.status,
        "GPU": f"#{md(r.gpu_index, '.0f')}", "driver": r.driver or "—",
        "SM MHz": pair(r._asdict(), "sm_clock_mhz", "sm_clock_max_mhz"),
        "memory MHz": pair(r._asdict(), "mem_clock_mhz", "mem_clock_max_mhz"),
        "power limit W": r.power_limit_w_start, "°C": pair(r._asdict(), "temp_c"),
        "commit": short_commit(str(r.git_commit)) + ("" if r.git_clean else " (not clean)")}
        for r in runs.itertuples(index=False)])


# The limits' columns in the methods chapter: (metric, precision) -> label (bandwidths in GB/s,
# matmul peaks in TFLOP/s).
LIMIT_COLUMNS = {("copy_bw", "ieee"): "copy", ("stream_bw", "ieee"): "stream",
                 ("spec_bw", "ieee"): "datasheet", ("matmul_peak", "fp16"): "fp16",
                 ("matmul_peak", "bf16"): "bf16", ("matmul_peak", "tf32"): "TF32",
                 ("matmul_peak", "ieee"): "fp32"}


def limits_by_run(limits: pd.DataFrame) -> pd.DataFrame:
    """One line per run (and GPU of the run), one column per limit (LIMIT_COLUMNS order); a
    limit the run did not measure is NaN."""
    if not len(limits):
        return pd.DataFrame()
    df = limits.copy()
    df["gpu_index"] = df["gpu_index"].fillna(0) if "gpu_index" in df else 0
    df["column"] = [LIMIT_COLUMNS.get((m, p), f"{m} {p}")
                    for m, p in zip(df["metric"], df["precision"])]
    wide = df.pivot_table(index=["started_at", "run_id", "gpu_index"], columns="column",
                          values="value", aggfunc="first").reset_index().sort_values("started_at")
    cols = [c for c in LIMIT_COLUMNS.values() if c in wide] + sorted(
        c for c in wide.columns if c not in LIMIT_COLUMNS.values()
        and c not in ("started_at", "run_id", "gpu_index"))
    wide.insert(0, "run (UTC)", wide["started_at"].astype(str).str.slice(0, 16)
                .str.replace("T", " "))
    wide.insert(1, "GPU", [f"#{int(g)}" for g in wide["gpu_index"]])
    return wide[["run (UTC)", "GPU", *cols]].reset_index(drop=True)


def span(table: pd.DataFrame, column: str) -> tuple[float, float]:
    """(lowest, highest) of a column; NaNs where the table has no such column or no value."""
    if column not in table or table[column].isna().all():
        return float("nan"), float("nan")
    return float(table[column].min()), float(table[column].max())


def range_text(lo: float, hi: float, fmt: str) -> str:
    """"lo to hi" in fmt, or the one value where both read the same (a range of one run, of
    equal values, never "7.5 to 7.5")."""
    a, b = format(lo, fmt), format(hi, fmt)
    return a if a == b else f"{a} to {b}"


def limit_methods(limits: pd.DataFrame) -> pd.DataFrame:
    """How each limit was measured: its label and the detail recorded by the latest run."""
    if not len(limits):
        return pd.DataFrame()
    latest = limits.sort_values("started_at").groupby(["metric", "precision"]).tail(1)
    out = [dict(limit=LIMIT_COLUMNS.get((r.metric, r.precision), f"{r.metric} {r.precision}"),
                how=r.detail) for r in latest.itertuples(index=False)]
    order = list(LIMIT_COLUMNS.values())
    return pd.DataFrame(sorted(out, key=lambda d: (order.index(d["limit"])
                                                   if d["limit"] in order else len(order))))


def trial_spread(df: pd.DataFrame, split_ms: float = 0.05) -> dict:
    """Run-to-run spread of timed rows measured in several trials: highest over lowest trial
    median, median and 95th percentile, for rows above and below `split_ms`; `n` counts rows."""
    out = {}
    if not len(df) or "n_trials" not in df:
        return dict(long=dict(n=0, median=float("nan"), p95=float("nan")),
                    short=dict(n=0, median=float("nan"), p95=float("nan")), trials=0)
    ok = df[(df["status"] == "ok") & (df["n_trials"] >= 2)
            & ~df["gpu"].astype(str).str.startswith("cpu")]  # the interpreter's clock: no time
    for name, part in (("long", ok[ok["ms_median"] >= split_ms]),
                       ("short", ok[ok["ms_median"] < split_ms])):
        ratio = part["ms_trial_max"] / part["ms_trial_min"]
        out[name] = dict(n=len(part), median=ratio.median() if len(part) else float("nan"),
                         p95=ratio.quantile(0.95) if len(part) else float("nan"))
    # The op whose long rows spread the most (95th percentile), and the rest without it.
    long = ok[ok["ms_median"] >= split_ms]
    long = long.assign(ratio=long["ms_trial_max"] / long["ms_trial_min"])
    by_op = long.groupby("op")["ratio"].quantile(0.95) if len(long) else pd.Series(dtype=float)
    if len(by_op) > 1:
        worst = by_op.idxmax()
        out["widest"] = dict(op=worst, p95=by_op[worst],
                             rest_p95=long[long["op"] != worst]["ratio"].quantile(0.95))
    out["trials"] = int(ok["n_trials"].max()) if len(ok) else 0
    return out


def main_rows(df: pd.DataFrame) -> pd.DataFrame:
    """A reduction family's rows at its largest row count, where the width sweeps run (4096 in
    the grid); the few-row shapes (e.g. 8 x 50257) are other problems, shown apart. Frames
    without a `rows` column pass through."""
    if "rows" not in df or not len(df):
        return df
    return df[df["rows"] == df["rows"].max()]


def ok_rows(df: pd.DataFrame, sweep: str = "size") -> pd.DataFrame:
    return df[(df["status"] == "ok") & (df["sweep"] == sweep)]


def pivot(df: pd.DataFrame, index, value: str = "ms_median") -> pd.DataFrame:
    """Implementations as columns, in the report's order."""
    keys = [index] if isinstance(index, str) else list(index)
    if df.duplicated(keys + ["impl"]).any():
        raise AmbiguousRows(f"pivot on {keys}: several rows per implementation; add the shape "
                            "column that tells them apart")
    p = df.pivot_table(index=index, columns="impl", values=value, aggfunc="first")
    return p[[c for c in IMPL_ORDER if c in p.columns] + [c for c in p.columns if c not in IMPL_ORDER]]


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
        # longest entry (up to a cap, past which text wraps) and at least its heading's longest
        # word (headings wrap at spaces), plus the cell's padding.
        longest = max((len(r[i]) for r in body), default=3)
        return 3 + max(3, len(max(str(name).split() or [""], key=len)), min(18, longest))
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
    """A value the data does not hold: NaN, None or `MISSING`."""
    if value is None or value is MISSING:
        return True
    try:
        return math.isnan(value)
    except TypeError:
        return False


class _Missing:
    """What a chapter's findings hold where the data lacks what they need (a smoke run, a failed
    configuration): every lookup, operation and format gives it back, shown as "—", so a chapter
    renders what there is instead of crashing."""

    def _same(self, *args, **kwargs):
        return self

    __getitem__ = __getattr__ = __call__ = _same
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _same
    __truediv__ = __rtruediv__ = __neg__ = __pow__ = _same

    def __format__(self, spec):
        return "—"

    def __str__(self):
        return "—"

    __repr__ = __str__

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __bool__(self):
        return False

    def __float__(self):
        return math.nan

    def __lt__(self, other):
        return False

    __le__ = __gt__ = __ge__ = __lt__


MISSING = _Missing()


class Values(dict):
    """A dict of findings whose absent keys read as MISSING."""

    def __missing__(self, key):
        return MISSING


def _tolerant(value):
    if isinstance(value, dict) and not isinstance(value, Values):
        return Values({k: _tolerant(v) for k, v in value.items()})
    return value


class AmbiguousRows(Exception):
    """A selection meant to pick one configuration matched several: a report bug (e.g. a width
    measured at two row counts), never read as "not measured". Deliberately not a ValueError,
    which `findings_or_missing` takes for missing data."""


def findings_or_missing(findings, *args, **kwargs):
    """`findings(*args)` with every dict in it reading absent keys as MISSING, or MISSING where
    the data lacks a configuration it reads (KeyError, IndexError: a smoke run's sizes, a family
    whose headline rows failed)."""
    try:
        return _tolerant(findings(*args, **kwargs))
    except (KeyError, IndexError, ValueError, ZeroDivisionError):
        return MISSING


class Markdown(str):
    """A string that Jupyter displays as markdown: inline `{python}` values render without quotes,
    and a cell ending in one shows a table. (IPython's own Markdown would need IPython, which the
    GPU machine that runs the tests may lack.)"""

    def _repr_markdown_(self):
        return str(self)


_NAN = re.compile(r"(?<![\w.])-?(nan|inf)(?![\w])", re.I)


def md(value, fmt: str | None = None) -> Markdown:
    """Format a value for inline use in prose: `{python} md(x, '.2f')`. A value the data lacks
    (NaN, inf, MISSING), also inside an already formatted string, shows as "—"."""
    if missing(value) or (isinstance(value, str) and not value.strip()):
        return Markdown("—")
    text = format(value, fmt) if fmt else str(value)
    return Markdown(_NAN.sub("—", text))


def value_at(df: pd.DataFrame, impl: str, column: str = "ms_median", **where) -> float:
    """The one value of `column` for `impl` in the rows matching `where` (NaN if none ran)."""
    sel = df[df["impl"] == impl]
    for k, v in where.items():
        sel = sel[sel[k] == v]
    sel = sel[sel["status"] == "ok"]
    if len(sel) > 1:  # two shapes (or runs) match: name the one meant rather than take either
        raise AmbiguousRows(f"value_at({impl!r}, {column!r}, {where}): {len(sel)} rows match")
    return float(sel[column].iloc[0]) if len(sel) else float("nan")


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


def lacking(what: str) -> str:
    """The sentence a chapter prints where its data lack what a finding needs."""
    return f"These data hold no {what}, so this finding is not available here."


def times(rows: pd.DataFrame) -> dict:
    """impl -> t_ms over `timed` rows of one configuration (the fastest row of an impl)."""
    return rows.groupby("impl")["t_ms"].min().to_dict() if len(rows) else {}
