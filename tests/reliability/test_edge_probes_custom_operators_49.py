"""Edge probes of writing your own operator (sitting 49): subclasses of the library's operators, the registry, the
harness and a model holding a custom operator, each against explicit float64 matrices (each test's docstring says
what it checks; those starting with "Bug:" say what was wrong)."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from torch import nn

from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached
from diffusionformer.operators import (DiffusionOperator, ExactHeatOperator, ExactPPROperator, HeatOperator,
                                       LaplacianOperator, build_operator, register_operator, unregister_operator)
from diffusionformer.testing import assert_operator

D, H = 8, 2


def _qkv(layer: DiffusionAttention, x: torch.Tensor, allowed: torch.Tensor | None):
    """``P = softmax(q k^T / sqrt(C))`` with ``allowed`` (``[query, key]``) and ``v``, in float64 by hand."""
    B, N, _ = x.shape
    C = D // H
    qkv = x.double() @ layer.qkv.weight.double().T + layer.qkv.bias.double()
    q, k, v = (t.view(B, N, H, C).transpose(1, 2) for t in qkv.split(D, dim=-1))
    S = q @ k.transpose(-1, -2) / math.sqrt(C)
    if allowed is not None:
        S = S.masked_fill(~allowed, float("-inf"))
    return torch.nan_to_num(torch.softmax(S, dim=-1)), v


def _out(layer: DiffusionAttention, heads: torch.Tensor) -> torch.Tensor:
    B, _, N, C = heads.shape
    o = heads.transpose(1, 2).reshape(B, N, D)
    return o @ layer.out_proj.weight.double().T + layer.out_proj.bias.double()


def _half_step(P: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A non-polynomial-looking f(P) v = (v + P v) / 2 that a subclass applies to the materialised P."""
    return (0.5 * v + 0.5 * (P @ v)).to(v.dtype)


class _HalfStepPPR(ExactPPROperator):
    """ppr-exact redefined by its apply_matrix alone, as a user tries another f(P) on the parent's plumbing."""

    def apply_matrix(self, P, v):
        return _half_step(P, v)


@pytest.mark.parametrize("path", ["causal", "kv-cache", "full"])
def test_subclass_overriding_apply_matrix_alone_runs_it_on_causal_and_cached_calls(path):
    """Bug: a subclass of ``ppr-exact`` that redefined ``apply_matrix()`` alone kept its parent's
    ``apply_causal_matrix()`` (the triangular solve), which causal layers and cached decoding call instead: a
    non-causal call ran the subclass's ``(v + P v) / 2`` and a causal one (or a KV-cache decode) the parent's
    PageRank, silently (error 0.3 here). Such a class now gets the default causal hook, ``apply_matrix`` on the
    lower-triangular ``P``; against explicit float64 matrices on every path."""
    torch.manual_seed(0)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    causal = path != "full"
    layer = DiffusionAttention(D, H, heads=_HalfStepPPR(alpha=0.3), causal=causal).double().eval()
    allowed = torch.ones(6, 6, dtype=torch.bool).tril() if causal else None
    P, v = _qkv(layer, x, allowed)
    want = _out(layer, _half_step(P, v))
    with torch.no_grad():
        if path == "kv-cache":
            cache = LayerKVCache()
            got = torch.cat([attend_cached(layer, x[:, :3], cache)]
                            + [attend_cached(layer, x[:, i:i + 1], cache) for i in range(3, 6)], dim=1)
        else:
            got = layer(x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # the parent keeps its own triangular solve; a subclass that defines both keeps both
    assert ExactPPROperator.apply_causal_matrix is not DiffusionOperator.apply_causal_matrix

    class Both(ExactPPROperator):
        def apply_matrix(self, P, v):
            return _half_step(P, v)

        def apply_causal_matrix(self, P, v):
            return _half_step(P, v)

    assert Both.apply_causal_matrix is not DiffusionOperator.apply_causal_matrix


def test_harness_judges_a_redefined_rival_subclass_by_its_own_apply_matrix():
    """Bug: :func:`assert_operator` held every subclass of ``ppr-exact`` (and the other rivals with a library
    formula) to its parent's closed form, so a correct subclass that redefines ``apply_matrix`` failed ("dense
    backend='matrix' causal=False vs float64 reference"). It is now judged by its own float64 ``apply_matrix``;
    a plain subclass still by the formula, and a subclass whose causal hook contradicts its ``apply_matrix`` fails."""
    assert_operator(_HalfStepPPR(alpha=0.5))

    class Renamed(ExactPPROperator):
        pass

    assert_operator(Renamed(alpha=0.5))

    class WrongCausal(ExactPPROperator):
        def apply_causal_matrix(self, P, v):
            return _half_step(P, v)

    with pytest.raises(AssertionError, match="causal=True"):
        assert_operator(WrongCausal(alpha=0.5))


def _learned(coefficients):
    class Learned(DiffusionOperator):
        degree = 1

        def __init__(self, num_heads: int = 1) -> None:
            super().__init__(num_heads)
            self.w = nn.Parameter(torch.tensor(0.3))

        def coefficients(self):
            return coefficients(self)

        def reset_parameters(self):
            with torch.no_grad():
                self.w.fill_(0.3)

    return Learned


@pytest.mark.parametrize("how", ["item", "detach", "unused"])
def test_harness_fails_learned_parameters_that_never_reach_the_coefficients(how):
    """Bug: :func:`assert_operator` passed a learned operator whose coefficients were computed from
    ``w.item()``, ``w.detach()`` or not from ``w`` at all: every law held, and in a layer the head never trained
    (no gradient, no error). It now fails, naming the parameter; a differentiable one still passes, also when the
    check runs under ``torch.no_grad()``."""
    bad = {
        "item": lambda s: torch.tensor([1.0 - s.w.item(), s.w.item()]),
        "detach": lambda s: torch.stack([1.0 - s.w.detach(), s.w.detach()]),
        "unused": lambda s: torch.tensor([0.7, 0.3]),
    }[how]
    with pytest.raises(AssertionError, match=r"learned parameters \['w'\]"):
        assert_operator(_learned(bad)(num_heads=2))
    good = _learned(lambda s: torch.stack([1.0 - s.w, s.w]))
    assert_operator(good(num_heads=2))
    with torch.no_grad():
        assert_operator(good(num_heads=2), dtype=torch.float32)
    frozen = good(num_heads=2)
    frozen.w.requires_grad_(False)
    assert_operator(frozen)  # a frozen parameter is not a learned one


def test_harness_fails_a_matrix_operator_whose_learned_time_never_reaches_apply_matrix():
    """Bug: as for coefficients, a learnable ``heat-exact`` subclass whose ``apply_matrix`` read its time as a
    Python float passed :func:`assert_operator`; it now fails naming ``t``, and the library's learnable heat-exact
    (and learnable heat, ppr, polynomial) pass."""

    class FrozenTime(ExactHeatOperator):
        def apply_matrix(self, P, v):
            t = float(self.t.detach()[0])
            eye = torch.eye(P.shape[-1], dtype=P.dtype)
            return (torch.linalg.matrix_exp(-t * (eye - P)) @ v).to(v.dtype)

    with pytest.raises(AssertionError, match=r"apply_matrix\(\) does not depend .* \['t'\]"):
        assert_operator(FrozenTime(t=0.5, learnable=True))
    assert_operator("heat-exact", t=0.5, learnable=True)
    assert_operator("heat", t=0.7, steps=4, learnable=True)
    assert_operator("ppr", alpha=0.2, steps=4, learnable=True)
    assert_operator("polynomial", steps=3, init=[0.1, 0.2, 0.3, 0.4])


def test_harness_catches_wrong_coefficients():
    """Coefficients of the wrong width, non-finite or per-head with G != num_heads are refused with a message."""
    def op(c):
        class Fixed(DiffusionOperator):
            degree = 1

            def coefficients(self):
                return c

        return Fixed(num_heads=2)

    with pytest.raises(AssertionError, match=r"shape \(2, 3\), expected \(2, 2\)"):
        assert_operator(op(torch.tensor([0.5, 0.5, 0.1])))
    with pytest.raises(AssertionError, match="not finite"):
        assert_operator(op(torch.tensor([float("nan"), 1.0])))
    with pytest.raises(AssertionError, match="cannot serve 2 heads: .*coefficients for 3 heads, asked for 2"):
        assert_operator(op(torch.ones(3, 2) / 2))
    assert_operator(op(torch.tensor([0.5, 0.5], dtype=torch.float16)))  # exact in half: fine


@pytest.mark.parametrize("name, aliases", [("attention", ()), ("ATTN", ()), ("fresh-one", ("I - P",)),
                                           ("a(b", ()), ("a:b", ()), ("a,b", ()), ("True", ())])
def test_register_refuses_taken_and_unreadable_names(name, aliases):
    """Names and aliases already taken (case, spaces ignored) or that specs cannot read back are refused, and the
    registry is left as it was."""
    class Mine(DiffusionOperator):
        degree = 1

        def coefficients(self):
            return torch.tensor([0.5, 0.5])

    from diffusionformer.operators import list_operators
    before = list_operators()
    with pytest.raises(ValueError):
        register_operator(Mine, name=name, aliases=aliases)
    assert list_operators() == before


class _LapSquared(DiffusionOperator):
    """The tutorial's iterated Laplacian (module level: ``torch.save`` of a whole layer pickles its class)."""

    name = "probe49-lap-pow"
    aliases = ("probe49 lp",)

    def __init__(self, order: int = 2, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.order = order
        self._static = tuple(float((-1) ** k * math.comb(order, k)) for k in range(order + 1))
        self.register_buffer("_c", torch.tensor(self._static), persistent=False)

    @property
    def degree(self) -> int:
        return self.order

    def coefficients(self):
        return self._c

    def static_coefficients(self):
        return self._static

    def spec_kwargs(self):
        return {"order": self.order}


def test_registered_operator_round_trips_through_spec_heads_and_state():
    """A registered custom operator with arguments: ``build_operator`` by alias with arguments, ``spec()`` round
    trip, a ``heads=`` mix, state dict, deepcopy, ``torch.save`` of the whole layer, ``.double()`` and meta-device
    init give the float64 matrices' answer ``(I - P)^2 v`` on its heads."""

    register_operator(_LapSquared)
    try:
        op = build_operator("Probe49_LP(order=2)")
        assert op.spec() == "probe49-lap-pow(order=2)" and build_operator(op.spec()).order == 2
        with pytest.raises(ValueError, match="already registered"):
            register_operator(_LapSquared, name="probe49-other")
        heads = "attention:1,probe49 lp(order=2):1"
        torch.manual_seed(0)
        layer = DiffusionAttention(D, H, heads=heads)
        x = torch.randn(2, 5, D)
        P, v = _qkv(layer, x, None)
        want = _out(layer, torch.stack([P[:, 0] @ v[:, 0], v[:, 1] - 2 * P[:, 1] @ v[:, 1]
                                        + P[:, 1] @ (P[:, 1] @ v[:, 1])], 1))
        tol = dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer(x).double(), want, **tol)
        buf = io.BytesIO()
        torch.save(layer, buf)
        buf.seek(0)
        with torch.device("meta"):
            empty = DiffusionAttention(D, H, heads=heads)
        empty.load_state_dict(layer.state_dict(), assign=True)
        for other in (copy.deepcopy(layer), torch.load(buf, weights_only=False), empty):
            torch.testing.assert_close(other(x).double(), want, **tol)
        torch.testing.assert_close(copy.deepcopy(layer).double()(x.double()), want, rtol=1e-10, atol=1e-10)
    finally:
        unregister_operator("probe49-lap-pow")


@pytest.mark.parametrize("sparse", [False, True])
def test_subclasses_overriding_coefficients_or_degree_run_what_they_say(sparse):
    """Subclasses of heat (per-head coefficients), the Laplacian (a larger degree) on the dense and sparse paths
    equal ``sum_k c_k P^k v`` from explicit float64 matrices; a degree below the coefficients' width is refused."""

    class PerHeadHeat(HeatOperator):
        def coefficients(self):
            c = super().coefficients()
            return torch.stack([c, 2 * c])

    class WideLaplacian(LaplacianOperator):
        degree = 3

    heat = HeatOperator(t=0.5, steps=3).coefficients().double()
    torch.manual_seed(0)
    for op, rows in ((PerHeadHeat(t=0.5, steps=3, num_heads=2), [heat, 2 * heat]),
                     (WideLaplacian(), [torch.tensor([1.0, -1.0], dtype=torch.float64)] * 2)):
        layer = DiffusionAttention(D, H, heads=op).double()
        x = torch.randn(1, 6, D, dtype=torch.float64)
        allowed = None
        if sparse:
            edges = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 2, 5], [1, 2, 3, 4, 5, 0, 0, 2, 1]])
            allowed = torch.zeros(6, 6, dtype=torch.bool)
            allowed[edges[1], edges[0]] = True
        P, v = _qkv(layer, x, allowed)
        heads = []
        for h, c in enumerate(rows):
            out, term = torch.zeros_like(v[:, h]), v[:, h]
            for ck in c:
                out, term = out + ck * term, P[:, h] @ term
            heads.append(out)
        want = _out(layer, torch.stack(heads, 1))
        got = layer(x[0], edge_index=edges)[None] if sparse else layer(x)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)

    class NarrowHeat(HeatOperator):
        degree = 2

    with pytest.raises(ValueError, match="degree \\+ 1 = 3"):
        DiffusionAttention(D, H, heads=NarrowHeat(t=0.5, steps=4))


def test_heat_exact_subclass_and_non_polynomial_laplacian_refuse_edges_clearly():
    """A subclass that makes the Laplacian a function of a materialised P (``is_polynomial = False``) runs its
    ``apply_matrix`` densely and is refused on edges with a message, as a heat-exact subclass is."""

    class Squared(LaplacianOperator):
        is_polynomial = False

        def apply_matrix(self, P, v):
            return v - P @ (P @ v)

    class HeatP(ExactHeatOperator):
        def apply_matrix(self, P, v):
            return _half_step(P, v)

    torch.manual_seed(0)
    x = torch.randn(1, 5, D, dtype=torch.float64)
    for op, fn in ((Squared(), lambda P, v: v - P @ (P @ v)), (HeatP(t=0.5), _half_step)):
        layer = DiffusionAttention(D, H, heads=op).double()
        P, v = _qkv(layer, x, None)
        torch.testing.assert_close(layer(x), _out(layer, fn(P, v)), rtol=1e-10, atol=1e-10)
        with pytest.raises(ValueError, match="does not support the sparse back-end"):
            layer(x[0], edge_index=torch.tensor([[0, 1], [1, 2]]))
