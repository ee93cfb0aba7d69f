"""What runs beside the sweep: the compile pass before it (warm-up processes) and the tail steps
after it."""

import os
import re
import sys

import torch

from triton_fusion_report.analysis.bench import __main__ as cli
from triton_fusion_report.analysis.bench import families

from conftest import FULL


def test_warm_calls_the_compiling_variants_and_keeps_no_choice(monkeypatch):
    """The warm-up calls each Triton, torch.compile and peer variant (and its graph_fn) once,
    and turns off every disk copy of a tuning choice."""
    from types import SimpleNamespace

    from triton_fusion_report.analysis.bench import warm

    args = SimpleNamespace(grid="smoke", family=["layernorm"], op=None, where=None)
    problem = families.select_problems(args)[0]
    called = []
    for v in problem.variants:
        v.fn = (lambda name: lambda *a: called.append(name))(v.impl)
        v.graph_fn = None
    assert warm.warm_problem(problem, torch.device("cpu")) == (len(called), 0)
    assert sorted(called) == sorted(v.impl for v in problem.variants if v.impl in warm.WARMED)
    assert set(called) <= set(warm.WARMED) and "torch_compile" in called
    compiled = next(v for v in problem.variants if v.impl == "torch_compile")
    compiled.fn = lambda *a: 1 / 0  # a failed first call: counted (the timed sweep records it)
    ran = len(called) - 1
    assert warm.warm_problem(problem, torch.device("cpu")) == (ran, 1)
    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "1")
    monkeypatch.setenv("FLAGGEMS_DB_URL", "")  # restored after the test
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config, "autotune_local_cache", True)
    warm.no_kept_choices()
    from triton import knobs

    assert not knobs.autotuning.cache and not inductor_config.autotune_local_cache
    assert __import__("os").environ["FLAGGEMS_DB_URL"] == "sqlite:///:memory:"
    with warm.no_cached_graph():  # around a max-autotune graph, whose pick it holds
        assert not inductor_config.fx_graph_cache


def test_warm_tail_steps_name_their_first_calls(monkeypatch):
    """Each TAIL entry names a tail step module whose warm(device, arg) makes its first calls
    (the GPT-2 check's takes each compiled variant it times); a step that raises is reported,
    not fatal."""
    import importlib

    from triton_fusion_report.analysis.bench import model_check, warm

    called = []
    for step, arg in warm.TAIL:
        module = importlib.import_module(f"triton_fusion_report.analysis.bench.{step}")
        monkeypatch.setattr(module, "warm", lambda device, a, step=step: called.append((step, a)))
        assert step != "model_check" or arg in model_check.DEFAULT_TIMINGS
    for entry in warm.TAIL:
        warm.warm_tail(*entry, torch.device("cpu"))
    assert called == list(warm.TAIL)
    monkeypatch.setattr(model_check, "warm", lambda device, a: 1 / 0)
    warm.warm_tail("model_check", "torch_compile", torch.device("cpu"))  # reported, not raised


def test_the_bench_runs_as_a_module():
    """`python -m triton_fusion_report.analysis.bench` (what make bench runs) reaches main."""
    import subprocess

    run = subprocess.run([sys.executable, "-m", "triton_fusion_report.analysis.bench", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "--tail" in run.stdout


def test_tail_steps_all_run_when_one_fails(tmp_path, capsys, monkeypatch):
    """make bench's steps after the sweep (cli.TAIL_STEPS) start before it, each in a process of
    its own with its --out, and run in turn once told; one that fails (in its main, or at its
    import, before its turn) is reported, the next ones still run, and the bench fails. A step
    never told to go exits without running. The steps that succeeded are marked done in the
    folder, and a resumed bench starts only the others."""
    steps = tmp_path / "steps"
    steps.mkdir()
    (steps / "__init__.py").write_text("")
    for step, _ in cli.TAIL_STEPS:  # stand-ins: each records its argv; seed002 fails
        (steps / f"{step}.py").write_text(
            "import pathlib, sys\n"
            "def main(argv):\n"
            f"    pathlib.Path({str(tmp_path)!r}, '{step}.ran').write_text(' '.join(argv))\n"
            f"    return {int(step == 'seed002')}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setattr(cli, "__package__", "steps")
    out = tmp_path / "run"
    assert cli.run_tail(cli.start_tail(out), out) == 1
    assert (tmp_path / "launch_cost.ran").read_text() == f"--out {out / 'launch_cost.csv'}"
    assert cli.done(out) == {"launch_cost", "model_check", "lm_head_front"}
    again = cli.start_tail(out, cli.done(out))
    assert [step for step, _ in again] == ["seed002"]
    for _, proc in again:
        proc.stdin.close()
        proc.wait(timeout=60)
    assert all((tmp_path / f"{s}.ran").exists() for s, _ in cli.TAIL_STEPS)
    printed = capsys.readouterr().out
    assert "bench: seed002" in printed and "FAILED" in printed and "bench: model_check" in printed
    for step in (tmp_path / f"{s}.ran" for s, _ in cli.TAIL_STEPS):
        step.unlink()
    waiting = cli.start_tail(out)
    for _, proc in waiting:
        proc.stdin.close()
    assert [proc.wait(timeout=60) for _, proc in waiting] == [2] * len(cli.TAIL_STEPS)
    assert not list(tmp_path.glob("*.ran"))
    (steps / "launch_cost.py").write_text("raise RuntimeError('a step that fails to import')\n")
    assert cli.run_tail(cli.start_tail(out)) == 1  # it died before its turn: the rest still run
    assert (tmp_path / "model_check.ran").exists() and not (tmp_path / "launch_cost.ran").exists()
    assert re.search(r"bench: launch_cost \d+ s FAILED", capsys.readouterr().out)


def test_a_finished_compile_pass_is_not_run_again(monkeypatch, tmp_path):
    """A compile pass that ran to its end marks both caches; the same bench then skips it, not
    another grid's problems, nor one with the tail steps, nor after either cache is emptied."""
    from types import SimpleNamespace

    from triton_fusion_report.analysis.bench import warm

    folders = [tmp_path / "triton", tmp_path / "inductor"]
    monkeypatch.setattr(warm, "cache_folders", lambda: folders)
    args = SimpleNamespace(grid="smoke", family=["elementwise"], op=None, where=None)
    problems = families.select_problems(args)
    assert not warm.already_warm(args, problems, False)
    warm.mark_warm(args, problems, False)
    assert warm.already_warm(args, problems, False)
    assert not warm.already_warm(args, problems, True)
    assert not warm.already_warm(args, problems[1:], False)
    next(folders[0].glob("fusion-warm-*")).unlink()  # Triton's cache emptied
    assert not warm.already_warm(args, problems, False)
    # Marked when every process exited cleanly, whatever calls failed in it (a variant that
    # cannot run fails in every pass: withholding the marker would repeat the pass on each
    # resumed bench); not when a process died.
    assert warm.ran_to_its_end([0, 0]) and not warm.ran_to_its_end([0, -9])
    assert not warm.ran_to_its_end([0, None])


@FULL
def test_warm_processes_run_the_smoke_grid(tmp_path, monkeypatch, device):
    """Two spawned processes warm the elementwise smoke grid on the suite's device (on a CPU the
    interpreter: the machinery), and the finished pass marks the caches."""
    from types import SimpleNamespace

    from triton_fusion_report.analysis.bench import warm

    monkeypatch.setattr(warm, "cache_folders", lambda: [tmp_path / "triton", tmp_path / "ind"])
    args = SimpleNamespace(grid="smoke", family=["elementwise"], op=None, where=None,
                           device=str(device), no_progress=True)
    problems = families.select_problems(args)
    took, longest = warm.run(args, problems, 2)
    assert took > 0 and "a process's start" in longest and "add_mul" in longest, longest
    assert warm.already_warm(args, problems, False)


def test_lm_head_front_is_a_tail_step_without_max_autotune(tmp_path):
    """The LM head's time-memory front runs after the sweep into the folder's CSV, without
    max-autotune unless asked (`--max`), at every chunking and at the one our op takes by
    itself."""
    from triton_fusion_report.analysis.bench import lm_head_front as F
    from triton_fusion_report.analysis.bench import steps, warm

    out = tmp_path / "run"
    argv = steps.step_argv(out, "lm_head_front")
    assert argv == ["--out", str(out / "lm_head_front.csv")]
    assert not F.parse(argv).max and F.parse([*argv, "--max"]).max
    assert ("lm_head_front", None) in warm.TAIL
    for n, _, v in F.SHAPES:
        rows = F.chunk_rows(n, v)
        assert F.default_rows(n, v) in rows and {-(-n // c) for c in F.CHUNKS} <= set(rows)
        impls = [impl for impl, _, _ in F._impls(n, v, bias=False, most=False)]
        assert "torch_compile_max" not in impls and "cce" in impls
        assert impls.count("triton_fused") == len(rows)
        with_max = [impl for impl, _, _ in F._impls(n, v, bias=True, most=True)]
        assert "torch_compile_max" in with_max and "cce" not in with_max
