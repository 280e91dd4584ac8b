"""Edge probes of ``DiffusionGPT.from_nanogpt`` (task 51x): checkpoints as nanoGPT's ``train.py`` writes them (numpy
numbers from older code, dropout, bf16/fp16, a cropped block size), nanoGPT's ``generate`` against ours, a fine-tune
in the library's Trainer, overrides the checkpoint cannot fill, and pins from a mutation audit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from diffusionformer.models import DiffusionGPT
from diffusionformer.models.gpt import _NANOGPT_ARGS, _NANOGPT_SHAPE_ARGS, _read_nanogpt

N_LAYER, N_HEAD, N_EMBD, BLOCK, VOCAB = 2, 2, 16, 8, 13
ARGS = dict(n_layer=N_LAYER, n_head=N_HEAD, n_embd=N_EMBD, block_size=BLOCK, bias=True, vocab_size=VOCAB, dropout=0.0)


def _reference(R, bias: bool = True, block: int = BLOCK, dropout: float = 0.0):
    """nanoGPT's GPT in float64 with weights large enough that sampling is not near-uniform."""
    torch.manual_seed(0)
    ref = R.GPT(R.GPTConfig(block_size=block, vocab_size=VOCAB, n_layer=N_LAYER, n_head=N_HEAD, n_embd=N_EMBD,
                            dropout=dropout, bias=bias)).double()
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * (0.5 if p.dim() >= 2 else 1.0) + (p.dim() < 2))
    return ref


def _checkpoint(ref, **model_args) -> dict:
    """train.py's dict: model, optimizer (stepped), model_args, iter_num, best_val_loss (0-d tensor), config."""
    c = ref.config
    args = dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, block_size=c.block_size, bias=c.bias,
                vocab_size=c.vocab_size, dropout=c.dropout, **model_args)
    opt = torch.optim.AdamW(ref.parameters(), lr=0.0)  # lr 0: moments but no change to the weights
    idx = torch.zeros(1, 4, dtype=torch.long)
    ref(idx, idx)[1].backward()
    opt.step()
    return {"model": ref.state_dict(), "optimizer": opt.state_dict(), "model_args": args, "iter_num": 2000,
            "best_val_loss": torch.tensor(1.47), "config": {"out_dir": "out", "learning_rate": 1e-3, "decay_lr": True,
                                                           "dtype": "bfloat16", "compile": True, "dropout": c.dropout}}


def _ids(n: int = 5, b: int = 2):
    return torch.randint(0, VOCAB, (b, n), generator=torch.Generator().manual_seed(4))


@torch.no_grad()
def _nanogpt_generate(model, idx, max_new_tokens, temperature=1.0, top_k=None):
    """nanoGPT's ``GPT.generate`` (model.py, MIT), verbatim but for the self argument."""
    for _ in range(max_new_tokens):
        idx_cond = idx if idx.size(1) <= model.config.block_size else idx[:, -model.config.block_size:]
        logits, _ = model(idx_cond)
        logits = logits[:, -1, :] / temperature
        if top_k is not None:
            v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
            logits[logits < v[:, [-1]]] = -float('Inf')
        probs = F.softmax(logits, dim=-1)
        idx_next = torch.multinomial(probs, num_samples=1)
        idx = torch.cat((idx, idx_next), dim=1)
    return idx


def test_numpy_numbers_in_model_args_load_as_python_numbers(nanogpt_reference):
    """Bug: a checkpoint whose model_args hold numpy numbers (np.int64 sizes, np.bool_ bias: older training code
    writes them; nanoGPT's own GPTConfig takes them) was refused with "GPTConfig.bias: expected bool, got
    numpy.bool"; they are now read as the Python numbers they equal, and the model equals nanoGPT's."""
    ref = _reference(nanogpt_reference)
    ckpt = _checkpoint(ref)
    ckpt["model_args"] = {k: (np.bool_(v) if isinstance(v, bool) else np.int64(v) if isinstance(v, int)
                              else np.float64(v)) for k, v in ckpt["model_args"].items()}
    model = DiffusionGPT.from_nanogpt(ckpt, backend="matrix").eval()
    assert model.config.bias is True and type(model.config.n_layer) is int and type(model.config.dropout) is float
    idx = _ids(BLOCK)
    torch.testing.assert_close(model(idx)[0][:, -1:], ref.eval()(idx)[0], rtol=1e-12, atol=1e-12)
    model = DiffusionGPT.from_nanogpt(ckpt["model"], model_args=ckpt["model_args"], n_layer=N_LAYER)
    assert model.config.bias is True


def test_weights_only_refusal_names_the_refused_global(nanogpt_reference, tmp_path):
    """Bug: the error for a file that torch.load(weights_only=True) refuses quoted torch's generic first line
    ("Weights only load failed. ...", with terminal escape codes) and never the global it refused; it now names it
    (here numpy's scalar, as a checkpoint with numpy model_args holds), without escape codes."""
    ckpt = _checkpoint(_reference(nanogpt_reference))
    ckpt["model_args"]["n_layer"] = np.int64(N_LAYER)
    path = tmp_path / "ckpt.pt"
    torch.save(ckpt, path)
    with pytest.raises(ValueError, match=r"refuses \(Unsupported global: GLOBAL numpy\S*scalar\); it was not loaded") as err:
        DiffusionGPT.from_nanogpt(path)
    assert "\x1b" not in str(err.value)
    # loaded by the user (trusted) and passed as a dict: taken
    model = DiffusionGPT.from_nanogpt(torch.load(path, weights_only=False))
    assert model.config.n_layer == N_LAYER


def test_train_py_checkpoint_with_dropout_and_the_eval_override(nanogpt_reference, tmp_path):
    """A ckpt.pt trained with dropout 0.2 (model_args and config say so) loads with dropout 0.2 in training mode;
    dropout=0.0 overrides it for evaluation and gives nanoGPT's logits (dropout is not a shape field)."""
    ref = _reference(nanogpt_reference, dropout=0.2)
    path = tmp_path / "ckpt.pt"
    torch.save(_checkpoint(ref), path)
    model = DiffusionGPT.from_nanogpt(path)
    assert model.config.dropout == 0.2 and model.training
    assert "dropout" not in _NANOGPT_SHAPE_ARGS
    model = DiffusionGPT.from_nanogpt(path, dropout=0.0, backend="matrix")
    assert model.config.dropout == 0.0
    idx = _ids(BLOCK)
    torch.testing.assert_close(model.eval()(idx)[0][:, -1:], ref.eval()(idx)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_checkpoint_keeps_its_dtype_and_values(nanogpt_reference, tmp_path, dtype):
    """A bf16/fp16 state dict (train.py's dtype saved as is): the model is in that dtype, every parameter equal to
    the checkpoint's bit for bit, and it runs forward and generate."""
    ckpt = _checkpoint(_reference(nanogpt_reference))
    ckpt["model"] = {k: v.to(dtype) for k, v in ckpt["model"].items()}
    path = tmp_path / "ckpt.pt"
    torch.save(ckpt, path)
    model = DiffusionGPT.from_nanogpt(path)
    from diffusionformer.models.gpt import _nanogpt_names
    own = model.state_dict()
    for a, b in _nanogpt_names(N_LAYER).items():
        assert own[b].dtype == dtype and torch.equal(own[b], ckpt["model"][a]), a
    assert model.eval()(_ids())[0].dtype == dtype
    assert model.generate(_ids(), 3, temperature=0).shape == (2, 8)


def test_cropped_block_size_checkpoint_and_cropping_after_loading(nanogpt_reference):
    """nanoGPT's crop_block_size (train.py then saves model_args['block_size'] = the cropped size) leaves wpe with
    that many rows: it loads; a checkpoint whose model_args were not updated is refused naming wpe's shape; lowering
    model.config.block_size after loading (the docstring's advice) crops forward's and generate's context."""
    ref = _reference(nanogpt_reference, block=16)
    ref.transformer.wpe.weight = torch.nn.Parameter(ref.transformer.wpe.weight[:BLOCK])  # crop_block_size
    ref.config.block_size = BLOCK
    ckpt = _checkpoint(ref)
    model = DiffusionGPT.from_nanogpt(ckpt, backend="matrix").eval()
    assert model.config.block_size == BLOCK and model.pos_emb.weight.shape == (BLOCK, N_EMBD)
    with pytest.raises(ValueError, match=r"'transformer\.wpe\.weight' has shape \(8, 16\), expected \(16, 16\)"):
        DiffusionGPT.from_nanogpt({**ckpt, "model_args": {**ckpt["model_args"], "block_size": 16}})
    model.config.block_size = 4
    with pytest.raises(ValueError, match="exceeds block_size=4"):
        model(_ids(5))
    ref.config.block_size = 4
    assert torch.equal(model.generate(_ids(5), 6, temperature=0), _nanogpt_generate(ref.eval(), _ids(5), 6, 1e-9))


@pytest.mark.parametrize("kwargs", [dict(temperature=0.8, top_k=5), dict(temperature=1.0),
                                    dict(temperature=1.5, top_k=3)])
def test_generate_equals_nanogpts_generate(nanogpt_reference, kwargs):
    """The loaded model's generate (same global seed, or a generator seeded alike, with and without the KV cache)
    draws nanoGPT's tokens, past block_size too (the window slides); greedy (temperature=0) equals nanoGPT's
    argmax (a tiny temperature)."""
    ref = _reference(nanogpt_reference).eval()
    model = DiffusionGPT.from_nanogpt(_checkpoint(ref), backend="matrix").eval()
    prompt = _ids()
    torch.manual_seed(3)
    want = _nanogpt_generate(ref, prompt, 2 * BLOCK, **kwargs)
    assert len(set(want[:, BLOCK:].flatten().tolist())) > 1
    torch.manual_seed(3)
    assert torch.equal(model.generate(prompt, 2 * BLOCK, **kwargs), want)
    assert torch.equal(model.generate(prompt, 2 * BLOCK, generator=torch.Generator().manual_seed(3), **kwargs), want)
    torch.manual_seed(3)
    assert torch.equal(model.generate(prompt, 2 * BLOCK, use_cache=True, **kwargs), want)
    greedy = _nanogpt_generate(ref, prompt, 2 * BLOCK, 1e-9)
    assert torch.equal(model.generate(prompt, 2 * BLOCK, temperature=0), greedy)


def test_loaded_model_fine_tunes_in_the_trainer(nanogpt_reference, tmp_path):
    """The loaded model (Laplacian heads for half, the checkpoint's dropout overridden) trains in the library's
    Trainer: finite losses, weights moved, the head still tied to the embedding."""
    from diffusionformer.data import SequenceTaskData
    from diffusionformer.experiments.tasks import SequenceLMTask
    from diffusionformer.train import Trainer, TrainConfig

    ckpt = _checkpoint(_reference(nanogpt_reference, dropout=0.2))
    model = DiffusionGPT.from_nanogpt(ckpt, laplacian_heads="half", dropout=0.0).float()
    before = model.blocks[0].attn.qkv.weight.detach().clone()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (16, BLOCK), generator=g)
    y = torch.roll(x, -1, dims=1)
    data = SequenceTaskData("copy", x, y, x[:4], y[:4], x[4:8], y[4:8], VOCAB)
    config = TrainConfig(max_steps=3, batch_size=8, lr=1e-3, warmup_steps=0, eval_interval=3, log_interval=1,
                         checkpoint_interval=0, seed=0, device="cpu", progress=False)
    summary = Trainer(model, SequenceLMTask(data), config, tmp_path / "run").fit()
    assert summary is not None
    assert not torch.equal(before, model.blocks[0].attn.qkv.weight)
    assert model.lm_head.weight is model.tok_emb.weight
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_overrides_the_checkpoint_cannot_fill_are_refused_by_name(nanogpt_reference):
    """Heads adding up to more than n_head, GQA, RoPE, qk_norm, RMSNorm and gated MLPs need parameters nanoGPT has
    not got (or of other shapes): each is refused naming what differs, nothing half-loaded."""
    ckpt = _checkpoint(_reference(nanogpt_reference))
    cases = [(dict(heads="attention:2,heat(t=0.5):2"), r"assigns 4 heads but the layer has num_heads=2"),
             (dict(n_kv_head=1),
              r"'transformer\.h\.0\.attn\.c_attn\.weight' has shape \(48, 16\), expected \(32, 16\)"),
             (dict(rope=True), r"unexpected parameter 'transformer\.wpe\.weight'"),
             (dict(qk_norm=True), r"lacks 'blocks\.0\.attn\.q_norm\.weight' \(no nanoGPT parameter\)"),
             (dict(norm="rmsnorm"), r"norm='rmsnorm': nanoGPT's blocks normalise with LayerNorm"),  # sitting 52
             (dict(mlp="swiglu"), r"'transformer\.h\.0\.mlp\.c_fc\.weight' has shape \(64, 16\)")]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            DiffusionGPT.from_nanogpt(ckpt, **kwargs)
    model = DiffusionGPT.from_nanogpt(ckpt, heads="attention:1,heat(t=0.5):1", n_kv_head=N_HEAD)
    assert model.blocks[0].attn.head_operator_names == ["attention", "heat"]


def test_untied_head_loads_only_untied_and_extra_entries_are_named(nanogpt_reference):
    """A state dict whose lm_head was trained apart from wte loads with tie_weights=False (both kept as they are);
    an extra non-nanoGPT entry is refused by name; a causal-mask buffer (any layer) is skipped."""
    ckpt = _checkpoint(_reference(nanogpt_reference))
    state = dict(ckpt["model"])
    state["lm_head.weight"] = state["lm_head.weight"] + 1.0
    model = DiffusionGPT.from_nanogpt({**ckpt, "model": state}, tie_weights=False)
    assert torch.equal(model.lm_head.weight, state["lm_head.weight"])
    assert torch.equal(model.tok_emb.weight, state["transformer.wte.weight"])
    with pytest.raises(ValueError, match=r"unexpected parameter 'transformer\.h\.0\.attn\.rel_bias'"):
        DiffusionGPT.from_nanogpt({**ckpt, "model": {**ckpt["model"], "transformer.h.0.attn.rel_bias": torch.zeros(2)}})
    with pytest.raises(ValueError, match=r"unexpected parameter 'step'"):
        DiffusionGPT.from_nanogpt({**ckpt, "model": {**ckpt["model"], "step": torch.tensor(3)}})
    mask = torch.tril(torch.ones(1, 1, BLOCK, BLOCK))
    DiffusionGPT.from_nanogpt({**ckpt, "model": {**ckpt["model"], "_orig_mod.transformer.h.1.attn.bias": mask}})


def test_unreadable_file_is_a_clear_error_naming_it(nanogpt_reference, tmp_path):
    """Bug: a path to a file torch.load cannot read (a text file, a truncated legacy pickle, a zip that is not a
    checkpoint) raised torch's bare unpickler error (``KeyError: '101'``, ``struct.error``, a RuntimeError): it is
    now a ValueError naming the file and torch's cause; a missing path keeps torch's FileNotFoundError."""
    for name, data in (("notes.txt", b"hello world, not a checkpoint"), ("cut.pt", b"\x80\x02}q\x00(X")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=rf"{name} is not a readable torch.save file .*torch.load failed with"):
            DiffusionGPT.from_nanogpt(tmp_path / name)
    with pytest.raises(FileNotFoundError):
        DiffusionGPT.from_nanogpt(tmp_path / "missing.pt")


def test_pin_refused_pickle_operand_is_named(tmp_path):
    """Bug: a pickle that weights_only refuses for an operand (not a global) was refused quoting torch's generic
    first line only; the error now names the operand (the fix of the refused-global test). A bare pickle (not
    torch.save's zip) with an operand weights_only does not read is called unreadable (a damaged byte reads so,
    sitting 52); a whole zip written with pickle protocol 4 is refused naming the opcode and protocol."""
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"\x80\x02\x82\x01.")  # EXT1: an operand weights_only does not support
    with pytest.raises(ValueError, match=r"not a readable torch\.save file .*UnpicklingError: Unsupported operand 130$"):
        DiffusionGPT.from_nanogpt(path)
    torch.save({"model": {}, "model_args": {}}, path, pickle_protocol=4)
    with pytest.raises(ValueError, match=r"refuses \(Unsupported operand 149 \(FRAME, pickle protocol 4\): .*\); it was"):
        DiffusionGPT.from_nanogpt(path)


def test_pin_defaults_of_missing_model_args_are_nanogpts(nanogpt_reference):
    """Pin: model_args keys missing from a checkpoint take the defaults of nanoGPT's own GPTConfig (its dataclass)."""
    import dataclasses

    assert _NANOGPT_ARGS == dataclasses.asdict(nanogpt_reference.GPTConfig())
    assert all(type(v) is type(d) for v, d in zip(_NANOGPT_ARGS.values(), dataclasses.asdict(
        nanogpt_reference.GPTConfig()).values()))
    assert _read_nanogpt({}, {})[1] == dataclasses.asdict(nanogpt_reference.GPTConfig())
    assert _read_nanogpt({}, {"n_layer": 2})[1]["n_layer"] == 2


def test_pin_block_size_hint_only_for_block_size(nanogpt_reference):
    """Pin: the block_size override's error tells how to crop (model.crop_block_size, sitting 52); other fields'
    don't."""
    ckpt = _checkpoint(_reference(nanogpt_reference))
    with pytest.raises(ValueError, match=r"block_size=4 differs.*model\.crop_block_size\(n\) after loading"):
        DiffusionGPT.from_nanogpt(ckpt, block_size=4)
    with pytest.raises(ValueError, match="n_layer=3 differs") as err:
        DiffusionGPT.from_nanogpt(ckpt, n_layer=3)
    assert "crop" not in str(err.value)


def test_pin_non_float_embedding_keeps_the_models_float_dtype(nanogpt_reference):
    """Pin: the model takes the embedding's dtype only when it is a float dtype (an integer wte leaves it float32,
    the values copied in)."""
    ckpt = _checkpoint(_reference(nanogpt_reference))
    state = {k: (torch.ones(v.shape, dtype=torch.int64) if k in ("transformer.wte.weight", "lm_head.weight") else v)
             for k, v in ckpt["model"].items()}
    model = DiffusionGPT.from_nanogpt({**ckpt, "model": state})
    assert model.tok_emb.weight.dtype == torch.float32 and bool((model.tok_emb.weight == 1).all())


def test_pin_corrupt_file_and_cpu_map_location(nanogpt_reference, tmp_path, monkeypatch):
    """Pin: a ckpt.pt whose tensor bytes changed after writing is refused as corrupt (torch.load would read other
    numbers); the file is read onto the CPU (map_location='cpu': a checkpoint saved from CUDA tensors loads on a
    machine without a GPU), with weights_only."""
    ckpt = _checkpoint(_reference(nanogpt_reference))
    path = tmp_path / "ckpt.pt"
    torch.save(ckpt, path)
    seen = []
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: seen.append(k) or real(*a, **k))
    DiffusionGPT.from_nanogpt(path)
    assert seen == [dict(map_location="cpu", weights_only=True)]
    monkeypatch.undo()
    data = bytearray(path.read_bytes())
    wte = ckpt["model"]["transformer.wte.weight"]
    raw = wte.numpy().tobytes()
    i = bytes(data).index(raw[:32])
    data[i + 3] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"ckpt\.pt is corrupt: its entry .* fails its CRC-32"):
        DiffusionGPT.from_nanogpt(path)


def test_pin_source_layout_errors(nanogpt_reference, tmp_path):
    """Pin: a file holding a bare state dict or a list, checkpoint['model'] that is not a dict, and model_args that
    is not a dict: each a ValueError saying what was expected (not a later AttributeError/TypeError)."""
    ckpt = _checkpoint(_reference(nanogpt_reference))
    for name, obj, match in (("state.pt", ckpt["model"],
                              r"expected the file to hold nanoGPT's checkpoint dict.*with keys"),
                             ("list.pt", [1, 2], r"expected the file to hold nanoGPT's checkpoint dict.*got list$")):
        torch.save(obj, tmp_path / name)
        with pytest.raises(ValueError, match=match):
            DiffusionGPT.from_nanogpt(tmp_path / name)
    with pytest.raises(ValueError, match=r"checkpoint\['model'\] must be a state dict, got list"):
        DiffusionGPT.from_nanogpt({**ckpt, "model": list(ckpt["model"].items())})
    with pytest.raises(ValueError, match=r"model_args must be a dict, got list"):
        DiffusionGPT.from_nanogpt(ckpt["model"], model_args=list(ckpt["model_args"].items()))


def test_pin_mask_buffer_pattern_duplicates_keys_and_numpy_arrays(nanogpt_reference):
    """Pin: only ``transformer.h.{i}.attn.bias`` is skipped as a causal mask (a longer or other-rooted ``attn.bias``
    is an unexpected parameter); a key given with and without ``_orig_mod.`` is refused; a non-str key is named as
    unexpected; a 1-element numpy array in model_args is not read as a number."""
    ckpt = _checkpoint(_reference(nanogpt_reference))
    for key in ("transformer.h.0.mlp.attn.bias", "encoder.h.0.attn.bias"):
        with pytest.raises(ValueError, match=rf"unexpected parameter '{key}'"):
            DiffusionGPT.from_nanogpt({**ckpt, "model": {**ckpt["model"], key: torch.zeros(3)}})
    state = {**ckpt["model"], "_orig_mod.lm_head.weight": ckpt["model"]["lm_head.weight"]}
    with pytest.raises(ValueError, match=r"holds 'lm_head\.weight' twice \(with and without '_orig_mod\.'\)"):
        DiffusionGPT.from_nanogpt({**ckpt, "model": state})
    with pytest.raises(ValueError, match=r"unexpected parameter 7 in the nanoGPT state dict"):
        DiffusionGPT.from_nanogpt({**ckpt, "model": {**ckpt["model"], 7: torch.zeros(1)}})
    assert _read_nanogpt({}, {"n_layer": np.array([2])})[1]["n_layer"].shape == (1,)
    with pytest.raises((TypeError, ValueError), match="n_layer"):
        DiffusionGPT.from_nanogpt(ckpt["model"], model_args={**ckpt["model_args"], "n_layer": np.array([2])})


@pytest.mark.parametrize("message, match", [
    ("invalid load key, 'x'.", r"not a readable torch\.save file .*UnpicklingError: invalid load key"),
    ("Unsupported global: GLOBAL foo.Bar was not an allowed global", r"refuses \(Unsupported global: GLOBAL foo\.Bar\)"),
    ("Weights only load failed. \x1b[1mOnly if you trust it\x1b[0m.\nUnsupported class foo.Bar",
     r"refuses \(Unsupported class foo\.Bar\); it was not loaded"),
    ("Weights only load failed. \x1b[1mOnly if you trust it\x1b[0m. WeightsUnpickler error: \n\nString is too long",
     r"not a readable torch\.save file .*UnpicklingError: String is too long$")])
def test_pin_unpickling_errors_of_other_torch_versions(tmp_path, monkeypatch, message, match):
    """Pin: torch.load's UnpicklingError as other torch versions word it: a plain pickle error is an unreadable
    file; a named global or class is quoted without the generic line or terminal escape codes; an unpickler error
    that refuses nothing (damaged bytes) is an unreadable file quoting the unpickler's own line (sitting 52)."""
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"x")

    def load(*args, **kwargs):
        raise __import__("pickle").UnpicklingError(message)

    monkeypatch.setattr(torch, "load", load)
    with pytest.raises(ValueError, match=match) as err:
        DiffusionGPT.from_nanogpt(path)
    assert "\x1b" not in str(err.value)
