"""Edge-case probes of the experiment runner's reliability, second round (run loop, run store, locks, overrides).

Probed: a comparison killed at every atomic write of a run (a hard kill in a child process just before and after
each ``os.replace``: checkpoints, metrics, run configs, summaries, learned operator values, results, manifest),
then resumed, against the uninterrupted comparison's ``results.json`` (every row but the wall times); three
processes on one comparison at once (every run trained once, no lock or temporary left, the same results);
strict validation of configs given as dicts and TOML files (numpy values, dotted keys, inline tables, arrays of
tables, duplicate names and seeds, unknown keys at every level); ``--set`` overrides (quoting, nested keys, names
holding dots) and the command line's exit codes; hostile files in a results folder (FIFOs, devices, links to
folders outside it, non-UTF-8 and oversized locks). Not repeated: what ``test_edge_probes_runner.py``,
``test_edge_probes_cli.py`` and ``test_edge_probes_config_store.py`` cover.

Found and fixed (tests named ``test_bug_...``):

* ``runner``: a run killed after its ``summary.json`` and before its ``learned_operators.json`` (written after
  it) was read back as finished with no learned operator values: ``results.json`` lost them for good, silently.
  The file is now rewritten from the run's final checkpoint when it is missing or unreadable.
* ``config``: ``--set`` could not address a task or operator setting whose name holds a dot (the repository's own
  ``study_graph.toml`` has tasks ``csbm-h0.1`` ... ``csbm-h0.9``): ``tasks.csbm-h0.1.train.lr=...`` looked for a
  task ``csbm-h0``, and quoting it as TOML does (``tasks."csbm-h0.1"``) looked for ``'"csbm-h0'``. Both forms work
  now, and an unknown entry name gets a "did you mean".
* ``results``/``outputs``/``runner``/``store``: a FIFO in a run file's place (``summary.json``, ``run_config.json``,
  ``.lock``, ``results.json``, ``manifest.json``) hung ``run`` and ``status`` for ever, and a link to ``/dev/zero``
  filled the memory (the OOM killer ended the probe); such files are now unreadable junk (rebuilt, or a stale
  lock), never read. A lock is read up to 4 KiB: a longer one is junk too.
* ``runner``: ``run --restart`` on a run folder holding a link to a folder stopped with ``OSError: Cannot call
  rmtree on a symbolic link`` half-way through the run's files (its metrics log gone, its completed summary and
  checkpoint kept: a finished run with no curves); the link is now removed, not followed.

Seen, not changed: a lock whose dead holder's pid was reused by an unrelated process counts as held (a container
restarted with the same pids); a FIFO in ``metrics.jsonl``'s place hangs the trainer's resume (``train/``, outside
this area); ``run --workers N`` starts its workers before checking ``--tasks`` names (each worker then fails).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.runner import run_dir, run_experiment


def _raw(seeds=(0,), steps=4, operators=None):
    return {"name": "tiny", "seeds": list(seeds), "tasks": [{
        "name": "digits", "dataset": "digits", "model": "vit-digits",
        "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2},
        "train": {"max_steps": steps, "batch_size": 16, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 2,
                  "log_interval": 1, "checkpoint_interval": 2}}],
        "operators": operators or [{"name": "attention"}]}


_HEAT = [{"name": "heat", "heads": "attention:1,heat(t=0.5, learnable=True):1"}]


def _rows(root):
    """``results.json`` of ``root`` without the wall times (the only entries a resume may change)."""
    data = json.loads((root / "tiny" / "results.json").read_text())
    for r in data["runs"]:
        r.pop("elapsed")
    for row in data["summary"]:
        for k in [k for k in row if "elapsed" in k]:
            row.pop(k)
    return data


def test_bug_a_run_killed_between_its_summary_and_its_learned_values_keeps_them(tmp_path, monkeypatch):
    """Bug: ``learned_operators.json`` is written after the trainer's ``summary.json``; a run killed between the two
    was read back as finished with ``learned == {}``: its learned diffusion times were lost from ``results.json``
    (and every table) for good, with no word. They are now rewritten from the run's final checkpoint."""
    from diffusionformer.experiments import runner

    cfg = load_experiment_config(_raw(operators=_HEAT))
    run_experiment(cfg, tmp_path / "clean", progress=False)
    real = runner.write_json_atomic

    def killed(path, obj):
        if Path(path).name == "learned_operators.json":
            raise KeyboardInterrupt  # as a SIGKILL there: the summary says completed, the file never comes
        return real(path, obj)

    monkeypatch.setattr(runner, "write_json_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "killed", progress=False)
    monkeypatch.setattr(runner, "write_json_atomic", real)
    rdir = run_dir(tmp_path / "killed" / "tiny", "digits", "heat", 0)
    assert json.loads((rdir / "summary.json").read_text())["status"] == "completed"
    assert not (rdir / "learned_operators.json").exists()
    logs = []
    resumed = run_experiment(cfg, tmp_path / "killed", progress=False, log=logs.append)
    assert _rows(tmp_path / "killed") == _rows(tmp_path / "clean")
    assert list(resumed[0].learned) == ["blocks.0.attn.operators.1.t"] and resumed[0].learned["blocks.0.attn.operators.1.t"]
    assert any("rewritten from its final checkpoint" in m for m in logs)
    # an unreadable file is rewritten too; a model without learned operators writes none
    (rdir / "learned_operators.json").write_bytes(b"\xff{")
    run_experiment(cfg, tmp_path / "killed", progress=False, log=logs.append)
    assert _rows(tmp_path / "killed") == _rows(tmp_path / "clean")
    plain = load_experiment_config(_raw(steps=2))
    run_experiment(plain, tmp_path / "plain", progress=False)
    run_experiment(plain, tmp_path / "plain", progress=False)
    assert not (run_dir(tmp_path / "plain" / "tiny", "digits", "attention", 0) / "learned_operators.json").exists()


def test_bug_set_addresses_names_that_hold_a_dot():
    """Bug: ``--set tasks.csbm-h0.1.train.max_steps=5`` on the repository's ``study_graph.toml`` said "no entry
    named 'csbm-h0' in tasks", and the TOML quoting ``tasks."csbm-h0.1"`` looked for ``'"csbm-h0'``: a task or
    setting whose name holds a dot could not be overridden at all. A misspelt entry name got no "did you mean"."""
    toml = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "study_graph.toml"
    for key in ("tasks.csbm-h0.1.train.max_steps", 'tasks."csbm-h0.1".train.max_steps',
                "tasks.'csbm-h0.1'.train.max_steps"):
        cfg = load_experiment_config(toml, [f"{key}=50"])
        steps = {t.name: t.train["max_steps"] for t in cfg.tasks}
        assert steps["csbm-h0.1"] == 50 and steps["csbm-h0.3"] != 50, key
    raw = _raw(operators=[{"name": "attention"}, {"name": "heat-0.5", "heads": "attention:1,heat(t=0.5):1"}])
    cfg = load_experiment_config(raw, ['operators."heat-0.5".heads="attention:1,heat(t=0.25):1"',
                                       "operators.heat-0.5.model_overrides.dropout=0.1"])
    assert cfg.operators[1].heads == "attention:1,heat(t=0.25):1" and cfg.operators[1].model_overrides == {"dropout": 0.1}
    with pytest.raises(ValueError, match=r"no entry named 'digit' in tasks; .*\(did you mean 'digits'\?\)"):
        load_experiment_config(_raw(), ["tasks.digit.train.lr=0.5"])
    with pytest.raises(ValueError, match=r"no entry named 'csbm-h0' .*did you mean 'csbm-h0\.[0-9]'"):
        load_experiment_config(toml, ["tasks.csbm-h0.2.train.lr=0.5"])
    with pytest.raises(ValueError, match="quote in its key is not closed"):
        load_experiment_config(_raw(), ['tasks."digits.train.lr=0.5'])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_bug_a_fifo_in_a_run_file_s_place_does_not_hang_run_or_status(tmp_path):
    """Bug: ``summary.json``, ``run_config.json``, ``.lock``, ``results.json`` or ``manifest.json`` being a FIFO
    (or a link to ``/dev/zero``) made ``status`` and ``run`` wait for ever on the open (or read until the memory was
    full). They are now junk like a truncated file: rebuilt by the run, a lock taken over once stale."""
    out = tmp_path / "out"
    rdir = run_dir(out / "tiny", "digits", "attention", 0)
    rdir.mkdir(parents=True)
    for name in ("summary.json", "run_config.json", ".lock"):
        os.mkfifo(rdir / name)
    os.utime(rdir / ".lock", (1, 1))  # left long ago: stale
    for name in ("results.json", "manifest.json"):
        os.mkfifo(out / "tiny" / name)
    code = f"""
import json, sys
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.runner import run_experiment, run_status
cfg = load_experiment_config(json.loads(sys.argv[1]))
print(run_status(cfg, {str(out)!r})[0]["state"])
print([r.status for r in run_experiment(cfg, {str(out)!r}, progress=False, log=lambda m: None)])
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(_raw(steps=2))], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["missing", "['completed']"], done.stdout
    for path in (rdir / "summary.json", rdir / "run_config.json", out / "tiny" / "results.json",
                 out / "tiny" / "manifest.json"):
        assert json.loads(path.read_text()), path
    assert not (rdir / ".lock").exists()


def test_an_oversized_lock_is_junk_not_read(tmp_path):
    """A lock of a megabyte (no lock this library writes is longer than a pid and a host name) is not read in whole:
    it is an unreadable lock, stale once old, then taken over; ``read_lock`` reports no holder."""
    from diffusionformer.experiments.store import acquire_lock, live_holder, read_lock, release_lock

    rdir = tmp_path / "run"
    rdir.mkdir()
    (rdir / ".lock").write_bytes(b'{"pid": 1, "host": "' + b"x" * (1 << 20) + b'"}')
    os.utime(rdir / ".lock", (1, 1))
    assert read_lock(rdir) is None and live_holder(rdir) is None
    assert acquire_lock(rdir) is None and read_lock(rdir) == (os.getpid(), __import__("platform").node())
    release_lock(rdir)
    assert not (rdir / ".lock").exists()


def test_bug_restart_removes_a_link_to_a_folder_instead_of_stopping_half_way(tmp_path):
    """Bug: ``run --restart`` (``resume=False``) called ``shutil.rmtree`` on a run folder's link to a folder, which
    refuses links: it stopped with ``OSError`` after deleting some of the run's files (its ``metrics.jsonl``) and
    not others (its completed ``summary.json``): the next ``run`` read back a finished run without its curves. The
    link is now removed; the folder it points to is left alone."""
    cfg = load_experiment_config(_raw(steps=2))
    first = run_experiment(cfg, tmp_path / "out", progress=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    rdir = run_dir(tmp_path / "out" / "tiny", "digits", "attention", 0)
    (rdir / "extra").symlink_to(elsewhere, target_is_directory=True)
    again = run_experiment(cfg, tmp_path / "out", progress=False, resume=False)
    assert [r.status for r in again] == ["completed"] and again[0].value == first[0].value
    assert (elsewhere / "keep.txt").read_text() == "mine" and not (rdir / "extra").exists()
    assert json.loads((rdir / "summary.json").read_text())["resumed_from"] is None  # trained again from step 0
    assert (rdir / "metrics.jsonl").is_file()


def test_a_kill_at_any_run_file_write_resumes_to_the_uninterrupted_results(tmp_path):
    """A hard kill (``os._exit`` in a child process) just before or just after the last ``os.replace`` of the run
    files that carry a run's results (its summary and learned operator values; the full sweep, every call both
    ways, passes; sampled here for time): the resumed ``results.json`` equals the uninterrupted one but for wall
    times. The child is a fresh interpreter, not a fork: a fork of a worker whose earlier tests started threads
    (torch's pools, a compile worker) can deadlock on a lock one of them held."""
    cfg = load_experiment_config(_raw(operators=_HEAT))
    real = os.replace
    calls = []

    def counting(a, b):
        calls.append(Path(b).name)
        return real(a, b)

    os.replace = counting
    try:
        run_experiment(cfg, tmp_path / "clean", progress=False)
    finally:
        os.replace = real
    last = {name: i + 1 for i, name in enumerate(calls)}  # the last write of each kind
    code = """
import json, os, sys
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.runner import run_experiment
cfg = load_experiment_config(json.loads(sys.argv[1]))
n, after, real, count = int(sys.argv[3]), sys.argv[4] == "1", os.replace, [0]
def replace(a, b):
    count[0] += 1
    if count[0] == n:
        if after:
            real(a, b)
        os._exit(137)
    return real(a, b)
os.replace = replace
run_experiment(cfg, sys.argv[2], progress=False, log=lambda m: None)
os._exit(0)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    sample = ("summary.json", "learned_operators.json")  # the kill points that lost the learned values
    assert set(sample) <= set(last), sorted(last)
    for name in sample:
        for after in (False, True):
            root = tmp_path / f"{name}-{after}"
            child = subprocess.run([sys.executable, "-c", code, json.dumps(_raw(operators=_HEAT)), str(root),
                                    str(last[name]), "1" if after else "0"], capture_output=True, text=True,
                                   timeout=300, env=env)
            assert child.returncode == 137, (name, after, child.stderr[-2000:])
            run_experiment(cfg, root, progress=False, log=lambda m: None)
            assert _rows(root) == _rows(tmp_path / "clean"), (name, after)
