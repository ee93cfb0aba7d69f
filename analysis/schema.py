"""The tidy Parquet schema, and a sink that writes rows as they are measured.

One row per measured configuration. Columns are only ever added (never renamed): the base columns
of DESIGN.md, then the shape columns of each family (families.py), then extras. The bench writes
it, the book and the tools read it: neither's, so here, without torch.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .families import FAMILIES
# The limits name a matmul precision by its short label; rows name half precisions by their dtype.
from .model.roofline import PEAK_PRECISION  # noqa: F401 - where the sweep reads it

S, I, F = pa.string(), pa.int64(), pa.float64()


def device_time(df: pd.DataFrame) -> pd.Series:
    """ms per call of each row: the device time where measured, else the per-call median (what
    the book's verdict and the profile's choice of the fastest other compare)."""
    if "ms_device" not in df:
        return df["ms_median"]
    return df["ms_device"].fillna(df["ms_median"])


BASE = {
    "run_id": S, "started_at": S, "git_commit": S, "gpu": S, "sm_count": I, "torch": S,
    "triton": S, "cuda": S, "family": S, "op": S, "impl": S, "dtype": S, "precision": S,
}
MEASURED = {
    # sweep: which sub-grid the row belongs to ("size": default launch settings, "block": the
    # block-size / config sweep), so a figure never mixes them by accident. variant: which kernel
    # or path of the impl ran, where it has several.
    "sweep": S, "variant": S, "block": I, "num_warps": I, "status": S, "error": S,
    "ms_median": F, "ms_mean": F, "ms_std": F, "ms_min": F, "n_reps": I, "peak_mib": F, "bytes_model": F, "bytes_impl": F, "flops_model": F,
    "gbps": F, "tflops": F, "pct_copy_bw": F, "pct_matmul_peak": F, "max_rel_err": F,
    # Added after the first reference run: median per call under CUDA-graph replay (no launch
    # overhead, no L2 flush; the L2 keeps inputs smaller than it). Not measured since ms_device.
    "ms_graph": F,
    # Median GPU time of one call: CUDA-graph replay with the L2 flushed before each call, timed
    # by events inside the graph (bench.timing.device_ms). No host, no cache-resident inputs.
    "ms_device": F,
    # Trials (added with the evidence issue; empty in older rows, which were one trial): ms_median
    # is the median of n_trials trial medians, each trial with fresh inputs and its own warm-up;
    # ms_trial_min / ms_trial_max the lowest and highest trial median. wall_s: seconds the row
    # took (check, compile, trials), to plan the bench's time.
    "n_trials": I, "ms_trial_min": F, "ms_trial_max": F, "wall_s": F,
}
# Provenance, added after the first reference runs (empty in older rows): a hash of the Python
# sources that ran (bench.machine.source_hash) and the GPU's state at the run's start.
PROVENANCE = {"source_hash": S, "gpu_sm_clock_max_mhz": F, "gpu_power_limit_w": F,
              "gpu_temp_c_at_start": F,
              # Added with the evidence issue: which GPU of the machine ran the row (a bench
              # spreads over every GPU), and the hash of the kernel modules a Triton row ran
              # (sources.kernel_hash; empty for PyTorch's and libraries' rows).
              "gpu_index": I, "kernel_hash": S}
# runs.parquet: one row per run, written when it starts and again when it ends (a run that died
# keeps status "running"): the GPU's state at both ends.
_STATE = {"sm_clock_mhz": F, "sm_clock_max_mhz": F, "mem_clock_mhz": F, "mem_clock_max_mhz": F,
          "power_w": F, "power_limit_w": F, "temp_c": F,
          # machine.cache_state: how warm the compile caches were (added 2026-11-26).
          "inductor_cache_files": I, "triton_cache_kernels": I, "flaggems_cache_files": I}
RUNS = {
    "run_id": S, "started_at": S, "finished_at": S, "status": S, "git_commit": S,
    "git_clean": pa.bool_(), "source_hash": S, "gpu": S, "gpu_index": I, "sm_count": I,
    "driver": S, "torch": S, "triton": S, "cuda": S, "hostname": S, "argv": S, "families": S,
    "rows": I, **{f"{k}_start": t for k, t in _STATE.items()},
    **{f"{k}_end": t for k, t in _STATE.items()},
}
# Shape columns of each family, as Arrow types (families.py names them).
ARROW_TYPE = {"int": I, "str": S, "bool": pa.bool_()}
FAMILY_SHAPES = {name: {col: ARROW_TYPE[t] for col, t in f.shape.items()}
                 for name, f in FAMILIES.items()}
# Shape columns added to a family after rows were committed without them, and the value those
# rows had (families.py).
ADDED_SHAPE_DEFAULTS = {name: f.added_defaults for name, f in FAMILIES.items() if f.added_defaults}

STATUSES = ("ok", "oom", "out_of_resources", "compile_error", "unsupported", "wrong_result")

LIMITS = {
    "run_id": S, "started_at": S, "git_commit": S, "gpu": S, "sm_count": I, "torch": S,
    "triton": S, "cuda": S, "metric": S, "dtype": S, "precision": S, "value": F, "unit": S,
    "detail": S,
}


def family_schema(family: str) -> pa.Schema:
    fields = {**BASE, **FAMILY_SHAPES[family], **MEASURED, **PROVENANCE}
    return pa.schema([(name, typ) for name, typ in fields.items()])


def limits_schema() -> pa.Schema:
    return pa.schema(list({**LIMITS, **PROVENANCE}.items()))


def runs_schema() -> pa.Schema:
    return pa.schema(list(RUNS.items()))


class ParquetSink:
    """Collects rows and rewrites the Parquet file after every row, atomically (tmp + rename), so a
    crash, an OOM or a kill late in a sweep leaves every row measured before it on disk."""

    def __init__(self, path: Path, schema: pa.Schema, keep_existing: bool = False):
        """keep_existing: append to the rows already in the file (the limits of earlier runs
        into the same folder) instead of starting it afresh."""
        self.path, self.schema, self.rows = Path(path), schema, []
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if keep_existing and self.path.exists():
            self.rows = pq.read_table(self.path).to_pylist()

    def append(self, row: dict) -> None:
        unknown = set(row) - set(self.schema.names)
        if unknown:
            raise KeyError(f"columns not in the schema: {sorted(unknown)}")
        self.rows.append(row)
        self.flush()

    def upsert(self, row: dict, key: str = "run_id") -> None:
        """Append the row, or replace the one with the same `key` (a run's record at its end)."""
        self.rows = [r for r in self.rows if r.get(key) != row[key]]
        self.append(row)

    def flush(self) -> None:
        table = pa.Table.from_pylist(self.rows, schema=self.schema)
        tmp = self.path.with_suffix(".parquet.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, self.path)


def with_added_columns(df: pd.DataFrame, family: str) -> pd.DataFrame:
    """df with the shape columns added since it was written (ADDED_SHAPE_DEFAULTS) filled in: the
    value rows from before a column had. Rows that have the column keep their values."""
    for column, value in ADDED_SHAPE_DEFAULTS.get(family, {}).items():
        if column not in df:
            df[column] = value
        else:
            df[column] = df[column].fillna(value)
    return df


def read(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path)
