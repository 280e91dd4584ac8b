"""Global attention of the graph transformer with the sizes given: no host read, ``fullgraph=True``.

``DiffusionGraphTransformer(global_attention=True)`` pads every graph of a batch. Without sizes
the padded shape comes from ``batch`` (``to_dense_batch`` reads the largest graph's size, a
boolean index gathers the nodes back); with ``max_num_nodes`` and ``num_graphs`` given, the
padding and the gather take an index ``pos_i = i - ptr_{b_i}`` computed on the device, so the
forward has no data-dependent shape. These tests hold that path to the inferred-size one and
to an unpadded reference (each graph on its own), compiled against eager, and prove with a
:class:`~torch.utils._python_dispatch.TorchDispatchMode` that the compiled forward and backward
run no host read (``_local_scalar_dense``), no ``nonzero`` and no boolean-mask index. All in
float64.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.testing import CompileCounterWithBackend
from functorch.compile import make_boxed_func
from torch.utils._python_dispatch import TorchDispatchMode

from diffusionformer.models.graph_transformer import DiffusionGraphTransformer, GraphBlock, GraphTransformerConfig

pytestmark = pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")

SIZES = (4, 2, 5)  # nodes per graph of the test batch
HEADS = "attention:1,heat(t=0.5, steps=2, learnable=True):1"  # a K-step head propagates the padded rows too


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _batch(sizes=SIZES, edge_dim=None, seed=0):
    """Node features, edges within each graph (random, no self loops), ``batch`` and edge features."""
    g = torch.Generator().manual_seed(seed)
    edges, start = [], 0
    for n in sizes:
        src, dst = torch.randint(0, n, (2, 3 * n), generator=g)
        keep = src != dst
        edges.append(torch.stack([src[keep], dst[keep]]) + start)
        start += n
    edge_index = torch.cat(edges, dim=1)
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    x = torch.randn(start, 5, generator=g, dtype=torch.float64).requires_grad_(True)
    E = edge_index.shape[1]
    edge_attr = None if edge_dim is None else torch.randn(E, edge_dim, generator=g, dtype=torch.float64)
    return x, edge_index, batch, edge_attr


def _model(seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = dict(in_channels=5, num_classes=3, dim=16, num_heads=2, depth=2, heads=HEADS, global_attention=True)
    return DiffusionGraphTransformer(GraphTransformerConfig(**{**cfg, **overrides})).double()


def _loss(y):
    return (y * torch.linspace(-1.0, 1.0, y.numel(), dtype=y.dtype).view_as(y)).sum()


def _output_and_grads(fn, model, x, *args, rows=None, **kwargs):
    """The output (its first ``rows`` rows) and the gradients of a weighted sum of it."""
    model.zero_grad(set_to_none=True)
    x.grad = None
    y = fn(x, *args, **kwargs)
    y = y if rows is None else y[:rows]
    _loss(y).backward()
    grads = {"x": x.grad.clone()}
    grads.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    return y.detach(), grads


def _assert_same(got, want, exact=False):
    tol = dict(rtol=0.0, atol=0.0) if exact else {}
    torch.testing.assert_close(got[0], want[0], **tol)
    assert got[1].keys() == want[1].keys() and len(want[1]) > 10
    for name, g in want[1].items():
        torch.testing.assert_close(got[1][name], g, **tol, msg=lambda m: f"gradient of {name}: {m}")


@pytest.mark.parametrize("task, edge_dim, pool", [("node", None, "mean"), ("graph", None, "max"), ("graph", 3, "add"),
                                                  ("node", 3, "mean")])
def test_sizes_given_equal_sizes_inferred(task, edge_dim, pool):
    model = _model(task=task, edge_dim=edge_dim, pool=pool)
    x, edge_index, batch, edge_attr = _batch(edge_dim=edge_dim)
    want = _output_and_grads(model, model, x, edge_index, batch, edge_attr=edge_attr)
    # the exact sizes: the same padded layout, bit for bit
    _assert_same(_output_and_grads(model, model, x, edge_index, batch, edge_attr=edge_attr,
                                   max_num_nodes=max(SIZES), num_graphs=len(SIZES)), want, exact=True)
    # more padding and an empty fourth graph: the padded keys are masked, so the same to rounding
    if task == "graph":
        assert model(x, edge_index, batch, edge_attr=edge_attr, max_num_nodes=9, num_graphs=4).shape == (4, 3)
    # (the empty graph's readout, the pool's value for no nodes, is left out)
    _assert_same(_output_and_grads(model, model, x, edge_index, batch, edge_attr=edge_attr, max_num_nodes=9,
                                   num_graphs=4, rows=x.shape[0] if task == "node" else 3), want)
    # one size alone: the other is read from batch
    _assert_same(_output_and_grads(model, model, x, edge_index, batch, edge_attr=edge_attr, max_num_nodes=7), want)


def test_sizes_given_without_batch():
    # a node task without batch is one graph; num_graphs may only be 1
    model = _model()
    x, edge_index, _, _ = _batch()
    want = _output_and_grads(model, model, x, edge_index)
    _assert_same(_output_and_grads(model, model, x, edge_index, max_num_nodes=x.shape[0], num_graphs=1), want,
                 exact=True)
    _assert_same(_output_and_grads(model, model, x, edge_index, max_num_nodes=x.shape[0] + 3), want)
    with pytest.raises(ValueError, match="without batch holds one graph, got num_graphs=2"):
        model(x, edge_index, max_num_nodes=20, num_graphs=2)


def test_block_with_sizes_equals_each_graph_on_its_own():
    # an unpadded reference: local edges never cross graphs, so a block over the batch with the sizes
    # given equals the block run on every graph alone (one graph, no padding at all), concatenated
    torch.manual_seed(3)
    block = GraphBlock(16, 2, HEADS, global_attention=True).double()
    _, edge_index, batch, _ = _batch(seed=1)
    h = torch.randn(batch.shape[0], 16, dtype=torch.float64)
    got = block(h, edge_index, batch, max_num_nodes=6, num_graphs=3)
    parts, start = [], 0
    for n in SIZES:
        inside = (edge_index[1] >= start) & (edge_index[1] < start + n)
        parts.append(block(h[start:start + n], edge_index[:, inside] - start))
        start += n
    torch.testing.assert_close(got, torch.cat(parts))


def test_too_small_max_num_nodes_is_an_error_not_dropped_nodes():
    model = _model(task="graph", depth=1)
    x, edge_index, batch, _ = _batch()
    with pytest.raises(ValueError, match=r"graph 2 has 5 nodes, more than max_num_nodes=4"):
        model(x, edge_index, batch, max_num_nodes=4, num_graphs=3)
    with pytest.raises(ValueError, match=r"graph ids in \[0, num_graphs=2\), got ids in \[0, 2\]"):
        model(x, edge_index, batch, max_num_nodes=5, num_graphs=2)
    N = batch.shape[0]  # the nodes in reverse order, edges relabelled: each graph intact, its ids unsorted
    with pytest.raises(ValueError, match="expected sorted graph ids"):
        model(x.flip(0), N - 1 - edge_index, batch.flip(0), max_num_nodes=5, num_graphs=3)
    with pytest.raises(ValueError, match="edge_index connects nodes of different graphs"):
        model(x, edge_index, batch.flip(0), max_num_nodes=5, num_graphs=3)
    for bad in (0, True, 4.0, torch.tensor(5)):
        with pytest.raises(ValueError, match="max_num_nodes: expected None or a positive int"):
            model(x, edge_index, batch, max_num_nodes=bad, num_graphs=3)
    with pytest.raises(ValueError, match="num_graphs: expected None or a positive int"):
        model(x, edge_index, batch, max_num_nodes=5, num_graphs=-1)
    # compiled, the value check is off: the node's padded position is out of range, an indexing error
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
        compiled(x, edge_index, batch, max_num_nodes=4, num_graphs=3)


class _Sized(nn.Module):
    """The model called with the sizes (keyword arguments) fixed."""

    def __init__(self, model: nn.Module, **sizes: int) -> None:
        super().__init__()
        self.model, self.sizes = model, sizes

    def forward(self, x, edge_index, batch, edge_attr=None):
        return self.model(x, edge_index, batch, edge_attr=edge_attr, **self.sizes)


@pytest.mark.parametrize("task, edge_dim", [("node", None), ("graph", 3)])
def test_compiles_fullgraph_like_eager(task, edge_dim):
    model = _model(task=task, edge_dim=edge_dim, depth=1)  # one block: compiling is the test's time
    sized = _Sized(model, max_num_nodes=6, num_graphs=3)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(sized, fullgraph=True, backend=counter)
    for seed, sizes in ((0, SIZES), (1, (6, 3, 1))):  # a second batch of other graph sizes
        x, edge_index, batch, edge_attr = _batch(sizes, edge_dim=edge_dim, seed=seed)
        want = _output_and_grads(sized, model, x, edge_index, batch, edge_attr)
        _assert_same(_output_and_grads(compiled, model, x, edge_index, batch, edge_attr), want)
    assert 1 <= counter.frame_count <= 2  # at most one recompile, for the new node and edge counts


_DATA_DEPENDENT = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
                   torch.ops.aten.masked_select.default}


class _NoDataDependentOps(TorchDispatchMode):
    """Fails on a host read of a tensor value, ``nonzero`` or an index by a boolean mask (which runs ``nonzero``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        indices = args[1] if func.__name__.startswith("index") and len(args) > 1 else ()
        masks = [t for t in indices if isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)] \
            if isinstance(indices, (list, tuple)) else []
        if func in _DATA_DEPENDENT or masks:
            raise AssertionError(f"data-dependent op {func}{' with a boolean mask' if masks else ''}")
        return func(*args, **(kwargs or {}))


def _spied_backend(spy: TorchDispatchMode):
    """``aot_eager`` whose forward and backward graphs run under ``spy`` (dynamo skips frames called under a mode)."""
    def compiler(gm, example_inputs):
        def run(*args):
            with spy:
                return gm(*args)
        return make_boxed_func(run)
    return aot_autograd(fw_compiler=compiler, bw_compiler=compiler)


@pytest.mark.parametrize("task, edge_dim", [("node", None), ("graph", 3)])
def test_compiled_forward_and_backward_read_no_value_on_the_host(task, edge_dim):
    # self_loops=False: the self-loop normalisation of the edges (remove_self_loops) is a boolean mask
    model = _model(task=task, edge_dim=edge_dim, self_loops=False, depth=1)
    x, edge_index, batch, edge_attr = _batch(edge_dim=edge_dim)
    spy = _NoDataDependentOps()
    compiled = torch.compile(_Sized(model, max_num_nodes=6, num_graphs=3), fullgraph=True, backend=_spied_backend(spy))
    _loss(compiled(x, edge_index, batch, edge_attr)).backward()
    assert spy.calls > 100  # the spy saw the forward and the backward
    assert x.grad is not None


def test_the_spy_fails_on_a_boolean_mask():
    # the spy itself: a boolean-mask gather (the inferred-size path's g[mask]) is caught
    h, mask = torch.randn(2, 3, 4), torch.tensor([[True, True, False], [True, False, False]])
    with pytest.raises(AssertionError, match="boolean mask"), _NoDataDependentOps():
        h[mask]
    with pytest.raises(AssertionError, match="_local_scalar_dense"), _NoDataDependentOps():
        int(mask.sum())
