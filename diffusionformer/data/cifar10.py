"""CIFAR-10 (Krizhevsky, "Learning Multiple Layers of Features from Tiny Images", 2009).

Two sources under the data root, tried in this order by ``source="auto"``:

1. the official pickled batches, ``<root>/cifar-10-batches-py/{data_batch_1..5, test_batch}``
   (torchvision's layout; ``batches.meta`` gives the class names when present). They are read
   with a restricted unpickler that only rebuilds NumPy arrays, so a doctored file cannot run
   code;
2. the JPEG archives ``<root>/cifar10_jpg/{train,test}.zip`` holding
   ``<split>/<class>/NNNN.jpg`` with class index = rank of the class name in sorted order
   (the official label order). JPEG re-encoding makes pixels differ from the official ones
   (see the staged README), so numbers are not strictly comparable to published results.
   Decoding is done with Pillow once; the uint8 arrays are cached in
   ``$DIFFUSIONFORMER_CACHE/cifar10/<split>-<sha256 prefix of the zip>.pt`` (its CRCs checked on every read:
   a cache file changed since it was written is decoded again, with a warning).

Val is carved from the 50,000 training images (5,000 seeded random ones: 45,000/5,000/10,000).
Train and val come in a seeded random order; so does the test split of the JPEG zips (which list it
class by class), while the official ``test_batch`` keeps its own (shuffled) order.
``limit_train``/``limit_test`` take seeded random subsets for quick runs; with a cold cache
only those images are decoded, and the subset is the same whether the cache exists or not (in the
order of the whole split: a ``limit_test`` subset of the zips' test split is its first ``limit_test`` images).
"""

from __future__ import annotations

import io
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from diffusionformer._files import zip_method_refusal
from diffusionformer.config import _choice_hint

from ._optional import import_optional
from ._unpickle import _NUMPY_GLOBALS, _plain
from .base import ClassificationData, _check_flags
from .checksums import _check_size, _check_unchanged, sha256_file, verify_file
from .images import _labelled_images_fit, build_image_data
from .paths import CorruptDataError, cache_dir, load_cached, require_files, save_cached
from .registry import register_dataset
from .splits import _check_limit, _require_carved_val, carve_val, generator, seeded_subset

__all__ = [
    "CIFAR10_CLASSES", "read_image_zip", "read_cifar_batch", "read_cifar_meta", "load_cifar10",
]  # fmt: skip

CIFAR10_CLASSES = [
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
]  # fmt: skip
BATCHES_DIR = "cifar-10-batches-py"
TRAIN_BATCHES = [f"data_batch_{i}" for i in range(1, 6)]
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
#: the formats Pillow may decode an entry as, whatever its name (Pillow guesses from the content, and a ".jpg"
#: holding EPS would be handed to Ghostscript)
_IMAGE_FORMATS = ("JPEG", "PNG")
#: uncompressed bytes of one image entry: an uncompressed RGBA PNG of Pillow's largest image (MAX_IMAGE_PIXELS)
_MAX_IMAGE_BYTES = 2**29
#: bytes of a zip archive of images, hashed whole before it is read (CIFAR-10's train.zip: 52 MB)
_MAX_ZIP_BYTES = 2**32


def _zip_members(zf: zipfile.ZipFile, split: str) -> list[tuple[str, str]]:
    """Sorted ``(class, member)`` pairs of the ``<split>/<class>/<image>`` entries."""
    members = []
    for name in zf.namelist():
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == split and parts[2].lower().endswith(_IMAGE_SUFFIXES):
            members.append((parts[1], name))
    return sorted(members)


def _open_zip(path: Path) -> zipfile.ZipFile:
    """Open a zip archive; a missing or unreadable path keeps its OS error, not "corrupt"."""
    try:
        return zipfile.ZipFile(path)
    except (FileNotFoundError, PermissionError):
        raise  # the path is wrong or unreadable, the data is not damaged: keep the OS message
    except (zipfile.BadZipFile, OSError, NotImplementedError, ValueError) as err:
        # NotImplementedError: a zip version beyond zipfile's; ValueError: an entry name flagged UTF-8 that is not
        raise CorruptDataError(f"corrupt zip archive {str(path)!r}: {err}") from None


def read_image_zip(
    path: Path, split: str, indices: Tensor | None = None
) -> tuple[Tensor, Tensor, list[str]]:
    """Decode the images of an ``ImageFolder``-style zip (``<split>/<class>/<file>``).

    Entries are ordered by (class name, file name); the class index is the rank of the class
    name among the sorted names. Every image is decoded as JPEG or PNG (whatever its name says),
    converted to RGB and must have the size of the first one.

    Args:
        path: the zip file.
        split: the top-level folder to read (``"train"`` or ``"test"``).
        indices: decode only these positions of the ordered entry list (a non-empty 1-D integer tensor
            of positions in ``[0, number of entries)``).

    Returns:
        ``(images, labels, classes)``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        TypeError, ValueError: ``indices`` that are not such positions (a bool mask, an empty or negative one).
        CorruptDataError: not a zip (a folder included), no matching entries, two entries of one name, an
            entry without a class folder name (``train//x.jpg``, ``train/../x.jpg``), an entry that is no JPEG or PNG, has samples wider than
            8 bits (a 16-bit PNG), that Pillow cannot decode or calls a decompression bomb (more pixels than
            ``PIL.Image.MAX_IMAGE_PIXELS``) or that declares more than 512 MiB uncompressed (an entry is
            inflated no further than it declares), one compressed with bzip2 or LZMA, an image of another
            size than the first one, or more images of the first one's size than memory holds.

    Shapes:
        - images: ``(N, 3, H, W)`` uint8
        - labels: ``(N,)`` int64
    """
    image_mod = import_optional("PIL.Image", package="pillow", dataset="cifar10")
    with _open_zip(path) as zf:
        members = _zip_members(zf, split)
        if not members:
            raise CorruptDataError(
                f"{str(path)!r} holds no '{split}/<class>/<image>' entries "
                f"(expected e.g. {split}/airplane/0000.jpg)"
            )
        classes = sorted({c for c, _ in members})
        if bad := [c for c in classes if c in ("", ".", "..")]:  # "train/../x.jpg" made a class ".." ranked first
            name = next(n for c, n in members if c == bad[0])
            raise CorruptDataError(f"{str(path)!r}: entry {name!r} has no class folder name (got {bad[0]!r})")
        # zipfile reads the last of two members of one name for both: an image twice (in train and val, perhaps)
        if twice := next((n for (_, n), (_, m) in zip(members, members[1:]) if n == m), None):
            raise CorruptDataError(f"{str(path)!r}: holds two entries named {twice!r} (an archive appended to, or "
                                   "a hand-built one): each would read the last copy")
        class_index = {c: i for i, c in enumerate(classes)}
        if indices is not None:
            members = [members[i] for i in _checked_indices(indices, len(members))]
        labels = torch.tensor([class_index[c] for c, _ in members], dtype=torch.int64)
        images: np.ndarray | None = None
        for i, (_, name) in enumerate(members):
            info = zf.getinfo(name)
            declared = info.file_size
            if declared > _MAX_IMAGE_BYTES:  # zf.read would inflate it all (a small zip of a deflated multi-GB entry)
                raise CorruptDataError(f"{str(path)!r}: {name!r} declares {declared} B uncompressed, more than any "
                                       f"image file ({_MAX_IMAGE_BYTES} B at most)")
            if refused := zip_method_refusal(info):
                raise CorruptDataError(f"{str(path)!r}: {refused}")
            try:
                with warnings.catch_warnings():
                    # Pillow only warns between MAX_IMAGE_PIXELS and twice that: here a decompression bomb is refused
                    warnings.simplefilter("error", image_mod.DecompressionBombWarning)
                    with image_mod.open(io.BytesIO(_read_entry(zf, info)), formats=_IMAGE_FORMATS) as im:
                        wide = im.mode in ("I", "F") or im.mode.startswith("I;")  # convert("RGB") clips them at 255
                        # a 16-bit RGB(A) or LA PNG opens as mode RGB/RGBA, Pillow keeping only each sample's high byte
                        raw16 = next((str(t[3]) for t in im.tile if ";16" in str(t[3])), None)
                        if wide or raw16:
                            what = f"mode {im.mode!r}" if wide else f"raw mode {raw16!r}"
                            raise ValueError(f"{what} has samples wider than 8 bits (only 8-bit images are read)")
                        pixels = np.asarray(im.convert("RGB"))
            except Exception as err:  # PIL raises several types for damaged images
                # (Pillow's "cannot identify image file <_io.BytesIO ...>" names a buffer, not the entry)
                why = "not such an image" if isinstance(err, image_mod.UnidentifiedImageError) else err
                raise CorruptDataError(
                    f"{str(path)!r}: cannot decode {name!r} as {' or '.join(_IMAGE_FORMATS)}: {why}") from None
            if images is None:
                try:
                    images = np.empty((len(members), *pixels.shape), dtype=np.uint8)
                except MemoryError:
                    raise CorruptDataError(
                        f"{str(path)!r}: {len(members)} images of {name!r}'s size ({pixels.shape[0]} x "
                        f"{pixels.shape[1]}) do not fit in memory") from None
            if pixels.shape != images.shape[1:]:
                raise CorruptDataError(
                    f"{str(path)!r}: {name!r} has shape {pixels.shape}, "
                    f"expected {images.shape[1:]} like the first image"
                )
            images[i] = pixels
    assert images is not None  # members is non-empty
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), labels, classes


def _read_entry(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """The bytes of a stored or deflated entry, inflated no further than its declared size (``zf.read`` inflates the
    whole stream before cutting it there: 100 B declared, 400 MB in memory)."""
    with zf.open(info) as member:
        return member.read(info.file_size)


def _checked_indices(indices: Any, n: int) -> list[int]:
    """``indices`` of :func:`read_image_zip` as a list: a non-empty 1-D integer tensor of positions in ``[0, n)``
    (a bool mask read its True/False as positions 1/0, a negative position wrapped to the end, an empty one
    failed with a bare ``AssertionError``)."""
    if not isinstance(indices, Tensor) or indices.dtype == torch.bool or indices.is_floating_point() \
            or indices.is_complex():
        what = indices.dtype if isinstance(indices, Tensor) else type(indices).__name__
        raise TypeError(f"read_image_zip: indices must be an integer tensor of positions, got {what}")
    if indices.dim() != 1 or not indices.numel():
        raise ValueError(f"read_image_zip: indices must be a non-empty 1-D tensor, got shape {tuple(indices.shape)}")
    bad = (indices < 0) | (indices >= n)
    if bool(bad.any()):
        raise ValueError(f"read_image_zip: indices must lie in [0, {n}) for {n} entries, got "
                         f"{int(indices[bad][0])} at position {int(bad.nonzero()[0, 0])}")
    return indices.tolist()


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler for CIFAR batches: rebuilds NumPy arrays of booleans, numbers and fixed-width strings and
    nothing else, each from the bytes the file holds (see ``_unpickle.py``)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _NUMPY_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")
        return _NUMPY_GLOBALS[module, name]


def _shown(item: Any) -> str:
    """A key or name of a file for a message: ``repr`` of a string, a bytes object or a number of at most 64
    bits, else the type in angle brackets (``str`` of a 5,000-digit int raises, ``repr`` of a tuple nested
    thousands deep too, and of a list nested as ``[L, L]`` 60 deep never ends)."""
    if isinstance(item, (str, bytes, float, type(None))) or (isinstance(item, int) and item.bit_length() <= 64):
        return repr(item)
    return f"<{type(item).__name__}>"


def _unpickle(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            obj = _plain(_NumpyOnlyUnpickler(f, encoding="bytes").load())
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, LookupError,
            MemoryError, OverflowError) as err:  # a lying size field asks for more than memory holds
        raise CorruptDataError(f"corrupt CIFAR batch {str(path)!r}: {str(err) or type(err).__name__}") from None
    if not isinstance(obj, dict):
        raise CorruptDataError(
            f"corrupt CIFAR batch {str(path)!r}: expected a dict, got {type(obj).__name__}"
        )
    return {k.decode(errors="replace") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def read_cifar_batch(path: Path) -> tuple[Tensor, Tensor]:
    """Read one official CIFAR-10 python batch (a pickled dict with ``data`` and ``labels``).

    ``data`` must be a uint8 array of ``N >= 1`` rows of 3,072 pixels and ``labels`` ``N``
    integers in ``[0, 10)``.

    Raises:
        CorruptDataError: unreadable pickle, missing keys, a wrong shape or dtype, differing
            counts, or a label outside ``[0, 10)``.

    Shapes:
        - images: ``(N, 3, 32, 32)`` uint8 (rows of ``data`` are R, G, B planes of 32x32)
        - labels: ``(N,)`` int64
    """
    batch = _unpickle(path)
    where = f"corrupt CIFAR batch {str(path)!r}"
    if "data" not in batch or "labels" not in batch:
        keys = sorted(batch, key=lambda k: k if isinstance(k, str) else _shown(k))  # str(k) of a hostile key raises
        raise CorruptDataError(f"{where}: expected keys 'data' and 'labels', got [{', '.join(map(_shown, keys))}]")
    data, labels = batch["data"], batch["labels"]
    if isinstance(labels, (list, tuple)) and (nested := next(
            (v for v in labels if isinstance(v, (list, tuple, dict, set, frozenset, np.ndarray))), None)) is not None:
        # before np.asarray: 31 levels of [L, L] in 300 bytes are an array of 2**31 labels
        raise CorruptDataError(f"{where}: labels are not a flat list of integers (an item is a {type(nested).__name__})")
    try:
        labels = np.asarray(labels)
    except ValueError as err:  # ragged nesting
        raise CorruptDataError(f"{where}: labels are not a flat list of integers: {err}") from None
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
        what = f"{data.dtype} array" if isinstance(data, np.ndarray) else type(data).__name__
        raise CorruptDataError(f"{where}: data must be a uint8 array, got {what}")
    if labels.dtype.kind not in "iu" and labels.size:
        raise CorruptDataError(f"{where}: labels must be integers, got {labels.dtype}")
    N = data.shape[0] if data.ndim else 0
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or labels.shape != (N,) or not N:
        raise CorruptDataError(
            f"{where}: data {data.shape} and labels {labels.shape} do not form (N, 3072) and "
            f"(N,) with N >= 1"
        )
    num_classes = len(CIFAR10_CLASSES)
    bad = (labels < 0) | (labels >= num_classes)
    if bad.any():
        i = int(bad.nonzero()[0][0])
        raise CorruptDataError(
            f"{where}: labels must lie in [0, {num_classes}), found {int(labels[i])} at position "
            f"{i} ({int(bad.sum())} out of range)"
        )
    images = torch.from_numpy(data.reshape(-1, 3, 32, 32).copy())
    return images, torch.from_numpy(labels.astype(np.int64))


def read_cifar_meta(path: Path) -> list[str]:
    """The 10 class names of a ``batches.meta`` pickle (its ``label_names``).

    Raises:
        CorruptDataError: unreadable pickle, no ``label_names``, or not 10 distinct non-empty
            names.
    """
    where = f"corrupt CIFAR meta {str(path)!r}"
    label_names = _unpickle(path).get("label_names")
    if isinstance(label_names, np.ndarray):
        label_names = label_names.tolist()
    if not isinstance(label_names, (list, tuple)):
        raise CorruptDataError(
            f"{where}: expected a list 'label_names', got {type(label_names).__name__}"
        )
    try:
        names = [n.decode() if isinstance(n, bytes) else n for n in label_names]
    except UnicodeDecodeError as err:
        raise CorruptDataError(f"{where}: a label name is not UTF-8: {err}") from None
    num_classes = len(CIFAR10_CLASSES)
    if (
        len(names) != num_classes
        or not all(isinstance(n, str) and n for n in names)
        or len(set(names)) != len(names)
    ):
        raise CorruptDataError(
            f"{where}: label_names must list {num_classes} distinct non-empty names, "
            f"got {len(names)}: [{', '.join(map(_shown, names))}]"
        )
    return names


def _from_batches(
    root: Path | None,
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor], list[str], Path]:
    names = [*TRAIN_BATCHES, "test_batch"]
    paths = require_files("cifar10", root, [f"{BATCHES_DIR}/{n}" for n in names])
    folder = paths[0].parent
    parts = [read_cifar_batch(folder / n) for n in TRAIN_BATCHES]
    train = (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
    test = read_cifar_batch(folder / "test_batch")
    classes = CIFAR10_CLASSES
    if (folder / "batches.meta").is_file():
        classes = read_cifar_meta(folder / "batches.meta")
    return train, test, classes, folder


def _cache_fits(cached: Any) -> bool:
    """Whether a loaded cache file holds what :func:`_from_zip` writes (else it is rebuilt)."""
    if not isinstance(cached, dict):
        return False
    classes = cached.get("classes")
    return (isinstance(classes, list) and all(isinstance(c, str) for c in classes)
            and _labelled_images_fit(cached.get("images"), cached.get("labels"), len(classes)))


def _from_zip(
    path: Path, rel: str, split: str, limit: int | None, seed: int, verify: bool, shuffle: bool = False
) -> tuple[Tensor, Tensor, list[str]]:
    """The images of ``split`` in the zip's order, or with ``shuffle`` in a seeded random order whose first ``limit``
    items the subset is (the same order with ``limit`` or without, cached or not)."""
    _check_size(path, _MAX_ZIP_BYTES, "any image archive")  # hashed whole below, verify or not
    digest = verify_file(path, rel) if verify else sha256_file(path)
    cached_path = cache_dir("cifar10") / f"{split}-{digest[:16]}.pt"
    cached = load_cached(cached_path, _cache_fits, f"the decoded images, labels and classes of {str(path)!r}")
    if cached is not None:
        total = len(cached["labels"])
        keep = seeded_subset(total, limit, seed)
        images, labels, classes = cached["images"][keep], cached["labels"][keep], list(cached["classes"])
    elif limit is None:
        images, labels, classes = read_image_zip(path, split)
        _check_unchanged(path, digest)  # else the cache named by the checked zip's hash held another zip's images
        save_cached({"images": images, "labels": labels, "classes": classes}, cached_path)
        total = len(labels)
    else:
        with _open_zip(path) as zf:
            total = len(_zip_members(zf, split))
        images, labels, classes = read_image_zip(path, split, seeded_subset(total, limit, seed) if total else None)
        _check_unchanged(path, digest)
    if shuffle:  # seeded_subset's draw in its drawn order (it sorts it): a subset is a prefix of the whole split
        drawn = torch.randperm(total, generator=generator(seed))[:len(labels)]
        order = torch.searchsorted(drawn.sort().values, drawn)
        images, labels = images[order], labels[order]
    return images, labels, classes


@register_dataset("cifar10", kind="image", needs_root=True)
def load_cifar10(
    *,
    root: Path | None,
    seed: int = 0,
    source: str = "auto",
    val_size: int | None = None,
    limit_train: int | None = None,
    limit_test: int | None = None,
    normalize: bool = True,
    verify: bool = True,
) -> ClassificationData:
    """CIFAR-10 from the data root: 45,000/5,000/10,000 train/val/test, 32x32 RGB, 10 classes.

    Args:
        root: data root (see the module docstring for the two layouts).
        seed: seed of the val carve and of the ``limit_*`` subsets.
        source: ``"auto"`` (pickled batches if present, else JPEG zips), ``"pickle"`` or ``"jpg"``.
        val_size: training images held out for val (``None``: ``min(5000, n // 10)``); an
            empty val part is a ``ValueError``.
        limit_train: use a seeded random subset of this many training images.
        limit_test: use a seeded random subset of this many test images.
        normalize: standardise with the training split's mean/std.
        verify: check the staged zips' SHA256.

    Shapes:
        - x: ``(N, 3, 32, 32)`` float32; y: ``(N,)`` int64.
    """
    _check_flags("load_cifar10", normalize=normalize, verify=verify)
    for option, limit in (("limit_train", limit_train), ("limit_test", limit_test)):
        _check_limit(f"load_cifar10: {option}", limit)  # before any file is read or hashed
    root = None if root is None else Path(root)  # a str root (the loader called directly): "str / str" failed
    if source not in ("auto", "pickle", "jpg"):
        raise ValueError(f"source must be 'auto', 'pickle' or 'jpg', got {source!r}"
                         f"{_choice_hint(source, ('auto', 'pickle', 'jpg'))}")
    use_pickle = source == "pickle" or (
        source == "auto" and root is not None and (root / BATCHES_DIR).is_dir()
    )
    if use_pickle:
        (x_tr, y_tr), (x_te, y_te), classes, folder = _from_batches(root)
        keep = seeded_subset(len(y_tr), limit_train, seed)
        keep_test = seeded_subset(len(y_te), limit_test, seed)
        x_tr, y_tr, x_te, y_te = x_tr[keep], y_tr[keep], x_te[keep_test], y_te[keep_test]
        origin = f"official python batches in {folder}"
    else:
        rels = {split: f"cifar10_jpg/{split}.zip" for split in ("train", "test")}
        layout = (
            f"Alternatively put the official python batches in <root>/{BATCHES_DIR}/ "
            f"(data_batch_1..5, test_batch)."
        )
        paths = require_files("cifar10", root, rels.values(), layout=layout)
        x_tr, y_tr, classes = _from_zip(
            paths[0], rels["train"], "train", limit_train, seed, verify
        )
        # the archives list the images class by class (all 1,000 test airplanes first), the official test_batch in
        # a shuffled order: a prefix of x_test (DINOTask's k-NN accuracy under eval_steps) held the first class only
        x_te, y_te, test_classes = _from_zip(
            paths[1], rels["test"], "test", limit_test, seed, verify, shuffle=True
        )
        if test_classes != classes:
            raise CorruptDataError(
                f"cifar10: train classes {classes} differ from test classes {test_classes}"
            )
        if x_te.shape[1:] != x_tr.shape[1:]:  # else build_image_data's ValueError, naming no file
            raise CorruptDataError(f"cifar10: {str(paths[1])!r} holds test images of shape {tuple(x_te.shape[1:])}, "
                                   f"{str(paths[0])!r} training images of shape {tuple(x_tr.shape[1:])}")
        origin = "JPEG zips (lossy re-encoding of CIFAR-10)"
    train_idx, val_idx = carve_val(len(y_tr), val_size, seed)
    _require_carved_val("cifar10", val_idx, len(y_tr), val_size)
    return build_image_data(
        "cifar10",
        x_tr,
        y_tr,
        (train_idx, val_idx, val_idx[:0]),
        num_classes=len(classes),
        normalize=normalize,
        class_names=list(classes),
        test=(x_te, y_te),
        meta={
            "source": origin,
            "licence": "CIFAR-10 (Krizhevsky 2009) ships with no explicit licence",
            "split": f"val = {len(val_idx)} seeded random training images (seed={seed})",
        },
    )
