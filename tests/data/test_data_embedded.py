"""Embedded datasets: shapes, dtypes, splits, normalisation and determinism by seed."""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest
import torch

from diffusionformer.data import ClassificationData, NodeData, TextData, load_dataset

SPLITS = ("train", "val", "test")


def _assert_classification(data: ClassificationData, shape, num_classes=10):
    assert data.input_shape == shape and data.num_classes == num_classes
    seen = []
    for split in SPLITS:
        x, y = data.split(split)
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        assert tuple(x.shape[1:]) == shape and x.shape[0] == y.shape[0] > 0
        assert torch.isfinite(x).all()
        assert int(y.min()) >= 0 and int(y.max()) < num_classes
        seen.append(x.shape[0])
    assert data.meta["sizes"] == dict(zip(SPLITS, seen))


def _same(a: ClassificationData, b: ClassificationData) -> bool:
    return all(torch.equal(u, v) for s in SPLITS for u, v in zip(a.split(s), b.split(s)))


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def test_digits_shapes_split_and_normalisation(digits):
    _assert_classification(digits, (1, 8, 8))
    assert [len(digits.split(s)[1]) for s in SPLITS] == [1259, 179, 359]
    # stratified: every class in every split, in proportion
    for split in SPLITS:
        counts = digits.split(split)[1].bincount(minlength=10).double()
        assert (counts > 0).all()
        assert float(counts.max() / counts.min()) < 1.15
    # train statistics are used: train is standardised, mean/std recorded
    assert abs(float(digits.x_train.mean())) < 1e-4
    assert float(digits.x_train.std()) == pytest.approx(1.0, abs=1e-3)
    assert digits.mean is not None and 0 < digits.mean[0] < 1 and digits.std[0] > 0
    raw = load_dataset("digits", normalize=False)
    assert raw.mean is None and float(raw.x_train.min()) == 0.0 and float(raw.x_train.max()) == 1.0
    expected = (raw.x_test - digits.mean[0]) / digits.std[0]
    assert torch.allclose(digits.x_test, expected, atol=1e-5)


def test_digits_splits_are_disjoint_and_seeded(digits):
    again = load_dataset("digits", seed=0)
    other = load_dataset("digits", seed=1)
    assert _same(digits, again)
    assert not torch.equal(digits.y_train, other.y_train)
    # partition: no image is in two splits (digits has a few duplicate images, so compare counts)
    total = sum(len(digits.split(s)[1]) for s in SPLITS)
    assert total == 1797


def test_digits_split_fractions_are_options():
    data = load_dataset("digits", val_fraction=0.2, test_fraction=0.3, normalize=False)
    sizes = data.meta["sizes"]
    assert sizes["val"] == pytest.approx(0.2 * 1797, abs=10)
    assert sizes["test"] == pytest.approx(0.3 * 1797, abs=10)
    with pytest.raises(ValueError, match="val_fraction \\+ test_fraction must be < 1"):
        load_dataset("digits", val_fraction=0.5, test_fraction=0.5)


def test_mnist1d_is_a_sequence_task_and_restores_global_rng():
    np.random.seed(123)
    random.seed(123)
    np_before, py_before = np.random.rand(), random.random()
    np.random.seed(123)
    random.seed(123)
    data = load_dataset("mnist1d", num_samples=200, seed=0)
    assert np.random.rand() == np_before and random.random() == py_before
    assert data.kind == "sequence"
    _assert_classification(data, (40, 1))
    assert data.meta["sizes"] == {"train": 144, "val": 16, "test": 40}
    same = load_dataset("mnist1d", num_samples=200, seed=0)
    other = load_dataset("mnist1d", num_samples=200, seed=1)
    assert _same(data, same)
    assert torch.equal(data.x_test, other.x_test)  # the package's own split is fixed
    assert not torch.equal(data.y_train, other.y_train)  # our val carve follows the seed


@pytest.fixture(scope="module")
def mnist_mini():
    return load_dataset("mnist-mini", normalize=False)


def test_mnist_mini_real_digits_shuffled_and_stratified(mnist_mini):
    _assert_classification(mnist_mini, (1, 28, 28))
    assert mnist_mini.meta["sizes"] == {"train": 3500, "val": 500, "test": 1000}
    assert mnist_mini.y_test.bincount().tolist() == [100] * 10
    y = mnist_mini.y_train
    assert not bool((y[1:] >= y[:-1]).all()), "the class-sorted source must be shuffled"
    x = mnist_mini.x_train
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    # real MNIST: mostly background, a stroke in the middle
    assert 0.05 < float(x.mean()) < 0.25
    assert float(x[:, :, 10:18, 10:18].mean()) > float(x[:, :, :4, :].mean())


def test_mnist_mini_seed_changes_split_and_is_cached(mnist_mini, session_cache):
    assert list((session_cache / "mnist-mini").glob("mnist_5k-*.pt"))
    again = load_dataset("mnist-mini", normalize=False)
    other = load_dataset("mnist-mini", normalize=False, seed=3)
    assert _same(mnist_mini, again)
    assert not torch.equal(mnist_mini.y_train, other.y_train)


def test_pydoc_chars_text_data():
    data = load_dataset("pydoc-chars")
    assert isinstance(data, TextData) and data.kind == "text"
    assert data.train.dtype == torch.int64 and data.train.dim() == 1
    total = len(data.train) + len(data.val)
    assert len(data.train) == int(0.9 * total) and total > 400_000
    assert data.vocab_size == len(data.itos) == int(torch.cat([data.train, data.val]).max()) + 1
    assert "assert" in data.decode(data.train[:200])
    from pydoc_data.topics import topics

    first = topics[sorted(topics)[0]]
    assert data.decode(data.train[: len(first)]) == first


def test_karate_seeded_few_label_split():
    data = load_dataset("karate", seed=0)
    assert isinstance(data, NodeData) and data.kind == "node"
    d = data.data
    assert d.num_nodes == 34 and data.num_classes == 4 and data.num_features == 34
    assert d.y[d.train_mask].bincount(minlength=4).tolist() == [2, 2, 2, 2]
    masks = torch.stack([d.train_mask, d.val_mask, d.test_mask]).long()
    assert masks.sum(0).eq(1).all()  # a partition of the nodes
    assert (int(d.val_mask.sum()), int(d.test_mask.sum())) == (13, 13)
    other = load_dataset("karate", seed=1).data
    assert not torch.equal(d.train_mask, other.train_mask)
    assert torch.equal(d.train_mask, load_dataset("karate", seed=0).data.train_mask)
    assert load_dataset("karate", num_train_per_class=3).data.train_mask.sum() == 12


def test_missing_optional_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # makes the import fail
    with pytest.raises(ImportError, match=r'pip install "diffusionformer\[data\]"'):
        load_dataset("digits")


def test_repr_is_short(digits):
    text = repr(digits)
    assert text == (
        "ClassificationData(name='digits', kind='image', train=1259, val=179, test=359, "
        "input_shape=(1, 8, 8), num_classes=10)"
    )
