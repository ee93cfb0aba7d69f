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
    kernels' fast launch path (kernels._launch.launch) skips JITFunction.run after a kernel's
    first launch, so it is off while recording."""
    from triton.runtime.jit import JITFunction

    from triton_fusion_report.kernels import _launch

    original, fast = JITFunction.run, _launch.FAST_LAUNCH
    _launch.FAST_LAUNCH = False

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
        _launch.FAST_LAUNCH = fast

    return undo


def _digest(out) -> str:
    if isinstance(out, (tuple, list)):
        return "+".join(_digest(o) for o in out)
    data = out.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def smoke_triton_calls(device: torch.device):
    """(key, fn, inputs) for every Triton implementation of every smoke configuration, with the
    seeds set so that the inputs are the same from run to run."""
    from triton_fusion_report.analysis.bench.families import PROBLEMS

    for family, problems in PROBLEMS.items():
        for i, problem in enumerate(problems("smoke")):
            torch.manual_seed(1000 + i)
            random.seed(1000 + i)  # scalar inputs
            inputs = problem.make_inputs(device)
            for v in problem.variants:
                if v.impl.startswith("triton"):
                    yield (f"{family}/{problem.op}/{problem.dtype}/{problem.shape}/{v.impl}/"
                           f"{v.variant}/{v.block}/{v.num_warps}", v.fn, inputs)


def _api_case(op, make, device):
    """fn(*inputs) -> (out, grads): the public op forward, then backward from a fixed dout."""
    def call(*inputs):
        leaves = [t.detach().requires_grad_() if isinstance(t, torch.Tensor) and t.is_floating_point()
                  else t for t in inputs]
        out = op(*leaves)
        dout = torch.randn(out.shape, generator=torch.Generator(device="cpu").manual_seed(7),
                           dtype=torch.float32).to(out)
        grads = torch.autograd.grad(out, [t for t in leaves if isinstance(t, torch.Tensor)
                                          and t.requires_grad], dout)
        return (out, *grads)
    return call


def public_op_calls(device: torch.device):
    """(key, fn, inputs) for every public op, forward and backward, on small fixed inputs with odd
    sizes (a strided view among them)."""
    from triton_fusion_report import kernels as K

    def r(*shape, dtype=torch.float32):
        return torch.randn(*shape, dtype=dtype).to(device)

    cases = {
        "add_mul": (K.add_mul, lambda: (r(1000), r(1000), r(1000))),
        "add_mul_scalar": (lambda x, y: K.add_mul(x, y, 1.5), lambda: (r(77), r(77))),
        "softmax": (K.softmax, lambda: (r(5, 300),)),
        "softmax_wide": (K.softmax, lambda: (r(2, 40000),)),
        "softmax_strided": (K.softmax, lambda: (r(6, 400)[:, :300],)),
        "layer_norm": (K.layer_norm, lambda: (r(7, 300), r(300), r(300))),
        "layer_norm_f16": (K.layer_norm, lambda: (r(3, 1000, dtype=torch.float16),
                                                   r(1000, dtype=torch.float16),
                                                   r(1000, dtype=torch.float16))),
        "softmax_matmul": (K.softmax_matmul, lambda: (r(2, 33, 40), r(2, 40, 19))),
        "attention": (K.attention, lambda: (r(1, 2, 37, 16, dtype=torch.float16),
                                            r(1, 2, 37, 16, dtype=torch.float16),
                                            r(1, 2, 37, 16, dtype=torch.float16))),
        "attention_causal": (lambda q, k, v: K.attention(q, k, v, causal=True),
                             lambda: tuple(r(1, 2, 45, 32, dtype=torch.float16)
                                           for _ in range(3))),
        "matmul_softmax": (K.matmul_softmax, lambda: (r(33, 70), r(70, 50), r(50))),
        "linear_act_gelu": (K.linear_act, lambda: (r(33, 40), r(40, 20), r(20))),
        "linear_act_relu": (lambda x, w, b: K.linear_act(x, w, b, activation="relu"),
                            lambda: (r(17, 48, dtype=torch.float16), r(48, 80, dtype=torch.float16),
                                     r(80, dtype=torch.float16))),
    }
    for i, (name, (op, make)) in enumerate(cases.items()):
        torch.manual_seed(2000 + i)
        yield f"api/{name}", _api_case(op, make, device), make()


def grid_plans() -> dict:
    """What the full grid's problems run, as the plans chose it: per problem, each variant's
    implementation, variant, block, warps and modelled bytes (no kernel is run)."""
    from triton_fusion_report.analysis.bench.families import PROBLEMS

    return {f"plan/{family}/{p.op}/{p.precision}/{sorted(p.shape.items())}":
            [[v.impl, v.variant, v.block, v.num_warps, v.sweep, v.bytes_impl] for v in p.variants]
            for family, problems in PROBLEMS.items() for p in problems("full")}


def fingerprint(device: torch.device) -> dict:
    result = grid_plans()
    for key, fn, inputs in [*smoke_triton_calls(device), *public_op_calls(device)]:
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
