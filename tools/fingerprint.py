"""What the Triton implementations launch and return on the smoke grid: a refactoring's check.

    python tools/fingerprint.py --out F.json
    python tools/fingerprint.py --compare BEFORE.json AFTER.json

For each family's smoke grid, each Triton variant runs once on inputs drawn from a fixed seed; the
fingerprint records every kernel launch (kernel, grid, num_warps, num_stages, the scalar and
constexpr arguments, the shapes and strides of the tensor arguments) and a hash of the output's
bytes. `--compare A.json B.json` lists every difference (exit 1 if any). An autotuned kernel's
benchmarking launches and its pick among near-equal configs depend on timings: compare its output.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

import torch

try:
    import triton_fusion_report  # noqa: F401 - PYTHONPATH=. (as the Makefile sets) or installed
except ImportError:  # run from a checkout without PYTHONPATH: the checkout's package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _describe(value):
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}:{value.stride()}:{str(value.dtype)[6:]}"
    if isinstance(value, (int, float, bool, str)) or value is None:
        return value
    return type(value).__name__


def _record_launches(log: list):
    """Patch JITFunction.run so that every launch is appended to `log`; returns the undo. The
    kernels' fast launch path (kernels._common.launch) skips JITFunction.run after a kernel's
    first launch, so it is off while recording."""
    from triton.runtime.jit import JITFunction

    from triton_fusion_report.kernels import _common

    original, fast = JITFunction.run, _common.FAST_LAUNCH
    _common.FAST_LAUNCH = False

    def run(self, *args, grid, warmup, **kwargs):
        if not warmup:
            g = grid(kwargs) if callable(grid) else grid
            log.append(dict(kernel=self.fn.__name__, grid=list(g),
                            args=[_describe(a) for a in args],
                            kwargs={k: _describe(v) for k, v in sorted(kwargs.items())}))
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    JITFunction.run = run

    def undo():
        JITFunction.run = original
        _common.FAST_LAUNCH = fast

    return undo


def _digest(out) -> str:
    if isinstance(out, (tuple, list)):
        return "+".join(_digest(o) for o in out)
    data = out.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def smoke_triton_calls(device: torch.device):
    """(key, fn, inputs) for every Triton implementation of every smoke configuration, with the
    seeds set so that the inputs are the same from run to run."""
    from triton_fusion_report.analysis.bench.families import FAMILIES

    for family, problems in FAMILIES.items():
        for i, problem in enumerate(problems("smoke")):
            torch.manual_seed(1000 + i)
            random.seed(1000 + i)  # scalar inputs
            inputs = problem.make_inputs(device)
            for v in problem.variants:
                if v.impl.startswith("triton"):
                    yield (f"{family}/{problem.op}/{problem.dtype}/{problem.shape}/{v.impl}/"
                           f"{v.variant}/{v.block}/{v.num_warps}", v.fn, inputs)


def fingerprint(device: torch.device) -> dict:
    result = {}
    for key, fn, inputs in smoke_triton_calls(device):
        log: list = []
        undo = _record_launches(log)
        try:
            out = fn(*inputs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            entry = dict(launches=log, out=_digest(out))
        except Exception as exc:  # noqa: BLE001 - a refusal is behaviour too
            entry = dict(launches=log, error=f"{type(exc).__name__}: {exc}")
        finally:
            undo()
        result[key] = entry
    return result


def compare(a: dict, b: dict) -> list[str]:
    diffs = [f"only in one: {k}" for k in sorted(set(a) ^ set(b))]
    for k in sorted(set(a) & set(b)):
        if a[k] != b[k]:
            diffs.append(f"differs: {k}\n  before: {json.dumps(a[k])[:400]}\n  after:  "
                         f"{json.dumps(b[k])[:400]}")
    return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/fingerprint.py",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (json.load(open(p)) for p in args.compare)
        diffs = compare(a, b)
        print("\n".join(diffs) if diffs else f"identical: {len(a)} entries")
        return 1 if diffs else 0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result = fingerprint(device)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    print(f"{len(result)} entries -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
