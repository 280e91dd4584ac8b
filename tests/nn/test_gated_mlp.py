"""Gated MLPs (SwiGLU, GEGLU; Shazeer 2020, LLaMA's MLP): checked against the written-out float64 formula with
separate gate, up and down matrices, in Block and in the GPT/ViT configs (``mlp=``)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from diffusionformer.models import DiffusionGPT, DiffusionViT, GPTConfig, ViTConfig, create_model
from diffusionformer.nn import Block, GatedMlp, Mlp, make_mlp


def _silu(z):
    return z / (1.0 + torch.exp(-z))


def _gelu(z):
    return 0.5 * z * (1.0 + torch.erf(z / math.sqrt(2.0)))


@pytest.mark.parametrize("kind, act", [("swiglu", _silu), ("geglu", _gelu)])
@pytest.mark.parametrize("bias", [True, False])
def test_gated_mlp_is_the_glu_formula(kind, act, bias):
    """W2 (act(W_g x + b_g) * (W_u x + b_u)) + b_2 with W_g = fc1 rows [:h], W_u = fc1 rows [h:]."""
    torch.manual_seed(0)
    mlp = make_mlp(kind, 12, 3.0, bias=bias).double()
    assert isinstance(mlp, GatedMlp) and mlp.hidden_dim == 24  # 2/3 of 12 * 3
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    h = mlp.hidden_dim
    w, b = mlp.fc1.weight, mlp.fc1.bias if bias else torch.zeros(2 * h, dtype=torch.float64)
    gate = x @ w[:h].T + b[:h]
    up = x @ w[h:].T + b[h:]
    out = (act(gate) * up) @ mlp.fc2.weight.T + (mlp.fc2.bias if bias else 0.0)
    torch.testing.assert_close(mlp(x), out, rtol=1e-12, atol=1e-12)


def test_gated_width_holds_the_gelu_mlps_parameters():
    for dim, ratio in ((24, 4.0), (48, 2.0), (96, 4.0)):
        plain, gated = make_mlp("gelu", dim, ratio, bias=False), make_mlp("SwiGLU", dim, ratio, bias=False)
        assert isinstance(plain, Mlp) and plain.fc1.out_features == int(dim * ratio)
        assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in gated.parameters())
    assert GatedMlp(12).hidden_dim == 32  # int(8 D / 3)


def test_unknown_kinds_and_bad_arguments():
    with pytest.raises(ValueError, match=r"unknown mlp kind 'swigl'.*did you mean 'swiglu'"):
        make_mlp("swigl", 8, 4.0)
    with pytest.raises(ValueError, match="did you mean 'geglu'"):
        Block(8, 2, mlp_layer="gegl")
    with pytest.raises(TypeError, match="mlp_layer must be None, one of"):
        Block(8, 2, mlp_layer=3)
    with pytest.raises(ValueError, match="hidden_dim must be a positive int"):
        GatedMlp(8, 0)
    with pytest.raises(TypeError, match="module class"):
        GatedMlp(8, act_layer=nn.SiLU())
    from diffusionformer.models import DINOConfig

    for config in (GPTConfig, ViTConfig, DINOConfig):  # DINOConfig's inherited checks name DINOConfig
        with pytest.raises(ValueError, match=rf"^{config.__name__}\.mlp: expected one of \['gelu', 'swiglu', 'geglu'\]"
                                             r".*did you mean"):
            config(mlp="swiglue")


def test_block_and_models_build_the_gated_mlp():
    blk = Block(12, 3, mlp_layer="geglu", mlp_ratio=2.0)
    assert isinstance(blk.mlp, GatedMlp) and isinstance(blk.mlp.act, nn.GELU) and blk.mlp.hidden_dim == 16
    assert isinstance(Block(12, 3).mlp, Mlp)  # the default is unchanged
    gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=24, mlp="swiglu",
                                 laplacian_heads=1))
    assert all(isinstance(b.mlp, GatedMlp) and isinstance(b.mlp.act, nn.SiLU) for b in gpt.blocks)
    vit = create_model("vit-digits", mlp="geglu")
    assert isinstance(vit, DiffusionViT) and all(isinstance(b.mlp, GatedMlp) for b in vit.blocks)
    dino = create_model("dino-digits", mlp="swiglu", depth=1, dim=32)
    assert isinstance(dino.student.backbone.blocks[0].mlp, GatedMlp)


def test_gpt2_initialisation_scales_and_zeroes_the_gated_projection():
    """init_transformer_weights scales ``fc2`` by 1/sqrt(2L) as for the GELU MLP; zero_init_proj zeroes it."""
    torch.manual_seed(0)
    gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=8, n_head=4, n_embd=256, mlp="swiglu"))
    mlp = gpt.blocks[0].mlp
    assert abs(float(mlp.fc1.weight.detach().std()) / 0.02 - 1) < 0.01
    assert abs(float(mlp.fc2.weight.detach().std()) / (0.02 / math.sqrt(16)) - 1) < 0.01
    zero = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=24, mlp="swiglu",
                                  zero_init_proj=True))
    assert all(not b.mlp.fc2.weight.any() for b in zero.blocks)


def test_gpt_with_swiglu_trains():
    torch.manual_seed(0)
    gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=24, mlp="swiglu",
                                 heads="attention:1,heat(t=0.5, steps=2, learnable=True):1"))
    opt = torch.optim.AdamW(gpt.parameters(), lr=3e-3)
    idx = torch.randint(0, 11, (8, 8), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(30):
        logits, loss = gpt(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.7 * losses[0]


def test_graph_transformer_takes_the_gated_mlp():
    pytest.importorskip("torch_geometric")
    from diffusionformer.models import DiffusionGraphTransformer, GraphBlock, GraphTransformerConfig

    cfg = GraphTransformerConfig(in_channels=3, num_classes=2, dim=12, depth=2, num_heads=2, mlp="Swi_GLU")
    assert cfg.mlp == "swiglu"  # recorded as read
    model = DiffusionGraphTransformer(cfg)
    assert all(isinstance(b.mlp, GatedMlp) and isinstance(b.mlp.act, nn.SiLU) and b.mlp.hidden_dim == 16
               for b in model.blocks)
    x, edges = torch.randn(5, 3), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    assert model(x, edges).shape == (5, 2)
    assert isinstance(GraphBlock(12, 2, mlp_layer="geglu").mlp.act, nn.GELU)
    assert isinstance(DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3)).blocks[0].mlp, Mlp)
    with pytest.raises(ValueError, match=r"GraphTransformerConfig\.mlp: .*did you mean 'geglu'"):
        GraphTransformerConfig(mlp="GEGLUU")


def test_norm_and_mlp_are_recorded_as_read_and_old_spellings_keep_their_identity():
    """Bug: ``norm="RMSNorm"`` was recorded as spelt, so a run made with it and read with ``"rmsnorm"`` (one model)
    was refused as a changed definition; stored spellings are now read as the configs record them."""
    from diffusionformer.experiments.results import _normalized_identity
    from diffusionformer.models import GraphTransformerConfig

    for config in (GPTConfig(norm="RMS_Norm", mlp="SwiGLU"), ViTConfig(norm="LayerNorm"),
                   GraphTransformerConfig(norm="rms-norm")):
        assert config.norm in ("layernorm", "rmsnorm") and config.mlp in ("gelu", "swiglu")
    old = {"model_config": {"n_embd": 16, "norm": "RMSNorm", "mlp": "GELU"}}
    new = {"model_config": {"n_embd": 16, "norm": "rmsnorm"}}
    assert _normalized_identity(old) == _normalized_identity(new)
    assert _normalized_identity({"model_config": {"norm": "layernorm"}}) != _normalized_identity(new)
