"""Edge probes of the image and text data, fifteenth pass: 16-bit colour PNGs in an image zip (refused like 16-bit
grey ones), checked against an independent PNG writer (struct + zlib) and Pillow's own decoding."""

from __future__ import annotations

import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from diffusionformer.data import CorruptDataError
from diffusionformer.data.cifar10 import read_image_zip

PIL_Image = pytest.importorskip("PIL.Image")


def _png(arr: np.ndarray, colour_type: int, depth: int) -> bytes:
    """A PNG written by hand (no Pillow): IHDR of ``depth`` bits and ``colour_type``, one unfiltered IDAT."""
    h, w = arr.shape[:2]
    dtype = ">u2" if depth == 16 else "u1"
    raw = b"".join(b"\x00" + arr[i].astype(dtype).tobytes() for i in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, depth, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def _zip(path: Path, entries: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return path


@pytest.mark.parametrize("colour_type, channels", [(2, 3), (6, 4), (4, 2)], ids=["RGB", "RGBA", "LA"])
def test_bug_a_16_bit_colour_png_is_refused_not_cut_to_its_high_byte(tmp_path, colour_type, channels):
    """Bug: a 16-bit RGB, RGBA or grey+alpha PNG opens in Pillow as mode RGB/RGBA with each sample cut to its high
    byte, so read_image_zip took it without a word while its docstring (and the 16-bit grey case) refuse samples
    wider than 8 bits."""
    rng = np.random.default_rng(0)
    wide = rng.integers(0, 2**16, (4, 4, channels), dtype=np.uint16)
    good = _png(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8), 2, 8)
    path = _zip(tmp_path / "wide.zip", {"train/cat/0.png": good, "train/dog/1.png": _png(wide, colour_type, 16)})
    with pytest.raises(CorruptDataError, match=r"cannot decode 'train/dog/1\.png' as JPEG or PNG: raw mode "
                                               r"'[A-Z]+;16B' has samples wider than 8 bits"):
        read_image_zip(path, "train")


def test_pins_8_bit_hand_written_pngs_decode_exactly_to_their_samples(tmp_path):
    """8-bit RGB, RGBA and grey+alpha PNGs (written without Pillow) still decode: RGB exactly to the written
    samples (channel order R, G, B; layout (N, 3, H, W) uint8), the others like Pillow's convert("RGB")."""
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (5, 6, 3), dtype=np.uint8)
    rgba = rng.integers(0, 256, (5, 6, 4), dtype=np.uint8)
    la = rng.integers(0, 256, (5, 6, 2), dtype=np.uint8)
    entries = {"train/a/0.png": _png(rgb, 2, 8), "train/b/0.png": _png(rgba, 6, 8), "train/c/0.png": _png(la, 4, 8)}
    images, labels, classes = read_image_zip(_zip(tmp_path / "ok.zip", entries), "train")
    assert images.dtype == torch.uint8 and tuple(images.shape) == (3, 3, 5, 6)
    assert classes == ["a", "b", "c"] and labels.tolist() == [0, 1, 2]
    np.testing.assert_array_equal(images[0].permute(1, 2, 0).numpy(), rgb)
    np.testing.assert_array_equal(images[1].permute(1, 2, 0).numpy(), rgba[..., :3])  # alpha dropped, not blended
    np.testing.assert_array_equal(images[2].permute(1, 2, 0).numpy(), np.repeat(la[..., :1], 3, axis=2))
