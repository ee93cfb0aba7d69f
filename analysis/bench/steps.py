"""The bench's steps after the sweep (`--tail`), and which of them a results folder has done: what
the bench and `make reference` (analysis/bench/reference.py) share. Standard library only."""
from __future__ import annotations

from pathlib import Path

# The steps after the sweep (module of analysis.bench, its arguments after --out), each in a
# process of its own: a process that ran the sweep holds its memory and a larger heap, which
# raised the GPT-2 check's peak memory, host time per step and compile time (measured).
# lm_head_front: the LM head's time against its memory, without max-autotune (its default).
TAIL_STEPS = (("seed002", ()), ("launch_cost", ("launch_cost.csv",)), ("model_check", ()),
              ("lm_head_front", ("lm_head_front.csv",)))
# A step that ran to its end (exit 0) leaves a mark here, so that a folder's later command runs
# only the steps not done (a device call's time limit may cut the tail; its files alone cannot
# say, the GPT-2 check writes its CSV files part by part).
MARKS = ".tail"


def mark_done(out: Path, step: str) -> None:
    (Path(out) / MARKS).mkdir(parents=True, exist_ok=True)
    (Path(out) / MARKS / step).write_text("done\n")


def done(out: Path) -> set[str]:
    """The tail steps that ran to their end into `out`."""
    folder = Path(out) / MARKS
    return {step for step, _ in TAIL_STEPS if (folder / step).exists()}


def step_argv(out: Path, step: str) -> list[str]:
    """A step's command-line arguments: its --out (a file of the folder, or the folder)."""
    file = dict(TAIL_STEPS)[step]
    return ["--out", str(Path(out).joinpath(*file))]
