"""Review 60x: ``DINO.config`` as a property (028f720) and the EMA step through ``torch._foreach_*`` (1ba1a3b, bd67518).

A DINO pickled whole (``torch.save(dino)``) before 028f720 holds its config in the instance dict as ``config``; the
property reads ``_config``, so every ``dino.config`` of such a model raised "'DINO' object has no attribute 'config'"
(``update_center``, ``DINOTask``, ``model_record`` of a resumed run: ``None``, so its record check compared nothing).
"""

from __future__ import annotations

import copy
import io
import pickle
from dataclasses import replace

import pytest
import torch

from diffusionformer.models.dino import DINO, DINOConfig
from diffusionformer.train.checkpoint import model_record


def _dino() -> DINO:
    torch.manual_seed(0)
    return DINO(DINOConfig(input_size=(8, 8), patch_size=2, dim=16, depth=1, num_heads=2, laplacian_heads=1,
                           out_dim=8, head_hidden=16, head_bottleneck=8))


def _round_trip(dino: DINO, via: str) -> DINO:
    if via == "pickle":
        return pickle.loads(pickle.dumps(dino))
    buffer = io.BytesIO()
    torch.save(dino, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("via", ["pickle", "torch.save"])
@pytest.mark.parametrize("resized", [False, True])
def test_bug_a_dino_pickled_before_config_was_a_property_has_its_config(via, resized):
    dino = _dino()
    if resized:  # both backbones: the config the old pickle holds is the built size's
        dino.backbone.set_input_size((12, 8))
        dino.student.backbone.set_input_size((12, 8))
    expected = dino.config
    old = copy.deepcopy(dino)
    del old.__dict__["_config"]  # as the old version pickled it: the config it was built with, in the instance dict
    old.__dict__["config"] = replace(expected, input_size=(8, 8))
    loaded = _round_trip(old, via)
    assert loaded.config == expected and "config" not in vars(loaded)
    assert model_record(loaded) == model_record(dino)
    loaded.update_center(torch.randn(3, 8))  # reads config.out_dim and center_momentum
    x = torch.randn(2, 1, *expected.input_size)
    torch.testing.assert_close(loaded(x), dino(x), rtol=0, atol=0)


@pytest.mark.parametrize("via", ["pickle", "torch.save", "deepcopy"])
def test_a_resized_dino_keeps_its_config_through_a_copy(via):
    dino = _dino()
    dino.backbone.set_input_size((12, 8))
    dino.student.backbone.set_input_size((12, 8))
    loaded = copy.deepcopy(dino) if via == "deepcopy" else _round_trip(dino, via)
    assert loaded.config == dino.config and loaded.config.input_size == (12, 8)
    assert "config" not in vars(loaded)
    rebuilt = DINO(loaded.config)
    rebuilt.load_state_dict(loaded.state_dict())


def test_mixed_dtype_pairs_take_the_per_parameter_values():
    """A float32 teacher of a bfloat16 student (the student cast alone) and a bfloat16 teacher of a float32 one: the
    multi-tensor step and the per-parameter step give the same values (pinned, no bug)."""
    for cast in ("student", "teacher"):
        dino = _dino()
        getattr(dino, cast).to(torch.bfloat16)
        with torch.no_grad():
            for p in dino.student.parameters():
                p.add_(torch.randn_like(p))
        expected = [t.clone().mul_(0.9).add_(s.detach(), alpha=1.0 - 0.9) for t, s in dino._ema_pairs("test")]
        dino.update_teacher(0.9)
        assert all(torch.equal(t, e) for (t, _), e in zip(dino._ema_pairs("test"), expected))
