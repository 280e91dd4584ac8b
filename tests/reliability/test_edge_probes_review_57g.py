"""Review of f7a8b9a/f4ee81e/68a4261/0d0f083 (K-fold repeats warning, CV legends, gaps headers, ``show``).

A run's seed fixes its initial weights *and* its batches (and dropout): the trainer seeds the batch sampler with
it, and the tables' legend says "same seed = same initialisation and batches". The new K-fold repeats warning,
its legend sentence and ``nadeau_bengio``'s docstring said seeds ``s`` and ``s + K`` "differ only in
initialisation", which contradicts that: they differ in initialisation and batches, the data (fold and
partition) alone is shared.
"""

from __future__ import annotations

import pytest

from diffusionformer.experiments import load_experiment_config, nadeau_bengio
from diffusionformer.experiments.compare import table_legend


def _repeated_cv():
    task = {"name": "cv", "dataset": "digits", "model": "vit-digits", "folds": 2}
    with pytest.warns(UserWarning, match="same partition") as record:
        config = load_experiment_config({"name": "cvr", "seeds": [0, 1, 2, 3], "tasks": [task],
                                         "operators": [{"name": "base"}, {"name": "lap", "laplacian_heads": 1}]})
    return config, " ".join(str(r.message) for r in record)


def test_repeats_warning_and_legend_say_repeats_differ_in_initialisation_and_batches():
    config, message = _repeated_cv()
    texts = [message, table_legend(config), table_legend(config, compact=True),
             " ".join(nadeau_bengio.__doc__.split())]
    for text in texts:  # was "differ only in initialisation"
        assert "initialisation and batches" in text, text


def test_repeats_warning_does_not_advise_seeds_another_task_refuses():
    # a 2-fold and a 4-fold task: seeds [0, 1, 2, 3] pass the 2-fold task twice; the advised one pass, seeds = [0, 1],
    # was refused ("the seeds must cover every fold equally often") for the 4-fold task of the same config
    tasks = [{"name": n, "dataset": "digits", "model": "vit-digits", "folds": k} for n, k in (("a", 2), ("b", 4))]
    data = {"name": "mixed", "seeds": [0, 1, 2, 3], "tasks": tasks, "operators": [{"name": "base"}]}
    with pytest.warns(UserWarning, match="same partition") as record:
        load_experiment_config(data)
    message = " ".join(str(r.message) for r in record)
    assert "one pass is seeds = [0, 1]" in message
    with pytest.raises(ValueError, match="every fold equally often"):
        load_experiment_config({**data, "seeds": [0, 1]})
    assert "without task(s) 'b' (4 folds)" in message
