"""The SSL task's settings (views, k-NN evaluation): SSLConfig, the task's ``ssl`` table, and the
deprecated DINOConfig-style model overrides (same run, same identity, a DeprecationWarning)."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from diffusionformer.data.augment import MultiCropAugment
from diffusionformer.data.ssl import SSL_KEYS, SSLConfig
from diffusionformer.experiments import TaskConfig, load_experiment_config
from diffusionformer.experiments.reload import load_run
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.experiments.tasks import DINOTask, build_task
from diffusionformer.models import DINOConfig, create_model

MODEL = {"dim": 16, "depth": 2, "num_heads": 2, "out_dim": 32, "head_hidden": 32, "head_bottleneck": 8,
         "schedule_steps": 4, "warmup_teacher_temp": 0.02, "warmup_teacher_temp_steps": 3}
SSL = {"local_crops": 1, "knn_k": 5, "brightness": 0.3}
#: what DINOConfig recorded for these settings before they moved (the keys and values of a
#: run_config.json written by the code before the split; dino-digits blurs with sigma in [0.1, 0.6])
OLD_IDENTITY_KEYS = {"local_crops": 1, "global_crop_scale": [0.4, 1.0], "local_crop_scale": [0.1, 0.4],
                     "crop_ratio": [0.75, 1.3333333333333333], "flip_prob": 0.0, "brightness": 0.3,
                     "contrast": 0.4, "blur_prob": 0.5, "blur_sigma": [0.1, 0.6], "noise_std": 0.0,
                     "knn_k": 5, "knn_temperature": 0.07}


def _config(style: str) -> Any:
    task: dict[str, Any] = {
        "name": "digits-dino", "dataset": "digits", "model": "dino-digits", "metric": "knn_test_acc",
        "train": {"max_steps": 4, "batch_size": 8, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 2,
                  "log_interval": 2, "checkpoint_interval": 2},
    }
    if style == "old":
        task["model_overrides"] = {**MODEL, **SSL}
    else:
        task["model_overrides"], task["ssl"] = dict(MODEL), dict(SSL)
    return {"name": "ssl-cfg", "seeds": [0], "tasks": [task], "operators": [{"name": "lap", "laplacian_heads": 1}]}


def test_ssl_config_builds_the_augmentation_and_checks_its_values():
    cfg = SSLConfig(local_crops=2, global_crop_scale=(0.5, 0.9), blur_sigma=(0.2, 0.7), flip_prob=0.5)
    ref = MultiCropAugment(global_crops=2, local_crops=2, global_scale=(0.5, 0.9), local_scale=(0.1, 0.4),
                           ratio=(0.75, 4 / 3), flip_prob=0.5, brightness=0.4, contrast=0.4, blur_prob=0.5,
                           blur_sigma=(0.2, 0.7), noise_std=0.0)
    assert cfg.augmentation() == ref
    assert SSL_KEYS[0] == "local_crops" and len(SSL_KEYS) == 12
    assert not set(SSL_KEYS) & {f.name for f in dataclasses.fields(DINOConfig)}
    for kwargs, match in [(dict(knn_k=0), "SSLConfig.knn_k must be an int >= 1"),
                          (dict(knn_k=True), "SSLConfig.knn_k"),
                          (dict(knn_temperature=0.0), "SSLConfig.knn_temperature must be positive"),
                          (dict(local_crops=-1), "SSLConfig.local_crops must be an int >= 0"),
                          (dict(global_crop_scale=(0.9, 0.1)), "SSLConfig: .*global_scale"),
                          (dict(blur_prob=1.5), "SSLConfig: .*blur_prob")]:
        with pytest.raises(ValueError, match=match):
            SSLConfig(**kwargs)


def test_old_style_config_warns_and_gives_the_same_identity_and_training(tmp_path: Path):
    from diffusionformer.testing import assert_same_checkpoint_weights

    with pytest.warns(DeprecationWarning, match=r"model_overrides \['brightness', 'knn_k', 'local_crops'\].*ssl table"):
        old = load_experiment_config(_config("old"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        new = load_experiment_config(_config("new"))
    assert old.tasks[0].ssl == new.tasks[0].ssl == SSL and old.tasks[0].model_overrides == MODEL
    run_experiment(old, tmp_path / "old", progress=False, log=lambda _: None)
    run_experiment(new, tmp_path / "new", progress=False, log=lambda _: None)
    a, b = (run_dir(tmp_path / s / "ssl-cfg", "digits-dino", "lap", 0) for s in ("old", "new"))
    ida, idb = (json.loads((d / "run_config.json").read_text()) for d in (a, b))
    assert ida == idb
    # the settings sit under their old keys in the identity, so runs made before the split resume
    assert {k: ida["model_config"][k] for k in SSL_KEYS} == OLD_IDENTITY_KEYS
    assert_same_checkpoint_weights(a / "checkpoint.pt", b / "checkpoint.pt")
    ea, eb = (json.loads((d / "summary.json").read_text())["eval"]["metrics"] for d in (a, b))
    assert ea == eb and set(ea) == {"knn_val_acc", "knn_test_acc", "loss"}
    # a run of the old config is the same run for the new one: it is read back, not refused or retrained
    again = run_experiment(new, tmp_path / "old", progress=False, log=lambda _: None)
    assert [r.status for r in again] == ["completed"]
    # load_run takes the settings out of the model config and gives them back as the task's
    run = load_run(a)
    assert run.model.task_config == SSLConfig(local_crops=1, knn_k=5, brightness=0.3, blur_sigma=(0.1, 0.6))
    assert not hasattr(run.config, "knn_k")


def test_the_run_settings_reach_the_task_views_and_knn():
    from diffusionformer.data import load_dataset
    from diffusionformer.experiments.build import build_model
    from diffusionformer.models import knn_classify

    cfg = load_experiment_config(_config("new"))
    data = load_dataset("digits")
    torch.manual_seed(0)
    model = build_model(cfg.tasks[0], cfg.operators[0], data)
    assert model.task_config == SSLConfig(local_crops=1, knn_k=5, brightness=0.3, blur_sigma=(0.1, 0.6))
    task = build_task(data, model, eval_batch_size=50)
    assert isinstance(task, DINOTask) and task.ssl is model.task_config
    batch = task.train_batch(0, torch.Generator().manual_seed(0), 4)
    assert batch["theta"].shape[:2] == (4, 3)  # 2 global + 1 local view
    got = task.evaluate(model.eval(), max_batches=1)
    with torch.no_grad():
        bank, queries = model(data.x_train[:50]), model(data.x_test[:50])
    pred = knn_classify(bank, data.y_train[:50], queries, 10, k=5, temperature=0.07)
    assert got["knn_test_acc"] == pytest.approx((pred == data.y_test[:50]).float().mean().item(), abs=1e-9)
    # an explicit ssl wins over the model's; a dict of fields is accepted
    assert build_task(data, model, ssl={"knn_k": 7}).ssl == SSLConfig(knn_k=7)
    assert build_task(data, model, ssl=SSLConfig(local_crops=2)).augment.local_crops == 2


def test_presets_give_their_ssl_defaults_and_old_model_overrides_still_work():
    tiny = dict(dim=16, depth=1, num_heads=2)
    assert create_model("dino-digits", **tiny).task_config == SSLConfig(blur_sigma=(0.1, 0.6))
    assert create_model("dino-mnist", **tiny).task_config == SSLConfig()
    with pytest.warns(DeprecationWarning, match=r"\['knn_k', 'local_crops'\] are settings of the task \(SSLConfig\)"):
        model = create_model("dino-digits", **tiny, local_crops=2, knn_k=3)
    assert model.task_config == SSLConfig(local_crops=2, knn_k=3, blur_sigma=(0.1, 0.6))
    assert not hasattr(create_model("vit-digits", depth=1), "task_config")


def test_bad_ssl_settings_fail_clearly(tmp_path: Path):
    base = dict(name="t", dataset="digits", model="dino-digits")
    with pytest.raises(ValueError, match=r"task 't': SSLConfig.knn_k must be an int >= 1, got 0"):
        TaskConfig(**base, ssl={"knn_k": 0})
    with pytest.raises(ValueError, match=r"unknown key 'knn_kk'.*did you mean 'knn_k'"):
        TaskConfig(**base, ssl={"knn_kk": 3})
    with pytest.raises(ValueError, match=r"task 't': SSLConfig: .*global_scale"):
        TaskConfig(**base, ssl={"global_crop_scale": [0.9, 0.1]})
    with pytest.raises(ValueError, match="ssl applies to self-supervised .DINO. presets only, not to model 'vit-digits'"):
        TaskConfig(name="t", dataset="digits", model="vit-digits", ssl={"knn_k": 3})
    with pytest.raises(ValueError, match=r"\[.knn_k.\] set in both model_overrides and ssl"):
        TaskConfig(**base, model_overrides={"knn_k": 3}, ssl={"knn_k": 4})
    from diffusionformer.data import load_dataset

    data = load_dataset("digits")
    with pytest.raises(ValueError, match="ssl applies to DINO models only, not to DiffusionViT"):
        build_task(data, create_model("vit-digits", depth=1), ssl={"knn_k": 3})
    with pytest.raises(TypeError, match="ssl must be an SSLConfig, a dict of its fields or None, got int"):
        build_task(data, create_model("dino-digits", dim=16, depth=1, num_heads=2), ssl=3)


def test_a_toml_ssl_table_is_read(tmp_path: Path):
    path = tmp_path / "c.toml"
    path.write_text('name = "x"\nseeds = [0]\n[[tasks]]\nname = "d"\ndataset = "digits"\nmodel = "dino-digits"\n'
                    'metric = "knn_test_acc"\n[tasks.ssl]\nlocal_crops = 2\nblur_sigma = [0.2, 0.5]\n'
                    '[[operators]]\nname = "attention"\n')
    task = load_experiment_config(path).tasks[0]
    assert task.ssl == {"local_crops": 2, "blur_sigma": [0.2, 0.5]} and task.model_overrides == {}


def test_an_operator_setting_with_old_style_ssl_overrides_still_sets_the_run_views():
    from diffusionformer.data import load_dataset
    from diffusionformer.experiments import OperatorSetting
    from diffusionformer.experiments.build import build_model

    task = load_experiment_config(_config("new")).tasks[0]
    setting = OperatorSetting("two-local", model_overrides={"local_crops": 2})
    with pytest.warns(DeprecationWarning, match=r"\['local_crops'\] are settings of the task"):
        model = build_model(task, setting, load_dataset("digits"))
    # the setting's value wins over the task's, the task's other settings stay
    assert model.task_config == SSLConfig(local_crops=2, knn_k=5, brightness=0.3, blur_sigma=(0.1, 0.6))


def test_bug_validate_warns_when_the_momentum_schedule_is_not_the_runs_length():
    """Bug: the SSL tutorial says ``schedule_steps`` must equal ``train.max_steps``, but nothing checked it: a
    shorter schedule froze the teacher (momentum 1) before the run ended, a longer one never reached 1, silently.
    ``validate_experiment`` (run by ``run`` and ``validate``) now warns, naming both and the fix; equal: no warning."""
    import warnings

    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments.validate import validate_experiment

    def config(**overrides):
        return load_experiment_config({"name": "ssl", "seeds": [0], "tasks": [{
            "name": "dino", "dataset": "digits", "model": "dino-digits", "model_overrides": overrides, "metric": "knn_test_acc",
            "ssl": {}, "train": {"max_steps": 40}}], "operators": [{"name": "attention"}]})

    with pytest.warns(UserWarning, match=r"schedule_steps = 1000 steps and the run train.max_steps = 40: the "
                                         r"teacher's momentum never reaches 1; set model_overrides.schedule_steps = 40"):
        assert validate_experiment(config(), load_data=False) == []
    with pytest.warns(UserWarning, match=r"the teacher stops moving \(momentum 1\) before the run ends"):
        validate_experiment(config(schedule_steps=20), load_data=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate_experiment(config(schedule_steps=40), load_data=False)
