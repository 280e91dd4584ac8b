"""Upgrading the library in the middle of a study: run folders written by an older commit, read by this code.

The on-disk files are built by hand as the older code wrote them (copied, stripped, from runs of commit 57aaf6c,
2026-12-01, before ``GPTConfig.recompute`` existed), not by checking out history.
"""

import json
import warnings

from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig, train_config
from diffusionformer.experiments.results import finished_runs, run_dir, run_status
from diffusionformer.experiments.runner import _check_identity, _check_sibling_identity, _run_identity
from diffusionformer.models import create_model

_OVERRIDES = {"n_embd": 16, "n_layer": 1, "n_head": 2, "block_size": 16}
_TRAIN = {"max_steps": 4, "batch_size": 4, "warmup_steps": 0, "eval_interval": 2, "log_interval": 1,
          "checkpoint_interval": 2}


def _old_identity(seed=0):
    """run_config.json of a gpt-char-tiny run as commit 57aaf6c wrote it: no ``recompute`` in its model config."""
    return {
        "dataset": "pydoc-chars", "dataset_options": {}, "data_seed": 0, "model": "gpt-char-tiny",
        "model_config": {"vocab_size": 103, "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, "dropout": 0.0,
                         "bias": True, "mlp_ratio": 4.0, "norm": "layernorm", "qk_norm": False, "tie_weights": True,
                         "heads": None, "laplacian_heads": None, "backend": "auto"},
        "train": {"max_steps": 4, "batch_size": 4, "lr": 0.0003, "min_lr": 0.0, "weight_decay": 0.1,
                  "betas": [0.9, 0.95], "warmup_steps": 0, "lr_decay_steps": None, "grad_clip": 1.0,
                  "eval_interval": 2, "eval_steps": None, "log_interval": 1, "checkpoint_interval": 2, "seed": seed,
                  "amp": "auto", "compile": False},
    }


def _task():
    return TaskConfig("chars", "pydoc-chars", "gpt-char-tiny", model_overrides=dict(_OVERRIDES), train=dict(_TRAIN),
                      metric="val_loss")


def _identity_now(task, seed=0):
    model = create_model("gpt-char-tiny", vocab_size=103, **_OVERRIDES)
    return _run_identity(task, model, train_config(task, seed))


def _write_finished(rdir, identity):
    rdir.mkdir(parents=True)
    (rdir / "run_config.json").write_text(json.dumps(identity))
    (rdir / "summary.json").write_text(json.dumps({
        "status": "completed", "step": 4, "elapsed": 0.19, "num_parameters": 5216,
        "eval": {"step": 4, "split": "eval", "loss": 4.5792,
                 "metrics": {"train_loss": 4.6069, "val_loss": 4.5792, "loss": 4.5792, "gap_loss": -0.0277}}}))


def test_bug_old_gpt_run_without_recompute_is_the_same_run(tmp_path):
    """Bug: a GPT run written before ``GPTConfig.recompute`` existed (commit 57aaf6c and earlier) was refused by
    ``run`` after the upgrade: "made with a different model_config (recompute: 'unset' then False); rename the task
    or operator setting, or pass --restart to discard it", although recompute (activation checkpointing, off by
    default) does not change what a run is. ``recompute`` was missing from the fields added after runs were
    published."""
    task, setting = _task(), OperatorSetting("attention")
    now = _identity_now(task)
    assert "recompute" not in now["model_config"]  # at its default: out of the identity, as the other new fields
    rdir = tmp_path / "seed0"
    _write_finished(rdir, _old_identity())
    _check_identity(rdir, now, task, setting)  # no ValueError
    sibling = tmp_path / "seed1"
    _check_sibling_identity(sibling, _identity_now(task, seed=1), task, setting)  # the old seed0 beside it is no other definition


def test_bug_run_recorded_with_a_new_field_at_its_default_is_the_same_run(tmp_path):
    """Bug: a run recorded while a new field was still written at its default (``"recompute": false``, as every run
    since commit 3a96569 recorded it; any field so recorded before it joined the list, ``grad_accum_steps: 1``) was
    compared as stored with the identity now, which leaves those fields out: refused as a run of another
    definition."""
    task, setting = _task(), OperatorSetting("attention")
    recorded = _old_identity()
    recorded["model_config"]["recompute"] = False
    recorded["train"]["grad_accum_steps"] = 1
    rdir = tmp_path / "seed0"
    _write_finished(rdir, recorded)
    _check_identity(rdir, _identity_now(task), task, setting)  # no ValueError
    _check_sibling_identity(tmp_path / "seed1", _identity_now(task, seed=1), task, setting)


def test_bug_results_and_status_keep_old_runs_beside_new_ones(tmp_path):
    """Bug: a finished seed written by an older commit (no ``recompute``) beside one written now: ``finished_runs``
    warned that it "holds a finished run made with a different model_config" and dropped it from the results, and
    ``status`` reported a seed recorded with ``grad_accum_steps: 1`` as made with another training config."""
    task, setting = _task(), OperatorSetting("attention")
    config = ExperimentConfig(name="gpt", tasks=[task], operators=[setting], seeds=[0, 1])
    out = tmp_path / "gpt"
    old = _old_identity(seed=0)
    old["train"]["grad_accum_steps"] = 1
    _write_finished(run_dir(out, "chars", "attention", 0), old)
    _write_finished(run_dir(out, "chars", "attention", 1), _identity_now(task, seed=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "left out of the results"
        rows = finished_runs(out, config)
    assert sorted(r.seed for r in rows) == [0, 1]
    assert [r["changed"] for r in run_status(config, tmp_path)] == [None, None]

