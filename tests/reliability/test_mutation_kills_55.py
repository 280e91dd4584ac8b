"""Mutation audit (sitting 55): tests that kill hand-made mutants of graph/export.py, graph/core.py,
graph/builders.py, graph/knn.py, analysis/report.py, data/csbm.py, experiments/gpu.py and data/registry.py that the
earlier tests left alive; each docstring names the mutant it kills.

161 mutants (export.py 30, core.py 32, builders.py 24, knn.py 27, report.py 30, csbm.py 18; gpu.py and registry.py
not reached): 144 killed by earlier tests, 7 survivors killed here (export 1, core 1, knn 3, report 2), 7 equivalent
(core ``_resolve_batch_size`` returning ``batch_size or self.batch_size``: the two agree or it raised; builders and
knn block sizes, search radii and size classes that change only the work done; report's ``layer < 1`` guard, whose
block -1 is never a key, and the all-kept fast path of ``_sequences``), 3 left alive (report: the probe's
"2 classes in training" fallback, the empty-token guard of ``variance_ratio``; csbm: the float64 uniform past 2**16
nodes). No survivor showed a bug."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.graph.export import to_networkx


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64])
def test_kills_to_networkx_accepts_bool_or_complex_edge_index(dtype):
    """export.py: the integer-dtype check reduced to ``is_floating_point()`` let a bool edge_index (a mask, not
    node ids) export as edges between nodes 0 and 1, and a complex one drop its imaginary part."""
    pytest.importorskip("networkx")
    ei = torch.tensor([[0, 1], [1, 0]]).to(dtype)
    with pytest.raises(TypeError, match="integer tensor"):
        to_networkx(ei)


def test_kills_edge_index_pairs_hint_only_for_e_by_2():
    """core.py ``_edge_index_shape_error``: the ``(E, 2)`` hint (``edge_index.t()``) given for every 2-D shape
    told a caller with a (3, E) tensor to transpose it, which cannot help."""
    from diffusionformer.graph import AttentionGraph

    with pytest.raises(ValueError, match=r"got \(3, 5\)$"):
        AttentionGraph.sparse(torch.zeros(3, 5, dtype=torch.long), 4)
    with pytest.raises(ValueError, match=r"edge_index\.t\(\)"):
        AttentionGraph.sparse(torch.zeros(5, 2, dtype=torch.long), 4)


@pytest.mark.parametrize("dtype, scale", [(torch.float32, 1.4e-45), (torch.float64, 4.9e-324),
                                          (torch.float64, 1.7e307)])
def test_kills_knn_subnormal_and_near_max_points(dtype, scale):
    """knn.py ``_pow2_scale``: without the clamp of the exponent (or with a limit one past it), ``2^-e`` of
    subnormal features overflowed to inf and every distance became NaN or inf; with ``frexp(2 * amax)`` a
    coordinate near the float maximum overflowed to inf and was left unscaled, so its squares overflowed. The
    neighbours of 0, 1, 3, 10 on a line are fixed whatever the scale."""
    from diffusionformer.graph import knn

    x = torch.tensor([[0.0], [1.0], [3.0], [10.0]], dtype=dtype) * scale
    assert x[1, 0] > 0 and torch.isfinite(x).all()
    assert knn(x, 1).edge_index.tolist() == [[1, 0, 1, 2], [0, 1, 2, 3]]


def test_kills_knn_refuses_batch_with_3d_x():
    """knn.py: with the ``batch``-for-3-D-``x`` check dropped, a batch vector given with ``(B, N, D)`` points was
    silently ignored."""
    from diffusionformer.graph import knn

    with pytest.raises(ValueError, match="batch is for 2-D x"):
        knn(torch.randn(2, 3, 2), 1, batch=torch.zeros(6, dtype=torch.long))


def test_kills_register_metric_two_decorators_of_one_key():
    """report.py ``register_metric``: without the check when the decorator is applied, two decorators made for one
    key before either was applied let the second silently replace the first."""
    from diffusionformer.analysis import register_metric, unregister_metric

    key = "probe55_twice"
    first, second = register_metric(key, group="smoothing"), register_metric(key, group="smoothing")
    first(lambda v: 1.0)
    try:
        with pytest.raises(ValueError, match="already registered"):
            second(lambda v: 2.0)
    finally:
        unregister_metric(key)


def test_kills_layer_reports_layers_of_different_lengths():
    """report.py ``_check_capture_shapes``: comparing only ``B`` (``shape[:1]``) let layers with different numbers
    of tokens ``T`` through, to fail or mismatch deep inside the metrics."""
    from diffusionformer.analysis import LayerCapture, layer_reports

    cap = LayerCapture({0: torch.randn(2, 3, 4), 1: torch.randn(2, 5, 4)})
    with pytest.raises(ValueError, match="every layer must hold the same sequences"):
        layer_reports(cap)
