"""Seed 002's benchmark of softmax(X) @ V, to the letter: batch 16, d1 2048, d3 512, float32,
d2 in SEED_D2, the fused kernel at BLOCK = BLOCK_1 = BLOCK_2 in (16, 32, 64) against PyTorch;
10 warm-up and 100 timed passes with CUDA events, mean and std, peak MiB; every configuration
run, failures recorded and the GPU memory freed before the next; a summary table; a CSV with
exactly the seed's columns per precision (IEEE vs IEEE, TF32 vs TF32; never compared across),
and the same rows in Parquet (family softmax_matmul, sweep "seed002").

`python -m triton_fusion_report.analysis.bench.seed002 --out DIR` (make seed002)."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pandas as pd
import torch

from ...kernels.families import softmax_matmul as smm

from .. import schema
from ..model import traffic
from ..sources import kernel_hash
from . import machine
from .attention import SEED_BLOCKS, SEED_D2, TOLERANCE
from .sweep import classify, max_rel_err, tf32

BATCH, D1, D3 = 16, 2048, 512
WARMUP, PASSES = 10, 100
CSV_COLUMNS = ["batch_size", "d1", "d2", "d3", "triton", "BLOCK", "forward_ms_mean",
               "forward_ms_std", "forward_peak_MiB"]


def time_passes(fn) -> tuple[list[float], float]:
    """10 warm-up passes, then 100 passes each between two CUDA events; peak MiB of one pass
    above what was allocated before it."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(PASSES)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return [s.elapsed_time(e) for s, e in events], peak


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m triton_fusion_report.analysis.bench.seed002")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--d2", type=int, nargs="*", default=SEED_D2)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("the seed's benchmark times CUDA events: it needs a GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    meta = machine.run_metadata(device)
    sink = schema.ParquetSink(args.out / "seed002.parquet", schema.family_schema("softmax_matmul"))
    csv_rows = {"ieee": [], "tf32": []}
    ours = kernel_hash("softmax_matmul")
    for precision in ("ieee", "tf32"):
        for d2 in args.d2:
            configs = [(False, None)] + [(True, b) for b in SEED_BLOCKS]
            for is_triton, block in configs:
                fn = None
                row = dict(meta, family="softmax_matmul", op="softmax_matmul",
                           impl="triton_fused" if is_triton else "torch_eager", dtype="float32",
                           precision=precision, sweep="seed002", variant="seed protocol",
                           block=block, batch=BATCH, d1=D1, d2=d2, d3=D3,
                           bytes_model=traffic.total(traffic.softmax_matmul_kernels(
                               BATCH, D1, d2, D3, 4, "triton_fused")),
                           flops_model=traffic.softmax_matmul_flops(BATCH, D1, d2, D3),
                           kernel_hash=ours if is_triton else None)
                csv = dict(batch_size=BATCH, d1=D1, d2=d2, d3=D3, triton=is_triton, BLOCK=block,
                           forward_ms_mean=None, forward_ms_std=None, forward_peak_MiB=None)
                try:
                    x = torch.randn(BATCH, D1, d2, device=device)
                    v = torch.randn(BATCH, d2, D3, device=device)
                    if is_triton:
                        def fn(x=x, v=v, block=block, precision=precision):
                            return smm.fused_softmax(x, v, BLOCK_1=block, BLOCK_2=block,
                                                     input_precision=precision)
                    else:
                        fn = tf32(lambda x=x, v=v: smm.softmax_mult(x, v), precision == "tf32")
                    err = max_rel_err(fn(), smm.softmax_mult(x.double(), v.double()))
                    if not err <= TOLERANCE[precision]:
                        raise AssertionError(f"max_rel_err {err:.3g} > {TOLERANCE[precision]}")
                    times, peak = time_passes(fn)
                    mean, std = statistics.fmean(times), statistics.stdev(times)
                    csv.update(forward_ms_mean=mean, forward_ms_std=std, forward_peak_MiB=peak)
                    row.update(status="ok", max_rel_err=err, ms_mean=mean, ms_std=std,
                               ms_median=statistics.median(times), ms_min=min(times),
                               n_reps=len(times), peak_mib=peak,
                               gbps=row["bytes_model"] / statistics.median(times) / 1e6,
                               tflops=row["flops_model"] / statistics.median(times) / 1e9)
                except Exception as exc:  # noqa: BLE001 - OOM, OutOfResources, compile errors
                    status = "wrong_result" if isinstance(exc, AssertionError) else classify(exc)
                    row.update(status=status, error=str(exc).splitlines()[0][:2000])
                finally:
                    x = v = fn = None
                    torch.cuda.empty_cache()
                sink.append(row)
                csv_rows[precision].append(csv)
                label = f"triton BLOCK={block}" if is_triton else "pytorch"
                shown = (f"{csv['forward_ms_mean']:.3f} ± {csv['forward_ms_std']:.3f} ms, "
                         f"{csv['forward_peak_MiB']:.0f} MiB") if row["status"] == "ok" \
                    else row["status"]
                print(f"{precision:4} d2={d2:5} {label:17} {shown}", flush=True)
    for precision, rows in csv_rows.items():
        df = pd.DataFrame(rows, columns=CSV_COLUMNS)
        df["BLOCK"] = df["BLOCK"].astype("Int64")
        df.to_csv(args.out / f"seed002_{precision}.csv", index=False)
        print(f"\n[{precision}] forward_ms_mean (ms)")
        config = df["BLOCK"].map(lambda b: "pytorch" if pd.isna(b) else f"BLOCK {b}")
        print(df.assign(config=config).pivot_table(index="d2", columns="config",
                                                   values="forward_ms_mean").round(3).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
