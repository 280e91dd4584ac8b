"""Associative recall: targets are right by construction, splits and determinism."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.data import IGNORE_INDEX, SequenceTaskData, load_dataset, make_assoc_recall


def test_answer_is_the_value_paired_with_the_query_key():
    P, V = 6, 20
    x, y = make_assoc_recall(500, P, V, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (500, 2 * P + 1) and x.dtype == y.dtype == torch.int64
    for inputs, targets in zip(x.tolist(), y.tolist()):
        keys, values, query = inputs[0:-1:2], inputs[1::2], inputs[-1]
        assert len(set(keys)) == P, "keys are distinct within a sequence"
        assert all(0 <= k < V // 2 for k in keys) and all(V // 2 <= v < V for v in values)
        assert query in keys
        assert targets[-1] == values[keys.index(query)]
        assert targets[:-1] == [IGNORE_INDEX] * (2 * P)


def test_every_pair_position_is_queried():
    x, _ = make_assoc_recall(2000, 4, 16, torch.Generator().manual_seed(1))
    position = (x[:, 0:-1:2] == x[:, -1:]).long().argmax(dim=1)
    assert position.bincount(minlength=4).min() > 400  # about 500 each


def test_single_query_data_is_what_the_study_was_trained_on():
    # checksums of the draws made before num_queries existed (seeded generator 0, P = 8, V = 64)
    x, y = make_assoc_recall(1000, 8, 64, torch.Generator().manual_seed(0))
    assert int((x * torch.arange(1, 18)).sum()) == 4684908 and int(y[:, -1].sum()) == 47920


def test_multi_query_targets_every_query_with_its_value():
    P, Q, V = 6, 4, 20
    x, y = make_assoc_recall(300, P, V, torch.Generator().manual_seed(3), num_queries=Q)
    assert x.shape == y.shape == (300, 2 * P + Q)
    for inputs, targets in zip(x.tolist(), y.tolist()):
        keys, values, queries = inputs[0 : 2 * P : 2], inputs[1 : 2 * P : 2], inputs[2 * P :]
        assert len(set(queries)) == Q and set(queries) <= set(keys)
        assert targets[2 * P :] == [values[keys.index(q)] for q in queries]
        assert targets[: 2 * P] == [IGNORE_INDEX] * (2 * P)
    data = load_dataset("assoc-recall", num_examples=50, num_pairs=3, vocab_size=16, num_queries=3)
    assert data.seq_len == 9 and data.meta["num_queries"] == 3
    with pytest.raises(ValueError, match=r"num_queries must be an int in \[1, num_pairs = 3\]"):
        make_assoc_recall(5, 3, 16, torch.Generator(), num_queries=4)


def test_loss_only_sees_the_answer():
    x, y = make_assoc_recall(8, 3, 12, torch.Generator().manual_seed(2))
    logits = torch.zeros(8, 7, 12)
    logits[torch.arange(8), -1, y[:, -1]] = 50.0  # right at the answer, uniform elsewhere
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    assert float(loss) < 1e-6


def test_load_assoc_recall_splits_and_seed():
    data = load_dataset("assoc-recall", num_examples=100, num_pairs=3, vocab_size=16, seed=5)
    assert isinstance(data, SequenceTaskData) and data.kind == "sequence_lm"
    assert data.seq_len == 7 and data.vocab_size == 16 and data.ignore_index == -100
    assert [len(data.split(s)[0]) for s in ("train", "val", "test")] == [80, 10, 10]
    same = load_dataset("assoc-recall", num_examples=100, num_pairs=3, vocab_size=16, seed=5)
    other = load_dataset("assoc-recall", num_examples=100, num_pairs=3, vocab_size=16, seed=6)
    assert torch.equal(data.x_train, same.x_train) and torch.equal(data.y_test, same.y_test)
    assert not torch.equal(data.x_train, other.x_train)
    assert repr(data) == (
        "SequenceTaskData(name='assoc-recall', train=80, val=10, test=10, seq_len=7, vocab_size=16)"
    )


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(num_pairs=9, vocab_size=16), "num_pairs must be in"),
        (dict(num_pairs=0), "num_pairs must be in"),
        (dict(vocab_size=3, num_pairs=1), "vocab_size must be >= 4"),
        (dict(num_examples=0), "num_examples must be >= 1"),
    ],
)
def test_bad_options_raise(kw, match):
    opts = dict(num_examples=10, num_pairs=2, vocab_size=8) | kw
    with pytest.raises(ValueError, match=match):
        make_assoc_recall(**opts, generator=torch.Generator())
