"""Equivalence of our graph loaders with PyG's own, on the staged benchmark files (skipped when absent).

Probed: ``diffusionformer.data.planetoid`` (Cora, CiteSeer) against ``torch_geometric.datasets.Planetoid`` run
offline on a copy of the same raw files, and ``diffusionformer.data.tu`` (MUTAG, PROTEINS, ENZYMES, IMDB-BINARY)
against ``torch_geometric.datasets.TUDataset`` on a flattened copy of the same zips, plus an independent parse of
the TU text tables.

Found: no difference. Features, labels, edges (exactly, and as undirected sets), the public Planetoid masks,
graph counts, per-graph node features / labels / edges / edge attributes agree with PyG for both values of
``use_node_attr``. Documented differences, checked here:

* Planetoid features: PyG's ``Planetoid`` gives the raw binary bag of words; our loader row-normalises by default
  (``normalize_features=True``, equal to PyG's ``NormalizeFeatures`` on PyG's ``x``) and gives PyG's raw matrix
  with ``normalize_features=False``.
* IMDB-BINARY has no node features: PyG's ``x`` is ``None``; ours is the one-hot degree with the dataset's
  maximum degree (135, so 136 columns).
"""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from diffusionformer.data import load_dataset

pytest.importorskip("torch_geometric")

TU_NAMES = ["MUTAG", "PROTEINS", "ENZYMES", "IMDB-BINARY"]


def _undirected(edge_index: torch.Tensor) -> set[tuple[int, int]]:
    return {(min(a, b), max(a, b)) for a, b in edge_index.t().tolist()}


@pytest.fixture(scope="module")
def pyg_planetoid(real_root: Path, tmp_path_factory: pytest.TempPathFactory):
    """PyG's Planetoid, processed offline from a copy of the staged raw files."""
    from torch_geometric.datasets import Planetoid

    root = tmp_path_factory.mktemp("pyg_planetoid")
    out = {}
    for name in ("Cora", "CiteSeer"):
        shutil.copytree(real_root / "planetoid" / name / "raw", root / name / "raw")
        out[name] = Planetoid(str(root), name)[0]
    return out


@pytest.fixture(scope="module")
def tu_raw(real_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The staged TU zips unzipped (inner folder flattened) under a fresh root, as PyG lays them out."""
    root = tmp_path_factory.mktemp("pyg_tu")
    for name in TU_NAMES:
        raw = root / name / "raw"
        raw.mkdir(parents=True)
        with zipfile.ZipFile(real_root / "tudataset" / f"{name}.zip") as zf:
            for info in zf.infolist():
                if not info.is_dir():
                    (raw / info.filename.rstrip("/").split("/")[-1]).write_bytes(zf.read(info))
    return root


@pytest.mark.parametrize("name", ["Cora", "CiteSeer"])
def test_planetoid_matches_pyg(real_root: Path, pyg_planetoid, name: str):
    ref = pyg_planetoid[name]
    raw = load_dataset(name.lower(), root=real_root, normalize_features=False)
    norm = load_dataset(name.lower(), root=real_root)  # the default: row-normalised
    for ours in (raw, norm):
        d = ours.data
        assert d.num_nodes == ref.num_nodes and torch.equal(d.y, ref.y)
        assert torch.equal(d.edge_index, ref.edge_index)
        assert _undirected(d.edge_index) == _undirected(ref.edge_index)
        for mask in ("train_mask", "val_mask", "test_mask"):
            assert torch.equal(getattr(d, mask), getattr(ref, mask)), mask
        assert ours.num_classes == int(ref.y.max()) + 1 and ours.num_features == ref.num_features
    # PyG's Planetoid: raw binary bag of words; ours with normalize_features=False is the same matrix
    assert set(ref.x.unique().tolist()) <= {0.0, 1.0}
    assert raw.data.x.dtype == ref.x.dtype and torch.equal(raw.data.x, ref.x)
    assert raw.meta["features"] == "raw binary bag of words"
    # the default is PyG's NormalizeFeatures applied to PyG's x (rows of zeros, CiteSeer's isolated nodes, stay 0)
    from torch_geometric.transforms import NormalizeFeatures

    expected = NormalizeFeatures()(ref.clone()).x
    torch.testing.assert_close(norm.data.x, expected, rtol=0, atol=0)
    assert norm.meta["features"] == "row-normalised (sum 1)"
    sums = norm.data.x.double().sum(1)
    nonzero = ref.x.sum(1) > 0
    torch.testing.assert_close(sums[nonzero], torch.ones_like(sums[nonzero]))
    assert bool((sums[~nonzero] == 0).all())
    assert int((~nonzero).sum()) == (15 if name == "CiteSeer" else 0)  # CiteSeer's isolated test nodes
    # the public split sizes
    sizes = (140, 500, 1000) if name == "Cora" else (120, 500, 1000)
    assert tuple(norm.meta["sizes"].values()) == sizes


@pytest.mark.parametrize("name", TU_NAMES)
def test_tu_matches_pyg(real_root: Path, tu_raw: Path, name: str):
    from torch_geometric.datasets import TUDataset

    for use_node_attr in (False, True):
        ref = TUDataset(str(tu_raw), name, use_node_attr=use_node_attr)
        ours = load_dataset(name.lower(), root=real_root, use_node_attr=use_node_attr)
        ds = ours.dataset
        assert len(ds) == len(ref)
        assert torch.equal(ds.y.view(-1), ref.y.view(-1))
        assert ours.num_classes == ref.num_classes
        # the collated storage and its slices, whole (what every graph is cut from) ...
        assert set(ds.slices) == set(ref.slices)
        for key, value in ref.slices.items():
            assert torch.equal(ds.slices[key], value), key
        for key in ("x", "edge_index", "edge_attr", "y"):
            a, b = getattr(ref._data, key, None), getattr(ds._data, key, None)
            assert (a is None) == (b is None), key
            if a is not None:
                assert torch.equal(a, b), (key, use_node_attr)
        # ... and graphs as served (ours with its transform, if any), spread over the dataset
        for i in sorted({*range(0, len(ref), max(1, len(ref) // 40)), len(ref) - 1}):
            a, b = ref[i], ds[i]
            assert a.num_nodes == b.num_nodes, i
            assert torch.equal(a.edge_index, b.edge_index), i
            assert torch.equal(a.y, b.y), i
            if a.x is None:
                assert name == "IMDB-BINARY"
            else:
                assert torch.equal(a.x, b.x), (i, use_node_attr)
            assert (a.edge_attr is None) == (b.edge_attr is None), i
            if a.edge_attr is not None:
                assert torch.equal(a.edge_attr, b.edge_attr), i
        if ref.num_node_features:
            assert ours.num_features == ref.num_node_features
            assert ours.meta["node_features"] == "dataset features"


def _read_ints(path: Path) -> torch.Tensor:
    return torch.tensor([[int(v) for v in line.split(",")] for line in path.read_text().split("\n") if line.strip()])


@pytest.mark.parametrize("name", ["MUTAG", "ENZYMES"])
def test_tu_matches_the_raw_tables(real_root: Path, tu_raw: Path, name: str):
    """An independent parse of the text tables: per-graph node labels, undirected edge sets, graph labels."""
    raw = tu_raw / name / "raw"
    indicator = _read_ints(raw / f"{name}_graph_indicator.txt").view(-1) - 1
    node_labels = _read_ints(raw / f"{name}_node_labels.txt").view(-1)
    graph_labels = _read_ints(raw / f"{name}_graph_labels.txt").view(-1)
    edges = _read_ints(raw / f"{name}_A.txt") - 1
    ds = load_dataset(name.lower(), root=real_root).dataset
    G = int(indicator.max()) + 1
    assert len(ds) == G
    classes = graph_labels.unique()  # PyG maps the label values (MUTAG: -1, 1) to 0, 1, ... in sorted order
    starts = torch.cat([torch.zeros(1, dtype=torch.long), torch.bincount(indicator).cumsum(0)])
    for g in range(G):
        lo, hi = int(starts[g]), int(starts[g + 1])
        d = ds[g]
        assert d.num_nodes == hi - lo
        assert int(d.y) == int((classes == graph_labels[g]).nonzero())
        # features: the one-hot node label (offset by the smallest label), nothing else
        assert d.x.size(1) == int(node_labels.max() - node_labels.min()) + 1
        assert torch.equal(d.x.argmax(1), node_labels[lo:hi] - node_labels.min())
        assert torch.equal(d.x.sum(1), torch.ones(hi - lo))
        mine = edges[(edges[:, 0] >= lo) & (edges[:, 0] < hi)] - lo
        expected = {(min(a, b), max(a, b)) for a, b in mine.tolist() if a != b}
        assert _undirected(d.edge_index) == expected, g


def test_imdb_gets_one_hot_degree_where_pyg_has_no_features(real_root: Path, tu_raw: Path):
    from torch_geometric.datasets import TUDataset

    ref = TUDataset(str(tu_raw), "IMDB-BINARY")
    assert ref.num_node_features == 0 and ref[0].x is None  # PyG: no node features at all
    ours = load_dataset("imdb-binary", root=real_root)
    ds = ours.dataset
    # independent degrees from the raw edge table (each edge is listed in both directions; no self-loops)
    edges = _read_ints(tu_raw / "IMDB-BINARY" / "raw" / "IMDB-BINARY_A.txt") - 1
    edges = edges[edges[:, 0] != edges[:, 1]].unique(dim=0)
    indicator = _read_ints(tu_raw / "IMDB-BINARY" / "raw" / "IMDB-BINARY_graph_indicator.txt").view(-1)
    deg = torch.bincount(edges[:, 0], minlength=indicator.numel())
    max_degree = int(deg.max())
    assert ours.meta["node_features"] == f"one-hot degree (max_degree={max_degree})"
    assert ours.num_features == max_degree + 1 == ds.num_node_features
    starts = torch.cat([torch.zeros(1, dtype=torch.long), torch.bincount(indicator - 1).cumsum(0)])
    for g in (0, 1, len(ds) // 2, len(ds) - 1):
        x = ds[g].x
        lo, hi = int(starts[g]), int(starts[g + 1])
        assert x.shape == (hi - lo, max_degree + 1)
        assert torch.equal(x.argmax(1), deg[lo:hi]) and torch.equal(x.sum(1), torch.ones(hi - lo))
    # "constant": one feature 1.0 per node
    const = load_dataset("imdb-binary", root=real_root, node_features="constant").dataset[0]
    assert const.x.shape == (ds[0].num_nodes, 1) and bool((const.x == 1).all())


def test_tu_degree_option_appends_to_mutag_labels(real_root: Path):
    plain = load_dataset("mutag", root=real_root).dataset
    deg = load_dataset("mutag", root=real_root, node_features="degree")
    assert deg.meta["node_features"] == "dataset features + one-hot degree (max_degree=4)"
    d, p = deg.dataset[3], plain[3]
    assert d.x.size(1) == p.x.size(1) + 5 and torch.equal(d.x[:, :7], p.x)
    from torch_geometric.utils import degree

    assert torch.equal(d.x[:, 7:].argmax(1), degree(d.edge_index[0], d.num_nodes, dtype=torch.long))
