"""CIFAR-10 readers on tiny generated JPEG zips and pickled batches, incl. damaged files."""

from __future__ import annotations

import io
import pickle
import zipfile

import numpy as np
import pytest
import torch

from diffusionformer.data import ChecksumError, CorruptDataError, DataRootError, load_dataset
from diffusionformer.data.cifar10 import read_cifar_batch, read_image_zip

pytest.importorskip("PIL", reason="Pillow decodes the JPEG archives")


@pytest.fixture()
def jpg_root(tmp_path, writers):
    writers.write_image_zip(tmp_path / "cifar10_jpg" / "train.zip", "train", per_class=4)
    writers.write_image_zip(tmp_path / "cifar10_jpg" / "test.zip", "test", per_class=2)
    return tmp_path


def test_read_image_zip_orders_classes_by_name(jpg_root, writers):
    CLASS_COLOURS = writers.CLASS_COLOURS
    images, labels, classes = read_image_zip(jpg_root / "cifar10_jpg" / "test.zip", "test")
    assert classes == sorted(CLASS_COLOURS) == ["airplane", "cat", "dog"]
    assert images.shape == (6, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.tolist() == [0, 0, 1, 1, 2, 2]
    for img, lab in zip(images, labels.tolist()):
        colour = torch.tensor(CLASS_COLOURS[classes[lab]], dtype=torch.float32)
        mean = img.float().mean(dim=(1, 2))
        assert torch.allclose(mean, colour, atol=6.0)  # JPEG is lossy, solid colours nearly exact
    sub, sub_labels, _ = read_image_zip(
        jpg_root / "cifar10_jpg" / "test.zip", "test", torch.tensor([1, 4])
    )
    assert torch.equal(sub, images[[1, 4]]) and sub_labels.tolist() == [0, 2]


def test_jpg_loader_caches_and_limits_consistently(jpg_root, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DIFFUSIONFORMER_CACHE", str(tmp_path_factory.mktemp("cifar_cache")))
    opts = dict(root=jpg_root, verify=False, normalize=False, val_size=2, source="jpg")
    cold = load_dataset("cifar10", limit_train=7, limit_test=3, **opts)  # decodes only the subset
    full = load_dataset("cifar10", **opts)  # decodes everything and writes the cache
    warm = load_dataset("cifar10", limit_train=7, limit_test=3, **opts)  # reads the cache
    assert full.meta["sizes"] == {"train": 10, "val": 2, "test": 6}
    assert cold.meta["sizes"] == {"train": 5, "val": 2, "test": 3}
    for split in ("train", "val", "test"):
        assert all(torch.equal(a, b) for a, b in zip(cold.split(split), warm.split(split)))
    assert full.class_names == ["airplane", "cat", "dog"] and full.num_classes == 3
    assert full.x_train.shape[1:] == (3, 32, 32) and 0.0 <= float(full.x_train.min())
    import os

    cached = sorted(os.listdir(os.environ["DIFFUSIONFORMER_CACHE"] + "/cifar10"))
    assert len(cached) == 2 and cached[0].startswith("test-") and cached[1].startswith("train-")


def test_jpg_loader_normalises_with_train_statistics(jpg_root):
    data = load_dataset("cifar10", root=jpg_root, verify=False, val_size=2)
    assert data.mean is not None and len(data.mean) == 3
    per_channel = data.x_train.mean(dim=(0, 2, 3))
    assert torch.allclose(per_channel, torch.zeros(3), atol=1e-4)


def test_jpg_checksum_and_missing_files(jpg_root, tmp_path_factory):
    with pytest.raises(ChecksumError, match=r"cifar10_jpg/train\.zip\): expected SHA256 db1d97e2"):
        load_dataset("cifar10", root=jpg_root, val_size=2)
    empty = tmp_path_factory.mktemp("empty")
    with pytest.raises(DataRootError, match=r"cifar10_jpg/test\.zip[\s\S]*cifar-10-batches-py"):
        load_dataset("cifar10", root=empty)


def test_damaged_zip_and_image_give_clear_errors(tmp_path):
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"PK\x03\x04 this is not a zip")
    with pytest.raises(CorruptDataError, match="corrupt zip archive"):
        read_image_zip(bad, "train")
    broken = tmp_path / "broken.zip"
    with zipfile.ZipFile(broken, "w") as zf:
        zf.writestr("train/cat/0000.jpg", b"\xff\xd8\xff garbage")
    with pytest.raises(CorruptDataError, match=r"cannot decode 'train/cat/0000\.jpg'"):
        read_image_zip(broken, "train")
    with pytest.raises(CorruptDataError, match="holds no 'test/<class>/<image>' entries"):
        read_image_zip(broken, "test")


def test_an_image_beyond_pillows_pixel_limit_is_refused(tmp_path, monkeypatch):
    """Bug: an entry with more pixels than ``PIL.Image.MAX_IMAGE_PIXELS`` (but fewer than twice that, where Pillow
    itself raises) was decoded after a mere ``DecompressionBombWarning``, and every image was then allocated at
    its size; it is now a ``CorruptDataError`` naming the entry."""
    from PIL import Image

    path = tmp_path / "bomb.zip"
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (10, 20, 30)).save(buf, format="PNG")
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("train/cat/0000.png", buf.getvalue())
    images, _, _ = read_image_zip(path, "train")
    assert images.shape == (1, 3, 16, 16) and images[0, :, 0, 0].tolist() == [10, 20, 30]
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 200)  # 256 pixels: above the limit, below twice it
    with pytest.raises(CorruptDataError, match=r"bomb\.zip.*cannot decode 'train/cat/0000\.png'.*exceeds limit"):
        read_image_zip(path, "train")


def test_pickled_batches_are_preferred_and_read_exactly(tmp_path, writers):
    arrays = writers.write_cifar_batches(tmp_path / "cifar-10-batches-py", per_batch=4)
    writers.write_image_zip(tmp_path / "cifar10_jpg" / "train.zip", "train")  # present, unused
    data = load_dataset("cifar10", root=tmp_path, normalize=False, val_size=4)
    assert data.meta["source"].startswith("official python batches")
    assert data.meta["sizes"] == {"train": 16, "val": 4, "test": 4}
    expected_test = torch.from_numpy(arrays["test_batch"].reshape(4, 3, 32, 32)).float() / 255
    assert torch.equal(data.x_test, expected_test)
    assert data.class_names[:3] == ["airplane", "automobile", "bird"]
    train_pool = np.concatenate([arrays[f"data_batch_{i}"] for i in range(1, 6)])
    got = torch.cat([data.x_train, data.x_val]).mul(255).round().to(torch.uint8).reshape(20, -1)
    assert sorted(map(bytes, got.numpy())) == sorted(map(bytes, train_pool))


def test_damaged_or_hostile_pickles_are_refused(tmp_path, writers):
    folder = tmp_path / "cifar-10-batches-py"
    writers.write_cifar_batches(folder)
    (folder / "data_batch_3").write_bytes((folder / "data_batch_3").read_bytes()[:100])
    with pytest.raises(CorruptDataError, match="corrupt CIFAR batch .*data_batch_3"):
        load_dataset("cifar10", root=tmp_path)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    evil = tmp_path / "evil"
    evil.write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(CorruptDataError, match="builtins.print is not allowed"):
        read_cifar_batch(evil)
    (folder / "data_batch_5").unlink()
    with pytest.raises(DataRootError, match="data_batch_5"):
        load_dataset("cifar10", root=tmp_path, source="pickle")


def test_bad_source_option():
    with pytest.raises(ValueError, match="source must be 'auto', 'pickle' or 'jpg'"):
        load_dataset("cifar10", root="/nonexistent", source="png")


def test_a_missing_path_is_named_as_missing_not_corrupt(tmp_path):
    """Bug: a missing file passed to read_image_zip was reported as a "corrupt zip archive",
    sending the user to re-download good data instead of fixing the path."""
    with pytest.raises(FileNotFoundError, match=r"No such file.*nowhere\.zip"):
        read_image_zip(tmp_path / "nowhere.zip", "train")
