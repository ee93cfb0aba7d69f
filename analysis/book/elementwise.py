"""Chapter "Elementwise": `(x + y) * z`, the simplest fusion, against the bandwidth it can reach.

model -> measurement -> meaning: the elements each version moves, the bandwidth each reaches
against size (device time), and what the gap between them says."""
from __future__ import annotations

import pandas as pd

from ..model import traffic
from . import cases, data as D
from . import figures

FLAT = 1.5  # device time within this factor of the smallest size's: the launch sets the time


def model_ratio(z_kind: str) -> float:
    """The traffic model's ceiling on fusion's gain: elements moved unfused over fused."""
    return (traffic.add_mul_bytes(1, 1, z_kind, "triton_unfused")
            / traffic.add_mul_bytes(1, 1, z_kind, "triton_fused"))


def compute(folders: list) -> dict:
    folder = folders[0]
    df = D.load(folder, "elementwise")
    limits = D.load_limits(folder)
    runs = D.runs_of(df) if len(df) else None
    copy_bw = D.limit(limits, "copy_bw", run_id=runs)
    stream_bw = D.limit(limits, "stream_bw", run_id=runs)
    rows = D.timed(df) if len(df) else df
    fp32 = D.timed(df, dtype="float32") if len(df) else df
    if len(fp32):
        fp32 = fp32.assign(tbps=fp32["bytes_model"] / fp32["t_ms"] / 1e9)
    say = {"model": (f"Fusion removes the write of `t = x + y` and its re-read by `t * z`: with "
                     f"a tensor `z` the unfused pair moves 6 elements per output against 4 fused "
                     f"(3 reads, 1 write), so fusion can be "
                     f"at most {model_ratio('tensor'):.2f}× faster; with a scalar `z`, 5 against "
                     f"3, at most {model_ratio('scalar'):.2f}×.")}
    n = headline_n(df, fp32)
    say.update(_large(fp32, n, stream_bw, copy_bw))
    say.update(_small(fp32))
    say["half"] = _half(rows, n)
    say["blocks"] = _blocks(df)
    return dict(fp32=fp32, copy_bw=copy_bw, stream_bw=stream_bw,
                say=say)


def headline_n(df: pd.DataFrame, fp32: pd.DataFrame):
    """The size the chapter centres on: the family's headline case (the findings' table reads
    the same one), else the largest float32 size with a tensor z."""
    case = cases.headline("elementwise", df) if len(df) else None
    if case is not None and case.where["dtype"] == "float32" and case.where["z_kind"] == "tensor":
        return case.where["n"]
    tensor = fp32[fp32["z_kind"] == "tensor"] if len(fp32) else fp32
    return tensor["n"].max() if len(tensor) else None


def _large(fp32: pd.DataFrame, n, stream_bw: float, copy_bw: float) -> dict:
    """At the headline size with a tensor z: fused against every other version, and the model."""
    tensor = fp32[fp32["z_kind"] == "tensor"] if len(fp32) else fp32
    if not len(tensor) or n is None:
        return {"large": D.lacking("timed float32 add-mul rows")}
    t = D.times(tensor[tensor["n"] == n])
    if "triton_fused" not in t:
        return {"large": D.lacking(f"timed fused kernel at n = {D.pow2(n)}")}
    fused = t["triton_fused"]
    parts = []
    if "triton_unfused" in t:
        gain, ceiling = t["triton_unfused"] / fused, model_ratio("tensor")
        meaning = ("at this size a kernel's fixed cost, not its bytes, sets both times"
                   if D.toy(fused) else
                   "fusion buys what the bytes say and no more" if gain >= 0.9 * ceiling else
                   "short of the bytes' ratio: at this size a kernel's fixed cost is still a "
                   "large part of its time")
        parts.append(f"At n = {D.pow2(n)} (float32, tensor `z`), the fused kernel is "
                     f"{gain:.2f}× faster than the same computation as two Triton kernels; the "
                     f"model's ceiling is {ceiling:.2f}×: {meaning}.")
    if "torch_eager" in t:
        parts.append(f"Against PyTorch eager, which also runs two kernels, it is "
                     f"{t['torch_eager'] / fused:.2f}× faster.")
    compiled = {k: v for k, v in t.items() if k in ("torch_compile", "torch_compile_max")}
    if compiled:
        best = min(compiled, key=compiled.get)
        ratio = compiled[best] / fused
        parts.append(f"{D.IMPL_LABEL[best]} generates the same single kernel by itself and "
                     + ("runs as fast as the hand-written one (within 3%)"
                        if abs(ratio - 1) < 0.03 else f"runs at {1 / ratio:.2f}× its speed")
                     + ": for a pure elementwise chain a compiler is enough.")
    gbps = tensor[(tensor["n"] == n) & (tensor["impl"] == "triton_fused")]["tbps"].max() * 1000
    if stream_bw == stream_bw and not D.toy(fused):  # a toy size's bandwidth says nothing
        parts.append(f"The fused kernel moves {D.tbps(gbps)}, {100 * gbps / stream_bw:.0f}% of "
                     f"what `torch.addcmul` moves on this machine ({D.tbps(stream_bw)}; a plain copy: "
                     f"{D.tbps(copy_bw)}).")
    return {"large": " ".join(parts)}


def _small(fp32: pd.DataFrame) -> dict:
    tensor = fp32[fp32["z_kind"] == "tensor"] if len(fp32) else fp32
    fused = tensor[tensor["impl"] == "triton_fused"] if len(tensor) else tensor
    if not len(fused) or fused["n"].nunique() < 2 or not fused["device"].any():
        return {"small": D.lacking("device times of the fused kernel at several sizes")}
    dev = fused[fused["device"]].groupby("n")["t_ms"].min()
    flat = int(dev[dev <= FLAT * dev.iloc[0]].index.max())
    t = D.times(tensor[tensor["n"] == dev.index[0]])
    one = [t[k] for k in ("triton_fused", "torch_compile") if k in t]
    two = [t[k] for k in ("triton_unfused", "torch_eager") if k in t]
    pair = (f" At {D.pow2(dev.index[0])} elements one kernel takes "
            f"{D.range_text(1000 * min(one), 1000 * max(one), '.1f')} µs of GPU time and two "
            f"take {D.range_text(1000 * min(two), 1000 * max(two), '.1f')}: there fusion halves "
            "the launches, not the bytes." if one and two else "")
    return {"small": f"Up to {D.pow2(flat)} elements the fused kernel's device time stays within "
                     f"{FLAT}× of its time at the smallest size: the fixed cost of a kernel, not "
                     f"its bytes, sets the time.{pair}"}


def _half(rows: pd.DataFrame, n) -> str:
    half = rows[(rows["dtype"] != "float32") & (rows["z_kind"] == "tensor")] if len(rows) else rows
    if not len(half):
        return D.lacking("half-precision add-mul rows")
    n = n if n in set(half["n"]) else half["n"].max()
    out = []
    for dtype, g in half[half["n"] == n].groupby("dtype"):
        t = D.times(g)
        if "triton_fused" in t and "triton_unfused" in t:
            gain = t["triton_unfused"] / t["triton_fused"]
            out.append(f"{D.SHORT_DTYPE.get(dtype, dtype)} {gain:.2f}×")
    if not out:
        return D.lacking("half-precision rows with both Triton versions timed")
    return (f"In half precision at n = {D.pow2(n)} the gain over the unfused pair is the same "
            f"({', '.join(out)}): the ratio of bytes does not depend on the element size.")


def _blocks(df: pd.DataFrame) -> str:
    blocks = D.ok_rows(df, "block") if len(df) else df
    blocks = blocks.dropna(subset=["gbps"]) if len(blocks) else blocks
    if not len(blocks):
        return D.lacking("block-size sweep")
    big = blocks[blocks["n"] == blocks["n"].max()]
    spreads = []
    for _, g in big.groupby(["impl", "z_kind"]):
        wide = g[g["block"] >= 256]["gbps"]
        if len(wide) > 1:
            spreads.append((wide.max() - wide.min()) / wide.max())
    if not spreads:
        return D.lacking("block sizes of 256 and up")
    return ("The block size hardly matters for a streaming kernel: at "
            f"n = {D.pow2(big['n'].max())} "
            f"every block from 256 elements up lands within {100 * max(spreads):.1f}% of the best, "
            "in both Triton kernels and with either kind of `z`.")


def fig_bandwidth(c: dict):
    fp32 = c["fp32"]
    return figures.lines_by_impl(
        fp32, "n", "tbps", "z_kind", xlabel="n (elements)", ylabel="TB/s of model bytes",
        logy=False, panel_title=lambda z: f"z a {z}",
        hlines={"torch.addcmul (3 reads, 1 write)": c["stream_bw"] / 1000,
                "copy": c["copy_bw"] / 1000},
        no_data_text="No timed float32 add-mul rows in these data.", height=2.8)
