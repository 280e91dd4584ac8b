"""Edge-case probes of round trips and generation over every registered operator (rivals included):
KV-cache decoding against the full forward in float64, ``heads_spec()`` -> rebuild -> ``load_state_dict``,
checkpoint files that are corrupt or hostile. References are independent: the full forward recomputed
on the whole prefix, a greedy loop written here, the state dict copied tensor by tensor."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import os

import pytest
import torch

from diffusionformer.config import config_from_dict
from diffusionformer.models import DiffusionGPT, GPTConfig, create_model, model_config
from diffusionformer.nn.attention import DiffusionAttention
from diffusionformer.operators import build_operator, list_operators
from diffusionformer.train import CheckpointError, TrainConfig
from diffusionformer.train.checkpoint import CHECKPOINT_FORMAT, load_checkpoint, save_checkpoint

# a version of every registered operator with its learnable parameters on (where it has any)
_LEARNABLE = {"heat": "heat(t=0.7, learnable=True)", "heat-exact": "heat-exact(t=0.5, learnable=True)",
              "ppr": "ppr(alpha=0.3, steps=3, learnable=True)", "polynomial": "polynomial(steps=2, init='laplacian')",
              "grand-nl": "grand-nl(t=0.5, steps=2)", "attnscale": "attnscale(omega=0.25)"}
_SPECS = [_LEARNABLE.get(name, name) for name in list_operators()]


def _perturb(module: torch.nn.Module, seed: int = 0) -> None:
    """Move every parameter off its initial value (learned operator values included)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def _gpt(heads, **kw) -> DiffusionGPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=13, block_size=6, n_layer=2, n_head=4, n_embd=16, heads=heads)
    model = DiffusionGPT(GPTConfig(**{**cfg, **kw})).double().eval()
    _perturb(model)
    return model


# ---------------------------------------------------------------------------- generation and the KV cache
@pytest.mark.parametrize("spec", _SPECS)
def test_cached_decoding_equals_the_full_forward_for_every_operator(spec):
    """Pins: token by token (batch of 2, first layer mixed, second all of one operator, RoPE with one
    key/value head), the cached logits equal the full float64 forward recomputed on the whole prefix."""
    model = _gpt([f"attention:2,{spec}:2", f"{spec}:4"], rope=True, n_kv_head=1)
    tokens = torch.randint(0, 13, (2, 6), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache()
    cached = torch.cat([model.forward_cached(tokens[:, i : i + 1], cache) for i in range(6)], dim=1)
    torch.testing.assert_close(cached, model(tokens)[0], atol=1e-12, rtol=0)


@pytest.mark.parametrize("spec", _SPECS)
def test_greedy_generation_with_and_without_cache_equals_a_loop_over_the_full_forward(spec):
    """Pins: prompts of length 1 and of block_size (the window slides at once), cached or not, give the
    tokens of a greedy loop over the full forward; the model's train mode is given back."""
    model = _gpt(f"attention:2,{spec}:2").train()
    for T0 in (1, 6):
        prompt = torch.randint(0, 13, (3, T0), generator=torch.Generator().manual_seed(T0))
        expected = prompt
        with torch.no_grad():
            for _ in range(4):
                logits = model.eval()(expected[:, -6:])[0][:, -1]
                expected = torch.cat([expected, logits.argmax(-1, keepdim=True)], dim=1)
        model.train()
        for use_cache in (False, True):
            assert torch.equal(model.generate(prompt, 4, temperature=0, use_cache=use_cache), expected)
            assert model.training
    assert torch.equal(model.generate(prompt, 0), prompt)


def test_generate_with_a_temperature_below_float32s_smallest_number_is_greedy():
    """Bug: ``generate(temperature=1e-300)`` (a legal positive float) raised torch's "probability tensor
    contains either inf, nan or element < 0": in float32 the temperature is 0, and the row maximum
    (shifted to 0) became 0 / 0 = NaN. Now the maximum stays 0 and sampling is greedy."""
    model = _gpt("attention:2,laplacian:2")
    prompt = torch.randint(0, 13, (3, 2), generator=torch.Generator().manual_seed(0))
    greedy = model.generate(prompt, 4, temperature=0)
    for temperature in (1e-300, 5e-324):
        for use_cache in (False, True):
            out = model.generate(prompt, 4, temperature=temperature, use_cache=use_cache,
                                 generator=torch.Generator().manual_seed(0))
            assert torch.equal(out, greedy)


def test_an_index_on_another_device_than_the_model_is_refused():
    """Bug: a meta ``idx`` given to a CPU model returned CPU logits of garbage from ``forward`` (the
    embedding of a meta index), and torch's "Tensor on device cpu is not on the expected device meta!"
    from ``generate``. Now each entry point refuses it, naming both devices."""
    model = _gpt(None).float()
    idx = torch.randint(0, 13, (2, 3)).to("meta")
    for call in (lambda: model(idx), lambda: model.forward_cached(idx, model.new_cache()),
                 lambda: model.generate(idx, 2), lambda: model.generate(idx, 2, use_cache=True)):
        with pytest.raises(ValueError, match="idx must be on the model's device cpu, got meta"):
            call()
    assert model.to("meta")(idx)[0].shape == (2, 3, 13)  # a meta model still infers shapes


def test_a_cache_filled_by_another_model_is_refused_with_a_clear_error():
    """Bug: a cache filled by a model of another width raised torch.cat's "Sizes of tensors must match
    except in dimension 2"; now a ValueError names the cache's key shape and the layer's."""
    cache = _gpt("attention:2,heat:2", n_embd=8).new_cache()
    _gpt("attention:2,heat:2", n_embd=8).forward_cached(torch.zeros(1, 2, dtype=torch.long), cache)
    with pytest.raises(ValueError, match=r"expected a cache of 4 key/value heads of dim 4 .*got keys of shape "
                                         r"\(1, 4, 2, 2\)"):
        _gpt("attention:2,heat:2").forward_cached(torch.zeros(1, 1, dtype=torch.long), cache)


# ---------------------------------------------------------------------------- heads_spec and state dicts
@pytest.mark.parametrize("spec", _SPECS)
def test_heads_spec_rebuilds_every_operator_and_its_state_dict_loads(spec):
    """Pins: ``heads_spec()`` -> new layer -> ``load_state_dict`` of a ``torch.save`` / ``torch.load(weights_only=True)``
    copy gives the same outputs; so do ``copy.deepcopy`` and ``.to(torch.float64)`` (float64 in and out)."""
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, f"attention:1,{spec}:2,laplacian:1", causal=True)
    _perturb(layer)
    buf = io.BytesIO()
    torch.save(layer.state_dict(), buf)
    buf.seek(0)
    rebuilt = DiffusionAttention(16, 4, layer.heads_spec(), causal=True)
    rebuilt.load_state_dict(torch.load(buf, weights_only=True))
    x = torch.randn(2, 5, 16)
    assert rebuilt.heads_spec() == layer.heads_spec()
    assert torch.equal(rebuilt(x), layer(x)) and torch.equal(copy.deepcopy(layer)(x), layer(x))
    wide = copy.deepcopy(layer).to(torch.float64)
    assert wide(x.double()).dtype == torch.float64 and wide.heads_spec() == layer.heads_spec()
    torch.testing.assert_close(wide(x.double()).float(), layer(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("spec", ["heat(learnable=True)", "heat-exact(learnable=True)", "ppr(steps=3, learnable=True)",
                                  "polynomial(steps=2)", "attnscale"])
def test_heads_spec_of_one_learnable_instance_shared_by_heads_rebuilds_its_shapes(spec):
    """Bug: a layer built from one learnable operator instance shared by two heads (``[op, op, "attention"]``,
    a documented layout) wrote ``heads_spec()`` as ``'heat(...):2,...'``, which rebuilds one parameter per
    head: ``load_state_dict`` failed with "size mismatch for operators.0.t: ... [1] ... [2]". Now the spec
    says ``num_heads=1`` and the rebuilt layer loads the state dict and gives the same output."""
    torch.manual_seed(0)
    op = build_operator(spec)
    layer = DiffusionAttention(12, 3, [op, op, "attention"], causal=True)
    _perturb(layer)
    assert "num_heads=1):2," in layer.heads_spec()
    rebuilt = DiffusionAttention(12, 3, layer.heads_spec(), causal=True)
    rebuilt.load_state_dict(layer.state_dict())
    x = torch.randn(1, 4, 12)
    assert torch.equal(rebuilt(x), layer(x)) and rebuilt.heads_spec() == layer.heads_spec()


def test_one_heat_exact_instance_serves_several_heads():
    """Bug: one ``heat-exact`` instance (``num_heads=1``) given for several heads, a layout the layer accepts
    (``DiffusionAttention(D, H, build_operator("heat-exact"))`` or ``[op, op, ...]``), failed at the first call
    with "heat-exact serves 1 heads, got P with 2". Now its one ``t`` serves every head: the output equals a
    layer with one ``t`` per head, both set to that value (full forward and KV-cached decoding)."""
    torch.manual_seed(0)
    op = build_operator("heat-exact(t=0.4, learnable=True)")
    shared = DiffusionAttention(12, 3, [op, op, "attention"], causal=True)
    per_head = DiffusionAttention(12, 3, "heat-exact(t=0.4, learnable=True):2,attention:1", causal=True)
    state = shared.state_dict()
    per_head.load_state_dict({**state, "operators.0.t": state["operators.0.t"].expand(2).clone()})
    x = torch.randn(2, 5, 12)
    torch.testing.assert_close(shared(x), per_head(x), atol=1e-6, rtol=0)
    from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached

    cache = LayerKVCache()
    cached = torch.cat([attend_cached(shared, x[:, i : i + 1], cache) for i in range(5)], dim=1)
    torch.testing.assert_close(cached, per_head(x), atol=1e-6, rtol=0)
    assert DiffusionAttention(12, 3, build_operator("heat-exact"))(x).shape == x.shape


def test_num_heads_in_a_head_spec_item_is_read_not_overridden():
    """Bug: ``'heat(learnable=True, num_heads=1):2'`` silently built one parameter per head (the item's
    count overrode the spec's ``num_heads``), and ``num_heads=3`` for 2 heads was accepted the same way.
    Now 1 shares one operator among the heads, the count gives one per head, anything else is refused."""
    def t_shape(heads):
        return tuple(DiffusionAttention(12, 3, heads).state_dict()["operators.0.t"].shape)

    assert t_shape("heat(learnable=True, num_heads=1):2,attention:1") == (1,)
    assert t_shape("heat(learnable=True, num_heads=2):2,attention:1") == (2,)
    assert t_shape("heat(learnable=True):2,attention:1") == (2,)
    assert t_shape("heat(learnable=True, num_heads=1)") == (1,)
    for bad in ("3", "True", "'two'"):
        with pytest.raises(ValueError, match=rf"num_heads must be 1 \(one operator shared by the 2 heads\) or 2 "
                                             rf"\(one per head\), got {bad}"):
            DiffusionAttention(12, 3, f"heat(learnable=True, num_heads={bad}):2,attention:1")


def test_a_gpt_config_with_half_laplacian_heads_round_trips_through_a_table():
    """Bug: ``GPTConfig(laplacian_heads="half")`` (and ``[0, "half"]``) was accepted, but its own
    ``asdict`` read back with ``config_from_dict``, and ``create_model(..., laplacian_heads="half")``,
    raised "expected int | list[int] | None, got str 'half'": the annotation left out the documented "half"."""
    for value in ("half", [0, "half"]):
        cfg = GPTConfig(vocab_size=11, block_size=6, n_layer=2, n_head=4, n_embd=16, laplacian_heads=value)
        again = config_from_dict(GPTConfig, json.loads(json.dumps(dataclasses.asdict(cfg))))
        assert again == cfg
        torch.manual_seed(0)
        model = DiffusionGPT(cfg)
        rebuilt = DiffusionGPT(again)
        rebuilt.load_state_dict(model.state_dict())
        assert rebuilt.blocks[1].attn.heads_spec() == "attention:2,laplacian:2"
    model = create_model("gpt-char-tiny", laplacian_heads="half")
    assert model.blocks[0].attn.heads_spec() == "attention:2,laplacian:2"
    with pytest.raises(ValueError, match="laplacian_heads must be an int, 'half'"):
        model_config("gpt-char-tiny", laplacian_heads="all")


# ---------------------------------------------------------------------------- checkpoint files
def _payload(model: torch.nn.Module) -> dict:
    return {"format": CHECKPOINT_FORMAT, "step": 1, "model": model.state_dict(), "optimizer": {}, "rng": {},
            "config": TrainConfig().to_dict()}


def test_a_checkpoint_whose_model_entry_has_a_non_string_key_is_refused_by_name(tmp_path):
    """Bug: a checkpoint whose ``model`` dict held a non-str key passed ``load_checkpoint``, and
    ``load_run`` then failed with "'int' object has no attribute 'startswith'" from ``load_state_dict``.
    Now ``load_checkpoint`` raises a CheckpointError naming the key."""
    from diffusionformer.experiments.reload import load_run

    cfg = model_config("gpt-char-tiny")
    (tmp_path / "run_config.json").write_text(json.dumps({"model": "gpt-char-tiny",
                                                          "model_config": dataclasses.asdict(cfg)}))
    payload = _payload(DiffusionGPT(cfg))
    path = save_checkpoint(tmp_path / "checkpoint.pt", {**payload, "model": {**payload["model"], 7: torch.zeros(1)}})
    for load in (load_checkpoint, load_run):
        with pytest.raises(CheckpointError, match=r"expected 'model' to be a state dict .*got the key 7 \(int\)"):
            load(path if load is load_checkpoint else tmp_path)


def test_a_checkpoint_that_would_run_code_is_refused_without_running_it(tmp_path):
    """Pins: a checkpoint whose pickle calls ``os.system`` (zip and legacy formats, or a bare pickle) is
    refused with a CheckpointError and the command never runs; a truncated file is refused the same way."""
    import pickle

    flag = tmp_path / "ran"

    class Hostile:
        def __reduce__(self):
            return (os.system, (f"touch {flag}",))

    model = _gpt(f"{_LEARNABLE['heat']}:4").float()
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, _payload(model))
    good = path.read_bytes()
    for zipped in (True, False):
        buf = io.BytesIO()
        torch.save({**_payload(model), "extra": Hostile()}, buf, _use_new_zipfile_serialization=zipped)
        for data in (buf.getvalue(), pickle.dumps(Hostile(), protocol=2), good[: len(good) // 2]):
            path.write_bytes(data)
            with pytest.raises(CheckpointError, match="is unreadable"):
                load_checkpoint(path)
    assert not flag.exists()
    path.write_bytes(good)
    reloaded = _gpt(f"{_LEARNABLE['heat']}:4", ).float()
    reloaded.load_state_dict(load_checkpoint(path)["model"])
    tokens = torch.randint(0, 13, (2, 6))
    assert torch.equal(reloaded(tokens)[0], model(tokens)[0])
