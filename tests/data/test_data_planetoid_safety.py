"""Planetoid files are read without running code from them, and damage is a named ValueError."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from diffusionformer.data import CorruptDataError, load_dataset
from diffusionformer.data.planetoid import read_planetoid


class _RunsShell:
    """A pickle whose loading calls ``os.system`` (what a doctored ``ind.*`` file can do)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.mark.parametrize("name,gap", [("Cora", False), ("CiteSeer", True)])
def test_reader_matches_pyg_on_valid_files(tmp_path, writers, name, gap):
    """The reference is PyG's own reader (plain pickle: fine on files we just wrote)."""
    from torch_geometric.io import read_planetoid_data

    raw = writers.write_planetoid_layout(tmp_path, name, gap=gap)
    ours, ref = read_planetoid(raw, name.lower()), read_planetoid_data(str(raw), name.lower())
    for key in ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(ours, key), getattr(ref, key)), key
    data = load_dataset(name.lower(), root=tmp_path, verify=False)  # our files are not the staged ones
    assert data.num_classes == 3 and data.num_features == 9


@pytest.mark.parametrize("part", ["graph", "x", "ally"])
def test_a_pickle_that_runs_code_is_refused_and_never_runs(tmp_path, writers, part):
    raw = writers.write_planetoid_layout(tmp_path)
    sentinel = tmp_path / "pwned"
    (raw / f"ind.cora.{part}").write_bytes(pickle.dumps(_RunsShell(f"touch {sentinel}"), protocol=2))
    with pytest.raises(CorruptDataError, match=rf"ind\.cora\.{part}'.*global (posix|os|nt)\.system is not allowed"):
        load_dataset("cora", root=tmp_path, verify=False)
    assert not sentinel.exists()


@pytest.mark.parametrize("part", ["graph", "allx", "test.index"])
def test_a_truncated_file_is_a_value_error_naming_it(tmp_path, writers, part):
    raw = writers.write_planetoid_layout(tmp_path)
    path = raw / f"ind.cora.{part}"
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2] if part != "test.index" else b"12\n3x")
    with pytest.raises(ValueError, match=rf"corrupt Planetoid file .*ind\.cora\.{part.replace('.', '[.]')}"):
        load_dataset("cora", root=tmp_path, verify=False)


def test_wrong_types_and_sizes_are_named(tmp_path, writers):
    raw = writers.write_planetoid_layout(tmp_path)
    (raw / "ind.cora.graph").write_bytes(pickle.dumps([1, 2, 3], protocol=2))
    with pytest.raises(CorruptDataError, match=r"ind\.cora\.graph'.*expected a dict"):
        read_planetoid(raw, "cora")
    raw = writers.write_planetoid_layout(tmp_path / "b")
    (raw / "ind.cora.test.index").write_text("1\n2\n")
    with pytest.raises(CorruptDataError, match="inconsistent sizes"):
        read_planetoid(raw, "cora")


def test_a_doctored_processed_cache_file_is_refused_rebuilt_and_never_runs(tmp_path, writers, monkeypatch):
    """PyG retries a file that ``torch.load(weights_only=True)`` refuses with ``weights_only=False``;
    our loaders check ``processed/*.pt`` first, so a doctored cache file never reaches it."""
    from diffusionformer.data import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    writers.write_tu_zip(tmp_path / "tudataset" / "MUTAG.zip", "MUTAG", node_labels=True)
    first = load_dataset("mutag", root=tmp_path, verify=False)
    data_pt = tmp_path / "cache" / "tudataset" / "MUTAG" / "processed" / "data.pt"
    assert data_pt.is_file()
    sentinel = tmp_path / "pwned"
    torch.save({"payload": _RunsShell(f"touch {sentinel}")}, data_pt)
    with pytest.warns(UserWarning, match=r"cached file refused and rebuilt.*processed/data\.pt: UnpicklingError"):
        again = load_dataset("mutag", root=tmp_path, verify=False)
    assert not sentinel.exists()
    assert len(again.dataset) == len(first.dataset)
    data_pt.write_bytes(data_pt.read_bytes()[:100])  # truncated: rebuilt as well
    with pytest.warns(UserWarning, match=r"processed/data\.pt"):
        load_dataset("mutag", root=tmp_path, verify=False)
    assert not sentinel.exists()


def test_a_doctored_or_truncated_decoded_cache_file_is_named_and_rebuilt(tmp_path):
    from diffusionformer.data.paths import load_cached, save_cached

    path = tmp_path / "images.pt"
    save_cached({"x": torch.arange(3)}, path)
    assert torch.equal(load_cached(path)["x"], torch.arange(3))
    sentinel = tmp_path / "pwned"
    torch.save({"x": _RunsShell(f"touch {sentinel}")}, path)
    with pytest.warns(UserWarning, match=r"cached file refused and rebuilt: .*images\.pt: UnpicklingError"):
        assert load_cached(path) is None
    assert not sentinel.exists()
    path.write_bytes(b"PK\x03\x04 truncated")
    with pytest.warns(UserWarning, match=r"images\.pt"):
        assert load_cached(path) is None
