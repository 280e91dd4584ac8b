"""``DiffusionGPT.from_nanogpt`` (task 51): a nanoGPT ``ckpt.pt`` loaded into the model, checked against nanoGPT's
own ``model.py`` (``tests/models/nanogpt_reference.py``, MIT) in float64, then with Laplacian heads and a fine-tune
step; and the errors for checkpoints that do not fit."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.models.gpt import _nanogpt_names

N_LAYER, N_HEAD, N_EMBD, BLOCK, VOCAB = 2, 2, 16, 16, 13


def _reference(R, bias: bool, flash: bool = False, dropout: float = 0.0):
    """nanoGPT's GPT in float64 with random weights (non-flash: with its causal-mask buffers)."""
    torch.manual_seed(0)
    ref = R.GPT(R.GPTConfig(block_size=BLOCK, vocab_size=VOCAB, n_layer=N_LAYER, n_head=N_HEAD, n_embd=N_EMBD,
                            dropout=dropout, bias=bias)).double()
    if not flash:  # nanoGPT on PyTorch < 2.0: explicit softmax, a causal-mask buffer per block
        for block in ref.transformer.h:
            block.attn.flash = False
            block.attn.register_buffer("bias", torch.tril(torch.ones(BLOCK, BLOCK, dtype=torch.float64))
                                       .view(1, 1, BLOCK, BLOCK))
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * (0.3 if p.dim() >= 2 else 1.0) + (p.dim() < 2))
    return ref


def _checkpoint(ref, bias: bool, compiled: bool = False, dropout: float = 0.0) -> dict:
    """The dict nanoGPT's train.py saves (``_orig_mod.`` prefixes: the state dict of a torch.compile model)."""
    model_args = dict(n_layer=N_LAYER, n_head=N_HEAD, n_embd=N_EMBD, block_size=BLOCK, bias=bias, vocab_size=VOCAB,
                      dropout=dropout)
    state = ref.state_dict()
    if compiled:
        state = {"_orig_mod." + k: v for k, v in state.items()}
    optimizer = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    return {"model": state, "optimizer": optimizer.state_dict(), "model_args": model_args, "iter_num": 250,
            "best_val_loss": torch.tensor(1.5), "config": {"batch_size": 12, "learning_rate": 1e-3,
                                                           "dataset": "shakespeare_char", "compile": compiled}}


def _batch():
    g = torch.Generator().manual_seed(2)
    return torch.randint(0, VOCAB, (3, BLOCK), generator=g), torch.randint(0, VOCAB, (3, BLOCK), generator=g)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_ckpt_file_loads_to_nanogpts_logits_and_loss_in_float64(nanogpt_reference, tmp_path, bias, compiled):
    """A real ckpt.pt (torch.save of train.py's dict, causal-mask buffers, with and without ``_orig_mod.``) read by
    path with weights_only: logits and loss equal nanoGPT's in float64; the head stays tied; bias=False: no
    biases; the dict and a bare state dict with model_args give the same model."""
    ref = _reference(nanogpt_reference, bias)
    path = tmp_path / "ckpt.pt"
    torch.save(_checkpoint(ref, bias, compiled), path)
    model = DiffusionGPT.from_nanogpt(path, backend="matrix")
    assert model.config.bias is bias and model.config.n_layer == N_LAYER and model.config.block_size == BLOCK
    assert model.lm_head.weight is model.tok_emb.weight
    assert any(n.endswith("bias") for n, _ in model.named_parameters()) is bias
    assert model.tok_emb.weight.dtype == torch.float64
    assert model.num_parameters() == sum(p.numel() for p in ref.parameters())
    idx, targets = _batch()
    ref.eval(), model.eval()
    ref_logits, ref_loss = ref(idx, targets)
    logits, loss = model(idx, targets)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    ckpt = _checkpoint(ref, bias, compiled)
    for other in (DiffusionGPT.from_nanogpt(str(path), backend="matrix"),
                  DiffusionGPT.from_nanogpt(ckpt, backend="matrix"),
                  DiffusionGPT.from_nanogpt(ckpt["model"], model_args=ckpt["model_args"], backend="matrix")):
        for (n, p), (m, q) in zip(model.state_dict().items(), other.state_dict().items()):
            assert n == m and torch.equal(p, q), n


def test_library_name_map_covers_nanogpts_parameters_exactly(nanogpt_reference):
    """The map (the conftest's, now the library's) sends every nanoGPT parameter to one DiffusionGPT parameter."""
    for bias in (False, True):
        ref = _reference(nanogpt_reference, bias, flash=True)
        ours = DiffusionGPT(GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=N_LAYER, n_head=N_HEAD,
                                      n_embd=N_EMBD, bias=bias))
        names = _nanogpt_names(N_LAYER)
        assert nanogpt_reference.diffusionformer_names is _nanogpt_names
        assert sorted(names[n] for n, _ in ref.named_parameters()) == sorted(n for n, _ in ours.named_parameters())


@pytest.mark.parametrize("heads", [dict(laplacian_heads="half"),
                                   dict(heads="attention:1,heat(t=0.5, steps=2, learnable=True):1")])
def test_other_heads_load_the_same_weights_and_fine_tune(nanogpt_reference, heads):
    """laplacian_heads='half' (or a learned heat head) loads the same weights as the all-attention model (the
    attention heads' qkv rows and every other parameter equal the checkpoint's); operator parameters keep their
    initial values; the logits change (other operators); an AdamW step on the loss runs and keeps the tie."""
    ref = _reference(nanogpt_reference, bias=True)
    ckpt = _checkpoint(ref, bias=True)
    plain = DiffusionGPT.from_nanogpt(ckpt)
    mixed = DiffusionGPT.from_nanogpt(ckpt, dropout=0.1, **heads)
    assert mixed.config.dropout == 0.1
    assert mixed.blocks[0].attn.head_operator_names[0] == "attention"
    assert mixed.blocks[0].attn.head_operator_names[1] != "attention"
    head_dim = N_EMBD // N_HEAD
    names = _nanogpt_names(N_LAYER)
    own = dict(mixed.named_parameters())
    for name, p in ref.named_parameters():
        torch.testing.assert_close(own[names[name]], p, rtol=0, atol=0, msg=name)
    for i, block in enumerate(mixed.blocks):
        w = ref.transformer.h[i].attn.c_attn.weight
        for part in range(3):  # q, k, v rows of head 0 (attention)
            rows = slice(part * N_EMBD, part * N_EMBD + head_dim)
            assert torch.equal(block.attn.qkv.weight[rows], w[rows])
    extra = {n: p for n, p in mixed.named_parameters() if ".operators." in n}
    if "heads" in heads:
        assert extra and all(torch.equal(p, torch.full_like(p, 0.5)) for p in extra.values()), extra
    idx, targets = _batch()
    mixed.eval()
    assert not torch.allclose(mixed(idx)[0], plain.eval()(idx)[0])
    mixed.train()
    opt = torch.optim.AdamW(mixed.parameters(), lr=1e-2)
    before = {n: p.detach().clone() for n, p in mixed.named_parameters()}
    _, loss = mixed(idx, targets)
    assert torch.isfinite(loss)
    loss.backward()
    opt.step()
    assert mixed.lm_head.weight is mixed.tok_emb.weight
    assert not torch.equal(before["blocks.0.attn.qkv.weight"], mixed.blocks[0].attn.qkv.weight)
    if extra:
        assert any(not torch.equal(before[n], p) for n, p in mixed.named_parameters() if n in extra)


class _Payload:
    ran = False

    def __reduce__(self):
        return (_mark_ran, ())


def _mark_ran():
    _Payload.ran = True
    return "ran"


def test_ckpt_needing_pickled_code_is_refused_not_run(nanogpt_reference, tmp_path):
    """A file that torch.load(weights_only=True) refuses is refused with a clear error; its code never runs."""
    ckpt = _checkpoint(_reference(nanogpt_reference, bias=False), bias=False)
    ckpt["config"]["callback"] = _Payload()
    path = tmp_path / "ckpt.pt"
    torch.save(ckpt, path)
    with pytest.raises(ValueError, match=r"weights_only=True.*refuses.*not loaded.*trust"):
        DiffusionGPT.from_nanogpt(path)
    assert _Payload.ran is False


def test_bad_checkpoints_and_overrides_are_refused_by_name(nanogpt_reference):
    """Shape overrides differing from the checkpoint, unknown keys, missing / unexpected / misshapen parameters,
    and sources of the wrong layout: each a clear error naming the key."""
    ref = _reference(nanogpt_reference, bias=False)
    ckpt = _checkpoint(ref, bias=False)
    for key, value in (("n_embd", 32), ("n_layer", 3), ("n_head", 4), ("vocab_size", 50), ("block_size", 8),
                       ("bias", True)):
        with pytest.raises(ValueError, match=rf"{key}={value!r} differs from the checkpoint's {key}="):
            DiffusionGPT.from_nanogpt(ckpt, **{key: value})
    DiffusionGPT.from_nanogpt(ckpt, n_embd=N_EMBD, n_layer=N_LAYER)  # equal: fine
    with pytest.raises(ValueError, match="unknown GPTConfig field.*'n_embed'"):
        DiffusionGPT.from_nanogpt(ckpt, n_embed=N_EMBD)
    with pytest.raises(ValueError, match="unknown model_args key.*'flash'"):
        DiffusionGPT.from_nanogpt({**ckpt, "model_args": {**ckpt["model_args"], "flash": True}})
    state = dict(ckpt["model"])
    del state["transformer.h.1.mlp.c_fc.weight"]
    with pytest.raises(ValueError, match=r"lacks nanoGPT's 'transformer\.h\.1\.mlp\.c_fc\.weight'"):
        DiffusionGPT.from_nanogpt({**ckpt, "model": state})
    state = {**ckpt["model"], "transformer.h.0.attn.c_attn.bias": torch.zeros(3 * N_EMBD, dtype=torch.float64)}
    with pytest.raises(ValueError, match=r"unexpected parameter 'transformer\.h\.0\.attn\.c_attn\.bias'"):
        DiffusionGPT.from_nanogpt({**ckpt, "model": state})
    state = {**ckpt["model"], "transformer.h.2.ln_1.weight": torch.ones(N_EMBD)}
    with pytest.raises(ValueError, match=r"unexpected parameter 'transformer\.h\.2\.ln_1\.weight'"):
        DiffusionGPT.from_nanogpt({**ckpt, "model": state})
    state = {**ckpt["model"], "transformer.wpe.weight": torch.zeros(BLOCK + 1, N_EMBD, dtype=torch.float64)}
    with pytest.raises(ValueError, match=r"'transformer\.wpe\.weight' has shape \(17, 16\), expected \(16, 16\)"):
        DiffusionGPT.from_nanogpt({**ckpt, "model": state})
    with pytest.raises(ValueError, match=r"unexpected parameter 'transformer\.wpe\.weight'.*has no 'pos_emb\.weight'"):
        DiffusionGPT.from_nanogpt(ckpt, rope=True)
    with pytest.raises(ValueError, match=r"'transformer\.h\.0\.attn\.c_attn\.weight' has shape \(48, 16\)"):
        DiffusionGPT.from_nanogpt(ckpt, n_kv_head=1)
    with pytest.raises(ValueError, match="needs model_args="):
        DiffusionGPT.from_nanogpt(ckpt["model"])
    with pytest.raises(ValueError, match="model_args is for a bare state dict"):
        DiffusionGPT.from_nanogpt(ckpt, model_args=ckpt["model_args"])
    with pytest.raises(ValueError, match="no 'model_args'"):
        DiffusionGPT.from_nanogpt({"model": ckpt["model"]})
    with pytest.raises(ValueError, match=r"entry 'lm_head\.weight' must be a tensor"):
        DiffusionGPT.from_nanogpt({**ckpt, "model": {**ckpt["model"], "lm_head.weight": [1.0]}})
    with pytest.raises(TypeError, match="source must be a path"):
        DiffusionGPT.from_nanogpt(ref)
    # a tied checkpoint whose head was trained apart: refused by the tie check, not loaded half-way
    state = {**ckpt["model"], "lm_head.weight": ckpt["model"]["lm_head.weight"] + 1.0}
    with pytest.raises(ValueError, match="ties them .*pass tie_weights=False"):
        DiffusionGPT.from_nanogpt({**ckpt, "model": state})


def test_modern_parts_snippet_loads_a_ckpt_and_fine_tunes(nanogpt_reference, tmp_path, monkeypatch):
    """The ``code-block:: python`` of docs/tutorials/modern_parts.rst (shown, not run, by the docs build) runs on a
    ckpt.pt at the path it names, and its optimizer steps the loaded model."""
    from pathlib import Path

    lines = (Path(__file__).resolve().parents[2] / "docs/tutorials/modern_parts.rst").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "DiffusionGPT.from_nanogpt(" in line and line.startswith("   "))
    body = []
    for line in lines[start:]:
        if line.strip() and not line.startswith(" "):
            break
        body.append(line[3:])
    (tmp_path / "out-shakespeare-char").mkdir()
    torch.save(_checkpoint(_reference(nanogpt_reference, bias=False), bias=False),
               tmp_path / "out-shakespeare-char" / "ckpt.pt")
    monkeypatch.chdir(tmp_path)
    scope = {"torch": torch, "DiffusionGPT": DiffusionGPT}
    exec("\n".join(body), scope)
    model, optimizer = scope["model"], scope["optimizer"]
    assert model.config.laplacian_heads == "half" and model.config.dropout == 0.1
    idx, targets = _batch()
    model(idx, targets)[1].backward()
    optimizer.step()
