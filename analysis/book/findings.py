"""What the report's chapters conclude from the data: the values their prose and tables quote,
computed from the rows. Pandas only (no torch, no kernels), so a chapter's cells start fast; the
chapters call these through `report.findings_or_missing`, which turns a configuration the data
lacks into "—" instead of an error."""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import data as R
from . import synthesis
from .. import traffic

# --- Elementwise ----------------------------------------------------------------------------------

TARGET_N = 2**27  # the size the chapter headlines (fp32, tensor z); the team's targets: NOTES.md
LARGE_N = 2**26  # "large n": from here up, launch overhead is negligible


def elementwise_findings(df, copy_bw: float) -> dict:
    """The numbers the chapter's prose quotes, computed from the rows."""
    ok = df[(df["status"] == "ok") & (df["sweep"] == "size") & (df["dtype"] == "float32")]
    ms = ok.pivot_table(index=["z_kind", "n"], columns="impl", values="ms_median")
    gbps = ok.pivot_table(index=["z_kind", "n"], columns="impl", values="gbps")
    at = ("tensor", TARGET_N)
    large = ms.loc["tensor"]
    large = large[large.index >= LARGE_N]
    f = dict(
        copy_bw=copy_bw,
        gbps=gbps.loc[at].to_dict(),
        gbps_scalar=gbps.loc[("scalar", TARGET_N)].to_dict(),
        vs_eager=ms.loc[at, "torch_eager"] / ms.loc[at, "triton_fused"],
        vs_compile=ms.loc[at, "torch_compile"] / ms.loc[at, "triton_fused"],
        vs_unfused=ms.loc[at, "triton_unfused"] / ms.loc[at, "triton_fused"],
        vs_unfused_large_min=float((large["triton_unfused"] / large["triton_fused"]).min()),
        vs_unfused_scalar=ms.loc[("scalar", TARGET_N), "triton_unfused"]
        / ms.loc[("scalar", TARGET_N), "triton_fused"],
        smallest_n=int(ms.index.get_level_values("n").min()),
        small_us=(ms.loc["tensor"].iloc[0] * 1000).to_dict(),
    )
    if "ms_device" in ok and ok["ms_device"].notna().any():
        device = ok.pivot_table(index=["z_kind", "n"], columns="impl", values="ms_device")
        f["small_device_us"] = (device.loc["tensor"].iloc[0] * 1000).to_dict()
    # Where the fused kernel first reaches half the copy bandwidth.
    fused = gbps.loc["tensor", "triton_fused"]
    half = fused[fused >= copy_bw / 2]
    f["half_bw_n"] = int(half.index.min()) if len(half) else None
    return f

# --- Reductions -----------------------------------------------------------------------------------

# The softmax paths for rows past the one-pass limit (the `variant` of their rows).
WIDE_PATHS = ("online", "coop")


def default_tile(df, path: str):
    """The tile the default plan gives a float32 softmax path: the block of its default-sweep
    rows (16-bit rows take other tiles)."""
    rows = df[(df["sweep"] == "size") & (df["variant"] == path) & (df["status"] == "ok")
              & (df["dtype"] == "float32")]
    return int(rows["block"].mode().iloc[0]) if len(rows) else None


def widest_online(df):
    """The widest float32 row the default plan sends down the online path."""
    rows = R.main_rows(df)
    rows = rows[(rows["sweep"] == "size") & (rows["variant"] == "online")
                & (rows["dtype"] == "float32")]
    return int(rows["width"].max()) if len(rows) else R.MISSING

def softmax_findings(df, copy_bw: float) -> dict:
    rows = R.main_rows(R.ok_rows(df))
    fp32 = rows[(rows["dtype"] == "float32")]
    widths = sorted(fp32["width"].unique())
    gbps = {w: R.value_at(fp32, "triton_fused", "gbps", width=w) for w in widths}
    one_pass = fp32[(fp32["impl"] == "triton_fused") & (fp32["variant"] == "one_pass")]
    widest_one_pass = int(one_pass["width"].max()) if len(one_pass) else None
    return dict(
        widths=widths, fused_gbps=gbps,
        wide=_softmax_wide_paths(df, widest_one_pass or 0),
        fixed_cost=_fixed_cost_fit(one_pass, copy_bw),
        widest_one_pass=widest_one_pass,
        two_read_cap=copy_bw * 2 / 3,
        best=max(gbps.values()), best_width=int(max(gbps, key=gbps.get)),
        vs_eager={w: R.value_at(fp32, "torch_eager", width=w) / R.value_at(fp32, "triton_fused", width=w)
                  for w in widths},
        vs_compile={w: R.value_at(fp32, "torch_compile", width=w)
                    / R.value_at(fp32, "triton_fused", width=w) for w in widths},
        vs_unfused={w: R.value_at(fp32, "triton_unfused", width=w)
                    / R.value_at(fp32, "triton_fused", width=w) for w in widths},
    )


def _softmax_wide_paths(df, widest_one_pass: int):
    """float32 rows past the one-pass limit: TB/s of the online and coop paths at their default
    tiles and warps (wherever measured: as the default or beside it), and which one is default."""
    ok = R.main_rows(df)
    ok = ok[(ok["status"] == "ok") & (ok["dtype"] == "float32") & (ok["impl"] == "triton_fused")
            & (ok["width"] > widest_one_pass)]
    out = []
    for w, g in ok.groupby("width"):
        row = {"width": int(w)}
        for path in WIDE_PATHS:
            block = default_tile(df, path)
            m = g[(g["variant"] == path) & (g["block"] == block) & (g["num_warps"] == 16)]
            row[f"{path} TB/s"] = float(m["gbps"].iloc[0]) / 1000 if len(m) else float("nan")
        default = g[g["sweep"] == "size"]["variant"]
        row["default"] = str(default.iloc[0]) if len(default) else "—"
        out.append(row)
    return pd.DataFrame(out, columns=["width", *(f"{p} TB/s" for p in WIDE_PATHS), "default"])


def _fixed_cost_fit(one_pass, copy_bw: float) -> dict:
    """Least-squares fit of time = t0 + bytes / rate over the one-pass rows (one read, one write
    of the row): the fixed cost of a call and the streaming rate, and what the narrowest width
    could reach with that fixed cost even streaming at the copy bandwidth."""
    if len(one_pass) < 2 or not one_pass["ms_median"].notna().all():
        return R.MISSING
    b = one_pass["bytes_model"].to_numpy(float)
    t = one_pass["ms_median"].to_numpy(float) * 1e-3
    slope, t0 = np.polyfit(b, t, 1)
    narrow = one_pass.loc[one_pass["width"].idxmin()]
    nb = float(narrow["bytes_model"])
    ceiling = nb / (t0 + nb / (copy_bw * 1e9)) / 1e9
    return dict(t0_us=t0 * 1e6, rate_gbps=1 / slope / 1e9, narrow_width=int(narrow["width"]),
                narrow_ceiling_gbps=ceiling)


# The command that measures the softmax backward alone, and the one that adds it to a folder.
SOFTMAX_BWD_COMMAND = ("python -m triton_fusion_report.analysis --family softmax --op softmax_bwd "
                       "--out DIR")
APPEND_COMMAND = "python -m triton_fusion_report.analysis.append_run DIR FOLDER"


def softmax_backward_moves() -> dict[str, float]:
    """Element moves per element of the (rows, width) tensor, by the traffic model: unfused,
    fused, and the fused kernel's two-pass path for rows too long for its registers."""
    rows, width = 10_000, 100_000  # large, so the per-row sums vanish

    def moves(impl, two_pass=False):
        kernels = traffic.softmax_backward_kernels(rows, width, 1, impl, two_pass)
        return round(traffic.total(kernels) / (rows * width), 2)

    return dict(unfused=moves("triton_unfused"), fused=moves("triton_fused"),
                two_pass=moves("triton_fused", two_pass=True))


def softmax_backward_findings(bwd, limits) -> dict:
    """What the softmax backward section says about its rows (`bwd`: the rows of op softmax_bwd,
    as `report.load(folder, "softmax", op="softmax_bwd")` gives them): `measured`, a sentence on
    what was measured, or that nothing was and how to measure it; and, where float32 rows were
    timed, the values it quotes (device time; bandwidth of the model bytes against the copy bandwidth of their run)."""
    timed = R.ok_rows(bwd)
    timed = timed.assign(t=synthesis.device_time(timed)).dropna(subset=["t"])
    how = (f"`{SOFTMAX_BWD_COMMAND}` measures them on a GPU, and `{APPEND_COMMAND}` adds them "
           "to a results folder.")
    if not len(bwd):
        where = ("this results folder, nor in the committed reference" if bwd.attrs.get("from_reference")
                 else "this reference")
        return dict(measured=R.Markdown(
            f"No softmax backward rows were measured in {where}: its softmax rows are the "
            f"forward's alone, so the figure and the table below are empty. {how}"))
    if not len(timed):
        worst = bwd["max_rel_err"].max()
        return dict(measured=R.Markdown(
            f"The {len(bwd)} softmax backward rows here were not timed ({_untimed_reason(bwd)}); "
            f"the worst error against float64 of those that ran is {R.md(worst, '.1e')}."))
    copy_bw = R.limit(limits, "copy_bw", run_id=R.runs_of(bwd))
    f = _softmax_backward_values(timed, copy_bw)
    f["measured"] = R.Markdown(_softmax_backward_sentence(f))
    return f


def softmax_backward_table(bwd, limits) -> pd.DataFrame:
    """Every (dtype, rows, width) of the backward: its floor (model bytes at the copy bandwidth of
    the run) as a percentage of each implementation's device time; empty without rows. (Without
    the distance table's "bound by": a few FLOPs a byte, always memory.)"""
    if not len(bwd):
        return pd.DataFrame()
    shapes = bwd[["dtype", "rows", "width"]].drop_duplicates()
    cases = {f"{d} {r} × {w}": dict(dtype=d, rows=r, width=w)
             for d, r, w in shapes.itertuples(index=False)}
    impls = R.IMPL_ORDER + R.PEERS
    return (synthesis.distance_table(bwd, limits, cases, impls=impls).drop(columns="bound by", errors="ignore")
            .rename(columns=R.short_columns(impls)))


def _untimed_reason(bwd) -> str:
    if bwd.attrs.get("on_cpu"):
        return "a run on the CPU, through Triton's interpreter"
    counts = ", ".join(f"{n} {status}" for status, n in bwd["status"].value_counts().items())
    return f"status: {counts}"


def _softmax_backward_values(timed, copy_bw: float) -> dict:
    """float32: the fused kernel's bandwidth per width, its best width, its speed over each
    baseline there (their device time over its own), and at the widest row the same over unfused."""
    fp32 = R.main_rows(timed[timed["dtype"] == "float32"])
    fused = fp32[fp32["impl"] == "triton_fused"]
    gbps = dict(zip(fused["width"].astype(int), fused["bytes_model"] / fused["t"] / 1e6))
    best = max(gbps, key=gbps.get)

    def speedup(impl, width):
        at = fp32[fp32["width"] == width].set_index("impl")["t"]
        return float(at.get(impl, np.nan) / at["triton_fused"])

    two_pass = fused[fused["variant"] == "two_pass"]["width"]
    one_tile = fused[fused["variant"] == "one_tile"]["width"]
    widest = int(fp32["width"].max())
    return dict(
        widths=(int(fp32["width"].min()), widest), gbps=gbps, best_width=best,
        best_gbps=gbps[best], best_pct=100 * gbps[best] / copy_bw,
        pct_range=(100 * min(gbps.values()) / copy_bw, 100 * max(gbps.values()) / copy_bw),
        vs={impl: speedup(impl, best) for impl in ("triton_unfused", "torch_eager", "torch_compile")},
        widest_one_tile=int(one_tile.max()) if len(one_tile) else None,
        widest_vs_unfused=speedup("triton_unfused", widest) if len(two_pass) else None,
        widest=widest,
    )


def _softmax_backward_sentence(f: dict) -> str:
    vs = f["vs"]
    text = (f"On the GPU alone (device time), the fused backward moves its model bytes at "
            f"{R.md(f['pct_range'][0], '.0f')}% to {R.md(f['pct_range'][1], '.0f')}% of the copy "
            f"bandwidth over the float32 widths {f['widths'][0]} to {f['widths'][1]}. At width "
            f"{f['best_width']}, its best, that is {R.tbps(f['best_gbps'])}: "
            f"{R.md(vs['triton_unfused'], '.2f')}× the speed of the unfused Triton version, "
            f"{R.md(vs['torch_eager'], '.2f')}× eager's and {R.md(vs['torch_compile'], '.2f')}× "
            f"torch.compile's (their time over the fused kernel's).")
    if f["widest_vs_unfused"] is not None and f["widest_one_tile"] is not None:
        text += (f" Past {f['widest_one_tile']} elements a row, where the fused kernel reads y and "
                 f"dy twice as the unfused one does, it is {R.md(f['widest_vs_unfused'], '.2f')}× "
                 f"the unfused version's speed at width {f['widest']}.")
    return text


def layernorm_findings(df) -> dict:
    """The values the chapter's prose quotes: half precision forward at the narrowest and widest
    rows, backward ratios per call and on the GPU side (device time)."""
    rows = R.main_rows(R.ok_rows(df))
    fwd = rows[(rows["direction"] == "fwd") & (rows["dtype"] == "float16")]
    bwd = rows[rows["direction"] == "bwd"]
    wide = int(fwd["width"].max())
    narrow = int(fwd["width"].min())
    fused_wide = R.value_at(fwd, "triton_fused", "gbps", width=wide)
    narrow_us = {(impl, col): R.value_at(fwd, impl, col, width=narrow) * 1000
                 for impl in ("triton_fused", "torch_eager") for col in ("ms_median", "ms_device")}
    # The backward per call (through autograd, host included) and its kernels alone (device
    # time): the faster baseline's time over ours, per (dtype, width) from 4096 columns up.
    speedup = {"ms_median": {}, "ms_device": {}}
    for (dtype, width), g in bwd[bwd["width"] >= 4096].groupby(["dtype", "width"]):
        for col in ("ms_median", "ms_device"):
            fused = R.value_at(g, "triton_fused", col)
            best_base = min(R.value_at(g, "torch_eager", col), R.value_at(g, "torch_compile", col))
            speedup[col][f"{dtype} × {width}"] = best_base / fused
    fwd_device = fwd[fwd["width"] >= 4096]
    vs_compile = [R.value_at(g, "torch_compile", "ms_device") / R.value_at(g, "triton_fused", "ms_device")
                  for _, g in fwd_device.groupby("width")]
    b4k = bwd[(bwd["dtype"] == "float16") & (bwd["width"] == 4096)]
    return dict(
        rows=int(fwd["rows"].iloc[0]), wide=wide, narrow=narrow,
        narrow_bytes=float(fwd[fwd["width"] == narrow]["bytes_model"].iloc[0]),
        narrow_us=narrow_us,
        fwd_wide_fused_gbps=fused_wide,
        fwd_wide_compile_gbps=R.value_at(fwd, "torch_compile", "gbps", width=wide),
        fwd_vs_compile_graph=(min(vs_compile), max(vs_compile)),
        bwd_device_speedup=(min(speedup["ms_device"].values()), max(speedup["ms_device"].values())),
        percall_wins=", ".join(k for k, v in speedup["ms_median"].items() if v > 1),
        percall_losses=", ".join(k for k, v in speedup["ms_median"].items() if v <= 1),
        # fp16 4096 columns, per call: how many times eager's backward is faster than ours.
        bwd_eager_gap=R.value_at(b4k, "triton_fused") / R.value_at(b4k, "torch_eager"),
    )


def autograd_thread_slowdown(host) -> tuple[float, float]:
    """From host_overhead.csv: the fused backward's host time on the autograd engine's thread over
    the same call on the main thread, (min, max) over the shapes measured."""
    h = host.set_index("case")["host_us"]
    ratios = [h[c] / h[c.replace("_backward on the autograd thread", "_backward only")]
              for c in h.index if c.endswith("_backward on the autograd thread")]
    return min(ratios), max(ratios)


# --- softmax(X) @ V and attention ------------------------------------------------------------------

def softmax_matmul_findings(df) -> dict:
    """The values the chapter quotes at the largest d2: device time (ms) and peak memory per
    precision."""
    rows = R.ok_rows(df)
    rows = rows.assign(t=synthesis.device_time(rows))
    d2 = int(rows["d2"].max())
    out = {}
    for precision in ("ieee", "tf32", "float16"):
        at = rows[(rows["precision"] == precision) & (rows["d2"] == d2)]
        out[precision] = dict(eager=R.value_at(at, "torch_eager", "t"),
                              fused=R.value_at(at, "triton_fused", "t"),
                              compile=R.value_at(at, "torch_compile", "t"),
                              unfused=R.value_at(at, "triton_unfused", "t"),
                              peak_fused=R.value_at(at, "triton_fused", "peak_mib"),
                              peak_eager=R.value_at(at, "torch_eager", "peak_mib"),
                              fastest=(at.loc[at["t"].idxmin(), "impl"]
                                       if at["t"].notna().any() else None))
    sample = rows.iloc[0]
    out_mib = sample["batch"] * sample["d1"] * sample["d3"] * 4 / 2**20
    return dict(d2=d2, out_mib=out_mib, **out)


def attention_findings(df) -> dict:
    """TFLOP/s (over device time) per impl at head_dim 128, seq 4096 (causal and not), and peak
    memory."""
    rows = R.ok_rows(df)
    rows = rows.assign(t=rows["flops_model"] / synthesis.device_time(rows) / 1e9)
    out = {}
    for causal in (False, True):
        at = rows[(rows["head_dim"] == 128) & (rows["seq"] == 4096) & (rows["causal"] == causal)]
        out[causal] = {impl: R.value_at(at, impl, "t") for impl in at["impl"].unique()}
    naive = df[df["impl"] == "torch_eager"]
    from .attention import NAIVE_IN_INPUT_DTYPE

    in_input_dtype = bool(len(naive)) and (naive["variant"] == NAIVE_IN_INPUT_DTYPE).all()
    naive_scores = ("in float16, as a user's code computes them" if in_input_dtype else
                    "in float32: this folder's naive rows predate the change to the input dtype, "
                    "so they run slower than a user's float16 code and overstate the "
                    "fused kernel's lead")
    return dict(tflops=out, naive_oom=int((naive["status"] == "oom").sum()),
                naive_scores=naive_scores,
                naive_peak_4096=R.value_at(rows[(rows["head_dim"] == 128) & (rows["seq"] == 4096)
                                              & (~rows["causal"])], "torch_eager", "peak_mib"),
                fused_peak_max=float(rows[rows["impl"] == "triton_fused"]["peak_mib"].max()))


# --- Matmul epilogues -----------------------------------------------------------------------------

MEMORY_BOUND = (65536, 512, 256)
BIG = (16384, 4096, 4096)
VOCAB = (16384, 1024, 32000)
LINEAR = (8192, 8192, 8192)


def matmul_softmax_findings(df, copy_bw: float) -> dict:
    """What the chapter quotes: `at(shape, impl)`, a float16 time (ms), and the memory-bound
    shape's floor at the copy bandwidth."""
    half = R.ok_rows(df)
    half = half[half["dtype"] == "float16"]

    def at(shape, impl, col="ms_median"):
        m, k, n = shape
        return R.value_at(half, impl, col, m=m, k=k, n=n)

    m, k, n = MEMORY_BOUND
    floor_ms = traffic.total(traffic.matmul_softmax_kernels(m, k, n, 2, "triton_fused")) \
        / copy_bw / 1e6
    return dict(floor_ms=floor_ms, at=at)


def linear_act_findings(df) -> dict:
    """TFLOP/s (over device time) of linear + GELU at 8192 cubed, float16; ms of the largest TF32
    shape."""
    rows = R.ok_rows(df)
    sel = rows[(rows["dtype"] == "float16") & (rows["m"] == LINEAR[0]) & (rows["activation"] == "gelu")]
    tf32 = rows[(rows["precision"] == "tf32") & (rows["activation"] == "gelu")]
    tf32_m = int(tf32["m"].max()) if len(tf32) else 0
    tf32 = tf32[tf32["m"] == tf32_m]
    sel = sel.assign(device_tflops=sel["flops_model"] / synthesis.device_time(sel) / 1e9)
    return dict(fused_tflops=R.value_at(sel, "triton_fused", "device_tflops"),
                unfused_tflops=R.value_at(sel, "triton_unfused", "device_tflops"),
                compile_tflops=R.value_at(sel, "torch_compile", "device_tflops"),
                cublas_tflops=R.value_at(sel, "cublas", "device_tflops"),
                eager_tflops=R.value_at(sel, "torch_eager", "device_tflops"),
                cublaslt_tflops=R.value_at(sel, "cublaslt", "device_tflops"),
                # Device µs of the 8192-cubed float16 rows: where the fused kernel's time over
                # cuBLAS's plain matmul goes (our matmul: unfused pair - eager, the same two steps
                # on another matmul; the epilogue: fused - unfused).
                **{f"{impl}_us": 1e3 * R.value_at(sel, impl, "ms_device")
                   for impl in ("triton_fused", "triton_unfused", "torch_eager", "cublas")},
                tf32_m=tf32_m,
                **{f"tf32_{impl}_ms": R.value_at(tf32.assign(t=synthesis.device_time(tf32)),
                                                 impl, "t")
                   for impl in ("triton_fused", "cublas", "torch_compile", "torch_eager")})


def user_shapes(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The reduction shapes users meet first, apart from the power-of-two width sweeps: a width
    that is not a power of two (a vocabulary, 50257; a hidden size, 5120) or a few rows (decoding,
    where the softmax's split path runs). One row per (op, dtype, rows, width): the fused kernel's
    path and device time (µs), the fastest other implementation (our unfused pair excluded: the
    libraries and PyTorch) with its time, and that time over ours (> 1: ours is faster).
    `frames`: label -> a family's rows (all ops)."""
    out = []
    for label, df in frames.items():
        ok = df[(df["sweep"] == "size") & (df["status"] == "ok")].reset_index(drop=True)
        if not len(ok):
            continue
        odd = (ok["width"].astype(int) & (ok["width"].astype(int) - 1)) != 0
        few = ~ok.index.isin(R.main_rows(ok).index)
        ok = ok[odd | few].assign(t=synthesis.device_time)
        for (op, dtype, rows, width), g in ok.groupby(["op", "dtype", "rows", "width"], sort=False):
            if g["impl"].duplicated().any():
                raise R.AmbiguousRows(f"{label} {op} {dtype} {rows}x{width}: several rows per impl")
            t = g.set_index("impl")["t"].dropna()
            others = t.drop(["triton_fused", "triton_unfused"], errors="ignore")
            if "triton_fused" not in t or not len(others):
                continue
            best = others.idxmin()
            fused = g[g["impl"] == "triton_fused"].iloc[0]
            path = fused["variant"] if isinstance(fused["variant"], str) else "—"
            out.append({"op": f"{label} {'bwd' if 'bwd' in op else 'fwd'} "
                              f"{R.SHORT_DTYPE.get(dtype, dtype)}",
                        "shape": f"{int(rows)}×{int(width)}",
                        "path": path, "ours µs": 1e3 * t["triton_fused"],
                        "fastest other": ("max-autotune" if best == "torch_compile_max"
                                          else R.IMPL_LABEL.get(best, best)),
                        "its µs": 1e3 * others[best],
                        "its / ours": others[best] / t["triton_fused"]})
    return pd.DataFrame(out, columns=["op", "shape", "path", "ours µs", "fastest other",
                                      "its µs", "its / ours"])


def user_shapes_sentence(table: pd.DataFrame) -> str:
    """The prose under the user-shapes table: how many shapes the fused kernel leads, and where
    it loses, by how much."""
    if not len(table):
        return "These data time none of these shapes; `make bench` on a GPU measures them."
    wins = table[table["its / ours"] > 1]
    losses = table[table["its / ours"] <= 1].sort_values("its / ours")
    text = f"The fused kernel is the fastest at {len(wins)} of these {len(table)} shapes."
    if len(losses):
        worst = losses.iloc[0]
        text += (f" It is behind at {len(losses)}: the farthest is {worst['op']} at "
                 f"{worst['shape']}, where {worst['fastest other']} takes "
                 f"{R.md(worst['its / ours'], '.2f')}× our time.")
    return text
