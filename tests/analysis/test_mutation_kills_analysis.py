"""Tests written in a mutation-testing audit of the token-geometry analysis (capture, spectral, report, plots, metrics).

Each test kills a mutant of the library code that the rest of the suite let through (the
docstring of each test names it) and checks the code against an independent reference:
hand-worked values, explicit float64 matrices and sums, torch.linalg (svd, eigvals,
pinv), numpy, or the documented contract (shapes, masks, error messages). CPU only,
deterministic (seeded generators).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import Tensor

from diffusionformer.analysis import (
    LayerCapture,
    LayerRecorder,
    capture_dataset,
    layer_reports,
    pad_by_batch,
)
from diffusionformer.analysis import report as R
from diffusionformer.analysis.spectral import pca_token_rgb
from diffusionformer.models import (
    DiffusionGPT,
    DiffusionGraphTransformer,
    DiffusionViT,
    GPTConfig,
    GraphTransformerConfig,
    ViTConfig,
)


# ---------------------------------------------------------------------------- capture: layers, padding, labels
@pytest.fixture
def vit() -> DiffusionViT:
    torch.manual_seed(0)
    return DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, dim=8, depth=3, num_heads=2))


def _graph_model() -> DiffusionGraphTransformer:
    torch.manual_seed(0)
    return DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, task="graph", dim=8,
                                                            depth=2, num_heads=2))


def _graphs(sizes: list[int], seed: int = 0):  # type: ignore[no-untyped-def]
    """A PyG batch of rings (both directions) of the given sizes; graph ``i`` has label ``i % 2``."""
    from torch_geometric.data import Batch, Data

    g = torch.Generator().manual_seed(seed)
    graphs = []
    for i, n in enumerate(sizes):
        ring = torch.arange(n)
        ei = torch.stack([ring, (ring + 1) % n]) if n > 1 else torch.zeros(2, 0, dtype=torch.long)
        graphs.append(Data(x=torch.randn(n, 3, generator=g), edge_index=torch.cat([ei, ei.flip(0)], dim=1),
                           y=torch.tensor([i % 2])))
    return Batch.from_data_list(graphs)


def test_the_most_negative_layer_index_is_the_embeddings(vit: DiffusionViT) -> None:
    """kills: _check_layers accepting only -L <= layer (so -(L+1), the embeddings counted from the end, is refused)"""
    L = len(vit.blocks)  # 3: residual-stream indices 0..3, negative -4..-1
    assert LayerRecorder(vit, layers=[-(L + 1)]).layers == [0]
    assert LayerRecorder(vit, layers=[-1, -(L + 1)]).layers == [0, L]
    with pytest.raises(ValueError, match=r"layers must hold residual-stream indices in \[0, 3\]"):
        LayerRecorder(vit, layers=[-(L + 2)])


def test_a_layer_named_twice_is_captured_once(vit: DiffusionViT) -> None:
    """kills: _check_layers returning the layers as given (duplicates recorded twice, the batch doubled)"""
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    vit.eval()
    with torch.no_grad():
        _, ref = vit.forward_tokens(x, return_intermediates=True)
    cap = capture_dataset(vit, [x], layers=[2, 0, 2], attentions=True)
    assert cap.layers == [0, 2] and cap.num_examples == 2
    assert torch.equal(cap.states[0], ref.embeddings) and torch.equal(cap.states[2], ref.hidden_states[1])
    assert sorted(cap.attentions) == [1] and cap.attentions[1].shape == (2, 2, 5, 5)


def test_pad_by_batch_keeps_trailing_empty_graphs() -> None:
    """kills: pad_by_batch ignoring num_graphs (G read from batch.max() + 1, empty trailing graphs lost)"""
    x = torch.tensor([[1.0], [2.0], [3.0]])
    padded, mask = pad_by_batch(x, torch.tensor([0, 0, 1]), num_graphs=3)
    assert padded[..., 0].tolist() == [[1.0, 2.0], [3.0, 0.0], [0.0, 0.0]]
    assert mask.tolist() == [[True, True], [True, False], [False, False]]


def test_single_node_graphs_keep_one_label_per_graph() -> None:
    """kills: _per_node dropping `num_nodes != num_graphs` (graph labels of one-node graphs read as node labels)"""
    b = _graphs([1, 1, 1])
    cap = capture_dataset(_graph_model(), [(b, b.y)])
    assert cap.labels.shape == (3,) and cap.labels.tolist() == [0, 1, 0]


def test_graphs_of_equal_size_have_no_mask() -> None:
    """kills: _Collector.finish keeping an all-True mask (the contract: mask is None when nothing is padded)"""
    b = _graphs([4, 4, 4])
    cap = capture_dataset(_graph_model(), [(b, b.y)])
    assert cap.mask is None and cap.states[1].shape == (3, 4, 8)
    assert cap.lengths().tolist() == [4, 4, 4]


def test_sparse_attention_edges_of_a_later_batch_index_its_own_nodes() -> None:
    """kills: _Collector.add appending a later batch's edges without the offset of the nodes kept before"""
    first, second = _graphs([3, 4], seed=1), _graphs([2, 5], seed=2)
    cap = capture_dataset(_graph_model(), [first, second], attentions=True, max_attention_examples=4)
    n = 3 + 4 + 2 + 5
    assert int(cap.mask.sum()) == n
    for block, w in cap.attentions.items():
        ei = cap.attention_edges[block]
        assert int(ei.min()) >= 0 and int(ei.max()) == n - 1
        # every real node (with its self loop) receives attention weights summing to 1, per head
        sums = torch.zeros(n, 2, dtype=torch.float64).index_add_(0, ei[1], w.double())
        torch.testing.assert_close(sums, torch.ones(n, 2, dtype=torch.float64), rtol=0, atol=1e-5)


def test_capture_leaves_an_eval_model_in_eval_mode(vit: DiffusionViT) -> None:
    """kills: capture_dataset restoring training mode unconditionally (model.train(True)), not the mode it found"""
    vit.eval()
    capture_dataset(vit, [torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(3))])
    assert not vit.training and not any(m.training for m in vit.modules())


def test_drop_prefix_cuts_per_token_labels() -> None:
    """kills: LayerCapture.drop_prefix leaving per-token labels (B, T) uncut"""
    torch.manual_seed(0)
    gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=6, n_layer=1, n_head=2, n_embd=8))
    idx = torch.randint(0, 11, (3, 6), generator=torch.Generator().manual_seed(2))
    targets = torch.roll(idx, -1, dims=1)
    cap = capture_dataset(gpt, [(idx, targets)])
    cut = cap.drop_prefix(2)
    assert cut.states[1].shape == (3, 4, 8)
    assert torch.equal(cut.labels, targets[:, 2:])


# ---------------------------------------------------------------------------- spectral
def test_pca_token_rgb_fixes_each_component_sign_by_its_largest_entry() -> None:
    """kills: pca_token_rgb without the sign fix (channels follow whatever eigenvector sign eigh returns)"""
    B, h, w, D = 2, 3, 4, 5
    T = h * w
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        basis, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))
        coef = torch.randn(B * T, 3, generator=g, dtype=torch.float64)
        q, _ = torch.linalg.qr(coef - coef.mean(dim=0))  # orthonormal, centred columns
        scales = torch.tensor([5.0, 3.0, 1.0], dtype=torch.float64)
        Z = (q * scales) @ basis[:3]  # centred tokens; the principal directions are basis[0], basis[1], basis[2]
        X = (Z + torch.arange(D, dtype=torch.float64)).reshape(B, T, D)  # an offset the map must remove
        rgb = pca_token_rgb(X, (h, w))
        for c in range(3):
            v = basis[c] * torch.sign(basis[c][basis[c].abs().argmax()])  # the documented sign rule
            p = (Z @ v).numpy()
            expected = (p - p.min()) / (p.max() - p.min())  # min-max over the whole batch
            np.testing.assert_allclose(rgb[:, c].reshape(-1).numpy(), expected, rtol=0, atol=1e-9)


# ---------------------------------------------------------------------------- report
def _nc1_reference(H: Tensor, y: Tensor) -> float:
    """NC1 = tr(S_W S_B^+) / C (Papyan, Han & Donoho 2020), written out in float64 with torch.linalg.pinv."""
    H = H.double()
    classes = y.unique()
    C, n = len(classes), H.shape[0]
    mu = H.mean(dim=0)
    means = torch.stack([H[y == c].mean(dim=0) for c in classes])
    S_W = sum(torch.outer(h - means[(classes == c).nonzero()[0, 0]], h - means[(classes == c).nonzero()[0, 0]])
              for h, c in zip(H, y)) / n
    S_B = sum(torch.outer(m - mu, m - mu) for m in means) / C
    return float(torch.trace(S_W @ torch.linalg.pinv(S_B)) / C)


def test_power_law_alpha_fits_only_the_ranks_above_the_relative_cutoff() -> None:
    """kills: _spectrum_summary fitting every positive singular value (r = #(s > 0)) instead of those above 1e-6 s_1"""
    g = torch.Generator().manual_seed(0)
    T, D = 6, 5
    coef = torch.randn(T, 4, generator=g, dtype=torch.float64)
    q, _ = torch.linalg.qr(coef - coef.mean(dim=0))  # orthonormal columns, centred over the sequence
    basis, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))
    s = np.array([1.0, 0.5, 0.2, 1e-9])  # a rank-3 spectrum plus a value below the 1e-6 cut-off
    X = (q * torch.from_numpy(s)) @ basis[:4] + 3.0
    report = layer_reports(LayerCapture({0: X.unsqueeze(0)}))[0]
    np.testing.assert_allclose(report.singular_values[:4].double().numpy(), s, rtol=1e-6, atol=1e-12)
    slope = np.polyfit(np.log([1.0, 2.0, 3.0]), np.log(s[:3] ** 2), 1)[0]  # least squares over ranks 1..3
    assert report.metrics["power_law_alpha"] == pytest.approx(-slope, rel=1e-9)


def test_report_spectrum_is_of_tokens_centred_per_sequence() -> None:
    """kills: LayerView.singular_values centring the pooled tokens by the global mean instead of each sequence's mean"""
    g = torch.Generator().manual_seed(1)
    X = torch.randn(3, 4, 3, generator=g, dtype=torch.float64) + torch.tensor([[[0.0]], [[5.0]], [[-3.0]]])
    report = layer_reports(LayerCapture({0: X}))[0]
    x = X.numpy()
    centred = (x - x.mean(axis=1, keepdims=True)).reshape(-1, 3)
    expected = np.linalg.svd(centred, compute_uv=False)
    np.testing.assert_allclose(report.singular_values.double().numpy(), expected, rtol=1e-6)
    p = expected / expected.sum()
    assert report.metrics["effective_rank"] == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-9)


def test_layer_reports_reject_labels_and_predictions_of_the_wrong_length() -> None:
    """kills: layer_reports without the shape check of capture.labels (B,); and without that of predictions (B,)"""
    X = torch.randn(4, 3, 2, generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match=r"one label per sequence \(4,\), got \(5,\)"):
        layer_reports(LayerCapture({0: X}, labels=torch.tensor([0, 1, 0, 1, 0])))
    with pytest.raises(ValueError, match=r"predictions must have shape \(4,\)"):
        layer_reports(LayerCapture({0: X}, labels=torch.tensor([0, 1, 0, 1])), predictions=torch.tensor([0, 1, 0]))
    # also where no metric would read them (no labels, or a single class): still refused, not ignored
    for labels in (None, torch.tensor([1, 1, 1, 1])):
        with pytest.raises(ValueError, match=r"predictions must have shape \(4,\), got torch.Size\(\[3\]\)"):
            layer_reports(LayerCapture({0: X}, labels=labels), predictions=torch.tensor([0, 1, 0]))


def test_token_nc1_drops_tokens_without_a_label() -> None:
    """kills: _token_labelled keeping the tokens labelled -100 (padding/no target counted as a class)"""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    y = torch.tensor([[0, 0, 1, -100, 2], [1, 0, -100, -100, 2]])
    m = layer_reports(LayerCapture({0: X}, labels=y))[0].metrics
    keep = y.reshape(-1) != -100
    H, labels = X.reshape(-1, 3)[keep], y.reshape(-1)[keep]
    assert m["token_nc1"] == pytest.approx(_nc1_reference(H, labels), rel=1e-9)


def test_nc4_agreement_is_with_the_given_predictions() -> None:
    """kills: the report's neural collapse ignoring `predictions` (NC4 becomes the NCC accuracy on the labels)"""
    centres = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    X = centres[y].unsqueeze(1).repeat(1, 3, 1)  # every sequence mean is its class centre: NCC == y
    X[:, 0] += 0.1
    X[:, 1] -= 0.1
    cap = LayerCapture({0: X}, labels=y)
    predictions = torch.tensor([0, 1, 2, 0, 2, 0])  # disagrees with the NCC on 2 of 6
    assert layer_reports(cap, predictions=predictions)[0].metrics["nc4_agreement"] == pytest.approx(4 / 6)
    assert layer_reports(cap)[0].metrics["nc4_agreement"] == pytest.approx(1.0)


def test_unregistering_an_unknown_metric_lists_the_registered_ones() -> None:
    """kills: unregister_metric's KeyError losing the list of registered keys (no hint for a typo)"""
    with pytest.raises(KeyError, match=r"no metric 'nc_1' \(did you mean 'nc1'\?\); registered: \[.*'nc1'.*'within_variance'"):
        R.unregister_metric("nc_1")
    with pytest.raises(KeyError, match=r"no metric 'zzz'; registered"):  # no hint when nothing is close
        R.unregister_metric("zzz")


# ---------------------------------------------------------------------------- plots
def test_a_constant_input_image_is_drawn_black_not_nan() -> None:
    """kills: plots._to_image dividing by (max - min) when the image is constant (a NaN panel)"""
    pytest.importorskip("matplotlib")
    from diffusionformer.analysis import plot_pca_token_maps

    images = torch.full((1, 1, 4, 4), 0.7)
    rgb = torch.rand(1, 3, 2, 2, generator=torch.Generator().manual_seed(0))
    fig = plot_pca_token_maps(images, {"m": rgb})
    shown = np.asarray(fig.axes[0].images[0].get_array())
    assert shown.shape == (4, 4) and np.array_equal(shown, np.zeros((4, 4)))
    expected = rgb[0].permute(1, 2, 0).double()  # a map is drawn as it is (values in [0, 1]), not scaled again
    np.testing.assert_allclose(np.asarray(fig.axes[1].images[0].get_array()), expected.numpy(), atol=1e-12)


# ---------------------------------------------------------------------------- metrics
def test_sparse_dirichlet_energy_counts_every_edge_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """kills: _sparse_dirichlet slicing each chunk one edge short (edges at chunk ends dropped)"""
    from diffusionformer.analysis import dirichlet_energy
    from diffusionformer.analysis import metrics as M

    g = torch.Generator().manual_seed(1)
    N, D, E = 7, 2, 20
    X = torch.randn(N, D, generator=g, dtype=torch.float64)
    edge_index = torch.randint(0, N, (2, E), generator=g)
    w = torch.rand(E, generator=g, dtype=torch.float64)
    batch = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    keep = batch[edge_index[0]] == batch[edge_index[1]]  # edges within a graph
    edge_index, w = edge_index[:, keep], w[keep]
    expected = [0.0, 0.0]
    for (j, i), we in zip(edge_index.T.tolist(), w.tolist()):
        expected[int(batch[i])] += 0.5 * we * float(((X[j] - X[i]) ** 2).sum())
    monkeypatch.setattr(M, "_EDGE_CHUNK", 3 * D)  # chunks of 3 edges
    got = dirichlet_energy(X, edge_index=edge_index, edge_weight=w, batch=batch, normalized=False)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)


def test_nc1_uses_at_most_C_minus_1_between_class_directions() -> None:
    """kills: _nc1 inverting every singular value above rtol * s_max, without the cap at C - 1 (rtol=0 blows up)"""
    from diffusionformer.analysis import neural_collapse

    g = torch.Generator().manual_seed(5)
    H = torch.randn(12, 4, generator=g, dtype=torch.float64)
    y = torch.arange(12) % 3
    nc1 = neural_collapse(H, y, rtol=0.0).nc1
    assert nc1 == pytest.approx(_nc1_reference(H, y), rel=1e-9)


def test_linear_probe_keeps_one_test_row_at_high_train_fraction() -> None:
    """kills: linear_probe_accuracy without the n_train <= N - 1 cap (an empty test split: NaN accuracy)"""
    from diffusionformer.analysis import linear_probe_accuracy

    x = torch.arange(10, dtype=torch.float64).unsqueeze(-1)
    y = (torch.arange(10) >= 5).long()  # separable by a threshold
    assert linear_probe_accuracy(x, y, train_fraction=0.99) == 1.0


def test_linear_probe_with_constant_features_predicts_the_majority_class() -> None:
    """kills: linear_probe_accuracy dropping the intercept y_mean from the scores"""
    from diffusionformer.analysis import linear_probe_accuracy

    x = torch.ones(8, 3)  # no information: the fitted intercept (class frequencies) decides
    y = torch.tensor([0, 1, 1, 1, 1, 0, 1, 1])
    train = torch.tensor([True] * 6 + [False] * 2)  # training: two 0s and four 1s; test: two 1s
    assert linear_probe_accuracy(x, y, train_mask=train) == 1.0


# ---------------------------------------------------------------------------- defects found in the audit (fixed)
def test_layer_reports_reject_token_labels_that_do_not_match_the_tokens() -> None:
    """defect (fixed): layer_reports read per-token labels of the wrong shape: (B, T') died in an IndexError of a
    boolean mask, (B, T, 1) was silently ignored (every label metric missing); both are now a ValueError"""
    X = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0))
    for labels in (torch.zeros(2, 5, dtype=torch.long), torch.tensor([[0, 1, 0], [1, 0, 1]]).unsqueeze(-1)):
        with pytest.raises(ValueError, match=r"one label per sequence \(2,\) or per token \(2, 3\), got \(2, "):
            layer_reports(LayerCapture({0: X}, labels=labels))
    good = layer_reports(LayerCapture({0: X}, labels=torch.tensor([[0, 1, 0], [1, 0, 1]])))[0].metrics
    assert "token_nc1" in good  # (B, T) labels are measured as before


def test_pad_by_batch_rejects_graph_ids_outside_num_graphs() -> None:
    """defect (fixed): pad_by_batch with graph ids outside [0, num_graphs) died in an IndexError (or a bincount
    RuntimeError for negative ids); now a ValueError naming the range and the ids"""
    x = torch.ones(3, 1)
    cases = ((torch.tensor([0, 0, 1]), 1), (torch.tensor([0, 0, 1]), 0), (torch.tensor([-1, 0, 1]), None))
    for batch, num_graphs in cases:
        with pytest.raises(ValueError, match=r"batch must hold graph ids in \[0, \d\) \(num_graphs=.*\), got ids in"):
            pad_by_batch(x, batch, num_graphs)


# ---------------------------------------------------------------------------- integer arguments
def test_integer_arguments_refuse_bools_and_too_few_points() -> None:
    """kills: ``True`` accepted as k = 1 / start = 1, and a frequency-response plot of one point
    (or a float count) drawn instead of refused"""
    from diffusionformer.analysis.spectral import energy_top_k, power_law_exponent

    s = torch.arange(8, 0, -1, dtype=torch.float64)
    assert energy_top_k(s, 1).item() == pytest.approx(64 / float((s**2).sum()))
    with pytest.raises(ValueError, match="k must be an integer"):
        energy_top_k(s, True)
    with pytest.raises(ValueError, match="need integers 1 <= start < stop"):
        power_law_exponent(s, start=True)
    pytest.importorskip("matplotlib")
    from diffusionformer.analysis import plot_frequency_response

    coeffs = {"attention": torch.tensor([0.0, 1.0])}
    for bad in (1, 0, 2.5, True):
        with pytest.raises(ValueError, match="num_points must be an integer >= 2"):
            plot_frequency_response(coeffs, num_points=bad)
    assert len(plot_frequency_response(coeffs, num_points=2).lines[0].get_xdata()) == 2
