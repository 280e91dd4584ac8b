"""Edge-case probes (round 42): degenerate comparisons in ``experiments.stats``, ``models.dino.knn_classify`` on
zero-width features, ``analysis.capture.capture_dataset``'s batch count.

Found and fixed (tests named ``test_bug_...``):

- ``stats.welch_t`` / ``paired_t``: for all-equal samples (every difference zero) they returned ``None`` while
  ``welch_difference`` / ``paired_difference`` (and the module docstring) give ``t = 0``, ``p = 1``; a table built
  from the bare t (``difference_t``, analysis cells) showed "no t" where the Difference showed "no difference".
  Both now give ``0.0`` there; for equal non-zero differences all four keep ``t = None`` (and ``p = None``, which
  ``holm`` / ``benjamini_hochberg`` count as ``p = 1``). scipy (``ttest_ind(equal_var=False)``, ``ttest_rel``) gives
  NaN for the 0/0 and ``±inf``, ``p = 0`` for the constant non-zero difference; the library documents its own
  never-NaN convention instead, and the tests check the explicit cases against that documentation.
- ``dino.knn_classify``: features of width ``D = 0`` were accepted; every cosine was 0 and the "neighbours" were
  whichever ``topk`` returned among ties (a prediction with no error). They are now refused.

Documented, not changed: ``capture_dataset``'s ``extra["num_batches"]`` counts the batches run through the model; a
drawn batch of 0 sequences is skipped and not counted (now said in ``LayerCapture``'s docstring, pinned below). An
all-zero feature vector in ``knn_classify`` has cosine 0 with everything, as sklearn's cosine metric (documented).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

scipy_stats = pytest.importorskip("scipy.stats")

from diffusionformer.experiments.stats import (difference_t, holm, paired_difference, paired_t,  # noqa: E402
                                               welch_difference, welch_t)
from diffusionformer.models.dino import knn_classify  # noqa: E402


def _scipy(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def test_bug_bare_t_of_all_equal_samples_agrees_with_the_difference():
    """Bug: ``welch_t([1, 1, 1], [1, 1, 1])`` and ``paired_t`` of all-zero differences were ``None`` while
    ``welch_difference`` / ``paired_difference`` of the same data gave ``t = 0, p = 1`` (the documented convention;
    scipy gives NaN for this 0/0, checked here so a change of either side is seen)."""
    a = [0.5, 0.5, 0.5]  # exact in binary: scipy's spread is exactly 0 (for 0.7 it is a rounding residue, and t = 0)
    ref_w = _scipy(scipy_stats.ttest_ind, a, a, equal_var=False)
    ref_p = _scipy(scipy_stats.ttest_rel, a, a)
    assert math.isnan(ref_w.statistic) and math.isnan(ref_p.statistic)  # scipy: 0/0
    w = welch_difference(a, a)
    assert (w.t, w.p) == (0.0, 1.0)
    assert welch_t(a, a) == w.t == 0.0
    seeds = dict(enumerate(a))
    p = paired_difference(seeds, seeds)
    assert (p.t, p.p) == (0.0, 1.0)
    assert paired_t(seeds, seeds) == p.t == 0.0
    # differences that are all zero between different settings (pairs vary, differences do not)
    x, y = {0: 0.5, 1: 0.6, 2: 0.9}, {0: 0.5, 1: 0.6, 2: 0.9}
    assert paired_t(x, y) == paired_difference(x, y).t == 0.0
    row = {"values": a, "by_seed": seeds}
    assert difference_t(row, row, "values", paired=True) == difference_t(row, row, "values", paired=False) == 0.0


def test_pins_constant_nonzero_difference_has_no_t_anywhere():
    """Pin: equal non-zero differences (no spread, a real difference): t and p are ``None`` in all four functions
    (scipy: ``±inf`` with ``p = 0``), and ``holm`` counts the ``None`` p as 1 (never significant, no crash)."""
    a, b = [2.0, 2.0, 2.0], [1.0, 1.0, 1.0]
    ref = _scipy(scipy_stats.ttest_rel, a, b)
    assert ref.statistic == math.inf and ref.pvalue == 0.0
    sa, sb = dict(enumerate(a)), dict(enumerate(b))
    for d in (welch_difference(a, b), paired_difference(sa, sb)):
        assert d.t is None and d.p is None and d.mean == pytest.approx(1.0)
    assert welch_t(a, b) is None and paired_t(sa, sb) is None
    q = paired_difference(sa, {0: 0.0, 1: 1.1, 2: 0.5}).p
    adjusted = holm([paired_difference(sa, sb).p, welch_difference(a, a).p, q])
    assert adjusted[0] is None and adjusted[1] == 1.0 and adjusted[2] == pytest.approx(min(1.0, 3 * q))


def test_bug_knn_classify_refuses_zero_width_features():
    """Bug: ``knn_classify`` of ``(N, 0)`` features returned predictions (every cosine 0, neighbours picked among
    ties by ``topk``'s order) with no error; sklearn's cosine KNN refuses 0 features too."""
    with pytest.raises(ValueError, match="width D >= 1"):
        knn_classify(torch.zeros(5, 0), torch.tensor([1, 1, 0, 0, 0]), torch.zeros(3, 0), 2, k=2)


def test_pins_knn_classify_zero_query_matches_explicit_vote():
    """Pin: an all-zero query has cosine 0 with every bank feature (as sklearn's cosine metric); with ``k`` the whole
    bank the vote is the explicit weighted majority, computed here in float64."""
    bank = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 2.0], [0.0, 0.0]], dtype=torch.float64)
    labels = torch.tensor([0, 1, 1, 0])
    pred = knn_classify(bank, labels, torch.zeros(1, 2, dtype=torch.float64), 2, k=4)
    votes = torch.zeros(2, dtype=torch.float64).scatter_add_(0, labels, torch.ones(4, dtype=torch.float64))
    assert votes[0] == votes[1] and pred.tolist() == [0]  # a tie of the scores: the smaller class index (documented)
    pred = knn_classify(bank, torch.tensor([1, 1, 1, 0]), torch.zeros(1, 2, dtype=torch.float64), 2, k=4)
    assert pred.tolist() == [1]


def test_pins_capture_num_batches_counts_batches_run_not_empty_draws():
    """Pin (documented): ``extra["num_batches"]`` counts the batches run through the model; drawn batches of 0
    sequences are skipped and not counted."""
    from diffusionformer.analysis.capture import capture_dataset
    from diffusionformer.models import DiffusionViT, ViTConfig

    torch.manual_seed(0)
    vit = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, dim=8, depth=1, num_heads=2))
    empty = (torch.randn(0, 1, 8, 8), torch.zeros(0, dtype=torch.long))
    full = (torch.randn(2, 1, 8, 8), torch.tensor([0, 1]))
    cap = capture_dataset(vit, [empty, full, empty, full], max_examples=4)
    assert cap.num_examples == 4 and cap.extra["num_batches"] == 2
