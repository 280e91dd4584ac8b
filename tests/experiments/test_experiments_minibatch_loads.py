"""``run`` loads each task's dataset once: the load that checks a task's runs is the one they train on."""

from __future__ import annotations

import pytest

from diffusionformer.experiments import load_experiment_config, run_experiment
from diffusionformer.experiments.runner import run_dir


def two_task_config(**extra):
    train = {"max_steps": 2, "batch_size": 8, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 2,
             "log_interval": 1, "checkpoint_interval": 2}
    cfg = {
        "name": "two",
        "seeds": [0, 1],
        "tasks": [
            {"name": "digits", "dataset": "digits", "model": "vit-digits",
             "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2}, "train": train},
            {"name": "nodes", "dataset": "csbm", "model": "graph-node-small",
             "dataset_options": {"num_nodes": 60, "avg_degree": 4.0},
             "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2}, "train": train},
        ],
        "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": "half"}],
    }
    cfg.update(extra)
    return cfg


@pytest.fixture
def counted_loads(monkeypatch):
    """Count ``load_dataset`` calls by dataset name, wherever the experiments package calls it from."""
    import diffusionformer.data as data_pkg
    import diffusionformer.experiments.build as build

    original = data_pkg.load_dataset
    counts: dict[str, int] = {}

    def counting(name, **kwargs):
        counts[name] = counts.get(name, 0) + 1
        return original(name, **kwargs)

    monkeypatch.setattr(data_pkg, "load_dataset", counting)
    monkeypatch.setattr(build, "load_dataset", counting)
    return counts


def test_a_two_task_run_loads_each_dataset_once(tmp_path, counted_loads):
    cfg = load_experiment_config(two_task_config())
    results = run_experiment(cfg, tmp_path, progress=False)
    assert [r.status for r in results] == ["completed"] * 8  # 2 tasks x 2 settings x 2 seeds
    assert counted_loads == {"digits": 1, "csbm": 1}
    # a second run finds every run finished: each dataset is loaded (and checked) once more
    run_experiment(cfg, tmp_path, progress=False)
    assert counted_loads == {"digits": 2, "csbm": 2}


def test_a_task_whose_data_fail_to_load_stops_before_its_runs(tmp_path, monkeypatch):
    import diffusionformer.experiments.build as build

    original = build.load_dataset

    def broken_csbm(name, **kwargs):
        if name == "csbm":
            raise OSError("disk on fire")
        return original(name, **kwargs)

    monkeypatch.setattr(build, "load_dataset", broken_csbm)
    cfg = load_experiment_config(two_task_config(seeds=[0]))
    with pytest.raises(ValueError, match=r"(?s)task 'nodes' cannot start.*the runs of the tasks before it are "
                                         r"finished and kept.*does not load: OSError: disk on fire"):
        run_experiment(cfg, tmp_path, progress=False)
    out = tmp_path / "two"
    assert (run_dir(out, "digits", "attention", 0) / "summary.json").is_file()
    assert not run_dir(out, "nodes", "attention", 0).exists()


def test_a_missing_data_root_is_found_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("DIFFUSIONFORMER_DATA", raising=False)
    raw = two_task_config()
    raw["tasks"][1].update(dataset="cora", dataset_options={})  # the second task reads files from a data root
    cfg = load_experiment_config(raw)
    with pytest.raises(ValueError, match=r"(?s)nothing was trained.*task 'nodes': dataset 'cora' reads files from a "
                                         r"data root, and none is set"):
        run_experiment(cfg, tmp_path, progress=False)
    assert not (tmp_path / "two").exists()
    with pytest.raises(ValueError, match="is not a directory"):
        run_experiment(cfg, tmp_path, progress=False, data_root=str(tmp_path / "nowhere"))
    assert not (tmp_path / "two").exists()
