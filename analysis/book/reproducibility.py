"""Appendix "Reproducibility": which GPU, versions, commits and runs measured the data, the
GPU's state and limits in each run, what the sweep cost, how far repeated measurements agree, and
warnings where a folder mixes commits or kernel sources. The book's one place for run ids and
commits; every value is read from the results folders the render shows."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..families import FAMILIES, OP_LABEL
from ..sources import kernel_hash
from . import data as D

# Per-call medians below this are the host's launch path as much as the GPU's work.
SHORT_MS = 0.05

# The Triton libraries measured beside PyTorch where they have the op.
PEERS = ("liger", "flag_gems")
# The limits' short names: (metric, precision) -> label (bandwidths in GB/s, peaks in TFLOP/s).
LIMIT_COLUMNS = {("copy_bw", "ieee"): "copy", ("stream_bw", "ieee"): "stream",
                 ("spec_bw", "ieee"): "datasheet", ("matmul_peak", "fp16"): "fp16",
                 ("matmul_peak", "bf16"): "bf16", ("matmul_peak", "tf32"): "TF32",
                 ("matmul_peak", "ieee"): "fp32"}


def limits_by_run(limits: pd.DataFrame) -> pd.DataFrame:
    """One line per run, one column per limit (LIMIT_COLUMNS' labels); NaN where not measured."""
    if not len(limits):
        return pd.DataFrame()
    df = limits.assign(column=[LIMIT_COLUMNS.get((m, p), f"{m} {p}")
                               for m, p in zip(limits["metric"], limits["precision"])])
    wide = df.pivot_table(index="run_id", columns="column", values="value", aggfunc="first")
    return wide.reset_index()


def span(table: pd.DataFrame, column: str) -> tuple[float, float]:
    """(lowest, highest) of a column; NaNs where the table has no such column or no value."""
    if column not in table or table[column].isna().all():
        return float("nan"), float("nan")
    return float(table[column].min()), float(table[column].max())


def bench_cost(rows: pd.DataFrame) -> pd.DataFrame:
    """Where a sweep's time goes, per data file: the minutes its rows took (each row's wall_s:
    checking, warm-up, trials, compiles and autotuning), and the shares of torch.compile's
    max-autotune rows, the peer libraries' and the fused kernels'; a last line sums them."""
    cols = ["family", "rows", "minutes", "max-autotune %", "libraries %", "fused %"]
    if not len(rows) or "wall_s" not in rows or rows["wall_s"].isna().all():
        return pd.DataFrame(columns=cols)
    timed = rows.dropna(subset=["wall_s"])

    def line(name, g):
        total = g["wall_s"].sum()

        def share(sel):
            return 100 * g.loc[sel, "wall_s"].sum() / total if total else float("nan")
        return {"family": name, "rows": len(g), "minutes": total / 60,
                "max-autotune %": share(g["impl"] == "torch_compile_max"),
                "libraries %": share(g["impl"].isin(PEERS)),
                "fused %": share(g["impl"] == "triton_fused")}

    out = [line(name, g) for name, g in timed.groupby("data")] + [line("all", timed)]
    return pd.DataFrame(out, columns=cols)


@dataclass
class Folder:
    """One results folder: its rows (every family file), its own limits and runs."""
    path: Path
    rows: pd.DataFrame
    limits: pd.DataFrame
    runs: pd.DataFrame
    label: str

    @property
    def on_cpu(self) -> bool:
        return D.on_cpu(self.rows) or str(D.gpu_of(self.path)).startswith("cpu")


def _read(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


def folders_of(paths: list) -> list[Folder]:
    """The folders, each labelled by its GPU (and its directory where two share a GPU)."""
    gpus = [D.gpu_label(D.gpu_of(p)).replace("cpu", "CPU") for p in paths]
    twice = {g for g, n in Counter(gpus).items() if n > 1}
    return [Folder(Path(p), D.family_rows(p), _read(Path(p) / "limits.parquet"),
                   _read(Path(p) / "runs.parquet"), f"{g} ({Path(p).name})" if g in twice else g)
            for p, g in zip(paths, gpus)]


def _values(df: pd.DataFrame, column: str) -> list[str]:
    return sorted(df[column].dropna().astype(str).unique()) if column in df and len(df) else []


def short_commit(commit: str) -> str:
    dirty = commit.endswith("-dirty")
    return commit.removesuffix("-dirty")[:12] + (" (changed tree)" if dirty else "")


def _where(path: Path) -> str:
    p = path.resolve()
    return str(p.relative_to(D.ROOT)) if p.is_relative_to(D.ROOT) else str(path)


def environment(folders: list[Folder]) -> pd.DataFrame:
    """One line per item (GPU, versions, commit, ...), one column per folder."""
    def column(f: Folder) -> list[str]:
        src = f.rows if len(f.rows) else f.limits
        peers = (f.rows[f.rows["impl"].isin(PEERS) & (f.rows["status"] == "ok")]
                 if len(f.rows) else f.rows)
        dates = sorted(str(s)[:10] for s in _values(src, "started_at"))
        failed = (f.rows[f.rows["status"] != "ok"]["status"].value_counts()
                  if len(f.rows) else pd.Series(dtype=int))
        sms = _values(src, "sm_count")
        return [
            D.gpu_of(f.path),
            ", ".join(s.removesuffix(".0") for s in sms) or "—",
            ", ".join(_values(f.runs, "driver")) or "—",
            ", ".join(_values(src, "torch")) or "—",
            ", ".join(_values(src, "triton")) or "—",
            ", ".join(_values(src, "cuda")) or "—",
            ", ".join(_values(peers, "variant")) or "none measured",
            ", ".join(short_commit(c) for c in _values(src, "git_commit")) or "—",
            ", ".join(_values(f.rows, "kernel_hash")) or "not recorded",
            D.range_text(dates[0], dates[-1], "s").replace(" to ", " – ") if dates else "—",
            str(len(run_list(f))),
            f"{len(f.rows)}" + (" (" + ", ".join(f"{n} {status}" for status, n in failed.items())
                                + ")" if len(failed) else ""),
            _where(f.path),
        ]
    items = ["GPU", "SMs", "driver", "PyTorch", "Triton", "CUDA", "libraries", "commit",
             "kernel sources", "measured (UTC)", "runs", "rows", "folder"]
    table = pd.DataFrame({"": items})
    for f in folders:
        table[f.label] = column(f)
    return table


def run_list(f: Folder) -> pd.DataFrame:
    """Every run the folder knows of (its runs file, its limits, its rows): id, start, GPU index."""
    parts = [df[["run_id", "started_at"] + (["gpu_index"] if "gpu_index" in df else [])]
             for df in (f.runs, f.limits, f.rows) if len(df) and "run_id" in df]
    if not parts:
        return pd.DataFrame(columns=["run_id", "started_at", "gpu_index"])
    runs = pd.concat(parts).drop_duplicates("run_id").sort_values(["started_at", "run_id"])
    return runs.reset_index(drop=True)


def runs_table(folders: list[Folder]) -> pd.DataFrame:
    """One line per run (its id starts with its start time): its GPU, status, rows, temperature
    from start to end, and the copy bandwidth and fp16 matmul peak it measured at its start."""
    lines = []
    for f in folders:
        counts = f.rows["run_id"].value_counts() if len(f.rows) else pd.Series(dtype=int)
        state = f.runs.set_index("run_id") if len(f.runs) else pd.DataFrame()
        for r in run_list(f).itertuples(index=False):
            s = state.loc[r.run_id] if r.run_id in state.index else None
            index = getattr(r, "gpu_index", None)
            temp = ("—" if s is None
                    else f"{D.md(s['temp_c_start'], '.0f')} → {D.md(s['temp_c_end'], '.0f')}")
            lines.append({"run": r.run_id,
                          "GPU": f.label + ("" if pd.isna(index) else f" #{int(index)}"),
                          "status": "—" if s is None else s["status"],
                          "rows": int(counts.get(r.run_id, 0)), "°C": temp,
                          "copy GB/s": _limit(f, "copy_bw", "ieee", r.run_id),
                          "fp16 TFLOP/s": _limit(f, "matmul_peak", "fp16", r.run_id)})
    return pd.DataFrame(lines)


def _limit(f: Folder, metric: str, precision: str, run: str) -> float:
    return D.limit(f.limits, metric, precision, run_id=run) if len(f.limits) else float("nan")


def families_table(folders: list[Folder]) -> pd.DataFrame:
    """Per folder and data file: its ops, rows, failed rows, runs and Triton kernel sources."""
    lines = []
    for f in folders:
        for name, g in (f.rows.groupby("data") if len(f.rows) else []):
            triton = g[g["impl"].astype(str).str.startswith("triton")]
            lines.append({"GPU": f.label, "file": name,
                          "ops": ", ".join(sorted({OP_LABEL.get(o, o.replace("_", " "))
                                                   for o in g["op"].unique()},
                                                  key=lambda o: list(OP_LABEL.values()).index(o)
                                                  if o in OP_LABEL.values() else 99)),
                          "rows": len(g), "not ok": int((g["status"] != "ok").sum()),
                          "runs": g["run_id"].nunique(),
                          "kernels": ", ".join(_values(triton, "kernel_hash")) or "—"})
    table = pd.DataFrame(lines)
    return table.drop(columns="GPU") if len(folders) == 1 and len(table) else table


def mixture(f: Folder) -> dict:
    """What a folder mixes: commits, runs from a changed tree (or outside git), and families
    whose Triton rows ran more than one kernel source."""
    commits = _values(f.rows, "git_commit")
    families = []
    if len(f.rows) and "kernel_hash" in f.rows:
        triton = f.rows[f.rows["impl"].astype(str).str.startswith("triton")]
        families = [fam for fam, g in triton.groupby("family")
                    if g["kernel_hash"].dropna().nunique() > 1]
    unclean = [c for c in commits if c.endswith("-dirty") or c == "unknown"]
    return dict(commits=commits, unclean=unclean, families=families,
                mixed=len(commits) > 1 or bool(unclean) or bool(families))


def mixture_note(f: Folder) -> str:
    """A warning where a folder is not one clean commit (empty otherwise)."""
    m = mixture(f)
    if not m["mixed"]:
        return ""
    parts = []
    if len(m["commits"]) > 1:
        parts.append(f"its rows come from {len(m['commits'])} commits "
                     f"({', '.join(short_commit(c) for c in m['commits'])})")
    if m["unclean"]:
        parts.append(("one" if len(m["unclean"]) == 1 else str(len(m["unclean"])))
                     + f" of its {len(m['commits'])} commits "
                     + ("is" if len(m["unclean"]) == 1 else "are")
                     + " marked as a tree with uncommitted changes or as unknown")
    if m["families"]:
        parts.append("the Triton rows of " + ", ".join(m["families"]) + " ran more than one "
                     "version of their kernels")
    text = "; ".join(parts)
    return (f"::: {{.callout-warning}}\n## The {f.label} data are not one clean commit\n"
            + text[:1].upper() + text[1:] + ". Figures that compare rows of different runs also "
            "compare different code.\n:::")


def stale_note(f: Folder) -> str:
    """A note where the Triton rows did not run this checkout's kernel sources (empty otherwise)."""
    changed, unrecorded = [], []
    triton = f.rows[f.rows["impl"].astype(str).str.startswith("triton")] if len(f.rows) else f.rows
    for family, g in (triton.groupby("family") if len(triton) else []):
        if family not in FAMILIES:
            continue
        hashes = set(g["kernel_hash"].dropna()) if "kernel_hash" in g else set()
        if not hashes:
            unrecorded.append(family)
        elif hashes != {kernel_hash(family)}:
            changed.append(family)
    parts = []
    if changed:
        parts.append("the Triton rows of " + ", ".join(changed) + " ran other kernel sources "
                     "than this checkout's (their recorded kernel hashes differ)")
    if unrecorded:
        parts.append("those of " + ", ".join(unrecorded) + " record no kernel hash")
    if not parts:
        return ""
    text = "; ".join(parts)
    return (f"::: {{.callout-note}}\n## The {f.label} data predate this checkout's kernels\n"
            + text[:1].upper() + text[1:] + ". Their figures describe the kernels that ran then; "
            "`make bench` measures this checkout's.\n:::")


def peers_note(f: Folder) -> str:
    """A note where a peer library's rows say `unsupported` because it was not installed on the
    machine that measured them (empty otherwise): the comparisons with it are missing."""
    if not len(f.rows) or "error" not in f.rows:
        return ""
    absent = f.rows[f.rows["impl"].isin(PEERS) & (f.rows["status"] == "unsupported")
                    & f.rows["error"].astype(str).str.contains("is not installed", regex=False)]
    if not len(absent):
        return ""
    counts = absent["impl"].value_counts()
    names = [f"{D.IMPL_LABEL.get(i, i)} ({n} configurations)" for i, n in counts.items()]
    return (f"::: {{.callout-note}}\n## The {f.label} data lack a peer library\n"
            + " and ".join(names) + (" was" if len(names) == 1 else " were")
            + " not installed where these data were measured: those rows say `unsupported`, and "
            "the chapters compare ours without " + ("it" if len(names) == 1 else "them")
            + ". On a GPU machine `make setup` installs the pinned versions (pyproject.toml's "
            "`peers` extra).\n:::")


def _span_text(values: pd.Series, fmt: str = ".0f") -> str:
    return D.range_text(values.min(), values.max(), fmt)


def _clock_ratio(r: pd.DataFrame) -> pd.Series:
    """SM clock over its maximum, at the start and the end of each run."""
    return pd.concat([r["sm_clock_mhz_start"] / r["sm_clock_max_mhz_start"],
                      r["sm_clock_mhz_end"] / r["sm_clock_max_mhz_end"]]).dropna()


def state_line(folders: list[Folder]) -> str:
    """The GPU's clocks, power limit and temperature over each folder's runs (NVML)."""
    parts, steady = [], True
    for f in folders:
        r = f.runs
        if not len(r) or "sm_clock_mhz_start" not in r or r["sm_clock_mhz_start"].isna().all():
            parts.append(f"the {f.label} runs recorded no GPU state")
            steady = False
            continue
        ratio = _clock_ratio(r)
        temps = pd.concat([r["temp_c_start"], r["temp_c_end"]]).dropna()
        ended = int(r["sm_clock_mhz_end"].notna().sum())
        parts.append(f"on the {f.label} (driver {', '.join(_values(r, 'driver'))}, power limit "
                     f"{_span_text(r['power_limit_w_start'])} W) the SM clock stood at "
                     f"{_span_text(100 * ratio)}% of its "
                     f"{_span_text(r['sm_clock_max_mhz_start'])} MHz maximum when each run started"
                     + (f" and when each of the {ended} finished runs ended" if ended else "")
                     + f", at {_span_text(temps)} °C")
        steady = steady and ratio.min() >= 0.95 and temps.max() < 80
    text = "; ".join(parts)
    return (text[:1].upper() + text[1:] + "."
            + (" No run shows a throttled clock or a hot GPU." if steady else ""))


def resume_line(folders: list[Folder]) -> str:
    """Why a folder holds several runs: a bench's workers (one run per GPU), its resumes, and
    runs outside the sweep (no line in runs.parquet)."""
    parts = []
    for f in folders:
        if not len(f.runs) or "argv" not in f.runs:
            continue
        starts = f.runs["started_at"].astype(str).str.slice(0, 16).nunique()
        resumed = int(f.runs["argv"].astype(str).str.contains("--resume").sum())
        gpus = f.runs["gpu_index"].nunique() if "gpu_index" in f.runs else 1
        if len(f.runs) == 1:
            text = f"the {f.label} folder holds one sweep run"
        else:
            text = (f"the {f.label} folder's {len(f.runs)} sweep runs are "
                    + (f"{gpus} workers (one per GPU) started {starts} times" if gpus > 1
                       else f"{starts} starts of the sweep")
                    + (f", {resumed} of the runs resuming where the previous stopped"
                       if resumed else ""))
        others = f.rows[~f.rows["run_id"].isin(set(f.runs["run_id"]))] if len(f.rows) else f.rows
        if len(others):
            n = others["run_id"].nunique()
            files = sorted(others["data"].unique())
            text += (f", and {'one run' if n == 1 else f'{n} runs'} outside the sweep wrote the "
                     + ", ".join(files) + (" file" if len(files) == 1 else " files"))
        parts.append(text)
    if not parts:
        return ""
    text = "; ".join(parts)
    return (text[:1].upper() + text[1:] + " (a run that stops loses nothing: rows are written "
            "as they are measured).")


def limits_line(folders: list[Folder]) -> str:
    parts = []
    for f in folders:
        by = limits_by_run(f.limits)
        copy, fp16 = span(by, "copy"), span(by, "fp16")
        if copy[0] != copy[0] and fp16[0] != fp16[0]:
            parts.append(f"the {f.label} runs measured no limits")
            continue
        sheet = span(by, "datasheet")
        measured = []
        if copy[0] == copy[0]:
            measured.append(f"a copy bandwidth of {D.range_text(*copy, ',.0f')} GB/s"
                            + (f" (datasheet: {sheet[1]:,.0f})" if sheet[1] == sheet[1] else ""))
        if fp16[0] == fp16[0]:
            measured.append(f"an fp16 matmul peak of {D.range_text(*fp16, '.0f')} TFLOP/s")
        ratio = (f", highest over lowest {copy[1] / copy[0]:.3f}× against "
                 f"{fp16[1] / fp16[0]:.2f}×"
                 if len(by) > 1 and len(measured) == 2 else "")
        parts.append((f"the {len(by)} {f.label} runs" if len(by) > 1 else f"the one {f.label} run")
                     + " measured " + " and ".join(measured) + ratio)
    text = "; ".join(parts)
    return text[:1].upper() + text[1:] + "."


def cost_line(f: Folder, cost: pd.DataFrame) -> str:
    if not len(cost):
        return ("This folder's rows do not record their wall time, so it cannot say what the "
                "sweep cost.")
    whole = cost.iloc[-1]
    timed = f.rows.dropna(subset=["wall_s"])
    per_gpu = (timed.groupby("gpu_index")["wall_s"].sum() / 60 if "gpu_index" in timed
               else pd.Series(dtype=float))
    spread = (f" Spread over {len(per_gpu)} GPUs, the busiest one's rows took {per_gpu.max():.0f} "
              f"minutes and the idlest one's {per_gpu.min():.0f}." if len(per_gpu) > 1 else "")
    minutes = (f"{whole['minutes']:.0f} minutes" if whole["minutes"] >= 1 else "less than a minute")
    return (f"The {int(whole['rows'])} {f.label} rows that record it took {minutes} "
            + ("(the interpreter's wall time) " if f.on_cpu else "")
            + f"of sweep in all: {whole['max-autotune %']:.0f}% in torch.compile's max-autotune "
            f"rows "
            f"and {whole['libraries %']:.0f}% in the peer libraries' (both compile and autotune "
            f"on a first call, so their share falls on a second run with warm caches), "
            f"{whole['fused %']:.0f}% in the fused Triton kernels' (their per-shape tuning "
            f"included).{spread} Start-up, the limits and the extra measurements after the "
            "sweep come on top.")


def cache_line(f: Folder) -> str:
    """How warm the compile caches were when the runs started (they set how long max-autotune
    and the libraries' autotuning take)."""
    col = "inductor_cache_files_start"
    if col not in f.runs or f.runs[col].isna().all():
        return f"Whether the {f.label} runs started with warm compile caches was not recorded."
    runs = f.runs.dropna(subset=[col]).sort_values("started_at")
    starts = Counter(runs[col].astype(int))
    return (f"The {f.label} runs started with these numbers of files in Inductor's cache (compiled "
            "graphs and autotuning results; a cold cache holds none): "
            + ", ".join(f"{n} {'run' if n == 1 else 'runs'} with {k:,}"
                        for k, n in starts.items()) + ".")


def spread_line(f: Folder) -> str:
    """How far the trials of one configuration agree: highest over lowest trial median."""
    rows = f.rows
    if f.on_cpu or not len(rows) or "n_trials" not in rows:
        return f"The {f.label} rows hold no repeated timings (a CPU run times nothing)."
    ok = rows[(rows["status"] == "ok") & (rows["n_trials"] >= 2)]
    ok = ok.assign(ratio=ok["ms_trial_max"] / ok["ms_trial_min"]).dropna(subset=["ratio"])
    if not len(ok):
        return (f"The {f.label} rows were each timed in one trial, so they hold no run-to-run "
                "spread.")
    long, short = ok[ok["ms_median"] >= SHORT_MS], ok[ok["ms_median"] < SHORT_MS]

    def pct(s, q):
        return f"{s.quantile(q):.3g}×"

    text = (f"Of the {len(rows)} {f.label} rows, {len(ok)} were timed in "
            f"{int(ok['n_trials'].max())} trials, each on fresh inputs with its own warm-up")
    if len(long):
        text += (f". Over the {len(long)} of at least {1000 * SHORT_MS:.0f} µs the highest trial "
                 f"median is {pct(long['ratio'], 0.5)} the lowest at the median row and "
                 f"{pct(long['ratio'], 0.95)} at the 95th percentile")
        by_op = long.groupby("op")["ratio"].quantile(0.95)
        if len(by_op) > 1:
            worst = by_op.idxmax()
            text += (f" (widest: {OP_LABEL.get(worst, worst)}, "
                     f"{pct(long[long['op'] == worst]['ratio'], 0.95)}; "
                     f"without it {pct(long[long['op'] != worst]['ratio'], 0.95)})")
    if len(short):
        text += (f"; over the {len(short)} under {1000 * SHORT_MS:.0f} µs, where the launch "
                 "path and the clock's "
                 f"ramp weigh more, {pct(short['ratio'], 0.5)} and {pct(short['ratio'], 0.95)}, "
                 "which is why the book plots short kernels' device time")
    return text + "."


def regenerate(folders: list[Folder]) -> str:
    where = " ".join(_where(f.path) for f in folders)
    return f'`make render RESULTS="{where}"`'


def compute(folders: list) -> dict:
    fs = folders_of(folders)
    first = fs[0]
    cost = bench_cost(first.rows)
    notes = [n for f in fs for n in (mixture_note(f), stale_note(f), peers_note(f)) if n]
    sources = "; ".join(f"the {f.label} data from `{_where(f.path)}`" for f in fs)
    kernels = [set(_values(f.rows, "kernel_hash")) for f in fs]
    same = ("" if len(fs) < 2 else " Every folder's Triton rows ran the same kernel sources."
            if all(k and k == kernels[0] for k in kernels) else
            " The folders' Triton rows ran different kernel sources (@tbl-repro-env).")
    reference = all(f.path.resolve().is_relative_to(D.REFERENCE.parent.resolve()) for f in fs)
    say = {
        "origin": (f"This render shows {sources}: "
                   + ("the reference results committed in the repository (`make report` on a GPU "
                      "machine measures its own and shows those)." if reference
                      else "results measured with `make bench`.") + same),
        "runs": resume_line(fs) or "The folders hold no record of their runs (runs.parquet): "
                                   "the runs are known from their rows and limits only.",
        "limits": limits_line(fs),
        "state": state_line(fs),
        "caches": " ".join(cache_line(f) for f in fs),
        "cost": cost_line(first, cost),
        "spread": " ".join(spread_line(f) for f in fs),
        "render": regenerate(fs),
    }
    return dict(environment=environment(fs), runs=runs_table(fs), families=families_table(fs),
                cost=cost, notes="\n\n".join(notes), say=say)
