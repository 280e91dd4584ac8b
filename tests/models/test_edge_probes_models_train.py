"""Edge-case probes of the model- and training-level public API.

Probed: ``DiffusionGPT.generate`` (``max_new_tokens=0``, prompts longer than ``block_size``, temperature
``0`` / negative / denormal / ``inf``, cache vs no cache), ``DiffusionViT`` (wrong size / channels /
layout, ``B = 0``, uint8 / float64 / float16 inputs, non-contiguous and expanded inputs, rollout),
``GCN`` / ``GIN`` / ``DiffusionGraphTransformer`` (graphs without edges, ``N = 0``, ``(E, 2)``, float and
out-of-range ``edge_index``, ``batch`` of the wrong length or dtype, ``num_graphs`` above the ids),
``create_model`` typos, ``TrainConfig`` validation and ``load_run`` on damaged run directories.

Found and fixed:

* ``generate(prompt, 0)`` handed back any prompt unchecked (a float tensor, a list).
* ``generate(..., temperature=1e-45)`` (a tiny positive temperature) crashed in ``torch.multinomial``
  ("probability tensor contains either inf, nan"): ``logits / T`` overflowed to ``inf - inf``.
* ``GCN`` / ``GIN``: an ``(E, 2)``, float or out-of-range ``edge_index`` and a ``batch`` of the wrong length
  or a float dtype failed deep in PyG / torch (bare ``RuntimeError`` / ``IndexError``); now the
  package's ``check_edge_index`` and the graph transformer's ``batch`` messages.
* ``DiffusionGraphTransformer`` (through ``from_edge_index``): an ``(E, 2)`` ``edge_index`` was a bare
  ``RuntimeError`` from PyG's self-loop pass.
* ``DiffusionViT``: uint8 images failed in the patch convolution with a dtype ``RuntimeError``, and float64
  data into a float32 model likewise; float inputs are now read in the model's dtype (as the graph
  transformer reads its ``x``), other dtypes are a ``TypeError`` naming ``x``.
* ``load_run``: a truncated / empty / non-object ``run_config.json`` was a bare ``JSONDecodeError``,
  ``UnicodeDecodeError`` or ``AttributeError`` that did not name the file.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

import diffusionformer
from diffusionformer.models import (GCN, GIN, DiffusionGPT, DiffusionViT, GCNConfig, GINConfig, GPTConfig, ViTConfig,
                                    create_model, model_config)
from diffusionformer.train import CheckpointError, TrainConfig
from diffusionformer.train.checkpoint import _REQUIRED, CHECKPOINT_FORMAT, save_checkpoint


def _gpt(**kw) -> DiffusionGPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, laplacian_heads=1)
    cfg.update(kw)
    return DiffusionGPT(GPTConfig(**cfg)).eval()


# ----------------------------------------------------------------------------- DiffusionGPT.generate


def test_generate_zero_tokens_still_checks_the_prompt():
    """Bug: ``generate(prompt, 0)`` returned a float tensor or a list prompt as it came, where one new
    token refused it; a well-formed prompt still comes back unchanged."""
    model = _gpt()
    prompt = torch.tensor([[1, 2, 3]])
    assert torch.equal(model.generate(prompt, 0), prompt)
    with pytest.raises(ValueError, match="idx must be an integer tensor"):
        model.generate(prompt.float(), 0)
    with pytest.raises(ValueError, match="idx must be an integer tensor"):
        model.generate([[1, 2, 3]], 0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.generate(torch.tensor([[1, 11]]), 0)


def test_a_tiny_positive_temperature_samples_the_greedy_tokens():
    """Bug: ``temperature=1e-45`` made ``logits / T`` overflow to ``inf`` and the softmax ``NaN``: a bare
    ``RuntimeError`` from ``torch.multinomial``; the limit ``T -> 0`` is greedy decoding."""
    model = _gpt()
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    greedy = model.generate(prompt, 5, temperature=0)
    for t in (1e-45, 1e-40):
        for cache in (False, True):
            got = model.generate(prompt, 5, temperature=t, use_cache=cache, generator=torch.Generator().manual_seed(0))
            assert torch.equal(got, greedy)


def test_greedy_generation_with_a_prompt_longer_than_block_size_reads_the_last_block():
    """A prompt of 2.5 blocks: the prompt is kept whole, and every new token is the argmax of the model on the
    last ``block_size`` tokens (computed here step by step), with and without the cache."""
    model = _gpt()
    prompt = torch.randint(0, 11, (2, 20), generator=torch.Generator().manual_seed(1))
    want = prompt
    with torch.no_grad():
        for _ in range(4):
            nxt = model(want[:, -8:])[0][:, -1].argmax(-1, keepdim=True)
            want = torch.cat([want, nxt], dim=1)
    for cache in (False, True):
        assert torch.equal(model.generate(prompt, 4, temperature=0, use_cache=cache), want)


def test_infinite_temperature_samples_uniformly():
    """``temperature=inf`` (allowed: ``>= 0``) flattens the logits: the tokens follow the uniform law, as
    ``torch.multinomial`` of equal weights with the same generator draws them."""
    model = _gpt()
    prompt = torch.tensor([[1, 2]])
    got = model.generate(prompt, 1, temperature=float("inf"), generator=torch.Generator().manual_seed(3))
    want = torch.multinomial(torch.full((1, 11), 1 / 11), 1, generator=torch.Generator().manual_seed(3))
    assert torch.equal(got[:, -1:], want)


# ----------------------------------------------------------------------------- DiffusionViT


def _vit(**kw) -> DiffusionViT:
    torch.manual_seed(0)
    cfg = dict(input_size=(8, 8), patch_size=2, dim=16, depth=2, num_heads=2, num_classes=3)
    cfg.update(kw)
    return DiffusionViT(ViTConfig(**cfg)).eval()


def test_vit_reads_float_inputs_in_its_dtype_and_refuses_integer_images():
    """Bug: float64 data into a float32 ViT, and uint8 images, failed in the patch convolution with
    "Input type (double) and bias type (float) should be the same"; now floats are read in the model's dtype
    (as the graph transformer reads ``x``) and an integer dtype is a ``TypeError`` naming ``x``."""
    vit = _vit()
    x = torch.randn(2, 1, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        want = vit(x.float())
        torch.testing.assert_close(vit(x), want, rtol=0, atol=0)
        assert vit(x.half()).dtype == torch.float32
        torch.testing.assert_close(vit.double()(x), want.double(), rtol=1e-5, atol=1e-6)  # float64 model: kept
    with pytest.raises(TypeError, match="x must be a floating-point tensor.*uint8"):
        vit((x * 100).to(torch.uint8))


def test_vit_empty_batch_gives_empty_logits_and_a_zero_gradient():
    """``B = 0``: logits ``(0, num_classes)`` and a backward pass that gives every parameter a zero gradient."""
    vit = _vit().train()
    out = vit(torch.randn(0, 1, 8, 8))
    assert out.shape == (0, 3)
    out.sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in vit.parameters())


def test_vit_strided_inputs_give_the_contiguous_answer_per_sample():
    """A transposed and an expanded (stride-0) batch give what the contiguous copies give, sample by sample."""
    vit = _vit()
    base = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        t = base.transpose(2, 3)
        torch.testing.assert_close(vit(t), vit(t.contiguous()))
        e = base[:1].expand(4, -1, -1, -1)
        out = vit(e)
        torch.testing.assert_close(out, vit(base[:1]).expand(4, -1), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- GCN / GIN / graph transformer

_GRAPH_MODELS = [(GCN, GCNConfig), (GIN, GINConfig)]


@pytest.mark.parametrize("cls,cfg", _GRAPH_MODELS, ids=["gcn", "gin"])
def test_gnn_baselines_name_a_malformed_edge_index(cls, cfg):
    """Bug: GCN got an ``(E, 2)`` ``edge_index`` as "Sizes of tensors must match", an out-of-range one as
    "index 7 is out of bounds for dimension 0 with size 5", a float one as a scatter dtype error; now the
    package's ``check_edge_index`` messages, as the graph transformer gives."""
    model = cls(cfg(in_channels=3, num_classes=2, task="node")).eval()
    x = torch.randn(5, 3)
    with pytest.raises(ValueError, match=r"edge_index must have shape \(2, E\), got \(4, 2\)"):
        model(x, torch.tensor([[0, 1], [1, 0], [1, 2], [2, 1]]))
    with pytest.raises(ValueError, match=r"edge_index values must lie in \[0, num_nodes=5\), got range \[0, 7\]"):
        model(x, torch.tensor([[0, 7], [1, 0]]))
    with pytest.raises(TypeError, match="edge_index must be an integer tensor"):
        model(x, torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
    assert model(x, torch.tensor([[0, 1], [1, 0]], dtype=torch.int32)).shape == (5, 2)  # int32 ids are fine


@pytest.mark.parametrize("cls,cfg", _GRAPH_MODELS, ids=["gcn", "gin"])
def test_gnn_baselines_name_a_malformed_batch(cls, cfg):
    """Bug: a ``batch`` of the wrong length was "The expanded size of the tensor (5) must match the existing
    size (3)" (or an index error), a float one a scatter dtype error; now the graph transformer's messages."""
    model = cls(cfg(in_channels=3, num_classes=2, task="graph")).eval()
    x, ei = torch.randn(5, 3), torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match=r"batch must have shape \(N,\) = \(5,\), got \(3,\)"):
        model(x, ei, torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match=r"batch must have shape \(N,\) = \(5,\), got \(7,\)"):
        model(x, ei, torch.zeros(7, dtype=torch.long))
    with pytest.raises(TypeError, match="batch must hold integer graph ids"):
        model(x, ei, torch.zeros(5))


@pytest.mark.parametrize("cls,cfg", _GRAPH_MODELS, ids=["gcn", "gin"])
def test_gnn_baselines_read_float64_and_integer_features_in_their_dtype(cls, cfg):
    """Bug: float64 features into a float32 GCN/GIN (or integer one-hot features, as some PyG datasets store
    them) failed in the first layer with a bare dtype RuntimeError ("mat1 and mat2 must have the same dtype");
    they are now read in the model's dtype, as the graph transformer and the ViT read theirs: the logits equal
    those of the float32 features (exactly: 0/1 features are exact in every float dtype)."""
    torch.manual_seed(0)
    model = cls(cfg(in_channels=3, num_classes=2, task="graph")).eval()
    x = torch.randint(0, 2, (5, 3), generator=torch.Generator().manual_seed(1))
    ei, batch = torch.tensor([[0, 1, 2, 3], [1, 0, 3, 4]]), torch.tensor([0, 0, 1, 1, 1])
    want = model(x.float(), ei, batch)
    assert want.dtype == torch.float32
    for features in (x, x.double(), x.to(torch.float16)):
        got = model(features, ei, batch)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_gcn_on_a_batch_where_one_graph_has_no_edges_matches_plain_linear_layers():
    """A graph without edges: GCN's normalised adjacency with self loops is the identity on it, so its nodes go
    through ``relu(x W1^T + b1) W2^T + b2`` (here by hand), whatever the other graph of the batch holds."""
    torch.manual_seed(0)
    model = GCN(GCNConfig(in_channels=3, num_classes=2, hidden=4, dropout=0.0)).eval()
    x = torch.randn(5, 3, dtype=torch.float64)
    model.double()
    ei = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])  # nodes 0-2 connected, nodes 3-4 isolated
    c1, c2 = model.convs
    want = torch.relu(x[3:] @ c1.lin.weight.T + c1.bias) @ c2.lin.weight.T + c2.bias
    with torch.no_grad():
        torch.testing.assert_close(model(x, ei)[3:], want)


def test_graph_transformer_names_a_transposed_edge_index(tiny_graph_transformer):
    """Bug: an ``(E, 2)`` ``edge_index`` failed in PyG's self-loop pass with "Sizes of tensors must match
    except in dimension 1" before the graph's own shape check could name it."""
    model = tiny_graph_transformer()
    x = torch.randn(5, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"edge_index must have shape \(2, E\), got \(4, 2\)"):
        model(x, torch.tensor([[0, 1], [1, 0], [1, 2], [2, 1]]))


def test_graph_transformer_graph_without_edges_in_a_batch_equals_that_graph_alone(tiny_graph_transformer):
    """Graph readout of a batch whose second graph has no edges: each graph's logits equal those of the graph
    run alone (no attention leaks between graphs; the isolated nodes attend to themselves only)."""
    model = tiny_graph_transformer(task="graph").eval()
    x = torch.randn(5, 3, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    batch = torch.tensor([0, 0, 0, 1, 1])
    with torch.no_grad():
        both = model(x, ei, batch)
        torch.testing.assert_close(both[0], model(x[:3], ei)[0])
        torch.testing.assert_close(both[1], model(x[3:], torch.empty(2, 0, dtype=torch.long))[0])
        # an extra empty graph in num_graphs leaves the others alone
        torch.testing.assert_close(model(x, ei, batch, num_graphs=3)[:2], both)


# ----------------------------------------------------------------------------- load_run


def _run_dir(tmp_path):
    overrides = dict(n_layer=1, n_head=2, n_embd=16, block_size=8)
    torch.manual_seed(0)
    model = create_model("gpt-char-tiny", **overrides)
    cfg = dataclasses.asdict(model_config("gpt-char-tiny", **overrides))
    (tmp_path / "run_config.json").write_text(json.dumps({"model": "gpt-char-tiny", "model_config": cfg}))
    payload = {k: None for k in _REQUIRED}
    payload.update(format=CHECKPOINT_FORMAT, model=model.state_dict(), config=TrainConfig(max_steps=3).to_dict(), step=3)
    save_checkpoint(tmp_path / "checkpoint.pt", payload)
    return model


def test_load_run_names_an_unreadable_run_config(tmp_path):
    """Bug: a truncated ``run_config.json`` (a run killed while writing it) was a bare ``JSONDecodeError``
    ("Unterminated string starting at: line 1 column 190"), a non-object one an ``AttributeError`` and
    non-UTF-8 bytes a ``UnicodeDecodeError``, none naming the file."""
    model = _run_dir(tmp_path)
    run = diffusionformer.load_run(tmp_path)
    assert run.step == 3
    for name, value in model.state_dict().items():
        assert torch.equal(run.model.state_dict()[name], value), name
    good = (tmp_path / "run_config.json").read_bytes()
    for bad in (good[: len(good) // 2], b"", b"[1, 2]", b"\xff\xfe\x00"):
        (tmp_path / "run_config.json").write_bytes(bad)
        with pytest.raises(ValueError, match="run_config.json to hold a JSON object"):
            diffusionformer.load_run(tmp_path)


def test_load_run_on_a_truncated_checkpoint_or_another_operator_is_a_checkpoint_error(tmp_path):
    """A checkpoint cut in half, or weights of a model with another operator (a learnable heat head adds a
    parameter), are ``CheckpointError``s naming the file; the run directory is left as it was."""
    _run_dir(tmp_path)
    good = (tmp_path / "checkpoint.pt").read_bytes()
    (tmp_path / "checkpoint.pt").write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match="checkpoint.pt .* is unreadable"):
        diffusionformer.load_run(tmp_path)
    assert (tmp_path / "checkpoint.pt").read_bytes() == good[: len(good) // 2]
    other = create_model("gpt-char-tiny", n_layer=1, n_head=2, n_embd=16, block_size=8,
                         heads="heat(learnable=True, steps=2):2")
    payload = {k: None for k in _REQUIRED}
    payload.update(format=CHECKPOINT_FORMAT, model=other.state_dict(), config=TrainConfig(max_steps=3).to_dict(), step=3)
    save_checkpoint(tmp_path / "checkpoint.pt", payload)
    with pytest.raises(CheckpointError, match="(?s)do not fit.*operators.0.t"):
        diffusionformer.load_run(tmp_path)


def test_load_run_names_a_checkpoint_whose_model_or_config_is_malformed(tmp_path):
    """Bug: a checkpoint whose ``model`` entry is not a state dict (a list, a tensor) was a bare ``TypeError``
    from ``load_state_dict`` ("Expected state_dict to be dict-like"), and one whose training config is invalid a
    ``ValueError`` that did not name the file; both are now ``CheckpointError``s naming it, for ``load_run`` and
    for the trainer's ``load_checkpoint`` alike. The file is left as it was."""
    model = _run_dir(tmp_path)
    good = {k: None for k in _REQUIRED}
    good.update(format=CHECKPOINT_FORMAT, model=model.state_dict(), config=TrainConfig(max_steps=3).to_dict(), step=3)
    cases = [(dict(model=[1, 2]), r"expected 'model' to be a dict, got list"),
             (dict(model=torch.zeros(2)), r"expected 'model' to be a dict, got Tensor"),
             (dict(config=[("max_steps", 3)]), r"expected 'config' to be a dict, got list"),
             (dict(config={"max_steps": -3}), r"its config is invalid: .*max_steps"),
             (dict(config={"max_stesp": 3}), r"its config is invalid: .*max_stesp")]
    for change, match in cases:
        save_checkpoint(tmp_path / "checkpoint.pt", {**good, **change})
        before = (tmp_path / "checkpoint.pt").read_bytes()
        with pytest.raises(CheckpointError, match=r"checkpoint .*checkpoint\.pt: " + match):
            diffusionformer.load_run(tmp_path)
        assert (tmp_path / "checkpoint.pt").read_bytes() == before
    save_checkpoint(tmp_path / "checkpoint.pt", good)
    assert diffusionformer.load_run(tmp_path).train_config == TrainConfig(max_steps=3)


@pytest.mark.parametrize("cls, base", [("ViTConfig", {}), ("GPTConfig", {}),
                                       ("GraphTransformerConfig", dict(in_channels=3, num_classes=2))])
def test_configs_check_norm_backend_and_layer_scale_when_made(cls, base):
    """Bug: ``ViTConfig(norm="rmsnrom")``, ``GPTConfig(backend="dens")`` or ``ViTConfig(layer_scale=nan)`` were
    accepted as configs (so a sweep's config check passed) and failed only when the model was built, possibly
    runs later. They are now refused when the config is made, naming the field, with a "did you mean"; the
    spellings ``make_norm`` accepts ("RMSNorm", "layer_norm") stay valid."""
    import diffusionformer.models as models

    config = getattr(models, cls)
    for ok, read in (("RMSNorm", "rmsnorm"), ("layer_norm", "layernorm"), ("layernorm", "layernorm")):
        assert config(**base, norm=ok).norm == read  # recorded as read (sitting 47)
    with pytest.raises(ValueError, match=rf"{cls}\.norm: expected one of \['layernorm', 'rmsnorm'\], got "
                                         r"'rmsnrom' \(did you mean 'rmsnorm'\?\)"):
        config(**base, norm="rmsnrom")
    with pytest.raises(ValueError, match=rf"{cls}\.norm: expected one of .*, got 3$"):
        config(**base, norm=3)
    if cls == "GraphTransformerConfig":
        return
    with pytest.raises(ValueError, match=rf"{cls}\.backend: expected one of \['auto', 'sdpa', 'matrix', 'triton'\], "
                                         r"got 'dens'$"):
        config(**base, backend="dens")
    with pytest.raises(ValueError, match=rf"{cls}\.backend: .* got 'tritn' \(did you mean 'triton'\?\)"):
        config(**base, backend="tritn")
    if cls == "ViTConfig":
        assert config(layer_scale=np.float32(0.5)).layer_scale == 0.5
        for bad in (float("nan"), float("inf"), "1e-5", True):
            with pytest.raises(ValueError, match=r"ViTConfig\.layer_scale: expected None or a finite float"):
                config(layer_scale=bad)
