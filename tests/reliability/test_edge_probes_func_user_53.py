"""Edge probes: a ``torch.func`` user's walk over the layers and models (``functional_call`` with swapped parameters
and buffers, per-sample gradients, ensembles, ``jacrev``/``jacfwd``/``hessian``, ``jvp``/``linearize``, ``grad``
with ``has_aux``, chunked ``vmap``, dropout under each ``randomness``, the same compiled), each result against an
independent reference (a loop of ``torch.autograd.grad`` over samples, float64 autograd Hessians).

Bugs found:

* :func:`torch.func.linearize` (and :func:`~torch.fx.experimental.proxy_tensor.make_fx`, which it traces with) of a
  layer with a learned operator, or of a GPT, failed with "trying to get value out of a tracing tensor": the CPU
  value checks (finite coefficients, token ids in the vocabulary) read tensors make_fx traces.
* ``linearize`` of a layer with a padding mask on the materialised path (fixed heat/PPR heads), or with exact PPR
  heads, failed at each call of the jvp with "a leaf Variable that requires grad is being used in an in-place
  operation": the scores were masked (the exact PPR's diagonal written) in place, and linearize folds them into a
  constant.
* :class:`~diffusionformer.nn.DropPath` (ViT ``drop_path``) under ``vmap(..., randomness="different")`` (per-sample
  gradients in training) failed with "Cannot ask for different inplace randomness on an unbatched tensor".
* ``make_fx`` of a layer on a graph with the edges among its inputs failed ("Sparse CSR tensors do not have
  strides"): ``backend="auto"`` took the CSR kernels under make_fx.
* ``backend="triton"`` inside a transform failed with torch's "it must override the setup_context staticmethod"; it
  is now the back-end's ValueError naming the transform and ``backend='auto'``.
* A layer moved to meta (an ensemble's base) called through ``functional_call`` with its state dict's tensors
  failed with torch's bare "Cannot copy out of meta tensor; no data!": the operators' non-persistent coefficient
  caches are in no state dict.

Works (pinned below): per-sample gradients equal the loop of backward passes (chunked too), ``grad`` with
``has_aux``, Hessians w.r.t. learned operator parameters and ``jacfwd(jacrev)`` equal float64 autograd, ``jvp`` and
``linearize`` agree with central differences, dropout's three ``randomness`` modes, ``compile(vmap(grad))``, and
plain calls after all of them (no cache keeps a transform's tensors). Documented, not changed: forward-mode AD and
double backward need the MATH SDPA kernel or ``backend="matrix"`` (torch's CPU flash kernel has neither); a fixed
``t``/``alpha`` buffer swapped by ``functional_call`` is not read (docs/design.md: it is architecture).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.func import functional_call, grad, hessian, jacfwd, jacrev, jvp, linearize, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from diffusionformer.models import DiffusionGPT, DiffusionViT, GPTConfig, ViTConfig
from diffusionformer.nn import DiffusionAttention, DropPath

f64 = torch.float64
MIXED = "attention:1,heat(learnable=True):1,ppr(learnable=True):1,polynomial:1"


def _layer(heads, seed=0, **kw):
    torch.manual_seed(seed)
    return DiffusionAttention(16, 4, heads, **kw).to(f64)


def _fd(f, x, t, eps=1e-6):
    return (f(x + eps * t) - f(x - eps * t)) / (2 * eps)


@pytest.mark.parametrize("heads", [MIXED, "attnscale:2,grand-nl:1,polynomial(basis='chebyshev'):1"])
def test_bug_linearize_and_make_fx_through_learned_operators(heads):
    """Bug: ``torch.func.linearize`` of a layer with a learned operator (and ``make_fx`` of it, or of a GPT) failed
    with "It appears that you're trying to get value out of a tracing tensor with aten._local_scalar_dense": the CPU
    checks that learned coefficients are finite (and GPT's that ids lie in the vocabulary) read tensors that make_fx
    traces. They stand aside there, as under vmap and fake tensors; the linearized jvp equals ``jvp`` and central
    differences, the traced graph the eager call."""
    layer = _layer(heads)
    g = torch.Generator().manual_seed(1)
    x, t = torch.randn(2, 5, 16, generator=g, dtype=f64), torch.randn(2, 5, 16, generator=g, dtype=f64)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True
    f = lambda z: layer(z, key_padding_mask=pad)  # noqa: E731
    with sdpa_kernel(SDPBackend.MATH):
        primal, lin = linearize(f, x)
        _, want = jvp(f, (x,), (t,))
        torch.testing.assert_close(primal, f(x), rtol=0, atol=1e-14)
        torch.testing.assert_close(lin(t), want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(want, _fd(f, x, t), rtol=1e-6, atol=1e-7)
    traced = make_fx(f)(x)
    torch.testing.assert_close(traced(x), f(x), rtol=0, atol=1e-14)
    # outside a trace the check still names the non-finite coefficient
    bad = copy.deepcopy(layer)
    with torch.no_grad():
        next(p for n, p in bad.named_parameters() if n.startswith("operators")).fill_(float("nan"))
    with pytest.raises(ValueError, match="(?i)finite"):
        bad(x)
    torch.manual_seed(0)
    gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16,
                                 heads="heat(learnable=True):1,attention:1")).double()
    idx = torch.randint(0, 11, (2, 8), generator=g)
    torch.testing.assert_close(make_fx(lambda i: gpt(i)[0])(idx)(idx), gpt(idx)[0], rtol=0, atol=1e-14)


@pytest.mark.parametrize("heads", ["heat(t=0.5, steps=3):2,ppr(steps=3):2", "ppr-exact:2,attention:2"])
@pytest.mark.parametrize("causal", [False, True])
def test_bug_linearize_with_a_padding_mask_on_the_materialised_path(causal, heads):
    """Bug: the jvp that ``torch.func.linearize`` returns for a layer of fixed heat/PPR heads (the materialised
    ``P``) under a padding mask, or of exact PPR heads, failed at each call with "a leaf Variable that requires grad
    is being used in an in-place operation": the scores were masked in place (and the exact PPR wrote the diagonal
    of its system in place), and linearize folds those tensors of the primal into constant parameters. Inside a
    transform they are written out of place; the tangent equals ``jvp`` and central differences in float64. (A
    ``differential`` head still fails so: torch's own ``F.rms_norm`` adds its eps in place.)"""
    layer = _layer(heads, causal=causal)
    g = torch.Generator().manual_seed(2)
    x, t = torch.randn(3, 5, 16, generator=g, dtype=f64), torch.randn(3, 5, 16, generator=g, dtype=f64)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[1, 3:] = True
    pad[2, :] = True  # a fully padded sequence: rows without keys
    f = lambda z: layer(z, key_padding_mask=pad)  # noqa: E731
    with sdpa_kernel(SDPBackend.MATH):  # the attention heads: no forward AD in torch's CPU flash kernel
        primal, lin = linearize(f, x)
        _, want = jvp(f, (x,), (t,))
        torch.testing.assert_close(lin(t), want, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(lin(2 * t), 2 * want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(primal, f(x), rtol=0, atol=1e-14)
    torch.testing.assert_close(want, _fd(f, x, t), rtol=1e-6, atol=1e-7)


def test_bug_drop_path_under_vmap_with_different_randomness():
    """Bug: ``DropPath`` (a ViT's ``drop_path``) under ``vmap(..., randomness="different")`` (per-sample gradients of
    a model in training) failed with "vmap: Cannot ask for different inplace randomness on an unbatched tensor": the
    keep mask was drawn in place into an unbatched tensor. Under vmap it is drawn out of place: one draw per sample
    ("different"), one for all ("same"), still refused under "error"; outside vmap the draws are those of before
    (``torch.func.grad`` under a seed drops what ``backward`` drops)."""
    drop = DropPath(0.5).train()
    x = torch.ones(64, 1, 3, 4)
    torch.manual_seed(0)
    out = vmap(lambda z: drop(z[None])[0], randomness="different")(x)
    kept = out[:, 0, 0, 0]
    assert set(kept.unique().tolist()) == {0.0, 2.0} and (out == kept[:, None, None, None]).all()
    same = vmap(lambda z: drop(z[None])[0], randomness="same")(x)
    assert same.unique().numel() == 1
    with pytest.raises(RuntimeError, match="randomness"):
        vmap(lambda z: drop(z[None])[0])(x)
    for dtype in (torch.float32, f64):
        xs = torch.randn(8, 3, 4, dtype=dtype)
        torch.manual_seed(3)
        g = grad(lambda z: drop(z).sum())(xs)
        torch.manual_seed(3)
        leaf = xs.clone().requires_grad_()
        drop(leaf).sum().backward()
        assert torch.equal(g, leaf.grad)
    # a ViT in training: per-sample gradients run under "different"; in eval they equal the loop of backward passes
    cfg = ViTConfig(input_size=(8, 8), in_channels=3, patch_size=4, num_classes=3, dim=16, depth=2, num_heads=2,
                    heads="ppr(learnable=True):1,attention:1", drop_path=0.5)
    torch.manual_seed(0)
    vit = DiffusionViT(cfg).double().train()
    img = torch.randn(3, 3, 8, 8, dtype=f64)
    params = {n: p.detach() for n, p in vit.named_parameters()}
    per_sample = vmap(grad(lambda p, z: functional_call(vit, p, (z[None],)).sum()), in_dims=(None, 0),
                      randomness="different")
    assert all(torch.isfinite(v).all() for v in per_sample(params, img).values())
    vit.eval()
    got = per_sample(params, img)
    for b in range(3):
        vit.zero_grad()
        vit(img[b:b + 1]).sum().backward()
        for n, p in vit.named_parameters():
            want = p.grad if p.grad is not None else torch.zeros_like(p)
            torch.testing.assert_close(got[n][b], want, rtol=1e-9, atol=1e-11, msg=n)


def test_bug_meta_base_called_with_state_dict_tensors_names_the_missing_caches():
    """Bug: a layer moved to meta (the base of an ensemble) called through ``functional_call`` with its state dict's
    tensors, or its parameters alone, failed inside torch with "Cannot copy out of meta tensor; no data!": the
    operators' fixed coefficients are non-persistent caches, in no state dict. It is now a ValueError naming the
    operator, its meta buffers and the way out; with every buffer (``named_buffers``) the call equals the model's."""
    layer = _layer("heat(t=0.5, steps=3):2,ppr(steps=3):1,polynomial(basis='chebyshev'):1")
    x = torch.randn(2, 5, 16, dtype=f64)
    base = copy.deepcopy(layer).to("meta")
    with pytest.raises(ValueError, match=r"operator 'heat'.*meta.*'_c'.*named_buffers"):
        functional_call(base, layer.state_dict(), (x,))
    with pytest.raises(ValueError, match="meta device but the layer's weights are on cpu"):
        functional_call(base, dict(layer.named_parameters()), (x,))
    state = {**dict(layer.named_parameters()), **dict(layer.named_buffers())}
    torch.testing.assert_close(functional_call(base, state, (x,)), layer(x), rtol=0, atol=0)


@pytest.mark.parametrize("heads", [MIXED, "neutreno:1,value-residual:1,differential:2"])
def test_per_sample_gradients_chunked_and_has_aux_equal_the_loop(heads):
    """``vmap(grad(loss))`` over a padded batch (chunked or not) equals a loop of ``torch.autograd.grad`` over single
    sequences; ``grad(..., has_aux=True)`` returns the output and the gradient of ``backward``."""
    layer = _layer(heads)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 5, 16, generator=g, dtype=f64)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[2, 2:] = True
    params = {n: p.detach() for n, p in layer.named_parameters()}

    def loss(p, z, m):
        return functional_call(layer, p, (z[None],), {"key_padding_mask": m[None]}).pow(2).sum()

    full = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, pad)
    chunked = vmap(grad(loss), in_dims=(None, 0, 0), chunk_size=2)(params, x, pad)
    names = [n for n, _ in layer.named_parameters()]
    for b in range(3):
        out = layer(x[b:b + 1], key_padding_mask=pad[b:b + 1]).pow(2).sum()
        want = torch.autograd.grad(out, list(layer.parameters()), allow_unused=True)
        for n, w in zip(names, want):
            w = torch.zeros_like(params[n]) if w is None else w
            torch.testing.assert_close(full[n][b], w, rtol=1e-9, atol=1e-11, msg=n)
            torch.testing.assert_close(chunked[n][b], full[n][b], rtol=1e-12, atol=1e-13, msg=n)

    def with_aux(p):
        out = functional_call(layer, p, (x,), {"key_padding_mask": pad})
        return out.pow(2).sum(), out.detach()

    got, out = grad(with_aux, has_aux=True)(params)
    torch.testing.assert_close(out, layer(x, key_padding_mask=pad), rtol=0, atol=0)
    want = torch.autograd.grad(layer(x, key_padding_mask=pad).pow(2).sum(), list(layer.parameters()),
                               allow_unused=True)
    for n, w in zip(names, want):
        torch.testing.assert_close(got[n], torch.zeros_like(got[n]) if w is None else w, rtol=1e-9, atol=1e-11)


def test_hessian_wrt_learned_operator_parameters_equals_float64_autograd():
    """``hessian`` (and ``jacfwd(jacrev)``) of a loss w.r.t. the learned operator parameters (heat ``t``, PPR logit,
    polynomial ``theta``) equals ``torch.autograd.functional.hessian`` over their flattened vector; ``jacrev`` and
    ``jacfwd`` of the output w.r.t. the input agree (MATH kernel: no forward AD in the CPU flash one); plain
    gradients afterwards are untouched (no cache keeps the transforms' tensors)."""
    layer = _layer(MIXED)
    x = torch.randn(1, 4, 16, generator=torch.Generator().manual_seed(5), dtype=f64)
    params = {n: p.detach() for n, p in layer.named_parameters()}
    ops = {n: p for n, p in params.items() if n.startswith("operators")}
    names = list(ops)
    f = lambda p: functional_call(layer, {**params, **p}, (x,)).pow(2).sum()  # noqa: E731
    H = hessian(f)(ops)

    def on_vector(v):
        split = torch.split(v, [ops[n].numel() for n in names])
        return f({n: s.view_as(ops[n]) for n, s in zip(names, split)})

    want = torch.autograd.functional.hessian(on_vector, torch.cat([ops[n].reshape(-1) for n in names]))
    got = torch.cat([torch.cat([H[a][b].reshape(ops[a].numel(), ops[b].numel()) for b in names], 1) for a in names])
    torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10)
    H2 = jacfwd(jacrev(f))(ops)
    for a in names:
        for b in names:
            torch.testing.assert_close(H2[a][b], H[a][b], rtol=1e-8, atol=1e-10)
    with sdpa_kernel(SDPBackend.MATH):
        torch.testing.assert_close(jacrev(layer)(x), jacfwd(layer)(x), rtol=1e-9, atol=1e-11)
    leaf = x.clone().requires_grad_()
    layer(leaf).sum().backward()
    torch.testing.assert_close(leaf.grad, torch.func.grad(lambda z: layer(z).sum())(x), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("heads", ["attention:4", "attention:2,heat(learnable=True):2", "ppr(steps=3):2,polynomial:2"])
def test_dropout_under_each_vmap_randomness(heads):
    """Attention dropout under vmap: refused under ``randomness="error"``, one mask for all samples under "same"
    (equal outputs for equal inputs), one per sample under "different"; ``grad`` under a seed equals ``backward``
    under that seed."""
    layer = _layer(heads, dropout=0.3).train()
    x = torch.randn(5, 16, dtype=f64).expand(3, 5, 16).contiguous()
    f = lambda z: layer(z[None])[0]  # noqa: E731
    with pytest.raises(RuntimeError, match="randomness"):
        vmap(f)(x)
    same = vmap(f, randomness="same")(x)
    # one mask: equal up to rounding (a batched kernel may round samples apart, ~1e-16 on an AVX-512 EPYC; masks
    # that differ change outputs by O(1))
    torch.testing.assert_close(same[1], same[0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(same[2], same[0], rtol=1e-12, atol=1e-14)
    different = vmap(f, randomness="different")(x)
    assert not torch.allclose(different[0], different[1])
    params = {n: p.detach() for n, p in layer.named_parameters()}
    torch.manual_seed(5)
    got = grad(lambda p: functional_call(layer, p, (x,)).sum())(params)
    torch.manual_seed(5)
    want = torch.autograd.grad(layer(x).sum(), list(layer.parameters()), allow_unused=True)
    for (n, _), w in zip(layer.named_parameters(), want):
        torch.testing.assert_close(got[n], torch.zeros_like(got[n]) if w is None else w, rtol=1e-12, atol=1e-13)


def test_compiled_per_sample_gradients_equal_eager():
    """``torch.compile(vmap(grad(loss)), fullgraph=True)`` (aot_eager) over a padded batch equals the eager
    transform, and eager transforms afterwards give the same bits as before."""
    layer = _layer("attention:2,heat(learnable=True):1,ppr(steps=3):1")
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(6), dtype=f64)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[1, 3:] = True
    params = {n: p.detach() for n, p in layer.named_parameters()}

    def loss(p, z, m):
        return functional_call(layer, p, (z[None],), {"key_padding_mask": m[None]}).pow(2).sum()

    eager = vmap(grad(loss), in_dims=(None, 0, 0))
    want = eager(params, x, pad)
    torch._dynamo.reset()
    got = torch.compile(eager, backend="aot_eager", fullgraph=True)(params, x, pad)
    again = eager(params, x, pad)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-9, atol=1e-11)
        assert torch.equal(again[n], want[n])


def test_bug_explicit_triton_backend_inside_a_torch_func_transform_is_refused_naming_it():
    """Bug: a layer with ``backend="triton"`` inside ``grad``/``vmap``/``jvp`` failed inside torch with "In order
    to use an autograd.Function with functorch transforms ... it must override the setup_context staticmethod": the
    kernels' Functions have no functorch support. It is now the back-end's ValueError naming the transform and
    ``backend='auto'`` (as an explicit ``"csr"`` is refused there); outside a transform the kernels still run, and
    the ``"auto"`` layer's per-sample gradients equal the loop."""
    pytest.importorskip("triton")
    from diffusionformer.ops.triton.backend import triton_unsupported

    torch.manual_seed(0)
    layer = DiffusionAttention(16, 2, "heat(learnable=True):1,attention:1", backend="triton")
    x = torch.randn(2, 5, 16)
    q = torch.randn(2, 2, 5, 8)
    if triton_unsupported(q, q, q, None, False) is not None:
        pytest.skip(f"the Triton back-end does not run here: {triton_unsupported(q, q, q, None, False)}")
    plain = layer(x)
    params = {n: p.detach() for n, p in layer.named_parameters()}
    match = r"backend='triton' does not support a torch.func transform.*backend='auto'"
    with pytest.raises(ValueError, match=match):
        grad(lambda p: functional_call(layer, p, (x,)).sum())(params)
    with pytest.raises(ValueError, match=match):
        vmap(lambda z: layer(z[None])[0])(x)
    with pytest.raises(ValueError, match=match):
        jvp(layer, (x,), (torch.ones_like(x),))
    torch.testing.assert_close(layer(x), plain, rtol=0, atol=0)
    auto = copy.deepcopy(layer)
    auto.backend = "auto"
    got = vmap(grad(lambda p, z: functional_call(auto, p, (z[None],)).pow(2).sum()), in_dims=(None, 0))(params, x)
    for b in range(2):
        want = torch.autograd.grad(auto(x[b:b + 1]).pow(2).sum(), list(auto.parameters()))
        for (n, _), w in zip(auto.named_parameters(), want):
            torch.testing.assert_close(got[n][b], w, rtol=1e-4, atol=1e-5, msg=n)


@pytest.mark.parametrize("heads", ["attention:2,heat(learnable=True):1,ppr(steps=3):1", "grand-nl:2,attention:2"])
def test_bug_make_fx_with_the_edges_as_an_input(heads):
    """Bug: ``make_fx`` of a layer on a graph with ``edge_index`` among the traced inputs failed with "trying to get
    value out of a tracing tensor" (the CPU sortedness test of the CSR layout's edge keys) or "Sparse CSR tensors do
    not have strides": ``backend="auto"`` took the CSR kernels, which it avoids under torch.compile already. Traced,
    the edges are gathered and scattered: the graph gives the eager output for other edges of the same count too;
    ``linearize`` over the nodes (edges closed over) equals ``jvp``."""
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, heads).double()
    x, t = torch.randn(5, 16, dtype=f64), torch.randn(5, 16, dtype=f64)
    ei = torch.tensor([[0, 1, 2, 3, 4, 1, 2, 0], [1, 2, 3, 4, 0, 0, 0, 3]])
    other = torch.tensor([[4, 3, 2, 1, 0, 0, 1, 2], [0, 0, 1, 1, 2, 3, 4, 4]])
    traced = make_fx(lambda z, e: layer(z, edge_index=e))(x, ei)
    for e in (ei, other):
        torch.testing.assert_close(traced(x, e), layer(x, edge_index=e), rtol=1e-12, atol=1e-13)
    f = lambda z: layer(z, edge_index=ei)  # noqa: E731
    _, lin = linearize(f, x)
    torch.testing.assert_close(lin(t), jvp(f, (x,), (t,))[1], rtol=1e-10, atol=1e-12)
