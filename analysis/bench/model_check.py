"""`python -m triton_fusion_report.analysis.bench.model_check --out DIR`: the project's LayerNorm and
attention inside GPT-2 small (Hugging Face `transformers`, random weights), on the GPU.

1. Forward and backward of one batch under bf16 autocast, the project's ops swapped in, against
   the same model with PyTorch's ops (nn.LayerNorm, SDPA); both measured against a float32
   reference (PyTorch's ops, no autocast): the swap passes if its logits, loss and gradients are
   as close to float32 as PyTorch's own bf16 run (within 2x, or 1e-3).
2. Training: 20 AdamW steps from the same weights on the same batch (learnt by heart, so that
   the loss falls); the losses of the swapped model within 1% of PyTorch's at every step, at two
   learning rates: LR (the loss spikes at step 15, after which any two bf16 runs separate) and
   STABLE_LR (no spike). Beside the first, two yardsticks of how far bf16 training runs stray
   anyway: PyTorch in float32, and PyTorch with its eager (non-SDPA) attention in bf16.
3. Tokens/s of one forward + backward (bf16 autocast): PyTorch eager, torch.compile of it, and the
   project's ops (eager), with the GPU's busy time per step from the profiler.
Writes DIR/model_check.csv (one row per check and per timing) and DIR/model_train.csv (losses
per step). Needs `transformers` (not a dependency of the project: the bench skips this step with
a message where it is missing).
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch

IMPL_NAME = "triton_fusion"
CONFIG = dict(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257,
              attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)


# --------------------------------------------------------------------------- the swap


def _is_causal_mask(mask: torch.Tensor, n_q: int, n_k: int) -> bool:
    """A (..., n_q, n_k) mask that keeps exactly the bottom-right causal triangle (bool: True
    keeps; float: 0 keeps), the same for every batch and head."""
    keep = mask if mask.dtype == torch.bool else mask == 0
    want = torch.ones(n_q, n_k, dtype=torch.bool, device=mask.device).tril(n_k - n_q)
    return bool((keep == want).all())


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      **kwargs):
    """transformers' attention interface: q, k, v (batch, heads, seq, head_dim) -> output
    (batch, seq, heads, head_dim) and no weights. Causal only (a padding mask is refused)."""
    from ... import kernels

    if dropout:
        raise NotImplementedError("attention dropout is not supported by the Triton kernel")
    causal = bool(getattr(module, "is_causal", True))
    if attention_mask is not None:
        if not causal or not _is_causal_mask(attention_mask, query.shape[2], key.shape[2]):
            raise NotImplementedError("only a causal mask is supported (no padding)")
    out = kernels.attention(query, key, value, causal=causal, sm_scale=scaling)
    return out.transpose(1, 2).contiguous(), None


class TritonLayerNorm(torch.nn.Module):
    """nn.LayerNorm's parameters, the project's kernels."""

    def __init__(self, ln: torch.nn.LayerNorm):
        super().__init__()
        self.weight, self.bias, self.eps = ln.weight, ln.bias, ln.eps

    def forward(self, x):
        from ... import kernels

        return kernels.layer_norm(x, self.weight, self.bias, self.eps)


def swap_layer_norms(model: torch.nn.Module) -> int:
    """Replace every nn.LayerNorm of model in place; returns how many."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.LayerNorm):
                setattr(parent, name, TritonLayerNorm(child))
                swapped += 1
    return swapped


def build(impl: str, device, seed: int = 0):
    """GPT-2 small with random weights (the same for every impl, from seed). impl: "reference"
    (PyTorch's eager attention), "torch" (SDPA), "triton" (the project's ops)."""
    from transformers import AttentionInterface, GPT2Config, GPT2LMHeadModel

    AttentionInterface.register(IMPL_NAME, attention_forward)
    attn = {"reference": "eager", "torch": "sdpa", "triton": IMPL_NAME}[impl]
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(**CONFIG, attn_implementation=attn)).to(device)
    if model.config._attn_implementation != attn:
        model.set_attn_implementation(attn)
    assert model.config._attn_implementation == attn
    if impl == "triton":
        assert swap_layer_norms(model) == 2 * CONFIG["n_layer"] + 1
    return model


# --------------------------------------------------------------------------- checks


def _batch(batch, seq, device, step=0):
    g = torch.Generator(device="cpu").manual_seed(1000 + step)
    return torch.randint(0, CONFIG["vocab_size"], (batch, seq), generator=g).to(device)


def _forward_backward(model, ids, autocast: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        out = model(ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.detach().float() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach().float(), out.loss.detach().float(), grads


def _rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def check_forward_backward(device, batch=4, seq=1024) -> list[dict]:
    ids = _batch(batch, seq, device)
    ref = _forward_backward(build("reference", device), ids, autocast=False)
    rows = []
    errs = {}
    for impl in ("torch", "triton"):
        logits, loss, grads = _forward_backward(build(impl, device), ids, autocast=True)
        errs[impl] = dict(
            logits=_rel(logits, ref[0]), loss=abs(loss.item() - ref[1].item()) / ref[1].item(),
            grads=max(_rel(g, ref[2][n]) for n, g in grads.items()))
    for what in ("logits", "loss", "grads"):
        limit = max(2 * errs["torch"][what], 1e-3)
        rows.append(dict(check=f"fwd+bwd {what} vs float32", batch=batch, seq=seq,
                         torch_err=errs["torch"][what], triton_err=errs["triton"][what],
                         limit=limit, passed=errs["triton"][what] <= limit))
    return rows


# The training checks' learning rates. STABLE_LR was chosen before its result was seen (after the
# check at LR failed by 0.03 points, past the spike), as the regime without a spike.
LR = 3e-4
STABLE_LR = 1e-4


def train_losses(impl: str, device, steps=20, batch=8, seq=512, lr=LR,
                 autocast=True) -> list[float]:
    model = build(impl, device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    ids = _batch(batch, seq, device)  # one batch, learnt by heart: the loss must fall
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def tokens_per_s(model, ids, reps=20) -> tuple[float, float, float, float]:
    """(median tokens/s, min, max) of forward + backward over reps timed steps after warm-up, and
    the GPU's busy time per step in ms (the kernels' durations summed by the profiler): a step
    much longer than its GPU time waits on the host."""
    from torch.profiler import ProfilerActivity, profile

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        rates.append(ids.numel() / (time.perf_counter() - t0))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    gpu_ms = sum(e.self_device_time_total for e in prof.key_averages()) / 3 / 1e3
    return statistics.median(rates), min(rates), max(rates), gpu_ms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m triton_fusion_report.analysis.bench.model_check",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("model_check needs a CUDA GPU; skipped")
        return 0
    try:
        import transformers
    except ImportError:
        print("model_check needs `transformers` (pip install transformers); skipped")
        return 0
    from .machine import run_metadata

    device = torch.device("cuda")
    meta = run_metadata(device)
    meta["transformers"] = transformers.__version__
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [dict(meta, kind="check", **r) for r in check_forward_backward(device)]
    for r in rows:
        print(f"{r['check']:32s} torch {r['torch_err']:.2e} triton {r['triton_err']:.2e} "
              f"limit {r['limit']:.2e} {'ok' if r['passed'] else 'FAILED'}", flush=True)

    losses = {impl: train_losses(impl, device) for impl in ("torch", "triton")}
    # Yardsticks: how far PyTorch's own bf16 run strays from the same training in float32, and
    # how far another PyTorch implementation of the model (its eager attention, in bf16) strays
    # from the SDPA one that the swap is compared with.
    losses["float32"] = train_losses("torch", device, autocast=False)
    losses["eager_attention"] = train_losses("reference", device)
    stable = {impl: train_losses(impl, device, lr=STABLE_LR) for impl in ("torch", "triton")}
    stable["float32"] = train_losses("torch", device, lr=STABLE_LR, autocast=False)
    train_rows = [dict(step=i, lr=LR, loss_torch=a, loss_triton=b, rel_diff=abs(b - a) / abs(a),
                       loss_float32=c, torch_rel_diff_float32=abs(a - c) / abs(c),
                       loss_eager_attention=e, eager_attention_rel_diff=abs(e - a) / abs(a),
                       stable_lr=STABLE_LR, stable_loss_torch=sa, stable_loss_triton=sb,
                       stable_rel_diff=abs(sb - sa) / abs(sa), stable_loss_float32=sc,
                       stable_torch_rel_diff_float32=abs(sa - sc) / abs(sc))
                  for i, (a, b, c, e, sa, sb, sc) in enumerate(zip(
                      losses["torch"], losses["triton"], losses["float32"],
                      losses["eager_attention"], stable["torch"], stable["triton"],
                      stable["float32"]))]
    worst = max(r["rel_diff"] for r in train_rows)
    torch_worst = max(r["torch_rel_diff_float32"] for r in train_rows)
    eager_worst = max(r["eager_attention_rel_diff"] for r in train_rows)
    stable_worst = max(r["stable_rel_diff"] for r in train_rows)
    rows.append(dict(meta, kind="check", check=f"20 training steps, lr {LR:g}: loss vs torch",
                     batch=8, seq=512, torch_err=torch_worst, triton_err=worst, limit=0.01,
                     passed=worst <= 0.01))
    rows.append(dict(meta, kind="check",
                     check=f"20 training steps, lr {STABLE_LR:g}: loss vs torch", batch=8,
                     seq=512,
                     torch_err=max(r["stable_torch_rel_diff_float32"] for r in train_rows),
                     triton_err=stable_worst, limit=0.01,
                     passed=stable_worst <= 0.01))
    print(f"training: worst relative loss difference {worst:.2e} over {len(train_rows)} steps "
          f"(first {losses['torch'][0]:.3f} / {losses['triton'][0]:.3f}, last "
          f"{losses['torch'][-1]:.3f} / {losses['triton'][-1]:.3f}); PyTorch bf16 against "
          f"float32: {torch_worst:.2e}; PyTorch's eager attention against its SDPA: "
          f"{eager_worst:.2e}; at lr {STABLE_LR:g}: {stable_worst:.2e} (last "
          f"{stable['torch'][-1]:.3f} / {stable['triton'][-1]:.3f})", flush=True)

    ids = _batch(args.batch, args.seq, device)
    models = {"torch_eager": lambda: build("torch", device),
              "torch_compile": lambda: torch.compile(build("torch", device)),
              "triton_fused": lambda: build("triton", device)}
    for impl, make in models.items():
        try:
            med, lo, hi, gpu_ms = tokens_per_s(make(), ids)
            rows.append(dict(meta, kind="timing", impl=impl, batch=args.batch, seq=args.seq,
                             tokens_per_s=med, tokens_per_s_min=lo, tokens_per_s_max=hi,
                             step_ms=1e3 * ids.numel() / med, gpu_ms=gpu_ms, status="ok"))
            print(f"{impl:20s} {med:10.0f} tokens/s (min {lo:.0f}, max {hi:.0f}); step "
                  f"{1e3 * ids.numel() / med:.1f} ms, GPU busy {gpu_ms:.1f} ms", flush=True)
        except Exception as exc:  # noqa: BLE001 - a failing impl is a row, the rest goes on
            rows.append(dict(meta, kind="timing", impl=impl, batch=args.batch, seq=args.seq,
                             status="error", error=f"{type(exc).__name__}: {exc}"[:500]))
            print(f"{impl}: {type(exc).__name__}: {exc}", flush=True)
        torch._dynamo.reset()
        torch.cuda.empty_cache()

    fields = sorted({k for r in rows for k in r})
    with open(args.out / "model_check.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    with open(args.out / "model_train.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(train_rows[0]))
        w.writeheader()
        w.writerows(train_rows)
    failed = [r["check"] for r in rows if r.get("kind") == "check" and not r["passed"]]
    if failed:
        print(f"FAILED: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
