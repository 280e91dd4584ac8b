"""Second round of edge-case probes of ``analyze`` (``experiments/analyze.py``): each ``test_bug_*`` failed before
its fix (its docstring says how)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from diffusionformer.experiments import analyze as A
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import run_dir


def _finish(out: Path, op: str, seed: int) -> Path:
    rdir = run_dir(out / "f", "img", op, seed)
    rdir.mkdir(parents=True)
    (rdir / "summary.json").write_text('{"status": "completed"}')
    (rdir / "checkpoint.pt").write_bytes(b"weights")
    return rdir


def test_bug_partial_pca_maps_of_another_fold_are_not_drawn_over_the_first_folds_images(tmp_path, monkeypatch):
    """Bug: with k-fold cross-validation each fold has its own test split, and each setting's PCA maps are of the
    first held-out images of its first finished run; ``--partial`` with setting ``a`` finished for seed 0 (fold 0)
    and setting ``b`` only for seed 1 (fold 1) drew ``b``'s maps of fold 1's images and ``a``'s maps of fold 0's
    beside one row of images, which were fold 1's (the last setting's): ``a``'s maps shown under images they are
    not of. Only maps of the images drawn are kept now (here ``a``'s, with fold 0's images)."""
    config = load_experiment_config({
        "name": "f", "seeds": [0, 1],
        "tasks": [{"name": "img", "dataset": "digits", "model": "vit-digits", "folds": 2,
                   "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2}}],
        "operators": [{"name": "a"}, {"name": "b", "laplacian_heads": 1}]})
    _finish(tmp_path, "a", 0)
    _finish(tmp_path, "b", 1)
    folds = {k: SimpleNamespace(kind="image", split=lambda split, k=k: (torch.full((6, 1, 2, 2), float(k)), None))
             for k in (0, 1)}
    monkeypatch.setattr(A, "task_data", lambda task, seed, root, cache: folds[task.fold_of(seed)])
    monkeypatch.setattr(A, "load_run", lambda rdir: SimpleNamespace(model=torch.nn.Identity(), step=2))
    monkeypatch.setattr(A, "_check_run_data", lambda *a: None)

    def analyze_run(model, data, **kwargs):  # PCA maps tagged with the fold of the images they are of
        fold = float(data.split("test")[0][0, 0, 0, 0])
        return {"layers": [{"layer": 0, "within_variance": 1.0}], "spectra": [[1.0]], "coefficients": [],
                "pca_rgb": torch.full((4, 3, 2, 2), fold), "info": {"num_examples": 6}}

    drawn: dict[str, Any] = {}
    monkeypatch.setattr(A, "analyze_run", analyze_run)
    monkeypatch.setattr(A, "_write_plots", lambda pdir, result, spectra, pca, images: drawn.update(pca=pca, images=images))
    with pytest.warns(RuntimeWarning, match="not trained yet"):
        A.analyze_experiment(config, tmp_path, progress=False, device="cpu", partial=True)
    image_fold = float(drawn["images"]["img"][0, 0, 0, 0])
    assert drawn["images"]["img"].shape[0] == 4
    assert drawn["pca"]["img"], "no PCA maps at all"
    for name, maps in drawn["pca"]["img"].items():
        assert float(maps[0, 0, 0, 0]) == image_fold, f"setting {name}: maps of fold {maps[0, 0, 0, 0]}, images of fold {image_fold}"
