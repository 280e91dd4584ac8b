"""User walk 61r: a researcher writes their own operators (a learned polynomial, a rational ``(I - beta P)^-1`` through
``apply_matrix`` with a dropout rule) and mixes them with the built-in heads (each test's docstring says what was
wrong, if anything)."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.operators import (DiffusionOperator, build_operator, list_operators, register_operator,
                                      unregister_operator)


class _LearnedQuad(DiffusionOperator):
    r"""``f(P) = theta_0 I + theta_1 P + theta_2 P^2`` with learned ``theta`` (one row per head)."""

    name = "walk61r-quad"

    def __init__(self, init: tuple = (1.0, -0.5, 0.25), num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.init = tuple(float(c) for c in init)
        self.theta = torch.nn.Parameter(torch.tensor(self.init).repeat(num_heads, 1))

    @property
    def degree(self) -> int:
        return len(self.init) - 1

    def coefficients(self) -> torch.Tensor:
        return self.theta

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.theta.copy_(torch.tensor(self.init).repeat(self.num_heads, 1))

    def spec_kwargs(self) -> dict:
        return {"init": self.init}


class _Rational(DiffusionOperator):
    r"""``f(P) = (I - beta P)^{-1}``, a matrix function of ``P`` (no finite polynomial), by ``linalg.solve``."""

    name = "walk61r-rational"
    is_polynomial = False
    supports_sparse = False

    def __init__(self, beta: float = 0.5, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.beta = float(beta)

    def apply_matrix(self, P: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        eye = torch.eye(P.shape[-1], dtype=P.dtype, device=P.device)
        return torch.linalg.solve(eye - self.beta * P, v.to(P.dtype)).to(v.dtype)

    def check_attention_dropout(self, p: float) -> None:
        # kept entries scaled by 1/(1-p): a row sum up to 1/(1-p), so I - beta P stays invertible for beta < 1-p
        if p >= 1 - self.beta:
            raise ValueError(f"dropout {p} on P needs beta < 1 - p, got beta={self.beta}")

    def spec_kwargs(self) -> dict:
        return {"beta": self.beta}


@pytest.fixture
def own_operators():
    register_operator(_LearnedQuad)
    register_operator(_Rational)
    yield
    for name in (_LearnedQuad.name, _Rational.name):
        if name in list_operators():
            unregister_operator(name)


def _reference(layer: DiffusionAttention, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The layer's output in float64 from its weights: ``P`` from ``q``, ``k`` by hand, each head's ``f(P) v``."""
    B, N, D = x.shape
    H = layer.num_heads
    C = D // H
    q, k, v = (x @ layer.qkv.weight.T + layer.qkv.bias).split(D, -1)
    q, k, v = (t.view(B, N, H, C).transpose(1, 2) for t in (q, k, v))  # (B, H, N, C)
    s = q @ k.transpose(-1, -2) / math.sqrt(C)
    if mask is not None:
        s = s.masked_fill(~mask[:, None], float("-inf"))
    P = s.softmax(-1)
    eye = torch.eye(N, dtype=x.dtype)
    theta = layer.operators[2].theta[0]
    heads = [P[:, 0] @ v[:, 0], v[:, 1] - P[:, 1] @ v[:, 1],
             theta[0] * v[:, 2] + theta[1] * P[:, 2] @ v[:, 2] + theta[2] * P[:, 2] @ P[:, 2] @ v[:, 2],
             torch.linalg.solve(eye - 0.3 * P[:, 3], v[:, 3])]
    out = torch.stack(heads, 1).transpose(1, 2).reshape(B, N, D)
    return out @ layer.out_proj.weight.T + layer.out_proj.bias


@pytest.mark.parametrize("backend", ["sdpa", "matrix"])
@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("graph", ["complete", "causal", "padded causal"])
def test_own_operators_mixed_with_built_in_heads_match_a_float64_reference(own_operators, backend, recompute, graph):
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, heads="attention:1,laplacian:1,walk61r-quad:1,walk61r-rational(beta=0.3):1",
                               backend=backend, recompute=recompute).double()
    B, N = 2, 6
    x = torch.randn(B, N, 16, dtype=torch.float64, requires_grad=True)
    padding = torch.zeros(B, N, dtype=torch.bool)
    padding[1, -2:] = True
    causal = torch.ones(N, N, dtype=torch.bool).tril().expand(B, N, N)
    kwargs, mask = {
        "complete": ({}, None),
        "causal": ({"is_causal": True}, causal),
        "padded causal": ({"is_causal": True, "key_padding_mask": padding}, causal & ~padding[:, None, :]),
    }[graph]
    out, ref = layer(x, **kwargs), _reference(layer, x, mask)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    g = torch.randn_like(out)
    params = [x, *layer.parameters()]
    for got, want in zip(torch.autograd.grad(out, params, g), torch.autograd.grad(ref, params, g)):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)
    with pytest.raises(ValueError, match="needs beta < 1 - p"):
        DiffusionAttention(16, 4, heads="walk61r-rational(beta=0.5):4", dropout=0.6)


@pytest.mark.parametrize("flag, value, meant", [
    ("is_polynomal", False, "is_polynomial"),
    ("supports_kv_cashe", False, "supports_kv_cache"),
    ("need_second_map", True, "needs_second_map"),
    ("supports_sparce", False, "supports_sparse"),
    ("example_kwarg", {"beta": 0.3}, "example_kwargs"),
])
def test_bug_a_misspelt_capability_flag_is_refused_at_registration(flag, value, meant):
    """Bug: ``is_polynomal = False`` (or any misspelt flag) was a new class attribute that nothing read: the registry
    took the class, and the operator ran with the flag's default. A rational operator that also declares a degree and
    truncated coefficients (for the polynomial back-ends) ran that polynomial instead of its ``apply_matrix``, and
    one that cannot be served by cached decoding (``supports_kv_cashe = False``) was, without a word."""

    class Truncated(DiffusionOperator):
        name = "walk61r-misspelt"
        supports_sparse = False
        apply_matrix = _Rational.apply_matrix
        beta = 0.5

        @property
        def degree(self) -> int:
            return 2

        def coefficients(self) -> torch.Tensor:  # (I - beta P)^-1 truncated after P^2
            return torch.tensor([1.0, self.beta, self.beta**2])

    setattr(Truncated, flag, value)
    try:
        with pytest.raises(ValueError, match=rf"Truncated: class attribute '{flag}' .* \(did you mean '{meant}'\?\)"):
            register_operator(Truncated)
    finally:
        if Truncated.name in list_operators():
            unregister_operator(Truncated.name)


def test_attributes_near_a_flag_name_of_another_type_and_the_real_flags_register():
    class Documented(_LearnedQuad):
        name = "walk61r-documented"
        supports_sparse = True
        supports_kv_cache = True
        supports_sparse_note = "dense and sparse alike"  # not a bool: not read as a misspelt flag
        learnable = True  # a bool, but no flag's near miss

    try:
        register_operator(Documented)
        assert "walk61r-documented" in list_operators()
    finally:
        if Documented.name in list_operators():
            unregister_operator(Documented.name)


class _SparsePowers(_LearnedQuad):
    r"""A learned polynomial initialised from a dict ``{power: coefficient}`` (the powers it leaves out start at 0)."""

    name = "walk61r-powers"

    def __init__(self, powers: dict | None = None, num_heads: int = 1) -> None:
        powers = {0: 1.0, 2: -0.5} if powers is None else dict(powers)
        super().__init__(tuple(float(powers.get(k, 0.0)) for k in range(max(powers) + 1)), num_heads)
        self.powers = powers

    def spec_kwargs(self) -> dict:
        return {"powers": self.powers}


@pytest.fixture
def powers_operator():
    register_operator(_SparsePowers)
    yield
    unregister_operator(_SparsePowers.name)


@pytest.mark.parametrize("powers", [{0: 1.0, 3: 0.25}, {1: 0.5}])
def test_bug_an_operator_argument_holding_a_dict_reads_back_from_the_layers_heads_spec(powers_operator, powers):
    """Bug: ``heads_spec()`` writes a dict (or set) argument as ``spec()`` does, ``walk61r-powers(powers={0: 1.0, 3:
    0.25}):2``, which ``build_operator`` reads, but a head spec read its braces as a template: "only the templates {H}
    and {half} are known", so the layer's own spec (its repr, a checkpoint's model record) rebuilt nothing, and no head
    spec could give such an argument at all."""
    attention = build_operator("attention")
    layer = DiffusionAttention(16, 4, heads=[_SparsePowers(powers, num_heads=2)] * 2 + [attention] * 2)
    spec = layer.heads_spec()
    assert spec == f"walk61r-powers(powers={powers!r}):2,attention:2"
    again = DiffusionAttention(16, 4, heads=spec)
    assert again.heads_spec() == spec and again.operators[0].powers == powers
    again.load_state_dict(layer.state_dict())
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(again(x), layer(x), rtol=0, atol=0)
    # with the templates, which are still filled (and a template that is no literal still refused)
    templated = DiffusionAttention(16, 4, heads=f"walk61r-powers(powers={powers!r}):{{half}},attention:{{half}}")
    assert templated.heads_spec() == spec
    with pytest.raises(ValueError, match=r"only the templates \{H\} and \{half\} are known"):
        DiffusionAttention(16, 4, heads=f"walk61r-powers(powers={powers!r}):{{quarter}},attention:{{half}}")


def test_a_longer_flag_like_name_of_ones_own_registers():
    """Only a slip of a letter or two is a misspelt flag: a longer bool attribute of one's own whose name starts as a
    flag's (``is_polynomial_like``, ``supports_sparse_grad``) registers."""
    class Mine(_LearnedQuad):
        name = "walk61r-own-flags"
        is_polynomial_like = True
        supports_sparse_grad = False

    register_operator(Mine)
    unregister_operator(Mine.name)
