"""The engine (ops/engine.py): the one loop, the head-subset helpers, back-ends plugged in, the graph as the layer's argument."""

from __future__ import annotations

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.functional import diffuse, diffuse_sparse, diffuse_with_weights
from diffusionformer.graph import AttentionGraph
from diffusionformer.operators import DiffusionOperator
from diffusionformer.ops.engine import (
    Backend,
    active_heads,
    affine,
    affine_runs,
    head_runs,
    polynomial,
    positions,
    select,
    static_coefficients,
)
from diffusionformer.ops.reference import dense_attention_reference
from diffusionformer.testing import complete_edge_index, random_qkv


# ---------------------------------------------------------------------------- head subsets
def test_head_helpers_against_index_select():
    t = torch.randn(2, 7, 3)
    for heads in [(0, 1, 2, 3, 4, 5, 6), (2, 3, 4), (0, 2, 3, 6), (5,)]:
        ref = t.index_select(1, torch.tensor(heads))
        assert torch.equal(select(t, heads, 1), ref)
    assert select(t, (0, 1, 2, 3, 4, 5, 6), 1) is t  # all heads: the tensor itself
    assert select(t, (2, 3, 4), 1).data_ptr() == t[:, 2].data_ptr()  # a run: a view, no copy
    assert head_runs((0, 2, 3, 6)) == ((0, 1), (2, 4), (6, 7))
    assert positions((3, 6), (0, 2, 3, 6)) == (2, 3)
    assert active_heads([3, 0, 2, 3, 1], 2) == (0, 2, 3)
    assert active_heads([3, 0, 2, 3, 1], 2, among=(2, 4)) == (2,)


# ---------------------------------------------------------------------------- the loop
class _Recording(Backend):
    """Explicit float64 ``P``; records the heads of every propagate call."""

    name = "recording"

    def __init__(self, P: torch.Tensor) -> None:
        self.P, self.calls = P, []

    def propagate(self, x, heads):
        self.calls.append(heads)
        assert x.shape[1] == len(heads)  # the loop hands over exactly the heads asked for
        return select(self.P, heads, 1) @ x


def _explicit(P, v, c, degrees):
    """sum_{k <= degree_h} c_{h,k} P_h^k v_h with explicit matrix powers (float64)."""
    out = torch.zeros_like(v)
    for h, d in enumerate(degrees):
        Pk = torch.eye(P.shape[-1], dtype=P.dtype).expand_as(P[:, h])
        for k in range(d + 1):
            out[:, h] += c[h, k] * Pk @ v[:, h]
            Pk = Pk @ P[:, h]
    return out


def test_polynomial_propagates_only_the_heads_that_need_a_step():
    q, k, v = random_qkv(2, 5, 6, 3, seed=0)
    P = dense_attention_reference(q, k)
    c = torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    degrees = (3, 0, 2, 3, 1)
    backend = _Recording(P)
    out = polynomial(backend, v, c, degrees)
    assert backend.calls == [(0, 2, 3, 4), (0, 2, 3), (0, 3)]
    torch.testing.assert_close(out, _explicit(P, v, c, degrees), atol=1e-12, rtol=0)
    # a head subset accumulated into an existing output (how "auto" splits fused and matrix heads)
    backend = _Recording(P)
    part = polynomial(backend, v, c, degrees, heads=(2, 4))
    assert backend.calls == [(2, 4), (2,)]
    expected = _explicit(P, v, c, [degrees[h] if h in (2, 4) else 0 for h in range(5)])
    torch.testing.assert_close(part, expected, atol=1e-12, rtol=0)


def test_a_custom_backend_equals_the_builtin_ones():
    """A back-end written outside the package plugs into the loop and matches diffuse on every back-end."""
    q, k, v = random_qkv(2, 3, 7, 4, seed=2)
    c = torch.tensor([[0.2, 0.5, 0.3], [1.0, -1.0, 0.0], [0.1, 0.2, 0.7]], dtype=torch.float64)
    ours = polynomial(_Recording(dense_attention_reference(q, k, allowed=torch.ones(7, 7).tril().bool())), v, c, (2, 1, 2))
    for backend in ("sdpa", "matrix", "auto"):
        ref = diffuse(q, k, v, c, is_causal=True, backend=backend, degrees=[2, 1, 2])
        torch.testing.assert_close(ours, ref, atol=1e-12, rtol=0)


class _FusedAffine(_Recording):
    fused_affine = True

    def affine(self, v, c0, c1):
        self.calls.append("affine")
        return torch.stack([c0[h] * v[:, h] + c1[h] * (self.P[:, h] @ v[:, h]) for h in range(v.shape[1])], 1)


@pytest.mark.parametrize("degrees,runs", [((1, 2, 4, 4), True), ((1, 1, 3, 3, 2), True), ((3, 0, 2, 3, 1), False)])
def test_mixed_degrees_on_the_fused_kernel_match_float64_gradients_without_zero_filled_copies(degrees, runs):
    """Heads that stop propagating are split off the accumulator in one operation, and the steps that propagate
    the same heads share one selection of ``q`` and ``k``: gradients equal explicit float64 powers of ``P``, and
    the backward pass zero-fills (``slice_backward``) only the unused heads of each dropped power and one ``q``,
    one ``k`` per distinct proper head subset (counted where every step's heads are one run: otherwise the
    selections themselves are concatenations of slices)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    H, K = len(degrees), max(degrees)
    q, k = (t.requires_grad_() for t in random_qkv(2, H, 6, 4, seed=5)[:2])
    v = torch.randn(2, H, 6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(6), requires_grad=True)
    c = torch.randn(H, K + 1, dtype=torch.float64, generator=torch.Generator().manual_seed(7), requires_grad=True)
    out = diffuse(q, k, v, c, degrees=list(degrees), backend="sdpa")
    grad = torch.randn_like(out)

    class ZeroFills(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.shapes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if func.overloadpacket is torch.ops.aten.slice_backward:
                self.shapes.append(tuple(result.shape))
            return result

    spy = ZeroFills()
    with spy:
        got = torch.autograd.grad(out, (q, k, v, c), grad)
    expected = torch.autograd.grad(_explicit(dense_attention_reference(q, k), v, c, degrees), (q, k, v, c), grad)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-10, rtol=0)
    if not runs:
        return
    steps = [active_heads(degrees, s) for s in range(1, K + 1)]
    drops = sum(a != b for a, b in zip(steps, steps[1:]))
    subsets = {s for s in steps if len(s) < H}
    value_fills = [s for s in spy.shapes if len(s) == 4 and s[-1] == 3]  # (B, heads, N, 3): powers of v
    qk_fills = [s for s in spy.shapes if len(s) == 4 and s[-1] == 4]  # (B, H, N, 4): q and k
    assert len(value_fills) == drops  # the unused heads of each dropped power; not the accumulator's two halves
    assert len(qk_fills) == 2 * len(subsets)  # one q and one k per head subset, not per step


def test_affine_pass_composed_or_fused_by_the_backend():
    q, k, v = random_qkv(1, 4, 5, 2, seed=3)
    P = dense_attention_reference(q, k)
    c0, c1 = (0.0, 1.0, 1.0, 0.3), (1.0, -1.0, -1.0, 0.7)
    expected = _explicit(P, v, torch.tensor([c0, c1], dtype=torch.float64).t(), [1] * 4)
    composed = _Recording(P)
    torch.testing.assert_close(affine(composed, v, c0, c1), expected, atol=1e-12, rtol=0)
    assert composed.calls == [(0, 1, 2, 3)]  # one propagation of every head
    fused = _FusedAffine(P)
    torch.testing.assert_close(affine(fused, v, c0, c1), expected, atol=1e-12, rtol=0)
    assert fused.calls == ["affine"]
    assert affine_runs(c0, c1) == ((1, 3, 1.0, -1.0), (3, 4, 0.3, 0.7))


# ---------------------------------------------------------------------------- static coefficients
@pytest.mark.parametrize("backend", ["auto", "sdpa", "matrix"])
def test_static_coefficients_equal_the_tensor_path_dense(backend):
    q, k, v = (t.requires_grad_() for t in random_qkv(2, 3, 6, 4, seed=4))
    mask = torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(5)) > 0.3
    rows = [[0.0, 1.0], [1.0, -1.0], [0.25, 0.75]]
    for degrees in (None, [1, 0, 1]):
        static = diffuse(q, k, v, rows, attn_mask=mask, backend=backend, degrees=degrees)
        loop = diffuse(q, k, v, torch.tensor(rows, dtype=torch.float64), attn_mask=mask, backend=backend,
                       degrees=degrees)
        torch.testing.assert_close(static, loop, atol=1e-12, rtol=0)
        g1 = torch.autograd.grad(static.square().sum(), (q, k, v))
        g2 = torch.autograd.grad(loop.square().sum(), (q, k, v))
        for a, b in zip(g1, g2):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    # degree 0 drops the P term of that head: (0, 1) with degree 0 is the zero map
    out = diffuse(q, k, v, rows, degrees=[0, 1, 1])
    assert torch.equal(out[:, 0], torch.zeros_like(out[:, 0]))


def test_static_coefficients_of_higher_degree_and_weights():
    q, k, v = random_qkv(1, 2, 5, 3, seed=6)
    rows = [[0.1, 0.2, 0.7], [0.5, 0.0, 0.5]]
    out, P = diffuse_with_weights(q, k, v, rows, need_weights=True)
    torch.testing.assert_close(P, dense_attention_reference(q, k), atol=1e-12, rtol=0)
    torch.testing.assert_close(out, _explicit(P, v, torch.tensor(rows, dtype=torch.float64), [2, 2]), atol=1e-12,
                               rtol=0)


@pytest.mark.parametrize("coeffs,err,match", [
    ([[0.0, 1.0], [1.0]], ValueError, "K\\+1 entries"),
    ([[0.0, 1.0]] * 3, ValueError, "3 rows but the inputs have H=2"),
    ([0.0, float("nan")], ValueError, "finite"),
    ([], ValueError, "at least one column"),
    (["a", 1.0], TypeError, "must hold numbers"),
])
def test_static_coefficient_errors(coeffs, err, match):
    with pytest.raises(err, match=match):
        static_coefficients(coeffs, 2)


# ---------------------------------------------------------------------------- sparse
def test_sparse_is_causal_equals_dense_causal():
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in random_qkv(1, 2, 6, 3, seed=7))  # (N, H, C)
    dense = diffuse(*(t.transpose(0, 1)[None] for t in (q, k, v)), [0.3, 0.7], is_causal=True)[0].transpose(0, 1)
    for backend in ("csr", "native"):
        sparse = diffuse_sparse(q, k, v, complete_edge_index(6), [0.3, 0.7], is_causal=True, backend=backend)
        torch.testing.assert_close(sparse, dense, atol=1e-12, rtol=0)


# ---------------------------------------------------------------------------- the graph as the layer's argument
def test_layer_takes_a_graph_and_the_shorthands_build_the_same():
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, "attention:2,heat(t=0.5, steps=3):2").double()
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 5:] = True
    bias = torch.randn(1, 4, 7, 7, dtype=torch.float64)  # additive, per head: SDPA semantics
    g = AttentionGraph.dense(7, key_padding_mask=pad, causal=True, attn_mask=bias)
    expected = layer(x, key_padding_mask=pad, attn_mask=bias.masked_fill(~torch.ones(7, 7).tril().bool(), float("-inf")))
    torch.testing.assert_close(layer(x, g), expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(layer(x, g), layer(x, key_padding_mask=pad, attn_mask=bias, is_causal=True),
                               atol=1e-12, rtol=0)
    window = AttentionGraph.dense(7, window=2)
    torch.testing.assert_close(layer(x, window), layer(x, attn_mask=window.dense_allowed()[0]), atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="not both"):
        layer(x, g, key_padding_mask=pad)
    with pytest.raises(ValueError, match="has an SDPA attn_mask"):
        g.to_sparse()


def test_unchecked_sparse_graph_is_checked_by_the_kernel():
    torch.manual_seed(1)
    layer = DiffusionAttention(8, 2, "attention:1,laplacian:1").double()
    x = torch.randn(4, 8, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    g = AttentionGraph.sparse(ei, 4, checked=False)
    assert repr(g) == "AttentionGraph(sparse, num_nodes=4, E=4, checked=False)"
    torch.testing.assert_close(layer(x, g), layer(x, AttentionGraph.sparse(ei, 4)), atol=0, rtol=0)
    torch.testing.assert_close(layer(x, g), layer(x, edge_index=ei), atol=0, rtol=0)
    bad = AttentionGraph.sparse(torch.tensor([[0], [9]]), 4, checked=False)  # accepted by the graph ...
    with pytest.raises(ValueError, match="edge_index values must lie"):  # ... refused once, by the kernel
        layer(x, bad)


def test_operator_capabilities_are_resolved_through_the_context():
    from diffusionformer.ops.reference import dense_attention_reference

    class TwoMaps(DiffusionOperator):
        # declares a second map but also claims to be a polynomial: its heads would be counted twice
        name = "two-maps-test"
        needs_second_map = True
        degree = 1

        def coefficients(self):
            return torch.tensor([0.0, 1.0])

    class HalfMaps(TwoMaps):
        # a context operator: 0.5 (P_a + P_b) v with P_a, P_b the maps of the two halves of q and k
        is_polynomial = False

        def apply_context(self, ctx):
            C = ctx.q.shape[-1] // 2
            a = ctx.attend(ctx.q[..., :C], ctx.k[..., :C], ctx.v)
            return 0.5 * (a + ctx.attend(ctx.q[..., C:], ctx.k[..., C:], ctx.v))

    assert not DiffusionOperator.needs_second_map and not DiffusionOperator.needs_layer_state
    assert not DiffusionOperator.reprojects_each_step and not DiffusionOperator.needs_uniform_map
    with pytest.raises(ValueError, match="declares needs_second_map but is_polynomial=True"):
        DiffusionAttention(8, 2, [TwoMaps(), "attention"])
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, [HalfMaps(), "attention"], causal=True).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    q, k, v = (t.transpose(1, 2) for t in layer._project(x))  # (B, H, N, C)
    tril = torch.ones(5, 5, dtype=torch.bool).tril()
    half = [dense_attention_reference(q[:, :1, :, sl], k[:, :1, :, sl], allowed=tril, scale=0.5)
            for sl in (slice(0, 2), slice(2, 4))]  # the layer's scale 1/sqrt(C) for both halves
    head0 = 0.5 * (half[0] + half[1]) @ v[:, :1]
    head1 = dense_attention_reference(q[:, 1:], k[:, 1:], allowed=tril) @ v[:, 1:]
    expected = layer.out_proj(torch.cat([head0, head1], 1).transpose(1, 2).reshape(2, 5, 8))
    torch.testing.assert_close(layer(x), expected, atol=1e-12, rtol=1e-12)


# ---------------------------------------------------------------------------- one head spec
def test_head_layout_sugar_is_resolved_in_one_place():
    from diffusionformer.experiments.config import OperatorSetting
    from diffusionformer.models import GPTConfig
    from diffusionformer.nn.heads import format_head_spec, resolve_layer_heads

    assert resolve_layer_heads(2, 4, laplacian_heads="half") == ["attention:2,laplacian:2"] * 2
    assert resolve_layer_heads(3, 4, laplacian_heads=[0, "half", 4]) == [None, "attention:2,laplacian:2", "laplacian:4"]
    assert resolve_layer_heads(2, 6, heads={"1": "heat(t=0.5):{half},attention:{half}"}) == [None, "heat(t=0.5):3,attention:3"]
    assert resolve_layer_heads(2, 4, heads=["laplacian:{H}", None]) == ["laplacian:4", None]
    # the experiments' operator settings and a layer's own spec go through the same resolver
    assert OperatorSetting("lap", laplacian_heads="half").overrides(6) == {"laplacian_heads": 3}
    assert OperatorSetting("mix", heads="attention:{half},laplacian:{half}").overrides(4) == {"heads": "attention:2,laplacian:2"}
    assert DiffusionAttention(8, 4, "attention:{half},laplacian:{half}").heads_spec() == "attention:2,laplacian:2"
    gpt = GPTConfig(vocab_size=5, block_size=4, n_layer=2, n_head=4, n_embd=8, laplacian_heads="half")
    assert resolve_layer_heads(gpt.n_layer, gpt.n_head, gpt.heads, gpt.laplacian_heads)[0] == "attention:2,laplacian:2"
    with pytest.raises(ValueError, match="only the templates"):
        format_head_spec("attention:{quarter}", 4)
    with pytest.raises(ValueError, match="laplacian_heads must be an int, 'half'"):
        resolve_layer_heads(2, 4, laplacian_heads="all")


def test_from_edge_index_equals_from_pyg_and_defers_the_check():
    from torch_geometric.data import Data

    from diffusionformer.graph import from_edge_index, from_pyg

    ei = torch.tensor([[0, 1, 1, 2], [1, 0, 1, 3]])
    for self_loops in (None, True, False):
        a = from_edge_index(ei, 4, self_loops=self_loops)
        b = from_pyg(Data(edge_index=ei, num_nodes=4), self_loops=self_loops)
        assert torch.equal(a.edge_index, b.edge_index) and a.num_nodes == b.num_nodes == 4
    with pytest.raises(ValueError, match="edge_index values must lie"):
        from_edge_index(torch.tensor([[0], [7]]), 4)
    assert not from_edge_index(torch.tensor([[0], [7]]), 4, checked=False).checked
