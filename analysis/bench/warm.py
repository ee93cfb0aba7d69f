"""Compiling before timing, in parallel: a cold bench is compile-bound and serial (one process
compiles our kernels, tunes attention's and LayerNorm's candidates and compiles Inductor's graphs
one after another while the host's other cores idle). Before the timed sweep, worker processes
sharing the GPU call each problem's Triton and default torch.compile variants once, on the
problem's own inputs (same shapes, dtypes and strides, so the same specialisations), which fills
Triton's and Inductor's disk caches; the timed sweep, one process alone on the GPU as before,
then loads the compiled kernels instead of compiling them.

Nothing chosen under the workers' contention is kept: they store no tuning choice (Triton's and
our tuner's disk copies are off in them, as is Inductor's autotuning cache), so every choice the
timed rows run is made by the timed process alone. The baselines that search (max-autotune, the
peer libraries' autotuners) are not warmed: their searches time candidates. Nothing a worker
does reaches the results: a variant that fails here fails (or not) again in the timed sweep,
which records it.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

import torch

from .families import select_problems

# The implementations whose first call compiles without timing anything that is kept.
WARMED = ("triton_unfused", "triton_fused", "torch_compile")
MAX_WORKERS = 8


def default_workers() -> int:
    """Half the host's CPUs (Inductor compiles in pools of its own), at most MAX_WORKERS."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_WORKERS, (cpus or 2) // 2))


def no_kept_choices() -> None:
    """This process keeps no tuning choice on disk: Triton's autotuner cache and our tuner's
    (both follow TRITON_CACHE_AUTOTUNING), Inductor's autotuning results."""
    os.environ["TRITON_CACHE_AUTOTUNING"] = "0"
    import torch._inductor.config as inductor_config

    inductor_config.autotune_local_cache = False
    inductor_config.autotune_remote_cache = False


def warm_problem(problem, device: torch.device) -> int:
    """Call each warmed variant of `problem` once (and its graph_fn); the number that ran."""
    ran = 0
    torch._dynamo.reset()
    try:
        inputs = problem.make_inputs(device)
    except Exception:  # noqa: BLE001 - e.g. out of memory beside the other workers
        return 0
    for variant in problem.variants:
        if variant.impl not in WARMED:
            continue
        for fn in (variant.fn, variant.graph_fn):
            if fn is None:
                continue
            try:
                fn(*inputs)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                ran += 1
            except Exception:  # noqa: BLE001 - the timed sweep records what fails
                pass
    del inputs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return ran


def _worker(args, queue, done) -> None:
    no_kept_choices()
    device = torch.device(args.device)
    problems = select_problems(args)
    while (i := queue.get()) is not None:
        warm_problem(problems[i], device)
        with done.get_lock():
            done.value += 1
    if mp.parent_process() is not None:  # as workers.py: skip a teardown that can abort
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _key(p) -> tuple:
    return (p.family, p.op, p.precision, tuple(sorted(p.shape.items())))


def run(args, problems, workers: int) -> float:
    """Warm `problems` (those the timed sweep will measure) in `workers` processes, each of
    which rebuilds the grid and takes problems by their index in it; the seconds it took."""
    t0 = time.perf_counter()
    where = {_key(p): i for i, p in enumerate(select_problems(args))}
    todo = [where[_key(p)] for p in problems if any(v.impl in WARMED for v in p.variants)]
    sizes = {where[_key(p)]: len(p.variants) for p in problems}
    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    queue, done = ctx.Queue(), ctx.Value("i", 0)
    for i in sorted(todo, key=lambda i: -sizes[i]):  # largest first: no long one starts last
        queue.put(i)
    for _ in range(workers):
        queue.put(None)
    procs = [ctx.Process(target=_worker, args=(args, queue, done)) for _ in range(workers)]
    for p in procs:
        p.start()
    last = -1
    while any(p.is_alive() for p in procs):
        time.sleep(1)
        if done.value != last and not args.no_progress:
            last = done.value
            print(f"\rwarming the compile caches: {last}/{len(todo)} problems, "
                  f"{workers} processes, {time.perf_counter() - t0:.0f} s", end="",
                  file=sys.stderr, flush=True)
    if not args.no_progress:
        print(file=sys.stderr)
    for k, p in enumerate(procs):
        if p.exitcode != 0:  # not fatal: the timed sweep compiles what this one did not
            print(f"warm: process {k} exited with {p.exitcode}", file=sys.stderr)
    return time.perf_counter() - t0
