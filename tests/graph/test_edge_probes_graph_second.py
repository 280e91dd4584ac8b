"""Second round of edge-case probes of the graph package (interop, export) and the analysis plots."""

from __future__ import annotations

import math

import matplotlib
import networkx as nx
import numpy as np
import pytest
import torch
from torch_geometric.data import Data, HeteroData

from diffusionformer.analysis import plot_metric_by_depth, plot_pca_token_maps, plot_spectra
from diffusionformer.graph import AttentionGraph, draw_attention_graph, from_edge_index, from_pyg, to_networkx

matplotlib.use("Agg")


# ---------------------------------------------------------------- interop: PyG inputs of another kind


def test_bug_from_pyg_heterodata_is_a_clear_error() -> None:
    """Bug: a HeteroData (one edge_index per edge type) was refused with only "got HeteroData", no hint
    how to get a single graph from it (to_homogeneous, or one edge type through from_edge_index)."""
    data = HeteroData()
    data["paper"].x = torch.randn(3, 4)
    data["paper", "cites", "paper"].edge_index = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(TypeError, match=r"HeteroData.*to_homogeneous\(\).*from_edge_index"):
        from_pyg(data)
    g = from_pyg(data.to_homogeneous())  # the suggested fix works
    assert g.num_nodes == 3


def test_bug_from_pyg_adj_t_layout_is_named() -> None:
    """Bug: a Data in the ToSparseTensor layout (adj_t[target, source], no edge_index) failed with
    "data has no edge_index", silent about the adj_t it does hold and how to convert it."""
    from torch_geometric.transforms import ToSparseTensor
    from torch_geometric.utils import to_edge_index

    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    data = ToSparseTensor()(Data(edge_index=ei, num_nodes=3))
    with pytest.raises(ValueError, match=r"adj_t.*to_edge_index"):
        from_pyg(data)
    data.edge_index = to_edge_index(data.adj_t)[0].flip(0)  # the suggested conversion restores the edges
    got = from_pyg(data, self_loops=False).edge_index
    assert sorted(map(tuple, got.T.tolist())) == sorted(map(tuple, ei.T.tolist()))


def _sparse_adjacency() -> torch.Tensor:
    return torch.tensor([[0, 1, 0], [0, 0, 1], [1, 0, 0]]).to_sparse()


@pytest.mark.parametrize("call", [
    lambda a: from_edge_index(a, 3),
    lambda a: AttentionGraph.sparse(a, 3),
    lambda a: to_networkx(a, num_nodes=3),
], ids=["from_edge_index", "AttentionGraph", "to_networkx"])
def test_bug_sparse_adjacency_as_edge_index_is_named(call) -> None:
    """Bug: a torch.sparse adjacency matrix passed as edge_index failed deep inside ("sparse tensors do
    not have strides" / a NotImplementedError of an index op) instead of saying how to get an edge_index."""
    with pytest.raises(TypeError, match=r"edge_index must be a dense \(strided\) tensor.*to_edge_index"):
        call(_sparse_adjacency())


def test_bug_sparse_mask_is_named() -> None:
    """Bug: a torch.sparse attn_mask or key_padding_mask failed deep inside an index op or the kernel
    instead of asking for .to_dense()."""
    mask = torch.eye(3, dtype=torch.bool).to_sparse()
    with pytest.raises(TypeError, match=r"attn_mask must be a dense \(strided\).*to_dense"):
        AttentionGraph.dense(3, attn_mask=mask)
    with pytest.raises(TypeError, match=r"key_padding_mask must be a dense \(strided\).*to_dense"):
        AttentionGraph.dense(3, key_padding_mask=torch.zeros(1, 3, dtype=torch.bool).to_sparse())


# ---------------------------------------------------------------- export


def test_bug_to_networkx_zero_heads_is_an_error() -> None:
    """Bug: per-edge weights with no heads (E, 0) exported every edge with weight NaN (mean over nothing)."""
    ei = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match=r"no heads \(H=0\).*\(2, 0\)"):
        to_networkx(ei, torch.empty(2, 0, dtype=torch.float64))


def test_bug_to_networkx_sparse_weights_are_named() -> None:
    """Bug: torch.sparse dense-layout weights (B, H, N, N) failed deep inside an index op."""
    w = torch.rand(1, 1, 3, 3).to_sparse()
    with pytest.raises(TypeError, match=r"weights must be a dense \(strided\).*to_dense"):
        to_networkx(AttentionGraph.dense(3), w)


def test_bug_draw_attention_graph_nan_weight_is_named() -> None:
    """Bug: an edge of weight NaN (a fully masked row of attention) failed inside matplotlib's arrow
    drawing with a bare StopIteration."""
    G = to_networkx(torch.tensor([[0, 1], [1, 0]]), torch.tensor([0.5, float("nan")], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"1 edges with a NaN or infinite weight.*threshold"):
        draw_attention_graph(G)
    G = to_networkx(torch.tensor([[0, 1], [1, 0]]), torch.tensor([0.5, float("nan")], dtype=torch.float64),
                    threshold=0.0)  # the suggested fix: NaN fails "> threshold"
    assert draw_attention_graph(G) is not None


def test_bug_draw_attention_graph_refuses_string_with_labels() -> None:
    """Bug: with_labels="no" (truthy) drew the node labels; flags are checked everywhere else."""
    G = nx.DiGraph([(0, 1)])
    with pytest.raises(TypeError, match="with_labels"):
        draw_attention_graph(G, with_labels="no")
    with pytest.raises(TypeError, match="numpy.bool"):
        draw_attention_graph(G, with_labels=np.bool_(False))


# ---------------------------------------------------------------- analysis plots


def test_bug_plot_pca_token_maps_nan_pixel_keeps_the_image() -> None:
    """Bug: one NaN pixel made the min-max scale NaN, so the whole input panel was drawn blank."""
    img = torch.arange(16, dtype=torch.float64).reshape(1, 1, 4, 4).clone()
    img[0, 0, 0, 0] = float("nan")
    fig = plot_pca_token_maps(img, {"m": torch.rand(1, 3, 2, 2)})
    shown = np.asarray(fig.axes[0].images[0].get_array(), dtype=np.float64)
    want = (np.arange(16.0) - 1.0) / 14.0  # scaled by the finite pixels 1..15
    assert math.isnan(shown.ravel()[0])
    np.testing.assert_allclose(shown.ravel()[1:], want[1:], atol=1e-12)


def test_bug_plot_pca_token_maps_inf_pixel_keeps_the_image() -> None:
    """Bug: one +inf pixel made every other pixel 0 (and itself NaN) after the min-max scale."""
    img = torch.arange(16, dtype=torch.float64).reshape(1, 4, 4).clone()
    img[0, 3, 3] = float("inf")
    fig = plot_pca_token_maps(img, {"m": torch.rand(1, 3, 2, 2)})
    shown = np.asarray(fig.axes[0].images[0].get_array(), dtype=np.float64).ravel()
    np.testing.assert_allclose(shown[:15], np.arange(15.0) / 14.0, atol=1e-12)
    assert shown[15] == 1.0


@pytest.mark.parametrize("values, got", [("12", "str"), (0.5, "float"), (torch.ones(2, 3), r"shape \(2, 3\)")])
def test_bug_plot_metric_by_depth_refuses_non_sequences(values, got: str) -> None:
    """Bug: a string "12" plotted its digits as two layers; a scalar failed with "'float' object is not
    iterable"; a (2, 3) tensor with "only one element tensors can be converted"."""
    with pytest.raises(TypeError, match=rf"results\['a'\] must be a sequence of numbers.*got {got}"):
        plot_metric_by_depth({"a": values}, ylabel="v")


def test_plot_metric_by_depth_still_takes_arrays_and_tensors() -> None:
    ax = plot_metric_by_depth({"t": torch.tensor([1.0, 2.0]), "n": np.array([3.0, None], dtype=object)}, "v")
    assert ax.lines[0].get_ydata().tolist() == [1.0, 2.0]
    assert ax.lines[1].get_ydata().tolist()[0] == 3.0


def test_bug_plot_spectra_refuses_negative_values() -> None:
    """Bug: negative "singular values" were dropped silently (with the zeros), shifting the rank of every later
    value: [4, -2, 1] drew 1 at rank 2. (NaN and inf are dropped on purpose: a diverged run, see
    tests/train/test_mutation_kills_plots_loggers_second_pass.py; an inf s_1 no longer blanks the line.)"""
    with pytest.raises(ValueError, match=r"spectra\['a'\] must hold non-negative singular values, got 1 negative"):
        plot_spectra({"a": torch.tensor([4.0, -2.0, 1.0])})
    ax = plot_spectra({"a": torch.tensor([float("inf"), 4.0, 2.0])})
    assert ax.lines[0].get_ydata().tolist() == [1.0, 0.5]


def test_bug_plot_spectra_refuses_complex_values() -> None:
    """Bug: complex values (e.g. eigenvalues_of a non-symmetric P) were cast to their real part with only
    a ComplexWarning."""
    with pytest.raises(TypeError, match=r"spectra\['a'\] must hold real singular values.*complex"):
        plot_spectra({"a": torch.tensor([2.0 + 1.0j, 1.0 + 0.0j])})


# ---------------------------------------------------------------- analysis spectral: float32 range


@pytest.mark.parametrize("scale", [1e20, 1e-25], ids=["huge", "tiny"])
def test_bug_spectrum_summaries_are_scale_invariant_in_float32(scale: float) -> None:
    """Bug: stable_rank, energy_top_k and power_law_exponent squared float32 singular values first, so a
    spectrum above 1e19 gave NaN (inf / inf) and one below 1e-23 (tokens near collapse) gave 0 for the
    ranks ("all-zero spectrum") and NaN for the exponent, though all three are scale-invariant."""
    from diffusionformer.analysis import energy_top_k, power_law_exponent, stable_rank

    base = np.array([4.0, 2.0, 1.0, 0.5])
    s = torch.tensor(base * scale, dtype=torch.float32)
    b2 = base ** 2
    want_alpha = -np.polyfit(np.log(np.arange(1.0, 5.0)), np.log(b2), 1)[0]
    assert stable_rank(s).item() == pytest.approx(b2.sum() / b2.max(), rel=1e-5)
    assert energy_top_k(s, 2).item() == pytest.approx(b2[:2].sum() / b2.sum(), rel=1e-5)
    assert power_law_exponent(s).item() == pytest.approx(want_alpha, rel=1e-4)
    assert stable_rank(s).dtype == torch.float32


# ---------------------------------------------------------------- knn


def test_bug_knn_cosine_nearly_parallel_points_match_float64() -> None:
    """Bug: the cosine distance 1 - u.u rounded to 0 in float32 for angles below ~3e-4 rad, so nearly
    parallel points all tied and knn picked a wrong neighbour for 19 of 20 nodes."""
    from diffusionformer.graph import knn

    t = torch.rand(20, generator=torch.Generator().manual_seed(0)) * 1e-3
    x = torch.stack([torch.ones(20), t], dim=1)
    e = knn(x, 2, metric="cosine").edge_index
    xd = x.double().numpy()
    u = xd / np.linalg.norm(xd, axis=1, keepdims=True)
    d = np.abs(np.arctan2(u[:, 1], u[:, 0])[:, None] - np.arctan2(u[:, 1], u[:, 0])[None, :])  # angle, same order
    np.fill_diagonal(d, np.inf)
    want = np.sort(d, axis=1)[:, :2]
    got = np.sort(d[e[1].numpy(), e[0].numpy()].reshape(20, 2), axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-3)


def test_knn_cosine_zero_vector_is_orthogonal_to_all() -> None:
    """A zero vector keeps cos = 0 with every point (distance 1), like an orthogonal one."""
    from diffusionformer.graph import knn

    x = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0], [-1.0, 0.01]])
    # node 0: cos with the zero vector 0 ties with [0, 1]: topk picks either, but never [-1, 0.01] (cos ~ -1)
    assert knn(x, 2, metric="cosine").edge_index[0, :2].sort().values.tolist() == [1, 2]


@pytest.mark.parametrize("call", [
    lambda e: from_edge_index(e, 4),
    lambda e: AttentionGraph.sparse(e, 4),
    lambda e: from_pyg(Data(edge_index=e, num_nodes=4)),
    lambda e: to_networkx(e, num_nodes=4),
], ids=["from_edge_index", "AttentionGraph", "from_pyg", "to_networkx"])
def test_bug_edge_index_as_pairs_gets_a_transpose_hint(call) -> None:
    """Bug: an edge list of (source, target) pairs, shape (E, 2), was refused with only "must have shape
    (2, E), got (3, 2)", without saying that edge_index.t() is the fix."""
    pairs = torch.tensor([[0, 1], [1, 2], [2, 3]])
    with pytest.raises(ValueError, match=r"got \(3, 2\): a list of \(source, target\) pairs.*edge_index\.t\(\)"):
        call(pairs)
    call(pairs.t())  # the suggested fix works
