"""Tests written in a mutation-testing audit of three operators: the seed paper's attention ``P`` and
Laplacian ``I - P`` heads (``operators/basic.py``), differential attention (``operators/differential.py``)
and exact personalised PageRank (``operators/ppr_exact.py``).

Each test kills a mutant of the library code that the rest of the suite let through (its docstring
names it: file and mutation) and checks the code against an independent reference: coefficients and
schedule values written out by hand, ``f(P) v`` from explicit float64 matrices in numpy, PageRank from
``numpy.linalg.solve`` on ``I - (1 - alpha) P``, and differential attention re-derived from the equations
of the Differential Transformer paper (Ye et al., 2024: two half-width softmax maps, the re-parameterised
``lambda``, a per-head RMSNorm with ``eps = 1e-5`` and the ``1 - lambda_init`` scale) in float64 numpy.
Mutants judged equivalent are listed, with the reason, at the end of the file.
CPU only, deterministic, no network, no files.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators import (AttentionOperator, DifferentialOperator, ExactPPROperator, LaplacianOperator,
                                       build_operator, lambda_init_schedule)
from diffusionformer.ops.rivals import RivalContext


def _stochastic(rng, B, G, N, causal=False):
    """A random row-stochastic ``P`` ``(B, G, N, N)`` (lower triangular when ``causal``), float64 numpy."""
    P = rng.uniform(0.1, 1.0, size=(B, G, N, N))
    if causal:
        P = np.tril(P)
    return P / P.sum(-1, keepdims=True)


def _softmax(s):
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


# ---------------------------------------------------------------------------- basic.py


def test_attention_and_laplacian_coefficients_and_degree():
    """kills: basic.py ``degree`` ``len(_coeffs) - 1`` -> ``len(_coeffs)``, the coefficients ``(0, 1)`` ->
    ``(0, 1, 0)``, ``(1, -1)`` -> ``(-1, 1)`` / ``(1, -0.9)`` and ``static_coefficients`` reversed"""
    att, lap = AttentionOperator(), LaplacianOperator()
    assert att.coefficients().tolist() == [0.0, 1.0] and lap.coefficients().tolist() == [1.0, -1.0]
    assert att.static_coefficients() == (0.0, 1.0) and lap.static_coefficients() == (1.0, -1.0)
    assert att.degree == 1 and lap.degree == 1


def test_attention_and_laplacian_apply_explicit_matrices():
    """kills: basic.py Laplacian coefficients ``(1, -1)`` -> ``(-1, 1)`` / ``(1, -0.9)`` (checked against
    ``P v`` and ``v - P v`` from explicit float64 matrices; ``(I - P) 1 = 0``)"""
    rng = np.random.default_rng(0)
    P = _stochastic(rng, 2, 3, 5)
    v = rng.normal(size=(2, 3, 5, 4))
    Pt, vt = torch.from_numpy(P), torch.from_numpy(v)
    np.testing.assert_allclose(AttentionOperator(num_heads=3).apply_matrix(Pt, vt).numpy(), P @ v, rtol=0, atol=1e-12)
    np.testing.assert_allclose(LaplacianOperator(num_heads=3).apply_matrix(Pt, vt).numpy(), v - P @ v, rtol=0,
                               atol=1e-12)
    shifted = LaplacianOperator(num_heads=3).apply_matrix(Pt, vt + 7.0).numpy()  # a constant shift is ignored
    np.testing.assert_allclose(shifted, v - P @ v, rtol=0, atol=1e-12)


def test_basic_aliases_resolve():
    """kills: basic.py the alias ``"attn"`` and ``"graph-laplacian"`` dropped, the name ``"laplacian"`` changed"""
    assert type(build_operator("attn")) is AttentionOperator
    assert type(build_operator("softmax")) is AttentionOperator
    assert type(build_operator("laplacian")) is LaplacianOperator
    assert type(build_operator("graph-laplacian")) is LaplacianOperator
    assert type(build_operator("I-P")) is LaplacianOperator


def test_basic_coefficient_buffer_not_in_state_dict():
    """kills: basic.py the coefficient buffer ``persistent=False`` -> ``True`` (a checkpoint would carry, and
    then demand, a key ``_c`` that older checkpoints lack)"""
    assert dict(AttentionOperator().state_dict()) == {}
    assert dict(LaplacianOperator().state_dict()) == {}
    LaplacianOperator().load_state_dict({})  # strict: no missing key


def test_basic_num_heads_kept():
    """kills: basic.py ``super().__init__(num_heads)`` -> ``super().__init__(1)``"""
    op = LaplacianOperator(num_heads=3)
    assert op.num_heads == 3
    assert op.head_coefficients().tolist() == [[1.0, -1.0]] * 3


# ---------------------------------------------------------------------------- differential.py


def test_lambda_init_schedule_hand_values():
    """kills: differential.py ``lambda_init_schedule`` ``exp(-0.3 * depth)`` -> ``exp(-0.3 * (depth + 1))`` and
    ``-0.3`` -> ``-0.2`` (values of ``0.8 - 0.6 exp(-0.3 l)`` worked out by hand)"""
    expected = {0: 0.2, 1: 0.355509068, 2: 0.470713018, 5: 0.666121904, 11: 0.777870100}
    for depth, value in expected.items():
        assert lambda_init_schedule(depth) == pytest.approx(value, abs=1e-8)


def test_lambda_init_schedule_refuses_bad_depths():
    """kills: differential.py ``depth < 0`` -> ``depth < -1`` / ``depth <= 0``, the bool check dropped, and the
    constructor's ``lambda_init_schedule(depth)`` validation removed"""
    assert lambda_init_schedule(0) == pytest.approx(0.2)
    for bad in (-1, True, False, 1.5, "2", None):
        with pytest.raises(ValueError, match="non-negative int"):
            lambda_init_schedule(bad)
    with pytest.raises(ValueError, match="non-negative int"):
        DifferentialOperator(depth=-1)
    with pytest.raises(ValueError, match="non-negative int"):
        DifferentialOperator(depth=True)
    assert DifferentialOperator(depth=0).depth == 0


def test_bind_validates_head_width():
    """kills: differential.py ``bind`` ``head_dim < 2`` -> ``< 1``, the ``% 2`` check dropped, the bool check
    dropped, and the rebind-with-another-width check disabled"""
    for bad in (1, 3, 7, 0, True, 4.0):
        with pytest.raises(ValueError, match="even int >= 2"):
            DifferentialOperator(head_dim=bad)
    op = DifferentialOperator(head_dim=2)
    assert op.head_dim == 2
    before = op.lambda_q1.detach().clone()
    op.bind(head_dim=2)  # the same width: a no-op that keeps the learned vectors
    assert torch.equal(op.lambda_q1.detach(), before)
    with pytest.raises(ValueError, match="built for head_dim=2"):
        op.bind(head_dim=4)
    assert op.head_dim == 2 and op.lambda_q1.shape == (1,)


def test_parameters_shapes_and_count():
    """kills: differential.py ``half = head_dim // 2`` -> ``head_dim`` and the RMSNorm ``elementwise_affine``
    ``True`` -> ``False`` (the paper: four vectors of width ``C/2`` and a gain of width ``C``, ``3C`` in all)"""
    op = DifferentialOperator(head_dim=8)
    shapes = {n: tuple(p.shape) for n, p in op.named_parameters()}
    assert shapes == {"lambda_q1": (4,), "lambda_k1": (4,), "lambda_q2": (4,), "lambda_k2": (4,), "subln.weight": (8,)}
    assert sum(p.numel() for p in op.parameters()) == 24
    assert torch.equal(op.subln.weight.detach(), torch.ones(8))


def test_lambda_vectors_initialised_normal_0_01():
    """kills: differential.py the re-parameterisation init ``normal_(0, 0.1)`` -> ``std=1.0`` and -> ``mean=0.1``"""
    torch.manual_seed(0)
    op = DifferentialOperator(head_dim=2 * 20000)
    for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
        x = getattr(op, name).detach().double()
        assert abs(x.mean().item()) < 0.005, name
        assert 0.095 < x.std().item() < 0.105, name


def _set_lambdas(op, rng):
    """Distinct random re-parameterisation vectors and RMSNorm gain; returns them as numpy arrays."""
    vals = {}
    with torch.no_grad():
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            a = rng.normal(0.0, 0.4, size=getattr(op, name).shape)
            getattr(op, name).copy_(torch.from_numpy(a))
            vals[name] = a
        g = rng.uniform(0.5, 1.5, size=op.subln.weight.shape)
        op.subln.weight.copy_(torch.from_numpy(g))
        vals["gain"] = g
    return vals


def _diff_reference(q, k, v, vals, lam_init, allowed=None):
    """Differential attention from the paper's equations, float64 numpy: ``q``/``k``/``v`` ``(B, G, N, C)``."""
    C = q.shape[-1]
    h = C // 2
    maps = []
    for sl in (slice(0, h), slice(h, C)):
        s = q[..., sl] @ np.swapaxes(k[..., sl], -1, -2) / math.sqrt(h)
        if allowed is not None:
            s = np.where(allowed, s, -np.inf)
        maps.append(_softmax(s))
    lam = (math.exp(float(vals["lambda_q1"] @ vals["lambda_k1"])) - math.exp(float(vals["lambda_q2"] @ vals["lambda_k2"]))
           + lam_init)
    y = maps[0] @ v - lam * (maps[1] @ v)
    rms = np.sqrt((y**2).mean(-1, keepdims=True) + 1e-5)
    return y / rms * vals["gain"] * (1.0 - lam_init), lam


def _qkv(rng, B=2, G=2, N=5, C=8, v_scale=1.0):
    q, k = rng.normal(size=(B, G, N, C)), rng.normal(size=(B, G, N, C))
    v = rng.normal(size=(B, G, N, C)) * v_scale
    return q, k, v


@pytest.mark.parametrize("v_scale", [1.0, 1e-3])
def test_differential_matches_paper_equations(v_scale):
    """kills: differential.py ``scale = half**-0.5`` -> ``C**-0.5``, the halves of ``q`` swapped, ``k2`` taken from
    the first half, the halves interleaved (``::2``), ``lambda`` dropped from the second map, ``l1`` from
    ``lambda_q1 * lambda_q1``, ``l2`` from ``lambda_q2 * lambda_k1``, ``l2 - l1``, ``lambda_init`` dropped from
    ``lambda``, the RMSNorm removed / swapped for a LayerNorm / ``eps`` 1e-5 -> 1e-2 (the small ``v_scale`` makes
    ``eps`` matter), and the ``1 - lambda_init`` scale removed or taken at depth 0"""
    rng = np.random.default_rng(1)
    op = DifferentialOperator(head_dim=8).double()
    vals = _set_lambdas(op, rng)
    q, k, v = _qkv(rng, v_scale=v_scale)
    depth = 3
    ctx = RivalContext.dense(*(torch.from_numpy(a) for a in (q, k, v)), depth=depth)
    out = op.apply_context(ctx)
    ref, _ = _diff_reference(q, k, v, vals, 0.8 - 0.6 * math.exp(-0.9))
    assert out.dtype == torch.float64
    np.testing.assert_allclose(out.detach().numpy(), ref, rtol=1e-9, atol=1e-11)


def test_differential_matches_paper_equations_under_a_mask():
    """kills: as above, with a key-padding mask (the masked keys leave both maps)"""
    rng = np.random.default_rng(2)
    op = DifferentialOperator(head_dim=6, lambda_init=0.35).double()
    vals = _set_lambdas(op, rng)
    q, k, v = _qkv(rng, B=1, G=3, N=6, C=6)
    allowed = np.ones((1, 1, 6, 6), dtype=bool)
    allowed[..., 4:] = False
    ctx = RivalContext.dense(*(torch.from_numpy(a) for a in (q, k, v)), attn_mask=torch.from_numpy(allowed), depth=9)
    ref, _ = _diff_reference(q, k, v, vals, 0.35, allowed=allowed)
    np.testing.assert_allclose(op.apply_context(ctx).detach().numpy(), ref, rtol=1e-9, atol=1e-11)


def test_lambda_full_and_init_value_precedence():
    """kills: differential.py ``lambda_full`` ``init_value(depth)`` -> ``init_value(0)``, ``l1 - l2`` ->
    ``l2 - l1``, ``lambda_init`` dropped; ``init_value`` ignoring the fixed ``lambda_init``, ignoring the
    operator's own ``depth`` (``schedule(depth)``) and ignoring the argument (``... else 0``)"""
    rng = np.random.default_rng(3)
    op = DifferentialOperator(head_dim=4).double()
    vals = _set_lambdas(op, rng)
    l1 = math.exp(float(vals["lambda_q1"] @ vals["lambda_k1"]))
    l2 = math.exp(float(vals["lambda_q2"] @ vals["lambda_k2"]))
    assert op.lambda_full(4).item() == pytest.approx(l1 - l2 + 0.8 - 0.6 * math.exp(-1.2), abs=1e-12)
    assert op.init_value(4) == pytest.approx(0.8 - 0.6 * math.exp(-1.2), abs=1e-12)
    assert DifferentialOperator(depth=2).init_value(9) == pytest.approx(0.470713018, abs=1e-8)
    assert DifferentialOperator(depth=2, lambda_init=0.5).init_value(9) == 0.5
    assert DifferentialOperator(lambda_init=0.25).init_value(0) == 0.25


def test_operator_depth_overrides_the_layer_depth_in_forward():
    """kills: differential.py ``init_value`` ``schedule(self.depth if ... else depth)`` -> ``schedule(depth)``
    (the operator's fixed ``depth=5`` must win over the layer's depth 1 in ``lambda`` and in the output scale)"""
    rng = np.random.default_rng(4)
    op = DifferentialOperator(depth=5, head_dim=8).double()
    vals = _set_lambdas(op, rng)
    q, k, v = _qkv(rng)
    ctx = RivalContext.dense(*(torch.from_numpy(a) for a in (q, k, v)), depth=1)
    ref, _ = _diff_reference(q, k, v, vals, 0.8 - 0.6 * math.exp(-1.5))
    np.testing.assert_allclose(op.apply_context(ctx).detach().numpy(), ref, rtol=1e-9, atol=1e-11)


def test_differential_spec_kwargs():
    """kills: differential.py ``spec_kwargs`` dropping ``depth`` or ``lambda_init`` (a rebuilt operator would
    use another ``lambda_init``)"""
    assert DifferentialOperator(depth=2, lambda_init=0.3).spec_kwargs() == {"depth": 2, "lambda_init": 0.3}
    assert DifferentialOperator(depth=4).spec_kwargs() == {"depth": 4}
    assert DifferentialOperator(lambda_init=0.6).spec_kwargs() == {"lambda_init": 0.6}
    assert DifferentialOperator().spec_kwargs() == {}


def test_differential_lambda_init_is_checked():
    """kills: differential.py ``self.lambda_init = check_finite_float(...)`` -> the raw argument"""
    with pytest.raises(ValueError, match="lambda_init must be finite"):
        DifferentialOperator(lambda_init=float("nan"))
    with pytest.raises(TypeError, match="lambda_init must be a float"):
        DifferentialOperator(lambda_init="0.3")
    op = DifferentialOperator(lambda_init=0)
    assert type(op.lambda_init) is float and op.lambda_init == 0.0
    with pytest.raises(ValueError, match=r"lambda_init=1 scales the head's output by 1 - lambda_init = 0"):
        DifferentialOperator(lambda_init=1)  # a dead head (the edge probes' third rivals round)


def test_nonfinite_lambda_vector_raises():
    """kills: differential.py the ``check_finite_parameter`` loop over the four vectors removed"""
    op = DifferentialOperator(head_dim=4)
    with torch.no_grad():
        op.lambda_k2[1] = float("inf")
    with pytest.raises(ValueError, match="lambda_k2 is not finite"):
        op.lambda_full()


def test_unbound_and_width_mismatch_raise():
    """kills: differential.py the ``C != self.head_dim`` check in ``apply_context`` disabled (a RuntimeError
    from the norm instead of the ValueError naming both widths)"""
    rng = np.random.default_rng(5)
    q, k, v = (torch.from_numpy(a) for a in _qkv(rng, C=6))
    with pytest.raises(ValueError, match="bound to head_dim=8, got heads of width 6"):
        DifferentialOperator(head_dim=8).double().apply_context(RivalContext.dense(q, k, v))
    with pytest.raises(ValueError, match="not bound to a head width"):
        DifferentialOperator().apply_context(RivalContext.dense(q, k, v))


def test_differential_half_inputs_norm_in_float32_without_warning():
    """kills: differential.py the RMSNorm's working dtype ``float32`` (for half inputs) -> the input's dtype
    (a float32 operator then mixes dtypes in ``rms_norm`` and warns on every call)"""
    rng = np.random.default_rng(6)
    op = DifferentialOperator(head_dim=8, lambda_init=0.4)
    vals = _set_lambdas(op, rng)
    vals = {n: a.astype(np.float32).astype(np.float64) for n, a in vals.items()}
    q, k, v = _qkv(rng, B=1, G=1, N=4, C=8)
    half = [torch.from_numpy(a).half() for a in (q, k, v)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = op.apply_context(RivalContext.dense(*half))
    assert out.dtype == torch.float16
    ref, _ = _diff_reference(*(t.double().numpy() for t in half), vals, 0.4)
    np.testing.assert_allclose(out.double().detach().numpy(), ref, rtol=0, atol=2e-2)



def test_bug_differential_in_half_precision_does_not_warn_and_trains_its_gain():
    """Bug: a ``DifferentialOperator`` cast to half precision (``.half()``, as ``model.half()`` does) gave
    ``rms_norm`` float32 input beside a float16 gain, and PyTorch warned "Mismatch dtype between input and
    weight" on every call. The gain now joins the input in float32; the output matches the paper's equations
    and the gain still gets its gradient."""
    rng = np.random.default_rng(8)
    op = DifferentialOperator(head_dim=8, lambda_init=0.3)
    vals = _set_lambdas(op, rng)
    op = op.half()
    with torch.no_grad():  # the reference uses the parameters as float16 holds them
        vals = {n: (op.subln.weight if n == "gain" else getattr(op, n)).double().numpy() for n in vals}
    q, k, v = _qkv(rng, B=1, G=1, N=4, C=8)
    half = [torch.from_numpy(a).half() for a in (q, k, v)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = op.apply_context(RivalContext.dense(*half))
        out.float().sum().backward()
    assert out.dtype == torch.float16
    assert op.subln.weight.grad is not None and op.subln.weight.grad.dtype == torch.float16
    assert torch.count_nonzero(op.subln.weight.grad) > 0
    ref, _ = _diff_reference(*(t.double().numpy() for t in half), vals, 0.3)
    np.testing.assert_allclose(out.double().detach().numpy(), ref, rtol=0, atol=2e-2)


# ---------------------------------------------------------------------------- ppr_exact.py


def _ppr_reference(P, v, alpha):
    N = P.shape[-1]
    return alpha * np.linalg.solve(np.eye(N) - (1.0 - alpha) * P, v)


def test_ppr_alpha_validation():
    """kills: ppr_exact.py ``0 < alpha <= 1`` -> ``0 <= alpha`` / ``alpha < 1``, the bool check dropped, and
    the TypeError for a non-number -> ValueError"""
    for bad in (0.0, -0.1, 1.0000001, 2):
        with pytest.raises(ValueError, match=r"alpha must lie in \(0, 1\]"):
            ExactPPROperator(alpha=bad)
    for bad in (True, "0.1", None):
        with pytest.raises(TypeError, match="alpha must be a float"):
            ExactPPROperator(alpha=bad)
    assert ExactPPROperator(alpha=1.0).alpha == 1.0
    assert ExactPPROperator(alpha=1).alpha == 1.0
    assert ExactPPROperator(alpha=1e-9).alpha == 1e-9


def test_bug_numpy_scalars_are_numbers_to_the_operators():
    """Bug: a hyper-parameter taken from a numpy sweep was refused with a message that contradicts itself:
    ``ExactPPROperator(alpha=np.float32(0.1))`` raised "alpha must be a float, got float32", as did ``ppr``,
    ``attnscale``'s ``omega`` and ``heat``'s ``t``, and ``lambda_init_schedule(np.int64(3))`` said "depth must
    be a non-negative int". numpy reals and ints are now taken (one ``check_real`` for every operator); bools,
    strings, complex numbers and tensors are still a TypeError."""
    a32 = float(np.float32(0.1))
    assert ExactPPROperator(alpha=np.float32(0.1)).alpha == a32
    assert ExactPPROperator(alpha=np.float64(0.25)).alpha == 0.25
    assert float(build_operator("ppr", alpha=np.float32(0.5), steps=4).alpha) == 0.5
    assert build_operator("attnscale", omega=np.float32(0.5))._omega0 == 0.5
    heat = build_operator("heat", t=np.float32(2.0), steps=8)
    assert heat.spec_kwargs()["t"] == 2.0
    assert lambda_init_schedule(np.int64(3)) == lambda_init_schedule(3) == pytest.approx(0.8 - 0.6 * math.exp(-0.9))
    for bad in (np.bool_(True), 1 + 0j, torch.tensor(0.1), "0.1"):
        with pytest.raises(TypeError, match="alpha must be a float"):
            ExactPPROperator(alpha=bad)
    with pytest.raises(ValueError, match="depth must be a non-negative int"):
        lambda_init_schedule(np.float64(3.0))



def test_bug_numpy_tolerances_are_numbers_too():
    """Bug: ``heat`` and ``ppr`` took ``alpha`` / ``t`` from a numpy sweep but refused the same sweep's ``tol``
    with "tol must be a positive float (or None), got np.float32(0.001)". A numpy real is a tolerance now (one
    check for both operators); a bool, a string, zero or a negative value is still refused."""
    ppr = build_operator("ppr", alpha=0.5, steps=None, tol=np.float32(1e-3))
    assert ppr.steps == build_operator("ppr", alpha=0.5, steps=None, tol=float(np.float32(1e-3))).steps
    assert ppr.steps == math.ceil(math.log(float(np.float32(1e-3)) / 2) / math.log(0.5))  # 2 (1 - alpha)^K <= tol
    heat = build_operator("heat", t=1.0, steps=None, tol=np.float64(1e-3))
    assert heat.steps == build_operator("heat", t=1.0, steps=None, tol=1e-3).steps
    with pytest.raises(ValueError, match=r"truncation error .* exceeds tol=0\.001"):
        build_operator("ppr", alpha=0.5, steps=2, tol=np.float32(1e-3))
    for bad in (np.bool_(True), np.float64(0.0), np.int64(-1), "1e-3"):
        with pytest.raises(ValueError, match="tol must be a positive float"):
            build_operator("ppr", alpha=0.5, steps=4, tol=bad)
        with pytest.raises(ValueError, match="tol must be a positive float"):
            build_operator("heat", t=1.0, steps=4, tol=bad)



def test_bug_ppr_exact_solves_in_the_wider_dtype():
    """Bug: ppr_exact.py solved in ``P``'s precision, so a float32 ``P`` with a float64 ``v`` (a user calling
    ``apply_matrix`` directly) gave a float64 result with float32 accuracy. The solve now runs in the wider of
    the two dtypes (at least float32): the result matches the float64 reference on the float32 ``P``."""
    rng = np.random.default_rng(11)
    s = rng.normal(size=(1, 1, 6, 6)) * 3
    P64 = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
    P32 = torch.from_numpy(P64).float()
    v = rng.normal(size=(1, 1, 6, 3))
    op = ExactPPROperator(alpha=0.05)
    for causal in (False, True):
        P = torch.tril(P32) if causal else P32
        want = _ppr_reference(P.double().numpy(), v, 0.05)
        got = (op.apply_causal_matrix if causal else op.apply_matrix)(P, torch.from_numpy(v))
        assert got.dtype == torch.float64
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


def test_ppr_default_alpha_and_spec_kwargs():
    """kills: ppr_exact.py the default ``alpha=0.1`` -> ``0.2`` and ``spec_kwargs`` -> ``{}``"""
    op = ExactPPROperator()
    assert op.alpha == 0.1 and op.spec_kwargs() == {"alpha": 0.1}
    assert ExactPPROperator(alpha=0.3).spec_kwargs() == {"alpha": 0.3}
    rebuilt = build_operator("ppr-exact", **ExactPPROperator(alpha=0.3).spec_kwargs())
    assert rebuilt.alpha == 0.3


def test_ppr_dropout_bound_is_p_below_alpha():
    """kills: ppr_exact.py ``check_attention_dropout`` ``p >= alpha`` -> ``p > alpha`` / ``p >= alpha + 0.05`` /
    the check removed (a causal ``P`` with ``p = alpha`` makes ``I - (1-alpha) P`` singular)"""
    op = ExactPPROperator(alpha=0.2)
    op.check_attention_dropout(0.0)
    op.check_attention_dropout(0.19)
    for p in (0.2, 0.21, 0.5):
        with pytest.raises(ValueError, match="only guaranteed invertible for dropout < alpha"):
            op.check_attention_dropout(p)
    with pytest.raises(ValueError, match="attention dropout"):
        DiffusionAttention(8, 2, "ppr-exact(alpha=0.2)", dropout=0.2)
    DiffusionAttention(8, 2, "ppr-exact(alpha=0.2)", dropout=0.1)
    # the singular case the bound guards against: first row [1, 0, ...] scaled by 1/(1-p), p = alpha
    P = np.tril(np.ones((3, 3)))
    P /= P.sum(-1, keepdims=True)
    dropped = P / (1 - 0.2)
    assert abs(np.linalg.det(np.eye(3) - (1 - 0.2) * dropped)) < 1e-12


@pytest.mark.parametrize("alpha", [0.1, 0.35, 1.0])
def test_ppr_apply_matrix_matches_numpy_solve(alpha):
    """kills: ppr_exact.py ``-(1 - alpha)`` -> ``-(1 + alpha)`` / ``-alpha``, the ``alpha *`` factor dropped,
    ``apply_matrix`` solving as lower triangular, and the identity scaled by ``1 + 1e-3``"""
    rng = np.random.default_rng(7)
    P = _stochastic(rng, 2, 3, 6)
    v = rng.normal(size=(2, 3, 6, 4))
    out = ExactPPROperator(alpha=alpha, num_heads=3).apply_matrix(torch.from_numpy(P), torch.from_numpy(v))
    assert out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), _ppr_reference(P, v, alpha), rtol=1e-10, atol=1e-12)
    # PageRank keeps constants: alpha (I - (1-alpha) P)^{-1} 1 = 1
    ones = ExactPPROperator(alpha=alpha).apply_matrix(torch.from_numpy(P), torch.ones(2, 3, 6, 1, dtype=torch.float64))
    np.testing.assert_allclose(ones.numpy(), 1.0, rtol=0, atol=1e-12)


def test_ppr_default_alpha_result():
    """kills: ppr_exact.py the default ``alpha=0.1`` -> ``0.2`` (seen in the output)"""
    rng = np.random.default_rng(8)
    P = _stochastic(rng, 1, 1, 5)
    v = rng.normal(size=(1, 1, 5, 2))
    out = ExactPPROperator().apply_matrix(torch.from_numpy(P), torch.from_numpy(v))
    np.testing.assert_allclose(out.numpy(), _ppr_reference(P, v, 0.1), rtol=1e-10, atol=1e-12)


def test_ppr_causal_reads_only_the_lower_triangle():
    """kills: ppr_exact.py ``apply_causal_matrix`` -> the full LU solve (``lower_triangular=False`` or
    ``solve_triangular`` -> ``solve``), and the triangular system's diagonal replaced by 1 (checked against a
    numpy solve on the lower triangle; the strictly upper part gets no gradient)"""
    rng = np.random.default_rng(9)
    P = _stochastic(rng, 2, 2, 6, causal=True)
    noise = np.triu(rng.uniform(0.2, 0.9, size=P.shape), 1)  # what the causal solve must not read
    v = rng.normal(size=(2, 2, 6, 3))
    Pt = torch.from_numpy(P + noise).requires_grad_(True)
    out = ExactPPROperator(alpha=0.3).apply_causal_matrix(Pt, torch.from_numpy(v))
    np.testing.assert_allclose(out.detach().numpy(), _ppr_reference(P, v, 0.3), rtol=1e-10, atol=1e-12)
    out.sum().backward()
    upper = np.triu(np.ones((6, 6), dtype=bool), 1)
    assert np.all(Pt.grad.numpy()[..., upper] == 0.0)
    assert np.all(Pt.grad.numpy()[..., ~upper] != 0.0)


def test_ppr_output_dtype_and_low_precision_inputs():
    """kills: ppr_exact.py the result cast to ``P.dtype`` instead of ``v.dtype``, and the working dtype ``float32``
    (for low-precision inputs) -> the input's dtype (no CPU LU / triangular solve in bfloat16)"""
    rng = np.random.default_rng(10)
    P = _stochastic(rng, 1, 2, 5)
    v = rng.normal(size=(1, 2, 5, 3))
    ref = _ppr_reference(P, v, 0.25)
    op = ExactPPROperator(alpha=0.25)
    out = op.apply_matrix(torch.from_numpy(P), torch.from_numpy(v).float())
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-5)
    for dt in (torch.bfloat16, torch.float16):
        out = op.apply_matrix(torch.from_numpy(P).to(dt), torch.from_numpy(v).to(dt))
        assert out.dtype == dt
        np.testing.assert_allclose(out.double().numpy(), ref, rtol=0, atol=5e-2)
        Pc = _stochastic(rng, 1, 2, 5, causal=True)
        outc = op.apply_causal_matrix(torch.from_numpy(Pc).to(dt), torch.from_numpy(v).to(dt))
        assert outc.dtype == dt


def test_ppr_refuses_the_sparse_backend():
    """kills: ppr_exact.py ``supports_sparse = False`` -> ``True`` (the sparse back-end has no ``P`` to solve with)"""
    layer = DiffusionAttention(8, 2, "ppr-exact")
    edge_index = torch.tensor([[0, 1, 2, 1], [1, 2, 0, 0]])
    with pytest.raises(ValueError, match="'ppr-exact' does not support the sparse back-end"):
        layer(torch.randn(3, 8), edge_index=edge_index)


# ---------------------------------------------------------------------------- equivalent mutants
# 69 mutants were applied (10 in basic.py, 39 in differential.py, 20 in ppr_exact.py); all but the two
# below are killed by the suite with this file. The two survivors are equivalent, because no int tells them
# from the code:
# - differential.py ``bind`` ``head_dim < 2`` -> ``head_dim < 1``: the only int the two bounds treat
#   differently is 1, which the ``head_dim % 2`` test refuses with the same ValueError.
# - differential.py ``bind`` the ``isinstance(head_dim, bool)`` test dropped: ``True`` and ``False`` are the
#   ints 1 and 0, both below 2, so the range test refuses them with the same ValueError.
