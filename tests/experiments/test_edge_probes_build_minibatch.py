"""Edge probes of building runs (experiments/build.py, validate.py), mini-batch node training (minibatch.py),
the outputs (outputs.py) and the thread plan (threads.py)."""

from __future__ import annotations

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.validate import validate_experiment

KARATE = """
name = "probe"
seeds = [0]

[[tasks]]
name = "k"
dataset = "karate"
model = "graph-node-small"
model_overrides = {{ dim = 8, depth = 1, num_heads = 2, {extra} }}
[tasks.train]
max_steps = 1

[[operators]]
name = "attention"
"""


@pytest.mark.parametrize("extra, key", [('pe = "random_walk", pe_dim = 3', "pe"), ("edge_dim = 2", "edge_dim")])
@pytest.mark.parametrize("load_data", [True, False])
def test_bug_graph_model_inputs_no_task_passes(tmp_path, extra, key, load_data):
    """Bug: a graph transformer with ``pe`` or ``edge_dim`` passed validation (the model builds), but the node and
    graph task adapters call it with ``(x, edge_index[, batch])`` only, so the run failed at its first training
    step ("pe: expected shape (N, pe_dim) ..., got None"), after ``run`` had written its folder."""
    path = tmp_path / "probe.toml"
    path.write_text(KARATE.format(extra=extra), encoding="utf-8")
    problems = validate_experiment(load_experiment_config(path), load_data=load_data)
    assert len(problems) == 1 and f"has {key} = " in problems[0] and f"drop {key}" in problems[0], problems
    # without the option the same task builds
    path.write_text(KARATE.format(extra="mlp_ratio = 1.0"), encoding="utf-8")
    assert validate_experiment(load_experiment_config(path), load_data=load_data) == []


@pytest.mark.parametrize("heads", ["heat-exact:2", "attention:1,ppr-exact:1"])
@pytest.mark.parametrize("load_data", [True, False])
def test_bug_dense_only_operator_in_a_graph_task(tmp_path, heads, load_data):
    """Bug: a setting giving a graph transformer an operator without a sparse back-end (``heat-exact``,
    ``ppr-exact``) passed validation, and every run of it failed at its first step ("does not support the sparse
    back-end"): the graph transformer always attends over edges."""
    path = tmp_path / "probe.toml"
    text = KARATE.format(extra="mlp_ratio = 1.0")
    path.write_text(text + f'\n[[operators]]\nname = "exact"\nheads = "{heads}"\n', encoding="utf-8")
    problems = validate_experiment(load_experiment_config(path), load_data=load_data)
    name = heads.split(",")[-1].split(":")[0]
    assert len(problems) == 1 and "setting 'exact'" in problems[0] and f"operator {name!r}" in problems[0], problems
    assert "needs a dense P" in problems[0]
    # Bug (sitting 38): the model's message names its task, and the line named it twice
    # ("task 'k' / setting 'exact': task 'k': model ..."); once now
    assert problems[0].startswith("task 'k' / setting 'exact': model 'graph-node-small' layer 0 has operator")
    assert problems[0].count("task 'k'") == 1, problems[0]


def test_bug_a_run_listed_twice_in_results_json_is_one_run(tmp_path):
    """Bug: a run listed twice in the previous ``results.json`` (an edited or merged file) was kept twice, so the
    table averaged one seed as two (``n = 2``, ``seeds = [0, 0]``) and every later write kept both rows."""
    import json

    from diffusionformer.experiments.outputs import _other_finished_rows
    from diffusionformer.experiments.results import RunResult, run_dir
    from diffusionformer.experiments.tables import aggregate

    rdir = run_dir(tmp_path, "t", "a", 0)
    rdir.mkdir(parents=True)
    (rdir / "summary.json").write_text(json.dumps({"status": "completed"}), encoding="utf-8")
    row = {"task": "t", "operator": "a", "seed": 0, "status": "completed", "metric": "val_acc", "value": 0.5}
    (tmp_path / "results.json").write_text(json.dumps({"runs": [row, {**row, "value": 0.9}]}), encoding="utf-8")
    new = RunResult(task="u", operator="a", seed=0, status="completed", metric="val_acc", value=0.1)
    kept = _other_finished_rows(tmp_path, [new])
    assert [(r.task, r.seed, r.value) for r in kept] == [("t", 0, 0.5)]  # the first listing, as the file reads
    (table,) = [t for t in aggregate([new, *kept]) if t["task"] == "t"]
    assert table["n"] == 1 and table["seeds"] == [0]
