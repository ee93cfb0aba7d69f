"""GPT-2 small trained with the project's ops (analysis/bench/model_check.py): the across-families
chapter's section "In a model", from model_check.csv and model_train.csv, and the host's cost
of forward + backward at tiny sizes from launch_cost.csv."""
from __future__ import annotations

import re

import pandas as pd

from . import data as D

VARIANTS = {"torch_eager": "PyTorch eager", "torch_compile": "torch.compile",
            "triton_fused": "eager + our ops",
            "torch_compile_triton_head": "torch.compile + our LM head and loss",
            "torch_compile_triton": "torch.compile + all our ops",
            "torch_eager_graph": "PyTorch eager, captured",
            "torch_compile_graph": "torch.compile, captured",
            "torch_compile_max_graph": "max-autotune, captured",
            "triton_fused_graph": "eager + our ops, captured",
            "torch_compile_triton_head_graph": "torch.compile + our LM head and loss, captured",
            "torch_compile_triton_graph": "torch.compile + all our ops, captured"}
# The variants whose whole training step (forward, backward, AdamW) replays as one CUDA graph:
# PyTorch's alone, and with our ops.
CAPTURED_TORCH = ["torch_eager_graph", "torch_compile_graph", "torch_compile_max_graph"]
CAPTURED_OURS = ["triton_fused_graph", "torch_compile_triton_head_graph",
                 "torch_compile_triton_graph"]
OPS = {"layer_norm": "LayerNorm", "attention": "attention", "mlp": "linear + GELU",
       "head": "LM head + loss"}


HEADING = "## In a model: GPT-2 small {#sec-model}\n\n"


def timings(folder) -> pd.DataFrame:
    """The model check's timing rows that ran, by variant (in VARIANTS' order)."""
    c = D.load_csv(folder, "model_check")
    if not len(c) or "kind" not in c:
        return pd.DataFrame()
    t = c[(c["kind"] == "timing") & (c["status"] == "ok")].set_index("impl")
    return t.loc[[v for v in VARIANTS if v in t.index]]


def _table(t: pd.DataFrame) -> pd.DataFrame:
    tps = t["tokens_per_s"]
    out = pd.DataFrame({"variant": [VARIANTS[i] for i in t.index],
                        "tokens/s": [f"{v / 1e3:,.0f}k" + _step_range(t, i)
                                     for i, v in tps.items()]})
    # Against eager timing the same step: forward + backward, or the captured whole step.
    eager = [tps.get("torch_eager_graph" if i.endswith("_graph") else "torch_eager")
             for i in t.index]
    if any(e == e and e is not None for e in eager):
        out["× eager"] = [f"{v / e:.2f}" if e == e and e is not None else ""
                          for v, e in zip(tps, eager)]
    out["step (ms)"] = [f"{v:.1f}" for v in t["step_ms"]]
    out["GPU busy (ms)"] = [f"{v:.1f}" for v in t["gpu_ms"]]
    if "peak_mib" in t:
        out["peak memory (GiB)"] = [f"{v / 1024:.1f}" for v in t["peak_mib"]]
    return out


def _step_range(t: pd.DataFrame, impl: str, sep: str = "–") -> str:
    """" (lo–hik)": the slowest and fastest timed step's tokens/s of a variant, where the run
    recorded them ("" otherwise)."""
    if not {"tokens_per_s_min", "tokens_per_s_max"} <= set(t):
        return ""
    lo, hi = t.loc[impl, "tokens_per_s_min"], t.loc[impl, "tokens_per_s_max"]
    return "" if lo != lo or hi != hi else f" ({lo / 1e3:,.0f}{sep}{hi / 1e3:,.0f}k)"


def _spread(t: pd.DataFrame) -> str:
    """The tokens/s are each variant's median step: ours' and eager's range over the timed
    steps, and the GPU the one run used (what the run recorded; "" without the ranges)."""
    if not (_step_range(t, "triton_fused") and _step_range(t, "torch_eager")):
        return ""
    where = (f", one run on one {D.gpu_label(str(t['gpu'].iloc[0]))}" if "gpu" in t
             and isinstance(t["gpu"].iloc[0], str) else "")
    lo, hi = (t.loc["triton_fused", c] for c in ("tokens_per_s_min", "tokens_per_s_max"))
    elo, ehi = (t.loc["torch_eager", c] for c in ("tokens_per_s_min", "tokens_per_s_max"))
    waits = ("; ours, whose steps wait on the host, spreads the more"
             if hi / lo > ehi / elo and t.loc["triton_fused", "step_ms"]
             - t.loc["triton_fused", "gpu_ms"] > t.loc["torch_eager", "step_ms"]
             - t.loc["torch_eager", "gpu_ms"] else "")
    return (f" Each variant's tokens/s is the median of its timed steps{where}: ours ranged "
            f"over {lo / 1e3:,.0f}k to {hi / 1e3:,.0f}k tokens/s from step to step, eager's over "
            f"{elo / 1e3:,.0f}k to {ehi / 1e3:,.0f}k{waits}.")


HOST_IMPLS = {"torch_eager": "eager", "torch_compile": "torch.compile", "public": "ours",
              "python_floor": "empty autograd.Function"}
# The launch-cost rows' ops (their first word) and shapes ("8x1024", "64x64x64 gelu_tanh") as the
# book names them.
HOST_OPS = {"layer_norm": "LayerNorm", "softmax": "softmax", "attention": "attention",
            "linear_act": "linear + GELU"}


def _op_name(op: str) -> str:
    word = op.split()[0]
    return HOST_OPS.get(word, word.replace("_", " "))


def _shape_name(shape: str) -> str:
    return re.sub(r"(?<=\d)x(?=\d)", "×", str(shape)).replace(" gelu_tanh", "")


def _host(folder) -> pd.DataFrame:
    """Host µs per call of forward + backward at tiny sizes (launch_cost.csv's fwd+bwd rows)."""
    lc = D.load_csv(folder, "launch_cost")
    if not len(lc):
        return pd.DataFrame()
    ok = lc[lc["op"].astype(str).str.endswith("fwd+bwd") & lc["host_us"].notna()]
    if not len(ok):
        return pd.DataFrame()
    t = ok.pivot_table(index=["op", "shape"], columns="impl", values="host_us", sort=False)
    t = t[[i for i in HOST_IMPLS if i in t]]
    return pd.DataFrame({"op, forward + backward": [f"{_op_name(op)} {_shape_name(shape)}"
                                                    for op, shape in t.index],
                         **{HOST_IMPLS[i]: [f"{v:.0f}" if v == v else "" for v in t[i]]
                            for i in t}})


def _floor_sentence(folder) -> str:
    """What the empty autograd.Function's row says: the host cost no op with a Python backward
    can go below, against eager's whole op and ours."""
    lc = D.load_csv(folder, "launch_cost")
    rows = lc[lc["op"].astype(str).str.endswith("fwd+bwd") & lc["host_us"].notna()]
    t = rows.pivot_table(index="op", columns="impl", values="host_us", sort=False)
    if not {"python_floor", "torch_eager", "public"} <= set(t):
        return ""
    t = t.dropna(subset=["python_floor", "torch_eager", "public"])
    if not len(t):
        return ""
    share = t["python_floor"] / t["torch_eager"]
    shares = ", ".join(f"{_op_name(op)} {v:.0%}" for op, v in share.items())
    return (f"An autograd.Function that launches nothing, called as our ops are, costs {shares} "
            "of eager's whole forward + backward: what eager pays too (torch.autograd.grad's own "
            "work, the engine's hand-off to its device thread), and a Python forward and backward "
            "where eager's are C++. To match eager, an op's launches and Python must fit in the "
            f"{D.range_text((t['torch_eager'] - t['python_floor']).min(), (t['torch_eager'] - t['python_floor']).max(), '.0f')}"
            " µs that eager's op costs above that floor; ours take "
            f"{D.range_text((t['public'] - t['python_floor']).min(), (t['public'] - t['python_floor']).max(), '.0f')}"
            " µs. In a model the GPU's time hides the host's where the kernels are large "
            "enough (GPT-2 above).\n\n")


def _checks(folder) -> str:
    c = D.load_csv(folder, "model_check")
    if not len(c) or "kind" not in c:
        return ""
    one = c[(c["kind"] == "check") & c["check"].astype(str).str.startswith("fwd+bwd")] \
        if "check" in c else c.iloc[:0]
    parts = []
    if len(one):
        parts.append(f"Against a float32 run, GPT-2 with our ops passes "
                     f"{one['passed'].astype(str).eq('True').sum()} of {len(one)} checks of its "
                     "outputs and gradients (at most twice the error of PyTorch's own bf16 run).")
    train = D.load_csv(folder, "model_train")
    if len(train) and {"torch_distance", "triton_distance"} <= set(train):
        rms_t, rms_o = ((train[c] ** 2).mean() ** 0.5 for c in ("torch_distance",
                                                                  "triton_distance"))
        within = (train["triton_distance"] <= 1.5 * train["torch_distance"]).sum()
        parts.append(f"Over {len(train)} AdamW steps the loss curve with our ops lies at an RMS "
                     f"distance of {rms_o:.4f} from float32's, PyTorch's bf16 run at {rms_t:.4f} "
                     f"({rms_o / rms_t:.2f}× PyTorch's; step by step ours is within 1.5× "
                     f"PyTorch's distance at {within} of {len(train)} steps, a ratio that means "
                     "little where PyTorch's curve crosses float32's).")
    return " ".join(parts)


def _sentence(t: pd.DataFrame) -> str:
    tps = t["tokens_per_s"]
    parts = []
    if {"triton_fused", "torch_eager"} <= set(tps.index):
        g, st = t["gpu_ms"], t["step_ms"]
        parts.append(
            f"In eager mode our ops make the step's GPU work {g['triton_fused']:.1f} ms against "
            f"PyTorch's {g['torch_eager']:.1f}, but the step takes {st['triton_fused']:.1f} ms: "
            f"for {st['triton_fused'] - g['triton_fused']:.0f} ms of it the GPU waits on the "
            "host, whose Python calls of the Triton kernels, forward and backward, cost more "
            "than PyTorch's C++ path (@fig-x-launch).")
        parts.append(f"That leaves {tps['triton_fused'] / tps['torch_eager']:.2f}× eager's "
                     "tokens/s." + _spread(t))
    if {"torch_compile_triton_head", "torch_compile"} <= set(tps.index):
        parts.append(f"Under torch.compile, which removes most of the host's time, our fused LM "
                     f"head and loss alone take GPT-2 from {tps['torch_compile'] / 1e3:,.0f}k "
                     f"to {tps['torch_compile_triton_head'] / 1e3:,.0f}k tokens/s "
                     f"({tps['torch_compile_triton_head'] / tps['torch_compile']:.2f}×)")
        if "peak_mib" in t:
            parts[-1] += (f", its peak memory from {t.loc['torch_compile', 'peak_mib'] / 1024:.1f} "
                          f"to {t.loc['torch_compile_triton_head', 'peak_mib'] / 1024:.1f} GiB")
        parts[-1] += "."
    if "torch_compile_triton" in tps.index and "torch_compile" in tps.index:
        parts.append(f"Every op swapped in under torch.compile runs at "
                     f"{tps['torch_compile_triton'] / tps['torch_compile']:.2f}× compile's "
                     "tokens/s: Inductor no longer fuses around them.")
    return " ".join(parts)


def captured_name(impl: str) -> str:
    """A captured variant's name where the sentence already says it is captured."""
    return VARIANTS[impl].removesuffix(", captured")


def best_captured(t: pd.DataFrame) -> tuple[str, str] | None:
    """(PyTorch's fastest captured variant, ours' fastest), where the run has both."""
    tps = t["tokens_per_s"] if len(t) else pd.Series(dtype=float)
    torch_ = [i for i in CAPTURED_TORCH if i in tps.index]
    ours = [i for i in CAPTURED_OURS if i in tps.index]
    return (tps[torch_].idxmax(), tps[ours].idxmax()) if torch_ and ours else None


def _captured(folder, t: pd.DataFrame) -> str:
    """The captured steps: ours against PyTorch's fastest, their memory, and, where one of ours
    is slower, the kind of kernel whose GPU time holds it back (model_ops)."""
    best = best_captured(t)
    if best is None:
        return ""
    tps, mem = t["tokens_per_s"], "peak_mib" in t
    theirs = best[0]
    gib = (lambda i: f" in {t.loc[i, 'peak_mib'] / 1024:.1f} GiB") if mem else (lambda i: "")
    text = (f"Captured as one CUDA graph, forward, backward and AdamW together, a step leaves "
            f"the host out and the kernels decide. PyTorch's fastest, {captured_name(theirs)}, runs "
            f"at {tps[theirs] / 1e3:,.0f}k tokens/s{gib(theirs)}; ")
    ours = sorted((i for i in CAPTURED_OURS if i in tps.index), key=lambda i: -tps[i])
    text += "; ".join(f"{captured_name(i)} at {tps[i] / 1e3:,.0f}k{gib(i)} (a speedup of "
                      f"{tps[i] / tps[theirs]:.2f}×)" for i in ours) + "."
    ops = D.load_csv(folder, "model_ops")
    if len(ops):
        split = ops.pivot_table(index="kind", columns="impl", values="gpu_ms", aggfunc="sum")
        for i in (i for i in ours if tps[i] < tps[theirs] and {i, theirs} <= set(split)):
            more = (split[i] - split[theirs]).fillna(0.0)
            kind = more.idxmax()
            text += (f" What holds {captured_name(i)} back is {kind} kernels: "
                     f"{split.loc[kind, i]:.1f} ms of GPU time a step against "
                     f"{split.loc[kind, theirs]:.1f}.")
    return text


def _gc_note(t: pd.DataFrame) -> str:
    """How the steps were timed, where the run recorded it (older runs did not)."""
    if "gc" in t and (t["gc"].astype(str) == "off").all():
        return ("; the steps timed with Python's cyclic garbage collector off, as training "
                "frameworks run it: its passes over every object the process holds slow a "
                "host-bound step")
    return ""


TRAINING_IMPLS = {"torch_eager": "eager", "torch_compile": "torch.compile", "liger": "Liger",
                  "triton_fused": "ours"}
TRAINING_OPS = {"layer_norm_fwd_bwd": "LayerNorm", "softmax_fwd_bwd": "softmax"}


def training(folder) -> pd.DataFrame:
    """ms per forward + backward call through autograd at training shapes (the training family's
    rows), by op and shape: each implementation's, and ours over the fastest other's."""
    r = D.load(folder, "training")
    r = r[(r["status"] == "ok") & r["ms_median"].notna()] if len(r) else r
    if not len(r):
        return pd.DataFrame()
    t = r.pivot_table(index=["op", "dtype", "rows", "width"], columns="impl", values="ms_median",
                      sort=False)
    t = t[[i for i in TRAINING_IMPLS if i in t]]
    out = pd.DataFrame({"op, forward + backward": [f"{TRAINING_OPS.get(op, op)} "
                                                   f"{D.SHORT_DTYPE.get(dtype, dtype)} "
                                                   f"{rows}×{width}"
                                                   for op, dtype, rows, width in t.index]})
    for impl in t:
        out[TRAINING_IMPLS[impl]] = [f"{v:.3f}" if v == v else "" for v in t[impl]]
    others = t.drop(columns=["triton_fused"], errors="ignore").min(axis=1)
    if "triton_fused" in t:
        out["speedup"] = [f"{b / o:.2f}×" if o == o and b == b else ""
                          for o, b in zip(t["triton_fused"], others)]
    return out


def _training_text(folder) -> str:
    t = training(folder)
    if not len(t):
        return ""
    return (D.md_table(t) + "\n\n: Forward + backward through autograd at training shapes, ms "
            "per call (back-to-back calls; the backward runs on the autograd engine's thread, so "
            "a call's host time counts where it exceeds its GPU time). Speedup: the fastest "
            "other's time over ours. {#tbl-model-training}\n")


def compute(folders: list) -> dict:
    folder = folders[0]
    t = timings(folder)
    if not len(t):
        # No GPT-2 check: the section holds the training table alone, or is left out.
        training_text = _training_text(folder)
        return {"say": {"section": HEADING + training_text if training_text else "",
                        "gpt2": D.lacking("GPT-2 timings (the model check needs `transformers` "
                                          "on the GPU machine)")}}
    ops = t["ops"].get("triton_fused") if "ops" in t else None
    swapped = (", ".join(OPS[o] for o in OPS if o in str(ops).split()) if isinstance(ops, str)
               else "ops")  # the references' older runs did not record which
    b, s = int(t["batch"].iloc[0]), int(t["seq"].iloc[0])
    host = _host(folder)
    section = (
        HEADING +
        f"Hugging Face's GPT-2 small (random weights), one forward and backward of {b} × {s:,} "
        f"tokens under bf16 autocast, with our {swapped} swapped in "
        f"(how it was run: @sec-reproducibility{_gc_note(t)}). " + _sentence(t) + " "
        + _captured(folder, t) + " " + _checks(folder) + "\n\n"
        + D.md_table(_table(t)) + "\n\n: GPT-2 small trained with PyTorch's ops and with ours, "
        "eager and under torch.compile; a captured variant replays its whole step, AdamW included, "
        "as one CUDA graph (its peak memory holds AdamW's state too), the others time forward and "
        "backward, and × eager is against eager timing the same" + ("; tokens/s of the median timed step (in brackets, "
                                           "of the slowest and the fastest)"
                                           if _step_range(t, t.index[0]) else "")
        + ". {#tbl-model-gpt2}\n\n"
        + (D.md_table(host) + "\n\n: Where the host's time goes: µs of host time per forward + "
           "backward call at tiny sizes (back-to-back calls). {#tbl-model-host}\n\n"
           + _floor_sentence(folder) if len(host) else "")
        + _training_text(folder))
    return {"say": {"section": section}, "table": _table(t)}
