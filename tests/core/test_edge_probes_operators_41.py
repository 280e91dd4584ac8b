"""Edge probes of heat / heat-exact / ppr / ppr-exact / polynomial / grand-nl against independent float64 references.

References: ``torch.linalg.matrix_exp`` of the explicit masked generator ``-t (I - P)``, ``torch.linalg.solve`` of
``I - (1 - alpha) P``, explicit matrix powers, and a fine RK4 integration of GRAND's ODE, with ``P`` the softmax of
the explicitly masked scores.
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators.heat import ExactHeatOperator
from diffusionformer.operators.ppr_exact import ExactPPROperator

f64 = torch.float64
B, N, D, H = 2, 6, 8, 2
C = D // H


def _stochastic(seed: int, n: int = N, causal: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    S = 2 * torch.randn(1, 1, n, n, dtype=f64, generator=g)
    if causal:
        S = S.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(S, -1)


def _stationary_limit(P: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``1 pi^T v`` with ``pi`` the stationary distribution of ``P`` (the ``t -> infinity`` heat kernel)."""
    w, V = torch.linalg.eig(P[0, 0].T)
    pi = V[:, torch.argmin((w - 1).abs())].real
    pi = pi / pi.sum()
    return (pi @ v[0, 0]).expand(P.shape[-1], -1)


def _masked_P(layer: DiffusionAttention, x: torch.Tensor, allowed: torch.Tensor):
    q, k, v = (t.view(B, N, H, C).transpose(1, 2) for t in layer.qkv(x).split(D, -1))
    s = (q @ k.transpose(-1, -2) / math.sqrt(C)).masked_fill(~allowed, float("-inf"))
    return torch.nan_to_num(torch.softmax(s, -1), nan=0.0), q, k, v


def _out(layer: DiffusionAttention, y: torch.Tensor) -> torch.Tensor:
    return layer.out_proj(y.transpose(1, 2).reshape(B, N, D))


# ---------------------------------------------------------------------------------------------------------------
# bugs


@pytest.mark.parametrize("t", [1e7, 1e12])
def test_bug_heat_exact_huge_t_float32_is_refused_not_garbage(t):
    """Bug: ExactHeatOperator accepted any t >= -40, and in float32 its matrix exponential loses about t * eps:
    t = 1e7 gave an output off by 1.5 from the stationary limit (|v| ~ 1), t = 1e12 gave NaN, without any error."""
    P, v = _stochastic(0), torch.randn(1, 1, N, 3, dtype=f64, generator=torch.Generator().manual_seed(1))
    op = ExactHeatOperator(t=t)
    with pytest.raises(ValueError, match="float64"):
        op.apply_matrix(P.float(), v.float())
    learned = ExactHeatOperator(t=1.0, learnable=True)
    with torch.no_grad():
        learned.t.fill_(t)
    with pytest.raises(ValueError, match="t \\* eps"):
        learned.apply_matrix(P.float(), v.float())


def test_bug_heat_exact_huge_t_float64_is_refused_not_garbage():
    """Bug: in float64, heat-exact(t=1e16) returned an output off by 12 from the stationary limit, t=1e300 NaN."""
    P, v = _stochastic(2), torch.randn(1, 1, N, 3, dtype=f64)
    for t in (1e16, 1e300):
        with pytest.raises(ValueError, match="heat-exact"):
            ExactHeatOperator(t=t).apply_matrix(P, v)
        learned = ExactHeatOperator(t=1.0, learnable=True).double()
        with torch.no_grad():
            learned.t.fill_(t)
        with pytest.raises(ValueError, match="t \\* eps"):
            learned.apply_matrix(P, v)


def test_pins_heat_exact_large_t_within_limit_reaches_the_stationary_limit():
    """Large t below the refusal limit: exp(-t (I - P)) -> 1 pi^T (the causal P's limit keeps token 0's value)."""
    for seed in range(3):
        P = _stochastic(seed)
        v = torch.randn(1, 1, N, 3, dtype=f64, generator=torch.Generator().manual_seed(seed + 10))
        lim = _stationary_limit(P, v)
        y32 = ExactHeatOperator(t=5e3).apply_matrix(P.float(), v.float())
        assert (y32[0, 0].double() - lim).abs().max() < 1e-3
        y32 = ExactHeatOperator(t=8e4).apply_matrix(P.float(), v.float())  # just below float32's limit, 8.4e4
        assert (y32[0, 0].double() - lim).abs().max() < 1e-2
        y64 = ExactHeatOperator(t=1e8).apply_matrix(P, v)
        assert (y64[0, 0] - lim).abs().max() < 1e-7
        Pc = _stochastic(seed, causal=True)
        yc = ExactHeatOperator(t=1e8).apply_causal_matrix(Pc, v)
        torch.testing.assert_close(yc[0, 0], v[0, 0, :1].expand(N, -1), rtol=0, atol=1e-10)


# ---------------------------------------------------------------------------------------------------------------
# pins against independent references


_I = torch.eye(N, dtype=f64)
_REFS = {
    "heat(t=0.7,steps=40)": lambda P, v: torch.linalg.matrix_exp(-0.7 * (_I - P)) @ v,
    "heat-exact(t=-1.5)": lambda P, v: torch.linalg.matrix_exp(1.5 * (_I - P)) @ v,
    "ppr(alpha=0.3,steps=80)": lambda P, v: 0.3 * torch.linalg.solve(_I - 0.7 * P, v),
    "ppr-exact(alpha=0.3)": lambda P, v: 0.3 * torch.linalg.solve(_I - 0.7 * P, v),
    "polynomial(steps=2,init=[0.125,0.625,0.25])": lambda P, v: 0.125 * v + 0.625 * P @ v + 0.25 * P @ P @ v,
    # theta = [0.5, 0.25, 0.125, 0.5] on T_0..T_3 (exact in float32), given as its monomial weights
    "polynomial(steps=3,init=[0.375,-1.25,0.25,2.0],basis='chebyshev')": lambda P, v: _chebyshev(P, v, [0.5, 0.25, 0.125, 0.5]),
}


def _chebyshev(P: torch.Tensor, v: torch.Tensor, theta: list[float]) -> torch.Tensor:
    """sum_k theta_k T_k(P) v by the recursion T_{k+1} = 2 P T_k - T_{k-1} on explicit matrices."""
    T = [torch.eye(P.shape[-1], dtype=f64).expand_as(P), P]
    while len(T) < len(theta):
        T.append(2 * P @ T[-1] - T[-2])
    return sum(c * (Tk @ v) for c, Tk in zip(theta, T))


@pytest.mark.parametrize("spec", sorted(_REFS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", ["none", "kpm", "bool", "float"])
def test_pins_dense_operators_match_explicit_float64_references(spec, causal, mask):
    """Every dense head against its closed form on the explicitly masked P (bool, additive float, key padding
    with a fully padded sequence and a left-padded one, causal), in float64 through the whole layer."""
    torch.manual_seed(0)
    x = torch.randn(B, N, D, dtype=f64)
    layer = DiffusionAttention(D, H, heads=f"{spec}:{H}", causal=causal).double()
    allowed = torch.ones(B, 1, N, N, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool).tril()
    kw: dict = {}
    if mask == "kpm":
        kpm = torch.zeros(B, N, dtype=torch.bool)
        kpm[0] = True
        kpm[1, 0] = True
        kw["key_padding_mask"] = kpm
        allowed = allowed & ~kpm[:, None, None, :]
    elif mask == "bool":
        am = torch.rand(B, 1, N, N, generator=torch.Generator().manual_seed(3)) < 0.6
        am[..., 0] = True
        kw["attn_mask"] = am
        allowed = allowed & am
    with torch.no_grad():
        if mask == "float":
            bias = torch.randn(B, 1, N, N, dtype=f64)
            bias[..., 2] = float("-inf")
            kw["attn_mask"] = bias
            q, k, v = (t.view(B, N, H, C).transpose(1, 2) for t in layer.qkv(x).split(D, -1))
            s = (q @ k.transpose(-1, -2) / math.sqrt(C) + bias).masked_fill(~allowed, float("-inf"))
            P = torch.nan_to_num(torch.softmax(s, -1), nan=0.0)
        else:
            P, _, _, v = _masked_P(layer, x, allowed)
        ref = _out(layer, _REFS[spec](P, v))
        y = layer(x, **kw)
    torch.testing.assert_close(y, ref, rtol=0, atol=1e-9)


@pytest.mark.parametrize("method", ["euler", "rk4"])
def test_pins_grand_nl_is_its_solver_on_the_explicit_ode(method):
    """grand-nl's output equals the same fixed-step scheme on dX = (P(X) - I) X written out explicitly (causal, key
    padding), and RK4 approaches a fine RK4 integration (400 steps)."""
    torch.manual_seed(0)
    x = torch.randn(B, N, D, dtype=f64)
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[1, -2:] = True
    layer = DiffusionAttention(D, H, heads=f"grand-nl(t=1.5,steps=3,method='{method}'):{H}", causal=True).double()
    allowed = torch.ones(N, N, dtype=torch.bool).tril() & ~kpm[:, None, None, :]

    def solve(K: int, scheme: str) -> torch.Tensor:
        _, q, k, v = _masked_P(layer, x, allowed)
        s = torch.cat([q, k, v], -1)

        def f(s):
            a = (s[..., :C] @ s[..., C:2 * C].transpose(-1, -2) / math.sqrt(C)).masked_fill(~allowed, float("-inf"))
            return torch.nan_to_num(torch.softmax(a, -1), nan=0.0) @ s - s

        tau = 1.5 / K
        for _ in range(K):
            if scheme == "euler":
                s = s + tau * f(s)
            else:
                k1 = f(s)
                k2 = f(s + tau / 2 * k1)
                k3 = f(s + tau / 2 * k2)
                k4 = f(s + tau * k3)
                s = s + tau / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        return _out(layer, s[..., 2 * C:])

    with torch.no_grad():
        y = layer(x, key_padding_mask=kpm)
        torch.testing.assert_close(y, solve(3, method), rtol=0, atol=1e-12)
        if method == "rk4":
            assert (y - solve(400, "rk4")).abs().max() < 2e-3


@pytest.mark.parametrize("spec", ["heat(t=0.7,steps=12,learnable=True)", "ppr(alpha=0.3,steps=12,learnable=True)",
                                  "polynomial(steps=3,init=[0.1,0.6,0.2,0.1],basis='chebyshev')",
                                  "grand-nl(t=1.0,steps=2,method='rk4')"])
@pytest.mark.parametrize("causal", [False, True])
def test_pins_sparse_equals_dense_forward_and_gradients(spec, causal):
    """On the complete graph the sparse back-end gives the dense output and the same gradients (input and
    learned t / alpha / theta), causal or not."""
    n = 5
    ii, jj = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    ei = torch.stack([jj.flatten(), ii.flatten()])
    torch.manual_seed(1)
    layer = DiffusionAttention(D, H, heads=f"{spec}:{H}", causal=causal).double()
    x = torch.randn(n, D, dtype=f64)
    xs, xd = x.clone().requires_grad_(), x.clone()[None].requires_grad_()
    ys = layer(xs, edge_index=ei)
    gs = torch.autograd.grad(ys.square().sum(), [xs, *layer.parameters()])
    yd = layer(xd)
    gd = torch.autograd.grad(yd.square().sum(), [xd, *layer.parameters()])
    torch.testing.assert_close(ys, yd[0], rtol=0, atol=1e-12)
    for a, b in zip(gs, gd):
        torch.testing.assert_close(a.reshape(-1), b.reshape(-1), rtol=0, atol=1e-11)


def test_pins_exact_operator_gradients_match_float64_references():
    """gradcheck of ppr-exact (LU and causal triangular solve) in float64, and heat-exact's learned-t gradient
    equal to that of torch.linalg.matrix_exp of the explicit generator."""
    P = torch.softmax(torch.randn(1, 2, 4, 4, dtype=f64), -1).requires_grad_()
    Pc = _stochastic(5, 4, causal=True).expand(1, 2, 4, 4).clone().requires_grad_()
    v = torch.randn(1, 2, 4, 3, dtype=f64, requires_grad=True)
    op = ExactPPROperator(alpha=0.2)
    assert torch.autograd.gradcheck(op.apply_matrix, (P, v))
    assert torch.autograd.gradcheck(op.apply_causal_matrix, (Pc, v))
    torch.testing.assert_close(op.apply_causal_matrix(Pc, v), 0.2 * torch.linalg.solve(torch.eye(4, dtype=f64) - 0.8 * Pc, v))
    heat = ExactHeatOperator(t=0.8, learnable=True, num_heads=2).double()
    heat.apply_matrix(P, v).square().sum().backward()
    t = heat.t.detach().clone().requires_grad_()
    (torch.linalg.matrix_exp(-t.view(1, -1, 1, 1) * (torch.eye(4, dtype=f64) - P)) @ v).square().sum().backward()
    torch.testing.assert_close(heat.t.grad, t.grad, rtol=1e-10, atol=1e-12)
