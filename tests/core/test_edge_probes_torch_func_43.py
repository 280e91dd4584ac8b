"""Edge probes: ``torch.func`` over diffusionformer's layers and models (ensembles with ``stack_module_state``,
``functional_call`` with swapped parameters and buffers, ``vmap`` over the batch, per-sample gradients,
``jacrev`` / ``jvp`` / ``hessian`` against autograd and float64 finite differences).

Bugs found:

* ``DiffusionGPT.forward`` under ``torch.vmap`` over the token ids (the per-sample-gradient recipe,
  ``vmap(grad(loss), in_dims=(None, 0, 0))``) failed with "vmap: It looks like you're calling .item() on a
  Tensor": the CPU range check of the ids read a batched tensor on the host.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import functional_call, grad, stack_module_state, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from diffusionformer.models import DiffusionGPT, DiffusionGraphTransformer, GPTConfig, GraphTransformerConfig
from diffusionformer.nn import DiffusionAttention

f64 = torch.float64


def _gpt(heads, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, heads=heads, **kw)
    return DiffusionGPT(cfg).to(f64)


@pytest.mark.parametrize("heads", ["neutreno:1,attention:1", "value-residual:1,heat(learnable=True):1"])
def test_bug_gpt_per_sample_gradients_vmap_over_token_ids(heads):
    """Bug: ``vmap`` over the token ids of a ``DiffusionGPT`` (forward and per-sample gradients) failed with
    "vmap: It looks like you're calling .item() on a Tensor": the CPU check that ids lie in the vocabulary read
    the batched ids on the host. It now skips batched ids (as every value check does), and the per-sample
    gradients equal a loop of ``backward`` over single sequences."""
    model = _gpt(heads)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 11, (3, 8), generator=g)
    tgt = torch.randint(0, 11, (3, 8), generator=g)
    tgt[1, 5:] = -100
    logits = vmap(lambda i: model(i[None])[0][0])(idx)
    torch.testing.assert_close(logits, model(idx)[0], rtol=0, atol=1e-13)
    params = {n: p.detach() for n, p in model.named_parameters()}

    def loss(p, i, t):
        return functional_call(model, p, (i[None], t[None]))[1]

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, idx, tgt)
    for b in range(3):
        model.zero_grad()
        model(idx[b:b + 1], tgt[b:b + 1])[1].backward()
        for n, p in model.named_parameters():
            want = p.grad if p.grad is not None else torch.zeros_like(p)
            torch.testing.assert_close(per_sample[n][b], want, rtol=1e-10, atol=1e-12)
    # outside vmap the check still names the bad id
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.full((1, 4), 11))


def _fd_jvp(f, x, t, eps=1e-6):
    return (f(x + eps * t) - f(x - eps * t)) / (2 * eps)


def _dual_tangent(f, x, t):
    with fwAD.dual_level():
        out = fwAD.unpack_dual(f(fwAD.make_dual(x, t)))
    assert out.tangent is not None
    return out.primal, out.tangent


@pytest.mark.parametrize("frozen", [True, False])
@pytest.mark.parametrize("heads", ["laplacian:4", "attention:2,laplacian:1,heat(t=1.0, steps=3):1",
                                   "laplacian:1,heat(t=0.3, steps=1):1,attention:2"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_bug_forward_ad_through_fixed_affine_heads(heads, frozen, dtype):
    """Bug: a dual tensor (``torch.autograd.forward_ad``) through a layer with a fixed ``a I + b P`` head
    (Laplacian, one-step heat) failed with "Trying to use forward AD with addcmul_out that does not support it
    because it is an out= function" when no parameter required grad (or under ``no_grad``): the layer combined
    the heads in place with ``out=`` kernels (and, for float32 coefficients not exact, in an
    ``autograd.Function`` without ``jvp``). The tangent now equals central finite differences in float64 and the
    primal the plain forward. (torch's CPU flash kernel has no forward AD itself: the SDPA math kernel here.)"""
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, heads).to(dtype).requires_grad_(not frozen)
    x, t = torch.randn(2, 5, 16, dtype=dtype), torch.randn(2, 5, 16, dtype=dtype)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True
    f = lambda z: layer(z, key_padding_mask=pad)  # noqa: E731
    with sdpa_kernel(SDPBackend.MATH):
        primal, tangent = _dual_tangent(f, x, t)
        with torch.no_grad():
            primal_ng, tangent_ng = _dual_tangent(f, x, t)
    ref = copy.deepcopy(layer).double()
    want = _fd_jvp(lambda z: ref(z, key_padding_mask=pad), x.double(), t.double())
    tol = dict(rtol=1e-6, atol=1e-7) if dtype == f64 else dict(rtol=1e-4, atol=1e-5)
    for p, tg in ((primal, tangent), (primal_ng, tangent_ng)):
        torch.testing.assert_close(p, f(x), rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-14)
        torch.testing.assert_close(tg.double(), want, **tol)


@pytest.mark.parametrize("heads", ["attention:2,laplacian:2", "heat(learnable=True):4", "neutreno:2,attention:2",
                                   "grand-nl:4"])
def test_bug_forward_ad_through_a_layer_on_a_graph(heads):
    """Bug: a dual tensor through a layer called with ``edge_index`` failed with "You must implement the jvp
    function for custom autograd.Function to use it with forward mode AD": ``backend="auto"`` picked the CSR
    kernels (``autograd.Function`` objects without ``jvp``), as it already avoided inside ``torch.func``
    transforms. It now takes the gather-scatter path; the tangent equals float64 finite differences."""
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, heads).double()
    ei = torch.tensor([[0, 1, 2, 3, 4, 1, 2], [1, 2, 3, 4, 0, 0, 0]])
    x, t = torch.randn(5, 16, dtype=f64), torch.randn(5, 16, dtype=f64)
    f = lambda z: layer(z, edge_index=ei)  # noqa: E731
    primal, tangent = _dual_tangent(f, x, t)
    torch.testing.assert_close(primal, f(x), rtol=0, atol=1e-14)
    torch.testing.assert_close(tangent, _fd_jvp(f, x, t), rtol=1e-6, atol=1e-7)


def test_bug_explicit_csr_backend_under_forward_ad_is_refused_naming_it():
    """Bug: ``diffuse_sparse(..., backend="csr")`` on dual tensors failed inside torch with "You must implement the
    jvp function for custom autograd.Function"; it is now a ValueError naming the back-end and the alternatives
    (as inside a ``torch.func`` transform). Outside a dual level the CSR kernels still run."""
    from diffusionformer.ops import diffuse_sparse

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(5, 2, 4, generator=g, dtype=f64) for _ in range(3))
    ei = torch.tensor([[0, 1, 2, 3, 4, 1], [1, 2, 3, 4, 0, 0]])
    want = diffuse_sparse(q, k, v, ei, [0.5, 0.5], backend="native")
    torch.testing.assert_close(diffuse_sparse(q, k, v, ei, [0.5, 0.5], backend="csr"), want, rtol=1e-12, atol=1e-14)
    with fwAD.dual_level(), pytest.raises(ValueError, match="backend='csr'.*forward-mode AD.*'native'"):
        diffuse_sparse(fwAD.make_dual(q, torch.ones_like(q)), k, v, ei, [0.5, 0.5], backend="csr")


@pytest.mark.parametrize("task", ["node", "graph"])
def test_bug_graph_transformer_global_attention_ensemble_and_vmap(task):
    """Bug: ``vmap`` over a ``DiffusionGraphTransformer(global_attention=True)`` called with ``batch`` (an ensemble
    of seeds through ``stack_module_state`` + ``functional_call``, or a vmap over node features) failed with
    "vmap: index_put_(self, *extra_args) is not possible because there exists a Tensor `other` ... vmapped": the
    global attention padded the nodes with PyG's ``to_dense_batch`` (an in-place write of the batched features
    into an unbatched zero tensor). Under vmap the padding now takes the out-of-place gather; the outputs equal
    the loop over the models (and over the feature sets)."""
    cfg = GraphTransformerConfig(in_channels=5, num_classes=3, dim=16, depth=2, num_heads=2, task=task,
                                 heads="neutreno:1,laplacian:1", global_attention=True)
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        models.append(DiffusionGraphTransformer(cfg).to(f64).eval())
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 7, 5, generator=g, dtype=f64)
    ei = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 1], [1, 2, 0, 4, 5, 6, 3, 0]])
    batch = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")
    got = vmap(lambda p, b: functional_call(base, (p, b), (x[0], ei, batch)))(params, buffers)
    want = torch.stack([m(x[0], ei, batch) for m in models])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-13)
    model = models[1]
    got = vmap(lambda xx: model(xx, ei, batch))(x)
    torch.testing.assert_close(got, torch.stack([model(xx, ei, batch) for xx in x]), rtol=0, atol=1e-13)


@pytest.mark.parametrize("heads", ["attention:2,laplacian:1,heat(t=1.0, steps=3):1,ppr(steps=4):1",
                                   "attention:1,heat(learnable=True):2,polynomial:2",
                                   "neutreno:2,value-residual:1,differential:2",
                                   "attnscale:2,grand-nl:1,heat-exact(learnable=True):2"])
def test_pins_stack_module_state_ensemble_equals_the_loop(heads):
    """The PyTorch model-ensembling recipe (``stack_module_state``, a meta-device base, ``vmap(functional_call)``)
    over seeds of a mixed layer, learned operator parameters perturbed per seed, equals the loop over the models
    under causal padding, and ``functional_call`` with another seed's parameters and buffers equals that model."""
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        m = DiffusionAttention(20, 5, heads, causal=True).to(f64)
        with torch.no_grad():
            for name, p in m.named_parameters():
                if name.startswith("operators"):
                    p.add_(0.2 * torch.randn_like(p))
        models.append(m)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 6, 20, generator=g, dtype=f64)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")
    got = vmap(lambda p, b: functional_call(base, (p, b), (x,), {"key_padding_mask": pad}))(params, buffers)
    want = torch.stack([m(x, key_padding_mask=pad) for m in models])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-13)
    other = {**dict(models[2].named_parameters()), **dict(models[2].named_buffers())}
    torch.testing.assert_close(functional_call(models[0], other, (x,), {"key_padding_mask": pad}), want[2],
                               rtol=0, atol=1e-13)
