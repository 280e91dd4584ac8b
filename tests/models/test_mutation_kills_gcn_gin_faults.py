"""Tests written in a mutation-testing audit of the GNN baselines (``models/gcn.py``: the GCN of Kipf &
Welling; ``models/gin.py``: the GIN of Xu et al.), the structural masks and edge lists of sequence graphs
(``graph/_structure.py``: causal and sliding-window relations, block-diagonal replication) and the
simulated failures used by the resume tests (``testing/faults.py``: ``interrupt_on_call`` and
``assert_same_checkpoint_weights``).

Each test kills a mutant of the library code that the rest of the suite let through (its docstring
names it: file and mutation) and checks the code against an independent reference: the GCN and GIN
layers written out in numpy from their papers' formulas (dense normalised adjacency, an explicit
two-layer MLP with batch normalisation from the running statistics, explicit sum / mean / max readouts)
and a tiny GCN whose output is worked out by hand; masks, pair tests and edge lists built by plain
Python loops over every pair ``(i, j)``; and checkpoints and call sequences written by hand.
Mutants judged equivalent are listed, with the reason, at the end of the file. Two tests, whose docstrings
start with "Bug:", pin defects fixed here: ``GCNConfig`` accepted any ``task`` (a typo such as "grpah" built a
node model) and any ``pool`` (a ``KeyError`` at the first forward pass), and ``interrupt_on_call`` "restored"
a staticmethod as a plain function (every later call through an instance raised ``TypeError``) and left a
copy of an inherited method on the patched subclass. CPU only, deterministic, no network; files only under
``tmp_path``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from diffusionformer.graph._structure import replicate_edges, structural_edges, structural_keep, structural_mask
from diffusionformer.models.gcn import GCN, GCNConfig
from diffusionformer.models.gin import GIN, GINConfig
from diffusionformer.testing.faults import assert_same_checkpoint_weights, interrupt_on_call

CPU = torch.device("cpu")


# ----------------------------------------------------------------------------- references in numpy
def _np(t):
    return t.detach().double().numpy()


def _adj(edge_index, n):
    """A[dst, src] = number of edges src -> dst (PyG's source-to-target flow)."""
    A = np.zeros((n, n))
    for s, d in edge_index.t().tolist():
        A[d, s] += 1.0
    return A


def _pool_np(h, batch, kind):
    G = max(batch) + 1
    rows = []
    for g in range(G):
        members = h[[k for k, b in enumerate(batch) if b == g]]
        rows.append({"add": members.sum(0), "mean": members.mean(0), "max": members.max(0)}[kind])
    return np.stack(rows)


def _gcn_ref(model, x, edge_index, batch=None):
    """H' = D^-1/2 (A + I) D^-1/2 H W^T + b, ReLU between layers (and after the last for task="graph")."""
    c = model.config
    h = _np(x)
    n = h.shape[0]
    A_hat = _adj(edge_index, n) + np.eye(n)
    d = A_hat.sum(1) ** -0.5
    P = d[:, None] * A_hat * d[None, :]
    L = len(model.convs)
    for k, conv in enumerate(model.convs):
        h = P @ h @ _np(conv.lin.weight).T + _np(conv.bias)
        if k < L - 1 or c.task == "graph":
            h = np.maximum(h, 0.0)
    if c.task == "graph":
        b = [0] * n if batch is None else batch.tolist()
        h = _pool_np(h, b, c.pool) @ _np(model.head.weight).T + _np(model.head.bias)
    return h


def _bn_eval(h, bn):
    return (h - _np(bn.running_mean)) / np.sqrt(_np(bn.running_var) + bn.eps) * _np(bn.weight) + _np(bn.bias)


def _gin_ref(model, x, edge_index, batch=None, eps=0.0):
    """h' = relu(bn2(lin2(relu(bn1(lin1((1 + eps) h + A h)))))) per layer; sum over layers of head(readout(h))."""
    c = model.config
    h = _np(x)
    n = h.shape[0]
    A = _adj(edge_index, n)
    hs = [h]
    for conv in model.convs:
        lin1, bn1, _, lin2, bn2, _ = conv.nn
        z = (1.0 + eps) * hs[-1] + A @ hs[-1]
        z = np.maximum(_bn_eval(z @ _np(lin1.weight).T + _np(lin1.bias), bn1), 0.0)
        z = np.maximum(_bn_eval(z @ _np(lin2.weight).T + _np(lin2.bias), bn2), 0.0)
        hs.append(z)
    if c.task == "graph":
        b = [0] * n if batch is None else batch.tolist()
        hs = [_pool_np(h, b, c.pool) for h in hs]
    return sum(h @ _np(head.weight).T + _np(head.bias) for head, h in zip(model.heads, hs))


def _undirected(pairs):
    return torch.tensor([[a for a, b in pairs] + [b for a, b in pairs], [b for a, b in pairs] + [a for a, b in pairs]])


def _randomise_gin(model, seed=0):
    """Non-zero biases and batch-norm statistics so that every term of the formula matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g, dtype=m.running_mean.dtype) * 0.3)
                m.running_var.copy_(torch.rand(m.num_features, generator=g, dtype=m.running_var.dtype) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g, dtype=m.weight.dtype) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g, dtype=m.bias.dtype) * 0.5 + 0.3)
            elif isinstance(m, torch.nn.Linear):
                m.bias.copy_(torch.randn(m.out_features, generator=g, dtype=m.bias.dtype) * 0.3)


# ----------------------------------------------------------------------------- GCN
def test_gcn_config_defaults_are_the_documented_planetoid_ones():
    """kills: gcn.py defaults ``num_layers`` 2 -> 3, ``hidden`` 16 -> 32, ``dropout`` 0.5 -> 0, ``pool`` "mean" -> "add"
    (the docstring: PyG's Planetoid example, 2 layers, 16 hidden, dropout 0.5; readout mean)"""
    c = GCNConfig()
    assert (c.in_channels, c.num_classes, c.task, c.hidden, c.num_layers, c.dropout, c.pool) == \
        (16, 2, "node", 16, 2, 0.5, "mean")
    model = GCN(c)
    assert [(conv.in_channels, conv.out_channels) for conv in model.convs] == [(16, 16), (16, 2)]


def test_gcn_one_layer_output_worked_out_by_hand():
    """kills: gcn.py ``GCNConv(..., add_self_loops=False)`` and ``normalize=False`` (the path 0 - 1 - 2 with
    self-loops has degrees 2, 3, 2: out_0 = x_0 / 2 + x_1 / sqrt(6), out_1 = x_0 / sqrt(6) + x_1 / 3 + x_2 / sqrt(6))"""
    model = GCN(GCNConfig(in_channels=1, num_classes=1, num_layers=1, dropout=0.0)).eval()
    with torch.no_grad():
        model.convs[0].lin.weight.fill_(1.0)
        model.convs[0].bias.fill_(0.0)
    x = torch.tensor([[1.0], [2.0], [3.0]])
    out = model(x, _undirected([(0, 1), (1, 2)]))
    r6 = math.sqrt(6.0)
    expected = [[1 / 2 + 2 / r6], [1 / r6 + 2 / 3 + 3 / r6], [2 / r6 + 3 / 2]]
    torch.testing.assert_close(out, torch.tensor(expected), atol=1e-6, rtol=0)


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_gcn_node_task_matches_the_dense_formula(layers):
    """kills: gcn.py ReLU after the last convolution of a node model (``i < len(self.convs)``), the ReLU index off by
    one (``len - 2``), ``F.relu`` -> ``F.gelu``, ``bias=False``, and dropout applied in eval mode"""
    torch.manual_seed(layers)
    model = GCN(GCNConfig(in_channels=3, num_classes=4, hidden=5, num_layers=layers)).double().eval()
    with torch.no_grad():
        for conv in model.convs:
            conv.bias.copy_(torch.linspace(-1.0, 1.0, conv.bias.numel(), dtype=torch.float64))
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, 3, generator=g, dtype=torch.float64)
    ei = _undirected([(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (0, 3)])
    out = model(x, ei)
    assert out.shape == (6, 4)
    np.testing.assert_allclose(out.detach().numpy(), _gcn_ref(model, x, ei), atol=1e-12, rtol=0)
    assert (out < 0).any()  # the last layer has no ReLU
    assert sorted(n for n, _ in model.named_parameters()) == sorted(
        [f"convs.{k}.bias" for k in range(layers)] + [f"convs.{k}.lin.weight" for k in range(layers)])


@pytest.mark.parametrize("pool", ["mean", "add", "max"])
def test_gcn_graph_task_readouts_match_numpy(pool):
    """kills: gcn.py the pool table (``mean`` -> add, ``add`` -> mean, ``max`` -> mean), no ReLU after the last
    convolution of a graph model (``or c.task == "graph"`` dropped), and ``batch=None`` read as one graph per node"""
    torch.manual_seed(3)
    model = GCN(GCNConfig(in_channels=2, num_classes=3, hidden=4, num_layers=2, task="graph", pool=pool)).double().eval()
    with torch.no_grad():
        for conv in model.convs:
            conv.bias.copy_(torch.tensor([-0.5, 0.2, -0.1, 0.4], dtype=torch.float64))
    g = torch.Generator().manual_seed(8)
    x = torch.randn(7, 2, generator=g, dtype=torch.float64)
    ei = _undirected([(0, 1), (1, 2), (3, 4), (4, 5), (5, 6), (3, 6)])
    batch = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    out = model(x, ei, batch)
    assert out.shape == (2, 3)
    np.testing.assert_allclose(out.detach().numpy(), _gcn_ref(model, x, ei, batch), atol=1e-12, rtol=0)
    one = model(x[:3], ei[:, [0, 1, 6, 7]])  # batch=None: a single graph
    assert one.shape == (1, 3)
    np.testing.assert_allclose(one.detach().numpy(), _gcn_ref(model, x[:3], ei[:, [0, 1, 6, 7]]), atol=1e-12, rtol=0)


def test_gcn_recomputes_the_normalisation_for_every_graph():
    """kills: gcn.py ``GCNConv(..., cached=True)`` (the second graph, with as many nodes, would reuse the first
    graph's normalised adjacency)"""
    torch.manual_seed(4)
    model = GCN(GCNConfig(in_channels=2, num_classes=2, hidden=3, dropout=0.0)).double().eval()
    x = torch.randn(4, 2, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    a, b = _undirected([(0, 1), (1, 2), (2, 3)]), _undirected([(0, 2), (0, 3), (0, 1)])
    for ei in (a, b, a):
        np.testing.assert_allclose(model(x, ei).detach().numpy(), _gcn_ref(model, x, ei), atol=1e-12, rtol=0)


def test_gcn_dropout_acts_in_training_only():
    """kills: gcn.py the ``F.dropout`` line removed (training output equal to the eval one) and dropout on in eval mode"""
    torch.manual_seed(5)
    model = GCN(GCNConfig(in_channels=4, num_classes=2, hidden=8, dropout=0.5))
    x = torch.randn(10, 4, generator=torch.Generator().manual_seed(1))
    ei = _undirected([(k, k + 1) for k in range(9)])
    model.eval()
    ev = model(x, ei)
    torch.testing.assert_close(model(x, ei), ev, atol=0, rtol=0)
    model.train()
    torch.manual_seed(0)
    assert not torch.allclose(model(x, ei), ev)


def test_gcn_rejects_bad_configs_and_inputs():
    """kills: gcn.py ``check_probability`` dropped, ``num_layers`` dropped from ``check_positive_int``, the
    ``isinstance(config, GCNConfig)`` check dropped, and the input-width check reduced to ``x.dim() != 2``"""
    with pytest.raises(ValueError, match="dropout"):
        GCNConfig(dropout=1.0)
    with pytest.raises(ValueError, match="num_layers"):
        GCNConfig(num_layers=0)
    with pytest.raises(TypeError, match="config must be a GCNConfig, got GINConfig"):
        GCN(GINConfig())
    model = GCN(GCNConfig(in_channels=3))
    with pytest.raises(ValueError, match=r"x must have shape \(N, in_channels=3\), got \(4, 5\)"):
        model(torch.randn(4, 5), torch.tensor([[0], [1]]))



def test_gcn_config_rejects_an_unknown_task_or_pool():
    """Bug: gcn.py ``GCNConfig`` did not check ``task`` and ``pool`` (``GINConfig`` does): ``task="grpah"`` silently
    built a node model and ``pool="sum"`` failed only at the first forward pass with ``KeyError: 'sum'``"""
    with pytest.raises(ValueError, match="GCNConfig.task must be 'node' or 'graph', got 'grpah'"):
        GCNConfig(task="grpah")
    with pytest.raises(ValueError, match="GCNConfig.pool must be 'mean', 'add' or 'max', got 'sum'"):
        GCNConfig(task="graph", pool="sum")
    for task in ("node", "graph"):
        for pool in ("mean", "add", "max"):
            GCNConfig(task=task, pool=pool)

# ----------------------------------------------------------------------------- GIN
def test_gin_config_defaults_are_the_papers_gin0():
    """kills: gin.py defaults ``num_layers`` 5 -> 4, ``hidden`` 64 -> 32, ``pool`` "add" -> "mean", ``train_eps``
    False -> True and ``dropout`` 0.5 -> 0 (the paper: 5 layers, 64 hidden, sum readout, GIN-0, dropout 0.5)"""
    c = GINConfig()
    assert (c.in_channels, c.num_classes, c.task, c.hidden, c.num_layers, c.dropout, c.pool, c.train_eps) == \
        (16, 2, "graph", 64, 5, 0.5, "add", False)


def test_gin0_fixes_epsilon_at_zero_and_gin_eps_learns_it():
    """kills: gin.py ``train_eps=True`` for every model and ``eps=1.0`` (GIN-0 has a fixed epsilon of 0, a buffer)"""
    fixed = GIN(GINConfig(in_channels=2, hidden=4, num_layers=3))
    assert [float(conv.eps) for conv in fixed.convs] == [0.0, 0.0]
    assert not any("eps" in n for n, _ in fixed.named_parameters())
    learned = GIN(GINConfig(in_channels=2, hidden=4, num_layers=3, train_eps=True))
    assert sorted(n for n, _ in learned.named_parameters() if "eps" in n) == ["convs.0.eps", "convs.1.eps"]


@pytest.mark.parametrize("pool", ["add", "mean", "max"])
def test_gin_matches_the_numpy_formula(pool):
    """kills: gin.py the last ``ReLU`` of the MLP dropped, the first ``BatchNorm1d`` dropped, each convolution fed
    the input (``hs[0]``) instead of the previous layer, no head on the input layer, the input readout skipped,
    the pool table (``add`` -> mean, ``mean`` -> add, ``max`` -> add), ``batch=None`` read as one graph per node,
    and dropout applied in eval mode"""
    torch.manual_seed(11)
    model = GIN(GINConfig(in_channels=3, num_classes=2, hidden=5, num_layers=3, pool=pool)).double()
    _randomise_gin(model)
    model.eval()
    g = torch.Generator().manual_seed(12)
    x = torch.randn(7, 3, generator=g, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 0, 3, 4, 5, 6], [1, 2, 0, 2, 4, 5, 6, 3]])  # directed: the flow is source -> target
    batch = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    out = model(x, ei, batch)
    assert out.shape == (2, 2)
    np.testing.assert_allclose(out.detach().numpy(), _gin_ref(model, x, ei, batch), atol=1e-12, rtol=0)
    one = model(x[:3], ei[:, :4])  # batch=None: a single graph
    assert one.shape == (1, 2)
    np.testing.assert_allclose(one.detach().numpy(), _gin_ref(model, x[:3], ei[:, :4]), atol=1e-12, rtol=0)


def test_gin_node_task_sums_the_per_layer_heads():
    """kills: gin.py no head on the input layer and the input readout skipped (node task, no pooling)"""
    torch.manual_seed(13)
    model = GIN(GINConfig(in_channels=2, num_classes=3, hidden=4, num_layers=2, task="node")).double()
    _randomise_gin(model, seed=1)
    model.eval()
    x = torch.randn(5, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    out = model(x, ei)
    assert out.shape == (5, 3) and len(model.heads) == 2
    np.testing.assert_allclose(out.detach().numpy(), _gin_ref(model, x, ei), atol=1e-12, rtol=0)


def test_gin_dropout_is_applied_before_the_heads_in_training():
    """kills: gin.py ``head(F.dropout(h, ...))`` -> ``head(h)`` (batch normalisation alone already makes training
    differ from eval, so the comparison is with the same weights at ``dropout=0``)"""
    torch.manual_seed(14)
    model = GIN(GINConfig(in_channels=3, hidden=6, num_layers=3, dropout=0.5)).train()
    plain = GIN(dataclasses.replace(model.config, dropout=0.0)).train()
    plain.load_state_dict(model.state_dict())
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(4))
    ei = torch.tensor([[0, 1, 2, 4, 5, 6], [1, 2, 3, 5, 6, 7]])  # a chain per graph (no edge 3 -> 4 across them)
    batch = torch.tensor([0] * 4 + [1] * 4)
    torch.manual_seed(0)
    assert not torch.allclose(model(x, ei, batch), plain(x, ei, batch))


def test_gin_rejects_bad_configs_and_inputs():
    """kills: gin.py ``num_layers < 2`` -> ``< 1`` and -> ``<= 2``, the task check dropped, the pool check rejecting
    "max", ``check_probability`` dropped, the ``isinstance`` check dropped, and the width check reduced to ``x.dim()``"""
    GINConfig(num_layers=2, pool="max", task="node")  # the smallest model and every documented choice are accepted
    GINConfig(pool="mean")
    for bad, match in [(dict(num_layers=1), "num_layers must be >= 2"), (dict(task="edge"), "task must be"),
                       (dict(dropout=1.0), "dropout"), (dict(pool="sum"), "pool must be")]:
        with pytest.raises(ValueError, match=match):
            GINConfig(**bad)
    with pytest.raises(TypeError, match="config must be a GINConfig, got GCNConfig"):
        GIN(GCNConfig())
    model = GIN(GINConfig(in_channels=3))
    with pytest.raises(ValueError, match=r"x must have shape \(N, in_channels=3\), got \(4, 2\)"):
        model(torch.randn(4, 2), torch.tensor([[0], [1]]))


# ----------------------------------------------------------------------------- _structure
def _allowed(i, j, causal, window):
    return (not causal or j <= i) and (window is None or abs(i - j) <= window)


CASES = [(N, causal, window) for N in (1, 2, 5) for causal in (False, True) for window in (None, 0, 1, 3, 7)]


@pytest.mark.parametrize("N, causal, window", CASES)
def test_structural_mask_matches_the_pairwise_relation(N, causal, window):
    """kills: _structure.py ``structural_mask`` ``d >= 0`` -> ``d > 0`` and -> ``d <= 0``, ``d.abs() <= window`` ->
    ``< window`` and -> ``d <= window``, and no None for an unrestricted relation"""
    mask = structural_mask(N, causal, window, CPU)
    if not causal and window is None:
        assert mask is None
        return
    expected = [[_allowed(i, j, causal, window) for j in range(N)] for i in range(N)]
    assert mask.dtype == torch.bool and mask.tolist() == expected


@pytest.mark.parametrize("causal, window", [(c, w) for c in (False, True) for w in (None, 0, 1, 2, 10)])
def test_structural_keep_matches_the_pairwise_relation(causal, window):
    """kills: _structure.py ``structural_keep`` ``j <= i`` -> ``j < i``, ``abs(i - j) <= window`` -> ``< window`` and
    -> ``(i - j) <= window``"""
    pairs = [(i, j) for i in range(5) for j in range(5)]
    i = torch.tensor([p[0] for p in pairs])
    j = torch.tensor([p[1] for p in pairs])
    assert structural_keep(i, j, causal, window).tolist() == [_allowed(a, b, causal, window) for a, b in pairs]


@pytest.mark.parametrize("N, causal, window", CASES + [(0, True, 2), (0, False, None), (4, False, 10**12)])
def test_structural_edges_are_the_pairs_target_major_sorted_by_source(N, causal, window):
    """kills: _structure.py ``structural_edges`` the rows swapped (``[i, j]``) in both branches, ``indexing="xy"``,
    ``j <= i`` -> ``j < i``, causal offsets without 0, the window one short, ``j < N`` -> ``j <= N``, ``j >= 0`` ->
    ``j > 0``, and ``w`` not clamped to ``N - 1`` (a window of 10**12 must not allocate 2 * 10**12 offsets)"""
    edges = structural_edges(N, causal, window, CPU)
    expected = [(j, i) for i in range(N) for j in range(N) if _allowed(i, j, causal, window)]
    assert edges.shape == (2, len(expected)) and edges.dtype == torch.long
    assert [tuple(e) for e in edges.t().tolist()] == expected


def test_replicate_edges_shifts_each_copy_by_its_block():
    """kills: _structure.py ``replicate_edges`` ``repeat_interleave`` -> ``repeat`` for the shifts and a stride of
    ``N - 1`` instead of ``N``"""
    e0 = torch.tensor([[0, 1, 2], [1, 2, 2]])
    out = replicate_edges(e0, 3, 4)
    expected = [(s + 4 * b, d + 4 * b) for b in range(3) for s, d in [(0, 1), (1, 2), (2, 2)]]
    assert [tuple(e) for e in out.t().tolist()] == expected
    assert replicate_edges(e0, 1, 4).tolist() == e0.tolist()


# ----------------------------------------------------------------------------- faults
class _Task:
    def __init__(self):
        self.log = []

    def loss(self, x, *, scale=1):
        self.log.append(x * scale)
        return x * scale


def test_interrupt_on_call_kills_exactly_the_chosen_call():
    """kills: faults.py ``seen["calls"] == call`` -> ``>= call`` and -> ``== call - 1``, the count line dropped,
    ``KeyboardInterrupt`` -> ``RuntimeError``, and ``**kwargs`` not passed on"""
    t = _Task()
    with interrupt_on_call(_Task, "loss", 3) as seen:
        assert t.loss(1, scale=10) == 10
        assert t.loss(2) == 2
        assert seen == {"calls": 2}
        with pytest.raises(KeyboardInterrupt, match=r"simulated kill in loss \(call 3\)"):
            t.loss(3)
        assert seen == {"calls": 3} and t.log == [10, 2]  # the killed call did not run (after=False)
        assert t.loss(4, scale=2) == 8  # later calls run normally
        assert seen == {"calls": 4}
    assert t.log == [10, 2, 8]


def test_interrupt_on_call_after_runs_the_original_first():
    """kills: faults.py the ``if after: original(...)`` lines dropped and ``if after`` -> ``if not after``"""
    t = _Task()
    with interrupt_on_call(_Task, "loss", 1, after=True):
        with pytest.raises(KeyboardInterrupt):
            t.loss(5, scale=3)
    assert t.log == [15]


def test_interrupt_on_call_restores_the_method_also_when_the_kill_propagates():
    """kills: faults.py the ``setattr(owner, name, original)`` restore dropped and moved out of ``finally``"""
    original = _Task.loss
    with pytest.raises(KeyboardInterrupt):
        with interrupt_on_call(_Task, "loss", 1):
            _Task().loss(1)
    assert _Task.loss is original
    with interrupt_on_call(_Task, "loss", 1):
        pass
    assert _Task.loss is original


def test_interrupt_on_call_counts_from_one():
    """kills: faults.py ``call < 1`` -> ``call < 0`` and the check dropped"""
    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"call must be >= 1, got {bad}"):
            with interrupt_on_call(_Task, "loss", bad):
                pass



def test_interrupt_on_call_restores_staticmethods_and_inherited_methods():
    """Bug: faults.py restored ``getattr(owner, name)``: a staticmethod came back as a plain function (later calls
    through an instance passed ``self`` and raised ``TypeError``) and an inherited method was left as an attribute
    of the patched subclass (shadowing the base class from then on)"""
    class Base:
        def loss(self, x):
            return x

    class Sub(Base):
        @staticmethod
        def scale(x):
            return 2 * x

    with interrupt_on_call(Sub, "loss", 5):
        assert "loss" in vars(Sub)
    assert "loss" not in vars(Sub) and Sub.loss is Base.loss
    with interrupt_on_call(Sub, "scale", 5):
        pass
    assert isinstance(vars(Sub)["scale"], staticmethod)
    assert Sub().scale(3) == 6 and Sub.scale(4) == 8
    obj = Base()
    with interrupt_on_call(obj, "loss", 1):
        with pytest.raises(KeyboardInterrupt):
            obj.loss(1)
    assert vars(obj) == {} and obj.loss(7) == 7


def test_bug_interrupt_on_call_patches_static_and_class_methods_without_binding_self():
    """Bug: faults.py set the wrapper as a plain function, so while a staticmethod was patched a call through an
    instance passed ``self`` to it (``TypeError``: one argument too many), and a classmethod got the instance
    besides its own class. The wrapper is now a staticmethod for both."""
    class Task:
        factor = 3

        @staticmethod
        def scale(x):
            return 2 * x

        @classmethod
        def times(cls, x):
            return cls.factor * x

    for name, want in (("scale", [2, 4]), ("times", [3, 6])):
        with interrupt_on_call(Task, name, 3) as seen:
            assert [getattr(Task(), name)(1), getattr(Task, name)(2)] == want
            with pytest.raises(KeyboardInterrupt, match=f"simulated kill in {name} \\(call 3\\)"):
                getattr(Task(), name)(5)
            assert seen["calls"] == 3
        assert getattr(Task(), name)(1) == want[0]
    assert isinstance(vars(Task)["scale"], staticmethod) and isinstance(vars(Task)["times"], classmethod)

def _save(path, **entries):
    torch.save(entries, path)
    return path


def test_assert_same_checkpoint_weights_compares_bits_names_and_the_model_entry(tmp_path):
    """kills: faults.py ``torch.equal`` -> ``torch.allclose``, ``if differ`` -> ``len(differ) > 1``, the key-set check
    dropped, the second file read from ``a``, and the default ``key`` "model" -> "ema\""""
    w = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])}
    a = _save(tmp_path / "a.pt", model=w, ema={"w": torch.zeros(2)})
    same = _save(tmp_path / "same.pt", model={k: v.clone() for k, v in w.items()}, ema={"w": torch.ones(2)})
    assert_same_checkpoint_weights(a, same)  # only "model" is compared
    with pytest.raises(AssertionError):
        assert_same_checkpoint_weights(a, same, key="ema")
    tiny = _save(tmp_path / "tiny.pt", model={"w": torch.tensor([1.0, 2.0 + 1e-6]), "b": torch.tensor([0.5])})
    with pytest.raises(AssertionError, match=r"1 of 2 tensors differ .* \['w'\]"):
        assert_same_checkpoint_weights(a, tiny)
    with pytest.raises(AssertionError, match=r"1 of 2 tensors differ"):
        assert_same_checkpoint_weights(tiny, a)
    extra = _save(tmp_path / "extra.pt", model={**w, "c": torch.zeros(1)})
    with pytest.raises(AssertionError, match=r"different tensors: only in .*a\.pt: \[\], only in .*extra\.pt: \['c'\]"):
        assert_same_checkpoint_weights(a, extra)
    fewer = _save(tmp_path / "fewer.pt", model={"w": w["w"]})
    with pytest.raises(AssertionError, match=r"only in .*a\.pt: \['b'\]"):
        assert_same_checkpoint_weights(a, fewer)


# ---------------------------------------------------------------------------- equivalent mutants
# Mutants applied in this audit: 91 (25 in gcn.py, 25 in gin.py, 21 in _structure.py, 20 in faults.py, six of
# them on the two fixes); with this file the suite kills all but these two, which no input tells from the code:
# - _structure.py ``structural_edges`` ``w = min(window, max(N - 1, 0))`` -> ``min(window, N - 1)``: the two differ
#   only at ``N = 0``, where ``w = -1`` gives an empty ``arange(1, ...)`` of offsets and an empty ``arange(0)`` of
#   targets, so the edge list is the same empty ``(2, 0)`` tensor (pinned by the ``N = 0`` cases above).
# - _structure.py ``replicate_edges`` the ``if B == 1: return edges`` shortcut dropped: the general path then
#   returns ``edges.repeat(1, 1) + 0``, the same values in a new tensor; no caller writes into the edge list.
