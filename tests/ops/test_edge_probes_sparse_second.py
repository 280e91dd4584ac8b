"""Edge-case probes, second pass: the sparse back-end (CSR and gather-scatter), segment reductions, the uniform map,
edge features in the scores, and the PyG / networkx interop.

Found and fixed (each pinned by a "Bug:" test below):

* ``diffuse_sparse``, ``edge_attention`` and ``propagate_sparse`` took an ``edge_index`` (or ``weights``) on
  another device than the features and failed inside the kernels ("Values and crow_indices need to be on the
  same device", "index_add(): self, index and source expected to be in the same device");
* ``segment_softmax`` of integer scores returned integers (the weights truncated to 0 and 1); the scatter
  primitives named neither a list nor a 0-d ``src``, a list ``index``, an ``index`` on another device, a float,
  string or bool ``dim_size``, nor the closest name of a misspelt back-end;
* ``uniform_mean`` averaged an integer ``x`` into truncated integers, and failed with ``AttributeError`` for a
  list ``x`` or ``key_mask`` and inside ``mul`` for a ``key_mask`` on another device;
* ``edge_feature_attention`` added integer or bool ``edge_keys`` to the keys without a word, failed inside the
  kernels for ``edge_index``/``edge_keys`` on another device and inside a matmul for a wrong-width ``x``, read
  any truthy ``return_weights`` (``"no"``) as True, and raised ``AttributeError`` for a layer of another type;
* ``need_weights=`` / ``self_loops=`` given a numpy bool said ``got np.True_`` without naming its type
  (project policy: the message names ``numpy.bool``); ``self_loops`` on a meta ``edge_index`` failed inside PyG
  with a ``NotImplementedError`` about ``torch.nonzero``.

The working edge cases below check the sparse paths against explicit dense float64 matrices built from the edge
list, PyG's ``TransformerConv`` and ``torch_geometric.utils.softmax``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck
from torch_geometric.data import Batch, Data
from torch_geometric.nn import TransformerConv
from torch_geometric.utils import softmax as pyg_softmax

from diffusionformer.graph import from_edge_index, from_networkx, from_pyg
from diffusionformer.nn import DiffusionAttention, edge_feature_attention
from diffusionformer.ops import scatter_max, scatter_sum, segment_softmax
from diffusionformer.ops.sparse import diffuse_sparse, diffuse_sparse_with_weights, edge_attention, propagate_sparse
from diffusionformer.ops.uniform_map import uniform_mean

f64 = torch.float64
N, H, C = 6, 2, 3
#: unsorted, a self loop (1 -> 1), a duplicate (3 -> 2 twice), nodes 3 and 5 without in-edges
EDGES = torch.tensor([[4, 0, 1, 1, 2, 3, 3, 0, 5], [0, 1, 1, 2, 0, 2, 2, 1, 4]])


def _rand(*shape, seed, dtype=f64, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(requires_grad)


def _dense_p(q, k, ei, n):
    """``P`` per head ``(H, n, n)`` from the edge list, in float64: duplicates add up, rows without edges are 0."""
    src, dst = ei[0].long(), ei[1].long()
    s = (q.double()[dst] * k.double()[src]).sum(-1) * q.shape[-1] ** -0.5  # (E, H)
    e = torch.exp(s)
    denom = torch.zeros(n, q.shape[1], dtype=f64).index_add_(0, dst, e)
    P = torch.zeros(q.shape[1], n, n, dtype=f64)
    for h in range(q.shape[1]):
        P[h].index_put_((dst, src), e[:, h] / denom[dst, h], accumulate=True)
    return P


def _reference(q, k, v, ei, coeffs):
    P = _dense_p(q, k, ei, q.shape[0])
    out, cur = 0, v.double().transpose(0, 1)
    for c in coeffs:
        out, cur = out + c * cur, P @ cur
    return out.transpose(0, 1)


# ---------------------------------------------------------------------------- bugs: sparse entry points
def _device_calls():
    q, k, v = (_rand(N, H, C, seed=s) for s in (1, 2, 3))
    meta = EDGES.to("meta")
    w = torch.rand(EDGES.shape[1], H, dtype=f64)
    return {
        "diffuse_sparse csr": (lambda: diffuse_sparse(q, k, v, meta, [0.0, 1.0], backend="csr"), "edge_index", "q"),
        "diffuse_sparse native": (lambda: diffuse_sparse(q, k, v, meta, [0.5, 0.5, 0.0], backend="native"),
                                  "edge_index", "q"),
        "diffuse_sparse causal": (lambda: diffuse_sparse(q, k, v, meta, [0.0, 1.0], is_causal=True), "edge_index", "q"),
        "edge_attention": (lambda: edge_attention(q, k, meta), "edge_index", "q"),
        "propagate_sparse edge_index": (lambda: propagate_sparse(w, v, meta), "edge_index", "x"),
        "propagate_sparse weights": (lambda: propagate_sparse(w.to("meta"), v, EDGES, backend="native"),
                                     "weights", "x"),
    }


@pytest.mark.parametrize("call", sorted(_device_calls()))
def test_bug_sparse_entry_points_name_an_edge_index_on_another_device(call):
    """Bug: an ``edge_index`` (or ``propagate_sparse``'s ``weights``) on another device than the features failed
    inside the kernels: "Values and crow_indices need to be on the same device" (CSR), "index_add(): self, index
    and source expected to be in the same device" (gather-scatter). Now a ValueError names the argument and both
    devices (a meta tensor stands in for an accelerator)."""
    fn, name, like = _device_calls()[call]
    with pytest.raises(ValueError, match=rf"^{name} must be on the device of {like} \(cpu\), got meta$"):
        fn()


def test_bug_need_weights_names_a_numpy_bool():
    """Bug: ``need_weights=np.bool_(True)`` said "need_weights must be a bool, got np.True_", which does not name the
    type; the message now says ``numpy.bool`` as the other flags do (numpy bools stay refused)."""
    q = _rand(N, H, C, seed=4)
    with pytest.raises(TypeError, match=r"^need_weights must be a bool, got numpy\.bool_? \(np\.True_\)$"):
        diffuse_sparse_with_weights(q, q, q, EDGES, [0.0, 1.0], need_weights=np.bool_(True))


# ---------------------------------------------------------------------------- bugs: scatter primitives
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_bug_segment_softmax_refuses_scores_that_are_not_floating_point(dtype):
    """Bug: ``segment_softmax(torch.tensor([1, 2, 3]), index, 2)`` returned an int64 tensor: every weight
    truncated to 0 or 1 (a row with two equal scores summed to 0). It now raises a TypeError naming the dtype."""
    with pytest.raises(TypeError, match=rf"src must be floating-point scores, got {dtype}"):
        segment_softmax(torch.tensor([1, 2, 3]).to(dtype), torch.tensor([0, 1, 1]), 2)


@pytest.mark.parametrize("fn", [scatter_sum, scatter_max, segment_softmax], ids=lambda f: f.__name__)
def test_bug_scatter_primitives_name_bad_arguments(fn):
    """Bug: a list or 0-d ``src`` gave ``AttributeError``/``IndexError: tuple index out of range``, a list ``index``
    ``AttributeError: 'list' object has no attribute 'dim'``, an ``index`` on another device a bare index_add
    error, ``dim_size=2.0`` "new_zeros(): argument 'size' must be tuple of ints", ``dim_size="2"`` a comparison
    TypeError and ``dim_size=True`` was read as 1; a misspelt back-end got no "did you mean"."""
    src, index = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 1, 0])
    with pytest.raises(TypeError, match=r"src must be a tensor of shape \(E, \*\) \(at least 1-D\), got list"):
        fn([1.0, 2.0, 3.0], index, 2)
    with pytest.raises(TypeError, match=r"src must be a tensor of shape \(E, \*\) \(at least 1-D\), got \(\)"):
        fn(torch.tensor(1.0), torch.tensor([0]), 2)
    with pytest.raises(TypeError, match=r"index must be an integer tensor of shape \(E,\), got list"):
        fn(src, [0, 1, 0], 2)
    with pytest.raises(ValueError, match=r"index must be on the device of src \(cpu\), got meta"):
        fn(src, index.to("meta"), 2)
    for bad, shown in ((2.0, r"float \(2\.0\)"), ("2", r"str \('2'\)"), (True, r"bool \(True\)")):
        size_name = "num_nodes" if fn is segment_softmax else "dim_size"
        with pytest.raises(TypeError, match=rf"{size_name} must be an int, got {shown}"):
            fn(src, index, bad)
    with pytest.raises(ValueError, match=r"got 'nativ' \(did you mean 'native'\?\)"):
        fn(src, index, 2, backend="nativ")
    torch.testing.assert_close(fn(src, index, np.int64(2)), fn(src, index, 2), rtol=0, atol=0)  # numpy ints stay


# ---------------------------------------------------------------------------- bugs: uniform map
def test_bug_uniform_mean_refuses_an_integer_x_and_names_a_bad_key_mask():
    """Bug: ``uniform_mean`` of an integer ``x`` returned truncated integer means (``[1, 2]`` averaged to 1), a
    bool ``x`` came back bool; a list ``x`` or ``key_mask`` raised ``AttributeError`` and a ``key_mask`` on another
    device failed inside the product. Each is now a TypeError or ValueError naming the argument."""
    with pytest.raises(TypeError, match="x must be a floating-point tensor, got torch.int64"):
        uniform_mean(torch.tensor([1, 2]).view(1, 1, 2, 1))
    with pytest.raises(TypeError, match="x must be a floating-point tensor, got torch.bool"):
        uniform_mean(torch.ones(1, 1, 2, 1, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor of shape \(B, G, M, C\), got list"):
        uniform_mean([[[[1.0]]]])
    x = _rand(2, 1, 3, 2, seed=5)
    with pytest.raises(TypeError, match=r"key_mask must be a bool tensor of shape \(B, G, 1, M\) or None, got list"):
        uniform_mean(x, [[[[True, True, False]]]])
    with pytest.raises(ValueError, match=r"key_mask must be on the device of x \(cpu\), got meta"):
        uniform_mean(x, torch.ones(1, 1, 1, 3, dtype=torch.bool, device="meta"))


# ---------------------------------------------------------------------------- bugs: edge features
def _edge_layer():
    return DiffusionAttention(H * C, H, heads="heat").double().eval()


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_bug_edge_feature_attention_refuses_edge_keys_that_are_not_floating_point(dtype):
    """Bug: integer or bool ``edge_keys`` (raw edge attributes passed where ``W_e e_ij`` belongs) were added to the
    float keys by type promotion and gave an output without a word; now a TypeError names ``edge_keys``."""
    x = _rand(N, H * C, seed=6)
    with pytest.raises(TypeError, match=rf"edge_keys must be floating point .*got {dtype}"):
        edge_feature_attention(_edge_layer(), x, EDGES, torch.ones(EDGES.shape[1], H * C, dtype=dtype))


@pytest.mark.parametrize("name", ["edge_index", "edge_keys"])
def test_bug_edge_feature_attention_names_inputs_on_another_device(name):
    """Bug: ``edge_index`` on another device than ``x`` failed inside ``index_add`` ("self, index and source expected
    to be in the same device"), ``edge_keys`` there with "Tensor on device meta is not on the expected device cpu!"."""
    x = _rand(N, H * C, seed=7)
    ei, ek = EDGES, torch.zeros(EDGES.shape[1], H * C, dtype=f64)
    args = (ei.to("meta"), ek) if name == "edge_index" else (ei, ek.to("meta"))
    with pytest.raises(ValueError, match=rf"^{name} must be on the device of x \(cpu\), got meta$"):
        edge_feature_attention(_edge_layer(), x, *args)


def test_bug_edge_feature_attention_names_a_bad_width_a_bad_flag_and_a_bad_layer():
    """Bug: an ``x`` of the wrong width failed in the projection ("mat1 and mat2 shapes cannot be multiplied")
    where the layer itself says "x must have last dimension dim=..."; ``return_weights="no"`` (any truthy value)
    returned a tuple, a numpy bool was taken; a layer of another type raised ``AttributeError: '_check_plan'``."""
    layer, ek = _edge_layer(), torch.zeros(EDGES.shape[1], H * C + 1, dtype=f64)
    with pytest.raises(ValueError, match=rf"x must have last dimension dim={H * C}, got shape \({N}, {H * C + 1}\)"):
        edge_feature_attention(layer, _rand(N, H * C + 1, seed=8), EDGES, ek)
    x, ek = _rand(N, H * C, seed=9), torch.zeros(EDGES.shape[1], H * C, dtype=f64)
    with pytest.raises(TypeError, match=r"return_weights must be a bool, got str \('no'\)"):
        edge_feature_attention(layer, x, EDGES, ek, return_weights="no")
    with pytest.raises(TypeError, match=r"return_weights must be a bool, got numpy\.bool_? \(np\.True_\)"):
        edge_feature_attention(layer, x, EDGES, ek, return_weights=np.bool_(True))
    with pytest.raises(TypeError, match="layer must be a DiffusionAttention, got Linear"):
        edge_feature_attention(torch.nn.Linear(H * C, H * C), x, EDGES, ek)
    y, P = edge_feature_attention(layer, x, EDGES, ek, return_weights=True)  # a Python bool still works
    assert y.shape == (N, H * C) and P.shape == (EDGES.shape[1], H)


# ---------------------------------------------------------------------------- bugs: interop
@pytest.mark.parametrize("build", ["from_pyg", "from_edge_index", "from_networkx"])
def test_bug_numpy_bool_self_loops_names_its_type(build):
    """Bug: ``self_loops=np.bool_(True)`` was refused with "... True or False, got np.True_", which names no type;
    the message now says ``numpy.bool`` (numpy bools stay refused, Python bools work)."""
    import networkx as nx

    call = {"from_pyg": lambda f: from_pyg(Data(edge_index=EDGES, num_nodes=N), self_loops=f),
            "from_edge_index": lambda f: from_edge_index(EDGES, N, self_loops=f),
            "from_networkx": lambda f: from_networkx(nx.path_graph(3), self_loops=f)}[build]
    with pytest.raises(TypeError, match=r"True or False, got numpy\.bool_? \(np\.True_\)$"):
        call(np.bool_(True))
    assert call(True).edge_index.shape[0] == 2


def test_bug_self_loops_on_a_meta_edge_index_is_a_clear_error():
    """Bug: ``from_edge_index(meta_edges, N, self_loops=True, checked=False)`` (an unchecked graph may live on the
    meta device) failed inside PyG's ``remove_self_loops`` with a NotImplementedError about ``torch.nonzero``'s
    meta registration; now a ValueError says the self loops need the edge values."""
    with pytest.raises(ValueError, match=r"self_loops=True needs the values of edge_index, which is on the meta"):
        from_edge_index(EDGES.to("meta"), N, self_loops=True, checked=False)
    assert from_edge_index(EDGES.to("meta"), N, checked=False).edge_index.is_meta  # without self_loops it is built


# ---------------------------------------------------------------------------- working edge cases
@pytest.mark.parametrize("backend", ["csr", "native"])
def test_sparse_matches_explicit_float64_on_awkward_edge_lists(backend):
    """Unsorted edges, a self loop, duplicates, isolated targets, int32 and non-contiguous ``edge_index`` and
    non-contiguous features all match the explicit dense ``P`` built from the edge list; isolated targets output
    ``c_0 v``."""
    q, k, v = (_rand(N, H, C, seed=s) for s in (10, 11, 12))
    coeffs = [0.3, -0.5, 0.2]
    ref = _reference(q, k, v, EDGES, coeffs)
    for ei in (EDGES, EDGES.int(), EDGES.t().contiguous().t()):
        torch.testing.assert_close(diffuse_sparse(q, k, v, ei, coeffs, backend=backend), ref, rtol=0, atol=1e-12)
    qn = q.transpose(0, 1).contiguous().transpose(0, 1)
    torch.testing.assert_close(diffuse_sparse(qn, k, v, EDGES, coeffs, backend=backend), ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(ref[[3, 5]], 0.3 * v[[3, 5]], rtol=0, atol=0)
    P = _dense_p(q, k, EDGES, N)
    w = edge_attention(q, k, EDGES, backend=backend)  # per edge; a duplicate's two entries add up in P
    got = torch.zeros(H, N, N, dtype=f64)
    for h in range(H):
        got[h].index_put_((EDGES[1], EDGES[0]), w[:, h], accumulate=True)
    torch.testing.assert_close(got, P, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", ["csr", "native"])
def test_sparse_gradcheck_with_duplicates_beyond_the_matrix_cells(backend):
    """float64 gradcheck of ``diffuse_sparse`` (learned coefficients too) and ``propagate_sparse`` on a graph whose
    duplicates outnumber the cells of ``P`` (the CSR kernels' dense fallback) and on the awkward edge list."""
    dup = torch.tensor([[0, 0, 0, 0, 0, 1, 1], [1, 1, 1, 1, 0, 0, 0]])
    for ei, n in ((dup, 2), (EDGES, N)):
        q, k, v = (_rand(n, H, C, seed=s, requires_grad=True) for s in (13, 14, 15))
        c = _rand(H, 3, seed=16, requires_grad=True)
        assert gradcheck(lambda q, k, v, c: diffuse_sparse(q, k, v, ei, c, backend=backend), (q, k, v, c))
        w = torch.rand(ei.shape[1], H, dtype=f64).requires_grad_()
        assert gradcheck(lambda w, v: propagate_sparse(w, v, ei, backend=backend), (w, v))


def test_segment_softmax_matches_pyg_and_gives_zero_rows_for_all_minus_inf():
    """``segment_softmax`` equals ``torch_geometric.utils.softmax``; a target whose scores are all ``-inf`` gets zero
    weights and zero gradients where PyG gives NaN; half precision comes back in its dtype."""
    s, index = _rand(9, 3, seed=17), torch.tensor([2, 0, 2, 2, 0, 4, 4, 4, 0])
    torch.testing.assert_close(segment_softmax(s, index, 6), pyg_softmax(s, index, num_nodes=6), rtol=0, atol=1e-15)
    s = s.clone()
    s[index == 2] = float("-inf")
    s.requires_grad_()
    w = segment_softmax(s, index, 6)
    assert torch.equal(w[index == 2], torch.zeros(3, 3, dtype=f64))
    torch.testing.assert_close(w[index != 2], pyg_softmax(s, index, num_nodes=6)[index != 2], rtol=0, atol=1e-15)
    (w * _rand(9, 3, seed=18)).sum().backward()
    assert torch.isfinite(s.grad).all() and torch.equal(s.grad[index == 2], torch.zeros(3, 3, dtype=f64))
    for dtype in (torch.float16, torch.bfloat16):
        assert segment_softmax(s.detach()[index != 2].to(dtype), index[index != 2], 6).dtype == dtype


def test_layer_equals_transformer_conv_on_awkward_edges_and_pyg_batches():
    """``DiffusionAttention.from_transformer_conv`` equals ``TransformerConv`` (unsorted, duplicate, self-loop,
    int32 edges, isolated targets; a PyG ``Batch`` through ``from_pyg``), and ``edge_feature_attention`` with
    ``W_e e_ij`` from a ``TransformerConv(edge_dim=...)`` gives that convolution's attention weights."""
    torch.manual_seed(0)
    D = H * C
    conv = TransformerConv(D, C, heads=H, root_weight=False).double()
    layer = DiffusionAttention.from_transformer_conv(conv).eval()
    x = _rand(N, D, seed=19)
    want = conv(x, EDGES)
    for ei in (EDGES, EDGES.int()):
        torch.testing.assert_close(layer(x, edge_index=ei), want, rtol=0, atol=1e-12)
    batch = Batch.from_data_list([Data(x=_rand(3, D, seed=20), edge_index=torch.tensor([[0, 1, 2], [1, 2, 0]])),
                                  Data(x=_rand(4, D, seed=21), edge_index=torch.tensor([[0, 3, 3], [3, 3, 3]]))])
    g = from_pyg(batch)
    assert g.batch_size == 2 and torch.equal(g.batch, batch.batch)
    torch.testing.assert_close(layer(batch.x, g), conv(batch.x, batch.edge_index), rtol=0, atol=1e-12)
    conv_e = TransformerConv(D, C, heads=H, root_weight=False, edge_dim=4).double()
    attr = _rand(EDGES.shape[1], 4, seed=22)
    _, (_, alpha) = conv_e(x, EDGES, attr, return_attention_weights=True)
    plain = DiffusionAttention(D, H).double().eval()
    with torch.no_grad():
        plain.qkv.weight.copy_(torch.cat([conv_e.lin_query.weight, conv_e.lin_key.weight, conv_e.lin_value.weight]))
        plain.qkv.bias.copy_(torch.cat([conv_e.lin_query.bias, conv_e.lin_key.bias, conv_e.lin_value.bias]))
    _, P = edge_feature_attention(plain, x, EDGES, conv_e.lin_edge(attr), return_weights=True)
    torch.testing.assert_close(P, alpha, rtol=0, atol=1e-12)


def test_pyg_batch_with_an_empty_graph_round_trips_through_dense():
    """A PyG ``Batch`` holding a graph without nodes and one without edges keeps its graph count, and its dense
    form converts back to the same edges (``to_dense`` / ``to_sparse``)."""
    graphs = [Data(x=torch.randn(2, 2), edge_index=torch.tensor([[0], [1]])),
              Data(x=torch.zeros(0, 2), edge_index=torch.zeros(2, 0, dtype=torch.long)),
              Data(x=torch.randn(3, 2), edge_index=torch.tensor([[2, 0], [1, 1]]))]
    batch = Batch.from_data_list(graphs)
    g = from_pyg(batch)
    assert g.batch_size == 3 and g.num_nodes == 5
    d = from_pyg(batch, layout="dense")
    assert d.batch_size == 3 and bool(d.key_padding_mask[1].all())
    back = d.to_sparse()
    # node b * N_max + i of the dense form is node ptr[b] + i of the batch
    ptr = batch.ptr
    n_max = d.seq_len
    remap = torch.cat([torch.arange(ptr[b], ptr[b + 1]) - ptr[b] + b * n_max for b in range(3)])
    assert sorted(map(tuple, remap[g.edge_index].t().tolist())) == sorted(map(tuple, back.edge_index.t().tolist()))
