"""Read a Quarto chapter the way Quarto's Jupyter engine would: its python cells in order (with
their `#|` options) and the inline `{python}` expressions of its prose."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

CHUNK = re.compile(r"^```\{python\}[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
INLINE = re.compile(r"`\{python\}\s+([^`]+)`")


@dataclass
class Cell:
    code: str
    options: dict


def cells(text: str) -> list[Cell]:
    out = []
    for m in CHUNK.finditer(text):
        body = m.group(1)
        opts = "\n".join(line[3:] for line in body.splitlines() if line.startswith("#| "))
        out.append(Cell(body, yaml.safe_load(opts) or {}))
    return out


def prose(text: str) -> str:
    """The chapter without its code cells and YAML front matter."""
    text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)
    return CHUNK.sub("", text)


def inline_expressions(text: str) -> list[str]:
    return [m.group(1).strip() for m in INLINE.finditer(prose(text))]


def run_cell(code: str, namespace: dict):
    """exec the cell; like Jupyter, return the value of a trailing expression (else None)."""
    tree = ast.parse(code)
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body = tree.body[:-1]
    exec(compile(tree, "<cell>", "exec"), namespace)
    if last is not None:
        return eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
    return None


def chapters(root: Path) -> list[Path]:
    """The book's chapters and appendices, in order (_quarto.yml)."""
    book = yaml.safe_load((root / "_quarto.yml").read_text())["book"]
    return [root / p for p in book["chapters"] + book.get("appendices", [])]
