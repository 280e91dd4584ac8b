"""Reader for the IDX format of MNIST (LeCun et al., http://yann.lecun.com/exdb/mnist/).

An IDX file is a 4-byte magic number ``0x00 0x00 <type> <ndim>``, then ``ndim`` big-endian
uint32 sizes, then the values, big-endian, in C order. MNIST images have magic ``0x00000803``
(uint8, 3 dims: N x 28 x 28) and labels ``0x00000801`` (uint8, 1 dim). Files may be gzipped.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import struct
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from .paths import CorruptDataError

__all__ = ["IDX_IMAGES_MAGIC", "IDX_LABELS_MAGIC", "parse_idx", "read_idx_bytes", "read_idx"]

IDX_IMAGES_MAGIC = 0x00000803
IDX_LABELS_MAGIC = 0x00000801

# deflate's largest expansion (RFC 1951: a 258-byte match in at most ~2 bits, about 1032:1)
_MAX_DEFLATE_RATIO = 1032
#: bytes of a gzipped IDX file, read whole (MNIST's largest is 9.9 MB)
_MAX_GZIP_BYTES = 2**30
# bytes read past a gzipped header that is not IDX's
_SNIFF = 64

# type code -> big-endian NumPy dtype
_IDX_TYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def parse_idx(raw: bytes, *, expected_magic: int | None = None, source: str = "<bytes>") -> Tensor:
    """Decode the bytes of an (uncompressed) IDX file into a tensor.

    Args:
        raw: the file content.
        expected_magic: if given, the magic number the file must start with.
        source: name used in error messages.

    Raises:
        CorruptDataError: bad magic, unknown type, or a payload whose size does not match the
            header (truncated or padded file).

    Shapes:
        - output: the sizes stored in the header, in native byte order

    Examples:
        >>> raw = bytes([0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3]) + bytes(range(6))
        >>> parse_idx(raw, expected_magic=0x802).tolist()
        [[0, 1, 2], [3, 4, 5]]
    """
    if len(raw) < 4:
        raise CorruptDataError(f"{source}: not an IDX file (only {len(raw)} bytes)")
    (magic,) = struct.unpack(">I", raw[:4])
    if expected_magic is not None and magic != expected_magic:
        raise CorruptDataError(
            f"{source}: bad IDX magic number 0x{magic:08x}, expected 0x{expected_magic:08x}"
        )
    zero, type_code, ndim = magic >> 16, (magic >> 8) & 0xFF, magic & 0xFF
    if zero != 0 or type_code not in _IDX_TYPES:
        raise CorruptDataError(f"{source}: bad IDX magic number 0x{magic:08x}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise CorruptDataError(f"{source}: truncated IDX header ({len(raw)} bytes, need {header})")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = _IDX_TYPES[type_code]
    expected = math.prod(dims) * dtype.itemsize
    got = len(raw) - header
    if got != expected:
        state = "truncated" if got < expected else "has trailing bytes"
        raise CorruptDataError(
            f"{source}: IDX file {state}: header says {dims} x {dtype.itemsize} B = {expected} B "
            f"of data, found {got} B"
        )
    try:
        array = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    except ValueError as err:  # more dimensions than NumPy has (64)
        raise CorruptDataError(f"{source}: IDX header declares {ndim} dimensions: {err}") from None
    return torch.from_numpy(array.astype(dtype.newbyteorder("="), copy=True))


def _read_declared(f: io.BufferedIOBase, room: int, too_large: Callable[[int], str] | None = None) -> bytes:
    """An IDX file's header and at most one byte more than the data it declares, read from ``f``; only a few
    bytes when it holds no IDX header (enough for :func:`parse_idx`'s message).

    ``room``: the most bytes of data that can follow the header (no more is asked of ``f``: ``read(n)`` allocates
    ``n`` bytes first); a header declaring more is refused with ``too_large(declared)`` when that is given.
    """
    head = f.read(4)
    if len(head) < 4 or head[0] or head[1] or head[2] not in _IDX_TYPES:
        return head + f.read(_SNIFF)  # not an IDX header: enough for parse_idx's message
    head += f.read(4 * head[3])
    if len(head) < 4 + 4 * head[3]:
        return head
    declared = math.prod(struct.unpack(f">{head[3]}I", head[4:])) * _IDX_TYPES[head[2]].itemsize
    if declared > room and too_large is not None:
        raise CorruptDataError(too_large(declared))
    return head + f.read(min(declared, room) + 1)


def read_idx_bytes(path: Path) -> bytes:
    """The uncompressed content of an IDX file (gunzipped when it starts with the gzip magic).

    The file (or its gzip stream) is read no further than one byte past the size its IDX header
    declares (enough for :func:`parse_idx` to report trailing bytes), and a gzip stream whose
    header declares more than deflate could expand the file to is refused: neither a small
    hostile ``.gz`` nor a sparse file of a terabyte of "trailing bytes" can fill memory.

    Raises:
        CorruptDataError: a gzip stream that is truncated or damaged, or whose header declares
            more data than the file can hold, or a gzipped file over 1 GiB, naming the file.
    """
    with open(path, "rb") as plain:
        size = os.fstat(plain.fileno()).st_size
        if plain.read(2) != b"\x1f\x8b":
            # read whole before: a sparse file of 1 TiB (or a header declaring it) was a bare MemoryError
            plain.seek(0)
            return _read_declared(plain, size)
        _check_gzip_size(path, size)  # read whole below: a sparse .gz of 1 TiB was a bare MemoryError
        plain.seek(0)
        raw = plain.read()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
            return _read_declared(f, _MAX_DEFLATE_RATIO * len(raw), lambda declared: (
                f"corrupt gzip file {str(path)!r}: its IDX header declares {declared} B of data, more than "
                f"deflate can expand {len(raw)} B to ({_MAX_DEFLATE_RATIO}x)"))
    except (EOFError, OSError, zlib.error) as err:
        raise CorruptDataError(f"corrupt or truncated gzip file {str(path)!r}: {err}") from None


def _check_gzip_size(path: Path, size: int | None = None) -> None:
    """Refuse a gzipped file over :data:`_MAX_GZIP_BYTES` (``size``, else its size on disk) as a
    :class:`CorruptDataError` naming it, before it is read whole or hashed (a file not starting with the gzip
    magic is left alone: :func:`read_idx_bytes` reads no more of it than its header declares)."""
    if size is None:
        with open(path, "rb") as f:
            if f.read(2) != b"\x1f\x8b":
                return
            size = os.fstat(f.fileno()).st_size
    if size > _MAX_GZIP_BYTES:
        raise CorruptDataError(f"corrupt gzip file {str(path)!r}: {size} B, more than any IDX archive "
                               f"({_MAX_GZIP_BYTES} B at most)")


def read_idx(path: Path, *, expected_magic: int | None = None) -> Tensor:
    """Read an IDX file (gzipped or not) into a tensor; see :func:`parse_idx`."""
    return parse_idx(read_idx_bytes(path), expected_magic=expected_magic, source=str(path))
