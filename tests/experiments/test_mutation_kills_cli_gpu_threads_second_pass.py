"""Tests written in a second mutation-testing audit of the command line (``experiments/cli.py`` and
``experiments/__main__.py``: argument parsing, exit codes, what is printed and where), the GPU helpers
(``experiments/gpu.py``: device checks, the workers' command line, environment and processes) and the
thread sizing (``experiments/threads.py``).

Each test kills a mutant of the library code that the rest of the suite (with the first-pass files
``test_mutation_kills_cli_gpu_compare.py``, ``test_mutation_kills_config_cli.py`` and
``test_mutation_kills_publish_threads.py``) let through; its docstring names it (file and mutation).
The references are independent of the code: usage lines, printed lines and command lines written out by
hand, and stand-ins for the functions the command line dispatches to (and for ``subprocess.Popen``)
that record what they were handed. Mutants judged equivalent are listed, with the reason, at the end
of the file. CPU only (CUDA simulated by patching ``torch.cuda``), deterministic, no network, no
subprocess; files only under ``tmp_path``.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import torch

from diffusionformer.experiments.cli import main as cli_main
from diffusionformer.experiments.gpu import WORKER_ENV, run_workers
from diffusionformer.experiments.threads import WORKERS_ENV, ThreadPlan, plan_threads

TWO = """\
name = "two"
seeds = [3, 4]

[[tasks]]
name = "digits"
dataset = "digits"
model = "vit-digits"
[tasks.train]
max_steps = 2

[[tasks]]
name = "more"
dataset = "digits"
model = "vit-digits"

[[operators]]
name = "attention"

[[operators]]
name = "lap"
laplacian_heads = 1
"""


@pytest.fixture
def stubs(tmp_path, monkeypatch):
    """``main`` with training, the workers, the tables and the summary swapped for recorders (the list returned
    collects what they were handed); a plain shell's environment (no rank, no worker or thread variables), the
    working directory ``tmp_path`` with ``two.toml`` in it, torch's thread count restored afterwards."""
    from diffusionformer.experiments import gpu, publish, runner, tables

    log: list = []
    monkeypatch.setattr(runner, "run_experiment", lambda config, out, **kw: log.append(("run", config.name, out, kw)) or [])
    monkeypatch.setattr(gpu, "run_workers",
                        lambda argv, workers, log_dir, **kw: log.append(("workers", list(argv), workers, log_dir))
                        or [0] * workers)
    monkeypatch.setattr(tables, "aggregate", lambda rows: rows)
    monkeypatch.setattr(tables, "format_table", lambda table, config, *, compact=False: "TABLE")
    monkeypatch.setattr(publish, "summary_table",
                        lambda configs, out, *, selected=False: log.append(("summary", [c.name for c in configs]))
                        or "SUMMARY\n")
    for var in ("RANK", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS", WORKER_ENV, WORKERS_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "two.toml").write_text(TWO)
    threads = torch.get_num_threads()
    yield log
    torch.set_num_threads(threads)


def _exit_of(argv):
    with pytest.raises(SystemExit) as info:
        cli_main(argv)
    return info.value.code


# ---------------------------------------------------------------------------- experiments/cli.py: parsing
def test_usage_errors_name_the_program_and_exit_2(capsys):
    """kills: cli.py ``prog="diffusionformer"`` changed (the usage line and the error prefix name another program;
    the console script and the docs call it ``diffusionformer``)"""
    assert _exit_of(["run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: diffusionformer run [-h] [--set KEY=VALUE]")
    assert err.endswith("\ndiffusionformer run: error: the following arguments are required: config\n")


def test_no_command_is_a_usage_error(capsys):
    """kills: cli.py ``add_subparsers(dest="command", required=True)`` -> without ``required`` (no command reached
    ``args.config`` and died with an AttributeError traceback)"""
    assert _exit_of([]) == 2
    assert capsys.readouterr().err.endswith("diffusionformer: error: the following arguments are required: command\n")


@pytest.mark.parametrize("argv, message", [
    (["run", "two.toml", "--threads", "x"], "diffusionformer run: error: argument --threads: invalid int value: 'x'\n"),
    (["analyze", "two.toml", "--threads", "2.5"], "diffusionformer analyze: error: argument --threads: invalid int value: '2.5'\n"),
])
def test_counts_that_are_not_ints_are_usage_errors_before_anything_runs(stubs, capsys, argv, message):
    """kills: cli.py ``--threads`` ``type=int`` -> ``type=str`` (a count that is no int got past the parser: the config
    loaded and the thread plan's own error printed instead of the usage)"""
    assert _exit_of(argv) == 2
    assert capsys.readouterr().err.endswith(message)
    assert stubs == []


def test_summary_loads_every_config_it_is_given(stubs, capsys, tmp_path):
    """kills: cli.py ``summary`` loading only ``args.configs[0]`` (the other comparisons silently left out of the
    summary table)"""
    (tmp_path / "other.toml").write_text(TWO.replace('name = "two"', 'name = "other"'))
    assert cli_main(["summary", "two.toml", "other.toml"]) == 0
    assert stubs == [("summary", ["two", "other"])]
    assert capsys.readouterr().out == "SUMMARY\n"


def test_show_prints_every_task_and_every_setting(stubs, capsys):
    """kills: cli.py ``show`` printing no task lines (``for t in config.tasks[:0]``) and a task line without its
    ``train`` values (``--set tasks.NAME.train...`` overrides not shown)"""
    assert cli_main(["show", "two.toml", "--set", "tasks.more.train.lr=0.01"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "two: 2 tasks x 2 operator settings x 2 seeds = 8 runs",
        "  task digits: digits -> vit-digits, metric test_acc, train {max_steps = 2}",
        "  task more: digits -> vit-digits, metric test_acc, train {lr = 0.01}",
        "  operator attention: heads=None laplacian_heads=None",
        "  operator lap: heads=None laplacian_heads=1",
    ]



def test_list_prints_each_model_with_its_description(capsys):
    """kills: cli.py ``list`` printing the model names without their descriptions (``print(f"  {m}")``)"""
    from diffusionformer.models import get_preset, list_models

    assert cli_main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = list_models()
    assert lines[3:] == ["  " + m.ljust(20) + " " + get_preset(m).description for m in names]
    assert all(get_preset(m).description for m in names)



def test_tasks_needs_at_least_one_name(stubs, capsys):
    """kills: cli.py ``--tasks`` ``nargs="+"`` -> ``nargs="*"`` (a bare ``--tasks``, e.g. from an empty shell
    variable, ran with an empty task list instead of a usage error)"""
    assert _exit_of(["run", "two.toml", "--tasks"]) == 2
    assert capsys.readouterr().err.endswith("diffusionformer run: error: argument --tasks: expected at least one "
                                            "argument\n")
    assert stubs == []


def test_status_applies_every_override(stubs, monkeypatch, capsys):
    """kills: cli.py ``status`` ``--set`` ``action="append"`` -> ``"store"`` (only the last ``--set`` kept, as a bare
    string: the status of another comparison than the one ``run`` was given)"""
    from diffusionformer.experiments import results, tables

    seen = []
    monkeypatch.setattr(results, "run_status", lambda config, out: seen.append(
        (config.seeds, [t.name for t in config.tasks], [o.name for o in config.operators], out)) or [])
    monkeypatch.setattr(tables, "format_status", lambda rows: "")
    assert cli_main(["status", "two.toml", "--set", "seeds=[4]", "--set", "operators=lap", "--out", "o"]) == 0
    assert seen == [([4], ["digits", "more"], ["lap"], "o")]


# ---------------------------------------------------------------------------- experiments/cli.py: run
def test_run_passes_its_data_root_to_the_runner(stubs, tmp_path):
    """kills: cli.py ``run_experiment(..., data_root=args.data_root)`` -> ``data_root=None`` (``--data-root`` of
    ``run`` ignored: the benchmarks looked for under $DIFFUSIONFORMER_DATA)"""
    assert cli_main(["run", "two.toml", "--data-root", str(tmp_path / "data"), "--threads", "1"]) == 0
    (_, name, out, kwargs), = stubs
    assert (name, out, kwargs["data_root"], kwargs["device"]) == ("two", "results", str(tmp_path / "data"), None)


def test_run_prints_where_its_results_are_and_the_wall_time_of_this_run(stubs, capsys, monkeypatch):
    """kills: cli.py ``(wall time {time.perf_counter() - t0:.0f} s)`` -> ``time.perf_counter()`` (the clock's reading,
    not the seconds this run took)"""
    import itertools
    import time

    clock = itertools.count(1000.0, 12.4)  # every reading 12.4 s after the one before
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    (Path("res") / "two" / "plots").mkdir(parents=True)  # what the (stubbed) runner draws
    (Path("res") / "two" / "plots" / "digits_curves.png").write_bytes(b"")
    assert cli_main(["run", "two.toml", "--threads", "1", "--out", "res"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "", "TABLE", "results: res/two/results.md, res/two/results.json, plots in res/two/plots/ (wall time 12 s)"]

def test_workers_of_a_console_run_get_its_arguments_without_the_program(stubs, monkeypatch, tmp_path):
    """kills: cli.py ``raw = list(sys.argv[1:] if argv is None else argv)`` -> ``sys.argv`` (the program's own path
    handed to every worker as its command) or -> ``argv or []`` (the workers of the console script
    ``diffusionformer run ... --workers N`` given no command at all); ``run_workers(..., workers, ...)`` -> a fixed
    ``2`` (``--workers 3`` starting two workers)"""
    monkeypatch.setattr(sys, "argv", ["/usr/bin/diffusionformer", "run", "two.toml", "--workers", "3", "--threads", "1"])
    assert cli_main() == 0
    assert stubs[0] == ("workers", ["run", "two.toml", "--threads", "1", "--no-progress"], 3,
                        Path("results") / "two" / "workers")
    assert [c[0] for c in stubs] == ["workers", "run"]


def test_a_blank_worker_variable_is_no_worker(stubs, monkeypatch, capsys):
    """kills: cli.py ``os.environ.get(WORKER_ENV)`` -> ``... is not None`` (an exported but blank
    ``$DIFFUSIONFORMER_WORKER=`` read as "this is a worker": ``--workers 2`` refused; blank counts as unset, as for
    the thread variables)"""
    monkeypatch.setenv(WORKER_ENV, "")
    assert cli_main(["run", "two.toml", "--workers", "2", "--threads", "1"]) == 0
    assert [c[0] for c in stubs] == ["workers", "run"] and stubs[0][2] == 2
    monkeypatch.setenv(WORKER_ENV, "0/2")
    assert cli_main(["run", "two.toml", "--workers", "2", "--threads", "1"]) == 2
    assert "a worker does not start workers of its own" in capsys.readouterr().err


# ---------------------------------------------------------------------------- experiments/__main__.py
def test_python_m_exits_with_the_commands_code(stubs, monkeypatch, capsys):
    """kills: __main__.py ``sys.exit(main())`` -> ``main()`` (``python -m diffusionformer.experiments`` exiting 0
    after an error or a failed run, so that a script or CI step goes on)"""
    monkeypatch.setattr(sys, "argv", ["diffusionformer", "show", "missing.toml"])
    monkeypatch.delitem(sys.modules, "diffusionformer.experiments.__main__", raising=False)
    with pytest.raises(SystemExit) as info:
        runpy.run_module("diffusionformer.experiments", run_name="__main__")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "missing.toml" in err and err.count("\n") == 1
    monkeypatch.setattr(sys, "argv", ["diffusionformer", "show", "two.toml"])
    with pytest.raises(SystemExit) as info:
        runpy.run_module("diffusionformer.experiments", run_name="__main__")
    assert info.value.code == 0


# ---------------------------------------------------------------------------- experiments/gpu.py
def test_workers_inherit_the_parents_environment(tmp_path, procs, monkeypatch):
    """kills: gpu.py ``env = {**os.environ, ...}`` -> only the two worker variables (the workers lose PATH,
    $DIFFUSIONFORMER_DATA, CUDA_VISIBLE_DEVICES, ...: each would look for its data and GPU elsewhere)"""
    monkeypatch.setenv("DIFFUSIONFORMER_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    run_workers(["run", "c.toml"], 2, tmp_path / "w", stagger=0, log=lambda _: None)
    assert [(p.env["DIFFUSIONFORMER_DATA"], p.env["CUDA_VISIBLE_DEVICES"]) for p in procs.started] == [
        (str(tmp_path / "data"), "1")] * 2
    assert [{k: p.env[k] for k in (WORKERS_ENV, WORKER_ENV)} for p in procs.started] == [
        {WORKERS_ENV: "2", WORKER_ENV: "0/2"}, {WORKERS_ENV: "2", WORKER_ENV: "1/2"}]



def test_run_workers_defaults_stagger_one_second_and_print_each_start(tmp_path, procs, monkeypatch, capsys):
    """kills: gpu.py ``run_workers`` default ``stagger=1.0`` -> ``0.0`` (the CLI's workers all started at once,
    racing for the first runs) and default ``log=print`` -> a silent log (the CLI printing no pid or log path of
    its workers)"""
    import time

    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    assert run_workers(["run", "c.toml"], 3, tmp_path / "w") == [0, 0, 0]
    assert slept == [1.0, 1.0]
    assert capsys.readouterr().out == "".join(f"worker {k}: pid {4000 + k}, log {tmp_path / 'w' / f'worker{k}.log'}\n"
                                              for k in range(3))

# ---------------------------------------------------------------------------- experiments/threads.py
def test_describe_of_the_split_says_how_to_change_it_word_for_word():
    """kills: threads.py ``describe`` of ``cores // workers`` without ``--workers N or $DIFFUSIONFORMER_WORKERS sets
    the workers`` (the console line no longer says how to change the worker count it divides by)"""
    assert plan_threads(cores=8, workers=3, environ={}).describe() == (
        "torch threads: 2 per worker (8 cores // 3 workers; --threads N overrides, --workers N or "
        "$DIFFUSIONFORMER_WORKERS sets the workers)")
    assert plan_threads(cores=4, environ={}).describe() == (
        "torch threads: 4 per worker (4 cores // 1 worker; --threads N overrides, --workers N or "
        "$DIFFUSIONFORMER_WORKERS sets the workers)")
    assert plan_threads(cores=4, environ={"OMP_NUM_THREADS": "3", "LOCAL_WORLD_SIZE": "2"}).describe() == (
        "torch threads: 3 per worker (from OMP_NUM_THREADS; 4 cores, 2 workers)")


def test_a_thread_plan_cannot_be_changed_after_it_is_made():
    """kills: threads.py ``@dataclass(frozen=True)`` -> ``@dataclass`` (a plan edited after ``describe`` printed it,
    and plans no longer usable as dict keys)"""
    import dataclasses

    plan = ThreadPlan(2, 4, 2, "cores // workers")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.threads = 3
    assert {plan: "x"}[ThreadPlan(2, 4, 2, "cores // workers")] == "x"


# ---------------------------------------------------------------------------- mutants judged equivalent
# 90 mutants were applied (cli.py 44, __main__.py 1, gpu.py 25, threads.py 20); all but these two are killed by the
# suite with this file:
# - cli.py ``if args.precision is not None:`` -> ``if args.precision:``: argparse only lets ``--precision`` be one of
#   the non-empty strings "bf16", "fp32", "auto" (``choices``) or leave it None, so the two tests agree.
# - gpu.py ``if available and device.type == "cuda":`` -> ``device.type != "cpu"``: the line before refuses every
#   device type but "cpu" and "cuda" (``_DEVICE_TYPES``), so "not cpu" is "cuda".
