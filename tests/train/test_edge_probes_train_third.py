"""Edge-case probes of ``diffusionformer.train``, third round: the trainer's resume of a checkpoint that loads
into another run, hostile checkpoint entries, NumPy strings and bools, the loggers' NumPy floats and damaged rows,
``cosine_lr``'s NaN bounds and ``to_device`` of a ``PackedSequence``.

Found and fixed (tests whose docstring starts with "Bug:"):

* ``TrainConfig(device=np.str_("cpu"))`` (or ``amp`` / ``weight_decay_rule`` / ``loggers`` from a NumPy array of
  names) was kept as a NumPy string: every checkpoint of the run held it and ``torch.load(weights_only=True)``
  refused the file, so the run trained but could never resume.
* resuming with other parameters frozen (same count and sizes) handed the Adam moments of one parameter to another
  without a word; resuming a float64 checkpoint into a float32 model cast it silently.
* a checkpoint whose ``model_record`` is not a mapping of mappings raised a bare ``AttributeError``; a ``window``
  entry of the wrong shape failed at the next log with ``torch.stack``'s error, one with a count of 0 was taken.
* ``Trainer(..., resume=np.bool_(True))`` said "expected resume to be a bool or a path, got bool" (and
  ``param_groups``, ``task.loss`` / ``task.evaluate`` metrics named a NumPy bool ``bool``).
* ``to_device`` of a ``PackedSequence`` (a named tuple) rebuilt it with ``batch_sizes`` on the device: a
  ``ValueError`` ("batch_sizes should always be on CPU").
* ``cosine_lr`` with a NaN ``warmup_steps`` or ``decay_steps`` returned a NaN learning rate.
* the CSV log wrote a NumPy float of a fixed column by ``str``: ``np.float32("nan")`` as ``nan`` (the JSON-lines
  log: ``null``), ``np.float32(0.1)`` as ``0.1`` (not the float it is); a row with more cells than the header
  stopped the resume with csv's "dict contains fields not in fieldnames: None".
* ``MetricsLog.append`` of a NumPy bool: "Object of type bool is not JSON serializable".
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from train_tiny_tasks import RegressionTask, SimulatedKill, TinyMLP, tiny_config

from diffusionformer.train import (
    CheckpointError,
    MetricsLog,
    Trainer,
    TrainConfig,
    cosine_lr,
    open_loggers,
    param_groups,
    read_metrics,
    read_metrics_csv,
    save_checkpoint,
    to_device,
)
from diffusionformer.train.checkpoint import load_checkpoint


def _record(step, **kw):
    return {"step": step, "split": "train", "loss": 0.5, "lr": 0.1, "metrics": {}, "elapsed": 1.0, "time": 2.0, **kw}


def _killed_run(out, model, task_cls=RegressionTask, **cfg):
    """A run killed at step 4 with a checkpoint at step 3."""
    torch.manual_seed(0)
    with pytest.raises(SimulatedKill):
        Trainer(model, task_cls(fail_at=4, global_rng=False), tiny_config(**cfg), out).fit()


# ----------------------------------------------------------------------------- config
def test_bug_numpy_strings_in_the_config_leave_a_resumable_checkpoint(tmp_path):
    """Bug: device / amp / weight_decay_rule / loggers given as NumPy strings (a sweep grid's np.array of names) were
    stored as such; to_dict put them into every checkpoint and torch.load(weights_only=True) refused it ("Unsupported
    global ... numpy ... scalar"), so the run trained but never resumed. They are now the str they equal."""
    names = np.array(["cpu", "off", "nanogpt", "jsonl", "csv"])
    cfg = dict(device=names[0], amp=names[1], weight_decay_rule=names[2], loggers=list(names[3:]))
    config = tiny_config(**cfg)
    assert all(type(v) is str for v in (config.device, config.amp, config.weight_decay_rule, *config.loggers))
    assert config == tiny_config(device="cpu", amp="off", weight_decay_rule="nanogpt", loggers=["jsonl", "csv"])
    _killed_run(tmp_path, TinyMLP(), **cfg)
    assert load_checkpoint(tmp_path / "checkpoint.pt")["step"] == 3
    summary = Trainer(TinyMLP(), RegressionTask(global_rng=False), config, tmp_path, resume=True).fit()
    assert summary["resumed_from"] == 3


# ----------------------------------------------------------------------------- resume into another run
class _ThreeLinear(nn.Module):
    def __init__(self, frozen: str) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)
        getattr(self, frozen).requires_grad_(False)

    def forward(self, x):
        return self.c(self.b(self.a(x)))


def test_bug_resume_with_other_frozen_parameters_is_refused(tmp_path):
    """Bug: a run trained with `a` frozen and resumed with `b` frozen (same sizes) loaded the checkpoint's Adam
    moments of `b` into `a` (Optimizer.load_state_dict matches parameters by position and only counts them) and
    trained on without a word. Now a ValueError names the parameters, before any update."""
    _killed_run(tmp_path, _ThreeLinear("a"))
    task = RegressionTask(global_rng=False)
    with pytest.raises(ValueError, match=r"optimised other parameters \(trained only in the checkpoint: "
                                         r"\['b.bias', 'b.weight'\]; trained only now: \['a.bias', 'a.weight'\]\)"):
        Trainer(_ThreeLinear("b"), task, tiny_config(), tmp_path, resume=True).fit()
    assert task.steps_seen == [] and load_checkpoint(tmp_path / "checkpoint.pt")["step"] == 3
    Trainer(_ThreeLinear("a"), task, tiny_config(), tmp_path, resume=True).fit()  # the same freezing resumes


def test_bug_resume_into_a_model_of_another_dtype_is_refused(tmp_path):
    """Bug: a float64 run's checkpoint resumed into a float32 model: load_state_dict cast the weights and the Adam
    moments, and the run went on in float32 without a word (not the run that wrote the checkpoint)."""

    class Task64(RegressionTask):
        def loss(self, model, batch):
            pred = model(batch["x"].to(next(model.parameters()).dtype))
            return nn.functional.mse_loss(pred, batch["y"].to(pred.dtype)), {}

        def evaluate(self, model, max_batches):
            return {"w": model.fc1.weight.mean()}

    _killed_run(tmp_path, TinyMLP().double(), Task64)
    with pytest.raises(ValueError, match=r"written by a model of other dtypes \(fc1.weight: checkpoint torch.float64, "
                                         r"now torch.float32"):
        Trainer(TinyMLP(), Task64(global_rng=False), tiny_config(), tmp_path, resume=True).fit()
    Trainer(TinyMLP().double(), Task64(global_rng=False), tiny_config(), tmp_path, resume=True).fit()


@pytest.mark.parametrize("entry, value, match", [
    ("model_record", "TinyMLP", r"expected a model record .* got str \('TinyMLP'\)"),
    ("model_record", {"class": "x", "config": [1]}, r"expected a model record .*'config' and 'heads' mappings"),
    ("window", {"loss": [torch.ones(2), 1]}, r"window\['loss'\] must be \[a 0-d float tensor, a count >= 1\]"),
    ("window", {"loss": [torch.tensor(1.0), 0]}, r"window\['loss'\] must be"),
])
def test_bug_hostile_model_record_and_window_entries_are_checkpoint_errors(tmp_path, entry, value, match):
    """Bug: a model_record that is not a mapping of mappings raised a bare AttributeError ("'str' object has no
    attribute 'get'"); a window entry of shape (2,) trained on and failed at the next log with torch.stack's "stack
    expects each tensor to be equal size", one with a count of 0 was summed into the next mean."""
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=2, lr_decay_steps=4, log_interval=3), tmp_path / "a").fit()
    payload = load_checkpoint(tmp_path / "a" / "checkpoint.pt")
    payload[entry] = value
    bad = save_checkpoint(tmp_path / "bad.pt", payload)
    task = RegressionTask()
    with pytest.raises(CheckpointError, match=match) as info:
        Trainer(TinyMLP(), task, tiny_config(max_steps=4, lr_decay_steps=4, log_interval=3), tmp_path / "b",
                resume=bad).fit()
    assert str(bad) in str(info.value) and task.steps_seen == []


# ----------------------------------------------------------------------------- numpy bools named
@pytest.mark.parametrize("call, error, match", [
    (lambda: Trainer(TinyMLP(), RegressionTask(), TrainConfig(), ".", resume=np.bool_(True)), TypeError,
     r"expected resume to be a bool or a path, got numpy\.bool"),
    (lambda: param_groups(TinyMLP(), np.bool_(True)), TypeError, r"expected weight_decay a float >= 0, got numpy\.bool"),
])
def test_bug_numpy_bools_are_named_numpy_bool(call, error, match):
    """Bug: a NumPy bool was named "bool": "expected resume to be a bool or a path, got bool" contradicts itself."""
    with pytest.raises(error, match=match):
        call()


def test_bug_numpy_bool_metrics_are_named_numpy_bool(tmp_path):
    """Bug: a task.loss metric np.bool_(True) was "expected a float or scalar tensor, got bool" (as if a Python bool)."""

    class Task(RegressionTask):
        def loss(self, model, batch):
            return super().loss(model, batch)[0], {"flag": np.bool_(True)}

    with pytest.raises(TypeError, match=r"metrics\['flag'\]: expected a float or scalar tensor, got numpy\.bool"):
        Trainer(TinyMLP(), Task(), tiny_config(max_steps=1, warmup_steps=0), tmp_path).fit()


# ----------------------------------------------------------------------------- batch
def test_bug_to_device_moves_a_packed_sequence_with_its_batch_sizes_on_the_cpu():
    """Bug: a PackedSequence (a named tuple) was rebuilt from its moved fields: batch_sizes went to the device and
    PackedSequence refused it ("batch_sizes should always be on CPU"); now it is moved by its own .to (the meta
    device stands in for an accelerator)."""
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(3, 2, 4), torch.tensor([3, 2]))
    moved = to_device({"seq": packed, "n": 2}, torch.device("meta"))["seq"]
    assert isinstance(moved, nn.utils.rnn.PackedSequence)
    assert moved.data.device.type == "meta" and moved.batch_sizes.device.type == "cpu"
    assert torch.equal(moved.batch_sizes, packed.batch_sizes)
    on_cpu = to_device(packed, torch.device("cpu"))
    assert torch.equal(on_cpu.data, packed.data)


# ----------------------------------------------------------------------------- schedule
@pytest.mark.parametrize("bounds, match", [
    (dict(warmup_steps=float("nan"), decay_steps=5), r"expected warmup_steps >= 0, got nan"),
    (dict(warmup_steps=2, decay_steps=float("nan")), r"expected decay_steps >= warmup_steps \(2\), got nan"),
])
def test_bug_cosine_lr_refuses_nan_bounds(bounds, match):
    """Bug: a NaN warmup_steps or decay_steps failed every comparison and cosine_lr returned a NaN learning rate."""
    with pytest.raises(ValueError, match=match):
        cosine_lr(3, lr=1.0, min_lr=0.0, **bounds)


def test_resume_mid_warmup_and_mid_decay_logs_the_uninterrupted_learning_rates(tmp_path):
    """Pins: kills inside the warm-up (step 2 of W=4) and inside the decay (step 7 of D=9): every logged lr equals
    the uninterrupted run's and cosine_lr's, bit for bit."""
    cfg = dict(max_steps=10, warmup_steps=4, lr_decay_steps=9, checkpoint_interval=2, lr=0.3, min_lr=0.1)
    torch.manual_seed(0)
    Trainer(TinyMLP(), RegressionTask(), tiny_config(**cfg), tmp_path / "whole").fit()
    for kill in (3, 7):
        out = tmp_path / f"cut{kill}"
        torch.manual_seed(0)
        with pytest.raises(SimulatedKill):
            Trainer(TinyMLP(), RegressionTask(fail_at=kill), tiny_config(**cfg), out).fit()
        Trainer(TinyMLP(), RegressionTask(), tiny_config(**cfg), out, resume=True).fit()
        got = [(r["step"], r["lr"]) for r in read_metrics(out) if r["split"] == "train"]
        assert got == [(r["step"], r["lr"]) for r in read_metrics(tmp_path / "whole") if r["split"] == "train"]
        assert [lr for _, lr in got] == [cosine_lr(s, lr=0.3, min_lr=0.1, warmup_steps=4, decay_steps=9)
                                         for s in range(10)]


# ----------------------------------------------------------------------------- loggers / metrics
def test_bug_csv_writes_numpy_floats_of_the_fixed_columns_as_the_jsonl_log_does(tmp_path):
    """Bug: the CSV cell of a NumPy float in a fixed column was its str: np.float32("nan") read back as nan where the
    JSON-lines log has None, and np.float32(0.1) as 0.1, not the float it equals (0.10000000149011612)."""
    group = open_loggers(["jsonl", "csv"], tmp_path)
    group.append(_record(np.int64(1), loss=np.float32("nan"), lr=np.float32(0.1), elapsed=np.float32("inf")))
    group.close()
    expected = [_record(1, loss=None, lr=float(np.float32(0.1)), elapsed=None)]
    assert read_metrics_csv(tmp_path) == read_metrics(tmp_path) == expected


def test_bug_a_csv_row_with_extra_cells_does_not_stop_the_resume(tmp_path):
    """Bug: a metrics.csv row with more cells than the header (a damaged byte read as a comma) stopped the resume in
    CSVLog.truncate with csv's bare "ValueError: dict contains fields not in fieldnames: None". The row is dropped
    like one whose step is spoiled, and the run resumes; the table is then written again from metrics.jsonl, which
    gives the row back (test_resume_walk_60j)."""
    cfg = dict(loggers=["jsonl", "csv"], checkpoint_interval=6)
    torch.manual_seed(0)
    with pytest.raises(SimulatedKill):
        Trainer(TinyMLP(), RegressionTask(fail_at=7), tiny_config(**cfg), tmp_path).fit()
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    lines[2] += ",x"  # the row of step 2
    (tmp_path / "metrics.csv").write_text("\n".join(lines) + "\n")
    Trainer(TinyMLP(), RegressionTask(), tiny_config(**cfg), tmp_path, resume=True).fit()
    train_steps = [r["step"] for r in read_metrics_csv(tmp_path) if r["split"] == "train"]
    assert train_steps == list(range(1, 11))


def test_bug_jsonl_log_writes_a_numpy_bool(tmp_path):
    """Bug: MetricsLog.append of a NumPy bool raised "Object of type bool is not JSON serializable" (a Python bool
    is written as true/false)."""
    log = MetricsLog(tmp_path / "m.jsonl")
    log.append(_record(1, metrics={"ok": np.bool_(True), "py": False}))
    log.close()
    assert read_metrics(tmp_path / "m.jsonl") == [_record(1, metrics={"ok": True, "py": False})]


def test_csv_reopened_after_a_resume_keeps_the_wider_header_and_reads_like_the_jsonl(tmp_path):
    """Pins: a metric that first appears after the resume widens the header; the rows from before keep their cells
    and both logs read back the same records (NaN metrics: None in JSON lines, left out of the CSV row)."""
    group = open_loggers(["jsonl", "csv"], tmp_path)
    for step in (1, 2, 3):
        group.append(_record(step, metrics={"a": float(step)}))
    group.close()
    group = open_loggers(["jsonl", "csv"], tmp_path)
    assert group.truncate(2) == 1
    group.append(_record(3, metrics={"b": 0.25, "a": math.inf}))
    group.close()
    csv_records = read_metrics_csv(tmp_path)
    assert [r["metrics"] for r in csv_records] == [{"a": 1.0}, {"a": 2.0}, {"b": 0.25}]
    assert [r["metrics"] for r in read_metrics(tmp_path)] == [{"a": 1.0}, {"a": 2.0}, {"b": 0.25, "a": None}]


def test_bug_log_group_truncate_counts_the_jsonl_log_whatever_the_order(tmp_path):
    """Bug: ``LogGroup.truncate`` returned the count of the first writer, documented as the JSON-lines log, but
    with ``loggers=["csv", "jsonl"]`` it was the CSV log's (which counts rows differently: a damaged row of one file
    is not one of the other)."""
    from diffusionformer.train.loggers import CSV_NAME, open_loggers

    for names in (["csv", "jsonl"], ["jsonl", "csv"]):
        out = tmp_path / "-".join(names)
        log = open_loggers(names, out)
        for step in (1, 2, 3):
            log.append({"step": step, "split": "train", "loss": 0.5, "lr": 0.1, "metrics": {}, "elapsed": 1.0,
                        "time": 1.0})
        log.close()
        with open(out / CSV_NAME, "a") as f:  # a damaged row in the CSV only: dropped there, not in the JSONL
            f.write("x,y\n")
        log = open_loggers(names, out)
        assert log.truncate(1) == 2, names  # the JSONL log drops steps 2 and 3 (the CSV log 3 rows)
        log.close()


def test_bug_a_hard_killed_save_leaves_no_temporary_file_after_the_next_save(tmp_path):
    """Bug: a save killed hard (SIGKILL: no cleanup runs) left its checkpoint-sized ``.checkpoint.pt.*.tmp`` in the
    run folder, one more per such kill, for good; the next save of the same path now removes them (and leaves the
    temporary files of other names alone)."""
    import subprocess
    import sys

    from diffusionformer.train.checkpoint import save_checkpoint

    script = (
        "import os, signal, sys, torch\n"
        "from diffusionformer.train import checkpoint as c\n"
        "def killed(obj, f, *a, **k):\n"
        "    f.write(b'partial'); f.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"
        "c.torch.save = killed\n"
        "c.save_checkpoint(sys.argv[1], {'w': torch.ones(2)})\n"
    )
    target = tmp_path / "checkpoint.pt"
    proc = subprocess.run([sys.executable, "-c", script, str(target)], capture_output=True)
    assert proc.returncode < 0  # killed
    other = tmp_path / ".other.pt.abc.tmp"
    other.write_bytes(b"x")
    assert [p.name.startswith(".checkpoint.pt.") for p in tmp_path.iterdir()].count(True) == 1
    save_checkpoint(target, {"w": torch.zeros(2)})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.pt.abc.tmp", "checkpoint.pt"]
    assert torch.load(target)["w"].tolist() == [0.0, 0.0]
