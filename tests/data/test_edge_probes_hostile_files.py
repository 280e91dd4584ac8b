"""Edge-case probes of hostile and corrupt files under a data root: the restricted unpickler of CIFAR batches (and
Planetoid files), the CIFAR batch and meta checks, and the copy of raw files into the cache.

Found and fixed (tests whose docstring starts with "Bug:"):

* ``_unpickle._plain``: a list referenced from many places (``[L, L]`` nested 60 deep, a few hundred bytes) was
  copied once per path (2**60 copies: the loader never returned); a list holding itself, or lists nested
  thousands deep, raised a bare ``RecursionError``.
* ``_unpickle``: strings of width 0 (``S0``/``U0``) let a 200-byte file declare 10**18 items (``label_names``
  then asked for a list of 10**18 names); unicode data with code points beyond U+10FFFF made ``str`` objects that
  Python cannot handle (``SystemError``, or a broken class name handed on).
* ``_unpickle``: the pickle's BUILD on the allow-listed globals set attributes of the library's shared objects
  (``_reconstruct.__defaults__``, ``__qualname__``, the ``ndarray`` stand-in's ``__dict__``), for every later file.
* cifar10.py: a batch or meta with a 5,000-digit int key or name, or a tuple nested thousands deep, failed while
  writing its own message (bare ``ValueError``/``RecursionError``); labels nested as ``[L, L]`` 31 deep (316
  bytes) were expanded by ``np.asarray`` into an array of 2**31 labels (seconds, then gigabytes or MemoryError).
* paths.py ``copy_into_cache``: a source that cannot be copied (a folder, a FIFO) left its temporary file in
  the cache folder.
* planetoid.py: the unpickler handed out SciPy's ``csr_matrix`` class itself, so a Planetoid file's BUILD on it
  set attributes of SciPy's class for the whole process.

Probed and found sound: GLOBAL/STACK_GLOBAL/INST/OBJ/EXT1 of ``os.system``, persistent ids, memo tricks, huge
declared shapes and negative or overflowing dims (MemoryError/ValueError, named), truncated pickles; IDX headers
with a wrong magic, 0 to 255 dims, dims whose product overflows, lengths not matching the file, truncated or
damaged gzip, trailing members, gzip bombs; FIFOs and folders where files are expected (``is_file`` refuses them).
"""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from diffusionformer.data import CorruptDataError
from diffusionformer.data import _unpickle as unpickle_mod
from diffusionformer.data.cifar10 import _unpickle, read_cifar_batch, read_cifar_meta
from diffusionformer.data.paths import copy_into_cache


def _shared_lists(levels: int, leaf: bytes = b"") -> bytes:
    """Protocol-4 pickle of ``{"data": L}`` where ``L = [M, M]``, ``M = [N, N]``, ... ``levels`` deep (memo gets),
    around ``leaf`` items (pickle ops) in the innermost list."""
    raw = b"\x80\x04}X\x04\x00\x00\x00data(" + leaf + b"lq\x000"
    raw += b"(h\x00h\x00lq\x000" * levels
    return raw + b"h\x00s."


def _write(path: Path, raw: bytes) -> Path:
    path.write_bytes(raw)
    return path


def test_bug_shared_lists_are_walked_once_not_once_per_path(tmp_path):
    """Bug: ``_plain`` rebuilt every list holding a list, so a list referenced twice was copied twice: ``[L, L]``
    nested 60 deep (about 500 bytes) meant 2**60 copies and a CIFAR batch that never finished loading."""
    small = _unpickle(_write(tmp_path / "small", _shared_lists(3)))["data"]
    assert small[0] is small[1] and small[0][0] is small[1][1]  # the sharing kept, not copied per path
    huge = _unpickle(_write(tmp_path / "huge", _shared_lists(60)))["data"]
    assert huge[0] is huge[1]


def test_bug_self_referential_or_deeply_nested_lists_are_a_corrupt_file(tmp_path):
    """Bug: a batch whose list held itself, or lists nested 100,000 deep (a C unpickler builds them without
    recursion), raised a bare ``RecursionError`` from ``_plain`` naming no file."""
    itself: list = []
    itself.append(itself)
    path = _write(tmp_path / "data_batch_1", pickle.dumps({b"data": itself, b"labels": itself}, protocol=2))
    with pytest.raises(CorruptDataError, match=r"'.*data_batch_1': labels are not a flat list of integers"):
        read_cifar_batch(path)
    deep = b"\x80\x04}X\x04\x00\x00\x00data" + b"](" * 100_000 + b"e" * 100_000 + b"s."
    path = _write(tmp_path / "data_batch_2", deep)
    with pytest.raises(CorruptDataError, match=r"corrupt CIFAR batch '.*data_batch_2': lists or dicts nested too deep"):
        read_cifar_batch(path)


def test_bug_zero_width_strings_cannot_declare_unbounded_items(tmp_path):
    """Bug: ``S0``/``U0`` arrays passed the dtype check, and 10**18 of them fit in 0 bytes of data: a 200-byte
    ``batches.meta`` gave ``label_names`` of 10**18 items (``tolist`` then asked for 10**18 names: MemoryError or
    gigabytes). NumPy writes no 0-wide strings (``np.zeros(3, "S0")`` is ``S1``)."""
    raw = pickle.dumps({b"label_names": np.zeros(3, "S1")}, protocol=4)
    for old, new in ((b"K\x03\x85", b"\x8a\x08" + struct.pack("<q", 10**18) + b"\x85"), (b"\x8c\x02S1", b"\x8c\x02S0"),
                     (b"C\x03\x00\x00\x00", b"C\x00"), (b"K\x01K\x01K\x00t", b"K\x00K\x01K\x00t")):
        assert raw.count(old) == 1
        raw = raw.replace(old, new)
    path = _write(tmp_path / "batches.meta", raw)
    with pytest.raises(CorruptDataError, match=r"'.*batches\.meta': an array of dtype dtype\('S'\) .*width 0"):
        read_cifar_meta(path)
    with pytest.raises(pickle.UnpicklingError, match="width 0"):
        unpickle_mod._scalar(np.dtype("U0"), b"")


@pytest.mark.parametrize("as_array", [True, False])
def test_bug_unicode_beyond_u10ffff_is_a_corrupt_file(tmp_path, as_array):
    """Bug: ``U`` data holding the code point 0xffffffff loaded: an array gave ``label_names`` with a ``str`` that
    Python cannot handle (``ord`` of it: ``SystemError``), a scalar raised a bare ``SystemError`` while loading."""
    names = np.array([c * 2 for c in "abcdefghij"]) if as_array else [np.str_(c * 2) for c in "abcdefghij"]
    raw = pickle.dumps({b"label_names": names}, protocol=4)
    assert raw.count(b"a\x00\x00\x00a\x00\x00\x00") == 1
    path = _write(tmp_path / "batches.meta", raw.replace(b"a\x00\x00\x00a\x00\x00\x00", b"\xff\xff\xff\xffa\x00\x00\x00"))
    with pytest.raises(CorruptDataError, match=r"'.*batches\.meta': an? (array|scalar) .* code point 0xffffffff"):
        read_cifar_meta(path)


def test_bug_hostile_keys_and_names_do_not_break_the_message(tmp_path):
    """Bug: a batch whose only key was a 5,000-digit int, or a tuple nested 100,000 deep, and a meta with
    5,000-digit int names, raised a bare ``ValueError`` (int to str) or ``RecursionError`` (repr) while writing
    the "expected keys" / "label_names" message."""
    path = _write(tmp_path / "data_batch_1", pickle.dumps({2**20000: 1, 7: 2, "data": 0}, protocol=2))
    with pytest.raises(CorruptDataError, match=r"expected keys 'data' and 'labels', got \[7, <int>, 'data'\]"):
        read_cifar_batch(path)
    path = _write(tmp_path / "data_batch_2", b"\x80\x04}N" + b"\x85" * 100_000 + b"K\x01s.")
    with pytest.raises(CorruptDataError, match=r"expected keys 'data' and 'labels', got \[<tuple>\]"):
        read_cifar_batch(path)
    path = _write(tmp_path / "batches.meta", pickle.dumps({"label_names": [2**20000] * 9 + ["x"]}, protocol=2))
    with pytest.raises(CorruptDataError, match=r"label_names must list 10 .*got 10: \[<int>, .*<int>, 'x'\]"):
        read_cifar_meta(path)


def test_bug_labels_nested_as_shared_lists_are_refused_before_numpy_expands_them(tmp_path):
    """Bug: labels ``[L, L]`` nested 31 deep (316 bytes) went to ``np.asarray``, which expanded them into an
    array of 2**31 labels (15 s, then gigabytes or a bare MemoryError) before any check."""
    raw = _shared_lists(20, leaf=b"K\x01").replace(b"X\x04\x00\x00\x00data", b"X\x06\x00\x00\x00labels")
    raw = raw[:-1] + b"X\x04\x00\x00\x00dataC\x00s."  # and data = b""
    path = _write(tmp_path / "data_batch_1", raw)
    with pytest.raises(CorruptDataError, match=r"'.*data_batch_1': labels are not a flat list of integers "
                                               r"\(an item is a list\)"):
        read_cifar_batch(path)


@pytest.mark.parametrize("build", [
    b"\x80\x02cnumpy.core.multiarray\n_reconstruct\nN}X\x0c\x00\x00\x00__defaults__(K\x01ts\x86b0}.",
    b"\x80\x02c_codecs\nencode\nN}X\x0c\x00\x00\x00__qualname__X\x01\x00\x00\x00xs\x86b0}.",
    b"\x80\x02cnumpy._core.multiarray\nscalar\n}X\x03\x00\x00\x00abcK\x01sb0}.",
    b"\x80\x02cnumpy\nndarray\n}X\x03\x00\x00\x00abcK\x01sb0}.",
])
def test_bug_build_on_an_allowed_global_cannot_change_it_for_later_files(tmp_path, build):
    """Bug: the pickle's BUILD on an allow-listed global set attributes of the library's own shared objects (it
    loaded as an empty dict): ``_reconstruct.__defaults__``, ``_encode.__qualname__``, ``_scalar.abc``, the
    ``ndarray`` stand-in's ``abc`` stayed changed for every later file read in the process."""
    path = _write(tmp_path / "data_batch_1", build)
    with pytest.raises(CorruptDataError, match=r"'.*data_batch_1': setting attributes of .* is not allowed"):
        read_cifar_batch(path)
    assert unpickle_mod._reconstruct.__defaults__ is None
    assert unpickle_mod._encode.__qualname__ == "_encode"
    assert not hasattr(unpickle_mod._scalar, "abc")
    assert not hasattr(unpickle_mod._NDARRAY, "abc")


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_bug_copy_into_cache_leaves_no_temporary_file(tmp_path, kind):
    """Bug: ``copy_into_cache`` made its temporary file, then ``shutil.copyfile`` failed on a source that is a
    folder or a FIFO, and the ``.<name>.XXXX`` file stayed in the cache folder (one more per call)."""
    src = tmp_path / "root" / "ind.cora.x"
    src.parent.mkdir()
    if kind == "folder":
        src.mkdir()
    else:
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs here")
        os.mkfifo(src)
    dest = tmp_path / "cache"
    with pytest.raises(OSError):  # IsADirectoryError, shutil.SpecialFileError
        copy_into_cache([src], dest)
    assert list(dest.iterdir()) == []


@pytest.mark.parametrize("state", ["dict", "slots"])
def test_bug_a_planetoid_build_on_csr_matrix_cannot_change_scipys_class(tmp_path: Path, state: str) -> None:
    """Bug: the Planetoid unpickler handed out SciPy's own ``csr_matrix``; a file's BUILD on the global (not on an
    instance) set ``csr_matrix.pwned = 1`` for the whole process. The file is corrupt now and SciPy's class intact;
    a real-shaped file (NEWOBJ, then BUILD of the instance) still loads."""
    pytest.importorskip("scipy")
    from scipy.sparse import csr_matrix

    from diffusionformer.data.planetoid import _planetoid_matrix

    build = b"}X\x05\x00\x00\x00pwnedK\x01s" if state == "dict" else b"N}X\x05\x00\x00\x00pwnedK\x01s\x86"
    raw = b"\x80\x02cscipy.sparse.csr\ncsr_matrix\n" + build + b"b."
    with pytest.raises(CorruptDataError, match="corrupt Planetoid file"):
        _planetoid_matrix(_write(tmp_path / "ind.x.x", raw))
    assert not hasattr(csr_matrix, "pwned")
    good = csr_matrix(np.array([[0.0, 2.0], [3.0, 0.0]], dtype=np.float32))
    path = _write(tmp_path / "ind.x.allx", pickle.dumps(good, protocol=2))
    np.testing.assert_array_equal(_planetoid_matrix(path).numpy(), good.toarray())
