"""Run identity and resume of the experiment runner (edge probes, sitting 57, after 1e93cdd).

Found and fixed: a task's ``eval_batch_size`` was no part of a run's identity, though it decides what a text task's
evaluation measures (its windows), a DINO task's validation loss (its images), a sampled node evaluation's
neighbourhoods and the summation order of every batched evaluation's loss; a run resumed under another torch version
was recorded nowhere as such (the comparison's manifest lists the versions, and ``run`` said nothing once the
comparison had seen the new one); a directory in place of a run's ``checkpoint.pt`` and a checkpoint whose step is
beyond the config's ``max_steps`` stopped the whole comparison instead of failing that run alone.
"""

from __future__ import annotations

import json

import pytest
import torch

import diffusionformer.train.trainer as trainer_mod
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import _runs_of_another_train, run_status
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.testing import interrupt_on_call

_TRAIN = {"max_steps": 4, "batch_size": 8, "warmup_steps": 0, "eval_interval": 2, "log_interval": 1,
          "checkpoint_interval": 2, "lr_decay_steps": 4}


def _config(seeds, train=None, **task):
    return load_experiment_config({
        "name": "audit", "seeds": list(seeds), "operators": [{"name": "attention"}],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2}, "train": train or _TRAIN, **task}]})


def _rdir(root, seed=0):
    return run_dir(root / "audit", "digits", "attention", seed)


def _interrupted(root):
    """Seed 0 of the audit comparison, killed in its 4th update: its checkpoint holds step 2."""
    with interrupt_on_call(trainer_mod.Trainer, "_update", 3), pytest.raises(KeyboardInterrupt):
        run_experiment(_config([0]), root, progress=False, log=[].append)


def test_bug_a_changed_eval_batch_size_is_another_run_and_legacy_runs_read_as_before(tmp_path):
    """Bug: ``run``/``status --set tasks.digits.eval_batch_size=8`` read a run made with 64 back as completed under
    the changed config (and a resume would have mixed two evaluation protocols in one log). Now the identity records
    the task's ``eval_batch_size`` (null: the task's default), so ``status`` names the change, ``publish`` advises the
    ``--set`` the runs were made with, and ``run`` refuses to continue the run. A run recorded before the key joined the
    identity (none in its ``run_config.json``) is read as it was: its batch size is unknown, not another one."""
    run_experiment(_config([0], eval_batch_size=64), tmp_path, progress=False, log=[].append)
    path = _rdir(tmp_path) / "run_config.json"
    identity = json.loads(path.read_text())
    assert identity["eval_batch_size"] == 64
    [row] = run_status(_config([0], eval_batch_size=8), tmp_path)
    assert row["state"] == "completed" and row["changed"] == "eval_batch_size (64 then 8)"
    advice = _runs_of_another_train(_config([0], eval_batch_size=8), tmp_path, verb="publish")
    assert "other task settings (eval_batch_size)" in advice and "--set tasks.digits.eval_batch_size=64" in advice
    with pytest.raises(ValueError, match=r"eval_batch_size \(64 then 8\)"):
        run_experiment(_config([0], eval_batch_size=8), tmp_path, progress=False, log=[].append)
    [row] = run_status(_config([0]), tmp_path)  # unset: the task's default, 512 for digits
    assert row["changed"] == "eval_batch_size (64 then unset)"
    # recorded unset, set since: another protocol too
    path.write_text(json.dumps({**identity, "eval_batch_size": None}))
    [row] = run_status(_config([0], eval_batch_size=8), tmp_path)
    assert row["changed"] == "eval_batch_size (unset then 8)"
    [row] = run_status(_config([0]), tmp_path)
    assert row["changed"] is None
    # a run recorded before eval_batch_size joined the identity (gpu_vision's published runs, made with 1024)
    path.write_text(json.dumps({k: v for k, v in identity.items() if k != "eval_batch_size"}))
    for config in (_config([0], eval_batch_size=1024), _config([0])):
        [row] = run_status(config, tmp_path)
        assert row["state"] == "completed" and row["changed"] is None
        assert _runs_of_another_train(config, tmp_path, verb="publish") is None
        [result] = run_experiment(config, tmp_path, progress=False, log=[].append)
        assert result.status == "completed"


def test_a_minibatch_task_evaluated_in_full_records_no_eval_batch_size():
    """A node task trained on sampled mini-batches but evaluated on the whole graph (``eval = "full"``) never reads
    ``eval_batch_size`` (its evaluation is exact): it is no part of that run's identity, so setting it refuses
    nothing; evaluated on sampled neighbourhoods it is."""
    from diffusionformer.experiments.config import TaskConfig
    from diffusionformer.experiments.results import _task_identity

    def identity(**minibatch):
        task = TaskConfig(name="cora", dataset="cora", model="gcn-2layer", eval_batch_size=32,
                          minibatch={"batch_size": 64, "num_neighbors": [5, 5], **minibatch})
        return _task_identity(task, 0)

    assert "eval_batch_size" not in identity()
    assert identity(eval="sampled")["eval_batch_size"] == 32


def test_bug_a_run_resumed_under_another_torch_version_is_recorded_and_noted(tmp_path, monkeypatch):
    """Bug: the checkpoint stored ``torch_version`` but nothing read it: a run killed under one torch and resumed under
    another, after the comparison had already seen the new version, ended with the numbers of no uninterrupted run
    without a word. Now its checkpoint and summary list every torch version that trained it (``torch_versions``, as
    ``torch_threads``) and ``run`` notes a run trained under several, naming it."""
    before = str(torch.__version__)
    _interrupted(tmp_path)
    monkeypatch.setattr(torch, "__version__", before + "+other")
    run_experiment(_config([1]), tmp_path, progress=False, log=[].append)  # the comparison sees the new version
    said: list[str] = []
    run_experiment(_config([0]), tmp_path, progress=False, log=said.append)
    summary = json.loads((_rdir(tmp_path) / "summary.json").read_text())
    assert summary["resumed_from"] == 2 and summary["torch_versions"] == [before, before + "+other"]
    notes = [s for s in said if "torch version" in s]
    assert len(notes) == 1 and "[digits / attention / seed 0]" in notes[0]
    assert f"torch {before} then {before}+other" in notes[0]
    whole = json.loads((_rdir(tmp_path, 1) / "summary.json").read_text())
    assert whole["torch_versions"] == [before + "+other"]


def test_a_checkpoint_written_before_torch_versions_gives_its_torch_version(tmp_path, monkeypatch):
    """A checkpoint written before the list (only ``torch_version``) starts the run's list with that version."""
    _interrupted(tmp_path)
    path = _rdir(tmp_path) / "checkpoint.pt"
    payload = torch.load(path, weights_only=True)
    del payload["torch_versions"]
    payload["torch_version"] = "1.0.0"
    torch.save(payload, path)
    run_experiment(_config([0]), tmp_path, progress=False, log=[].append)
    summary = json.loads((_rdir(tmp_path) / "summary.json").read_text())
    assert summary["torch_versions"] == ["1.0.0", str(torch.__version__)]


def test_bug_a_directory_in_place_of_the_checkpoint_fails_that_run_only(tmp_path):
    """Bug: a directory at a run's ``checkpoint.pt`` stopped the whole comparison with load_checkpoint's
    FileNotFoundError (the command line's exit 2), the runs after it not trained; ``status`` said it resumes from
    step 0. Now the run fails alone with a "not resumed" line, as a corrupt checkpoint's, and ``status`` gives no
    step it resumes from."""
    _interrupted(tmp_path)
    checkpoint = _rdir(tmp_path) / "checkpoint.pt"
    checkpoint.unlink()
    checkpoint.mkdir()
    [row] = run_status(_config([0]), tmp_path)
    assert row["state"] == "interrupted" and row["resumes_from"] is None
    said: list[str] = []
    first, second = run_experiment(_config([0, 1]), tmp_path, progress=False, log=said.append)
    assert first.status.startswith("failed") and "a directory" in first.status
    assert second.status == "completed"
    assert any("[digits / attention / seed 0] not resumed" in s and "a directory" in s for s in said)


def test_bug_a_checkpoint_beyond_max_steps_fails_that_run_only(tmp_path):
    """Bug: a run's checkpoint of a step beyond the config's ``max_steps`` (a longer run's, its ``run_config.json``
    lost) stopped the whole comparison with the trainer's ValueError. Now that run fails alone with a "not resumed"
    line that says how to continue it; the trainer's error is still a ValueError for its own callers."""
    run_experiment(_config([0]), tmp_path, progress=False, log=[].append)
    for name in ("summary.json", "run_config.json"):
        (_rdir(tmp_path) / name).unlink()
    said: list[str] = []
    first, second = run_experiment(_config([0, 1], train={**_TRAIN, "max_steps": 2}), tmp_path, progress=False,
                                   log=said.append)
    assert first.status.startswith("failed") and "max_steps >= the checkpoint's step 4, got 2" in first.status
    assert second.status == "completed"
    line = next(s for s in said if "[digits / attention / seed 0] not resumed" in s)
    assert "set max_steps to at least 4" in line

