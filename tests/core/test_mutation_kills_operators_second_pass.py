"""Tests written in a second-pass mutation-testing audit of the whole operator package
(``diffusionformer/operators/``: the base class and its argument checks, the seed paper's heads,
differential attention, exact and truncated personalised PageRank, the heat kernels, learned
polynomials, the registry, NeuTRENO and value residuals, AttnScale and GRAND-nl).

The first-pass audits (``test_mutation_kills_operators.py``, ``test_mutation_kills_heat_ppr_polynomial.py``,
``test_mutation_kills_rival_operators.py``, ``test_mutation_kills_rivals_dense.py``) pinned the values of the
operators; the mutants here aim at what they left open: argument-validation branches and their
messages, the half-precision and float64 paths, the gradients of the learned parameters, ``extra_repr``,
``state_dict`` and casting, registry edge cases (a single alias given as a string, clashes, did-you-mean,
spec strings with odd spacing, arguments merged over a spec) and schedule boundaries.

Each test kills a mutant of the library code that the rest of the suite let through (its docstring
names it: file and mutation) and checks the code against an independent reference: values and
messages written out by hand, ``f(P) v`` and its gradients from explicit float64 matrices (numpy,
``scipy.linalg.expm``, closed-form derivatives, or float64 autograd through an explicit re-derivation
of the operator's formula), and Poisson tails from scipy. Mutants judged equivalent are listed, with
the reason, at the end of the file. Two tests, whose docstrings start with "Bug:", pin defects fixed
here: ``HeatOperator`` took ``min_t`` unchecked, so ``min_t=nan`` made a learned head output NaN silently,
and ``PPROperator`` read ``learnable`` before checking that it is a bool.
CPU only, deterministic (seeded generators), no network, no files.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats as sps
from scipy.linalg import expm

from diffusionformer.operators import (AttentionOperator, DiffusionOperator, DifferentialOperator, ExactHeatOperator,
                                       ExactPPROperator, HeatOperator, LaplacianOperator, PolynomialOperator, PPROperator,
                                       build_operator, operator_class, parse_operator_spec, register_operator)

f64 = torch.float64


def _stochastic(seed, B, G, N):
    """A random row-stochastic ``P`` ``(B, G, N, N)``, float64 numpy."""
    P = np.random.default_rng(seed).uniform(0.1, 1.0, size=(B, G, N, N))
    return P / P.sum(-1, keepdims=True)


def _normal(seed, *shape):
    return np.random.default_rng(seed).normal(size=shape)


def _poly_np(P, v, coeffs):
    """``sum_k c[g, k] P^k v`` per head, float64 numpy; ``coeffs`` ``(G, K+1)``."""
    out = np.zeros_like(v)
    for g in range(P.shape[1]):
        cur = v[:, g]
        for k, c in enumerate(coeffs[g]):
            out[:, g] += c * cur
            cur = P[:, g] @ cur
    return out


# ---------------------------------------------------------------------------- base.py: apply_matrix dtypes
def test_apply_matrix_keeps_the_value_dtype_for_half_inputs():
    """kills: base.py ``apply_matrix`` ``head_coefficients(...).to(v.dtype)`` -> without the cast (float32
    coefficients promote a float16 product to float32) and ``MatrixBackend(P.to(v.dtype), ...)`` -> ``P`` (a
    float64 ``P`` promotes the float16 output to float64)"""
    P = _stochastic(0, 1, 1, 4)
    v = _normal(1, 1, 1, 4, 3)
    ref = _poly_np(P, v, np.array([[0.0, 1.0]]))
    for P_dtype in (torch.float16, f64):
        out = AttentionOperator().apply_matrix(torch.from_numpy(P).to(P_dtype), torch.from_numpy(v).half())
        assert out.dtype == torch.float16
        np.testing.assert_allclose(out.double().numpy(), ref, atol=1e-2)


def test_apply_matrix_of_a_float32_p_on_float64_values_is_exact_in_float64():
    """kills: base.py ``MatrixBackend(P.to(v.dtype), ...)`` -> ``P`` (the engine then rounds the float64 values to
    float32 at every step); and ``head_coefficients(...).to(v.dtype)`` dropped (float32 coefficients)"""
    P32 = torch.from_numpy(_stochastic(2, 2, 1, 5)).float()
    v = _normal(3, 2, 1, 5, 4)
    op = HeatOperator(t=0.7, steps=6)
    t = 0.7
    c = np.array([[math.exp(-t) * t**k / math.factorial(k) for k in range(7)]])
    ref = _poly_np(P32.double().numpy(), v, c)
    out = op.double().apply_matrix(P32, torch.from_numpy(v))
    assert out.dtype == f64
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------------- base.py: repr and argument checks
def test_base_extra_repr_names_the_head_count():
    """kills: base.py ``DiffusionOperator.extra_repr`` -> ``""`` (the fixed heads print no head count)"""
    assert repr(AttentionOperator(num_heads=3)) == "AttentionOperator(num_heads=3)"
    assert repr(LaplacianOperator()) == "LaplacianOperator(num_heads=1)"


@pytest.mark.parametrize("build", [lambda tol: HeatOperator(t=1.0, steps=None, tol=tol),
                                   lambda tol: PPROperator(alpha=0.5, steps=None, tol=tol)])
def test_a_nan_tolerance_is_refused(build):
    """kills: base.py ``_check_tol`` ``not tol > 0`` -> ``tol <= 0`` (a NaN tolerance is then accepted: NaN compares
    false both ways)"""
    with pytest.raises(ValueError, match=r"^tol must be a positive float \(or None\), got nan$"):
        build(float("nan"))
    with pytest.raises(ValueError, match=r"^tol must be a positive float \(or None\), got -0.1$"):
        build(-0.1)


# ---------------------------------------------------------------------------- differential.py
def test_differential_depth_zero_travels_with_the_spec():
    """kills: differential.py ``spec_kwargs`` ``if self.depth is not None`` -> ``if self.depth`` (layer 0's fixed
    depth is then lost from the spec, and the rebuilt operator takes the layer's depth instead)"""
    op = DifferentialOperator(depth=0)
    assert op.spec() == "differential(depth=0)"
    rebuilt = build_operator(op.spec())
    assert rebuilt.depth == 0
    assert rebuilt.init_value(7) == pytest.approx(0.8 - 0.6, abs=1e-15)  # the schedule at depth 0, not 7


def test_differential_depth_false_is_refused():
    """kills: differential.py ``__init__`` ``if depth is not None: lambda_init_schedule(depth)`` -> ``if depth:``
    (``depth=False`` is then stored unchecked)"""
    with pytest.raises(ValueError, match=r"^depth must be a non-negative int, got False$"):
        DifferentialOperator(depth=False)


def test_differential_extra_repr_names_every_setting():
    """kills: differential.py ``extra_repr`` without ``head_dim``"""
    assert DifferentialOperator(depth=2, head_dim=8).extra_repr() == \
        "depth=2, lambda_init=None, head_dim=8, num_heads=1"
    assert DifferentialOperator(lambda_init=0.25, num_heads=2).extra_repr() == \
        "depth=None, lambda_init=0.25, head_dim=None, num_heads=2"


# ---------------------------------------------------------------------------- ppr_exact.py
def test_ppr_exact_extra_repr_is_short():
    """kills: ppr_exact.py ``extra_repr`` ``alpha:g`` -> the full float repr"""
    assert repr(ExactPPROperator(alpha=1.0)) == "ExactPPROperator(alpha=1, num_heads=1)"
    assert ExactPPROperator(alpha=1 / 3, num_heads=2).extra_repr() == "alpha=0.333333, num_heads=2"



# ---------------------------------------------------------------------------- heat.py
def test_heat_extra_repr_prints_one_time_short_and_several_as_a_list():
    """kills: heat.py ``HeatOperator.extra_repr`` ``t.item():g`` for one time -> the raw ``tolist()``"""
    assert HeatOperator(t=1.0, steps=4).extra_repr() == "t=1, steps=4, method='taylor', learnable=False, num_heads=1"
    assert HeatOperator(t=0.7, steps=4, learnable=True).extra_repr() == \
        "t=0.7, steps=4, method='taylor', learnable=True, num_heads=1"
    op = HeatOperator(t=0.5, steps=4, learnable=True, num_heads=2)
    assert op.extra_repr() == "t=[0.5, 0.5], steps=4, method='taylor', learnable=True, num_heads=2"


def test_exact_heat_gradient_in_a_learned_time_against_the_closed_form():
    """kills: heat.py ``ExactHeatOperator.apply_matrix`` with ``t`` detached (a learned time gets no gradient).

    Reference: ``d/dt exp(-t L) v = -L exp(-t L) v`` with ``L = I - P`` (``scipy.linalg.expm``, float64), so the
    gradient of ``sum(W * out)`` in head ``g``'s time is ``sum(W_g * (-L_g exp(-t_g L_g) v_g))``."""
    P = _stochastic(8, 2, 2, 4)
    v, W = _normal(9, 2, 2, 4, 3), _normal(10, 2, 2, 4, 3)
    times = [0.6, -0.4]
    op = ExactHeatOperator(t=0.6, learnable=True, num_heads=2).double()
    with torch.no_grad():
        op.t.copy_(torch.tensor(times, dtype=f64))
    out = op.apply_matrix(torch.from_numpy(P), torch.from_numpy(v))
    (out * torch.from_numpy(W)).sum().backward()
    ref_out, ref_grad = np.zeros_like(v), np.zeros(2)
    for g, t in enumerate(times):
        for b in range(2):
            L = np.eye(4) - P[b, g]
            y = expm(-t * L) @ v[b, g]
            ref_out[b, g] = y
            ref_grad[g] += np.sum(W[b, g] * (-L @ y))
    np.testing.assert_allclose(out.detach().numpy(), ref_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(op.t.grad.numpy(), ref_grad, rtol=1e-9, atol=1e-12)


def test_heat_fixed_time_is_kept_in_float64():
    """kills: heat.py ``HeatOperator`` the fixed-``t`` buffer built in the default dtype (float32) instead of
    float64 (the time, and the truncation bound computed from it, are then rounded)"""
    op = HeatOperator(t=2.3, steps=3, tol=0.5)
    assert op.t.dtype == f64 and op.t.item() == 2.3 and op.effective_time().item() == 2.3
    assert op.truncation_error().item() == pytest.approx(sps.poisson.sf(3, 2.3), rel=1e-12)


# ---------------------------------------------------------------------------- ppr.py
def test_ppr_extra_repr_prints_one_alpha_short_and_learned_ones_rounded():
    """kills: ppr.py ``extra_repr`` ``a.item():g`` / ``round(x, 4)`` -> the raw ``tolist()`` (float32 noise such
    as ``0.20000000298023224`` in a learned alpha)"""
    assert PPROperator(alpha=0.5, steps=3).extra_repr() == "alpha=0.5, steps=3, learnable=False, num_heads=1"
    assert PPROperator(alpha=0.2, steps=3, learnable=True, num_heads=2).extra_repr() == \
        "alpha=[0.2, 0.2], steps=3, learnable=True, num_heads=2"
    assert PPROperator(alpha=0.2, steps=3, learnable=True).extra_repr() == \
        "alpha=0.2, steps=3, learnable=True, num_heads=1"

# ---------------------------------------------------------------------------- polynomial.py
def test_polynomial_extra_repr_names_a_non_default_basis():
    """kills: polynomial.py ``extra_repr`` without the ``basis`` of a Chebyshev polynomial"""
    assert PolynomialOperator(steps=2, basis="chebyshev", num_heads=2).extra_repr() == \
        "steps=2, num_heads=2, basis='chebyshev'"
    assert PolynomialOperator(steps=2).extra_repr() == "steps=2, num_heads=1"


# ---------------------------------------------------------------------------- registry.py
class _Scratch(DiffusionOperator):
    """A one-step operator for registering and unregistering in tests."""

    @property
    def degree(self) -> int:
        return 1

    def coefficients(self):
        return torch.tensor([0.5, 0.5])


def test_a_clash_with_an_alias_names_the_operator_that_owns_it():
    """kills: registry.py ``register_operator`` the owner of a clashing alias ``_REGISTRY[_ALIASES[k]]`` -> the
    class being registered (the message blamed the newcomer, not the operator that holds the name); and a
    refused registration must leave the registry as it was"""
    cls = type("ScratchClash", (_Scratch,), {})
    with pytest.raises(ValueError, match=r"^operator name 'appnp' is already registered by PPROperator; "):
        register_operator(cls, name="mk-clash", aliases=("mk-clash-alias", "APPNP"))
    with pytest.raises(ValueError, match=r"^operator name 'heat' is already registered by HeatOperator; "):
        register_operator(cls, name="Heat")
    with pytest.raises(ValueError, match=r"unknown operator 'mk-clash-alias'"):
        operator_class("mk-clash-alias")
    assert operator_class("appnp") is PPROperator


def test_did_you_mean_cut_off_is_seven_tenths():
    """kills: registry.py ``operator_class`` ``cutoff=0.7`` -> ``0.6``: ``'pprxyz'`` is ``2*3/9 = 0.667``
    similar to ``'ppr'`` (difflib's ratio), below the cut-off, so nothing is suggested; ``'pprx'`` (0.857) is"""
    with pytest.raises(ValueError) as info:
        operator_class("pprxyz")
    assert str(info.value).startswith("unknown operator 'pprxyz'; valid names: ")
    with pytest.raises(ValueError, match=r"^unknown operator 'pprx' \(did you mean 'ppr'\?\); valid names: "):
        operator_class("pprx")


def test_spec_parsing_strips_the_name_and_takes_spaced_and_multiline_arguments():
    """kills: registry.py ``_SPEC`` the lazy name group ``[^()]*?`` -> greedy ``[^()]*`` (the name then keeps its
    trailing blanks: ``"heat  "``)"""
    assert parse_operator_spec("  heat \t( t = 0.5 ,steps=4 )  ") == ("heat", {"t": 0.5, "steps": 4})
    assert parse_operator_spec("ppr   ") == ("ppr", {})
    assert parse_operator_spec("heat kernel (t=2)") == ("heat kernel", {"t": 2})
    assert parse_operator_spec("heat(\n  t=0.5,\n  steps=4,\n)") == ("heat", {"t": 0.5, "steps": 4})


# ---------------------------------------------------------------------------- cached tables under inference mode
def test_heat_table_first_built_under_inference_mode_still_trains():
    """kills: heat.py ``_taylor_table`` built without ``torch.inference_mode(False)`` (the cached ``k`` and ``1/k!``
    are then inference tensors, which a later training call cannot save for backward).

    Reference: the Taylor weights ``c_k = e^-t t^k / k!`` and their derivative
    ``dc_k/dt = e^-t (k t^(k-1) - t^k) / k!``, so the gradient of ``sum(W * f(P) v)`` in ``t`` is
    ``sum_k dc_k/dt sum(W * P^k v)`` (explicit float64 matrix powers)."""
    from diffusionformer.operators import heat

    heat._taylor_table.cache_clear()
    K, t = 6, 0.8
    with torch.inference_mode():
        HeatOperator(t=t, steps=K).coefficients()
    P, v, W = _stochastic(30, 1, 1, 4), _normal(31, 1, 1, 4, 2), _normal(32, 1, 1, 4, 2)
    op = HeatOperator(t=t, steps=K, learnable=True).double()
    with torch.no_grad():
        op.t.fill_(t)  # the float32 start, cast, is 0.800000011920929
    out = op.apply_matrix(torch.from_numpy(P), torch.from_numpy(v))
    (out * torch.from_numpy(W)).sum().backward()
    powers = [np.linalg.matrix_power(P[0, 0], k) @ v[0, 0] for k in range(K + 1)]
    c = [math.exp(-t) * t**k / math.factorial(k) for k in range(K + 1)]
    dc = [math.exp(-t) * (k * t ** (k - 1) - t**k) / math.factorial(k) for k in range(K + 1)]
    np.testing.assert_allclose(out.detach().numpy()[0, 0], sum(ck * pk for ck, pk in zip(c, powers)), rtol=1e-12)
    assert op.t.grad.item() == pytest.approx(sum(d * np.sum(W[0, 0] * pk) for d, pk in zip(dc, powers)), rel=1e-10)


def test_ppr_table_first_built_under_inference_mode_still_trains():
    """kills: ppr.py ``_ppr_table`` built without ``torch.inference_mode(False)`` (as for the heat table).

    Reference: ``c_k = a (1-a)^k`` (``k < K``), ``c_K = (1-a)^K`` with ``a = sigmoid(l)``, so
    ``dc_k/da = (1-a)^k - k a (1-a)^(k-1)``, ``dc_K/da = -K (1-a)^(K-1)`` and ``da/dl = a (1 - a)``."""
    from diffusionformer.operators import ppr

    ppr._ppr_table.cache_clear()
    K, a = 5, 0.3
    with torch.inference_mode():
        PPROperator(alpha=a, steps=K, learnable=True).double().coefficients()
    P, v, W = _stochastic(33, 1, 1, 4), _normal(34, 1, 1, 4, 2), _normal(35, 1, 1, 4, 2)
    op = PPROperator(alpha=a, steps=K, learnable=True).double()
    with torch.no_grad():
        op.alpha_logit.fill_(math.log(a / (1 - a)))
    out = op.apply_matrix(torch.from_numpy(P), torch.from_numpy(v))
    (out * torch.from_numpy(W)).sum().backward()
    powers = [np.linalg.matrix_power(P[0, 0], k) @ v[0, 0] for k in range(K + 1)]
    c = [a * (1 - a) ** k for k in range(K)] + [(1 - a) ** K]
    dc = [(1 - a) ** k - k * a * (1 - a) ** (k - 1) for k in range(K)] + [-K * (1 - a) ** (K - 1)]
    np.testing.assert_allclose(out.detach().numpy()[0, 0], sum(ck * pk for ck, pk in zip(c, powers)), rtol=1e-12)
    want = a * (1 - a) * sum(d * np.sum(W[0, 0] * pk) for d, pk in zip(dc, powers))
    assert op.alpha_logit.grad.item() == pytest.approx(want, rel=1e-10)


# ---------------------------------------------------------------------------- heat.py: min_t
def test_bug_heat_refuses_a_nan_or_non_number_min_t():
    """Bug: heat.py ``HeatOperator`` took ``min_t`` unchecked: ``min_t=nan`` passed ``t < min_t`` (NaN compares
    false) and ``clamp(min=nan)`` then made every learned time, every coefficient and the head's output NaN with
    no error; ``min_t=None`` failed with Python's bare "'<' not supported" TypeError. Now a TypeError or
    ValueError names ``min_t``; ``-inf`` (no bound) and numpy numbers are still taken."""
    with pytest.raises(ValueError, match=r"^min_t must be a number \(-inf for no bound\), got nan$"):
        HeatOperator(t=1.0, steps=4, learnable=True, min_t=float("nan"))
    for bad, kind in ((None, "NoneType"), ("-1", "str"), (True, "bool")):
        with pytest.raises(TypeError, match=rf"^min_t must be a float, got {kind}$"):
            HeatOperator(t=1.0, steps=4, min_t=bad)
    op = HeatOperator(t=1.0, steps=4, learnable=True, min_t=-math.inf)
    assert torch.isfinite(op.coefficients()).all() and op.min_t == -math.inf
    op = HeatOperator(t=1.0, steps=4, learnable=True, min_t=np.float32(-0.5))
    assert type(op.min_t) is float and op.min_t == -0.5
    with torch.no_grad():
        op.t.fill_(-3.0)
    assert op.effective_time().item() == -0.5


def test_bug_ppr_checks_learnable_before_reading_it():
    """Bug: ppr.py ``PPROperator`` read ``learnable`` (``learnable and alpha >= 1``) before ``check_flag``, so
    ``learnable='yes', alpha=1.0`` was the ValueError about a learnable alpha, not the TypeError about the flag."""
    with pytest.raises(TypeError, match=r"^learnable must be a bool, got str \('yes'\)$"):
        PPROperator(alpha=1.0, steps=4, learnable="yes")
    with pytest.raises(ValueError, match=r"^a learnable alpha must start strictly below 1$"):
        PPROperator(alpha=1.0, steps=4, learnable=True)


def test_bug_a_spec_with_an_infinite_value_builds_back():
    """Bug: registry.py ``parse_operator_spec`` refused ``min_t=-inf`` (``literal_eval`` knows no ``inf``), so the
    spec that ``HeatOperator(min_t=-inf).spec()`` writes, and a config naming "no lower bound", could not be built.
    Bare ``inf``/``nan`` now read as floats; a quoted ``'inf'`` stays a string and other names are still refused."""
    op = HeatOperator(t=0.5, steps=6, learnable=True, min_t=-math.inf)
    assert op.spec() == "heat(t=0.5, steps=6, method='taylor', learnable=True, min_t=-inf)"
    again = build_operator(op.spec())
    assert isinstance(again, HeatOperator) and again.min_t == -math.inf and again.spec() == op.spec()
    name, kwargs = parse_operator_spec("x(a=inf, b=(1, -inf), c=nan, d='inf')")
    assert name == "x" and kwargs["a"] == math.inf and kwargs["b"] == (1, -math.inf) and kwargs["d"] == "inf"
    assert math.isnan(kwargs["c"])
    with pytest.raises(ValueError, match=r"the value of 'a' must be a Python literal"):
        parse_operator_spec("x(a=infinity)")


# ---------------------------------------------------------------------------- equivalent mutants
# 104 mutants were applied (17 in base.py, 1 in basic.py, 8 in differential.py, 2 in ppr_exact.py, 20 in heat.py,
# 10 in ppr.py, 10 in polynomial.py, 21 in registry.py, 3 in neutreno.py, 5 in attnscale.py, 7 in grand.py);
# 82 were killed by the suite before this file, 19 more by this file. The three survivors are equivalent:
# - heat.py ``_check_truncation`` ``if t >= 0`` -> ``if t > 0`` (which explanation the error gives): at ``t = 0``
#   the truncation error is exactly 0, never above the limit, so the message is never built for ``t = 0``.
# - polynomial.py ``_initial`` ``op.coefficients().detach().float()`` -> without ``.float()``: the coefficients
#   are then copied into ``out = torch.zeros(G, K+1)`` (the default dtype, as the operator's own fixed buffer
#   is), and the copy casts them the same way.
# - registry.py ``register_operator`` a dead ``names = ()`` after the registration: the alias keys were already
#   computed from ``names`` and nothing reads it afterwards.
