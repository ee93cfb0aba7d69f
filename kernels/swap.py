"""`swap_in(model)`: the project's ops put into a model in place of PyTorch's, in place, where
the result is the same computation; a report of what was swapped and what was left, and why.

What it recognises (`ops` picks among them):
- "layer_norm": every nn.LayerNorm over one dim (not a subclass: its forward may differ) becomes
  `kernels.LayerNorm`, sharing its parameters;
- "mlp": an nn.Linear followed by a known activation (nn.GELU, nn.ReLU, transformers' GELUs) in
  an nn.Sequential becomes one `LinearAct` (the activation's slot an nn.Identity); a Hugging Face
  GPT-2 MLP's c_fc (Conv1D) + activation becomes one `linear_act` (Conv1D keeps its weight as
  (in, out), linear_act's own layout);
- "attention": a transformers model's attention implementation becomes `kernels.attention`
  through transformers' AttentionInterface (`ATTENTION_NAME`) with SDPA's masks: causal or none;
  a padding mask, or attention dropout while training, is refused when called, with a message;
- "head": GPT-2's LM head and loss (GPT2LMHeadModel): with labels, the final hidden states go to
  `linear_cross_entropy` (the logits never made; the output's logits are None); without, the
  logits as before.

The parameters are shared, not copied: state dict keys, tied weights and an optimizer built
before the swap are unchanged. transformers is imported only for a transformers model.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect

import torch
from torch import nn

from .families.attention import attention
from .families.linear_act import linear_act
from .modules import LayerNorm, LinearAct, LinearCrossEntropy

SWAPPABLE = ("layer_norm", "mlp", "attention", "head")
ATTENTION_NAME = "triton_fusion"  # the attention implementation's name in transformers

__all__ = ["ATTENTION_NAME", "SWAPPABLE", "SwapReport", "attention_forward", "register_attention",
           "swap_in"]


@dataclasses.dataclass
class SwapReport:
    """swapped: (module path, what it became); left: (module path, why not)."""
    swapped: list = dataclasses.field(default_factory=list)
    left: list = dataclasses.field(default_factory=list)

    def count(self, what: str) -> int:
        """How many swaps of one kind ("LayerNorm", "LinearAct", ...) were made."""
        return sum(w.split(" ")[0] == what for _, w in self.swapped)

    def __str__(self) -> str:
        lines = [f"swapped {len(self.swapped)}:"] + [f"  {p or '(model)'}: {w}"
                                                     for p, w in self.swapped]
        lines += [f"left {len(self.left)}:"] + [f"  {p or '(model)'}: {w}" for p, w in self.left]
        return "\n".join(lines)


def swap_in(model: nn.Module, ops=SWAPPABLE) -> SwapReport:
    """Put the project's ops into model (in place) where they compute what its modules do; see
    the module's docstring. ops: a subset of SWAPPABLE. Returns the SwapReport."""
    unknown = set(ops) - set(SWAPPABLE)
    if unknown:
        raise ValueError(f"ops must be among {SWAPPABLE}, got {sorted(unknown)}")
    report = SwapReport()
    if "layer_norm" in ops:
        _swap_layer_norms(model, report)
    if "mlp" in ops:
        _swap_mlps(model, report)
    if "attention" in ops:
        _swap_attention(model, report)
    if "head" in ops:
        _swap_head(model, report)
    return report


def _children(model):
    """(path, parent, name, child) of every module below model, listed before any is replaced."""
    return [(f"{path}.{name}" if path else name, parent, name, child)
            for path, parent in model.named_modules() for name, child in parent.named_children()]


def _swap_layer_norms(model, report) -> None:
    for path, parent, name, child in _children(model):
        if not isinstance(child, nn.LayerNorm) or isinstance(child, LayerNorm):
            continue
        if type(child) is not nn.LayerNorm:
            report.left.append((path, f"{type(child).__name__}, a subclass of nn.LayerNorm (its "
                                      "forward may differ)"))
        elif len(child.normalized_shape) != 1:
            report.left.append((path, f"LayerNorm over {len(child.normalized_shape)} dims (the "
                                      "kernels normalise the last one)"))
        else:
            setattr(parent, name, LayerNorm.from_torch(child))
            report.swapped.append((path, "LayerNorm"))


def activation_name(module: nn.Module) -> str | None:
    """linear_act's name for an activation module that computes it exactly, else None."""
    kind = type(module).__name__
    if isinstance(module, nn.ReLU):
        return "relu"
    if isinstance(module, nn.GELU):
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(module.approximate)
    # transformers' (by name: transformers is not imported for a model that is not one).
    if kind in ("NewGELUActivation", "GELUTanh", "PytorchGELUTanh", "FastGELUActivation"):
        return "gelu_tanh"  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), each of them
    if kind == "GELUActivation":
        return "gelu"
    return None


def _swap_mlps(model, report) -> None:
    for path, module in list(model.named_modules()):
        if isinstance(module, nn.Sequential):
            children = list(module.named_children())
            for (name, linear), (act_name, act) in zip(children, children[1:]):
                if type(linear) is nn.Linear and activation_name(act) is not None \
                        and not isinstance(act, nn.Identity):
                    where = f"{path}.{name}" if path else name
                    setattr(module, name, LinearAct.from_linear(linear, activation_name(act)))
                    setattr(module, act_name, nn.Identity())
                    report.swapped.append((where, f"LinearAct ({activation_name(act)}, with "
                                                  f"{act_name})"))
        elif type(module).__name__ == "GPT2MLP":
            where = path
            act = activation_name(module.act)
            if act is None:
                report.left.append((where, f"GPT-2 MLP: activation {type(module.act).__name__} "
                                           "has no exact fused form"))
                continue
            parent, name = _parent(model, path)
            setattr(parent, name, FusedGPT2MLP(module, act))
            report.swapped.append((where, f"LinearAct (GPT-2's c_fc + {act})"))


def _parent(model, path):
    parent_path, _, name = path.rpartition(".")
    return (model.get_submodule(parent_path) if parent_path else model), name


class FusedGPT2MLP(nn.Module):
    """transformers' GPT2MLP (Conv1D c_fc, activation, Conv1D c_proj, dropout) with c_fc and the
    activation as one linear_act; the same submodules, so the same state dict."""

    def __init__(self, mlp: nn.Module, activation: str):
        super().__init__()
        self.c_fc, self.c_proj, self.dropout = mlp.c_fc, mlp.c_proj, mlp.dropout
        self.activation = activation

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"

    def forward(self, x):
        h = linear_act(x.reshape(-1, x.shape[-1]), self.c_fc.weight, self.c_fc.bias,
                       self.activation)
        return self.dropout(self.c_proj(h.view(*x.shape[:-1], -1)))


# --------------------------------------------------------------------------- attention


_NOT_CAUSAL = ("only a causal mask is supported (no padding): the Triton kernel takes no mask")


def _check_causal_mask(mask: torch.Tensor, n_q: int, n_k: int) -> None:
    """Raise unless the (..., n_q, n_k) mask keeps exactly the bottom-right causal triangle (bool:
    True keeps; float: 0 keeps), the same for every batch and head. Where the host cannot wait for
    the answer (a CUDA graph being captured, which is when transformers passes the mask it
    otherwise skips; torch.compile tracing) it is a device-side assert, as torch's checks of
    data there: never a silently dropped padding."""
    keep = mask if mask.dtype == torch.bool else mask == 0
    want = torch.ones(n_q, n_k, dtype=torch.bool, device=mask.device).tril(n_k - n_q)
    causal = (keep == want).all()
    if torch.compiler.is_compiling() or (
            mask.is_cuda and torch.cuda.is_current_stream_capturing()):
        torch._assert_async(causal, _NOT_CAUSAL)
    elif not causal:
        raise NotImplementedError(_NOT_CAUSAL)


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      is_causal=None, **kwargs):
    """transformers' attention interface, as its SDPA implementation: q, k, v (batch, heads,
    seq, head_dim) -> output (batch, seq, heads, head_dim) and no weights. Refuses what the kernel
    does not compute: dropout, a mask other than the causal one (padding), an attention bias,
    sinks, soft-capping or a sliding window."""
    if dropout:
        raise NotImplementedError(
            f"attention dropout (p={dropout}) while training: the Triton kernel has none; set the "
            "model's attention dropout to 0 (GPT-2: attn_pdrop=0.0) or call model.eval()")
    for name in ("position_bias", "s_aux", "softcap", "sliding_window"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"attention with {name}: not supported by the Triton kernel")
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    n_q, n_k = query.shape[2], key.shape[2]
    if attention_mask is not None:
        if not causal:
            raise NotImplementedError(_NOT_CAUSAL)
        _check_causal_mask(attention_mask, n_q, n_k)
    elif causal and 1 < n_q < n_k:
        # As SDPA's: no mask with more keys than queries is a prefill into an empty static
        # cache, whose causal mask is aligned to the top left.
        key, value = key[:, :, :n_q], value[:, :, :n_q]
    out = attention(query, key, value, causal, scaling)
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> None:
    """Make `attention_forward` transformers' attention implementation ATTENTION_NAME, with
    SDPA's masks: none for a causal batch without padding (no mask to build or check), a 4-D one
    with padding, which `attention_forward` refuses. (transformers gives an implementation with
    no mask function of its own no mask at all: padding would be dropped silently.)"""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


def _is_transformers_model(model) -> bool:
    return hasattr(model, "config") and hasattr(model, "set_attn_implementation")


def _swap_attention(model, report) -> None:
    if not _is_transformers_model(model):
        for path, m in model.named_modules():
            if isinstance(m, nn.MultiheadAttention):
                report.left.append((path, "nn.MultiheadAttention (its projections and masks "
                                          "are its own; kernels.Attention is SDPA's core)"))
        return
    register_attention()
    try:
        model.set_attn_implementation(ATTENTION_NAME)
    except (ValueError, ImportError) as exc:
        report.left.append(("", f"attention: transformers refused it ({exc})"))
        return
    what = f"attention ({type(model).__name__}'s, attn_implementation={ATTENTION_NAME!r})"
    p = max(float(getattr(model.config, k, 0.0) or 0.0)
            for k in ("attn_pdrop", "attention_dropout"))
    if p > 0:
        what += f"; its dropout p={p} makes a training step raise (set it to 0, or eval())"
    report.swapped.append(("", what))


# --------------------------------------------------------------------------- LM head + loss


def _swap_head(model, report) -> None:
    if type(model).__name__ != "GPT2LMHeadModel":
        head = getattr(model, "lm_head", None)
        if isinstance(head, nn.Linear):
            report.left.append(("lm_head", f"the LM head of {type(model).__name__} (only GPT-2's "
                                           "forward is known here; kernels.LinearCrossEntropy "
                                           "computes a head's loss)"))
        return
    if not isinstance(model.lm_head, (nn.Linear, LinearCrossEntropy)):
        report.left.append(("lm_head", f"{type(model.lm_head).__name__}, not an nn.Linear"))
        return
    if type(model.lm_head) is nn.Linear:
        model.lm_head = LinearCrossEntropy.from_linear(model.lm_head)
    from transformers.modeling_outputs import CausalLMOutputWithCrossAttentions as output

    names = [n for n, p in inspect.signature(type(model).forward).parameters.items()
             if p.kind is p.POSITIONAL_OR_KEYWORD][1:]
    # On the instance (as Liger-Kernel binds its fused forward): this model only.
    model.forward = functools.partial(_lm_forward_with_fused_loss, model, names, output)
    report.swapped.append(("lm_head", "LinearCrossEntropy (with labels: the loss without the "
                                      "logits)"))


def _lm_forward_with_fused_loss(model, names, output, *args, **kwargs):
    """GPT2LMHeadModel.forward, but with labels: the base model's hidden states to the fused
    loss, as transformers' ForCausalLMLoss computes it (labels shifted left, ignore_index -100 or
    the one given; the mean over the targets kept, or the sum over num_items_in_batch)."""
    named = dict(zip(names, args))
    named.update(kwargs)
    labels = named.pop("labels", None)
    if labels is None:
        return type(model).forward(model, *args, **kwargs)
    named.pop("logits_to_keep", None)  # no logits are made
    out = model.transformer(**named)
    hidden = out.last_hidden_state
    ignore_index = named.get("ignore_index", -100)
    target = named.get("shift_labels")
    if target is None:
        target = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    target = target.to(hidden.device)
    head = model.lm_head
    count = named.get("num_items_in_batch")
    if head.ignore_index != ignore_index:
        head = LinearCrossEntropy.from_linear(head, ignore_index=ignore_index)
    if count is None:
        loss = head(hidden, target, reduction="mean")
    else:
        loss = head(hidden, target, reduction="sum")
        loss = loss / (count.to(loss.device) if torch.is_tensor(count) else count)
    result = output(
        loss=loss, logits=None, past_key_values=out.past_key_values,
        hidden_states=out.hidden_states, attentions=out.attentions,
        cross_attentions=out.cross_attentions)
    return result if named.get("return_dict", True) is not False else result.to_tuple()
