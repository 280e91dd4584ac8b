"""Edge-case probes: the numerical promises of the operators in ``diffusionformer.operators``.

Probed against float64 references (explicit Taylor series of matrix powers, ``torch.linalg.solve``, the Chebyshev
recursion): the heat series' truncation bound and its choice of ``K`` from ``t`` and ``tol`` (``t`` from ``5e-324``
to 100, negative ``t``, ``K = 0 .. 40``, one-hot, uniform and random rows of ``P``, a cyclic ``P`` with eigenvalues
on the unit circle), the Euler product's first-order bound, the PPR tail ``2 (1 - alpha)^K`` at ``alpha`` near 0
and 1, the exact PPR solve (LU and triangular) at ``alpha`` down to ``1e-9`` in float32, the Chebyshev basis in
float32 and float64, GRAND-nl's Euler (order 1) and RK4 (order 4), bf16 autocast, learned parameters pushed to
extreme values, and ``spec()`` -> ``build_operator`` -> ``spec()`` round trips at the edges.

Found and fixed (each pinned by a "Bug:" test below):

* ``heat-exact`` (and ``ops.heat_kernel_reference``) took :func:`torch.linalg.matrix_exp` as exact, but for a
  lone matrix (a one-head instance at batch size 1) torch takes another path than for a batch, where (torch 2.13,
  against ``scipy.linalg.expm``) ``exp(-t (I - P))`` was 2.5e-5 off in float32 at ``t = 0.29`` and 1.6e-10 off in
  float64 at ``t = 0.025``, 100 and 10^6 times its rounding; a batch of several matrices is exact;
* ``heat(method='euler', steps=None, tol=...)`` could choose ``K < t`` (``t = 1.5, tol = 100`` gave ``K = 1``, the
  product ``(-0.5 I + 1.5 P)``): an unstable operator the explicit ``steps=1`` refuses, whose ``spec()`` could not
  be built back (so a layer's ``heads_spec`` did not rebuild it);
* the Chebyshev basis promised float64 "exact to 1e-10 far beyond" ``K = 12``: the cancelling monomial weights
  (growing like ``2.4^K``) leave 1e-8 at ``K = 24`` and 3e-6 at ``K = 30``.

Checked and sound: the Taylor and PPR bounds and step choices, ``ppr-exact``'s accuracy claims (LU ~1e-7/alpha in
float32, the causal solve ~1e-7 for any alpha), GRAND-nl's orders, learned parameters' parametrisations (PPR's logit
keeps alpha in [0, 1], heat's clamp at ``min_t``, non-finite values refused on CPU).
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.operators import ExactHeatOperator, PolynomialOperator, build_operator
from diffusionformer.operators.heat import heat_coefficients, heat_steps_for_tolerance, heat_truncation_error
from diffusionformer.ops import heat_kernel_reference

F64 = torch.float64


def _cycle(N: int) -> torch.Tensor:
    """The cyclic shift: a row-stochastic ``P`` with one-hot rows and eigenvalues on the whole unit circle."""
    P = torch.zeros(N, N, dtype=F64)
    P[torch.arange(N), (torch.arange(N) + 1) % N] = 1.0
    return P


def _series(c: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """``sum_k c_k P^k`` by explicit matrix powers, float64."""
    out, Pk = torch.zeros_like(P), torch.eye(P.shape[-1], dtype=P.dtype)
    for ck in c.tolist():
        out, Pk = out + ck * Pk, Pk @ P
    return out


def _heat_reference(t: float, P: torch.Tensor) -> torch.Tensor:
    """``exp(-t (I - P))`` as its Poisson series of 60 explicit powers in float64 (exact to rounding for t <= 1)."""
    return _series(heat_coefficients(torch.tensor(t, dtype=F64), 60), P)


def test_bug_heat_exact_is_accurate_for_a_single_matrix():
    """Bug: ``heat-exact`` on one (1, 1, N, N) ``P`` went through ``torch.linalg.matrix_exp``'s lone-matrix path, whose
    degree-8 Taylor step has a wrong coefficient: 2.5e-5 off in float32 at ``t = 0.29`` (vs 2e-7 for a batch of two)
    and 1.6e-10 off in float64 at ``t = 0.025``; ``heat_kernel_reference`` likewise."""
    N = 8
    P = _cycle(N)
    v = torch.randn(1, 1, N, 3, dtype=F64, generator=torch.Generator().manual_seed(0))
    for t, dtype, tol in ((0.29, torch.float32, 1e-6), (0.0247, F64, 1e-14)):
        want = _heat_reference(t, P) @ v[0, 0]
        got = ExactHeatOperator(t=t).to(dtype).apply_matrix(P.to(dtype)[None, None], v.to(dtype))
        assert (got[0, 0].double() - want).abs().max().item() < tol, (t, dtype)
        assert (heat_kernel_reference(P, v[0, 0], t) - want).abs().max().item() < 1e-14
    # a learned t keeps its gradient through the workaround, and a batch of heads agrees with one head at a time
    op = ExactHeatOperator(t=0.29, learnable=True).double()
    op.apply_matrix(P[None, None], v).sum().backward()
    assert op.t.grad is not None and torch.isfinite(op.t.grad).all()
    two = torch.stack([P, P.T])[None]
    both = ExactHeatOperator(t=0.29, num_heads=2).double().apply_matrix(two, v.expand(1, 2, N, 3))
    for g in range(2):
        one = ExactHeatOperator(t=0.29).double().apply_matrix(two[:, g : g + 1], v)
        torch.testing.assert_close(one[:, 0], both[:, g], rtol=0, atol=1e-14)


def test_bug_euler_steps_for_tolerance_never_choose_fewer_steps_than_t():
    """Bug: ``heat(t=1.5, method='euler', steps=None, tol=100.0)`` chose ``K = 1`` (its loose bound met the large tol):
    the unstable product ``-0.5 I + 1.5 P`` that an explicit ``steps=1`` is refused for, and its ``spec()``
    (``steps=1``) raised when built back."""
    assert heat_steps_for_tolerance(1.5, 100.0, "euler") == 2
    assert heat_steps_for_tolerance(3.0, 1e6, "euler") == 3
    assert heat_steps_for_tolerance(-1.5, 1e6, "euler") == 1  # sharpening: (1 + a/K) I - (a/K) P is fine at K = 1
    op = build_operator("heat(t=1.5, method='euler', steps=None, tol=100.0)")
    assert op.degree >= 1.5 and bool((op.coefficients() >= 0).all())  # a convex combination of powers of P
    again = build_operator(op.spec())
    assert again.spec() == op.spec() and torch.equal(again.coefficients(), op.coefficients())


def _chebyshev_error(K: int, seed: int) -> float:
    """Relative error of the float64 Chebyshev operator's monomial form against the Chebyshev recursion."""
    g = torch.Generator().manual_seed(seed)
    N = 8
    A = torch.rand(N, N, dtype=F64, generator=g)
    A = A + A.T
    for _ in range(300):  # a symmetric doubly stochastic P: spectrum in [-1, 1]
        A = A / A.sum(1, keepdim=True)
        A = (A + A.T) / 2
    theta = torch.randn(K + 1, dtype=F64, generator=g)
    T0, T1 = torch.eye(N, dtype=F64), A.clone()
    want = theta[0] * T0 + theta[1] * T1
    for k in range(2, K + 1):
        T0, T1 = T1, 2 * A @ T1 - T0
        want = want + theta[k] * T1
    op = PolynomialOperator(steps=K, basis="chebyshev").double()
    with torch.no_grad():
        op.theta.copy_(theta[None])
    return ((_series(op.coefficients()[0].detach(), A) - want).abs().max() / want.abs().max()).item()


def test_bug_chebyshev_float64_accuracy_is_stated_as_measured():
    """Bug: the Chebyshev basis promised float64 "exact to 1e-10 far beyond" ``K = 12``; its monomial weights grow
    like ``2.4^K`` and cancel, so float64 keeps about 1e-9 at ``K = 20``, 1e-8 at ``K = 24`` and 1e-5 at ``K = 30``."""
    doc = PolynomialOperator.__doc__
    assert "far beyond" not in doc and "K <= 24" in doc
    assert max(_chebyshev_error(20, s) for s in range(3)) < 1e-8
    assert max(_chebyshev_error(24, s) for s in range(3)) < 1e-7
    assert max(_chebyshev_error(30, s) for s in range(3)) > 1e-8  # where "1e-10 far beyond" fails


@pytest.mark.parametrize("t", [-1.5, -0.4, 0.3, 1.0, 2.5])
def test_euler_bound_holds_on_a_cycle_and_a_uniform_p(t):
    """The Euler product's bound ``2 t^2 e^{2|t|} / K`` (first order in 1/K) against the float64 Taylor series,
    on a ``P`` with eigenvalue -1 and complex ones, and on the uniform ``P``; the error halves with ``K``."""
    for P in (_cycle(6), torch.full((6, 6), 1 / 6, dtype=F64)):
        want = _series(heat_coefficients(torch.tensor(t, dtype=F64), 80), P)
        errs = []
        for K in (3, 6, 12, 24, 48):
            got = _series(heat_coefficients(torch.tensor(t, dtype=F64), K, "euler"), P)
            err = (got - want).abs().sum(-1).max().item()
            assert err <= heat_truncation_error(torch.tensor(t, dtype=F64), K, "euler").item()
            errs.append(err)
        if errs[0] > 1e-12:
            assert 1.6 < errs[-2] / errs[-1] < 2.4  # first order


def test_grand_nl_euler_is_first_order_and_rk4_fourth_order():
    """GRAND-nl's fixed-step solvers converge at their orders towards a 256-step RK4 solution (float64 layer)."""
    torch.manual_seed(0)
    D, H, N = 16, 2, 7
    x = torch.randn(2, N, D, dtype=F64)
    ref_layer = DiffusionAttention(D, H, heads="grand-nl(t=1.5, steps=256, method='rk4'):2").double()
    state = ref_layer.state_dict()
    with torch.no_grad():
        want = ref_layer(x)

    def err(method: str, K: int) -> float:
        layer = DiffusionAttention(D, H, heads=f"grand-nl(t=1.5, steps={K}, method='{method}'):2").double()
        layer.load_state_dict(state)
        with torch.no_grad():
            return (layer(x) - want).abs().max().item()

    euler = err("euler", 8) / err("euler", 16)
    rk4 = err("rk4", 4) / err("rk4", 8)
    assert 1.7 < euler < 2.6 and 12 < rk4 < 24, (euler, rk4)


@pytest.mark.parametrize("spec", ["heat(t=5e-324, steps=None)", "heat(t=-1.0, min_t=-inf, steps=None)",
                                  "heat(t=2.0, steps=None, tol=0.9, learnable=True)",
                                  "heat(t=100.0, steps=None, tol=0.99)", "ppr(alpha=1e-300, steps=3, learnable=True)",
                                  "ppr(alpha=0.999999, steps=None)", "polynomial(steps=0, init=[2.0])",
                                  "heat(t=0.3, steps=None, method='euler', learnable=True, tol=0.6)"])
def test_edge_specs_round_trip_with_their_coefficients(spec):
    """``spec()`` of an operator built at the edge of its arguments builds back the same operator."""
    op = build_operator(spec)
    again = build_operator(op.spec())
    assert again.spec() == op.spec()
    assert torch.equal(again.head_coefficients(), op.head_coefficients())
    assert torch.isfinite(op.head_coefficients()).all()
    if math.isinf(getattr(op, "min_t", 0.0)):
        assert again.min_t == op.min_t
