"""Review of the late commits of sitting 58: 927b09b (``GraphBlock``'s checks of ``batch`` and of ``x``'s rank) and
4c54280/d9aca18 (``augment.crop_padding`` read by the config as ``ClassificationTask`` reads it)."""

from __future__ import annotations

import json
import re
import tomllib

import numpy as np
import pytest
import torch

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import _task_identity
from experiments_tiny_configs import TINY_DIGITS_USER_TOML  # tests/experiments, on the path (conftest.py)


def _block(global_attention: bool):
    pytest.importorskip("torch_geometric")
    from diffusionformer.models import GraphBlock

    torch.manual_seed(0)
    return GraphBlock(8, 2, global_attention=global_attention).eval()


@pytest.mark.parametrize("global_attention", [True, False])
@pytest.mark.parametrize("rank", [1, 3])
def test_graph_block_edge_index_names_x_of_the_wrong_rank_not_batch(global_attention, rank):
    """Bug (927b09b fixed it beside an ``AttentionGraph`` only): beside an ``edge_index``, the usual PyG call, x of
    shape ``(1, 5, 8)`` or ``(8,)`` with a right ``batch`` of shape ``(5,)`` was refused as "batch must have shape
    (num_nodes,) = (1,), got (5,)": the graph took its node count from x's first dimension and blamed the batch."""
    block = _block(global_attention)
    x, edge_index = torch.randn(5, 8), torch.tensor([[0, 1, 3], [1, 2, 4]])
    bad = x[None] if rank == 3 else x[0]
    with pytest.raises(ValueError, match=r"GraphBlock: beside an edge_index, x must be the nodes, of shape "
                                         r"\(num_nodes, D\), got shape " + re.escape(str(tuple(bad.shape)))):
        block(bad, edge_index, torch.tensor([0, 0, 0, 1, 1]))
    assert block(x, edge_index, torch.tensor([0, 0, 0, 1, 1])).shape == (5, 8)


@pytest.mark.parametrize("sparse_graph", [True, False])
def test_graph_block_refuses_a_0d_x_naming_dim(sparse_graph):
    """Bug: a 0-d x skipped the check of x's last dimension: beside an ``edge_index`` it failed with a bare
    ``IndexError: tuple index out of range``, beside an ``AttentionGraph`` with the norm's "Given
    normalized_shape=[8], expected input with shape [*, 8]", naming neither the block nor ``dim``."""
    from diffusionformer.graph import AttentionGraph

    block = _block(False)
    edge_index = torch.tensor([[0, 1, 3], [1, 2, 4]])
    graph = AttentionGraph.sparse(edge_index, 5) if sparse_graph else edge_index
    with pytest.raises(ValueError, match=r"GraphBlock: x must have last dimension dim=8, got shape \(\)"):
        block(torch.tensor(1.0), graph)


def test_task_config_takes_a_numpy_int_crop_padding_as_the_int_it_equals():
    """Bug: ``augment.crop_padding`` of a sweep grid's ``np.int64`` was refused when the config was read, as
    "augment.crop_padding must be an int >= 0, got np.int64(2)", though ``ClassificationTask`` takes it and the
    other counts of a task (``data_seed``, ``eval_batch_size``, ``folds``, the ``seeds``) are read as the ints they
    equal; it is kept as that int, so the run's identity serialises as one written in TOML."""
    text = TINY_DIGITS_USER_TOML.replace('metric = "test_acc"', 'metric = "test_acc"\naugment = {flip = true}', 1)
    doc = tomllib.loads(text)
    doc["tasks"][0]["augment"]["crop_padding"] = np.int64(2)
    task = load_experiment_config(doc).tasks[0]
    assert task.augment == {"flip": True, "crop_padding": 2} and type(task.augment["crop_padding"]) is int
    json.dumps(_task_identity(task, 0))
    for bad in (np.float64(2.0), np.True_, 2.0, -1):
        doc["tasks"][0]["augment"]["crop_padding"] = bad
        with pytest.raises(ValueError, match=r"augment.crop_padding must be an int >= 0"):
            load_experiment_config(doc)
