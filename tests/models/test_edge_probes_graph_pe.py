"""Edge probes of the graph transformer's positional encodings (``positional_encoding_transform``): the random-walk
PE of weighted graphs against float64 ``diag((D^-1 A)^s)`` at both sizes (dense and PyG's sparse path), and the
Laplacian PE of weighted graphs against ``numpy.linalg.eigh``."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch_geometric.data import Data

from diffusionformer.models import GraphTransformerConfig, positional_encoding_transform


def _walk_reference(edge_index: torch.Tensor, weight: torch.Tensor, N: int, steps: int) -> np.ndarray:
    """``diag((D^-1 A)^s)`` for ``s = 1..steps`` in float64, ``A`` the summed edge weights (a row of no weight: 0)."""
    A = np.zeros((N, N))
    np.add.at(A, (edge_index[0].numpy(), edge_index[1].numpy()), weight.double().numpy())
    d = A.sum(1, keepdims=True)
    P = np.divide(A, d, out=np.zeros_like(A), where=d != 0)
    return np.stack([np.diag(np.linalg.matrix_power(P, s)) for s in range(1, steps + 1)], axis=1)


def test_bug_random_walk_pe_uses_the_edge_weights() -> None:
    """Bug: the random-walk PE gave every edge the probability 1 / max(1, sum of its source's weights) (PyG's
    AddRandomWalkPE), the edge's own weight ignored: on the path 0 -2- 1 -3- 2 node 1 got a 2-step "return
    probability" of 0.167 (not 1), and with weights 0.5 one of 2.0. Now a step along an edge of weight w has
    probability w / (sum of the source's weights), D^-1 A, on graphs of every size (dense and sparse path); an
    unweighted graph, an integer weight, a repeated edge and a row of zero weight are handled as before."""
    pe_of = positional_encoding_transform(GraphTransformerConfig(pe="random_walk", pe_dim=3))
    ei = torch.tensor([[0, 1, 1, 2, 2, 3, 3, 4], [1, 0, 2, 1, 3, 2, 3, 4]])  # self loop on 3; 4 only a loop
    for w in (torch.tensor([2.0, 2.0, 3.0, 3.0, 0.5, 0.5, 1.5, 0.25]), torch.full((8,), 0.5),
              torch.tensor([1, 2, 3, 4, 5, 6, 7, 8]), torch.ones(8)):
        pe = pe_of(Data(edge_index=ei, edge_weight=w, num_nodes=6)).pe
        ref = _walk_reference(ei, w, 6, 3)
        np.testing.assert_allclose(pe.double().numpy(), ref, rtol=0, atol=1e-6)
        assert pe.shape == (6, 3) and torch.isfinite(pe).all() and (pe <= 1 + 1e-6).all()
        with warnings.catch_warnings():  # torch's sparse CSR beta warning
            warnings.simplefilter("ignore")
            large = pe_of(Data(edge_index=ei, edge_weight=w, num_nodes=2001)).pe
        np.testing.assert_allclose(large[:6].double().numpy(), ref, rtol=0, atol=1e-6)
        assert torch.equal(large[6:], torch.zeros(1995, 3, dtype=large.dtype))
    zero = pe_of(Data(edge_index=ei, edge_weight=torch.zeros(8), num_nodes=6)).pe  # no weight anywhere: no walk
    assert torch.equal(zero, torch.zeros(6, 3))
    w64 = torch.rand(8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    pe64 = pe_of(Data(edge_index=ei, edge_weight=w64, num_nodes=6)).pe
    assert pe64.dtype == torch.float64
    np.testing.assert_allclose(pe64.numpy(), _walk_reference(ei, w64, 6, 3), rtol=0, atol=1e-12)


def test_laplacian_pe_of_a_weighted_graph_is_the_eigh_reference() -> None:
    """The Laplacian PE of a weighted undirected graph (dense path, N < 100, and ARPACK's, N >= 100) holds, up to
    sign, the eigenvectors of the k smallest non-trivial eigenvalues of I - D^-1/2 W D^-1/2 (numpy eigh, float64)."""
    rng = np.random.default_rng(0)
    for N in (12, 120):
        W = np.triu((rng.random((N, N)) < 0.2) * rng.random((N, N)), 1)
        W[np.arange(N - 1), np.arange(1, N)] = 0.5 + rng.random(N - 1)  # connected: one trivial eigenvector
        W = W + W.T
        r, c = np.nonzero(W)
        data = Data(edge_index=torch.tensor(np.stack([r, c])), edge_weight=torch.tensor(W[r, c]), num_nodes=N)
        pe = positional_encoding_transform(GraphTransformerConfig(pe="laplacian", pe_dim=3))(data).pe.numpy()
        d = W.sum(1)
        _, V = np.linalg.eigh(np.eye(N) - W / np.sqrt(d)[:, None] / np.sqrt(d)[None, :])
        for i in range(3):
            assert min(np.abs(pe[:, i] - V[:, i + 1]).max(), np.abs(pe[:, i] + V[:, i + 1]).max()) < 1e-8
