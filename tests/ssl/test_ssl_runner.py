"""DINO through the experiment runner: results, k-NN metrics, exact resume, analysis, clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from diffusionformer.data.base import ClassificationData
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.experiments.tasks import ClassificationTask, DINOTask, build_task, model_overrides_for_data
from diffusionformer.models import DINOConfig, create_model


def tiny_config(**extra: Any) -> Any:
    cfg = {
        "name": "tiny-ssl",
        "seeds": [0],
        "tasks": [{
            "name": "digits-dino",
            "dataset": "digits",
            "model": "dino-digits",
            "metric": "knn_test_acc",
            "model_overrides": {"dim": 16, "depth": 2, "num_heads": 2, "out_dim": 32, "head_hidden": 32,
                                "head_bottleneck": 8, "schedule_steps": 6,
                                "warmup_teacher_temp": 0.02, "warmup_teacher_temp_steps": 3},
            "ssl": {"local_crops": 1},
            "train": {"max_steps": 6, "batch_size": 16, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 3,
                      "log_interval": 2, "checkpoint_interval": 2},
        }],
        "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": "half"}],
    }
    cfg.update(extra)
    return load_experiment_config(cfg)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, list[Any]]:
    out = tmp_path_factory.mktemp("ssl")
    cfg = tiny_config()
    results = run_experiment(cfg, out, progress=False, log=lambda _: None)
    return cfg, out, results


def test_runner_trains_and_scores_by_knn(finished):
    cfg, out, results = finished
    assert [r.status for r in results] == ["completed", "completed"]
    root = out / "tiny-ssl"
    data = json.loads((root / "results.json").read_text())
    assert all(0.0 <= r["value"] <= 1.0 for r in data["runs"])
    # Laplacian heads keep the parameter count; the teacher (buffers) is not counted
    assert data["runs"][0]["num_parameters"] == data["runs"][1]["num_parameters"]
    model = create_model("dino-digits", **cfg.tasks[0].model_overrides)
    assert data["runs"][0]["num_parameters"] == sum(p.numel() for p in model.student.parameters())
    rdir = run_dir(root, "digits-dino", "lap", 0)
    records = [json.loads(line) for line in (rdir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [3, 6]
    assert set(evals[-1]["metrics"]) == {"knn_val_acc", "knn_test_acc", "loss"}
    train = [r for r in records if r["split"] == "train"]
    assert {"teacher_entropy", "teacher_mean_entropy", "momentum", "teacher_temp"} <= set(train[-1]["metrics"])
    assert all(0.0 <= r["metrics"]["teacher_entropy"] <= torch.log(torch.tensor(32.0)).item() + 1e-5 for r in train)
    identity = json.loads((rdir / "run_config.json").read_text())
    assert identity["model_config"]["laplacian_heads"] == 1 and identity["model_config"]["out_dim"] == 32
    # the teacher moved away from its initial copy and the centre was updated
    state = torch.load(rdir / "checkpoint.pt", weights_only=True)["model"]
    assert state["center"].abs().sum() > 0
    assert not torch.equal(state["teacher.backbone.patch_embed.weight"], state["student.backbone.patch_embed.weight"])
    assert "| attention |" in (root / "results.md").read_text()


def test_evaluation_reproduces_the_recorded_knn_accuracy(finished):
    cfg, out, _ = finished
    from diffusionformer.data import load_dataset
    from diffusionformer.experiments.runner import build_model

    task = cfg.tasks[0]
    data = load_dataset(task.dataset, seed=task.data_seed)
    model = build_model(task, cfg.operators[0], data)
    rdir = run_dir(out / "tiny-ssl", task.name, "attention", 0)
    model.load_state_dict(torch.load(rdir / "checkpoint.pt", weights_only=True)["model"])
    adapter = build_task(data, model)
    assert isinstance(adapter, DINOTask)
    got = adapter.evaluate(model.eval(), None)
    recorded = json.loads((rdir / "summary.json").read_text())["eval"]["metrics"]
    assert got["knn_test_acc"] == pytest.approx(recorded["knn_test_acc"], abs=1e-9)
    assert got["loss"] == pytest.approx(recorded["loss"], rel=1e-5)


def test_killed_run_resumes_to_the_same_teacher_student_and_centre(tmp_path):
    from diffusionformer.experiments.tasks import DINOTask
    from diffusionformer.testing import assert_same_checkpoint_weights, interrupt_on_call

    cfg = load_experiment_config(tiny_config().to_dict(), ["operators=lap"])
    run_experiment(cfg, tmp_path / "clean", progress=False)
    # after the checkpoint of step 4, inside the update of step 5 (the EMA update of that call happens)
    with interrupt_on_call(DINOTask, "loss", 6, after=True), pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "killed", progress=False)
    rdir = run_dir(tmp_path / "killed" / "tiny-ssl", "digits-dino", "lap", 0)
    assert torch.load(rdir / "checkpoint.pt", weights_only=True)["step"] == 4
    assert not (rdir / "summary.json").exists()
    run_experiment(cfg, tmp_path / "killed", progress=False)
    clean = run_dir(tmp_path / "clean" / "tiny-ssl", "digits-dino", "lap", 0) / "checkpoint.pt"
    assert any(k.startswith("teacher.") for k in torch.load(clean, weights_only=True)["model"])
    assert_same_checkpoint_weights(clean, rdir / "checkpoint.pt")
    sa = json.loads((run_dir(tmp_path / "clean" / "tiny-ssl", "digits-dino", "lap", 0) / "summary.json").read_text())
    sb = json.loads((rdir / "summary.json").read_text())
    assert sa["eval"]["metrics"] == sb["eval"]["metrics"]


def test_analysis_inspects_the_teacher_backbone_with_pca_maps(finished):
    pytest.importorskip("matplotlib")
    from diffusionformer.experiments.analyze import analyze_experiment

    cfg, out, _ = finished
    result = analyze_experiment(cfg, out, max_examples=64, max_attention_examples=8, progress=False, device="cpu")
    task = result["tasks"]["digits-dino"]
    assert task["network"].startswith("DINO teacher backbone") and task["tokens_per_sequence"] == 16
    seed = task["operators"]["lap"]["seeds"]["0"]
    assert seed["heldout_accuracy"] is None and len(seed["layers"]) == 3
    assert all(isinstance(v, float) for v in seed["layers"][-1].values() if v is not None and not isinstance(v, int))
    assert len(seed["coefficients"]) == 2
    assert (out / "tiny-ssl" / "analysis" / "plots" / "digits-dino_pca_maps.png").is_file()


def _sequence_data() -> ClassificationData:
    x, y = torch.zeros(4, 10, 1), torch.zeros(4, dtype=torch.long)
    return ClassificationData("toy-signals", "sequence", x, y, x, y, x, y, num_classes=2, input_shape=(10, 1))


def test_non_image_data_is_refused_clearly():
    data = _sequence_data()
    with pytest.raises(ValueError, match="DINO needs image data"):
        model_overrides_for_data(data, DINOConfig)
    model = create_model("dino-digits", dim=16, depth=1, num_heads=2)
    with pytest.raises(ValueError, match="DINOTask needs image data"):
        build_task(data, model)
    # supervised models keep their adapter
    assert isinstance(build_task(data, create_model("vit-mnist1d", depth=1, dim=16)), ClassificationTask)
    with pytest.raises(TypeError, match="DINOTask expects a DINO model"):
        DINOTask.__init__(DINOTask.__new__(DINOTask), _image_data(), torch.nn.Linear(2, 2))


def _image_data() -> ClassificationData:
    x, y = torch.zeros(4, 1, 8, 8), torch.zeros(4, dtype=torch.long)
    return ClassificationData("toy-images", "image", x, y, x, y, x, y, num_classes=2, input_shape=(1, 8, 8))


def test_task_batches_wrappers_and_capped_evaluation():
    import copy

    from diffusionformer.data import load_dataset
    from diffusionformer.models import knn_classify

    data = load_dataset("digits")
    torch.manual_seed(0)
    model = create_model("dino-digits", dim=16, depth=1, num_heads=2, out_dim=16, head_hidden=16, head_bottleneck=8)
    task = build_task(data, model, eval_batch_size=50)
    a = task.train_batch(3, torch.Generator().manual_seed(5), 8)
    b = task.train_batch(3, torch.Generator().manual_seed(5), 8)
    assert a.keys() == b.keys() and a["step"] == 3
    assert all(torch.equal(a[k], b[k]) for k in a if k != "step")

    class Wrapper(torch.nn.Module):  # what DistributedDataParallel looks like to the task
        def __init__(self, module: torch.nn.Module) -> None:
            super().__init__()
            self.module = module

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.module(*args, **kwargs)

    twin = copy.deepcopy(model)
    loss_w, metrics_w = task.loss(Wrapper(model), a)
    loss_d, metrics_d = task.loss(twin, a)
    assert torch.equal(loss_w, loss_d) and torch.equal(model.center, twin.center)
    assert metrics_w["momentum"] == model.config.momentum_at(3)
    # step 3 > 0: the teacher took an EMA step towards the (unchanged) student, so it stayed (up to rounding)
    assert torch.allclose(model.teacher.head.prototypes, model.student.head.prototypes, rtol=1e-6, atol=1e-9)

    model.eval()
    got = task.evaluate(model, max_batches=1)
    with torch.no_grad():
        bank, queries = model(data.x_train[:50]), model(data.x_test[:50])
    pred = knn_classify(bank, data.y_train[:50], queries, 10, k=20, temperature=0.07)
    assert got["knn_test_acc"] == pytest.approx((pred == data.y_test[:50]).float().mean().item(), abs=1e-9)
