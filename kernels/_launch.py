"""The launcher: `launch(kernel, grid, *args, **kwargs)`, what every family calls instead of
`kernel[grid](...)`: the first call of each specialisation goes through Triton unchanged, later
ones straight to the compiled kernel (see "Launching at the floor" below); and `descriptor`, the
host TensorDescriptors the TMA paths pass.

This module is the only one in kernels/ that reads Triton's internals for the launch path, and
everything here that does so mirrors Triton 3.6.x exactly. It is used only where MIRRORS_TRITON
(decided once, at import: the installed Triton is 3.6.x and every internal imported) is true:

- `launch`'s fast path re-implements JITFunction.run (triton/runtime/jit.py). It reads
  JITFunction.params (`is_constexpr`, `name`), `.debug`, `.pre_run_hooks`, `.used_global_vals`;
  knobs.runtime.debug / launch_enter_hook / launch_exit_hook (HookChain and its `.calls`),
  knobs.compilation.instrumentation_mode; driver.active.get_current_device() /
  get_current_stream(); CompiledKernel.function / .packed_metadata / .run.
- `specialization_key` mirrors what the binder specialises on (create_function_from_signature,
  native_specialize_impl of python/src/specialize.cc).
- `_Launches.remember` calls the CudaLauncher's C `launch` directly, found by the class name
  "CudaLauncher" and its fields global_scratch_size, profile_scratch_size,
  launch_cooperative_grid, launch_pdl, with 3.6's positional layout (grid x, y, z, stream,
  function, cooperative, pdl, global scratch, profile scratch, packed metadata, launch metadata,
  enter hook, exit hook, the arguments, the constexprs) and CudaLauncher.__call__'s otherwise.
- `_unwrap_tensordesc` / `_tma_args` read the closure cells `launcher`, `tensordesc_indices`,
  `tensordesc_meta` of wrap_handle_tensordesc's `inner` (triton/backends/nvidia/driver.py) and
  call its make_tensordesc_arg(arg, metadata).
- `descriptor` builds a TensorDescriptor with object.__new__, setting the 3.6 dataclass's fields
  (base, shape, strides, block_shape, padding) and skipping its __post_init__ checks.

Where MIRRORS_TRITON is false (another Triton, or a 3.6 missing one of those internals), each of
them falls back to Triton's public path: `launch` to `kernel[grid](...)` (`_fitted`), `descriptor`
to `TensorDescriptor(...)`, `specialization_key` to None, and no compiled kernel is remembered or
unwrapped. The outputs are the same (the same kernels run); only the host cost a call differs.
TRITON_FUSION_FAST_LAUNCH=0 (FAST_LAUNCH) sends the launches alone to the public path.
tests/test_launch.py fails loudly where the installed Triton is not the one mirrored, and runs
every public op down the fallback (test_every_op_runs_the_same_through_the_public_path).
Not covered by the flag, elsewhere: Gluon's kernels (families/attention/gluon.py: their own
version check) and the tuning cache's key (_plans.py: triton_key, the cache manager).
"""
from __future__ import annotations

import os

import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from . import _device
from ._checks import _Parameter, _Tensor
from ._device import interpreting


def mirrors(version: str) -> bool:
    """Whether a Triton of this version string is the one this module mirrors (3.6.x)."""
    return version.split(".")[:2] == ["3", "6"]


try:  # the internals the fast paths read (see above); any missing: the public path everywhere
    from triton import knobs
    from triton.compiler import CompiledKernel
    from triton.knobs import HookChain
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction
    _INTERNALS = True
except ImportError:  # pragma: no cover - another Triton
    _INTERNALS = False

try:  # Triton 3.6's encoding of a host TensorDescriptor for a launch (see _tma_args)
    from triton.backends.nvidia.driver import make_tensordesc_arg as _make_tensordesc_arg
except Exception:  # noqa: BLE001 - another version or no NVIDIA backend: never cached
    _make_tensordesc_arg = None

# The one flag every internals-dependent piece below checks, read at each call (so a test can set
# it false: tests/test_launch.py); elsewhere read it as _launch.MIRRORS_TRITON, never a copy.
MIRRORS_TRITON = _INTERNALS and mirrors(triton.__version__)

# ------------------------------------------------------------------------------------------------
# Launching at the floor.
#
# `kernel[grid](...)` runs Triton's JITFunction.run on every call: it binds the arguments and
# specialises them, builds a cache key (with str() of the options), looks the compiled kernel up,
# checks the kernel's globals, builds launch metadata for the hooks and only then calls the
# compiled kernel's launcher: more host time a call than a small kernel runs (docs/bench.md).
# `launch` makes the first call of each specialisation through kernel[grid] unchanged, keeps the
# compiled kernel it returns, and sends later calls of the same specialisation straight to that
# kernel's launcher with the arguments JITFunction.run would pass.

# Off: TRITON_FUSION_FAST_LAUNCH=0 in the environment, or `_launch.FAST_LAUNCH = False` at run time
# (every launch then goes through kernel[grid]).
FAST_LAUNCH = os.environ.get("TRITON_FUSION_FAST_LAUNCH", "1") != "0"
# Tensors passed to the launcher as their addresses: it then skips its per-pointer
# cuPointerGetAttribute (a driver call each), which only tells a CPU tensor from a CUDA one, as
# the ops' own checks already have (docs/bench.md, "Host cost a call", measures the saving).
# `_launch.POINTERS_AS_INTS = False`: off.
POINTERS_AS_INTS = True
# Host TensorDescriptors turned into TMA descriptors once per (address, shape, strides, padding)
# and compiled kernel, instead of at every launch (Triton's launcher wrapper encodes each one
# every call, in Python). `_launch.CACHE_TMA = False`: off.
CACHE_TMA = True
# Compiled kernels remembered per JITFunction; a full table is emptied and refills (so is a
# compiled kernel's table of TMA descriptors, at TMA_MAX_ENTRIES).
FAST_LAUNCH_MAX_ENTRIES = 1024
TMA_MAX_ENTRIES = 256
_MISSING = object()


def descriptor(t, shape, strides, block_shape=None):
    """A host TensorDescriptor over t (block shape given, or set before each launch), made without
    the dataclass's own checks where the caller has made them (a 16-byte aligned base, strides
    of 16-byte multiples, a unit last stride): they cost more host time than a small launch.
    Through the public constructor, checks and all, where MIRRORS_TRITON is false."""
    if block_shape is None:
        block_shape = [1] * len(shape)
    if not MIRRORS_TRITON or not all(shape):  # (an empty dim: the constructor raises)
        return TensorDescriptor(t, shape, strides, block_shape)
    return _unchecked_descriptor(t, shape, strides, block_shape)


def _unchecked_descriptor(t, shape, strides, block_shape):
    """Triton 3.6's TensorDescriptor dataclass, its fields set without __post_init__."""
    d = object.__new__(TensorDescriptor)
    d.base, d.shape, d.strides, d.block_shape, d.padding = t, shape, strides, block_shape, "zero"
    return d


def specialization_key(args, prefix=(), passed=None) -> tuple | None:
    """A key for what Triton 3.6 specialises a kernel on, given its runtime (not constexpr)
    arguments in order: two calls with equal keys get the same specialisation. None for an
    argument of a kind not handled here (the caller then launches through Triton). `prefix`
    starts the key (launch puts the device and the keywords there).

    Triton (the binder of runtime/jit.py, native_specialize_impl of python/src/specialize.cc)
    types a tensor by its dtype and marks it when data_ptr() is a multiple of 16; makes an int
    equal to 1 a constexpr, types other ints i32, i64 or u64 by range and marks them when divisible
    by 16; types a float fp32 (any value), a bool u1, None a constexpr, a host TensorDescriptor
    by its base's dtype and its block shape (its shape, strides and padding are runtime values,
    turned into a TMA descriptor by the launcher at every call). This key records all of
    that for every argument, also where a parameter's `do_not_specialize` or annotation makes
    Triton ignore part of it: finer than Triton's, never coarser. (Read in order, it is
    unambiguous: a dtype is always followed by its alignment, or preceded by "tensordesc" and
    followed by a block shape, and no other entry equals a dtype, a keyword's (name, value) pair
    or another kind's entry.)

    `passed`, a list: filled with the arguments as the launcher is to get them, each tensor
    replaced by its address (read once, for the key and the launch).

    None for every call where MIRRORS_TRITON is false: another Triton specialises otherwise."""
    if not MIRRORS_TRITON:
        return None
    key = list(prefix)
    append = key.append
    pass_on = None if passed is None else passed.append
    for a in args:
        cls = a.__class__
        if cls is _Tensor or cls is _Parameter:
            ptr = a.data_ptr()
            append(a.dtype)
            append(not ptr & 15)
            if pass_on is not None:
                pass_on(ptr)
            continue
        if cls is int:
            if -0x80000000 <= a <= 0x7FFFFFFF:
                append("1" if a == 1 else "i32" if a & 15 else "i32:16")
            elif -0x8000000000000000 <= a <= 0x7FFFFFFFFFFFFFFF:
                append("i64" if a & 15 else "i64:16")
            elif 0 < a <= 0xFFFFFFFFFFFFFFFF:
                append("u64" if a & 15 else "u64:16")
            else:
                return None  # Triton raises OverflowError: let it
        elif cls is float:
            append("fp32")
        elif cls is bool:
            append("u1")
        elif a is None:
            append(None)
        elif cls is TensorDescriptor and a.base.__class__ is _Tensor:
            append("tensordesc")
            append(a.base.dtype)
            append(tuple(a.block_shape))
        else:
            return None
        if pass_on is not None:
            pass_on(a)
    return tuple(key)


class _Compiled:
    """One compiled kernel and what its launcher needs besides the runtime arguments."""

    __slots__ = ("kernel", "launcher", "direct", "function", "packed_metadata", "coop", "pdl",
                 "constexprs", "globals", "c_launch", "descs", "tma")

    def __init__(self, kernel, launcher, direct, constexprs, globals_):
        self.kernel = kernel
        self.launcher = launcher
        self.direct = direct
        # Kernels with TMA descriptor arguments: the C launch under Triton's wrapper, the
        # (position, metadata) of each descriptor argument, and the encoded descriptors.
        unwrapped = _unwrap_tensordesc(launcher.launch) if direct else None
        self.c_launch, self.descs = unwrapped or (None, ())
        self.tma = {}
        self.function = kernel.function
        self.packed_metadata = kernel.packed_metadata
        self.coop = getattr(launcher, "launch_cooperative_grid", None)
        self.pdl = getattr(launcher, "launch_pdl", None)
        self.constexprs = constexprs
        self.globals = globals_


def _unwrap_tensordesc(wrapped):
    """(the C launch, ((position, metadata), ... last position first)) from Triton 3.6's
    `wrap_handle_tensordesc` closure around a CudaLauncher's launch, where every descriptor
    argument has TMA metadata (a kernel compiled for sm_90+); else None."""
    code = getattr(wrapped, "__code__", None)
    if (not MIRRORS_TRITON or _make_tensordesc_arg is None or code is None
            or getattr(wrapped, "__name__", "") != "inner"):
        return None
    try:
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in wrapped.__closure__)))
        c_launch, indices, metas = (cells["launcher"], sorted(cells["tensordesc_indices"]),
                                    cells["tensordesc_meta"])
    except (KeyError, TypeError, ValueError):
        return None
    if not indices or metas is None or len(metas) != len(indices) or None in metas:
        return None
    return c_launch, tuple(reversed(tuple(zip(indices, metas))))


def _tma_args(entry, position, desc, meta):
    """What Triton's wrapper passes for the host TensorDescriptor at `position` (`make_tensordesc_arg`:
    the encoded TMA descriptor, then the shape and strides), from the entry's table. The encoding
    depends on the base address, shape, strides, padding and on the metadata of the argument
    (block shape, swizzle, element type: fixed per entry and position)."""
    key = (position, desc.base.data_ptr(), *desc.shape, None, *desc.strides, desc.padding)
    hit = entry.tma.get(key)
    if hit is None:
        if len(entry.tma) >= TMA_MAX_ENTRIES:
            entry.tma.clear()
        hit = entry.tma[key] = _make_tensordesc_arg(desc, meta)
    return hit


class _Launches:
    """What `launch` keeps for one kernel: where its constexpr parameters start (-1: never the
    fast path) and the compiled kernels by key."""

    __slots__ = ("kernel", "n_runtime", "constexpr_names", "compiled")

    def __init__(self, kernel):
        self.kernel = kernel  # a reference, so that id(kernel) stays this kernel's
        self.n_runtime, self.constexpr_names, self.compiled = -1, (), {}
        if not MIRRORS_TRITON or type(kernel) is not JITFunction:  # e.g. the interpreter's
            return
        params = kernel.params
        n = next((i for i, p in enumerate(params) if p.is_constexpr), len(params))
        # The launcher's arguments are the runtime ones (positional) then the constexprs (by
        # keyword): kernels whose constexprs are not all at the end keep the normal path.
        if all(p.is_constexpr for p in params[n:]):
            self.n_runtime = n
            self.constexpr_names = tuple(p.name for p in params[n:])

    def remember(self, key, compiled, kwargs) -> None:
        if not isinstance(compiled, CompiledKernel) or compiled.function is None:
            return
        try:
            constexprs = tuple(kwargs[name] for name in self.constexpr_names)
        except KeyError:  # a constexpr left to its default: keep the normal path
            return
        launcher = compiled.run
        # CudaLauncher.__call__ only adds the scratch buffers (None when their size is 0) and
        # the launch flags before calling its C `launch`: call that directly where it can.
        direct = (type(launcher).__name__ == "CudaLauncher"
                  and getattr(launcher, "global_scratch_size", None) == 0
                  and getattr(launcher, "profile_scratch_size", None) == 0
                  and all(hasattr(launcher, a) for a in ("launch", "launch_cooperative_grid",
                                                         "launch_pdl")))
        # JITFunction.run raises if a global the kernel read has changed since it compiled; it
        # just passed that check, so the objects bound now are the right ones.
        globals_ = tuple((g, name, g.get(name, _MISSING))
                         for (name, _), (_, g) in self.kernel.used_global_vals.items())
        if len(self.compiled) >= FAST_LAUNCH_MAX_ENTRIES:
            self.compiled.clear()
        self.compiled[key] = _Compiled(compiled, launcher, direct, constexprs, globals_)


_LAUNCHES: dict[int, _Launches] = {}


def _fitted(kernel, grid, args, kwargs) -> tuple:
    """(kernel[grid](*args, **kwargs), the keywords it ran with): where the kernel's shared memory
    does not fit the device (plans are tuned on an H100, with 228 KB a block; an A100 has 164, a
    consumer card 99), with one pipeline stage fewer at a time; the same results, a shallower
    prefetch. _device.MAX_SHARED, when set, stands in for the device's limit."""
    while True:
        try:
            if _device.MAX_SHARED is not None and not interpreting():
                shared = kernel.warmup(*args, grid=grid, **kwargs).metadata.shared
                if shared > _device.MAX_SHARED:
                    raise triton.runtime.errors.OutOfResources(shared, _device.MAX_SHARED, "shared memory")
            return kernel[grid](*args, **kwargs), kwargs
        except triton.runtime.errors.OutOfResources as exc:
            stages = kwargs.get("num_stages")
            if "shared" not in str(exc) or not isinstance(stages, int) or stages <= 1:
                raise
            kwargs = dict(kwargs, num_stages=stages - 1)


def launch(kernel, grid, *args, **kwargs):
    """`kernel[grid](*args, **kwargs)`, straight through the compiled kernel's launcher once
    Triton has compiled the kernel for this specialisation; returns the compiled kernel, as
    kernel[grid] does.

    The key (the device, every keyword: constexprs and options such as num_warps, then
    `specialization_key` of args) holds everything Triton keys its compiled kernels on. The fast
    path needs the runtime arguments positional and the constexprs by keyword (as kernels/ passes
    them), a tuple grid, Triton 3.6, and nothing unusual: no launch or pre-run hooks, no debug or
    instrumentation mode, not the interpreter, the kernel's globals unchanged, MIRRORS_TRITON and
    FAST_LAUNCH. Anything else goes through kernel[grid], as does the first call of each key."""
    # Checked before anything reads the kernel's or Triton's internals (_Launches does).
    if not (MIRRORS_TRITON and FAST_LAUNCH):
        return _fitted(kernel, grid, args, kwargs)[0]
    state = _LAUNCHES.get(id(kernel))
    if state is None:
        state = _LAUNCHES[id(kernel)] = _Launches(kernel)
    if len(args) != state.n_runtime or grid.__class__ is not tuple:
        return _fitted(kernel, grid, args, kwargs)[0]
    runtime = knobs.runtime
    enter, exit_ = runtime.launch_enter_hook, runtime.launch_exit_hook
    if (runtime.debug or kernel.debug or knobs.compilation.instrumentation_mode
            or kernel.pre_run_hooks
            # Triton's default hooks are empty HookChains (its profiler adds to them).
            or (enter is not None and (enter.__class__ is not HookChain or enter.calls))
            or (exit_ is not None and (exit_.__class__ is not HookChain or exit_.calls))):
        return _fitted(kernel, grid, args, kwargs)[0]
    active = driver.active
    device = active.get_current_device()  # what JITFunction.run keys its caches on
    # _device.MAX_SHARED: a kernel fitted under another limit is not the one to launch.
    passed = [] if POINTERS_AS_INTS else None
    key = specialization_key(args, (device, _device.MAX_SHARED, *kwargs.items()), passed)
    if key is None:
        return _fitted(kernel, grid, args, kwargs)[0]
    try:
        entry = state.compiled.get(key)
    except TypeError:  # an unhashable keyword value
        return _fitted(kernel, grid, args, kwargs)[0]
    if entry is not None:
        for g, name, value in entry.globals:
            if g.get(name, _MISSING) is not value:
                entry = None  # JITFunction.run checks them (and raises if they changed)
                break
    if entry is None:
        compiled, ran_with = _fitted(kernel, grid, args, kwargs)
        state.remember(key, compiled, ran_with)
        return compiled
    n = len(grid)
    grid_0 = grid[0]
    grid_1 = grid[1] if n > 1 else 1
    grid_2 = grid[2] if n > 2 else 1
    stream = active.get_current_stream(device)
    if passed is not None:
        args = passed
    # No hooks are set (checked above): no launch metadata, None for the hooks.
    if entry.descs and CACHE_TMA:
        args = list(args)
        for i, meta in entry.descs:  # last first: an expansion shifts what follows it
            args[i:i + 1] = _tma_args(entry, i, args[i], meta)
        entry.c_launch(grid_0, grid_1, grid_2, stream, entry.function, entry.coop, entry.pdl,
                       None, None, entry.packed_metadata, None, None, None, *args,
                       *entry.constexprs)
    elif entry.direct:
        entry.launcher.launch(grid_0, grid_1, grid_2, stream, entry.function, entry.coop,
                              entry.pdl, None, None, entry.packed_metadata, None, None, None,
                              *args, *entry.constexprs)
    else:
        entry.launcher(grid_0, grid_1, grid_2, stream, entry.function, entry.packed_metadata,
                       None, None, None, *args, *entry.constexprs)
    return entry.kernel


__all__ = ["descriptor", "launch", "mirrors", "specialization_key"]
