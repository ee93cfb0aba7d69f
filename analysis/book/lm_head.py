"""The LM head and its loss (linear + cross-entropy, forward and backward): the matmul chapter's
section, printed only where the results folder has the family's rows."""
from __future__ import annotations

import pandas as pd

from ..families import FAMILIES
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
        + _sentence(rows) + "\n\n" + D.md_table(table) + "\n\n: The LM head and its loss, "
        "forward and backward, per implementation: ms per call, and peak MiB above the inputs. "
        "{#tbl-lm-head}\n")
    return {"say": {"section": section}, "table": table}
