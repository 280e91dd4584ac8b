"""Smoke tests of ``benchmarks/bench_sparse_layout.py`` (the shared CSR layout of ``ops.csr._edge_layout`` against a
layout per call): a ``--quick`` run writes its tables, checks every case bit for bit on both paths and puts the
library's ``_edge_layout`` back; the bit-identity check catches an old path that computes something else. CPU only,
files only under ``tmp_path``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import bench_sparse_layout as SL  # noqa: E402
from diffusionformer.ops import csr, sparse  # noqa: E402


def test_quick_run_writes_every_case_checked_and_restores_the_library(tmp_path):
    rep = SL.main(["--quick", "--device", "cpu", "--threads", "1", "--rounds", "2", "--out", str(tmp_path)])
    assert sparse._edge_layout is csr._edge_layout  # the new path is the library's, and it is back
    assert len(rep.rows) == 5
    for row in rep.rows:
        assert row["identical"] == "yes"
        assert row["ratio_old_over_new"][0] > 0
        assert len(row["samples"]["old"]) == len(row["samples"]["new"]) == 2
    built = {row["case"]: row["layouts_per_call"] for row in rep.rows}
    # the old path sorts per sparse call (one per layer), the new one once per edge_index (the models add self
    # loops, a new tensor, in every forward pass; the single layer's edges were seen before)
    assert built["one layer, forward + backward"] == {"old": (1, 1), "new": (0, 0)}
    assert built["depth 4, forward + backward (train)"] == {"old": (4, 4), "new": (1, 1)}
    assert built["depth 4, forward (eval, no_grad)"] == {"old": (4, 0), "new": (1, 0)}
    assert built["depth 4, full-batch training step (AdamW)"] == {"old": (4, 4), "new": (1, 1)}
    md = (tmp_path / "bench_sparse_layout.md").read_text()
    assert "python benchmarks/bench_sparse_layout.py --device cpu --quick --threads 1 --rounds 2" in md
    assert md.count("| yes ") == 5
    payload = json.loads((tmp_path / "bench_sparse_layout.json").read_text())
    assert payload["name"] == "bench_sparse_layout" and len(payload["rows"]) == 5


def test_an_old_path_with_other_values_fails_the_bit_identity_check(monkeypatch):
    def wrong(edge_index, num_nodes):  # the edges reversed: other outputs
        return csr.EdgeLayout(edge_index.flip(0), num_nodes)
    monkeypatch.setitem(SL._IMPL, "old", wrong)
    case, _, check = SL.cases(*SL.SIZES["quick"], "cpu")[0]
    with pytest.raises(AssertionError, match="one layer, forward \\+ backward: output differs"):
        SL.check_identical(case, check)
    assert sparse._edge_layout is csr._edge_layout


def test_layout_path_is_restored_after_an_error():
    with pytest.raises(RuntimeError):
        with SL.layout_path("old"):
            assert sparse._edge_layout is SL._old
            raise RuntimeError("boom")
    assert sparse._edge_layout is csr._edge_layout


def test_a_path_that_does_not_reproduce_itself_is_reported_not_asserted():
    """On a device whose kernels do not reproduce their bits (atomics), old and new cannot be told apart by bits: the
    table says so with the largest differences instead of failing the run."""
    g = torch.Generator().manual_seed(0)
    got = SL.check_identical("noisy", lambda: [("output", torch.ones(3) + 1e-6 * torch.rand(3, generator=g))])
    assert got.startswith("n/a: the old path differs from itself (max |old - old| ")
    assert sparse._edge_layout is csr._edge_layout
