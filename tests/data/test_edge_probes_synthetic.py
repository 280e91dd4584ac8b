"""Edge probes of the synthetic and text data: CSBM, associative recall, character corpora and the splits they use.

Independent references: the generators' documented models checked statistically with fixed seeds (CSBM pair
probabilities, per-class intra-edge shares, feature means and noise; recall's vocabulary halves and answers),
and hand-computed expectations for the edge cases.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from diffusionformer.data import IGNORE_INDEX, csbm_graph, edge_homophily, load_dataset, make_assoc_recall
from diffusionformer.data.splits import random_split, split_sizes
from diffusionformer.data.text import char_text_data


# ---------------------------------------------------------------------------------------------------------------
# bugs


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_bug_edge_homophily_uint8_edge_index(dtype):
    """Bug: edge_homophily with a uint8 edge_index (accepted as integer node ids) indexed y with it as a boolean
    mask: for E == N it returned a wrong ratio (0.5 instead of 1/3 below, with only a deprecation warning), for
    E != N a shape error; int8 and int16 ids (also accepted) failed in indexing ("tensors used as indices must be
    long, int, byte or bool tensors"). Every integer dtype now gives the int64 answer."""
    y = torch.tensor([0, 0, 1])
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    assert edge_homophily(edge_index.to(dtype), y) == edge_homophily(edge_index, y) == pytest.approx(1 / 3)
    longer = torch.tensor([[0, 1, 2, 1], [1, 0, 0, 2]])  # E = 4 != N = 3
    assert edge_homophily(longer.to(dtype), y) == pytest.approx(0.5)


def test_bug_assoc_recall_empty_train_split():
    """Bug: load_dataset("assoc-recall", num_examples=10, val_fraction=0.5, test_fraction=0.49) loaded with an
    empty train split (5 + 5 held out of 10), and the run failed at its first step in torch.randint ("random_
    expects 'from' to be less than 'to'"). The loader now refuses it naming both fractions (as NodeData does for
    the CSBM's masks)."""
    with pytest.raises(ValueError, match=r"assoc-recall: val_fraction=0\.5 and test_fraction=0\.49 leave the train "
                                         r"split empty \(5 \+ 5 of 10 examples held out\)"):
        load_dataset("assoc-recall", num_examples=10, num_pairs=2, vocab_size=8, val_fraction=0.5, test_fraction=0.49)
    data = load_dataset("assoc-recall", num_examples=10, num_pairs=2, vocab_size=8, val_fraction=0.5,
                        test_fraction=0.4)
    assert data.meta["sizes"] == {"train": 1, "val": 5, "test": 4} and data.x_train.shape == (1, 5)


@pytest.mark.parametrize("bad", ["0.1", None, [0.1], False, True])
def test_bug_split_sizes_non_number_fraction(bad):
    """Bug: split_sizes (and the csbm and assoc-recall loaders, called directly) met a string or None fraction
    with a bare "'<=' not supported between instances of 'float' and 'str'" TypeError (for the CSBM after the
    whole graph was drawn), and took val_fraction=False as 0.0. Each is now a ValueError naming the option."""
    with pytest.raises(ValueError, match=r"val_fraction must be in \[0, 1\) \(a number\), got "):
        split_sizes(10, bad, 0.2)
    with pytest.raises(ValueError, match=r"test_fraction must be in \[0, 1\) \(a number\), got "):
        random_split(10, 0.2, bad, seed=0)
    from diffusionformer.data.recall import load_assoc_recall

    with pytest.raises(ValueError, match=r"val_fraction must be in \[0, 1\) \(a number\)"):
        load_assoc_recall(num_examples=20, val_fraction=bad)
    # numpy numbers and fractions stay numbers
    from fractions import Fraction

    assert split_sizes(10, np.float32(0.2), Fraction(1, 5)) == (6, 2, 2)


def test_bug_text_decode_two_dimensional_numpy_array():
    """Bug: TextData.decode of a (1, T) NumPy array (a generated batch's ``.numpy()``) failed with numpy's "The
    truth value of an array with more than one element is ambiguous"; a 2-D tensor was already named. It is now
    refused with its shape, like the tensor; 1-D arrays still decode."""
    data = char_text_data("toy", "hello world")
    ids = data.encode("hello")
    with pytest.raises(ValueError, match=r"decode expects a 1-D sequence of token ids, got shape \(1, 5\)"):
        data.decode(ids.numpy()[None])
    with pytest.raises(ValueError, match=r"decode expects a 1-D tensor, got shape \(1, 5\)"):
        data.decode(ids[None])
    assert data.decode(ids.numpy()) == data.decode(ids.tolist()) == "hello"


@pytest.mark.parametrize("bad, match", [
    (b"he", r"encode expects a str, got bytes \(decode it first"),
    (bytearray(b"he"), r"encode expects a str, got bytearray"),
    (5, r"encode expects a str, got int$"),
    (None, r"encode expects a str, got NoneType$"),
])
def test_bug_text_encode_non_str(bad, match):
    """Bug: TextData.encode(b"he") said "character 104 is not in the 'toy' vocabulary" (bytes iterate as ints, which
    are no characters), encode(5) raised a bare "'int' object is not iterable". Both now name the type."""
    data = char_text_data("toy", "hello world")
    with pytest.raises(TypeError, match=match):
        data.encode(bad)


# ---------------------------------------------------------------------------------------------------------------
# CSBM against its documented model


def test_csbm_pair_probabilities_match_the_fixed_edge_count_model():
    """Balanced classes: each intra pair is an edge with p_in = h M / intra_pool, each inter pair with
    p_out = (1 - h) M / inter_pool; measured over 20 graphs of 200 nodes against the formula."""
    N, C, d, h = 200, 4, 8.0, 0.7
    M = round(N * d / 2)
    counts = N // C
    intra_pool = C * counts * (counts - 1) // 2
    inter_pool = N * (N - 1) // 2 - intra_pool
    p_in, p_out = h * M / intra_pool, (1 - h) * M / inter_pool
    n_in = n_out = 0
    g = torch.Generator().manual_seed(7)
    for _ in range(20):
        _, ei, y = csbm_graph(N, C, d, h, 4, 1.0, g)
        same = y[ei[0]] == y[ei[1]]
        n_in += int(same.sum()) // 2
        n_out += int((~same).sum()) // 2
    # binomial std of the 20 * M = 16000 edges' split: about 58; 4 sigma in relative terms is under 3%
    assert n_in / (20 * intra_pool) == pytest.approx(p_in, rel=0.03)
    assert n_out / (20 * inter_pool) == pytest.approx(p_out, rel=0.03)
    assert n_in + n_out == 20 * M  # the edge count is fixed, not random


def test_csbm_unequal_classes_share_intra_edges_by_class_size_and_keep_feature_noise_unit():
    """Intra-class edges start at a uniformly random node, so class c takes about n_c / N of them (N = 3001 in 3
    classes of 1001, 1000, 1000); features are class mean + N(0, I): residual variance 1, the three means mu apart."""
    N, C, D, mu = 3001, 3, 6, 2.0
    x, ei, y = csbm_graph(N, C, 10.0, 0.5, D, mu, torch.Generator().manual_seed(3))
    assert y.bincount().tolist() == [1001, 1000, 1000]
    src, dst = ei
    assert bool((src != dst).all())
    same = y[src] == y[dst]
    per_class = torch.bincount(y[src[same]], minlength=C).double() / 2
    share = per_class / per_class.sum()
    assert torch.allclose(share, y.bincount().double() / N, atol=0.03)
    means = torch.stack([x[y == c].double().mean(0) for c in range(C)])
    for a, b in ((0, 1), (0, 2), (1, 2)):
        assert float((means[a] - means[b]).norm()) == pytest.approx(mu, abs=0.2)
    residual = x.double() - means[y]
    assert float(residual.var()) == pytest.approx(1.0, abs=0.05)
    assert x.dtype == torch.float32 and ei.dtype == torch.int64 and y.dtype == torch.int64


def test_csbm_and_recall_leave_global_randomness_alone():
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    states = torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()
    a = load_dataset("csbm", num_nodes=60, seed=3)
    b = load_dataset("assoc-recall", num_examples=40, num_pairs=3, vocab_size=16, seed=3)
    assert torch.equal(states[0], torch.get_rng_state())
    assert (states[1] == np.random.get_state()[1]).all() and states[2] == random.getstate()
    torch.manual_seed(99)  # another global state: the same data
    assert torch.equal(load_dataset("csbm", num_nodes=60, seed=3).data.edge_index, a.data.edge_index)
    assert torch.equal(load_dataset("assoc-recall", num_examples=40, num_pairs=3, vocab_size=16, seed=3).x_val,
                       b.x_val)


def test_csbm_smallest_graph_and_too_few_nodes():
    x, ei, y = csbm_graph(4, 2, 1.0, 0.5, 2, 1.0, torch.Generator().manual_seed(0))
    assert x.shape == (4, 2) and ei.shape == (2, 4) and y.bincount().tolist() == [2, 2]
    with pytest.raises(ValueError, match=r"num_nodes must be >= 2 \* num_classes = 8, got 7"):
        csbm_graph(7, 4, 1.0, 0.5, 4, 1.0, torch.Generator())
    with pytest.raises(ValueError, match=r"homophily must be in \[0, 1\], got -0\.1"):
        csbm_graph(8, 2, 1.0, -0.1, 4, 1.0, torch.Generator())


# ---------------------------------------------------------------------------------------------------------------
# associative recall and text


@pytest.mark.parametrize("V", [5, 9])
def test_recall_odd_vocab_halves_and_uniform_values(V):
    """Keys fill [0, V // 2), values [V // 2, V) (one more value than keys for an odd V), each value about equally
    often; queries are earlier keys and the only supervised positions are the queries'."""
    P, Q = 2, 2
    x, y = make_assoc_recall(3000, P, V, torch.Generator().manual_seed(5), num_queries=Q)
    keys, values = x[:, 0 : 2 * P : 2], x[:, 1 : 2 * P : 2]
    assert set(keys.unique().tolist()) == set(range(V // 2))
    assert set(values.unique().tolist()) == set(range(V // 2, V))
    freq = values.flatten().bincount(minlength=V)[V // 2 :].double() / values.numel()
    assert torch.allclose(freq, torch.full_like(freq, 1 / (V - V // 2)), atol=0.02)
    assert bool((y[:, : 2 * P] == IGNORE_INDEX).all()) and bool((y[:, 2 * P :] >= V // 2).all())
    hit = x[:, 2 * P :, None] == keys[:, None, :]  # (N, Q, P)
    assert bool((hit.sum(-1) == 1).all())
    assert torch.equal(y[:, 2 * P :], values.gather(1, hit.long().argmax(-1)))


def test_text_round_trip_and_split_sizes_sum():
    text = "ab\u00e9\n\tc\U0001f600" * 7
    data = char_text_data("toy", text, train_fraction=0.6)
    assert data.decode(torch.cat([data.train, data.val])) == text
    assert data.train.numel() == math.floor(0.6 * len(text)) and data.train.numel() + data.val.numel() == len(text)
    assert data.decode([]) == "" and data.encode("").shape == (0,)
