"""``reset_parameters()`` on every operator, layer, block and model (the convention of torch's and PyG's layers:
k-fold loops re-initialise a model between folds, and deferred initialisation builds on the meta device,
``to_empty``, then calls it).

The reference is a model built anew under the same seed: the reset draws its random numbers in the order the
constructors drew them, so every parameter and buffer must be *equal* to the new model's, not merely alike in
distribution. PyG's convolutions draw twice at construction (their ``Linear`` initialises itself, then the
convolution resets it), so GCN and GIN are checked against PyG's own ``reset_parameters`` of each part instead.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from diffusionformer.models import (DINO, GCN, GIN, DiffusionGPT, DiffusionGraphTransformer, DiffusionViT,
                                    GCNConfig, GINConfig, GPTConfig, GraphBlock, create_model, list_models)
from diffusionformer.nn import Block, DiffusionAttention
from diffusionformer.nn.block import LayerScale, Mlp
from diffusionformer.operators import DiffusionOperator, build_operator, list_operators, operator_class

MIXED = ("ppr(alpha=0.2, steps=3, learnable=True):1,heat(t=0.5, learnable=True, steps=3):1,"
         "polynomial(steps=2, basis='chebyshev'):1,attention:1")
SMALL = {"gpt": dict(n_layer=2, n_embd=32), "vit": dict(depth=2, dim=32), "graph": dict(depth=2, dim=32),
         "gcn": dict(hidden=8), "gin": dict(hidden=8, num_layers=3), "dino": dict(depth=2, dim=32)}


def _example_spec(name: str) -> str:
    kwargs = operator_class(name).example_kwargs
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")" if kwargs else name


#: every registered operator, and the learned variants its example may not reach
OPERATOR_SPECS = [_example_spec(n) for n in list_operators()] + [
    "heat(t=0.5, learnable=True, steps=3)", "heat-exact(t=0.3, learnable=True)",
    "ppr(alpha=0.2, steps=4, learnable=True)", "attnscale(omega=0.25, learnable=True)",
    "polynomial(steps=3, init='heat(t=1.0, steps=3)', basis='chebyshev')", "polynomial(steps=2, init=[0.5, 0.25, 0.25])",
    "differential(depth=2)"]


def _perturb(module: nn.Module) -> None:
    """Every parameter and floating buffer moved away from its initial value (as training would)."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.rand_like(p) + 0.5)
        for name, b in module.named_buffers():
            if b.is_floating_point() and ("running" in name or name == "center"):
                b.add_(1.5)


def _assert_state_equal(got: nn.Module, expected: nn.Module) -> None:
    a, b = got.state_dict(), expected.state_dict()
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, differ


def _reset_matches_new(build, seed: int = 3) -> nn.Module:
    torch.manual_seed(seed)
    new = build()
    torch.manual_seed(seed + 100)
    model = build()
    _perturb(model)
    before = [id(p) for p in model.parameters()]
    torch.manual_seed(seed)
    model.reset_parameters()
    assert [id(p) for p in model.parameters()] == before  # in place: an optimizer holding them goes on
    _assert_state_equal(model, new)
    return model


@pytest.mark.parametrize("spec", OPERATOR_SPECS)
def test_every_operator_resets_to_its_constructor_values(spec):
    """A reset operator equals one built anew from its spec (the differential operator's random lambdas under one
    seed): learned times, PPR logits, omegas and polynomial coefficients (in the Chebyshev basis too)."""
    op = _reset_matches_new(lambda: _bound(build_operator(spec)))
    assert all(torch.isfinite(p).all() for p in op.parameters())


def _bound(op: DiffusionOperator) -> DiffusionOperator:
    if getattr(op, "head_dim", 0) is None:  # differential attention makes its parameters for a head width
        op.bind(head_dim=8)
    return op


@pytest.mark.parametrize("spec", OPERATOR_SPECS)
def test_every_operator_inside_a_layer(spec):
    _reset_matches_new(lambda: DiffusionAttention(32, 4, heads=f"{spec}:2,attention:2", qk_norm=True))


def test_polynomial_reset_is_the_initial_value_not_the_init_operators_trained_one():
    """An operator instance given as ``init`` that trains on afterwards does not move the reset's target."""
    init = build_operator("heat(t=1.0, learnable=True, steps=2)")
    torch.manual_seed(0)
    poly = build_operator("polynomial", steps=2, init=init)
    expected = poly.theta.detach().clone()
    with torch.no_grad():
        init.t.fill_(3.0)
        poly.theta.zero_()
    poly.reset_parameters()
    assert torch.equal(poly.theta, expected)


def test_polynomial_reset_in_float64_is_the_float64_initial_value():
    """A float32-built polynomial cast to float64 resets to the float64 coefficients (those of a float64-built
    one), not to float32-rounded ones."""
    spec = "polynomial(steps=3, init=[0.1, 0.2, 0.3, 0.4], basis='chebyshev')"
    poly = build_operator(spec).double()
    poly.reset_parameters()
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        ref = build_operator(spec)
    finally:
        torch.set_default_dtype(old)
    assert poly.theta.dtype == torch.float64 and torch.equal(poly.theta, ref.theta)
    assert not torch.equal(poly.theta, build_operator(spec).theta.double())  # float32 rounding would differ


def test_frozen_parameters_stay_frozen():
    layer = DiffusionAttention(16, 4, heads="heat(t=0.5, learnable=True, steps=2):2,attention:2")
    layer.operators[0].t.requires_grad_(False)
    layer.qkv.weight.requires_grad_(False)
    layer.reset_parameters()
    assert not layer.operators[0].t.requires_grad and not layer.qkv.weight.requires_grad
    assert layer.out_proj.weight.requires_grad


class _LearnedScale(DiffusionOperator):
    """A user's learned operator without reset_parameters."""

    name = "learned-scale-test"

    def __init__(self, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.scale = nn.Parameter(torch.ones(num_heads))

    @property
    def degree(self) -> int:
        return 1

    def coefficients(self):
        return torch.stack([torch.zeros_like(self.scale), self.scale], dim=-1)


def test_learned_operator_without_reset_is_refused_by_name():
    """A reset that skipped it would leave its trained values in a model that reads as new."""
    with pytest.raises(NotImplementedError, match=r"_LearnedScale holds learned parameters \['scale'\]"):
        _LearnedScale().reset_parameters()
    layer = DiffusionAttention(8, 2, heads=[_LearnedScale(), "attention"])
    with pytest.raises(NotImplementedError, match="_LearnedScale"):
        layer.reset_parameters()


def test_fixed_operators_have_nothing_to_reset():
    for spec in ("attention", "laplacian", "heat(t=0.5, steps=3)", "ppr(alpha=0.2, steps=3)", "heat-exact(t=0.5)"):
        op = build_operator(spec)
        before = {k: v.clone() for k, v in op.state_dict().items()}
        op.reset_parameters()
        assert all(torch.equal(before[k], v) for k, v in op.state_dict().items())


class _NormWithoutReset(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * self.weight


def test_block_part_with_parameters_and_no_reset_is_refused_by_path():
    blk = Block(8, 2, norm_layer=_NormWithoutReset)
    with pytest.raises(TypeError, match=r"Block\.norm1 \(_NormWithoutReset\) holds parameters \['weight'\]"):
        blk.reset_parameters()


def test_parts_without_parameters_are_searched():
    """A container without reset_parameters (a user's nn.Sequential MLP) has its layers reset."""
    _reset_matches_new(lambda: Block(8, 2, mlp_layer=lambda d: nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(),
                                                                              nn.Linear(2 * d, d))))


@pytest.mark.parametrize("build", [
    lambda: Block(16, 4, MIXED, layer_scale=0.1, qk_norm=True, norm_layer="rmsnorm"),
    lambda: Block(16, 4, "differential(depth=1):2,attention:2", num_kv_heads=2),
    lambda: Mlp(8, 12),
    lambda: Block(16, 4, mlp_layer="swiglu"),
    lambda: LayerScale(6, 0.3),
    lambda: GraphBlock(16, 4, MIXED, global_attention=True, edge_dim=3),
], ids=["block", "block-gqa-differential", "mlp", "block-swiglu", "layerscale", "graph-block"])
def test_layers_and_blocks_reset_to_a_new_ones_values(build):
    _reset_matches_new(build)


@pytest.mark.parametrize("name", [n for n in list_models() if n.split("-")[0] not in ("gcn", "gin")])
def test_every_transformer_preset_resets_to_a_new_models_values(name):
    """GPT (tied and untied, zero_init_proj), ViT, the graph transformer and DINO (teacher a copy of the student
    again, centre zero): the values of a model built anew under the same seed."""
    family = name.split("-")[0]
    kw = {"heads": MIXED} if family in ("gpt", "vit", "graph", "dino") else {}
    model = _reset_matches_new(lambda: create_model(name, **SMALL[family], **kw))
    if isinstance(model, DINO):
        x = torch.randn(2, model.config.in_channels, *model.config.input_size)
        assert torch.equal(model(x, output="teacher"), model(x, output="student"))


@pytest.mark.parametrize("cfg", [dict(tie_weights=True), dict(tie_weights=False, zero_init_proj=True),
                                 dict(rope=True, tie_weights=True)], ids=["tied", "untied-zero-proj", "rope"])
def test_gpt_reset_keeps_the_tie_and_matches_a_new_model(cfg):
    build = lambda: DiffusionGPT(GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16,  # noqa: E731
                                           laplacian_heads=1, **cfg))
    model = _reset_matches_new(build)
    assert (model.lm_head.weight is model.tok_emb.weight) == cfg["tie_weights"]


def test_reset_after_meta_construction_and_to_empty_is_a_new_model():
    """Deferred initialisation: built on meta, ``to_empty``, ``reset_parameters`` == built normally."""
    cfg = GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16,
                    heads="heat(t=0.5, learnable=True, steps=3):1,attention:1")
    torch.manual_seed(0)
    new = DiffusionGPT(cfg)
    with torch.device("meta"):
        lazy = DiffusionGPT(cfg)
    lazy = lazy.to_empty(device="cpu")
    torch.manual_seed(0)
    lazy.reset_parameters()
    _assert_state_equal(lazy, new)
    assert lazy.lm_head.weight is lazy.tok_emb.weight
    x = torch.randint(0, 13, (2, 8))
    out, ref = lazy(x), new(x)
    out, ref = (out[0], ref[0]) if isinstance(out, tuple) else (out, ref)
    assert torch.equal(out, ref)


def test_optimizer_goes_on_after_reset():
    torch.manual_seed(0)
    model = DiffusionViT(create_model("vit-digits", depth=1, dim=16).config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(4, model.config.in_channels, *model.config.input_size)
    model(x).sum().backward()
    opt.step()
    model.reset_parameters()
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()  # the optimizer's state is keyed by the same parameters
    assert all(p in opt.state for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("family", ["gcn", "gin"])
def test_pyg_models_reset_by_pygs_own_resets(family):
    """GCN and GIN: each convolution's PyG ``reset_parameters``, then the heads', in that order (equal values
    under one seed); GIN's batch-norm statistics cleared and a learned epsilon back to 0."""
    pytest.importorskip("torch_geometric")
    cfg = GCNConfig(in_channels=3, num_classes=2, hidden=8) if family == "gcn" else GINConfig(
        in_channels=3, num_classes=2, hidden=8, num_layers=3, train_eps=True)
    torch.manual_seed(0)
    model = (GCN if family == "gcn" else GIN)(cfg)
    _perturb(model)
    if family == "gin":
        with torch.no_grad():
            model.convs[0].eps.fill_(0.7)
    expected = (GCN if family == "gcn" else GIN)(cfg)
    torch.manual_seed(5)
    for conv in expected.convs:
        conv.reset_parameters()
    for head in ([expected.head] if family == "gcn" else list(expected.heads)):
        if hasattr(head, "reset_parameters"):
            head.reset_parameters()
    torch.manual_seed(5)
    model.reset_parameters()
    _assert_state_equal(model, expected)
    if family == "gin":
        assert float(model.convs[0].eps.detach()) == 0.0
        bn = model.convs[0].nn[1]
        assert torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean)) and int(bn.num_batches_tracked) == 0


def test_graph_transformer_with_positional_encoding_resets():
    from diffusionformer.models import GraphTransformerConfig
    pytest.importorskip("torch_geometric")
    _reset_matches_new(lambda: DiffusionGraphTransformer(GraphTransformerConfig(
        in_channels=3, num_classes=2, dim=16, depth=2, num_heads=2, pe="laplacian", pe_dim=2, edge_dim=2)))


def _state(model: nn.Module) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_a_refused_reset_leaves_the_model_as_it_was():
    """Bug: the refusal came from the part that could not be reset, after the parts before it had been reset (a
    half-reset model, no longer the trained one and not a new one either)."""
    torch.manual_seed(0)
    gpt = DiffusionGPT(GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16))
    gpt.blocks[1].attn.operators[0] = _LearnedScale(2)  # a user's learned operator, in the last block
    _perturb(gpt)
    before = _state(gpt)
    with pytest.raises(NotImplementedError, match="_LearnedScale"):
        gpt.reset_parameters()
    after = gpt.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert gpt.lm_head.weight is gpt.tok_emb.weight

    blk = Block(8, 2)
    blk.norm2 = _NormWithoutReset(8)  # after the attention, in registration order
    _perturb(blk)
    before = _state(blk)
    with pytest.raises(TypeError, match=r"Block\.norm2 \(_NormWithoutReset\)"):
        blk.reset_parameters()
    assert all(torch.equal(before[k], v) for k, v in blk.state_dict().items())


def test_a_refused_dino_reset_leaves_the_student_as_it_was():
    """Bug: a reparametrized projection head was refused after the student's ViT had been reset."""
    torch.manual_seed(0)
    dino = create_model("dino-digits", depth=1, dim=32)
    torch.nn.utils.parametrizations.weight_norm(dino.student.head.mlp[0])
    _perturb(dino)
    before = _state(dino)
    with pytest.raises(TypeError, match=r"DINO\.student\.head\.mlp\.0 \(ParametrizedLinear\) is reparametrized"):
        dino.reset_parameters()
    assert all(torch.equal(before[k], v) for k, v in dino.state_dict().items())
