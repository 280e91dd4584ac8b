"""Graph transformer: edge features in the scores, positional encodings, neighbour mini-batches."""

from __future__ import annotations

import math

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.nn import TransformerConv
from torch_geometric.utils import to_undirected

from diffusionformer.data.neighbors import TorchNeighborSampler, has_compiled_sampler, neighbor_loader
from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig, positional_encoding_transform
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.edge_features import edge_feature_attention
from torch_geometric.sampler import NodeSamplerInput


def _graph(N=12, E=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N, (2, E), generator=g)
    ei = ei[:, ei[0] != ei[1]]
    ei = torch.unique(ei, dim=1)
    return ei


def _layer_from_conv(conv: TransformerConv, heads: str | None = None) -> DiffusionAttention:
    H, C = conv.heads, conv.out_channels
    layer = DiffusionAttention(H * C, H, heads).double()
    with torch.no_grad():
        layer.qkv.weight.copy_(torch.cat([conv.lin_query.weight, conv.lin_key.weight, conv.lin_value.weight]))
        layer.qkv.bias.copy_(torch.cat([conv.lin_query.bias, conv.lin_key.bias, conv.lin_value.bias]))
        layer.out_proj.weight.copy_(torch.eye(H * C))
        layer.out_proj.bias.zero_()
    return layer


def test_edge_feature_scores_match_transformer_conv():
    torch.manual_seed(0)
    H, C, Fe, N = 2, 4, 3, 12
    conv = TransformerConv(H * C, C, heads=H, root_weight=False, edge_dim=Fe).double()
    layer = _layer_from_conv(conv)
    ei = _graph(N)
    x = torch.randn(N, H * C, dtype=torch.float64)
    e = torch.randn(ei.shape[1], Fe, dtype=torch.float64)
    edge_keys = conv.lin_edge(e)
    y, P = edge_feature_attention(layer, x, ei, edge_keys, return_weights=True)
    ref, (ei_ref, alpha) = conv(x, ei, e, return_attention_weights=True)
    assert torch.equal(ei_ref, ei)
    torch.testing.assert_close(P, alpha, rtol=0, atol=1e-12)  # the same scores q_i . (k_j + W_e e_ij) / sqrt(C)
    # TransformerConv also adds W_e e_ij to the message; take that term out to compare outputs
    msg = (alpha[:, :, None] * edge_keys.view(-1, H, C)).reshape(-1, H * C)
    edge_term = torch.zeros(N, H * C, dtype=torch.float64).index_add_(0, ei[1], msg)
    torch.testing.assert_close(y, ref - edge_term, rtol=0, atol=1e-12)


@pytest.mark.parametrize("heads", ["heat(steps=3):2", "ppr(alpha=0.2, steps=4):1,laplacian:1"])
def test_edge_features_with_multi_step_operators_against_a_dense_reference(heads):
    torch.manual_seed(1)
    H, C, N = 2, 4, 10
    layer = DiffusionAttention(H * C, H, heads).double()
    ei = _graph(N, 35, seed=3)
    x = torch.randn(N, H * C, dtype=torch.float64)
    edge_keys = torch.randn(ei.shape[1], H * C, dtype=torch.float64)
    y = edge_feature_attention(layer, x, ei, edge_keys)
    W = layer.qkv.weight
    q = (x @ W[: H * C].T + layer.qkv.bias[: H * C]).view(N, H, C)
    k = (x @ W[H * C : 2 * H * C].T + layer.qkv.bias[H * C : 2 * H * C]).view(N, H, C)
    v = (x @ W[2 * H * C :].T + layer.qkv.bias[2 * H * C :]).view(N, H, C)
    coeffs = layer.coefficients()
    out = torch.zeros(N, H, C, dtype=torch.float64)
    for h in range(H):
        S = torch.full((N, N), float("-inf"), dtype=torch.float64)
        for e, (j, i) in enumerate(ei.t().tolist()):
            S[i, j] = q[i, h] @ (k[j, h] + edge_keys[e].view(H, C)[h]) / math.sqrt(C)
        P = torch.softmax(S, dim=1).nan_to_num(0.0)  # nodes without in-edges: zero rows
        fP = sum(coeffs[h, j] * torch.linalg.matrix_power(P, j) for j in range(coeffs.shape[1]))
        out[:, h] = fP @ v[:, h]
    torch.testing.assert_close(y, layer.out_proj(out.reshape(N, H * C)), rtol=0, atol=1e-12)


def test_graph_transformer_with_edge_features_and_pe():
    torch.manual_seed(0)
    cfg = GraphTransformerConfig(in_channels=5, num_classes=3, dim=16, num_heads=4, edge_dim=2, pe="laplacian",
                                 pe_dim=3, heads="heat(steps=2):2,attention:2")
    model = DiffusionGraphTransformer(cfg).double()
    ei = to_undirected(_graph(12, 30))
    data = positional_encoding_transform(cfg)(Data(x=torch.randn(12, 5, dtype=torch.float64), edge_index=ei,
                                                   num_nodes=12))
    e = torch.randn(ei.shape[1], 2, dtype=torch.float64)
    model.eval()
    out = model(data.x, ei, edge_attr=e, pe=data.pe)
    assert out.shape == (12, 3)
    assert not torch.allclose(out, model(data.x, ei, edge_attr=torch.zeros_like(e), pe=data.pe))  # edges count
    # in training each eigenvector's sign is flipped at random (dropout is 0 here)
    torch.manual_seed(7)
    sign = torch.randint(0, 2, (1, 3)) * 2 - 1
    torch.manual_seed(7)
    trained = model.train()(data.x, ei, edge_attr=e, pe=data.pe)
    torch.testing.assert_close(trained, model.eval()(data.x, ei, edge_attr=e, pe=data.pe * sign), rtol=0, atol=0)
    with pytest.raises(ValueError, match="edge_attr: expected"):
        model(data.x, ei, pe=data.pe)
    with pytest.raises(ValueError, match=r"pe: expected shape \(N, pe_dim\) = \(12, 3\)"):
        model(data.x, ei, edge_attr=e)


@pytest.mark.parametrize("rival", ["neutreno", "differential", "attnscale", "grand-nl"])
def test_edge_features_refuse_operators_that_are_not_a_polynomial_in_one_p(rival):
    # their heads would silently be zero in the edge-aware polynomial loop
    layer = DiffusionAttention(8, 2, f"{rival}:1,attention:1")
    ei = _graph(5, 8)
    with pytest.raises(ValueError, match=f"operator {rival!r} is not a polynomial in one P"):
        edge_feature_attention(layer, torch.randn(5, 8), ei, torch.zeros(ei.shape[1], 8))
    # without edge features the graph transformer runs them through the layer (and its LayerState)
    cfg = GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, num_heads=2, heads=f"{rival}:1,attention:1")
    assert DiffusionGraphTransformer(cfg)(torch.randn(5, 3), ei).shape == (5, 2)


def test_positional_encodings_are_the_references():
    ei = to_undirected(_graph(10, 30, seed=5))
    N = 10
    A = torch.zeros(N, N, dtype=torch.float64)
    A[ei[1], ei[0]] = 1.0
    deg = A.sum(1)
    assert (deg > 0).all()
    lap = positional_encoding_transform(GraphTransformerConfig(pe="laplacian", pe_dim=3))(Data(edge_index=ei, num_nodes=N)).pe
    L = torch.eye(N, dtype=torch.float64) - A / deg.sqrt()[:, None] / deg.sqrt()[None, :]
    evals = torch.linalg.eigvalsh(L)
    for col in lap.double().t():  # each column is a unit eigenvector of the normalised Laplacian
        lam = col @ L @ col
        torch.testing.assert_close(L @ col, lam * col, rtol=0, atol=1e-4)
        assert lam > evals[0] + 1e-6  # not the trivial one
    rw = positional_encoding_transform(GraphTransformerConfig(pe="random_walk", pe_dim=4))(Data(edge_index=ei, num_nodes=N)).pe
    T = A / deg[:, None]  # row-stochastic random walk
    ref = torch.stack([torch.linalg.matrix_power(T, s).diagonal() for s in range(1, 5)], dim=1)
    torch.testing.assert_close(rw.double(), ref, rtol=0, atol=1e-6)


def test_torch_neighbor_sampler_samples_real_edges_and_the_right_counts():
    N = 60
    ei = _graph(N, 400, seed=2)
    data = Data(edge_index=ei, num_nodes=N)
    sampler = TorchNeighborSampler(data, [3, 2], generator=torch.Generator().manual_seed(0))
    seeds = torch.tensor([5, 17, 33])
    out = sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=seeds))
    assert torch.equal(out.node[:3], seeds) and out.node.unique().numel() == out.node.numel()
    glob = torch.stack([out.node[out.row], out.node[out.col]])
    assert torch.equal(glob, ei[:, out.edge])  # every sampled edge is the edge it names
    in_deg = torch.bincount(ei[1], minlength=N)
    hop0 = out.col[: out.num_sampled_edges[0]]
    for s in range(3):
        assert int((hop0 == s).sum()) == min(3, int(in_deg[seeds[s]]))
    start = 3
    hop1_targets = out.col[out.num_sampled_edges[0] :]
    for local in range(start, start + out.num_sampled_nodes[1]):
        assert int((hop1_targets == local).sum()) == min(2, int(in_deg[out.node[local]]))
    # the sample is uniform: each incoming edge of a node of in-degree d is kept with probability k/d
    hub = int(in_deg.argmax())
    counts = torch.zeros(ei.shape[1])
    s1 = TorchNeighborSampler(data, [2], generator=torch.Generator().manual_seed(1))
    for _ in range(600):
        counts[s1.sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.tensor([hub]))).edge] += 1
    mine = counts[ei[1] == hub] / 600
    assert (mine - 2 / int(in_deg[hub])).abs().max() < 0.1


def test_full_neighbourhood_batches_reproduce_full_batch_outputs():
    torch.manual_seed(0)
    N = 80
    ei = to_undirected(_graph(N, 200, seed=4))
    x = torch.randn(N, 6, dtype=torch.float64)
    data = Data(x=x, edge_index=ei, edge_attr=torch.randn(ei.shape[1], 2, dtype=torch.float64), num_nodes=N)
    cfg = GraphTransformerConfig(in_channels=6, num_classes=2, dim=8, num_heads=2, depth=2, edge_dim=2,
                                 heads="heat(steps=2):1,attention:1")
    model = DiffusionGraphTransformer(cfg).double().eval()
    full = model(x, ei, edge_attr=data.edge_attr)
    # 2 layers of up to 2 propagation steps each: a seed's output depends on its 4-hop neighbourhood
    two_hops = next(iter(neighbor_loader(data, [-1, -1], batch_size=16, force_torch=True)))
    out = model(two_hops.x, two_hops.edge_index, edge_attr=two_hops.edge_attr)[:16]
    assert not torch.allclose(out, full[two_hops.n_id[:16]], rtol=0, atol=1e-12)
    loader = neighbor_loader(data, [-1] * 4, batch_size=16, force_torch=True)
    seen = []
    for batch in loader:
        out = model(batch.x, batch.edge_index, edge_attr=batch.edge_attr)[: batch.batch_size]
        torch.testing.assert_close(out, full[batch.n_id[: batch.batch_size]], rtol=0, atol=1e-12)
        seen.append(batch.n_id[: batch.batch_size])
    assert torch.equal(torch.cat(seen).sort().values, torch.arange(N))
    # sampled neighbourhoods (a few neighbours) change the outputs: attention stays inside the sample
    small = next(iter(neighbor_loader(data, [1, 1], batch_size=16, force_torch=True)))
    assert not torch.allclose(model(small.x, small.edge_index, edge_attr=small.edge_attr)[:16], full[small.n_id[:16]])


def test_neighbor_loader_without_compiled_samplers():
    if has_compiled_sampler():
        pytest.skip("pyg-lib or torch-sparse is installed: PyG's own sampler is used")
    from torch_geometric.loader import NeighborLoader

    data = Data(x=torch.randn(20, 2), edge_index=_graph(20, 60), num_nodes=20)
    with pytest.raises(ImportError, match="requires either 'pyg-lib' or 'torch-sparse'"):
        next(iter(NeighborLoader(data, [2], batch_size=4)))  # PyG 2.8 has no fallback
    batch = next(iter(neighbor_loader(data, [2], batch_size=4)))  # ours does
    assert batch.batch_size == 4 and torch.equal(batch.n_id[:4], torch.arange(4))


def test_layer_recorder_recomputes_the_edge_aware_attention():
    from diffusionformer.analysis.capture import LayerRecorder

    torch.manual_seed(0)
    cfg = GraphTransformerConfig(in_channels=4, num_classes=2, dim=8, num_heads=2, depth=2, edge_dim=3)
    model = DiffusionGraphTransformer(cfg).double().eval()
    ei = _graph(10, 30)
    x = torch.randn(10, 4, dtype=torch.float64)
    e = torch.randn(ei.shape[1], 3, dtype=torch.float64)
    with LayerRecorder(model, attentions=True) as rec:
        model(x, ei, edge_attr=e)
    edges, attrs = model._prepare_edges(ei, 10, e)
    h = model.embed(x)
    block = model.blocks[0]
    _, P = edge_feature_attention(block.attn, block.norm1(h), edges, block.edge_proj(attrs), return_weights=True)
    torch.testing.assert_close(rec.attentions[0].attn_weights, P, rtol=0, atol=1e-12)
    assert torch.equal(rec.attentions[0].edge_index, edges)
