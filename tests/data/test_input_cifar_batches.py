"""CIFAR-10 python batches with bad contents: labels, class names, and the image array.

Each damaged file must give a :class:`CorruptDataError` naming it at load time, not an
``IndexError`` at the first training step or a model with the wrong number of classes.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from diffusionformer.data import CorruptDataError, load_dataset
from diffusionformer.data.cifar10 import read_cifar_batch, read_cifar_meta


def _rewrite(path, **fields):
    """Replace some fields of the pickled dict at ``path`` (bytes keys, as the official files).

    Protocol 4: protocol 2 pickles an empty array's buffer as ``__builtin__.bytes()``, which
    the restricted unpickler refuses before the contents could be checked.
    """
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    batch.update({k.encode(): v for k, v in fields.items()})
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=4)


def _labels(path):
    with open(path, "rb") as f:
        return list(pickle.load(f, encoding="bytes")[b"labels"])


@pytest.fixture()
def root(tmp_path, writers):
    writers.write_cifar_batches(tmp_path / "cifar-10-batches-py", per_batch=4)
    return tmp_path


def test_well_formed_batches_load_with_ten_classes(root):
    data = load_dataset("cifar10", root=root, normalize=False, val_size=4)
    assert data.num_classes == 10 and len(data.class_names) == 10


@pytest.mark.parametrize("name, bad", [("data_batch_3", 12), ("test_batch", -1), ("data_batch_1", 10)])
def test_a_label_outside_0_to_9_names_the_file(root, name, bad):
    path = root / "cifar-10-batches-py" / name
    labels = _labels(path)
    labels[2] = bad
    _rewrite(path, labels=labels)
    with pytest.raises(CorruptDataError, match=rf"{name}'.*labels must lie in \[0, 10\), found {bad} at position 2"):
        load_dataset("cifar10", root=root, val_size=4)


@pytest.mark.parametrize("labels, match", [
    ([0.0, 1.5, 2.0, 3.0], "labels must be integers, got float64"),
    (["0", "1", "2", "3"], "labels must be integers"),
    ([0, 1, 2], r"data \(4, 3072\) and labels \(3,\)"),
    ([[0, 1], [2, 3]], r"labels are not a flat list of integers \(an item is a list\)"),  # before np.asarray
])
def test_labels_of_the_wrong_type_or_count(root, labels, match):
    path = root / "cifar-10-batches-py" / "data_batch_2"
    _rewrite(path, labels=labels)
    with pytest.raises(CorruptDataError, match=rf"data_batch_2'.*{match}"):
        read_cifar_batch(path)


@pytest.mark.parametrize("data, match", [
    (np.zeros((4, 3072), dtype=np.int64), "data must be a uint8 array, got int64 array"),
    (np.full((4, 3072), 300.0), "data must be a uint8 array, got float64 array"),
    ([[0] * 3072] * 4, "data must be a uint8 array, got list"),
    (np.zeros((4, 3, 32, 32), dtype=np.uint8), r"data \(4, 3, 32, 32\)"),
    (np.zeros((4, 1024), dtype=np.uint8), r"data \(4, 1024\)"),
    (np.zeros((0, 3072), dtype=np.uint8), r"data \(0, 3072\) .*N >= 1"),
])
def test_an_image_array_of_the_wrong_dtype_shape_or_count(root, data, match):
    path = root / "cifar-10-batches-py" / "test_batch"
    _rewrite(path, data=data, **({"labels": []} if len(data) == 0 else {}))
    with pytest.raises(CorruptDataError, match=rf"test_batch'.*{match}"):
        load_dataset("cifar10", root=root, val_size=4)


@pytest.mark.parametrize("meta, match", [
    ({b"label_names": [b"cat", b"dog", b"frog"]}, "must list 10 distinct non-empty names, got 3"),
    ({b"label_names": [b"a"] * 10}, "must list 10 distinct"),
    ({b"label_names": [""] + [str(i) for i in range(9)]}, "must list 10 distinct non-empty"),
    ({b"label_names": list(range(10))}, "must list 10 distinct non-empty names"),
    ({b"label_names": [b"\xff"] + [str(i).encode() for i in range(9)]}, "not UTF-8"),
    ({b"num_vis": 3072}, "expected a list 'label_names', got NoneType"),
    ({b"label_names": []}, "got 0"),
])
def test_a_meta_without_ten_class_names_names_the_file(root, meta, match):
    path = root / "cifar-10-batches-py" / "batches.meta"
    with open(path, "wb") as f:
        pickle.dump(meta, f, protocol=2)
    with pytest.raises(CorruptDataError, match=rf"batches\.meta'.*{match}"):
        load_dataset("cifar10", root=root, val_size=4)


def test_a_meta_with_ten_other_names_is_used(root):
    path = root / "cifar-10-batches-py" / "batches.meta"
    names = [f"class{i}" for i in range(10)]
    with open(path, "wb") as f:
        pickle.dump({b"label_names": np.array(names)}, f, protocol=2)
    assert read_cifar_meta(path) == names
    assert load_dataset("cifar10", root=root, val_size=4).class_names == names
