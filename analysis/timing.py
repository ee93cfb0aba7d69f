"""Timing and peak memory, the way every number in the data is obtained.

On CUDA: `triton.testing.do_bench` (warm-up first, L2 flushed before every repetition, device
events around each call), keeping all samples (`times`) with their median, mean, std and min;
the sweep calls it once per trial.
`device_ms` takes the host out: the calls replayed from a CUDA graph, L2 flushed before each,
each timed by events inside the graph. On the CPU (the interpreter smoke run) one wall-clock
call per trial: pipeline checks, not numbers.
"""
from __future__ import annotations

import statistics
import time

import torch

WARMUP_MS = 25
REP_MS = 40  # per trial; the sweep times each configuration in sweep.TRIALS trials
FLUSH_BYTES = 256 * 2**20  # what do_bench writes to flush the L2 (50 MB on an H100)
DEVICE_REPS = (10, 200)  # calls per graph: at least, at most
DEVICE_GRAPH_MS = 40  # aim for about this much GPU work per graph replay


def summarize(times_ms: list[float]) -> dict:
    return dict(
        times=list(times_ms),
        ms_median=statistics.median(times_ms),
        ms_mean=statistics.fmean(times_ms),
        ms_std=statistics.stdev(times_ms) if len(times_ms) > 1 else 0.0,
        ms_min=min(times_ms),
        n_reps=len(times_ms),
    )


def bench(fn, device: torch.device, warmup_ms: float = WARMUP_MS, rep_ms: float = REP_MS) -> dict:
    if device.type == "cuda":
        from triton.testing import do_bench

        times = do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
    else:  # the interpreter: one wall-clock call (the pipeline's check, not a number)
        t0 = time.perf_counter()
        fn()
        times = [(time.perf_counter() - t0) * 1e3]
    return summarize(times)


def peak_mib(fn, device: torch.device) -> float | None:
    """Peak device memory of one call above what was allocated before it (inputs excluded)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del out
    return peak / 2**20


def graph_ms(fn, device: torch.device) -> float | None:
    """Median time per call replaying a CUDA graph of many calls (triton's do_bench_cudagraph):
    the host's launch overhead taken out. No L2 flush between calls, so inputs smaller than the L2
    stay there: this is the GPU-side cost of a call in a stream of work, not a cold call. None where
    the call cannot be captured."""
    if device.type != "cuda":
        return None
    from triton.testing import do_bench_cudagraph

    try:
        return float(do_bench_cudagraph(fn, rep=20, return_mode="median"))
    except Exception:  # noqa: BLE001 - not capturable (host sync, dynamic allocation, ...)
        torch.cuda.synchronize(device)
        return None


def device_ms(fn, device: torch.device, estimate_ms: float | None = None) -> float | None:
    """Median GPU time of one cold call, without the host: a CUDA graph of N groups (write
    FLUSH_BYTES to flush the L2, event, call, event) replayed twice, the first replay discarded.
    Unlike `graph_ms` an input smaller than the L2 is read from memory, as in `bench`. None where
    the call cannot be captured (host syncs, the autograd engine's thread)."""
    if device.type != "cuda":
        return None
    per_call = max(estimate_ms or 1.0, 0.005)
    reps = int(min(max(DEVICE_GRAPH_MS / per_call, DEVICE_REPS[0]), DEVICE_REPS[1]))
    cache = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device)
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
