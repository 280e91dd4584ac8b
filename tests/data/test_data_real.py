"""Cheap checks against the staged benchmark root (skipped when it is absent)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from diffusionformer.data import load_dataset
from diffusionformer.data.checksums import KNOWN_SHA256, sha256_file
from diffusionformer.data.idx import IDX_LABELS_MAGIC, read_idx


def test_checksum_table_matches_sha256sums(real_root: Path):
    listed = {}
    for line in (real_root / "SHA256SUMS").read_text().splitlines():
        digest, rel = line.split(maxsplit=1)
        listed[rel.removeprefix("./")] = digest
    for rel, digest in KNOWN_SHA256.items():
        assert listed[rel] == digest, rel


def test_checksum_table_matches_the_small_files_on_disk(real_root: Path):
    for rel, digest in KNOWN_SHA256.items():
        if rel.startswith(("planetoid/", "tudataset/", "mnist/", "tinyshakespeare/")):
            assert sha256_file(real_root / rel) == digest, rel


def test_tinyshakespeare(real_root: Path):
    data = load_dataset("tinyshakespeare", root=real_root)
    assert data.vocab_size == 65
    assert (len(data.train), len(data.val)) == (1_003_854, 111_540)
    assert data.decode(data.train[:14]) == "First Citizen:"


def test_mnist_test_labels(real_root: Path):
    labels = read_idx(
        real_root / "mnist/MNIST/raw/t10k-labels-idx1-ubyte.gz", expected_magic=IDX_LABELS_MAGIC
    )
    assert labels.shape == (10_000,) and labels[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert labels.bincount().tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_mnist_small_subset(real_root: Path):
    data = load_dataset("mnist", root=real_root, limit_train=600, limit_test=100, seed=0)
    assert data.meta["sizes"] == {"train": 540, "val": 60, "test": 100}
    assert data.meta["train_images"].startswith("reconstructed")
    assert data.x_train.shape[1:] == (1, 28, 28)
    assert data.mean[0] == pytest.approx(0.1307, abs=0.02)  # the usual MNIST mean


def test_cifar10_small_limit(real_root: Path):
    data = load_dataset("cifar10", root=real_root, limit_train=300, limit_test=100, seed=0)
    assert data.meta["sizes"] == {"train": 270, "val": 30, "test": 100}
    assert data.class_names[0] == "airplane" and data.class_names[-1] == "truck"
    assert data.x_test.shape == (100, 3, 32, 32)
    assert all(0.35 < m < 0.6 for m in data.mean)


def test_cora_public_split(real_root: Path):
    data = load_dataset("cora", root=real_root)
    d = data.data
    assert (d.num_nodes, d.num_edges, data.num_features, data.num_classes) == (2708, 10556, 1433, 7)
    assert [int(m.sum()) for m in (d.train_mask, d.val_mask, d.test_mask)] == [140, 500, 1000]
    assert d.y[d.train_mask].bincount().tolist() == [20] * 7


def test_mutag(real_root: Path):
    data = load_dataset("mutag", root=real_root)
    assert (len(data.dataset), data.num_classes, data.num_features) == (188, 2, 7)
    assert data.meta["sizes"] == {"train": 150, "val": 19, "test": 19}
    batch_y = torch.cat([g.y for g in data.split("test")])
    assert batch_y.numel() == 19
