"""``validate_experiment``'s lines name the task once.

Bug (found by a sitting-38 probe): a model problem raised with the task in its own message (the graph task's
dense-operator and input checks) was printed as ``task 'k' / setting 'exact': task 'k': model ...``.
"""

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
model_overrides = { dim = 8, depth = 1, num_heads = 2 }
[tasks.train]
max_steps = 1

[[operators]]
name = "attention"

[[operators]]
name = "exact"
heads = "heat-exact:2"
"""


@pytest.mark.parametrize("load_data", [True, False])
def test_bug_a_model_problem_names_its_task_once(tmp_path, load_data):
    """Bug: ``task 'k' / setting 'exact': task 'k': model 'graph-node-small' layer 0 ...``."""
    path = tmp_path / "probe.toml"
    path.write_text(KARATE, encoding="utf-8")
    (problem,) = validate_experiment(load_experiment_config(path), load_data=load_data)
    assert problem.startswith("task 'k' / setting 'exact': model 'graph-node-small' layer 0 has operator 'heat-exact'")
    assert problem.count("task 'k'") == 1, problem
