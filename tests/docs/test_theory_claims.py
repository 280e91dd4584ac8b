"""The equations, bounds and numbers of the theory pages (``docs/theory/*.rst``), held against the code.

One test per page, parametrized by claim. Every check builds its own float64 reference from the
page's formula (explicit matrices, :func:`torch.linalg.matrix_exp`, :func:`torch.linalg.solve`,
eigendecompositions) and compares the library's output with it; none goes through the library's
own references (``diffusionformer.ops.reference*``). The last test checks that the operator names
and options the pages spell exist in the registry with that spelling.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from diffusionformer import DiffusionAttention
from diffusionformer.analysis import (
    anova_decomposition,
    dirichlet_energy,
    effective_rank,
    eigenvalues_of,
    energy_top_k,
    frequency_response,
    high_frequency_ratio,
    mean_pairwise_cosine,
    neural_collapse,
    power_law_exponent,
    rank_collapse_residual,
    stable_rank,
    token_singular_values,
    variance_ratio,
    within_sequence_variance,
)
from diffusionformer.functional import attention_matrix, choose_dense_backend, diffuse, diffuse_sparse, edge_attention
from diffusionformer.operators import (
    AttnScaleOperator,
    DifferentialOperator,
    HeatOperator,
    NeuTRENOOperator,
    NonlinearDiffusionOperator,
    PolynomialOperator,
    PPROperator,
    ValueResidualOperator,
    build_operator,
    heat_coefficients,
    heat_steps_for_tolerance,
    heat_truncation_error,
    lambda_init_schedule,
    operator_class,
    ppr_coefficients,
)
from diffusionformer.ops.dense import MATERIALISE_MAX_ELEMENTS, MATERIALISE_MAX_ELEMENTS_CAUSAL
from diffusionformer.ops.rivals import RivalContext

THEORY = Path(__file__).resolve().parents[2] / "docs" / "theory"
F64 = torch.float64


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _softmax_P(q: torch.Tensor, k: torch.Tensor, scale: float, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """The page's P_ij = exp(s q_i.k_j) / sum over the admissible j' (explicit, float64)."""
    scores = (q.double() @ k.double().transpose(-1, -2)) * scale
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    return torch.softmax(scores, dim=-1)


def _powers(P: torch.Tensor, K: int) -> list[torch.Tensor]:
    out = [torch.eye(P.shape[-1], dtype=F64)]
    for _ in range(K):
        out.append(out[-1] @ P)
    return out


def _series(P: torch.Tensor, c) -> torch.Tensor:
    """sum_k c_k P^k as a matrix (explicit powers)."""
    return sum(float(ck) * Pk for ck, Pk in zip(c, _powers(P, len(c) - 1)))


def _inf_norm(A: torch.Tensor) -> float:
    return A.abs().sum(-1).max().item()


def _random_P(N: int = 9, C: int = 4, seed: int = 0, causal: bool = False, sharp: float = 1.0) -> torch.Tensor:
    q, k = torch.randn(2, N, C, generator=_gen(seed), dtype=F64) * sharp
    return _softmax_P(q, k, C**-0.5, torch.ones(N, N, dtype=torch.bool).tril() if causal else None)


def _symmetric_P(N: int = 12) -> torch.Tensor:
    """A symmetric circulant softmax matrix: doubly stochastic, real spectrum (the rivals page's figure)."""
    d = torch.arange(N, dtype=F64)
    diff = d[:, None] - d[None, :]
    return torch.softmax(-1.5 * torch.cos(2 * math.pi * diff / N) + 2.0 * torch.cos(4 * math.pi * diff / N), dim=-1)


def _context_for(P: torch.Tensor, v: torch.Tensor, v0: torch.Tensor | None = None) -> RivalContext:
    """A dense context whose P is exactly ``P`` (q = log P, k = I, scale 1: softmax(log P) = P)."""
    N = P.shape[-1]
    return RivalContext.dense(torch.log(P)[None, None], torch.eye(N, dtype=F64)[None, None], v[None, None],
                              scale=1.0, v0=None if v0 is None else v0[None, None])


# ------------------------------------------------------------------------------------------ family.rst


def _family_polynomial_members():
    """attention c = (0, 1), Laplacian (1, -1), heat Taylor/Euler, PPR and a learned polynomial: the operator's
    f(P) v through diffuse (dense) and diffuse_sparse (complete graph) equals the page's f(P) v."""
    g = _gen(1)
    N, C = 7, 4
    q, k, v = torch.randn(3, 1, 1, N, C, generator=g, dtype=F64)
    P = _softmax_P(q[0, 0], k[0, 0], C**-0.5)
    I = torch.eye(N, dtype=F64)
    t, K, alpha = 0.8, 6, 0.3
    h = t / K
    theta = [0.2, -0.5, 0.7, 0.1]
    cases = {
        "attention": (build_operator("attention"), P),
        "laplacian": (build_operator("laplacian"), I - P),
        "heat-taylor": (build_operator("heat", t=t, steps=K),
                        _series(P, [math.exp(-t) * t**j / math.factorial(j) for j in range(K + 1)])),
        "heat-euler": (build_operator("heat", t=t, steps=K, method="euler"),
                       torch.linalg.matrix_power((1 - h) * I + h * P, K)),
        "ppr": (build_operator("ppr", alpha=alpha, steps=K),
                _series(P, [alpha * (1 - alpha) ** j for j in range(K)] + [(1 - alpha) ** K])),
        "polynomial": (build_operator("polynomial", steps=3, init=theta), _series(P, theta)),
    }
    edges = torch.cartesian_prod(torch.arange(N), torch.arange(N)).T  # (source, target): the complete graph
    for name, (op, fP) in cases.items():
        c = torch.tensor(op.static_coefficients(), dtype=F64) if op.static_coefficients() is not None \
            else op.coefficients().detach().double().reshape(-1)
        want = fP @ v[0, 0]
        dense = diffuse(q, k, v, c)[0, 0]
        sparse = diffuse_sparse(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), edges, c)[:, 0]
        assert torch.allclose(dense, want, atol=1e-12), name
        assert torch.allclose(sparse, want, atol=1e-12), name
    # Euler's binomial form of the product, and PPR's weights summing to one
    Kb = 9
    ce = heat_coefficients(torch.tensor(1.3, dtype=F64), Kb, "euler")
    hb = 1.3 / Kb
    ref = torch.tensor([math.comb(Kb, j) * (1 - hb) ** (Kb - j) * hb**j for j in range(Kb + 1)], dtype=F64)
    assert torch.allclose(ce, ref, rtol=1e-13, atol=0)
    assert ppr_coefficients(torch.tensor(0.15, dtype=F64), 7).sum().item() == pytest.approx(1.0, abs=1e-15)


def _family_appnp_unrolled():
    """K steps of Z <- (1 - alpha) P Z + alpha V, Z_0 = V, are the PPR operator's output."""
    g = _gen(2)
    N, C = 8, 4
    q, k = torch.randn(2, 1, 1, N, C, generator=g, dtype=F64)
    v = torch.randn(1, 1, N, 3, generator=g, dtype=F64)
    P = _softmax_P(q[0, 0], k[0, 0], C**-0.5)
    for alpha, K in ((0.1, 1), (0.1, 10), (0.5, 4), (1.0, 3)):
        Z = v[0, 0].clone()
        for _ in range(K):
            Z = (1 - alpha) * P @ Z + alpha * v[0, 0]
        c = torch.tensor(PPROperator(alpha=alpha, steps=K).static_coefficients(), dtype=F64)
        assert c[0].item() == pytest.approx(alpha)  # the teleport keeps a share alpha of the token's own value
        assert torch.allclose(diffuse(q, k, v, c)[0, 0], Z, atol=1e-13), (alpha, K)


def _family_frequency_response():
    """f(P) u = f(lambda) u on the (complex) eigenvectors of a non-symmetric attention matrix, with the page's
    closed forms: attention lambda, Laplacian 1 - lambda, heat exp(-t(1-lambda)) and PPR
    alpha / (1 - (1-alpha) lambda) up to each truncation's error bound."""
    P = _random_P(10, 4, seed=3, sharp=2.0)
    lam, U = torch.linalg.eig(P)
    assert lam.imag.abs().max() > 1e-3  # a genuinely complex spectrum
    heat, ppr = HeatOperator(t=1.0, steps=10), PPROperator(alpha=0.2, steps=30)
    cases = [
        (build_operator("attention"), lambda x: x, 1e-12),
        (build_operator("laplacian"), lambda x: 1 - x, 1e-12),
        (heat, lambda x: torch.exp(-(1 - x)), heat.truncation_error().item()),
        (ppr, lambda x: 0.2 / (1 - 0.8 * x), ppr.truncation_error().item()),
    ]
    for op, closed, bound in cases:
        c = torch.tensor(op.static_coefficients(), dtype=F64)
        f = frequency_response(c, lam)
        fP = _series(P, c).to(torch.complex128)
        assert torch.allclose(fP @ U, U * f, atol=1e-10), op.name  # f(P) u = f(lambda) u
        assert (f - closed(lam)).abs().max().item() <= bound + 1e-12, op.name
    # the constant mode lambda = 1 comes first and its gain is f(1) = sum_k c_k
    top = eigenvalues_of(P)[0]
    assert abs(top - 1) < 1e-12
    for name in ("attention", "laplacian", "heat", "ppr"):
        c = build_operator(name).coefficients().double()
        assert frequency_response(c, torch.ones(1, dtype=F64)).item() == pytest.approx(c.sum().item(), abs=1e-12)


def _family_heat_exact():
    """``heat-exact`` is exp(-t (I - P)) of the materialised P (not a polynomial, apply_matrix)."""
    P = _random_P(8, 4, seed=4)
    v = torch.randn(1, 1, 8, 3, generator=_gen(4), dtype=F64)
    I = torch.eye(8, dtype=F64)
    for t in (0.0, 0.4, 2.5, -1.0):
        op = build_operator("heat-exact", t=t)
        assert op.is_polynomial is False
        want = torch.linalg.matrix_exp(-t * (I - P)) @ v[0, 0]
        assert torch.allclose(op.apply_matrix(P[None, None], v)[0, 0], want, atol=1e-12), t


_FAMILY = {
    "polynomial-members": _family_polynomial_members,
    "appnp-unrolled": _family_appnp_unrolled,
    "frequency-response": _family_frequency_response,
    "heat-exact": _family_heat_exact,
}


@pytest.mark.parametrize("claim", sorted(_FAMILY))
def test_family_page(claim):
    _FAMILY[claim]()


# ------------------------------------------------------------------------------------------ heat.rst


def _heat_kernel_laws():
    """Semigroup K_s K_t = K_{s+t}, K_0 = I, row sums one, K_t = I - t(I-P) + O(t^2), K_t -> 1 pi^T."""
    P = _random_P(8, 4, seed=5)
    I = torch.eye(8, dtype=F64)
    v = torch.randn(1, 1, 8, 2, generator=_gen(5), dtype=F64)

    def Kt(t, x):
        return build_operator("heat-exact", t=t).apply_matrix(P[None, None], x)

    assert torch.allclose(Kt(0.3, Kt(0.7, v)), Kt(1.0, v), atol=1e-13)
    assert torch.equal(Kt(0.0, v), v)
    ones = torch.ones(1, 1, 8, 1, dtype=F64)
    assert torch.allclose(Kt(2.0, ones), ones, atol=1e-13)  # row-stochastic again
    # the Laplacian head is the first-order term: the remainder shrinks like t^2
    rem = [(torch.linalg.matrix_exp(-t * (I - P)) - (I - t * (I - P))).abs().max().item() / t**2 for t in (1e-2, 1e-3)]
    assert rem[1] == pytest.approx(rem[0], rel=0.05) and rem[0] < 1.0
    # long times: every token sees the stationary average pi^T v
    lam, W = torch.linalg.eig(P.T)
    pi = W[:, lam.real.argmax()].real
    pi = pi / pi.sum()
    assert torch.allclose(Kt(60.0, v)[0, 0], (pi @ v[0, 0]).expand(8, -1), atol=1e-12)


def _heat_taylor_bound():
    """||K_t - sum_{k<=K} c_k P^k||_inf <= Pr[Poisson(t) > K] (t >= 0), e^{2|t|} Pr[Poisson(|t|) > K] (t < 0)."""
    for seed, causal, sharp in ((6, False, 1.0), (7, True, 3.0), (8, False, 0.3)):
        P = _random_P(8, 4, seed=seed, causal=causal, sharp=sharp)
        I = torch.eye(8, dtype=F64)
        for t in (-2.0, -0.5, 0.3, 1.0, 4.0):
            exact = torch.linalg.matrix_exp(-t * (I - P))
            for K in (1, 2, 4, 8, 14):
                # the tail summed from its own terms (1 - cdf cancels below eps: 4e-9 here at t = +-2, K = 14)
                tail = sum(math.exp(-abs(t)) * abs(t) ** j / math.factorial(j) for j in range(K + 1, K + 80))
                stated = max(tail, 0.0) * (math.exp(2 * abs(t)) if t < 0 else 1.0)
                bound = heat_truncation_error(torch.tensor(t, dtype=F64), K).item()
                assert bound == pytest.approx(stated, rel=1e-9, abs=1e-15), (t, K)
                err = _inf_norm(_series(P, heat_coefficients(torch.tensor(t, dtype=F64), K)) - exact)
                assert err <= bound * (1 + 1e-9) + 1e-13, (seed, t, K, err, bound)


def _heat_euler_bound():
    """||K_t - ((1-h) I + h P)^K||_inf <= 2 t^2 e^{2|t|} / K; for 0 <= t <= K the weights are >= 0 and sum to 1."""
    for seed, causal in ((9, False), (10, True)):
        P = _random_P(8, 4, seed=seed, causal=causal, sharp=2.0)
        I = torch.eye(8, dtype=F64)
        for t in (-1.0, 0.5, 2.0, 5.0):
            exact = torch.linalg.matrix_exp(-t * (I - P))
            for K in (1, 3, 8, 30):
                bound = heat_truncation_error(torch.tensor(t, dtype=F64), K, "euler").item()
                assert bound == pytest.approx(2 * t * t * math.exp(2 * abs(t)) / K, rel=1e-12)
                h = t / K
                approx = torch.linalg.matrix_power((1 - h) * I + h * P, K)
                assert _inf_norm(approx - exact) <= bound, (seed, t, K)
                if 0 <= t <= K:
                    c = heat_coefficients(torch.tensor(t, dtype=F64), K, "euler")
                    assert bool((c >= 0).all()) and c.sum().item() == pytest.approx(1.0, abs=1e-13)


def _heat_refusals():
    """heat(t=50, steps=4) keeps 5e-17 of the weight and is refused with the smallest steps that meets tol
    (default 0.5); an Euler product with t > steps is refused; steps=None meets tol (default 1e-4)."""
    kept = heat_coefficients(torch.tensor(50.0, dtype=F64), 4).sum().item()
    assert 4e-17 < kept < 6e-17
    smallest = heat_steps_for_tolerance(50.0, 0.5)
    assert heat_truncation_error(torch.tensor(50.0, dtype=F64), smallest).item() <= 0.5
    assert heat_truncation_error(torch.tensor(50.0, dtype=F64), smallest - 1).item() > 0.5
    with pytest.raises(ValueError, match=f"steps={smallest} would do"):
        HeatOperator(t=50.0, steps=4)
    with pytest.raises(ValueError, match="needs steps >= t"):
        HeatOperator(t=3.0, steps=2, method="euler")
    HeatOperator(t=3.0, steps=3, method="euler")  # t = K: accepted
    for t in (0.1, 1.0, 3.0, -1.0):
        op = HeatOperator(t=t)
        assert op.truncation_error().item() <= 1e-4
        assert heat_truncation_error(torch.tensor(t, dtype=F64), op.steps - 1).item() > 1e-4  # the smallest
        tight = HeatOperator(t=t, steps=None, tol=1e-7)
        assert tight.truncation_error().item() <= 1e-7


def _heat_learned_time():
    """A learned t: one parameter per head, steps from the bound at max(2|t|, 1) (a negative t: also at its negative,
    or min_t if higher), clamped at min_t = -2,
    coefficients finite with a finite gradient at t = 0."""
    for t in (0.25, 0.5, 1.5, -0.4):
        op = HeatOperator(t=t, learnable=True, num_heads=3)
        assert op.t.shape == (3,)
        room = max(2 * abs(t), 1.0)  # upwards; a sharpening t also downwards, to -room or min_t = -2 if higher
        bounds = (room, max(-2.0, -room)) if t < 0 else (room,)
        assert op.steps == max(heat_steps_for_tolerance(x, 1e-4) for x in bounds)
    assert HeatOperator().min_t == -2.0
    op = HeatOperator(t=-1.0, learnable=True, num_heads=2)
    with torch.no_grad():
        op.t.fill_(-5.0)
    assert torch.allclose(op.effective_time(), torch.full((2,), -2.0))
    for method, K in (("taylor", 4), ("taylor", 25), ("euler", 4)):
        t = torch.zeros((), dtype=F64, requires_grad=True)
        c = heat_coefficients(t, K, method)
        (c * torch.arange(K + 1, dtype=F64)).sum().backward()  # d/dt sum_k k c_k = 1 at t = 0 for both forms
        assert torch.equal(c.detach(), torch.eye(K + 1, dtype=F64)[0]) and t.grad.item() == pytest.approx(1.0)


def _heat_negative_time():
    """For t < 0 the response e^{|t|(1-lambda)} exceeds one for every lambda != 1, at most e^{2|t|} (lambda = -1)."""
    lam = torch.linspace(-1, 1, 41, dtype=F64)
    op = HeatOperator(t=-1.0, steps=16)
    f = frequency_response(torch.tensor(op.static_coefficients(), dtype=F64), lam)
    assert torch.allclose(f, torch.exp(1.0 - lam), atol=op.truncation_error().item())
    assert bool((f[:-1] > 1).all()) and f[-1].item() == pytest.approx(1.0, abs=1e-10)
    assert f.max().item() == pytest.approx(math.exp(2.0), rel=1e-6)


_HEAT = {
    "kernel-laws": _heat_kernel_laws,
    "taylor-bound": _heat_taylor_bound,
    "euler-bound": _heat_euler_bound,
    "refusals": _heat_refusals,
    "learned-time": _heat_learned_time,
    "negative-time": _heat_negative_time,
}


@pytest.mark.parametrize("claim", sorted(_HEAT))
def test_heat_page(claim):
    _HEAT[claim]()


# ------------------------------------------------------------------------------------------ laplacian.rst


def _laplacian_constants():
    """(I - P) 1 = 0, (L V)_i = sum_j P_ij (v_i - v_j), and the Laplacian head ignores a constant shift."""
    g = _gen(11)
    N, C = 9, 4
    q, k, v = torch.randn(3, 1, 1, N, C, generator=g, dtype=F64)
    P = _softmax_P(q[0, 0], k[0, 0], C**-0.5)
    lap = [1.0, -1.0]  # static: the fused ``v - sdpa(q, k, v)`` path
    assert diffuse(q, k, torch.ones(1, 1, N, 1, dtype=F64), lap).abs().max().item() < 1e-15
    diffs = (P.unsqueeze(-1) * (v[0, 0].unsqueeze(1) - v[0, 0].unsqueeze(0))).sum(1)  # sum_j P_ij (v_i - v_j)
    assert torch.allclose(diffuse(q, k, v, lap)[0, 0], diffs, atol=1e-14)
    a = torch.randn(1, 1, 1, C, generator=g, dtype=F64)
    assert torch.allclose(diffuse(q, k, v + a, lap), diffuse(q, k, v, lap), atol=1e-13)


def _laplacian_shift_law():
    """f(P)(V + 1 a^T) = f(P) V + f(1) 1 a^T for every polynomial operator of the registry."""
    g = _gen(12)
    N, C = 8, 4
    q, k, v = torch.randn(3, 1, 1, N, C, generator=g, dtype=F64)
    a = torch.randn(1, 1, 1, C, generator=g, dtype=F64)
    for spec in ("attention", "laplacian", "heat(t=1.0)", "heat(t=0.6, steps=3, method='euler')", "ppr(alpha=0.3)",
                 "polynomial(steps=2, init=[0.5, -1.0, 2.0])"):
        c = build_operator(spec).coefficients().detach().double().reshape(-1)
        moved = diffuse(q, k, v + a, c) - diffuse(q, k, v, c)
        assert torch.allclose(moved, c.sum() * a.expand_as(moved), atol=1e-12), spec


def _laplacian_mean_and_variation():
    """V = 1 vbar^T + V_c gives P V = 1 vbar^T + P V_c and (I - P) V = (I - P) V_c."""
    N = 10
    P = _random_P(N, 4, seed=13)
    I = torch.eye(N, dtype=F64)
    V = torch.randn(N, 3, generator=_gen(13), dtype=F64) + 2.0
    vbar = V.mean(0, keepdim=True)
    Vc = (I - torch.full((N, N), 1.0 / N, dtype=F64)) @ V
    assert torch.allclose(V, vbar + Vc, atol=1e-14)
    assert torch.allclose(P @ V, vbar + P @ Vc, atol=1e-13)
    assert torch.allclose((I - P) @ V, (I - P) @ Vc, atol=1e-13)


def _laplacian_heat_step():
    """x - tau (I - P) x = ((1 - tau) I + tau P) x: the Euler heat kernel with one step of length tau."""
    for tau in (0.25, 0.5, 1.0):
        c = heat_coefficients(torch.tensor(tau, dtype=F64), 1, "euler")
        lap = torch.tensor(build_operator("laplacian").static_coefficients(), dtype=F64)
        assert torch.allclose(c, torch.tensor([1.0, 0.0], dtype=F64) - tau * lap, atol=1e-15)


_LAPLACIAN = {
    "constants": _laplacian_constants,
    "shift-law": _laplacian_shift_law,
    "mean-and-variation": _laplacian_mean_and_variation,
    "heat-step": _laplacian_heat_step,
}


@pytest.mark.parametrize("claim", sorted(_LAPLACIAN))
def test_laplacian_page(claim):
    _LAPLACIAN[claim]()


# ------------------------------------------------------------------------------------------ random_walk.rst


def _walk_transition_matrix():
    """P_ij = softmax_j(q_i.k_j / sqrt(C)) over N(i): non-negative rows summing to one, |lambda| <= 1, lambda = 1
    for the constant vector, P^k -> 1 pi^T for an ergodic walk."""
    g = _gen(14)
    N, C = 9, 4
    q, k = torch.randn(2, 1, 1, N, C, generator=g, dtype=F64)
    for causal in (False, True):
        allowed = torch.ones(N, N, dtype=torch.bool).tril() if causal else None
        P = attention_matrix(q, k, is_causal=causal)[0, 0]
        assert torch.allclose(P, _softmax_P(q[0, 0], k[0, 0], C**-0.5, allowed), atol=1e-15)
        assert bool((P >= 0).all()) and torch.allclose(P.sum(-1), torch.ones(N, dtype=F64), atol=1e-15)
        lam = eigenvalues_of(P)
        assert lam.abs().max().item() <= 1 + 1e-12 and abs(lam[0] - 1) < 1e-12
    P = attention_matrix(q, k)[0, 0]
    lam, W = torch.linalg.eig(P.T)
    pi = W[:, lam.real.argmax()].real
    pi = pi / pi.sum()
    assert torch.allclose(torch.linalg.matrix_power(P, 200), torch.ones(N, 1, dtype=F64) * pi, atol=1e-12)


def _walk_dense_equals_sparse():
    """On the same graph (the causal one, built as edges) the sparse P equals the dense P."""
    g = _gen(15)
    N, C, H = 6, 4, 2
    q, k = torch.randn(2, N, H, C, generator=g, dtype=F64)  # node-major
    src, dst = torch.tril_indices(N, N)[1], torch.tril_indices(N, N)[0]  # j <= i: edge j -> i
    w = edge_attention(q, k, torch.stack([src, dst]))  # (E, H)
    dense = attention_matrix(q.transpose(0, 1)[None], k.transpose(0, 1)[None], is_causal=True)[0]  # (H, N, N)
    for h in range(H):
        Ps = torch.zeros(N, N, dtype=F64)
        Ps[dst, src] = w[:, h]
        assert torch.allclose(Ps, dense[h], atol=1e-14)


def _walk_node_without_edges():
    """A node with no incoming edge (or a query with no admissible key) has an all-zero row of P in both
    back-ends: attention outputs 0 there, a Laplacian head passes the value through."""
    g = _gen(16)
    N, H, C = 6, 2, 4
    q, k, v = torch.randn(3, N, H, C, generator=g, dtype=F64)
    edges = torch.tensor([[0, 1, 2, 3, 4, 0, 2], [1, 2, 3, 4, 1, 0, 1]])  # node 5 has no incoming edge
    for backend in ("csr", "native"):
        att = diffuse_sparse(q, k, v, edges, torch.tensor([0.0, 1.0], dtype=F64), num_nodes=N, backend=backend)
        lap = diffuse_sparse(q, k, v, edges, torch.tensor([1.0, -1.0], dtype=F64), num_nodes=N, backend=backend)
        assert bool(torch.isfinite(att).all()) and torch.equal(att[5], torch.zeros_like(att[5])), backend
        assert torch.equal(lap[5], v[5]), backend
    qd, kd, vd = (t.transpose(0, 1)[None] for t in (q, k, v))
    mask = torch.ones(N, N, dtype=torch.bool)
    mask[2] = False
    assert torch.equal(attention_matrix(qd, kd, attn_mask=mask)[0, :, 2], torch.zeros(H, N, dtype=F64))
    for backend in ("sdpa", "matrix"):
        att = diffuse(qd, kd, vd, torch.tensor([0.0, 1.0], dtype=F64), attn_mask=mask, backend=backend)
        lap = diffuse(qd, kd, vd, torch.tensor([1.0, -1.0], dtype=F64), attn_mask=mask, backend=backend)
        assert torch.equal(att[0, :, 2], torch.zeros(H, C, dtype=F64)), backend
        assert torch.allclose(lap[0, :, 2], vd[0, :, 2], atol=0), backend


_WALK = {
    "transition-matrix": _walk_transition_matrix,
    "dense-equals-sparse": _walk_dense_equals_sparse,
    "node-without-edges": _walk_node_without_edges,
}


@pytest.mark.parametrize("claim", sorted(_WALK))
def test_random_walk_page(claim):
    _WALK[claim]()


# ------------------------------------------------------------------------------------------ oversmoothing.rst


def _tokens(seed: int = 17, B: int = 3, T: int = 6, D: int = 4) -> torch.Tensor:
    g = _gen(seed)
    return torch.randn(B, T, D, generator=g, dtype=F64) + torch.randn(B, 1, D, generator=g, dtype=F64)


def _over_residual_updates():
    """X + PX, X - tau(I-P)X and X + s(I-P)X scale a mode P u = lambda u by 1 + lambda, 1 - tau(1 - lambda)
    and 1 + s(1 - lambda) (and the constant mode by 2, 1 and 1)."""
    P = _symmetric_P(12)
    mu, U = torch.linalg.eigh(P)
    I = torch.eye(12, dtype=F64)
    tau, s = 0.25, 0.5
    for M, gain in (((I + P), 1 + mu), (I - tau * (I - P), 1 - tau * (1 - mu)), (I + s * (I - P), 1 + s * (1 - mu))):
        assert torch.allclose(M @ U, U * gain, atol=1e-13)
    assert mu[-1].item() == pytest.approx(1.0)  # the constant mode


def _over_measurements():
    """within-sequence variance, variance ratio, high-frequency ratio, rank-collapse residual (mean and svd),
    mean pairwise cosine and Dirichlet energy as the page defines them."""
    X = _tokens()
    B, T, D = X.shape
    Cm = torch.eye(T, dtype=F64) - 1.0 / T
    CX = Cm @ X
    xbar, mu = X.mean(1), X.reshape(-1, D).mean(0)
    V = CX.pow(2).sum((1, 2)) / T
    assert torch.allclose(within_sequence_variance(X), V, atol=1e-13)
    assert torch.allclose(variance_ratio(X), V / (V + (xbar - mu).pow(2).sum(-1)), atol=1e-14)
    hfr = CX.norm(dim=(1, 2)) / X.norm(dim=(1, 2))
    assert torch.allclose(high_frequency_ratio(X), hfr, atol=1e-14)
    assert torch.allclose(rank_collapse_residual(X), hfr, atol=1e-14)
    s = torch.linalg.svdvals(X)
    svd_residual = s[:, 1:].pow(2).sum(-1).sqrt() / s.pow(2).sum(-1).sqrt()
    assert torch.allclose(rank_collapse_residual(X, method="svd"), svd_residual, atol=1e-14)
    Xn = X / X.norm(dim=-1, keepdim=True)
    G = Xn @ Xn.transpose(1, 2)
    cos = (G.sum((1, 2)) - G.diagonal(dim1=1, dim2=2).sum(-1)) / (T * (T - 1))
    assert torch.allclose(mean_pairwise_cosine(X), cos, atol=1e-14)
    P = torch.softmax(torch.randn(B, T, T, generator=_gen(18), dtype=F64), -1)
    E = 0.5 * (P * torch.cdist(X, X).pow(2)).sum((1, 2))
    assert torch.allclose(dirichlet_energy(X, P, normalized=False), E, atol=1e-12)
    assert torch.allclose(dirichlet_energy(X, P), E / X.pow(2).sum((1, 2)), atol=1e-14)
    assert torch.allclose(dirichlet_energy(X, normalized=False), T * V, atol=1e-12)  # complete graph, P_ij = 1/T
    Z = torch.zeros(2, 4, 3, dtype=F64)  # ratios with a zero denominator are 0
    for value in (high_frequency_ratio(Z), variance_ratio(Z), rank_collapse_residual(Z), dirichlet_energy(Z),
                  rank_collapse_residual(Z, method="svd")):
        assert torch.equal(value, torch.zeros(2, dtype=F64))


def _over_token_spectra():
    """Singular values of the centred tokens; effective rank exp(-sum p log p) with p_i = s_i / sum s; stable rank
    sum s^2 / s_1^2; top-k energy; power-law exponent alpha of s_i^2 ~ i^-alpha (least squares in log-log)."""
    X = _tokens(19, B=3, T=8, D=5)
    CX = X - X.mean(1, keepdim=True)
    s = token_singular_values(X)
    assert torch.allclose(s, torch.linalg.svdvals(CX.reshape(-1, 5)), atol=1e-13)
    p = s / s.sum()
    assert effective_rank(s).item() == pytest.approx(torch.exp(-(p * p.log()).sum()).item(), rel=1e-13)
    assert stable_rank(s).item() == pytest.approx((s.pow(2).sum() / s[0] ** 2).item(), rel=1e-13)
    assert energy_top_k(s, 2).item() == pytest.approx((s[:2].pow(2).sum() / s.pow(2).sum()).item(), rel=1e-13)
    i = torch.arange(1, 10, dtype=F64)
    s2 = 3.0 * i**-1.7 * torch.exp(0.05 * torch.randn(9, generator=_gen(19), dtype=F64))
    A = torch.stack([torch.ones_like(i), i.log()], 1)
    slope = torch.linalg.lstsq(A, s2.log()[:, None]).solution[1, 0]
    assert power_law_exponent(s2.sqrt()).item() == pytest.approx(-slope.item(), rel=1e-12)


def _over_anova_and_collapse():
    """The ANOVA split total = within + between sequences + between classes with the page's terms (divided by
    B T), NC1 = tr(S_W S_B^+) / C, and the ETF distance to (I - 11^T/C) / sqrt(C - 1)."""
    X = _tokens(20, B=5, T=4, D=3)
    y = torch.tensor([0, 1, 0, 2, 1])
    B, T, D = X.shape
    mu, xbar = X.reshape(-1, D).mean(0), X.mean(1)
    classes = [0, 1, 2]
    m = torch.stack([xbar[y == c].mean(0) for c in classes])
    n = torch.tensor([int((y == c).sum()) for c in classes], dtype=F64)
    split = anova_decomposition(X, y)
    want = {
        "total": (X - mu).pow(2).sum(),
        "within_sequence": (X - xbar[:, None]).pow(2).sum(),
        "between_sequence": T * (xbar - m[y]).pow(2).sum(),
        "between_class": T * (n * (m - mu).pow(2).sum(-1)).sum(),
    }
    for name, value in want.items():
        assert getattr(split, name) == pytest.approx(value.item() / (B * T), rel=1e-12), name
    H = torch.randn(30, 5, generator=_gen(21), dtype=F64)
    labels = torch.arange(30) % 3
    nc = neural_collapse(H, labels)
    mu = H.mean(0)
    M = torch.stack([H[labels == c].mean(0) for c in range(3)])
    R = H - M[labels]
    SW, SB = R.T @ R / 30, (M - mu).T @ (M - mu) / 3
    assert nc.nc1 == pytest.approx((torch.trace(SW @ torch.linalg.pinv(SB)) / 3).item(), rel=1e-10)
    Un = (M - mu) / (M - mu).norm(dim=-1, keepdim=True)
    Gr = Un @ Un.T
    etf = (torch.eye(3, dtype=F64) - 1.0 / 3) / math.sqrt(2)
    assert nc.etf_distance == pytest.approx((Gr / Gr.norm() - etf).norm().item(), rel=1e-12)


_OVER = {
    "residual-updates": _over_residual_updates,
    "measurements": _over_measurements,
    "token-spectra": _over_token_spectra,
    "anova-and-collapse": _over_anova_and_collapse,
}


@pytest.mark.parametrize("claim", sorted(_OVER))
def test_oversmoothing_page(claim):
    _OVER[claim]()


# ------------------------------------------------------------------------------------------ rivals.rst


def _rivals_masks(N: int, B: int):
    """(name, allowed (B, 1, N, N), RivalContext.dense kwargs): none, causal, key padding, both."""
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    pad = torch.ones(B, 1, 1, N, dtype=torch.bool)
    pad[-1, ..., -2:] = False
    full = torch.ones(B, 1, N, N, dtype=torch.bool)
    return [("none", full, {}), ("causal", full & causal, {"is_causal": True}),
            ("padding", full & pad, {"attn_mask": pad}), ("causal+padding", full & causal & pad,
                                                        {"is_causal": True, "attn_mask": pad})]


def _rivals_formulas():
    """The table's f for attnscale, neutreno, value-residual, differential and grand-nl, with DC the uniform
    average over the admissible keys (causal rows over j <= i, padded keys excluded)."""
    g = _gen(22)
    B, G, N, C = 2, 2, 7, 6
    q, k, v, v0 = torch.randn(4, B, G, N, C, generator=g, dtype=F64)
    for mode, allowed, kw in _rivals_masks(N, B):
        P = _softmax_P(q, k, C**-0.5, allowed)
        DC = allowed.double() / allowed.double().sum(-1, keepdim=True)

        def ctx(first=None):
            return RivalContext.dense(q, k, v, v0=first, **kw)

        omega = 0.3
        y = AttnScaleOperator(omega=omega, learnable=False, num_heads=G).apply_context(ctx())
        assert torch.allclose(y, DC @ v + (1 + omega) * (P - DC) @ v, atol=1e-13), mode
        y = NeuTRENOOperator(lam=0.6).apply_context(ctx(v0))
        assert torch.allclose(y, P @ v + 0.6 * (v0 - v), atol=1e-13), mode
        assert torch.allclose(NeuTRENOOperator().apply_context(ctx()), P @ v, atol=1e-13), mode  # first layer
        y = ValueResidualOperator(lam=0.7).apply_context(ctx(v0))
        assert torch.allclose(y, P @ (v + 0.7 * v0), atol=1e-13), mode
        op = DifferentialOperator(head_dim=C, depth=3).double()
        with torch.no_grad():
            for p, value in zip(op.parameters(), torch.randn(4 * (C // 2) + C, generator=g, dtype=F64).split(
                    [C // 2] * 4 + [C])):
                p.copy_(0.3 * value + (1.0 if p.shape == (C,) else 0.0))
        h = C // 2
        P1 = _softmax_P(q[..., :h], k[..., :h], h**-0.5, allowed)
        P2 = _softmax_P(q[..., h:], k[..., h:], h**-0.5, allowed)
        lam_init = 0.8 - 0.6 * math.exp(-0.3 * 3)
        lam = (torch.exp((op.lambda_q1 * op.lambda_k1).sum()) - torch.exp((op.lambda_q2 * op.lambda_k2).sum())
               + lam_init).detach()
        z = (P1 - lam * P2) @ v
        z = z / torch.sqrt(z.pow(2).mean(-1, keepdim=True) + 1e-5) * op.subln.weight.detach()
        assert torch.allclose(op.apply_context(ctx()), (1 - lam_init) * z, atol=1e-12), mode
        for method, K in (("euler", 3), ("rk4", 2)):
            X = torch.cat([q, k, v], -1)
            tau = 0.8 / K

            def field(S):
                return _softmax_P(S[..., :C], S[..., C : 2 * C], C**-0.5, allowed) @ S - S

            for _ in range(K):
                if method == "euler":
                    X = X + tau * field(X)
                else:
                    k1 = field(X)
                    k2 = field(X + tau / 2 * k1)
                    k3 = field(X + tau / 2 * k2)
                    k4 = field(X + tau * k3)
                    X = X + tau / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
            y = NonlinearDiffusionOperator(t=0.8, steps=K, method=method).apply_context(ctx())
            assert torch.allclose(y, X[..., 2 * C :], atol=1e-13), (mode, method)
        y = NonlinearDiffusionOperator(t=1.0, steps=1).apply_context(ctx())  # one attention step
        assert torch.allclose(y, P @ v, atol=1e-13), mode
    assert [lambda_init_schedule(depth) for depth in (0, 4)] == pytest.approx([0.2, 0.8 - 0.6 * math.exp(-1.2)])


def _rivals_sparse_uniform_map():
    """On a sparse graph AttnScale's DC is the mean over incoming edges (zero for a node without one)."""
    g = _gen(23)
    N, H, C = 6, 2, 4
    q, k, v = torch.randn(3, N, H, C, generator=g, dtype=F64)
    edges = torch.tensor([[0, 1, 2, 3, 4, 0, 2], [1, 2, 3, 4, 1, 0, 1]])
    A = torch.zeros(N, N, dtype=F64)
    A[edges[1], edges[0]] = 1.0
    DC = A / A.sum(-1, keepdim=True).clamp_min(1.0)
    w = edge_attention(q, k, edges)
    P = torch.zeros(H, N, N, dtype=F64)
    for h in range(H):
        P[h][edges[1], edges[0]] = w[:, h]
    vh = v.transpose(0, 1)
    y = AttnScaleOperator(omega=0.5, learnable=False, num_heads=H).apply_context(RivalContext.sparse(q, k, v, edges))
    assert torch.allclose(y[0], DC @ vh + 1.5 * (P @ vh - DC @ vh), atol=1e-13)


def _rivals_ppr_exact():
    """ppr-exact is alpha (I - (1-alpha) P)^{-1} v (a solve), by forward substitution under a causal mask (a layer's
    causal call takes that path); ppr(alpha, steps=K) approaches it within 2 (1-alpha)^K."""
    g = _gen(24)
    N, C = 8, 4
    q, k = torch.randn(2, 1, 1, N, C, generator=g, dtype=F64)
    v = torch.randn(1, 1, N, 3, generator=g, dtype=F64)
    I = torch.eye(N, dtype=F64)
    for causal in (False, True):
        P = attention_matrix(q, k, is_causal=causal)
        for alpha in (0.05, 0.3, 1.0):
            op = build_operator("ppr-exact", alpha=alpha)
            want = alpha * torch.linalg.solve(I - (1 - alpha) * P[0, 0], v[0, 0])
            got = (op.apply_causal_matrix if causal else op.apply_matrix)(P, v)[0, 0]
            assert torch.allclose(got, want, atol=1e-12), (causal, alpha)
    P = attention_matrix(q, k)[0, 0]
    for alpha in (0.1, 0.5):
        full = alpha * torch.linalg.inv(I - (1 - alpha) * P)
        for K in (1, 4, 12):
            op = PPROperator(alpha=alpha, steps=K)
            assert op.truncation_error().item() == pytest.approx(2 * (1 - alpha) ** K)
            assert _inf_norm(_series(P, op.static_coefficients()) - full) <= 2 * (1 - alpha) ** K


def _rivals_chebyshev():
    """sum_k theta_k T_k(P) with T_{k+1} = 2 P T_k - T_{k-1}; init in monomial coefficients; the monomial weights of
    T_k exceed 2^{k-1} and grow like ~2.4^k; in float32 the error is ~1e-5 at K = 10 and ~5e-4 at K = 16."""
    P = _random_P(10, 4, seed=25)
    K = 5
    op = PolynomialOperator(steps=K, basis="chebyshev").double()
    with torch.no_grad():
        op.theta.copy_(torch.randn(1, K + 1, generator=_gen(25), dtype=F64))
    T = [torch.eye(10, dtype=F64), P]
    while len(T) < K + 1:
        T.append(2 * P @ T[-1] - T[-2])
    want = sum(op.theta[0, j].item() * T[j] for j in range(K + 1))
    assert torch.allclose(_series(P, op.coefficients()[0].detach()), want, atol=1e-12)
    init = [0.1, 0.6, 0.2, 0.1]
    got = PolynomialOperator(steps=3, basis="chebyshev", init=init).coefficients()[0].detach()
    assert torch.allclose(got, torch.tensor(init), atol=1e-7)
    from diffusionformer.operators import chebyshev_matrix
    M = chebyshev_matrix(16)
    assert M[10].abs().max().item() == 1280.0 and M[10, 10].item() == 2.0**9
    assert 2.2 < (M[16].abs().max() / M[10].abs().max()).item() ** (1 / 6) < 2.5
    g = _gen(26)
    N, C = 32, 8
    for K, low, high in ((10, 1e-6, 1e-4), (16, 5e-5, 3e-3)):
        errs = []
        for _ in range(3):
            q, k, v = torch.randn(3, 1, 1, N, C, generator=g)
            op = PolynomialOperator(steps=K, basis="chebyshev")
            with torch.no_grad():
                op.theta.copy_(torch.randn(1, K + 1, generator=g))
            y = diffuse(q, k, v, op.coefficients())
            Pd = _softmax_P(q[0, 0], k[0, 0], C**-0.5)
            T = [torch.eye(N, dtype=F64), Pd]
            while len(T) < K + 1:
                T.append(2 * Pd @ T[-1] - T[-2])
            ref = sum(op.theta[0, j].double().item() * T[j] for j in range(K + 1)) @ v[0, 0].double()
            errs.append(((y[0, 0].double() - ref).abs().max() / ref.abs().max()).item())
        assert low < max(errs) < high, (K, errs)


def _rivals_frequency_response():
    """On a symmetric doubly stochastic P the operators' measured responses u_i^T f(u_i) lie on the page's curves:
    attnscale 1 on the constant mode and (1 + omega) mu elsewhere, neutreno (v0 = 0) mu - lambda, ppr-exact
    alpha / (1 - (1-alpha) mu), and frozen-P grand-nl Euler ((1 - tau) + tau mu)^K."""
    P = _symmetric_P(12)
    mu, U = torch.linalg.eigh(P)
    const = mu.argmax()

    def measured(apply):
        return torch.stack([U[:, i] @ apply(U[:, i : i + 1])[:, 0] for i in range(12)]).detach()

    attnscale = AttnScaleOperator(omega=0.5, learnable=False)
    got = measured(lambda u: attnscale.apply_context(_context_for(P, u))[0, 0])
    want = 1.5 * mu
    want[const] = 1.0
    assert torch.allclose(got, want, atol=1e-12)
    neutreno = NeuTRENOOperator(lam=0.6)
    got = measured(lambda u: neutreno.apply_context(_context_for(P, u, torch.zeros_like(u)))[0, 0])
    assert torch.allclose(got, mu - 0.6, atol=1e-12)
    ppr = build_operator("ppr-exact", alpha=0.2)
    got = measured(lambda u: ppr.apply_matrix(P[None, None], u[None, None])[0, 0])
    assert torch.allclose(got, 0.2 / (1 - 0.8 * mu), atol=1e-12)
    c = heat_coefficients(torch.tensor(1.0, dtype=F64), 4, "euler")
    assert torch.allclose(frequency_response(c, mu), (0.75 + 0.25 * mu) ** 4, atol=1e-14)


def _rivals_parameters_and_flags():
    """differential adds 4 C/2 + C = 3C parameters per head group, attnscale one omega per head; the capability
    flags and back-ends of the table."""
    base = sum(p.numel() for p in DiffusionAttention(64, 8).parameters())
    C = 8
    for heads, added in (("differential:4,attention:4", 3 * C), ("differential:8", 3 * C),
                         ("attnscale:4,attention:4", 4), ("neutreno:4,attention:4", 0),
                         ("value-residual:4,attention:4", 0),
                         ("grand-nl:4,attention:4", 0), ("ppr-exact:4,attention:4", 0),
                         ("laplacian:4,attention:4", 0), ("polynomial(steps=3, basis='chebyshev'):4,attention:4", 16)):
        n = sum(p.numel() for p in DiffusionAttention(64, 8, heads=heads).parameters())
        assert n - base == added, heads
    flags = {"attnscale": "needs_uniform_map", "neutreno": "needs_layer_state", "value-residual": "needs_layer_state",
             "differential": "needs_second_map", "grand-nl": "reprojects_each_step"}
    for name, flag in flags.items():
        cls = operator_class(name)
        assert getattr(cls, flag) is True and cls.supports_sparse and not cls.is_polynomial, name
    for name in ("ppr-exact", "heat-exact"):
        cls = operator_class(name)
        assert not cls.supports_sparse and not cls.is_polynomial and not build_operator(name).uses_context
    assert operator_class("polynomial").supports_sparse
    assert NonlinearDiffusionOperator(steps=3).calls_per_forward() == 3
    assert NonlinearDiffusionOperator(steps=3, method="rk4").calls_per_forward() == 12
    assert AttnScaleOperator().omega.tolist() == [0.0] and NeuTRENOOperator().lam == 0.6
    assert ValueResidualOperator().lam == 1.0


_RIVALS = {
    "formulas": _rivals_formulas,
    "sparse-uniform-map": _rivals_sparse_uniform_map,
    "ppr-exact": _rivals_ppr_exact,
    "chebyshev": _rivals_chebyshev,
    "frequency-response": _rivals_frequency_response,
    "parameters-and-flags": _rivals_parameters_and_flags,
}


@pytest.mark.parametrize("claim", sorted(_RIVALS))
def test_rivals_page(claim):
    _RIVALS[claim]()


# ------------------------------------------------------------------------------------------ cost.rst


class _SdpaSpy:
    """Records (heads, score width, value width) of every fused attention call."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[int, int, int]] = []
        original = F.scaled_dot_product_attention

        def spy(q, k, v, *args, **kwargs):
            self.calls.append((q.shape[1], q.shape[-1], v.shape[-1]))
            return original(q, k, v, *args, **kwargs)

        monkeypatch.setattr(F, "scaled_dot_product_attention", spy)


def _cost_flops(monkeypatch):
    """The scores QK^T cost N M C multiply-adds (2 N M C flops) per head and so does each product P V: the matrix
    back-end with K powers counts 2 B H N M C (K + 1) flops of matrix products."""
    from torch.utils.flop_counter import FlopCounterMode

    B, H, N, C = 2, 3, 16, 8
    q, k, v = torch.randn(3, B, H, N, C, generator=_gen(27))
    for K in (1, 2, 4):
        with FlopCounterMode(display=False) as counter:
            diffuse(q, k, v, torch.randn(K + 1, generator=_gen(K)), backend="matrix")
        assert counter.get_total_flops() == 2 * B * H * N * N * C * (K + 1), K


def _cost_backend_rule(monkeypatch):
    """auto: K <= 1 -> sdpa; K >= 2 and N M at most the limit of the largest listed K' <= K -> matrix; else sdpa."""
    for causal, table in ((False, MATERIALISE_MAX_ELEMENTS), (True, MATERIALISE_MAX_ELEMENTS_CAUSAL)):
        for K in (0, 1, 2, 3, 4, 7, 8, 16):
            for N in (16, 64, 128, 129, 256, 384, 512, 1024, 4096):
                got = choose_dense_backend(N, N, K, is_causal=causal)
                if K <= 1:
                    want = "sdpa"
                else:
                    limit = table[max(d for d in table if d <= K)]
                    want = "matrix" if N * N <= limit else "sdpa"
                assert got == want, (causal, K, N)


def _cost_shared_and_stopping_calls(monkeypatch):
    """Affine heads share one fused call; with degrees, G of H heads needing K steps cost 1 + (K-1) G / H
    full-width calls; the sparse back-end computes the edge softmax once for all K steps."""
    spy = _SdpaSpy(monkeypatch)
    B, H, N, C = 1, 4, 12, 8
    q, k, v = torch.randn(3, B, H, N, C, generator=_gen(28))
    diffuse(q, k, v, [[0.0, 1.0], [1.0, -1.0], [0.5, 0.5], [1.0, -1.0]])
    assert spy.calls == [(H, C, C)]
    for G, K in ((1, 3), (2, 4)):
        spy.calls.clear()
        c = torch.zeros(H, K + 1)
        c[:G] = torch.randn(G, K + 1, generator=_gen(G))
        c[G:, :2] = torch.tensor([1.0, -1.0])
        diffuse(q, k, v, c, backend="sdpa", degrees=[K] * G + [1] * (H - G))
        assert sum(h for h, _, _ in spy.calls) / H == pytest.approx(1 + (K - 1) * G / H), (G, K)
    layer = DiffusionAttention(64, 8, heads="attention:6,laplacian:2").eval()
    spy.calls.clear()
    with torch.no_grad():
        layer(torch.randn(2, N, 64, generator=_gen(29)))
    assert spy.calls == [(8, 8, 8)]
    import diffusionformer.ops.sparse as sparse

    softmaxes = []
    original = sparse.segment_softmax
    monkeypatch.setattr(sparse, "segment_softmax", lambda *a, **kw: softmaxes.append(1) or original(*a, **kw))
    qs, ks, vs = torch.randn(3, N, 2, 4, generator=_gen(30))
    edges = torch.randint(0, N, (2, 40), generator=_gen(30))
    diffuse_sparse(qs, ks, vs, edges, torch.tensor([0.1, 0.2, 0.3, 0.4]), backend="native")
    assert len(softmaxes) == 1


def _cost_rival_calls(monkeypatch):
    """attnscale: one call (P v) and a mean for DC v, a second zero-score call only under another mask;
    differential: two calls, their half-width scores zero-padded to the head width on the dense back-end;
    neutreno / value-residual: one call; grand-nl: K calls (4K with RK4) on a state 3C wide; ppr-exact: a
    triangular solve under a causal mask, a dense solve otherwise."""
    spy = _SdpaSpy(monkeypatch)
    N, C = 12, 8
    x = torch.randn(2, N, 64, generator=_gen(31))
    other = torch.rand(N, N, generator=_gen(31)) > 0.3
    cases = {
        "attnscale": [(4, C, C)],
        "differential": [(4, C, C)] * 2,
        "neutreno": [(4, C, C)],
        "value-residual": [(4, C, C)],
        "grand-nl(steps=2)": [(4, C, 3 * C)] * 2,
        "grand-nl(steps=2, method='rk4')": [(4, C, 3 * C)] * 8,
    }
    for heads, rival_calls in cases.items():
        layer = DiffusionAttention(64, 8, heads=f"{heads}:4,attention:4").eval()
        for mask in ({}, {"is_causal": True}, {"key_padding_mask": torch.ones(2, N, dtype=torch.bool)}):
            spy.calls.clear()
            with torch.no_grad():
                layer(x, **mask)
            assert spy.calls == [(4, C, C)] + rival_calls, (heads, mask)
    layer = DiffusionAttention(64, 8, heads="attnscale:4,attention:4").eval()
    spy.calls.clear()
    with torch.no_grad():
        layer(x, attn_mask=other)
    assert spy.calls == [(4, C, C)] * 3
    solves = {"solve": 0, "solve_triangular": 0}
    for name in solves:
        original = getattr(torch.linalg, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            solves[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(torch.linalg, name, counted)
    layer = DiffusionAttention(16, 2, heads="ppr-exact:1,attention:1").eval()
    with torch.no_grad():
        layer(torch.randn(1, 5, 16, generator=_gen(32)), is_causal=True)
        assert solves == {"solve": 0, "solve_triangular": 1}
        layer(torch.randn(1, 5, 16, generator=_gen(32)))
        assert solves == {"solve": 1, "solve_triangular": 1}


_COST = {
    "flops": _cost_flops,
    "backend-rule": _cost_backend_rule,
    "shared-and-stopping-calls": _cost_shared_and_stopping_calls,
    "rival-calls": _cost_rival_calls,
}


@pytest.mark.parametrize("claim", sorted(_COST))
def test_cost_page(claim, monkeypatch):
    _COST[claim](monkeypatch)


# ------------------------------------------------------------------------------------------ names and options

#: (page, the text as the page writes it, operator name, options it names)
_MENTIONS = [
    ("family.rst", '``"attention:6,laplacian:2"``', "attention", ()),
    ("family.rst", '``"heat(t=0.5, learnable=True):2,attention:6"``', "heat", ("t", "learnable")),
    ("family.rst", "``heat-exact``", "heat-exact", ()),
    ("family.rst", '"heat": dict(t=1.0, steps=8)', "heat", ("t", "steps")),
    ("family.rst", '"ppr": dict(alpha=0.2, steps=10)', "ppr", ("alpha", "steps")),
    ("family.rst", '"polynomial": dict(steps=2, init=[0.0, 1.0, -1.0])', "polynomial", ("steps", "init")),
    ("heat.rst", '``method="taylor"``', "heat", ("method",)),
    ("heat.rst", '``method="euler"``', "heat", ("method",)),
    ("heat.rst", "``HeatOperator(steps=None, tol=...)``", "heat", ("steps", "tol")),
    ("heat.rst", "``heat(t=50, steps=4)``", "heat", ("t", "steps")),
    ("heat.rst", '``"heat(t=0.5, learnable=True)"``', "heat", ("t", "learnable")),
    ("heat.rst", "``min_t``", "heat", ("min_t",)),
    ("laplacian.rst", '``"laplacian"``', "laplacian", ()),
    ("laplacian.rst", '``"I-P"``', "I-P", ()),
    ("rivals.rst", '``"attention:4,differential:4"``', "differential", ()),
    ("rivals.rst", "``ppr-exact(alpha)``", "ppr-exact", ("alpha",)),
    ("rivals.rst", "``polynomial(steps, basis='chebyshev')``", "polynomial", ("steps", "basis")),
    ("rivals.rst", "``attnscale(omega)``", "attnscale", ("omega",)),
    ("rivals.rst", "``neutreno(lam)``", "neutreno", ("lam",)),
    ("rivals.rst", "``value-residual(lam)``", "value-residual", ("lam",)),
    ("rivals.rst", "``differential(depth)``", "differential", ("depth",)),
    ("rivals.rst", "``grand-nl(t, steps, method)``", "grand-nl", ("t", "steps", "method")),
    ("rivals.rst", "``ppr(alpha, steps=K)``", "ppr", ("alpha", "steps")),
    ("rivals.rst", "``init``", "polynomial", ("init",)),
    ("rivals.rst", '``method="dopri5"``', "grand-nl", ("method",)),
    ("rivals.rst", "``depth=``", "differential", ("depth",)),
    ("rivals.rst", "``lam = 1``", "value-residual", ("lam",)),
]


def _mention_rows():
    return [pytest.param(*row, id=f"{row[0]}:{row[1]}") for row in _MENTIONS]


@pytest.mark.parametrize("page, text, name, options", _mention_rows())
def test_theory_pages_name_registered_operators_and_options(page, text, name, options):
    assert text in (THEORY / page).read_text(encoding="utf-8"), f"{page} no longer says {text}"
    cls = operator_class(name)
    params = inspect.signature(cls).parameters
    missing = [o for o in options if o not in params]
    assert not missing, f"{page} names options {missing} that {cls.__name__} does not take"
    if text.startswith('``"'):  # a spec as the page writes it: a layer's heads or one operator
        spec = text.strip('`"')
        if ":" in spec:
            assert sum(op.num_heads for op in DiffusionAttention(64, 8, heads=spec).operators) == 8
        else:
            assert isinstance(build_operator(spec), cls)
