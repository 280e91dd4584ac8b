"""SHA256 of the staged benchmark files, and the check that compares them.

``KNOWN_SHA256`` keys are paths relative to the data root (the standard layout, see
``../shared/data/SHA256SUMS``). A file that is not in the table is accepted unchecked.

MNIST's ``.gz`` wrappers differ between mirrors (gzip stores a time stamp) while the
decompressed idx bytes are the official ones, so for those files ``KNOWN_CONTENT_SHA256``
records the hash of the decompressed content too: a file passes if either hash matches.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .paths import ChecksumError, CorruptDataError

__all__ = ["KNOWN_SHA256", "KNOWN_CONTENT_SHA256", "sha256_file", "sha256_bytes", "verify_file"]

KNOWN_SHA256: dict[str, str] = {
    "cifar10_jpg/test.zip": "6c887066a4086d1a396d7bdf9015dd0af187d06e9edad255daea6ab4158f39a0",
    "cifar10_jpg/train.zip": "db1d97e295438a1fc80ebc6ea1a1c56bd627cf900e10c0feb7dc09b6c8c9aece",
    "mnist/MNIST/raw/t10k-images-idx3-ubyte.gz": "167310007f03058885c7e95e6c0b19c20de5c7fd3031f4cbdadc9014a523d80b",
    "mnist/MNIST/raw/t10k-labels-idx1-ubyte.gz": "fc607395669ec21321ea83e4b82c0544b7e8e63ff5b34337c06bc0a17cc0da3c",
    "mnist/MNIST/raw/train-labels-idx1-ubyte.gz": "ec02e7948609e5754d47881c09b8afdd8dfa60600b9e5388c8c54a67069ec772",
    "mnist_train_reconstructed/train-images-idx3-ubyte.gz": "8e59d4e6322d5e291f26338633ee8015e1369ee4616a784cd934bc27c2948978",
    "planetoid/CiteSeer/raw/ind.citeseer.allx": "2ac30345d95c9ec933a817ee0bdd6a5f077f8c184a20e696910192d534414668",
    "planetoid/CiteSeer/raw/ind.citeseer.ally": "f704b2d986dde6c2669934de1f3ae5696a6cf9455c0f6b2646a2d135ea0a1c95",
    "planetoid/CiteSeer/raw/ind.citeseer.graph": "d79a4ef9d3e7169aee8946145f6b7306e35bc79bffad26346cfb94e10e9912a7",
    "planetoid/CiteSeer/raw/ind.citeseer.test.index": "2af990671580b6b2df5d158d1038f8292e30c9cd821b5453f399659b25b723d4",
    "planetoid/CiteSeer/raw/ind.citeseer.tx": "539a8906a2da97628d212f2fdd668c109a8b3f0d36574b59e5d3fd5b5303da21",
    "planetoid/CiteSeer/raw/ind.citeseer.ty": "55e5bd1ba1e733a04598753ad1a8d57957f4b8f89e74519f41f4f4938767e4ce",
    "planetoid/CiteSeer/raw/ind.citeseer.x": "d20de19150741e555de0ed037195630fc194114ebc7fd72ced62810148aa22f6",
    "planetoid/CiteSeer/raw/ind.citeseer.y": "8ba87e515d8e3ee3cf52f6d2c5b86aa73f11ecad825a808455209ec26cd54924",
    "planetoid/Cora/raw/ind.cora.allx": "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543",
    "planetoid/Cora/raw/ind.cora.ally": "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71",
    "planetoid/Cora/raw/ind.cora.graph": "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d",
    "planetoid/Cora/raw/ind.cora.test.index": "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875",
    "planetoid/Cora/raw/ind.cora.tx": "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a",
    "planetoid/Cora/raw/ind.cora.ty": "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad",
    "planetoid/Cora/raw/ind.cora.x": "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab",
    "planetoid/Cora/raw/ind.cora.y": "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1",
    "tinyshakespeare/input.txt": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
    "tudataset/ENZYMES.zip": "0ca7125d7978788346fc6ba5c3cc643b6122153b304220c2230bcb09f99f8ffb",
    "tudataset/IMDB-BINARY.zip": "2a4abb6431ec1ab025a6fbcd3b546607191f79a1e0aef0f42cd8bd4ec1546116",
    "tudataset/IMDB-MULTI.zip": "1d22bb88ee69f9f7c09eb7f072dadec56e3f91ad4b14cfd99231379b68073883",
    "tudataset/MUTAG.zip": "20f52db82d6d85d5f67d2fa42c3fb705d05934be44329314ab17b05d0c012f7e",
    "tudataset/NCI1.zip": "eae6b0c076d59e667c67de0039cfc3214eefb91a8dddc2fa3099126da02d4376",
    "tudataset/NCI109.zip": "c9e5388b0fb049b68205f8f8c2465d983e73ea8d41ea42bbd15b121aa55d9420",
    "tudataset/PROTEINS.zip": "fe9d19741637486ea1fd285bf669fce0b117e10b03cdd379f6a5e6197fc830ae",
    "tudataset/PTC_MR.zip": "2f935126a9ec684e13ed9ff5ea389f62c4c70f41dcedb3e1114c0b0947103200",
}

#: SHA256 of the *decompressed* idx bytes (official MNIST content; the rebuilt train images).
KNOWN_CONTENT_SHA256: dict[str, str] = {
    "mnist/MNIST/raw/t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "mnist/MNIST/raw/t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    "mnist/MNIST/raw/train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "mnist_train_reconstructed/train-images-idx3-ubyte": "374ba378bee06c633f4800ac6a495f71d1b80b0e82bf763acbfa4c7e9c379f75",
}

_HASH_CACHE: dict[tuple[str, int, int, int, int, int], str] = {}


def sha256_bytes(data: bytes | memoryview) -> str:
    """Hex SHA256 of ``data``.

    Examples:
        >>> sha256_bytes(b"abc")[:16]
        'ba7816bf8f01cfea'
    """
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """Hex SHA256 of a file, streamed; remembered in this process per (file, inode, size, mtime, ctime)
    (``cp -p``, ``rsync -a`` and ``shutil.copy2`` give a replacement its predecessor's size and mtime, but a new
    inode or ctime)."""
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _HASH_CACHE:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(chunk_size), b""):
                h.update(chunk)
        _HASH_CACHE[key] = h.hexdigest()
    return _HASH_CACHE[key]


def verify_file(path: Path, relpath: str, *, content: bytes | None = None) -> str:
    """Check ``path`` (known as ``relpath`` in the standard layout) against the table.

    Args:
        path: the file on disk.
        relpath: its path relative to the data root, the key of :data:`KNOWN_SHA256`.
        content: the file's decompressed bytes, when the caller has them, to accept a
            re-wrapped ``.gz`` whose content hash is in :data:`KNOWN_CONTENT_SHA256`.

    Returns:
        The file's SHA256.

    Raises:
        ChecksumError: naming the file, the expected and the actual hash.
    """
    actual = sha256_file(path)
    expected = KNOWN_SHA256.get(relpath)
    if expected is not None and actual == expected:
        return actual
    content_key = relpath[:-3] if relpath.endswith(".gz") else relpath
    content_expected = KNOWN_CONTENT_SHA256.get(content_key)
    if expected is None and content_expected is None:
        return actual  # not a staged file: nothing to compare with
    if content_expected is not None and actual == content_expected:
        return actual  # stored uncompressed: the file is its content (refused as "expected X, got X" without content=)
    if content_expected is not None and content is not None:
        if sha256_bytes(content) == content_expected:
            return actual
    wanted = expected if expected is not None else f"{content_expected} (decompressed content)"
    raise ChecksumError(
        f"corrupt or unexpected data file {str(path)!r} ({relpath}): "
        f"expected SHA256 {wanted}, got {actual}. Replace it with the original file "
        f"(or pass verify=False to skip the check)."
    )


def _check_size(path: Path, cap: int, what: str) -> None:
    """Raise :class:`CorruptDataError` when ``path`` holds more than ``cap`` bytes, more than ``what`` (the files of its
    kind) hold, before it is hashed or read whole: a sparse file of a terabyte (no disk space) was hashed for many
    minutes, or read into memory."""
    size = path.stat().st_size
    if size > cap:
        raise CorruptDataError(f"data file {str(path)!r} holds {size} B, more than {what} ({cap} B at most): refused "
                               "before it is hashed or read")


def _check_unchanged(path: Path, digest: str) -> None:
    """Raise :class:`CorruptDataError` when ``path`` no longer has the SHA256 ``digest`` it had before it was read:
    another process rewrote it in between, so what was read is neither the file checked nor the file now (a cache
    written from it was named by the old file's hash, and served in place of the old file's content ever after)."""
    now = sha256_file(path)
    if now != digest:
        raise CorruptDataError(
            f"data file {str(path)!r} changed while it was read (SHA256 {digest} when hashed, {now} after "
            f"reading): nothing read from it was kept; load it again once it is no longer being written")
