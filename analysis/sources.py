"""The code a row ran, hashed: what the bench records with each row and the book checks against
this checkout's kernels. Reads the kernels' sources as text (ast, tokenize): no torch, no triton,
no import of the kernels."""
from __future__ import annotations

import ast
import hashlib
import io
import tokenize
from pathlib import Path

from .families import FAMILIES

ROOT = Path(__file__).resolve().parents[1]  # the checkout (installed: the package folder)


def _kernel_imports(path: Path) -> set[Path]:
    """The files under kernels/ that `path` imports (relative imports only)."""
    kernels = ROOT / "kernels"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.ImportFrom) and node.level >= 1):
            continue
        base = path.parent
        for _ in range(node.level - 1):
            base = base.parent
        parts = node.module.split(".") if node.module else []
        targets = [parts] if node.module else [[a.name] for a in node.names]
        for t in targets:
            for cand in (base.joinpath(*t).with_suffix(".py"), base.joinpath(*t, "__init__.py")):
                if cand.is_file() and kernels in cand.parents:
                    found.add(cand)
    return found


def code_text(source: str) -> str:
    """A module's code without its comments and docstrings, whitespace collapsed: what a kernel
    hash covers, so that a comment or a docstring edited does not mark measured data stale.
    (Positions, not tokens or AST dumps, which differ between Python versions.)"""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def at(row: int, col: int, in_bytes: bool = False) -> int:
        if in_bytes:  # ast's columns count UTF-8 bytes
            col = len(lines[row - 1].encode()[:col].decode(errors="ignore"))
        return starts[row - 1] + col

    cuts = [(at(*t.start), at(*t.end)) for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str):
            doc = node.body[0]
            cuts.append((at(doc.lineno, doc.col_offset, True), at(doc.end_lineno, doc.end_col_offset, True)))
    kept, last = [], 0
    for a, b in sorted(cuts):
        if a >= last:
            kept.append(source[last:a])
            last = b
    kept.append(source[last:])
    return " ".join("".join(kept).split())


def _definitions(source: str) -> list[tuple[str, str]]:
    """(name, code) of each top-level definition of a module (functions, classes, assignments;
    imports left out), its code as `code_text` keeps it."""
    out = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the module's docstring
        text = code_text(ast.get_source_segment(source, node, padded=False) or "")
        name = getattr(node, "name", None) or ",".join(
            t.id for t in getattr(node, "targets", [getattr(node, "target", None)])
            if isinstance(t, ast.Name))
        out.append((name, text))
    return out


def kernel_hash(family: str) -> str:
    """Hash of the code a family's rows ran: every top-level definition (functions, classes,
    constants; comments, docstrings and imports left out) of its ops' modules or subpackages under
    kernels/families/ and of the private modules those import, in name order. So a comment, a
    docstring, a moved function or a renamed file leaves it as it is; a change to the code that
    runs, or to a shared piece the family imports, does not."""
    todo = []
    for module in FAMILIES[family].kernels:
        op = ROOT.joinpath(*module.split("."))
        todo += sorted(op.glob("*.py")) if op.is_dir() else [op.with_suffix(".py")]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            todo += sorted(_kernel_imports(path) - seen)
    h = hashlib.sha256()
    for name, text in sorted(d for path in seen for d in _definitions(path.read_text())):
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()[:16]
