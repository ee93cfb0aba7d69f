"""Sweep grids of the matmul-epilogue families: softmax(x @ W + b) (seed 000) and
act(x @ W + b) (seed 001's matmul + activation)."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ...kernels.families import linear_act as la
from ...kernels.families import matmul_softmax as sr
from ...kernels.families.matmul_softmax.plan import MAX_SIMPLE_C, MAX_TILED_C
from ...kernels._device import sm_count_of

from ..model import traffic
from . import peers
from .sweep import Problem, Variant, compiled_variants, tf32

TOLERANCE = {"ieee": 1e-5, "tf32": 5e-3, "float16": 1e-2, "bfloat16": 3e-2}

SEED_SHAPES = [(64, 128, 10), (256, 512, 50), (1024, 1024, 100)]  # (B, K, C)
# The plan's held-out check: shapes chosen (2026-11-26) before any was measured, none used to set a
# threshold: C between the measured 4096 and 32000 on either side of STORE_SOFTMAX_MAX_C, C just
# past "tiled"'s one tile with few rows and a long K, many rows at a short K.
MS_HELD_OUT = [(6144, 2048, 8192), (2048, 3072, 24576), (1024, 2048, 640), (32768, 256, 2000)]
MS_GRIDS = {
    "full": {
        torch.float32: SEED_SHAPES,
        torch.float16: SEED_SHAPES + [
            (65536, 128, 10), (65536, 512, 50), (65536, 1024, 100),  # the seed's, batch scaled up
            (65536, 512, 256), (8192, 4096, 1024), (16384, 4096, 4096),
            (16384, 1024, 32000), (4096, 1024, 128256),
            (4096, 768, 50257),  # GPT-2's head: no dimension a power of two
            # Added to check the plan; each has since informed a threshold
            # (docs/matmul_softmax.md).
            (2048, 256, 1000), (512, 4096, 200), (8192, 1536, 3000),
            *MS_HELD_OUT],
    },
    # The seed's shapes in float16, its largest in float32; the traffic model's memory-bound
    # shape (analysis/book/matmul.py); three vocabulary-sized heads.
    "book": {
        torch.float32: SEED_SHAPES[-1:],
        torch.float16: SEED_SHAPES + [(65536, 512, 256), (16384, 1024, 32000),
                                      (4096, 1024, 128256), (4096, 768, 50257)],
    },
    "smoke": {torch.float32: [(33, 70, 50)], torch.float16: [(40, 64, 300)]},
}
LA_GRIDS = {
    "full": [(torch.float16, 8192, 8192, 8192, "gelu"), (torch.float16, 8192, 8192, 8192, "relu"),
             (torch.float16, 4096, 4096, 4096, "gelu"), (torch.bfloat16, 8192, 8192, 8192, "gelu"),
             (torch.float32, 4096, 4096, 4096, "gelu"),
             (torch.float16, 4096, 5120, 13824, "gelu")],  # a 13B model's MLP: odd N
    "smoke": [(torch.float16, 64, 48, 80, "gelu"), (torch.float32, 33, 40, 20, "relu")],
}
LA_GRIDS["book"] = LA_GRIDS["full"]


def _name(dtype):
    return str(dtype).replace("torch.", "")


def _inputs(M, K, N, dtype, device):
    """x (M, K), weight (K, N) scaled so x @ weight is of order one, bias (N,)."""
    x = torch.randn(M, K, device=device, dtype=dtype)
    w = torch.randn(K, N, device=device, dtype=dtype) * K**-0.5
    b = 0.1 * torch.randn(N, device=device, dtype=dtype)
    return x, w, b


def _linear_inputs(M, K, N, dtype, device):
    """As _inputs, with the weight as nn.Linear stores it, (N, K), passed transposed: the (K, N)
    view every implementation gets is K-contiguous, the layout of F.linear's weight."""
    x, w, b = _inputs(M, K, N, dtype, device)
    return x, w.t().contiguous().t(), b


def _logits(x, w, b):
    return torch.addmm(b, x, w)


def eager_matmul_softmax(x, w, b):
    """softmax(x @ W + b) as a user writes it in PyTorch: the bias added in cuBLAS's epilogue
    (torch.addmm, what F.linear runs), then the softmax."""
    return torch.softmax(torch.addmm(b, x, w), -1)


def eager_linear_act(x, w, b, activation):
    """act(x @ W + b) as a user writes it: torch.addmm (bias in cuBLAS's epilogue), then the
    activation."""
    h = torch.addmm(b, x, w)
    return torch.relu(h) if activation == "relu" else F.gelu(h)


def cublaslt_linear_act(x, w, b, activation):
    """torch._addmm_activation: bias and activation in cuBLASLt's epilogue, one kernel. Its GELU
    is the tanh approximation (checked against a float64 tanh-GELU)."""
    return torch._addmm_activation(b, x, w, use_gelu=activation == "gelu")


def matmul_softmax_problems(grid: str = "full") -> list[Problem]:
    out = []
    for dtype, shapes in MS_GRIDS[grid].items():
        s = torch.empty((), dtype=dtype).element_size()
        precisions = ["ieee", "tf32"] if dtype == torch.float32 else [_name(dtype)]
        for precision in precisions:
            for B, K, C in shapes:
                out.append(_ms_problem(B, K, C, dtype, s, precision))
    return out


def _sm_count() -> int:
    """The SM count the kernels plan with: the GPU's, else the interpreter's stand-in."""
    return sm_count_of(torch.device("cuda") if torch.cuda.is_available() else None)


def _ms_problem(B, K, C, dtype, s, precision):
    kw = {"input_precision": precision} if dtype == torch.float32 else {}
    use_tf32 = precision == "tf32"

    def nbytes(impl, method=None):
        # split_k's partials: as many K slices as its plan takes on this machine's GPU.
        splits = 1 if method != sr.SPLIT_K else sr.matmul_softmax_plan(
            B, K, C, dtype, method=method, sm_count=_sm_count(), **kw).splits
        return traffic.total(traffic.matmul_softmax_kernels(B, K, C, s, impl, method, splits))
    plan = sr.matmul_softmax_plan(B, K, C, dtype, sm_count=_sm_count(), **kw)
    variants = [
        Variant("torch_eager", tf32(eager_matmul_softmax, use_tf32),
                bytes_impl=nbytes("torch_eager")),
        Variant("cublas", tf32(_logits, use_tf32), variant="x @ W + b alone",
                reference=_logits, bytes_impl=nbytes("cublas")),
        Variant("triton_unfused", functools.partial(sr.triton_unfused, **kw),
                bytes_impl=nbytes("triton_unfused")),
        Variant("triton_fused", functools.partial(sr.triton_fused, **kw),
                variant=plan.method, bytes_impl=nbytes("triton_fused", plan.method)),
    ]
    for method in sr.METHODS:
        if method == plan.method:
            continue
        if method == sr.SIMPLE and C > MAX_SIMPLE_C or method == sr.TILED and C > MAX_TILED_C:
            continue
        if method == sr.SIMPLE and B * C > 2**24:  # one program per row, no tensor cores: slow
            continue
        variants.append(Variant("triton_fused",
                                functools.partial(sr.triton_fused, method=method, **kw),
                                sweep="method", variant=method,
                                bytes_impl=nbytes("triton_fused", method)))
    variants += compiled_variants(sr.reference, nbytes("torch_compile"),
                                  wrap=lambda f: tf32(f, use_tf32))
    return Problem(
        family="matmul_softmax", op="matmul_softmax", dtype=dtype, precision=precision,
        shape=dict(m=B, k=K, n=C), make_inputs=functools.partial(_inputs, B, K, C, dtype),
        reference=sr.reference, bytes_model=nbytes("triton_fused"),
        flops_model=traffic.matmul_softmax_flops(B, K, C), tolerance=TOLERANCE[precision],
        variants=variants, graph=True)


def _plain_matmul(x, w, b):
    return x @ w


def linear_act_problems(grid: str = "full") -> list[Problem]:
    out = []
    for dtype, M, K, N, act in LA_GRIDS[grid]:
        s = torch.empty((), dtype=dtype).element_size()
        precision = "tf32" if dtype == torch.float32 else _name(dtype)
        kw = {"input_precision": "tf32"} if dtype == torch.float32 else {}
        use_tf32 = dtype == torch.float32
        ref = functools.partial(la.linear_act_reference, activation=act)

        def nbytes(impl, M=M, K=K, N=N, s=s):
            return traffic.total(traffic.linear_act_kernels(M, K, N, s, impl))
        lt_ref = functools.partial(la.linear_act_reference,
                                   activation="gelu_tanh" if act == "gelu" else act)
        variants = [
            Variant("torch_eager", tf32(functools.partial(eager_linear_act, activation=act),
                                        use_tf32), bytes_impl=nbytes("torch_eager")),
            Variant("cublas", tf32(_plain_matmul, use_tf32), variant="x @ W alone",
                    reference=_plain_matmul, bytes_impl=nbytes("cublas")),
            Variant("cublaslt", tf32(functools.partial(cublaslt_linear_act, activation=act),
                                     use_tf32),
                    variant="torch._addmm_activation" + (" (tanh GELU)" if act == "gelu" else ""),
                    reference=lt_ref, bytes_impl=nbytes("triton_fused")),
            Variant("triton_unfused",
                    functools.partial(la.linear_act_unfused, activation=act, **kw),
                    bytes_impl=nbytes("triton_unfused")),
            Variant("triton_fused", functools.partial(la.linear_act_fused, activation=act, **kw),
                    bytes_impl=nbytes("triton_fused")),
            *compiled_variants(ref, nbytes("torch_compile"), wrap=lambda f: tf32(f, use_tf32)),
        ]
        out.append(Problem(
            family="linear_act", op=f"linear_{act}", dtype=dtype, precision=precision,
            shape=dict(m=M, k=K, n=N, activation=act),
            make_inputs=functools.partial(_linear_inputs, M, K, N, dtype), reference=ref,
            bytes_model=nbytes("triton_fused"), flops_model=2 * M * N * K,
            tolerance=TOLERANCE[precision], variants=variants))
    return out


# --- linear + cross-entropy: the LM head and its loss, forward and backward -------------------

LCE_GRIDS = {
    # (tokens, hidden, vocabulary): GPT-2 small's head (a vocabulary no power of two), a
    # Llama-3-sized one, and one between.
    "full": [(8192, 768, 50257), (4096, 4096, 128256), (16384, 2048, 32000)],
    "book": [(8192, 768, 50257), (4096, 4096, 128256)],
    "smoke": [(40, 24, 301)],
}
LCE_DTYPE = torch.bfloat16


def _lce_inputs(N, H, V, dtype, device):
    """x (N, H), weight (V, H) as nn.Linear stores it, bias (V,), targets with a tenth ignored."""
    x = torch.randn(N, H, device=device, dtype=dtype)
    w = torch.randn(V, H, device=device, dtype=dtype) * H**-0.5
    b = 0.1 * torch.randn(V, device=device, dtype=dtype)
    t = torch.randint(0, V, (N,), device=device)
    t[torch.rand(N, device=device) < 0.1] = -100
    return x, w, b, t


def _lce_eager(x, w, b, t):
    """As a model computes it in PyTorch: F.linear, then F.cross_entropy on float32 logits."""
    return F.cross_entropy(F.linear(x, w, b).float(), t)


def _lce_grads(loss_fn):
    """(x, w, b, t) -> (loss, dx, dw, db): the loss and its gradients, as a training step."""
    def call(x, w, b, t):
        leaves = [a.detach().requires_grad_() for a in (x, w, b)]
        loss = loss_fn(*leaves, t)
        return (loss.detach(), *torch.autograd.grad(loss, leaves))
    return call


def _lce_reference(x, w, b, t):
    """float64 (the sweep's reference inputs): the loss and the gradients."""
    return _lce_grads(lambda x, w, b, t: F.cross_entropy(F.linear(x, w, b), t))(x, w, b, t)


def linear_cross_entropy_problems(grid: str = "full") -> list[Problem]:
    from ...kernels.families import linear_cross_entropy as lce

    out = []
    for N, H, V in LCE_GRIDS[grid]:
        s = torch.empty((), dtype=LCE_DTYPE).element_size()
        chunk_rows = lce.default_chunk_rows(N, V, s)

        def nbytes(impl, N=N, H=H, V=V, chunks=-(-N // chunk_rows)):
            return traffic.total(traffic.linear_cross_entropy_kernels(N, H, V, s, impl, chunks))
        variants = [
            Variant("torch_eager", _lce_grads(_lce_eager), bytes_impl=nbytes("torch_eager")),
            Variant("triton_fused",
                    _lce_grads(lambda x, w, b, t: lce.linear_cross_entropy(x, w, t, b)),
                    variant=f"chunks of {chunk_rows} rows", bytes_impl=nbytes("triton_fused")),
            *compiled_variants(_lce_eager, nbytes("torch_compile"), wrap=_lce_grads),
            # Liger's bytes with its own chunks (far more, and smaller, than ours).
            peers._variant("liger", _lce_grads(peers.liger_linear_cross_entropy),
                           nbytes("liger", chunks=traffic.liger_lce_chunks(N, H, V))),
        ]
        out.append(Problem(
            family="linear_cross_entropy", op="linear_cross_entropy_fwd_bwd", dtype=LCE_DTYPE,
            precision=_name(LCE_DTYPE), shape=dict(tokens=N, hidden=H, vocab=V),
            make_inputs=functools.partial(_lce_inputs, N, H, V, LCE_DTYPE),
            reference=_lce_reference, bytes_model=nbytes("triton_fused"),
            flops_model=traffic.linear_cross_entropy_flops(N, H, V),
            tolerance=4 * TOLERANCE["bfloat16"], variants=variants, graph=False))
    return out
