r"""Statistics of a comparison: paired differences over seeds, their intervals and p-values.

Every setting of a comparison is trained with the same seeds, and a seed fixes the initial
weights (but for differential heads, whose lambda vectors are drawn first), the batches and the dropout masks
(and, for k-fold tasks, the test fold). Runs of
two settings with the same seed are therefore **pairs**: the difference
:math:`d_s = a_s - b_s` cancels what the seed contributes to both, and the analysis is on the
:math:`n` differences.

- :func:`paired_difference`: mean difference :math:`\bar d`, its standard error
  :math:`s_d / \sqrt n`, a :math:`(1-\alpha)` confidence interval
  :math:`\bar d \pm t_{1-\alpha/2,\,n-1}\, s_d/\sqrt n`, the paired t statistic, its
  degrees of freedom :math:`n - 1` and two-sided p, with the Wilcoxon signed-rank p beside it
  (:func:`wilcoxon_p`: exact for up to 50 non-zero differences, ties included).
- :func:`nadeau_bengio`: the same for k-fold cross-validation, with the variance corrected
  for the overlap of the folds' training sets (Nadeau and Bengio, 2003):
  :math:`\hat\sigma^2 = (1/n + n_2/n_1)\, s_d^2` with :math:`n_2/n_1` the test/train size
  ratio, :math:`1/(K-1)` for K-fold (``n`` counts passes as fresh partitions: repeats of one are optimistic).
- :func:`welch_difference`: unpaired, for runs that do not pair; Welch's t with the
  Welch-Satterthwaite degrees of freedom.
- :func:`holm` and :func:`benjamini_hochberg`: p-values adjusted over the comparisons of a
  page (family-wise error rate, resp. false discovery rate).

Degenerate inputs give defined outputs, never NaN: fewer than two pairs give a
:class:`Difference` with only ``n`` and (for one pair) ``mean``; differences with no spread
(:math:`s_d = 0`, or equal up to :data:`RELATIVE_RESOLUTION` of each pair's own values, the float32
rounding of logged metrics; unpaired: each side's spread below that of its own values) have no t distribution, so ``t`` and ``p`` are ``None`` unless every
difference is zero (then ``t = 0``, ``p = 1``); the Wilcoxon p stays defined in both cases. The bare :func:`welch_t` and
:func:`paired_t` give the same ``t`` (``0.0`` when every difference is zero, else ``None``). scipy's ``ttest_ind``/``ttest_rel`` give NaN for
the all-zero case and ``±inf`` with ``p = 0`` for equal non-zero differences; ``None`` p-values count as ``p = 1`` in
:func:`holm` and :func:`benjamini_hochberg` (never significant).

The distribution functions are scipy's (``scipy.special.stdtr``, ``stdtrit``, ``ndtr``);
scipy comes with the ``experiments`` extra.
"""

from __future__ import annotations

import math
import numbers
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

__all__ = ["Difference", "benjamini_hochberg", "compare_rows", "difference_t", "holm", "nadeau_bengio", "paired_difference",
           "paired_t", "welch_difference", "welch_t", "wilcoxon_p"]


@dataclass(frozen=True)
class Difference:
    """A difference of two settings' means with its uncertainty.

    ``mean`` is :math:`\\bar a - \\bar b` (for paired data the mean of the differences);
    ``low, high`` bound its ``level`` confidence interval; ``t`` is ``mean / se`` with ``df``
    degrees of freedom and two-sided ``p``; ``p_wilcoxon`` is the Wilcoxon signed-rank p of the
    paired differences (``None`` for unpaired data). ``method`` is ``"paired t"``,
    ``"Nadeau-Bengio"`` or ``"Welch"``; ``note`` says why a field is ``None``.
    """

    method: str
    n: int
    mean: float | None = None
    se: float | None = None
    low: float | None = None
    high: float | None = None
    df: float | None = None
    t: float | None = None
    p: float | None = None
    p_wilcoxon: float | None = None
    level: float = 0.95
    note: str = ""


_SCIPY_HINT = 'pip install "diffusionformer[experiments]"'


def _scipy_special() -> Any:
    """``scipy.special``, or a ModuleNotFoundError naming what needs it and the extra that installs it (a bare
    ``No module named 'scipy'`` from inside this module named neither)."""
    try:
        import scipy.special
    except ImportError as exc:
        raise ModuleNotFoundError(f"the p-values and confidence intervals of the results tables need scipy "
                                  f"({exc}): {_SCIPY_HINT}", name="scipy") from exc
    return scipy.special


def _require_scipy(seeds: int, consequence: str) -> None:
    """Refuse up front, with :func:`_scipy_special`'s error and ``consequence`` (``"nothing was trained"``), a
    comparison of ``seeds`` seeds whose tables need scipy's t distribution (two seeds or more) where scipy is missing:
    not once the runs have trained, or a page's files have been copied."""
    if seeds > 1:
        try:
            _scipy_special()
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(f"{exc}; {consequence}", name=exc.name) from None


def _t_sf2(t: float, df: float) -> float:
    """Two-sided p of ``t`` under Student's t with ``df`` degrees of freedom: :math:`2 P(T > |t|)`."""
    return float(min(1.0, 2.0 * _scipy_special().stdtr(df, -abs(t))))


def _t_quantile(q: float, df: float) -> float:
    return float(_scipy_special().stdtrit(df, q))


def _check_level(level: float) -> float:
    """``level`` as a float in (0, 1) (numpy floats too), else a ValueError."""
    if isinstance(level, bool) or not (isinstance(level, numbers.Real) and 0.0 < level < 1.0):
        raise ValueError(f"level must be a probability in (0, 1), e.g. 0.95; got {level!r}")
    return float(level)


def _finish(method: str, n: int, mean: float, se: float, df: float, level: float, p_wilcoxon: float | None) -> Difference:
    """A :class:`Difference` from its mean, standard error and degrees of freedom (``se`` may be 0)."""
    if se == 0.0:
        if mean == 0.0:
            return Difference(method, n, 0.0, 0.0, 0.0, 0.0, df, 0.0, 1.0, p_wilcoxon, level, "all differences are zero")
        return Difference(method, n, mean, 0.0, mean, mean, df, None, None, p_wilcoxon, level,
                          "no spread: the differences are all equal, so t and p are undefined")
    half = _t_quantile(0.5 + level / 2.0, df) * se
    t = mean / se
    return Difference(method, n, mean, se, mean - half, mean + half, df, t, _t_sf2(t, df), p_wilcoxon, level)


#: a spread below this fraction of the values' magnitude counts as none: logged metrics are
#: float32 (relative rounding 6e-8), so "equal" differences such as 3 more correct nodes out of
#: 200 on every seed differ in the last bits, and their t would be a rounding artefact
RELATIVE_RESOLUTION = 1e-6


def _fmean(values: Sequence[float]) -> float:
    """``statistics.fmean``, also of values near the float maximum: their sum overflows (``fsum`` raises
    ``OverflowError``), their mean does not, so they are then averaged relative to the largest."""
    try:
        return statistics.fmean(values)
    except OverflowError:
        scale = max(map(abs, values))
        return statistics.fmean([x / scale for x in values]) * scale


def _no_spread(spread: float, values: Sequence[float]) -> bool:
    return spread <= RELATIVE_RESOLUTION * max([1e-300, *map(abs, values)])


def _no_spread_either(a: list[float], b: list[float]) -> bool:
    """Neither side of an unpaired comparison spreads beyond the rounding of its own values (the other side's
    magnitude, e.g. a diverged setting's, does not blur it)."""
    return _no_spread(statistics.stdev(a), a) and _no_spread(statistics.stdev(b), b)


def _check_mappings(a: Any, b: Any) -> None:
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        raise TypeError(f"paired values must be mappings seed -> value, got {type(a).__name__} and {type(b).__name__}")


def _refuse_keyed(value: Any, expected: str, per: str) -> None:
    """A TypeError saying ``expected`` for a mapping (its keys, the seeds or names, would be read as the values) or a
    str (its characters)."""
    if isinstance(value, (Mapping, str)):
        raise TypeError(f"{expected}, got {type(value).__name__} (for {per} pass list(mapping.values()))")


def _check_sequences(a: Any, b: Any) -> None:
    """A TypeError when a side of an unpaired comparison is a mapping (its keys, the seeds, would be the values) or a str."""
    if isinstance(a, (Mapping, str)) or isinstance(b, (Mapping, str)):
        raise TypeError(f"unpaired values must be sequences of values, got {type(a).__name__} and {type(b).__name__} "
                        "(for values per seed use paired_difference, or pass list(mapping.values()))")


def _pairs(a: Mapping[Any, float], b: Mapping[Any, float]) -> tuple[list[float], list[float]]:
    _check_mappings(a, b)
    keys = sorted(set(a) & set(b))
    d = [float(a[k]) - float(b[k]) for k in keys]
    bad = [k for k, x in zip(keys, d) if not math.isfinite(x)]
    if bad:
        past = [k for k in bad if math.isfinite(float(a[k])) and math.isfinite(float(b[k]))]
        if past:  # finite values whose difference overflows (values near the float maximum of opposite signs)
            raise ValueError(f"non-finite paired differences for seeds {past}: finite values whose difference is "
                             f"past the float range (e.g. {float(a[past[0]])!r} - {float(b[past[0]])!r})")
        raise ValueError(f"non-finite paired values for seeds {bad}")
    return d, [float(a[k]) for k in keys] + [float(b[k]) for k in keys]


def paired_difference(a: Mapping[Any, float], b: Mapping[Any, float], *, level: float = 0.95,
                      test_train_ratio: float | None = None) -> Difference:
    r"""Paired comparison of ``a - b`` over the seeds (keys) both have.

    .. math::
        \bar d = \frac1n \sum_s (a_s - b_s),\quad
        \mathrm{se} = s_d \sqrt{1/n + \rho},\quad
        t = \bar d / \mathrm{se},\quad \mathrm{df} = n - 1,\quad
        \bar d \pm t_{(1+\mathrm{level})/2,\,n-1}\,\mathrm{se}

    with :math:`s_d` the sample standard deviation of the differences and :math:`\rho = 0`
    (the paired t test, as ``scipy.stats.ttest_rel``) or :math:`\rho = n_2/n_1` (the
    Nadeau-Bengio corrected resampled t, :func:`nadeau_bengio`). The Wilcoxon signed-rank p of
    the differences (:func:`wilcoxon_p`) is given beside the t test's.

    Args:
        a, b: value per seed of the two settings (seeds only one side has are ignored).
        level: confidence level of the interval.
        test_train_ratio: :math:`n_2/n_1` for the Nadeau-Bengio correction (``None``: plain paired t).

    Returns:
        A :class:`Difference` (``method`` ``"paired t"`` or ``"Nadeau-Bengio"``).

    Examples:
        >>> r = paired_difference({0: 0.8, 1: 0.6, 2: 0.7}, {0: 0.7, 1: 0.55, 2: 0.62})
        >>> round(r.mean, 4), round(r.t, 2), r.df, round(r.p, 4), r.p_wilcoxon
        (0.0767, 5.28, 2, 0.0341, 0.25)
    """
    level = _check_level(level)
    if test_train_ratio is not None:
        if (isinstance(test_train_ratio, bool) or not isinstance(test_train_ratio, numbers.Real)
                or not 0 < test_train_ratio < math.inf):
            raise ValueError(f"test_train_ratio must be a positive number (n_test / n_train, finite), "
                             f"got {test_train_ratio!r}")
        test_train_ratio = float(test_train_ratio)
    method = "paired t" if test_train_ratio is None else "Nadeau-Bengio"
    d, values = _pairs(a, b)
    n = len(d)
    if n < 2:
        return Difference(method, n, d[0] if d else None, level=level,
                          note=f"{n} pair(s): at least 2 seeds both settings share are needed")
    mean = _fmean(d)
    sd = statistics.stdev(d)
    resolved = _resolved(d, values)  # each pair against its own rounding: a diverged seed blurs no other pair
    if len(set(resolved)) == 1:
        sd = 0.0
        if resolved[0] == 0.0:
            mean = 0.0
    se = sd * math.sqrt(1.0 / n + (test_train_ratio or 0.0))
    return _finish(method, n, mean, se, n - 1, level, wilcoxon_p(resolved))


def _resolved(d: list[float], values: list[float]) -> list[float]:
    """The differences ``d`` of the pairs ``(values[i], values[n + i])`` for the ranks: one within
    :data:`RELATIVE_RESOLUTION` of its own pair's values is zero, and sizes equal up to that resolution tie
    (float32 rounding is relative to each value, so one large pair, e.g. a diverged seed, blurs no other pair)."""
    n = len(d)
    tol = [RELATIVE_RESOLUTION * max(abs(values[i]), abs(values[n + i])) for i in range(n)]
    out = [0.0 if abs(x) <= t else x for x, t in zip(d, tol)]
    order = sorted(range(n), key=lambda i: abs(out[i]))
    group_tol = 0.0  # the largest resolution among the tie of the one below (it set that tie's size)
    for prev, i in zip(order, order[1:]):  # by size: each joins the tie of the one below it when within resolution
        group_tol = max(group_tol, tol[prev])
        if out[prev] != 0.0 and abs(out[i]) - abs(out[prev]) <= max(tol[i], group_tol):
            out[i] = math.copysign(abs(out[prev]), out[i])
        else:
            group_tol = 0.0
    return out


def nadeau_bengio(a: Mapping[Any, float], b: Mapping[Any, float], folds: int, *, level: float = 0.95,
                  test_train_ratio: float | None = None) -> Difference:
    r"""Nadeau-Bengio corrected resampled t for K-fold cross-validation (Nadeau and Bengio, 2003).

    The K folds' training sets share :math:`(K-2)/(K-1)` of their examples, so the fold
    differences are positively correlated and the plain paired t (:math:`s_d^2/n`)
    understates the variance. The corrected variance is :math:`(1/n + n_2/n_1)\, s_d^2` with
    :math:`n_2/n_1` the ratio of test to training examples; for K-fold,
    :math:`n_2/n_1 = (N/K) / (N (K-1)/K) = 1/(K-1)`. (Where part of the training folds is held
    out for model selection, the true ratio is a little larger; pass it as ``test_train_ratio``.)
    With one K-fold pass, ``n = K``. The correction assumes each further pass draws a new partition; repeats of
    the same partition (an experiment's seeds beyond ``folds``: ``data_seed`` fixes it) differ only in
    initialisation and batches, so counting them in ``n`` is optimistic. The result's ``p_wilcoxon`` is the plain
    signed-rank p of the fold differences, not corrected: it treats them as independent, so it overstates the evidence.

    Args:
        a, b: value per fold (seed) of the two settings.
        folds: K.
        level: confidence level.
        test_train_ratio: override :math:`n_2/n_1` (default ``1 / (folds - 1)``).

    Examples:
        >>> r = nadeau_bengio({k: 0.7 + 0.01 * k for k in range(5)}, {k: 0.69 + 0.012 * k for k in range(5)}, 5)
        >>> round(r.t, 3) == round(paired_difference({k: 0.7 + 0.01 * k for k in range(5)},
        ...     {k: 0.69 + 0.012 * k for k in range(5)}).t / (1 + 5 / 4) ** 0.5, 3)
        True
    """
    if not isinstance(folds, numbers.Integral) or isinstance(folds, bool) or folds < 2:
        raise ValueError(f"folds must be an int >= 2, got {folds!r}")
    ratio = 1.0 / (int(folds) - 1) if test_train_ratio is None else test_train_ratio
    return paired_difference(a, b, level=level, test_train_ratio=ratio)


def welch_difference(a: Sequence[float], b: Sequence[float], *, level: float = 0.95) -> Difference:
    r"""Unpaired comparison of ``mean(a) - mean(b)`` by Welch's t.

    .. math::
        \mathrm{se}^2 = s_a^2/n_a + s_b^2/n_b,\qquad
        \mathrm{df} = \frac{\mathrm{se}^4}{(s_a^2/n_a)^2/(n_a-1) + (s_b^2/n_b)^2/(n_b-1)}

    (Welch-Satterthwaite), as ``scipy.stats.ttest_ind(a, b, equal_var=False)``. Unlike the
    pooled t, it does not assume equal variances; with equal sizes the t values agree and
    only the degrees of freedom differ.

    Examples:
        >>> r = welch_difference([1.0, 2.0, 3.0], [0.0, 1.0, 2.0])
        >>> round(r.t, 3), r.df, round(r.p, 3)
        (1.225, 4.0, 0.288)
    """
    level = _check_level(level)
    _check_sequences(a, b)
    a, b = [float(x) for x in a], [float(x) for x in b]
    if not all(map(math.isfinite, a + b)):
        raise ValueError("non-finite values")
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        mean = _fmean(a) - _fmean(b) if na and nb else None
        return Difference("Welch", min(na, nb), mean, level=level,
                          note=f"{na} and {nb} value(s): at least 2 on each side are needed")
    sa, sb = _standard_errors(a, b)
    se = math.hypot(sa, sb)
    mean = _welch_mean(a, b)
    if _no_spread_either(a, b):
        se = 0.0
        mean = 0.0 if _no_spread(abs(mean), a + b) else mean
    if se > 0:  # on the standard errors relative to the larger: their squares neither overflow nor underflow
        va, vb = (sa / max(sa, sb)) ** 2, (sb / max(sa, sb)) ** 2
        df = (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1))
    else:
        df = float(na + nb - 2)
    return _finish("Welch", min(na, nb), mean, se, df, level, None)


def _welch_mean(a: list[float], b: list[float]) -> float:
    """``mean(a) - mean(b)``; a ValueError when it is past the float range (means of opposite signs near the float
    maximum), as :func:`paired_difference` for such a pair: its t would read inf and its p 0."""
    mean = _fmean(a) - _fmean(b)
    if not math.isfinite(mean):
        raise ValueError(f"the difference of the means, {_fmean(a)!r} - {_fmean(b)!r}, is past the float range")
    return mean


def _standard_errors(a: list[float], b: list[float]) -> tuple[float, float]:
    """:math:`s_a / \\sqrt{n_a}` and :math:`s_b / \\sqrt{n_b}`, whose ``hypot`` is Welch's standard error: never the
    variances (a variance of values beyond 1e154 is past the float range, one of values below 1e-154 underflows)."""
    return statistics.stdev(a) / math.sqrt(len(a)), statistics.stdev(b) / math.sqrt(len(b))


def wilcoxon_p(d: Sequence[float]) -> float | None:
    r"""Two-sided Wilcoxon signed-rank p of the differences ``d`` (zeros dropped, ties mid-ranked).

    The statistic is :math:`W^+ = \sum_{d_i > 0} \mathrm{rank}(|d_i|)`. Up to 50 non-zero
    differences its null distribution (every sign pattern equally likely, given the ranks) is
    computed exactly, ties included, and :math:`p = \min(1, 2\min(P(W^+ \le w), P(W^+ \ge w)))`;
    beyond, the normal approximation with the tie correction. With ``n`` non-zero differences the
    smallest attainable p is :math:`2^{1-n}`: 0.25 with three seeds, so the test cannot reject at
    0.05 below six seeds. ``None`` with fewer than two differences; 1.0 when all are zero. A NaN or infinite
    difference is a ``ValueError`` (it has no rank).

    Examples:
        >>> wilcoxon_p([0.1, 0.2, 0.3]), wilcoxon_p([0.1, -0.2, 0.3, 0.4, 0.5])
        (0.25, 0.1875)
    """
    _refuse_keyed(d, "d must be a sequence of differences", "differences per seed")
    d = [float(x) for x in d]
    _check_finite(d, "d")
    if len(d) < 2:
        return None
    nz = [x for x in d if x != 0.0]
    n = len(nz)
    if n == 0:
        return 1.0
    order = sorted(range(n), key=lambda i: abs(nz[i]))
    twice_rank = [0] * n  # ranks doubled, so mid-ranks of ties stay integers
    i = 0
    while i < n:
        j = i
        while j + 1 < n and abs(nz[order[j + 1]]) == abs(nz[order[i]]):
            j += 1
        for k in range(i, j + 1):
            twice_rank[order[k]] = i + j + 2  # 2 * mean of ranks i+1 .. j+1
        i = j + 1
    w = sum(r for r, x in zip(twice_rank, nz) if x > 0)  # doubled W+
    if n <= 50:
        counts = {0: 1}  # doubled W+ -> number of sign patterns
        for r in twice_rank:
            nxt = dict(counts)
            for s, c in counts.items():
                nxt[s + r] = nxt.get(s + r, 0) + c
            counts = nxt
        total = 2**n
        le = sum(c for s, c in counts.items() if s <= w) / total
        ge = sum(c for s, c in counts.items() if s >= w) / total
        return min(1.0, 2.0 * min(le, ge))
    ndtr = _scipy_special().ndtr

    ranks = [r / 2.0 for r in twice_rank]
    mean = n * (n + 1) / 4.0
    ties: dict[float, int] = {}
    for r in ranks:
        ties[r] = ties.get(r, 0) + 1
    var = n * (n + 1) * (2 * n + 1) / 24.0 - sum(c**3 - c for c in ties.values()) / 48.0
    z = (w / 2.0 - mean) / math.sqrt(var)
    return float(min(1.0, 2.0 * ndtr(-abs(z))))


def holm(p: Sequence[float | None]) -> list[float | None]:
    r"""Holm's step-down adjusted p-values (family-wise error rate).

    With the :math:`m` p-values sorted, :math:`p_{(1)} \le \dots \le p_{(m)}`, the adjusted
    value is :math:`\tilde p_{(i)} = \max_{j \le i} \min(1, (m - j + 1)\, p_{(j)})`; rejecting
    where :math:`\tilde p \le \alpha` is Holm's procedure at level :math:`\alpha`. ``None``
    entries (tests that could not be computed) count in :math:`m` as :math:`p = 1` and stay
    ``None``.

    Examples:
        >>> [None if x is None else round(x, 4) for x in holm([0.01, 0.04, 0.03, None])]
        [0.04, 0.09, 0.09, None]
    """
    p = _p_values(p)
    vals = [1.0 if x is None else float(x) for x in p]
    _check_p(vals)
    m = len(vals)
    order = sorted(range(m), key=lambda i: vals[i])
    out: list[float | None] = [None] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * vals[i]))
        out[i] = running
    return [None if x is None else y for x, y in zip(p, out)]


def benjamini_hochberg(p: Sequence[float | None]) -> list[float | None]:
    r"""Benjamini-Hochberg step-up adjusted p-values (false discovery rate).

    :math:`\tilde p_{(i)} = \min_{j \ge i} \min(1, m\, p_{(j)} / j)`; rejecting where
    :math:`\tilde p \le q` controls the false discovery rate at :math:`q` for independent (or
    positively dependent) tests. ``None`` entries count as :math:`p = 1` and stay ``None``.

    Examples:
        >>> [round(x, 4) for x in benjamini_hochberg([0.01, 0.04, 0.03, 0.5])]
        [0.04, 0.0533, 0.0533, 0.5]
    """
    p = _p_values(p)
    vals = [1.0 if x is None else float(x) for x in p]
    _check_p(vals)
    m = len(vals)
    order = sorted(range(m), key=lambda i: vals[i], reverse=True)
    out: list[float | None] = [None] * m
    running = 1.0
    for k, i in enumerate(order):
        rank = m - k  # 1-based rank in ascending order
        running = min(running, min(1.0, m * vals[i] / rank))
        out[i] = running
    return [None if x is None else y for x, y in zip(p, out)]


def _check_finite(values: Sequence[float], name: str) -> None:
    """ValueError naming ``name`` when a value is NaN or infinite (its ranks, mean and spread are undefined)."""
    bad = [x for x in values if not math.isfinite(x)]
    if bad:
        raise ValueError(f"{name} holds non-finite values {bad}: a statistic of them is undefined")


def _p_values(p: Any) -> list[Any]:
    """``p`` as a list (an iterator is read once, so the adjusted values pair with it), each entry a number or ``None``;
    a TypeError for a mapping or str (their keys or characters are no p-values) and for bools or other non-numbers."""
    _refuse_keyed(p, "p must be a sequence of p-values (or None)", "p-values per name")
    p = list(p)
    bad = [x for x in p if x is not None and (isinstance(x, bool) or not isinstance(x, numbers.Real))]
    if bad:
        raise TypeError(f"p-values must be numbers or None, got {bad}")
    return p


def _check_p(vals: list[float]) -> None:
    bad = [x for x in vals if not (0.0 <= x <= 1.0)]
    if bad:
        raise ValueError(f"p-values must lie in [0, 1], got {bad}")


# ----------------------------------------------------------------------------- the bare statistics (kept for callers of runner)
def welch_t(a: Sequence[float], b: Sequence[float]) -> float | None:
    r"""Welch's t statistic of ``mean(a) - mean(b)``: :math:`\Delta / \sqrt{s_a^2/n_a + s_b^2/n_b}`.

    ``None`` when either side has fewer than two values or both spreads are zero (each below
    :data:`RELATIVE_RESOLUTION` of its own side's values) with different means; ``0.0`` when both spreads
    and the difference of the means are zero (as :func:`welch_difference`'s ``t``; ``scipy.stats.ttest_ind``
    gives NaN for this 0/0 and ``±inf`` for the constant non-zero difference). For its
    degrees of freedom, p and interval use :func:`welch_difference`.

    Examples:
        >>> round(welch_t([1.0, 2.0, 3.0], [0.0, 1.0, 2.0]), 3)
        1.225
        >>> welch_t([1.0], [0.0, 1.0]) is None
        True
    """
    _check_sequences(a, b)
    a, b = [float(x) for x in a], [float(x) for x in b]  # numpy ints and float32s: statistics cannot mix them
    _check_finite([*a, *b], "a and b")
    if len(a) < 2 or len(b) < 2:
        return None
    mean = _welch_mean(a, b)
    if _no_spread_either(a, b):  # as welch_difference: t = 0 when the means agree too, else undefined
        return 0.0 if _no_spread(abs(mean), a + b) else None
    return mean / math.hypot(*_standard_errors(a, b))


def paired_t(a: Mapping[int, float], b: Mapping[int, float]) -> float | None:
    r"""Paired t statistic of ``a - b`` over the keys both have: :math:`\bar d / (s_d / \sqrt{n})`.

    ``None`` with fewer than two shared keys or non-zero differences equal up to
    :data:`RELATIVE_RESOLUTION` of their own pairs' values; ``0.0`` when every difference is zero (both as
    :func:`paired_difference`'s ``t``; ``scipy.stats.ttest_rel`` gives NaN for this 0/0 and ``±inf`` for the
    equal non-zero differences). For df, p, the interval
    and the k-fold correction use :func:`paired_difference` / :func:`nadeau_bengio`.

    Examples:
        >>> round(paired_t({0: 0.8, 1: 0.6, 2: 0.7}, {0: 0.7, 1: 0.55, 2: 0.62}), 2)
        5.28
        >>> paired_t({0: 1.0}, {0: 0.0}) is None
        True
    """
    _check_mappings(a, b)
    keys = sorted(set(a) & set(b))
    if len(keys) < 2:
        return None
    _check_finite([float(v) for k in keys for v in (a[k], b[k])], "the paired values")
    d = [float(a[k]) - float(b[k]) for k in keys]  # floats: statistics refuses numpy ints (no bit_length)
    sd = statistics.stdev(d)
    values = [float(a[k]) for k in keys] + [float(b[k]) for k in keys]
    resolved = _resolved(d, values)
    if len(set(resolved)) == 1:  # as paired_difference: t = 0 when every difference is zero, else undefined
        return 0.0 if resolved[0] == 0.0 else None
    return _fmean(d) / (sd / math.sqrt(len(d)))


def difference_t(row: Mapping[str, Any], base: Mapping[str, Any], values: str, paired: bool) -> float | None:
    """t of ``row``'s mean minus ``base``'s for the ``values`` key of ``aggregate`` rows:
    :func:`paired_t` over seeds when ``paired``, else :func:`welch_t`."""
    key = _by_seed_key(values)
    if paired:
        return paired_t(row.get(key, {}), base.get(key, {}))
    return welch_t(row.get(values) or [], base.get(values) or [])  # a side without selected values: no t, as paired


#: the values of an ``aggregate`` row a comparison may read, with the same values per seed
_BY_SEED = {"values": "by_seed", "selected_values": "selected_by_seed"}


def _by_seed_key(values: Any) -> str:
    """The per-seed key of the ``values`` key of an ``aggregate`` row; a ValueError naming the two allowed."""
    if not isinstance(values, str) or values not in _BY_SEED:
        from diffusionformer.config import _choice_hint

        raise ValueError(f"values must be 'values' (the final metric) or 'selected_values' (at the best select_by "
                         f"evaluation), got {values!r}{_choice_hint(values, tuple(_BY_SEED))}")
    return _BY_SEED[values]


def compare_rows(row: Mapping[str, Any], base: Mapping[str, Any], values: str = "values", *,
                 folds: int | None = None, level: float = 0.95) -> Difference:
    """The :class:`Difference` of two ``aggregate`` rows: paired over seeds (Nadeau-Bengio when
    ``folds`` is given), for the final metric (``values``) or the one at the best ``select_by``
    evaluation (``selected_values``)."""
    key = _by_seed_key(values)
    a, b = row.get(key) or {}, base.get(key) or {}
    if folds is not None:
        return nadeau_bengio(a, b, folds, level=level)
    return paired_difference(a, b, level=level)
