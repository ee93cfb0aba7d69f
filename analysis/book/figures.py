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


@_or_no_data
def block_sweep(df: pd.DataFrame, x: str = "block", y: str = "gbps", size_col: str = "n",
                hline: float | None = None, size_label=str) -> plt.Figure:
    """Achieved bandwidth against block size, one panel per problem size, one line per impl and
    variant (e.g. z tensor / scalar)."""
    sizes = sorted(df[size_col].unique())
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.4 * len(sizes), 3.6), squeeze=False,
                             sharey=True)
    for ax, size in zip(axes[0], sizes):
        sub = df[df[size_col] == size]
        for (impl, z), d in sub.groupby(["impl", "z_kind"], sort=False):
            d = d.sort_values(x)
            style = dict(STYLE.get(impl, {}))
            if z == "scalar":
                style.update(ls=":", mfc="white")
            ax.plot(d[x], d[y] / 1000, label=f"{IMPL_LABEL.get(impl, impl)}, z {z}", ms=4, **style)
        if hline is not None:
            ax.axhline(hline / 1000, color="black", lw=1, ls=":", label="copy bandwidth")
        _log2_axis(ax)
        ax.set_title(size_label(size))
        ax.set_xlabel("block (elements per program)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("TB/s of model bytes")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


@_or_no_data
def sweep_lines(df: pd.DataFrame, x: str, y: str, panels: str, lines: str, *, xlabel: str,
                ylabel: str, hline: float | None = None, panel_title=str,
                logx: bool = True) -> plt.Figure:
    """A parameter sweep: one panel per value of `panels`, one line per value of `lines`."""
    values = sorted(df[panels].unique())
    colors = {name: f"C{i}" for i, name in enumerate(sorted(df[lines].unique()))}
    fig, axes = plt.subplots(1, len(values), figsize=(4.4 * len(values), 3.5), squeeze=False,
                             sharey=True)
    for ax, value in zip(axes[0], values):
        sub = df[df[panels] == value]
        for name, d in sub.groupby(lines, sort=True):
            d = d.sort_values(x)
            ax.plot(d[x], d[y], marker="o", ms=4, color=colors[name], label=f"{lines} {name}")
        if hline is not None:
            ax.axhline(hline, color="black", lw=1, ls=":", label="copy bandwidth")
        if logx:
            _log2_axis(ax)
        ax.set_title(panel_title(value))
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0][0].set_ylabel(ylabel)
    fig.tight_layout()
    return fig


def attention_tflops(rows: pd.DataFrame, peak: float, y: str = "tflops") -> plt.Figure:
    """TFLOP/s against the sequence length: a row of panels per head_dim, non-causal and causal
    side by side, one line per implementation, the matmul peak dotted."""
    rows = rows[rows[y].notna()] if len(rows) else rows
    if len(rows) == 0:
        return no_data()
    dims = sorted(rows["head_dim"].unique())
    fig, axes = plt.subplots(len(dims), 2, figsize=(10.5, 3.5 * len(dims)), sharex=True,
                             squeeze=False)
    for i, hd in enumerate(dims):
        for j, causal in enumerate([False, True]):
            ax = axes[i][j]
            sub = rows[(rows["head_dim"] == hd) & (rows["causal"] == causal)]
            for impl in _impls(sub):
                g = sub[sub["impl"] == impl].sort_values("seq")
                _plot_with_spread(ax, g, "seq", y, ms=3, label=IMPL_LABEL.get(impl, impl),
                                  **STYLE.get(impl, {}))
            ax.axhline(peak, color="black", lw=1, ls=":", label="fp16 matmul peak")
            _log2_axis(ax)
            ax.set_title(f"head_dim {hd}, {'causal' if causal else 'non-causal'}")
            ax.grid(True, alpha=0.3)
        axes[i][0].set_ylabel("TFLOP/s")
    for ax in axes[-1]:
        ax.set_xlabel("sequence length")
    # One legend under the panels (inside one it hid the lines it names), every label once.
    labelled = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            labelled.setdefault(label, handle)
    bottom = 0.6 / fig.get_figheight()  # inches kept for the legend's rows
    fig.legend(labelled.values(), labelled.keys(), loc="lower center", ncol=5, fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig
