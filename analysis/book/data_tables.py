"""Appendix "Data tables": the values a reader looks up, per family, and the accuracy of every
implementation against float64; for the HTML, every family's rows as CSV files to download.

A table shows one kind of time only: device time (CUDA-graph replay) where every row of the table
has it, else the per-call median for all its rows, so no table compares the two."""
from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..families import OP_LABEL  # the op names a reader knows, in the book's order
from . import data as D

# Where the render's cell writes the CSV files (beside report/data.qmd, which links them: Quarto
# copies the files a page links to into the output, after the page's cells have written them).
CSV_DIR = D.ROOT / "report" / "data"
# The rows a folder keeps beside its family files, offered too.
EXTRA_FILES = ("limits", "runs")

# The libraries that implement the fused op by themselves (cuBLAS "alone" is the matmul only).
LIBRARY_IMPLS = ("liger", "flag_gems", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "cublaslt")
COMPILE_IMPLS = ("torch_compile", "torch_compile_max")


ACTIVATION = {"linear_gelu": "GELU", "linear_relu": "ReLU"}


def precision_label(precision: str) -> str:
    """fp32 (IEEE), TF32, fp16, bf16."""
    return {"ieee": "fp32", "tf32": "TF32"}.get(precision, D.SHORT_DTYPE.get(precision, precision))


def _x(*keys: str):
    """A label "a×b" of the shape columns `keys` (no spaces: a shape never breaks across lines)."""
    return lambda r: "×".join(str(int(r[k])) for k in keys)


@dataclass(frozen=True)
class View:
    """One table: the rows of `op` (None: the family's ops) matching `where`, one line per
    configuration (`keys`, in this order), the implementations `impls` as columns (those the
    data has). `label` names a configuration in the first column, headed `head`."""
    key: str
    family: str
    op: str | None
    where: dict
    keys: tuple
    head: str
    label: object
    impls: tuple
    about: str  # what the rows are, for the sentence above the table
    extra: dict = field(default_factory=dict)  # more index columns: name -> function of a row


PYTORCH = ("torch_eager", "torch_compile", "torch_compile_max")
VIEWS = [
    View("ew", "elementwise", "add_mul", dict(dtype="float32", z_kind="tensor"), ("n",), "n",
         lambda r: D.pow2(r["n"]), PYTORCH + ("triton_unfused", "triton_fused"),
         "Add-mul `(x + y) * z` in float32 with a tensor `z`, against the number of elements n"),
    View("softmax", "softmax", None, dict(dtype="float32"), ("op", "rows", "width"),
         "pass, rows×width",
         lambda r: ("bwd " if r["op"].endswith("bwd") else "fwd ") + _x("rows", "width")(r),
         PYTORCH + ("triton_unfused", "triton_fused", "liger", "flag_gems"),
         "Softmax forward and backward (the gradient of the input) in float32"),
    View("layernorm", "layernorm", None, dict(dtype="float16"), ("op", "rows", "width"),
         "pass, rows×width",
         lambda r: ("bwd " if r["op"].endswith("bwd") else "fwd ") + _x("rows", "width")(r),
         PYTORCH + ("triton_unfused", "triton_fused", "liger", "flag_gems"),
         "LayerNorm forward and backward (input, weight and bias gradients) in float16 (the "
         "unfused Triton version has a forward only)"),
    View("smv", "softmax_matmul", "softmax_matmul", {}, ("precision", "d2"), "precision",
         lambda r: precision_label(r["precision"]),
         PYTORCH + ("triton_unfused", "triton_fused"),
         "`softmax(X) @ V` (X of batch × d1 × d2, V of batch × d2 × d3) in float32, with IEEE "
         "and with TF32 products, and in float16, against d2",
         extra={"d2": lambda r: int(r["d2"])}),
    View("attn", "attention", "attention_fwd", dict(head_dim=128),
         ("causal", "seq", "batch", "heads", "kv_heads"), "batch×seq",
         _x("batch", "seq"),
         ("torch_eager", "torch_compile", "triton_fused", "flag_gems", "sdpa_flash", "sdpa_cudnn"),
         "Attention forward in float16, head_dim {head_dim}, against the sequence length",
         extra={"causal": lambda r: "yes" if r["causal"] else "no"}),
    View("attn-bwd", "attention", "attention_fwd_bwd", {},
         ("head_dim", "causal", "seq", "batch", "heads", "kv_heads"), "head_dim",
         lambda r: int(r["head_dim"]),
         ("triton_fused", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient"),
         "Attention forward and backward (one training step's attention) in float16",
         extra={"batch×seq": _x("batch", "seq"),
                "causal": lambda r: "yes" if r["causal"] else "no"}),
    View("mms", "matmul_softmax", "matmul_softmax", dict(precision="float16"), ("n", "m", "k"),
         "m×k×n", _x("m", "k", "n"),
         PYTORCH + ("cublas", "triton_unfused", "triton_fused"),
         "Matmul + softmax `softmax(x @ W + b)` in float16, x of m×k and W of k×n (the cuBLAS "
         "column: the matrix product alone)"),
    View("linear", "linear_act", None, {}, ("op", "precision", "m", "k", "n"),
         "activation, precision, m×k×n",
         lambda r: (f"{ACTIVATION[r['op']]} "
                    f"{precision_label(r['precision'])}, {_x('m', 'k', 'n')(r)}"),
         PYTORCH + ("cublas", "cublaslt", "triton_unfused", "triton_fused"),
         "Linear + activation `act(x @ W + b)`, x of m×k and W of k×n (the cuBLAS column: the "
         "matrix product alone; "
         "cuBLASLt: the product with bias and activation in its epilogue)"),
]
# Narrower column heads than data.SHORT_LABEL's where a table has many columns.
HEAD = {**D.SHORT_LABEL, "cublas": "cuBLAS", "torch_compile_max": "autotune"}


def view_table(df: pd.DataFrame, view: View) -> tuple[pd.DataFrame, str]:
    """The table of one view (µs per call; configurations as rows, implementations as columns)
    and the sentence that says what it holds, or an empty table and what is missing."""
    sel = df[(df["sweep"] == "size") & (df["status"] == "ok")] if len(df) else df
    for k, v in view.where.items():
        sel = sel[sel[k] == v] if k in sel else sel.iloc[:0]
    others = sorted(set(sel["impl"]) - set(view.impls)) if len(sel) else []
    sel = sel[sel["impl"].isin(view.impls)] if len(sel) else sel
    timed = sel[sel["ms_median"].notna()] if len(sel) else sel
    if not len(timed):
        return pd.DataFrame(), ""  # the table itself says it holds none
    device = bool(timed["ms_device"].notna().all())
    timed = timed.assign(us=1000 * (timed["ms_device"] if device else timed["ms_median"]))
    keys = [k for k in view.keys if k in timed]
    wide = timed.pivot_table(index=keys, columns="impl", values="us", aggfunc="min", sort=True)
    # Ops in the book's order (forward before backward), shapes by size.
    wide = wide.sort_index(key=_rank)
    configs = wide.index.to_frame(index=False)
    table = pd.DataFrame({view.head: [view.label(r) for _, r in configs.iterrows()]})
    for name, of in view.extra.items():
        table[name] = [of(r) for _, r in configs.iterrows()]
    for impl in view.impls:
        if impl in wide:
            table[HEAD.get(impl, impl)] = wide[impl].to_numpy()
    measure = ("device time per call (CUDA-graph replay)" if device else
               "per-call median time (these rows have no device time)")
    rest = (f" Also measured, in the CSV files only: "
            f"{', '.join(D.IMPL_LABEL.get(i, i) for i in others)}." if others else "")
    return table, f"{view.about.format(**view.where)}: {measure} in µs.{rest}"


PRECISION_ORDER = ["ieee", "tf32", "float16", "bfloat16"]


def captioned(c: dict, key: str) -> str:
    """A table of `compute` as markdown, numbered (tbl-data-<key>) and captioned by the sentence
    that says what it holds and how it was timed; where it is empty, that sentence alone."""
    table, say = c["tables"][key], c["say"][key]
    if not len(table):
        return say + "\n"
    return f"{D.md_table(table)}\n\n: {say} {{#tbl-data-{key}}}\n"


def _rank(level: pd.Index) -> pd.Index:
    """Sort keys of an index level: ops in the book's order, precisions fp32 first."""
    if level.name == "op":
        return level.map(_op_rank)
    if level.name == "precision":
        return level.map(lambda p: PRECISION_ORDER.index(p) if p in PRECISION_ORDER else 9)
    return level


def _op_rank(op: str) -> int:
    return list(OP_LABEL).index(op) if op in OP_LABEL else len(OP_LABEL)


def accuracy(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The worst max |out − ref| / max |ref| against float64 over every configuration that ran,
    per op and precision: the Triton kernels, eager, torch.compile (either mode) and the
    libraries (every one measured)."""
    parts = [df[df["status"] == "ok"].dropna(subset=["max_rel_err"]) for df in frames.values()
             if len(df)]
    rows = pd.concat(parts) if parts else pd.DataFrame()
    if not len(rows):
        return pd.DataFrame()
    groups = {"fused": ["triton_fused"], "unfused": ["triton_unfused"], "eager": ["torch_eager"],
              "compile": list(COMPILE_IMPLS), "libraries": list(LIBRARY_IMPLS)}
    out = []
    for (op, precision), g in rows.groupby(["op", "precision"]):
        line = {"op": OP_LABEL.get(op, op), "precision": precision_label(precision)}
        for name, impls in groups.items():
            line[name] = g[g["impl"].isin(impls)]["max_rel_err"].max()
        line["_order"] = (_op_rank(op),
                          PRECISION_ORDER.index(precision) if precision in PRECISION_ORDER else 9)
        out.append(line)
    table = pd.DataFrame(out).sort_values("_order").drop(columns="_order")
    empty = [c for c in groups if table[c].isna().all()]
    return table.drop(columns=empty).reset_index(drop=True)


def accuracy_display(table: pd.DataFrame) -> pd.DataFrame:
    """The accuracy table with its errors written for people."""
    errors = [c for c in table.columns if c not in ("op", "precision")]
    return table.assign(**{c: table[c].map(sci) for c in errors}) if len(table) else table


def accuracy_gap(table: pd.DataFrame) -> str:
    """How far the fused kernel's worst error is from the most accurate other implementation's,
    at its worst op and precision."""
    others = [c for c in table.columns if c not in ("op", "precision", "fused")]
    if not len(table) or "fused" not in table or not others:
        return D.lacking("errors of the fused kernels beside those of other implementations")
    best = table[others].min(axis=1)
    ratio = (table["fused"] / best).dropna()
    if not len(ratio):
        return D.lacking("errors of the fused kernels beside those of other implementations")
    worst = table.loc[ratio.idxmax()]
    within = int((ratio <= 2).sum())
    return (f"At {within} of the {len(ratio)} ops and precisions where both were checked, the "
            "fused kernel's worst error is at most twice that of the most accurate other "
            f"implementation; the largest gap is {worst['op']} in {worst['precision']}, "
            f"{sci(worst['fused'])} against {sci(best[ratio.idxmax()])}.")


def sci(v: float) -> str:
    """An error for people: 1.2×10^−7^ (a markdown superscript), "—" where none."""
    if v is None or v != v:
        return "—"
    if v == 0:
        return "0"
    exp = math.floor(math.log10(abs(v)))
    mant = v / 10 ** exp
    if round(mant, 1) >= 10:
        mant, exp = mant / 10, exp + 1
    return f"{mant:.1f}×10^{str(exp).replace('-', '−')}^"


def csv_names(folders: list) -> dict[Path, str]:
    """Each folder's name under CSV_DIR: its own name, made unique."""
    names, seen = {}, set()
    for folder in folders:
        name = Path(folder).name
        while name in seen:
            name += "+"
        seen.add(name)
        names[Path(folder)] = name
    return names


def csv_files(folder: Path) -> list[str]:
    """The files of a results folder offered as CSV: every family's rows, the limits and the runs
    (from Parquet), and the tables the bench writes as CSV itself."""
    stems = {p.stem for p in Path(folder).glob("*.parquet")
             if p.stem not in D.NOT_FAMILY_FILES or p.stem in EXTRA_FILES}
    stems |= {p.stem for p in Path(folder).glob("*.csv")}
    return [f"{stem}.csv" for stem in sorted(stems)]


def write_csvs(folders: list, target: Path | None = None) -> None:
    """Write every folder's files of `csv_files` under target/<folder name>/ (emptied first, so
    a file this render lacks leaves no old one behind). Called by the data appendix's cell: not
    part of `compute`, which stays free of side effects. target: CSV_DIR unless given."""
    target = CSV_DIR if target is None else target
    shutil.rmtree(target, ignore_errors=True)
    for folder, name in csv_names(folders).items():
        (target / name).mkdir(parents=True, exist_ok=True)
        for csv in csv_files(folder):
            parquet = Path(folder) / csv.replace(".csv", ".parquet")
            if parquet.exists():
                pd.read_parquet(parquet).to_csv(target / name / csv, index=False)
            else:
                shutil.copy(Path(folder) / csv, target / name / csv)


def downloads(folders: list) -> str:
    """The markdown list of the CSV files (links relative to report/data.qmd)."""
    lines = []
    for folder, name in csv_names(folders).items():
        gpu = D.gpu_label(D.gpu_of(folder))
        links = ", ".join(f"[{csv.removesuffix('.csv')}](data/{name}/{csv})"
                          for csv in csv_files(folder))
        lines.append(f"- {gpu} (`{name}`): {links}")
    return "\n".join(lines)


def compute(folders: list) -> dict:
    folder = folders[0]
    say, tables, frames = {}, {}, {}
    for family in sorted({v.family for v in VIEWS}):
        path = Path(folder) / f"{family}.parquet"
        # Every op of the family (load gives its main op unless asked), timings NaN on a CPU.
        ops = pd.read_parquet(path, columns=["op"])["op"].unique() if path.exists() else []
        parts = [D.load(folder, family, op) for op in ops]
        frames[family] = pd.concat(parts, ignore_index=True) if parts else D.load(folder, family)
    for view in VIEWS:
        df = frames[view.family]
        if view.op is not None and len(df):
            df = df[df["op"] == view.op]
        tables[view.key], say[view.key] = view_table(df, view)
    acc = accuracy(frames)
    tables["accuracy"] = accuracy_display(acc)
    say["accuracy"] = accuracy_gap(acc)
    gpu = D.gpu_of(folder)
    say["intro"] = (f"Every table here is from the {gpu} data"
                    + (f" (the first of the {len(folders)} results folders this render shows)"
                       if len(folders) > 1 else "") + ".")
    say["downloads"] = downloads(folders)
    return dict(tables=tables, say=say)
