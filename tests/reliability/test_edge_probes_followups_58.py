"""Follow-ups of sitting 58's reviews: ``from_nanogpt`` of an untied checkpoint, ``from_transformer_conv`` of a
one-head ``concat=False`` convolution, and the bound on DINO's crop counts; each test failing before its fix."""

import pytest
import torch


def _nanogpt_state(tie_weights: bool) -> tuple[dict, dict]:
    """A nanoGPT-named state dict (of a small :class:`DiffusionGPT`) and its ``model_args``."""
    from diffusionformer.models import DiffusionGPT, GPTConfig
    from diffusionformer.models.gpt import _nanogpt_names

    torch.manual_seed(0)
    args = {"vocab_size": 11, "block_size": 8, "n_layer": 1, "n_head": 2, "n_embd": 8, "bias": True}
    ours = DiffusionGPT(GPTConfig(**args, tie_weights=tie_weights)).state_dict()
    return {theirs: ours[mine] for theirs, mine in _nanogpt_names(1).items() if mine in ours}, args


def test_from_nanogpt_of_an_untied_checkpoint_names_nanogpts_weights_and_tie_weights_false(tmp_path):
    """Bug: ``from_nanogpt`` of an untied checkpoint (``lm_head.weight`` != ``transformer.wte.weight``, a nanoGPT
    fork's) with the default ``tie_weights=True`` failed in ``load_state_dict`` with a RuntimeError naming this
    library's ``tok_emb.weight`` / ``lm_head.weight`` and not the way out; it is now a ValueError naming nanoGPT's
    parameters and ``tie_weights=False``, which loads both. A tied checkpoint (one tensor under both names, as
    ``torch.load`` gives it back) still loads."""
    from diffusionformer.models import DiffusionGPT

    state, args = _nanogpt_state(tie_weights=False)
    assert not torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])
    with pytest.raises(ValueError, match=r"from_nanogpt: the checkpoint's 'lm_head.weight' and "
                                         r"'transformer.wte.weight' hold different values.*pass tie_weights=False"):
        DiffusionGPT.from_nanogpt(state, model_args=args)
    model = DiffusionGPT.from_nanogpt(state, model_args=args, tie_weights=False)
    assert torch.equal(model.lm_head.weight, state["lm_head.weight"])
    assert torch.equal(model.tok_emb.weight, state["transformer.wte.weight"])

    tied, args = _nanogpt_state(tie_weights=True)
    path = tmp_path / "ckpt.pt"
    torch.save({"model": tied, "model_args": args}, path)
    model = DiffusionGPT.from_nanogpt(path)
    assert model.lm_head.weight is model.tok_emb.weight
    assert torch.equal(model.tok_emb.weight, tied["transformer.wte.weight"])


def test_from_transformer_conv_takes_one_head_without_concat():
    """Bug: ``TransformerConv(concat=False, heads=1)`` was refused, though the mean over one head is that head: it now
    converts (the layer's output is the convolution's, in float64); ``concat=False`` with more heads (a mean the
    layer cannot express) is still refused, by name."""
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import TransformerConv

    from diffusionformer import DiffusionAttention

    torch.manual_seed(0)
    conv = TransformerConv(8, 8, heads=1, concat=False, root_weight=False).double().eval()
    layer = DiffusionAttention.from_transformer_conv(conv)
    x, edge_index = torch.randn(6, 8, dtype=torch.float64), torch.tensor([[0, 1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 5, 0, 3]])
    torch.testing.assert_close(layer(x, edge_index), conv(x, edge_index), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"\(concat=False too with heads=1\), got concat=False$"):
        DiffusionAttention.from_transformer_conv(TransformerConv(8, 4, heads=2, concat=False, root_weight=False))


def test_crop_counts_past_the_cap_are_refused_when_the_config_is_read():
    """Bug: ``[tasks.ssl] local_crops = 2**63`` passed validation and failed at the first DINO step with torch's
    "Overflow when unpacking long long" and its C++ backtrace (``torch.rand(B, V, 8)``); crop counts are now at most
    1024 per image (DINO takes 2 global and up to 10 local), refused when the config is read, naming the key."""
    from diffusionformer.data.augment import MultiCropAugment
    from diffusionformer.experiments.config import load_experiment_config

    def config(local_crops):
        return {"name": "x", "seeds": [0], "operators": [{"name": "attention"}],
                "tasks": [{"name": "d", "dataset": "digits", "model": "dino-digits", "metric": "knn_test_acc",
                           "ssl": {"local_crops": local_crops}}]}

    for v in (2**63, 1025):
        with pytest.raises(ValueError, match=rf"task 'd': SSLConfig: MultiCropAugment.local_crops must be at most "
                                             rf"1024 .*, got {v}$"):
            load_experiment_config(config(v))
    assert load_experiment_config(config(1024)).tasks[0].ssl == {"local_crops": 1024}
    with pytest.raises(ValueError, match=r"MultiCropAugment.global_crops must be at most 1024 .*, got 1025$"):
        MultiCropAugment(global_crops=1025)
    assert MultiCropAugment(global_crops=1024, local_crops=1024).num_views == 2048
