"""Edge-case probes: edge features vs PyG's TransformerConv, graph interop, the uniform map, the CSR layout and
the sampling filters (each compared with an independent reference)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from diffusionformer.graph.interop import from_edge_index, from_networkx, from_pyg
from diffusionformer.models.sampling import top_k_filter, top_p_filter
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.edge_features import edge_feature_attention
from diffusionformer.ops.csr import EdgeLayout, csr_edge_scores, csr_edge_softmax, csr_propagate
from diffusionformer.ops.uniform_map import uniform_mean

pyg = pytest.importorskip("torch_geometric")


@pytest.mark.parametrize("self_loops", [None, True, False])
def test_bug_self_loops_bool_edge_index(self_loops: bool | None) -> None:
    """Bug: from_edge_index / from_pyg refused a bool edge_index (a mask taken for edges) with self_loops=None or
    False, but with self_loops=True PyG's add_self_loops concatenated it with int64 self loops and the bool tensor
    was silently accepted as int64 edges."""
    from torch_geometric.data import Data

    ei = torch.tensor([[0, 1, 1, 1], [1, 0, 0, 1]]).bool()
    with pytest.raises(TypeError, match=r"edge_index must be an integer tensor .*torch\.bool"):
        from_edge_index(ei, 3, self_loops=self_loops)
    with pytest.raises(TypeError, match=r"edge_index must be an integer tensor .*torch\.bool"):
        from_pyg(Data(edge_index=ei, num_nodes=3), self_loops=self_loops)


def test_self_loops_small_integer_dtypes_match_int64() -> None:
    """int8/uint8/int16 edges get the same self-loop surgery as int64 (no wrap-around of the loop indices)."""
    ei = torch.tensor([[0, 1, 1, 1], [1, 0, 0, 1]])
    want = from_edge_index(ei, 300, self_loops=True).edge_index
    for dt in (torch.int32, torch.int16, torch.uint8):
        assert torch.equal(from_edge_index(ei.to(dt), 300, self_loops=True).edge_index, want)
    assert int((want[0] == want[1]).sum()) == 300 and want.shape[1] == 303


def test_interop_isolated_nodes_duplicates_and_networkx_roundtrip() -> None:
    nx = pytest.importorskip("networkx")
    from torch_geometric.data import Batch, Data

    g = from_pyg(Data(edge_index=torch.tensor([[0, 1, 1, 1], [1, 0, 0, 1]]), num_nodes=4), self_loops=True)
    assert g.edge_index.tolist() == [[0, 1, 1, 0, 1, 2, 3], [1, 0, 0, 0, 1, 2, 3]]  # duplicates kept, one loop each
    b = Batch.from_data_list([Data(edge_index=torch.tensor([[0], [1]]), num_nodes=2),
                              Data(edge_index=torch.zeros(2, 0, dtype=torch.long), num_nodes=3)])
    gb = from_pyg(b, self_loops=True)
    assert gb.batch.tolist() == [0, 0, 1, 1, 1] and gb.edge_index.shape[1] == 6
    G = nx.MultiGraph([(0, 1), (0, 1), (1, 1)])
    G.add_node(5)
    assert from_networkx(G).edge_index.tolist() == [[0, 1, 1], [1, 0, 1]]
    assert from_networkx(G, self_loops=False).edge_index.tolist() == [[0, 1], [1, 0]]
    assert from_networkx(nx.empty_graph(3)).edge_index.shape == (2, 0)
    from diffusionformer.graph.export import to_networkx

    D = nx.DiGraph([(0, 1), (1, 2), (2, 2)])
    assert sorted(to_networkx(from_networkx(D)).edges()) == sorted(D.edges())


def test_edge_features_match_transformer_conv_weights_float64() -> None:
    """P of edge_feature_attention is TransformerConv's alpha (edge_dim, float64); the output is the conv's message
    sum without the edge term, through the layer's out_proj."""
    from torch_geometric.nn import TransformerConv

    torch.manual_seed(0)
    N, D, H = 6, 8, 2
    ei = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 1, 0], [1, 2, 3, 4, 5, 0, 0, 0, 0]])
    layer = DiffusionAttention(D, H, "attention", bias=False).double()
    conv = TransformerConv(D, D // H, heads=H, edge_dim=3, root_weight=False, bias=False).double()
    x = torch.randn(N, D, dtype=torch.float64)
    ea = torch.randn(ei.shape[1], 3, dtype=torch.float64)
    Wq, Wk, Wv = layer.qkv.weight.detach().split(D, 0)
    with torch.no_grad():
        conv.lin_query.weight.copy_(Wq)
        conv.lin_key.weight.copy_(Wk)
        conv.lin_value.weight.copy_(Wv)
        _, (ei2, alpha) = conv(x, ei, ea, return_attention_weights=True)
        y, P = edge_feature_attention(layer, x, ei, conv.lin_edge(ea), return_weights=True)
    assert torch.equal(ei2, ei)
    torch.testing.assert_close(P, alpha, rtol=0, atol=1e-12)
    v = (x @ Wv.T).view(N, H, D // H)
    msg = torch.zeros_like(v).index_add(0, ei[1], alpha[..., None] * v[ei[0]])
    torch.testing.assert_close(y, layer.out_proj(msg.reshape(N, D)).detach(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("heads", ["heat", "ppr", "laplacian", "attention:1,polynomial:1"])
def test_edge_features_zero_keys_equal_layer(heads: str) -> None:
    torch.manual_seed(1)
    ei = torch.tensor([[0, 1, 2, 3, 1, 1], [1, 2, 3, 0, 0, 0]])
    layer = DiffusionAttention(8, 2, heads, num_kv_heads=1).double()
    x = torch.randn(5, 8, dtype=torch.float64)  # node 4 is isolated
    y = edge_feature_attention(layer, x, ei.int(), torch.zeros(ei.shape[1], 8, dtype=torch.float64))
    torch.testing.assert_close(y, layer(x, edge_index=ei), rtol=0, atol=1e-12)


def _uniform_reference(x: torch.Tensor, km: torch.Tensor | None, causal: bool) -> torch.Tensor:
    B, G, M, C = x.shape
    out = torch.zeros(B, G, M, C, dtype=torch.float64)
    kmb = torch.ones(B, G, 1, M, dtype=torch.bool) if km is None else km.expand(B, G, 1, M)
    for b, g, i in itertools.product(range(B), range(G), range(M)):
        js = [j for j in range(M) if kmb[b, g, 0, j] and (not causal or j <= i)]
        if js:
            out[b, g, i] = x[b, g, js].double().mean(0)
    return out


def test_uniform_mean_matches_explicit_means() -> None:
    gen = torch.Generator().manual_seed(0)
    B, G, M, C = 2, 3, 5, 4
    x = torch.randn(B, G, M, C, dtype=torch.float64, generator=gen)
    masks = [None, torch.rand(B, G, 1, M, generator=gen) > 0.5, torch.rand(1, G, 1, M, generator=gen) > 0.5,
             torch.rand(B, 1, 1, M, generator=gen) > 0.5, torch.zeros(1, 1, 1, M, dtype=torch.bool)]
    for km, causal in itertools.product(masks, (False, True)):
        torch.testing.assert_close(uniform_mean(x, km, is_causal=causal), _uniform_reference(x, km, causal),
                                   rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("N,E", [(1, 0), (5, 0), (1, 5), (3, 30), (7, 40)])
def test_csr_layout_and_kernels_match_references(dtype: torch.dtype, N: int, E: int) -> None:
    """Unsorted input with duplicates (also beyond N * N entries) and empty rows, int32 and int64 indices."""
    gen = torch.Generator().manual_seed(N * 100 + E)
    ei = torch.randint(0, N, (2, E), generator=gen).to(dtype)
    L = EdgeLayout(ei, N)
    s, d = ei[0].long().numpy(), ei[1].long().numpy()
    order = np.lexsort((s, d))
    assert L.dst.tolist() == d[order].tolist() and L.src.tolist() == s[order].tolist()
    assert L.crow.tolist() == [0] + np.cumsum(np.bincount(d, minlength=N)).tolist()
    H, C = 2, 3
    q, k, x = (torch.randn(H, N, C, dtype=torch.float64, generator=gen) for _ in range(3))
    scores = csr_edge_scores(q, k, L, 0.5)
    dst, src = L.dst.long(), L.src.long()
    torch.testing.assert_close(scores, 0.5 * (q[:, dst] * k[:, src]).sum(-1))
    alpha = csr_edge_softmax(scores, L)
    ref = torch.zeros_like(scores)
    for i in range(N):
        m = dst == i
        if m.any():
            ref[:, m] = torch.softmax(scores[:, m], -1)
    torch.testing.assert_close(alpha, ref)
    y = csr_propagate(alpha, x, L)
    torch.testing.assert_close(y, torch.zeros_like(x).index_add(1, dst, alpha[..., None] * x[:, src]))


def _top_p_reference(row: torch.Tensor, p: float) -> set[int]:
    pr = torch.softmax(row.double(), -1).tolist()
    keep, mass = set(), 0.0
    for r, i in enumerate(sorted(range(len(pr)), key=lambda i: -pr[i])):
        if (r == 0 or mass < p or p >= 1.0) and row[i] > float("-inf"):
            keep.add(i)
        mass += pr[i]
    return keep


def test_sampling_filters_match_explicit_sets() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        V = int(rng.integers(1, 12))
        row = torch.from_numpy(rng.standard_normal(V) * rng.choice([0.1, 1.0, 10.0])).float()
        row[torch.from_numpy(rng.random(V) < 0.3)] = float("-inf")
        row[0] = 0.0 if torch.isinf(row).all() else row[0]
        p = float(rng.choice([1e-9, 0.1, 0.5, 0.9, 0.999, 1.0]))
        assert set(top_p_filter(row[None], p)[0].isfinite().nonzero().flatten().tolist()) == _top_p_reference(row, p)
        k = int(rng.integers(1, 15))  # also beyond V (clipped); ties with the k-th are kept
        kth = sorted(row.tolist(), reverse=True)[min(k, V) - 1]
        want = {i for i in range(V) if row[i] >= kth and row[i] > float("-inf")}
        assert set(top_k_filter(row[None], k)[0].isfinite().nonzero().flatten().tolist()) == want
