"""Metamorphic properties of layers and models, decided in float64 (probe 43).

A sweep over every registered operator and the dense (sdpa, matrix) and sparse back-ends found
no violation of: token-permutation equivariance, node relabelling and edge-order invariance,
batch independence (key padding, graph batches of different sizes, ViT / GPT / graph models in
eval mode), causal prefix independence (GPT with every head type, with and without the KV
cache), GQA against repeated key/value heads, the exact-heat semigroup and the operator limits.
The pins below hold the properties that no earlier test states in this form.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.graph import AttentionGraph
from diffusionformer.models.graph_transformer import DiffusionGraphTransformer, GraphTransformerConfig
from diffusionformer.models.vit import DiffusionViT, ViTConfig
from diffusionformer.nn.attention import DiffusionAttention

_RIVALS = ["attnscale(omega=0.3)", "differential", "grand-nl", "neutreno", "value-residual"]
_POLY = ["laplacian", "heat(t=0.7)", "ppr(alpha=0.3)", "polynomial(steps=3)"]


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _permuted_heads_layer(src: DiffusionAttention, perm: list[int], heads: list[str], **kw) -> DiffusionAttention:
    """``src`` with its heads reordered: head ``h`` of the new layer is head ``perm[h]`` of ``src``."""
    D, H = src.dim, src.num_heads
    C = D // H
    layer = DiffusionAttention(D, H, heads=[heads[p] for p in perm], **kw).double().eval()
    idx = torch.cat([torch.arange(p * C, (p + 1) * C) for p in perm])
    rows = torch.cat([idx, D + idx, 2 * D + idx])
    with torch.no_grad():
        layer.qkv.weight.copy_(src.qkv.weight[rows])
        layer.qkv.bias.copy_(src.qkv.bias[rows])
        layer.out_proj.weight.copy_(src.out_proj.weight[:, idx])
        layer.out_proj.bias.copy_(src.out_proj.bias)
    return layer


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", ["sdpa", "matrix"])
def test_pins_reordering_mixed_heads_with_their_weights_leaves_the_dense_output_unchanged(causal, backend):
    """A layer whose per-head list mixes attention, Laplacian, truncated heat, PPR, exact heat and a
    learned polynomial: reordering the heads together with their q/k/v rows and ``out_proj``
    columns must give the same output (the fused affine path, the propagated heads and the
    materialised ones are regrouped by the plan, whatever their order)."""
    heads = ["attention", "laplacian", "heat(t=0.4)", "ppr(alpha=0.3)", "heat-exact(t=0.5)",
             "polynomial(steps=2, init=[0.1, 0.5, 0.4])"]
    torch.manual_seed(0)
    src = DiffusionAttention(24, 6, heads=heads, causal=causal, backend=backend).double().eval()
    x = torch.randn(2, 5, 24, dtype=torch.float64)
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[1, -2:] = True
    want = src(x, key_padding_mask=kpm)
    g = torch.Generator().manual_seed(1)
    for _ in range(6):
        perm = torch.randperm(6, generator=g).tolist()
        layer = _permuted_heads_layer(src, perm, heads, causal=causal, backend=backend)
        got = layer(x, key_padding_mask=kpm)
        assert _err(got[~kpm], want[~kpm]) < 1e-12, perm


@pytest.mark.parametrize("causal", [False, True])
def test_pins_reordering_mixed_heads_leaves_the_sparse_output_unchanged(causal):
    """As the dense pin, on a sparse graph with a duplicated edge and a self loop."""
    heads = ["attention", "laplacian", "heat(t=0.4)", "ppr(alpha=0.3)", "attention",
             "polynomial(steps=2, init=[0.1, 0.5, 0.4])"]
    torch.manual_seed(0)
    src = DiffusionAttention(24, 6, heads=heads, causal=causal).double().eval()
    x = torch.randn(5, 24, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3, 4, 1, 3, 0, 2, 3], [1, 2, 3, 4, 0, 0, 1, 4, 2, 1]])
    want = src(x, edge_index=ei)
    g = torch.Generator().manual_seed(2)
    for _ in range(6):
        perm = torch.randperm(6, generator=g).tolist()
        got = _permuted_heads_layer(src, perm, heads, causal=causal)(x, edge_index=ei)
        assert _err(got, want) < 1e-12, perm


@pytest.mark.parametrize("spec", _POLY + _RIVALS)
def test_pins_a_dense_graph_and_its_to_sparse_form_give_the_same_layer_output(spec):
    """``AttentionGraph.dense(...).to_sparse()`` is documented as the same graph: on the real tokens
    a layer must give the same output for both, for per-sequence ``allowed`` masks (one real token
    with no in-edge), key padding, a causal window, and for every operator with a sparse back-end,
    the context rivals included."""
    B, N, D = 3, 6, 16
    torch.manual_seed(0)
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[0, -2:] = True
    kpm[2, :1] = True
    allowed = torch.rand(B, N, N) < 0.6
    allowed[1, 3, :] = False
    layer = DiffusionAttention(D, 4, heads=f"{spec}:2,attention:2", backend="matrix").double().eval()
    x = torch.randn(B, N, D, dtype=torch.float64)
    real = ~kpm
    for kw in ({"allowed": allowed}, {"allowed": allowed, "causal": True, "window": 3}, {"window": 2}):
        g = AttentionGraph.dense(N, batch_size=B, key_padding_mask=kpm, **kw)
        dense = layer(x, g)
        sparse = layer(x.reshape(B * N, D), g.to_sparse()).reshape(B, N, D)
        assert _err(dense[real], sparse[real]) < 1e-12, kw


@pytest.mark.parametrize("spec", ["heat-exact(t=0.6)", "ppr-exact(alpha=0.3)"] + _RIVALS)
def test_pins_a_padded_patch_changes_no_real_token_of_a_deep_vit(spec):
    """Three blocks (the rivals read the first layer's values from the shared layer state): the
    pixels of a padded patch, however large, must not reach any real token, and a sample's
    tokens must not depend on the other sample of the batch."""
    torch.manual_seed(0)
    cfg = ViTConfig(input_size=(8, 8), in_channels=2, patch_size=4, dim=16, depth=3, num_heads=4,
                    heads=f"{spec}:2,attention:2")
    model = DiffusionViT(cfg).double().eval()
    x = torch.randn(2, 2, 8, 8, dtype=torch.float64)
    T = model.num_prefix + 4
    kpm = torch.zeros(2, T, dtype=torch.bool)
    kpm[0, -1] = True  # the bottom-right patch of sample 0
    x2 = x.clone()
    x2[0, :, 4:, 4:] = 5 * torch.randn(2, 4, 4, dtype=torch.float64)
    with torch.no_grad():
        z = model.forward_tokens(x, key_padding_mask=kpm)
        z2 = model.forward_tokens(x2, key_padding_mask=kpm)
        alone = model.forward_tokens(x[1:])
    assert _err(z[0, :-1], z2[0, :-1]) < 1e-12
    assert _err(z[1], alone[0]) < 1e-12


@pytest.mark.parametrize("spec", ["heat(t=0.7)", "ppr(alpha=0.3)", "grand-nl", "neutreno"])
@pytest.mark.parametrize("global_attention", [False, True])
def test_pins_graph_transformer_graph_batches_and_relabelling(spec, global_attention):
    """A batch of three graphs of sizes 5, 3 and 4: each graph's node logits equal those of the graph
    run alone, relabelling the nodes within each graph (with ``edge_index`` and ``batch``) permutes
    the logits, and reordering the edges with their features changes nothing; with global
    attention, a larger padded size ``max_num_nodes`` changes nothing either."""
    torch.manual_seed(0)
    cfg = GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, num_heads=2, heads=f"{spec}:1,attention:1",
                                 global_attention=global_attention, edge_dim=None if spec in _RIVALS else 2)
    model = DiffusionGraphTransformer(cfg).double().eval()
    g = torch.Generator().manual_seed(3)
    graphs = [(torch.randn(5, 3, generator=g, dtype=torch.float64), torch.tensor([[0, 1, 2, 3, 4, 0, 2], [1, 2, 3, 4, 0, 2, 2]])),
              (torch.randn(3, 3, generator=g, dtype=torch.float64), torch.tensor([[0, 1, 2, 1], [1, 2, 0, 1]])),
              (torch.randn(4, 3, generator=g, dtype=torch.float64), torch.tensor([[0, 1, 2, 3, 3], [1, 2, 3, 0, 0]]))]
    use_attr = cfg.edge_dim is not None
    attrs = [torch.randn(ei.shape[1], 2, generator=g, dtype=torch.float64) for _, ei in graphs]

    def run(items, perm=None, edge_perm=None, **kw):
        xs, eis, eas, bs, off = [], [], [], [], 0
        for i, ((x, ei), ea) in enumerate(items):
            xs.append(x)
            eis.append(ei + off)
            eas.append(ea)
            bs.append(torch.full((x.shape[0],), i))
            off += x.shape[0]
        x, ei, ea, b = torch.cat(xs), torch.cat(eis, 1), torch.cat(eas), torch.cat(bs)
        if perm is not None:
            x, ei, b = x[perm], torch.argsort(perm)[ei], b[perm]
        if edge_perm is not None:
            ei, ea = ei[:, edge_perm], ea[edge_perm]
        return model(x, ei, b, **({"edge_attr": ea} if use_attr else {}), **kw)

    items = list(zip(graphs, attrs))
    with torch.no_grad():
        out = run(items)
        starts = [0, 5, 8, 12]
        for i, item in enumerate(items):
            assert _err(out[starts[i]:starts[i + 1]], run([item])) < 1e-12, i
        perm = torch.cat([torch.randperm(5, generator=g), 5 + torch.randperm(3, generator=g),
                          8 + torch.randperm(4, generator=g)])
        assert _err(run(items, perm=perm), out[perm]) < 1e-12
        assert _err(run(items, edge_perm=torch.randperm(16, generator=g)), out) < 1e-12
        if global_attention:
            assert _err(run(items, max_num_nodes=9, num_graphs=3), out) < 1e-12
