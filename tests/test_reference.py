"""make reference (analysis/bench/reference.py): one commit with a clean tree, each step once, the
same command continuing a call that a time limit cut; the steps stood in for (no GPU here)."""

import sys
import time

import pandas as pd
import pytest

from triton_fusion_report.analysis.bench import reference as R
from triton_fusion_report.analysis.bench import steps

COMMIT = "c" * 40


@pytest.fixture
def stand_ins(monkeypatch):
    """A clean tree at COMMIT, an ncu on the PATH, and steps that record their command and do
    what `effects[name]` says (a function of the command) instead of running."""
    ran, effects = [], {}

    def run(self, name, cmd):
        ran.append((name, cmd))
        return effects.get(name, lambda cmd: 0)(cmd)

    monkeypatch.setattr(R, "tree_state", lambda: (COMMIT, ""))
    monkeypatch.setattr(R.shutil, "which", lambda name: "/usr/bin/ncu")
    monkeypatch.setattr(R.Steps, "run", run)
    return ran, effects


def _runs(out, status="finished", commit=COMMIT):
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(dict(run_id=["r"], git_commit=[commit], status=[status],
                      gpu=["NVIDIA H100 80GB HBM3"])).to_parquet(out / "runs.parquet")


def _profile(out, statuses=("ok",)):
    for name in ("profile.parquet", "profile_details.parquet"):
        pd.DataFrame(dict(status=list(statuses))).to_parquet(out / name)


def _sweep_and_tail(cmd):
    out = R.Path(cmd[cmd.index("--out") + 1])
    _runs(out)
    for step, _ in steps.TAIL_STEPS:
        steps.mark_done(out, step)
    return 0


def test_reference_refuses_a_changed_tree_unless_forced(tmp_path, monkeypatch, capsys,
                                                        stand_ins):
    ran, effects = stand_ins
    monkeypatch.setattr(R, "tree_state", lambda: (COMMIT, "the tree has uncommitted changes"))
    assert R.main(["--out", str(tmp_path / "ref")]) == 1
    err = capsys.readouterr().err
    assert "refused: the tree has uncommitted changes" in err and "FORCE=1" in err and not ran
    effects["bench"] = _sweep_and_tail
    effects["profile"] = lambda cmd: _profile(R.Path(cmd[cmd.index("--out") + 1])) or 0
    assert R.main(["--out", str(tmp_path / "ref"), "--force"]) == 0
    printed = capsys.readouterr().out
    assert "cannot be promoted" in printed and "promote refuses it" in printed
    _runs(tmp_path / "other", commit="d" * 40)
    monkeypatch.setattr(R, "tree_state", lambda: (COMMIT, ""))
    assert R.main(["--out", str(tmp_path / "other")]) == 1
    assert "holds a bench at dddddddddddd" in capsys.readouterr().err


def test_reference_runs_each_step_once_and_continues_where_it_stopped(tmp_path, capsys,
                                                                      stand_ins):
    """A first call: the reference grid's bench with its tail, stopped part way (the run left
    unfinished): status 3. The same command: the bench resumed, then the profile (both passes,
    resumed, within the budget given, or what the limit leaves); a profile left incomplete: 3
    again; then complete: 0 and how to promote. With the sweep finished but a tail step not
    done, that step alone runs."""
    ran, effects = stand_ins
    out = tmp_path / "ref"
    effects["bench"] = lambda cmd: _runs(out, status="running") or None  # cut by the limit
    assert R.main(["--out", str(out), "--warm", "4"]) == R.INCOMPLETE
    (name, bench), = ran
    assert name == "bench" and bench[bench.index("--grid") + 1] == "reference"
    assert "--tail" in bench and "--resume" not in bench and bench[bench.index("--warm") + 1] == "4"
    assert "run the same command again" in capsys.readouterr().out

    ran.clear()
    effects["bench"] = _sweep_and_tail
    effects["profile"] = lambda cmd: _profile(out, ("ok", "skipped")) or 0
    assert R.main(["--out", str(out), "--profile-budget", "200"]) == R.INCOMPLETE
    assert [n for n, _ in ran] == ["bench", "profile"] and "--resume" in ran[0][1]
    profile = ran[1][1]
    assert {"--both", "--resume"} <= set(profile) and profile[profile.index("--budget") + 1] == "200"
    assert "skipped" in capsys.readouterr().out

    # Under a limit the profile has what the limit leaves, or the budget given where less;
    # without either, no budget.
    for argv, low, high in ((["--limit", "1000"], 950, 1000 - R.GRACE_S),
                            (["--limit", "1000", "--profile-budget", "200"], 200, 200),
                            (["--limit", "100", "--profile-budget", "200"], 50, 100 - R.GRACE_S)):
        ran.clear()
        assert R.main(["--out", str(out), *argv]) == R.INCOMPLETE
        profile = ran[0][1]
        assert low <= float(profile[profile.index("--budget") + 1]) <= high, argv

    ran.clear()
    effects["profile"] = lambda cmd: _profile(out) or 0
    assert R.main(["--out", str(out)]) == 0
    assert [n for n, _ in ran] == ["profile"] and "--budget" not in ran[0][1]
    assert f"python tools/promote.py {out} results/reference/h100" in capsys.readouterr().out

    ran.clear()  # the tail cut after the sweep: the step not done runs alone, then is marked
    (out / steps.MARKS / "model_check").unlink()
    assert R.main(["--out", str(out)]) == 0
    (name, cmd), = ran
    assert name == "model_check" and cmd[2].endswith(".model_check") and cmd[-2:] == [
        "--out", str(out)]
    assert steps.done(out) == {s for s, _ in steps.TAIL_STEPS}


def test_reference_steps_stop_at_the_limit(tmp_path):
    """A step still running at the limit is interrupted (then killed) with its process group,
    and the next one is not started: the caller runs the command again."""
    run = R.Steps(limit=1.0)
    t0 = time.monotonic()
    code = run.run("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    assert code is None and run.stopped and time.monotonic() - t0 < 30
    assert run.run("next", [sys.executable, "-c", "pass"]) is None
    assert R.Steps(limit=None).run("quick", [sys.executable, "-c", "raise SystemExit(4)"]) == 4


def test_tail_steps_marked_done_are_not_run_again(tmp_path):
    """The bench's tail steps that ran to their end are marked in the folder; a resumed bench
    starts only the others (steps.done)."""
    out = tmp_path / "run"
    assert steps.done(out) == set()
    steps.mark_done(out, "seed002")
    assert steps.done(out) == {"seed002"}
    assert steps.step_argv(out, "launch_cost") == ["--out", str(out / "launch_cost.csv")]
