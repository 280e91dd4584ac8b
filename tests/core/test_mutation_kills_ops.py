"""Tests written in a mutation-testing audit of the operators and ops back-ends.

Each test kills a mutant of the library code that the rest of the suite let through (the
docstring of each test names it) and checks the code against an independent float64
reference (explicit matrices and powers, torch.linalg.matrix_exp, numpy's Chebyshev
conversion, closed-form bounds). CPU only, deterministic (seeded generators).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from diffusionformer.functional import diffuse, diffuse_sparse
from diffusionformer.operators import (
    HeatOperator,
    PolynomialOperator,
    PPROperator,
    heat_coefficients,
    heat_steps_for_tolerance,
)
from diffusionformer.operators.heat import heat_truncation_error


# ---------------------------------------------------------------------------- heat: negative t (sharpening)
def _poisson_tail(a: float, K: int) -> float:
    return 1.0 - sum(math.exp(-a) * a**k / math.factorial(k) for k in range(K + 1))


def _swap_P() -> Tensor:
    """A row-stochastic P with eigenvalue -1: the worst case for a sharpening head's truncation."""
    return torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)


def test_heat_truncation_error_negative_t_is_the_amplified_tail():
    """kills: heat_truncation_error dropping the e^(2|t|) factor for t < 0"""
    for t, K in [(-1.0, 3), (-0.5, 2)]:
        got = float(heat_truncation_error(torch.tensor(t), K))
        assert got == pytest.approx(math.exp(2 * abs(t)) * _poisson_tail(abs(t), K), rel=1e-9)
        # and it really bounds the error of the truncated series against matrix_exp
        P = _swap_P()
        c = heat_coefficients(torch.tensor(t, dtype=torch.float64), K)
        series = sum(c[k] * torch.linalg.matrix_power(P, k) for k in range(K + 1))
        exact = torch.linalg.matrix_exp(-t * (torch.eye(2, dtype=torch.float64) - P))
        err = (series - exact).abs().sum(-1).max().item()
        assert err <= got * (1 + 1e-9)


def test_heat_steps_for_tolerance_negative_t_meets_the_amplified_bound():
    """kills: heat_steps_for_tolerance using e^|t| instead of e^(2|t|) for t < 0"""
    for t, tol in [(-1.0, 1e-3), (-3.0, 1e-6), (-4.0, 1e-3)]:
        K = heat_steps_for_tolerance(t, tol)
        amp = math.exp(2 * abs(t))
        assert amp * _poisson_tail(abs(t), K) <= tol
        assert amp * _poisson_tail(abs(t), K - 1) > tol  # the smallest such K


# ---------------------------------------------------------------------------- ppr, polynomial, base
def _stochastic(B=1, G=2, N=6, seed=0) -> Tensor:
    """A random row-stochastic ``(B, G, N, N)`` float64 matrix."""
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(B, G, N, N, generator=g, dtype=torch.float64), -1)


def test_ppr_truncation_error_is_twice_the_tail():
    """kills: PPROperator.truncation_error losing its factor 2"""
    op = PPROperator(alpha=0.3, steps=4)
    assert float(op.truncation_error()) == pytest.approx(2 * 0.7**4, rel=1e-12)
    op = PPROperator(alpha=0.3, steps=4, learnable=True, num_heads=2)
    assert op.truncation_error().tolist() == pytest.approx([2 * 0.7**4] * 2, rel=1e-6)


def test_polynomial_head_apply_matrix_is_float64_exact():
    """kills: DiffusionOperator.apply_matrix rounding the coefficients through float32"""
    P = _stochastic(G=2, N=6, seed=1)
    v = torch.randn(1, 2, 6, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    op = HeatOperator(t=0.9, tol=1e-15, num_heads=2).double()
    ref = torch.linalg.matrix_exp(-0.9 * (torch.eye(6, dtype=torch.float64) - P)) @ v
    assert torch.allclose(op.apply_matrix(P, v), ref, atol=1e-13, rtol=0)


def test_chebyshev_basis_is_exact_in_a_float64_module():
    """kills: PolynomialOperator._apply rebuilding the Chebyshev basis in float32 for a float64 module"""
    np_cheb = pytest.importorskip("numpy.polynomial.chebyshev")
    K = 40  # T_40 has monomial coefficients near 1e15 that are not float32 numbers
    op = PolynomialOperator(steps=K, init=[0.0] * K + [1.0], basis="chebyshev").double()
    with torch.no_grad():
        op.theta.zero_()
        op.theta[0, K] = 1.0  # f = T_K
    ref = torch.tensor(np_cheb.cheb2poly([0.0] * K + [1.0]), dtype=torch.float64)
    assert torch.allclose(op.coefficients()[0].detach(), ref, rtol=1e-13, atol=0)


def test_one_row_of_coefficients_serves_two_heads():
    """kills: DiffusionOperator.head_coefficients expanding a single row only for G > 2"""
    op = PolynomialOperator(steps=2, init=[0.2, 0.5, 0.3])  # one head's row, (1, K+1)
    assert torch.allclose(op.head_coefficients(2), torch.tensor([[0.2, 0.5, 0.3]] * 2))
    P = _stochastic(G=2, N=5, seed=13)
    v = torch.randn(1, 2, 5, 3, generator=torch.Generator().manual_seed(14), dtype=torch.float64)
    ref = 0.2 * v + 0.5 * P @ v + 0.3 * P @ P @ v
    assert torch.allclose(op.double().apply_matrix(P, v), ref, atol=1e-12)


# ---------------------------------------------------------------------------- engine and dense back-end
def _qkv(B=1, H=2, N=6, C=4, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, N, C, generator=g, dtype=torch.float64).to(dtype) for _ in range(3))


def test_auto_matrix_mixed_degrees_applies_dropout_to_the_k_step_heads():
    """kills: the auto back-end's materialised-P path (heads of K >= 2 beside K = 1 heads) ignoring dropout"""
    q, k, v = _qkv(H=2, N=8, seed=11)
    c = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.1, 0.3, 0.3, 0.3]])
    plain = diffuse(q, k, v, c, degrees=[1, 3])
    torch.manual_seed(0)
    dropped = diffuse(q, k, v, c, degrees=[1, 3], dropout_p=0.5)
    for h in (0, 1):
        assert not torch.allclose(dropped[:, h], plain[:, h]), h


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_static_affine_half_precision_scalar_is_not_rounded_to_the_dtype(dtype):
    """kills: _head_columns taking a column path when only c0 is exact in the dtype (c1 then rounded to it)"""
    c1 = 1.005859375  # 1 + 3/512: not a bfloat16 number (float16 holds it; 1 + 3/4096 below is not one)
    c1 = c1 if dtype == torch.bfloat16 else 1.0 + 3.0 / 4096
    q = torch.zeros(1, 1, 4, 8, dtype=dtype)
    v = torch.full((1, 1, 4, 8), 1.5, dtype=dtype)  # P is uniform and P v = 1.5 exactly
    with torch.no_grad():
        out = diffuse(q, q, v, [0.0, c1])
    want = torch.tensor(1.5 * c1, dtype=torch.float64).to(dtype)  # c1 (P v), rounded once
    assert torch.equal(out, want.expand_as(out)), (out.flatten()[0].item(), want.item())


@pytest.mark.parametrize("backend", ["sdpa", "matrix"])
def test_bfloat16_loop_accumulates_in_float32(backend):
    """kills: _diffuse_dense casting the coefficients to the input dtype (bfloat16 weights and accumulator)
    instead of the float32 working dtype"""
    q = torch.zeros(1, 1, 4, 8, dtype=torch.bfloat16)
    v = torch.full((1, 1, 4, 8), 1.5, dtype=torch.bfloat16)  # uniform P: P^k v = 1.5 exactly
    c = torch.tensor([0.1, 0.2, 0.3])  # out = 1.5 * 0.6 = 0.9, rounded once to bfloat16
    out = diffuse(q, q, v, c, backend=backend)
    want = torch.tensor(0.9, dtype=torch.float64).to(torch.bfloat16)
    assert torch.equal(out, want.expand_as(out)), out.flatten()[0].item()


# ---------------------------------------------------------------------------- sparse back-ends
def _dense_from_edges(q, k, ei, N):
    """Edge softmax as an explicit float64 (H, N, N) matrix, duplicate edges counted with multiplicity."""
    s = torch.einsum("ihc,jhc->hij", q.double(), k.double()) / math.sqrt(q.shape[-1])
    count = torch.zeros(N, N, dtype=torch.float64).index_put_((ei[1], ei[0]), torch.ones(ei.shape[1], dtype=torch.float64),
                                                             accumulate=True)
    w = count * torch.exp(s - s.amax(-1, keepdim=True))
    return w / w.sum(-1, keepdim=True).clamp_min(1e-300)


def test_sparse_duplicate_edges_beyond_n_squared_match_explicit_matrices():
    """kills: sddmm_heads' dense-gather branch (more entries than cells) finding the wrong row of an entry"""
    g = torch.Generator().manual_seed(20)
    N, H = 3, 2
    full = torch.stack(torch.meshgrid(torch.arange(N), torch.arange(N), indexing="ij")).reshape(2, -1)
    ei = torch.cat([full, full[:, [1, 5, 7, 2]]], 1)[:, torch.randperm(13, generator=g)]  # E = 13 > N^2
    q, k, v = (torch.randn(N, H, 4, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3))
    coeffs = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    out = diffuse_sparse(q, k, v, ei, coeffs, backend="csr")
    P = _dense_from_edges(q, k, ei, N)
    vh = v.double().transpose(0, 1)
    ref = (0.2 * vh + 0.5 * P @ vh + 0.3 * P @ P @ vh).transpose(0, 1)
    assert torch.allclose(out, ref, atol=1e-12)
    w = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((out * w).sum(), (q, k, v))
    want = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-10)


# ---------------------------------------------------------------------------- context operators in a layer
def _layer_qkv(layer, x):
    Bx, Nx, _ = x.shape
    q, k, v = layer.qkv(x).view(Bx, Nx, 3, layer.num_heads, layer.head_dim).unbind(2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, N, C)


def test_context_operators_after_other_heads_get_their_own_mask_and_first_layer_values():
    """kills: apply_context_groups slicing a per-head attn_mask, or the first layer's values, from head 0
    instead of the group's first head"""
    from diffusionformer import DiffusionAttention
    from diffusionformer.ops.reference import dense_attention_reference
    from diffusionformer.ops.reference_rivals import attnscale_reference, neutreno_reference
    from diffusionformer.ops.rivals import LayerState

    torch.manual_seed(30)
    B, N, D, H = 2, 6, 16, 4
    x0, x = torch.randn(B, N, D, dtype=torch.float64), torch.randn(B, N, D, dtype=torch.float64)
    first = DiffusionAttention(D, H).double().eval()
    layer = DiffusionAttention(D, H, heads="attention:2,attnscale(omega=0.7):1,neutreno(lam=0.3):1").double().eval()
    with torch.no_grad():
        layer.operators[1].omega.fill_(0.7)
    allowed = torch.rand(B, H, N, N) > 0.3
    allowed |= torch.eye(N, dtype=torch.bool)  # per-head masks; every row keeps a key
    state = LayerState()
    first(x0, state=state)
    got = layer(x, attn_mask=allowed, state=state)
    v0 = _layer_qkv(first, x0)[2]
    q, k, v = _layer_qkv(layer, x)
    a = allowed
    heads = [
        dense_attention_reference(q[:, :2], k[:, :2], allowed=a[:, :2]) @ v[:, :2],
        attnscale_reference(q[:, 2:3], k[:, 2:3], v[:, 2:3], torch.tensor([0.7]), a[:, 2:3]),
        neutreno_reference(q[:, 3:], k[:, 3:], v[:, 3:], v0[:, 3:], 0.3, a[:, 3:]),
    ]
    want = layer.out_proj(torch.cat(heads, 1).transpose(1, 2).reshape(B, N, D))
    assert torch.allclose(got, want, atol=1e-10), (got - want).abs().max()


def test_context_uniform_does_not_switch_off_dropout_for_later_calls():
    """kills: RivalContext.uniform leaving dropout_p at 0 after its zero-score attention call"""
    from diffusionformer.ops.rivals import RivalContext
    from diffusionformer.testing import complete_edge_index

    g = torch.Generator().manual_seed(31)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(1, 2, 6, 6, generator=g) > 0.3  # a general mask: uniform() takes the attention call
    mask |= torch.eye(6, dtype=torch.bool)
    ctxs = [RivalContext.dense(q, k, v, attn_mask=mask, dropout_p=0.5),
            RivalContext.sparse(*(t[0].transpose(0, 1) for t in (q, k, v)), complete_edge_index(6), dropout_p=0.5)]
    for ctx in ctxs:
        DC = mask.double() / mask.sum(-1, keepdim=True) if not ctx.is_sparse else torch.full((6, 6), 1 / 6, dtype=torch.float64)
        assert torch.allclose(ctx.uniform(ctx.v), DC @ ctx.v, atol=1e-12)  # no dropout in DC
        assert ctx.dropout_p == 0.5
        torch.manual_seed(0)
        assert not torch.allclose(ctx.propagate(ctx.v), _P_ctx(ctx) @ ctx.v)  # P v with dropout


def _P_ctx(ctx):
    """The context's P in float64 without dropout (dense: its mask; sparse: the complete graph)."""
    from diffusionformer.ops.dense import attention_matrix
    return attention_matrix(ctx.q, ctx.k, attn_mask=None if ctx.is_sparse else ctx._mask, scale=ctx.scale)


def test_recompute_saved_rebuilds_without_recording_a_graph_under_create_graph():
    """kills: recompute_saved running its recomputation with autograd recording when the backward pass has
    create_graph=True (the docstring promises no_grad: the rebuilt tensor is a constant)"""
    import torch.nn.functional as F

    from diffusionformer.ops.recompute import recompute_saved

    a = torch.randn(3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    seen = []

    def fn():
        seen.append(torch.is_grad_enabled())
        return a.detach() * 2.0

    z = a * 2.0
    with recompute_saved(z, fn):
        y = F.linear(z, w)
    (gw,) = torch.autograd.grad(y.sum(), w, create_graph=True)
    assert seen == [False]
    assert torch.equal(gw, (2.0 * a.detach()).expand(2, 3))
    (ga,) = torch.autograd.grad(gw.square().sum(), a)  # second order: d/da sum (2 a)^2 over 2 rows = 16 a
    assert torch.allclose(ga, 16.0 * a.detach())


def test_grand_nl_after_other_heads_evolves_its_own_raw_queries_and_keys():
    """kills: apply_context_groups taking the raw (pre-q/k-norm) queries and keys of a re-projecting group
    from head 0 instead of the group's first head"""
    from diffusionformer import DiffusionAttention
    from diffusionformer.ops.reference import dense_attention_reference

    torch.manual_seed(32)
    B, N, D, H = 1, 6, 16, 4
    C = D // H
    x = torch.randn(B, N, D, dtype=torch.float64)
    layer = DiffusionAttention(D, H, heads="attention:2,grand-nl(t=1.0, steps=2):2", qk_norm=True).double()
    with torch.no_grad():
        layer.q_norm.weight.uniform_(0.5, 1.5)
        layer.k_norm.bias.uniform_(-0.3, 0.3)
    raw = layer.qkv(x).view(B, N, 3, H, C).transpose(1, 3)  # (B, H, 3, N, C)
    q, k, v = raw[:, :, 0], raw[:, :, 1], raw[:, :, 2]
    att = dense_attention_reference(layer.q_norm(q[:, :2]), layer.k_norm(k[:, :2])) @ v[:, :2]
    X = torch.cat([q[:, 2:], k[:, 2:], v[:, 2:]], dim=-1)  # explicit Euler, tau = 0.5, P from normed q, k
    for _ in range(2):
        P = dense_attention_reference(layer.q_norm(X[..., :C]), layer.k_norm(X[..., C : 2 * C]))
        X = X + 0.5 * (P @ X - X)
    want = layer.out_proj(torch.cat([att, X[..., 2 * C :]], 1).transpose(1, 2).reshape(B, N, D))
    assert torch.allclose(layer(x), want, atol=1e-10)
