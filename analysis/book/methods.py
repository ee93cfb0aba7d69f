"""Appendix "Methods and glossary": how a number is obtained. The protocol's constants are read
from the benchmark's own source (without importing it: that would import torch), the machine's
limits from the results folders the render shows."""
from __future__ import annotations

import ast
import pandas as pd

from . import data as D
from .reproducibility import LIMIT_COLUMNS, folders_of, limits_by_run, span

UNIT = {"copy_bw": "GB/s", "stream_bw": "GB/s", "spec_bw": "GB/s", "matmul_peak": "TFLOP/s"}


def constants(module: str, *names: str) -> dict:
    """The top-level constants (`NAME = expr`, `A, B = x, y`) of analysis/bench/<module>.py."""
    tree = ast.parse((D.ROOT / "analysis" / "bench" / f"{module}.py").read_text())
    found = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            # Arithmetic of literals only (e.g. 256 * 2**20): nothing is looked up or called.
            value = eval(compile(ast.Expression(node.value), module, "eval"), {"__builtins__": {}})
            if isinstance(target, ast.Name):
                found[target.id] = value
            elif isinstance(target, ast.Tuple):
                found.update({t.id: v for t, v in zip(target.elts, value)
                              if isinstance(t, ast.Name)})
    missing = [n for n in names if n not in found]
    if missing:
        raise KeyError(f"analysis/bench/{module}.py defines no {', '.join(missing)}")
    return {n: found[n] for n in names}


def timing_say(n_trials: dict | None = None) -> dict:
    """The timing protocol's sentences; `n_trials`: rows of the data per trial count (the full
    grid times three trials, the book grid one, the reference grid three where the book reads
    the spread and one elsewhere)."""
    t = constants("timing", "WARMUP_MS", "REP_MS", "MIN_REPS", "SETTLED", "CONFIDENCE",
                  "FLUSH_BYTES", "DEVICE_REPS")
    trials = constants("sweep", "TRIALS", "MAX_AUTOTUNE")
    pinned = constants("peers", "PINNED")["PINNED"]
    flush = f"{t['FLUSH_BYTES'] / 2**20:.0f} MiB"
    counts = dict(n_trials or {})
    most = max(counts or [trials["TRIALS"]])
    several = ("trials on fresh random inputs, the implementations taking turns trial by trial so "
               "that a drift of clocks or temperature falls on all alike; a row keeps the median "
               "of its trial medians, and the lowest and highest trial median (the band around "
               "a line in the figures).")
    if most == 1:
        how = ("Every configuration is timed once (the default grid; the reference grid times "
               f"{trials['TRIALS']} trials where the book reads their spread, the full one "
               "everywhere).")
    elif min(counts or [most]) == 1:
        more = sum(n for k, n in counts.items() if k > 1)
        how = (f"{more} of the {sum(counts.values())} rows, those whose spread the book reads "
               "(each family's headline case, where a few percent is called a tie, and every "
               f"linear + activation shape), are timed in {most} " + several
               + " The others are timed once.")
    else:
        how = f"Every configuration is timed in {most} " + several
    return {
        "timing": (f"Each trial runs {t['WARMUP_MS']} ms of warm-up calls, then timed calls, each "
                   f"after a write of {flush} that flushes the L2 cache and timed with CUDA "
                   f"events, until the {100 * t['CONFIDENCE']:.0f}% interval of the median lies "
                   f"within ±{100 * t['SETTLED']:g}% of it (at least {t['MIN_REPS']} calls, "
                   f"at most {t['REP_MS']} ms of them). " + how),
        "device": (f"The device time replays {t['DEVICE_REPS'][0]} to {t['DEVICE_REPS'][1]} calls "
                   f"captured in a CUDA graph, each after the same {flush} write and between two "
                   "events recorded inside the graph, and keeps the median per call."),
        "compile": f"`{trials['MAX_AUTOTUNE']}`",
        "peers": ", ".join(f"{dist} {version}" for _, dist, version in pinned.values()),
    }


def limits_table(paths: list) -> pd.DataFrame:
    """One line per limit: its unit, how it is measured, and per folder the lowest and highest
    value over the folder's runs."""
    folders = folders_of(paths)
    every = pd.concat([f.limits for f in folders if len(f.limits)]) if any(
        len(f.limits) for f in folders) else pd.DataFrame()
    if not len(every):
        return pd.DataFrame()
    latest = every.sort_values("started_at").groupby(["metric", "precision"]).tail(1)
    order = list(LIMIT_COLUMNS)
    latest = latest.assign(rank=[order.index((m, p)) if (m, p) in order else len(order)
                                 for m, p in zip(latest["metric"], latest["precision"])])
    lines = []
    for r in latest.sort_values("rank").itertuples(index=False):
        name = LIMIT_COLUMNS.get((r.metric, r.precision), f"{r.metric} {r.precision}")
        line = {"limit": name, "unit": UNIT.get(r.metric, r.unit), "how": r.detail}
        for f in folders:
            lo, hi = span(limits_by_run(f.limits), name)
            line[f.label] = ("—" if lo != lo
                             else D.range_text(lo, hi, ",.0f").replace(" to ", "–"))
        lines.append(line)
    return pd.DataFrame(lines)


def compute(folders: list) -> dict:
    first = folders_of(folders[:1])[0]
    rows = first.rows
    say = timing_say(rows["n_trials"].dropna().astype(int).value_counts().to_dict()
                     if len(rows) and "n_trials" in rows else None)
    limits = limits_table(folders)
    by_run = limits_by_run(first.limits)
    copy, fp16 = span(by_run, "copy"), span(by_run, "fp16")
    if copy[0] == copy[0] and fp16[0] == fp16[0]:
        runs = "one run" if len(by_run) == 1 else f"{len(by_run)} runs"
        steadier = ("" if len(by_run) < 2 else
                    ": a matrix product's speed varies more from run to run than a copy's"
                    if fp16[1] / fp16[0] > copy[1] / copy[0] else
                    ": a copy's speed varies more from run to run than a matrix product's")
        say["limits"] = (f"On the {first.label} the copy bandwidth measured "
                         f"{D.range_text(*copy, ',.0f')} GB/s and the fp16 matmul peak "
                         f"{D.range_text(*fp16, '.0f')} TFLOP/s over the folder's "
                         f"{runs}{steadier}.")
    else:
        say["limits"] = D.lacking("measured limits (a run on the CPU measures none)")
    # Where a kernel turns from memory- to compute-bound: the fp16 peak over the copy bandwidth.
    say["ridge"] = (f"On the {first.label} that is {1000 * fp16[1] / copy[1]:.0f} FLOP per byte "
                    "in half precision" if copy[0] == copy[0] and fp16[0] == fp16[0]
                    else "Its value needs the measured limits, which these data lack")
    return dict(limits=limits, say=say)
