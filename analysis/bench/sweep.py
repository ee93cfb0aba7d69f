"""The sweep runner: check every implementation against float64, time it, write a row.

A family group (analysis/bench/<group>.py) describes its grid as `Problem`s: one set of inputs (shape, dtype)
and the `Variant`s to measure on it (impl, block, num_warps). For each variant the runner
1. runs it once with outputs poisoned (NaN) and compares with the float64 reference computed from
   the very same inputs: a mismatch is a `wrong_result` row, never timed;
2. times it (bench.timing.bench) and measures its peak memory;
3. appends the row to the family's Parquet file at once.
Failures (OOM, out of resources, compile errors, refused inputs) become rows with a status and the
error text, the GPU memory is freed, and the sweep goes on.
"""
from __future__ import annotations

import collections
import dataclasses
import gc
import math
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ...kernels import poisoned_outputs

from .. import schema
from ..sources import kernel_hash
from .timing import bench, device_ms, peak_mib

# Timed rounds per configuration (each its own warm-up and fresh inputs).
TRIALS = 3


@dataclass
class Variant:
    impl: str
    fn: Callable
    block: int | None = None
    num_warps: int | None = None
    bytes_impl: float | None = None
    sweep: str = "size"
    variant: str | None = None  # which kernel/path of the impl, where it has several
    # A variant that computes something else than the problem (e.g. the matmul alone, to show
    # what the epilogue costs) is checked against its own float64 reference.
    reference: Callable | None = None
    # What ms_device replays where fn cannot be captured: the same kernels called directly (the
    # autograd engine runs a backward on another thread, outside the capture). Checked against
    # the reference like fn.
    graph_fn: Callable | None = None


@dataclass
class Problem:
    family: str
    op: str
    dtype: torch.dtype
    precision: str
    shape: dict  # the family's shape columns
    make_inputs: Callable  # (device) -> tuple of inputs
    reference: Callable  # called on the float64 inputs
    bytes_model: float
    flops_model: float
    tolerance: float
    variants: list[Variant] = field(default_factory=list)
    # Also time the GPU alone (ms_device: CUDA-graph replay, L2 flushed before each call). Off only
    # where a variant can be captured neither as fn nor as a graph_fn: a capture that fails
    # (autograd, host syncs) can leave the CUDA RNG in capture state and break what follows.
    graph: bool = True
    # Trials of this problem where its grid gives it more than the grid's own count (None: the
    # grid's; the reference grid times three where the book reads the trials' spread).
    trials: int | None = None


# torch.compile's strongest setting for a kernel's own speed: Triton templates autotuned for every
# matmul and more configs tried for the rest. Without CUDA graphs, so that its rows compare
# kernels as every other row does (the per-call section measures the host side).
MAX_AUTOTUNE = "max-autotune-no-cudagraphs"


class Compiled:
    """`torch.compile(fn, dynamic=False, mode=mode)`, compiled at the first call (inside the
    runner's measured try-block, so a compile failure becomes a row). The runner resets Dynamo
    before each problem (not here: a reset drops the graphs of the problem's other compiled
    variants, which would then compile again), so no problem inherits another problem's graphs or
    hits the recompile limit and silently falls back to eager."""

    def __init__(self, fn: Callable, mode: str | None = None):
        self.source, self.mode, self.fn = fn, mode, None

    def __call__(self, *args):
        if self.fn is None:
            self.fn = torch.compile(self.source, dynamic=False, mode=self.mode)
        return self.fn(*args)


def compiled_variants(fn: Callable, bytes_impl=None, wrap=lambda f: f, **kw) -> list[Variant]:
    """`torch_compile` (default mode) and `torch_compile_max` (MAX_AUTOTUNE) of the same function;
    `wrap` takes the compiled callable (a TF32 switch, a backward driver)."""
    return [Variant("torch_compile", wrap(Compiled(fn)), bytes_impl=bytes_impl, **kw),
            Variant("torch_compile_max", wrap(Compiled(fn, MAX_AUTOTUNE)), variant=MAX_AUTOTUNE,
                    bytes_impl=bytes_impl, **kw)]


def fwd_bwd(forward):
    """(*inputs, dy) -> the inputs' gradients: the forward on every input but the last, then its
    backward through autograd with dy, as a training step runs them."""
    def call(*args):
        leaves = [t.detach().requires_grad_() for t in args[:-1]]
        return torch.autograd.grad(forward(*leaves), leaves, args[-1])
    return call


def tf32(fn, enabled: bool):
    """Run fn with PyTorch's TF32 matmul switch set (and restored): precision parity."""
    def call(*args):
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = enabled
        try:
            return fn(*args)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
    return call


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def to_float64(inputs):
    return tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for a in inputs)


def max_rel_err(out, ref) -> float:
    """max |out - ref| / max |ref| in float64 (the worst over a tuple of outputs); inf where out is
    not finite but ref is, or the shapes differ."""
    if isinstance(ref, (tuple, list)):
        if not isinstance(out, (tuple, list)) or len(out) != len(ref):
            return math.inf
        return max(max_rel_err(o, r) for o, r in zip(out, ref))
    out64 = out.double()
    if out64.shape != ref.shape:
        return math.inf
    if not torch.equal(torch.isfinite(out64), torch.isfinite(ref)):
        return math.inf
    finite = torch.isfinite(ref)
    scale = ref[finite].abs().max().item() if finite.any() else 1.0
    err = (out64[finite] - ref[finite]).abs().max().item() if finite.any() else 0.0
    return err / (scale or 1.0)


def classify(exc: BaseException) -> str:
    name = type(exc).__name__
    text = str(exc).lower()
    if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in text:
        return "oom"
    if name == "OutOfResources" or "out of resource" in text:
        return "out_of_resources"
    if "no available kernel" in text:  # an SDPA backend that does not take this shape/dtype
        return "unsupported"
    if "exceeds the recommended triton blocksize" in text:  # Liger's softmax past 65536 columns
        return "unsupported"
    if isinstance(exc, (ValueError, TypeError, NotImplementedError)):
        return "unsupported"
    return "compile_error"  # the first call compiles: anything else broke there


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _failure_row(base: dict, exc: BaseException) -> dict:
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return dict(base, status=classify(exc), error=last[:2000])


def _base(problem: Problem, variant: Variant) -> dict:
    return dict(
        family=problem.family, op=problem.op, impl=variant.impl, dtype=dtype_name(problem.dtype),
        precision=problem.precision, sweep=variant.sweep, variant=variant.variant,
        block=variant.block, num_warps=variant.num_warps, bytes_model=problem.bytes_model,
        bytes_impl=variant.bytes_impl, flops_model=problem.flops_model, **problem.shape,
    )


def check(problem: Problem, variant: Variant, inputs, ref, device) -> dict | float:
    """Run the variant once with its outputs poisoned and compare with the float64 reference:
    the error if within the tolerance, else the row that says why not (a failure or
    `wrong_result`)."""
    base = _base(problem, variant)
    try:
        with poisoned_outputs():
            out = variant.fn(*inputs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if variant.reference is not None:
            ref = variant.reference(*to_float64(inputs))
        err = max_rel_err(out, ref)
        if problem.graph and variant.graph_fn is not None:
            with poisoned_outputs():
                out = variant.graph_fn(*inputs)
            err = max(err, max_rel_err(out, ref))
        del out, ref
    except Exception as exc:  # noqa: BLE001 - every failure becomes a row
        _release(device)
        return _failure_row(base, exc)
    if not err <= problem.tolerance:
        return dict(base, status="wrong_result", max_rel_err=err,
                    error=f"max_rel_err {err:.3g} > tolerance {problem.tolerance:.3g}")
    return err


def finish_row(problem: Problem, variant: Variant, err: float, trials: list[dict],
               peak: float | None, ms_dev: float | None, limits: dict) -> dict:
    """The row of a variant timed in `trials` (each `timing.bench`'s summary and samples): the
    median of the trial medians, the lowest and highest trial median, the samples' mean, std and
    minimum, and the rates derived from the median."""
    medians = [t["ms_median"] for t in trials]
    samples = [x for t in trials for x in t["times"]]
    ms = statistics.median(medians)
    row = dict(_base(problem, variant), status="ok", max_rel_err=err, peak_mib=peak,
               ms_median=ms, ms_trial_min=min(medians), ms_trial_max=max(medians),
               n_trials=len(trials), ms_mean=statistics.fmean(samples),
               ms_std=statistics.stdev(samples) if len(samples) > 1 else 0.0,
               ms_min=min(samples), n_reps=len(samples), ms_device=ms_dev)
    row["gbps"] = problem.bytes_model / ms / 1e6
    row["tflops"] = problem.flops_model / ms / 1e9
    copy_bw = limits.get(("copy_bw", "ieee"))
    peak_key = schema.PEAK_PRECISION.get(problem.precision, problem.precision)
    peak_tf = limits.get(("matmul_peak", peak_key))
    row["pct_copy_bw"] = 100 * row["gbps"] / copy_bw if copy_bw else None
    row["pct_matmul_peak"] = 100 * row["tflops"] / peak_tf if peak_tf else None
    return row


def measure(problem: Problem, variant: Variant, inputs, ref, device, limits,
            trials: int = TRIALS) -> dict:
    """One variant alone on given inputs and reference: its row, obtained as the runner obtains
    every row (`_run_problem`), the same inputs in every trial."""
    alone = dataclasses.replace(problem, variants=[variant], make_inputs=lambda _: inputs,
                                reference=lambda *_: ref)
    return next(_run_problem(alone, device, limits, trials))


def limits_lookup(limit_rows: list[dict]) -> dict:
    return {(r["metric"], r["precision"]): r["value"] for r in limit_rows if r["value"]}


def _identity(row: dict, shape_keys) -> tuple:
    """What tells a configuration's row from the others of its run."""
    return (row["family"], row["op"], row["impl"], row["dtype"], row["precision"], row["sweep"],
            row["variant"], row["block"], row["num_warps"], *(row[k] for k in shape_keys))


def remaining(problems, out_dir: Path, run_id) -> list:
    """The problems whose rows of run `run_id` (or of any run in a set of ids: the runs of one
    bench that several workers or commands share) in out_dir are not all there yet: a resumed
    run's work. A problem written in part (the run was stopped between its rows) loses those rows
    and runs again, so that no configuration is measured twice."""
    run_ids = {run_id} if isinstance(run_id, str) else set(run_id)
    files: dict[str, schema.ParquetSink] = {}
    changed = set()
    todo = []
    for problem in problems:
        if problem.family not in files:
            files[problem.family] = schema.ParquetSink(
                Path(out_dir) / f"{problem.family}.parquet", schema.family_schema(problem.family),
                keep_existing=True)
        rows = files[problem.family].rows
        keys = list(problem.shape)
        wanted = collections.Counter(_identity(_base(problem, v), keys) for v in problem.variants)
        mine = [i for i, r in enumerate(rows)
                if r["run_id"] in run_ids and _identity(r, keys) in wanted]
        have = collections.Counter(_identity(rows[i], keys) for i in mine)
        if have == wanted and len({rows[i]["run_id"] for i in mine}) == 1:
            continue
        if mine:
            drop = set(mine)
            files[problem.family].rows = [r for i, r in enumerate(rows) if i not in drop]
            changed.add(problem.family)
        todo.append(problem)
    for family in changed:
        files[family].flush()
    return todo


def run(problems, out_dir: Path, device: torch.device, meta: dict, limit_rows: list[dict],
        progress: bool = True, trials: int = TRIALS, on_row=None,
        keep_existing: bool = False, timing: dict | None = None) -> dict[str, Path]:
    """Every problem in turn: its variants checked against float64, then timed in `trials` rounds
    (the problem's own `trials` where it has one),
    each round on fresh random inputs, every variant once per round (the order rotated), so that
    a slow drift of the GPU (clocks, temperature) spreads over all of them rather than falling on
    one. A variant's row is written once its trials are done; failures at once. `problems` may be
    an iterator (a worker's share, taken from a queue); `on_row()` is called after each row.
    keep_existing: add to the family files' rows (a resumed run) instead of starting them.
    timing: the protocol's knobs other than the defaults (bench's warmup_ms, rep_ms, min_reps;
    device_ms's per_graph_ms)."""
    limits = limits_lookup(limit_rows)
    sinks: dict[str, schema.ParquetSink] = {}
    hashes: dict[str, str] = {}  # family -> kernel hash, once per run
    bar = None
    if progress:
        problems = list(problems)
        total = sum(len(p.variants) for p in problems)
        from tqdm import tqdm

        bar = tqdm(total=total, unit="cfg", dynamic_ncols=True,
                   mininterval=2 if sys.stderr.isatty() else 20)
    for problem in problems:
        sink = sinks.get(problem.family)
        if sink is None:
            sink = sinks[problem.family] = schema.ParquetSink(
                Path(out_dir) / f"{problem.family}.parquet", schema.family_schema(problem.family),
                keep_existing=keep_existing)
        if bar is not None:
            bar.set_description(f"{problem.op} {problem.shape}"[:60])
        for row in _run_problem(problem, device, limits, problem.trials or trials, timing):
            if row["impl"].startswith("triton"):
                if problem.family not in hashes:
                    hashes[problem.family] = kernel_hash(problem.family)
                row["kernel_hash"] = hashes[problem.family]
            sink.append(dict(meta, **row))
            if bar is not None:
                bar.update()
            if on_row is not None:
                on_row()
        _release(device)
    if bar is not None:
        bar.close()
    return {family: sink.path for family, sink in sinks.items()}


def _run_problem(problem: Problem, device, limits: dict, trials: int, timing: dict | None = None):
    """Yields the rows of one problem: failures as they happen, the timed rows after the last
    trial."""
    timing = dict(timing or {})
    graph = {"per_graph_ms": timing.pop("per_graph_ms")} if "per_graph_ms" in timing else {}
    torch._dynamo.reset()  # this problem's compiled variants start from nothing (see Compiled)
    try:
        inputs = problem.make_inputs(device)
        ref = problem.reference(*to_float64(inputs))
    except Exception as exc:  # noqa: BLE001 - e.g. the inputs alone do not fit
        _release(device)
        for variant in problem.variants:
            yield dict(_failure_row(_base(problem, variant), exc), wall_s=0.0)
        return
    state = {}  # variant index -> dict(err, trials, peak, ms_device, wall_s)
    for i, variant in enumerate(problem.variants):
        t0 = time.perf_counter()
        err = check(problem, variant, inputs, ref, device)
        if isinstance(err, dict):
            yield dict(err, wall_s=time.perf_counter() - t0)
            continue
        state[i] = dict(err=err, trials=[], peak=None, ms_device=None,
                        wall_s=time.perf_counter() - t0)
    del ref
    for trial in range(trials):
        if trial:  # fresh inputs: no trial times a cache that the one before warmed
            del inputs
            _release(device)
            try:
                inputs = problem.make_inputs(device)
            except Exception as exc:  # noqa: BLE001 - e.g. OOM: rows for the variants left,
                _release(device)      # and the sweep goes on (as when the first inputs fail)
                for i, st in state.items():
                    yield dict(_failure_row(_base(problem, problem.variants[i]), exc),
                               wall_s=st["wall_s"])
                return
        order = list(state)
        order = order[trial % len(order):] + order[:trial % len(order)] if order else order
        for i in order:
            variant, st = problem.variants[i], state[i]
            t0 = time.perf_counter()
            try:
                known = st["trials"][-1].get("estimate_ms") if st["trials"] else None
                st["trials"].append(bench(lambda: variant.fn(*inputs), device,
                                          estimate_ms=known, **timing))
                if trial == 0:
                    st["peak"] = peak_mib(lambda: variant.fn(*inputs), device)
                    if problem.graph:
                        graph_fn = variant.graph_fn or variant.fn
                        st["ms_device"] = device_ms(lambda: graph_fn(*inputs), device,
                                                    estimate_ms=st["trials"][0]["ms_median"],
                                                    **graph)
            except Exception as exc:  # noqa: BLE001
                _release(device)
                del state[i]
                yield dict(_failure_row(_base(problem, variant), exc),
                           wall_s=st["wall_s"] + time.perf_counter() - t0)
                continue
            st["wall_s"] += time.perf_counter() - t0
    del inputs
    for i, st in state.items():
        row = finish_row(problem, problem.variants[i], st["err"], st["trials"], st["peak"],
                         st["ms_device"], limits)
        yield dict(row, wall_s=st["wall_s"])
