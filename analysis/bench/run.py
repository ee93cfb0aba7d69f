"""One process's run of a bench, and how a stopped bench is resumed and a multi-worker bench's
parts merged: what the command line (`__main__`) and the workers (`workers`) both call.

A run: its record in runs.parquet (started, then finished), the machine's limits, then the
problems, row by row, into the results folder (`measure`).

--resume (a bench stopped part way, e.g. by a command's time limit): the parts a stopped
multi-worker bench left in .parts are merged into the folder first (`adopt_stopped`), the
unfinished runs are checked (same families, commit, kernel sources, GPU and versions: else
refused, nothing changed) and marked "stopped"; then only the problems that no run of the same
bench has written in full are measured: by this process, continuing the stopped run's id and
limits (`resumed`), or by new workers, runs of their own (`remaining`); their rows are added to
the folder's.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import os
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from .. import schema
from . import append, machine, sweep
from ..families import FAMILIES
from .families import TIMING, TRIALS


def measure(args, problems, out: Path, device: torch.device, on_row=None) -> dict[str, Path]:
    """One process on one device: its run record, its limits, then the problems (a list, or an
    iterator that a worker fills from the shared queue) into `out`."""
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    out.mkdir(parents=True, exist_ok=True)
    families = ",".join(args.family or sorted(FAMILIES))
    resume = getattr(args, "resume", False)
    if resume:  # a stopped multi-worker bench's parts first (checked, then merged)
        adopt_stopped(out, families, machine.run_metadata(device))
    runs = schema.ParquetSink(out / "runs.parquet", schema.runs_schema(), keep_existing=True)
    if resume:
        meta, limit_rows = resumed(out, runs, device, families)
        total = len(problems)
        problems = sweep.remaining(problems, out, same_bench(out, runs.rows, meta, families))
        print(f"resuming run {meta['run_id']} (commit {meta['git_commit']}): "
              f"{total - len(problems)} of {total} problems done", flush=True)
    else:
        meta = machine.run_metadata(device)
        print(f"run {meta['run_id']} on {meta['gpu']} (#{meta['gpu_index']}): torch "
              f"{meta['torch']}, triton {meta['triton']}, cuda {meta['cuda']}, commit "
              f"{meta['git_commit']}", flush=True)
        runs.upsert(machine.run_record(meta, device, "start", args.argv, status="running",
                                       families=families))
        limit_rows = machine.measure_limits(device, meta)
        # One folder may hold several runs (one per family, say): their limits accumulate.
        sink = schema.ParquetSink(out / "limits.parquet", schema.limits_schema(),
                                  keep_existing=True)
        for row in limit_rows:
            sink.append(row)
            if row["value"] is not None:
                print(f"  {row['metric']:<12} {row['precision']:<5} {row['value']:10.1f} "
                      f"{row['unit']}")
    paths = sweep.run(problems, out, device, meta, limit_rows,
                      progress=not args.no_progress and on_row is None, on_row=on_row,
                      keep_existing=resume, trials=TRIALS[getattr(args, "grid", "full")],
                      timing=TIMING[getattr(args, "grid", "full")])
    files = {out / f"{f}.parquet" for f in FAMILIES if (out / f"{f}.parquet").exists()}
    n_rows = sum(schema.read(path)["run_id"].eq(meta["run_id"]).sum()
                 for path in files | set(paths.values()))
    start = next(r for r in runs.rows if r["run_id"] == meta["run_id"])
    end = machine.run_record(meta, device, "end", args.argv, status="finished",
                             families=families, rows=int(n_rows),
                             finished_at=dt.datetime.now(dt.timezone.utc).isoformat(
                                 timespec="seconds"))
    if resume:  # the command lines of every part, in order
        end["argv"] = f"{start['argv']} | {end['argv']}"
    runs.upsert({**start, **{k: v for k, v in end.items() if v is not None or k not in start}})
    return paths


# What a resumed run must share with the run it continues.
SAME_FOR_RESUME = ("git_commit", "source_hash", "gpu", "sm_count", "torch", "triton", "cuda")


def run_meta(out: Path, run_id: str) -> dict | None:
    """A run's metadata as its limit rows carry it (None if it has none)."""
    rows = schema.ParquetSink(out / "limits.parquet", schema.limits_schema(),
                              keep_existing=True).rows
    return next((r for r in rows if r["run_id"] == run_id), None)


def same_bench(out: Path, run_rows: list[dict], meta: dict, families: str) -> set[str]:
    """The runs in `out` that a resumed bench continues besides its own (several workers, several
    commands): those of the same families, commit, kernel sources, GPU model and versions."""
    ids = {meta["run_id"]}
    for record in run_rows:
        other = run_meta(out, record["run_id"])
        if (record.get("families") == families and other is not None
                and all(other.get(k) == meta.get(k) for k in SAME_FOR_RESUME)):
            ids.add(record["run_id"])
    return ids


def resumed(out: Path, runs, device: torch.device, families: str) -> tuple[dict, list[dict]]:
    """(meta, limit rows) of the unfinished run in `out` that --resume continues: its run id,
    start and limits, checked against this process's commit, kernel sources, GPU and versions."""
    running = [r for r in runs.rows if r.get("status") == "running"]
    if not running:
        raise SystemExit(f"--resume: no unfinished run in {out} (runs.parquet has none running)")
    record = running[-1]
    for other in running[:-1]:  # continued by this one's process, their rows kept
        other["status"] = "stopped"
    runs.flush()
    if record.get("families") != families:
        raise SystemExit(f"--resume: run {record['run_id']} swept {record.get('families')}, "
                         f"this command {families}: give the same --family options")
    limit_path = out / "limits.parquet"
    rows = schema.ParquetSink(limit_path, schema.limits_schema(), keep_existing=True).rows
    limit_rows = [r for r in rows if r["run_id"] == record["run_id"]]
    if not limit_rows:
        raise SystemExit(f"--resume: run {record['run_id']} has no limits in {limit_path}")
    now = machine.run_metadata(device)
    meta = {k: limit_rows[0].get(k, now[k]) for k in now}  # the run's, as its rows carry them
    for key in SAME_FOR_RESUME:
        if meta[key] != now[key]:
            raise SystemExit(f"--resume: run {record['run_id']} has {key}={meta[key]!r}, this "
                             f"process {now[key]!r}: a run is one commit on one GPU")
    return meta, limit_rows


def adopt_stopped(out: Path, families: str, now: dict) -> list[str]:
    """The unfinished runs a --resume continues, in order (ids): those in `out` and in the parts
    a stopped multi-worker bench left in out/.parts. Each is checked first (same families,
    commit, kernel sources, GPU model and versions as this process: else SystemExit, nothing
    changed); then the parts' rows are merged into `out` (a part whose runs `out` already holds
    is not merged twice) and .parts removed."""
    out = Path(out)
    leftovers = sorted((out / ".parts").glob("worker*"))

    def records(folder):
        path = folder / "runs.parquet"
        return schema.ParquetSink(path, schema.runs_schema(), keep_existing=True).rows \
            if path.exists() else []

    running = [(folder, r) for folder in (out, *leftovers) for r in records(folder)
               if r.get("status") == "running"]
    known = {r["run_id"] for r in records(out)}
    fresh = [p for p in leftovers if not {r["run_id"] for r in records(p)} <= known]
    if not running:
        if fresh:  # every worker finished but the bench was stopped in its merge: finish it
            merge(fresh, out, keep_existing=True)
            shutil.rmtree(out / ".parts", ignore_errors=True)
            raise SystemExit(f"--resume: the finished workers' parts in {out / '.parts'} are "
                             f"merged (the bench was stopped in its merge); nothing to measure")
        raise SystemExit(f"--resume: no unfinished run in {out} (runs.parquet has none running)")
    for folder, record in running:
        if record.get("families") != families:
            raise SystemExit(f"--resume: run {record['run_id']} swept {record.get('families')}, "
                             f"this command {families}: give the same --family options")
        meta = run_meta(folder, record["run_id"])
        if meta is None:  # stopped while measuring its limits: it wrote no row to adopt
            continue
        for key in SAME_FOR_RESUME:
            if meta.get(key) != now[key]:
                raise SystemExit(f"--resume: run {record['run_id']} has {key}={meta.get(key)!r}, "
                                 f"this process {now[key]!r}: a bench is one commit on one GPU "
                                 f"model")
    if fresh:
        merge(fresh, out, keep_existing=True)
    shutil.rmtree(out / ".parts", ignore_errors=True)
    return [r["run_id"] for _, r in running]


def remaining(args, problems) -> list[int]:
    """The indices of `problems` that the workers of a resumed bench still have to measure
    (module docstring)."""
    out = Path(args.out)
    families = ",".join(args.family or sorted(FAMILIES))
    now = machine.run_metadata(torch.device(args.device))
    stopped = adopt_stopped(out, families, now)
    runs = schema.ParquetSink(out / "runs.parquet", schema.runs_schema(), keep_existing=True)
    for record in runs.rows:
        if record["run_id"] in stopped:
            record["status"] = "stopped"
    runs.flush()
    # The runs whose rows count: this process's kind (a stopped run may have no limits to say
    # what it was: killed while measuring them).
    ids = same_bench(out, runs.rows, now, families)
    todo = sweep.remaining(problems, out, ids)
    done = len(problems) - len(todo)
    print(f"resuming runs {', '.join(sorted(ids - {now['run_id']}))}: {done} of "
          f"{len(problems)} problems done", flush=True)
    return [i for i, p in enumerate(problems) if any(p is t for t in todo)]


def merge(parts: list[Path], out: Path, keep_existing: bool = False) -> dict[str, Path]:
    """The workers' family files, concatenated into `out` (replacing a family's file there, as
    one process's run does, unless keep_existing: then added to its rows); their limits and run
    records appended to `out`'s."""
    paths = {}
    for family in schema.FAMILY_SHAPES:
        tables = [pq.read_table(p / f"{family}.parquet") for p in parts
                  if (p / f"{family}.parquet").exists()]
        if tables and keep_existing and (out / f"{family}.parquet").exists():
            # Without the parts' runs' rows: a merge that was interrupted may have written them.
            ids = pa.array(sorted({i for t in tables for i in t.column("run_id").to_pylist()}),
                           pa.string())
            old = pq.read_table(out / f"{family}.parquet")
            tables.insert(0, old.filter(pc.invert(pc.is_in(old["run_id"], value_set=ids))))
        if tables:
            path = out / f"{family}.parquet"
            append.write(pa.concat_tables(tables), path)
            paths[family] = path
    for part in parts:
        for name in ("limits", "runs"):
            if (part / f"{name}.parquet").exists():
                append.write(append.merged_by_run(part, out, name),
                                  out / f"{name}.parquet")
    return paths


def lock(out: Path) -> int:
    """Hold out/.lock for this process's life (the kernel lets go when it ends, killed or not):
    a second run or --resume into a folder being written would rewrite its files from its own
    rows and drop the other's (e.g. a resume of a run thought lost that is still going)."""
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / ".lock", os.O_CREAT | os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SystemExit(f"{out} is being written by another process (a run or --resume still "
                         f"going): wait for it to end, or stop it first") from None
    return fd

