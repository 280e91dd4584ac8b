"""Tests written in a mutation-testing audit of the data foundations.

Each test kills a mutant of ``diffusionformer/data`` (``base``: the typed containers and
``TextData.get_batch``; ``idx``: the IDX reader; ``checksums``; ``recall``; ``sequences``;
``text``) that the rest of the suite let through; the docstring of each test names it. The
references are independent of the code under test: hand-worked values, the documented
contract, bytes built here with ``struct``/NumPy/``gzip``. CPU only, deterministic, files only
under ``tmp_path``.

One test guards a defect the audit found and fixed (its docstring starts with "Bug"):
``TextData.decode`` turned negative token ids into characters, counting from the end of the
vocabulary, instead of refusing them.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import struct

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from diffusionformer.data import (
    ClassificationData,
    CorruptDataError,
    GraphSetData,
    NodeData,
    SequenceTaskData,
    TextData,
    load_dataset,
    make_assoc_recall,
)
from diffusionformer.data import checksums
from diffusionformer.data.checksums import sha256_file, verify_file
from diffusionformer.data.idx import parse_idx, read_idx
from diffusionformer.data.paths import ChecksumError
from diffusionformer.data.text import char_text_data


def _classification(kind="sequence", input_shape=(3, 2), n=(4, 2, 2), **over):
    splits = {}
    for name, size in zip(("train", "val", "test"), n):
        splits[f"x_{name}"] = torch.zeros(size, *input_shape)
        splits[f"y_{name}"] = torch.zeros(size, dtype=torch.int64)
    splits.update(over)
    return ClassificationData(name="toy", kind=kind, num_classes=2, input_shape=input_shape, **splits)


def _sequence_task(**over):
    splits = {f"{v}_{s}": torch.zeros(2, 5, dtype=torch.int64) for s in ("train", "val", "test") for v in "xy"}
    splits.update(over)
    return SequenceTaskData(name="toy", vocab_size=4, **splits)


def _node_graph(**over):
    kw = dict(
        x=torch.zeros(4, 3),
        edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]),
        y=torch.zeros(4, dtype=torch.int64),
        train_mask=torch.tensor([True, True, False, False]),
        val_mask=torch.tensor([False, False, True, False]),
        test_mask=torch.tensor([False, False, False, True]),
    )
    kw.update(over)
    return Data(**{k: v for k, v in kw.items() if v is not None})


def _idx(type_code: int, dims: tuple[int, ...], payload: bytes) -> bytes:
    return struct.pack(">I", (type_code << 8) | len(dims)) + struct.pack(f">{len(dims)}I", *dims) + payload


# --- base: the containers --------------------------------------------------------------------


def test_an_unknown_split_name_is_a_value_error_naming_it():
    """Mutant: ``_TensorSplits.split`` without ``_check_split`` (an ``AttributeError`` about
    ``x_dev`` instead of the list of valid splits)."""
    with pytest.raises(ValueError, match=r"split must be one of \['train', 'val', 'test'\], got 'dev'"):
        _classification().split("dev")
    with pytest.raises(ValueError, match="got 'dev'"):
        _sequence_task().split("dev")


def test_an_unknown_classification_kind_is_refused():
    """Mutant: the ``kind not in ("image", "sequence")`` check dropped (``kind="audio"`` with a
    2-dim input shape was accepted as a sequence)."""
    with pytest.raises(ValueError, match="kind must be 'image' or 'sequence', got 'audio'"):
        _classification(kind="audio")


def test_classification_x_must_be_float32_even_when_y_is_int64():
    """Mutant: ``x.dtype != float32 or y.dtype != int64`` -> ``and`` (a float64 x passed)."""
    with pytest.raises(ValueError, match="expected float32 x and int64 y"):
        _classification(x_val=torch.zeros(2, 3, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="expected float32 x and int64 y"):
        _classification(y_test=torch.zeros(2, dtype=torch.int32))


def test_classification_x_and_y_must_agree_on_n_and_on_the_input_shape():
    """Mutants: the ``x.shape[0] != y.shape[0]`` check dropped; the ``x.shape[1:] !=
    input_shape`` check dropped."""
    with pytest.raises(ValueError, match=r"train: expected x of shape \(N, 3, 2\)"):
        _classification(y_train=torch.zeros(3, dtype=torch.int64))  # 4 inputs, 3 labels
    with pytest.raises(ValueError, match=r"val: expected x of shape \(N, 3, 2\)"):
        _classification(x_val=torch.zeros(2, 2, 3))
    assert repr(_classification()) == (
        "ClassificationData(name='toy', kind='sequence', train=4, val=2, test=2, "
        "input_shape=(3, 2), num_classes=2)"
    )


def test_text_data_vocab_size_must_equal_len_itos():
    """Mutant: ``vocab_size != len(itos)`` -> ``>`` (a vocab_size below len(itos) passed)."""
    tokens = torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match=r"vocab_size \(2\) != len\(itos\) \(3\)"):
        TextData("toy", tokens, tokens, 2, ["a", "b", "c"])
    with pytest.raises(ValueError, match=r"vocab_size \(4\) != len\(itos\) \(3\)"):
        TextData("toy", tokens, tokens, 4, ["a", "b", "c"])


def test_text_data_streams_must_be_one_dimensional():
    """Mutant: the ``t.dim() != 1`` check of the token streams dropped."""
    with pytest.raises(ValueError, match=r"train: expected a 1-D int64 tensor, got torch.int64 of shape \(2, 2\)"):
        TextData("toy", torch.zeros(2, 2, dtype=torch.int64), torch.tensor([0]), 1, ["a"])


def test_encoding_the_empty_string_gives_an_int64_tensor():
    """Mutant: ``encode`` without ``dtype=torch.int64`` (``torch.tensor([])`` is float32)."""
    ids = char_text_data("toy", "abcabc").encode("")
    assert ids.dtype == torch.int64 and ids.shape == (0,)


def test_decoding_non_integer_ids_is_a_value_error():
    """Mutant: ``decode`` catching only ``IndexError`` (a float id gave a bare ``TypeError``)."""
    data = char_text_data("toy", "abcabc")
    with pytest.raises(ValueError, match=r"token ids in \[0, 3\), got \[0.5\]"):
        data.decode([0.5])
    with pytest.raises(ValueError, match=r"token ids in \[0, 3\)"):
        data.decode(torch.tensor([1.0]))


def test_decoding_negative_ids_is_refused():
    """Bug: ``decode([-1])`` returned the last character of the vocabulary (Python's negative
    indexing) instead of refusing an id outside ``[0, vocab_size)``, so decoding targets that
    hold ``IGNORE_INDEX`` (-100) with a vocabulary of 100+ symbols printed garbage."""
    data = char_text_data("toy", "abcabc")
    for bad in ([-1, 0], torch.tensor([2, -3])):
        with pytest.raises(ValueError, match=r"token ids in \[0, 3\)"):
            data.decode(bad)
    assert data.decode([2, 0, 1]) == "cab" and data.decode(torch.tensor([], dtype=torch.int64)) == ""


def test_get_batch_moves_both_inputs_and_targets_to_the_device():
    """Mutant: ``get_batch(device=...)`` moving ``x`` only (``y`` stayed on the CPU). The meta
    device stands in for an accelerator."""
    data = char_text_data("toy", "abcdefghij")
    x, y = data.get_batch("train", 2, 3, torch.Generator().manual_seed(0), device="meta")
    assert x.device.type == y.device.type == "meta" and x.shape == y.shape == (2, 3)


def test_get_batch_refuses_a_zero_block_size():
    """Mutant: ``1 <= block_size < L`` -> ``0 <= block_size`` (empty windows were returned)."""
    data = char_text_data("toy", "abcdefghij")
    with pytest.raises(ValueError, match=r"block_size must be in \[1, 8\] for the 'train' split of length 9, got 0"):
        data.get_batch("train", 2, 0)


def test_get_batch_windows_are_whole_and_in_order():
    """Mutants: the window offset shifted by one (``ix + 1 + arange``); ``y`` = ``x``.

    With ``train = [0, ..., 8]`` (a text of distinct characters), every window must be
    ``x = [i, ..., i + T - 1]``, ``y = x + 1`` for an ``i`` in ``[0, L - T - 1]``, and the first
    offset ``i = 0`` must be reachable."""
    data = char_text_data("toy", "abcdefghij")  # itos is sorted, so ids = positions
    assert data.train.tolist() == list(range(9))
    x, y = data.get_batch("train", 200, 4, torch.Generator().manual_seed(0))
    start = x[:, 0]
    assert torch.equal(x, start[:, None] + torch.arange(4)) and torch.equal(y, x + 1)
    assert set(start.tolist()) == set(range(9 - 4))  # every offset 0..4 drawn, nothing beyond
    assert repr(data) == "TextData(name='toy', train=9, val=1, vocab_size=10)"


def test_sequence_task_inputs_and_targets_must_have_the_same_shape():
    """Mutant: the ``x.shape != y.shape`` check of ``SequenceTaskData`` dropped."""
    with pytest.raises(ValueError, match=r"val: expected int64 inputs and targets of the same shape"):
        _sequence_task(y_val=torch.zeros(2, 4, dtype=torch.int64))


def test_seq_len_is_the_time_axis_not_the_number_of_examples():
    """Mutant: ``seq_len`` read from ``x_train.shape[0]`` (N) instead of ``shape[1]`` (T)."""
    data = _sequence_task(x_train=torch.zeros(3, 5, dtype=torch.int64), y_train=torch.zeros(3, 5, dtype=torch.int64))
    assert data.seq_len == 5
    assert repr(data) == "SequenceTaskData(name='toy', train=3, val=2, test=2, seq_len=5, vocab_size=4)"


def test_node_data_needs_every_mask_and_x_for_every_node():
    """Mutants: ``test_mask`` dropped from the required keys; the x-shape check reduced to the
    feature axis (a graph of 5 nodes with features for 4 passed)."""
    with pytest.raises(ValueError, match="NodeData needs data.test_mask"):
        NodeData("toy", _node_graph(test_mask=None), num_classes=2, num_features=3)
    short = _node_graph()
    short.num_nodes = 5
    with pytest.raises(ValueError, match=r"expected x of shape \(5, 3\), got \(4, 3\)"):
        NodeData("toy", short, num_classes=2, num_features=3)


def test_node_data_repr_counts_the_nodes_in_each_split():
    """Mutant: the repr's split sizes from ``mask.numel()`` (always N) instead of ``mask.sum()``."""
    data = NodeData("toy", _node_graph(), num_classes=2, num_features=3)
    assert repr(data) == (
        "NodeData(name='toy', num_nodes=4, num_edges=3, num_features=3, num_classes=2, "
        "train=2, val=1, test=1)"
    )


def test_graph_set_split_of_a_list_follows_the_indices():
    """Mutant: the list branch of ``GraphSetData.split`` taking the first ``len(idx)`` graphs
    instead of the graphs at ``idx``."""
    graphs = [Data(x=torch.full((1, 2), float(i)), edge_index=torch.zeros(2, 0, dtype=torch.int64),
                   y=torch.tensor([i % 2])) for i in range(5)]
    data = GraphSetData("toy", graphs, torch.tensor([3, 1]), torch.tensor([4]), torch.tensor([0, 2]), 2, 2)
    assert [float(g.x[0, 0]) for g in data.split("train")] == [3.0, 1.0]
    assert [float(g.x[0, 0]) for g in data.split("test")] == [0.0, 2.0]
    assert repr(data) == "GraphSetData(name='toy', num_graphs=5, num_features=2, num_classes=2, train=2, val=1, test=2)"


# --- idx --------------------------------------------------------------------------------------


def test_a_three_byte_file_is_corrupt_not_a_struct_error():
    """Mutant: ``len(raw) < 4`` -> ``< 3`` (3 bytes reached ``struct.unpack`` and raised
    ``struct.error``)."""
    with pytest.raises(CorruptDataError, match=r"<bytes>: not an IDX file \(only 3 bytes\)"):
        parse_idx(b"\x00\x00\x08")


def test_an_empty_array_has_a_header_and_no_payload():
    """Mutant: ``len(raw) < header`` -> ``<=`` (a valid file of zero items, header only, was
    called truncated)."""
    out = parse_idx(_idx(0x08, (0, 28), b""))
    assert out.shape == (0, 28) and out.dtype == torch.uint8


def test_a_nonzero_second_magic_byte_is_a_bad_magic():
    """Mutant: the zero check reads ``magic >> 24`` (only the first byte) instead of
    ``magic >> 16`` (both leading bytes)."""
    with pytest.raises(CorruptDataError, match="bad IDX magic number 0x00010801"):
        parse_idx(b"\x00\x01\x08\x01" + struct.pack(">I", 1) + b"\x07")


def test_int16_and_float64_payloads_decode_with_their_own_types():
    """Mutants: type 0x0B read as unsigned (``>u2``); type 0x0E read as float32."""
    shorts = np.array([-2, 300, -32768], dtype=">i2")
    assert parse_idx(_idx(0x0B, (3,), shorts.tobytes())).tolist() == [-2, 300, -32768]
    doubles = np.array([[0.1, -1e300]], dtype=">f8")
    out = parse_idx(_idx(0x0E, (1, 2), doubles.tobytes()))
    assert out.dtype == torch.float64 and out.tolist() == [[0.1, -1e300]]


def test_a_padded_file_says_trailing_bytes():
    """Mutant: the error state always "truncated" (a padded file was called truncated)."""
    with pytest.raises(CorruptDataError, match=r"has trailing bytes: header says \(2,\) x 1 B = 2 B of data, found 3 B"):
        parse_idx(_idx(0x08, (2,), b"\x01\x02\x03"))
    with pytest.raises(CorruptDataError, match=r"truncated: header says \(2,\) x 1 B = 2 B of data, found 1 B"):
        parse_idx(_idx(0x08, (2,), b"\x01"))


def test_a_damaged_deflate_stream_is_corrupt_naming_the_file(tmp_path):
    """Mutant: ``read_idx_bytes`` not catching ``zlib.error`` (a flipped bit in the deflate
    data escaped as ``zlib.error``)."""
    good = gzip.compress(_idx(0x08, (4,), b"\x01\x02\x03\x04"), mtime=0)
    bad = bytearray(good)
    bad[12] ^= 0xFF  # first byte of the deflate stream (after the 10-byte header)
    path = tmp_path / "labels.gz"
    path.write_bytes(bytes(bad))
    with pytest.raises(CorruptDataError, match=r"corrupt or truncated gzip file .*labels\.gz"):
        read_idx(path)


def test_a_bad_uncompressed_idx_file_is_named_in_the_error(tmp_path):
    """Mutant: ``read_idx`` not passing ``source=str(path)`` (errors said ``<bytes>``)."""
    path = tmp_path / "images-idx1-ubyte"
    path.write_bytes(_idx(0x08, (3,), b"\x01"))
    with pytest.raises(CorruptDataError, match=r"images-idx1-ubyte: IDX file truncated"):
        read_idx(path)


# --- checksums --------------------------------------------------------------------------------


def test_the_hash_cache_sees_a_rewrite_of_the_same_size(tmp_path):
    """Mutant: the cache key without ``st_mtime_ns`` (a rewritten file of the same size kept its
    old hash)."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"aaaa")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    assert sha256_file(path) == hashlib.sha256(b"aaaa").hexdigest()
    path.write_bytes(b"bbbb")
    os.utime(path, ns=(2_000_000_000, 2_000_000_000))
    assert sha256_file(path) == hashlib.sha256(b"bbbb").hexdigest()


def test_the_hash_cache_sees_a_rewrite_with_the_same_mtime(tmp_path):
    """Mutant: the cache key without ``st_size`` (a rewrite that kept the time stamp kept its
    old hash)."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"aaaa")
    os.utime(path, ns=(3_000_000_000, 3_000_000_000))
    assert sha256_file(path) == hashlib.sha256(b"aaaa").hexdigest()
    path.write_bytes(b"aaaaaa")
    os.utime(path, ns=(3_000_000_000, 3_000_000_000))
    assert sha256_file(path) == hashlib.sha256(b"aaaaaa").hexdigest()


def test_a_rewrapped_gz_passes_by_its_content_hash_only(tmp_path, monkeypatch):
    """Mutants: the content key cut with ``relpath[:-2]`` (keeping the dot, so a re-wrapped
    ``.gz`` never matched its content hash); the content hash not compared (any content
    passed)."""
    content = b"the decompressed idx bytes"
    monkeypatch.setitem(checksums.KNOWN_SHA256, "fake/data-idx1-ubyte.gz", "0" * 64)
    monkeypatch.setitem(checksums.KNOWN_CONTENT_SHA256, "fake/data-idx1-ubyte", hashlib.sha256(content).hexdigest())
    path = tmp_path / "data-idx1-ubyte.gz"
    path.write_bytes(gzip.compress(content, mtime=0))
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    assert verify_file(path, "fake/data-idx1-ubyte.gz", content=content) == actual
    with pytest.raises(ChecksumError, match=f"expected SHA256 {'0' * 64}, got {actual}"):
        verify_file(path, "fake/data-idx1-ubyte.gz", content=b"other bytes")
    with pytest.raises(ChecksumError, match="data-idx1-ubyte.gz"):
        verify_file(path, "fake/data-idx1-ubyte.gz")  # no content given: only the file hash counts


# --- recall -----------------------------------------------------------------------------------


def test_num_queries_true_is_not_an_int():
    """Mutant: the ``isinstance(num_queries, bool)`` guard dropped (``True`` passed as 1)."""
    with pytest.raises(ValueError, match=r"num_queries must be an int in \[1, num_pairs = 2\], got True"):
        make_assoc_recall(3, 2, 8, torch.Generator(), num_queries=True)


def test_assoc_recall_splits_are_consecutive_slices():
    """Mutant: the val/test boundary at ``n_train + n_test`` instead of ``n_train + n_val``
    (unequal val and test sizes)."""
    data = load_dataset("assoc-recall", num_examples=20, num_pairs=2, vocab_size=8, seed=3,
                        val_fraction=0.1, test_fraction=0.3)
    x, _ = make_assoc_recall(20, 2, 8, torch.Generator().manual_seed(3))
    sizes = data.meta["sizes"]
    assert sizes == {"train": 12, "val": 2, "test": 6}
    assert torch.equal(torch.cat([data.x_train, data.x_val, data.x_test]), x)
    assert [len(data.split(s)[0]) for s in ("train", "val", "test")] == [12, 2, 6]


# --- text ---------------------------------------------------------------------------------------


def test_a_train_fraction_of_one_is_refused():
    """Mutant: ``0 < train_fraction < 1`` -> ``<= 1`` (the val split came out empty)."""
    with pytest.raises(ValueError, match=r"train_fraction must be in \(0, 1\), got 1.0"):
        char_text_data("toy", "abcdef", train_fraction=1.0)


def test_a_one_character_text_is_refused_by_its_length():
    """Mutant: ``len(text) < 2`` -> ``< 1`` (the one-character text was refused later, for an
    empty train split, instead of for its length)."""
    with pytest.raises(ValueError, match="text must have at least 2 characters, got 1"):
        char_text_data("toy", "a", train_fraction=0.9)


def test_the_train_split_is_the_floor_of_the_fraction():
    """Mutant: ``int(f * L)`` -> ``round(f * L)`` (7 characters at f = 0.5: 3 vs 4)."""
    data = char_text_data("toy", "abcdefg", train_fraction=0.5)
    assert data.decode(data.train) == "abc" and data.decode(data.val) == "defg"


def test_train_chars_may_keep_the_whole_train_split(tmp_path):
    """Mutant: ``train_chars > len(train)`` -> ``>=`` (keeping every train character was
    refused)."""
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_text("to be or not to be", encoding="utf-8")
    data = load_dataset("tinyshakespeare", root=tmp_path, verify=False, train_chars=16)  # floor(0.9 * 18)
    assert data.decode(data.train) == "to be or not to " and data.decode(data.val) == "be"
    with pytest.raises(ValueError, match="train_chars must be at most the 16 train characters, got 17"):
        load_dataset("tinyshakespeare", root=tmp_path, verify=False, train_chars=17)


def test_get_batch_sizes_must_be_ints():
    """Bug: a float ``block_size`` or ``batch_size`` (``get_batch("train", 2, 2.5)``) passed the
    range checks and failed inside ``torch.randint`` with "received an invalid combination of
    arguments", naming neither; ``batch_size=True`` failed the same way. NumPy and 0-d tensor
    ints still work."""
    data = char_text_data("toy", "abcdefghij")
    with pytest.raises(TypeError, match=r"block_size must be an int, got 2.5"):
        data.get_batch("train", 2, 2.5)
    with pytest.raises(TypeError, match=r"batch_size must be an int, got 2.0"):
        data.get_batch("train", 2.0, 3)
    with pytest.raises(TypeError, match=r"batch_size must be an int, got True"):
        data.get_batch("train", True, 3)
    x, y = data.get_batch("train", np.int64(2), torch.tensor(3), torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (2, 3)


@pytest.mark.parametrize("ids", [5, None])
def test_decode_of_something_not_a_sequence_names_what_it_expects(ids):
    """Bug: ``decode(5)`` raised Python's bare "'int' object is not iterable" (the error message
    itself called ``list(ids)`` again)."""
    data = TextData("toy", torch.tensor([0, 1]), torch.tensor([1]), 2, ["a", "b"])
    with pytest.raises(TypeError, match="decode expects a 1-D tensor or a sequence of ints, got"):
        data.decode(ids)


@pytest.mark.parametrize("over, message", [
    ({"y": torch.zeros(3, dtype=torch.int64)}, r"expected y with one row per node \(4\), got shape \(3,\)"),
    ({"train_mask": torch.tensor([1, 1, 0, 0])}, r"expected train_mask to be a bool tensor of shape \(4,\), got torch.int64"),
    ({"val_mask": torch.tensor([False, True])}, r"expected val_mask to be a bool tensor of shape \(4,\), got torch.bool of shape \(2,\)"),
])
def test_node_data_checks_labels_and_masks_against_the_nodes(over, message):
    """Bug: ``NodeData`` checked only ``x``; an int 0/1 mask indexed nodes 0 and 1 instead of selecting,
    and labels or masks of another length failed (or broadcast) deep inside a training step."""
    with pytest.raises(ValueError, match=message):
        NodeData("toy", _node_graph(**over), num_classes=2, num_features=3)
