"""Edge probes of the graph dataset readers (Planetoid ``ind.*`` pickles, TU zips), second pass."""

from __future__ import annotations

import pickle
import shutil

import numpy as np
import pytest
import scipy.sparse as sp

from diffusionformer.data import CorruptDataError
from diffusionformer.data import tu
from diffusionformer.data.planetoid import read_planetoid


def _doctored_tx(raw, **state) -> None:
    """Replace ``ind.cora.tx`` by a CSR pickle of the right shape whose arrays are ``state`` (None: left out)."""
    m = sp.csr_matrix(np.eye(20, 9, dtype=np.float32))
    for key, value in state.items():
        if value is None:
            del m.__dict__[key]
        else:
            m.__dict__[key] = value
    (raw / "ind.cora.tx").write_bytes(pickle.dumps(m, protocol=2))


@pytest.fixture()
def toarray_tripwire(monkeypatch):
    """SciPy's ``csr_matrix.toarray`` refusing arrays that do not fit the shape (it would read and write outside
    its buffers: a segmentation fault), so a reader that forgets to check them fails the test, not pytest."""
    real_toarray = sp.csr_matrix.toarray

    def tripwire(self, *args, **kwargs):
        rows, cols = self.shape
        ptr, ind = self.__dict__.get("indptr"), self.__dict__.get("indices")
        if ptr is None or ind is None or "data" not in self.__dict__ or len(ptr) != rows + 1 or ptr[-1] > len(ind) \
                or (len(ind) and not 0 <= ind.min() <= ind.max() < cols):
            raise AssertionError("toarray() called on unchecked CSR arrays (a segmentation fault in SciPy)")
        return real_toarray(self, *args, **kwargs)

    monkeypatch.setattr(sp.csr_matrix, "toarray", tripwire)


@pytest.mark.parametrize("state", [
    {"indptr": np.array([0, 1], dtype=np.int32)},  # too short: SciPy read past it
    {"indptr": None},  # a bare AttributeError
    {"indices": None},
], ids=["short-indptr", "no-indptr", "no-indices"])
def test_bug_planetoid_csr_with_inconsistent_arrays_is_named(tmp_path, writers, toarray_tripwire, state):
    """Bug: a CSR pickle whose index arrays did not fit its shape went to SciPy's toarray() unchecked: a short
    indptr read past its buffer (zero rows or a segmentation fault), a missing array a bare AttributeError instead
    of a CorruptDataError."""
    raw = writers.write_planetoid_layout(tmp_path)
    _doctored_tx(raw, **state)
    with pytest.raises(CorruptDataError, match=r"ind\.cora\.tx"):
        read_planetoid(raw, "cora")


@pytest.mark.parametrize("part, value", [("indices", 10**8), ("indices", -10**8), ("indptr", 10**8)])
def test_bug_planetoid_csr_indices_out_of_range_never_reach_toarray(tmp_path, writers, toarray_tripwire, part,
                                                                      value):
    """Bug: a CSR pickle with a column index (or indptr) past its arrays went to SciPy's toarray() unchecked,
    which reads and writes outside its buffers: a segmentation fault of the whole process from a doctored
    ``ind.*`` file."""
    raw = writers.write_planetoid_layout(tmp_path)
    arrays = {"indices": np.arange(20, dtype=np.int32) % 9, "indptr": np.arange(21, dtype=np.int32)}
    arrays[part][-1] = value
    _doctored_tx(raw, **{part: arrays[part]})

    with pytest.raises(CorruptDataError, match=r"ind\.cora\.tx.*ValueError"):
        read_planetoid(raw, "cora")


def test_planetoid_valid_csr_still_reads_after_the_format_check(tmp_path, writers):
    raw = writers.write_planetoid_layout(tmp_path)
    data = read_planetoid(raw, "cora")
    tx = pickle.loads((raw / "ind.cora.tx").read_bytes()).toarray()
    test_index = [int(v) for v in (raw / "ind.cora.test.index").read_text().split()]
    assert np.array_equal(data.x[test_index].numpy(), tx)


def test_bug_tu_stale_processed_survives_a_kill_after_the_marker(tmp_path, writers, monkeypatch):
    """Bug: extract_tu_zip wrote the new zip's digest marker before removing the old ``processed/``; a run
    killed in between left the marker saying "done", so every later load kept PyG's graphs of the old zip."""
    zip_a = writers.write_tu_zip(tmp_path / "a" / "MUTAG.zip", "MUTAG", graphs_per_class=3)
    zip_b = writers.write_tu_zip(tmp_path / "b" / "MUTAG.zip", "MUTAG", graphs_per_class=5)
    raw = tmp_path / "cache" / "MUTAG" / "raw"
    tu.extract_tu_zip(zip_a, "MUTAG", raw, "digest-a")
    processed = raw.parent / "processed"
    processed.mkdir()
    (processed / "data.pt").write_bytes(b"graphs of zip a")

    real_rmtree = shutil.rmtree

    def killed(path, *args, **kwargs):
        if str(path).endswith("processed"):
            raise KeyboardInterrupt  # the run is killed while it drops the stale cache
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(tu.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        tu.extract_tu_zip(zip_b, "MUTAG", raw, "digest-b")
    monkeypatch.setattr(tu.shutil, "rmtree", real_rmtree)
    tu.extract_tu_zip(zip_b, "MUTAG", raw, "digest-b")
    assert not processed.exists()
    assert len((raw / "MUTAG_graph_labels.txt").read_text().split()) == 10
