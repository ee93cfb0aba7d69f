"""Compiling before timing, in parallel: a cold bench is compile-bound and serial (one process
compiles our kernels, tunes attention's and LayerNorm's candidates and compiles Inductor's graphs
one after another while the host's other cores idle). Before the timed sweep, worker processes
sharing the GPU call each problem's Triton and default torch.compile variants once, on the
problem's own inputs (same shapes, dtypes and strides, so the same specialisations), which fills
Triton's and Inductor's disk caches; the timed sweep, one process alone on the GPU as before,
then loads the compiled kernels instead of compiling them.

The searching baselines are warmed too: max-autotune's candidate kernels and the peer libraries'
kernels land in Triton's cache, so the timed process searches (times the candidates) without
compiling them. Nothing chosen under the workers' contention is kept: they store no tuning choice
(Triton's, our tuner's and FlagGems' disk copies are off in them, as is Inductor's autotuning
cache), and a max-autotune graph, which holds its search's pick, is not cached either; every
choice the timed rows run is made by the timed process alone. With `tail`, the workers also make
the first calls of the steps after the sweep (the GPT-2 check's compiled models, the LM head
front's compiled graphs and kernels, the launch-cost cases), the longest jobs, taken first.
Nothing a worker does reaches the results: a variant that fails here fails (or not) again in the
timed sweep, which records it.

A pass that ran to its end (every process exited cleanly) leaves a marker file in Triton's and
Inductor's cache folders, named by what it warmed (`marker_name`); a later bench of the same
finds both markers and skips the pass (`already_warm`): on a second run the caches hold what it
would compile, and the pass took 60 s (128 s for the reference grid, whose tuning it repeats). A
job with a failed call does not withhold the marker: a variant that cannot run (Liger's softmax
past its block limit) fails in every pass, so withholding it would repeat the whole pass on each
resumed bench, while the timed sweep compiles for itself whatever failed here (as after an out
of memory beside the other workers) and records its failures. Emptying either cache removes its
marker.
"""
from __future__ import annotations

import contextlib
import hashlib
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import torch

from .families import select_problems

# The implementations whose first call compiles (and, for the searching ones, times candidates
# whose pick is not kept).
WARMED = ("triton_unfused", "triton_fused", "torch_compile", "torch_compile_max", "liger",
          "flag_gems")
MAX_WORKERS = 12
# The first calls of the steps after the sweep, as (module of analysis.bench, argument of its
# warm): one job per compiled GPT-2, the longest jobs; the LM head front's graphs and kernels.
TAIL = (("model_check", "torch_compile"), ("model_check", "torch_compile_triton_head"),
        ("model_check", "triton_fused"), ("model_check", "torch_compile_triton_graph"),
        ("lm_head_front", None), ("launch_cost", None))


def default_workers() -> int:
    """Three quarters of the host's CPUs, at most MAX_WORKERS: a job is mostly one Python thread
    (tracing, lowering), and with half the CPUs' processes the pass kept them ~50% busy."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_WORKERS, 3 * (cpus or 2) // 4))


def no_kept_choices() -> None:
    """This process keeps no tuning choice on disk: Triton's autotuner cache and our tuner's
    (both follow TRITON_CACHE_AUTOTUNING), Inductor's autotuning results."""
    os.environ["TRITON_CACHE_AUTOTUNING"] = "0"
    os.environ["FLAGGEMS_DB_URL"] = "sqlite:///:memory:"  # FlagGems' tuned configs
    import torch._inductor.config as inductor_config

    inductor_config.autotune_local_cache = False
    inductor_config.autotune_remote_cache = False


def no_cached_graph():
    """Inductor and AOTAutograd cache no compiled graph: a max-autotune graph holds its pick."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    stack = contextlib.ExitStack()
    stack.enter_context(inductor_config.patch(fx_graph_cache=False))
    stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
    return stack


def warm_problem(problem, device: torch.device) -> tuple[int, int]:
    """Call each warmed variant of `problem` once (and its graph_fn); (calls that ran, calls
    that failed)."""
    ran = failed = 0
    torch._dynamo.reset()
    try:
        inputs = problem.make_inputs(device)
    except Exception:  # noqa: BLE001 - e.g. out of memory beside the other workers
        return 0, 1
    for variant in problem.variants:
        if variant.impl not in WARMED:
            continue
        for fn in (variant.fn, variant.graph_fn):
            if fn is None:
                continue
            try:
                with no_cached_graph() if variant.impl == "torch_compile_max" else \
                        contextlib.nullcontext():
                    fn(*inputs)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                ran += 1
            except Exception:  # noqa: BLE001 - the timed sweep records what fails
                failed += 1
    del inputs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return ran, failed


def _worker(args, queue, times) -> None:
    t0 = time.perf_counter()
    no_kept_choices()
    device = torch.device(args.device)
    problems = select_problems(args)
    times.put(("start", time.perf_counter() - t0, True))
    while (i := queue.get()) is not None:
        t0 = time.perf_counter()
        if isinstance(i, tuple):
            ok = warm_tail(*i, device)
            name = " ".join(str(a) for a in i if a is not None)
        else:
            ok = not warm_problem(problems[i], device)[1]
            name = f"{problems[i].op} {problems[i].shape}"
        times.put((name, time.perf_counter() - t0, ok))  # also the parent's progress count
    if mp.parent_process() is not None:  # as workers.py: skip a teardown that can abort
        times.close()
        times.join_thread()  # the last job's time reaches the parent before os._exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def warm_tail(step: str, arg, device: torch.device) -> bool:
    """The first calls of a tail step (a TAIL entry): analysis.bench.<step>.warm(device, arg).
    Whether they ran."""
    import importlib

    ok = True
    try:
        importlib.import_module(f"{__package__}.{step}").warm(device, arg)
    except Exception as exc:  # noqa: BLE001 - the step itself records what fails
        print(f"warm: {step} {arg}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        ok = False
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return ok


def _key(p) -> tuple:
    return (p.family, p.op, p.precision, tuple(sorted(p.shape.items())))


def marker_name(args, problems, tail: bool) -> str:
    """The file a finished compile pass of `problems` (and the tail steps) leaves in each cache
    folder: named by the grid, the problems, the tail, the sources, torch's, Triton's and the
    peers' versions, the GPU model and the project's TRITON_FUSION_* settings."""
    import triton

    from .machine import source_hash

    device = torch.device(getattr(args, "device", "cpu"))
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    knobs = sorted((k, v) for k, v in os.environ.items() if k.startswith("TRITON_FUSION_"))
    key = repr((args.grid, sorted(repr(_key(p)) for p in problems), tail, source_hash(),
                torch.__version__, triton.__version__, _peer_versions(), gpu, knobs))
    return "fusion-warm-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def _peer_versions() -> tuple:
    """The installed versions of the peer libraries (None: not installed) and of transformers."""
    from importlib import metadata

    from .peers import PINNED, _version

    try:
        transformers = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        transformers = None
    return (*(_version(impl)[0] for impl in PINNED), transformers)


def cache_folders() -> list[Path]:
    """Triton's kernel cache and Inductor's (where the pass's work lands)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    from triton import knobs

    return [Path(knobs.cache.dir), Path(cache_dir())]


def already_warm(args, problems, tail: bool) -> bool:
    """Whether a compile pass of the same ran to its end into both caches as they are now."""
    name = marker_name(args, problems, tail)
    return all((folder / name).exists() for folder in cache_folders())


def mark_warm(args, problems, tail: bool) -> None:
    name = marker_name(args, problems, tail)
    for folder in cache_folders():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).touch()


def ran_to_its_end(exitcodes: list) -> bool:
    """Whether a pass marks the caches: every process exited cleanly. Jobs with a failed call do
    not withhold it (the module's docstring says why)."""
    return all(code == 0 for code in exitcodes)


def run(args, problems, workers: int, tail: bool = False) -> tuple[float, str]:
    """Warm `problems` (those the timed sweep will measure), and with `tail` the TAIL steps, in
    `workers` processes, each of which rebuilds the grid and takes problems by their index in
    it; (the seconds it took, a line naming the longest jobs and a process's start-up)."""
    t0 = time.perf_counter()
    where = {_key(p): i for i, p in enumerate(select_problems(args))}
    todo = [where[_key(p)] for p in problems if any(v.impl in WARMED for v in p.variants)]
    # Longest first, so that no long one starts last: max-autotune's, then by variants.
    cost = {where[_key(p)]: (any(v.impl == "torch_compile_max" for v in p.variants),
                             len(p.variants)) for p in problems}
    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    queue, times = ctx.Queue(), ctx.Queue()
    todo = [*(TAIL if tail else ()), *sorted(todo, key=lambda i: cost[i], reverse=True)]
    for i in todo:
        queue.put(i)
    for _ in range(workers):
        queue.put(None)
    procs = [ctx.Process(target=_worker, args=(args, queue, times)) for _ in range(workers)]
    for p in procs:
        p.start()
    starts, jobs, last, failed = [], [], -1, 0
    while any(p.is_alive() for p in procs) or not times.empty():
        while not times.empty():
            name, t, ok = times.get()
            (starts if name == "start" else jobs).append((t, name))
            failed += not ok
        time.sleep(1)
        if len(jobs) != last and not args.no_progress:
            last = len(jobs)
            print(f"\rwarming the compile caches: {last}/{len(todo)} problems, "
                  f"{workers} processes, {time.perf_counter() - t0:.0f} s", end="",
                  file=sys.stderr, flush=True)
    if not args.no_progress:
        print(file=sys.stderr)
    for k, p in enumerate(procs):
        if p.exitcode != 0:  # not fatal: the timed sweep compiles what this one did not
            print(f"warm: process {k} exited with {p.exitcode}", file=sys.stderr)
    if ran_to_its_end([p.exitcode for p in procs]):
        with contextlib.suppress(OSError):  # e.g. a read-only cache: the next run warms again
            mark_warm(args, problems, tail)
    longest = (f"a process's start {max(starts)[0]:.0f} s; longest: " if starts else "longest: ") \
        + ", ".join(f"{name[:60]} {t:.0f} s" for t, name in sorted(jobs, reverse=True)[:3]) \
        + (f"; {failed} jobs with a failed call (the timed sweep records them)" if failed else "")
    return time.perf_counter() - t0, longest
