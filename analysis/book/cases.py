"""The traffic model's cases of every family, each family's headline case, and the
speedups measured there: what the summary and the across-families chapter share."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd


from . import data as R
from ..model import traffic
from ..model.roofline import model_ms, peak_of  # noqa: F401 - the chapters call them as cases.*


def device_time(df: pd.DataFrame) -> pd.Series:
    """ms per call of each row: the device time where measured, else the per-call median."""
    if "ms_device" not in df:
        return df["ms_median"]
    return df["ms_device"].fillna(df["ms_median"])


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
            label = f"{r.dtype}, {r.rows} × {r.width}"
            flops = traffic.softmax_flops(r.rows, r.width)
        elif family == "layernorm":
            if r.direction != "fwd":
                continue  # the unfused Triton version is a forward
            u = traffic.layer_norm_kernels(r.rows, r.width, e, "triton_unfused")
            f = traffic.layer_norm_kernels(r.rows, r.width, e, "triton_fused")
            label = f"{r.dtype}, {r.rows} × {r.width}"
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
            label = f"{r.precision}, {r.m} × {r.k} × {r.n}"
            flops = traffic.matmul_softmax_flops(r.m, r.k, r.n)
        else:
            u = traffic.linear_act_kernels(r.m, r.k, r.n, e, "triton_unfused")
            f = traffic.linear_act_kernels(r.m, r.k, r.n, e, "triton_fused")
            label = f"{r.precision}, {r.m} × {r.k} × {r.n}, {r.activation}"
            flops = 2 * r.m * r.k * r.n
        out.append(Case(family, label, where, u, f, flops, op_bytes))
    return out


def _fused_method(df: pd.DataFrame, where: dict) -> tuple:
    """(method, K slices) that matmul+softmax's fused kernel ran at a configuration (the row's
    variant; split_k's slices as its plan takes them on the row's GPU), for the traffic model:
    two passes over the logits move what the unfused pair does. (None, 1) without a fused row."""
    from ...kernels.families import matmul_softmax as sr

    fused = _select(df, where)
    fused = fused[fused["impl"] == "triton_fused"]
    if not len(fused) or fused["variant"].iloc[0] not in sr.METHODS:
        return None, 1
    r = fused.iloc[0]
    if r["variant"] != sr.SPLIT_K:
        return r["variant"], 1
    import torch  # only here: the book's other paths never import torch

    dtype = {"float32": torch.float32, "float16": torch.float16,
             "bfloat16": torch.bfloat16}[r["dtype"]]
    kw = {"input_precision": r["precision"]} if r["dtype"] == "float32" else {}
    if pd.notna(r.get("sm_count")):  # (CPU rows have none: the plan's interpreter default)
        kw["sm_count"] = int(r["sm_count"])
    plan = sr.matmul_softmax_plan(int(r["m"]), int(r["k"]), int(r["n"]), dtype,
                                  method=sr.SPLIT_K, **kw)
    return sr.SPLIT_K, plan.splits


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
            predicted = model_ms(case.unfused, bw, peak) / model_ms(case.fused, bw, peak)
            rows.append(dict(family=family, case=case.label, predicted=predicted,
                             measured=t["triton_unfused"] / t["triton_fused"],
                             fused_ms=t["triton_fused"]))
    return pd.DataFrame(rows, columns=["family", "case", "predicted", "measured", "fused_ms"])



# The size each family is summed up at: its largest configuration of the kind the chapter
# headlines (the first of these present in the data is taken).
# Not the fused kernel's rivals: itself, and cuBLAS's matmul alone, which computes less than the op.
NOT_RIVALS = ("triton_fused", "cublas")
# The later entries are for runs that lack the headline size (a smoke grid): their largest case.
HEADLINES = {
    "elementwise": [dict(dtype="float32", z_kind="tensor", n=2**27),
                    dict(dtype="float32", z_kind="tensor"), dict(z_kind="tensor")],
    "softmax": [dict(dtype="float32", width=16384), dict(dtype="float32"), dict()],
    "layernorm": [dict(dtype="float16", direction="fwd", width=16384), dict(direction="fwd")],
    "softmax_matmul": [dict(precision="float16"), dict(precision="tf32"), dict()],
    "attention": [dict(head_dim=128, seq=4096, causal=False), dict(causal=False)],
    "matmul_softmax": [dict(precision="float16", m=4096, k=1024, n=128256),
                       dict(precision="float16")],
    # The family is labelled "linear + GELU": at a size where ReLU's rows tie on FLOPs, GELU's.
    "linear_act": [dict(precision="float16", m=8192, activation="gelu"),
                   dict(precision="float16", activation="gelu"), dict(precision="float16")],
    # Not (yet) in the findings table: the bench's book grid reads its headline from here.
    "linear_cross_entropy": [dict(precision="bfloat16", tokens=8192, hidden=768, vocab=50257),
                             dict()],
    "training": [dict(dtype="bfloat16", rows=4096, width=1024), dict()],
}
FAMILY_LABEL = {
    "elementwise": "add-mul", "softmax": "softmax", "layernorm": "LayerNorm fwd",
    "softmax_matmul": "softmax(X) @ V", "attention": "attention fwd",
    "matmul_softmax": "matmul + softmax", "linear_act": "linear + GELU",
}


def headline(family: str, df: pd.DataFrame) -> Case | None:
    """The family's headline case: the first HEADLINES entry the data has, at its largest size
    where the entry leaves the size open."""
    cases = cases_of(family, df)
    for want in HEADLINES[family]:
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
            rows.append(dict(family=FAMILY_LABEL[family], precision=r.precision,
                             intensity=r.flops_model / r.bytes_model,
                             tflops=r.flops_model / r.t / 1e9,
                             copy_gbps=R.limit(limits, "copy_bw", run_id=r.run_id),
                             peak=peak_of(limits, r.precision, r.run_id)))
    return pd.DataFrame(rows)


def accuracy_table(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The worst max |out - ref| / max |ref| against float64, per family, precision and impl, over
    every configuration that ran."""
    parts = []
    for family, df in frames.items():
        ok = df[df["status"] == "ok"].dropna(subset=["max_rel_err"])
        parts.append(ok.assign(family=FAMILY_LABEL[family]))
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



# What matmul + softmax's `store_softmax` method is, wherever a chapter says the plan took it.
