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
  over the ranks above ``1e-6`` of the largest singular value, or above the epsilon of the half
  precision a capture's tokens were computed in, ``capture.extra["precision"]``: below it they
  are rounding noise);
- with one label per sequence: the ANOVA split of the token scatter (fractions; padded graphs
  of unequal sizes weigh each mean by its tokens, which keeps the split exact), Neural
  Collapse of the sequence means (``nc1``, NC2 ``nc2_equinorm``/``nc2_equiangularity``/
  ``nc2_etf_distance``, NC4 ``nc4_agreement`` with the model's predictions when given, else
  the nearest-class-centre accuracy) and ``seq_probe_acc``, a linear probe on the means;
- with one label per token (next token of a language model, node class): ``token_nc1`` (NC1
  with the token's label as its class, classes with fewer than 2 tokens dropped) and
  ``token_probe_acc``.

Every metric is one function registered once (:func:`register_metric`, keyed by its name, with
its group, axis label, figure panel and table column); :func:`layer_reports`, the analysis of a
comparison (``metrics.json``, its summary table and figures) read the registry
(:func:`list_metrics`). A metric that is undefined for the data (fewer than 2 classes, no real
token, no attention captured) is ``None``. Padded captures (graphs) are handled exactly: per-sequence
metrics are computed on groups of equal length, pooled quantities on the real tokens only.
"""

from __future__ import annotations

import difflib
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import Tensor

from diffusionformer.analysis.capture import IGNORE_INDEX, LayerCapture
from diffusionformer.analysis.metrics import (
    _anova_of_lengths,
    _check_flag,
    _is_int,
    _times_pow2,
    _unit_scale,
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
from diffusionformer.config import _choice_hint

__all__ = ["GROUPS", "LayerReport", "LayerView", "Metric", "layer_reports", "list_metrics", "register_metric", "unregister_metric",
           "SMOOTHING_METRICS", "SPECTRAL_METRICS", "SEQUENCE_LABEL_METRICS", "TOKEN_LABEL_METRICS"]

_RANK_RTOL = 1e-6
#: the epsilon of the half precision a capture's tokens were computed in (``LayerCapture.extra["precision"]``)
_PRECISION_EPS = {"bfloat16": torch.finfo(torch.bfloat16).eps, "float16": torch.finfo(torch.float16).eps}


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
    # around each sequence's first token (real tokens are a prefix; an empty sequence's mean is 0), so a sequence of
    # equal tokens has exactly that token as its mean: its centred tokens are 0, not a spectrum of rounding noise
    if mask is None:
        first = X[:, 0]
        return first + (X - first.unsqueeze(1)).mean(dim=1)
    m = mask.to(X.dtype).unsqueeze(-1)
    first = X[:, 0] * m[:, 0]
    return first + ((X - first.unsqueeze(1)) * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)


def _num_classes(y: Tensor, min_count: int = 1) -> int:
    _, counts = torch.unique(y, return_counts=True)
    return int((counts >= min_count).sum())


def _spectrum_summary(s: Tensor, rtol: float = _RANK_RTOL) -> dict[str, float | None]:
    s = s.sort(descending=True).values
    out: dict[str, float | None] = {
        "effective_rank": float(effective_rank(s)),
        "stable_rank": float(stable_rank(s)),
        "energy_top3": float(energy_top_k(s, min(3, s.numel()))),
        "power_law_alpha": None,
    }
    if s.numel() and s[0] > 0:
        r = int((s > rtol * s[0]).sum())
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
    real = lengths[:A] > 0  # an empty sequence (graph) has no energy to average (0 / 0), as in LayerView.per_sequence
    if not bool(real.any()):
        return None
    if cap.attention_edges is not None and block in cap.attention_edges:
        nodes = _valid(X[:A], None if cap.mask is None else cap.mask[:A])
        seq = torch.arange(A).repeat_interleave(lengths[:A])
        energy = dirichlet_energy(nodes, edge_index=cap.attention_edges[block], edge_weight=weights.mean(dim=-1),
                                  batch=seq, num_graphs=A)
        return float(energy[real].mean())
    P, X = weights[:A].mean(dim=1), X[:A]  # (A, T, T), head average
    if cap.mask is not None:  # real tokens only: padded positions (their values, the rows of padded queries) count not
        m = cap.mask[:A].to(X.dtype)
        P, X = P * m.unsqueeze(-1) * m.unsqueeze(-2), X * m.unsqueeze(-1)
    return float(dirichlet_energy(X, P)[real].mean())


# ----------------------------------------------------------------------------- the metric registry
#: the groups of metrics, in report order; a group's metrics are measured only when its data exist
GROUPS = ("smoothing", "spectral", "sequence_label", "token_label")


@dataclass(frozen=True)
class Metric:
    """A token-geometry metric of one layer, as :func:`register_metric` records it.

    Attributes:
        key: its name in :attr:`LayerReport.metrics`, ``metrics.json`` and the tables.
        fn: ``LayerView -> float | None`` (``None`` where undefined for the data).
        group: one of :data:`GROUPS`: ``"smoothing"`` and ``"spectral"`` metrics are measured on
            every capture, ``"sequence_label"`` ones when there is one label per sequence,
            ``"token_label"`` ones when there is one label per token.
        label: what a plot axis says.
        logy: plotted on a log scale.
        panel: its place in the group's figure of the analysis (``None``: not plotted).
        column: its column heading in the analysis summary table (last layer; ``None``: no column).
    """

    key: str
    fn: Callable[["LayerView"], float | None]
    group: str
    label: str
    logy: bool = False
    panel: int | None = None
    column: str | None = None


_METRICS: dict[str, Metric] = {}


def register_metric(
    key: str, *, group: str, label: str | None = None, logy: bool = False, panel: int | None = None,
    column: str | None = None,
) -> Callable[[Callable[["LayerView"], float | None]], Callable[["LayerView"], float | None]]:
    """Decorator: measure ``fn(view)`` as metric ``key`` of every layer :func:`layer_reports` reports.

    The analysis (``metrics.json``, its summary table and figures) reads the registry, so a new
    metric is one registered function::

        @register_metric("token_norm", group="smoothing", label="mean token norm", column="norm")
        def _token_norm(view):
            return float(view.tokens.norm(dim=-1).mean())

    Args:
        key: the metric's name (unique).
        group: one of :data:`GROUPS` (when it is measured).
        label: axis label (default ``key``).
        logy: plot on a log scale.
        panel: its place in the group's figure (``None``: not plotted).
        column: heading of its column in the analysis summary table (``None``: no column).

    Raises:
        ValueError: on a key already registered or an unknown group.
        TypeError: on a ``fn`` that is not callable, or a ``panel``, ``label`` or ``column`` of the wrong type.

    :func:`layer_reports` refuses a value that is not a real number or ``None`` (``TypeError``) and a NaN
    (``ValueError``; return ``None`` where the metric is undefined), naming the metric and the layer.
    """
    if not isinstance(key, str) or not key:
        raise TypeError(f"metric key must be a non-empty string, got {key!r}")
    if group not in GROUPS:
        raise ValueError(f"unknown metric group {group!r}{_choice_hint(group, GROUPS)}; expected one of {GROUPS}")
    if key in _METRICS:
        raise ValueError(_taken(key))
    _check_flag(logy, "logy")
    # else stored, and the analysis failed on them (a panel "2" sorted against ints, a label 3 on an axis)
    if panel is not None and not _is_int(panel):
        raise TypeError(f"metric {key!r}: panel must be an int or None, got {type(panel).__name__} ({panel!r})")
    for name, value in (("label", label), ("column", column)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"metric {key!r}: {name} must be a str or None, got {type(value).__name__} ({value!r})")

    def register(fn: Callable[["LayerView"], float | None]) -> Callable[["LayerView"], float | None]:
        if not callable(fn):  # else stored, and every later report failed with "'int' object is not callable"
            raise TypeError(f"metric {key!r}: register_metric decorates a function of a LayerView, got "
                            f"{type(fn).__name__} ({fn!r})")
        if key in _METRICS:  # again when applied: two decorators made before either was applied, or one applied twice
            raise ValueError(_taken(key))
        _METRICS[key] = Metric(key, fn, group, label or key, logy, panel, column)
        return fn

    return register


def _taken(key: str) -> str:
    """The message for a metric key already registered: how to replace it (a notebook cell run twice)."""
    return (f"metric {key!r} is already registered; to replace it (a function defined again), call "
            f"unregister_metric({key!r}) first")


def _checked_value(metric: Metric, layer: int, value: Any) -> float | None:
    """A registered metric's value as a float (``None``: undefined), else an error naming the metric and layer: a
    NaN was read as collapse, a tensor, a string or a bool went into ``metrics.json`` and the tables."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        hint = " (use float(...))" if isinstance(value, Tensor) else ""
        raise TypeError(f"metric {metric.key!r} (layer {layer}) must return a float or None, got "
                        f"{type(value).__name__} ({value!r}){hint}")
    if math.isnan(value):
        raise ValueError(f"metric {metric.key!r} (layer {layer}) returned NaN; return None where it is undefined for "
                         "the data")
    return float(value)


def unregister_metric(key: str) -> Metric:
    """Remove metric ``key`` from the registry and return it (``KeyError`` listing the known keys if absent)."""
    if not isinstance(key, str):  # else "unhashable type: 'list'"
        raise TypeError(f"metric key must be a string, got {type(key).__name__} ({key!r})")
    if key not in _METRICS:
        close = difflib.get_close_matches(str(key), list(_METRICS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise KeyError(f"no metric {key!r}{hint}; registered: {sorted(_METRICS)}")
    return _METRICS.pop(key)


def list_metrics(group: str | None = None) -> list[Metric]:
    """The registered metrics in report order (by group, then as registered), optionally of one group."""
    if group is not None and group not in GROUPS:
        raise ValueError(f"unknown metric group {group!r}{_choice_hint(group, GROUPS)}; expected one of {GROUPS}")
    return [m for g in GROUPS if group in (None, g) for m in _METRICS.values() if m.group == g]


class LayerView:
    """One captured layer as metric functions see it (float64, CPU); shared work is computed once.

    Attributes:
        capture: the :class:`~diffusionformer.analysis.capture.LayerCapture`.
        layer: residual-stream index.
        X: ``(B, T, D)`` tokens (padded for graphs; see ``mask``).
        lengths: ``(B,)`` real tokens per sequence.
        mask: ``(B, T)`` real-token mask, ``None`` when unpadded.
        tokens: ``(N, D)`` the real tokens, row-major.
        means: ``(B, D)`` per-sequence means of the real tokens.
        seq_of_token: ``(N,)`` the sequence of each real token.
        seq_labels: ``(B,)`` one label per sequence, or ``None``.
        tok_labels: ``(B, T)`` one label per token (``-100`` = none), or ``None``.
        predictions: ``(B,)`` the model's predicted classes, or ``None``.
        probe_seed: seed of the linear probes' split.
    """

    def __init__(self, capture: LayerCapture, layer: int, lengths: Tensor, seq_labels: Tensor | None,
                 tok_labels: Tensor | None, predictions: Tensor | None, probe_seed: int) -> None:
        self.capture, self.layer, self.lengths = capture, layer, lengths
        self.mask = capture.mask
        self.X = capture.states[layer].to(torch.float64)
        self.tokens = _valid(self.X, self.mask)
        self.means = _sequence_means(self.X, self.mask)
        self.seq_of_token = torch.arange(self.X.shape[0]).repeat_interleave(lengths)
        self.seq_labels, self.tok_labels, self.predictions, self.probe_seed = seq_labels, tok_labels, predictions, probe_seed
        self._cache: dict[str, Any] = {}

    def cached(self, name: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per layer for every metric that shares it."""
        if name not in self._cache:
            self._cache[name] = compute()
        return self._cache[name]

    def per_sequence(self, fn: Callable[[Tensor], Tensor], min_len: int = 1) -> float | None:
        """Mean of ``fn`` (one value per sequence of a ``(b, n, D)`` block) over the non-empty sequences of at
        least ``min_len`` tokens (an empty sequence is never handed to ``fn``, whatever ``min_len``)."""
        return _mean_per_sequence(fn, self.X, self.lengths, min_len)

    @property
    def singular_values(self) -> Tensor:
        """``(R,)`` spectrum of the sequence-centred tokens pooled over sequences, descending."""
        return self.cached("svd", lambda: torch.linalg.svdvals(self.tokens - self.means[self.seq_of_token]))


# built-in metrics, in report order (the order of SMOOTHING_METRICS ... TOKEN_LABEL_METRICS)
@register_metric("within_variance", group="smoothing", label="within-sequence variance", logy=True, panel=0,
                 column="within-var")
def _within_variance(v: LayerView) -> float | None:
    return v.per_sequence(within_sequence_variance)


@register_metric("variance_ratio", group="smoothing", label="within / total variance", panel=1)
def _variance_ratio(v: LayerView) -> float | None:
    # one exact power-of-two scale for tokens and means (as variance_ratio): squares of float64 tokens of |x| > 1e154
    # overflowed (inf / inf: NaN) and of |x| < 1e-162 underflowed (0 / 0: a ratio of 0, "collapsed")
    if v.tokens.numel() == 0:  # no real token (amax of nothing raises)
        return 0.0
    _, e = torch.frexp(v.tokens.abs().amax())
    tokens, means = _times_pow2(v.tokens, -e), _times_pow2(v.means, -e)
    within = (tokens - means[v.seq_of_token]).pow(2).sum()
    total = (tokens - tokens.mean(dim=0)).pow(2).sum()
    return min(float(within / total), 1.0) if total > 0 else 0.0  # == variance_ratio(X, "pooled") unpadded


@register_metric("mean_cosine", group="smoothing", label="mean pairwise cosine", panel=4)
def _mean_cosine(v: LayerView) -> float | None:
    return v.per_sequence(mean_pairwise_cosine, min_len=2)


@register_metric("high_frequency_ratio", group="smoothing", label="high-frequency ratio")
def _high_frequency_ratio(v: LayerView) -> float | None:
    return v.per_sequence(high_frequency_ratio)


@register_metric("rank_collapse_svd", group="smoothing", label="rank-1 residual (SVD)", panel=5)
def _rank_collapse_svd(v: LayerView) -> float | None:
    return v.per_sequence(lambda g: rank_collapse_residual(g, "svd"))


@register_metric("dirichlet_complete", group="smoothing", label="Dirichlet energy, complete graph", logy=True, panel=2,
                 column="Dirichlet (complete)")
def _dirichlet_complete(v: LayerView) -> float | None:
    return v.per_sequence(dirichlet_energy)


@register_metric("dirichlet_attention", group="smoothing", label="Dirichlet energy, attention graph", logy=True, panel=3,
                 column="Dirichlet (attention)")
def _dirichlet_attention_metric(v: LayerView) -> float | None:
    return _dirichlet_attention(v.capture, v.layer, v.X, v.lengths)


def _spectrum(v: LayerView) -> dict[str, float | None]:
    # below eps s_1 of a half-precision capture, a singular value is within the tokens' rounding: bfloat16 lifted the
    # exact zeros of a rank-20 embedding to ~1e-3 s_1, and power_law_alpha was fitted to that noise (2.1 read 5.7)
    precision = v.capture.extra.get("precision")
    rtol = max(_RANK_RTOL, _PRECISION_EPS.get(precision, 0.0) if isinstance(precision, str) else 0.0)
    return v.cached("spectrum", lambda: _spectrum_summary(v.singular_values, rtol))


@register_metric("effective_rank", group="spectral", label="effective rank", column="eff. rank")
def _effective_rank(v: LayerView) -> float | None:
    return _spectrum(v)["effective_rank"]


@register_metric("stable_rank", group="spectral", label="stable rank")
def _stable_rank(v: LayerView) -> float | None:
    return _spectrum(v)["stable_rank"]


@register_metric("energy_top3", group="spectral", label="energy of the top 3 directions")
def _energy_top3(v: LayerView) -> float | None:
    return _spectrum(v)["energy_top3"]


@register_metric("power_law_alpha", group="spectral", label="power-law exponent alpha")
def _power_law_alpha(v: LayerView) -> float | None:
    return _spectrum(v)["power_law_alpha"]


def _anova(v: LayerView) -> tuple[float, float, float] | None:
    """ANOVA fractions of the real tokens (a padded capture's sequences of unequal lengths weighted by their
    tokens, :func:`~diffusionformer.analysis.metrics._anova_of_lengths`), scaled by a power of two (the fractions
    are scale-free; float64 tokens of |x| > 1e154 gave inf / inf = NaN). ``None`` without a real token."""
    def compute() -> tuple[float, float, float] | None:
        if v.mask is None:
            return anova_decomposition(_unit_scale(v.X, dim=(0, 1, 2)), v.seq_labels).fractions
        if v.tokens.shape[0] == 0:
            return None
        return _anova_of_lengths(_unit_scale(v.tokens, dim=(0, 1)), v.lengths, v.seq_labels).fractions

    return v.cached("anova", compute)


def _sequences(v: LayerView) -> tuple[Tensor, Tensor, Tensor | None]:
    """Means, labels and predictions of the sequences with at least one real token: a padded batch may hold an
    empty graph, whose mean (zero) is no point of the class geometry and would count in NC and the probe."""
    keep = v.lengths > 0
    if bool(keep.all()):
        return v.means, v.seq_labels, v.predictions
    return v.means[keep], v.seq_labels[keep], None if v.predictions is None else v.predictions[keep]


def _collapse(v: LayerView) -> Any:
    """Neural Collapse of the sequence means (``None`` with fewer than 2 classes)."""
    def compute() -> Any:
        means, labels, predictions = _sequences(v)
        return neural_collapse(means, labels, predictions) if _num_classes(labels) >= 2 else None

    return v.cached("nc", compute)


def _register_anova(key: str, index: int, label: str, panel: int | None) -> None:
    def fraction(v: LayerView) -> float | None:
        fractions = _anova(v)
        return None if fractions is None else fractions[index]

    register_metric(key, group="sequence_label", label=label, panel=panel)(fraction)


def _register_collapse(key: str, attr: str, label: str, logy: bool = False, panel: int | None = None,
                       column: str | None = None) -> None:
    def value(v: LayerView) -> float | None:
        nc = _collapse(v)
        return None if nc is None else getattr(nc, attr)

    register_metric(key, group="sequence_label", label=label, logy=logy, panel=panel, column=column)(value)


_register_anova("anova_within_fraction", 0, "within-sequence share of scatter", 5)
_register_anova("anova_between_sequence_fraction", 1, "between-sequence share of scatter", None)
_register_anova("anova_between_class_fraction", 2, "between-class share of scatter", 4)
_register_collapse("nc1", "nc1", "NC1 of sequence means", logy=True, panel=0, column="nc1")
_register_collapse("nc2_equinorm", "equinorm", "NC2: equinorm")
_register_collapse("nc2_equiangularity", "equiangularity", "NC2: equiangularity")
_register_collapse("nc2_etf_distance", "etf_distance", "NC2: distance to simplex ETF", panel=1)
_register_collapse("nc4_agreement", "ncc_agreement", "NC4: NCC = model prediction", panel=2)


@register_metric("seq_probe_acc", group="sequence_label", label="linear probe on sequence means", panel=3)
def _seq_probe_acc(v: LayerView) -> float | None:
    means, labels, _ = _sequences(v)
    if _num_classes(labels) < 2 or means.shape[0] < 4:
        return None
    return _probe(means, labels, v.probe_seed)


def _token_labelled(v: LayerView) -> tuple[Tensor, Tensor]:
    """The real tokens that have a label, and their labels."""
    def compute() -> tuple[Tensor, Tensor]:
        y = _valid(v.tok_labels.unsqueeze(-1), v.mask).squeeze(-1)
        keep = y.long() != IGNORE_INDEX  # in int64: uint8 labels compared with -100 wrapped it to label 156
        return v.tokens[keep], y[keep]

    return v.cached("token_labels", compute)


@register_metric("token_nc1", group="token_label", label="NC1, class = next token / token label", logy=True, panel=0,
                 column="token_nc1")
def _token_nc1(v: LayerView) -> float | None:
    feats, y = _token_labelled(v)
    return next_token_nc1(feats, y, min_count=2) if _num_classes(y, 2) >= 2 else None


@register_metric("token_probe_acc", group="token_label", label="linear probe accuracy (token label)", panel=1)
def _token_probe_acc(v: LayerView) -> float | None:
    feats, y = _token_labelled(v)
    return _probe(feats, y, v.probe_seed) if y.numel() >= 4 else None


#: the built-in metrics of each group, in report order (the registry may hold more: :func:`list_metrics`)
SMOOTHING_METRICS = tuple(m.key for m in list_metrics("smoothing"))
SPECTRAL_METRICS = tuple(m.key for m in list_metrics("spectral"))
SEQUENCE_LABEL_METRICS = tuple(m.key for m in list_metrics("sequence_label"))
TOKEN_LABEL_METRICS = tuple(m.key for m in list_metrics("token_label"))


def _check_dense_attentions(capture: LayerCapture) -> None:
    """The dense attention maps that ``dirichlet_attention`` averages over heads, ``(A, H, T, T)`` with
    ``A = capture.num_attention_examples <= B`` (the first ``A`` of them are read): head-averaged maps ``(A, T, T)``
    were averaged again over their queries (a wrong energy when ``A == T``, else an error about a ``P`` the caller
    never passed)."""
    A = capture.num_attention_examples
    if A == 0:  # none measured
        return
    B, T = capture.states[capture.layers[0]].shape[:2]
    for i, P in capture.attentions.items():  # type: ignore[union-attr]
        if capture.attention_edges is not None and i in capture.attention_edges:
            continue
        if not isinstance(P, Tensor) or P.ndim != 4 or P.shape[0] < A or P.shape[-2:] != (T, T) or A > B:
            got = tuple(P.shape) if isinstance(P, Tensor) else type(P).__name__
            raise ValueError(
                f"capture.attentions[{i}] must hold one map per head for the first A = {A} sequences "
                f"(capture.extra['num_attention_examples'], at most B = {B}), shape ({A}, H, {T}, {T}), got {got}")


def _check_capture_shapes(capture: LayerCapture) -> None:
    """Every layer ``(B, T, D)`` with the same non-empty ``B`` and ``T``, and ``mask`` a ``(B, T)`` bool prefix mask:
    else a ValueError naming the layer (not an error deep inside a metric about an argument the user never passed, or,
    for a mask that is not a prefix, metrics of the wrong tokens)."""
    first = capture.layers[0]
    for layer in capture.layers:
        x = capture.states[layer]
        if not isinstance(x, Tensor) or x.ndim != 3 or 0 in x.shape:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"capture.states[{layer}] must hold tokens of shape (B, T, D) with B, T, D >= 1, got {got}")
        if x.shape[:2] != capture.states[first].shape[:2]:
            raise ValueError(f"capture.states[{layer}] has {tuple(x.shape[:2])} (B, T) but capture.states[{first}] has "
                             f"{tuple(capture.states[first].shape[:2])}: every layer must hold the same sequences")
    _check_dense_attentions(capture)
    mask = capture.mask
    if mask is None:
        return
    B, T = capture.states[first].shape[:2]
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (B, T):
        got = f"{mask.dtype} of shape {tuple(mask.shape)}" if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"capture.mask must be a bool tensor of shape ({B}, {T}) (True = a real token), got {got}")
    if not bool(mask.any()):  # else "s must be non-empty" from a spectrum, an argument the user never passed
        raise ValueError(f"capture.mask marks no real token (all {B * T} are padding): there is nothing to measure")
    if T > 1 and bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        raise ValueError("capture.mask must mark a prefix of each row (real tokens first, then padding), got a row "
                         f"with a real token after padding: row {int((mask[:, 1:] & ~mask[:, :-1]).any(dim=1).nonzero()[0])}")


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

    Raises:
        ValueError: a captured layer holds NaN or inf values (the message names the layer).

    Examples:
        >>> X = torch.tensor([[[1.0, 0.0], [-1.0, 0.0]], [[3.0, 1.0], [3.0, 1.0]]])
        >>> cap = LayerCapture({0: X}, labels=torch.tensor([0, 1]))
        >>> r = layer_reports(cap)[0].metrics
        >>> r["within_variance"], r["dirichlet_complete"], r["nc1"]
        (0.5, 0.5, 0.0)
    """
    if not isinstance(capture, LayerCapture):
        raise TypeError(f"capture must be a LayerCapture, got {type(capture).__name__}")
    if not capture.states:  # else an IndexError from capture.lengths()
        raise ValueError("capture.states must hold at least one layer's tokens (B, T, D), got none")
    _check_capture_shapes(capture)
    lengths = capture.lengths()
    labels = capture.labels
    if labels is not None and (not isinstance(labels, Tensor) or labels.is_floating_point() or labels.is_complex()):
        # else "y must hold integer class labels" from inside neural_collapse, an argument the user never passed
        got = f"dtype {labels.dtype}" if isinstance(labels, Tensor) else type(labels).__name__
        raise TypeError(f"capture.labels must be a tensor of integer class labels, got {got}")
    seq_labels = labels if labels is not None and labels.ndim == 1 else None
    tok_labels = labels if labels is not None and labels.ndim == 2 else None
    if seq_labels is not None and seq_labels.shape[0] != capture.num_examples:
        raise ValueError(f"capture.labels must have one label per sequence ({capture.num_examples},), "
                         f"got {tuple(seq_labels.shape)}")
    B = capture.num_examples
    T = capture.states[capture.layers[0]].shape[1]
    if labels is not None and labels.ndim != 1 and tuple(labels.shape) != (B, T):
        raise ValueError(f"capture.labels must have one label per sequence ({B},) or per token ({B}, {T}), "
                         f"got {tuple(labels.shape)}")
    if predictions is not None and (not isinstance(predictions, Tensor) or predictions.shape != (B,)):
        # a numpy array's shape alone would read "must have shape (4,), got (4,)"
        got = (repr(predictions.shape) if isinstance(predictions, Tensor)
               else f"{type(predictions).__name__}, not a tensor")
        raise ValueError(f"predictions must have shape ({B},), got {got}")
    if not _is_int(probe_seed):  # numpy ints too (torch.Generator.manual_seed refuses them)
        raise TypeError(f"probe_seed must be an int, got {type(probe_seed).__name__} ({probe_seed!r})")
    probe_seed = int(probe_seed)
    measured = [g for g, present in zip(GROUPS, (True, True, seq_labels is not None, tok_labels is not None)) if present]
    reports = []
    for layer in capture.layers:
        view = LayerView(capture, layer, lengths, seq_labels, tok_labels, predictions, probe_seed)
        if not bool(torch.isfinite(view.X).all()):  # else a metric deep inside says "X holds NaN", no layer named
            raise ValueError(f"capture.states[{layer}] (layer {layer}) holds NaN or inf values, e.g. from a diverged "
                             "model: its token-geometry metrics are undefined")
        m: dict[str, float | None] = {metric.key: _checked_value(metric, layer, metric.fn(view))
                                      for g in measured for metric in list_metrics(g)}
        reports.append(LayerReport(layer, m, view.singular_values.to(torch.float32)))
    return reports
