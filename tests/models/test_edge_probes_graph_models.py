"""Edge probes of the graph baselines against PyG in float64: GCN/GIN fed a torch sparse adjacency (an uncoalesced
COO one, values of another dtype, a block-sparse layout), GIN-0 loading a GIN-eps state dict, and the readouts of
an unsorted int32 batch with empty graphs against ``torch_geometric.nn.global_*_pool``."""

from __future__ import annotations

import io

import pytest
import torch
from torch_geometric.nn import GCNConv, GINConv, global_add_pool, global_max_pool, global_mean_pool

from diffusionformer.models import GCN, GIN, GCNConfig, GINConfig

# a symmetric graph over 6 nodes with a duplicate edge (3 -> 4 twice); node 5 isolated
_EI = torch.tensor([[0, 1, 1, 2, 3, 3, 4, 2, 0], [1, 0, 2, 1, 4, 4, 3, 0, 2]])
_POOLS = {"mean": global_mean_pool, "add": global_add_pool, "max": global_max_pool}


def _x() -> torch.Tensor:
    return torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def _adj_t(dtype=torch.float64) -> torch.Tensor:
    """The uncoalesced COO adjacency PyG reads as ``adj_t`` (row = target), one entry per edge of ``_EI``."""
    return torch.sparse_coo_tensor(_EI.flip(0), torch.ones(_EI.shape[1], dtype=dtype), (6, 6))


def _gcn(**kw) -> GCN:
    torch.manual_seed(0)
    return GCN(GCNConfig(**{**dict(in_channels=3, num_classes=2, num_layers=2, dropout=0.0), **kw})).double().eval()


def _gin(**kw) -> GIN:
    torch.manual_seed(0)
    return GIN(GINConfig(**{**dict(in_channels=3, num_classes=2, num_layers=3, dropout=0.0, task="node"), **kw})).double().eval()


def test_bug_gcn_leaves_an_uncoalesced_sparse_adjacency_as_it_was() -> None:
    """Bug: GCN on an uncoalesced COO adjacency flagged the caller's tensor coalesced in place (PyG's
    ``to_edge_index``) without sorting it: afterwards ``adj.to_sparse_csr()`` was another matrix, and a GIN run on
    the same adjacency gave wrong logits. The forward now coalesces a copy; the caller's tensor is untouched."""
    adj = _adj_t()
    dense = adj.to_dense()
    gcn, gin = _gcn(), _gin()
    torch.testing.assert_close(gcn(_x(), adj), gcn(_x(), _EI), rtol=0, atol=1e-12)
    assert not adj.is_coalesced()
    torch.testing.assert_close(adj.to_sparse_csr().to_dense(), dense, rtol=0, atol=0)
    torch.testing.assert_close(gin(_x(), adj), gin(_x(), _EI), rtol=0, atol=1e-12)


@pytest.mark.parametrize("values", [torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("make", [_gcn, _gin])
def test_bug_gcn_gin_cast_a_sparse_adjacency_to_the_model_dtype(make, values) -> None:
    """Bug: a float64 model (``x`` is cast to the model's dtype) fed a float32 adjacency, PyG's default, or an
    integer/bool one, failed inside torch's matmul ("expected scalar type Double but found Float", "result type
    Float can't be cast to the desired output type Long"). The adjacency's values are now cast as ``x`` is."""
    model = make()
    adj = torch.sparse_coo_tensor(_EI.flip(0), torch.ones(_EI.shape[1], dtype=values), (6, 6)).coalesce()
    if values is torch.bool:  # bool values of the duplicate edge would merge into one True: compare the simple graph
        ref = model(_x(), adj.indices().flip(0))
    else:
        ref = model(_x(), _EI)
    torch.testing.assert_close(model(_x(), adj), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("make", [_gcn, _gin])
def test_bug_gcn_gin_name_a_block_sparse_adjacency(make) -> None:
    """Bug: a BSR adjacency failed deep in PyG, with "select(): no view exists" (GCN) or "Expected 'edge_index' to
    be of integer type (got 'torch.float64')" (GIN), about a tensor that holds no edge index at all. Now a
    ValueError names the layouts the models read."""
    bsr = _adj_t().coalesce().to_sparse_bsr((2, 2))
    with pytest.raises(ValueError, match=r"edge_index: a sparse adjacency \(adj_t\) must have the layout .*"
                                         r"got torch\.sparse_bsr"):
        make()(_x(), bsr)


def test_gcn_sparse_adjacency_values_weight_the_edges_and_the_diagonal_gets_one_added() -> None:
    """As the GCN docstring says: a sparse adjacency's values are edge weights and PyG adds 1 to its diagonal (a
    self loop already there weighs 2, where ``edge_index``'s keeps 1); float64 formula with GCNConv's weights."""
    w = torch.tensor([0.5, 2.0, 1.0, 3.0, 1.0, 1.0, 0.25, 1.5, 1.5], dtype=torch.float64)
    index = torch.cat([_EI, torch.tensor([[2], [2]])], 1)  # plus a self loop on node 2 of weight 0.75
    w = torch.cat([w, torch.tensor([0.75], dtype=torch.float64)])
    model = _gcn(num_layers=1)
    A = torch.zeros(6, 6, dtype=torch.float64).index_put_((index[1], index[0]), w, accumulate=True)
    A = A + torch.eye(6, dtype=torch.float64)
    d = A.sum(1).pow(-0.5)
    conv = model.convs[0]
    ref = (d[:, None] * A * d[None, :]) @ (_x() @ conv.lin.weight.T) + conv.bias
    adj = torch.sparse_coo_tensor(index.flip(0), w, (6, 6))
    torch.testing.assert_close(model(_x(), adj), ref, rtol=0, atol=1e-12)
    # the same graph as edge_index: unit weights, the existing self loop kept at 1
    ref_conv = GCNConv(3, 2).double()
    ref_conv.load_state_dict(conv.state_dict())
    torch.testing.assert_close(model(_x(), index), ref_conv(_x(), index), rtol=0, atol=1e-12)


def test_bug_gin0_refuses_the_state_dict_of_a_learned_eps() -> None:
    """Bug: a GIN-0 (``train_eps=False``) loaded a GIN-eps model's state dict without a word: its fixed epsilon
    buffers took the learned values, so a model configured as GIN-0 ran with epsilon 0.5. Now a RuntimeError (what
    the checkpoint loaders catch) names the buffer and ``train_eps``, and no weight is written."""
    learned, gin0 = _gin(train_eps=True), _gin()
    with torch.no_grad():
        for conv in learned.convs:
            conv.eps.fill_(0.5)
    before = {k: v.clone() for k, v in gin0.state_dict().items()}
    with pytest.raises(RuntimeError, match=r"convs\.0\.eps is fixed at 0 \(train_eps=False, GIN-0\).*\[0\.5\]"):
        gin0.load_state_dict(learned.state_dict())
    assert all(torch.equal(before[k], v) for k, v in gin0.state_dict().items())
    # the other way round is fine (a learned eps may start at 0), and so is GIN-0's own round trip, on meta too
    learned.load_state_dict(gin0.state_dict())
    assert all(float(conv.eps.detach()) == 0.0 for conv in learned.convs)
    buf = io.BytesIO()
    torch.save(gin0.state_dict(), buf)
    buf.seek(0)
    with torch.device("meta"):
        fresh = GIN(GINConfig(in_channels=3, num_classes=2, num_layers=3, dropout=0.0, task="node"))
    fresh.load_state_dict(torch.load(buf, weights_only=True), assign=True)
    torch.testing.assert_close(fresh.eval()(_x(), _EI), gin0(_x(), _EI), rtol=0, atol=0)


@pytest.mark.parametrize("pool", ["mean", "add", "max"])
def test_gcn_gin_readouts_of_an_unsorted_int32_batch_with_empty_graphs_match_pyg(pool) -> None:
    """Graph logits of an unsorted int32 ``batch`` (graphs 0, 2 and 4 of 5 empty) and int32 edges equal PyG's
    convolutions with the models' weights, pooled by ``global_*_pool`` with the int64 ids, in float64."""
    batch = torch.tensor([3, 1, 3, 1, 1, 3])
    edges = torch.tensor([[0, 2, 1, 3, 4, 4], [2, 0, 3, 1, 3, 1]])  # within graphs
    x = _x()
    gcn = _gcn(task="graph", pool=pool)
    h = x
    for i, conv in enumerate(gcn.convs):
        ref = GCNConv(conv.in_channels, conv.out_channels).double()
        ref.load_state_dict(conv.state_dict())
        h = torch.relu(ref(h, edges))
    want = gcn.head(_POOLS[pool](h, batch, size=5))
    torch.testing.assert_close(gcn(x, edges.int(), batch.int(), num_graphs=5), want, rtol=0, atol=1e-12)
    gin = _gin(task="graph", pool=pool, train_eps=True)
    with torch.no_grad():
        for i, conv in enumerate(gin.convs):
            conv.eps.fill_(0.25 * (i + 1))
    hs = [x]
    for conv in gin.convs:
        ref = GINConv(conv.nn, train_eps=True)
        ref.load_state_dict(conv.state_dict())
        hs.append(ref(hs[-1], edges))
    want = sum(head(_POOLS[pool](h, batch, size=5)) for head, h in zip(gin.heads, hs))
    torch.testing.assert_close(gin(x, edges.int(), batch.int(), num_graphs=5), want, rtol=0, atol=1e-12)
