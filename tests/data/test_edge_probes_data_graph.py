"""Edge-case probes of ``diffusionformer.data`` and ``diffusionformer.graph``.

Probed: ``load_dataset`` options (misspelt names, wrong types, numpy numbers, 0 / too-large
limits and val sizes, a data root that is a file, a unicode root), the file loaders fed from
tiny files under ``tmp_path`` (MNIST idx, tinyshakespeare text), the splits, ``TextData``
batching (corpora shorter than ``block_size``, ``batch_size`` above the split's length),
``MultiCropAugment`` / ``random_crop_flip`` (numpy scalars, integer images, 1x1 images, B=0),
``AttentionGraph`` (duplicate edges, self loops, zero edges, round trips through PyG ``Batch``),
``knn`` (``k = N - 1``, missing graph ids, NaN / inf features, half precision),
``from_edge_index`` and ``to_networkx``.

Found and fixed (tests whose docstring starts with "Bug:"):

* ``load_dataset``: an option of the wrong type was read as truthy (``normalize="no"``
  normalised) or failed deep in the loader (``'<=' not supported``, ``'float' object has no
  attribute 'numel'``, ``slice indices must be integers``); a misspelt option had no "did you
  mean" although a misspelt dataset name had one (registry.py).
* ``carve_val`` / ``seeded_subset``: a float ``val_size`` / ``limit`` failed with a bare slicing
  TypeError (splits.py).
* ``knn``: a NaN or inf feature made a point its own neighbour (breaking "a point is never its
  own neighbour"); float16 / bfloat16 features crashed in CPU ``cdist`` (knn.py).
* ``to_networkx``: a float ``edge_index`` was silently truncated to integers; a numpy
  ``threshold`` was refused as "not a number" (export.py).
* ``from_edge_index``: a list ``edge_index`` with ``self_loops`` failed inside PyG with
  ``list indices must be integers`` (interop.py).
* ``MultiCropAugment``: numpy scalars were refused with a misleading range message; uint8
  images failed inside ``affine_grid``; ``random_crop_flip`` refused a numpy ``padding`` (augment.py).
* ``TextData.get_batch`` on a one-token split said ``block_size must be in [1, 0]`` (base.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.utils import to_dense_batch

from diffusionformer.data import load_dataset
from diffusionformer.data.augment import MultiCropAugment, random_crop_flip
from diffusionformer.data.splits import carve_val, seeded_subset
from diffusionformer.data.text import char_text_data
from diffusionformer.graph import AttentionGraph, from_edge_index, from_pyg, knn, to_networkx


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _knn_reference(x: np.ndarray, batch: np.ndarray, k: int) -> set[tuple[int, int]]:
    """Brute-force float64 k-NN edges (source, target), no self pairs, within each graph."""
    edges = set()
    for i in range(len(x)):
        cand = [j for j in range(len(x)) if j != i and batch[j] == batch[i]]
        d = {j: float(np.linalg.norm(x[i].astype(np.float64) - x[j].astype(np.float64))) for j in cand}
        edges |= {(j, i) for j in sorted(cand, key=lambda j: (d[j], j))[:k]}
    return edges


# ----------------------------------------------------------------------------- registry


def test_misspelt_option_suggests_the_valid_name():
    """Bug: ``load_dataset("digits", val_fracton=0.1)`` listed the options but, unlike a misspelt
    dataset name, gave no "did you mean"."""
    with pytest.raises(TypeError, match=r"'val_fracton' \(did you mean 'val_fraction'\?\)"):
        load_dataset("digits", val_fracton=0.1)


@pytest.mark.parametrize("name, options, option", [
    ("digits", {"normalize": "no"}, "normalize"),  # was silently truthy: the data was normalised
    ("digits", {"val_fraction": "0.1"}, "val_fraction"),  # was "'<=' not supported ..."
    ("assoc-recall", {"num_examples": 10.0, "num_pairs": 1, "vocab_size": 4}, "num_examples"),  # AttributeError
    ("karate", {"num_train_per_class": 1.5}, "num_train_per_class"),  # "slice indices must be integers"
    ("karate", {"num_train_per_class": True}, "num_train_per_class"),  # silently one per class
    ("pydoc-chars", {"train_fraction": "0.5"}, "train_fraction"),  # "'<' not supported ..."
])
def test_option_of_the_wrong_type_is_named(name, options, option):
    """Bug: an option whose type differs from its default's was read as truthy (``normalize="no"``
    normalised the images, ``num_train_per_class=True`` trained on one node per class) or failed
    deep inside the loader with an error that did not name the option."""
    with pytest.raises(TypeError, match=rf"option '{option}' must be"):
        load_dataset(name, **options)


def test_numpy_and_int_options_still_accepted():
    """numpy numbers where numbers go, and an int for a float option, load as the Python values do."""
    a = load_dataset("karate", num_train_per_class=np.int64(3))
    b = load_dataset("karate", num_train_per_class=3)
    assert torch.equal(a.data.train_mask, b.data.train_mask) and int(a.data.train_mask.sum()) == 12
    c = load_dataset("csbm", num_nodes=40, avg_degree=4, seed=1)
    d = load_dataset("csbm", num_nodes=40, avg_degree=4.0, seed=1)
    assert torch.equal(c.data.edge_index, d.data.edge_index)


def test_float_val_size_and_limit_are_named(writers, tmp_path):
    """Bug: ``load_dataset("mnist", val_size=5.0)`` (and a float ``limit``) failed with a bare
    ``slice indices must be integers``; ``None``-default options are not type-checked by the
    registry, so the splits name them now."""
    writers.write_mnist_layout(tmp_path)
    with pytest.raises(TypeError, match="val_size must be an int"):
        load_dataset("mnist", root=tmp_path, verify=False, val_size=5.0)
    with pytest.raises(TypeError, match="limit must be an int"):
        seeded_subset(10, 3.0, seed=0)
    tr, va = carve_val(10, np.int64(3), seed=0)
    assert (len(tr), len(va)) == (7, 3)


def test_mnist_from_unicode_root_limits_and_root_that_is_a_file(writers, tmp_path):
    """A unicode data root reads; ``limit_train`` above the data keeps it all (checked against the
    written arrays); a root that is a file is a DataRootError naming the missing files."""
    root = tmp_path / "dätä 🙂"
    arrays = writers.write_mnist_layout(root, n_train=20, n_test=10)
    data = load_dataset("mnist", root=root, verify=False, val_size=2, limit_train=1000, normalize=False)
    assert data.meta["sizes"] == {"train": 18, "val": 2, "test": 10}
    got = torch.cat([data.x_train, data.x_val]).mul(255).round().to(torch.uint8).flatten(1)
    want = torch.from_numpy(arrays["train_images"]).flatten(1)
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, want.tolist()))
    (tmp_path / "afile").write_text("x")
    from diffusionformer.data import DataRootError
    with pytest.raises(DataRootError, match="missing file"):
        load_dataset("mnist", root=tmp_path / "afile")


def test_tinyshakespeare_unicode_text_from_tmp_root(tmp_path):
    """A corpus with non-ASCII characters under a unicode root: nanoGPT's split and vocabulary."""
    text = "Ünïcödé 🙂 text, ﬁne.\n" * 5
    (tmp_path / "ró ot" / "tinyshakespeare").mkdir(parents=True)
    (tmp_path / "ró ot" / "tinyshakespeare" / "input.txt").write_text(text, encoding="utf-8")
    data = load_dataset("tinyshakespeare", root=tmp_path / "ró ot", verify=False)
    n = int(0.9 * len(text))
    assert data.itos == sorted(set(text))
    assert data.decode(data.train) == text[:n] and data.decode(data.val) == text[n:]


# ----------------------------------------------------------------------------- text batching


def test_get_batch_on_a_one_token_split_says_it_is_too_short():
    """Bug: a split of one token (a corpus shorter than any window) said ``block_size must be in
    [1, 0]``, an empty range, instead of that the split is too short."""
    data = char_text_data("toy", "abcabcabca")  # val = one token
    with pytest.raises(ValueError, match=r"'val' split has 1 token\(s\)"):
        data.get_batch("val", 2, 1)


def test_get_batch_batch_larger_than_split_and_longest_window():
    """``batch_size`` above the split's length samples windows with replacement; ``block_size = L - 1``
    has the single window ``x = s[:-1], y = s[1:]``."""
    data = char_text_data("toy", "abcabcabca")
    L = data.train.numel()
    x, y = data.get_batch("train", 50, 3, _gen())
    s = data.train.tolist()
    windows = {tuple(s[i:i + 4]) for i in range(L - 3)}
    assert x.shape == (50, 3) and all(tuple(a) + (b[-1],) in windows for a, b in zip(x.tolist(), y.tolist()))
    x, y = data.get_batch("train", 3, L - 1, _gen())
    assert torch.equal(x, data.train[:-1].expand(3, -1)) and torch.equal(y, data.train[1:].expand(3, -1))


# ----------------------------------------------------------------------------- augmentation


def test_multicrop_accepts_numpy_scalars_and_names_integer_images():
    """Bug: ``MultiCropAugment(noise_std=np.float32(0.1))`` was refused as "must lie in [0, inf]",
    ``random_crop_flip(..., padding=np.int64(1))`` as "must be an int", and uint8 images failed
    inside ``affine_grid`` ("Expected theta to have floating point type")."""
    aug = MultiCropAugment(noise_std=np.float32(0.25), brightness=np.float64(0.1))
    ref = MultiCropAugment(noise_std=float(np.float32(0.25)), brightness=0.1)
    x = torch.rand(2, 1, 8, 8)
    assert torch.equal(aug(x, _gen()), ref(x, _gen()))
    assert torch.equal(random_crop_flip(x, _gen(), padding=np.int64(1)), random_crop_flip(x, _gen(), padding=1))
    with pytest.raises(TypeError, match="floating-point images"):
        aug(torch.zeros(2, 1, 8, 8, dtype=torch.uint8), _gen())


def test_multicrop_one_pixel_and_constant_images():
    """A 1x1 image and a constant image give finite views of the input size, with a gradient."""
    aug = MultiCropAugment(local_crops=1, blur_prob=1.0)
    x = torch.ones(2, 3, 1, 1, requires_grad=True)
    v = aug(x, _gen())
    assert v.shape == (3, 2, 3, 1, 1) and bool(torch.isfinite(v).all())
    v.sum().backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())
    c = MultiCropAugment(contrast=0.0, brightness=0.0, blur_prob=0.0)(torch.full((2, 1, 6, 6), 0.5), _gen())
    torch.testing.assert_close(c, torch.full_like(c, 0.5))


# ----------------------------------------------------------------------------- knn


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_knn_refuses_non_finite_features(bad):
    """Bug: a NaN or inf feature made ``knn`` return the point as its own neighbour (the masked
    self distance tied with the non-finite ones), breaking "a point is never its own neighbour"."""
    x = torch.tensor([[0.0], [bad], [1.0], [2.0]])
    with pytest.raises(ValueError, match="x must be finite"):
        knn(x, 3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_knn_half_precision(dtype):
    """Bug: ``knn`` on float16 / bfloat16 features crashed with ``"cdist" not implemented for
    'Half'`` on the CPU; it now gives the neighbours of the (exactly representable) points."""
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0], [7.0, 1.0], [7.0, 3.0]])
    g = knn(x.to(dtype), 2)
    got = set(map(tuple, g.edge_index.t().tolist()))
    assert got == _knn_reference(x.numpy(), np.zeros(5, dtype=int), 2)


def test_knn_k_is_n_minus_one_and_missing_graph_ids():
    """``k = N - 1`` is the complete graph without self loops; a batch with a missing graph id
    (0, 2) gives each node its k nearest within its graph (float64 brute-force reference), and the
    dense layout pads the empty graph."""
    x = torch.randn(4, 3, generator=_gen())
    assert torch.equal(knn(x, 3).dense_allowed()[0], ~torch.eye(4, dtype=torch.bool))
    x = torch.randn(7, 2, generator=_gen(1))
    batch = torch.tensor([2, 0, 2, 0, 0, 2, 2])
    g = knn(x, 2, batch=batch)
    assert set(map(tuple, g.edge_index.t().tolist())) == _knn_reference(x.numpy(), batch.numpy(), 2)
    d = knn(x[batch.argsort(stable=True)], 2, batch=batch.sort(stable=True).values, layout="dense")
    assert d.batch_size == 3 and d.key_padding_mask[1].all() and not d.allowed[1].any()


# ----------------------------------------------------------------------------- AttentionGraph / interop


def test_duplicate_edges_and_self_loops_to_dense():
    """Duplicate edges collapse to one entry of ``A``; a self loop is a diagonal entry; zero edges
    give an all-False ``A`` (reference: hand-written matrices)."""
    g = AttentionGraph.sparse(torch.tensor([[0, 0, 1, 2, 2], [1, 1, 0, 2, 2]]), 3)
    want = torch.tensor([[0, 1, 0], [1, 0, 0], [0, 0, 1]], dtype=torch.bool)
    assert torch.equal(g.dense_allowed()[0], want)
    empty = AttentionGraph.sparse(torch.zeros(2, 0, dtype=torch.long), 3)
    assert not empty.dense_allowed().any() and empty.dense_allowed().shape == (1, 3, 3)


def test_pyg_batch_round_trip_through_dense_and_back():
    """``from_pyg(Batch)`` keeps ``edge_index`` and ``batch``; ``to_dense`` lays nodes out as
    :func:`to_dense_batch` does (a one-node edgeless graph included), and ``to_sparse`` maps back
    to the same edge set once node ``b * N_max + pos`` is mapped to the original node id."""
    graphs = [Data(edge_index=torch.tensor([[0, 1, 1, 2], [1, 0, 1, 0]]), num_nodes=3),
              Data(edge_index=torch.zeros(2, 0, dtype=torch.long), num_nodes=1),
              Data(edge_index=torch.tensor([[0], [1]]), num_nodes=2)]
    b = Batch.from_data_list(graphs)
    g = from_pyg(b)
    assert torch.equal(g.edge_index, b.edge_index) and torch.equal(g.batch, b.batch) and g.batch_size == 3
    d = g.to_dense()
    ids, real = to_dense_batch(torch.arange(b.num_nodes), b.batch)
    assert torch.equal(d.key_padding_mask, ~real)
    back = d.to_sparse()
    flat = ids.reshape(-1)
    mapped = {(int(flat[s]), int(flat[t])) for s, t in back.edge_index.t().tolist()}
    assert mapped == set(map(tuple, b.edge_index.t().tolist()))
    # and through PyG Data again
    again = from_pyg(Data(edge_index=g.edge_index, num_nodes=g.num_nodes, batch=g.batch))
    assert torch.equal(again.dense_allowed(), g.dense_allowed())


def test_from_edge_index_non_tensor_is_named():
    """Bug: ``from_edge_index([[0, 1], [1, 0]], 3, self_loops=True)`` failed inside PyG with
    ``list indices must be integers or slices, not tuple``."""
    with pytest.raises(TypeError, match="edge_index must be an integer tensor"):
        from_edge_index([[0, 1], [1, 0]], 3, self_loops=True)


def test_from_edge_index_self_loops_on_duplicates_int32():
    """``self_loops=True`` on an int32 edge list with a duplicate self loop leaves exactly one loop per node."""
    g = from_edge_index(torch.tensor([[0, 1, 1, 1], [1, 0, 1, 1]], dtype=torch.int32), 3, self_loops=True)
    loops = g.edge_index[:, g.edge_index[0] == g.edge_index[1]]
    assert g.edge_index.dtype == torch.int64 and sorted(loops[0].tolist()) == [0, 1, 2]


def test_to_networkx_float_edge_index_and_numpy_threshold():
    """Bug: ``to_networkx(torch.tensor([[0.5], [1.]]))`` silently truncated the float ids to the
    edge 0 -> 1, and ``threshold=np.float32(0.5)`` was refused with "threshold must be a number"."""
    with pytest.raises(TypeError, match="edge_index must be an integer tensor"):
        to_networkx(torch.tensor([[0.5], [1.0]]))
    ei = torch.tensor([[0, 1, 2], [2, 2, 0]])
    G = to_networkx(ei, torch.tensor([0.25, 0.75, 1.0]), threshold=np.float32(0.5))
    assert sorted(G.edges(data="weight")) == [(1, 2, 0.75), (2, 0, 1.0)]
