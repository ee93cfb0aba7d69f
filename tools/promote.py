"""Make one finished, clean run a reference results folder.

    python tools/promote.py RUN INTO [--dry-run]

INTO (e.g. `results/reference/h100`) then holds RUN's results alone: RUN's data files (Parquet
and CSV) are copied in, and INTO's data files that RUN lacks are removed, except the named Nsight
Compute documents the chapters cite (`ncu_*.csv`, profiles of earlier commits). A patchwork is
replaced, not kept beside (issue 15). Refused, with every reason, unless RUN is one clean bench
(one run, or the per-GPU runs of one `--workers` bench and its resumes, see `bench_problems`):
finished, at one clean commit, the sweep's rows of its run ids, every Parquet row of that
commit, and every family of the grid present. A later step's file (the profile's
details, seed 002) may come from another commit only where what it measures is the same at both
(MEASURED: the kernels, the problems and baselines of the grid, and the step's own benchmark
where it has one; git says so): an analysis fix or a new reading of the same kernels.
`--dry-run` prints what would change.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

try:
    import triton_fusion_report  # noqa: F401 - PYTHONPATH=. (as the Makefile sets) or installed
except ImportError:  # run from a checkout without PYTHONPATH: the checkout's package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from triton_fusion_report.analysis.bench import machine  # noqa: E402
from triton_fusion_report.analysis.families import FAMILIES  # noqa: E402

DATA_SUFFIXES = (".parquet", ".csv")
KEPT_DOCUMENTS = "ncu_*.csv"
# What a later step measures, as paths from the repository's top: the kernels, and the modules
# that define the grid's problems and baselines (the family modules, the sweep, the peers, the
# traffic model); a step with a benchmark of its own adds that. Each module at its place since
# the bench became a package (analysis/bench/, analysis/model/) and before (analysis/): two
# commits on either side of the move differ there, and are refused.
_BEFORE, _BENCH = "analysis/", "analysis/bench/"
MEASURED = ("kernels", "analysis/families.py", "analysis/bench/families.py",
            "analysis/model/traffic.py",
            *(folder + name for folder in (_BEFORE, _BENCH)
              for name in ("__main__.py", "sweep.py", "attention.py", "elementwise.py",
                           "reductions.py", "matmul_epilogue.py", "peers.py", "schema.py")),
            "analysis/traffic.py")
TIMING = ("analysis/timing.py", "analysis/bench/timing.py")
# The counters need no timing; another step's file is held to the timing protocol too.
MEASURED_BY_FILE = {"seed002.parquet": ("analysis/seed002.py", "analysis/bench/seed002.py",
                                        *TIMING),
                    "profile.parquet": (), "profile_details.parquet": ()}


def same_measured(a: str, b: str, name: str = "") -> bool:
    """True where commits a and b of the project's own checkout hold the same MEASURED paths,
    and those of file `name`; False where git does not know either commit."""
    if not machine.own_checkout():
        return False
    paths = [f":(top){p}" for p in MEASURED + MEASURED_BY_FILE.get(name, TIMING)]
    try:
        for c in (a, b):
            machine.git("cat-file", "-e", f"{c}^{{commit}}")
        machine.git("diff", "--quiet", a, b, "--", *paths)  # exit 1: they differ
    except (OSError, subprocess.CalledProcessError):
        return False
    return True


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
        # The grid is in every run's command line since the default became the book's subset;
        # before, a run without one was of the full grid.
        if "--grid" in str(r.get("argv", "")) and "--grid full" not in str(r["argv"]):
            out.append(f"run {r['run_id']}: not the full grid (make bench GRID=full)")
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
    ids = set(rec["run_id"].astype(str))
    # Every family the bench swept (its record's list; a bench from before a family joined the
    # grid does not have it).
    listed = set(str(r.get("families") or "").split(",")) - {""}
    for family in FAMILIES:
        if (not listed or family in listed) and not (run / f"{family}.parquet").exists():
            out.append(f"{family}.parquet is missing")
    sweep_files = {f"{family}.parquet" for family in FAMILIES} | {"limits.parquet"}
    for path in sorted(run.glob("*.parquet")):
        df = pd.read_parquet(path)
        # The sweep's files are the run's own; the later steps (seed 002, the profile) record
        # runs of their own, at the same commit.
        checks = [("git_commit", {str(r["git_commit"])})]
        if path.name in sweep_files:
            checks.append(("run_id", ids))
        for column, want in checks:
            if column not in df or not len(df):
                continue
            seen = sorted(set(df[column].dropna().astype(str)))
            if seen and set(seen) <= want:
                continue
            if (column == "git_commit" and path.name not in sweep_files and seen
                    and all(same_measured(str(r["git_commit"]), c, path.name) for c in seen)):
                continue  # a later step, at a commit that measures the same code
            why = ("" if path.name in sweep_files or column != "git_commit" else
                   " (no commit recorded)" if not seen else
                   " (a commit git does not know, or what it measures differs)")
            out.append(f"{path.name}: {column} {seen}, not {sorted(want)}{why}")
    return out


def plan(run: Path, into: Path) -> tuple[list[Path], list[Path]]:
    """The files to copy from RUN and the files of INTO to remove."""
    copy = sorted(p for p in run.iterdir() if p.suffix in DATA_SUFFIXES and p.is_file())
    names = {p.name for p in copy}
    kept = set(into.glob(KEPT_DOCUMENTS)) if into.exists() else set()
    remove = sorted(p for p in into.iterdir() if p.suffix in DATA_SUFFIXES and p.is_file()
                    and p.name not in names and p not in kept) if into.exists() else []
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
