"""The Gluon attention forward (kernels/families/attention/gluon.py), for its maintainers:

    python tools/gluon_attention.py            # no GPU needed: compile each schedule for sm_90,
                                               # print shared memory and the PTX's counts
    python tools/gluon_attention.py --run      # on an H100/H200: time each schedule against the
                                               # `tl` kernels (the plan without Gluon) and cuDNN

The public op's plan times the Gluon forward among its candidates wherever it applies;
pytest tests/test_attention.py -k gluon checks it against float64 on a Hopper GPU.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from triton_fusion_report.kernels.families.attention import forward as fa  # noqa: E402
from triton_fusion_report.kernels.families.attention import gluon  # noqa: E402


def _print_compiled() -> None:
    for name, (overlap, pingpong) in gluon.VARIANTS.items():
        for d in (64, 128):
            for causal in (False, True):
                k = gluon.compile_sm90(d, causal, overlap=overlap, pingpong=pingpong)
                ptx = k.asm["ptx"]
                print(f"{name} head_dim {d} causal={causal}: compiled for sm_90; shared "
                      f"{k.metadata.shared}; wgmma {ptx.count('wgmma.mma_async')}; "
                      f"setmaxnreg {ptx.count('setmaxnreg')}; TMA "
                      f"{ptx.count('cp.async.bulk.tensor')}", flush=True)


def _time(shapes) -> None:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    for (b, h, s, d), hk, causal in shapes:
        q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hk, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        out = torch.empty_like(q)
        scale = fa.default_scale(d)
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        row = {}
        for name, fn in (*((f"gluon {v_name}",
                            lambda o=o, p=p: gluon.launch(q, k, v, out, None, scale, causal,
                                                          overlap=o, pingpong=p))
                           for v_name, (o, p) in gluon.VARIANTS.items()),
                         ("tl", lambda: fa.triton_fused(q, k, v, causal, _kernel="tl")),
                         ("plan", lambda: fa.triton_fused(q, k, v, causal))):
            fn()
            row[name] = do_bench(fn, warmup=25, rep=200)
        kr, vr = (t.repeat_interleave(h // hk, 1) for t in (k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            row["cuDNN"] = do_bench(lambda: F.scaled_dot_product_attention(
                q, kr, vr, is_causal=causal), warmup=25, rep=200)
        print(f"time {b}x{h}x{s}x{d} kv heads {hk} causal={causal} bf16, TFLOP/s: "
              + ", ".join(f"{n} {flops / ms / 1e9:.0f}" for n, ms in row.items()), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="store_true", help="time it on this machine's GPU")
    args = ap.parse_args(argv)
    if not args.run:
        _print_compiled()
        return 0
    _time([((4, 16, 4096, 128), 16, False), ((4, 16, 4096, 128), 16, True),
           ((4, 32, 4096, 64), 32, False), ((4, 32, 4096, 64), 32, True),
           ((2, 32, 4096, 128), 8, False)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
