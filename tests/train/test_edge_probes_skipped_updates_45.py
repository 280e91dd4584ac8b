"""Edge-case probes (sitting 45) of the fp16 GradScaler's skipped updates in the train log: each train record of an
``amp="fp16"`` run counts the updates of its window the scaler skipped (``metrics.skipped_updates``), checked against
an independent count of the ``optimizer.step`` calls the scaler made, with and without clipping, and across a kill
and resume inside a window.
"""

from __future__ import annotations

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from diffusionformer.train import Trainer, read_metrics
from diffusionformer.train.loggers import read_metrics_csv
from train_tiny_tasks import InfGradAt, RegressionTask, SimulatedKill, TinyMLP, fp16_supported, tiny_config

needs_fp16 = pytest.mark.skipif(not fp16_supported(), reason="this torch build has no fp16 CPU autocast")

_BAD = {1, 4, 5, 7, 8, 9, 13}  # updates whose gradient is infinite at any loss scale


class _InfGradAtSteps(InfGradAt):
    """An infinite gradient (and a finite loss) at every update in ``steps``; ``fail_at`` kills the run there."""

    def __init__(self, steps, fail_at=None):
        super().__init__(bad=-1, global_rng=False)
        self.steps, self.fail_at = set(steps), fail_at

    def loss(self, model, batch):
        self.bad = self.step if self.step in self.steps else -1
        return super().loss(model, batch)


class _Applied:
    """The trainer steps (``task.step``) at which the scaler called ``optimizer.step``: every other one was skipped."""

    def __init__(self, task):
        self.task = task

    def __enter__(self):
        self.steps: list[int] = []
        self._handle = register_optimizer_step_pre_hook(lambda opt, args, kwargs: self.steps.append(self.task.step))
        return self

    def __exit__(self, *exc):
        self._handle.remove()


def _train(records):
    return [r for r in records if r["split"] == "train"]


def _expected(applied, max_steps, log_interval):
    """``{logged step: skipped updates of its window}`` from the applied steps."""
    out, prev = {}, 0
    for done in range(1, max_steps + 1):
        if done % log_interval == 0 or done == max_steps:
            out[done] = sum(1 for s in range(prev, done) if s not in applied)
            prev = done
    return out


@needs_fp16
@pytest.mark.parametrize("grad_clip", [0.0, 1.0])
def test_bug_fp16_log_counts_the_skipped_updates_of_each_window(tmp_path, grad_clip):
    """Bug: under amp="fp16" the GradScaler skips an update whose gradients overflow, and the train log did not say
    how many: without clipping a window of 4 updates with 3 skipped logged a loss and metrics like a healthy one
    (with clipping only ``grad_norm`` went null, whatever the number of skips). Now every fp16 train record holds
    ``metrics.skipped_updates``, the number of updates of its window the scaler skipped, in the JSON-lines and the
    CSV log alike; a float32 run logs no such key."""
    task = _InfGradAtSteps(_BAD)
    cfg = tiny_config(amp="fp16", grad_clip=grad_clip, max_steps=14, log_interval=4, eval_interval=0,
                      checkpoint_interval=0, loggers=("jsonl", "csv"))
    with _Applied(task) as applied:
        Trainer(TinyMLP(dropout=0.0), task, cfg, tmp_path).fit()
    want = _expected(set(applied.steps), 14, 4)
    assert not set(applied.steps) & _BAD and sum(want.values()) >= len(_BAD)
    train = _train(read_metrics(tmp_path))
    got = {r["step"]: r["metrics"]["skipped_updates"] for r in train}
    assert got == want
    assert all(type(v) is int for v in got.values())
    assert {r["step"]: r["metrics"]["skipped_updates"] for r in _train(read_metrics_csv(tmp_path))} == want
    if grad_clip > 0:  # the null norm of a window with a skip, as before
        assert all((r["metrics"]["grad_norm"] is None) == (want[r["step"]] > 0) for r in train)

    off = tiny_config(**{**cfg.to_dict(), "amp": "off"})
    Trainer(TinyMLP(dropout=0.0), RegressionTask(global_rng=False), off, tmp_path / "fp32").fit()
    assert all("skipped_updates" not in r["metrics"] for r in read_metrics(tmp_path / "fp32"))


@needs_fp16
def test_bug_fp16_skipped_updates_of_a_window_cut_by_a_kill_survive_the_resume(tmp_path):
    """Bug (with the count above): the count of a window that a checkpoint cuts (checkpoint at 6 inside the window
    5..8, killed at step 7) must go on from the checkpoint; the resumed log equals the uninterrupted run's, counts
    and all, and both equal the independent count of the applied updates."""
    def cfg(max_steps):
        return tiny_config(amp="fp16", grad_clip=0.0, max_steps=max_steps, log_interval=4, eval_interval=0,
                           checkpoint_interval=3)

    def strip(records):
        return [{k: v for k, v in r.items() if k not in ("elapsed", "time")} for r in records]

    full_task = _InfGradAtSteps(_BAD)
    torch.manual_seed(0)  # both models start from one init (the test passed alone only by the test order's seed)
    with _Applied(full_task) as applied:
        Trainer(TinyMLP(dropout=0.0), full_task, cfg(14), tmp_path / "full").fit()
    torch.manual_seed(0)
    with pytest.raises(SimulatedKill):
        Trainer(TinyMLP(dropout=0.0), _InfGradAtSteps(_BAD, fail_at=7), cfg(14), tmp_path / "cut").fit()
    Trainer(TinyMLP(dropout=0.0), _InfGradAtSteps(_BAD), cfg(14), tmp_path / "cut", resume=True).fit()
    full, cut = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "cut")
    want = _expected(set(applied.steps), 14, 4)
    assert {r["step"]: r["metrics"]["skipped_updates"] for r in _train(full)} == want
    assert want[8] >= 3  # steps 5, 7 and 8 of the cut window are skipped, on both sides of the checkpoint
    assert strip(cut) == strip(full)


@needs_fp16
def test_bug_fp16_task_metric_named_skipped_updates_is_refused(tmp_path):
    """Bug (with the count above): a task metric named ``skipped_updates`` would be summed into the trainer's own
    count under fp16; it is refused as ``loss``/``grad_norm`` are, and still accepted without fp16."""

    class Named(RegressionTask):
        def loss(self, model, batch):
            loss, metrics = super().loss(model, batch)
            return loss, {**metrics, "skipped_updates": 1.0}

    cfg = tiny_config(amp="fp16", max_steps=2, eval_interval=0, checkpoint_interval=0)
    with pytest.raises(ValueError, match=r"names other than \['skipped_updates'\]"):
        Trainer(TinyMLP(dropout=0.0), Named(global_rng=False), cfg, tmp_path / "fp16").fit()
    off = tiny_config(**{**cfg.to_dict(), "amp": "off", "max_steps": 4, "log_interval": 2})
    Trainer(TinyMLP(dropout=0.0), Named(global_rng=False), off, tmp_path / "off").fit()
    # the task's metric, a window mean as any other (not the trainer's sum)
    assert [r["metrics"]["skipped_updates"] for r in _train(read_metrics(tmp_path / "off"))] == [1.0, 1.0]
