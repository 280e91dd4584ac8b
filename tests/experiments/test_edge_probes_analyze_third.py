"""Edge-case probes of the study analysis (``experiments/analyze.py``, ``analysis/report.py``): the reported per-layer
numbers against explicit float64 formulas on a saved run's model, and the per-run cache against the metric registry."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from diffusionformer.analysis import report as R
from diffusionformer.data import load_dataset
from diffusionformer.data.splits import seeded_subset
from diffusionformer.experiments import analyze as A
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.reload import load_run
from diffusionformer.experiments.results import run_dir


def _reference(states: list[torch.Tensor]) -> list[dict[str, float]]:
    """Dirichlet energy (complete graph, scale-free), effective rank and mean cosine per layer, float64, by hand."""
    rows = []
    for X in states:
        X = X[:, 1:].double()  # patch tokens: the class token left out
        T = X.shape[1]
        C = X - X.mean(dim=1, keepdim=True)
        energy = ((C ** 2).sum(dim=(1, 2)) / (X ** 2).sum(dim=(1, 2))).mean().item()
        u = X / X.norm(dim=-1, keepdim=True)
        cosine = (((u.sum(dim=1) ** 2).sum(dim=-1) - T) / (T * (T - 1))).mean().item()
        s = torch.linalg.svdvals(C.reshape(-1, C.shape[-1]))
        p = s[s > 0] / s.sum()
        rows.append({"dirichlet_complete": energy, "effective_rank": math.exp(-(p * p.log()).sum().item()),
                     "mean_cosine": cosine})
    return rows


def test_reported_layers_match_float64_formulas_on_the_saved_model_whatever_the_batch_size(tmp_path, run_folder):
    """Layer 0 is the input of block 0 and layer l the output of block l - 1 (forward hooks on the reloaded model);
    the numbers do not depend on the batch size (a smaller last batch weighs its sequences as the others)."""
    rdir, _ = run_folder(tmp_path / "run", summary={"status": "completed"})
    model = load_run(rdir).model.eval()
    data = load_dataset("digits")
    x = data.split("test")[0][seeded_subset(data.split("test")[0].shape[0], 30, 1234)]
    states: list[torch.Tensor] = []
    hooks = [model.blocks[0].register_forward_pre_hook(lambda m, a: states.append(a[0].detach()))]
    hooks += [b.register_forward_hook(lambda m, a, o: states.append((o[0] if isinstance(o, tuple) else o).detach()))
              for b in model.blocks]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    expected = _reference(states)
    results = [A.analyze_run(model, data, max_examples=30, max_attention_examples=5, batch_size=bs)
               for bs in (7, 30)]  # 7: a last batch of 2
    for res in results:
        assert [r["layer"] for r in res["layers"]] == list(range(len(model.blocks) + 1))
        for got, want in zip(res["layers"], expected):
            for key, value in want.items():
                assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    # the seeded held-out subset: the same every call (up to float32 rounding: a batch of 7 and one of 30 multiply in
    # other blockings, so the tokens agree to about 1e-7, not bit for bit)
    for a, b in zip(results[0]["layers"], results[1]["layers"]):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(b[key], float):
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-8, nan_ok=True), key
            else:  # the layer index, a metric left out (None)
                assert a[key] == b[key], key


def _study(out: Path) -> Any:
    config = load_experiment_config({
        "name": "fake", "seeds": [0],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2}}],
        "operators": [{"name": "attention"}],
    })
    rdir = run_dir(out / "fake", "digits", "attention", 0)
    rdir.mkdir(parents=True)
    (rdir / "summary.json").write_text('{"status": "completed"}')
    (rdir / "checkpoint.pt").write_bytes(b"weights")
    return config


def test_bug_a_metric_registered_after_an_analysis_is_measured_by_the_next_one(tmp_path, monkeypatch):
    """Bug: the per-run cache key named the checkpoint and the settings but not the registered metrics, so a second
    ``analyze`` after ``register_metric`` read every run's cache and the new metric was silently missing from
    metrics.json and its table column (n/a)."""
    config = _study(tmp_path)
    calls: list[int] = []

    def analyze_run(model: Any, data: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append(1)
        layers = [{"layer": 0, **{m.key: 1.0 for m in R.list_metrics()}}]
        return {"layers": layers, "spectra": [[1.0]], "coefficients": [], "pca_rgb": None,
                "info": {"num_examples": 4}}

    monkeypatch.setattr(A, "load_run", lambda rdir: type("Run", (), {"model": torch.nn.Identity(), "step": 1})())
    monkeypatch.setattr(A, "analyze_run", analyze_run)
    A.analyze_experiment(config, tmp_path, progress=False, device="cpu", plots=False)
    A.analyze_experiment(config, tmp_path, progress=False, device="cpu", plots=False)
    assert len(calls) == 1  # the cache is read when nothing changed
    R.register_metric("probe37_token_norm", group="smoothing", column="norm")(lambda v: 2.0)
    try:
        result = A.analyze_experiment(config, tmp_path, progress=False, device="cpu", plots=False)
    finally:
        R.unregister_metric("probe37_token_norm")
    assert len(calls) == 2
    assert result["tasks"]["digits"]["operators"]["attention"]["seeds"]["0"]["layers"][0]["probe37_token_norm"] == 1.0
