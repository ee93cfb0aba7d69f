"""Timing and peak memory, the way every number in the data is obtained.

On CUDA: `triton.testing.do_bench` (warm-up first, L2 flushed before every repetition, device
events around each call), keeping all samples to report median, mean, std and min.
On the CPU (the interpreter smoke run) a few wall-clock repetitions: pipeline checks, not numbers.
"""
from __future__ import annotations

import statistics
import time

import torch

WARMUP_MS = 25
REP_MS = 100


def summarize(times_ms: list[float]) -> dict:
    return dict(
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
    else:
        fn()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
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
