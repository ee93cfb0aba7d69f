"""Every kernel launch of the smoke configurations compiles for an H100 (sm_90), here, without a
GPU: the interpreter never compiles, so this is the CPU suite's only check of what the compiler
alone refuses (see tools/compile_check.py)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import FULL

ROOT = Path(__file__).resolve().parent.parent


@FULL  # about a minute on two cores
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the suite compiles every kernel")
def test_every_launch_compiles_for_sm90(tmp_path):
    specs = tmp_path / "specs.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = str(ROOT / "tools" / "compile_check.py")
    recorded = subprocess.run([sys.executable, script, "--record", str(specs)],
                              env={**env, "TRITON_INTERPRET": "1"}, capture_output=True,
                              text=True, timeout=900)
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    env.pop("TRITON_INTERPRET", None)
    compiled = subprocess.run([sys.executable, script, "--compile", str(specs)], env=env,
                              capture_output=True, text=True, timeout=1800)
    assert compiled.returncode == 0, (compiled.stdout + compiled.stderr)[-6000:]
    assert "launches compile for sm_90" in compiled.stdout


def test_gluon_attention_compiles_for_sm90(tmp_path):
    """tools/gluon_attention.py: the Gluon forward (TMA producer warp, two consumer warpgroups
    with their own register budgets, async wgmma) compiles for sm_90 in each schedule at head_dim
    64 and 128, causal or not; tests/test_attention.py runs it on a Hopper GPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "gluon_attention.py")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 12  # three schedules, head_dim 64 and 128, causal or not
    for line in lines:
        counts = dict(part.split()[-2:] for part in line.split(";")[2:])
        assert int(counts["wgmma"]) > 0 and int(counts["setmaxnreg"]) > 0 and int(counts["TMA"]) > 0
