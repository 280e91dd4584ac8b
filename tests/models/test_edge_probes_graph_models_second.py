"""Edge probes of the graph models, second round: the positional encodings of
``positional_encoding_transform`` on graphs smaller than ``pe_dim``, directed graphs, batches and repeated edges
(against float64 eigen/power formulas and PyG's own sparse path), and batched graphs of mixed sizes (one node, no
edge) through the graph transformer with edge features, PEs and global attention against each graph alone and
under a node permutation."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.transforms import AddRandomWalkPE
from torch_geometric.utils import to_undirected

from diffusionformer.models import (GCN, GIN, DiffusionGraphTransformer, GCNConfig, GINConfig, GraphTransformerConfig,
                                    positional_encoding_transform)


def _sym_laplacian(edge_index: torch.Tensor, N: int) -> torch.Tensor:
    """``I - D^-1/2 A D^-1/2`` in float64 (a node without edges: a 1 on the diagonal), repeated edges summed."""
    A = torch.zeros(N, N, dtype=torch.float64).index_put_((edge_index[0], edge_index[1]),
                                                          torch.ones(edge_index.shape[1], dtype=torch.float64),
                                                          accumulate=True)
    d = A.sum(1)
    s = torch.where(d > 0, d.rsqrt(), torch.zeros_like(d))
    return torch.eye(N, dtype=torch.float64) - s[:, None] * A * s[None, :]


def test_bug_laplacian_pe_of_a_graph_smaller_than_pe_dim_is_zero_padded() -> None:
    """Bug: the Laplacian PE of a graph with N <= pe_dim nodes (a 4-node PROTEINS graph and the default pe_dim=8)
    failed inside PyG's transform with "output with shape [N, N-1] doesn't match the broadcast shape": a dataset
    with one small graph could not be encoded at all. Now the N - 1 non-trivial eigenvectors are followed by zero
    columns (as GraphGPS pads), so graphs of every size batch together and run through the model."""
    cfg = GraphTransformerConfig(in_channels=2, num_classes=2, dim=8, num_heads=2, task="graph", pe="laplacian",
                                 pe_dim=4)
    pe_of = positional_encoding_transform(cfg)
    path3 = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    big = to_undirected(torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]]))
    graphs = [Data(x=torch.randn(6, 2), edge_index=big), Data(x=torch.randn(3, 2), edge_index=path3),
              Data(x=torch.randn(1, 2), edge_index=torch.zeros(2, 0, dtype=torch.long)),
              Data(x=torch.randn(2, 2), edge_index=torch.tensor([[0, 1], [1, 0]]))]
    out = [pe_of(g) for g in graphs]
    for g, o in zip(graphs, out):
        N = g.num_nodes
        assert o.pe.shape == (N, 4) and o.pe.dtype == out[0].pe.dtype
        real = min(N - 1, 4)
        assert torch.equal(o.pe[:, real:], torch.zeros(N, 4 - real))
        L = _sym_laplacian(g.edge_index, N)
        lam = torch.linalg.eigvalsh(L)
        for col in o.pe[:, :real].double().t():  # unit eigenvectors of the non-trivial eigenvalues
            torch.testing.assert_close(col.norm(), torch.tensor(1.0, dtype=torch.float64), rtol=0, atol=1e-5)
            torch.testing.assert_close(L @ col, (col @ L @ col) * col, rtol=0, atol=1e-5)
            assert col @ L @ col > lam[0] + 1e-6
    model = DiffusionGraphTransformer(cfg).eval()
    batch = Batch.from_data_list(out)
    alone = torch.cat([model(o.x, o.edge_index, pe=o.pe) for o in out])
    torch.testing.assert_close(model(batch.x, batch.edge_index, batch.batch, pe=batch.pe), alone,
                               rtol=1e-5, atol=1e-6)


def test_bug_laplacian_pe_refuses_a_directed_graph() -> None:
    """Bug: the Laplacian PE (built with is_undirected=True) of a directed graph ran eigh on a non-symmetric
    Laplacian, which reads one triangle of it: for the path 0 -> 1 -> 2 -> 3 it returned "eigenvectors" that are
    eigenvectors of no Laplacian of the graph, without a word. Now a ValueError says to make the graph undirected;
    a repeated edge listed in one direction only counts as directed too."""
    pe_of = positional_encoding_transform(GraphTransformerConfig(pe="laplacian", pe_dim=2))
    with pytest.raises(ValueError, match=r"Laplacian PE needs an undirected graph.*to_undirected"):
        pe_of(Data(edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]), num_nodes=4))
    with pytest.raises(ValueError, match="undirected"):
        pe_of(Data(edge_index=torch.tensor([[0, 0, 1, 1, 2], [1, 1, 0, 2, 1]]), num_nodes=4))
    ok = pe_of(Data(edge_index=to_undirected(torch.tensor([[0, 1, 2], [1, 2, 3]])), num_nodes=4))
    assert ok.pe.shape == (4, 2)


def test_bug_laplacian_pe_refuses_a_batch_of_several_graphs() -> None:
    """Bug: applied to a Batch (a collated loader batch), the Laplacian PE took the eigenvectors of the union of
    its graphs: each graph's columns depended on the others (eigenvectors of one graph, zero on the rest), not the
    graph's own PE. Now a ValueError says to apply it per graph; a Batch of one graph is that graph."""
    pe_of = positional_encoding_transform(GraphTransformerConfig(pe="laplacian", pe_dim=2))
    a = Data(edge_index=to_undirected(torch.tensor([[0, 1, 2], [1, 2, 3]])), num_nodes=4)
    b = Data(edge_index=to_undirected(torch.tensor([[0, 1], [1, 2]])), num_nodes=3)
    with pytest.raises(ValueError, match="Laplacian PE is per graph, got a Batch of 2 graphs"):
        pe_of(Batch.from_data_list([a, b]))
    torch.manual_seed(0)
    one = pe_of(Batch.from_data_list([a])).pe
    torch.manual_seed(0)
    torch.testing.assert_close(one, pe_of(a).pe, rtol=0, atol=0)


def test_bug_random_walk_pe_counts_repeated_edges_at_every_size() -> None:
    """Bug: PyG's dense path (graphs of up to 2000 nodes) wrote 1/deg once per node pair, so with a repeated edge
    the walk's rows summed below 1: node 0 of 0 =2=> 1 <-> 2 got a 2-step return probability of 0.25, not 0.5,
    and the same component in a graph of over 2000 nodes (PyG's sparse path, which sums) got 0.5. Now every size
    counts a repeated edge as often as it is listed: float64 diag((D^-1 A)^s), equal to PyG's sparse path."""
    ei = torch.tensor([[0, 0, 1, 1, 2, 3], [1, 1, 0, 2, 1, 3]])  # 0 -> 1 twice; a self loop on 3
    pe_of = positional_encoding_transform(GraphTransformerConfig(pe="random_walk", pe_dim=4))
    pe = pe_of(Data(edge_index=ei, num_nodes=5)).pe
    A = torch.zeros(5, 5, dtype=torch.float64).index_put_((ei[0], ei[1]), torch.ones(6, dtype=torch.float64),
                                                          accumulate=True)
    T = A / A.sum(1, keepdim=True).clamp(min=1)
    ref = torch.stack([torch.linalg.matrix_power(T, s).diagonal() for s in range(1, 5)], dim=1)
    assert float(ref[0, 1]) == 0.5
    torch.testing.assert_close(pe.double(), ref, rtol=0, atol=1e-6)
    with warnings.catch_warnings():  # PyG's sparse path: torch's sparse CSR beta warnings
        warnings.simplefilter("ignore")
        large = AddRandomWalkPE(4, attr_name="pe")(Data(edge_index=ei, num_nodes=2001)).pe
    torch.testing.assert_close(pe, large[:5], rtol=0, atol=1e-6)


def _graphs() -> list[Data]:
    g = torch.Generator().manual_seed(0)

    def data(N: int, ei: list[list[int]]) -> Data:
        edge_index = torch.tensor(ei, dtype=torch.long).reshape(2, -1)
        return Data(x=torch.randn(N, 3, generator=g, dtype=torch.float64), edge_index=edge_index,
                    edge_attr=torch.randn(edge_index.shape[1], 2, generator=g, dtype=torch.float64),
                    pe=torch.randn(N, 3, generator=g, dtype=torch.float64))

    # a ring with a chord, one node, three nodes without edges, a self loop and a repeated edge
    return [data(4, [[0, 1, 2, 3, 1], [1, 2, 3, 0, 0]]), data(1, [[], []]), data(3, [[], []]),
            data(5, [[0, 0, 1, 2, 2, 4, 4], [1, 1, 2, 2, 3, 0, 3]])]


@pytest.mark.parametrize("task", ["node", "graph"])
@pytest.mark.parametrize("global_attention", [False, True])
def test_batched_graphs_of_mixed_sizes_equal_each_alone_and_permute(task, global_attention) -> None:
    """A Batch of graphs with one node and without edges, with edge features, a Laplacian PE and global
    attention, gives each graph's own logits (float64, eval), and relabelling the nodes inside every graph
    permutes node logits and leaves graph logits unchanged; GCN and GIN likewise give each graph's own."""
    torch.manual_seed(0)
    cfg = GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, num_heads=4, depth=2, task=task, edge_dim=2,
                                 pe="laplacian", pe_dim=3, global_attention=global_attention,
                                 heads="heat(steps=3):2,laplacian:1,attention:1")
    model = DiffusionGraphTransformer(cfg).double().eval()
    graphs = _graphs()
    b = Batch.from_data_list(graphs)
    out = model(b.x, b.edge_index, b.batch, edge_attr=b.edge_attr, pe=b.pe)
    alone = torch.cat([model(d.x, d.edge_index, edge_attr=d.edge_attr, pe=d.pe) for d in graphs])
    torch.testing.assert_close(out, alone, rtol=0, atol=1e-12)
    perm = torch.cat([torch.randperm(d.num_nodes, generator=torch.Generator().manual_seed(i)) + int(b.ptr[i])
                      for i, d in enumerate(graphs)])  # within every graph: the batch stays sorted
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel())
    moved = model(b.x[perm], inv[b.edge_index], b.batch, edge_attr=b.edge_attr, pe=b.pe[perm])
    torch.testing.assert_close(moved, out[perm] if task == "node" else out, rtol=0, atol=1e-12)
    for base in (GCN(GCNConfig(in_channels=3, task=task, dropout=0.0)),
                 GIN(GINConfig(in_channels=3, task=task, dropout=0.0, num_layers=3, train_eps=True))):
        base = base.double().eval()
        alone = torch.cat([base(d.x, d.edge_index) for d in graphs])
        torch.testing.assert_close(base(b.x, b.edge_index, b.batch), alone, rtol=0, atol=1e-12)
