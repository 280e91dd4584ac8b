"""Review of 5953f9b, a62ba6c, ed321fb and 7abac78 (analyze's split line, gaps' warning, ``_rank_zero`` without a
process group, MultiCropAugment of an empty batch, ``eval_batch_size`` resolved by the dataset's kind).

Verified sound and not repeated beyond the table below: ``_rank_zero`` agrees with ``dist_env`` (and the runner's
``_world_size``) on every environment ``dist_env`` accepts; gaps on a published docs folder (no ``run_config.json``)
stays silent, as it has nothing to compare; a dataset's kind is fixed by its registration (``load_dataset`` refuses a
container of another kind), so ``dataset_options`` cannot change the default ``eval_batch_size``.

Found and fixed: ``MultiCropAugment(...)(empty, None)`` (``None``: torch's global generator, which the non-empty
batch and ``_require_generator`` accept) failed with an AttributeError on ``None.device``; the ``--set`` advice for
runs made on another dataset with ``eval_batch_size`` unset named the size the config's dataset resolves to, not the
one the run's dataset did (a text run's 64 windows advised as 512), a ``--set`` that does not bring the run back;
under DDP a task with its own ``shard_batch`` whose share did not split into micro-batches was told to give the task
a ``shard_batch`` method.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from diffusionformer.data.augment import MultiCropAugment
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.config import TaskConfig
from diffusionformer.experiments.results import _runs_of_another_train, _task_identity
from diffusionformer.experiments.runner import _world_size, run_dir, run_experiment
from diffusionformer.train import DistContext, Trainer, shard_batch
from diffusionformer.train.distributed import _rank_zero, dist_env

TRAIN_TESTS = str(Path(__file__).resolve().parents[1] / "train")  # the trainer tests' tiny model and task
if TRAIN_TESTS not in sys.path:
    sys.path.insert(0, TRAIN_TESTS)
from train_tiny_tasks import RegressionTask, TinyMLP, ddp_config  # noqa: E402

_VALUES = (None, "", " ", "0", "1", "2", "-1", "abc", "2.0")


def test_rank_zero_agrees_with_dist_env_on_every_environment_it_accepts():
    """A table over RANK x WORLD_SIZE x LOCAL_RANK: where ``dist_env`` reads an environment (no ValueError), the
    process it names rank 0 (or a single process) is the one ``_rank_zero`` says writes, and the runner's
    ``_world_size`` counts the processes ``dist_env`` does."""
    checked = 0
    for values in itertools.product(_VALUES, repeat=3):
        env = {k: v for k, v in zip(("RANK", "WORLD_SIZE", "LOCAL_RANK"), values) if v is not None}
        with mock.patch.dict(os.environ, env):
            for key in {"RANK", "WORLD_SIZE", "LOCAL_RANK"} - set(env):
                os.environ.pop(key, None)
            try:
                read = dist_env()
            except ValueError:
                continue
            checked += 1
            assert _rank_zero() == (read is None or read[0] == 0), env
            assert _world_size() == (1 if read is None else read[1]), env
    assert checked > 50


@pytest.mark.parametrize("noise_std", [0.0, 0.1])
def test_bug_multicrop_of_an_empty_batch_takes_torch_global_generator_as_a_full_one_does(noise_std):
    """Bug: ``generator=None`` (torch's global generator: ``_require_generator`` lets it pass, and a non-empty batch
    draws from it) failed for an empty batch with "'NoneType' object has no attribute 'device'"."""
    aug = MultiCropAugment(local_crops=1, noise_std=noise_std)
    assert aug(torch.rand(2, 1, 8, 8), None).shape == (3, 2, 1, 8, 8)
    state = torch.get_rng_state()
    views = aug(torch.rand(0, 1, 8, 8, dtype=torch.float16), None)
    assert views.shape == (3, 0, 1, 8, 8) and views.dtype == torch.float16
    assert torch.equal(torch.get_rng_state(), state)  # nothing drawn from the global generator either


_TRAIN = {"max_steps": 2, "batch_size": 8, "warmup_steps": 0, "eval_interval": 2, "log_interval": 1,
          "checkpoint_interval": 2, "lr_decay_steps": 2}


def _config(**task):
    return load_experiment_config({
        "name": "rev57e", "seeds": [0], "operators": [{"name": "attention"}],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2}, "train": _TRAIN, **task}]})


def test_bug_the_advice_for_a_run_of_another_dataset_names_the_size_its_dataset_resolved_to(tmp_path):
    """Bug: a run made on a text dataset with ``eval_batch_size`` unset (64 windows), read under a config of another
    dataset setting the size, was advised ``--set tasks.digits.eval_batch_size=512`` (the config's dataset's default):
    with its dataset set back that records 512, still another run. It is 64, as its dataset resolves unset."""
    run_experiment(_config(), tmp_path, progress=False, log=[].append)
    path = run_dir(tmp_path / "rev57e", "digits", "attention", 0) / "run_config.json"
    recorded = json.loads(path.read_text())
    assert recorded["eval_batch_size"] is None
    path.write_text(json.dumps({**recorded, "dataset": "pydoc-chars"}))  # as if made on the text corpus
    advice = _runs_of_another_train(_config(eval_batch_size=8), tmp_path, verb="publish")
    assert """--set 'tasks.digits.dataset="pydoc-chars"'""" in advice
    assert "--set tasks.digits.eval_batch_size=64" in advice, advice
    # the advice is the run's identity again: 64 on the text corpus records as unset
    text = TaskConfig(name="digits", dataset="pydoc-chars", model="vit-digits", eval_batch_size=64)
    assert _task_identity(text, 0)["eval_batch_size"] is None


def test_bug_accumulation_under_ddp_does_not_advise_a_shard_batch_to_a_task_that_has_one():
    """Bug: a task splitting its own batches (``shard_batch``, as GraphClassificationTask does) whose rank's share did
    not split into ``grad_accum_steps`` micro-batches was told "(or give the task a shard_batch method)"."""
    def own_split(batch, rank, world_size):  # the graph task's: counts graphs
        raise ValueError(f"shard_batch: a batch of 3 graphs does not split into {world_size} equal parts")

    trainer = Trainer(TinyMLP(dropout=0.0), RegressionTask(global_rng=False),
                      ddp_config(batch_size=6, grad_accum_steps=2), "unused")
    trainer.ctx = DistContext(0, 2, 0, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"multiple of 4 \(2 processes x grad_accum_steps=2\), got 6; got an error"
                                         r" splitting it: shard_batch: a batch of 3 graphs") as info:
        trainer._micro_batch(own_split, {"x": torch.zeros(3, 4)}, 0, 0)
    assert "give the task a shard_batch method" not in str(info.value)
    with pytest.raises(ValueError, match=r"got 6 \(or give the task a shard_batch method\); got an error"):
        trainer._micro_batch(shard_batch, shard_batch({"x": torch.zeros(6, 4)}, 0, 2), 0, 0)
