"""Second pass of edge probes on the synthetic datasets (CSBM, associative recall): no bug found; these pin the
documented model where the first pass did not look."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.data import load_dataset
from diffusionformer.data.csbm import csbm_graph
from diffusionformer.data.recall import make_assoc_recall


@pytest.mark.parametrize("N, d, M", [(5, 1.0, 2), (7, 1.0, 4), (11, 3.0, 16)])
def test_csbm_edge_count_is_round_half_even_and_edges_symmetric(N, d, M):
    """M = round(N d / 2) with Python's round (2.5 -> 2, 3.5 -> 4); each edge listed in both directions once."""
    _, ei, y = csbm_graph(N, 2, d, 0.5, 2, 1.0, torch.Generator().manual_seed(1))
    assert ei.shape == (2, 2 * M) and M == round(N * d / 2)
    pairs = set(map(tuple, ei.T.tolist()))
    assert len(pairs) == 2 * M and all((b, a) in pairs for a, b in pairs) and all(a != b for a, b in pairs)
    assert sorted(y.bincount().tolist()) == [N // 2, N - N // 2]


def test_csbm_balanced_classes_give_every_class_the_mean_degree():
    """Balanced classes: every class's mean degree is d (the edge count is fixed, so the overall mean is exactly d);
    the per-class mean is within 4 binomial standard errors of d over 10 graphs."""
    N, C, d, h = 300, 3, 6.0, 0.2
    g = torch.Generator().manual_seed(5)
    deg = torch.zeros(C, dtype=torch.float64)
    for _ in range(10):
        _, ei, y = csbm_graph(N, C, d, h, 3, 1.0, g)
        assert ei.shape[1] == N * d  # 2M
        deg += torch.bincount(y[ei[0]], minlength=C).double() / (N // C)
    deg /= 10
    se = math.sqrt(d / (10 * N // C))  # Poisson-like spread of a class's mean degree
    assert float((deg - d).abs().max()) < 4 * se


def test_recall_loader_splits_are_a_partition_of_one_generation():
    """The three splits are consecutive slices of one seeded generation: the same seed and sizes reproduce each."""
    kw = dict(num_examples=50, num_pairs=3, vocab_size=12, num_queries=2, seed=4)
    data = load_dataset("assoc-recall", **kw)
    x, y = make_assoc_recall(50, 3, 12, torch.Generator().manual_seed(4), num_queries=2)
    assert torch.equal(torch.cat([data.x_train, data.x_val, data.x_test]), x)
    assert torch.equal(torch.cat([data.y_train, data.y_val, data.y_test]), y)
