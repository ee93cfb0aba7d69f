"""The report's figures. Each function takes tidy rows and returns a matplotlib Figure."""
from __future__ import annotations

import functools
import inspect

import matplotlib.pyplot as plt
import pandas as pd

from .data import IMPL_LABEL, IMPL_ORDER

STYLE = {
    "torch_eager": dict(color="#555555", marker="o", ls="-"),
    "torch_compile": dict(color="#1f77b4", marker="s", ls="-"),
    "triton_unfused": dict(color="#ff7f0e", marker="v", ls="--"),
    "triton_fused": dict(color="#d62728", marker="^", ls="-"),
    "sdpa_flash": dict(color="#2ca02c", marker="D", ls="-"),
    "sdpa_cudnn": dict(color="#9467bd", marker="P", ls="-"),
    "sdpa_efficient": dict(color="#8c564b", marker="x", ls="-"),
    "cublas": dict(color="#17becf", marker="*", ls=":"),
    "torch_compile_max": dict(color="#1f77b4", marker="s", ls=":", mfc="white"),
    "cublaslt": dict(color="#0b7285", marker="X", ls="-"),  # darker than cuBLAS: bars side by side
    "liger": dict(color="#bcbd22", marker="h", ls="-"),
    "flag_gems": dict(color="#e377c2", marker="p", ls="-"),
    "cce": dict(color="#9467bd", marker="D", ls="-"),  # Apple's Cut Cross-Entropy
}


def spread(d: pd.DataFrame, y: str):
    """(low, high) of `y` over the trials (the lowest and highest trial median), for a time
    (ms_median) or a rate computed from it; None where the rows have no trials or y is neither."""
    if "ms_trial_min" not in d or not d["ms_trial_min"].notna().any():
        return None
    if y == "ms_median":
        return d["ms_trial_min"], d["ms_trial_max"]
    if y in ("gbps", "tflops", "pct_copy_bw", "pct_matmul_peak"):
        return d[y] * d["ms_median"] / d["ms_trial_max"], d[y] * d["ms_median"] / d["ms_trial_min"]
    return None


def _plot_with_spread(ax, d, x, y, scale=1.0, **kw):
    """A line of `y` against `x`, with the trials' spread as a band of the line's color."""
    (line,) = ax.plot(d[x], d[y] / scale, **kw)
    band = spread(d, y)
    if band is not None:
        ax.fill_between(d[x], band[0] / scale, band[1] / scale, color=line.get_color(),
                        alpha=0.2, lw=0)
    return line


NO_DATA = ("No timed rows for this figure in this results folder\n"
           "(a run on the CPU, or configurations that failed): see the chapter's data line.")


def no_data(text: str = NO_DATA) -> plt.Figure:
    """A figure that says what is missing, where a figure of the data would be empty."""
    fig, ax = plt.subplots(figsize=(7, 1.6))
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=10, wrap=True)
    ax.set_axis_off()
    return fig


def _or_no_data(plot):
    """Draw the figure, or `no_data(no_data_text)` where the rows hold no finite value of y."""
    signature = inspect.signature(plot)

    @functools.wraps(plot)
    def draw(df, *args, no_data_text: str = NO_DATA, **kwargs):
        y = signature.bind(df, *args, **kwargs)
        y.apply_defaults()
        y = y.arguments["y"]
        if df is None or len(df) == 0 or y not in df or not df[y].notna().any():
            return no_data(no_data_text)
        return plot(df[df[y].notna()], *args, **kwargs)
    return draw


def _impls(df):
    present = set(df["impl"])
    return [i for i in IMPL_ORDER if i in present] + sorted(present - set(IMPL_ORDER))


def _log2_axis(ax):
    ax.set_xscale("log", base=2)


def legend_below(fig, axes, ncol: int = 4) -> None:
    """One legend under the panels, every label once (inside a panel it hides the data)."""
    entries = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    rows = -(-len(entries) // ncol)
    bottom = (0.25 + 0.2 * rows) / fig.get_figheight()
    fig.legend(list(entries.values()), list(entries), loc="lower center", ncol=ncol,
               fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, bottom, 1, 1))


@_or_no_data
def lines_by_impl(df: pd.DataFrame, x: str, y: str, panels: str, *, xlabel: str, ylabel: str,
                  logy: bool = True, hline: float | None = None, hline_label: str | None = None,
                  panel_title=lambda v: str(v), hlines: dict | None = None,
                  height: float = 3.6) -> plt.Figure:
    """One panel per value of `panels`, one line per implementation, the trials' spread as a band
    around each line where the rows have it; `hline` (or several, `hlines`: label -> value) a
    ceiling, dotted. The figure is the text's width whatever the number of panels."""
    ceilings = dict(hlines or {})
    if hline is not None:
        ceilings[hline_label] = hline
    values = list(dict.fromkeys(df[panels]))
    fig, axes = plt.subplots(1, len(values), figsize=(7, height), squeeze=False, sharey=True)
    for ax, value in zip(axes[0], values):
        sub = df[df[panels] == value]
        for impl in _impls(sub):
            d = sub[sub["impl"] == impl].sort_values(x)
            _plot_with_spread(ax, d, x, y, label=IMPL_LABEL.get(impl, impl), ms=3,
                              **STYLE.get(impl, dict(marker=".")))
        for k, (label, level) in enumerate(ceilings.items()):
            if level == level:  # NaN: a ceiling this run did not measure
                ax.axhline(level, color="black", lw=1, ls=[":", "--", "-."][k % 3], label=label)
        _log2_axis(ax)
        if logy:
            ax.set_yscale("log")
        ax.set_title(panel_title(value), fontsize=9)
        ax.set_xlabel(xlabel)
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    legend_below(fig, axes[0])
    return fig


