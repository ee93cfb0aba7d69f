"""Run the kernels natively on a GPU, else through Triton's interpreter on CPU tensors.

TRITON_INTERPRET must be set before triton is first imported, hence here, at collection time.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def _no_tuning_on_disk(monkeypatch):
    """Tuned launch settings stay in memory (the sweep's module sets TRITON_CACHE_AUTOTUNING=1 for
    the process when imported): no test reads a choice another test timed, nor writes the user's
    Triton cache. A test of the disk copy turns it on with its own cache folder."""
    from triton import knobs

    monkeypatch.setattr(knobs.autotuning, "cache", False)


@pytest.fixture(autouse=True)
def _poison_outputs():
    """Every kernel output starts as NaN, so an element a kernel fails to write fails the test."""
    from triton_fusion_report.kernels import poisoned_outputs

    with poisoned_outputs():
        yield


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref| in float64; inf if out has a NaN/inf the reference has not."""
    from triton_fusion_report.analysis.sweep import max_rel_err

    return max_rel_err(out, ref)


# Tolerances on max |out - ref| / max |ref| against a float64 reference.
TOL = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def reference_before_softmax_backward(dst):
    """A copy of the committed reference as it was before the softmax backward was measured:
    softmax.parquet holds the forward rows alone, without the `direction` column (the old file
    format). Tests of the with/without-backward paths build on it, whatever the reference holds."""
    import shutil
    from pathlib import Path

    import pandas as pd

    from triton_fusion_report.analysis import report as R

    dst = Path(dst)
    shutil.copytree(R.REFERENCE, dst)
    df = pd.read_parquet(R.REFERENCE / "softmax.parquet")
    df = df[df["op"] == "softmax"].drop(columns=["direction"], errors="ignore")
    df.to_parquet(dst / "softmax.parquet", index=False)
    return dst
