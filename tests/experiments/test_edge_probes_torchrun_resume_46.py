"""Probes of the experiment runner under torchrun (2 Gloo ranks on CPU) with dropout: a killed 2-rank run resumed by
2 ranks, by one process, a 1-process run resumed by 2 ranks, and the commands that read such mixed results.

Every multi-process launch is a fresh interpreter (``python -m torch.distributed.run``), never a fork."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.runner import run_dir, run_experiment

REPO = Path(__file__).resolve().parents[2]

CFG = {
    "name": "tr",
    "seeds": [0],
    "tasks": [{
        "name": "digits", "dataset": "digits", "model": "vit-digits",
        "model_overrides": {"dim": 16, "depth": 2, "num_heads": 2, "dropout": 0.2, "attn_dropout": 0.1},
        "train": {"max_steps": 6, "batch_size": 16, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 3,
                  "log_interval": 2, "checkpoint_interval": 2},
    }],
    "operators": [{"name": "attention"}],
}

_WRAPPER = """import sys
from diffusionformer.experiments.tasks import ClassificationTask
from diffusionformer.testing import interrupt_on_call
from diffusionformer.experiments.cli import main
with interrupt_on_call(ClassificationTask, "loss", int(sys.argv[1])):
    sys.exit(main(sys.argv[2:]))
"""


def _toml(tmp_path: Path) -> Path:
    from test_experiments_runner import _to_toml  # noqa: E402  (tests/experiments is on sys.path)

    path = tmp_path / "tr.toml"
    path.write_text(_to_toml(CFG))
    return path


def _torchrun(tmp_path: Path, args: list[str], *, kill_at: int | None = None, timeout: float = 240):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    if kill_at is None:
        target = ["-m", "diffusionformer.experiments"]
    else:
        wrapper = tmp_path / "_kill_wrapper.py"
        wrapper.write_text(_WRAPPER)
        target = [str(wrapper), str(kill_at)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}", *target,
           *args, "--no-progress"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # a hang is ended with every rank, not just the launcher
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        raise AssertionError(f"torchrun {args} hung; stderr: {err[-3000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _rdir(root: Path) -> Path:
    return run_dir(root / "tr", "digits", "attention", 0)


def _ckpt(root: Path) -> dict:
    return torch.load(_rdir(root) / "checkpoint.pt", weights_only=True)


def _same_weights(a: dict, b: dict) -> list[str]:
    return [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])]


def _records(root: Path) -> list[dict]:
    out = []
    for line in (_rdir(root) / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        rec.pop("time", None)
        rec.pop("elapsed", None)
        out.append(rec)
    return out


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    """An uninterrupted 2-rank run, and one killed inside ``loss`` at step 5 (checkpoint at 4) then resumed by 2 ranks;
    a copy of the killed one is left for the 1-process resume (3 launches)."""
    tmp = tmp_path_factory.mktemp("ddp")
    toml = _toml(tmp)
    clean = _torchrun(tmp, ["run", str(toml), "--out", str(tmp / "clean2")])
    assert clean.returncode == 0, clean.stderr[-3000:]
    killed = _torchrun(tmp, ["run", str(toml), "--out", str(tmp / "k2")], kill_at=5)
    assert killed.returncode != 0 and "interrupted" in killed.stderr, killed.stderr[-3000:]
    assert (_rdir(tmp / "k2") / "checkpoint.pt").is_file() and not (_rdir(tmp / "k2") / "summary.json").exists()
    assert torch.load(_rdir(tmp / "k2") / "checkpoint.pt", weights_only=True)["step"] == 4
    shutil.copytree(tmp / "k2", tmp / "k2to1")
    resumed = _torchrun(tmp, ["run", str(toml), "--out", str(tmp / "k2")])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return tmp


@pytest.mark.slow
def test_pins_two_rank_kill_and_resume_is_bit_identical_with_dropout(ddp_runs):
    """Pin: a 2-rank torchrun run with dropout killed at step 5 and resumed by 2 ranks ends with the uninterrupted
    2-rank run's weights, Adam moments and every log record, bit for bit (each rank's dropout stream restored: with
    rank 0's stream on rank 1 every tensor differs)."""
    a, b = _ckpt(ddp_runs / "clean2"), _ckpt(ddp_runs / "k2")
    assert _same_weights(a, b) == []
    for (ka, va), (kb, vb) in zip(a["optimizer"]["state"].items(), b["optimizer"]["state"].items()):
        for name in va:
            assert torch.equal(va[name], vb[name]), (ka, name)
    assert _records(ddp_runs / "clean2") == _records(ddp_runs / "k2")
    summary = json.loads((_rdir(ddp_runs / "k2") / "summary.json").read_text())
    assert summary["resumed_from"] == 4 and summary["world_size"] == 2 and summary["world_sizes"] == [2]
    clean = json.loads((_rdir(ddp_runs / "clean2") / "summary.json").read_text())
    assert clean["eval"]["metrics"] == summary["eval"]["metrics"] and clean["world_sizes"] == [2]
    assert json.loads((ddp_runs / "k2" / "tr" / "manifest.json").read_text())["world_sizes"] == [2]


@pytest.mark.slow
def test_bug_resume_under_another_number_of_processes_is_recorded(ddp_runs, tmp_path):
    """Bug: a 2-rank checkpoint resumed by one process (and a 1-process one under torchrun) trained on without a word,
    and its ``summary.json`` said ``world_size: 1`` (the last process count) as if the whole run had: its weights
    differ in every tensor from both uninterrupted runs (measured), yet neither the summary, the log nor
    ``manifest.json`` (which named no process count at all) told the mixed run from an uninterrupted one. Now the
    summary and checkpoint list ``world_sizes`` oldest first, the manifest every invocation's, and the run logs a
    note."""
    cfg = load_experiment_config(CFG)
    said: list[str] = []
    res = run_experiment(cfg, ddp_runs / "k2to1", progress=False, log=said.append)
    assert res[0].status == "completed"
    summary = json.loads((_rdir(ddp_runs / "k2to1") / "summary.json").read_text())
    assert summary["world_size"] == 1 and summary["resumed_from"] == 4 and summary["world_sizes"] == [2, 1]
    assert any("trained by 2 then 1 process" in m for m in said), said
    manifest = json.loads((ddp_runs / "k2to1" / "tr" / "manifest.json").read_text())
    assert manifest["world_size"] == 1 and manifest["world_sizes"] == [2, 1]
    assert len(_same_weights(_ckpt(ddp_runs / "k2to1"), _ckpt(ddp_runs / "clean2"))) > 0  # not the 2-rank run's
    # and the other way: a 1-process run killed at step 5, resumed under torchrun (1 launch)
    from diffusionformer.experiments.tasks import ClassificationTask
    from diffusionformer.testing import interrupt_on_call

    with interrupt_on_call(ClassificationTask, "loss", 5), pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "k1", progress=False)
    done = _torchrun(tmp_path, ["run", str(_toml(tmp_path)), "--out", str(tmp_path / "k1")])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained by 1 then 2 process" in done.stdout + done.stderr
    summary = json.loads((_rdir(tmp_path / "k1") / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["resumed_from"] == 4 and summary["world_sizes"] == [1, 2]
    assert json.loads((tmp_path / "k1" / "tr" / "manifest.json").read_text())["world_sizes"] == [1, 2]
    assert torch.load(_rdir(tmp_path / "k1") / "checkpoint.pt", weights_only=True)["world_sizes"] == [1, 2]


def test_bug_workers_under_torchrun_are_refused(tmp_path, monkeypatch, capsys):
    """Bug: ``torchrun --nproc_per_node=2 -m diffusionformer.experiments run CONFIG --workers 2`` made every rank start
    2 workers, which inherited torchrun's WORLD_SIZE/RANK/MASTER_PORT and joined (or broke) its process group: one
    worker died with "Connection reset by peer" and the launch hung (measured: killed after 100 s). Now refused
    before any worker starts."""
    from diffusionformer.experiments import gpu
    from diffusionformer.experiments.cli import main

    def started(*args, **kwargs):
        raise AssertionError("workers were started under torchrun")

    monkeypatch.setattr(gpu, "run_workers", started)
    for k, v in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(k, v)
    code = main(["run", str(_toml(tmp_path)), "--out", str(tmp_path / "r"), "--workers", "2", "--no-progress"])
    assert code != 0 and "error: --workers 2 under torchrun (WORLD_SIZE=2)" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_bug_torchrun_skips_a_run_that_a_live_worker_holds(tmp_path):
    """Bug: the runner took no run lock under torchrun, so a torchrun job trained a run that a live single-process
    worker (``run --workers``, another invocation per seed) held and was training: both wrote its checkpoint, log and
    summary (and ``status`` showed a torchrun job's runs as interrupted, not running). Now rank 0 claims the lock for
    every rank, and all skip a run another live process holds (1 launch)."""
    from diffusionformer.experiments.store import LOCK_NAME, acquire_lock, release_lock

    rdir = _rdir(tmp_path / "r")
    assert acquire_lock(rdir) is None  # this (live) test process holds the run
    try:
        proc = _torchrun(tmp_path, ["run", str(_toml(tmp_path)), "--out", str(tmp_path / "r")])
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"process {os.getpid()}" in proc.stdout + proc.stderr and "skipped" in proc.stdout + proc.stderr
        assert not (rdir / "summary.json").exists() and not (rdir / "checkpoint.pt").exists()
        assert (rdir / LOCK_NAME).is_file()  # still ours: not taken over nor removed by rank 0
    finally:
        release_lock(rdir)


@pytest.mark.slow
def test_bug_status_analyze_publish_of_a_comparison_trained_with_and_without_torchrun(ddp_runs, tmp_path, capsys):
    """Bug: a comparison whose seed 0 was trained by ``torchrun --nproc_per_node=2`` and seed 1 by one process (with
    dropout their numbers are not comparable bit for bit: each rank draws its own masks) was published with a Machine
    line naming no process count, as if one process had trained every run. ``status`` and ``analyze`` read such mixed
    runs fine (pinned here); the page now names the processes per run."""
    from test_experiments_runner import _to_toml  # noqa: E402

    from diffusionformer.experiments.cli import main

    mix = tmp_path / "mix"
    shutil.copytree(ddp_runs / "clean2", mix)
    toml = tmp_path / "mix.toml"
    toml.write_text(_to_toml(dict(CFG, seeds=[0, 1])))
    assert main(["run", str(toml), "--out", str(mix), "--no-progress"]) == 0
    rows = json.loads((mix / "tr" / "results.json").read_text())["runs"]
    assert sorted((r["seed"], r["status"]) for r in rows) == [(0, "completed"), (1, "completed")]
    assert json.loads((mix / "tr" / "manifest.json").read_text())["world_sizes"] == [2, 1]
    sizes = {s: json.loads((run_dir(mix / "tr", "digits", "attention", s) / "summary.json").read_text())["world_sizes"]
             for s in (0, 1)}
    assert sizes == {0: [2], 1: [1]}
    capsys.readouterr()
    assert main(["status", str(toml), "--out", str(mix)]) == 0
    assert "2 of 2 runs completed" in capsys.readouterr().out
    assert main(["analyze", str(toml), "--out", str(mix), "--no-progress"]) == 0
    assert (mix / "tr" / "analysis" / "metrics.json").is_file()
    assert main(["publish", str(toml), "--out", str(mix), "--to", str(tmp_path / "docs")]) == 0
    machine = next(line for line in (tmp_path / "docs" / "tr.md").read_text().splitlines() if "**Machine:**" in line)
    assert "processes per run: 2, 1 (runs of this comparison were trained by 2 numbers of processes" in machine
