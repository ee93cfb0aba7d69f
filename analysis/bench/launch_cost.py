"""Per-call cost at tiny sizes: what a call costs when the GPU work is a few microseconds.

    python -m triton_fusion_report.analysis.bench.launch_cost --out DIR/launch_cost.csv

For every public op and implementation (eager, torch.compile, Triton unfused and fused, the public
function, and the registered op called through the dispatcher) this records the first call's
time (compilation or cache loading, tuning), the wall-clock time per call of many back-to-back
calls (one sync at the end: the GPU never waits, the host does) in interleaved trials (median,
min, max), and the GPU time per call (CUDA-graph replay), beside the floor measured in the same
rounds: an empty Triton kernel's launch with one argument and with ten. One launch instead of three is half of what
fusion buys at small sizes; this table measures that half.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ... import kernels
from ...kernels.families import add_mul as ew
from ...kernels.families.attention import forward as fa
from ...kernels.families import layer_norm as ln
from ...kernels.families import linear_act as la
from ... import kernels as ops
from ...kernels.families.softmax import forward as sm
from ...kernels.families import matmul_softmax as sr
from ...kernels.families import softmax_matmul as sv
from .machine import run_metadata
from .timing import graph_ms

N_CALLS = 100


@triton.jit
def _noop1(p, BLOCK: tl.constexpr):
    pass


@triton.jit
def _noop10(p0, p1, p2, p3, p4, n0, n1, n2, n3, f0, BLOCK: tl.constexpr):
    pass


def host_us(fn, n: int = N_CALLS) -> float:
    """Wall-clock microseconds per call of n back-to-back calls (median of 3 batches)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    batches = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        batches.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return sorted(batches)[1]


def first_ms(fn) -> float:
    """The first call in this process, to its end on the GPU: compilation (or loading from
    Triton's and Inductor's disk caches), tuning, planning."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def gpu_us(fn) -> float | None:
    ms = graph_ms(fn, torch.device("cuda"), rep_ms=5)  # calls of a few us: thousands a replay
    return None if ms is None else ms * 1e3


class _Nothing(torch.autograd.Function):
    """The floor of any op whose backward runs Python: an autograd.Function that launches no
    kernel (its outputs and gradients are empty tensors of the right shapes)."""

    @staticmethod
    def forward(ctx, *inputs):
        ctx.save_for_backward(*inputs)
        return torch.empty_like(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        return tuple(torch.empty_like(t) for t in ctx.saved_tensors)


def cases(dev):
    """(op, shape label, {impl: fn}) at tiny sizes, fp16."""
    h = torch.float16
    r = lambda *s: torch.randn(*s, device=dev, dtype=h)  # noqa: E731
    comp = lambda f: torch.compile(f, dynamic=False)  # noqa: E731
    x, y, z = r(4096), r(4096), r(4096)
    yield "add_mul", "4096", dict(
        torch_eager=lambda: (x + y) * z, torch_compile=comp(lambda: (x + y) * z),
        triton_unfused=lambda: ew.triton_unfused(x, y, z),
        triton_fused=lambda: ew.triton_fused(x, y, z),
        public=lambda: kernels.add_mul(x, y, z), registered_op=lambda: ops.OPS["add_mul"](x, y, z))
    s = r(8, 1024)
    yield "softmax", "8x1024", dict(
        torch_eager=lambda: torch.softmax(s, -1), torch_compile=comp(lambda: torch.softmax(s, -1)),
        triton_unfused=lambda: sm.triton_unfused(s), triton_fused=lambda: sm.triton_fused(s),
        public=lambda: kernels.softmax(s), registered_op=lambda: ops.OPS["softmax"](s))
    w, b = r(1024), r(1024)
    eager_ln = lambda: F.layer_norm(s, (1024,), w, b)  # noqa: E731
    yield "layer_norm", "8x1024", dict(
        torch_eager=eager_ln, torch_compile=comp(eager_ln),
        triton_unfused=lambda: ln.triton_unfused(s, w, b),
        triton_fused=lambda: ln.triton_fused(s, w, b), public=lambda: kernels.layer_norm(s, w, b),
        registered_op=lambda: ops.OPS["layer_norm"](s, w, b, 1e-5))
    wp, bp = torch.nn.Parameter(w.clone()), torch.nn.Parameter(b.clone())

    def with_parameters():  # a model's LayerNorm at inference: nn.Parameter weights, no grad
        with torch.no_grad():
            return kernels.layer_norm(s, wp, bp)
    yield "layer_norm", "8x1024 (nn.Parameter weights, no_grad)", dict(public=with_parameters)
    ln_leaves = tuple(t.clone().requires_grad_() for t in (s, w, b))
    dy = r(8, 1024)

    def fwd_bwd(f, leaves, grad):
        return lambda: torch.autograd.grad(f(*leaves), leaves, grad)
    eager_lnf = lambda a, c, d: F.layer_norm(a, (1024,), c, d)  # noqa: E731
    yield "layer_norm fwd+bwd", "8x1024", dict(
        torch_eager=fwd_bwd(eager_lnf, ln_leaves, dy),
        torch_compile=fwd_bwd(comp(eager_lnf), ln_leaves, dy),
        triton_fused=fwd_bwd(ln.triton_fused, ln_leaves, dy),
        public=fwd_bwd(kernels.layer_norm, ln_leaves, dy),
        python_floor=fwd_bwd(_Nothing.apply, ln_leaves, dy))
    sm_leaves = (s.clone().requires_grad_(),)
    yield "softmax fwd+bwd", "8x1024", dict(
        torch_eager=fwd_bwd(lambda a: torch.softmax(a, -1), sm_leaves, dy),
        public=fwd_bwd(kernels.softmax, sm_leaves, dy),
        python_floor=fwd_bwd(_Nothing.apply, sm_leaves, dy))
    qkv_leaves = tuple(r(1, 2, 128, 64).requires_grad_() for _ in range(3))
    do = r(1, 2, 128, 64)
    yield "attention fwd+bwd", "1x2x128x64 causal", dict(
        torch_eager=fwd_bwd(lambda *a: F.scaled_dot_product_attention(*a, is_causal=True),
                            qkv_leaves, do),
        public=fwd_bwd(lambda *a: kernels.attention(*a, causal=True), qkv_leaves, do),
        python_floor=fwd_bwd(_Nothing.apply, qkv_leaves, do))
    la_leaves = tuple(r(*shape).requires_grad_() for shape in ((64, 64), (64, 64), (64,)))
    dl = r(64, 64)
    yield "linear_act fwd+bwd", "64x64x64 gelu_tanh", dict(
        torch_eager=fwd_bwd(lambda x_, w_, b_: F.gelu(torch.addmm(b_, x_, w_), approximate="tanh"),
                            la_leaves, dl),
        public=fwd_bwd(lambda *a: kernels.linear_act(*a, "gelu_tanh"), la_leaves, dl),
        python_floor=fwd_bwd(_Nothing.apply, la_leaves, dl))
    xs, vs = r(1, 64, 64), r(1, 64, 64)
    ref_sv = lambda: torch.softmax(xs, -1) @ vs  # noqa: E731
    yield "softmax_matmul", "1x64x64x64", dict(
        torch_eager=ref_sv, torch_compile=comp(ref_sv),
        triton_unfused=lambda: sv.triton_unfused(xs, vs),
        triton_fused=lambda: sv.triton_fused(xs, vs), public=lambda: kernels.softmax_matmul(xs, vs),
        registered_op=lambda: ops.OPS["softmax_matmul"](xs, vs))
    q, k, v = r(1, 2, 128, 64), r(1, 2, 128, 64), r(1, 2, 128, 64)

    def naive():
        return torch.softmax((q @ k.transpose(-1, -2)) * 0.125, -1) @ v
    yield "attention", "1x2x128x64", dict(
        torch_eager=naive, torch_compile=comp(naive),
        sdpa=lambda: F.scaled_dot_product_attention(q, k, v),
        triton_unfused=lambda: fa.triton_unfused(q, k, v),
        triton_fused=lambda: fa.triton_fused(q, k, v), public=lambda: kernels.attention(q, k, v),
        registered_op=lambda: ops.OPS["attention"](q, k, v, False, None))
    q2, k2, v2 = r(1, 2, 120, 64), r(1, 2, 120, 64), r(1, 2, 120, 64)
    yield "attention", "1x2x120x64 (new length, same bucket)", dict(
        public=lambda: kernels.attention(q2, k2, v2))
    xm, wm, bm = r(64, 64), r(64, 64), r(64)
    ref_ms = lambda: torch.softmax(torch.addmm(bm, xm, wm), -1)  # noqa: E731
    yield "matmul_softmax", "64x64x64", dict(
        torch_eager=ref_ms, torch_compile=comp(ref_ms),
        triton_unfused=lambda: sr.triton_unfused(xm, wm, bm),
        triton_fused=lambda: sr.triton_fused(xm, wm, bm),
        public=lambda: kernels.matmul_softmax(xm, wm, bm),
        registered_op=lambda: ops.OPS["matmul_softmax"](xm, wm, bm))
    ref_la = lambda: F.gelu(torch.addmm(bm, xm, wm))  # noqa: E731
    yield "linear_act", "64x64x64 gelu", dict(
        torch_eager=ref_la, torch_compile=comp(ref_la),
        triton_unfused=lambda: la.linear_act_unfused(xm, wm, bm),
        triton_fused=lambda: la.linear_act_fused(xm, wm, bm),
        public=lambda: kernels.linear_act(xm, wm, bm),
        registered_op=lambda: ops.OPS["linear_act"](xm, wm, bm, "gelu"))


TRIALS = 3


def warm(dev, _=None) -> None:
    """Every case's first call (make bench's warming processes: compiles into the disk caches)."""
    for _, _, impls in cases(dev):
        for fn in impls.values():
            try:
                fn()
            except Exception:  # noqa: BLE001 - measure() records what fails
                pass
    torch.cuda.synchronize(dev)


def measure(dev, trials: int = TRIALS) -> list[dict]:
    """Every (op, implementation) and the raw launches: the first call of each, then `trials`
    rounds in which each is timed once (host_us) in turn, so that a drift of the machine's
    speed reaches all of them alike; the row keeps the median of its trials with min and max."""
    meta = run_metadata(dev)
    p = torch.empty(16, device=dev)
    entries = [("raw launch", "1 arg", "triton_noop", lambda: _noop1[(1,)](p, BLOCK=16)),
               ("raw launch", "10 args", "triton_noop",
                lambda: _noop10[(1,)](p, p, p, p, p, 1, 2, 3, 4, 0.5, BLOCK=16))]
    entries += [(op, shape, impl, fn) for op, shape, impls in cases(dev)
                for impl, fn in impls.items()]
    rows = [dict(meta, op=op, shape=shape, impl=impl, first_ms=None, host_us=None,
                 host_us_min=None, host_us_max=None, trials=0, gpu_us=None, error="")
            for op, shape, impl, _ in entries]
    samples = [[] for _ in entries]

    def attempt(i, what):
        if rows[i]["error"]:
            return None
        try:
            return what(entries[i][3])
        except Exception as exc:  # noqa: BLE001 - recorded, the table goes on
            rows[i]["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            return None

    for i in range(len(entries)):
        rows[i]["first_ms"] = attempt(i, first_ms)
    for _ in range(trials):
        for i in range(len(entries)):
            us = attempt(i, host_us)
            if us is not None:
                samples[i].append(us)
    for i, row in enumerate(rows):
        row["gpu_us"] = attempt(i, gpu_us)
        if samples[i] and not row["error"]:
            row.update(host_us=statistics.median(samples[i]), host_us_min=min(samples[i]),
                       host_us_max=max(samples[i]), trials=len(samples[i]))
        print(f"{row['op']:20s} {row['shape'][:14]:14s} {row['impl']:15s} first "
              f"{row['first_ms'] or float('nan'):9.1f} ms  host {row['host_us'] or float('nan'):8.1f}"
              f" us [{row['host_us_min'] or float('nan'):.1f}, {row['host_us_max'] or float('nan'):.1f}]"
              f"   gpu {row['gpu_us'] or float('nan'):7.1f} us {row['error']}", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m triton_fusion_report.analysis.bench.launch_cost",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="CSV file to write")
    ap.add_argument("--trials", type=int, default=TRIALS,
                    help="rounds over every implementation (default %(default)s)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("launch_cost measures a GPU's launch path; no GPU here", file=sys.stderr)
        return 1
    rows = measure(torch.device("cuda"), args.trials)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
