"""Edge-case probes of the graph package (layouts, PyG inputs, export) and the analysis plots, by a second prober of
the round of test_edge_probes_graph_second.py: the cases that file lacks (CSR and sparse `batch` inputs, `self_loops`,
the inf draw cases) and reference tests (grid vs a hand-built loop, knn with id gaps vs brute force, a Batch with an
empty graph)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data, HeteroData
from torch_geometric.utils import to_dense_adj, to_edge_index, to_torch_coo_tensor

from diffusionformer.analysis.plots import plot_metric_by_depth, plot_pca_token_maps, plot_spectra
from diffusionformer.graph import (
    AttentionGraph,
    draw_attention_graph,
    from_edge_index,
    from_pyg,
    grid,
    knn,
    to_networkx,
)

EDGES = torch.tensor([[0, 0, 2], [1, 2, 1]])  # 0 -> 1, 0 -> 2, 2 -> 1 over 3 nodes


def _figure_axes():
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    return Figure().add_subplot()


def test_bug_sparse_layout_tensors_are_refused_with_a_hint() -> None:
    """Bug: a torch.sparse tensor was accepted as allowed, key_padding_mask or attn_mask and then failed deep
    inside a conversion or the layer (NotImplementedError 'aten::bitwise_and ... SparseCPU', 'reshape is not
    implemented for sparse tensors'); a sparse adjacency passed as edge_index said 'must have shape (2, E), got
    (3, 3)' or 'got dtype torch.float32', with no word on how to convert it."""
    adj = to_torch_coo_tensor(EDGES, size=3)  # adj[source, target]
    allowed = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 1, 1]], dtype=torch.bool)
    for kwargs, name in [({"allowed": allowed.to_sparse()}, "allowed"),
                         ({"allowed": allowed.to_sparse_csr()}, "allowed"),
                         ({"key_padding_mask": torch.tensor([[False, False, True]]).to_sparse()}, "key_padding_mask"),
                         ({"attn_mask": torch.zeros(3, 3).to_sparse()}, "attn_mask")]:
        with pytest.raises(TypeError, match=rf"{name} must be a dense \(strided\) tensor, got layout "
                                            rf"torch.sparse_c.*{name}.to_dense\(\)"):
            AttentionGraph.dense(3, **kwargs)
    with pytest.raises(TypeError, match=r"batch must be a dense \(strided\).*batch.to_dense\(\)"):
        AttentionGraph.sparse(EDGES, 3, batch=torch.zeros(3, dtype=torch.long).to_sparse())
    hint = r"edge_index must be a dense \(strided\) tensor, got layout torch.sparse_c(oo|sr).*to_edge_index\(adj\)\[0\]"
    for build in (lambda a: AttentionGraph.sparse(a, 3), lambda a: from_edge_index(a, 3),
                  lambda a: from_edge_index(a, 3, self_loops=True),
                  lambda a: from_pyg(Data(edge_index=a, num_nodes=3)), lambda a: to_networkx(a)):
        for a in (adj, adj.to_sparse_csr()):
            with pytest.raises(TypeError, match=hint):
                build(a)
    with pytest.raises(TypeError, match=r"weights must be a dense \(strided\)"):
        to_networkx(EDGES, torch.ones(1, 1, 3, 3).to_sparse())
    # the hinted conversion gives back the graph
    assert torch.equal(to_edge_index(adj)[0], EDGES)
    assert torch.equal(from_edge_index(to_edge_index(adj.to_sparse_csr())[0], 3).edge_index, EDGES)


def test_bug_from_pyg_hetero_data_and_adj_t_say_how_to_convert() -> None:
    """Bug: from_pyg(HeteroData) said only 'must be a Data or Batch, got HeteroData', and a Data in the
    ToSparseTensor layout (adj_t, no edge_index) said 'data has no edge_index': neither said what to do."""
    h = HeteroData()
    h["a"].x, h["b"].x = torch.randn(3, 2), torch.randn(2, 2)
    h["a", "to", "b"].edge_index = torch.tensor([[0, 2], [1, 0]])
    with pytest.raises(TypeError, match=r"got HeteroData: .*data.to_homogeneous\(\).*from_edge_index"):
        from_pyg(h)
    assert from_pyg(h.to_homogeneous()).edge_index.tolist() == [[0, 2], [4, 3]]  # the hinted conversion works

    import torch_geometric.transforms as T

    data = T.ToSparseTensor()(Data(edge_index=EDGES, num_nodes=3))
    with pytest.raises(ValueError, match=r"no edge_index but an adj_t .*to_edge_index\(data.adj_t\)\[0\].flip\(0\)"):
        from_pyg(data)
    data.edge_index = to_edge_index(data.adj_t)[0].flip(0)  # the hinted conversion: the same edges (j -> i)
    got = from_pyg(data)
    assert sorted(map(tuple, got.edge_index.t().tolist())) == sorted(map(tuple, EDGES.t().tolist()))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_bug_draw_attention_graph_refuses_non_finite_weights(bad: float) -> None:
    """Bug: a NaN or infinite edge weight (exported by to_networkx from NaN attention) made
    draw_attention_graph fail with a bare StopIteration from matplotlib's arrow clipping."""
    ax = _figure_axes()
    G = to_networkx(EDGES, torch.tensor([0.2, bad, 1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"1 edges with a NaN or infinite weight, e.g. \(0, 2\)"):
        draw_attention_graph(G, ax=ax)
    if math.isnan(bad):  # the hinted way out: threshold drops NaN weights
        G = to_networkx(EDGES, torch.tensor([0.2, bad, 1.0], dtype=torch.float64), threshold=-math.inf)
        assert draw_attention_graph(G, ax=ax) is ax
        assert G.number_of_edges() == 2


def test_bug_draw_attention_graph_with_labels_must_be_a_bool() -> None:
    """Bug: draw_attention_graph(with_labels="no") drew the node labels (any truthy value did), and a numpy
    bool went through unchecked, while every other flag of the package refuses both."""
    ax = _figure_axes()
    G = to_networkx(EDGES)
    pos = {0: (0, 0), 1: (1, 0), 2: (0, 1)}
    for bad, shown in (("no", "str"), (np.bool_(False), "numpy.bool"), (0, "int")):
        with pytest.raises(TypeError, match=rf"with_labels must be a bool, got {shown}"):
            draw_attention_graph(G, ax=ax, pos=pos, with_labels=bad)
    assert draw_attention_graph(G, ax=ax, pos=pos, with_labels=False) is ax
    assert not ax.texts


def test_bug_to_networkx_refuses_weights_without_heads() -> None:
    """Bug: per-edge weights of shape (E, 0) (no heads) became NaN on every edge with head="mean" (the mean of
    nothing), silently."""
    with pytest.raises(ValueError, match=r"no heads \(H=0\).*\(3, 0\)"):
        to_networkx(EDGES, torch.zeros(3, 0))
    with pytest.raises(ValueError, match=r"no heads \(H=0\)"):
        to_networkx(EDGES, torch.zeros(3, 0), head="max")


def test_bug_pca_token_map_with_a_nan_pixel_keeps_the_other_pixels() -> None:
    """Bug: one NaN pixel made the min-max scaling of a panel NaN, so the whole panel was drawn as zeros
    (black); an inf pixel made the others 0 and itself NaN."""
    pytest.importorskip("matplotlib")
    m = torch.tensor([[0.0, float("nan")], [0.5, 1.0]]).expand(1, 3, 2, 2)
    fig = plot_pca_token_maps(torch.rand(1, 3, 4, 4), {"attention": m})
    shown = np.ma.filled(np.ma.asarray(fig.axes[1].images[0].get_array()).astype(float), np.nan)  # (2, 2, 3)
    np.testing.assert_allclose(shown[..., 0], [[0.0, np.nan], [0.5, 1.0]])
    m = torch.tensor([[0.0, float("inf")], [2.0, 4.0]])[None, None].expand(1, 3, 2, 2)
    with pytest.raises(ValueError, match=r"maps\['attention'\] must hold RGB values in \[0, 1\]"):
        plot_pca_token_maps(torch.rand(1, 3, 4, 4), {"attention": m})  # maps are drawn as given, not rescaled


def test_bug_plot_spectra_refuses_negative_and_complex_values_and_drops_inf() -> None:
    """Bug: plot_spectra dropped negative values silently with the zeros (s > 0), so [-4, 2, 1] was drawn as
    [1, 0.5] at ranks 1 and 2, every later rank shifted; an inf largest value normalised the spectrum to
    [nan, 0, 0] (nothing drawn); a complex spectrum kept its real part with only a warning."""
    pytest.importorskip("matplotlib")
    with pytest.raises(ValueError, match=r"spectra\['a'\] must hold non-negative singular values, got 1 negative "
                                         r"values \(min -4.0\)"):
        plot_spectra({"a": torch.tensor([-4.0, 2.0, 1.0])})
    with pytest.raises(TypeError, match=r"spectra\['a'\] must hold real singular values, got dtype torch.complex64"):
        plot_spectra({"a": torch.ones(2, dtype=torch.complex64)})
    ax = plot_spectra({"inf": torch.tensor([float("inf"), 4.0, 2.0]), "nan": torch.tensor([4.0, float("nan"), 0.0])})
    assert [line.get_ydata().tolist() for line in ax.lines] == [[1.0, 0.5], [1.0]]  # non-finite and zeros dropped


def test_bug_plot_metric_by_depth_refuses_strings_and_scalars() -> None:
    """Bug: plot_metric_by_depth({"a": "12"}) plotted the digits 1 and 2 as two layers; a float or 0-d tensor
    failed with "'float' object is not iterable" / "iteration over a 0-d tensor" without naming the setting."""
    pytest.importorskip("matplotlib")
    for bad, got in (("12", "str"), (1.0, "float"), (torch.tensor(1.0), r"shape \(\)"),
                     (torch.ones(2, 2), r"shape \(2, 2\)")):
        with pytest.raises(TypeError, match=rf"results\['a'\] must be a sequence of numbers, one per layer, got {got}"):
            plot_metric_by_depth({"a": bad}, "v")
    ax = plot_metric_by_depth({"a": np.array([1.0, 2.0]), "b": (1.0, None), "c": torch.tensor([3.0, 4.0])}, "v")
    assert [line.get_ydata().tolist()[0] for line in ax.lines] == [1.0, 1.0, 3.0]


# ------------------------------------------------------------------ references that hold (no fix needed)
def test_grid_matches_a_hand_built_reference_in_both_layouts() -> None:
    """Every metric, fractional radii, with and without self loops and a class token, against a loop reference."""
    for h, w in ((1, 1), (2, 3), (3, 4)):
        for radius in (0, 0.5, 1, 1.5, 2.9):
            for metric in ("chebyshev", "manhattan", "euclidean"):
                for self_loops in (True, False):
                    for cls in (True, False):
                        off, N = int(cls), h * w + int(cls)
                        ref = torch.zeros(N, N, dtype=torch.bool)
                        for i in range(h * w):
                            for j in range(h * w):
                                dy, dx = abs(i // w - j // w), abs(i % w - j % w)
                                d = {"chebyshev": max(dy, dx), "manhattan": dy + dx,
                                     "euclidean": math.hypot(dy, dx)}[metric]
                                ref[i + off, j + off] = d <= radius and (self_loops or i != j)
                        if cls:
                            ref[0, :], ref[:, 0] = True, True
                            ref[0, 0] = self_loops
                        kw = dict(metric=metric, self_loops=self_loops, cls_token=cls)
                        assert torch.equal(grid(h, w, radius, **kw).dense_allowed()[0], ref)
                        sp = grid(h, w, radius, layout="sparse", **kw)
                        assert sp.edge_index.shape[1] == int(ref.sum())  # no duplicate edges
                        assert torch.equal(to_dense_adj(sp.edge_index, max_num_nodes=N)[0].bool().t(), ref)


def test_knn_with_a_gapped_unsorted_batch_matches_brute_force() -> None:
    """Graph ids with a gap (graph 1 empty) and unsorted nodes: k nearest within each graph, in float64."""
    x = torch.randn(10, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    batch = torch.tensor([0, 0, 0, 2, 2, 2, 2, 0, 2, 0])
    g = knn(x, 2, batch=batch)
    want = set()
    for i in range(10):
        same = [j for j in range(10) if batch[j] == batch[i] and j != i]
        want |= {(j, i) for j in sorted(same, key=lambda j: float((x[i] - x[j]).norm()))[:2]}
    assert set(map(tuple, g.edge_index.t().tolist())) == want
    assert g.batch_size == 3


def test_from_pyg_batch_with_an_empty_graph_keeps_its_slot() -> None:
    """An empty graph in the middle of a Batch is a fully padded sequence of the dense layout."""
    d1 = Data(edge_index=torch.tensor([[0, 1], [1, 0]]), num_nodes=2)
    d0 = Data(edge_index=torch.zeros(2, 0, dtype=torch.long), num_nodes=0)
    dense = from_pyg(Batch.from_data_list([d1, d0, d1]), layout="dense")
    assert dense.key_padding_mask.tolist() == [[False, False], [True, True], [False, False]]
    assert dense.dense_allowed().int().tolist() == [[[0, 1], [1, 0]], [[0, 0], [0, 0]], [[0, 1], [1, 0]]]
