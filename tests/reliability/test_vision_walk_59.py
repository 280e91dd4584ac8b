"""A vision researcher's walk (helper 59f): a ViT with Laplacian and heat heads on CIFAR-10, then the runner.

Findings pinned here: ``show`` printed a task without its training-batch augmentation, label smoothing, model
selection and the other task settings that are not the data, model or budget, so a ``--set`` of them did not
show and two tasks that differ by them alone printed alike; ``run`` refused, on the config alone, a model whose
``patch_size`` divides the data's images but not the stand-in size of a preset made for other images (DINO on
CIFAR-10 from ``dino-mnist``, the only way there), although ``show`` accepted it and it trains.
"""

from __future__ import annotations

_TOML = """\
name = "walk59"
seeds = [0]
[[tasks]]
name = "plain"
dataset = "digits"
model = "vit-digits"
model_overrides = {dim = 8, depth = 1, num_heads = 2}
[tasks.train]
max_steps = 2
[[tasks]]
name = "augmented"
dataset = "digits"
model = "vit-digits"
model_overrides = {dim = 8, depth = 1, num_heads = 2}
augment = {crop_padding = 1, flip = true}
label_smoothing = 0.1
select_by = "val_acc"
[tasks.train]
max_steps = 2
[[operators]]
name = "attention"
"""


def _task_lines(capsys) -> dict[str, str]:
    out = capsys.readouterr().out.splitlines()
    return {line.split(":", 1)[0].split()[-1]: line for line in out if line.startswith("  task ")}


def test_bug_show_prints_a_tasks_augment_smoothing_and_selection(tmp_path, capsys):
    """Bug: ``show`` printed ``task augmented: digits -> vit-digits, metric test_acc, train {...}, model_overrides
    {...}`` exactly as the unaugmented task: its ``augment``, ``label_smoothing`` and ``select_by`` (what the
    gpu-vision recipe's task is made of) did not show."""
    from diffusionformer.experiments.cli import main

    path = tmp_path / "walk.toml"
    path.write_text(_TOML, encoding="utf-8")
    assert main(["show", str(path)]) == 0
    lines = _task_lines(capsys)
    plain, augmented = lines["plain"], lines["augmented"]
    assert plain.endswith(", model_overrides {dim = 8, depth = 1, num_heads = 2}"), plain  # nothing set: as before
    assert augmented != plain.replace("plain", "augmented")
    for part in ("augment {crop_padding = 1, flip = true}", "label_smoothing 0.1", "select_by val_acc"):
        assert part in augmented, augmented


def test_bug_show_prints_a_set_of_a_tasks_settings(tmp_path, capsys):
    """Bug: a ``--set`` of a task's augmentation, evaluation batch or data seed did not show (the docs: ``show``
    prints the result of a ``--set``)."""
    from diffusionformer.experiments.cli import main

    path = tmp_path / "walk.toml"
    path.write_text(_TOML, encoding="utf-8")
    assert main(["show", str(path), "--set", "tasks.plain.augment={flip = true}", "--set",
                 "tasks.plain.eval_batch_size=64", "--set", "tasks.plain.data_seed=3"]) == 0
    plain = _task_lines(capsys)["plain"]
    for part in ("augment {flip = true}", "eval_batch_size 64", "data_seed 3"):
        assert part in plain, plain


def _preset_of_other_images(model: str) -> dict:
    """digits (8x8 images) from a preset made for 28x28 MNIST, with 8x8 patches: they divide the data's images, not
    the preset's."""
    dino = model.startswith("dino")
    overrides = {"patch_size": 8, "dim": 8, "depth": 1, "num_heads": 2}
    if dino:  # its momentum schedule as long as the run (else a warning) and a small projection head
        overrides.update(schedule_steps=1, out_dim=8, head_hidden=8, head_bottleneck=4)
    return {"name": "walk59-sizes", "seeds": [0],
            "tasks": [{"name": "digits", "dataset": "digits", "model": model, "model_overrides": overrides,
                       "metric": "knn_test_acc" if dino else "test_acc", "train": {"max_steps": 1, "batch_size": 4}}],
            "operators": [{"name": "attention"}, {"name": "laplacian", "laplacian_heads": 1}]}


def test_bug_run_takes_the_datas_image_size_not_the_presets(tmp_path):
    """Bug: ``run`` checked every model on the config alone with the preset's sizes standing in for the data's, and
    refused ``patch_size = 8`` of a 28x28 preset on 8x8 (or 32x32 CIFAR-10) images ("ViTConfig.patch_size=8 must
    divide input_size=(28, 28)"), a size the data replaces; ``show`` loaded the data and accepted the config."""
    from diffusionformer.experiments import load_experiment_config, run_experiment
    from diffusionformer.experiments.validate import validate_experiment

    for model in ("vit-mnist", "dino-mnist"):
        config = load_experiment_config(_preset_of_other_images(model))
        assert validate_experiment(config) == []  # show's check, with the data
        results = run_experiment(config, tmp_path / model, progress=False)
        assert [r.status for r in results] == ["completed"] * 2, results
        assert results[0].num_parameters == results[1].num_parameters > 0


def test_run_still_refuses_a_patch_size_the_data_refuses(tmp_path):
    """The fix loads the data only to judge a model that does not build from the preset's sizes: a patch size the
    data's images refuse too is refused before anything is written, naming the data's size."""
    import pytest

    from diffusionformer.experiments import load_experiment_config, run_experiment

    raw = _preset_of_other_images("vit-mnist")
    raw["tasks"][0]["model_overrides"]["patch_size"] = 3
    with pytest.raises(ValueError, match=r"patch_size=3 must divide input_size=\(8, 8\)"):
        run_experiment(load_experiment_config(raw), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
