"""Edge-case probes of ``diffusionformer.operators`` and their numerics through ``DiffusionAttention``.

Probed: every registered operator (attention, laplacian, heat, heat-exact, ppr, ppr-exact, polynomial,
attnscale, neutreno, value-residual, differential, grand-nl) built from every alias, ``spec()`` round
trips with a strict state-dict reload, deepcopy / ``torch.save``; heat at ``t = 0``, large and negative
``t``, the Euler product; PPR at ``alpha = 1``, subnormal ``alpha`` and learned logits at +-1e30;
polynomials of degree 0 and in the Chebyshev basis; learned parameters set to NaN / inf / huge values;
float64 / float16 / bfloat16 / autocast, B=0, N=1 (all fine); causal and key-padding masks for the
exact operators; gradcheck of learned ``t`` / ``alpha`` / ``theta``; operators shared by two layers;
user subclasses with a wrong coefficient shape or degree. References: float64 matrices built by hand,
``torch.linalg.matrix_exp``, ``torch.linalg.solve``, ``torch.autograd.gradcheck``.

Found and fixed (each pinned by a "Bug:" test below):

* a user operator whose ``coefficients()`` (or ``static_coefficients()``) had more than ``degree + 1``
  entries ran silently with the higher powers of ``P`` dropped (``F.pad`` by a negative amount);
* ``coefficients()`` returning a 0-d tensor gave ``IndexError: tuple index out of range``, a 3-D one
  "coefficients for 2 heads", a list ``AttributeError: 'list' object has no attribute 'dim'``; a
  ``degree`` that is a str or negative gave "unsupported operand type(s)" / "coeffs must have at least
  one column";
* a learned ``heat-exact`` time was not kept at the constructor's bound ``t >= -40``: training below it
  made the kernel overflow to inf (``HeatOperator`` clamps its learned ``t`` at ``min_t``);
* ``PPROperator(alpha=5e-324, steps=None)`` raised a bare ``OverflowError`` from ``math.ceil``;
* ``AttnScaleOperator(omega=nan)`` / ``inf`` was accepted (a NaN head on an accelerator, where the
  forward check of learned values is skipped);
* ``NonlinearDiffusionOperator(rtol="x")`` raised "could not convert string to float" without naming
  the argument, and ``rtol=nan`` was accepted.
"""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.operators import (AttnScaleOperator, DiffusionOperator, ExactHeatOperator, HeatOperator,
                                       NonlinearDiffusionOperator, PPROperator, build_operator, operator_class)
from diffusionformer.operators.registry import _REGISTRY

D, H, N = 8, 2, 5


def _reference(layer: DiffusionAttention, x: torch.Tensor, f, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The layer's output with ``f(P)`` applied to every head, in float64 from its weights (``P`` built by hand)."""
    x = x.double()
    B, T, _ = x.shape
    C = D // H
    q, k, v = (x @ layer.qkv.weight.double().T + layer.qkv.bias.double()).split(D, -1)
    q, k, v = (t.view(B, T, H, C).transpose(1, 2) for t in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(C)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    P = s.softmax(-1)
    out = f(P) @ v
    return out.transpose(1, 2).reshape(B, T, D) @ layer.out_proj.weight.double().T + layer.out_proj.bias.double()


def _eye(n: int = N) -> torch.Tensor:
    return torch.eye(n, dtype=torch.float64)


def _layer(spec: str) -> DiffusionAttention:
    torch.manual_seed(0)
    return DiffusionAttention(D, H, spec).double().eval()


def _x(batch: int = 2, n: int = N) -> torch.Tensor:
    return torch.randn(batch, n, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


# ---------------------------------------------------------------------------------------------- bugs
class _Fixed(DiffusionOperator):
    """A user operator of declared ``degree`` whose coefficients are whatever the test sets."""

    name = "probe-fixed"

    def __init__(self, coeffs, degree: object = 1, static: bool = False) -> None:
        super().__init__()
        self._coeffs, self._degree, self._static = coeffs, degree, static

    @property
    def degree(self):  # noqa: ANN201
        return self._degree

    def coefficients(self):  # noqa: ANN201
        return self._coeffs

    def static_coefficients(self):  # noqa: ANN201
        return tuple(self._coeffs.tolist()) if self._static else None


@pytest.mark.parametrize("static", [False, True], ids=["learned", "static"])
def test_coefficients_longer_than_the_degree_are_refused(static):
    """Bug: a user operator declaring ``degree = 1`` whose coefficients were ``(1, 1, 1)`` ran as ``I + P``:
    the layer silently dropped the ``P^2`` term (0.45 off the ``I + P + P^2`` the user wrote)."""
    op = _Fixed(torch.ones(3), degree=1, static=static)
    with pytest.raises(ValueError, match="degree \\+ 1 = 2"):
        DiffusionAttention(D, H, [op, op])(_x().float())


def test_shorter_coefficients_are_padded_with_zeros():
    """A degree-3 operator with coefficients ``(0.5, 0.5)`` is ``0.5 I + 0.5 P`` (zero-padded), as before."""
    op = _Fixed(torch.tensor([0.5, 0.5], dtype=torch.float64), degree=3)
    layer = DiffusionAttention(D, H, [op, op]).double().eval()
    x = _x()
    torch.testing.assert_close(layer(x), _reference(layer, x, lambda P: 0.5 * _eye() + 0.5 * P))


@pytest.mark.parametrize("coeffs,degree,match", [
    (torch.tensor(1.0), 1, r"shape \(K\+1,\) or \(G, K\+1\), got \(\)"),
    (torch.ones(2, 2, 2), 1, r"got \(2, 2, 2\)"),
    ([0.0, 1.0], 1, "got list"),
    (torch.tensor([0.0, 1.0]), "1", r"_Fixed.degree must be an int"),
    (torch.tensor([0.0, 1.0]), -1, r"_Fixed.degree must be an int"),
], ids=["0-d", "3-d", "list", "str-degree", "negative-degree"])
def test_malformed_coefficients_or_degree_name_the_operator(coeffs, degree, match):
    """Bug: a 0-d ``coefficients()`` gave ``IndexError: tuple index out of range``, a 3-D one "coefficients for 2
    heads", a list ``AttributeError``, ``degree = "1"`` "unsupported operand type(s) for -", ``degree = -1``
    "coeffs must have at least one column"."""
    op = _Fixed(coeffs, degree=degree)
    with pytest.raises(ValueError, match=match):
        DiffusionAttention(D, H, [op, op])(_x().float())


def test_learned_exact_heat_time_is_kept_at_its_lower_bound():
    """Bug: the constructor refuses ``t < -40`` (the kernel leaves float32's range), but a learned ``t`` trained
    below it was used as is: on a bipartite ``P`` (eigenvalue -1) ``t = -45`` gave an all-inf output."""
    P = torch.tensor([[0.0, 1.0], [1.0, 0.0]]).view(1, 1, 2, 2)
    v = torch.tensor([1.0, -1.0]).view(1, 1, 2, 1)
    op = ExactHeatOperator(t=-1.0, learnable=True)
    with torch.no_grad():
        op.t.fill_(-45.0)
    out = op.apply_matrix(P, v)
    assert torch.isfinite(out).all()
    ref = torch.linalg.matrix_exp(40.0 * (_eye(2) - P[0, 0].double())) @ v[0, 0].double()  # the kernel at t = -40
    torch.testing.assert_close(out[0, 0].double(), ref, rtol=1e-5, atol=0)


def test_ppr_subnormal_alpha_with_automatic_steps_is_a_clear_error():
    """Bug: ``PPROperator(alpha=5e-324, steps=None)`` (alpha in the documented ``(0, 1]``) raised a bare
    ``OverflowError: cannot convert float infinity to integer``."""
    with pytest.raises(ValueError, match="needs more than 1024 steps"):
        PPROperator(alpha=5e-324, steps=None)


@pytest.mark.parametrize("omega", [float("nan"), float("inf")])
def test_attnscale_refuses_a_non_finite_omega(omega):
    """Bug: ``AttnScaleOperator(omega=nan)`` was accepted, and only the CPU forward pass noticed (with a
    misleading "training diverged" message); on an accelerator every output was NaN."""
    with pytest.raises(ValueError, match="omega must be finite"):
        AttnScaleOperator(omega=omega)


def test_grand_nl_tolerances_are_checked_by_name():
    """Bug: ``NonlinearDiffusionOperator(rtol="x")`` raised "could not convert string to float: 'x'" without
    naming ``rtol``, and ``atol=nan`` was accepted."""
    with pytest.raises(TypeError, match="rtol must be a float"):
        NonlinearDiffusionOperator(rtol="x")
    with pytest.raises(ValueError, match="atol must be finite"):
        NonlinearDiffusionOperator(atol=float("nan"))


# ---------------------------------------------------------------- legal edge cases, against references
@pytest.mark.parametrize("spec,f", [
    ("heat(t=0.0, steps=0)", lambda P: _eye().expand_as(P)),
    ("heat-exact(t=0.0)", lambda P: _eye().expand_as(P)),
    ("ppr(alpha=1.0, steps=1)", lambda P: _eye().expand_as(P)),
    ("ppr-exact(alpha=1.0)", lambda P: _eye().expand_as(P)),
    ("polynomial(steps=0, init=[2.5])", lambda P: 2.5 * _eye().expand_as(P)),
    ("heat(t=30.0, steps=None)", lambda P: torch.linalg.matrix_exp(-30.0 * (_eye() - P))),
    ("heat-exact(t=30.0)", lambda P: torch.linalg.matrix_exp(-30.0 * (_eye() - P))),
    ("heat(t=-1.5, steps=None)", lambda P: torch.linalg.matrix_exp(1.5 * (_eye() - P))),
    ("heat(t=2.0, steps=4, method='euler')", lambda P: torch.linalg.matrix_power(0.5 * _eye() + 0.5 * P, 4)),
    ("ppr(alpha=0.3, steps=None)", lambda P: 0.3 * torch.linalg.inv(_eye() - 0.7 * P)),
    ("polynomial(steps=3, init=[0.5, 0.0, 0.0, 1.0], basis='chebyshev')", lambda P: 0.5 * _eye() + P @ P @ P),
], ids=["heat-t0", "heat-exact-t0", "ppr-alpha1", "ppr-exact-alpha1", "poly-degree0", "heat-t30", "heat-exact-t30",
        "heat-negative", "heat-euler", "ppr-auto-steps", "chebyshev"])
def test_operator_limits_match_explicit_matrices(spec, f):
    """Heat at ``t = 0`` / large / negative ``t``, PPR at ``alpha = 1``, degree-0 and Chebyshev polynomials:
    the float64 layer equals ``f(P)`` built by hand (truncated series to their ``1e-4`` tolerance)."""
    layer, x = _layer(spec + ":2"), _x()
    torch.testing.assert_close(layer(x), _reference(layer, x, f), rtol=0, atol=1e-4 if "None" in spec else 1e-12)


@pytest.mark.parametrize("spec,f", [
    ("ppr-exact(alpha=0.3)", lambda P: 0.3 * torch.linalg.inv(_eye() - 0.7 * P)),
    ("heat-exact(t=2.0)", lambda P: torch.linalg.matrix_exp(-2.0 * (_eye() - P))),
])
def test_exact_operators_under_causal_and_padding_masks(spec, f):
    """``ppr-exact`` (triangular solve when causal) and ``heat-exact`` equal ``torch.linalg`` on the masked ``P``."""
    layer, x = _layer(spec + ":2"), _x()
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    torch.testing.assert_close(layer(x, is_causal=True), _reference(layer, x, f, mask=causal))
    pad = torch.tensor([[False] * N, [False, False, False, True, True]])
    keep = (~pad)[:, None, None, :].expand(2, 1, N, N)
    torch.testing.assert_close(layer(x, key_padding_mask=pad), _reference(layer, x, f, mask=keep))


@pytest.mark.parametrize("logit,f", [
    (1e30, lambda P: _eye().expand_as(P)),  # alpha -> 1: keep every token's own value
    (-1e30, lambda P: torch.linalg.matrix_power(P, 3)),  # alpha -> 0: the tail mass all on P^K
])
def test_learned_ppr_logit_at_the_edge_of_its_domain(logit, f):
    """A learned ``alpha`` driven to 0 or 1 stays finite and is the limit of the series (sigmoid keeps it in range)."""
    layer, x = _layer("ppr(alpha=0.3, steps=3, learnable=True):2"), _x()
    with torch.no_grad():
        layer.operators[0].alpha_logit.fill_(logit)
    torch.testing.assert_close(layer(x), _reference(layer, x, f))


def test_learned_heat_time_after_an_optimiser_step_stays_above_min_t():
    """An SGD step that throws the learned ``t`` far below ``min_t`` leaves the layer computing the ``min_t`` kernel."""
    layer, x = _layer("heat(t=-1.0, steps=12, learnable=True, min_t=-1.5):2"), _x()
    with torch.no_grad():
        layer.operators[0].t.fill_(-1.4)
    opt = torch.optim.SGD(layer.operators.parameters(), lr=10.0)
    layer(x).sum().backward()
    layer.operators[0].t.grad.fill_(1.0)  # a step of -10: t = -11.4
    opt.step()
    assert (layer.operators[0].t < -1.5).all()
    ref = _reference(layer, x, lambda P: torch.linalg.matrix_exp(1.5 * (_eye() - P)))
    torch.testing.assert_close(layer(x), ref, rtol=0, atol=1e-4)


@pytest.mark.parametrize("spec", ["heat(t=0.0, steps=3, learnable=True)", "heat(t=0.7, steps=4, method='euler', learnable=True)",
                                  "ppr(alpha=0.3, steps=4, learnable=True)", "heat-exact(t=0.7, learnable=True)",
                                  "polynomial(steps=2, basis='chebyshev')"])
def test_gradcheck_of_the_learned_parameter(spec):
    """The gradient in the learned ``t`` / ``alpha`` / ``theta`` (``t = 0`` included) passes float64 gradcheck."""
    op = build_operator(spec, num_heads=2).double()
    (name, p0), = op.named_parameters()
    g = torch.Generator().manual_seed(2)
    P = torch.randn(1, 2, 4, 4, dtype=torch.float64, generator=g).softmax(-1)
    v = torch.randn(1, 2, 4, 2, dtype=torch.float64, generator=g)

    def f(p):  # noqa: ANN001, ANN202
        return torch.func.functional_call(_Apply(op), {f"op.{name}": p}, (P, v))

    assert torch.autograd.gradcheck(f, (p0.detach().clone().requires_grad_(),))


class _Apply(torch.nn.Module):
    """``op.apply_matrix`` as a module call (for ``functional_call`` with a replaced parameter)."""

    def __init__(self, op: DiffusionOperator) -> None:
        super().__init__()
        self.op = op

    def forward(self, P: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.op.apply_matrix(P, v)


def test_an_operator_shared_by_two_layers_collects_both_gradients():
    """One learned heat operator in two layers: its ``t.grad`` is the sum of the two layers' gradients."""
    op = HeatOperator(t=0.5, steps=4, learnable=True)
    torch.manual_seed(0)
    a, b = DiffusionAttention(D, H, [op, op]), DiffusionAttention(D, H, [op, op])
    x = _x().float()
    grads = []
    for layer in (a, b):
        op.t.grad = None
        layer(x).sum().backward()
        grads.append(op.t.grad.clone())
    op.t.grad = None
    (a(x) + b(x)).sum().backward()
    torch.testing.assert_close(op.t.grad, grads[0] + grads[1])


@pytest.mark.parametrize("name", sorted(set(_REGISTRY) - {"differential"}))
def test_every_operator_survives_spec_state_dict_save_and_deepcopy(name):
    """Every registered operator (learned values perturbed): a layer rebuilt from ``heads_spec()`` and loaded
    strictly, a ``torch.save`` copy and a deepcopy all give the same output."""
    cls = _REGISTRY[name]
    op = build_operator(name, num_heads=2, **cls.example_kwargs)
    torch.manual_seed(0)
    layer = DiffusionAttention(D, 4, [op, op, "attention", "laplacian"]).eval()
    with torch.no_grad():
        for p in op.parameters():
            p.add_(0.05)
    x = _x().float()
    y = layer(x)
    rebuilt = DiffusionAttention(D, 4, layer.heads_spec()).eval()
    rebuilt.load_state_dict(layer.state_dict(), strict=True)
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    for other in (rebuilt, torch.load(buf, weights_only=False), copy.deepcopy(layer)):
        torch.testing.assert_close(other(x), y, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", sorted(_REGISTRY))
def test_every_alias_in_any_spelling_builds_its_operator(name):
    """Every alias, upper-cased and with ``_`` for ``-``, resolves to its class and builds with its example kwargs."""
    cls = _REGISTRY[name]
    for alias in (name, *cls.aliases):
        for spelling in (alias, alias.upper().replace("-", "_"), f"  {alias}  "):
            assert operator_class(spelling) is cls
            assert type(build_operator(spelling, **cls.example_kwargs)) is cls


def test_polynomial_init_from_numpy_and_a_readable_spec():
    """Bug: ``PolynomialOperator(init=np.array([0.1, 0.2, 0.3]), steps=2)`` was refused with "operator spec must be
    a name, a DiffusionOperator subclass or instance, got ndarray" (read as an operator to copy), and a list
    ``init`` was written by ``spec()`` in float32 reprs (``0.10000000149011612``). numpy coefficients are now
    coefficients, and the spec writes a list as given; it still rebuilds the same operator (coefficients compared
    with the hand-written values)."""
    import numpy as np

    from diffusionformer.operators.polynomial import PolynomialOperator

    op = PolynomialOperator(init=np.array([0.1, 0.2, 0.3]), steps=2)
    torch.testing.assert_close(op.coefficients().detach(), torch.tensor([[0.1, 0.2, 0.3]]), rtol=0, atol=0)
    assert op.spec() == "polynomial(steps=2, init=[0.1, 0.2, 0.3])"
    listed = PolynomialOperator(init=[0.1, 0.6, 0.2, 0.1])
    assert listed.spec() == "polynomial(steps=3, init=[0.1, 0.6, 0.2, 0.1])"
    torch.testing.assert_close(build_operator(listed.spec()).coefficients().detach(),
                               torch.tensor([[0.1, 0.6, 0.2, 0.1]]), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"init coefficients must have shape \(K\+1,\)"):
        PolynomialOperator(init=np.float64(0.5), steps=2)
