"""CSBM generator: homophily, degree, graph hygiene and feature signal."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.data import csbm_graph, edge_homophily, load_dataset


def _graph(seed: int = 0, **kw):
    opts = dict(num_nodes=600, num_classes=3, avg_degree=12.0, homophily=0.5, feature_dim=8, mu=1.0)
    opts.update(kw)
    return csbm_graph(**opts, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("h", [0.1, 0.5, 0.9])
def test_measured_homophily_matches_request(h):
    _, edge_index, y = _graph(homophily=h)
    # M = 3600 undirected edges: the binomial std is below 0.009, so 0.04 is > 4 sigma
    assert edge_homophily(edge_index, y) == pytest.approx(h, abs=0.04)


@pytest.mark.parametrize("h", [0.0, 1.0])
def test_extreme_homophily_is_exact(h):
    _, edge_index, y = _graph(homophily=h)
    assert edge_homophily(edge_index, y) == h


def test_edges_are_undirected_unique_without_self_loops():
    _, edge_index, y = _graph(homophily=0.3)
    N = 600
    src, dst = edge_index
    assert edge_index.dtype == torch.int64
    assert not bool((src == dst).any())
    keys = src * N + dst
    assert keys.unique().numel() == keys.numel()
    assert torch.equal(keys.sort().values, (dst * N + src).sort().values)  # symmetric
    assert bool((keys[1:] > keys[:-1]).all())  # sorted by (source, target)
    assert edge_index.shape[1] == 2 * round(600 * 12.0 / 2)  # average degree exactly d
    assert y.bincount().tolist() == [200, 200, 200]


def test_mu_zero_gives_label_independent_features():
    x, _, y = _graph(mu=0.0, num_nodes=3000, feature_dim=4)
    means = torch.stack([x[y == c].mean(0) for c in range(3)])
    # each class mean is an average of 1000 unit Gaussians: coordinate std ~0.032
    assert float((means[0] - means[1]).norm()) < 0.25
    assert float((means - x.mean(0)).abs().max()) < 0.15
    assert float(x.std()) == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("mu", [1.0, 3.0])
def test_class_means_are_mu_apart(mu):
    x, _, y = _graph(mu=mu, num_nodes=3000, feature_dim=4)
    means = torch.stack([x[y == c].mean(0) for c in range(3)])
    for a, b in [(0, 1), (0, 2), (1, 2)]:
        assert float((means[a] - means[b]).norm()) == pytest.approx(mu, abs=0.25)


def test_same_seed_same_graph_other_seed_other_graph():
    a = _graph(seed=0)
    b = _graph(seed=0)
    c = _graph(seed=1)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(a[1], c[1])


def test_load_csbm_node_data_and_split():
    data = load_dataset("csbm", num_nodes=200, avg_degree=6.0, homophily=0.8, seed=4)
    d = data.data
    assert data.kind == "node" and data.num_classes == 2 and data.num_features == 16
    assert d.x.shape == (200, 16) and d.x.dtype == torch.float32 and d.y.dtype == torch.int64
    assert [int(m.sum()) for m in (d.train_mask, d.val_mask, d.test_mask)] == [120, 40, 40]
    assert (d.train_mask.long() + d.val_mask.long() + d.test_mask.long()).eq(1).all()
    assert data.meta["measured_edge_homophily"] == edge_homophily(d.edge_index, d.y)
    again = load_dataset("csbm", num_nodes=200, avg_degree=6.0, homophily=0.8, seed=4).data
    assert torch.equal(d.edge_index, again.edge_index) and torch.equal(d.x, again.x)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(homophily=1.5), "homophily must be in"),
        (dict(num_classes=1), "num_classes must be >= 2"),
        (dict(feature_dim=2), "feature_dim must be >= num_classes"),
        (dict(mu=-1.0), "mu must be >= 0"),
        (dict(avg_degree=0.0), "avg_degree must be > 0"),
        (dict(num_nodes=5), "num_nodes must be >="),
        (dict(num_nodes=12, avg_degree=11.0, homophily=1.0), "distinct pairs exist"),
    ],
)
def test_bad_options_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        _graph(**kw)


def test_numpy_seed_and_sizes_from_a_sweep_load_the_same_data():
    """Bug: ``load_dataset("csbm", seed=np.int64(2))`` (a sweep grid's seed) was refused by the
    shared split generator ("seed must be an int, got int64"). numpy ints now give the data and
    splits Python ints give; bools stay refused."""
    import numpy as np

    from diffusionformer.data.splits import generator

    got = load_dataset("csbm", num_nodes=np.int64(50), seed=np.int64(2)).data
    want = load_dataset("csbm", num_nodes=50, seed=2).data
    other = load_dataset("csbm", num_nodes=50, seed=3).data
    assert got.num_nodes == 50 and not torch.equal(want.x, other.x)  # the seed matters
    for key in ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(got, key), getattr(want, key)), key
    assert torch.equal(torch.randperm(9, generator=generator(np.uint32(5))),
                       torch.randperm(9, generator=torch.Generator().manual_seed(5)))
    with pytest.raises(TypeError, match="seed must be an int, got bool"):
        generator(np.bool_(True))


@pytest.mark.parametrize(
    "kw, error, match",
    [
        (dict(mu=float("nan")), ValueError, "mu must be finite, got nan"),
        (dict(avg_degree=float("inf")), ValueError, "avg_degree must be finite, got inf"),
        (dict(avg_degree=float("nan")), ValueError, "avg_degree must be finite, got nan"),
        (dict(num_nodes=12.5), TypeError, "num_nodes: expected an int, got float 12.5"),
        (dict(feature_dim=4.0), TypeError, "feature_dim: expected an int, got float 4.0"),
        (dict(num_classes=True), TypeError, "num_classes: expected an int, got bool True"),
        (dict(homophily="0.5"), TypeError, "homophily: expected a float, got str"),
    ],
)
def test_non_finite_and_non_integer_options_are_named(kw, error, match):
    """Bug: ``csbm_graph(mu=nan)`` returned all-NaN features without a word; ``avg_degree=inf`` died in
    ``round`` ("cannot convert float infinity to integer"), ``num_nodes=12.5`` deep in ``torch.randperm``
    ("received an invalid combination of arguments"). Each is now refused naming the option."""
    with pytest.raises(error, match=match):
        _graph(**kw)
