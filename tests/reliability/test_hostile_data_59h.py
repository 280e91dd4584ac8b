"""Hostile data files, round 2 (helper 59h): data roots built in a tmp folder that the loaders must refuse with an
error naming the file, without filling memory.

The bugs:

- a zip entry whose headers declare a few bytes while its stream inflates to hundreds of megabytes slipped past the
  declared-size checks: ``read_image_zip`` read it with ``zf.read``, which inflates the whole deflate stream before
  cutting it to the declared size (438 MB in memory for 200 MB inflated), and zipfile inflates a bzip2 or LZMA entry
  whole whatever is asked of it (a 305-byte bzip2 CIFAR entry or a 2 KB TU table: 437 MB; a few KB: all memory);
- ``load_planetoid`` checked the ``ind.*`` files' SHA256, then read them: a file rewritten in between was loaded as
  the verified one (the other loaders hash again after their read);
- a CIFAR-10 test zip of another image size than the train zip failed with ``build_image_data``'s ``ValueError``
  naming no file;
- a sparse file of a terabyte (no disk space) was hashed whole, for many minutes, before anything looked at it: the
  CIFAR-10 and TU zips (hashed ``verify`` or not), an MNIST IDX file stored uncompressed and the tinyshakespeare
  corpus (which ``verify=False`` read whole into memory). Such files are now refused by size first.

Probed without finding a new bug: IDX headers declaring huge sizes, non-UTF-8 text, empty files, a folder where a file
belongs, ``../`` and absolute zip entry names, a JPEG decoding as grayscale/RGBA (converted, as torchvision does), a
16-bit PNG renamed ``.jpg``, Planetoid out-of-range indices and NaN features, a pickle payload in PyG's
``processed/`` (refused by ``drop_unsafe_processed``). Left as is: the JPEG zips may hold images of any one size
(the loader's tests read 4 x 4 ones), though ``load_cifar10``'s docstring gives ``(N, 3, 32, 32)``.
"""

from __future__ import annotations

import os
import pickle
import shutil
import struct
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from diffusionformer.data import CorruptDataError, load_dataset

_REPO = Path(__file__).resolve().parents[2]
#: the staged benchmark root ($DIFFUSIONFORMER_DATA, or ../shared/data)
STAGED = next((p for p in (Path(os.environ.get("DIFFUSIONFORMER_DATA") or _REPO / "nowhere"), _REPO.parent / "shared"
                           / "data") if (p / "SHA256SUMS").is_file()), _REPO / "nowhere")


def _declare(path: Path, index: int, declared: int) -> None:
    """Make the local and central headers of the ``index``-th entry of the zip ``path`` declare ``declared`` bytes
    uncompressed (its stream and CRC unchanged)."""
    with zipfile.ZipFile(path) as zf:
        info = zf.infolist()[index]
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, info.header_offset + 22, declared)
    central = raw.index(b"PK\x01\x02")
    for _ in range(index):
        central = raw.index(b"PK\x01\x02", central + 4)
    struct.pack_into("<I", raw, central + 24, declared)
    path.write_bytes(bytes(raw))


def _peak(fn) -> tuple[BaseException | None, int]:
    """The exception ``fn()`` raises (or ``None``) and the peak of memory traced while it ran."""
    tracemalloc.start()
    try:
        try:
            fn()
            err = None
        except Exception as caught:  # the caller checks which
            err = caught
        return err, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("method, name", [(zipfile.ZIP_DEFLATED, None), (zipfile.ZIP_BZIP2, "bzip2"),
                                          (zipfile.ZIP_LZMA, "LZMA")])
def test_bug_an_image_entry_declaring_100_bytes_is_not_inflated_past_them(tmp_path, method, name):
    """Bug: an entry declaring 100 B whose stream inflates to 64 MiB was inflated whole (``zf.read``; zipfile's
    bzip2 and LZMA readers inflate without a bound whatever is asked): 2x its size in memory, a few KB of bzip2 could
    take all of it. Now a deflated entry is read no further than it declares (its CRC then fails) and a bzip2 or LZMA
    one is refused, naming the entry."""
    from diffusionformer.data.cifar10 import read_image_zip

    path = tmp_path / "bomb.zip"
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        zf.writestr("train/cat/0.png", bytes(64 << 20))
    _declare(path, 0, 100)
    err, peak = _peak(lambda: read_image_zip(path, "train"))
    assert isinstance(err, CorruptDataError) and "bomb.zip" in str(err), err
    if name is not None:
        assert f"'train/cat/0.png' is compressed with {name}" in str(err)
    assert peak < 16 << 20, peak


def test_bug_a_tu_table_compressed_with_bzip2_is_refused_uninflated(tmp_path, cache, data_writers):
    """Bug: the TU tables were streamed out in 1 MiB reads, but zipfile inflates each read of a bzip2 entry whole: a
    table of 2 KB declaring 100 B filled 437 MB of memory before its CRC failed. Now such an entry is refused."""
    good = data_writers.write_tu_zip(tmp_path / "good" / "MUTAG.zip", "MUTAG")
    path = tmp_path / "root" / "tudataset" / "MUTAG.zip"
    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        dst.writestr("MUTAG/MUTAG_node_attributes.txt", bytes(64 << 20), compress_type=zipfile.ZIP_BZIP2)
    _declare(path, len(src.infolist()), 100)
    pytest.importorskip("torch_geometric.datasets")  # imported before the memory is traced
    err, peak = _peak(lambda: load_dataset("mutag", root=tmp_path / "root", verify=False))
    assert isinstance(err, CorruptDataError), err
    assert "MUTAG.zip" in str(err) and "'MUTAG/MUTAG_node_attributes.txt' is compressed with bzip2" in str(err)
    assert peak < 16 << 20, peak


@pytest.mark.skipif(not (STAGED / "planetoid" / "Cora" / "raw" / "ind.cora.ty").is_file(),
                    reason="the staged Planetoid files (../shared/data) are absent")
def test_bug_a_planetoid_file_rewritten_after_its_checksum_is_not_loaded_as_verified(tmp_path, monkeypatch):
    """Bug: ``load_planetoid`` checked the ``ind.*`` files' SHA256, then read them: a file rewritten in between (the
    test labels of another file here) was loaded as the verified Cora. Now each file is hashed again after the
    read; a change is a ``CorruptDataError`` naming it."""
    import diffusionformer.data.planetoid as planetoid

    raw = tmp_path / "planetoid" / "Cora" / "raw"
    shutil.copytree(STAGED / "planetoid" / "Cora" / "raw", raw)
    real = planetoid.read_planetoid

    ty = planetoid._unpickle_planetoid(raw / "ind.cora.ty")
    doctored = pickle.dumps(np.roll(ty, 1, axis=1), protocol=2)  # every test label moved to the next class

    def rewritten_then_read(*args, **kwargs):
        (raw / "ind.cora.ty").write_bytes(doctored)  # another process, after the check and before the read
        return real(*args, **kwargs)

    monkeypatch.setattr(planetoid, "read_planetoid", rewritten_then_read)
    with pytest.raises(CorruptDataError, match=r"ind\.cora\.ty' changed while it was read"):
        load_dataset("cora", root=tmp_path)


def test_bug_a_cifar10_test_zip_of_another_image_size_is_refused_naming_the_zips(tmp_path, cache, data_writers):
    """Bug: a test zip of 16 x 16 images beside a train zip of 32 x 32 ones failed in ``build_image_data`` with
    "test: expected x of shape (N, 3, 32, 32) ...", naming no file. Now the error names both zips and both sizes."""
    zips = tmp_path / "cifar10_jpg"
    for split, size, n in (("train", 32, 20), ("test", 16, 5)):
        data_writers.write_stored_zip(zips / f"{split}.zip", [
            (f"{split}/{c}/{i:04d}.jpg", data_writers.jpeg_bytes((80 * k, 50, 90), size))
            for k, c in enumerate(("airplane", "cat")) for i in range(n)])
    with pytest.raises(CorruptDataError, match=r"test\.zip' holds test images of shape \(3, 16, 16\), .*train\.zip' "
                                               r"training images of shape \(3, 32, 32\)"):
        load_dataset("cifar10", root=tmp_path, verify=False)


@pytest.mark.skipif(os.name != "posix", reason="sparse files as on POSIX")
@pytest.mark.parametrize("verify", [True, False])
def test_bug_a_sparse_tinyshakespeare_file_of_a_terabyte_is_refused_unhashed_and_unread(tmp_path, monkeypatch,
                                                                                        verify):
    """Bug: ``load_tinyshakespeare`` hashed the corpus whole, then read it whole: a sparse ``input.txt`` of 1 TiB (no
    disk space) was hashed for many minutes (``verify=True``) or read into memory (``verify=False``) before anything
    was refused. Now a file over 1 GiB (the corpus is 1.1 MB) is refused first, naming it; here hashing or reading
    it fails the test at once."""
    import diffusionformer.data.checksums as checksums
    import diffusionformer.data.text as text

    path = tmp_path / "tinyshakespeare" / "input.txt"
    path.parent.mkdir()
    with open(path, "wb") as f:
        f.truncate(1 << 40)

    def refused(*args, **kwargs):
        raise AssertionError("the file was hashed or read")

    monkeypatch.setattr(checksums, "sha256_file", refused)
    monkeypatch.setattr(text, "read_text", refused)
    with pytest.raises(CorruptDataError, match=r"input\.txt' holds 1099511627776 B, more than a character corpus"):
        load_dataset("tinyshakespeare", root=tmp_path, verify=verify)


@pytest.mark.skipif(os.name != "posix", reason="sparse files as on POSIX")
def test_bug_a_sparse_uncompressed_mnist_file_of_a_terabyte_is_refused_unhashed(tmp_path, monkeypatch):
    """Bug: ``mnist._read`` refused a gzipped file over 1 GiB before hashing it, but hashed an uncompressed one whole
    (``read_idx_bytes`` reads no more than its header, the SHA256 all of it): a sparse ``t10k-labels-idx1-ubyte`` of
    1 TiB (the layout allows files stored plain), read with the default ``verify=True``, was hashed for many minutes
    before its zeros were refused as a bad magic. Now it is refused first, naming it; here hashing it fails at once."""
    import diffusionformer.data.mnist as mnist
    from diffusionformer.data.idx import IDX_LABELS_MAGIC

    rel = "mnist/MNIST/raw/t10k-labels-idx1-ubyte"
    (tmp_path / rel).parent.mkdir(parents=True)
    with open(tmp_path / rel, "wb") as f:
        f.truncate(1 << 40)

    def hashed(*args, **kwargs):
        raise AssertionError("the file was hashed")

    monkeypatch.setattr(mnist, "sha256_file", hashed)
    monkeypatch.setattr(mnist, "verify_file", hashed)
    with pytest.raises(CorruptDataError, match=r"t10k-labels-idx1-ubyte' holds 1099511627776 B, more than any IDX "
                                               r"file"):
        mnist._read(tmp_path, rel, IDX_LABELS_MAGIC, True)


@pytest.mark.skipif(os.name != "posix", reason="sparse files as on POSIX")
@pytest.mark.parametrize("dataset, rels", [("cifar10", ["cifar10_jpg/train.zip", "cifar10_jpg/test.zip"]),
                                           ("mutag", ["tudataset/MUTAG.zip"])])
@pytest.mark.parametrize("verify", [True, False])
def test_bug_a_sparse_zip_of_a_terabyte_is_refused_unhashed(tmp_path, cache, monkeypatch, dataset, rels, verify):
    """Bug: the CIFAR-10 and TU loaders hash their zip whole, ``verify`` or not (the hash names the cache): a sparse
    zip of 1 TiB (no disk space) was hashed for many minutes before zipfile found it is no archive. Now a zip over
    4 GiB (CIFAR-10, whose train.zip is 52 MB) or 1 GiB (TU, at most 1 MB) is refused first, naming it; here hashing
    it fails the test at once."""
    import diffusionformer.data.cifar10 as cifar10
    import diffusionformer.data.tu as tu

    for rel in rels:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        with open(tmp_path / rel, "wb") as f:
            f.truncate(1 << 40)

    def hashed(*args, **kwargs):
        raise AssertionError("the file was hashed")

    for module in (cifar10, tu):
        monkeypatch.setattr(module, "sha256_file", hashed)
        monkeypatch.setattr(module, "verify_file", hashed)
    with pytest.raises(CorruptDataError, match=rf"{rels[0].split('/')[1]}' holds 1099511627776 B, more than any "):
        load_dataset(dataset, root=tmp_path, verify=verify)
