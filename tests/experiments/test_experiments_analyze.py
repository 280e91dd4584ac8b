"""The analysis command end to end on tiny comparisons: files, JSON structure, finite numbers, errors."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.analyze import analyze_experiment
from diffusionformer.experiments.runner import run_experiment

pytest.importorskip("matplotlib")

TRAIN = {"max_steps": 4, "batch_size": 16, "eval_interval": 4, "checkpoint_interval": 4, "warmup_steps": 0}
OPERATORS = [{"name": "attention"}, {"name": "laplacian", "laplacian_heads": 1}]
CORE = ("within_variance", "variance_ratio", "mean_cosine", "high_frequency_ratio", "rank_collapse_svd",
        "dirichlet_complete", "effective_rank", "stable_rank", "energy_top3", "power_law_alpha")


def vit_config() -> Any:
    return load_experiment_config({
        "name": "tiny-vit", "seeds": [0],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 16, "depth": 2, "num_heads": 2}, "train": TRAIN}],
        "operators": OPERATORS,
    })


def gpt_config() -> Any:
    return load_experiment_config({
        "name": "tiny-gpt", "seeds": [0],
        "tasks": [{"name": "chars", "dataset": "pydoc-chars", "model": "gpt-char-tiny", "metric": "val_loss",
                   "model_overrides": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
                   "train": {**TRAIN, "eval_steps": 2}}],
        "operators": OPERATORS,
    })


@pytest.fixture(scope="module")
def vit_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    out = tmp_path_factory.mktemp("vit")
    config = vit_config()
    run_experiment(config, out, progress=False, log=lambda _: None)
    return config, out


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def test_vit_comparison_writes_metrics_and_plots(vit_runs: tuple[Any, Path]) -> None:
    config, out = vit_runs
    result = analyze_experiment(config, out, max_examples=512, progress=False, device="cpu")
    adir = out / "tiny-vit" / "analysis"
    on_disk = json.loads((adir / "metrics.json").read_text())
    assert on_disk == result
    for name in ("smoothing", "spectra", "collapse", "pca_maps", "frequency_response"):
        path = adir / "plots" / f"digits_{name}.png"
        assert path.is_file() and path.stat().st_size > 0, path
    assert not (adir / "plots" / "digits_learned_operators.png").exists()  # nothing learned here
    readme = (adir / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| laplacian |"))
    wv = result["tasks"]["digits"]["operators"]["laplacian"]["seeds"]["0"]["layers"][-1]["within_variance"]
    assert row.split(" | ")[2] == f"{wv:.4g} ± n/a"  # one seed: the value itself, no sample std, no t

    task = result["tasks"]["digits"]
    assert task["kind"] == "image" and task["split"] == "test" and task["num_examples"] == 359
    assert task["tokens_per_sequence"] == 16  # patch tokens, class token dropped
    assert sorted(task["operators"]) == ["attention", "laplacian"]
    for name, op in task["operators"].items():
        seed = op["seeds"]["0"]
        assert seed["step"] == 4
        # the rebuilt model reproduces the run's own held-out accuracy: the checkpoint loaded exactly
        summary = json.loads((out / "tiny-vit" / "runs" / "digits" / name / "seed0" / "summary.json").read_text())
        assert seed["heldout_accuracy"] == pytest.approx(summary["eval"]["metrics"]["test_acc"], abs=1e-12)
        assert seed["heldout_loss"] == pytest.approx(summary["eval"]["metrics"]["test_loss"], rel=1e-5)
        layers = seed["layers"]
        assert [r["layer"] for r in layers] == [0, 1, 2]
        for r in layers:
            for key in (*CORE, "nc1", "nc2_etf_distance", "nc4_agreement", "seq_probe_acc", "anova_within_fraction"):
                assert finite(r[key]), (name, r["layer"], key, r[key])
            assert 0.0 <= r["variance_ratio"] <= 1.0
        assert layers[0]["dirichlet_attention"] is None
        assert all(finite(r["dirichlet_attention"]) for r in layers[1:])
        assert len(seed["singular_values_last_layer"]) == 16
        assert len(seed["coefficients"]) == 2  # one (H, K+1) table per block
        summary_rows = op["summary"]
        assert summary_rows[2]["within_variance"] == {"mean": layers[2]["within_variance"], "std": 0.0, "n": 1}
    lap_heads = task["operators"]["laplacian"]["seeds"]["0"]["coefficients"][0]
    assert lap_heads == [[0.0, 1.0], [1.0, -1.0]]  # attention head, then the Laplacian head I - P


def test_gpt_comparison_has_next_token_metrics(tmp_path: Path) -> None:
    config = gpt_config()
    run_experiment(config, tmp_path, progress=False, log=lambda _: None)
    result = analyze_experiment(config, tmp_path, max_examples=32, progress=False, plots=False, device="cpu")
    task = result["tasks"]["chars"]
    assert task["split"] == "val" and task["num_examples"] == 32 and task["labels"] == "next token"
    for op in task["operators"].values():
        layers = op["seeds"]["0"]["layers"]
        assert [r["layer"] for r in layers] == [0, 1]
        for r in layers:
            for key in (*CORE, "token_nc1", "token_probe_acc"):
                assert finite(r[key]), (r["layer"], key, r[key])
            assert "nc1" not in r  # no sequence labels for a language model
            assert 0.0 <= r["token_probe_acc"] <= 1.0
        assert finite(layers[1]["dirichlet_attention"])
    assert not (tmp_path / "tiny-gpt" / "analysis" / "plots").exists()


def test_missing_runs_name_the_path_and_the_command(tmp_path: Path) -> None:
    hint = r"python -m diffusionformer\.experiments run CONFIG"
    with pytest.raises(FileNotFoundError, match=r"tiny-vit.runs does not exist.*" + hint):
        analyze_experiment(vit_config(), tmp_path, progress=False)


def test_unfinished_runs_are_skipped_and_missing_checkpoints_fail(vit_runs: tuple[Any, Path], tmp_path: Path) -> None:
    config, out = vit_runs
    shutil.copytree(out / "tiny-vit", tmp_path / "tiny-vit")
    run = tmp_path / "tiny-vit" / "runs" / "digits" / "laplacian" / "seed0"
    (run / "summary.json").unlink()  # interrupted run: a checkpoint but no completed summary
    with pytest.warns(RuntimeWarning, match=r"laplacian.seed0 is not finished"):
        result = analyze_experiment(config, tmp_path, max_examples=8, progress=False, plots=False)
    assert sorted(result["tasks"]["digits"]["operators"]) == ["attention"]
    assert result["skipped_runs"] == [str(run)]

    shutil.rmtree(run)  # never started
    with pytest.raises(FileNotFoundError, match=r"1 run\(s\) .* no checkpoint: .*laplacian.seed0.checkpoint\.pt.*CONFIG"):
        analyze_experiment(config, tmp_path, progress=False, plots=False)
    with pytest.warns(RuntimeWarning, match=r"1 run\(s\) of 'tiny-vit' not trained yet; analysing the 1 finished"):
        partial = analyze_experiment(config, tmp_path, max_examples=8, progress=False, plots=False, partial=True)
    assert sorted(partial["tasks"]["digits"]["operators"]) == ["attention"] and partial["skipped_runs"] == [str(run)]

    (tmp_path / "tiny-vit" / "runs" / "digits" / "attention" / "seed0" / "checkpoint.pt").unlink()
    with pytest.raises(FileNotFoundError, match=r"marked completed but its checkpoint .*checkpoint\.pt is missing"):
        analyze_experiment(config, tmp_path, progress=False, plots=False)


def test_cli_dispatches_analyze(vit_runs: tuple[Any, Path], tmp_path: Path) -> None:
    from diffusionformer.experiments.cli import main

    config, out = vit_runs
    shutil.copytree(out / "tiny-vit", tmp_path / "tiny-vit")
    toml = tmp_path / "tiny.toml"
    toml.write_text(
        'name = "tiny-vit"\nseeds = [0]\n[[tasks]]\nname = "digits"\ndataset = "digits"\nmodel = "vit-digits"\n'
        "model_overrides = { dim = 16, depth = 2, num_heads = 2 }\n[tasks.train]\n"
        + "".join(f"{k} = {v}\n" for k, v in TRAIN.items())
        + '[[operators]]\nname = "attention"\n[[operators]]\nname = "laplacian"\nlaplacian_heads = 1\n'
    )
    assert main(["analyze", str(toml), "--out", str(tmp_path), "--max-examples", "8"]) == 0
    result = json.loads((tmp_path / "tiny-vit" / "analysis" / "metrics.json").read_text())
    assert result["tasks"]["digits"]["num_examples"] == 8


def test_learned_parameters_keep_their_shape_and_ppr_logits_become_alpha() -> None:
    pytest.importorskip("matplotlib")
    import math

    from diffusionformer.experiments.analyze import _figure, _learned_series, _plot_learned

    learned = {
        "blocks.0.attn.operators.1.theta": [[0.0, 1.0, 0.1], [0.1, 0.9, 0.0]],  # (G=2, K+1=3)
        "blocks.1.attn.operators.1.alpha_logit": [0.0, math.log(3.0)],
        "head.weight": [1.0],  # not an operator parameter
    }
    series = _learned_series(learned)
    assert sorted(series) == ["alpha", "theta"] and series["theta"][0].shape == (2, 3)
    assert series["alpha"][1].tolist() == pytest.approx([0.5, 0.75])
    fig = _figure()
    _plot_learned(fig, {"poly": [series, series]}, "t")
    ax_alpha, ax_theta = fig.axes
    assert len(ax_theta.lines) == 2 * 2 + 1  # heads x seeds, plus the zero line
    assert ax_theta.get_xlabel().startswith("k") and ax_alpha.get_ylabel() == "alpha"


def test_learned_parameter_table_averages_heads_and_seeds() -> None:
    from diffusionformer.experiments.analyze import _learned_markdown

    seeds = {str(i): {"learned_operators": {"blocks.0.attn.operators.1.t": [0.5 + i, 0.7 + i],
                                            "blocks.1.attn.operators.1.theta": [[0.0, 1.0], [0.2, 0.8]]}} for i in range(2)}
    rows = _learned_markdown({"operators": {"attention": {"seeds": {}}, "mix": {"seeds": seeds}}})
    assert "| mix | t | 0 | 1.100 [0.500, 1.700] | 4 |" in rows
    assert "| mix | theta | 1 | theta = +0.100, +0.900 | 4 |" in rows
    assert _learned_markdown({"operators": {"attention": {"seeds": {"0": {"learned_operators": {}}}}}}) == []


def test_second_analysis_reads_each_runs_cache_and_a_new_checkpoint_invalidates_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from diffusionformer.experiments import analyze as analyze_module

    out = tmp_path / "res"
    config = vit_config()
    run_experiment(config, out, progress=False, log=lambda _: None)
    calls = {"n": 0}
    original = analyze_module.analyze_run

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(analyze_module, "analyze_run", counting)
    first = analyze_experiment(config, out, progress=False, plots=False, max_examples=32)
    assert calls["n"] == 2
    second = analyze_experiment(config, out, progress=False, plots=False, max_examples=32)
    assert calls["n"] == 2 and second == first  # both runs read back, identical metrics
    analyze_experiment(config, out, progress=False, plots=False, max_examples=16)
    assert calls["n"] == 4  # other settings: measured again
    rdir = out / "tiny-vit" / "runs" / "digits" / "attention" / "seed0"
    ckpt = rdir / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes())  # a rewritten checkpoint (new mtime)
    analyze_experiment(config, out, progress=False, plots=False, max_examples=16)
    assert calls["n"] == 5
    (rdir / "analysis_cache.pt").write_bytes(b"garbage")  # unreadable cache: measured again, no error
    analyze_experiment(config, out, progress=False, plots=False, max_examples=16)
    assert calls["n"] == 6


def test_heldout_examples_are_a_seeded_subset_of_every_class_even_when_the_split_is_class_sorted() -> None:
    """The CIFAR-10 JPEG archives give a test split in class order; the first rows would be one class."""
    from diffusionformer.data.base import ClassificationData
    from diffusionformer.experiments.analyze import _heldout

    y = torch.arange(10).repeat_interleave(100)  # sorted by class
    x = torch.randn(1000, 1, 4, 4)
    data = ClassificationData(name="sorted", kind="image", x_train=x, y_train=y, x_val=x, y_val=y, x_test=x,
                              y_test=y, num_classes=10, input_shape=(1, 4, 4))
    batches, info = _heldout(data, torch.nn.Identity(), "test", max_examples=200, batch_size=64)
    labels = torch.cat([b[1] for b in batches])
    assert labels.numel() == 200 and labels.unique().numel() == 10 and "seeded random subset" in info["examples"]
    again, _ = _heldout(data, torch.nn.Identity(), "test", max_examples=200, batch_size=64)
    assert torch.equal(torch.cat([b[0] for b in again]), torch.cat([b[0] for b in batches]))  # the same rows every run
    rows = torch.cat([b[0] for b in batches]).flatten(1)
    assert all(any(torch.equal(r, xr) for xr in x.flatten(1)) for r in rows[:5])  # real rows, unchanged
