"""Who measured: the run's metadata, and the machine's own limits measured at the start of a run."""
from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import subprocess
import uuid
from pathlib import Path

import torch
import triton

from .. import schema
from .timing import bench

ROOT = Path(__file__).resolve().parents[2]  # the checkout (installed: the package folder)


# The code whose numbers a row holds, hashed: what a commit names, even from a copy without git.
# (The bench and the models; not analysis/book/, which reads rows and writes none.)
SOURCE_GLOBS = ("kernels/*.py", "analysis/*.py", "analysis/bench/*.py", "analysis/model/*.py",
                "triton_fusion_report/*.py")
LIMIT_REP_MS = 100  # timed repetitions of each limit (one trial)
# HBM bandwidth on the vendor's datasheet (GB/s), by the name torch reports: a ceiling no
# measurement reaches, shown beside the measured ones.
SPEC_BW = {"NVIDIA H100 80GB HBM3": 3350.0, "NVIDIA H200": 4800.0, "NVIDIA H100 PCIe": 2000.0,
           "NVIDIA A100-SXM4-80GB": 2039.0, "NVIDIA A100-SXM4-40GB": 1555.0}


def git(*args) -> str:
    """git's output in the project's folder; raises CalledProcessError where git fails."""
    return subprocess.run(["git", *args], cwd=ROOT, text=True, capture_output=True,
                          check=True).stdout.strip()


def own_checkout() -> bool:
    """True where the project's folder is the top of a git checkout: an unpacked copy inside
    another repository must not read that repository's history."""
    try:
        return Path(git("rev-parse", "--show-toplevel")).resolve() == ROOT.resolve()
    except (OSError, subprocess.CalledProcessError):
        return False


def git_commit() -> str:
    """The full commit of this checkout, "-dirty" if tracked files differ from it; "unknown"
    outside the project's own checkout. Never typed by hand: a run on another machine runs in
    a clone of the commit (a git bundle travels, not a label)."""
    if not own_checkout():
        return "unknown"
    try:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "HEAD") + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def source_hash() -> str:
    """sha256 (first 16 hex digits) of the project's Python sources, path and content."""
    return _hash(sorted(p for g in SOURCE_GLOBS for p in ROOT.glob(g)))


def _hash(paths) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def gpu_state(device: torch.device) -> dict:
    """The GPU's driver, clocks, power and temperature now (NVML); None where not readable."""
    state = dict(driver=None, sm_clock_mhz=None, sm_clock_max_mhz=None, mem_clock_mhz=None,
                 mem_clock_max_mhz=None, power_w=None, power_limit_w=None, temp_c=None)
    if device.type != "cuda":
        return state
    try:
        import pynvml

        pynvml.nvmlInit()
        index = device.index if device.index is not None else torch.cuda.current_device()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        driver = pynvml.nvmlSystemGetDriverVersion()
        state.update(
            driver=driver.decode() if isinstance(driver, bytes) else driver,
            sm_clock_mhz=pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            sm_clock_max_mhz=pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
            mem_clock_mhz=pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            mem_clock_max_mhz=pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
            power_w=pynvml.nvmlDeviceGetPowerUsage(h) / 1e3,
            power_limit_w=pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3,
            temp_c=pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))
    except Exception:  # noqa: BLE001 - no NVML (a container, another vendor): columns stay empty
        pass
    return state


def cache_state() -> dict:
    """How warm the compile caches are now: files in Inductor's cache (FX graphs, autotuning
    results), kernels in Triton's, files in FlagGems'. A bench that starts with them full skips
    the compiles and searches they hold (None where a cache's folder cannot be found)."""
    def files(path):
        return sum(len(f) for _, _, f in os.walk(path)) if path and os.path.isdir(path) else None

    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        inductor = cache_dir()
    except Exception:  # noqa: BLE001 - another torch layout: leave the column empty
        inductor = None
    triton_dir = getattr(getattr(triton, "knobs", None), "cache", None)
    triton_dir = getattr(triton_dir, "dir", None) or os.environ.get(
        "TRITON_CACHE_DIR", os.path.expanduser("~/.triton/cache"))
    flaggems = os.environ.get("FLAGGEMS_CACHE_DIR", os.path.expanduser("~/.flaggems"))
    return dict(inductor_cache_files=files(inductor),
                triton_cache_kernels=len(os.listdir(triton_dir)) if os.path.isdir(triton_dir) else None,
                flaggems_cache_files=files(flaggems))


def run_metadata(device: torch.device) -> dict:
    started = dt.datetime.now(dt.timezone.utc)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu, sms = props.name, props.multi_processor_count
        index = device.index if device.index is not None else torch.cuda.current_device()
    else:
        gpu, sms, index = "cpu (Triton interpreter)", None, None
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
        gpu_index=index,
        # At the run's start (an idle GPU's clock is low; the maximum says what it may reach).
        gpu_sm_clock_max_mhz=state["sm_clock_max_mhz"],
        gpu_power_limit_w=state["power_limit_w"],
        gpu_temp_c_at_start=state["temp_c"],
    )


def run_record(meta: dict, device: torch.device, when: str, argv=None, **extra) -> dict:
    """A row of runs.parquet: the run's metadata and the GPU's state `when` ("start" or "end"),
    the commit split into hash and cleanliness."""
    commit = meta["git_commit"]
    state = gpu_state(device) | cache_state()
    row = {k: meta[k] for k in schema.RUNS if k in meta}
    row.update(git_clean=None if commit == "unknown" else not commit.endswith("-dirty"),
               driver=state.pop("driver"), hostname=platform.node(),
               argv=" ".join(argv) if argv is not None else None, **extra)
    row.update({f"{k}_{when}": v for k, v in state.items()})
    return row


MATMUL_PRECISIONS = [  # (dtype, precision label, allow_tf32)
    (torch.float16, "fp16", False),
    (torch.bfloat16, "bf16", False),
    (torch.float32, "tf32", True),
    (torch.float32, "ieee", False),
]


def measure_limits(device: torch.device, meta: dict) -> list[dict]:
    """Device-to-device copy bandwidth (bytes read + written), a read-heavy stream's bandwidth
    and the matmul peak per precision, measured with the sweeps' timing protocol on random data;
    and the datasheet's bandwidth where the GPU is known."""
    if device.type != "cuda":
        return [dict(meta, metric="copy_bw", dtype="float32", precision="ieee", value=None,
                     unit="GB/s", detail="not measured on the CPU")]
    rows = []
    n = 2**28  # 1 GiB of float32: far larger than the L2
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    t = bench(lambda: dst.copy_(src), device, rep_ms=LIMIT_REP_MS)
    rows.append(dict(meta, metric="copy_bw", dtype="float32", precision="ieee",
                     value=2 * src.nbytes / t["ms_median"] / 1e6, unit="GB/s",
                     detail=f"torch copy_ of {src.nbytes >> 20} MiB, median of {t['n_reps']}"))
    del src, dst
    # Three reads and one write, the add-mul pattern: a read-heavy stream reaches more than the
    # copy (DRAM turns around less often), so it is the ceiling of kernels that mostly read.
    # 4 GiB in all: past the sizes where bandwidth still climbs (1 GiB reads 1-2% slower).
    a, b, c = (torch.randn(n, device=device) for _ in range(3))
    out = torch.empty_like(a)
    t = bench(lambda: torch.addcmul(a, b, c, out=out), device, rep_ms=LIMIT_REP_MS)
    rows.append(dict(meta, metric="stream_bw", dtype="float32", precision="ieee",
                     value=4 * a.nbytes / t["ms_median"] / 1e6, unit="GB/s",
                     detail=f"torch.addcmul: 3 reads and 1 write of {a.nbytes >> 20} MiB, "
                            f"median of {t['n_reps']}"))
    del a, b, c, out
    if meta["gpu"] in SPEC_BW:
        rows.append(dict(meta, metric="spec_bw", dtype="float32", precision="ieee",
                         value=SPEC_BW[meta["gpu"]], unit="GB/s",
                         detail="HBM bandwidth on the vendor's datasheet (not measured)"))
    m = 8192
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        for dtype, precision, tf32 in MATMUL_PRECISIONS:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a = torch.randn(m, m, device=device, dtype=dtype)
            b = torch.randn(m, m, device=device, dtype=dtype)
            t = bench(lambda: a @ b, device, rep_ms=LIMIT_REP_MS)
            rows.append(dict(meta, metric="matmul_peak", dtype=str(dtype).replace("torch.", ""),
                             precision=precision, value=2 * m**3 / t["ms_median"] / 1e9,
                             unit="TFLOP/s", detail=f"torch.matmul {m}x{m}x{m}, random data"))
            del a, b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    torch.cuda.empty_cache()
    return rows
