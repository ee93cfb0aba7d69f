"""What `pip install .` puts into site-packages: one top-level name of its own, and the same
imports as in a checkout."""
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
