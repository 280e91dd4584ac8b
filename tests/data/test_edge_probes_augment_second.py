"""Edge probes of diffusionformer.data.augment (second pass): independent float64 references for
the crops, the bilinear resampling, the blur and the CIFAR crop-and-flip, and the bugs they found."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from diffusionformer.data.augment import (
    MultiCropAugment,
    crop_boxes,
    gaussian_blur,
    random_crop_flip,
    resample_crops,
)


def _bilinear(img: torch.Tensor, py: float, px: float) -> torch.Tensor:
    """Bilinear sample of ``img`` (C, H, W) at pixel coordinates, borders clamped."""
    H, W = img.shape[-2:]
    py, px = min(max(py, 0.0), H - 1.0), min(max(px, 0.0), W - 1.0)
    y0, x0 = int(math.floor(py)), int(math.floor(px))
    y1, x1 = min(y0 + 1, H - 1), min(x0 + 1, W - 1)
    fy, fx = py - y0, px - x0
    return (img[:, y0, x0] * (1 - fy) * (1 - fx) + img[:, y0, x1] * (1 - fy) * fx
            + img[:, y1, x0] * fy * (1 - fx) + img[:, y1, x1] * fy * fx)


def test_fractional_crops_match_hand_bilinear_at_pixel_centres():
    torch.manual_seed(1)
    H, W = 7, 10  # non-square
    x = torch.randn(1, 2, H, W, dtype=torch.float64)
    u = torch.rand(4, 5, dtype=torch.float64)
    scale, ratio = (0.1, 0.9), (0.5, 2.0)
    out = resample_crops(x.expand(4, -1, -1, -1), crop_boxes(u, scale, ratio))
    for n in range(4):
        area = scale[0] + (scale[1] - scale[0]) * float(u[n, 0])
        r = math.exp(math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * float(u[n, 1]))
        w, h = min(math.sqrt(area * r), 1.0), min(math.sqrt(area / r), 1.0)
        left, top = (1 - w) * float(u[n, 2]) * W, (1 - h) * float(u[n, 3]) * H
        for i in range(H):
            for j in range(W):
                jj = W - 1 - j if float(u[n, 4]) < 0.5 else j
                ref = _bilinear(x[0], top + (i + 0.5) * h - 0.5, left + (jj + 0.5) * w - 0.5)
                torch.testing.assert_close(out[n, :, i, j], ref, rtol=0, atol=1e-12)


def test_integer_box_matches_interpolate_of_the_slice_inside():
    x = torch.randn(2, 3, 8, 12, dtype=torch.float64)
    a, b, ch, cw = 2, 3, 4, 6
    theta = torch.tensor([[[cw / 12, 0, (2 * b + cw) / 12 - 1], [0, ch / 8, (2 * a + ch) / 8 - 1]]],
                         dtype=torch.float64).repeat(2, 1, 1)
    ref = F.interpolate(x[:, :, a:a + ch, b:b + cw], size=(8, 12), mode="bilinear", align_corners=False)
    # the outermost output pixels read half a pixel beyond the box (the image goes on there), interpolate clamps
    torch.testing.assert_close(resample_crops(x, theta)[..., 1:-1, 1:-1], ref[..., 1:-1, 1:-1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("k", [1, 3, 7, 21])
def test_blur_matches_separable_float64_reference(k):
    img = torch.randn(2, 2, 5, 6, dtype=torch.float64)
    sigma = torch.tensor([0.7, 2.0], dtype=torch.float64)
    half = k // 2
    d = torch.arange(-half, half + 1, dtype=torch.float64)
    refs = []
    for n in range(2):
        kern = torch.exp(-0.5 * (d / sigma[n]) ** 2)
        kern = kern / kern.sum()
        p = F.pad(img[n:n + 1], (half,) * 4, mode="replicate").transpose(0, 1)  # documented: replicated borders
        p = F.conv2d(F.conv2d(p, kern.view(1, 1, k, 1)), kern.view(1, 1, 1, k))
        refs.append(p.transpose(0, 1))
    torch.testing.assert_close(gaussian_blur(img, sigma, k), torch.cat(refs), rtol=0, atol=1e-12)


def test_random_crop_flip_matches_pad_and_slice():
    x = torch.randn(5, 3, 7, 9)
    g = torch.Generator().manual_seed(3)
    off = torch.randint(0, 9, (5, 2), generator=g)
    flips = torch.rand(5, generator=g) < 0.5
    padded = F.pad(x, (4, 4, 4, 4))
    ref = torch.stack([padded[i, :, off[i, 0]:off[i, 0] + 7, off[i, 1]:off[i, 1] + 9] for i in range(5)])
    ref = torch.where(flips[:, None, None, None], ref.flip(-1), ref)
    assert torch.equal(random_crop_flip(x, torch.Generator().manual_seed(3)), ref)
    u8 = torch.arange(2 * 3 * 4 * 4, dtype=torch.uint8).view(2, 3, 4, 4)
    assert random_crop_flip(u8, torch.Generator().manual_seed(0)).dtype == torch.uint8


def test_channels_last_views_equal_contiguous_ones():
    img = torch.randn(2, 3, 6, 6).to(memory_format=torch.channels_last)
    aug = MultiCropAugment(local_crops=2, blur_prob=1.0, flip_prob=0.5, noise_std=0.1)
    got = aug(img, torch.Generator().manual_seed(3))
    assert torch.equal(got, aug(img.contiguous(), torch.Generator().manual_seed(3)))


@pytest.mark.parametrize("bad", [1.5, -0.25, float("nan")])
def test_bug_crop_boxes_uniforms_out_of_range(bad):
    """Bug: crop_boxes took uniforms outside [0, 1] (or NaN) silently: u = 1.5 for the centre gave a
    box reaching past the image's edge (|c_x| + w > 1), NaN a NaN box; now a ValueError naming u."""
    u = torch.full((2, 5), 0.5)
    u[1, 2] = bad
    with pytest.raises(ValueError, match=r"uniforms u in \[0, 1\].*row 1"):
        crop_boxes(u, scale=(0.1, 0.5), ratio=(1.0, 1.0))
    crop_boxes(torch.tensor([[0.0, 1.0, 0.0, 1.0, 1.0]]), scale=(0.1, 0.5), ratio=(1.0, 1.0))  # the closed ends pass


def test_bug_crop_boxes_bool_uniforms_lost_the_flip():
    """Bug: boolean uniforms were taken, and the flip sign cast to bool turned -1 into True (+1): u[:, 4] =
    False (< 0.5, a flip) gave an unflipped box; now a TypeError asking for floating-point uniforms."""
    u = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]]).bool()
    with pytest.raises(TypeError, match="floating-point"):
        crop_boxes(u, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    with pytest.raises(TypeError, match="list"):
        crop_boxes([[0.5] * 5], scale=(1.0, 1.0), ratio=(1.0, 1.0))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_bug_resample_crops_non_finite_theta(bad):
    """Bug: a non-finite box resampled to a finite, plausible-looking image (a NaN scale repeated the
    border column across the view) instead of an error; now a ValueError naming theta and the image."""
    x = torch.randn(2, 1, 4, 4)
    theta = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]).repeat(2, 1, 1)
    theta[1, 0, 0] = bad
    with pytest.raises(ValueError, match="theta must be finite.*image 1 of 2"):
        resample_crops(x, theta)
    with pytest.raises(TypeError, match="theta as a tensor"):
        resample_crops(x, theta.tolist())


def test_bug_apply_missing_theta_named():
    """Bug: MultiCropAugment.apply named a missing or non-tensor gain/shift/sigma/noise parameter but
    failed on theta with a bare KeyError('theta') or AttributeError; now the same ValueError."""
    aug = MultiCropAugment()
    x = torch.randn(2, 1, 6, 6)
    params = aug.sample(2, (1, 6, 6), torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="parameter 'theta' must have shape \\(2, 2, 2, 3\\).*missing"):
        aug.apply(x, {k: v for k, v in params.items() if k != "theta"})
    with pytest.raises(ValueError, match="parameter 'theta'.*got list"):
        aug.apply(x, {**params, "theta": params["theta"].tolist()})
    with pytest.raises(ValueError, match="are for theta"):
        aug.apply(x, {**params, "theta": params["theta"][:1]})
