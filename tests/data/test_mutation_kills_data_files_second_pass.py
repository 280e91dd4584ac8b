"""Tests written in a second-pass mutation-testing audit of the data-file readers.

Each test kills a mutant of the library code that the earlier audits and the rest of the suite let
through (its docstring names it: file and mutation): the IDX reader (``data/idx.py``), the CIFAR-10
readers (``data/cifar10.py``: the restricted unpickler, the batch and meta checks, the JPEG zips
and their decoded-array cache), the character corpora (``data/text.py``), the SHA256 table and
check (``data/checksums.py``) and the cache writer and reader (``data/paths.py``: ``save_cached``,
``load_cached``; ``data/base.py`` reads and caches no file). The references are independent of the
code under test: bytes and pickles built here by hand with ``struct``/``pickle``/``zipfile``/Pillow,
hashes from ``hashlib``, expected arrays and sizes worked out by hand. Mutants judged equivalent
are listed, with the reason, at the end of the file.

Five tests, whose docstrings start with "Bug:", pin defects fixed here: a CIFAR batch whose pickle
names an unknown codec, or whose size field asks for more memory than there is, or whose dict has a
key that is not UTF-8 or not a string, failed with a bare ``LookupError``, ``MemoryError``,
``UnicodeDecodeError`` or ``TypeError`` that named no file, instead of a ``CorruptDataError``; and a
decoded-zip cache file that ``torch.load`` accepts but that does not hold the decoded arrays (a bare
tensor, missing or short labels) crashed the load or was served as data, instead of being rebuilt.
CPU only, deterministic, no network; every file is written by hand under ``tmp_path``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import re
import struct
import warnings

import numpy as np
import pytest
import torch

from diffusionformer.data import CACHE_ENV, CorruptDataError, load_dataset
from diffusionformer.data import checksums
from diffusionformer.data.checksums import sha256_file, verify_file
from diffusionformer.data.cifar10 import CIFAR10_CLASSES, read_cifar_batch, read_cifar_meta, read_image_zip
from diffusionformer.data.idx import parse_idx, read_idx
from diffusionformer.data.paths import ChecksumError, load_cached, save_cached

PIL_Image = pytest.importorskip("PIL.Image", reason="Pillow writes and decodes the JPEG/PNG archives")


# ------------------------------------------------------------------------------------------ helpers
def _write_pickle(path, obj, protocol=2):
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    return path


def _image_bytes(colour, size=(8, 8), mode="RGB", fmt="PNG"):
    """A solid image; PNG by default, so that the decoded pixels are exactly ``colour``."""
    buf = io.BytesIO()
    PIL_Image.new(mode, size, colour).save(buf, format=fmt)
    return buf.getvalue()



def _colours(images):
    """The colour of each solid image of an ``(N, 3, H, W)`` uint8 tensor, as tuples."""
    return [tuple(int(v) for v in img[:, 0, 0]) for img in images]


# Colours of a tiny two-class JPEG-style layout (PNG payloads with .jpg names are fine for Pillow).
_RED, _GREEN, _BLUE, _GREY = (200, 10, 10), (10, 200, 10), (10, 10, 200), (90, 90, 90)


def _cifar_zips(writers, root, train_entries=None, test_entries=None):
    train = train_entries or [
        ("train/dog/0000.jpg", _image_bytes(_RED)), ("train/dog/0001.jpg", _image_bytes(_GREEN)),
        ("train/cat/0000.jpg", _image_bytes(_BLUE)), ("train/cat/0001.jpg", _image_bytes(_GREY)),
        ("train/cat/0002.jpg", _image_bytes((1, 2, 3))), ("train/dog/0002.jpg", _image_bytes((4, 5, 6))),
    ]
    test = test_entries or [("test/cat/0000.jpg", _image_bytes(_GREY)), ("test/dog/0000.jpg", _image_bytes(_RED))]
    return writers.write_stored_zip(root / "cifar10_jpg" / "train.zip", train), writers.write_stored_zip(root / "cifar10_jpg" / "test.zip", test)


# --------------------------------------------------------------------------- cifar10: bugs (pickles)
def test_bug_an_unknown_codec_in_a_batch_is_a_corrupt_file_naming_it(tmp_path):
    """Bug: cifar10.py ``_unpickle`` let a ``LookupError`` through: a batch whose pickle calls the
    allowed ``_codecs.encode`` with an encoding that does not exist failed with a bare
    ``LookupError: unknown encoding`` naming no file (kills: ``LookupError`` dropped again)."""
    raw = b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00xX\x07\x00\x00\x00nocodec\x86R."
    path = tmp_path / "data_batch_1"
    path.write_bytes(raw)
    with pytest.raises(CorruptDataError,  # (latin1 only since the fourth data probe: refused before the lookup)
                       match=r"corrupt CIFAR batch '.*data_batch_1': _codecs\.encode\(str, 'nocodec'\) is not allowed"):
        read_cifar_batch(path)


@pytest.mark.parametrize("opcode", [b"\x8e", b"\x8d", b"\x96"])  # BINBYTES8, BINUNICODE8, BYTEARRAY8
def test_bug_a_lying_size_field_in_a_batch_is_a_corrupt_file_naming_it(tmp_path, opcode):
    """Bug: cifar10.py ``_unpickle`` let a ``MemoryError`` through: a 14-byte batch whose 8-byte
    length field claims 2**60 bytes made the unpickler allocate them first, and the load failed
    with a bare ``MemoryError`` (empty message, no file) (kills: ``MemoryError`` dropped again;
    the message names the error type since ``str(MemoryError())`` is empty)."""
    path = tmp_path / "test_batch"
    path.write_bytes(b"\x80\x05" + opcode + struct.pack("<Q", 1 << 60) + b"abc.")
    with pytest.raises(CorruptDataError, match=r"corrupt CIFAR batch '.*test_batch': MemoryError$"):
        read_cifar_batch(path)


def test_bug_an_object_array_with_a_lying_shape_is_a_corrupt_file(tmp_path):
    """Bug: cifar10.py ``_unpickle``: an object array whose pickled shape says 2**40 items (NumPy
    allocates the shape before it looks at the 2 items given) raised a bare ``MemoryError``."""
    reconstruct = np.empty(0).__reduce__()[0]  # numpy's _reconstruct, whatever module holds it

    class LyingArray:
        def __reduce__(self):  # what NumPy pickles for an array, with the shape made up
            return (reconstruct, (np.ndarray, (0,), b"b"), (1, (2**40,), np.dtype("O"), False, [1, 2]))

    raw = pickle.dumps({b"data": LyingArray(), b"labels": [1]}, protocol=2)
    path = tmp_path / "data_batch_3"
    path.write_bytes(raw)
    with pytest.raises(CorruptDataError, match=r"corrupt CIFAR batch '.*data_batch_3'"):
        read_cifar_batch(path)


@pytest.mark.parametrize(
    "batch, names",
    [({1: 2, b"data": 3}, re.escape("[1, 'data']")), ({b"\xffdata": 1, b"labels": [1]}, re.escape("['labels', '\ufffddata']"))],
)
def test_bug_odd_keys_in_a_batch_are_a_corrupt_file_naming_the_keys(tmp_path, batch, names):
    """Bug: cifar10.py ``_unpickle``/``read_cifar_batch``: a batch dict with an int key and no
    ``data``/``labels`` failed while writing its own message (``sorted`` of ``[1, 'data']``: a bare
    ``TypeError``), and one with a key that is not UTF-8 failed with a bare ``UnicodeDecodeError``
    (kills: ``sorted(batch, key=str)`` -> ``sorted(batch)``; ``decode(errors="replace")`` ->
    ``decode()``)."""
    path = _write_pickle(tmp_path / "data_batch_4", batch)
    with pytest.raises(CorruptDataError, match=rf"'.*data_batch_4': expected keys 'data' and 'labels', got {names}"):
        read_cifar_batch(path)


# ------------------------------------------------------------------- cifar10: hostile pickle globals
@pytest.mark.parametrize("protocol", [2, 4])
@pytest.mark.parametrize("callable_", [eval, open])
def test_a_batch_naming_a_code_running_global_runs_nothing(tmp_path, protocol, callable_):
    """kills: cifar10.py ``find_class`` without its allow-list check (``if False``), and the
    allow-list widened by ``builtins.eval``/``getattr``, ``os``/``posix.system``: a doctored batch
    whose pickle calls ``eval``/``open`` must be refused before anything runs (the marker file the
    call would create stays absent)."""
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            if callable_ is eval:
                return (eval, (f"open({str(marker)!r}, 'w').close()",))
            return (open, (str(marker), "w"))

    path = _write_pickle(tmp_path / "data_batch_1", {b"data": Evil(), b"labels": [1]}, protocol)
    with pytest.raises(CorruptDataError, match=r"corrupt CIFAR batch '.*data_batch_1': global .* is not allowed"):
        read_cifar_batch(path)
    assert not marker.exists()


# ------------------------------------------------------------------------ cifar10: the batch checks
def test_a_pickled_list_is_a_corrupt_batch_not_an_attribute_error(tmp_path):
    """kills: cifar10.py the ``isinstance(obj, dict)`` check dropped (a batch pickling a list
    raised a bare ``AttributeError: 'list' object has no attribute 'items'``)."""
    path = _write_pickle(tmp_path / "data_batch_1", [1, 2, 3])
    with pytest.raises(CorruptDataError, match=r"'.*data_batch_1': expected a dict, got list"):
        read_cifar_batch(path)


def test_unsigned_labels_are_read_as_int64(tmp_path):
    """kills: cifar10.py ``labels.dtype.kind not in "iu"`` -> ``"i"`` (uint8 labels refused), and
    ``torch.from_numpy(labels.astype(np.int64))`` -> ``torch.from_numpy(labels)`` (uint8 labels)."""
    data = np.arange(2 * 3072, dtype=np.int64).astype(np.uint8).reshape(2, 3072)
    path = _write_pickle(tmp_path / "b", {b"data": data, b"labels": np.array([9, 0], dtype=np.uint8)})
    images, labels = read_cifar_batch(path)
    assert labels.dtype == torch.int64 and labels.tolist() == [9, 0]
    # row n holds R, G, B planes of 32x32: pixel (c, h, w) = data[n, 1024 c + 32 h + w]
    assert images.shape == (2, 3, 32, 32)
    assert int(images[1, 2, 3, 4]) == int(data[1, 1024 * 2 + 32 * 3 + 4])
    assert int(images[0, 1, 31, 0]) == int(data[0, 1024 + 32 * 31])


def test_float_labels_are_refused(tmp_path):
    """kills: cifar10.py the integer-labels check dropped (``if False``): float labels 1.5 became 1."""
    path = _write_pickle(tmp_path / "b", {b"data": np.zeros((1, 3072), np.uint8), b"labels": [1.5]})
    with pytest.raises(CorruptDataError, match=r"labels must be integers, got float64"):
        read_cifar_batch(path)


@pytest.mark.parametrize(
    "data, labels",
    [
        (np.zeros((1, 4000), np.uint8), [1]),  # rows longer than 3,072 pixels
        (np.zeros((1, 3072), np.uint8), [1, 2]),  # more labels than rows
        (np.zeros((0, 3072), np.uint8), []),  # no rows at all
        (np.array(7, np.uint8), []),  # a 0-d array
    ],
)
def test_batches_of_the_wrong_shape_are_corrupt_files(tmp_path, data, labels):
    """kills: cifar10.py ``data.shape[1] != 3072`` -> ``<`` (longer rows reached ``reshape``); the
    ``labels.shape != (N,)`` check dropped; ``or not N`` dropped (an empty batch passed);
    ``N = data.shape[0] if data.ndim else 0`` -> ``data.shape[0]`` (a 0-d array: bare ``IndexError``)."""
    path = _write_pickle(tmp_path / "data_batch_5", {b"data": data, b"labels": labels}, protocol=4)
    with pytest.raises(CorruptDataError, match=r"'.*data_batch_5': data .* do not form \(N, 3072\)"):
        read_cifar_batch(path)


@pytest.mark.parametrize(
    "labels, message",
    [([1, 10, 3], "found 10 at position 1 (1 out of range)"), ([-1, 2, 3], "found -1 at position 0 (1 out of range)"),
     ([1, 12, 3, -4], "found 12 at position 1 (2 out of range)")],
)
def test_labels_outside_zero_to_nine_are_refused_naming_the_first(tmp_path, labels, message):
    """kills: cifar10.py ``labels >= 10`` -> ``> 10`` (label 10 passed); ``labels < 0`` dropped
    (label -1 passed); the reported position taken from the last bad label (``[0][-1]``)."""
    data = np.zeros((len(labels), 3072), np.uint8)
    path = _write_pickle(tmp_path / "b", {b"data": data, b"labels": labels})
    with pytest.raises(CorruptDataError) as info:
        read_cifar_batch(path)
    assert message in str(info.value)


# ------------------------------------------------------------------------- cifar10: the meta checks
_NAMES = [f"class{i}".encode() for i in range(10)]


def test_label_names_stored_as_a_numpy_array_are_read(tmp_path):
    """kills: cifar10.py the ``isinstance(label_names, np.ndarray)`` branch dropped (a meta file
    holding a NumPy array of bytes names was refused)."""
    path = _write_pickle(tmp_path / "batches.meta", {b"label_names": np.array(_NAMES)}, protocol=4)
    assert read_cifar_meta(path) == [f"class{i}" for i in range(10)]


@pytest.mark.parametrize(
    "names", [_NAMES[:9], [b""] + _NAMES[1:], [_NAMES[0]] * 2 + _NAMES[2:], _NAMES + [b"extra"]],
    ids=["nine", "empty", "duplicate", "eleven"],
)
def test_label_names_must_be_ten_distinct_non_empty_names(tmp_path, names):
    """kills: cifar10.py ``len(names) != 10`` dropped; ``isinstance(n, str) and n`` -> without
    ``and n`` (an empty name passed); the distinctness check dropped (a duplicate passed)."""
    path = _write_pickle(tmp_path / "batches.meta", {b"label_names": names}, protocol=4)
    with pytest.raises(CorruptDataError, match=r"'.*batches\.meta': label_names must list 10 distinct non-empty"):
        read_cifar_meta(path)


def test_the_class_names_come_from_batches_meta(tmp_path, writers):
    """kills: cifar10.py ``_from_batches`` ignoring ``batches.meta`` (``if False``: the default
    CIFAR-10 names were used for a meta file listing other names); and ``_from_batches`` reading
    only ``data_batch_1..4`` (4 x 3 = 12 training images instead of 15)."""
    folder = tmp_path / "cifar-10-batches-py"
    writers.write_cifar_batches(folder, per_batch=3)
    _write_pickle(folder / "batches.meta", {b"label_names": _NAMES})
    data = load_dataset("cifar10", root=tmp_path, normalize=False, val_size=5)
    assert data.class_names == [f"class{i}" for i in range(10)]
    assert data.meta["sizes"] == {"train": 10, "val": 5, "test": 3}


def test_a_limited_test_set_keeps_each_label_with_its_image(tmp_path):
    """kills: cifar10.py the test labels indexed by another order than the test images
    (``y_te[keep_test.flip(0)]``): each test row here is filled with its own label, so a label
    that moved is seen."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for k, name in enumerate([f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]):
        labels = [(k + j) % 10 for j in range(6)]
        data = np.repeat(np.array(labels, dtype=np.uint8)[:, None] * 20, 3072, axis=1)
        _write_pickle(folder / name, {b"data": data, b"labels": labels})
    data = load_dataset("cifar10", root=tmp_path, normalize=False, val_size=2, limit_test=4, seed=5)
    assert data.meta["sizes"]["test"] == 4
    pixel = data.x_test[:, 0, 0, 0].mul(255).round().long()
    assert (pixel == data.y_test * 20).all() and len(set(data.y_test.tolist())) == 4
    pixel = data.x_train[:, 0, 0, 0].mul(255).round().long()
    assert (pixel == data.y_train * 20).all()


def test_source_jpg_reads_the_zips_even_when_batches_exist(tmp_path, writers, monkeypatch):
    """kills: cifar10.py ``source == "auto" and`` dropped from the pickle choice (``source="jpg"``
    read the python batches when both layouts were present)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    writers.write_cifar_batches(tmp_path / "cifar-10-batches-py", per_batch=3)
    _cifar_zips(writers, tmp_path)
    data = load_dataset("cifar10", root=tmp_path, source="jpg", verify=False, normalize=False, val_size=1)
    assert data.class_names == ["cat", "dog"]
    assert data.meta["sizes"] == {"train": 5, "val": 1, "test": 2}


# ------------------------------------------------------------------------------ cifar10: the zips
def test_zip_entries_are_filtered_by_split_depth_and_suffix(tmp_path, writers):
    """kills: cifar10.py ``len(parts) == 3`` -> ``>= 3`` (a nested ``train/cat/deep.jpg/0003.jpg``
    was read as a cat);
    ``parts[0] == split`` dropped (``test/...`` entries were read as training images);
    ``.lower()`` dropped (``0001.JPG`` was skipped); ``.png`` dropped from the suffixes."""
    path = writers.write_stored_zip(tmp_path / "a.zip", [
        ("train/cat/0000.jpg", _image_bytes(_RED)),
        ("train/cat/0001.JPG", _image_bytes(_GREEN)),
        ("train/cat/0002.png", _image_bytes(_BLUE)),
        ("train/cat/deep.jpg/0003.jpg", _image_bytes(_GREY)),
        ("train/cat/notes.txt", b"not an image"),
        ("test/dog/0000.jpg", _image_bytes(_GREY)),
    ])
    images, labels, classes = read_image_zip(path, "train")
    assert classes == ["cat"]
    assert labels.tolist() == [0, 0, 0]
    assert _colours(images) == [_RED, _GREEN, _BLUE]


def test_zip_entries_are_ordered_by_class_then_file_name_whatever_the_zip_order(tmp_path, writers):
    """kills: cifar10.py ``return sorted(members)`` -> ``return members`` (zip order: ``zebra``,
    written first, got the first images); each entry decoded from the first member's bytes
    instead of its own."""
    path = writers.write_stored_zip(tmp_path / "a.zip", [
        ("train/zebra/0001.jpg", _image_bytes(_RED)),
        ("train/ant/0002.jpg", _image_bytes(_GREEN)),
        ("train/zebra/0000.jpg", _image_bytes(_BLUE)),
        ("train/ant/0000.jpg", _image_bytes(_GREY)),
    ])
    images, labels, classes = read_image_zip(path, "train")
    assert classes == ["ant", "zebra"]
    assert labels.tolist() == [0, 0, 1, 1]
    assert _colours(images) == [_GREY, _GREEN, _BLUE, _RED]


def test_indices_decode_only_those_positions(tmp_path, writers):
    """kills: cifar10.py ``read_image_zip`` ignoring ``indices`` (every entry was returned); the
    class list stays that of the whole zip."""
    path = writers.write_stored_zip(tmp_path / "a.zip", [
        ("train/a/0.png", _image_bytes(_RED)), ("train/a/1.png", _image_bytes(_GREEN)),
        ("train/b/0.png", _image_bytes(_BLUE)), ("train/b/1.png", _image_bytes(_GREY)),
    ])
    images, labels, classes = read_image_zip(path, "train", torch.tensor([1, 3]))
    assert classes == ["a", "b"] and labels.tolist() == [0, 1]
    assert _colours(images) == [_GREEN, _GREY]


def test_grey_and_rgba_images_are_converted_to_rgb(tmp_path, writers):
    """kills: cifar10.py ``np.asarray(im.convert("RGB"))`` -> ``np.asarray(im)`` (a greyscale first
    image gave (N, 1, H, W)-like arrays, an RGBA one 4 channels)."""
    path = writers.write_stored_zip(tmp_path / "a.zip", [
        ("train/a/0.png", _image_bytes(77, mode="L")),
        ("train/a/1.png", _image_bytes((9, 8, 7, 255), mode="RGBA")),
    ])
    images, _, _ = read_image_zip(path, "train")
    assert images.shape == (2, 3, 8, 8)
    assert _colours(images) == [(77, 77, 77), (9, 8, 7)]


def test_an_image_of_another_size_is_a_corrupt_archive_naming_it(tmp_path, writers):
    """kills: cifar10.py the same-size check dropped (a 16x16 second image after an 8x8 first
    one failed with a bare NumPy broadcast ``ValueError`` naming neither zip nor entry)."""
    path = writers.write_stored_zip(tmp_path / "a.zip", [("train/a/0.png", _image_bytes(_RED)), ("train/a/1.png", _image_bytes(_RED, (16, 16)))])
    with pytest.raises(CorruptDataError, match=r"a\.zip': 'train/a/1\.png' has shape \(16, 16, 3\), expected \(8, 8, 3\)"):
        read_image_zip(path, "train")


def test_an_undecodable_entry_is_a_corrupt_archive_naming_it(tmp_path, writers):
    """kills: cifar10.py the decode error re-raised bare instead of as a ``CorruptDataError``."""
    path = writers.write_stored_zip(tmp_path / "a.zip", [("train/a/0.png", _image_bytes(_RED)), ("train/a/1.jpg", b"\xff\xd8 not a jpeg")])
    with pytest.raises(CorruptDataError, match=r"a\.zip': cannot decode 'train/a/1\.jpg'"):
        read_image_zip(path, "train")


# ---------------------------------------------------------------------- cifar10: the decoded cache
def _cache_file(tmp_path, zip_path, split):
    digest = hashlib.sha256(zip_path.read_bytes()).hexdigest()
    return tmp_path / "cache" / "cifar10" / f"{split}-{digest[:16]}.pt"


def test_the_full_decode_is_cached_under_the_zip_digest(tmp_path, monkeypatch, writers):
    """kills: cifar10.py ``save_cached`` of the full decode dropped (no cache file was written);
    paths.py ``os.chmod(tmp, new_file_mode())`` dropped (the cache kept mkstemp's 0600 mode)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    train, _ = _cifar_zips(writers, tmp_path)
    old = os.umask(0o022)
    try:
        load_dataset("cifar10", root=tmp_path, source="jpg", verify=False, normalize=False, val_size=1)
    finally:
        os.umask(old)
    cached = _cache_file(tmp_path, train, "train")
    assert cached.is_file()
    assert cached.stat().st_mode & 0o777 == 0o644
    content = torch.load(cached, weights_only=True)
    assert content["classes"] == ["cat", "dog"] and content["labels"].tolist() == [0, 0, 0, 1, 1, 1]
    assert _colours(content["images"]) == [_BLUE, _GREY, (1, 2, 3), _RED, _GREEN, (4, 5, 6)]
    assert not [p.name for p in cached.parent.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_a_changed_zip_is_decoded_again_not_read_from_the_old_cache(tmp_path, monkeypatch, writers):
    """kills: cifar10.py the cache name without the zip digest (``f"{split}.pt"``): a train zip
    replaced by another one was served from the first one's cache."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    _cifar_zips(writers, tmp_path)
    kw = dict(root=tmp_path, source="jpg", verify=False, normalize=False, val_size=1)
    first = load_dataset("cifar10", **kw)
    assert first.meta["sizes"]["train"] + first.meta["sizes"]["val"] == 6
    writers.write_stored_zip(tmp_path / "cifar10_jpg" / "train.zip", [(f"train/{c}/{i}.png", _image_bytes(_RED)) for c in "xy" for i in range(2)])
    writers.write_stored_zip(tmp_path / "cifar10_jpg" / "test.zip", [("test/x/0.png", _image_bytes(_RED)), ("test/y/0.png", _image_bytes(_RED))])
    second = load_dataset("cifar10", **kw)
    assert second.class_names == ["x", "y"]
    assert second.meta["sizes"] == {"train": 3, "val": 1, "test": 2}


def test_a_limited_subset_is_the_same_with_a_cold_and_a_warm_cache(tmp_path, monkeypatch, writers):
    """kills: cifar10.py the warm-cache subset drawn with another seed (``seed + 1``), and the
    cold-cache subset drawn with seed 0 instead of ``seed``: the module docstring promises the same
    subset whether the cache exists or not."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    many = [(f"train/{('cat', 'dog')[k % 2]}/{k:02d}.png", _image_bytes((k, 2 * k, 3 * k))) for k in range(12)]
    train, _ = _cifar_zips(writers, tmp_path, train_entries=many)
    kw = dict(root=tmp_path, source="jpg", verify=False, normalize=False, val_size=1, limit_train=5)
    colours = {}
    for seed in (3, 11):
        cold = load_dataset("cifar10", seed=seed, **kw)
        assert not _cache_file(tmp_path, train, "train").exists()  # a limited load caches nothing
        colours[seed] = sorted(_colours(torch.cat([cold.x_train, cold.x_val]).mul(255).round().to(torch.uint8)))
        assert len(colours[seed]) == 5
    assert colours[3] != colours[11]  # the seed chooses the subset
    load_dataset("cifar10", **{**kw, "limit_train": None})  # warms the cache
    assert _cache_file(tmp_path, train, "train").is_file()
    for seed in (3, 11):
        warm = load_dataset("cifar10", seed=seed, **kw)
        assert sorted(_colours(torch.cat([warm.x_train, warm.x_val]).mul(255).round().to(torch.uint8))) == colours[seed]


def test_a_doctored_cache_file_runs_nothing_and_is_rebuilt(tmp_path, monkeypatch, writers):
    """kills: paths.py ``load_cached`` with ``weights_only=False`` (a cache file whose pickle calls
    ``open`` ran it); paths.py without the ``is_file`` guard (a cold cache warned "refused")."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    train, _ = _cifar_zips(writers, tmp_path)
    kw = dict(root=tmp_path, source="jpg", verify=False, normalize=False, val_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        load_dataset("cifar10", **kw)  # cold: nothing to refuse, nothing to warn about
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    torch.save({"images": Evil()}, _cache_file(tmp_path, train, "train"))
    with pytest.warns(UserWarning, match=r"cached file refused and rebuilt: .*train-"):
        data = load_dataset("cifar10", **kw)
    assert not marker.exists()
    assert data.class_names == ["cat", "dog"]
    assert data.meta["sizes"]["train"] + data.meta["sizes"]["val"] == 6
    assert load_cached(_cache_file(tmp_path, train, "train"))["labels"].tolist() == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize(
    "content",
    [torch.zeros(3), {"images": torch.zeros(6, 3, 8, 8, dtype=torch.uint8)},
     {"images": torch.zeros(6, 3, 8, 8, dtype=torch.uint8), "labels": torch.zeros(5, dtype=torch.int64),
      "classes": ["cat", "dog"]},
     {"images": torch.zeros(6, 3, 8, 8, dtype=torch.uint8), "labels": torch.full((6,), 7), "classes": ["cat", "dog"]}],
    ids=["tensor", "no-labels", "short-labels", "label-out-of-range"],
)
def test_a_cache_file_that_loads_but_is_not_the_decoded_arrays_is_rebuilt(tmp_path, monkeypatch, content, writers):
    """Bug: cifar10.py ``_from_zip`` trusted any cache file that ``torch.load`` accepted: one holding
    a bare tensor, or a dict without ``labels``, failed with a bare ``IndexError``/``KeyError``,
    and one whose labels were fewer than its images, or outside the classes, was served as data.
    Such a file is now refused with a warning naming it and rebuilt from the zip."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    train, _ = _cifar_zips(writers, tmp_path)
    cached = _cache_file(tmp_path, train, "train")
    cached.parent.mkdir(parents=True)
    torch.save(content, cached)
    with pytest.warns(UserWarning, match=r"cached file refused and rebuilt: .*train-.*: not the decoded images"):
        data = load_dataset("cifar10", root=tmp_path, source="jpg", verify=False, normalize=False, val_size=1)
    assert data.class_names == ["cat", "dog"]
    y = torch.cat([data.y_train, data.y_val]).sort().values.tolist()
    assert y == [0, 0, 0, 1, 1, 1]
    assert torch.load(cached, weights_only=True)["labels"].tolist() == [0, 0, 0, 1, 1, 1]


def test_verify_is_on_by_default_for_the_zips(tmp_path, monkeypatch, writers):
    """kills: cifar10.py ``verify: bool = True`` -> ``False``, and ``_from_zip`` hashing without
    checking (``digest = sha256_file(path)`` whatever ``verify``): hand-made zips at the staged
    paths differ from the recorded SHA256 and must be refused unless ``verify=False``."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    _cifar_zips(writers, tmp_path)
    with pytest.raises(ChecksumError, match=r"cifar10_jpg/train\.zip"):
        load_dataset("cifar10", root=tmp_path, source="jpg", normalize=False, val_size=1)
    assert not (tmp_path / "cache" / "cifar10").exists() or not list((tmp_path / "cache" / "cifar10").iterdir())


# ------------------------------------------------------------------------------------- paths: cache
def test_save_cached_writes_the_object_and_leaves_no_temporary(tmp_path):
    """kills: paths.py ``save_cached`` writing ``torch.save(obj, path)`` and then renaming the empty
    temporary over it; the clean-up of the temporary dropped."""
    path = tmp_path / "c" / "x.pt"
    save_cached({"a": torch.arange(3)}, path)
    assert torch.load(path, weights_only=True)["a"].tolist() == [0, 1, 2]
    assert [p.name for p in path.parent.iterdir()] == ["x.pt"]


# ------------------------------------------------------------------------------------------- idx.py
def _idx(type_code, dims, payload):
    return struct.pack(">I", (type_code << 8) | len(dims)) + struct.pack(f">{len(dims)}I", *dims) + payload


def test_the_decoded_tensor_owns_writable_memory():
    """kills: idx.py ``astype(..., copy=True)`` -> ``copy=False`` (a uint8 file came back as a
    read-only view of the caller's bytes: torch warned, and writing into it was undefined)."""
    raw = _idx(0x08, (2, 2), bytes([1, 2, 3, 4]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = parse_idx(raw)
    t += 10
    assert t.tolist() == [[11, 12], [13, 14]]
    assert raw[-4:] == bytes([1, 2, 3, 4])


def test_a_file_with_seventeen_dims_is_read():
    """kills: idx.py ``ndim = magic & 0xFF`` -> ``& 0x0F`` (17 dims read as 1)."""
    raw = _idx(0x08, (1,) * 16 + (2,), bytes([5, 6]))
    t = parse_idx(raw)
    assert t.shape == (1,) * 16 + (2,) and t.flatten().tolist() == [5, 6]


def test_signed_bytes_and_big_endian_int32_decode_by_hand():
    """kills: idx.py type 0x09 read as unsigned (``>u1``); type 0x0C read little-endian (``<i4``);
    type 0x0D read as int32 instead of float32."""
    assert parse_idx(_idx(0x09, (2,), bytes([0xFF, 0x80]))).tolist() == [-1, -128]
    assert parse_idx(_idx(0x0C, (1,), bytes([0x00, 0x00, 0x01, 0x02]))).tolist() == [258]
    assert parse_idx(_idx(0x0D, (1,), bytes([0x3F, 0xC0, 0x00, 0x00]))).tolist() == [1.5]


def test_read_idx_checks_the_expected_magic_naming_the_file(tmp_path):
    """kills: idx.py ``read_idx`` not passing ``expected_magic`` on (a labels file given where
    images are expected was decoded as a 1-D tensor instead of being refused)."""
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(_idx(0x08, (3,), bytes([1, 2, 3])))
    assert read_idx(path).tolist() == [1, 2, 3]
    with pytest.raises(CorruptDataError, match=r"train-images-idx3-ubyte: bad IDX magic number 0x00000801, expected 0x00000803"):
        read_idx(path, expected_magic=0x803)


def test_a_truncated_gzip_is_a_corrupt_file_naming_it(tmp_path):
    """kills: idx.py ``read_idx_bytes`` not catching ``EOFError`` (a gzip cut short, e.g. by an
    interrupted copy, raised a bare ``EOFError``)."""
    path = tmp_path / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(gzip.compress(_idx(0x08, (50,), bytes(range(50))))[:-12])
    with pytest.raises(CorruptDataError, match=r"corrupt or truncated gzip file '.*t10k-labels-idx1-ubyte\.gz'"):
        read_idx(path)


def test_a_gzip_with_a_damaged_crc_is_a_corrupt_file_naming_it(tmp_path):
    """kills: idx.py ``read_idx_bytes`` not catching ``OSError`` (``gzip.BadGzipFile`` for a CRC that
    does not match the content was raised bare)."""
    raw = bytearray(gzip.compress(_idx(0x08, (4,), bytes([1, 2, 3, 4]))))
    raw[-8] ^= 0xFF  # first byte of the CRC32 trailer
    path = tmp_path / "x.gz"
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptDataError, match=r"corrupt or truncated gzip file '.*x\.gz'"):
        read_idx(path)


# ------------------------------------------------------------------------------------- checksums.py
def test_sha256_file_hashes_every_chunk(tmp_path):
    """kills: checksums.py ``sha256_file`` hashing only the first chunk of the file."""
    path = tmp_path / "f"
    content = bytes(range(256)) * 3
    path.write_bytes(content)
    assert sha256_file(path, chunk_size=7) == hashlib.sha256(content).hexdigest()


def test_a_hash_sharing_only_a_prefix_is_refused_naming_file_expected_and_actual(tmp_path, monkeypatch):
    """kills: checksums.py the full-hash comparison reduced to the first 16 hex digits; the message
    without the file path; the message without the actual hash."""
    path = tmp_path / "g.bin"
    path.write_bytes(b"payload")
    actual = hashlib.sha256(b"payload").hexdigest()
    wrong = actual[:16] + ("0" if actual[16] != "0" else "1") + actual[17:]
    monkeypatch.setitem(checksums.KNOWN_SHA256, "x/g.bin", wrong)
    with pytest.raises(ChecksumError) as info:
        verify_file(path, "x/g.bin")
    message = str(info.value)
    assert repr(str(path)) in message and f"expected SHA256 {wrong}, got {actual}." in message


def test_a_gz_known_by_both_hashes_reports_the_file_hash_and_checks_content(tmp_path, monkeypatch):
    """kills: checksums.py ``wanted`` taking the content hash when the file hash is known; the
    content comparison inverted (``!=``: a wrong content passed, the right one failed); the raise
    replaced by ``return actual`` (a wrong file passed)."""
    path = tmp_path / "a.gz"
    path.write_bytes(gzip.compress(b"idx bytes", mtime=0))
    content_hash = hashlib.sha256(b"idx bytes").hexdigest()
    file_hash = "f" * 64
    monkeypatch.setitem(checksums.KNOWN_SHA256, "m/a.gz", file_hash)
    monkeypatch.setitem(checksums.KNOWN_CONTENT_SHA256, "m/a", content_hash)
    assert verify_file(path, "m/a.gz", content=b"idx bytes") == hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(ChecksumError, match=rf"expected SHA256 {file_hash}, got"):
        verify_file(path, "m/a.gz", content=b"other bytes")
    with pytest.raises(ChecksumError, match=rf"expected SHA256 {file_hash}, got"):
        verify_file(path, "m/a.gz")


# ------------------------------------------------------------------------------------------ text.py
def _shakespeare(tmp_path, text):
    path = tmp_path / "tinyshakespeare" / "input.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8"))
    return path


def test_a_wrong_tinyshakespeare_is_refused_by_default_and_read_without_verify(tmp_path):
    """kills: text.py ``if verify`` -> ``if not verify``; ``verify`` defaulting to ``False``; the
    check made under a key absent from the table (``"input.txt"``: nothing compared); and
    checksums.py ``expected is None and content_expected is None`` -> ``or`` (a file with a
    recorded SHA256 but no content hash passed unchecked)."""
    _shakespeare(tmp_path, "to be or not to be")
    with pytest.raises(ChecksumError, match=r"tinyshakespeare/input\.txt\): expected SHA256 86c4e6aa"):
        load_dataset("tinyshakespeare", root=tmp_path)
    data = load_dataset("tinyshakespeare", root=tmp_path, verify=False)
    assert data.meta["characters"] == 18


def test_tinyshakespeare_split_vocabulary_and_sizes_by_hand(tmp_path):
    """kills: text.py ``train_fraction`` not passed on (0.9 used); ``itos`` in order of first
    appearance instead of sorted; ``val = ids[n + 1:]``; meta ``sizes`` with ``val = len(ids)``;
    ``n == 0`` -> ``n < 0`` (an empty train split accepted)."""
    _shakespeare(tmp_path, "dcba dcba")  # 9 characters, vocabulary [' ', 'a', 'b', 'c', 'd']
    data = load_dataset("tinyshakespeare", root=tmp_path, verify=False, train_fraction=0.5)
    assert data.itos == [" ", "a", "b", "c", "d"]
    assert data.train.tolist() == [4, 3, 2, 1]  # floor(0.5 * 9) = 4
    assert data.val.tolist() == [0, 4, 3, 2, 1]
    assert data.meta["sizes"] == {"train": 4, "val": 5}
    with pytest.raises(ValueError, match=r"leaves the train split empty"):
        load_dataset("tinyshakespeare", root=tmp_path, verify=False, train_fraction=0.1)


def test_train_chars_keeps_the_first_characters_in_their_own_storage(tmp_path):
    """kills: text.py ``train[:train_chars]`` -> ``train[-train_chars:]``; ``.clone()`` dropped (the
    cut kept the whole train stream alive in its storage); the meta ``val`` size taken from the
    train stream; the split note not extended."""
    _shakespeare(tmp_path, "abcdefghij" * 2)  # train = first 18 characters, val = last 2
    data = load_dataset("tinyshakespeare", root=tmp_path, verify=False, train_chars=3)
    assert data.train.tolist() == [0, 1, 2]
    assert data.train.untyped_storage().nbytes() == 3 * 8
    assert data.meta["sizes"] == {"train": 3, "val": 2}
    assert data.meta["split"].endswith("; train cut to its first 3 characters")


@pytest.mark.parametrize("bad", [True, 1, 2.0])
def test_train_chars_must_be_an_int_of_at_least_two(tmp_path, bad):
    """kills: text.py ``train_chars < 2`` -> ``< 1`` (``True``, equal to 1, kept a single training
    character: no window to learn from)."""
    _shakespeare(tmp_path, "abcdefghij" * 2)
    with pytest.raises(ValueError, match=r"train_chars must be an int >= 2 or None"):
        load_dataset("tinyshakespeare", root=tmp_path, verify=False, train_chars=bad)


def test_a_crlf_corpus_reads_like_python_text_mode(tmp_path):
    """kills: text.py ``read_text`` decoding the raw bytes (``read_bytes().decode``) instead of
    reading in text mode: nanoGPT reads ``input.txt`` with ``open(...).read()``, which turns
    ``\\r\\n`` into ``\\n``; and a latin-1 read (non-UTF-8 bytes must be refused, naming the file)."""
    path = _shakespeare(tmp_path, "")
    path.write_bytes(b"ab\r\ncd\r\n")
    data = load_dataset("tinyshakespeare", root=tmp_path, verify=False, train_fraction=0.5)
    assert data.itos == ["\n", "a", "b", "c", "d"] and data.meta["characters"] == 6
    path.write_bytes(b"ab\xff\xfecd")
    with pytest.raises(CorruptDataError, match=r"corrupt text file '.*input\.txt': not valid UTF-8"):
        load_dataset("tinyshakespeare", root=tmp_path, verify=False)


def test_the_default_cifar_names_are_the_official_order():
    """Reference for the tests above: the CIFAR-10 class order of the official ``batches.meta``."""
    assert CIFAR10_CLASSES == ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


# ------------------------------------------------------------------------------ equivalent mutants
# idx.py ``0x08: ">u1"`` -> ``"<u1"``: byte order means nothing for one-byte items.
# idx.py ``"truncated" if got < expected`` -> ``<=``: that line only runs when got != expected.
# checksums.py ``content_expected is not None and content is not None`` -> ``content is not None``:
#   with no content hash the comparison is with None and fails, reaching the same raise.
# checksums.py ``if expected is not None and actual == expected`` -> ``if actual == expected``:
#   ``actual`` is a hex string, never None.
# cifar10.py ``seeded_subset(total, limit, seed) if total else None`` -> always ``seeded_subset``:
#   with no entries ``read_image_zip`` raises "holds no ... entries" before it looks at indices.
# cifar10.py ``classes = sorted({...})`` -> the classes in order of first appearance in ``members``:
#   ``members`` is sorted by class name first, so both orders are the same.
# text.py the ``isinstance(train_chars, bool)`` guard dropped: ``True``/``False`` equal 1/0, which the
#   ``train_chars < 2`` check refuses with the same message.
# text.py ``sorted(topics)`` -> ``topics``: ``pydoc_data.topics.topics`` is already in sorted key
#   order in the standard library this runs on (checked), so the corpus is the same.
