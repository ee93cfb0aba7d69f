"""The public ops, registered with PyTorch (`torch.library.custom_op`, namespace `triton_fusion`),
so that a model calling them compiles with `torch.compile(fullgraph=True)`, captures in a CUDA
graph and passes `torch.library.opcheck`.

Each op has its Triton implementation (the family module's fused version), a fake
implementation (the same input checks, then an empty result of the right shape: errors surface
at trace time with the messages of eager) and an autograd formula. softmax, LayerNorm and
attention have backward kernels; the others' backward is written in PyTorch ops (correct, not
fused).
Backward ops have no second derivative: differentiating through one raises. Forward-mode AD
(dual tensors) raises too.

The public functions (`kernels.softmax` ...) call the Triton implementation directly when nothing
needs the dispatcher (eager, no input requiring grad, plain tensors or nn.Parameters): a custom
op's Python dispatch costs tens of microseconds a call, more than a small kernel's launch. Under
torch.compile, export, fake tensors or autograd they call the registered op (LayerNorm's eager
autograd excepted: its autograd.Function, the same kernels, costs less).
"""
from __future__ import annotations

import math

import torch
import torch.autograd.forward_ad as _fwad
from torch.fx.experimental.symbolic_shapes import guard_or_false

from . import elementwise as _ew
from . import flash_attention as _fa
from . import flash_attention_backward as _fab
from . import layernorm as _ln
from . import layernorm_backward as _lnb
from . import linear_activation as _la
from . import row_softmax as _sm
from . import row_softmax_backward as _smb
from . import softmax_regression as _sr
from . import softmax_v as _sv
from ._common import as_rows
from .matmul_core import _check_operands

NS = "triton_fusion"


# Tensors the implementations may take without the dispatcher: nn.Parameter (a model's weights)
# is a plain tensor to every op (it overrides no torch function).
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _direct(*tensors) -> bool:
    """True where the op's implementation may be called without the dispatcher."""
    if torch.compiler.is_compiling():
        return False
    if _fwad._current_level >= 0:
        _refuse_tangents(tensors)
    grad = torch.is_grad_enabled()
    for t in tensors:
        if isinstance(t, torch.Tensor) and (type(t) not in _PLAIN or (grad and t.requires_grad)):
            return False
    return True


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


# ------------------------------------------------------------------------------------------------
# add_mul: (x + y) * z


@torch.library.custom_op(f"{NS}::add_mul", mutates_args=())
def _add_mul_op(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return _ew.triton_fused(x, y, z)


@torch.library.custom_op(f"{NS}::add_mul_scalar", mutates_args=())
def _add_mul_scalar_op(x: torch.Tensor, y: torch.Tensor, z: float) -> torch.Tensor:
    return _ew.triton_fused(x, y, z)


@_add_mul_op.register_fake
def _(x, y, z):
    _ew._check_inputs(x, y, z)
    return _empty_like_rows(x)


@_add_mul_scalar_op.register_fake
def _(x, y, z):
    _ew._check_inputs(x, y, z)
    return _empty_like_rows(x)


def _add_mul_setup(ctx, inputs, output):
    x, y, z = inputs
    if isinstance(z, torch.Tensor):
        ctx.save_for_backward(x, y, z)
    else:
        ctx.save_for_backward(x, y)
    ctx.z = None if isinstance(z, torch.Tensor) else z


def _add_mul_backward(ctx, dout):
    """d/dx = d/dy = dout * z; d/dz = dout * (x + y), summed over z's broadcast dims."""
    if ctx.z is not None:
        x, y = ctx.saved_tensors
        g = (dout.float() * ctx.z).to(x.dtype)
        return g, g, None
    x, y, z = ctx.saved_tensors
    g = (dout.float() * z.float()).to(x.dtype)
    dz = None
    if ctx.needs_input_grad[2]:
        full = dout.float() * (x.float() + y.float())
        lead = full.dim() - z.dim()
        # guard_or_false: a data-dependent size of z (rows selected by a mask, under
        # torch.compile) cannot be guarded on; it is taken as not broadcast, as PyTorch's own
        # broadcasting takes it.
        dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(z.shape)
                                          if guard_or_false(s == 1))
        dz = (full.sum(dims, keepdim=True) if dims else full).reshape(z.shape).to(z.dtype)
    return g, g, dz


_add_mul_op.register_autograd(_add_mul_backward, setup_context=_add_mul_setup)
_add_mul_scalar_op.register_autograd(_add_mul_backward, setup_context=_add_mul_setup)


def add_mul(x: torch.Tensor, y: torch.Tensor, z) -> torch.Tensor:
    """`(x + y) * z` in one fused Triton kernel; differentiable.

    x, y: contiguous tensors of one shape and dtype (float32, float16 or bfloat16), on CUDA (or on
    the CPU under TRITON_INTERPRET=1). z: a tensor of the same dtype broadcastable to x, or a Python
    number. The sum and product are computed in float32 and rounded once to x's dtype.
    """
    if _direct(x, y, z):
        return _ew.triton_fused(x, y, z)
    if isinstance(z, torch.Tensor):
        return _add_mul_op(x, y, z)
    if isinstance(z, bool) or not isinstance(z, (int, float)):
        _ew._check_inputs(x, y, z)  # raises the eager error
    return _add_mul_scalar_op(x, y, float(z))


# ------------------------------------------------------------------------------------------------
# softmax over the last dim; fused backward


@torch.library.custom_op(f"{NS}::softmax", mutates_args=())
def _softmax_op(x: torch.Tensor) -> torch.Tensor:
    return _sm.triton_fused(x)


@_softmax_op.register_fake
def _(x):
    as_rows("x", x)
    return _empty_like_rows(x)


@torch.library.custom_op(f"{NS}::softmax_backward", mutates_args=())
def _softmax_backward_op(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    return _smb.softmax_backward(y, dy)


@_softmax_backward_op.register_fake
def _(y, dy):
    return _empty_like_rows(y)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _softmax_backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return _softmax_backward_op(y, dy.contiguous())


_softmax_op.register_autograd(_softmax_backward, setup_context=_softmax_setup)
_softmax_backward_op.register_autograd(_no_double_backward("softmax's backward"))


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of x in fused Triton kernels (see `row_softmax.plan` for which);
    differentiable (one fused backward kernel).

    x: float32, float16 or bfloat16, at least 1-D, on CUDA (or on the CPU under TRITON_INTERPRET=1),
    last dim contiguous. Any row length. Math in float32, output in x's dtype and shape."""
    if _direct(x):
        return _sm.triton_fused(x)
    return _softmax_op(x)


# ------------------------------------------------------------------------------------------------
# LayerNorm; fused forward and backward


@torch.library.custom_op(f"{NS}::layer_norm", mutates_args=())
def _layer_norm_op(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    y, stats = _ln._fused_forward(x, weight, bias, eps, None, None, None)
    return y, stats


@_layer_norm_op.register_fake
def _(x, weight, bias, eps):
    _, n_rows, _ = _ln._check_inputs(x, weight, bias, eps)
    return _empty_like_rows(x), x.new_empty((2, n_rows), dtype=torch.float32)


@torch.library.custom_op(f"{NS}::layer_norm_backward", mutates_args=())
def _layer_norm_backward_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                            bias: torch.Tensor | None, stats: torch.Tensor, need_dw: bool,
                            need_db: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """bias is passed for its dtype only (dbias is returned in it)."""
    dx, dw, db = _lnb.backward(dy, x, weight, stats, need_dw, need_db, None, None, None,
                               None if bias is None else bias.dtype)
    # A custom op's outputs cannot be None (nor alias each other): an empty tensor of its own
    # stands for "not needed".
    return (dx, x.new_empty((0,)) if dw is None else dw, x.new_empty((0,)) if db is None else db)


@_layer_norm_backward_op.register_fake
def _(dy, x, weight, bias, stats, need_dw, need_db):
    n = x.shape[-1]
    dw = x.new_empty((n,), dtype=weight.dtype) if need_dw else x.new_empty((0,))
    db = x.new_empty((n,), dtype=bias.dtype) if need_db else x.new_empty((0,))
    return _empty_like_rows(x), dw, db


def _layer_norm_setup(ctx, inputs, output):
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight, bias, output[1])


def _layer_norm_backward(ctx, dy, _dstats):
    x, weight, bias, stats = ctx.saved_tensors
    need_dw = weight is not None and ctx.needs_input_grad[1]
    need_db = bias is not None and ctx.needs_input_grad[2]
    dx, dw, db = _layer_norm_backward_op(dy.contiguous(), x, weight, bias, stats, need_dw,
                                         need_db)
    return dx, dw if need_dw else None, db if need_db else None, None


_layer_norm_op.register_autograd(_layer_norm_backward, setup_context=_layer_norm_setup)
_layer_norm_backward_op.register_autograd(_no_double_backward("layer_norm's backward"))


def layer_norm(x: torch.Tensor, weight=None, bias=None, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dim of x in fused Triton kernels; differentiable (fused backward;
    no second derivative).

    x: float32, float16 or bfloat16, at least 1-D, on CUDA (or on the CPU under TRITON_INTERPRET=1),
    last dim contiguous. weight, bias: None or contiguous (N,) tensors on x's device, N =
    x.shape[-1], of x's dtype or float32 (as F.layer_norm takes them in mixed precision).
    Statistics and math in float32; output and dx in x's dtype, dweight and dbias in theirs."""
    if _direct(x, weight, bias):
        return _ln._fused_forward(x, weight, bias, eps, None, None, None, stats=False)[0]
    if not torch.compiler.is_compiling() and all(
            t is None or type(t) in _PLAIN for t in (x, weight, bias)):
        # Eager autograd: the autograd.Function costs the host about 40% less than the custom
        # op's autograd (same kernels; under create_graph its backward is this module's op).
        return _ln.triton_fused(x, weight, bias, eps)
    # float() would take True, "1e-5" or a tensor: refuse them as the eager path does (this path
    # also takes nn.Parameter weights); a float's value is checked by the op.
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        _ln._check_eps(eps)
    return _layer_norm_op(x, weight, bias, float(eps))[0]


# ------------------------------------------------------------------------------------------------
# softmax(x) @ v


@torch.library.custom_op(f"{NS}::softmax_matmul", mutates_args=())
def _softmax_matmul_op(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return _sv.triton_fused(x, v)


@_softmax_matmul_op.register_fake
def _(x, v):
    _sv._check_inputs(x, v, None)
    return x.new_empty((x.shape[0], x.shape[1], v.shape[2]))


def _softmax_matmul_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _softmax_matmul_backward(ctx, dout):
    """P = softmax(x) recomputed in float32: dv = P^T dout, dx = P * (dP - rowsum(dP * P)) with
    dP = dout v^T."""
    x, v = ctx.saved_tensors
    p = torch.softmax(x.float(), -1)
    g = dout.float()
    dv = (p.transpose(1, 2) @ g).to(v.dtype)
    dp = g @ v.float().transpose(1, 2)
    dx = (p * (dp - (dp * p).sum(-1, keepdim=True))).to(x.dtype)
    return dx, dv


_softmax_matmul_op.register_autograd(_softmax_matmul_backward, setup_context=_softmax_matmul_setup)


def softmax_matmul(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`softmax(x, -1) @ v` in one fused Triton kernel, the softmax matrix never stored;
    differentiable (backward in PyTorch ops).

    x: (batch, d1, d2), v: (batch, d2, d3), one dtype (float32, float16 or bfloat16), any strides,
    on CUDA (or on the CPU under TRITON_INTERPRET=1). float32 uses IEEE products, like PyTorch's
    default; see softmax_v.triton_fused for tf32 and block sizes. Returns (batch, d1, d3) in x's
    dtype.
    """
    if _direct(x, v):
        return _sv.triton_fused(x, v)
    return _softmax_matmul_op(x, v)


# ------------------------------------------------------------------------------------------------
# attention


@torch.library.custom_op(f"{NS}::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  sm_scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, per-row log-sum-exp for the backward)."""
    return _fa.triton_fused(q, k, v, causal, sm_scale, return_lse=True)


@_attention_op.register_fake
def _(q, k, v, causal, sm_scale):
    _fa._check_inputs(q, k, v, causal, sm_scale)
    batch, heads, seq, _ = q.shape
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty((batch * heads, seq), dtype=torch.float32))


@torch.library.custom_op(f"{NS}::attention_backward", mutates_args=())
def _attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                           lse: torch.Tensor, dout: torch.Tensor, causal: bool,
                           sm_scale: float | None
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sm_scale None: the forward's default, 1/sqrt(head_dim)."""
    if sm_scale is None:
        sm_scale = _fa.default_scale(q.shape[-1])
    return _fab.attention_backward(q, k, v, out, lse, dout, causal, sm_scale)


@_attention_backward_op.register_fake
def _(q, k, v, out, lse, dout, causal, sm_scale):
    # Contiguous, as the kernels write them (empty_like would keep the strides of a dense view
    # such as (batch, seq, heads, dim).transpose(1, 2), which Inductor then asserts on).
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _attention_setup(ctx, inputs, output):
    q, k, v, causal, sm_scale = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.causal = causal
    # None stays None (the backward op computes the default): math.sqrt of a symbolic head_dim
    # here, under AOTAutograd, would specialise it.
    ctx.sm_scale = sm_scale


def _attention_backward(ctx, dout, _dlse):
    """FlashAttention-2's backward kernels (kernels.flash_attention_backward)."""
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = _attention_backward_op(q, k, v, out, lse, dout, ctx.causal, ctx.sm_scale)
    return dq, dk, dv, None, None


_attention_op.register_autograd(_attention_backward, setup_context=_attention_setup)
_attention_backward_op.register_autograd(_no_double_backward("attention's backward"))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              sm_scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * sm_scale [causal mask]) @ v in one fused Triton kernel; differentiable
    (FlashAttention-2 backward kernels: dq, dk, dv from the saved log-sum-exp).

    q: (batch, heads, seq_q, head_dim); k, v: (batch, kv_heads, seq_k, head_dim) with kv_heads
    dividing heads (grouped-query attention; k and v are not repeated in memory). Contiguous,
    float16 or bfloat16, head_dim up to 256, any lengths; on CUDA (or the CPU
    under TRITON_INTERPRET=1). sm_scale: any finite real, default 1/sqrt(head_dim). causal: query
    i sees keys j <= i + seq_k - seq_q, aligned to the bottom right as FlashAttention and
    PyTorch's `causal_lower_right` define it for a KV cache (the same as top-left when
    seq_q == seq_k); more queries than keys is refused.
    """
    if _direct(q, k, v):
        return _fa.triton_fused(q, k, v, causal, sm_scale)
    return _attention_op(q, k, v, bool(causal),
                         None if sm_scale is None else float(sm_scale))[0]


# ------------------------------------------------------------------------------------------------
# softmax(x @ weight + bias)


@torch.library.custom_op(f"{NS}::matmul_softmax", mutates_args=())
def _matmul_softmax_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                       ) -> torch.Tensor:
    return _sr.matmul_softmax_fused(x, weight, bias)


@_matmul_softmax_op.register_fake
def _(x, weight, bias):
    _check_operands(x, weight, bias)
    return x.new_empty((x.shape[0], weight.shape[1]))


def _matmul_softmax_setup(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight, output)
    ctx.has_bias = bias is not None


def _matmul_softmax_backward(ctx, dy):
    """From the saved probabilities y: dz = y * (dy - rowsum(dy * y)); dx = dz W^T, dW = x^T dz,
    dbias = column sums of dz (float32 math, results in the inputs' dtypes)."""
    x, weight, y = ctx.saved_tensors
    yf = y.float()
    g = dy.float()
    dz = yf * (g - (g * yf).sum(-1, keepdim=True))
    dx = (dz @ weight.float().t()).to(x.dtype) if ctx.needs_input_grad[0] else None
    dw = (x.float().t() @ dz).to(weight.dtype) if ctx.needs_input_grad[1] else None
    db = dz.sum(0).to(x.dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return dx, dw, db


_matmul_softmax_op.register_autograd(_matmul_softmax_backward, setup_context=_matmul_softmax_setup)


def matmul_softmax(x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """`softmax(x @ weight + bias, -1)` with the matmul and the softmax fused (see
    `softmax_regression.matmul_softmax_plan`); differentiable (backward in PyTorch ops).

    x (B, K), weight (K, C), bias (C,) or None; one dtype (float32, float16, bfloat16), on CUDA (or
    on the CPU under TRITON_INTERPRET=1). Returns (B, C) probabilities in x's dtype."""
    if _direct(x, weight, bias):
        return _sr.matmul_softmax_fused(x, weight, bias)
    return _matmul_softmax_op(x, weight, bias)


# ------------------------------------------------------------------------------------------------
# act(x @ weight + bias)


@torch.library.custom_op(f"{NS}::linear_act", mutates_args=())
def _linear_act_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   activation: str) -> torch.Tensor:
    return _la.linear_act_fused(x, weight, bias, activation)


@_linear_act_op.register_fake
def _(x, weight, bias, activation):
    _check_operands(x, weight, bias, "K", "N")
    _la._check_activation(activation)
    return x.new_empty((x.shape[0], weight.shape[1]))


def _linear_act_setup(ctx, inputs, output):
    x, weight, bias, activation = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.activation = activation


def _activation_grad(h, activation):
    """d act(h) / dh, float32."""
    if activation == "none":
        return torch.ones_like(h)
    if activation == "relu":
        return (h > 0).to(h.dtype)
    if activation == "gelu":
        return 0.5 * (1 + torch.erf(h / math.sqrt(2))) + h * torch.exp(-0.5 * h * h) / math.sqrt(
            2 * math.pi)
    # gelu_tanh: 0.5 h (1 + tanh(u)), u = sqrt(2/pi) (h + 0.044715 h^3)
    c = math.sqrt(2 / math.pi)
    t = torch.tanh(c * (h + 0.044715 * h ** 3))
    return 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * c * (1 + 3 * 0.044715 * h * h)


def _linear_act_backward(ctx, dy):
    """h = x W + b recomputed in float32; dh = dy * act'(h); dx = dh W^T, dW = x^T dh,
    db = sum dh."""
    x, weight, bias = ctx.saved_tensors
    xf, wf = x.float(), weight.float()
    h = xf @ wf
    if bias is not None:
        h = h + bias.float()
    dh = dy.float() * _activation_grad(h, ctx.activation)
    dx = (dh @ wf.t()).to(x.dtype) if ctx.needs_input_grad[0] else None
    dw = (xf.t() @ dh).to(weight.dtype) if ctx.needs_input_grad[1] else None
    db = dh.sum(0).to(bias.dtype) if bias is not None and ctx.needs_input_grad[2] else None
    return dx, dw, db, None


_linear_act_op.register_autograd(_linear_act_backward, setup_context=_linear_act_setup)


def linear_act(x: torch.Tensor, weight: torch.Tensor, bias=None,
               activation: str = "gelu") -> torch.Tensor:
    """act(x @ weight + bias) in one fused Triton matmul; differentiable (backward in PyTorch ops).

    x (M, K), weight (K, N) -- x @ weight, not F.linear's (N, K): pass `linear.weight.t()` --,
    bias (N,) or None; activation "relu", "gelu" (exact erf), "gelu_tanh" or "none". One dtype for
    all (float32, float16, bfloat16), any strides. float32 runs the matmul in TF32.
    """
    if _direct(x, weight, bias):
        return _la.linear_act_fused(x, weight, bias, activation)
    return _linear_act_op(x, weight, bias, activation)


# What torch.library registered, by public name (the tests run opcheck on each).
OPS = {"add_mul": _add_mul_op, "add_mul_scalar": _add_mul_scalar_op, "softmax": _softmax_op,
       "softmax_backward": _softmax_backward_op, "layer_norm": _layer_norm_op,
       "layer_norm_backward": _layer_norm_backward_op, "softmax_matmul": _softmax_matmul_op,
       "attention": _attention_op, "attention_backward": _attention_backward_op,
       "matmul_softmax": _matmul_softmax_op,
       "linear_act": _linear_act_op}

__all__ = ["OPS", "add_mul", "attention", "layer_norm", "linear_act", "matmul_softmax", "softmax",
           "softmax_matmul"]
