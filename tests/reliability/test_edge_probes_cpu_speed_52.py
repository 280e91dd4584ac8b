"""A CPU performance engineer's pass (helper 52h): avoidable costs in the hot paths, each fix checked to give the
bits of the code path it replaced (kept here as the reference: ``_fresh_layouts`` makes every sparse call build its
own ``EdgeLayout`` again, as before). The speed-ups were measured in one process against these references (see the
report); the tests assert equality and the work done (how many layouts are made), never times."""

from __future__ import annotations

import gc

import pytest
import torch

from diffusionformer.functional import diffuse_sparse_with_weights
from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig
from diffusionformer.nn import DiffusionAttention
from diffusionformer.ops import csr, sparse


@pytest.fixture(autouse=True)
def _no_shared_layout():
    """No layout shared from another test (nor left to the next one)."""
    if hasattr(csr, "_LAST_LAYOUT"):
        csr._LAST_LAYOUT[0] = None
    yield
    if hasattr(csr, "_LAST_LAYOUT"):
        csr._LAST_LAYOUT[0] = None


def _fresh_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old path: every sparse call builds its own layout (and its backward pass its own transposed layout)."""
    monkeypatch.setattr(sparse, "_edge_layout", lambda edge_index, n: csr.EdgeLayout(edge_index, n), raising=False)


def _count_layouts(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of ``EdgeLayout`` constructions and transposed layouts made (their sorts), from now on."""
    counts = {"layouts": 0, "transposed": 0}
    init, transposed = csr.EdgeLayout.__init__, csr.EdgeLayout.transposed

    def counting_init(self, *args, **kwargs):
        counts["layouts"] += 1
        init(self, *args, **kwargs)

    def counting_transposed(self):
        if self._transposed is None:
            counts["transposed"] += 1
        return transposed(self)

    monkeypatch.setattr(csr.EdgeLayout, "__init__", counting_init)
    monkeypatch.setattr(csr.EdgeLayout, "transposed", counting_transposed)
    return counts


def _graph(N: int = 40, E: int = 200, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, N, (2, E), generator=g)


def _graph_model(depth: int = 3) -> DiffusionGraphTransformer:
    torch.manual_seed(0)
    return DiffusionGraphTransformer(GraphTransformerConfig(in_channels=6, num_classes=3, dim=16, depth=depth,
                                                            num_heads=2, heads="attention:1,heat(t=1.0, steps=3):1"))


def _step(model: torch.nn.Module, x: torch.Tensor, ei: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(x, ei)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_sparse_layers_of_one_forward_sort_the_edges_once(monkeypatch):
    """Bug: every sparse attention call sorted its edge_index into a CSR layout again (and its backward pass sorted the
    transpose again), though a graph model hands the same edge_index tensor to each of its L layers: L sorts forward
    and L backward per step (2 ms each at 2k nodes / 20k edges, a quarter of a 4-layer graph transformer's training
    step on CPU). Consecutive calls with the same unmodified tensor now share one layout (ops/csr.py _edge_layout);
    the outputs and gradients are the bits of the old path."""
    model = _graph_model(depth=3)
    x, ei = torch.randn(40, 6, generator=torch.Generator().manual_seed(1)), _graph()
    counts = _count_layouts(monkeypatch)
    out, grads = _step(model, x, ei)
    assert counts == {"layouts": 1, "transposed": 1}
    _fresh_layouts(monkeypatch)
    counts.update(layouts=0, transposed=0)
    ref_out, ref_grads = _step(model, x, ei)
    assert counts == {"layouts": 3, "transposed": 3}  # the old path: one per layer
    assert torch.equal(out, ref_out)
    assert len(grads) == len(ref_grads) and all(torch.equal(a, b) for a, b in zip(grads, ref_grads))


def test_repeated_layer_calls_on_one_graph_equal_the_old_path(monkeypatch):
    """Full-batch training calls a layer with the same edge_index at every step: one layout for all of them, and the
    outputs, returned edge weights and gradients of each call are those of a call that builds its own (the shared
    layout's transposed half, made by the first backward pass, serves the later ones)."""
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, "attention:2,laplacian:1,heat(t=0.5, steps=2):1")
    ei = _graph()
    x = torch.randn(40, 16, requires_grad=True)

    def run():
        results = []
        for _ in range(3):
            x.grad = None
            y, inter = layer(x, edge_index=ei, return_intermediates=True)
            y.square().sum().backward()
            results.append((y.detach(), inter.attn_weights.detach(), x.grad.clone()))
        return results

    new = run()
    _fresh_layouts(monkeypatch)
    old = run()
    for a, b in zip(new, old):
        assert all(torch.equal(s, t) for s, t in zip(a, b))


def test_a_shared_layout_follows_changes_to_the_edges(monkeypatch):
    """The layout is shared only while the edges are the same: an in-place write (a version bump), a write through
    numpy (no version bump, caught by the CPU copy), another num_nodes or another tensor of the same values made
    anew gives the result of a fresh layout; none is kept once the edge tensor is freed."""
    q, k, v = (torch.randn(41, 2, 4, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
               for s in (1, 2, 3))
    coeffs = [[0.0, 1.0, 0.0], [0.5, 0.3, 0.2]]

    def call(ei, n=40):
        return diffuse_sparse_with_weights(q[:n], k[:n], v[:n], ei, coeffs, num_nodes=n)

    def fresh(ei, n=40):
        with monkeypatch.context() as m:
            _fresh_layouts(m)
            return call(ei, n)

    ei = _graph()
    first = call(ei)
    assert all(torch.equal(a, b) for a, b in zip(first, fresh(ei)))
    ei[0, :5] = torch.arange(5)  # in place: the version counter moves
    assert all(torch.equal(a, b) for a, b in zip(call(ei), fresh(ei)))
    call(ei)
    ei.numpy()[1, 7:12] = [3, 3, 3, 3, 3]  # through numpy: no version bump
    assert all(torch.equal(a, b) for a, b in zip(call(ei), fresh(ei)))
    wider = call(ei, 41)  # the same edges over one node more (without edges)
    assert all(torch.equal(a, b) for a, b in zip(wider, fresh(ei, 41)))
    assert all(torch.equal(a, b) for a, b in zip(call(ei.clone()), fresh(ei)))
    del ei
    gc.collect()
    assert getattr(csr, "_LAST_LAYOUT", [None])[0] is None  # released with its edges


def test_a_layout_made_under_inference_mode_is_not_reused_for_training(monkeypatch):
    """A layout made under inference mode holds inference tensors, which a later training call could not save for
    its backward pass ("Inference tensors cannot be saved for backward"): such calls build their own."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, "heat(t=0.5, steps=2):2")
    ei = _graph(N=10, E=30)
    x = torch.randn(10, 8, requires_grad=True)
    with torch.inference_mode():
        inferred = layer(x.detach(), edge_index=ei)
    y = layer(x, edge_index=ei)
    y.sum().backward()
    assert torch.equal(inferred, y.detach()) and x.grad is not None
    with torch.inference_mode():  # and the training call's layout serves inference mode as a fresh one would
        assert torch.equal(layer(x.detach(), edge_index=ei), y.detach())


def test_edge_feature_layers_share_the_layout_across_steps_and_layers(monkeypatch):
    """Bug: the edge-feature path propagates with ``propagate_sparse`` once per power of ``P``, on the model's one edge
    tensor, and each call sorted the edges again: a K-step head in each of L layers sorted them K L times per forward
    (and as often in the backward pass; 1.44x slower at 2k nodes, depth 4, K = 3). One layout now serves them all,
    with the outputs and gradients of the old path."""
    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=6, num_classes=3, dim=16, depth=2, num_heads=2,
                                                             edge_dim=3, heads="attention:1,heat(t=1.0, steps=3):1"))
    g = torch.Generator().manual_seed(2)
    x, ei, ea = torch.randn(40, 6, generator=g), _graph(), torch.randn(200, 3, generator=g)

    def step():
        model.zero_grad(set_to_none=True)
        out = model(x, ei, edge_attr=ea)
        out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    counts = _count_layouts(monkeypatch)
    out, grads = step()
    shared = dict(counts)
    _fresh_layouts(monkeypatch)
    counts.update(layouts=0, transposed=0)
    ref_out, ref_grads = step()
    assert shared["layouts"] == 1 < counts["layouts"]
    assert torch.equal(out, ref_out)
    assert len(grads) == len(ref_grads) and all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
