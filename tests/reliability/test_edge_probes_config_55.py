"""A researcher writing their own experiment TOML: a key written in the wrong table (the TOML pitfall of a key
below a ``[table]`` header belonging to that table, a training key at the top level, ``[tasks]`` for
``[[tasks]]``), ``folds`` on a dataset without folds and a dataset option that is set elsewhere (``seed``, ``root``)
are refused before anything trains, each naming where the key belongs rather than a look-alike of the wrong table
or options the config does not hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffusionformer.experiments.cli import main
from experiments_tiny_configs import TINY_DIGITS_USER_TOML as _BASE  # tests/reliability/conftest.py's path


def _refused(tmp_path: Path, capsys, text: str) -> str:
    """``run`` of the config ``text``: refused with status 2, nothing written under ``--out``; its output."""
    path = tmp_path / "c.toml"
    path.write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    rc = main(["run", str(path), "--out", str(out), "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 2, captured
    assert not out.exists(), sorted(out.rglob("*"))
    return captured.out + captured.err


@pytest.mark.parametrize("old, new, words", [
    # a top-level key written below the last table header: TOML puts it into that table
    ('laplacian_heads = "half"', 'laplacian_heads = "half"\nseeds = [0, 1]',
     ["operators[1]: unknown key 'seeds'", "a key of the top level", "above"]),
    ('metric = "test_acc"', 'metric = "test_acc"\nprimary = ["lap"]',
     ["tasks[0]: unknown key 'primary'", "a key of the top level", "above"]),
    # a training key in the task's own table, or at the top level
    ('metric = "test_acc"', 'metric = "test_acc"\nlr = 0.01', ["tasks[0]: unknown key 'lr'", "[tasks.train]"]),
    ('seeds = [0]', 'seeds = [0]\nmax_steps = 3', ["unknown key 'max_steps'", "[tasks.train]"]),
    ('seeds = [0]', 'seeds = [0]\n[train]\nlr = 0.1', ["unknown key 'train'", "[[tasks]] entry"]),
    # a task key written below [tasks.train]
    ("log_interval = 1", 'log_interval = 1\nselect_by = "val_acc"',
     ["unknown TrainConfig key 'select_by'", "a key of each [[tasks]] entry", "above"]),
])
def test_bug_key_in_the_wrong_table_names_its_table(tmp_path, capsys, old, new, words):
    """Bug: a key of another table was refused as unknown with no word of where it belongs, or with a look-alike of
    the wrong table: ``seeds`` below ``[[operators]]`` got "did you mean 'heads'?", ``lr`` in a task's table or
    ``select_by`` below ``[tasks.train]`` nothing; the hint now names the key's own table (and, for a key that
    TOML read into the table above it, says to write it above the header)."""
    assert old in _BASE
    text = _refused(tmp_path, capsys, _BASE.replace(old, new, 1))
    assert all(w in text for w in words), text
    assert "did you mean 'heads'" not in text, text


def test_bug_seeds_in_the_train_table_points_to_the_top_level(tmp_path, capsys):
    """Bug: ``seeds = [0, 1]`` below ``[tasks.train]`` got "did you mean 'seed'?", and ``seed`` then "set seeds
    with the top-level `seeds`, not train.seed": the first hint led to the second refusal."""
    text = _refused(tmp_path, capsys, _BASE.replace("log_interval = 1", "log_interval = 1\nseeds = [0, 1]"))
    assert "did you mean 'seed'" not in text, text
    assert "top level" in text and "seeds" in text, text


_GRAPH = """
name = "g"
seeds = [0]

[[tasks]]
name = "csbm"
dataset = "csbm"
model = "graph-node-small"
dataset_options = { num_nodes = 100, num_classes = 2, avg_degree = 4.0, homophily = 0.5, feature_dim = 8, mu = 0.5 }
model_overrides = { dim = 16, depth = 1, num_heads = 2 }
[tasks.train]
max_steps = 2
eval_interval = 2
[tasks.minibatch]
batch_size = 16
num_neighbors = [5, 5]
eval = "sampled"

[[operators]]
name = "attention"
"""


def test_bug_eval_batch_size_in_the_minibatch_table_names_the_task(tmp_path, capsys):
    """Bug: the tutorial says ``eval = "sampled"`` evaluates on batches of ``eval_batch_size`` seeds, and
    ``eval_batch_size = 32`` written in ``[tasks.minibatch]`` got "did you mean 'batch_size'?" (the number of
    training seeds per update): it is a key of the task."""
    text = _refused(tmp_path, capsys, _GRAPH.replace('eval = "sampled"', 'eval = "sampled"\neval_batch_size = 32'))
    assert "minibatch: unknown key 'eval_batch_size'" in text and "a key of each [[tasks]] entry" in text, text
    assert "did you mean 'batch_size'" not in text, text


_SSL = """
name = "s"
seeds = [0]

[[tasks]]
name = "digits-dino"
dataset = "digits"
model = "dino-digits"
metric = "knn_test_acc"
model_overrides = { schedule_steps = 2, dim = 16, depth = 1, num_heads = 2 }
[tasks.ssl]
local_crops = 2
knn_k = 10

[[operators]]
name = "attention"
"""


@pytest.mark.parametrize("old, new, words", [
    ("knn_k = 10", "knn_k = 10\nselect_by = \"knn_val_acc\"", ["ssl: unknown key 'select_by'", "each [[tasks]] entry"]),
    ("knn_k = 10", "knn_k = 10\nmax_steps = 2", ["ssl: unknown key 'max_steps'", "[tasks.train]"]),
    ("knn_k = 10", "knn_kk = 10\nmax_steps = 2", ["'knn_kk'", "did you mean 'knn_k'", "'max_steps' is a key of"]),
])
def test_bug_key_below_the_ssl_header_names_its_table(tmp_path, capsys, old, new, words):
    """Bug: the tutorial's ``[tasks.ssl]`` table comes last in a task, and a task or training key written below it
    was refused as an unknown SSLConfig key with no word of where it belongs; each such key is named with its table,
    beside the other problems of the table."""
    assert old in _SSL
    text = _refused(tmp_path, capsys, _SSL.replace(old, new, 1))
    assert all(w in text for w in words), text


def test_bug_folds_on_a_dataset_without_folds_names_folds(tmp_path, capsys):
    """Bug: ``folds = 2`` on a dataset without k-fold splits (digits) was refused as "dataset 'digits' has no
    option(s) ['fold', 'num_folds']", options the config does not hold (the runner adds them for ``folds``); the
    problem names ``folds`` and the datasets that have folds."""
    text = _refused(tmp_path, capsys, _BASE.replace("seeds = [0]", "seeds = [0, 1]")
                    .replace('metric = "test_acc"', 'metric = "test_acc"\nfolds = 2'))
    assert "folds = 2" in text and "'mutag'" in text, text
    assert "has no option(s)" not in text, text


def test_bug_a_single_bracket_header_of_entries_says_double_brackets(tmp_path, capsys):
    """Bug: ``[tasks]`` written for ``[[tasks]]`` (one table, not a list of tables) was refused as "tasks: expected a
    list, got dict {...}", with no word of the TOML spelling of a list of tables."""
    text = _refused(tmp_path, capsys, _BASE.replace("[[tasks]]", "[tasks]"))
    assert "tasks: expected a list, got dict" in text and "one [[tasks]] header per entry, not [tasks]" in text, text


@pytest.mark.parametrize("option, words", [
    ("seed = 1", ["'seed': the split's seed is the task's data_seed"]),
    ("data_seed = 1", ["'data_seed': a key of the task itself"]),
    ('root = "data"', ["'root': the data root is run's --data-root or $DIFFUSIONFORMER_DATA"]),
])
def test_bug_dataset_option_set_elsewhere_says_where(tmp_path, capsys, option, words):
    """Bug: ``dataset_options = { seed = 1 }`` (or ``data_seed``, ``root``) was refused as an option the dataset does
    not have, listing its options, with no word of the task's ``data_seed`` or of ``--data-root``, where a split's
    seed and the data root are set."""
    text = _refused(tmp_path, capsys, _BASE.replace('metric = "test_acc"',
                                                    f'metric = "test_acc"\ndataset_options = {{ {option} }}'))
    assert "has no option(s)" in text and all(w in text for w in words), text
