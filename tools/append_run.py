"""Add the rows of a run to a results folder.

    python tools/append_run.py RUN INTO

E.g. rows measured alone with `--op` added to the committed reference. Every family file of RUN
is appended to INTO's, both brought to the current schema (shape columns added since a file was
written take the value its rows had: `schema.ADDED_SHAPE_DEFAULTS`), and RUN's limits to INTO's
limits.parquet, so that the new rows find the copy bandwidth of their own run (and its run
records, runs.parquet, to INTO's). Nothing is replaced: a run already in INTO, or a row that
repeats a configuration INTO already holds, is refused (remove old rows deliberately, by hand,
if they are to be replaced). The work is done by `analysis.bench.append`, which the bench's
merge of its workers' parts uses too.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import triton_fusion_report  # noqa: F401 - PYTHONPATH=. (as the Makefile sets) or installed
except ImportError:  # run from a checkout without PYTHONPATH: the checkout's package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from triton_fusion_report.analysis.bench.append import append_run  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/append_run.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="the results folder of the run to add")
    ap.add_argument("into", type=Path, help="the results folder to add it to")
    args = ap.parse_args(argv)
    try:
        added = append_run(args.run, args.into)
    except (ValueError, FileNotFoundError) as exc:
        ap.error(str(exc))
    for name, n in added.items():
        print(f"{name}: {n} rows added to {args.into / name}.parquet")
    return 0


if __name__ == "__main__":
    sys.exit(main())
