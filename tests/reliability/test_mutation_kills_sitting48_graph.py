"""Mutation audit (sitting 48) of the graph package: _structure.py, _checks.py, knn.py, builders.py, interop.py,
export.py and core.py: tests that kill mutants the earlier tests (tests/graph, the graph doctests and the other
files that import these modules) left alive; each docstring names the mutant. The references are independent of the
code under test: adjacency matrices written out by hand, ``1 - cos`` and exact rational distances computed here,
and the unscaled inputs for the rescaled ones.

136 mutants (_structure.py 13, _checks.py 11, knn.py 22, builders.py 16, interop.py 20, export.py 30, core.py 24):
121 killed by earlier tests, 12 survivors killed here (knn.py 4, builders.py 1, interop.py 5, export.py 2), 3
equivalent (below). No survivor showed a bug: each was a check or a branch no test reached.

Equivalent mutants (no input tells them from the code):

- _structure.py ``structural_mask`` ``d.abs() <= min(window, N)`` -> ``min(window, N - 1)``: in an ``N x N`` matrix
  ``|i - j| <= N - 1`` always, so a window of ``N - 1`` or ``N`` (or more) keeps every pair either way.
- _checks.py ``check_int`` the ``torch.SymInt`` branch's ``value < minimum`` -> ``value < minimum - 1``: the two
  differ only for a symbolic size equal to ``minimum - 1``, i.e. 0 for ``seq_len``/``N`` (minimum 1) and -1 for
  ``window`` (minimum 0); torch specialises sizes 0 and 1 to plain ints while tracing (``check_int`` then takes
  the int branch), so a symbolic size is >= 2. Only a symbol built by hand in a ``ShapeEnv`` could be smaller, and
  one tried here (``specialize_zero_one=False``, hint 0) compared False with ``< 1`` as well, so no input kills it.
- _checks.py ``check_within_graphs`` ``edge_index.numel() > 0`` -> ``> 1``: every caller passes a validated
  ``(2, E)`` edge list, whose ``numel()`` is even, never 1.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.graph import knn


def test_kills_knn_rejects_a_single_non_finite_feature():
    """kills: graph/knn.py ``knn`` ``not bool(torch.isfinite(x).all())`` -> ``.any()`` (one NaN feature among
    finite ones passed the check, and the NaN distances tie with the masked self entry, so a point could be its own
    neighbour). Both NaN and inf, in one point of several, are refused."""
    for bad in (float("nan"), float("inf")):
        x = torch.tensor([[0.0, 1.0], [bad, 2.0], [3.0, 4.0], [5.0, 6.0]])
        with pytest.raises(ValueError, match=r"x must be finite"):
            knn(x, 1)


def test_kills_knn_cosine_distance_of_a_zero_vector_is_one():
    """kills: graph/knn.py ``knn`` ``cdist(u, u).square() / 2`` -> ``cdist(u, u).square()`` (the distance of real
    points doubled to ``2 (1 - cos)`` while a zero vector kept ``1 - cos = 1``: the zero vector was taken as nearer
    than a point at less than 90 degrees). Reference: ``1 - cos`` in float64, with ``cos = 0`` for a zero vector."""
    x = torch.tensor([[1.0, 0.0], [0.1, 1.0], [0.0, 0.0], [-1.0, 0.0]])
    xd = x.double()
    norm = xd.norm(dim=1)
    cos = (xd @ xd.T) / (norm[:, None] * norm[None, :]).clamp_min(1e-300)  # 0 for the zero vector
    dist = 1 - cos
    dist.fill_diagonal_(float("inf"))
    g = knn(x, 1, metric="cosine")
    assert g.edge_index[1].tolist() == [0, 1, 2, 3]
    real = [0, 1, 3]  # the zero vector (node 2) is at distance 1 from every point: a tie, left to topk
    assert g.edge_index[0, real].tolist() == dist.argmin(dim=1)[real].tolist() == [1, 0, 2]


@pytest.mark.parametrize("scale", [1e-30, 1e30])
def test_kills_knn_tiny_and_huge_features_are_rescaled_fully(scale):
    """kills: graph/knn.py ``_pow2_scale`` ``lim = int(math.log2(finfo.max)) - 1`` -> ``lim = 8`` (the power-of-two
    rescaling clamped to 2^±8: float32 features of 1e-30 squared to 0, every distance tied at 0, and features of 1e30
    squared to inf). The neighbours of scaled points are those of the unscaled ones."""
    x = torch.tensor([[0.0], [1.0], [3.0], [7.0], [15.0]])
    want = knn(x, 2).edge_index
    assert torch.equal(knn(x * scale, 2).edge_index, want)
    assert torch.equal(knn((x * scale)[None], 2).edge_index, want)


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_kills_knn_points_without_features(metric):
    """kills: graph/knn.py ``_pow2_scale`` the ``if x.shape[-1] == 0: return x`` shortcut dropped (points with no
    features, ``D = 0``, raised "amax(): Expected reduction dim 2 to have non-zero size" instead of the graph of
    all-equal distances). Every node still gets ``k`` in-edges from other nodes of its own graph."""
    for x, batch in ((torch.zeros(4, 0), None), (torch.zeros(2, 3, 0), None),
                     (torch.zeros(5, 0), torch.tensor([1, 0, 1, 0, 1]))):
        g = knn(x, 1, batch=batch, metric=metric)
        src, dst = g.edge_index
        n = x.shape[0] * x.shape[1] if x.dim() == 3 else x.shape[0]
        assert dst.tolist() == list(range(n))  # one in-edge per node, grouped by target
        assert not bool((src == dst).any())
        graph = g.batch if g.batch is not None else torch.zeros(n, dtype=torch.long)
        assert torch.equal(graph[src], graph[dst])


def test_kills_grid_euclidean_radius_compared_exactly():
    """kills: graph/builders.py ``_check_grid`` ``math.floor(Fraction(r) ** 2)`` -> ``math.floor(r ** 2)`` (the
    float ``math.sqrt(41)`` lies below the true root of 41, but its float square rounds up to 41.0: patches
    (5, 4) rows and columns apart, at distance exactly sqrt(41) > radius, were joined). Reference: nested loops over the patches
    comparing the exact rational square of the radius."""
    import math
    from fractions import Fraction

    from diffusionformer.graph import grid

    h, w, radius = 6, 5, math.sqrt(41)
    assert Fraction(radius) ** 2 < 41 <= radius**2  # the premise: the float square rounds up
    want = torch.zeros(h * w, h * w, dtype=torch.bool)
    for i in range(h * w):
        for j in range(h * w):
            dy, dx = i // w - j // w, i % w - j % w
            want[i, j] = dy * dy + dx * dx <= Fraction(radius) ** 2
    assert not bool(want[0, 5 * w + 4])  # (0, 0) and (5, 4): sqrt(41) apart, outside
    for layout in ("dense", "sparse"):
        got = grid(h, w, radius, metric="euclidean", layout=layout).dense_allowed()[0]
        assert torch.equal(got, want), layout


@pytest.mark.parametrize("self_loops", [True, False])
def test_kills_from_edge_index_refuses_three_rows_before_pyg(self_loops):
    """kills: graph/interop.py ``_set_self_loops`` ``edge_index.dim() != 2 or edge_index.shape[0] != 2`` -> without
    the row count (with ``self_loops=True`` a ``(3, E)`` tensor, or a list of pairs ``(E, 2)``, reached PyG's
    self-loop surgery, which took rows 0 and 1 as the edges and failed in torch.cat on the sizes, with no word of
    the shape or of the ``.t()`` hint). ``self_loops=False`` gives the same clear error (pinned here too)."""
    from diffusionformer.graph import from_edge_index

    with pytest.raises(ValueError, match=r"edge_index must have shape \(2, E\), got \(3, 4\)"):
        from_edge_index(torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0], [2, 3, 0, 1]]), 4, self_loops=self_loops)
    with pytest.raises(ValueError, match=r"got \(3, 2\): a list of \(source, target\) pairs .* edge_index\.t\(\)"):
        from_edge_index(torch.tensor([[0, 1], [1, 2], [2, 0]]), 3, self_loops=self_loops)


@pytest.mark.parametrize("self_loops", [True, False])
def test_kills_from_edge_index_meta_edges_with_self_loop_surgery(self_loops):
    """kills: graph/interop.py ``_set_self_loops`` the ``edge_index.device.type == "meta"`` check dropped (PyG's
    ``remove_self_loops`` reads the edges: torch's NotImplementedError about ``register_meta`` for
    ``torch.nonzero``). Without the surgery (``self_loops=None``) an unchecked meta graph is still built."""
    from diffusionformer.graph import from_edge_index

    meta = torch.zeros(2, 3, dtype=torch.long, device="meta")
    with pytest.raises(ValueError, match=rf"self_loops={self_loops} needs the values of edge_index, which is on the "
                                         r"meta device"):
        from_edge_index(meta, 4, self_loops=self_loops, checked=False)
    g = from_edge_index(meta, 4, checked=False)
    assert g.device.type == "meta" and g.num_nodes == 4 and not g.checked


def test_kills_from_edge_index_checks_num_nodes_before_the_edges():
    """kills: graph/interop.py ``from_edge_index`` ``check_int("num_nodes", num_nodes, 1)`` -> minimum 0 (nothing
    else tells: ``AttentionGraph.sparse`` refuses ``num_nodes=0`` with the same message, but only after the edges
    were read, so a meta ``edge_index`` with ``self_loops`` sent the user to a real device first, where the call then
    failed again on ``num_nodes``). The count is checked before anything reads ``edge_index``."""
    from diffusionformer.graph import from_edge_index

    meta = torch.zeros(2, 3, dtype=torch.long, device="meta")
    with pytest.raises(ValueError, match=r"num_nodes must be >= 1, got 0"):
        from_edge_index(meta, 0, self_loops=True, checked=False)
    with pytest.raises(ValueError, match=r"num_nodes must be >= 1, got 0"):
        from_edge_index(torch.zeros(2, 0, dtype=torch.long), 0, self_loops=True)


def test_kills_to_networkx_refuses_a_nan_threshold():
    """kills: graph/export.py ``to_networkx`` the ``threshold != threshold`` check dropped (no weight is ``> NaN``:
    every edge was filtered out and an edgeless graph came back, silently). A Python and a numpy NaN are refused; an
    infinite threshold is a number (every finite edge dropped, all nodes kept)."""
    import numpy as np

    from diffusionformer.graph import to_networkx

    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    w = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)
    for nan in (float("nan"), np.float64("nan")):
        with pytest.raises(ValueError, match=r"threshold must not be NaN, got (np\.float64\()?nan"):
            to_networkx(ei, w, threshold=nan)
    assert sorted(to_networkx(ei, w, threshold=0.3).edges) == [(1, 2), (2, 0)]
    G = to_networkx(ei, w, threshold=float("-inf"))
    assert G.number_of_edges() == 3
    G = to_networkx(ei, w, threshold=float("inf"))
    assert G.number_of_edges() == 0 and G.number_of_nodes() == 3


@pytest.mark.parametrize("head", ["mean", "max", 0, None])
def test_kills_to_networkx_refuses_complex_weights(head):
    """kills: graph/export.py ``_reduce_heads`` the ``w.is_complex()`` check dropped (``.double()`` kept the real
    part of complex attention weights with only a "discards the imaginary part" warning, and exported it as the
    edge weight). Every head choice is refused with the dtype named."""
    from diffusionformer.graph import to_networkx

    ei = torch.tensor([[0, 1], [1, 0]])
    w = torch.tensor([[0.5 + 2j], [0.25 - 1j]], dtype=torch.complex64)
    with pytest.raises(TypeError, match=r"weights must be real, got dtype torch\.complex64"):
        to_networkx(ei, w, head=head)


@pytest.mark.parametrize("self_loops", [None, True])
def test_kills_from_edge_index_refuses_a_list_or_array_of_edges(self_loops):
    """kills: graph/interop.py ``_set_self_loops`` the ``isinstance(edge_index, Tensor)`` check dropped (a nested
    list, a numpy array or None reached the layout check: "AttributeError: 'list' object has no attribute
    'is_nested'", which names neither the argument nor the type wanted)."""
    import numpy as np

    from diffusionformer.graph import from_edge_index

    for edges, name in (([[0, 1], [1, 0]], "list"), (np.array([[0, 1], [1, 0]]), "ndarray"), (None, "NoneType")):
        with pytest.raises(TypeError, match=rf"edge_index must be an integer tensor of shape \(2, E\), got {name}$"):
            from_edge_index(edges, 2, self_loops=self_loops)


@pytest.mark.parametrize("device", ["cdua", 3.5])
def test_kills_from_networkx_names_a_misspelt_device(device):
    """kills: graph/interop.py ``from_networkx`` the ``_device_argument("device", device)`` check dropped (a
    misspelt ``device="cdua"`` reached ``torch.tensor``: torch's RuntimeError listing every device type it knows,
    and ``3.5`` a bare TypeError; the check gives a ValueError naming ``device``, with a "did you mean")."""
    import networkx as nx

    from diffusionformer.graph import from_networkx

    with pytest.raises(ValueError, match=rf"device: expected a torch device such as 'cpu', 'cuda' or 'cuda:1', got "
                                         rf"{device!r}"):
        from_networkx(nx.path_graph(3), device=device)
    assert from_networkx(nx.path_graph(3), device="cpu").device == torch.device("cpu")
