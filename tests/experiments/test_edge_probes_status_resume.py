"""`status` of an interrupted run names the step its checkpoint resumes from (the trainer cuts its log back there).

Reference: the resumed run's own ``summary.json`` ``resumed_from`` (what ``run`` actually did)."""

from __future__ import annotations

import json

import pytest
import torch

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import run_dir, run_status
from diffusionformer.experiments.runner import run_experiment
from diffusionformer.experiments.tables import format_status


def _raw(seeds):
    return {
        "name": "tiny", "seeds": seeds,
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2},
                   "train": {"max_steps": 6, "batch_size": 16, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 6,
                             "log_interval": 1, "checkpoint_interval": 4}}],
        "operators": [{"name": "attention"}],
    }


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """Seed 0 completed; seed 1 killed in its sixth update: five updates logged, its checkpoint at step 4."""
    from diffusionformer.experiments.tasks import ClassificationTask
    from diffusionformer.testing import interrupt_on_call

    root = tmp_path_factory.mktemp("status")
    run_experiment(load_experiment_config(_raw([0])), root, progress=False)
    with interrupt_on_call(ClassificationTask, "loss", 6), pytest.raises(KeyboardInterrupt):
        run_experiment(load_experiment_config(_raw([1])), root, progress=False)
    return root


def test_bug_status_names_the_checkpoint_step_an_interrupted_run_resumes_from(killed, tmp_path):
    """Bug: `status` gave an interrupted run's last logged step (5 / 6) as its progress and counted the time left
    from it, while `run` resumes it from its checkpoint (step 4) and trains steps 5 and 6 again."""
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(killed, root)
    cfg = load_experiment_config(_raw([0, 1]))
    rows = run_status(cfg, root)
    assert [(r["state"], r["step"], r["resumes_from"]) for r in rows] == [("completed", 6, None), ("interrupted", 5, 4)]
    text = format_status(rows)
    assert "| 1 | interrupted (resumes from step 4) | 5 / 6 |" in text
    run_experiment(cfg, root, progress=False)
    summary = json.loads((run_dir(root / "tiny", "digits", "attention", 1) / "summary.json").read_text())
    assert summary["resumed_from"] == rows[1]["resumes_from"]


def test_bug_status_time_left_counts_from_the_checkpoint(killed, tmp_path):
    """Bug: the estimate of the time left took 1 step for the interrupted run; resuming trains 2 (from step 4).
    Made visible with a completed run timed at 600 s (100 s a step): 2 steps are 3 min 20 s, 1 step 1 min 40 s."""
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(killed, root)
    spath = run_dir(root / "tiny", "digits", "attention", 0) / "summary.json"
    summary = json.loads(spath.read_text())
    summary["elapsed"] = 600.0
    spath.write_text(json.dumps(summary))
    text = format_status(run_status(load_experiment_config(_raw([0, 1])), root))
    assert "about 3 min of training left" in text


@pytest.mark.parametrize("damage", ["truncate", "legacy"])
def test_bug_status_reads_legacy_checkpoints_and_names_unreadable_ones(killed, tmp_path, damage):
    """Bug (with the fix's first form): a checkpoint in torch's legacy (non-zip) format cannot be memory-mapped and
    read as unreadable; a truncated one must say so, not pass as resuming from the logged step."""
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(killed, root)
    ckpt = run_dir(root / "tiny", "digits", "attention", 1) / "checkpoint.pt"
    if damage == "truncate":
        ckpt.write_bytes(ckpt.read_bytes()[:200])
    else:
        payload = torch.load(ckpt, weights_only=True)
        torch.save(payload, ckpt, _use_new_zipfile_serialization=False)
    row = run_status(load_experiment_config(_raw([0, 1])), root)[1]
    text = format_status([row])
    if damage == "truncate":
        assert row["resumes_from"] is None and "interrupted (its checkpoint is unreadable)" in text
    else:
        assert row["resumes_from"] == 4 and "interrupted (resumes from step 4)" in text


def test_status_of_an_interrupted_run_without_a_checkpoint_resumes_from_zero(killed, tmp_path):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(killed, root)
    (run_dir(root / "tiny", "digits", "attention", 1) / "checkpoint.pt").unlink()
    row = run_status(load_experiment_config(_raw([0, 1])), root)[1]
    assert (row["state"], row["step"], row["resumes_from"]) == ("interrupted", 5, 0)
    assert "interrupted (resumes from step 0)" in format_status([row])
