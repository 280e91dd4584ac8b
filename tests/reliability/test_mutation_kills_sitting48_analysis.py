"""Mutation audit (sitting 48) of the analysis package: analysis/metrics.py, spectral.py, capture.py and report.py:
tests that kill mutants the earlier tests left alive; each docstring names the mutant. The earlier tests are
tests/analysis with the four modules' doctests, and the tests elsewhere that call the analysis (tests/experiments,
tests/reliability, tests/docs). References are independent: float64 formulas written here (explicit sums over
tokens, token pairs and classes, torch.linalg.svdvals) on small hand-made inputs. CPU only, no data.

90 mutants (metrics.py 30, spectral.py 20, capture.py 20, report.py 20): 80 killed by earlier tests (3 of report.py's
only by tests/experiments, 1 of metrics.py's, anova's class sizes, only by tests/docs), 6 survivors killed here
(metrics.py 5, spectral.py 1), 4 equivalent, no bug found. Five of the six are one gap: a scale-free metric of each
sequence (token, spectrum) must take its own power-of-two scale, not one for the batch (sequence), else float32
tokens of a tiny sequence beside a huge one underflow to 0 when scaled.

Equivalent mutants:

- metrics.py ``linear_probe_accuracy`` ``if n < D`` -> ``if n <= D`` (at ``n == D`` the dual form
  ``X^T (X X^T + lam I)^{-1} Y`` is the primal ``(X^T X + lam I)^{-1} X^T Y`` by the push-through identity: the same
  probe up to rounding).
- capture.py ``_Collector.add`` ``keep = (ei[1] < kept_nodes) & (ei[0] < kept_nodes)`` -> ``(ei[1] < kept_nodes)``
  (the edges of a batch are block-diagonal, checked by the graph models, graph/_checks.py ``check_within_graphs``, so
  an edge into a kept graph starts in a kept graph; a cross-graph edge is refused before anything is recorded).
- capture.py ``capture_dataset`` ``if n > max_examples - count`` -> ``>=`` (at equality the batch is "cut" to all of
  its ``n`` sequences: the same inputs and labels).
- report.py ``_dirichlet_attention`` ``P * m.unsqueeze(-1) * m.unsqueeze(-2)`` -> ``P * m.unsqueeze(-1)`` (the key
  columns of padded tokens are 0 already: ``LayerCapture.attentions`` rows sum to 1 over real tokens, and a
  key-padded block puts no weight on padded keys).
"""

from __future__ import annotations

import torch


def _hf_ratio_reference(X: torch.Tensor) -> torch.Tensor:
    """``||C X||_F / ||X||_F`` per sequence, in float64, from explicit sums over the tokens."""
    X = X.double()
    out = []
    for seq in X:
        mean = seq.sum(dim=0) / seq.shape[0]
        num = sum(float(((tok - mean) ** 2).sum()) for tok in seq)
        den = sum(float((tok**2).sum()) for tok in seq)
        out.append(0.0 if den == 0 else (num / den) ** 0.5)
    return torch.tensor(out, dtype=torch.float64)


def test_kills_high_frequency_ratio_scaled_per_sequence():
    """kills: analysis/metrics.py ``high_frequency_ratio`` ``_unit_scale(X, (1, 2))`` -> ``_unit_scale(X, (0, 1, 2))``
    (one power-of-two scale for the whole batch: float32 tokens of scale 1e-20 beside a sequence of scale 1e20 went
    subnormal, their squares 0, and their ratio 0, "all tokens equal", where it is 1). Each sequence of the ratio
    is scale-free, so each must keep its own scale."""
    from diffusionformer.analysis import high_frequency_ratio

    X = torch.tensor([[[1e-20, 0.0], [-1e-20, 0.0]],  # centred: ratio 1
                      [[3e20, 1e20], [1e20, 1e20]]])  # ratio 1/sqrt(11)
    got = high_frequency_ratio(X)
    want = _hf_ratio_reference(X)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)
    assert float(want[0]) == 1.0


def test_kills_neural_collapse_coinciding_class_means_have_no_direction():
    """kills: analysis/metrics.py ``neural_collapse`` ``norms > eps * norms.max()`` -> ``norms >= eps * norms.max()``
    (class means that all coincide with the global mean, norms all 0, counted as directions: 0 / 0 gave NaN
    equiangularity, max_angle and etf_distance, where the docstring's "a centred mean of norm 0 has cosine 0 with
    all others" gives 0, 1/(C-1) and ``||(I - 11^T/C) / sqrt(C-1)||_F`` = 1)."""
    import math

    from diffusionformer.analysis import neural_collapse

    H = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 2.0], [0.0, -2.0], [3.0, 0.0], [-3.0, 0.0]])
    y = torch.tensor([0, 0, 1, 1, 2, 2])  # three classes, each of mean 0: the means coincide, the spread is not 0
    nc = neural_collapse(H, y)
    C = 3
    etf = torch.eye(C, dtype=torch.float64) - 1.0 / C
    assert nc.num_classes == C
    assert nc.nc1 == math.inf  # no collapse at all
    assert nc.equinorm == 0.0  # 0 / 0 defined as 0
    assert nc.equiangularity == 0.0  # all cosines 0
    assert nc.max_angle == 1.0 / (C - 1)
    assert math.isclose(nc.etf_distance, float((etf / (C - 1) ** 0.5).norm()), rel_tol=1e-12)
    assert math.isclose(nc.etf_distance, 1.0, rel_tol=1e-12)


def test_kills_rank_collapse_residual_svd_scaled_per_sequence():
    """kills: analysis/metrics.py ``rank_collapse_residual`` ``svdvals(_unit_scale(X, (1, 2)))`` ->
    ``svdvals(_unit_scale(X, (0, 1, 2)))`` (one scale for the batch: the singular values of float32 tokens of scale
    1e-20 beside a sequence of scale 1e20 went subnormal, their squares 0, and the residual 0, "rank 1", where two
    orthogonal tokens of equal norm have ``sqrt(s_2^2 / (s_1^2 + s_2^2)) = sqrt(1/2)``)."""
    from diffusionformer.analysis import rank_collapse_residual

    X = torch.tensor([[[1e-20, 0.0], [0.0, 1e-20]],
                      [[3e20, 1e20], [1e20, 1e20]]])
    got = rank_collapse_residual(X, "svd")
    want = []
    for seq in X.double():
        s2 = torch.linalg.svdvals(seq).pow(2)  # float64: squares of 1e-20 are normal numbers
        want.append(float((s2[1:].sum() / s2.sum()).sqrt()))
    torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=0)
    assert abs(want[0] - 0.5**0.5) < 1e-12


def test_kills_dirichlet_energy_normalized_scaled_per_sequence():
    """kills: analysis/metrics.py ``dirichlet_energy`` (dense path, ``normalized=True``) ``_unit_scale(X, (1, 2))`` ->
    ``_unit_scale(X, (0, 1, 2))`` (one scale for the batch: float32 tokens of scale 1e-20 beside a sequence of scale
    1e20 went subnormal and their energy 0 / 0 = 0, where two opposite tokens have ``E / ||X||^2`` = 1 on the complete
    graph and 2 with ``P`` = the swap). Reference: ``1/2 sum_ij P_ij ||x_i - x_j||^2 / sum_i ||x_i||^2`` in float64."""
    from diffusionformer.analysis import dirichlet_energy

    X = torch.tensor([[[1e-20, 0.0], [-1e-20, 0.0]],
                      [[3e20, 1e20], [1e20, 1e20]]])
    swap = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    uniform = torch.full((2, 2), 0.5)
    for P, arg in ((uniform, None), (swap, swap)):
        want = []
        for seq in X.double():
            pairs = sum(float(P[i, j]) * float((seq[i] - seq[j]).pow(2).sum()) for i in range(2) for j in range(2))
            want.append(0.5 * pairs / float(seq.pow(2).sum()))
        got = dirichlet_energy(X, arg)
        torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=0)
    assert float(dirichlet_energy(X)[0]) == 1.0 and float(dirichlet_energy(X, swap)[0]) == 2.0




def test_kills_mean_pairwise_cosine_scaled_per_token():
    """kills: analysis/metrics.py ``mean_pairwise_cosine`` ``frexp(X.abs().amax(dim=-1))`` (one power of two per
    token) -> one per sequence (a float32 token of norm 2e-11, above ``eps``, beside a token of scale 1e38 in the same
    sequence went to 0 when scaled, and counted as a zero token: cosine 0 where its direction gives 5 / sqrt(50)).
    Reference: the float64 cosine of each ordered pair of distinct tokens."""
    from diffusionformer.analysis import mean_pairwise_cosine

    X = torch.tensor([[[3e38, 1e38], [1e-11, 2e-11], [2e-11, -1e-11]],
                      [[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]]])
    want = []
    for seq in X.double():
        T = seq.shape[0]
        total = sum(float(seq[i] @ seq[j] / (seq[i].norm() * seq[j].norm()))
                    for i in range(T) for j in range(T) if i != j)
        want.append(total / (T * (T - 1)))
    torch.testing.assert_close(mean_pairwise_cosine(X).double(), torch.tensor(want, dtype=torch.float64),
                               rtol=1e-5, atol=1e-6)
    assert abs(want[0] - (2 * 5 / 50**0.5 + 2 * 5 / 50**0.5 + 0.0) / 6) < 1e-12


def test_kills_effective_rank_scaled_per_spectrum():
    """kills: analysis/spectral.py ``effective_rank`` ``_unit_scale(s, -1)`` -> one scale for all the spectra of the
    batch (a float32 spectrum of scale 1e-30 beside one of scale 1e30 went to 0 when scaled, and its effective rank
    to 0, "an all-zero spectrum", where a flat spectrum of 2 values has rank 2). Reference: ``exp(H(p))`` in float64."""
    import math

    from diffusionformer.analysis import effective_rank

    s = torch.tensor([[1e-30, 1e-30, 0.0], [3e30, 1e30, 1e30], [4.0, 2.0, 1.0]])
    want = []
    for row in s.double():
        p = row / row.sum()
        want.append(math.exp(-sum(float(q * q.log()) for q in p if q > 0)))
    torch.testing.assert_close(effective_rank(s).double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=0)
    assert abs(want[0] - 2.0) < 1e-12
