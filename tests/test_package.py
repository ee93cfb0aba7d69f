"""What `pip install .` puts into site-packages: one top-level name of its own, and the same
imports as in a checkout."""
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import FULL

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "triton_fusion_report"


@FULL
def test_wheel_has_one_top_level_name(tmp_path):
    """The wheel holds triton_fusion_report (with kernels and analysis inside, analysis with its
    bench, model and book) and nothing else at the top: no `kernels` to clash with the PyPI
    package, no generic `analysis`, no maintainers' tools/. Installed,
    `from triton_fusion_report import kernels` gives the ops."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("kernels", "analysis", PACKAGE):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-c", "from setuptools import build_meta; "
                    f"build_meta.build_wheel({str(tmp_path / 'dist')!r})"],
                   cwd=src, check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(tmp_path / "site")
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {PACKAGE}, top
    for sub in ("kernels/__init__.py", "kernels/_launch.py", "kernels/families/add_mul.py",
                "kernels/families/softmax/forward.py", "kernels/families/attention/kernels.py",
                "kernels/families/layer_norm/backward.py", "kernels/families/matmul_softmax/plan.py",
                "analysis/__init__.py",
                "analysis/bench/__main__.py", "analysis/bench/run.py", "analysis/model/traffic.py",
                "analysis/model/roofline.py", "analysis/book/__init__.py", "analysis/book/data.py"):
        assert f"{PACKAGE}/{sub}" in names
    # Imported from the unpacked wheel alone (not the checkout): the ops and the sweep's CLI.
    code = (f"from {PACKAGE} import kernels; "
            f"from {PACKAGE}.analysis.bench import __main__ as cli; "
            f"from {PACKAGE}.analysis.book import cases; "
            "import pathlib; print(pathlib.Path(kernels.__file__).parent.parent.parent); "
            "print(callable(kernels.softmax), callable(cli.main), callable(cases.model_ms))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True,
                         capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin",
                              "TRITON_INTERPRET": "1"}).stdout.split("\n")
    assert Path(out[0]) == tmp_path / "site" and out[1] == "True True True", out


def test_no_top_level_imports():
    """Everything imports the packages by their installed name (tests, report) or relatively
    (inside analysis, kernels), so a checkout and an install run the same code under one name."""
    bad = re.compile(r"^\s*(from|import) (kernels|analysis)\b", re.M)
    files = [p for d in ("kernels", "analysis", "tests", "report", "tools")
             for p in (ROOT / d).rglob("*")
             if p.suffix in (".py", ".qmd")]
    offenders = [str(p.relative_to(ROOT)) for p in files if bad.search(p.read_text())]
    assert not offenders


def test_setup_installs_the_pinned_peers_on_a_gpu_machine(tmp_path):
    """pyproject.toml's `peers` and `model` extras pin what the bench measures against (peers.py:
    PINNED, MODEL), and `make setup`'s GPU branch installs each of them, the peers without their
    declared dependencies and the rest held to the torch, triton and numpy already there, saying
    which could not be installed; the CPU branch installs none."""
    import tomllib

    from triton_fusion_report.analysis.bench import peers

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert sorted(extras["peers"]) == sorted(f"{d}=={v}" for _, d, v in peers.PINNED.values())
    assert extras["model"] == [f"{peers.MODEL[1]}=={peers.MODEL[2]}"]
    # Without the caller's PYTHON= (make gate, make PYTHON=python3 test-all): setup then has no
    # recipe to show.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "MAKEFLAGS", "MAKELEVEL",
                                                            "MFLAGS")}
    dry = subprocess.run(["make", "-n", "setup", f"VENV={tmp_path / 'venv'}", "PY=false"],
                         cwd=ROOT, capture_output=True, text=True, check=True, env=env).stdout
    gpu, cpu = dry.split("\nelse")
    for req in extras["peers"] + extras["peer-imports"] + extras["model"]:
        assert req in gpu and req not in cpu
    assert "constraints-gpu.txt" in gpu and "could not install" in gpu
    # The peers without their declared dependencies (FlagGems' numpy==1.26.4 would replace the
    # machine's numpy 2); what they import, and transformers, held to the machine's numpy too.
    peers_at = gpu.index(f"for req in {' '.join(extras['peers'])}")
    assert "--no-deps" in gpu[peers_at:].split("done")[0]
    # The peers last: pip's check of installed pins (which --no-deps skips) would otherwise print
    # FlagGems' unmet pins as an ERROR when the constrained installs follow.
    assert gpu.index(f"for req in {' '.join(extras['peer-imports'] + extras['model'])}") < peers_at
    assert "numpy==" in gpu


def test_the_bench_says_what_a_missing_peer_leaves_out(monkeypatch):
    """Before a bench starts: each peer library not installed, with the rows that will say
    unsupported for it, and transformers for the GPT-2 check where the tail steps run."""
    from types import SimpleNamespace

    from triton_fusion_report.analysis.bench import families, peers

    problems = families.select_problems(SimpleNamespace(grid="reference", family=None, op=None,
                                                        where=None))
    installed = {"liger": (None, ""), "flag_gems": ("5.0.2", "flag-gems 5.0.2"),
                 "cce": ("25.1.1", "cut-cross-entropy 25.1.1")}
    monkeypatch.setattr(peers, "_version", lambda impl: installed[impl])
    monkeypatch.setattr(peers.importlib.util, "find_spec", lambda name: None)
    lines = peers.missing(problems, tail=True)
    n = sum(v.impl == "liger" for p in problems for v in p.variants)
    assert lines[0].startswith(f"bench: liger-kernel is not installed (pip install "
                               f"liger-kernel==0.8.5") and f"its {n} rows (" in lines[0]
    assert "transformers is not installed" in lines[1] and len(lines) == 2
    assert peers.missing(problems, tail=False) == lines[:1]
    installed["cce"] = (None, "")  # the LM head front's peer alone: said where the tail runs
    lines = peers.missing(problems, tail=True)
    assert lines[1].startswith("bench: cut-cross-entropy is not installed (pip install "
                               "cut-cross-entropy==25.1.1") and "front" in lines[1]
    assert len(lines) == 3 and peers.missing(problems, tail=False) == lines[:1]
