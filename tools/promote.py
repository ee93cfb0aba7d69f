"""Make one finished, clean run a reference results folder.

    python tools/promote.py RUN INTO [--dry-run]

INTO (e.g. `results/reference/h100`) then holds RUN's results alone: RUN's data files (Parquet
and CSV) are copied in, and INTO's data files that RUN lacks are removed, whatever they are (a
patchwork is replaced, not kept beside: issue 15; a document of another commit too: issue 59).
Refused, with every reason, unless RUN is one clean bench of a reference grid (`make reference`,
or `make bench GRID=full`; one run, or the per-GPU runs of one `--workers` bench and its resumes,
see `bench_problems`): finished, at one clean commit, the sweep's rows of its run ids, every
family of the grid present, every row and every file that records a commit at that commit (the
later steps too: seed 002, the launch costs, the GPT-2 check, the LM head's front, the profile),
and every family's Triton rows of this checkout's kernels (their kernel hash,
analysis/sources.py). What a reference lacks (the profile, a tail step's file) is said, not
refused. `--dry-run` prints what would change.
"""
from __future__ import annotations

import argparse
import functools
import re
import shutil
import sys
from pathlib import Path

import pandas as pd

try:
    import triton_fusion_report  # noqa: F401 - PYTHONPATH=. (as the Makefile sets) or installed
except ImportError:  # run from a checkout without PYTHONPATH: the checkout's package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from triton_fusion_report.analysis.families import FAMILIES  # noqa: E402
from triton_fusion_report.analysis.sources import kernel_hash as _kernel_hash  # noqa: E402

kernel_hash = functools.cache(_kernel_hash)  # the checkout's, read once per family

DATA_SUFFIXES = (".parquet", ".csv")
# The grids a reference is measured on (the grid is in every run's command line since the default
# became the book's subset; before, a run without one was of the full grid).
REFERENCE_GRIDS = ("reference", "full")
# What a complete reference holds besides the sweep's files: the tail steps' and the profile's.
EXPECTED = ("seed002.parquet", "launch_cost.csv", "model_check.csv", "lm_head_front.csv",
            "profile.parquet", "profile_details.parquet")


def bench_problems(rec: pd.DataFrame) -> list[str]:
    """Why the run records of a folder are not one clean bench (empty: they are). One bench is
    one run, or the runs of one multi-GPU bench (`--workers N`: a run per worker, and a run per
    worker for each `--resume` of it), all at one clean commit and kernel source, on one GPU
    model, over the same families, each GPU's last run finished."""
    if not len(rec):
        return ["no run records"]
    out = []
    for column in ("git_commit", "source_hash", "gpu", "families"):
        if column in rec and rec[column].astype(str).nunique() > 1:
            out.append(f"{len(rec)} run records of different {column}: "
                       f"{sorted(set(rec[column].astype(str)))}")
    for _, r in rec.iterrows():
        grid = re.search(r"--grid (\S+)", str(r.get("argv", "")))
        if grid and grid.group(1) not in REFERENCE_GRIDS:
            out.append(f"run {r['run_id']}: the {grid.group(1)} grid, not a reference grid "
                       "(make reference, or make bench GRID=full)")
        if not bool(r.get("git_clean", False)):
            out.append(f"run {r['run_id']}: the tree was not clean ({r['git_commit']})")
    if len(rec) > 1:
        workers = {m.group(1) if m else None
                   for m in (re.search(r"--workers (\d+)", str(a)) for a in rec["argv"])}
        if len(workers) != 1 or None in workers or workers == {"1"}:
            out.append(f"{len(rec)} run records, not the runs of one multi-GPU bench (a reference "
                       "is one run, or one `--workers` bench and its resumes)")
            return out
        later = rec.sort_values("started_at")
        for gpu, runs in later.groupby("gpu_index"):
            for _, r in runs.iloc[:-1].iterrows():
                if r["status"] != "stopped":
                    out.append(f"run {r['run_id']} (GPU {gpu}) is {r['status']}, not stopped and "
                               "resumed")
            for _, r in runs.iloc[1:].iterrows():
                if "--resume" not in str(r["argv"]):
                    out.append(f"run {r['run_id']} (GPU {gpu}) started afresh, not a --resume")
        last = later.groupby("gpu_index").tail(1)
    else:
        last = rec
    for _, r in last.iterrows():
        if r["status"] != "finished":
            out.append(f"run {r['run_id']} is {r['status']}, not finished")
    return out


def problems(run: Path) -> list[str]:
    """Why RUN cannot be a reference (empty: it can)."""
    records = run / "runs.parquet"
    if not records.exists():
        return [f"{run}: no runs.parquet"]
    rec = pd.read_parquet(records)
    out = [f"{run}: {w}" for w in bench_problems(rec)]
    r = rec.sort_values("started_at").iloc[-1]
    commit, ids = str(r["git_commit"]), set(rec["run_id"].astype(str))
    # Every family the bench swept (its record's list; a bench from before a family joined the
    # grid does not have it).
    listed = set(str(r.get("families") or "").split(",")) - {""}
    if listed and set(FAMILIES) - listed:
        out.append(f"the bench swept {', '.join(sorted(listed))}, not every family "
                   f"(missing: {', '.join(sorted(set(FAMILIES) - listed))})")
    for family in FAMILIES:
        if (not listed or family in listed) and not (run / f"{family}.parquet").exists():
            out.append(f"{family}.parquet is missing")
    sweep_files = {f"{family}.parquet" for family in FAMILIES} | {"limits.parquet"}
    for path in sorted(p for p in run.iterdir() if p.suffix in DATA_SUFFIXES and p.is_file()):
        df = read(path)
        if df is None:
            continue
        # Every file that records a commit is of the run's: the sweep's, and the later steps'
        # (seed 002, the launch costs, the GPT-2 check, the LM head's front, the profile), which
        # are runs of their own.
        seen = sorted(set(df["git_commit"].dropna().astype(str))) if "git_commit" in df else []
        if seen and seen != [commit]:
            out.append(f"{path.name}: git_commit {seen}, not {commit} (a reference is one "
                       "commit: measure that step again at it)")
        if path.name in sweep_files and "run_id" in df and len(df):
            stray = sorted(set(df["run_id"].dropna().astype(str)) - ids)
            if stray:
                out.append(f"{path.name}: run_id {stray}, not the bench's {sorted(ids)}")
        family = path.stem if path.name in sweep_files else None
        if family in FAMILIES and "impl" in df:
            out += stale(family, df)
    return out


def read(path: Path) -> pd.DataFrame | None:
    """A data file's rows (None for a document that is not a table, e.g. an ncu log)."""
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    try:
        return pd.read_csv(path)
    except (ValueError, pd.errors.ParserError):
        return None


def stale(family: str, df: pd.DataFrame) -> list[str]:
    """Why a family's Triton rows are not of this checkout's kernels (empty: they are)."""
    triton = df[df["impl"].astype(str).str.startswith("triton")]
    if not len(triton):
        return []
    hashes = (sorted(set(triton["kernel_hash"].dropna().astype(str)))
              if "kernel_hash" in triton else [])
    here = kernel_hash(family)
    if not hashes or triton["kernel_hash"].isna().any():
        return [f"{family}.parquet: Triton rows without a kernel hash (measured before it was "
                f"recorded; this checkout's is {here})"]
    if hashes != [here]:
        return [f"{family}.parquet: Triton rows of kernel sources {hashes}, not this checkout's "
                f"{here} (promote from the commit that measured them, or measure again)"]
    return []


def lacking(run: Path) -> list[str]:
    """What a reference would lack (said, not refused): the tail steps' and the profile's files,
    and profile cases the profile's budget left out."""
    out = [f"no {name}" for name in EXPECTED if not (run / name).exists()]
    for name in ("profile.parquet", "profile_details.parquet"):
        path = run / name
        if path.exists():
            df = pd.read_parquet(path)
            if "status" in df and (df["status"] != "ok").any():
                bad = df[df["status"] != "ok"]
                out.append(f"{name}: {len(bad)} rows not ok ("
                           + ", ".join(f"{n} {s}" for s, n in bad["status"].value_counts().items())
                           + "; make reference again resumes a profile its budget cut)")
    return out


def plan(run: Path, into: Path) -> tuple[list[Path], list[Path]]:
    """The files to copy from RUN and the files of INTO to remove (every data file RUN lacks)."""
    copy = sorted(p for p in run.iterdir() if p.suffix in DATA_SUFFIXES and p.is_file())
    names = {p.name for p in copy}
    remove = sorted(p for p in into.iterdir() if p.suffix in DATA_SUFFIXES and p.is_file()
                    and p.name not in names) if into.exists() else []
    return copy, remove


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/promote.py",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a finished results folder of one run")
    ap.add_argument("into", type=Path, help="the reference folder to replace")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    why = problems(args.run)
    if why:
        print("promote: refused:\n  " + "\n  ".join(why), file=sys.stderr)
        return 1
    for note in lacking(args.run):
        print(f"promote: note: {note}", file=sys.stderr)
    copy, remove = plan(args.run, args.into)
    for p in remove:
        print(f"remove {p}")
        if not args.dry_run:
            p.unlink()
    if not args.dry_run:
        args.into.mkdir(parents=True, exist_ok=True)
    for p in copy:
        print(f"copy {p.name} -> {args.into}")
        if not args.dry_run:
            shutil.copy2(p, args.into / p.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
