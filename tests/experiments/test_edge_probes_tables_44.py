"""Tables and paired statistics near the float maximum: finite metric values around 1e308 (a metric may be a
loss that diverged to a huge finite value) are averaged without an intermediate overflow, and a paired difference
past the float range is named as such."""

from __future__ import annotations

import math

import pytest


# ----------------------------------------------------------------------------- tables near the float maximum
def _huge_runs(op, final, selected):
    from diffusionformer.experiments.results import RunResult

    out = []
    for s, v in final.items():
        r = RunResult("d", op, s, "completed", "test_acc", v, {"test_acc": v}, 10, 1.0)
        r.selected_value, r.selected_step, r.reach_step = selected[s], 5, None
        out.append(r)
    return out


def _huge_config():
    from diffusionformer.experiments.config import load_experiment_config

    return load_experiment_config({
        "name": "probe", "seeds": [0, 1, 2], "operators": [{"name": "base"}, {"name": "x"}],
        "tasks": [{"name": "d", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 2},
                   "select_by": "val_acc"}]})


def test_bug_aggregate_and_format_table_overflow_near_the_float_maximum():
    """Bug: ``aggregate`` (hence ``format_table``) raised ``OverflowError: intermediate overflow in fsum`` for
    finite metric values around 1e308 (``statistics.fmean`` sums first): their mean is finite. Checked against
    numpy's mean in extended precision (``longdouble``)."""
    import numpy as np

    from diffusionformer.experiments.tables import aggregate, format_table

    base, base_sel = {0: 1e308, 1: 1.5e308, 2: 1.7e308}, {0: 1e308, 1: 1.2e308, 2: -1e306}
    x, x_sel = {0: 1.2e308, 1: 1.7e308, 2: 1.6e308}, {0: 1.7e308, 1: 1.7e308, 2: 1.7e308}
    rows = {r["operator"]: r for r in aggregate(_huge_runs("base", base, base_sel) + _huge_runs("x", x, x_sel))}
    for op, final, sel in (("base", base, base_sel), ("x", x, x_sel)):
        for got, values in ((rows[op]["mean"], final), (rows[op]["selected_mean"], sel)):
            want = np.mean(np.array(list(values.values()), dtype=np.longdouble))
            if np.finfo(np.longdouble).max > 1e309:  # x86's 80-bit long double: the sum does not overflow there
                assert math.isclose(got, float(want), rel_tol=1e-15)
            assert math.isfinite(got) and math.isclose(got, sum(v / 1e308 for v in values.values()) / 3 * 1e308,
                                                        rel_tol=1e-14)
    text = format_table(list(rows.values()), _huge_config())
    line = next(ln for ln in text.splitlines() if ln.startswith("| x |"))
    assert line.split("|")[2].strip().startswith(f"{rows['x']['mean']:.4f} ± ")


def test_bug_a_paired_difference_past_the_float_range_says_so():
    """Bug: finite values whose paired difference overflows (1e308 against -1e308) were reported as
    "non-finite paired values for seeds [0]", though every value is finite: the error now names the overflow."""
    from diffusionformer.experiments.stats import paired_difference
    from diffusionformer.experiments.tables import aggregate, format_table

    with pytest.raises(ValueError, match=r"non-finite paired differences for seeds \[0\]: finite values whose difference is past the float range"):
        paired_difference({0: 1e308, 1: 1.0}, {0: -1e308, 1: 2.0})
    with pytest.raises(ValueError, match=r"non-finite paired values for seeds \[1\]"):
        paired_difference({0: 1.0, 1: math.inf}, {0: 2.0, 1: 2.0})
    runs = (_huge_runs("base", {0: 1e308, 1: 1e308, 2: 1e308}, {0: 1.0, 1: 1.0, 2: 1.0})
            + _huge_runs("x", {0: -1e308, 1: 1e308, 2: 1e308}, {0: 1.0, 1: 1.0, 2: 1.0}))
    with pytest.raises(ValueError, match="past the float range"):
        format_table(aggregate(runs), _huge_config())
