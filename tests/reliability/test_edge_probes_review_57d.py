"""Review of bd77e7f (``eval_batch_size`` in a run's identity, ``torch_versions``, the two new checkpoint errors).

Found and fixed: an ``eval_batch_size`` set to what unset resolves to (512, 64 windows for text) was another run than
one of it unset, so ``run`` refused the same evaluation; ``publish``'s advice for a run recorded unset named no
``--set`` (TOML has no null); a run recorded before the key joined the identity, resumed, had its ``run_config.json``
rewritten with this config's value, as if the whole run had been made at it; ``status`` said a run whose checkpoint
is of a step beyond ``max_steps`` resumes from there, though ``run`` fails it.
"""

from __future__ import annotations

import json

import pytest

import diffusionformer.train.trainer as trainer_mod
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.config import TaskConfig
from diffusionformer.experiments.results import _runs_of_another_train, _task_identity, run_status
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.experiments.tables import format_status
from diffusionformer.testing import interrupt_on_call

_TRAIN = {"max_steps": 4, "batch_size": 8, "warmup_steps": 0, "eval_interval": 2, "log_interval": 1,
          "checkpoint_interval": 2, "lr_decay_steps": 4}


def _config(seeds=(0,), train=None, **task):
    return load_experiment_config({
        "name": "rev57d", "seeds": list(seeds), "operators": [{"name": "attention"}],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2}, "train": train or _TRAIN, **task}]})


def _rdir(root, seed=0):
    return run_dir(root / "rev57d", "digits", "attention", seed)


def _run(config, root):
    return run_experiment(config, root, progress=False, log=[].append)


def test_bug_eval_batch_size_set_to_its_default_is_the_run_made_with_it_unset(tmp_path):
    """Bug: a run made with ``eval_batch_size`` unset (digits: 512) was refused by ``run`` and flagged by ``status``
    as ``eval_batch_size (unset then 512)`` under a config setting 512, the very batches it was evaluated with."""
    _run(_config(), tmp_path)
    [row] = run_status(_config(eval_batch_size=512), tmp_path)
    assert row["state"] == "completed" and row["changed"] is None
    [result] = _run(_config(eval_batch_size=512), tmp_path)
    assert result.status == "completed"
    # recorded at 512 (by bd77e7f), read unset now: the same run; another size still is another one
    path = _rdir(tmp_path) / "run_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "eval_batch_size": 512}))
    assert run_status(_config(), tmp_path)[0]["changed"] is None
    assert run_status(_config(eval_batch_size=256), tmp_path)[0]["changed"] == "eval_batch_size (unset then 256)"
    # text resolves unset to 64 windows, known without loading the data
    text = TaskConfig(name="t", dataset="tinyshakespeare", model="gpt-tiny", eval_batch_size=64)
    assert _task_identity(text, 0)["eval_batch_size"] is None
    assert _task_identity(TaskConfig(name="t", dataset="tinyshakespeare", model="gpt-tiny", eval_batch_size=512),
                          0)["eval_batch_size"] == 512


def test_bug_the_advice_for_a_run_recorded_unset_names_a_set_that_brings_it_back(tmp_path):
    """Bug: for runs made with ``eval_batch_size`` unset under a config that sets it, the advice said to use "the
    --set overrides they were run with" naming none (null has no TOML). It names the size unset resolves to, which
    is the same run."""
    _run(_config(), tmp_path)
    advice = _runs_of_another_train(_config(eval_batch_size=8), tmp_path, verb="publish")
    assert "--set tasks.digits.eval_batch_size=512" in advice
    assert _runs_of_another_train(_config(eval_batch_size=512), tmp_path, verb="publish") is None


def test_bug_a_run_recorded_before_eval_batch_size_resumed_stays_of_an_unknown_size(tmp_path):
    """Bug: a run recorded without ``eval_batch_size`` (made at a size not known), interrupted and resumed, had its
    ``run_config.json`` rewritten with this config's size: the whole run read as made at it, and flagged (refused by
    ``run``) under a config giving the size its first steps were evaluated at."""
    with interrupt_on_call(trainer_mod.Trainer, "_update", 3), pytest.raises(KeyboardInterrupt):
        _run(_config(eval_batch_size=1024), tmp_path)
    path = _rdir(tmp_path) / "run_config.json"
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "eval_batch_size"}))
    [result] = _run(_config(eval_batch_size=8), tmp_path)
    assert result.status == "completed"
    assert "eval_batch_size" not in json.loads(path.read_text())
    [row] = run_status(_config(eval_batch_size=1024), tmp_path)
    assert row["changed"] is None


def test_bug_status_does_not_say_a_checkpoint_beyond_max_steps_is_resumed_from(tmp_path):
    """Bug: a run's checkpoint of a step beyond the config's ``max_steps`` (a longer run's, its ``run_config.json``
    and summary lost), which ``run`` fails, was shown by ``status`` as an interrupted run that "resumes from step 4"
    of 2, with no training left."""
    _run(_config(), tmp_path)
    for name in ("summary.json", "run_config.json"):
        (_rdir(tmp_path) / name).unlink()
    config = _config(train={**_TRAIN, "max_steps": 2})
    [row] = run_status(config, tmp_path)
    assert row["state"] == "interrupted" and row["resumes_from"] == 4 and row["max_steps"] == 2
    text = format_status([row])
    assert "resumes from step" not in text and "its checkpoint is of step 4, beyond max_steps: `run` fails it" in text
    [result] = _run(config, tmp_path)
    assert result.status.startswith("failed")
