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


# Run in a process of its own: under the interpreter (this suite's on a CPU) Gluon's language
# functions are the interpreter's, which the compiler refuses.
_GLUON_COMPILE = """
import json, sys
from triton_fusion_report.kernels.families.attention import gluon
rows = []
for name in sys.argv[1:]:
    overlap, pingpong = gluon.VARIANTS[name]
    for d in (64, 128):
        for causal in (False, True):
            k = gluon.compile_sm90(d, causal, overlap=overlap, pingpong=pingpong)
            ptx = k.asm["ptx"]
            rows.append(dict(schedule=name, head_dim=d, causal=causal, shared=k.metadata.shared,
                             wgmma=ptx.count("wgmma.mma_async"),
                             setmaxnreg=ptx.count("setmaxnreg"),
                             tma=ptx.count("cp.async.bulk.tensor")))
print(json.dumps(rows))
"""


@pytest.mark.parametrize("schedule", [
    "ping-pong", *(pytest.param(s, marks=FULL) for s in ("in order", "overlapped"))])
def test_gluon_attention_compiles_for_sm90(tmp_path, schedule):
    """kernels/families/attention/gluon.py: the Gluon forward (TMA producer warp, two consumer
    warpgroups with their own register budgets, async wgmma) compiles for sm_90 in `schedule`
    (the plan's, ping-pong, in the fast tier) at head_dim 64 and 128, causal or not, within an
    sm_90 block's shared memory; tests/test_attention.py runs it on a Hopper GPU."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", _GLUON_COMPILE, schedule], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(rows) == 4  # head_dim 64 and 128, causal or not
    for row in rows:
        assert row["wgmma"] > 0 and row["setmaxnreg"] > 0 and row["tma"] > 0, row
        assert row["shared"] <= 232448, row  # an sm_90 block's most
