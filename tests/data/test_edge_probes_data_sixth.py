"""Edge probes, sixth pass: CSBM, associative recall, MNIST-1D and character text (bad parameters, hostile
vocabularies and token streams), plus checks of the generators against their definitions."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from diffusionformer.data.base import TextData
from diffusionformer.data.csbm import csbm_graph, edge_homophily
from diffusionformer.data.recall import make_assoc_recall
from diffusionformer.data.text import char_text_data


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_bug_csbm_huge_avg_degree_is_named():
    """Bug: a finite avg_degree near float's top (1e308) made N * avg_degree / 2 infinite, and round() raised a bare
    "OverflowError: cannot convert float infinity to integer" instead of the avg_degree range error."""
    with pytest.raises(ValueError, match=r"avg_degree=1e\+308 asks for more distinct edges.*at most num_nodes - 1 = 9"):
        csbm_graph(10, 2, 1e308, 0.5, 4, 1.0, _gen())


def test_bug_char_text_data_fraction_train_fraction():
    """Bug: a fractions.Fraction train_fraction passed the numbers.Real check and split the text, then the meta's
    f"{train_fraction:.0%}" raised "TypeError: unsupported format string passed to Fraction.__format__" (3.11)."""
    data = char_text_data("toy", "abcd", train_fraction=Fraction(1, 2))
    assert data.train.tolist() == [0, 1] and data.val.tolist() == [2, 3]
    assert data.meta["split"] == "first 50% train, rest val"


def test_bug_mnist1d_fraction_val_fraction():
    """Bug: load_mnist1d with a fractions.Fraction val_fraction generated the data and split it, then the meta's
    f"{val_fraction:g}" raised "TypeError: unsupported format string passed to Fraction.__format__" (3.11)."""
    pytest.importorskip("mnist1d")
    from diffusionformer.data.sequences import load_mnist1d

    data = load_mnist1d(val_fraction=Fraction(1, 4), num_samples=20)
    assert "val = seeded 0.25 of train" in data.meta["split"]
    assert data.meta["sizes"] == {"train": 12, "val": 4, "test": 4}


@pytest.mark.parametrize("split, ids, got", [("train", [0, 7, 1], r"\[0, 7\]"), ("val", [1, -1], r"\[-1, 1\]")])
def test_bug_text_data_token_ids_outside_vocab(split, ids, got):
    """Bug: TextData accepted token ids outside [0, vocab_size) (7 with a vocabulary of 2, or -1); get_batch served
    them and the model's embedding failed at the first step (a device-side assert on a GPU), and decode of a batch
    raised about ids the container itself held."""
    streams = {"train": torch.tensor([0, 1, 0]), "val": torch.tensor([1, 0])}
    streams[split] = torch.tensor(ids)
    with pytest.raises(ValueError, match=rf"{split}: token ids must lie in \[0, 2\) \(vocab_size\), got range {got}"):
        TextData("toy", streams["train"], streams["val"], 2, ["a", "b"])


@pytest.mark.parametrize("itos", [["a", "a"], ["a", 1]])
def test_bug_text_data_itos_not_distinct_strings(itos):
    """Bug: TextData accepted a vocabulary with a repeated character (encode mapped it to its last id only, so the
    streams' first id was never produced again: decode then encode changed the tokens) or a non-string entry
    (decode of valid ids said "expects token ids in [0, 2)")."""
    with pytest.raises(ValueError, match=r"itos must hold distinct strings"):
        TextData("toy", torch.tensor([0, 1, 0]), torch.tensor([1, 0]), 2, itos)


def test_text_data_round_trips_every_character_of_an_odd_corpus():
    """Lone surrogates, NUL, CR/LF, a BOM and astral characters are tokens like any other, and come back whole."""
    text = "a\ud800b\U0001F600\r\n\x00\ufeffé" * 3
    data = char_text_data("odd", text)
    assert data.decode(torch.cat([data.train, data.val])) == text
    assert data.decode(data.encode(text)) == text and data.vocab_size == len(set(text))


def test_get_batch_windows_stay_inside_the_split_and_reach_both_ends():
    """Offsets span exactly [0, L - T - 1]: the first and the last window are both drawn, none runs past the end."""
    text = "".join(chr(65 + i) for i in range(26))
    data = char_text_data("abc", text, train_fraction=0.5)  # train = ids 0..12
    x, y = data.get_batch("train", 400, 5, _gen(0))
    starts = set(x[:, 0].tolist())
    assert starts == set(range(0, 13 - 5))
    assert torch.equal(y, x + 1) and int(y.max()) == 12


def test_csbm_graph_matches_its_definition():
    """Balanced classes, a simple symmetric graph of round(N d / 2) edges, edge homophily near h (binomial), class
    means mu apart, unit noise, and the same graph for the same seed."""
    N, C, d, h, D, mu = 1200, 3, 12.0, 0.25, 6, 3.0
    x, ei, y = csbm_graph(N, C, d, h, D, mu, _gen(5))
    assert torch.bincount(y, minlength=C).tolist() == [N // C] * C
    M = round(N * d / 2)
    assert ei.shape == (2, 2 * M) and not bool((ei[0] == ei[1]).any())
    keys = ei[0] * N + ei[1]
    assert torch.unique(keys).numel() == 2 * M
    assert torch.equal(torch.sort(ei[1] * N + ei[0]).values, keys)  # sorted keys: symmetric and sorted
    assert abs(edge_homophily(ei, y) - h) < 4 * (h * (1 - h) / M) ** 0.5
    x64 = x.double()
    means = torch.stack([x64[y == c].mean(0) for c in range(C)])
    dist = torch.cdist(means, means)[~torch.eye(C, dtype=torch.bool)]
    assert torch.allclose(dist, torch.full_like(dist, mu), atol=0.35)
    assert abs(float((x64 - means[y]).var()) - 1.0) < 0.1
    x2, ei2, y2 = csbm_graph(N, C, d, h, D, mu, _gen(5))
    assert torch.equal(x, x2) and torch.equal(ei, ei2) and torch.equal(y, y2)


def test_multi_query_recall_answers_every_query_from_its_own_sequence():
    """Keys distinct and in the lower half, values in the upper half, Q distinct queried keys, each target the value
    its key was paired with, -100 elsewhere."""
    N, P, V, Q = 300, 6, 30, 4
    x, y = make_assoc_recall(N, P, V, _gen(2), num_queries=Q)
    keys, values, queries = x[:, 0 : 2 * P : 2], x[:, 1 : 2 * P : 2], x[:, 2 * P :]
    assert int(keys.max()) < V // 2 <= int(values.min()) and int(values.max()) < V
    assert bool((y[:, : 2 * P] == -100).all())
    for n in range(N):
        lookup = dict(zip(keys[n].tolist(), values[n].tolist()))
        assert len(lookup) == P and len(set(queries[n].tolist())) == Q
        assert [lookup[q] for q in queries[n].tolist()] == y[n, 2 * P :].tolist()
