"""`python -m triton_fusion_report.analysis --out DIR [--grid full|smoke] [--family NAME ...] [--op NAME ...]`: run the sweeps.

Measures the machine's limits first (copy bandwidth, matmul peak per precision), then every
family's grid, writing DIR/limits.parquet and DIR/<family>.parquet row by row, and prints a short
summary table at the end.

--op keeps only the problems of the named ops (the `op` column: e.g. `softmax` is the softmax
forward, `softmax_bwd` its backward, `layer_norm_fwd` / `layer_norm_bwd`), to measure new rows
alone; `python -m triton_fusion_report.analysis.append_run` then adds them to a results folder.
"""
from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import os
import random
import sys
from pathlib import Path

# Autotuning results kept on disk, as Inductor and Triton keep compiled kernels (in
# /tmp/torchinductor_$USER and ~/.triton/cache): a second run on the same machine skips the
# compiling and tuning of the first (FlagGems' kernels autotune at every new shape).
os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")

import torch

from . import attention, elementwise, machine, matmul_epilogue, reductions, schema, summary, sweep

FAMILIES = {
    "elementwise": elementwise.problems,
    "softmax": reductions.softmax_problems,
    "layernorm": reductions.layernorm_problems,
    "softmax_matmul": attention.softmax_matmul_problems,
    "attention": attention.all_attention_problems,
    "matmul_softmax": matmul_epilogue.matmul_softmax_problems,
    "linear_act": matmul_epilogue.linear_act_problems,
}


def select_ops(problems: list[sweep.Problem], ops: list[str] | None) -> list[sweep.Problem]:
    """The problems whose op is one of `ops` (all of them when `ops` is None). An op that none of
    the problems has is an error naming the ones there are (a typo would otherwise measure
    nothing and say nothing)."""
    if not ops:
        return problems
    known = list(dict.fromkeys(p.op for p in problems))
    unknown = [op for op in ops if op not in known]
    if unknown:
        raise ValueError(f"--op {', '.join(unknown)}: no such op in the families chosen; "
                         f"their ops are {', '.join(known)}")
    return [p for p in problems if p.op in ops]


def select_shapes(problems: list[sweep.Problem], where: list[str] | None) -> list[sweep.Problem]:
    """The problems whose shape has every COL=VALUE of `where` (a few headline shapes measured
    alone; COL=V1,V2 keeps either value); a problem without the column is left out."""
    if not where:
        return problems
    wanted = {}
    for item in where:
        col, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--where {item}: expected COLUMN=VALUE, e.g. seq=4096")
        wanted[col] = [int(v) if v.lstrip("-").isdigit()
                       else {"True": True, "False": False}.get(v, v) for v in value.split(",")]
    return [p for p in problems
            if all(col in p.shape and p.shape[col] in vs for col, vs in wanted.items())]


def parse(argv=None):
    ap = argparse.ArgumentParser(prog="python -m triton_fusion_report.analysis", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="results folder to create")
    ap.add_argument("--grid", default="full", choices=["full", "smoke"])
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES),
                    help="family to sweep (repeatable; default: all)")
    ap.add_argument("--op", action="append", metavar="NAME",
                    help="keep only the problems of this op (repeatable; default: all), e.g. "
                         "softmax_bwd for the softmax backward alone")
    ap.add_argument("--where", action="append", metavar="COL=VALUE",
                    help="keep only the problems whose shape has this value (repeatable), e.g. "
                         "--where seq=4096 --where head_dim=128; COL=V1,V2 keeps either")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--workers", type=int, default=None,
                    help="processes sharing the configurations, one per GPU (default: every "
                         "visible GPU; on the CPU 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--resume", action="store_true",
                    help="continue the unfinished run in --out: only the configurations it has "
                         "not written yet; one process keeps the run id and limits, several "
                         "workers start runs of their own beside the stopped ones; refused if "
                         "the commit, kernel sources, GPU or versions differ")
    args = ap.parse_args(argv)
    try:
        problems = select_problems(args)
    except ValueError as exc:
        ap.error(str(exc))
    if not args.resume:
        # A new run starts its families' files afresh (and a multi-worker one clears .parts):
        # into a folder that has them it would drop earlier runs' rows, their records kept.
        held = sorted({p.family for p in problems if (args.out / f"{p.family}.parquet").exists()})
        if held:
            ap.error(f"{args.out} already holds {', '.join(held)} rows: give a new --out (append_run "
                     f"adds its rows here after), or --resume to continue a stopped run")
        if (args.out / ".parts").exists():
            ap.error(f"{args.out} holds a stopped multi-worker bench (.parts): --resume continues it")
    if torch.device(args.device).type == "cpu":
        from ..kernels._common import interpreting

        if not interpreting():
            ap.error("no GPU: set TRITON_INTERPRET=1 to sweep on the CPU through the interpreter")
    if args.workers is None:
        cuda = torch.device(args.device).type == "cuda" and torch.device(args.device).index is None
        args.workers = torch.cuda.device_count() if cuda else 1
    if args.workers > 1 and torch.device(args.device).index is not None:
        ap.error("--workers > 1 spreads over the visible GPUs: give --device cuda, not one GPU")
    if torch.device(args.device).type == "cuda" and args.workers > torch.cuda.device_count():
        ap.error(f"--workers {args.workers}: {torch.cuda.device_count()} GPU(s) visible; a worker "
                 "per GPU (two on one GPU would time each other's kernels)")
    args.argv = ["python -m triton_fusion_report.analysis",
                 *(argv if argv is not None else sys.argv[1:])]
    return args, problems


def select_problems(args) -> list[sweep.Problem]:
    """The grid's problems, in a fixed order (every worker builds the same list)."""
    problems = [p for fam in (args.family or sorted(FAMILIES)) for p in FAMILIES[fam](args.grid)]
    if args.grid == "smoke":  # toy shapes: max-autotune's search would be most of the run's time
        for p in problems:
            p.variants = [v for v in p.variants if v.impl != "torch_compile_max"]
    chosen = select_shapes(select_ops(problems, args.op), args.where)
    if args.where and not chosen:  # a typo'd column or value would measure nothing, silently
        columns = sorted({c for p in problems for c in p.shape})
        raise ValueError(f"--where {' '.join(args.where)}: no problem of the families and ops "
                         f"chosen has that shape; their shape columns are {', '.join(columns)}")
    return chosen


def measure(args, problems, out: Path, device: torch.device, on_row=None) -> dict[str, Path]:
    """One process on one device: its run record, its limits, then the problems (a list, or an
    iterator that a worker fills from the shared queue) into `out`."""
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    out.mkdir(parents=True, exist_ok=True)
    families = ",".join(args.family or sorted(FAMILIES))
    resume = getattr(args, "resume", False)
    if resume:  # a stopped multi-worker bench's parts first (checked, then merged)
        from .workers import adopt_stopped

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
                      keep_existing=resume)
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


def main(argv=None) -> int:
    args, problems = parse(argv)
    held = lock(args.out)
    try:
        if args.workers > 1:
            from . import workers

            paths = workers.run(args, problems)
        else:
            paths = measure(args, problems, args.out, torch.device(args.device))
    finally:
        os.close(held)
    for family, path in paths.items():
        print(summary.table(schema.read(path)))
        print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
