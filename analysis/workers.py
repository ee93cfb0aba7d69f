"""One sweep spread over several GPUs: a worker process per GPU takes the next problem from a
shared queue (so a GPU that finishes early takes more), measures it on its own GPU with that GPU's
own limits, and writes its rows into a folder of its own; each row names its run and GPU
(`gpu_index`). When every worker is done the parts are merged into the results folder as one
process would have written it. A worker that dies leaves its part on disk and the others go on."""
from __future__ import annotations

import multiprocessing as mp
import shutil
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from . import append_run, schema


def _worker(k: int, args, queue, done) -> None:
    from .__main__ import measure, select_problems

    if torch.device(args.device).type == "cuda":
        torch.cuda.set_device(k)
        device = torch.device("cuda", k)
    else:  # the interpreter: workers share the CPU (a test of the machinery)
        device = torch.device("cpu")
    args.seed += k
    problems = select_problems(args)

    def share():
        while (i := queue.get()) is not None:
            yield problems[i]

    def counted():
        with done.get_lock():
            done.value += 1
    measure(args, share(), _part(args.out, k), device, on_row=counted)


def _part(out: Path, k: int) -> Path:
    return Path(out) / ".parts" / f"worker{k}"


def run(args, problems) -> dict[str, Path]:
    """Spread `problems` over `args.workers` processes; the merged family files."""
    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    queue, done = ctx.Queue(), ctx.Value("i", 0)
    # Largest first (by variants), so no long problem starts last while the others idle.
    for i in sorted(range(len(problems)), key=lambda i: -len(problems[i].variants)):
        queue.put(i)
    for _ in range(args.workers):
        queue.put(None)
    parts = Path(args.out) / ".parts"
    shutil.rmtree(parts, ignore_errors=True)
    procs = [ctx.Process(target=_worker, args=(k, args, queue, done), daemon=False)
             for k in range(args.workers)]
    for p in procs:
        p.start()
    total = sum(len(p.variants) for p in problems)
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
    paths = merge([_part(args.out, k) for k in range(args.workers)], Path(args.out))
    if failed:
        print(f"workers {failed} failed: their rows so far are merged; their parts stay in "
              f"{parts}", file=sys.stderr)
    else:
        shutil.rmtree(parts, ignore_errors=True)
    return paths


def merge(parts: list[Path], out: Path) -> dict[str, Path]:
    """The workers' family files, concatenated into `out` (replacing a family's file there, as
    one process's run does); their limits and run records appended to `out`'s."""
    paths = {}
    for family in schema.FAMILY_SHAPES:
        tables = [pq.read_table(p / f"{family}.parquet") for p in parts
                  if (p / f"{family}.parquet").exists()]
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
