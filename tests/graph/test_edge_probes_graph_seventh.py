"""Edge probes of the graph package, seventh pass: batch sizes taken from the masks, PyG references."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.graph import AttentionGraph, complete, from_edge_index


@pytest.mark.parametrize("build", [
    lambda: AttentionGraph.dense(3, key_padding_mask=torch.zeros(0, 3, dtype=torch.bool)),
    lambda: AttentionGraph.dense(3, allowed=torch.ones(0, 3, 3, dtype=torch.bool)),
    lambda: complete(3, key_padding_mask=torch.zeros(0, 3, dtype=torch.bool)),
    lambda: complete(3, key_padding_mask=torch.zeros(0, 3, dtype=torch.bool), layout="sparse"),
])
def test_bug_dense_graph_refuses_zero_sequences_from_its_masks(build) -> None:
    """Bug: batch_size=0 was refused, but a (0, N) key_padding_mask or a (0, N, N) allowed gave a dense graph with
    B=0, which to_sparse (and the builders' sparse layout) then refused with 'batch_size must be >= 1, got 0', an
    argument the caller never passed."""
    with pytest.raises(ValueError, match=r"(key_padding_mask|allowed) must have B >= 1 sequences, got shape \(0, 3"):
        build()


def test_dense_graph_with_one_sequence_from_its_masks_still_builds() -> None:
    g = AttentionGraph.dense(2, key_padding_mask=torch.tensor([[False, True]]),
                             allowed=torch.ones(1, 2, 2, dtype=torch.bool))
    assert g.batch_size == 1 and g.to_sparse().edge_index.tolist() == [[0], [0]]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
@pytest.mark.parametrize("self_loops", [None, True, False])
def test_from_edge_index_matches_pyg_dense_adjacency_for_uneven_batches(dtype, self_loops) -> None:
    """Duplicates, self loops, an isolated node and graphs of 3, 1 and 4 nodes, against PyG's own utilities."""
    utils = pytest.importorskip("torch_geometric.utils")
    batch = torch.tensor([0, 0, 0, 1, 2, 2, 2, 2])
    e = torch.tensor([[0, 0, 2, 2, 4, 7, 6], [1, 1, 2, 0, 5, 7, 4]])
    ref = e
    if self_loops is not None:
        ref, _ = utils.remove_self_loops(ref)
        if self_loops:
            ref, _ = utils.add_self_loops(ref, num_nodes=8)
    g = from_edge_index(e.to(dtype).t().contiguous().t(), 8, batch=batch, self_loops=self_loops)  # non-contiguous
    want = utils.to_dense_adj(ref, batch=batch).bool().transpose(1, 2)  # [b, target, source]
    assert torch.equal(g.dense_allowed(), want)
    assert torch.equal(g.to_dense().to_sparse().to_dense().dense_allowed(), want)
