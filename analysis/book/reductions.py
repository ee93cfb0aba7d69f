"""Chapter "Reductions": row softmax and LayerNorm, forward and backward. Each version's element
moves (traffic model), every implementation's bandwidth against the row width (device time), the
fused softmax's paths past the register limit, and what fusion buys over single-kernel peers."""
from __future__ import annotations

import json
from functools import partial

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..model import traffic
from . import data as D
from . import figures

OURS = ("triton_fused", "triton_unfused")
TIE = 0.03  # within 3% of each other: level (about the run-to-run spread of device times)
BIG_ROWS, BIG_WIDTH = 10_000, 100_000  # a tensor large enough that per-row statistics vanish
PATH_LABEL = {"one_pass": "one pass", "online": "online (two reads)", "coop": "co-operative",
              "split": "split (two kernels)"}
PATH_STYLE = {"one_pass": ("#d62728", "^"), "online": ("#1f77b4", "s"), "coop": ("#2ca02c", "D"),
              "split": ("#8c564b", "x")}


def _versions() -> list[tuple[str, str, str, list]]:
    """(key, op, version, kernels) of every version the model counts, on a large tensor."""
    sm, smb, ln = (partial(k, BIG_ROWS, BIG_WIDTH, 1) for k in (
        traffic.softmax_kernels, traffic.softmax_backward_kernels, traffic.layer_norm_kernels))
    u, f = "triton_unfused", "triton_fused"
    return [("sm_u", "softmax", "unfused: max, exp-sum, normalise", sm(u)),
            ("sm_f", "softmax", "fused: one pass or co-operative", sm(f)),
            ("sm_online", "softmax", "fused: online (row read twice)", sm(f, True)),
            ("smb_u", "softmax bwd", "unfused: row sums, then dx", smb(u)),
            ("smb_f", "softmax bwd", "fused: one tile", smb(f)),
            ("smb_two", "softmax bwd", "fused: two passes", smb(f, True)),
            ("ln_u", "LayerNorm", "unfused: mean, var, normalise, scale, shift", ln(u)),
            ("ln_f", "LayerNorm", "fused", ln(f)),
            ("lnb_f", "LayerNorm bwd", "fused: dx and partial dw, db; their sum", ln(f, "bwd"))]


def traffic_table() -> pd.DataFrame:
    """Kernels, and row-sized tensors read and written per element, of each version."""
    e = BIG_ROWS * BIG_WIDTH
    return pd.DataFrame([dict(key=key, op=op, version=version, kernels=len(ks),
                              reads=round(sum(k.read for k in ks) / e),
                              writes=round(sum(k.written for k in ks) / e),
                              moves=round(traffic.total(ks) / e))
                         for key, op, version, ks in _versions()])


MOVES = traffic_table().set_index("key")["moves"].to_dict()
# Fusion's largest gain where bandwidth sets the time: moves unfused over moves fused.
CEILING = {op: MOVES[f"{op}_u"] / MOVES[f"{op}_f"] for op in ("sm", "smb", "ln")}


def _model_sentence() -> str:
    return (f"Fusion's ceiling is the ratio of moves: at most {CEILING['sm']:.0f}× for the "
            f"softmax, {CEILING['ln']:.0f}× for the five-step LayerNorm and "
            f"{CEILING['smb']:.2f}× for the softmax backward, where bandwidth sets the time. A "
            f"row too long for registers costs the fused kernel a second read: "
            f"{MOVES['sm_online']} moves for the online softmax, {MOVES['smb_two']} for the "
            "two-pass backward (as many as unfused), unless the L2 cache serves the second read. "
            f"A kernel that reads the row twice from memory reaches at most "
            f"{MOVES['sm_f'] / MOVES['sm_online']:.0%} of the copy bandwidth in the fused op's "
            "bytes.")


def _sweep(df: pd.DataFrame, dtype: str) -> pd.DataFrame:
    """One dtype's width sweep (largest row count), device times only, `tbps` of model bytes."""
    rows = D.timed(df, dtype=dtype) if len(df) else df
    rows = D.main_rows(rows[rows["device"]]) if len(rows) else rows
    return rows.assign(tbps=rows["bytes_model"] / rows["t_ms"] / 1e9,
                       width=rows["width"].astype(int)) if len(rows) else rows


def _fused(rows: pd.DataFrame, variant: str) -> pd.DataFrame:  # the fused kernel on one path
    if not len(rows):
        return rows
    return rows[(rows["impl"] == "triton_fused") & (rows["variant"] == variant)]


def standing(rows: pd.DataFrame) -> pd.DataFrame:
    """Per width: our two versions, eager, and the fastest implementation not ours (ms)."""
    out = []
    for width, g in rows.groupby("width") if len(rows) else []:
        t = D.times(g)
        others = {k: v for k, v in t.items() if k not in OURS}
        best = min(others, key=others.get) if others else None
        if "triton_fused" in t:
            out.append(dict(width=int(width), fused=t["triton_fused"], best=best,
                            unfused=t.get("triton_unfused", np.nan),
                            eager=t.get("torch_eager", np.nan), best_ms=others.get(best, np.nan)))
    return pd.DataFrame(out, columns=["width", "fused", "unfused", "eager", "best", "best_ms"])


def _widths(chosen, every) -> str:
    """The chosen widths, runs of consecutive measured widths as "a to b"."""
    every, runs = sorted(every), []
    for w in sorted(chosen):
        if runs and every.index(w) == every.index(runs[-1][1]) + 1:
            runs[-1][1] = w
        else:
            runs.append([w, w])
    text = [f"{a}" if a == b else f"{a} to {b}" for a, b in runs] or ["no width"]
    return text[0] if len(text) == 1 else ", ".join(text[:-1]) + " and " + text[-1]


def _who(names) -> str:
    names = list(dict.fromkeys(D.IMPL_LABEL.get(n, n) for n in names))
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _faster(st: pd.DataFrame, column: str, name: str = "") -> str:
    """The fused kernel's speed over `column`'s ("a to b×"; with `name`, "a to b× faster than
    name" or "a to b× the speed of name"), "" if never timed."""
    r = (st[column] / st["fused"]).dropna() if len(st) else st
    if not len(r) or not name:
        return D.ratio_range(r) if len(r) else ""
    return D.ratio_range(r) + (f" faster than {name}" if r.min() > 1 else f" the speed of {name}")


def _standing_text(st: pd.DataFrame, what: str) -> str:
    """Where `what` (the fused kernel) leads, ties and trails the fastest other implementation."""
    st = st.dropna(subset=["best_ms"])
    if not len(st):
        return D.lacking(f"{what} rows timed beside another implementation")
    r = st["best_ms"] / st["fused"]
    every, parts = st["width"].tolist(), []
    ahead, level, behind = st[r > 1 + TIE], st[(r - 1).abs() <= TIE], st[r < 1 - TIE]
    if len(ahead):
        parts.append(f"ahead at {_widths(ahead['width'], every)}, at "
                     f"{D.ratio_range(r[ahead.index])} the speed of the fastest other "
                     f"({_who(ahead['best'])})")
    if len(level):
        parts.append(f"level, within {TIE:.0%}, at {_widths(level['width'], every)} "
                     f"({_who(level['best'])})")
    if len(behind):
        parts.append(f"behind at {_widths(behind['width'], every)}, at "
                     f"{D.ratio_range(r[behind.index])} the speed of {_who(behind['best'])}")
    return (f"Against the fastest other implementation at each width, {what} is "
            + "; ".join(parts) + ".")


def _profile(folder) -> pd.DataFrame:
    """The DRAM-counter profile (one row per kernel) of the backwards, empty where not measured."""
    path = folder / "profile.parquet"
    p = pd.read_parquet(path) if path.exists() else pd.DataFrame(
        columns=["op", "impl", "kernel", "dram_read", "shape", "status"])
    return p[p["op"].isin(["softmax_bwd", "layer_norm_bwd"]) & (p["status"] == "ok")]


def _counters(profile: pd.DataFrame, op: str) -> str:
    """Kernels and measured DRAM reads of eager's backward against ours, at the profiled shape."""
    p = profile[profile["op"] == op].dropna(subset=["dram_read"])
    p = p[p["shape"] == p["shape"].iloc[0]] if len(p) else p  # one profiled shape
    if not {"torch_eager", "triton_fused"} <= set(p["impl"]):
        return ""
    shape = json.loads(p["shape"].iloc[0])
    per = p.groupby("impl").agg(kernels=("kernel", "size"), read=("dram_read", "sum"))
    e, f = per.loc["torch_eager"], per.loc["triton_fused"]
    return (f" The DRAM counters at {shape['rows']} × {shape['width']} show why: eager's backward "
            f"runs {int(e['kernels'])} kernels that read {e['read'] / 1e6:,.0f} MB from memory, "
            f"ours {int(f['kernels'])} that read {f['read'] / 1e6:,.0f} MB.")


def compute(folders: list) -> dict:
    folder = folders[0]
    sm, smb = D.load(folder, "softmax"), D.load(folder, "softmax", op="softmax_bwd")
    ln = D.load(folder, "layernorm", op=None)
    limits = D.load_limits(folder)
    copy = {name: D.limit(limits, "copy_bw", run_id=D.runs_of(df))
            for name, df in (("fwd", sm), ("bwd", smb), ("ln", ln))}
    fwd, bwd, lnh = _sweep(sm, "float32"), _sweep(smb, "float32"), _sweep(ln, "float16")
    lnh = lnh.sort_values("direction", ascending=False) if len(lnh) else lnh  # forward first
    profile, paths, users = _profile(folder), wide_paths(sm), user_shapes(sm, smb, ln)
    say = {"model": _model_sentence(), "paths": _paths_sentence(paths, sm),
           "users": _users_sentence(users)}
    one_pass = _fused(fwd, "one_pass")
    widest = int(one_pass["width"].max()) if len(one_pass) else None
    st_fwd = standing(fwd)
    say.update(_softmax_narrow(fwd, one_pass, copy["fwd"]))
    say.update(_softmax_onepass(st_fwd, widest, copy["fwd"], fwd))
    say.update(_softmax_wide(st_fwd, widest, sm))
    say.update(_softmax_backward(standing(bwd), bwd, profile))
    say.update(_layernorm(lnh, profile))
    say.update(_meaning(st_fwd, lnh, widest))
    return dict(traffic=traffic_table().drop(columns="key"), fwd=fwd, bwd=bwd, ln=lnh,
                paths=paths, users=users_table(users), copy=copy, widest_one_pass=widest,
                say=say)


def _softmax_narrow(fwd: pd.DataFrame, one_pass: pd.DataFrame, copy_bw: float) -> dict:
    """A line through the one-pass kernel's device times against bytes: fixed cost and rate."""
    if not len(one_pass) or one_pass["width"].nunique() < 3 or copy_bw != copy_bw:
        return {"narrow": D.lacking("device times of the one-pass softmax at three widths or more")}
    slope, t0 = np.polyfit(one_pass["bytes_model"], one_pass["t_ms"] * 1e-3, 1)
    n = one_pass.loc[one_pass["width"].idxmin()]
    t = D.times(fwd[(fwd["width"] == n["width"]) & (fwd["impl"] != "triton_unfused")])
    spread = D.range_text(1e3 * min(t.values()), 1e3 * max(t.values()), ".1f")
    return {"narrow": (
        f"Narrow rows are short calls. A straight line through the one-pass kernel's device times "
        f"against its bytes gives a fixed {t0 * 1e6:.1f} µs a call and a streaming rate of "
        f"{1 / slope / 1e12:.2f} TB/s. At width {int(n['width'])} the tensor moves in "
        f"{n['bytes_model'] / copy_bw / 1e3:.1f} µs at the copy bandwidth, so the fixed cost is a "
        f"large share of every single-kernel version: all of them take {spread} µs there.")}


def _softmax_onepass(st, widest, copy_bw: float, fwd: pd.DataFrame) -> dict:
    rows = st[st["width"] <= widest] if widest else st.iloc[:0]
    if not len(rows):
        return {"onepass": D.lacking("device times of the one-pass softmax")}
    fused = fwd[(fwd["impl"] == "triton_fused") & fwd["width"].isin(rows["width"])]
    best = fused.loc[fused["tbps"].idxmax()]
    text = (f"While the row fits in registers (up to {widest} float32 elements, "
            f"{widest * 4 // 1024} KiB), the fused kernel reads it once and writes it once"
            + ("." if D.toy(rows["fused"].max()) else  # a toy size's bandwidth says nothing
               f" and peaks at {D.num(best['tbps'])} TB/s (width {int(best['width'])}), "
               f"{best['tbps'] * 1000 / copy_bw:.0%} of the copy bandwidth."))
    above = rows[rows["width"] > rows["width"].min()].dropna(subset=["unfused"])
    if len(above):  # above the ceiling: the unfused kernels' extra launches cost time too
        over = (above["unfused"] / above["fused"]).max() > 1.01 * CEILING["sm"]
        text += (f" Above width {rows['width'].min()} it is "
                 f"{_faster(above, 'unfused', 'the three unfused Triton kernels')} (the model's "
                 f"ceiling: {CEILING['sm']:.0f}×" + ("; past it where their two extra launches "
                                                     "add their fixed cost)." if over else ")."))
    if _faster(rows, "eager"):
        text += (f" PyTorch eager's softmax is one kernel too; the fused kernel is "
                 f"{_faster(rows, 'eager', 'it')} over these widths.")
    return {"onepass": text + " " + _standing_text(rows, "the one-pass kernel")}


def _softmax_wide(st: pd.DataFrame, widest, sm: pd.DataFrame) -> dict:
    rows = st[st["width"] > widest] if widest else st.iloc[:0]
    if not len(rows):
        return {"wide": D.lacking("device times of the fused softmax past the one-pass limit")}
    text = _standing_text(rows, "the fused kernel past the one-pass limit")
    liger = sm[sm["impl"] == "liger"]
    ran = liger[liger["status"] == "ok"]
    if len(ran) and (liger["status"] == "unsupported").any():
        text += (f" Liger-Kernel refuses rows wider than {int(ran['width'].max())} elements (its "
                 "kernel takes the whole row as one block).")
    return {"wide": text}


def wide_paths(sm: pd.DataFrame) -> pd.DataFrame:
    """Each path of the fused float32 softmax against the width at its fastest tile and warps
    (default and block-sweep rows), and whether the plan picks it there."""
    rows = pd.concat([D.timed(sm, sweep=s, dtype="float32", impl="triton_fused")
                      for s in ("size", "block")]) if len(sm) else sm
    rows = D.main_rows(rows[rows["device"]]) if len(rows) else rows
    if not len(rows):
        return pd.DataFrame(columns=["variant", "width", "tbps", "picked"])
    picked = rows[rows["sweep"] == "size"].set_index("width")["variant"].to_dict()
    best = rows.loc[rows.groupby(["variant", "width"])["t_ms"].idxmin()]
    return pd.DataFrame({
        "variant": best["variant"], "width": best["width"].astype(int),
        "tbps": best["bytes_model"] / best["t_ms"] / 1e9,
        "picked": [picked.get(w) == v for v, w in zip(best["variant"], best["width"])],
    }).sort_values(["variant", "width"]).reset_index(drop=True)


def _paths_sentence(paths: pd.DataFrame, sm: pd.DataFrame) -> str:
    """Online against co-operative at the widths the plan sends to one of them."""
    picked = paths[paths["picked"].astype(bool)].set_index("width")["variant"]
    wide = paths[paths["width"].isin(picked[picked.isin(["online", "coop"])].index)]
    both = wide.pivot_table(index="width", columns="variant", values="tbps")
    both = both.reindex(columns=["online", "coop"]).dropna()
    if not len(both):
        return D.lacking("widths where both the online and the co-operative path were timed")
    faster = both.idxmax(axis=1)
    on, co = faster.index[faster == "online"], faster.index[faster == "coop"]
    text = (f"Where both were timed, the online path (two reads) is the faster at "
            f"{_widths(on, both.index)}, the co-operative one (one read) at "
            f"{_widths(co, both.index)}. ")
    sms = sm["sm_count"].dropna()
    if len(on) and len(co) and len(sms) and on.max() < co.min():
        a, b = int(on.max()), int(co.min())
        mb = {w: int(sms.iloc[0]) * w * 4 / 1e6 for w in (a, b)}  # rows in flight, float32
        text += (f"The online path's second read is served by L2 only while the rows in flight, "
                 f"one per SM, fit in it: they take {mb[a]:.0f} MB at width {a} and {mb[b]:.0f} MB "
                 f"at {b}, and its rate falls from {both.loc[a, 'online']:.2f} to "
                 f"{both.loc[b, 'online']:.2f} TB/s between the two. ")
    right = int((picked[both.index] == faster).sum())
    rule = (f" (online up to {int(picked[picked == 'online'].index.max())} float32 elements, "
            "co-operative past it)" if (picked == "online").any() else "")
    text += (f"The plan's fixed rule{rule} picks the faster at "
             f"{'each' if right == len(both) else right} of these {len(both)} widths.")
    low = both[both["coop"] < both["online"] / 2]
    if len(low):
        text += (f" At {_widths(low.index, both.index)} the co-operative path drops to "
                 f"{D.range_text(low['coop'].min(), low['coop'].max(), '.2f')} TB/s")
        text += (": Triton loads rows whose width is not a multiple of 16 into its register "
                 "tile element by element, and the plan keeps such rows online." if all(
                     int(w) % 16 for w in low.index) else ".")
    return text


def _softmax_backward(st: pd.DataFrame, bwd: pd.DataFrame, profile: pd.DataFrame) -> dict:
    one_tile = _fused(bwd, "one_tile")
    long_rows = D.lacking("device times of the softmax backward's long rows")
    if not len(st) or not len(one_tile):
        return {"bwd": D.lacking("device times of the fused softmax backward's one-tile kernel"),
                "bwd_wide": long_rows}
    limit = int(one_tile["width"].max())
    inside, past = st[st["width"] <= limit], st[st["width"] > limit]
    unfused = _faster(inside, "unfused", "the unfused pair")
    eager = _faster(inside, "eager", "PyTorch eager")
    text = (f"Up to {limit} elements a row the fused backward holds the row in one tile" + (
        f", and is {unfused} (the model's ceiling: {CEILING['smb']:.2f}×)" if unfused else "")
            + (f"{' and' if unfused else ', and is'} {eager}" if eager else "") + ".")
    text += _counters(profile, "softmax_bwd") + " " + _standing_text(inside, "the one-tile kernel")
    if not len(past):
        return {"bwd": text, "bwd_wide": long_rows}
    unfused = _faster(past, "unfused")
    return {"bwd": text, "bwd_wide": (
        f"Past {limit} elements the fused backward reads y and dy twice, as many bytes as the "
        "unfused pair" + (f", and runs at {unfused} its speed" if unfused else "") + ". "
        + _standing_text(past, "the two-pass kernel"))}


def _layernorm(lnh: pd.DataFrame, profile: pd.DataFrame) -> dict:
    fwd, bwd = ((lnh[lnh["direction"] == d] if len(lnh) else lnh) for d in ("fwd", "bwd"))
    out = {"ln_per_call": _per_call(bwd),
           "ln_fwd": D.lacking("device times of the fused float16 LayerNorm forward"),
           "ln_bwd": D.lacking("device times of the fused float16 LayerNorm backward")}
    st = standing(fwd)
    unfused = _faster(st, "unfused", "the five unfused Triton kernels")
    eager = _faster(st, "eager", "it")
    if len(st):
        out["ln_fwd"] = (
            (f"The fused forward is {unfused} (the model's ceiling: {CEILING['ln']:.0f}×). "
             if unfused else "")
            + (f"PyTorch eager's forward is one kernel too; ours is {eager}. " if eager else "")
            + _standing_text(st, "the fused forward"))
    st = standing(bwd)
    if len(st):
        eager = _faster(st, "eager", "eager's")
        out["ln_bwd"] = ((f"The fused backward is {eager}." if eager else "")
                         + _counters(profile, "layer_norm_bwd") + " "
                         + _standing_text(st, "the fused backward")).strip()
    return out


# Backward rows the bench times by calling the library's kernels directly, not through autograd
# (FlagGems' autograd needs its aten patches on): their per-call time pays no autograd engine.
DIRECT_BWD = ("flag_gems",)


def _per_call(bwd: pd.DataFrame) -> str:
    """The backward called through autograd one call at a time, host included (ms_median),
    against the others called the same way (not DIRECT_BWD's), with the GPU time beside it."""
    rows = bwd[~bwd["impl"].isin(DIRECT_BWD)] if len(bwd) else bwd
    st = standing(rows.assign(t_ms=rows["ms_median"]).dropna(subset=["t_ms"]) if len(rows)
                  else rows)
    st = st.dropna(subset=["best_ms"])
    if not len(st):
        return D.lacking("per-call times of the LayerNorm backward")
    behind = st[st["best_ms"] < (1 - TIE) * st["fused"]]
    text = (f"Called through autograd one call at a time, host included, the fused backward "
            f"trails the fastest other called the same way at {len(behind)} of {len(st)} widths")
    if len(behind):
        worst = behind.loc[(behind["best_ms"] / behind["fused"]).idxmin()]
        w = worst["width"]
        dev = D.timed(bwd[bwd["width"] == w])
        dev = D.times(dev[dev["device"]]) if len(dev) else {}
        gpu = (f", though its GPU time there is {1e3 * dev['triton_fused']:.0f} µs against "
               f"{1e3 * dev[worst['best']]:.0f}" if {"triton_fused", worst["best"]} <= set(dev)
               else "")
        text += (f" (at {int(w)}: {1e3 * worst['fused']:.0f} µs a call against "
                 f"{1e3 * worst['best_ms']:.0f} µs for {D.IMPL_LABEL.get(worst['best'])}{gpu}): "
                 "the Python path that launches its two kernels outlasts their GPU time")
        direct = bwd[bwd["impl"].isin(DIRECT_BWD) & (bwd["width"] == w)
                     & bwd["ms_median"].notna()] if len(bwd) else bwd
        if len(direct):
            d = direct.loc[direct["ms_median"].idxmin()]
            name = D.IMPL_LABEL.get(d["impl"], d["impl"])
            name += "'" if name.endswith("s") else "'s"
            text += (f". {name} backward, at "
                     f"{1e3 * d['ms_median']:.0f} µs a call there, is left out: the bench calls "
                     "its kernels directly, without autograd")
    return (text + ". In a CUDA graph or under torch.compile only the device time counts; "
            "@sec-across measures the per-call cost of every op.")


def user_shapes(sm: pd.DataFrame, smb: pd.DataFrame, ln: pd.DataFrame) -> pd.DataFrame:
    """Shapes the figures leave out: few rows (decoding), or a width not a power of two in another
    dtype. Per shape and direction: our device time and the fastest other's (ms)."""
    in_figure, out = {"softmax": "float32", "LayerNorm": "float16"}, []
    for name, df in (("softmax", pd.concat([sm, smb])), ("LayerNorm", ln)):
        t = D.timed(df) if len(df) else df
        t = t[t["device"]] if len(t) else t
        for (op, dtype, rows, width), g in t.groupby(["op", "dtype", "rows", "width"]) \
                if len(t) else []:
            pow2 = int(width) & (int(width) - 1) == 0
            if rows == t["rows"].max() and (dtype == in_figure[name] or pow2):
                continue  # in a figure, or a power-of-two width of the sweeps
            times = D.times(g)
            others = {k: v for k, v in times.items() if k not in OURS}
            if "triton_fused" in times and others:
                best = min(others, key=others.get)
                shape = f"{D.SHORT_DTYPE.get(dtype, dtype)} {int(rows)}×{int(width)}"
                out.append(dict(op=name, direction="bwd" if "bwd" in op else "fwd", shape=shape,
                                rows=int(rows), width=int(width), ours=times["triton_fused"],
                                best=best, best_ms=others[best]))
    return pd.DataFrame(out, columns=["op", "direction", "shape", "rows", "width", "ours", "best",
                                      "best_ms"]).sort_values(["rows", "width", "shape"])


def users_table(users: pd.DataFrame) -> pd.DataFrame:
    """One line per shape: our µs and the fastest other's, forward and backward."""
    if not len(users):
        return users.iloc[:0, :0]
    u = users.assign(us=(1e3 * users["ours"]).map(lambda v: f"{v:.1f}"),
                     other=[f"{D.SHORT_LABEL.get(b, b)} {1e3 * m:.1f}"
                            for b, m in zip(users["best"], users["best_ms"])])
    t = u.pivot_table(index=["op", "rows", "width", "shape"], columns="direction",
                      values=["us", "other"], aggfunc="first").sort_index(
        level=["op", "rows", "width"], ascending=[False, True, True])
    t.columns = [f"fused {d} µs" if v == "us" else f"{d}: fastest other" for v, d in t.columns]
    cols = ["fused fwd µs", "fwd: fastest other", "fused bwd µs", "bwd: fastest other"]
    return t.reindex(columns=cols).fillna("—").reset_index().drop(columns=["rows", "width"])


def _users_sentence(users: pd.DataFrame) -> str:
    """Per op and direction: the shapes where the fused kernel leads and where it trails."""
    parts = []
    for (op, direction), g in reversed(list(users.groupby(["op", "direction"]))):  # softmax fwd 1st
        r = g["best_ms"] / g["ours"]
        ahead, behind = g[r > 1 + TIE], g[r < 1 - TIE]
        level = g.drop(ahead.index.union(behind.index))
        said = [f"ahead at {', '.join(ahead['shape'])} (at "
                f"{D.ratio_range(r[ahead.index])} the fastest other's speed)"] if len(ahead) else []
        if len(behind):
            said.append(f"behind at {', '.join(behind['shape'])} ({_who(behind['best'])}: "
                        f"{D.ratio_range(r[behind.index])})")
        if len(level):
            said.append(f"level at {', '.join(level['shape'])}")
        name = "forward" if direction == "fwd" else "backward"
        parts.append(f"the {op} {name} is " + ", ".join(said))
    if not parts:
        return D.lacking("few-row or odd-width shapes timed beside another implementation")
    return "T" + ("; ".join(parts) + ".")[1:]  # every part starts "the ..."


def _meaning(st_fwd: pd.DataFrame, lnh: pd.DataFrame, widest) -> dict:
    """When fusion pays for a reduction: against unfused code, against single-kernel peers."""
    if not len(st_fwd) or widest is None:
        return {"meaning": D.lacking("device times of the softmax width sweep")}
    ln_fwd, ln_bwd = (standing(lnh[lnh["direction"] == d] if len(lnh) else lnh)
                      for d in ("fwd", "bwd"))
    # At toy sizes no claim of what the bytes predict, nor of distances to the copy bandwidth.
    toy = D.toy(max(st_fwd["fused"].max(), ln_fwd["fused"].max() if len(ln_fwd) else 0))
    sm_u, ln_u = _faster(st_fwd, "unfused"), _faster(ln_fwd, "unfused")
    parts = [f"Against the same work as separate Triton kernels, fusing a reduction pays about "
             f"what the bytes it saves predict: {sm_u} for the softmax (the model's ceiling: "
             f"{CEILING['sm']:.0f}×) and {ln_u} for LayerNorm ({CEILING['ln']:.0f}×), less at "
             "narrow rows, where a call's fixed cost counts."] if sm_u and ln_u and not toy else []
    inside = _faster(st_fwd[st_fwd["width"] <= widest], "best_ms")
    if inside:
        parts.append(f"Against PyTorch, torch.compile and the Triton libraries, which already run "
                     f"one kernel, there is little left to fuse: while the row fits in registers "
                     f"the fastest of them takes {inside} the fused softmax's time.")
    past = _faster(st_fwd[st_fwd["width"] > widest], "best_ms", "the fastest other")
    ahead = ln_bwd[ln_bwd["best_ms"] > (1 + TIE) * ln_bwd["fused"]]
    wins = [f"for softmax rows past the register limit ({widest} elements) it is {past}"
            ] if "faster" in past else []
    if len(ahead):
        wins.append(f"for the LayerNorm backward at {_widths(ahead['width'], ln_bwd['width'])} "
                    f"columns, where eager reads x and dy twice, it is "
                    f"{_faster(ahead, 'best_ms')} faster")
    if wins and not toy:
        parts.append("A hand-written kernel pays where the others stay further from the copy "
                     "bandwidth: " + "; and ".join(wins) + ".")
    return {"meaning": " ".join(parts) or D.lacking("rows to compare")}


def _width_figure(rows: pd.DataFrame, copy_gbps: float, panels: str, title, missing: str):
    return figures.lines_by_impl(
        rows, "width", "tbps", panels, xlabel="row width (elements)", ylabel="TB/s of model bytes",
        logy=False, panel_title=title, hlines={"copy bandwidth": copy_gbps / 1000},
        no_data_text=missing)


def fig_softmax(c: dict, key: str = "fwd"):
    """Softmax forward (key "fwd") or backward ("bwd") bandwidth against the width."""
    rows, widest = c[key], c["widest_one_pass"] if key == "fwd" else None
    title = f"float32, {int(rows['rows'].max())} rows" if len(rows) else ""
    fig = _width_figure(rows, c["copy"][key], "dtype", lambda _: title,
                        f"No device times of the float32 softmax{' backward' * (key == 'bwd')} "
                        "in these data.")
    if len(rows) and widest:  # where the row stops fitting in registers
        fig.axes[0].axvline(widest, color="grey", lw=0.8)
    return fig


def fig_layernorm(c: dict):
    rows = f", {int(c['ln']['rows'].max())} rows" if len(c["ln"]) else ""
    return _width_figure(c["ln"], c["copy"]["ln"], "direction",
                         lambda d: {"fwd": "forward", "bwd": "backward"}.get(d, d) + rows,
                         "No device times of the float16 LayerNorm in these data.")


def fig_paths(c: dict):
    paths = c["paths"]
    if not len(paths):
        return figures.no_data("No device times of the fused softmax's paths in these data.")
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for variant in [v for v in PATH_LABEL if v in set(paths["variant"])]:
        d, (color, marker) = paths[paths["variant"] == variant], PATH_STYLE[variant]
        ax.plot(d["width"], d["tbps"], label=PATH_LABEL.get(variant, variant), ms=4, lw=1.2,
                color=color, marker=marker)
    chosen = paths[paths["picked"].astype(bool)]
    ax.plot(chosen["width"], chosen["tbps"], ls="none", marker="o", ms=10, mfc="none",
            mec="black", label="the plan's pick")
    copy = c["copy"]["fwd"] / 1000
    if copy == copy:
        ax.axhline(copy, color="black", lw=1, ls=":", label="copy bandwidth")
        ax.axhline(copy * 2 / 3, color="black", lw=1, ls="--", label="⅔ of copy: two reads")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="row width (elements)", ylabel="TB/s of model bytes")
    ax.grid(True, alpha=0.3)
    figures.legend_below(fig, [ax], ncol=4)
    return fig
