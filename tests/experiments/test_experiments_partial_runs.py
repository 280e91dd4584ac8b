"""A comparison trained in parts, damaged run files, and the runner's command line (an audit's findings).

Each case once lost finished results, stopped a whole study, or started processes without end.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.cli import _parser, main as cli_main
from diffusionformer.experiments.gpu import WORKER_ENV, worker_argv
from diffusionformer.experiments.publish import publish_experiment
from diffusionformer.experiments.runner import run_dir, run_experiment

from tests.experiments.test_experiments_runner import _to_toml, tiny_config


def _config(**extra):
    cfg = tiny_config(**extra)
    cfg["seeds"] = [0, 1]
    cfg["tasks"][0]["train"]["max_steps"] = 4
    return cfg


def _rows(out):
    return sorted((r["operator"], r["seed"]) for r in json.loads((out / "results.json").read_text())["runs"])


def test_runs_in_parts_add_up_in_results_json_and_publish_shows_the_config(tmp_path):
    out = tmp_path / "r" / "tiny"
    run_experiment(load_experiment_config(_config(), ["seeds=[0]"]), tmp_path / "r", progress=False)
    assert _rows(out) == [("attention", 0), ("lap", 0)]
    # a second part (one GPU call per seed): it adds its runs instead of replacing the first part's
    run_experiment(load_experiment_config(_config(), ["seeds=[1]", "operators=attention"]), tmp_path / "r",
                   progress=False)
    assert _rows(out) == [("attention", 0), ("attention", 1), ("lap", 0)]
    # publish shows the runs its config names, whatever results.json holds besides
    page = publish_experiment(load_experiment_config(_config(), ["seeds=[0]"]), tmp_path / "r", tmp_path / "docs",
                              config_path="tiny.toml")
    assert "Runs:** 2 of 2 finished" in page.read_text()
    assert _rows(tmp_path / "docs" / "tiny") == [("attention", 0), ("lap", 0)]
    seed0 = {r["operator"]: r["value"] for r in json.loads((out / "results.json").read_text())["runs"] if r["seed"] == 0}
    assert f"{seed0['attention']:.4f}" in page.read_text()
    # a run deleted on disk is not resurrected from the old results.json
    shutil.rmtree(run_dir(out, "digits", "lap", 0))
    run_experiment(load_experiment_config(_config(), ["seeds=[1]", "operators=attention"]), tmp_path / "r",
                   progress=False)
    assert _rows(out) == [("attention", 0), ("attention", 1)]


def test_an_unreadable_summary_is_rebuilt_from_the_checkpoint_and_the_study_goes_on(tmp_path):
    cfg = load_experiment_config(_config(), ["seeds=[0]"])
    first = run_experiment(cfg, tmp_path / "r", progress=False)
    rdir = run_dir(tmp_path / "r" / "tiny", "digits", "attention", 0)
    value = first[0].value
    (rdir / "summary.json").write_text('{"status": "compl')  # truncated
    (rdir / "run_config.json").write_text("[]")  # not an object
    again = run_experiment(cfg, tmp_path / "r", progress=False)
    assert [r.status for r in again] == ["completed", "completed"] and again[0].value == value
    assert json.loads((rdir / "summary.json").read_text())["status"] == "completed"
    (rdir / "learned_operators.json").write_text("{")
    with pytest.warns(UserWarning, match="learned_operators.json is unreadable"):
        assert run_experiment(cfg, tmp_path / "r", progress=False)[0].status == "completed"


def test_primary_contrasts_named_with_their_task_survive_a_filter_that_keeps_them():
    cfg = _config(primary=["digits:lap"])
    cfg["operators"].append({"name": "lap2", "laplacian_heads": 1})
    kept = load_experiment_config(cfg, ["operators=attention,lap"])
    assert kept.primary == ["digits:lap"]
    assert load_experiment_config(cfg, ["operators=attention,lap2"]).primary == []
    two = json.loads(json.dumps(cfg))
    two["tasks"].append({**two["tasks"][0], "name": "other"})
    assert load_experiment_config(two, ["tasks=other"]).primary == []  # was: "unknown task 'digits'"


@pytest.mark.parametrize("name", ["..", ".", "", "a/b", "a\\b"])
def test_names_that_would_leave_the_results_folder_are_refused(name):
    with pytest.raises(ValueError, match="it names a results folder"):
        load_experiment_config(_config(name=name))
    cfg = _config()
    cfg["operators"][1]["name"] = name
    with pytest.raises(ValueError, match="it names a results folder"):
        load_experiment_config(cfg)


def test_abbreviated_workers_flag_is_refused_and_workers_do_not_start_workers(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "c.toml", "--work", "2"])
    assert "--work" in capsys.readouterr().err
    with pytest.raises(ValueError, match="abbreviates --workers"):
        worker_argv(["run", "c.toml", "--worker=2"])
    toml = tmp_path / "t.toml"
    toml.write_text(_to_toml(_config()))
    monkeypatch.setenv(WORKER_ENV, "0/2")
    assert cli_main(["run", str(toml), "--out", str(tmp_path / "r"), "--workers", "2", "--no-progress"]) == 2
    assert "a worker does not start workers" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_missing_tensorboard_and_a_file_as_out_are_errors_before_training(tmp_path, monkeypatch, capsys):
    import diffusionformer.experiments.validate as validate

    cfg = _config()
    cfg["tasks"][0]["train"]["loggers"] = ["jsonl", "tensorboard"]
    toml = tmp_path / "t.toml"
    toml.write_text(_to_toml(cfg))
    monkeypatch.setattr(validate, "_tensorboard_available", lambda: False)
    assert cli_main(["run", str(toml), "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    assert "the tensorboard package is not installed" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    toml.write_text(_to_toml(_config()))
    (tmp_path / "afile").write_text("")
    assert cli_main(["run", str(toml), "--out", str(tmp_path / "afile"), "--no-progress"]) == 2
    assert "error:" in capsys.readouterr().err
    assert os.path.isfile(tmp_path / "afile")


def test_grad_accumulation_is_refused_where_micro_batches_cannot_add_up():
    from diffusionformer.experiments.validate import validate_experiment

    dino = _config()
    dino["tasks"][0].update(model="dino-digits", metric="knn_test_acc", model_overrides={})
    dino["tasks"][0]["train"].update(grad_accum_steps=2)
    problems = validate_experiment(load_experiment_config(dino), load_data=False)
    assert any("DINO updates its teacher and centre at every loss call" in p for p in problems), problems
    node = _config()
    node["tasks"][0].update(dataset="csbm", model="graph-node-small", metric="test_acc", model_overrides={})
    node["tasks"][0]["train"].update(grad_accum_steps=2)
    problems = validate_experiment(load_experiment_config(node), load_data=False)
    assert any("full-batch node task" in p for p in problems), problems
    node["tasks"][0]["train"].update(grad_accum_steps=1)
    assert not any("grad_accum_steps" in p for p in validate_experiment(load_experiment_config(node), load_data=False))


@pytest.mark.parametrize("dataset,model,metric", [
    ("digits", "vit-digits", "test_acc"),
    ("digits", "dino-digits", "knn_test_acc"),
    ("csbm", "graph-node-small", "test_acc"),
    ("csbm", "gcn-2layer", "test_acc"),
    ("pydoc-chars", "gpt-char-tiny", "loss"),
    ("assoc-recall", "gpt-recall", "test_acc"),
])
def test_validation_refuses_grad_accumulation_exactly_where_the_built_task_cannot_split(dataset, model, metric):
    """validate_experiment states the micro-batch rule from the config alone (no data, no model);
    the Trainer enforces it from the task the runner builds (``splits_into_micro_batches``). The
    two must agree for every kind of task, or a study passes validation and then fails at its
    first run (or is refused although it would train)."""
    from diffusionformer.experiments.build import build_model, task_data
    from diffusionformer.experiments.tasks import build_task
    from diffusionformer.experiments.validate import validate_experiment

    cfg = _config()
    cfg["tasks"][0].update(dataset=dataset, model=model, metric=metric, model_overrides={})
    cfg["tasks"][0]["train"].update(grad_accum_steps=2)
    config = load_experiment_config(cfg)
    refused = any("grad_accum_steps" in p for p in validate_experiment(config, load_data=False))
    task, setting = config.tasks[0], config.operators[0]
    data = task_data(task, config.seeds[0], None, {})
    built = build_task(data, build_model(task, setting, data), eval_batch_size=task.eval_batch_size,
                       augment=task.augment, label_smoothing=task.label_smoothing, minibatch=task.minibatch or None)
    assert refused == (not getattr(built, "splits_into_micro_batches", True)), (type(built).__name__, refused)
