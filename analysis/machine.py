"""Who measured: the run's metadata, and the machine's own limits measured at the start of a run."""
from __future__ import annotations

import datetime as dt
import os
import subprocess
import uuid
from pathlib import Path

import torch
import triton

from .timing import bench

ROOT = Path(__file__).resolve().parent.parent


def git_commit() -> str:
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, text=True,
                             capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               text=True, capture_output=True).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_metadata(device: torch.device) -> dict:
    started = dt.datetime.now(dt.timezone.utc)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu, sms = props.name, props.multi_processor_count
    else:
        gpu, sms = "cpu (Triton interpreter)", None
    return dict(
        run_id=started.strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6],
        started_at=started.isoformat(timespec="seconds"),
        git_commit=git_commit(),
        gpu=gpu,
        sm_count=sms,
        torch=torch.__version__,
        triton=triton.__version__,
        cuda=torch.version.cuda or "none",
    )


MATMUL_PRECISIONS = [  # (dtype, precision label, allow_tf32)
    (torch.float16, "fp16", False),
    (torch.bfloat16, "bf16", False),
    (torch.float32, "tf32", True),
    (torch.float32, "ieee", False),
]


def measure_limits(device: torch.device, meta: dict) -> list[dict]:
    """Device-to-device copy bandwidth (bytes read + written) and matmul peak per precision,
    measured with the same timing protocol as the sweeps, on random data."""
    if device.type != "cuda":
        return [dict(meta, metric="copy_bw", dtype="float32", precision="ieee", value=None,
                     unit="GB/s", detail="not measured on the CPU")]
    rows = []
    n = 2**28  # 1 GiB of float32: far larger than the L2
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    t = bench(lambda: dst.copy_(src), device)
    rows.append(dict(meta, metric="copy_bw", dtype="float32", precision="ieee",
                     value=2 * src.nbytes / t["ms_median"] / 1e6, unit="GB/s",
                     detail=f"torch copy_ of {src.nbytes >> 20} MiB, median of {t['n_reps']}"))
    del src, dst
    m = 8192
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        for dtype, precision, tf32 in MATMUL_PRECISIONS:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a = torch.randn(m, m, device=device, dtype=dtype)
            b = torch.randn(m, m, device=device, dtype=dtype)
            t = bench(lambda: a @ b, device)
            rows.append(dict(meta, metric="matmul_peak", dtype=str(dtype).replace("torch.", ""),
                             precision=precision, value=2 * m**3 / t["ms_median"] / 1e9,
                             unit="TFLOP/s", detail=f"torch.matmul {m}x{m}x{m}, random data"))
            del a, b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    torch.cuda.empty_cache()
    return rows
