"""Tests written in a second mutation-testing pass over the token graphs and the neighbour sampler.

A first pass (``test_mutation_kills_graph.py``) pinned the main checks and conversions; this one
aims at the paths it left open in ``diffusionformer/graph/core.py``, ``diffusionformer/graph/builders.py``
and ``diffusionformer/data/neighbors.py``: validation branches (types, shapes, which layout a field
belongs to, error messages), the integer dtypes ``edge_index`` may come in, devices (the tensors of a
graph, the masks handed to the layer, the builders' ``device=``), batch sizes inferred from padding
masks, padding masks that are (not) needed, SDPA ``attn_mask``s on causal graphs, and the generator of
a sampled batch.

Each test kills a mutant that the rest of the suite let through (its docstring names it: file and
mutation) and checks the code against an independent reference: adjacency matrices and edge lists
written out by hand or built by explicit loops, ``torch_geometric.utils.to_dense_adj``, explicit float64
masks handed to the layer's own ``attn_mask`` argument, and a sampler draw repeated from a generator in
the same state. Tensors on the ``meta`` device (no data, no accelerator) stand in for a second device.
Mutants judged equivalent are listed, with the reason, at the end of the file. No library defect was
found. CPU only, deterministic (seeded generators).
"""
from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.sampler import NodeSamplerInput
from torch_geometric.utils import to_dense_adj

from diffusionformer import DiffusionAttention
from diffusionformer.data.neighbors import TorchNeighborSampler, neighbor_batch, neighbor_loader
from diffusionformer.graph import AttentionGraph, causal, complete, grid


def _pairs(edge_index: Tensor) -> list[tuple[int, int]]:
    """Sorted ``(source, target)`` pairs of an edge list."""
    return sorted(map(tuple, edge_index.t().tolist()))


# ---------------------------------------------------------------------------- core: tensor checks
def test_key_padding_mask_that_is_not_a_tensor_is_a_type_error():
    """kills: core.py _check_bool_tensor dropping the ``isinstance(t, Tensor)`` check (a list then fails on ``.dtype``)"""
    with pytest.raises(TypeError, match=r"key_padding_mask must be a bool tensor of shape \(B, N\), got list"):
        AttentionGraph.dense(2, key_padding_mask=[[False, True]])


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.int8, torch.uint8])
@pytest.mark.parametrize("checked", [True, False])
def test_small_integer_edge_index_is_accepted_and_stored_as_long(dtype: torch.dtype, checked: bool):
    """kills: core.py _check_index_tensor dropping ``torch.int32`` from the accepted dtypes, returning ``t``
    instead of ``t.long()``, and _validate_sparse (checked=False) not storing the converted ``edge_index``"""
    g = AttentionGraph.sparse(torch.tensor([[0, 2], [1, 1]], dtype=dtype), 3,
                              batch=torch.tensor([0, 0, 0], dtype=dtype), checked=checked)
    assert g.edge_index.dtype == torch.long and g.edge_index.tolist() == [[0, 2], [1, 1]]
    assert g.batch.dtype == torch.long
    expected = torch.tensor([[[False, False, False], [True, False, True], [False, False, False]]])
    assert torch.equal(g.dense_allowed(), expected)


def test_tensors_on_two_devices_are_refused():
    """kills: core.py __post_init__ ``len(devices) > 1`` -> ``> 2`` (a CPU padding mask with a meta allowed matrix)"""
    kpm = torch.zeros(1, 3, dtype=torch.bool)
    allowed = torch.ones(3, 3, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match=r"must be on one device, got \['cpu', 'meta'\]"):
        AttentionGraph.dense(3, key_padding_mask=kpm, allowed=allowed)



def test_to_moves_the_batch_vector():
    """kills: core.py AttentionGraph.to leaving ``batch`` out of the tensors it moves (an unchecked sparse graph:
    its validation needs no values, so it can live on the meta device)"""
    g = AttentionGraph.sparse(torch.tensor([[0, 2], [1, 2]]), 3, batch=torch.tensor([0, 0, 1]), checked=False)
    moved = g.to("meta")
    assert moved.edge_index.device.type == "meta" and moved.batch.device.type == "meta"
    assert moved.device.type == "meta" and moved.num_nodes == 3


def test_repr_names_an_unchecked_graph_and_an_attn_mask():
    """kills: core.py __repr__ dropping ``checked=False`` (sparse) and dropping the ``attn_mask`` shape (dense)"""
    assert repr(AttentionGraph.sparse(torch.tensor([[0], [1]]), 2, checked=False)) == (
        "AttentionGraph(sparse, num_nodes=2, E=1, checked=False)")
    assert repr(AttentionGraph.dense(3, attn_mask=torch.zeros(2, 1, 3, 3))) == (
        "AttentionGraph(dense, N=3, attn_mask=(2, 1, 3, 3))")

# ---------------------------------------------------------------------------- core: dense validation
def test_dense_graph_refuses_a_non_bool_checked():
    """kills: core.py _validate_dense dropping ``not isinstance(self.checked, bool)`` (``checked=1`` accepted)"""
    with pytest.raises(TypeError, match=r"checked must be a bool, got int \(1\)"):
        AttentionGraph("dense", seq_len=3, checked=1)


def test_dense_graph_refuses_num_nodes():
    """kills: core.py _validate_dense dropping ``num_nodes`` from the sparse-only fields"""
    with pytest.raises(ValueError, match=r"num_nodes belongs to the sparse layout"):
        AttentionGraph("dense", seq_len=3, num_nodes=3)


def test_dense_batch_size_must_be_positive():
    """kills: core.py _validate_dense ``check_int("batch_size", ..., 1)`` -> minimum 0"""
    with pytest.raises(ValueError, match=r"batch_size must be >= 1, got 0"):
        AttentionGraph.dense(3, batch_size=0)


def test_attn_mask_may_broadcast_over_queries_and_be_per_head():
    """kills: core.py _validate_dense ``s not in (1, N)`` -> ``s not in (N,)`` (a (1, N) key bias refused) and
    ``m.dim() < 4`` -> ``m.dim() < 3`` (a per-head (H, N, N) mask with H != B refused)"""
    bias = torch.tensor([[0.0, -1.0, 2.0]])  # (1, N): one bias per key, the same for every query
    g = AttentionGraph.dense(3, attn_mask=bias)
    assert g.attention_kwargs(torch.zeros(2, 3, 4))["attn_mask"] is bias
    per_head = torch.zeros(4, 3, 3)  # (H=4, N, N) on a B=2 graph
    g = AttentionGraph.dense(3, batch_size=2, attn_mask=per_head)
    assert g.batch_size == 2 and g.attention_kwargs(torch.zeros(2, 3, 4))["attn_mask"] is per_head


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({}, ValueError, r"a dense AttentionGraph needs seq_len \(N\)"),
        ({"seq_len": 3, "key_padding_mask": torch.zeros(1, 3, 2, dtype=torch.bool)}, ValueError,
         r"key_padding_mask must have shape \(B, N\) = \(B, 3\), got \(1, 3, 2\)"),
        ({"seq_len": 3, "allowed": torch.ones(1, 1, 3, 3, dtype=torch.bool)}, ValueError,
         r"allowed must have shape \(3, 3\) or \(B, 3, 3\), got \(1, 1, 3, 3\)"),
        ({"seq_len": 3, "attn_mask": [[0.0] * 3] * 3}, TypeError, r"attn_mask must be a tensor or None, got list"),
        ({"seq_len": 3, "attn_mask": torch.zeros(1, 1, 1, 3, 3)}, ValueError,
         r"attn_mask must be broadcastable to \(B, H, N, N\) with N=3, got shape \(1, 1, 1, 3, 3\)"),
    ],
    ids=["no-seq-len", "kpm-3d", "allowed-4d", "attn-mask-list", "attn-mask-5d"],
)
def test_dense_graph_refuses_missing_or_misshapen_fields(kwargs: dict, error: type[Exception], match: str):
    """kills: core.py _validate_dense dropping ``seq_len is None`` (no-seq-len: check_int's TypeError instead),
    dropping ``kpm.dim() != 2`` (kpm-3d), ``a.dim() == 3`` -> ``a.dim() >= 3`` (allowed-4d), dropping the
    attn_mask tensor check (attn-mask-list: a bare AttributeError) and ``m.dim() <= 4`` -> ``<= 5`` (attn-mask-5d)"""
    with pytest.raises(error, match=match):
        AttentionGraph("dense", **kwargs)


# ---------------------------------------------------------------------------- core: sparse validation
def test_edge_index_that_is_not_a_tensor_is_a_type_error():
    """kills: core.py _check_index_tensor dropping the ``isinstance(t, Tensor)`` check (a list then fails on ``.dtype``)"""
    with pytest.raises(TypeError, match=r"edge_index must be an integer tensor of shape \(2, E\), got list"):
        AttentionGraph.sparse([[0], [1]], 2)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"edge_index": torch.zeros(3, 2, dtype=torch.long), "num_nodes": 3}, ValueError,
         r"edge_index must have shape \(2, E\), got \(3, 2\)"),
        ({"edge_index": torch.tensor([[0], [1]]), "batch": torch.zeros(1, 2, dtype=torch.long)}, ValueError,
         r"batch must have shape \(num_nodes,\), got \(1, 2\)"),
        ({"edge_index": torch.tensor([[0], [1]]), "checked": 1}, TypeError, r"checked must be a bool, got int"),
        ({"edge_index": torch.tensor([[0], [1]]), "batch": torch.tensor([0, 0]), "batch_size": 0}, ValueError,
         r"batch_size must be >= 1, got 0"),
    ],
    ids=["three-rows", "batch-2d", "checked-int", "batch-size-zero"],
)
def test_sparse_graph_refuses_misshapen_fields(kwargs: dict, error: type[Exception], match: str):
    """kills: core.py _validate_sparse dropping ``e.shape[0] != 2`` (three-rows), dropping ``batch.dim() != 1``
    (batch-2d), dropping the bool check of ``checked`` (checked-int: ``1`` taken as True) and
    ``check_int("batch_size", ..., 1)`` -> minimum 0 (batch-size-zero: an error about batch values instead)"""
    with pytest.raises(error, match=match):
        AttentionGraph("sparse", **kwargs)


def test_sparse_graph_needs_an_edge_index():
    """kills: core.py _validate_sparse dropping the ``edge_index is None`` check (a TypeError about NoneType instead)"""
    with pytest.raises(ValueError, match=r"a sparse AttentionGraph needs edge_index of shape \(2, E\)"):
        AttentionGraph("sparse", num_nodes=3)


def test_unchecked_sparse_graph_needs_num_nodes():
    """kills: core.py _validate_sparse (checked=False) dropping ``needs num_nodes`` (then check_int's TypeError)"""
    with pytest.raises(ValueError, match=r"checked=False\) needs num_nodes"):
        AttentionGraph.sparse(torch.tensor([[0], [1]]), checked=False)


def test_one_graph_needs_no_batch_vector():
    """kills: core.py _validate_sparse ``G not in (None, 1)`` -> ``G is not None`` (batch_size=1 refused)"""
    g = AttentionGraph.sparse(torch.tensor([[0], [1]]), batch_size=1)
    assert g.batch_size == 1 and g.num_nodes == 2 and g.batch is None
    assert torch.equal(g.dense_allowed(), torch.tensor([[[False, False], [True, False]]]))


# ---------------------------------------------------------------------------- core: attention_kwargs
def _layer() -> DiffusionAttention:
    torch.manual_seed(0)
    return DiffusionAttention(8, 2, heads="attention:1,heat(t=0.5, steps=3):1").double().eval()


def _x(B: int = 2, N: int = 4, seed: int = 0) -> Tensor:
    return torch.randn(B, N, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_dense_attention_kwargs_refuses_a_four_dimensional_x():
    """kills: core.py attention_kwargs (dense) dropping ``x.dim() != 3`` (a (B, N, D, 1) input passes the N check)"""
    with pytest.raises(ValueError, match=r"expects x of shape \(B, N=3, D\), got \(2, 3, 8, 1\)"):
        AttentionGraph.dense(3, window=1).attention_kwargs(torch.zeros(2, 3, 8, 1))


def test_attention_kwargs_are_built_on_the_device_of_x():
    """kills: core.py attention_kwargs handing the sparse ``edge_index`` and the graph's ``attn_mask`` over on
    the graph's device instead of ``x``'s (``.to(x.device)`` dropped)"""
    sparse = AttentionGraph.sparse(torch.tensor([[0, 1], [1, 0]]), 2)
    kw = sparse.attention_kwargs(torch.zeros(2, 8, device="meta"))
    assert kw["edge_index"].device.type == "meta"
    dense = AttentionGraph.dense(3, attn_mask=torch.zeros(3, 3))
    kw = dense.attention_kwargs(torch.zeros(2, 3, 8, device="meta"))
    assert set(kw) == {"attn_mask"} and kw["attn_mask"].device.type == "meta"


def test_plain_causal_graph_keeps_its_attn_mask():
    """kills: core.py attention_kwargs (plain causal branch) dropping the graph's ``attn_mask``"""
    bias = torch.randn(4, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    g = AttentionGraph.dense(4, causal=True, attn_mask=bias)
    kw = g.attention_kwargs(_x())
    assert kw["is_causal"] is True and kw["attn_mask"] is bias
    lower = torch.tensor([[j <= i for j in range(4)] for i in range(4)])  # hand-built causal relation
    layer, x = _layer(), _x()
    torch.testing.assert_close(layer(x, graph=g), layer(x, attn_mask=bias.masked_fill(~lower, float("-inf"))),
                               atol=1e-12, rtol=0)



def test_plain_causal_graph_keeps_its_padding_mask():
    """kills: core.py attention_kwargs (plain causal branch) dropping the ``key_padding_mask``"""
    kpm = torch.tensor([[False, False, False, True], [False, True, False, False]])
    g = causal(4, key_padding_mask=kpm)
    kw = g.attention_kwargs(_x())
    assert set(kw) == {"is_causal", "key_padding_mask"} and torch.equal(kw["key_padding_mask"], kpm)
    lower = torch.tensor([[j <= i for j in range(4)] for i in range(4)])
    explicit = lower[None, None] & ~kpm[:, None, None, :]  # (B, 1, N, N): causal and not a padded key
    layer, x = _layer(), _x()
    torch.testing.assert_close(layer(x, graph=g), layer(x, attn_mask=explicit), atol=1e-12, rtol=0)

# ---------------------------------------------------------------------------- core: conversions
def test_dense_allowed_checks_its_batch_size():
    """kills: core.py _resolve_batch_size dropping ``check_int("batch_size", batch_size, 1)`` (an empty (0, N, N))"""
    with pytest.raises(ValueError, match=r"batch_size must be >= 1, got 0"):
        AttentionGraph.dense(3, window=1).dense_allowed(0)
    with pytest.raises(TypeError, match=r"batch_size must be an int, got bool"):
        AttentionGraph.dense(3).to_sparse(True)


def test_dense_allowed_of_several_sequences_is_an_independent_matrix():
    """kills: core.py dense_allowed returning ``A`` instead of ``A.contiguous()`` (an expanded view: the B
    sequences share one (N, N) block, so a write into one sequence fails)"""
    A = AttentionGraph.dense(3, window=1).dense_allowed(2)
    assert A.is_contiguous()
    A[0, 0, 1] = False  # edit sequence 0 only
    band = torch.tensor([[abs(i - j) <= 1 for j in range(3)] for i in range(3)])
    assert torch.equal(A[1], band) and A[0, 0, 1].item() is False


def test_to_sparse_refuses_a_graph_with_an_attn_mask():
    """kills: core.py to_sparse dropping ``_refuse_attn_mask`` (a float bias silently lost in the edges)"""
    with pytest.raises(ValueError, match=r"to_sparse: this graph has an SDPA attn_mask"):
        AttentionGraph.dense(3, window=1, attn_mask=torch.zeros(3, 3)).to_sparse()


def test_to_dense_refuses_two_nodes_in_decreasing_graph_order():
    """kills: core.py to_dense ``batch.numel() > 1`` -> ``> 2`` (two ungrouped nodes then slip through and
    get positions -1 and 1 in graphs of one node: a bare IndexError)"""
    g = AttentionGraph.sparse(torch.tensor([[0, 1], [0, 1]]), batch=torch.tensor([1, 0]))
    with pytest.raises(ValueError, match=r"to_dense needs the nodes grouped by graph"):
        g.to_dense()


def test_to_dense_of_equal_sized_graphs_has_no_padding_mask():
    """kills: core.py to_dense always handing over the ``(B, N)`` padding mask (``kpm if kpm.any() else None``
    -> ``kpm``): graphs of equal size need none, and the layer then gets no key_padding_mask at all"""
    g = AttentionGraph.sparse(torch.tensor([[1, 2, 3], [0, 3, 3]]), batch=torch.tensor([0, 0, 1, 1]))
    d = g.to_dense()
    assert d.key_padding_mask is None and d.batch_size == 2 and d.seq_len == 2
    expected = torch.tensor([[[False, True], [False, False]], [[False, False], [True, True]]])
    assert torch.equal(d.dense_allowed(), expected)
    # PyG's own dense adjacency (adj[b, source, target]) transposed to A[b, target, source]
    assert torch.equal(to_dense_adj(g.edge_index, g.batch).transpose(1, 2).bool(), expected)
    assert set(d.attention_kwargs(torch.zeros(2, 2, 8))) == {"attn_mask"}


# ---------------------------------------------------------------------------- builders: devices and batches
def test_sequence_builder_moves_the_padding_mask_to_device():
    """kills: builders.py _sequence_graph dropping ``key_padding_mask.to(device)`` (the graph stays on the CPU)"""
    g = complete(3, key_padding_mask=torch.tensor([[False, False, True]]), device="meta")
    assert g.device.type == "meta" and g.key_padding_mask.device.type == "meta"


def test_sequence_builder_defaults_to_the_device_of_the_padding_mask():
    """kills: builders.py _sequence_graph ignoring the padding mask's device when ``device=None`` (the
    self-loop-free ``allowed`` then lands on the CPU next to a meta mask: a device error)"""
    kpm = torch.tensor([[False, True, False]], device="meta")
    g = complete(3, self_loops=False, key_padding_mask=kpm)
    assert g.allowed.device.type == "meta" and g.device.type == "meta"


def test_sparse_sequence_builder_takes_the_batch_size_from_the_padding_mask():
    """kills: builders.py _sequence_graph (sparse) ``B = g.batch_size`` -> ``B = batch_size`` (the B inferred
    from a ``(B, N)`` padding mask is lost: one sequence instead of B)"""
    kpm = torch.tensor([[False, False, True], [False, False, False]])
    g = causal(3, key_padding_mask=kpm, layout="sparse")
    assert g.num_nodes == 6 and g.batch_size == 2 and g.batch.tolist() == [0, 0, 0, 1, 1, 1]
    # sequence 0: tokens 0, 1 (2 is padding); sequence 1: tokens 3, 4, 5; edges j -> i for j <= i
    assert _pairs(g.edge_index) == sorted([(0, 0), (0, 1), (1, 1), (3, 3), (3, 4), (4, 4), (3, 5), (4, 5), (5, 5)])


# ---------------------------------------------------------------------------- builders: grid checks
@pytest.mark.parametrize("layout", ["dense", "sparse"])
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"w": 0}, ValueError, r"w must be >= 1, got 0"),
        ({"w": 2.0}, TypeError, r"w must be an int, got float"),
        ({"self_loops": 1}, TypeError, r"self_loops must be a bool, got int \(1\)"),
        ({"cls_token": "yes"}, TypeError, r"cls_token must be a bool, got str \('yes'\)"),
    ],
    ids=["w-zero", "w-float", "self-loops-int", "cls-token-str"],
)
def test_grid_checks_its_width_and_flags(layout: str, kwargs: dict, error: type[Exception], match: str):
    """kills: builders.py _check_grid dropping ``check_int("w", w, 1)`` (w-zero: an error about seq_len, w-float:
    fractional patch positions) and grid dropping the bool check of ``self_loops`` / ``cls_token``"""
    args = {"h": 2, "w": 2, **kwargs}
    with pytest.raises(error, match=match):
        grid(args.pop("h"), args.pop("w"), layout=layout, **args)


def test_grid_refuses_an_unknown_layout():
    """kills: builders.py grid dropping ``check_layout`` (an unknown layout then built the sparse graph)"""
    with pytest.raises(ValueError, match=r"layout must be one of \('dense', 'sparse'\), got 'csr'"):
        grid(2, 2, layout="csr")


@pytest.mark.parametrize("cls_token", [False, True])
def test_dense_grid_is_built_on_device(cls_token: bool):
    """kills: builders.py grid (dense) building the patch positions without ``device=dev``, and grid taking
    ``dev`` as the CPU whatever ``device`` says (the allowed matrix stays on the CPU)"""
    g = grid(2, 3, device="meta", cls_token=cls_token)
    assert g.allowed.device.type == "meta" and g.allowed.shape == (6 + cls_token, 6 + cls_token)



def test_dense_grid_keeps_its_batch_size():
    """kills: builders.py grid (dense) not handing ``batch_size`` to the graph (it then serves any batch size)"""
    g = grid(1, 3, metric="manhattan", self_loops=False, batch_size=3)
    assert g.batch_size == 3
    path = torch.tensor([[False, True, False], [True, False, True], [False, True, False]])  # 1 x 3, 4-neighbours
    assert torch.equal(g.dense_allowed(), path.expand(3, 3, 3))
    with pytest.raises(ValueError, match=r"expects x of shape \(3, N=3, D\), got \(2, 3, 8\)"):
        g.attention_kwargs(torch.zeros(2, 3, 8))

# ---------------------------------------------------------------------------- data.neighbors
def _star_data() -> Data:
    """Node 0 has in-edges from 1 .. 8, node 1 from 2 .. 5 (global ids; listed out of target order)."""
    src = [1, 2, 3, 4, 5, 6, 7, 8, 2, 3, 4, 5]
    dst = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]
    order = [11, 0, 5, 9, 1, 7, 2, 10, 3, 8, 4, 6]  # a fixed shuffle of the edge list
    ei = torch.tensor([[src[k] for k in order], [dst[k] for k in order]])
    return Data(x=torch.arange(9.0).view(9, 1), edge_index=ei, num_nodes=9)


def test_neighbor_batch_without_a_generator_draws_from_the_sampler_own():
    """kills: neighbors.py neighbor_batch setting ``sampler.generator = generator`` even when ``generator`` is None
    (the draw then comes from torch's global RNG, not from the sampler's own generator)"""
    data, seeds = _star_data(), torch.tensor([0, 1])
    ref = TorchNeighborSampler(data, [2], generator=torch.Generator().manual_seed(5)).sample_from_nodes(
        NodeSamplerInput(input_id=None, node=seeds))
    own = torch.Generator().manual_seed(5)
    start = own.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(123)  # a global RNG in another state than the sampler's own
        got = neighbor_batch(data, TorchNeighborSampler(data, [2], generator=own), seeds)
    assert not torch.equal(own.get_state(), start)  # the draw advanced the sampler's own generator
    assert torch.equal(got.n_id, ref.node) and torch.equal(got.e_id, ref.edge)
    # every sampled edge is a real edge of the graph, from a node to the seed that sampled it
    real = set(map(tuple, data.edge_index.t().tolist()))
    assert {(int(got.n_id[s]), int(got.n_id[t])) for s, t in got.edge_index.t().tolist()} <= real
    assert got.edge_index[1].bincount(minlength=2)[:2].tolist() == [2, 2]  # k = 2 per seed


def test_neighbor_batch_refuses_seeds_that_are_not_a_tensor():
    """kills: neighbors.py neighbor_batch dropping ``isinstance(seeds, Tensor)`` (a list then fails on ``.dim``)"""
    data = _star_data()
    with pytest.raises(ValueError, match=r"neighbor_batch: expected seeds of shape \(B,\), got <class 'list'>"):
        neighbor_batch(data, TorchNeighborSampler(data, [2]), [0, 1])


@pytest.mark.parametrize("seeds, error, message", [
    (torch.tensor([True, False, True]), TypeError, r"expected integer seed node ids, got dtype torch.bool \(for a node mask, pass "
                                                   r"mask.nonzero\(\).view\(-1\)\)"),
    (torch.tensor([0.5]), TypeError, "expected integer seed node ids, got dtype torch.float32"),
    (torch.tensor([3, 9]), ValueError, r"seed node ids must lie in \[0, num_nodes=9\), got range \[3, 9\]"),
    (torch.tensor([-1]), ValueError, r"seed node ids must lie in \[0, num_nodes=9\), got range \[-1, -1\]"),
    (torch.tensor([4, 2, 4, 1, 2]), ValueError, r"expected distinct seeds, got repeated node ids \[2, 4\]"),
])
def test_neighbor_batch_refuses_seeds_that_are_not_distinct_node_ids(seeds, error, message):
    """Bug: ``neighbor_batch`` read a bool node mask as the ids 0 and 1 and truncated float seeds
    without a word, failed with a bare ``IndexError``/``RuntimeError`` on an id outside the graph,
    and gave a repeated seed's second copy no neighbours (the docstring asks for distinct seeds)."""
    data = _star_data()
    with pytest.raises(error, match=r"^neighbor_batch: " + message):
        neighbor_batch(data, TorchNeighborSampler(data, [-1]), seeds)
    ok = neighbor_batch(data, TorchNeighborSampler(data, [-1]), torch.tensor([8, 0], dtype=torch.int32))
    assert ok.n_id[:2].tolist() == [8, 0] and ok.batch_size == 2  # int32 ids in range are fine



def test_neighbor_loader_shuffles_the_seeds_when_asked():
    """kills: neighbors.py neighbor_loader handing ``shuffle=False`` to NeighborLoader whatever ``shuffle`` says"""
    data = _star_data()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        (shuffled,) = list(neighbor_loader(data, [-1], batch_size=9, shuffle=True, force_torch=True))
        (ordered,) = list(neighbor_loader(data, [-1], batch_size=9, force_torch=True))
    assert ordered.n_id[:9].tolist() == list(range(9))
    seeds = shuffled.n_id[:9].tolist()
    assert sorted(seeds) == list(range(9)) and seeds != list(range(9))

# ---------------------------------------------------------------------------- equivalent mutants
# core.py to_dense ``allowed[batch[e[1]], pos[e[1]], pos[e[0]]]`` -> ``allowed[batch[e[0]], ...]``: equivalent.
#   to_dense only runs on a checked graph (an unchecked one is re-validated first through
#   ``replace(self, checked=True)``), and validation refuses any edge with ``batch[source] != batch[target]``,
#   so ``batch[e[0]]`` and ``batch[e[1]]`` are the same tensor on every graph that reaches this line.
# neighbors.py _sample_hop dropping the ``total == 0`` early return: equivalent. With no incoming edges every
#   later tensor is empty (``repeat_interleave`` of zero degrees, ``arange(0)``), ``pos`` and ``seg`` come out
#   as empty long tensors as before, and ``torch.rand(0, generator=g)`` leaves the generator's state unchanged
#   (checked: ``g.get_state()`` is identical), so later draws are the same.
# neighbors.py neighbor_batch ``seeds = seeds.long().cpu()`` -> ``seeds``: equivalent for integer seeds on the
#   CPU (the only device this suite has): sample_from_nodes converts ``index.node.long()`` itself and the batch
#   layout only uses ``seeds.numel()``. It differs only for seeds on an accelerator (indexing a CPU tensor).
# neighbors.py TorchNeighborSampler: flipping ``perm`` and ``dst_sorted`` twice after the sort: equivalent by
#   construction (an identity rewrite written in the mutant list by mistake; counted here, not tested).
