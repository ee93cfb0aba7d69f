"""`python -m triton_fusion_report.analysis.bench.lm_head_front --out FILE.csv`: the LM head and
its loss (forward + backward, bf16), time against peak memory, on the GPU: our op at every
chunking it can take, and every peer (eager, torch.compile, Liger-Kernel, Apple's Cut
Cross-Entropy; max-autotune with `--max`), with and without a bias (Cut Cross-Entropy takes none).
The trade-off curve: a chunk of more rows runs its matmuls nearer their peak and holds more logits.
A tail step of `make bench` and `make reference` (analysis/bench/steps.py), run there without
max-autotune (minutes of tuning a shape; the book takes max-autotune's point from the sweep's LM
head rows).

One row per (shape, bias, impl, chunk rows): ms (median of a trial as the sweep times one: L2
flushed, events around each call), peak MiB above the inputs, the loss's and gradients' largest
relative error against float32 (`err`: Cut Cross-Entropy skips gradients it deems negligible,
by default), status and the reason where a peer is missing or fails; `default_chunk_rows`: the
rows per chunk our op takes when not told (its `default_chunk_rows`), always among those measured.
torch.compile compiles each (shape, bias) afresh with static shapes, as the sweep does.
"""
from __future__ import annotations

import argparse
import csv
import functools
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = [(8192, 768, 50257), (4096, 4096, 128256)]
DTYPE = torch.bfloat16
# Our op's chunkings: the tokens split in this many chunks of equal rows.
CHUNKS = (1, 2, 4, 8, 16, 32)


def _inputs(n, h, v, bias: bool, device):
    from .matmul_epilogue import _lce_inputs

    x, w, b, t = _lce_inputs(n, h, v, DTYPE, device)
    return x, w, (b if bias else None), t


def _grads(loss_fn):
    """(x, w, b, t) -> (loss, dx, dw[, db]): the loss and its gradients, as a training step."""
    def call(x, w, b, t):
        leaves = [a.detach().requires_grad_() for a in (x, w, b) if a is not None]
        loss = loss_fn(leaves[0], leaves[1], leaves[2] if b is not None else None, t)
        return (loss.detach(), *torch.autograd.grad(loss, leaves))
    return call


def _eager(x, w, b, t):
    return F.cross_entropy(F.linear(x, w, b).float(), t)


def default_rows(n: int, v: int) -> int:
    """The rows per chunk our op takes at (n tokens, v classes) when not told."""
    from ...kernels.families import linear_cross_entropy as lce

    return lce.default_chunk_rows(n, v, torch.empty((), dtype=DTYPE).element_size())


def chunk_rows(n: int, v: int) -> list[int]:
    """Our op's rows per chunk measured: n split in each of CHUNKS, and the default's."""
    rows = [-(-n // chunks) for chunks in CHUNKS]
    return sorted(set(rows) | {default_rows(n, v)}, reverse=True)


def _impls(n: int, v: int, bias: bool, most: bool) -> list[tuple[str, int | None, object]]:
    """(impl, chunk rows or None, call of x, w, b, t returning the loss and the gradients)."""
    from ...kernels.families import linear_cross_entropy as lce
    from .peers import liger_linear_cross_entropy
    from .sweep import MAX_AUTOTUNE

    out = [("torch_eager", None, _grads(_eager)),
           ("torch_compile", None, _grads(torch.compile(_eager, dynamic=False)))]
    if most:
        out.append(("torch_compile_max", None,
                    _grads(torch.compile(_eager, dynamic=False, mode=MAX_AUTOTUNE))))
    for rows in chunk_rows(n, v):  # the op's forward, which makes the gradients, at a chunking
        out.append(("triton_fused", rows, lambda x, w, b, t, rows=rows:
                    lce.triton_fused(x, w, t, b, chunk_rows=rows)))
    out.append(("liger", None, _grads(liger_linear_cross_entropy)))
    if not bias:
        out.append(("cce", None, _grads(_cce)))
    return out


def _cce(x, w, b, t):
    """Apple's Cut Cross-Entropy (peers.PINNED; its defaults: the mean, gradient filtering)."""
    from .peers import _need

    return _need("cce").linear_cross_entropy(x, w, t)


def _err(got, want) -> float:
    return max(((g.float() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
               for g, r in zip(got, want))


def preload() -> None:
    """What main imports, imported ahead (make bench starts this step's process before the
    sweep; analysis/bench/__main__.py)."""
    from ...kernels.families import linear_cross_entropy  # noqa: F401
    from . import peers, sweep  # noqa: F401


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m triton_fusion_report.analysis.bench.lm_head_front",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--shapes", type=int, default=len(SHAPES), help="the first N shapes")
    ap.add_argument("--max", action="store_true",
                    help="with torch.compile's max-autotune too (minutes of tuning a shape)")
    ap.add_argument("--no-max", dest="max", action="store_false",
                    help="without max-autotune (the default)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if not torch.cuda.is_available():
        print("lm_head_front needs a CUDA GPU; skipped")
        return 0
    from .machine import run_metadata
    from .peers import PINNED, Missing, label
    from .timing import bench, peak_mib

    device = torch.device("cuda")
    meta = run_metadata(device)
    rows = []
    for n, h, v in SHAPES[:args.shapes]:
        for bias in (True, False):
            torch._dynamo.reset()  # this shape's compiled graphs start from nothing (as the sweep)
            x, w, b, t = _inputs(n, h, v, bias, device)
            want = _grads(_eager)(*(a.float() if a is not None and a.is_floating_point()
                                     else a for a in (x, w, b, t)))  # float32's
            for impl, chunk, call in _impls(n, v, bias, args.max):
                row = dict(meta, tokens=n, hidden=h, vocab=v, bias=bias, impl=impl,
                           dtype=str(DTYPE).removeprefix("torch."), chunk_rows=chunk,
                           default_chunk_rows=default_rows(n, v), status="ok")
                t0 = time.perf_counter()
                try:
                    got = [g for g in call(x, w, b, t) if g is not None]
                    row["err"] = _err(got, want)
                    del got
                    once = functools.partial(call, x, w, b, t)
                    row["ms"] = bench(once, device)["ms_median"]
                    row["peak_mib"] = peak_mib(once, device)
                except torch.cuda.OutOfMemoryError as exc:
                    row.update(status="oom", error=str(exc).splitlines()[0][:300])
                except Missing as exc:  # a peer library not installed: as the sweep's rows
                    row.update(status="unsupported", error=str(exc)[:300])
                except Exception as exc:  # noqa: BLE001 - a failing peer is a row
                    row.update(status="error", error=f"{type(exc).__name__}: {exc}"[:300])
                if impl in PINNED and label(impl):
                    row["variant"] = label(impl)
                torch.cuda.empty_cache()
                rows.append(row)
                print(f"{n}x{h}x{v} bias={bias!s:5} {impl:18s} {chunk or '':>6} "
                      + (f"{row['ms']:8.2f} ms {row['peak_mib']:8.0f} MiB err {row['err']:.1e}"
                         if row["status"] == "ok" else f"{row['status']}: {row.get('error')}")
                      + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
                _write(args.out, rows)
            del x, w, b, t, want
            torch.cuda.empty_cache()
    return 0


def warm(device, _=None) -> None:
    """The first calls of main's implementations but eager (make bench's warming processes,
    analysis/bench/warm.py): torch.compile's graphs, our kernels and the peers' at each shape,
    with and without a bias, compiled into the disk caches (max-autotune: not run by the step)."""
    for n, h, v in SHAPES:
        for bias in (True, False):
            torch._dynamo.reset()
            x, w, b, t = _inputs(n, h, v, bias, device)
            calls = {}  # our kernels compile alike at every chunking: one call of ours
            for impl, _, call in _impls(n, v, bias, most=False):
                calls.setdefault(impl, call)
            for impl, call in calls.items():
                if impl != "torch_eager":
                    try:
                        call(x, w, b, t)
                    except Exception:  # noqa: BLE001 - main records what fails
                        pass
            del x, w, b, t
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
