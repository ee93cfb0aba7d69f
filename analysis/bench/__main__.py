"""`python -m triton_fusion_report.analysis.bench --out DIR [--grid book|reference|full|smoke] [--family NAME ...] [--op NAME ...]`: run the sweeps.

Measures the machine's limits first (copy bandwidth, matmul peak per precision), then every
family's grid, writing DIR/limits.parquet and DIR/<family>.parquet row by row, and prints a short
summary table at the end.

--op keeps only the problems of the named ops (the `op` column: e.g. `softmax` is the softmax
forward, `softmax_bwd` its backward, `layer_norm_fwd` / `layer_norm_bwd`), to measure new rows
alone; `python tools/append_run.py` then adds them to a results folder.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

# Autotuning results kept on disk, as Inductor and Triton keep compiled kernels (in
# /tmp/torchinductor_$USER and ~/.triton/cache): a second run on the same machine skips the
# compiling and tuning of the first (FlagGems' kernels autotune at every new shape).
os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")

import torch

from .. import schema
from . import summary
from ..families import FAMILIES
from .families import GRIDS, select_problems
from .peers import missing
from .run import lock, measure
from .steps import TAIL_STEPS, done, mark_done, step_argv


def parse(argv=None):
    ap = argparse.ArgumentParser(prog="python -m triton_fusion_report.analysis.bench",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="results folder to create")
    ap.add_argument("--grid", default="book", choices=GRIDS,
                    help="book: the sizes the book shows, one trial (default); reference: the "
                         "book's sizes with every baseline the book reads, three trials where "
                         "it reads their spread (make reference); full: every size, block and "
                         "baseline, three trials; smoke: toy shapes")
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
    ap.add_argument("--warm", type=int, default=-1, metavar="N",
                    help="processes that compile every problem's Triton and torch.compile "
                         "variants before the timed sweep, on one GPU (analysis/bench/warm.py; "
                         "default -1: 3/4 of the CPUs, at most 12, and none on the CPU or with "
                         "several workers; 0: none)")
    ap.add_argument("--tail", action="store_true",
                    help="after the sweep: seed 002's benchmark, the launch costs and the GPT-2 "
                         "check (TAIL_STEPS, each in a process of its own; their first calls "
                         "warmed with the rest), as `make bench` runs the book and full grids")
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
            ap.error(f"{args.out} already holds {', '.join(held)} rows: give a new --out "
                     f"(tools/append_run.py adds its rows here after), or --resume to continue "
                     f"a stopped run")
        if (args.out / ".parts").exists():
            ap.error(f"{args.out} holds a stopped multi-worker bench (.parts): --resume continues it")
    if torch.device(args.device).type == "cpu":
        from ...kernels._device import interpreting

        if not interpreting():
            ap.error("no CUDA GPU here: the bench times kernels on a GPU (without one, "
                     "'make report' renders the committed reference results); TRITON_INTERPRET=1 "
                     "sweeps on the CPU through the interpreter, a check of the pipeline")
    if args.workers is None:
        cuda = torch.device(args.device).type == "cuda" and torch.device(args.device).index is None
        args.workers = torch.cuda.device_count() if cuda else 1
    if args.workers > 1 and torch.device(args.device).index is not None:
        ap.error("--workers > 1 spreads over the visible GPUs: give --device cuda, not one GPU")
    if torch.device(args.device).type == "cuda" and args.workers > torch.cuda.device_count():
        ap.error(f"--workers {args.workers}: {torch.cuda.device_count()} GPU(s) visible; a worker "
                 "per GPU (two on one GPU would time each other's kernels)")
    given = list(argv if argv is not None else sys.argv[1:])
    if "--grid" not in given:  # the record names the grid, default or not
        given += ["--grid", args.grid]
    args.argv = ["python -m triton_fusion_report.analysis.bench", *given]
    one_gpu = torch.device(args.device).type == "cuda" and args.workers <= 1
    if args.warm < 0:
        from .warm import default_workers

        args.warm = default_workers() if one_gpu else 0
    if args.warm and (torch.device(args.device).type != "cuda" or args.workers > 1):
        ap.error("--warm: on one GPU only (several GPUs' workers compile in parallel already)")
    return args, problems


def main(argv=None) -> int:
    t0 = time.perf_counter()
    args, problems = parse(argv)
    for line in missing(problems, args.tail):  # before the start: the rows it will lack
        print(line, flush=True)
    held = lock(args.out)
    tail = []
    try:
        if args.tail:  # a resumed bench: the steps a cut call left undone
            tail = start_tail(args.out, done(args.out) if args.resume else ())
        if args.workers > 1:
            from . import workers  # multiprocessing: only where several workers run

            paths = workers.run(args, problems)
        else:
            if args.warm > 0:
                from . import warm

                if warm.already_warm(args, problems, args.tail):
                    print("compile caches warm: a compile pass of this bench ran to its end "
                          "into them (analysis/bench/warm.py); none now", flush=True)
                else:
                    took, longest = warm.run(args, problems, args.warm, tail=args.tail)
                    print(f"warmed the compile caches in {took:.0f} s ({args.warm} processes; "
                          f"{longest})", flush=True)
            paths = measure(args, problems, args.out, torch.device(args.device))
        for family, path in paths.items():
            print(summary.table(schema.read(path)))
            print(f"-> {path}")
        print(f"bench: sweep {time.perf_counter() - t0:.0f} s", flush=True)
        return run_tail(tail, args.out) if tail else 0
    finally:
        for _, proc in tail:  # those not run (the sweep failed): told to exit
            if proc.returncode is None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        os.close(held)


# A tail step's process: it imports its module (and what the module's `preload` names) at once,
# then waits for "go" on its stdin before its main touches the GPU; anything else: it exits, 2.
# While it waits, Ctrl-C is the bench's to handle (which then closes its stdin).
_WAITING_STEP = ("import importlib, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                 "step = importlib.import_module(sys.argv[1]); "
                 "getattr(step, 'preload', lambda: None)(); "
                 "go = sys.stdin.readline() == 'go\\n'; "
                 "signal.signal(signal.SIGINT, signal.default_int_handler); "
                 "sys.exit(step.main(sys.argv[2:]) if go else 2)")


def start_tail(out: Path, skip=()) -> list[tuple[str, subprocess.Popen]]:
    """The TAIL_STEPS' processes (but those in `skip`), started before the sweep so that their
    imports (seconds each on a machine just started) are done by the time they run; each waits
    for run_tail."""
    return [(step, subprocess.Popen([sys.executable, "-c", _WAITING_STEP,
                                     f"{__package__}.{step}", *step_argv(out, step)],
                                    stdin=subprocess.PIPE, text=True))
            for step, _ in TAIL_STEPS if step not in skip]


def run_tail(tail: list[tuple[str, subprocess.Popen]], out: Path | None = None) -> int:
    """Each started step in turn, its wall time printed; a failing step does not stop the others.
    0 if all succeeded. Each step that succeeded is marked done in `out` (steps.done)."""
    failed = []
    for step, proc in tail:
        t0 = time.perf_counter()
        for tell in (lambda: proc.stdin.write("go\n"), proc.stdin.close):
            with contextlib.suppress(OSError):  # BrokenPipeError: it died before (its import)
                tell()
        code = proc.wait()
        print(f"bench: {step} {time.perf_counter() - t0:.0f} s" + (" FAILED" if code else ""),
              flush=True)
        if code:
            failed.append(step)
        elif out is not None:
            mark_done(out, step)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
