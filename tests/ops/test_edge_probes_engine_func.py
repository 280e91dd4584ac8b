"""Edge-case probes: the dense engine (``ops/engine.py``, ``ops/dense.py``, ``ops/_checks.py``), the functional API
and ``DiffusionAttention``'s forward dispatch under ``torch.func`` transforms and other demanding PyTorch usage,
against explicit float64 matrices ``P = softmax(q k^T / sqrt(C) + mask)`` and ``f(P) = sum_k c_k P^k``.

Found and fixed (each pinned by a "Bug:" test below):

* ``torch.vmap`` over ``diffuse`` with static coefficients of degree <= 1 (the Laplacian ``[1, -1]``, any fixed
  ``a I + b P`` head) and over every ``DiffusionAttention`` with such a head (``laplacian``, ``ppr(steps=1)``)
  failed with torch's "Batching rule not implemented for aten::addcmul.out" (or ``aten::sub.out``): a batched
  tensor reports ``requires_grad=False`` and the affine combination took its in-place ``out=`` path;
* ``torch.func.grad`` / ``vjp`` / ``jacrev`` through a float32 fixed affine head whose coefficients are not exact
  in the dtype (``ppr(alpha=0.3, steps=1)``, ``heat(steps=1)``, static ``[0.3, 0.7]``) failed with "In order to
  use an autograd.Function with functorch transforms ... it must override the setup_context staticmethod"
  (``engine.AffineHeads``). Inside a transform the combination now takes stock out-of-place operations;
* ``torch.vmap`` over a float ``attn_mask`` or over coefficient tensors failed in the CPU value checks ("vmap: It
  looks like you're attempting to use a Tensor in some data-dependent control flow"): ``checks_values`` now skips
  tensors batched by vmap, as it skips compiled and fake tensors;
* ``torch.vmap`` over a mask alone (``q``, ``k``, ``v`` shared) on the materialised-``P`` back-end (``"matrix"``,
  and ``"auto"`` for K-step heads) failed with "output with shape [...] doesn't match the broadcast shape": the
  mask was applied in place to the unbatched scores.

Probed and found working (pinned below): float64 ``gradcheck`` and ``gradgradcheck`` of attention, Laplacian,
heat (Taylor, Euler), PPR, learned polynomial and mixed rows on ``"matrix"`` and ``"auto"`` with bool and float
masks and causal graphs, and on ``"sdpa"`` under ``sdpa_kernel(SDPBackend.MATH)``; a mixed layer (learned heat,
attention, PPR, Laplacian) against explicit float64 matrices, padded and causal; ``functional_call`` with new
parameter values, ``torch.func.grad``, per-sample gradients (``vmap(grad)``), ``jvp`` on ``"matrix"``;
transposed, step-sliced and stride-0 inputs, ``N = 1``, ``B = 0`` / ``N = 0``; ``requires_grad`` on some of
``q``, ``k``, ``v``, coefficients; ``no_grad`` / ``inference_mode`` / grad-mode outputs with the same bits and
inputs never written; ``use_deterministic_algorithms(True)``; bf16 autocast (float32 gradients, within 1e-2).

Found and not fixed (torch's kernels, not the library): on CPU the fused SDPA kernel
(``_scaled_dot_product_flash_attention_for_cpu``) has no double backward and no forward-mode AD, so
``create_graph=True`` through an input gradient, ``gradgradcheck``, ``jvp`` and ``jacfwd`` fail on ``"sdpa"`` (and
on ``"auto"`` whenever it picks the fused kernel), as for ``F.scaled_dot_product_attention`` itself; ``"matrix"``
or ``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`` runs them (pinned below).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck
from torch.func import functional_call, grad, jacrev, jvp, vjp, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

import diffusionformer.functional as DF
from diffusionformer import DiffusionAttention
from diffusionformer.operators import build_operator

f64 = torch.float64
B, H, N, C = 2, 3, 4, 2

#: static rows of every polynomial family (and a mixed layout), and learned ones
FAMILIES = {
    "attention": [0.0, 1.0],
    "laplacian": [1.0, -1.0],
    "heat-taylor": list(build_operator("heat(t=0.5, steps=3)").static_coefficients()),
    "heat-euler": list(build_operator("heat(t=0.7, steps=3, method='euler')").static_coefficients()),
    "ppr": list(build_operator("ppr(alpha=0.2, steps=3)").static_coefficients()),
    "mixed": [[1.0, -1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.5, 0.25, 0.15, 0.1]],
}


def _rand(*shape, seed, dtype=f64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=f64).to(dtype)


def _qkv(*lead, seed=0, dtype=f64):
    return tuple(_rand(*lead, H, N, C, seed=seed + i, dtype=dtype) for i in range(3))


def _masks():
    g = torch.Generator().manual_seed(7)
    bool_mask = torch.rand(B, 1, N, N, generator=g) > 0.35
    bool_mask[0, 0, 1] = False  # a row without keys
    float_mask = torch.randn(B, H, N, N, generator=g, dtype=f64)
    float_mask[1, 2, 0] = -math.inf
    float_mask[0, 1, 2, :2] = -math.inf
    return {"none": (None, False), "bool": (bool_mask, False), "float-causal": (float_mask, True)}


def _explicit(q, k, v, coeffs, mask=None, causal=False):
    """``sum_k c_k P^k v`` per head, float64, from an explicit softmax matrix (rows without keys: zero rows)."""
    q, k, v = q.double(), k.double(), v.double()
    n = q.shape[-2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    allowed = torch.ones(n, n, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed = allowed & mask
        else:
            s = s + mask.double()
    s = s.masked_fill(~allowed, -math.inf)
    ok = (s > -math.inf).any(-1, keepdim=True)
    P = torch.softmax(s.masked_fill(~ok, 0.0), -1).masked_fill(~ok, 0.0)
    c = torch.as_tensor(coeffs, dtype=f64)
    c = c.expand(q.shape[-3], -1) if c.dim() == 1 else c
    out, x = torch.zeros_like(v), v
    for j in range(c.shape[1]):
        out = out + c[:, j].view(-1, 1, 1) * x
        x = P @ x
    return out


# ---------------------------------------------------------------------------- bugs
@pytest.mark.parametrize("backend", ["auto", "sdpa"])
@pytest.mark.parametrize("coeffs", [[1.0, -1.0], [[1.0, -1.0], [0.0, 1.0], [0.3, 0.7]], [[0.3, 0.7], [0.2, 0.5], [0.0, 1.0]]],
                         ids=["laplacian", "laplacian-attention-inexact", "inexact"])
@pytest.mark.parametrize("dtype", [torch.float32, f64])
def test_bug_vmap_over_diffuse_with_static_affine_coefficients(backend, coeffs, dtype):
    """Bug: ``torch.vmap`` over ``diffuse`` with static coefficients of degree <= 1 failed with "Batching rule not
    implemented for aten::addcmul.out" (``aten::sub.out`` for a Laplacian beside inexact rows): inside vmap a tensor
    says ``requires_grad=False``, and the affine combination wrote ``P v`` in place with ``out=`` kernels, which
    vmap cannot batch. It now equals the loop over the batch, with and without gradients."""
    q, k, v = _qkv(5, B, dtype=dtype)
    mask = torch.rand(5, B, 1, N, N, generator=torch.Generator().manual_seed(1)) > 0.3
    f = lambda q, k, v, m: DF.diffuse(q, k, v, coeffs, attn_mask=m, backend=backend)  # noqa: E731
    want = torch.stack([f(q[i], k[i], v[i], mask[i]) for i in range(5)])
    torch.testing.assert_close(vmap(f)(q, k, v, mask), want, rtol=0, atol=2e-7 if dtype == torch.float32 else 1e-15)
    torch.testing.assert_close(_explicit(q, k, v, coeffs, mask), want.double(), rtol=1e-5, atol=1e-5)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    got = vmap(f)(*leaves, mask)
    grads = torch.autograd.grad(got.square().sum(), leaves)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_grads = torch.autograd.grad(torch.stack([f(ref[0][i], ref[1][i], ref[2][i], mask[i]) for i in range(5)])
                                    .square().sum(), ref)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("heads", ["laplacian:3", "ppr(alpha=0.3, steps=1):1,laplacian:1,attention:1",
                                   "heat(t=0.5, learnable=True):1,attention:1,laplacian:1"])
def test_bug_vmap_over_a_layer_with_fixed_affine_heads(heads):
    """Bug: ``torch.vmap`` over a ``DiffusionAttention`` with a Laplacian (or any fixed ``a I + b P``) head failed
    with "Batching rule not implemented for aten::addcmul.out": the layer's fused path combined ``a v + b P v`` in
    place. Per-sample outputs and per-sample gradients (``vmap(grad)``, with per-sample padding) now equal the
    batched call and one backward pass per sample."""
    torch.manual_seed(0)
    layer = DiffusionAttention(6, 3, heads).double()
    x = _rand(4, 5, 6, seed=3)
    pad = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0], [0, 1, 0, 0, 1], [0, 0, 0, 0, 1]], dtype=torch.bool)
    torch.testing.assert_close(vmap(lambda xx: layer(xx[None])[0])(x), layer(x), rtol=0, atol=1e-14)
    with torch.no_grad():
        torch.testing.assert_close(vmap(lambda xx: layer(xx[None])[0])(x), layer(x), rtol=0, atol=1e-14)
    params = {n: p.detach() for n, p in layer.named_parameters()}

    def loss(p, xx, m):
        return functional_call(layer, p, (xx[None],), {"key_padding_mask": m[None]}).square().sum()

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, pad)
    for i in range(4):
        layer.zero_grad()
        loss(dict(layer.named_parameters()), x[i], pad[i]).backward()
        for n, p in layer.named_parameters():
            torch.testing.assert_close(per_sample[n][i], p.grad, rtol=1e-12, atol=1e-12, msg=lambda m: f"{n}: {m}")


@pytest.mark.parametrize("heads", ["ppr(alpha=0.3, steps=1):1,laplacian:1,attention:1", "heat(t=0.3, steps=1):2,attention:1"])
def test_bug_torch_func_through_float32_inexact_affine_heads(heads):
    """Bug: ``torch.func.grad`` / ``vjp`` / ``jacrev`` through a float32 layer (the default dtype) with a fixed
    affine head whose coefficients are not exact in float32 (``ppr(alpha=0.3, steps=1)``: ``0.3 I + 0.7 P``)
    failed with "In order to use an autograd.Function with functorch transforms ... it must override the
    setup_context staticmethod": the combination ran ``engine.AffineHeads``. Inside a transform it now takes stock
    out-of-place operations (float32 scalars, as documented) and the gradients equal autograd's."""
    torch.manual_seed(0)
    layer = DiffusionAttention(6, 3, heads)
    x = _rand(2, 4, 6, seed=4, dtype=torch.float32)
    params = {n: p.detach() for n, p in layer.named_parameters()}
    grads = grad(lambda p: functional_call(layer, p, (x,)).square().sum())(params)
    ct = _rand(2, 4, 6, seed=5, dtype=torch.float32)
    (vjp_x,) = vjp(layer, x)[1](ct)
    layer.zero_grad()
    xx = x.clone().requires_grad_()
    layer(xx).square().sum().backward()
    for n, p in layer.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"{n}: {m}")
    (want_x,) = torch.autograd.grad(layer(xx), xx, ct)
    torch.testing.assert_close(vjp_x, want_x, rtol=1e-5, atol=1e-6)
    x1 = x[:1, :3]
    torch.testing.assert_close(jacrev(layer)(x1), torch.autograd.functional.jacobian(layer, x1), rtol=1e-5, atol=1e-6)
    rows = [[0.3, 0.7], [1.0, -1.0], [0.0, 1.0]]
    q, k, v = _qkv(B, seed=6, dtype=torch.float32)
    (gq,) = vjp(lambda q: DF.diffuse(q, k, v, rows), q)[1](torch.ones(B, H, N, C))
    qq = q.clone().requires_grad_()
    torch.testing.assert_close(gq, torch.autograd.grad(DF.diffuse(qq, k, v, rows).sum(), qq)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["auto", "sdpa", "matrix"])
def test_bug_vmap_over_float_masks_and_coefficient_tensors(backend):
    """Bug: ``torch.vmap`` over a float ``attn_mask`` or over coefficient tensors (many filters at once) failed in
    the CPU value checks with "vmap: It looks like you're attempting to use a Tensor in some data-dependent control
    flow" (``if not torch.isfinite(coeffs).all(): raise``). ``checks_values`` now skips batched tensors, as it skips
    compiled and fake ones; outside vmap the checks still raise."""
    q, k, v = _qkv(B)
    masks = _rand(5, B, H, N, N, seed=9)
    masks[:, 0, 1, 2] = -math.inf  # a row without keys in every mask
    coeffs = _rand(5, H, 3, seed=10)
    for c in ([1.0, -1.0], [0.5, 0.3, 0.2]):
        got = vmap(lambda m: DF.diffuse(q, k, v, c, attn_mask=m, backend=backend))(masks)
        for i in range(5):
            torch.testing.assert_close(got[i], _explicit(q, k, v, c, masks[i]), rtol=1e-12, atol=1e-12)
    got = vmap(lambda c: DF.diffuse(q, k, v, c, backend=backend, is_causal=True))(coeffs)
    for i in range(5):
        torch.testing.assert_close(got[i], _explicit(q, k, v, coeffs[i], causal=True), rtol=1e-12, atol=1e-12)
    bad = coeffs[0].clone()
    bad[1, 1] = math.inf
    with pytest.raises(ValueError, match="coeffs must be finite"):
        DF.diffuse(q, k, v, bad, backend=backend)
    with pytest.raises(ValueError, match="finite or -inf"):
        DF.diffuse(q, k, v, [1.0, -1.0], attn_mask=torch.full((N, N), math.nan, dtype=f64), backend=backend)


@pytest.mark.parametrize("backend", ["auto", "matrix"])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_bug_vmap_over_masks_alone_on_the_materialised_backend(backend, kind):
    """Bug: ``torch.vmap`` over the mask alone (the same ``q``, ``k``, ``v`` under many graphs) on ``"matrix"``
    (and ``"auto"``, which materialises ``P`` for K-step heads at small ``N``) failed with "output with shape
    [...] doesn't match the broadcast shape [...]": ``_attention_matrix`` applied the batched mask in place to the
    scores of the unbatched ``q`` and ``k``. A batched mask is now applied out of place."""
    q, k, v = _qkv(B)
    g = torch.Generator().manual_seed(11)
    if kind == "bool":
        masks = torch.rand(5, B, 1, N, N, generator=g) > 0.4
    else:
        masks = torch.randn(5, B, 1, N, N, generator=g, dtype=f64).masked_fill(torch.rand(5, B, 1, N, N, generator=g) > 0.7, -math.inf)
    for c in ([0.5, 0.3, 0.2], _rand(H, 4, seed=12)):
        got = vmap(lambda m: DF.diffuse(q, k, v, c, attn_mask=m, backend=backend))(masks)
        for i in range(5):
            torch.testing.assert_close(got[i], _explicit(q, k, v, c, masks[i]), rtol=1e-12, atol=1e-12)
    out, P = vmap(lambda m: DF.diffuse_with_weights(q, k, v, [0.5, 0.5], attn_mask=m, need_weights=True))(masks)
    for i in range(5):
        torch.testing.assert_close(P[i], DF.attention_matrix(q, k, attn_mask=masks[i]), rtol=0, atol=1e-15)


# ---------------------------------------------------------------------------- probed and found working
@pytest.mark.parametrize("label", sorted(_masks()))
@pytest.mark.parametrize("family", sorted(FAMILIES) + ["learned"])
def test_gradcheck_and_gradgradcheck_of_every_family_on_the_materialised_backend(family, label):
    """First and second derivatives in ``q``, ``k``, ``v`` (and learned coefficients) on ``"matrix"`` (which
    ``"auto"`` takes for K-step heads at this size), with bool, float and causal masks; values of both against the
    explicit float64 matrices."""
    q, k, v = (t.requires_grad_() for t in _qkv(B, seed=20))
    mask, causal = _masks()[label]
    if family == "learned":
        args = (q, k, v, _rand(H, 3, seed=21).requires_grad_())
        f = lambda q, k, v, c: DF.diffuse(q, k, v, c, attn_mask=mask, is_causal=causal, backend="matrix")  # noqa: E731
        want = _explicit(*args, mask, causal)
    else:
        args, c = (q, k, v), FAMILIES[family]
        f = lambda q, k, v: DF.diffuse(q, k, v, c, attn_mask=mask, is_causal=causal, backend="matrix")  # noqa: E731
        want = _explicit(q, k, v, c, mask, causal)
        auto = DF.diffuse(q, k, v, c, attn_mask=mask, is_causal=causal)
        torch.testing.assert_close(auto, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(f(*args), want, rtol=1e-12, atol=1e-12)
    assert gradcheck(f, args)
    assert gradgradcheck(f, args)


@pytest.mark.parametrize("coeffs", [[1.0, -1.0], [[1.0, -1.0], [0.0, 1.0], [0.3, 0.7]], [0.5, 0.3, 0.2]])
def test_the_fused_backend_double_backward_runs_on_the_math_kernel(coeffs):
    """torch's CPU flash kernel has no double backward (not the library's: ``F.scaled_dot_product_attention`` fails
    alike, "derivative for aten::_scaled_dot_product_flash_attention_for_cpu_backward is not implemented"); under
    ``sdpa_kernel(SDPBackend.MATH)`` the ``"sdpa"`` back-end passes ``gradgradcheck``."""
    q, k, v = (t.requires_grad_() for t in _qkv(B, seed=30))
    mask = _masks()["bool"][0]
    f = lambda q, k, v: DF.diffuse(q, k, v, coeffs, attn_mask=mask, backend="sdpa")  # noqa: E731
    with sdpa_kernel(SDPBackend.MATH):
        assert gradgradcheck(f, (q, k, v))


def _mixed_explicit(layer, x, pad, causal):
    """The mixed layer (learned heat K=4, attention, PPR K=3, Laplacian) from its weights, by explicit matrices."""
    b, n, d = x.shape
    h, c = 4, d // 4
    q, k, v = (t.view(b, n, h, c).transpose(1, 2) for t in (x @ layer.qkv.weight.T + layer.qkv.bias).split(d, -1))
    allowed = torch.ones(b, 1, n, n, dtype=torch.bool)
    if pad is not None:
        allowed = allowed & ~pad[:, None, None, :]
    if causal:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
    s = (q @ k.transpose(-1, -2) / math.sqrt(c)).masked_fill(~allowed, -math.inf)
    ok = allowed.any(-1, keepdim=True)
    P = torch.softmax(s.masked_fill(~ok, 0.0), -1).masked_fill(~ok, 0.0)
    t = layer.operators[0].t.reshape(())
    mp = torch.linalg.matrix_power
    fs = [sum(torch.exp(-t) * t**j / math.factorial(j) * mp(P[:, 0], j) for j in range(5)), P[:, 1],
          sum((0.2 * 0.8**j if j < 3 else 0.8**3) * mp(P[:, 2], j) for j in range(4)), torch.eye(n, dtype=f64) - P[:, 3]]
    out = torch.stack([f @ v[:, i] for i, f in enumerate(fs)], 1)
    return out.transpose(1, 2).reshape(b, n, d) @ layer.out_proj.weight.T + layer.out_proj.bias


@pytest.mark.parametrize("backend", ["auto", "sdpa", "matrix"])
@pytest.mark.parametrize("causal", [False, True])
def test_mixed_layer_matches_explicit_matrices_and_functional_call_gradients(backend, causal):
    torch.manual_seed(0)
    heads = "heat(t=0.7, steps=4, learnable=True):1,attention:1,ppr(alpha=0.2, steps=3):1,laplacian:1"
    layer = DiffusionAttention(8, 4, heads, backend=backend, causal=causal).double()
    x = _rand(2, 5, 8, seed=40)
    pad = torch.tensor([[0, 0, 0, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    for m in (None, pad):
        torch.testing.assert_close(layer(x, key_padding_mask=m), _mixed_explicit(layer, x, m, causal), rtol=1e-12, atol=1e-12)
    new = {n: p.detach() + 0.1 * _rand(*p.shape, seed=41) for n, p in layer.named_parameters()}
    got = functional_call(layer, new, (x,), {"key_padding_mask": pad})
    grads = grad(lambda p: functional_call(layer, p, (x,), {"key_padding_mask": pad}).square().sum())(new)
    with torch.no_grad():
        for n, p in layer.named_parameters():
            p.copy_(new[n])
    torch.testing.assert_close(got, _mixed_explicit(layer, x, pad, causal), rtol=1e-12, atol=1e-12)
    layer(x, key_padding_mask=pad).square().sum().backward()
    for n, p in layer.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-12, atol=1e-12, msg=lambda m: f"{n}: {m}")
    t = layer.operators[0].t.detach().clone().requires_grad_()
    assert gradcheck(lambda xx, t: functional_call(layer, {"operators.0.t": t}, (xx,), {"key_padding_mask": pad}),
                     (x.clone().requires_grad_(), t))


def test_forward_mode_ad_on_the_materialised_backend():
    """``jvp`` (forward-mode AD) runs on ``"matrix"`` (the CPU fused kernel has none) and equals central differences."""
    torch.manual_seed(0)
    layer = DiffusionAttention(6, 3, "heat(t=0.5, learnable=True):1,laplacian:1,heat-exact:1", backend="matrix").double()
    x, t = _rand(2, 4, 6, seed=50), _rand(2, 4, 6, seed=51)
    _, tangent = jvp(layer, (x,), (t,))
    fd = (layer(x + 1e-6 * t) - layer(x - 1e-6 * t)) / 2e-6
    torch.testing.assert_close(tangent, fd, rtol=1e-7, atol=1e-7)


def _layouts(dtype):
    g = lambda *s: _rand(*s, seed=sum(s), dtype=dtype)  # noqa: E731
    yield "transposed", tuple(g(B, N, H, C + i).transpose(1, 2)[..., :C] for i in range(3))
    yield "stepped", (g(B, H, 2 * N, 2 * C)[:, :, ::2, ::2], g(B, H, 2 * N, 2 * C + 1)[:, :, ::2, 1::2],
                      g(B, H, 2 * N, 3 * C)[:, :, ::2, ::3])
    yield "stride-0", (g(1, 1, N, C).expand(B, H, N, C), g(B, 1, N, C).expand(B, H, N, C), g(1, H, 1, C).expand(B, H, N, C))
    yield "all-stride-0", (g(1, 1, 1, 1).expand(B, H, N, C), g(1, 1, 1, 1).expand(B, H, N, C), g(1, 1, 1, C).expand(B, H, N, C))


@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_strided_inputs_and_grad_modes_give_the_explicit_result_and_leave_inputs_alone(dtype):
    tol = 1e-12 if dtype == f64 else 2e-6
    coeffs = [FAMILIES["laplacian"], FAMILIES["mixed"], [[1.0, -1.0], [0.3, 0.7], [0.0, 1.0]],
              torch.tensor(FAMILIES["mixed"], dtype=dtype)]
    for label, (q, k, v) in _layouts(dtype):
        for mask, causal in _masks().values():
            mask = mask if mask is None or mask.dtype == torch.bool else mask.to(dtype)
            saved = [t.clone() for t in (q, k, v)]
            for c in coeffs:
                want = _explicit(q, k, v, c, mask, causal)
                for backend in ("auto", "sdpa", "matrix"):
                    outs = [DF.diffuse(q, k, v, c, attn_mask=mask, is_causal=causal, backend=backend)]
                    with torch.no_grad():
                        outs.append(DF.diffuse(q, k, v, c, attn_mask=mask, is_causal=causal, backend=backend))
                    with torch.inference_mode():
                        outs.append(DF.diffuse(q, k, v, c, attn_mask=mask, is_causal=causal, backend=backend))
                    torch.testing.assert_close(outs[0].double(), want, rtol=tol, atol=tol, msg=lambda m: f"{label} {backend}: {m}")
                    assert outs[0].dtype == dtype and all(torch.equal(outs[0], o) for o in outs[1:]), (label, backend)
            assert all(torch.equal(a, b) for a, b in zip(saved, (q, k, v))), label


def test_one_token_empty_batch_and_gradients_on_some_inputs():
    for shape in ((B, H, 1, C), (0, H, N, C), (B, H, 0, C)):
        for c in (FAMILIES["laplacian"], FAMILIES["mixed"], torch.tensor(FAMILIES["ppr"], dtype=f64)):
            for backend in ("auto", "sdpa", "matrix"):
                q, k, v = (torch.randn(shape, dtype=f64, requires_grad=True) for _ in range(3))
                out = DF.diffuse(q, k, v, c, backend=backend, is_causal=True)
                torch.testing.assert_close(out, _explicit(q, k, v, c, causal=True), rtol=1e-12, atol=1e-12)
                out.sum().backward()
                assert q.grad.shape == q.shape and v.grad.shape == v.shape
    base = _qkv(B, seed=60)
    c_all = _rand(H, 3, seed=61)
    mask = _masks()["bool"][0]
    w = _rand(B, H, N, C, seed=62)
    ref = [t.clone().requires_grad_() for t in (*base, c_all)]
    ref_grads = torch.autograd.grad((_explicit(*ref, mask) * w).sum(), ref)
    for which in ((True, False, False), (False, True, False), (False, False, True), (False, True, True, True)):
        for backend in ("auto", "sdpa", "matrix"):
            leaves = [t.clone().requires_grad_(r) for t, r in zip((*base, c_all), which + (False,) * (4 - len(which)))]
            out = DF.diffuse(*leaves[:3], leaves[3] if len(which) == 4 else [0.5, 0.3, 0.2], attn_mask=mask, backend=backend)
            if len(which) < 4:
                continue  # static rows: checked against the reference by the other tests
            got = torch.autograd.grad((out * w).sum(), [t for t in leaves if t.requires_grad])
            for a, b in zip(got, [g for g, r in zip(ref_grads, which) if r]):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        for backend in ("auto", "sdpa", "matrix"):
            leaves = [t.clone().requires_grad_(r) for t, r in zip(base, which[:3])]
            out = DF.diffuse(*leaves, c_all, attn_mask=mask, backend=backend)
            got = torch.autograd.grad((out * w).sum(), [t for t in leaves if t.requires_grad])
            for a, b in zip(got, [g for g, r in zip(ref_grads[:3], which[:3]) if r]):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_deterministic_algorithms_give_the_same_bits():
    torch.manual_seed(0)
    layer = DiffusionAttention(6, 3, "heat(t=0.5, learnable=True):1,laplacian:1,heat-exact:1", dropout=0.1)
    x = _rand(2, 4, 6, seed=70, dtype=torch.float32)
    pad = torch.tensor([[0, 0, 0, 1], [0, 0, 0, 0]], dtype=torch.bool)
    q, k, v = _qkv(B, seed=71, dtype=torch.float32)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs = []
        for _ in range(2):
            torch.manual_seed(3)
            layer.zero_grad()
            y = layer(x, key_padding_mask=pad)
            y.square().sum().backward()
            runs.append([y] + [p.grad.clone() for p in layer.parameters()]
                        + [DF.diffuse(q, k, v, c, backend=b, is_causal=True) for c in FAMILIES.values() for b in ("sdpa", "matrix")])
    finally:
        torch.use_deterministic_algorithms(before)
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_bf16_autocast_stays_close_to_float64_and_trains_float32_parameters():
    torch.manual_seed(0)
    heads = "heat(t=0.7, steps=4, learnable=True):1,attention:1,ppr(alpha=0.2, steps=3):1,laplacian:1"
    layer = DiffusionAttention(8, 4, heads)
    x = _rand(2, 5, 8, seed=80, dtype=torch.float32)
    pad = torch.tensor([[0, 0, 0, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x, key_padding_mask=pad)
    y.float().square().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()
               for p in layer.parameters())
    exact = layer.double()(x.double(), key_padding_mask=pad)
    torch.testing.assert_close(y.double(), exact, rtol=2e-2, atol=2e-2)
    q, k, v = _qkv(B, seed=81, dtype=torch.float32)
    for c in FAMILIES.values():
        for backend in ("auto", "sdpa", "matrix"):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = DF.diffuse(q, k, v, c, attn_mask=_masks()["bool"][0], backend=backend)
            torch.testing.assert_close(out.double(), _explicit(q, k, v, c, _masks()["bool"][0]), rtol=3e-2, atol=3e-2)
