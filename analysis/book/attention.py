"""Chapter "From online softmax to attention": softmax(X) @ V, attention forward, forward +
backward, decoding. model -> measurement -> meaning: what the
stored (d1, d2) or (seq, seq) matrix costs in bytes against the products' FLOPs; the time (device
time) against the strongest libraries; the memory the online softmax saves."""
from __future__ import annotations

import pandas as pd

from ..model import traffic
from . import cases as C
from . import data as D
from . import figures
from .model import timings as model_timings

PRECISION_LABEL = {"ieee": "IEEE fp32", "tf32": "TF32", "float16": "fp16", "bfloat16": "bf16"}
SDPA = ["sdpa_flash", "sdpa_cudnn", "sdpa_efficient"]
# The shape the chapter quotes: the usual head size and a sequence long enough to leave the
# launch behind (where the data lack them, the largest they hold).
HEAD_DIM, SEQ = 128, 4096
NAN = float("nan")


def _with_rate(rows: pd.DataFrame) -> pd.DataFrame:  # TFLOP/s over t_ms (device time)
    return rows.assign(tflops_t=rows["flops_model"] / rows["t_ms"] / 1e9 if len(rows) else NAN)


def _pick(values, preferred):  # the preferred value where present, else the largest
    return preferred if preferred in set(values) else max(values)


def _fastest_other(t: dict):  # the fastest impl that is not one of ours
    return min((k for k in t if not k.startswith("triton_")), key=t.get, default=None)


def compute(folders: list) -> dict:
    folder = folders[0]
    limits, smm = D.load_limits(folder), D.load(folder, "softmax_matmul")
    fwd = D.load(folder, "attention")
    smm_t, fwd_t, train_t = (_with_rate(D.timed(df)) for df in (
        smm, fwd, D.load(folder, "attention", op="attention_fwd_bwd")))
    dec_t = D.timed(D.load(folder, "attention", op="attention_decode"))
    table = _traffic_table(smm, fwd, limits)
    say = _smm_sentences(smm, smm_t, table)
    say["smm_seed"] = _seed(folder, smm_t)
    say.update(_fwd_sentences(fwd, fwd_t))
    kernels = _kernel_rates(fwd, fwd_t)
    say["gluon"] = _gluon_sentence(kernels)
    decode = _decode_table(dec_t)
    toy = D.toy(fwd_t[fwd_t["impl"] == "triton_fused"]["t_ms"].max() if len(fwd_t) else NAN)
    say.update(train=_train_sentence(train_t, toy), decode=_decode_sentence(dec_t, decode, limits))
    say.update(_meaning(smm_t, fwd_t, folder))
    head = (lambda df: df[df["head_dim"] == _pick(df["head_dim"], HEAD_DIM)] if len(df) else df)
    peak = (lambda df, p: C.peak_of(limits, p, D.runs_of(df)) if len(df) else NAN)
    return dict(traffic=table, smm=smm_t, fwd=head(fwd_t), train=head(train_t),
                smm_peaks={p: peak(smm, p) for p in ("ieee", "tf32")},
                peak16=peak(fwd, "float16"), decode=_decode_display(decode),
                gluon=_kernel_display(kernels), say=say, behind_cudnn=_behind_cudnn(fwd_t))


def _behind_cudnn(fwd: pd.DataFrame) -> bool:
    """Whether the chapter's why (ours beats FlashAttention-2 and trails cuDNN: a schedule) fits
    the data: at the chapter's head size, past toy sizes, the median speedups say so."""
    cudnn, fa2 = (_vs(fwd, HEAD_DIM, i) if len(fwd) else pd.Series(dtype=float)
                  for i in ("sdpa_cudnn", "sdpa_flash"))
    fused = fwd[fwd["impl"] == "triton_fused"]["t_ms"].max() if len(fwd) else NAN
    return bool(len(cudnn) and len(fa2) and cudnn.median() < 1 < fa2.median()
                and not D.toy(fused))


# --- the model ------------------------------------------------------------------------------

def _smm_shape(df: pd.DataFrame):
    """(batch, d1, d3) of the size sweep: the most frequent (one in every grid so far)."""
    rows = df[df["sweep"] == "size"]
    return tuple(map(int, rows[["batch", "d1", "d3"]].value_counts().index[0])) if len(rows) \
        else None


def _attn_row(df: pd.DataFrame):
    """A row (any impl: only its shape is read) of the quoted shape, HEAD_DIM and SEQ."""
    rows = D.ok_rows(df) if len(df) else df
    if not len(rows):
        return None
    hd = _pick(rows["head_dim"], HEAD_DIM)
    seq = _pick(rows[rows["head_dim"] == hd]["seq"], SEQ)
    return rows[(rows["head_dim"] == hd) & (rows["seq"] == seq)].iloc[0]


def _traffic_cases(smm: pd.DataFrame, fwd: pd.DataFrame) -> list:
    """(label, precision, where, rows, unfused kernels, fused kernels, FLOPs): softmax(X) @ V at
    its largest d2 per precision, attention forward (non-causal) at the quoted shape."""
    out = []
    shape, ok = _smm_shape(smm), (D.ok_rows(smm) if len(smm) else smm)
    for precision in ("ieee", "tf32", "float16"):
        sel = ok[ok["precision"] == precision] if shape else ok.iloc[:0]
        if len(sel):
            (b, d1, d3), d2 = shape, int(sel["d2"].max())
            e = 4 if sel["dtype"].iloc[0] == "float32" else 2
            out.append((f"softmax(X) @ V, {PRECISION_LABEL[precision]}", precision,
                        dict(precision=precision, batch=b, d1=d1, d2=d2, d3=d3), smm,
                        *(traffic.softmax_matmul_kernels(b, d1, d2, d3, e, i)
                          for i in ("triton_unfused", "triton_fused")),
                        traffic.softmax_matmul_flops(b, d1, d2, d3)))
    r = _attn_row(fwd)
    if r is not None:
        b, h, n, hd = int(r["batch"]), int(r["heads"]), int(r["seq"]), int(r["head_dim"])
        e = 4 if r["dtype"] == "float32" else 2
        out.append((f"attention, {PRECISION_LABEL.get(r['precision'], r['precision'])}",
                    r["precision"], dict(head_dim=hd, seq=n, causal=False, batch=b, heads=h), fwd,
                    *(traffic.attention_kernels(b, h, n, hd, e, i)
                      for i in ("triton_unfused", "triton_fused")),
                    traffic.attention_flops(b, h, n, hd, False)))
    return out


def _traffic_table(smm, fwd, limits) -> pd.DataFrame:
    """Per case: bytes and FLOPs, the fused kernel's roofline floor against its device time, and
    the speedup over the unfused Triton version the model allows against the one measured."""
    rows = []
    for label, precision, where, df, unfused, fused, flops in _traffic_cases(smm, fwd):
        sel = C._select(df, where)
        runs = D.runs_of(sel) if len(sel) else None
        bw = D.limit(limits, "copy_bw", run_id=runs) if runs else NAN
        peak = C.peak_of(limits, precision, runs) if runs else NAN
        t = C.times_of(df, where)
        rows.append({
            "case": label, "GB unfused → fused": " → ".join(
                D.num(traffic.total(k) / 1e9) for k in (unfused, fused)),
            "GFLOP": flops / 1e9, "floor ms": C.model_ms(fused, bw, peak),
            "fused ms": t.get("triton_fused", NAN),
            "model ×": C.model_ms(unfused, bw, peak) / C.model_ms(fused, bw, peak),
            "measured ×": t.get("triton_unfused", NAN) / t.get("triton_fused", NAN)})
    return pd.DataFrame(rows)


# --- softmax(X) @ V -------------------------------------------------------------------------

def _smm_at(rows: pd.DataFrame, precision: str):
    """(largest d2, impl -> device time there) of one precision; (None, {}) where absent."""
    sel = rows[rows["precision"] == precision] if len(rows) else rows
    d2 = int(sel["d2"].max()) if len(sel) else None
    return d2, (D.times(sel[sel["d2"] == d2]) if len(sel) else {})


def _ms(ms: float) -> str:  # a time with its digits: "7.13 ms", "9.44 µs"
    return f"{ms:.2f} ms" if ms >= 0.1 else f"{D.num(1000 * ms)} µs"


def _smm_vs(rows: pd.DataFrame, precision: str) -> str:
    """The fused kernel against the fastest other version, and the unfused pair against it."""
    d2, t = _smm_at(rows, precision)
    best = _fastest_other(t)
    if "triton_fused" not in t or best is None:
        return D.lacking(f"{PRECISION_LABEL[precision]} softmax(X) @ V rows of the fused kernel "
                         "and PyTorch")
    ratio = t["triton_fused"] / t[best]
    return (f"In {PRECISION_LABEL[precision]} at d2 = {d2:,} the fused kernel takes "
            f"{_ms(t['triton_fused'])} of device time against {_ms(t[best])} for "
            f"{D.IMPL_LABEL[best]}, the fastest other version: "
            + f"a speedup of {1 / ratio:.2f}×"
            + (f"; the same computation as two Triton kernels takes "
               f"{t['triton_unfused'] / t['triton_fused']:.2f}× the fused kernel's time (its "
               "speedup over them)"
               if "triton_unfused" in t else "") + ".")


def _smm_sentences(smm: pd.DataFrame, rows: pd.DataFrame, table: pd.DataFrame) -> dict:
    shape = _smm_shape(smm)
    say = {k: _smm_vs(rows, p) for k, p in (("smm_ieee", "ieee"), ("smm_tf32", "tf32"),
                                            ("smm_half", "float16"))}
    if shape is None or not len(rows):
        return dict(say, **dict.fromkeys(("smm_model", "smm_why", "smm_memory"),
                                         D.lacking("timed softmax(X) @ V rows")))
    (b, d1, d3), d2 = shape, int(rows["d2"].max())
    model = dict(zip(table["case"], zip(table["model ×"], table["measured ×"]))) \
        if len(table) else {}
    ieee, tf32 = (model.get(f"softmax(X) @ V, {p}", (NAN, NAN)) for p in ("IEEE fp32", "TF32"))
    say["smm_model"] = (
        f"At batch {b}, d1 = {d1:,}, d3 = {d3} and d2 = {d2:,} (float32), P is "
        f"{b * d1 * d2 * 4 / 2**20:,.0f} MiB, written once and read once more, around a product "
        f"of {traffic.softmax_matmul_flops(b, d1, d2, d3) / 1e9:,.0f} GFLOP. "
        + (f"The model's ceiling on fusion's gain is {ieee[0]:.2f}× in IEEE float32 and "
           f"{tf32[0]:.2f}× in TF32: on the CUDA cores (IEEE) the FLOPs dwarf P's bytes, on "
           "TF32 tensor cores the two weigh about the same." if ieee[0] == ieee[0]
           and tf32[0] == tf32[0] else
           D.lacking("measured copy bandwidth and matmul peaks of the run for the model")))
    loses = [p for p in ("ieee", "tf32") if "triton_fused" in (t := _smm_at(rows, p)[1])
             and t["triton_fused"] > min(t.values())]
    say["smm_why"] = (
        (f"The unfused pair's {tf32[1]:.2f}× in TF32 is more than the model's {tf32[0]:.2f}×: "
         "its own Triton matmul is slower than the fused kernel's. " if tf32[1] > 1.1 * tf32[0]
         else "")
        + ("Eager and torch.compile both call cuBLAS for the product (torch.compile does not "
           "fuse a softmax into a matmul), and in float32 cuBLAS multiplies faster than the "
           "code Triton generates inside the fused kernel: the bytes of P saved do not make up "
           "for it." if loses else "In float32 the fused kernel is the fastest version measured."))
    peaks = rows[(rows["precision"] == "ieee") & (rows["d2"] == d2)].groupby("impl")[
        "peak_mib"].max().dropna()
    say["smm_memory"] = (
        f"The fused kernel's peak memory above the inputs is {peaks['triton_fused']:,.0f} MiB, "
        f"the {b * d1 * d3 * 4 / 2**20:,.0f} MiB output and nothing more; eager needs "
        f"{peaks['torch_eager']:,.0f} MiB at d2 = {d2:,}"
        + (f", torch.compile {peaks['torch_compile']:,.0f}" if "torch_compile" in peaks else "")
        + ": they hold P." if {"triton_fused", "torch_eager"} <= set(peaks.index) else
        D.lacking(f"peak memory of the fused kernel and eager at d2 = {d2}"))
    if D.toy(rows[rows["impl"] == "triton_fused"]["t_ms"].max()):
        # Toy sizes: P's bytes against the FLOPs, cuBLAS's speed, memory: all a launch's.
        say.update(smm_model="", smm_why="", smm_memory="")
    return say


def _seed(folder, rows: pd.DataFrame) -> str:
    """Does the problem's own protocol (CUDA events, no L2 flush) rank fused and eager alike?"""
    path = D.data_file(folder, "seed002.parquet")  # softmax_matmul rows of a run of their own
    seed = pd.read_parquet(path) if path.exists() else pd.DataFrame()
    seed = seed[seed["status"] == "ok"].dropna(subset=["ms_median"]) if len(seed) else seed
    if not len(seed) or not len(rows) or D.on_cpu(seed):
        return D.lacking("timings of softmax(X) @ V under its own protocol")
    d2, out = int(min(seed["d2"].max(), rows["d2"].max())), []
    for precision in ("ieee", "tf32"):
        own = seed[(seed["precision"] == precision) & (seed["d2"] == d2)].groupby("impl")[
            "ms_median"].min()
        t = D.times(rows[(rows["precision"] == precision) & (rows["d2"] == d2)])
        if {"triton_fused", "torch_eager"} <= set(own.index) & set(t):
            out.append((PRECISION_LABEL[precision], own["triton_fused"] / own["torch_eager"],
                        t["triton_fused"] / t["torch_eager"]))
    if not out:
        return D.lacking(f"fused and eager timings at d2 = {d2} in both protocols")
    agree = all((a > 1) == (b > 1) for _, a, b in out)
    return ("The problem's own timing protocol (CUDA events, no L2 flush, the best of the fused "
            f"kernel's block sizes) {'agrees' if agree else 'disagrees'}: at d2 = {d2:,} the "
            "fused kernel takes " + " and ".join(f"{a:.2f}× eager's time in {p} (the sweep: "
                                                 f"{b:.2f}×)" for p, a, b in out) + ".")


# --- attention forward ------------------------------------------------------------------------

def _vs(rows: pd.DataFrame, hd: int, theirs) -> pd.Series:
    """Their time (the fastest of `theirs`, an impl or a list) over the fused kernel's per (seq,
    causal) at one head_dim: above 1, ours is faster."""
    t = rows[rows["head_dim"] == hd].pivot_table(index=["seq", "causal"], columns="impl",
                                                 values="t_ms", aggfunc="min")
    theirs = [i for i in ([theirs] if isinstance(theirs, str) else theirs) if i in t]
    if "triton_fused" not in t or not theirs:
        return pd.Series(dtype=float)
    return (t[theirs].min(axis=1) / t["triton_fused"]).dropna()


def _vs_text(r: pd.Series, whose: str) -> str:
    ahead, n = (r > 1).sum(), len(r)
    where = (f"ahead at {ahead} of {n} points" if 0 < ahead < n else
             ("ahead" if ahead else "behind") + (f" at all {n} points" if n > 1 else ""))
    return f"{D.ratio_range(r)} {whose} speed ({where})"


def _fwd_sentences(fwd: pd.DataFrame, rows: pd.DataFrame) -> dict:
    r = _attn_row(fwd)
    if r is None or not len(rows):
        return dict.fromkeys(("attn_model", "attn_fwd", "attn_dims", "attn_compile", "attn_memory"),
                             D.lacking("timed attention forward rows"))
    b, h, n, hd = int(r["batch"]), int(r["heads"]), int(r["seq"]), int(r["head_dim"])
    e = 4 if r["dtype"] == "float32" else 2
    naive, unfused, fused = (traffic.total(traffic.attention_kernels(b, h, n, hd, e, i)) / 1e9
                             for i in ("torch_eager", "triton_unfused", "triton_fused"))
    say = dict(attn_model=(
        f"At head_dim {hd} and {n:,} tokens per sequence (batch {b}, {h} heads) the scores are "
        f"{b * h * n * n * e / 2**30:.1f} GiB. Stored, they make the unfused version move "
        f"{unfused:.2f} GB (the naive PyTorch code, which also scales them in a kernel of its own, "
        f"{naive:.1f} GB) against {fused:.2f} GB fused, for "
        f"{traffic.attention_flops(b, h, n, hd, False) / 1e9:,.0f} GFLOP: fused, attention is "
        "bound by the tensor cores, not by memory."))
    at = rows[(rows["head_dim"] == hd) & (rows["seq"] == n)]
    toy = D.toy(at[(at["impl"] == "triton_fused") & ~at["causal"].astype(bool)]["t_ms"].min())
    if toy:  # a toy size: its rates, bytes and memory are a launch's, not attention's
        say["attn_model"] = ""
    rate = {c: at[at["causal"] == c].groupby("impl")["tflops_t"].max() for c in (False, True)}
    if all("triton_fused" in rate[c] for c in rate):
        def pair(impl):
            return " / ".join(f"{rate[c][impl]:.0f}" if impl in rate[c] else "—" for c in rate)
        parts = [f"Over device time at head_dim {hd} and {n:,} tokens, the Triton kernel reaches "
                 f"{pair('triton_fused')} TFLOP/s (non-causal / causal)"]
        parts += [f"{D.IMPL_LABEL[k]} {pair(k)}" for k in ("sdpa_flash", "sdpa_cudnn", "flag_gems")
                  if any(k in rate[c] for c in rate)]
        sweep = [_vs_text(v, w) for v, w in ((_vs(rows, hd, "sdpa_cudnn"), "cuDNN's"),
                                             (_vs(rows, hd, "sdpa_flash"), "FlashAttention-2's"))
                 if len(v)]
        say["attn_fwd"] = ("" if toy else ", ".join(parts) + ". ") + (
            f"Over the whole head_dim-{hd} sweep it runs at " + ", and ".join(sweep) + "."
            if sweep else "")
    else:
        say["attn_fwd"] = D.lacking(f"fused attention rows at head_dim {hd}, {n} tokens")
    dims = [f"at head_dim {d}, {D.ratio_range(c)} cuDNN's speed and "
            f"{D.ratio_range(f)} FlashAttention-2's"
            for d in sorted(set(rows["head_dim"]) - {hd})
            for c, f in [(_vs(rows, d, "sdpa_cudnn"), _vs(rows, d, "sdpa_flash"))]
            if len(c) and len(f)]
    say["attn_dims"] = ("Over the other head sizes it runs " + "; ".join(dims) + "." if dims else
                        D.lacking("other head sizes with the fused kernel, cuDNN and FA2 timed"))
    say["attn_compile"] = "" if toy else _compile_sentence(at, hd, n)
    say["attn_memory"] = "" if toy else _attn_memory(rows, at, hd, n)
    return say


def _compile_sentence(at: pd.DataFrame, hd: int, n: int) -> str:
    peak = at.groupby(["causal", "impl"])["peak_mib"].max()
    rate = at.groupby(["causal", "impl"])["tflops_t"].max()
    need = [(False, "torch_compile"), (True, "torch_compile"), (True, "torch_eager")]
    if not all(k in peak.index and peak[k] == peak[k] and rate[k] == rate[k] for k in need):
        return D.lacking(f"torch.compile and eager rows, causal and not, at head_dim {hd}, "
                         f"{n} tokens")
    return (f"torch.compile turns the naive non-causal code into a fused attention (its peak "
            f"memory, {peak[False, 'torch_compile']:,.0f} MiB, holds no scores) and runs at "
            f"{rate[False, 'torch_compile']:.0f} TFLOP/s; the masked, causal version it "
            f"compiles into kernels that store the scores ({peak[True, 'torch_compile']:,.0f} "
            f"MiB) and runs at {rate[True, 'torch_compile']:.0f}, against "
            f"{rate[True, 'torch_eager']:.0f} for eager.")


def _attn_memory(rows: pd.DataFrame, at: pd.DataFrame, hd: int, n: int) -> str:
    p = at[~at["causal"].astype(bool)].groupby("impl")["peak_mib"].max().dropna()
    peak = rows.groupby(["impl", "head_dim", "seq"])["peak_mib"].max().dropna()
    if not {"torch_eager", "triton_fused"} <= set(p.index):
        return D.lacking(f"peak memory of eager and fused attention at head_dim {hd}, {n} tokens")
    naive = peak.loc["torch_eager"]
    worst = naive.idxmax()  # (head_dim, seq)
    return (f"The naive version needs {p['torch_eager'] / 1024:.1f} GiB above its inputs at that "
            f"shape and up to {naive.max() / 1024:.1f} GiB (head_dim {int(worst[0])}, "
            f"{int(worst[1]):,} tokens); the fused kernel never more than "
            f"{peak.loc['triton_fused'].max():,.0f} MiB, its output, over the whole sweep.")


# --- the Gluon forward against the `tl` kernels -------------------------------------------------

KERNEL_KEYS = ["head_dim", "seq", "causal"]
KERNEL_COLUMNS = ["gluon", "tl", "tuned", "cuDNN"]  # TFLOP/s, as _kernel_rates names them
PREDATES_GLUON = ("This results folder predates the Gluon kernel's rows (each forward kernel "
                  "timed alone): `make bench` measures them.")


def _kernel_rates(fwd: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """Per shape of the bench's kernel sweep (head_dim, seq, causal): TFLOP/s over device time
    of the Gluon forward and of the `tl` kernels, each forced (sweep "kernel", variant "gluon" /
    "tl"), of the tuned op and of cuDNN (`rows`: the size sweep's timed rows), and the Gluon
    row's status ("unsupported" where it does not apply). Empty where the data have no kernel
    sweep (runs before the Gluon kernel joined the tuner)."""
    sweep = fwd[fwd["sweep"] == "kernel"] if len(fwd) else fwd
    if not len(sweep):
        return pd.DataFrame()
    forced = _with_rate(D.timed(fwd, sweep="kernel"))
    forced = forced.assign(col=forced["variant"])
    size = rows[rows["impl"].isin(["triton_fused", "sdpa_cudnn"])] if len(rows) else rows
    size = size.assign(col=size["impl"].map({"triton_fused": "tuned", "sdpa_cudnn": "cuDNN"}))
    both = pd.concat([forced, size])
    by = both.groupby(KERNEL_KEYS + ["col"]) if len(both) else None
    rate = by["tflops_t"].max() if by is not None else pd.Series()
    # What says whether the tuned row can be told from the two kernels it picks between: each
    # row's per-call time (the median of its trials), its trials' spread, the run it came from.
    call = by["ms_median"].min() if by is not None else pd.Series()
    spread = ((both["ms_trial_max"] / both["ms_trial_min"] - 1).groupby(
        [both[k] for k in KERNEL_KEYS + ["col"]]).max() if by is not None else pd.Series())
    run = by["run_id"].first() if by is not None else pd.Series()
    status = sweep[sweep["variant"] == "gluon"].groupby(KERNEL_KEYS)["status"].first()
    three = ("gluon", "tl", "tuned")
    out = [{**dict(zip(KERNEL_KEYS, k)), **{c: rate.get((*k, c), NAN) for c in KERNEL_COLUMNS},
            "gluon status": status.get(k),
            **{f"{c} per call": call.get((*k, c), NAN) for c in three},
            "trial spread": max((spread.get((*k, c), NAN) for c in three), default=NAN),
            "one run": len({run.get((*k, c)) for c in three}) == 1}
           for k in sweep[KERNEL_KEYS].drop_duplicates().itertuples(index=False, name=None)]
    t = pd.DataFrame(out).sort_values(["head_dim", "seq", "causal"],
                                      ascending=[False, True, True])
    return t.assign(**{"Gluon / cuDNN": t["gluon"] / t["cuDNN"],
                       "Gluon / tl": t["gluon"] / t["tl"]}).reset_index(drop=True)


def _kernel_display(t: pd.DataFrame) -> pd.DataFrame:
    """The kernel sweep's table as the chapter shows it (seq only where it varies)."""
    if not len(t):
        return t
    t = t.assign(head_dim=t["head_dim"].astype(int),
                 causal=t["causal"].map(lambda c: "yes" if c else "no"),
                 seq=t["seq"].map("{:,.0f}".format))
    cols = ["head_dim", "causal", *(["seq"] if t["seq"].nunique() > 1 else []), *KERNEL_COLUMNS,
            "Gluon / cuDNN", "Gluon / tl"]
    return t[cols].rename(columns={"gluon": "Gluon"}).reset_index(drop=True)


def _kernel_where(sub: pd.DataFrame, t: pd.DataFrame) -> str:
    """The shapes of `sub` (rows of `t`) in words: "head_dim 128 (non-causal) and head_dim 64
    (causal and non-causal)"."""
    several = t["seq"].nunique() > 1
    parts = []
    for (hd, n), g in sub.groupby(["head_dim", "seq"], sort=False):
        masks = set(g["causal"].astype(bool))
        label = f"head_dim {int(hd)}" + (f" at {int(n):,} tokens" if several else "")
        parts.append(label + (" (causal and non-causal)" if len(masks) > 1 else
                              " (causal)" if True in masks else " (non-causal)"))
    return " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)


def _gluon_sentence(t: pd.DataFrame) -> str:
    """Where the Gluon forward beats the `tl` kernels (and by how much, and against cuDNN), where
    it trails them, whose speed the tuned op ran at, where it does not apply, where its row
    failed."""
    if not len(t):
        return PREDATES_GLUON
    seqs = " and ".join(f"{int(n):,}" for n in sorted(set(t["seq"])))
    timed = t[t["Gluon / tl"].notna()]
    refused = t[t["gluon status"] == "unsupported"]
    failed = t[t["gluon status"].notna() & ~t["gluon status"].isin(["ok", "unsupported"])]
    failures = "".join(f" At {_kernel_where(g, t)} its row failed ({status})."
                       for status, g in failed.groupby("gluon status"))
    if not len(timed):
        if len(refused) == len(t):
            return (f"In @tbl-attn-gluon (sequences of {seqs} tokens) the Gluon forward does "
                    "not apply on this GPU or at these shapes (it takes Hopper only, head_dim 64 "
                    "or 128, lengths in whole 128-row tiles): the tuner has only the `tl` kernels.")
        return D.lacking("timed rows of the Gluon forward and the `tl` kernels, each forced") \
            + failures
    # Which kernel the tuned op ran, read from its speed: nearer Gluon's than the `tl` kernels'.
    ran_gluon = ((timed["tuned"] / timed["gluon"] - 1).abs()
                 < (timed["tuned"] / timed["tl"] - 1).abs())
    wins, trails = timed[timed["Gluon / tl"] > 1], timed[timed["Gluon / tl"] <= 1]
    out = [f"In @tbl-attn-gluon (sequences of {seqs} tokens) the Gluon forward"]
    if len(wins):
        cudnn = wins["Gluon / cuDNN"].dropna()
        took = wins[ran_gluon[wins.index]]
        tuned = (", and the tuned op runs at its speed there" if len(took) == len(wins) else
                 ", though the tuned op ran at the `tl` kernels' speed there (its own timing "
                 "chose them)" if not len(took) else
                 f", and the tuned op runs at its speed at {_kernel_where(took, t)}")
        out.append(f"beats the `tl` kernels at {_kernel_where(wins, t)}, at "
                   f"{D.ratio_range(wins['Gluon / tl'])} their speed"
                   + (f" ({D.ratio_range(cudnn)} cuDNN's)" if len(cudnn) else "") + tuned + ".")
    if len(trails):
        took = trails[ran_gluon[trails.index]]
        out.append(("It trails them" if len(wins) else "trails the `tl` kernels")
                   + f" at {_kernel_where(trails, t)}, at {D.ratio_range(trails['Gluon / tl'])} "
                   "their speed" + (", and the tuned op runs at theirs there." if not len(took)
                                    else f"; the tuned op ran at Gluon's speed at "
                                         f"{_kernel_where(took, t)}."))
    if len(refused):
        out.append(f"At {_kernel_where(refused, t)} it does not apply.")
    return " ".join(out) + failures + _below_both(timed, t)


def _below_both(timed: pd.DataFrame, t: pd.DataFrame) -> str:
    """Where the tuned op's device time puts it below both kernels it picks between (it runs one
    of them): how far below, and what separates the three rows: one device time each, and
    per-call times whose trials spread by more than the two kernels differ. "" where the tuned
    op is not below both, or the rows lack their per-call times."""
    if "tuned per call" not in timed:
        return ""
    below = timed[timed["tuned"] < timed[["gluon", "tl"]].min(axis=1)]
    below = below.dropna(subset=["tuned per call", "gluon per call", "tl per call",
                                 "trial spread"])
    if not len(below):
        return ""
    gap = below["tuned"] / below[["gluon", "tl"]].max(axis=1)
    apart = below[["gluon", "tl"]].max(axis=1) / below[["gluon", "tl"]].min(axis=1) - 1
    first = (below["tuned per call"] < below[["gluon per call", "tl per call"]].min(axis=1))
    text = (f" At {_kernel_where(below, t)} the tuned op measures {D.ratio_range(gap)} the faster "
            "kernel's speed, below both kernels it picks between although it runs one of them")
    if not (below["one run"].all() and first.all() and (apart <= below["trial spread"]).all()):
        return text + "."
    return (text + ": the three rows come from one run on one GPU, but each row's device time "
            "comes from one of its trials, and in time per call (the median of its trials) the "
            "tuned op is the fastest of the three. The rows' trials spread by up to "
            f"{100 * below['trial spread'].max():.0f}% and the two kernels differ by "
            f"{D.range_text(100 * apart.min(), 100 * apart.max(), '.0f')}%: a tie, which the "
            "tuner's own timing may break either way.")


# --- forward + backward, decoding, what it means ------------------------------

def _train_sentence(rows: pd.DataFrame, toy: bool) -> str:
    if not len(rows):
        return D.lacking("timed attention forward + backward rows")
    hd = _pick(rows["head_dim"], HEAD_DIM)
    parts = [f"at head_dim {d}, {D.ratio_range(best)} the speed of the fastest SDPA backend"
             + (" and " + _vs_text(fa2, "FlashAttention-2's") if len(fa2) else "")
             for d in [hd] + sorted(set(rows["head_dim"]) - {hd})
             for best, fa2 in [(_vs(rows, d, SDPA), _vs(rows, d, "sdpa_flash"))] if len(best)]
    if not parts:
        return D.lacking("forward + backward rows of the fused kernels and SDPA")
    kind, short = "device time" if rows["device"].all() else "time per call", rows["t_ms"].min()
    return ("Forward and backward together run, over the sweep, " + "; ".join(parts) + ". The "
            f"shortest call takes {short:.2f} ms ({kind})" + (
                # At toy sizes (the forward's kernels under D.SMALL_MS) a call is its host path.
                "." if toy else ": launches do not weigh." if short >= 0.05
                else ": launches may count."))


def _decode_table(rows: pd.DataFrame) -> pd.DataFrame:
    """GB/s (model bytes over device time) per configuration and impl; the fastest SDPA
    backend's time over ours (above 1: ours is faster), and which backend."""
    if not len(rows):
        return pd.DataFrame()
    keys = ["batch", "heads", "kv_heads", "seq_k"]
    rows = rows.assign(gbps_t=rows["bytes_model"] / rows["t_ms"] / 1e6)
    gb = rows.pivot_table(index=keys, columns="impl", values="gbps_t", aggfunc="max")
    ms = rows.pivot_table(index=keys, columns="impl", values="t_ms", aggfunc="min")
    sdpa = [c for c in SDPA if c in ms]
    if "triton_fused" in ms and sdpa:
        gb["× best SDPA"] = ms[sdpa].min(axis=1) / ms["triton_fused"]
        gb["best"] = ms[sdpa].fillna(float("inf")).idxmin(axis=1)  # (no SDPA row: ratio NaN)
    return gb


def _decode_display(table: pd.DataFrame) -> pd.DataFrame:
    """The longest cache of every (batch, heads) pair, in short columns."""
    t = table.reset_index() if len(table) else table
    if len(t):
        t = t[t["seq_k"] == t.groupby(["batch", "heads", "kv_heads"])["seq_k"].transform("max")]
        t = t.assign(batch=t["batch"].astype(int).astype(str),
                     cache=t["seq_k"].map("{:,.0f}".format), **{"heads q/kv": [
                         f"{a:.0f}/{b:.0f}" for a, b in zip(t["heads"], t["kv_heads"])]})
    cols = ["batch", "heads q/kv", *(["cache"] if t["seq_k"].nunique() > 1 else []), *SDPA,
            "triton_fused", "× best SDPA"] if len(t) else []
    return t[[c for c in cols if c in t]].rename(columns=D.SHORT_LABEL).reset_index(drop=True)


def _decode_sentence(rows, table, limits) -> str:
    r = table["× best SDPA"].dropna() if "× best SDPA" in table else ()
    if not len(r):
        return D.lacking("decoding rows with the split-key kernel and SDPA timed")
    at, longest = r.idxmin(), int(table.index.get_level_values("seq_k").max())
    read = rows.groupby(["batch", "heads", "kv_heads", "seq_k"])["bytes_model"].first()
    out = (f"@tbl-attn-decode shows the longest cache, {longest:,} keys of head_dim "
           f"{int(rows['head_dim'].max())}. Over the grid, on device time, the split-key kernels "
           "run at "
           + _vs_text(r, "the fastest SDPA backend's") + ", mostly against "
           f"{D.IMPL_LABEL[table['best'].mode().iloc[0]]}. The lowest ratio is at batch {at[0]}, "
           f"{at[1]} query heads on {at[2]} K/V heads and {at[3]:,} cached keys, a read of "
           + (f"{read[at] / 1e6:.0f}" if read[at] >= 1e6 else D.num(read[at] / 1e6)) + " MB"
           + (": the smallest of the grid, where the second kernel, which merges the chunks, "
              "weighs the most." if read.idxmin() == at else "."))
    copy = D.limit(limits, "copy_bw", run_id=D.runs_of(rows))
    top = table["triton_fused"].max() if "triton_fused" in table else NAN
    fastest = rows[rows["impl"] == "triton_fused"]["t_ms"].max()
    if copy == copy and top == top and not D.toy(fastest):  # no bandwidth of a toy size
        out += (f" The best reaches {D.tbps(top)}, {100 * top / copy:.0f}% of the measured copy "
                f"bandwidth ({D.tbps(copy)})" + ("; a stream that only reads can pass a copy, "
                                                  "which reads and writes." if top > copy else "."))
    return out


def _meaning(smm: pd.DataFrame, fwd: pd.DataFrame, folder) -> dict:
    both = pd.concat([smm, fwd])
    fused = both[both["impl"] == "triton_fused"]["t_ms"].max() if len(both) else NAN
    peaks = both.groupby("impl")["peak_mib"].max().dropna() if len(both) else pd.Series()
    memory = (f"Fused with the online softmax, neither problem ever stores its quadratic matrix: "
              f"the fused kernels' peak memory stays at their output, at most "
              f"{peaks['triton_fused']:,.0f} MiB, where the eager versions reach "
              f"{peaks['torch_eager'] / 1024:.1f} GiB." if {"triton_fused", "torch_eager"}
              <= set(peaks.index) else D.lacking("peak memory of the fused kernels and eager"))
    if D.toy(fused):  # toy sizes: their memory and what sets their time are a launch's
        memory = ""
    cudnn, fa2 = (_vs(fwd, HEAD_DIM, i) if len(fwd) else pd.Series(dtype=float)
                  for i in ("sdpa_cudnn", "sdpa_flash"))
    t = _smm_at(smm, "ieee")[1]
    best = _fastest_other(t)
    time = (f"Time follows the matmul inside. On fp16 tensor cores the Triton attention kernel "
            f"beats FlashAttention-2's CUDA kernels (a median {fa2.median():.2f}× their speed at "
            f"head_dim {HEAD_DIM}) and "
            + (f"stays behind cuDNN's (a median {cudnn.median():.2f}×), whose Hopper schedule "
               "Triton's `tl` cannot express (@sec-attn-gluon: what writing it by hand in Gluon "
               "gives)" if cudnn.median() < 1 else
               f"runs at a median {cudnn.median():.2f}× cuDNN's speed")
            + f"; in IEEE float32 the fused softmax(X) @ V "
            f"takes {t['triton_fused'] / t[best]:.2f}× the time of {D.IMPL_LABEL[best]}, which "
            "calls cuBLAS for the product." if len(cudnn) and len(fa2)
            and best and "triton_fused" in t else
            D.lacking("fused, cuDNN and FA2 attention rows and IEEE softmax(X) @ V rows"))
    time = "" if D.toy(fused) else time
    timing = model_timings(folder)
    t = fwd[fwd["impl"].isin(SDPA)].pivot_table(index=["head_dim", "seq", "causal"], columns="impl",
                                                values="t_ms", aggfunc="min") if len(fwd) else fwd
    whom = ("For attention in a model, call `F.scaled_dot_product_attention`" + (
        f" with its {D.SHORT_LABEL[t.idxmin(axis=1).mode().iloc[0]]} backend, the fastest here"
        if len(t) else ""))
    if {"torch_compile", "torch_eager"} <= set(timing.index):
        tps = timing["tokens_per_s"]
        whom += ("," if len(t) else "") + (
            " and compile the network around it (torch.compile ran GPT-2 at "
            f"{tps['torch_compile'] / tps['torch_eager']:.1f}× eager's tokens/s)")
    t = _smm_at(smm, "float16")[1]
    wins = "triton_fused" in t and t["triton_fused"] == min(t.values())
    return dict(meaning_memory=memory, meaning_time=time, meaning_whom=whom + (
        ". A hand-written fused kernel earns its place where no library fuses the op: "
        "softmax(X) @ V in half precision is one." if wins else "." if "triton_fused" not in t
        else ". Here a hand-written fused kernel earns its memory, not its time."))


# --- figures --------------------------------------------------------------------------------

def fig_smm(c: dict):
    """TFLOP/s against d2, IEEE and TF32 apart, each with its own peak (not lines_by_impl's)."""
    rows = c["smm"]
    rows = rows[rows["precision"].isin(["ieee", "tf32"])] if len(rows) else rows
    if not len(rows) or not rows["tflops_t"].notna().any():
        return figures.no_data("No timed float32 softmax(X) @ V rows in these data.")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(7, 3.4))
    for ax, precision in zip(axes, ("ieee", "tf32")):
        sub = rows[rows["precision"] == precision]
        for impl in figures._impls(sub):
            d = sub[sub["impl"] == impl].sort_values("d2")
            ax.plot(d["d2"], d["tflops_t"], label=D.IMPL_LABEL.get(impl, impl), ms=3,
                    **figures.STYLE.get(impl, dict(marker=".")))
        if c["smm_peaks"][precision] == c["smm_peaks"][precision]:
            ax.axhline(c["smm_peaks"][precision], color="black", lw=1, ls=":",
                       label="measured matmul peak")
        ax.set(ylim=(0, None), xlabel="d2"), ax.set_xscale("log", base=2), ax.grid(True, alpha=0.3)
        ax.set_title(PRECISION_LABEL[precision], fontsize=9)
    axes[0].set_ylabel("TFLOP/s (device time)")
    figures.legend_below(fig, axes, ncol=3)
    return fig


def _attn_fig(rows: pd.DataFrame, peak: float, ylabel: str, what: str, height: float = 3.6):
    return figures.lines_by_impl(
        rows.sort_values("causal") if len(rows) else rows, "seq", "tflops_t", "causal",
        xlabel="sequence length", ylabel=ylabel, logy=False,
        panel_title=lambda causal: "causal" if causal else "non-causal",
        hlines={"fp16 matmul peak": peak}, no_data_text=f"No timed {what} rows in these data.",
        height=height)


def fig_fwd(c: dict):
    return _attn_fig(c["fwd"], c["peak16"], "TFLOP/s (device time)", "attention forward")


def fig_train(c: dict):
    return _attn_fig(c["train"], c["peak16"], "TFLOP/s (3.5× forward FLOPs)", "training",
                     height=3.0)
