"""A CPU proxy of the public ops' per-call host cost (Python and Triton's launch path), no GPU.

    python tools/host_proxy.py [--calls N] [--check]

Their Python, and Triton's launch path down to the C launcher, without a GPU.

`simulated_gpu()` lets Triton's own JITFunction.run work on a machine without one: a stand-in
driver (device 0, a fake stream, an sm_90 target), and compiled kernels that are never compiled,
whose launcher records or drops the launch. Everything above the C launcher runs as on the GPU
(the binder, the cache key, the launch metadata, kernels._launch.launch), so the time per call of
a public op on tiny CPU tensors is its host cost minus the C launch and minus CUDA's allocator
(torch.empty on the CPU costs less than on CUDA). Two columns per op:
- `python`: every kernel launch a no-op (JITFunction.run returns at once), fast path off: the
  ops' own checks, plans and allocations;
- `with launch`: JITFunction.run for real (or the fast path of kernels._launch.launch, when that
  exists and is on) down to a no-op launcher.
Run the same file with PYTHONPATH at another checkout to compare (it imports only the package).
--check instead compares each op's launches with the fast path off and on (`check_fast_path`);
--check-public, with the fast path on and with Triton's public path alone, as on a Triton other than
the one kernels/_launch.py mirrors (`check_public_path`).
The tests use `simulated_gpu` to run `launch` against Triton's real run (tests/test_launch.py).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

try:
    import triton_fusion_report  # noqa: F401 - PYTHONPATH (here or another checkout), or installed
except ImportError:  # run from a checkout without PYTHONPATH: the checkout's package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class CudaLauncher:
    """Stands in for Triton's CudaLauncher (same name, attributes and __call__ as 3.6's), with a
    C `launch` that appends its arguments to `calls` (None: drops them)."""

    def __init__(self, options, calls, scratch=0):
        self.calls = calls
        self.global_scratch_size = scratch
        self.global_scratch_align = 1
        self.profile_scratch_size = 0
        self.profile_scratch_align = 1
        self.launch_cooperative_grid = bool(getattr(options, "launch_cooperative_grid", False))
        self.launch_pdl = False
        self.num_ctas = 1

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        # As 3.6's (a scratch buffer stands for an allocation).
        def allocate_scratch(size, align):
            if size > 0:
                return ("scratch", gridX * gridY * gridZ * self.num_ctas * size, align)
            return None

        global_scratch = allocate_scratch(self.global_scratch_size, self.global_scratch_align)
        profile_scratch = allocate_scratch(self.profile_scratch_size, self.profile_scratch_align)
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid,
                    self.launch_pdl, global_scratch, profile_scratch, *args)

    def launch(self, *args):
        if self.calls is not None:
            self.calls.append(args)


class _Driver:
    """Stands in for Triton's CUDA driver: device 0 (or `device`), stream 1000 + device."""

    def __init__(self):
        self.device = 0
        self.compiled = {}  # the compiled kernels by their `function`

    def get_current_device(self):
        return self.device

    def get_current_stream(self, device):
        return 1000 + device

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)


@contextlib.contextmanager
def simulated_gpu(calls=None, scratch=0):
    """JITFunction.run works without a GPU while active: the driver is a stand-in, and a kernel
    "compiles" to a CompiledKernel whose `key` is Triton's cache key and whose launcher appends
    each launch's arguments to `calls` (a list; None drops them): (grid x, y, z, stream,
    function, cooperative, pdl, global scratch, profile scratch, packed metadata, launch metadata,
    enter hook, exit hook, *kernel arguments), as CudaLauncher passes them to its C launch.
    scratch: the launchers' global scratch size (0: the fast path may call their `launch`
    directly). Yields the driver: set `.device` to switch devices; `.compiled` maps each launch's
    `function` to its compiled kernel (whose `.key` is Triton's cache key)."""
    from triton.compiler import CompiledKernel
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    fake = _Driver()

    class FakeCompiled(CompiledKernel):
        def __init__(self, key, device, options):
            self.key, self.device = key, device
            self.name, self.src = "fake", None  # (what the real launch_metadata reads)
            self.module = object()  # "loaded"
            self.function = len(fake.compiled) + 1  # a CUfunction handle: which kernel ran
            self.packed_metadata = (options.num_warps, 1, 0)
            self._run = CudaLauncher(options, calls, scratch)
            fake.compiled[self.function] = self

    def do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
        kernel_cache = self.device_caches[device][0]
        backend = self.device_caches[device][3]
        kernel_cache[key] = FakeCompiled(key, device, backend.parse_options(options.__dict__))
        return kernel_cache[key]

    previous_driver, previous_compile = driver._active, JITFunction._do_compile
    driver.set_active(fake)
    JITFunction._do_compile = do_compile
    try:
        yield fake
    finally:
        JITFunction._do_compile = previous_compile
        driver.set_active(previous_driver)


# ------------------------------------------------------------------------------------------------
# The proxy measurement


def _cases():
    """(name, fn) of each public op at the tiny sizes of analysis/bench/launch_cost.py, fp16, CPU."""
    import torch

    from triton_fusion_report import kernels

    torch.manual_seed(0)
    h = torch.float16
    r = lambda *s: torch.randn(*s, dtype=h)  # noqa: E731
    x, y, z = r(4096), r(4096), r(4096)
    s, w, b = r(8, 1024), r(1024), r(1024)
    sg, wg, bg = (t.clone().requires_grad_() for t in (s, w, b))
    dy = r(8, 1024)
    xs, vs = r(1, 64, 64), r(1, 64, 64)
    xm, wm, bm = r(64, 64), r(64, 64), r(64)
    q, k, v = r(1, 2, 128, 64), r(1, 2, 128, 64), r(1, 2, 128, 64)
    qkv = r(1, 128, 3, 2, 64)
    qd, kd, vd = r(1, 8, 1, 64), r(1, 2, 1024, 64), r(1, 2, 1024, 64)
    yield "add_mul 4096", lambda: kernels.add_mul(x, y, z)
    yield "add_mul 4096 scalar", lambda: kernels.add_mul(x, y, 0.5)
    yield "softmax 8x1024", lambda: kernels.softmax(s)
    yield "layer_norm 8x1024", lambda: kernels.layer_norm(s, w, b)
    yield "layer_norm fwd+bwd 8x1024", lambda: torch.autograd.grad(
        kernels.layer_norm(sg, wg, bg), (sg, wg, bg), dy)
    yield "softmax fwd+bwd 8x1024", lambda: torch.autograd.grad(kernels.softmax(sg), (sg,), dy)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    yield "attention fwd+bwd 1x2x128x64", lambda: torch.autograd.grad(
        kernels.attention(qg, kg, vg, causal=True), (qg, kg, vg), q)
    xg, wg2, bg2 = (t.clone().requires_grad_() for t in (xm, wm, bm))
    yield "linear_act fwd+bwd 64^3 gelu", lambda: torch.autograd.grad(
        kernels.linear_act(xg, wg2, bg2), (xg, wg2, bg2), xm)
    yield "softmax_matmul 1x64x64x64", lambda: kernels.softmax_matmul(xs, vs)
    yield "matmul_softmax 64^3", lambda: kernels.matmul_softmax(xm, wm, bm)
    yield "linear_act 64^3 gelu", lambda: kernels.linear_act(xm, wm, bm)
    yield "attention 1x2x128x64", lambda: kernels.attention(q, k, v)
    yield "attention 1x2x128x64 qkv views", lambda: kernels.attention(
        *(qkv[:, :, i].transpose(1, 2) for i in range(3)))
    yield "attention decode 1x8x1x1024, 2 kv", lambda: kernels.attention(qd, kd, vd)


def _us_per_call(fn, calls: int, batches: int = 25) -> float:
    """Microseconds a call: the fastest of `batches` batches of `calls` back-to-back calls (a
    shared CPU only ever adds time to deterministic Python)."""
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def measure(calls: int = 2000) -> list[tuple[str, float, float]]:
    """(op, python us, with-launch us) per case; see the module docstring."""
    if os.environ.get("TRITON_INTERPRET"):
        raise RuntimeError("host_proxy times the compiled kernels' path: unset TRITON_INTERPRET")
    from triton import knobs
    from triton.runtime.jit import JITFunction

    from triton_fusion_report.kernels import _launch

    # The kernels are JITFunctions (no interpreter at import); the checks take CPU tensors.
    knobs.runtime.interpret = True
    has_fast = hasattr(_launch, "launch")
    rows = []
    with simulated_gpu():
        run = JITFunction.run
        for name, fn in _cases():
            JITFunction.run = lambda self, *a, grid, warmup, **k: None
            fast = _launch.FAST_LAUNCH if has_fast else None
            if has_fast:
                _launch.FAST_LAUNCH = False
            try:
                python = _us_per_call(fn, calls)
            finally:
                JITFunction.run = run
                if has_fast:
                    _launch.FAST_LAUNCH = fast
            rows.append((name, python, _us_per_call(fn, calls)))
    return rows


def _describe(record):
    """A launch as the C launcher gets it, minus the launch metadata and hooks (None on the fast
    path, empty hook chains on Triton's): tensors by layout and 16-byte alignment, host tensor
    descriptors by their base's and their own fields."""
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    def arg(a):
        if isinstance(a, torch.Tensor):
            return ("tensor", tuple(a.shape), a.stride(), a.dtype, a.data_ptr() % 16 == 0)
        if isinstance(a, TensorDescriptor):
            return ("descriptor", arg(a.base), tuple(a.shape), tuple(a.strides),
                    tuple(a.block_shape), a.padding)
        return a

    return (record[:9], record[9], tuple(arg(a) for a in record[13:]))


def check_fast_path() -> list[str]:
    """For each public op (the proxy's cases), its launches with the fast path off, then on
    (after a warm-up call): the same kernels, grids, streams and arguments, and none through
    JITFunction.run. Returns the problems found. Tensors are passed as tensors here, to be
    described by their layouts (`_launch.POINTERS_AS_INTS` off); that their addresses, when
    passed instead, are the same tensors' is tests/test_launch.py's."""
    if os.environ.get("TRITON_INTERPRET"):
        raise RuntimeError("the kernels must be JITFunctions: unset TRITON_INTERPRET")
    from triton import knobs
    from triton.runtime.jit import JITFunction

    from triton_fusion_report.kernels import _launch

    knobs.runtime.interpret = True  # (the checks take CPU tensors)
    problems, calls, runs = [], [], []
    run = JITFunction.run

    def counted(self, *args, **kwargs):
        runs.append(self)
        return run(self, *args, **kwargs)

    as_ints = _launch.POINTERS_AS_INTS
    with simulated_gpu(calls):
        JITFunction.run = counted
        _launch.POINTERS_AS_INTS = False
        try:
            for name, fn in _cases():
                _launch.FAST_LAUNCH = False
                fn()
                calls.clear()
                fn()
                normal = [_describe(c) for c in calls]
                _launch.FAST_LAUNCH = True
                fn()
                calls.clear()
                runs.clear()
                fn()
                fast = [_describe(c) for c in calls]
                if fast != normal:
                    problems.append(f"{name}: fast path launches {fast} != {normal}")
                if runs:
                    problems.append(f"{name}: {len(runs)} launches through JITFunction.run "
                                    f"after warm-up ({', '.join(k.fn.__name__ for k in runs)})")
        finally:
            JITFunction.run = run
            _launch.FAST_LAUNCH = True
            _launch.POINTERS_AS_INTS = as_ints
    return problems


def check_public_path() -> list[str]:
    """For each public op (the proxy's cases, with one SM so that the matmuls read through host
    descriptors too), its launches after a warm-up with the fast path on, then with
    `_launch.MIRRORS_TRITON` false (what another Triton version gets): the same kernels, grids,
    streams and arguments; with the flag false every launch goes through JITFunction.run, and
    nothing that reads Triton's internals runs (the fast path's table, specialization_key, the
    unchecked descriptor builder). Returns the problems found."""
    if os.environ.get("TRITON_INTERPRET"):
        raise RuntimeError("the kernels must be JITFunctions: unset TRITON_INTERPRET")
    from triton import knobs
    from triton.runtime.jit import JITFunction

    from triton_fusion_report.kernels import _device, _launch

    knobs.runtime.interpret = True  # (the checks take CPU tensors)
    problems, calls, runs, internals, with_descriptors = [], [], [], [], []
    run = JITFunction.run

    def counted(self, *args, **kwargs):
        runs.append(self)
        return run(self, *args, **kwargs)

    class Table(dict):
        def get(self, *a):
            internals.append("the fast path's table")
            return super().get(*a)

    def spy(name):
        original = getattr(_launch, name)

        def spied(*a, **k):
            internals.append(name)
            return original(*a, **k)
        return spied

    saved = {name: getattr(_launch, name) for name in (
        "MIRRORS_TRITON", "FAST_LAUNCH", "POINTERS_AS_INTS", "_LAUNCHES", "specialization_key",
        "_unchecked_descriptor")}
    sms = _device.SM_COUNT_OVERRIDE
    with simulated_gpu(calls):
        JITFunction.run = counted
        _launch.POINTERS_AS_INTS = False  # tensors described by their layouts (check_fast_path)
        _launch.FAST_LAUNCH = True
        _launch._LAUNCHES = Table(_launch._LAUNCHES)
        for name in ("specialization_key", "_unchecked_descriptor"):
            setattr(_launch, name, spy(name))
        _device.SM_COUNT_OVERRIDE = 1
        try:
            for name, fn in _cases():
                _launch.MIRRORS_TRITON = True
                fn()
                calls.clear()
                internals.clear()
                fn()
                fast = [_describe(c) for c in calls]
                if "the fast path's table" not in internals:  # (else nothing is compared)
                    problems.append(f"{name}: the fast path was not tried")
                if "_unchecked_descriptor" in internals:
                    with_descriptors.append(name)
                _launch.MIRRORS_TRITON = False
                calls.clear()
                runs.clear()
                internals.clear()
                fn()
                public = [_describe(c) for c in calls]
                if public != fast:
                    problems.append(f"{name}: public path launches {public} != {fast}")
                if len(runs) != len(calls):
                    problems.append(f"{name}: {len(calls) - len(runs)} of {len(calls)} launches "
                                    "skipped JITFunction.run with MIRRORS_TRITON false")
                if internals:
                    problems.append(f"{name}: with MIRRORS_TRITON false, ran "
                                    f"{', '.join(sorted(set(internals)))}")
            if not with_descriptors:
                problems.append("no op built a host TensorDescriptor: the descriptors' public "
                                "path went unchecked")
        finally:
            JITFunction.run = run
            _device.SM_COUNT_OVERRIDE = sms
            for name, value in saved.items():
                setattr(_launch, name, value)
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/host_proxy.py",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000, help="calls a batch (25 batches)")
    ap.add_argument("--check", action="store_true",
                    help="instead: check that each op's launches take the fast path unchanged")
    ap.add_argument("--check-public", action="store_true",
                    help="instead: check that each op's launches are the same through Triton's "
                         "public path alone (another Triton version's)")
    args = ap.parse_args(argv)
    from triton_fusion_report.kernels import _checks, _launch

    if args.check_public:
        problems = check_public_path()
        print("\n".join(problems) or "public path: every op's launches as the fast path's, "
                                     "no internals read")
        return 1 if problems else 0
    if args.check:
        problems = check_fast_path()
        print("\n".join(problems) or "fast path: every op's launches as the normal path's")
        return 1 if problems else 0

    mode = ("fast launch " + ("on" if _launch.FAST_LAUNCH else "off")
            if hasattr(_launch, "launch") else "no fast launch in this checkout")
    print(f"{_checks.__file__}: {mode}")
    print(f"{'op (fp16, CPU proxy)':28s} {'python us':>10s} {'with launch us':>15s}")
    for name, python, full in measure(args.calls):
        print(f"{name:28s} {python:10.1f} {full:15.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
