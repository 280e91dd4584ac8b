"""Tests written in a mutation-testing audit of the data loaders and the training utilities.

Each test kills a mutant of the library code (``diffusionformer/data``: cifar10, tu, planetoid,
csbm, augment, splits, paths; ``diffusionformer/train``: checkpoint, loggers, distributed,
config) that the rest of the suite let through; the docstring of each test names it. The
references are independent of the code under test: hand-worked values, the documented
contract, explicit float64 arithmetic, files written here with the standard library and NumPy.
CPU only, deterministic (seeded generators), files only under ``tmp_path``.

Two tests guard a defect the audit found and fixed (their docstrings start with "Bug"): CIFAR-10
and MNIST accepted a ``val_size`` that left the val split empty, and the run failed with a
``ZeroDivisionError`` at its first evaluation, after training.
"""

from __future__ import annotations

import collections
import json
import math
import os
import pickle
import zipfile

import numpy as np
import pytest
import torch

from diffusionformer.data import CACHE_ENV, CorruptDataError, DataRootError, csbm_graph, load_dataset
from diffusionformer.data.augment import MultiCropAugment, crop_boxes
from diffusionformer.data.cifar10 import read_cifar_batch
from diffusionformer.data.paths import copy_into_cache, load_cached, save_cached
from diffusionformer.data.planetoid import read_planetoid
from diffusionformer.data.splits import carve_val, per_class_split, seeded_subset
from diffusionformer.train import CheckpointError, TrainConfig, load_checkpoint, save_checkpoint
from diffusionformer.train.checkpoint import model_record_differences
from diffusionformer.train.distributed import shard_batch
from diffusionformer.train.loggers import CSVLog, LogGroup
from diffusionformer.train.metrics import MetricsLog


# ---------------------------------------------------------------------------------------- cifar10
def test_an_empty_cifar_batch_is_a_corrupt_file_naming_it(tmp_path, writers):
    """kills: cifar10.py:146 ``EOFError`` dropped from the unpickler's except clause (a 0-byte batch,
    e.g. left by an interrupted copy, raised a bare ``EOFError: Ran out of input`` that names no
    file)"""
    folder = tmp_path / "cifar-10-batches-py"
    writers.write_cifar_batches(folder)
    path = folder / "data_batch_2"
    path.write_bytes(b"")
    with pytest.raises(CorruptDataError, match=r"corrupt CIFAR batch .*data_batch_2"):
        read_cifar_batch(path)
    with pytest.raises(CorruptDataError, match=r"corrupt CIFAR batch .*data_batch_2"):
        load_dataset("cifar10", root=tmp_path, source="pickle")


def test_limit_test_sizes_the_test_part_of_the_pickled_batches(tmp_path, writers):
    """kills: cifar10.py:304 ``seeded_subset(len(y_te), limit_test, seed)`` -> ``limit_train`` (the
    test set of the official batches took the training limit: all 6 test images, not 3)"""
    arrays = writers.write_cifar_batches(tmp_path / "cifar-10-batches-py", per_batch=6)
    data = load_dataset("cifar10", root=tmp_path, normalize=False, val_size=2, limit_train=12, limit_test=3, seed=1)
    assert data.meta["sizes"] == {"train": 10, "val": 2, "test": 3}
    pool = [bytes(row) for row in arrays["test_batch"]]
    rows = data.x_test.mul(255).round().to(torch.uint8).reshape(3, -1).numpy()
    positions = [pool.index(bytes(row)) for row in rows]  # each one a row of the official test batch
    assert positions == sorted(set(positions))  # distinct, in file order


def test_train_and_test_zips_with_different_classes_are_refused(tmp_path, writers):
    """kills: cifar10.py:320 the ``test_classes != classes`` check dropped (a test zip whose third
    class is "horse" instead of "dog" loaded with its horses labelled as dogs)"""
    pytest.importorskip("PIL", reason="Pillow decodes the JPEG archives")
    writers.write_image_zip(tmp_path / "cifar10_jpg" / "train.zip", "train", per_class=2)
    with zipfile.ZipFile(tmp_path / "cifar10_jpg" / "test.zip", "w") as zf:
        for name, colour in (("airplane", (30, 30, 220)), ("cat", (220, 30, 30)), ("horse", (30, 200, 30))):
            zf.writestr(f"test/{name}/0000.jpg", writers.jpeg_bytes(colour))
    with pytest.raises(CorruptDataError, match=r"train classes \['airplane', 'cat', 'dog'\] differ from test classes"):
        load_dataset("cifar10", root=tmp_path, verify=False, source="jpg", val_size=1)


@pytest.mark.parametrize("options", [dict(limit_train=8), dict(val_size=0)])
def test_cifar_refuses_an_empty_val_part_at_load(tmp_path, writers, options):
    """Bug (cifar10.py:325, and mnist.py:120 alike): ``val_size=0``, or the default ``val_size``
    (``n // 10``) with ``limit_train`` below 10, left the val split empty without an error; the
    run then trained and failed at its first evaluation with ``ZeroDivisionError`` in the
    classification task. Like the loaders with ``val_fraction`` options (``require_heldout``),
    the loader now refuses it, naming ``val_size``."""
    writers.write_cifar_batches(tmp_path / "cifar-10-batches-py", per_batch=4)
    empty = r"cifar10: val_size=(None|0) leaves the val split empty \(0 of (8|20) training"
    with pytest.raises(ValueError, match=empty):
        load_dataset("cifar10", root=tmp_path, **options)
    ok = load_dataset("cifar10", root=tmp_path, limit_train=10)  # n // 10 = 1 val image
    assert ok.meta["sizes"] == {"train": 9, "val": 1, "test": 4}


def test_mnist_refuses_an_empty_val_part_at_load(tmp_path, writers):
    """Bug (mnist.py:120): as for CIFAR-10, ``val_size=0`` or ``limit_train`` below 10 with the
    default ``val_size`` gave an empty val split that failed only at the first evaluation."""
    writers.write_mnist_layout(tmp_path, n_train=20, n_test=10)
    for options in (dict(val_size=0), dict(limit_train=9)):
        with pytest.raises(ValueError, match=r"mnist: val_size=(0|None) leaves the val split empty"):
            load_dataset("mnist", root=tmp_path, verify=False, **options)
    assert load_dataset("mnist", root=tmp_path, verify=False, val_size=1).meta["sizes"]["val"] == 1


# ---------------------------------------------------------------------------------------- tu
def test_a_changed_zip_without_node_labels_leaves_no_stale_label_file(tmp_path, writers, monkeypatch):
    """kills: tu.py:88 the loop that empties ``raw/`` before the new files move in, dropped (the
    old zip's ``MUTAG_node_labels.txt``, absent from the new zip, stays and PyG reads it as the
    new graphs' features)"""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    zip_path = tmp_path / "tudataset" / "MUTAG.zip"
    writers.write_tu_zip(zip_path, "MUTAG", node_labels=True)
    assert load_dataset("mutag", root=tmp_path, verify=False).meta["node_features"] == "dataset features"
    writers.write_tu_zip(zip_path, "MUTAG", node_labels=False)
    again = load_dataset("mutag", root=tmp_path, verify=False)
    assert again.meta["node_features"] == "one-hot degree (max_degree=2)" and again.num_features == 3
    assert not (tmp_path / "cache" / "tudataset" / "MUTAG" / "raw" / "MUTAG_node_labels.txt").exists()


def test_a_tu_zip_without_graph_labels_is_a_named_corrupt_archive(tmp_path, writers, monkeypatch):
    """kills: tu.py:81 ``_graph_labels.txt`` dropped from the required entries (a zip without
    labels reached PyG and failed with an AttributeError on ``dataset.y`` naming no file)"""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    full = writers.write_tu_zip(tmp_path / "full.zip", "MUTAG")
    zip_path = tmp_path / "tudataset" / "MUTAG.zip"
    zip_path.parent.mkdir()
    with zipfile.ZipFile(full) as src, zipfile.ZipFile(zip_path, "w") as dst:
        for info in src.infolist():
            if not info.filename.endswith("_graph_labels.txt"):
                dst.writestr(info, src.read(info))
    missing = r"MUTAG\.zip' is not a TU dataset archive for MUTAG: missing MUTAG_graph_labels\.txt"
    with pytest.raises(CorruptDataError, match=missing):
        load_dataset("mutag", root=tmp_path, verify=False)


def _write_star_and_path_zip(path, name):
    """20 graphs without node labels, alternating a star K(1,4) (class 1, centre degree 4) and a
    3-node path (class -1, degree <= 2); the last graph is a path."""
    edges, indicator, labels = [], [], []
    node = 1
    for g in range(20):
        if g % 2 == 0:
            pairs, n, label = [(0, k) for k in range(1, 5)], 5, 1
        else:
            pairs, n, label = [(0, 1), (1, 2)], 3, -1
        for a, b in pairs:
            edges += [(node + a, node + b), (node + b, node + a)]
        indicator += [g + 1] * n
        labels.append(label)
        node += n
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}/{name}_A.txt", "\n".join(f"{a}, {b}" for a, b in edges) + "\n")
        zf.writestr(f"{name}/{name}_graph_indicator.txt", "\n".join(map(str, indicator)) + "\n")
        zf.writestr(f"{name}/{name}_graph_labels.txt", "\n".join(map(str, labels)) + "\n")


def test_degree_features_use_the_largest_degree_of_the_whole_dataset(tmp_path, monkeypatch):
    """kills: tu.py:159 ``max_degree = max(max_degree, deg.max())`` -> ``deg.max()`` (the one-hot
    width came from the last graph, a path of degree 2, and a star's centre of degree 4 did not
    fit)"""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    _write_star_and_path_zip(tmp_path / "tudataset" / "IMDB-BINARY.zip", "IMDB-BINARY")
    data = load_dataset("imdb-binary", root=tmp_path, verify=False)
    assert data.meta["node_features"] == "one-hot degree (max_degree=4)" and data.num_features == 5
    star = data.dataset[0]
    assert star.num_nodes == 5 and star.x.argmax(1).tolist() == [4, 1, 1, 1, 1]
    assert torch.equal(star.x.sum(1), torch.ones(5))


# ---------------------------------------------------------------------------------------- planetoid
def test_zero_feature_rows_stay_zero_after_row_normalisation(tmp_path, writers):
    """kills: planetoid.py:92 ``.clamp_min(1.0)`` dropped from the row sums (CiteSeer's isolated
    test nodes have all-zero rows: 0 / 0 made them NaN instead of staying zero)"""
    writers.write_planetoid_layout(tmp_path, "CiteSeer", gap=True)
    raw = load_dataset("citeseer", root=tmp_path, verify=False, normalize_features=False).data.x.double()
    got = load_dataset("citeseer", root=tmp_path, verify=False).data.x
    sums = raw.sum(1)
    assert bool((sums == 0).any()), "the layout has an isolated (all-zero) node"
    expected = torch.where(sums[:, None] > 0, raw / sums.clamp(min=1e-300)[:, None], torch.zeros_like(raw))
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("bad", [np.zeros(20, dtype=np.float32), np.zeros((20, 9, 1), dtype=np.float32)])
def test_a_feature_array_that_is_not_2d_is_a_named_corrupt_file(tmp_path, writers, bad):
    """kills: planetoid.py:148 ``obj.ndim != 2`` dropped from the matrix check (a 1-D or 3-D
    ``ind.cora.tx`` failed later with a bare IndexError/RuntimeError naming no file)"""
    raw = writers.write_planetoid_layout(tmp_path)
    (raw / "ind.cora.tx").write_bytes(pickle.dumps(bad, protocol=2))
    with pytest.raises(CorruptDataError, match=r"ind\.cora\.tx'.*expected a 2-D numeric matrix"):
        read_planetoid(raw, "cora")


@pytest.mark.parametrize("neighbour", ["7", 7.5, None])
def test_a_graph_with_a_non_integer_neighbour_is_a_named_corrupt_file(tmp_path, writers, neighbour):
    """kills: planetoid.py:157 the ``isinstance(j, int)`` check of the neighbour lists dropped (a
    string, float or None neighbour reached the edge builder and failed there, or became an
    edge, instead of a CorruptDataError naming ``ind.cora.graph``)"""
    raw = writers.write_planetoid_layout(tmp_path)
    path = raw / "ind.cora.graph"
    graph = collections.defaultdict(list, pickle.loads(path.read_bytes()))  # written by this test
    graph[0].append(neighbour)
    path.write_bytes(pickle.dumps(graph, protocol=2))
    with pytest.raises(CorruptDataError, match=r"ind\.cora\.graph'.*expected a dict of node -> list of neighbours"):
        read_planetoid(raw, "cora")


def test_a_negative_test_index_is_a_named_corrupt_file(tmp_path, writers):
    """kills: planetoid.py:218 ``int(test_index.min()) < 0`` dropped (index -1 silently addressed the
    last node through negative indexing: wrong features moved and the last node marked test)"""
    raw = writers.write_planetoid_layout(tmp_path)
    path = raw / "ind.cora.test.index"
    values = [int(v) for v in path.read_text().split()]
    values[values.index(min(values))] = -1
    path.write_text("\n".join(map(str, values)) + "\n")
    with pytest.raises(CorruptDataError, match=r"a node index is outside \[0, "):
        read_planetoid(raw, "cora")


@pytest.mark.parametrize("where", ["neighbour", "key"])
def test_a_negative_node_in_the_graph_is_a_named_corrupt_file(tmp_path, writers, where):
    """Bug: a negative neighbour in ``ind.cora.graph`` passed the range check (only the keys'
    minimum was checked) and PyG's edge builder silently wrapped it into some other node's edge."""
    raw = writers.write_planetoid_layout(tmp_path)
    path = raw / "ind.cora.graph"
    graph = collections.defaultdict(list, pickle.loads(path.read_bytes()))  # written by this test
    if where == "neighbour":
        graph[0].append(-3)
    else:
        graph[-2].append(0)
    path.write_bytes(pickle.dumps(graph, protocol=2))
    with pytest.raises(CorruptDataError, match=r"a node index is outside \[0, 540\)"):
        read_planetoid(raw, "cora")


def test_an_empty_test_index_is_a_named_corrupt_file(tmp_path, writers):
    """kills: planetoid.py:170 the ``if not values`` check dropped (an empty ``test.index`` with
    empty ``tx``/``ty`` passed the size checks and failed on ``test_index.min()`` with a bare
    RuntimeError naming no file)"""
    import scipy.sparse as sp

    raw = writers.write_planetoid_layout(tmp_path)
    # protocol 4: protocol 2 spells the empty data buffer as builtins.bytes(), which is refused
    (raw / "ind.cora.tx").write_bytes(pickle.dumps(sp.csr_matrix((0, 9), dtype=np.float32), protocol=4))
    (raw / "ind.cora.ty").write_bytes(pickle.dumps(np.zeros((0, 3), dtype=np.int32), protocol=4))
    (raw / "ind.cora.test.index").write_text("")
    with pytest.raises(CorruptDataError, match=r"ind\.cora\.test\.index': no node indices"):
        read_planetoid(raw, "cora")


# ---------------------------------------------------------------------------------------- csbm
def test_csbm_edges_are_spread_over_all_node_ids():
    """kills: csbm.py:46 ``keys[randperm(...)[:m]]`` -> ``keys[:m]`` (the pairs kept were the m
    smallest keys ``min * N + max`` of an oversampled draw, so low node ids got most edges)"""
    N = 400
    _, edge_index, _ = csbm_graph(N, 2, 10.0, 0.5, 4, 1.0, torch.Generator().manual_seed(0))
    deg = torch.bincount(edge_index[0], minlength=N).double()
    # by symmetry every node has the same expected degree d = 10; a quarter of the nodes has
    # ~1000 edge ends, so the quarter means differ by far less than 15 % unless biased
    low, high = deg[: N // 4].mean(), deg[-N // 4 :].mean()
    assert float(deg.mean()) == pytest.approx(10.0)
    assert abs(float(low / high) - 1.0) < 0.15, (float(low), float(high))


# ---------------------------------------------------------------------------------------- augment
def test_crop_boxes_aspect_ratio_is_width_over_height():
    """kills: augment.py:79 ``w = sqrt(s r)``, ``h = sqrt(s / r)`` swapped (a ratio r gave boxes of
    aspect 1 / r: the ratio range was silently inverted)"""
    # area s = 1/4; r = 4: w = sqrt(1) = 1, h = sqrt(1/16) = 1/4; r = 1/4: w = 1/4, h = 1
    u = torch.tensor([[0.0, 0.0, 0.5, 0.5, 1.0]])
    wide = crop_boxes(u, scale=(0.25, 0.25), ratio=(4.0, 4.0))
    tall = crop_boxes(u, scale=(0.25, 0.25), ratio=(0.25, 0.25))
    torch.testing.assert_close(wide, torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.25, 0.0]]]))
    torch.testing.assert_close(tall, torch.tensor([[[0.25, 0.0, 0.0], [0.0, 1.0, 0.0]]]))


def test_blur_kernel_is_odd_on_images_with_an_even_side():
    """kills: augment.py:228 ``side if side % 2 else side - 1`` -> ``side`` (an even image side
    became an even kernel, which ``gaussian_blur`` refuses: blurring 4x6 images failed)"""
    aug = MultiCropAugment(blur_prob=1.0, blur_sigma=(0.5, 3.0))  # 2 ceil(9) + 1 = 19
    assert aug.kernel_size(32, 32) == 19
    assert aug.kernel_size(4, 6) == 3 and aug.kernel_size(6, 5) == 5 and aug.kernel_size(8, 8) == 7
    x = torch.randn(2, 1, 4, 6, generator=torch.Generator().manual_seed(0))
    views = aug(x, torch.Generator().manual_seed(1))
    assert views.shape == (2, 2, 1, 4, 6) and torch.isfinite(views).all()


def test_blur_sigma_is_uniform_over_its_whole_range():
    """kills: augment.py:255 the ``/ blur_prob`` rescaling of the reused uniform dropped (sigma was
    drawn from U(lo, lo + (hi - lo) p) instead of the documented U(blur_sigma))"""
    lo, hi = 0.5, 2.5
    aug = MultiCropAugment(blur_prob=0.25, blur_sigma=(lo, hi))
    sigma = aug.sample(4000, (1, 8, 8), torch.Generator().manual_seed(0))["sigma"].flatten()
    s = sigma[sigma > 0].double()
    assert 0.22 < s.numel() / sigma.numel() < 0.28  # blur_prob of the 8000 views
    # U(0.5, 2.5): mean 1.5, quartiles 1.0 and 2.0; ~2000 draws, std of the mean ~0.013
    assert float(s.min()) >= lo and float(s.max()) <= hi
    assert float(s.mean()) == pytest.approx(1.5, abs=0.05)
    q = torch.quantile(s, torch.tensor([0.25, 0.75], dtype=torch.float64))
    torch.testing.assert_close(q, torch.tensor([1.0, 2.0], dtype=torch.float64), atol=0.08, rtol=0)


# ---------------------------------------------------------------------------------------- splits
def test_per_class_split_refuses_zero_training_nodes_per_class():
    """kills: splits.py:249 ``num_train_per_class < 1`` -> ``< 0`` (0 gave an empty train part and
    no error)"""
    y = torch.tensor([0, 0, 0, 1, 1, 1])
    with pytest.raises(ValueError, match="num_train_per_class must be >= 1, got 0"):
        per_class_split(y, 0, 0.5, seed=0)


def test_per_class_split_rounds_the_val_share_half_up():
    """kills: splits.py:264 ``floor(f n_rest + 1/2)`` -> ``floor(f n_rest)`` (7 remaining nodes at
    f = 0.5 gave val 3 / test 4 instead of the documented 4 / 3)"""
    y = torch.tensor([0] * 4 + [1] * 5)
    tr, va, te = per_class_split(y, 1, 0.5, seed=0)
    assert (len(tr), len(va), len(te)) == (2, 4, 3)
    assert sorted(y[tr].tolist()) == [0, 1]
    assert sorted(torch.cat([tr, va, te]).tolist()) == list(range(9))


def test_carve_val_refuses_a_val_part_that_takes_every_example():
    """kills: splits.py:281 ``0 <= val_size < n`` -> ``<= n`` (``val_size = n`` left the training
    part empty and no error)"""
    with pytest.raises(ValueError, match=r"val_size must be in \[0, 10\) for 10 training examples, got 10"):
        carve_val(10, 10, seed=0)
    tr, va = carve_val(10, 9, seed=0)
    assert len(tr) == 1 and sorted(torch.cat([tr, va]).tolist()) == list(range(10))


def test_seeded_subset_is_sorted_distinct_and_seeded():
    """kills: splits.py:301 ``.sort().values`` dropped (the documented sorted indices came back in
    permutation order)"""
    a = seeded_subset(50, 10, seed=3)
    assert len(a) == 10 and len(set(a.tolist())) == 10 and 0 <= int(a.min()) and int(a.max()) < 50
    assert a.tolist() == sorted(a.tolist())
    assert torch.equal(a, seeded_subset(50, 10, seed=3))


# ---------------------------------------------------------------------------------------- paths
def test_a_failed_cache_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path):
    """kills: paths.py:146 ``save_cached`` writing straight to ``path`` instead of a temporary file
    renamed into place (a write that failed half-way, here on an object that cannot be pickled,
    destroyed the good cached file)"""
    path = tmp_path / "cache" / "images.pt"
    save_cached({"x": torch.arange(4)}, path)
    with pytest.raises((pickle.PicklingError, AttributeError), match="pickle"):
        save_cached({"x": torch.zeros(4), "f": lambda: 0}, path)
    assert torch.equal(load_cached(path)["x"], torch.arange(4))
    assert sorted(p.name for p in path.parent.iterdir()) == ["images.pt"]


def test_copy_into_cache_recopies_a_changed_file_of_the_same_size(tmp_path):
    """kills: paths.py:129 the modification-time comparison dropped (a source rewritten with new
    content of the same size was taken as up to date and the stale copy kept)"""
    src = tmp_path / "root" / "a.bin"
    src.parent.mkdir()
    src.write_bytes(b"old!")
    dest = tmp_path / "cache"
    copy_into_cache([src], dest)
    assert (dest / "a.bin").read_bytes() == b"old!"
    st = src.stat()
    src.write_bytes(b"new!")
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 5 * 10**9))
    copy_into_cache([src], dest)
    assert (dest / "a.bin").read_bytes() == b"new!"
    assert sorted(p.name for p in dest.iterdir()) == ["a.bin"]


def test_a_folder_where_a_data_file_belongs_counts_as_missing(tmp_path, monkeypatch):
    """kills: paths.py:108 ``not p.is_file()`` -> ``not p.exists()`` (a folder named like the file
    passed the check and failed later with a bare IsADirectoryError instead of the
    DataRootError that lists the expected layout)"""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    (tmp_path / "tudataset" / "MUTAG.zip").mkdir(parents=True)
    with pytest.raises(DataRootError, match=r"missing file\(s\) under the data root[\s\S]*tudataset/MUTAG\.zip"):
        load_dataset("mutag", root=tmp_path, verify=False)


# ---------------------------------------------------------------------------------------- train: checkpoint
def test_an_interrupted_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch):
    """kills: checkpoint.py:72 ``except BaseException`` -> ``except Exception`` (Ctrl-C during a save
    left the half-written temporary file beside the checkpoint)"""
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"w": torch.ones(3)})
    good = path.read_bytes()

    def interrupted(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, {"w": torch.zeros(3)})
    assert path.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_a_checkpoint_of_another_format_is_refused(tmp_path):
    """kills: checkpoint.py:115 the ``format`` check dropped (a file with the trainer's keys but
    another format tag, e.g. a future layout, was resumed from as if it were this one)"""
    payload = {"format": "diffusionformer.train/0", "step": 3, "model": {}, "optimizer": {}, "rng": {}, "config": {}}
    path = save_checkpoint(tmp_path / "checkpoint.pt", payload)
    other = r"expected format 'diffusionformer\.train/1', got 'diffusionformer\.train/0'"
    with pytest.raises(CheckpointError, match=other):
        load_checkpoint(path)
    payload["format"] = "diffusionformer.train/1"
    assert load_checkpoint(save_checkpoint(path, payload))["step"] == 3


def test_model_record_differences_lists_at_most_limit_and_counts_the_rest():
    """kills: checkpoint.py:156 the ``limit`` cut dropped (a resume refusal listed every one of many
    differences instead of ``limit`` and "... and N more")"""
    saved = {"class": "m.Net", "config": {f"k{i}": i for i in range(9)}, "heads": {}}
    now = {"class": "m.Net", "config": {f"k{i}": i + 1 for i in range(9)}, "heads": {}}
    diffs = model_record_differences(saved, now)
    assert diffs == [f"config k{i}: checkpoint {i}, now {i + 1}" for i in range(6)] + ["... and 3 more"]
    assert len(model_record_differences(saved, now, limit=9)) == 9


# ---------------------------------------------------------------------------------------- train: loggers
def test_log_group_reports_the_json_lines_count(tmp_path):
    """kills: loggers.py:264 ``counts[0]`` -> ``counts[-1]`` (truncate reported the last writer's
    count: a CSV log switched on at resume has no file and reports 0 dropped records)"""
    jsonl = MetricsLog(tmp_path / "metrics.jsonl")
    for step in (1, 2, 3, 4):
        jsonl.append({"step": step, "split": "train", "loss": 1.0 / step, "lr": 0.1, "metrics": {},
                      "elapsed": float(step), "time": float(step)})
    group = LogGroup([jsonl, CSVLog(tmp_path / "metrics.csv")])  # no metrics.csv yet
    assert group.truncate(2) == 2
    kept = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == [1, 2]


# ---------------------------------------------------------------------------------------- train: distributed
def test_shard_batch_keeps_named_tuples():
    """kills: distributed.py:194 the named-tuple branch dropped (a ``namedtuple`` batch was rebuilt
    from one generator argument: a TypeError, or a wrong field)"""
    Batch = collections.namedtuple("Batch", "x y")
    got = shard_batch(Batch(torch.arange(4), torch.arange(4) * 10), rank=1, world_size=2)
    assert type(got) is Batch
    assert got.x.tolist() == [2, 3] and got.y.tolist() == [20, 30]


# ---------------------------------------------------------------------------------------- train: config
def test_min_lr_equal_to_lr_is_a_constant_schedule_not_an_error():
    """kills: config.py:153 ``min_lr > lr`` -> ``>=`` (the documented ``0 <= min_lr <= lr`` allows a
    constant learning rate, which was refused)"""
    cfg = TrainConfig(lr=1e-3, min_lr=1e-3, max_steps=10)
    assert cfg.min_lr == cfg.lr == 1e-3
    with pytest.raises(ValueError, match=r"TrainConfig\.min_lr: expected a float <= lr"):
        TrainConfig(lr=1e-3, min_lr=math.nextafter(1e-3, 1.0), max_steps=10)


def test_loggers_must_be_distinct():
    """kills: config.py:210 the ``len(set(loggers)) != len(loggers)`` check dropped (``["jsonl",
    "csv", "csv"]`` opened two CSV writers that appended every row twice)"""
    with pytest.raises(ValueError, match="expected distinct names"):
        TrainConfig(loggers=["jsonl", "csv", "csv"])
    assert TrainConfig(loggers=["csv", "jsonl"]).loggers == ("csv", "jsonl")
