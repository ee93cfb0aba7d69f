"""Chapter "Across families": one roofline for every fused kernel, whom to call instead, the
traffic model against the DRAM counters, what one call costs the host, and two GPUs side by
side. Every results folder of the render (one per GPU) is read; the first is "this GPU"."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..families import COMPARED, FAMILIES, OPS
from ..model import counters as K
from ..model.roofline import PEAK_PRECISION
from . import cases as C
from . import data as D
from . import figures
from . import verdict as V

# --- whom to call: the fused kernel against the fastest other implementation (verdict.py) -------


def gpu_names(folders: list) -> dict:
    """folder -> its GPU's short name (with the folder's name where two share a GPU)."""
    names = {f: D.gpu_label(D.gpu_of(f)) for f in folders}
    return {f: n if list(names.values()).count(n) == 1 else f"{n} ({Path(f).name})"
            for f, n in names.items()}


def whom_say(cases: pd.DataFrame, gpu: str) -> str:
    """Whom to call, per family (verdict.every_case of this GPU): the implementation fastest in
    the most cases (ours where it holds)."""
    if not len(cases):
        return D.lacking("case where the fused kernel and another were both timed")
    parts = []
    for family, g in cases.groupby("label", sort=False):
        winners = g["best"].where(~V.holds(g["speedup"]), "triton_fused").value_counts()
        name = {k: "ours" if k == "triton_fused" else D.IMPL_LABEL.get(k, k) for k in winners.index}
        text = f"{family}: {name[winners.index[0]]} in {winners.iloc[0]} of {len(g)}"
        if len(winners) > 1:
            text += f" (next {name[winners.index[1]]}, {winners.iloc[1]})"
        parts.append(text)
    return ("Counting the cases each implementation is fastest in (ours where it is within "
            f"{V.TIE - 1:.0%} of the fastest other), on the {gpu}: " + "; ".join(parts) + ".")


# --- the roofline -------------------------------------------------------------------------------

def family_frames(folder: Path) -> dict:
    """Each family's rows that the folder holds (an absent family's empty frame lacks the
    columns the shared helpers read, so it is left out)."""
    return {k: df for k in COMPARED if len(df := D.load(folder, k))}


def roofline(folder: Path) -> tuple[pd.DataFrame, dict]:
    """Every fused point with the roof above it (copy bandwidth × intensity, capped by its
    precision's matmul peak) and the ceilings to draw (the highest of the folder's runs)."""
    frames = family_frames(folder)
    limits = D.load_limits(folder)
    pts = C.roofline_points(frames, limits)
    runs = sorted({r for df in frames.values() for r in D.runs_of(df)})
    # The highest limits of the folder's runs: the lines drawn, and what each point is held to
    # (a run's own peak can read lower, and a point then above 100% of it).
    ceilings = {prec: D.limit(limits, "matmul_peak", prec, run_id=runs or None)
                for prec in ("fp16", "bf16", "tf32", "ieee")}
    ceilings["copy"] = D.limit(limits, "copy_bw", run_id=runs or None)
    if len(pts):
        bw = ceilings["copy"] if ceilings["copy"] == ceilings["copy"] else pts["copy_gbps"].max()
        peak = pts["precision"].map(lambda p: ceilings.get(PEAK_PRECISION.get(p, p), np.nan))
        memory = bw * pts["intensity"] / 1000
        roof = np.minimum(memory, peak.fillna(np.inf))
        pts = pts.assign(roof=roof, of_roof=pts["tflops"] / roof,
                         bound=np.where(memory < peak.fillna(np.inf), "memory", "matmul peak"))
    return pts, ceilings


def roofline_say(pts: pd.DataFrame) -> str:
    if not len(pts):
        return D.lacking("timed fused kernels")
    pts = pts[~pts["fused_ms"].map(D.toy)]  # a toy size's distance to a roof is its launch's
    if not len(pts):
        return ""
    best = pts.loc[pts.groupby("family", sort=False)["of_roof"].idxmax()]
    parts = []
    for bound, head, tail in (("memory", "under the bandwidth roof",
                               "of the measured copy bandwidth times their intensity"),
                              ("matmul peak", "under the matmul peak",
                               "of their precision's peak")):
        sel = best[best["bound"] == bound]
        if len(sel):
            parts.append(f"{head}, " + ", ".join(f"{r.family} {D.num(100 * r.of_roof, 2)}%"
                                                 for r in sel.itertuples()) + f" {tail}")
    return "At its best point, each family's fused kernel reaches: " + "; ".join(parts) + "."


def sm_say(folders: list) -> str:
    """Why a compute-bound fused kernel stops short where it is the slower: its longest
    kernel's SM throughput (the busiest unit against its peak) beside the fastest other
    implementation's, on the profiled cases of the first folder that has them (its GPU named
    where that is not the first folder's)."""
    found = [f for f in folders if (Path(f) / "profile_details.parquet").exists()]
    if not found:
        return D.lacking("Nsight Compute details of the matmul families")
    folder = found[0]
    details = pd.read_parquet(Path(folder) / "profile_details.parquet")
    counters = K.target_counters(details)
    # Another folder's profile: its GPU named (when it was profiled: the reproducibility appendix).
    gpu = "" if folder == folders[0] else gpu_names(folders)[folder]
    parts, ahead = [], []
    for family, g in counters.groupby("family", sort=False):
        ours, other = g[g["impl"] == "triton_fused"], g[g["impl"] != "triton_fused"]
        if not len(ours) or not len(other) or pd.isna(ours["sm_pct"].iloc[0]):
            continue
        o, t = ours.iloc[0], other.iloc[0]
        if o["us"] <= t["us"]:
            ahead.append(FAMILIES[family].findings_label or family)
            continue
        parts.append(f"{FAMILIES[family].findings_label or family}, {o['sm_pct']:.0f}% against "
                     f"{t['sm_pct']:.0f}% for {D.IMPL_LABEL.get(t['impl'], t['impl'])} (ours "
                     f"at a speedup of {t['us'] / o['us']:.2f}×)")
    if not parts and not ahead:
        return D.lacking("profiled fused kernel beside another implementation")
    return " ".join(filter(None, [
        (f"On the {gpu}, where" if gpu else "Where") + " a profiled fused kernel is the "
        "slower, Nsight Compute shows how busy the SM's "
        "busiest unit (tensor cores or instruction issue) is in its longest kernel against the "
        "fastest other implementation's: " + "; ".join(parts) + "." if parts else "",
        f"On the profiled case{'s' * (len(ahead) > 1)} of {' and '.join(ahead)}"
        f"{' on the ' + gpu if gpu else ''}, ours is the faster."
        if ahead else ""]))


# --- the traffic model against the DRAM counters ------------------------------------------------

def counter_label(op: str) -> str:
    """An op's name in the counters' table, a forward named so (its backward is profiled too)."""
    o = OPS.get(op)
    if o is None or o.label is None:
        return op
    return f"{o.label} fwd" if o.word == "fwd" else o.label


AGREE = 0.10  # counters within 10% of the model's ratio: the model holds


def counter_table(folders: list) -> pd.DataFrame:
    """Per op: unfused/fused bytes in the model, on each GPU's counters, and each version's
    counted bytes over its model on the first GPU that has a profile."""
    out, first = None, None
    for folder, gpu in gpu_names(folders).items():
        path = Path(folder) / "profile.parquet"
        if not path.exists():
            continue
        rows = pd.read_parquet(path)
        r = K.fusion_ratios(rows)
        if not len(r):
            continue
        r = r.set_index("op")
        if out is None:
            out = pd.DataFrame({"model": r["model_ratio"]})
            s = K.summary(rows)
            s = s[s["impl"] == "triton_unfused"].set_index("op")["measured_over_model"]
            first = pd.DataFrame({"fused/model": r["fused_measured_over_model"],
                                  "unfused/model": s.reindex(r.index)})
        out[gpu] = r["measured_ratio"].reindex(out.index)
    if out is None:
        return pd.DataFrame()
    out = out.join(first)
    out.index = [counter_label(op) for op in out.index]
    return out.rename_axis("op").reset_index()


def counter_say(table: pd.DataFrame) -> str:
    if not len(table):
        return D.lacking("DRAM counter profile (`make profile` measures one with Nsight Compute)")
    gpu = table.columns[2]
    off = (table[gpu] / table["model"] - 1).abs() > AGREE
    why = []
    for op, model, counted, fused, unfused in table[off][["op", "model", gpu, "fused/model",
                                                          "unfused/model"]].itertuples(index=False):
        # The version further from its own model is the one the ratio follows.
        side, over = (("the fused kernel", fused) if abs(fused - 1) > abs(unfused - 1)
                      else ("the unfused version", unfused))
        why.append(f"{op} ({model:.2f} modelled, {counted:.2f} counted: {side} moves "
                   f"{over:.2f}× its model)")
    return (f"On the {gpu} the counters' ratio is within {AGREE:.0%} of the model's for "
            f"{int((~off).sum())} of {len(table)} ops"
            + ("; it is off for " + "; ".join(why) if why else "") + ".")


# --- what one call costs on the host ------------------------------------------------------------

LAUNCH_BARS = {"torch_eager": "PyTorch eager", "torch_compile": "torch.compile",
               "triton_unfused": "Triton unfused", "public": "ours (kernels.*)"}
# The launch-cost step calls each public op (kernels.<public_op>) forward: its first op's label.
LAUNCH_OPS = {FAMILIES[f].public_op: next(iter(FAMILIES[f].ops.values())).label for f in COMPARED}


def launch(folder: Path) -> dict:
    """Host µs per call of each forward op at a tiny size (one case per op), the GPU µs of our
    public function's kernels, and the empty-launch floor."""
    lc = D.load_csv(folder, "launch_cost")
    if not len(lc):
        return {}
    ok = lc[lc["error"].isna() | (lc["error"].astype(str) == "")]  # a failed call: no time
    raw = ok[ok["op"] == "raw launch"].set_index("shape")["host_us"]
    ops = ok[ok["op"].isin(LAUNCH_OPS) & ~ok["shape"].astype(str).str.contains("(", regex=False)]
    host = ops.pivot_table(index="op", columns="impl", values="host_us", sort=False)
    gpu = ops[ops["impl"] == "public"].set_index("op")["gpu_us"]
    spread = (ok["host_us_max"] / ok["host_us_min"]).max() if "host_us_max" in ok else np.nan
    sizes = "; ".join(f"{LAUNCH_OPS[op]} {str(shape).split()[0].replace('x', ' × ')}" for op, shape
                      in ops.drop_duplicates("op")[["op", "shape"]].itertuples(index=False))
    return dict(host=host, gpu_us=gpu, floor_1=raw.get("1 arg", np.nan),
                floor_10=raw.get("10 args", np.nan), spread=spread, sizes=sizes)


def launch_say(lc: dict) -> str:
    if not lc or "public" not in lc["host"]:
        return D.lacking("host cost per call of our public ops")
    host, floor = lc["host"], lc["floor_10"]
    ours = host["public"].dropna()
    span = lambda v, fmt=".0f": D.range_text(v.min(), v.max(), fmt)  # noqa: E731
    parts = [f"Our public ops cost {span(ours)} µs a call"]
    if floor == floor:
        parts = [f"An empty Triton kernel costs {lc['floor_1']:.1f} µs of host time per launch "
                 f"with one argument and {floor:.1f} µs with ten. {parts[0]}, "
                 f"{span(ours / floor, '.1f')}× the ten-argument launch"]
    gpu = lc["gpu_us"].dropna()
    parts[-1] += (f", while their kernels take {span(gpu, '.1f')} µs of GPU time: at these sizes "
                  "the host sets the cost." if len(gpu) else ".")
    if "torch_eager" in host:
        both = [op for op in ours.index if pd.notna(host.loc[op, "torch_eager"])]
        faster = [LAUNCH_OPS[op] for op in both if host.loc[op, "torch_eager"] < ours[op]]
        parts.append(f"PyTorch eager is cheaper per call for {len(faster)} of {len(both)} ops"
                     + (f" ({', '.join(faster)})" if faster else "")
                     + ": its path from the call to the launch is C++, ours runs Python checks "
                       "and planning before Triton's launcher.")
    if "torch_compile" in host:
        parts.append(f"A torch.compile'd function costs {span(host['torch_compile'].dropna())} "
                     "µs a call (Dynamo's guards and Inductor's Python wrapper)"
                     + (", and the unfused Triton versions pay one launch per kernel "
                        f"({span(host['triton_unfused'].dropna())} µs)"
                        if "triton_unfused" in host else "") + ".")
    if lc["spread"] == lc["spread"]:
        parts.append(f"Host times are noisy: a row's slowest trial was up to {lc['spread']:.2f}× "
                     "its fastest, so a few µs between two bars are not a finding.")
    return " ".join(parts)


def fig_launch(c: dict):
    lc = c["launch"]
    if not lc or "public" not in lc["host"]:
        return figures.no_data("No host cost per call of our public ops in these data.")
    host = lc["host"].loc[[op for op in LAUNCH_OPS if op in lc["host"].index]]
    bars = [b for b in LAUNCH_BARS if b in host]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    y = np.arange(len(host))
    h = 0.8 / len(bars)
    offset = lambda impl: (bars.index(impl) - (len(bars) - 1) / 2) * h  # noqa: E731
    for impl in bars:  # ours in the fused kernel's colour
        color = figures.STYLE["triton_fused" if impl == "public" else impl]["color"]
        ax.barh(y + offset(impl), host[impl], height=h, color=color, label=LAUNCH_BARS[impl])
    ax.scatter(lc["gpu_us"].reindex(host.index), y + offset("public"), marker="|", s=60,
               color="black", zorder=3, label="ours: GPU time")
    if lc["floor_10"] == lc["floor_10"]:
        ax.axvline(lc["floor_10"], color="black", ls=":", lw=1, label="empty launch, 10 args")
    ax.set_yticks(y, [LAUNCH_OPS[op] for op in host.index])
    ax.invert_yaxis()
    ax.set_xlabel("µs per call (host, back-to-back calls)")
    ax.grid(True, axis="x", alpha=0.3)
    figures.legend_below(fig, [ax], ncol=3)
    return fig


# --- two GPUs -----------------------------------------------------------------------------------

# Bound by bandwidth at every size (a few FLOPs per byte): where a GPU's bandwidth shows directly.
MEMORY_BOUND = ("elementwise", "softmax", "layernorm")


def gpu_table(folders: list) -> tuple[pd.DataFrame, dict]:
    """Per memory-bound family at its headline size, on each GPU: the fused kernel's device time
    and its speedup over the unfused Triton version; and each GPU's copy bandwidth."""
    rows, bw = [], {}
    for folder, gpu in gpu_names(folders).items():
        own = pd.read_parquet(Path(folder) / "limits.parquet")
        bw[gpu] = D.limit(own, "copy_bw", run_id=list(own["run_id"].unique()) or None)
        for family in MEMORY_BOUND:
            df = D.load(folder, family)
            case = C.headline(family, df) if len(df) else None
            t = C.times_of(df, case.where) if case else {}
            if "triton_fused" in t and "triton_unfused" in t:
                rows.append(dict(family=FAMILIES[family].findings_label, case=case.label, gpu=gpu,
                                 us=1000 * t["triton_fused"],
                                 gain=t["triton_unfused"] / t["triton_fused"]))
    return pd.DataFrame(rows, columns=["family", "case", "gpu", "us", "gain"]), bw


def gpu_display(t: pd.DataFrame) -> pd.DataFrame:
    wide = t.pivot_table(index=["family", "case"], columns="gpu", values=["us", "gain"],
                         sort=False).dropna()
    wide.columns = [f"{'fused µs' if v == 'us' else '× unfused'} {gpu}"
                    for v, gpu in wide.columns]
    return wide.reset_index()


def gpu_say(t: pd.DataFrame, bw: dict) -> str:
    gpus = [g for g in sorted(bw, key=bw.get) if bw[g] == bw[g]]
    if len(gpus) < 2:
        return "This render shows one GPU; rendered with the results of two, it compares them."
    low, high = gpus[0], gpus[-1]
    head = (f"The {high} copies at {D.tbps(bw[high])}, {bw[high] / bw[low]:.2f}× the {low}'s "
            f"{D.tbps(bw[low])}.")
    both = t[t["gpu"].isin([low, high])].pivot_table(index="family", columns="gpu",
                                                     values=["us", "gain"]).dropna()
    if ("us", low) not in both or ("us", high) not in both or not len(both):
        return head  # no family timed on both GPUs: the table below is empty too
    faster = both[("us", low)] / both[("us", high)]
    gain = both[("gain", high)] / both[("gain", low)]
    return (f"{head} The memory-bound fused kernels run "
            f"{D.range_text(faster.min(), faster.max(), '.2f')}× faster on it, and their gain "
            f"over the unfused version there is {D.range_text(gain.min(), gain.max(), '.2f')}× "
            f"what it is on the {low}: "
            + ("both versions are bound by the same bandwidth, so fusion removes the same share "
               "of the time on either GPU, and the time it saves shrinks with the bandwidth."
               if gain.between(0.9, 1.1).all() else
               "the model expects the same gain on both (both versions bound by the same "
               "bandwidth), so where it moves, one version falls short of the bandwidth on one "
               "GPU."))


# --- the chapter --------------------------------------------------------------------------------

def compute(folders: list) -> dict:
    folder = folders[0]
    pts, ceilings = roofline(folder)
    counters = counter_table(folders)
    lc = launch(folder)
    gpus, bw = gpu_table(folders)
    say = {"roofline": roofline_say(pts), "sm": sm_say(folders), "counters": counter_say(counters),
           "launch": launch_say(lc), "gpus": gpu_say(gpus, bw), "accuracy": C.accuracy_say(family_frames(folder)),
           "launch_sizes": f"at a tiny size ({lc['sizes']})" if lc else "at a tiny size",
           "whom": whom_say(V.every_case(folder), D.gpu_label(D.gpu_of(folder)))}
    return dict(points=pts, ceilings=ceilings, counters=counters, launch=lc, say=say,
                gpus=gpu_display(gpus) if gpus["gpu"].nunique() > 1 else pd.DataFrame())


MARKERS = "os^vDPXh*"


def fig_roofline(c: dict):
    pts, ceil = c["points"], c["ceilings"]
    if not len(pts):
        return figures.no_data("No timed fused kernels in these data.")
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (family, g) in enumerate(pts.groupby("family", sort=False)):
        half = g["precision"].isin(("float16", "bfloat16"))
        for sel, fill in ((half, f"C{i}"), (~half, "white")):
            ax.scatter(g[sel]["intensity"], g[sel]["tflops"], s=18, marker=MARKERS[i % 9],
                       facecolors=fill, edgecolors=f"C{i}", lw=0.8,
                       label=family if fill != "white" or not half.any() else None)
    x = np.logspace(np.log10(pts["intensity"].min() / 2), np.log10(pts["intensity"].max() * 2))
    bw = ceil["copy"] if ceil["copy"] == ceil["copy"] else pts["copy_gbps"].max()
    for prec, ls, name in (("fp16", "-", "fp16"), ("tf32", "--", "TF32"), ("ieee", "-.", "fp32")):
        if ceil[prec] == ceil[prec]:
            ax.plot(x, np.minimum(x * bw / 1000, ceil[prec]), color="black", lw=1, ls=ls,
                    label=f"roof: copy bandwidth, {name} matmul peak")
    ax.set(xscale="log", yscale="log")
    ax.set_xlabel("FLOP per byte of the fused op's model")
    ax.set_ylabel("attained TFLOP/s (device time)")
    ax.grid(True, which="major", alpha=0.3)
    figures.legend_below(fig, [ax], ncol=3)
    return fig
