"""Edge-case probes of the analysis package, fourth round (report registry, spectral, capture, plots).

Each ``Bug:`` test pins a defect a user met (the docstring says what they saw); ``Pins:`` tests fix legal edge
cases that already work, checked against independent float64 references (numpy, explicit formulas).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffusionformer.analysis import (
    LayerCapture,
    eigenvalues_of,
    layer_reports,
    list_metrics,
    neural_collapse,
    next_token_nc1,
    plot_metric_by_depth,
)


def _padded_capture_with_attention(sparse: bool) -> tuple[LayerCapture, float]:
    """Lengths 4, 2, 0 (an empty graph); dense attention of a key-padding-masked softmax (padded query rows still
    attend to the real keys, as the softmax leaves them) or the same weights as sparse edges; and the float64
    reference: the mean over the non-empty sequences of 1/2 sum_ij P_ij ||x_i - x_j||^2 / ||X||_F^2."""
    g = torch.Generator().manual_seed(0)
    B, T, D, H = 3, 4, 3, 2
    lengths = torch.tensor([4, 2, 0])
    mask = torch.arange(T)[None] < lengths[:, None]
    X = torch.randn(B, T, D, generator=g) * mask[..., None]
    scores = torch.randn(B, H, T, T, generator=g).masked_fill(~mask[:, None, None, :], -1e9)
    P = torch.nan_to_num(torch.softmax(scores, -1))
    Pm = P.double().mean(1).numpy()
    ref = []
    for b in range(B):
        n = int(lengths[b])
        if n == 0:
            continue
        x = X[b, :n].double().numpy()
        d2 = ((x[:, None] - x[None]) ** 2).sum(-1)
        ref.append(0.5 * (Pm[b, :n, :n] * d2).sum() / (x**2).sum())
    extra = {"num_attention_examples": B}
    if not sparse:
        return LayerCapture({0: X, 1: X}, mask=mask, attentions={0: P}, extra=extra), float(np.mean(ref))
    edges, weights, offset = [], [], 0
    for b in range(B):
        n = int(lengths[b])
        for i in range(n):
            for j in range(n):
                edges.append((offset + j, offset + i))
                weights.append(P[b, :, i, j])
        offset += n
    cap = LayerCapture({0: X, 1: X}, mask=mask, attentions={0: torch.stack(weights)},
                       attention_edges={0: torch.tensor(edges).T}, extra=extra)
    return cap, float(np.mean(ref))


@pytest.mark.parametrize("sparse", [False, True])
def test_bug_dirichlet_attention_of_a_padded_capture_counts_real_tokens_only(sparse: bool) -> None:
    """Bug: layer_reports' dirichlet_attention of a padded capture averaged over an empty graph's 0 / 0 = 0 (0.507
    instead of 0.760 on lengths 4, 2, 0, sparse and dense alike), and on dense attention it also counted the rows of
    the padded queries (a key-padding-masked softmax leaves them attending to the real keys: 0.670), while every other
    metric of the report skips empty sequences and padded tokens."""
    cap, ref = _padded_capture_with_attention(sparse)
    got = layer_reports(cap)[1].metrics["dirichlet_attention"]
    assert got == pytest.approx(ref, rel=1e-6)


def test_bug_dirichlet_attention_ignores_the_values_at_padded_positions() -> None:
    """Bug: a padded dense capture whose padding was not zero (a LayerCapture built by hand, padding unspecified)
    gave a different dirichlet_attention: the padded tokens entered ||X||_F^2 and the energy. Now it is the same
    as with zero padding, and all-empty attention sequences give None, not 0."""
    cap, ref = _padded_capture_with_attention(sparse=False)
    X = cap.states[1].clone()
    X[~cap.mask] = 7.0
    noisy = LayerCapture({0: X, 1: X}, mask=cap.mask, attentions=cap.attentions, extra=cap.extra)
    assert layer_reports(noisy)[1].metrics["dirichlet_attention"] == pytest.approx(ref, rel=1e-6)
    empty_first = LayerCapture({0: X.flip(0), 1: X.flip(0)}, mask=cap.mask.flip(0),
                               attentions={0: cap.attentions[0].flip(0)}, extra={"num_attention_examples": 1})
    assert layer_reports(empty_first)[1].metrics["dirichlet_attention"] is None


def _spectrum_references(seqs: list[np.ndarray]) -> dict[str, float]:
    Z = np.concatenate([s - s.mean(0) for s in seqs])
    sv = np.linalg.svd(Z, compute_uv=False)
    p = sv / sv.sum()
    p = p[p > 0]
    r = int((sv > 1e-6 * sv[0]).sum())
    return {
        "effective_rank": float(np.exp(-(p * np.log(p)).sum())),
        "stable_rank": float((sv**2).sum() / sv.max() ** 2),
        "energy_top3": float((sv[:3] ** 2).sum() / (sv**2).sum()),
        "power_law_alpha": float(-np.polyfit(np.log(np.arange(1, r + 1)), np.log(sv[:r] ** 2), 1)[0]),
    }


def test_every_registered_smoothing_spectral_and_nc1_metric_of_a_padded_capture_equals_its_definition() -> None:
    """Pins: on a padded capture (lengths 5, 5, 3, 3, 1, 4, padding not zero) every built-in smoothing and spectral
    metric and NC1 of the sequence means equal numpy float64 definitions computed on the real tokens only (mean
    cosine over sequences of >= 2 tokens, excluding the diagonal; effective rank from the entropy of s / sum s;
    NC1 = tr(S_W S_B^+) / C with numpy's pinv)."""
    g = torch.Generator().manual_seed(1)
    B, T, D = 6, 5, 4
    lengths = torch.tensor([5, 5, 3, 3, 1, 4])
    mask = torch.arange(T)[None] < lengths[:, None]
    X = torch.randn(B, T, D, generator=g) * 2 + 1
    y = torch.tensor([0, 1, 0, 1, 2, 2])
    cap = LayerCapture({0: X}, mask=mask, labels=y)
    got = layer_reports(cap)[0].metrics
    # every registered metric of the groups measured with one label per sequence is reported
    assert set(got) == {m.key for g in ("smoothing", "spectral", "sequence_label") for m in list_metrics(g)}
    seqs = [X[b, : lengths[b]].double().numpy() for b in range(B)]
    allt = np.concatenate(seqs)
    cosines = []
    for s in seqs:
        if len(s) >= 2:
            u = s / np.linalg.norm(s, axis=1, keepdims=True)
            gram = u @ u.T
            cosines.append((gram.sum() - np.trace(gram)) / (len(s) * (len(s) - 1)))

    def residual(s: np.ndarray) -> float:
        sv = np.linalg.svd(s, compute_uv=False)
        return float(np.sqrt((sv[1:] ** 2).sum() / (sv**2).sum()))

    H = np.stack([s.mean(0) for s in seqs])
    yy = y.numpy()
    M = np.stack([H[yy == c].mean(0) for c in range(3)])
    S_w = sum(np.outer(h - M[c], h - M[c]) for h, c in zip(H, yy)) / B
    S_b = (M - H.mean(0)).T @ (M - H.mean(0)) / 3
    ref = {
        "within_variance": np.mean([((s - s.mean(0)) ** 2).sum() / len(s) for s in seqs]),
        "variance_ratio": sum(((s - s.mean(0)) ** 2).sum() for s in seqs) / ((allt - allt.mean(0)) ** 2).sum(),
        "mean_cosine": np.mean(cosines),
        "high_frequency_ratio": np.mean([np.linalg.norm(s - s.mean(0)) / np.linalg.norm(s) for s in seqs]),
        "rank_collapse_svd": np.mean([residual(s) for s in seqs]),
        "dirichlet_complete": np.mean([((s - s.mean(0)) ** 2).sum() / (s**2).sum() for s in seqs]),
        "nc1": np.trace(S_w @ np.linalg.pinv(S_b)) / 3,
        **_spectrum_references(seqs),
    }
    for key, value in ref.items():
        assert got[key] == pytest.approx(float(value), rel=1e-9, abs=1e-12), key
    assert got["dirichlet_attention"] is None  # no attention captured
    tokens = np.concatenate(seqs)  # the ANOVA of the real tokens (sitting 52; None for padded captures before)
    within = sum(((s - s.mean(0)) ** 2).sum() for s in seqs) / ((tokens - tokens.mean(0)) ** 2).sum()
    assert got["anova_within_fraction"] == pytest.approx(float(within), rel=1e-9)


def test_eigenvalues_of_causal_and_batched_attention_maps_agree_with_numpy() -> None:
    """Pins: a causal (lower-triangular) row-stochastic map has its diagonal as eigenvalues, real, in decreasing
    order with 1 first; batched non-symmetric maps give numpy's eigenvalues with conjugate pairs ordered by
    decreasing imaginary part."""
    g = torch.Generator().manual_seed(2)
    T = 6
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    P = torch.softmax(torch.randn(T, T, generator=g, dtype=torch.float64).masked_fill(causal, -float("inf")), -1)
    lam = eigenvalues_of(P)
    assert bool((lam.imag == 0).all())
    np.testing.assert_allclose(lam.real.numpy(), np.sort(np.diag(P.numpy()))[::-1], rtol=1e-12)
    assert lam[0].real == pytest.approx(1.0)
    P2 = torch.softmax(torch.randn(2, 3, T, T, generator=g), -1)
    lam2 = eigenvalues_of(P2).numpy().reshape(-1, T)
    ref = np.linalg.eigvals(P2.double().numpy()).reshape(-1, T)
    for got_row, ref_row in zip(lam2, ref):
        np.testing.assert_allclose(np.sort_complex(got_row), np.sort_complex(ref_row), atol=1e-12)
        assert bool(np.all(np.diff(got_row.real) <= 0))
        for i in range(T - 1):
            if got_row[i].real == got_row[i + 1].real:
                assert got_row[i].imag >= got_row[i + 1].imag


def test_nc1_with_a_singleton_class_and_fewer_dims_than_classes_matches_a_pinv_reference() -> None:
    """Pins: NC1 with a one-member class and D = 2 < C - 1 = 3 (S_B rank-deficient) equals tr(S_W pinv(S_B)) / C;
    next_token_nc1 drops the singleton class before the statistics (min_count=2)."""
    g = torch.Generator().manual_seed(3)
    H = torch.randn(7, 2, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1, 2, 3, 3])

    def ref(Hn: np.ndarray, yy: np.ndarray) -> float:
        classes = sorted(set(yy.tolist()))
        M = np.stack([Hn[yy == c].mean(0) for c in classes])
        S_w = sum(np.outer(h - M[classes.index(c)], h - M[classes.index(c)]) for h, c in zip(Hn, yy)) / len(Hn)
        S_b = (M - Hn.mean(0)).T @ (M - Hn.mean(0)) / len(classes)
        return float(np.trace(S_w @ np.linalg.pinv(S_b)) / len(classes))

    assert neural_collapse(H, y).nc1 == pytest.approx(ref(H.numpy(), y.numpy()), rel=1e-10)
    keep = (y != 2).numpy()
    assert next_token_nc1(H, y, min_count=2) == pytest.approx(ref(H.numpy()[keep], y.numpy()[keep]), rel=1e-10)


@pytest.mark.parametrize("value", ["x", 1 + 2j, [1.0]])
def test_bug_plot_metric_by_depth_names_the_setting_with_a_non_numeric_value(value: object) -> None:
    """Bug: a value that is no number died with a bare "could not convert string to float: 'x'" (ValueError) or
    "float() argument must be a string or a real number, not 'complex'", naming neither results nor the setting."""
    pytest.importorskip("matplotlib")
    with pytest.raises(TypeError, match=r"results\['a'\] must hold real numbers \(or None\), one per layer"):
        plot_metric_by_depth({"a": [0.5, value]}, "y")
