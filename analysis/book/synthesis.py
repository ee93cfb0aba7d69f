"""The synthesis chapter's numbers: every family at its headline size, the roofline model's
predicted speedup of fusion against the measured one, and each implementation's distance to the
machine's limits. The chapters of the families use `distance_table` for their own cases.

Times are device times (`ms_device`: CUDA-graph replay, L2 flushed before each call) where the row
has one, else the per-call median: the model predicts the GPU's work, not the host's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd


from . import data as R
from .. import traffic
from ..schema import PEAK_PRECISION

# Whole implementations of an op by a library: SDPA's backends, cuBLASLt's matmul with the
# activation in its epilogue, the peer Triton libraries (cuBLAS rows are the matmul alone: a
# reference point, not an implementation of the fused op).
LIBRARIES = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "cublaslt", "liger", "flag_gems")


def device_time(df: pd.DataFrame) -> pd.Series:
    """ms per call of each row: the device time where measured, else the per-call median."""
    if "ms_device" not in df:
        return df["ms_median"]
    return df["ms_device"].fillna(df["ms_median"])


def peak_of(limits: pd.DataFrame, precision: str, run_id: str) -> float:
    return R.limit(limits, "matmul_peak", PEAK_PRECISION.get(precision, precision), run_id=run_id)


def model_ms(kernels: list[traffic.Kernel], copy_gbps: float, peak_tflops: float) -> float:
    """The roofline model of a chain of kernels: each kernel takes max(bytes / bandwidth,
    FLOPs / peak), and the chain the sum over its launches (ms)."""
    return sum(max(k.total / copy_gbps / 1e6, k.flops / peak_tflops / 1e9 if k.flops else 0.0)
               for k in kernels)


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
    from ...kernels import softmax_regression as sr

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


def model_fit(pvm: pd.DataFrame) -> dict:
    """How the measured speedups sit against the model's: how many within a quarter of it, and
    those below (measured under 0.8 of predicted) and above (over 1.25): how many, per family,
    and the farthest, with its ratio."""
    ratio = pvm["measured"] / pvm["predicted"] if len(pvm) else pd.Series(dtype=float)

    def describe(sel, farthest):
        if not len(sel):
            return "none"
        counts = sel.groupby("family").size().sort_values(ascending=False)
        r = sel.loc[farthest(ratio[sel.index])]
        return (f"{len(sel)} ({', '.join(f'{FAMILY_LABEL[k]} {n}' for k, n in counts.items())};"
                f" the farthest {FAMILY_LABEL[r['family']]} {r['case']} at "
                f"{r['measured'] / r['predicted']:.2f}×)")

    return dict(close=int(ratio.between(0.8, 1.25).sum()),
                below=describe(pvm[ratio < 0.8], pd.Series.idxmin),
                above=describe(pvm[ratio > 1.25], pd.Series.idxmax))


# The size each family is summed up at: its largest configuration of the kind the chapter
# headlines (the first of these present in the data is taken).
HEADLINES = {
    "elementwise": [dict(dtype="float32", z_kind="tensor", n=2**27)],
    "softmax": [dict(dtype="float32", width=16384)],
    "layernorm": [dict(dtype="float16", direction="fwd", width=16384)],
    "softmax_matmul": [dict(precision="float16"), dict(precision="tf32")],
    "attention": [dict(head_dim=128, seq=4096, causal=False)],
    "matmul_softmax": [dict(precision="float16", m=4096, k=1024, n=128256),
                       dict(precision="float16")],
    # The family is labelled "linear + GELU": at a size where ReLU's rows tie on FLOPs, GELU's.
    "linear_act": [dict(precision="float16", m=8192, activation="gelu"),
                   dict(precision="float16", activation="gelu"), dict(precision="float16")],
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


def headline_table(frames: dict[str, pd.DataFrame], limits: pd.DataFrame) -> pd.DataFrame:
    """Per family at its headline size: bytes and launches unfused/fused (model), arithmetic
    intensity, and the fused kernel's measured speedup over each baseline (their time / ours)."""
    rows = []
    for family, df in frames.items():
        case = headline(family, df)
        if case is None:
            continue
        t = times_of(df, case.where)
        fused = t["triton_fused"]
        libs = {k: v for k, v in t.items() if k in LIBRARIES}
        best_lib = min(libs, key=libs.get) if libs else None
        rows.append({
            "family": FAMILY_LABEL[family], "case": case.label,
            "MB unfused": traffic.total(case.unfused) / 1e6,
            "MB fused": traffic.total(case.fused) / 1e6,
            "launches unfused": len(case.unfused), "launches fused": len(case.fused),
            "FLOP/byte": case.intensity,
            "fused ms": fused,
            "vs Triton unfused": t.get("triton_unfused", np.nan) / fused,
            "vs eager": t.get("torch_eager", np.nan) / fused,
            "vs torch.compile": t.get("torch_compile", np.nan) / fused,
            "vs best library": libs[best_lib] / fused if best_lib else np.nan,
            "best library": R.IMPL_LABEL.get(best_lib, "none measured") if best_lib else "none measured",
            "_family": family,
        })
    return pd.DataFrame(rows)


def headline_display(table: pd.DataFrame) -> pd.DataFrame:
    """The headline table as the chapter shows it: bytes and launches as "unfused → fused", the
    speedups (their time / ours), the library named beside its speedup."""
    def speed(v):
        return "—" if v != v else f"{v:.2f}"

    return pd.DataFrame({
        "family": table["family"],
        "case": table["case"],
        "MB": [f"{u:,.0f} → {f:,.0f}" for u, f in zip(table["MB unfused"], table["MB fused"])],
        "launches": [f"{u} → {f}" for u, f in zip(table["launches unfused"], table["launches fused"])],
        "FLOP/B": [f"{v:.3g}" if v < 100 else f"{v:,.0f}" for v in table["FLOP/byte"]],
        "× unfused": table["vs Triton unfused"].map(speed),
        "× eager": table["vs eager"].map(speed),
        "× compile": table["vs torch.compile"].map(speed),
        "× library": [speed(v) + ("" if v != v else f" ({name})")
                      for v, name in zip(table["vs best library"], table["best library"])],
    })


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
    order = [c for c in R.IMPL_ORDER if c in t.columns] + [c for c in t.columns if c not in R.IMPL_ORDER]
    t = t[order]
    t.columns = [R.SHORT_LABEL.get(c, c) for c in t.columns]
    return t


# A baseline "wins" when our time exceeds its by more than run-to-run noise (rows over 50 us
# re-measured within 0.965-1.010 on the same H100 kind).
LOSS = 0.97


def conclusions(table: pd.DataFrame) -> dict[str, str]:
    """Sentences from the headline table: where fusion pays, where torch.compile already fuses
    it, where a library is already fused, where our kernel loses and by how much."""
    def names(sel, column):
        return ", ".join(f"{r.family} ({getattr(r, column):.2f}×)" for r in sel.itertuples()) or "none"

    t = table.rename(columns=lambda c: c.replace(" ", "_").replace(".", "_"))
    pays = t[(t["vs_Triton_unfused"] > 1.1) & (t["vs_eager"] > 1.0)]
    compiled = t[t["vs_torch_compile"].between(0.9, 1.1) | (t["vs_torch_compile"] < 0.9)]
    library = t[t["vs_best_library"] < LOSS]  # ahead by more than the noise, as losses are
    baselines = {"eager": "vs_eager", "torch.compile": "vs_torch_compile"}
    losses = []
    for r in t.itertuples():
        speed = {name: getattr(r, col) for name, col in baselines.items()}
        if r.best_library != "none measured":
            speed[r.best_library] = r.vs_best_library
        name = min(speed, key=lambda k: speed[k] if speed[k] == speed[k] else math.inf)
        if speed[name] < LOSS:  # their time over ours
            losses.append(f"{r.family} ({name} {1 / speed[name]:.2f}× faster)")
    return dict(
        pays=names(pays, "vs_Triton_unfused"),
        compile_fuses=names(compiled, "vs_torch_compile"),
        library_ahead=names(library, "vs_best_library"),
        loses=", ".join(losses) or "none",
    )


def distance_table(df: pd.DataFrame, limits: pd.DataFrame, cases: dict[str, dict],
                   impls=("triton_fused",)) -> pd.DataFrame:
    """How far each case is from its floor, one row per case: the floor, max(model bytes / copy
    bandwidth, FLOPs / matmul peak) of the run that measured the case, and for each impl the
    floor as a percentage of its device time (100: at the limit). `cases`: label -> the column
    values that pick the configuration."""
    rows = []
    for label, where in cases.items():
        sel = _select(df, where)
        row = {"case": label, "bound by": "no data", "floor µs": np.nan}
        if len(sel):
            r = sel.iloc[0]
            # The limits of the run that measured this configuration (a multi-GPU bench has one
            # run per GPU, each with its own).
            run = R.run_of(sel)
            bw = R.limit(limits, "copy_bw", run_id=run)
            peak = peak_of(limits, r["precision"], run)
            mem_ms = r["bytes_model"] / bw / 1e6
            flop_ms = r["flops_model"] / peak / 1e9 if peak == peak else 0.0
            floor = max(mem_ms, flop_ms)
            row.update({"bound by": "memory" if mem_ms >= flop_ms else "matmul peak",
                        "floor µs": floor * 1e3})
            t = times_of(df, where)
        for impl in impls:
            row[f"{R.IMPL_LABEL.get(impl, impl)} %"] = (100 * floor / t.get(impl, np.nan)
                                                       if len(sel) else np.nan)
        rows.append(row)
    table = pd.DataFrame(rows)
    # An implementation these data never ran here gets no column of dashes.
    empty = [c for c in table.columns if c.endswith(" %") and table[c].isna().all()]
    return table.drop(columns=empty) if len(table) and len(empty) < len(impls) else table


# What matmul + softmax's `store_softmax` method is, wherever a chapter says the plan took it.
STORE_SOFTMAX_IS = ("the same two kernels as our unfused pair (the matmul into the output, then "
                    "the softmax in place)")


# --- the targets the project set for the compute-bound kernels ---------------------------------


@dataclass(frozen=True)
class Target:
    """A target set for a fused kernel where the math is heavy (the tracker's issue 14), checked
    against the data: `goal` is a number of `unit` or an implementation, whose own figure at the
    configuration is then the goal. Units: "ms" (device time, at most), "ms a call" (the
    per-call median, host included, at most), "TFLOP/s" (over the device time, at least)."""
    family: str
    label: str
    where: dict
    goal: float | str
    unit: str


_SMV = dict(batch=16, d1=2048, d2=8192, d3=512)
_ATTN = dict(dtype="float16", batch=4, seq=4096, causal=False)
TARGETS = (
    Target("softmax_matmul", "softmax(X) @ V 16 × 2048 × 8192 × 512, fp16",
           dict(_SMV, precision="float16"), 0.50, "ms"),
    Target("softmax_matmul", "softmax(X) @ V 16 × 2048 × 8192 × 512, TF32",
           dict(_SMV, precision="tf32"), 1.00, "ms"),
    Target("softmax_matmul", "softmax(X) @ V 16 × 2048 × 8192 × 512, IEEE fp32",
           dict(_SMV, precision="ieee"), 5.9, "ms"),
    Target("matmul_softmax", "matmul + softmax 16384 × 4096 × 4096, fp16",
           dict(m=16384, k=4096, n=4096, precision="float16"), 0.90, "ms"),
    Target("matmul_softmax", "matmul + softmax 8192 × 4096 × 1024, fp16",
           dict(m=8192, k=4096, n=1024, precision="float16"), 0.105, "ms a call"),
    Target("matmul_softmax", "matmul + softmax 4096 × 1024 × 128256 (vocabulary), fp16",
           dict(m=4096, k=1024, n=128256, precision="float16"), 2.6, "ms"),
    Target("linear_act", "linear + GELU 4096³, TF32",
           dict(m=4096, k=4096, n=4096, precision="tf32", activation="gelu"), 0.41, "ms"),
    Target("linear_act", "linear + GELU 8192³, fp16",
           dict(m=8192, k=8192, n=8192, precision="float16", activation="gelu"),
           "torch_compile", "ms"),
    Target("linear_act", "linear + GELU 8192³, bf16",
           dict(m=8192, k=8192, n=8192, precision="bfloat16", activation="gelu"),
           "torch_compile", "ms"),
    Target("attention", "attention fwd B4 H16 S4096 d128, fp16",
           dict(_ATTN, heads=16, head_dim=128), 560.0, "TFLOP/s"),
    Target("attention", "attention fwd B4 H16 S4096 d128, fp16, causal",
           dict(_ATTN, heads=16, head_dim=128, causal=True),
           470.0, "TFLOP/s"),
    Target("attention", "attention fwd B4 H32 S4096 d64, fp16",
           dict(_ATTN, heads=32, head_dim=64), "sdpa_cudnn", "TFLOP/s"),
    Target("attention", "attention fwd B4 H32 S4096 d64, fp16, causal",
           dict(_ATTN, heads=32, head_dim=64, causal=True),
           "sdpa_cudnn", "TFLOP/s"),
)


def _figure(sel: pd.DataFrame, unit: str) -> dict:
    """impl -> its figure at one configuration in `unit` (the best of its rows)."""
    if unit == "ms a call":
        return sel.dropna(subset=["ms_median"]).groupby("impl")["ms_median"].min().to_dict()
    sel = sel.assign(t=device_time(sel)).dropna(subset=["t"])
    if unit == "ms":
        return sel.groupby("impl")["t"].min().to_dict()
    return (sel["flops_model"] / sel["t"] / 1e9).groupby(sel["impl"]).max().to_dict()


def target_table(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per TARGETS entry: the goal, the fused kernel's figure, the best other
    implementation's, and whether the goal is met (None where the data lacks the fused row or
    the implementation named as the goal)."""
    rows = []
    for t in TARGETS:
        df = frames.get(t.family)
        sel = _select(df, t.where) if df is not None and len(df) else None
        fig = _figure(sel, t.unit) if sel is not None else {}
        # The method the fused op's plan took there (matmul + softmax's may be two kernels).
        plan = (sel.loc[sel["impl"] == "triton_fused", "variant"].dropna().astype(str)
                if sel is not None and "variant" in sel else pd.Series(dtype=str))
        ours = fig.get("triton_fused", np.nan)
        goal = fig.get(t.goal, np.nan) if isinstance(t.goal, str) else t.goal
        at_least = t.unit == "TFLOP/s"
        others = {k: v for k, v in fig.items() if k != "triton_fused" and k != "cublas"}
        best = (max if at_least else min)(others, key=others.get) if others else None
        met = None if ours != ours or goal != goal else bool(ours >= goal if at_least
                                                              else ours <= goal)
        rows.append(dict(target=t.label, family=t.family, unit=t.unit,
                         goal_impl=t.goal if isinstance(t.goal, str) else None, goal=goal,
                         fused=ours, method=plan.iloc[0] if len(plan) else None, best_other=best,
                         best_other_value=others[best] if best else np.nan, met=met))
    return pd.DataFrame(rows)


def target_display(table: pd.DataFrame) -> pd.DataFrame:
    """The targets as the chapter shows them: the goal with its unit (and the implementation it
    is taken from), the fused kernel's figure, the best other one, met or not."""
    def num(v, unit, digits=0):
        return ("—" if v != v else f"{v:.{digits}f}" if unit == "TFLOP/s"
                else f"{v:.{3 + digits}g}")

    def fused(v, goal, unit, met):
        # A miss (or a hit) that rounds to the goal gets the digits that tell them apart.
        digits = next((d for d in range(4) if pd.isna(met) or num(v, unit, d) != num(goal, unit, d)),
                      3)
        return num(v, unit, digits)

    goals = []
    for r in table.itertuples():
        sign = "≥" if r.unit == "TFLOP/s" else "≤"
        # pd.isna: pandas 3 holds a missing string as NaN, pandas 2 as None.
        named = "" if pd.isna(r.goal_impl) else f"{R.IMPL_LABEL.get(r.goal_impl, r.goal_impl)}'s "
        goals.append(f"{sign} {named}{num(r.goal, r.unit)} {r.unit}")
    return pd.DataFrame({
        "target": table["target"],
        "goal": goals,
        "Triton fused": [fused(v, g, u, m) for v, g, u, m in zip(table["fused"], table["goal"],
                                                                  table["unit"], table["met"])],
        "best other": ["—" if pd.isna(b) else f"{num(v, u)} ({R.SHORT_LABEL.get(b, b)})"
                       for b, v, u in zip(table["best_other"], table["best_other_value"],
                                          table["unit"])],
        "met": ["no data" if pd.isna(m) else "yes" if m else "no" for m in table["met"]],
    })


def counter_display(counters: pd.DataFrame) -> pd.DataFrame:
    """profile.target_counters' rows as the targets section shows them: the family, whose
    kernel, the total time, then the longest kernel's use of the SM."""
    def num(v, fmt):
        return "—" if v is None or v != v else format(v, fmt)

    rows = []
    for r in counters.to_dict("records"):
        rows.append({
            "op": FAMILY_LABEL.get(r["family"], r["family"]),
            "implementation": R.SHORT_LABEL.get(r["impl"], r["impl"]),
            "kernels": int(r["kernels"]), "µs": num(r["us"], ".0f"),
            "SM %": num(r.get("sm_pct"), ".0f"), "issue %": num(r.get("issue_pct"), ".0f"),
            "cycles / issue": num(r.get("cycles_per_issue"), ".1f"),
            "registers": num(r.get("registers"), ".0f"),
            "occupancy %": num(r.get("occupancy_pct"), ".0f"),
            "smem kB": num(r.get("smem_kb"), ".0f"), "waves": num(r.get("waves"), ".3g")})
    return pd.DataFrame(rows)


def counter_findings(counters: pd.DataFrame) -> dict:
    """Per family with both kernels: our longest kernel's SM throughput and issue-slot use
    against the other's, and our total time over theirs."""
    out = {}
    if counters is None or not len(counters):
        return out
    for family, g in counters.groupby("family", sort=False):
        ours, other = g[g["impl"] == "triton_fused"], g[g["impl"] != "triton_fused"]
        if len(ours) and len(other):
            o, t = ours.iloc[0], other.iloc[0]
            out[family] = dict(other=t["impl"], time_ratio=o["us"] / t["us"],
                               sm=(o.get("sm_pct"), t.get("sm_pct")),
                               issue=(o.get("issue_pct"), t.get("issue_pct")),
                               occupancy=(o.get("occupancy_pct"), t.get("occupancy_pct")))
    return out


def target_findings(table: pd.DataFrame) -> dict:
    """What the chapter says of the targets: how many the data can check and how many are met;
    of the misses, the nearest and the farthest, by how much (our time over the goal's, or the
    goal's rate over ours: above 1)."""
    known = table[table["met"].notna()]
    missed = known[~known["met"].astype(bool)]
    ratio = [r.goal / r.fused if r.unit == "TFLOP/s" else r.fused / r.goal
             for r in missed.itertuples()]
    by_pair = known[known["met"].astype(bool) & (known["method"] == "store_softmax")]
    said = dict(met=int(known["met"].astype(bool).sum()), known=len(known),
                no_data=len(table) - len(known), missed=len(missed), misses="none",
                missed_families=set(missed["family"]),
                met_by_pair=(f"{', '.join(by_pair['target'])}: met by the plan's "
                             f"`store_softmax`, {STORE_SOFTMAX_IS}, the fastest of our methods "
                             "there." if len(by_pair) else ""))
    if len(missed):
        order = np.argsort(ratio)
        near, far = missed.iloc[order[0]], missed.iloc[order[-1]]
        said["misses"] = (f"{len(missed)}, from {near['target']} ({ratio[order[0]]:.2f}× the "
                          f"goal) to {far['target']} ({ratio[order[-1]]:.2f}×)")
    return said


# --- the launch half: per-call cost at tiny sizes (launch_cost.csv) ------------------------------

LAUNCH_IMPLS = {"torch_eager": "eager", "torch_compile": "compile", "triton_unfused": "unfused", "triton_fused": "fused", "public": "kernels.*",
                "registered_op": "torch.ops"}
LAUNCH_OPS = {"add_mul": "add-mul", "softmax": "softmax", "layer_norm": "LayerNorm",
              "layer_norm fwd+bwd": "LayerNorm fwd+bwd", "softmax_matmul": "softmax(X) @ V",
              "attention": "attention", "matmul_softmax": "matmul + softmax",
              "linear_act": "linear + GELU"}
# A call costs "a launch" when it is within this factor of an empty kernel's launch.
LAUNCH_SLACK = 1.25
# The per-call target of a public op's default path at tiny sizes (issue 12), in µs.
LAUNCH_TARGET_US = 25.0


def _launch_ok(lc: pd.DataFrame) -> pd.DataFrame:
    return lc[lc["error"].isna() | (lc["error"].astype(str) == "")]


def launch_table(lc: pd.DataFrame) -> pd.DataFrame:
    """Host µs per call (back-to-back calls) per op and implementation, and the GPU µs of the
    public function's work (graph replay)."""
    ok = _launch_ok(lc)
    ops = ok[ok["op"] != "raw launch"]
    wide = ops.pivot_table(index=["op", "shape"], columns="impl", values="host_us", sort=False)
    out = wide[[c for c in LAUNCH_IMPLS if c in wide]].rename(columns=LAUNCH_IMPLS)
    public = ops[ops["impl"] == "public"].set_index(["op", "shape"])
    out["GPU µs"] = public["gpu_us"]
    if "first_ms" in ops:
        # The Triton fused version runs first in the process, so its first call carries the
        # compilation (the public function's then finds the kernels compiled).
        fused = ops[ops["impl"] == "triton_fused"].set_index(["op", "shape"])["first_ms"]
        out["first call ms"] = fused.reindex(out.index).fillna(public["first_ms"])
    out = out.reset_index()
    # The sizes are in the caption (the table is wide); a second case of one op is marked.
    out["op"] = [LAUNCH_OPS.get(op, op) + _launch_variant(shape)
                 for op, shape in zip(out["op"], out["shape"])]
    return out.drop(columns="shape")


# A second case of an op (its shape says "(...)"): the table's mark for it.
LAUNCH_VARIANTS = {"new length": " (new length)", "nn.Parameter": " (nn.Parameter weights)"}


def _launch_variant(shape: str) -> str:
    if "(" not in shape:
        return ""
    return next((mark for key, mark in LAUNCH_VARIANTS.items() if key in shape),
                " (" + shape[shape.index("(") + 1:].rstrip(")") + ")")


def _launch_spread(ok: pd.DataFrame) -> dict:
    """Trials a row and how far apart its slowest and fastest trial were (max/min): the median
    and the largest ratio over the rows (NaN for a file from before the trials)."""
    if "host_us_max" not in ok or not ok["host_us_min"].notna().any():
        return dict(trials=1, spread_median=float("nan"), spread_max=float("nan"))
    ratio = (ok["host_us_max"] / ok["host_us_min"]).dropna()
    return dict(trials=int(ok["trials"].max()), spread_median=float(ratio.median()),
                spread_max=float(ratio.max()))


def launch_findings(lc: pd.DataFrame) -> dict:
    """The floor (an empty Triton kernel's launch, 1 and 10 arguments), the public functions'
    cost over the 10-argument floor, and which ops are within LAUNCH_SLACK of it."""
    ok = _launch_ok(lc)
    raw = ok[ok["op"] == "raw launch"].set_index("shape")["host_us"]
    # One case per op: the second cases (new length, nn.Parameter weights) are the table's.
    ops = ok[(ok["op"] != "raw launch") & ~ok["shape"].str.contains("(", regex=False)]
    host = ops.pivot_table(index="op", columns="impl", values="host_us", sort=False)
    floor = raw.get("10 args", float("nan"))
    # One call, one launch (or a few): the forward ops; fwd+bwd rows are a training step's part.
    ratio = host.loc[[op for op in host.index if "bwd" not in op], "public"] / floor
    dispatcher = (host["registered_op"] - host["public"]).dropna()
    return dict(floor_1=raw.get("1 arg", float("nan")), floor_10=floor,
                ratio_min=float(ratio.min()), ratio_max=float(ratio.max()),
                within=[op for op, r in ratio.items() if r <= LAUNCH_SLACK],
                under_target=[op for op in ratio.index
                              if host.loc[op, "public"] <= LAUNCH_TARGET_US],
                over_target={op: float(host.loc[op, "public"]) for op in ratio.index
                             if host.loc[op, "public"] > LAUNCH_TARGET_US},
                n_ops=int(ratio.notna().sum()), n_cases=len(host.index),
                eager_faster=[op for op in host.index
                              if host.loc[op, "torch_eager"] < host.loc[op, "public"]],
                dispatcher_us=float(dispatcher.median()) if len(dispatcher) else float("nan"),
                sdpa_us=float(host.loc["attention", "sdpa"]) if "sdpa" in host
                and "attention" in host.index else float("nan"),
                eager_attention_us=float(host.loc["attention", "torch_eager"])
                if "attention" in host.index else float("nan"),
                **_launch_spread(ok),
                commit=str(lc["git_commit"].iloc[0]), gpu=str(lc["gpu"].iloc[0]),
                date=str(lc["started_at"].iloc[0])[:10], torch=str(lc["torch"].iloc[0]),
                triton=str(lc["triton"].iloc[0]))


# --- several GPUs ------------------------------------------------------------------------------

MEMORY_BOUND_FLOP_PER_BYTE = 10  # below this a family's headline is bound by bandwidth
GPU_COLUMNS = ["gpu", "copy GB/s", "family", "case", "FLOP/byte", "fused ms",
               "vs Triton unfused", "vs eager", "_family"]


def gpu_comparison(folders: list) -> pd.DataFrame:
    """Per results folder (one GPU each) and family measured there (never the reference's rows
    that `R.load` falls back to): the GPU, its measured copy bandwidth, and the fused kernel's
    time and speedups at the family's headline size."""
    rows = []
    for folder in folders:
        limits = R.load_limits(folder)
        latest = pd.read_parquet(folder / "limits.parquet", columns=["run_id"])["run_id"].max()
        gpu, copy_bw = R.gpu_of(folder), R.limit(limits, "copy_bw", "ieee", latest)
        frames = {}
        for name in FAMILY_LABEL:
            df = R.load(folder, name)
            if len(df) and not df.attrs["from_reference"] and not df.attrs["on_cpu"]:
                frames[name] = df
        for _, t in headline_table(frames, limits).iterrows():
            rows.append({"gpu": gpu, "copy GB/s": copy_bw,
                         **{k: t[k] for k in GPU_COLUMNS[2:]}})
    return pd.DataFrame(rows, columns=GPU_COLUMNS)


def gpu_comparison_display(cmp: pd.DataFrame) -> pd.DataFrame:
    """One row per family and case, one column group per GPU: fused ms and the speedup over the
    unfused Triton version and over eager."""
    out = None
    for gpu, g in cmp.groupby("gpu", sort=False):
        cols = g.set_index(["family", "case"])[["fused ms", "vs Triton unfused", "vs eager"]]
        cols.columns = [f"{c} ({R.gpu_label(gpu)})" for c in
                        ("fused ms", "× unfused", "× eager")]
        out = cols if out is None else out.join(cols, how="inner")
    return pd.DataFrame() if out is None else out.reset_index()


def bandwidth_finding(cmp: pd.DataFrame) -> str:
    """Does fusion pay more where bandwidth is higher? The memory-bound families' fused-over-
    unfused speedup on the GPU with the higher copy bandwidth against the other, from the data."""
    gpus = cmp.drop_duplicates("gpu").sort_values("copy GB/s")
    if len(gpus) < 2 or gpus["copy GB/s"].isna().any():
        return ("One GPU in this render: `make render RESULTS=\"a b\"` with results folders of "
                "two GPUs compares them here.")
    low, high = gpus.iloc[0], gpus.iloc[-1]
    mb = cmp[cmp["FLOP/byte"] < MEMORY_BOUND_FLOP_PER_BYTE]
    both = mb.pivot_table(index="family", columns="gpu", values="vs Triton unfused")
    both = both.dropna(subset=[low["gpu"], high["gpu"]]) if len(both) else both
    head = (f"{high['gpu']} copies at {high['copy GB/s']:,.0f} GB/s, {low['gpu']} at "
            f"{low['copy GB/s']:,.0f} ({high['copy GB/s'] / low['copy GB/s']:.2f}×).")
    if not len(both):
        return head + " No memory-bound family was measured on both."
    ratio = both[high["gpu"]] / both[low["gpu"]]
    parts = ", ".join(f"{fam} {both.loc[fam, low['gpu']]:.2f}× → {both.loc[fam, high['gpu']]:.2f}×"
                      for fam in both.index)
    same = 0.95 <= ratio.median() <= 1.05
    verdict = ("pays about as much on both" if same else
               "pays more on the faster memory" if ratio.median() > 1.05 else
               "pays less on the faster memory")
    why = ("Both versions are bound by the same bandwidth, so the bytes fusion removes are worth "
           "the same share of the time on either GPU; the time saved shrinks with the bandwidth."
           if same else
           "The model expects the same ratio on both (both versions are bound by the same "
           "bandwidth): a difference says that one of them falls short of the bandwidth on one "
           "GPU (launch costs at small sizes, a plan tuned on the other GPU).")
    return (f"{head} Over the unfused Triton version, the memory-bound fused kernels went "
            f"{parts} (lower → higher bandwidth): fusion {verdict} (median ratio "
            f"{ratio.median():.2f}). {why}")


# Not an implementation of the fused op: cuBLAS's matmul alone computes less than the op.
NOT_COMPETING = ("triton_fused", "cublas")
PLACE_TIE = 1.05  # within 5% of the fastest holds its place: a few percent is trial spread
# Every op of a family's file counts (the backward's too), so the family's name alone.
PLACE_LABEL = {**FAMILY_LABEL, "layernorm": "LayerNorm", "attention": "attention"}
PLACE_COLUMNS = ["family", "GPU", "cases", "held", "median fused / best",
                 "farthest behind (fused / best, the best)"]


def _case_label(row: pd.Series, shape: list[str]) -> str:
    """op, dtype (and precision where it is not the dtype's own), the shape's sizes joined by ×
    (grouped heads and KV-cache keys only where they differ from the queries'), and its words."""
    same_as = {"kv_heads": "heads", "seq_k": "seq"}
    dims, words = [], []
    for col in shape:
        v = row.get(col)
        if v is None or (isinstance(v, float) and math.isnan(v)) or col == "direction":
            continue
        if col in same_as and v == row.get(same_as[col]):
            continue
        if isinstance(v, (bool, np.bool_)):
            words += ["causal"] if v else []
        elif isinstance(v, str):
            words.append(v)
        else:
            dims.append(str(int(v)))
    dtype = R.SHORT_DTYPE.get(row["dtype"], row["dtype"])
    if row.get("precision") not in (None, "ieee", row["dtype"]):
        dtype += f" {row['precision']}"
    return " ".join(filter(None, [row["op"], dtype, "×".join(dims), " ".join(words)]))


def place_against_best(folders: list) -> pd.DataFrame:
    """Per GPU (results folder) and family: every case of the size sweep measured there (each
    op, dtype, precision and shape; the folder's own rows, never the reference's), the fused
    kernel's device time against the fastest other implementation of the same case (eager, both
    torch.compile modes, the unfused Triton version, the libraries): how many cases it is fastest
    or within PLACE_TIE of the fastest, the median ratio, and the case where it is farthest."""
    from .schema import FAMILY_SHAPES

    gpus = {folder: R.gpu_label(R.gpu_of(folder)) for folder in folders}
    rows = []
    for family, label in PLACE_LABEL.items():
        for folder, gpu in gpus.items():
            path = Path(folder) / f"{family}.parquet"
            if not path.exists():
                continue
            df = R._rows_of(path, family, None)
            df = df[(df["status"] == "ok") & (df["sweep"] == "size")]
            if not len(df) or R.on_cpu(df):
                continue
            shape = list(FAMILY_SHAPES[family])
            df = df.assign(_t=device_time(df))
            ratios = []
            for _, case in df.groupby(["op", "dtype", "precision"] + shape, dropna=False,
                                      sort=False):
                fused = case[case["impl"] == "triton_fused"]["_t"].dropna()
                others = case[~case["impl"].isin(NOT_COMPETING)].dropna(subset=["_t"])
                if not len(fused) or not len(others):
                    continue
                best = others.loc[others["_t"].idxmin()]
                ratios.append((fused.min() / best["_t"], best["impl"], _case_label(best, shape)))
            if not ratios:
                continue
            r = pd.DataFrame(ratios, columns=["ratio", "impl", "case"])
            worst = r.loc[r["ratio"].idxmax()]
            rows.append({"family": label, "GPU": gpu, "cases": len(r),
                         "held": int((r["ratio"] <= PLACE_TIE).sum()),
                         "median fused / best": r["ratio"].median(),
                         "farthest behind (fused / best, the best)":
                             f"{worst['case']} ({worst['ratio']:.2f}×, "
                             f"{R.SHORT_LABEL.get(worst['impl'], worst['impl'])})"})
    return pd.DataFrame(rows, columns=PLACE_COLUMNS)


def place_finding(place: pd.DataFrame) -> str:
    """One sentence per GPU from `place_against_best`: the share of cases the fused kernel holds."""
    if not len(place):
        return "No size sweep with a fused kernel in these results."
    parts = []
    for gpu, g in place.groupby("GPU", sort=False):
        held, n = int(g["held"].sum()), int(g["cases"].sum())
        parts.append(f"on the {gpu} at {held} of {n} cases ({100 * held / n:.0f}%)")
    return ("Against the fastest other implementation of each case measured (device time), the "
            f"fused kernel is fastest or within {PLACE_TIE - 1:.0%} " + "; ".join(parts) + ".")
