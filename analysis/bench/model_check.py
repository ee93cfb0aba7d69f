"""`python -m triton_fusion_report.analysis.bench.model_check --out DIR`: GPT-2 small (Hugging Face
`transformers`, random weights) trained with the project's ops, on the GPU.

The project's ops swapped in by the public swap (`kernels.swap_in`): every LayerNorm, the
attention, the MLP's first linear + GELU (`linear_act`) and the LM head with its loss
(`linear_cross_entropy`, which never holds the logits); under autocast they cast as PyTorch's ops
do. Batch 8 x 1024 tokens, bf16 autocast, forward + backward.

1. Forward and backward of one batch, the project's ops against PyTorch's, both against float32
   (PyTorch's ops, no autocast): the loss and every gradient as close to float32 as PyTorch's own
   bf16 run (within 2x, or 1e-3).
2. Training: STEPS AdamW steps from the same weights on the same batch (learnt by heart, so that
   the loss falls), in float32, in bf16 with PyTorch's ops and with the project's: the project's
   curve no farther from float32's than 1.5x PyTorch's bf16 curve is (the RMS distance over the
   whole run; a per-step ratio is noise where PyTorch's curve happens to cross float32's, so the
   steps within it are recorded, not checked).
3. Timing (TIMINGS): tokens/s of forward + backward, eager and torch.compile, each with and
   without the project's ops; the GPU's busy time per step and its split by kind of kernel (from
   the profiler), and the peak memory of a step. The `_graph` variants time the whole training
   step (forward, backward, fused AdamW) captured as one CUDA graph and replayed, as training
   loops remove the host's cost (PyTorch's whole-network capture): the kernels decide.
Writes DIR/model_check.csv (one row per check and per timing), DIR/model_train.csv (losses per
step) and DIR/model_ops.csv (GPU ms per step by kind of kernel). Needs `transformers` (not a
dependency of the project: the bench skips this step with a message where it is missing).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import gc
import re
import statistics
import sys
import time
from pathlib import Path

import torch

CONFIG = dict(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257,
              attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
ALL_OPS = frozenset({"layer_norm", "attention", "mlp", "head"})
# name: (torch.compile's mode or None for eager, the project's ops swapped in, the whole step
# captured in a CUDA graph). Under torch.compile only the LM head + loss by default: every op
# swapped in keeps Inductor from fusing around them (measured slower).
COMPILE, MAX = "default", "max-autotune-no-cudagraphs"
TIMINGS = {"torch_eager": (None, frozenset(), False), "torch_compile": (COMPILE, frozenset(), False),
           "triton_fused": (None, ALL_OPS, False),
           "torch_compile_triton_head": (COMPILE, frozenset({"head"}), False),
           "torch_compile_triton": (COMPILE, ALL_OPS, False),
           "torch_eager_graph": (None, frozenset(), True),
           "torch_compile_graph": (COMPILE, frozenset(), True),
           "torch_compile_max_graph": (MAX, frozenset(), True),
           "triton_fused_graph": (None, ALL_OPS, True),
           "torch_compile_triton_head_graph": (COMPILE, frozenset({"head"}), True),
           "torch_compile_triton_graph": (COMPILE, ALL_OPS, True)}
DEFAULT_TIMINGS = ["torch_eager", "torch_compile", "triton_fused", "torch_compile_triton_head",
                   "torch_eager_graph", "torch_compile_graph", "triton_fused_graph",
                   "torch_compile_triton_head_graph", "torch_compile_triton_graph"]
STEPS = 20
# (batch, seq) of the forward + backward check, of the training check, of the timings (default).
CHECK_SHAPE, TRAIN_SHAPE, TIMING_SHAPE = (4, 1024), (8, 512), (8, 1024)
LR = 1e-4
DISTANCE = 1.5  # the project's bf16 loss may stray this many times as far from float32 as torch's


# --------------------------------------------------------------------------- the swap


def loss_of(model, ids: torch.Tensor) -> torch.Tensor:
    """The language-modelling loss of ids (next-token targets): with the LM head swapped in
    (`kernels.swap_in`, "head") the final hidden states go to linear_cross_entropy, the logits
    never made; otherwise through the model's own LM head and loss."""
    return model(ids, labels=ids).loss


def build(device, ops=frozenset(), attention="sdpa", seed: int = 0):
    """GPT-2 small with random weights (the same for every call, from seed), PyTorch's
    `attention` ("sdpa" or "eager"), with the project's `ops` (a subset of ALL_OPS) swapped in
    by the public swap, `kernels.swap_in`: each a swap of every module of its kind."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from ... import kernels

    torch.manual_seed(seed)
    with torch.device(device):  # initialised where it runs: ten times faster than on the host
        model = GPT2LMHeadModel(GPT2Config(**CONFIG, attn_implementation=attention))
    if model.config._attn_implementation != attention:
        model.set_attn_implementation(attention)
    assert model.config._attn_implementation == attention
    if ops:
        report = kernels.swap_in(model, ops=sorted(ops))
        n = CONFIG["n_layer"]
        want = {"layer_norm": ("LayerNorm", 2 * n + 1), "mlp": ("LinearAct", n),
                "attention": ("attention", 1), "head": ("LinearCrossEntropy", 1)}
        assert not report.left and all(report.count(what) == count for op, (what, count)
                                       in want.items() if op in ops), str(report)
        assert "attention" not in ops \
            or model.config._attn_implementation == kernels.swap.ATTENTION_NAME
    return model


# --------------------------------------------------------------------------- checks


def _batch(batch, seq, device, step=0):
    g = torch.Generator(device="cpu").manual_seed(1000 + step)
    return torch.randint(0, CONFIG["vocab_size"], (batch, seq), generator=g).to(device)


def _forward_backward(model, ids, autocast: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        loss = loss_of(model, ids)
    loss.backward()
    grads = {n: p.grad.detach().float() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach().float(), grads


def _rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def check_forward_backward(device, batch=CHECK_SHAPE[0], seq=CHECK_SHAPE[1]) -> list[dict]:
    ids = _batch(batch, seq, device)
    ref_loss, ref_grads = _forward_backward(build(device), ids, autocast=False)
    errs = {}
    for name, ops in (("torch", frozenset()), ("triton", ALL_OPS)):
        loss, grads = _forward_backward(build(device, ops), ids, autocast=True)
        assert grads.keys() == ref_grads.keys(), "a parameter lost its gradient in the swap"
        errs[name] = dict(loss=abs(loss.item() - ref_loss.item()) / ref_loss.item(),
                          grads=max(_rel(g, ref_grads[n]) for n, g in grads.items()))
    rows = []
    for what in ("loss", "grads"):
        limit = max(2 * errs["torch"][what], 1e-3)
        rows.append(dict(check=f"fwd+bwd {what} vs float32", batch=batch, seq=seq,
                         torch_err=errs["torch"][what], triton_err=errs["triton"][what],
                         limit=limit, passed=errs["triton"][what] <= limit))
    return rows


def train_losses(device, ops=frozenset(), autocast=True, steps=STEPS, batch=TRAIN_SHAPE[0],
                 seq=TRAIN_SHAPE[1], lr=LR) -> list[float]:
    model = build(device, ops)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    ids = _batch(batch, seq, device)  # one batch, learnt by heart: the loss must fall
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_of(model, ids)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# --------------------------------------------------------------------------- timing

# The kinds of kernel a step's GPU time is split into, by kernel name (first match).
KINDS = [("attention", r"attn|flash|fmha|sdpa|attention"),
         ("LayerNorm", r"layer_norm|layernorm|_ln_"),
         ("LM head loss", r"_ce_rows|cross_entropy|softmax|nll_loss"),
         ("linear + GELU", r"_matmul_kernel|_matmul_tma|_activation|gelu"),
         ("matmul (cuBLAS)", r"gemm|nvjet|xmma|cutlass|sm90_|sm80_|ampere_|splitk"),
         ("fused by Inductor", r"^triton_"),
         ("other", r".")]


def kind_of(kernel: str) -> str:
    return next(k for k, pattern in KINDS if re.search(pattern, kernel, re.IGNORECASE))


@contextlib.contextmanager
def collector_off():
    """One collection, then Python's cyclic garbage collector off until the block ends."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _gpu_split(prof, steps: int) -> dict[str, float]:
    """GPU ms per step by kind of kernel, from a profile of `steps` steps."""
    split: dict[str, float] = {}
    for e in prof.key_averages():
        if e.self_device_time_total > 0:
            k = kind_of(e.key)
            split[k] = split.get(k, 0.0) + e.self_device_time_total / steps / 1e3
    return split


def _summary(rates: list[float], ids, split: dict, peak: float) -> dict:
    med = statistics.median(rates)
    return dict(tokens_per_s=med, tokens_per_s_min=min(rates), tokens_per_s_max=max(rates),
                step_ms=1e3 * ids.numel() / med, gpu_ms=sum(split.values()), peak_mib=peak,
                split=split)


def measure_step(model, loss_fn, ids, reps=20) -> dict:
    """Forward + backward (bf16 autocast): median tokens/s (with min and max) over reps timed
    steps after warm-up, the peak memory of a step, and the GPU's busy time per step (the
    kernels' durations summed by the profiler) with its split by kind of kernel: a step much
    longer than its GPU time waits on the host.

    Python's cyclic garbage collector is off during the steps, after one collection, as training
    frameworks run it (OLMo-core's and Composer's garbage-collector callbacks: off in training,
    a generation-1 collection every N steps). With it on, the collections over the objects this
    process holds (transformers, the models built before) made a host-bound step 13-17 ms slower
    (one H100 machine, 2026-11-27, the project's ops: 72.7-76.3 ms a step against 59.1 with it
    off, 61.8 with those objects frozen; eager, GPU-bound, 68.7 and 78.4 on)."""
    from torch.profiler import ProfilerActivity, profile

    def step():  # the first calls compile (loss_fn compiled): wall_s counts them
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(ids)
        loss.backward()
    with collector_off():
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        rates = []
        for _ in range(reps):
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            rates.append(ids.numel() / (time.perf_counter() - t0))
        peak = torch.cuda.max_memory_allocated() / 2**20
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        return _summary(rates, ids, _gpu_split(prof, 3), peak)


def measure_captured_step(model, loss_fn, ids, reps=20, lr=LR) -> dict:
    """The whole training step, forward, backward and AdamW (fused, capturable), captured as one
    CUDA graph after warm-up steps on a side stream, then replayed (PyTorch's whole-network
    capture; autocast's cast cache off, as capture needs): median tokens/s (with min and max) of
    reps timed replays, the peak memory from the first step (parameters, gradients and the
    optimizer's state included) and the GPU's busy time per replay by kind of kernel."""
    from torch.profiler import ProfilerActivity, profile

    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True, capturable=True)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            loss = loss_fn(ids)
        loss.backward()
        opt.step()
        return loss.detach()
    with collector_off():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # the first calls compile, tune and plan: never inside the capture
                opt.zero_grad(set_to_none=True)
                step()
        torch.cuda.current_stream().wait_stream(side)
        opt.zero_grad(set_to_none=True)  # the capture makes the gradients, in its own pool
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss = step()
        graph.replay()
        torch.cuda.synchronize()
        if not torch.isfinite(loss):
            raise RuntimeError(f"the captured step's loss is {loss.item()}")
        rates = []
        for _ in range(reps):
            t0 = time.perf_counter()
            graph.replay()
            torch.cuda.synchronize()
            rates.append(ids.numel() / (time.perf_counter() - t0))
        peak = torch.cuda.max_memory_allocated() / 2**20
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize()
        out = _summary(rates, ids, _gpu_split(prof, 3), peak)
        del graph
        return out


def warm(device, impl: str) -> None:
    """The first calls of main's `impl` run (make bench's warming processes, one per impl): its
    compiled graphs, or the project's kernels at every shape main runs them, into the disk
    caches."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return
    mode, ops, _ = TIMINGS[impl]
    model = build(device, ops)
    fn = functools.partial(loss_of, model)
    fn = torch.compile(fn, mode=mode) if mode else fn
    shapes = [TIMING_SHAPE] + ([CHECK_SHAPE, TRAIN_SHAPE] if ops == ALL_OPS and not mode
                               else [])
    for batch, seq in shapes:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(_batch(batch, seq, device))
        loss.backward()


def _write(path: Path, rows: list[dict]) -> None:
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def preload() -> None:
    """What main imports, imported ahead (make bench starts this step's process before the
    sweep; analysis/bench/__main__.py)."""
    try:
        from transformers import GPT2LMHeadModel  # noqa: F401
    except ImportError:
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m triton_fusion_report.analysis.bench.model_check",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--batch", type=int, default=TIMING_SHAPE[0])
    ap.add_argument("--seq", type=int, default=TIMING_SHAPE[1])
    ap.add_argument("--timings", nargs="+", choices=list(TIMINGS), default=DEFAULT_TIMINGS)
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
    t0 = time.perf_counter()
    rows = [dict(meta, kind="check", **r) for r in check_forward_backward(device)]
    _write(args.out / "model_check.csv", rows)  # after each part: a run cut short keeps it
    for r in rows:
        print(f"{r['check']:32s} torch {r['torch_err']:.2e} triton {r['triton_err']:.2e} "
              f"limit {r['limit']:.2e} {'ok' if r['passed'] else 'FAILED'}", flush=True)
    print(f"(forward + backward check: {time.perf_counter() - t0:.0f} s)", flush=True)
    t0 = time.perf_counter()

    f32 = train_losses(device, autocast=False)
    bf16 = train_losses(device)
    ours = train_losses(device, ALL_OPS)
    train_rows = [dict(step=i, lr=LR, loss_float32=c, loss_torch=a, loss_triton=b,
                       torch_distance=abs(a - c), triton_distance=abs(b - c))
                  for i, (c, a, b) in enumerate(zip(f32, bf16, ours))]
    worst = {k: statistics.fmean(r[f"{k}_distance"] ** 2 for r in train_rows) ** 0.5
             for k in ("torch", "triton")}  # the RMS distance over the run
    within = sum(r["triton_distance"] <= DISTANCE * r["torch_distance"] for r in train_rows)
    rows.append(dict(meta, kind="check", check=f"{STEPS} training steps: RMS distance to float32",
                     batch=TRAIN_SHAPE[0], seq=TRAIN_SHAPE[1], torch_err=worst["torch"], triton_err=worst["triton"],
                     limit=DISTANCE * worst["torch"], steps_within=within,
                     passed=worst["triton"] <= DISTANCE * worst["torch"]))
    print(f"training: losses {f32[0]:.3f} -> {f32[-1]:.3f} (float32), {bf16[-1]:.3f} (torch "
          f"bf16), {ours[-1]:.3f} (ours); RMS distance from float32: torch {worst['torch']:.2e}, "
          f"ours {worst['triton']:.2e}; ours within {DISTANCE}x torch's distance at {within} of "
          f"{len(train_rows)} steps ({time.perf_counter() - t0:.0f} s)", flush=True)
    _write(args.out / "model_check.csv", rows)
    _write(args.out / "model_train.csv", train_rows)

    ids = _batch(args.batch, args.seq, device)
    split_rows = []
    for impl in args.timings:
        mode, ops, captured = TIMINGS[impl]
        model = None
        try:
            model = build(device, ops)
            loss_fn = functools.partial(loss_of, model)
            if mode:
                loss_fn = torch.compile(loss_fn, mode=mode)
            t0 = time.perf_counter()
            r = (measure_captured_step if captured else measure_step)(model, loss_fn, ids)
            split = r.pop("split")
            rows.append(dict(meta, kind="timing", impl=impl, ops=" ".join(sorted(ops)),
                             batch=args.batch, seq=args.seq, status="ok", gc="off",
                             timed="fwd+bwd+AdamW, one CUDA graph" if captured else "fwd+bwd",
                             wall_s=time.perf_counter() - t0, **r))
            split_rows += [dict(impl=impl, kind=k, gpu_ms=v) for k, v in split.items()]
            print(f"{impl:26s} {r['tokens_per_s']:9.0f} tokens/s; step {r['step_ms']:.1f} ms, "
                  f"GPU busy {r['gpu_ms']:.1f} ms, peak {r['peak_mib']:.0f} MiB ("
                  + ", ".join(f"{k} {v:.1f}" for k, v in sorted(split.items(),
                                                                key=lambda kv: -kv[1]))
                  + f"); {rows[-1]['wall_s']:.0f} s", flush=True)
        except Exception as exc:  # noqa: BLE001 - a failing impl is a row, the rest goes on
            rows.append(dict(meta, kind="timing", impl=impl, batch=args.batch, seq=args.seq,
                             status="error", error=f"{type(exc).__name__}: {exc}"[:500]))
            print(f"{impl}: {type(exc).__name__}: {exc}", flush=True)
        del model
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        _write(args.out / "model_check.csv", rows)
        if split_rows:
            _write(args.out / "model_ops.csv", [dict(meta, **r) for r in split_rows])
    failed = [r["check"] for r in rows if r.get("kind") == "check" and not r["passed"]]
    if failed:
        print(f"FAILED: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
