"""Bad input to the public API: each case once gave a wrong answer, a raw low-level error or a hang.

Every case names what it guards against; the valid neighbour of each bad input still works.
"""

from __future__ import annotations

import pytest
import torch

import diffusionformer.functional as F
from diffusionformer.graph import AttentionGraph, grid
from diffusionformer.models import create_model
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.block import Block
from diffusionformer.nn.heads import parse_heads, resolve_layer_heads
from diffusionformer.operators import (DiffusionOperator, build_operator, parse_operator_spec, register_operator,
                                       unregister_operator)


# --- functional API -------------------------------------------------------------------------------------------


def test_propagate_sparse_refuses_num_nodes_beyond_x_instead_of_reading_past_it():
    x = torch.arange(1.0, 7.0).view(6, 1, 1)
    edges = torch.tensor([[7, 6], [0, 1]])
    for backend in ("auto", "native"):
        with pytest.raises(ValueError, match=r"num_nodes=8 disagrees with x, which has N=6 rows"):
            F.propagate_sparse(torch.ones(2, 1), x, edges, num_nodes=8, backend=backend)
    with pytest.raises(TypeError, match="num_nodes must be an int"):
        F.propagate_sparse(torch.ones(2, 1), x, torch.tensor([[0, 1], [1, 0]]), num_nodes=6.0)
    with pytest.raises(TypeError, match="weights must be a torch.Tensor"):
        F.propagate_sparse([[1.0], [1.0]], x, torch.tensor([[0, 1], [1, 0]]))
    y = F.propagate_sparse(torch.ones(2, 1), x, torch.tensor([[0, 1], [1, 0]]), num_nodes=6)
    assert y.flatten().tolist() == [2.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_propagate_dense_checks_x_against_k_and_the_dropout_rate():
    q = k = torch.randn(1, 1, 8, 4)
    with pytest.raises(ValueError, match=r"x must have shape \(B, H, M, C_x\) matching k"):
        F.propagate_dense(q, k, torch.randn(1, 1, 5, 4))  # was: a softmax over the first 5 keys only
    with pytest.raises(ValueError, match=r"x must have shape"):
        F.propagate_dense(q, k, torch.randn(1, 2, 8, 4))
    with pytest.raises(TypeError, match="x must have the dtype of q and k"):
        F.propagate_dense(q, k, torch.randn(1, 1, 8, 4, dtype=torch.float64))
    for bad in (-0.5, float("nan"), 1.5):
        with pytest.raises(ValueError, match=r"dropout_p must lie in \[0, 1\)"):
            F.propagate_dense(q, k, torch.randn(1, 1, 8, 3), dropout_p=bad)
    assert F.propagate_dense(q, k, torch.randn(1, 1, 8, 3)).shape == (1, 1, 8, 3)


def test_float_attn_mask_with_nan_or_plus_inf_is_refused_and_minus_inf_still_masks():
    q = torch.randn(1, 1, 4, 8)
    for value in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"entries must be finite or -inf"):
            F.diffuse(q, q, q, [0.0, 1.0], attn_mask=torch.full((4, 4), value))
    mask = torch.zeros(4, 4).masked_fill(~torch.ones(4, 4, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(F.diffuse(q, q, q, [0.0, 1.0], attn_mask=mask),
                               F.diffuse(q, q, q, [0.0, 1.0], is_causal=True))


@pytest.mark.parametrize("degrees,error", [([1.5], TypeError), ("10", TypeError), (1, TypeError),
                                           ([True, 0], TypeError), ([2, None], TypeError), ([1.0, 0], TypeError)])
def test_degrees_must_be_ints_not_truncated_floats_or_characters(degrees, error):
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(error, match="degrees must be a sequence of ints"):
        F.diffuse(q, q, q, [0.0, 1.0, 0.5], degrees=degrees)


def test_integer_degrees_of_every_kind_are_taken():
    q = torch.randn(1, 2, 4, 8)
    want = F.diffuse(q, q, q, [0.0, 1.0, 0.5], degrees=[2, 1])
    for degrees in ((2, 1), torch.tensor([2, 1])):
        torch.testing.assert_close(F.diffuse(q, q, q, [0.0, 1.0, 0.5], degrees=degrees), want)


def test_head_dim_zero_and_string_coefficients_get_named_errors():
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match=r"head dimension C >= 1, got C=0"):
        F.diffuse(q[..., :0], q[..., :0], q, [0.0, 1.0])
    with pytest.raises(TypeError, match=r"coeffs given as rows \(H, K\+1\) must hold numbers"):
        F.diffuse(q, q, q, [["0", "1"]])


def test_need_weights_must_be_a_bool():
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(TypeError, match="need_weights must be a bool"):
        F.diffuse_with_weights(q, q, q, [0.0, 1.0], need_weights="no")
    n = torch.randn(4, 1, 8)
    with pytest.raises(TypeError, match="need_weights must be a bool"):
        F.diffuse_sparse_with_weights(n, n, n, torch.tensor([[0, 1], [1, 0]]), [0.0, 1.0], need_weights="no")


# --- operator specs and arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize("spec,message", [
    ("heat(t=0.5)(steps=3)", "with one pair of parentheses"),   # was: t=0.5 silently dropped
    ("heat(t=1) + g(steps=2)", "with one pair of parentheses"),  # was: a bare AssertionError
    ("heat(t=0.5, t=2.0)", "argument 't' is given twice"),      # was: the last one won
    ("heat(**{'t': 1})", r"not \*\*mapping"),
])
def test_malformed_operator_specs_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_operator_spec(spec)


def test_misspelt_arguments_and_methods_get_did_you_mean():
    with pytest.raises(TypeError, match=r"unknown argument 'stps' \(did you mean 'steps'\?\); valid arguments: \["):
        build_operator("heat(t=0.5, stps=4)")
    with pytest.raises(TypeError, match=r"unknown argument 'alpah' \(did you mean 'alpha'\?\)"):
        build_operator("ppr", alpah=0.2)
    with pytest.raises(ValueError, match=r"unknown method 'eulr' \(did you mean 'euler'\?\)"):
        build_operator("grand-nl(method='eulr')")  # was: "needs torchdiffeq"
    with pytest.raises(ValueError, match=r"unknown operator 'heet' \(did you mean 'heat'\?\)"):
        unregister_operator("heet")
    assert build_operator("heat(t=0.5, steps=4)").steps == 4


@pytest.mark.parametrize("make,message", [
    (lambda: build_operator("differential", lambda_init=float("nan")), "lambda_init must be finite"),
    (lambda: build_operator("neutreno(lam=1e400)"), "lam must be finite"),
    (lambda: build_operator("value-residual", lam=float("nan")), "lam must be finite"),
    (lambda: create_model("gpt-char-tiny", rope=True, rope_base=float("nan")), "finite float > 1"),
    (lambda: Block(16, 4, layer_scale=float("nan")), "layer_scale. must be a finite float"),
    (lambda: build_operator("heat-exact(t=-1000)"), r"t must be >= -40"),
])
def test_non_finite_or_overflowing_arguments_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("spec,message", [
    ("heat(t=400, method='euler')", "needs more than 256 steps"),   # was: OverflowError
    ("heat(t=-400, min_t=-1000)", "needs more than 256 steps"),     # was: OverflowError
    ("ppr(alpha=1e-300, steps=None)", "needs more than 1024 steps"),  # was: ZeroDivisionError
    ("ppr(alpha=1e-12, steps=None)", "needs more than 1024 steps"),   # was: a 79 TB allocation
    ("ppr(steps=1000000000000)", r"steps must be an int in \[1, 1024\]"),
    ("polynomial(steps=1000000000000)", r"steps must be an int in \[0, 1024\]"),
    ("grand-nl(steps=100000)", r"steps must be an int in \[1, 1024\]"),
])
def test_unbounded_step_counts_are_errors_not_huge_allocations(spec, message):
    with pytest.raises(ValueError, match=message):
        build_operator(spec)


def test_the_step_bounds_leave_the_valid_range_alone():
    assert build_operator("ppr(alpha=0.01, steps=None, tol=0.01)").steps == 528
    assert build_operator("polynomial(steps=1024)").degree == 1024
    assert build_operator("heat-exact(t=-40)").spec() == "heat-exact(t=-40.0, learnable=False)"


@pytest.mark.parametrize("spec", ["ppr(learnable='no')", "heat-exact(learnable=1)"])
def test_flags_are_bools_not_truthy_values(spec):
    with pytest.raises(TypeError, match="learnable must be a bool"):
        build_operator(spec)


def test_a_single_alias_string_is_one_alias_not_its_characters():
    class Half(DiffusionOperator):
        degree = 1

        def coefficients(self):
            return torch.tensor([0.5, 0.5])

    register_operator(Half, name="test-half-alias", aliases="half-alias")
    try:
        assert Half.aliases == ("half-alias",)
        assert isinstance(build_operator("half-alias"), Half)
    finally:
        unregister_operator("test-half-alias")


# --- layers, graphs and models --------------------------------------------------------------------------------


def test_head_layouts_with_bad_keys_or_counts_get_named_errors():
    with pytest.raises(ValueError, match=r"maps layer indices to specs .* got the key 'x'"):
        resolve_layer_heads(2, 4, heads={"x": "laplacian:4"})
    assert resolve_layer_heads(2, 4, heads={"1": "laplacian:4"}) == [None, "laplacian:4"]  # TOML keys are strings
    with pytest.raises(ValueError, match=r"laplacian_heads must be an int, 'half' or a list of them, got 2.0"):
        resolve_layer_heads(2, 4, laplacian_heads=2.0)
    with pytest.raises(ValueError, match=r"built for num_heads=3 heads, but it is given alone for a layer of num_heads=4"):
        parse_heads(build_operator("heat", learnable=True, num_heads=3), 4)
    assert len(parse_heads(build_operator("heat", learnable=True, num_heads=4), 4)) == 1


def test_graph_attn_mask_of_the_wrong_size_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"attn_mask must be broadcastable to \(B, H, N, N\) with N=3, got shape \(5, 5\)"):
        AttentionGraph.dense(3, window=1, attn_mask=torch.zeros(5, 5))
    g = AttentionGraph.dense(3, window=1, attn_mask=torch.zeros(3, 3))
    assert DiffusionAttention(16, 4)(torch.randn(2, 3, 16), g).shape == (2, 3, 16)


def test_unchecked_sparse_graph_to_dense_names_out_of_range_edges():
    with pytest.raises(ValueError, match=r"edge_index values must lie in \[0, num_nodes=3\), got range \[0, 5\]"):
        AttentionGraph.sparse(torch.tensor([[0, 5], [1, 2]]), 3, checked=False).to_dense()


def test_a_huge_grid_radius_costs_no_more_than_the_grid():
    far = grid(2, 2, radius=1e5, layout="sparse")  # was: a 320 GB offset table
    assert far.edge_index.shape == (2, 16)
    for h, w, r, metric in [(3, 4, 2.5, "euclidean"), (2, 5, 10, "chebyshev"), (4, 1, 3, "manhattan")]:
        sparse, dense = grid(h, w, radius=r, metric=metric, layout="sparse"), grid(h, w, radius=r, metric=metric)
        assert torch.equal(sparse.to_dense().dense_allowed()[0], dense.dense_allowed()[0])


def test_gpt_refuses_empty_sequences_and_checks_the_ids_of_cached_decoding():
    m = create_model("gpt-char-tiny", n_layer=1)
    empty = torch.zeros(2, 0, dtype=torch.long)
    with pytest.raises(ValueError, match="at least one sequence of at least one token"):
        m(empty, empty)  # was: a NaN loss
    with pytest.raises(ValueError, match="at least one sequence of at least one token"):
        m.generate(torch.zeros(1, 0, dtype=torch.long), 2)
    with pytest.raises(ValueError, match=r"idx holds token id 99, outside the vocabulary"):
        m.forward_cached(torch.full((1, 4), 99), m.new_cache())
    with pytest.raises(ValueError, match=r"idx must be an integer tensor"):
        m.forward_cached(torch.zeros(1, 4), m.new_cache())
    with pytest.raises(TypeError, match="cache must be the list that new_cache"):
        m.forward_cached(torch.zeros(1, 4, dtype=torch.long), [None])
    assert m.generate(torch.zeros(1, 1, dtype=torch.long), 2, use_cache=True).shape == (1, 3)


def test_graph_transformer_checks_batch_ids_and_edges_between_graphs():
    g = create_model("graph-graph-small", in_channels=4, num_classes=2, depth=1, dim=16).eval()
    x = torch.randn(6, 4)
    inside = torch.tensor([[0, 1, 3, 4], [1, 2, 4, 5]])
    with pytest.raises(ValueError, match=r"batch: expected non-negative graph ids, got ids in \[-1, 0\]"):
        g(x, inside, torch.tensor([0, 0, 0, -1, -1, -1]))
    with pytest.raises(ValueError, match=r"graph ids in \[0, num_graphs=1\), got ids in \[0, 1\]"):
        g(x, inside, torch.tensor([0, 0, 0, 1, 1, 1]), num_graphs=1)
    with pytest.raises(ValueError, match="edge_index connects nodes of different graphs"):
        g(x, torch.tensor([[2], [3]]), torch.tensor([0, 0, 0, 1, 1, 1]))  # was: silently mixed the graphs
    with pytest.raises(TypeError, match="batch must hold integer graph ids"):
        g(x, inside, torch.zeros(6))
    assert g(x, inside, torch.tensor([0, 0, 0, 1, 1, 1])).shape == (2, 2)


# --- blocks and model configs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [0.01, float("inf"), float("nan"), -1.0])
def test_block_mlp_ratio_that_gives_no_valid_width_is_refused(ratio):
    """Bug: ``Block(8, 2, mlp_ratio=0.01)`` gave ``Mlp(8, 0)``, which read the width 0 as "default" and
    silently built a 32-wide MLP; ``inf`` died inside ``int()`` and ``nan`` passed the ``<= 0`` check."""
    with pytest.raises(ValueError, match="mlp_ratio must be positive and finite"):
        Block(8, 2, mlp_ratio=ratio)
    assert Block(8, 2, mlp_ratio=0.125).mlp.fc1.out_features == 1  # the smallest width still builds


def test_mlp_hidden_width_zero_is_refused_not_read_as_the_default():
    """Bug: ``Mlp(8, 0)`` built the default ``4 * dim`` hidden layer (``hidden_dim or 4 * dim``)."""
    from diffusionformer.nn.block import Mlp

    with pytest.raises(ValueError, match="hidden_dim must be a positive int or None, got 0"):
        Mlp(8, 0)
    assert Mlp(8).fc1.out_features == 32 and Mlp(8, 3).fc1.out_features == 3


@pytest.mark.parametrize("base", [1.0, 0.5, float("inf"), float("nan"), "100", True])
def test_vit_config_checks_rope_base_by_name(base):
    """Bug: ``ViTConfig.rope_base`` was not checked (``GPTConfig.rope_base`` is); a bad base was caught
    only when a rotary model was built, by an error naming ``base``, not the config field."""
    from diffusionformer.models.vit import ViTConfig

    with pytest.raises(ValueError, match=r"ViTConfig\.rope_base: expected a finite float > 1"):
        ViTConfig(rope_base=base)
    assert ViTConfig(rope_base=10000).rope_base == 10000
