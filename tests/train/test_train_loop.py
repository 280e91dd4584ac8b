from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from train_tiny_tasks import RegressionTask, TinyMLP, tiny_config

from diffusionformer.train import Trainer, cosine_lr, load_checkpoint, read_metrics, seed_everything, train


def _model(seed: int = 0) -> TinyMLP:
    seed_everything(seed)
    return TinyMLP()


def test_fit_logs_evaluates_checkpoints_and_learns(tmp_path):
    cfg = tiny_config(eval_steps=3)
    task = RegressionTask()
    model = _model()
    initial = task.evaluate(model, None)["loss"]
    task.eval_calls.clear()
    summary = Trainer(model, task, cfg, tmp_path).fit()

    records = read_metrics(tmp_path)
    train_recs = [r for r in records if r["split"] == "train"]
    eval_recs = [r for r in records if r["split"] == "eval"]
    assert [r["step"] for r in train_recs] == list(range(1, 11))
    assert [r["step"] for r in eval_recs] == [5, 10]
    assert task.eval_calls == [3, 3]  # eval_steps is passed as max_batches
    for r in train_recs:
        assert set(r) == {"step", "split", "loss", "lr", "metrics", "elapsed", "time"}
        assert r["lr"] == pytest.approx(cosine_lr(r["step"] - 1, lr=1e-2, min_lr=1e-3, warmup_steps=2,
                                                  decay_steps=10))
        assert set(r["metrics"]) == {"mae", "one", "grad_norm"} and r["metrics"]["one"] == 1.0
    assert eval_recs[-1]["loss"] == eval_recs[-1]["metrics"]["loss"] < initial

    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == summary
    assert summary["status"] == "completed" and summary["step"] == 10
    assert summary["eval"]["loss"] == eval_recs[-1]["loss"]
    assert summary["num_parameters"] == sum(p.numel() for p in model.parameters())
    ckpt = load_checkpoint(tmp_path / "checkpoint.pt")
    assert ckpt["step"] == 10
    for name, tensor in model.state_dict().items():
        assert torch.equal(ckpt["model"][name], tensor)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "metrics.jsonl", "summary.json"]


def test_log_interval_averages_window(tmp_path):
    cfg = tiny_config(log_interval=4, eval_interval=0, checkpoint_interval=0)
    Trainer(_model(), RegressionTask(), cfg, tmp_path / "a").fit()
    Trainer(_model(), RegressionTask(), tiny_config(eval_interval=0, checkpoint_interval=0), tmp_path / "b").fit()
    coarse = [r for r in read_metrics(tmp_path / "a") if r["split"] == "train"]
    fine = [r for r in read_metrics(tmp_path / "b") if r["split"] == "train"]
    assert [r["step"] for r in coarse] == [4, 8, 10]
    assert coarse[0]["loss"] == pytest.approx(sum(r["loss"] for r in fine[:4]) / 4, rel=1e-6)
    assert coarse[2]["loss"] == pytest.approx(sum(r["loss"] for r in fine[8:]) / 2, rel=1e-6)


@pytest.mark.parametrize("clip", [0.5, 0.0])
def test_grad_clipping(tmp_path, clip):
    # Targets scaled by 1000 give gradient norms far above the threshold.
    model = _model()
    cfg = tiny_config(max_steps=1, grad_clip=clip, warmup_steps=0)
    Trainer(model, RegressionTask(target_scale=1000.0), cfg, tmp_path).fit()
    # The gradients of the last update stay in .grad: their norm after clipping.
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    (record,) = [r for r in read_metrics(tmp_path) if r["split"] == "train"]
    if clip:
        assert record["metrics"]["grad_norm"] > 100 * clip  # the norm before clipping
        assert norm.item() == pytest.approx(clip, rel=1e-5)
    else:
        assert "grad_norm" not in record["metrics"]
        assert norm.item() > 100


def test_evaluation_does_not_change_training(tmp_path):
    # evaluate() draws from torch/NumPy/Python global RNGs; the trainer must isolate it, so
    # evaluating every step or never gives the same weights (dropout and jitter use those RNGs).
    a, b = _model(), _model()
    Trainer(a, RegressionTask(), tiny_config(eval_interval=1), tmp_path / "a").fit()
    Trainer(b, RegressionTask(), tiny_config(eval_interval=0), tmp_path / "b").fit()
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name


def test_same_seed_same_run_other_seed_differs(tmp_path):
    runs = []
    for i, seed in enumerate([0, 0, 1]):
        model = _model()
        train(model, RegressionTask(), tiny_config(seed=seed), tmp_path / str(i))
        runs.append(model.fc1.weight.detach().clone())
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_refuses_to_overwrite_a_run(tmp_path):
    Trainer(_model(), RegressionTask(), tiny_config(max_steps=2), tmp_path).fit()
    with pytest.raises(FileExistsError, match="expected an empty run directory"):
        Trainer(_model(), RegressionTask(), tiny_config(max_steps=2), tmp_path).fit()


def test_bf16_autocast_on_request(tmp_path):
    seen = []

    class Probe(RegressionTask):
        def loss(self, model, batch):
            out = model(batch["x"])
            seen.append(out.dtype)
            return nn.functional.mse_loss(out.float(), batch["y"]), {}

    summary = Trainer(_model(), Probe(), tiny_config(max_steps=2, amp="bf16"), tmp_path).fit()
    assert summary["amp"] == "bf16" and seen == [torch.bfloat16, torch.bfloat16]
    seen.clear()
    summary = Trainer(_model(), Probe(), tiny_config(max_steps=2), tmp_path / "off").fit()
    assert summary["amp"] == "off" and seen == [torch.float32, torch.float32]


class _BadLoss(RegressionTask):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def loss(self, model, batch):
        pred = model(batch["x"])
        if self.kind == "not_tuple":
            return pred.mean()
        if self.kind == "vector":
            return pred.mean(0), {}
        if self.kind == "no_grad":
            return pred.detach().mean(), {}
        return pred.mean(), {"acc": "high"}


@pytest.mark.parametrize(
    ("kind", "error", "message"),
    [
        ("not_tuple", TypeError, "expected a (loss, metrics) tuple, got Tensor at step 0"),
        ("vector", TypeError, "expected a scalar floating loss tensor, got tensor of shape (2,)"),
        ("no_grad", ValueError, "expected a loss that requires grad"),
        ("metric", TypeError, "metrics['acc']: expected a float or scalar tensor, got str"),
    ],
)
def test_bad_task_outputs(tmp_path, kind, error, message):
    with pytest.raises(error) as info:
        Trainer(_model(), _BadLoss(kind), tiny_config(max_steps=1, warmup_steps=0), tmp_path).fit()
    assert message in str(info.value)


def test_bad_constructor_arguments(tmp_path):
    with pytest.raises(TypeError, match="missing train_batch, evaluate"):
        Trainer(_model(), type("T", (), {"loss": lambda self, m, b: None})(), tiny_config(), tmp_path)
    with pytest.raises(TypeError, match="expected config to be a TrainConfig, got dict"):
        Trainer(_model(), RegressionTask(), {"max_steps": 1}, tmp_path)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected model to be an nn.Module, got function"):
        Trainer(lambda x: x, RegressionTask(), tiny_config(), tmp_path)  # type: ignore[arg-type]
    trainer = Trainer(_model(), RegressionTask(), tiny_config(), tmp_path)
    assert repr(trainer) == (
        f"Trainer(model=TinyMLP, task=RegressionTask, out_dir={str(tmp_path)!r}, max_steps=10, step=0)"
    )


def test_compile_wraps_the_model_and_matches_eager(tmp_path, monkeypatch):
    # Inductor code generation takes ~20 s on a small CPU; dynamo's "eager" backend exercises the
    # same wrapping (graph capture, OptimizedModule, state-dict names) in about a second.
    calls = []
    real_compile = torch.compile

    def eager_compile(model, **kwargs):
        calls.append(type(model).__name__)
        return real_compile(model, backend="eager")

    monkeypatch.setattr(torch, "compile", eager_compile)
    compiled, plain = _model(), _model()
    cfg = tiny_config(max_steps=4, eval_interval=2)
    Trainer(compiled, RegressionTask(), tiny_config(max_steps=4, eval_interval=2, compile=True), tmp_path / "c").fit()
    Trainer(plain, RegressionTask(), cfg, tmp_path / "p").fit()
    assert calls == ["TinyMLP"]
    ckpt = load_checkpoint(tmp_path / "c" / "checkpoint.pt")
    assert list(ckpt["model"]) == list(plain.state_dict())  # no "_orig_mod." prefixes
    for name, tensor in plain.state_dict().items():
        torch.testing.assert_close(compiled.state_dict()[name], tensor, atol=1e-6, rtol=0)
