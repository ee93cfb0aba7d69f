"""The roofline: a chain of kernels' time at the machine's measured limits (copy bandwidth,
matmul peak), and those limits read from a run's limits.parquet."""
from __future__ import annotations

import pandas as pd

from .traffic import Kernel

# The limits name a matmul precision by its short label; rows name half precisions by their dtype.
PEAK_PRECISION = {"float16": "fp16", "bfloat16": "bf16"}


def limit(limits: pd.DataFrame, metric: str, precision: str = "ieee", run_id=None) -> float:
    """One measured limit (GB/s for copy_bw, TFLOP/s for matmul_peak) of the run `run_id` (the
    run a family's rows came from), else of the latest run; NaN if not measured. Given several
    runs (`runs_of`: the workers of a multi-GPU bench), the highest of theirs: one line a figure
    can draw that none of those runs measured above."""
    if run_id is None:
        run_id = limits["run_id"].max()
    ids = [run_id] if isinstance(run_id, str) else list(run_id)
    hit = limits[(limits["metric"] == metric) & (limits["precision"] == precision)
                 & (limits["run_id"].isin(ids))]["value"].dropna()
    return float(hit.max()) if len(hit) else float("nan")


def peak_of(limits: pd.DataFrame, precision: str, run_id) -> float:
    """The matmul peak (TFLOP/s) a run measured for rows of `precision` (a dtype or a label)."""
    return limit(limits, "matmul_peak", PEAK_PRECISION.get(precision, precision), run_id=run_id)


def model_ms(kernels: list[Kernel], copy_gbps: float, peak_tflops: float) -> float:
    """The roofline model of a chain of kernels: each kernel takes max(bytes / bandwidth,
    FLOPs / peak), and the chain the sum over its launches (ms)."""
    return sum(max(k.total / copy_gbps / 1e6, k.flops / peak_tflops / 1e9 if k.flops else 0.0)
               for k in kernels)
