"""Edge-case probes, fourth pass: the rival anti-oversmoothing operators (differential, attnscale, neutreno,
grand-nl, ppr-exact) and the polynomial family (monomial and Chebyshev bases, attention, Laplacian).

Probed, each against a float64 formula written here from the paper (not ``ops.reference_rivals``): two half-width
softmax maps, ``lambda = exp(lq1.lk1) - exp(lq2.lk2) + lambda_init`` with ``lambda_init = 0.8 - 0.6 exp(-0.3 l)``,
a per-head RMSNorm and the ``1 - lambda_init`` scale (Ye et al. 2024); ``DC + (1 + omega)(P - DC)`` with ``DC``
the uniform average over admissible keys (Wang et al. 2022); ``P v + lambda (v0 - v)`` with the first layer's
values (Nguyen et al. 2023); RK4 on ``[q | k | v]`` re-attending at every stage (GRAND-nl); ``alpha (I - (1 - alpha)
P)^-1 v`` (an explicit inverse); ``sum theta_k T_k(P) v`` against ``cos(k arccos x)`` and the monomial form. Under
causal calls, key padding (a changed padded token must not move a valid one), left padding with empty causal rows,
grouped-query heads (``num_kv_heads`` 4, 2, 1), bfloat16 / float16 autocast and half modules on CPU, gradients
against finite differences (``gradcheck``, float64), state-dict round trips, NaN parameters, ``alpha -> 0``.

Found and fixed (each pinned by a "Bug:" test below):

* ``ppr-exact`` formed the diagonal of ``I - (1 - alpha) P`` as ``1 - (1 - alpha) P_ii``: in float32 ``1 - alpha``
  rounds to 1 for ``alpha < 6e-8``, so row 0 of a causal call (``P_00 = 1``) had the pivot 0 and the layer returned
  inf / NaN; for ``alpha = 1e-6`` the cancellation left the causal output 1 % off. It is now formed as
  ``alpha + (1 - alpha)(1 - P_ii)`` (the same matrix, without the cancellation);
* ``PolynomialOperator(init=<operator>, num_heads=G)`` read the operator's ``coefficients()`` as they are: a one-head
  learnable heat or PPR (or another polynomial) returns a ``(1, K+1)`` row, refused for ``G > 1`` ("init
  coefficients must have shape (K+1,) or (2, K+1), got (1, 5)"), so ``"polynomial(init='heat(t=1.0,
  learnable=True)'):2"`` could not be built;
* differential attention with a 1-D rotary embedding and ``head_dim = 2 (mod 4)``: RoPE rotates channel pairs
  ``(2i, 2i+1)`` and the two maps split each head in halves, so one pair straddled the split and the scores no
  longer depended on ``n - m`` alone (shifting every position moved the output by 0.09); now refused at
  construction;
* a Chebyshev polynomial of ``steps >= 810`` (``MAX_DEGREE`` is 1024) overflowed the float64 basis matrix and was
  built with a NaN ``theta``, reported at the first call as a diverged parameter; ``chebyshev_matrix`` refused a
  numpy int (``np.int64(3)``: "steps must be a non-negative int").
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.func import functional_call

from diffusionformer import DiffusionAttention
from diffusionformer.nn.rotary import RotaryEmbedding
from diffusionformer.operators import (ExactPPROperator, HeatOperator, PolynomialOperator, PPROperator,
                                       build_operator)
from diffusionformer.operators.polynomial import chebyshev_matrix
from diffusionformer.ops.rivals import LayerState

B, N, D, H = 2, 6, 16, 4
C = D // H
F64 = torch.float64


# ---------------------------------------------------------------------------------------------- helpers
def _qkv(layer: DiffusionAttention, x: torch.Tensor, kv: int) -> tuple[torch.Tensor, ...]:
    """``q``, ``k``, ``v`` ``(B, H, N, C)`` in float64 from the layer's weights (key/value heads repeated)."""
    z = x.double() @ layer.qkv.weight.double().T + layer.qkv.bias.double()
    q = z[..., :D].view(B, N, H, C).transpose(1, 2)
    k = z[..., D:D + kv * C].view(B, N, kv, C).transpose(1, 2).repeat_interleave(H // kv, 1)
    v = z[..., D + kv * C:].view(B, N, kv, C).transpose(1, 2).repeat_interleave(H // kv, 1)
    return q, k, v


def _softmax(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor, scale: float) -> torch.Tensor:
    """Explicit softmax of ``q k^T scale`` over the allowed keys; a row without one is zero."""
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~allowed, -math.inf)
    return torch.nan_to_num(torch.softmax(s, -1), nan=0.0)


def _heads_ref(spec: str, op, q, k, v, allowed, depth: int = 0, v0=None) -> torch.Tensor:  # noqa: ANN001
    """The head outputs of one operator ``(B, H, N, C)`` from the papers' equations, float64."""
    P = _softmax(q, k, allowed, C**-0.5)
    if spec.startswith("attnscale"):
        A = allowed.double().expand_as(P)
        U = A / A.sum(-1, keepdim=True).clamp_min(1.0)  # DC: uniform over the admissible keys
        w = op.omega.detach().double().view(1, -1, 1, 1)
        return U @ v + (1.0 + w) * (P @ v - U @ v)
    if spec.startswith("differential"):
        h = C // 2
        P1 = _softmax(q[..., :h], k[..., :h], allowed, h**-0.5)
        P2 = _softmax(q[..., h:], k[..., h:], allowed, h**-0.5)
        li = 0.8 - 0.6 * math.exp(-0.3 * depth)
        dot = [float(a.detach().double() @ b.detach().double())
               for a, b in ((op.lambda_q1, op.lambda_k1), (op.lambda_q2, op.lambda_k2))]
        lam = math.exp(dot[0]) - math.exp(dot[1]) + li
        y = P1 @ v - lam * (P2 @ v)
        y = y / torch.sqrt((y * y).mean(-1, keepdim=True) + 1e-5) * op.subln.weight.detach().double()
        return (1.0 - li) * y
    if spec.startswith("ppr-exact"):
        a = op.alpha
        return a * torch.linalg.inv(torch.eye(N, dtype=F64) - (1.0 - a) * P) @ v
    if spec.startswith("neutreno"):
        return P @ v if v0 is None else P @ v + op.lam * (v0 - v)
    if spec.startswith("grand-nl"):
        X = torch.cat([q, k, v], -1)

        def f(X: torch.Tensor) -> torch.Tensor:
            return _softmax(X[..., :C], X[..., C:2 * C], allowed, C**-0.5) @ X - X

        tau = op.t / op.steps
        for _ in range(op.steps):
            a1 = f(X)
            a2 = f(X + tau / 2 * a1)
            a3 = f(X + tau / 2 * a2)
            a4 = f(X + tau * a3)
            X = X + tau / 6 * (a1 + 2 * a2 + 2 * a3 + a4)
        return X[..., 2 * C:]
    if spec.startswith("polynomial"):  # sum_k theta_k T_k(P) (Chebyshev) from the three-term recursion
        theta = op.theta.detach().double()
        T = [torch.eye(N, dtype=F64).expand_as(P), P]
        while len(T) < theta.shape[-1]:
            T.append(2.0 * P @ T[-1] - T[-2])
        return sum(theta[:, j].view(1, -1, 1, 1) * T[j] for j in range(theta.shape[-1])) @ v
    raise KeyError(spec)


def _out(layer: DiffusionAttention, heads: torch.Tensor) -> torch.Tensor:
    return heads.transpose(1, 2).reshape(B, N, D) @ layer.out_proj.weight.double().T + layer.out_proj.bias.double()


SPECS = ["attnscale(omega=0.4)", "differential(depth=3)", "ppr-exact(alpha=0.2)", "neutreno(lam=0.6)",
         "grand-nl(t=1.0, steps=2, method='rk4')", "polynomial(steps=3, init=[0.1, 0.6, 0.2, 0.1], basis='chebyshev')"]
PAD = torch.zeros(B, N, dtype=torch.bool)
PAD[0, :2] = True  # left padding: causal rows 0, 1 of sequence 0 have no key
PAD[1, -3:] = True


# ---------------------------------------------------------------------------------------------- bugs
@pytest.mark.parametrize("alpha", [1e-2, 1e-6, 1e-8, 1e-12])
def test_bug_ppr_exact_causal_small_alpha_is_finite_in_float32(alpha):
    """Bug: the diagonal of ``I - (1 - alpha) P`` was ``1 - (1 - alpha) P_ii``; in float32 ``1 - alpha`` is 1 for
    ``alpha < 6e-8``, so row 0 of a causal ``P`` (``P_00 = 1``) had the pivot 0 and the causal layer returned
    inf / NaN (``alpha = 1e-8``); at ``alpha = 1e-6`` the cancellation left its output 1 % off (0.008 absolute)."""
    g = torch.Generator().manual_seed(0)
    s = torch.randn(2, 2, 24, 24, dtype=F64, generator=g) * 2
    P = torch.softmax(s.masked_fill(~torch.ones(24, 24, dtype=torch.bool).tril(), -math.inf), -1).float()
    v = torch.randn(2, 2, 24, 3, generator=g)
    # the exact answer for the given float32 P: its diagonal alpha + (1 - alpha)(1 - P_ii), in float64
    Pd = P.double()
    system = -(1.0 - alpha) * Pd
    system.diagonal(dim1=-2, dim2=-1).copy_(alpha + (1.0 - alpha) * (1.0 - Pd.diagonal(dim1=-2, dim2=-1)))
    ref = alpha * torch.linalg.solve(system, v.double())
    out = ExactPPROperator(alpha=alpha).apply_causal_matrix(P, v)
    assert out.dtype == torch.float32 and bool(out.isfinite().all())
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    # through the layer: the float32 causal call against the same layer in float64
    torch.manual_seed(0)
    layer = DiffusionAttention(D, H, f"attention:2,ppr-exact(alpha={alpha}):2", causal=True).eval()
    x = torch.randn(B, 7, D)
    y = layer(x)
    assert bool(y.isfinite().all())
    torch.testing.assert_close(y.double(), layer.double()(x.double()), rtol=0, atol=1e-5)


def test_bug_polynomial_init_from_a_one_head_learnable_operator():
    """Bug: a polynomial of ``G > 1`` heads initialised from a one-head learnable heat or PPR (or polynomial) was
    refused: their ``coefficients()`` are a ``(1, K+1)`` row, read as the coefficients of 1 head ("init coefficients
    must have shape (K+1,) or (2, K+1), got (1, 5)"); the row now serves every head, as in the layer."""
    heat = [math.exp(-1.0) / math.factorial(k) for k in range(5)]  # e^{-t} t^k / k!, t = 1
    ppr = [0.2 * 0.8**k for k in range(3)] + [0.8**3, 0.0]  # alpha (1 - alpha)^k, the tail (1 - alpha)^K
    for init, ref in ((HeatOperator(t=1.0, steps=4, learnable=True), heat),
                      ("heat(t=1.0, steps=4, learnable=True)", heat),
                      ("ppr(alpha=0.2, steps=3, learnable=True)", ppr),
                      (PolynomialOperator(steps=4, init=heat), heat)):
        for basis in ("monomial", "chebyshev"):
            op = PolynomialOperator(steps=4, init=init, num_heads=3, basis=basis)
            torch.testing.assert_close(op.coefficients().double(), torch.tensor([ref] * 3, dtype=F64),
                                       rtol=1e-6, atol=1e-6)
    layer = DiffusionAttention(D, H, "polynomial(steps=4, init='heat(t=1.0, steps=4, learnable=True)'):2,attention:2")
    assert layer.operators[0].theta.shape == (2, 5)
    # an operator of another number of heads is still refused, by name
    with pytest.raises(ValueError, match="HeatOperator has coefficients for 3 heads, asked for 2"):
        PolynomialOperator(steps=4, init=HeatOperator(t=1.0, steps=4, learnable=True, num_heads=3), num_heads=2)


def test_bug_differential_with_rotary_needs_head_dim_divisible_by_4():
    """Bug: differential attention splits each head's ``q``, ``k`` into halves after the rotary embedding, which
    rotates channel pairs ``(2i, 2i+1)``; with ``head_dim = 6`` the pair ``(2, 3)`` straddled the halves, so the
    scores depended on absolute positions (shifting all positions by 7 moved the output by 0.09). Refused now;
    with ``head_dim = 8`` the output is unchanged by the shift, as for attention."""
    with pytest.raises(ValueError, match=r"'differential' splits .* head_dim=6 .* divisible by 4"):
        DiffusionAttention(12, 2, "attention:1,differential:1", rotary=RotaryEmbedding(6))
    DiffusionAttention(12, 2, "attention:2", rotary=RotaryEmbedding(6))  # other operators: as before
    DiffusionAttention(12, 2, "differential:2")  # no rotary: as before
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 2, "differential(depth=1)", causal=True, rotary=RotaryEmbedding(8)).double().eval()
    x = torch.randn(1, 5, 16, dtype=F64)
    pos = torch.arange(5)
    torch.testing.assert_close(layer(x, positions=pos), layer(x, positions=pos + 7), rtol=0, atol=1e-12)


def test_bug_chebyshev_basis_overflow_and_numpy_steps():
    """Bug: ``PolynomialOperator(steps=1024, basis="chebyshev")`` (``steps`` within ``MAX_DEGREE``) was built with a
    NaN ``theta`` (the float64 basis matrix overflows from ``K = 810``), reported at the first call as "theta is not
    finite ... training diverged"; ``chebyshev_matrix(np.int64(3))`` was refused as "not a non-negative int"."""
    with pytest.raises(ValueError, match=r"basis='chebyshev' with steps=1024: .* overflow float64"):
        PolynomialOperator(steps=1024, basis="chebyshev")
    assert torch.isfinite(PolynomialOperator(steps=809, basis="chebyshev").theta).all()
    assert torch.equal(chebyshev_matrix(np.int64(3)), chebyshev_matrix(3))
    for bad in (-1, True, 2.0, "3"):
        with pytest.raises(ValueError, match="steps must be a non-negative int"):
            chebyshev_matrix(bad)


# ---------------------------------------------------------------- legal cases, against float64 formulas
@pytest.mark.parametrize("kv", [4, 2, 1])
@pytest.mark.parametrize("spec", SPECS)
def test_rivals_match_the_papers_under_masks_and_gqa(spec, kv):
    """Every rival (and the Chebyshev polynomial) equals its paper's equation under no mask, causal, key padding and
    causal with left padding (rows without keys), for grouped-query heads; a padded token never reaches a valid one."""
    tri = torch.ones(N, N, dtype=torch.bool).tril()
    for causal in (False, True):
        torch.manual_seed(1)
        layer = DiffusionAttention(D, H, spec, causal=causal, num_kv_heads=kv).double().eval()
        with torch.no_grad():  # away from the initial values (omega = 0, small lambdas, unit gain)
            for p in layer.operators.parameters():
                p.add_(0.3 * torch.randn_like(p))
        x = torch.randn(B, N, D, dtype=F64)
        q, k, v = _qkv(layer, x, kv)
        depth = 3 if "depth=3" in spec else 0
        for pad in (None, PAD):
            allowed = torch.ones(B, 1, N, N, dtype=torch.bool) & (tri if causal else True)
            valid = torch.ones(B, N, dtype=torch.bool)
            if pad is not None:
                allowed = allowed & ~pad.view(B, 1, 1, N)
                valid = ~pad
            y = layer(x, key_padding_mask=pad)
            ref = _out(layer, _heads_ref(spec, layer.operators[0], q, k, v, allowed, depth))
            torch.testing.assert_close(y[valid], ref[valid], rtol=0, atol=1e-10)
            if pad is not None:
                x2 = x.clone()
                x2[pad] = 50.0 * torch.randn_like(x2[pad])
                torch.testing.assert_close(layer(x2, key_padding_mask=pad)[valid], y[valid], rtol=0, atol=1e-12)


def test_neutreno_reads_the_first_layers_values():
    """NeuTRENO's later layers add ``lam (v0 - v)`` with the first layer's values (GQA-expanded); the first is attention."""
    torch.manual_seed(2)
    first = DiffusionAttention(D, H, "attention", num_kv_heads=2).double().eval()
    second = DiffusionAttention(D, H, "neutreno(lam=0.6)", num_kv_heads=1, causal=True).double().eval()
    x = torch.randn(B, N, D, dtype=F64)
    state = LayerState()
    h = first(x, state=state)
    y = second(h, state=state)
    v0 = _qkv(first, x, 2)[2]
    q, k, v = _qkv(second, h, 1)
    allowed = torch.ones(N, N, dtype=torch.bool).tril()
    ref = _out(second, _heads_ref("neutreno", second.operators[0], q, k, v, allowed, v0=v0))
    torch.testing.assert_close(y, ref, rtol=0, atol=1e-12)


def test_chebyshev_basis_is_cos_k_arccos_and_equals_the_monomial_filter():
    """Row ``k`` of ``chebyshev_matrix`` is ``T_k(x) = cos(k arccos x)`` on ``[-1, 1]``; a Chebyshev and a monomial
    polynomial with the same (float64) weights are the same layer."""
    K = 10
    x = torch.linspace(-1, 1, 41, dtype=F64)
    T = chebyshev_matrix(K) @ torch.stack([x**j for j in range(K + 1)])
    torch.testing.assert_close(T, torch.stack([torch.cos(k * torch.acos(x)) for k in range(K + 1)]), rtol=0,
                               atol=1e-12)
    torch.manual_seed(0)
    cheb = DiffusionAttention(D, H, f"polynomial(steps={K}, basis='chebyshev'):3,laplacian:1", causal=True).double()
    with torch.no_grad():
        cheb.operators[0].theta.copy_(torch.randn(3, K + 1, dtype=F64) / 4)
    mono = DiffusionAttention(D, H, f"polynomial(steps={K}):3,laplacian:1", causal=True).double()
    with torch.no_grad():
        mono.operators[0].theta.copy_(cheb.operators[0].theta.detach() @ chebyshev_matrix(K))
    mono.qkv.load_state_dict(cheb.qkv.state_dict())
    mono.out_proj.load_state_dict(cheb.out_proj.state_dict())
    xx = torch.randn(B, N, D, dtype=F64)
    torch.testing.assert_close(cheb(xx), mono(xx), rtol=0, atol=1e-10)


@pytest.mark.parametrize("spec", SPECS + ["polynomial(steps=3, init=[0.1, 0.6, 0.2, 0.1])"])
def test_rival_gradients_match_finite_differences(spec):
    """The gradients of every learned parameter (lambdas, RMSNorm gain, omega, theta) and of the input, float64,
    causal with left padding and one key/value head, against finite differences."""
    torch.manual_seed(1)
    layer = DiffusionAttention(8, 2, spec, causal=True, num_kv_heads=1).double().eval()
    pad = torch.tensor([[True, False, False, False], [False, False, False, False]])
    x = torch.randn(2, 4, 8, dtype=F64, requires_grad=True)
    names = [n for n, _ in layer.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in layer.parameters())

    def f(x: torch.Tensor, *ps: torch.Tensor) -> torch.Tensor:
        return functional_call(layer, dict(zip(names, ps)), (x,), {"key_padding_mask": pad})

    assert torch.autograd.gradcheck(f, (x,) + params, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("spec", SPECS)
def test_rivals_under_half_precision_and_state_dict_round_trip(spec):
    """bfloat16 / float16 autocast and half modules on CPU stay within the dtype's resolution of float64, and a
    saved state dict rebuilds the same layer from its spec; a NaN in any learned parameter is refused by name."""
    torch.manual_seed(1)
    layer = DiffusionAttention(D, H, f"attention:2,{spec}:2", causal=True, num_kv_heads=2).eval()
    with torch.no_grad():
        for p in layer.operators.parameters():
            p.add_(0.2 * torch.randn_like(p))
    x = torch.randn(B, N, D)
    pad = PAD.clone()
    ref = layer.double()(x.double(), key_padding_mask=pad)
    layer.float()
    for dtype, tol in ((torch.bfloat16, 3e-2), (torch.float16, 4e-3)):
        with torch.autocast("cpu", dtype=dtype):
            y = layer(x, key_padding_mask=pad)
        assert y.dtype == dtype
        torch.testing.assert_close(y.double(), ref, rtol=0, atol=tol)
    again = DiffusionAttention(D, H, layer.heads_spec(), causal=True, num_kv_heads=2).eval()
    assert str(again.load_state_dict(layer.state_dict())) == "<All keys matched successfully>"
    torch.testing.assert_close(again(x, key_padding_mask=pad), layer(x, key_padding_mask=pad), rtol=0, atol=0)
    half = DiffusionAttention(D, H, layer.heads_spec(), causal=True, num_kv_heads=2).eval()
    half.load_state_dict(layer.state_dict())
    torch.testing.assert_close(half.half()(x.half(), key_padding_mask=pad).double(), ref, rtol=0, atol=4e-3)
    for name, p in again.operators.named_parameters():
        with torch.no_grad():
            p.view(-1)[0] = float("nan")
        with pytest.raises(ValueError, match="is not finite"):
            again(x)
        with torch.no_grad():
            p.copy_(layer.get_parameter(f"operators.{name}"))


def test_ppr_exact_alpha_is_checked_and_spec_round_trips():
    """``alpha`` outside ``(0, 1]`` or not a real number is refused by name; ``alpha = 1`` is the identity."""
    for bad in (0.0, -0.1, 1.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="alpha must lie in"):
            ExactPPROperator(alpha=bad)
    for bad in (True, "0.1", torch.tensor(0.1)):
        with pytest.raises(TypeError, match="alpha must be a float"):
            ExactPPROperator(alpha=bad)
    P = torch.softmax(torch.randn(1, 1, 4, 4, dtype=F64), -1)
    v = torch.randn(1, 1, 4, 2, dtype=F64)
    torch.testing.assert_close(ExactPPROperator(alpha=1.0).apply_matrix(P, v), v, rtol=0, atol=0)
    op = build_operator(ExactPPROperator(alpha=np.float64(0.25)).spec())
    assert op.alpha == 0.25
    assert isinstance(build_operator("ppr(alpha=0.2, steps=3)"), PPROperator)
