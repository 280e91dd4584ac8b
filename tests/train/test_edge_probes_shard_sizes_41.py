"""``shard_batch`` (DDP shards and the trainer's micro-batches) on batches whose tensors do not share dim 0."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from diffusionformer.train.distributed import shard_batch


def test_bug_tensors_of_different_first_sizes_are_refused_not_cut_into_rows():
    """Bug: a batch with an ``edge_index`` (2, E) beside node features (4, D) was sharded row by row, every tensor
    on its own dim 0: rank 0 of 2 got edge row 0 (the sources) as a (1, E) "edge_index" and nodes 0-1, a silent
    nonsense graph; a per-class weight (3,) beside (6, ...) tensors failed with a divisibility message about the
    weight. Tensors of different first sizes are refused, naming their paths and shapes."""
    batch = {"x": torch.randn(4, 3), "edge_index": torch.tensor([[0, 1, 2], [1, 2, 3]]), "y": torch.arange(4)}
    with pytest.raises(ValueError, match=r"batch dimension first.*\['edge_index'\] \(2, 3\)"):
        shard_batch(batch, 0, 2)
    with pytest.raises(ValueError, match=r"\[1\]\['w'\] \(3,\)"):
        shard_batch([torch.zeros(6, 2), {"w": torch.ones(3)}], 1, 2)


def test_pins_one_first_size_shards_every_tensor_and_shares_the_rest():
    """Pins: one B for every tensor (nested, any container) shards each; 0-dim tensors and plain values are shared,
    and world_size 1 hands the batch back as it is (no check: nothing is cut)."""
    batch = OrderedDict(x=torch.arange(12).view(6, 2), parts=[torch.arange(6), (torch.zeros(6, 1, 1), 7)],
                        scale=torch.tensor(2.0), name="b")
    got = shard_batch(batch, 2, 3)
    assert type(got) is OrderedDict
    assert got["x"].tolist() == [[8, 9], [10, 11]] and got["parts"][0].tolist() == [4, 5]
    assert got["parts"][1][0].shape == (2, 1, 1) and got["parts"][1][1] == 7
    assert got["scale"] is batch["scale"] and got["name"] == "b"
    odd = {"x": torch.zeros(4, 3), "edge_index": torch.zeros(2, 5, dtype=torch.long)}
    assert shard_batch(odd, 0, 1) is odd
