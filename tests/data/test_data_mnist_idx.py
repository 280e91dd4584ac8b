"""IDX parsing and the MNIST loader on tiny generated files (both layouts), incl. damaged ones."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from diffusionformer.data import ChecksumError, CorruptDataError, DataRootError, load_dataset
from diffusionformer.data.idx import IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC, parse_idx, read_idx, read_idx_bytes


def test_idx_round_trip_of_several_types(tmp_path, writers):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = writers.write_idx_gz(tmp_path / "x-idx3-ubyte.gz", images)
    out = read_idx(path, expected_magic=IDX_IMAGES_MAGIC)
    assert out.dtype == torch.uint8 and out.tolist() == images.tolist()
    ints = np.array([[1, -2], [300000, 4]], dtype=np.int32)
    assert parse_idx(writers.idx_bytes(ints, 0x0C)).tolist() == ints.tolist()
    floats = np.array([0.5, -1.25], dtype=np.float32)
    assert parse_idx(writers.idx_bytes(floats, 0x0D)).tolist() == floats.tolist()
    plain = tmp_path / "plain-idx1-ubyte"  # an uncompressed file reads too
    plain.write_bytes(writers.idx_bytes(np.array([7, 8], dtype=np.uint8)))
    assert read_idx(plain, expected_magic=IDX_LABELS_MAGIC).tolist() == [7, 8]


def test_idx_bad_magic_and_sizes(writers):
    labels = writers.idx_bytes(np.array([1, 2, 3], dtype=np.uint8))
    with pytest.raises(CorruptDataError, match="magic number 0x00000801, expected 0x00000803"):
        parse_idx(labels, expected_magic=IDX_IMAGES_MAGIC)
    with pytest.raises(CorruptDataError, match="bad IDX magic"):
        parse_idx(b"\x01\x00\x08\x01" + labels[4:])
    with pytest.raises(CorruptDataError, match="truncated: header says"):
        parse_idx(labels[:-1])
    with pytest.raises(CorruptDataError, match="has trailing bytes"):
        parse_idx(labels + b"\x00")
    with pytest.raises(CorruptDataError, match="truncated IDX header"):
        parse_idx(labels[:6])
    with pytest.raises(CorruptDataError, match="not an IDX file"):
        parse_idx(b"\x00\x00")


def test_truncated_gzip_names_the_file(tmp_path, writers):
    path = writers.write_idx_gz(tmp_path / "t-idx1-ubyte.gz", np.arange(500, dtype=np.uint8) % 10)
    path.write_bytes(path.read_bytes()[:-12])
    with pytest.raises(CorruptDataError, match=r"corrupt or truncated gzip file .*t-idx1-ubyte"):
        read_idx(path)


def test_a_gzip_bomb_is_read_no_further_than_its_header_declares(tmp_path, writers):
    """Bug: ``read_idx_bytes`` gunzipped the whole stream into memory, so a small ``.gz`` holding a tiny IDX
    header and gigabytes of zeros filled memory before ``parse_idx`` saw the trailing bytes. The stream is now
    read one byte past the declared size, and a header declaring more than deflate can expand the file to (about
    1032:1) is refused up front."""
    labels = writers.idx_bytes(np.arange(10, dtype=np.uint8))
    bomb = tmp_path / "bomb-idx1-ubyte.gz"
    bomb.write_bytes(gzip.compress(labels + bytes(8 << 20)))  # 8 MiB of trailing zeros in ~8 KiB
    assert bomb.stat().st_size < 64 << 10
    assert read_idx_bytes(bomb) == labels + b"\x00"  # the 8 header bytes, 10 labels, 1 byte to see the excess
    with pytest.raises(CorruptDataError, match="has trailing bytes"):
        read_idx(bomb, expected_magic=IDX_LABELS_MAGIC)
    huge = tmp_path / "huge-idx3-ubyte.gz"  # declares 2**16 x 2**16 x 2**8 bytes = 1 TiB
    huge.write_bytes(gzip.compress(bytes([0, 0, 8, 3, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0]) + bytes(1000)))
    with pytest.raises(CorruptDataError, match=r"huge-idx3-ubyte\.gz.*declares 1099511627776 B of data, more than "
                                               r"deflate can expand \d+ B to"):
        read_idx(huge)
    assert read_idx_bytes(writers.write_idx_gz(tmp_path / "ok-idx1-ubyte.gz", np.arange(10, dtype=np.uint8))) == labels
    junk = tmp_path / "junk.gz"  # not IDX inside: only its first bytes are read, for parse_idx's message
    junk.write_bytes(gzip.compress(b"PK\x03\x04" + bytes(1 << 20)))
    assert read_idx_bytes(junk) == b"PK\x03\x04" + bytes(64)
    with pytest.raises(CorruptDataError, match="bad IDX magic number 0x504b0304"):
        read_idx(junk)


def test_mnist_loader_on_the_staged_layout(tmp_path, writers):
    arrays = writers.write_mnist_layout(tmp_path, n_train=40, n_test=20)
    data = load_dataset(
        "mnist", root=tmp_path, verify=False, val_size=10, normalize=False, seed=0
    )
    assert data.meta["train_images"].startswith("reconstructed")
    assert data.meta["sizes"] == {"train": 30, "val": 10, "test": 20}
    assert data.x_train.shape[1:] == (1, 28, 28) and data.x_train.dtype == torch.float32
    # test split keeps the file order; pixels / 255
    expected = torch.from_numpy(arrays["test_images"]).float().div(255).unsqueeze(1)
    assert torch.equal(data.x_test, expected)
    assert data.y_test.tolist() == arrays["test_labels"].tolist()
    # train + val is the training file, each image with its own label
    x_all = torch.cat([data.x_train, data.x_val]).mul(255).round().to(torch.uint8).squeeze(1)
    y_all = torch.cat([data.y_train, data.y_val])
    pairs = zip(arrays["train_images"], arrays["train_labels"])
    ref = {img.tobytes(): lab for img, lab in pairs}
    assert sorted(ref[img.numpy().tobytes()] for img in x_all) == sorted(
        arrays["train_labels"].tolist()
    )
    assert all(ref[img.numpy().tobytes()] == lab for img, lab in zip(x_all, y_all.tolist()))
    other = load_dataset("mnist", root=tmp_path, verify=False, val_size=10, seed=1)
    assert not torch.equal(data.y_val, other.y_val)


def test_mnist_loader_prefers_the_official_train_images(tmp_path, writers):
    writers.write_mnist_layout(tmp_path, official=True)
    # also a rebuilt file with different content: must be ignored
    writers.write_idx_gz(
        tmp_path / "mnist_train_reconstructed" / "train-images-idx3-ubyte.gz",
        np.zeros((40, 28, 28), dtype=np.uint8),
    )
    data = load_dataset("mnist", root=tmp_path, verify=False, val_size=5, normalize=False)
    assert data.meta["train_images"] == "official"
    assert float(data.x_train.max()) > 0


def test_mnist_limits_and_normalisation(tmp_path, writers):
    writers.write_mnist_layout(tmp_path, n_train=50, n_test=30)
    data = load_dataset("mnist", root=tmp_path, verify=False, limit_train=20, limit_test=7)
    assert data.meta["sizes"] == {"train": 18, "val": 2, "test": 7}
    assert abs(float(data.x_train.mean())) < 1e-5 and data.mean is not None


def test_mnist_missing_and_damaged_files(tmp_path, writers):
    with pytest.raises(DataRootError, match="mnist_train_reconstructed/train-images-idx3-ubyte.gz"):
        load_dataset("mnist", root=tmp_path)
    writers.write_mnist_layout(tmp_path)
    labels = tmp_path / "mnist" / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz"
    # generated files sit at the staged paths, so the checksum table rejects them
    with pytest.raises(ChecksumError, match="expected SHA256 [0-9a-f]{64}, got [0-9a-f]{64}"):
        load_dataset("mnist", root=tmp_path)
    labels.write_bytes(gzip.compress(writers.idx_bytes(np.arange(19, dtype=np.uint8) % 10)))
    with pytest.raises(CorruptDataError, match="image and label counts differ"):
        load_dataset("mnist", root=tmp_path, verify=False)
    labels.write_bytes(gzip.compress(writers.idx_bytes(np.zeros((20, 28, 28), dtype=np.uint8))))
    with pytest.raises(CorruptDataError, match="magic number 0x00000803, expected 0x00000801"):
        load_dataset("mnist", root=tmp_path, verify=False)
    labels.write_bytes(labels.read_bytes()[:30])
    with pytest.raises(CorruptDataError, match="truncated"):
        load_dataset("mnist", root=tmp_path, verify=False)
