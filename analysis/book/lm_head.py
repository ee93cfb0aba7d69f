"""The LM head and its loss (linear + cross-entropy, forward and backward): the matmul chapter's
section, printed only where the results folder has the family's rows."""
from __future__ import annotations

import pandas as pd

from . import data as D

FAMILY = "linear_cross_entropy"
IMPLS = ["torch_eager", "torch_compile", "torch_compile_max", "liger", "triton_fused"]


def _table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per shape (tokens × hidden × vocabulary) and implementation: ms per training step's head
    and loss (forward + backward, wall time per call), and peak MiB above the inputs."""
    out = []
    for (n, h, v), g in rows.groupby(["tokens", "hidden", "vocab"], sort=False):
        by = g.set_index("impl")
        row = {"tokens × hidden × vocabulary": f"{n:,} × {h:,} × {v:,}"}
        for impl in [i for i in IMPLS if i in by.index]:
            r = by.loc[impl]
            row[D.IMPL_LABEL.get(impl, impl)] = f"{r.ms_median:.2f} ms, {r.peak_mib:,.0f} MiB"
        out.append(row)
    return pd.DataFrame(out)


def _sentence(rows: pd.DataFrame) -> str:
    parts = []
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
        parts.append(f"at {n:,} × {h:,} × {v:,} ours takes {ours.ms_median:.2f} ms, "
                     f"{D.IMPL_LABEL.get(best, best)} {others.loc[best, 'ms_median']:.2f} ms "
                     f"(ours at a speedup of {ratio:.2f}×){mem}")
    return ("Forward and backward of the head and its loss, " + "; ".join(parts) + "."
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
        "forward and backward: ms per call and peak MiB above the inputs, per implementation. "
        "{#tbl-lm-head}\n")
    return {"say": {"section": section}, "table": table}
