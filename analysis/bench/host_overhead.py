"""Where a short call's time goes: host (Python + launch) against GPU, per implementation.

    python -m triton_fusion_report.analysis.bench.host_overhead [--profile]

For calls whose GPU work lasts a few microseconds, `do_bench` measures the host path: the GPU waits
for the next launch. This prints, per call, the host time (wall clock of many back-to-back calls,
the GPU never the bottleneck) and the GPU time (CUDA-graph replay), for LayerNorm forward and
backward and for softmax at narrow rows. --profile adds cProfile's top entries of the fused
LayerNorm backward's host path. A diagnostic behind docs/layernorm.md and docs/bench.md, not part
of the sweep.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
import torch._functorch.config as functorch_config
import torch.nn.functional as F

from ...kernels.families import layer_norm as ln
from ...kernels.families.layer_norm import backward as lnb
from ...kernels.families.layer_norm import forward as lnf
from ...kernels.families.softmax import forward as sm

from .launch_cost import _noop1, _noop10, gpu_us, host_us

# The launch-cost tools (an empty kernel, per-call host and GPU time) are launch_cost's.


def grad_fn(forward, x, w, b, dy):
    leaves = [t.detach().requires_grad_() for t in (x, w, b)]
    y = forward(*leaves)
    return lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sections", default="ln,softmax",
                        help="comma-separated: ln, softmax (the --profile part always runs)")
    parser.add_argument("--out", help="also write the table to this CSV file")
    args = parser.parse_args()
    dev = torch.device("cuda")
    # retain_graph=True on a compiled backward needs this (no buffers donated to the backward).
    functorch_config.donated_buffer = False
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"{'case':58s} {'host us':>9s} {'gpu us':>9s}")

    table = []

    def show(name, fn, graph=True):
        h = host_us(fn)
        g = gpu_us(fn) if graph else None
        print(f"{name:58s} {h:9.1f} {'' if g is None else f'{g:9.1f}'}")
        table.append(dict(case=name, host_us=h, gpu_us=g))

    eager_ln = lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)  # noqa: E731
    # dynamic=False as the sweep compiles: by default a second shape recompiles the function with
    # dynamic sizes, whose generic kernel took twice the sweep's device time at 4096 x 4096.
    compiled_ln = torch.compile(eager_ln, dynamic=False)
    sections = args.sections.split(",")
    ln_shapes = [(4096, 1024), (4096, 4096), (4096, 8192)] if "ln" in sections else []
    softmax_widths = [1024, 2048, 4096] if "softmax" in sections else []
    dtype = torch.float16
    for rows, width in ln_shapes:
        x = torch.randn(rows, width, device=dev, dtype=dtype)
        w = torch.randn(width, device=dev, dtype=dtype)
        b = torch.randn(width, device=dev, dtype=dtype)
        dy = torch.randn_like(x)
        tag = f"ln {rows}x{width} {str(dtype)[6:]}"
        show(f"{tag} fwd eager", lambda: eager_ln(x, w, b))
        show(f"{tag} fwd compile", lambda: compiled_ln(x, w, b))
        show(f"{tag} fwd fused", lambda: ln.triton_fused(x, w, b))
        rows_v, n_rows, n_cols = ln._check_inputs(x, w, b, 1e-5)
        y = torch.empty_like(x)
        show(f"{tag} fwd fused: _forward only (no checks, no alloc y)",
             lambda: lnf.forward(rows_v, n_rows, n_cols, w, b, 1e-5, None, None, y))
        show(f"{tag} fwd fused: _check_inputs only", lambda: ln._check_inputs(x, w, b, 1e-5),
             graph=False)
        show(f"{tag} bwd eager (autograd.grad)", grad_fn(eager_ln, x, w, b, dy), graph=False)
        show(f"{tag} bwd compile (autograd.grad)", grad_fn(compiled_ln, x, w, b, dy), graph=False)
        inner = []
        plain_backward = lnb.backward

        def timed_backward(*a, **k):
            t0 = time.perf_counter()
            out = plain_backward(*a, **k)
            inner.append(time.perf_counter() - t0)
            return out
        lnb.backward = timed_backward
        show(f"{tag} bwd fused (autograd.grad)", grad_fn(ln.triton_fused, x, w, b, dy),
             graph=False)
        lnb.backward = plain_backward
        inner_us = sorted(inner)[len(inner) // 2] * 1e6
        print(f"{'  of which _backward, on the autograd thread':58s} {inner_us:9.1f}")
        table.append(dict(case=f"{tag} bwd fused: _backward on the autograd thread",
                          host_us=inner_us, gpu_us=None))
        _, stats = ln._fused_forward(x, w, b, 1e-5, None, None, None)
        show(f"{tag} bwd fused: _backward only",
             lambda: lnb.backward(dy, x, w, stats, True, True, None, None, None))
    for width in softmax_widths:
        x = torch.randn(4096, width, device=dev)
        tag = f"softmax 4096x{width} fp32"
        show(f"{tag} eager", lambda: torch.softmax(x, -1))
        show(f"{tag} fused", lambda: sm.triton_fused(x))

    if args.out:
        import pandas as pd

        from .machine import run_metadata

        meta = run_metadata(torch.device("cuda"))
        meta["date"] = meta["started_at"]
        pd.DataFrame([dict(r, **meta) for r in table]).to_csv(args.out, index=False)
        print("->", args.out)
    if args.profile:
        # The launch alone: a kernel with 1 and with 10 runtime arguments, through kernel[grid]
        # and through the compiled kernel's own launcher (no binder, no cache lookup).
        t = torch.empty(16, device=dev)

        class Identity(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a):
                return a.clone()

            @staticmethod
            def backward(ctx, g):
                return g

        a = torch.randn(16, device=dev, requires_grad=True)
        g = torch.ones(16, device=dev)
        ya, yb = Identity.apply(a), a * 2
        show("autograd.grad, a Python Function (identity)",
             lambda: torch.autograd.grad(ya, a, g, retain_graph=True), graph=False)
        show("autograd.grad, a C++ op (a * 2)",
             lambda: torch.autograd.grad(yb, a, g, retain_graph=True), graph=False)
        show("launch: noop, 1 arg", lambda: _noop1[(1,)](t, BLOCK=16), graph=False)
        a10 = (t, t, t, t, t, 4096, 1024, 1024, 1024, 1e-5)
        show("launch: noop, 10 args", lambda: _noop10[(1,)](*a10, BLOCK=16), graph=False)
        k = _noop10[(1,)](*a10, BLOCK=16)
        k._init_handles()
        stream = torch.cuda.current_stream().cuda_stream
        try:
            show("launch: noop, 10 args, compiled.run",
                 lambda: k.run(1, 1, 1, stream, k.function, k.packed_metadata, None, None, None,
                               *a10, 16), graph=False)
        except Exception as e:  # noqa: BLE001 - internal API: report, go on
            print("compiled.run failed:", repr(e)[:300])
        show("torch.empty 4096x1024 fp16",
             lambda: torch.empty((4096, 1024), dtype=torch.float16, device=dev), graph=False)
        x = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
        w = torch.randn(4096, device=dev, dtype=torch.float16)
        b = torch.randn_like(w)
        dy = torch.randn_like(x)
        rows_v, n_rows, n_cols = ln._check_inputs(x, w, b, 1e-5)
        y = torch.empty_like(x)
        for name, fn in (("bwd fused autograd.grad", grad_fn(ln.triton_fused, x, w, b, dy)),
                         ("fwd fused", lambda: ln.triton_fused(x, w, b)),
                         ("fwd _forward", lambda: lnf.forward(rows_v, n_rows, n_cols, w, b, 1e-5,
                                                              None, None, y))):
            fn()
            torch.cuda.synchronize()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(200):
                fn()
            prof.disable()
            torch.cuda.synchronize()
            print(f"--- cProfile, 200 calls: {name}")
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
