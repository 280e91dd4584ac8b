"""Edge-case probes, second pass: operator construction limits and state dicts, sampling filters, head specs, blocks.

Found and fixed (each pinned by a "Bug:" test below):

* a fixed ``heat``/``ppr`` operator loaded a state dict holding another ``t``/``alpha`` without a word: its
  ``repr`` showed the loaded value, its output kept the constructor's (the coefficients are built once);
* ``repr`` of a learnable ``ppr`` whose ``alpha_logit`` had diverged to NaN raised instead of printing;
* ``grand-nl`` accepted negative ``rtol``/``atol``;
* ``top_k_filter``/``top_p_filter`` kept every token of a row with a NaN (or ``top_p``: ``+inf``) logit, and
  named neither a list, an integer tensor nor a 0-d tensor given as logits;
* a ``{layer: spec}`` dict naming one layer twice (``{1: .., -1: ..}``, ``{"1": .., 1: ..}``) silently
  dropped a spec; numpy ints for ``num_layers``/``laplacian_heads`` were refused, ``num_heads`` was not
  checked at all; ``parse_heads(b"attention", ...)`` read the bytes as a per-head list of ints;
* operator names with typeset dashes (``"I−P"`` copied from a paper) were unknown, with no "did you mean";
* ``Block``/``Mlp`` accepted ``dropout=nan`` (failing at the first training step), ``mlp_ratio="4"``/``None``
  gave a bare comparison TypeError and ``True`` was read as 1, numpy ``layer_scale``/``hidden_dim`` were
  refused, and an integer input failed with "mixed dtype (CPU)";
* ``PolynomialOperator(init=...)`` read bools as 1/0, dropped the imaginary part of complex coefficients,
  took ``[]`` (a head that outputs zero) and named neither a list of strings.
"""

from __future__ import annotations

import math
import pickle
from types import MappingProxyType

import numpy as np
import pytest
import torch

from diffusionformer.models.sampling import top_k_filter, top_p_filter
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.block import Block, Mlp
from diffusionformer.nn.heads import parse_heads, resolve_layer_heads
from diffusionformer.operators import (AttnScaleOperator, ExactHeatOperator, HeatOperator, NonlinearDiffusionOperator,
                                       PolynomialOperator, PPROperator, build_operator)
from diffusionformer.ops.rivals import LayerState

B, N, D, H = 2, 5, 8, 2
C = D // H


# ---------------------------------------------------------------- operators: state dicts, repr, limits
@pytest.mark.parametrize("cls,kw,other", [
    (HeatOperator, {"t": 0.7, "steps": 6}, {"t": 1.5, "steps": 6}),
    (HeatOperator, {"t": 0.7, "steps": 6}, {"t": 1.5, "steps": 6, "learnable": True}),  # (1,) read into ()
    (PPROperator, {"alpha": 0.2, "steps": 4}, {"alpha": 0.5, "steps": 4}),
    (ExactHeatOperator, {"t": 0.7, "num_heads": 2}, {"t": 1.5, "num_heads": 2}),  # used, but the spec said 0.7
    (AttnScaleOperator, {"omega": 0.2, "learnable": False, "num_heads": 2},
     {"omega": 0.5, "learnable": False, "num_heads": 2}),
])
def test_fixed_operator_refuses_a_state_dict_with_another_constant(cls, kw, other):
    """Bug: ``HeatOperator(t=0.7).load_state_dict(HeatOperator(t=1.5).state_dict())`` reported "All keys matched"
    and its repr said ``t=1.5``, but it kept applying the coefficients of ``t=0.7`` (built at construction)."""
    op = cls(**kw)
    with pytest.raises(RuntimeError, match=r"was built with the fixed .*=0\.[27], the state dict holds"):
        op.load_state_dict(cls(**other).state_dict())
    layer = DiffusionAttention(D, H, build_operator(cls, **kw))
    with pytest.raises(RuntimeError, match=r"operators\.0\."):  # the key is named with its prefix in a layer
        layer.load_state_dict(DiffusionAttention(D, H, build_operator(cls, **other)).state_dict())


def test_fixed_operator_loads_its_own_constant_in_any_precision():
    """Pins: the saved constant of the same operator in half, float32 or float64 (and a learnable one-head ``t``
    that still equals it) loads, and the output is the constructor's ``exp(-t (I - P))`` series."""
    op = HeatOperator(t=0.7, steps=6)
    for saved in (HeatOperator(t=0.7, steps=6).half(), HeatOperator(t=0.7, steps=6).float(),
                  HeatOperator(t=0.7, steps=6, learnable=True)):
        op.load_state_dict(saved.state_dict())
    ref = torch.tensor([math.exp(-0.7) * 0.7**k / math.factorial(k) for k in range(7)], dtype=torch.float64)
    torch.testing.assert_close(op.double().coefficients(), ref, rtol=1e-15, atol=0)
    PPROperator(alpha=0.2, steps=4).half().load_state_dict(PPROperator(alpha=0.2, steps=4).double().state_dict())


def test_ppr_repr_of_a_diverged_learned_alpha_shows_nan():
    """Bug: ``print(model)`` with a learnable ``ppr`` whose ``alpha_logit`` had become NaN raised "alpha_logit is
    not finite" from ``extra_repr``: the model could not be printed to find the problem."""
    op = PPROperator(alpha=0.2, steps=4, learnable=True, num_heads=2)
    with torch.no_grad():
        op.alpha_logit[0] = float("nan")
    assert "alpha=[nan, 0.2]" in repr(op)
    with pytest.raises(ValueError, match="alpha_logit is not finite"):  # the forward pass still refuses it
        op.coefficients()


@pytest.mark.parametrize("kw", [{"rtol": -1e-5}, {"atol": -1.0}])
def test_grand_nl_refuses_negative_tolerances(kw):
    """Bug: ``NonlinearDiffusionOperator(rtol=-1e-5)`` was accepted (an adaptive solver's error test with a
    negative tolerance accepts no step)."""
    with pytest.raises(ValueError, match=f"{next(iter(kw))} must be a non-negative float"):
        NonlinearDiffusionOperator(**kw)
    NonlinearDiffusionOperator(rtol=0.0, atol=0.0)  # zero is a tolerance


@pytest.mark.parametrize("init,exc,match", [
    (torch.tensor([True, False]), TypeError, "real numbers, got torch.bool"),
    ([True, False], TypeError, "real numbers, got torch.bool"),
    (torch.tensor([1 + 2j, 0j]), TypeError, "real numbers, got torch.complex"),
    ([1 + 2j, 0], TypeError, "real numbers, got torch.complex"),
    ([], ValueError, "at least one entry"),
    (["a", "b"], TypeError, "init must be an operator spec or numbers"),
])
def test_polynomial_init_that_is_not_real_numbers_is_refused(init, exc, match):
    """Bug: ``PolynomialOperator(init=[True, False])`` ran as ``I``, a complex init silently lost its imaginary
    part, ``init=[]`` made a head that outputs zero, and ``init=["a"]`` said only "too many dimensions 'str'"."""
    with pytest.raises(exc, match=match):
        PolynomialOperator(steps=1, init=init)


def test_polynomial_numeric_inits_and_every_operator_pickle():
    """Pins: integer and numpy inits are read as the numbers they are, and a pickled operator keeps its repr."""
    assert PolynomialOperator(steps=2, init=torch.tensor([1, 2])).theta.tolist() == [[1.0, 2.0, 0.0]]
    assert PolynomialOperator(steps=1, init=np.array([0.5, 0.25])).spec() == "polynomial(steps=1, init=[0.5, 0.25])"
    for op in (HeatOperator(t=0.5, learnable=True, num_heads=3), PPROperator(learnable=True, num_heads=2),
               PolynomialOperator(basis="chebyshev"), ExactHeatOperator(t=-0.5)):
        assert repr(pickle.loads(pickle.dumps(op))) == repr(op)


def test_typeset_dashes_resolve_to_the_operator():
    """Bug: ``build_operator("I−P")`` (U+2212, as "I − P" is typeset in the paper) was an unknown operator, and
    the error had no "did you mean"."""
    assert build_operator("I\u2212P").name == "laplacian"
    assert build_operator("heat\u2013exact(t=0.5)").name == "heat-exact"
    assert [g.operator.name for g in parse_heads("attention:1,I \u2212 P:1", 2)] == ["attention", "laplacian"]


# ---------------------------------------------------------------- operators against float64 references
def _proj(layer, x):
    q, k, v = (x @ layer.qkv.weight.T + layer.qkv.bias).split(D, -1)
    return [t.view(B, N, H, C).transpose(1, 2) for t in (q, k, v)]


def _softmax(q, k, allowed):
    s = (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).masked_fill(~allowed, -math.inf)
    return torch.softmax(s, -1)


_I = torch.eye(N, dtype=torch.float64)
_REFS = {
    "heat-exact(t=-0.5)": lambda P, U, v, v0: torch.linalg.matrix_exp(0.5 * (_I - P)) @ v,
    "heat(t=1.3, steps=None)": lambda P, U, v, v0: torch.linalg.matrix_exp(-1.3 * (_I - P)) @ v,
    "ppr-exact(alpha=0.15)": lambda P, U, v, v0: 0.15 * torch.linalg.solve(_I - 0.85 * P, v),
    "ppr(alpha=0.3, steps=3)": lambda P, U, v, v0: (0.3 * (_I + 0.7 * P + 0.49 * P @ P) + 0.343 * P @ P @ P) @ v,
    "polynomial(steps=2, init=[0.5, -1.0, 2.0], basis='chebyshev')": lambda P, U, v, v0: (0.5 * _I - P + 2 * P @ P) @ v,
    "attnscale(omega=0.3, learnable=False)": lambda P, U, v, v0: U @ v + 1.3 * (P @ v - U @ v),
    "neutreno(lam=0.4)": lambda P, U, v, v0: P @ v + 0.4 * (v0 - v),
    "value-residual(lam=0.7)": lambda P, U, v, v0: P @ (v + 0.7 * v0),
    "grand-nl(t=1.0, steps=1)": lambda P, U, v, v0: P @ v,
}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("spec", sorted(_REFS))
def test_operator_in_a_layer_matches_its_formula_on_an_explicit_softmax(spec, causal):
    """Pins: each operator in a float64 layer, with key padding (and causal), against its paper's formula on an
    explicit softmax ``P`` (``matrix_exp``, ``linalg.solve``, ``DC`` the uniform average over admissible keys,
    ``v0`` the first layer's values); the truncated heat series within its ``1e-4`` tolerance."""
    torch.manual_seed(0)
    x, x0 = torch.randn(B, N, D, dtype=torch.float64), torch.randn(B, N, D, dtype=torch.float64)
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[1, 3:] = True
    first = DiffusionAttention(D, H, "attention", causal=causal).double().eval()
    layer = DiffusionAttention(D, H, f"{spec}:{H}", causal=causal).double().eval()
    state = LayerState()
    first(x0, key_padding_mask=pad, state=state)
    y = layer(x, key_padding_mask=pad, state=state)
    q, k, v = _proj(layer, x)
    v0 = _proj(first, x0)[2]
    allowed = ~pad[:, None, None, :] & (torch.ones(N, N, dtype=torch.bool).tril() if causal else True)
    U = allowed.double() / allowed.double().sum(-1, keepdim=True)
    out = _REFS[spec](_softmax(q, k, allowed), U.expand(B, H, N, N), v, v0)
    ref = out.transpose(1, 2).reshape(B, N, D) @ layer.out_proj.weight.T + layer.out_proj.bias
    keep = ~pad  # padded queries: any finite output
    tol = 2e-4 if spec.startswith("heat(") else 1e-12
    torch.testing.assert_close(y[keep], ref[keep], rtol=0, atol=tol)


# ---------------------------------------------------------------- sampling filters
@pytest.mark.parametrize("filt", [lambda x: top_k_filter(x, 1), lambda x: top_p_filter(x, 0.5)])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_sampling_filters_refuse_nan_and_plus_inf_logits(filt, bad):
    """Bug: ``top_k_filter([[nan, 1, 2, 0]], 1)`` kept all four tokens (NaN ranks above every number, so the
    ``k``-th largest was NaN), and ``top_p_filter`` kept every token of a row with a NaN or ``+inf`` logit
    (its probabilities were NaN)."""
    with pytest.raises(ValueError, match=r"logits must be finite or -inf .* at index \(1, 0\)"):
        filt(torch.tensor([[0.0, 1.0, 2.0, 0.0], [bad, 1.0, 2.0, 0.0]]))


@pytest.mark.parametrize("logits,exc,match", [
    ([[1.0, 2.0]], TypeError, "logits must be a torch.Tensor"),
    (torch.tensor([[1, 3, 2]]), TypeError, "floating-point tensor, got torch.int64"),
    (torch.tensor([[True, False]]), TypeError, "floating-point tensor, got torch.bool"),
    (torch.tensor(1.0), ValueError, "got a 0-d tensor"),
])
def test_sampling_filters_name_bad_logits(logits, exc, match):
    """Bug: integer logits gave "value cannot be converted to type int64_t without overflow", a list an
    AttributeError or a ``sort()`` signature dump, and a 0-d tensor an IndexError."""
    for name, filt in (("top_k", lambda x: top_k_filter(x, 1)), ("top_p", lambda x: top_p_filter(x, 0.5))):
        with pytest.raises(exc, match=f"{name}: .*{match}"):
            filt(logits)


def test_sampling_filters_on_legal_edges_match_hand_computation():
    """Pins: ``-inf`` (removed) logits are kept as they are, ``k`` beyond the vocabulary keeps all, ties with the
    ``k``-th are kept, ``p = 1`` keeps all, a tiny ``p`` keeps the most likely token, empty shapes pass."""
    inf = float("inf")
    row = torch.tensor([[-inf, 1.0, 3.0, 2.0, 2.0]])
    assert top_k_filter(row, 10).tolist() == row.tolist()
    assert top_k_filter(row, 2).tolist() == [[-inf, -inf, 3.0, 2.0, 2.0]]
    assert top_p_filter(row, 1.0).tolist() == row.tolist()
    assert top_p_filter(row, 1e-300).isfinite().tolist() == [[False, False, True, False, False]]
    probs = torch.softmax(row.double(), -1)[0]  # 3 alone holds p3; with one 2 it holds p3 + p2 > 0.75
    p = (probs[2] + probs[3] / 2).item()
    assert top_p_filter(row, p).isfinite().sum().item() == 2
    assert top_k_filter(torch.full((1, 3), -inf), 1).tolist() == [[-inf] * 3]
    assert top_p_filter(torch.zeros(0, 4), 0.5).shape == (0, 4)
    assert top_k_filter(torch.zeros(2, 0), 3).shape == (2, 0)


# ---------------------------------------------------------------- head specs
@pytest.mark.parametrize("heads", [{1: "laplacian:2", -1: "attention:2"}, {"1": "laplacian:2", 1: "attention:2"},
                                   MappingProxyType({0: None, "-2": "laplacian:2"})])
def test_a_layer_dict_naming_one_layer_twice_is_refused(heads):
    """Bug: ``resolve_layer_heads(2, 2, {1: "laplacian:2", -1: "attention:2"})`` returned ``[None, "attention:2"]``:
    both keys name layer 1 and the first spec was dropped without a word (likewise ``"1"`` and ``1``)."""
    with pytest.raises(ValueError, match="names layer [01] (of 2 )?twice"):
        resolve_layer_heads(2, 2, heads)


def test_resolve_layer_heads_reads_numpy_ints_and_checks_num_heads():
    """Bug: ``resolve_layer_heads(np.int64(2), 4, laplacian_heads=np.int64(2))`` (a sweep grid's numbers) was
    refused as "must be an int ... got np.int64(2)", while ``num_heads="4"`` gave "unsupported operand type(s) for
    //" and ``num_heads=0`` was accepted."""
    assert resolve_layer_heads(np.int64(2), 4, laplacian_heads=np.int64(2)) == ["attention:2,laplacian:2"] * 2
    assert resolve_layer_heads(2, np.int64(4), laplacian_heads=[np.int64(4), 0]) == ["laplacian:4", None]
    for bad in ("4", 0, -2, 2.0, True):
        with pytest.raises(ValueError, match="num_heads must be a positive int"):
            resolve_layer_heads(2, bad, heads="attention:{half},laplacian:{half}")


def test_parse_heads_refuses_bytes():
    """Bug: ``parse_heads(b"attention", 2)`` read the bytes as a per-head list of nine ints ("a per-head list
    must have num_heads=2 entries, got 9")."""
    with pytest.raises(TypeError, match="got bytes"):
        parse_heads(b"attention", 2)


def test_head_specs_with_whitespace_and_repeats():
    """Pins: whitespace (tabs, newlines, no-break spaces) around names and counts, repeated operators (separate
    groups) and empty items parse as written; a count with two colons names the bad operator."""
    groups = parse_heads(" attention : 1 ,\tattention:1,\n\u00a0laplacian:2,", 4)
    assert [(g.operator.name, g.start, g.count) for g in groups] == [("attention", 0, 1), ("attention", 1, 1),
                                                                     ("laplacian", 2, 2)]
    assert groups[0].operator is not groups[1].operator
    with pytest.raises(ValueError, match="unknown operator 'attention:1'.*did you mean 'attention'"):
        parse_heads("attention:1:2,laplacian:2", 4)
    with pytest.raises(ValueError, match="per-layer heads list must have 3 entries"):
        resolve_layer_heads(3, 2, ["attention", "laplacian"])


# ---------------------------------------------------------------- blocks
@pytest.mark.parametrize("kw,exc,match", [
    ({"dropout": float("nan")}, ValueError, "dropout must lie in \\[0, 1\\], got nan"),
    ({"dropout": 1.5}, ValueError, "dropout must lie in \\[0, 1\\], got 1.5"),
    ({"mlp_ratio": "4"}, TypeError, "mlp_ratio must be a float, got str"),
    ({"mlp_ratio": None}, TypeError, "mlp_ratio must be a float, got NoneType"),
    ({"mlp_ratio": True}, TypeError, "mlp_ratio must be a float, got bool"),
])
def test_block_names_bad_arguments(kw, exc, match):
    """Bug: ``Block(dropout=nan)`` was built and failed at the first training step inside ``nn.Dropout``;
    ``mlp_ratio="4"`` or ``None`` gave "'<' not supported between instances", and ``mlp_ratio=True`` built an
    MLP of width ``D``."""
    with pytest.raises(exc, match=match):
        Block(D, H, **kw)
    if "dropout" in kw:
        with pytest.raises(ValueError, match="Mlp: dropout must lie in"):
            Mlp(D, **kw)


def test_block_reads_numpy_scalars_and_names_an_integer_input():
    """Bug: ``Block(layer_scale=np.float32(1e-5))`` and ``Mlp(8, np.int64(16))`` were refused as "must be a finite
    float / positive int, got np.float32(1e-05)"; an integer input gave "mixed dtype (CPU)" from the norm."""
    blk = Block(D, H, layer_scale=np.float32(0.5), mlp_ratio=np.float64(2.0), dropout=np.float32(0.0)).eval()
    assert blk.ls1.gamma.tolist() == [0.5] * D and blk.mlp.fc1.out_features == 2 * D
    assert Mlp(D, np.int64(16)).fc1.out_features == 16
    with pytest.raises(TypeError, match="Block: x must be a floating-point tensor, got torch.int64"):
        blk(torch.ones(1, 3, D, dtype=torch.long))
    assert Block(D, H, dropout=1.0).eval()(torch.randn(0, 3, D)).shape == (0, 3, D)  # p = 1 stays legal
