"""Targeted check of ``DiffusionViT.set_input_size`` inside the models that hold a ViT config of their own: a
:class:`~diffusionformer.models.DINO` with both backbones resized kept the built ``input_size`` in ``DINO.config``."""

from __future__ import annotations

import pytest
import torch


def _dino():
    from diffusionformer.models.dino import DINO, DINOConfig

    torch.manual_seed(0)
    return DINO(DINOConfig(input_size=(8, 8), patch_size=2, dim=16, depth=1, num_heads=2, out_dim=8, head_hidden=8,
                           head_bottleneck=4, momentum=0.9))


@pytest.mark.parametrize("image_size", [(12, 12), (4, 8)], ids=["larger", "smaller"])
def test_a_dino_resized_on_both_backbones_rebuilds_from_its_config_and_its_checkpoint_records_the_new_size(image_size):
    """Both backbones resized (as ``set_input_size`` asks of a DINO): ``DINO(dino.config)`` was built at the old size
    and refused ``dino.state_dict()`` ("size mismatch for student.backbone.pos_embed"), and a checkpoint's model record
    named the old ``input_size`` beside weights of the new grid (a fresh model of the old size passed the record check
    and failed on the weights' shapes instead)."""
    from diffusionformer.models.dino import DINO, DINOConfig
    from diffusionformer.train.checkpoint import model_record, model_record_differences

    dino = _dino()
    built = model_record(dino)
    dino.student.backbone.set_input_size(image_size)
    dino.backbone.set_input_size(image_size)
    assert isinstance(dino.config, DINOConfig) and dino.config.input_size == image_size
    assert dino.config.out_dim == 8 and dino.config.momentum == 0.9  # the other fields kept
    assert dino.config is dino.config  # one config, not a new one per read (update_center reads it every step)
    x = torch.randn(2, 1, *image_size)
    dino.update_teacher(0.5)
    rebuilt = DINO(dino.config)
    rebuilt.load_state_dict(dino.state_dict())
    assert torch.equal(rebuilt(x), dino(x)) and torch.equal(rebuilt(x, output="student"), dino(x, output="student"))
    record = model_record(dino)
    assert record["config"]["input_size"] == list(image_size)
    assert model_record_differences(record, model_record(rebuilt)) == []
    assert model_record_differences(record, built) == [f"config input_size: checkpoint {list(image_size)!r}, now [8, 8]"]


def test_a_dino_config_set_anew_is_the_one_read_back():
    """``dino.config = ...`` (a caller's own change) still holds; the input size stays the backbones'."""
    import dataclasses

    dino = _dino()
    dino.config = dataclasses.replace(dino.config, center_momentum=0.5)
    assert dino.config.center_momentum == 0.5 and dino.config.input_size == (8, 8)
