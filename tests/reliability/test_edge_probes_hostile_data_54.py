"""Edge probes (helper 54a): a power user pointing the data loaders at hostile data roots built in a tmp folder.

Probed without finding a bug (left unpinned here, or pinned elsewhere): IDX headers declaring 2**31 images (gzipped or
not: refused before reading), a pickled 10 GB ``bytes`` in a CIFAR batch (CPython's unpickler reserves the declared size
as untouched virtual memory and fails with "truncated"; a ``MemoryError`` where it cannot is caught), ``../`` and
absolute entry names in CIFAR and TU zips (ignored or refused), a symbolic link under the root pointing outside it
(followed, as any path the user names), non-UTF-8 text, empty files, NaN and out-of-range labels. Permission bits
were not probed (these machines run the tests as root, who reads every file).

The bugs:

- a PyG ``processed/`` file of the TU cache whose tensor bytes changed (a flipped bit) loaded as other features:
  ``drop_unsafe_processed`` checked that it loads, not its CRC-32;
- the TU tables extracted into the cache were trusted by the marker naming the zip's hash alone: an edited table was
  loaded by PyG unchecked (an edge across graphs), a truncated one failed with PyG's bare ``RuntimeError`` and a
  removed one made PyG try to download the dataset;
- zips with an unknown "version needed to extract", an entry name flagged UTF-8 that is not, or (TU) an encrypted
  entry escaped as ``NotImplementedError``/``UnicodeDecodeError``/``RuntimeError`` naming no file;
- a CIFAR zip, TU zip, MNIST file or tinyshakespeare corpus rewritten between its hash and its read: the cache named
  by the first file's hash held the second one's content (served for the first file ever after), or the bytes read
  were "verified" by the file hashed before or after them;
- two loaders of one TU dataset at once unzipped into, and PyG processed, one cache folder together (bare
  ``EOFError``, miniz read errors, PyG's download attempt); a TU marker that is not UTF-8 failed every later load;
- a sparse Planetoid file of gigabytes was read whole into memory; a file in place of the TU cache's ``processed/``
  failed every load with PyG's bare ``FileExistsError``;
- a data root that is a file or does not exist, and a folder or FIFO where a data file belongs, were all "missing
  file(s)" without a word of what is there.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import struct
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from diffusionformer.data import CorruptDataError, DataRootError, load_dataset

_REPO = Path(__file__).resolve().parents[2]
#: the staged benchmark root ($DIFFUSIONFORMER_DATA, read at import: tests/data's fixtures clear it, or ../shared/data)
STAGED = next((p for p in (Path(os.environ.get("DIFFUSIONFORMER_DATA") or _REPO / "nowhere"), _REPO.parent / "shared"
                           / "data") if (p / "SHA256SUMS").is_file()), _REPO / "nowhere")


def _tu_root(tmp_path: Path, data_writers) -> Path:
    root = tmp_path / "root"
    data_writers.write_tu_zip(root / "tudataset" / "MUTAG.zip", "MUTAG")
    return root


def _graphs(data) -> dict[str, torch.Tensor]:
    store = data.dataset._data
    return {k: getattr(store, k).clone() for k in ("x", "edge_index", "y")}


def _entry_start(path: Path, member: zipfile.ZipInfo) -> int:
    raw = path.read_bytes()
    n, e = struct.unpack("<HH", raw[member.header_offset + 26:member.header_offset + 30])
    return member.header_offset + 30 + n + e


def test_bug_a_tu_processed_file_failing_its_crc_is_rebuilt_not_loaded(tmp_path, cache, data_writers):
    """Bug: ``drop_unsafe_processed`` only checked that PyG's ``processed/*.pt`` load with ``weights_only=True``;
    ``torch.load`` checks no CRC, so a flipped bit in the cached graphs' tensor bytes loaded as other features
    without a word. Now a file failing its CRC-32 is refused (named, with a warning) and rebuilt from ``raw/``."""
    root = _tu_root(tmp_path, data_writers)
    first = _graphs(load_dataset("mutag", root=root, verify=False))
    data_pt = cache / "tudataset" / "MUTAG" / "processed" / "data.pt"
    with zipfile.ZipFile(data_pt) as zf:
        member = max((m for m in zf.infolist() if "/data/" in m.filename), key=lambda m: m.file_size)
    raw = bytearray(data_pt.read_bytes())
    raw[_entry_start(data_pt, member)] ^= 0x40
    data_pt.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match=r"data\.pt: its entry .* fails its CRC-32 check"):
        again = _graphs(load_dataset("mutag", root=root, verify=False))
    assert all(torch.equal(first[k], again[k]) for k in first)


@pytest.mark.parametrize("change", ["edit", "truncate", "remove"])
def test_bug_tu_tables_changed_in_the_cache_are_extracted_again(tmp_path, cache, data_writers, monkeypatch, change):
    """Bug: the TU tables unzipped into the cache were reused whenever the marker named the zip's hash, and PyG reads
    them unchecked when ``processed/`` is rebuilt: an edited ``_A.txt`` (an edge across graphs) loaded as is, a cut
    one failed with PyG's bare ``RuntimeError`` and a removed one made PyG try to download MUTAG. The marker now
    lists the tables' SHA256 too: a change is a warning and a fresh extraction from the zip."""
    import torch_geometric.datasets.tu_dataset as pyg_tu

    monkeypatch.setattr(pyg_tu.TUDataset, "download", lambda self: pytest.fail("PyG tried to download the dataset"))
    root = _tu_root(tmp_path, data_writers)
    first = _graphs(load_dataset("mutag", root=root, verify=False))
    raw = cache / "tudataset" / "MUTAG" / "raw"
    shutil.rmtree(raw.parent / "processed")
    table = raw / "MUTAG_A.txt"
    lines = table.read_text().splitlines()
    if change == "edit":
        table.write_text("\n".join(["1, 30", *lines[1:]]) + "\n")  # node 1 of graph 1 joined to a node of graph 9
    elif change == "truncate":
        table.write_text("\n".join(lines[:3]) + "\n")
    else:
        table.unlink()
    with pytest.warns(UserWarning, match=r"raw'.*tables extracted from .*MUTAG\.zip' changed or were removed"):
        again = _graphs(load_dataset("mutag", root=root, verify=False))
    assert all(torch.equal(first[k], again[k]) for k in first)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reused as is now: no warning, nothing extracted again
        load_dataset("mutag", root=root, verify=False)


def test_pins_a_marker_of_an_older_version_is_extracted_again_silently(tmp_path, cache, data_writers):
    """A marker holding only the zip's hash (written before the tables were listed) is not a damaged cache: the zip
    is extracted again without a warning, and the new marker lists the tables."""
    root = _tu_root(tmp_path, data_writers)
    load_dataset("mutag", root=root, verify=False)
    marker = cache / "tudataset" / "MUTAG" / "raw" / ".source_sha256"
    marker.write_text(marker.read_text().partition("\n")[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_dataset("mutag", root=root, verify=False)
    assert "MUTAG_A.txt\n" in marker.read_text()


def _zip_bytes(entries) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries:
            zf.writestr(name, data)
    return buf.getvalue()


def _doctored(raw: bytes, how: str) -> bytes:
    b = bytearray(raw)
    central, local = b.find(b"PK\x01\x02"), b.find(b"PK\x03\x04")
    if how == "version":  # "version needed to extract" 9.9
        b[central + 6] = 99
    elif how == "utf8-name":  # the UTF-8 flag set on a name that is not UTF-8
        b[central + 9] |= 0x08
        b[central + 46] = 0xFF
    else:  # "encrypted" flag
        b[central + 8] |= 1
        b[local + 6] |= 1
    return bytes(b)


@pytest.mark.parametrize("how", ["version", "utf8-name"])
def test_bug_a_cifar_zip_of_an_unknown_version_or_a_bad_entry_name_is_corrupt_data(tmp_path, data_writers, how):
    """Bug: ``read_image_zip`` (``_open_zip``) caught ``BadZipFile`` and ``OSError`` only: a zip whose central
    directory asks for an unknown "version needed to extract", or flags a non-UTF-8 entry name as UTF-8, escaped as a
    bare ``NotImplementedError`` / ``UnicodeDecodeError`` naming no file."""
    from diffusionformer.data.cifar10 import read_image_zip

    path = tmp_path / "train.zip"
    path.write_bytes(_doctored(_zip_bytes([("train/cat/0000.jpg", data_writers.jpeg_bytes((1, 2, 3)))]), how))
    with pytest.raises(CorruptDataError, match=rf"corrupt zip archive {str(path)!r}"):
        read_image_zip(path, "train")


@pytest.mark.parametrize("how", ["utf8-name", "encrypted"])
def test_bug_a_tu_zip_with_an_encrypted_entry_or_a_bad_entry_name_is_corrupt_data(tmp_path, how):
    """Bug: ``extract_tu_zip`` let an encrypted entry (``RuntimeError: ... password required``) and an entry name
    flagged UTF-8 that is not (``UnicodeDecodeError``) escape as bare errors naming no archive (and a header offset
    before the archive's start as ``ValueError: negative seek value``)."""
    from diffusionformer.data.tu import extract_tu_zip

    entries = [("T/T_A.txt", "1, 2\n2, 1\n"), ("T/T_graph_indicator.txt", "1\n1\n"), ("T/T_graph_labels.txt", "1\n")]
    path = tmp_path / "T.zip"
    path.write_bytes(_doctored(_zip_bytes(entries), how))
    with pytest.raises(CorruptDataError, match=rf"corrupt zip archive {str(path)!r}"):
        extract_tu_zip(path, "T", tmp_path / "out" / "raw", "digest")
    assert not (tmp_path / "out" / "raw" / ".source_sha256").exists()


def _swap_before(module, name: str, monkeypatch, path: Path, replacement: bytes) -> None:
    """Make ``module.name`` rewrite ``path`` with ``replacement`` just before it runs: another process writing the
    file between the loader's hash and its read."""
    real = getattr(module, name)

    def swapped(*args, **kwargs):
        path.write_bytes(replacement)
        monkeypatch.setattr(module, name, real)  # once
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, swapped)


def test_bug_a_cifar_zip_rewritten_while_read_leaves_no_cache_under_the_old_hash(tmp_path, cache, data_writers,
                                                                                monkeypatch):
    """Bug: ``_from_zip`` hashed the zip, decoded it, and cached the images as ``<split>-<hash>.pt``: a zip rewritten
    in between (another process) put the new zip's images under the old zip's hash, served for the old zip on every
    later load. Now the hash is taken again after decoding; a change is a ``CorruptDataError`` and nothing is
    cached."""
    import diffusionformer.data.cifar10 as cifar10

    root = tmp_path / "root"
    for split in ("train", "test"):
        data_writers.write_image_zip(root / "cifar10_jpg" / f"{split}.zip", split, per_class=4)
    train = root / "cifar10_jpg" / "train.zip"
    good = train.read_bytes()
    other = data_writers.write_image_zip(tmp_path / "other.zip", "train", per_class=5).read_bytes()
    _swap_before(cifar10, "read_image_zip", monkeypatch, train, other)
    with pytest.raises(CorruptDataError, match=r"train\.zip' changed while it was read"):
        load_dataset("cifar10", root=root, verify=False, normalize=False)
    train.write_bytes(good)
    data = load_dataset("cifar10", root=root, verify=False, normalize=False)
    assert data.meta["sizes"]["train"] + data.meta["sizes"]["val"] == 12  # the good zip's 3 x 4, not 3 x 5


def test_bug_a_tu_zip_rewritten_while_extracted_leaves_no_marker_under_the_old_hash(tmp_path, cache, data_writers,
                                                                                   monkeypatch):
    """Bug: ``load_tu`` hashed the zip, then ``extract_tu_zip`` read it and recorded the first hash: a zip rewritten
    in between left the new zip's tables under the old hash, reused for the old zip ever after. Now the zip is hashed
    again after the extraction; a change is a ``CorruptDataError`` and the marker is removed."""
    import diffusionformer.data.tu as tu

    root = _tu_root(tmp_path, data_writers)
    zip_path = root / "tudataset" / "MUTAG.zip"
    good = zip_path.read_bytes()
    other = data_writers.write_tu_zip(tmp_path / "other.zip", "MUTAG", graphs_per_class=12).read_bytes()
    _swap_before(tu, "extract_tu_zip", monkeypatch, zip_path, other)
    with pytest.raises(CorruptDataError, match=r"MUTAG\.zip' changed while it was read"):
        load_dataset("mutag", root=root, verify=False)
    zip_path.write_bytes(good)
    assert len(load_dataset("mutag", root=root, verify=False).dataset) == 20  # the good zip's graphs, not 24


@pytest.mark.skipif(not (STAGED / "mnist" / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz").is_file(),
                    reason="the staged MNIST labels (../shared/data) are absent")
def test_bug_mnist_bytes_read_before_the_file_was_rewritten_are_not_verified_by_it(tmp_path, monkeypatch):
    """Bug: ``mnist._read`` read the IDX bytes, then ``verify_file`` hashed the file on disk: a file rewritten in
    between (a doctored one replaced by the original) passed the SHA256 check with the doctored labels read. Now the
    file is hashed before the read and again after it; a change is a ``CorruptDataError``."""
    import diffusionformer.data.mnist as mnist
    from diffusionformer.data.idx import IDX_LABELS_MAGIC

    rel = "mnist/MNIST/raw/t10k-labels-idx1-ubyte.gz"
    path = tmp_path / rel
    path.parent.mkdir(parents=True)
    good = (STAGED / rel).read_bytes()
    labels = np.frombuffer(gzip.decompress(good)[8:], dtype=np.uint8).copy()
    labels[:100] = 0  # doctored: the first 100 test labels all zeros
    path.write_bytes(gzip.compress(struct.pack(">II", IDX_LABELS_MAGIC, labels.size) + labels.tobytes()))
    real = mnist.read_idx_bytes

    def read_then_restore(p):
        raw = real(p)
        p.write_bytes(good)  # the original back, after the doctored bytes were read
        return raw

    monkeypatch.setattr(mnist, "read_idx_bytes", read_then_restore)
    with pytest.raises(CorruptDataError, match=r"t10k-labels-idx1-ubyte\.gz' changed while it was read"):
        mnist._read(tmp_path, rel, IDX_LABELS_MAGIC, True)


@pytest.mark.skipif(os.name != "posix", reason="sparse files as on POSIX")
def test_bug_a_sparse_planetoid_file_of_gigabytes_is_refused_unread(tmp_path, data_writers):
    """Bug: ``_unpickle_planetoid`` read each ``ind.*`` file whole (``path.read_bytes()``) before the unpickler looked
    at it: a sparse file of 1.5 GB (no disk space) filled 1.5 GB of memory with zeros, and one of tens of GB all of
    it. Now a file over 1 GiB (Planetoid's largest is about 40 MB) is refused, unread."""
    from diffusionformer.data.planetoid import _planetoid_index, _planetoid_matrix

    raw = data_writers.write_planetoid_layout(tmp_path)
    for part, read in (("allx", _planetoid_matrix), ("test.index", _planetoid_index)):
        path = raw / f"ind.cora.{part}"
        with open(path, "r+b") as f:
            f.truncate(3 << 29)
        tracemalloc.start()
        try:
            with pytest.raises(CorruptDataError, match=rf"ind\.cora\.{part}'.* more than any Planetoid file"):
                read(path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 64 << 20, part


def test_bug_a_data_root_that_is_a_file_or_absent_and_a_folder_named_like_a_data_file_are_said(tmp_path):
    """Bug: a data root that is a file, a data root that does not exist and a folder (or FIFO) where a data file
    belongs were all "missing file(s) under the data root", as if the root were a folder lacking them and the path
    were absent; ``ls`` showed otherwise. The message now says what is there."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DataRootError, match=r"missing file\(s\) under the data root '.*afile' \(it is a file, not a "
                                            r"folder\)"):
        load_dataset("tinyshakespeare", root=tmp_path / "afile")
    with pytest.raises(DataRootError, match=r"under the data root '.*nowhere' \(it does not exist\)"):
        load_dataset("tinyshakespeare", root=tmp_path / "nowhere")
    (tmp_path / "tinyshakespeare" / "input.txt").mkdir(parents=True)
    with pytest.raises(DataRootError, match=r"tinyshakespeare/input\.txt \(a folder, not a file\)"):
        load_dataset("tinyshakespeare", root=tmp_path)
    if hasattr(os, "mkfifo"):
        (tmp_path / "tinyshakespeare" / "input.txt").rmdir()
        os.mkfifo(tmp_path / "tinyshakespeare" / "input.txt")
        with pytest.raises(DataRootError, match=r"tinyshakespeare/input\.txt \(a FIFO, not a file\)"):
            load_dataset("tinyshakespeare", root=tmp_path)


def test_bug_loaders_of_one_tu_dataset_take_turns_over_its_cache(tmp_path, cache, data_writers):
    """Bug: two loaders of one TU dataset at once (the runner's workers, threads) unzipped into one cache folder
    together: one unlinked the tables and removed ``processed/`` while the other's PyG read or wrote them (three
    threads loading MUTAG from a cold cache, 20 times: 14 of 60 loads failed with a bare ``EOFError``, a miniz
    "file read failed" or PyG's download attempt). Now the extraction and PyG's processing hold a lock of the
    dataset's cache folder (``folder_lock``): a second loader waits for the first and reuses its files."""
    import threading

    from diffusionformer._files import folder_lock

    root = _tu_root(tmp_path, data_writers)
    load_dataset("mutag", root=root, verify=False)  # warm: a load below takes a few milliseconds
    done: list[int] = []
    loader = threading.Thread(target=lambda: done.append(len(load_dataset("mutag", root=root, verify=False).dataset)))
    with folder_lock(cache / "tudataset" / "MUTAG"):  # another loader in the middle of its extraction
        loader.start()
        loader.join(timeout=1.0)
        assert loader.is_alive() and not done  # waits its turn
    loader.join(timeout=30)
    assert done == [20]


def test_bug_a_tu_marker_that_is_not_text_is_a_stale_cache_not_a_crash(tmp_path, cache, data_writers):
    """Bug: the marker of the extracted TU tables was read with ``read_text()``: a damaged one (bytes that are not
    UTF-8) failed every later load with a bare ``UnicodeDecodeError`` naming no file. It now names no digest, so the
    zip is extracted again."""
    root = _tu_root(tmp_path, data_writers)
    load_dataset("mutag", root=root, verify=False)
    marker = cache / "tudataset" / "MUTAG" / "raw" / ".source_sha256"
    marker.write_bytes(b"\xff\xfe\x00garbage")
    assert len(load_dataset("mutag", root=root, verify=False).dataset) == 20
    assert marker.read_text().startswith(tuple("0123456789abcdef"))


@pytest.mark.skipif(not (STAGED / "tinyshakespeare" / "input.txt").is_file(),
                    reason="the staged tinyshakespeare corpus (../shared/data) is absent")
def test_bug_tinyshakespeare_rewritten_after_its_checksum_is_not_loaded_as_verified(tmp_path, monkeypatch):
    """Bug: ``load_tinyshakespeare`` checked the file's SHA256, then read it: a file rewritten in between (another
    process) was loaded as the verified corpus. Now the hash is taken again after the read; a change is a
    ``CorruptDataError``."""
    import diffusionformer.data.text as text

    path = tmp_path / "tinyshakespeare" / "input.txt"
    path.parent.mkdir()
    shutil.copyfile(STAGED / "tinyshakespeare" / "input.txt", path)
    _swap_before(text, "read_text", monkeypatch, path, b"not Shakespeare at all\n" * 100)
    with pytest.raises(CorruptDataError, match=r"input\.txt' changed while it was read"):
        load_dataset("tinyshakespeare", root=tmp_path)


def test_bug_a_file_where_the_tu_processed_folder_belongs_is_rebuilt(tmp_path, cache, data_writers):
    """Bug: a file in place of PyG's ``processed/`` folder of the TU cache (a damaged cache, a copy gone wrong) was
    left there by ``drop_unsafe_processed``, and every load failed with PyG's bare ``FileExistsError``. It is now
    removed, with a warning, and the folder rebuilt from ``raw/``."""
    root = _tu_root(tmp_path, data_writers)
    load_dataset("mutag", root=root, verify=False)
    processed = cache / "tudataset" / "MUTAG" / "processed"
    shutil.rmtree(processed)
    processed.write_text("not a folder")
    with pytest.warns(UserWarning, match=r"processed: a file where PyG keeps its processed files"):
        assert len(load_dataset("mutag", root=root, verify=False).dataset) == 20
    assert processed.is_dir()
