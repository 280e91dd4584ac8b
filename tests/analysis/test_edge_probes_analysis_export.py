"""Edge-case probes of the analysis package (capture, metrics, spectral, report, plots) and of graph export/interop.

Each ``Bug:`` test pins a defect a user met (the docstring says what they saw); ``Pins:`` tests fix legal edge
cases that already work, checked against independent references (float64 by hand, numpy).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from diffusionformer.analysis import (
    LayerCapture,
    capture_dataset,
    dirichlet_energy,
    eigenvalues_of,
    layer_reports,
    linear_probe_accuracy,
    mean_pairwise_cosine,
    pad_by_batch,
)
from diffusionformer.models import DiffusionViT, ViTConfig


def _vit(heads: str | None = None) -> DiffusionViT:
    torch.manual_seed(0)
    return DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, dim=8, depth=2, num_heads=2, heads=heads))


def _no_hooks(model: torch.nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


# ---------------------------------------------------------------------------------------------- capture


def test_capture_dataset_restores_the_training_mode_of_every_submodule() -> None:
    """Bug: capture_dataset restored only the top-level mode with model.train(was_training), so a model in train
    mode with a frozen block in eval (blocks[0].eval()) came back with that block in train mode (dropout and
    batch statistics switched on behind the user's back)."""
    vit = _vit()
    vit.train()
    vit.blocks[0].eval()
    before = {name: m.training for name, m in vit.named_modules()}
    capture_dataset(vit, [torch.randn(3, 1, 8, 8)], max_examples=3)
    assert {name: m.training for name, m in vit.named_modules()} == before
    assert vit.training and not vit.blocks[0].training and vit.blocks[1].training

    def failing():  # the same on error
        yield torch.randn(2, 1, 8, 8)
        raise RuntimeError("broken loader")

    with pytest.raises(RuntimeError, match="broken loader"):
        capture_dataset(vit, failing(), max_examples=10)
    assert {name: m.training for name, m in vit.named_modules()} == before
    assert _no_hooks(vit)


@pytest.mark.parametrize("heads", ["neutreno", "differential", "value-residual"])
def test_capture_of_rival_operators_leaves_the_pass_unchanged_and_matches_a_manual_recomputation(heads: str) -> None:
    """Pins: with rivals that share a LayerState (first layer's values, depth), recomputing the attention in the
    hooks neither changes the recorded residual stream nor the model's state, and each block's captured P equals
    the attention recomputed by hand, block by block, from the model's own intermediates."""
    from diffusionformer.ops.rivals import LayerState

    vit = _vit(heads).eval()
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with_attn = capture_dataset(vit, [x], attentions=True)
    without = capture_dataset(vit, [x])
    for layer in without.layers:
        assert torch.equal(with_attn.states[layer], without.states[layer])
    with torch.no_grad():
        _, inter = vit.forward_tokens(x, return_intermediates=True)
        z, state = inter.embeddings, LayerState()
        for i, block in enumerate(vit.blocks):
            _, ref = block.attn(block.norm1(z), state=copy.copy(state), return_intermediates=True)
            torch.testing.assert_close(with_attn.attentions[i], ref.attn_weights, rtol=0, atol=0)
            z = block(z, state=state)
            torch.testing.assert_close(with_attn.states[i + 1], z)


def test_pad_by_batch_refuses_a_bool_batch_and_a_float_num_graphs_by_name() -> None:
    """Bug: pad_by_batch(x, bool batch) died in torch.bincount with 'NotImplementedError: "bincount_cpu" not
    implemented for 'Bool'', num_graphs=2.0 with 'bincount(): argument 'minlength' must be int', and a float batch
    was told 'must be an integer tensor of shape (3,), got torch.Size([3])' (the shape it had; no dtype named)."""
    x = torch.randn(3, 2)
    with pytest.raises(ValueError, match=r"batch must be an integer tensor of shape \(3,\), got torch.bool"):
        pad_by_batch(x, torch.tensor([False, False, True]))
    with pytest.raises(ValueError, match=r"got torch.float32 of shape \(3,\)"):
        pad_by_batch(x, torch.tensor([0.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match=r"num_graphs must be a non-negative int or None, got 2.0"):
        pad_by_batch(x, torch.tensor([0, 0, 1]), 2.0)  # type: ignore[arg-type]
    padded, mask = pad_by_batch(x, torch.tensor([0, 0, 1]), np.int64(3))  # numpy ints still fine
    assert mask.tolist() == [[True, True], [True, False], [False, False]]
    assert torch.equal(padded[0], x[:2]) and torch.equal(padded[1, 0], x[2])


# ---------------------------------------------------------------------------------------------- metrics


def test_mean_pairwise_cosine_refuses_eps_that_is_not_positive() -> None:
    """Bug: mean_pairwise_cosine(X, eps=0.0) with a zero token returned tensor([nan]) (0 / 0), and a negative eps
    returned a number; the documented rule 'a zero token has cosine 0' needs eps > 0."""
    X = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]]])
    for eps in (0.0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="eps must be a positive finite float"):
            mean_pairwise_cosine(X, eps=eps)
    # the default: the zero token has cosine 0 with both others; the pair (1, 2) has cos 45 deg; 6 ordered pairs
    expected = 2 * (2 ** -0.5) / 6
    assert mean_pairwise_cosine(X).item() == pytest.approx(expected, rel=1e-6)


def test_sparse_dirichlet_energy_checks_num_graphs_against_batch() -> None:
    """Bug: dirichlet_energy(X, edge_index=..., batch=..., num_graphs=...) with num_graphs below batch.max() + 1,
    num_graphs=0 or a negative graph id raised 'IndexError: index out of range in self' from index_add_;
    num_graphs=2.0 a TypeError from new_zeros; and num_graphs without batch was silently ignored (one value)."""
    X = torch.randn(6, 3)
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    batch = torch.tensor([0, 0, 0, 1, 1, 2])
    with pytest.raises(ValueError, match=r"batch values must lie in \[0, num_graphs=2\), got range \[0, 2\]"):
        dirichlet_energy(X, edge_index=ei, batch=batch, num_graphs=2)
    with pytest.raises(ValueError, match="num_graphs must be a positive int, got 0"):
        dirichlet_energy(X, edge_index=ei, batch=batch, num_graphs=0)
    with pytest.raises(ValueError, match="num_graphs must be a positive int, got 3.0"):
        dirichlet_energy(X, edge_index=ei, batch=batch, num_graphs=3.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"batch values must lie in \[0, num_graphs=2\), got range \[-1, 1\]"):
        dirichlet_energy(X, edge_index=ei, batch=torch.tensor([0, 0, 0, 1, 1, -1]))
    with pytest.raises(ValueError, match="pass batch too, got num_graphs=3"):
        dirichlet_energy(X, edge_index=ei, num_graphs=3)
    with pytest.raises(ValueError, match=r"only used with edge_index \(and num_graphs, got 5\)"):
        dirichlet_energy(torch.randn(2, 3, 2), num_graphs=5)
    # a numpy num_graphs larger than needed: an empty trailing graph has energy 0 (normalised: 0, no NaN)
    out = dirichlet_energy(X.double(), edge_index=ei, batch=batch, num_graphs=np.int64(4), normalized=False)
    Xd = X.double()
    ref = [0.5 * sum(float((Xd[s] - Xd[d]).pow(2).sum()) for s, d in ei.t().tolist() if batch[d] == g)
           for g in range(4)]
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12)
    assert dirichlet_energy(X, edge_index=ei, batch=batch, num_graphs=4)[3].item() == 0.0


def test_sparse_dirichlet_energy_refuses_a_bool_edge_index() -> None:
    """Bug: a bool edge_index (2, E) was taken for node ids and used as a boolean mask inside, dying with
    'RuntimeError: The size of tensor a (4) must match the size of tensor b (2)' (or, when the counts agreed,
    returning the energy of the wrong pairs)."""
    mask = torch.tensor([[True, False, True, False], [False, True, True, False]])
    with pytest.raises(TypeError, match="edge_index must hold integer node ids, got dtype torch.bool"):
        dirichlet_energy(torch.randn(4, 2), edge_index=mask)


def test_linear_probe_accuracy_and_layer_reports_take_numpy_int_seeds() -> None:
    """Bug: linear_probe_accuracy(..., seed=np.int64(1)) and layer_reports(..., probe_seed=np.int64(1)) (a seed from
    a sweep grid) raised 'TypeError: an integer is required' from torch.Generator.manual_seed; a float seed a
    RuntimeError 'manual_seed expected a long', and ridge='a' a bare "'>' not supported" TypeError."""
    g = torch.Generator().manual_seed(0)
    feats, labels = torch.randn(12, 3, generator=g), torch.arange(12) % 2
    assert linear_probe_accuracy(feats, labels, seed=np.int64(1)) == linear_probe_accuracy(feats, labels, seed=1)
    with pytest.raises(TypeError, match=r"seed must be an int \(numpy ints too\), got float \(1.5\)"):
        linear_probe_accuracy(feats, labels, seed=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"ridge must be > 0 \(a real number\), got 'a'"):
        linear_probe_accuracy(feats, labels, ridge="a")  # type: ignore[arg-type]
    cap = LayerCapture({0: torch.randn(8, 3, 4, generator=g)}, labels=torch.arange(8) % 2)
    a = layer_reports(cap, probe_seed=np.int64(1))[0].metrics
    assert a == layer_reports(cap, probe_seed=1)[0].metrics
    with pytest.raises(TypeError, match=r"probe_seed must be an int, got float \(1.5\)"):
        layer_reports(cap, probe_seed=1.5)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- report


def test_layer_reports_of_a_capture_without_layers_is_a_value_error() -> None:
    """Bug: layer_reports(LayerCapture({})) died with 'IndexError: list index out of range' in capture.lengths()."""
    with pytest.raises(ValueError, match="capture.states must hold at least one layer"):
        layer_reports(LayerCapture({}))


def test_layer_reports_names_numpy_predictions_as_not_a_tensor() -> None:
    """Bug: predictions as a numpy array of the right length were refused with the self-contradictory
    'predictions must have shape (2,), got (2,)'."""
    cap = LayerCapture({0: torch.randn(2, 3, 4)}, labels=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"predictions must have shape \(2,\), got ndarray, not a tensor"):
        layer_reports(cap, predictions=np.array([0, 1]))


# ---------------------------------------------------------------------------------------------- plots


def test_plot_metric_by_depth_draws_an_undefined_value_as_a_gap() -> None:
    """Bug: a metric that layer_reports leaves None at some layer (e.g. mean_cosine at T = 1) crashed
    plot_metric_by_depth with "TypeError: float() argument must be ... not 'NoneType'"."""
    pytest.importorskip("matplotlib")
    from diffusionformer.analysis import plot_metric_by_depth

    ax = plot_metric_by_depth({"attention": [1.0, None, 0.25]}, ylabel="v", logy=True)
    y = ax.lines[0].get_ydata()
    assert y[0] == 1.0 and np.isnan(y[1]) and y[2] == 0.25
    assert ax.get_yscale() == "log"


def test_plot_pca_token_maps_checks_max_images_is_an_int() -> None:
    """Bug: max_images=True died with 'TypeError: an integer is required' inside matplotlib, and max_images=2.0
    was passed on as a float row count."""
    pytest.importorskip("matplotlib")
    from diffusionformer.analysis import plot_pca_token_maps

    images, maps = torch.rand(2, 3, 8, 8), {"a": torch.rand(2, 3, 2, 2)}
    for bad in (True, 2.0):
        with pytest.raises(TypeError, match="max_images must be an int"):
            plot_pca_token_maps(images, maps, max_images=bad)  # type: ignore[arg-type]
    assert len(plot_pca_token_maps(images, maps, max_images=np.int64(1)).axes) == 2


# ---------------------------------------------------------------------------------------------- export


def test_to_networkx_reduces_integer_and_bool_weights_over_heads() -> None:
    """Bug: to_networkx(edge_index, integer weights) with the default head='mean' died with 'RuntimeError: mean():
    could not infer output dtype ... Got: Long' (bool weights: 'Got: Bool'), though head=None took them."""
    pytest.importorskip("networkx")
    from diffusionformer.graph import to_networkx

    ei = torch.tensor([[0, 1, 2, 0], [2, 2, 0, 1]])
    counts = torch.tensor([[1, 2], [2, 2], [3, 6], [4, 1]])
    got = sorted(to_networkx(ei, counts).edges(data="weight"))
    assert got == [(0, 1, 2.5), (0, 2, 1.5), (1, 2, 2.0), (2, 0, 4.5)]  # hand means per edge
    assert sorted(to_networkx(ei, counts, head="max").edges(data="weight"))[0] == (0, 1, 4.0)
    kept = to_networkx(ei, torch.tensor([True, False, True, True]), threshold=0.5)
    assert sorted(kept.edges()) == [(0, 1), (0, 2), (2, 0)]


def test_to_networkx_refuses_complex_weights_and_a_nan_threshold() -> None:
    """Bug: complex weights were exported with their imaginary part dropped (only a ComplexWarning), and
    threshold=float('nan') silently returned a graph without edges."""
    pytest.importorskip("networkx")
    from diffusionformer.graph import to_networkx

    ei = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(TypeError, match="weights must be real, got dtype torch.complex64"):
        to_networkx(ei, torch.ones(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="threshold must not be NaN"):
        to_networkx(ei, torch.ones(2), threshold=float("nan"))


def test_draw_attention_graph_names_a_numpy_pos() -> None:
    """Bug: pos as an (N, 2) numpy array was read with `node in array` (a value test) and refused with the
    misleading 'pos has no position for nodes [0, 1, 2]'."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("networkx")
    from matplotlib.figure import Figure

    from diffusionformer.graph import draw_attention_graph, to_networkx

    G = to_networkx(torch.tensor([[0, 1, 2], [1, 2, 0]]), torch.tensor([0.1, 0.2, 0.3]))
    ax = Figure().add_subplot()
    with pytest.raises(TypeError, match=r"pos must be a dict node -> \(x, y\) or an \(N, 2\) tensor, got ndarray"):
        draw_attention_graph(G, ax, pos=np.zeros((3, 2)))
    assert draw_attention_graph(G, ax, pos=torch.rand(3, 2)) is ax


# ---------------------------------------------------------------------------------------------- spectral


def test_eigenvalues_of_a_disconnected_non_symmetric_graph_with_a_sink_agree_with_numpy() -> None:
    """Pins: a non-symmetric P with two components, one of them ending in a node without out-weight (a zero row),
    and a directed 3-cycle: eigenvalues equal numpy's, ordered by decreasing real part then imaginary part."""
    P = torch.tensor([[0.5, 0.5, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0.0]])
    cycle = torch.tensor([[0, 1, 0], [0, 0, 1], [1, 0, 0.0]])
    for M in (P, cycle):
        ref = sorted(np.linalg.eigvals(M.double().numpy()), key=lambda z: (-round(z.real, 9), -round(z.imag, 9)))
        np.testing.assert_allclose(eigenvalues_of(M).numpy(), np.array(ref), atol=1e-12)
