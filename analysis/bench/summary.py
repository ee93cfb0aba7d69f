"""The one-line-per-implementation table printed at the end of a sweep."""
from __future__ import annotations

import numpy as np
import pandas as pd



def config_keys(df: pd.DataFrame) -> list[str]:
    """The columns that identify a problem (family, op, dtype, shape), not the implementation."""
    from ..schema import FAMILY_SHAPES

    shapes = [c for fam in df["family"].unique() for c in FAMILY_SHAPES[fam]]
    return ["family", "op", "dtype", "precision", *dict.fromkeys(shapes)]


def speedups(df: pd.DataFrame, baseline: str = "torch_eager") -> pd.DataFrame:
    """Per size-sweep config: each impl's time and its speedup over the baseline."""
    ok = df[(df["status"] == "ok") & (df["sweep"] == "size")]
    keys = config_keys(df)
    base = ok[ok["impl"] == baseline][keys + ["ms_median"]].rename(columns={"ms_median": "base_ms"})
    merged = ok.merge(base, on=keys, how="inner")
    merged["speedup"] = merged["base_ms"] / merged["ms_median"]
    return merged


def table(df: pd.DataFrame) -> str:
    rows = []
    sp = speedups(df)
    for impl, g in df.groupby("impl", sort=False):
        ok = g[g["status"] == "ok"]
        s = sp[sp["impl"] == impl]["speedup"]
        rows.append(dict(
            impl=impl, configs=len(g), ok=len(ok), failed=len(g) - len(ok),
            geomean_vs_eager=float(np.exp(np.log(s).mean())) if len(s) else np.nan,
            best_gbps=ok["gbps"].max() if len(ok) else np.nan,
            best_pct_copy=ok["pct_copy_bw"].max() if len(ok) else np.nan,
        ))
    fam = ", ".join(df["family"].unique())
    return f"[{fam}]\n" + pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}")
