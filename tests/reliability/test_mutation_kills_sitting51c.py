"""Mutation audit 51c of commit 0671c4d (knn's block-wise distances, the layers' and models' refusals of PyG's
hetero inputs, the sparse-adjacency check order): knn against a brute-force float64 reference with blocks forced
tiny, the size of each distance block, the exact messages; and the bug the audit found."""

from __future__ import annotations

import sys

import pytest
import torch

pytest.importorskip("torch_geometric")

from torch_geometric.data import HeteroData  # noqa: E402

from diffusionformer.graph import knn  # noqa: E402
from diffusionformer.models import GCN, GIN, DiffusionGraphTransformer, GCNConfig, GINConfig  # noqa: E402
from diffusionformer.models import GraphBlock, GraphTransformerConfig  # noqa: E402
from diffusionformer.nn import Block, DiffusionAttention  # noqa: E402

_knn_module = sys.modules["diffusionformer.graph.knn"]  # the package's knn is the function


def _reference_distances(x: torch.Tensor, batch: torch.Tensor, metric: str) -> torch.Tensor:
    """(N, N) float64 distances from explicit pairs, inf across graphs and on the diagonal; a zero vector has
    cosine distance 1 to every point (cos = 0, the docstring's convention)."""
    x = x.double()
    N = x.shape[0]
    d = torch.full((N, N), float("inf"), dtype=torch.float64)
    for i in range(N):
        for j in range(N):
            if i == j or batch[i] != batch[j]:
                continue
            if metric == "euclidean":
                d[i, j] = (x[i] - x[j]).pow(2).sum().sqrt()
            else:
                ni, nj = x[i].norm(), x[j].norm()
                d[i, j] = 1.0 if ni == 0 or nj == 0 else 1 - (x[i] @ x[j]) / (ni * nj)
    return d


def _check_against_reference(x, k, batch, metric, self_loops):
    N = x.shape[0]
    ref_batch = torch.zeros(N, dtype=torch.long) if batch is None else batch
    d = _reference_distances(x, ref_batch, metric)
    ei = knn(x, k, batch=batch, metric=metric, self_loops=self_loops).edge_index
    assert ei.shape[1] == N * (k + int(self_loops))
    for i in range(N):
        src = ei[0, ei[1] == i].tolist()
        if self_loops:
            assert src.count(i) == 1, (i, src)
            src.remove(i)
        assert len(src) == k and len(set(src)) == k and i not in src, (i, src)
        assert all(int(ref_batch[j]) == int(ref_batch[i]) for j in src), (i, src)
        got = d[i, src].sort().values
        want = d[i].sort().values[:k]
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5, msg=f"node {i}: {src}")


@pytest.mark.parametrize("block", [1, 7, 50, 1 << 22])
@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_knn_equals_a_float64_brute_force_search_whatever_the_block(monkeypatch, block, metric):
    """Pin: graphs of very different sizes (2 to 23 nodes, shuffled), M = 23 not a multiple of the rows of a
    block, zero vectors in several blocks (cosine: distance 1 to all), duplicates, self_loops, k = M - 1 on one
    graph, 3-D and half-precision x: the neighbours are at the k smallest brute-force float64 distances."""
    monkeypatch.setattr(_knn_module, "_KNN_BLOCK", block)
    g = torch.Generator().manual_seed(3)
    sizes = torch.tensor([2, 23, 5, 3, 11])
    N = int(sizes.sum())
    x = torch.randn(N, 3, generator=g)
    x[torch.tensor([1, 9, 17, 30, 40])] = 0.0  # zero vectors, spread over the blocks
    x[20] = x[21]  # a duplicate
    batch = torch.repeat_interleave(torch.arange(5), sizes)[torch.randperm(N, generator=g)]
    for self_loops in (False, True):
        _check_against_reference(x, 1, batch, metric, self_loops)
    one = torch.randn(13, 4, generator=g)
    one[[2, 9]] = 0.0
    _check_against_reference(one, 12, None, metric, True)  # k = M - 1: every other point
    _check_against_reference(one, 5, None, metric, False)
    three = torch.randn(3, 9, 2, generator=g)
    ei = knn(three, 4, metric=metric).edge_index
    ref = knn(three.reshape(27, 2), 4, batch=torch.arange(3).repeat_interleave(9), metric=metric).edge_index
    assert torch.equal(ei, ref)
    _check_against_reference(three.reshape(27, 2), 4, torch.arange(3).repeat_interleave(9), metric, False)
    half = torch.randn(30, 4, generator=g).half()
    assert torch.equal(knn(half, 4, metric=metric).edge_index, knn(half.float(), 4, metric=metric).edge_index)


@pytest.mark.parametrize("block", [1, 1 << 22])
def test_knn_cosine_zero_vector_is_exactly_at_distance_one(monkeypatch, block):
    """Pin: a zero vector's cosine distance is 1 (not the chord |u_i - u_j| and not a value near 1): a point just
    inside 90 degrees (1 - cos = 0.995) comes before it, one just beyond (1.005) after it."""
    monkeypatch.setattr(_knn_module, "_KNN_BLOCK", block)
    x = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.005, 1.0]])
    assert knn(x, 1, metric="cosine").edge_index[0, 0] == 2
    x = torch.tensor([[1.0, 0.0], [0.0, 0.0], [-0.005, 1.0]])
    assert knn(x, 1, metric="cosine").edge_index[0, 0] == 1
    # 75 degrees: 1 - cos = 0.74 < 1, but the chord 1.22 > 1
    x = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.2588, 0.9659]])
    assert knn(x, 1, metric="cosine").edge_index[0, 0] == 2


def test_knn_distance_blocks_stay_within_the_budget_for_many_graphs(monkeypatch):
    """Pin: a block holds at most max(_KNN_BLOCK, G M) distances, the G graphs of a batch counted (not M alone),
    and never fewer than one query row of every graph; the neighbours are those of one block."""
    calls = []
    cdist = torch.cdist

    def recording(a, b, *args, **kwargs):
        out = cdist(a, b, *args, **kwargs)
        calls.append(out.shape)
        return out

    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 2, generator=g)
    batch = torch.arange(20).repeat_interleave(10)  # G = 20, M = 10
    whole = knn(x, 3, batch=batch).edge_index
    monkeypatch.setattr(torch, "cdist", recording)
    for block, most in [(1000, 1000), (1, 200), (250, 200)]:
        monkeypatch.setattr(_knn_module, "_KNN_BLOCK", block)
        calls.clear()
        assert torch.equal(knn(x, 3, batch=batch).edge_index, whole)
        sizes = [s.numel() for s in calls]
        assert max(sizes) <= most and sum(sizes) == 20 * 10 * 10, (block, calls)


# ------------------------------------------------------------------------------------------------------- messages

@pytest.mark.parametrize("build", [lambda: DiffusionAttention(8, 2), lambda: Block(8, 2), lambda: GraphBlock(8, 2)],
                         ids=["DiffusionAttention", "Block", "GraphBlock"])
def test_not_a_tensor_names_only_a_pair_of_two_tensors(build):
    """Pin: a tuple of three tensors, a tuple with a non-tensor and a list of two tensors are not PyG's bipartite
    pair: each is named by its type, with the block's name as prefix."""
    layer = build()
    prefix = {"DiffusionAttention": "", "Block": "Block: ", "GraphBlock": "GraphBlock: "}[type(layer).__name__]
    ei = torch.tensor([[0], [1]])
    t = torch.randn(3, 8)
    for x, name in [((t, t, t), "tuple"), ((t, 1), "tuple"), ([t, t], "list"), ("x", "str")]:
        with pytest.raises(TypeError) as info:
            layer(x, ei)
        assert str(info.value) == f"{prefix}x must be a tensor, got {name}", info.value
    with pytest.raises(TypeError) as info:
        layer((t, t), ei)
    assert str(info.value).startswith(f"{prefix}x must be a tensor, got a pair of tensors")


@pytest.mark.parametrize("build", [
    lambda: DiffusionGraphTransformer(GraphTransformerConfig(in_channels=4, dim=8, num_heads=2, depth=1)),
    lambda: GCN(GCNConfig(in_channels=4)),
    lambda: GIN(GINConfig(in_channels=4)),
], ids=["graph_transformer", "gcn", "gin"])
def test_node_features_messages_list_four_types_at_most(build):
    """Pin: a dict of node types lists the first four names, with ", ..." only beyond four; a 3-D x is a shape
    error (not taken by its last dimension); a non-tensor is named by its type."""
    model = build()
    ei = torch.zeros(2, 0, dtype=torch.long)
    four = {n: torch.randn(2, 4) for n in "abcd"}
    with pytest.raises(ValueError, match=r"got a dict of node types \('a', 'b', 'c', 'd'\), as a"):
        model(four, ei)
    with pytest.raises(ValueError, match=r"got a dict of node types \('a', 'b', 'c', 'd', \.\.\.\), as a"):
        model({**four, "e": torch.randn(2, 4)}, ei)
    with pytest.raises(ValueError, match=r"got \(1, 3, 4\)$"):
        model(torch.randn(1, 3, 4), ei)
    with pytest.raises(ValueError, match=r"got tuple$"):
        model((torch.randn(3, 4),), ei)


# ----------------------------------------------------------------------------------------------------------- bugs

def test_knn_pads_a_batch_by_size_class_not_to_its_largest_graph(monkeypatch):
    """Bug: knn padded every graph of a batch to the largest (to_dense_batch) and searched G N_max^2 distances,
    held G N_max (D + a block) floats: one graph of 3000 points among 1500 pairs took 3 s and hundreds of MB
    where the graph alone takes milliseconds (the docstring: memory linear, time quadratic in each graph's size).
    Graphs are now padded with those of their power-of-two size class: at most 4 sum(n^2) distances."""
    calls = []
    cdist = torch.cdist

    def recording(a, b, *args, **kwargs):
        out = cdist(a, b, *args, **kwargs)
        calls.append((a.shape, b.shape))
        return out

    g = torch.Generator().manual_seed(0)
    sizes = torch.tensor([2] * 60 + [64] + [3] * 40 + [17])
    N = int(sizes.sum())
    x = torch.randn(N, 2, generator=g)
    batch = torch.repeat_interleave(torch.arange(sizes.numel()), sizes)[torch.randperm(N, generator=g)]
    ref = [knn(x[batch == i], 1).edge_index for i in range(sizes.numel())]  # each graph alone
    monkeypatch.setattr(torch, "cdist", recording)
    ei = knn(x, 1, batch=batch).edge_index
    searched = sum(a[0] * a[1] * b[1] for a, b in calls)
    padded = sum(b[0] * b[1] for _, b in calls)
    assert searched <= 4 * int((sizes * sizes).sum()), (searched, calls)
    assert padded <= 2 * N, (padded, calls)
    # the neighbours of each graph are its own search's, in the caller's node ids, grouped by target
    assert torch.equal(ei[1], torch.arange(N))
    for i in range(sizes.numel()):
        ids = (batch == i).nonzero().squeeze(1)
        assert torch.equal(ei[0, ids], ids[ref[i][0]]), i


@pytest.mark.parametrize("build", [lambda: DiffusionAttention(8, 2), lambda: Block(8, 2), lambda: GraphBlock(8, 2)],
                         ids=["DiffusionAttention", "Block", "GraphBlock"])
def test_layers_name_a_heterodata_x_dict(build):
    """Bug: layer(data.x_dict, data.edge_index_dict) of a HeteroData said "x must be a tensor, got dict", where
    the models (and graph_transformer.rst: "the layers and the graph transformer refuse ... a HeteroData (merge
    its types with data.to_homogeneous())") name the node types and to_homogeneous()."""
    h = HeteroData()
    h["paper"].x, h["author"].x = torch.randn(3, 8), torch.randn(2, 8)
    h["author", "writes", "paper"].edge_index = torch.tensor([[0, 1], [1, 2]])
    prefix = {"DiffusionAttention": "", "Block": "Block: ", "GraphBlock": "GraphBlock: "}[type(build()).__name__]
    with pytest.raises(TypeError, match=rf"^{prefix}x must be a tensor, got a dict of node types "
                                        r"\('paper', 'author'\), as a HeteroData's x_dict.*to_homogeneous\(\)"):
        build()(h.x_dict, h.edge_index_dict)
