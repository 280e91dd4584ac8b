"""Edge probes of three features of sitting 47: ``reset_parameters()`` on every operator, layer, block and model,
the gated MLPs (``GatedMlp``, ``make_mlp``, the configs' ``mlp``), and an integer tensor in the graph's place read
as ``edge_index``."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from torch import nn

from diffusionformer.experiments.results import _NEW_MODEL_FIELDS, _without_new_defaults
from diffusionformer.models import DINO, DINOConfig, DiffusionGPT, GPTConfig, ViTConfig
from diffusionformer.nn import Block, DiffusionAttention, make_mlp
from diffusionformer.ops.rivals import LayerState

EDGES = torch.tensor([[0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 2]])


def _gpt(**kw):
    return GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=8, **kw)


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------- reset_parameters


def _weight_norm(model):
    nn.utils.parametrizations.weight_norm(model.blocks[0].attn.qkv)
    return "blocks.0.attn.qkv"


def _prune(model):
    nn.utils.prune.l1_unstructured(model.blocks[1].mlp.fc2, "weight", 0.5)
    return "blocks.1.mlp.fc2"


def _spectral_hook(model):
    nn.utils.spectral_norm(model.blocks[0].mlp.fc1)
    return "blocks.0.mlp.fc1"


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("reparametrize", [_weight_norm, _prune, _spectral_hook])
def test_reset_of_a_reparametrized_layer_is_refused(reparametrize):
    """Bug: ``reset_parameters()`` on a model with a weight-normed (parametrized), pruned or spectral-normed layer
    returned without a word and left that layer's stored originals as trained (``nn.Linear.reset_parameters``
    initialises ``module.weight``, there a tensor computed from them): a reset model that passed for a fresh one.
    Refused now, naming the layer."""
    torch.manual_seed(0)
    model = DiffusionGPT(_gpt())
    path = reparametrize(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TypeError, match=re.escape(f"DiffusionGPT.{path} (") + ".*reparametrized"):
        model.reset_parameters()
    # refused before any part was reset: nothing moved, the tie kept
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model.lm_head.weight is model.tok_emb.weight


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_dino_head_reset_of_a_reparametrized_layer_is_refused():
    """Bug: DINO's head reset its linears one by one, so a spectral-normed head layer kept its trained originals."""
    cfg = DINOConfig(input_size=(8, 8), patch_size=4, dim=12, depth=1, num_heads=2, out_dim=8, head_hidden=8,
                     head_bottleneck=4)
    model = DINO(cfg)
    nn.utils.spectral_norm(model.student.head.mlp[0])
    with pytest.raises(TypeError, match=r"head\.mlp\.0 .*reparametrized"):
        model.reset_parameters()


def test_reset_through_torch_compile_inside_inference_mode_keeps_tie_and_trains():
    torch.manual_seed(0)
    model = DiffusionGPT(_gpt(heads="heat(learnable=True, steps=2):2"))
    compiled = torch.compile(model, backend="eager")
    with torch.inference_mode():
        compiled.reset_parameters()
    assert model.lm_head.weight is model.tok_emb.weight
    assert not any(p.is_inference() for p in model.parameters())
    logits, _ = compiled(torch.randint(0, 11, (1, 4)))
    logits.sum().backward()
    assert model.tok_emb.weight.grad is not None


# ---------------------------------------------------------------- gated MLPs


@pytest.mark.parametrize("ratio", [-1.0, 0.0, float("nan"), float("inf")])
@pytest.mark.parametrize("kind", ["swiglu", "gelu"])
def test_make_mlp_refuses_a_bad_ratio_by_name(kind, ratio):
    """Bug: ``make_mlp("swiglu", dim, -1.0)`` built a width-1 gated MLP without a word, NaN failed with "cannot
    convert float NaN to integer", and the GELU MLP's refusal named ``hidden_dim``, not ``mlp_ratio``."""
    with pytest.raises(ValueError, match="make_mlp: mlp_ratio"):
        make_mlp(kind, 6, ratio)


@pytest.mark.parametrize("spelling,canonical", [("GELU", "gelu"), ("SwiGLU", "swiglu"), ("swi_glu", "swiglu"),
                                                ("Ge-GLU", "geglu")])
def test_config_mlp_is_recorded_as_the_mlp_it_builds(spelling, canonical):
    """Bug: the configs kept ``mlp`` as spelt, so ``mlp="GELU"`` (the default MLP) joined a run's identity and
    did not resume the published runs, and ``"SwiGLU"`` and ``"swiglu"`` were two runs of one model."""
    for cfg in (_gpt(mlp=spelling), ViTConfig(mlp=spelling),
                DINOConfig(input_size=(8, 8), patch_size=4, dim=12, depth=1, num_heads=2, mlp=spelling)):
        assert cfg.mlp == canonical
        identity = _without_new_defaults(dataclasses.asdict(cfg), _NEW_MODEL_FIELDS)
        assert identity.get("mlp") == (None if canonical == "gelu" else canonical)


@pytest.mark.parametrize("typo,hint", [("SwiGLUE", "swiglu"), ("GELUU", "gelu"), ("LayerNorn", "layernorm")])
def test_config_typo_in_another_case_gets_a_did_you_mean(typo, hint):
    """Bug: the "did you mean" compared the name as typed, so ``mlp="SwiGLUE"`` (read case-blind) got no hint."""
    field = "norm" if "Norn" in typo else "mlp"
    with pytest.raises(ValueError, match=rf"did you mean '{hint}'"):
        ViTConfig(**{field: typo})


@pytest.mark.parametrize("mlp", ["swiglu", "geglu"])
def test_gated_gpt_generates_the_same_with_and_without_the_cache(mlp):
    torch.manual_seed(0)
    model = DiffusionGPT(_gpt(mlp=mlp, rope=True)).eval()
    idx = torch.randint(0, 11, (2, 3))
    a = model.generate(idx, 5, generator=torch.Generator().manual_seed(3))
    b = model.generate(idx, 5, generator=torch.Generator().manual_seed(3), use_cache=True)
    assert torch.equal(a, b)


# ---------------------------------------------------------------- positional edge_index


def test_positional_integer_tensor_with_dense_tokens_says_it_was_read_as_edge_index():
    """Bug: an integer (N, N) mask passed positionally with dense ``(B, N, D)`` tokens failed with "sparse input x
    must have shape (N, D)", not saying that the tensor had been read as an edge_index nor where a mask goes."""
    attn = DiffusionAttention(16, 4)
    with pytest.raises(ValueError, match=r"read as edge_index.*\(1, 5, 16\).*\(5, 5\).*attn_mask="):
        attn(_x(1, 5, 16), torch.ones(5, 5, dtype=torch.long))


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8])
def test_positional_edge_index_any_integer_dtype_state_and_intermediates(dtype):
    torch.manual_seed(0)
    attn = DiffusionAttention(16, 4, "attention:2,heat(t=0.5, steps=2):2")
    x = _x(5, 16)
    out, inter = attn(x, EDGES.to(dtype), return_intermediates=True)
    assert torch.equal(out, attn(x, edge_index=EDGES))
    blk = Block(16, 4, "laplacian:1,attention:3")
    assert torch.equal(blk(x, EDGES.to(dtype), state=LayerState()), blk(x, edge_index=EDGES, state=LayerState()))
