"""One sweep spread over several GPUs: a worker process per GPU takes the next problem from a
shared queue (so a GPU that finishes early takes more), measures it on its own GPU with that GPU's
own limits, and writes its rows into a folder of its own; each row names its run and GPU
(`gpu_index`). When every worker is done the parts are merged into the results folder as one
process would have written it. A worker that dies leaves its part on disk and the others go on.

--resume: `run.remaining` says which problems the new workers (runs of their own) take."""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from .families import select_problems
from .run import measure, merge, remaining


def cpu_share(cpus, k: int, n: int) -> list[int]:
    """Worker k's own slice of the host's CPUs (n workers: n equal, disjoint slices), or all of
    them where there are fewer than two a worker."""
    cpus = sorted(cpus)
    if len(cpus) < 2 * n:
        return cpus
    return cpus[k * len(cpus) // n:(k + 1) * len(cpus) // n]


def _worker(k: int, args, queue, done) -> None:
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
    todo = remaining(args, problems) if args.resume else range(len(problems))
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

