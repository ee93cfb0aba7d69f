"""Sweep grids of the online-softmax-into-matmul families: softmax(X) @ V (seed 002) and the
FlashAttention-style attention forward."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ...kernels.families.attention import forward as attn
from ...kernels.families import softmax_matmul as smm

from ..model import traffic
from . import peers
from .sweep import Problem, Variant, compiled_variants, fwd_bwd, tf32

TOLERANCE = {"ieee": 1e-5, "tf32": 5e-3, "float16": 1e-2, "bfloat16": 3e-2}


# --- softmax(X) @ V ---------------------------------------------------------------------------------

SEED_D2 = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
SEED_BLOCKS = [16, 32, 64]
SMM_GRIDS = {
    # (batch, d1, d3), d2 values, dtypes, blocks of the seed's sweep
    "full": dict(batch=16, d1=2048, d3=512, d2=SEED_D2, blocks=SEED_BLOCKS,
                 half_d2=[1024, 8192]),
    "book": dict(batch=16, d1=2048, d3=512, d2=[64, 1024, 8192], blocks=SEED_BLOCKS,
                 half_d2=[8192]),
    "smoke": dict(batch=2, d1=33, d3=19, d2=[40], blocks=[16], half_d2=[40]),
}


def _smm_inputs(batch, d1, d2, d3, dtype, device):
    return (torch.randn(batch, d1, d2, device=device, dtype=dtype),
            torch.randn(batch, d2, d3, device=device, dtype=dtype))


def softmax_matmul_problems(grid: str = "full") -> list[Problem]:
    g = SMM_GRIDS[grid]
    batch, d1, d3 = g["batch"], g["d1"], g["d3"]
    cases = [(torch.float32, p, d2) for p in ("ieee", "tf32") for d2 in g["d2"]]
    cases += [(torch.float16, "float16", d2) for d2 in g["half_d2"]]
    out = []
    for dtype, precision, d2 in cases:
        s = torch.empty((), dtype=dtype).element_size()
        kw = {"input_precision": precision} if dtype == torch.float32 else {}
        use_tf32 = precision == "tf32"

        def nbytes(impl, d2=d2, s=s):
            return traffic.total(traffic.softmax_matmul_kernels(batch, d1, d2, d3, s, impl))
        variants = [
            Variant("torch_eager", tf32(smm.reference, use_tf32), bytes_impl=nbytes("torch_eager")),
            Variant("triton_unfused", functools.partial(smm.triton_unfused, **kw),
                    bytes_impl=nbytes("triton_unfused")),
            Variant("triton_fused", functools.partial(smm.triton_fused, **kw),
                    bytes_impl=nbytes("triton_fused")),
        ]
        if dtype == torch.float32:
            variants += [Variant("triton_fused", functools.partial(smm.fused_softmax, BLOCK_1=b,
                                                                   BLOCK_2=b, **kw),
                                 block=b, sweep="block", variant="seed BLOCK_1 = BLOCK_2",
                                 bytes_impl=nbytes("triton_fused")) for b in g["blocks"]]
        variants += compiled_variants(smm.reference, nbytes("torch_compile"),
                                      wrap=lambda f: tf32(f, use_tf32))
        out.append(Problem(
            family="softmax_matmul", op="softmax_matmul", dtype=dtype, precision=precision,
            shape=dict(batch=batch, d1=d1, d2=d2, d3=d3),
            make_inputs=functools.partial(_smm_inputs, batch, d1, d2, d3, dtype),
            reference=smm.reference, bytes_model=nbytes("triton_fused"),
            flops_model=traffic.softmax_matmul_flops(batch, d1, d2, d3),
            tolerance=TOLERANCE[precision], variants=variants))
    return out


# --- attention -----------------------------------------------------------------------------------

TOKENS, MODEL_DIM = 16384, 2048  # batch * seq and heads * head_dim, fixed across the sweep
ATTN_GRIDS = {
    # odd_seqs: lengths no block divides (the last tile masked), at head_dim 64 and 128.
    # kernels: the (head_dim, seq) where each forward kernel is also timed alone (KERNEL_SWEEP).
    "full": dict(seqs=[512, 1024, 2048, 4096, 8192, 16384], head_dims=[64, 128, 256],
                 odd_seqs=[1000, 3001], dtype=torch.float16, unfused_max_seq=4096,
                 kernels=[(128, 4096), (64, 4096)]),
    # head_dim 128's sequence sweep; head_dim 64 at 4096 (its tuning is a compile of its own).
    "book": dict(seqs=[1024, 4096, 16384], head_dims=[128], odd_seqs=[3001], extra=[(64, 4096)],
                 dtype=torch.float16, unfused_max_seq=4096, kernels=[(128, 4096), (64, 4096)]),
    "smoke": dict(seqs=[37], head_dims=[16], dtype=torch.float16, unfused_max_seq=64,
                  tokens=74, model_dim=32, kernels=[(16, 37)]),
}
# The fused forward with its kernel forced (triton_fused's private `_kernel`), beside the
# autotuned row that picks among them: "gluon", the Gluon forward (sm_90 only: elsewhere, and at
# shapes it does not take, a ValueError, recorded as `unsupported`); "tl", the `tl` kernels
# tuned without it (what the plan ran before the Gluon candidate).
KERNEL_SWEEP = ("gluon", "tl")
SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION",
                 "sdpa_efficient": "EFFICIENT_ATTENTION"}


def reference64(q, k, v, causal: bool):
    """float64 attention, a block of queries at a time so the scores never exceed ~2 GB."""
    scale = q.shape[-1] ** -0.5
    b, h, n, _ = q.shape
    out = torch.empty_like(q)
    step = max(1, 2**28 // (b * h * n))
    keys = torch.arange(n, device=q.device)
    for i in range(0, n, step):
        s = (q[:, :, i:i + step] @ k.transpose(-2, -1)) * scale
        if causal:
            rows = torch.arange(i, min(i + step, n), device=q.device)
            s = s.masked_fill(keys[None, :] > rows[:, None], float("-inf"))
        out[:, :, i:i + step] = torch.softmax(s, -1) @ v
    return out


# The variant of the naive rows since they compute in the input dtype (older rows: float32).
NAIVE_IN_INPUT_DTYPE = "scores in the input dtype"


@functools.lru_cache(maxsize=8)
def _causal_mask(n: int, device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def naive_attention(q, k, v, causal: bool = False):
    """Attention as a PyTorch user writes it (nanoGPT's, say): scores, scale, mask (a buffer made
    once), softmax and the product, each an eager kernel in the input dtype (PyTorch's softmax
    accumulates in float32 and writes the input dtype)."""
    s = (q @ k.transpose(-2, -1)) * (1.0 / q.shape[-1] ** 0.5)
    if causal:
        s = s.masked_fill(~_causal_mask(s.shape[-1], q.device), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _sdpa(backend: str, causal: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = getattr(SDPBackend, backend)

    def call(q, k, v):
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                  enable_gqa=q.shape[1] != k.shape[1])
    return call


def _attn_inputs(shape, dtype, device, n=3):
    """n random tensors of one shape: q, k, v (and dout)."""
    return tuple(torch.randn(shape, device=device, dtype=dtype) for _ in range(n))


def attention_problems(grid: str = "full") -> list[Problem]:
    g = ATTN_GRIDS[grid]
    tokens, model_dim = g.get("tokens", TOKENS), g.get("model_dim", MODEL_DIM)
    dtype = g["dtype"]
    s = torch.empty((), dtype=dtype).element_size()
    out = []
    cases = [(d, n) for d in g["head_dims"] for n in g["seqs"]]
    cases += [(d, n) for d in (64, 128) if d in g["head_dims"] for n in g.get("odd_seqs", [])]
    cases += g.get("extra", [])
    for head_dim, seq in cases:
        batch, heads = max(1, tokens // seq), model_dim // head_dim
        for causal in (False, True):
            def nbytes(impl, seq=seq, batch=batch, heads=heads, head_dim=head_dim):
                return traffic.total(traffic.attention_kernels(batch, heads, seq, head_dim, s,
                                                               impl))
            naive = functools.partial(naive_attention, causal=causal)
            variants = [Variant("torch_eager", naive, variant=NAIVE_IN_INPUT_DTYPE,
                                bytes_impl=nbytes("torch_eager"))]
            variants += [Variant(name, _sdpa(backend, causal), bytes_impl=nbytes(name))
                         for name, backend in SDPA_BACKENDS.items()]
            if seq <= g["unfused_max_seq"]:
                variants.append(Variant("triton_unfused",
                                        functools.partial(attn.triton_unfused, causal=causal),
                                        bytes_impl=nbytes("triton_unfused")))
            variants.append(Variant("triton_fused",
                                    functools.partial(attn.triton_fused, causal=causal),
                                    variant="autotuned", bytes_impl=nbytes("triton_fused")))
            if (head_dim, seq) in g.get("kernels", []):
                variants += [Variant("triton_fused",
                                     functools.partial(attn.triton_fused, causal=causal,
                                                       _kernel=kernel),
                                     sweep="kernel", variant=kernel,
                                     bytes_impl=nbytes("triton_fused"))
                             for kernel in KERNEL_SWEEP]
            variants += compiled_variants(naive, nbytes("torch_compile"))
            variants += peers.attention_variants(causal, nbytes("triton_fused"))
            out.append(Problem(
                family="attention", op="attention_fwd", dtype=dtype,
                precision=str(dtype).replace("torch.", ""),
                shape=dict(batch=batch, heads=heads, seq=seq, head_dim=head_dim, causal=causal,
                           kv_heads=heads, seq_k=seq),
                make_inputs=functools.partial(_attn_inputs, (batch, heads, seq, head_dim), dtype),
                reference=functools.partial(reference64, causal=causal),
                bytes_model=nbytes("triton_fused"),
                flops_model=traffic.attention_flops(batch, heads, seq, head_dim, causal),
                tolerance=TOLERANCE[str(dtype).replace("torch.", "")], variants=variants))
    return out


# --- attention forward + backward ------------------------------------------------------------

BWD_GRIDS = {
    "full": dict(seqs=[1024, 4096, 16384], head_dims=[64, 128], odd_seqs=[3001],
                 dtype=torch.float16),
    "book": dict(seqs=[4096], head_dims=[128], dtype=torch.float16),
    "smoke": dict(seqs=[37], head_dims=[16], dtype=torch.float16, tokens=74, model_dim=32),
}


def reference64_grads(q, k, v, dout, causal: bool):
    """float64 dq, dk, dv of attention (softmax(q k^T * scale) v), a block of queries at a time:
    the memory of a few score blocks, whatever the sequence length."""
    scale = q.shape[-1] ** -0.5
    b, h, n, _ = q.shape
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    step = max(1, 2**27 // (b * h * n))
    keys = torch.arange(n, device=q.device)
    for i in range(0, n, step):
        rows = slice(i, min(i + step, n))
        s = (q[:, :, rows] @ k.transpose(-2, -1)) * scale
        if causal:
            r = torch.arange(rows.start, rows.stop, device=q.device)
            s = s.masked_fill(keys[None, :] > r[:, None], float("-inf"))
        p = torch.softmax(s, -1)
        del s
        do = dout[:, :, rows]
        dv += p.transpose(-2, -1) @ do
        dp = do @ v.transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True)) * scale
        del p, dp
        dq[:, :, rows] = ds @ k
        dk += ds.transpose(-2, -1) @ q[:, :, rows]
    return dq, dk, dv


def attention_fwd_bwd_problems(grid: str = "full") -> list[Problem]:
    """Forward + backward (a training step's attention) against SDPA's backends; TFLOP/s count
    the forward's 2 and the backward's 5 matmuls (3.5x the forward)."""
    g = BWD_GRIDS[grid]
    tokens, model_dim = g.get("tokens", TOKENS), g.get("model_dim", MODEL_DIM)
    dtype = g["dtype"]
    s = torch.empty((), dtype=dtype).element_size()
    out = []
    cases = [(d, n) for d in g["head_dims"] for n in g["seqs"] + g.get("odd_seqs", [])]
    for head_dim, seq in cases:
        batch, heads = max(1, tokens // seq), model_dim // head_dim
        nbytes = traffic.total(traffic.attention_fwd_bwd_kernels(batch, heads, seq, head_dim,
                                                                 s))
        for causal in (False, True):
            ours = fwd_bwd(functools.partial(attn_op, causal=causal))
            variants = [Variant(name, fwd_bwd(_sdpa(backend, causal)), bytes_impl=nbytes)
                        for name, backend in SDPA_BACKENDS.items()]
            variants.append(Variant("triton_fused", ours, variant="fa2 backward",
                                    bytes_impl=nbytes))
            out.append(Problem(
                family="attention", op="attention_fwd_bwd", dtype=dtype,
                precision=str(dtype).replace("torch.", ""),
                shape=dict(batch=batch, heads=heads, seq=seq, head_dim=head_dim,
                           causal=causal, kv_heads=heads, seq_k=seq),
                make_inputs=functools.partial(_attn_inputs, (batch, heads, seq, head_dim),
                                              dtype, n=4),
                reference=functools.partial(reference64_grads, causal=causal),
                bytes_model=nbytes,
                flops_model=traffic.attention_fwd_bwd_flops(batch, heads, seq, head_dim,
                                                            causal),
                # The backward rounds p and ds to the input dtype (as FlashAttention does).
                tolerance=2 * TOLERANCE[str(dtype).replace("torch.", "")],
                variants=variants, graph=False))
    return out


def attn_op(q, k, v, causal):
    from ...kernels import attention

    return attention(q, k, v, causal)


# --- decoding: one query per head against a KV cache ----------------------------------------

DECODE_GRIDS = {
    # (batch, heads, kv_heads): batch 1 and 8, every head its own k/v or 4 query heads per k/v
    "full": dict(heads=[(1, 32, 32), (8, 32, 32), (1, 32, 8), (8, 32, 8)],
                 seq_k=[4096, 8192, 16384, 32768, 5000], head_dim=128, dtype=torch.float16),
    "book": dict(heads=[(8, 32, 32), (8, 32, 8)], seq_k=[4096, 32768, 5000], head_dim=128,
                 dtype=torch.float16),
    "smoke": dict(heads=[(1, 4, 2)], seq_k=[300], head_dim=32, dtype=torch.float16),
}


def _decode_inputs(batch, heads, kv_heads, seq_k, head_dim, dtype, device):
    q = torch.randn(batch, heads, 1, head_dim, device=device, dtype=dtype)
    k, v = (torch.randn(batch, kv_heads, seq_k, head_dim, device=device, dtype=dtype)
            for _ in range(2))
    return q, k, v


def attention_decode_problems(grid: str = "full") -> list[Problem]:
    """Sq = 1 against seq_k keys: memory-bound (K and V read once), so GB/s against the copy
    bandwidth is the measure; SDPA's backends as the bar (the efficient one takes no grouped
    heads)."""
    g = DECODE_GRIDS[grid]
    dtype, head_dim = g["dtype"], g["head_dim"]
    s = torch.empty((), dtype=dtype).element_size()
    out = []
    for batch, heads, kv_heads in g["heads"]:
        for seq_k in g["seq_k"]:
            kernels_ = traffic.attention_decode_kernels(batch, heads, kv_heads, seq_k, head_dim, s)
            nbytes = traffic.total(kernels_)
            backends = {n: b for n, b in SDPA_BACKENDS.items()
                        if kv_heads == heads or n != "sdpa_efficient"}
            variants = [Variant(n, _sdpa(b, False), bytes_impl=nbytes) for n, b in backends.items()]
            variants.append(Variant("triton_fused", attn.triton_fused, variant="split keys",
                                    bytes_impl=nbytes))
            out.append(Problem(
                family="attention", op="attention_decode", dtype=dtype,
                precision=str(dtype).replace("torch.", ""),
                shape=dict(batch=batch, heads=heads, seq=1, head_dim=head_dim, causal=False,
                           kv_heads=kv_heads, seq_k=seq_k),
                make_inputs=functools.partial(_decode_inputs, batch, heads, kv_heads, seq_k,
                                              head_dim, dtype),
                reference=attn.reference, bytes_model=nbytes,
                flops_model=sum(k.flops for k in kernels_),
                tolerance=TOLERANCE[str(dtype).replace("torch.", "")], variants=variants))
    return out


def all_attention_problems(grid: str = "full") -> list[Problem]:
    """The attention family: forward, forward + backward, decoding."""
    return (attention_problems(grid) + attention_fwd_bwd_problems(grid)
            + attention_decode_problems(grid))
