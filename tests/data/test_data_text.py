"""TextData behaviour and the tinyshakespeare reader on small generated files."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.data import ChecksumError, CorruptDataError, DataRootError, load_dataset
from diffusionformer.data.text import char_text_data

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20


@pytest.fixture()
def shakespeare_root(tmp_path):
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_text(TEXT, encoding="utf-8")
    return tmp_path


def test_encode_decode_round_trip():
    data = char_text_data("toy", TEXT)
    ids = data.encode("hear me speak")
    assert ids.dtype == torch.int64 and ids.dim() == 1
    assert data.decode(ids) == "hear me speak"
    assert data.decode(ids.tolist()) == "hear me speak"
    assert data.decode(torch.cat([data.train, data.val])) == TEXT
    assert data.itos == sorted(set(TEXT)) and data.stoi[data.itos[3]] == 3


def test_encode_unknown_character_and_bad_ids_raise():
    data = char_text_data("toy", "abc")
    with pytest.raises(ValueError, match="character 'z' is not in the 'toy' vocabulary"):
        data.encode("abz")
    with pytest.raises(ValueError, match=r"token ids in \[0, 3\)"):
        data.decode([0, 7])
    with pytest.raises(ValueError, match="1-D tensor"):
        data.decode(torch.zeros(2, 2, dtype=torch.long))


def test_contiguous_90_10_split():
    data = char_text_data("toy", TEXT)
    n = int(0.9 * len(TEXT))
    assert data.decode(data.train) == TEXT[:n] and data.decode(data.val) == TEXT[n:]
    assert data.meta["sizes"] == {"train": n, "val": len(TEXT) - n}


def test_get_batch_targets_are_inputs_shifted_by_one():
    data = char_text_data("toy", TEXT)
    x, y = data.get_batch("train", 16, 10, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (16, 10) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    text_train = data.decode(data.train)
    for row_x, row_y in zip(x, y):
        window = data.decode(row_x) + data.decode(row_y)[-1]
        assert window in text_train  # a real contiguous window of the split


def test_get_batch_is_reproducible_with_a_generator():
    data = char_text_data("toy", TEXT)
    a = data.get_batch("val", 4, 8, torch.Generator().manual_seed(1))
    b = data.get_batch("val", 4, 8, torch.Generator().manual_seed(1))
    c = data.get_batch("val", 4, 8, torch.Generator().manual_seed(2))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_split_that_would_be_empty_is_refused():
    """Bug: ``char_text_data("t", "abcde", train_fraction=0.1)`` gave an empty train split, and
    the error came only at ``get_batch`` as "block_size must be in [1, -1]"."""
    with pytest.raises(ValueError, match="leaves the train split empty"):
        char_text_data("toy", "abcde", train_fraction=0.1)
    data = char_text_data("toy", "ab", train_fraction=0.5)  # the smallest legal corpus
    assert data.train.tolist() == [0] and data.val.tolist() == [1]


def test_get_batch_reaches_the_last_token():
    data = char_text_data("toy", "abcdefghij", train_fraction=0.5)  # train = "abcde"
    x, y = data.get_batch("train", 64, 4, torch.Generator().manual_seed(0))
    assert data.decode(y[0]) == "bcde" and torch.equal(x, x[:1].expand(64, 4))


def test_get_batch_rejects_bad_arguments():
    data = char_text_data("toy", TEXT)
    with pytest.raises(ValueError, match="block_size must be in"):
        data.get_batch("val", 2, len(data.val))
    with pytest.raises(ValueError, match="split must be one of"):
        data.get_batch("test", 2, 4)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        data.get_batch("train", 0, 4)


def test_tinyshakespeare_reader_on_a_generated_file(shakespeare_root):
    data = load_dataset("tinyshakespeare", root=shakespeare_root, verify=False)
    assert data.kind == "text" and data.vocab_size == len(set(TEXT))
    assert data.decode(data.train) + data.decode(data.val) == TEXT


def test_tinyshakespeare_checksum_mismatch_is_reported_as_corrupt(shakespeare_root):
    with pytest.raises(ChecksumError) as info:
        load_dataset("tinyshakespeare", root=shakespeare_root)
    msg = str(info.value)
    assert "corrupt" in msg and "input.txt" in msg
    assert "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed" in msg  # expected
    import hashlib

    assert hashlib.sha256(TEXT.encode()).hexdigest() in msg  # actual


def test_tinyshakespeare_missing_file_and_bad_encoding(tmp_path):
    with pytest.raises(DataRootError, match="tinyshakespeare/input.txt"):
        load_dataset("tinyshakespeare", root=tmp_path)
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_bytes(b"abc\xff\xfe")
    with pytest.raises(CorruptDataError, match="not valid UTF-8"):
        load_dataset("tinyshakespeare", root=tmp_path, verify=False)


def test_tinyshakespeare_train_chars_keeps_the_start_of_train_and_all_of_val(shakespeare_root):
    full = load_dataset("tinyshakespeare", root=shakespeare_root, verify=False)
    cut = load_dataset("tinyshakespeare", root=shakespeare_root, verify=False, train_chars=100)
    n = int(0.9 * len(TEXT))
    assert cut.decode(cut.train) == TEXT[:100]
    assert cut.decode(cut.val) == TEXT[n:] == full.decode(full.val)
    assert cut.itos == full.itos  # vocabulary of the whole corpus
    assert cut.meta["sizes"] == {"train": 100, "val": len(TEXT) - n}
    for bad in (1, n + 1, 2.5, True):
        with pytest.raises(ValueError, match="train_chars"):
            load_dataset("tinyshakespeare", root=shakespeare_root, verify=False, train_chars=bad)
