"""Edge probes: zero-size inputs through the public entry points (empty batch, no token, no key, no node).

Expected of each: what torch's analogous op gives (``torch.softmax`` / ``scaled_dot_product_attention`` /
``nn.Linear`` on a zero-size input: an empty output of the right shape and dtype, gradients defined), or a
clear error naming the argument; never a bare internal error.
"""

from __future__ import annotations

import pytest
import torch

import diffusionformer.functional as F
from diffusionformer import DiffusionAttention
from diffusionformer.nn import Block
from diffusionformer.ops.rivals import LayerState


@pytest.mark.parametrize("N, M", [(0, 0), (3, 0), (0, 3)])
def test_bug_dense_attention_reference_of_no_key_is_the_empty_softmax(N: int, M: int) -> None:
    """Bug: ``dense_attention_reference`` of keys ``(..., 0, C)`` raised the bare ``IndexError: amax(): Expected
    reduction dim -1 to have non-zero size`` (its row maximum over no entry); ``torch.softmax`` of the
    ``(..., N, 0)`` scores, and the package's own ``attention_matrix``, give the empty ``(..., N, 0)`` matrix."""
    q = torch.randn(2, 3, N, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, M, 4, dtype=torch.float64, requires_grad=True)
    expected = torch.softmax(q.detach() @ k.detach().transpose(-2, -1) / 2.0, dim=-1)
    for allowed in (None, torch.ones(N, M, dtype=torch.bool)):
        P = F.dense_attention_reference(q, k, allowed=allowed)
        assert P.shape == expected.shape == (2, 3, N, M) and P.dtype == torch.float64
        torch.testing.assert_close(P, expected)
        torch.testing.assert_close(P, F.attention_matrix(q, k, attn_mask=allowed))
        P.sum().backward()
        assert q.grad is not None and q.grad.shape == q.shape and k.grad is not None and k.grad.shape == k.shape
        q.grad = k.grad = None
    with pytest.raises(RuntimeError):  # a mask of the wrong shape is still refused, without keys too
        F.dense_attention_reference(q, k, allowed=torch.ones(N + 1, M + 2, dtype=torch.bool))


def test_bug_dense_attention_reference_default_scale_of_no_channel_is_named() -> None:
    """Bug: ``dense_attention_reference`` of ``q``, ``k`` with ``C = 0`` channels raised the bare
    ``ZeroDivisionError: 0.0 cannot be raised to a negative power`` (its default scale ``C ** -0.5``); it is now
    a ``ValueError`` naming the shape and ``scale=``. With an explicit scale the scores are all zero and every
    row is uniform, as ``torch.softmax`` of zeros."""
    q = torch.zeros(2, 5, 0)
    with pytest.raises(ValueError, match=r"C >= 1.*\(2, 5, 0\).*scale="):
        F.dense_attention_reference(q, q)
    torch.testing.assert_close(F.dense_attention_reference(q, q, scale=1.0),
                               torch.full((2, 5, 5), 0.2, dtype=torch.float64))


@pytest.mark.parametrize("kw", [{}, {"heads": "heat:2,laplacian:2"}, {"causal": True}, {"num_kv_heads": 2},
                                {"heads": "neutreno:2,value-residual:2"}, {"heads": "differential:4"}])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_bug_sparse_layer_of_no_node_gives_an_empty_output(kw: dict, index_dtype: torch.dtype) -> None:
    """Bug: ``DiffusionAttention(x, edge_index=...)`` with ``x`` of shape ``(0, D)`` and ``(2, 0)`` edges raised
    ``num_nodes must be >= 1, got 0`` (an argument the call never gave: the ``AttentionGraph`` the shorthand
    builds), while the same layer maps a dense ``(B, 0, D)`` or ``(0, N, D)`` input to an empty output, the
    functional ``diffuse_sparse`` and ``edge_feature_attention`` map no node to none, and PyG's
    ``TransformerConv`` (as ``nn.Linear``) gives ``(0, out)``. Now ``(0, D)`` out, with gradients, also through
    a :class:`~diffusionformer.nn.Block`."""
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, **kw)
    x = torch.randn(0, 16, requires_grad=True)
    ei = torch.zeros(2, 0, dtype=index_dtype)
    state = LayerState()  # the context operators' first-layer values, of no node
    y, inter = layer(x, edge_index=ei, return_intermediates=True, state=state)
    assert state.depth == 1
    assert y.shape == (0, 16) and y.dtype == x.dtype
    assert inter.attn_weights.shape == (0, 4) and inter.edge_index.shape == (2, 0)
    torch.testing.assert_close(y, layer.out_proj(torch.zeros(0, 16)))  # as nn.Linear on no row
    (y.sum() + inter.attn_weights.sum()).backward()
    assert x.grad is not None and x.grad.shape == (0, 16)
    for p in layer.parameters():  # defined and zero, as an nn.Linear's on an empty batch
        assert p.grad is None or not p.grad.any()
    block = Block(16, 4, **kw)
    xb = torch.randn(0, 16, requires_grad=True)
    out = block(xb, edge_index=ei)
    assert out.shape == (0, 16)
    out.sum().backward()
    assert xb.grad is not None and xb.grad.shape == (0, 16)


def test_bug_sparse_layer_of_no_node_still_checks_its_edges() -> None:
    """Bug (same fix as above, its checks): the ``(0, D)`` route to the kernel keeps the errors of a graph with
    nodes: an edge with no node to point at, a float or ``(3, E)`` ``edge_index``, dense shorthands."""
    layer = DiffusionAttention(16, 4)
    x = torch.randn(0, 16)
    with pytest.raises(ValueError, match=r"edge_index values must lie in \[0, num_nodes=0\)"):
        layer(x, edge_index=torch.tensor([[0], [0]]))
    with pytest.raises(TypeError, match="edge_index"):
        layer(x, edge_index=torch.zeros(2, 0))
    with pytest.raises(ValueError, match=r"edge_index must have shape \(2, E\)"):
        layer(x, edge_index=torch.zeros(3, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="apply to dense inputs"):
        layer(x, edge_index=torch.zeros(2, 0, dtype=torch.long), is_causal=True)
    with pytest.raises(ValueError, match="heat-exact"):
        DiffusionAttention(16, 4, heads="heat-exact:4")(x, edge_index=torch.zeros(2, 0, dtype=torch.long))


@pytest.mark.parametrize("backend", ["sdpa", "matrix"])
def test_pins_propagate_dense_and_diffuse_of_zero_sizes_match_sdpa(backend: str) -> None:
    """Pin: ``propagate_dense`` of no key gives the zero rows ``scaled_dot_product_attention`` gives (a query
    with nothing to attend), and ``diffuse`` of an empty batch or no token gives sdpa's empty output, in the
    input's dtype, with gradients of the inputs' shapes."""
    q = torch.randn(2, 3, 4, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 0, 8, dtype=torch.float64)
    v = torch.randn(2, 3, 0, 5, dtype=torch.float64)
    out = F.propagate_dense(q, k, v)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v))
    assert out.shape == (2, 3, 4, 5) and not out.any()
    for shape in [(0, 3, 4, 8), (2, 3, 0, 8)]:
        q = torch.randn(*shape, requires_grad=True)
        k = torch.randn(*shape, requires_grad=True)
        v = torch.randn(*shape[:-1], 6, requires_grad=True)
        y = F.diffuse(q, k, v, [0.5, 0.5], backend=backend)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        assert y.shape == ref.shape and y.dtype == ref.dtype
        y.sum().backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


@pytest.mark.parametrize("shape", [(0, 3, 4, 4), (5, 3, 0, 4)])
def test_bug_normalize_channels_of_an_empty_training_split_is_refused(shape: tuple[int, ...]) -> None:
    """Bug: ``normalize_channels`` of an ``x_train`` with no pixel (an empty training split) returned mean 0 and
    std 1 as "its training statistics" and left the val/test images as they were (standardised by nothing),
    silently; the mean of no value is undefined (``torch.mean`` of an empty tensor is NaN). It is now a
    ``ValueError`` naming ``x_train`` and its shape, before anything is modified."""
    from diffusionformer.data.splits import normalize_channels

    val = torch.randn(4, 3, 4, 4) * 3 + 2
    before = val.clone()
    with pytest.raises(ValueError, match=r"x_train holds no pixel \(shape \(" + ", ".join(map(str, shape)) + r"\)\)"):
        normalize_channels(torch.zeros(shape), val)
    torch.testing.assert_close(val, before, rtol=0, atol=0)


@pytest.mark.parametrize("kw", [{}, {"global_attention": True}, {"edge_dim": 3}, {"heads": "neutreno:4"}])
@pytest.mark.parametrize("sizes", [{}, {"max_num_nodes": 3, "num_graphs": 2}])
@pytest.mark.parametrize("with_batch", [False, True])
def test_bug_graph_block_of_no_node_gives_an_empty_output(kw: dict, sizes: dict, with_batch: bool) -> None:
    """Bug: the public ``GraphBlock`` on ``x`` of shape ``(0, D)`` with a bare ``(2, 0)`` ``edge_index`` raised
    ``num_nodes must be >= 1, got 0`` (from the ``AttentionGraph`` it builds; the call gave no ``num_nodes``),
    where ``DiffusionGraphTransformer`` maps a batch with no node and PyG's convolutions give ``(0, out)``; with
    the fix in the layer alone, its global attention then failed in PyG's ``to_dense_batch`` with the bare
    ``max(): Expected reduction dim to be specified for input.numel() == 0``. Now ``(0, D)``, with gradients; an
    edge with no node to point at is still refused."""
    from diffusionformer.models import GraphBlock

    torch.manual_seed(0)
    block = GraphBlock(16, 4, **kw)
    x = torch.randn(0, 16, requires_grad=True)
    ei = torch.zeros(2, 0, dtype=torch.long)
    batch = torch.zeros(0, dtype=torch.long) if with_batch else None
    edge_attr = torch.zeros(0, 3) if "edge_dim" in kw else None
    if not with_batch and sizes:
        sizes = {"max_num_nodes": 3}  # a call without batch holds one graph
    y = block(x, ei, batch, edge_attr, state=LayerState(), global_state=LayerState(), **sizes)
    assert y.shape == (0, 16) and y.dtype == x.dtype
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == (0, 16)
    with pytest.raises(ValueError, match=r"edge_index values must lie in \[0, num_nodes=0\)"):
        block(x, torch.tensor([[0], [0]]), batch, None if edge_attr is None else torch.zeros(1, 3))
