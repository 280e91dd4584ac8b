"""Edge probes of the optimisation side of the trainer: schedule, parameter groups, metrics writers."""

from __future__ import annotations

import contextlib
import math
import signal
import warnings

import pytest

from diffusionformer.train.loggers import CSVLog, read_metrics_csv
from diffusionformer.train.metrics import MetricsLog, read_metrics
from diffusionformer.train.schedule import cosine_lr

resource = pytest.importorskip("resource")
if not hasattr(signal, "SIGXFSZ"):
    pytest.skip("needs RLIMIT_FSIZE / SIGXFSZ (POSIX)", allow_module_level=True)


def _record(step: int) -> dict:
    return {"step": step, "split": "train", "loss": 0.5 + step, "lr": 0.1, "metrics": {"acc": 0.25},
            "elapsed": 1.0, "time": 2.0}


@contextlib.contextmanager
def _disk_full_after(nbytes: int):
    """Writes past ``nbytes`` of any file fail (EFBIG), after the part that fits is written: a disk that fills up
    in the middle of a record."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the process is killed, not given an OSError
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def _nanogpt_lr(it: int, lr: float, min_lr: float, warmup: int, decay: int) -> float:
    """nanoGPT's ``get_lr`` (train.py), verbatim but for the names."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay:
        return min_lr
    ratio = (it - warmup) / (decay - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


@pytest.mark.parametrize("warmup, decay", [(0, 1), (0, 10), (3, 10), (10, 11), (7, 8)])
def test_cosine_lr_is_nanogpt_get_lr_at_every_step_and_boundary(warmup, decay):
    for step in range(decay + 3):  # step 0, the warm-up's end, the decay's end and beyond
        assert cosine_lr(step, lr=1.0, min_lr=0.1, warmup_steps=warmup, decay_steps=decay) == \
            _nanogpt_lr(step, 1.0, 0.1, warmup, decay)


def test_csv_new_and_unicode_metrics_mid_run_read_back(tmp_path):
    log = CSVLog(tmp_path / "m.csv")
    log.append(_record(1))
    log.append({**_record(2), "loss": float("nan"), "metrics": {"é€": 2.0, "b,c\n": 3}})
    assert [r["metrics"] for r in read_metrics_csv(tmp_path / "m.csv")] == [{"acc": 0.25}, {"b,c\n": 3.0, "é€": 2.0}]
    assert read_metrics_csv(tmp_path / "m.csv")[1]["loss"] is None


def test_bug_jsonl_failed_append_leaves_partial_line(tmp_path):
    """Bug: a MetricsLog.append that failed half-way (a full disk) left the start of its line in metrics.jsonl and a
    file handle whose close() raised the same OSError again (in Trainer.fit's ``finally``, skipping the process
    group's shutdown); the next append then ran on from the partial line, so that record was lost too (one
    malformed line, skipped with a warning by read_metrics). Now a failed append leaves the file as it was."""
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    log.append(_record(1))
    before = path.read_bytes()
    with _disk_full_after(len(before) + 20):
        with pytest.raises(OSError):
            log.append(_record(2))
        assert path.read_bytes() == before
        log.close()  # nothing left to flush: no second error
    log.append(_record(3))
    log.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a malformed line is skipped with a warning
        assert [r["step"] for r in read_metrics(path)] == [1, 3]


def test_bug_csv_failed_append_splices_rows(tmp_path):
    """Bug: a CSVLog.append that failed half-way (a full disk) left a partial row without its line end; the next
    append ran on from it, making one row of two records ("2,train,2." + "3,train,3.5,..." read as loss 2.3,
    lr 'train') and read_metrics_csv then refused the whole table. Now a failed append leaves the file as it was."""
    path = tmp_path / "metrics.csv"
    log = CSVLog(path)
    log.append(_record(1))
    before = path.read_bytes()
    with _disk_full_after(len(before) + 10):
        with pytest.raises(OSError):
            log.append(_record(2))
        assert path.read_bytes() == before
    log.append(_record(3))
    assert [(r["step"], r["loss"]) for r in read_metrics_csv(path)] == [(1, 1.5), (3, 3.5)]
