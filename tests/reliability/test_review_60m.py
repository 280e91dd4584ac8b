"""Review of the commits "loaded runs on new inputs" (``preprocessing.json``, ``LoadedRun.preprocessing``,
``DiffusionViT.set_input_size``) and "resume walk: a CSV log switched on at a resume" (``metrics.csv`` written again
from ``metrics.jsonl``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def _user_images(mean, std, meta=None):
    """A user's image dataset (two channels) holding its statistics as ``mean``/``std`` in whatever form it chose."""
    from diffusionformer.data.base import ClassificationData

    x, y = torch.zeros(4, 2, 4, 4), torch.tensor([0, 1, 0, 1])
    return ClassificationData("user-images", "image", x, y, x, y, x, y, num_classes=2, input_shape=(2, 4, 4),
                              mean=mean, std=std, meta=dict(meta or {}))


@pytest.mark.parametrize("form", [
    lambda v: torch.tensor(v, dtype=torch.float32).view(-1, 1, 1),      # (C, 1, 1): broadcasts over (C, H, W)
    lambda v: np.asarray(v, dtype=np.float32).reshape(-1, 1, 1),
    lambda v: torch.tensor(v, dtype=torch.float32).view(1, -1, 1, 1),   # (1, C, 1, 1): over (B, C, H, W)
    lambda v: [np.float32(x) for x in v],
], ids=["tensor C11", "numpy C11", "tensor 1C11", "numpy scalars"])
def test_a_users_dataset_with_array_statistics_has_its_preprocessing_recorded_not_a_failed_run(form):
    """Statistics of shape (C, 1, 1) (the shape that broadcasts over an image), as a tensor or a NumPy array, failed
    every run of the dataset at its start ("only one element tensors can be converted", "only 0-dimensional arrays"):
    the record read them value by value with float()."""
    from diffusionformer.experiments.reload import _data_preprocessing

    mean, std = [0.25, 0.5], [0.125, 2.0]  # exact in float32
    record = _data_preprocessing(_user_images(form(mean), form(std), {"scale": 255.0}))
    assert record == {"kind": "image", "scale": 255.0, "mean": mean, "std": std}


def test_a_users_grayscale_dataset_with_one_number_statistics_is_recorded_and_a_numpy_scale_kept():
    """One number for a grey image's one channel (a float, a 0-d tensor) failed the run ("'float' object is not
    iterable", "iteration over a 0-d tensor"); a NumPy scale was recorded as not known (None)."""
    from diffusionformer.experiments.reload import _data_preprocessing

    for mean, std in ((0.5, 0.25), (torch.tensor(0.5), torch.tensor(0.25))):
        record = _data_preprocessing(_user_images(mean, std, {"scale": np.float32(16.0)}))
        assert record == {"kind": "image", "scale": 16.0, "mean": [0.5], "std": [0.25]}
    with pytest.raises(ValueError, match=r"ClassificationData\.mean: expected the per-channel mean"):
        _data_preprocessing(_user_images(("a", "b"), (1.0, 1.0)))


def _record(step, split="train", **metrics):
    return {"step": step, "split": split, "loss": 1.0 / step, "lr": 0.1, "metrics": metrics, "elapsed": float(step),
            "time": 100.0 + step}


def test_a_resume_keeps_the_csv_row_of_a_record_whose_jsonl_line_is_damaged(tmp_path):
    """metrics.csv is written again from metrics.jsonl on resume; a jsonl line damaged in the middle (dropped with a
    warning) took the table's whole row with it, the last copy of that record (the table kept it before)."""
    from diffusionformer.train import read_metrics
    from diffusionformer.train.loggers import open_loggers, read_metrics_csv

    log = open_loggers(["jsonl", "csv"], tmp_path)
    for step in range(1, 5):
        log.append(_record(step, acc=step / 8))
        log.append(_record(step, "eval", val_acc=step / 4))
    log.close()
    uninterrupted = (tmp_path / "metrics.csv").read_text()
    path = tmp_path / "metrics.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2][:15] + b"\xff\n"  # step 2's records: not JSON (a damaged disk block)
    lines[3] = lines[3][:9] + b"\n"
    path.write_bytes(b"".join(lines))
    log = open_loggers(["jsonl", "csv"], tmp_path)
    with pytest.warns(UserWarning, match="skipping a malformed metrics line"):
        log.truncate(3)
    log.close()
    assert [(r["step"], r["split"]) for r in read_metrics(tmp_path)] == [(1, "train"), (1, "eval"), (3, "train"),
                                                                        (3, "eval")]
    kept = "".join(uninterrupted.splitlines(keepends=True)[:7])  # the header and steps 1 to 3, in their order
    assert (tmp_path / "metrics.csv").read_text() == kept
    assert read_metrics_csv(tmp_path)[2] == _record(2, acc=0.25)


@pytest.mark.parametrize("image_size", [(12, 12), (4, 4)], ids=["larger", "one patch"])
def test_a_dino_whose_teacher_backbone_alone_was_resized_refuses_the_ema_step_clearly(image_size):
    """``DINO.backbone`` (the teacher's) resized by ``set_input_size`` and the student not: the EMA step failed with a
    bare "The size of tensor a (37) must match", or, the student resized to one patch, broadcast that one position
    over the teacher's whole grid without a word."""
    from diffusionformer.models.dino import DINO, DINOConfig

    torch.manual_seed(0)
    dino = DINO(DINOConfig(input_size=(8, 8), patch_size=4, dim=16, depth=1, num_heads=2, pool="mean", out_dim=8,
                           head_hidden=8, head_bottleneck=4))
    if image_size == (4, 4):
        dino.student.backbone.set_input_size(image_size)
    else:
        dino.backbone.set_input_size(image_size)
    teacher = {n: b.clone() for n, b in dino.teacher.named_buffers()}
    for momentum in (0.0, 0.5):
        with pytest.raises(ValueError, match=r"teacher's and the student's backbone\.pos_embed of one shape.*"
                                             r"dino\.student\.backbone\.set_input_size"):
            dino.update_teacher(momentum)
    assert all(torch.equal(b, teacher[n]) for n, b in dino.teacher.named_buffers())
    dino.student.backbone.set_input_size(image_size)
    dino.backbone.set_input_size(image_size)
    dino.update_teacher(0.5)  # both sides resized: the step goes on
    assert dino(torch.randn(2, 1, *image_size), output="student").shape == (2, 8)
