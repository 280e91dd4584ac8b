"""ANOVA of token scatter, Neural Collapse, next-token NC1 and the linear probe."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.analysis import (
    AnovaSplit,
    NeuralCollapse,
    anova_decomposition,
    linear_probe_accuracy,
    neural_collapse,
    next_token_nc1,
)

DTYPES = [torch.float32, torch.float64]


def simplex_means(C: int, D: int, scale: float = 3.0, seed: int = 0) -> torch.Tensor:
    """C class means forming a simplex ETF in R^D, randomly rotated and shifted."""
    etf = torch.eye(C, dtype=torch.float64) - 1.0 / C  # rows: centred standard basis
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))
    return scale * etf @ Q[:C] + 5.0  # (C, D), global offset 5


# ----------------------------------------------------------------------------------------
# ANOVA
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_anova_parts_sum_to_total_and_match_definitions(dtype: torch.dtype) -> None:
    B, T, D = 9, 7, 5
    g = torch.Generator().manual_seed(0)
    X = (torch.randn(B, T, D, generator=g) * 3 + torch.randn(B, 1, D, generator=g)).to(dtype)
    y = torch.tensor([5, 17, 5, 2, 17, 17, 5, 2, 2])  # arbitrary ids
    split = anova_decomposition(X, y)
    parts = split.within_sequence + split.between_sequence + split.between_class
    assert parts == pytest.approx(split.total, rel=1e-6)
    assert sum(split.fractions) == pytest.approx(1.0, rel=1e-6)
    assert split.num_classes == 3
    # each part from its definition, with explicit loops in float64
    X64 = X.double()
    mu = X64.mean((0, 1))
    within = sum(((X64[b] - X64[b].mean(0)) ** 2).sum() for b in range(B)) / (B * T)
    between_seq = between_cls = 0.0
    for c in y.unique():
        seqs = X64[y == c]
        m_c = seqs.mean((0, 1))
        between_seq += T * ((seqs.mean(1) - m_c) ** 2).sum() / (B * T)
        between_cls += T * len(seqs) * ((m_c - mu) ** 2).sum() / (B * T)
    rel = 1e-5 if dtype == torch.float32 else 1e-10
    assert split.within_sequence == pytest.approx(float(within), rel=rel)
    assert split.between_sequence == pytest.approx(float(between_seq), rel=rel)
    assert split.between_class == pytest.approx(float(between_cls), rel=rel)
    d = split.as_dict()
    assert d["within_sequence_fraction"] == pytest.approx(split.fractions[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_anova_parts_vanish_in_constructed_cases(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    class_means = torch.randn(3, 4, generator=g, dtype=dtype)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    # every token equals its class mean: only the between-class part survives
    X = class_means[y].unsqueeze(1).expand(6, 5, 4).clone()
    split = anova_decomposition(X, y)
    assert split.within_sequence == pytest.approx(0.0, abs=1e-10)
    assert split.between_sequence == pytest.approx(0.0, abs=1e-10)
    assert split.fractions[2] == pytest.approx(1.0)
    # sequences that share their class mean but vary inside: no between-sequence part
    wiggle = torch.randn(6, 5, 4, generator=g, dtype=dtype)
    X2 = X + wiggle - wiggle.mean(1, keepdim=True)
    split2 = anova_decomposition(X2, y)
    assert split2.between_sequence == pytest.approx(0.0, abs=1e-6)
    assert split2.within_sequence > 0.1
    # a single class: no between-class part
    split3 = anova_decomposition(X2, torch.zeros(6, dtype=torch.long))
    assert split3.between_class == pytest.approx(0.0, abs=1e-10) and split3.num_classes == 1
    # no variation at all: fractions are zeros, not NaN
    flat = anova_decomposition(torch.ones(2, 3, 2, dtype=dtype), torch.tensor([0, 1]))
    assert flat.fractions == (0.0, 0.0, 0.0)


def test_anova_bad_inputs() -> None:
    X = torch.randn(4, 3, 2)
    with pytest.raises(ValueError, match=r"y must have shape \(4,\).*got shape \(3,\)"):
        anova_decomposition(X, torch.tensor([0, 1, 0]))
    with pytest.raises(TypeError, match="integer class labels"):
        anova_decomposition(X, torch.tensor([0.0, 1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match=r"\(B, T, D\)"):
        anova_decomposition(X[0], torch.tensor([0, 1, 0]))


# ----------------------------------------------------------------------------------------
# Neural Collapse
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_collapsed_simplex_etf_gives_zero_metrics(dtype: torch.dtype) -> None:
    C, D = 4, 6
    means = simplex_means(C, D)
    y = torch.tensor([3, 0, 1, 2] * 3)  # balanced
    H = means[y].to(dtype)  # every sample at its class mean
    nc = neural_collapse(H, y)
    assert isinstance(nc, NeuralCollapse) and nc.num_classes == C
    for name in ("nc1", "equinorm", "equiangularity", "max_angle", "etf_distance"):
        assert getattr(nc, name) == pytest.approx(0.0, abs=1e-5), name
    assert nc.ncc_agreement == 1.0
    assert set(nc.as_dict()) >= {"nc1", "etf_distance", "ncc_agreement"}


@pytest.mark.parametrize("dtype", DTYPES)
def test_nc1_two_classes_closed_form(dtype: torch.dtype) -> None:
    """Means +-1 in 1-D, samples +-sigma around them: S_W = sigma^2, S_B = 1, NC1 = sigma^2 / 2."""
    sigma = 0.3
    H = torch.tensor([[-1 - sigma], [-1 + sigma], [1 - sigma], [1 + sigma]], dtype=dtype)
    nc = neural_collapse(H, torch.tensor([0, 0, 1, 1]))
    assert nc.nc1 == pytest.approx(sigma**2 / 2, rel=1e-5)
    assert nc.ncc_agreement == 1.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_nc1_matches_pseudo_inverse_definition(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(2)
    n, D, C = 60, 7, 4
    y = torch.randint(0, C, (n,), generator=g)
    y[:C] = torch.arange(C)  # all classes present, unbalanced
    H = (torch.randn(C, D, generator=g) * 2)[y] + torch.randn(n, D, generator=g)
    nc = neural_collapse(H.to(dtype), y)
    H = H.to(dtype).double()
    means = torch.stack([H[y == c].mean(0) for c in range(C)])
    mu = H.mean(0)
    S_W = sum((H[y == c] - means[c]).T @ (H[y == c] - means[c]) for c in range(C)) / n
    S_B = (means - mu).T @ (means - mu) / C
    expected = torch.trace(S_W @ torch.linalg.pinv(S_B, hermitian=True, rtol=1e-8)) / C
    assert nc.nc1 == pytest.approx(float(expected), rel=1e-4)
    assert nc.nc1 > 0


def test_nc2_known_values_for_collinear_means() -> None:
    """Centred means -4/3, -1/3, 5/3 on a line: cosines (1, -1, -1)."""
    H = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)
    nc = neural_collapse(H, torch.tensor([0, 1, 2]))
    assert nc.equinorm == pytest.approx(math.sqrt(26) / 10)
    assert nc.equiangularity == pytest.approx(math.sqrt(8) / 3)
    assert nc.max_angle == pytest.approx((1.5 + 0.5 + 0.5) / 3)
    G = torch.tensor([[1.0, 1, -1], [1, 1, -1], [-1, -1, 1]], dtype=torch.float64)
    etf = (torch.eye(3, dtype=torch.float64) - 1 / 3) / math.sqrt(2)
    assert nc.etf_distance == pytest.approx(float((G / 3 - etf).norm()))
    assert nc.nc1 == 0.0  # singleton classes have no within-class spread


def test_ncc_agreement_with_predictions_and_label_ids() -> None:
    H = torch.tensor([[0.0], [0.2], [1.0], [1.2], [0.9]])  # class means 0.367, 1.1
    y = torch.tensor([10, 10, 30, 30, 10])  # the last sample is closer to class 30's mean
    assert neural_collapse(H, y).ncc_agreement == pytest.approx(4 / 5)
    nearest = torch.tensor([10, 10, 30, 30, 30])
    assert neural_collapse(H, y, predictions=nearest).ncc_agreement == 1.0
    all_ten = torch.full((5,), 10)
    assert neural_collapse(H, y, predictions=all_ten).ncc_agreement == pytest.approx(2 / 5)


def test_neural_collapse_bad_inputs() -> None:
    H = torch.randn(6, 3)
    with pytest.raises(ValueError, match="at least 2 classes, got 1"):
        neural_collapse(H, torch.zeros(6, dtype=torch.long))
    with pytest.raises(ValueError, match=r"y must have shape \(6,\).*got shape \(5,\)"):
        neural_collapse(H, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"predictions must have shape \(6,\)"):
        neural_collapse(H, torch.tensor([0, 1] * 3), predictions=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(n, D\).*got shape \(2, 6, 3\)"):
        neural_collapse(H.expand(2, 6, 3), torch.tensor([0, 1] * 3))


# ----------------------------------------------------------------------------------------
# Next-token NC1
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_next_token_nc1_drops_rare_classes(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    ids = torch.tensor([4, 4, 4, 9, 9, 9, 9, 2, 2, 2])
    centres = torch.randn(10, 5, generator=g)
    tokens = (torch.randn(10, 5, generator=g) * 0.3 + centres[ids]).to(dtype)
    base = next_token_nc1(tokens, ids, min_count=2)
    assert base == pytest.approx(neural_collapse(tokens, ids).nc1, rel=1e-6)
    # singleton classes (even far outliers) are dropped before the statistics
    more_tokens = torch.cat([tokens, 100 * torch.randn(2, 5, generator=g, dtype=dtype)])
    more_ids = torch.cat([ids, torch.tensor([7, 8])])
    assert next_token_nc1(more_tokens, more_ids, min_count=2) == pytest.approx(base, rel=1e-6)
    # min_count=4 keeps only class 9 (counts: 4 -> 3, 9 -> 4, 2 -> 3): fewer than 2 classes
    with pytest.raises(ValueError, match="at least 2 next-token classes with >= 4 examples, got 1"):
        next_token_nc1(tokens, ids, min_count=4)
    # (B, T, D) with (B, T) ids, and an ignored padding id
    padded = torch.cat([tokens, torch.zeros(2, 5, dtype=dtype)]).reshape(3, 4, 5)
    padded_ids = torch.cat([ids, torch.tensor([-100, -100])]).reshape(3, 4)
    assert next_token_nc1(padded, padded_ids, ignore_index=-100) == pytest.approx(base, rel=1e-6)


def test_next_token_nc1_perfect_collapse_and_errors() -> None:
    ids = torch.tensor([0, 1, 0, 1, 2, 2])
    tokens = torch.eye(3)[ids]
    assert next_token_nc1(tokens, ids) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match=r"next_token must have shape \(6,\).*got shape \(5,\)"):
        next_token_nc1(tokens, ids[:5])
    with pytest.raises(ValueError, match=r"next_token must have shape \(2, 3\)"):
        next_token_nc1(tokens.reshape(2, 3, 3), ids)
    with pytest.raises(ValueError, match="min_count must be an integer >= 1"):
        next_token_nc1(tokens, ids, min_count=0)


# ----------------------------------------------------------------------------------------
# Linear probe
# ----------------------------------------------------------------------------------------


def blobs(
    n_per: int, D: int, C: int, spread: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(C, D, generator=g) * 4
    y = torch.arange(C).repeat(n_per)
    return centres[y] + spread * torch.randn(len(y), D, generator=g), y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [3, 80])  # primal (n_train > D) and dual (n_train < D) solves
def test_probe_separates_blobs(dtype: torch.dtype, D: int) -> None:
    X, y = blobs(20, D, 3, spread=0.3, seed=4)
    assert linear_probe_accuracy(X.to(dtype), y) == 1.0
    assert linear_probe_accuracy(X.to(dtype), y + 100) == 1.0  # label ids are arbitrary


def test_probe_chance_on_random_labels_and_seeded_split() -> None:
    g = torch.Generator().manual_seed(5)
    X = torch.randn(400, 2, generator=g)
    y = torch.randint(0, 4, (400,), generator=g)
    acc = linear_probe_accuracy(X, y, seed=1)
    assert 0.1 < acc < 0.45  # chance is 0.25
    assert linear_probe_accuracy(X, y, seed=1) == acc  # deterministic for a seed
    scaled = linear_probe_accuracy(1000.0 * X + 7.0, y, seed=1)
    assert scaled == acc  # ridge penalty is relative: affine feature changes do not matter


def test_probe_matches_sklearn_ridge_classifier() -> None:
    sklearn_linear = pytest.importorskip("sklearn.linear_model")
    X, y = blobs(30, 6, 4, spread=3.0, seed=6)
    X = X.double()
    mask = torch.rand(len(y), generator=torch.Generator().manual_seed(7)) < 0.6
    ridge = 0.5
    acc = linear_probe_accuracy(X, y, train_mask=mask, ridge=ridge)
    Xtr = X[mask] - X[mask].mean(0)
    lam = ridge * float(Xtr.pow(2).sum()) / X.shape[1]
    clf = sklearn_linear.RidgeClassifier(alpha=lam).fit(X[mask].numpy(), y[mask].numpy())
    expected = float((clf.predict(X[~mask].numpy()) == y[~mask].numpy()).mean())
    assert acc == pytest.approx(expected)
    assert 0.3 < acc < 1.0  # a non-trivial case


def test_probe_bad_inputs() -> None:
    X, y = blobs(5, 3, 2, spread=0.1, seed=8)
    with pytest.raises(ValueError, match=r"labels must have shape \(10,\).*got shape \(9,\)"):
        linear_probe_accuracy(X, y[:9])
    with pytest.raises(ValueError, match="ridge must be > 0"):
        linear_probe_accuracy(X, y, ridge=0.0)
    with pytest.raises(ValueError, match=r"train_fraction must be in \(0, 1\)"):
        linear_probe_accuracy(X, y, train_fraction=1.0)
    with pytest.raises(ValueError, match="at least 2 classes in training, got 1"):
        linear_probe_accuracy(X, torch.zeros(10, dtype=torch.long))
    with pytest.raises(TypeError, match="train_mask must be a bool tensor"):
        linear_probe_accuracy(X, y, train_mask=torch.ones(10))
    with pytest.raises(ValueError, match="at least one training and one test row"):
        linear_probe_accuracy(X, y, train_mask=torch.ones(10, dtype=torch.bool))


def test_dataclasses_are_frozen() -> None:
    split = anova_decomposition(torch.randn(2, 3, 2), torch.tensor([0, 1]))
    assert isinstance(split, AnovaSplit)
    with pytest.raises(AttributeError):
        split.total = 0.0  # type: ignore[misc]
