"""Edge-case probes of edge features in the graph transformer (second pass): no bug found, these pin the behaviour."""

import torch

from diffusionformer.models.graph_transformer import DiffusionGraphTransformer, GraphTransformerConfig


def _model(**kw):
    torch.manual_seed(0)
    cfg = GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, num_heads=2, edge_dim=3, depth=1,
                                 heads="attention:1,heat(steps=2):1", **kw)
    return DiffusionGraphTransformer(cfg).double().eval()


# duplicate edge 0->1 with other features, a self loop 1->1 already in the graph
_EI = torch.tensor([[0, 1, 2, 3, 1, 0, 2], [1, 2, 3, 0, 1, 1, 0]])


def test_edge_attr_follows_an_edge_permutation_with_duplicates_and_given_self_loops():
    """The model (self loops replaced, with zero features) is invariant to listing the edges in another order."""
    m = _model()
    g = torch.Generator().manual_seed(1)
    x, ea = torch.randn(4, 3, dtype=torch.float64, generator=g), torch.randn(7, 3, dtype=torch.float64, generator=g)
    base = m(x, _EI, edge_attr=ea)
    perm = torch.randperm(7, generator=g)
    torch.testing.assert_close(m(x, _EI[:, perm], edge_attr=ea[perm]), base, rtol=0, atol=1e-12)
    swapped = ea.clone()
    swapped[[0, 5]] = ea[[5, 0]]  # the duplicate edges' features swapped: the same multiset of edges
    torch.testing.assert_close(m(x, _EI, edge_attr=swapped), base, rtol=0, atol=1e-12)
    other = ea.clone()
    other[4] += 5.0  # the given self loop's features: replaced by zeros (documented), so no effect
    torch.testing.assert_close(m(x, _EI, edge_attr=other), base, rtol=0, atol=0)
    assert not torch.allclose(m(x, _EI, edge_attr=ea + 1.0), base)


def test_integer_and_bool_one_hot_edge_attr_equal_the_float_one():
    m = _model()
    x = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    oh = torch.eye(3, dtype=torch.float64)[torch.tensor([0, 1, 2, 0, 1, 2, 0])]
    ref = m(x, _EI, edge_attr=oh)
    for dt in (torch.long, torch.int32, torch.bool, torch.float32):
        torch.testing.assert_close(m(x, _EI.int(), edge_attr=oh.to(dt)), ref, rtol=0, atol=1e-12)


def test_batched_graphs_equal_separate_graphs_and_edge_attr_gradcheck():
    m = _model(self_loops=False)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 3, dtype=torch.float64, generator=g)
    ea = torch.randn(7, 3, dtype=torch.float64, generator=g)
    ea2 = torch.randn(7, 3, dtype=torch.float64, generator=g)
    one, two = m(x, _EI, edge_attr=ea), m(x, _EI, edge_attr=ea2)
    both = m(torch.cat([x, x]), torch.cat([_EI, _EI + 4], 1), torch.tensor([0] * 4 + [1] * 4),
             edge_attr=torch.cat([ea, ea2]))
    torch.testing.assert_close(both, torch.cat([one, two]), rtol=0, atol=1e-12)
    e = ea.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: m(x, _EI, edge_attr=t), (e,))
