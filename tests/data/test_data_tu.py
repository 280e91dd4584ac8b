"""TU datasets from tiny generated zips in the official layout."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.data import ChecksumError, CorruptDataError, GraphSetData, load_dataset


@pytest.fixture()
def tu_root(tmp_path, tmp_path_factory, monkeypatch, writers):
    monkeypatch.setenv("DIFFUSIONFORMER_CACHE", str(tmp_path_factory.mktemp("tu_cache")))
    writers.write_tu_zip(tmp_path / "tudataset" / "MUTAG.zip", "MUTAG", node_labels=True)
    imdb = tmp_path / "tudataset" / "IMDB-BINARY.zip"
    writers.write_tu_zip(imdb, "IMDB-BINARY", node_labels=False)
    return tmp_path


def test_tu_with_node_labels(tu_root):
    data = load_dataset("mutag", root=tu_root, verify=False)
    assert isinstance(data, GraphSetData) and data.kind == "graph"
    assert len(data.dataset) == 20 and data.num_classes == 2 and data.num_features == 3
    assert data.meta["node_features"] == "dataset features"
    idx = torch.cat([data.train_idx, data.val_idx, data.test_idx])
    assert sorted(idx.tolist()) == list(range(20))
    labels = torch.cat([g.y for g in data.dataset])
    # triangles (TU label 1) and paths (TU label -1): PyG maps sorted labels to 0..C-1
    sizes = torch.tensor([g.num_nodes for g in data.dataset])
    assert torch.equal(labels, (sizes == 3).long())
    for part in ("val", "test"):  # stratified 80/10/10: one graph per class
        assert sorted(labels[getattr(data, f"{part}_idx")].tolist()) == [0, 1]
    train = data.split("train")
    assert len(train) == 16 and train[0].x.shape[1] == 3


def test_tu_split_follows_the_seed(tu_root):
    a = load_dataset("mutag", root=tu_root, verify=False, seed=0)
    b = load_dataset("mutag", root=tu_root, verify=False, seed=0)
    c = load_dataset("mutag", root=tu_root, verify=False, seed=1)
    assert torch.equal(a.train_idx, b.train_idx) and torch.equal(a.test_idx, b.test_idx)
    assert not torch.equal(a.train_idx, c.train_idx)


def test_tu_without_features_gets_degree_or_constant(tu_root):
    data = load_dataset("imdb-binary", root=tu_root, verify=False)
    assert data.meta["node_features"] == "one-hot degree (max_degree=2)"
    assert data.num_features == 3
    path = next(g for g in data.dataset if g.num_nodes == 4)
    assert path.x.argmax(1).tolist() == [1, 2, 2, 1]  # endpoints have degree 1
    const = load_dataset("imdb-binary", root=tu_root, verify=False, node_features="constant")
    assert const.num_features == 1 and torch.equal(const.dataset[0].x, torch.ones(3, 1))
    both = load_dataset("mutag", root=tu_root, verify=False, node_features="degree")
    assert both.num_features == 3 + 3 and both.meta["node_features"].startswith("dataset features")
    with pytest.raises(ValueError, match="node_features must be"):
        load_dataset("mutag", root=tu_root, verify=False, node_features="random")


def test_tu_raw_files_are_flattened_into_the_cache_not_the_root(tu_root):
    import os

    load_dataset("mutag", root=tu_root, verify=False)
    raw = os.path.join(os.environ["DIFFUSIONFORMER_CACHE"], "tudataset", "MUTAG", "raw")
    assert {"MUTAG_A.txt", "MUTAG_graph_indicator.txt", "MUTAG_graph_labels.txt"} <= set(
        os.listdir(raw)
    )
    assert sorted(os.listdir(tu_root / "tudataset")) == ["IMDB-BINARY.zip", "MUTAG.zip"]


def test_tu_checksum_and_corrupt_archives(tu_root, writers):
    with pytest.raises(ChecksumError, match=r"tudataset/MUTAG\.zip\): expected SHA256 20f52db8"):
        load_dataset("mutag", root=tu_root)
    (tu_root / "tudataset" / "PTC_MR.zip").write_bytes(b"not a zip at all")
    with pytest.raises(CorruptDataError, match="corrupt zip archive"):
        load_dataset("ptc_mr", root=tu_root, verify=False)
    writers.write_tu_zip(tu_root / "tudataset" / "NCI1.zip", "OTHER")  # wrong file prefix inside
    with pytest.raises(CorruptDataError, match="missing NCI1_A.txt"):
        load_dataset("nci1", root=tu_root, verify=False)


def test_a_changed_zip_is_re_extracted(tu_root, writers):
    first = load_dataset("mutag", root=tu_root, verify=False)
    writers.write_tu_zip(tu_root / "tudataset" / "MUTAG.zip", "MUTAG", graphs_per_class=15)
    second = load_dataset("mutag", root=tu_root, verify=False)
    assert len(first.dataset) == 20 and len(second.dataset) == 30


def test_tu_k_fold_cross_validation(tu_root):
    """fold k of a stratified K-fold partition is the test part; the test folds tile the data."""
    tests = []
    for k in range(5):
        d = load_dataset("mutag", root=tu_root, verify=False, seed=3, fold=k, num_folds=5)
        parts = [d.train_idx, d.val_idx, d.test_idx]
        assert sorted(torch.cat(parts).tolist()) == list(range(20))  # a partition of the graphs
        labels = torch.cat([g.y for g in d.dataset])
        assert labels[d.test_idx].bincount(minlength=2).tolist() == [2, 2]  # stratified: 10 + 10 over 5 folds
        assert labels[d.val_idx].bincount(minlength=2).tolist() == [1, 1]  # 10% of each class's 8
        assert d.meta["split"].startswith("stratified 5-fold, test fold %d" % k)
        tests.append(d.test_idx)
    assert sorted(torch.cat(tests).tolist()) == list(range(20))  # every graph is tested exactly once
    again = load_dataset("mutag", root=tu_root, verify=False, seed=3, fold=2, num_folds=5)
    assert torch.equal(again.test_idx, tests[2])
    with pytest.raises(ValueError, match="fold must be an int in"):
        load_dataset("mutag", root=tu_root, verify=False, fold=5, num_folds=5)
    with pytest.raises(ValueError, match="num_folds must be an int >= 2"):
        load_dataset("mutag", root=tu_root, verify=False, fold=0, num_folds=1)


def test_extract_names_a_wrong_path_as_missing_not_corrupt(tmp_path):
    """Bug: extract_tu_zip called a missing zip a "corrupt zip archive" (a folder stays one)."""
    from diffusionformer.data.tu import extract_tu_zip

    raw = tmp_path / "raw"
    with pytest.raises(FileNotFoundError, match=r"No such file.*nowhere\.zip"):
        extract_tu_zip(tmp_path / "nowhere.zip", "MUTAG", raw, "0" * 64)
    with pytest.raises(CorruptDataError, match="corrupt zip archive"):
        extract_tu_zip(tmp_path, "MUTAG", raw, "0" * 64)
    assert not (raw / ".source_sha256").exists()
