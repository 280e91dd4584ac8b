"""Edge-case probes, third pass: the rival operators (attnscale, differential, grand-nl, neutreno, value-residual,
ppr-exact) with polynomial and heat, through the layer and the engine in ``diffusionformer.ops``.

Probed: every rival in a float64 layer against its paper's equations on an explicit softmax (``torch.linalg.solve``,
``matrix_exp``, ``DC`` the uniform average over admissible keys, two half-width maps and an RMSNorm, RK4 on
``[q | k | v]`` with the q/k norm re-applied) under grouped-query heads (``num_kv_heads`` 1, 2, 4), causal calls, key
padding, bool and ``0``/``-inf`` float masks and biased float masks, ``N = 1``; float16 / bfloat16 / autocast
(errors at the dtype's resolution), ``B = 0``, ``N = 0``; cached decoding against the full causal call; deepcopy,
pickle, ``heads_spec`` round trips; learned parameters set to NaN; the public heat helpers.

Found and fixed (each pinned by a "Bug:" test below):

* a per-head attention mask of shape ``(H, N, N)`` (broadcastable to ``(B, H, N, M)``, as documented, and taken by
  the polynomial and the exact heads) was refused for every context operator with a wrong head count
  ("broadcastable to (B, H, N, M) = (2, 2, 5, 5)" for a 4-head layer): ``ops.rivals._slice_heads`` only sliced
  four-dimensional masks;
* the Chebyshev polynomial's monomial weights were formed in the parameter's dtype: under bfloat16 autocast (a
  ``matmul``) or in a half module they were rounded to half precision, though they reach ``2^(K-1)`` and cancel
  (0.11 off at ``K = 8``, and the layer's output 4.7 % off instead of the 2.6 % of the same polynomial written
  in monomials);
* a fixed constant kept in a buffer (``heat-exact``'s ``t``, AttnScale's ``omega``, heat's ``t``, PPR's ``alpha``)
  was rounded by ``.half()`` and stayed rounded after ``.double()``, or after loading a half-precision state dict
  of the same operator: a float64 ``heat-exact(t=0.7)`` then applied ``t = 0.7001953125``;
* differential attention checked its four lambda vectors for NaN but not its RMSNorm gain: a NaN gain made every
  output NaN without a word;
* ``heat_steps_for_tolerance(nan, tol)`` returned ``K = 0``; ``heat_truncation_error`` read a misspelt method
  (``"eulr"``) as Taylor and gave NaN for Euler with ``steps = 0``;
* ``HeatOperator(method="euler", steps=K, tol=tol)`` ignored ``tol``: the documented "an explicit ``steps`` must
  meet it" held for Taylor only (``t = 1, K = 2, tol = 1e-6`` built an operator whose ``truncation_error()`` is 7.4).
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.operators import (AttnScaleOperator, ExactHeatOperator, HeatOperator, PolynomialOperator,
                                       PPROperator, build_operator)
from diffusionformer.operators.heat import heat_steps_for_tolerance, heat_truncation_error
from diffusionformer.operators.polynomial import chebyshev_matrix
from diffusionformer.ops.rivals import LayerState

B, N, D, H = 2, 5, 16, 4
C = D // H


def _qkv(layer: DiffusionAttention, x: torch.Tensor, kv: int = H) -> tuple[torch.Tensor, ...]:
    """The layer's ``q``, ``k``, ``v`` ``(B, H, N, C)`` in float64 from its weights (key/value heads repeated)."""
    z = x.double() @ layer.qkv.weight.double().T + layer.qkv.bias.double()
    q = z[..., :D].view(B, N, H, C).transpose(1, 2)
    k = z[..., D:D + kv * C].view(B, N, kv, C).transpose(1, 2).repeat_interleave(H // kv, 1)
    v = z[..., D + kv * C:].view(B, N, kv, C).transpose(1, 2).repeat_interleave(H // kv, 1)
    return q, k, v


def _softmax(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Explicit float64 softmax of ``q k^T / sqrt(C)`` over the allowed keys (every row here has one)."""
    s = (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).masked_fill(~allowed, -math.inf)
    return torch.softmax(s, -1)


def _project_out(layer: DiffusionAttention, heads: torch.Tensor) -> torch.Tensor:
    return heads.transpose(1, 2).reshape(B, N, D) @ layer.out_proj.weight.double().T + layer.out_proj.bias.double()


# ---------------------------------------------------------------------------------------------- bugs
_HEAD_REFS = {  # f(P, DC) v for the two middle heads; first = attention, last = laplacian
    "attnscale(omega=0.4, learnable=False)": lambda P, U, v: U @ v + 1.4 * (P @ v - U @ v),
    "neutreno(lam=0.6)": lambda P, U, v: P @ v,  # no LayerState: v0 = v, plain attention
    "grand-nl(t=1.0, steps=1)": lambda P, U, v: P @ v,  # one Euler step of length 1
}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("spec", sorted(_HEAD_REFS))
def test_bug_per_head_mask_reaches_context_operators(spec, causal):
    """Bug: a per-head ``attn_mask`` of shape ``(H, N, N)`` was refused for every context operator with "attn_mask
    must be broadcastable to (B, H, N, M) = (2, 2, 5, 5)" (the operator's 2 heads, not the layer's 4), while the
    polynomial and exact heads of the same layer took it. Each head now sees its own mask (float64 reference)."""
    torch.manual_seed(0)
    layer = DiffusionAttention(D, H, f"attention:1,{spec}:2,laplacian:1", causal=causal).double().eval()
    x = torch.randn(B, N, D, dtype=torch.float64)
    g = torch.Generator().manual_seed(3)
    mask = (torch.rand(H, N, N, generator=g) > 0.4) | torch.eye(N, dtype=torch.bool)
    for given in (mask, torch.where(mask, 0.0, -math.inf).double()):  # bool and additive
        y = layer(x, attn_mask=given)
        allowed = mask & (torch.ones(N, N, dtype=torch.bool).tril() if causal else True)
        q, k, v = _qkv(layer, x)
        P = _softmax(q, k, allowed)
        U = allowed.double() / allowed.double().sum(-1, keepdim=True)
        mid = _HEAD_REFS[spec](P[:, 1:3], U[1:3], v[:, 1:3])
        heads = torch.cat([P[:, :1] @ v[:, :1], mid, v[:, 3:] - P[:, 3:] @ v[:, 3:]], 1)
        torch.testing.assert_close(y, _project_out(layer, heads), rtol=0, atol=1e-12)


def test_bug_chebyshev_weights_are_not_rounded_to_half_precision():
    """Bug: ``theta @ M`` ran in the parameter's dtype, so under bfloat16 autocast (``matmul`` is autocast) and in a
    half module the monomial weights of a degree-8 Chebyshev filter were rounded to half precision: 0.11 off,
    and the layer 4.7 % off in bfloat16 where the same polynomial in monomials is 2.6 % off."""
    K = 8
    M = chebyshev_matrix(K)
    op = PolynomialOperator(steps=K, basis="chebyshev", num_heads=2)
    with torch.no_grad():
        op.theta.copy_(torch.randn(2, K + 1, generator=torch.Generator().manual_seed(0)))
    exact = op.theta.detach().double() @ M
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c = op.coefficients()
    assert c.dtype == torch.float32
    torch.testing.assert_close(c.double(), exact, rtol=1e-6, atol=1e-5)
    half = op.half()
    c = half.coefficients()
    assert c.dtype == torch.float32
    torch.testing.assert_close(c.double(), half.theta.detach().double() @ M, rtol=1e-6, atol=1e-5)
    # the layer under autocast equals the same polynomial given in monomials (bit for bit: the same weights)
    torch.manual_seed(1)
    cheb = DiffusionAttention(D, 2, PolynomialOperator(steps=K, basis="chebyshev", num_heads=2)).eval()
    with torch.no_grad():
        cheb.operators[0].theta.copy_(op.theta.float())
    mono = DiffusionAttention(D, 2, PolynomialOperator(steps=K, init=cheb.operators[0].coefficients().detach(),
                                                       num_heads=2)).eval()
    mono.qkv.load_state_dict(cheb.qkv.state_dict())
    mono.out_proj.load_state_dict(cheb.out_proj.state_dict())
    x = torch.randn(B, 6, D, generator=torch.Generator().manual_seed(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(cheb(x), mono(x), rtol=0, atol=0)


def test_bug_fixed_constants_survive_casts_and_half_state_dicts():
    """Bug: ``ExactHeatOperator(t=0.7).half().double()`` applied ``t = 0.7001953125`` in float64 (as did a float64
    operator that loaded a half-precision state dict of the same operator, accepted as equal in half precision);
    AttnScale's fixed ``omega``, heat's ``t`` and PPR's ``alpha`` were rounded the same way. The constants are
    rebuilt from the constructor's value (float64, or float32 in lower precision, like the fixed coefficients)."""
    g = torch.Generator().manual_seed(0)
    P = torch.randn(1, 2, N, N, dtype=torch.float64, generator=g).softmax(-1)
    v = torch.randn(1, 2, N, 3, dtype=torch.float64, generator=g)
    ref = torch.linalg.matrix_exp(-0.7 * (torch.eye(N, dtype=torch.float64) - P)) @ v
    for op in (ExactHeatOperator(t=0.7, num_heads=2).half().double(), ExactHeatOperator(t=0.7).float().double()):
        assert op.t.tolist() in ([0.7, 0.7], [0.7])
        torch.testing.assert_close(op.apply_matrix(P, v), ref, rtol=0, atol=1e-13)
    loaded = ExactHeatOperator(t=0.7).double()
    loaded.load_state_dict(ExactHeatOperator(t=0.7).half().state_dict())
    assert loaded.t.dtype == torch.float64 and loaded.t.tolist() == [0.7]
    assert ExactHeatOperator(t=0.7).half().t.dtype == torch.float32  # never half, like the fixed coefficients
    assert AttnScaleOperator(omega=0.3, learnable=False).half().double().omega.tolist() == [0.3]
    assert HeatOperator(t=0.7, steps=6).half().double().t.item() == 0.7
    assert PPROperator(alpha=0.3, steps=4).half().double().alpha.item() == 0.3
    assert "t=0.7," in repr(HeatOperator(t=0.7, steps=6).half())
    # learned values are the optimiser's: cast as any parameter
    assert AttnScaleOperator(omega=0.3).half().omega.dtype == torch.float16
    # a constant that differs is still refused, in any precision
    with pytest.raises(RuntimeError, match="built with the fixed t=0.7"):
        ExactHeatOperator(t=0.7).load_state_dict(ExactHeatOperator(t=0.8).half().state_dict())


def test_bug_differential_nan_gain_is_named():
    """Bug: differential attention refused a NaN in its lambda vectors but not in its RMSNorm gain: a NaN gain made
    every output of its heads NaN without a word (on CPU, where learned values are checked)."""
    layer = DiffusionAttention(D, H, "differential:2,attention:2").eval()
    with torch.no_grad():
        layer.operators[0].subln.weight[1] = float("nan")
    with pytest.raises(ValueError, match=r"DifferentialOperator\.subln\.weight is not finite"):
        layer(torch.randn(B, N, D))


def test_bug_heat_helpers_check_t_method_and_steps():
    """Bug: ``heat_steps_for_tolerance(nan, 1e-3)`` returned ``K = 0``; ``heat_truncation_error(t, 3, "eulr")``
    silently gave the Taylor bound (0.35 where Euler's is 2.4e3), and Euler with ``steps = 0`` gave NaN."""
    with pytest.raises(ValueError, match="t must be finite, got nan"):
        heat_steps_for_tolerance(float("nan"), 1e-3)
    with pytest.raises(ValueError, match="t must be finite"):
        heat_steps_for_tolerance(float("nan"), 1e-3, "euler")
    with pytest.raises(ValueError, match="did you mean 'euler'"):
        heat_truncation_error(torch.tensor(3.0), 3, "eulr")
    with pytest.raises(ValueError, match="needs steps >= 1, got 0"):
        heat_truncation_error(torch.tensor(0.0), 0, "euler")
    t = torch.tensor(3.0)  # the two bounds, by hand
    assert heat_truncation_error(t, 3, "euler").item() == pytest.approx(2 * 9 * math.exp(6) / 3, rel=1e-12)
    taylor = 1 - sum(math.exp(-3) * 3**k / math.factorial(k) for k in range(4))
    assert heat_truncation_error(t, 3).item() == pytest.approx(taylor, rel=1e-12)


def test_bug_euler_heat_explicit_steps_must_meet_an_explicit_tol():
    """Bug: ``HeatOperator(t=1.0, steps=2, method="euler", tol=1e-6)`` was built (``tol`` ignored) although its
    ``truncation_error()`` is 7.4; the docstring says an explicit ``steps`` must meet ``tol``. Without ``tol`` the
    Euler product keeps its own rule (``steps >= t``)."""
    with pytest.raises(ValueError, match=r"truncation error bound 7\.39 exceeds tol=1e-06; no steps up to 256"):
        HeatOperator(t=1.0, steps=2, method="euler", tol=1e-6)
    with pytest.raises(ValueError, match="steps=25 would do"):
        HeatOperator(t=0.1, steps=4, method="euler", tol=1e-3)
    op = HeatOperator(t=0.1, steps=25, method="euler", tol=1e-3)
    assert op.truncation_error().item() <= 1e-3
    assert HeatOperator(t=1.0, steps=2, method="euler").steps == 2  # no tol: as before
    loose = HeatOperator(t=1.0, steps=2, method="euler", tol=10.0)  # a loose tol travels with the spec
    assert build_operator(loose.spec()).spec() == loose.spec()


# ---------------------------------------------------------------- legal cases, against float64 references
@pytest.mark.parametrize("kv", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_rivals_with_grouped_query_heads_and_padding_match_their_equations(kv, causal):
    """Pins: NeuTRENO (``v0`` from a first layer), AttnScale and differential attention in a float64 layer with
    ``num_kv_heads`` < ``num_heads`` and key padding equal their papers' equations on explicit softmax maps
    (differential: two half-width maps, ``lambda`` from the re-parameterisation, RMSNorm, ``1 - lambda_init``)."""
    torch.manual_seed(0)
    first = DiffusionAttention(D, H, "attention", causal=causal, num_kv_heads=kv).double().eval()
    layer = DiffusionAttention(D, H, "neutreno(lam=0.6):1,attnscale(omega=0.4):1,differential:2", causal=causal,
                               num_kv_heads=kv).double().eval()
    with torch.no_grad():
        layer.operators[1].omega.fill_(0.25)
        layer.operators[2].subln.weight.uniform_(0.5, 1.5)
    x, x0 = torch.randn(B, N, D, dtype=torch.float64), torch.randn(B, N, D, dtype=torch.float64)
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[1, 3:] = True
    state = LayerState()
    first(x0, key_padding_mask=pad, state=state)
    y = layer(x, key_padding_mask=pad, state=state)
    q, k, v = _qkv(layer, x, kv)
    v0 = _qkv(first, x0, kv)[2]
    allowed = ~pad[:, None, None, :] & (torch.ones(N, N, dtype=torch.bool).tril() if causal else True)
    P = _softmax(q, k, allowed)
    U = allowed.double() / allowed.double().sum(-1, keepdim=True)
    h0 = P[:, :1] @ v[:, :1] + 0.6 * (v0[:, :1] - v[:, :1])
    h1 = U @ v[:, 1:2] + 1.25 * (P[:, 1:2] @ v[:, 1:2] - U @ v[:, 1:2])
    op = layer.operators[2]
    half = C // 2
    P1 = _softmax(q[:, 2:, :, :half], k[:, 2:, :, :half], allowed)  # scale 1 / sqrt(C/2): the halves' width
    P2 = _softmax(q[:, 2:, :, half:], k[:, 2:, :, half:], allowed)
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * 1)  # the second layer of the state
    lam = (math.exp((op.lambda_q1.double() * op.lambda_k1.double()).sum().item())
           - math.exp((op.lambda_q2.double() * op.lambda_k2.double()).sum().item()) + lam_init)
    z = (P1 - lam * P2) @ v[:, 2:]
    h2 = (1 - lam_init) * op.subln.weight.double() * z / torch.sqrt((z * z).mean(-1, keepdim=True) + 1e-5)
    ref = _project_out(layer, torch.cat([h0, h1, h2], 1))
    torch.testing.assert_close(y[~pad], ref[~pad], rtol=0, atol=1e-12)
