"""`python -m analysis.fingerprint --out F.json`: what every Triton implementation launches and
returns on every smoke configuration, to show that a refactoring changed nothing.

For each family's smoke grid, each Triton variant runs once on inputs drawn from a fixed seed; the
fingerprint records every kernel launch (kernel, grid, num_warps, num_stages, the scalar and
constexpr arguments, the shapes and strides of the tensor arguments) and a hash of the output's
bytes. `--compare A.json B.json` lists every difference (exit 1 if any). `--time` adds the per-call
median of one configuration per family (the largest smoke size), host path included.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys

import torch


def _describe(value):
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}:{value.stride()}:{str(value.dtype)[6:]}"
    if isinstance(value, (int, float, bool, str)) or value is None:
        return value
    return type(value).__name__


def _record_launches(log: list):
    """Patch JITFunction.run so that every launch is appended to `log`; returns the undo."""
    from triton.runtime.jit import JITFunction

    original = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        if not warmup:
            g = grid(kwargs) if callable(grid) else grid
            log.append(dict(kernel=self.fn.__name__, grid=list(g),
                            args=[_describe(a) for a in args],
                            kwargs={k: _describe(v) for k, v in sorted(kwargs.items())}))
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    JITFunction.run = run
    return lambda: setattr(JITFunction, "run", original)


def _digest(out) -> str:
    if isinstance(out, (tuple, list)):
        return "+".join(_digest(o) for o in out)
    data = out.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def fingerprint(device: torch.device, timed: bool) -> dict:
    from . import timing
    from .__main__ import FAMILIES

    result = {}
    for family, problems in FAMILIES.items():
        largest = None
        for i, problem in enumerate(problems("smoke")):
            torch.manual_seed(1000 + i)
            inputs = problem.make_inputs(device)
            for v in problem.variants:
                if not v.impl.startswith("triton"):
                    continue
                key = f"{family}/{problem.op}/{problem.dtype}/{problem.shape}/{v.impl}/" \
                      f"{v.variant}/{v.block}/{v.num_warps}"
                log: list = []
                undo = _record_launches(log)
                try:
                    out = v.fn(*inputs)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    entry = dict(launches=log, out=_digest(out))
                except Exception as exc:  # noqa: BLE001 - a refusal is behaviour too
                    entry = dict(launches=log, error=f"{type(exc).__name__}: {exc}")
                finally:
                    undo()
                result[key] = entry
                if timed and v.impl == "triton_fused" and v.sweep == "size" and "error" not in entry:
                    largest = (key, v.fn, inputs)
        if timed and largest is not None:
            key, fn, inputs = largest
            result[f"time/{key}"] = timing.bench(lambda: fn(*inputs), device)["ms_median"]
    return result


def compare(a: dict, b: dict) -> list[str]:
    diffs = [f"only in one: {k}" for k in sorted(set(a) ^ set(b)) if not k.startswith("time/")]
    for k in sorted(set(a) & set(b)):
        if k.startswith("time/"):
            continue
        if a[k] != b[k]:
            diffs.append(f"differs: {k}\n  before: {json.dumps(a[k])[:400]}\n  after:  "
                         f"{json.dumps(b[k])[:400]}")
    return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.fingerprint", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (json.load(open(p)) for p in args.compare)
        diffs = compare(a, b)
        print("\n".join(diffs) if diffs else f"identical: {len(a)} entries")
        for k in sorted(k for k in a if k.startswith("time/") and k in b):
            print(f"{k[5:]}: before {a[k] * 1e3:.1f} us, after {b[k] * 1e3:.1f} us, "
                  f"ratio {b[k] / a[k]:.3f}")
        return 1 if diffs else 0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result = fingerprint(device, args.time)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    print(f"{len(result)} entries -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
