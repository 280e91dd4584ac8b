"""Edge probes, tenth pass: the CIFAR-10 JPEG loader against Pillow/NumPy references on the staged zips, its
decoded-array cache (a file changed after it was written) and ``read_image_zip``'s ``indices``."""

from __future__ import annotations

import hashlib
import io
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from diffusionformer.data import CACHE_ENV, load_dataset
from diffusionformer.data.cifar10 import CIFAR10_CLASSES, read_image_zip
from diffusionformer.data.splits import carve_val, seeded_subset

Image = pytest.importorskip("PIL.Image")


def _png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _cifar_zips(writers, root: Path) -> Path:
    """train.zip: 3 cats and 3 dogs of 4x4 distinct random pixels; test.zip: one of each."""
    rng = np.random.default_rng(0)
    train = [(f"train/{c}/{i}.png", _png(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)))
             for c in ("dog", "cat") for i in range(3)]
    path = writers.write_stored_zip(root / "cifar10_jpg" / "train.zip", train)
    writers.write_stored_zip(root / "cifar10_jpg" / "test.zip",
                             [(f"test/{c}/0.png", _png(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)))
                              for c in ("cat", "dog")])
    return path


def _train_pixels(data) -> list[bytes]:
    x = torch.cat([data.x_train, data.x_val]).mul(255).round().to(torch.uint8)
    return sorted(bytes(img.numpy().tobytes()) for img in x)


@pytest.mark.parametrize("change", ["pixel", "label"])
def test_bug_a_cifar_cache_file_changed_after_caching_is_refused_and_rebuilt(tmp_path, monkeypatch, writers, change):
    """Bug: ``data.paths.load_cached`` (cifar10's and mnist-mini's decoded arrays) served any cache file of the
    right types and shapes: ``torch.load`` checks no CRC, so a cache file with a flipped pixel or label byte (disk
    damage) loaded as the dataset, silently. It now checks the CRC-32 of every entry first (as ``load_checkpoint``
    does), and a damaged file is refused with a warning and decoded again from the (verified) zip."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    train = _cifar_zips(writers, tmp_path)
    kw = dict(root=tmp_path, source="jpg", verify=False, normalize=False, val_size=1)
    first = load_dataset("cifar10", **kw)
    digest = hashlib.sha256(train.read_bytes()).hexdigest()
    cached = tmp_path / "cache" / "cifar10" / f"train-{digest[:16]}.pt"
    size = 6 * 3 * 4 * 4 if change == "pixel" else 6 * 8  # the images' uint8 bytes, the labels' int64 bytes
    with zipfile.ZipFile(cached) as archive:
        (info,) = [i for i in archive.infolist() if "/data/" in i.filename and i.file_size == size]
    data = bytearray(cached.read_bytes())
    nlen, xlen = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    data[info.header_offset + 30 + nlen + xlen + 3] ^= 1  # one bit of a pixel, or of the first label
    cached.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match=r"cached file refused and rebuilt: .*train-.*: its entry .* fails its CRC-32"):
        again = load_dataset("cifar10", **kw)
    assert _train_pixels(again) == _train_pixels(first)
    assert torch.equal(again.y_train, first.y_train) and torch.equal(again.y_val, first.y_val)
    fresh = torch.load(cached, weights_only=True)  # rewritten, and now read without a warning
    assert fresh["labels"].tolist() == [0, 0, 0, 1, 1, 1]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        load_dataset("cifar10", **kw)


@pytest.mark.parametrize(
    ("indices", "error", "match"),
    [(torch.tensor([True, False, True]), TypeError, r"indices must be an integer tensor of positions, got torch\.bool"),
     (torch.tensor([0.0, 1.0]), TypeError, r"integer tensor of positions, got torch\.float32"),
     (torch.tensor([-1]), ValueError, r"indices must lie in \[0, 6\) for 6 entries, got -1 at position 0"),
     (torch.tensor([0, 6]), ValueError, r"got 6 at position 1"),
     (torch.tensor([], dtype=torch.int64), ValueError, r"non-empty 1-D tensor, got shape \(0,\)"),
     (torch.tensor([[0, 1]]), ValueError, r"non-empty 1-D tensor, got shape \(1, 2\)")],
    ids=["bool-mask", "float", "negative", "past-the-end", "empty", "2-d"],
)
def test_bug_read_image_zip_refuses_indices_that_are_not_positions(tmp_path, writers, indices, error, match):
    """Bug: cifar10.py ``read_image_zip`` used ``indices.tolist()`` as list positions unchecked: a bool mask
    ``[True, False, True]`` decoded entries 1, 0, 1 (three images, labels of the wrong entries), a negative
    position wrapped to the last entry, and an empty tensor failed with a bare ``AssertionError``."""
    train = _cifar_zips(writers, tmp_path)
    with pytest.raises(error, match=match):
        read_image_zip(train, "train", indices)
    x, y, _ = read_image_zip(train, "train", torch.tensor([5, 0]))  # plain positions still work
    full, labels, _ = read_image_zip(train, "train")
    assert torch.equal(x, full[[5, 0]]) and torch.equal(y, labels[[5, 0]])


def test_staged_cifar10_subset_loads_like_pillow_with_float64_train_statistics(real_root, tmp_path, monkeypatch):
    """The loader's seeded subset of the staged JPEG zips equals Pillow's decoding of the same members (exact
    uint8), labels are the ranks of the class folders, and the normalisation uses the float64 per-channel mean
    and population std of the training part only."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    seed, n_train, n_test = 5, 60, 20
    data = load_dataset("cifar10", root=real_root, seed=seed, limit_train=n_train, limit_test=n_test, val_size=10)
    assert data.class_names == CIFAR10_CLASSES
    ref = {}
    for split, n in (("train", n_train), ("test", n_test)):
        with zipfile.ZipFile(real_root / "cifar10_jpg" / f"{split}.zip") as zf:
            names = sorted(n_ for n_ in zf.namelist() if n_.endswith(".jpg"))
            assert len(names) == (50_000 if split == "train" else 10_000)
            pick = [names[i] for i in seeded_subset(len(names), n, seed).tolist()]
            pixels = []
            for name in pick:
                with Image.open(io.BytesIO(zf.read(name))) as im:
                    pixels.append(np.asarray(im.convert("RGB"), dtype=np.float64).transpose(2, 0, 1) / 255.0)
            labels = np.array([CIFAR10_CLASSES.index(name.split("/")[1]) for name in pick])
            ref[split] = (np.stack(pixels), labels)
    train_idx, val_idx = carve_val(n_train, 10, seed)
    x_tr, y_tr = ref["train"][0][train_idx.numpy()], ref["train"][1][train_idx.numpy()]
    mean = x_tr.mean(axis=(0, 2, 3))
    std = np.sqrt(((x_tr - mean[None, :, None, None]) ** 2).mean(axis=(0, 2, 3)))
    np.testing.assert_allclose(data.mean, mean, rtol=0, atol=1e-7)  # float32 pixels p / 255
    np.testing.assert_allclose(data.std, std, rtol=0, atol=1e-7)  # float32 pixels p / 255

    def norm(x):
        return (x - mean[None, :, None, None]) / std[None, :, None, None]

    np.testing.assert_allclose(data.x_train.numpy(), norm(x_tr), atol=2e-5)
    np.testing.assert_array_equal(data.y_train.numpy(), y_tr)
    np.testing.assert_allclose(data.x_val.numpy(), norm(ref["train"][0][val_idx.numpy()]), atol=2e-5)
    np.testing.assert_array_equal(data.y_val.numpy(), ref["train"][1][val_idx.numpy()])
    # the test subset in a seeded random order (the zip lists it class by class): the first n_test of the whole
    # split's, that is seeded_subset's draw before it sorts it
    drawn = torch.randperm(10_000, generator=torch.Generator().manual_seed(seed))[:n_test]
    order = torch.searchsorted(drawn.sort().values, drawn).numpy()
    ref["test"] = (ref["test"][0][order], ref["test"][1][order])
    np.testing.assert_allclose(data.x_test.numpy(), norm(ref["test"][0]), atol=2e-5)
    np.testing.assert_array_equal(data.y_test.numpy(), ref["test"][1])
    # exact uint8: undo the normalisation of the loader's own numbers
    raw = (data.x_test.double() * torch.tensor(data.std).view(1, 3, 1, 1) + torch.tensor(data.mean).view(1, 3, 1, 1))
    assert torch.equal(raw.mul(255).round().to(torch.uint8),
                       torch.from_numpy(np.round(ref["test"][0] * 255)).to(torch.uint8))
    assert not (tmp_path / "cache" / "cifar10").exists() or not list((tmp_path / "cache" / "cifar10").iterdir())
