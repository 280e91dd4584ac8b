"""Fifth round of edge-case probes of ``analyze`` and the paths that read finished runs back (``run_status``,
``publish``, ``summary``): each ``test_bug_*`` failed before its fix (its docstring says how)."""

from __future__ import annotations

import json
import tomllib
import warnings
from types import SimpleNamespace

import pytest
import torch
from experiments_tiny_configs import TINY_DIGITS_TOML

from diffusionformer.experiments import analyze as A
from diffusionformer.experiments import load_experiment_config, run_experiment
from diffusionformer.experiments.publish import publish_experiment, summary_table
from diffusionformer.experiments.results import run_status


def _config(old: str = "", new: str = ""):
    return load_experiment_config(tomllib.loads(TINY_DIGITS_TOML.replace(old, new)))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    run_experiment(_config(), root, progress=False)
    return root


@pytest.mark.parametrize("old, new, changed", [
    ("laplacian_heads = 1", "laplacian_heads = 2", [None, "model_config (laplacian_heads: 1 then 2)"]),
    ("laplacian_heads = 1", 'heads = "heat:1,attention:1"',
     [None, "model_config (heads: None then 'heat:1,attention:1', laplacian_heads: 1 then None)"]),
    ('name = "attention"', 'name = "attention"\nlaplacian_heads = "half"',
     ["model_config (laplacian_heads: None then 1)", None]),
    ("depth = 1", "depth = 2", ["model_config (depth: 1 then 2)"] * 2),
    ("num_heads = 2}", "num_heads = 2, qk_norm = true}", ["model_config (qk_norm: False then True)"] * 2),
    ("laplacian_heads = 1", 'laplacian_heads = "half"', [None, None]),  # "half" of 2 heads: the same model
])
def test_bug_run_status_reports_changed_model_config(tiny, old, new, changed):
    """Bug: ``run_status``'s ``changed`` compared only the ``train`` entry of a run's ``run_config.json``: after a
    setting's ``laplacian_heads`` went from 1 to 2 (or its heads spec, or a task's ``model_overrides`` changed) the
    finished runs of the old model read as completed runs of the new config, and ``analyze`` (which rebuilds the old
    model from ``run_config.json``), ``publish`` and ``summary`` filed them under the new definition without a word."""
    rows = run_status(_config(old, new), tiny)
    assert [r["state"] for r in rows] == ["completed", "completed"]
    assert [r["changed"] for r in rows] == changed


def test_bug_analyze_publish_summary_catch_changed_heads(tiny, tmp_path, monkeypatch):
    """Bug: ``analyze`` measured the runs of a setting with ``laplacian_heads = 1`` under a config now saying 2 and
    filed them under its name silently; ``publish`` published them and ``summary`` tabled them without a word. Now
    ``analyze`` and ``summary`` warn and ``publish`` refuses, naming the changed model field."""
    now = _config("laplacian_heads = 1", "laplacian_heads = 2")
    monkeypatch.setattr(A, "analyze_run", lambda model, data, **kw: {
        "layers": [{"layer": 0, "within_variance": 1.0}], "spectra": [[1.0]], "coefficients": [], "pca_rgb": None,
        "info": {"num_examples": 1}})
    with pytest.warns(RuntimeWarning, match=r"1 finished run\(s\).*'digits' / 'lap' seed 0 "
                                            r"\(model_config \(laplacian_heads: 1 then 2\)\)"):
        A.analyze_experiment(now, tiny, progress=False, plots=False, device="cpu", max_examples=4,
                             max_attention_examples=2)
    with pytest.raises(ValueError, match=r"laplacian_heads: 1 then 2"):
        publish_experiment(now, tiny, tmp_path / "docs")
    with pytest.warns(UserWarning, match=r"summary: .*laplacian_heads: 1 then 2"):
        summary_table([now], tiny)
    with warnings.catch_warnings():  # the config the runs were made with: no word
        warnings.simplefilter("error")
        assert all(r["changed"] is None for r in run_status(_config(), tiny))


def _fake_analysis(monkeypatch):
    monkeypatch.setattr(A, "load_run", lambda rdir: SimpleNamespace(model=torch.nn.Identity(), step=2))
    monkeypatch.setattr(A, "task_data", lambda *a: SimpleNamespace(kind="image"))
    monkeypatch.setattr(A, "_check_run_data", lambda *a: None)
    monkeypatch.setattr(A, "_check_run_preprocessing", lambda *a: None)  # the fake data records no preprocessing
    monkeypatch.setattr(A, "_warn_other_train", lambda *a: None)
    monkeypatch.setattr(A, "analyze_run", lambda model, data, **kw: {
        "layers": [{"layer": 0, "within_variance": 1.0}], "spectra": [[1.0]], "coefficients": [], "pca_rgb": None,
        "info": {"num_examples": 1}})


def test_bug_new_analysis_leaves_no_earlier_figures(tiny, tmp_path, monkeypatch):
    """Bug: the ``plots/*.png`` of an earlier analysis survived a new one (``plots=False``, a task dropped from the
    config, a figure not drawn this time) beside the new ``metrics.json``, so the folder mixed two analyses. Now the
    figures of the earlier analysis's tasks that this one did not draw are removed; other files (and names an earlier
    ``metrics.json`` could point outside the folder with) are left alone."""
    _fake_analysis(monkeypatch)
    adir = tiny / "tiny" / "analysis"
    pdir = adir / "plots"
    pdir.mkdir(parents=True, exist_ok=True)
    stale = ["digits_smoothing.png", "digits_pca_maps.png", "dropped_spectra.png", "dropped_learned_operators.png"]
    for name in stale:
        (pdir / name).write_bytes(b"old figure")
    outside = tmp_path / "x_smoothing.png"
    outside.write_bytes(b"not analyze's")
    mine = ["notes.png", "digits_extra.png", "other_smoothing.png"]
    for name in mine:
        (pdir / name).write_bytes(b"the user's")
    (adir / "metrics.json").write_text(json.dumps({"tasks": {"dropped": {}},
                                                   "skipped_tasks": {f"../../../../{tmp_path.name}/x": "hostile"}}))
    A.analyze_experiment(_config(), tiny, progress=False, plots=False, device="cpu")
    assert sorted(p.name for p in pdir.iterdir()) == sorted(mine)
    assert outside.read_bytes() == b"not analyze's"
