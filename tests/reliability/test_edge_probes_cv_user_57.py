"""A graph-classification researcher's k-fold cross-validation study, walked end to end (probe 57).

Checked and found as documented (no test here): each fold's train/val/test parts of MUTAG are disjoint and cover
the data, with the per-class fold counts of scikit-learn's ``StratifiedKFold``; seed s tests on fold s % K; the
tables' mean and std are over folds; the Nadeau-Bengio t, CI and p equal the formula with scipy's t; seeds that
do not cover the folds equally, ``folds = 1`` and more folds than graphs are refused by name; a comparison killed
mid-fold resumes to the numbers of an uninterrupted one.

Found: the cross-validated tables print a Wilcoxon signed-rank p beside the Nadeau-Bengio corrected one, and their
legend said only that "the t, CI and p are Nadeau-Bengio corrected": the rank test takes the folds' differences as
independent (the correction exists because they are not), so its p is not corrected and reads smaller than the
evidence supports, which neither the legend nor the published CV page said.
"""

from __future__ import annotations

from pathlib import Path

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.compare import table_legend

ROOT = Path(__file__).resolve().parents[2]


def _cv_config(folds: int | None):
    task = {"name": "cv", "dataset": "digits", "model": "vit-digits"}
    if folds is not None:
        task["folds"] = folds
    return load_experiment_config({"name": "cvw", "seeds": [0, 1], "tasks": [task],
                                   "operators": [{"name": "base"}, {"name": "lap", "laplacian_heads": 1}]})


def _cv_sentence(legend: str) -> str:
    start = legend.index(" Cross-validated tasks")
    end = legend.find(" The config names", start)
    return legend[start:] if end < 0 else legend[start:end]


def test_cv_legend_says_the_wilcoxon_p_is_not_corrected():
    full = table_legend(_cv_config(2))
    cv = _cv_sentence(full)
    assert "Wilcoxon" in cv and "not" in cv.split("Wilcoxon", 1)[1], cv
    # the compact table (printed by run) has no Wilcoxon column: its legend names none
    assert "Wilcoxon" not in table_legend(_cv_config(2), compact=True)
    # a task without folds keeps its legend: no cross-validation sentence at all
    assert "Cross-validated" not in table_legend(_cv_config(None))


def test_published_cv_page_states_the_wilcoxon_caveat():
    page = (ROOT / "docs" / "results" / "study-graph-cv.md").read_text(encoding="utf-8")
    config = load_experiment_config(ROOT / "experiments" / "configs" / "study_graph_cv.toml")
    legend = table_legend(config)
    assert "Wilcoxon" in _cv_sentence(legend)
    assert legend in page.splitlines(), "the page's legend is not the code's: republish or update it"


def test_show_prints_a_tasks_folds(tmp_path, capsys):
    """``show`` printed a task as ``mutag -> graph-graph-small, metric ..., train {...}`` with or without ``folds``: a
    cross-validated study (or its ``--set tasks.mutag.folds=5``) read as the single-split one, and the docs say
    ``show`` prints the result of a ``--set``."""
    from diffusionformer.experiments.cli import main

    path = tmp_path / "cv.toml"
    path.write_text('name = "cvshow"\nseeds = [0, 1]\n[[tasks]]\nname = "mutag"\ndataset = "mutag"\n'
                    'model = "graph-graph-small"\nfolds = 2\ndataset_options = { val_fraction = 0.2 }\n'
                    '[tasks.train]\nmax_steps = 2\n[[operators]]\nname = "attention"\n', encoding="utf-8")
    assert main(["show", str(path), "--set", "tasks.mutag.folds=4", "--set", "seeds=[0, 1, 2, 3]"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("  task mutag:"))
    assert "(4-fold CV)" in line and "val_fraction" in line, line
