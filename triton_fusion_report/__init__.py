"""Kernel fusion in Triton, under a name of its own: `triton_fusion_report.kernels` (the ops) and
`triton_fusion_report.analysis` (sweeps, models, findings) are the repository's top-level folders
kernels/ and analysis/.

`pip install .` installs them as subpackages of this package (nothing else at the top of
site-packages, so no clash with the PyPI package `kernels`). In a checkout, this file points the
package at the repository's root instead, so the same imports work without installing.
"""
from pathlib import Path as _Path

_here = _Path(__file__).resolve().parent
if not (_here / "kernels").is_dir() and (_here.parent / "kernels" / "__init__.py").is_file():
    __path__.append(str(_here.parent))  # noqa: F821 - a package's own __path__
