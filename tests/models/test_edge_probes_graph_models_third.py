"""Edge probes of the graph models (third pass): complex inputs, and GCN/GIN against explicit float64 formulas."""

from __future__ import annotations

import warnings

import pytest
import torch

from diffusionformer.models import GCN, GIN, DiffusionGraphTransformer, GCNConfig, GINConfig, GraphTransformerConfig

EDGES = torch.tensor([[0, 1, 3], [1, 2, 4]])


def _models():
    torch.manual_seed(0)
    return [GCN(GCNConfig(in_channels=3, num_classes=2, task="graph")).eval(),
            GIN(GINConfig(in_channels=3, num_classes=2, num_layers=2)).eval(),
            DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, dim=8, num_heads=2, task="graph")).eval()]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_bug_graph_models_refuse_complex_node_features(index):
    """Bug: a complex ``x`` was cast to the model's float dtype, its imaginary part dropped with only a
    ``ComplexWarning``, and the logits of the real part came back as if nothing were wrong."""
    model = _models()[index]
    x = torch.randn(5, 3, dtype=torch.complex64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the old path warned, then went on
        with pytest.raises(TypeError, match=r"x must hold real values, got dtype torch.complex64"):
            model(x, EDGES)
    assert model(x.real, EDGES).shape == (1, 2)  # the real part still runs


def test_bug_graph_transformer_refuses_complex_edge_attr_and_pe():
    """Bug: complex ``edge_attr`` or ``pe`` lost their imaginary parts in the cast to the model's dtype (a
    ``ComplexWarning`` only) and the forward went on with the real parts."""
    torch.manual_seed(0)
    x = torch.randn(5, 3)
    edge = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, dim=8, num_heads=2, edge_dim=2)).eval()
    with pytest.raises(TypeError, match=r"edge_attr must hold real values, got dtype torch.complex64"):
        edge(x, EDGES, edge_attr=torch.randn(3, 2, dtype=torch.complex64))
    assert edge(x, EDGES, edge_attr=torch.randn(3, 2)).shape == (5, 2)
    pe = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, dim=8, num_heads=2, pe="random_walk",
                                                          pe_dim=3)).eval()
    with pytest.raises(TypeError, match=r"pe must hold real values, got dtype torch.complex128"):
        pe(x, EDGES, pe=torch.randn(5, 3, dtype=torch.complex128))
    assert pe(x, EDGES, pe=torch.randn(5, 3)).shape == (5, 2)


@pytest.mark.parametrize("index", [0, 1])
def test_bug_gcn_gin_refuse_a_complex_sparse_adjacency(index):
    """Bug: a sparse adjacency with complex values (edge weights) was cast to the model's dtype, dropping the
    imaginary parts of the weights with only a ``ComplexWarning``."""
    model = _models()[index]
    adj = torch.sparse_coo_tensor(EDGES.flip(0), torch.tensor([1 + 1j, 2 - 1j, 1j]), (5, 5))
    with pytest.raises(TypeError, match=r"edge_index must hold real values, got dtype torch.complex64"):
        model(torch.randn(5, 3), adj)
    assert model(torch.randn(5, 3), torch.sparse_coo_tensor(EDGES.flip(0), torch.ones(3), (5, 5))).shape == (1, 2)


def _adjacency(edge_index, n):
    a = torch.zeros(n, n, dtype=torch.float64)
    for s, t in edge_index.t().tolist():
        a[t, s] += 1
    return a


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_gcn_gin_duplicates_self_loops_and_isolated_nodes_match_float64_formulas(dtype):
    """GCN: ``D^-1/2 (A without self loops + I) D^-1/2 X W + b`` (repeated edges add up, an existing self loop keeps
    weight 1, isolated nodes see themselves); GIN-0: ``MLP(x + A x)`` with repeated edges and self loops counted."""
    torch.manual_seed(0)
    n, x = 6, torch.randn(6, 3, dtype=torch.float64)
    ei = torch.tensor([[0, 0, 1, 2, 2, 3], [1, 1, 1, 2, 3, 0]])  # 0->1 twice, self loops on 1 and 2, 4 and 5 alone
    gcn = GCN(GCNConfig(in_channels=3, num_classes=2, num_layers=1, dropout=0.0)).double().eval()
    a = _adjacency(ei, n)
    a_hat = a - torch.diag(a.diagonal()) + torch.eye(n, dtype=torch.float64)
    d = a_hat.sum(1).rsqrt()
    conv = gcn.convs[0]
    ref = (d[:, None] * a_hat * d[None, :]) @ (x @ conv.lin.weight.t()) + conv.bias
    torch.testing.assert_close(gcn(x, ei.to(dtype)), ref, rtol=1e-12, atol=1e-12)
    gin = GIN(GINConfig(in_channels=3, num_classes=2, num_layers=2, task="node", dropout=0.0)).double().eval()
    ref = gin.heads[0](x) + gin.heads[1](gin.convs[0].nn(x + a @ x))
    torch.testing.assert_close(gin(x, ei.to(dtype)), ref, rtol=1e-12, atol=1e-12)
