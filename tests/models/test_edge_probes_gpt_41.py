"""Edge probes of ``DiffusionGPT`` from a nanoGPT user's side (probe 41): init of the model variants,
nanoGPT checkpoints loaded through ``load_state_dict``, and nanoGPT's ``crop_block_size``.

No bug was found in this area (generate's arguments, filters, cache equality, decay groups are pinned
elsewhere: ``test_edge_probes_decoding*``, ``test_edge_probes_models_*``); these tests pin behaviour
against nanoGPT's ``model.py`` (``tests/models/nanogpt_reference.py``) and explicit references.
"""

from __future__ import annotations

import io
import math

import pytest
import torch

from diffusionformer.models import DiffusionGPT, GPTConfig


@pytest.mark.parametrize("variant", [dict(n_kv_head=1), dict(rope=True, qk_norm=True), dict(tie_weights=False),
                                     dict(laplacian_heads="half")])
def test_pins_init_rule_of_the_modern_variants_is_nanogpts(variant):
    """nanoGPT's init rule (N(0, 0.02) for every Linear and Embedding, N(0, 0.02 / sqrt(2 L)) for the
    residual projections, zero biases, unit norm gains) holds for the GQA / RoPE / untied / Laplacian
    variants too, not only for the plain model that test_models_nanogpt_equivalence checks."""
    torch.manual_seed(0)
    n_layer = 6
    model = DiffusionGPT(GPTConfig(vocab_size=512, block_size=64, n_layer=n_layer, n_head=4, n_embd=256, **variant))
    scaled = 0.02 / math.sqrt(2 * n_layer)
    seen_scaled = 0
    for name, p in model.named_parameters():
        if name.endswith(("out_proj.weight", "fc2.weight")):
            assert abs(p.std().item() - scaled) < 0.05 * scaled, name
            seen_scaled += 1
        elif name.endswith("bias"):
            assert torch.count_nonzero(p) == 0, name
        elif ".operators." in name:
            continue  # operator parameters keep their constructors' values
        elif p.dim() >= 2:
            assert abs(p.std().item() - 0.02) < 0.05 * 0.02, name
            assert abs(p.mean().item()) < 3e-3, name
        elif "norm" in name:
            assert torch.equal(p, torch.ones_like(p)), name
    assert seen_scaled == 2 * n_layer
    if variant.get("tie_weights", True):
        assert model.lm_head.weight is model.tok_emb.weight
    else:
        assert model.lm_head.weight is not model.tok_emb.weight


@pytest.mark.parametrize("bias", [False, True])
def test_pins_nanogpt_checkpoint_loads_through_load_state_dict(nanogpt_reference, bias):
    """A nanoGPT state dict, renamed and saved/loaded by torch (the tied wte / lm_head come back as two
    tensor objects over one storage), loads strictly into a tied DiffusionGPT: the tie is kept and the
    float64 logits equal nanoGPT's."""
    ref_mod = nanogpt_reference
    n_layer = 2
    torch.manual_seed(0)
    ref = ref_mod.GPT(ref_mod.GPTConfig(block_size=16, vocab_size=13, n_layer=n_layer, n_head=2, n_embd=16,
                                        dropout=0.0, bias=bias)).double()
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
    names = ref_mod.diffusionformer_names(n_layer)
    state = {names[k]: v for k, v in ref.state_dict().items() if k in names}
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert state["tok_emb.weight"] is not state["lm_head.weight"]
    ours = DiffusionGPT(GPTConfig(vocab_size=13, block_size=16, n_layer=n_layer, n_head=2, n_embd=16, bias=bias,
                                  backend="matrix")).double()
    ours.load_state_dict(state)
    assert ours.lm_head.weight is ours.tok_emb.weight
    idx = torch.randint(0, 13, (3, 16), generator=torch.Generator().manual_seed(2))
    ref_last, _ = ref(idx)  # nanoGPT: the last position only, without targets
    torch.testing.assert_close(ours(idx)[0][:, -1:], ref_last, rtol=1e-12, atol=1e-12)
    # a checkpoint whose head was trained apart (tie broken) is refused, not loaded half-way
    state["lm_head.weight"] = state["lm_head.weight"] + 1.0
    before = ours.tok_emb.weight.detach().clone()
    with pytest.raises(RuntimeError, match="tied"):
        ours.load_state_dict(state)
    assert torch.equal(ours.tok_emb.weight, before)


@pytest.mark.parametrize("variant", [dict(), dict(laplacian_heads=1), dict(rope=True)])
def test_pins_lowered_block_size_is_nanogpts_crop_block_size(variant):
    """nanoGPT's ``crop_block_size(b)`` (keep the first ``b`` position embeddings, context ``b``) is lowering
    ``config.block_size`` after building: sampling (with and without the KV cache, prompt longer than the
    cropped block) equals a model built with ``block_size=b`` holding the cropped weights."""
    torch.manual_seed(0)
    kw = dict(vocab_size=13, n_layer=2, n_head=2, n_embd=16, **variant)
    big = DiffusionGPT(GPTConfig(block_size=16, **kw)).double()
    small = DiffusionGPT(GPTConfig(block_size=8, **kw)).double()
    state = big.state_dict()
    if "pos_emb.weight" in state:
        state["pos_emb.weight"] = state["pos_emb.weight"][:8]
    small.load_state_dict(state)
    big.config.block_size = 8
    idx = torch.randint(0, 13, (2, 11), generator=torch.Generator().manual_seed(3))
    for use_cache in (False, True):
        a = big.generate(idx, 6, generator=torch.Generator().manual_seed(0), use_cache=use_cache)
        b = small.generate(idx, 6, generator=torch.Generator().manual_seed(0), use_cache=use_cache)
        assert torch.equal(a, b), use_cache
    torch.testing.assert_close(big(idx[:, -8:])[0], small(idx[:, -8:])[0], rtol=0, atol=0)
    with pytest.raises(ValueError, match="block_size"):
        big(idx[:, -9:])


def test_pins_num_parameters_equals_nanogpts_get_num_params(nanogpt_reference):
    """``num_parameters(exclude_embeddings=True)`` counts what nanoGPT's ``get_num_params()`` counts (the
    tied head once, the position table left out); without the flag, ``get_num_params(False)``."""
    ref_mod = nanogpt_reference
    ref = ref_mod.GPT(ref_mod.GPTConfig(block_size=16, vocab_size=13, n_layer=3, n_head=2, n_embd=16, bias=True))
    ours = DiffusionGPT(GPTConfig(vocab_size=13, block_size=16, n_layer=3, n_head=2, n_embd=16, bias=True))
    assert ours.num_parameters(exclude_embeddings=True) == ref.get_num_params()
    assert ours.num_parameters() == ref.get_num_params(non_embedding=False)
