"""Edge probes: the layers and models under PyTorch's autograd machinery (hooks, anomaly mode, retained graphs,
double backward, frozen parameters, saved-tensor hooks), each against the same computation with the hooks or
modes off, in float64."""

from __future__ import annotations

import warnings

import pytest
import torch

from diffusionformer.models import DiffusionGPT, DiffusionGraphTransformer, GPTConfig, GraphTransformerConfig
from diffusionformer.nn import DiffusionAttention

f64 = torch.float64

#: every head type, four heads a layer (dim 8: head width 2)
DENSE_LAYOUTS = [
    "attention:2,laplacian:2",  # the layer's fused affine path
    "heat:2,polynomial(basis='chebyshev'):2",
    "heat(learnable=True):1,heat-exact:1,ppr(learnable=True):1,ppr-exact:1",
    "differential:2,neutreno:1,attnscale:1",
    "grand-nl:2,value-residual:1,polynomial:1",
]
SPARSE_LAYOUTS = [
    "attention:2,laplacian:2",
    "heat(learnable=True):1,ppr(learnable=True):1,polynomial(basis='chebyshev'):2",
    "differential:2,neutreno:1,attnscale:1",
    "grand-nl:2,value-residual:2",
]
_EDGES = torch.tensor([[0, 1, 2, 3, 4, 0, 2, 4], [1, 2, 3, 4, 0, 0, 2, 1]])


def _layer(heads, **kw):
    torch.manual_seed(0)
    return DiffusionAttention(8, 4, heads=heads, **kw).to(f64)


def _cases():
    # "auto" materialises P for the K-step heads at this size; "sdpa" takes the fused kernel (and, with recompute,
    # the engine's replay of its outputs)
    for h in DENSE_LAYOUTS:
        for backend in ("auto", "sdpa"):
            for rec in (False, True):
                yield pytest.param(h, False, rec, backend, id=f"dense-{backend}-{h}-rec{int(rec)}")
    for h in SPARSE_LAYOUTS:
        yield pytest.param(h, True, False, "auto", id=f"sparse-{h}")


def _setup(heads, sparse, rec, backend="auto"):
    layer = _layer(heads, recompute=rec, backend=backend)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*((5, 8) if sparse else (2, 5, 8)), dtype=f64, generator=g)

    def run(inp):
        return layer(inp, edge_index=_EDGES) if sparse else layer(inp)

    out = run(x.clone().requires_grad_())
    gout = torch.randn(out.shape, dtype=f64, generator=g)
    return layer, x, run, gout


def _reference(layer, x, run, gout):
    xx = x.clone().requires_grad_()
    params = list(layer.parameters())
    return torch.autograd.grad(run(xx), [xx, *params], gout, allow_unused=True)


def _assert_grads(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("heads", ["differential:1,attention:1", "neutreno:1,laplacian:1", "attnscale:2",
                                   "value-residual:1,heat(learnable=True):1"])
def test_bug_context_heads_double_backward_with_matrix_backend(heads):
    """Bug: a layer built with ``backend="matrix"`` (what docs/design.md names for double backward, and what its
    polynomial and exact heads then use) still ran the rival heads' propagations (differential, NeuTRENO,
    AttnScale, value residuals: ``RivalContext.attend``) through torch's fused CPU attention, so
    ``torch.autograd.grad(..., create_graph=True)`` followed by a backward raised "derivative for
    aten::_scaled_dot_product_flash_attention_for_cpu_backward is not implemented". The dense context now
    materialises ``P`` when the layer's back-end is ``"matrix"``: second-order gradients pass gradgradcheck
    (finite differences), and the output equals the fused kernel's."""
    torch.manual_seed(0)
    layer = DiffusionAttention(4, 2, heads=heads, backend="matrix").to(f64)
    fused = DiffusionAttention(4, 2, heads=heads, backend="sdpa").to(f64)
    fused.load_state_dict(layer.state_dict())
    x = torch.randn(1, 4, 4, dtype=f64, requires_grad=True)
    for kw in ({}, {"is_causal": True}, {"key_padding_mask": torch.tensor([[False, False, True, False]])}):
        torch.testing.assert_close(layer(x, **kw), fused(x, **kw), rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradgradcheck(lambda t: layer(t, is_causal=True), (x,), atol=1e-6, rtol=1e-5)
    assert torch.autograd.gradgradcheck(lambda t: layer(t), (x,), atol=1e-6, rtol=1e-5)


def test_bug_gpt_context_heads_gradient_penalty_with_matrix_backend():
    """Bug: a gradient penalty (double backward) through a ``DiffusionGPT(backend="matrix")`` with NeuTRENO and
    differential heads raised in torch's fused attention backward (the rival heads ignored the back-end). Its
    second-order term now matches a central difference of the first-order gradients."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=7, block_size=6, n_layer=2, n_head=2, n_embd=8, heads="neutreno:1,differential:1",
                    backend="matrix")
    model = DiffusionGPT(cfg).to(f64)
    idx = torch.randint(0, 7, (2, 5), generator=torch.Generator().manual_seed(2))
    w = model.lm_head.weight if hasattr(model, "lm_head") else next(model.parameters())

    def penalty_grad(create):
        loss = model(idx, idx)[1]
        (gw,) = torch.autograd.grad(loss, w, create_graph=create)
        return gw

    gw = penalty_grad(True)
    d = torch.randn(w.shape, dtype=f64, generator=torch.Generator().manual_seed(3))
    (hvp,) = torch.autograd.grad(gw, w, d)  # H d
    eps = 1e-6  # the central difference's error is O(eps^2) times large third derivatives (std 0.02 weights)
    with torch.no_grad():
        w.add_(eps * d)
    plus = penalty_grad(False)
    with torch.no_grad():
        w.sub_(2 * eps * d)
    minus = penalty_grad(False)
    with torch.no_grad():
        w.add_(eps * d)
    torch.testing.assert_close(hvp, (plus - minus) / (2 * eps), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("heads,sparse,rec,backend", list(_cases()))
def test_pins_full_backward_hooks_see_autograd_grads(heads, sparse, rec, backend):
    """Full backward (pre-)hooks on a layer: torch wraps inputs and outputs in views, which an in-place
    operation of the layer on them would refuse; the grads the hooks see equal ``autograd.grad`` of the output,
    and the input's gradient is unchanged by the hooks."""
    layer, x, run, gout = _setup(heads, sparse, rec, backend)
    ref = _reference(layer, x, run, gout)
    seen = {}
    hooks = [layer.register_full_backward_hook(lambda m, gi, go: seen.update(gi=gi, go=go)),
             layer.register_full_backward_pre_hook(lambda m, go: seen.update(pre=go))]
    try:
        xx = x.clone().requires_grad_()
        run(xx).backward(gout)
    finally:
        for h in hooks:
            h.remove()
    torch.testing.assert_close(seen["gi"][0], ref[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(seen["go"][0], gout, rtol=0, atol=0)
    torch.testing.assert_close(seen["pre"][0], gout, rtol=0, atol=0)
    _assert_grads([xx.grad, *[p.grad for p in layer.parameters()]], ref)


@pytest.mark.parametrize("heads,sparse,rec,backend", list(_cases()))
def test_pins_anomaly_retain_graph_and_saved_tensor_hooks(heads, sparse, rec, backend):
    """Anomaly mode (with NaN checks) raises no false alarm on any head type, custom autograd Functions
    included; two backward passes over a retained graph accumulate exactly twice; ``save_on_cpu`` and
    pack/unpack hooks that copy every saved tensor give the same gradients as plain autograd."""
    layer, x, run, gout = _setup(heads, sparse, rec, backend)
    ref = _reference(layer, x, run, gout)
    params = list(layer.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # anomaly mode's own "slows down" warning
        with torch.autograd.set_detect_anomaly(True, check_nan=True):
            xx = x.clone().requires_grad_()
            _assert_grads(torch.autograd.grad(run(xx), [xx, *params], gout, allow_unused=True), ref)
    layer.zero_grad(set_to_none=True)
    xx = x.clone().requires_grad_()
    out = run(xx)
    out.backward(gout, retain_graph=True)
    out.backward(gout)
    _assert_grads([xx.grad, *[p.grad for p in params]], [None if r is None else 2 * r for r in ref])
    layer.zero_grad(set_to_none=True)
    for ctx in (torch.autograd.graph.save_on_cpu(),
                torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t.clone())):
        with ctx:
            xx = x.clone().requires_grad_()
            _assert_grads(torch.autograd.grad(run(xx), [xx, *params], gout, allow_unused=True), ref)


@pytest.mark.parametrize("sparse", [False, True])
def test_pins_partial_freezing_and_input_only_grads(sparse):
    """Freezing one learned operator parameter (heat's ``t``, PPR's ``alpha_logit``, the polynomial's ``theta``,
    AttnScale's ``omega``) leaves it without a gradient and the others with the gradients of the unfrozen layer;
    every parameter frozen, ``autograd.grad`` w.r.t. the input alone equals the reference; a frozen input with
    trainable parameters gives the parameters' reference gradients."""
    heads = "heat(learnable=True):1,ppr(learnable=True):1,polynomial(basis='chebyshev'):1,attnscale:1"
    layer, x, run, gout = _setup(heads, sparse, False)
    names = [n for n, _ in layer.named_parameters()]
    ref = dict(zip(["x", *names], _reference(layer, x, run, gout)))
    learned = [n for n in names if n.startswith("operators.")]
    assert len(learned) == 4
    params = dict(layer.named_parameters())
    for frozen in learned:
        params[frozen].requires_grad_(False)
        try:
            layer.zero_grad(set_to_none=True)
            run(x).backward(gout)
            for n, p in params.items():
                if n == frozen:
                    assert p.grad is None
                else:
                    torch.testing.assert_close(p.grad, ref[n], rtol=1e-10, atol=1e-12)
        finally:
            params[frozen].requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    layer.requires_grad_(False)
    try:
        xx = x.clone().requires_grad_()
        (gx,) = torch.autograd.grad(run(xx), xx, gout)
        torch.testing.assert_close(gx, ref["x"], rtol=1e-10, atol=1e-12)
        # a non-leaf input made to require grad: its leaf gets the same gradient
        leaf = x.clone().requires_grad_()
        run(leaf * 1.0).backward(gout)
        torch.testing.assert_close(leaf.grad, ref["x"], rtol=1e-10, atol=1e-12)
    finally:
        layer.requires_grad_(True)


def test_pins_no_grad_forward_then_backward_raises():
    """An output computed under ``torch.no_grad()`` has no graph: ``backward`` raises torch's clear error (the
    in-place inference combination must not hand back a tensor that pretends to require grad)."""
    for heads in ("attention:2,laplacian:2", "heat(learnable=True):4", "differential:2,ppr-exact:2"):
        layer = _layer(heads)
        with torch.no_grad():
            out = layer(torch.randn(1, 3, 8, dtype=f64, requires_grad=True))
        assert not out.requires_grad
        with pytest.raises(RuntimeError, match="does not require grad"):
            out.sum().backward()


@pytest.mark.parametrize("heads", ["laplacian:1,heat(learnable=True):1", "neutreno:1,differential:1",
                                   "ppr-exact:1,polynomial:1"])
def test_pins_models_hooks_anomaly_and_save_on_cpu(heads):
    """Whole models (GPT, graph transformer with global attention) under backward hooks on the model and every
    attention layer, anomaly mode and ``save_on_cpu``: parameter gradients equal plain autograd's."""
    torch.manual_seed(0)
    models = [(DiffusionGPT(GPTConfig(vocab_size=7, block_size=6, n_layer=2, n_head=2, n_embd=8, heads=heads)).to(f64),
               (torch.randint(0, 7, (2, 5), generator=torch.Generator().manual_seed(4)),))]
    if "exact" not in heads:
        gt = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, depth=2,
                                                              num_heads=2, heads=heads, global_attention=True))
        models.append((gt.to(f64), (torch.randn(5, 3, dtype=f64), torch.tensor([[0, 1, 1, 2, 3, 4], [1, 0, 2, 1, 4, 3]]))))
    for model, args in models:
        def out():
            o = model(*args)
            return o[0] if isinstance(o, tuple) else o

        ps = list(model.parameters())
        o = out()
        gout = torch.randn(o.shape, dtype=f64, generator=torch.Generator().manual_seed(5))
        ref = torch.autograd.grad(o, ps, gout, allow_unused=True)
        hooks = [m.register_full_backward_hook(lambda *a: None) for m in model.modules()
                 if isinstance(m, DiffusionAttention)]
        seen = {}
        hooks.append(model.register_full_backward_hook(lambda m, gi, go: seen.update(go=go)))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # anomaly mode's and the hooks' warnings (integer model inputs)
                with torch.autograd.set_detect_anomaly(True, check_nan=True), torch.autograd.graph.save_on_cpu():
                    got = torch.autograd.grad(out(), ps, gout, allow_unused=True)
        finally:
            for h in hooks:
                h.remove()
        torch.testing.assert_close(seen["go"][0], gout, rtol=0, atol=0)
        _assert_grads(got, ref)


def _jacobians(f, x):
    """The Jacobian of ``f`` at ``x`` by one backward pass per output (the reference) and by batched output
    gradients (``vectorize=True``: ``autograd.grad(..., is_grads_batched=True)``)."""
    return (torch.autograd.functional.jacobian(f, x),
            torch.autograd.functional.jacobian(f, x, vectorize=True))


@pytest.mark.parametrize("heads", SPARSE_LAYOUTS)
def test_bug_sparse_layer_batched_output_gradients(heads):
    """Bug: ``torch.autograd.functional.jacobian(..., vectorize=True)`` (``autograd.grad(..., is_grads_batched=True)``)
    of a layer on a sparse graph raised "Sparse CSR tensors do not have is_contiguous" (AttnScale: "Batching rule not
    implemented for aten::addmm.out"): the CSR back-end's autograd Functions ran their sparse kernels on the batched
    output gradients. They now take their stock gather/scatter formulation there; the Jacobian equals the one built
    by a backward pass per output."""
    layer = _layer(heads)
    x = torch.randn(5, 8, dtype=f64, generator=torch.Generator().manual_seed(6))
    want, got = _jacobians(lambda t: layer(t, edge_index=_EDGES), x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_bug_csr_functional_batched_gradients_of_every_input():
    """Bug: batched output gradients through ``diffuse_sparse(backend="csr")`` failed in the CSR kernels; the
    gradients of ``q``, ``k``, ``v`` and learned coefficients now equal a loop of single backward passes, also under
    ``torch.func.vmap`` over ``torch.autograd.grad``."""
    from diffusionformer.ops import diffuse_sparse

    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(5, 2, 3, dtype=f64, generator=g, requires_grad=True) for _ in range(3))
    c = torch.randn(2, 3, dtype=f64, generator=g, requires_grad=True)
    out = diffuse_sparse(q, k, v, _EDGES, c, backend="csr")
    grads = torch.randn(4, *out.shape, dtype=f64, generator=g)
    want = [torch.stack(t) for t in zip(*[torch.autograd.grad(out, (q, k, v, c), gi, retain_graph=True) for gi in grads])]
    got = torch.autograd.grad(out, (q, k, v, c), grads, retain_graph=True, is_grads_batched=True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    got = torch.func.vmap(lambda gi: torch.autograd.grad(out, (q, k, v, c), gi, retain_graph=True))(grads)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bug_affine_heads_batched_output_gradients(dtype):
    """Bug: fixed ``a I + b P`` heads whose coefficients are not exact in the input dtype (``heat(steps=1)``) combine
    through the ``AffineHeads`` autograd Function, whose backward pass updated slices in place and wrote with
    ``out=``: a vectorized Jacobian (batched output gradients) raised "Batching rule not implemented for aten::alias"
    / "aten::mul.out". The batched backward pass now uses out-of-place products: the Jacobian equals the loop's
    bit for bit."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 4, heads="attention:1,heat(t=0.3, steps=1):1,laplacian:1,heat(t=0.5, steps=1):1")
    layer = layer.to(dtype)
    x = torch.randn(1, 4, 8, generator=torch.Generator().manual_seed(8)).to(dtype)
    want, got = _jacobians(layer, x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_bug_graph_transformer_batched_parameter_gradients():
    """Bug: per-output parameter gradients of a graph transformer in one batched call
    (``autograd.grad(..., is_grads_batched=True)``) failed in the CSR kernels of its sparse attention; they now
    equal a loop of single backward passes."""
    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, depth=2, num_heads=2,
                                                             heads="laplacian:1,heat(learnable=True):1")).to(f64)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(6, 3, dtype=f64, generator=g)
    out = model(x, torch.tensor([[0, 1, 1, 2, 3, 4, 4, 5], [1, 0, 2, 1, 4, 3, 5, 4]]))
    ps = list(model.parameters())
    grads = torch.randn(3, *out.shape, dtype=f64, generator=g)
    got = torch.autograd.grad(out, ps, grads, retain_graph=True, is_grads_batched=True)
    want = [torch.stack(t) for t in zip(*[torch.autograd.grad(out, ps, gi, retain_graph=True) for gi in grads])]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("heads", SPARSE_LAYOUTS)
def test_bug_sparse_layer_under_allow_mutation_on_saved_tensors(heads):
    """Bug: a sparse layer inside ``torch.autograd.graph.allow_mutation_on_saved_tensors()`` raised "Cannot access
    data pointer of Tensor that doesn't have storage": the context's dispatch mode identifies every ``out=``
    argument by its data pointer, and the CSR kernels write into sparse CSR tensors. ``backend="auto"`` now takes
    the gather-scatter path there (an explicit ``"csr"`` is refused with a clear error); the gradients equal plain
    autograd's even when the input is changed in place after the forward pass, as the context promises."""
    from diffusionformer.ops import diffuse_sparse

    layer, x, run, gout = _setup(heads, True, False)
    ref = _reference(layer, x, run, gout)
    params = list(layer.parameters())
    with torch.autograd.graph.allow_mutation_on_saved_tensors():
        leaf = x.clone().requires_grad_()
        inp = leaf * 1.0
        out = run(inp)
        inp.add_(1.0)  # a saved tensor changed in place: the context kept its original
        got = torch.autograd.grad(out, [leaf, *params], gout, allow_unused=True)
        q = torch.randn(5, 2, 3, dtype=f64)
        with pytest.raises(ValueError, match="allow_mutation_on_saved_tensors"):
            diffuse_sparse(q, q, q, _EDGES, [0.0, 1.0], backend="csr")
    _assert_grads(got, ref)
