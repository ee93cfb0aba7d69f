"""Run the kernels natively on a GPU, else through Triton's interpreter on CPU tensors.

TRITON_INTERPRET must be set before triton is first imported, hence here, at collection time.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# Two tiers. `make test` (pytest -m "not full") runs every public op, every kernel path the plans
# can pick, the input checks and the pipeline, each on the fewest shapes, dtypes and options that
# reach it; `make test-all` (no -m) adds the cases marked FULL: the rest of each matrix.
FULL = pytest.mark.full


def full(*values):
    """Parameter values of the full tier only, for a one-name parametrize (a tuple is one value)."""
    return [pytest.param(v, marks=FULL) for v in values]


def fast_cases(keep=None):
    """Decorates a parametrised test: `make test` runs the cases for which keep(**params) is true,
    the rest are marked FULL. keep=None: the fewest cases that give every parameter each of its
    values once (case i takes the i-th value of every parametrize list, cycling): 9 cases of
    9 methods x 5 shapes x 3 dtypes, not 135."""
    def mark(fn):
        fn._fast_cases = keep or _each_value_once
        return fn
    return mark


def _each_value_once(**_):
    raise AssertionError("resolved from the cases' positions in pytest_collection_modifyitems")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the marks added here
def pytest_collection_modifyitems(items):
    by_test = {}
    for item in items:
        keep = getattr(getattr(item, "function", None), "_fast_cases", None)
        if keep is not None and hasattr(item, "callspec"):
            by_test.setdefault((item.path, item.originalname), []).append(item)
    for cases in by_test.values():
        keep = cases[0].function._fast_cases
        if keep is _each_value_once:
            # Each parametrize list's cases numbered in the order the test's cases first take
            # them (the list's order); the names of one list ("a, b") taken together.
            lists = [[n.strip() for n in (m.args[0].split(",") if isinstance(m.args[0], str)
                                          else m.args[0])]
                     for m in cases[0].iter_markers("parametrize")]
            numbers = {}
            index = []
            for item in cases:
                idx = {}
                for names in lists:
                    key = tuple(id(item.callspec.params[n]) for n in names)
                    seen = numbers.setdefault(names[0], {})
                    idx[names[0]] = seen.setdefault(key, len(seen))
                index.append(idx)
            most = max(len(n) for n in numbers.values())
            chosen = [any(all(i == k % len(numbers[name]) for name, i in idx.items())
                          for k in range(most)) for idx in index]
        else:
            chosen = [keep(**item.callspec.params) for item in cases]
        for item, fast in zip(cases, chosen):
            if not fast:
                item.add_marker(FULL)


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def _no_tuning_on_disk(monkeypatch):
    """Tuned launch settings stay in memory (the sweep's module sets TRITON_CACHE_AUTOTUNING=1 for
    the process when imported): no test reads a choice another test timed, nor writes the user's
    Triton cache. A test of the disk copy turns it on with its own cache folder."""
    from triton import knobs

    monkeypatch.setattr(knobs.autotuning, "cache", False)


@pytest.fixture(autouse=True)
def _no_warming_processes(monkeypatch):
    """The bench's command line, called by the pipeline tests, spawns no compiling processes
    before its sweep (the default on one GPU: up to twelve processes that each start torch, for a toy
    grid); tests/test_warm.py tests them by name."""
    from triton_fusion_report.analysis.bench import warm

    monkeypatch.setattr(warm, "default_workers", lambda: 0)


@pytest.fixture(autouse=True)
def _poison_outputs():
    """Every kernel output starts as NaN, so an element a kernel fails to write fails the test."""
    from triton_fusion_report.kernels import poisoned_outputs

    with poisoned_outputs():
        yield


def tool(name: str):
    """The module of a maintainers' tool, tools/<name>.py (a folder of scripts, not a package:
    loaded by its path, once)."""
    import importlib.util
    import sys
    from pathlib import Path

    key = f"_tools_{name}"
    if key not in sys.modules:
        path = Path(__file__).resolve().parent.parent / "tools" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # before it runs: dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[key]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref| in float64; inf if out has a NaN/inf the reference has not."""
    from triton_fusion_report.analysis.bench.sweep import max_rel_err

    return max_rel_err(out, ref)


# Tolerances on max |out - ref| / max |ref| against a float64 reference.
TOL = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def reference_before_softmax_backward(dst):
    """A copy of the committed reference as it was before the softmax backward was measured:
    softmax.parquet holds the forward rows alone, without the `direction` column (the old file
    format). Tests of the with/without-backward paths build on it, whatever the reference holds."""
    import shutil
    from pathlib import Path

    import pandas as pd

    from triton_fusion_report.analysis.book import data as R

    dst = Path(dst)
    shutil.copytree(R.REFERENCE, dst)
    df = pd.read_parquet(R.REFERENCE / "softmax.parquet")
    df = df[df["op"] == "softmax"].drop(columns=["direction"], errors="ignore")
    df.to_parquet(dst / "softmax.parquet", index=False)
    return dst


@pytest.fixture(autouse=True)
def _cpu_tensors_only_through_device(request, monkeypatch):
    """A test that hands a kernel tensors it did not build on the `device` fixture fails here as it
    would on a GPU (a CPU tensor refused), instead of passing only under the interpreter. A test
    whose CPU tensors are meant (a check that reads shapes, not data) says why with
    @pytest.mark.cpu_tensors("reason")."""
    if DEVICE.type == "cpu" and "device" not in request.fixturenames \
            and request.node.get_closest_marker("cpu_tensors") is None:
        from triton_fusion_report.kernels import _checks

        monkeypatch.setattr(_checks, "cpu_tensors_run", lambda: False)
