"""Tests written in a mutation-testing audit of the command line (``experiments/cli.py``: every command's
flags, defaults and exit codes, the worker and rank rules of ``run``), the GPU helpers
(``experiments/gpu.py``: device and precision checks, the workers' command line and processes) and the
comparisons of a results page (``experiments/compare.py``: the contrasts, their Holm families, the p,
interval and legend texts).

Each test kills a mutant of the library code that the rest of the suite let through (its docstring
names it: file, line and mutation) and checks the code against an independent reference: p values and
intervals from scipy, Holm's adjustment and the Nadeau-Bengio variance written out, legends and command
lines written out by hand, and stand-ins for the functions the command line dispatches to (and for
``subprocess.Popen`` and ``time.sleep``) that record what they were handed. Mutants judged equivalent are
listed, with the reason, at the end of the file. CPU only (CUDA simulated by patching ``torch.cuda``),
deterministic, no network; files only under ``tmp_path``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats as sps

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.cli import main as cli_main
from diffusionformer.experiments.compare import _reach_by_seed, contrasts, format_ci, format_p, table_legend
from diffusionformer.experiments.gpu import WORKER_ENV, check_device, precision_amp, run_workers, worker_argv
from diffusionformer.experiments.results import RunResult
from diffusionformer.experiments.stats import Difference
from diffusionformer.experiments.threads import WORKERS_ENV
from diffusionformer.train import CheckpointError

from tests.experiments.test_experiments_gpu import TINY
from experiments_references import holm_reference  # noqa: E402


# ---------------------------------------------------------------------------- experiments/cli.py
class _Calls:
    """What the command line handed to the functions it dispatches to (all stand-ins: nothing trains)."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.log: list = []
        self.results: list = []
        self.codes: list = [0, 0]
        self.raise_in_run: BaseException | None = None

    def toml(self, top="", train=""):
        path = self.tmp_path / "tiny.toml"
        path.write_text(TINY.format(top=top, train=train))
        return str(path)

    def named(self, name):
        return [c for c in self.log if c[0] == name]


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """``main`` with every dispatched function swapped for a recorder; the environment of a plain shell
    (no rank, no worker variables), the working directory ``tmp_path``, torch's thread count restored."""
    from diffusionformer.experiments import analyze, gpu, publish, results, runner, tables, validate

    calls = _Calls(tmp_path)

    def run_experiment(config, out_root, **kwargs):
        calls.log.append(("run", config, out_root, kwargs))
        if calls.raise_in_run is not None:
            raise calls.raise_in_run
        return list(calls.results)

    def run_workers(argv, workers, log_dir, **kwargs):
        calls.log.append(("workers", list(argv), workers, log_dir))
        return list(calls.codes)

    monkeypatch.setattr(runner, "run_experiment", run_experiment)
    monkeypatch.setattr(gpu, "run_workers", run_workers)
    monkeypatch.setattr(tables, "aggregate", lambda rows: ["aggregated", *rows])
    monkeypatch.setattr(tables, "format_table", lambda table, config, *, compact=False: f"TABLE {config.name} compact={compact}")
    monkeypatch.setattr(tables, "format_status", lambda rows: f"STATUS {rows}\n")
    monkeypatch.setattr(results, "run_status", lambda config, out: calls.log.append(("status", config, out)) or ["s"])
    monkeypatch.setattr(validate, "check_experiment", lambda config, **kw: calls.log.append(("check", config, kw)))
    monkeypatch.setattr(publish, "publish_experiment",
                        lambda config, out, to, *, config_path=None, overrides=None, imports=None:
                        calls.log.append(("publish", out, to, config_path))
                        or Path(to) / "tiny.md")
    monkeypatch.setattr(publish, "summary_table",
                        lambda configs, out, *, selected=False: calls.log.append(("summary", out, selected)) or "SUMMARY\n")
    monkeypatch.setattr(analyze, "analyze_experiment", lambda config, out, **kw: calls.log.append(("analyze", out, kw)))
    for var in ("RANK", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS", WORKER_ENV, WORKERS_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    yield calls
    torch.set_num_threads(threads)


def test_every_command_defaults_to_the_results_folder_and_the_documented_paths(cli):
    """kills: cli.py:50, :64, :69, :74, :79 the ``--out`` default ``"results"`` changed (run, status, summary,
    publish, analyze); :75 the ``--to`` default ``"docs/results"``; :81 the ``--max-examples`` default 512"""
    toml = cli.toml()
    for command in (["run", toml], ["status", toml], ["summary", toml], ["publish", toml], ["analyze", toml]):
        assert cli_main(command) == 0
    (run,), (status,), (summary,), (pub,), (ana,) = (cli.named(n) for n in ("run", "status", "summary", "publish", "analyze"))
    assert (run[2], status[2], summary[1], pub[1], ana[1]) == ("results",) * 5
    assert pub[2] == "docs/results" and ana[2]["max_examples"] == 512


def test_run_passes_its_flags_through(cli, capsys):
    """kills: cli.py:53 ``"auto"`` dropped from the precisions; :56 ``--tasks`` ``action="extend"`` -> ``"append"``
    (a list of lists); :197 ``tasks=args.tasks`` -> ``None`` and ``progress=not args.no_progress`` -> ``True``;
    :185 the task's other train keys dropped by ``--precision``; :200 ``compact=True`` -> ``False``"""
    toml = cli.toml(train='amp = "off"')
    assert cli_main(["run", toml, "--precision", "auto", "--tasks", "digits", "other", "--tasks", "third",
                     "--no-progress"]) == 0
    (_, config, out, kwargs), = cli.named("run")
    table = capsys.readouterr().out
    kwargs.pop("log")("a run's note")  # the runs' messages go to stderr (test_edge_probes_cli_power_user_56)
    assert capsys.readouterr().err == "a run's note\n"
    assert kwargs == {"data_root": None, "resume": True, "progress": False, "device": None,
                      "tasks": ["digits", "other", "third"]}
    assert config.tasks[0].train == {"max_steps": 6, "batch_size": 16, "lr": 1e-3, "eval_interval": 3, "log_interval": 2,
                                     "checkpoint_interval": 3, "amp": "auto"}
    assert table.splitlines()[:2] == ["", "TABLE tiny compact=True"]
    assert cli_main(["run", toml]) == 0
    assert cli.named("run")[1][3]["progress"] is True and cli.named("run")[1][3]["tasks"] is None


def test_run_takes_the_configs_device_and_checks_it_before_running(cli, capsys):
    """kills: cli.py:179 ``device = args.device`` only (a config's ``device`` ignored); :181 ``check_device``
    dropped (an unknown device reaches the runner instead of exit 2 before any data is loaded); :197
    ``device=device`` -> ``device=args.device``"""
    assert cli_main(["run", cli.toml(top='device = "cpu"')]) == 0
    assert cli.named("run")[0][3]["device"] == "cpu"
    capsys.readouterr()
    assert cli_main(["run", cli.toml(top='device = "cpu"'), "--device", "tpu"]) == 2
    assert capsys.readouterr().err.endswith("\nerror: device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got 'tpu'\n")
    assert len(cli.named("run")) == 1


def test_run_tells_how_to_follow_it_with_the_same_overrides_and_out(cli, capsys, tmp_path):
    """kills: cli.py:175 the ``--set`` values not shell-quoted (the printed command splits ``seeds=[0, 1]``) and
    :176 ``--out`` left out of the printed status command"""
    toml = cli.toml()
    out = tmp_path / "my results"
    assert cli_main(["run", toml, "--set", "seeds=[0, 1]", "--out", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert (f"every run's step and time left, from another shell: python -m diffusionformer.experiments status {toml} "
            f"--set 'seeds=[0, 1]' --out '{out}'") in err
    assert cli_main(["run", toml]) == 0
    assert (f"every run's step and time left, from another shell: python -m diffusionformer.experiments status "
            f"{toml}") in capsys.readouterr().err.splitlines()


def test_only_rank_zero_prints_the_threads_the_status_hint_and_the_table(cli, capsys, monkeypatch):
    """kills: cli.py:106 ``RANK == 0`` -> ``!= 0`` (the thread plan printed by every torchrun process but the first)
    and cli.py:198 the same for the results table"""
    toml = cli.toml()
    assert cli_main(["run", toml, "--threads", "1"]) == 0
    got = capsys.readouterr()
    assert "torch threads: 1 per worker (from --threads" in got.err and "status " in got.err
    assert "TABLE tiny compact=True" in got.out and "results: results/tiny/results.md" in got.out
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")  # (a RANK without WORLD_SIZE is one process: rank 0)
    assert cli_main(["run", toml, "--threads", "1"]) == 0
    got = capsys.readouterr()
    assert (got.out, got.err) == ("", "")


@pytest.mark.parametrize(("rank", "prints"), [("", True), (" 0 ", True), ("x", True), ("2", False)])
def test_bug_a_blank_or_malformed_rank_does_not_stop_the_run(cli, capsys, monkeypatch, rank, prints):
    """Bug: an exported but blank ``RANK`` (``RANK= diffusionformer run ...``) stopped every command with
    ``ValueError: invalid literal for int() with base 10: ''`` before anything ran. Blank means rank 0,
    as an unset ``RANK`` does; a malformed one prints too (the process group names it when it reads it);
    only another rank is silent."""
    monkeypatch.setenv("RANK", rank)
    if not prints:  # another rank of a torchrun job (a RANK without WORLD_SIZE is one process: rank 0)
        monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli_main(["run", cli.toml(), "--threads", "1"]) == 0
    got = capsys.readouterr()
    assert ("torch threads: 1 per worker (from --threads" in got.err) is prints
    assert ("TABLE tiny compact=True" in got.out) is prints


def test_a_failed_or_non_finite_run_is_exit_1(cli, capsys):
    """kills: cli.py:204 ``r.status != "completed"`` -> ``r.status.startswith("failed")`` (a run stopped by a
    non-finite loss counted as a success) and :207 ``return 1`` -> ``return 0``"""
    toml = cli.toml()
    for status in ("non_finite", "failed: CUDA out of memory"):
        cli.results = [RunResult("digits", "attention", 0, "completed", "test_acc", 0.5, {}),
                       RunResult("digits", "lap", 0, status, "test_acc", None, {})]
        assert cli_main(["run", toml]) == 1
        assert capsys.readouterr().err.endswith("1 run(s) failed; see the messages above\n")
    cli.results = [RunResult("digits", "attention", 0, "completed", "test_acc", 0.5, {})]
    assert cli_main(["run", toml]) == 0


@pytest.mark.parametrize("exc", [ModuleNotFoundError("No module named 'torch_geometric'"),
                                 PermissionError("[Errno 13] Permission denied: 'results'"),
                                 NotADirectoryError("[Errno 20] Not a directory: 'results/tiny'"),
                                 FileExistsError("[Errno 17] File exists: 'results'"),
                                 FileNotFoundError("[Errno 2] No such file or directory: 'data'"),
                                 TypeError("seeds: expected a list")])
def test_an_expected_error_in_a_run_is_one_line_and_exit_2(cli, capsys, exc):
    """kills: cli.py:209 dropping ``ModuleNotFoundError``, ``PermissionError``, ``NotADirectoryError``,
    ``FileNotFoundError`` or ``TypeError`` from the caught errors (a traceback instead of ``error: ...``)"""
    cli.raise_in_run = exc
    assert cli_main(["run", cli.toml()]) == 2
    assert capsys.readouterr().err.endswith(f"error: {exc}\n")


def test_a_corrupt_checkpoint_is_exit_2_with_what_to_delete(cli, capsys):
    """kills: cli.py:216 the ``CheckpointError`` handler's ``return 2`` -> ``return 1`` (a run that cannot resume
    reads as a failed run, not as a usage error the user must act on)"""
    cli.raise_in_run = CheckpointError("results/tiny/runs/digits/attention/seed0/checkpoint.pt is not a checkpoint")
    assert cli_main(["run", cli.toml()]) == 2
    assert capsys.readouterr().err.endswith(
        "error: results/tiny/runs/digits/attention/seed0/checkpoint.pt is not a checkpoint\nDelete that checkpoint.pt "
        "to train its run again from step 0 (--restart would discard every run of the comparison).\n")


def test_bug_an_unreadable_checkpoint_is_not_advised_away(cli, capsys):
    """Bug: a checkpoint this user may not read (``CheckpointError`` caused by a ``PermissionError``: the file may
    be intact) got the advice for a damaged one, "Delete that checkpoint.pt to train its run again", which loses a
    good file. The CLI and the runner's log now ask for read access instead."""
    err = CheckpointError("checkpoint results/x/checkpoint.pt cannot be read by this process")
    err.__cause__ = PermissionError(13, "Permission denied")
    cli.raise_in_run = err
    assert cli_main(["run", cli.toml()]) == 2
    text = capsys.readouterr().err
    assert text.endswith("\nGive this user read access to that checkpoint.pt and run again to resume its run.\n")
    assert "Delete" not in text
    from diffusionformer.experiments.runner import _not_resumed_advice

    assert _not_resumed_advice(err, "runs/a/checkpoint.pt", "this") == (
        "Give this user read access to runs/a/checkpoint.pt and run again to resume this run.")
    assert _not_resumed_advice(CheckpointError("truncated"), "runs/a/checkpoint.pt", "this") == (
        "Delete runs/a/checkpoint.pt to train this run again from step 0 (--restart would discard every run of the "
        "comparison).")


def test_workers_refused_below_one_in_a_worker_and_with_restart(cli, capsys, monkeypatch):
    """kills: cli.py:168 ``workers < 1`` -> ``< 0``; :170 ``workers > 1`` -> ``> 2`` or the check dropped, or
    ``$DIFFUSIONFORMER_WORKER`` -> ``$RANK`` (a worker starting workers, a torchrun process refused); :188
    the ``--restart`` check dropped (every worker discarding the others' runs)"""
    toml = cli.toml()
    assert cli_main(["run", toml, "--workers", "0"]) == 2
    assert capsys.readouterr().err == "error: --workers: expected an int >= 1, got 0\n"
    assert cli_main(["run", toml, "--workers", "2", "--restart"]) == 2
    assert "\nerror: --restart with --workers: every worker would discard" in capsys.readouterr().err
    monkeypatch.setenv(WORKER_ENV, "1/2")
    assert cli_main(["run", toml, "--workers", "2"]) == 2
    assert capsys.readouterr().err == (f"error: --workers 2 in a worker process (${WORKER_ENV}=1/2): a worker does not "
                                       "start workers of its own\n")
    assert cli.log == []
    monkeypatch.delenv(WORKER_ENV)
    monkeypatch.setenv("RANK", "0")
    assert cli_main(["run", toml, "--workers", "2"]) == 0
    assert [c[0] for c in cli.log] == ["workers", "run"]


def test_workers_get_the_command_line_without_workers_and_their_failures_are_named(cli, capsys, tmp_path):
    """kills: cli.py:191 ``argv`` of ``main`` ignored for ``sys.argv``; :192 ``worker_argv`` not applied (every
    worker would start workers); :193 ``any(codes)`` -> ``all(codes)`` (one failed worker not reported)"""
    toml = cli.toml()
    out = str(tmp_path / "r")
    cli.codes = [0, 3]
    assert cli_main(["run", toml, "--workers", "2", "--out", out, "--device", "cpu"]) == 0
    (_, argv, workers, log_dir), = cli.named("workers")
    assert (argv, workers, log_dir) == (["run", toml, "--out", out, "--device", "cpu", "--no-progress"], 2,
                                        Path(out) / "tiny" / "workers")
    assert f"worker exit codes [0, 3]; see {Path(out) / 'tiny' / 'workers'}\n" in capsys.readouterr().err
    cli.codes = [0, 0]
    assert cli_main(["run", toml, "--workers", "2", "--out", out]) == 0
    assert "worker exit codes" not in capsys.readouterr().err


def test_workers_size_the_threads_of_analyze(cli, capsys, monkeypatch):
    """kills: cli.py:104 ``workers=args.workers`` -> ``None`` (``--workers N`` not counted in the thread plan) and
    cli.py:157 ``_size_threads`` dropped from ``analyze`` (its threads neither set nor printed)"""
    before = torch.get_num_threads()
    want = 2 if before == 1 else 1
    from diffusionformer.experiments import analyze

    seen = []
    monkeypatch.setattr(analyze, "analyze_experiment", lambda config, out, **kw: seen.append(torch.get_num_threads()))
    assert cli_main(["analyze", cli.toml(), "--workers", "3", "--threads", str(want)]) == 0
    assert seen == [want] and torch.get_num_threads() == before  # sized for analyze; the caller's count back after
    assert f"torch threads: {want} per worker (from --threads; " in capsys.readouterr().err
    assert cli_main(["analyze", cli.toml(), "--workers", "3", "--threads", "1"]) == 0
    assert capsys.readouterr().err.rstrip().endswith(", 3 workers)")


def test_analyze_passes_its_flags_through(cli, tmp_path):
    """kills: cli.py:160-161 ``data_root``, ``device``, ``progress`` or ``partial`` not passed on"""
    assert cli_main(["analyze", cli.toml(), "--data-root", str(tmp_path / "data"), "--device", "cpu", "--no-progress",
                     "--partial", "--max-examples", "7", "--out", "o"]) == 0
    assert cli.named("analyze") == [("analyze", "o", {"data_root": str(tmp_path / "data"), "max_examples": 7,
                                                      "device": "cpu", "progress": False, "partial": True})]
    assert cli_main(["analyze", cli.toml()]) == 0
    assert cli.named("analyze")[1][2] == {"data_root": None, "max_examples": 512, "device": None, "progress": True,
                                          "partial": False}


def test_show_status_publish_and_summary_pass_their_flags_and_exit_0(cli, capsys, tmp_path):
    """kills: cli.py:136 ``missing_data_ok=True`` -> ``False`` and ``data_root`` not passed; :138 the run count
    without the seeds; :143 ``show`` exit 1; :129 ``summary`` ignoring ``--out``; :148 ``status`` ignoring
    ``--out``; :153 ``publish`` without ``config_path`` (the page's command line) and :154 no ``wrote`` line"""
    toml = cli.toml()
    assert cli_main(["show", toml, "--data-root", "d"]) == 0
    (_, config, kwargs), = cli.named("check")
    assert kwargs == {"data_root": "d", "missing_data_ok": False}  # a given --data-root is checked
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "tiny: 1 tasks x 3 operator settings x 2 seeds = 6 runs"
    assert out[-1] == "  operator heat: heads='attention:1,heat(t=0.5, learnable=True, steps=2):1' laplacian_heads=None"
    assert cli_main(["status", toml, "--out", "o1"]) == 0 and cli.named("status")[0][2] == "o1"
    assert capsys.readouterr().out == "STATUS ['s']\n"
    assert cli_main(["summary", toml, toml, "--out", "o2"]) == 0 and cli.named("summary") == [("summary", "o2", False)]
    assert capsys.readouterr().out == "SUMMARY\n"
    assert cli_main(["publish", toml, "--out", "o3", "--to", "pages"]) == 0
    assert cli.named("publish") == [("publish", "o3", "pages", toml)]
    assert capsys.readouterr().out == f"wrote {Path('pages') / 'tiny.md'}\n"


def test_list_prints_datasets_operators_and_models_and_exits_0(capsys):
    """kills: cli.py:121 the ``operators:`` line dropped and :125 ``list`` exit 1"""
    from diffusionformer.data import list_datasets
    from diffusionformer.models import list_models
    from diffusionformer.operators import list_operators

    assert cli_main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == ["datasets:  " + ", ".join(list_datasets()), "operators: " + ", ".join(list_operators()), "models:"]
    assert len(lines) == 3 + len(list_models()) and "laplacian" in lines[1]


@pytest.mark.parametrize("argv", [["--he"], ["status", "c.toml", "--ou", "x"], ["publish", "c.toml", "--t", "x"],
                                  ["summary", "c.toml", "--sel"], ["analyze", "c.toml", "--part"],
                                  ["run", "c.toml", "--thr", "2"]])
def test_no_command_accepts_an_abbreviated_flag(argv, capsys):
    """kills: cli.py:36-37 ``allow_abbrev=False`` dropped from the main parser and :60 from ``status`` (the
    comment at :34: an abbreviation left in a worker's command line would start workers of workers)"""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err
# ---------------------------------------------------------------------------- experiments/gpu.py
def test_precision_amp_refuses_a_non_string_with_the_named_error():
    """kills: gpu.py:52 dropping ``not isinstance(precision, str) or`` (a list, e.g. a TOML array, is unhashable:
    a bare ``TypeError: unhashable type`` instead of the list of precisions)"""
    with pytest.raises(ValueError, match=r"^precision: expected one of \['auto', 'bf16', 'fp32'\], got \['bf16'\]$"):
        precision_amp(["bf16"])
    assert [precision_amp(p) for p in ("bf16", "fp32", "auto")] == ["bf16", "off", "auto"]


@pytest.fixture
def two_gpus(monkeypatch):
    """torch sees two CUDA devices (``cuda:0``, ``cuda:1``)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_cuda_index_equal_to_the_device_count_is_refused(two_gpus):
    """kills: gpu.py:99 ``device.index >= count`` -> ``>`` (``cuda:2`` on a two-GPU machine accepted) and dropping
    ``device.index is not None and`` (plain ``cuda`` crashing on ``None >= 2``)"""
    assert check_device("cuda:1") == torch.device("cuda", 1)
    assert check_device("cuda") == torch.device("cuda")
    with pytest.raises(ValueError, match=r"^device 'cuda:2' asked for, but this machine has 2 CUDA device\(s\) "
                                         r"\(cuda:0 \.\. cuda:1\)$"):
        check_device("cuda:2")


@pytest.mark.parametrize("argv", [["run", "c.toml", "--work", "2"], ["run", "c.toml", "--worke", "2"],
                                  ["run", "c.toml", "--work=2"]])
def test_worker_argv_refuses_every_abbreviation_of_workers(argv):
    """kills: gpu.py:125 ``arg.startswith("--work")`` -> ``"--worke"`` and ``arg.split("=")[0]`` -> ``arg`` (an
    abbreviation left in each worker's command line makes every worker start workers of its own)"""
    with pytest.raises(ValueError, match=r"abbreviates --workers; spell it out"):
        worker_argv(argv)


def test_worker_argv_keeps_other_flags_that_start_like_workers():
    """the abbreviation check must not catch a different flag: ``--work-dir`` is not a prefix of ``--workers``"""
    assert worker_argv(["run", "c.toml", "--workers", "2", "--work-dir", "x"]) == ["run", "c.toml", "--work-dir", "x",
                                                                                    "--no-progress"]


def test_run_workers_logs_to_a_new_nested_folder_truncates_old_logs_and_closes_them(tmp_path, procs):
    """kills: gpu.py:153 ``mkdir(parents=True)`` dropped (``--out`` of a fresh results tree); :158 log opened
    with ``"a"`` (a worker's log of an earlier launch kept above the new one); :162 ``stderr=STDOUT`` dropped
    (tracebacks not in the log); :163 the start message dropped; :179 a log file left open"""
    log_dir = tmp_path / "results" / "cmp" / "workers"
    messages = []
    procs.code_of = staticmethod(lambda k: 0)
    log_dir.mkdir(parents=True)
    (log_dir / "worker0.log").write_text("an earlier launch\n")
    assert run_workers(["run", "c.toml"], 2, log_dir, stagger=0, log=messages.append) == [0, 0]
    assert (log_dir / "worker0.log").read_text() == ""
    assert all(p.stderr == subprocess.STDOUT and p.stdout.closed for p in procs.started)
    assert [p.stdout.name for p in procs.started] == [str(log_dir / "worker0.log"), str(log_dir / "worker1.log")]
    assert messages == [f"worker 0: pid 4000, log {log_dir / 'worker0.log'}", f"worker 1: pid 4001, log {log_dir / 'worker1.log'}"]
    deeper = tmp_path / "fresh" / "cmp" / "workers"
    assert run_workers(["run", "c.toml"], 1, deeper, stagger=0, log=lambda _: None) == [0]
    assert (deeper / "worker0.log").is_file()


def test_run_workers_returns_each_workers_code_in_start_order(tmp_path, procs):
    """kills: gpu.py:166 ``codes = [p.wait() for p in procs]`` -> in reverse (the message names the wrong worker)"""
    procs.code_of = staticmethod(lambda k: [0, 3, 7][k])
    assert run_workers(["run", "c.toml"], 3, tmp_path / "w", stagger=0, log=lambda _: None) == [0, 3, 7]


@pytest.mark.parametrize("workers, stagger, sleeps", [(3, 0.25, [0.25, 0.25]), (1, 0.25, []), (3, 0.0, [])])
def test_run_workers_sleeps_between_starts_only(tmp_path, procs, monkeypatch, workers, stagger, sleeps):
    """kills: gpu.py:164 ``k + 1 < workers and`` dropped (a pointless wait after the last start), ``stagger > 0``
    -> ``>= 0`` (``sleep(0)`` calls for ``stagger=0``) and :165 ``sleep(stagger)`` -> a fixed second"""
    import time

    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    run_workers(["run", "c.toml"], workers, tmp_path / "w", stagger=stagger, log=lambda _: None)
    assert slept == sleeps


def test_an_interrupt_stops_only_the_live_workers_and_kills_one_that_ignores_it(tmp_path, procs, monkeypatch):
    """kills: gpu.py:169 ``p.poll() is None`` -> ``is not None`` (the live workers left running, the finished one
    signalled); :173 ``wait(timeout=30)`` -> no timeout (the parent hangs on a worker that ignores SIGTERM);
    :175 ``p.kill()`` dropped"""
    def wait(self, timeout=None):
        self.wait_timeouts.append(timeout)
        if timeout is None:
            raise KeyboardInterrupt  # Ctrl-C while the parent waits for worker 0
        if self.k == 1:
            raise subprocess.TimeoutExpired("python", timeout)  # worker 1 ignores SIGTERM
        return -15

    monkeypatch.setattr(procs, "wait", wait)
    monkeypatch.setattr(procs, "poll", lambda self: 0 if self.k == 2 else None)  # worker 2 has already finished
    with pytest.raises(KeyboardInterrupt):
        run_workers(["run", "c.toml"], 3, tmp_path / "w", stagger=0, log=lambda _: None)
    assert [(p.terminated, p.killed) for p in procs.started] == [(True, False), (True, True), (False, False)]
    assert [p.wait_timeouts for p in procs.started] == [[None, 30], [30], [30]]
    assert all(p.stdout.closed for p in procs.started)
# ---------------------------------------------------------------------------- experiments/compare.py
SEEDS = (0, 1, 2, 3)


def _cmp_config(**extra):
    """Two tasks (``a``: select_by and reach; ``b``: 2-fold cross-validation and reach), three settings,
    four seeds; ``a:lap`` is the one primary contrast."""
    raw = {"name": "cmp", "seeds": list(SEEDS),
           "tasks": [{"name": "a", "dataset": "digits", "model": "vit-digits", "select_by": "val_acc",
                      "reach": {"val_acc": 0.9}},
                     {"name": "b", "dataset": "digits", "model": "vit-digits", "folds": 2, "reach": {"val_acc": 0.5}}],
           "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1},
                         {"name": "half", "laplacian_heads": "half"}],
           "primary": ["a:lap"]}
    raw.update(extra)
    return load_experiment_config(raw)


#: value per seed, written out by hand: (task, setting) -> final, selected, steps to the threshold
CMP_VALUES = {
    ("a", "attention"): ([0.70, 0.72, 0.69, 0.71], [0.71, 0.73, 0.70, 0.72], [40, 50, 45, 60]),
    ("a", "lap"): ([0.74, 0.73, 0.72, 0.76], [0.75, 0.73, 0.74, 0.76], [30, 45, 40, 50]),
    ("a", "half"): ([0.69, 0.73, 0.70, 0.70], [0.70, 0.72, 0.73, 0.71], [50, 55, 40, 70]),
    ("b", "attention"): ([0.60, 0.62, 0.61, 0.65], [0.61, 0.62, 0.63, 0.64], [20, 25, 30, 20]),
    ("b", "lap"): ([0.66, 0.63, 0.64, 0.70], [0.66, 0.64, 0.66, 0.69], [15, 20, 30, 10]),
    ("b", "half"): ([0.61, 0.60, 0.63, 0.64], [0.60, 0.63, 0.64, 0.66], [25, 20, 35, 30]),
}


def _cmp_rows(values=CMP_VALUES):
    """``aggregate``-style rows of :data:`CMP_VALUES` (only the keys ``contrasts`` reads)."""
    return [{"task": t, "operator": o, "by_seed": dict(zip(SEEDS, f)), "selected_by_seed": dict(zip(SEEDS, s)),
             "reach_by_seed": dict(zip(SEEDS, r))} for (t, o), (f, s, r) in values.items()]


def _ref_diff(a, b, level=0.95, folds=None):
    """(mean, low, high, p) of the paired difference a - b, from numpy and scipy: the paired t test, or the
    Nadeau-Bengio corrected one (variance (1/n + 1/(K-1)) s²) for K folds."""
    d = np.asarray(a, float) - np.asarray(b, float)
    n = len(d)
    if folds is None:
        p = sps.ttest_rel(a, b).pvalue
        se = d.std(ddof=1) / np.sqrt(n)
    else:
        se = d.std(ddof=1) * np.sqrt(1 / n + 1 / (folds - 1))
        p = 2 * sps.t.sf(abs(d.mean() / se), n - 1)
    half = sps.t.ppf(0.5 + level / 2, n - 1) * se
    return d.mean(), d.mean() - half, d.mean() + half, p


def _close(diff, ref):
    mean, low, high, p = ref
    assert diff.mean == pytest.approx(mean, abs=1e-12) and diff.p == pytest.approx(p, rel=1e-9)
    assert diff.low == pytest.approx(low, abs=1e-12) and diff.high == pytest.approx(high, abs=1e-12)


def test_contrasts_of_a_page_match_scipy_and_holm_written_out():
    """kills: compare.py:66 baseline ``operators[0]`` -> ``operators[-1]``; :73 ``(["selected"] if task.select_by
    ...)`` -> always; :75 ``operators[1:]`` -> every setting (the baseline against itself); :80 reach ``a, b``
    swapped (the sign of the step difference); :83 ``task.folds is not None`` -> ``is None`` and :84 the
    Nadeau-Bengio test for k-fold steps -> the plain paired t; :87 ``minimize = True`` -> ``task.minimize`` (fewer
    steps is better, whatever the metric); :92 ``compare_rows(row, base)`` -> ``(base, row)``, ``folds`` dropped,
    ``values`` -> always the final metric; :95 ``primary`` -> ``False``; :97-102 the Holm families: every
    contrast in one family, the primary ones left out, the primary family dropped or taken over the kind"""
    cfg = _cmp_config()
    out = contrasts(_cmp_rows(), cfg)
    assert [(c.task, c.kind, c.setting, c.baseline) for c in out] == [
        ("a", "final", "lap", "attention"), ("a", "final", "half", "attention"),
        ("a", "selected", "lap", "attention"), ("a", "selected", "half", "attention"),
        ("a", "reach", "lap", "attention"), ("a", "reach", "half", "attention"),
        ("b", "final", "lap", "attention"), ("b", "final", "half", "attention"),
        ("b", "reach", "lap", "attention"), ("b", "reach", "half", "attention")]
    column = {"final": 0, "selected": 1, "reach": 2}
    refs = {}
    for c in out:
        folds = 2 if c.task == "b" else None
        a, b = CMP_VALUES[(c.task, c.setting)][column[c.kind]], CMP_VALUES[(c.task, "attention")][column[c.kind]]
        refs[(c.task, c.kind, c.setting)] = _ref_diff(a, b, folds=folds)
        _close(c.diff, refs[(c.task, c.kind, c.setting)])
        assert c.diff.method == ("Nadeau-Bengio" if folds else "paired t")
        assert c.minimize is (c.kind == "reach")
        assert c.primary is (c.task == "a" and c.setting == "lap") and c.role == ("primary" if c.primary else "exploratory")
    for kind in ("final", "selected", "reach"):
        family = [c for c in out if c.kind == kind]
        adjusted = holm_reference([refs[(c.task, kind, c.setting)][3] for c in family])
        for c, p in zip(family, adjusted):
            # the primary contrast is alone in its confirmatory family: its own p, unadjusted
            expected = refs[(c.task, kind, c.setting)][3] if c.primary else p
            assert c.p_holm == pytest.approx(expected, rel=1e-9), (c.task, kind, c.setting)
    # the reach step differences are negative (lap reaches sooner on every seed of task a)
    assert next(c for c in out if (c.task, c.kind, c.setting) == ("a", "reach", "lap")).diff.mean == pytest.approx(-7.5)


def test_two_primary_contrasts_are_holm_adjusted_among_themselves_per_quantity():
    """kills: compare.py:100 ``confirm = [c for c in family if c.primary]`` -> ``[]`` or -> over ``out`` (every kind),
    and compare.py:101 the confirmatory family's p taken from the whole family"""
    cfg = _cmp_config(primary=["lap"])  # a:lap and b:lap
    out = contrasts(_cmp_rows(), cfg)
    for kind, col in (("final", 0), ("reach", 2)):
        prim = [c for c in out if c.kind == kind and c.primary]
        assert [(c.task, c.setting) for c in prim] == [("a", "lap"), ("b", "lap")]
        raw = [_ref_diff(CMP_VALUES[(c.task, "lap")][col], CMP_VALUES[(c.task, "attention")][col],
                         folds=2 if c.task == "b" else None)[3] for c in prim]
        assert [c.p_holm for c in prim] == pytest.approx(holm_reference(raw), rel=1e-9)
    sel = [c for c in out if c.kind == "selected" and c.primary]
    raw = _ref_diff(CMP_VALUES[("a", "lap")][1], CMP_VALUES[("a", "attention")][1])[3]
    assert [(c.task, c.p_holm) for c in sel] == [("a", pytest.approx(raw, rel=1e-9))]


def test_contrasts_pass_the_confidence_level_to_every_test():
    """kills: compare.py:86 and :92 ``level=level`` dropped for the paired reach test and for ``compare_rows``
    (``level=0.9`` giving 95% intervals), and compare.py:82 the censored ``Difference`` losing its level"""
    values = dict(CMP_VALUES)
    values[("b", "half")] = (values[("b", "half")][0], values[("b", "half")][1], [25, None, 35, 30])
    rows = _cmp_rows(values)
    out = contrasts(rows, _cmp_config(), level=0.9)
    for c in out:
        assert c.diff.level == 0.9
    for c in out:
        if (c.task, c.kind, c.setting) in {("a", "final", "lap"), ("a", "reach", "half"), ("b", "final", "half")}:
            col = {"final": 0, "reach": 2}[c.kind]
            _close(c.diff, _ref_diff(CMP_VALUES[(c.task, c.setting)][col], CMP_VALUES[(c.task, "attention")][col],
                                     level=0.9, folds=2 if c.task == "b" else None))


def test_a_run_that_never_reached_censors_its_pair_whichever_side_it_is_on():
    """kills: compare.py:48 ``any(v is None ...)`` -> ``all`` and compare.py:81 ``a is None or b is None`` -> ``and``
    (a censored baseline or setting compared as if it had reached), and compare.py:48 ``not by_seed or``
    dropped (a row with no steps at all)"""
    values = dict(CMP_VALUES)
    values[("a", "attention")] = (*values[("a", "attention")][:2], [40, None, 45, 60])  # the baseline censored
    values[("b", "lap")] = (*values[("b", "lap")][:2], [15, 20, None, 10])  # a setting censored
    rows = _cmp_rows(values)
    next(r for r in rows if (r["task"], r["operator"]) == ("b", "half"))["reach_by_seed"] = {}
    out = {(c.task, c.kind, c.setting): c for c in contrasts(rows, _cmp_config())}
    for key in (("a", "reach", "lap"), ("a", "reach", "half"), ("b", "reach", "lap"), ("b", "reach", "half")):
        d = out[key].diff
        assert (d.n, d.mean, d.p, d.low) == (0, None, None, None) and d.note.startswith("censored"), key
        assert out[key].p_holm is None


def test_a_missing_row_skips_only_that_contrast_and_a_task_without_baseline_only_that_task():
    """kills: compare.py:71 ``continue`` -> ``break`` for a task without its baseline row (later tasks lost) and
    compare.py:77 ``continue`` -> ``break`` for a missing setting row (later settings lost)"""
    rows = [r for r in _cmp_rows() if (r["task"], r["operator"]) not in {("a", "attention"), ("b", "lap")}]
    out = contrasts(rows, _cmp_config())
    assert [(c.task, c.kind, c.setting) for c in out] == [("b", "final", "half"), ("b", "reach", "half")]


@pytest.mark.parametrize("side", ["half", "attention"])
def test_bug_a_side_without_selected_values_keeps_its_selected_contrast(side):
    """Bug: compare.py dropped a setting's ``selected`` contrast when the setting's row had no selected values
    (every run failed), but listed it, with no pairs, when the baseline's row had none; the ``final`` kind never
    drops one. Both sides now give the contrast with 0 pairs, ``p`` None, no Holm p and the note."""
    rows = _cmp_rows()
    del next(r for r in rows if (r["task"], r["operator"]) == ("a", side))["selected_by_seed"]
    out = contrasts(rows, _cmp_config())
    sel = {c.setting: c for c in out if c.kind == "selected" and c.task == "a"}
    assert list(sel) == ["lap", "half"]
    empty = sel["half"] if side == "half" else sel["lap"]
    assert empty.diff.n == 0 and empty.diff.p is None and empty.p_holm is None
    assert empty.diff.note.startswith("0 pair(s)")
    if side == "half":
        lap = sel["lap"]
        assert lap.diff.n == 4 and lap.diff.p is not None


def test_reach_steps_per_seed_or_none_when_censored_or_empty():
    """kills: compare.py:48 ``not by_seed or`` dropped (no steps at all read as an empty, uncensored pairing) and
    ``any`` -> ``all`` (one run that never reached the threshold)"""
    assert _reach_by_seed({"reach_by_seed": {0: 40, 1: 50}}) == {0: 40.0, 1: 50.0}
    assert _reach_by_seed({"reach_by_seed": {}}) is None and _reach_by_seed({}) is None
    assert _reach_by_seed({"reach_by_seed": {0: 40, 1: None}}) is None


@pytest.mark.parametrize("p, text", [(0.0495, "0.0495"), (0.04949, "0.049"), (0.0505, "0.051"), (0.05049, "0.0505"),
                                     (0.001, "0.001"), (0.00099, "<0.001"), (0.5, "0.500"), (1.0, "1.000")])
def test_format_p_at_the_edges_of_its_ranges(p, text):
    """kills: compare.py:116 ``0.0495 <= p`` -> ``<`` and ``p < 0.0505`` -> ``<=``; :118 ``p < 0.001`` -> ``<=``
    (0.001 itself printed as ``<0.001``)"""
    assert format_p(p) == text


def test_format_ci_is_n_a_when_either_bound_is_missing_and_uses_its_digits():
    """kills: compare.py:123 ``d.low is None or d.high is None`` -> ``and`` (a half-open interval printed with
    ``n/a`` inside), :125 ``digits`` not passed on, and :121 the default ``digits=4`` changed"""
    assert format_ci(Difference("paired t", 3, 0.1, low=None, high=0.2)) == "n/a"
    assert format_ci(Difference("paired t", 3, 0.1, low=-0.2, high=None)) == "n/a"
    d = Difference("paired t", 3, 0.1, low=-0.012345, high=0.2)
    assert format_ci(d) == "[-0.0123, +0.2000]"
    assert format_ci(d, 2) == "[-0.01, +0.20]"
    assert format_ci(Difference("paired t", 3, 0.0, low=-1e-9, high=1e-9)) == "[+0.0000, +0.0000]"


def _legend_config(**extra):
    raw = {"name": "lg", "seeds": [0, 1],
           "tasks": [{"name": "plain", "dataset": "digits", "model": "vit-digits"}],
           "operators": [{"name": "base"}, {"name": "lap", "laplacian_heads": 1}]}
    raw.update(extra)
    return load_experiment_config(raw)


LEGEND_HEAD = ("mean ± std: over seeds (sample std). Δ: the mean over seeds of the paired difference (setting minus "
               "base, same seed = same initialisation and batches); 95% CI: its t interval; p: two-sided paired t test")
LEGEND_DF = ("; df: its degrees of freedom (seeds - 1); p Wilcoxon: the signed-rank test of the same differences "
             "(exact; with n seeds it cannot fall below 2^(1-n), 0.25 for 3 seeds)")
LEGEND_HOLM = "; p Holm: p adjusted by Holm's method over all comparisons of the same quantity on the page (tasks x settings)"
LEGEND_PRIMARY = "; a primary contrast's over the primary contrasts of that quantity alone"
LEGEND_5 = "; below 0.05 is significant at a 5% family-wise error rate."
LEGEND_REACH = (" Steps to a threshold are compared only where every run of both settings reached it; n/a "
                "otherwise (censored: a run that never reached it has no step to subtract).")
LEGEND_ROLE = " role: primary contrasts were named in the config before it ran; all others are exploratory."
LEGEND_NONE = " The config names no primary contrasts (`primary = [...]`): every comparison is exploratory."


def test_table_legend_full_and_compact_written_out():
    """kills: compare.py:140 ``cv`` listing every task (not only cross-validated ones); :141 baseline
    ``operators[0]`` -> ``operators[1]``; :145 ``if not compact`` -> ``if compact`` (the df and Wilcoxon columns
    explained in the wrong table); :150 the primary sentence on ``not config.primary``; :152 the reach sentence
    in compact tables too, or only when every task has ``reach``; :160 ``elif not compact`` -> ``elif compact``"""
    plain = _legend_config()
    assert table_legend(plain) == LEGEND_HEAD + LEGEND_DF + LEGEND_HOLM + LEGEND_5 + LEGEND_NONE
    assert table_legend(plain, compact=True) == LEGEND_HEAD + LEGEND_HOLM + LEGEND_5
    tasks = [{"name": "plain", "dataset": "digits", "model": "vit-digits", "reach": {"val_acc": 0.5}},
             {"name": "cv", "dataset": "digits", "model": "vit-digits", "folds": 2}]
    rich = _legend_config(tasks=tasks, primary=["cv:lap"])
    cv = (" Cross-validated tasks (cv): seed s tests on fold s % K; the t, CI and p are Nadeau-Bengio corrected "
          "(variance (1/n + 1/(K-1)) s², n2/n1 = 1/(K-1) for K folds)")
    rank = ("; p Wilcoxon is not corrected: it treats the folds' differences as independent, though their training "
            "sets overlap, so it overstates the evidence.")
    assert table_legend(rich) == (LEGEND_HEAD + LEGEND_DF + LEGEND_HOLM + LEGEND_PRIMARY + LEGEND_5 + LEGEND_REACH + cv
                                  + rank + LEGEND_ROLE)
    compact = LEGEND_HEAD + LEGEND_HOLM + LEGEND_PRIMARY + LEGEND_5 + cv + "." + LEGEND_ROLE  # no Wilcoxon column
    assert table_legend(rich, compact=True) == compact


# ---------------------------------------------------------------------------- mutants judged equivalent
# gpu.py:87 ``except (RuntimeError, ValueError)`` -> ``except RuntimeError``: the installed torch raises
#     RuntimeError for every string ``torch.device`` refuses ('', 'cuda:x', 'cuda:-1', 'cpu:0:1', ' cpu', 'CUDA',
#     'cuda:+1', a 20-digit index, ...; checked by hand); a non-string never reaches it (TypeError first).
#     ValueError is kept for other torch versions; with this one the mutant behaves the same.
# compare.py:73 ``(["reach"] if task.reach else [])`` -> ``if task.reach is not None``: TaskConfig refuses any
#     ``reach`` but None or a one-item dict (config.py:140-147), so the two conditions agree on every task.
# compare.py:50 ``{k: float(v) ...}`` -> ``{k: v ...}``: the steps only go to paired_difference / nadeau_bengio,
#     which convert every value with float() (stats.py ``_pairs``); same Difference either way.
