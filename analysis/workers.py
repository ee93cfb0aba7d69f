"""One sweep spread over several GPUs: a worker process per GPU takes the next problem from a
shared queue (so a GPU that finishes early takes more), measures it on its own GPU with that GPU's
own limits, and writes its rows into a folder of its own; each row names its run and GPU
(`gpu_index`). When every worker is done the parts are merged into the results folder as one
process would have written it. A worker that dies leaves its part on disk and the others go on.

--resume (a bench stopped part way, e.g. by a command's time limit): the parts left on disk are
merged into the folder first, the unfinished runs are marked "stopped", and new workers (runs of
their own) measure only the problems that no run of the same commit, kernel sources, GPU and
versions has written in full; their rows are added to the folder's."""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from . import append_run, machine, schema, sweep


def cpu_share(cpus, k: int, n: int) -> list[int]:
    """Worker k's own slice of the host's CPUs (n workers: n equal, disjoint slices), or all of
    them where there are fewer than two a worker."""
    cpus = sorted(cpus)
    if len(cpus) < 2 * n:
        return cpus
    return cpus[k * len(cpus) // n:(k + 1) * len(cpus) // n]


def _worker(k: int, args, queue, done) -> None:
    from .__main__ import measure, select_problems

    if torch.device(args.device).type == "cuda":
        torch.cuda.set_device(k)
        device = torch.device("cuda", k)
        if hasattr(os, "sched_setaffinity") and mp.parent_process() is not None:
            # A worker's per-call timings are host-bound at small sizes: on a shared host the
            # others' compiles (max-autotune's pools take up to 32 CPUs each) stole their CPU
            # (per-call 4x slower at p95 under 30 us, docs/bench.md). Each worker keeps a slice.
            mine = cpu_share(os.sched_getaffinity(0), k, args.workers)
            os.sched_setaffinity(0, mine)
            import torch._inductor.config as inductor_config

            inductor_config.compile_threads = len(mine)
    else:  # the interpreter: workers share the CPU (a test of the machinery)
        device = torch.device("cpu")
    args.seed += k
    args.resume = False  # a worker's run is new; run() chose the problems it may take
    problems = select_problems(args)

    def share():
        while (i := queue.get()) is not None:
            yield problems[i]

    def counted():
        with done.get_lock():
            done.value += 1
    measure(args, share(), _part(args.out, k), device, on_row=counted)
    if mp.parent_process() is not None:  # a worker process (not a test's in-process worker)
        # Every row and the run's record are on disk (written whole, then renamed). Skip the
        # interpreter's teardown: Arrow's thread pools can abort there ("terminate called
        # without an active exception", apache/arrow#34314), which would report a finished
        # worker as failed.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _part(out: Path, k: int) -> Path:
    return Path(out) / ".parts" / f"worker{k}"


def run(args, problems) -> dict[str, Path]:
    """Spread `problems` over `args.workers` processes; the merged family files."""
    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    queue, done = ctx.Queue(), ctx.Value("i", 0)
    todo = resume(args, problems) if args.resume else range(len(problems))
    # Largest first (by variants), so no long problem starts last while the others idle.
    for i in sorted(todo, key=lambda i: -len(problems[i].variants)):
        queue.put(i)
    for _ in range(args.workers):
        queue.put(None)
    parts = Path(args.out) / ".parts"
    shutil.rmtree(parts, ignore_errors=True)
    procs = [ctx.Process(target=_worker, args=(k, args, queue, done), daemon=False)
             for k in range(args.workers)]
    for p in procs:
        p.start()
    total = sum(len(problems[i].variants) for i in todo)
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="cfg", dynamic_ncols=True,
                   mininterval=2 if sys.stderr.isatty() else 20)
    while any(p.is_alive() for p in procs):
        time.sleep(1)
        if bar is not None:
            bar.update(done.value - bar.n)
    if bar is not None:
        bar.update(done.value - bar.n)
        bar.close()
    failed = [k for k, p in enumerate(procs) if p.exitcode != 0]
    paths = merge([_part(args.out, k) for k in range(args.workers)], Path(args.out),
                  keep_existing=args.resume)
    if failed:
        # Out of .parts: a later --resume must not merge these rows a second time.
        kept = parts.with_name(".parts-merged")
        shutil.rmtree(kept, ignore_errors=True)
        wrote = parts.exists()  # not where every worker died before writing anything
        if wrote:
            parts.rename(kept)
        # Not exit 0: the bench is incomplete (a dead worker's problem left the queue with it),
        # and `make bench`/`make report` must not go on as if it were done.
        so_far = (f"their rows so far are merged (their parts are kept in {kept})" if wrote
                  else "none wrote a row")
        raise SystemExit(f"workers {failed} failed: {so_far}; --resume measures what is missing")
    else:
        shutil.rmtree(parts, ignore_errors=True)
    return paths


def adopt_stopped(out: Path, families: str, now: dict) -> list[str]:
    """The unfinished runs a --resume continues, in order (ids): those in `out` and in the parts
    a stopped multi-worker bench left in out/.parts. Each is checked first (same families,
    commit, kernel sources, GPU model and versions as this process: else SystemExit, nothing
    changed); then the parts' rows are merged into `out` (a part whose runs `out` already holds
    is not merged twice) and .parts removed."""
    from .__main__ import SAME_FOR_RESUME, run_meta

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


def resume(args, problems) -> list[int]:
    """The indices of `problems` a resumed bench still has to measure (module docstring)."""
    from .__main__ import FAMILIES, same_bench

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
            append_run._write(pa.concat_tables(tables), path)
            paths[family] = path
    for part in parts:
        for name in ("limits", "runs"):
            if (part / f"{name}.parquet").exists():
                append_run._write(append_run.merged_by_run(part, out, name),
                                  out / f"{name}.parquet")
    return paths
