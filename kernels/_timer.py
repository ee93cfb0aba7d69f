"""The tuners' timer (attention's and LayerNorm's launch settings, chosen by `_plans.fastest`)."""
from __future__ import annotations

import torch

SLEEP_CYCLES = 100_000  # ~50 us at an H100's 1.98 GHz: more than a launch's host time
MAX_REPS = 200  # calls of a tiny kernel (each after its sleep): enough for a median


def time_ms(fn, warmup_ms: float = 5, rep_ms: float = 20) -> float:
    """Median ms of fn over back-to-back calls, each between CUDA events, for the tuners.
    Unlike triton.testing.do_bench, no L2 flush between calls: its 256 MB buffer made a
    tuner's first call at a new shape allocate it (several times a later call's peak memory;
    docs/attention.md, "Tuner noise"), and the candidates, compared on the same inputs, see the
    same cache alike. Before each call the GPU is kept busy for ~50 us
    (`torch.cuda._sleep`, no memory) so that the host has queued the call before its first event
    is reached: a kernel shorter than its launch's host time is timed, not the host."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 3, 1e-3)
    for _ in range(min(MAX_REPS, max(1, int(warmup_ms / estimate)))):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(min(MAX_REPS, max(3, int(rep_ms / estimate))))]
    for a, b in events:
        torch.cuda._sleep(SLEEP_CYCLES)
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in events)
    return times[len(times) // 2]
