"""Review of sitting 58's hostile configs (seeds, folds, ``crop_padding``) and of ``GraphBlock``'s check of ``batch``
beside an ``AttentionGraph`` (commit 17fc790)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch

from diffusionformer.data import ClassificationData
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.tasks import ClassificationTask
from experiments_tiny_configs import TINY_DIGITS_USER_TOML as _BASE  # tests/experiments, on the path (conftest.py)


def test_numpy_int_seeds_beside_a_huge_folds_count_refused_by_name(tmp_path):
    """Bug: the seeds were checked but kept as given: numpy ints (a sweep grid's) stayed numpy ints, and beside
    ``folds = 2**63`` the fold check's ``s % folds`` failed with numpy's bare "Python int too large to convert to C
    long" instead of the fold message; seeds are now the Python ints they equal (as ``data_seed``)."""
    path = tmp_path / "c.toml"
    path.write_text(_BASE.replace('metric = "test_acc"', 'metric = "test_acc"\nfolds = 2', 1).replace(
        "seeds = [0]", "seeds = [0, 1]", 1), encoding="utf-8")
    config = load_experiment_config(path)
    config.tasks[0].folds = 2**63
    with pytest.raises(ValueError, match=r"cover every fold equally often .*got \[0, 1\] \(2 seeds for "):
        dataclasses.replace(config, seeds=[np.int64(0), np.int64(1)])
    config.tasks[0].folds = 2
    seeds = dataclasses.replace(config, seeds=[np.int64(0), np.uint32(1)]).seeds
    assert seeds == [0, 1] and all(type(s) is int for s in seeds), seeds


def _block_and_graph():
    pytest.importorskip("torch_geometric")
    from diffusionformer.graph import AttentionGraph
    from diffusionformer.models import GraphBlock

    torch.manual_seed(0)
    x, edge_index = torch.randn(5, 8), torch.tensor([[0, 1, 3], [1, 2, 4]])
    return GraphBlock(8, 2, global_attention=True).eval(), x, AttentionGraph.sparse(edge_index, 5)


@pytest.mark.parametrize("rank", [1, 3])
def test_graph_block_global_attention_names_x_of_the_wrong_rank_not_batch(rank):
    """Bug (17fc790): beside an ``AttentionGraph``, x of shape ``(1, 5, 8)`` or ``(8,)`` with a right ``batch`` of
    shape ``(5,)`` was refused as "batch must have shape (N,) = (1,), got (5,)", blaming the batch for x's rank;
    without global attention (and before that commit) the graph names x."""
    block, x, graph = _block_and_graph()
    bad = x[None] if rank == 3 else x[0]
    with pytest.raises(ValueError, match=r"expects x of shape \(num_nodes=5, D\), got " + re.escape(str(tuple(bad.shape)))):
        block(bad, graph, torch.tensor([0, 0, 0, 1, 1]))


def test_graph_block_global_attention_refuses_a_list_batch_by_name():
    """Bug: beside an ``AttentionGraph`` a ``batch`` given as a list failed with "'list' object has no attribute
    'shape'"; with an ``edge_index`` the same call named batch. Both now name it; a tensor of it runs."""
    block, x, graph = _block_and_graph()
    with pytest.raises(TypeError, match=r"batch must be an integer tensor of shape \(num_nodes,\), got list"):
        block(x, graph, [0, 0, 0, 1, 1])
    assert block(x, graph, torch.tensor([0, 0, 0, 1, 1])).shape == (5, 8)


def _images() -> ClassificationData:
    x, y = torch.randn(4, 1, 8, 6), torch.tensor([0, 1, 0, 1])
    return ClassificationData("toy", "image", x, y, x, y, x, y, num_classes=2, input_shape=(1, 8, 6))


@pytest.mark.parametrize("pad", [6, 2**63])
def test_classification_task_refuses_crop_padding_of_a_whole_image_side(pad):
    """Bug: the config's check of ``crop_padding`` against the images ran in ``validate`` only: a
    ``ClassificationTask`` (the library's, which the runner builds) took ``crop_padding = 2**63`` and failed at the
    first batch with torch's "Overflow when unpacking long long", and a whole side's padding drew crops of padding
    alone. It is refused at construction, naming the images' size; a padding below the shorter side trains."""
    with pytest.raises(ValueError, match=rf"crop_padding = {pad} is not smaller than the images \(8x6\).*at most 5"):
        ClassificationTask(_images(), augment={"crop_padding": pad})
    task = ClassificationTask(_images(), augment={"crop_padding": 5, "flip": True})
    assert task.train_batch(0, torch.Generator().manual_seed(0), 3)[0].shape == (3, 1, 8, 6)
