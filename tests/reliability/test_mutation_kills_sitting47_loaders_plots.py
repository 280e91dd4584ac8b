"""Mutation audit (sitting 47) of the data loaders mnist.py, cifar10.py, planetoid.py and tu.py, ops/scatter.py,
testing/graphs.py and analysis/plots.py: tests that kill mutants the earlier tests left alive (each docstring names
the mutant). No GPU and no staged data are used (the files are written small, in the official layouts).

46 mutants (mnist.py 7, cifar10.py 6, planetoid.py 7, tu.py 6, scatter.py 7, testing/graphs.py 6, plots.py 7):
43 killed by earlier tests, 3 survivors killed here (mnist.py 1, tu.py 2), no equivalent one.
"""

from __future__ import annotations

import gzip

import pytest
import torch


def test_kills_mnist_reads_uncompressed_idx_files(tmp_path, data_writers):
    """kills: data/mnist.py ``_locate`` ``for rel in (f"{stem}.gz", stem)`` -> ``(f"{stem}.gz",)`` (the layout the
    module docstring promises, each file "gzipped or not", was refused as missing when stored uncompressed). The
    pixels and labels are checked against the arrays written."""
    from diffusionformer.data import load_dataset

    arrays = data_writers.write_mnist_layout(tmp_path, n_train=20, n_test=10)
    for packed in list(tmp_path.rglob("*.gz")):  # every file stored uncompressed, under the name without .gz
        packed.with_suffix("").write_bytes(gzip.decompress(packed.read_bytes()))
        packed.unlink()
    data = load_dataset("mnist", root=tmp_path, verify=False, val_size=5, normalize=False, seed=0)
    want = torch.from_numpy(arrays["test_images"]).float().div(255).unsqueeze(1)
    assert torch.equal(data.x_test, want)
    assert data.y_test.tolist() == arrays["test_labels"].tolist()
    assert data.meta["files"]["test_images"].endswith("t10k-images-idx3-ubyte")
    assert data.meta["sizes"] == {"train": 15, "val": 5, "test": 10}


def test_kills_tu_num_folds_checked_without_a_fold(tmp_path):
    """kills: data/tu.py ``load_tu`` ``num_folds < 2`` -> ``num_folds < 1`` (the docstring's "an int >= 2, checked
    either way": one fold, without ``fold``, passed silently). Checked before the zip is looked for."""
    from diffusionformer.data.tu import load_tu

    with pytest.raises(ValueError, match=r"num_folds must be an int >= 2, got 1"):
        load_tu("mutag", root=tmp_path, seed=0, num_folds=1)


def test_kills_tu_graph_indicator_numbered_from_zero(tmp_path):
    """kills: data/tu.py ``_check_tu_tables`` ``or g < 1`` dropped (a 0-based graph indicator, graphs 0, 1, ..., was
    taken: PyG subtracts 1 from each id, so graph 0's nodes got the batch id -1)."""
    from diffusionformer.data import CorruptDataError
    from diffusionformer.data.tu import _check_tu_tables

    tables = {
        "graph_indicator": "0\n0\n0\n1\n1\n1\n",
        "graph_labels": "1\n",  # one label per graph as the 0-based count reads it (last id 1): nothing else trips
        "A": "1, 2\n2, 1\n2, 3\n3, 2\n4, 5\n5, 4\n5, 6\n6, 5\n",
    }
    for part, text in tables.items():
        (tmp_path / f"MUTAG_{part}.txt").write_text(text)
    with pytest.raises(CorruptDataError, match=r"line 1 of MUTAG_graph_indicator\.txt gives graph 0 first"):
        _check_tu_tables(tmp_path, "MUTAG", tmp_path / "MUTAG.zip")
    (tmp_path / "MUTAG_graph_indicator.txt").write_text("1\n1\n1\n2\n2\n2\n")  # numbered from 1, two labels: taken
    (tmp_path / "MUTAG_graph_labels.txt").write_text("1\n-1\n")
    _check_tu_tables(tmp_path, "MUTAG", tmp_path / "MUTAG.zip")
