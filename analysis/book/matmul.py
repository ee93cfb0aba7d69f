"""Chapter "Fusing into a matmul": softmax(x @ W + b) and act(x @ W + b) as epilogues. Model
(bytes, FLOPs) -> measurement (device time, the plan's method, TFLOP/s) -> meaning."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pandas as pd

from ..model import traffic
from ..model.roofline import model_ms
from . import data as D
from . import figures

# The model's two shapes (B, K, C), half precision: many rows and few classes, where the bytes
# set the time, and a language model's vocabulary head, whose logits cannot stay on chip.
MEMORY_BOUND = (65536, 512, 256)
VOCAB = (4096, 1024, 128256)
# Chosen before they were measured and used for none of the plan's thresholds (MS_HELD_OUT of
# analysis/bench/matmul_epilogue.py, copied: that module imports torch).
HELD_OUT = [(6144, 2048, 8192), (2048, 3072, 24576), (1024, 2048, 640), (32768, 256, 2000)]
LAUNCH_US = 25.0  # the fastest complete version under this: a few launches' fixed cost
TIE = 1.03  # within 3% either way is a tie: long rows re-measure within a few percent
PCT = f"{(TIE - 1) * 100:.0f}%"
# What computes the whole op; cuBLAS alone is the matmul without the epilogue, a reference.
COMPLETE = ["torch_eager", "torch_compile", "torch_compile_max", "triton_unfused",
            "triton_fused", "cublaslt"]
METHOD_STYLE = {"simple": ("#8c564b", "o"), "tiled": ("#d62728", "^"), "online": ("#9467bd", "D"),
                "two_pass_store": ("#1f77b4", "s"), "store_softmax": ("#ff7f0e", "v"),
                "split_k": ("#2ca02c", "P")}
LINEAR_IMPLS = ["cublas", "cublaslt", "torch_eager", "torch_compile", "torch_compile_max",
                "triton_unfused", "triton_fused"]
SHAPE = ["m", "k", "n"]


def shape_text(m, k, n) -> str:
    return f"{int(m)}³" if m == k == n else f"{int(m)} × {int(k)} × {int(n)}"


def _rows_at(rows: pd.DataFrame, shape) -> pd.DataFrame:
    return rows[(rows["m"] == shape[0]) & (rows["k"] == shape[1]) & (rows["n"] == shape[2])] \
        if len(rows) else rows


def _complete(t: dict) -> dict:
    return {i: v for i, v in t.items() if i in COMPLETE}


def _fastest_other(t: dict) -> tuple[str, float] | None:
    """The fastest complete implementation other than ours and its time; None without one."""
    other = {i: v for i, v in _complete(t).items() if i != "triton_fused"}
    return min(other.items(), key=lambda iv: iv[1]) if other else None


def _versus(fused: float, name: str, other: float) -> str:
    """The fused op against `name`: faster, level (within TIE) or slower."""
    who = D.IMPL_LABEL[name]
    return (f"{other / fused:.2f}× faster than {who}" if other > fused * TIE else
            f"at {other / fused:.2f}× the speed of {who}" if other < fused / TIE else
            f"level with {who} (within {PCT})")


def _per_shape(rows: pd.DataFrame) -> dict:  # (m, k, n) -> {impl: ms}, in the rows' order
    groups = rows.groupby(SHAPE, sort=False) if len(rows) else []
    return {tuple(int(v) for v in s): D.times(g) for s, g in groups}


def _roofline_ms(kernels, bw: float, peak: float) -> float:
    """The roofline model's time, NaN where the run measured no bandwidth or peak."""
    return model_ms(kernels, bw, peak) if bw == bw and peak == peak else math.nan


def _kernels(shape, impl, method=None):
    return traffic.matmul_softmax_kernels(*shape, 2, impl, method)


def traffic_table(bw: float, peak: float) -> pd.DataFrame:
    """Bytes and roofline time of each way to handle the logits at the two model shapes."""
    rows = []
    for name, logits, impl, method in [
            ("unfused pair", "written, read back", "triton_unfused", None),
            ("`tiled`", "kept on chip (C ≤ 512)", "triton_fused", "tiled"),
            ("`online`", "recomputed (2× FLOPs)", "triton_fused", "online"),
            ("`two_pass_store`", "in the output, rewritten", "triton_fused", "two_pass_store"),
            ("`store_softmax`", "as the unfused pair", "triton_fused", "store_softmax"),
            ("cuBLAS alone", "no softmax", "cublas", None)]:
        row = {"method": name, "logits": logits}
        for tag, shape, unit, per, time, scale in (("A", MEMORY_BOUND, "MB", 1e6, "µs", 1e3),
                                                   ("B", VOCAB, "GB", 1e9, "ms", 1)):
            ks = _kernels(shape, impl, method) if method != "tiled" or shape[2] <= 512 else []
            row[f"{tag}: {unit}"] = traffic.total(ks) / per if ks else math.nan
            row[f"{tag}: {time}"] = _roofline_ms(ks, bw, peak) * scale if ks else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def _model(bw: float, peak: float) -> dict:
    """Bytes at A unfused and fused, the logits' share, the modelled gain, the K at which a second
    matmul costs the logits' round trip, the round trip's share of B's time; the sentence."""
    unfused, fused = (_kernels(MEMORY_BOUND, *w) for w in (("triton_unfused",),
                                                           ("triton_fused", "tiled")))
    u, f = traffic.total(unfused), traffic.total(fused)
    B, K, C = VOCAB
    mo = dict(u=u, f=f, share=1 - f / u, k_even=2 * peak * 1e12 / (bw * 1e9),
              gain=_roofline_ms(unfused, bw, peak) / _roofline_ms(fused, bw, peak),
              vocab_share=1 - _roofline_ms(_kernels(VOCAB, "cublas"), bw, peak)
              / _roofline_ms(_kernels(VOCAB, "triton_fused", "two_pass_store"), bw, peak))
    mo["say"] = (f"At A = {shape_text(*MEMORY_BOUND)} the unfused pair moves {u / 1e6:,.0f} MB "
                 f"and the one-kernel `tiled` method {f / 1e6:,.0f} MB: the logits' write and "
                 f"re-read are {100 * mo['share']:.0f}% of the traffic. ")
    mo["say"] += D.lacking("measured copy bandwidth and fp16 matmul peak for this run") if (
        mo["gain"] != mo["gain"]) else (
        f"Its matmul is light enough for the bytes to set the time, so the model bounds fusion's "
        f"gain at {mo['gain']:.2f}×. At B = {shape_text(*VOCAB)}, a vocabulary head, the logits "
        f"({B * C * 2 / 1e9:.2f} GB) cannot stay on chip: recomputing them (`online`) costs a "
        f"second matmul, {2 * B * K * C / peak / 1e9:.2f} ms at the measured peak, and storing "
        f"them (`two_pass_store`) one more write and read, {2 * B * C * 2 / bw / 1e6:.2f} ms at "
        "the copy bandwidth. By this model storing wins whenever K exceeds 2 bytes × peak / "
        f"bandwidth = {mo['k_even']:.0f} in half precision.")
    return mo


def _with_shape(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows with their shape as text, matmul FLOPs and µs, ordered by FLOPs."""
    if not len(rows):
        return rows.assign(**{c: pd.Series(dtype=float) for c in ("shape", "flops", "t_us")})
    rows = rows.assign(shape=[f"{m}×{k}×{n}" for m, k, n in zip(rows["m"], rows["k"], rows["n"])],
                       flops=2.0 * rows["m"] * rows["k"] * rows["n"], t_us=1000 * rows["t_ms"])
    return rows.sort_values(["flops", "m"]).reset_index(drop=True)


def _small(ms: pd.DataFrame) -> str:
    """The launch-bound configurations, every precision: who is fastest on the GPU there."""
    rows = D.timed(ms) if len(ms) else ms
    rows = rows[rows["device"]] if len(rows) else rows
    small = []  # (dtype, shape, fused ms, fastest other ms)
    for (dtype, _, *shape), g in rows.groupby(["dtype", "precision", *SHAPE]) if len(rows) else []:
        t = _complete(D.times(g))
        if "triton_fused" in t and _fastest_other(t) and min(t.values()) * 1000 < LAUNCH_US:
            small.append((dtype, tuple(shape), t["triton_fused"], _fastest_other(t)[1]))
    if not small:
        return D.lacking(f"device times of configurations that take under {LAUNCH_US:.0f} µs")
    fastest, shapes = [min(p[2:]) * 1e3 for p in small], {p[1] for p in small}
    text = (f"At {len(small)} configurations ({len(shapes)} shapes up to "
            f"{shape_text(*max(shapes, key=math.prod))}) the fastest version takes "
            f"{D.range_text(min(fastest), max(fastest), '.0f')} µs of GPU time, a few kernels' "
            "fixed cost: the count of launches matters there, not the bytes.")
    for dtype, name in (("float32", "In float32 (IEEE and TF32)"), ("float16", "In float16")):
        part = [p[3] / p[2] for p in small if p[0] == dtype]  # their time over ours
        ahead, behind = [r for r in part if r > TIE], [r for r in part if r < 1 / TIE]
        text += (f" {name} the fused op is ahead of every other version by more than {PCT} at "
                 f"{len(ahead)} of {len(part)}" + (f" (up to {max(ahead):.2f}×)" if ahead else "")
                 + (f" and behind at {len(behind)} (up to {1 / min(behind):.2f}×)"
                    if behind else "") + "." if part else "")
    return text


def _large(half: pd.DataFrame) -> str:
    """Float16 past the launch regime: fused against the fastest other; behind: fusion or matmul?"""
    shapes = {s: t for s, t in _per_shape(half).items() if "triton_fused" in t
              and _fastest_other(t) and min(_complete(t).values()) * 1000 >= LAUNCH_US}
    if not shapes:
        return D.lacking(f"float16 shapes whose versions take over {LAUNCH_US:.0f} µs")
    best = {s: _fastest_other(t) for s, t in shapes.items()}
    ratio = {s: best[s][1] / t["triton_fused"] for s, t in shapes.items()}
    ahead, behind = [s for s in ratio if ratio[s] > TIE], [s for s in ratio if ratio[s] < 1 / TIE]
    text = (f"Of the {len(shapes)} float16 shapes past the launch regime, the fused op is the "
            f"fastest complete implementation by more than {PCT} at {len(ahead)}"
            + (f" ({', '.join(f'{shape_text(*s)}, {ratio[s]:.2f}×' for s in ahead)})" if ahead
               else "") + f", within {PCT} of the fastest at "
            f"{len(shapes) - len(ahead) - len(behind)} and behind at {len(behind)}")
    if not behind:
        return text + "."
    slower = [100 * (1 / ratio[s] - 1) for s in behind]
    who = pd.Series([D.IMPL_LABEL[best[s][0]] for s in behind]).value_counts()
    text += (f" by {D.range_text(min(slower), max(slower), '.0f')}% ("
             + ", ".join(f"{name} the fastest at {n}" for name, n in who.items()) + ").")
    # Our unfused pair runs the same matmul code with the logits stored, except at widths not a
    # multiple of 8, where its matmul cannot use TMA (see _odd_width): there they do not compare.
    gain = {s: shapes[s]["triton_unfused"] / shapes[s]["triton_fused"] for s in behind
            if s[2] % 8 == 0 and "triton_unfused" in shapes[s]}
    level, pays = [s for s in gain if gain[s] <= TIE], [s for s in gain if gain[s] > TIE]
    odd = [s for s in behind if s[2] % 8]
    if level:
        text += (f" Where it is behind, it is level with our own unfused pair (the same matmul "
                 f"code, logits stored) at {len(level)}: there our matmul trails, not the fusion.")
    if pays:
        text += (f" At {', '.join(shape_text(*s) for s in pays)} fusion pays "
                 f"{D.range_text(min(gain[s] for s in pays), max(gain[s] for s in pays), '.2f')}× "
                 "over that pair, and "
                 + " and ".join(sorted({D.IMPL_LABEL[best[s][0]] for s in pays}))
                 + " is faster still.")
    return text + (f" The other {len(odd)} have a width that is not a multiple of 8, where our "
                   "unfused matmul cannot use TMA (below), so the two do not compare."
                   if odd else "")


def _memory(half: pd.DataFrame, bw: float, mo: dict) -> str:
    t = D.times(_rows_at(half, MEMORY_BOUND))
    if "triton_fused" not in t or "triton_unfused" not in t or bw != bw:
        return D.lacking(f"timed fused and unfused rows at {shape_text(*MEMORY_BOUND)}")
    (name, other), fused, unfused = _fastest_other(t), t["triton_fused"], t["triton_unfused"]
    return (f"At {shape_text(*MEMORY_BOUND)} fusion pays about what the bytes say: the fused "
            f"kernel takes {fused * 1000:.1f} µs against {unfused * 1000:.1f} for our unfused "
            f"pair, {unfused / fused:.2f}×"
            + (f" against the model's {mo['gain']:.2f}×" if mo["gain"] == mo["gain"] else "")
            + (f", and {other * 1000:.1f} for {D.IMPL_LABEL[name]}, the fastest other version. "
               if name != "triton_unfused" else ". ")
            + f"Its {mo['f'] / 1e6:,.0f} MB take {mo['f'] / bw / 1e3:.1f} µs at the measured "
              "copy bandwidth" + (f"; cuBLAS's matmul alone, writing as many logits, takes "
                                  f"{t['cublas'] * 1000:.1f} µs." if "cublas" in t else "."))


def _vocab(half: pd.DataFrame, methods: pd.DataFrame, bw: float) -> str:
    t = D.times(_rows_at(half, VOCAB))
    if "triton_fused" not in t or "cublas" not in t or not _fastest_other(t):
        return D.lacking(f"timed fused and cuBLAS rows at {shape_text(*VOCAB)}")
    fused, mm, B, K, C = t["triton_fused"], t["cublas"], *VOCAB
    text = (f"At the vocabulary shape {shape_text(*VOCAB)} the fused op takes {fused:.2f} ms, "
            f"{_versus(fused, *_fastest_other(t))}, the fastest other version. cuBLAS's matmul "
            f"alone takes {mm:.2f} ms ({2 * B * K * C / mm / 1e9:.0f} TFLOP/s); every complete "
            f"version takes at least {min(_complete(t).values()) - mm:.2f} ms more"
            + (f", of which the logits' extra read and write account for "
               f"{2 * B * C * 2 / bw / 1e6:.2f} ms at the copy bandwidth" if bw == bw else ""))
    online = _rows_at(methods, VOCAB)
    online = online[online["variant"] == "online"]["t_ms"] if len(online) else online
    return text + (f". Recomputing the logits instead (`online`) takes {online.min():.2f} ms: at "
                   f"K = {K} a second matmul costs more than the round trip it saves."
                   if len(online) and online.min() > fused else ".")


def _odd_width(half: pd.DataFrame) -> str:
    """The largest shape with a width not a multiple of 8 against the aligned large shapes."""
    big = {s: t for s, t in _per_shape(half).items() if t.get("cublas", 0) * 1e3 >= 10 * LAUNCH_US}
    rate = {s: 2 * math.prod(s) / t["cublas"] / 1e9 for s, t in big.items()}
    odd = [s for s, t in big.items() if s[2] % 8 and "triton_fused" in t and _fastest_other(t)]
    even = [rate[s] for s in big if s[2] % 8 == 0]
    if not odd or not even:
        return D.lacking("large float16 shapes with and without a width that is a multiple of 8")
    s = max(odd, key=math.prod)
    t, fused, mm = big[s], big[s]["triton_fused"], big[s]["cublas"]
    text = (f"At {shape_text(*s)}" + (" (GPT-2's vocabulary)" if s[2] == 50257 else "")
            + f" the width {s[2]} is not a multiple of 8, and cuBLAS falls off its fast path: its "
            f"matmul alone reaches {rate[s]:.0f} TFLOP/s there against "
            f"{D.range_text(min(even), max(even), '.0f')} at the aligned large shapes and takes "
            f"{mm:.2f} ms" + (
                f", longer than the whole fused op ({fused:.2f} ms). So the fused op is "
                f"{t['torch_eager'] / fused:.2f}× faster than eager, which runs that matmul, "
                "because of cuBLAS's slow path, not because of fusion."
                if mm > fused and "torch_eager" in t else "."))
    if "triton_unfused" in t:
        text += (f" Our own unfused pair is slow there too ({t['triton_unfused']:.2f} ms): rows "
                 f"of {s[2]} half-precision values are not 16-byte aligned, as its TMA matmul "
                 "needs (@sec-glossary), whereas the fused op first copies the weight into padded "
                 "rows.")
    name, other = _fastest_other(t)
    return text + (f" {D.IMPL_LABEL[name]} is the fastest there: the fused op runs at "
                   f"{other / fused:.2f}× its speed." if other < fused / TIE else "")


def _methods(ms: pd.DataFrame) -> pd.DataFrame:
    """Per float16 shape and method: time over the fastest method's; did the plan take it?"""
    if not len(ms):
        return _with_shape(ms.iloc[:0])
    rows = pd.concat([D.timed(ms, impl="triton_fused", dtype="float16").assign(plan=True),
                      D.timed(ms, sweep="method", dtype="float16").assign(plan=False)])
    rows = rows[rows["variant"].isin(METHOD_STYLE)]
    rows = rows.groupby([*SHAPE, "variant"], as_index=False).agg(t_ms=("t_ms", "min"),
                                                                 plan=("plan", "any"))
    fastest = rows.groupby(SHAPE)["t_ms"].transform("min")
    return _with_shape(rows.assign(over_best=rows["t_ms"] / fastest))


def _methods_sentence(methods: pd.DataFrame, k_even: float) -> str:
    several = methods.groupby("shape")["variant"].transform("nunique") > 1 if len(methods) else []
    picked = methods[methods["plan"] & several] if len(methods) else methods
    if not len(picked):
        return D.lacking("float16 method sweep beside the plan's own rows")
    n, best, close = (len(picked), int((picked["over_best"] <= 1.0).sum()),
                      int((picked["over_best"] <= TIE).sum()))
    worst = picked.loc[picked["over_best"].idxmax()]
    text = (f"Over {n} float16 shapes the plan takes the fastest measured method at "
            f"{'all' if best == n else best}"
            + (f" and one within {PCT} of it at {'all' if close == n else close}"
               if close > best else "")
            + (f"; its worst pick, `{worst['variant']}` at {shape_text(*worst[SHAPE])}, takes "
               f"{worst['over_best']:.2f}× the fastest method's time." if best < n else "."))
    held = picked[[tuple(r) in HELD_OUT for r in picked[SHAPE].itertuples(index=False)]]
    if len(held):
        hits = int((held["over_best"] <= 1.0).sum())
        text += (f" Its thresholds were set on these measurements, so that is a fit; of the "
                 f"{len(held)} shapes chosen before they were measured and used for no threshold "
                 f"({', '.join(shape_text(*r) for r in held[SHAPE].itertuples(index=False))}) it "
                 f"picks the fastest method at {'all' if hits == len(held) else hits}"
                 + (f", at worst {held['over_best'].max():.2f}× it." if hits < len(held) else "."))
    online = methods[methods["variant"] == "online"]
    below = online[online["k"] < k_even]["shape"].nunique() if k_even == k_even else 0
    return text + (f" Recomputing the logits (`online`) is the fastest method at none of the "
                   f"{online['shape'].nunique()} shapes where it ran" + (
                       f", not even at the {below} whose K is below the model's break-even: "
                       "the model assumes both its matmul passes run at the peak, and at such "
                       "short K they do not" if below else "") + "."
                   if len(online) and not (online["over_best"] <= 1.0).any() else "")


def _linear(la: pd.DataFrame, limits: pd.DataFrame) -> pd.DataFrame:
    """TFLOP/s per row, and the matmul peak of its precision measured by the row's own run."""
    rows = D.timed(la) if len(la) else la
    if not len(rows):
        return rows.assign(**{c: pd.Series(dtype=float) for c in ("tflops", "label", "peak")})
    key = ["dtype", "precision", *SHAPE, "activation"]
    rows = rows.assign(tflops=2.0 * rows["m"] * rows["k"] * rows["n"] / rows["t_ms"] / 1e9)
    peak, label = {}, {}
    for k, g in rows.groupby(key):
        dtype, precision, m, kk, n, act = k
        peak[k] = D.limit(limits, "matmul_peak", {"float16": "fp16", "bfloat16": "bf16"}.get(
            precision, precision), run_id=D.run_of(g))
        name = "TF32" if precision == "tf32" else D.SHORT_DTYPE.get(dtype, dtype)
        label[k] = (f"{name} {dict(gelu='GELU', relu='ReLU').get(act, act)}\n"
                    + (f"{m}³" if m == kk == n else f"{m}×{kk}\n×{n}"))
    idx = list(rows[key].itertuples(index=False, name=None))
    rows = rows.assign(peak=[peak[i] for i in idx], label=[label[i] for i in idx])
    return rows.sort_values(["dtype", "m", "n"], ascending=[False, True, True])


def _linear_sentence(head, bw: float) -> str:
    t = D.times(head[1]) if head else {}
    if "triton_fused" not in t or not _fastest_other(t):
        return D.lacking("timed fused and other float16 linear + GELU rows at one shape")
    (m, k, n), at = head
    tf = at.groupby("impl")["tflops"].max()
    (name, other), fused, peak = _fastest_other(t), t["triton_fused"], at["peak"].iloc[0]
    share = (f", {100 * tf['triton_fused'] / peak:.0f}% of the matmul peak its run measured "
             f"({D.num(peak)})" if peak == peak else "")
    if D.toy(fused):  # a toy size: its rates and a round trip's share are a launch's
        gain = 100 * (t["triton_unfused"] / fused - 1) if "triton_unfused" in t else float("nan")
        return (f"At {shape_text(m, k, n)} in float16, a toy size, the fused kernel is "
                + (f"{abs(gain):.1f}% {'faster' if gain >= 0 else 'slower'} than our unfused "
                   "pair with the same matmul and " if gain == gain else "")
                + f"{_versus(fused, name, other)}, the fastest other complete version.")
    text = (f"At {shape_text(m, k, n)} in float16 the fused kernel reaches "
            f"{D.num(tf['triton_fused'])} TFLOP/s{share}.")
    if "triton_unfused" in t and bw == bw:
        rt, gain = 2 * m * n * 2 / bw / 1e6, 100 * (t["triton_unfused"] / fused - 1)
        text += (f" Fusing the GELU saves its round trip, {D.num(2 * m * n * 2 / 1e6)} MB or "
                 f"{D.num(rt * 1000)} µs at the copy bandwidth, {100 * rt / fused:.0f}% of the "
                 f"fused kernel's {D.num(fused)} ms; measured, the fused kernel is "
                 f"{abs(gain):.1f}% {'faster' if gain >= 0 else 'slower'} than our unfused pair "
                 "with the same matmul.")
    text += (f" The fused kernel is {_versus(fused, name, other)}, the fastest other complete "
             f"version ({D.num(tf[name])} TFLOP/s)")
    if "cublaslt" in tf and name != "cublaslt":
        text += f"; cuBLASLt with the GELU in its own epilogue reaches {D.num(tf['cublaslt'])}"
    return text + (f"; cuBLAS's matmul alone, which computes neither bias nor GELU, "
                   f"{D.num(tf['cublas'])}." if "cublas" in tf else ".")


def _linear_all(linear: pd.DataFrame) -> str:
    """Every linear + activation shape: who is fastest, the field's width, the trials' spread."""
    leaders, spreads, noise = [], [], []
    for _, g in linear.groupby(["dtype", "precision", *SHAPE, "activation"]) if len(linear) else []:
        t = _complete(D.times(g))
        if len(t) > 1:
            leaders.append(D.IMPL_LABEL[min(t, key=t.get)])
            spreads.append(max(t.values()) / min(t.values()))
            several = g[g["n_trials"] > 1] if "n_trials" in g else g.iloc[:0]
            noise.extend((several["ms_trial_max"] / several["ms_trial_min"]).dropna())
    if not spreads:
        return D.lacking("linear + activation shapes with two complete implementations timed")
    leaders = ", ".join(f"{i} at {c}" for i, c in pd.Series(leaders).value_counts().items())
    return (f"Over {len(spreads)} shapes and precisions (@fig-mm-linear) the fastest complete "
            f"version is {leaders}, and the slowest takes at most "
            f"{100 * (max(spreads) - 1):.0f}% longer than the fastest" + (
                f"; the timing trials of a single row spread by up to {100 * (max(noise) - 1):.0f}%"
                + (", as much as the gaps between them" if max(noise) >= max(spreads) else "")
                if noise else "") + ".")


def _meaning(half, head, mo: dict) -> str:
    """When fusing into a matmul pays: the round trip's share of the time."""
    t, lt = D.times(_rows_at(half, MEMORY_BOUND)), (D.times(head[1]) if head else {})
    complete, parts = _complete(lt), []
    if "triton_fused" in t and "triton_unfused" in t:
        parts.append(f"Fusing into a matmul pays where the matmul is light and its output large: "
                     f"at {shape_text(*MEMORY_BOUND)} keeping the logits on chip removes "
                     f"{100 * mo['share']:.0f}% of the bytes and makes the op "
                     f"{t['triton_unfused'] / t['triton_fused']:.2f}× faster than the same "
                     "kernels unfused.")
    if mo["gain"] == mo["gain"]:
        parts.append(
            f"The round trip of a half-precision output costs as much as a matmul with "
            f"K = {mo['k_even']:.0f}: at the vocabulary head's K = {VOCAB[1]} it is still "
            f"{100 * mo['vocab_share']:.0f}% of the traffic model's time, but the logits do not fit on "
            "chip and recomputing them costs more" + (
                f"; after a linear layer with K = {head[0][1]}, fusing the GELU saves "
                f"{100 * (lt['triton_unfused'] / lt['triton_fused'] - 1):.1f}% against a "
                f"{100 * (max(complete.values()) / min(complete.values()) - 1):.0f}% spread "
                "between the complete versions" if "triton_fused" in lt and "triton_unfused" in lt
                and len(complete) > 1 else "") + ".")
    return " ".join(parts) or D.lacking("timed matmul + softmax or linear + activation rows")


def compute(folders: list) -> dict:
    folder = folders[0]
    ms, la = D.load(folder, "matmul_softmax"), D.load(folder, "linear_act")
    limits = D.load_limits(folder)
    runs = D.runs_of(ms) if len(ms) else []
    bw, peak = (D.limit(limits, "copy_bw", run_id=runs),
                D.limit(limits, "matmul_peak", "fp16", run_id=runs))
    half = _with_shape(D.timed(ms, dtype="float16") if len(ms) else ms.iloc[:0])
    methods, linear, mo = _methods(ms), _linear(la, limits), _model(bw, peak)
    # The headline linear shape: the largest float16 GELU one, ((m, k, n), its rows), or None.
    gelu = linear[(linear["dtype"] == "float16") & (linear["activation"] == "gelu")] \
        if len(linear) else linear
    shape = max(_per_shape(gelu), key=math.prod, default=None)
    head = (shape, _rows_at(gelu, shape)) if shape else None
    la_bw = D.limit(limits, "copy_bw", run_id=D.runs_of(la) if len(la) else [])
    say = {"model": mo["say"], "small": _small(ms), "large": _large(half),
           "memory": _memory(half, bw, mo), "vocab": _vocab(half, methods, bw),
           "odd": _odd_width(half), "methods": _methods_sentence(methods, mo["k_even"]),
           "linear": _linear_sentence(head, la_bw), "linear_all": _linear_all(linear),
           "meaning": _meaning(half, head, mo)}
    return dict(traffic=traffic_table(bw, peak), half=half, methods=methods, linear=linear,
                say=say)


def _shape_axis(ax, shapes: list[str], xlabel: str) -> None:
    ax.set_xticks(range(len(shapes)), shapes, rotation=50, ha="right", fontsize=8)
    ax.set(xlim=(-0.6, len(shapes) - 0.4), xlabel=xlabel)
    ax.grid(True, which="major", alpha=0.3)


def fig_times(c: dict, clip: float = 4.0):
    """Device time per float16 shape and implementation, and over the fastest complete one's."""
    half = c["half"]
    if not len(half):
        return figures.no_data("No timed float16 matmul + softmax rows in these data.")
    pos = {s: i for i, s in enumerate(dict.fromkeys(half["shape"]))}
    best = half[half["impl"].isin(COMPLETE)].groupby("shape")["t_us"].min()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5.6), sharex=True)
    for impl in [i for i in D.IMPL_ORDER + ["cublas"] if i in set(half["impl"])]:
        d = half[half["impl"] == impl]
        style = dict(figures.STYLE.get(impl, {}), ms=4, lw=1)
        x, ratio = d["shape"].map(pos), (d["t_us"] / d["shape"].map(best)).to_numpy()
        top.plot(x, d["t_us"], label=D.IMPL_LABEL.get(impl, impl), **style)
        bottom.plot(x, ratio.clip(max=clip), **style)
        for xi, r in ((xi, r) for xi, r in zip(x, ratio) if r > clip):
            bottom.annotate(f"{r:.1f}×", (xi, clip), textcoords="offset points",
                            xytext=(0, 5), ha="center", fontsize=8, color=style.get("color"))
    top.set(yscale="log", ylabel="device time (µs)")
    top.grid(True, alpha=0.3)
    bottom.axhline(1, color="black", lw=0.8)
    bottom.set(yscale="log", ylim=(None, clip * 1.6), ylabel="÷ fastest complete")
    bottom.set_yticks([0.5, 1, 2, 4], ["0.5", "1", "2", "4"])
    _shape_axis(bottom, list(pos), "B × K × C (float16), by matmul FLOPs")
    figures.legend_below(fig, [top], ncol=3)
    return fig


def fig_methods(c: dict, clip: float = 8.0):
    """Each method's time over the fastest method's per float16 shape; the plan's pick ringed."""
    m = c["methods"]
    if not len(m):
        return figures.no_data("No timed float16 rows of the fused op's methods in these data.")
    pos = {s: i for i, s in enumerate(dict.fromkeys(m["shape"]))}
    fig, ax = plt.subplots(figsize=(7, 3.9))
    for method, (color, marker) in METHOD_STYLE.items():
        d = m[m["variant"] == method]
        ax.scatter(d["shape"].map(pos), d["over_best"].clip(upper=clip), color=color,
                   marker=marker, s=22, label=method if len(d) else None, zorder=3)
    ax.scatter(m[m["plan"]]["shape"].map(pos), m[m["plan"]]["over_best"].clip(upper=clip), s=110,
               facecolors="none", edgecolors="black", lw=1.2, label="the plan's pick", zorder=4)
    ax.set(yscale="log", ylim=(0.9, clip * 1.2), ylabel="time ÷ fastest method")
    ax.set_yticks([1, 1.5, 2, 4, clip], ["1", "1.5", "2", "4", f"≥ {clip:.0f}"])
    _shape_axis(ax, list(pos), "B × K × C (float16), by matmul FLOPs")
    figures.legend_below(fig, [ax], ncol=4)
    return fig


def fig_linear(c: dict):
    """TFLOP/s per linear + activation shape and implementation, and each shape's matmul peak."""
    lin = c["linear"]
    if not len(lin):
        return figures.no_data("No timed linear + activation rows in these data.")
    labels = list(dict.fromkeys(lin["label"]))
    impls = [i for i in LINEAR_IMPLS if i in set(lin["impl"])]
    width = 0.84 / len(impls)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for j, impl in enumerate(impls):
        d = lin[lin["impl"] == impl].groupby("label")["tflops"].max()
        # torch.compile's two settings share a color in the line figures: a lighter one here.
        color = "#9ecae1" if impl == "torch_compile_max" else figures.STYLE[impl]["color"]
        ax.bar([i - 0.42 + (j + 0.5) * width for i, lab in enumerate(labels) if lab in d],
               [d[lab] for lab in labels if lab in d], width=width, color=color,
               label=D.IMPL_LABEL[impl], hatch="//" if impl == "cublas" else None,
               edgecolor="white", lw=0.3)
    peaks = lin.groupby("label")["peak"].first()
    for i, lab in enumerate(labels):
        if peaks[lab] == peaks[lab]:  # legend_below lists the label once
            ax.hlines(peaks[lab], i - 0.45, i + 0.45, color="black", lw=1.2, ls=":",
                      label="measured matmul peak")
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    top = max(lin["tflops"].max(), peaks.max() if peaks.notna().any() else 0)
    ax.set(ylabel="TFLOP/s (device time)", ylim=(0, 1.08 * top))
    ax.grid(True, axis="y", alpha=0.3)
    figures.legend_below(fig, [ax], ncol=3)
    return fig
