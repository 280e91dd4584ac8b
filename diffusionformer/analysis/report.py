r"""Token-geometry report: every metric of ``metrics``/``spectral`` for every captured layer.

Given a :class:`~diffusionformer.analysis.capture.LayerCapture` (tokens ``X^(l)`` of ``B``
sequences per layer), :func:`layer_reports` measures, per layer ``l``, the quantities Zhang &
Papyan (arXiv 2602.09297) track through depth:

- smoothing and collapse: ``within_variance`` ``(1/T)||C X||_F^2`` (mean over sequences),
  ``variance_ratio`` (pooled within / total), ``mean_cosine``, ``high_frequency_ratio``
  ``||C X|| / ||X||``, ``rank_collapse_svd`` (relative distance to the best rank-1 matrix);
- Dirichlet energy, scale-free (divided by ``||X||_F^2``): ``dirichlet_complete`` on the
  uniform complete token graph, and ``dirichlet_attention`` on the head-averaged attention
  graph ``P_bar = (1/H) sum_h P_h`` of block ``l - 1``, the block that produced ``X^(l)`` (so
  it says how smooth a block's output is on the graph that block diffused over; energy is
  linear in ``P``, so this is the mean of the per-head energies);
- spectrum of the tokens centred per sequence, pooled over sequences: ``effective_rank``,
  ``stable_rank``, ``energy_top3`` and the power-law exponent ``power_law_alpha`` (fitted
  over the ranks above ``1e-6`` of the largest singular value);
- with one label per sequence: the ANOVA split of the token scatter (fractions), Neural
  Collapse of the sequence means (``nc1``, NC2 ``nc2_equinorm``/``nc2_equiangularity``/
  ``nc2_etf_distance``, NC4 ``nc4_agreement`` with the model's predictions when given, else
  the nearest-class-centre accuracy) and ``seq_probe_acc``, a linear probe on the means;
- with one label per token (next token of a language model, node class): ``token_nc1`` (NC1
  with the token's label as its class, classes with fewer than 2 tokens dropped) and
  ``token_probe_acc``.

A metric that is undefined for the data (fewer than 2 classes, ANOVA of padded graphs, no
attention captured) is ``None``. Padded captures (graphs) are handled exactly: per-sequence
metrics are computed on groups of equal length, pooled quantities on the real tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import Tensor

from diffusionformer.analysis.capture import IGNORE_INDEX, LayerCapture
from diffusionformer.analysis.metrics import (
    anova_decomposition,
    dirichlet_energy,
    high_frequency_ratio,
    linear_probe_accuracy,
    mean_pairwise_cosine,
    neural_collapse,
    next_token_nc1,
    rank_collapse_residual,
    within_sequence_variance,
)
from diffusionformer.analysis.spectral import effective_rank, energy_top_k, power_law_exponent, stable_rank

__all__ = ["LayerReport", "layer_reports", "SMOOTHING_METRICS", "SPECTRAL_METRICS", "SEQUENCE_LABEL_METRICS",
           "TOKEN_LABEL_METRICS"]

SMOOTHING_METRICS = ("within_variance", "variance_ratio", "mean_cosine", "high_frequency_ratio",
                     "rank_collapse_svd", "dirichlet_complete", "dirichlet_attention")
SPECTRAL_METRICS = ("effective_rank", "stable_rank", "energy_top3", "power_law_alpha")
SEQUENCE_LABEL_METRICS = ("anova_within_fraction", "anova_between_sequence_fraction", "anova_between_class_fraction",
                          "nc1", "nc2_equinorm", "nc2_equiangularity", "nc2_etf_distance", "nc4_agreement",
                          "seq_probe_acc")
TOKEN_LABEL_METRICS = ("token_nc1", "token_probe_acc")

_RANK_RTOL = 1e-6


@dataclass
class LayerReport:
    """The metrics of one layer.

    Attributes:
        layer: residual-stream index (0 = embeddings, ``l`` = after block ``l - 1``).
        metrics: metric name -> value (``None`` where undefined); see the module docstring.
        singular_values: spectrum of the sequence-centred tokens, descending, ``(R,)``.
    """

    layer: int
    metrics: dict[str, float | None]
    singular_values: Tensor


def _groups(X: Tensor, lengths: Tensor) -> Iterator[Tensor]:
    """Sequences of equal length, unpadded: ``(b, n, D)`` blocks covering every sequence once."""
    for n in torch.unique(lengths).tolist():
        if n == 0:
            continue
        yield X[lengths == n, :n]


def _mean_per_sequence(fn: Any, X: Tensor, lengths: Tensor, min_len: int = 1) -> float | None:
    values = [fn(g) for g in _groups(X, lengths) if g.shape[1] >= min_len]
    if not values:
        return None
    return float(torch.cat(values).mean())


def _valid(X: Tensor, mask: Tensor | None) -> Tensor:
    """Real tokens, row-major: ``(N, D)``."""
    return X.reshape(-1, X.shape[-1]) if mask is None else X[mask]


def _sequence_means(X: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return X.mean(dim=1)
    m = mask.to(X.dtype).unsqueeze(-1)
    return (X * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)


def _num_classes(y: Tensor, min_count: int = 1) -> int:
    _, counts = torch.unique(y, return_counts=True)
    return int((counts >= min_count).sum())


def _spectrum_summary(s: Tensor) -> dict[str, float | None]:
    s = s.sort(descending=True).values
    out: dict[str, float | None] = {
        "effective_rank": float(effective_rank(s)),
        "stable_rank": float(stable_rank(s)),
        "energy_top3": float(energy_top_k(s, min(3, s.numel()))),
        "power_law_alpha": None,
    }
    if s.numel() and s[0] > 0:
        r = int((s > _RANK_RTOL * s[0]).sum())
        if r >= 3:
            out["power_law_alpha"] = float(power_law_exponent(s, start=1, stop=r))
    return out


def _probe(features: Tensor, y: Tensor, seed: int) -> float | None:
    """Linear-probe accuracy, ``None`` when the seeded split leaves fewer than 2 training classes."""
    if _num_classes(y) < 2:
        return None
    try:
        return linear_probe_accuracy(features, y, seed=seed)
    except ValueError as exc:  # the random training part drew a single class (tiny inputs only)
        if "at least 2 classes in training" in str(exc):
            return None
        raise


def _dirichlet_attention(cap: LayerCapture, layer: int, X: Tensor, lengths: Tensor) -> float | None:
    block = layer - 1
    if layer < 1 or not cap.attentions or block not in cap.attentions:
        return None
    A = cap.num_attention_examples
    if A == 0:
        return None
    weights = cap.attentions[block].to(X.dtype)
    if cap.attention_edges is not None and block in cap.attention_edges:
        nodes = _valid(X[:A], None if cap.mask is None else cap.mask[:A])
        seq = torch.arange(A).repeat_interleave(lengths[:A])
        energy = dirichlet_energy(nodes, edge_index=cap.attention_edges[block], edge_weight=weights.mean(dim=-1),
                                  batch=seq, num_graphs=A)
        return float(energy.mean())
    P = weights.mean(dim=1)  # (A, T, T), head average
    return float(dirichlet_energy(X[:A], P, reduction="mean"))


def layer_reports(
    capture: LayerCapture,
    *,
    predictions: Tensor | None = None,
    probe_seed: int = 0,
) -> list[LayerReport]:
    r"""Token-geometry metrics of every captured layer (see the module docstring for the list).

    Computed in float64 on the CPU. Sequence-level metrics use one label per sequence
    (``capture.labels`` of shape ``(B,)``); token-level ones one label per token (``(B, T)``,
    ``-100`` = none).

    Args:
        capture: the tokens, from :func:`~diffusionformer.analysis.capture.capture_dataset`.
        predictions: the model's predicted class per sequence ``(B,)`` (for NC4).
        probe_seed: seed of the linear probes' train/test split.

    Returns:
        One :class:`LayerReport` per captured layer, in ``capture.layers`` order.

    Examples:
        >>> X = torch.tensor([[[1.0, 0.0], [-1.0, 0.0]], [[3.0, 1.0], [3.0, 1.0]]])
        >>> cap = LayerCapture({0: X}, labels=torch.tensor([0, 1]))
        >>> r = layer_reports(cap)[0].metrics
        >>> r["within_variance"], r["dirichlet_complete"], r["nc1"]
        (0.5, 0.5, 0.0)
    """
    if not isinstance(capture, LayerCapture):
        raise TypeError(f"capture must be a LayerCapture, got {type(capture).__name__}")
    mask = capture.mask
    lengths = capture.lengths()
    labels = capture.labels
    seq_labels = labels if labels is not None and labels.ndim == 1 else None
    tok_labels = labels if labels is not None and labels.ndim == 2 else None
    if seq_labels is not None and seq_labels.shape[0] != capture.num_examples:
        raise ValueError(f"capture.labels must have one label per sequence ({capture.num_examples},), "
                         f"got {tuple(seq_labels.shape)}")
    B = capture.num_examples
    if predictions is not None and (not isinstance(predictions, Tensor) or predictions.shape != (B,)):
        raise ValueError(f"predictions must have shape ({B},), got {getattr(predictions, 'shape', predictions)!r}")
    reports = []
    for layer in capture.layers:
        X = capture.states[layer].to(torch.float64)
        B, T, D = X.shape
        m: dict[str, float | None] = {}
        m["within_variance"] = _mean_per_sequence(within_sequence_variance, X, lengths)
        tokens = _valid(X, mask)
        mu = tokens.mean(dim=0)
        means = _sequence_means(X, mask)
        seq_of_token = torch.arange(B).repeat_interleave(lengths)
        within = (tokens - means[seq_of_token]).pow(2).sum()
        total = (tokens - mu).pow(2).sum()
        m["variance_ratio"] = float(within / total) if total > 0 else 0.0  # == variance_ratio(X, "pooled") unpadded
        m["mean_cosine"] = _mean_per_sequence(mean_pairwise_cosine, X, lengths, min_len=2)
        m["high_frequency_ratio"] = _mean_per_sequence(high_frequency_ratio, X, lengths)
        m["rank_collapse_svd"] = _mean_per_sequence(lambda g: rank_collapse_residual(g, "svd"), X, lengths)
        m["dirichlet_complete"] = _mean_per_sequence(dirichlet_energy, X, lengths)
        m["dirichlet_attention"] = _dirichlet_attention(capture, layer, X, lengths)

        s = torch.linalg.svdvals(tokens - means[seq_of_token])  # sequence-centred, pooled
        m.update(_spectrum_summary(s))

        if seq_labels is not None:
            y = seq_labels
            for key in SEQUENCE_LABEL_METRICS:
                m[key] = None
            if mask is None:
                fractions = anova_decomposition(X, y).fractions
                for key, value in zip(SEQUENCE_LABEL_METRICS[:3], fractions):
                    m[key] = value
            if _num_classes(y) >= 2:
                nc = neural_collapse(means, y, predictions)
                m.update(nc1=nc.nc1, nc2_equinorm=nc.equinorm, nc2_equiangularity=nc.equiangularity,
                         nc2_etf_distance=nc.etf_distance, nc4_agreement=nc.ncc_agreement)
                if B >= 4:
                    m["seq_probe_acc"] = _probe(means, y, probe_seed)
        if tok_labels is not None:
            y = _valid(tok_labels.unsqueeze(-1), mask).squeeze(-1)
            keep = y != IGNORE_INDEX
            feats, y = tokens[keep], y[keep]
            m["token_nc1"] = next_token_nc1(feats, y, min_count=2) if _num_classes(y, 2) >= 2 else None
            m["token_probe_acc"] = _probe(feats, y, probe_seed) if y.numel() >= 4 else None
        reports.append(LayerReport(layer, m, s.to(torch.float32)))
    return reports
