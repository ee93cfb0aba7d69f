"""The families a bench can sweep, each one's grid (from its grid module), and which problems a
run takes of them (--family, --grid, --op, --where).

Four grids:
- "book" (the default): the sizes the book's figures and tables show, one trial per
  configuration, and the two baselines that search at every new shape (torch.compile's
  max-autotune, FlagGems' autotuned attention) at each family's headline case only.
- "reference": what builds the committed references (`make reference`): the book's sizes with
  every baseline the book reads there (attention's searching ones at its headline shape only, as
  in the full grid), three interleaved trials where the book reads the trials' spread
  (`spread_read`), one elsewhere.
- "full": every size, block and baseline, three trials (attention's two searching baselines at its
  headline case only, FULL_SEARCHES_HEADLINE_ONLY): a deep sweep that nothing in the book needs.
- "smoke": toy shapes, one brief trial (the pipeline's check, on a CPU or a GPU): our kernels and
  eager at every shape, the other baselines at each op's first shape only, none that searches.
"""
from __future__ import annotations

import importlib

from ..families import FAMILIES
from . import sweep


def _grid(spec: str):
    """The problems function a registry entry's `grid` ("module:function") names."""
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), function)


# Each family's problems: PROBLEMS[family](grid) (the registry's grid functions).
PROBLEMS = {name: _grid(f.grid) for name, f in FAMILIES.items()}


GRIDS = ("book", "reference", "full", "smoke")
# Trials per configuration (the reference grid: SPREAD_TRIALS where the book reads the spread).
TRIALS = {"book": 1, "reference": 1, "full": 3, "smoke": 1}
SPREAD_TRIALS = sweep.TRIALS  # as the full grid
# Where the book reads the spread of a row's trials, so that the reference grid times three:
# each family's headline case (the findings and the across-families chapter call rows within a
# few percent there a tie, TIE in analysis/book/summary.py and across.py) and every linear +
# activation shape (the matmul chapter sets its trials' spread against the gaps between
# implementations, analysis/book/matmul.py `_linear_all`). The reproducibility appendix's spread
# sentence reads whichever rows have several trials.
SPREAD_READ_FAMILIES = {"linear_act"}
# The timing protocol's knobs, where a grid departs from timing.py's defaults: the smoke grid
# checks the pipeline, its numbers are not read, so each row is timed briefly; the book grid
# replays half the GPU work per graph (ms_device still the median of 10-200 calls).
TIMING = {"book": dict(per_graph_ms=10), "reference": dict(per_graph_ms=10), "full": {},
          "smoke": dict(warmup_ms=1, rep_ms=5, min_reps=5, per_graph_ms=2)}
# Baselines that search (compile and time many candidates) at every new shape: in the book grid,
# only at the headline case, where the book compares against them by name; FlagGems' attention
# (40 s at the headline alone, behind cuDNN and FlashAttention) and max-autotune of the LM head
# and its loss (58 s, on an H100) not at all.
SEARCHING = {("layernorm", "flag_gems"), *((f, "torch_compile_max") for f in FAMILIES)}
# In the full grid too, where searching at every shape cost the most and never won: attention's
# max-autotune and FlagGems took 1,167 of the 3,894 s of rows of the H100 reference of 2026-11-26
# and were at best 1.007x and 1.21x the fastest row at each of its 44 shapes.
FULL_SEARCHES_HEADLINE_ONLY = {("attention", "flag_gems"), ("attention", "torch_compile_max")}
BOOK_LEAVES_OUT = {("attention", "flag_gems"), ("linear_cross_entropy", "torch_compile_max")}
# The reference grid runs FULL_SEARCHES_HEADLINE_ONLY at the headline case, and FlagGems' attention
# at the headline shape causal too: the attention chapter names its speed there with both masks.
REFERENCE_BOTH_MASKS = {("attention", "flag_gems")}
# The smoke grid checks the pipeline, in ~90 s on a GPU with empty caches: a search at every toy
# shape would be most of that (max-autotune; FlagGems autotunes), and a baseline's first call at
# each shape (torch.compile tracing, cuDNN building its plan) the rest. So our kernels and eager
# at every toy shape (odd sizes, masks), every other baseline at each op's first shape (so at
# one dtype and mask: the others, e.g. float16 or causal, compare ours with eager alone).
SMOKE_LEAVES_OUT = {"torch_compile_max", "flag_gems"}
SMOKE_EVERY_SHAPE = {"torch_eager", "triton_unfused", "triton_fused"}


def is_headline(p: sweep.Problem, ignore: tuple = ()) -> bool:
    """Whether the problem is its family's headline case (its first registry headline), the
    columns in `ignore` left out of the comparison."""
    want = FAMILIES[p.family].headlines[0]
    have = {**p.shape, "dtype": sweep.dtype_name(p.dtype), "precision": p.precision}
    return all(have.get(k) == v for k, v in want.items() if k not in ignore)


def spread_read(p: sweep.Problem) -> bool:
    """Whether the book reads the spread of this problem's trials (SPREAD_READ_FAMILIES)."""
    return is_headline(p) or p.family in SPREAD_READ_FAMILIES


def grid_sizes(grid: str) -> str:
    """The grid whose sizes `grid` runs: the reference grid runs the book's."""
    return "book" if grid == "reference" else grid


def _reference_keeps(p: sweep.Problem, impl: str) -> bool:
    """Whether the reference grid measures `impl` on problem `p`: every baseline, but attention's
    searching ones only at the headline (FlagGems' with either mask there)."""
    if (p.family, impl) not in FULL_SEARCHES_HEADLINE_ONLY or is_headline(p):
        return True
    return (p.family, impl) in REFERENCE_BOTH_MASKS and is_headline(p, ignore=("causal",))


def select_ops(problems: list[sweep.Problem], ops: list[str] | None) -> list[sweep.Problem]:
    """The problems whose op is one of `ops` (all of them when `ops` is None). An op that none of
    the problems has is an error naming the ones there are (a typo would otherwise measure
    nothing and say nothing)."""
    if not ops:
        return problems
    known = list(dict.fromkeys(p.op for p in problems))
    unknown = [op for op in ops if op not in known]
    if unknown:
        raise ValueError(f"--op {', '.join(unknown)}: no such op in the families chosen; "
                         f"their ops are {', '.join(known)}")
    return [p for p in problems if p.op in ops]


def select_shapes(problems: list[sweep.Problem], where: list[str] | None) -> list[sweep.Problem]:
    """The problems whose shape has every COL=VALUE of `where` (a few headline shapes measured
    alone; COL=V1,V2 keeps either value); a problem without the column is left out."""
    if not where:
        return problems
    wanted = {}
    for item in where:
        col, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--where {item}: expected COLUMN=VALUE, e.g. seq=4096")
        wanted[col] = [int(v) if v.lstrip("-").isdigit()
                       else {"True": True, "False": False}.get(v, v) for v in value.split(",")]
    return [p for p in problems
            if all(col in p.shape and p.shape[col] in vs for col, vs in wanted.items())]


def select_problems(args) -> list[sweep.Problem]:
    """The grid's problems, in a fixed order (every worker builds the same list)."""
    sizes = grid_sizes(args.grid)
    problems = [p for fam in (args.family or sorted(FAMILIES)) for p in PROBLEMS[fam](sizes)]
    seen_ops = set()
    for p in problems:
        if args.grid == "smoke":
            first = p.op not in seen_ops
            seen_ops.add(p.op)
            p.variants = [v for v in p.variants if v.impl not in SMOKE_LEAVES_OUT
                          and (first or v.impl in SMOKE_EVERY_SHAPE)]
        elif args.grid == "book":
            dropped = BOOK_LEAVES_OUT | (set() if is_headline(p) else SEARCHING)
            p.variants = [v for v in p.variants if (p.family, v.impl) not in dropped]
        elif args.grid == "reference":
            p.variants = [v for v in p.variants if _reference_keeps(p, v.impl)]
            if spread_read(p):
                p.trials = SPREAD_TRIALS
        elif not is_headline(p):
            p.variants = [v for v in p.variants
                          if (p.family, v.impl) not in FULL_SEARCHES_HEADLINE_ONLY]
    chosen = select_shapes(select_ops(problems, args.op), args.where)
    if args.where and not chosen:  # a typo'd column or value would measure nothing, silently
        columns = sorted({c for p in problems for c in p.shape})
        raise ValueError(f"--where {' '.join(args.where)}: no problem of the families and ops "
                         f"chosen has that shape; their shape columns are {', '.join(columns)}")
    return chosen
