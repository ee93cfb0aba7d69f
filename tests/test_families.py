"""The family registry (analysis/families.py) against what it describes: the bench's problems, the
kernels, the committed data; and the values the book takes from it instead of the kernels."""
import importlib
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from triton_fusion_report.analysis import families as F
from triton_fusion_report.analysis import schema
from triton_fusion_report.analysis.bench import families as bench_families

from conftest import FULL

ROOT = Path(__file__).resolve().parent.parent
REFERENCES = sorted(p for p in (ROOT / "results" / "reference").iterdir() if p.is_dir())


@pytest.mark.parametrize("grid", ["smoke", pytest.param("full", marks=FULL)])
def test_each_problem_matches_its_entry(grid):
    """Each problem's family, op and shape columns are its entry's; its headlines name only
    columns its problems have; each entry's grid function is its family's."""
    for name, family in F.FAMILIES.items():
        problems = bench_families.PROBLEMS[name](grid)
        assert problems, name
        for p in problems:
            assert p.family == name and p.op in family.ops, (name, p.op)
            assert list(p.shape) == list(family.shape), (name, p.op, list(p.shape))
        columns = {"dtype", "precision", *family.shape}
        assert family.headlines and all(set(h) <= columns for h in family.headlines), name


def test_op_names_are_unique_and_labelled_in_the_books_order():
    """An op belongs to one family (OPS would hide a second); the labelled ops in the order the
    book's tables list them; the families the book compares all labelled."""
    ops = [op for f in F.FAMILIES.values() for op in f.ops]
    assert len(ops) == len(set(ops)) == len(F.OPS)
    assert list(F.OP_LABEL)[:3] == ["add_mul", "softmax", "softmax_bwd"]
    assert F.COMPARED == ("elementwise", "softmax", "layernorm", "softmax_matmul", "attention",
                          "matmul_softmax", "linear_act")
    for name in F.COMPARED:
        family = F.FAMILIES[name]
        assert family.findings_label and next(iter(family.ops.values())).label, name


def test_each_entry_names_its_kernels():
    """Each kernel module imports (the kernel hash reads the same files), the public op a family
    calls is the package's, and the fused methods the book knows are the kernel's own."""
    from triton_fusion_report import kernels
    from triton_fusion_report.kernels.families import matmul_softmax

    for family in F.FAMILIES.values():
        for module in family.kernels:
            importlib.import_module(f"triton_fusion_report.{module}")
        assert family.public_op is None or callable(getattr(kernels, family.public_op)), family
    assert F.FAMILIES["elementwise"].public_op == "add_mul"  # the two names the data keep
    assert F.FAMILIES["layernorm"].public_op == "layer_norm"
    assert F.FAMILIES["matmul_softmax"].fused_methods == matmul_softmax.METHODS


def test_the_schema_reads_the_committed_data():
    """Every committed family file's columns are its schema's, with the schema's types where
    they were written (a column added since is absent, never renamed)."""
    for folder in REFERENCES + [ROOT / "tests" / "data" / "smoke"]:
        for name in F.FAMILIES:
            path = folder / f"{name}.parquet"
            if not path.exists():
                continue
            written = pq.read_schema(path)
            want = schema.family_schema(name)
            extra = set(written.names) - set(want.names)
            assert not extra, (path, extra)
            for col in F.FAMILIES[name].shape:
                if col in written.names:
                    assert written.field(col).type == want.field(col).type, (path, col)


def test_the_book_takes_split_k_slices_from_the_rows_as_the_plan_does():
    """The K slices the book reads from a split_k row's bytes (it cannot ask the plan, which
    imports torch) are those the plan takes on the row's GPU, at every committed such row."""
    import torch

    from triton_fusion_report.analysis.book import cases
    from triton_fusion_report.kernels.families import matmul_softmax as sr

    dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    seen = 0
    for folder in REFERENCES:
        df = pd.read_parquet(folder / "matmul_softmax.parquet")
        for _, r in df[(df["impl"] == "triton_fused") & (df["variant"] == sr.SPLIT_K)].iterrows():
            kw = {"input_precision": r["precision"]} if r["dtype"] == "float32" else {}
            plan = sr.matmul_softmax_plan(int(r["m"]), int(r["k"]), int(r["n"]),
                                          dtypes[r["dtype"]], method=sr.SPLIT_K,
                                          sm_count=int(r["sm_count"]), **kw)
            assert cases._splits(r) == plan.splits, r[["m", "k", "n", "dtype", "precision"]]
            seen += 1
    assert seen
    assert cases._splits(pd.Series(dict(r, bytes_impl=float("nan")))) is None


def test_the_held_out_shapes_are_the_benchs():
    """The book's copy of the matmul + softmax shapes the plan was not tuned on (the bench's
    module imports torch) is the bench's list."""
    from triton_fusion_report.analysis.bench import matmul_epilogue
    from triton_fusion_report.analysis.book import matmul

    assert matmul.HELD_OUT == matmul_epilogue.MS_HELD_OUT


def test_a_bad_entry_is_refused():
    with pytest.raises(ValueError, match="shape types"):
        F.Family("x", kernels=(), grid="m:f", shape={"n": "int64"}, headlines=(), ops={})
    with pytest.raises(ValueError, match="primary_op"):
        F.Family("x", kernels=(), grid="m:f", shape={}, headlines=(), ops={"a": F.Op()},
                 primary_op="b")

