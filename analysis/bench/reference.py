"""`make reference`: a committed reference's one command, at one commit with a clean tree.

    python -m triton_fusion_report.analysis.bench.reference --out DIR [--warm N]
        [--profile-budget S] [--limit S] [--force]

In order, each step skipped where DIR already holds it, so that the same command run again
continues a call that a time limit cut (a device call ends at 10 minutes; the reference takes
longer cold, docs/benchmarking.md):
1. the sweep of the reference grid with its compile pass (`--grid reference --tail`), resumed
   (`--resume`) where DIR holds an unfinished run of it;
2. its tail steps (seed 002, the launch costs, the GPT-2 check), those not done yet: with the
   sweep's command, or alone where the sweep had finished;
3. `make profile`'s two passes over the cases the book reads, those not held in full yet
   (`--resume`), within what --limit leaves (and --profile-budget seconds, where given: a
   reference needs every case, so no budget by default; a stalled case is killed all the same).
Then it says whether DIR is complete, and how to promote it (tools/promote.py). It refuses to
start on a tree with uncommitted changes (a reference is one commit: the rows would record one
that is not), unless --force, whose result promote refuses; and on a folder of another commit.
--limit S stops it cleanly after S seconds (its steps interrupted, the profile given what is
left), ready to be run again: exit status 3 then, 0 when DIR is complete, 1 when a step failed.
Standard library and pandas only: the steps run in processes of their own.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from . import steps

PACKAGE = __package__  # triton_fusion_report.analysis.bench
ROOT = Path(__file__).resolve().parents[2]
GRACE_S = 20  # after an interrupt, before a step's processes are killed
INCOMPLETE = 3  # exit status: run the same command again


def git(*args) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, text=True, capture_output=True,
                          check=True).stdout.strip()


def tree_state() -> tuple[str | None, str]:
    """(the checkout's commit, why it cannot make a reference: "" where it can). A changed tree
    is as analysis/bench/machine.py's git_commit says: tracked files that differ."""
    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != ROOT.resolve():
            return None, "not the project's own git checkout: the rows would record no commit"
        commit = git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None, "git does not answer here: the rows would record no commit"
    if changed:
        return commit, ("the tree has uncommitted changes (git status):\n  "
                        + "\n  ".join(changed.splitlines()[:10]))
    return commit, ""


def sweep_state(out: Path) -> tuple[str, str | None]:
    """("none" | "unfinished" | "finished", the commit of its runs) of the bench in `out`."""
    path = out / "runs.parquet"
    if not path.exists():
        return "none", None
    runs = pd.read_parquet(path)
    if not len(runs):
        return "none", None
    commit = str(runs["git_commit"].iloc[0]).removesuffix("-dirty")
    return ("finished" if (runs["status"] == "finished").any() else "unfinished"), commit


def profile_state(out: Path) -> list[str]:
    """What the profile's files lack (empty: both hold every case, none skipped or cut)."""
    out_of = []
    for name in ("profile.parquet", "profile_details.parquet"):
        path = out / name
        if not path.exists():
            out_of.append(f"no {name}")
            continue
        skipped = int((pd.read_parquet(path)["status"] == "skipped").sum())
        if skipped:
            out_of.append(f"{name}: {skipped} cases skipped (its budget)")
    return out_of


class Steps:
    """Runs each step as a process group of its own, within the time --limit leaves."""

    def __init__(self, limit: float | None):
        self.t0 = time.monotonic()
        self.deadline = None if not limit else self.t0 + limit
        self.stopped = False

    def left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def run(self, name: str, cmd: list[str]) -> int | None:
        """The step's exit status; None where the limit stopped it (or left it no time)."""
        left = self.left()
        if left is not None and left <= 0:
            self.stopped = True
            return None
        print(f"reference: {name}: {' '.join(cmd)}", flush=True)
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)
        try:
            code = proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            # Interrupted as Ctrl-C would: the bench keeps every row written and closes its
            # tail's processes, the profile kills its ncu; whatever is left then, killed.
            self.stopped = True
            print(f"reference: {name} stopped at the time limit", flush=True)
            _signal_group(proc, signal.SIGINT)
            try:
                proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
            return None
        except BaseException:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
            raise
        print(f"reference: {name} {time.monotonic() - t0:.0f} s"
              + (f" (exit {code})" if code else ""), flush=True)
        return code


def _signal_group(proc, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:  # ended meanwhile
        pass


def gpu_folder(out: Path) -> str:
    """results/reference/<gpu>: the short name of the GPU the runs name (h100, h200, ...)."""
    runs = pd.read_parquet(out / "runs.parquet")
    found = re.search(r"\b([A-Z]\d{2,3})\b", str(runs["gpu"].iloc[0]))
    return f"results/reference/{found.group(1).lower() if found else '<gpu>'}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {PACKAGE}.reference", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="the reference's results folder")
    ap.add_argument("--warm", type=int, default=-1, help="the bench's --warm")
    ap.add_argument("--profile-budget", type=float, metavar="S",
                    help="at most S seconds of profile (default: what --limit leaves, else none)")
    ap.add_argument("--limit", type=float, metavar="S",
                    help="stop cleanly after S seconds, to be run again (default: none)")
    ap.add_argument("--force", action="store_true",
                    help="run on a changed tree (to try the command): promote refuses the result")
    args = ap.parse_args(argv)
    out = args.out
    commit, why = tree_state()
    if why and not args.force:
        print(f"reference: refused: {why}\nCommit first (a reference is one commit with a clean "
              "tree), or FORCE=1 to try the command: tools/promote.py refuses what it makes.",
              file=sys.stderr)
        return 1
    if why:
        print(f"reference: FORCE: {why}\nreference: what this run makes cannot be promoted.",
              flush=True)
    state, at = sweep_state(out)
    if at is not None and commit is not None and at != commit:
        print(f"reference: refused: {out} holds a bench at {at[:12]}, this checkout is "
              f"{commit[:12]}: give a new REFERENCE_OUT", file=sys.stderr)
        return 1
    run = Steps(args.limit)
    py, failed = sys.executable, []
    if state != "finished":  # the sweep, then the tail steps not done (the bench runs them)
        bench = [py, "-m", PACKAGE, "--out", str(out), "--grid", "reference", "--tail",
                 "--warm", str(args.warm)] + (["--resume"] * (state != "none"))
        code = run.run("bench", bench)
        if code:
            failed.append("bench")
    elif steps.done(out) != {s for s, _ in steps.TAIL_STEPS}:  # the sweep done, not its tail
        print(f"reference: the sweep in {out} is finished; its tail steps not done yet",
              flush=True)
        for step, _ in steps.TAIL_STEPS:
            if step in steps.done(out):
                continue
            code = run.run(step, [py, "-m", f"{PACKAGE}.{step}", *steps.step_argv(out, step)])
            if code == 0:
                steps.mark_done(out, step)
            elif code is not None:
                failed.append(step)
    state, _ = sweep_state(out)
    ncu = shutil.which(os.environ.get("NCU", "ncu"))
    if state == "finished" and not run.stopped and profile_state(out):
        if ncu is None:
            print("reference: no Nsight Compute (ncu) on the PATH: the reference lacks its "
                  "profile", flush=True)
        elif run.left() is not None and run.left() - GRACE_S < 30:
            run.stopped = True  # too little left to profile a case: the next call does
        else:
            left = run.left()
            caps = [b for b in (args.profile_budget, None if left is None else left - GRACE_S)
                    if b is not None]
            code = run.run("profile", [py, "-m", f"{PACKAGE}.profile", "--out", str(out),
                                       "--both", "--resume"]
                           + (["--budget", f"{min(caps):.0f}"] if caps else []))
            if code:
                failed.append("profile")
    lacking = ([] if state == "finished" else ["the sweep"]) + [
        f"the {s} step" for s, _ in steps.TAIL_STEPS if s not in steps.done(out)]
    lacking += profile_state(out) if ncu is not None else []
    print(f"reference: {time.monotonic() - run.t0:.0f} s", flush=True)
    if failed:
        print(f"reference: failed: {', '.join(failed)} (see above); lacking: "
              f"{', '.join(lacking) or 'nothing'}", flush=True)
        return 1
    if lacking:
        print(f"reference: {out} is not complete ({', '.join(lacking)}): run the same command "
              "again to continue (on the same machine: its compile caches are warm)", flush=True)
        return INCOMPLETE
    print(f"reference: {out} is complete"
          + (" (FORCE: from a changed tree, promote refuses it)" if why else
             f"; promote it: python tools/promote.py {out} {gpu_folder(out)}"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
