"""Metamorphic relations of the attention layer over the operator registry, in float64 (probe 46).

A sweep over every registered operator (mixed with attention heads, learned and K-step ones), the
dense back-ends (sdpa, matrix, Triton under the interpreter) and both sparse paths (CSR and the
gather-scatter one) found no violation of: causal-prefix independence (outputs and input
gradients, with and without ``recompute``, across Triton tile boundaries), batch independence,
token-permutation equivariance with the masks permuted alike, GPT prefix / KV-cache agreement
with RoPE, GQA, qk-norm and RMSNorm, graph-level readouts with an empty graph in the batch,
the operator identities and limits through the layer, and float32 against float64. The pins
below hold the relations that no earlier probe states (probe 43 holds head reordering, dense vs
``to_sparse``, padded ViT patches and graph batches). One violation, at the model level: the
ViT's mean pool averaged padded patch tokens into the logits (``test_bug_...``).
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.nn.attention import DiffusionAttention
from diffusionformer.nn.rotary import RotaryEmbedding

_ALL = ["attention", "laplacian", "heat(t=0.7)", "heat-exact(t=0.5)", "ppr(alpha=0.3)", "ppr-exact(alpha=0.3)",
        "polynomial(steps=2, init=[0.1, 0.5, 0.4], basis='chebyshev')", "attnscale(omega=0.3)", "differential",
        "grand-nl", "neutreno", "value-residual"]
_DENSE_ONLY = ("heat-exact", "ppr-exact")


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _layer(spec: str, *, seed: int = 1, **kw) -> DiffusionAttention:
    torch.manual_seed(seed)
    return DiffusionAttention(16, 4, heads=f"{spec}:2,attention:2", **kw).double().eval()


def _values_out(layer: DiffusionAttention, x: torch.Tensor) -> torch.Tensor:
    """``out_proj(v)``: the layer's output when every head's operator is the identity."""
    D = layer.dim
    return layer.out_proj(torch.nn.functional.linear(x, layer.qkv.weight[2 * D:], layer.qkv.bias[2 * D:]))


@pytest.mark.parametrize("spec", _ALL)
@pytest.mark.parametrize("backend", ["sdpa", "matrix"])
def test_pins_duplicating_every_token_changes_no_operator_output(spec, backend):
    """On the complete graph, a sequence with every token written twice has ``P'`` whose rows split
    each weight of ``P`` in two equal halves, so ``f(P') v'`` is ``f(P) v`` written twice for every
    operator (powers of ``P``, the exact kernels, the uniform map of AttnScale, the rivals' contexts);
    on the sparse back-end too, with the complete edge set of the doubled sequence."""
    layer = _layer(spec, backend=backend)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    want = layer(x)
    doubled = x.repeat_interleave(2, dim=1)
    assert _err(layer(doubled)[:, ::2], want) < 1e-12
    assert _err(layer(doubled)[:, 1::2], want) < 1e-12
    if spec.split("(")[0] not in _DENSE_ONLY:
        ii, jj = torch.meshgrid(torch.arange(10), torch.arange(10), indexing="ij")
        ei = torch.stack([jj.flatten(), ii.flatten()])
        assert _err(layer(doubled[0], edge_index=ei)[::2], want[0]) < 1e-12


@pytest.mark.parametrize("spec", _ALL)
@pytest.mark.parametrize("causal", [False, True])
def test_pins_a_row_constant_float_mask_is_invisible_to_every_operator(spec, causal):
    """A float ``attn_mask`` whose finite entries are constant along each query row shifts the scores
    of the row by a constant, which the softmax removes: every operator gives the output of the
    unmasked call (AttnScale's ``DC`` is then ``softmax(mask)`` = the uniform average again)."""
    N = 6
    layer = _layer(spec, backend="matrix", causal=causal)
    x = torch.randn(2, N, 16, dtype=torch.float64)
    mask = (3 * torch.randn(N, 1, dtype=torch.float64)).expand(N, N).contiguous()
    if causal:
        mask = mask.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))
    assert _err(layer(x, attn_mask=mask), layer(x)) < 1e-12


@pytest.mark.parametrize("spec", _ALL)
def test_pins_rotary_layers_are_shift_invariant_and_left_padding_is_invisible(spec):
    """RoPE scores depend on position differences only: shifting every position by a constant
    leaves any operator's output unchanged, so a left-padded row of a causal RoPE layer equals its
    real tokens run alone (positions 0 .. n-1 there), and a non-causal call with ``is_causal=True``
    equals the causal layer."""
    torch.manual_seed(0)
    kw = dict(heads=f"{spec}:2,attention:2", rotary=RotaryEmbedding(4))
    layer = DiffusionAttention(16, 4, **kw).double().eval()
    causal = DiffusionAttention(16, 4, causal=True, **kw).double().eval()
    causal.load_state_dict(layer.state_dict())
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[0, :2] = True
    real = ~kpm
    pos = torch.arange(6)
    want = layer(x, key_padding_mask=kpm)
    assert _err(layer(x, key_padding_mask=kpm, positions=pos + 7)[real], want[real]) < 1e-12
    got = causal(x, key_padding_mask=kpm)
    assert _err(layer(x, key_padding_mask=kpm, is_causal=True)[real], got[real]) < 1e-12
    assert _err(causal(x[:1, 2:])[0], got[0, 2:]) < 1e-12
    assert _err(layer(x[:1, 2:])[0], want[0, 2:]) < 1e-12


@pytest.mark.parametrize("spec", ["heat(t=0)", "heat-exact(t=0)", "ppr(alpha=1)", "ppr-exact(alpha=1)",
                                  "polynomial(steps=2, init=[1, 0, 0])", "heat(t=0, learnable=True)"])
@pytest.mark.parametrize("causal", [False, True])
def test_pins_identity_operators_give_the_value_projection_through_the_layer(spec, causal):
    """``heat`` at ``t = 0``, PPR at ``alpha = 1`` and the polynomial ``1`` are the identity: through the
    public layer (with key padding, on both dense back-ends and on a sparse graph with a node that
    has no in-edge) the output is ``out_proj(v)`` on every real token."""
    torch.manual_seed(0)
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[0, -2:] = True
    for backend in ("sdpa", "matrix"):
        torch.manual_seed(0)
        layer = DiffusionAttention(8, 2, heads=spec, backend=backend, causal=causal).double().eval()
        want = _values_out(layer, x)
        assert _err(layer(x, key_padding_mask=kpm)[~kpm], want[~kpm]) < 1e-12, backend
    if spec.split("(")[0] not in _DENSE_ONLY:
        ei = torch.tensor([[0, 1, 2, 3, 4, 1, 3, 0], [1, 2, 3, 4, 0, 0, 1, 4]])  # node 5: no in-edge
        assert _err(layer(x[1], edge_index=ei), want[1]) < 1e-12


@pytest.mark.parametrize("spec", ["laplacian", "I-P", "polynomial(steps=2, init=[1, -1, 0])"])
@pytest.mark.parametrize("causal", [False, True])
def test_pins_the_laplacian_kills_constant_values_through_the_layer(spec, causal):
    """``(I - P) 1 = 0`` for a row-stochastic ``P``: tokens with equal features have equal values,
    so a Laplacian head outputs ``out_proj.bias`` alone, whatever the padded tokens hold, on both
    dense back-ends and on a sparse graph."""
    x = torch.randn(2, 1, 8, dtype=torch.float64).expand(2, 6, 8).contiguous()
    x[0, -2:] = 50.0
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[0, -2:] = True
    # every node keeps an in-edge after the causal filter (a node without one outputs c_0 v = v, as documented)
    ei = torch.cat([torch.tensor([[0, 1, 2, 3, 4, 5, 1, 3, 0], [1, 2, 3, 4, 5, 0, 0, 1, 4]]), torch.arange(6).repeat(2, 1)], 1)
    for backend in ("sdpa", "matrix"):
        torch.manual_seed(0)
        layer = DiffusionAttention(8, 2, heads=spec, backend=backend, causal=causal).double().eval()
        bias = layer.out_proj.bias.expand(2, 6, 8)
        assert _err(layer(x, key_padding_mask=kpm)[~kpm], bias[~kpm]) < 1e-12, backend
        assert _err(layer(x[1], edge_index=ei), bias[1]) < 1e-12, backend


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pair", [("ppr(alpha=0.3, steps=120)", "ppr-exact(alpha=0.3)"),
                                  ("heat(t=2.0, steps=60)", "heat-exact(t=2.0)"),
                                  ("heat(t=-0.5, steps=40)", "heat-exact(t=-0.5)"),
                                  ("polynomial(steps=1, init=[1, -1])", "laplacian"),
                                  ("polynomial(steps=1, init=[0, 1])", "attention")])
def test_pins_truncated_series_reach_the_exact_operators_through_the_layer(pair, causal):
    """Long truncations of the PPR and heat series equal the exact (dense ``solve`` / ``matrix_exp``)
    operators, and the polynomials ``1 - P`` and ``P`` equal the Laplacian and attention heads, as
    layers with the same projections, under key padding and a per-sequence ``attn_mask``."""
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[0, -2:] = True
    allowed = (torch.rand(2, 1, 6, 6) < 0.6) | torch.eye(6, dtype=torch.bool)
    torch.manual_seed(1)
    a = DiffusionAttention(8, 2, heads=pair[0], backend="matrix", causal=causal).double().eval()
    b = DiffusionAttention(8, 2, heads=pair[1], backend="matrix", causal=causal).double().eval()
    b.qkv.load_state_dict(a.qkv.state_dict())
    b.out_proj.load_state_dict(a.out_proj.state_dict())
    for kw in ({"key_padding_mask": kpm}, {"key_padding_mask": kpm, "attn_mask": allowed}):
        assert _err(a(x, **kw)[~kpm], b(x, **kw)[~kpm]) < 1e-9, kw


@pytest.mark.parametrize("spec", ["heat-exact(t=40)", "ppr-exact(alpha=0.0001)"])
@pytest.mark.parametrize("causal", [False, True])
def test_pins_the_long_time_limit_is_the_stationary_projection(spec, causal):
    """``exp(-t (I - P))`` for large ``t`` and PPR for ``alpha -> 0`` tend to ``lim P^n``: the layer's
    output on each sequence is ``out_proj`` of ``P^(2^20) v`` (for a causal ``P``, the first real
    token's value everywhere), with ``P`` the layer's own attention weights."""
    torch.manual_seed(0)
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[0, -2:] = True
    layer = DiffusionAttention(8, 2, heads=spec, backend="matrix", causal=causal).double().eval()
    y, inter = layer(x, key_padding_mask=kpm, return_intermediates=True)
    v = torch.nn.functional.linear(x, layer.qkv.weight[16:], layer.qkv.bias[16:]).view(2, 6, 2, 4).transpose(1, 2)
    for i in range(2):
        n = int((~kpm[i]).sum())
        limit = torch.linalg.matrix_power(inter.attn_weights[i, :, :n, :n], 2**20)
        want = layer.out_proj((limit @ v[i, :, :n]).transpose(0, 1).reshape(n, 8))
        assert _err(y[i, :n], want) < 1e-3, i


@pytest.mark.parametrize("spec", _ALL)
@pytest.mark.parametrize("recompute", [False, True])
def test_pins_no_gradient_crosses_the_causal_mask_the_batch_or_the_padding(spec, recompute):
    """The input gradient of one output token of a causal layer is exactly zero on later tokens and
    on the other sequences, and the loss over the real tokens gives a padded token no gradient
    (the recomputing backward and each operator's own backward included)."""
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, heads=f"{spec}:2,attention:2", causal=True, backend="matrix",
                               recompute=recompute).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64, requires_grad=True)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[0, -1] = True
    y = layer(x, key_padding_mask=kpm)
    w = torch.randn_like(y)
    g, = torch.autograd.grad((y[1, 2] * w[1, 2]).sum(), x, retain_graph=True)
    assert g[1, :3].abs().max() > 0
    assert g[0].abs().max() == 0 and g[1, 3:].abs().max() == 0
    g, = torch.autograd.grad((y[~kpm] * w[~kpm]).sum(), x)
    assert g[0, -1].abs().max() == 0


@pytest.mark.parametrize("spec,growth", [("heat-exact(t=-3)", math.exp(6)), ("heat(t=-2)", math.exp(4)),
                                         ("heat-exact(t=20)", 20.0), ("ppr-exact(alpha=0.001)", 1e3),
                                         ("polynomial(steps=30, basis='chebyshev')", 1e3),
                                         ("grand-nl(t=5, steps=10)", 5.0), ("attnscale(omega=5)", 5.0)])
@pytest.mark.parametrize("causal", [False, True])
def test_pins_float32_agrees_with_float64_to_the_operators_conditioning(spec, growth, causal):
    """The same weights in float32 and float64 agree to ``eps32`` times the operator's growth factor
    (``e^(2|t|)`` for sharpening heat, ``1/alpha`` for PPR, ``t`` for long diffusion) relative to the
    output scale, and float32 stays finite."""
    torch.manual_seed(0)
    f64 = DiffusionAttention(16, 4, heads=spec, causal=causal, backend="matrix").double().eval()
    f32 = DiffusionAttention(16, 4, heads=spec, causal=causal, backend="matrix").eval()
    f32.load_state_dict({k: v.float() for k, v in f64.state_dict().items()})
    x = torch.randn(2, 16, 16, dtype=torch.float64)
    kpm = torch.zeros(2, 16, dtype=torch.bool)
    kpm[0, -3:] = True
    want = f64(x, key_padding_mask=kpm)[~kpm]
    got = f32(x.float(), key_padding_mask=kpm).double()[~kpm]
    assert torch.isfinite(got).all()
    assert _err(got, want) / want.abs().max().item() < 1e-5 * growth


def _triton_runs_here() -> bool:
    try:
        from diffusionformer.ops.triton import is_available
        from diffusionformer.ops.triton.backend import _runs_here
    except ImportError:
        return False
    return is_available() and _runs_here(torch.device("cpu"))


@pytest.mark.skipif(not _triton_runs_here(), reason="Triton kernels need CUDA or TRITON_INTERPRET=1 (tests/conftest.py)")
@pytest.mark.parametrize("spec", ["heat(t=0.7)", "attnscale(omega=0.3)"])
def test_pins_triton_causal_prefix_and_batch_across_a_tile_boundary(spec):
    """A 37-token causal sequence spans more than one Triton tile: the outputs before token 33 do not
    move when the later tokens change, a row equals itself run alone, the key gradient of token 30
    is zero on later tokens, and the output matches the matrix back-end to float32 rounding."""
    torch.manual_seed(0)
    tri = DiffusionAttention(8, 2, heads=f"{spec}:1,attention:1", backend="triton", causal=True)
    ref = DiffusionAttention(8, 2, heads=f"{spec}:1,attention:1", backend="matrix", causal=True)
    ref.load_state_dict(tri.state_dict())
    x = torch.randn(2, 37, 8, requires_grad=True)
    kpm = torch.zeros(2, 37, dtype=torch.bool)
    kpm[0, -5:] = True
    y = tri(x, key_padding_mask=kpm)
    assert _err(y[~kpm], ref(x, key_padding_mask=kpm)[~kpm]) < 1e-5
    x2 = x.detach().clone()
    x2[:, 33:] = 5 * torch.randn(2, 4, 8)
    with torch.no_grad():
        assert _err(tri(x2, key_padding_mask=kpm)[:, :33], y[:, :33]) == 0
        assert _err(tri(x[1:])[0], y[1]) == 0
    g, = torch.autograd.grad(y[1, 30].sum(), x)
    assert g[0].abs().max() == 0 and g[1, 31:].abs().max() == 0


@pytest.mark.parametrize("spec", ["attention", "heat(t=0.7)", "ppr-exact(alpha=0.3)", "neutreno"])
def test_bug_vit_mean_pool_averaged_the_padded_patch_tokens(spec):
    """Bug: ``DiffusionViT.forward_features`` with ``pool="mean"`` averaged every patch token, the
    padded ones too, so under ``key_padding_mask`` the pixels of a padded patch (which reach no real
    token) still moved the pooled features and the logits (by 4e-2 here), and a padded sample's
    features differed from the same patches run without the padded one. The mean is now over the
    real patch tokens (also for a ``graph`` carrying the mask)."""
    from diffusionformer.graph import AttentionGraph
    from diffusionformer.models.vit import DiffusionViT, ViTConfig

    torch.manual_seed(0)
    cfg = ViTConfig(input_size=(8, 8), in_channels=2, patch_size=4, dim=16, depth=2, num_heads=4, pool="mean",
                    num_classes=3, heads=f"{spec}:2,attention:2")
    model = DiffusionViT(cfg).double().eval()
    x = torch.randn(2, 2, 8, 8, dtype=torch.float64)
    kpm = torch.zeros(2, 4, dtype=torch.bool)
    kpm[0, -1] = True  # the bottom-right patch of sample 0
    x2 = x.clone()
    x2[0, :, 4:, 4:] = 5 * torch.randn(2, 4, 4, dtype=torch.float64)
    with torch.no_grad():
        tokens = model.forward_patch_tokens(x, key_padding_mask=kpm)
        want = torch.stack([tokens[0, :3].mean(0), tokens[1].mean(0)])
        assert _err(model.forward_features(x, key_padding_mask=kpm), want) < 1e-12
        assert _err(model(x2, key_padding_mask=kpm), model(x, key_padding_mask=kpm)) < 1e-12
        assert _err(model(x, key_padding_mask=kpm)[1], model(x[1:])[0]) < 1e-12
        graph = AttentionGraph.dense(4, batch_size=2, key_padding_mask=kpm)
        assert _err(model.forward_features(x2, graph=graph), want) < 1e-12
        # an explicit key_padding_mask=None (a wrapper forwarding every keyword) leaves the graph's mask in force
        assert _err(model.forward_features(x2, graph=graph, key_padding_mask=None), want) < 1e-12
        # a fully padded sample pools to zeros, finite
        full = torch.ones(1, 4, dtype=torch.bool)
        assert model.forward_features(x[:1], key_padding_mask=full).abs().max() == 0
