"""Edge probes of diffusionformer.graph, sixth pass: head reductions of the export and sparse to_sparse."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.graph import AttentionGraph, to_networkx


def _weights(G) -> list[tuple[int, int, float]]:
    return sorted(G.edges(data="weight"))


def test_bug_to_networkx_bfloat16_head_mean_is_the_float64_mean() -> None:
    """Bug: the head mean was taken in the weights' dtype and only then cast to float64, so bfloat16 weights
    (1, 2^-8) exported 0.5 instead of their exact mean 0.501953125 (and a threshold between the two was
    decided on the rounded value)."""
    ei = torch.tensor([[0, 1], [1, 0]])
    w = torch.tensor([[1.0, 2.0 ** -8], [0.25, 0.25 + 2.0 ** -9]], dtype=torch.bfloat16)
    ref = w.double().mean(1).tolist()
    assert _weights(to_networkx(ei, w, head="mean")) == [(0, 1, ref[0]), (1, 0, ref[1])]
    kept = to_networkx(ei, w, head="mean", threshold=0.5)
    assert _weights(kept) == [(0, 1, ref[0])]


def test_bug_to_networkx_float32_head_mean_of_large_weights_is_finite() -> None:
    """Bug: a float32 mean over heads of weights near float32's max summed in float32 and overflowed to inf."""
    ei = torch.tensor([[0], [1]])
    w = torch.full((1, 4), 3e38, dtype=torch.float32)
    (edge,) = _weights(to_networkx(ei, w, head="mean"))
    assert edge[2] == pytest.approx(w.double().mean().item(), rel=1e-15)


def test_to_networkx_head_pick_and_max_keep_the_exact_values() -> None:
    ei = torch.tensor([[0, 1], [1, 0]])
    w = torch.tensor([[0.1, 0.7], [0.3, 0.2]], dtype=torch.float32)
    assert _weights(to_networkx(ei, w, head="max")) == [(0, 1, w[0, 1].item()), (1, 0, w[1, 0].item())]
    assert _weights(to_networkx(ei, w, head=1)) == [(0, 1, w[0, 1].item()), (1, 0, w[1, 1].item())]


@pytest.mark.parametrize("bad, err, match", [
    (3, ValueError, r"batch_size=3 disagrees with the graph's batch_size=2"),
    (0, ValueError, r"batch_size must be >= 1, got 0"),
    ("2", TypeError, r"batch_size must be an int"),
])
def test_bug_sparse_to_sparse_checks_batch_size(bad, err, match) -> None:
    """Bug: ``to_sparse(batch_size=...)`` of a sparse graph ignored its argument, so a batch size that disagreed with
    the graph's graphs (or was not an int) was silently accepted, while ``dense_allowed`` refused it."""
    g = AttentionGraph.sparse(torch.tensor([[0, 2], [1, 2]]), batch=torch.tensor([0, 0, 1]))
    with pytest.raises(err, match=match):
        g.to_sparse(batch_size=bad)
    with pytest.raises(err, match=match):
        g.dense_allowed(batch_size=bad)


def test_sparse_to_sparse_with_its_own_batch_size_is_the_graph() -> None:
    g = AttentionGraph.sparse(torch.tensor([[0, 2], [1, 2]]), batch=torch.tensor([0, 0, 1]))
    assert g.to_sparse(batch_size=2) is g
    single = AttentionGraph.sparse(torch.tensor([[0], [1]]), 3)
    assert single.to_sparse(batch_size=1) is single and single.to_sparse() is single
    with pytest.raises(ValueError, match="batch_size=2 disagrees"):
        single.to_sparse(batch_size=2)
