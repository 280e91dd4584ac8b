"""MNIST (LeCun, Cortes & Burges) from IDX files under the data root.

Standard layout, as torchvision's ``MNIST(root)`` (each file may be gzipped or not)::

    <root>/mnist/MNIST/raw/train-images-idx3-ubyte[.gz]   (official; optional, see below)
    <root>/mnist/MNIST/raw/train-labels-idx1-ubyte[.gz]
    <root>/mnist/MNIST/raw/t10k-images-idx3-ubyte[.gz]
    <root>/mnist/MNIST/raw/t10k-labels-idx1-ubyte[.gz]
    <root>/mnist_train_reconstructed/train-images-idx3-ubyte.gz

When the official training images are absent (as in the staged root, where the file was too
large for the source snapshot), the rebuilt file under ``mnist_train_reconstructed/`` is used:
within one grey level of the official pixels (97% exact), labels and order identical; the
choice is recorded in ``meta["train_images"]``. The IDX files are parsed here (magic numbers
and sizes checked). Val is carved from the 60,000 training images: 5,000 random ones (seeded),
leaving 55,000 for train; test is the official 10,000.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from .base import ClassificationData, _check_flags
from .checksums import _check_size, _check_unchanged, sha256_file, verify_file
from .idx import IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC, _MAX_GZIP_BYTES, _check_gzip_size, parse_idx, read_idx_bytes
from .images import build_image_data
from .paths import CorruptDataError, require_files
from .registry import register_dataset
from .splits import _check_limit, _require_carved_val, carve_val, seeded_subset

__all__ = ["load_mnist"]

RAW = "mnist/MNIST/raw"
RECONSTRUCTED = "mnist_train_reconstructed/train-images-idx3-ubyte"
_LAYOUT = (
    f"The training images may be the official {RAW}/train-images-idx3-ubyte.gz or the rebuilt "
    f"{RECONSTRUCTED}.gz; each file may also be stored uncompressed (without .gz)."
)


def _locate(root: Path | None, stem: str) -> str | None:
    """Relative path of ``stem`` or ``stem.gz`` under ``root``, whichever exists."""
    if root is None:
        return None
    for rel in (f"{stem}.gz", stem):
        if (root / rel).is_file():
            return rel
    return None


def _read(root: Path, rel: str, magic: int, verify: bool) -> Tensor:
    path = root / rel
    if verify:  # hashed below before it is read: a sparse .gz of 1 TiB was hashed whole before read_idx_bytes refused it
        _check_gzip_size(path)
        _check_size(path, _MAX_GZIP_BYTES, "any IDX file")  # stored plain: read_idx_bytes reads its header only
    digest = sha256_file(path) if verify else ""
    raw = read_idx_bytes(path)
    if verify:  # the file rewritten after the read: verify_file checked the new file, not the bytes read
        _check_unchanged(path, digest)
        verify_file(path, rel, content=raw)
    return parse_idx(raw, expected_magic=magic, source=str(path))


@register_dataset("mnist", kind="image", needs_root=True)
def load_mnist(
    *,
    root: Path | None,
    seed: int = 0,
    val_size: int | None = None,
    limit_train: int | None = None,
    limit_test: int | None = None,
    normalize: bool = True,
    verify: bool = True,
) -> ClassificationData:
    """MNIST from the data root: 55,000/5,000/10,000 train/val/test, 28x28, 1 channel.

    Args:
        root: data root (see the module docstring for the layout).
        seed: seed of the val carve and of the ``limit_*`` subsets.
        val_size: training images held out for val (``None``: ``min(5000, n // 10)``, i.e.
            5,000 for the full set); an empty val part is a ``ValueError``.
        limit_train: use a seeded random subset of this many training images (quick runs).
        limit_test: use a seeded random subset of this many test images.
        normalize: standardise with the training split's mean/std.
        verify: check the staged files' SHA256 (or their decompressed content's).

    Shapes:
        - x: ``(N, 1, 28, 28)`` float32; y: ``(N,)`` int64, 10 classes.
    """
    _check_flags("load_mnist", normalize=normalize, verify=verify)
    for option, limit in (("limit_train", limit_train), ("limit_test", limit_test)):
        _check_limit(f"load_mnist: {option}", limit)  # before any file is read or hashed
    root = None if root is None else Path(root)  # a str root (the loader called directly): "str / str" failed
    stems = {
        "train_labels": f"{RAW}/train-labels-idx1-ubyte",
        "test_images": f"{RAW}/t10k-images-idx3-ubyte",
        "test_labels": f"{RAW}/t10k-labels-idx1-ubyte",
    }
    rels = {key: _locate(root, stem) for key, stem in stems.items()}
    official = _locate(root, f"{RAW}/train-images-idx3-ubyte")
    rels["train_images"] = official or _locate(root, RECONSTRUCTED)
    if root is None or any(rel is None for rel in rels.values()):
        defaults = {key: f"{stem}.gz" for key, stem in stems.items()}
        defaults["train_images"] = f"{RECONSTRUCTED}.gz"
        wanted = [rel or defaults[key] for key, rel in rels.items()]
        require_files("mnist", root, wanted, layout=_LAYOUT)  # raises: something is missing
        raise AssertionError("unreachable: require_files found every file")
    found: dict[str, str] = {key: rel for key, rel in rels.items() if rel is not None}

    train_images = _read(root, found["train_images"], IDX_IMAGES_MAGIC, verify)
    train_labels = _read(root, found["train_labels"], IDX_LABELS_MAGIC, verify)
    test_images = _read(root, found["test_images"], IDX_IMAGES_MAGIC, verify)
    test_labels = _read(root, found["test_labels"], IDX_LABELS_MAGIC, verify)
    for key, images in (("train_images", train_images), ("test_images", test_images)):
        if tuple(images.shape[1:]) != (28, 28):  # the header's sizes: 10 x 10 images loaded as a smaller MNIST
            raise CorruptDataError(f"mnist: {str(root / found[key])!r} holds images of shape {tuple(images.shape)}, "
                                   f"expected (N, 28, 28)")
    if len(train_images) != len(train_labels) or len(test_images) != len(test_labels):
        raise CorruptDataError(
            f"mnist: image and label counts differ (train {len(train_images)} vs "
            f"{len(train_labels)}, test {len(test_images)} vs {len(test_labels)})"
        )
    if not len(train_labels):  # else carve_val's "val_size must be in [0, 0)", naming no file
        raise CorruptDataError(f"mnist: {str(root / found['train_images'])!r} and {str(root / found['train_labels'])!r} "
                               "hold no training examples")
    for split, labels in (("train", train_labels), ("test", test_labels)):
        if labels.numel() and int(labels.max()) > 9:
            raise CorruptDataError(f"mnist: {split} labels must be 0..9, found {int(labels.max())}")

    keep = seeded_subset(len(train_labels), limit_train, seed)
    train_images, train_labels = train_images[keep], train_labels[keep]
    keep_test = seeded_subset(len(test_labels), limit_test, seed)
    test_images, test_labels = test_images[keep_test], test_labels[keep_test]
    train_idx, val_idx = carve_val(len(train_labels), val_size, seed)
    _require_carved_val("mnist", val_idx, len(train_labels), val_size)
    return build_image_data(
        "mnist",
        train_images.unsqueeze(1),
        train_labels,
        (train_idx, val_idx, val_idx[:0]),
        num_classes=10,
        normalize=normalize,
        test=(test_images.unsqueeze(1), test_labels),
        meta={
            "source": "MNIST IDX files (LeCun, Cortes, Burges)",
            "licence": "usually given as CC BY-SA 3.0",
            "train_images": "official" if official else "reconstructed (within 1 grey level)",
            "files": {key: str(root / rel) for key, rel in found.items()},
            "split": f"val = {len(val_idx)} seeded random training images (seed={seed})",
        },
    )
