"""Training-engine defects an audit found: each case once trained something other than asked, or misreported."""

from __future__ import annotations

import json

import pytest
import torch

from diffusionformer.train import NonFiniteLossError, TrainConfig, Trainer

from tests.train.train_tiny_tasks import InfGradAt, RegressionTask, TinyMLP, tiny_config


@pytest.mark.parametrize("bad", [5, 7])  # mid-window, and the update just before a log/eval boundary
def test_an_infinite_gradient_without_clipping_is_caught_at_its_own_update(tmp_path, bad):
    cfg = tiny_config(max_steps=12, grad_clip=0.0, log_interval=4, eval_interval=4, checkpoint_interval=4)
    with pytest.raises(NonFiniteLossError) as info:
        Trainer(TinyMLP(), InfGradAt(bad), cfg, tmp_path).fit()
    assert info.value.step == bad  # was: the next update, whose loss is NaN
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["step"] <= 4 for r in records)  # nothing after the last good checkpoint (step 4) is logged


def test_batch_size_must_split_into_the_micro_batches():
    with pytest.raises(ValueError, match=r"batch_size: expected a multiple of grad_accum_steps \(3"):
        TrainConfig(max_steps=2, batch_size=10, grad_accum_steps=3)
    assert TrainConfig(max_steps=2, batch_size=12, grad_accum_steps=3).batch_size == 12


@pytest.mark.parametrize("device", ["meta", "mps"])
def test_devices_the_trainer_cannot_use_are_refused_at_construction(device):
    with pytest.raises(ValueError, match=r"expected 'auto', 'cpu' or 'cuda\[:N\]'"):
        TrainConfig(max_steps=2, batch_size=8, device=device)


def test_a_task_that_cannot_split_an_update_refuses_grad_accumulation(tmp_path):
    class WholeGraph(RegressionTask):
        splits_into_micro_batches = False

    with pytest.raises(ValueError, match=r"grad_accum_steps=2, but WholeGraph cannot split"):
        Trainer(TinyMLP(), WholeGraph(), tiny_config(grad_accum_steps=2), tmp_path)
    Trainer(TinyMLP(), WholeGraph(), tiny_config(), tmp_path)  # one micro-batch is fine


def test_the_task_adapters_that_cannot_split_say_so():
    from diffusionformer.experiments.tasks import ClassificationTask, DINOTask, NodeTask

    assert NodeTask.splits_into_micro_batches is False and DINOTask.splits_into_micro_batches is False
    assert getattr(ClassificationTask, "splits_into_micro_batches", True) is True


def test_graph_batches_that_do_not_split_evenly_are_refused_not_trimmed():
    from torch_geometric.data import Batch, Data

    from diffusionformer.experiments.tasks import GraphClassificationTask

    graphs = [Data(x=torch.zeros(2, 1), edge_index=torch.tensor([[0], [1]]), y=torch.tensor([0])) for _ in range(10)]
    batch = Batch.from_data_list(graphs)
    with pytest.raises(ValueError, match=r"a batch of 10 graphs does not split into 3 equal parts"):
        GraphClassificationTask.shard_batch(None, batch, 0, 3)  # was: 3 + 3 + 3 graphs, one dropped
    assert GraphClassificationTask.shard_batch(None, batch, 1, 2).num_graphs == 5


def test_resuming_in_another_precision_is_refused(tmp_path):
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=4, amp="off"), tmp_path).fit()
    later = tiny_config(max_steps=6, amp="bf16", lr_decay_steps=10)
    with pytest.raises(ValueError, match="amp"):
        Trainer(TinyMLP(), RegressionTask(), later, tmp_path, resume=True).fit()


def test_a_failure_after_resuming_from_another_folder_names_that_checkpoint(tmp_path):
    first = tmp_path / "first"
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=3, checkpoint_interval=3, lr_decay_steps=10), first).fit()
    cfg = tiny_config(max_steps=8, checkpoint_interval=0, lr_decay_steps=10)
    with pytest.raises(NonFiniteLossError) as info:
        Trainer(TinyMLP(), InfGradAt(4), cfg, tmp_path / "second", resume=first / "checkpoint.pt").fit()
    assert str(first / "checkpoint.pt") in str(info.value) and "(step 3)" in str(info.value)
