"""Edge probes of the model families, seventh pass: registry presets with mutable defaults, DINO temperatures,
and independent float64 references (explicit GCN/GIN/graph-transformer/ViT formulas) pinned as they hold."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from diffusionformer.config import config_from_dict, config_to_dict
from diffusionformer.models import registry
from diffusionformer.models.dino import center_sharpen, dino_loss
from diffusionformer.models.gcn import GCN, GCNConfig
from diffusionformer.models.gin import GIN, GINConfig
from diffusionformer.models.graph_transformer import DiffusionGraphTransformer, GraphTransformerConfig
from diffusionformer.models.vit import DiffusionViT, ViTConfig


@pytest.fixture
def presets(monkeypatch):
    monkeypatch.setattr(registry, "_PRESETS", dict(registry._PRESETS))
    return registry


# ----------------------------------------------------------------------------- bugs
def test_bug_preset_list_default_shared_with_the_caller(presets):
    """Bug: register_model kept a shallow copy of its defaults, so a list default stayed the caller's object:
    mutating that list after registering silently changed every later build of the preset."""
    counts = [1, 1]
    presets.register_model("probe7-list", DiffusionViT, ViTConfig, input_size=(4, 4), patch_size=2, dim=8, depth=2,
                           num_heads=2, laplacian_heads=counts)
    counts[0] = 2
    assert presets.model_config("probe7-list").laplacian_heads == [1, 1]


def test_bug_preset_dict_default_shared_with_built_models(presets):
    """Bug: a preset's dict default (``heads={layer: spec}``) was the very object of every config built from it:
    editing one model's ``config.heads`` changed the heads of every later ``create_model`` of that preset."""
    presets.register_model("probe7-dict", DiffusionViT, ViTConfig, input_size=(4, 4), patch_size=2, dim=8, depth=2,
                           num_heads=2, heads={1: "laplacian:2"})
    first = presets.create_model("probe7-dict")
    first.config.heads[0] = "laplacian:2"
    second = presets.create_model("probe7-dict")
    assert [b.attn.heads_spec() for b in second.blocks] == ["attention:2", "laplacian:2"]
    assert presets.get_preset("probe7-dict").defaults["heads"] == {1: "laplacian:2"}


def test_bug_dino_temperatures_refuse_a_bool():
    """Bug: ``dino_loss(..., student_temp=True)`` and ``center_sharpen(..., True)`` read the bool as a temperature
    of 1.0 (the configs and ``cosine_momentum`` refuse bools as numbers)."""
    s, t, c = torch.zeros(3, 2, 4), torch.zeros(2, 2, 4), torch.zeros(4)
    with pytest.raises(ValueError, match="student_temp"):
        dino_loss(s, t, c, True, 0.04)
    with pytest.raises(ValueError, match="temperature"):
        dino_loss(s, t, c, 0.1, True)
    with pytest.raises(ValueError, match="temperature"):
        center_sharpen(t[0], c, True)


# ----------------------------------------------------------------------------- references that hold
def _dense(edge_index: torch.Tensor, n: int) -> torch.Tensor:
    A = torch.zeros(n, n, dtype=torch.float64)
    for s, t in edge_index.T.tolist():
        A[t, s] += 1.0
    return A


def test_gcn_matches_the_explicit_normalised_propagation_with_a_self_loop_and_an_isolated_node():
    torch.manual_seed(0)
    x = torch.randn(6, 3, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3, 3, 1], [1, 2, 0, 3, 4, 0]])  # 3 -> 3 a self loop, node 5 isolated
    model = GCN(GCNConfig(in_channels=3, num_classes=2, hidden=4, dropout=0.0)).double().eval()
    A = _dense(ei, 6)
    c0, c1 = model.convs

    def prop(Ah: torch.Tensor) -> torch.Tensor:
        d = torch.diag(Ah.sum(1) ** -0.5)
        An = d @ Ah @ d
        return An @ (torch.relu(An @ (x @ c0.lin.weight.T) + c0.bias) @ c1.lin.weight.T) + c1.bias

    kept = A.clone().fill_diagonal_(1.0)  # add_remaining_self_loops: the existing self loop keeps weight 1
    torch.testing.assert_close(model(x, ei), prop(kept), rtol=0, atol=1e-12)
    adj_t = torch.sparse_coo_tensor(ei.flip(0), torch.ones(6, dtype=torch.float64), (6, 6))
    added = A + torch.eye(6, dtype=torch.float64)  # sparse adj_t: + 1 on the diagonal (documented: weight 2)
    torch.testing.assert_close(model(x, adj_t), prop(added), rtol=0, atol=1e-12)
    torch.testing.assert_close(model(x, adj_t.to_sparse_csr()), prop(added), rtol=0, atol=1e-12)


def test_gin_eps_matches_the_explicit_sum_readout_of_every_layer():
    torch.manual_seed(0)
    x = torch.randn(6, 3, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3, 3, 1], [1, 2, 0, 3, 4, 0]])
    batch = torch.tensor([0, 0, 0, 1, 1, 1])
    model = GIN(GINConfig(in_channels=3, num_classes=2, hidden=4, num_layers=3, dropout=0.0, train_eps=True)).double()
    with torch.no_grad():
        for conv in model.convs:
            conv.eps.fill_(0.3)
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm1d):
                mod.running_mean.uniform_(-1, 1)
                mod.running_var.uniform_(0.5, 2)
    model.eval()
    A = _dense(ei, 6)
    hs = [x]
    for conv in model.convs:
        hs.append(conv.nn(1.3 * hs[-1] + A @ hs[-1]))
    ref = sum(head(torch.stack([h[batch == g].sum(0) for g in range(2)])) for head, h in zip(model.heads, hs))
    torch.testing.assert_close(model(x, ei, batch), ref, rtol=0, atol=1e-12)


def test_graph_transformer_block_matches_an_explicit_masked_softmax_with_self_loops():
    torch.manual_seed(0)
    cfg = GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, num_heads=2, depth=1, task="graph")
    model = DiffusionGraphTransformer(cfg).double().eval()
    n = 6
    x = torch.randn(n, 3, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3, 3, 1], [1, 2, 0, 3, 4, 0]])
    batch = torch.tensor([0, 0, 0, 1, 1, 1])
    blk = model.blocks[0]

    def ln(mod, h):
        return F.layer_norm(h, (h.shape[-1],), mod.weight, mod.bias, mod.eps)

    h = model.embed(x)
    q, k, v = blk.attn.qkv(ln(blk.norm1, h)).reshape(n, 3, 2, 4).unbind(1)
    mask = (_dense(ei, n) > 0) | torch.eye(n, dtype=torch.bool)
    P = (torch.einsum("ihd,jhd->hij", q, k) / 2.0).masked_fill(~mask, float("-inf")).softmax(-1)
    h = h + blk.attn.out_proj(torch.einsum("hij,jhd->ihd", P, v).reshape(n, 8))
    h = ln(model.norm, h + blk.mlp(ln(blk.norm2, h)))
    ref = model.head(torch.stack([h[:3].mean(0), h[3:].mean(0)]))
    torch.testing.assert_close(model(x, ei, batch), ref, rtol=0, atol=1e-12)


def test_vit_patch_embedding_equals_unfold_plus_linear_for_images_and_signals():
    torch.manual_seed(0)
    vit = DiffusionViT(ViTConfig(input_size=(4, 6), patch_size=2, in_channels=2, dim=8, depth=1, num_heads=2)).double()
    x = torch.randn(2, 2, 4, 6, dtype=torch.float64)
    patches = F.unfold(x, 2, stride=2).transpose(1, 2)
    tok = patches @ vit.patch_embed.weight.reshape(8, -1).T + vit.patch_embed.bias
    ref = torch.cat([vit.cls_token.expand(2, -1, -1), tok], 1) + vit.pos_embed
    torch.testing.assert_close(vit._embed(x), ref, rtol=0, atol=1e-12)
    sig = DiffusionViT(ViTConfig(input_size=(8,), patch_size=4, in_channels=3, dim=8, depth=1, num_heads=2,
                                 pool="mean")).double()
    s = torch.randn(2, 8, 3, dtype=torch.float64)
    p = s.reshape(2, 2, 4, 3).permute(0, 1, 3, 2).reshape(2, 2, 12)
    ref = p @ sig.patch_embed.weight.reshape(8, -1).T + sig.patch_embed.bias + sig.pos_embed
    torch.testing.assert_close(sig._embed(s), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["gcn-2layer", "gin-graph", "vit-digits", "graph-node-small", "dino-digits"])
def test_preset_configs_round_trip_through_json(name):
    cfg = registry.model_config(name)
    again = config_from_dict(type(cfg), json.loads(json.dumps(config_to_dict(cfg))))
    assert again == cfg
