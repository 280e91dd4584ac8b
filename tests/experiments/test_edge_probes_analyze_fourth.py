"""Fourth round of edge-case probes of ``analyze`` (``experiments/analyze.py``): each ``test_bug_*`` failed before its
fix (its docstring says how). The reported numbers of a trained tiny comparison were checked against float64 formulas
on ``load_run(run).model`` (Dirichlet energy, effective rank, mean cosine, within-variance, held-out accuracy and loss,
layer indices): they agree, as ``test_edge_probes_analyze_third`` pins."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import pytest
import torch

from diffusionformer.experiments import analyze as A
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.config import train_config
from diffusionformer.experiments.results import _data_identity, _train_identity, run_dir


def _study(max_steps: int) -> dict:
    return {"name": "s", "seeds": [0],
            "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                       "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
                       "train": {"max_steps": max_steps, "batch_size": 8, "eval_interval": 2,
                                 "checkpoint_interval": 2, "warmup_steps": 0}}],
            "operators": [{"name": "attention"}]}


def test_bug_analyze_warns_about_runs_made_with_another_train_config(tmp_path, monkeypatch):
    """Bug: after the config's ``max_steps`` grew from 2 to 4, ``analyze`` measured the 2-step runs and filed their
    numbers under the config's names without a word (``run`` and ``publish`` refuse such runs, ``summary`` warns;
    ``analyze`` checked only their data and model preset). It now warns, naming the run and what changed."""
    then = load_experiment_config(_study(2))
    task = then.tasks[0]
    rdir = run_dir(tmp_path / "s", "digits", "attention", 0)
    rdir.mkdir(parents=True)
    (rdir / "summary.json").write_text(json.dumps({"status": "completed", "step": 2}))
    (rdir / "checkpoint.pt").write_bytes(b"weights")
    identity = {**_data_identity(task, 0), "model": task.model, "model_config": {},
                "train": json.loads(json.dumps(_train_identity(train_config(task, 0)), default=str))}
    (rdir / "run_config.json").write_text(json.dumps(identity))
    monkeypatch.setattr(A, "load_run", lambda rdir: SimpleNamespace(model=torch.nn.Identity(), step=2))
    monkeypatch.setattr(A, "task_data", lambda *a: SimpleNamespace(kind="image"))
    monkeypatch.setattr(A, "analyze_run", lambda model, data, **kw: {
        "layers": [{"layer": 0, "within_variance": 1.0}], "spectra": [[1.0]], "coefficients": [], "pca_rgb": None,
        "info": {"num_examples": 1}})
    with warnings.catch_warnings():  # the config the runs were made with: no word
        warnings.simplefilter("error")
        A.analyze_experiment(then, tmp_path, progress=False, plots=False, device="cpu")
    with pytest.warns(RuntimeWarning, match=r"1 finished run\(s\) of 's' were made with another train or model config.*"
                                            r"'digits' / 'attention' seed 0 \(train \(max_steps: 2 then 4\)\)"):
        result = A.analyze_experiment(load_experiment_config(_study(4)), tmp_path, progress=False, plots=False,
                                      device="cpu")
    assert result["tasks"]["digits"]["operators"]["attention"]["seeds"]["0"]["step"] == 2  # still measured
