"""A model config's operator instances are templates: every layer of every model built from the config gets its own
copy, as a spec string builds each layer's operators anew (and as ``nn.TransformerEncoder`` copies its layer)."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.models import (DiffusionGPT, DiffusionGraphTransformer, DiffusionViT, GPTConfig,
                                    GraphTransformerConfig, ViTConfig)
from diffusionformer.operators import HeatOperator, build_operator


def _gpt(heads):
    return DiffusionGPT(GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8, heads=heads))


def _vit(heads):
    return DiffusionViT(ViTConfig(input_size=(4, 4), patch_size=2, in_channels=1, num_classes=2, dim=8, depth=2,
                                  num_heads=2, heads=heads))


def _graph(heads):
    return DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, depth=2, num_heads=2,
                                                            heads=heads))


def _heat_modules(model):
    return [m for m in model.modules() if isinstance(m, HeatOperator)]


@pytest.mark.parametrize("build", [_gpt, _vit, _graph])
def test_bug_one_operator_instance_in_a_config_is_copied_per_layer_and_per_model(build):
    """Bug: ``heads=[op, op]`` (one learned heat operator for both layers) built both layers around the same
    instance, so the layers trained one diffusion time between them (``model.parameters()`` listed it once), and a
    second model built from the same config shared it with the first: training one changed the other. Each layer
    of each model now has its own copy; the config's instance stays as given, untrained."""
    op = build_operator("heat", t=0.5, learnable=True, num_heads=2)
    start = [p.detach().clone() for p in op.parameters()]
    one, two = build(heads=[op, op]), build(heads=[op, op])
    ops = _heat_modules(one) + _heat_modules(two)
    assert len(ops) == 4 and len({id(o) for o in ops}) == 4 and all(o is not op for o in ops)
    for o in ops:  # copies of the template: equal to it at the start
        assert all(torch.equal(a, b) for a, b in zip(o.parameters(), start))
    with torch.no_grad():
        for p in _heat_modules(one)[0].parameters():
            p.add_(1.0)
    untouched = [*_heat_modules(one)[1:], *_heat_modules(two), op]
    assert all(torch.equal(a, b) for o in untouched for a, b in zip(o.parameters(), start))


def test_heads_sharing_one_instance_within_a_layer_keep_sharing_it():
    """Pin: within one layer, a per-head list naming one instance twice keeps one operator shared by those heads (as
    :class:`~diffusionformer.nn.DiffusionAttention` does); only the layers are given copies."""
    op = build_operator("heat", t=0.5, learnable=True)
    model = _gpt(heads=[[op, op], "attention"])
    layer0 = [m for m in model.blocks[0].modules() if isinstance(m, HeatOperator)]
    assert len(layer0) == 1 and layer0[0] is not op
    assert not _heat_modules(model.blocks[1])


def test_spec_strings_and_instances_give_one_model():
    """The copy changes nothing else: a model from ``heads=[op, op]`` equals, to the bit, a model from the spec
    string of the same operator at the same seed."""
    op = build_operator("heat", t=0.5, learnable=True, num_heads=2)
    torch.manual_seed(0)
    from_instance = _gpt(heads=[op, op])
    torch.manual_seed(0)
    from_text = _gpt(heads="heat(t=0.5, learnable=True):2")
    idx = torch.randint(0, 16, (2, 8))
    assert torch.equal(from_instance(idx)[0], from_text(idx)[0])
    assert sum(p.numel() for p in from_instance.parameters()) == sum(p.numel() for p in from_text.parameters())


def test_bug_an_operator_that_cannot_be_copied_is_named_with_its_layer():
    """Bug: an operator torch cannot deep-copy (it holds a non-leaf tensor, as the old hook-based ``weight_norm``
    leaves) failed the model's build with torch's bare "Only Tensors created explicitly by the user ... support the
    deepcopy protocol", naming neither the operator nor the layer nor what to do."""
    op = build_operator("heat", t=0.5, learnable=True, num_heads=2)
    op.stale = op.t * 2  # a non-leaf tensor attribute: not deep-copyable
    with pytest.raises(TypeError, match=r"heads of layer 0: .*HeatOperator.* cannot be copied \(RuntimeError: .*\); "
                                        r"an operator in a model config is copied for every layer"):
        _gpt(heads=[op, "attention"])
