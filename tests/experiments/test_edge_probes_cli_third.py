"""Edge-case probes of the experiments command line, third round (``main(argv)`` of
``python -m diffusionformer.experiments`` in process; a fresh interpreter only for a real Ctrl-C).

Probed: every subcommand's ``--help`` (each option listed); usage errors of every subcommand (exit 2, usage on
stderr, nothing on stdout); the read-only subcommands (``status``, ``summary``, ``publish``, ``analyze``) on one
finished tiny comparison (digits, 2 steps, 2 seeds, 2 settings, built once for the module), on a comparison with
no runs and on a partly finished one; files of the comparison replaced by folders; ``--out``/``--to`` naming the
same or nested folders; ``--device`` of ``analyze``; ``--threads``/``--workers``/``$DIFFUSIONFORMER_WORKERS``
values; SIGINT to a ``run`` in a fresh interpreter (exit code, one line, the state it leaves, the resume).

Found and fixed (tests named ``test_bug_...``):

- ``publish.publish_experiment``: ``publish c.toml --out tiny --to .`` (the docs folder ``./tiny`` of the page
  being the results root) replaced ``./tiny`` with the published copy and deleted every run (checkpoints, logs,
  summaries) of the comparison, with exit code 0. Refused now, before anything is read or written.
- ``analyze.analyze_experiment``: ``analyze --device foo`` (or ``meta``, ``mps``, ``cuda`` on a machine without
  one) ended in a ``RuntimeError`` / ``AssertionError`` traceback, some after the first run was loaded; the
  device is now checked first by ``run``'s rule (one ``error:`` line, exit 2).
- ``cli._main``: a folder in the place of ``results.json`` or ``results.md`` (or of a run's ``summary.json``) made
  ``run`` end in an ``IsADirectoryError`` traceback, while ``NotADirectoryError`` was one ``error:`` line.
- ``cli._main``: Ctrl-C in ``run --restart`` said "run the same command again: finished runs are kept", but the
  same command (with ``--restart``) discards the runs it had redone; the message now says what each choice does.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import diffusionformer
from experiments_tiny_configs import TINY_DIGITS_TOML
from diffusionformer.experiments.cli import _parser, main
from diffusionformer.experiments.results import run_dir

TOML = TINY_DIGITS_TOML.replace("seeds = [0]", "seeds = [0, 1]", 1)

RUNS = [("attention", 0), ("attention", 1), ("lap", 0), ("lap", 1)]


def _toml(folder: Path, text: str = TOML, name: str = "tiny.toml") -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text, encoding="utf-8")
    return str(folder / name)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished comparison: ``(config path, results root)``; tests copy it before changing anything in it."""
    root = tmp_path_factory.mktemp("finished")
    toml = _toml(root)
    assert main(["run", toml, "--out", str(root / "res"), "--no-progress"]) == 0
    return toml, root / "res"


def _copy(finished, tmp_path, to="res"):
    shutil.copytree(finished[1], tmp_path / to)
    return tmp_path / to


def _error(capsys, code, expected=2):
    """The one ``error:`` line of a user error: exit ``expected``, no traceback, nothing on stdout."""
    assert code == expected
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == ""
    return captured.err


# ----------------------------------------------------------------------------- the parser
def test_every_subcommands_help_lists_each_of_its_options(capsys):
    """Pins: ``<command> --help`` exits 0 on stdout alone and names every option the command takes."""
    for name, sub in _parser().commands.items():
        with pytest.raises(SystemExit) as info:
            main([name, "--help"])
        captured = capsys.readouterr()
        assert info.value.code == 0 and captured.err == ""
        for option in (s for a in sub._actions for s in a.option_strings):
            assert option in captured.out, (name, option)


@pytest.mark.parametrize("argv", [[], ["run"], ["show"], ["status"], ["summary"], ["publish"], ["analyze"],
                                  ["run", "c.toml", "--threads"], ["analyze", "c.toml", "--max-examples", "x"],
                                  ["status", "c.toml", "--device", "cpu"], ["list", "--out", "r"]])
def test_usage_errors_are_exit_2_with_usage_on_stderr_only(argv, capsys):
    """Pins: a missing argument, a value of the wrong type, an option another command has: exit 2, the command's
    usage and one error on stderr, nothing on stdout."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    captured = capsys.readouterr()
    assert info.value.code == 2 and captured.out == ""
    assert captured.err.startswith("usage: diffusionformer") and "error: " in captured.err


# ----------------------------------------------------------------------------- the read-only commands
def test_read_only_commands_on_a_finished_comparison(finished, tmp_path, capsys):
    """Pins: ``status`` counts 4 of 4, ``summary`` gives one well-formed row, ``publish`` writes strict JSON and the
    results folder is left byte for byte as it was."""
    toml, res = finished
    before = {p: p.read_bytes() for p in sorted(res.rglob("*")) if p.is_file()}
    assert main(["status", toml, "--out", str(res)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("4 of 4 runs completed") and out.count("| completed | 2 / 2 |") == 4
    assert main(["summary", toml, "--out", str(res)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["| task | metric (baseline mean) | lap |", "|---|---|---|"]
    assert lines[2].startswith("| tiny / digits | test_acc (") and lines[2].count("|") == 4
    with pytest.warns(RuntimeWarning, match="index.md not found"):
        assert main(["publish", toml, "--out", str(res), "--to", str(tmp_path / "docs")]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'docs' / 'tiny.md'}\n"
    published = json.loads((tmp_path / "docs" / "tiny" / "results.json").read_text(),
                           parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert sorted((r["operator"], r["seed"]) for r in published["runs"]) == RUNS
    assert {p: p.read_bytes() for p in sorted(res.rglob("*")) if p.is_file()} == before


def test_read_only_commands_on_no_runs_and_on_a_partly_finished_comparison(finished, tmp_path, capsys):
    """Pins: with no runs ``status`` lists all four missing (exit 0), ``summary``/``publish``/``analyze`` say to run
    first (exit 2); with one run missing and one interrupted ``status`` says so and ``analyze`` (without
    ``--partial``) names the missing checkpoint."""
    toml = finished[0]
    empty = tmp_path / "empty"
    assert main(["status", toml, "--out", str(empty)]) == 0
    assert capsys.readouterr().out.startswith("0 of 4 runs completed")
    assert "summary: no results under" in _error(capsys, main(["summary", toml, "--out", str(empty)]))
    assert "results.json not found: run" in _error(capsys, main(["publish", toml, "--out", str(empty),
                                                                  "--to", str(tmp_path / "d")]))
    err = _error(capsys, main(["analyze", toml, "--out", str(empty), "--no-progress", "--threads", "1"]))
    assert "no runs of experiment 'tiny'" in err and not (tmp_path / "d").exists()
    res = _copy(finished, tmp_path)
    shutil.rmtree(run_dir(res / "tiny", "digits", "lap", 1))
    (run_dir(res / "tiny", "digits", "lap", 0) / "summary.json").unlink()
    assert main(["status", toml, "--out", str(res)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 of 4 runs completed")
    assert "| lap | 0 | interrupted | 2 / 2 |" in out and "| lap | 1 | missing | 0 / 2 | n/a |" in out
    with pytest.warns(RuntimeWarning, match="not finished"):
        err = _error(capsys, main(["analyze", toml, "--out", str(res), "--no-progress", "--threads", "1"]))
    assert "have no checkpoint" in err and "lap/seed1/checkpoint.pt" in err


@pytest.mark.parametrize("env,message", [("0", "got 0"), ("abc", "got 'abc'"), ("2.5", "got '2.5'")])
def test_bad_workers_environment_is_one_error_before_anything_is_written(finished, tmp_path, capsys, monkeypatch,
                                                                         env, message):
    """Pins: ``$DIFFUSIONFORMER_WORKERS`` that is not a positive int: exit 2 naming it, no results folder made."""
    monkeypatch.setenv("DIFFUSIONFORMER_WORKERS", env)
    err = _error(capsys, main(["run", finished[0], "--out", str(tmp_path / "r"), "--no-progress"]))
    assert err == f"error: $DIFFUSIONFORMER_WORKERS: expected a positive int, {message}\n"
    assert not (tmp_path / "r").exists()


# ----------------------------------------------------------------------------- bugs
def test_bug_publish_to_the_folder_that_holds_the_results_keeps_the_runs(finished, tmp_path, capsys):
    """Bug: ``publish c.toml --out tiny --to .`` (docs folder ``./tiny`` = the results root) replaced ``./tiny``
    with the published copy and deleted every run of the comparison (checkpoints, logs, summaries), exit code 0.
    It is now one error naming both folders, and nothing is touched; ``--to`` = ``--out`` (the page regenerated
    in place) still publishes."""
    toml = finished[0]
    res = _copy(finished, tmp_path, "tiny")  # results root "tiny": the comparison in tiny/tiny
    before = sorted(p.relative_to(res) for p in res.rglob("*"))
    err = _error(capsys, main(["publish", toml, "--out", str(res), "--to", str(tmp_path)]))
    assert err.startswith(f"error: publish: the published folder {str(tmp_path / 'tiny')!r} (the comparison's "
                          f"name under --to) holds its results {str(res / 'tiny')!r} (--out)")
    assert sorted(p.relative_to(res) for p in res.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]
    with pytest.warns(RuntimeWarning, match="index.md not found"):
        assert main(["publish", toml, "--out", str(res), "--to", str(res)]) == 0
    assert (res / "tiny.md").is_file() and (run_dir(res / "tiny", "digits", "lap", 1) / "checkpoint.pt").is_file()


@pytest.mark.parametrize("device", ["foo", "meta", "cuda:99"])
def test_bug_analyze_checks_its_device_before_any_run(finished, capsys, device):
    """Bug: ``analyze --device foo`` ended in torch's ``RuntimeError: Expected one of cpu, cuda, ...`` traceback,
    ``meta`` in ``NotImplementedError`` and a CUDA device this machine lacks in an ``AssertionError`` (after the
    first run was loaded); the device is now checked first, as ``run`` does: one ``error:`` line, exit 2."""
    toml, res = finished
    err = _error(capsys, main(["analyze", toml, "--out", str(res), "--no-progress", "--threads", "1",
                               "--device", device])).splitlines()[-1]
    assert err.startswith("error: device") and repr(device) in err
    assert ("expected 'auto', 'cpu', 'cuda' or 'cuda:N'" in err) == (device != "cuda:99")
    assert not (res / "tiny" / "analysis").exists()


@pytest.mark.parametrize("name", ["results.json", "results.md"])
def test_bug_a_folder_in_place_of_a_result_file_is_one_error(finished, tmp_path, capsys, name):
    """Bug: a folder at ``<out>/<name>/results.json`` (or ``results.md``) made ``run`` end in an
    ``IsADirectoryError`` traceback when it rewrote the tables; now one ``error:`` line naming it, exit 2."""
    res = _copy(finished, tmp_path)
    (res / "tiny" / name).unlink()
    (res / "tiny" / name).mkdir()
    err = _error_tail(capsys, main(["run", finished[0], "--out", str(res), "--no-progress", "--threads", "1"]))
    assert err.startswith("error: [Errno 21] Is a directory") and err.rstrip().endswith(f"{res / 'tiny' / name}'")


def _error_tail(capsys, code):
    """The last stderr line of ``run``'s user error (the thread and status lines come first)."""
    assert code == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return captured.err.rstrip().splitlines()[-1]


def test_bug_ctrl_c_of_run_restart_does_not_advise_the_same_command(finished, tmp_path, capsys, monkeypatch):
    """Bug: Ctrl-C in ``run --restart`` said "run the same command again: finished runs are kept", but the same
    command (with ``--restart``) discards every run again, the ones it had redone included; the message now says
    what running it with and without ``--restart`` does."""
    from diffusionformer.experiments import runner

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_experiment", interrupted)
    code = main(["run", finished[0], "--restart", "--out", str(tmp_path / "r"), "--no-progress", "--threads", "1"])
    assert code == 130
    last = capsys.readouterr().err.rstrip().splitlines()[-1]
    assert last == ("interrupted: `run --restart` stopped; run again with --restart, every run is discarded again "
                    "(those it redid too); without --restart, the runs it redid are kept, an unfinished one resumes "
                    "from its last checkpoint and those it had not reached keep their earlier results")


# ----------------------------------------------------------------------------- a real Ctrl-C
_SLOW_CHILD = """
import sys, time
from diffusionformer.train.trainer import Trainer
update = Trainer._update
def slow(self, step, *args, **kwargs):  # steps long enough for the parent to interrupt the first run
    # 0.2 s a step once the first checkpoint (step 5) is written: the run cannot finish before the parent's SIGINT
    # even when a loaded machine delays it (40 steps of 0.02 s could, and the run then exited 0)
    time.sleep(0.02 if step < 5 else 0.2)
    return update(self, step, *args, **kwargs)
Trainer._update = slow
from diffusionformer.experiments.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigint_during_run_exits_130_with_one_line_and_the_run_resumes(tmp_path, capsys):
    """Pins: SIGINT to a ``run`` process (a fresh interpreter) in its first run: exit 130, nothing on stdout, the
    interrupted line last on stderr and no traceback; the run's lock is released, ``status`` says interrupted, and
    the next ``run`` finishes it with the same log as a run never interrupted."""
    text = (TOML.split('[[operators]]\nname = "lap"')[0].replace("seeds = [0, 1]", "seeds = [0]")
            .replace("max_steps = 2", "max_steps = 40").replace("eval_interval = 2", "eval_interval = 40")
            .replace("checkpoint_interval = 2", "checkpoint_interval = 5"))  # one run of 40 steps
    toml = _toml(tmp_path, text)
    out = tmp_path / "res"
    rdir = run_dir(out / "tiny", "digits", "attention", 0)
    package = Path(diffusionformer.__file__).parents[1]  # this checkout's package in the child too
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(package), *sys.path])}
    child = subprocess.Popen([sys.executable, "-c", _SLOW_CHILD, "run", toml, "--out", str(out), "--no-progress"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120  # the child's imports and data may take long on a loaded machine
        while time.monotonic() < deadline:  # the first checkpoint (step 5) written: training has started
            if (rdir / "checkpoint.pt").is_file() or child.poll() is not None:
                break
            time.sleep(0.01)
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 130, stderr
    assert stdout == "" and "Traceback" not in stderr
    assert stderr.rstrip().splitlines()[-1].startswith("interrupted: `run` stopped; run the same command again")
    assert not (rdir / ".lock").exists() and not (rdir / "summary.json").exists()
    assert main(["status", toml, "--out", str(out)]) == 0
    status = capsys.readouterr().out
    assert status.startswith("0 of 1 runs completed") and "| attention | 0 | interrupted |" in status
    assert main(["run", toml, "--out", str(out), "--no-progress", "--threads", "1"]) == 0
    once = tmp_path / "once"
    assert main(["run", toml, "--out", str(once), "--no-progress", "--threads", "1"]) == 0

    def log(root):
        return [(r["step"], r["split"], r["loss"]) for r in map(json.loads, (run_dir(root / "tiny", "digits",
                                                                                     "attention", 0)
                                                                             / "metrics.jsonl").open())]

    assert log(out) == log(once) and log(out)[-1][0] == 40
