"""How far two results folders' timings of the same configurations are apart.

    python tools/compare_runs.py A B

E.g. a bench spread over GPUs against another run of it, a rerun against the committed reference.

Per family, the configurations both folders measured (status ok, A's time at or over the floor,
50 µs unless `--floor-us`): B's time over A's at the 5th, 50th and 95th percentile, and the share
of rows within ±3% (`--tolerance`), for the per-call median (`ms_median`) and for the device time
(`ms_device`). A run still in progress is read with its workers' parts (`.parts/*/`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

try:
    import triton_fusion_report  # noqa: F401 - PYTHONPATH=. (as the Makefile sets) or installed
except ImportError:  # run from a checkout without PYTHONPATH: the checkout's package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from triton_fusion_report.analysis import schema  # noqa: E402
from triton_fusion_report.analysis.bench.append import CONFIG_COLUMNS, key_text  # noqa: E402

TIMES = ("ms_median", "ms_device")


def family_rows(folder: Path, family: str) -> pd.DataFrame:
    """A folder's rows of one family, its workers' unmerged parts included (none: empty)."""
    files = [folder / f"{family}.parquet", *sorted(folder.glob(f".parts/*/{family}.parquet"))]
    frames = [pd.read_parquet(f) for f in files if f.exists()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def paired(a: Path, b: Path, family: str) -> pd.DataFrame:
    """One row per configuration measured ok in both folders: its key columns, then each time of
    TIMES from A (suffix _a) and from B (_b). A configuration measured twice in one folder counts
    once, with its last row."""
    keys = CONFIG_COLUMNS + list(schema.FAMILY_SHAPES[family])
    sides = []
    for folder in (a, b):
        rows = family_rows(folder, family)
        if not len(rows):
            return pd.DataFrame(columns=keys + [f"{t}_{s}" for t in TIMES for s in "ab"])
        rows = rows[rows["status"] == "ok"].copy()
        for k in keys:
            rows[k] = rows[k].map(key_text) if k in rows else ""
        sides.append(rows.drop_duplicates(keys, keep="last")[keys + list(TIMES)])
    return sides[0].merge(sides[1], on=keys, suffixes=("_a", "_b"))


def agreement(pairs: pd.DataFrame, time: str, floor_ms: float, tolerance: float) -> dict:
    """B over A in `time` over the pairs whose A time is at least floor_ms: how many, the 5th,
    50th and 95th percentile of the ratio, and the share within 1 ± tolerance."""
    both = pairs.dropna(subset=[f"{time}_a", f"{time}_b"])
    both = both[both[f"{time}_a"] >= floor_ms]
    ratio = both[f"{time}_b"] / both[f"{time}_a"]
    if not len(ratio):
        return dict(n=0, p5=float("nan"), p50=float("nan"), p95=float("nan"), within=float("nan"))
    return dict(n=len(ratio), p5=ratio.quantile(0.05), p50=ratio.median(),
                p95=ratio.quantile(0.95), within=float(((ratio - 1).abs() <= tolerance).mean()))


def compare(a: Path, b: Path, floor_us: float = 50.0, tolerance: float = 0.03) -> pd.DataFrame:
    """One line per family that both folders measured, and "all": for each of TIMES, the pairs
    over the floor, the percentiles of B / A and the share within tolerance."""
    pairs = {fam: paired(Path(a), Path(b), fam) for fam in schema.FAMILY_SHAPES}
    pairs = {fam: p for fam, p in pairs.items() if len(p)}
    if pairs:
        pairs["all"] = pd.concat(pairs.values(), ignore_index=True)
    return pd.DataFrame([{"family": fam, **{f"{time} {k}": v for time in TIMES for k, v in
                                            agreement(p, time, floor_us / 1e3, tolerance).items()}}
                         for fam, p in pairs.items()])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/compare_runs.py",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path, help="the results folder taken as the base")
    ap.add_argument("b", type=Path, help="the results folder compared with it")
    ap.add_argument("--floor-us", type=float, default=50.0,
                    help="rows whose time in A is under this are left out (default 50)")
    ap.add_argument("--tolerance", type=float, default=0.03,
                    help="a ratio within 1 ± this agrees (default 0.03)")
    args = ap.parse_args(argv)
    for folder in (args.a, args.b):
        if not folder.is_dir():
            ap.error(f"{folder} is not a results folder")
    table = compare(args.a, args.b, args.floor_us, args.tolerance)
    if not len(table):
        print(f"no configuration measured ok in both {args.a} and {args.b}", file=sys.stderr)
        return 1
    print(f"B = {args.b} over A = {args.a}; rows with A's time >= {args.floor_us:g} us; "
          f"within = share of rows within ±{100 * args.tolerance:g}%")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
