"""Edge probes of DINO's numerics: ``knn_classify`` against an explicit float64 weighted vote (DINO's
``eval_knn.py``: top-k cosine neighbours, weights ``exp(s / T)``, highest class score, ties to the smaller
class), on float64 features, exact ties, ``k`` above the bank size and non-finite features.

The loss, centre, schedules and the task's update order already have float64 references in
``tests/ssl/test_ssl_dino.py``, ``tests/ssl/test_edge_probes_ssl_testing.py`` and
``tests/models/test_mutation_kills_dino_tasks.py``; they are not repeated here.
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.models.dino import knn_classify


def _vote64(bank, labels, queries, num_classes, k, temperature):
    """The weighted k-NN vote in float64 Python arithmetic (ranks by cosine; ties: the smaller class)."""
    b = [[float(v) for v in row] for row in bank.double()]
    y = [int(v) for v in labels]
    out = []
    for q in queries.double().tolist():
        qn = math.sqrt(sum(v * v for v in q))
        sims = [sum(a * c for a, c in zip(q, row)) / (qn * math.sqrt(sum(c * c for c in row))) for row in b]
        top = sorted(range(len(b)), key=lambda i: -sims[i])[: min(k, len(b))]
        score = [0.0] * num_classes
        for i in top:
            score[y[i]] += math.exp(sims[i] / temperature)
        out.append(max(range(num_classes), key=lambda c: (score[c], -c)))
    return out


def test_bug_knn_float64_features_keep_float64_cosines():
    """Bug: knn_classify cast float64 features to float32, where the cosines of nearly parallel features
    (angles below ~3e-4 rad) round to the same value; the nearest neighbour was then picked among ties, and
    each of the 20 queries got another class than the float64 vote gives."""
    t = torch.rand(20, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 1e-3
    bank = torch.stack([torch.ones(20, dtype=torch.float64), t], dim=1)
    labels = torch.arange(20)
    queries = torch.stack([torch.ones(20, dtype=torch.float64), t + 1e-6], dim=1)  # each next to its bank point
    want = _vote64(bank, labels, queries, 20, 1, 0.07)
    assert knn_classify(bank, labels, queries, 20, k=1).tolist() == want
    # one float64 side is enough: a float32 query is scored against the float64 bank in float64
    q32 = queries.float()
    assert knn_classify(bank, labels, q32, 20, k=1).tolist() == _vote64(bank, labels, q32, 20, 1, 0.07)
    # float32 features are still scored in float32 (the output is the same int64 classes)
    assert knn_classify(bank.float(), labels, queries.float(), 20, k=3).dtype == torch.int64


@pytest.mark.parametrize("where", ["bank", "queries"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_bug_knn_refuses_non_finite_features(where, value):
    """Bug: a NaN (or an inf, which normalises to NaN) feature made every similarity of its row NaN, and
    the NaN votes gave class 0 (or a NaN neighbour's class) without a word: a silent prediction."""
    bank = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    labels = torch.tensor([1, 2, 2])
    queries = torch.tensor([[1.0, 0.1], [0.1, 1.0]])
    (bank if where == "bank" else queries)[1, 0] = value
    with pytest.raises(ValueError, match=rf"^knn_classify: {where} holds non-finite features \(NaN or inf\)$"):
        knn_classify(bank, labels, queries, 3, k=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_knn_ties_and_k_above_the_bank_match_the_float64_vote(dtype):
    """Exact score ties (duplicate bank points of different classes) go to the smaller class, ``k`` above
    the bank size lets every bank point vote, and chunking does not change the answer."""
    a, b = [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]
    bank = torch.tensor([a, a, b, b, [0.0, 0.0, 1.0]], dtype=dtype)
    labels = torch.tensor([2, 1, 1, 2, 0])
    queries = torch.tensor([[1.0, 0.2, 0.0], [0.2, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=dtype)
    for k, temperature in ((2, 0.07), (4, 0.07), (5, 0.5), (50, 0.07), (50, 10.0)):
        want = _vote64(bank, labels, queries, 3, k, temperature)
        got = knn_classify(bank, labels, queries, 3, k=k, temperature=temperature, chunk_size=1)
        assert got.tolist() == want, (k, temperature)
    # the tied pairs: class 1 wins over 2 for the first two queries with k=2 (smaller index)
    assert knn_classify(bank, labels, queries[:2], 3, k=2).tolist() == [1, 1]
    # random data, k above the bank size, several chunks
    g = torch.Generator().manual_seed(3)
    bank_r = torch.randn(7, 4, generator=g, dtype=dtype)
    labels_r = torch.randint(0, 3, (7,), generator=g)
    q_r = torch.randn(11, 4, generator=g, dtype=dtype)
    assert knn_classify(bank_r, labels_r, q_r, 3, k=9, temperature=0.05, chunk_size=4).tolist() == \
        _vote64(bank_r, labels_r, q_r, 3, 9, 0.05)


@pytest.mark.parametrize("which", ["student", "teacher"])
def test_bug_dino_loss_refuses_an_infinite_temperature(which):
    """Bug: dino_loss and center_sharpen took an infinite temperature (DINOConfig refuses one): tau_s = inf
    made the student's softmax uniform (the loss log K whatever the logits, zero gradient), tau_t = inf made
    every teacher target uniform, silently."""
    from diffusionformer.models.dino import center_sharpen, dino_loss

    g = torch.Generator().manual_seed(0)
    s = torch.randn(3, 2, 4, generator=g, dtype=torch.float64)
    t = torch.randn(2, 2, 4, generator=g, dtype=torch.float64)
    c = torch.zeros(4, dtype=torch.float64)
    temps = {"student": (math.inf, 0.04), "teacher": (0.1, torch.tensor(math.inf))}[which]
    name = {"student": "student_temp", "teacher": "temperature"}[which]
    with pytest.raises(ValueError, match=rf"^{name} must be finite, got (inf|tensor\(inf\))$"):
        dino_loss(s, t, c, *temps)
    with pytest.raises(ValueError, match=r"^temperature must be finite, got inf$"):
        center_sharpen(t, c, math.inf)
    assert math.isfinite(float(dino_loss(s, t, c, 1e6, 1e6)))  # large finite temperatures still work
