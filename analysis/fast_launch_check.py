"""Check the fast launch path (kernels._common.launch) on a GPU, then time the per-call host cost.

    python -m triton_fusion_report.analysis.fast_launch_check [--calls 400] [--out F.csv]

1. Same bits: every public op (LayerNorm's backward too) on inputs that cross what Triton
   specialises on (16-byte-aligned pointers and not, sizes divisible by 16 and not, sizes of 1,
   each dtype, strided views), computed with the fast path off (every launch through
   JITFunction.run), then four rounds of all of them in turn with it on (the second without the
   cache of TMA descriptors, `_common.CACHE_TMA`, the fourth with tensors passed to the launcher
   as addresses, `_common.POINTERS_AS_INTS`): each output must equal the first bit for bit. In the last round every key has been seen, so no launch may go through
   JITFunction.run (counted).
2. Host cost: wall-clock microseconds a call of many back-to-back calls (launch_cost.host_us) of
   each op at launch_cost's tiny sizes, fast path off, on, and on with addresses, beside an empty
   kernel's raw launch (1 and 10 arguments). Target (issue 12): <= 25 us and <= 1.25x the raw launch.
Exit status 1 if an output differs or the fast path did not take over.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys

import torch
import triton

from .. import kernels
from ..kernels import _common
from ..kernels import layernorm as ln
from ..kernels import layernorm_backward as lnb

# The switches as the package sets them (restored after each mode is tried).
_DEFAULTS = (_common.FAST_LAUNCH, _common.POINTERS_AS_INTS, _common.CACHE_TMA)
from .launch_cost import _noop1, _noop10, host_us


def _unaligned(*shape, dtype, dev):
    """A contiguous tensor whose data_ptr is 1 element past a 16-byte boundary."""
    n = math.prod(shape)
    flat = torch.randn(n + 16, dtype=dtype, device=dev)
    t = flat[1:n + 1].view(*shape)
    assert t.data_ptr() % 16 != 0
    return t


def cases(dev):
    """(name, fn) pairs; fn returns a tensor or a tuple of them."""
    r = lambda *s, dtype=torch.float16: torch.randn(*s, dtype=dtype, device=dev)  # noqa: E731
    h, f, bf = torch.float16, torch.float32, torch.bfloat16
    for dtype in (h, f, bf):
        tag = str(dtype)[6:]
        for n in (4096, 4095, 1):
            x, y, z = r(n, dtype=dtype), r(n, dtype=dtype), r(n, dtype=dtype)
            yield f"add_mul {n} {tag}", lambda x=x, y=y, z=z: kernels.add_mul(x, y, z)
            yield f"add_mul {n} {tag} scalar", lambda x=x, y=y: kernels.add_mul(x, y, 0.5)
        xu, yu = _unaligned(4096, dtype=dtype, dev=dev), _unaligned(4096, dtype=dtype, dev=dev)
        zb = r(64, dtype=dtype)
        yield f"add_mul unaligned {tag}", lambda x=xu, y=yu, z=zb: kernels.add_mul(
            x.view(64, 64), y.view(64, 64), z)
        for shape in ((8, 1024), (8, 1000), (1, 1), (5, 1), (3, 7, 33)):
            x = r(*shape, dtype=dtype)
            w, b = r(shape[-1], dtype=dtype), r(shape[-1], dtype=dtype)
            yield f"softmax {shape} {tag}", lambda x=x: kernels.softmax(x)
            yield f"layer_norm {shape} {tag}", lambda x=x, w=w, b=b: kernels.layer_norm(x, w, b)
            yield f"layer_norm {shape} {tag} no bias", lambda x=x, w=w: kernels.layer_norm(x, w)
        xs = r(8, 1024, dtype=dtype)[:, :1000]
        xu = _unaligned(8, 1024, dtype=dtype, dev=dev)
        w32, b32 = r(1000, dtype=f), r(1000, dtype=f)
        yield f"softmax strided {tag}", lambda x=xs: kernels.softmax(x)
        yield f"softmax unaligned {tag}", lambda x=xu: kernels.softmax(x)
        yield f"layer_norm strided {tag} fp32 weight", lambda x=xs, w=w32, b=b32: (
            kernels.layer_norm(x, w, b))
        for shape in ((8, 1024), (7, 100), (4, 1)):
            x, w, b, dy = (r(*s, dtype=dtype) for s in (shape, shape[-1:], shape[-1:], shape))

            def fwd_bwd(x=x, w=w, b=b, dy=dy):
                leaves = [t.clone().requires_grad_() for t in (x, w, b)]
                return torch.autograd.grad(kernels.layer_norm(*leaves), leaves, dy)
            yield f"layer_norm fwd+bwd {shape} {tag}", fwd_bwd
        x, v = r(1, 64, 64, dtype=dtype), r(1, 64, 64, dtype=dtype)
        x2, v2 = r(2, 33, 50, dtype=dtype), r(2, 17, 50, dtype=dtype).transpose(1, 2)
        yield f"softmax_matmul 1x64x64x64 {tag}", lambda x=x, v=v: kernels.softmax_matmul(x, v)
        yield f"softmax_matmul 2x33x50x17 {tag} v^T", lambda x=x2, v=v2: (
            kernels.softmax_matmul(x, v))
        xm, wm, bm = r(64, 64, dtype=dtype), r(64, 64, dtype=dtype), r(64, dtype=dtype)
        x3, w3, b3 = r(33, 20, dtype=dtype), r(100, 20, dtype=dtype).t(), r(100, dtype=dtype)
        yield f"matmul_softmax 64^3 {tag}", lambda x=xm, w=wm, b=bm: kernels.matmul_softmax(x, w, b)
        yield f"matmul_softmax 33x20x100 {tag} w^T", lambda x=x3, w=w3, b=b3: (
            kernels.matmul_softmax(x, w, b))
        yield f"linear_act 64^3 gelu {tag}", lambda x=xm, w=wm, b=bm: kernels.linear_act(x, w, b)
        yield f"linear_act 33x20x100 relu {tag} w^T", lambda x=x3, w=w3: kernels.linear_act(
            x, w, None, "relu")
        if dtype == f:
            continue  # attention takes float16 and bfloat16
        q, k, v = (r(1, 2, 128, 64, dtype=dtype) for _ in range(3))
        qkv = r(2, 100, 3, 4, 64, dtype=dtype)
        q20, k20, v20 = (r(1, 2, 40, 20, dtype=dtype) for _ in range(3))
        qd, kd, vd = r(2, 8, 1, 128, dtype=dtype), r(2, 2, 1000, 128, dtype=dtype), \
            r(2, 2, 1000, 128, dtype=dtype)
        for causal in (False, True):
            yield f"attention 1x2x128x64 {tag} causal={causal}", lambda q=q, k=k, v=v, c=causal: (
                kernels.attention(q, k, v, causal=c))
            yield f"attention qkv views 2x4x100x64 {tag} causal={causal}", \
                lambda t=qkv, c=causal: kernels.attention(
                    *(t[:, :, i].transpose(1, 2) for i in range(3)), causal=c)
            yield f"attention d20 {tag} causal={causal}", lambda q=q20, k=k20, v=v20, c=causal: (
                kernels.attention(q, k, v, causal=c))
            yield f"attention decode 2x8x1 kv 2x1000 {tag} causal={causal}", \
                lambda q=qd, k=kd, v=vd, c=causal: kernels.attention(q, k, v, causal=c)


def _as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _same_bits(a, b) -> bool:
    try:
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        return True
    except AssertionError:
        return False


def check_same_bits(dev) -> tuple[int, int]:
    """(differences, JITFunction.run calls in the last round); prints each difference."""
    from triton.runtime.jit import JITFunction

    all_cases = list(cases(dev))
    _common.FAST_LAUNCH = False
    want = {}
    for name, fn in all_cases:
        want[name] = [t.detach().clone() for t in _as_tuple(fn())]
    _common.FAST_LAUNCH = True
    runs = {"n": 0}
    original = JITFunction.run

    def counted(self, *args, **kwargs):
        runs["n"] += 1
        return original(self, *args, **kwargs)

    differences = 0
    JITFunction.run = counted
    try:
        for round_ in range(4):  # the last with tensors passed as addresses
            _common.POINTERS_AS_INTS = round_ == 3
            _common.CACHE_TMA = round_ != 1
            runs["n"] = 0
            for name, fn in all_cases:
                got = _as_tuple(fn())
                if len(got) != len(want[name]) or not all(
                        _same_bits(g, w) for g, w in zip(got, want[name])):
                    differences += 1
                    print(f"DIFFERS (round {round_}): {name}")
    finally:
        JITFunction.run = original
        _common.FAST_LAUNCH, _common.POINTERS_AS_INTS, _common.CACHE_TMA = _DEFAULTS
    print(f"{len(all_cases)} cases x 4 rounds with the fast path: {differences} differ from the "
          f"normal path; JITFunction.run calls in the last round: {runs['n']}")
    return differences, runs["n"]


def host_table(dev, calls: int) -> list[dict]:
    h = torch.float16
    r = lambda *s: torch.randn(*s, device=dev, dtype=h)  # noqa: E731
    x, y, z = r(4096), r(4096), r(4096)
    s, w, b, dy = r(8, 1024), r(1024), r(1024), r(8, 1024)
    sg, wg, bg = (t.clone().requires_grad_() for t in (s, w, b))
    xs, vs = r(1, 64, 64), r(1, 64, 64)
    xm, wm, bm = r(64, 64), r(64, 64), r(64)
    p = torch.empty(16, device=dev)
    q, k, v = r(1, 2, 128, 64), r(1, 2, 128, 64), r(1, 2, 128, 64)
    qd, kd, vd = r(1, 32, 1, 128), r(1, 8, 4096, 128), r(1, 8, 4096, 128)
    stats = ln._fused_forward(s, w, b, 1e-5, None, None, None)[1]
    ops = [
        ("raw launch, 1 arg", lambda: _noop1[(1,)](p, BLOCK=16)),
        ("raw launch, 10 args", lambda: _noop10[(1,)](p, p, p, p, p, 1, 2, 3, 4, 0.5, BLOCK=16)),
        ("add_mul 4096", lambda: kernels.add_mul(x, y, z)),
        ("softmax 8x1024", lambda: kernels.softmax(s)),
        ("layer_norm 8x1024", lambda: kernels.layer_norm(s, w, b)),
        ("layer_norm fwd+bwd 8x1024", lambda: torch.autograd.grad(
            kernels.layer_norm(sg, wg, bg), (sg, wg, bg), dy)),
        ("LN backward kernels only 8x1024", lambda: lnb.backward(
            dy, s, w, stats, True, True, None, None, None)),
        ("softmax_matmul 1x64x64x64", lambda: kernels.softmax_matmul(xs, vs)),
        ("matmul_softmax 64^3", lambda: kernels.matmul_softmax(xm, wm, bm)),
        ("linear_act 64^3 gelu", lambda: kernels.linear_act(xm, wm, bm)),
        ("attention 1x2x128x64", lambda: kernels.attention(q, k, v)),
        ("attention decode 1x32x1, kv 8x4096", lambda: kernels.attention(qd, kd, vd)),
    ]
    raw10 = None
    rows = []
    print(f"{'op (fp16)':34s} {'fast off us':>12s} {'fast on us':>11s} {'+ int ptrs':>11s} "
          f"{'no TMA cache':>12s} {'default / raw10':>15s}")
    for name, fn in ops:
        timings = {}
        for mode in ("off", "on", "ints", "no_tma_cache"):
            _common.FAST_LAUNCH = mode != "off"
            _common.POINTERS_AS_INTS = mode == "ints"
            _common.CACHE_TMA = mode != "no_tma_cache"
            timings[mode] = host_us(fn, calls)
        _common.FAST_LAUNCH, _common.POINTERS_AS_INTS, _common.CACHE_TMA = _DEFAULTS
        if name == "raw launch, 10 args":
            raw10 = timings["off"]
        default = timings["ints" if _DEFAULTS[1] else "on"]
        ratio = default / raw10 if raw10 and not name.startswith("raw") else None
        print(f"{name:34s} {timings['off']:12.1f} {timings['on']:11.1f} {timings['ints']:11.1f} "
              f"{timings['no_tma_cache']:12.1f} {'' if ratio is None else f'{ratio:15.2f}'}",
              flush=True)
        rows.append(dict(op=name, fast_off_us=timings["off"], fast_on_us=timings["on"],
                         fast_on_int_pointers_us=timings["ints"],
                         fast_on_no_tma_cache_us=timings["no_tma_cache"], default_over_raw10=ratio))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m triton_fusion_report.analysis.fast_launch_check",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=400, help="calls a timed batch")
    ap.add_argument("--out", help="also write the host-cost table to this CSV file")
    ap.add_argument("--skip-bits", action="store_true", help="only the timings")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("fast_launch_check needs a GPU", file=sys.stderr)
        return 1
    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}"
          f"  fast launch {'on' if _common.FAST_LAUNCH else 'off'} by default")
    bad = False
    if not args.skip_bits:
        differences, late_runs = check_same_bits(dev)
        bad = differences > 0 or late_runs > 0
    rows = host_table(dev, args.calls)
    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
