"""kernels._launch.launch: the fast launch path, checked on the CPU against Triton's own
JITFunction.run (real binder, cache key, launch arguments; only the compiler and the C launcher
are stand-ins: tools/host_proxy.py's simulated_gpu); and the public path every piece of
kernels/_launch.py that reads Triton's internals falls back to on another Triton version
(MIRRORS_TRITON false)."""
import collections
import itertools
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton.language as tl
from triton import knobs
from triton.runtime.jit import JITFunction

from triton_fusion_report import kernels
from triton_fusion_report.kernels import _device, _launch

from conftest import tool

simulated_gpu = tool("host_proxy").simulated_gpu


def test_the_installed_triton_is_the_one_the_fast_path_mirrors():
    """The fast path re-implements Triton 3.6's JITFunction.run; under another version every
    launch silently takes Triton's own (slower) path. This fails instead, with what to do."""
    import triton

    assert _launch.MIRRORS_TRITON, (
        f"Triton {triton.__version__} is installed; kernels/_launch.py mirrors Triton 3.6's "
        "launch path (specialization_key, launch) and TensorDescriptor, so every launch now "
        "takes Triton's normal path and every host descriptor its checked constructor (correct, "
        "11-19 us a call slower). Install triton==3.6.* (requirements.txt), or port what the "
        "comment atop kernels/_launch.py lists to this version and update `mirrors`.")


def _toy(x_ptr, y_ptr, n, m, scale, flag, BLOCK: tl.constexpr, MODE: tl.constexpr):
    pass


def _toy_unspecialised(x_ptr, n, m, BLOCK: tl.constexpr):
    pass


def _mixed_order(x_ptr, BLOCK: tl.constexpr, n):
    pass


def _buffer(dtype, byte_offset):
    """A CPU tensor whose data_ptr() is `byte_offset` bytes past a 64-byte boundary."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    base = torch.zeros(4096, dtype=dtype)
    skip = (-base.data_ptr() % 64 + byte_offset) // itemsize
    t = base[skip:skip + 64]
    assert t.data_ptr() % 64 == byte_offset
    return t


TENSORS = [_buffer(dt, off) for dt in (torch.float16, torch.float32, torch.bfloat16, torch.int32)
           for off in (0, 4, 8, 16, 32) if off % torch.empty((), dtype=dt).element_size() == 0]
INTS = [0, 1, 2, 15, 16, 17, 32, 48, -1, -16, -17, 2**31 - 1, 2**31 - 16, 2**31, 2**31 + 16,
        -2**31, -2**31 - 16, 2**32, 2**63 - 16, 2**63 - 1, 2**63, 2**63 + 16, 2**64 - 16,
        2**64 - 1]
SCALARS = INTS + [0.5, 1.0, 16.0, -0.0, True, False, None]


def _triton_key(kernel, args, kwargs, device=0):
    """The key JITFunction.run looks the compiled kernel up by, for this call."""
    from triton.runtime.jit import compute_cache_key

    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    _, key_cache, _, _, binder = kernel.device_caches[device]
    _, specialization, options = binder(*args, **kwargs)
    return compute_cache_key(key_cache, specialization, options)


@pytest.fixture
def gpu():
    calls = []
    with simulated_gpu(calls) as fake:
        fake.calls = calls
        yield fake


@pytest.fixture
def count_runs(monkeypatch):
    """How many calls went through JITFunction.run (the normal path)."""
    counter = {"runs": 0}
    run = JITFunction.run

    def counted(self, *args, **kwargs):
        counter["runs"] += 1
        return run(self, *args, **kwargs)

    monkeypatch.setattr(JITFunction, "run", counted)
    return counter


def test_equal_keys_mean_equal_triton_specialisations(gpu):
    """Over pointers of every dtype and alignment and ints on both sides of every boundary
    Triton specialises on (1, multiples of 16, the i32/i64/u64 ranges), floats, bools and None:
    calls with equal `specialization_key` always have equal Triton keys."""
    kernels = [JITFunction(_toy), JITFunction(_toy, do_not_specialize=["n"]),
               JITFunction(_toy_unspecialised, do_not_specialize_on_alignment=["x_ptr"])]
    rng = random.Random(0)
    for kernel in kernels:
        n_runtime = sum(not p.is_constexpr for p in kernel.params)
        triton_keys_of = {}
        calls = [(rng.choice(TENSORS),) + tuple(rng.choice(TENSORS + SCALARS)
                                                 for _ in range(n_runtime - 1))
                 for _ in range(1500)]
        calls += [(t, *(i,) * (n_runtime - 1)) for t in TENSORS for i in INTS]
        for args in calls:
            kwargs = {c.name: 64 for c in kernel.params if c.is_constexpr}
            try:
                triton_key = _triton_key(kernel, args, kwargs)
            except (OverflowError, TypeError):  # what Triton refuses, launch leaves to Triton
                continue
            key = _launch.specialization_key(args)
            assert key is not None
            triton_keys_of.setdefault(key, set()).add(triton_key)
        assert all(len(keys) == 1 for keys in triton_keys_of.values()), [
            keys for keys in triton_keys_of.values() if len(keys) > 1]
        # The calls did reach the distinctions (else the check above would be empty).
        assert len(set().union(*triton_keys_of.values())) > 20


def test_the_key_separates_what_triton_separates():
    aligned, unaligned = _buffer(torch.float16, 0), _buffer(torch.float16, 8)
    assert _launch.specialization_key((aligned,)) != _launch.specialization_key((unaligned,))
    assert _launch.specialization_key((aligned,)) != _launch.specialization_key((aligned.float(),))
    distinct = {_launch.specialization_key((i,)) for i in (1, 16, 17, 2**31, 2**31 + 1, 2**63)}
    assert len(distinct) == 6
    assert _launch.specialization_key((1.0,)) == _launch.specialization_key((16.0,))  # fp32 either way
    assert _launch.specialization_key((True,)) != _launch.specialization_key((1,))
    assert _launch.specialization_key(("text",)) is None
    assert _launch.specialization_key((2**64,)) is None and _launch.specialization_key((-2**63 - 1,)) is None


def _check_launches(gpu, kernel, calls):
    """Each recorded launch ran the compiled kernel of its call's Triton key, with the grid, the
    stream and the arguments JITFunction.run passes (every parameter's value, in order)."""
    assert len(gpu.calls) == len(calls)
    for record, (device, grid, args, kwargs) in zip(gpu.calls, calls):
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        assert record[:4] == grid3 + (1000 + device,)
        compiled = gpu.compiled[record[4]]
        assert compiled.key == _triton_key(kernel, args, kwargs, device)
        assert compiled.device == device
        assert record[9] == compiled.packed_metadata
        constexprs = [kwargs[p.name] for p in kernel.params if p.is_constexpr]
        assert _addresses(record[13:]) == _addresses(args) + constexprs


def _addresses(values):
    """values with each tensor as its address: the C launcher takes either for a pointer
    (the fast path passes addresses: _launch.POINTERS_AS_INTS)."""
    return [v.data_ptr() if isinstance(v, torch.Tensor) else v for v in values]


def _variants():
    """(device, args, kwargs) of _toy: a base call and calls that differ from it in one or two of
    the things Triton specialises on, so that a key missing any of them maps two of them to one
    compiled kernel."""
    f16, f32 = torch.float16, torch.float32
    base = (0, (_buffer(f16, 0), _buffer(f16, 32), 64, 17, 0.5, True),
            dict(BLOCK=16, MODE="a", num_warps=4))
    one_change = [
        lambda d, a, k: (1, a, k),  # another device
        lambda d, a, k: (d, (_buffer(f16, 8),) + a[1:], k),  # not 16-byte aligned
        lambda d, a, k: (d, (_buffer(f16, 4),) + a[1:], k),
        lambda d, a, k: (d, a[:1] + (_buffer(f32, 32),) + a[2:], k),  # another dtype
        lambda d, a, k: (d, a[:2] + (1,) + a[3:], k),  # an int equal to 1
        lambda d, a, k: (d, a[:2] + (65,) + a[3:], k),  # not divisible by 16
        lambda d, a, k: (d, a[:2] + (2**31,) + a[3:], k),  # i64
        lambda d, a, k: (d, a[:2] + (2**63,) + a[3:], k),  # u64
        lambda d, a, k: (d, a[:3] + (16,) + a[4:], k),
        lambda d, a, k: (d, a[:5] + (7,), k),  # an int for a bool
        lambda d, a, k: (d, a, dict(k, BLOCK=32)),  # a constexpr
        lambda d, a, k: (d, a, dict(k, MODE="b")),
        lambda d, a, k: (d, a, dict(k, num_warps=8)),  # an option
        lambda d, a, k: (d, a, dict(k, num_stages=2)),
    ]
    calls = [base] + [change(*base) for change in one_change]
    calls += [second(*first(*base)) for first, second in itertools.combinations(one_change, 2)]
    return calls


@pytest.mark.parametrize("scratch", [0, 64])
def test_launch_runs_the_kernel_triton_would_with_the_arguments_it_would(count_runs, scratch):
    """Calls in random order, each a variant of one base call (_variants), grids of 1 to 3 dims;
    a launcher with global scratch (scratch=64) cannot be called directly and goes through its
    __call__."""
    kernel = JITFunction(_toy)
    rng = random.Random(1)
    pool = _variants()
    calls, gpu_calls = [], []
    with simulated_gpu(gpu_calls, scratch=scratch) as gpu:
        gpu.calls = gpu_calls
        for _ in range(1000):
            gpu.device, args, kwargs = rng.choice(pool)
            grid = rng.choice([(3,), (2, 5), (1, 2, 3)])
            calls.append((gpu.device, grid, args, kwargs))
            compiled = _launch.launch(kernel, grid, *args, **kwargs)
            assert compiled is gpu.compiled[gpu_calls[-1][4]]
        _check_launches(gpu, kernel, calls)
        if scratch:
            assert all(record[7] is not None for record in gpu_calls)
    # Each distinct variant went through JITFunction.run once; the other calls skipped it, and
    # passed the tensors' addresses (by default) instead of the tensors.
    distinct = {(d, _launch.specialization_key(a), tuple(k.items())) for d, a, k in pool}
    assert count_runs["runs"] == len(distinct) > 60
    with_tensors = sum(any(isinstance(a, torch.Tensor) for a in r[13:]) for r in gpu_calls)
    assert with_tensors == (count_runs["runs"] if _launch.POINTERS_AS_INTS else len(gpu_calls))


def _one_call(kernel):
    return (_buffer(torch.float16, 0), _buffer(torch.float16, 0), 64, 17, 0.5, True), dict(
        BLOCK=16, MODE="a", num_warps=4)


def test_launch_takes_the_normal_path_for_anything_unusual(gpu, count_runs, monkeypatch):
    kernel = JITFunction(_toy)
    args, kwargs = _one_call(kernel)
    _launch.launch(kernel, (1,), *args, **kwargs)
    _launch.launch(kernel, (1,), *args, **kwargs)
    assert count_runs["runs"] == 1  # the second call was fast

    def runs_of(fn):
        before = count_runs["runs"]
        fn()
        return count_runs["runs"] - before

    def call(*a, **k):
        return lambda: _launch.launch(kernel, *a, **k)

    # A launch hook (Triton's profiler adds its hooks so), a pre-run hook, debug mode.
    seen = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        assert runs_of(call((1,), *args, **kwargs)) == 1
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    kernel.pre_run_hooks.append(lambda *a, **k: None)
    assert runs_of(call((1,), *args, **kwargs)) == 1
    kernel.pre_run_hooks.clear()
    monkeypatch.setattr(knobs.runtime, "debug", True)
    assert runs_of(call((1,), *args, **kwargs)) == 1
    monkeypatch.setattr(knobs.runtime, "debug", False)
    # Switched off; a list grid; a constexpr passed by position; an argument the key does not
    # handle (a tuple: Triton's to specialise).
    monkeypatch.setattr(_launch, "FAST_LAUNCH", False)
    assert runs_of(call((1,), *args, **kwargs)) == 1
    monkeypatch.setattr(_launch, "FAST_LAUNCH", True)
    assert runs_of(call([1], *args, **kwargs)) == 1
    assert runs_of(call((1,), *args, 16, MODE="a", num_warps=4)) == 1
    assert runs_of(call((1,), *args[:-1], (16, 3), **kwargs)) == 1
    # Back to plain: fast again.
    assert runs_of(call((1,), *args, **kwargs)) == 0
    assert len(gpu.calls) == 10


def test_a_changed_global_goes_back_through_triton(gpu, count_runs):
    """JITFunction.run raises when a global the kernel read has changed since it compiled; the
    fast path must not hide that."""
    kernel = JITFunction(_toy)
    args, kwargs = _one_call(kernel)
    g = {"LIMIT": 4}
    kernel.used_global_vals = {("LIMIT", id(g)): (4, g)}
    _launch.launch(kernel, (1,), *args, **kwargs)
    kernel.used_global_vals = {("LIMIT", id(g)): (4, g)}  # (the first compile set its own)
    _launch.launch(kernel, (1,), *args, **kwargs)
    runs = count_runs["runs"]
    _launch.launch(kernel, (1,), *args, **kwargs)
    assert count_runs["runs"] == runs  # fast
    g["LIMIT"] = 5
    with pytest.raises(RuntimeError, match="Global variable LIMIT has changed"):
        _launch.launch(kernel, (1,), *args, **kwargs)


def test_kernels_whose_constexprs_are_not_last_keep_the_normal_path(gpu, count_runs):
    kernel = JITFunction(_mixed_order)
    x = _buffer(torch.float32, 0)
    for _ in range(3):
        _launch.launch(kernel, (1,), x, n=16, BLOCK=32)
    assert count_runs["runs"] == 3


def test_interpreted_kernels_take_the_normal_path(device):
    if device.type == "cuda":
        pytest.skip("the interpreter's kernels")
    from triton_fusion_report.kernels.families import add_mul as elementwise

    x = torch.ones(8, device=device)
    elementwise.triton_fused(x, x, 2.0)
    state = _launch._LAUNCHES.get(id(elementwise._add_mul_kernel))
    if not (_launch.MIRRORS_TRITON and _launch.FAST_LAUNCH):
        assert state is None  # (launch never looked)
    else:
        assert state.n_runtime == -1 and not state.compiled


def test_a_full_table_empties_and_refills(gpu, count_runs, monkeypatch):
    monkeypatch.setattr(_launch, "FAST_LAUNCH_MAX_ENTRIES", 2)
    kernel = JITFunction(_toy)
    args, kwargs = _one_call(kernel)
    for block in (16, 32, 64, 16, 32, 64):
        _launch.launch(kernel, (1,), *args, **dict(kwargs, BLOCK=block))
        assert len(_launch._LAUNCHES[id(kernel)].compiled) <= 2
    assert count_runs["runs"] == 6
    calls = [(0, (1,), args, dict(kwargs, BLOCK=b)) for b in (16, 32, 64, 16, 32, 64)]
    _check_launches(gpu, kernel, calls)


def test_every_public_op_takes_the_fast_path_with_the_normal_paths_arguments():
    """In a process where the kernels are JITFunctions (no interpreter), under simulated_gpu:
    each public op's launches after a warm-up call skip JITFunction.run and pass the C launcher
    what the normal path passes (tools/host_proxy.py --check)."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, str(root / "tools" / "host_proxy.py"), "--check"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


def test_cached_tma_descriptors_are_what_tritons_wrapper_passes(monkeypatch):
    """A kernel with host TensorDescriptor arguments: launch expands them as Triton 3.6's own
    wrapper (wrap_handle_tensordesc) does, encoding each (address, shape, strides, padding) once."""
    nv = pytest.importorskip("triton.backends.nvidia.driver")
    from triton.runtime.driver import driver
    from triton.tools.tensor_descriptor import TensorDescriptor

    encoded = []

    class Utils:
        @staticmethod
        def fill_tma_descriptor(ptr, swizzle, elem_size, elem_type, block, shape, strides, pad):
            encoded.append(ptr)
            return ("tma", ptr, swizzle, elem_size, elem_type, tuple(block), tuple(shape),
                    tuple(strides), pad)

    class Fake:
        utils = Utils()

    previous = driver._active
    driver.set_active(Fake())
    try:
        passed = []
        signature = {"Q": "tensordesc<fp16[64, 32]>", "n": "i32",
                     "K": "tensordesc<fp16[16, 32]>", "B": "constexpr"}
        metas = [dict(swizzle=128, elem_size=2, elem_type=1, block_size=[64, 32],
                      fp4_padded=False),
                 dict(swizzle=64, elem_size=2, elem_type=1, block_size=[16, 32],
                      fp4_padded=False)]
        wrapped = nv.wrap_handle_tensordesc(lambda *a: passed.append(a), signature, metas)
        c_launch, descs = _launch._unwrap_tensordesc(wrapped)
        assert [i for i, _ in descs] == [2, 0]
        entry = type("Entry", (), {"tma": {}})()
        base = tuple(range(13))
        a, b = torch.randn(128, 32, dtype=torch.float16), torch.randn(256, 32, dtype=torch.float16)

        def descs_of(t, u):
            return (TensorDescriptor(t, list(t.shape), list(t.stride()), [64, 32]),
                    TensorDescriptor(u, list(u.shape), list(u.stride()), [16, 32]))

        for t, u in ((a, b), (a, b), (b[:128], a), (a, b[:200])):
            q, k = descs_of(t, u)
            wrapped(*base, q, 7, k, 16)
            args = [q, 7, k, 16]
            for i, meta in descs:
                args[i:i + 1] = _launch._tma_args(entry, i, args[i], meta)
            c_launch(*base, *args)
            assert passed[-1] == passed[-2]
        # Triton's wrapper encoded 8 descriptors; the cache 5: (a, b) twice is one pair, a as K
        # is not a as Q (another block shape), a as Q once more is.
        assert len(encoded) == 8 + 5
    finally:
        driver.set_active(previous)


# ------------------------------------------------------------------------------------------------
# Another Triton: MIRRORS_TRITON false sends every piece that reads Triton 3.6's internals to
# Triton's public path (kernel[grid](...), TensorDescriptor(...)).

# The code of kernels/_launch.py that reads Triton's internals, as `internals_ran` counts it: the
# fast path's table (every launch that tries the fast path looks there first) and the functions.
INTERNALS = ("_LAUNCHES", "specialization_key", "_Launches", "_unwrap_tensordesc", "_tma_args",
             "_unchecked_descriptor")


@pytest.fixture
def internals_ran(monkeypatch):
    """Counts calls, by name: into INTERNALS, into the public launch (`_fitted`: kernel[grid]) and
    into TensorDescriptor's own checks (`TensorDescriptor.__post_init__`: its constructor)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    counts = collections.Counter()

    class Table(dict):
        def get(self, *a):
            counts["_LAUNCHES"] += 1
            return super().get(*a)

    monkeypatch.setattr(_launch, "_LAUNCHES", Table(_launch._LAUNCHES))
    for name in INTERNALS[1:] + ("_fitted",):
        def spied(*a, _name=name, _original=getattr(_launch, name), **k):
            counts[_name] += 1
            return _original(*a, **k)

        monkeypatch.setattr(_launch, name, spied)
    post_init = TensorDescriptor.__post_init__

    def checked(self):
        counts["TensorDescriptor.__post_init__"] += 1
        post_init(self)

    monkeypatch.setattr(TensorDescriptor, "__post_init__", checked)
    return counts


def test_the_flag_is_the_version_check():
    assert all(map(_launch.mirrors, ("3.6.0", "3.6.1", "3.6.0+git1a2b3c4", "3.6.0.dev0")))
    assert not any(map(_launch.mirrors, ("3.5.1", "3.7.0", "4.0.0", "3.60.0", "2.3.6")))


def test_another_triton_version_gets_the_public_path_from_import(device):
    """A process whose Triton reports another version decides MIRRORS_TRITON false at import, and
    its ops run (a fresh process: the flag is decided once, when kernels/_launch.py loads)."""
    root = Path(__file__).resolve().parent.parent
    code = f"""
import torch, triton
triton.__version__ = "3.7.0"
from triton_fusion_report import kernels
from triton_fusion_report.kernels import _launch
assert _launch.MIRRORS_TRITON is False
x = torch.randn(3, 40, device="{device}")
torch.testing.assert_close(kernels.softmax(x), torch.softmax(x, -1))
q = torch.randn(1, 2, 24, 16, device="{device}", dtype=torch.float16)
want = torch.softmax((q.float() @ q.float().transpose(-1, -2)) / 4, -1) @ q.float()
torch.testing.assert_close(kernels.attention(q, q, q).float(), want, atol=2e-3, rtol=2e-3)
assert not _launch._LAUNCHES
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.stdout + done.stderr)[-4000:]


def test_the_environment_switch_sends_launches_alone_to_the_public_path():
    """TRITON_FUSION_FAST_LAUNCH=0 (read at import, hence a fresh process; compiled kernels under
    simulated_gpu): every launch goes through JITFunction.run; the flag, and with it the
    descriptor builder, stays as the version decides."""
    root = Path(__file__).resolve().parent.parent
    code = """
import sys, torch
from triton.runtime.jit import JITFunction
from triton import knobs
sys.path.insert(0, sys.argv[1])
from host_proxy import simulated_gpu
from triton_fusion_report import kernels
from triton_fusion_report.kernels import _launch
assert _launch.FAST_LAUNCH is False and _launch.MIRRORS_TRITON is True
knobs.runtime.interpret = True  # (the checks take CPU tensors)
runs, calls, run = [], [], JITFunction.run
JITFunction.run = lambda self, *a, **k: runs.append(self) or run(self, *a, **k)
with simulated_gpu(calls):
    x = torch.randn(8, 1024, dtype=torch.float16)
    for _ in range(3):
        kernels.softmax(x)
assert len(runs) == len(calls) == 3 and not _launch._LAUNCHES, (len(runs), len(calls))
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(root), "TRITON_FUSION_FAST_LAUNCH": "0"}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", code, str(root / "tools")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.stdout + done.stderr)[-4000:]


def test_launch_takes_the_public_path_on_another_triton(gpu, count_runs, monkeypatch):
    """Every call through JITFunction.run, with what the fast path would have passed, and nothing
    kept for the kernel."""
    monkeypatch.setattr(_launch, "MIRRORS_TRITON", False)
    monkeypatch.setattr(_launch, "FAST_LAUNCH", True)
    kernel = JITFunction(_toy)
    args, kwargs = _one_call(kernel)
    for _ in range(3):
        _launch.launch(kernel, (1,), *args, **kwargs)
    assert count_runs["runs"] == 3 and id(kernel) not in _launch._LAUNCHES
    _check_launches(gpu, kernel, [(0, (1,), args, kwargs)] * 3)


def test_each_piece_that_reads_tritons_internals_checks_the_flag(monkeypatch):
    """Besides launch (above) and descriptor (below): each piece called alone takes the public
    answer with the flag false."""
    kernel = JITFunction(_toy)
    args, _ = _one_call(kernel)
    nv = pytest.importorskip("triton.backends.nvidia.driver")
    signature = {"Q": "tensordesc<fp16[64, 32]>", "B": "constexpr"}
    meta = [dict(swizzle=128, elem_size=2, elem_type=1, block_size=[64, 32], fp4_padded=False)]
    wrapped = nv.wrap_handle_tensordesc(lambda *a: None, signature, meta)
    assert _launch.specialization_key(args) is not None
    assert _launch._Launches(kernel).n_runtime == 6
    assert _launch._unwrap_tensordesc(wrapped) is not None
    monkeypatch.setattr(_launch, "MIRRORS_TRITON", False)
    assert _launch.specialization_key(args) is None  # "launch through Triton"
    assert _launch._Launches(kernel).n_runtime == -1  # never the fast path
    assert _launch._unwrap_tensordesc(wrapped) is None  # Triton's wrapper encodes


def test_descriptor_uses_tensordescriptors_constructor_on_another_triton(monkeypatch,
                                                                        internals_ran):
    """The same descriptor either way; with the flag false made by TensorDescriptor's constructor,
    its checks and all (with it true they are the callers' to make: the builder skips them)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    t = _buffer(torch.float16, 0).view(4, 16)
    made = {}
    for flag in (True, False):
        monkeypatch.setattr(_launch, "MIRRORS_TRITON", flag)
        internals_ran.clear()
        made[flag] = [_launch.descriptor(t, [4, 16], [16, 1], [2, 16]),
                      _launch.descriptor(t, [4, 16], [16, 1])]  # block shape set at launch
        assert internals_ran["_unchecked_descriptor"] == (2 if flag else 0)
        assert internals_ran["TensorDescriptor.__post_init__"] == (0 if flag else 2)
    for d in made[True] + made[False]:
        assert type(d) is TensorDescriptor and d.base is t
    fields = [[(d.shape, d.strides, d.block_shape, d.padding) for d in made[f]] for f in made]
    assert fields[0] == fields[1] == [([4, 16], [16, 1], [2, 16], "zero"),
                                      ([4, 16], [16, 1], [1, 1], "zero")]
    unaligned = _buffer(torch.float16, 8)[:32].view(2, 16)
    with pytest.raises(AssertionError, match="16-byte aligned"):
        _launch.descriptor(unaligned, [2, 16], [16, 1], [2, 16])
    monkeypatch.setattr(_launch, "MIRRORS_TRITON", True)
    _launch.descriptor(unaligned, [2, 16], [16, 1], [2, 16])  # unchecked
    for flag in (True, False):  # an empty dim: the constructor raises either way
        monkeypatch.setattr(_launch, "MIRRORS_TRITON", flag)
        with pytest.raises(AssertionError, match="shape must be positive"):
            _launch.descriptor(t[:0], [0, 16], [16, 1], [2, 16])


def _public_op_cases(device):
    """(name, op, inputs): every public op at small shapes; half precision where an op reads
    through host TensorDescriptors (attention, softmax_matmul, and with one SM linear_act and
    matmul_softmax, whose plan takes its tiled method above 2^24 multiply-adds)."""
    gen = torch.Generator().manual_seed(0)
    h = torch.float16

    def r(*shape, dtype=torch.float32, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    x, y = r(3, 40), r(3, 40)
    q, k, v = (r(1, 2, 24, 16, dtype=h) for _ in range(3))
    target = torch.randint(0, 30, (12,), generator=gen).to(device)
    return [
        ("add_mul", kernels.add_mul, (x, y, r(40))),
        ("add_mul scalar", kernels.add_mul, (x, y, 1.5)),
        ("softmax", kernels.softmax, (x,)),
        ("layer_norm", kernels.layer_norm, (x, r(40), r(40))),
        ("softmax_matmul", kernels.softmax_matmul, (r(2, 16, 32, dtype=h), r(2, 32, 16, dtype=h))),
        ("attention", kernels.attention, (q, k, v, True)),
        ("matmul_softmax", kernels.matmul_softmax,
         (r(1024, 256, dtype=h), r(256, 72, dtype=h, scale=1 / 16), r(72, dtype=h))),
        ("linear_act", kernels.linear_act,
         (r(32, 64, dtype=h), r(64, 64, dtype=h, scale=1 / 8), r(64, dtype=h))),
        ("linear_cross_entropy", kernels.linear_cross_entropy,
         (r(12, 16), r(30, 16), target, r(30))),
    ]


def _forward_backward(op, inputs):
    """The op's output and the gradients of its floating inputs (fresh leaves) for a fixed
    upstream gradient."""
    leaves = [a.detach().clone().requires_grad_()
              if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in inputs]
    out = op(*leaves)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    grads = torch.autograd.grad(out, [a for a in leaves if isinstance(a, torch.Tensor)
                                      and a.requires_grad], dout)
    return [out.detach(), *grads]


def _bits(t):
    return t.detach().reshape(-1).view(torch.uint8)


def test_every_op_runs_the_same_through_the_public_path(device, internals_ran, monkeypatch):
    """As on a Triton other than the one kernels/_launch.py mirrors (MIRRORS_TRITON false): every
    public op, forward and backward, gives bit for bit the outputs and gradients of the fast path
    (the same kernels run), every launch goes through kernel[grid] and every host descriptor
    through TensorDescriptor's constructor, and none of the code that reads Triton's internals
    runs. (Under the interpreter launch's fast path is off anyway: what differs there is the
    descriptors; tools/host_proxy.py --check-public, below, compares the launches of compiled
    kernels.)"""
    monkeypatch.setattr(_launch, "FAST_LAUNCH", True)
    monkeypatch.setattr(_device, "SM_COUNT_OVERRIDE", 1)  # matmuls of one tile take TMA
    cases = _public_op_cases(device)
    fast, descriptors = {}, {}
    for name, op, inputs in cases:
        _forward_backward(op, inputs)  # compiles, and is each key's first (normal) launch
        internals_ran.clear()
        fast[name] = _forward_backward(op, inputs)
        assert internals_ran["_LAUNCHES"] > 0, name  # the fast path was tried
        # (the interpreter copies each descriptor argument through the constructor)
        descriptors[name] = (internals_ran["_unchecked_descriptor"],
                             internals_ran["TensorDescriptor.__post_init__"])
    if _device.interpreting():  # (on a GPU, small attention problems skip TMA)
        assert all(descriptors[n][0] for n in ("softmax_matmul", "attention", "matmul_softmax",
                                               "linear_act")), descriptors
    monkeypatch.setattr(_launch, "MIRRORS_TRITON", False)
    for name, op, inputs in cases:
        internals_ran.clear()
        public = _forward_backward(op, inputs)
        assert {k: internals_ran[k] for k in INTERNALS if internals_ran[k]} == {}, name
        assert internals_ran["_fitted"] > 0, name
        assert internals_ran["TensorDescriptor.__post_init__"] == sum(descriptors[name]), name
        assert len(public) == len(fast[name]) > 1, name
        for i, (a, b) in enumerate(zip(fast[name], public)):
            assert a.dtype == b.dtype and a.shape == b.shape, (name, i)
            assert torch.isfinite(a).all(), (name, i)  # (written: outputs start as NaN)
            assert torch.equal(_bits(a), _bits(b)), (name, i)


def test_every_op_launches_the_same_through_the_public_path():
    """Compiled kernels (no interpreter) under simulated_gpu: with MIRRORS_TRITON false each
    public op's launches are the fast path's, all through JITFunction.run, and nothing that reads
    Triton's internals runs (tools/host_proxy.py --check-public)."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, str(root / "tools" / "host_proxy.py"),
                           "--check-public"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
