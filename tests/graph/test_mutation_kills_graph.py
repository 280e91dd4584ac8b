"""Tests written in a mutation-testing audit of the token graphs and the neighbour sampler.

Each test kills a mutant of ``diffusionformer/graph`` (core, builders, export, interop) or
``diffusionformer/data/neighbors.py`` that the rest of the suite let through (the docstring of
each test names it) and checks the code against an independent reference: hand-written
adjacency matrices and edge lists, explicit float64 masks handed to the layer's own mask
arguments, and the documented contract (bad input gets a clear error naming what was expected).
CPU only, deterministic (seeded generators).
"""

from __future__ import annotations

import math

import networkx as nx
import pytest
import torch
from torch import Tensor
from torch_geometric.data import Batch, Data
from torch_geometric.sampler import NodeSamplerInput

from diffusionformer import DiffusionAttention
from diffusionformer.data.neighbors import TorchNeighborSampler, has_compiled_sampler, neighbor_batch, neighbor_loader
from diffusionformer.graph import (
    AttentionGraph,
    complete,
    draw_attention_graph,
    from_edge_index,
    from_networkx,
    from_pyg,
    grid,
    sliding_window,
    to_networkx,
)
from diffusionformer.nn import AttentionIntermediates


def _band(N: int, w: int) -> Tensor:
    """Hand-built ``(N, N)`` bool band ``|i - j| <= w``, by explicit loops."""
    return torch.tensor([[abs(i - j) <= w for j in range(N)] for i in range(N)])


def _layer() -> DiffusionAttention:
    torch.manual_seed(0)
    return DiffusionAttention(8, 2, heads="attention:1,heat(t=0.5, steps=3):1").double().eval()


def _x(B: int = 2, N: int = 5, seed: int = 0) -> Tensor:
    return torch.randn(B, N, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ---------------------------------------------------------------------------- core: dense validation
def test_dense_graph_refuses_checked_false():
    """kills: core.py _validate_dense dropping the ``checked=False`` refusal (a sparse-only option)"""
    with pytest.raises(ValueError, match=r"checked=False applies to sparse graphs"):
        AttentionGraph("dense", seq_len=3, checked=False)


def test_dense_graph_needs_at_least_one_token():
    """kills: core.py _validate_dense accepting ``seq_len=0`` (check_int minimum 1 -> 0)"""
    with pytest.raises(ValueError, match=r"seq_len must be >= 1, got 0"):
        AttentionGraph.dense(0)


def test_key_padding_mask_rows_must_match_batch_size():
    """kills: core.py _validate_dense dropping ``kpm.shape[0] != B`` (a (4, N) mask on a B=2 graph)"""
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, N\) = \(2, 3\), got \(4, 3\)"):
        AttentionGraph.dense(3, batch_size=2, key_padding_mask=torch.zeros(4, 3, dtype=torch.bool))


@pytest.mark.parametrize(
    "mask, error, match",
    [
        (torch.zeros(3, 3, dtype=torch.long), TypeError, r"must be bool .* or floating point, got torch.int64"),
        (torch.zeros(3, 1, 3, 3), ValueError, r"to \(B, H, N, N\) with N=3, B=2, got shape \(3, 1, 3, 3\)"),
        (torch.zeros(3), ValueError, r"to \(B, H, N, N\) with N=3, B=2, got shape \(3,\)"),
    ],
    ids=["integer-dtype", "leading-dim-3-for-B-2", "one-dimensional"],
)
def test_attn_mask_of_a_wrong_dtype_or_shape_is_refused(mask: Tensor, error: type[Exception], match: str):
    """kills: core.py _validate_dense dropping the attn_mask dtype check (integer-dtype), ``lead_ok = True``
    (leading-dim-3-for-B-2) and ``2 <= m.dim()`` -> ``1 <= m.dim()`` (one-dimensional)"""
    with pytest.raises(error, match=match):
        AttentionGraph.dense(3, batch_size=2, attn_mask=mask)


# ---------------------------------------------------------------------------- core: sparse validation
def test_edge_index_equal_to_num_nodes_is_out_of_range():
    """kills: core.py _validate_sparse bounds ``hi >= N`` -> ``hi > N`` (node id N accepted)"""
    with pytest.raises(ValueError, match=r"edge_index values must lie in \[0, num_nodes=2\), got range \[0, 2\]"):
        AttentionGraph.sparse(torch.tensor([[0], [2]]), 2)


def test_negative_graph_ids_are_refused():
    """kills: core.py _validate_sparse dropping ``lo < 0`` from the batch range check"""
    with pytest.raises(ValueError, match=r"batch values must lie in \[0, batch_size=None\), got range \[-1, -1\]"):
        AttentionGraph.sparse(torch.tensor([[0], [1]]), batch=torch.tensor([-1, -1]))


def test_several_graphs_without_a_batch_vector_are_refused():
    """kills: core.py _validate_sparse dropping ``batch_size > 1 needs a batch vector``"""
    with pytest.raises(ValueError, match=r"batch_size=2 graphs needs a batch vector"):
        AttentionGraph.sparse(torch.tensor([[0], [1]]), batch_size=2)


def test_unchecked_sparse_graph_still_checks_shapes_and_num_nodes():
    """kills: core.py _validate_sparse (checked=False) dropping the batch length check, and storing
    ``num_nodes`` without ``check_int(..., 1)``"""
    e = torch.tensor([[0], [1]])
    with pytest.raises(ValueError, match=r"batch must have shape \(num_nodes,\) = \(2,\), got \(3,\)"):
        AttentionGraph.sparse(e, 2, batch=torch.tensor([0, 0, 0]), checked=False)
    with pytest.raises(ValueError, match=r"num_nodes must be >= 1, got 0"):
        AttentionGraph.sparse(e, 0, checked=False)
    with pytest.raises(TypeError, match=r"num_nodes must be an int, got float"):
        AttentionGraph.sparse(e, 2.0, checked=False)


def test_sparse_attention_kwargs_checks_the_number_of_rows():
    """kills: core.py attention_kwargs (sparse) dropping ``x.shape[0] != num_nodes``"""
    g = AttentionGraph.sparse(torch.tensor([[0, 1], [1, 2]]), 3)
    with pytest.raises(ValueError, match=r"expects x of shape \(num_nodes=3, D\), got \(4, 8\)"):
        g.attention_kwargs(torch.zeros(4, 8))


# ---------------------------------------------------------------------------- core: the graph's attn_mask
def test_window_graph_with_a_float_attn_mask_keeps_the_window():
    """kills: core.py attention_kwargs ``mask = extra.masked_fill(~mask, -inf)`` -> ``mask = extra``"""
    layer, x = _layer(), _x()
    bias = torch.randn(5, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ref_mask = bias.masked_fill(~_band(5, 1), float("-inf"))
    got = layer(x, graph=AttentionGraph.dense(5, window=1, attn_mask=bias))
    torch.testing.assert_close(got, layer(x, attn_mask=ref_mask), atol=1e-12, rtol=0)
    assert not torch.allclose(got, layer(x, attn_mask=bias), atol=1e-6)  # the window matters


def test_window_graph_with_a_bool_attn_mask_is_their_conjunction():
    """kills: core.py attention_kwargs ``extra & mask`` -> ``extra | mask`` for a bool attn_mask"""
    layer, x = _layer(), _x()
    extra = torch.tensor([[True, True, False, True, True]] * 5)  # nobody attends to token 2 ...
    extra[2, 2] = True  # ... except token 2 itself (no empty row)
    got = layer(x, graph=AttentionGraph.dense(5, window=1, attn_mask=extra))
    torch.testing.assert_close(got, layer(x, attn_mask=extra & _band(5, 1)), atol=1e-12, rtol=0)


def test_dense_allowed_refuses_a_graph_with_an_attn_mask():
    """kills: core.py dense_allowed dropping ``_refuse_attn_mask`` (a float bias has no boolean adjacency)"""
    g = AttentionGraph.dense(3, window=1, attn_mask=torch.zeros(3, 3))
    with pytest.raises(ValueError, match=r"dense_allowed: this graph has an SDPA attn_mask"):
        g.dense_allowed()


# ---------------------------------------------------------------------------- core: conversions and devices
def test_to_dense_keeps_trailing_empty_graphs_of_batch_size():
    """kills: core.py to_dense ignoring the graph's ``batch_size`` (``B = batch.max() + 1``: empty last graphs lost)"""
    s = AttentionGraph.sparse(torch.tensor([[1, 2], [0, 2]]), batch=torch.tensor([0, 0, 1]), batch_size=3)
    d = s.to_dense()
    assert d.batch_size == 3 and d.seq_len == 2
    # graph 0: nodes 0, 1 (edge 1 -> 0); graph 1: node 2 (self loop); graph 2: empty, all padding
    assert d.key_padding_mask.tolist() == [[False, False], [False, True], [True, True]]
    expected = torch.tensor([[[False, True], [False, False]], [[True, False], [False, False]],
                             [[False, False], [False, False]]])
    assert torch.equal(d.dense_allowed(), expected)


def test_to_moves_every_tensor_including_the_attn_mask():
    """kills: core.py AttentionGraph.to leaving ``attn_mask`` out of the tensors it moves"""
    g = AttentionGraph.dense(3, allowed=torch.ones(3, 3, dtype=torch.bool), attn_mask=torch.zeros(3, 3))
    moved = g.to("meta")  # a device without data: no accelerator needed
    assert moved.allowed.device.type == "meta" and moved.attn_mask.device.type == "meta"
    assert AttentionGraph.dense(3, attn_mask=torch.zeros(3, 3)).to("meta").device.type == "meta"


# ---------------------------------------------------------------------------- builders
def test_sequence_builders_refuse_a_non_bool_self_loops():
    """kills: builders.py _sequence_graph dropping the ``self_loops`` bool check (``1`` taken as True)"""
    with pytest.raises(TypeError, match=r"self_loops must be a bool, got int"):
        complete(3, self_loops=1)


@pytest.mark.parametrize("layout", ["dense", "sparse"])
@pytest.mark.parametrize(
    "radius, error, match",
    [
        (math.inf, ValueError, r"radius must be finite and >= 0, got inf"),
        (math.nan, ValueError, r"radius must be finite and >= 0, got nan"),
        (True, TypeError, r"radius must be a number, got bool"),
    ],
    ids=["inf", "nan", "bool"],
)
def test_grid_refuses_a_radius_that_is_not_a_finite_number(layout: str, radius, error: type[Exception], match: str):
    """kills: builders.py _check_grid dropping ``math.isinf`` (inf), ``not radius >= 0`` -> ``radius < 0``
    (nan: an empty graph without even self loops) and dropping the bool exclusion (bool)"""
    with pytest.raises(error, match=match):
        grid(2, 2, radius, layout=layout)


def test_sparse_grid_checks_batch_size():
    """kills: builders.py grid (sparse) taking ``batch_size`` without ``check_int`` (0 then fails on num_nodes)"""
    with pytest.raises(ValueError, match=r"batch_size must be >= 1, got 0"):
        grid(2, 2, batch_size=0, layout="sparse")
    with pytest.raises(TypeError, match=r"batch_size must be an int, got float"):
        grid(2, 2, batch_size=2.0, layout="sparse")


def test_sliding_window_refuses_window_none():
    """kills: builders.py sliding_window dropping its own ``check_int("window", window, 0)`` (the dense
    constructor re-checks any int, but ``window=None`` means "no window" there: a complete graph)"""
    for layout in ("dense", "sparse"):
        with pytest.raises(TypeError, match=r"window must be an int, got NoneType"):
            sliding_window(5, None, layout=layout)


# ---------------------------------------------------------------------------- export: to_networkx
def _intermediates(weights: Tensor, edge_index: Tensor | None = None) -> AttentionIntermediates:
    return AttentionIntermediates(attn_weights=weights, coefficients=torch.ones(weights.shape[1], 2),
                                  edge_index=edge_index, backend="matrix")


def test_dense_weights_without_a_graph_keep_entries_nonzero_in_any_head():
    """kills: export.py _edge_weights ``(weights != 0).any(1)`` -> ``.all(1)`` (entries of one head lost)"""
    W = torch.zeros(1, 2, 3, 3, dtype=torch.float64)
    W[0, :, 0, 0] = 1.0  # both heads: 0 attends to 0
    W[0, 0, 1, 0] = 1.0  # head 0 only: 1 attends to 0
    W[0, 1, 2, 1] = 1.0  # head 1 only: 2 attends to 1
    G = to_networkx(_intermediates(W))  # head="mean"
    assert sorted(G.edges(data="weight")) == [(0, 0, 1.0), (0, 1, 0.5), (1, 2, 0.5)]


def test_dense_weights_without_a_graph_keep_all_b_times_n_nodes():
    """kills: export.py to_networkx dropping ``N = dense_nodes`` (nodes past the last edge lost)"""
    W = torch.zeros(2, 1, 3, 3, dtype=torch.float64)
    W[0, 0, 1, 0] = 1.0  # the only edge: 0 -> 1 of sequence 0; tokens 2 and (1, *) isolated
    G = to_networkx(_intermediates(W))
    assert list(G.nodes) == list(range(6)) and list(G.edges) == [(0, 1)]


def test_dense_weights_must_be_square():
    """kills: export.py _edge_weights dropping the ``N != M`` check of dense (B, H, N, M) weights"""
    with pytest.raises(ValueError, match=r"dense weights must have shape \(B, H, N, N\), got \(1, 1, 3, 4\)"):
        to_networkx(_intermediates(torch.ones(1, 1, 3, 4)))


def test_edge_index_beyond_dense_weights_is_a_value_error():
    """kills: export.py _edge_weights dropping the ``edge_index.max() >= B * N`` check (an IndexError then)"""
    with pytest.raises(ValueError, match=r"edge_index refers to node 9 but dense weights \(1, 1, 3, 3\)"):
        to_networkx(torch.tensor([[0], [9]]), torch.ones(1, 1, 3, 3))


@pytest.mark.parametrize("head, error, match", [
    (2, ValueError, r"head must lie in \[0, H=2\), got 2"),
    (-1, ValueError, r"head must be >= 0, got -1"),
    (True, TypeError, r"head must be an int, got bool"),
], ids=["H", "negative", "bool"])
def test_head_index_out_of_range_is_refused(head, error: type[Exception], match: str):
    """kills: export.py _reduce_heads ``head >= H`` -> ``head > H`` (H) and dropping ``check_int("head", head, 0)``
    (negative: -1 silently picks the last head; bool)"""
    with pytest.raises(error, match=match):
        to_networkx(torch.tensor([[0, 1], [1, 0]]), torch.rand(2, 2), head=head)


def test_top_k_ties_keep_the_earlier_edge():
    """kills: export.py _top_k_per_target breaking weight ties by the later edge"""
    ei = torch.tensor([[1, 2, 3, 0, 2], [0, 0, 0, 1, 1]])
    w = torch.tensor([0.5, 0.5, 0.5, 0.25, 0.25], dtype=torch.float64)
    assert sorted(to_networkx(ei, w, top_k=1).edges) == [(0, 1), (1, 0)]
    assert sorted(to_networkx(ei, w, top_k=2).edges) == [(0, 1), (1, 0), (2, 0), (2, 1)]


@pytest.mark.parametrize("threshold", [True, "0.5"], ids=["bool", "str"])
def test_threshold_must_be_a_number(threshold):
    """kills: export.py to_networkx dropping the ``threshold`` number check (True compared as 1)"""
    with pytest.raises(TypeError, match=r"threshold must be a number, got"):
        to_networkx(torch.tensor([[0, 1], [1, 0]]), torch.rand(2, dtype=torch.float64), threshold=threshold)


def test_num_nodes_must_agree_with_the_graph_and_be_a_positive_int():
    """kills: export.py to_networkx dropping the ``num_nodes`` / graph agreement check, and dropping
    ``check_int("num_nodes", num_nodes, 1)``"""
    g = AttentionGraph.sparse(torch.tensor([[0, 1], [1, 2]]), 3)
    with pytest.raises(ValueError, match=r"num_nodes=5 disagrees with the graph's 3 nodes"):
        to_networkx(g, num_nodes=5)
    assert to_networkx(g, num_nodes=3).number_of_nodes() == 3
    ei = torch.tensor([[0], [0]])
    with pytest.raises(TypeError, match=r"num_nodes must be an int, got bool"):
        to_networkx(ei, num_nodes=True)
    with pytest.raises(ValueError, match=r"num_nodes must be >= 1, got 0"):
        to_networkx(torch.zeros(2, 0, dtype=torch.long), num_nodes=0)


# ---------------------------------------------------------------------------- export: drawing helpers
def test_draw_attention_graph_checks_its_inputs():
    """kills: export.py draw_attention_graph dropping the ``pos`` tensor shape check and the networkx type check"""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    G = nx.DiGraph([(0, 1), (1, 2)])
    with pytest.raises(ValueError, match=r"pos must have shape \(N, 2\) = \(3, 2\), got \(3, 3\)"):
        draw_attention_graph(G, ax=Figure().add_subplot(), pos=torch.zeros(3, 3))
    with pytest.raises(TypeError, match=r"G must be a networkx graph, got dict"):
        draw_attention_graph({0: [1]}, ax=Figure().add_subplot())
    ax = draw_attention_graph(G, ax=Figure().add_subplot(), pos=torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]]))
    assert len(ax.collections) >= 1


# ---------------------------------------------------------------------------- interop
def test_from_edge_index_checks_num_nodes_before_adding_self_loops():
    """kills: interop.py from_edge_index dropping its ``num_nodes`` int check (a float count then makes float
    self-loop edges and the error blames edge_index)"""
    with pytest.raises(TypeError, match=r"num_nodes must be an int, got float"):
        from_edge_index(torch.tensor([[0], [1]]), 3.0, self_loops=True)


def test_from_pyg_keeps_an_empty_last_graph_of_the_batch():
    """kills: interop.py from_pyg dropping ``batch_size=num_graphs`` (an empty last graph disappears)"""
    data = Batch.from_data_list([Data(edge_index=torch.tensor([[0], [1]]), num_nodes=2),
                                 Data(edge_index=torch.zeros(2, 0, dtype=torch.long), num_nodes=0)])
    assert from_pyg(data).batch_size == 2
    d = from_pyg(data, layout="dense")
    assert d.batch_size == 2 and d.key_padding_mask.tolist() == [[False, False], [True, True]]
    assert torch.equal(d.dense_allowed(), torch.tensor([[[False, False], [True, False]], [[False] * 2] * 2]))


@pytest.mark.parametrize("convert", ["from_pyg", "from_networkx"])
def test_interop_refuses_an_unknown_layout(convert: str):
    """kills: interop.py from_pyg / from_networkx dropping ``check_layout`` (an unknown layout gave a dense graph)"""
    source = Data(edge_index=torch.tensor([[0], [1]]), num_nodes=2) if convert == "from_pyg" else nx.path_graph(2)
    with pytest.raises(ValueError, match=r"layout must be one of \('dense', 'sparse'\), got 'csr'"):
        {"from_pyg": from_pyg, "from_networkx": from_networkx}[convert](source, layout="csr")


@pytest.mark.parametrize("nodelist", [[0, 1, 2, 2], [0, 1, 1]], ids=["repeated-extra", "repeated-missing"])
def test_from_networkx_nodelist_must_be_a_permutation(nodelist):
    """kills: interop.py from_networkx dropping the nodelist length check (repeated-extra: a phantom node)
    or the set check (repeated-missing: a KeyError)"""
    with pytest.raises(ValueError, match=r"nodelist must be a permutation of G's 3 nodes"):
        from_networkx(nx.path_graph(3), nodelist=nodelist)


def test_from_networkx_refuses_an_empty_graph():
    """kills: interop.py from_networkx dropping ``G has no nodes`` (then a num_nodes error that names no graph)"""
    with pytest.raises(ValueError, match=r"G has no nodes"):
        from_networkx(nx.DiGraph())


# ---------------------------------------------------------------------------- data.neighbors
def test_has_compiled_sampler_needs_only_one_of_the_two_extensions(monkeypatch: pytest.MonkeyPatch):
    """kills: neighbors.py has_compiled_sampler ``WITH_PYG_LIB or WITH_TORCH_SPARSE`` -> ``and``"""
    import torch_geometric.typing as pyg_typing

    for lib, sparse, want in [(True, False, True), (False, True, True), (False, False, False), (True, True, True)]:
        monkeypatch.setattr(pyg_typing, "WITH_PYG_LIB", lib)
        monkeypatch.setattr(pyg_typing, "WITH_TORCH_SPARSE", sparse)
        assert has_compiled_sampler() is want, (lib, sparse)


@pytest.mark.parametrize("hops", [[], [0], [2, 0], [True], [-2]],
                         ids=["empty", "zero", "zero-second", "bool", "minus-2"])
def test_sampler_refuses_bad_num_neighbors(hops):
    """kills: neighbors.py TorchNeighborSampler dropping ``not hops`` (empty), ``k < 1`` -> ``k < 0`` (zero,
    zero-second: a hop that samples nothing) and dropping the bool exclusion (bool)"""
    data = Data(edge_index=torch.tensor([[1, 0], [0, 1]]), num_nodes=2)
    with pytest.raises(ValueError, match=r"num_neighbors: expected a non-empty list of positive ints or -1"):
        TorchNeighborSampler(data, hops)


def test_sampler_refuses_data_without_edge_index():
    """kills: neighbors.py TorchNeighborSampler dropping its Data / edge_index check (a bare subscript error)"""
    with pytest.raises(TypeError, match=r"expected a PyG Data with edge_index, got Data"):
        TorchNeighborSampler(Data(x=torch.zeros(3, 1)), [2])
    with pytest.raises(TypeError, match=r"expected a PyG Data with edge_index, got dict"):
        TorchNeighborSampler({"edge_index": torch.tensor([[0], [1]])}, [2])


def test_sampler_appends_new_nodes_in_order_of_first_appearance():
    """kills: neighbors.py sample_from_nodes appending the new nodes sorted by id (``fresh = uniq``)"""
    # in-edges of 0, in CSC order (stable by target): from 5, then 2, then 4
    data = Data(edge_index=torch.tensor([[5, 2, 4, 1], [0, 0, 0, 2]]), num_nodes=6)
    sampler = TorchNeighborSampler(data, [-1, -1])
    out = sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.tensor([0])))
    assert out.node.tolist() == [0, 5, 2, 4, 1]  # 1 reached at hop 2 through 2
    assert out.row.tolist() == [1, 2, 3, 4] and out.col.tolist() == [0, 0, 0, 2]
    assert out.num_sampled_nodes == [1, 3, 1] and out.num_sampled_edges == [3, 1]


def test_neighbor_batch_checks_its_inputs():
    """kills: neighbors.py neighbor_batch dropping the sampler type check and the ``seeds.dim() != 1`` check"""
    data = Data(x=torch.zeros(3, 1), edge_index=torch.tensor([[1, 2], [0, 1]]))
    with pytest.raises(TypeError, match=r"neighbor_batch: expected a TorchNeighborSampler, got NeighborLoader"):
        neighbor_batch(data, neighbor_loader(data, [2], batch_size=1, force_torch=True), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"neighbor_batch: expected seeds of shape \(B,\), got torch.Size\(\[1, 2\]\)"):
        neighbor_batch(data, TorchNeighborSampler(data, [2]), torch.tensor([[0, 1]]))


def test_neighbor_batch_restores_the_sampler_generator_and_numbers_inputs_as_the_loader():
    """kills: neighbors.py neighbor_batch leaving the call's generator in the sampler (dropped ``finally``), and
    ``input_id = seeds`` instead of positions ``0 .. B-1`` (NeighborLoader's layout)"""
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 30, (2, 120), generator=g)
    data = Data(x=torch.randn(30, 2, generator=g), edge_index=ei, num_nodes=30)
    own = torch.Generator().manual_seed(1)
    sampler = TorchNeighborSampler(data, [2], generator=own)
    seeds = torch.tensor([7, 3, 12])
    got = neighbor_batch(data, sampler, seeds, torch.Generator().manual_seed(2))
    assert sampler.generator is own
    (ref,) = list(neighbor_loader(data, [2], batch_size=3, input_nodes=seeds, force_torch=True,
                                  generator=torch.Generator().manual_seed(2)))
    assert torch.equal(ref.input_id, torch.arange(3))  # PyG's own numbering of the seeds
    assert torch.equal(got.input_id, ref.input_id) and torch.equal(got.n_id, ref.n_id)


# ---------------------------------------------------------------------------- defect found in the audit
def test_unchecked_graph_to_dense_runs_the_deferred_batch_checks():
    """defect (fixed): core.py to_dense of an unchecked sparse graph (``checked=False``) ran only the deferred
    bounds check, so an edge between two graphs of the batch silently became a wrong edge inside one graph
    (here the edge 0 -> 2 turned into a self loop of node 2) and negative graph ids gave a bare bincount error"""
    crossing = AttentionGraph.sparse(torch.tensor([[0], [2]]), 3, batch=torch.tensor([0, 0, 1]), checked=False)
    for convert in (crossing.to_dense, crossing.dense_allowed):
        with pytest.raises(ValueError, match=r"edge_index connects nodes of different graphs"):
            convert()
    negative = AttentionGraph.sparse(torch.tensor([[1], [2]]), 3, batch=torch.tensor([-1, 0, 0]), checked=False)
    with pytest.raises(ValueError, match=r"batch values must lie in \[0, batch_size=None\), got range \[-1, 0\]"):
        negative.to_dense()
    # a valid unchecked graph converts as the checked one: graph 0 = nodes 0, 1 (0 -> 1), graph 1 = node 2 (loop)
    ok = AttentionGraph.sparse(torch.tensor([[0, 2], [1, 2]]), 3, batch=torch.tensor([0, 0, 1]), checked=False)
    d = ok.to_dense()
    assert d.key_padding_mask.tolist() == [[False, False], [False, True]]
    expected = torch.tensor([[[False, False], [True, False]], [[True, False], [False, False]]])
    assert torch.equal(d.dense_allowed(), expected)
