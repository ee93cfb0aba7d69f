"""Who measured: the run's metadata, and the machine's own limits measured at the start of a run."""
from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import subprocess
import uuid
from pathlib import Path

import torch
import triton

from .timing import bench

ROOT = Path(__file__).resolve().parent.parent


COMMIT = re.compile(r"^[0-9a-f]{40}(-dirty)?$")
# The code whose numbers a row holds, hashed: what a commit names, even from a copy without git.
SOURCE_GLOBS = ("kernels/*.py", "analysis/*.py", "triton_fusion_report/*.py")


def git_commit() -> str:
    """The full commit of this checkout, "-dirty" if tracked files differ from it; "unknown"
    where this folder is not the top of a git checkout (an unpacked copy inside another
    repository must not record that repository's commit). GIT_COMMIT overrides (a copy made with
    `git archive`, run elsewhere) and must be a full hash."""
    given = os.environ.get("GIT_COMMIT")
    if given:
        if not COMMIT.match(given):
            raise ValueError(f"GIT_COMMIT must be a full 40-character commit hash (optionally "
                             f"with -dirty), got {given!r}")
        return given

    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, text=True, capture_output=True,
                              check=True).stdout.strip()
    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != ROOT.resolve():
            return "unknown"
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "HEAD") + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def source_hash() -> str:
    """sha256 (first 16 hex digits) of the project's Python sources, path and content."""
    h = hashlib.sha256()
    for path in sorted(p for g in SOURCE_GLOBS for p in ROOT.glob(g)):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def gpu_state(device: torch.device) -> dict:
    """The GPU's clocks, power and temperature now (NVML); None where not readable."""
    state = dict(sm_clock_mhz=None, sm_clock_max_mhz=None, power_w=None, power_limit_w=None,
                 temp_c=None)
    if device.type != "cuda":
        return state
    try:
        import pynvml

        pynvml.nvmlInit()
        index = device.index if device.index is not None else torch.cuda.current_device()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        state.update(
            sm_clock_mhz=pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            sm_clock_max_mhz=pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
            power_w=pynvml.nvmlDeviceGetPowerUsage(h) / 1e3,
            power_limit_w=pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3,
            temp_c=pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))
    except Exception:  # noqa: BLE001 - no NVML (a container, another vendor): columns stay empty
        pass
    return state


def run_metadata(device: torch.device) -> dict:
    started = dt.datetime.now(dt.timezone.utc)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu, sms = props.name, props.multi_processor_count
    else:
        gpu, sms = "cpu (Triton interpreter)", None
    state = gpu_state(device)
    return dict(
        run_id=started.strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6],
        started_at=started.isoformat(timespec="seconds"),
        git_commit=git_commit(),
        gpu=gpu,
        sm_count=sms,
        torch=torch.__version__,
        triton=triton.__version__,
        cuda=torch.version.cuda or "none",
        source_hash=source_hash(),
        # At the run's start (an idle GPU's clock is low; the maximum says what it may reach).
        gpu_sm_clock_max_mhz=state["sm_clock_max_mhz"],
        gpu_power_limit_w=state["power_limit_w"],
        gpu_temp_c_at_start=state["temp_c"],
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
