"""Tests written in a mutation-testing audit of the rival operators (``operators/neutreno.py``:
NeuTRENO and value residuals, ``operators/attnscale.py``: AttnScale, ``operators/grand.py``: GRAND-nl),
their float64 references (``ops/reference_rivals.py``, ``ops/reference.py``), the edge features of
the sparse layer (``nn/edge_features.py``) and rotary embeddings (``nn/rotary.py``).

Each test kills a mutant of the library code that the rest of the suite let through (its docstring
names it: file and mutation) and checks the code against an independent reference: the papers'
equations re-derived in float64 numpy (NeuTRENO: ``P v + lambda (v0 - v)``; AttnScale:
``DC + (1 + omega) (P - DC)`` with ``DC`` the uniform average over the admissible keys; GRAND-nl:
explicit Euler and classical Runge-Kutta steps of ``(P(X) - I) X``; Chebyshev polynomials from their
closed forms; exact PPR and heat kernels from numpy/scipy), rotary embeddings as explicit 2x2
rotations of channel pairs, and hand-computed values. Mutants judged equivalent are listed, with the
reason, at the end of the file. CPU only, deterministic (seeded generators), no network, no files.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.linalg import expm

from diffusionformer import DiffusionAttention, build_operator
from diffusionformer.nn.edge_features import edge_feature_attention
from diffusionformer.nn.rotary import RotaryEmbedding, RotaryEmbedding2D, apply_rotary
from diffusionformer.operators import (
    AttnScaleOperator,
    LaplacianOperator,
    NeuTRENOOperator,
    NonlinearDiffusionOperator,
    ValueResidualOperator,
)
from diffusionformer.operators import grand as _grand
from diffusionformer.ops.reference import dense_attention_reference, heat_kernel_reference, polynomial_reference
from diffusionformer.ops.reference_rivals import (
    attnscale_reference,
    chebyshev_reference,
    differential_reference,
    grand_nl_reference,
    neutreno_reference,
    ppr_exact_reference,
    rival_reference,
    uniform_matrix_reference,
    value_residual_reference,
)
from diffusionformer.ops.rivals import RivalContext

f64 = torch.float64


def _t(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=f64) * scale


def _np_softmax(q, k, allowed=None, scale=None):
    """Row softmax of ``q k^T * scale`` over the admissible keys, in numpy float64; empty rows are zero."""
    q, k = np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = np.einsum("...nc,...mc->...nm", q, k) * scale
    A = np.ones(s.shape, dtype=bool) if allowed is None else np.broadcast_to(np.asarray(allowed, dtype=bool), s.shape)
    out = np.zeros_like(s)
    for idx in np.ndindex(s.shape[:-1]):
        row, ok = s[idx], A[idx]
        if ok.any():
            e = np.exp(row[ok] - row[ok].max())
            out[idx][ok] = e / e.sum()
    return out


def _np_uniform(N, allowed=None):
    A = np.ones((N, N)) if allowed is None else np.asarray(allowed, dtype=np.float64)
    rows = A.sum(-1, keepdims=True)
    return np.divide(A, rows, out=np.zeros_like(A), where=rows > 0)


def _tril(N):
    return torch.tensor([[j <= i for j in range(N)] for i in range(N)])


# ------------------------------------------------------------------------------------- neutreno.py
def test_neutreno_and_value_residual_defaults_and_example_are_the_papers_settings():
    """kills: neutreno.py ValueResidualOperator default ``lam = 1.0 -> 0.5``; NeuTRENO ``example_kwargs``
    ``lam 0.6 -> 0.0`` (the documented DeiT setting)"""
    q, k, v, v0 = (_t(1, 2, 5, 3, seed=s) for s in range(4))
    P = _np_softmax(q, k)
    got = ValueResidualOperator().apply_context(RivalContext.dense(q, k, v, v0=v0))
    np.testing.assert_allclose(got.numpy(), P @ (v.numpy() + 1.0 * v0.numpy()), atol=1e-12)
    assert NeuTRENOOperator.example_kwargs == {"lam": 0.6}
    assert build_operator("neutreno", **NeuTRENOOperator.example_kwargs).lam == 0.6


@pytest.mark.parametrize("cls", [NeuTRENOOperator, ValueResidualOperator])
def test_lambda_must_be_a_finite_real(cls):
    """kills: neutreno.py ``self.lam = _check_lambda(lam, "lam") -> self.lam = lam`` (NaN, inf and strings accepted)"""
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="lam must be finite"):
            cls(lam=bad)
    with pytest.raises(TypeError, match="lam must be a float, got str"):
        cls(lam="0.5")
    assert type(cls(lam=np.float32(0.25)).lam) is float


@pytest.mark.parametrize("name, cls", [("neutreno", NeuTRENOOperator), ("value-residual", ValueResidualOperator)])
def test_first_layer_value_operators_round_trip_their_spec_and_refuse_polynomial_queries(name, cls):
    """kills: neutreno.py ``spec_kwargs`` returning ``{}`` (lam lost in the spec); ``degree`` / ``coefficients``
    raising ValueError instead of NotImplementedError; ``extra_repr`` without ``lam``; ``is_polynomial``
    or ``needs_layer_state`` flipped"""
    op = cls(lam=0.3, num_heads=2)
    rebuilt = build_operator(op.spec())
    assert type(rebuilt) is cls and rebuilt.lam == 0.3
    with pytest.raises(NotImplementedError, match="not a polynomial"):
        op.coefficients()
    with pytest.raises(NotImplementedError, match="reads the first layer's values"):
        op.degree  # noqa: B018
    assert repr(op).endswith("(lam=0.3, num_heads=2)")
    assert op.is_polynomial is False and op.needs_layer_state is True


def test_rival_aliases_name_their_operators():
    """kills: neutreno.py ``aliases`` of NeuTRENO emptied; ``"resformer"`` dropped from ValueResidual's aliases"""
    assert type(build_operator("neu-treno")) is NeuTRENOOperator
    assert type(build_operator("resformer")) is ValueResidualOperator
    assert type(build_operator("attn-scale")) is AttnScaleOperator
    assert type(build_operator("re-attention")) is NonlinearDiffusionOperator


# ------------------------------------------------------------------------------------- attnscale.py
@pytest.mark.parametrize("learnable", [True, False])
def test_attnscale_per_head_omega_against_numpy_with_causal_padding(learnable):
    """kills: attnscale.py ``dc + (1 + w)(pv - dc)`` -> ``(1 - w)`` / ``w``; ``view(1, -1, 1, 1)`` of omega;
    ``dc`` as the plain mean over all keys (causal, padded rows)"""
    B, G, N, C = 2, 3, 5, 4
    q, k, v = (_t(B, G, N, C, seed=s) for s in range(3))
    op = AttnScaleOperator(omega=0.0, learnable=learnable, num_heads=G)
    omega = np.array([0.5, -0.25, 1.5])
    with torch.no_grad():
        op.omega.copy_(torch.tensor(omega))
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[1, 3:] = True
    allowed = (_tril(N)[None, None] & ~pad[:, None, None, :]).numpy()
    ctx = RivalContext.dense(q, k, v, attn_mask=~pad[:, None, None, :], is_causal=True)
    got = op.apply_context(ctx).detach().numpy()
    P = _np_softmax(q, k, allowed)
    for b in range(B):
        DC = _np_uniform(N, allowed[b, 0])
        for g in range(G):
            want = (DC + (1 + omega[g]) * (P[b, g] - DC)) @ v[b, g].numpy()
            np.testing.assert_allclose(got[b, g], want, atol=1e-12)


def test_attnscale_refuses_a_context_with_another_number_of_heads_but_broadcasts_one():
    """kills: attnscale.py the head check ``and -> or`` (a one-head operator refused on three heads) and the
    check dropped (a two-head operator on three heads: a broadcast error or silent garbage)"""
    q, k, v = (_t(1, 3, 4, 2, seed=s) for s in range(3))
    ctx = RivalContext.dense(q, k, v)
    one = AttnScaleOperator(omega=0.5, num_heads=1)
    P = _np_softmax(q, k)
    DC = np.full((4, 4), 0.25)
    np.testing.assert_allclose(one.apply_context(ctx).detach().numpy(), (DC + 1.5 * (P - DC)) @ v.numpy(), atol=1e-12)
    with pytest.raises(ValueError, match="attnscale serves 2 heads, got 3"):
        AttnScaleOperator(num_heads=2).apply_context(ctx)


def test_attnscale_arguments_are_checked_and_kept():
    """kills: attnscale.py dropping ``check_real(omega)``, the bool check of ``learnable``, ``if learnable`` negated,
    ``_omega0 = 0``, ``"learnable": True`` in the spec, the buffer in float32, the parameter not set from omega,
    the non-finite omega check, default omega ``0 -> 0.1``, ``example_kwargs`` omega changed, extra_repr"""
    with pytest.raises(TypeError, match="omega must be a float, got str"):
        AttnScaleOperator(omega="0.5")
    with pytest.raises(TypeError, match="learnable must be a bool, got int"):
        AttnScaleOperator(learnable=1)
    fixed = AttnScaleOperator(omega=0.3, learnable=False, num_heads=2)
    assert "omega" not in dict(fixed.named_parameters()) and fixed.omega.dtype == f64
    assert fixed.omega.tolist() == [0.3, 0.3]  # exactly 0.3 in float64
    learned = AttnScaleOperator(omega=0.7, num_heads=2)
    assert isinstance(learned.omega, torch.nn.Parameter) and torch.allclose(learned.omega, torch.tensor([0.7, 0.7]))
    for op in (fixed, learned):
        rebuilt = build_operator(op.spec(), num_heads=2)
        assert rebuilt.learnable is op.learnable and rebuilt.spec() == op.spec()
        assert torch.allclose(rebuilt.omega.double(), op.omega.double())
    assert repr(fixed).endswith("(omega=[0.3, 0.3], learnable=False, num_heads=2)")
    assert "omega=[0.1235]" in repr(AttnScaleOperator(omega=0.123456))
    assert AttnScaleOperator().omega.tolist() == [0.0]
    assert AttnScaleOperator.example_kwargs == {"omega": 0.4}
    q, k, v = (_t(1, 1, 3, 2, seed=s) for s in range(3))
    bad = AttnScaleOperator(omega=0.0)
    with torch.no_grad():
        bad.omega.fill_(float("nan"))
    with pytest.raises(ValueError, match="omega is not finite"):
        bad.apply_context(RivalContext.dense(q, k, v))
    with pytest.raises(NotImplementedError, match="uniform map"):
        bad.degree  # noqa: B018


# ------------------------------------------------------------------------------------- grand.py
def _np_grand(q, k, v, t, steps, method, allowed=None):
    """Explicit Euler / classical RK4 of ``X' = (P(X) - I) X``, ``X = [q | k | v]``, in numpy float64."""
    C = q.shape[-1]
    X = np.concatenate([q.numpy(), k.numpy(), v.numpy()], axis=-1)

    def f(X):
        return _np_softmax(X[..., :C], X[..., C:2 * C], allowed, scale=C**-0.5) @ X - X

    h = t / steps
    for _ in range(steps):
        if method == "euler":
            X = X + h * f(X)
        else:
            a = f(X)
            b = f(X + h / 2 * a)
            c = f(X + h / 2 * b)
            d = f(X + h * c)
            X = X + h / 6 * (a + 2 * b + 2 * c + d)
    return X[..., 2 * C:]


@pytest.mark.parametrize("method", ["euler", "rk4"])
def test_grand_nl_steps_against_numpy_with_values_of_another_width(method):
    """kills: grand.py ``tau = t / (steps + 1)``; each RK4 stage (``0.5 tau k1 -> tau k1``, ``k3`` from ``k1``,
    ``k4`` from ``k2``, weights ``2 k1 + k2``); the field without ``- state``; the output slice"""
    q, k = _t(1, 2, 5, 3, seed=1), _t(1, 2, 5, 3, seed=2)
    v = _t(1, 2, 5, 2, seed=3)
    op = NonlinearDiffusionOperator(t=1.3, steps=3, method=method)
    got = op.apply_context(RivalContext.dense(q, k, v, is_causal=True)).numpy()
    want = _np_grand(q, k, v, 1.3, 3, method, _tril(5).numpy())
    np.testing.assert_allclose(got, want, atol=1e-12)
    # and the torch reference agrees with numpy (reference_rivals.grand_nl_reference)
    np.testing.assert_allclose(grand_nl_reference(q, k, v, 1.3, 3, method, _tril(5)).numpy(), want, atol=1e-12)


def test_grand_nl_time_steps_and_method_are_checked():
    """kills: grand.py ``t < 0 -> t <= 0`` (t = 0 refused); the finiteness check dropped; the bool check of ``t``
    dropped; ``check_count(steps)`` dropped; the method's TypeError turned ValueError; ``n=2 -> 1`` close
    matches; the hint dropped"""
    q, k, v = (_t(1, 1, 4, 2, seed=s) for s in range(3))
    assert torch.equal(NonlinearDiffusionOperator(t=0).apply_context(RivalContext.dense(q, k, v)), v)
    for bad in (-0.5, float("inf"), float("nan"), True, "1"):
        with pytest.raises(ValueError, match="t must be a finite non-negative float"):
            NonlinearDiffusionOperator(t=bad)
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match=r"steps must be an int in \[1, 1024\]"):
            NonlinearDiffusionOperator(steps=bad)
    with pytest.raises(TypeError, match="method must be a str, got int"):
        NonlinearDiffusionOperator(method=4)
    with pytest.raises(ValueError, match=r"unknown method 'heun' \(did you mean 'heun3' or 'heun2'\?\)"):
        NonlinearDiffusionOperator(method="heun")


def test_bug_grand_nl_takes_a_numpy_time_from_a_sweep():
    """Bug: ``NonlinearDiffusionOperator(t=np.float32(0.5))`` (a time from a numpy sweep) was refused with the
    self-contradicting "t must be a finite non-negative float, got np.float32(0.5)", while every other operator
    takes numpy reals (``check_real``). numpy reals are times now; a numpy bool is still refused."""
    op = NonlinearDiffusionOperator(t=np.float32(0.5), steps=2)
    assert op.t == 0.5 and type(op.t) is float
    assert build_operator("grand-nl", t=np.float64(0.25)).spec_kwargs()["t"] == 0.25
    q, k, v = (_t(1, 1, 4, 2, seed=s) for s in range(3))
    np.testing.assert_allclose(op.apply_context(RivalContext.dense(q, k, v)).numpy(),
                               _np_grand(q, k, v, 0.5, 2, "euler"), atol=1e-12)
    for bad in (np.bool_(True), np.float64("nan"), np.float32(-1.0)):
        with pytest.raises(ValueError, match="t must be a finite non-negative float"):
            NonlinearDiffusionOperator(t=bad)


def test_grand_nl_defaults_calls_and_repr():
    """kills: grand.py defaults ``t 1 -> 0.5``, ``steps 4 -> 2``, ``rtol 1e-5 -> 1e-3``; ``calls_per_forward``
    with ``4 -> 2`` or keyed on ``"euler"``; the spec of a fixed-step solver with tolerances; extra_repr"""
    op = NonlinearDiffusionOperator()
    assert (op.t, op.steps, op.method, op.rtol, op.atol) == (1.0, 4, "euler", 1e-5, 1e-6)
    assert op.calls_per_forward() == 4
    assert NonlinearDiffusionOperator(steps=3, method="rk4").calls_per_forward() == 12
    assert op.spec_kwargs() == {"t": 1.0, "steps": 4, "method": "euler"}
    assert repr(NonlinearDiffusionOperator(t=0.5, steps=2, method="rk4")).endswith(
        "(t=0.5, steps=2, method='rk4', num_heads=1)")


def test_grand_nl_adaptive_solver_passes_time_method_and_tolerances(monkeypatch):
    """kills: grand.py the construction-time ``_odeint()`` call dropped; ``rtol``/``atol`` swapped (stored or passed);
    the integration interval ``[0, t] -> [0, 1]``; the method name not passed on; the spec of an adaptive
    solver without its tolerances"""
    calls = {"made": 0, "run": []}

    def fake_odeint(func, y0, times, method, rtol, atol):
        calls["run"].append((times.tolist(), method, rtol, atol))
        y, n = y0, 400  # many RK4 steps over [t0, t1]: close to the exact flow
        h = float(times[1] - times[0]) / n
        for _ in range(n):
            a = func(None, y)
            b = func(None, y + h / 2 * a)
            c = func(None, y + h / 2 * b)
            d = func(None, y + h * c)
            y = y + h / 6 * (a + 2 * b + 2 * c + d)
        return torch.stack([y0, y])

    def fake_loader():
        calls["made"] += 1
        return fake_odeint

    monkeypatch.setattr(_grand, "_odeint", fake_loader)
    op = NonlinearDiffusionOperator(t=0.6, method="bosh3", rtol=1e-4, atol=1e-7)
    assert calls["made"] == 1  # checked at construction
    assert op.spec_kwargs() == {"t": 0.6, "steps": 4, "method": "bosh3", "rtol": 1e-4, "atol": 1e-7}
    q, k, v = (_t(1, 1, 4, 2, seed=s) for s in range(3))
    got = op.apply_context(RivalContext.dense(q, k, v)).numpy()
    assert calls["run"] == [([0.0, 0.6], "bosh3", 1e-4, 1e-7)]
    np.testing.assert_allclose(got, _np_grand(q, k, v, 0.6, 400, "rk4"), atol=1e-10)


def test_grand_nl_missing_torchdiffeq_says_how_to_install(monkeypatch):
    """kills: grand.py the install hint dropped from the ImportError of an adaptive solver"""
    import builtins

    real = builtins.__import__

    def no_torchdiffeq(name, *args, **kwargs):
        if name == "torchdiffeq":
            raise ImportError("No module named 'torchdiffeq'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchdiffeq)
    with pytest.raises(ImportError, match=r"\(pip install torchdiffeq\); the built-in solvers are method='euler'"):
        NonlinearDiffusionOperator(method="dopri5")


def test_grand_nl_renormalises_queries_and_keys_in_their_order():
    """kills: grand.py ``q, k = ctx.normalise_qk(...)`` dropped or its outputs swapped"""
    q, k, v = (_t(1, 1, 4, 3, seed=s) for s in range(3))

    def norm(a, b):  # distinct maps for queries and keys
        return 2.0 * a, b + 0.5

    ctx = RivalContext.dense(q, k, v, normalise_qk=norm)
    got = NonlinearDiffusionOperator(t=1.0, steps=2).apply_context(ctx).numpy()
    X = np.concatenate([q.numpy(), k.numpy(), v.numpy()], axis=-1)
    for _ in range(2):
        P = _np_softmax(2.0 * X[..., :3], X[..., 3:6] + 0.5, scale=3**-0.5)
        X = X + 0.5 * (P @ X - X)
    np.testing.assert_allclose(got, X[..., 6:], atol=1e-12)


# ------------------------------------------------------------------------------------- reference_rivals.py
def test_rival_references_against_numpy():
    """kills: reference_rivals.py ``DC`` as ``A / N``; ppr without ``alpha`` or with ``(1 - alpha) -> alpha``;
    Chebyshev ``2 P T_k -> P T_k`` or ``T_1 = 2P``; attnscale ``(1 + w) -> w`` or ``DC`` unmasked; neutreno
    ``(v0 - v) -> (v - v0)`` / ``v0``; value residual without ``lam``"""
    N = 5
    allowed = _tril(N)
    A = allowed.numpy()
    q, k, v, v0 = (_t(1, 2, N, 3, seed=s) for s in range(4))
    P = _np_softmax(q, k, A)
    DC = _np_uniform(N, A)
    np.testing.assert_allclose(uniform_matrix_reference(N, allowed).numpy(), DC, atol=0)
    Pt = torch.tensor(P)
    alpha = 0.3
    want = alpha * np.linalg.solve(np.eye(N) - (1 - alpha) * P, v.numpy())
    np.testing.assert_allclose(ppr_exact_reference(Pt, v, alpha).numpy(), want, atol=1e-12)
    theta = torch.tensor([[0.5, -1.0, 0.25, 2.0], [1.0, 0.0, -0.5, 0.75]], dtype=f64)
    I = np.eye(N)
    for h in range(2):
        Ph = P[0, h]
        T = [I, Ph, 2 * Ph @ Ph - I, 4 * Ph @ Ph @ Ph - 3 * Ph]  # closed forms T_2 = 2x^2 - 1, T_3 = 4x^3 - 3x
        want = sum(float(theta[h, j]) * T[j] for j in range(4)) @ v[0, h].numpy()
        np.testing.assert_allclose(chebyshev_reference(Pt, v, theta)[0, h].numpy(), want, atol=1e-12)
    omega = torch.tensor([0.5, -0.25])
    got = attnscale_reference(q, k, v, omega, allowed).numpy()
    for h in range(2):
        want = (DC + (1 + float(omega[h])) * (P[0, h] - DC)) @ v[0, h].numpy()
        np.testing.assert_allclose(got[0, h], want, atol=1e-12)
    np.testing.assert_allclose(neutreno_reference(q, k, v, v0, 0.6, allowed).numpy(),
                               P @ v.numpy() + 0.6 * (v0.numpy() - v.numpy()), atol=1e-12)
    np.testing.assert_allclose(value_residual_reference(q, k, v, v0, 0.5, allowed).numpy(),
                               P @ (v.numpy() + 0.5 * v0.numpy()), atol=1e-12)


def test_differential_reference_against_numpy():
    """kills: reference_rivals.py differential: scale ``(C/2)^-1/2 -> C^-1/2``; ``+ lambda_init -> -``; the
    ``(1 - lambda_init)`` factor dropped; ``P1 - lam P2 -> P1 - P2``"""
    N, C = 4, 4
    q, k, v = (_t(1, 1, N, C, seed=s) for s in range(3))
    lq1, lk1, lq2, lk2 = (_t(2, seed=10 + s, scale=0.3) for s in range(4))
    gain = torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=f64)
    lam_init = 0.2
    got = differential_reference(q, k, v, lq1, lk1, lq2, lk2, gain, lam_init).numpy()
    P1 = _np_softmax(q[..., :2], k[..., :2], scale=2**-0.5)
    P2 = _np_softmax(q[..., 2:], k[..., 2:], scale=2**-0.5)
    lam = math.exp(float(lq1 @ lk1)) - math.exp(float(lq2 @ lk2)) + lam_init
    y = (P1 - lam * P2) @ v.numpy()
    want = 0.8 * gain.numpy() * y / np.sqrt((y**2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_grand_nl_reference_refuses_unknown_methods():
    """kills: reference_rivals.py grand_nl_reference's ValueError for a method other than euler / rk4 dropped"""
    q, k, v = (_t(1, 1, 3, 2, seed=s) for s in range(3))
    with pytest.raises(ValueError, match="method must be 'euler' or 'rk4', got 'dopri5'"):
        grand_nl_reference(q, k, v, 1.0, 2, "dopri5")


def test_rival_reference_dispatch_passes_each_operators_settings():
    """kills: reference_rivals.py rival_reference: ppr-exact with ``1 - alpha``; differential at depth 0; neutreno
    without the mask; grand-nl always Euler; the TypeError for other operators"""
    N = 5
    allowed = _tril(N)
    A = allowed.numpy()
    q, k, v, v0 = (_t(1, 1, N, 4, seed=s) for s in range(4))
    P = _np_softmax(q, k, A)
    ppr = build_operator("ppr-exact(alpha=0.2)")
    want = 0.2 * np.linalg.solve(np.eye(N) - 0.8 * P[0, 0], v[0, 0].numpy())
    np.testing.assert_allclose(rival_reference(ppr, q, k, v, allowed)[0, 0].numpy(), want, atol=1e-12)
    neu = build_operator("neutreno(lam=0.4)")
    np.testing.assert_allclose(rival_reference(neu, q, k, v, allowed, v0=v0).numpy(),
                               P @ v.numpy() + 0.4 * (v0.numpy() - v.numpy()), atol=1e-12)
    grand = build_operator("grand-nl(t=0.9, steps=2, method='rk4')")
    np.testing.assert_allclose(rival_reference(grand, q, k, v, allowed).numpy(),
                               _np_grand(q, k, v, 0.9, 2, "rk4", A), atol=1e-12)
    diff = build_operator("differential", num_heads=1)
    diff.bind(head_dim=4)
    diff = diff.double()
    deep = rival_reference(diff, q, k, v, allowed, depth=5)
    lam5 = 0.8 - 0.6 * math.exp(-0.3 * 5)  # the paper's lambda_init schedule at depth 5
    assert torch.allclose(deep, differential_reference(q, k, v, diff.lambda_q1, diff.lambda_k1, diff.lambda_q2,
                                                       diff.lambda_k2, diff.subln.weight, lam5, allowed), atol=1e-12)
    with pytest.raises(TypeError, match="no rival reference for HeatOperator"):
        rival_reference(build_operator("heat"), q, k, v)


# ------------------------------------------------------------------------------------- reference.py
def test_dense_attention_reference_is_stable_for_large_scores_of_either_sign():
    """kills: reference.py the max shift dropped or taken as ``amin`` (overflow to NaN at scores ~ +1000);
    the masked entries filled with 0 instead of -1e300 in the max (underflow to a zero row at scores ~ -1000)"""
    s = torch.tensor([[[1000.0, 999.0, 998.0]], [[-1000.0, -1001.0, -1002.0]]], dtype=f64)  # (2, 1, 3) scores
    q = torch.ones(2, 1, 1, dtype=f64)
    k = s.transpose(-2, -1)  # (2, 3, 1): q k^T = s with scale 1
    allowed = torch.tensor([True, True, False])
    got = dense_attention_reference(q, k, allowed=allowed, scale=1.0)
    e = np.exp([0.0, -1.0])
    want = np.concatenate([e / e.sum(), [0.0]])
    for row in got[:, 0]:
        np.testing.assert_allclose(row.numpy(), want, atol=1e-15)


def test_dense_attention_reference_scale_mask_and_empty_rows():
    """kills: reference.py default scale ``C^-1/2 -> C^+1/2``; the mask ignored in the exponentials; the mask
    made lower-triangular"""
    q, k = _t(2, 4, 3, seed=1), _t(2, 4, 3, seed=2)
    allowed = torch.tensor([[True, False, True, True]] * 3 + [[False] * 4])
    got = dense_attention_reference(q, k, allowed=allowed).numpy()
    np.testing.assert_allclose(got, _np_softmax(q, k, allowed.numpy()), atol=1e-15)
    assert (got[:, 3] == 0).all()


def test_polynomial_reference_with_per_head_coefficients():
    """kills: reference.py polynomial_reference starting at ``power = P``; the last coefficient dropped; per-head
    coefficients reshaped to ``(H, 1)`` (broadcast over the wrong axis)"""
    P = torch.tensor(_np_softmax(_t(1, 2, 3, 2, seed=1), _t(1, 2, 3, 2, seed=2)))
    v = _t(1, 2, 3, 2, seed=3)
    coeffs = torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.25, -0.5]], dtype=f64)
    got = polynomial_reference(P, v, coeffs).numpy()
    for h in range(2):
        Ph = P[0, h].numpy()
        want = (coeffs[h, 0].item() * np.eye(3) + coeffs[h, 1].item() * Ph + coeffs[h, 2].item() * Ph @ Ph) @ v[0, h].numpy()
        np.testing.assert_allclose(got[0, h], want, atol=1e-13)


def test_heat_kernel_reference_against_scipy_with_one_time_per_matrix():
    """kills: reference.py heat kernel ``-t (I - P) -> -t (P - I)`` or on ``P^T``; the per-matrix time reshape
    dropped or made ``(..., 1)``"""
    P = torch.tensor(_np_softmax(_t(3, 4, 2, seed=1), _t(3, 4, 2, seed=2)))
    v = _t(3, 4, 2, seed=3)
    t = torch.tensor([0.3, 1.0, 2.5], dtype=f64)
    got = heat_kernel_reference(P, v, t).numpy()
    for b in range(3):
        want = expm(-float(t[b]) * (np.eye(4) - P[b].numpy())) @ v[b].numpy()
        np.testing.assert_allclose(got[b], want, atol=1e-12)


# ------------------------------------------------------------------------------------- edge_features.py
def _graph():
    return torch.tensor([[1, 2, 3, 0, 2, 4, 0], [0, 0, 1, 2, 3, 3, 4]])


def test_edge_features_refuse_causal_layers_sparse_less_operators_and_misshapen_edge_keys():
    """kills: edge_features.py the causal check dropped; the ``supports_sparse`` check dropped (heat-exact then got
    the polynomial message); the shape check of ``edge_keys`` relaxed to its number of entries"""
    ei = _graph()
    x = _t(5, 4, seed=0)
    with pytest.raises(ValueError, match="expected a non-causal layer"):
        edge_feature_attention(DiffusionAttention(4, 2, causal=True).double(), x, ei, torch.zeros(7, 4, dtype=f64))
    with pytest.raises(ValueError, match="operator 'heat-exact' does not support the sparse back-end"):
        edge_feature_attention(DiffusionAttention(4, 2, "heat-exact").double(), x, ei, torch.zeros(7, 4, dtype=f64))
    with pytest.raises(ValueError, match=r"edge_keys: expected shape \(E, D\) = \(7, 4\), got \(4, 7\)"):
        edge_feature_attention(DiffusionAttention(4, 2).double(), x, ei, torch.zeros(4, 7, dtype=f64))


def test_edge_features_refuse_a_custom_operator_that_is_not_polynomial_without_a_context():
    """kills: edge_features.py ``op.uses_context or not op.is_polynomial`` -> ``op.uses_context`` (for the registered
    sparse operators the halves coincide; a user's subclass that is not a polynomial in ``P`` but needs no
    context would silently be run as its polynomial coefficients in the edge-aware loop)"""

    class _NotPoly(LaplacianOperator):
        is_polynomial = False  # no context, not a polynomial: the layer applies it to a dense P

    layer = DiffusionAttention(4, 2, _NotPoly(num_heads=2)).double()
    # named by its class, not only by the name it inherits (review 53g)
    with pytest.raises(ValueError, match=r"operator \S*_NotPoly \(a subclass of 'laplacian'\) is not a polynomial "
                                         "in one P"):
        edge_feature_attention(layer, _t(5, 4, seed=0), _graph(), torch.zeros(7, 4, dtype=f64))


def test_edge_features_drop_out_in_training_only():
    """kills: edge_features.py dropout applied in eval (``layer.dropout if layer.training else 0`` -> always);
    dropout never applied; the dropped-out weights not used in the propagation"""
    torch.manual_seed(0)
    ei = _graph()
    x = _t(5, 4, seed=1)
    ek = _t(7, 4, seed=2)
    layer = DiffusionAttention(4, 2, "heat(steps=2)", dropout=0.5).double()
    plain = DiffusionAttention(4, 2, "heat(steps=2)").double()
    plain.load_state_dict(layer.state_dict())
    evald = edge_feature_attention(layer.eval(), x, ei, ek)
    torch.testing.assert_close(evald, edge_feature_attention(plain.eval(), x, ei, ek), rtol=0, atol=0)
    torch.manual_seed(1)
    trained = edge_feature_attention(layer.train(), x, ei, ek)
    assert not torch.allclose(trained, evald, atol=1e-6)


# ------------------------------------------------------------------------------------- rotary.py
def _np_rope(x, angles):
    """Explicit rotation of each channel pair ``(x_2i, x_2i+1)`` at position ``n`` by ``angles[n, i]`` (float64)."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        n = idx[-2]  # (..., N, H, C)
        for i in range(x.shape[-1] // 2):
            a, b, th = x[idx + (2 * i,)], x[idx + (2 * i + 1,)], float(angles[n][i])
            out[idx + (2 * i,)] = math.cos(th) * a - math.sin(th) * b
            out[idx + (2 * i + 1,)] = math.sin(th) * a + math.cos(th) * b
    return out


def test_rotary_1d_is_the_explicit_pair_rotation_with_the_roformer_frequencies():
    """kills: rotary.py rotation direction flipped; the second component negated; the output pairs laid out
    non-interleaved; ``theta_i = base^{-2i/C}`` as ``base^{-i/C}`` or ``base^{-(2i+1)/C}``; default base
    ``10000 -> 1000``; default positions from 1; positions counted along the head axis"""
    N, H, C = 4, 3, 6
    x = _t(2, N, H, C, seed=0)
    rope = RotaryEmbedding(C)
    theta = [10000.0 ** (-2 * i / C) for i in range(C // 2)]
    angles = [[n * th for th in theta] for n in range(N)]
    np.testing.assert_allclose(rope(x).numpy(), _np_rope(x, angles), atol=1e-13)
    pos = torch.tensor([3, 0, 7, 2])
    angles = [[p * th for th in theta] for p in pos.tolist()]
    np.testing.assert_allclose(rope(x, pos).numpy(), _np_rope(x, angles), atol=1e-12)


def test_rotary_angles_stay_float64_for_large_and_fractional_positions():
    """kills: rotary.py ``cos`` of the angles taken after casting them to the input's float32; positions cast to
    float32 before the angles"""
    x = _t(2, 1, 4, seed=1).float()
    pos = torch.tensor([123456.7, 98765.4321], dtype=f64)
    rope = RotaryEmbedding(4)
    theta = [1.0, 10000.0 ** (-0.5)]
    angles = [[p * th for th in theta] for p in pos.tolist()]
    np.testing.assert_allclose(rope(x, pos).double().numpy(), _np_rope(x.double(), angles), atol=2e-6)


def test_rotary_2d_rotates_first_half_by_row_second_half_by_column():
    """kills: rotary.py 2-D frequencies over ``C`` instead of ``C/2`` (``half = head_dim`` or ``/ head_dim``);
    default base ``100 -> 10000``; rows and columns swapped"""
    C = 8
    rope = RotaryEmbedding2D(C)
    pos = torch.tensor([[0, 0], [1, 3], [2, 1]])
    x = _t(3, 1, C, seed=2)
    theta = [100.0 ** (-2 * i / (C // 2)) for i in range(C // 4)]  # 1-D frequencies of a C/2 RoPE
    angles = [[r * th for th in theta] + [c * th for th in theta] for r, c in pos.tolist()]
    np.testing.assert_allclose(rope(x, pos).numpy(), _np_rope(x, angles), atol=1e-13)


def test_bug_rotary_takes_numpy_numbers_and_names_a_positions_length_mismatch():
    """Bug: ``RotaryEmbedding(np.int64(8), base=np.float32(100.0))`` from a sweep was refused with a message that
    contradicts itself ("expected base a finite float > 1, got np.float32(100.0)"), unlike every operator; and
    positions for the wrong number of tokens were reported as "angles of shape (N, C/2)", a tensor the caller
    never passed. numpy ints and reals are taken now (stored as Python numbers), and the positions are named."""
    rope = RotaryEmbedding(np.int64(8), base=np.float32(100.0))
    assert type(rope.head_dim) is int and rope.head_dim == 8 and rope.base == 100.0
    assert type(RotaryEmbedding2D(np.int32(8)).head_dim) is int
    x = torch.randn(3, 2, 8, dtype=torch.float64)
    torch.testing.assert_close(rope(x), RotaryEmbedding(8, base=100.0)(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"RotaryEmbedding: expected positions for the N=3 tokens of x \(3, 2, 8\), "
                                         r"got positions of shape \(4,\)"):
        rope(x, torch.arange(4))
    with pytest.raises(ValueError, match=r"RotaryEmbedding2D: expected positions for the N=3 tokens"):
        RotaryEmbedding2D(8)(x, torch.zeros(2, 2))
    for bad in (np.bool_(True), np.float64(8.0)):
        with pytest.raises(ValueError, match="expected head_dim a positive multiple of 2"):
            RotaryEmbedding(bad)


def test_rotary_arguments_are_checked_by_name():
    """kills: rotary.py ``_check_dim`` without ``head_dim < multiple``, without ``% multiple`` or accepting bools;
    base ``1 < base -> 1 <= base``, the ``< inf`` bound or the bool check dropped; the angles' ``N`` check dropped
    (one angle row broadcast over all positions); positions' rank checks dropped; the head_dim check of ``x``
    dropped; 2-D head_dim ``multiple of 4 -> 2``; 2-D positions of another width"""
    for bad in (0, -2, 3, True, 4.0):
        with pytest.raises(ValueError, match=r"RotaryEmbedding: expected head_dim a positive multiple of 2"):
            RotaryEmbedding(bad)
    with pytest.raises(ValueError, match="RotaryEmbedding2D: expected head_dim a positive multiple of 4"):
        RotaryEmbedding2D(6)
    for bad in (1, 1.0, 0.5, float("inf"), True):
        with pytest.raises(ValueError, match="expected base a finite float > 1"):
            RotaryEmbedding(4, base=bad)
    assert RotaryEmbedding(4, base=1.5).base == 1.5
    x = torch.zeros(3, 1, 4)
    with pytest.raises(ValueError, match=r"apply_rotary: expected angles of shape \(N, C/2\) = \(3, 2\), got \(1, 2\)"):
        apply_rotary(x, torch.zeros(1, 2))
    with pytest.raises(ValueError, match=r"expected positions of shape \(N,\), got \(3, 1\)"):
        RotaryEmbedding(4)(x, torch.zeros(3, 1))
    with pytest.raises(ValueError, match=r"expected x with last dim head_dim=4, got \(3, 1, 6\)"):
        RotaryEmbedding(4)(torch.zeros(3, 1, 6))
    with pytest.raises(ValueError, match=r"RotaryEmbedding2D: expected positions of shape \(N, 2\), got \(3, 3\)"):
        RotaryEmbedding2D(8)(torch.zeros(3, 1, 8), torch.zeros(3, 3))


# ------------------------------------------------------------------------------------- equivalent mutants
# Mutants judged equivalent (same observable behaviour), with the reason:
# - attnscale.py ``dc + (1 + w)(pv - dc)`` -> ``pv + w (pv - dc)``: the same expression, rearranged
#   (the float results differ by rounding only).
# - grand.py ``if self.t == 0.0: return ctx.v`` removed: with ``t = 0`` every step is ``state + 0 * field``,
#   the same values (only the attention calls are saved).
# - edge_features.py ``op.uses_context or not op.is_polynomial`` -> ``not op.is_polynomial``: a layer refuses at
#   construction any operator with a capability flag (``uses_context``) that declares ``is_polynomial=True``, so
#   every operator that uses a context is already not polynomial.
# - rotary.py ``isinstance(head_dim, bool) or`` dropped from ``_check_dim``: ``True`` / ``False`` are 1 / 0, below
#   every multiple (2 or 4), so ``head_dim < multiple`` refuses them with the same message.
# - rotary.py ``isinstance(base, bool) or`` dropped: ``True`` / ``False`` are 1 / 0 and fail ``1 < base`` with the
#   same message.
