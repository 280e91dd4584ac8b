"""Bad input fails early with a message that says what was expected and what came."""

from __future__ import annotations

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.graph import (
    AttentionGraph,
    causal,
    complete,
    from_networkx,
    from_pyg,
    grid,
    knn,
    sliding_window,
    to_networkx,
)


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: sliding_window(5, -1), ValueError, r"window must be >= 0, got -1"),
        (lambda: sliding_window(5, 1.5), TypeError, r"window must be an int, got float"),
        (lambda: AttentionGraph.dense(5, window=-2), ValueError, r"window must be >= 0"),
        (lambda: grid(3, 3, radius=-1), ValueError, r"radius must be finite and >= 0, got -1"),
        (lambda: grid(3, 3, metric="cosine"), ValueError, r"metric must be one of .*'chebyshev'.*got 'cosine'"),
        (lambda: grid(0, 3), ValueError, r"h must be >= 1, got 0"),
        (lambda: complete(0), ValueError, r"N must be >= 1, got 0"),
        (lambda: complete(3, layout="csr"), ValueError, r"layout must be one of \('dense', 'sparse'\), got 'csr'"),
        (lambda: causal(3, batch_size=True), TypeError, r"batch_size must be an int, got bool"),
        (lambda: knn(torch.randn(4, 2), 4), ValueError, r"k must be smaller .* got k=4, smallest graph has N=4"),
        (lambda: knn(torch.randn(5, 2), 3, batch=torch.tensor([0, 0, 0, 1, 1])), ValueError, r"got k=3, smallest graph has N=2"),
        (lambda: knn(torch.randn(4, 2), 0), ValueError, r"k must be >= 1, got 0"),
        (lambda: knn(torch.arange(4).view(4, 1), 1), TypeError, r"floating-point"),
        (lambda: knn(torch.randn(4, 2), 1, metric="manhattan"), ValueError, r"metric must be one of"),
        (lambda: knn(torch.randn(2, 4, 2), 1, batch=torch.zeros(8, dtype=torch.long)), ValueError, r"3-D x"),
        (lambda: AttentionGraph.sparse(torch.tensor([[0, 5], [1, 2]]), 4), ValueError,
         r"edge_index values must lie in \[0, num_nodes=4\), got range \[0, 5\]"),
        (lambda: AttentionGraph.sparse(torch.tensor([[-1], [1]]), 4), ValueError, r"got range \[-1, 1\]"),
        (lambda: AttentionGraph.sparse(torch.tensor([0, 1])), ValueError, r"edge_index must have shape \(2, E\), got \(2,\)"),
        (lambda: AttentionGraph.sparse(torch.tensor([[0.0], [1.0]])), TypeError, r"integer tensor .*float32"),
        (lambda: AttentionGraph.sparse(torch.tensor([[0], [2]]), batch=torch.tensor([0, 0, 1])), ValueError,
         r"connects nodes of different graphs"),
        (lambda: AttentionGraph.sparse(torch.tensor([[0], [0]]), batch=torch.tensor([0, 2]), batch_size=2), ValueError,
         r"batch values must lie in \[0, batch_size=2\), got range \[0, 2\]"),
        (lambda: AttentionGraph.sparse(torch.tensor([[0], [1]]), 3, batch=torch.tensor([0, 0])), ValueError,
         r"batch must have shape \(num_nodes,\) = \(3,\), got \(2,\)"),
        (lambda: AttentionGraph.sparse(torch.zeros(2, 0, dtype=torch.long)), ValueError, r"num_nodes is required"),
        (lambda: AttentionGraph.dense(3, key_padding_mask=torch.zeros(2, 3)), TypeError, r"bool tensor .*float32"),
        (lambda: AttentionGraph.dense(3, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)), ValueError,
         r"key_padding_mask must have shape \(B, N\) = \(B, 3\), got \(2, 4\)"),
        (lambda: AttentionGraph.dense(3, allowed=torch.ones(4, 4, dtype=torch.bool)), ValueError,
         r"allowed must have shape \(3, 3\) or \(B, 3, 3\), got \(4, 4\)"),
        (lambda: AttentionGraph.dense(3, batch_size=2, allowed=torch.ones(3, 3, 3, dtype=torch.bool)), ValueError,
         r"\(2, 3, 3\), got \(3, 3, 3\)"),
        (lambda: AttentionGraph.dense(3, causal=1), TypeError, r"causal must be a bool"),
        (lambda: AttentionGraph("dense", seq_len=3, edge_index=torch.zeros(2, 1, dtype=torch.long)), ValueError,
         r"edge_index belongs to the sparse layout"),
        (lambda: AttentionGraph("sparse", edge_index=torch.tensor([[0], [1]]), causal=True), ValueError,
         r"causal belongs to the dense layout"),
        (lambda: AttentionGraph("sparse", edge_index=torch.tensor([[0], [1]]), window=2), ValueError,
         r"window belongs to the dense layout"),
        (lambda: from_pyg(torch.zeros(3)), TypeError, r"Data or Batch, got Tensor"),
        (lambda: from_networkx({0: [1]}), TypeError, r"networkx graph, got dict"),
        (lambda: from_networkx(__import__("networkx").path_graph(3), nodelist=[0, 1]), ValueError, r"permutation"),
        (lambda: from_networkx(__import__("networkx").path_graph(3), self_loops="yes"), TypeError, r"self_loops"),
    ],
)
def test_bad_builder_input(build, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        build()


def test_attention_kwargs_rejects_mismatched_x() -> None:
    with pytest.raises(ValueError, match=r"expects x of shape \(B, N=4, D\), got \(2, 5, 8\)"):
        causal(4).attention_kwargs(torch.zeros(2, 5, 8))
    with pytest.raises(ValueError, match=r"expects x of shape \(3, N=4, D\), got \(2, 4, 8\)"):
        complete(4, 3).attention_kwargs(torch.zeros(2, 4, 8))
    with pytest.raises(ValueError, match=r"expects x of shape \(B, N=4, D\), got \(4, 8\)"):
        causal(4).attention_kwargs(torch.zeros(4, 8))
    with pytest.raises(ValueError, match=r"expects x of shape \(num_nodes=6, D\), got \(2, 3, 8\)"):
        causal(3, 2, layout="sparse").attention_kwargs(torch.zeros(2, 3, 8))
    with pytest.raises(TypeError, match=r"x must be a tensor, got list"):
        causal(3).attention_kwargs([1, 2, 3])
    with pytest.raises(ValueError, match=r"expects x of shape"):  # through the layer
        DiffusionAttention(8, 2)(torch.zeros(1, 5, 8), graph=causal(4))


def test_to_dense_needs_grouped_nodes() -> None:
    g = AttentionGraph.sparse(torch.tensor([[0], [2]]), batch=torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match=r"non-decreasing batch"):
        g.to_dense()


def test_to_networkx_bad_input() -> None:
    ei = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match=r"weights must have shape \(E,\) or \(E, H\) with E=2"):
        to_networkx(ei, torch.rand(3))
    with pytest.raises(ValueError, match=r"pass weights"):
        to_networkx(ei, top_k=1)
    with pytest.raises(ValueError, match=r"H=2 heads"):
        to_networkx(ei, torch.rand(2, 2), head=None)
    with pytest.raises(ValueError, match=r"head must lie in \[0, H=2\), got 5"):
        to_networkx(ei, torch.rand(2, 2), head=5)
    with pytest.raises(ValueError, match=r"head must be an int .* got 'median'"):
        to_networkx(ei, torch.rand(2, 2), head="median")
    with pytest.raises(ValueError, match=r"top_k must be >= 1, got 0"):
        to_networkx(ei, torch.rand(2), top_k=0)
    with pytest.raises(ValueError, match=r"\[0, num_nodes=1\)"):
        to_networkx(ei, num_nodes=1)
    with pytest.raises(TypeError, match=r"AttentionGraph, an edge_index"):
        to_networkx("edges")
    with pytest.raises(ValueError, match=r"B \* N = 8 nodes, got num_nodes=3"):
        to_networkx(ei, torch.rand(2, 1, 4, 4), num_nodes=3)
