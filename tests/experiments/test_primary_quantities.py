"""``primary_quantities``: which quantities (final, selected, reach) a primary contrast is tested on.

Why: ``primary`` names settings; the over-fitting configs named the *final* validation loss (and the gap) as
primary in their comments, yet the generated pages marked the best-validation ("selected") contrasts primary
too and Holm-adjusted them among themselves. The quantities are now part of the config.
"""

from __future__ import annotations

import pytest
from scipy import stats as sps

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.compare import KINDS, contrasts, table_legend
from diffusionformer.experiments.publish import _primary_line
from experiments_references import holm_reference  # noqa: E402

SEEDS = (0, 1, 2, 3)
#: (setting) -> final, selected per seed, by hand
VALUES = {
    "attention": ([0.70, 0.72, 0.69, 0.71], [0.71, 0.73, 0.70, 0.72]),
    "lap": ([0.74, 0.73, 0.72, 0.76], [0.75, 0.73, 0.74, 0.76]),
    "half": ([0.69, 0.73, 0.70, 0.70], [0.70, 0.72, 0.73, 0.71]),
}


def _config(**extra):
    raw = {"name": "pq", "seeds": list(SEEDS),
           "tasks": [{"name": "a", "dataset": "digits", "model": "vit-digits", "select_by": "val_acc"}],
           "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1},
                         {"name": "half", "laplacian_heads": "half"}],
           "primary": ["lap", "half"]}
    raw.update(extra)
    return load_experiment_config(raw)


def _rows():
    return [{"task": "a", "operator": o, "by_seed": dict(zip(SEEDS, f)), "selected_by_seed": dict(zip(SEEDS, s))}
            for o, (f, s) in VALUES.items()]


def test_the_default_is_every_quantity_as_before():
    cfg = _config()
    assert cfg.primary_quantities == ["final", "selected", "reach"] and tuple(cfg.primary_quantities) == KINDS
    roles = {(c.kind, c.setting): c.role for c in contrasts(_rows(), cfg)}
    assert set(roles.values()) == {"primary"}


def test_final_only_leaves_the_selected_contrasts_exploratory_and_adjusts_them_over_the_page():
    cfg = _config(primary_quantities=["final"])
    out = {(c.kind, c.setting): c for c in contrasts(_rows(), cfg)}
    assert {k: c.role for k, c in out.items()} == {("final", "lap"): "primary", ("final", "half"): "primary",
                                                    ("selected", "lap"): "exploratory",
                                                    ("selected", "half"): "exploratory"}
    for kind, col in (("final", 0), ("selected", 1)):
        ps = [sps.ttest_rel(VALUES[s][col], VALUES["attention"][col]).pvalue for s in ("lap", "half")]
        for s, want in zip(("lap", "half"), holm_reference(ps)):
            assert out[(kind, s)].p_holm == pytest.approx(want, rel=1e-9)
    # a primary contrast of one setting on the final metric: Holm among the primary final contrasts alone
    one = {(c.kind, c.setting): c for c in contrasts(_rows(), _config(primary=["lap"], primary_quantities=["final"]))}
    p_lap = sps.ttest_rel(VALUES["lap"][0], VALUES["attention"][0]).pvalue
    assert one[("final", "lap")].p_holm == pytest.approx(p_lap, rel=1e-9)
    assert one[("selected", "lap")].role == "exploratory"


def test_the_legend_and_the_page_say_which_quantities_are_primary():
    cfg = _config(primary_quantities=["final"])
    assert "named in the config before it ran (on the final metric only); all others are exploratory" in \
        table_legend(cfg)
    assert "against the first setting, on the final metric, named in the config" in _primary_line(cfg)
    both = _config(primary_quantities=["final", "selected"])
    assert "(on the final metric and metric at the best evaluation only)" in table_legend(both)
    assert " on the " not in _primary_line(_config())  # every quantity: the line as before


@pytest.mark.parametrize("value,err,match", [
    (["finale"], ValueError, r"unknown quantity 'finale' \(did you mean 'final'\?\)"),
    (["final", "final"], ValueError, "each of its quantities once"),
    ([], ValueError, "at least one"),
    ("final", TypeError, r"primary_quantities: expected a list, got str 'final'"),
    ([1], TypeError, r"primary_quantities\[0\]: expected a string"),
])
def test_primary_quantities_are_checked_when_the_config_loads(value, err, match):
    with pytest.raises(err, match=match):
        _config(primary_quantities=value)


def test_the_overfitting_configs_name_the_final_values_only():
    for name in ("study_overfit", "study_overfit_dropout", "study_overfit_long", "study_overfit_size"):
        cfg = load_experiment_config(f"experiments/configs/{name}.toml")
        assert cfg.primary_quantities == ["final"], name
