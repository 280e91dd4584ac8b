"""Edge probes of ``load_run`` (experiments.reload) and of the comparison's outputs (experiments.outputs)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
import torch

from diffusionformer.experiments import load_experiment_config, load_run
from diffusionformer.experiments import outputs
from diffusionformer.experiments.results import RunResult, run_dir


def _config(seeds):
    return load_experiment_config({
        "name": "cmp", "seeds": seeds,
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2}, "train": {"max_steps": 2}}],
        "operators": [{"name": "attention"}],
    })


def _finished(out: Path, seed: int, value: float) -> RunResult:
    """A completed run of seed ``seed`` on disk (its summary.json) and its row."""
    rdir = run_dir(out, "digits", "attention", seed)
    rdir.mkdir(parents=True)
    (rdir / "summary.json").write_text(json.dumps({"status": "completed"}))
    return RunResult("digits", "attention", seed, "completed", "accuracy", value, final={"accuracy": value})


def test_bug_two_workers_writing_the_outputs_at_once_keep_both_runs(tmp_path, monkeypatch):
    """Bug: two invocations on parts of one comparison (``--set seeds=[0]`` and ``--set seeds=[1]``, one per GPU)
    that wrote ``results.json`` at the same time each merged their run into the file as they had read it and
    replaced it: the one that replaced it last dropped the other's run from the table (a lost update). The
    read-merge-write of ``write_outputs`` is now done under an exclusive lock of the comparison's folder."""
    out = tmp_path / "cmp"
    out.mkdir()
    a, b = _finished(out, 0, 0.5), _finished(out, 1, 0.75)
    monkeypatch.setattr("diffusionformer.experiments.plots.plot_experiment", lambda *a, **k: [])
    real = outputs.write_json_atomic
    other = threading.Thread(target=outputs.write_outputs, args=(out, _config([1]), [b]))

    def write(path, obj):  # worker A has read results.json; worker B writes its outputs now
        if threading.current_thread() is not other and not other.is_alive() and other.ident is None:
            other.start()
            other.join(timeout=0.5)  # B either finishes (no lock) or waits for A's lock
        real(path, obj)

    monkeypatch.setattr(outputs, "write_json_atomic", write)
    outputs.write_outputs(out, _config([0]), [a])
    other.join()
    rows = json.loads((out / "results.json").read_text())["runs"]
    assert sorted(r["seed"] for r in rows) == [0, 1]


_GIT_ENV = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def _one_commit_checkout(repo: Path) -> None:
    """A git checkout at ``repo`` of one commit holding ``a.txt`` ("a"); the test skips where git is unusable."""
    repo.mkdir(exist_ok=True)
    (repo / "a.txt").write_text("a\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    try:
        subprocess.run(["git", "init", "-q"], cwd=repo, check=True, env=_GIT_ENV)
        subprocess.run([*git, "add", "a.txt"], cwd=repo, check=True, env=_GIT_ENV)
        subprocess.run([*git, "commit", "-qm", "a"], cwd=repo, check=True, env=_GIT_ENV)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no usable git")


def test_bug_git_commit_of_a_file_in_a_checkout_names_its_commit(tmp_path):
    """Bug: ``git_commit(path)`` of a file of a checkout (its docstring: "the checkout holding ``path``") ran git
    with the file as its working folder, failed and returned ``None``, as outside any checkout."""
    repo = tmp_path / "repo"
    _one_commit_checkout(repo)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, env=_GIT_ENV).stdout.strip()
    assert outputs.git_commit(repo) == head
    assert outputs.git_commit(repo / "a.txt") == head
    (repo / "a.txt").write_text("b\n")
    assert outputs.git_commit(repo / "a.txt") == head + "+dirty"
    assert outputs.git_commit(tmp_path / "missing") is None  # neither a file nor a folder: None, as outside a checkout


def test_bug_git_commit_does_not_rewrite_the_checkouts_index(tmp_path):
    """Bug (sitting 56): ``git_commit`` (the commit a comparison's manifest records, at every ``run`` and
    ``publish``) ran ``git status``, which refreshes the checkout's index: it took ``.git/index.lock`` and rewrote
    ``.git/index`` of the user's checkout, where a ``git commit`` run meanwhile fails on the lock. It now reads the
    state without git's optional locks."""
    _one_commit_checkout(tmp_path)
    os.utime(tmp_path / "a.txt", ns=(0, 0))  # stale stat data, same content: `git status` refreshed the index
    index = tmp_path / ".git" / "index"
    before = index.read_bytes()
    commit = outputs.git_commit(tmp_path)
    assert commit is not None and not commit.endswith("+dirty")
    assert index.read_bytes() == before


def test_bug_load_run_names_a_map_location_of_a_device_this_torch_cannot_use(tmp_path, run_folder):
    """Bug: ``load_run(path, map_location="mps")`` on a machine without MPS built the whole model and failed in
    ``model.to`` with torch's bare RuntimeError ("PyTorch is not linked with support for mps devices"); only a missing
    CUDA device was a ValueError naming ``map_location``."""
    if torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    rdir, _ = run_folder(tmp_path / "run", dim=8, summary={"status": "failed: stopped"})
    with pytest.raises(ValueError, match=r"map_location 'mps' asked for, but this torch cannot use it"):
        load_run(rdir, map_location="mps")


def test_moved_or_linked_failed_run_loads_bit_for_bit_in_eval_mode_pins(tmp_path, run_folder):
    """Pins: a run folder moved elsewhere or reached by a symbolic link loads the saved weights exactly (float32,
    eval mode, on the CPU), a failed run too; a checkpoint that would run code when unpickled is refused unrun."""
    rdir, model = run_folder(tmp_path / "a" / "run", dim=8, summary={"status": "failed: stopped"})
    moved = tmp_path / "b" / "moved"
    (tmp_path / "b").mkdir()
    rdir.rename(moved)
    link = tmp_path / "link"
    link.symlink_to(moved, target_is_directory=True)
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    for where in (moved, link, link / "checkpoint.pt"):
        run = load_run(where)
        p = next(run.model.parameters())
        assert not run.model.training and p.dtype == torch.float32 and p.device.type == "cpu"
        assert run.summary == {"status": "failed: stopped"} and run.step == 3
        with torch.no_grad():
            assert torch.equal(run.model(x), model(x))

    marker = tmp_path / "ran"

    class Hostile:
        def __reduce__(self):
            return (Path.touch, (marker,))

    torch.save({"format": 1, "model": Hostile()}, moved / "checkpoint.pt")
    from diffusionformer.train import CheckpointError
    with pytest.raises(CheckpointError, match="weights_only"):
        load_run(link)
    assert not marker.exists()
