"""`python -m triton_fusion_report.analysis.before_after --out F.json`: device time of the Triton
implementations at one mid-sized problem per family, so that a refactor can be checked for
slowdowns: run it in two checkouts, then `--compare BEFORE AFTER` prints the table.

Runs in older checkouts too (where the kernels were importable as top-level `kernels`), so the
script can be copied into a snapshot of the commit before a change."""
from __future__ import annotations

import argparse
import importlib
import json
import sys

import torch


def _kernels(name: str):
    for root in ("triton_fusion_report.kernels", "kernels"):
        try:
            return importlib.import_module(f"{root}.{name}")
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(name)


def _first(*names):
    for n in names:
        try:
            return _kernels(n)
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(names)


def cases(dev):
    """(name, {impl: fn}) at one size per family (fp16 unless a dtype is named)."""
    h, f = torch.float16, torch.float32
    r = lambda *s, dtype=h: torch.randn(*s, device=dev, dtype=dtype)  # noqa: E731
    ew = _kernels("elementwise")
    sm = _first("row_softmax", "softmax")
    ln = _kernels("layernorm")
    sv = _first("softmax_v", "softmax_matmul")
    at = _first("flash_attention", "attention")
    sr = _first("softmax_regression", "matmul_epilogue")
    la = _first("linear_activation", "matmul_epilogue")
    x, y, z = r(1 << 26, dtype=f), r(1 << 26, dtype=f), r(1 << 26, dtype=f)
    yield "add_mul fp32 2^26", dict(unfused=lambda: ew.triton_unfused(x, y, z),
                                    fused=lambda: ew.triton_fused(x, y, z))
    s = r(4096, 8192, dtype=f)
    yield "softmax fp32 4096x8192", dict(unfused=lambda: sm.triton_unfused(s),
                                         fused=lambda: sm.triton_fused(s))
    a, w, b = r(4096, 8192), r(8192), r(8192)
    yield "layer_norm fwd 4096x8192", dict(unfused=lambda: ln.triton_unfused(a, w, b),
                                           fused=lambda: ln.triton_fused(a, w, b))
    ag, wg, bg = (t.clone().requires_grad_() for t in (r(4096, 4096), r(4096), r(4096)))
    dy = r(4096, 4096)
    yl = ln.triton_fused(ag, wg, bg)
    yield "layer_norm bwd 4096x4096", dict(
        fused=lambda: torch.autograd.grad(yl, (ag, wg, bg), dy, retain_graph=True))
    p, v = r(8, 1024, 4096), r(8, 4096, 128)
    yield "softmax_matmul 8x1024x4096x128", dict(unfused=lambda: sv.triton_unfused(p, v),
                                                 fused=lambda: sv.triton_fused(p, v))
    q, k, vv = r(4, 16, 4096, 128), r(4, 16, 4096, 128), r(4, 16, 4096, 128)
    q2, k2, v2 = r(2, 8, 2048, 128), r(2, 8, 2048, 128), r(2, 8, 2048, 128)
    yield "attention B4 H16 S4096 d128", dict(fused=lambda: at.triton_fused(q, k, vv))
    yield "attention causal B4 H16 S4096 d128", dict(
        fused=lambda: at.triton_fused(q, k, vv, causal=True))
    yield "attention B2 H8 S2048 d128", dict(unfused=lambda: at.triton_unfused(q2, k2, v2),
                                             fused=lambda: at.triton_fused(q2, k2, v2))
    xm, wm, bm = r(8192, 1024), r(1024, 4096), r(4096)
    fused_ms = getattr(sr, "matmul_softmax_fused", None) or sr.triton_fused
    unfused_ms = getattr(sr, "matmul_softmax_unfused", None) or sr.triton_unfused
    yield "matmul_softmax 8192x1024x4096", dict(unfused=lambda: unfused_ms(xm, wm, bm),
                                                fused=lambda: fused_ms(xm, wm, bm))
    xl, wl, bl = r(4096, 4096), r(4096, 4096), r(4096)
    fused_la = getattr(la, "linear_act_fused", None) or la.triton_fused
    unfused_la = getattr(la, "linear_act_unfused", None) or la.triton_unfused
    yield "linear_act gelu 4096^3", dict(unfused=lambda: unfused_la(xl, wl, bl),
                                         fused=lambda: fused_la(xl, wl, bl))


def measure(dev, only=None) -> dict:
    from triton.testing import do_bench

    out = {}
    for name, impls in cases(dev):
        if only and not any(o in name for o in only):
            continue
        for impl, fn in impls.items():
            out[f"{name} / {impl}"] = float(do_bench(fn, warmup=100, rep=400, return_mode="median"))
            print(f"{name:40s} {impl:8s} {out[f'{name} / {impl}']:8.4f} ms", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m triton_fusion_report.analysis.before_after",
                                 description=__doc__)
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs="+", metavar="JSON",
                    help="BEFORE AFTER [BEFORE AFTER ...]: medians over the repeats")
    ap.add_argument("--only", action="append", metavar="TEXT",
                    help="time only the cases whose name contains TEXT (repeatable)")
    args = ap.parse_args(argv)
    if args.compare:
        runs = [json.load(open(p)) for p in args.compare]
        before, after = runs[0::2], runs[1::2]
        med = lambda rs, k: sorted(r[k] for r in rs)[len(rs) // 2]  # noqa: E731
        print("| case | before ms | after ms | after / before |\n|---|---|---|---|")
        for k in before[0]:
            if all(k in r for r in runs):
                b, a = med(before, k), med(after, k)
                print(f"| {k} | {b:.4f} | {a:.4f} | {a / b:.3f} |")
        return 0
    dev = torch.device("cuda")
    with open(args.out, "w") as f:
        json.dump(measure(dev, args.only), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
