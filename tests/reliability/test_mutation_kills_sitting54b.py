"""Mutation audit (helper 54h) of the library lines changed in ``46f3b9a..171dd0a`` (data.checksums, cifar10, mnist, idx,
paths, planetoid, text, tu; ops.dense ``_fused``; ops.recompute ``_in_place_allowed``; nn.attention; nn._weights
``_quantized_compute``; operators.base ``__dir__``; models.vit ``attention_rollout`` checks; testing.faults;
experiments.validate), then data._unpickle, data.csbm and data.registry.

Hand-written mutants, one at a time, each run against the module's own tests (tests/data, tests/reliability/*_54*,
the module's mutation-kill files):

    module                 mutants  killed before  new kills  equivalent  bugs
    data.checksums               3              3          0           0     0
    data.cifar10                 5              4          1           0     0
    data.idx                     6              5          1           0     0
    data.mnist                   5              4          1           0     0
    data.paths                  11              8          3           0     0
    data.planetoid               5              4          0           1     0
    data.text                    3              3          0           0     0
    data.tu                     18             14          3           1     0
    ops.dense (_fused)          12             10          2           0     0
    ops.recompute                3              2          0           1     0
    nn.attention                 4              4          0           0     0
    nn._weights                  7              3          4           0     0
    operators.base (__dir__)     3              3          0           0     0
    models.vit (rollout)         4              4          0           0     0
    testing.faults               5              2          1           2     1
    experiments.validate         1              1          0           0     0
    data._unpickle              16             14          1           1     0
    data.csbm                   17             10          5           2     0
    data.registry               12              9          2           1     0
    total                      140            107         24           9     1

Equivalent: recompute._in_place_allowed without ``is_compiling()`` (``_in_eager_transform()`` is False while
compiling); planetoid ``size >= cap + 1`` (``> cap`` for ints); registry.unregister_dataset popping ``_key(name)``
(the key dataset_spec found it under); csbm drawing ``need`` pairs a round (same law, another seeded stream) and a
float32 binomial over 2**24 edges (needs a graph of > 16.7M edges: too slow to pin); tu's marker digest compared
unstripped (the line holds the digest alone); faults without ``resolve_neg()``/``resolve_conj()`` (the contiguous
clone materialises both bits); _unpickle's state version forced to 1 (NumPy writes 1).

Bug: ``testing.faults._bit_equal`` compared sparse tensors by their dense copies, which turn a stored -0.0 into 0.0.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from diffusionformer.data import CorruptDataError, load_dataset


def _swap_before(module, name: str, monkeypatch, path: Path, replacement: bytes) -> None:
    """Make ``module.name`` rewrite ``path`` with ``replacement`` just before it runs (once)."""
    real = getattr(module, name)

    def swapped(*args, **kwargs):
        path.write_bytes(replacement)
        monkeypatch.setattr(module, name, real)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, swapped)


def test_a_cifar_zip_rewritten_while_a_limited_subset_is_read_is_refused(tmp_path, cache, data_writers, monkeypatch):
    """Kills: cifar10._from_zip without ``_check_unchanged`` after the ``limit`` path's read (only the unlimited,
    cached path was pinned): the subset read from another zip was returned as the checked one's."""
    import diffusionformer.data.cifar10 as cifar10

    root = tmp_path / "root"
    for split in ("train", "test"):
        data_writers.write_image_zip(root / "cifar10_jpg" / f"{split}.zip", split, per_class=4)
    train = root / "cifar10_jpg" / "train.zip"
    other = data_writers.write_image_zip(tmp_path / "other.zip", "train", per_class=5).read_bytes()
    _swap_before(cifar10, "read_image_zip", monkeypatch, train, other)
    with pytest.raises(CorruptDataError, match=r"train\.zip' changed while it was read"):
        load_dataset("cifar10", root=root, verify=False, normalize=False, limit_train=6)
    assert not cache.exists() or not list(cache.rglob("train-*.pt"))


def _tu_root(tmp_path: Path, data_writers) -> Path:
    root = tmp_path / "root"
    data_writers.write_tu_zip(root / "tudataset" / "MUTAG.zip", "MUTAG")
    return root


def test_an_unchanged_tu_extraction_is_reused_not_redone(tmp_path, cache, data_writers):
    """Kills: tu.extract_tu_zip writing a marker without the tables' listing (``f"{digest}\\n"`` or ``digest``
    alone): every load then unzipped the tables again, silently (no test saw the extraction redone)."""
    root = _tu_root(tmp_path, data_writers)
    load_dataset("mutag", root=root, verify=False)
    raw = cache / "tudataset" / "MUTAG" / "raw"
    inodes = {f.name: f.stat().st_ino for f in raw.iterdir()}
    load_dataset("mutag", root=root, verify=False)
    assert {f.name: f.stat().st_ino for f in raw.iterdir()} == inodes  # moved into place again: new inodes


def test_a_tu_table_edited_to_the_same_size_is_extracted_again(tmp_path, cache, data_writers):
    """Kills: tu._tables_listing recording each table's size instead of its SHA256 (the pinned edit changed the
    size): an edge moved to another node of the same number of digits loaded as is."""
    root = _tu_root(tmp_path, data_writers)
    load_dataset("mutag", root=root, verify=False)
    raw = cache / "tudataset" / "MUTAG" / "raw"
    shutil.rmtree(raw.parent / "processed")
    table = raw / "MUTAG_A.txt"
    good = table.read_text()
    first, rest = good.split("\n", 1)
    a, b = (int(v) for v in first.split(","))
    swapped = f"{b}, {a}" if len(f"{b}, {a}") == len(first) else None
    edited = first.replace(str(a), str(a + 1) if len(str(a + 1)) == len(str(a)) else str(a - 1), 1)
    table.write_text((swapped if swapped and swapped != first else edited) + "\n" + rest)
    assert table.stat().st_size == len(good.encode())
    with pytest.warns(UserWarning, match=r"changed or were removed"):
        load_dataset("mutag", root=root, verify=False)
    assert table.read_text() == good


def test_a_folder_inside_the_tu_raw_cache_is_not_hashed(tmp_path, cache, data_writers):
    """Kills: tu._tables_listing without ``f.is_file()``: a stray folder in ``raw/`` (a user's backup, an OS's
    metadata folder) failed every later load with ``IsADirectoryError`` from hashing it."""
    root = _tu_root(tmp_path, data_writers)
    load_dataset("mutag", root=root, verify=False)
    (cache / "tudataset" / "MUTAG" / "raw" / "backup").mkdir()
    assert len(load_dataset("mutag", root=root, verify=False).dataset) == 20


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="symbolic links")
def test_a_dangling_link_where_the_tu_processed_folder_belongs_is_removed(tmp_path):
    """Kills: paths.drop_unsafe_processed testing ``folder.exists()`` instead of ``os.path.lexists`` (a dangling link
    in place of ``processed/`` was left there: PyG's makedirs failed on it), and saying "a file" of it."""
    from diffusionformer.data.paths import drop_unsafe_processed

    processed = tmp_path / "processed"
    processed.symlink_to(tmp_path / "gone")
    with pytest.warns(UserWarning, match=r"processed: not a folder where PyG keeps"):
        refused = drop_unsafe_processed(processed)
    assert len(refused) == 1 and not os.path.lexists(processed)
    assert drop_unsafe_processed(processed) == []


def test_gzip_size_cap_is_exact_and_only_for_gzip_files(tmp_path, monkeypatch):
    """Kills: idx._check_gzip_size with its comparison moved off by one or its cap raised, or without its gzip-magic
    test (a plain IDX file over the cap, read no further than its header declares, refused unread)."""
    import diffusionformer.data.idx as idx

    monkeypatch.setattr(idx, "_MAX_GZIP_BYTES", 64)
    gz = tmp_path / "a.gz"
    gz.write_bytes(b"\x1f\x8b" + bytes(62))
    idx._check_gzip_size(gz)  # exactly the cap
    gz.write_bytes(b"\x1f\x8b" + bytes(63))
    with pytest.raises(CorruptDataError, match=r"a\.gz'.*65 B, more than any IDX archive \(64 B at most\)"):
        idx._check_gzip_size(gz)
    with pytest.raises(CorruptDataError, match="1000 B"):
        idx._check_gzip_size(gz, 1000)
    plain = tmp_path / "plain"
    plain.write_bytes(bytes(1000))
    idx._check_gzip_size(plain)


def test_planetoid_size_cap_is_exact(tmp_path, monkeypatch):
    """Kills: planetoid._check_file_size with its cap raised (2**40; the pinned 1.5 GB file stayed under 2**31 would
    not) or its comparison off by one."""
    import diffusionformer.data.planetoid as planetoid

    assert planetoid._MAX_FILE_BYTES == 2**30
    monkeypatch.setattr(planetoid, "_MAX_FILE_BYTES", 10)
    path = tmp_path / "ind.cora.x"
    path.write_bytes(bytes(10))
    planetoid._check_file_size(path)
    path.write_bytes(bytes(11))
    with pytest.raises(CorruptDataError, match=r"11 B, more than any Planetoid file \(10 B at most\)"):
        planetoid._check_file_size(path)


def test_vmap_dropout_path_keeps_the_causal_mask():
    """Kills: ops.dense._fused forming ``P`` without ``is_causal`` on its explicit vmap path (the vmap dropout tests
    were all bidirectional): under the causal mask query 0 sees key 0 only, so each sample's row 0 is ``x_0``
    dropped (0) or kept (``x_0 / (1 - p)``), never a mix of later keys."""
    from torch.func import vmap

    from diffusionformer.ops.dense import _fused

    torch.manual_seed(0)
    q, k, x = (torch.randn(1, 1, 5, 4, dtype=torch.float64) for _ in range(3))
    out = vmap(lambda _: _fused(q, k, x, None, True, 0.5, 0.5, None), randomness="different")(torch.arange(64))
    row0 = out[:, 0, 0, 0]  # (64, C)
    kept = (row0 - 2 * x[0, 0, 0]).abs().amax(-1) < 1e-12
    dropped = row0.abs().amax(-1) == 0
    assert (kept | dropped).all() and kept.any() and dropped.any()
    eager = _fused(q, k, x, None, True, 0.5, 0.0, None)
    torch.testing.assert_close(eager[0, 0, 0], x[0, 0, 0], rtol=0, atol=1e-12)


def test_vmap_dropout_path_returns_the_input_dtype():
    """Kills: ops.dense._fused returning ``P x`` in ``P``'s float32 work dtype on its explicit vmap path (the vmap
    tests were all float64): bfloat16 inputs gave a float32 output there and bfloat16 on the fused kernel."""
    from torch.func import vmap

    from diffusionformer.ops.dense import _fused

    q, k, x = (torch.randn(1, 2, 4, 8).to(torch.bfloat16) for _ in range(3))
    out = vmap(lambda _: _fused(q, k, x, None, False, 0.35, 0.25, None), randomness="different")(torch.arange(3))
    assert out.dtype == torch.bfloat16 == _fused(q, k, x, None, False, 0.35, 0.25, None).dtype


def _quantized(make):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make()


def test_quantized_compute_reads_only_quantized_modules_with_a_weight_method():
    """Kills: nn._weights._quantized_compute without its ``callable`` test (a quantized module without a ``weight``
    method: ``None()``), without its module test (any module with a ``weight`` method, not quantized, read as float32),
    without its ``isinstance(w, Tensor)`` test (a method returning a tuple, ``_weight_bias``), and reading only
    ``torch.ao.nn.quantized.dynamic`` (a quantized ``Embedding``, of ``torch.ao.nn.quantized.modules``)."""
    from torch import nn

    from diffusionformer.nn._weights import _quantized_compute

    emb = _quantized(lambda: torch.ao.nn.quantized.Embedding(5, 4))
    w = _quantized_compute(emb, "weight")
    assert isinstance(w, torch.Tensor) and w.dtype == torch.float32 and w.numel() == 0
    assert _quantized_compute(torch.ao.nn.quantized.ReLU6(), "weight") is None

    class Adapter(nn.Module):
        def weight(self):
            return torch.zeros(2, dtype=torch.float64)

    assert _quantized_compute(Adapter(), "weight") is None
    linear = _quantized(lambda: torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(4, 4)), {nn.Linear},
                                                                     dtype=torch.qint8)[0])
    assert _quantized_compute(linear, "_weight_bias") is None
    assert _quantized_compute(linear, "weight").dtype == torch.float32


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")
def test_bit_equal_of_sparse_tensors_takes_a_nan_for_itself():
    """Kills: testing.faults._bit_equal comparing sparse tensors with ``torch.equal`` (a NaN weight different from
    itself) instead of its own bitwise comparison."""
    from diffusionformer.testing.faults import _bit_equal

    i = torch.tensor([[0, 1], [1, 0]])
    a = torch.sparse_coo_tensor(i, torch.tensor([float("nan"), 1.0]), (2, 2))
    assert _bit_equal(a, a.clone())
    assert _bit_equal(a.to_sparse_csr(), a.clone().to_sparse_csr())
    assert not _bit_equal(a, torch.sparse_coo_tensor(i, torch.tensor([float("nan"), 2.0]), (2, 2)))


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")
def test_bug_bit_equal_of_sparse_tensors_tells_negative_zero(tmp_path):
    """Bug: ``testing.faults._bit_equal`` (behind ``assert_same_checkpoint_weights``) compared a sparse tensor by its
    dense copy, which adds each stored value to a zero: a stored -0.0 came out 0.0, so a sparse buffer whose -0.0
    turned into 0.0 passed as the same bytes (the function's contract, which names -0.0 for strided tensors). Now
    the stored indices and values are compared bit for bit."""
    from diffusionformer.testing import assert_same_checkpoint_weights
    from diffusionformer.testing.faults import _bit_equal

    i = torch.tensor([[0, 1], [1, 0]])
    z, nz = (torch.sparse_coo_tensor(i, torch.tensor([v, 1.0]), (2, 2)) for v in (0.0, -0.0))
    assert not _bit_equal(z, nz) and _bit_equal(nz, nz.clone())
    torch.save({"model": {"adj": z}}, tmp_path / "a.pt")
    torch.save({"model": {"adj": nz}}, tmp_path / "b.pt")
    with pytest.raises(AssertionError, match=r"1 of 1 tensors differ .* e\.g\. \['adj'\]"):
        assert_same_checkpoint_weights(tmp_path / "a.pt", tmp_path / "b.pt")
    assert_same_checkpoint_weights(tmp_path / "b.pt", tmp_path / "b.pt")


_REPO = Path(__file__).resolve().parents[2]
#: the staged benchmark root ($DIFFUSIONFORMER_DATA, read at import: tests/data's fixtures clear it, or ../shared/data)
STAGED = next((p for p in (Path(os.environ.get("DIFFUSIONFORMER_DATA") or _REPO / "nowhere"), _REPO.parent / "shared"
                           / "data") if (p / "SHA256SUMS").is_file()), _REPO / "nowhere")
_LABELS = "mnist/MNIST/raw/t10k-labels-idx1-ubyte.gz"


@pytest.mark.skipif(not (STAGED / _LABELS).is_file(), reason="the staged MNIST labels (../shared/data) are absent")
def test_a_rewrapped_mnist_gzip_passes_verify_by_its_content(tmp_path):
    """Kills: mnist._read calling ``verify_file`` without ``content=raw``: a ``.gz`` re-compressed by another tool
    (other bytes, the official IDX content) was refused as corrupt."""
    import gzip

    import diffusionformer.data.mnist as mnist
    from diffusionformer.data.idx import IDX_LABELS_MAGIC

    path = tmp_path / _LABELS
    path.parent.mkdir(parents=True)
    good = (STAGED / _LABELS).read_bytes()
    path.write_bytes(gzip.compress(gzip.decompress(good), compresslevel=1, mtime=0))
    assert path.read_bytes() != good
    labels = mnist._read(tmp_path, _LABELS, IDX_LABELS_MAGIC, True)
    assert labels.shape == (10000,)


def test_csbm_checks_name_the_bound_they_enforce():
    """Kills: csbm.csbm_graph's pair bound ``M > N (N - 1) / 2`` doubled (an avg_degree up to 2 (N - 1) passed it and
    failed later as a count of intra-class edges), its finite-features check dropped (``mu=1e39``: inf features
    without a word), and edge_homophily's id bound ``>= len(y)`` loosened to ``>`` (id ``len(y)``: a bare
    IndexError)."""
    from diffusionformer.data.csbm import csbm_graph, edge_homophily

    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match=r"avg_degree=12\.0 asks for more distinct edges than the 45 pairs of 10 "
                                         r"nodes; avg_degree must be at most num_nodes - 1 = 9"):
        csbm_graph(10, 2, 12.0, 0.5, 4, 1.0, g)
    with pytest.raises(ValueError, match=r"mu=1e\+39 puts the features beyond float32's range"):
        csbm_graph(10, 2, 2.0, 0.5, 4, 1e39, g)
    with pytest.raises(ValueError, match=r"edge_index values must lie in \[0, 3\) .* got range \[0, 3\]"):
        edge_homophily(torch.tensor([[0, 1], [1, 3]]), torch.tensor([0, 0, 1]))


def test_restricted_unpickler_bounds_are_exact():
    """Kills: data._unpickle with the code-point bound moved past U+10FFFF, 6-item array states accepted, and
    ``_codecs.encode`` to UTF-8 allowed (Python 3 writes bytes at protocol 2 as latin1 only)."""
    import pickle

    import numpy as np

    from diffusionformer.data import _unpickle

    def unicode(code: int) -> bytes:
        return np.array([code], dtype="<u4").tobytes()

    _unpickle._check_code_points(np.dtype("<U1"), unicode(0x10FFFF), "x")
    with pytest.raises(pickle.UnpicklingError, match=r"code point 0x110000, beyond U\+10FFFF"):
        _unpickle._check_code_points(np.dtype("<U1"), unicode(0x110000), "x")
    arr = _unpickle._reconstruct(_unpickle._NDARRAY, (0,), b"b")
    state = (1, (2,), np.dtype("<i4"), False, bytes(8))
    arr.__setstate__(state)
    assert arr.view(np.ndarray).tolist() == [0, 0]
    with pytest.raises(pickle.UnpicklingError, match="tuple of 4 or 5 items"):
        _unpickle._reconstruct(_unpickle._NDARRAY, (0,), b"b").__setstate__((1, *state))
    assert _unpickle._encode("\xe9", "latin1") == b"\xe9"
    with pytest.raises(pickle.UnpicklingError, match=r"_codecs\.encode\(str, 'utf-8'\) is not allowed"):
        _unpickle._encode("\xe9", "utf-8")


def test_csbm_edges_spread_over_all_node_ids():
    """Kills: csbm._sample_unique_pairs keeping the first ``m`` of its sorted unique keys instead of a random ``m``
    (it draws about twice as many as it needs): the edges went to the pairs of the lowest node ids, so the nodes of
    the upper half had a fraction of the degree of the lower half's; and edge_homophily's check of the first
    dimension dropped (a ``(3, E)`` edge_index failed as "too many values to unpack")."""
    from diffusionformer.data.csbm import csbm_graph, edge_homophily

    _, ei, y = csbm_graph(400, 2, 6.0, 0.5, 4, 1.0, torch.Generator().manual_seed(0))
    deg = torch.bincount(ei[0], minlength=400).double()
    ratio = float(deg[200:].mean() / deg[:200].mean())
    assert 0.8 < ratio < 1.25, ratio
    with pytest.raises(ValueError, match=r"edge_index must have shape \(2, E\), got \(3, 2\)"):
        edge_homophily(torch.zeros(3, 2, dtype=torch.long), torch.tensor([0, 1]))


def test_an_option_whose_default_is_no_plain_type_is_not_type_checked():
    """Kills: registry._check_option_type checking every option but those defaulting to ``None`` (its table names
    bool, int, float and str only): an option defaulting to a ``Path`` refused the str a YAML config gives it; and
    load_dataset without ``_check_seed`` (a negative or bool seed reached a loader that does not check it)."""
    from diffusionformer.data.registry import register_dataset, unregister_dataset

    seen = []

    @register_dataset("probe-54h-tuple-option", kind="sequence_lm")
    def _loader(*, seed, shape=Path("a")):
        seen.append(shape)
        return load_dataset("assoc-recall", num_examples=20, num_pairs=2, vocab_size=8, seed=seed)

    try:
        load_dataset("probe-54h-tuple-option", shape="b")
        with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*64 - 1\].*got -1"):
            load_dataset("probe-54h-tuple-option", seed=-1)  # checked before the loader runs, whatever it does
        with pytest.raises(TypeError, match="seed must be an int, got bool"):
            load_dataset("probe-54h-tuple-option", seed=True)
    finally:
        unregister_dataset("probe-54h-tuple-option")
    assert seen == ["b"]


def test_a_tu_zip_refused_inside_the_extraction_is_named_once(tmp_path):
    """Kills: tu.extract_tu_zip without ``CorruptDataError`` in its re-raised exceptions: its own refusals (two
    entries of one name, declared sizes over the cap) were caught by the damaged-archive clause (a CorruptDataError is
    a ValueError) and wrapped again, "corrupt zip archive 'x': corrupt zip archive 'x': ..."."""
    import zipfile

    from diffusionformer.data.tu import extract_tu_zip

    path = tmp_path / "MUTAG.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("MUTAG/MUTAG_A.txt", "1, 2\n")
        zf.writestr("other/MUTAG_A.txt", "1, 2\n")
    with pytest.raises(CorruptDataError, match=r"two entries named MUTAG_A\.txt") as err:
        extract_tu_zip(path, "MUTAG", tmp_path / "raw", "0" * 64)
    assert str(err.value).count("corrupt zip archive") == 1, str(err.value)

