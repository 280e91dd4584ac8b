"""Tests written to kill mutants of ``diffusionformer/nn`` and ``diffusionformer/models`` that the suite missed.

Each test checks the code against an independent reference (explicit float64 computations, or
a property that the correct code satisfies exactly) and names in its docstring the mutant it kills.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.models.graph_transformer import DiffusionGraphTransformer, GraphBlock, GraphTransformerConfig
from diffusionformer.models.vit import DiffusionViT, ViTConfig
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.block import Block, DropPath
from diffusionformer.nn.edge_features import edge_feature_attention


def _layer_norm(t: torch.Tensor, ln: nn.LayerNorm) -> torch.Tensor:
    """LayerNorm over the last dim, by hand (biased variance, as torch)."""
    mu = t.mean(-1, keepdim=True)
    var = ((t - mu) ** 2).mean(-1, keepdim=True)
    out = (t - mu) / torch.sqrt(var + ln.eps) * ln.weight
    return out + ln.bias if ln.bias is not None else out


def test_qk_norm_normalises_queries_and_keys_per_head():
    """Kills: ``k = k_norm(k)`` dropped in ``DiffusionAttention._transform_qk`` (keys left unnormalised)."""
    torch.manual_seed(0)
    D, H, N = 16, 4, 5
    C = D // H
    layer = DiffusionAttention(D, H, qk_norm=True).double()
    with torch.no_grad():  # distinct, non-trivial norm parameters, so q and k norms are told apart
        for ln in (layer.q_norm, layer.k_norm):
            ln.weight.copy_(torch.rand(C, dtype=torch.float64) + 0.5)
            ln.bias.copy_(torch.randn(C, dtype=torch.float64))
    x = torch.randn(2, N, D, dtype=torch.float64)
    W, b = layer.qkv.weight, layer.qkv.bias
    qkv = x @ W.T + b
    q, k, v = (qkv[..., i * D : (i + 1) * D].reshape(2, N, H, C) for i in range(3))
    q, k = _layer_norm(q, layer.q_norm), _layer_norm(k, layer.k_norm)
    out = torch.empty(2, N, H, C, dtype=torch.float64)
    for h in range(H):
        P = torch.softmax(q[:, :, h] @ k[:, :, h].transpose(1, 2) / math.sqrt(C), dim=-1)
        out[:, :, h] = P @ v[:, :, h]
    expected = out.reshape(2, N, D) @ layer.out_proj.weight.T + layer.out_proj.bias
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(layer(x, return_intermediates=True)[0], expected, rtol=0, atol=1e-12)  # masked path


def test_drop_path_drops_whole_samples_independently_and_rescales_the_kept_ones():
    """Kills: DropPath without the ``1 / (1 - p)`` rescaling of kept samples, and DropPath drawing one
    keep/drop decision for the whole batch instead of one per sample."""
    p = 0.5
    dp = DropPath(p).train()
    x = torch.randn(64, 3, 4, dtype=torch.float64) + 3.0  # no zero entries
    torch.manual_seed(0)
    y = dp(x)
    kept = (y != 0).flatten(1)
    # each sample is all dropped or all kept, and a kept one is x / (1 - p) exactly
    assert bool((kept.all(1) | (~kept).all(1)).all())
    keep = kept.all(1)
    torch.testing.assert_close(y[keep], x[keep] / (1 - p), rtol=0, atol=0)
    # decisions are per sample: with 64 samples at p = 0.5 both outcomes occur (seeded)
    assert 0 < int(keep.sum()) < 64
    # eval: identity
    assert dp.eval()(x) is x


def _nucleus(logits: torch.Tensor, p: float) -> set[int]:
    """Indices of the smallest set of most likely tokens whose mass reaches ``p`` (float64, by hand)."""
    probs = torch.softmax(logits.detach().double(), dim=-1)
    order = torch.argsort(probs, descending=True).tolist()
    keep, mass = [], 0.0
    for i in order:
        if mass >= p:
            break
        keep.append(i)
        mass += float(probs[i])
    return set(keep)


def test_generate_applies_the_temperature_before_the_nucleus():
    """Kills: ``generate`` dividing the logits by the temperature after ``top_k``/``top_p`` filtering
    (the nucleus must be chosen on the tempered distribution)."""
    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=12, block_size=8, n_layer=1, n_head=2, n_embd=16)).eval()
    with torch.no_grad():  # spread the logits so that temperature changes the nucleus
        model.tok_emb.weight.mul_(20.0)
    prompt = torch.tensor([[1, 5, 2]])
    logits = model(prompt)[0][0, -1].double()
    T, p = 4.0, 0.6
    hot, cold = _nucleus(logits / T, p), _nucleus(logits, p)
    assert hot != cold, "test set-up: the temperature must change the nucleus"
    g = torch.Generator().manual_seed(0)
    out = model.generate(prompt.repeat(1500, 1), 1, temperature=T, top_p=p, generator=g)
    assert set(out[:, -1].tolist()) == hot


def test_vit_patch_tokens_are_row_major_patch_projections():
    """Kills: the ViT patch embedding flattened column-major (``.transpose(2, 3).flatten(2)``) instead of
    row-major: token ``r * W/p + c`` must be the linear map of patch ``(r, c)`` (plus its position embedding)."""
    torch.manual_seed(0)
    cfg = ViTConfig(input_size=(4, 6), in_channels=2, patch_size=2, dim=8, depth=1, num_heads=2, pool="cls")
    vit = DiffusionViT(cfg).double().eval()
    x = torch.randn(3, 2, 4, 6, dtype=torch.float64)
    W = vit.patch_embed.weight.reshape(8, -1)  # (D, C p p)
    rows = []
    for r in range(2):
        for c in range(3):
            patch = x[:, :, 2 * r : 2 * r + 2, 2 * c : 2 * c + 2].reshape(3, -1)
            rows.append(patch @ W.T + vit.patch_embed.bias)
    expected = torch.cat([vit.cls_token.expand(3, 1, 8), torch.stack(rows, dim=1)], dim=1) + vit.pos_embed
    torch.testing.assert_close(vit._embed(x), expected, rtol=0, atol=1e-12)


def test_graph_block_is_pre_norm_with_its_own_norm_per_branch():
    """Kills: ``GraphBlock`` feeding the MLP ``norm1(x)`` instead of ``norm2(x)`` (the two norms told apart
    by distinct affine parameters); reference: LayerNorm and MLP by hand around the block's attention."""
    torch.manual_seed(0)
    D, N = 8, 6
    block = GraphBlock(D, 2, "attention:1,laplacian:1").double().eval()
    with torch.no_grad():
        for ln in (block.norm1, block.norm2):
            ln.weight.copy_(torch.rand(D, dtype=torch.float64) + 0.5)
            ln.bias.copy_(torch.randn(D, dtype=torch.float64))
    x = torch.randn(N, D, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 2, 1], [1, 2, 3, 4, 5, 0, 0, 2, 1]])
    x1 = x + block.attn(_layer_norm(x, block.norm1), edge_index=ei)
    h = _layer_norm(x1, block.norm2)
    fc1, fc2 = block.mlp.fc1, block.mlp.fc2
    expected = x1 + torch.nn.functional.gelu(h @ fc1.weight.T + fc1.bias) @ fc2.weight.T + fc2.bias
    torch.testing.assert_close(block(x, ei), expected, rtol=0, atol=1e-12)


def test_vit_stochastic_depth_increases_linearly_from_zero():
    """Kills: every ViT block given the final ``drop_path`` rate instead of timm's linear schedule
    ``linspace(0, drop_path, depth)`` (the first block never dropped)."""
    vit = DiffusionViT(ViTConfig(input_size=(4, 4), patch_size=2, dim=8, depth=4, num_heads=2, drop_path=0.3))
    expected = torch.linspace(0, 0.3, 4, dtype=torch.float64).tolist()
    got = [getattr(b.drop_path, "p", 0.0) for b in vit.blocks]
    assert got == pytest.approx(expected, abs=1e-12)
    assert isinstance(vit.blocks[0].drop_path, nn.Identity)


def test_generate_applies_top_p_to_the_top_k_survivors():
    """Kills: ``generate`` applying ``top_p`` before ``top_k`` (the nucleus must be taken on the
    distribution renormalised over the ``top_k`` tokens, as documented: ``top_p`` after ``top_k``)."""
    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=12, block_size=8, n_layer=1, n_head=2, n_embd=16)).eval()
    with torch.no_grad():
        model.tok_emb.weight.mul_(20.0)
    prompt = torch.tensor([[1, 5, 2]])
    T, k = 4.0, 3
    logits = model(prompt)[0][0, -1].detach().double() / T
    probs, order = torch.softmax(logits, -1).sort(descending=True)
    a, b = float(probs[0]), float(probs[0] / probs[:k].sum())  # top-1 mass: full, and within the top k
    p = (a + b) / 2  # the nucleus of the top-k survivors is the top token alone; of the full row, more
    filtered = torch.full_like(logits, float("-inf"))
    filtered[order[:k]] = logits[order[:k]]
    expected = _nucleus(filtered, p)
    assert expected == {int(order[0])} and _nucleus(logits, p) != expected  # set-up
    g = torch.Generator().manual_seed(0)
    out = model.generate(prompt.repeat(1500, 1), 1, temperature=T, top_k=k, top_p=p, generator=g)
    assert set(out[:, -1].tolist()) == expected


def test_block_layer_scale_gains_are_per_branch():
    """Kills: ``Block.forward`` scaling the attention branch by ``ls2`` instead of ``ls1`` (LayerScale gains
    set apart); reference: the two pre-norm residual lines with LayerNorm, gains and MLP by hand."""
    torch.manual_seed(0)
    D = 8
    block = Block(D, 2, "attention:1,laplacian:1", mlp_ratio=2.0, layer_scale=0.1).double().eval()
    with torch.no_grad():
        block.ls1.gamma.copy_(torch.rand(D, dtype=torch.float64) + 0.5)
        block.ls2.gamma.copy_(-torch.rand(D, dtype=torch.float64) - 0.5)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    x1 = x + block.ls1.gamma * block.attn(_layer_norm(x, block.norm1))
    h = _layer_norm(x1, block.norm2)
    fc1, fc2 = block.mlp.fc1, block.mlp.fc2
    expected = x1 + block.ls2.gamma * (torch.nn.functional.gelu(h @ fc1.weight.T + fc1.bias) @ fc2.weight.T + fc2.bias)
    torch.testing.assert_close(block(x), expected, rtol=0, atol=1e-12)


def test_graph_transformer_self_loops_carry_zero_edge_features():
    """Kills: the self loops that ``DiffusionGraphTransformer`` adds with ``edge_dim`` getting features of
    1 instead of 0; reference: the same weights with ``self_loops=False`` on the edges with the self
    loops (and zero features) written out by hand."""
    torch.manual_seed(0)
    kw = dict(in_channels=3, num_classes=2, dim=8, num_heads=2, edge_dim=2, heads="attention:1,heat(steps=2):1")
    model = DiffusionGraphTransformer(GraphTransformerConfig(**kw)).double().eval()
    ref = DiffusionGraphTransformer(GraphTransformerConfig(**kw, self_loops=False)).double().eval()
    ref.load_state_dict(model.state_dict())
    N = 5
    x = torch.randn(N, 3, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3, 4, 1], [1, 2, 3, 4, 0, 3]])
    e = torch.randn(ei.shape[1], 2, dtype=torch.float64)
    loops = torch.arange(N).repeat(2, 1)
    expected = ref(x, torch.cat([ei, loops], 1), edge_attr=torch.cat([e, torch.zeros(N, 2, dtype=torch.float64)]))
    torch.testing.assert_close(model(x, ei, edge_attr=e), expected, rtol=0, atol=1e-12)


def test_causal_sparse_intermediates_return_every_attended_edge():
    """Kills: the causal filter of the returned sparse ``AttentionIntermediates`` using ``src < dst`` (self
    loops dropped) instead of ``src <= dst``; reference: the edge softmax over ``j <= i`` by hand."""
    torch.manual_seed(0)
    D, H, N = 8, 2, 5
    C = D // H
    layer = DiffusionAttention(D, H, causal=True).double()
    x = torch.randn(N, D, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 3, 4, 2], [0, 1, 2, 3, 4, 2, 3, 1, 2, 4]])
    _, inter = layer(x, edge_index=ei, return_intermediates=True)
    keep = ei[0] <= ei[1]
    assert torch.equal(inter.edge_index, ei[:, keep])
    qkv = x @ layer.qkv.weight.T + layer.qkv.bias
    q, k = qkv[:, :D].reshape(N, H, C), qkv[:, D : 2 * D].reshape(N, H, C)
    src, dst = ei[:, keep]
    s = (q[dst] * k[src]).sum(-1) / math.sqrt(C)  # (E', H)
    alpha = torch.empty_like(s)
    for i in range(N):
        m = dst == i
        alpha[m] = torch.softmax(s[m], dim=0)
    torch.testing.assert_close(inter.attn_weights, alpha, rtol=0, atol=1e-12)


def _eval_equals_no_dropout(fn, layer: DiffusionAttention) -> None:
    layer.eval()
    layer.dropout = 0.0
    expected = fn()
    layer.dropout = 0.5
    for seed in range(3):
        torch.manual_seed(seed)
        torch.testing.assert_close(fn(), expected, rtol=0, atol=0)


def test_edge_feature_attention_has_no_dropout_in_eval():
    """Kills: ``edge_feature_attention`` dropping attention weights outside training
    (``dropout_p = layer.dropout`` without ``if layer.training``)."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, "attention:1,heat(steps=2):1", dropout=0.5).double()
    x = torch.randn(5, 8, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4], [1, 2, 3, 4, 0, 0, 1, 2, 3, 4]])
    ek = torch.randn(ei.shape[1], 8, dtype=torch.float64)
    _eval_equals_no_dropout(lambda: edge_feature_attention(layer, x, ei, ek), layer)


def test_sparse_attention_has_no_dropout_in_eval():
    """Kills: ``DiffusionAttention._forward_sparse`` dropping attention weights outside training."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, "attention:1,heat(steps=2):1", dropout=0.5).double()
    x = torch.randn(5, 8, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4], [1, 2, 3, 4, 0, 0, 1, 2, 3, 4]])
    _eval_equals_no_dropout(lambda: layer(x, edge_index=ei), layer)


def test_graph_readout_pools_the_normalised_node_states():
    """Kills: the graph task pooling the node states before the final norm (``norm(mean(h))`` instead of
    ``mean(norm(h))``); reference: LayerNorm, per-graph mean and head by hand on the last hidden state."""
    torch.manual_seed(0)
    cfg = GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, num_heads=2, task="graph", pool="mean")
    model = DiffusionGraphTransformer(cfg).double().eval()
    x = torch.randn(7, 3, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [1, 2, 0, 4, 5, 6, 3]])
    batch = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    out, inter = model(x, ei, batch, return_intermediates=True)
    h = _layer_norm(inter.hidden_states[-1], model.norm)
    pooled = torch.stack([h[batch == g].mean(0) for g in range(2)])
    expected = pooled @ model.head.weight.T + model.head.bias
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
