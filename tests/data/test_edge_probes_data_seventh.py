"""Edge probes, seventh pass: image datasets and their files (IDX reading, checksums, loaders called directly) and
the SSL task's view settings, checked against hand-made files, struct/numpy readings and the staged data."""

from __future__ import annotations

import gzip
import hashlib
import os
import struct

import numpy as np
import pytest

from diffusionformer.data.checksums import KNOWN_SHA256, sha256_file, verify_file
from diffusionformer.data.cifar10 import load_cifar10
from diffusionformer.data.idx import IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC, read_idx, read_idx_bytes
from diffusionformer.data.mnist import load_mnist
from diffusionformer.data.paths import ChecksumError, CorruptDataError
from diffusionformer.data.ssl import SSLConfig


def _labels_header(n: int) -> bytes:
    return struct.pack(">II", IDX_LABELS_MAGIC, n)


def test_bug_a_plain_idx_file_is_read_no_further_than_its_header_declares(tmp_path):
    """Bug: ``read_idx_bytes`` read an uncompressed IDX file whole before its header was looked at (only gzip streams
    were bounded), so a sparse file of 1 TiB holding three labels and "trailing bytes" that take no disk space was a
    bare ``MemoryError`` naming no file (or filled memory, for a sparse file of some tens of GiB). The file is now
    read one byte past the size its header declares, and never past its own size."""
    path = tmp_path / "t10k-labels-idx1-ubyte"
    with open(path, "wb") as f:
        f.write(_labels_header(3) + bytes([7, 8, 9]))
        f.truncate(1 << 26)  # 64 MiB, sparse where the file system allows (1 TiB was the MemoryError)
    assert read_idx_bytes(path) == _labels_header(3) + bytes([7, 8, 9, 0])  # 8 header bytes, 3 labels, 1 more
    with pytest.raises(CorruptDataError, match=r"t10k-labels-idx1-ubyte: IDX file has trailing bytes: header says "
                                               r"\(3,\) x 1 B = 3 B of data, found 4 B"):
        read_idx(path, expected_magic=IDX_LABELS_MAGIC)
    # a small file whose header declares 1 TiB, or more than an index can hold: read as far as the file goes
    for dims, declared in (((1 << 20, 1 << 20, 1), 1 << 40), (((1 << 32) - 1,) * 3, ((1 << 32) - 1) ** 3)):
        huge = tmp_path / "huge-idx3-ubyte"
        huge.write_bytes(struct.pack(">I3I", IDX_IMAGES_MAGIC, *dims) + bytes(10))
        assert len(read_idx_bytes(huge)) == 16 + 10
        with pytest.raises(CorruptDataError, match=rf"IDX file truncated: header says .* = {declared} B of data, "
                                                   r"found 10 B"):
            read_idx(huge, expected_magic=IDX_IMAGES_MAGIC)
    # well-formed files, plain and gzipped, read as numpy reads them
    labels = np.arange(10, dtype=np.uint8) % 7
    plain = tmp_path / "ok-idx1-ubyte"
    plain.write_bytes(_labels_header(10) + labels.tobytes())
    packed = tmp_path / "ok-idx1-ubyte.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    for p in (plain, packed):
        assert read_idx(p, expected_magic=IDX_LABELS_MAGIC).numpy().tolist() == labels.tolist()


def test_bug_a_replaced_file_of_the_same_size_and_mtime_is_checked_again(tmp_path, monkeypatch):
    """Bug: ``sha256_file`` remembered a hash per (path, size, mtime), so a data file replaced in the same process by
    a damaged copy of the same size that kept the time stamp (``cp -p``, ``rsync -a``, ``shutil.copy2``) got the old
    file's hash: ``verify_file`` passed it, and the CIFAR-10 cache (named by the hash) served the old decoded
    images. The key now holds the inode and the ctime too."""
    good, bad = b"official data!!!", b"official dat\x00!!!"
    assert len(good) == len(bad)
    monkeypatch.setitem(KNOWN_SHA256, "probe/x.bin", hashlib.sha256(good).hexdigest())
    path = tmp_path / "x.bin"
    path.write_bytes(good)
    assert verify_file(path, "probe/x.bin") == hashlib.sha256(good).hexdigest()
    st = path.stat()
    copy = tmp_path / ".x.bin.partial"
    copy.write_bytes(bad)
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))  # what cp -p / rsync -a / copy2 do
    os.replace(copy, path)
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert sha256_file(path) == hashlib.sha256(bad).hexdigest()
    with pytest.raises(ChecksumError, match=r"x\.bin.*expected SHA256"):
        verify_file(path, "probe/x.bin")
    assert sha256_file(path) == sha256_file(path)  # still remembered while the file stays as it is


@pytest.mark.parametrize("field,option,value", [
    ("crop_ratio", "ratio", (2.0, 1.0)),
    ("global_crop_scale", "global_scale", (0.5, 2.0)),
    ("local_crop_scale", "local_scale", (0.0, 0.3)),
])
def test_bug_ssl_config_names_its_own_crop_settings(field, option, value):
    """Bug: a bad ``crop_ratio``, ``global_crop_scale`` or ``local_crop_scale`` of ``SSLConfig`` (a ``[tasks.ssl]``
    key) was reported as "SSLConfig: MultiCropAugment.ratio / global_scale / local_scale must be ...", names that
    an ssl table does not have. The message now leads with the SSLConfig field."""
    with pytest.raises(ValueError, match=rf"^SSLConfig: {field} \(MultiCropAugment\.{option}\) must be a pair") as info:
        SSLConfig(**{field: value})
    assert f"got {tuple(float(v) for v in value)!r}" in str(info.value)
    with pytest.raises(ValueError, match=r"^SSLConfig: MultiCropAugment\.blur_sigma must be a pair"):
        SSLConfig(blur_sigma=(1.0, 0.5))  # a field of the same name keeps its message
    assert SSLConfig(**{field: (0.5, 0.9)}).augmentation() == SSLConfig(**{field: (0.5, 0.9)}).augmentation()


def test_bug_mnist_and_cifar10_take_a_str_root(tmp_path, writers):
    """Bug: ``load_mnist(root="/path")`` and ``load_cifar10(root="/path")`` (the loaders called directly, as
    ``load_tinyshakespeare`` may be) failed with "unsupported operand type(s) for /: 'str' and 'str'"."""
    arrays = writers.write_mnist_layout(tmp_path, n_train=20, n_test=10)
    data = load_mnist(root=str(tmp_path), verify=False, val_size=5, normalize=False)
    assert np.array_equal(data.x_test.squeeze(1).numpy(), arrays["test_images"].astype(np.float32) / 255)
    assert data.y_test.tolist() == arrays["test_labels"].tolist()
    batches = writers.write_cifar_batches(tmp_path / "cifar-10-batches-py", per_batch=4)
    cifar = load_cifar10(root=str(tmp_path), val_size=2, normalize=False)
    expected = batches["test_batch"].reshape(-1, 3, 32, 32).astype(np.float32) / 255
    assert np.array_equal(cifar.x_test.numpy(), expected) and cifar.meta["sizes"] == {"train": 18, "val": 2, "test": 4}


def test_staged_mnist_from_a_str_root_matches_a_struct_reading(real_root):
    """The staged MNIST test files, loaded from a str root with their checksums verified, against an independent
    gzip + struct + numpy reading of the IDX files."""
    raw = real_root / "mnist" / "MNIST" / "raw"

    def numpy_idx(path):
        blob = gzip.decompress(path.read_bytes())
        magic, = struct.unpack(">I", blob[:4])
        ndim = magic & 0xFF
        dims = struct.unpack(f">{ndim}I", blob[4:4 + 4 * ndim])
        assert magic >> 8 == 0x08 and len(blob) == 4 + 4 * ndim + int(np.prod(dims))
        return np.frombuffer(blob, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)

    images, labels = numpy_idx(raw / "t10k-images-idx3-ubyte.gz"), numpy_idx(raw / "t10k-labels-idx1-ubyte.gz")
    data = load_mnist(root=str(real_root), limit_train=200, val_size=20, normalize=False)
    assert data.x_test.shape == (10000, 1, 28, 28) and data.y_test.tolist() == labels.tolist()
    assert np.array_equal(data.x_test.squeeze(1).numpy(), images.astype(np.float32) / 255)
