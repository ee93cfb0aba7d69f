"""`python -m triton_fusion_report.analysis.bench.profile --out DIR`: the bytes each implementation moves
through DRAM, read from the GPU's counters by Nsight Compute, against the traffic model.

For each family, one large configuration (CASES) and every implementation the sweep times on it:
one `ncu` process per configuration runs a worker (this module, `--worker`) that calls each
implementation once to compile and warm up, then once more inside the profiled window, with a
tiny marker kernel before each, so that every profiled kernel is attributed to the implementation
whose call launched it. ncu flushes the caches before each kernel it profiles (its default cache
control), so a kernel's bytes are those of a cold call, as in the model. Metrics:
dram__bytes_read.sum and dram__bytes_write.sum, in bytes (--print-units base).

DIR/profile.parquet: one row per profiled kernel (family, op, impl, kernel name, bytes read and
written) with the model's bytes for that implementation and for the fused op; `summary` adds
them up per implementation.

`--details` profiles the cases of the families whose work is a matmul (DETAIL_FAMILIES) once
more, through ncu's details page (DETAIL_SECTIONS: speed of light, compute workload, launch
statistics, occupancy, warp states), into DIR/profile_details.parquet: one row per kernel with
its duration, SM and issue-slot throughput, registers, occupancy and shared memory, what says
why a kernel stops short of the tensor cores' limit.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

# What the counters say against the model, per implementation: read by the book too (pandas only).
from ..model.counters import details_summary, summary

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
# One case under ncu, warm-up included, at most this long (the others took 30-90 s on an H100).
CASE_TIMEOUT_S = 240
MARKER = "profile_marker"
# (family, op, dtype, shape columns): the configuration profiled per family, large enough that
# every kernel's traffic dwarfs what the caches and the launch add.
CASES = [
    ("elementwise", "add_mul", "float32", dict(n=2**26, z_kind="tensor")),
    ("softmax", "softmax", "float32", dict(rows=4096, width=16384)),
    ("softmax", "softmax_bwd", "float32", dict(rows=4096, width=16384)),
    ("layernorm", "layer_norm_fwd", "float16", dict(rows=4096, width=8192)),
    ("layernorm", "layer_norm_bwd", "float16", dict(rows=4096, width=8192)),
    ("softmax_matmul", "softmax_matmul", "float16", dict(d2=8192)),
    ("attention", "attention_fwd", "float16", dict(seq=4096, head_dim=128, causal=False)),
    ("matmul_softmax", "matmul_softmax", "float16", dict(m=16384, k=4096, n=4096)),
    ("linear_act", "linear_gelu", "float16", dict(m=4096, k=4096, n=4096)),
]


def find_problem(case):
    """The sweep's problem of a CASES entry (its full grid)."""
    from .families import PROBLEMS
    from .sweep import dtype_name

    family, op, dtype, shape = case
    hits = [p for p in PROBLEMS[family]("full") if p.op == op and dtype_name(p.dtype) == dtype
            and all(p.shape.get(k) == v for k, v in shape.items())]
    if not hits:
        raise ValueError(f"no problem in the {family} grid matches {op} {dtype} {shape}")
    return hits[0]


def profiled_variants(problem):
    """The implementations at their default settings (the size sweep), one per impl."""
    seen, out = set(), []
    for v in problem.variants:
        if v.sweep == "size" and v.impl not in seen:
            seen.add(v.impl)
            out.append(v)
    return out


# --- parsing ncu's CSV ------------------------------------------------------------------------


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
DETAIL_SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "LaunchStats", "Occupancy",
                   "WarpStateStats")
DETAIL_FAMILIES = ("softmax_matmul", "attention", "matmul_softmax", "linear_act")
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


# --- the worker (runs under ncu) --------------------------------------------------------------


def _marker_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def profile_marker(x_ptr):
        tl.store(x_ptr, tl.load(x_ptr) + 1)
    return profile_marker


def worker(case_index: int, order_file: Path) -> None:
    import torch

    problem = find_problem(CASES[case_index])
    device = torch.device("cuda")
    inputs = problem.make_inputs(device)
    marker, flag = _marker_kernel(), torch.zeros(1, device=device)
    marker[(1,)](flag)
    ready, failed = profiled_variants(problem), {}
    # Two rounds of warm-up (compile, autotune, build what the profiled calls reuse; the second
    # round catches anything that a first call left to the next one).
    for _ in range(2):
        for v in list(ready):
            print(f"profile worker: warming {v.impl}", file=sys.stderr, flush=True)
            try:
                v.fn(*inputs)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - recorded, not profiled
                failed[v.impl] = f"{type(exc).__name__}: {exc}"[:500]
                ready.remove(v)
                torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for v in ready:
        print(f"profile worker: profiling {v.impl}", file=sys.stderr, flush=True)
        marker[(1,)](flag)
        v.fn(*inputs)
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    order_file.write_text(json.dumps(dict(
        order=[v.impl for v in ready], failed=failed,
        variants={v.impl: v.variant for v in ready},
        bytes_impl={v.impl: v.bytes_impl for v in problem.variants if v.sweep == "size"})))


# --- the driver ------------------------------------------------------------------------------


def _ncu_run(case_index: int, ncu: str, raw: Path, ncu_args: list, tag: str):
    """Run the worker of CASES[case_index] under ncu with ncu_args: (what the worker wrote, ncu's
    log text), or (None, why it failed)."""
    order_file, log = raw / f"order_{tag}{case_index}.json", raw / f"ncu_{tag}{case_index}.csv"
    cmd = [ncu, "--csv", "--profile-from-start", "off", *ncu_args, "--log-file", str(log),
           sys.executable, "-m", "triton_fusion_report.analysis.bench.profile", "--worker",
           str(case_index), "--order", str(order_file)]
    # A session of its own, so that a case past CASE_TIMEOUT_S is killed with its worker and the
    # next case still runs (its row then says what the worker was doing).
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        return None, f"ncu ran past {CASE_TIMEOUT_S} s, killed; " + (err or out)[-1400:]
    except BaseException:  # Ctrl-C included: its own session does not get the terminal's
        _kill_group(proc)
        proc.wait()
        raise
    if proc.returncode != 0 or not order_file.exists() or not log.exists():
        return None, (err or out)[-1500:]
    return json.loads(order_file.read_text()), log.read_text()


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # ended meanwhile
        pass


def _case_base(case_index: int, meta: dict) -> dict:
    case = CASES[case_index]
    problem = find_problem(case)
    return dict(meta, family=case[0], op=case[1], dtype=case[2], shape=json.dumps(problem.shape),
                bytes_model=problem.bytes_model)


def profile_case(case_index: int, ncu: str, raw: Path, meta: dict) -> list[dict]:
    base = _case_base(case_index, meta)
    info, text = _ncu_run(case_index, ncu, raw,
                          ["--print-units", "base", "--metrics", ",".join(METRICS)], "")
    if info is None:
        return [dict(base, impl=None, status="failed", error=text)]
    try:
        kernels = attribute(parse_ncu_csv(text), info["order"])
    except ValueError as exc:  # no table, or kernels the markers cannot attribute
        return [dict(base, impl=None, status="failed", error=f"ncu's log: {exc}")]
    rows = [dict(base, impl=r["impl"], variant=info["variants"].get(r["impl"]),
                 kernel=r["kernel"], kernel_index=int(r["id"]), dram_read=r[METRICS[0]],
                 dram_write=r[METRICS[1]], bytes_model_impl=info["bytes_impl"].get(r["impl"]),
                 status="ok")
            for r in kernels.to_dict("records")]
    rows += [dict(base, impl=impl, status="failed", error=why)
             for impl, why in info["failed"].items()]
    return rows


def details_case(case_index: int, ncu: str, raw: Path, meta: dict) -> list[dict]:
    """CASES[case_index] through ncu's details page: one row per kernel, the DETAIL_METRICS."""
    base = _case_base(case_index, meta)
    sections = [a for name in DETAIL_SECTIONS for a in ("--section", name)]
    info, text = _ncu_run(case_index, ncu, raw,
                          ["--print-units", "base", *sections, "--page", "details"], "details_")
    if info is None:
        return [dict(base, impl=None, status="failed", error=text)]
    try:
        return details_rows(base, ncu_details(text), info)
    except ValueError as exc:  # no table, or kernels the markers cannot attribute
        return [dict(base, impl=None, status="failed", error=f"ncu's log: {exc}")]


def details_rows(base: dict, details: pd.DataFrame, info: dict) -> list[dict]:
    """ncu_details' kernels attributed to the implementations the worker ran (info: its order
    file), each a row with `base`; the implementations that failed as rows of their own."""
    kernels = attribute(details, info["order"])
    metrics = [c for c in DETAIL_METRICS.values() if c in kernels]
    rows = [dict(base, impl=r["impl"], variant=info["variants"].get(r["impl"]),
                 kernel=r["kernel"], kernel_index=int(r["id"]), status="ok",
                 **{m: r[m] for m in metrics})
            for r in kernels.to_dict("records")]
    rows += [dict(base, impl=impl, status="failed", error=why)
             for impl, why in info["failed"].items()]
    return rows


def kept_rows(path: Path, cases: list[int]) -> list[dict]:
    """The rows of an existing profile file whose case is not among `cases` (CASES indices): with
    --case the file gathers case by case, so a pass split over several calls loses nothing."""
    if not path.exists():
        return []
    old = pd.read_parquet(path)
    redone = {(CASES[i][0], CASES[i][1], CASES[i][2]) for i in cases}
    keep = [(f, o, d) not in redone for f, o, d in zip(old["family"], old["op"], old["dtype"])]
    return old[keep].to_dict("records")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m triton_fusion_report.analysis.bench.profile",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="results folder: profile.parquet goes there")
    ap.add_argument("--case", type=int, action="append",
                    help="CASES index (default: all); the other cases' rows already in the "
                         "output file are kept")
    ap.add_argument("--raw", type=Path, help="keep ncu's CSV logs here (default: discarded)")
    ap.add_argument("--ncu", default=os.environ.get("NCU", "ncu"))
    ap.add_argument("--details", action="store_true",
                    help="the matmul families' cases through ncu's details page, into "
                         "profile_details.parquet (instead of the DRAM bytes)")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--order", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args.order)
        return 0
    if args.out is None:
        ap.error("--out is required")
    ncu = shutil.which(args.ncu)
    if ncu is None:
        ap.error(f"Nsight Compute ({args.ncu}) is not on the PATH: `make profile` needs it "
                 "(and a GPU whose counters it may read)")
    import torch

    from . import machine

    meta = machine.run_metadata(torch.device("cuda"))
    meta = {k: meta[k] for k in ("run_id", "started_at", "git_commit", "gpu", "torch", "triton")}
    raw = args.raw or Path(tempfile.mkdtemp(prefix="ncu_"))
    raw.mkdir(parents=True, exist_ok=True)
    cases = args.case or [i for i, c in enumerate(CASES)
                          if not args.details or c[0] in DETAIL_FAMILIES]
    run_case, name = ((details_case, "profile_details.parquet") if args.details
                      else (profile_case, "profile.parquet"))
    rows = kept_rows(args.out / name, cases) if args.case else []
    for i in cases:
        rows += run_case(i, ncu, raw, meta)
        print(f"{CASES[i][0]} {CASES[i][1]}: {sum(r['status'] == 'ok' for r in rows)} kernels "
              "so far", flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_parquet(args.out / name, index=False)
    if args.raw is None:
        shutil.rmtree(raw, ignore_errors=True)
    with pd.option_context("display.width", 200):
        table = pd.DataFrame(rows)
        print(details_summary(table).round(1).to_string() if args.details
              else summary(table).round(3).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
