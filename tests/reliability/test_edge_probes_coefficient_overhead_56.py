"""Per-call overhead of building head coefficients (issue 15: small models on a GPU are bound by launches).

Audited (sitting 56, probe, CPU, one thread; ratios new/old measured in one process, median of 41 paired rounds):

* a layer with a learned operator rebuilt its whole ``(H, K+1)`` coefficient tensor at every call, the rows of its
  fixed operators included (their ``coefficients()`` expanded, cast, padded and concatenated, one set of operations
  per operator). Now the fixed rows (and the zero rows of non-polynomial heads) are one tensor per run of groups,
  built from their Python floats once per device and dtype (``engine.static_tensor``); only learned rows are built
  per call (``DiffusionAttention._coefficients`` + ``check_layout``: 0.76x with one learned and one fixed operator,
  0.75x with six operators);
* ``_Pow`` (learned heat and PPR powers) paid torch's argument binding (``inspect.signature``) at every call, and
  its backward pass called ``_Pow.apply`` even when no graph was recorded: forward 0.30x, forward + backward 0.7x;
* ``heat(method='euler', learnable=True)`` made ``2 (K+1)`` pow calls and two stacks: now one table of powers
  (forward + backward 0.97x at K = 2, 0.93x at 4, 0.63x at 8, 0.38x at 16). The values are within 1.5 float64 eps of
  the old construction (scalar ``pow`` multiplies, the table calls ``pow``), equal after rounding to float32 in every
  case probed, and as close to the exact rationals as before.
"""

from __future__ import annotations

import inspect
import math
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn._weights import _stored_weight
from diffusionformer.operators import build_operator, heat_coefficients
from diffusionformer.operators import base as _base

MIXED = "heat(learnable=True, steps=2):2,attention:1,laplacian:1,heat(t=0.5, steps=3):1,ppr(steps=3):1"


class _Calls(TorchFunctionMode):
    """The torch functions and tensor methods called under it, by name (attribute reads left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name != "__get__":  # x.shape, x.is_meta: no operation
            self.names.append(name)
        return func(*args, **(kwargs or {}))


def _old_coefficients(layer: DiffusionAttention, nan_for_nonpolynomial: bool = False) -> torch.Tensor:
    """The layer's coefficients as they were built before (every operator's rows cast, padded and concatenated)."""
    K = layer.max_degree
    ref = _stored_weight(layer.qkv, owner=layer)
    dtype = torch.float64 if ref.dtype == torch.float64 else torch.float32
    rows = []
    for op, (_, count), poly in zip(layer.operators, layer._groups, layer._polynomial):
        if poly:
            c = op.head_coefficients(count).to(device=ref.device).to(dtype)
            rows.append(F.pad(c, (0, K - c.shape[1] + 1)))
        else:
            rows.append(torch.full((count, K + 1), math.nan if nan_for_nonpolynomial else 0.0, dtype=dtype))
    return torch.cat(rows)


@pytest.mark.parametrize("heads", [MIXED, "attention:2,heat(t=0.5, steps=3):2,ppr(steps=3):2",
                                   "heat-exact(t=0.5):2,heat(learnable=True, steps=2):2,laplacian:2",
                                   "polynomial(steps=2):6"])
def test_pins_layer_coefficients_equal_the_old_construction_bit_for_bit(heads):
    layer = DiffusionAttention(24, 6, heads)
    for cast in (lambda m: m, lambda m: m.double(), lambda m: m.half()):
        layer = cast(layer)
        assert torch.equal(layer._coefficients(), _old_coefficients(layer))
        torch.testing.assert_close(layer.coefficients(), _old_coefficients(layer, True), rtol=0, atol=0,
                                   equal_nan=True)
        assert layer._coefficients().dtype == (torch.float64 if layer.qkv.weight.dtype == torch.float64
                                               else torch.float32)


def test_fixed_rows_are_built_once_not_at_every_call():
    """The torch calls that build a mixed layer's coefficients do not grow with its fixed operators (each cost an
    expand, two casts and a pad per call), and the fixed rows are the same tensor at every call."""
    few = DiffusionAttention(24, 6, "heat(learnable=True, steps=2):1,attention:5")
    many = DiffusionAttention(24, 6, "heat(learnable=True, steps=2):1,attention:1,laplacian:1,heat(t=0.5, steps=2):1,"
                                     "ppr(steps=2):1,attention:1")
    counts = []
    for layer in (few, many):
        layer._coefficients()
        with _Calls() as calls:
            layer._coefficients()
        counts.append(len(calls.names))
        with _Calls() as old:
            _old_coefficients(layer)
        assert len(calls.names) < len(old.names)
    assert counts[0] == counts[1]
    seen = []
    original = torch.cat

    def cat(tensors, *args, **kwargs):
        seen.append(tensors[1])
        return original(tensors, *args, **kwargs)

    torch.cat = cat
    try:
        many._coefficients(), many._coefficients()
    finally:
        torch.cat = original
    assert len(seen) == 2 and seen[0] is seen[1] and seen[0].shape == (5, 3)
    fixed = DiffusionAttention(24, 6, "attention:3,heat(t=0.5, steps=3):3")
    assert fixed._coefficients() is fixed._coefficients()


def test_fixed_operators_are_not_asked_for_their_coefficients_per_call(monkeypatch):
    layer = DiffusionAttention(24, 6, MIXED)
    x = torch.randn(2, 5, 24)
    want = layer(x)
    for op in layer.operators[1:]:
        monkeypatch.setattr(op, "head_coefficients", lambda *a: pytest.fail("fixed rows rebuilt"))
    torch.testing.assert_close(layer(x), want, rtol=0, atol=0)


def test_cached_rows_follow_casts_moves_replaced_operators_and_parameters():
    layer = DiffusionAttention(24, 6, MIXED)
    first = layer._coefficients()
    layer.double()
    c = layer._coefficients()
    assert c.dtype == torch.float64 and torch.equal(c, _old_coefficients(layer))
    assert c[4].tolist() == list(layer.operators[3].static_coefficients())  # the floats, not float32 roundings
    layer.float()
    assert torch.equal(layer._coefficients(), first)
    layer.to("meta")
    assert layer._coefficients().is_meta
    layer.to_empty(device="cpu")
    assert torch.equal(layer._coefficients()[2:], first[2:])
    layer.operators[3] = build_operator("attention")
    assert layer.coefficients()[4].tolist() == [0.0, 1.0, 0.0, 0.0]  # the plan (and its fixed rows) made anew
    heat = layer.operators[0]
    heat.t = nn.Parameter(torch.full_like(heat.t, 0.25))
    assert torch.equal(layer._coefficients(), _old_coefficients(layer))
    with torch.no_grad():
        heat.t.fill_(0.75)  # learned rows are never cached
    assert torch.equal(layer._coefficients()[:2], _old_coefficients(layer)[:2])


def test_coefficients_of_a_fixed_layer_are_a_copy_of_the_cache():
    layer = DiffusionAttention(24, 6, "attention:3,laplacian:3")
    c = layer.coefficients()
    c.zero_()
    assert layer.coefficients()[0].tolist() == [0.0, 1.0]
    assert layer._coefficients()[3].tolist() == [1.0, -1.0]


def test_meta_base_without_the_caches_is_still_named():
    """The fixed rows come from the operators' Python floats, yet a meta base called with tensors that leave the
    operators' buffers on meta is refused as before (their buffers were what the layer read)."""
    from torch.func import functional_call

    layer = DiffusionAttention(16, 4, "heat(t=0.5, steps=3):2,polynomial(steps=2):2").double()
    base = DiffusionAttention(16, 4, "heat(t=0.5, steps=3):2,polynomial(steps=2):2").double().to("meta")
    with pytest.raises(ValueError, match=r"operator 'heat'.*meta.*'_c'"):
        functional_call(base, layer.state_dict(), (torch.randn(1, 3, 16, dtype=torch.float64),))


def test_pow_skips_argument_binding_and_its_backward_records_nothing_without_a_graph(monkeypatch):
    x = torch.tensor([0.0, 0.3, 1.7], dtype=torch.float64, requires_grad=True)
    k = torch.arange(4, dtype=torch.float64)
    calls = []
    forward = _base._Pow.forward
    monkeypatch.setattr(_base._Pow, "forward", staticmethod(lambda *a: calls.append(1) or forward(*a)))
    monkeypatch.setattr(inspect, "signature", lambda *a, **kw: pytest.fail("inspect.signature per call"))
    y = _base._powers(x, k)
    assert torch.equal(y, x.detach().unsqueeze(-1).pow(k))
    (g,) = torch.autograd.grad(y.sum(), x)
    assert len(calls) == 1  # the forward alone: the backward pass, recording nothing, ran pow
    (want,) = torch.autograd.grad(x.unsqueeze(-1).pow(k).sum(), x)
    assert torch.equal(g, want)
    monkeypatch.undo()
    (g,) = torch.autograd.grad(_base._powers(x, k).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    assert torch.isfinite(gg).all() and gg.tolist() == pytest.approx([2.0, 2 + 6 * 0.3, 2 + 6 * 1.7])
    hess = torch.func.hessian(lambda t: _base._powers(t, k).sum())(x.detach())
    assert torch.isfinite(hess).all() and torch.equal(hess, torch.diag(gg))


def _exact_euler(t: float, K: int) -> list[float]:
    T = Fraction(t)
    return [float(math.comb(K, j) * (1 - T / K) ** (K - j) * (T / K) ** j) for j in range(K + 1)]


def _old_euler(t: torch.Tensor, K: int) -> torch.Tensor:
    a, b = 1.0 - t / K, t / K
    binom = torch.tensor([float(math.comb(K, j)) for j in range(K + 1)], dtype=torch.float64)
    return binom * torch.stack([a ** (K - j) for j in range(K + 1)], -1) * torch.stack([b**j for j in range(K + 1)], -1)


@pytest.mark.parametrize("K", [1, 2, 3, 5, 8, 16])
def test_euler_coefficients_take_one_table_of_powers_and_keep_their_values(K):
    t = torch.tensor([0.0, 0.3, -0.4, 1.0, K / 2, float(K)], dtype=torch.float64, requires_grad=True)
    heat_coefficients(t, K, "euler")  # the exponents and binomials: built once per K and device
    with _Calls() as calls:
        c = heat_coefficients(t, K, "euler")
    assert sum(name in ("pow", "__pow__") for name in calls.names) == 1
    assert calls.names.count("stack") == 1
    old = _old_euler(t.detach(), K)
    for i, tv in enumerate(t.tolist()):
        ref = torch.tensor(_exact_euler(tv, K), dtype=torch.float64)
        torch.testing.assert_close(c[i].detach(), ref, rtol=8 * 2.2e-16, atol=1e-300)
        assert torch.equal(c[i].detach().float(), old[i].float())
    torch.testing.assert_close(c.detach(), old, rtol=2 * 2.2e-16, atol=0)
    (g,) = torch.autograd.grad(c[:, -1].sum() + c[:, 0].sum(), t, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), t)
    assert torch.isfinite(gg).all()  # second derivatives at t = 0 (b = 0) and t = K (a = 0)
