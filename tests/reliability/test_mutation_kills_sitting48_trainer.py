"""Mutation audit (sitting 48) of train/trainer.py (gradient accumulation, clipping, fp16 grad scaling, non-finite
loss handling, evaluation cadence, exact resume) and train/checkpoint.py (atomic writes, model records, refusing a
changed model, predated fields): tests that kill mutants the earlier tests left alive (each docstring names the
mutant). No GPU is used; the runs are the tiny tasks of tests/train/train_tiny_tasks.py, in one process.

trainer.py 26 mutants: 24 killed by earlier tests, 1 survivor killed here, 1 equivalent:

* ``_clip_grad_norm`` ``if not grads or not any(g.dtype in _HALF for g in grads)`` -> ``if not grads``: for float32
  or float64 gradients the other branch computes the same norm (``get_total_norm(foreach=True)``) and clips with
  ``clip_grads_with_norm_``, the two steps ``clip_grad_norm_`` takes: the norms and the clipped gradients are
  bit-identical (checked over 200 random sets of float32 gradients on the CPU).

checkpoint.py 20 mutants: 15 killed by earlier tests, 3 survivors killed here, 2 equivalent:

* ``_predated_fields_at_default`` ``if f.name not in config and f.default is not MISSING`` -> ``if f.default is not
  MISSING``: the filled defaults are merged under the checkpoint's own values (``{**filled, **config}``), so a field
  the checkpoint has keeps its saved value either way.
* ``_predated_fields_at_default`` ``{**filled, **config}`` -> ``{**config, **filled}``: ``filled`` holds only fields
  the checkpoint lacks, so the two mappings share no key and the order of the merge does not matter.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from diffusionformer.train import CheckpointError, Trainer, read_metrics, seed_everything
from diffusionformer.train.checkpoint import CHECKPOINT_FORMAT, load_checkpoint, save_checkpoint

TRAIN_TESTS = str(Path(__file__).resolve().parents[1] / "train")  # the trainer tests' tiny model and task
if TRAIN_TESTS not in sys.path:
    sys.path.insert(0, TRAIN_TESTS)
from train_tiny_tasks import RegressionTask, SimulatedKill, TinyMLP, tiny_config  # noqa: E402


def _payload(**changes):
    payload = {"format": CHECKPOINT_FORMAT, "step": 3, "model": {"w": torch.ones(2)}, "optimizer": {}, "rng": {},
               "config": {}}
    payload.update(changes)
    return payload


@pytest.mark.parametrize("config", [[("lr", 0.1)], None, "max_steps=10"])
def test_kills_load_checkpoint_config_not_a_dict_accepted(tmp_path, config):
    """kills: train/checkpoint.py ``load_checkpoint`` ``for key in ("model", "config")`` -> ``("model",)`` (a
    checkpoint whose config is not a TrainConfig table loaded without a word: ``load_checkpoint``'s callers, the
    experiment reload among them, then failed with a bare error far from the file, or read the wrong config)."""
    path = save_checkpoint(tmp_path / "checkpoint.pt", _payload(config=config))
    with pytest.raises(CheckpointError, match=rf"expected 'config' to be a dict, got {type(config).__name__}"):
        load_checkpoint(path)
    assert load_checkpoint(save_checkpoint(tmp_path / "good.pt", _payload()))["config"] == {}


def test_kills_load_checkpoint_model_keys_not_strings(tmp_path):
    """kills: train/checkpoint.py ``load_checkpoint`` ``bad = [k for k in payload["model"] if not isinstance(k, str)]``
    -> ``bad = []`` (a 'model' entry keyed by positions, not parameter names, loaded without a word; the resume then
    failed in ``load_state_dict`` with a bare "'int' object has no attribute 'startswith'" far from the file)."""
    path = save_checkpoint(tmp_path / "checkpoint.pt", _payload(model={0: torch.ones(2), "b": torch.zeros(1)}))
    with pytest.raises(CheckpointError, match=r"expected 'model' to be a state dict \(parameter names as keys\), "
                                              r"got the key 0 \(int\)"):
        load_checkpoint(path)


@pytest.mark.parametrize("log_interval, eval_interval", [(5, 0), (3, 5)], ids=["window-empty", "evaluated"])
def test_kills_resume_at_the_checkpoint_step_makes_what_is_left_of_the_last_update(tmp_path, log_interval,
                                                                                   eval_interval):
    """kills: train/trainer.py ``_finish_resumed_at_the_end`` ``if not self._window and evaluated:`` -> ``if not
    self._window or evaluated:`` (a longer run's step-5 checkpoint resumed with max_steps=5 made nothing when only one
    of the two was left: the evaluation due at the last update when the checkpoint's window was empty (logged at step
    5), or the train record of the window the checkpoint cut when step 5 had been evaluated). The log must be the
    uninterrupted max_steps=5 run's (compared by step and split: resumed after its step-5 evaluation, the step-5
    train record is written after it)."""
    fields = dict(lr_decay_steps=10, checkpoint_interval=5, eval_interval=eval_interval, log_interval=log_interval)
    seed_everything(0)
    with pytest.raises(SimulatedKill):
        Trainer(TinyMLP(), RegressionTask(fail_at=7), tiny_config(max_steps=10, **fields), tmp_path / "cut").fit()
    seed_everything(0)
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=5, **fields), tmp_path / "cut", resume=True).fit()
    seed_everything(0)
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=5, **fields), tmp_path / "whole").fit()

    def records(folder):
        return sorted((r["step"], r["split"], r["loss"], r["lr"]) for r in read_metrics(folder))

    assert records(tmp_path / "cut") == records(tmp_path / "whole")
    assert [r[:2] for r in records(tmp_path / "cut")][-2:] == [(5, "eval"), (5, "train")]
    saved = load_checkpoint(tmp_path / "cut" / "checkpoint.pt")
    assert saved["window"] == {} and saved["last_eval"]["step"] == 5


@dataclasses.dataclass
class _UserConfig:
    width: int  # required: no default to fill
    tags: list = dataclasses.field(default_factory=list)  # a default_factory: its default is what it makes
    depth: int = 2


class _UserModel(torch.nn.Linear):
    def __init__(self) -> None:
        super().__init__(2, 2)
        self.config = _UserConfig(width=4)


def test_kills_predated_fields_only_filled_with_plain_defaults():
    """kills: train/checkpoint.py ``_predated_fields_at_default`` ``if f.name not in config and f.default is not
    dataclasses.MISSING`` -> ``if f.name not in config`` (a field the checkpoint lacks that has no default, a
    required one, was "filled" with the MISSING sentinel: the resume error then read
    "config width: checkpoint '<dataclasses._MISSING_TYPE object at 0x...>'" instead of "checkpoint None"); a
    default_factory one is at the default its factory makes."""
    from diffusionformer.train.checkpoint import _predated_fields_at_default, model_record, model_record_differences

    model = _UserModel()
    saved = {**model_record(model), "config": {}}  # a record from before every field
    filled = _predated_fields_at_default(saved, model)
    assert filled["config"] == {"depth": 2, "tags": []}
    assert model_record_differences(filled, model_record(model)) == ["config width: checkpoint None, now 4"]
