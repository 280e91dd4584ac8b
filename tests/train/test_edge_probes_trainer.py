"""Edge-case probes of ``diffusionformer.train`` (Trainer, TrainConfig, Task protocol, loggers).

Probed: max_steps=1 against a hand-written AdamW step; eval/checkpoint intervals larger than the
run; warm-up longer than the run; an empty batch; frozen and all-frozen models; a float64 model;
bf16/fp16 autocast; numpy scalars as metrics; a task metric named ``loss``/``grad_norm``;
micro-batching a batch that does not split; ``out_dir`` that is a file; torn last lines of
``metrics.jsonl`` and ``metrics.csv`` on resume; resuming with a changed resumable field; two
trainers on one run directory.

Found and fixed (tests whose docstring starts with "Bug:"):

* a training metric named ``"loss"`` was averaged into the logged train loss with
  ``grad_accum_steps=1`` (a loss of 1.7 logged as 50.8) and silently dropped with
  ``grad_accum_steps>1``; a task ``"grad_norm"`` was silently overwritten. Both are refused now.
* NumPy scalars (``np.float32``, ``np.int64``) as ``task.loss`` or ``task.evaluate`` metrics were a
  ``TypeError`` "expected a float ..., got float32".
* with ``grad_accum_steps > 1`` a batch that does not split into equal micro-batches raised
  shard_batch's message about ``world_size`` and "the number of processes" on a single process.
* ``out_dir`` naming an existing file raised mkdir's bare ``[Errno 17] File exists``.
* on resume, ``metrics.csv`` kept a row torn by a kill (``"1"`` of step 12, ``"3,tr"``) when its
  partial step was <= the checkpoint's: a bogus row in the middle of the table
  (``metrics.jsonl`` already dropped such a line).
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from train_tiny_tasks import RegressionTask, SimulatedKill, TinyMLP, tiny_config

from diffusionformer.train import NonFiniteLossError, Trainer, TrainConfig, read_metrics, read_metrics_csv
from diffusionformer.train.checkpoint import load_checkpoint


def _fit(tmp_path, task, model=None, *, resume=False, **cfg):
    torch.manual_seed(0)
    model = TinyMLP() if model is None else model
    summary = Trainer(model, task, tiny_config(**cfg), tmp_path, resume=resume).fit()
    return summary, model


class _WithMetric(RegressionTask):
    def __init__(self, extra, **kw):
        super().__init__(global_rng=False, **kw)
        self.extra = extra

    def loss(self, model, batch):
        loss, metrics = super().loss(model, batch)
        return loss, {**metrics, **self.extra}


# ----------------------------------------------------------------------------- bugs fixed
@pytest.mark.parametrize("accum", [1, 2])
def test_metric_named_loss_is_refused(tmp_path, accum):
    """Bug: a task.loss metric "loss" was averaged into the logged train loss (accum 1: 1.66 logged as
    50.8) or silently dropped (accum 2); now a ValueError naming the key, before any update."""
    model = TinyMLP()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"task.loss metrics: expected names other than \['loss'\]"):
        _fit(tmp_path, _WithMetric({"loss": torch.tensor(100.0)}), model, grad_accum_steps=accum)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_metric_named_grad_norm_is_refused_only_when_the_trainer_logs_one(tmp_path):
    """Bug: a task metric "grad_norm" was overwritten by the clipped norm without a word; with
    grad_clip=0 (no trainer norm) it is the task's and is logged as given."""
    with pytest.raises(ValueError, match="grad_norm"):
        _fit(tmp_path / "a", _WithMetric({"grad_norm": 7.0}), grad_clip=1.0, max_steps=1, warmup_steps=0)
    summary, _ = _fit(tmp_path / "b", _WithMetric({"grad_norm": 7.0}), grad_clip=0.0, max_steps=1,
                      warmup_steps=0)
    assert summary["train"]["metrics"]["grad_norm"] == 7.0


def test_numpy_scalar_metrics_are_numbers(tmp_path):
    """Bug: np.float32 / np.int64 metrics from task.loss or task.evaluate were a TypeError
    "expected a float or scalar tensor, got float32"."""

    class Task(_WithMetric):
        def evaluate(self, model, max_batches):
            return {**super().evaluate(model, max_batches), "auc": np.float32(0.25), "count": np.int64(4)}

    summary, _ = _fit(tmp_path, Task({"acc32": np.float32(0.5), "n": np.int64(3)}), max_steps=2,
                      warmup_steps=0, log_interval=2)
    assert summary["train"]["metrics"]["acc32"] == 0.5 and summary["train"]["metrics"]["n"] == 3.0
    assert summary["eval"]["metrics"]["auc"] == 0.25 and summary["eval"]["metrics"]["count"] == 4.0
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["metrics"]["count"] == 4.0


def test_micro_batch_split_error_names_grad_accum_steps(tmp_path):
    """Bug: a 3-row batch with grad_accum_steps=2 on one process raised "divisible by world_size=2 ...
    a multiple of the number of processes"; now the message names grad_accum_steps and the step."""

    class FullBatch(RegressionTask):
        def train_batch(self, step, generator, batch_size):
            return super().train_batch(step, generator, 3)  # ignores batch_size, like a full-graph task

    with pytest.raises(ValueError, match=r"grad_accum_steps=2: .*train_batch\(step=0.* 2 equal micro-batches"):
        _fit(tmp_path, FullBatch(), grad_accum_steps=2)
    assert not (tmp_path / "checkpoint.pt").exists()


def test_out_dir_that_is_a_file(tmp_path):
    """Bug: out_dir naming an existing file raised mkdir's bare "[Errno 17] File exists"; now it
    says a directory was expected, and the file is untouched."""
    path = tmp_path / "run"
    path.write_text("notes")
    with pytest.raises(NotADirectoryError, match="expected out_dir to be a directory.*the file"):
        _fit(path, RegressionTask(), max_steps=1, warmup_steps=0)
    assert path.read_text() == "notes"


@pytest.mark.parametrize("torn", ["1", "3,tr"])
def test_torn_last_csv_row_is_dropped_on_resume(tmp_path, torn):
    """Bug: a metrics.csv row cut short by a kill ("1" of step 12, "3,tr") survived the resume's cut
    back when its partial step was <= the checkpoint's: a bogus row in the table. The JSON-lines
    log dropped the same torn line; both logs now hold the same records."""
    cfg = dict(loggers=["jsonl", "csv"], checkpoint_interval=6)
    with pytest.raises(SimulatedKill):
        _fit(tmp_path, RegressionTask(fail_at=7), **cfg)
    with open(tmp_path / "metrics.csv", "a", newline="") as f:
        f.write(torn)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 1')
    _fit(tmp_path, RegressionTask(), resume=True, **cfg)
    from_csv = [(r["step"], r["split"]) for r in read_metrics_csv(tmp_path)]
    from_jsonl = [(r["step"], r["split"]) for r in read_metrics(tmp_path)]
    assert from_csv == from_jsonl
    assert [s for s, _ in from_csv] == sorted(s for s, _ in from_csv)


# ----------------------------------------------------------------------------- legal edge cases
def test_one_step_run_matches_a_hand_written_adamw_step(tmp_path):
    """max_steps=1: one update equal to AdamW written out by hand (decay on matrices only), one train
    and one eval record at step 1, and a checkpoint at step 1."""
    task = RegressionTask(global_rng=False)
    torch.manual_seed(0)
    model = TinyMLP(dropout=0.0)
    ref = copy.deepcopy(model).double()
    lr, wd, (b1, b2), eps = 0.05, 0.1, (0.9, 0.95), 1e-8
    _fit(tmp_path, task, model, max_steps=1, warmup_steps=0, lr=lr, min_lr=0.0, weight_decay=wd, grad_clip=0.0)

    batch = task.train_batch(0, torch.Generator().manual_seed(0), 8)
    F.mse_loss(ref(batch["x"].double()), batch["y"].double()).backward()
    for (name, p), new in zip(ref.named_parameters(), model.parameters()):
        g = p.grad
        m_hat, v_hat = (1 - b1) * g / (1 - b1), (1 - b2) * g * g / (1 - b2)
        decay = wd if p.dim() >= 2 else 0.0
        expected = p.detach() * (1 - lr * decay) - lr * m_hat / (v_hat.sqrt() + eps)
        torch.testing.assert_close(new.detach().double(), expected, atol=2e-6, rtol=0, msg=name)
    records = [(r["step"], r["split"]) for r in read_metrics(tmp_path)]
    assert records == [(1, "train"), (1, "eval")]
    assert load_checkpoint(tmp_path / "checkpoint.pt")["step"] == 1


def test_intervals_longer_than_the_run_act_once_at_the_end(tmp_path):
    task = RegressionTask()
    _fit(tmp_path, task, max_steps=3, warmup_steps=0, eval_interval=50, checkpoint_interval=50, log_interval=50)
    assert [(r["step"], r["split"]) for r in read_metrics(tmp_path)] == [(3, "train"), (3, "eval")]
    assert task.eval_calls == [None] and load_checkpoint(tmp_path / "checkpoint.pt")["step"] == 3


def test_warmup_longer_than_the_run(tmp_path):
    """warmup_steps=10 > max_steps=4 (lr_decay_steps=20): the logged lr is lr (s+1)/(W+1) at each update."""
    _fit(tmp_path, RegressionTask(), max_steps=4, warmup_steps=10, lr_decay_steps=20, lr=0.11)
    lrs = [r["lr"] for r in read_metrics(tmp_path) if r["split"] == "train"]
    assert lrs == pytest.approx([0.11 * (s + 1) / 11 for s in range(4)], rel=1e-12)


def test_empty_batch_is_a_non_finite_loss_and_writes_no_checkpoint(tmp_path):
    class Empty(RegressionTask):
        def train_batch(self, step, generator, batch_size):
            return super().train_batch(step, generator, 0)

    with pytest.raises(NonFiniteLossError, match="at step 0") as info:
        _fit(tmp_path, Empty(), max_steps=2, warmup_steps=0)
    assert info.value.last_checkpoint_step is None and not (tmp_path / "checkpoint.pt").exists()
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "non_finite"


class _FrozenFirst(TinyMLP):
    def __init__(self):
        super().__init__()
        self.fc1.requires_grad_(False)


def test_frozen_parameters_stay_put_and_are_not_optimised(tmp_path):
    torch.manual_seed(0)
    model = _FrozenFirst()
    frozen = {k: v.clone() for k, v in model.fc1.state_dict().items()}
    trained = model.fc2.weight.clone()
    trainer = Trainer(model, RegressionTask(), tiny_config(max_steps=3), tmp_path)
    trainer.fit()
    assert all(torch.equal(frozen[k], v) for k, v in model.fc1.state_dict().items())
    assert not torch.equal(trained, model.fc2.weight)
    names = [n for g in trainer.optimizer.param_groups for n in g["names"]]
    assert sorted(names) == ["fc2.bias", "fc2.weight", "norm.bias", "norm.weight"]


def test_all_frozen_model_is_refused_before_training(tmp_path):
    model = TinyMLP().requires_grad_(False)
    task = RegressionTask()
    with pytest.raises(ValueError, match="expected a model with trainable parameters, got TinyMLP with none"):
        _fit(tmp_path, task, model)
    assert task.steps_seen == [] and not (tmp_path / "checkpoint.pt").exists()


def test_float64_model_trains_and_resumes_in_float64(tmp_path):
    class Task64(RegressionTask):
        def loss(self, model, batch):  # in float64 throughout (torch 2.11 refuses mse_loss(float32, float64)'s backward)
            pred = model(batch["x"].double())
            return torch.nn.functional.mse_loss(pred, batch["y"].double()), {}

        def evaluate(self, model, max_batches):
            return {"w_mean": model.fc1.weight.mean()}

    torch.manual_seed(0)
    model = TinyMLP().double()
    with pytest.raises(SimulatedKill):
        Trainer(model, Task64(fail_at=4), tiny_config(), tmp_path).fit()
    torch.manual_seed(0)
    whole = TinyMLP().double()
    Trainer(whole, Task64(), tiny_config(), tmp_path / "whole").fit()
    resumed = TinyMLP().double()
    Trainer(resumed, Task64(), tiny_config(), tmp_path, resume=True).fit()
    for a, b in zip(whole.parameters(), resumed.parameters()):
        assert a.dtype == torch.float64 and torch.equal(a, b)


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_evaluate_runs_under_autocast_and_its_low_precision_tensors_are_logged(tmp_path, amp):
    class Task(RegressionTask):
        def evaluate(self, model, max_batches):
            out = model(self.x_eval)
            return {"dtype_is_low": float(out.dtype in (torch.bfloat16, torch.float16)), "mean": out.mean()}

    summary, _ = _fit(tmp_path, Task(), max_steps=2, warmup_steps=0, amp=amp)
    assert summary["eval"]["metrics"]["dtype_is_low"] == 1.0 and math.isfinite(summary["eval"]["metrics"]["mean"])


def test_resume_with_changed_resumable_fields_is_bit_identical(tmp_path):
    """Changing log/eval/checkpoint intervals and max_steps (with lr_decay_steps fixed) on resume does
    not change the updates; the log holds each step once."""
    cfg = dict(max_steps=6, lr_decay_steps=8)
    whole = _fit(tmp_path / "whole", RegressionTask(), **cfg)[1]
    with pytest.raises(SimulatedKill):
        _fit(tmp_path / "cut", RegressionTask(fail_at=4), **cfg)
    resumed = _fit(tmp_path / "cut", RegressionTask(), resume=True, max_steps=6, lr_decay_steps=8,
                   log_interval=2, eval_interval=0, checkpoint_interval=0)[1]
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters(), resumed.parameters()))
    train_steps = [r["step"] for r in read_metrics(tmp_path / "cut") if r["split"] == "train"]
    assert train_steps == [1, 2, 3, 4, 6]


def test_second_trainer_on_a_finished_run_directory_is_refused_and_changes_nothing(tmp_path):
    _fit(tmp_path, RegressionTask(), max_steps=2, warmup_steps=0)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(FileExistsError, match="expected an empty run directory"):
        _fit(tmp_path, RegressionTask(), max_steps=2, warmup_steps=0)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_tied_weights_are_optimised_once_and_stay_tied(tmp_path):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(4, 4)
            self.head = nn.Linear(4, 4, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, x):
            return self.head(x @ self.emb.weight)[:, :2]

    torch.manual_seed(0)
    model = Tied()
    trainer = Trainer(model, RegressionTask(), tiny_config(max_steps=2, warmup_steps=0, weight_decay_rule="nanogpt"),
                      tmp_path)
    trainer.fit()
    groups = [(g["names"], g["weight_decay"]) for g in trainer.optimizer.param_groups]
    assert groups == [(["emb.weight"], 0.1)]
    assert model.head.weight is model.emb.weight


def test_betas_from_a_numpy_pair():
    """Bug: ``TrainConfig(betas=np.array([0.9, 0.95]))`` (a sweep grid's pair) was refused ("expected a pair
    (beta1, beta2), got ndarray") although every other field takes numpy numbers. A 1-D array of two is now read
    as the tuple of Python floats it holds: the config equals, and serialises as, the one made from a tuple;
    arrays of another shape and betas outside [0, 1) stay refused."""
    got = TrainConfig(betas=np.array([0.9, 0.95]))
    assert got.betas == (0.9, 0.95) and all(type(b) is float for b in got.betas)
    assert got == TrainConfig(betas=(0.9, 0.95)) and got.to_dict() == TrainConfig(betas=(0.9, 0.95)).to_dict()
    for bad in (np.array([[0.9, 0.95]]), np.array([0.9, 0.95, 0.99])):
        with pytest.raises(TypeError, match=r"TrainConfig.betas: expected a pair \(beta1, beta2\), got numpy\.ndarray"):
            TrainConfig(betas=bad)
    with pytest.raises(ValueError, match=r"TrainConfig.betas\[1\]: expected a float in \[0, 1\), got 1.5"):
        TrainConfig(betas=np.array([0.9, 1.5]))
