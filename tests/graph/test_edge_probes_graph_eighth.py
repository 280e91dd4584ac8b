"""Edge probes (eighth pass) of edge features, graph positional encodings, ``to_networkx`` and the spectral helpers:
``edge_feature_attention`` against PyG's ``TransformerConv`` (float64, copied weights), the PEs of weighted graphs
with bad or integer weights, ``to_networkx`` of multigraphs with self loops, and ``eigenvalues_of`` against numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.nn import TransformerConv

from diffusionformer import DiffusionAttention
from diffusionformer.analysis.spectral import eigenvalues_of, frequency_response
from diffusionformer.graph import to_networkx
from diffusionformer.models import GraphTransformerConfig, positional_encoding_transform
from diffusionformer.nn.edge_features import edge_feature_attention

# a triangle 0-1-2 and a path 3-4, node 5 isolated: an undirected graph of two components and a lone node
_EI = torch.tensor([[0, 1, 1, 2, 2, 0, 3, 4], [1, 0, 2, 1, 0, 2, 4, 3]])


def _pe(kind: str, k: int, weight: torch.Tensor | None, N: int = 6) -> torch.Tensor:
    cfg = GraphTransformerConfig(pe=kind, pe_dim=k)
    return positional_encoding_transform(cfg)(Data(edge_index=_EI, edge_weight=weight, num_nodes=N)).pe


@pytest.mark.parametrize("kind", ["laplacian", "random_walk"])
@pytest.mark.parametrize("bad, match", [
    (torch.tensor([1.0, 1.0, float("nan"), float("nan"), 1.0, 1.0, 1.0, 1.0]), "NaN or inf"),
    (torch.tensor([1.0, 1.0, float("inf"), float("inf"), 1.0, 1.0, 1.0, 1.0]), "NaN or inf"),
    (torch.tensor([1.0, 1.0, -3.0, -3.0, 1.0, 1.0, 1.0, 1.0]), "non-negative"),
    (torch.ones(8, 1), r"shape \(E,\) = \(8,\)"),
])
def test_bug_positional_encodings_refuse_bad_edge_weights(kind: str, bad: torch.Tensor, match: str) -> None:
    """Bug: the PEs took any edge_weight. A NaN weight made the Laplacian PE claim the (undirected) graph was
    directed (NaN != NaN in is_undirected), a negative one failed in LAPACK ("Eigenvalues did not converge"), an inf
    one gave NaN eigenvectors; the random-walk PE returned NaN or negative "return probabilities" without a word, and
    an (E, 1) weight was a broadcast error inside index_put_. Now a ValueError names edge_weight (both PEs, both the
    small-graph and the PyG path)."""
    for k in (2, 8):  # N > k + 1 (PyG's own path) and N <= k + 1 (the zero-padded path)
        with pytest.raises(ValueError, match=f"edge_weight.*{match}|edge_weight must have {match}"):
            _pe(kind, k, bad)
    for ok in (None, torch.zeros(8), torch.tensor([1.0, 1.0, 2.0, 2.0, 0.5, 0.5, 3.0, 3.0])):  # still accepted
        assert torch.isfinite(_pe(kind, 2, ok)).all()


def test_bug_laplacian_pe_takes_integer_edge_weights() -> None:
    """Bug: integer (or bool) edge weights, which the random-walk PE takes, failed in the Laplacian PE with PyG's
    "result type Float can't be cast to the desired output type Long" (its D^-1/2 W D^-1/2 written back into the
    integer weights). Now they are read as the default float dtype: the PE equals that of the float weights (up to
    the arbitrary sign of each eigenvector), on both paths."""
    w = torch.tensor([1, 1, 2, 2, 3, 3, 1, 1])
    for k in (2, 8):
        for weight in (w, torch.ones(8, dtype=torch.bool)):
            pe, ref = _pe("laplacian", k, weight), _pe("laplacian", k, weight.float())
            assert pe.dtype == ref.dtype == torch.float32 and pe.shape == ref.shape == (6, k)
            for c in range(k):
                assert min((pe[:, c] - ref[:, c]).abs().max(), (pe[:, c] + ref[:, c]).abs().max()) < 1e-6


def test_laplacian_pe_of_a_graph_with_components_and_an_isolated_node_is_the_eigh_reference() -> None:
    """Each column of the Laplacian PE is an eigenvector of PyG's I - D^-1/2 A D^-1/2 (an isolated node keeps
    its 1 on the diagonal) whose eigenvalue is the next of numpy's eigh after the first (k < N - 1 and k >= N - 1,
    where the missing columns are zero); a self loop is ignored as PyG's get_laplacian ignores it."""
    A = np.zeros((6, 6))
    np.add.at(A, (_EI[0].numpy(), _EI[1].numpy()), 1.0)
    d = A.sum(1)
    s = np.where(d > 0, 1 / np.sqrt(np.where(d > 0, d, 1)), 0.0)
    L = np.eye(6) - s[:, None] * A * s[None, :]
    lam = np.linalg.eigvalsh(L)
    loops = torch.cat([_EI, torch.tensor([[5, 1], [5, 1]])], 1)
    for k in (3, 5, 9):
        for ei in (_EI, loops):
            pe = positional_encoding_transform(GraphTransformerConfig(pe="laplacian", pe_dim=k))(
                Data(edge_index=ei, num_nodes=6)).pe.double().numpy()
            assert pe.shape == (6, k)
            for c in range(min(k, 5)):
                v = pe[:, c]
                mu = v @ L @ v / (v @ v)
                np.testing.assert_allclose(L @ v, mu * v, atol=1e-5)
                assert abs(mu - lam[c + 1]) < 1e-5
            assert not pe[:, 5:].any()


def test_edge_feature_attention_is_transformer_conv_without_the_edge_term_in_the_message() -> None:
    """float64, copied weights (heads=2, concat, root_weight=False, beta=False): the weights P of
    edge_feature_attention equal TransformerConv's alpha, and its output equals out_proj of TransformerConv's output
    less sum_j alpha_ij W_e e_ij (the edge term the module docs say is not in the message), on a graph with a self
    loop, a repeated edge, a node with no incoming edge and one with only its self loop."""
    g = torch.Generator().manual_seed(0)
    D, H, ED, N = 8, 2, 3, 7
    C = D // H
    layer = DiffusionAttention(D, H).double()
    conv = TransformerConv(D, C, heads=H, concat=True, beta=False, edge_dim=ED, root_weight=False).double()
    W, b = layer.qkv.weight.detach(), layer.qkv.bias.detach()
    with torch.no_grad():
        for i, lin in enumerate((conv.lin_query, conv.lin_key, conv.lin_value)):
            lin.weight.copy_(W[i * D:(i + 1) * D])
            lin.bias.copy_(b[i * D:(i + 1) * D])
    ei = torch.tensor([[0, 1, 1, 2, 3, 4, 0, 5, 2, 2], [1, 0, 0, 3, 2, 0, 0, 5, 1, 4]])
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    ea = torch.randn(ei.shape[1], ED, generator=g, dtype=torch.float64)
    with torch.no_grad():
        ek = conv.lin_edge(ea)
        y, P = edge_feature_attention(layer, x, ei, ek, return_weights=True)
        ref, (_, alpha) = conv(x, ei, ea, return_attention_weights=True)
        edge_term = torch.zeros(N, H, C, dtype=torch.float64).index_add_(0, ei[1], alpha[:, :, None] * ek.view(-1, H, C))
        expected = layer.out_proj((ref.view(N, H, C) - edge_term).reshape(N, D))
    torch.testing.assert_close(P, alpha, rtol=0, atol=1e-12)
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-12)
    assert torch.equal(y[6], layer.out_proj.bias.detach())  # no incoming edge: no message


def test_to_networkx_of_a_weighted_multigraph_with_self_loops() -> None:
    """Edges j -> i with P_ij of the chosen head, self loops kept, a repeated edge collapsed to its last weight
    (as documented), every node kept, and the in-weights of each target sum to the layer's normalisation."""
    ei = torch.tensor([[0, 1, 2, 2, 0, 0], [1, 2, 2, 0, 0, 1]])
    w = torch.tensor([[0.3, 0.7], [1.0, 0.1], [0.2, 0.9], [0.4, 0.5], [0.6, 0.2], [0.7, 0.3]], dtype=torch.float64)
    G = to_networkx(ei, w, head=1, num_nodes=4)
    assert sorted(G.nodes) == [0, 1, 2, 3] and G.is_directed()
    assert sorted(G.edges(data="weight")) == [(0, 0, 0.2), (0, 1, 0.3), (1, 2, 0.1), (2, 0, 0.5), (2, 2, 0.9)]
    Gm = to_networkx(ei, w, head="max", num_nodes=4)
    assert Gm[0][1]["weight"] == 0.7 and Gm[2][2]["weight"] == 0.9


def test_eigenvalues_of_matches_numpy_with_complex_pairs_and_multiplicities() -> None:
    """eigenvalues_of against numpy.linalg.eigvals sorted by decreasing real part then imaginary part, on row
    stochastic maps, two 3-cycles (1, 1 and two conjugate pairs, each twice), a symmetric matrix (real, = eigh),
    and f(P) V = V f(lambda) of frequency_response at them."""
    g = torch.Generator().manual_seed(0)

    def ref(P: torch.Tensor) -> np.ndarray:
        lam = np.linalg.eigvals(P.double().numpy())
        return lam[np.lexsort((-lam.imag, -lam.real))]

    cyc = torch.zeros(6, 6)
    for i, j in [(0, 1), (1, 2), (2, 0), (3, 4), (4, 5), (5, 3)]:
        cyc[i, j] = 1.0
    for P in (torch.softmax(torch.randn(5, 5, generator=g), -1), cyc):
        np.testing.assert_allclose(eigenvalues_of(P).numpy(), ref(P), atol=1e-12)
    r = np.exp(2j * np.pi / 3)
    np.testing.assert_allclose(eigenvalues_of(cyc).numpy(), [1, 1, r, r, r.conjugate(), r.conjugate()], atol=1e-12)
    S = torch.randn(5, 5, generator=g, dtype=torch.float64)
    S = S + S.T
    lam = eigenvalues_of(S)
    assert not lam.imag.any()
    np.testing.assert_allclose(lam.real.numpy(), np.linalg.eigvalsh(S.numpy())[::-1], atol=1e-12)
    P = torch.softmax(torch.randn(4, 4, generator=g, dtype=torch.float64), -1)
    c = torch.tensor([0.5, -1.0, 0.25, 2.0], dtype=torch.float64)
    w, V = np.linalg.eig(P.numpy())
    fP = sum(float(c[k]) * np.linalg.matrix_power(P.numpy(), k) for k in range(4))
    np.testing.assert_allclose(fP @ V, V * frequency_response(c, torch.from_numpy(w)).numpy(), atol=1e-12)
