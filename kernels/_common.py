"""Input checks, output allocation and launching shared by every kernel family.

Every public kernel checks its inputs here and raises an error that names the problem, instead of
launching on something it cannot handle. Outputs are allocated through `empty` (or `empty_like`),
which fills them with NaN while `poisoned_outputs()` is active, so a test (or the sweep's
correctness check) sees any element a kernel forgot to write.

Small calls are host-bound, so two things keep the host's work per call short: `cached` remembers
a family's checks and plan per input layout (`layout_key`), and `launch` sends a kernel's repeated
launches straight to its compiled kernel (see "Launching at the floor" below).
"""
from __future__ import annotations

import contextlib
import functools
import math
import os

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false
import triton
import triton.language as tl
from triton import knobs
from triton.compiler import CompiledKernel
from triton.knobs import HookChain
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

try:  # Triton 3.6's encoding of a host TensorDescriptor for a launch (see _tma_args)
    from triton.backends.nvidia.driver import make_tensordesc_arg as _make_tensordesc_arg
except Exception:  # noqa: BLE001 - another version or no NVIDIA backend: never cached
    _make_tensordesc_arg = None

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter

_poison = False


@contextlib.contextmanager
def poisoned_outputs(enabled: bool = True):
    """While active, every output tensor starts as NaN instead of uninitialised memory."""
    global _poison
    previous, _poison = _poison, enabled
    try:
        yield
    finally:
        _poison = previous


def empty(shape, dtype, device) -> torch.Tensor:
    out = torch.empty(shape, dtype=dtype, device=device)
    if _poison:
        out.fill_(math.nan)
    return out


# Scratch tensors kept across calls, per (device, stream, shape, dtype); a full table is emptied.
SCRATCH_MAX_ENTRIES = 64
_SCRATCH: dict = {}


def scratch(shape, dtype, device) -> tuple:
    """(t, t.unbind(0)): a tensor for intermediate results that one call writes and reads back
    on the current stream, with its first-dim views, both made once per device, stream, shape
    and dtype and reused by later calls: stream order makes the reuse safe (a later call's
    writes queue behind this call's reads), and it saves the host an allocation, which costs
    ~19 us on the autograd engine's worker thread against ~5 on the main one (docs/layernorm.md,
    "Per call: the host").
    Fresh while the stream is being captured into a CUDA graph (the graph keeps its own)."""
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            t = empty(shape, dtype, device)
            return t, t.unbind(0)
        index = device.index
        if index is None:  # torch.device("cuda"): the current device
            index = torch.cuda.current_device()
            device = torch.device("cuda", index)
        stream = torch._C._cuda_getCurrentRawStream(index)
    else:
        stream = 0
    key = (device, stream, shape, dtype)
    entry = _SCRATCH.get(key)
    if entry is None:
        if len(_SCRATCH) >= SCRATCH_MAX_ENTRIES:
            _SCRATCH.clear()
        t = torch.empty(shape, dtype=dtype, device=device)
        entry = _SCRATCH[key] = (t, t.unbind(0))
    if _poison:
        entry[0].fill_(math.nan)
    return entry


def empty_like(x: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor of x's shape, dtype and device, as `empty` makes it; costs the
    host about half of `empty(x.shape, x.dtype, x.device)` (no shape, dtype, device to parse)."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if _poison:
        out.fill_(math.nan)
    return out


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return bool(knobs.runtime.interpret)


def check_tensor(name: str, t, *, dtypes=FLOAT_DTYPES, ndim=None, min_ndim=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; supported: {names}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dims, got shape {tuple(t.shape)}")
    if t.device.type == "cpu" and not interpreting():
        raise ValueError(
            f"{name} is on the CPU: Triton kernels need a CUDA tensor, or TRITON_INTERPRET=1 set "
            "before triton is imported to run them through the interpreter"
        )
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} is on device {t.device}; only cuda (or cpu under the interpreter)")


def is_fake(t: torch.Tensor) -> bool:
    """A tensor without data (torch.compile's and opcheck's fake tensors): checks that read an
    address skip it."""
    from torch._subclasses.fake_tensor import is_fake as _is_fake

    return _is_fake(t)


def check_contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(
            f"{name} is not contiguous (strides {tuple(t.stride())}); call .contiguous() first"
        )


def check_same(names_tensors, *, dtype=True) -> None:
    """All tensors on one device and, unless dtype=False, of one dtype (no silent casts)."""
    (n0, t0), *rest = names_tensors
    for n, t in rest:
        if t.device != t0.device:
            raise ValueError(f"{n} is on {t.device} but {n0} is on {t0.device}")
        if dtype and t.dtype != t0.dtype:
            raise TypeError(
                f"{n} has dtype {str(t.dtype).replace('torch.', '')} but {n0} has "
                f"{str(t0.dtype).replace('torch.', '')}; cast explicitly, nothing is cast silently"
            )


def upcast_bf16(dtype: torch.dtype) -> bool:
    """Triton 3.6's interpreter multiplies bfloat16 tiles as their raw uint16 bits (numpy has no
    bfloat16), so under it bfloat16 dots take float32 operands; exact, as bf16 products fit fp32."""
    return dtype == torch.bfloat16 and interpreting()


@triton.jit
def dot(a, b, acc, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """tl.dot, with the interpreter's bfloat16 workaround (see upcast_bf16) compiled in or out."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=INPUT_PRECISION)


def as_rows(name: str, x, checked: bool = False) -> tuple[torch.Tensor | None, int, int]:
    """Check x (unless `checked`) and view it as (rows, cols) without a copy; None for the view
    when x is empty.

    Rows may be strided (e.g. a slice x[:, :k]) as long as the last dim is contiguous and the
    leading dims merge into one row stride."""
    if not checked:
        check_tensor(name, x, min_ndim=1)
    n_cols = x.shape[-1]
    n_rows = math.prod(x.shape[:-1])
    empty = x.numel() == 0
    if empty.__class__ is not bool:
        # Symbolic sizes (a fake implementation under torch.compile): a data-dependent row count
        # (x[mask], nonzero) cannot be guarded on; take it as non-empty, as the view below and
        # the fake's output are right either way.
        empty = guard_or_false(empty)
    if empty:
        return None, n_rows, n_cols
    if n_cols > 1 and x.stride(-1) != 1:
        raise ValueError(f"{name}'s last dim is not contiguous (strides {tuple(x.stride())}); "
                         "call .contiguous() first")
    try:
        rows = x.view(n_rows, n_cols)
    except RuntimeError:
        raise ValueError(f"{name} of shape {tuple(x.shape)} and strides {tuple(x.stride())} cannot "
                         "be viewed as rows without a copy; call .contiguous() first") from None
    return rows, n_rows, n_cols


def cdiv(a: int, b: int) -> int:
    """Ceiling division on the host (triton.cdiv is a constexpr function: microseconds a call)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), on the host (see cdiv)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


# The SM count plans assume where there is no GPU to ask (Triton's interpreter on the CPU): an H100
# SXM's, so that the interpreter plans, and the tests check, what an H100 would run.
INTERPRETER_SM_COUNT = 132
# When set, every plan takes this SM count instead of the device's (the tests set it small so that
# persistent programs loop over several tiles or rows).
SM_COUNT_OVERRIDE: int | None = None


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(device: torch.device) -> int:
    # Cached: plans read it on every call's host path, which small launches cannot hide.
    return torch.cuda.get_device_properties(device).multi_processor_count


# Run as on a GPU without Hopper's TMA (TRITON_FUSION_NO_TMA=1): the kernels that read through
# host tensor descriptors take their plain-load path, as on an A100 or a consumer card, so that the
# path such GPUs run is tested on one that has TMA. With TRITON_FUSION_MAX_SHARED=<bytes>, kernels
# fit that much shared memory a block instead of the device's (an A100's 166912, a consumer
# card's 101376), as `launch` fits them.
NO_TMA = os.environ.get("TRITON_FUSION_NO_TMA", "0") == "1"
MAX_SHARED: int | None = int(os.environ.get("TRITON_FUSION_MAX_SHARED", "0")) or None


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device) -> tuple:
    return torch.cuda.get_device_capability(device)


def has_tma(device) -> bool:
    """Whether kernels may read through host tensor descriptors on `device`: TMA, sm_90+ (the
    interpreter emulates them), unless NO_TMA."""
    if NO_TMA:
        return False
    device = torch.device(device)
    return device.type != "cuda" or _capability(device)[0] >= 9


def sm_count_of(device=None) -> int:
    """The number of SMs of `device` (a CUDA device), else INTERPRETER_SM_COUNT (either way
    SM_COUNT_OVERRIDE when set)."""
    if SM_COUNT_OVERRIDE is not None:
        return SM_COUNT_OVERRIDE
    if device is not None and torch.device(device).type == "cuda":
        return _cuda_sm_count(torch.device(device))
    return INTERPRETER_SM_COUNT


def check_pow2(name: str, value, lo: int = 16, why: str = "") -> int:
    """A block size (or group size) given by the caller: a power of two >= lo."""
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= {lo}{why}, got {value!r}")
    return value


def check_warps(num_warps) -> int:
    if (not isinstance(num_warps, int) or isinstance(num_warps, bool) or not 1 <= num_warps <= 32
            or num_warps & (num_warps - 1)):
        raise ValueError(f"num_warps must be a power of two from 1 to 32, got {num_warps!r}")
    return num_warps


def default_warps(block: int) -> int:
    """One warp per 256 elements of a 1-D block, between 1 and 16."""
    return max(1, min(16, block // 256))


# The unfused baselines' tile: one row's worth up to this, then loops over tiles of this width.
UNFUSED_BLOCK = 4096


def unfused_tile(n_cols: int, block=None, num_warps=None) -> tuple[int, int]:
    """(block, num_warps) of an unfused baseline's kernels: the row rounded up to a power of two
    (at most UNFUSED_BLOCK) unless given, warps from the block unless given; both checked."""
    block = min(UNFUSED_BLOCK, max(16, next_pow2(n_cols))) if block is None else block
    check_pow2("block", block)
    num_warps = default_warps(block) if num_warps is None else num_warps
    check_warps(num_warps)
    return block, num_warps



# ------------------------------------------------------------------------------------------------
# Plans and checks, remembered. A public function checks its inputs and plans its launches on
# every call: for small tensors that Python costs more than the kernel runs. `cached` remembers
# the outcome per key: whatever the checks and the plan read (shapes, dtypes, devices, contiguity
# or strides, the options).

# Entries a cache holds; a full cache is emptied and refills.
PLAN_CACHE_MAX = 4096
_PLAN_CACHES: list[dict] = []
_plans_made_with = None  # the (SM_COUNT_OVERRIDE, NO_TMA) the cached plans saw


def layout_key(tensors, options=()) -> tuple | None:
    """The key for `cached` of the tensors' layouts (shape, dtype, device, and strides unless
    contiguous; None for None) and the options; None (compute without the cache) where a tensor
    is not a plain tensor (a subclass, a number) or an option is not None, an int or a str (a
    16.0 or a True must not find 16's entry and skip the check that refuses it)."""
    key = []
    append = key.append
    for t in tensors:
        if t is None:
            append(None)
            continue
        cls = t.__class__
        if cls is not _Tensor and cls is not _Parameter:
            return None
        append(t.shape)
        append(t.dtype)
        append(t.device)
        append(None if t.is_contiguous() else t.stride())
    for o in options:
        if o is not None and o.__class__ is not int and o.__class__ is not str:
            return None
        append(o)
    return tuple(key)


def plan_strides(t) -> tuple:
    """t's strides as a plan cached under `layout_key` can hold them: a non-contiguous t's (the
    key holds them), a contiguous t's as torch.empty makes them (the key holds its shape). A
    contiguous t may have other strides on its size-1 dims, which the kernels multiply by 0 only:
    they read the same elements."""
    if not t.is_contiguous():
        return t.stride()
    strides, step = [], 1
    for n in reversed(t.shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def plan_cache() -> dict:
    """A new cache for `cached` (emptied with the others when SM_COUNT_OVERRIDE or NO_TMA
    changes)."""
    cache: dict = {}
    _PLAN_CACHES.append(cache)
    return cache


def cached(cache: dict, key, compute, *args):
    """cache[key], else compute(*args), remembered under key.

    compute must depend on nothing but what key holds, and on SM_COUNT_OVERRIDE and NO_TMA (a
    change empties every cache). It raises on inputs it refuses: nothing is remembered then, so
    such inputs raise on every call. A key of None, or one that cannot be hashed (symbolic sizes
    while tracing), computes every time."""
    global _plans_made_with
    if key is None:
        return compute(*args)
    made_with = (SM_COUNT_OVERRIDE, NO_TMA)
    if made_with != _plans_made_with:
        for c in _PLAN_CACHES:
            c.clear()
        _plans_made_with = made_with
    try:
        return cache[key]
    except KeyError:
        pass
    except TypeError:
        return compute(*args)
    value = compute(*args)
    if len(cache) >= PLAN_CACHE_MAX:
        cache.clear()
    cache[key] = value
    return value

# ------------------------------------------------------------------------------------------------
# Launch settings timed on the device (attention's config, LayerNorm's forward plan).


TUNING_ROUNDS = 3


def fastest(memo: dict, key: tuple, candidates: list, time_ms, kernels, device):
    """The fastest of `candidates` for `key`: memo[key], else the choice a process on the same
    kind of GPU kept on disk, else timed now (`time_ms(candidate)` -> ms, the median of
    TUNING_ROUNDS interleaved rounds; a candidate that does not compile for this GPU, for shared
    memory, registers or a compiler pass that refuses it, is skipped) and remembered.

    The disk copy follows Triton's own autotuner: only with TRITON_CACHE_AUTOTUNING=1, in
    Triton's cache, named by Triton's version, the GPU (name, SM count, capability), the
    kernels' sources, the cache-invalidating environment, this module's overrides, the key and
    the candidates, so that a changed kernel or candidate list never takes an old choice. The
    choice is one of `candidates` whatever the file says: at worst a slower one, never a wrong
    result."""
    choice = memo.get(key)
    if choice is not None:
        return choice
    disk = _tuning_file(key, candidates, kernels, device) if knobs.autotuning.cache else None
    if disk is not None:
        choice = disk.load()
    if choice is None:
        runs = {}
        for cand in candidates:
            try:
                runs[cand] = [time_ms(cand)]
            except (triton.runtime.errors.OutOfResources,
                    triton.compiler.errors.CompilationError):
                continue
            except RuntimeError as e:  # an MLIR pass refusing the kernel (warp specialisation)
                if "PassManager::run failed" not in str(e):
                    raise
        if not runs:
            raise RuntimeError(f"no candidate compiles for {key}")
        # More rounds, interleaved: one timing per candidate moves by more than the candidates
        # differ (clocks and power settle while they run; docs/attention.md, tuner noise).
        for _ in range(TUNING_ROUNDS - 1):
            for cand, times in runs.items():
                times.append(time_ms(cand))
        timings = {cand: sorted(times)[len(times) // 2] for cand, times in runs.items()}
        choice = min(timings, key=timings.get)
        if disk is not None:
            disk.store(choice, timings)
    memo[key] = choice
    return choice


class _TuningFile:
    """One tuning choice in Triton's cache: the winner's index among the candidates, with every
    candidate's time for the record."""

    def __init__(self, digest: str, candidates: list):
        from triton.runtime.cache import get_cache_manager

        self.cache = get_cache_manager(digest)
        self.candidates = candidates

    def load(self):
        import json

        path = self.cache.get_file("tuning.json")
        if path is None:
            return None
        try:
            with open(path) as f:
                index = json.load(f)["choice"]
            return self.candidates[index] if 0 <= index < len(self.candidates) else None
        except (OSError, ValueError, KeyError, TypeError):  # unreadable: time again
            return None

    def store(self, choice, timings: dict) -> None:
        import json

        self.cache.put(json.dumps({
            "choice": self.candidates.index(choice),
            "candidates": [repr(c) for c in self.candidates],
            "ms": [timings.get(c) for c in self.candidates]}), "tuning.json", binary=False)


def _tuning_file(key, candidates, kernels, device) -> _TuningFile:
    import hashlib

    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime.cache import triton_key

    device = torch.device(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu = (props.name, props.multi_processor_count, _capability(device))
    else:
        gpu = (device.type,)
    sources = [getattr(k, "cache_key", None) or _source_digest(k) for k in kernels]
    # The device's index is not part of the choice: GPUs of one kind share it.
    plain_key = tuple(d.type if isinstance(d, torch.device) else d for d in key)
    parts = [triton_key(), repr(gpu), *sources,
             repr(sorted(get_cache_invalidating_env_vars().items())),
             repr((SM_COUNT_OVERRIDE, NO_TMA, MAX_SHARED)), repr(plain_key),
             *(repr(c) for c in candidates)]
    return _TuningFile(hashlib.sha256("-".join(parts).encode()).hexdigest(), candidates)


def _source_digest(kernel) -> str:
    """A kernel without Triton's cache key (the interpreter's): its module's source."""
    import hashlib
    import inspect
    import sys

    fn = getattr(kernel, "fn", kernel)
    return hashlib.sha256(inspect.getsource(sys.modules[fn.__module__]).encode()).hexdigest()



# ------------------------------------------------------------------------------------------------
# Launching at the floor.
#
# `kernel[grid](...)` runs Triton's JITFunction.run on every call: it binds the arguments and
# specialises them, builds a cache key (with str() of the options), looks the compiled kernel up,
# checks the kernel's globals, builds launch metadata for the hooks and only then calls the
# compiled kernel's launcher: 11-19 us of host time a call on an H100 machine, more than a small
# kernel runs. `launch` makes the first call of each specialisation through kernel[grid] unchanged,
# keeps the compiled kernel it returns, and sends later calls of the same specialisation straight
# to that kernel's launcher with the arguments JITFunction.run would pass.

# Off: TRITON_FUSION_FAST_LAUNCH=0 in the environment, or `_common.FAST_LAUNCH = False` at run time
# (every launch then goes through kernel[grid]).
FAST_LAUNCH = os.environ.get("TRITON_FUSION_FAST_LAUNCH", "1") != "0"
# Tensors passed to the launcher as their addresses: it then skips its per-pointer
# cuPointerGetAttribute (a driver call each), which only tells a CPU tensor from a CUDA one, as
# the ops' own checks already have. Saves 1-5 us a call on an H100 host (docs/bench.md, "Host
# cost a call": the interleaved per-call probe). TRITON_FUSION_POINTERS_AS_INTS=0: off.
POINTERS_AS_INTS = os.environ.get("TRITON_FUSION_POINTERS_AS_INTS", "1") != "0"
# Host TensorDescriptors turned into TMA descriptors once per (address, shape, strides, padding)
# and compiled kernel, instead of at every launch (Triton's launcher wrapper encodes each one
# every call, in Python). TRITON_FUSION_CACHE_TMA=0 or `_common.CACHE_TMA = False`: off.
CACHE_TMA = os.environ.get("TRITON_FUSION_CACHE_TMA", "1") != "0"
# Compiled kernels remembered per JITFunction; a full table is emptied and refills (so is a
# compiled kernel's table of TMA descriptors, at TMA_MAX_ENTRIES).
FAST_LAUNCH_MAX_ENTRIES = 1024
TMA_MAX_ENTRIES = 256
# specialization_key and launch mirror Triton 3.6's JITFunction.run: other versions take the
# normal path.
_TRITON_MATCHES = triton.__version__.split(".")[:2] == ["3", "6"]
_MISSING = object()


def descriptor(t, shape, strides, block_shape=None):
    """A host TensorDescriptor over t (block shape given, or set before each launch), made without
    the dataclass's own checks where the caller has made them (a 16-byte aligned base, strides
    of 16-byte multiples, a unit last stride): they cost more host time than a small launch."""
    if not all(shape):
        return TensorDescriptor(t, shape, strides, [1] * len(shape))  # raises: an empty dim
    d = object.__new__(TensorDescriptor)
    d.base, d.shape, d.strides, d.padding = t, shape, strides, "zero"
    d.block_shape = [1] * len(shape) if block_shape is None else block_shape
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
    replaced by its address (read once, for the key and the launch)."""
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
    if _make_tensordesc_arg is None or code is None or getattr(wrapped, "__name__", "") != "inner":
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
        if not _TRITON_MATCHES or type(kernel) is not JITFunction:  # e.g. the interpreter's
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
    prefetch. MAX_SHARED, when set, stands in for the device's limit."""
    while True:
        try:
            if MAX_SHARED is not None and not interpreting():
                shared = kernel.warmup(*args, grid=grid, **kwargs).metadata.shared
                if shared > MAX_SHARED:
                    raise triton.runtime.errors.OutOfResources(shared, MAX_SHARED, "shared memory")
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
    instrumentation mode, not the interpreter, the kernel's globals unchanged. Anything else goes
    through kernel[grid], as does the first call of each key."""
    state = _LAUNCHES.get(id(kernel))
    if state is None:
        state = _LAUNCHES[id(kernel)] = _Launches(kernel)
    if not FAST_LAUNCH or len(args) != state.n_runtime or grid.__class__ is not tuple:
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
    # MAX_SHARED: a kernel fitted under another limit is not the one to launch.
    passed = [] if POINTERS_AS_INTS else None
    key = specialization_key(args, (device, MAX_SHARED, *kwargs.items()), passed)
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


__all__ = [
    "FLOAT_DTYPES",
    "INTERPRETER_SM_COUNT",
    "as_rows",
    "cached",
    "cdiv",
    "check_contiguous",
    "check_pow2",
    "check_same",
    "check_tensor",
    "check_warps",
    "default_warps",
    "descriptor",
    "dot",
    "empty",
    "empty_like",
    "has_tma",
    "interpreting",
    "is_fake",
    "launch",
    "layout_key",
    "next_pow2",
    "plan_cache",
    "plan_strides",
    "poisoned_outputs",
    "scratch",
    "sm_count_of",
    "specialization_key",
    "triton",
    "unfused_tile",
    "upcast_bf16",
]
