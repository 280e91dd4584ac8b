"""Review of the commits "review 60m" (``reload._channel_floats``, ``CSVLog._refill`` keeping the table's own rows),
"load_run reads a run folder written before 41b9968" and the docs audit of the day's changes."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def _user_images(mean, std):
    """A user's image dataset (two channels) holding its statistics as ``mean``/``std`` in whatever form it chose."""
    from diffusionformer.data.base import ClassificationData

    x, y = torch.zeros(4, 2, 4, 4), torch.tensor([0, 1, 0, 1])
    return ClassificationData("user-images", "image", x, y, x, y, x, y, num_classes=2, input_shape=(2, 4, 4),
                              mean=mean, std=std, meta={"scale": 255.0})


@pytest.mark.parametrize("mean", [
    torch.tensor([0.5 + 1j, 0.25]), np.array([0.5 + 1j, 0.25]),  # the imaginary part dropped (a torch warning only)
    [True, False], torch.tensor([True, True]), np.array([True, False]),  # recorded as 1.0 and 0.0
    [float("nan"), 0.5], torch.tensor([0.5, float("inf")]),  # written to preprocessing.json as null
], ids=["complex tensor", "complex numpy", "bools", "bool tensor", "bool numpy", "nan", "inf"])
def test_image_statistics_that_are_not_finite_real_numbers_are_refused_not_recorded_as_others(mean):
    """A complex tensor's statistics were recorded without their imaginary part (a list of complex numbers was refused),
    bools as 1.0/0.0 (a bool ``scale`` is refused as not known), NaN or inf as ``null``: a run's
    ``preprocessing.json`` that a new image cannot go through, without a word."""
    from diffusionformer.experiments.reload import _data_preprocessing

    with pytest.raises(ValueError, match=r"ClassificationData\.mean: expected the per-channel mean of the images "
                                         r"\(finite real numbers\)"):
        _data_preprocessing(_user_images(mean, [0.25, 0.5]))
    record = _data_preprocessing(_user_images(torch.tensor([[0.5], [0.25]]), (1, 2)))  # real numbers still recorded
    assert record == {"kind": "image", "scale": 255.0, "mean": [0.5, 0.25], "std": [1.0, 2.0]}


def _record(step, split="train", segment=0):
    return {"step": step, "split": split, "loss": 1.0 / step, "lr": 0.1, "metrics": {"acc": step / 8},
            "elapsed": float(step), "time": 100.0 + 1000 * segment + step}


@pytest.mark.parametrize("rerun_logs", [(6, 8), ()], ids=["rerun logs fewer steps", "rerun logs none"])
def test_a_csv_table_off_at_a_resume_does_not_keep_the_killed_segments_rows_the_log_cut(tmp_path, rerun_logs):
    """A run killed past its checkpoint (step 4), resumed with the CSV log off at a longer ``log_interval`` (a
    resumable field), then resumed again with it on: ``_refill`` kept the killed segment's rows (step 5, 6) as rows of
    the table's own the log lacked, a record of steps the run replayed and logged otherwise (or not at all)."""
    from diffusionformer.train import read_metrics
    from diffusionformer.train.loggers import open_loggers, read_metrics_csv

    log = open_loggers(["jsonl", "csv"], tmp_path)
    for step in range(1, 7):  # killed after step 6; the checkpoint is at step 4
        log.append(_record(step))
    log.close()
    log = open_loggers(["jsonl"], tmp_path)  # resumed at 4 with the CSV table off
    log.truncate(4)
    for step in rerun_logs:
        log.append(_record(step, segment=1))
    log.close()
    log = open_loggers(["jsonl", "csv"], tmp_path)  # resumed at 8 (or 6) with it on again
    log.truncate(8 if rerun_logs else 6)
    log.close()
    expected = [(r["step"], r["time"]) for r in read_metrics(tmp_path)]
    assert [s for s, _ in expected] == [1, 2, 3, 4, *rerun_logs]
    assert [(r["step"], r["time"]) for r in read_metrics_csv(tmp_path)] == expected


def test_the_csv_row_of_a_damaged_jsonl_line_is_kept_at_every_later_resume(tmp_path):
    """The row the table keeps for a damaged ``metrics.jsonl`` line (gone from the log at that resume's rewrite) stays
    through the resumes after it."""
    from diffusionformer.train.loggers import open_loggers, read_metrics_csv

    log = open_loggers(["jsonl", "csv"], tmp_path)
    for step in range(1, 5):
        log.append(_record(step))
    log.close()
    path = tmp_path / "metrics.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1][:12] + b"\n"  # step 2's line damaged
    path.write_bytes(b"".join(lines))
    for max_step in (4, 3):
        log = open_loggers(["jsonl", "csv"], tmp_path)
        with pytest.warns(UserWarning, match="skipping a malformed metrics line") if max_step == 4 else _nothing():
            log.truncate(max_step)
        log.close()
        assert [r["step"] for r in read_metrics_csv(tmp_path)] == list(range(1, max_step + 1))


def _nothing():
    import contextlib

    return contextlib.nullcontext()
