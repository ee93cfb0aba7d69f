"""The public ops, registered with PyTorch (`torch.library.custom_op`, namespace `triton_fusion`),
so that a model calling them compiles with `torch.compile(fullgraph=True)`, captures in a CUDA
graph and passes `torch.library.opcheck`.

Each op is declared once, with `declare`: its Triton implementation, a fake implementation (the
same input checks, then an empty result of the right shape: errors surface at trace time with the
messages of eager) and its autograd formula, either in PyTorch ops or through a backward op of
its own (softmax, LayerNorm, attention, linear_act), which `declare` registers too. From that one
declaration it makes every path a call can take, so that they cannot drift apart:

- direct: eager, no input requiring grad, plain tensors or nn.Parameters: the Triton
  implementation without the dispatcher (a custom op's Python dispatch costs tens of microseconds
  a call, more than a small kernel's launch);
- the autograd.Function (ops with a backward op): eager autograd on plain tensors, the same
  kernels at less host cost a call than the custom op's autograd (which goes through the
  dispatcher twice a direction); its backward calls the registered backward op where a graph is
  built (create_graph, so a second derivative still raises), its implementation otherwise;
- the registered op: under torch.compile, export, fake tensors and for tensor subclasses.

Backward ops have no second derivative: differentiating through one raises. Forward-mode AD
(dual tensors) raises too.

Autocast (`torch.autocast`, CUDA and CPU): each op declares how autocast casts its floating
inputs, as PyTorch's op lists do for the ops it stands beside (`LOWER`: to autocast's dtype, as
F.linear and SDPA; `FLOAT32`: to float32, as CUDA's layer_norm and softmax; `PROMOTE`: to the
widest of them, as elementwise ops; None: as they are), and the builder applies it on every path:
a kernel on the op's Autocast dispatch keys for the registered op (torch.compile traces it), the
same cast before the direct path and the Function, which bypass the dispatcher. The cast is an
ordinary differentiable `.to`: gradients reach float32 parameters in float32. The implementation
then runs with autocast off, as a registered custom op's does. `torch.library.register_autocast`
is not used: it casts to one dtype fixed at registration, where F.linear follows the region's.
"""
from __future__ import annotations

import functools
import types

import torch
import torch.autograd.forward_ad as _fwad


NS = "triton_fusion"

# Every registered op by name (a backward op as "<op>_backward"): kernels.OPS.
REGISTERED: dict = {}

# Tensors the implementations may take without the dispatcher: nn.Parameter (a model's weights)
# is a plain tensor to every op (it overrides no torch function).
_PLAIN = (torch.Tensor, torch.nn.Parameter)


# The paths a call takes (`_path`).
DIRECT, FUNCTION, OP, AUTOCAST = 0, 1, 2, 3

# Autocast policies (see the module's docstring) and the devices whose autocast they apply to.
LOWER, FLOAT32, PROMOTE = "lower", "float32", "promote"
_AUTOCAST_KEYS = {"cuda": "AutocastCUDA", "cpu": "AutocastCPU"}
_any_autocast = torch._C._is_any_autocast_enabled


def _path(args, autocast: bool = True) -> int:
    """DIRECT: the implementation may be called without the dispatcher (eager, nothing to
    differentiate, plain tensors); FUNCTION: eager autograd on plain tensors; OP: the registered
    op (compiling, tracing, a tensor subclass); AUTOCAST: eager with autocast on (the cast, then
    one of the others: `_path(args, autocast=False)`)."""
    if torch.compiler.is_compiling():
        return OP
    if autocast and _any_autocast():
        return AUTOCAST
    if _fwad._current_level >= 0:
        _refuse_tangents(args)
    grad = torch.is_grad_enabled()
    path = DIRECT
    for t in args:
        if isinstance(t, torch.Tensor):
            if type(t) not in _PLAIN:
                return OP
            if grad and t.requires_grad:
                path = FUNCTION
    return path


def _refuse_tangents(tensors) -> None:
    """Forward-mode AD has no formula here: an input with a tangent raises rather than return a
    result whose tangent is silently dropped."""
    if any(isinstance(t, torch.Tensor) and _fwad.unpack_dual(t).tangent is not None
           for t in tensors):
        raise NotImplementedError(
            "forward-mode AD (torch.autograd.forward_ad) is not implemented for the Triton ops: "
            "the tangent would be dropped; use the PyTorch reference (each family module's "
            "`reference`) for jvp")


def _no_double_backward(name):
    def backward(ctx, *grads):
        raise RuntimeError(f"{name}: the second derivative is not implemented (the backward "
                           "kernel is not differentiable); use the PyTorch reference for "
                           "double backward")
    return backward


def _empty_like_rows(x):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _autocast_policies(autocast, autocast_output) -> dict:
    """{device type: (policy, output dtype or None)} for every device autocast is applied on."""
    policies = autocast if isinstance(autocast, dict) else dict.fromkeys(_AUTOCAST_KEYS, autocast)
    assert set(policies) == set(_AUTOCAST_KEYS), policies
    assert all(p in (None, LOWER, FLOAT32, PROMOTE) for p in policies.values()), policies
    out = autocast_output or {}
    return {dev: (policies[dev], out.get(dev)) for dev in _AUTOCAST_KEYS}


def _autocast_cast(args, device_type: str, policy):
    """args with their floating tensors on device_type cast as `policy` says; float64 is left,
    as autocast leaves it."""
    if policy is None:
        return args
    eligible = [isinstance(a, torch.Tensor) and a.is_floating_point()
                and a.device.type == device_type and a.dtype != torch.float64 for a in args]
    if policy == LOWER:
        dtype = torch.get_autocast_dtype(device_type)
    elif policy == FLOAT32:
        dtype = torch.float32
    else:
        dtypes = [a.dtype for a, e in zip(args, eligible) if e]
        if not dtypes:
            return args
        dtype = functools.reduce(torch.promote_types, dtypes)
    return tuple(a.to(dtype) if e and a.dtype != dtype else a for a, e in zip(args, eligible))


def _autocast_off(device_type: str):
    """Autocast off for device_type in this block, as the dispatcher turns it off below an
    Autocast kernel (the implementation's own PyTorch ops are not cast)."""
    key = getattr(torch._C.DispatchKey, _AUTOCAST_KEYS[device_type])
    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key))


def _device_type(args):
    return next(a.device.type for a in args if isinstance(a, torch.Tensor))


def _register_autocast(name, op, policies) -> None:
    """The registered op's kernels on the Autocast keys: the cast, then the op with autocast off
    (torch.library.register_autocast's kernel, with the policy's dtype taken at the call). In the
    op's own library, as register_autocast's: an op declared again (the package imported under a
    second name) replaces them with itself."""
    for device_type, (policy, out_dtype) in policies.items():
        def kernel(_keyset, *args, device_type=device_type, policy=policy, out_dtype=out_dtype):
            with _autocast_off(device_type):
                out = op(*_autocast_cast(args, device_type, policy))
            return out if out_dtype is None else out.to(out_dtype)
        op._lib.impl(name, kernel, _AUTOCAST_KEYS[device_type], with_keyset=True)


def declare(name, forward, fake, *, setup, backward, backward_op=None, backward_fake=None,
            eager_backward=None, direct=None, prepare=None, function=False,
            forward_with_options=None, autocast=None, autocast_output=None):
    """Register the op `triton_fusion::<name>` and make its paths: returns the call that picks
    among them, taking the op's arguments in its schema's order, with the registered ops and the
    Function as its attributes `op`, `backward_op` and `function` (None where there is none).

    - forward: the implementation, whose annotations are the op's schema; of a tuple of outputs
      the caller gets the first (the others are for the backward). fake: its fake.
    - setup(ctx, inputs, output): saves what the backward needs (the op's setup_context, and the
      Function's forward).
    - backward(ctx, *grads), in PyTorch ops; or, with a backward op, backward(ctx, bwd, *grads),
      which calls bwd with the backward op's arguments: bwd is the backward op itself, or, in the
      Function where no graph is built, eager_backward (default: backward_op).
    - backward_op, backward_fake: the implementation and fake of `<name>_backward`.
    - direct: the implementation without the dispatcher, returning the caller's output
      (default: forward). prepare: the arguments converted for the Function and the op (or a
      raise), where the direct path takes them as they are.
    - function: make the autograd.Function (an op with a backward op). forward_with_options: its
      forward where it is applied to more arguments than the schema's (a family's tuning
      options); eager_backward then gets them too.
    - autocast: the op's autocast policy (LOWER, FLOAT32, PROMOTE or None), or a dict of one per
      device type ("cuda", "cpu"); autocast_output: {device type: dtype} the output is cast to in
      an autocast region there (an op standing for PyTorch ops whose last gives that dtype).
    """
    assert not function or backward_op is not None, "the Function's backward is the backward op"
    op = torch.library.custom_op(f"{NS}::{name}", forward, mutates_args=())
    op.register_fake(fake)
    REGISTERED[name] = op
    first = len(_schema(name).returns) > 1
    bwd_op = formula = None
    if backward_op is not None:
        bwd_op = torch.library.custom_op(f"{NS}::{name}_backward", backward_op, mutates_args=())
        bwd_op.register_fake(backward_fake)
        bwd_op.register_autograd(_no_double_backward(f"{name}'s backward"))
        REGISTERED[f"{name}_backward"] = bwd_op

        def formula(ctx, *grads):
            return backward(ctx, bwd_op, *grads)
    op.register_autograd(formula or backward, setup_context=setup)
    policies = _autocast_policies(autocast, autocast_output)
    assert not first or not autocast_output, "the output cast is for single-output ops"
    _register_autocast(name, op, policies)
    fn = None
    if function:
        fn = _function(name, forward, forward_with_options, setup, backward, bwd_op,
                       eager_backward or backward_op, first, len(_schema(name).arguments))
    if direct is None:
        direct = (lambda *a: forward(*a)[0]) if first else forward

    # Functions, not an object's __call__: this runs on every call's host path.
    def call(*args):
        path = _path(args)
        if path == AUTOCAST:
            return autocast_call(args)
        return dispatch(args, path)

    def dispatch(args, path):
        if path == DIRECT:
            return direct(*args)
        if prepare is not None:
            args = prepare(*args)
        if path == FUNCTION and fn is not None:
            return fn.apply(*args)
        out = op(*args)
        return out[0] if first else out

    def autocast_call(args):
        device_type = _device_type(args)
        if device_type not in policies or not torch.is_autocast_enabled(device_type):
            return dispatch(args, _path(args, False))
        policy, out_dtype = policies[device_type]
        args = _autocast_cast(args, device_type, policy)
        with _autocast_off(device_type):
            out = dispatch(args, _path(args, False))
        return out if out_dtype is None else out.to(out_dtype)
    call.__name__ = call.__qualname__ = name
    call.op, call.backward_op, call.function = op, bwd_op, fn
    return call


def _schema(name):
    return getattr(getattr(torch.ops, NS), name).default._schema


def _function(name, forward, forward_with_options, setup, backward, bwd_op, eager, first, n):
    """The op's eager autograd.Function (named as the op, camel-cased, for its grad_fn)."""

    def fwd(ctx, *args):
        out = forward(*args)
        setup(ctx, args, out)
        return out[0] if first else out

    def bwd(ctx, *grads):
        # create_graph=True: the registered backward op keeps the gradients connected to their
        # inputs, so a second derivative through them raises (_no_double_backward) instead of
        # being pruned from the graph and silently missing.
        return backward(ctx, bwd_op if torch.is_grad_enabled() else eager, *grads)

    def fwd_options(ctx, *args):
        ctx.options = args[n:]
        if not ctx.options:
            return fwd(ctx, *args)
        out = forward_with_options(*args)
        setup(ctx, args[:n], out)
        return out[0] if first else out

    def bwd_options(ctx, *grads):
        options = ctx.options
        if not options:
            return bwd(ctx, *grads)
        if torch.is_grad_enabled():
            grads = backward(ctx, bwd_op, *grads)
        else:
            grads = backward(ctx, lambda *a: eager(*a, *options), *grads)
        return (*grads, *(None,) * len(options))

    # Only a Function applied to options (a family's tuning arguments) pays for them.
    plain = forward_with_options is None

    def body(ns):
        ns.update(forward=staticmethod(fwd if plain else fwd_options),
                  backward=staticmethod(bwd if plain else bwd_options), __module__=module,
                  __qualname__=camel, __doc__=f"{name} in eager autograd, without the dispatcher.")
    camel = "_" + "".join(part.capitalize() for part in name.split("_"))
    module = forward.__module__
    return types.new_class(camel, (torch.autograd.Function,), exec_body=body)
