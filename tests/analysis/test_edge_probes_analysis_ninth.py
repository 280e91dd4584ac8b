"""Edge probes of the token-geometry metrics (ninth pass): scale invariance of NC2 and of the sparse Dirichlet energy."""

from __future__ import annotations

import torch

from diffusionformer.analysis.metrics import dirichlet_energy, neural_collapse


def test_bug_neural_collapse_angles_of_features_at_a_tiny_scale():
    """Bug: the centred class means were divided by ``norms.clamp_min(1e-30)``, so features of scale 1e-32 (norms below
    1e-30) gave "unit" vectors of norm ~1e-2: all cosines ~0, and a wrong equiangularity, max_angle and etf_distance
    (NC2 is about angles only and must not depend on the scale of the features)."""
    torch.manual_seed(0)
    H = torch.randn(12, 4, dtype=torch.float64)
    y = torch.arange(12) % 3
    ref = neural_collapse(H, y).as_dict()
    tiny = neural_collapse(H * 1e-32, y).as_dict()
    for name in ("equinorm", "equiangularity", "max_angle", "etf_distance", "nc1", "ncc_agreement"):
        assert abs(tiny[name] - ref[name]) < 1e-9 * max(1.0, abs(ref[name])), (name, tiny[name], ref[name])


def test_bug_sparse_dirichlet_energy_scales_each_graph_on_its_own():
    """Bug: the normalised sparse energy scaled all graphs by one power of two (that of the largest token of the batch),
    so a float32 graph of tokens ~1e-20 beside one of tokens ~1e3 had its squares underflow to 0 and an energy of 0,
    not its own scale-free value (the dense path, which scales each sequence, got it right)."""
    torch.manual_seed(0)
    X = torch.randn(2, 4, 3)
    X[0] *= 1e3
    X[1] *= 1e-20
    ring = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    edge_index = torch.cat([ring, ring + 4], dim=1)
    got = dirichlet_energy(X, edge_index=edge_index)
    X64 = X.double()
    for b in range(2):
        x = X64[b]
        ref = 0.5 * (x[ring[0]] - x[ring[1]]).pow(2).sum() / x.pow(2).sum()
        assert abs(float(got[b]) - float(ref)) < 1e-5 * float(ref), (b, got, ref)


def test_sparse_dirichlet_energy_of_an_edge_between_graphs_counts_for_its_target():
    """An edge joining two graphs of different scales counts for its target's graph, at the float64 reference value."""
    X = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0], [0.5, 0.5]], dtype=torch.float64)
    batch = torch.tensor([0, 0, 1, 1])
    edge_index = torch.tensor([[0, 2, 1], [3, 0, 0]])  # 0 -> 3 crosses into graph 1; 2 -> 0 into graph 0
    w = torch.tensor([0.5, 2.0, 1.0], dtype=torch.float64)
    raw = dirichlet_energy(X, edge_index=edge_index, edge_weight=w, batch=batch, normalized=False)
    norm = dirichlet_energy(X, edge_index=edge_index, edge_weight=w, batch=batch)
    e1 = 0.5 * 0.5 * (X[0] - X[3]).pow(2).sum()
    e0 = 0.5 * 2.0 * (X[2] - X[0]).pow(2).sum() + 0.5 * 1.0 * (X[1] - X[0]).pow(2).sum()
    torch.testing.assert_close(raw, torch.stack([e0, e1]))
    torch.testing.assert_close(norm, torch.stack([e0 / X[:2].pow(2).sum(), e1 / X[2:].pow(2).sum()]))
