"""What Nsight Compute's counters say against the traffic model, from the rows `make profile`
writes (profile.parquet, profile_details.parquet): pandas only, read by the bench's profiler and
the book alike."""
from __future__ import annotations

import pandas as pd


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (family, op, impl): kernels, measured MB read and written, model MB, measured / model."""
    ok = rows[rows["status"] == "ok"]
    g = ok.groupby(["family", "op", "impl"], sort=False)
    out = g.agg(kernels=("kernel", "count"), read=("dram_read", "sum"),
                written=("dram_write", "sum"), model=("bytes_model_impl", "first"),
                fused_model=("bytes_model", "first")).reset_index()
    out["measured"] = out["read"] + out["written"]
    out["measured_over_model"] = out["measured"] / out["model"]
    return out


DETAIL_SUMMARY = ("sm_pct", "issue_pct", "cycles_per_issue", "registers", "occupancy_pct",
                  "theoretical_occupancy_pct", "smem_kb", "waves")


SUMMARY_COLUMNS = ["family", "op", "impl", "kernels", "us", "main_kernel", *DETAIL_SUMMARY]


def details_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (family, op, impl) of profile_details rows: kernels, their total µs, and the longest
    kernel's name and DETAIL_SUMMARY metrics (the one that decides the implementation's time).
    An implementation with a kernel of unknown duration is left out (its total would be short)."""
    out = []
    if "duration_us" in rows and "status" in rows:
        ok = rows[rows["status"] == "ok"]
        for (family, op, impl), g in ok.groupby(["family", "op", "impl"], sort=False):
            if g["duration_us"].isna().any():
                continue
            main = g.loc[g["duration_us"].idxmax()]
            out.append(dict(family=family, op=op, impl=impl, kernels=len(g),
                            us=g["duration_us"].sum(), main_kernel=main["kernel"],
                            **{m: main[m] for m in DETAIL_SUMMARY if m in g}))
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)


# Not an implementation of the whole op: ours unfused, and cuBLAS's matmul alone.
NOT_RIVALS = ("triton_fused", "triton_unfused", "cublas")


def target_counters(rows: pd.DataFrame) -> pd.DataFrame:
    """details_summary's rows for our fused kernel and, per family, the fastest implementation
    of the same op that is not ours (shortest total µs): how the two use the SM, side by side."""
    s = details_summary(rows)
    out = []
    for _, g in s.groupby(["family", "op"], sort=False):
        ours = g[g["impl"] == "triton_fused"]
        others = g[~g["impl"].isin(NOT_RIVALS)]
        if len(ours):
            out.append(ours.iloc[0])
            if len(others):
                out.append(others.loc[others["us"].idxmin()])
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS).reset_index(drop=True)


def fusion_ratios(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (family, op): unfused over fused Triton bytes, in the model and on the counters, and
    the fused kernel's measured bytes over its model."""
    s = summary(rows)
    out = []
    for (family, op), g in s.groupby(["family", "op"], sort=False):
        g = g.set_index("impl")
        if not {"triton_unfused", "triton_fused"} <= set(g.index):
            continue
        un, fu = g.loc["triton_unfused"], g.loc["triton_fused"]
        out.append(dict(family=family, op=op, model_ratio=un["model"] / fu["model"],
                        measured_ratio=un["measured"] / fu["measured"],
                        fused_measured_over_model=fu["measured_over_model"]))
    return pd.DataFrame(out)


def fusion_ratios_by_gpu(profiles: dict) -> pd.DataFrame:
    """fusion_ratios of each GPU's profile rows ({label: rows}) side by side, per op: the model's
    ratio once (every profile runs the same configurations), then per GPU the counters' ratio and
    the fused kernel's counters / model. One profile keeps fusion_ratios' own column names."""
    tables = {label: fusion_ratios(rows).drop(columns="family") for label, rows in profiles.items()}
    if len(tables) == 1:
        return next(iter(tables.values()))
    out = None
    for label, t in tables.items():
        t = t.rename(columns={c: f"{c} ({label})" for c in ("measured_ratio",
                                                            "fused_measured_over_model")})
        if out is None:
            out = t
        else:  # the first profile's model ratio; an op only one GPU profiled keeps its row
            out = out.merge(t.drop(columns="model_ratio"), on="op", how="outer", sort=False)
    return out
