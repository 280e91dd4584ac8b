"""Shared fixtures of the graph tests: a float64 layer and a dense-versus-sparse comparison."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from torch import Tensor
from torch_geometric.utils import to_dense_batch

from diffusionformer import DiffusionAttention
from diffusionformer.graph import AttentionGraph

#: one layer that needs several powers of P (matrix back-end) and one fused SDPA layer
HEAD_SPECS = ("attention:2,laplacian:1,heat(t=0.5, steps=3):1", "attention:2,laplacian:2")
DIM = 16


@pytest.fixture(params=HEAD_SPECS, ids=["heat", "fused"])
def layer(request: pytest.FixtureRequest) -> DiffusionAttention:
    torch.manual_seed(0)
    return DiffusionAttention(DIM, 4, heads=request.param).double().eval()


def node_features(num_nodes: int, seed: int = 0) -> Tensor:
    return torch.randn(num_nodes, DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


CompareFn = Callable[..., Tensor]


@pytest.fixture
def compare_layouts(layer: DiffusionAttention) -> CompareFn:
    """``compare(dense_graph, sparse_graph, real=None)``: the layer's outputs on both layouts agree.

    Node features ``x`` ``(num_nodes, D)`` feed the sparse graph; the dense input is
    ``to_dense_batch(x, sparse_graph.batch)``. Outputs are compared at the nodes marked
    ``real`` (default all) in float64 with atol 1e-10. Returns the sparse output and checks
    that it differs from full attention when the graph is not complete (so the comparison
    can fail).
    """

    def compare(dense: AttentionGraph, sparse: AttentionGraph, real: Tensor | None = None, *,
                complete: bool = False) -> Tensor:
        assert dense.is_dense and sparse.is_sparse
        n = sparse.num_nodes
        x = node_features(n)
        batch = sparse.batch if sparse.batch is not None else torch.zeros(n, dtype=torch.long)
        x_dense, slot = to_dense_batch(x, batch)  # (B, N_max, D), (B, N_max)
        out_sparse = layer(x, graph=sparse)
        out_dense = layer(x_dense, graph=dense)[slot]  # back to node order
        real = torch.ones(n, dtype=torch.bool) if real is None else real
        assert real.any()
        torch.testing.assert_close(out_dense[real], out_sparse[real], atol=1e-10, rtol=0)
        full = layer(x_dense)[slot]  # full attention within each sequence (no padding)
        differs = not torch.allclose(full[real], out_sparse[real], atol=1e-8)
        assert differs != complete, "the graph should (not) change the output relative to full attention"
        return out_sparse

    return compare
