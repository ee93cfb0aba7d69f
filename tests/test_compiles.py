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
