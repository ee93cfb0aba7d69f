"""Timing and peak memory, the way every number in the data is obtained.

On CUDA: `bench` times one trial the way `triton.testing.do_bench` does (the L2 flushed before
every repetition, device events around each call, the first calls discarded as warm-up), keeping
all samples (`times`) with their median, mean, std and min; the sweep calls it once per trial.
Unlike do_bench it stops early once the median has settled: at least MIN_REPS repetitions, then
chunks of about CHUNK_MS until the 95% interval of the median is within SETTLED of it, or REP_MS
of repetitions were run (do_bench's count, where every run would end).
`device_ms` takes the host out: the calls replayed from a CUDA graph, L2 flushed before each,
each timed by events inside the graph. On the CPU (the interpreter smoke run) one wall-clock
call per trial: pipeline checks, not numbers.
"""
from __future__ import annotations

import gc
import math
import statistics
import time

import torch

WARMUP_MS = 10  # per trial, after the calls that estimate the time of one
REP_MS = 40  # per trial at most; the sweep times each configuration in sweep.TRIALS trials
MIN_REPS = 20
CHUNK_MS = 5
SETTLED = 0.005  # the median's 95% interval within +-0.5% of it
CONFIDENCE, Z = 0.95, 1.96  # of that interval
FLUSH_BYTES = 256 * 2**20  # what do_bench writes to flush the L2 (50 MB on an H100)
DEVICE_REPS = (10, 200)  # calls per graph: at least, at most
DEVICE_GRAPH_MS = 20  # aim for about this much GPU work per graph replay

_flush_buffers: dict = {}


def summarize(times_ms: list[float]) -> dict:
    return dict(
        times=list(times_ms),
        ms_median=statistics.median(times_ms),
        ms_mean=statistics.fmean(times_ms),
        ms_std=statistics.stdev(times_ms) if len(times_ms) > 1 else 0.0,
        ms_min=min(times_ms),
        n_reps=len(times_ms),
    )


def median_settled(times_ms: list[float], within: float = SETTLED) -> bool:
    """Whether the distribution-free 95% interval of the median (order statistics n/2 -+
    0.98 sqrt(n)) lies within `within` of the median, relatively."""
    x = sorted(times_ms)
    n = len(x)
    half = Z / 2 * math.sqrt(n)
    lo, hi = max(0, math.floor(n / 2 - half)), min(n - 1, math.ceil(n / 2 + half) - 1)
    med = statistics.median(x)
    return med > 0 and (x[hi] - x[lo]) / 2 <= within * med


def _flush_buffer(device: torch.device) -> torch.Tensor:
    key = torch.cuda.current_device() if device.index is None else device.index
    buf = _flush_buffers.get(key)
    if buf is None:
        buf = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device)
        _flush_buffers[key] = buf
    return buf


def _timed(fn, cache: torch.Tensor, n: int) -> list[float]:
    """n calls, the L2 flushed before each, each between two events: their times in ms."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for start, end in zip(starts, ends):
        cache.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def bench(fn, device: torch.device, warmup_ms: float = WARMUP_MS, rep_ms: float = REP_MS,
          min_reps: int = MIN_REPS, estimate_ms: float | None = None) -> dict:
    """One trial. `estimate_ms`: the time of one call with its flush, known from an earlier
    trial of the same call: the first call and the five that estimate it are then skipped (the
    warm-up still runs)."""
    if device.type != "cuda":  # the interpreter: one wall-clock call (the pipeline's check)
        t0 = time.perf_counter()
        fn()
        return summarize([(time.perf_counter() - t0) * 1e3])
    with torch.cuda.device(device):
        cache = _flush_buffer(device)
        if estimate_ms is None:
            fn()  # a first call compiles, autotunes, allocates: never timed
            torch.cuda.synchronize()
            estimate_ms = flushed_call_ms(fn, cache)
        estimate = max(estimate_ms, 1e-4)
        for _ in range(max(1, int(warmup_ms / estimate))):
            fn()
        most = max(1, int(rep_ms / estimate))
        chunk = max(1, int(CHUNK_MS / estimate))
        times: list[float] = []
        while len(times) < most:
            want = min_reps - len(times) if len(times) < min_reps else chunk
            times += _timed(fn, cache, max(1, min(want, most - len(times))))
            if len(times) >= min_reps and median_settled(times):
                break
    out = summarize(times)
    out["estimate_ms"] = estimate
    return out


def flushed_call_ms(fn, cache: torch.Tensor) -> float:
    """As do_bench estimates: the time of one call and its flush, from 5 of them."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        cache.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 5


def peak_mib(fn, device: torch.device) -> float | None:
    """Peak device memory of one call above what was allocated before it (inputs excluded)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    # The garbage collector off while measured: cyclic garbage freed during the call would lower
    # the peak below the base (a test read a later attention call's peak below its own
    # gradients so). Turning it off costs nothing; a collection here would cost every row.
    enabled = gc.isenabled()
    gc.disable()
    try:
        torch.cuda.reset_peak_memory_stats(device)
        # Read after the reset, which sets the peak to what is allocated then.
        base = torch.cuda.memory_allocated(device)
        out = fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
    finally:
        if enabled:
            gc.enable()
    del out
    return peak / 2**20


def graph_ms(fn, device: torch.device, rep_ms: float = 20) -> float | None:
    """Median time per call replaying a CUDA graph of many calls (triton's do_bench_cudagraph):
    the host's launch overhead taken out. No L2 flush between calls, so inputs smaller than the L2
    stay there: this is the GPU-side cost of a call in a stream of work, not a cold call. None where
    the call cannot be captured."""
    if device.type != "cuda":
        return None
    from triton.testing import do_bench_cudagraph

    try:
        return float(do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))
    except Exception:  # noqa: BLE001 - not capturable (host sync, dynamic allocation, ...)
        torch.cuda.synchronize(device)
        return None


def device_ms(fn, device: torch.device, estimate_ms: float | None = None,
              per_graph_ms: float = DEVICE_GRAPH_MS) -> float | None:
    """Median GPU time of one cold call, without the host: a CUDA graph of N groups (write
    FLUSH_BYTES to flush the L2, event, call, event) replayed twice, the first replay discarded.
    Unlike `graph_ms` an input smaller than the L2 is read from memory, as in `bench`. None where
    the call cannot be captured (host syncs, the autograd engine's thread)."""
    if device.type != "cuda":
        return None
    per_call = max(estimate_ms or 1.0, 0.005)
    reps = int(min(max(per_graph_ms / per_call, DEVICE_REPS[0]), DEVICE_REPS[1]))
    cache = _flush_buffer(device)
    starts = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(reps)]
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
            fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for start, end in zip(starts, ends):
                cache.zero_()
                start.record()
                fn()
                end.record()
        times = []
        for replay in range(2):
            graph.replay()
            torch.cuda.synchronize(device)
            if replay:
                times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        del graph
        return statistics.median(times)
    except Exception:  # noqa: BLE001 - not capturable
        torch.cuda.synchronize(device)
        return None
