"""The arrows of DESIGN.md: the book and the bench never import each other, and rendering (the
book, the report's cells) imports neither torch, triton nor the kernels."""
import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANALYSIS = ROOT / "analysis"
PACKAGE = "triton_fusion_report"


def imported(path: Path) -> set[str]:
    """The modules a file imports, absolute (its relative imports resolved within the package)."""
    package = [PACKAGE, *path.relative_to(ROOT).parent.parts]  # an __init__.py's is its folder
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out |= {mod} | ({f"{mod}.{a.name}" for a in node.names} if not node.module else set())
    return out


def reaches(modules: set[str], prefix: str) -> list[str]:
    return sorted(m for m in modules if m == prefix or m.startswith(prefix + "."))


def test_bench_and_book_never_import_each_other():
    """Anywhere in a module, a branch never taken included; the shared modules import neither
    side, and the book and the shared modules neither torch, triton nor the kernels."""
    book, bench = f"{PACKAGE}.analysis.book", f"{PACKAGE}.analysis.bench"
    heavy = (f"{PACKAGE}.kernels", "torch", "triton")
    shared = [ANALYSIS / n for n in ("families.py", "schema.py", "sources.py")]
    for paths, banned in ((sorted((ANALYSIS / "book").glob("*.py")), (bench, *heavy)),
                          (sorted((ANALYSIS / "bench").glob("*.py")), (book,)),
                          (shared + sorted((ANALYSIS / "model").glob("*.py")),
                           (book, bench, *heavy))):
        for path in paths:
            found = imported(path)
            for other in banned:
                assert not reaches(found, other), f"{path.relative_to(ROOT)} imports {other}"


# Run in a fresh interpreter: torch, triton, the kernels and the bench refuse to import (and any
# attempt is recorded, in case a caller swallows the ImportError); then every cell and inline
# expression of every chapter runs against the H100 reference, as tests/test_book.py runs them.
SCRIPT = r"""
import sys
BLOCKED = ("torch", "triton", "triton_fusion_report.kernels", "triton_fusion_report.analysis.bench")
tried = []

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            tried.append(name)
            raise ImportError(f"{name}: rendering must not import it")
        return None

sys.meta_path.insert(0, Refuse())
try:
    import torch  # noqa: F401 - the block works
except ImportError:
    tried.clear()
else:
    sys.exit("torch imported despite the block")

from pathlib import Path
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from qmd import cells, chapters, inline_expressions, run_cell
from triton_fusion_report.analysis import book
from triton_fusion_report.analysis.book import data_tables

root, results, csv = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
book.CACHE = False
data_tables.CSV_DIR = csv
for qmd in chapters(root):
    ns = {}
    text = qmd.read_text()
    for cell in cells(text):
        code = cell.code
        if "parameters" in (cell.options.get("tags") or []):
            code = f"results = {results!r}"
        run_cell(code, ns)
        plt.close("all")
    for expr in inline_expressions(text):
        str(eval(expr, ns))
    print("ran", qmd.name)
loaded = sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED))
if tried or loaded:
    sys.exit(f"rendering imported {sorted(set(tried))} (loaded: {loaded})")
"""


def test_the_book_renders_without_torch_triton_or_the_kernels(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
               MPLBACKEND="Agg")
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT),
                          str(ROOT / "results" / "reference" / "h100"), str(tmp_path / "csv")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    ran = [line for line in run.stdout.splitlines() if line.startswith("ran ")]
    from qmd import chapters

    assert len(ran) == len(chapters(ROOT)), run.stdout
