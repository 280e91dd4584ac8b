"""Fresh-eyes review of sitting 52's changes (helper 52l): cross-feature edge cases of the day's new code."""

from __future__ import annotations

import os

import pytest
import torch

from diffusionformer.models import DiffusionGPT, GPTConfig


def test_crop_block_size_leaves_a_model_sharing_the_config_alone():
    """Bug: ``DiffusionGPT.crop_block_size`` lowered ``config.block_size`` in place, on the config object the
    model was built with: a second model built from the same ``GPTConfig`` (a teacher and a student, two seeds)
    had its context cut too, without a word (its ``generate`` slid a window of the cropped size, its forward
    refused longer sequences, and its state dict no longer loaded into ``DiffusionGPT(model.config)``). The
    cropped model now holds a config of its own."""
    config = GPTConfig(vocab_size=11, block_size=16, n_layer=1, n_head=2, n_embd=16)
    torch.manual_seed(0)
    cropped, other = DiffusionGPT(config).eval(), DiffusionGPT(config).eval()
    idx = torch.randint(0, 11, (1, 12))
    before = other(idx)[0]
    cropped.crop_block_size(8)
    assert cropped.config.block_size == 8
    assert config.block_size == 16 and other.config.block_size == 16
    torch.testing.assert_close(other(idx)[0], before, rtol=0, atol=0)  # refused T=12 > 8 before the fix
    DiffusionGPT(other.config).load_state_dict(other.state_dict())
    DiffusionGPT(cropped.config).load_state_dict(cropped.state_dict())


class _Hostile:
    def __reduce__(self):
        return (os.system, ("true",))


def _checkpoint_error(path) -> Exception:
    from diffusionformer.train import CheckpointError
    from diffusionformer.train.checkpoint import load_checkpoint

    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    return info.value


def test_a_blocked_global_is_not_advised_to_be_allowed(tmp_path):
    """Bug: a checkpoint naming a global of a module ``torch.load(weights_only=True)`` blocks (``os.system``: a
    doctored file; the trainer saves none) got the advice "allow the type it names
    (torch.serialization.add_safe_globals) ... and run again to resume", from the runner and from the error
    itself: no allow-list reaches a blocked module, so the run failed the same way again. The error and the
    runner's advice now say that the module is blocked, and the runner's advice is to delete the file."""
    from diffusionformer.experiments.runner import _not_resumed_advice

    path = tmp_path / "checkpoint.pt"
    torch.save({"step": 1, "model": {}, "extra": _Hostile()}, path)
    err = _checkpoint_error(path)
    assert "is blocked" in str(err) and "add_safe_globals" not in str(err)
    advice = _not_resumed_advice(err, str(path), "this")
    assert "add_safe_globals" not in advice and "blocked" in advice
    assert advice.startswith(f"Delete {path} to train this run again from step 0")


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4:UserWarning")
def test_the_cli_advice_for_a_checkpoint_in_another_protocol_agrees_with_its_error(tmp_path):
    """Bug: the command line's advice for a checkpoint that did not load (``_not_resumed_advice(exc, 'that
    checkpoint.pt', 'its')``) classified the error again from that placeholder path, which is no zip: a whole
    checkpoint saved with ``pickle_protocol=4`` was then advised away ("Delete that checkpoint.pt to train its run
    again"), right under its error saying "not damage: there is no need to delete it". The advice now reads what
    ``load_checkpoint`` found; that error no longer suggests ``add_safe_globals`` (no type to allow there)."""
    from diffusionformer.experiments.runner import _not_resumed_advice

    path = tmp_path / "checkpoint.pt"
    torch.save({"step": 1, "model": {}}, path, pickle_protocol=4)
    err = _checkpoint_error(path)
    assert "not damage: there is no need to delete it" in str(err) and "add_safe_globals" not in str(err)
    assert _not_resumed_advice(err, "that checkpoint.pt", "its").startswith(
        "that checkpoint.pt is whole: save it again with torch.save's default pickle protocol")


def test_from_nanogpt_reads_layernorm_however_spelt(nanogpt_reference):
    """Bug: ``from_nanogpt``'s refusal of norm overrides other than LayerNorm compared the override with
    ``"layernorm"`` as typed, while ``GPTConfig`` reads ``norm`` with case, ``_`` and ``-`` ignored:
    ``norm="LayerNorm"`` (nanoGPT's own class name) was refused with "nanoGPT's blocks normalise with LayerNorm".
    It now loads; other norms are still refused."""
    R = nanogpt_reference
    torch.manual_seed(0)
    ref = R.GPT(R.GPTConfig(block_size=8, vocab_size=13, n_layer=1, n_head=2, n_embd=16, dropout=0.0, bias=True))
    c = ref.config
    ckpt = {"model": ref.state_dict(), "model_args": dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd,
                                                           block_size=c.block_size, bias=c.bias,
                                                           vocab_size=c.vocab_size, dropout=c.dropout)}
    plain = DiffusionGPT.from_nanogpt(ckpt)
    for spelling in ("LayerNorm", "layer_norm", "Layer-Norm"):
        model = DiffusionGPT.from_nanogpt(ckpt, norm=spelling)
        assert model.config.norm == "layernorm"
        idx = torch.randint(0, 13, (1, 8))
        torch.testing.assert_close(model(idx)[0], plain(idx)[0], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"norm='RMSNorm': nanoGPT's blocks normalise with LayerNorm"):
        DiffusionGPT.from_nanogpt(ckpt, norm="RMSNorm")
