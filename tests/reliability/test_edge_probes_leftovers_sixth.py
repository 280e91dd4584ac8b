"""Edge cases left noted by earlier probe rounds, now fixed (each "Bug:" test fails with its fix reverted).

* A run lock whose holder died and whose process id was given to another live process held the run for ever; the
  lock now records the holder's start time (``/proc/<pid>/stat``) and a pid that started at another time is stale.
  A lock without a start time (written by an older version) is judged by its pid alone, as before.
* A FIFO in place of ``metrics.jsonl`` (or ``metrics.csv``) hung every resume of the run in ``truncate``; now refused
  by name.
* ``run CONFIG --workers N --tasks NOPE`` started N workers (each refused the name) before the main process did.
* ``analyze_run`` left the caller's model in eval mode.

Not changed: a ``DiffusionAttention`` with another parameter-free head layout (``attention:4`` vs
``attention:2,laplacian:2``) loads the other's state dict. The state dict holds the layer's tensors, not its
architecture (torch's convention, and the trainer's model record refuses another layout on resume); the suite itself
moves projection weights between layouts this way (tests/core/test_rivals.py), so refusing it would break that use.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading

import pytest
import torch
from torch import nn

from diffusionformer.experiments import store
from diffusionformer.train import TrainConfig, Trainer
from diffusionformer.train.loggers import CSVLog
from diffusionformer.train.metrics import MetricsLog

_HAS_PROC = os.path.exists(f"/proc/{os.getpid()}/stat")


# --- experiments.store: a pid reused by another process ----------------------------------------------------------


def _write_lock(rdir, record):
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / store.LOCK_NAME).write_text(json.dumps(record))


@pytest.mark.skipif(not _HAS_PROC, reason="process start times are read from /proc")
def test_bug_a_lock_whose_pid_was_reused_is_stale(tmp_path):
    """Bug: a lock records only ``(pid, host)``; when its holder died and the pid went to another live process, the
    lock counted as held by that process for ever and no worker trained the run again. The lock now also records the
    holder's start time, and a live pid that started at another time is a stale lock, taken over."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        node, started = platform.node(), store._start_time(sleeper.pid)
        assert isinstance(started, int)
        reused = tmp_path / "reused"  # the dead holder started before the process that has its pid now
        _write_lock(reused, {"pid": sleeper.pid, "host": node, "start": started - 1})
        assert store.live_holder(reused) is None
        assert store.acquire_lock(reused) is None and store.read_lock(reused) == (os.getpid(), node)
        # held: the same process (its start time), and a lock of an older version (no start time: its pid alone)
        for name, record in (("same", {"start": started}), ("old", {}), ("junk-start", {"start": "x"})):
            _write_lock(tmp_path / name, {"pid": sleeper.pid, "host": node, **record})
            assert store.live_holder(tmp_path / name) == (sleeper.pid, node), name
            assert store.acquire_lock(tmp_path / name) == f"process {sleeper.pid} on {node}", name
        # another host's lock: its start time cannot be checked from here, it stays held
        _write_lock(tmp_path / "remote", {"pid": sleeper.pid, "host": "elsewhere", "start": started - 1})
        assert store.live_holder(tmp_path / "remote") == (sleeper.pid, "elsewhere")
    finally:
        sleeper.stdin.close()
        sleeper.wait()


@pytest.mark.skipif(not _HAS_PROC, reason="process start times are read from /proc")
def test_a_lock_records_its_holders_start_time_and_a_dead_namesake_of_ours_is_replaced(tmp_path):
    """Pins: ``acquire_lock`` writes this process's start time; a lock with our pid but another start time (a dead
    process that had our pid) is not taken as ours as it is, but replaced by our record."""
    node, mine = platform.node(), store._start_time(os.getpid())
    rdir = tmp_path / "run"
    assert store.acquire_lock(rdir) is None
    machine = store._machine_id()  # where the machine has an id: it tells nodes of one short name apart
    assert json.loads((rdir / store.LOCK_NAME).read_text()) == {"pid": os.getpid(), "host": node, "start": mine,
                                                                **({} if machine is None else {"machine": machine})}
    store.release_lock(rdir)
    _write_lock(rdir, {"pid": os.getpid(), "host": node, "start": mine - 1})
    assert store.live_holder(rdir) is None
    assert store.acquire_lock(rdir) is None
    assert json.loads((rdir / store.LOCK_NAME).read_text())["start"] == mine
    store.release_lock(rdir)
    assert os.listdir(rdir) == []


# --- train: a FIFO in place of the metrics log -------------------------------------------------------------------


class _Feeder:
    """Opens the FIFO for writing (and closes it at once) whenever a reader waits on it, so that code which reads
    the FIFO gets an empty file instead of blocking the test for ever."""

    def __init__(self, path):
        self.path, self.stop = path, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            try:
                os.close(os.open(self.path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # ENXIO: no reader yet
                self.stop.wait(0.001)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


class _Task:
    def train_batch(self, step, generator, batch_size):
        return torch.randn(batch_size, 2, generator=generator)

    def loss(self, model, batch):
        return model(batch).pow(2).mean(), {}

    def evaluate(self, model, max_batches):
        return {"loss": 0.0}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_bug_resume_refuses_a_fifo_in_place_of_the_metrics_log(tmp_path):
    """Bug: a FIFO in place of ``metrics.jsonl`` (or ``metrics.csv``) hung ``Trainer(resume=True).fit()`` for ever
    (``truncate`` read it, waiting for a writer); a device such as ``/dev/zero`` would fill the memory. Now
    ``truncate`` refuses any log that is not a regular file, naming it and what it is."""
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    config = TrainConfig(max_steps=1, batch_size=2, warmup_steps=0, eval_interval=1, log_interval=1,
                         checkpoint_interval=1, device="cpu", progress=False)
    with _Feeder(fifo):
        with pytest.raises(ValueError, match=r"MetricsLog.truncate: expected .*metrics\.jsonl to be a regular file "
                                             r".*got a FIFO"):
            Trainer(nn.Linear(2, 1), _Task(), config, tmp_path, resume=True).fit()
        with pytest.raises(ValueError, match="got a FIFO"):
            MetricsLog(fifo).truncate(0)
    assert not fifo.is_file() and not (tmp_path / "checkpoint.pt").exists()  # left as it was, nothing trained
    csv_fifo = tmp_path / "metrics.csv"
    os.mkfifo(csv_fifo)
    with _Feeder(csv_fifo), pytest.raises(ValueError, match=r"CSVLog.truncate: .*metrics\.csv .*got a FIFO"):
        CSVLog(csv_fifo).truncate(0)
    (tmp_path / "d" / "metrics.jsonl").mkdir(parents=True)
    with pytest.raises(ValueError, match="got a folder"):
        MetricsLog(tmp_path / "d" / "metrics.jsonl").truncate(0)


# --- experiments.cli: --tasks checked before workers start ----------------------------------------------------------

_TOML = '''name = "tiny"
seeds = [0]
[[tasks]]
name = "digits"
dataset = "digits"
model = "vit-digits"
model_overrides = {dim = 8, depth = 1, num_heads = 2}
[tasks.train]
max_steps = 2
batch_size = 8
warmup_steps = 0
[[operators]]
name = "attention"
'''


def test_bug_run_with_workers_checks_task_names_before_starting_workers(tmp_path, capsys, monkeypatch):
    """Bug: ``run CONFIG --workers 2 --tasks digitz`` started two worker processes, each of which refused the name
    (and left its log), before the main process refused it too. The names are now checked (with the did-you-mean
    hint) before any worker starts."""
    from diffusionformer.experiments import cli, gpu

    started = []
    monkeypatch.setattr(gpu, "run_workers", lambda *args, **kwargs: started.append(args) or [0, 0])
    monkeypatch.setattr(cli, "_size_threads", lambda args: None)  # leave this process's torch threads alone
    toml = tmp_path / "tiny.toml"
    toml.write_text(_TOML, encoding="utf-8")
    out = tmp_path / "r"
    code = cli.main(["run", str(toml), "--workers", "2", "--tasks", "digitz", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and started == []
    assert "unknown task(s) ['digitz']" in err and "(did you mean 'digits'?)" in err
    assert not out.exists()


# --- experiments.analyze: the caller's training mode --------------------------------------------------------------


def test_bug_analyze_run_restores_the_models_training_mode():
    """Bug: ``analyze_run(model, data)`` switched the caller's model to eval mode and left it there: a model
    analysed between training steps went on training without dropout. Each module's mode is now restored (a part
    the caller froze in eval mode stays in eval mode)."""
    from diffusionformer.data import load_dataset
    from diffusionformer.experiments import analyze_run
    from diffusionformer.models import create_model

    torch.manual_seed(0)
    model = create_model("vit-digits", dim=8, depth=1, num_heads=2).train()
    frozen = next(m for m in model.modules() if isinstance(m, nn.LayerNorm)).eval()
    modes = {name: m.training for name, m in model.named_modules()}
    res = analyze_run(model, load_dataset("digits"), max_examples=16, max_attention_examples=2, batch_size=16)
    assert res["info"]["num_examples"] == 16
    assert {name: m.training for name, m in model.named_modules()} == modes
    assert model.training and not frozen.training


# --- train.checkpoint: a FIFO in the checkpoint's place is named, not called missing -----------------------------------


def test_bug_a_fifo_as_checkpoint_is_named_not_called_missing(tmp_path):
    """Bug: ``load_checkpoint`` (and so ``Trainer(resume=True)``) of a FIFO at checkpoint.pt said "got missing
    .../checkpoint.pt": the user looked for a file that was in place. It says "a FIFO" now (still FileNotFoundError)."""
    from diffusionformer.train.checkpoint import load_checkpoint

    fifo = tmp_path / "checkpoint.pt"
    os.mkfifo(fifo)
    with pytest.raises(FileNotFoundError, match=r"got a FIFO .*checkpoint\.pt"):
        load_checkpoint(fifo)
    with pytest.raises(FileNotFoundError, match=r"got missing .*nothing\.pt"):
        load_checkpoint(tmp_path / "nothing.pt")
