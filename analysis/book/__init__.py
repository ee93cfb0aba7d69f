"""The book's code: what each chapter of the report says, computed from a results folder.

A chapter module (`summary`, `elementwise`, ...) has `compute(folders) -> dict`: tables (pandas),
numbers and the chapter's sentences, everything its cells show; its figure functions draw from
that dict. `chapter(name, results)` computes it once per results folder and keeps it on disk, so
the HTML and the PDF renders (Quarto runs every cell once per format) share one computation.

Nothing here imports torch, triton, the kernels or the bench: a render needs pandas, pyarrow and
matplotlib only (tests/test_boundaries.py renders every chapter with those imports refused).
"""
from __future__ import annotations

import hashlib
import importlib
import os
import pickle
import re
from pathlib import Path

from . import data

CACHE = True  # tests turn it off: they compute every folder afresh
CACHE_DIR = data.ROOT / ".book-cache"


class Chapter(dict):
    """A chapter's computed values. `c.say("key")` is a sentence, as markdown for inline use."""

    def say(self, key: str) -> "data.Markdown":
        # "GPT-2's": typst prints any quote after a digit as a prime (′), but not the modifier
        # letter apostrophe (U+02BC), which looks the same.
        text = self["say"][key]
        if not text.strip():  # a sentence the data do not support: Quarto would print the source
            return data.Markdown(data.NOTHING)  # of an empty inline value
        return data.Markdown(re.sub(r"(\d)['’]s\b", "\\1\u02bcs", text))


def _fingerprint(name: str, folders: list[Path]) -> str:
    h = hashlib.sha256(name.encode())
    # Every source a chapter may read: the book, the bench's constants, the kernels' hashes.
    for src in sorted(data.ROOT.glob("analysis/**/*.py")) + sorted(data.ROOT.glob("kernels/**/*.py")):
        h.update(src.read_bytes())
    for folder in folders:
        h.update(str(folder.resolve()).encode())
        for f in sorted(folder.iterdir()):
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def _computed(module, folders: list[Path]) -> Chapter:
    values = Chapter(module.compute(folders))
    # What its sentences lack, said once: `c.say("lacks")`, one line (empty: nothing lacks).
    values["say"]["lacks"] = data.lacks_line(values["say"].values(), folders[0])
    return values


def chapter(name: str, results=None) -> Chapter:
    """The values of chapter `name` (a module of this package) for the render's results folders
    (`results`, else $FUSION_RESULTS, else the committed references)."""
    folders = data.results_dirs(results)
    module = importlib.import_module(f"{__name__}.{name}")
    if not CACHE:
        return _computed(module, folders)
    path = CACHE_DIR / f"{name}-{_fingerprint(name, folders)}.pkl"
    if path.exists():
        with open(path, "rb") as f:
            return pickle.load(f)
    values = _computed(module, folders)
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(values, f)
    os.replace(tmp, path)
    return values
