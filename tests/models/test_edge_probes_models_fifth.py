"""Edge probes (fifth pass): DiffusionGPT / DiffusionViT parity with nanoGPT and explicit references,
weight tying across conversions and loads, optimizer groups, registry overrides."""

from __future__ import annotations

import copy
import importlib.util
import io
import sys
from pathlib import Path

import pytest
import torch

from diffusionformer.models import DiffusionGPT, DiffusionViT, GPTConfig, ViTConfig, create_model
from diffusionformer.train import param_groups


_TINY = dict(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8)


def _tied(model: DiffusionGPT) -> bool:
    return model.lm_head.weight is model.tok_emb.weight


def _copy_weights(ref: torch.nn.Module, ours: DiffusionGPT, names: dict[str, str], seed: int = 1) -> None:
    ours_params = dict(ours.named_parameters())
    assert sorted(names[n] for n, _ in ref.named_parameters()) == sorted(ours_params)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in ref.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3 + (p.dim() < 2))
            ours_params[names[n]].copy_(p)


def test_bug_gpt_to_meta_keeps_the_tied_head() -> None:
    """Bug: ``model.to("meta")`` (a conversion that makes new parameters) converted the shared weight once for the
    embedding and once for the head: two parameters, ``num_parameters`` grew by ``vocab * D`` and a model then
    materialised with ``to_empty`` trained an untied head."""
    model = DiffusionGPT(GPTConfig(**_TINY))
    n = model.num_parameters()
    meta = copy.deepcopy(model).to("meta")
    assert _tied(meta) and meta.num_parameters() == n
    real = meta.to_empty(device="cpu")
    assert _tied(real) and real.num_parameters() == n
    assert len(param_groups(real, 0.1, rule="nanogpt")[0]["params"]) == len(param_groups(model, 0.1, rule="nanogpt")[0]["params"])
    untied = DiffusionGPT(GPTConfig(**_TINY, tie_weights=False)).to("meta")  # an untied model stays untied
    assert untied.lm_head.weight is not untied.tok_emb.weight


def test_bug_gpt_conversion_under_overwrite_module_params_keeps_the_tie() -> None:
    """Bug: with ``torch.__future__.set_overwrite_module_params_on_conversion(True)`` ``model.double()`` gave the
    head and the embedding a parameter each: the tie was lost silently (the head trained apart)."""
    model = DiffusionGPT(GPTConfig(**_TINY))
    n = model.num_parameters()
    before = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        converted = copy.deepcopy(model).double()
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(before)
    assert _tied(converted) and converted.num_parameters() == n
    assert converted.tok_emb.weight.dtype == torch.float64
    torch.testing.assert_close(converted.lm_head.weight, model.tok_emb.weight.double(), rtol=0, atol=0)


@pytest.mark.parametrize("meta", [False, True])
def test_bug_gpt_assign_load_of_a_head_only_state_dict_keeps_the_loaded_weight(meta: bool) -> None:
    """Bug: a tied model's state dict with the shared weight under ``lm_head.weight`` only (a shared tensor stored
    once, as safetensors' ``save_model`` keeps the first name in sorted order) loaded with ``assign=True``: the head
    took the weight, then the tie hook put the model's old embedding back in its place, the loaded weight dropped
    (on a meta-initialised model: a head left on the meta device)."""
    src = DiffusionGPT(GPTConfig(**_TINY))
    sd = {k: v.clone() for k, v in src.state_dict().items() if k != "tok_emb.weight"}
    if meta:
        with torch.device("meta"):
            model = DiffusionGPT(GPTConfig(**_TINY))
    else:
        torch.manual_seed(123)
        model = DiffusionGPT(GPTConfig(**_TINY))
    result = model.load_state_dict(sd, strict=False, assign=True)
    assert result.missing_keys == ["tok_emb.weight"] and not result.unexpected_keys
    assert _tied(model) and model.tok_emb.weight.device.type == "cpu"
    torch.testing.assert_close(model.tok_emb.weight, src.tok_emb.weight, rtol=0, atol=0)
    assert "_tie_from_head" not in model.__dict__
    idx = torch.randint(0, 13, (2, 8), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model(idx)[0], src(idx)[0], rtol=0, atol=0)
    # the embedding alone, and both entries, still load as before (with and without assign)
    for keep in (("tok_emb.weight",), ("tok_emb.weight", "lm_head.weight")):
        for assign in (False, True):
            sd2 = {k: v.clone() for k, v in src.state_dict().items() if k in keep or k not in ("tok_emb.weight", "lm_head.weight")}
            fresh = DiffusionGPT(GPTConfig(**_TINY))
            fresh.load_state_dict(sd2, strict=False, assign=assign)
            assert _tied(fresh) and torch.equal(fresh.lm_head.weight, src.tok_emb.weight)


@pytest.mark.parametrize("backend", ["auto", "sdpa", "matrix"])
@pytest.mark.parametrize("heads", [None, "softmax:3"])
def test_softmax_heads_equal_nanogpt_in_float64_on_every_cpu_backend(nanogpt_reference, backend, heads) -> None:
    """``heads="softmax:3"`` (an alias of attention) and the default heads equal nanoGPT's GPT (bias=True, tied)
    in logits, loss and every gradient, also for one token of one sequence."""
    R = nanogpt_reference
    torch.manual_seed(0)
    ref = R.GPT(R.GPTConfig(block_size=16, vocab_size=13, n_layer=2, n_head=3, n_embd=24, bias=True)).double()
    ours = DiffusionGPT(GPTConfig(vocab_size=13, block_size=16, n_layer=2, n_head=3, n_embd=24, backend=backend,
                                  heads=heads)).double()
    names = R.diffusionformer_names(2)
    _copy_weights(ref, ours, names)
    g = torch.Generator().manual_seed(2)
    for B, T in ((2, 11), (1, 1)):
        idx, tgt = torch.randint(0, 13, (B, T), generator=g), torch.randint(0, 13, (B, T), generator=g)
        ref.zero_grad(), ours.zero_grad()
        ref_logits, ref_loss = ref(idx, tgt)
        logits, loss = ours(idx, tgt)
        torch.testing.assert_close(logits, ref_logits, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
        ref_loss.backward(), loss.backward()
        mine = dict(ours.named_parameters())
        for n, p in ref.named_parameters():
            torch.testing.assert_close(mine[names[n]].grad, p.grad, rtol=1e-10, atol=1e-12, msg=n)


def test_benchmark_copy_of_nanogpt_equals_the_test_reference(nanogpt_reference) -> None:
    """``benchmarks/nanogpt_model.py`` (the benchmarks' baseline) computes what the test reference computes."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "nanogpt_model.py"
    spec = importlib.util.spec_from_file_location("_p5_nanogpt_bench", path)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclass reads its module
    try:
        spec.loader.exec_module(bench)
    finally:
        del sys.modules[spec.name]
    R = nanogpt_reference
    kw = dict(block_size=8, vocab_size=13, n_layer=2, n_head=2, n_embd=8, bias=True)
    ref, other = R.GPT(R.GPTConfig(**kw)).double(), bench.GPT(bench.NanoGPTConfig(**kw)).double()
    assert [n for n, _ in ref.named_parameters()] == [n for n, _ in other.named_parameters()]
    other.load_state_dict(ref.state_dict())
    idx = torch.randint(0, 13, (2, 8), generator=torch.Generator().manual_seed(0))
    for a, b in zip(ref(idx, idx), other(idx, idx)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)
    ours = DiffusionGPT(GPTConfig(**{k: kw[k] for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")}))
    assert ours.num_parameters() == ref.get_num_params(non_embedding=False)
    assert ours.num_parameters(exclude_embeddings=True) == ref.get_num_params(non_embedding=True)


def test_tie_survives_deepcopy_save_load_and_a_load_through_a_parent() -> None:
    """(torch.compile's wrapper holds the model as ``_orig_mod``: a parent module stands in for it, without
    importing dynamo, which alone takes seconds.)"""
    model = DiffusionGPT(GPTConfig(**_TINY))
    assert _tied(copy.deepcopy(model))
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    assert _tied(torch.load(buf, weights_only=False))
    compiled = torch.nn.ModuleDict({"_orig_mod": DiffusionGPT(GPTConfig(**_TINY))})
    sd = compiled.state_dict()
    assert "_orig_mod.lm_head.weight" in sd
    compiled.load_state_dict({"_orig_mod." + k: v for k, v in model.state_dict().items()}, assign=True)
    assert _tied(compiled._orig_mod) and torch.equal(compiled._orig_mod.lm_head.weight, model.tok_emb.weight)


@pytest.mark.parametrize("bias", [True, False])
def test_nanogpt_decay_groups_with_biases_and_through_a_wrapper(nanogpt_reference, bias: bool) -> None:
    R = nanogpt_reference
    ref = R.GPT(R.GPTConfig(block_size=8, vocab_size=13, n_layer=2, n_head=2, n_embd=8, bias=bias))
    ours = DiffusionGPT(GPTConfig(**_TINY, bias=bias))
    names = R.diffusionformer_names(2)
    ref_names = {id(p): n for n, p in ref.named_parameters()}
    theirs = ref.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu").param_groups
    for model, prefix in ((ours, ""), (torch.nn.ModuleDict({"_orig_mod": ours}), "_orig_mod.")):
        mine = param_groups(model, 0.1, rule="nanogpt")
        assert [g["weight_decay"] for g in mine] == [g["weight_decay"] for g in theirs]
        for m, t in zip(mine, theirs):
            assert m["names"] == [prefix + names[ref_names[id(p)]] for p in t["params"]]


def test_vit_non_square_and_signal_patches_equal_an_unfold_reference() -> None:
    """Row-major patch order and the patch embedding equal ``unfold`` + a matmul, for a non-square image and
    for 1-D signals of several channels."""
    torch.manual_seed(0)
    for size, C, p in (((8, 12), 3, 4), ((12,), 3, 4)):
        vit = DiffusionViT(ViTConfig(input_size=size, in_channels=C, patch_size=p, dim=8, depth=1, num_heads=2)).double()
        if len(size) == 2:
            x = torch.randn(2, C, *size, dtype=torch.float64)
            patches = x.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5).reshape(2, -1, C * p * p)
        else:
            x = torch.randn(2, size[0], C, dtype=torch.float64)
            patches = x.unfold(1, p, p).reshape(2, -1, C * p)
        tokens = patches @ vit.patch_embed.weight.reshape(8, -1).T + vit.patch_embed.bias
        ref = torch.cat([vit.cls_token.expand(2, -1, -1), tokens], 1) + vit.pos_embed
        torch.testing.assert_close(vit._embed(x), ref, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"patch_size=4 must divide input_size=\(30, 30\)"):
        create_model("vit-mnist", input_size=(30, 30))
    vit = create_model("vit-mnist", in_channels=3)
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 3, 28, 28\), got \(2, 1, 28, 28\)"):
        vit(torch.randn(2, 1, 28, 28))


@pytest.mark.parametrize("key, close", [("n_embed", "n_embd"), ("N_EMBD", "n_embd"), ("tie_weight", "tie_weights"),
                                        ("laplacian_head", "laplacian_heads")])
def test_registry_override_did_you_mean(key: str, close: str) -> None:
    with pytest.raises(ValueError, match=rf"unknown key '{key}'.*did you mean '{close}'"):
        create_model("gpt-char-tiny", **{key: 1})
    with pytest.raises(TypeError, match=r"n_embd: expected an int, got float 64.0"):
        create_model("gpt-char-tiny", n_embd=64.0)
    with pytest.raises(TypeError, match=r"tie_weights: expected a bool, got int 1"):
        create_model("gpt-char-tiny", tie_weights=1)
