"""Fourth edge probes of the recompute path (``ops.recompute``, ``DiffusionAttention(recompute=True)``) and the
autograd wiring of the Triton kernels (``ops.triton._launch._PolynomialAttention``): ``gradcheck`` and
``gradgradcheck`` in float64 over causal, masks, per-head degrees and static or learned coefficients; inputs that
do not require grad; ``retain_graph``; outer saved-tensor hooks (CPU offload); forward-mode AD and ``torch.func``;
deterministic algorithms; in-place changes between the forward and the backward pass.

Found and fixed (tests marked "Bug:"): autograd performs no version check on a tensor that passed through
saved-tensor hooks, so inside :func:`~diffusionformer.ops.recompute.recompute_saved` a tensor "saved as usual"
(the output projection's weight) could be changed in place before the backward pass, which then used the changed
weight silently where autograd without the recomputation raises; and the Triton autograd.Function, marked
``once_differentiable``, returned constant gradients under ``create_graph=True`` whenever the output gradient did
not require grad, so the second-order term of a gradient penalty was zero, silently.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.func import functional_call, jvp, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from diffusionformer import DiffusionAttention
from diffusionformer.ops.recompute import recompute_saved

D64 = torch.float64
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LAYOUTS = ["attention:2,laplacian:2", "attention:2,heat(t=0.5, learnable=True):2", "polynomial(steps=2):4",
           "laplacian:2,ppr(steps=3):2"]


def _layer(heads: str, recompute: bool, causal: bool = True, backend: str = "sdpa") -> DiffusionAttention:
    torch.manual_seed(0)
    return DiffusionAttention(8, 4, heads, causal=causal, bias=False, backend=backend, recompute=recompute).double()


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all((u is None and v is None) or (u is not None and v is not None and torch.equal(u, v))
                                    for u, v in zip(a, b))


# ------------------------------------------------------------------------------------------------ bugs


@pytest.mark.parametrize("heads", ["attention:2,laplacian:2", "heat(t=1.0, steps=2):4"])
def test_bug_recompute_skipped_the_version_check_of_the_projection_weight(heads):
    """Bug: autograd checks no version of a tensor that passed through saved-tensor hooks, so with recompute=True
    the output projection's weight, changed in place between the forward and the backward pass (an optimizer step
    too early), gave gradients of the changed weight silently; without the recomputation autograd raises."""
    for recompute in (False, True):
        layer = _layer(heads, recompute)
        x = torch.randn(2, 5, 8, dtype=D64, requires_grad=True)
        y = layer(x)
        with torch.no_grad():
            layer.out_proj.weight.mul_(2.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.square().sum().backward()


def test_bug_recompute_saved_keeps_the_version_check_of_other_tensors():
    """Bug: a tensor other than z saved inside recompute_saved (here the weight) lost autograd's version check."""
    a = torch.randn(2, 3, dtype=D64, requires_grad=True)
    w = torch.randn(4, 3, dtype=D64, requires_grad=True)
    z = a * 2.0
    with recompute_saved(z, lambda: a.detach() * 2.0):
        y = F.linear(z, w)
    with torch.no_grad():
        w.add_(1.0)
    with pytest.raises(RuntimeError, match=r"recompute_saved: .*modified by an inplace operation.*version 1; "
                                           r"expected version 0"):
        y.sum().backward()
    # unchanged: the plain gradients
    z = a * 2.0
    with recompute_saved(z, lambda: a.detach() * 2.0):
        y = F.linear(z, w)
    y.sum().backward()
    assert torch.equal(w.grad, (a.detach() * 2.0).sum(0).expand(4, 3))


def test_bug_recompute_saved_checks_a_z_changed_inside_the_block():
    """Bug: a z changed in place inside the block is saved as it is (fn rebuilds the block's start), but its later
    in-place change went unchecked, where autograd raises."""
    a = torch.randn(2, 3, dtype=D64, requires_grad=True)
    w = torch.randn(4, 3, dtype=D64, requires_grad=True)
    z = a * 2.0
    with recompute_saved(z, lambda: a.detach() * 2.0):
        z.add_(1.0)
        y = F.linear(z, w)
    with torch.no_grad():
        z.mul_(3.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.fixture
def ops(triton_kernels):
    import diffusionformer.ops.triton as triton_ops

    return triton_ops


def test_bug_triton_double_backward_was_silently_zero(ops):
    """Bug: ``once_differentiable`` ties the gradients to the output gradient only: for a loss linear in the output
    (its gradient a constant), ``grad(loss, q, create_graph=True)`` returned constants, and a gradient penalty
    ``loss + |g|^2`` trained without its second-order term, silently. Now a gradient of them raises."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    c = torch.randn(2, 3, device=DEVICE, requires_grad=True)
    target = torch.randn(1, 2, 8, 16, device=DEVICE)
    loss = (ops.polynomial_attention(q, k, v, c, is_causal=True) * target).sum()
    g, = torch.autograd.grad(loss, q, create_graph=True)
    assert g.requires_grad
    with pytest.raises(RuntimeError, match="no double backward"):
        (loss + g.square().sum()).backward()
    # first-order gradients under create_graph=True are the plain ones
    g0, = torch.autograd.grad((ops.polynomial_attention(q, k, v, c, is_causal=True) * target).sum(), q)
    assert torch.equal(g.detach(), g0)


# ------------------------------------------------------------------------------------------- pinned behaviour


@pytest.mark.parametrize("heads", LAYOUTS)
@pytest.mark.parametrize("causal, mask", [(False, "none"), (True, "pad"), (False, "attn")])
def test_recompute_passes_gradcheck_and_gradgradcheck_in_float64(heads, causal, mask):
    layer = _layer(heads, True, causal)
    x = torch.randn(1, 5, 8, dtype=D64, requires_grad=True)
    kw = {}
    if mask == "pad":
        kw["key_padding_mask"] = torch.tensor([[False, False, False, True, True]])
    elif mask == "attn":
        m = torch.rand(5, 5, generator=torch.Generator().manual_seed(1)) > 0.3
        kw["attn_mask"] = m.fill_diagonal_(True)
    names = [n for n, _ in layer.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in layer.parameters()]

    def f(x, *ps):
        return functional_call(layer, dict(zip(names, ps)), (x,), kw)

    with sdpa_kernel(SDPBackend.MATH):  # torch's CPU flash kernel has no double backward
        assert torch.autograd.gradcheck(f, (x, *params), fast_mode=True)
        assert torch.autograd.gradgradcheck(f, (x, *params), fast_mode=True)


@pytest.mark.parametrize("heads", LAYOUTS)
@pytest.mark.parametrize("frozen, x_grad", [(("qkv",), False), (("qkv", "out_proj"), False), (("out_proj",), True)])
@pytest.mark.parametrize("offload", [False, True])
def test_partial_requires_grad_offload_and_retain_graph_give_the_plain_bits(heads, frozen, x_grad, offload):
    def run(recompute: bool) -> list:
        layer = _layer(heads, recompute)
        for n, p in layer.named_parameters():
            p.requires_grad_(not n.startswith(frozen))
        x = torch.randn(2, 5, 8, dtype=D64, generator=torch.Generator().manual_seed(1)).requires_grad_(x_grad)
        with torch.autograd.graph.save_on_cpu() if offload else contextlib.nullcontext():
            y = layer(x)
            if not y.requires_grad:
                return [y]
            loss = y.square().sum()
            loss.backward(retain_graph=True)
            loss.backward()
        return [y.detach(), x.grad] + [p.grad for p in layer.parameters()]

    assert _same(run(True), run(False))


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # vmap of torch's CPU flash kernel
def test_deterministic_algorithms_and_forward_mode_ad_and_torch_func():
    for heads in ("attention:2,laplacian:2", "attention:2,heat(t=0.5, learnable=True):2"):
        x = torch.randn(2, 5, 8, dtype=D64)
        tangent = torch.randn_like(x)
        res = []
        for recompute in (False, True):
            layer = _layer(heads, recompute)
            xg = x.clone().requires_grad_()
            with sdpa_kernel(SDPBackend.MATH), fwAD.dual_level():  # forward over reverse, no torch.func
                y = layer(fwAD.make_dual(xg, tangent))
                primal, tan = fwAD.unpack_dual(y)
                primal.square().sum().backward()
            res.append([tan, xg.grad])
        for a, b in zip(*res):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        layer = _layer(heads, True)
        with sdpa_kernel(SDPBackend.MATH):
            _, tj = jvp(layer, (x,), (tangent,))
        torch.testing.assert_close(tj, res[0][0], rtol=1e-12, atol=1e-12)
        xs = torch.stack([x, 2 * x])
        torch.testing.assert_close(vmap(layer)(xs), torch.stack([layer(x), layer(2 * x)]).detach(),
                                   rtol=1e-12, atol=1e-12)
    prior = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        outs = []
        for recompute, _ in itertools.product((False, True), (0, 1)):
            layer = _layer("attention:2,heat(t=1.0, steps=2):2", recompute)
            x = torch.randn(2, 5, 8, dtype=D64, generator=torch.Generator().manual_seed(3), requires_grad=True)
            layer(x).square().sum().backward()
            outs.append([x.grad] + [p.grad for p in layer.parameters()])
        assert all(_same(outs[0], o) for o in outs[1:])
    finally:
        torch.use_deterministic_algorithms(prior)


def test_triton_autograd_wiring_partial_inputs_retain_graph_offload_and_refusals(ops):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    c = torch.randn(2, 3, device=DEVICE, requires_grad=True)
    for need in [(False, False, True, False), (False, False, False, True)]:
        ins = [t.detach().requires_grad_(r) for t, r in zip((q, k, v, c), need)]
        ops.polynomial_attention(*ins).sum().backward()
        assert [t.grad is not None for t in ins] == list(need)
    assert not ops.polynomial_attention(*(t.detach() for t in (q, k, v, c))).requires_grad
    loss = ops.polynomial_attention(q, k, v, c).sum()
    loss.backward(retain_graph=True)
    first = q.grad.clone()
    loss.backward()
    torch.testing.assert_close(q.grad, 2 * first)
    q.grad = None
    with torch.autograd.graph.save_on_cpu():
        ops.polynomial_attention(q, k, v, c).sum().backward()
    torch.testing.assert_close(q.grad, first)
    y = ops.polynomial_attention(q, k, v, c)
    with torch.no_grad():
        v.mul_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    with fwAD.dual_level(), pytest.raises(NotImplementedError, match="jvp"):
        ops.polynomial_attention(fwAD.make_dual(q.detach(), torch.ones_like(q)), k.detach(), v.detach(), c.detach())
    with pytest.raises(RuntimeError, match="setup_context"):
        vmap(lambda a: ops.polynomial_attention(a, k.detach(), v.detach(), c.detach()))(q.detach()[None])
