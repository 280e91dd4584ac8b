"""The metrics readers refuse what is not a regular file (reference: ``stat.S_ISREG``, as the trainer's resume)."""

from __future__ import annotations

import os
import threading

import pytest

from diffusionformer.train import read_metrics
from diffusionformer.train.loggers import read_metrics_csv


def _release_later(fifo):
    """Opens the FIFO for writing and closes it at once, so that a reader blocked on it (the bug) gets end of file
    and the test fails instead of hanging."""
    def feed():
        with open(fifo, "w"):
            pass

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return thread


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
@pytest.mark.parametrize("reader,name", [(read_metrics, "metrics.jsonl"), (read_metrics_csv, "metrics.csv")])
def test_bug_the_metrics_readers_refuse_a_fifo(tmp_path, reader, name):
    """Bug: read_metrics / read_metrics_csv of a FIFO (given as a file or found in a run folder) waited for a
    writer for ever, and read whatever it sent; MetricsLog.truncate already refused it on resume."""
    fifo = tmp_path / name
    os.mkfifo(fifo)
    for target in (fifo, tmp_path):
        thread = _release_later(fifo)
        try:
            with pytest.raises(ValueError, match=rf"{reader.__name__}: expected .*{name} to be a regular file "
                                                 r"\(the run's log\), got a FIFO; remove it \(or move it away\)$"):
                reader(target)
        finally:
            if thread.is_alive():  # the fixed reader never opened the FIFO: release the feeder
                with open(fifo):
                    pass
            thread.join(5)


def test_the_readers_still_read_regular_files_and_name_missing_ones(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "split": "train", "loss": 0.5, "lr": 0.1, "metrics": {}}\n')
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]
    with pytest.raises(FileNotFoundError):
        read_metrics_csv(tmp_path)
