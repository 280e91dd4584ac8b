"""Mutation audit (sitting 49) of data/splits.py, data/augment.py, data/tu.py, data/planetoid.py, data/mnist.py,
data/cifar10.py, train/optim.py, train/loggers.py and train/config.py: tests that kill mutants the earlier tests left
alive (each docstring names the mutant). No GPU and no download; the references are index arithmetic and
permutations drawn here from freshly seeded ``torch.Generator``s, convolutions and files written by hand.

139 hand mutants (splits.py 17, augment.py 21, tu.py 17, planetoid.py 14, mnist.py 10, cifar10.py 12, optim.py 14,
loggers.py 17, config.py 17), each run one at a time against the module's doctests and the tests/data, tests/train,
tests/ssl and tests/reliability files that name it, the survivors of optim.py and config.py then against the other
test files that name the module: 116 killed by earlier tests (outside the first selection: optim.py's
``no_weight_decay`` not callable, ``fused=fused or None`` and ``float(weight_decay)`` by
tests/train/test_edge_probes_train_seventh.py, _eleventh.py and _fourth.py; config.py's ``batch % accum`` and
``device`` kind checks by tests/train/test_train_audit.py, ``"jsonl" not in loggers`` and ``to_dict``'s list of
loggers by tests/train/test_train_loggers.py, distinct loggers by tests/data/test_mutation_kills_data_train.py), 21
survivors killed here (splits.py 4, augment.py 2, tu.py 3, planetoid.py 2, mnist.py 2 by one test, cifar10.py 1,
optim.py 0, loggers.py 4, config.py 3), 2 equivalent (below). No survivor showed a bug of the library: each was a
documented behaviour no test pinned (the seeds of the splits and subsets, PyG's own conventions for TU degrees, label
spans and NormalizeFeatures, the torn-row rule of the CSV log, lr > 0, the local rank's GPU, "auto" amp off the GPU).

Equivalent mutants:

* splits.py ``seeded_subset`` ``if limit is None or limit >= n`` -> ``limit > n``: at ``limit == n`` the other branch
  returns the sorted first ``n`` entries of a permutation of ``range(n)``, i.e. ``arange(n)``, the same int64 tensor.
* loggers.py ``_cell`` ``repr(value)`` -> ``str(value)`` for a finite float: since Python 3.2 ``str`` of a float is
  its ``repr`` (the shortest string that round-trips), so every cell is the same text.
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.data.augment import MultiCropAugment, gaussian_blur
from diffusionformer.data.splits import per_class_split, split_sizes, stratified_kfold_split, stratified_split


def test_kills_splits_fractions_summing_to_one_are_refused():
    """kills: data/splits.py ``split_sizes`` ``val_fraction + test_fraction >= 1.0`` -> ``> 1.0`` (the docstring's
    "a sum below 1": 0.5 + 0.5 left no training item, and for 3 items each half rounded up to 2, a train part of
    -1 items)."""
    with pytest.raises(ValueError, match=r"val_fraction \+ test_fraction must be < 1, got 0\.5 \+ 0\.5"):
        split_sizes(3, 0.5, 0.5)
    with pytest.raises(ValueError, match=r"must be < 1, got 0\.25 \+ 0\.75"):
        stratified_split(torch.tensor([0, 1, 0, 1]), 0.25, 0.75, seed=0)
    assert split_sizes(3, 0.5, 0.25) == (0, 2, 1)  # floor(1.5 + 0.5), floor(0.75 + 0.5): a sum below 1 is taken


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kills_stratified_parts_are_not_grouped_by_class(seed):
    """kills: data/splits.py ``stratified_split`` ``out.append(idx[torch.randperm(...)])`` -> ``out.append(idx)``
    (the docstring's "each part is returned in a seeded random order (not grouped by class)": a training loader
    that walks train_idx in order saw every item of class 0 before any of class 1). The reference is the documented
    definition drawn here: classes in increasing order, each shuffled and cut by ``split_sizes``, then each part
    shuffled, all from one generator seeded with ``seed``."""
    labels = torch.tensor([1, 0, 2] * 10)
    tr, va, te = stratified_split(labels, 0.2, 0.1, seed=seed)
    g = torch.Generator().manual_seed(seed)
    parts = [[], [], []]
    for c in (0, 1, 2):
        idx = torch.tensor([i for i in range(30) if int(labels[i]) == c])[torch.randperm(10, generator=g)]
        parts[0].append(idx[:7])  # 10 - floor(2.5) - floor(1.5): 7 train, 2 val, 1 test per class
        parts[1].append(idx[7:9])
        parts[2].append(idx[9:])
    want = []
    for chunks in parts:
        idx = torch.cat(chunks)
        want.append(idx[torch.randperm(idx.numel(), generator=g)])
    assert [t.tolist() for t in (tr, va, te)] == [t.tolist() for t in want]
    grouped = labels[tr].sort(stable=True).values
    assert not torch.equal(labels[tr], grouped)  # the train part interleaves the classes


@pytest.mark.parametrize("fold", [0, 3])
def test_kills_kfold_inner_split_uses_the_runs_seed(fold):
    """kills: data/splits.py ``stratified_kfold_split`` ``stratified_split(labels[rest], val_fraction, 0.0, seed)``
    -> ``..., seed + 1)`` (the docstring: the other folds "are split by stratified_split (seed ``seed``, no test
    share)"; another seed moved other graphs into val, so a published fold could not be rebuilt from the
    documented recipe). ``rest`` is the items outside the test fold in increasing order, written out here."""
    labels = torch.tensor([0, 1, 1, 0, 2, 1, 0, 2, 2, 1, 0, 0, 1, 2, 1, 0, 2, 0, 1, 1])
    tr, va, te = stratified_kfold_split(labels, 4, fold, 0.25, seed=5)
    in_test = set(te.tolist())
    rest = torch.tensor([i for i in range(20) if i not in in_test])
    rtr, rva, rte = stratified_split(labels[rest], 0.25, 0.0, seed=5)
    assert rte.numel() == 0
    assert tr.tolist() == rest[rtr].tolist()
    assert va.tolist() == rest[rva].tolist()


def test_kills_per_class_split_rounds_half_up_not_to_even():
    """kills: data/splits.py ``per_class_split`` ``math.floor(f * n_rest + 0.5)`` -> ``round(f * n_rest)`` (the
    docstring's ``floor(f n_rest + 1/2)``: Python's round sends halves to even, so 5 remaining nodes at f = 0.5
    gave 2 val nodes, not 3, and 9 at f = 0.5 gave 4, not 5)."""
    for n_rest, want_val in ((5, 3), (9, 5), (3, 2)):
        labels = torch.zeros(n_rest + 1, dtype=torch.long)  # one class, one training node, n_rest left
        tr, va, te = per_class_split(labels, 1, 0.5, seed=0)
        assert (len(tr), len(va), len(te)) == (1, want_val, n_rest - want_val)
        assert math.floor(0.5 * n_rest + 0.5) == want_val


def _blur_reference(image: torch.Tensor, sigma: float, k: int) -> torch.Tensor:
    """A separable Gaussian blur in float64 with replicated borders, written out with explicit sums."""
    half = k // 2
    w = torch.tensor([math.exp(-(d * d) / (2 * sigma * sigma)) for d in range(-half, half + 1)], dtype=torch.float64)
    w = w / w.sum()
    x = image.double()
    H, W = x.shape[-2:]
    rows = torch.stack([sum(w[j] * x[..., min(max(i + j - half, 0), H - 1), :] for j in range(k))
                        for i in range(H)], dim=-2)
    return torch.stack([sum(w[j] * rows[..., :, min(max(i + j - half, 0), W - 1)] for j in range(k))
                        for i in range(W)], dim=-1)


def test_kills_blur_takes_int32_widths():
    """kills: data/augment.py ``gaussian_blur`` ``and sigma.dtype != torch.int32`` dropped (an int32 tensor of
    widths, as ``torch.tensor(..., dtype=torch.int32)`` or a numpy int32 array gives, was refused as "not a real
    tensor" while int64 was taken). The blur is checked against one computed here in float64."""
    x = torch.arange(2 * 1 * 5 * 6, dtype=torch.float32).view(2, 1, 5, 6).sin()
    sigma = torch.tensor([0, 1], dtype=torch.int32)
    y = gaussian_blur(x, sigma, kernel_size=3)
    assert torch.equal(y[0], x[0])  # sigma 0: the delta kernel
    torch.testing.assert_close(y[1].double(), _blur_reference(x[1], 1.0, 3), rtol=0, atol=1e-6)
    assert torch.equal(y, gaussian_blur(x, sigma.long(), kernel_size=3))


def test_kills_views_without_blur_need_no_sigma():
    """kills: data/augment.py ``MultiCropAugment.apply`` ``if self.blur_prob > 0: shapes["sigma"] = ...`` ->
    ``if self.blur_prob >= 0:`` (with ``blur_prob=0`` no blur is applied, so parameters carried without the unused
    ``sigma``, e.g. saved from another pipeline, were refused as "missing"). The views must equal those of the full
    parameters."""
    aug = MultiCropAugment(local_crops=1, blur_prob=0.0)
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    params = aug.sample(2, (3, 6, 6), torch.Generator().manual_seed(0))
    assert bool((params["sigma"] == 0).all())
    without = {k: v for k, v in params.items() if k != "sigma"}
    assert torch.equal(aug.apply(x, without), aug.apply(x, params))
    with pytest.raises(ValueError, match=r"augmentation parameter 'sigma' must have shape \(2, 3\).*got missing"):
        MultiCropAugment(local_crops=1, blur_prob=0.5).apply(x, without)


def _write_tu(folder, name: str, tables: dict[str, str]) -> None:
    for part, text in tables.items():
        (folder / f"{name}_{part}.txt").write_text(text)


def test_kills_tu_a_self_loop_listed_twice_with_edge_labels_is_left_to_pyg(tmp_path):
    """kills: data/tu.py ``_check_duplicate_labelled_edges`` ``if a == b: continue`` dropped (the docstring: PyG
    drops self-loops with their labels, so a labelled archive that lists a self-loop twice is taken; the mutant
    refused it as a duplicate edge). The other labelled duplicate, (1, 2) twice, is still refused."""
    from diffusionformer.data import CorruptDataError
    from diffusionformer.data.tu import _check_tu_tables

    tables = {
        "graph_indicator": "1\n1\n1\n",
        "graph_labels": "1\n",
        "A": "1, 2\n2, 1\n2, 3\n3, 2\n3, 3\n3, 3\n",
        "edge_labels": "0\n0\n1\n1\n2\n2\n",
    }
    _write_tu(tmp_path, "MUTAG", tables)
    _check_tu_tables(tmp_path, "MUTAG", tmp_path / "MUTAG.zip")
    _write_tu(tmp_path, "MUTAG", {"A": "1, 2\n2, 1\n2, 3\n3, 2\n1, 2\n3, 3\n"})
    with pytest.raises(CorruptDataError, match=r"lines 1 and 5 of MUTAG_A\.txt both give the edge \(1, 2\)"):
        _check_tu_tables(tmp_path, "MUTAG", tmp_path / "MUTAG.zip")


def test_kills_tu_degree_features_count_each_nodes_outgoing_edges(tmp_path, monkeypatch):
    """kills: data/tu.py ``load_tu`` ``degree(g.edge_index[0], ...)`` -> ``degree(g.edge_index[1], ...)`` (the
    ``max_degree`` given to PyG's ``OneHotDegree``, which one-hot encodes the degree over ``edge_index[0]``, was
    measured over the targets: for an archive listing some edges one way only, the largest out-degree 2 did not fit
    a width of max in-degree + 1 = 2). Graphs of class 1: edges 1->2, 1->3, 2->1 (out-degrees 2, 1, 0); class 2: a
    pair joined both ways. The features are checked against those degrees, counted by hand."""
    import zipfile

    from diffusionformer.data.tu import load_tu

    monkeypatch.setenv("DIFFUSIONFORMER_CACHE", str(tmp_path / "cache"))
    edges, indicator, labels, node = [], [], [], 1
    for g in range(10):
        if g % 2 == 0:
            edges += [(node, node + 1), (node, node + 2), (node + 1, node)]
            indicator += [g + 1] * 3
            node += 3
        else:
            edges += [(node, node + 1), (node + 1, node)]
            indicator += [g + 1] * 2
            node += 2
        labels.append(g % 2 + 1)
    (tmp_path / "tudataset").mkdir()
    with zipfile.ZipFile(tmp_path / "tudataset" / "IMDB-BINARY.zip", "w") as zf:
        zf.writestr("IMDB-BINARY/IMDB-BINARY_A.txt", "".join(f"{a}, {b}\n" for a, b in edges))
        zf.writestr("IMDB-BINARY/IMDB-BINARY_graph_indicator.txt", "".join(f"{g}\n" for g in indicator))
        zf.writestr("IMDB-BINARY/IMDB-BINARY_graph_labels.txt", "".join(f"{c}\n" for c in labels))
    data = load_tu("imdb-binary", root=tmp_path, seed=0, verify=False, val_fraction=0.2, test_fraction=0.2)
    assert data.meta["node_features"] == "one-hot degree (max_degree=2)"
    assert data.num_features == 3
    assert data.dataset[0].x.tolist() == [[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    assert data.dataset[1].x.tolist() == [[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]]


def test_kills_tu_one_hot_width_counts_labels_from_the_smallest(tmp_path):
    """kills: data/tu.py ``_check_tu_tables`` ``max(col) - min(col) + 1`` -> ``max(col) + 1`` (PyG subtracts each
    label column's minimum before one-hot encoding it, ``torch_geometric.io.tu.read_tu_data``, so labels 10**9 and
    10**9 + 1 make a width-2 matrix; the mutant measured a width of 10**9 + 2 and refused a harmless archive as
    "more than any TU dataset"). A span that is really too wide is still refused."""
    from diffusionformer.data import CorruptDataError
    from diffusionformer.data.tu import _MAX_ONE_HOT, _check_tu_tables

    base = 10**9
    _write_tu(tmp_path, "MUTAG", {
        "graph_indicator": "1\n1\n1\n",
        "graph_labels": "1\n",
        "A": "1, 2\n2, 1\n2, 3\n3, 2\n",
        "node_labels": f"{base}\n{base + 1}\n{base}\n",
    })
    _check_tu_tables(tmp_path, "MUTAG", tmp_path / "MUTAG.zip")
    span = _MAX_ONE_HOT // 3 + 1  # 3 rows x (span + 1) columns: just over the cap
    _write_tu(tmp_path, "MUTAG", {"node_labels": f"{base}\n{base + span}\n{base}\n"})
    with pytest.raises(CorruptDataError, match=rf"span {span + 1} values: their one-hot matrix would have 3 x "):
        _check_tu_tables(tmp_path, "MUTAG", tmp_path / "MUTAG.zip")


def test_kills_planetoid_rows_summing_below_one_are_left_as_pyg_leaves_them(tmp_path, data_writers):
    """kills: data/planetoid.py ``load_planetoid`` ``.clamp_min(1.0)`` -> ``.clamp_min(1e-12)`` (the docstring
    promises PyG's ``NormalizeFeatures``, which divides by the row sum clamped at 1: real-valued features whose rows
    sum below 1, TF-IDF weights as PubMed's, stay as they are; the mutant scaled them up to sum 1). The files are the
    tiny Cora layout with every feature multiplied by 0.1 (row sums at most 0.9); the reference is PyG's transform
    applied to the unnormalised load."""
    import pickle

    from torch_geometric.data import Data
    from torch_geometric.transforms import NormalizeFeatures

    from diffusionformer.data.planetoid import load_planetoid

    raw = data_writers.write_planetoid_layout(tmp_path, "Cora", num_features=6)
    for part in ("x", "tx", "allx"):
        path = raw / f"ind.cora.{part}"
        path.write_bytes(pickle.dumps(pickle.loads(path.read_bytes()) * 0.1, protocol=2))
    plain = load_planetoid("Cora", root=tmp_path, verify=False, normalize_features=False).data.x
    assert 0 < float(plain.sum(dim=1).max()) <= 0.6 + 1e-6
    got = load_planetoid("Cora", root=tmp_path, verify=False, normalize_features=True).data.x
    want = NormalizeFeatures()(Data(x=plain.clone())).x
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch.equal(got, plain)


@pytest.mark.parametrize("value", [2**63, -2**63 - 1])
def test_kills_planetoid_test_index_of_2_to_the_63_is_named(tmp_path, value):
    """kills: data/planetoid.py ``_planetoid_index`` ``-2**63 <= v < 2**63`` -> ``v <= 2**63`` (a node index of
    exactly 2**63, one past int64, reached ``torch.tensor`` and failed with a bare "Overflow when unpacking long"
    naming no file, instead of the ``CorruptDataError`` naming the file and the value). The smallest int64,
    -2**63, fits and is refused later as outside the nodes; one below it is named here too."""
    from diffusionformer.data import CorruptDataError
    from diffusionformer.data.planetoid import _planetoid_index

    path = tmp_path / "ind.cora.test.index"
    path.write_text(f"7\n{value}\n")
    with pytest.raises(CorruptDataError, match=rf"ind\.cora\.test\.index.*node index {value} does not fit in 64 bits"):
        _planetoid_index(path)
    path.write_text(f"7\n{-2**63}\n{2**63 - 1}\n")
    assert _planetoid_index(path).tolist() == [7, -2**63, 2**63 - 1]


@pytest.mark.parametrize("seed", [0, 3])
def test_kills_mnist_subsets_and_val_follow_the_seed_as_documented(tmp_path, seed, data_writers):
    """kills: data/mnist.py ``load_mnist`` ``seeded_subset(len(test_labels), limit_test, seed)`` -> ``seed + 1``,
    and ``carve_val(len(train_labels), val_size, seed)`` -> ``seed + 1`` (the docstring: ``seed`` is the "seed of the
    val carve and of the limit_* subsets"; another draw gave other test and val images, so a published subset could
    not be rebuilt). The reference draws here: the test subset is the sorted first ``limit_test`` entries of
    ``randperm(n_test)``, the training subset likewise, and val the last ``val_size`` entries of
    ``randperm(limit_train)``, each from a generator freshly seeded with ``seed``."""
    from diffusionformer.data import load_dataset

    arrays = data_writers.write_mnist_layout(tmp_path, n_train=30, n_test=20)
    data = load_dataset("mnist", root=tmp_path, verify=False, seed=seed, val_size=4, limit_train=12, limit_test=6,
                        normalize=False)

    def perm(n):
        return torch.randperm(n, generator=torch.Generator().manual_seed(seed))

    keep_test = perm(20)[:6].sort().values
    keep_train = perm(30)[:12].sort().values
    val = keep_train[perm(12)[8:]]
    test_images = torch.from_numpy(arrays["test_images"]).float().div(255).unsqueeze(1)
    train_images = torch.from_numpy(arrays["train_images"]).float().div(255).unsqueeze(1)
    assert torch.equal(data.x_test, test_images[keep_test])
    assert data.y_test.tolist() == arrays["test_labels"][keep_test.numpy()].tolist()
    assert torch.equal(data.x_val, train_images[val])
    assert data.y_val.tolist() == arrays["train_labels"][val.numpy()].tolist()


@pytest.mark.parametrize("seed", [0, 5])
def test_kills_cifar_pickled_test_subset_follows_the_seed(tmp_path, seed, data_writers):
    """kills: data/cifar10.py ``load_cifar10`` (the pickled batches) ``seeded_subset(len(y_te), limit_test, seed)``
    -> ``seed + 1`` (``seed`` is documented as the "seed of the val carve and of the limit_* subsets"; the JPEG
    branch's subset was pinned, the pickle branch's was not). The reference: the sorted first ``limit_*`` entries of
    ``randperm(n)`` and val the last ``val_size`` entries of ``randperm(limit_train)``, each from a generator freshly
    seeded with ``seed``, over the batches written here (train: data_batch_1..5 in order)."""
    import numpy as np

    from diffusionformer.data import load_dataset

    arrays = data_writers.write_cifar_batches(tmp_path / "cifar-10-batches-py", per_batch=6)
    data = load_dataset("cifar10", root=tmp_path, verify=False, normalize=False, seed=seed, val_size=3,
                        limit_train=10, limit_test=4, source="pickle")

    def perm(n):
        return torch.randperm(n, generator=torch.Generator().manual_seed(seed))

    def images(rows):
        return torch.from_numpy(rows.reshape(-1, 3, 32, 32)).float() / 255

    keep_test = perm(6)[:4].sort().values
    assert torch.equal(data.x_test, images(arrays["test_batch"][keep_test.numpy()]))
    pool = np.concatenate([arrays[f"data_batch_{i}"] for i in range(1, 6)])
    keep_train = perm(30)[:10].sort().values
    assert torch.equal(data.x_val, images(pool[keep_train[perm(10)[7:]].numpy()]))


def test_kills_csv_truncate_drops_a_row_whose_loss_is_not_a_number(tmp_path):
    """kills: train/loggers.py ``_sound_row`` ``column in CSV_BASE_COLUMNS[2:]`` -> ``CSV_BASE_COLUMNS[3:]`` (the
    loss column left out of the number columns: a row whose loss cell a damaged byte spoiled survived the resume's
    truncate, and ``read_metrics_csv`` then refused the whole table). The table is written by hand; the sound rows
    are kept, the spoiled one is counted as dropped."""
    from diffusionformer.train import CSVLog, read_metrics_csv

    path = tmp_path / "metrics.csv"
    path.write_text("step,split,loss,lr,elapsed,time,metrics.acc\r\n"
                    "1,train,0.5,0.1,1.0,2.0,\r\n"
                    "2,train,0.\ufffd4,0.1,1.5,2.5,\r\n"
                    "3,val,0.25,,2.0,3.0,0.75\r\n", encoding="utf-8")
    assert CSVLog(path).truncate(10) == 1
    records = read_metrics_csv(path)
    assert [(r["step"], r["split"], r["loss"]) for r in records] == [(1, "train", 0.5), (3, "val", 0.25)]
    assert records[1]["metrics"] == {"acc": 0.75} and records[1]["lr"] is None


_CSV_HEAD = "step,split,loss,lr,elapsed,time,metrics.acc\r\n1,train,0.5,0.1,1.0,2.0,\r\n"


def test_kills_csv_truncate_drops_a_last_row_cut_inside_its_last_cell(tmp_path):
    """kills: train/loggers.py ``CSVLog.truncate`` ``whole = rows[:-1] if torn else rows`` -> ``whole = rows`` (the
    docstring's "a last row cut short by a kill (no line end) is dropped whatever its step": a row cut inside its
    last cell, 0.75 written as far as ``0.7``, reads as a sound row, and the mutant kept the wrong accuracy)."""
    from diffusionformer.train import CSVLog, read_metrics_csv

    path = tmp_path / "metrics.csv"
    path.write_bytes((_CSV_HEAD + "3,val,0.25,,2.0,3.0,0.7").encode())
    assert CSVLog(path).truncate(10) == 1
    assert [r["step"] for r in read_metrics_csv(path)] == [1]


def test_kills_csv_truncate_keeps_a_last_row_cut_between_cr_and_lf(tmp_path):
    """kills: train/loggers.py ``CSVLog.truncate`` ``endswith((b"\\n", b"\\r"))`` -> ``endswith(b"\\n")`` (the csv
    module ends rows with CR LF: a kill between the two left a whole last row ending in CR, and the mutant dropped it
    as torn, losing a logged evaluation). The row is kept and the next append follows it."""
    from diffusionformer.train import CSVLog, read_metrics_csv

    path = tmp_path / "metrics.csv"
    path.write_bytes((_CSV_HEAD + "3,val,0.25,,2.0,3.0,0.75\r").encode())
    log = CSVLog(path)
    assert log.truncate(10) == 0
    log.append({"step": 4, "split": "train", "loss": 0.125, "lr": 0.1, "metrics": {}, "elapsed": 3.0, "time": 4.0})
    records = read_metrics_csv(path)
    assert [(r["step"], r["loss"]) for r in records] == [(1, 0.5), (3, 0.25), (4, 0.125)]
    assert records[1]["metrics"] == {"acc": 0.75}


def test_kills_log_group_close_raises_the_first_error_after_closing_all():
    """kills: train/loggers.py ``LogGroup.close`` ``error = error or e`` -> ``error = e`` (two writers failing to
    close: the first failure, the one the docstring's "its error is raised once all are closed" reports, was
    replaced by the last one). Every writer's close is still called."""
    from diffusionformer.train.loggers import LogGroup

    closed = []

    class Writer:
        def __init__(self, name, error=None):
            self.name, self.error = name, error

        def append(self, record):
            pass

        def truncate(self, max_step):
            return 0

        def close(self):
            closed.append(self.name)
            if self.error is not None:
                raise self.error

    group = LogGroup([Writer("a", OSError("disk full")), Writer("b"), Writer("c", RuntimeError("late"))])
    with pytest.raises(OSError, match="disk full"):
        group.close()
    assert closed == ["a", "b", "c"]


def test_kills_train_config_lr_must_be_positive_while_min_lr_may_be_zero():
    """kills: train/config.py ``_check_float`` ``value < minimum or (strict and value == minimum)`` ->
    ``value < minimum`` (the docstring's "lr: peak learning rate (> 0)": lr = 0 trained nothing for the whole run
    without a word). ``min_lr`` (``>= 0``) keeps its 0."""
    from diffusionformer.train import TrainConfig

    with pytest.raises(ValueError, match=r"TrainConfig\.lr: expected a float > 0\.0, got 0\.0"):
        TrainConfig(lr=0.0, min_lr=0.0)
    assert TrainConfig(lr=1e-3, min_lr=0.0).min_lr == 0.0


def test_kills_resolve_device_takes_the_local_rank_for_a_bare_cuda(monkeypatch):
    """kills: train/config.py ``resolve_device`` ``local_rank if local_rank is not None else
    torch.cuda.current_device()`` -> ``torch.cuda.current_device()`` (the docstring: under multi-process training "a
    bare 'cuda'/'auto' on CUDA means cuda:<local_rank>"; every rank of a node trained on GPU 0). CUDA is simulated
    (``is_available`` and ``current_device`` patched); no GPU is used."""
    from diffusionformer.train import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("auto", local_rank=3) == torch.device("cuda", 3)
    assert resolve_device("cuda:2", local_rank=1) == torch.device("cuda", 2)  # an explicit index is kept
    assert resolve_device("cuda") == torch.device("cuda", 0)


@pytest.mark.parametrize("device", ["meta", "cpu", "cuda"])
def test_kills_resolve_amp_auto_is_bf16_on_cuda_only(device):
    """kills: train/config.py ``resolve_amp`` ``device.type == "cuda"`` -> ``device.type != "cpu"`` (the docstring's
    ``"auto"`` is "bf16 on CUDA only": on any other device, the meta device of a shape check or an MPS one, no
    autocast). No GPU is needed: only the ``torch.device`` is built."""
    from diffusionformer.train import resolve_amp

    assert resolve_amp("auto", torch.device(device)) == (torch.bfloat16 if device == "cuda" else None)

