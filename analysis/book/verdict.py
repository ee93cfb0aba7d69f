"""The book's verdict over every case: for each family, every configuration the results folder
holds with the fused kernel and another implementation timed, the fused kernel's speedup against
the fastest other one and against torch.compile. The findings chapter opens with it.

One ratio convention in the whole book: speedup = the other's time / ours (above 1: ours is
faster). A case "holds" where the speedup is at least 1 / TIE (ours the fastest or within 5%)."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..families import FAMILIES, OPS, VERDICT
from . import cases as C
from . import data as D
from . import figures

TIE = 1.05  # within 5% of the fastest holds its place: a few percent is trial spread
COMPILE = ("torch_compile", "torch_compile_max")
# A case whose fused call takes less than this is decided by fixed costs (a launch, a host path),
# not by the bytes or FLOPs fusion saves.
SMALL_MS = 0.02
# The dimensions a kernel walks in tiles or vectors (rows' widths, reduction lengths, sequences):
# one that is not a multiple of 16 elements leaves a masked tile or unaligned rows.
TILED_DIMS = {"n", "k", "width", "d2", "d3", "seq", "seq_k", "head_dim", "hidden", "vocab"}
# Regimes, in the order a case is put in the first that applies.
REGIMES = ("fwd+bwd through autograd", f"small (< {SMALL_MS * 1000:.0f} µs)", "float32",
           "odd sizes", "large 16-bit")


def case_label(row: pd.Series, family: str) -> str:
    """A case as a reader names it: the op where the family has several, the dtype (TF32 where
    a float32 product used it), the shape's sizes joined by ×, grouped heads and KV-cache keys
    where they differ from the queries', causal."""
    dims, words = [], []
    for col in FAMILIES[family].shape:
        v = row.get(col)
        if v is None or pd.isna(v) or col == "direction":
            continue
        if col in ("kv_heads", "seq_k"):  # said only where they differ from the queries'
            same = row["heads"] if col == "kv_heads" else row["seq"]
            if v != same:
                words.append(f"{int(v)} {'KV heads' if col == 'kv_heads' else 'keys'}")
        elif isinstance(v, (bool, np.bool_)):
            words += ["causal"] if v else []
        elif isinstance(v, str):
            words.append(f"z {v}" if col == "z_kind" else v)
        else:
            dims.append(str(int(v)))
    prec = row.get("precision")
    dtype = prec if prec == "tf32" else D.SHORT_DTYPE.get(row["dtype"], row["dtype"])
    word = OPS[row["op"]].word if row["op"] in OPS else ""
    return " ".join(filter(None, [word, dtype, "×".join(dims),
                                  ", ".join(words)]))



def _regime(family: str, row: pd.Series, fused_ms: float) -> str:
    if family == "training":
        return REGIMES[0]
    if fused_ms < SMALL_MS:
        return REGIMES[1]
    if row["dtype"] == "float32":
        return REGIMES[2]
    sizes = [row[c] for c in FAMILIES[family].shape if c in TILED_DIMS]
    if any(pd.notna(v) and int(v) % 16 for v in sizes):
        return REGIMES[3]
    return REGIMES[4]


def every_case(folder) -> pd.DataFrame:
    """One row per case (family, op, dtype, precision, shape) of the folder's size sweeps: the
    fused kernel's time, the fastest other implementation and the speedup against it, the
    speedup against torch.compile (the faster mode), and the case's regime. Device time where
    measured, else the per-call median (the training rows: forward + backward through autograd)."""
    rows = []
    for family in VERDICT:
        path = Path(folder) / f"{family}.parquet"
        if not path.exists():
            continue
        df = D._rows_of(path, family, None)
        df = df[(df["status"] == "ok") & (df["sweep"] == "size")]
        if not len(df) or D.on_cpu(df):
            continue
        df = df.assign(_t=C.device_time(df)).dropna(subset=["_t"])
        keys = ["op", "dtype", "precision"] + list(FAMILIES[family].shape)
        for _, case in df.groupby(keys, dropna=False, sort=False):
            fused = case[case["impl"] == "triton_fused"]["_t"]
            others = case[~case["impl"].isin(C.NOT_RIVALS)]
            if not len(fused) or not len(others):
                continue
            ours = fused.min()
            best = others.loc[others["_t"].idxmin()]
            compiled = case[case["impl"].isin(COMPILE)]["_t"]
            eager = case[case["impl"] == "torch_eager"]["_t"]
            rows.append(dict(
                family=family, label=FAMILIES[family].verdict_name, op=best["op"],
                case=case_label(best, family), fused_ms=ours, best=best["impl"],
                speedup=best["_t"] / ours,
                vs_compile=compiled.min() / ours if len(compiled) else np.nan,
                vs_eager=eager.min() / ours if len(eager) else np.nan,
                regime=_regime(family, best, ours)))
    return pd.DataFrame(rows, columns=["family", "label", "op", "case", "fused_ms", "best",
                                       "speedup", "vs_compile", "vs_eager", "regime"])


def holds(speedup: pd.Series) -> pd.Series:
    return speedup >= 1 / TIE


def table(cases: pd.DataFrame) -> pd.DataFrame:
    """Per family: its cases, those where ours holds (fastest or within 5%), the median and the
    range of the speedup against the fastest other, against torch.compile, and who is fastest
    where ours does not hold."""
    out = []
    for family, g in cases.groupby("family", sort=False):
        lost = g[~holds(g["speedup"])]
        who = lost["best"].value_counts()
        comp = g["vs_compile"].dropna()
        out.append({
            "family": g["label"].iloc[0],
            "holds": f"{int(holds(g['speedup']).sum())} of {len(g)}",
            "median speedup": f"{g['speedup'].median():.2f}×",
            "range": D.range_text(g["speedup"].min(), g["speedup"].max(), ".2f") + "×",
            "vs compile": f"{comp.median():.2f}×" if len(comp) else "—",
            # The two most often faster (the rest are in the sentence below the table).
            "faster where ours is not": ", ".join(
                f"{D.SHORT_LABEL.get(k, k)} {n}" for k, n in who.head(2).items()) or "—",
        })
    return pd.DataFrame(out)


def _share(n: int, total: int) -> str:
    return f"{n} of {total} ({100 * n / total:.0f}%)"


def say(cases: pd.DataFrame, gpu: str) -> dict:
    """The verdict's sentences, each computed from the cases."""
    if not len(cases):
        missing = D.lacking("case with the fused kernel and another implementation timed on a GPU")
        return {"verdict": missing, "loses": missing, "compiler": missing, "training": missing}
    ok = holds(cases["speedup"])
    by_family = cases.assign(_ok=ok).groupby("label", sort=False)["_ok"].mean()
    most = [f for f, s in by_family.items() if s > 0.5]
    few = [f for f, s in by_family.items() if s <= 0.5]
    text = (f"**Over every case, a hand-written fused kernel is not the default winner.** Of the "
            f"{len(cases)} cases the {gpu} data hold ({cases['family'].nunique()} families, every "
            f"size, dtype and op of their sweeps), the fused kernel is the fastest or within "
            f"{TIE - 1:.0%} of it in {_share(int(ok.sum()), len(cases))}; its median speedup "
            f"against the fastest other implementation is {cases['speedup'].median():.2f}× "
            f"({D.range_text(cases['speedup'].min(), cases['speedup'].max(), '.2f')}×).")
    if most:
        text += f" It holds in most cases for {', '.join(most)}"
        text += f"; in half or fewer for {', '.join(few)}." if few else "."
        text = text.replace("..", ".")  # a name that ends in one ("linear + act.")
    elif few:
        text += f" It holds in half or fewer of the cases of every family ({', '.join(few)})."
    lost = cases[~ok]
    if len(lost):
        who = [f"{D.IMPL_LABEL.get(k, k)} in {n}" for k, n in lost["best"].value_counts().items()]
        where = [f"{r} {n}" for r, n in lost["regime"].value_counts().reindex(REGIMES).dropna()
                 .astype(int).items() if n]
        loses = (f"Where it does not hold ({len(lost)} cases) the fastest is "
                 + ", ".join(who) + "; by regime: " + ", ".join(where) + ".")
    else:
        loses = f"It holds in every case on the {gpu}."
    comp = cases.dropna(subset=["vs_compile"])
    if len(comp):
        close = comp["vs_compile"] < TIE
        per = comp.assign(_c=close).groupby("label", sort=False)["_c"].mean()
        compiler = (f"**torch.compile is the baseline to beat.** It is within {TIE - 1:.0%} of the "
                    f"fused kernel or ahead in {_share(int(close.sum()), len(comp))} of the cases "
                    "it was measured on (" + ", ".join(f"{f} {100 * s:.0f}%"
                                                        for f, s in per.items()) + ").")
    else:
        compiler = D.lacking("torch.compile rows beside the fused kernel")
    train = cases[cases["family"] == "training"].dropna(subset=["vs_eager"])
    if len(train):
        behind = train[train["vs_eager"] < 1 / TIE]
        training = (f"**Training through autograd is where ours loses most.** Forward + backward "
                    f"per call at training shapes, the fused ops run at "
                    f"{D.range_text(train['vs_eager'].min(), train['vs_eager'].max(), '.2f')}× "
                    f"eager PyTorch's speed ({len(behind)} of {len(train)} cases behind): at these "
                    "shapes a call's host time exceeds its GPU time, and a backward written in "
                    "Python costs the host more than eager's C++ autograd (@sec-across). A "
                    "captured CUDA graph or torch.compile takes the host out of the step.")
    else:
        training = D.lacking("training rows (forward + backward through autograd)")
    return {"verdict": text, "loses": loses, "compiler": compiler, "training": training}


REGIME_COLORS = dict(zip(REGIMES, ("C3", "C1", "C0", "C4", "C2")))


def figure(cases: pd.DataFrame):
    """Every case's speedup against the fastest other implementation and against torch.compile,
    one row of points per family, 1.0 marked, the points coloured by regime."""
    if not len(cases):
        return figures.no_data("No case with the fused kernel and another one timed on a GPU.")
    labels = list(dict.fromkeys(cases["label"]))
    fig, axes = plt.subplots(1, 2, figsize=(7, 0.24 * len(labels) + 1.4), sharey=True)
    rng = np.random.default_rng(0)
    for ax, col, title in ((axes[0], "speedup", "against the fastest other"),
                           (axes[1], "vs_compile", "against torch.compile")):
        for regime in REGIMES:
            g = cases[(cases["regime"] == regime) & cases[col].notna()]
            if not len(g):
                continue
            y = g["label"].map({k: i for i, k in enumerate(labels)}) + rng.uniform(-0.25, 0.25,
                                                                                   len(g))
            ax.scatter(g[col], y, s=12, alpha=0.75, color=REGIME_COLORS[regime],
                       label=regime if ax is axes[0] else None, linewidths=0)
        ax.axvline(1.0, color="black", lw=1)
        ax.axvspan(1 / TIE, TIE, color="grey", alpha=0.15, lw=0)
        ax.set_xscale("log")
        lo, hi = cases[col].min(), cases[col].max()
        ticks = [t for t in (0.25, 0.5, 1, 2, 4, 8, 16, 32) if lo / 2 <= t <= hi * 2]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks], fontsize=7)
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("speedup of ours (its time / ours)", fontsize=8)
        ax.grid(True, axis="x", which="both", alpha=0.3)
    axes[0].set_yticks(range(len(labels)), labels, fontsize=8)
    axes[0].invert_yaxis()
    fig.legend(loc="lower center", ncol=3, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    return fig
