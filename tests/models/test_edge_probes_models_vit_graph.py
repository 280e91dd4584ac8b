"""Edge probes of DiffusionViT and DiffusionGraphTransformer: the graph transformer against a dense float64
masked-softmax reference (self loops on and off, global attention), empty-graph readouts, and node/edge
order equivariance for every operator with a sparse back-end."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from diffusionformer.models.graph_transformer import DiffusionGraphTransformer, GraphTransformerConfig
from diffusionformer.operators import list_operators

# two graphs (3 and 3 nodes); node 3 has no incoming edge
_X = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
_EI = torch.tensor([[0, 1, 2, 3, 4, 0], [1, 2, 0, 4, 5, 2]])
_BATCH = torch.tensor([0, 0, 0, 1, 1, 1])


def _dense_attention(attn: torch.nn.Module, h: torch.Tensor, allowed: torch.Tensor, laplacian: list[bool]) -> torch.Tensor:
    """Float64 multi-head attention over ``allowed[i, j]`` (j -> i); a row with no allowed key is a zero row of P
    (PyG's convention: no message), a Laplacian head applies ``I - P``."""
    N, D = h.shape
    H = attn.num_heads
    d = D // H
    q, k, v = (h @ attn.qkv.weight.T + attn.qkv.bias).reshape(N, 3, H, d).permute(1, 2, 0, 3)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~allowed, float("-inf"))
    P = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    eye = torch.eye(N, dtype=h.dtype)
    heads = [((eye - P[i]) if laplacian[i] else P[i]) @ v[i] for i in range(H)]
    return torch.stack(heads, 1).reshape(N, D) @ attn.out_proj.weight.T + attn.out_proj.bias


@pytest.mark.parametrize("self_loops", [True, False])
@pytest.mark.parametrize("global_attention", [False, True])
def test_pins_graph_transformer_equals_a_dense_masked_softmax_reference(self_loops, global_attention):
    """Pre-norm blocks, edge attention (j -> i, plus self loops when set; a node without incoming edge gets a
    zero row of P, so ``I - P`` on a Laplacian head passes its own value), GraphGPS global attention within each
    graph, final norm, mean readout, head: equal to an explicit float64 reference."""
    torch.manual_seed(0)
    m = DiffusionGraphTransformer(GraphTransformerConfig(
        in_channels=3, dim=8, num_heads=2, task="graph", heads="attention:1,laplacian:1",
        global_attention=global_attention, self_loops=self_loops)).double().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.2 * torch.randn_like(p))
    N = _X.shape[0]
    adj = torch.zeros(N, N, dtype=torch.bool)
    adj[_EI[1], _EI[0]] = True
    if self_loops:
        adj |= torch.eye(N, dtype=torch.bool)
    same_graph = _BATCH[:, None] == _BATCH[None, :]
    h = m.embed(_X)
    for blk in m.blocks:
        hn = F.layer_norm(h, (8,), blk.norm1.weight, blk.norm1.bias)
        update = _dense_attention(blk.attn, hn, adj, [False, True])
        if global_attention:
            update = update + _dense_attention(blk.global_attn, hn, same_graph, [False, True])
        h = h + update
        hn = F.layer_norm(h, (8,), blk.norm2.weight, blk.norm2.bias)
        h = h + F.linear(F.gelu(F.linear(hn, blk.mlp.fc1.weight, blk.mlp.fc1.bias)), blk.mlp.fc2.weight, blk.mlp.fc2.bias)
    h = F.layer_norm(h, (8,), m.norm.weight, m.norm.bias)
    ref = m.head(torch.stack([h[_BATCH == g].mean(0) for g in range(2)]))
    with torch.no_grad():
        torch.testing.assert_close(m(_X, _EI, _BATCH), ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(m(_X, _EI, _BATCH, max_num_nodes=5, num_graphs=2), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("pool", ["mean", "add", "max"])
@pytest.mark.parametrize("global_attention", [False, True])
def test_pins_empty_graph_logits_are_the_head_bias_on_every_path(pool, global_attention):
    """An empty graph reads out zero: its logits are the head's bias, beside other graphs (with or without the
    sized path) and in a batch of no node (exactly); the non-empty graphs are unchanged by the empty ones."""
    torch.manual_seed(0)
    m = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, dim=8, num_heads=2, task="graph", pool=pool,
                                                         global_attention=global_attention)).double().eval()
    torch.nn.init.normal_(m.head.bias)
    bias = m.head.bias.detach()
    with torch.no_grad():
        full = m(_X, _EI, _BATCH)
        gaps = m(_X, _EI, torch.tensor([0, 0, 0, 2, 2, 2]), num_graphs=4)
        sized = m(_X, _EI, torch.tensor([0, 0, 0, 2, 2, 2]), max_num_nodes=3, num_graphs=4)
        none = m(_X[:0], _EI[:, :0], torch.zeros(0, dtype=torch.long), num_graphs=2)
        alone = m(_X[:0], _EI[:, :0])
    torch.testing.assert_close(gaps[[0, 2]], full, rtol=0, atol=1e-12)  # other reduction sizes: rounding only
    torch.testing.assert_close(sized, gaps, rtol=0, atol=1e-12)
    for out in (gaps[[1, 3]], none, alone):
        assert torch.equal(out, bias.expand_as(out))


@pytest.mark.parametrize("op", [o for o in list_operators() if not o.endswith("-exact")])
def test_pins_graph_transformer_node_and_edge_order_equivariance_for_every_sparse_operator(op):
    """Permuting the nodes within each graph and the order of the edges permutes the node outputs and leaves the
    graph readout unchanged (float64, 1e-12), self loops on and off, with global attention."""
    torch.manual_seed(0)
    perm = torch.tensor([2, 0, 1, 5, 3, 4])
    inv = torch.argsort(perm)
    edge_order = torch.tensor([3, 5, 0, 2, 4, 1])
    for task in ("node", "graph"):
        for self_loops in (True, False):
            m = DiffusionGraphTransformer(GraphTransformerConfig(
                in_channels=3, dim=8, num_heads=2, task=task, heads=f"attention:1,{op}:1", self_loops=self_loops,
                global_attention=True)).double().eval()
            with torch.no_grad():
                out = m(_X, _EI, _BATCH)
                moved = m(_X[perm], inv[_EI][:, edge_order], _BATCH)
            torch.testing.assert_close(moved, out[perm] if task == "node" else out, rtol=0, atol=1e-12)
