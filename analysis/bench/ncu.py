"""Nsight Compute's CSV read into tables: the DRAM counters (`parse_ncu_csv`), the details page
(`ncu_details`), and each profiled kernel attributed to the implementation whose call launched it
(`attribute`, by the marker kernels the profile's worker launches). pandas only."""
from __future__ import annotations

import csv
import io

import pandas as pd

MARKER = "profile_marker"


def parse_ncu_csv(text: str) -> pd.DataFrame:
    """ncu --csv output (other lines, e.g. ==PROF==, skipped) as one row per kernel: id, kernel
    name and one column per metric, in bytes; kernels in the order they were profiled."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV table in the text (no header line starting with \"ID\")")
    table = [row for row in csv.DictReader(io.StringIO("\n".join(lines[start:])))
             if row.get("ID", "").strip().isdigit()]
    kernels: dict[int, dict] = {}
    for row in table:
        k = kernels.setdefault(int(row["ID"]), {"id": int(row["ID"]), "kernel": row["Kernel Name"]})
        unit = row.get("Metric Unit", "byte").strip().lower()
        scale = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9}.get(unit)
        if scale is None:
            raise ValueError(f"unexpected unit {unit!r} for {row['Metric Name']}")
        k[row["Metric Name"]] = float(row["Metric Value"].replace(",", "")) * scale
    return pd.DataFrame(sorted(kernels.values(), key=lambda k: k["id"]))


# ncu's details page (--section ... --page details --csv): the metrics that say what bounds a
# kernel, under the names this module gives them.
DETAIL_METRICS = {
    "Duration": "duration_us",
    "Compute (SM) Throughput": "sm_pct",
    "Issue Slots Busy": "issue_pct",
    "L2 Cache Throughput": "l2_pct",
    "DRAM Throughput": "dram_pct",
    "Registers Per Thread": "registers",
    "Local Memory Spilling Requests": "spill_requests",
    "Achieved Occupancy": "occupancy_pct",
    "Dynamic Shared Memory Per Block": "smem_kb",
    "Waves Per SM": "waves",
    "Warp Cycles Per Issued Instruction": "cycles_per_issue",
    "Theoretical Occupancy": "theoretical_occupancy_pct",
}
_DETAIL_SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
                 "s": 1e6, "second": 1e6, "byte/block": 1e-3, "kbyte/block": 1.0,
                 "mbyte/block": 1e3}


def ncu_details(text: str) -> pd.DataFrame:
    """ncu's details page in CSV (`--page details --csv`, any sections) as one row per profiled
    kernel: id, kernel name and the DETAIL_METRICS it holds (durations in us, shared memory in
    kB; a metric of a section not collected is missing)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV table in the text (no header line starting with \"ID\")")
    kernels: dict[int, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not row.get("ID", "").strip().isdigit():
            continue
        k = kernels.setdefault(int(row["ID"]), {"id": int(row["ID"]), "kernel": row["Kernel Name"]})
        name = DETAIL_METRICS.get(row["Metric Name"])
        if name is None or name in k:
            continue
        try:
            value = float(row["Metric Value"].replace(",", ""))
        except ValueError:  # "n/a", "no data": not measured
            value = float("nan")
        k[name] = value * _DETAIL_SCALE.get((row.get("Metric Unit") or "").strip().lower(), 1.0)
    return pd.DataFrame(sorted(kernels.values(), key=lambda k: k["id"]))


DETAIL_LABELS = {"duration_us": "µs", "sm_pct": "SM %", "issue_pct": "issue %",
                 "l2_pct": "L2 %", "dram_pct": "DRAM %", "registers": "registers",
                 "spill_requests": "spills", "occupancy_pct": "occupancy %", "smem_kb": "smem kB"}


def detail_view(details: pd.DataFrame, labels: list[str]) -> pd.DataFrame:
    """ncu_details' rows for a table: the kernels renamed by `labels` (one per row, in order),
    the metrics under short headings."""
    if len(labels) != len(details):
        raise ValueError(f"{len(labels)} labels for {len(details)} profiled kernels")
    cols = [c for c in DETAIL_LABELS if c in details]
    view = details[cols].rename(columns=DETAIL_LABELS)
    view.insert(0, "kernel", labels)
    return view


def attribute(kernels: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """Each kernel with the implementation whose call launched it: `order` names the impls in
    the order they ran, each after one marker kernel; the markers themselves are dropped."""
    is_marker = kernels["kernel"].str.contains(MARKER)
    if int(is_marker.sum()) != len(order):
        raise ValueError(f"{int(is_marker.sum())} marker kernels for {len(order)} implementations")
    segment = is_marker.cumsum() - 1
    if (segment < 0).any():
        raise ValueError("kernels profiled before the first marker")
    out = kernels[~is_marker].copy()
    out["impl"] = [order[i] for i in segment[~is_marker]]
    return out.reset_index(drop=True)
