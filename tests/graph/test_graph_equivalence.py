"""Every builder: the dense and the sparse layout of one graph give the same DiffusionAttention output."""

from __future__ import annotations

import dataclasses

import networkx as nx
import pytest
import torch
from torch_geometric.data import Batch, Data

from diffusionformer.graph import (
    AttentionGraph,
    causal,
    complete,
    from_networkx,
    from_pyg,
    grid,
    knn,
    sliding_window,
)

B, N = 2, 6


def padding() -> torch.Tensor:
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[1, 4:] = True  # second sequence has 4 real tokens
    return kpm


def real_nodes(kpm: torch.Tensor | None) -> torch.Tensor | None:
    return None if kpm is None else ~kpm.reshape(-1)


@pytest.mark.parametrize("self_loops", [True, False])
@pytest.mark.parametrize("pad", [False, True])
def test_complete(compare_layouts, self_loops: bool, pad: bool) -> None:
    kpm = padding() if pad else None
    kw = dict(self_loops=self_loops, key_padding_mask=kpm)
    compare_layouts(complete(N, B, **kw), complete(N, B, layout="sparse", **kw), real_nodes(kpm),
                    complete=self_loops and not pad)


@pytest.mark.parametrize("pad", [False, True])
def test_causal(compare_layouts, pad: bool) -> None:
    kpm = padding() if pad else None
    compare_layouts(causal(N, B, key_padding_mask=kpm), causal(N, B, key_padding_mask=kpm, layout="sparse"),
                    real_nodes(kpm))


@pytest.mark.parametrize("window", [0, 1, 2, 10])
@pytest.mark.parametrize("is_causal", [False, True])
def test_sliding_window(compare_layouts, window: int, is_causal: bool) -> None:
    kpm = padding()
    kw = dict(causal=is_causal, batch_size=B, key_padding_mask=kpm)
    compare_layouts(sliding_window(N, window, **kw), sliding_window(N, window, layout="sparse", **kw), real_nodes(kpm))


@pytest.mark.parametrize("metric", ["chebyshev", "manhattan", "euclidean"])
@pytest.mark.parametrize("cls_token", [False, True])
@pytest.mark.parametrize("radius", [1, 1.5])
def test_grid(compare_layouts, metric: str, cls_token: bool, radius: float) -> None:
    kw = dict(radius=radius, metric=metric, cls_token=cls_token, batch_size=B)
    compare_layouts(grid(3, 4, **kw), grid(3, 4, layout="sparse", **kw))


def test_grid_without_self_loops(compare_layouts) -> None:
    compare_layouts(grid(2, 3, self_loops=False, batch_size=B), grid(2, 3, self_loops=False, batch_size=B,
                                                                      layout="sparse"))


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("self_loops", [False, True])
def test_knn_batched_sequences(compare_layouts, metric: str, self_loops: bool) -> None:
    feats = torch.randn(B, N, 3, generator=torch.Generator().manual_seed(1))
    kw = dict(metric=metric, self_loops=self_loops)
    compare_layouts(knn(feats, 2, layout="dense", **kw), knn(feats, 2, **kw))


def test_knn_graphs_of_unequal_size(compare_layouts) -> None:
    feats = torch.randn(9, 3, generator=torch.Generator().manual_seed(2))
    batch = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1])
    compare_layouts(knn(feats, 3, batch=batch, layout="dense"), knn(feats, 3, batch=batch))


def two_graph_batch() -> Batch:
    a = Data(edge_index=torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3)
    b = Data(edge_index=torch.tensor([[0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 2]]), num_nodes=5)
    return Batch.from_data_list([a, b])


@pytest.mark.parametrize("self_loops", [None, True, False])
def test_from_pyg(compare_layouts, self_loops: bool | None) -> None:
    data = two_graph_batch()
    compare_layouts(from_pyg(data, self_loops=self_loops, layout="dense"), from_pyg(data, self_loops=self_loops))


@pytest.mark.parametrize("directed", [False, True])
def test_from_networkx(compare_layouts, directed: bool) -> None:
    G = nx.gnp_random_graph(7, 0.4, seed=3, directed=directed)
    compare_layouts(from_networkx(G, self_loops=True, layout="dense"), from_networkx(G, self_loops=True))


def test_conversions_of_a_general_dense_graph(compare_layouts) -> None:
    """Per-sequence allowed mask + causal + window + padding: to_sparse and back agree with the original."""
    allowed = torch.rand(B, N, N, generator=torch.Generator().manual_seed(4)) < 0.7
    g = AttentionGraph.dense(N, key_padding_mask=padding(), causal=True, window=3, allowed=allowed)
    s = g.to_sparse()
    compare_layouts(g, s, real_nodes(padding()))
    compare_layouts(s.to_dense(), s, real_nodes(padding()))
    assert torch.equal(s.to_dense().dense_allowed(), g.dense_allowed())


def test_conversion_of_a_shared_allowed_mask(compare_layouts) -> None:
    allowed = torch.rand(N, N, generator=torch.Generator().manual_seed(5)) < 0.5
    g = AttentionGraph.dense(N, batch_size=B, window=2, allowed=allowed)
    compare_layouts(g, g.to_sparse())


@pytest.mark.parametrize(
    "make",
    [
        lambda kpm: complete(N, key_padding_mask=kpm),
        lambda kpm: causal(N, key_padding_mask=kpm),
        lambda kpm: sliding_window(N, 2, key_padding_mask=kpm),
        lambda kpm: dataclasses.replace(grid(2, 3), key_padding_mask=kpm),  # explicit (N, N) allowed
    ],
    ids=["complete", "causal", "window", "grid"],
)
def test_to_sparse_of_padded_dense_graphs(compare_layouts, make) -> None:
    """Padded keys are never attended, padded queries have no in-edges, in every to_sparse path."""
    kpm = padding()
    g = make(kpm)
    s = g.to_sparse()
    compare_layouts(g, s, real_nodes(kpm))
    pad_nodes = kpm.reshape(-1).nonzero().flatten()
    assert not torch.isin(s.edge_index, pad_nodes).any()
    assert torch.equal(s.dense_allowed(), g.dense_allowed())
