"""Edge probes of the segment reductions (ops/scatter.py), the CSR softmax (ops/csr.py).

References are explicit float64 computations built by hand (per-target softmax over in-edges, numpy.maximum.at)
and PyG's ``torch_geometric.utils.softmax`` where it is installed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from diffusionformer.ops.csr import EdgeLayout, csr_edge_softmax
from diffusionformer.ops.scatter import scatter_max, scatter_sum, segment_softmax

NAN = float("nan")


def _dense_segment_softmax(src: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Softmax per target over its in-edges, float64, one segment at a time (torch.softmax per segment: NaN stays)."""
    out = np.zeros_like(src, dtype=np.float64)
    for i in np.unique(index):
        sel = index == i
        seg = torch.from_numpy(src[sel].astype(np.float64))
        finite_any = torch.isfinite(seg).any(0) | torch.isnan(seg).any(0)
        w = torch.softmax(seg, 0)
        out[sel] = torch.where(finite_any, w, torch.zeros_like(w)).numpy()  # all -inf column: zero weights
    return out


def test_bug_segment_softmax_nan_score_leaves_other_edges_unnormalised():
    """Bug: a NaN score made segment_softmax give its neighbours exp(s) unnormalised (weight e > 1), not NaN."""
    src = torch.tensor([NAN, 1.0, 2.0], dtype=torch.float64)
    index = torch.tensor([0, 0, 1])
    w = segment_softmax(src, index, 2)
    # PyG / torch.softmax over the segment: a NaN score makes the whole segment NaN; other segments untouched
    assert torch.isnan(w[:2]).all(), w
    assert w[2].item() == 1.0
    assert not bool((w[~torch.isnan(w)] > 1).any())


def test_bug_csr_edge_softmax_nan_score_leaves_other_edges_unnormalised():
    """Bug: a NaN score made csr_edge_softmax give its neighbours exp(s) unnormalised (weight e > 1), not NaN."""
    layout = EdgeLayout(torch.tensor([[0, 1, 2], [0, 0, 1]]), 3)
    w = csr_edge_softmax(torch.tensor([[NAN, 1.0, 2.0], [0.0, 0.0, 5.0]]), layout)
    assert torch.isnan(w[0, :2]).all(), w
    assert w[0, 2].item() == 1.0
    torch.testing.assert_close(w[1], torch.tensor([0.5, 0.5, 1.0]))


def test_pins_segment_softmax_nan_matches_pyg():
    """NaN / all -inf segments, 2-D scores, unsorted int32 index with duplicates and empty targets: as PyG."""
    pyg_utils = pytest.importorskip("torch_geometric.utils")
    src = torch.tensor([[NAN, 0.0], [1.0, -math.inf], [2.0, -math.inf], [3.5, 3.0], [0.5, 1.0], [4.0, 4.0]],
                       dtype=torch.float64)
    index = torch.tensor([2, 2, 0, 4, 0, 4], dtype=torch.int32)
    got = segment_softmax(src, index, 6)
    ref = pyg_utils.softmax(src, index.long(), num_nodes=6)
    torch.testing.assert_close(got, ref, equal_nan=True)
    torch.testing.assert_close(got, torch.from_numpy(_dense_segment_softmax(src.numpy(), index.numpy())),
                               equal_nan=True)


def test_pins_scatter_max_matches_numpy_maximum_at():
    """scatter_max against numpy.maximum.at: NaN propagates, all -inf stays -inf, empty buckets 0, 2-D transposed src."""
    src = torch.tensor([[1.0, NAN, -math.inf, 2.0, 7.0], [-math.inf, 3.0, -math.inf, 5.0, -1.0]]).t()  # (5, 2)
    index = torch.tensor([3, 0, 1, 0, 3], dtype=torch.int32)
    ref = np.full((5, 2), -np.inf)
    np.maximum.at(ref, index.numpy(), src.numpy())
    ref[np.bincount(index.numpy(), minlength=5) == 0] = 0.0
    torch.testing.assert_close(scatter_max(src, index, 5), torch.from_numpy(ref).float(), equal_nan=True)
    summed = np.zeros((5, 2))
    np.add.at(summed, index.numpy(), np.nan_to_num(src.numpy(), nan=0.0, neginf=0.0))
    clean = torch.nan_to_num(src, nan=0.0, neginf=0.0)
    torch.testing.assert_close(scatter_sum(clean.expand(2, 5, 2)[1], index, 5), torch.from_numpy(summed).float())


def test_bug_dense_attention_reference_keeps_a_nan_row_nan():
    """Bug: the float64 reference softmax read a row holding a NaN score as all zeros (``where(z > 0, ...)``: NaN > 0
    is false), so a test comparing a NaN-producing kernel against it could pass; a fully masked row stays 0."""
    from diffusionformer.ops.reference import dense_attention_reference

    q = torch.tensor([[[1.0, float("nan")], [0.0, 1.0], [1.0, 0.0]]], dtype=torch.float64)
    k = torch.ones(1, 3, 2, dtype=torch.float64)
    allowed = torch.tensor([[True, True, True], [True, True, False], [False, False, False]])
    P = dense_attention_reference(q, k, allowed=allowed)
    want = torch.softmax(((q @ k.transpose(-2, -1)) / 2**0.5).masked_fill(~allowed, float("-inf")), dim=-1)
    want[0, 2] = 0.0  # a row without allowed keys: zero weights (the documented convention)
    assert torch.isnan(P[0, 0]).all()
    torch.testing.assert_close(P[0, 1:], want[0, 1:], rtol=1e-12, atol=1e-15)
