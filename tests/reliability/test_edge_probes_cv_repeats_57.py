"""Two honest-statistics probes.

K-fold seeds beyond K: the partition is fixed by ``data_seed``, so seeds ``s`` and ``s + K`` test on the same fold
of the same partition and differ only in initialisation; the Nadeau-Bengio t counts ``n = seeds`` as if each
repeat were a fresh partition (optimistic). The config accepted such seeds without a word and the legend and
``nadeau_bengio``'s docstring did not say so; now a UserWarning names the user's line and both say it.

The gap study's primary table named every configured quantity in its header (``final val loss, best val loss``)
even when one of them had no primary cell (no primary task with ``select_by`` had rows): every best-val row was
exploratory while the header called it primary.
"""

from __future__ import annotations

import warnings

import pytest

from diffusionformer.experiments import load_experiment_config, nadeau_bengio
from diffusionformer.experiments.compare import table_legend
from diffusionformer.experiments.gaps import primary_table
from diffusionformer.experiments.runner import run_dir
from experiments_tiny_configs import write_gap_run


def _cv(seeds, folds=2):
    task = {"name": "cv", "dataset": "digits", "model": "vit-digits", "folds": folds}
    return load_experiment_config({"name": "cvr", "seeds": list(seeds), "tasks": [task],
                                   "operators": [{"name": "base"}, {"name": "lap", "laplacian_heads": 1}]})


def test_seeds_beyond_folds_warn_that_repeats_reuse_the_partition():
    with pytest.warns(UserWarning, match="same partition") as record:
        _cv([0, 1, 2, 3])
    assert record[0].filename == __file__  # the user's line, not the library's
    message = str(record[0].message)
    assert "'cv'" in message and "Nadeau-Bengio" in message and "[0, 1]" in message


def test_one_pass_of_folds_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _cv([0, 1, 2], folds=3)
        _cv([3, 4, 5], folds=3)  # a shifted single pass still tests each fold once


def test_legend_says_repeats_reuse_the_partition_only_when_seeds_exceed_folds():
    with pytest.warns(UserWarning):
        repeated = _cv([0, 1, 2, 3])
    for compact in (False, True):
        assert "same partition" in table_legend(repeated, compact=compact)
        assert "same partition" not in table_legend(_cv([0, 1]), compact=compact)


def test_nadeau_bengio_docstring_says_repeats_of_one_partition_are_optimistic():
    doc = " ".join(nadeau_bengio.__doc__.split())
    assert "same partition" in doc and "optimistic" in doc


# (train, val) at steps 100, 200 per (setting, seed)
CURVES = {("attention", s): [(2.0 + 0.1 * s, 2.5), (1.5, 2.4 + 0.05 * s)] for s in range(3)}
CURVES.update({("lap", s): [(2.1, 2.5 - 0.02 * s), (1.6, 2.3 + 0.01 * s)] for s in range(3)})


def _two_task_study(root):
    """Primary ``lap`` on task ``t`` (no select_by, finished runs) and task ``s`` (select_by, no runs yet)."""
    task = 'dataset = "pydoc-chars"\nmodel = "gpt-char-tiny"\nmetric = "val_loss"\n'
    cfg = root / "g.toml"
    cfg.write_text('name = "g"\nseeds = [0, 1, 2]\nprimary = ["lap"]\nprimary_quantities = ["final", "selected"]\n'
                   f'[[tasks]]\nname = "t"\n{task}[[tasks]]\nname = "s"\n{task}select_by = "val_loss"\n'
                   '[[operators]]\nname = "attention"\n[[operators]]\nname = "lap"\nlaplacian_heads = 1\n')
    for (op, seed), curve in CURVES.items():
        write_gap_run(run_dir(root / "g", "t", op, seed), [(100 * (i + 1), t, v) for i, (t, v) in enumerate(curve)])
    return load_experiment_config(str(cfg))


def test_primary_header_names_only_quantities_with_a_primary_cell(tmp_path):
    table = primary_table(_two_task_study(tmp_path), tmp_path)
    header = next(line for line in table.splitlines() if line.startswith("### Primary contrasts"))
    assert header == "### Primary contrasts: final val loss"
    legend = table.splitlines()[2]
    assert "on the final val loss." in legend and "best val loss" not in legend
    assert "adjusted over the 1 primary cells" in legend
    # the best val loss is still there, as an exploratory row
    assert "| *exploratory:* t, lap, best val loss |" in table
