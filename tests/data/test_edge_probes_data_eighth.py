"""Edge probes, eighth pass: on-disk dataset readers fed integers beyond 64 bits (TU tables, Planetoid's
``test.index``), which the readers hand to ``torch.tensor`` (directly or through PyG)."""

from __future__ import annotations

import zipfile

import pytest

from diffusionformer.data import CACHE_ENV
from diffusionformer.data.paths import CorruptDataError
from diffusionformer.data.planetoid import read_planetoid
from diffusionformer.data.tu import load_tu


def _rewrite_tu_line(path, table: str, line: int, value: str) -> None:
    with zipfile.ZipFile(path) as zf:
        files = {n: zf.read(n) for n in zf.namelist()}
    key = f"MUTAG//MUTAG_{table}.txt"
    lines = files[key].decode().split("\n")
    lines[line] = value
    files[key] = "\n".join(lines).encode()
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)


@pytest.mark.parametrize("table,value", [("graph_labels", str(2**63)), ("graph_labels", str(-(2**63) - 1)),
                                         ("node_labels", str(2**64))])
def test_bug_tu_label_beyond_64_bits_is_named(tmp_path, monkeypatch, writers, table, value):
    """Bug: TU tables were checked as Python ints of any size, so a graph label (or node label) beyond 64 bits
    passed ``_check_tu_tables`` and reached PyG's reader, whose ``torch.tensor`` failed with a bare
    ``ValueError: Overflow when unpacking long long`` naming neither the archive nor the table."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    zip_path = writers.write_tu_zip(tmp_path / "root" / "tudataset" / "MUTAG.zip", "MUTAG")
    _rewrite_tu_line(zip_path, table, 0, value)
    with pytest.raises(CorruptDataError, match=rf"MUTAG\.zip'.*line 1 of MUTAG_{table}\.txt is '{value}', expected "
                                               r"integers of 64 bits"):
        load_tu("mutag", root=tmp_path / "root", seed=0, verify=False)
    # the largest 64-bit label is still read (PyG remaps graph labels to 0..C-1)
    _rewrite_tu_line(zip_path, "graph_labels", 0, str(2**63 - 1))
    _rewrite_tu_line(zip_path, "node_labels", 0, "0")
    data = load_tu("mutag", root=tmp_path / "root", seed=0, verify=False)
    assert data.num_classes == 3


def test_bug_planetoid_test_index_beyond_64_bits_is_named(tmp_path, writers):
    """Bug: ``_planetoid_index`` parsed ``test.index`` as Python ints and then called ``torch.tensor`` outside its
    error handling, so an index beyond 64 bits was a bare ``ValueError: Overflow when unpacking long long`` that
    named no file (every other bad index names ``ind.<name>.test.index``)."""
    raw = writers.write_planetoid_layout(tmp_path)
    path = raw / "ind.cora.test.index"
    lines = path.read_text().split("\n")
    for value in (2**64, -(2**63) - 1):
        lines[0] = str(value)
        path.write_text("\n".join(lines))
        with pytest.raises(CorruptDataError, match=rf"ind\.cora\.test\.index'.*node index {value} does not fit in "
                                                   r"64 bits"):
            read_planetoid(raw, "cora")
    lines[0] = str(2**63 - 1)  # fits: refused as out of range by the existing check, naming the files
    path.write_text("\n".join(lines))
    with pytest.raises(CorruptDataError, match=r"a node index is outside"):
        read_planetoid(raw, "cora")


def test_bug_an_image_zip_with_two_entries_of_one_name_is_corrupt(tmp_path, writers):
    """Bug: a zip holding ``train/cat/0.jpg`` twice (appended to with ``zipfile`` mode "a") listed both entries and
    read the last copy for each, so one image came twice (in train and val, perhaps); now named as corrupt."""
    import warnings

    from diffusionformer.data.cifar10 import read_image_zip

    path = writers.write_stored_zip(tmp_path / "train.zip", [("train/cat/0.jpg", writers.jpeg_bytes((200, 0, 0))),
                                                             ("train/dog/0.jpg", writers.jpeg_bytes((0, 200, 0)))])
    images, labels, _ = read_image_zip(path, "train")
    assert labels.tolist() == [0, 1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile: "Duplicate name"
        with zipfile.ZipFile(path, "a") as zf:
            zf.writestr("train/cat/0.jpg", writers.jpeg_bytes((0, 0, 200)))
    with pytest.raises(CorruptDataError, match=r"train\.zip'?: holds two entries named 'train/cat/0\.jpg'"):
        read_image_zip(path, "train")
