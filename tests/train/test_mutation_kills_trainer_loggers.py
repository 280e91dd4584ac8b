"""Tests written by a second mutation-testing audit of ``diffusionformer/train``, deeper into the
training loop (``trainer.py``: resume paths, evaluation boundaries, non-finite detection, summary)
and the metrics writers (``loggers.py``: CSV widening and truncation, TensorBoard purge, LogGroup).
Each kills a mutant that the existing suite let through, checked against an independent reference
(hand-computed values, a stand-in ``SummaryWriter`` that records every call, files written by hand).
Each docstring names the mutant it kills; a docstring starting with "Bug:" pins a defect fixed here."""

from __future__ import annotations

import json
import math
import sys
import types

import pytest
import torch
from train_tiny_tasks import CorruptingEval, RegressionTask, SimulatedKill, TinyMLP, tiny_config

from diffusionformer.train import (
    CheckpointError,
    CSVLog,
    NonFiniteLossError,
    TensorBoardLog,
    Trainer,
    load_checkpoint,
    open_loggers,
    read_metrics,
    read_metrics_csv,
    save_checkpoint,
)
from diffusionformer.train.loggers import LogGroup


def _record(step: int, split: str = "train", loss: float | None = 1.0, **metrics: float) -> dict:
    return {"step": step, "split": split, "loss": loss, "lr": 0.1, "metrics": metrics,
            "elapsed": float(step), "time": 100.0 + step}


# ----------------------------------------------------------------------------- trainer: resume
@pytest.mark.parametrize("name", ["metrics.csv", "tensorboard"])
def test_a_fresh_run_refuses_a_directory_holding_another_runs_csv_or_tensorboard_files(tmp_path, name):
    """Kills T1 (``metrics.csv`` left out of the files a fresh run refuses to overwrite) and T2
    (likewise ``tensorboard/``): a new run would append to another run's table or event files."""
    target = tmp_path / name
    if name == "tensorboard":
        target.mkdir()
    else:
        target.write_text("step,split,loss,lr,elapsed,time\n1,train,1.0,0.1,0.0,0.0\n")
    with pytest.raises(FileExistsError, match=rf"holding \['{name}'\]"):
        Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=2), tmp_path).fit()
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    "change",
    [dict(eval_interval=2), dict(log_interval=2), dict(checkpoint_interval=1), dict(eval_steps=3),
     dict(loggers=["jsonl", "csv"])],
)
def test_resume_accepts_every_field_that_leaves_the_updates_alone(tmp_path, change):
    """Kills T6 (``eval_interval`` dropped from RESUMABLE_FIELDS), T7 (``log_interval`` dropped) and
    T8 (``loggers`` dropped): changing how often a run logs, evaluates or saves, or where it logs,
    must not block its resume; the resumed run ends at the requested step."""
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=2, lr_decay_steps=4), tmp_path).fit()
    summary = Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=4, lr_decay_steps=4, **change),
                      tmp_path, resume=True).fit()
    assert summary["status"] == "completed" and summary["resumed_from"] == 2 and summary["step"] == 4


def test_a_failure_after_a_resume_names_the_checkpoint_it_resumed_from(tmp_path):
    """Kills T10 (the resumed checkpoint's step not taken as the last good one: a failure before
    the next save then says that no checkpoint had been written, though one is on disk)."""
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=3, lr_decay_steps=10), tmp_path).fit()
    cfg = tiny_config(max_steps=10, checkpoint_interval=0, lr_decay_steps=10)
    with pytest.raises(NonFiniteLossError, match=r"checkpoint .*checkpoint\.pt \(step 3\) was kept") as info:
        Trainer(TinyMLP(), RegressionTask(nan_at=4), cfg, tmp_path, resume=True).fit()
    assert info.value.step == 4 and info.value.last_checkpoint_step == 3
    assert json.loads((tmp_path / "summary.json").read_text())["last_checkpoint_step"] == 3



def test_resuming_from_an_explicit_path_cuts_this_folders_log_back_too(tmp_path):
    """Kills T44 (the metrics log cut back only for ``resume=True``: resuming a killed run with
    ``resume=<its own checkpoint path>`` then logs the replayed steps twice)."""
    with pytest.raises(SimulatedKill):
        Trainer(TinyMLP(), RegressionTask(fail_at=7), tiny_config(), tmp_path).fit()  # checkpoint at 6
    Trainer(TinyMLP(), RegressionTask(), tiny_config(), tmp_path, resume=tmp_path / "checkpoint.pt").fit()
    assert [r["step"] for r in read_metrics(tmp_path) if r["split"] == "train"] == list(range(1, 11))


@pytest.mark.parametrize("field", ["config", "optimizer"])
def test_a_checkpoint_whose_config_or_optimizer_state_does_not_fit_is_a_checkpoint_error(tmp_path, field):
    """Kills T34 (a config that fails validation with a ValueError escapes as a bare ValueError)
    and T35 (an optimizer state with another number of parameter groups, a ValueError from
    ``Optimizer.load_state_dict``, escapes unwrapped): both must name the checkpoint."""
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=2, lr_decay_steps=4), tmp_path).fit()
    path = tmp_path / "checkpoint.pt"
    ckpt = load_checkpoint(path)
    if field == "config":
        ckpt["config"]["max_steps"] = -1  # TrainConfig refuses it with a ValueError
        match = r"its config is invalid: .*max_steps"
    else:
        ckpt["optimizer"]["param_groups"] = ckpt["optimizer"]["param_groups"][:1]
        match = r"expected the state of this model and optimizer, got one that does not fit"
    save_checkpoint(path, ckpt)
    with pytest.raises(CheckpointError, match=match) as info:
        Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=4, lr_decay_steps=4), tmp_path, resume=True).fit()
    assert str(path) in str(info.value)


# ----------------------------------------------------------------------------- trainer: boundaries
class _NaNLossAt(RegressionTask):
    """A task whose updates in ``bad`` report a NaN loss while their gradients (and so the weights)
    stay finite: a NaN constant is added to the loss, which back-propagates nothing."""

    def __init__(self, bad: set[int]) -> None:
        super().__init__(global_rng=False)
        self.bad, self.step = bad, -1

    def train_batch(self, step, generator, batch_size):
        self.step = step
        return super().train_batch(step, generator, batch_size)

    def loss(self, model, batch):
        loss, metrics = super().loss(model, batch)
        if self.step in self.bad:
            loss = loss + torch.tensor(float("nan"))
        return loss, metrics


def test_the_first_of_several_bad_updates_in_a_window_is_the_one_reported(tmp_path):
    """Kills T12 (the running minimum of bad steps replaced by the latest bad step): with bad
    updates 1 and 3 inside one log window the error must name update 1."""
    cfg = tiny_config(max_steps=6, log_interval=5, eval_interval=0, checkpoint_interval=0)
    with pytest.raises(NonFiniteLossError, match="at step 1 ") as info:
        Trainer(TinyMLP(), _NaNLossAt({1, 3}), cfg, tmp_path).fit()
    assert info.value.step == 1 and not (tmp_path / "metrics.jsonl").exists()  # nothing logged


def test_a_non_finite_summary_holds_the_last_train_and_eval_records(tmp_path):
    """Kills T46 (the ``non_finite`` summary drops the last good train and eval records)."""
    cfg = tiny_config(max_steps=8, log_interval=2, eval_interval=2, checkpoint_interval=0)
    with pytest.raises(NonFiniteLossError):
        Trainer(TinyMLP(), _NaNLossAt({4}), cfg, tmp_path).fit()
    summary = json.loads((tmp_path / "summary.json").read_text())
    records = read_metrics(tmp_path)
    assert [(r["split"], r["step"]) for r in records][-2:] == [("train", 4), ("eval", 4)]
    assert summary["train"] == records[-2] and summary["eval"] == records[-1]



def test_a_bad_update_is_caught_at_an_evaluation_boundary_before_evaluating(tmp_path):
    """Kills T15 (the non-finite check skipped when only an evaluation is due): the run must stop
    at the first evaluation after the bad update, without calling ``task.evaluate``."""
    task = _NaNLossAt({0})
    cfg = tiny_config(max_steps=6, log_interval=6, eval_interval=2, checkpoint_interval=0)
    with pytest.raises(NonFiniteLossError) as info:
        Trainer(TinyMLP(), task, cfg, tmp_path).fit()
    assert info.value.step == 0 and task.eval_calls == [] and task.step == 1  # stopped after update 1
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing logged


def test_a_bad_update_is_caught_at_a_checkpoint_boundary_before_saving(tmp_path):
    """Kills T16 (the non-finite check skipped when only a checkpoint is due): a NaN loss with
    finite weights would otherwise be checkpointed as a good state."""
    cfg = tiny_config(max_steps=8, log_interval=8, eval_interval=0, checkpoint_interval=2)
    with pytest.raises(NonFiniteLossError) as info:
        Trainer(TinyMLP(), _NaNLossAt({2}), cfg, tmp_path).fit()
    assert info.value.step == 2 and info.value.last_checkpoint_step == 2
    assert load_checkpoint(tmp_path / "checkpoint.pt")["step"] == 2


def test_non_finite_parameters_at_a_checkpoint_blame_the_update_before_it(tmp_path):
    """Kills T31 (``bad_step`` of non-finite parameters at checkpoint ``k`` reported as ``k``, one
    past the last update, index ``k - 1``, that ``task.train_batch`` saw)."""
    cfg = tiny_config(max_steps=6, eval_interval=2, checkpoint_interval=2, log_interval=2)
    with pytest.raises(NonFiniteLossError, match="non-finite parameters after step 4") as info:
        Trainer(TinyMLP(), CorruptingEval(global_rng=False), cfg, tmp_path).fit()
    assert info.value.step == 3
    assert json.loads((tmp_path / "summary.json").read_text())["bad_step"] == 3


class _Metric(RegressionTask):
    def __init__(self, value) -> None:
        super().__init__(global_rng=False)
        self.value = value

    def loss(self, model, batch):
        loss, _ = super().loss(model, batch)
        return loss, {"m": self.value}


@pytest.mark.parametrize(("value", "message"), [
    (torch.ones(2), "metrics['m']: expected a scalar, got shape (2,)"),
    (True, "metrics['m']: expected a float or scalar tensor, got bool"),
])
def test_a_metric_that_is_not_a_number_is_a_type_error_naming_it(tmp_path, value, message):
    """Kills T25 (the shape check on tensor metrics dropped: a bare reshape RuntimeError instead)
    and T26 (a bool metric accepted as 0/1)."""
    with pytest.raises(TypeError) as info:
        Trainer(TinyMLP(), _Metric(value), tiny_config(max_steps=1, warmup_steps=0), tmp_path).fit()
    assert message in str(info.value)


class _Eval(RegressionTask):
    def __init__(self, value) -> None:
        super().__init__(global_rng=False)
        self.value = value

    def evaluate(self, model, max_batches):
        return {"loss": 0.5, "v": self.value}


def test_evaluate_accepts_any_one_element_tensor_and_refuses_a_bool(tmp_path):
    """Kills T29 (only 0-d tensors converted: a shape-(1,) tensor from ``task.evaluate`` is then
    refused) and T30 (a bool from ``task.evaluate`` accepted as 0/1)."""
    cfg = tiny_config(max_steps=1, warmup_steps=0)
    Trainer(TinyMLP(), _Eval(torch.tensor([2.5])), cfg, tmp_path / "a").fit()
    (record,) = [r for r in read_metrics(tmp_path / "a") if r["split"] == "eval"]
    assert record["metrics"] == {"loss": 0.5, "v": 2.5} and record["loss"] == 0.5
    with pytest.raises(TypeError, match=r"task.evaluate\(\)\['v'\]: expected a float or scalar tensor, got bool"):
        Trainer(TinyMLP(), _Eval(False), cfg, tmp_path / "b").fit()


def test_bug_resuming_a_finished_run_from_another_folder_names_an_existing_checkpoint(tmp_path):
    """Bug: resuming a finished run from another folder's checkpoint (``resume=<path>`` with
    ``max_steps`` equal to its step) does no update and writes no checkpoint, yet the summary named
    ``<out_dir>/checkpoint.pt``, a file that does not exist; it now names the one the weights are in.
    Also kills T18 in reverse (the summary's checkpoint fixed to ``<out_dir>/checkpoint.pt``)."""
    first = tmp_path / "first"
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=3), first).fit()
    summary = Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=3), tmp_path / "second",
                      resume=first / "checkpoint.pt").fit()
    assert summary["checkpoint"] == str(first / "checkpoint.pt")
    assert not (tmp_path / "second" / "checkpoint.pt").exists()
    # a run that saves names its own checkpoint
    summary = Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=4, lr_decay_steps=3), tmp_path / "third",
                      resume=first / "checkpoint.pt").fit()
    assert summary["checkpoint"] == str(tmp_path / "third" / "checkpoint.pt")


# ----------------------------------------------------------------------------- loggers: CSV
def test_bug_an_empty_csv_file_gets_a_header_before_its_first_row(tmp_path):
    """Bug: ``CSVLog.append`` on an existing empty ``metrics.csv`` (a file created but never
    written, e.g. by a crash or ``touch``) appended a row without a header, so
    ``read_metrics_csv`` took that row for the header and returned no records; the header is now
    written first. Also kills L2b (the header written only when the file is missing) and L26
    (``truncate`` of an empty file writes an empty header)."""
    path = tmp_path / "metrics.csv"
    path.write_text("")
    CSVLog(path).append(_record(1, loss=0.5))
    assert path.read_text().splitlines() == ["step,split,loss,lr,elapsed,time", "1,train,0.5,0.1,1.0,101.0"]
    assert read_metrics_csv(path) == [_record(1, loss=0.5)]
    path.write_text("")  # and cutting an empty file back (a resume) leaves the header too
    assert CSVLog(path).truncate(3) == 0
    assert path.read_text().splitlines() == ["step,split,loss,lr,elapsed,time"]


def test_csv_truncate_drops_a_torn_last_row_and_keeps_the_rest(tmp_path):
    """Kills L4 (rows whose ``step`` is not a number kept in the int comparison: a torn row left
    by a crash then makes ``truncate`` raise a bare ``ValueError``)."""
    path = tmp_path / "metrics.csv"
    log = CSVLog(path)
    for step in (1, 2, 3):
        log.append(_record(step, a=float(step)))
    with open(path, "a") as f:
        f.write("4x,tra")  # half a row
    assert CSVLog(path).truncate(2) == 2
    assert [r["step"] for r in read_metrics_csv(path)] == [1, 2]
    assert path.read_text().splitlines()[0] == "step,split,loss,lr,elapsed,time,metrics.a"


def test_an_inactive_csv_writer_never_rewrites_the_file_on_truncate(tmp_path):
    """Kills L5 (``truncate`` of an inactive writer, a non-zero rank under DDP, rewrites the file
    rank 0 owns)."""
    path = tmp_path / "metrics.csv"
    log = CSVLog(path)
    for step in (1, 2, 3):
        log.append(_record(step))
    before = path.read_text()
    assert CSVLog(path, active=False).truncate(1) == 0
    assert path.read_text() == before


# ----------------------------------------------------------------------------- loggers: TensorBoard
class _Writer:
    """Stand-in ``SummaryWriter`` that records every call."""

    instances: list[_Writer] = []

    def __init__(self, log_dir: str, purge_step: int | None = None) -> None:
        self.log_dir, self.purge_step = log_dir, purge_step
        self.calls: list[tuple] = []
        _Writer.instances.append(self)

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        self.calls.append(("scalar", tag, value, global_step))

    def flush(self) -> None:
        self.calls.append(("flush",))

    def close(self) -> None:
        self.calls.append(("close",))


@pytest.fixture
def fake_tensorboard(monkeypatch):
    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = _Writer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    _Writer.instances.clear()
    return _Writer.instances


def test_tensorboard_writes_finite_numbers_only_and_flushes_each_record(tmp_path, fake_tensorboard):
    """Kills L7 (a metric named ``loss`` overwrites the record's loss), L8 (non-finite values
    written), L9 (bools written as 0/1) and L10 (no flush after a record)."""
    log = TensorBoardLog(tmp_path / "tb")
    log.append({**_record(3, "eval", loss=2.0), "lr": float("nan"),
                "metrics": {"loss": 7.0, "acc": 0.5, "inf": math.inf, "flag": True, "n": 4}})
    (writer,) = fake_tensorboard
    assert writer.calls == [("scalar", "eval/loss", 2.0, 3), ("scalar", "eval/acc", 0.5, 3),
                            ("scalar", "eval/n", 4.0, 3), ("flush",)]


def test_tensorboard_truncate_reopens_an_open_writer_with_the_purge_step(tmp_path, fake_tensorboard):
    """Kills L6 (``truncate`` does not close an open writer, so the purge step never takes effect)
    and L11 (``close`` keeps the closed writer, so later records go to a closed file)."""
    log = TensorBoardLog(tmp_path / "tb")
    log.append(_record(5))
    assert log.truncate(2) == 0
    log.append(_record(3))
    log.close()
    log.append(_record(4))
    first, second, third = fake_tensorboard
    # purged once: a reopen after close() must not purge step 3, logged since the truncate
    assert (first.purge_step, second.purge_step, third.purge_step) == (None, 3, None)
    assert first.calls[-1] == ("close",) and second.calls[-1] == ("close",)
    assert [c[3] for c in second.calls if c[0] == "scalar"] == [3, 3]
    assert [c[3] for c in third.calls if c[0] == "scalar"] == [4, 4]


# ----------------------------------------------------------------------------- loggers: LogGroup
class _Recorder:
    def __init__(self, count: int) -> None:
        self.count, self.records, self.truncated, self.closed = count, [], [], False

    def append(self, record) -> None:
        self.records.append(record)

    def truncate(self, max_step: int) -> int:
        self.truncated.append(max_step)
        return self.count

    def close(self) -> None:
        self.closed = True


def test_log_group_fans_out_to_every_writer_and_counts_the_first(tmp_path):
    """Kills L12 (``truncate`` returns the last writer's count, not the JSON-lines log's), L13 (an
    empty group's ``truncate`` raises ``IndexError``), L14 (only the first writer closed) and L16
    (only the first writer gets the records)."""
    a, b = _Recorder(5), _Recorder(9)
    group = LogGroup([a, b])
    group.append(_record(1))
    assert group.truncate(0) == 5 and a.truncated == b.truncated == [0]
    group.close()
    assert a.records == b.records == [_record(1)] and a.closed and b.closed
    assert LogGroup([]).truncate(3) == 0


def test_open_loggers_refuses_an_unknown_name(tmp_path):
    """Kills L15 (an unknown writer name silently ignored by ``open_loggers``)."""
    with pytest.raises(ValueError, match=r"loggers: expected names from \('jsonl', 'csv', 'tensorboard'\), got 'wandb'"):
        open_loggers(["jsonl", "wandb"], tmp_path)


def test_after_resuming_from_another_folder_a_failure_names_this_runs_own_later_checkpoint(tmp_path):
    """Kills T33 (``_save`` leaves the last good checkpoint's path at the other folder's file it
    resumed from: the error then points at an older checkpoint than the one on disk here)."""
    first, second = tmp_path / "first", tmp_path / "second"
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=3, lr_decay_steps=10), first).fit()
    cfg = tiny_config(max_steps=8, checkpoint_interval=2, lr_decay_steps=10)
    with pytest.raises(NonFiniteLossError) as info:
        Trainer(TinyMLP(), _NaNLossAt({5}), cfg, second, resume=first / "checkpoint.pt").fit()
    assert info.value.last_checkpoint_step == 4
    assert f"the last good checkpoint {second / 'checkpoint.pt'} (step 4) was kept" in str(info.value)
