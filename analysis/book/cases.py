"""The traffic model's cases of every family, each family's headline case, and the
speedups measured there: what the summary and the across-families chapter share."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ..families import FAMILIES
from ..model import traffic
from ..model.roofline import model_ms, peak_of  # noqa: F401 - the chapters call them as cases.*
from ..schema import device_time  # noqa: F401 - the chapters call it as cases.device_time
from . import data as R


@dataclass(frozen=True)
class Case:
    """One family at one size: where its rows are, and its kernels unfused and fused (as the
    fused kernel ran there). op_bytes: what the fused op must move at least, its arithmetic
    intensity's denominator, where that differs from the fused kernels' bytes."""
    family: str
    label: str
    where: dict
    unfused: list
    fused: list
    flops: float
    op_bytes: float | None = None

    @property
    def intensity(self) -> float:
        return self.flops / (self.op_bytes or traffic.total(self.fused))


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]


def cases_of(family: str, df: pd.DataFrame) -> list[Case]:
    """Every size-sweep configuration of a family that the traffic model covers, as a Case."""
    keys = {
        "elementwise": ["dtype", "n", "z_kind"],
        "softmax": ["dtype", "rows", "width", "direction"],
        "layernorm": ["dtype", "rows", "width", "direction"],
        "softmax_matmul": ["dtype", "precision", "batch", "d1", "d2", "d3"],
        "attention": ["dtype", "batch", "heads", "seq", "head_dim", "causal"],
        "matmul_softmax": ["dtype", "precision", "m", "k", "n"],
        "linear_act": ["dtype", "precision", "m", "k", "n", "activation"],
    }[family]
    rows = df[(df["sweep"] == "size")].drop_duplicates(keys)
    out = []
    for r in rows.itertuples(index=False):
        e = _itemsize(r.dtype)
        where = {k: getattr(r, k) for k in keys}
        op_bytes = None
        if family == "elementwise":
            u = traffic.add_mul_kernels(r.n, e, r.z_kind, fused=False)
            f = traffic.add_mul_kernels(r.n, e, r.z_kind, fused=True)
            label = f"{r.dtype}, n = {R.pow2(r.n)}, z {r.z_kind}"
            flops = traffic.add_mul_flops(r.n)
        elif family == "softmax":
            if r.direction != "fwd":
                continue  # the headline and the model's cases are the forward's
            u = traffic.softmax_kernels(r.rows, r.width, e, "triton_unfused")
            f = traffic.softmax_kernels(r.rows, r.width, e, "triton_fused")
            label = f"{r.dtype}, {r.rows}×{r.width}"
            flops = traffic.softmax_flops(r.rows, r.width)
        elif family == "layernorm":
            if r.direction != "fwd":
                continue  # the unfused Triton version is a forward
            u = traffic.layer_norm_kernels(r.rows, r.width, e, "triton_unfused")
            f = traffic.layer_norm_kernels(r.rows, r.width, e, "triton_fused")
            label = f"{r.dtype}, {r.rows}×{r.width}"
            flops = traffic.layer_norm_flops(r.rows, r.width)
        elif family == "softmax_matmul":
            u = traffic.softmax_matmul_kernels(r.batch, r.d1, r.d2, r.d3, e, "triton_unfused")
            f = traffic.softmax_matmul_kernels(r.batch, r.d1, r.d2, r.d3, e, "triton_fused")
            label = f"{r.precision}, d2 = {r.d2}"
            flops = traffic.softmax_matmul_flops(r.batch, r.d1, r.d2, r.d3)
        elif family == "attention":
            if r.causal:
                continue  # the model's kernels count the full square
            u = traffic.attention_kernels(r.batch, r.heads, r.seq, r.head_dim, e, "triton_unfused")
            f = traffic.attention_kernels(r.batch, r.heads, r.seq, r.head_dim, e, "triton_fused")
            label = f"{r.dtype}, seq {r.seq}, head_dim {r.head_dim}"
            flops = traffic.attention_flops(r.batch, r.heads, r.seq, r.head_dim, False)
        elif family == "matmul_softmax":
            u = traffic.matmul_softmax_kernels(r.m, r.k, r.n, e, "triton_unfused")
            f = traffic.matmul_softmax_kernels(r.m, r.k, r.n, e, "triton_fused",
                                               *_fused_method(df, where))
            op_bytes = traffic.total(traffic.matmul_softmax_kernels(r.m, r.k, r.n, e,
                                                                    "triton_fused"))
            label = f"{r.precision}, {r.m}×{r.k}×{r.n}"
            flops = traffic.matmul_softmax_flops(r.m, r.k, r.n)
        else:
            u = traffic.linear_act_kernels(r.m, r.k, r.n, e, "triton_unfused")
            f = traffic.linear_act_kernels(r.m, r.k, r.n, e, "triton_fused")
            label = f"{r.precision}, {r.m}×{r.k}×{r.n}, {r.activation}"
            flops = 2 * r.m * r.k * r.n
        out.append(Case(family, label, where, u, f, flops, op_bytes))
    return out


SPLIT_K = "split_k"  # one of FAMILIES["matmul_softmax"].fused_methods


def _fused_method(df: pd.DataFrame, where: dict) -> tuple:
    """(method, K slices) that matmul+softmax's fused kernel ran at a configuration (the row's
    variant; split_k's slices from the row's bytes), for the traffic model: two passes over the
    logits move what the unfused pair does. (None, 1) without a fused row, or for a split_k row
    without its bytes (the model's fused op then)."""
    fused = _select(df, where)
    fused = fused[fused["impl"] == "triton_fused"]
    if not len(fused) or fused["variant"].iloc[0] not in FAMILIES["matmul_softmax"].fused_methods:
        return None, 1
    r = fused.iloc[0]
    if r["variant"] != SPLIT_K:
        return r["variant"], 1
    splits = _splits(r)
    return (SPLIT_K, splits) if splits else (None, 1)


def _splits(r) -> int | None:
    """The K slices a split_k row ran: the bench records its bytes (bytes_impl) with the slices
    the plan took on its GPU, and they grow by one slice's partials per slice. (The plan itself
    imports torch, which the book does not.) None where the row has no bytes_impl."""
    if pd.isna(r.get("bytes_impl")):
        return None
    m, k, n, e = int(r["m"]), int(r["k"]), int(r["n"]), _itemsize(r["dtype"])
    none, one = (traffic.total(traffic.matmul_softmax_kernels(m, k, n, e, "triton_fused",
                                                              SPLIT_K, s)) for s in (0, 1))
    return round((r["bytes_impl"] - none) / (one - none))


def _select(df: pd.DataFrame, where: dict) -> pd.DataFrame:
    """The size-sweep rows of one configuration: at most one per implementation, else `where`
    names several shapes (e.g. a width measured at two row counts) and is an error."""
    sel = df[(df["sweep"] == "size") & (df["status"] == "ok")]
    for k, v in where.items():
        sel = sel[sel[k] == v]
    if len(sel) and sel["impl"].duplicated().any():
        raise R.AmbiguousRows(f"{where} matches {len(sel)} rows, several per implementation: "
                         "name every shape column")
    return sel


def times_of(df: pd.DataFrame, where: dict) -> dict:
    """impl -> device time (ms) at one configuration (the fused impl's default path)."""
    sel = _select(df, where)
    sel = sel.assign(t=device_time(sel)).dropna(subset=["t"])
    return sel.groupby("impl")["t"].min().to_dict()


def predicted_vs_measured(frames: dict[str, pd.DataFrame], limits: pd.DataFrame) -> pd.DataFrame:
    """One row per family and size: the speedup of fused over unfused Triton that the roofline
    model predicts, and the one measured (device times)."""
    rows = []
    for family, df in frames.items():
        for case in cases_of(family, df):
            t = times_of(df, case.where)
            if "triton_fused" not in t or "triton_unfused" not in t:
                continue
            # The case's own run (a family's parts may come from two runs).
            run = R.run_of(_select(df, case.where))
            bw = R.limit(limits, "copy_bw", run_id=run)
            peak = peak_of(limits, case.where.get("precision", case.where["dtype"]), run) \
                if any(k.flops for k in case.fused) else math.inf
            model_unfused, model_fused = (model_ms(k, bw, peak) for k in (case.unfused,
                                                                          case.fused))
            rows.append(dict(family=family, case=case.label, predicted=model_unfused / model_fused,
                             measured=t["triton_unfused"] / t["triton_fused"],
                             fused_ms=t["triton_fused"], unfused_ms=t["triton_unfused"],
                             model_fused_ms=model_fused, model_unfused_ms=model_unfused,
                             method=_fused_method(df, case.where)[0]
                             if family == "matmul_softmax" else None))
    return pd.DataFrame(rows, columns=["family", "case", "predicted", "measured", "fused_ms",
                                       "unfused_ms", "model_fused_ms", "model_unfused_ms",
                                       "method"])



# Not the fused kernel's rivals: itself, and cuBLAS's matmul alone, which computes less than the op.
NOT_RIVALS = ("triton_fused", "cublas")


def headline(family: str, df: pd.DataFrame) -> Case | None:
    """The family's headline case: the first of its headlines (families.py) the data has, at its
    largest size where the entry leaves the size open."""
    cases = cases_of(family, df)
    for want in FAMILIES[family].headlines:
        hits = [c for c in cases if all(c.where.get(k) == v for k, v in want.items())
                and "triton_fused" in times_of(df, c.where)]
        if hits:
            return max(hits, key=lambda c: c.flops)
    return None



def roofline_points(frames: dict[str, pd.DataFrame], limits: pd.DataFrame) -> pd.DataFrame:
    """Every fused configuration: arithmetic intensity (FLOPs / model bytes) and attained
    TFLOP/s, with the limits of its run and precision."""
    rows = []
    for family, df in frames.items():
        sel = df[(df["sweep"] == "size") & (df["status"] == "ok") & (df["impl"] == "triton_fused")]
        sel = sel.assign(t=device_time(sel)).dropna(subset=["t"])
        if family == "attention":
            sel = sel[~sel["causal"].astype(bool)]
        for r in sel.itertuples(index=False):
            # Each row against its own run's limits (a family's parts may come from two runs).
            rows.append(dict(family=FAMILIES[family].findings_label, precision=r.precision,
                             intensity=r.flops_model / r.bytes_model,
                             tflops=r.flops_model / r.t / 1e9, fused_ms=r.t,
                             copy_gbps=R.limit(limits, "copy_bw", run_id=r.run_id),
                             peak=peak_of(limits, r.precision, r.run_id)))
    return pd.DataFrame(rows)


def accuracy_table(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The worst max |out - ref| / max |ref| against float64, per family, precision and impl, over
    every configuration that ran."""
    parts = []
    for family, df in frames.items():
        ok = df[df["status"] == "ok"].dropna(subset=["max_rel_err"])
        parts.append(ok.assign(family=FAMILIES[family].findings_label))
    if not parts:
        return pd.DataFrame()
    all_rows = pd.concat(parts)
    t = all_rows.pivot_table(index=["family", "precision"], columns="impl", values="max_rel_err",
                             aggfunc="max", sort=False)
    order = ([c for c in R.IMPL_ORDER if c in t.columns]
             + [c for c in t.columns if c not in R.IMPL_ORDER])
    t = t[order]
    t.columns = [R.SHORT_LABEL.get(c, c) for c in t.columns]
    return t


def sci(v: float) -> str:
    """A small number as a reader writes it: 4 × 10^-6^ (markdown superscript)."""
    mantissa, exponent = f"{v:.0e}".split("e")
    return f"{mantissa} × 10^{int(exponent)}^"


def accuracy_say(frames: dict[str, pd.DataFrame]) -> str:
    """The fused kernels' worst errors against float64, and how they compare with the unfused."""
    acc = accuracy_table(frames)
    if not len(acc) or "fused" not in acc:
        return R.lacking("fused rows checked against float64")
    fused = acc["fused"].dropna()  # the worst over each group of precisions
    groups = {"float32": ["ieee"], "TF32": ["tf32"], "half precision": ["float16", "bfloat16"]}
    worst = [f"{sci(fused[fused.index.get_level_values('precision').isin(p)].max())} in {name}"
             for name, p in groups.items()
             if fused.index.get_level_values("precision").isin(p).any()]
    wrong = sum(int((df["status"] == "wrong_result").sum()) for df in frames.values())
    closer = ""
    if "unfused" in acc:
        pairs = acc[["fused", "unfused"]].dropna().map(lambda v: float(f"{v:.1e}"))
        closer = (f"; it is as close as the unfused version or closer in "
                  f"{int((pairs['fused'] <= pairs['unfused']).sum())} of {len(pairs)} family "
                  "and precision pairs")
    return (f"Against the float64 reference, the fused kernels' worst error (largest |out − ref| "
            f"over the largest |ref|) is {', '.join(worst)}{closer}; "
            + ("no row of any implementation exceeded its dtype's tolerance"
               if not wrong else f"{wrong} rows exceeded their dtype's tolerance")
            + " (@sec-data has the table).")



# What matmul + softmax's `store_softmax` method is, wherever a chapter says the plan took it.
