"""A PyG user's walk through graph classification (59d): the findings, each failing before its fix."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torch_geometric")
pytest.importorskip("scipy")

from torch_geometric.data import Data  # noqa: E402
from torch_geometric.utils import get_laplacian, to_dense_adj, to_undirected  # noqa: E402

from diffusionformer.models import GraphTransformerConfig, positional_encoding_transform  # noqa: E402


def _paths(sizes: list[int]) -> tuple[torch.Tensor, int]:
    """Disjoint undirected paths of ``sizes`` nodes: one component each."""
    edges, offset = [], 0
    for n in sizes:
        src = torch.arange(n - 1)
        edges.append(torch.stack([src, src + 1]) + offset)
        offset += n
    return to_undirected(torch.cat(edges, 1), num_nodes=offset), offset


def _rayleigh_and_spectrum(edge_index: torch.Tensor, num_nodes: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = GraphTransformerConfig(in_channels=1, pe="laplacian", pe_dim=k)
    pe = positional_encoding_transform(cfg)(Data(edge_index=edge_index, num_nodes=num_nodes)).pe.double()
    ei, w = get_laplacian(edge_index, normalization="sym", num_nodes=num_nodes)
    L = to_dense_adj(ei, edge_attr=w, max_num_nodes=num_nodes)[0].double()  # (N, N)
    rayleigh = torch.stack([pe[:, c] @ L @ pe[:, c] for c in range(k)])  # (k,)
    return rayleigh, torch.linalg.eigvalsh(L)[1 : k + 1]  # the k smallest but the first, with multiplicity


@pytest.mark.parametrize("sizes", [[60, 50], [50, 30, 20, 10], [20, 25, 30, 35, 40]])
def test_laplacian_pe_of_a_disconnected_graph_of_100_nodes_or_more_holds_the_k_smallest_eigenvectors(sizes):
    # PROTEINS and NCI1 hold such graphs: PyG's ARPACK (from 100 nodes on) missed eigenvectors of the eigenvalue 0,
    # one per component, so the columns held larger eigenvalues' eigenvectors, and shifted with the node order
    edge_index, n = _paths(sizes)
    rayleigh, smallest = _rayleigh_and_spectrum(edge_index, n, k=4)
    torch.testing.assert_close(rayleigh, smallest, atol=1e-5, rtol=0)
