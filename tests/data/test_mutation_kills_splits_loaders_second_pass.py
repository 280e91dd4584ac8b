"""Tests written in a second-pass mutation-testing audit of the split helpers and four loaders.

Each test kills a mutant of the library code that the earlier audits
(``test_mutation_kills_data_foundations.py``, ``_data_train.py``, ``_data_files_second_pass.py``,
``_loaders_registries.py``) and the rest of the suite let through (its docstring names it: file and
mutation): the seeded splits and the per-channel standardisation (``data/splits.py``), the CIFAR-10
readers and loader (``data/cifar10.py``), the Planetoid reader and the karate split
(``data/planetoid.py``), the TU archive extraction and loader (``data/tu.py``) and the contextual
stochastic block model (``data/csbm.py``). The references are independent of the code under test:
split sizes worked out by hand and permutations drawn here from a freshly seeded
``torch.Generator`` (the documented definition of each split), means and standard deviations from
NumPy, pickles, zips and text files written by hand under ``tmp_path`` (hostile ones included: no
pickle may run code or fail with a bare error), and the CSBM's defining equations (``M = round(N d
/ 2)``, ``M_in ~ Binomial(M, h)``, ``x_i = mu_{y_i} + N(0, I)``) written out here. Mutants judged
equivalent are listed, with the reason, at the end of the file. The audit found no library defect
to fix in these modules. CPU only, deterministic, no network.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import zipfile

import numpy as np
import pytest
import torch

from diffusionformer.data import CACHE_ENV, CorruptDataError, csbm_graph, edge_homophily, load_dataset
from diffusionformer.data.cifar10 import CIFAR10_CLASSES, read_cifar_batch, read_image_zip
from diffusionformer.data.planetoid import read_planetoid
from diffusionformer.data.splits import (carve_val, generator, normalize_channels, per_class_split, random_split,
                                         seeded_subset, split_sizes, stratified_kfold_split, stratified_split)


def _pil_image():
    """``PIL.Image``; the tests of the image zips skip without Pillow (the others do not need it)."""
    return pytest.importorskip("PIL.Image", reason="Pillow writes and decodes the PNG entries of the image zips")


def _png(colour, size=(8, 8)):
    """A solid PNG (lossless, so the decoded pixels are exactly ``colour``)."""
    buf = io.BytesIO()
    _pil_image().new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()



# ------------------------------------------------------------------------------------------ splits
def test_a_bool_seed_is_refused():
    """kills: splits.py ``generator`` without the ``isinstance(seed, bool)`` guard (``True`` was
    taken as seed 1)."""
    with pytest.raises(TypeError, match="seed must be an int, got bool"):
        generator(True)
    assert torch.equal(torch.randperm(5, generator=generator(1)), torch.randperm(5, generator=torch.Generator().manual_seed(1)))


def test_a_fraction_of_one_is_refused_by_its_own_range_check():
    """kills: splits.py ``split_sizes`` ``0 <= f < 1`` -> ``<= 1`` (``val_fraction=1.0`` got past
    the range check and was refused only by the sum check, whose message names both options)."""
    with pytest.raises(ValueError, match=r"^val_fraction must be in \[0, 1\), got 1\.0$"):
        split_sizes(10, 1.0, 0.0)
    with pytest.raises(ValueError, match=r"^test_fraction must be in \[0, 1\), got 1\.0$"):
        split_sizes(10, 0.0, 1.0)


@pytest.mark.parametrize("seed", [0, 7])
def test_random_split_takes_consecutive_slices_of_the_seeded_permutation(seed):
    """kills: splits.py ``random_split`` drawing its permutation with ``generator(seed + 1)`` (the
    documented permutation is that of a CPU generator seeded with ``seed``: train its first
    ``n_train`` entries, val the next ``n_val``, test the rest)."""
    perm = torch.randperm(11, generator=torch.Generator().manual_seed(seed)).tolist()
    # n = 11, f_val = 0.3: floor(3.3 + 0.5) = 3; f_test = 0.15: floor(1.65 + 0.5) = 2; train 6
    tr, va, te = random_split(11, 0.3, 0.15, seed)
    assert (tr.tolist(), va.tolist(), te.tolist()) == (perm[:6], perm[6:9], perm[9:])
    assert tr.dtype == va.dtype == te.dtype == torch.int64


def test_stratified_split_of_no_items_still_checks_the_fractions_and_gives_int64():
    """kills: splits.py ``stratified_split`` without its up-front ``split_sizes`` call (with no
    labels no class ever validated the fractions: 1.5 passed), and the empty part built as
    ``torch.empty(0)`` (float32 index tensors, which cannot index)."""
    empty = torch.empty(0, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"val_fraction must be in \[0, 1\), got 1\.5"):
        stratified_split(empty, 1.5, 0.0, seed=0)
    parts = stratified_split(empty, 0.2, 0.2, seed=0)
    assert [p.dtype for p in parts] == [torch.int64] * 3 and [p.numel() for p in parts] == [0, 0, 0]


def test_a_bool_fold_is_refused():
    """kills: splits.py ``stratified_kfold_split`` without the ``isinstance(fold, bool)`` guard
    (``fold=True`` was taken as fold 1)."""
    y = torch.arange(10) % 2
    with pytest.raises(ValueError, match=r"fold must be an int in \[0, 5\), got True"):
        stratified_kfold_split(y, 5, True, 0.1, seed=0)


def test_as_many_items_as_folds_is_enough():
    """kills: splits.py ``labels.numel() < num_folds`` -> ``<=`` (``K`` items in ``K`` folds, one
    item per fold, was refused)."""
    y = torch.tensor([0, 1, 0])
    tests = []
    for k in range(3):
        tr, va, te = stratified_kfold_split(y, 3, k, 0.0, seed=0)
        assert len(te) == 1 and len(va) == 0 and len(tr) == 2
        assert sorted(torch.cat([tr, te]).tolist()) == [0, 1, 2]
        tests += te.tolist()
    assert sorted(tests) == [0, 1, 2]


def test_per_class_split_may_send_every_remaining_node_to_val():
    """kills: splits.py ``per_class_split`` ``0 <= f <= 1`` -> ``< 1`` (the documented upper bound
    ``f = 1``, every non-training node in val, was refused)."""
    y = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    tr, va, te = per_class_split(y, 1, 1.0, seed=0)
    assert len(tr) == 2 and len(va) == 5 and len(te) == 0
    assert sorted(torch.cat([tr, va]).tolist()) == list(range(7))
    with pytest.raises(ValueError, match=r"val fraction must be in \[0, 1\], got 1\.01"):
        per_class_split(y, 1, 1.01, seed=0)


def test_per_class_split_shuffles_the_remaining_nodes_before_halving():
    """kills: splits.py ``per_class_split`` without the shuffle of the remaining nodes (val was
    always the lowest-numbered non-training nodes and test the highest)."""
    y = torch.tensor([0] * 10 + [1] * 10)
    interleaved = 0
    for seed in range(4):
        tr, va, te = per_class_split(y, 1, 0.5, seed)
        assert (len(tr), len(va), len(te)) == (2, 9, 9)
        interleaved += int(va.max()) > int(te.min())
    # an unshuffled rest puts all 9 val nodes below the 9 test nodes; shuffled, that happens with
    # probability 1 / C(18, 9) per seed
    assert interleaved == 4


def test_carve_val_default_is_capped_at_five_thousand():
    """kills: splits.py ``val_size = min(5000, n // 10)`` -> ``n // 10`` (60,000 MNIST images would
    hold out 6,000, not the documented 5,000)."""
    tr, va = carve_val(50_010, None, seed=0)
    assert (len(tr), len(va)) == (45_010, 5_000)
    tr, va = carve_val(49, None, seed=0)  # 49 // 10 = 4
    assert (len(tr), len(va)) == (45, 4)


def test_carve_val_refuses_a_negative_val_size():
    """kills: splits.py ``carve_val`` ``0 <= val_size < n`` -> ``val_size < n`` (``val_size=-1``
    returned every item as train and an empty val, without an error)."""
    with pytest.raises(ValueError, match=r"val_size must be in \[0, 10\) for 10 training examples, got -1"):
        carve_val(10, -1, seed=0)


@pytest.mark.parametrize("seed", [0, 3])
def test_carve_val_holds_out_the_last_entries_of_the_seeded_permutation(seed):
    """kills: splits.py ``carve_val`` returning ``perm[val_size:], perm[:val_size]`` (val taken from
    the front of the permutation; the documented val is its last ``val_size`` entries)."""
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(seed)).tolist()
    tr, va = carve_val(9, 4, seed)
    assert (tr.tolist(), va.tolist()) == (perm[:5], perm[5:])


def test_seeded_subset_refuses_a_zero_limit():
    """kills: splits.py ``seeded_subset`` ``limit < 1`` -> ``limit < 0`` (``limit=0`` returned an
    empty subset, so a loader built a dataset of no examples)."""
    with pytest.raises(ValueError, match="limit must be >= 1 or None, got 0"):
        seeded_subset(5, 0, seed=0)
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(2))
    assert seeded_subset(8, 3, seed=2).tolist() == sorted(perm[:3].tolist())


def test_normalize_channels_refuses_integer_images():
    """kills: splits.py ``normalize_channels`` without the ``is_floating_point`` check (uint8
    images reached the in-place arithmetic and failed with a bare RuntimeError)."""
    with pytest.raises(ValueError, match=r"expected float images of shape \(N, C, H, W\), got torch\.uint8 \(2, 1, 2, 2\)"):
        normalize_channels(torch.zeros(2, 1, 2, 2, dtype=torch.uint8))


def test_a_constant_channel_keeps_unit_std_and_only_loses_its_mean():
    """kills: splits.py ``torch.where(std > 0, ...)`` -> ``std >= 0`` (a channel with zero spread
    kept ``std = 0`` and became NaN, 0 / 0)."""
    x = torch.tensor([[[[3.0, 3.0]], [[1.0, 5.0]]], [[[3.0, 3.0]], [[1.0, 5.0]]]])  # (2, 2, 1, 2)
    mean, std, (xn,) = normalize_channels(x)
    # channel 0 is all 3: mean 3, std kept at 1; channel 1 is 1, 5, 1, 5: mean 3, population std 2
    assert mean == (3.0, 3.0) and std == (1.0, 2.0)
    assert xn[:, 0].flatten().tolist() == [0.0] * 4 and xn[:, 1].flatten().tolist() == [-1.0, 1.0, -1.0, 1.0]


def test_normalize_channels_matches_numpy_over_several_chunks():
    """kills: splits.py ``total += chunk.sum(...)`` -> ``total = ...`` (the mean came from the last
    chunk of examples only: invisible while a tensor fits in one chunk)."""
    rng = np.random.default_rng(0)
    train = rng.normal([[[[1.0]], [[-2.0]], [[5.0]]]], [[[[2.0]], [[0.5]], [[3.0]]]], size=(7, 3, 2, 3))
    other = rng.normal(0.0, 1.0, size=(4, 3, 2, 3))
    mean_ref = train.mean(axis=(0, 2, 3))
    std_ref = train.std(axis=(0, 2, 3))  # population std (ddof=0)
    x, o = torch.tensor(train, dtype=torch.float64), torch.tensor(other, dtype=torch.float64)
    mean, std, (xn, on) = normalize_channels(x, o, chunk_size=2)  # chunks of 2, 2, 2, 1 examples
    np.testing.assert_allclose(mean, mean_ref, rtol=1e-12)
    np.testing.assert_allclose(std, std_ref, rtol=1e-12)
    shape = (1, 3, 1, 1)
    np.testing.assert_allclose(xn.numpy(), (train - mean_ref.reshape(shape)) / std_ref.reshape(shape), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(on.numpy(), (other - mean_ref.reshape(shape)) / std_ref.reshape(shape), rtol=1e-10, atol=1e-12)
    assert xn is x and on is o  # in place, as documented


# ----------------------------------------------------------------------------------------- cifar10
def test_a_zip_path_that_is_a_folder_is_a_corrupt_archive_naming_it(tmp_path):
    """kills: cifar10.py ``read_image_zip`` catching only ``BadZipFile`` (a ``train.zip`` that is a
    folder raised a bare ``IsADirectoryError``)."""
    _pil_image()  # read_image_zip needs Pillow before it opens the archive
    folder = tmp_path / "train.zip"
    folder.mkdir()
    with pytest.raises(CorruptDataError, match=r"corrupt zip archive '.*train\.zip'"):
        read_image_zip(folder, "train")


def test_image_rows_are_the_height_axis_of_a_wide_image(tmp_path, writers):
    """kills: cifar10.py ``permute(0, 3, 1, 2)`` -> ``permute(0, 3, 2, 1)`` (width and height
    swapped: invisible on square images, a (N, 3, W, H) tensor on a wide one)."""
    image = _pil_image().new("RGB", (4, 2))  # width 4, height 2
    for x in range(4):
        for y in range(2):
            image.putpixel((x, y), (10 * x + y, 100 + x, 200 + y))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    path = writers.write_stored_zip(tmp_path / "a.zip", [("train/a/0.png", buf.getvalue())])
    images, labels, classes = read_image_zip(path, "train")
    assert images.shape == (1, 3, 2, 4) and images.dtype == torch.uint8
    assert images[0, 0].tolist() == [[0, 10, 20, 30], [1, 11, 21, 31]]  # R = 10 x + y, rows = y
    assert images[0, 1].tolist() == [[100, 101, 102, 103]] * 2
    assert images[0, 2].tolist() == [[200] * 4, [201] * 4]


@pytest.mark.parametrize(
    "raw, error",
    [
        (b"\x80\x09N.", "unsupported pickle protocol: 9"),  # ValueError
        (b"cnumpy\ndtype\n(S'zz'\ntR.", "data type .* not understood"),  # TypeError from an allowed global
        # AttributeError: BUILD of a dict state on the bytes made by the allowed _codecs.encode
        (b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00xX\x06\x00\x00\x00latin1\x86R}b.", "'bytes' object has no attribute '__dict__'"),
    ],
    ids=["ValueError", "TypeError", "AttributeError"],
)
def test_a_batch_that_fails_inside_the_unpickler_is_a_corrupt_file_naming_it(tmp_path, raw, error):
    """kills: cifar10.py ``_unpickle`` with ``ValueError``, ``TypeError`` or ``AttributeError``
    dropped from its except clause (each of these hand-made batches raised the bare error, naming
    no file)."""
    path = tmp_path / "data_batch_2"
    path.write_bytes(raw)
    with pytest.raises(CorruptDataError, match=rf"corrupt CIFAR batch '.*data_batch_2': {error}"):
        read_cifar_batch(path)


def test_ragged_labels_are_a_corrupt_batch_naming_it(tmp_path):
    """kills: cifar10.py the ``except ValueError`` around ``np.asarray(batch["labels"])`` dropped
    (nested lists of different lengths raised NumPy's bare "inhomogeneous shape" ValueError)."""
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [[1], [2, 3]]}, protocol=2))
    with pytest.raises(CorruptDataError, match=r"'.*data_batch_1': labels are not a flat list of integers"):
        read_cifar_batch(path)


def test_a_batches_meta_that_is_a_folder_is_ignored(tmp_path, writers):
    """kills: cifar10.py ``(folder / "batches.meta").is_file()`` -> ``.exists()`` (a folder of that
    name was opened as a pickle and the load failed with a bare ``IsADirectoryError``)."""
    folder = tmp_path / "cifar-10-batches-py"
    writers.write_cifar_batches(folder, per_batch=2)
    (folder / "batches.meta").unlink()
    (folder / "batches.meta").mkdir()
    data = load_dataset("cifar10", root=tmp_path, normalize=False, val_size=1)
    assert data.class_names == CIFAR10_CLASSES
    assert data.meta["sizes"] == {"train": 9, "val": 1, "test": 2}


def test_a_cache_file_with_class_names_that_are_not_strings_is_rebuilt(tmp_path, monkeypatch, writers):
    """kills: cifar10.py ``_cache_fits`` without ``all(isinstance(c, str) for c in classes)`` (a
    cache file listing the classes as ints ``[0, 1]`` was served, and the dataset's class names
    became ints)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    train = writers.write_stored_zip(tmp_path / "cifar10_jpg" / "train.zip",
                       [(f"train/{c}/{i}.png", _png((i, 0, 0))) for c in ("dog", "cat") for i in range(3)])
    writers.write_stored_zip(tmp_path / "cifar10_jpg" / "test.zip", [("test/cat/0.png", _png((9, 9, 9))), ("test/dog/0.png", _png((9, 9, 9)))])
    digest = hashlib.sha256(train.read_bytes()).hexdigest()
    cached = tmp_path / "cache" / "cifar10" / f"train-{digest[:16]}.pt"
    cached.parent.mkdir(parents=True)
    torch.save({"images": torch.zeros(6, 3, 8, 8, dtype=torch.uint8), "labels": torch.tensor([0, 0, 0, 1, 1, 1]),
                "classes": [0, 1]}, cached)
    with pytest.warns(UserWarning, match=r"cached file refused and rebuilt: .*train-.*: not the decoded images"):
        data = load_dataset("cifar10", root=tmp_path, source="jpg", verify=False, normalize=False, val_size=1)
    assert data.class_names == ["cat", "dog"]
    assert torch.load(cached, weights_only=True)["classes"] == ["cat", "dog"]


def test_a_limited_load_of_a_file_that_is_not_a_zip_is_a_corrupt_archive(tmp_path, monkeypatch):
    """kills: cifar10.py ``_from_zip``'s limited branch catching only ``OSError`` (with
    ``limit_train`` set, a ``train.zip`` that is not a zip raised a bare ``BadZipFile``)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    folder = tmp_path / "cifar10_jpg"
    folder.mkdir()
    (folder / "train.zip").write_bytes(b"this is not a zip archive")
    (folder / "test.zip").write_bytes(b"nor is this")
    with pytest.raises(CorruptDataError, match=r"corrupt zip archive '.*train\.zip'"):
        load_dataset("cifar10", root=tmp_path, source="jpg", verify=False, limit_train=3, val_size=1)


def test_a_zip_without_entries_of_the_split_is_refused_naming_the_zip(tmp_path, writers):
    """kills: cifar10.py the "holds no entries" message without the zip's path."""
    path = writers.write_stored_zip(tmp_path / "only-test.zip", [("test/cat/0000.png", _png((1, 2, 3)))])
    with pytest.raises(CorruptDataError, match=r"'.*only-test\.zip' holds no 'train/<class>/<image>' entries"):
        read_image_zip(path, "train")


@pytest.mark.parametrize("seed", [3, 8])
def test_pickled_batches_subset_and_val_follow_the_documented_draws(tmp_path, writers, seed):
    """kills: cifar10.py the training subset of the pickled batches drawn with ``seed + 1``, and
    the val carve drawn with seed 0 whatever ``seed``. Reference: the training pool is
    ``data_batch_1..5`` in order; ``limit_train`` keeps the sorted first 12 entries of a
    permutation seeded with ``seed``, and val is the last 2 entries of a second such permutation
    of those 12 (``seeded_subset``, then ``carve_val``)."""
    arrays = writers.write_cifar_batches(tmp_path / "cifar-10-batches-py", per_batch=4)
    pool = torch.from_numpy(np.concatenate([arrays[f"data_batch_{i}"] for i in range(1, 6)]))  # (20, 3072)
    keep = torch.randperm(20, generator=torch.Generator().manual_seed(seed))[:12].sort().values
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(seed))
    data = load_dataset("cifar10", root=tmp_path, normalize=False, val_size=2, limit_train=12, seed=seed)
    as_rows = lambda x: x.mul(255).round().to(torch.uint8).reshape(len(x), -1)  # noqa: E731
    assert torch.equal(as_rows(data.x_train), pool[keep][perm[:10]])
    assert torch.equal(as_rows(data.x_val), pool[keep][perm[10:]])


# --------------------------------------------------------------------------------------- planetoid
@pytest.mark.parametrize("k, sizes", [(2, (8, 13, 13)), (3, (12, 11, 11))])
def test_karate_split_sizes_and_seeding(k, sizes):
    """kills: planetoid.py ``load_karate`` splitting with seed 0 whatever ``seed`` (every seed gave
    the same split); the rest split with f = 0.4 instead of halved (26 -> 10 / 16, not the
    documented 13 / 13); ``num_train_per_class`` ignored (always 2). By hand: 34 nodes in 4
    classes; k per class train, the other 34 - 4k halved, val rounded half up."""
    splits = {}
    for seed in (0, 1, 2):
        d = load_dataset("karate", seed=seed, num_train_per_class=k)
        masks = (d.data.train_mask, d.data.val_mask, d.data.test_mask)
        assert tuple(int(m.sum()) for m in masks) == sizes and d.num_classes == 4
        assert (sum(m.long() for m in masks) == 1).all()
        assert d.data.y[d.data.train_mask].bincount(minlength=4).tolist() == [k] * 4
        splits[seed] = tuple(m.nonzero().flatten().tolist() for m in masks)
    assert splits[0] != splits[1] and splits[1] != splits[2] and splits[0] != splits[2]


def test_planetoid_loaders_verify_every_raw_file_by_default(tmp_path, writers, monkeypatch):
    """kills: planetoid.py ``load_planetoid(..., verify=True)`` -> ``False`` and ``load_cora``'s
    ``verify=True`` -> ``False`` (hand-made files at the staged paths were read unchecked); the
    check loop skipping the last file (``zip(paths[:-1], rels)``: ``test.index`` never checked)."""
    from diffusionformer.data import ChecksumError
    from diffusionformer.data import planetoid

    writers.write_planetoid_layout(tmp_path)
    with pytest.raises(ChecksumError, match=r"planetoid/Cora/raw/ind\.cora\.x"):
        load_dataset("cora", root=tmp_path)
    with pytest.raises(ChecksumError, match=r"planetoid/Cora/raw/ind\.cora\.x"):
        planetoid.load_planetoid("Cora", root=tmp_path)
    checked = []
    monkeypatch.setattr(planetoid, "verify_file", lambda path, rel: checked.append((path.name, rel)))
    planetoid.load_planetoid("Cora", root=tmp_path)
    parts = ["x", "tx", "allx", "y", "ty", "ally", "graph", "test.index"]
    assert checked == [(f"ind.cora.{p}", f"planetoid/Cora/raw/ind.cora.{p}") for p in parts]


@pytest.mark.parametrize(
    "raw, error",
    [
        (b"\x80\x09N.", "ValueError: unsupported pickle protocol: 9"),
        (b"cnumpy\ndtype\n(S'zz'\ntR.", "TypeError: data type .* not understood"),
        (b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00xX\x06\x00\x00\x00latin1\x86R}b.",
         "AttributeError: 'bytes' object has no attribute '__dict__'"),
    ],
    ids=["ValueError", "TypeError", "AttributeError"],
)
def test_a_planetoid_file_that_fails_inside_the_unpickler_is_named(tmp_path, writers, raw, error):
    """kills: planetoid.py ``_unpickle_planetoid`` with ``ValueError``, ``TypeError`` or
    ``AttributeError`` dropped from its except clause (the bare error named no file)."""
    raw_dir = writers.write_planetoid_layout(tmp_path)
    (raw_dir / "ind.cora.allx").write_bytes(raw)
    with pytest.raises(CorruptDataError, match=rf"corrupt Planetoid file '.*ind\.cora\.allx': {error}"):
        read_planetoid(raw_dir, "cora")


def test_boolean_one_hot_labels_are_read(tmp_path, writers):
    """kills: planetoid.py the matrix check's kinds ``"biuf"`` -> ``"iuf"`` (a label matrix stored
    as a bool array, a valid numeric matrix, was refused)."""
    raw_dir = writers.write_planetoid_layout(tmp_path)
    plain = read_planetoid(raw_dir, "cora")
    for part in ("y", "ty", "ally"):
        path = raw_dir / f"ind.cora.{part}"
        onehot = pickle.loads(path.read_bytes())  # written by the writer above
        path.write_bytes(pickle.dumps(onehot.astype(bool), protocol=2))
    again = read_planetoid(raw_dir, "cora")
    assert torch.equal(again.y, plain.y) and torch.equal(again.x, plain.x)


def test_an_object_array_of_strings_is_a_named_corrupt_matrix(tmp_path, writers):
    """kills: planetoid.py the matrix check reduced to ``obj.ndim != 2`` (an object array of strings
    reached ``np.asarray(..., float32)`` and raised a bare "could not convert string" ValueError). Since the fourth
    data probe object arrays are refused by the unpickler itself, so the strings are a fixed-width array here."""
    raw_dir = writers.write_planetoid_layout(tmp_path)
    (raw_dir / "ind.cora.x").write_bytes(pickle.dumps(np.array([["a", "b"], ["c", "d"]]), protocol=2))
    with pytest.raises(CorruptDataError, match=r"ind\.cora\.x'.*expected a 2-D numeric matrix, got <U1 array of shape \(2, 2\)"):
        read_planetoid(raw_dir, "cora")


def test_a_graph_with_a_string_node_key_is_a_named_corrupt_file(tmp_path, writers):
    """kills: planetoid.py ``isinstance(k, int)`` dropped from the graph check (a key ``"0"``
    reached the node range check and raised a bare TypeError comparing str with int)."""
    raw_dir = writers.write_planetoid_layout(tmp_path)
    (raw_dir / "ind.cora.graph").write_bytes(pickle.dumps({"0": [1], 1: [0]}, protocol=2))
    with pytest.raises(CorruptDataError, match=r"ind\.cora\.graph'.*expected a dict of node -> list of neighbours"):
        read_planetoid(raw_dir, "cora")


def test_a_test_index_that_is_not_utf8_is_named_with_the_decoding_error(tmp_path, writers):
    """kills: planetoid.py ``_planetoid_index`` reading with ``errors="replace"`` (the byte 0xff
    became U+FFFD and the message blamed ``int()`` instead of the undecodable byte)."""
    raw_dir = writers.write_planetoid_layout(tmp_path)
    (raw_dir / "ind.cora.test.index").write_bytes(b"520\n\xff\n521\n")
    with pytest.raises(CorruptDataError, match=r"ind\.cora\.test\.index': expected one node index per line \('utf-8' codec can't decode byte 0xff"):
        read_planetoid(raw_dir, "cora")


def test_nell_is_refused_by_name_and_the_prefix_is_case_insensitive(tmp_path, writers):
    """kills: planetoid.py the NELL check dropped (``"nell.0.001"`` looked for files that are not
    there and raised a bare FileNotFoundError); ``prefix.lower()`` dropped (``"Cora"`` looked for
    ``ind.Cora.*``, which the staged layout does not have)."""
    raw_dir = writers.write_planetoid_layout(tmp_path)
    with pytest.raises(ValueError, match="NELL is not supported by read_planetoid"):
        read_planetoid(raw_dir, "NELL.0.001")
    assert torch.equal(read_planetoid(raw_dir, "Cora").y, read_planetoid(raw_dir, "cora").y)


def _rewrite(raw_dir, part, change):
    """Replace ``ind.cora.<part>`` (written by the writer fixture) with ``change(old object)``."""
    path = raw_dir / f"ind.cora.{part}"
    path.write_bytes(pickle.dumps(change(pickle.loads(path.read_bytes())), protocol=2))


@pytest.mark.parametrize(
    "part, change",
    [
        ("tx", lambda m: m[:, :8]),  # 8 features where allx and x have 9
        ("ty", lambda a: np.hstack([a, np.zeros((len(a), 1), a.dtype)])),  # 4 label columns, not 3
        ("ally", lambda a: a[:-1]),  # 519 label rows for 520 feature rows
        ("ty", lambda a: a[:-1]),  # 19 test labels for 20 test feature rows (and 20 test indices)
        ("y", lambda a: np.vstack([a, a[:7]])),  # 21 train labels: 21 + 500 val > 520 labelled rows
    ],
    ids=["features", "label-columns", "allx-ally", "tx-ty", "train-plus-val"],
)
def test_inconsistent_planetoid_sizes_are_named(tmp_path, writers, part, change):
    """kills: planetoid.py each size check dropped: ``len(feats) != 1``, ``len(labels) != 1``,
    ``allx.size(0) != ally.size(0)``, ``tx.size(0) != ty.size(0)``; and ``y.size(0) + 500 >
    ally.size(0)`` given one row of slack (a train set that ran the 500 val nodes past the
    labelled rows passed). Each gave a bare torch error, or silently wrong masks or labels."""
    raw_dir = writers.write_planetoid_layout(tmp_path)  # 14 train, 520 labelled rows, 20 test, 9 features, 3 classes
    if part == "y":  # x grows with y, so that only the train + val overrun is wrong
        import scipy.sparse as sp

        _rewrite(raw_dir, "x", lambda m: sp.vstack([m, m[:7]]).tocsr())
    _rewrite(raw_dir, part, change)
    with pytest.raises(CorruptDataError, match=r"corrupt Planetoid files in '.*raw' \(cora\): inconsistent sizes"):
        read_planetoid(raw_dir, "cora")


def test_a_test_index_equal_to_the_node_count_is_named(tmp_path, writers):
    """kills: planetoid.py ``int(test_index.max()) >= N`` -> ``> N`` (index N = 540, one past the
    last node, raised a bare IndexError)."""
    raw_dir = writers.write_planetoid_layout(tmp_path)  # N = 520 + 20 = 540
    path = raw_dir / "ind.cora.test.index"
    values = [int(v) for v in path.read_text().split()]
    values[values.index(max(values))] = 540
    path.write_text("".join(f"{v}\n" for v in values))
    with pytest.raises(CorruptDataError, match=r"a node index is outside \[0, 540\)"):
        read_planetoid(raw_dir, "cora")


def test_a_neighbour_equal_to_the_node_count_is_named(tmp_path, writers):
    """kills: planetoid.py ``0 <= i < N`` -> ``<= N`` for the graph's nodes (neighbour 540 of a
    540-node graph became an edge to a node that does not exist)."""
    import collections

    raw_dir = writers.write_planetoid_layout(tmp_path)
    _rewrite(raw_dir, "graph", lambda g: collections.defaultdict(list, {**g, 0: [*g[0], 540]}))
    with pytest.raises(CorruptDataError, match=r"a node index is outside \[0, 540\)"):
        read_planetoid(raw_dir, "cora")


def test_citeseer_raw_features_stay_binary_when_asked(tmp_path, writers):
    """kills: planetoid.py ``load_citeseer`` not passing ``normalize_features`` on (CiteSeer was
    always row-normalised, even with ``normalize_features=False``)."""
    writers.write_planetoid_layout(tmp_path, "CiteSeer", gap=True)
    raw = load_dataset("citeseer", root=tmp_path, verify=False, normalize_features=False)
    x = raw.data.x
    assert set(x.unique().tolist()) == {0.0, 1.0} and raw.meta["features"] == "raw binary bag of words"
    normed = load_dataset("citeseer", root=tmp_path, verify=False).data.x
    sums = x.sum(1, keepdim=True)
    torch.testing.assert_close(normed, torch.where(sums > 0, x / sums.clamp(min=1), x))


# ---------------------------------------------------------------------------------------------- tu
def _tu_zip(writers, path, name, files):
    """A TU zip holding ``<name>/<file>`` entries with the given texts (graphs written by hand)."""
    return writers.write_stored_zip(path, [(f"{name}/{fname}", text) for fname, text in files.items()])


def _two_triangles_and_two_paths(name):
    """Four graphs: triangles (label 1) and 3-node paths (label 2), one edge per line, both ways."""
    edges, indicator = [], []
    for g in range(4):
        a = 3 * g + 1
        pairs = [(a, a + 1), (a + 1, a + 2), (a + 2, a)] if g % 2 == 0 else [(a, a + 1), (a + 1, a + 2)]
        edges += [f"{u}, {v}" for u, v in pairs] + [f"{v}, {u}" for u, v in pairs]
        indicator += [str(g + 1)] * 3
    return {f"{name}_A.txt": "\n".join(edges) + "\n", f"{name}_graph_indicator.txt": "\n".join(indicator) + "\n",
            f"{name}_graph_labels.txt": "1\n2\n1\n2\n"}


def test_folder_entries_are_not_extracted_as_files(tmp_path, monkeypatch, writers):
    """kills: tu.py the ``info.is_dir()`` skip dropped (a folder entry ``MUTAG/MUTAG_extra/``
    became an empty file ``MUTAG_extra`` in ``raw/``)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    files = _two_triangles_and_two_paths("MUTAG")
    path = _tu_zip(writers, tmp_path / "tudataset" / "MUTAG.zip", "MUTAG", files)
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("MUTAG/MUTAG_extra/", b"")
    data = load_dataset("mutag", root=tmp_path, verify=False, val_fraction=0.25, test_fraction=0.25)
    assert len(data.dataset) == 4
    raw = cache / "tudataset" / "MUTAG" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == [".source_sha256", *sorted(files)]


def test_a_tu_zip_without_graph_indicator_is_a_named_corrupt_archive(tmp_path, monkeypatch, writers):
    """kills: tu.py ``_graph_indicator.txt`` dropped from the required entries (PyG then failed
    on the missing file with a bare error naming no archive)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    files = _two_triangles_and_two_paths("MUTAG")
    del files["MUTAG_graph_indicator.txt"]
    _tu_zip(writers, tmp_path / "tudataset" / "MUTAG.zip", "MUTAG", files)
    with pytest.raises(CorruptDataError, match=r"MUTAG\.zip' is not a TU dataset archive for MUTAG: missing MUTAG_graph_indicator\.txt"):
        load_dataset("mutag", root=tmp_path, verify=False)


def test_the_temporary_extraction_folder_is_removed(tmp_path, monkeypatch, writers):
    """kills: tu.py the ``shutil.rmtree(tmp)`` of the ``finally`` clause dropped (every extraction,
    and every refused archive, left a ``.extract-*`` folder beside ``raw/``)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    files = _two_triangles_and_two_paths("PTC_MR")
    zip_path = _tu_zip(writers, tmp_path / "tudataset" / "PTC_MR.zip", "PTC_MR", files)
    load_dataset("ptc_mr", root=tmp_path, verify=False, val_fraction=0.25, test_fraction=0.25)
    work = cache / "tudataset" / "PTC_MR"
    assert sorted(p.name for p in work.iterdir()) == ["processed", "raw"]
    del files["PTC_MR_graph_labels.txt"]
    _tu_zip(writers, zip_path, "PTC_MR", files)  # a changed (and now broken) archive
    with pytest.raises(CorruptDataError, match="missing PTC_MR_graph_labels.txt"):
        load_dataset("ptc_mr", root=tmp_path, verify=False)
    assert not [p.name for p in work.iterdir() if p.name.startswith(".extract-")]


def test_an_unknown_node_features_recipe_is_refused(tmp_path):
    """kills: tu.py the ``node_features`` check dropped (a misspelt recipe silently fell back to
    ``"auto"``); the check runs before any file is looked for."""
    with pytest.raises(ValueError, match=r"node_features must be 'auto', 'degree' or 'constant', got 'bogus'"):
        load_dataset("mutag", root=tmp_path, node_features="bogus")


def test_k_fold_refuses_an_empty_val_part(tmp_path, writers, monkeypatch):
    """kills: tu.py the ``require_heldout`` call of the k-fold branch dropped (``val_fraction=0``
    with ``fold`` set left the val split empty, found only at the first evaluation)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    writers.write_tu_zip(tmp_path / "tudataset" / "MUTAG.zip", "MUTAG")
    with pytest.raises(ValueError, match=r"mutag: val_fraction=0\.0 leaves the val split empty \(0 of 20 examples\)"):
        load_dataset("mutag", root=tmp_path, verify=False, fold=1, num_folds=5, val_fraction=0.0)


def test_the_registered_tu_loader_passes_the_split_options_on(tmp_path, writers, monkeypatch):
    """kills: tu.py the registered loader passing ``test_fraction=0.1`` or ``val_fraction=0.1``
    instead of the options. By hand: 10 graphs per class; val 0.2 -> 2 per class, test 0.3 -> 3
    per class (``floor(f n + 1/2)``), train the other 5 per class."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    writers.write_tu_zip(tmp_path / "tudataset" / "MUTAG.zip", "MUTAG")
    d = load_dataset("mutag", root=tmp_path, verify=False, val_fraction=0.2, test_fraction=0.3)
    labels = torch.cat([g.y for g in d.dataset])
    assert [labels[i].bincount(minlength=2).tolist() for i in (d.train_idx, d.val_idx, d.test_idx)] == [[5, 5], [2, 2], [3, 3]]
    assert d.meta["sizes"] == {"train": 10, "val": 4, "test": 6}


def test_the_registered_tu_loader_defaults_to_ten_folds(tmp_path, writers, monkeypatch):
    """kills: tu.py the registered loader's default ``num_folds=10`` -> ``5`` (``fold=0`` alone gave
    a fifth of the graphs as test, not the documented tenth). By hand: 20 graphs, 10 per class,
    dealt to 10 folds: 2 test graphs, one per class; val 0.1 of each class of the other 18 (9 ->
    ``floor(0.9 + 1/2)`` = 1 per class)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    writers.write_tu_zip(tmp_path / "tudataset" / "MUTAG.zip", "MUTAG")
    d = load_dataset("mutag", root=tmp_path, verify=False, fold=0)
    assert d.meta["sizes"] == {"train": 16, "val": 2, "test": 2}
    assert d.meta["split"].startswith("stratified 10-fold, test fold 0")


# -------------------------------------------------------------------------------------------- csbm
def _graph(seed=0, **kw):
    opts = dict(num_nodes=40, num_classes=2, avg_degree=4.0, homophily=0.5, feature_dim=4, mu=1.0)
    opts.update(kw)
    return csbm_graph(**opts, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("n, d, m", [(10, 1.5, 8), (10, 1.3, 6), (12, 2.25, 14)])
def test_the_edge_count_is_python_round_of_n_d_over_two(n, d, m):
    """kills: csbm.py ``M = round(N d / 2)`` -> ``int(N d / 2)`` (7.5 and 13.5 were cut to 7 and 13).
    By hand: ``round`` rounds halves to even, 7.5 -> 8, 6.5 -> 6, 13.5 -> 14; the edge index
    holds both directions, ``2M`` columns."""
    for seed in range(3):
        _, ei, _ = _graph(seed, num_nodes=n, avg_degree=d)
        assert ei.shape == (2, 2 * m)


def test_the_intra_class_edge_count_is_binomial():
    """kills: csbm.py ``M_in ~ Binomial(M, h)`` -> ``round(M h)`` (every graph had exactly the
    rounded share of intra-class edges). Reference: over 200 seeds, ``M = 20``, ``h = 0.5``, the
    intra-class counts have mean ``M h = 10`` and variance ``M h (1 - h) = 5`` (the sample
    variance of 200 draws has a standard error of about 0.5)."""
    counts = []
    for seed in range(200):
        _, ei, y = _graph(seed, num_nodes=10, avg_degree=4.0, homophily=0.5)
        assert ei.shape == (2, 40)
        counts.append(int((y[ei[0]] == y[ei[1]]).sum()) // 2)  # both directions of each edge
    counts = np.array(counts, dtype=float)
    assert abs(counts.mean() - 10.0) < 0.5
    assert 3.5 < counts.var(ddof=1) < 6.5


@pytest.mark.parametrize("seed", [0, 5])
def test_load_csbm_masks_follow_the_seeded_random_split(seed):
    """kills: csbm.py ``load_csbm`` swapping the val and test masks (with equal fractions the sizes
    agree), and reporting the val size as the test size in ``meta["sizes"]``. Reference: the documented split, a
    permutation of ``range(50)`` from a generator seeded with ``seed``: train its first 30
    entries, val the next 5 (``0.1 * 50``), test the last 15 (``0.3 * 50``)."""
    d = load_dataset("csbm", num_nodes=50, num_classes=3, avg_degree=4.0, feature_dim=5, seed=seed,
                     val_fraction=0.1, test_fraction=0.3)
    perm = torch.randperm(50, generator=torch.Generator().manual_seed(seed))
    for mask, idx in ((d.data.train_mask, perm[:30]), (d.data.val_mask, perm[30:35]), (d.data.test_mask, perm[35:])):
        assert mask.nonzero().flatten().tolist() == sorted(idx.tolist())
    assert d.meta["sizes"] == {"train": 30, "val": 5, "test": 15}
    assert d.num_classes == 3 and d.data.y.bincount().tolist() == [17, 17, 16]
    assert d.meta["measured_edge_homophily"] == edge_homophily(d.data.edge_index, d.data.y)


def test_asking_for_every_intra_class_pair_gives_the_complete_class_graphs():
    """kills: csbm.py ``_sample_unique_pairs`` stopping at ``m - 1`` distinct pairs (``while
    keys.numel() < m - 1``: when the draws ran short by one the graph had one edge too few). By
    hand: 20 nodes in two classes of 10 have 2 * C(10, 2) = 90 intra-class pairs; ``h = 1`` and
    ``d = 9`` ask for ``M = round(20 * 9 / 2) = 90`` intra-class edges, i.e. every such pair."""
    for seed in range(4):
        _, ei, y = _graph(seed, num_nodes=20, avg_degree=9.0, homophily=1.0)
        assert ei.shape == (2, 180)
        same = y[:, None] == y[None, :]
        expected = (same & ~torch.eye(20, dtype=torch.bool)).nonzero().t()  # row-major: sorted by (source, target)
        assert torch.equal(ei, expected)


# ------------------------------------------------------------------------------ equivalent mutants
# splits.py ``stratified_kfold_split`` without the ``isinstance(num_folds, bool)`` guard: ``True`` is
#   1, which ``num_folds < 2`` refuses with the same message; ``False`` (0) likewise.
# splits.py ``stratified_kfold_split`` without its ``split_sizes(..., val_fraction, 0.0)`` call: the
#   inner ``stratified_split`` validates the same fraction with the same message before anything is
#   returned (it calls ``split_sizes`` even for an empty remainder).
# splits.py ``seeded_subset`` ``limit >= n`` -> ``limit > n``: at ``limit == n`` the sorted first n
#   entries of a permutation of ``range(n)`` are ``arange(n)``, the same tensor.
# planetoid.py ``except (ValueError, UnicodeDecodeError)`` -> ``except ValueError`` in
#   ``_planetoid_index``: ``UnicodeDecodeError`` is a subclass of ``ValueError``.
# csbm.py the class means built from the columns of ``q`` in a seeded random order: the columns of
#   a random orthonormal ``q`` in another order are again random orthonormal directions, so the
#   model (pairwise mean distance ``mu``, N(0, I) noise) is the same; only the draw changes, which
#   no documented property pins.
