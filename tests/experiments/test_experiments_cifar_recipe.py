"""The supervised image recipe: random crop + flip augmentation and label smoothing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from diffusionformer.data.augment import random_crop_flip
from diffusionformer.data.base import ClassificationData
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.tasks import ClassificationTask, build_task


def _reference_crop_flip(x: torch.Tensor, generator: torch.Generator, padding: int, flip: bool) -> torch.Tensor:
    """One image at a time: draws in the documented order, zero pad, slice, flip."""
    B, C, H, W = x.shape
    offsets = torch.randint(0, 2 * padding + 1, (B, 2), generator=generator)
    flips = torch.rand(B, generator=generator) < 0.5 if flip else torch.zeros(B, dtype=torch.bool)
    out = torch.empty_like(x)
    for b in range(B):
        padded = torch.zeros(C, H + 2 * padding, W + 2 * padding, dtype=x.dtype)
        padded[:, padding:padding + H, padding:padding + W] = x[b]
        i, j = int(offsets[b, 0]), int(offsets[b, 1])
        crop = padded[:, i:i + H, j:j + W]
        out[b] = crop.flip(-1) if flips[b] else crop
    return out


@pytest.mark.parametrize("padding,flip", [(4, True), (2, False), (0, True), (3, True)])
def test_random_crop_flip_equals_a_per_image_loop(padding, flip):
    x = torch.randn(7, 3, 8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    got = random_crop_flip(x, torch.Generator().manual_seed(5), padding=padding, flip=flip)
    want = _reference_crop_flip(x, torch.Generator().manual_seed(5), padding, flip)
    assert torch.equal(got, want)


def test_random_crop_flip_moves_pixels_and_flips_some():
    x = torch.randn(64, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    y = random_crop_flip(x, torch.Generator().manual_seed(2), padding=4, flip=True)
    changed = (y != x).flatten(1).any(1)
    assert 0 < changed.sum() <= 64 and y.shape == x.shape
    with pytest.raises(ValueError, match="padding"):
        random_crop_flip(x, torch.Generator(), padding=-1)
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        random_crop_flip(x[0], torch.Generator())


def _data(n=40):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, 8, 8, generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    return ClassificationData("toy", "image", x, y, x[:8], y[:8], x[:8], y[:8], num_classes=4, input_shape=(3, 8, 8))


def test_label_smoothing_loss_equals_the_explicit_formula_in_float64():
    data = _data()
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 4)).double()
    x, y = data.x_train[:16].double(), data.y_train[:16]
    eps = 0.1
    task = ClassificationTask(data, label_smoothing=eps)
    loss, _ = task.loss(model, (x, y))
    logp = torch.log_softmax(model(x).double(), dim=-1)
    want = ((1 - eps) * -logp.gather(1, y[:, None]).squeeze(1) + eps * -logp.mean(dim=1)).mean()
    torch.testing.assert_close(loss.double(), want, rtol=1e-6, atol=1e-7)  # the loss is computed in float32
    plain, _ = ClassificationTask(data).loss(model, (x, y))
    torch.testing.assert_close(plain.double(), F.nll_loss(logp, y), rtol=1e-6, atol=1e-7)
    assert not torch.isclose(loss, plain)


def test_augmented_batches_are_drawn_from_the_trainer_generator():
    data = _data()
    task = ClassificationTask(data, augment={"crop_padding": 4, "flip": True})
    a = task.train_batch(0, torch.Generator().manual_seed(3), 16)
    b = task.train_batch(0, torch.Generator().manual_seed(3), 16)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])  # reproducible from the generator
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, 40, (16,), generator=g)
    want = _reference_crop_flip(data.x_train[idx], g, 4, True)
    assert torch.equal(a[0], want) and torch.equal(a[1], data.y_train[idx])
    plain = ClassificationTask(data).train_batch(0, torch.Generator().manual_seed(3), 16)
    assert torch.equal(plain[0], data.x_train[idx])


def test_bad_recipe_options_are_refused():
    data = _data()
    with pytest.raises(ValueError, match="unknown key"):
        ClassificationTask(data, augment={"cutmix": True})
    with pytest.raises(ValueError, match="label_smoothing"):
        ClassificationTask(data, label_smoothing=1.0)
    base = {"name": "t", "seeds": [0], "operators": [{"name": "attention"}],
            "tasks": [{"name": "c", "dataset": "digits", "model": "vit-digits"}]}
    for key, value, match in (("augment", {"crop": 4}, "unknown augment"), ("augment", {"crop_padding": -2}, "crop_padding"),
                              ("augment", {"flip": 1}, "flip"), ("label_smoothing", 1.5, "label_smoothing")):
        cfg = {**base, "tasks": [{**base["tasks"][0], key: value}]}
        with pytest.raises(ValueError, match=match):
            load_experiment_config(cfg)
    from diffusionformer.data.text import char_text_data

    text = char_text_data("toy", "abcabcabcabc")
    with pytest.raises(ValueError, match="supervised classification only"):
        build_task(text, torch.nn.Linear(1, 1), label_smoothing=0.1)
