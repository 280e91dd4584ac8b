"""Baseline fidelity: ``DiffusionGPT(bias=False)`` with attention heads is nanoGPT's ``GPT``.

The same weights go into nanoGPT's model (``nanogpt_reference.py``, reproduced from
karpathy/nanoGPT under its MIT licence) and into :class:`DiffusionGPT`; logits, loss and every
gradient must agree in float64, and the AdamW parameter groups of ``weight_decay_rule =
"nanogpt"`` must be those of nanoGPT's ``configure_optimizers``.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.train import TrainConfig, build_optimizer, param_groups


def _pair(ref_mod, bias: bool = False, dropout: float = 0.0, n_layer: int = 2, n_head: int = 3,
          n_embd: int = 24, block_size: int = 16, vocab_size: int = 13, flash: bool = True):
    torch.manual_seed(0)
    ref = ref_mod.GPT(ref_mod.GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head,
                                        n_embd=n_embd, dropout=dropout, bias=bias)).double()
    if not flash:  # nanoGPT's own set-up on PyTorch < 2.0: explicit softmax with a causal-mask buffer
        for block in ref.transformer.h:
            block.attn.flash = False
            block.attn.register_buffer("bias", torch.tril(torch.ones(block_size, block_size, dtype=torch.float64))
                                       .view(1, 1, block_size, block_size))
    ours = DiffusionGPT(GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head,
                                  n_embd=n_embd, dropout=dropout, bias=bias, backend="matrix")).double()
    names = ref_mod.diffusionformer_names(n_layer)
    ref_params = dict(ref.named_parameters())
    ours_params = dict(ours.named_parameters())
    # every parameter of each model has exactly one partner (tied embedding/head counted once)
    assert sorted(names[n] for n in ref_params) == sorted(ours_params)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for n, p in ref_params.items():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * (0.3 if p.dim() >= 2 else 1.0) + (p.dim() < 2))
            ours_params[names[n]].copy_(p)
    return ref, ours, names


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("bias", [False, True])
def test_same_logits_loss_gradients_float64(nanogpt_reference, bias: bool, flash: bool):
    ref, ours, names = _pair(nanogpt_reference, bias=bias, flash=flash)
    g = torch.Generator().manual_seed(2)
    idx = torch.randint(0, 13, (3, 16), generator=g)
    targets = torch.randint(0, 13, (3, 16), generator=g)
    targets[0, :4] = -1  # nanoGPT ignores -1 ...
    ours_targets = targets.masked_fill(targets == -1, -100)  # ... DiffusionGPT ignores -100, as cross_entropy
    ref_logits, ref_loss = ref(idx, targets)
    logits, loss = ours(idx, ours_targets)
    assert logits.dtype == torch.float64
    torch.testing.assert_close(logits, ref_logits, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    ref_loss.backward()
    loss.backward()
    ours_params = dict(ours.named_parameters())
    for n, p in ref.named_parameters():
        torch.testing.assert_close(ours_params[names[n]].grad, p.grad, rtol=1e-10, atol=1e-12, msg=n)
    # nanoGPT without targets returns the last position only
    torch.testing.assert_close(ours(idx)[0][:, -1:], ref(idx)[0], rtol=1e-12, atol=1e-12)


def test_same_outputs_in_train_mode_without_dropout(nanogpt_reference):
    ref, ours, _ = _pair(nanogpt_reference, dropout=0.0)
    ref.train(), ours.train()
    idx = torch.randint(0, 13, (2, 9), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(ours(idx, idx)[1], ref(idx, idx)[1], rtol=1e-12, atol=1e-12)


def test_bias_false_has_no_bias_anywhere(nanogpt_reference):
    ref, ours, _ = _pair(nanogpt_reference, bias=False)
    assert not [n for n, _ in ours.named_parameters() if n.endswith("bias")]
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())


def test_fresh_init_matches_nanogpt_statistics(nanogpt_reference):
    """Not the same draws (different module order), but the same init rule: N(0, 0.02) weights,
    residual projections N(0, 0.02 / sqrt(2 L)), unit LayerNorm gains."""
    ref_mod = nanogpt_reference
    torch.manual_seed(0)
    n_layer = 6
    ref = ref_mod.GPT(ref_mod.GPTConfig(block_size=64, vocab_size=65, n_layer=n_layer, n_head=6, n_embd=384, bias=False))
    ours = DiffusionGPT(GPTConfig(vocab_size=65, block_size=64, n_layer=n_layer, n_head=6, n_embd=384, bias=False))
    names = ref_mod.diffusionformer_names(n_layer)
    ours_params = dict(ours.named_parameters())
    for n, p in ref.named_parameters():
        q = ours_params[names[n]]
        assert q.shape == p.shape, n
        assert abs(q.std().item() - p.std().item()) < 0.1 * p.std().item() + 1e-6, n
        assert abs(q.mean().item() - p.mean().item()) < 3e-3 + 1e-6, n


@pytest.mark.parametrize("device_type", ["cpu"])
def test_nanogpt_rule_groups_equal_configure_optimizers(nanogpt_reference, device_type: str):
    ref, ours, names = _pair(nanogpt_reference, bias=False, n_layer=3)
    ref_opt = ref.configure_optimizers(weight_decay=0.1, learning_rate=1e-3, betas=(0.9, 0.99), device_type=device_type)
    ref_names = {id(p): n for n, p in ref.named_parameters()}
    cfg = TrainConfig(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, weight_decay_rule="nanogpt")
    opt = build_optimizer(ours, cfg, torch.device(device_type))
    assert len(opt.param_groups) == len(ref_opt.param_groups) == 2
    ours_names = {id(p): n for n, p in ours.named_parameters()}
    for mine, theirs in zip(opt.param_groups, ref_opt.param_groups):
        assert mine["weight_decay"] == theirs["weight_decay"]
        assert [ours_names[id(p)] for p in mine["params"]] == [names[ref_names[id(p)]] for p in theirs["params"]]
        assert mine["names"] == [ours_names[id(p)] for p in mine["params"]]
        for key in ("lr", "betas"):
            assert mine[key] == theirs[key]
    # the embeddings are decayed under the nanoGPT rule and not under the default one
    decayed = param_groups(ours, 0.1, rule="nanogpt")[0]["names"]
    assert {"tok_emb.weight", "pos_emb.weight"} <= set(decayed)
    default = param_groups(ours, 0.1)[0]["names"]
    assert not {"tok_emb.weight", "pos_emb.weight"} & set(default)
    assert set(decayed) - set(default) == {"tok_emb.weight", "pos_emb.weight"}


def test_unknown_decay_rule_is_refused():
    with pytest.raises(ValueError, match="weight_decay_rule"):
        TrainConfig(weight_decay_rule="timm")
    with pytest.raises(ValueError, match="rule"):
        param_groups(torch.nn.Linear(2, 2), 0.1, rule="all")
