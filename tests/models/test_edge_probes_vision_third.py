"""Edge probes of the ViT (third pass): attention maps, rollout inputs, memory layouts, operator maps."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.models.vit import DiffusionViT, ViTConfig, attention_rollout


def _vit(**kw):
    torch.manual_seed(0)
    cfg = dict(input_size=(4, 4), patch_size=2, dim=8, depth=2, num_heads=2)
    cfg.update(kw)
    return DiffusionViT(ViTConfig(**cfg))


def test_bug_attention_maps_restores_each_submodule_mode():
    """Bug: ``attention_maps`` restored the mode with ``self.train(was_training)``: a training model with a block
    kept in eval (frozen) came back with that block in training mode (its dropout on again)."""
    m = _vit(dropout=0.1)
    m.train()
    m.blocks[0].eval()
    before = {name: mod.training for name, mod in m.named_modules()}
    m.attention_maps(torch.randn(1, 1, 4, 4))
    assert {name: mod.training for name, mod in m.named_modules()} == before
    m.eval()
    m.attention_rollout(torch.randn(1, 1, 4, 4))
    assert not any(mod.training for mod in m.modules())


def test_bug_attention_rollout_refuses_mixed_dtypes_and_zero_heads():
    """Bug: ``attention_rollout`` given layers in float32 and float64 failed in torch's matmul ("expected scalar
    type Double but found Float", no layer named), layers on two devices in ``Tensor.item``, and maps with no head
    ``(B, 0, N, N)`` gave an all-NaN rollout silently (the mean over zero heads)."""
    a = torch.rand(1, 2, 3, 3)
    with pytest.raises(ValueError, match=r"maps\[1\] has dtype torch.float64"):
        attention_rollout([a, a.double()])
    with pytest.raises(ValueError, match=r"maps\[1\] has dtype torch.float32 on meta"):
        attention_rollout([a, a.to("meta")])
    with pytest.raises(ValueError, match="H >= 1"):
        attention_rollout([torch.rand(1, 0, 3, 3)])
    # one dtype throughout still works, and equals Abnar & Zuidema's product in float64
    b = torch.rand(1, 2, 3, 3, dtype=torch.float64)
    b = b / b.sum(-1, keepdim=True)
    eye = torch.eye(3, dtype=torch.float64)
    step = 0.5 * b.mean(1) + 0.5 * eye
    step = step / step.sum(-1, keepdim=True)
    torch.testing.assert_close(attention_rollout([b, b]), step @ step)


@pytest.mark.parametrize("size", [(4, 4), (4, 6)])
def test_channels_last_and_non_contiguous_images_give_the_contiguous_logits(size):
    m = _vit(input_size=size, in_channels=3).eval()
    x = torch.randn(2, 3, *size)
    ref = m(x)
    torch.testing.assert_close(m(x.contiguous(memory_format=torch.channels_last)), ref)
    xt = x.transpose(2, 3).contiguous().transpose(2, 3)  # same values, non-contiguous strides
    assert not xt.is_contiguous()
    torch.testing.assert_close(m(xt), ref)
    assert m(torch.randn(0, 3, *size)).shape == (0, 10)


@pytest.mark.parametrize("name", ["attention", "laplacian", "heat", "heat-exact", "ppr", "ppr-exact", "polynomial"])
def test_operator_maps_are_the_matrices_the_heads_apply(name):
    """``attention_maps(kind="operator")`` times each head's values equals the attention's concatenated head
    outputs (the input of ``out_proj``), in float64."""
    m = _vit(heads={1: f"{name}:2"}).double().eval()
    x = torch.randn(2, 1, 4, 4, dtype=torch.float64)
    ins, outs = {}, {}
    hooks = []
    for i, b in enumerate(m.blocks):
        hooks.append(b.register_forward_pre_hook(lambda mod, a, i=i: ins.__setitem__(i, a[0])))
        hooks.append(b.attn.out_proj.register_forward_pre_hook(lambda mod, a, i=i: outs.__setitem__(i, a[0])))
    with torch.no_grad():
        m(x)
    for h in hooks:
        h.remove()
    ops = m.attention_maps(x, kind="operator")
    with torch.no_grad():
        for i, b in enumerate(m.blocks):
            v = b.attn.qkv(b.norm1(ins[i]))[..., 16:].view(2, -1, 2, 4).transpose(1, 2)
            torch.testing.assert_close((ops[i] @ v).transpose(1, 2).reshape(2, -1, 8), outs[i])
