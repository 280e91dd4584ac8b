"""GIN baseline: the explicit sum-aggregation formula in float64, batching, bad configs."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.models import GIN, GINConfig, create_model


def _explicit(model: GIN, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    """h^{l+1} = MLP((1 + eps) h^l + A h^l) with A[dst, src] counting edges; summed per-layer sum readouts."""
    n = x.shape[0]
    A = torch.zeros(n, n, dtype=x.dtype)
    A.index_put_((edge_index[1], edge_index[0]), torch.ones(edge_index.shape[1], dtype=x.dtype), accumulate=True)
    hs = [x]
    for conv in model.convs:
        eps = float(conv.eps.detach())
        hs.append(conv.nn((1 + eps) * hs[-1] + A @ hs[-1]))
    G = int(batch.max()) + 1
    onehot = torch.zeros(G, n, dtype=x.dtype)
    onehot[batch, torch.arange(n)] = 1.0
    return sum(head(onehot @ h) for head, h in zip(model.heads, hs))


def test_gin_matches_the_explicit_formula_in_float64():
    torch.manual_seed(0)
    model = GIN(GINConfig(in_channels=3, num_classes=4, hidden=8, num_layers=3, train_eps=True)).double()
    with torch.no_grad():
        for conv in model.convs:
            conv.eps.fill_(0.3)
    model.train()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 3, generator=g, dtype=torch.float64)
    # edges within each graph (nodes 0-2 and 3-6): an edge across the graphs of batch is refused
    ei = torch.cat([torch.randint(0, 3, (2, 8), generator=g), torch.randint(3, 7, (2, 8), generator=g)], 1)
    batch = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    model(x, ei, batch)  # one training pass moves the batch-norm statistics away from their init
    model.eval()
    torch.testing.assert_close(model(x, ei, batch), _explicit(model, x, ei, batch), atol=1e-12, rtol=0)


def test_graphs_in_a_batch_do_not_interact():
    torch.manual_seed(0)
    model = create_model("gin-graph", in_channels=3, num_classes=2, hidden=8).eval()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(9, 3, generator=g)
    a, b = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]), torch.tensor([[0, 1, 2], [2, 0, 4]])
    both = model(x, torch.cat([a, b + 4], 1), torch.tensor([0] * 4 + [1] * 5))
    torch.testing.assert_close(both[0], model(x[:4], a)[0])
    torch.testing.assert_close(both[1], model(x[4:], b)[0])


@pytest.mark.parametrize("bad, match", [
    (dict(num_layers=1), "num_layers must be >= 2"),
    (dict(dropout=1.5), "dropout"),
    (dict(pool="sum"), "pool must be"),
    (dict(hidden=0), "hidden"),
])
def test_bad_configs_are_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        GINConfig(**bad)


def test_wrong_input_width_is_a_clear_error():
    model = GIN(GINConfig(in_channels=3))
    with pytest.raises(ValueError, match=r"x must have shape \(N, in_channels=3\)"):
        model(torch.randn(4, 5), torch.tensor([[0], [1]]))
