"""Fourth edge-case pass over the vision training path: ``DiffusionViT`` (1-D signals, RoPE attention maps, CPU bf16
autocast), the supervised image task (``ClassificationTask``: random crop with zero padding + horizontal flip, label
smoothing) against independent float64 references.

Probed (and found right, pinned below): the 1-D signal patch embedding against an explicit reshape; the attention maps
of RoPE and learned-position models against a float64 per-head softmax; a forward + backward of the GPU study's shape
(patch 8, 12 heads, MLP ratio 1) under CPU bf16 autocast (finite gradients on every parameter, loss within bf16 error of
float32); the task's training batch against a float64 pad-and-slice with the generator's own draws (offsets, then
flips of the width axis), its training loss against the label-smoothing formula, and its evaluation (no augmentation,
no smoothing) against plain cross-entropy. Also checked without a finding: batch size 0, numpy sizes in ViTConfig,
user RoPE positions of the wrong shape (named), half/bf16 models and multi-crop views on CPU.
No bug was found in this pass.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from diffusionformer.data.base import ClassificationData
from diffusionformer.experiments.tasks import ClassificationTask
from diffusionformer.models.vit import DiffusionViT, ViTConfig


def _perturb(model: torch.nn.Module, scale: float = 0.3) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))


def test_signal_patch_embedding_equals_an_explicit_reshape():
    torch.manual_seed(0)
    m = DiffusionViT(ViTConfig(input_size=(12,), in_channels=3, patch_size=4, dim=24, depth=1, num_heads=2,
                               num_classes=5, pool="mean")).double().eval()
    _perturb(m)
    x = torch.randn(2, 12, 3, dtype=torch.float64)  # (B, T, C)
    patches = x.reshape(2, 3, 4, 3).permute(0, 1, 3, 2).reshape(2, 3, -1)  # patch t: its 4 samples, (C, p) order
    ref = patches @ m.patch_embed.weight.reshape(24, -1).T + m.patch_embed.bias + m.pos_embed
    _, inter = m.forward_tokens(x, return_intermediates=True)
    torch.testing.assert_close(inter.embeddings, ref, rtol=0, atol=1e-13)


def test_attention_maps_equal_float64_softmax_with_rope_and_learned_positions(rotate_pairs):
    rotate = rotate_pairs
    for rope, pool in ((True, "cls"), (True, "mean"), (False, "cls")):
        torch.manual_seed(0)
        m = DiffusionViT(ViTConfig(input_size=(4, 6), in_channels=2, patch_size=2, dim=24, depth=2, num_heads=2,
                                   rope=rope, pool=pool)).double()
        _perturb(m)
        x = torch.randn(2, 2, 4, 6, dtype=torch.float64)
        maps = m.attention_maps(x)
        B, D, H, C, gh, gw, cls = 2, 24, 2, 12, 2, 3, pool == "cls"
        patches = x.reshape(B, 2, gh, 2, gw, 2).permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, -1)
        z = patches @ m.patch_embed.weight.reshape(D, -1).T + m.patch_embed.bias
        if cls:
            z = torch.cat([m.cls_token.expand(B, -1, -1), z], 1)
        if rope:
            pos = torch.tensor([(0, 0)] * cls + [(r + 1, q + 1) for r in range(gh) for q in range(gw)],
                               dtype=torch.float64)
            freq = 100.0 ** (-torch.arange(0, C // 2, 2, dtype=torch.float64) / (C // 2))
            angles = torch.cat([pos[:, :1] * freq, pos[:, 1:] * freq], dim=1)
        else:
            z = z + m.pos_embed
        with torch.no_grad():
            for layer, blk in enumerate(m.blocks):
                h = F.layer_norm(z, (D,), blk.norm1.weight, blk.norm1.bias)
                q, k, v = (t.reshape(B, -1, H, C) for t in F.linear(h, blk.attn.qkv.weight, blk.attn.qkv.bias).split(D, -1))
                if rope:
                    q, k = rotate(q, angles), rotate(k, angles)
                P = torch.softmax(torch.einsum("bnhc,bmhc->bhnm", q, k) / math.sqrt(C), dim=-1)
                torch.testing.assert_close(maps[layer], P, rtol=0, atol=1e-12)
                z = z + F.linear(torch.einsum("bhnm,bmhc->bnhc", P, v).reshape(B, -1, D), blk.attn.out_proj.weight,
                                 blk.attn.out_proj.bias)
                h = F.layer_norm(z, (D,), blk.norm2.weight, blk.norm2.bias)
                z = z + F.linear(F.gelu(F.linear(h, blk.mlp.fc1.weight, blk.mlp.fc1.bias)), blk.mlp.fc2.weight,
                                 blk.mlp.fc2.bias)


def test_cpu_bf16_autocast_forward_backward_of_the_study_shape():
    torch.manual_seed(0)
    m = DiffusionViT(ViTConfig(input_size=(16, 16), in_channels=3, patch_size=8, dim=24, depth=2, num_heads=12,
                               mlp_ratio=1.0, num_classes=10, drop_path=0.1, layer_scale=0.1))
    x, y = torch.randn(4, 3, 16, 16), torch.tensor([1, 2, 3, 4])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = m(x)
        loss = F.cross_entropy(logits.float(), y, label_smoothing=0.1)
    loss.backward()
    assert logits.dtype == torch.bfloat16
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in m.parameters())
    m.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = m(x).float()
    torch.testing.assert_close(low, m(x), rtol=0.05, atol=0.02)


def _task() -> tuple[ClassificationTask, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x, y = torch.randn(20, 3, 6, 8), torch.randint(0, 4, (20,))
    data = ClassificationData(name="t", kind="image", x_train=x, y_train=y, x_val=x[:5], y_val=y[:5], x_test=x[5:9],
                              y_test=y[5:9], num_classes=4, input_shape=(3, 6, 8))
    return ClassificationTask(data, augment={"crop_padding": 2, "flip": True}, label_smoothing=0.2), x, y


def test_task_batch_is_a_zero_padded_crop_flipped_along_the_width():
    task, x, y = _task()
    xb, yb = task.train_batch(0, torch.Generator().manual_seed(3), 7)
    g = torch.Generator().manual_seed(3)  # the same draws: indices, offsets (rows, cols), flips
    idx = torch.randint(0, 20, (7,), generator=g)
    off = torch.randint(0, 5, (7, 2), generator=g)
    flips = torch.rand(7, generator=g) < 0.5
    assert flips.any() and not flips.all()
    for b in range(7):
        padded = torch.zeros(3, 10, 12, dtype=torch.float64)
        padded[:, 2:8, 2:10] = x[idx[b]].double()
        crop = padded[:, off[b, 0] : off[b, 0] + 6, off[b, 1] : off[b, 1] + 8]
        torch.testing.assert_close(xb[b].double(), crop.flip(-1) if flips[b] else crop, rtol=0, atol=0)
    assert torch.equal(yb, y[idx])


def test_task_training_loss_is_smoothed_and_evaluation_is_plain_and_unaugmented():
    task, x, y = _task()
    xb, yb = task.train_batch(0, torch.Generator().manual_seed(1), 6)
    m = DiffusionViT(ViTConfig(input_size=(6, 8), in_channels=3, patch_size=2, dim=24, depth=1, num_heads=2,
                               num_classes=4))
    loss, _ = task.loss(m, (xb, yb))
    lp = m(xb).double().log_softmax(-1)
    eps = 0.2
    ref = ((1 - eps) * -lp.gather(1, yb[:, None]).squeeze(1) + eps * -lp.mean(-1)).mean()
    assert abs(loss.item() - ref.item()) < 1e-5
    m.eval()
    out = task.evaluate(m, None)
    assert abs(out["loss"] - F.cross_entropy(m(x[:5]).double(), y[:5]).item()) < 1e-5
    assert abs(out["test_loss"] - F.cross_entropy(m(x[5:9]).double(), y[5:9]).item()) < 1e-5
