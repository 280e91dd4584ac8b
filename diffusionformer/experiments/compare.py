"""The comparisons of a results page: every setting against the baseline, paired over seeds, Holm-adjusted.

A page (one comparison config) holds, per task, one contrast of each operator setting against
the baseline (the config's first setting) for each quantity it reports: the final metric,
the metric at the best ``select_by`` evaluation and the steps to the ``reach`` threshold.
Runs with the same seed pair (same initialisation, batches and, for k-fold tasks, test
fold), so each contrast is a paired difference (:func:`~diffusionformer.experiments.paired_difference`;
:func:`~diffusionformer.experiments.nadeau_bengio` for k-fold tasks). Holm's adjustment
runs over the contrasts of one quantity on the page (all tasks, all settings); when the
config names ``primary`` contrasts, those are adjusted among themselves (the confirmatory
family) and the others, labelled exploratory, over all contrasts of the quantity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from diffusionformer.experiments.config import _QUANTITIES, ExperimentConfig
from diffusionformer.experiments.stats import Difference, compare_rows, holm, nadeau_bengio, paired_difference

__all__ = ["Contrast", "contrasts", "format_ci", "format_p", "format_signed", "table_legend"]

KINDS = _QUANTITIES  # "final", "selected", "reach"


@dataclass
class Contrast:
    """One setting against the baseline on one task, for one quantity (``kind``)."""

    task: str
    setting: str
    baseline: str
    kind: str  #: "final" (metric after the last step), "selected" (at the best select_by evaluation) or "reach" (steps)
    diff: Difference  #: setting minus baseline, paired over seeds
    primary: bool  #: named in the config's ``primary``
    minimize: bool  #: lower is better for this quantity
    p_holm: float | None = None  #: Holm-adjusted p over the page's family (see the module docstring)

    @property
    def role(self) -> str:
        return "primary" if self.primary else "exploratory"


def _reach_by_seed(row: Mapping[str, Any]) -> dict[int, float] | None:
    """Steps to the threshold per seed, or ``None`` when some run never reached it (censored)."""
    by_seed = row.get("reach_by_seed") or {}
    if not by_seed or any(v is None for v in by_seed.values()):
        return None
    return {k: float(v) for k, v in by_seed.items()}


def contrasts(table: Sequence[Mapping[str, Any]], config: ExperimentConfig, *, level: float = 0.95) -> list[Contrast]:
    """Every contrast of the page of ``config`` from ``aggregate`` rows, with Holm-adjusted p.

    Args:
        table: the output of :func:`~diffusionformer.experiments.runner.aggregate`.
        config: the comparison (tasks, settings in order, ``primary``).
        level: confidence level of the intervals.

    Returns:
        Contrasts in task, kind, setting order; a task's ``selected`` contrasts only when it
        has ``select_by``, ``reach`` ones only with ``reach`` (censored pairs: no test, ``p`` None).
        A setting or baseline without values of a kind (every run failed) is listed with no pairs,
        ``p`` None and a note: it is never dropped from the table.
    """
    rows = {(r["task"], r["operator"]): r for r in table}
    baseline = config.operators[0].name
    primary = config.primary_contrasts()
    quantities = getattr(config, "primary_quantities", KINDS)  # e.g. ["final"]: the best-validation value exploratory
    out: list[Contrast] = []
    for task in config.tasks:
        base = rows.get((task.name, baseline))
        if base is None:
            continue
        kinds = ["final"] + (["selected"] if task.select_by else []) + (["reach"] if task.reach else [])
        for kind in kinds:
            for setting in config.operators[1:]:
                row = rows.get((task.name, setting.name))
                if row is None:
                    continue
                if kind == "reach":
                    a, b = _reach_by_seed(row), _reach_by_seed(base)
                    if a is None or b is None:
                        # the method the contrast would have had (k-fold: Nadeau-Bengio), as the table's legend says
                        method = "paired t" if task.folds is None else "Nadeau-Bengio"
                        diff = Difference(method, 0, level=level, note="censored: some run never reached the threshold")
                    elif task.folds is not None:  # k-fold: the same correction as the final metric
                        diff = nadeau_bengio(a, b, task.folds, level=level)
                    else:
                        diff = paired_difference(a, b, level=level)
                    minimize = True
                else:
                    # a side without selected values (every run failed) pairs no seeds: listed with its note,
                    # as the final kind lists a setting whose runs all failed
                    values = "values" if kind == "final" else "selected_values"
                    diff = compare_rows(row, base, values, folds=task.folds, level=level)
                    minimize = task.minimize
                out.append(Contrast(task.name, setting.name, baseline, kind, diff,
                                    (task.name, setting.name) in primary and kind in quantities, minimize))
    for kind in KINDS:
        family = [c for c in out if c.kind == kind]
        for c, p in zip(family, holm([c.diff.p for c in family])):
            c.p_holm = p
        confirm = [c for c in family if c.primary]  # the primary contrasts: adjusted among themselves
        for c, p in zip(confirm, holm([c.diff.p for c in confirm])):
            c.p_holm = p
    return out


def format_p(p: float | None) -> str:
    """A p-value for a table: ``"<0.001"``, three decimals (four next to 0.05, more where four
    would round across it, so that a value just below the 5% level, which the tables mark bold, never reads
    0.050), or ``"n/a"``.

    Examples:
        >>> [format_p(p) for p in (0.0004, 0.0123, 0.0498, 0.0502, 0.051, 0.049996, None)]
        ['<0.001', '0.012', '0.0498', '0.0502', '0.051', '0.049996', 'n/a']
    """
    return _format_p(p)


def _format_p(p: float | None, alpha: float = 0.05) -> str:
    """:func:`format_p` for a table that marks p below ``alpha`` bold: as many more digits as keep a value on its side
    of ``alpha`` (at ``alpha = 0.01``, 0.00996 and 0.0104 both read "0.010", one of them bold), a p in
    ``[0.0495, 0.0505)`` on its side of both 0.05 and ``alpha``, and ``"<0.001"`` only where it says which side
    (``alpha >= 0.001``)."""
    if p is None:
        return "n/a"

    def kept(digits: int, kind: str, *bounds: float) -> str:  # the fewest digits from `digits` that keep p's sides
        def keeps(text: str) -> bool:
            return all((float(text) < b) == (p < b) for b in bounds)

        while digits < 17 and not keeps(f"{p:.{digits}{kind}}"):
            digits += 1
        text = f"{p:.{digits}{kind}}"
        # 17 decimals still round the double just below 0.05 to "0.05000000000000000" (in bold): repr reads back as p
        # (a float's: numpy 2's scalars print "np.float64(...)")
        return text if keeps(text) else repr(float(p))

    if 0.0495 <= p < 0.0505:  # 0.049996: not "0.0500" in bold; and on its side of an alpha next to 0.05 too
        return kept(4, "f", 0.05, alpha)
    if p < 0.001:
        if alpha >= 0.001 or p == 0.0:
            return "<0.001"
        return kept(2, "g", alpha)  # below the shorthand's bound: significant digits
    return kept(3, "f", alpha)


def format_ci(d: Difference, digits: int = 4) -> str:
    """``"[low, high]"`` of a difference, signed, or ``"n/a"``."""
    if d.low is None or d.high is None:
        return "n/a"
    return f"[{format_signed(d.low, digits)}, {format_signed(d.high, digits)}]"


def format_signed(x: float | None, digits: int = 4) -> str:
    """``x`` with its sign, never ``-0.0000`` (``"n/a"`` for None).

    Examples:
        >>> format_signed(-1e-17), format_signed(0.01234, 3)
        ('+0.0000', '+0.012')
    """
    return "n/a" if x is None else f"{round(x, digits) + 0.0:+.{digits}f}"


def table_legend(config: ExperimentConfig, *, compact: bool = False) -> str:
    """What each column of :func:`~diffusionformer.experiments.runner.format_table` means."""
    cv = [t for t in config.tasks if t.folds]
    baseline = config.operators[0].name
    text = (f"mean ± std: over seeds (sample std). Δ: the mean over seeds of the paired difference (setting minus "
            f"{baseline}, same seed = same initialisation and batches); 95% CI: its t interval; p: two-sided paired "
            f"t test")
    if not compact:
        text += ("; df: its degrees of freedom (seeds - 1); p Wilcoxon: the signed-rank test of the same differences "
                 "(exact; with n seeds it cannot fall below 2^(1-n), 0.25 for 3 seeds)")
    text += ("; p Holm: p adjusted by Holm's method over all comparisons of the same quantity on the page "
             "(tasks x settings)" + ("; a primary contrast's over the primary contrasts of that quantity alone"
                                     if config.primary else "") +
             "; below 0.05 is significant at a 5% family-wise error rate.")
    if any(t.reach for t in config.tasks) and not compact:
        text += (" Steps to a threshold are compared only where every run of both settings reached it; n/a "
                 "otherwise (censored: a run that never reached it has no step to subtract).")
    if cv:
        text += (" Cross-validated tasks (" + ", ".join(t.name for t in cv) + "): seed s tests on fold s % K; the "
                 "t, CI and p are Nadeau-Bengio corrected (variance (1/n + 1/(K-1)) s², n2/n1 = 1/(K-1) for K folds)")
        repeated = [t.name for t in cv if len(config.seeds) > t.folds]
        if repeated:  # data_seed fixes the partition: n counts repeats of a fold as if each were a fresh partition
            text += ("; with more seeds than folds (" + ", ".join(repeated) + ") the repeats test the same partition "
                     "and differ only in initialisation and batches, but n counts each as a fresh pass, so the "
                     "correction is optimistic")
        # the compact table has no Wilcoxon column; the full one's rank test has no such correction
        text += ("." if compact else "; p Wilcoxon is not corrected: it treats the folds' differences as independent, "
                 "though their training sets overlap, so it overstates the evidence.")
    if config.primary:
        words = config._primary_quantities_text()
        named = f" (on the {words} only)" if words else ""
        text += (f" role: primary contrasts were named in the config before it ran{named}; all others are "
                 "exploratory.")
    elif not compact:
        text += (" The config names no primary contrasts (`primary = [...]`): every comparison is exploratory.")
    return text
