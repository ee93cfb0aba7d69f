"""The first chapter: the answer in one page. Per family at its headline size, what the traffic
model predicts fusion buys, what it bought, where the fused kernel stands against the fastest
other implementation and what memory it saves; the predicted-vs-measured figure; five sentences
on when fusion pays."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..families import COMPARED, FAMILIES
from . import across, cases, data as D, figures, model, verdict

MEMORY_BOUND = 10  # FLOP per byte below which a family's headline is bound by bandwidth
TIE = 0.03  # a few percent is the spread of repeated runs: a tie, not a finding


def compute(folders: list) -> dict:
    folder = folders[0]
    limits = D.load_limits(folder)
    frames = {family: D.load(folder, family) for family in COMPARED}
    table = _headline(frames, limits)
    pvm = cases.predicted_vs_measured(frames, limits)
    # The headline table and the predicted-vs-measured figure show the same families: those
    # with a headline case where both Triton versions were timed.
    table = table[table["measured"].notna()].reset_index(drop=True) if len(table) else table
    pvm = pvm[pvm["family"].isin(table["_family"] if len(table) else [])]
    gpu = D.gpu_label(D.gpu_of(folder))
    every = verdict.every_case(folder)
    say = {"data": _data_line(folder, frames), "banner": banner(folder, every)}
    say.update(verdict.say(every, gpu))
    say.update(_sentences(table, pvm, across.launch(folder), every))
    say["model"] = _model(model.timings(folder))
    say["crossed"] = _crossed(pvm)
    return dict(table=table, pvm=pvm, gpu=gpu, say=say, every=every,
                verdict=verdict.table(every))


def _data_line(folder, frames) -> str:
    rows = pd.concat([df for df in frames.values() if len(df)], ignore_index=True) \
        if any(len(df) for df in frames.values()) else pd.DataFrame()
    if not len(rows) or not rows["ms_median"].notna().any():
        return ""  # the banner says the folder holds no GPU timings
    return (f"Measured on an {D.gpu_label(D.gpu_of(folder))} (PyTorch {rows['torch'].iloc[0]}, "
            f"Triton {rows['triton'].iloc[0]}); @sec-reproducibility says when, and how to "
            "measure your own.")


def _names_of(families) -> str:
    names = [FAMILIES[f].verdict_name or f for f in families]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def banner(folder, every: pd.DataFrame) -> str:
    """The findings' one note on what the folder lacks: families, the steps after the sweep, the
    profile; whether its run stopped part way; whether its cases are too small for claims of
    bandwidth or compute (D.SMALL_MS). Empty where it lacks nothing. The chapters then leave
    out what the data cannot support, with one line each on what that is."""
    gpu = D.gpu_label(D.gpu_of(folder))
    tail = [what for name, what in D.TAIL_FILES.items() if not (folder / name).exists()]
    if not D.gpu_timed(folder):
        return ("::: {.callout-warning}\n## These data time nothing\nThey come from a run on the "
                "CPU (Triton's interpreter), which checks every kernel's correctness and times "
                "none: no finding of this book is available from them, and each chapter says so "
                "in one line. `make bench` on a GPU measures them.\n:::\n")
    stopped = D.stopped_runs(folder)
    asked = {f for fams in stopped.get("families", []) for f in str(fams).split(",")}
    absent = [f for f in FAMILIES if not len(D._rows_of(folder / f"{f}.parquet", f, None))]
    lacks = []
    if [f for f in absent if f in asked]:
        lacks.append(f"the rows of {_names_of([f for f in absent if f in asked])}, which its run "
                     "was to measure")
    if [f for f in absent if f not in asked]:
        lacks.append(f"the rows of {_names_of([f for f in absent if f not in asked])}"
                     + (", not asked of its run" if len(stopped) else ""))
    if tail:
        lacks.append("the steps after the sweep: " + ", ".join(tail))
    if not (folder / D.PROFILE_FILE).exists():
        lacks.append("the Nsight Compute profile (`make profile`)")
    rows = D.family_rows(folder)
    longest = (rows[rows["impl"] == "triton_fused"]["ms_device"].max()
               if len(rows) and "ms_device" in rows else float("nan"))
    small = D.toy(longest) and len(every)
    if not lacks and not len(stopped) and not small:
        return ""
    text = (f"The {gpu} run stopped part way (it never recorded its end, or is still running). "
            if len(stopped) else "")
    if lacks:
        text += f"The {gpu} data lack " + "; ".join(lacks) + ". "
    if small:
        text += (f"Every case is toy-sized: the longest fused kernel takes "
                 f"{1000 * longest:.1f} µs of device time, under the "
                 f"{1000 * D.SMALL_MS:.0f} µs below which a kernel's fixed costs (its launch, the "
                 "clocks' ramp, a partial wave) outweigh its bytes and FLOPs; the book makes no "
                 "claim of bandwidth, of compute or of launches that do not weigh about a case "
                 "that small. ")
    warn = len(stopped) or small or len(absent)
    if warn:
        text += ("The chapters leave out what these data cannot support, and name it in one line "
                 "each.")
    kind = "warning" if warn else "note"
    return f"::: {{.callout-{kind}}}\n## What these data lack\n{text.strip()}\n:::\n"


def _headline(frames: dict, limits: pd.DataFrame) -> pd.DataFrame:
    """One row per family at its headline case."""
    out = []
    for family, df in frames.items():
        case = cases.headline(family, df) if len(df) else None
        if case is None:
            continue
        t = cases.times_of(df, case.where)
        fused = t["triton_fused"]
        others = {k: v for k, v in t.items() if k not in cases.NOT_RIVALS}
        best = min(others, key=others.get) if others else None
        run = D.run_of(cases._select(df, case.where))
        bw = D.limit(limits, "copy_bw", run_id=run)
        peak = (cases.peak_of(limits, case.where.get("precision", case.where["dtype"]), run)
                if any(k.flops for k in case.fused) else np.inf)
        predicted = (cases.model_ms(case.unfused, bw, peak) / cases.model_ms(case.fused, bw, peak)
                     if bw == bw and peak == peak else np.nan)
        peaks = cases._select(df, case.where).groupby("impl")["peak_mib"].min()
        out.append(dict(
            family=FAMILIES[family].findings_label, case=case.label, intensity=case.intensity,
            predicted=predicted,
            measured=t["triton_unfused"] / fused if "triton_unfused" in t else np.nan,
            best=best, vs_best=others[best] / fused if best else np.nan,
            peak_fused=peaks.get("triton_fused", np.nan),
            peak_eager=peaks.get("torch_eager", np.nan),
            _family=family, _fused_ms=fused))
    return pd.DataFrame(out)


def display(table: pd.DataFrame) -> pd.DataFrame:
    """The headline table as the page shows it: seven short columns."""
    if not len(table):
        return table

    def x(v):
        return "—" if pd.isna(v) else f"{v:.2f}×"

    def memory(r):
        if pd.isna(r.peak_fused) or pd.isna(r.peak_eager):
            return "—"
        return f"{D.num(r.peak_eager)} → {D.num(r.peak_fused)}"

    return pd.DataFrame({
        "family": table["family"],
        "headline case": table["case"],
        "model speedup": table["predicted"].map(x),
        "measured": table["measured"].map(x),
        "fastest other": [D.SHORT_LABEL.get(b, b) if isinstance(b, str) else "—"
                          for b in table["best"]],
        "speedup vs it": table["vs_best"].map(x),
        "peak MiB eager → fused": [memory(r) for r in table.itertuples()],
    })


def bullets(c, *groups) -> "D.Markdown":
    """A markdown list, one item per group of sentences (keys of c["say"]), leaving out those the
    data do not support (empty)."""
    items = [" ".join(c.say(k) for k in keys if c["say"][k].strip()) for keys in groups]
    return D.Markdown("".join(f"- {item}\n" for item in items if item.strip()))


def _names(rows: pd.DataFrame) -> str:
    return ", ".join(rows["family"])


def _sentences(table: pd.DataFrame, pvm: pd.DataFrame, launch: dict,
               every: pd.DataFrame) -> dict:
    if not len(table):
        missing = D.lacking("family with its fused and unfused kernels timed at a headline size")
        return {k: missing for k in ("bound", "compute", "quadratic", "small")}
    say = {}
    # What sets a headline's time is a claim about sizes past a launch's (D.SMALL_MS): toy-sized
    # headlines make none (the banner says the folder is toy-sized).
    sized = table[~table["_fused_ms"].map(D.toy)]
    if not len(sized):
        return dict.fromkeys(("bound", "compute", "quadratic"), "") | {"small": _small(launch)}
    table = sized
    bound = table[table["intensity"] < MEMORY_BOUND].dropna(subset=["measured", "predicted"])
    if len(bound):
        ratio = bound["measured"] / bound["predicted"]
        heading = ("**Where the bytes set the time, fusion pays what it removes.**"
                   if ratio.min() >= 0.85 else "**Where the bytes set the time, fusion pays, "
                   "short of what it removes where a kernel's fixed cost still weighs.**")
        say["bound"] = (
            f"{heading} For the memory-bound "
            f"families ({_names(bound)}: under {MEMORY_BOUND} FLOPs per byte) the measured speedup "
            f"over the same computation as separate Triton kernels is "
            f"{D.range_text(bound['measured'].min(), bound['measured'].max(), '.2f')}×, "
            f"{D.range_text(100 * ratio.min(), 100 * ratio.max(), '.0f')}% of what the traffic "
            "model predicts from the bytes alone.")
    else:
        say["bound"] = D.lacking("memory-bound family with both Triton versions timed")
    quadratic = table["_family"].isin(["attention", "softmax_matmul"])
    heavy = table[(table["intensity"] >= MEMORY_BOUND) & ~quadratic]
    heavy = heavy.dropna(subset=["measured"])
    if len(heavy):
        small = (heavy["measured"] - 1).abs().max() <= 0.1
        say["compute"] = (
            ("**Where a matmul sets the time, the epilogue's bytes are a rounding error.** "
             if small else "**Where a matmul sets the time:** ")
            + f"Fusing into a matmul ({_names(heavy)}) buys "
            f"{D.range_text(heavy['measured'].min(), heavy['measured'].max(), '.2f')}× over the "
            "unfused pair" + (": what matters is how close the matmul itself runs to the tensor "
                              "cores' peak (@sec-matmul)." if small else " (@sec-matmul)."))
    else:
        say["compute"] = D.lacking("matmul family with both Triton versions timed")
    quad = table[quadratic].dropna(subset=["measured"])
    if len(quad):
        # Against the unfused version at the headline; against everyone over every case.
        held = {}
        for label, family in zip(quad["family"], quad["_family"]):
            g = every[every["family"] == family] if len(every) else every
            if len(g):
                held[label] = (int(verdict.holds(g["speedup"]).sum()), len(g))
        wins = all(n > total / 2 for n, total in held.values()) if held else True
        say["quadratic"] = (
            ("**The largest wins over unfused come where the intermediate is quadratic.** "
             if wins else "**Where the intermediate is quadratic, fusion removes the most bytes, "
             "but the fastest libraries fuse too.** ")
            + "Attention's scores and softmax(X) @ V's probabilities never reach memory in the "
            "fused kernels: "
            + "; ".join(f"{r.family} {r.measured:.2f}× faster than unfused"
                        + (f", peak memory {D.num(r.peak_eager)} → {D.num(r.peak_fused)} MiB "
                           "against eager" if pd.notna(r.peak_eager) and pd.notna(r.peak_fused)
                           else "")
                        + (f"; over every case it holds against the fastest other in "
                           f"{held[r.family][0]} of {held[r.family][1]}" if r.family in held
                           else "")
                        for r in quad.itertuples()) + ".")
    else:
        say["quadratic"] = D.lacking("attention or softmax(X) @ V rows with both Triton "
                                     "versions timed")
    say["small"] = _small(launch)
    return say


def _small(lc: dict) -> str:
    """Tiny sizes: the host's cost per call (`across.launch`), ours against eager's and an
    empty launch's."""
    host = lc.get("host", pd.DataFrame()).reindex(["add_mul", "softmax", "layer_norm"])
    if "public" not in host or "torch_eager" not in host or not host["public"].notna().any() \
            or not host["torch_eager"].notna().any():
        return D.lacking("host timings of our ops and eager's at the same tiny sizes")
    pub, eager = host["public"].dropna(), host["torch_eager"].dropna()
    empty = pd.Series([lc["floor_1"], lc["floor_10"]]).dropna()
    floor = (f", against {D.range_text(empty.min(), empty.max(), '.0f')} µs for an empty Triton "
             "kernel's launch" if len(empty) else "")
    return (f"**At small sizes the host decides, not the bytes.** Below a few tens of microseconds "
            f"of GPU work a call costs what its host path costs: add-mul, softmax and LayerNorm on "
            f"tiny inputs take {D.range_text(pub.min(), pub.max(), '.0f')} µs a call through our "
            f"Python functions and {D.range_text(eager.min(), eager.max(), '.0f')} µs in eager "
            f"PyTorch{floor} (@sec-across). There fusion pays only inside a CUDA graph or "
            "torch.compile, which take the host out of the loop.")


def _model(t: pd.DataFrame) -> str:
    """GPT-2 small trained with our ops (`model.timings`): captured as one CUDA graph, ours
    against PyTorch's fastest captured step; in eager mode, tokens/s against eager's and the
    step's GPU share (the host's cost of our ops' Python path)."""
    tps = t["tokens_per_s"] if len(t) else pd.Series(dtype=float)
    if not {"torch_eager", "triton_fused"} <= set(tps.index):
        return D.lacking("GPT-2 training timings with our ops and with eager PyTorch")
    ours, eager = t.loc["triton_fused"], t.loc["torch_eager"]
    best = model.best_captured(t)
    if best is not None:
        theirs, mine = best
        r = tps[mine] / tps[theirs]
        text = ("**In a model, once the host is out, our kernels "
                + ("pay.** " if r > 1 + TIE else "lose.** " if r < 1 - TIE else "tie.** ")
                + f"With its whole training step captured as one CUDA graph, GPT-2 small runs "
                  f"at a speedup of {r:.2f}× with {model.captured_name(mine)} over PyTorch's "
                  f"fastest captured step, {model.captured_name(theirs)}'s")
        if "peak_mib" in t:
            text += (f", in {t.loc[mine, 'peak_mib'] / t.loc[theirs, 'peak_mib']:.2f}× its "
                     "peak memory")
        text += (f". Called one by one from Python, our ops take GPT-2 to "
                 f"{tps['triton_fused'] / tps['torch_eager']:.2f}× eager's tokens/s")
    else:
        text = (f"**In a model, the host takes back part of the gain.** GPT-2 small trained with "
                f"our ops swapped in runs at {tps['triton_fused'] / tps['torch_eager']:.2f}× "
                f"eager PyTorch's tokens/s")
        if "peak_mib" in t:
            text += f" in {ours['peak_mib'] / eager['peak_mib']:.2f}× its peak memory"
    text += (f"; its GPU is busy {ours['gpu_ms']:.1f} of each {ours['step_ms']:.1f} ms step "
             f"(eager's {eager['gpu_ms']:.1f} of {eager['step_ms']:.1f}), the rest waiting on our "
             "ops' Python host path")
    if best is None and model._step_range(t, "triton_fused") and model._step_range(t, "torch_eager"):
        text += (f". Those are median steps: ours ranged over "
                 f"{model._step_range(t, 'triton_fused', 'k to ').strip(' ()')} tokens/s, "
                 f"eager's {model._step_range(t, 'torch_eager', 'k to ').strip(' ()')}")
    if best is None and {"torch_compile", "torch_compile_triton_head"} <= set(tps.index):
        text += (f". Under torch.compile, which takes the host out, our fused LM head and loss "
                 f"alone make it {tps['torch_compile_triton_head'] / tps['torch_compile']:.2f}× "
                 "faster")
    return text + " (@sec-model)."


def _crossed(pvm: pd.DataFrame) -> str:
    """The points of @fig-predicted where the model predicts that fusion loses and it wins: what
    they are, and how far each version runs from the speed the model allows it ("" where none)."""
    if not len(pvm):
        return ""
    x = pvm[(pvm["predicted"] < 1 - TIE) & (pvm["measured"] > 1 + TIE)]
    if not len(x):
        return ""
    text = (f"Where the model predicts that fusion loses and it wins (model "
            f"{D.ratio_range(x['predicted'])}, measured {D.ratio_range(x['measured'])}), ")
    fused = 100 * x["model_fused_ms"] / x["fused_ms"]
    unfused = 100 * x["model_unfused_ms"] / x["unfused_ms"]
    reach = (f"it reaches {D.range_text(unfused.min(), unfused.max(), '.0f')}% of the speed the "
             f"model allows, the fused kernel {D.range_text(fused.min(), fused.max(), '.0f')}%.")
    if not ((x["family"] == "matmul_softmax") & (x["method"] == cases.SPLIT_K)).all():
        return text + "the unfused version is the further from its limit: " + reach
    shapes = list(dict.fromkeys(label.split(", ", 1)[-1] for label in x["case"]))
    shapes = shapes[0] if len(shapes) == 1 else ", ".join(shapes[:-1]) + " and " + shapes[-1]
    return (text + f"the fused kernel is {FAMILIES['matmul_softmax'].findings_label} at few rows "
            f"and a long K ({shapes}), split over K: the model charges it the round trip of its "
            "float32 partial logits, but at these sizes neither version nears its limit, and the "
            "unfused pair, whose matmul gives each output tile one program that walks all of K "
            "where the fused kernel shares it among several, is the further from it: " + reach)


def fig_predicted(c: dict):
    pvm = c["pvm"]
    if not len(pvm):
        return figures.no_data("No configuration with both Triton versions timed in these data.")
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for i, (family, g) in enumerate(pvm.groupby("family", sort=False)):
        ax.scatter(g["predicted"], g["measured"], s=18, label=FAMILIES[family].findings_label,
                   color=f"C{i}")
    lo = min(pvm["predicted"].min(), pvm["measured"].min()) * 0.8
    hi = max(pvm["predicted"].max(), pvm["measured"].max()) * 1.25
    ax.plot([lo, hi], [lo, hi], color="black", lw=1, ls=":", label="model = measurement")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted speedup of fused over unfused (traffic model)")
    ax.set_ylabel("measured speedup")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig
