"""Compile every Triton kernel as the smoke configurations launch it, for sm_90, without a GPU.

Triton's interpreter runs the kernels on the CPU but never compiles them, so an error only the
compiler raises (a global that is not a constexpr, a type the backend refuses, too much shared
memory) passes the CPU suite and fails on the GPU. This closes that gap in two steps:

    TRITON_INTERPRET=1 python tools/compile_check.py --record specs.json
    python tools/compile_check.py --compile specs.json

The first runs every smoke configuration of every Triton implementation through the interpreter
and writes down each launch: the kernel, its argument types, constexprs and launch options. The
second (no interpreter) compiles each distinct launch down to a cubin for sm_90 with Triton's
own compiler and the ptxas it ships, and lists the failures.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import torch

try:
    import triton_fusion_report  # noqa: F401 - PYTHONPATH=. (as the Makefile sets) or installed
except ImportError:  # run from a checkout without PYTHONPATH: the checkout's package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET = ("cuda", 90, 32)
OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion", "launch_cooperative_grid")
DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
          torch.int32: "i32", torch.int64: "i64", torch.int8: "i8", torch.uint8: "u8",
          torch.bool: "i1"}


def _describe(value):
    """A JSON description of a kernel argument: enough to rebuild its signature type."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if isinstance(value, torch.Tensor):
        return ["tensor", DTYPES[value.dtype]]
    if isinstance(value, TensorDescriptor):
        return ["desc", DTYPES[value.base.dtype], list(value.block_shape)]
    if isinstance(value, bool):
        return ["bool", value]
    if isinstance(value, int):
        return ["int", value]
    if isinstance(value, float):
        return ["float", value]
    if value is None:
        return ["none"]
    if isinstance(value, str):
        return ["str", value]
    return ["other", repr(value)]


def record(device=torch.device("cpu")) -> list[dict]:
    """Every distinct launch of the smoke configurations, under the interpreter."""
    from triton.runtime.interpreter import InterpretedFunction

    from fingerprint import smoke_triton_calls  # tools/fingerprint.py, beside this script

    seen, specs = set(), []
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        spec = dict(module=self.fn.__module__, kernel=self.fn.__name__,
                    args=[_describe(a) for a in args],
                    kwargs={k: _describe(v) for k, v in sorted(kwargs.items())})
        key = json.dumps(spec, sort_keys=True)
        if key not in seen:
            seen.add(key)
            specs.append(spec)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    try:
        for _, fn, inputs in smoke_triton_calls(device):
            try:
                fn(*inputs)
            except (ValueError, TypeError):
                pass  # a refusal launches nothing
        # What the sweeps' smoke grid does not run: the backward kernels, and LayerNorm's kernels
        # for rows past a register tile.
        from triton_fusion_report import kernels

        for n in (40, 20_000):
            x = torch.randn(2, n, requires_grad=True)
            w = torch.randn(n, requires_grad=True)
            kernels.layer_norm(x, w, w).sum().backward()
        kernels.softmax(torch.randn(5, 40, requires_grad=True)).sum().backward()
        kernels.softmax(torch.randn(3, 20_000, requires_grad=True)).sum().backward()
        for causal in (False, True):
            q = torch.randn(1, 2, 40, 64, dtype=torch.float16, requires_grad=True)
            kernels.attention(q, q, q, causal).sum().backward()
            # Views of one QKV projection (4-D descriptors), grouped heads, a KV cache.
            qkv = torch.randn(1, 40, 3, 2, 64, dtype=torch.float16)
            kernels.attention(*(qkv[:, :, i].transpose(1, 2) for i in range(3)), causal)
            kv = torch.randn(1, 1, 50, 64, dtype=torch.float16)
            kernels.attention(q.detach(), kv, kv, causal)
            # Decoding's split-key kernels at the GPU's blocks (one split stores directly).
            from triton_fusion_report.kernels.families.attention import decoding as flash_decoding

            for head_dim, block_n in ((64, 64), (128, 64), (256, 32)):
                q1 = torch.randn(1, 4, 1, head_dim, dtype=torch.float16)
                kv1 = torch.randn(1, 1, 130, head_dim, dtype=torch.float16)
                for splits in (1, 2):
                    flash_decoding.attention(q1, kv1, kv1, causal, 0.1, num_splits=splits,
                                             block_n=block_n, num_stages=3)
    finally:
        InterpretedFunction.run = original
    return specs + _gpu_block_variants(specs)


def _gpu_block_variants(specs: list[dict]) -> list[dict]:
    """The attention backward's launches again with the blocks the GPU uses (the interpreter's
    are small), at head_dim 64, 128 and 256."""
    from unittest import mock

    from triton_fusion_report.kernels.families.attention import backward as fab

    out = []
    for spec in specs:
        if spec["kernel"] not in ("_attn_bwd_dkdv", "_attn_bwd_dq"):
            continue
        for head_dim in (64, 128, 256):
            with mock.patch.object(fab, "interpreting", lambda: False):
                blocks = fab.default_blocks(head_dim)
            blocks = blocks["dkdv" if spec["kernel"] == "_attn_bwd_dkdv" else "dq"]
            kwargs = dict(spec["kwargs"], HEAD_DIM=["int", head_dim], BLOCK_D=["int", head_dim],
                          BLOCK_M=["int", blocks["block_m"]], BLOCK_N=["int", blocks["block_n"]],
                          num_warps=["int", blocks["num_warps"]],
                          num_stages=["int", blocks["num_stages"]])
            out.append(dict(spec, kwargs=kwargs))
    return out


def _signature(fn, spec):
    """(signature, constexprs, options) for triton.compile from a recorded launch."""
    values = dict(zip(fn.arg_names, spec["args"]))
    options = {}
    for k, v in spec["kwargs"].items():
        (options if k in OPTIONS else values)[k] = v
    signature, constexprs = {}, {}
    for p in fn.params:
        kind, *rest = values[p.name]
        if p.is_constexpr or kind in ("none", "str"):
            signature[p.name] = "constexpr"
            constexprs[p.name] = rest[0] if rest else None
        elif kind == "tensor":
            signature[p.name] = "*" + rest[0]
        elif kind == "desc":
            signature[p.name] = f"tensordesc<{rest[0]}[{','.join(map(str, rest[1]))}]>"
        elif kind == "bool":
            signature[p.name] = "i1"
        elif kind == "int":
            signature[p.name] = "i32" if -2**31 <= rest[0] < 2**31 else "i64"
        elif kind == "float":
            signature[p.name] = "fp32"
        else:
            raise TypeError(f"{p.name}: cannot type {values[p.name]}")
    return signature, constexprs, {k: v[1] for k, v in options.items()}


def compile_all(specs: list[dict]) -> list[str]:
    """Compile each recorded launch for sm_90; return the failures."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget(*TARGET)
    failures = []
    for spec in specs:
        fn = getattr(importlib.import_module(spec["module"]), spec["kernel"])
        name = f"{spec['module']}.{spec['kernel']}"
        try:
            signature, constexprs, options = _signature(fn, spec)
            # Options the compiler does not take (the co-operative launch is a launch option).
            options.pop("launch_cooperative_grid", None)
            src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
            triton.compile(src, target=target, options=options)
        except Exception as exc:  # noqa: BLE001 - every failure is listed
            failures.append(f"{name} {json.dumps(spec['kwargs'])}: {type(exc).__name__}: "
                            f"{str(exc)[:600]}")
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/compile_check.py",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", metavar="JSON", help="run the smoke configurations (interpreter)")
    ap.add_argument("--compile", metavar="JSON", help="compile the recorded launches for sm_90")
    args = ap.parse_args(argv)
    if args.record:
        specs = record()
        with open(args.record, "w") as f:
            json.dump(specs, f, indent=1)
        print(f"{len(specs)} distinct launches -> {args.record}")
    if args.compile:
        with open(args.compile) as f:
            specs = json.load(f)
        failures = compile_all(specs)
        print("\n".join(failures) if failures else f"all {len(specs)} launches compile for sm_90")
        return 1 if failures else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
