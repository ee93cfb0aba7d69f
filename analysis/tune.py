"""`python -m triton_fusion_report.analysis.tune NAME --out DIR`: time a kernel's launch configurations on one problem
and print them best first (CSV in DIR). How the defaults in kernels/ were chosen: see the design
notes in docs/ (one per family)."""
from __future__ import annotations

import argparse
import csv
import itertools
import sys
from pathlib import Path

import torch

from .sweep import classify, max_rel_err


def _smm(precision: str, d2: int = 1024):
    from ..kernels import softmax_v as smm

    x = torch.randn(16, 2048, d2, device="cuda")
    v = torch.randn(16, d2, 512, device="cuda")
    ref = smm.reference(x.double(), v.double())
    grid = itertools.product([32, 64] if precision == "ieee" else [32, 64, 128], [32, 64],
                             [64, 128, 256], [4, 8], [2, 3])
    for b1, b2, b3, w, st in grid:
        cfg = dict(block_1=b1, block_2=b2, block_3=b3, num_warps=w, num_stages=st)
        yield cfg, (lambda cfg=cfg: smm.triton_fused(x, v, input_precision=precision, **cfg)), ref


SPACES = {
    "softmax_matmul_ieee": lambda: _smm("ieee"),
    "softmax_matmul_tf32": lambda: _smm("tf32"),
}


def main(argv=None) -> int:
    from triton.testing import do_bench

    ap = argparse.ArgumentParser(prog="python -m triton_fusion_report.analysis.tune")
    ap.add_argument("names", nargs="+", choices=sorted(SPACES))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        rows = []
        for cfg, fn, ref in SPACES[name]():
            try:
                err = max_rel_err(fn(), ref)
                ms = do_bench(fn, warmup=5, rep=20, return_mode="median")
                rows.append(dict(cfg, ms=ms, err=err, status="ok"))
                print(f"  {name} {cfg} {ms:.4f} ms", flush=True)
            except Exception as exc:  # noqa: BLE001
                torch.cuda.synchronize()
                rows.append(dict(cfg, ms=None, err=None, status=classify(exc)))
        ok = sorted((r for r in rows if r["ms"] is not None), key=lambda r: r["ms"])
        with open(args.out / f"tune_{name}.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(ok + [r for r in rows if r["ms"] is None])
        print(f"[{name}] {len(ok)} of {len(rows)} configs ran; best first:")
        for r in ok[:args.top]:
            print("  " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                  for k, v in r.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
