"""The LM head and its loss (linear + cross-entropy, forward and backward): the matmul chapter's
section, printed only where the results folder has the family's rows."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from ..families import FAMILIES
from ..model import traffic
from ..model.roofline import model_ms, peak_of
from . import data as D

FAMILY = "linear_cross_entropy"
IMPLS = ["torch_eager", "torch_compile", "torch_compile_max", "liger", "triton_fused"]


def _table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per shape (tokens×hidden×vocab) and implementation, two lines: ms per training step's
    head and loss (forward + backward, wall time per call), and peak MiB above the inputs."""
    out = []
    for (n, h, v), g in rows.groupby(["tokens", "hidden", "vocab"], sort=False):
        by = g.set_index("impl")
        for what, column, fmt in (("ms", "ms_median", "{:.2f}"), ("peak MiB", "peak_mib", "{:.0f}")):
            row = {"tokens×hidden×vocab": f"{n}×{h}×{v}" if what == "ms" else "", "": what}
            for impl in [i for i in IMPLS if i in by.index]:
                value = by.loc[impl, column]
                row[D.IMPL_LABEL.get(impl, impl)] = fmt.format(value) if value == value else "—"
            out.append(row)
    return pd.DataFrame(out)


def _sentence(rows: pd.DataFrame) -> str:
    """Ours against the fastest other at the family's headline shape (families.py), where the
    data have it, else at each shape; the table has the rest."""
    parts = []
    head = FAMILIES[FAMILY].headlines[0]
    at = rows[(rows["tokens"] == head["tokens"]) & (rows["hidden"] == head["hidden"])
              & (rows["vocab"] == head["vocab"])]
    several = rows[["tokens", "hidden", "vocab"]].drop_duplicates().shape[0] > 1
    rows = at if len(at) else rows
    for (n, h, v), g in rows.groupby(["tokens", "hidden", "vocab"], sort=False):
        t = g.set_index("impl")
        if "triton_fused" not in t.index:
            continue
        ours = t.loc["triton_fused"]
        others = t.drop(index="triton_fused")
        if not len(others):
            continue
        best = others["ms_median"].idxmin()
        ratio = others.loc[best, "ms_median"] / ours.ms_median
        compile_mem = t.loc["torch_compile", "peak_mib"] if "torch_compile" in t.index else None
        mem = (f", holding {ours.peak_mib:,.0f} MiB against torch.compile's {compile_mem:,.0f}"
               if compile_mem else "")
        parts.append(f"at {n:,} tokens × {h} hidden × {v:,} words ours takes {ours.ms_median:.2f} ms, "
                     f"{D.IMPL_LABEL.get(best, best)} {others.loc[best, 'ms_median']:.2f} ms "
                     f"(ours at a speedup of {ratio:.2f}×){mem}")
    rest = " (@tbl-lm-head has the other shapes)" if len(at) and several else ""
    return ("Forward and backward of the head and its loss, " + "; ".join(parts) + rest + "."
            if parts else "")


def _liger_sentence(rows: pd.DataFrame, limits: pd.DataFrame) -> str:
    """Why Liger-Kernel's op is slow here, from its own chunking rule (traffic.liger_lce_chunks)
    and the traffic model: its chunks against ours, the bytes they move and the time the model
    gives them against its measured time, and its error against ours. "" without its rows."""
    lg = rows[(rows["impl"] == "liger") & rows["ms_median"].notna()]
    if not len(lg):
        return ""
    parts, unexplained = [], []
    for r in lg.itertuples():
        n, h, v = int(r.tokens), int(r.hidden), int(r.vocab)
        chunks = traffic.liger_lce_chunks(n, h, v)
        kernels = traffic.linear_cross_entropy_kernels(n, h, v, {"float32": 4}.get(r.dtype, 2),
                                                       "liger", chunks)
        bw = D.limit(limits, "copy_bw", run_id=r.run_id) if len(limits) else float("nan")
        peak = peak_of(limits, r.dtype, r.run_id) if len(limits) else float("nan")
        ours = rows[(rows["impl"] == "triton_fused") & (rows["tokens"] == n)
                    & (rows["hidden"] == h) & (rows["vocab"] == v)]
        mine = (re.search(r"chunks of (\d+) rows", str(ours["variant"].iloc[0]))
                if len(ours) and "variant" in ours else None)
        text = (f"at {n}×{h}×{v}: {chunks} chunks of {-(-n // chunks):,} rows"
                + (f" against our {-(-n // int(mine.group(1)))}" if mine else ""))
        if bw == bw and peak == peak:
            if model_ms(kernels, bw, peak) < r.ms_median / 2:
                unexplained.append(f"{n}×{h}×{v}")
            text += (f", {traffic.total(kernels) / 1e9:.0f} GB, {model_ms(kernels, bw, peak):.1f} "
                     f"of its {r.ms_median:.1f} ms")
        parts.append(text)
    text = (" Liger-Kernel's op is called as its own benchmark calls it (the mean loss, its "
            "gradients computed in the forward; with a bias, which it takes), and is slow by its "
            "design: it cuts the tokens into chunks whose logits hold no more elements "
            "than its input, and each chunk reads the whole weight twice and reads and writes "
            "the weight's whole gradient, which it accumulates in the weight's precision. "
            + ("In the traffic model, " + "; ".join(parts) if "GB" in parts[0]
               else "; ".join(parts)[:1].upper() + "; ".join(parts)[1:]) + "."
            + (f" At {' and '.join(unexplained)} the model leaves most of its time unexplained."
               if unexplained else ""))
    if "max_rel_err" in rows:
        err = rows.groupby("impl")["max_rel_err"].agg(["min", "max"]).dropna()
        if {"liger", "triton_fused"} <= set(err.index):
            lo, hi = err.loc["liger"], err.loc["triton_fused"]
            text += (f" Its largest error against float64 is "
                     f"{D.range_text(lo['min'], lo['max'], '.3f')}, ours "
                     f"{D.range_text(hi['min'], hi['max'], '.3f')}.")
    return text


def compute(folders: list) -> dict:
    rows = D.load(folders[0], FAMILY)
    rows = rows[(rows["status"] == "ok")] if len(rows) else rows
    pts = front_points(folders[0], rows)
    front = {"front": pts, "say": {"front": front_sentence(pts)}}
    if not len(rows) or "ms_median" not in rows or rows["ms_median"].isna().all():
        # no rows, or CPU rows without timings: no section, but the front where it was measured
        front["say"]["section"] = (f"## The LM head and its loss\n\n{INTRO.strip()}\n" if len(pts)
                                   else "")
        return front
    table = _table(rows)
    section = (
        f"## The LM head and its loss\n\n{INTRO}"
        + _sentence(rows) + _liger_sentence(rows, D.load_limits(folders[0]) if (
            Path(folders[0]) / "limits.parquet").exists() else pd.DataFrame())
        + "\n\n" + D.md_table(table) + "\n\n: The LM head and its loss, "
        "forward and backward: ms per call and peak MiB above the inputs, per implementation. "
        "{#tbl-lm-head}\n")
    return {**front, "say": {**front["say"], "section": section}, "table": table}


INTRO = ("A language model's last layer is a matmul whose output, the logits, has a column per "
         "word of the vocabulary; the loss reads them once and the backward writes their "
         "gradient. Our fused op never holds the (tokens, vocabulary) logits: chunks of rows go "
         "through the matmul, a row kernel turns their logits into the loss and the gradient in "
         "place, and two matmuls take that gradient to dx and dW. ")


# --- the time-memory front (the bench's step after the sweep; analysis/bench/lm_head_front.py) ---

FRONT = "lm_head_front"  # the step's CSV file, in the results folder
# Where the render's cell writes the front's figure (beside report/matmul.qmd, whose section links
# it: Quarto copies the files a page links to into the output), as the data appendix's CSVs.
FIG_DIR = D.ROOT / "report" / "figures"
FIG_NAME = "lm-head-front.svg"
FRONT_IMPLS = ["torch_eager", "torch_compile", "torch_compile_max", "liger", "cce",
               "triton_fused"]
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
# In this figure alone: max-autotune's marker filled (open means: without a bias) and unlike
# torch.compile's.
FRONT_STYLE = {"torch_compile_max": dict(color="#1f77b4", marker="P")}


def _shape(n, h, v) -> str:
    return f"{int(n)}×{int(h)}×{int(v)}"


def _as_bool(s: pd.Series) -> pd.Series:
    return s.astype(str).str.strip().str.lower().isin(("true", "1", "1.0"))


def _default_rows(front: pd.DataFrame, sweep: pd.DataFrame) -> dict:
    """shape -> the rows per chunk our op takes by itself, as the bench recorded it: the front's
    own column (the kernel's choice, asked by the step), else the sweep's variant of ours at the
    same shape ("chunks of N rows")."""
    out = {}
    if "default_chunk_rows" in front:
        for r in front.dropna(subset=["default_chunk_rows"]).itertuples():
            out.setdefault(_shape(r.tokens, r.hidden, r.vocab), int(r.default_chunk_rows))
    if len(sweep) and "variant" in sweep:
        for r in sweep[sweep["impl"] == "triton_fused"].itertuples():
            m = re.search(r"chunks of (\d+) rows", str(r.variant))
            if m:
                out.setdefault(_shape(r.tokens, r.hidden, r.vocab), int(m.group(1)))
    return out


def front_points(folder, sweep: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every point of the front's figure: per shape, bias and implementation (ours per chunking),
    ms (a trial's median per call) and peak MiB above the inputs; `default` marks our chunking of
    choice; max-autotune from the sweep's LM head rows (with a bias) where the step did not run it
    (`from_sweep`). Empty without the step's file, or where it timed nothing."""
    raw = D.load_csv(folder, FRONT)
    if not len(raw) or not {"ms", "peak_mib", "impl", "tokens", "hidden", "vocab", "bias"} <= set(
            raw.columns):
        return pd.DataFrame()
    if "gpu" in raw and raw["gpu"].astype(str).str.startswith("cpu").any():
        return pd.DataFrame()  # the interpreter's times are not findings
    sweep = D.load(folder, FAMILY) if sweep is None else sweep
    sweep = sweep[(sweep["status"] == "ok") & sweep["ms_median"].notna()] if len(sweep) else sweep
    ok = raw[(raw["status"] == "ok") & raw["ms"].notna() & raw["peak_mib"].notna()] \
        if "status" in raw else raw[raw["ms"].notna() & raw["peak_mib"].notna()]
    if not len(ok):
        return pd.DataFrame()
    pts = pd.DataFrame(dict(
        shape=[_shape(*r) for r in ok[["tokens", "hidden", "vocab"]].itertuples(index=False)],
        tokens=ok["tokens"].astype(int), hidden=ok["hidden"].astype(int),
        vocab=ok["vocab"].astype(int), bias=_as_bool(ok["bias"]), impl=ok["impl"],
        rows=pd.to_numeric(ok.get("chunk_rows"), errors="coerce") if "chunk_rows" in ok
        else float("nan"),
        dtype=ok["dtype"] if "dtype" in ok else "bfloat16",  # the step measures bfloat16
        ms=ok["ms"].astype(float), peak=ok["peak_mib"].astype(float), from_sweep=False))
    pts = pts[pts["impl"].isin(FRONT_IMPLS) & ((pts["impl"] != "triton_fused")
                                               | pts["rows"].notna())]
    extra = []
    for (shape, n, h, v), _ in pts.groupby(["shape", "tokens", "hidden", "vocab"], sort=False):
        if ((pts["shape"] == shape) & (pts["impl"] == "torch_compile_max") & pts["bias"]).any():
            continue
        at = sweep[(sweep["impl"] == "torch_compile_max") & (sweep["tokens"] == n)
                   & (sweep["hidden"] == h) & (sweep["vocab"] == v)
                   & sweep["peak_mib"].notna()] if len(sweep) else sweep
        if len(at):
            r = at.sort_values("ms_median").iloc[0]
            extra.append(dict(shape=shape, tokens=n, hidden=h, vocab=v, bias=True,
                              impl="torch_compile_max", rows=float("nan"), dtype=r["dtype"],
                              ms=float(r["ms_median"]), peak=float(r["peak_mib"]),
                              from_sweep=True))
    if extra:
        pts = pd.concat([pts, pd.DataFrame(extra)], ignore_index=True)
    pts["chunks"] = [int(-(-n // r)) if r == r else 0 for n, r in zip(pts["tokens"], pts["rows"])]
    defaults = _default_rows(ok, sweep)
    pts["default"] = [impl == "triton_fused" and defaults.get(s) == r
                      for impl, s, r in zip(pts["impl"], pts["shape"], pts["rows"])]
    return pts.reset_index(drop=True)


def _dominates(p, o) -> bool:
    """p is at least as fast and as small as o, and faster or smaller."""
    return p.ms <= o.ms and p.peak <= o.peak and (p.ms < o.ms or p.peak < o.peak)


def pareto(pts: pd.DataFrame) -> pd.DataFrame:
    """The points no other point dominates, by increasing peak memory (decreasing time)."""
    out, best = [], float("inf")
    for r in pts.sort_values(["peak", "ms"]).itertuples():
        if r.ms < best:
            out.append(r.Index)
            best = r.ms
    return pts.loc[out]


def _label(impl: str) -> str:
    return D.IMPL_LABEL.get(impl, impl)


def _list(names: list[str]) -> str:
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def _bias(b) -> str:
    return "with a bias" if b else "without a bias"


def _chunks(k: int) -> str:
    return f"{k} chunk" + ("s" if k != 1 else "")


def _front_shape(shape: str, g: pd.DataFrame) -> str:
    """One shape's sentences: whether a peer beats any of our chunkings on both counts, which
    peers one of ours beats on both, the least memory, and our default's place."""
    ours, peers = g[g["impl"] == "triton_fused"], g[g["impl"] != "triton_fused"]
    if not len(ours) or not len(peers):
        return ""
    hits, beaten, unbeaten = [], {}, set()
    for b in (True, False):
        o_b, p_b = ours[ours["bias"] == b], peers[peers["bias"] == b]
        for o in o_b.sort_values("chunks").itertuples():
            dom = [p for p in p_b.itertuples() if _dominates(p, o)]
            if dom:
                p = min(dom, key=lambda p: p.ms)
                hits.append(f"{_label(p.impl)} is both faster and smaller than ours at "
                            f"{_chunks(o.chunks)} {_bias(b)} ({p.ms:.2f} against {o.ms:.2f} ms, "
                            f"{p.peak:,.0f} against {o.peak:,.0f} MiB)")
        for p in p_b.itertuples():
            if any(_dominates(o, p) for o in o_b.itertuples()):
                beaten.setdefault(p.impl, True)
            else:
                unbeaten.add(p.impl)
    text = (f"At {shape}, " + ("no other implementation is both faster and smaller than ours at "
                               "any chunking" if not hits else "; ".join(hits)))
    won = [_label(i) for i in FRONT_IMPLS if i in beaten and i not in unbeaten]
    if won:
        text += f", and at some chunking ours is both faster and smaller than {_list(won)}"
    low = g.sort_values(["peak", "ms"]).iloc[0]
    if low["impl"] == "triton_fused":
        text += (f". The least memory is ours, {low['peak']:,.0f} MiB at {low['ms']:.2f} ms "
                 f"({_chunks(low['chunks'])}, {_bias(low['bias'])})")
    else:
        mine = ours[ours["bias"] == low["bias"]].sort_values(["peak", "ms"])
        text += (f". The least memory is {_label(low['impl'])}'s, {low['peak']:,.0f} MiB at "
                 f"{low['ms']:.2f} ms {_bias(low['bias'])}"
                 + (f", against ours at {_chunks(mine.iloc[0]['chunks'])}: "
                    f"{mine.iloc[0]['peak']:,.0f} MiB at {mine.iloc[0]['ms']:.2f} ms"
                    if len(mine) else ""))
    return text + ". " + _default_text(g, ours)


def _default_text(g: pd.DataFrame, ours: pd.DataFrame) -> str:
    """Our default chunking's place on the front, against one chunk and the most chunks measured
    (without a bias where measured, the usual LM head)."""
    for b in (False, True):
        d = ours[ours["default"] & (ours["bias"] == b)]
        if len(d):
            break
    else:
        return ""
    d = d.iloc[0]
    same = g[g["bias"] == b]
    on = not any(_dominates(p, d) for p in same.itertuples())
    mine = ours[ours["bias"] == b].sort_values("chunks")
    one, most = mine.iloc[0], mine.iloc[-1]
    mib = d["rows"] * d["vocab"] * ITEMSIZE.get(str(d["dtype"]), 2) / 2**20
    text = (f"Our default, {_chunks(d['chunks'])} of {int(d['rows'])} rows ({mib:,.0f} MiB of "
            f"logits a chunk), is {'on' if on else 'off'} the front {_bias(b)}: "
            f"{d['ms']:.2f} ms and {d['peak']:,.0f} MiB")
    if one["chunks"] < d["chunks"]:
        text += (f", against {one['ms']:.2f} ms and {one['peak']:,.0f} MiB at "
                 f"{_chunks(one['chunks'])}")
    if most["chunks"] > d["chunks"]:
        text += (f" and {most['ms']:.2f} ms and {most['peak']:,.0f} MiB at "
                 f"{_chunks(most['chunks'])}")
    return text + "."


WHY = ("A chunk of more rows runs the three matmuls nearer their peak, and holds more logits; "
       "with fewer rows each chunk still reads the whole weight and adds into its whole gradient. "
       "Our op takes by itself as few chunks as keep one chunk's logits within a fixed budget "
       "(the ring in @fig-lm-front).")


def front_sentence(pts: pd.DataFrame) -> str:
    """The front's paragraph: per shape, ours against the others on both counts, the least
    memory, our default's place; "" without the front's points."""
    if not len(pts):
        return ""
    parts = [t for shape, g in pts.groupby("shape", sort=False) if (t := _front_shape(shape, g))]
    if not parts:
        return ""
    return ("@fig-lm-front puts each implementation's time against its memory, ours at every "
            "chunking; a point is compared with those of the same bias setting (with a bias, or "
            "without). " + " ".join(parts) + " " + WHY)


FRONT_CAPTION = ("The LM head and its loss in bfloat16, forward and backward, per shape "
                 "(tokens×hidden×vocabulary): ms per call against the peak MiB above the inputs "
                 "(both axes logarithmic). Our op at each chunking (the number of chunks by each "
                 "point), its default ringed; filled markers with a bias, open without (Cut "
                 "Cross-Entropy takes none); max-autotune's point, with a bias, from the sweep "
                 "where the step did not run it. Grey steps: the front, the points no other is "
                 "both faster and smaller than (solid with a bias, dashed without).")


def fig_front(pts: pd.DataFrame):
    """Per shape a panel: peak MiB (x) against ms (y), both logarithmic; every implementation a
    marker (filled: with a bias; open: without), ours at each chunking a line with the chunk
    count by each point, the default ringed, the front of each bias setting a grey step line."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    from . import figures

    if not len(pts):
        return figures.no_data("No timed rows of the LM head's front in these data.")
    shapes = list(dict.fromkeys(pts["shape"]))
    fig, axes = plt.subplots(1, len(shapes), figsize=(7, 3.3), squeeze=False)
    fmt = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}")
    for ax, shape in zip(axes[0], shapes):
        g = pts[pts["shape"] == shape]
        for b, ls in ((True, "-"), (False, "--")):
            f = pareto(g[g["bias"] == b])
            if len(f) > 1:
                ax.plot(f["peak"], f["ms"], drawstyle="steps-post", color="#999999", lw=1.0,
                        ls=ls, zorder=1)
        for impl in [i for i in FRONT_IMPLS if i in set(g["impl"])]:
            style = {**figures.STYLE.get(impl, dict(marker=".")), **FRONT_STYLE.get(impl, {})}
            for b in (True, False):
                d = g[(g["impl"] == impl) & (g["bias"] == b)].sort_values("peak")
                if not len(d):
                    continue
                ax.plot(d["peak"], d["ms"], marker=style["marker"], color=style["color"],
                        mfc=style["color"] if b else "white", mec=style["color"], ms=5,
                        ls="-" if impl == "triton_fused" else "none", lw=1.0, zorder=3,
                        label=_label(impl))
        ours = g[g["impl"] == "triton_fused"]
        label_at = ours[~ours["bias"]] if (~ours["bias"]).any() else ours
        for r in label_at.itertuples():
            ax.annotate(str(r.chunks), (r.peak, r.ms), textcoords="offset points",
                        xytext=(0, -10), ha="center", fontsize=7, color="#d62728")
        d = ours[ours["default"]]
        ax.scatter(d["peak"], d["ms"], s=110, facecolors="none", edgecolors="black", lw=1.1,
                   zorder=4, label="our default")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis, subs in ((ax.xaxis, (1, 2, 5)), (ax.yaxis, (1, 2, 3, 5))):
            axis.set_major_locator(LogLocator(base=10, subs=subs))
            axis.set_major_formatter(fmt)
            axis.set_minor_locator(NullLocator())
        ax.set_title(shape, fontsize=9)
        ax.set_xlabel("peak MiB above the inputs", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="major", alpha=0.25)
        ax.margins(x=0.08, y=0.1)
    axes[0][0].set_ylabel("ms per call", fontsize=8)
    for ax in axes[0][-1:]:  # the bias and the front, once
        ax.plot([], [], marker="o", color="black", ls="none", ms=5, label="with a bias")
        ax.plot([], [], marker="o", color="black", mfc="white", ls="none", ms=5,
                label="without a bias")
        ax.add_line(Line2D([], [], color="#999999", lw=1.0, label="the front"))
    figures.legend_below(fig, axes[0], ncol=4)
    return fig


def front_figure(c: dict, target: Path | None = None) -> str:
    """The front's figure (an SVG file under `target`, FIG_DIR unless given, linked from the
    matmul chapter) and its paragraph, as markdown; "" where the folder has no front. Called by
    the chapter's cell: not part of `compute`, which stays free of side effects."""
    import matplotlib.pyplot as plt

    pts = c.get("front")
    if pts is None or not len(pts):
        return ""
    target = FIG_DIR if target is None else Path(target)
    target.mkdir(parents=True, exist_ok=True)
    fig = fig_front(pts)
    fig.savefig(target / FIG_NAME, format="svg")
    plt.close(fig)
    return (f"![{FRONT_CAPTION}](figures/{FIG_NAME}){{#fig-lm-front width=100%}}\n\n"
            + c["say"]["front"] + "\n")
