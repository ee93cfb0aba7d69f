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
    if not len(rows) or "ms_median" not in rows or rows["ms_median"].isna().all():
        return {"say": {"section": ""}}  # no rows, or CPU rows without timings: no section
    table = _table(rows)
    section = (
        "## The LM head and its loss\n\n"
        "A language model's last layer is a matmul whose output, the logits, has a column per "
        "word of the vocabulary; the loss reads them once and the backward writes their "
        "gradient. Our fused op never holds the (tokens, vocabulary) logits: chunks of rows go "
        "through the matmul, a row kernel turns their logits into the loss and the gradient in "
        "place, and two matmuls take that gradient to dx and dW. "
        + _sentence(rows) + _liger_sentence(rows, D.load_limits(folders[0]) if (
            Path(folders[0]) / "limits.parquet").exists() else pd.DataFrame())
        + "\n\n" + D.md_table(table) + "\n\n: The LM head and its loss, "
        "forward and backward: ms per call and peak MiB above the inputs, per implementation. "
        "{#tbl-lm-head}\n")
    return {"say": {"section": section}, "table": table}
