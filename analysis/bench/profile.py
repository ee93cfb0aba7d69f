"""`python -m triton_fusion_report.analysis.bench.profile --out DIR`: the bytes each implementation moves
through DRAM, read from the GPU's counters by Nsight Compute, against the traffic model.

For each family, one large configuration (CASES) and the implementations the book reads there
(DRAM_IMPLS; `--all-impls`: every one the sweep times on it): one `ncu` process per configuration
runs a worker (this module, `--worker`) that calls each implementation to compile and warm up,
then once more inside the profiled window, with a
tiny marker kernel before each, so that every profiled kernel is attributed to the implementation
whose call launched it. ncu flushes the caches before each kernel it profiles (its default cache
control), so a kernel's bytes are those of a cold call, as in the model. Metrics:
dram__bytes_read.sum and dram__bytes_write.sum, in bytes (--print-units base).

DIR/profile.parquet: one row per profiled kernel (family, op, impl, kernel name, bytes read and
written) with the model's bytes for that implementation and for the fused op; `summary` adds
them up per implementation.

`--details` profiles the cases of the families whose work is a matmul (DETAIL_FAMILIES) once
more, through ncu's details page (DETAIL_SECTIONS: speed of light, compute workload, launch
statistics, occupancy, warp states), into DIR/profile_details.parquet: one row per kernel with
its duration, SM and issue-slot throughput, registers, occupancy and shared memory, what says
why a kernel stops short of the tensor cores' limit; ours and the "fastest other" the book pairs
with it: where DIR holds the sweep's rows at the case's configuration (`make reference` sweeps
first), the fastest of them (`sweep_pair`), else every implementation that can be it (all but
DETAIL_SKIP).

`--both` runs the two passes in turn. A case past CASE_TIMEOUT_S is killed and recorded as failed;
`--budget S` bounds the whole (`make profile`: PROFILE_BUDGET, 240 s): a case the budget cuts or
leaves no time for is recorded as `skipped`, not dropped, and `--resume` profiles only the cases
that the files do not hold in full at this commit (what `make reference` runs again after a
device call's end).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

# What the counters say against the model, per implementation: read by the book too (pandas only).
from ..model.counters import NOT_RIVALS, details_summary, summary
# A row's time as the book's verdict compares it (the details pass profiles its fastest other).
from ..schema import device_time
# The ncu CSV readers (tests and notebooks use them from here too).
from .ncu import (DETAIL_LABELS, DETAIL_METRICS, MARKER, attribute, detail_view,  # noqa: F401
                  ncu_details, parse_ncu_csv)

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
# One case under ncu, warm-up included, at most this long (the others took 30-90 s on an H100).
CASE_TIMEOUT_S = 240
# The implementations the book reads from profile.parquet: the unfused over the fused version's
# bytes (the across-families chapter's counter table) and eager's backward against ours (the
# reductions chapter). Only ours and eager: no compile, no peer library's tuning under ncu.
DRAM_IMPLS = ("torch_eager", "triton_unfused", "triton_fused")
# Never the "fastest other" the book pairs with our fused kernel (counters.NOT_RIVALS): left out
# of the details pass.
DETAIL_SKIP = tuple(i for i in NOT_RIVALS if i != "triton_fused")
# (family, op, dtype, shape columns): the configuration profiled per family, large enough that
# every kernel's traffic dwarfs what the caches and the launch add.
CASES = [
    ("elementwise", "add_mul", "float32", dict(n=2**26, z_kind="tensor")),
    ("softmax", "softmax", "float32", dict(rows=4096, width=16384)),
    ("softmax", "softmax_bwd", "float32", dict(rows=4096, width=16384)),
    ("layernorm", "layer_norm_fwd", "float16", dict(rows=4096, width=8192)),
    ("layernorm", "layer_norm_bwd", "float16", dict(rows=4096, width=8192)),
    ("softmax_matmul", "softmax_matmul", "float16", dict(d2=8192)),
    ("attention", "attention_fwd", "float16", dict(seq=4096, head_dim=128, causal=False)),
    ("matmul_softmax", "matmul_softmax", "float16", dict(m=16384, k=4096, n=4096)),
    ("linear_act", "linear_gelu", "float16", dict(m=4096, k=4096, n=4096)),
]


def find_problem(case):
    """The sweep's problem of a CASES entry (its full grid)."""
    from .families import PROBLEMS
    from .sweep import dtype_name

    family, op, dtype, shape = case
    hits = [p for p in PROBLEMS[family]("full") if p.op == op and dtype_name(p.dtype) == dtype
            and all(p.shape.get(k) == v for k, v in shape.items())]
    if not hits:
        raise ValueError(f"no problem in the {family} grid matches {op} {dtype} {shape}")
    return hits[0]


def sweep_pair(out: Path | None, case, commit: str | None = None) -> tuple[str, str] | None:
    """Ours and the fastest other implementation at a CASES entry's configuration by the sweep's
    rows in `out` at `commit` (where given): the size sweep's ok rows, each implementation's
    fastest device time (the verdict's yardstick, book/verdict.py), among the rivals the counter
    table pairs with ours (not NOT_RIVALS: unlike the verdict, never our unfused version); None
    where `out` holds no such rows of both."""
    family, op, dtype, _ = case
    path = None if out is None else Path(out) / f"{family}.parquet"
    if path is None or not path.exists():
        return None
    shape = find_problem(case).shape
    rows = pd.read_parquet(path)
    if not {"op", "dtype", "sweep", "status", "impl", "ms_median", *shape} <= set(rows.columns):
        return None
    at = (rows["op"] == op) & (rows["dtype"] == dtype) & (rows["sweep"] == "size") \
        & (rows["status"] == "ok")
    if commit is not None and "git_commit" in rows:
        at &= rows["git_commit"] == commit
    for column, value in shape.items():
        at &= rows[column] == value
    rows = rows[at].assign(_t=device_time(rows[at])).dropna(subset=["_t"])
    ms = rows.groupby("impl")["_t"].min()
    others = ms.drop([i for i in NOT_RIVALS if i in ms.index])
    if "triton_fused" not in ms.index or others.empty:
        return None
    return "triton_fused", str(others.idxmin())


def profiled_variants(problem, impls=None, skip=()):
    """The implementations at their default settings (the size sweep), one per impl: those in
    `impls` (None: all) but those in `skip`."""
    seen, out = set(), []
    for v in problem.variants:
        if (v.sweep == "size" and v.impl not in seen and (impls is None or v.impl in impls)
                and v.impl not in skip):
            seen.add(v.impl)
            out.append(v)
    return out


DETAIL_SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "LaunchStats", "Occupancy",
                   "WarpStateStats")
DETAIL_FAMILIES = ("softmax_matmul", "attention", "matmul_softmax", "linear_act")


# --- the worker (runs under ncu) --------------------------------------------------------------


def _marker_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def profile_marker(x_ptr):
        tl.store(x_ptr, tl.load(x_ptr) + 1)
    return profile_marker


def worker(case_index: int, order_file: Path, impls=None, skip=()) -> None:
    import torch

    problem = find_problem(CASES[case_index])
    device = torch.device("cuda")
    inputs = problem.make_inputs(device)
    marker, flag = _marker_kernel(), torch.zeros(1, device=device)
    marker[(1,)](flag)
    ready, failed = profiled_variants(problem, impls, skip), {}
    # Where a variant has its kernels callable directly (graph_fn: the LayerNorm backward's, what
    # its device time replays), they are profiled so, on this thread: through autograd.grad the
    # backward runs on the autograd engine's device thread, the one profiled case that did, and
    # the case that stalled under ncu (2026-11-28).
    call = {v.impl: v.graph_fn or v.fn for v in ready}
    # Two rounds of warm-up (compile, autotune, build what the profiled calls reuse; the second
    # round catches anything that a first call left to the next one).
    for _ in range(2):
        for v in list(ready):
            print(f"profile worker: warming {v.impl}", file=sys.stderr, flush=True)
            try:
                call[v.impl](*inputs)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - recorded, not profiled
                failed[v.impl] = f"{type(exc).__name__}: {exc}"[:500]
                ready.remove(v)
                torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for v in ready:
        print(f"profile worker: profiling {v.impl}", file=sys.stderr, flush=True)
        marker[(1,)](flag)
        call[v.impl](*inputs)
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    order_file.write_text(json.dumps(dict(
        order=[v.impl for v in ready], failed=failed,
        variants={v.impl: v.variant for v in ready},
        bytes_impl={v.impl: v.bytes_impl for v in problem.variants if v.sweep == "size"})))


# --- the driver ------------------------------------------------------------------------------


def _ncu_run(case_index: int, ncu: str, raw: Path, ncu_args: list, tag: str,
             timeout: float | None = None, worker_args: tuple = ()):
    """Run the worker of CASES[case_index] under ncu with ncu_args (the worker's own options in
    worker_args), at most `timeout` seconds (default CASE_TIMEOUT_S): (what the worker wrote,
    ncu's log text), or (None, why it failed)."""
    timeout = CASE_TIMEOUT_S if timeout is None else timeout
    order_file, log = raw / f"order_{tag}{case_index}.json", raw / f"ncu_{tag}{case_index}.csv"
    cmd = [ncu, "--csv", "--profile-from-start", "off", *ncu_args, "--log-file", str(log),
           sys.executable, "-m", "triton_fusion_report.analysis.bench.profile", "--worker",
           str(case_index), "--order", str(order_file), *worker_args]
    # A session of its own, so that a case past CASE_TIMEOUT_S is killed with its worker and the
    # next case still runs (its row then says what the worker was doing).
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        return None, f"ncu ran past {timeout:.0f} s, killed; " + (err or out)[-1400:]
    except BaseException:  # Ctrl-C included: its own session does not get the terminal's
        _kill_group(proc)
        proc.wait()
        raise
    if proc.returncode != 0 or not order_file.exists() or not log.exists():
        return None, (err or out)[-1500:]
    return json.loads(order_file.read_text()), log.read_text()


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # ended meanwhile
        pass


def _case_base(case_index: int, meta: dict) -> dict:
    case = CASES[case_index]
    problem = find_problem(case)
    return dict(meta, family=case[0], op=case[1], dtype=case[2], shape=json.dumps(problem.shape),
                bytes_model=problem.bytes_model)


def _cut(base: dict, text: str, timeout: float | None) -> list[dict]:
    """The row of a case that produced nothing: `skipped` where the budget's shorter timeout cut
    it, else failed (its own stall, or ncu's error)."""
    cut = timeout is not None and timeout < CASE_TIMEOUT_S and text.startswith("ncu ran past")
    return [dict(base, impl=None, status="skipped" if cut else "failed",
                 error=("cut at the profile's budget: " if cut else "") + text)]


def profile_case(case_index: int, ncu: str, raw: Path, meta: dict, timeout: float | None = None,
                 all_impls: bool = False) -> list[dict]:
    base = _case_base(case_index, meta)
    info, text = _ncu_run(case_index, ncu, raw,
                          ["--print-units", "base", "--metrics", ",".join(METRICS)], "", timeout,
                          () if all_impls else ("--impls", ",".join(DRAM_IMPLS)))
    if info is None:
        return _cut(base, text, timeout)
    try:
        kernels = attribute(parse_ncu_csv(text), info["order"])
    except ValueError as exc:  # no table, or kernels the markers cannot attribute
        return [dict(base, impl=None, status="failed", error=f"ncu's log: {exc}")]
    rows = [dict(base, impl=r["impl"], variant=info["variants"].get(r["impl"]),
                 kernel=r["kernel"], kernel_index=int(r["id"]), dram_read=r[METRICS[0]],
                 dram_write=r[METRICS[1]], bytes_model_impl=info["bytes_impl"].get(r["impl"]),
                 status="ok")
            for r in kernels.to_dict("records")]
    rows += [dict(base, impl=impl, status="failed", error=why)
             for impl, why in info["failed"].items()]
    return rows


def details_case(case_index: int, ncu: str, raw: Path, meta: dict, timeout: float | None = None,
                 all_impls: bool = False, out: Path | None = None) -> list[dict]:
    """CASES[case_index] through ncu's details page: one row per kernel, the DETAIL_METRICS; ours
    and the fastest other where `out` holds the sweep's rows of the case (sweep_pair), else every
    possible rival."""
    base = _case_base(case_index, meta)
    sections = [a for name in DETAIL_SECTIONS for a in ("--section", name)]
    pair = None if all_impls else sweep_pair(out, CASES[case_index], meta.get("git_commit"))
    worker_args = () if all_impls else ("--impls", ",".join(pair)) if pair else \
        ("--skip", ",".join(DETAIL_SKIP))
    info, text = _ncu_run(case_index, ncu, raw,
                          ["--print-units", "base", *sections, "--page", "details"], "details_",
                          timeout, worker_args)
    if info is None:
        return _cut(base, text, timeout)
    try:
        return details_rows(base, ncu_details(text), info)
    except ValueError as exc:  # no table, or kernels the markers cannot attribute
        return [dict(base, impl=None, status="failed", error=f"ncu's log: {exc}")]


def details_rows(base: dict, details: pd.DataFrame, info: dict) -> list[dict]:
    """ncu_details' kernels attributed to the implementations the worker ran (info: its order
    file), each a row with `base`; the implementations that failed as rows of their own."""
    kernels = attribute(details, info["order"])
    metrics = [c for c in DETAIL_METRICS.values() if c in kernels]
    rows = [dict(base, impl=r["impl"], variant=info["variants"].get(r["impl"]),
                 kernel=r["kernel"], kernel_index=int(r["id"]), status="ok",
                 **{m: r[m] for m in metrics})
            for r in kernels.to_dict("records")]
    rows += [dict(base, impl=impl, status="failed", error=why)
             for impl, why in info["failed"].items()]
    return rows


def kept_rows(path: Path, cases: list[int]) -> list[dict]:
    """The rows of an existing profile file whose case is not among `cases` (CASES indices): with
    --case the file gathers case by case, so a pass split over several calls loses nothing."""
    if not path.exists():
        return []
    old = pd.read_parquet(path)
    redone = {(CASES[i][0], CASES[i][1], CASES[i][2]) for i in cases}
    keep = [(f, o, d) not in redone for f, o, d in zip(old["family"], old["op"], old["dtype"])]
    return old[keep].to_dict("records")


def _case_key(i: int) -> tuple:
    return CASES[i][0], CASES[i][1], CASES[i][2]


def done_cases(path: Path, cases: list[int], commit: str) -> set[int]:
    """The cases (CASES indices) that an existing profile file holds in full at `commit`: rows of
    that commit, at least one profiled kernel, none skipped and no case-level failure (a failed
    implementation within a profiled case is a result, kept)."""
    if not path.exists():
        return set()
    old = pd.read_parquet(path)
    done = set()
    for i in cases:
        f, o, d = _case_key(i)
        rows = old[(old["family"] == f) & (old["op"] == o) & (old["dtype"] == d)]
        whole = rows["impl"].isna() if "impl" in rows else pd.Series(True, index=rows.index)
        if "git_commit" not in rows or "status" not in rows:  # a file from before either
            continue
        if (len(rows) and (rows["git_commit"] == commit).all() and (rows["status"] == "ok").any()
                and not (rows["status"] == "skipped").any()
                and not ((rows["status"] == "failed") & whole).any()):
            done.add(i)
    return done


def run_pass(run_case, path: Path, cases: list[int], ncu: str, raw: Path, meta: dict,
             deadline: float | None = None, resume: bool = False, keep_others: bool = False,
             all_impls: bool = False, ran: list | None = None) -> list[dict]:
    """One pass (profile_case or details_case) over `cases` into `path`, written after each case.
    resume: the cases the file already holds in full at this commit are kept, not run again;
    keep_others (--case): the file's rows of other cases are kept. A case starts only before
    `deadline` (time.monotonic()) and runs until it at most; the others are `skipped` rows. The
    first case a command runs (`ran`: the cases run before, over the passes) is never skipped
    for the budget: cut, it failed, so that a case that stalls ends as failed, not resumed by
    every later command in turn."""
    ran = [] if ran is None else ran
    done = done_cases(path, cases, meta.get("git_commit")) if resume else set()
    redo = {_case_key(i) for i in cases if i not in done}
    rows = [r for r in kept_rows(path, []) if (r["family"], r["op"], r["dtype"]) not in redo] \
        if (resume or keep_others) else []
    for i in cases:
        if i in done:
            print(f"{CASES[i][0]} {CASES[i][1]}: in {path.name} already", flush=True)
            continue
        t0 = time.monotonic()
        left = None if deadline is None else deadline - t0
        if left is not None and left <= 0:
            rows.append(dict(_case_base(i, meta), impl=None, status="skipped",
                             error="the profile's budget was spent before this case (the same "
                                   "command with --resume profiles it)"))
        else:
            new = run_case(i, ncu, raw, meta, timeout=None if left is None
                           else min(CASE_TIMEOUT_S, left), all_impls=all_impls)
            if not ran:
                new = [dict(r, status="failed") if r["status"] == "skipped" else r for r in new]
            ran.append(i)
            rows += new
        print(f"{CASES[i][0]} {CASES[i][1]}: {rows[-1]['status']} in "
              f"{time.monotonic() - t0:.0f} s, {sum(r['status'] == 'ok' for r in rows)} "
              "kernels so far", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_parquet(path, index=False)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m triton_fusion_report.analysis.bench.profile",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="results folder: profile.parquet goes there")
    ap.add_argument("--case", type=int, action="append",
                    help="CASES index (default: all); the other cases' rows already in the "
                         "output file are kept")
    ap.add_argument("--raw", type=Path, help="keep ncu's CSV logs here (default: discarded)")
    ap.add_argument("--ncu", default=os.environ.get("NCU", "ncu"))
    ap.add_argument("--details", action="store_true",
                    help="the matmul families' cases through ncu's details page, into "
                         "profile_details.parquet (instead of the DRAM bytes)")
    ap.add_argument("--both", action="store_true",
                    help="the DRAM bytes, then the details page, under one --budget")
    ap.add_argument("--budget", type=float, metavar="S",
                    help="seconds for the whole (default: none): a case is cut at its end, the "
                         "cases after it recorded as skipped")
    ap.add_argument("--resume", action="store_true",
                    help="profile only the cases the output files do not hold in full at this "
                         "commit (failed, skipped or missing ones)")
    ap.add_argument("--all-impls", action="store_true",
                    help="every implementation the sweep times on a case, not only those the "
                         "book reads")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--order", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--impls", help=argparse.SUPPRESS)
    ap.add_argument("--skip", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args.order, args.impls.split(",") if args.impls else None,
               tuple(args.skip.split(",")) if args.skip else ())
        return 0
    if args.out is None:
        ap.error("--out is required")
    ncu = shutil.which(args.ncu)
    if ncu is None:
        ap.error(f"Nsight Compute ({args.ncu}) is not on the PATH: `make profile` needs it "
                 "(and a GPU whose counters it may read)")
    import torch

    from . import machine

    t0 = time.monotonic()
    deadline = None if args.budget is None else t0 + args.budget
    meta = machine.run_metadata(torch.device("cuda"))
    meta = {k: meta[k] for k in ("run_id", "started_at", "git_commit", "gpu", "torch", "triton")}
    raw = args.raw or Path(tempfile.mkdtemp(prefix="ncu_"))
    raw.mkdir(parents=True, exist_ok=True)
    passes = ([(profile_case, "profile.parquet", False)] if not args.details or args.both else []) \
        + ([(functools.partial(details_case, out=args.out), "profile_details.parquet", True)]
           if args.details or args.both else [])
    ran = []
    for run_case, name, details in passes:
        cases = args.case or [i for i, c in enumerate(CASES)
                              if not details or c[0] in DETAIL_FAMILIES]
        rows = run_pass(run_case, args.out / name, cases, ncu, raw, meta, deadline, args.resume,
                        keep_others=bool(args.case), all_impls=args.all_impls, ran=ran)
        with pd.option_context("display.width", 200):
            table = pd.DataFrame(rows)
            print(details_summary(table).round(1).to_string() if details
                  else summary(table).round(3).to_string())
    if args.raw is None:
        shutil.rmtree(raw, ignore_errors=True)
    print(f"profile: {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
