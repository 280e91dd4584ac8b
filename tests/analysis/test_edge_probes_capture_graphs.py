"""Edge probes: capture_dataset on graph models (empty graphs, wrappers, restored modes, edge-feature attention)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("torch_geometric")
from torch_geometric.data import Batch, Data  # noqa: E402

from diffusionformer.analysis.capture import capture_dataset  # noqa: E402
from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig  # noqa: E402


def _graph(n: int, seed: int, y: int, edge_dim: int | None = None) -> Data:
    g = torch.Generator().manual_seed(seed)
    src = torch.arange(max(n - 1, 0))
    edge_index = torch.stack([torch.cat([src, src + 1]), torch.cat([src + 1, src])]) if n > 1 else \
        torch.zeros(2, 0, dtype=torch.long)
    d = Data(x=torch.randn(n, 3, generator=g), edge_index=edge_index, y=torch.tensor([y]))
    if edge_dim is not None:
        d.edge_attr = torch.randn(edge_index.shape[1], edge_dim, generator=g)
    return d


def _model(**kw) -> DiffusionGraphTransformer:
    torch.manual_seed(0)
    cfg = dict(in_channels=3, num_classes=2, task="graph", dim=8, depth=2, num_heads=2)
    cfg.update(kw)
    return DiffusionGraphTransformer(GraphTransformerConfig(**cfg)).eval()


def _per_graph_reference(model: nn.Module, g: Data, **kw) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """The block outputs (own hooks) and the logits of ``g`` run alone."""
    outs: dict[int, torch.Tensor] = {}
    handles = [blk.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i + 1, o.detach()))
               for i, blk in enumerate(model.blocks)]
    try:
        with torch.no_grad():
            logits = model(g.x, g.edge_index, None, **kw)
    finally:
        for h in handles:
            h.remove()
    return outs, logits


class _Wrapper(nn.Module):
    """A plain wrapper holding ``.module`` (as DDP does), with a forward that takes any keyword."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


class _Compiled(nn.Module):
    """Stands in for torch.compile's OptimizedModule: the model under ``_orig_mod``, a forward taking anything."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self._orig_mod = module
        self.blocks = module.blocks

    def forward(self, *args, **kwargs):
        return self._orig_mod(*args, **kwargs)


@pytest.mark.parametrize("wrap", [None, _Wrapper, _Compiled])
def test_bug_trailing_empty_graph_keeps_its_output_row(wrap):
    """Bug: the default forward called model(b.x, b.edge_index, b.batch) without num_graphs, so a trailing
    graph without nodes (no id in b.batch) got no row in a graph readout sized batch.max() + 1: keep_outputs gave
    G - 1 rows for G labels and G padded states, and with several batches every later output moved up one graph."""
    model = _model()
    graphs = [_graph(3, 1, 1), _graph(2, 2, 0), _graph(0, 3, 1)]
    more = [_graph(4, 4, 0), _graph(2, 5, 1)]
    batches = [(b, b.y.view(-1)) for b in (Batch.from_data_list(graphs), Batch.from_data_list(more))]
    cap = capture_dataset(wrap(model) if wrap else model, batches, keep_outputs=True)
    assert cap.num_examples == 5 and cap.labels.tolist() == [1, 0, 1, 0, 1]
    assert cap.outputs.shape == (5, 2)
    assert cap.mask.sum(1).tolist() == [3, 2, 0, 4, 2]
    for row, g in enumerate(graphs + more):
        if g.num_nodes == 0:  # an empty graph alone: the head of a zero readout
            with torch.no_grad():
                empty = model(g.x, g.edge_index, torch.zeros(0, dtype=torch.long), num_graphs=1)
            torch.testing.assert_close(cap.outputs[row], empty[0])
            continue
        outs, logits = _per_graph_reference(model, g)
        torch.testing.assert_close(cap.outputs[row], logits[0], atol=1e-5, rtol=1e-5)
        for layer in (1, 2):
            torch.testing.assert_close(cap.states[layer][row, : g.num_nodes], outs[layer], atol=1e-5, rtol=1e-5)


def test_empty_graphs_in_the_middle_and_front_align_with_per_graph_runs():
    """Empty graphs first / in the middle: padded states, mask and labels follow the graphs' order."""
    model = _model(global_attention=True)
    graphs = [_graph(0, 1, 1), _graph(3, 2, 0), _graph(0, 3, 1), _graph(1, 4, 0)]  # the last one: an isolated node
    b = Batch.from_data_list(graphs)
    cap = capture_dataset(model, [(b, b.y.view(-1))], keep_outputs=True)
    assert cap.mask.tolist() == [[False] * 3, [True] * 3, [False] * 3, [True, False, False]]
    assert cap.labels.tolist() == [1, 0, 1, 0] and cap.outputs.shape == (4, 2)
    for row in (1, 3):
        outs, logits = _per_graph_reference(model, graphs[row])
        n = graphs[row].num_nodes
        torch.testing.assert_close(cap.outputs[row], logits[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cap.states[2][row, :n], outs[2], atol=1e-5, rtol=1e-5)
        assert bool((cap.states[2][row, n:] == 0).all())


def test_edge_feature_attention_rows_sum_to_one_and_match_per_graph_recompute():
    """attentions=True on blocks with edge features: one weight per (edge, head), rows sum to 1 per node."""
    from diffusionformer.nn.edge_features import edge_feature_attention

    model = _model(edge_dim=2)
    graphs = [_graph(3, 1, 1, 2), _graph(2, 2, 0, 2)]
    b = Batch.from_data_list(graphs)
    fwd = lambda m, bb: m(bb.x, bb.edge_index, bb.batch, edge_attr=bb.edge_attr)  # noqa: E731
    cap = capture_dataset(model, [b], attentions=True, forward=fwd)
    P, ei = cap.attentions[0], cap.attention_edges[0]
    assert P.shape[1] == 2 and ei.shape == (2, P.shape[0])
    row_sums = torch.zeros(5, 2).index_add_(0, ei[1], P)
    torch.testing.assert_close(row_sums, torch.ones(5, 2))
    # graph 0 alone: block 0 sees the embedding of its nodes and its own edges (with self loops, zero features)
    g = graphs[0]
    edges, attr = model._prepare_edges(g.edge_index, g.num_nodes, g.edge_attr)
    with torch.no_grad():
        h = model.embed(g.x)
        blk = model.blocks[0]
        _, P0 = edge_feature_attention(blk.attn, blk.norm1(h), edges, blk.edge_proj(attr), return_weights=True)
    keep = ei[1] < 3
    got = {(int(s), int(t)): P[k] for k, (s, t) in enumerate(ei.t().tolist()) if keep[k]}
    want = {(int(s), int(t)): P0[k] for k, (s, t) in enumerate(edges.t().tolist())}
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=1e-5, rtol=1e-5)


def test_training_modes_restored_and_hooks_removed_after_a_failing_forward():
    """A forward that raises: every submodule's mode comes back (a frozen eval part too) and no hook is left."""
    model = _model()
    model.train()
    model.blocks[1].eval()
    b = Batch.from_data_list([_graph(3, 1, 1)])

    def boom(m, bb):
        m(bb.x, bb.edge_index, bb.batch)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        capture_dataset(model, [b], attentions=True, forward=boom)
    assert model.training and model.blocks[0].training and not model.blocks[1].training
    assert all(not blk._forward_hooks and not blk._forward_pre_hooks for blk in model.blocks)
