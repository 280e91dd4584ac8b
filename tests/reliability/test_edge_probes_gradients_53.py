"""Edge probes, sitting 53: gradients everywhere, by float64 ``gradcheck`` / ``gradgradcheck``.

Probed (small sizes: ``N <= 5``, ``H = 2``, head width 2 or 3): every registered operator (its ``example_kwargs``,
plus learned heat times -- Taylor and Euler --, learned ``heat-exact`` and PPR times, the Chebyshev basis, Euler
GRAND-nl) in a :class:`~diffusionformer.nn.DiffusionAttention` alone and beside an attention head, with respect to
the input and every parameter (projections, learned ``t``, ``alpha``, ``theta``, ``omega``, the differential
``lambda`` vectors), on the ``matrix`` and ``sdpa`` back-ends (no mask, causal, key padding with a fully padded
sequence, causal + padding, a bool mask with a fully masked row, a float mask -- also as an input that requires
grad --, a float mask with a ``-inf`` row), on sparse graphs (a node without incoming edge, no self-loops, no edges;
``csr`` and ``native``), with ``check_batched_grad`` and, on ``matrix`` and sparse graphs, ``check_forward_ad``; the
layers' extra paths: dropout under a fixed seed (the layers draw their masks from torch's generator: one
``manual_seed`` gives the same masks in every evaluation), KV-cache decoding (gradients through the cache into the
prompt), ``recompute=True`` (also with dropout and GQA), non-reentrant checkpointing, rotary positions,
``return_intermediates``, edge features; the functional API (``diffuse``, ``diffuse_with_weights``, per-head
degrees, ``diffuse_sparse(_with_weights)``, ``edge_attention``, ``propagate_sparse`` in the edge weights, duplicate
edges, ``segment_softmax``, ``scatter_sum``) and the Triton kernels under the interpreter (float32 analytic
gradients against the float64 reference with the kernels' own dropout masks, and against central differences of
the float32 kernels, ``K = 0 .. 3``, every mask kind, fully masked rows). All agreed except the second
derivatives below.

Bug: the learned heat coefficients ``e^-t t^k / k!`` and PPR weights ``alpha (1 - alpha)^k`` took
``x.pow(arange(K+1))``, whose derivative of ``x^0`` is formed as ``0 * x^-1``: the second derivative was NaN at
``t = 0`` (a heat head initialised at the identity, or a learned time crossing zero) and where ``1 - alpha`` rounds
to 0 (a saturated ``alpha_logit``, about 17 in float32), so ``create_graph=True`` gradients (gradient penalties,
Hessian-vector products, MAML) were NaN. Fixed: the powers by a running product (``operators.base._powers``, one
``cumprod``).
"""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck
from torch.nn.utils.stateless import _reparametrize_module

from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.kv_cache import LayerKVCache
from diffusionformer.operators import build_operator, heat_coefficients, list_operators, operator_class
from diffusionformer.operators.ppr import ppr_coefficients
from diffusionformer.ops.rivals import LayerState

F64 = torch.float64


def _second_derivative(fn, x: torch.Tensor) -> torch.Tensor:
    x = x.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(fn(x).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x)
    return h


def test_bug_second_derivatives_of_heat_and_ppr_weights_are_finite_at_zero():
    """Bug: ``heat_coefficients`` at ``t = 0`` and ``ppr_coefficients`` at ``1 - alpha = 0`` had NaN second
    derivatives (``pow`` with the exponent 0 differentiated as ``0 * x^-1``); both now pass gradgradcheck there, and
    so does a layer with a learned heat head initialised at ``t = 0``."""
    for K in (0, 1, 3, 20):
        t = torch.zeros(2, dtype=F64)
        h = _second_derivative(lambda t: heat_coefficients(t, K), t)
        # d^2/dt^2 of e^-t t^k / k! at 0: 1 (k=0), -2 (k=1), 1 (k=2), 0 beyond
        expected = sum((1.0, -2.0, 1.0)[: K + 1])
        torch.testing.assert_close(h, torch.full((2,), expected, dtype=F64))
        assert gradgradcheck(lambda t: heat_coefficients(t, K), (t.requires_grad_(),))
    alpha = torch.ones(2, dtype=F64)
    h = _second_derivative(lambda a: ppr_coefficients(a, 3), alpha)
    assert torch.isfinite(h).all()
    assert gradgradcheck(lambda a: ppr_coefficients(a, 3), (alpha.requires_grad_(),))
    ppr = build_operator("ppr(alpha=0.2, steps=3, learnable=True)")  # float32: sigmoid(20) rounds to 1
    with torch.no_grad():
        ppr.alpha_logit.fill_(20.0)
    assert torch.isfinite(_second_derivative(lambda p: _coefficients(ppr, "alpha_logit", p), ppr.alpha_logit)).all()

    torch.manual_seed(0)
    layer = DiffusionAttention(4, 2, heads="heat(t=0.0, steps=3, learnable=True):1,attention:1", backend="matrix")
    layer = layer.double()
    x = torch.randn(2, 3, 4, dtype=F64)
    names = [n for n, _ in layer.named_parameters()]

    def f(*params):
        with _reparametrize_module(layer, dict(zip(names, params))):
            return layer(x, is_causal=True)

    params = tuple(p.detach().clone().requires_grad_(True) for _, p in layer.named_parameters())
    assert gradgradcheck(f, params, fast_mode=True)


def _coefficients(op, name: str, value: torch.Tensor) -> torch.Tensor:
    with _reparametrize_module(op, {name: value}):
        return op.head_coefficients()


# ------------------------------------------------------------------------------------------------------------- pins


def _spec(name: str) -> str:
    kwargs = dict(operator_class(name).example_kwargs)
    if "head_dim" in kwargs:  # differential: head width 2 here
        kwargs["head_dim"] = 2
    return build_operator(name, **kwargs).spec()


#: every registered operator, and the learned variants its example does not exercise
SPECS = [_spec(n) for n in list_operators()] + [
    "heat(t=0.0, steps=3, method='euler', learnable=True)",
    "heat-exact(t=0.7, learnable=True)",
    "ppr(alpha=0.2, steps=3, learnable=True)",
    "polynomial(steps=2, init=[0.2, 0.5, 0.3], basis='chebyshev')",
]
B, N, D, H = 2, 4, 4, 2


def _layer(spec: str, **kwargs) -> tuple[DiffusionAttention, callable, bool]:
    torch.manual_seed(0)
    layer = DiffusionAttention(D, H, heads=f"{spec}:1,attention:1", **kwargs).double()
    stateful = any(op.needs_layer_state for op in layer.operators)
    sparse = all(op.supports_sparse for op in layer.operators)
    return layer, (LayerState if stateful else (lambda: None)), sparse


def _check(layer: DiffusionAttention, call, *xs: torch.Tensor, second: bool = False, seed: int | None = None) -> None:
    """gradcheck (and gradgradcheck) of ``call(layer, *xs)`` in ``xs`` and every parameter of the layer."""
    names = [n for n, _ in layer.named_parameters()]
    n = len(xs)

    def f(*args):
        with _reparametrize_module(layer, dict(zip(names, args[n:]))), torch.random.fork_rng(devices=[]):
            if seed is not None:  # dropout: the same masks in every evaluation
                torch.manual_seed(seed)
            return call(layer, *args[:n])

    inputs = (*xs, *(p.detach().clone().requires_grad_(True) for _, p in layer.named_parameters()))
    assert gradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=True)
    if second:
        assert gradgradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=True)


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=F64, requires_grad=True)


@pytest.mark.parametrize("spec", SPECS)
def test_pins_layer_gradients_of_every_operator_on_every_graph_kind(spec):
    """Pins: float64 gradcheck of a layer with the operator beside an attention head, in the input, a learned float
    mask and every parameter (the operator's learned ``t``, ``alpha``, ``theta``, ``omega``, ``lambda`` included):
    ``matrix`` (with gradgradcheck) and ``sdpa`` under causal + key padding with a fully padded sequence and under a
    bool mask with a fully masked row; a sparse graph with a node without incoming edge and no self-loop at it."""
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[1] = True
    window = torch.ones(B, 1, N, N, dtype=torch.bool).tril()
    window[1, :, 2] = False
    for backend in ("matrix", "sdpa"):
        layer, state, sparse = _layer(spec, backend=backend)
        second = backend == "matrix"
        _check(layer, lambda L, x: L(x, is_causal=True, key_padding_mask=pad, state=state()), _x(B, N, D),
               second=second)
        _check(layer, lambda L, x, m: L(x, attn_mask=m, state=state()), _x(B, N, D), _x(1, 1, N, N))
        _check(layer, lambda L, x: L(x, attn_mask=window, state=state()), _x(B, N, D), second=second)
    if sparse:
        edges = torch.tensor([[0, 1, 2, 0, 1], [1, 1, 2, 0, 0]])  # node 3: no incoming edge
        _check(layer, lambda L, x: L(x, edge_index=edges, state=state()), _x(N, D), second=True)


@pytest.mark.parametrize("spec", SPECS)
def test_pins_gradients_of_the_layers_extra_paths(spec):
    """Pins: gradcheck through dropout under a fixed seed (matrix, sdpa, sparse), ``recompute=True`` with dropout
    inside non-reentrant checkpointing, and KV-cache decoding (the gradient of the decoded token reaches the prompt
    through the cache)."""
    if spec.startswith("ppr-exact"):
        spec = "ppr-exact(alpha=0.5)"  # dropout below alpha (else refused)
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[1, 2:] = True
    for backend in ("matrix", "sdpa"):
        layer, state, sparse = _layer(spec, backend=backend, dropout=0.3, recompute=True)
        layer.train()
        _check(layer, lambda L, x: torch.utils.checkpoint.checkpoint(
            lambda y: L(y, key_padding_mask=pad, state=state()), x, use_reentrant=False), _x(B, N, D), seed=3)
    if sparse:
        edges = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])  # a cycle: no self-loops
        _check(layer, lambda L, x: L(x, edge_index=edges, state=state()), _x(N, D), seed=3)
    layer, state, _ = _layer(spec, backend="matrix", causal=True)
    layer.eval()

    def decode(L, prompt, token):
        cache = LayerKVCache()
        return L(prompt, cache=cache, state=state()), L(token, cache=cache, state=state())

    _check(layer, decode, _x(B, 3, D), _x(B, 1, D))


def test_bug_learned_heat_and_ppr_weights_make_no_host_read_and_keep_pow_bits():
    """Bug: the first fix of the NaN second derivatives built the powers with ``torch.cumprod``, whose backward
    reads ``(x == 0).any()`` on the host (``aten._local_scalar_dense``: a GPU synchronisation in every backward of
    a learned heat or PPR layer, and 71 more aten calls in the issue-15 profile). The powers are ``pow``'s values
    and first derivatives, bit for bit, and forward and backward read nothing on the host."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from diffusionformer.operators.heat import heat_coefficients
    from diffusionformer.operators.ppr import ppr_coefficients

    class _Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    for make in (lambda x: heat_coefficients(x, 6), lambda x: ppr_coefficients(x, 6)):
        x = torch.tensor([0.0, 0.3, 0.7], requires_grad=True)
        with _Ops() as mode:
            make(x).sum().backward()
        assert not [op for op in mode.ops if "_local_scalar_dense" in op or "nonzero" in op], mode.ops
        y = torch.tensor([0.1, 0.3, 0.7], requires_grad=True)
        ref = y.detach().clone().requires_grad_()
        k = torch.arange(7, dtype=torch.float64)
        from diffusionformer.operators.base import _powers

        w = torch.randn(3, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        mine, theirs = _powers(y, k), ref.unsqueeze(-1).pow(k)
        assert torch.equal(mine, theirs)
        (mine * w).sum().backward()
        (theirs * w).sum().backward()
        assert torch.equal(y.grad, ref.grad)
