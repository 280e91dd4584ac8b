"""Edge-case probes of the study analysis, run reloading, mini-batches, gap tables, figures and outputs: each
``test_bug_*`` failed before its fix (its docstring says how)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from diffusionformer.experiments import analyze as A
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import run_dir

TRAIN = {"max_steps": 4, "batch_size": 16, "eval_interval": 4, "checkpoint_interval": 4, "warmup_steps": 0}


def _study(name: str = "s", task: str = "digits", data_seed: int = 0) -> dict[str, Any]:
    return {"name": name, "seeds": [0],
            "tasks": [{"name": task, "dataset": "digits", "model": "vit-digits", "data_seed": data_seed,
                       "model_overrides": {"dim": 16, "depth": 2, "num_heads": 2}, "train": TRAIN}],
            "operators": [{"name": "attention"}]}


def _finished_run(out: Path, config: Any, identity: dict[str, Any]) -> Path:
    """A finished run written by hand: a completed summary, a checkpoint file and ``run_config.json``."""
    rdir = run_dir(out / config.name, config.tasks[0].name, config.operators[0].name, 0)
    rdir.mkdir(parents=True)
    (rdir / "summary.json").write_text(json.dumps({"status": "completed"}))
    (rdir / "checkpoint.pt").write_bytes(b"weights")
    (rdir / "run_config.json").write_text(json.dumps(identity))
    return rdir


def test_bug_analyze_refuses_a_run_trained_on_other_data_than_the_config_names(tmp_path, monkeypatch):
    """Bug: ``analyze`` loaded each run's model from its ``run_config.json`` but its held-out data from the config as
    it is now, without comparing the two: after the config's ``data_seed`` changed (another shuffle of the digits
    splits), a run trained on ``data_seed = 0`` was measured, with no word, on a "held-out" split that holds some of
    its own training images (its held-out loss was no longer the run's test loss). Such a run is now refused before
    any run is measured, naming the run and what changed."""
    measured: list[Path] = []
    monkeypatch.setattr(A, "load_run", lambda rdir: SimpleNamespace(model=torch.nn.Identity(), step=4))
    monkeypatch.setattr(A, "task_data", lambda *a: SimpleNamespace(kind="image"))

    def analyze_run(model, data, **kwargs):
        measured.append(data)
        return {"layers": [{"layer": 0, "within_variance": 1.0}], "spectra": [[1.0]], "coefficients": [],
                "pca_rgb": None, "info": {"num_examples": 1}}

    monkeypatch.setattr(A, "analyze_run", analyze_run)
    trained = {"dataset": "digits", "dataset_options": {}, "data_seed": 0, "model": "vit-digits",
               "model_config": {}, "train": {}}
    now = load_experiment_config(_study(data_seed=1))
    rdir = _finished_run(tmp_path, now, trained)
    with pytest.raises(ValueError, match=r"run .*seed0 was trained on other data .* \(data_seed: 0 then 1\).*--restart"):
        A.analyze_experiment(now, tmp_path, progress=False, plots=False, device="cpu")
    assert measured == [] and not (tmp_path / "s" / "analysis").exists()
    # the config the run was made with: measured as before
    result = A.analyze_experiment(load_experiment_config(_study(data_seed=0)), tmp_path, progress=False, plots=False,
                                  device="cpu")
    assert len(measured) == 1 and result["tasks"]["digits"]["operators"]["attention"]["seeds"]["0"]["step"] == 4
    # another dataset option or model preset is named the same way
    (rdir / "run_config.json").write_text(json.dumps({**trained, "dataset_options": {"n": 3}}))
    with pytest.raises(ValueError, match=r"dataset_options: \{'n': 3\} then \{\}"):
        A.analyze_experiment(load_experiment_config(_study()), tmp_path, progress=False, plots=False, device="cpu")


@pytest.mark.parametrize("field", ["experiment", "task", "operator setting"])
def test_bug_a_name_too_long_for_the_files_named_after_it_is_refused_when_the_config_loads(field):
    """Bug: a task named with 240 characters passed the config check (each run folder is one path component of at
    most 255 bytes), every run trained, and then ``run`` died with ``OSError: [Errno 36] File name too long`` drawing
    ``plots/.<task>_curves.png.<random>.tmp`` (the analysis' ``<task>_frequency_response.png`` and the published
    page's temporary copies are longer still). A name of more than 200 bytes (UTF-8) is now refused up front."""
    study = _study()
    long = "t" * 201
    if field == "experiment":
        study["name"] = long
    elif field == "task":
        study["tasks"][0]["name"] = long
    else:
        study["operators"][0]["name"] = long
    with pytest.raises(ValueError, match=rf"{field} name must be at most 200 bytes in UTF-8 .* got 201 bytes"):
        load_experiment_config(study)
    study2 = _study(task="é" * 101)  # 202 bytes in 101 characters
    with pytest.raises(ValueError, match="task name must be at most 200 bytes in UTF-8 .* got 202 bytes"):
        load_experiment_config(study2)
    assert load_experiment_config(_study(task="t" * 200)).tasks[0].name == "t" * 200


def test_bug_an_interrupted_analysis_figure_leaves_the_earlier_one_whole(tmp_path, monkeypatch):
    """Bug: the analysis drew its figures straight into ``analysis/plots/<task>_*.png`` (``fig.savefig(path)``), so a
    Ctrl-C (or a full disk) while a second ``analyze`` drew one left a torn PNG in place of the earlier figure, which
    ``publish`` then refused; the comparison's own figures were already replaced only once written whole. The
    analysis' figures now are too, and no temporary is left behind."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    def torn(self, fname, *args, **kwargs):
        with open(fname, "wb") as f:
            f.write(b"\x89PNG torn")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", torn)
    pdir = tmp_path / "plots"
    pdir.mkdir()
    earlier = pdir / "d_smoothing.png"
    earlier.write_bytes(b"\x89PNG\r\n earlier figure")
    layers = [{"layer": 0, "within_variance": 1.0}, {"layer": 1, "within_variance": 0.5}]
    op = {"seeds": {"0": {"layers": layers, "coefficients": [[[0.0, 1.0]]], "learned_operators": {}}},
          "summary": A._summary([layers])}
    result = {"tasks": {"d": {"operators": {"attention": op}}}}
    with pytest.raises(KeyboardInterrupt):
        A._write_plots(pdir, result, {"d": {"attention": [[[2.0, 1.0], [2.0, 0.5]]]}}, {}, {})
    assert earlier.read_bytes() == b"\x89PNG\r\n earlier figure"
    assert sorted(p.name for p in pdir.iterdir()) == ["d_smoothing.png"]


def test_bug_analyze_run_refuses_the_training_split():
    """Bug: ``analyze_run(model, data, split="train")`` measured a seeded subset of the training examples and
    reported it as held-out data (``heldout`` accuracy and loss, the geometry of "held-out" tokens), although its
    docstring and ``analyze_experiment`` allow ``"test"`` or ``"val"`` only; a misspelt split was refused with a
    list that offered ``'train'``. Both now get the analysis' own message, before the model is touched."""
    from diffusionformer.data.base import ClassificationData
    from diffusionformer.models import create_model

    model = create_model("vit-digits", dim=16, depth=1, num_heads=2)
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(8, 1, 8, 8, generator=g), torch.arange(8) % 10
    data = ClassificationData("digits", "image", x, y, x, y, x, y, num_classes=10, input_shape=(1, 8, 8))
    with pytest.raises(ValueError, match=r"split must be 'test' or 'val', got 'train'"):
        A.analyze_run(model, data, split="train", max_examples=8, max_attention_examples=2)
    with pytest.raises(ValueError, match=r"split must be 'test' or 'val', got 'tset' \(did you mean 'test'\?\)"):
        A.analyze_run(model, data, split="tset", max_examples=8, max_attention_examples=2)


def test_bug_analyze_skips_a_task_without_transformer_blocks_and_measures_the_others(tmp_path):
    """Bug: ``analyze`` of a comparison with a GCN/GIN baseline task (baselines.toml's ``cora-gcn``) stopped at that
    task with capture's TypeError ("capture needs a model with ... model.blocks"), naming no task, after the tasks
    before it had been measured and before the ones after it. It skips such a task now with a warning naming it,
    lists it under ``skipped_tasks`` and in the README, and measures the other tasks."""
    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments.analyze import analyze_experiment
    from diffusionformer.experiments.runner import run_experiment

    train = {"max_steps": 2, "batch_size": 8, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 2, "log_interval": 1,
             "checkpoint_interval": 2}
    cfg = load_experiment_config({
        "name": "mixed", "seeds": [0],
        "tasks": [{"name": "graph-gcn", "dataset": "csbm", "model": "gcn-2layer", "metric": "test_acc",
                   "train": train},
                  {"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2}, "train": train}],
        "operators": [{"name": "attention"}],
    })
    run_experiment(cfg, tmp_path, progress=False, log=lambda _: None)
    with pytest.warns(RuntimeWarning, match=r"task 'graph-gcn' skipped: its model has no transformer blocks"):
        result = analyze_experiment(cfg, tmp_path, max_examples=16, progress=False, plots=False, device="cpu")
    assert list(result["tasks"]) == ["digits"]
    assert result["tasks"]["digits"]["operators"]["attention"]["seeds"]["0"]["layers"]
    assert set(result["skipped_tasks"]) == {"graph-gcn"} and "GCN" in result["skipped_tasks"]["graph-gcn"]
    readme = (tmp_path / "mixed" / "analysis" / "README.md").read_text()
    assert "Task `graph-gcn` is not measured" in readme and "## digits" in readme
