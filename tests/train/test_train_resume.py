from __future__ import annotations

import pytest
import torch
from train_tiny_tasks import RegressionTask, SimulatedKill, TinyMLP, tiny_config

from diffusionformer.train import TrainConfig, Trainer, load_checkpoint, read_metrics, seed_everything


def _run(out, cfg: TrainConfig, task: RegressionTask, *, resume=False, model_seed: int = 0) -> Trainer:
    seed_everything(model_seed)
    trainer = Trainer(TinyMLP(), task, cfg, out, resume=resume)
    trainer.fit()
    return trainer


def _assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            _assert_same_tensors(a[key], b[key])
        elif isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def _strip(records: list[dict]) -> list[tuple]:
    return [(r["step"], r["split"], r["loss"], r["lr"], r["metrics"]) for r in records]


@pytest.mark.parametrize(("kill", "log_interval"), [("exception", 1), ("exception", 4), ("max_steps", 1)])
def test_killed_run_resumes_to_identical_weights(tmp_path, kill, log_interval):
    # Dropout (torch RNG), the NumPy/Python loss jitter and the batch generator all have to be
    # restored, with the optimizer moments and the step, for the weights to match bit for bit.
    # log_interval=4 with checkpoints every 3 steps cuts a log window at the checkpoint.
    cfg = tiny_config(lr_decay_steps=10, log_interval=log_interval)
    reference = _run(tmp_path / "ref", cfg, RegressionTask())

    out = tmp_path / "killed"
    if kill == "exception":
        with pytest.raises(SimulatedKill):
            _run(out, cfg, RegressionTask(fail_at=7))
        assert load_checkpoint(out / "checkpoint.pt")["step"] == 6
        logged = [r["step"] for r in read_metrics(out) if r["split"] == "train"]
        assert logged == (list(range(1, 8)) if log_interval == 1 else [4])
        with open(out / "metrics.jsonl", "a") as f:
            f.write('{"step": 8, "split": "tr')  # a write cut off by the kill
        resumed_from = 6
    else:
        _run(out, tiny_config(max_steps=4, lr_decay_steps=10), RegressionTask())
        resumed_from = 4

    task = RegressionTask()
    resumed = _run(out, cfg, task, resume=True, model_seed=123)  # other init: weights must come from disk
    assert task.steps_seen == list(range(resumed_from, 10))
    assert resumed.summary["resumed_from"] == resumed_from

    _assert_same_tensors(resumed.model.state_dict(), reference.model.state_dict())
    ref_ckpt, new_ckpt = load_checkpoint(tmp_path / "ref" / "checkpoint.pt"), load_checkpoint(out / "checkpoint.pt")
    _assert_same_tensors(new_ckpt["optimizer"], ref_ckpt["optimizer"])
    _assert_same_tensors(new_ckpt["rng"], ref_ckpt["rng"])

    records, ref_records = read_metrics(out), read_metrics(tmp_path / "ref")
    train_steps = [r["step"] for r in records if r["split"] == "train"]
    assert train_steps == (list(range(1, 11)) if log_interval == 1 else [4, 8, 10])  # none twice, none lost
    ref_train = [r for r in ref_records if r["split"] == "train"]
    assert _strip([r for r in records if r["split"] == "train"]) == _strip(ref_train)
    evals = {r["step"]: r for r in records if r["split"] == "eval"}
    assert sorted(evals) == ([5, 10] if kill == "exception" else [4, 5, 10])
    for r in ref_records:
        if r["split"] == "eval":
            assert _strip([evals[r["step"]]]) == _strip([r])


def test_resume_rejects_a_config_that_changes_the_updates(tmp_path):
    _run(tmp_path, tiny_config(max_steps=4), RegressionTask())
    with pytest.raises(ValueError) as info:
        _run(tmp_path, tiny_config(max_steps=4, lr=2e-2, seed=1), RegressionTask(), resume=True)
    assert "lr: checkpoint 0.01, now 0.02" in str(info.value)
    assert "seed: checkpoint 0, now 1" in str(info.value)
    # extending a run whose decay horizon was max_steps changes the schedule
    with pytest.raises(ValueError, match=r"lr_decay_steps \(resolved; None = max_steps\): checkpoint 4, now 10"):
        _run(tmp_path, tiny_config(max_steps=10), RegressionTask(), resume=True)
    with pytest.raises(ValueError, match="expected max_steps >= the checkpoint's step 4, got 3"):
        _run(tmp_path, tiny_config(max_steps=3, lr_decay_steps=4), RegressionTask(), resume=True)


def test_resuming_a_finished_run_is_a_no_op(tmp_path):
    cfg = tiny_config(max_steps=4)
    first = _run(tmp_path, cfg, RegressionTask())
    log = (tmp_path / "metrics.jsonl").read_text()
    task = RegressionTask()
    again = _run(tmp_path, cfg, task, resume=True)
    assert task.steps_seen == [] and task.eval_calls == []
    assert (tmp_path / "metrics.jsonl").read_text() == log
    assert again.summary["eval"] == first.summary["eval"] and again.summary["train"] == first.summary["train"]


def test_resume_true_without_checkpoint_starts_fresh_and_drops_stale_log(tmp_path):
    cfg = tiny_config(max_steps=5, checkpoint_interval=0)
    with pytest.raises(SimulatedKill):
        _run(tmp_path, cfg, RegressionTask(fail_at=3))  # killed before its first checkpoint
    assert not (tmp_path / "checkpoint.pt").exists()
    task = RegressionTask()
    trainer = _run(tmp_path, cfg, task, resume=True)
    assert task.steps_seen == list(range(5)) and trainer.summary["resumed_from"] is None
    assert [r["step"] for r in read_metrics(tmp_path) if r["split"] == "train"] == [1, 2, 3, 4, 5]


def test_resume_from_an_explicit_checkpoint_path(tmp_path):
    cfg = tiny_config(lr_decay_steps=10)
    reference = _run(tmp_path / "ref", cfg, RegressionTask())
    _run(tmp_path / "a", tiny_config(max_steps=6, lr_decay_steps=10), RegressionTask())
    trainer = _run(tmp_path / "b", cfg, RegressionTask(), resume=tmp_path / "a" / "checkpoint.pt")
    _assert_same_tensors(trainer.model.state_dict(), reference.model.state_dict())
    with pytest.raises(FileNotFoundError, match="missing"):
        _run(tmp_path / "c", cfg, RegressionTask(), resume=tmp_path / "nope.pt")
