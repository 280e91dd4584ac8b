"""Layer capture with hooks: exact states, clean removal, memory bound, graphs; per-layer reports."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.analysis import (
    LayerCapture,
    LayerRecorder,
    capture_dataset,
    dirichlet_energy,
    layer_reports,
    pad_by_batch,
    variance_ratio,
    within_sequence_variance,
)
from diffusionformer.models import (
    DiffusionGPT,
    DiffusionGraphTransformer,
    DiffusionViT,
    GPTConfig,
    GraphTransformerConfig,
    ViTConfig,
)


def no_hooks(model: torch.nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.fixture
def vit() -> DiffusionViT:
    torch.manual_seed(0)
    return DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=2, dim=16, depth=3, num_heads=2, laplacian_heads=1))


@pytest.fixture
def gpt() -> DiffusionGPT:
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(vocab_size=13, block_size=10, n_layer=2, n_head=2, n_embd=16,
                                  heads="attention:1,heat(t=0.7, steps=3):1"))


def graph_batch(sizes: list[int], features: int = 3, seed: int = 0):  # type: ignore[no-untyped-def]
    from torch_geometric.data import Batch, Data

    g = torch.Generator().manual_seed(seed)
    graphs = []
    for i, n in enumerate(sizes):
        ring = torch.arange(n)
        edge_index = torch.stack([ring, (ring + 1) % n])
        edge_index = torch.cat([edge_index, edge_index.flip(0)], dim=1)
        graphs.append(Data(x=torch.randn(n, features, generator=g), edge_index=edge_index, y=torch.tensor([i % 2])))
    return Batch.from_data_list(graphs)


# ---------------------------------------------------------------------------------- dense models
def test_vit_states_equal_model_intermediates_and_hooks_are_removed(vit: DiffusionViT) -> None:
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(4, 1, 8, 8, generator=g) for _ in range(2)]
    ys = [torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5, 6, 7])]
    vit.train()
    with torch.no_grad():
        vit.eval()
        before = [vit(x) for x in xs]
        refs = [vit.forward_tokens(x, return_intermediates=True)[1] for x in xs]
        vit.train()
    cap = capture_dataset(vit, list(zip(xs, ys)), keep_outputs=True)
    assert vit.training  # mode restored
    assert no_hooks(vit)
    assert cap.layers == [0, 1, 2, 3]
    assert torch.equal(cap.embeddings, torch.cat([r.embeddings for r in refs]))
    for layer in range(3):
        assert torch.equal(cap.hidden_states[layer], torch.cat([r.hidden_states[layer] for r in refs]))
    assert cap.states[1].dtype == torch.float32 and cap.states[1].device.type == "cpu"
    assert cap.labels.tolist() == list(range(8))
    assert torch.equal(cap.outputs, torch.cat(before))
    assert cap.mask is None and cap.attentions is None
    vit.eval()
    with torch.no_grad():
        assert torch.equal(vit(xs[0]), before[0])  # the model computes exactly what it did before


def test_gpt_states_and_causal_attention_rows(gpt: DiffusionGPT) -> None:
    g = torch.Generator().manual_seed(2)
    idx = torch.randint(0, 13, (5, 10), generator=g)
    targets = torch.roll(idx, -1, dims=1)
    gpt.eval()
    with torch.no_grad():
        _, _, inter = gpt(idx, return_intermediates=True)
    cap = capture_dataset(gpt, [(idx, targets)], attentions=True)
    assert no_hooks(gpt)
    assert torch.equal(cap.embeddings, inter.embeddings)
    for a, b in zip(cap.hidden_states, inter.hidden_states):
        assert torch.equal(a, b)
    assert torch.equal(cap.labels, targets)  # one label per token
    assert sorted(cap.attentions) == [0, 1] and cap.attention_edges is None
    for block, P in cap.attentions.items():
        assert P.shape == (5, 2, 10, 10)
        torch.testing.assert_close(P.sum(-1), torch.ones(5, 2, 10))
        assert torch.all(P.triu(diagonal=1) == 0)  # causal: i never sees j > i
        # independent reference: softmax(q k^T / sqrt(C) + causal mask) from the block's weights
        attn = gpt.blocks[block].attn
        h = gpt.blocks[block].norm1(cap.states[block])
        q, k, _ = attn.qkv(h).unflatten(-1, (3, 2, 8)).unbind(-3)
        scores = torch.einsum("bihc,bjhc->bhij", q, k) / math.sqrt(8)
        scores = scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
        torch.testing.assert_close(P, scores.softmax(-1).detach(), rtol=1e-5, atol=1e-6)


def test_memory_bound_stops_drawing_batches(vit: DiffusionViT) -> None:
    drawn = []

    def batches():  # type: ignore[no-untyped-def]
        g = torch.Generator().manual_seed(3)
        for i in range(100):
            drawn.append(i)
            yield torch.randn(3, 1, 8, 8, generator=g), torch.full((3,), i)

    cap = capture_dataset(vit, batches(), max_examples=5, attentions=True, max_attention_examples=4)
    assert drawn == [0, 1]  # the third batch is never drawn
    assert cap.num_examples == 5 and all(x.shape[0] == 5 for x in cap.states.values())
    assert cap.labels.tolist() == [0, 0, 0, 1, 1]  # the last batch was cut to fit
    assert cap.num_attention_examples == 4 and all(P.shape[0] == 4 for P in cap.attentions.values())
    assert cap.extra["num_batches"] == 2

    calls = []
    handle = vit.blocks[0].attn.register_forward_hook(lambda *_: calls.append(1))
    try:
        drawn.clear()
        capture_dataset(vit, batches(), max_examples=6, attentions=True, max_attention_examples=2)
        assert len(calls) == 2 + 1  # the block's own call twice, one recomputation: then the budget is full
        calls.clear()
        drawn.clear()
        none = capture_dataset(vit, batches(), max_examples=3, attentions=True, max_attention_examples=0)
        assert none.attentions is None and len(calls) == 1
    finally:
        handle.remove()


def test_layer_selection_and_errors(vit: DiffusionViT) -> None:
    x = torch.randn(2, 1, 8, 8)
    cap = capture_dataset(vit, [x], layers=[0, -1], attentions=True)
    assert cap.layers == [0, 3] and sorted(cap.attentions) == [2]  # the block that produced layer 3
    assert cap.labels is None
    with pytest.raises(ValueError, match=r"layers must hold residual-stream indices in \[0, 3\]"):
        capture_dataset(vit, [x], layers=[4])
    with pytest.raises(TypeError, match="model.blocks"):
        capture_dataset(torch.nn.Linear(2, 2), [x])
    with pytest.raises(ValueError, match="max_examples must be a positive int"):
        capture_dataset(vit, [x], max_examples=0)
    with pytest.raises(ValueError, match="batches` was empty"):
        capture_dataset(vit, [])
    with pytest.raises(TypeError, match=r"labels must be a tensor or None"):
        capture_dataset(vit, [(x, [0, 1])])


def test_hooks_are_removed_when_the_forward_pass_fails(vit: DiffusionViT) -> None:
    vit.train()
    with pytest.raises(ValueError, match="expected images of shape"):
        capture_dataset(vit, [torch.randn(2, 3, 8, 8)], attentions=True)
    assert no_hooks(vit) and vit.training
    with pytest.raises(RuntimeError, match="boom"):
        with LayerRecorder(vit, attentions=True):
            assert not no_hooks(vit)
            raise RuntimeError("boom")
    assert no_hooks(vit)


# ---------------------------------------------------------------------------------- graph models
def test_graph_model_capture_is_padded_per_graph() -> None:
    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, task="graph", dim=8, depth=2,
                                                             num_heads=2, laplacian_heads=1))
    b = graph_batch([3, 5, 4])
    model.eval()
    with torch.no_grad():
        _, inter = model(b.x, b.edge_index, b.batch, return_intermediates=True)
    cap = capture_dataset(model, [(b, b.y)], attentions=True, keep_outputs=True)
    assert no_hooks(model)
    assert cap.states[2].shape == (3, 5, 8)
    assert cap.lengths().tolist() == [3, 5, 4]
    assert torch.equal(cap.states[0][cap.mask], inter.embeddings)
    for a, ref in zip(cap.hidden_states, inter.hidden_states):
        assert torch.equal(a[cap.mask], ref)
        assert torch.all(a[~cap.mask] == 0)
    assert cap.labels.tolist() == [0, 1, 0] and cap.outputs.shape == (3, 2)
    for block, w in cap.attentions.items():
        ei = cap.attention_edges[block]
        assert w.shape == (ei.shape[1], 2) and int(ei.max()) < 12
        sums = torch.zeros(12, 2).index_add_(0, ei[1], w)  # each node's incoming weights sum to 1
        torch.testing.assert_close(sums, torch.ones(12, 2))

    # node labels are padded like the nodes; max_examples cuts the batch to whole graphs
    node_labels = torch.arange(12)
    cut = capture_dataset(model, [(b, node_labels)], max_examples=2, attentions=True)
    assert cut.states[1].shape == (2, 5, 8) and cut.lengths().tolist() == [3, 5]
    assert cut.labels[cut.mask].tolist() == list(range(8)) and torch.all(cut.labels[~cut.mask] == -100)
    torch.testing.assert_close(cut.states[2][cut.mask], inter.hidden_states[1][:8], rtol=1e-5, atol=1e-6)
    assert int(cut.attention_edges[0].max()) < 8


def test_bug_a_graph_model_fed_a_tuple_is_refused_not_counted_by_nodes() -> None:
    """Bug: a graph model fed ``((x, edge_index, batch), y)`` had its batch counted by ``x.shape[0]`` (12 nodes
    read as 12 sequences): three graphs came back as 12 padded rows, nine of them empty, and ``max_examples``
    cut ``x`` and ``edge_index`` by rows. Node states from a batch that is not a PyG Data/Batch are now a
    ``TypeError`` that says to pass the Batch; the hooks are removed and the training mode is restored."""
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, task="graph", dim=8, depth=2,
                                                             num_heads=2))
    b = graph_batch([3, 5, 4])
    model.train()
    with pytest.raises(TypeError, match=r"graph model.*batch is a tuple.*pass the Batch itself"):
        capture_dataset(model, [((b.x, b.edge_index, b.batch), b.y)])
    assert no_hooks(model) and model.training
    cap = capture_dataset(model, [(b, b.y)])  # the Batch itself: three graphs
    assert cap.lengths().tolist() == [3, 5, 4]


def test_pad_by_batch_rejects_unsorted_batches() -> None:
    with pytest.raises(ValueError, match="batch must be sorted"):
        pad_by_batch(torch.zeros(3, 2), torch.tensor([1, 0, 1]))


# ---------------------------------------------------------------------------------- reports
def test_reports_on_closed_form_tokens() -> None:
    const = torch.ones(3, 4, 2) * torch.tensor([2.0, -1.0])
    X = torch.tensor([[[1.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [-1.0, 0.0]]]).repeat(3, 1, 1) + 5.0
    P = torch.full((3, 2, 4, 4), 0.25)
    cap = LayerCapture({0: const, 1: X}, labels=torch.tensor([0, 1, 1]), attentions={0: P},
                       extra={"num_attention_examples": 3})
    r0, r1 = (r.metrics for r in layer_reports(cap))
    assert r0["within_variance"] == 0.0 and r0["dirichlet_complete"] == 0.0 and r0["effective_rank"] == 0.0
    assert r0["dirichlet_attention"] is None  # layer 0 comes from no block
    assert r1["within_variance"] == pytest.approx(1.0)
    # uniform attention = the complete graph: both energies agree
    assert r1["dirichlet_attention"] == pytest.approx(r1["dirichlet_complete"])
    assert r1["variance_ratio"] == pytest.approx(float(variance_ratio(X, "pooled")))
    assert r1["effective_rank"] == pytest.approx(1.0) and r1["power_law_alpha"] is None  # rank 1
    assert r1["nc1"] == pytest.approx(0.0, abs=1e-12)  # all sequence means equal -> S_W = 0


def test_reports_on_padded_sequences_equal_per_sequence_metrics() -> None:
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randn(n, 3, generator=g, dtype=torch.float64) for n in (2, 4, 4, 3)]
    X = torch.zeros(4, 4, 3, dtype=torch.float64)
    mask = torch.zeros(4, 4, dtype=torch.bool)
    for i, s in enumerate(seqs):
        X[i, : len(s)], mask[i, : len(s)] = s, True
    cap = LayerCapture({0: X}, mask=mask, labels=torch.tensor([0, 1, 0, 1]))
    m = layer_reports(cap)[0].metrics
    expected = torch.stack([within_sequence_variance(s.unsqueeze(0))[0] for s in seqs]).mean()
    assert m["within_variance"] == pytest.approx(float(expected))
    energies = torch.stack([dirichlet_energy(s.unsqueeze(0))[0] for s in seqs]).mean()
    assert m["dirichlet_complete"] == pytest.approx(float(energies))
    tokens = torch.cat(seqs)  # ANOVA of the real tokens, each sequence's scatter about its own mean (sitting 52)
    within = sum(((s - s.mean(0)) ** 2).sum() for s in seqs) / ((tokens - tokens.mean(0)) ** 2).sum()
    assert m["anova_within_fraction"] == pytest.approx(float(within), rel=1e-12)
    assert m["nc1"] is not None and math.isfinite(m["nc1"])


def test_dense_and_sparse_attention_energy_agree() -> None:
    g = torch.Generator().manual_seed(5)
    B, H, T = 2, 2, 3
    X = torch.randn(B, T, 4, generator=g)
    P = torch.rand(B, H, T, T, generator=g).softmax(-1)
    b, h, i, j = torch.meshgrid(*(torch.arange(n) for n in (B, H, T, T)), indexing="ij")
    edges = torch.stack([(b * T + j)[:, 0].flatten(), (b * T + i)[:, 0].flatten()])  # (source j, target i)
    weights = P.permute(0, 2, 3, 1).reshape(-1, H)
    dense = LayerCapture({0: X, 1: X}, attentions={0: P}, extra={"num_attention_examples": B})
    sparse = LayerCapture({0: X, 1: X}, attentions={0: weights}, attention_edges={0: edges},
                          extra={"num_attention_examples": B})
    e_dense = layer_reports(dense)[1].metrics["dirichlet_attention"]
    e_sparse = layer_reports(sparse)[1].metrics["dirichlet_attention"]
    assert e_dense is not None and e_dense == pytest.approx(e_sparse, rel=1e-6)


def test_drop_prefix_removes_class_token(vit: DiffusionViT) -> None:
    cap = capture_dataset(vit, [torch.randn(2, 1, 8, 8)], attentions=True)
    patches = cap.drop_prefix(vit.num_prefix)
    assert patches.states[3].shape == (2, 16, 16)
    assert torch.equal(patches.states[3], cap.states[3][:, 1:])
    assert patches.attentions[0].shape == (2, 2, 16, 16)
    with pytest.raises(ValueError, match="non-negative int"):
        cap.drop_prefix(-1)
