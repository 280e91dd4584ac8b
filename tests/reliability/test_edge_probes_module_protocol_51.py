"""Edge probes: the layers and models as ordinary ``nn.Module`` objects under torch's module protocol (copies and
pickles, ``load_state_dict`` in its forms, ``torch.func`` ensembles, hooks, checkpointing, freezing, casts),
each against an independent reference: the same computation on a freshly built module, or float64."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap
from torch.utils.checkpoint import checkpoint

from diffusionformer.models import create_model
from diffusionformer.nn import Block, DiffusionAttention
from diffusionformer.operators import build_operator


def _gpt(**overrides):
    config = dict(n_layer=2, n_embd=32, heads="heat(t=0.5, learnable=True):2,laplacian:2")
    config.update(overrides)
    return create_model("gpt-char-tiny", **config)


# ----------------------------------------------------------------------------- bugs
@pytest.mark.parametrize("route", ["setitem", "set_submodule", "new_list"])
def test_bug_replaced_operator_is_bound_before_the_parameters_are_listed(route):
    """Bug: an operator that makes its parameters when the layer binds it (differential attention's ``lambda_*`` and
    ``subln``), put into ``layer.operators`` after construction (the documented replacement, or torch's
    ``set_submodule``), was bound only by the next forward call: ``model.parameters()`` before it left the
    parameters out, so an optimizer built as usual (before the first step) never trained them, silently;
    ``state_dict()`` left them out, and loading the state dict of a layer built with that operator raised
    "Unexpected key(s)". Now they are listed, saved, loaded and trained as the reference layer's (built with the
    operator; float64, exact)."""
    torch.manual_seed(0)
    ref = Block(16, 4, "differential:2,laplacian:2").double()
    model = Block(16, 4, "attention:2,laplacian:2").double()
    model.load_state_dict({k: v for k, v in ref.state_dict().items() if ".operators." not in k})
    op = build_operator("differential", num_heads=2).double()
    if route == "setitem":
        model.attn.operators[0] = op
    elif route == "set_submodule":
        model.set_submodule("attn.operators.0", op)
    else:
        model.attn.operators = nn.ModuleList([op, model.attn.operators[1]])
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert list(model.state_dict()) == list(ref.state_dict())
    assert model.load_state_dict(ref.state_dict()).missing_keys == []  # raised "Unexpected key(s)"
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    for m in (model, ref):  # one SGD step from an optimizer built before any call
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        m(x).square().sum().backward()
        opt.step()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.equal(p, q), name  # the lambdas were never updated
    assert torch.equal(model(x), ref(x))


def test_listing_a_layer_with_a_wrong_operator_does_not_raise_and_the_call_still_does():
    """A guard of the fix above: listing the modules of a layer whose operators cannot run (a module that is no
    operator swapped in, one operator too many) neither raises nor hides the layer's error, which its next call
    (and ``heads_spec``) still raise; a parameter-free ``qkv`` (whose device the bind reads from the layer's own
    parameters) plans once, without recursing."""
    layer = DiffusionAttention(16, 4, "attention:2,laplacian:2")
    layer.operators[1] = nn.Identity()
    assert len(list(layer.parameters())) == 4 and "operators.1" not in "".join(layer.state_dict())
    with pytest.raises(TypeError, match="expected DiffusionOperator modules, got Identity"):
        layer(torch.randn(1, 3, 16))
    layer.operators[1] = build_operator("laplacian", num_heads=2)
    layer.operators.append(build_operator("attention"))
    assert len(list(layer.modules())) == 9  # layer, qkv, out_proj, q/k norms, the list, 3 operators
    with pytest.raises(ValueError, match="expected 2 operators, one per head group"):
        layer(torch.randn(1, 3, 16))

    class _Triple(nn.Module):
        def forward(self, x):
            return torch.cat([x, x, x], dim=-1)

    layer = DiffusionAttention(16, 2, "attention").double()
    layer.qkv = _Triple()
    layer.operators[0] = build_operator("differential")
    lambdas = [p for n, p in layer.named_parameters() if n.startswith("operators.0.")]  # bound when listed
    assert len(lambdas) == 5 and {p.dtype for p in lambdas} == {torch.float64}
    assert layer(torch.randn(1, 3, 16, dtype=torch.float64)).dtype == torch.float64

    layer = DiffusionAttention(16, 4, "attention:2,laplacian:2")
    layer.operators[0] = build_operator("differential", num_heads=2)
    with torch.device("meta"):  # listed under another device context: bound on the layer's device
        assert {p.device.type for p in layer.parameters()} == {"cpu"}
    assert layer(torch.randn(1, 3, 16)).shape == (1, 3, 16)


def test_bug_print_of_a_block_shows_the_layer_scale_width_and_init():
    """Bug: ``print(model)`` of a ViT or Block with ``layer_scale`` showed a bare ``LayerScale()``, neither its width
    nor its init (CaiT's 1e-5 or 0.1: the setting that made the model), where every torch module shows its
    configuration (``LayerNorm((16,), eps=1e-05, ...)``). It is now ``LayerScale(16, init=0.0001)``, also built on
    the meta device."""
    block = Block(16, 4, layer_scale=1e-4)
    assert "(ls1): LayerScale(16, init=0.0001)" in repr(block)
    with torch.device("meta"):
        assert repr(Block(16, 4, layer_scale=0.1).ls2) == "LayerScale(16, init=0.1)"


# ----------------------------------------------------------------------------- behaviour that holds (guards)
@pytest.mark.parametrize("heads", ["heat(t=0.5, learnable=True):2,attention:2", "ppr:2,laplacian:2",
                                   "heat-exact:2,attnscale:2"])
def test_copies_and_pickles_compute_the_same_and_share_no_tensor(heads):
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, heads).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    y = layer(x)
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer)), torch.load(buf, weights_only=False)):
        assert torch.equal(other(x), y) and other.heads_spec() == layer.heads_spec()
        pairs = zip(layer.state_dict(keep_vars=True).items(), other.state_dict(keep_vars=True).items())
        for (name, a), (_, b) in pairs:
            assert torch.equal(a, b) and a.data_ptr() != b.data_ptr(), name


def test_ensemble_of_two_layers_by_stack_module_state_matches_each_layer():
    torch.manual_seed(0)
    a = DiffusionAttention(16, 4, "heat(t=0.5, learnable=True):2,ppr:2", recompute=True).double()
    b = copy.deepcopy(a)
    with torch.no_grad():
        for p in b.parameters():
            p.add_(0.01 * torch.randn_like(p))
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    params, buffers = stack_module_state([a, b])
    base = copy.deepcopy(a).to("meta")

    def loss(p, bu, x):
        return functional_call(base, (p, bu), (x,)).square().sum()

    grads = vmap(grad(loss), in_dims=(0, 0, None))(params, buffers, x)
    for i, m in enumerate((a, b)):
        m.zero_grad()
        m(x).square().sum().backward()
        for name, p in m.named_parameters():
            assert torch.allclose(grads[name][i], p.grad, rtol=1e-12, atol=1e-12), name


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpointed_block_gives_the_gradients_of_the_plain_block(use_reentrant):
    torch.manual_seed(0)
    blk = Block(16, 4, "heat(t=0.5, learnable=True):2,laplacian:2", dropout=0.2, attn_dropout=0.2).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(5)
    blk(x).square().sum().backward()
    ref = [p.grad.clone() for p in blk.parameters()] + [x.grad.clone()]
    blk.zero_grad()
    x.grad = None
    torch.manual_seed(5)
    checkpoint(blk, x, use_reentrant=use_reentrant).square().sum().backward()
    for r, g in zip(ref, [p.grad for p in blk.parameters()] + [x.grad]):
        assert torch.equal(r, g)


def test_gpt_tied_weights_listed_once_and_kept_by_copies_and_functional_call():
    torch.manual_seed(0)
    model = _gpt().eval()
    names = [n for n, _ in model.named_parameters()]
    assert len(names) == len(set(names)) and "lm_head.weight" not in names
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert other.lm_head.weight is other.tok_emb.weight
    idx = torch.randint(0, 65, (2, 8))
    w = torch.randn_like(model.tok_emb.weight)
    ref = copy.deepcopy(model)
    with torch.no_grad():
        ref.tok_emb.weight.copy_(w)
    assert torch.equal(functional_call(model, {"tok_emb.weight": w}, (idx,))[0], ref(idx)[0])


def test_frozen_operators_get_no_gradient_and_the_rest_trains():
    model = _gpt()
    for block in model.blocks:
        block.attn.operators.requires_grad_(False)
    idx = torch.randint(0, 65, (2, 8))
    model(idx, idx)[1].backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is None for n, g in grads.items() if ".operators." in n)
    assert all(g is not None for n, g in grads.items() if ".operators." not in n)
