"""Tests written in a mutation-testing audit of the model bodies.

Each test kills a mutant of ``diffusionformer/models`` (``gpt.py``: the training path, weight
tying, init, loss and config checks; ``vit.py``; ``graph_transformer.py``; ``sampling.py``;
``common.py``) that the rest of the suite let through (the docstring of each test names it).
The references are independent of the code under test: patch embeddings, LayerNorms, pooling,
rollouts, edge softmaxes and losses written out by hand in float64, counts and statistics
computed from the shapes, and the documented contract (bad input gets a clear error naming the
argument). CPU only, deterministic (seeded generators), small sizes.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.models.graph_transformer import DiffusionGraphTransformer, GraphBlock, GraphTransformerConfig
from diffusionformer.models.sampling import top_k_filter, top_p_filter
from diffusionformer.models.vit import ViTConfig, attention_rollout
from diffusionformer.ops.rivals import LayerState


def _gpt(**kw) -> DiffusionGPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16)
    cfg.update(kw)
    return DiffusionGPT(GPTConfig(**cfg))


# ------------------------------------------------------------------------------------- GPT config
@pytest.mark.parametrize("base", [1.0, 0.5])
def test_gpt_config_rejects_a_rope_base_of_at_most_one(base):
    """Kills: ``GPTConfig`` checking ``0 < rope_base`` instead of ``1 < rope_base`` (a base of 1 gives
    every channel pair the angle 0: no rotation)."""
    with pytest.raises(ValueError, match=r"GPTConfig\.rope_base: expected a finite float > 1"):
        GPTConfig(rope_base=base)


def test_gpt_config_rejects_zero_kv_heads_with_a_value_error():
    """Kills: ``GPTConfig`` checking ``n_kv_head < 0`` instead of ``< 1`` (``n_kv_head=0`` then fails
    with a bare ``ZeroDivisionError`` from ``n_head % 0``)."""
    with pytest.raises(ValueError, match=r"GPTConfig\.n_kv_head: expected None or a positive int .* got 0"):
        GPTConfig(n_head=4, n_kv_head=0)


# ------------------------------------------------------------------------------ GPT construction
def test_gpt_hands_its_dropout_and_rope_base_to_every_block():
    """Kills: ``DiffusionGPT`` building its blocks with ``attn_dropout=0.0`` instead of ``config.dropout``
    (nanoGPT drops attention probabilities too), and its rotary embeddings without ``rope_base``."""
    model = _gpt(dropout=0.25, rope=True, rope_base=500.0)
    for block in model.blocks:
        assert block.attn.dropout == 0.25
        assert block.attn.rotary.base == 500.0
        assert block.attn.rotary.inv_freq(torch.device("cpu")).tolist() == pytest.approx(
            [500.0 ** (-i / 8) for i in (0, 2, 4, 6)], rel=1e-12)


def test_gpt_zero_init_proj_makes_every_block_the_identity(by_hand):
    """Kills: ``zero_init_proj`` zeroing only the attention output projections and not the MLP's ``fc2``:
    with both zero (and zero biases) every block returns its input, so the logits are
    ``LN(E_tok[x] + E_pos) E_tok^T`` (by hand)."""
    model = _gpt(zero_init_proj=True).double().eval()
    idx = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    h = model.tok_emb.weight[idx[0]] + model.pos_emb.weight[:8]
    expected = by_hand.layer_norm(h, model.norm) @ model.tok_emb.weight.T
    torch.testing.assert_close(model(idx)[0][0], expected, rtol=0, atol=1e-12)


def test_gpt_num_parameters_counts_by_hand():
    """Kills: ``num_parameters(exclude_embeddings=True)`` subtracting the token embedding instead of the
    position embedding (nanoGPT's count: the tied token embedding is the output head and counts)."""
    V, T, D, L = 11, 8, 16, 2
    model = _gpt(vocab_size=V, block_size=T, n_embd=D, n_layer=L)
    ln = 2 * D
    block = ln + (D * 3 * D + 3 * D) + (D * D + D) + ln + (D * 4 * D + 4 * D) + (4 * D * D + D)
    total = V * D + T * D + L * block + ln  # tied head: counted once
    assert model.num_parameters() == total
    assert model.num_parameters(exclude_embeddings=True) == total - T * D
    assert _gpt(rope=True).num_parameters(exclude_embeddings=True) == total - T * D


@pytest.mark.parametrize("L", [1, 3])
def test_gpt_initialisation_statistics(L):
    """Kills: ``init_transformer_weights`` scaling the residual projections by ``1/sqrt(L)`` instead of
    ``1/sqrt(2L)``, leaving ``fc2`` at the plain std, not zeroing the biases or not drawing the
    embeddings, a default ``std`` other than 0.02, and ``DiffusionGPT`` passing a depth of 1.
    Reference: GPT-2's init, std 0.02 and ``0.02 / sqrt(2 L)``, checked on thousands of draws (a
    relative standard error near 1%)."""
    model = _gpt(n_layer=L, n_embd=64, n_head=4, vocab_size=64, block_size=32)
    small = 0.02 / math.sqrt(2 * L)

    def std(w: Tensor) -> float:
        return float(w.detach().double().pow(2).mean().sqrt())  # mean 0: the RMS is the std

    assert std(model.tok_emb.weight) == pytest.approx(0.02, rel=0.06)
    assert std(model.pos_emb.weight) == pytest.approx(0.02, rel=0.06)
    for block in model.blocks:
        assert std(block.attn.qkv.weight) == pytest.approx(0.02, rel=0.06)
        assert std(block.mlp.fc1.weight) == pytest.approx(0.02, rel=0.06)
        assert std(block.attn.out_proj.weight) == pytest.approx(small, rel=0.06)
        assert std(block.mlp.fc2.weight) == pytest.approx(small, rel=0.06)
        for lin in (block.attn.qkv, block.attn.out_proj, block.mlp.fc1, block.mlp.fc2):
            assert not lin.bias.any()


# ------------------------------------------------------------------------------- GPT forward path
def test_gpt_drops_the_embeddings_in_training():
    """Kills: ``DiffusionGPT._embed`` returning ``E_tok[x] + E_pos`` without ``self.drop``: in training with
    ``dropout=0.5`` the embeddings handed to the first block are that sum with about half the
    entries zeroed and the rest doubled (inverted dropout)."""
    model = _gpt(dropout=0.5).double().train()
    idx = torch.randint(0, 11, (4, 8), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(1)
    _, _, inter = model(idx, return_intermediates=True)
    clean = model.tok_emb.weight[idx] + model.pos_emb.weight[:8]
    emb = inter.embeddings
    kept = emb != 0
    assert 0.3 < kept.double().mean() < 0.7
    torch.testing.assert_close(emb[kept], 2 * clean[kept], rtol=0, atol=1e-15)


def test_gpt_intermediates_hold_the_embeddings_and_every_block_output():
    """Kills: ``return_intermediates`` not recording the embeddings (``embeddings=None``): they are
    ``E_tok[x] + E_pos`` (eval, by hand), and each hidden state is its block applied to the last."""
    model = _gpt().double().eval()
    idx = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    _, _, inter = model(idx, return_intermediates=True)
    torch.testing.assert_close(inter.embeddings, model.tok_emb.weight[idx] + model.pos_emb.weight[:4], rtol=0, atol=0)
    assert len(inter.hidden_states) == 2
    torch.testing.assert_close(inter.hidden_states[0], model.blocks[0](inter.embeddings, state=LayerState()),
                               rtol=0, atol=1e-12)


def test_gpt_loss_ignores_minus_100_and_is_the_mean_nll_by_hand():
    """Kills: the loss without ``ignore_index=-100`` and the targets check without it; reference:
    ``-log softmax`` of the logits at the kept targets, averaged by hand."""
    model = _gpt().double().eval()
    idx = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    targets = torch.tensor([[2, -100, 4, 5], [-100, -100, 8, 0]])
    logits, loss = model(idx, targets)
    logp = logits.log_softmax(-1)
    terms = [-logp[b, t, targets[b, t]] for b in range(2) for t in range(4) if targets[b, t] != -100]
    torch.testing.assert_close(loss, torch.stack(terms).mean(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpt_half_precision_loss_is_computed_in_float32(dtype):
    """Kills: the half-precision logits not cast to float32 before the cross-entropy (for bfloat16 only
    or for both): the loss is float32 and equals the float32 cross-entropy of the returned logits."""
    model = _gpt().to(dtype).eval()
    idx = torch.tensor([[1, 2, 3, 4]])
    targets = torch.tensor([[2, 3, 4, 5]])
    logits, loss = model(idx, targets)
    assert logits.dtype == dtype and loss.dtype == torch.float32
    torch.testing.assert_close(loss, F.cross_entropy(logits[0].float(), targets[0]), rtol=0, atol=0)


def test_gpt_logits_are_the_normalised_final_state_times_the_embedding(by_hand):
    """Kills: the output head applied to the last hidden state without the final norm; reference:
    ``LN(h^L) E_tok^T`` by hand from the last intermediate."""
    model = _gpt().double().eval()
    with torch.no_grad():  # affine parameters that are not the identity
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.normal_()
    idx = torch.tensor([[1, 2, 3]])
    logits, _, inter = model(idx, return_intermediates=True)
    expected = by_hand.layer_norm(inter.hidden_states[-1], model.norm) @ model.tok_emb.weight.T
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-12)


def test_gpt_checks_lengths_dtypes_and_ids_at_the_boundaries():
    """Kills: the length check ``T > block_size + 1`` (one token too many let through), the same in
    ``forward_cached``, the targets dtype check dropped, the id check ``hi > vocab_size`` (id
    ``vocab_size`` let through) and ``lo < -1`` (id ``-1`` let through), and the empty-``idx`` check
    dropped."""
    model = _gpt(vocab_size=11, block_size=8)
    idx = torch.zeros(1, 8, dtype=torch.long)
    model(idx)  # exactly block_size: fine
    with pytest.raises(ValueError, match="T=9 exceeds block_size=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    cache = model.new_cache()
    model.forward_cached(idx[:, :5], cache)
    model.forward_cached(idx[:, :3], cache)  # 5 + 3 = block_size: fine
    with pytest.raises(ValueError, match=r"cached \+ new tokens <= block_size=8, got 8 \+ 1"):
        model.forward_cached(idx[:, :1], cache)
    with pytest.raises(ValueError, match="targets must be token ids .* got dtype torch.float32"):
        model(idx, torch.zeros(1, 8))
    with pytest.raises(ValueError, match=r"idx holds token id 11, outside the vocabulary \[0, 11\)"):
        model(torch.tensor([[0, 11]]))
    with pytest.raises(ValueError, match=r"idx holds token id -1, outside the vocabulary \[0, 11\)"):
        model(torch.tensor([[0, -1]]))
    with pytest.raises(ValueError, match=r"targets holds token id 11, outside"):
        model(torch.tensor([[0, 1]]), torch.tensor([[-100, 11]]))
    with pytest.raises(ValueError, match=r"idx must hold at least one sequence of at least one token, got shape \(1, 0\)"):
        model(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"got shape \(0, 3\)"):
        model(torch.zeros(0, 3, dtype=torch.long))


# ------------------------------------------------------------------------------ shared checks
def test_model_configs_reject_zero_and_bool_ratios_and_a_dropout_of_one():
    """Kills: ``check_positive`` accepting 0 (``value < 0``) or a bool, and ``check_probability``
    accepting 1.0 (``value <= 1.0``: every activation dropped)."""
    with pytest.raises(ValueError, match=r"GPTConfig\.mlp_ratio must be positive, got 0"):
        GPTConfig(mlp_ratio=0)
    with pytest.raises(ValueError, match=r"ViTConfig\.mlp_ratio must be positive, got True"):
        ViTConfig(mlp_ratio=True)
    with pytest.raises(ValueError, match=r"GPTConfig\.dropout must lie in \[0, 1\), got 1.0"):
        GPTConfig(dropout=1.0)
    with pytest.raises(TypeError, match=r"GraphTransformerConfig\.depth must be a positive int, got bool True"):
        GraphTransformerConfig(depth=True)


# ------------------------------------------------------------------------------------ sampling
def test_top_k_keeps_every_row_unchanged_when_k_exceeds_the_vocabulary():
    """Kills: ``top_k_filter`` calling ``topk`` with ``k`` instead of ``min(k, V)`` (a ``RuntimeError``
    for ``k > V``, documented as clipped)."""
    logits = torch.tensor([[0.5, -1.0, 2.0], [1.0, 1.0, 0.0]])
    torch.testing.assert_close(top_k_filter(logits, 7), logits, rtol=0, atol=0)


def test_top_k_keeps_ties_with_the_kth_logit():
    """Kills: ``top_k_filter`` masking ``logits <= kth`` (the ``k``-th logit and its ties dropped)."""
    out = top_k_filter(torch.tensor([[1.0, 3.0, 3.0, 2.0]]), 1)
    assert out.isfinite().tolist() == [[False, True, True, False]]


def test_top_p_drops_a_token_once_the_mass_before_it_reaches_p_exactly():
    """Kills: ``top_p_filter`` dropping on ``mass_before > p`` instead of ``>= p`` (with two equal logits
    the mass before the second is exactly 0.5, so ``p = 0.5`` keeps the first token only)."""
    out = top_p_filter(torch.tensor([[0.0, 0.0, -50.0]], dtype=torch.float64), 0.5)
    assert out.isfinite().tolist() == [[True, False, False]]


def test_top_p_maps_the_kept_set_back_to_unsorted_positions():
    """Kills: ``top_p_filter`` applying the drop mask in sorted order without scattering it back to the
    vocabulary order; reference: the nucleus of an unsorted row by hand."""
    probs = torch.tensor([[0.1, 0.05, 0.5, 0.15, 0.2]], dtype=torch.float64)
    out = top_p_filter(probs.log(), 0.8)  # sorted: 0.5, 0.2, 0.15 (mass before: 0, 0.5, 0.7) | 0.1 (0.85)
    assert out.isfinite().tolist() == [[False, False, True, True, True]]
    torch.testing.assert_close(out[0, [2, 3, 4]], probs.log()[0, [2, 3, 4]], rtol=0, atol=0)


# ------------------------------------------------------------------------------------ ViT config
@pytest.mark.parametrize(
    "kw, error, match",
    [
        (dict(input_size=(4, 4, 4)), ValueError, r"input_size must be \(H, W\) or \(T,\)"),
        (dict(num_classes=-1), ValueError, r"num_classes must be >= 0, got -1"),
    ],
    ids=["3-d-input", "negative-classes"],
)
def test_vit_config_rejects(kw, error, match):
    """Kills: ``ViTConfig`` accepting a 3-d ``input_size`` (``len in (1, 2, 3)``) and ``num_classes=-1``
    (``num_classes < -1``)."""
    with pytest.raises(error, match=match):
        ViTConfig(**{"patch_size": 2, **kw})


def test_vit_without_classes_returns_the_pooled_features(tiny_vit):
    """Kills: ``num_classes=0`` building ``nn.Linear(dim, 0)`` (``>= 0``) instead of no head: the output is
    the ``(B, D)`` feature, the normalised class token."""
    vit = tiny_vit(num_classes=0).eval()
    x = torch.randn(2, 1, 4, 4, dtype=torch.float64)
    assert isinstance(vit.head, nn.Identity)
    torch.testing.assert_close(vit(x), vit.forward_tokens(x)[:, 0], rtol=0, atol=0)


# ------------------------------------------------------------------------------ ViT embeddings
def test_vit_signal_patch_tokens_are_linear_maps_of_consecutive_samples(tiny_vit):
    """Kills: the 1-d patch embedding reading the signal ``(B, T, C)`` with a ``reshape`` to ``(B, C, T)``
    instead of a ``transpose`` (samples and channels scrambled); reference: token ``t`` is
    ``sum_{c, k} W[:, c, k] x[t p + k, c] + b`` by hand, class token first."""
    vit = tiny_vit(input_size=(12,), patch_size=3, in_channels=2).eval()
    x = torch.randn(2, 12, 2, dtype=torch.float64)
    W, b = vit.patch_embed.weight, vit.patch_embed.bias  # (D, C, p), (D,)
    tokens = torch.stack([torch.einsum("dck,bkc->bd", W, x[:, 3 * t : 3 * t + 3]) + b for t in range(4)], 1)
    expected = torch.cat([vit.cls_token.expand(2, 1, 8), tokens], 1) + vit.pos_embed
    torch.testing.assert_close(vit._embed(x), expected, rtol=0, atol=1e-12)


def test_vit_class_token_and_position_embeddings_are_initialised(tiny_vit):
    """Kills: ``DiffusionViT`` leaving ``pos_embed`` or ``cls_token`` at zero instead of drawing them from
    a truncated normal with std 0.02 (timm); checked on 17 * 64 and 64 draws."""
    vit = tiny_vit(input_size=(8, 8), dim=64, num_heads=4)
    pos, cls = vit.pos_embed.detach(), vit.cls_token.detach()
    assert float(pos.pow(2).mean().sqrt()) == pytest.approx(0.02, rel=0.1)
    assert float(cls.pow(2).mean().sqrt()) == pytest.approx(0.02, rel=0.3)
    assert vit.no_weight_decay() == {"pos_embed", "cls_token"}
    assert tiny_vit(pool="mean").no_weight_decay() == {"pos_embed"}


def test_vit_drops_the_embeddings_in_training(tiny_vit):
    """Kills: ``DiffusionViT._embed`` without ``self.drop``: in training with ``dropout=0.5`` the embedding
    is the patch tokens plus positions with about half the entries zeroed and the rest doubled."""
    vit = tiny_vit(dropout=0.5).train()
    x = torch.randn(4, 1, 4, 4, dtype=torch.float64)
    clean = vit.eval()._embed(x)
    torch.manual_seed(1)
    emb = vit.train()._embed(x)
    kept = emb != 0
    assert 0.3 < kept.double().mean() < 0.7
    torch.testing.assert_close(emb[kept], 2 * clean[kept], rtol=0, atol=1e-15)


@pytest.mark.parametrize("shape", [(2, 1, 4, 6), (2, 1, 6, 4)])
def test_vit_rejects_images_of_the_wrong_size(shape, tiny_vit):
    """Kills: the image check reading only ``x.dim() != 4`` (an image of the wrong height or width then
    reaches ``pos_embed`` with a shape error)."""
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 1, 4, 4\), got"):
        tiny_vit()(torch.randn(*shape, dtype=torch.float64))


def test_vit_rejects_signals_of_the_wrong_length(tiny_vit):
    """Kills: the signal check reading only ``x.dim() != 3``."""
    with pytest.raises(ValueError, match=r"expected signals of shape \(B, 12, 2\), got \(2, 15, 2\)"):
        tiny_vit(input_size=(12,), patch_size=3, in_channels=2)(torch.randn(2, 15, 2, dtype=torch.float64))


# ------------------------------------------------------------------------------- ViT forward path
def test_vit_mean_pool_averages_every_normalised_patch_token(tiny_vit, by_hand):
    """Kills: ``pool="mean"`` averaging ``z[:, 1:]`` (a class token that does not exist: the first patch
    dropped) or returning the first token; reference: the mean over the patch axis of the
    hand-normalised last hidden state."""
    vit = tiny_vit(pool="mean").eval()
    x = torch.randn(2, 1, 4, 4, dtype=torch.float64)
    _, inter = vit.forward_tokens(x, return_intermediates=True)
    expected = by_hand.layer_norm(inter.hidden_states[-1], vit.norm).mean(1)
    torch.testing.assert_close(vit.forward_features(x), expected, rtol=0, atol=1e-12)
    assert vit.forward_patch_tokens(x).shape == (2, 4, 8)


def test_vit_forward_tokens_normalises_the_last_hidden_state(tiny_vit, by_hand):
    """Kills: ``forward_tokens`` returning the last block's output without the final norm."""
    vit = tiny_vit().eval()
    with torch.no_grad():
        vit.norm.weight.uniform_(0.5, 1.5)
        vit.norm.bias.normal_()
    x = torch.randn(2, 1, 4, 4, dtype=torch.float64)
    z, inter = vit.forward_tokens(x, return_intermediates=True)
    torch.testing.assert_close(z, by_hand.layer_norm(inter.hidden_states[-1], vit.norm), rtol=0, atol=1e-12)


def test_vit_given_rope_positions_are_not_overwritten(tiny_vit):
    """Kills: ``forward_tokens`` replacing caller-given ``positions`` by ``token_positions()``: positions
    that spread the grid twice as far change the RoPE scores, so the output must change, and the
    default equals passing ``token_positions()`` explicitly."""
    vit = tiny_vit(rope=True, dim=16, num_heads=2).eval()
    x = torch.randn(2, 1, 4, 4, dtype=torch.float64)
    pos = vit.token_positions()
    torch.testing.assert_close(vit.forward_tokens(x, positions=pos), vit.forward_tokens(x), rtol=0, atol=0)
    assert not torch.allclose(vit.forward_tokens(x, positions=3 * pos), vit.forward_tokens(x))


def test_vit_blocks_share_one_layer_state(tiny_vit, by_hand):
    """Kills: ``forward_tokens`` without a shared ``LayerState`` (the value-residual head of layer 1 must
    read layer 0's values); reference: the blocks chained by hand with one state."""
    vit = tiny_vit(heads=["attention:2", "value-residual:1,attention:1"]).eval()
    x = torch.randn(2, 1, 4, 4, dtype=torch.float64)
    state = LayerState()
    z = vit._embed(x)
    for block in vit.blocks:
        z = block(z, state=state)
    torch.testing.assert_close(vit.forward_tokens(x), by_hand.layer_norm(z, vit.norm), rtol=0, atol=1e-12)


def test_vit_attention_maps_restore_the_training_mode_and_check_kind(tiny_vit):
    """Kills: ``attention_maps`` leaving the model in eval mode (``self.train(was_training)`` dropped) and
    accepting an unknown ``kind``."""
    vit = tiny_vit().train()
    vit.attention_maps(torch.randn(1, 1, 4, 4, dtype=torch.float64))
    assert vit.training and all(m.training for m in vit.modules())
    with pytest.raises(ValueError, match=r"attention_maps: expected kind 'P' or 'operator', got 'Q'"):
        vit.attention_maps(torch.randn(1, 1, 4, 4, dtype=torch.float64), kind="Q")


def test_attention_rollout_mixes_the_identity_with_weight_one_minus_r():
    """Kills: the rollout weighting the identity by ``r`` and the attention by ``1 - r`` (the same at the
    default ``r = 0.5``), the product taken in the wrong order, and ``residual=0`` accepted;
    reference: ``((1 - r) I + r mean_h A_l)`` rows normalised, multiplied last layer first, at
    ``r = 0.3`` on non-commuting maps."""
    g = torch.Generator().manual_seed(0)
    maps = [torch.softmax(3 * torch.randn(1, 2, 4, 4, generator=g, dtype=torch.float64), -1) for _ in range(2)]
    r = 0.3
    eye = torch.eye(4, dtype=torch.float64)
    layers = [(1 - r) * eye + r * (A[0, 0] + A[0, 1]) / 2 for A in maps]
    layers = [a / a.sum(-1, keepdim=True) for a in layers]
    torch.testing.assert_close(attention_rollout(maps, residual=r)[0], layers[1] @ layers[0], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"expected residual in \(0, 1\], got 0"):
        attention_rollout(maps, residual=0)


# -------------------------------------------------------------------------------- graph config
@pytest.mark.parametrize(
    "kw, error, match",
    [
        (dict(edge_dim=0), ValueError, r"GraphTransformerConfig\.edge_dim must be a positive int, got 0"),
        (dict(pe="laplacian", pe_dim=0), ValueError, r"GraphTransformerConfig\.pe_dim must be a positive int, got 0"),
    ],
    ids=["edge-dim-0", "pe-dim-0"],
)
def test_graph_config_rejects(kw, error, match):
    """Kills: ``GraphTransformerConfig`` skipping the ``edge_dim`` or the ``pe_dim`` check."""
    with pytest.raises(error, match=match):
        GraphTransformerConfig(**kw)


# ------------------------------------------------------------------------------ graph reference
def _graph_reference(by_hand, model: DiffusionGraphTransformer, x: Tensor, src: Tensor, dst: Tensor, pe: Tensor | None = None):
    """The node logits of a depth-1 softmax-attention graph transformer, by hand."""
    h = x @ model.embed.weight.T + model.embed.bias
    if pe is not None:
        h = h + pe @ model.pe_embed.weight.T + model.pe_embed.bias
    block = model.blocks[0]
    h = h + by_hand.edge_softmax(block.attn, by_hand.layer_norm(h, block.norm1), src, dst)
    m = by_hand.layer_norm(h, block.norm2)
    h = h + F.gelu(m @ block.mlp.fc1.weight.T + block.mlp.fc1.bias) @ block.mlp.fc2.weight.T + block.mlp.fc2.bias
    return by_hand.layer_norm(h, model.norm), h


def test_graph_transformer_without_added_self_loops_keeps_the_given_ones(tiny_graph_transformer, by_hand):
    """Kills: ``self_loops=False`` passed to ``from_edge_index`` as ``False`` (remove every self loop)
    instead of ``None`` (keep the edges as given); reference: the edge softmax over exactly the
    given edges, with the given self loops of nodes 0 and 2, by hand."""
    model = tiny_graph_transformer(self_loops=False).eval()
    x = torch.randn(4, 3, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3, 0, 2, 1], [1, 2, 3, 0, 0, 2, 3]])
    hn, _ = _graph_reference(by_hand, model, x, ei[0], ei[1])
    torch.testing.assert_close(model(x, ei), hn @ model.head.weight.T + model.head.bias, rtol=0, atol=1e-12)


def test_graph_transformer_adds_the_positional_encoding_through_an_affine_map(tiny_graph_transformer, by_hand):
    """Kills: ``pe_embed`` built without a bias; reference: ``x W_x + b_x + pe W_pe + b_pe`` then the block,
    by hand (with a non-zero ``b_pe``), in eval mode where no sign is flipped."""
    model = tiny_graph_transformer(pe="laplacian", pe_dim=2).eval()
    with torch.no_grad():
        model.pe_embed.bias.normal_()
    x, pe = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    loops = torch.arange(4)
    hn, _ = _graph_reference(by_hand, model, x, torch.cat([ei[0], loops]), torch.cat([ei[1], loops]), pe)
    torch.testing.assert_close(model(x, ei, pe=pe), hn @ model.head.weight.T + model.head.bias, rtol=0, atol=1e-12)


def _pe_signs(model: DiffusionGraphTransformer, x: Tensor, ei: Tensor, pe: Tensor) -> Tensor:
    """The per-column factor ``s`` with which ``pe`` entered the embedding, solved from the intermediates."""
    _, inter = model(x, ei, pe=pe, return_intermediates=True)
    shift = inter.embeddings - (x @ model.embed.weight.T + model.embed.bias) - model.pe_embed.bias  # (pe * s) W^T
    scaled = torch.linalg.lstsq(model.pe_embed.weight, shift.T).solution.T  # (N, pe_dim)
    return scaled / pe


def test_laplacian_pe_signs_are_flipped_per_column_in_training_only(tiny_graph_transformer):
    """Kills: the sign flip drawing factors in ``{0, 1}`` (``* 2 - 1`` dropped: eigenvectors zeroed), the
    flip applied in eval too, and the flip applied to random-walk encodings (which have no sign
    ambiguity); the factors are solved from the embeddings by least squares."""
    x, pe = torch.randn(5, 3, dtype=torch.float64), torch.rand(5, 3, dtype=torch.float64) + 0.5
    ei = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]])
    model = tiny_graph_transformer(pe="laplacian", pe_dim=3).train()
    seen = set()
    for seed in range(8):
        torch.manual_seed(seed)
        s = _pe_signs(model, x, ei, pe)
        torch.testing.assert_close(s, s[:1].expand_as(s), rtol=0, atol=1e-9)  # one factor per column
        assert set(s[0].round().tolist()) <= {-1.0, 1.0}
        torch.testing.assert_close(s[0], s[0].round(), rtol=0, atol=1e-9)
        seen.update(s[0].round().tolist())
    assert seen == {-1.0, 1.0}
    torch.testing.assert_close(_pe_signs(model.eval(), x, ei, pe), torch.ones(5, 3, dtype=torch.float64),
                               rtol=0, atol=1e-9)
    walk = tiny_graph_transformer(pe="random_walk", pe_dim=3).train()
    for seed in range(4):
        torch.manual_seed(seed)
        torch.testing.assert_close(_pe_signs(walk, x, ei, pe), torch.ones(5, 3, dtype=torch.float64),
                                   rtol=0, atol=1e-9)


def test_graph_transformer_drops_the_input_features_in_training(tiny_graph_transformer):
    """Kills: ``input_dropout`` not applied (``self.input_drop`` skipped): with one input channel a dropped
    node's embedding is exactly the embedding bias, a kept one ``2 x W + b``."""
    model = tiny_graph_transformer(in_channels=1, input_dropout=0.5).train()
    with torch.no_grad():
        model.embed.bias.normal_()
    x = torch.rand(200, 1, dtype=torch.float64) + 0.5
    ei = torch.stack([torch.arange(200), torch.arange(1, 201) % 200])
    torch.manual_seed(0)
    _, inter = model(x, ei, return_intermediates=True)
    W, b = model.embed.weight[:, 0], model.embed.bias
    dropped = torch.isclose(inter.embeddings, b.expand(200, -1), rtol=0, atol=1e-15).all(1)
    assert 60 < int(dropped.sum()) < 140
    torch.testing.assert_close(inter.embeddings[~dropped], 2 * x[~dropped] * W + b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("pool", ["mean", "add", "max"])
def test_graph_readout_by_hand_with_an_empty_trailing_graph(pool, tiny_graph_transformer, by_hand):
    """Kills: ``pool="add"`` mapped to the mean, and the readout called without ``num_graphs`` (a third,
    empty graph then missing); reference: per-graph sum, mean or max of the normalised node states
    by hand, an empty graph pooled to zero (PyG's convention)."""
    model = tiny_graph_transformer(task="graph", pool=pool).eval()
    x = torch.randn(5, 3, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 3], [1, 2, 4]])
    batch = torch.tensor([0, 0, 0, 1, 1])
    out, inter = model(x, ei, batch, num_graphs=3, return_intermediates=True)
    h = by_hand.layer_norm(inter.hidden_states[-1], model.norm)
    red = {"mean": lambda t: t.mean(0), "add": lambda t: t.sum(0), "max": lambda t: t.max(0).values}[pool]
    pooled = torch.stack([red(h[:3]), red(h[3:]), torch.zeros(8, dtype=torch.float64)])
    torch.testing.assert_close(out, pooled @ model.head.weight.T + model.head.bias, rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------- graph checks
def test_graph_forward_checks_its_arguments(tiny_graph_transformer):
    """Kills: the ``edge_attr`` shape check dropped, the ``pe`` shape check reduced to presence, the
    ``batch`` dtype check dropped, the graph-id range check ``hi > num_graphs`` (id ``num_graphs`` let
    through) or without ``lo < 0``, ``num_graphs`` without ``batch`` accepted, ``max_num_nodes=0``
    accepted (``value < 0``), and the ``x`` width check reduced to ``x.dim() != 2``."""
    x = torch.randn(4, 3, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
    edge = tiny_graph_transformer(edge_dim=2).eval()
    with pytest.raises(ValueError, match=r"edge_attr: expected shape \(E, edge_dim\) = \(3, 2\), got \(3, 5\)"):
        edge(x, ei, edge_attr=torch.randn(3, 5, dtype=torch.float64))
    pe = tiny_graph_transformer(pe="random_walk", pe_dim=2).eval()
    with pytest.raises(ValueError, match=r"pe: expected shape \(N, pe_dim\) = \(4, 2\) .* got \(4, 3\)"):
        pe(x, ei, pe=torch.randn(4, 3, dtype=torch.float64))
    model = tiny_graph_transformer(task="graph").eval()
    with pytest.raises(TypeError, match="batch must hold integer graph ids of dtype torch.int64 or torch.int32, got dtype torch.float32"):
        model(x, ei, torch.zeros(4))
    with pytest.raises(ValueError, match=r"batch: expected graph ids in \[0, num_graphs=2\), got ids in \[0, 2\]"):
        model(x, torch.tensor([[0], [1]]), torch.tensor([0, 0, 1, 2]), num_graphs=2)
    with pytest.raises(ValueError, match=r"batch: expected graph ids in \[0, num_graphs=2\), got ids in \[-1, 1\]"):
        model(x, torch.tensor([[1], [2]]), torch.tensor([-1, 0, 0, 1]), num_graphs=2)
    with pytest.raises(ValueError, match=r"batch: expected non-negative graph ids, got ids in \[-1, 0\]"):
        model(x, torch.tensor([[1], [2]]), torch.tensor([-1, 0, 0, 0]))
    with pytest.raises(ValueError, match="num_graphs: a call without batch holds one graph, got num_graphs=2"):
        tiny_graph_transformer().eval()(x, ei, num_graphs=2)
    with pytest.raises(ValueError, match="max_num_nodes: expected None or a positive int, got 0"):
        model(x, ei, max_num_nodes=0)
    with pytest.raises(ValueError, match=r"x must have shape \(N, in_channels=3\), got \(4, 2\)"):
        model(x[:, :2], ei)


def test_graph_block_global_attention_checks_the_first_pair_and_negative_ids():
    """Kills: the sorted-batch check skipping the first pair of ids, and ``GraphBlock`` without sizes
    accepting a negative graph id (``int(batch.min()) < 0`` check dropped)."""
    torch.manual_seed(0)
    block = GraphBlock(8, 2, global_attention=True).double().eval()
    x = torch.randn(4, 8, dtype=torch.float64)
    ei = torch.tensor([[0, 2], [0, 3]])
    with pytest.raises(ValueError, match="batch: expected sorted graph ids"):
        block(x, ei, torch.tensor([1, 0, 1, 1]))
    with pytest.raises(ValueError, match="batch: expected non-negative graph ids, got min -1"):
        block(x, ei, torch.tensor([-1, 0, 0, 0]))


# ------------------------------------------------------------------------------------------- bugs
@pytest.mark.parametrize(
    "make, where, dim",
    [
        (lambda r: GPTConfig(n_embd=16, n_head=2, mlp_ratio=r), "GPTConfig", 16),
        (lambda r: ViTConfig(dim=16, num_heads=2, mlp_ratio=r), "ViTConfig", 16),
        (lambda r: GraphTransformerConfig(dim=16, num_heads=2, mlp_ratio=r), "GraphTransformerConfig", 16),
        (lambda r: GraphBlock(16, 2, mlp_ratio=r), "GraphBlock", 16),
    ],
    ids=["gpt", "vit", "graph", "graph-block"],
)
def test_mlp_ratio_giving_a_zero_hidden_width_is_refused(make, where, dim):
    """Bug: an ``mlp_ratio`` with ``int(dim * mlp_ratio) == 0`` (e.g. 0.05 at ``dim=16``) silently built an
    MLP of hidden width ``4 * dim`` (``Mlp``'s default for a width of 0), 80 times the one asked for;
    ``GraphBlock`` also took a negative ratio to an obscure negative-dimension error, and an
    infinite ratio failed in ``int()``. Now a ``ValueError`` naming ``mlp_ratio``; the smallest
    ratio with width 1 still builds."""
    with pytest.raises(ValueError, match=rf"{where}\.mlp_ratio=0\.05 gives an MLP hidden width .* = 0 for dim=16"):
        make(0.05)
    with pytest.raises(ValueError, match=rf"{where}\.mlp_ratio must be a finite float, got inf"):
        make(float("inf"))
    if where == "GraphBlock":
        with pytest.raises(ValueError, match=r"GraphBlock\.mlp_ratio must be positive, got -1"):
            make(-1)
        assert make(1 / dim).mlp.fc1.out_features == 1


_SWITCHES = [
    (lambda v: GPTConfig(tie_weights=v), "GPTConfig.tie_weights"),
    (lambda v: GPTConfig(bias=v), "GPTConfig.bias"),
    (lambda v: GPTConfig(qk_norm=v), "GPTConfig.qk_norm"),
    (lambda v: ViTConfig(qk_norm=v), "ViTConfig.qk_norm"),
    (lambda v: GraphTransformerConfig(self_loops=v), "GraphTransformerConfig.self_loops"),
    (lambda v: GraphTransformerConfig(global_attention=v), "GraphTransformerConfig.global_attention"),
    (lambda v: GraphTransformerConfig(pe_sign_flip=v), "GraphTransformerConfig.pe_sign_flip"),
]


@pytest.mark.parametrize("make, field", _SWITCHES, ids=[f for _, f in _SWITCHES])
def test_config_switches_must_be_bools(make, field):
    """Bug: the model configs took any value for these switches, so ``tie_weights="false"`` (or
    ``self_loops="no"``, a string from a command line) was truthy and silently switched the option
    on. Now a ``TypeError`` naming the field, as for ``rope``; bools still work."""
    with pytest.raises(TypeError, match=rf"{field}: expected bool, got str 'false'"):
        make("false")
    make(False)


def test_bad_input_types_get_errors_naming_the_argument(tiny_vit, tiny_graph_transformer):
    """Bug: ``ViTConfig(input_size=28)`` failed with ``'int' object is not iterable``, a ViT called on a
    list with ``'list' object has no attribute 'dim'``, and a graph transformer given ``edge_attr`` or
    ``pe`` as a list with ``... has no attribute 'shape'``. Now a ``TypeError`` naming the argument."""
    with pytest.raises(TypeError, match=r"ViTConfig\.input_size must be \(H, W\) or \(T,\) positive ints, got 28"):
        ViTConfig(input_size=28)
    assert ViTConfig(input_size=[8, 8], patch_size=2).input_size == (8, 8)
    with pytest.raises(TypeError, match=r"x must be a Tensor of images \(B, C, H, W\) or signals \(B, T, C\), got list"):
        tiny_vit()([[0.0] * 4] * 4)
    x, ei = torch.randn(3, 3, dtype=torch.float64), torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(TypeError, match="edge_attr: expected a Tensor or None, got list"):
        tiny_graph_transformer(edge_dim=2)(x, ei, edge_attr=[[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(TypeError, match="pe: expected a Tensor or None, got list"):
        tiny_graph_transformer(pe="random_walk", pe_dim=2)(x, ei, pe=[[1.0, 2.0]] * 3)
