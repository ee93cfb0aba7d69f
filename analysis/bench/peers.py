"""The Triton kernel libraries a user would pick instead of ours, as baselines: Liger-Kernel
(softmax, LayerNorm) and FlagGems (softmax, LayerNorm, attention).

Optional and pinned (`pip install .[peers]`, versions in PINNED). Where a library is not
installed (or does not import on this machine), its variants raise `Missing`, which the runner
records as a row with status `unsupported` and the reason: the data say what was left out.
Each row's `variant` names the library's version.
"""
from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util

import torch

from .sweep import Variant

# impl -> (module, distribution, the version the references were measured with)
PINNED = {"liger": ("liger_kernel", "liger-kernel", "0.8.5"),
          "flag_gems": ("flag_gems", "flag-gems", "5.0.2"),
          # Apple's Cut Cross-Entropy: no sweep rows, the LM head front's (a tail step) alone.
          "cce": ("cut_cross_entropy", "cut-cross-entropy", "25.1.1")}
# The peers measured by a tail step alone, and what lacks them.
TAIL_PEERS = {"cce": "the LM head front's Cut Cross-Entropy points"}
# Not a baseline: the model the GPT-2 check builds (analysis/bench/model_check.py), pinned too.
# `make setup` installs these on a GPU machine (pyproject.toml's `peers` and `model` extras).
MODEL = ("transformers", "transformers", "5.17.0")


class Missing(NotImplementedError):
    """A peer library that is not installed or does not import here."""


@functools.cache
def _version(impl: str):
    """(installed version or None, label or why not), from the package metadata alone: building
    the grid imports no peer (FlagGems and Liger take seconds to import, in every process)."""
    module, dist, pinned = PINNED[impl]
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None, f"{dist} is not installed (pip install {dist}=={pinned})"
    return version, f"{dist} {version}" + ("" if version == pinned else f" (pinned: {pinned})")


@functools.cache
def _load(impl: str):
    """(module, version label) of a peer library, or (None, why not); imported at its first use."""
    version, text = _version(impl)
    if version is None:
        return None, text
    module, dist, _ = PINNED[impl]
    try:
        return importlib.import_module(module), text
    except Exception as exc:  # noqa: BLE001 - e.g. no GPU for its device detection
        return None, f"{dist} {version} does not import here: {type(exc).__name__}: {exc}"[:300]


def label(impl: str) -> str | None:
    """The installed version's label (None where it is not installed); a library that is
    installed but does not import is found at its rows' first call, which record why."""
    version, text = _version(impl)
    return text if version is not None else None


def missing(problems, tail: bool = False) -> list[str]:
    """What a bench of `problems` (and its tail steps) will lack, said before it starts: each
    peer library not installed, with the rows that will say `unsupported` for it, and
    transformers for the GPT-2 check."""
    out = []
    for impl, (_, dist, pinned) in PINNED.items():
        if _version(impl)[0] is not None:
            continue
        rows = [p.family for p in problems for v in p.variants if v.impl == impl]
        if rows:
            out.append(f"bench: {dist} is not installed (pip install {dist}=={pinned}; make "
                       f"setup installs it on a GPU machine): its {len(rows)} rows ("
                       f"{', '.join(sorted(set(rows)))}) will say unsupported")
    for impl, what in TAIL_PEERS.items():
        if tail and _version(impl)[0] is None:
            _, dist, pinned = PINNED[impl]
            out.append(f"bench: {dist} is not installed (pip install {dist}=={pinned}; make setup "
                       f"installs it on a GPU machine): {what} will say unsupported")
    if tail and importlib.util.find_spec(MODEL[0]) is None:
        out.append(f"bench: {MODEL[1]} is not installed (pip install {MODEL[1]}=={MODEL[2]}): "
                   "the GPT-2 check will be skipped")
    return out


def _need(impl: str):
    mod, text = _load(impl)
    if mod is None:
        raise Missing(text)
    return mod


def _variant(impl, fn, bytes_impl=None, **kw) -> Variant:
    return Variant(impl, fn, variant=label(impl), bytes_impl=bytes_impl, **kw)


# --- softmax -------------------------------------------------------------------------------


def liger_softmax(x):
    _need("liger")
    from liger_kernel.ops.softmax import _softmax_forward

    return _softmax_forward(x)[0]


def flag_gems_softmax(x):
    return _need("flag_gems").ops.softmax(x, -1)


@functools.lru_cache(maxsize=16)
def _liger_softmax_settings(width: int, dtype, device):
    from liger_kernel.ops.softmax import _softmax_forward

    _, block, warps, multi = _softmax_forward(torch.zeros(1, width, dtype=dtype, device=device))
    return block, warps, multi


def liger_softmax_autograd(x):
    """Liger's softmax as a model calls it: its autograd Function (forward and backward)."""
    _need("liger")
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    return LigerSoftmaxFunction.apply(x)


def liger_softmax_backward(y, dy):
    """dx from the forward's output y, as Liger's autograd backward computes it (with the tile
    settings its forward chose for this width)."""
    _need("liger")
    from liger_kernel.ops.softmax import _softmax_backward

    return _softmax_backward(dy, y, *_liger_softmax_settings(y.shape[-1], y.dtype, y.device))


def flag_gems_softmax_backward(y, dy):
    _need("flag_gems")
    from flag_gems.ops.softmax import softmax_backward

    return softmax_backward(dy, y, -1, y.dtype)


def softmax_variants(bytes_impl) -> list[Variant]:
    return [_variant("liger", liger_softmax, bytes_impl),
            _variant("flag_gems", flag_gems_softmax, bytes_impl)]


def softmax_backward_variants(bytes_impl) -> list[Variant]:
    return [_variant("liger", liger_softmax_backward, bytes_impl),
            _variant("flag_gems", flag_gems_softmax_backward, bytes_impl)]


# --- LayerNorm ---------------------------------------------------------------------------------


def liger_layer_norm(x, w, b, eps):
    _need("liger")
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    return LigerLayerNormFunction.apply(x, w, b, eps)


def flag_gems_layer_norm(x, w, b, eps):
    return _need("flag_gems").ops.layer_norm(x, [x.shape[-1]], w, b, eps)[0]


class FlagGemsLayerNormBackward:
    """FlagGems' LayerNorm backward called directly (its autograd runs only with its aten patches
    enabled, which would also replace PyTorch's own rows): the statistics from its forward, once."""

    def __init__(self, eps):
        self.eps, self.saved = eps, None

    def __call__(self, x, w, b, dy):
        gems = _need("flag_gems")
        if self.saved is None:
            self.saved = gems.ops.layer_norm(x, [x.shape[-1]], w, b, self.eps)[1:]
        return gems.ops.layer_norm_backward(dy, x, [x.shape[-1]], *self.saved, w, b,
                                            [True, True, True])


class LigerLayerNormBackward:
    """Liger's LayerNorm backward kernels called directly (for ms_device: no autograd engine)."""

    def __init__(self, eps):
        self.eps, self.saved = eps, None

    def __call__(self, x, w, b, dy):
        _need("liger")
        from liger_kernel.ops.layer_norm import layer_norm_backward, layer_norm_forward

        if self.saved is None:
            _, _, mean, rstd, _, _ = layer_norm_forward(x, w, b, self.eps)
            self.saved = mean, rstd
        return layer_norm_backward(dy, x, w, b, *self.saved)


# --- attention ---------------------------------------------------------------------------------


def flag_gems_attention(q, k, v, causal=False):
    _need("flag_gems")
    from flag_gems.ops.attention import scaled_dot_product_attention_forward

    return scaled_dot_product_attention_forward(q, k, v, is_causal=causal,
                                                enable_gqa=q.shape[1] != k.shape[1])[0]


def liger_linear_cross_entropy(x, w, b, t):
    """Liger-Kernel's fused linear cross-entropy (its chunked LM head + loss)."""
    _need("liger")
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return liger_fused_linear_cross_entropy(x, w, t, b)


def attention_variants(causal: bool, bytes_impl) -> list[Variant]:
    return [_variant("flag_gems", functools.partial(flag_gems_attention, causal=causal),
                     bytes_impl)]
