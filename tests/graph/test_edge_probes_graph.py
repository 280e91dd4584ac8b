"""Edge-case probes of the graph package, rotary embeddings and the KV cache, against float64 references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from diffusionformer import DiffusionAttention
from diffusionformer.graph import AttentionGraph, complete, from_networkx, from_pyg, grid_layout, knn
from diffusionformer.nn import LayerKVCache, RotaryEmbedding, attend_cached
from diffusionformer.nn.rotary import apply_rotary


def _knn_reference(x: torch.Tensor, metric: str = "euclidean") -> np.ndarray:
    """Brute-force float64 distances ``(N, N)`` with an infinite diagonal."""
    xd = x.double().numpy()
    if metric == "euclidean":
        d = np.sqrt(((xd[:, None, :] - xd[None, :, :]) ** 2).sum(-1))
    else:
        u = xd / np.linalg.norm(xd, axis=1, keepdims=True)
        d = 1.0 - u @ u.T
    np.fill_diagonal(d, np.inf)
    return d


@pytest.mark.parametrize("offset", [1e3, 1e4])
def test_knn_far_from_origin_matches_float64_brute_force(offset: float) -> None:
    """Bug: for N > 25 points far from the origin (coordinates around 1000) knn returned wrong neighbours
    for almost every node (27 of 30): cdist's |x|^2 + |y|^2 - 2 x.y form cancelled in float32."""
    x = offset + torch.rand(30, 3, generator=torch.Generator().manual_seed(0))
    e = knn(x, 2).edge_index
    d = _knn_reference(x)
    want = np.sort(d, axis=1)[:, :2]  # the two smallest distances of every node
    got = np.sort(d[e[1].numpy(), e[0].numpy()].reshape(30, 2), axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_knn_huge_coordinates_never_pick_the_point_itself() -> None:
    """Bug: finite float32 features around 1e20 overflowed every squared distance to inf, which tied with
    the masked self entry: node 0 was its own nearest neighbour."""
    x = torch.tensor([[1e20], [3e20], [-5e20]])
    e = knn(x, 1).edge_index
    assert bool((e[0] != e[1]).all())
    d = _knn_reference(x)
    assert e[0].tolist() == d.argmin(1).tolist() == [1, 0, 0]


def test_knn_cosine_tiny_vector_is_scale_invariant() -> None:
    """Bug: a vector of norm below 1e-12 was normalised to a norm below 1 (F.normalize's eps), so an
    exactly parallel tiny vector lost to a non-parallel one under the cosine metric."""
    x = torch.tensor([[1.0, 0.0], [1e-13, 0.0], [1.0, 0.5]])
    e = knn(x, 1, metric="cosine").edge_index
    assert e[0].tolist() == _knn_reference(x, "cosine").argmin(1).tolist() == [1, 0, 0]


def test_knn_meta_x_is_a_clear_error() -> None:
    """Bug: a meta x raised 'Tensor.item() cannot be called on meta tensors' from inside the size checks."""
    with pytest.raises(ValueError, match="x is on the meta device"):
        knn(torch.zeros(4, 2, device="meta"), 1)


def test_sparse_meta_edge_index_is_a_clear_error() -> None:
    """Bug: a checked sparse graph on the meta device (also AttentionGraph.to('meta') and
    from_networkx(device='meta')) raised 'Tensor.item() cannot be called on meta tensors'."""
    with pytest.raises(ValueError, match="edge_index is on the meta device.*checked=False"):
        AttentionGraph.sparse(torch.tensor([[0], [1]], device="meta"), 2)
    assert AttentionGraph.sparse(torch.tensor([[0], [1]], device="meta"), 2, checked=False).num_nodes == 2


@pytest.mark.parametrize("batch_size, batch, match", [
    (0, torch.tensor([0, 0]), "batch_size must be >= 1, got 0"),
    (3, None, "batch_size=3 graphs needs a batch vector"),
])
def test_unchecked_sparse_graph_checks_batch_size(batch_size: int, batch, match: str) -> None:
    """Bug: checked=False (which should skip only the host-syncing value checks) accepted batch_size=0, or a
    batch_size of several graphs without a batch vector, and the repr showed 'graphs=0'."""
    with pytest.raises(ValueError, match=match):
        AttentionGraph.sparse(torch.tensor([[0], [1]]), 2, batch=batch, batch_size=batch_size, checked=False)


def test_from_pyg_self_loops_refuses_a_one_dimensional_edge_index() -> None:
    """Bug: from_pyg(..., self_loops=True) handed a (2,) edge_index to PyG's self-loop utilities, which read it
    as edges: a graph with 4 edges came back instead of an error."""
    with pytest.raises(ValueError, match=r"edge_index must have shape \(2, E\), got \(2,\)"):
        from_pyg(Data(edge_index=torch.tensor([0, 1]), num_nodes=3), self_loops=True)


def test_builder_key_padding_mask_as_list_is_a_type_error() -> None:
    """Bug: complete(2, key_padding_mask=[[False, True]]) raised AttributeError: 'list' object has no
    attribute 'device'."""
    with pytest.raises(TypeError, match="key_padding_mask must be a bool tensor of shape \\(B, N\\), got list"):
        complete(2, key_padding_mask=[[False, True]])


def test_grid_layout_cls_token_must_be_a_bool() -> None:
    """Bug: grid_layout(2, 2, cls_token="no") added a class token (any truthy value did), while grid() refuses it."""
    with pytest.raises(TypeError, match="cls_token must be a bool, got str"):
        grid_layout(2, 2, cls_token="no")


def _rotate_reference(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Explicit float64 2x2 rotations of the channel pairs."""
    out = x.double().clone()
    for n in range(x.shape[-3]):
        for i in range(x.shape[-1] // 2):
            c, s = math.cos(float(angles[n, i])), math.sin(float(angles[n, i]))
            a, b = x[..., n, :, 2 * i].double(), x[..., n, :, 2 * i + 1].double()
            out[..., n, :, 2 * i], out[..., n, :, 2 * i + 1] = a * c - b * s, a * s + b * c
    return out


@pytest.mark.parametrize("dtype", [torch.long, torch.bool, torch.complex64])
def test_apply_rotary_refuses_non_floating_x(dtype: torch.dtype) -> None:
    """Bug: an integer x came back unrotated garbage (cos and sin cast to int: 1 and 0, or 0 and 0), a complex x
    was rotated as if real, and a bool x failed with 'Subtraction ... with two bool tensors is not supported'."""
    angles = torch.tensor([[0.0], [1.0], [2.0]])
    with pytest.raises(TypeError, match="expected floating-point x"):
        apply_rotary(torch.ones(3, 1, 2, dtype=dtype), angles)
    with pytest.raises(TypeError, match="expected floating-point x"):
        RotaryEmbedding(2)(torch.ones(3, 1, 2, dtype=dtype))


@pytest.mark.parametrize("shape, angles_shape, match", [
    ((2, 8), (2, 4), r"x of shape \(\.\.\., N, H, C\) with C even, got \(2, 8\)"),
    ((2, 1, 7), (2, 3), r"C even, got \(2, 1, 7\)"),
    ((2, 1, 8), (2, 1, 4), r"angles of shape \(N, C/2\) = \(2, 4\), got \(2, 1, 4\)"),
])
def test_apply_rotary_shape_errors_name_the_shapes(shape, angles_shape, match: str) -> None:
    """Bug: a 2-D x raised IndexError 'tuple index out of range'; an odd C said 'expected angles (2, 3), got
    (2, 3)'; angles (N, 1, C/2) were accepted and broadcast into a wrong output shape."""
    with pytest.raises(ValueError, match=match):
        apply_rotary(torch.randn(*shape), torch.zeros(*angles_shape))


def test_rotary_matches_explicit_float64_rotation_at_large_positions() -> None:
    """Pins: positions far beyond any sequence length (2**40, negative, fractional) rotate exactly like the
    float64 2x2 rotation by m * base^(-2i/C)."""
    x = torch.randn(2, 4, 3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    pos = torch.tensor([0.0, 2.0**40, -7.0, 3.5], dtype=torch.float64)
    angles = pos[:, None] * 10000.0 ** (-torch.arange(0, 6, 2, dtype=torch.float64) / 6)
    torch.testing.assert_close(RotaryEmbedding(6)(x, pos), _rotate_reference(x, angles), atol=1e-12, rtol=0)


def _causal_layer() -> DiffusionAttention:
    torch.manual_seed(0)
    return DiffusionAttention(16, 4, heads="attention:2,heat(t=0.5, steps=3):2", causal=True,
                              rotary=RotaryEmbedding(4)).double().eval()


def test_attend_cached_bad_x_is_named() -> None:
    """Bug: attend_cached with an integer x or a wrong feature size failed with bare matmul errors
    ('mat1 and mat2 must have the same dtype' / 'shapes cannot be multiplied')."""
    layer = _causal_layer()
    with pytest.raises(TypeError, match="expected floating-point x, got dtype torch.int64"):
        attend_cached(layer, torch.zeros(1, 2, 16, dtype=torch.long), LayerKVCache())
    with pytest.raises(ValueError, match=r"expected x of shape \(B, n, D\), got \(1, 2, 8\); this layer has D=16"):
        attend_cached(layer, torch.zeros(1, 2, 8, dtype=torch.float64), LayerKVCache())


def test_attend_cached_refuses_a_cache_of_another_dtype() -> None:
    """Bug: converting the layer to float32 after a float64 prefill failed inside a product with
    'expected scalar type Float but found Double'; now the cache is named, and a new cache works."""
    layer = _causal_layer()
    x = torch.randn(1, 4, 16, dtype=torch.float64)
    cache = LayerKVCache()
    attend_cached(layer, x[:, :3], cache)
    layer.float()
    with pytest.raises(ValueError, match="cache holds torch.float64 keys on cpu, the layer now gives torch.float32"):
        attend_cached(layer, x[:, 3:].float(), cache)
    assert attend_cached(layer, x.float(), LayerKVCache()).dtype == torch.float32


def test_from_networkx_round_trip_keeps_isolated_nodes_and_self_loops() -> None:
    """Pins: networkx -> AttentionGraph -> to_networkx keeps every node (isolated ones too) and self loops."""
    import networkx as nx

    from diffusionformer.graph import to_networkx

    G = nx.DiGraph([(0, 0), (0, 1), (2, 1)])
    G.add_node(3)
    H = to_networkx(from_networkx(G))
    assert sorted(H.nodes) == [0, 1, 2, 3] and set(H.edges) == {(0, 0), (0, 1), (2, 1)}
