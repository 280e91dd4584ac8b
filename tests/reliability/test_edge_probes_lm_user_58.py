"""A nanoGPT user's walk through ``DiffusionGPT`` (round 58): loading nanoGPT weights stored with the tied
embedding / head tensor once, against nanoGPT's own model (``tests/models/nanogpt_reference.py``) in float64."""

from __future__ import annotations

import pytest
import torch


def _nanogpt(nanogpt_reference, **kw):
    args = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, bias=False, vocab_size=11, dropout=0.0)
    args.update(kw)
    torch.manual_seed(0)
    return nanogpt_reference.GPT(nanogpt_reference.GPTConfig(**args)).double().eval(), args


@pytest.mark.parametrize("stored", ["transformer.wte.weight", "lm_head.weight"])
@pytest.mark.parametrize("prefix", ["", "_orig_mod."])
def test_bug_from_nanogpt_loads_a_tied_tensor_stored_once(nanogpt_reference, stored, prefix):
    """nanoGPT's wte and lm_head are one tensor; a state dict that stores it once (safetensors' ``save_model``
    keeps one name of a shared tensor, as the model's own ``load_state_dict`` already accepts) was refused with
    "the checkpoint lacks nanoGPT's 'lm_head.weight'" (or 'transformer.wte.weight'); with only the head, the
    model's dtype was not the checkpoint's either (float32 for a float64 checkpoint)."""
    from diffusionformer.models import DiffusionGPT

    ref, args = _nanogpt(nanogpt_reference)
    dropped = {"transformer.wte.weight": "lm_head.weight", "lm_head.weight": "transformer.wte.weight"}[stored]
    state = {prefix + k: v for k, v in ref.state_dict().items() if k != dropped}
    model = DiffusionGPT.from_nanogpt(state, model_args=args).eval()
    assert model.tok_emb.weight.dtype == torch.float64
    assert model.lm_head.weight is model.tok_emb.weight
    idx = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(2))
    logits, loss = model(idx, targets)
    ref_logits, ref_loss = ref(idx, targets)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    # untied on request, one stored tensor is still missing a parameter: refused, naming it
    with pytest.raises(ValueError, match=f"lacks nanoGPT's '{dropped}'"):
        DiffusionGPT.from_nanogpt(state, model_args=args, tie_weights=False)
