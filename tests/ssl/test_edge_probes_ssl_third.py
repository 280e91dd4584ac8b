"""Edge probes of the DINO multi-crop views (third pass): ``diffusionformer/data/augment.py``.

References are float64 computations on the same random draws (``torch.nn.functional.interpolate``
with bilinear, ``align_corners=False``, or the library's own float64 path on rounded pixels).
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.data.augment import MultiCropAugment, crop_boxes, resample_crops


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bug_resample_crops_low_precision_grid(dtype):
    """Bug: ``resample_crops`` built the sampling grid in the images' dtype, so in bfloat16 (and float16
    on larger sides) neighbouring pixel centres rounded to one coordinate: an identity crop of a 64x64
    bfloat16 image was off by up to 0.15 (pixels in [0, 1]), a local crop by 0.23, and some sides
    (200) gave NaN pixels. Reference: the float64 resampling of the same rounded pixels and boxes."""
    g = torch.Generator().manual_seed(0)
    side = 200 if dtype == torch.bfloat16 else 224
    x = torch.rand(2, 1, side, side, generator=g).to(dtype)
    identity = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]]).expand(2, 2, 3)
    out = resample_crops(x, identity)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    assert (out.double() - x.double()).abs().max() <= 1e-4  # an identity crop gives the pixels back
    x64 = torch.rand(4, 3, 64, 64, generator=g).to(dtype)
    theta = crop_boxes(torch.rand(4, 5, generator=g), (0.05, 0.4), (3 / 4, 4 / 3))
    want = resample_crops(x64.double(), theta.double())  # float64 reference on the same pixels
    got = resample_crops(x64, theta)
    assert got.dtype == dtype
    assert (got.double() - want).abs().max() <= 2 ** -7  # one rounding of a value in [0, 1]


def test_multicrop_bfloat16_views_match_the_float64_views_of_the_same_pixels():
    """The whole view pipeline (crop, gain, shift, blur, noise) in bfloat16 stays within bfloat16
    rounding of the float64 views of the same pixels and parameters."""
    aug = MultiCropAugment(local_crops=2, local_scale=(0.05, 0.4), flip_prob=0.5, noise_std=0.1)
    g = torch.Generator().manual_seed(3)
    x = torch.rand(3, 2, 48, 40, generator=g).to(torch.bfloat16)
    p = aug.sample(3, (2, 48, 40), g)
    want = aug.apply(x.double(), p)
    got = aug.apply(x, p)
    assert got.dtype == torch.bfloat16 and got.shape == (4, 3, 2, 48, 40)
    assert (got.double() - want).abs().max() < 0.05


def test_views_are_resized_crops_with_per_image_and_per_view_draws():
    """Each image and each view has its own box (global ones at area in global_scale, local ones in
    DINO's local_scale (0.05, 0.4), aspect ratio in ratio), centred among the boxes that fit."""
    aug = MultiCropAugment(local_crops=4, local_scale=(0.05, 0.4), flip_prob=0.5, brightness=0.0,
                           contrast=0.0, blur_prob=0.0)
    B, V = 5, aug.num_views
    p = aug.sample(B, (1, 16, 16), torch.Generator().manual_seed(7))
    theta = p["theta"]
    assert theta.reshape(B * V, 6).unique(dim=0).shape[0] == B * V  # no box shared by images or views
    w, h = theta[..., 0, 0].abs(), theta[..., 1, 1]
    area, ratio = w * h, w / h
    assert ((area[:, :2] >= 0.4 - 1e-6) & (area[:, :2] <= 1 + 1e-6)).all()
    assert ((area[:, 2:] >= 0.05 - 1e-6) & (area[:, 2:] <= 0.4 + 1e-6)).all()
    assert ((ratio >= 3 / 4 - 1e-5) & (ratio <= 4 / 3 + 1e-5)).all()
    assert ((theta[..., 0, 2].abs() <= 1 - w + 1e-6) & (theta[..., 1, 2].abs() <= 1 - h + 1e-6)).all()
