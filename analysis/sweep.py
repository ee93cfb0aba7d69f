"""The sweep runner: check every implementation against float64, time it, write a row.

A family (analysis/<family>.py) describes its grid as `Problem`s: one set of inputs (shape, dtype)
and the `Variant`s to measure on it (impl, block, num_warps). For each variant the runner
1. runs it once with outputs poisoned (NaN) and compares with the float64 reference computed from
   the very same inputs: a mismatch is a `wrong_result` row, never timed;
2. times it (analysis.timing.bench) and measures its peak memory;
3. appends the row to the family's Parquet file at once.
Failures (OOM, out of resources, compile errors, refused inputs) become rows with a status and the
error text, the GPU memory is freed, and the sweep goes on.
"""
from __future__ import annotations

import gc
import sys
import math
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..kernels import poisoned_outputs

from . import schema
from .timing import bench, device_ms, peak_mib


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


class Compiled:
    """`torch.compile(fn, dynamic=False)`, compiled at the first call (inside the runner's measured
    try-block, so a compile failure becomes a row), after a Dynamo reset: no problem inherits another
    problem's graphs or hits the recompile limit and silently falls back to eager."""

    def __init__(self, fn: Callable):
        self.source, self.fn = fn, None

    def __call__(self, *args):
        if self.fn is None:
            torch._dynamo.reset()
            self.fn = torch.compile(self.source, dynamic=False)
        return self.fn(*args)


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


def measure(problem: Problem, variant: Variant, inputs, ref, device, limits) -> dict:
    base = dict(
        family=problem.family, op=problem.op, impl=variant.impl, dtype=dtype_name(problem.dtype),
        precision=problem.precision, sweep=variant.sweep, variant=variant.variant,
        block=variant.block,
        num_warps=variant.num_warps, bytes_model=problem.bytes_model, bytes_impl=variant.bytes_impl,
        flops_model=problem.flops_model, **problem.shape,
    )
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
        if not err <= problem.tolerance:
            return dict(base, status="wrong_result", max_rel_err=err,
                        error=f"max_rel_err {err:.3g} > tolerance {problem.tolerance:.3g}")
        timing = bench(lambda: variant.fn(*inputs), device)
        peak = peak_mib(lambda: variant.fn(*inputs), device)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a row
        _release(device)
        return _failure_row(base, exc)
    ms = timing["ms_median"]
    row = dict(base, status="ok", max_rel_err=err, peak_mib=peak, **timing)
    if problem.graph:
        graph_fn = variant.graph_fn or variant.fn
        row["ms_device"] = device_ms(lambda: graph_fn(*inputs), device, estimate_ms=ms)
    row["gbps"] = problem.bytes_model / ms / 1e6
    row["tflops"] = problem.flops_model / ms / 1e9
    copy_bw = limits.get(("copy_bw", "ieee"))
    peak_key = schema.PEAK_PRECISION.get(problem.precision, problem.precision)
    peak_tf = limits.get(("matmul_peak", peak_key))
    row["pct_copy_bw"] = 100 * row["gbps"] / copy_bw if copy_bw else None
    row["pct_matmul_peak"] = 100 * row["tflops"] / peak_tf if peak_tf else None
    return row


def limits_lookup(limit_rows: list[dict]) -> dict:
    return {(r["metric"], r["precision"]): r["value"] for r in limit_rows if r["value"]}


def run(problems: list[Problem], out_dir: Path, device: torch.device, meta: dict,
        limit_rows: list[dict], progress: bool = True) -> dict[str, Path]:
    limits = limits_lookup(limit_rows)
    sinks: dict[str, schema.ParquetSink] = {}
    total = sum(len(p.variants) for p in problems)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="cfg", dynamic_ncols=True, mininterval=2 if sys.stderr.isatty() else 20)
    for problem in problems:
        sink = sinks.get(problem.family)
        if sink is None:
            sink = sinks[problem.family] = schema.ParquetSink(
                Path(out_dir) / f"{problem.family}.parquet", schema.family_schema(problem.family))
        try:
            inputs = problem.make_inputs(device)
            ref = problem.reference(*to_float64(inputs))
        except Exception as exc:  # noqa: BLE001 - e.g. the inputs alone do not fit
            inputs = ref = None
            _release(device)
            setup_error = exc
        else:
            setup_error = None
        for variant in problem.variants:
            if bar is not None:
                bar.set_description(f"{problem.op} {variant.impl} {problem.shape}"[:60])
            if setup_error is not None:
                row = _failure_row(dict(family=problem.family, op=problem.op, impl=variant.impl,
                                        dtype=dtype_name(problem.dtype),
                                        precision=problem.precision, sweep=variant.sweep,
                                        variant=variant.variant,
                                        block=variant.block,
                                        num_warps=variant.num_warps, **problem.shape),
                                   setup_error)
            else:
                row = measure(problem, variant, inputs, ref, device, limits)
            sink.append(dict(meta, **row))
            if bar is not None:
                bar.update()
        del inputs, ref
        _release(device)
    if bar is not None:
        bar.close()
    return {family: sink.path for family, sink in sinks.items()}
