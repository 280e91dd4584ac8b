"""Multi-crop augmentation: seeded determinism, shapes, exact identities, draws only from the generator."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.data.augment import MultiCropAugment, crop_boxes, gaussian_blur, resample_crops


def images(B: int = 5, C: int = 1, H: int = 8, W: int = 8) -> torch.Tensor:
    return torch.randn(B, C, H, W, generator=torch.Generator().manual_seed(7))


def test_views_are_a_function_of_the_generator_state_only():
    aug = MultiCropAugment(local_crops=2, flip_prob=0.5, blur_prob=0.5, noise_std=0.1)
    x = images(C=3)
    torch.manual_seed(0)
    a = aug(x, torch.Generator().manual_seed(3))
    torch.manual_seed(99)  # the global RNG plays no part
    b = aug(x, torch.Generator().manual_seed(3))
    c = aug(x, torch.Generator().manual_seed(4))
    assert a.shape == (4, 5, 3, 8, 8) and a.dtype == x.dtype
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.isfinite(a).all()


def test_sample_does_not_touch_the_global_rng_and_advances_the_generator():
    aug = MultiCropAugment(noise_std=0.2)
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    p1 = aug.sample(4, (1, 8, 8), g)
    p2 = aug.sample(4, (1, 8, 8), g)
    assert torch.equal(torch.get_rng_state(), before)
    assert not torch.equal(p1["theta"], p2["theta"])
    shapes = {k: tuple(v.shape) for k, v in p1.items()}
    assert shapes == {"theta": (4, 2, 2, 3), "gain": (4, 2), "shift": (4, 2), "sigma": (4, 2), "noise": (4, 2, 1, 8, 8)}


def test_sampled_parameters_respect_their_ranges():
    aug = MultiCropAugment(local_crops=1, global_scale=(0.5, 0.9), local_scale=(0.1, 0.2), ratio=(1.0, 1.0),
                           brightness=0.3, contrast=0.2, blur_prob=0.5, blur_sigma=(0.2, 0.7))
    p = aug.sample(400, (1, 8, 8), torch.Generator().manual_seed(1))
    theta = p["theta"]
    area = theta[..., 0, 0].abs() * theta[..., 1, 1]  # fraction of the image (ratio 1: w = h)
    assert area[:, :2].min() >= 0.5 - 1e-6 and area[:, :2].max() <= 0.9 + 1e-6
    assert area[:, 2].min() >= 0.1 - 1e-6 and area[:, 2].max() <= 0.2 + 1e-6
    # the crop box lies inside the image: |c| + w <= 1
    assert (theta[..., 0, 2].abs() + theta[..., 0, 0].abs()).max() <= 1 + 1e-6
    assert (theta[..., 0, 0] > 0).all()  # flip_prob = 0
    assert p["shift"].abs().max() <= 0.3 and (p["gain"] - 1).abs().max() <= 0.2
    blurred = p["sigma"] > 0
    assert 0.35 < blurred.float().mean() < 0.65
    assert p["sigma"][blurred].min() >= 0.2 and p["sigma"][blurred].max() <= 0.7


def test_identity_settings_reproduce_the_images_exactly_up_to_interpolation():
    aug = MultiCropAugment(global_scale=(1.0, 1.0), ratio=(1.0, 1.0), brightness=0.0, contrast=0.0, blur_prob=0.0)
    x = images()
    views = aug(x, torch.Generator().manual_seed(0))
    assert torch.allclose(views, x.expand(2, *x.shape), atol=1e-5)


def test_flip_and_crop_geometry():
    x = torch.arange(64.0).view(1, 1, 8, 8)
    flip = crop_boxes(torch.tensor([[1.0, 0.5, 0.5, 0.5, 0.0]]), scale=(1.0, 1.0), ratio=(1.0, 1.0))
    assert torch.allclose(resample_crops(x, flip), x.flip(-1), atol=1e-4)
    # the top-left quarter upsampled x2: bilinear sampling of a linear image is exact, so output
    # pixel i reads input coordinate p_i = ((x_in + 1) 8 - 1) / 2, x_in = 0.5 ((2i + 1) / 8 - 1) - 0.5
    quarter = crop_boxes(torch.tensor([[0.0, 0.5, 0.0, 0.0, 1.0]]), scale=(0.25, 0.25), ratio=(1.0, 1.0))
    assert torch.allclose(quarter, torch.tensor([[[0.5, 0.0, -0.5], [0.0, 0.5, -0.5]]]))
    i = torch.arange(8.0)
    p = (((0.5 * ((2 * i + 1) / 8 - 1) - 0.5) + 1) * 8 - 1) / 2
    p = p.clamp(0, 7)  # border padding
    assert torch.allclose(resample_crops(x, quarter)[0, 0], 8 * p[:, None] + p[None, :], atol=1e-4)


def test_blur_matches_an_explicit_convolution():
    x = torch.randn(3, 2, 7, 7, dtype=torch.float64)
    sigma = torch.tensor([0.0, 0.5, 1.2], dtype=torch.float64)
    out = gaussian_blur(x, sigma, kernel_size=5)
    assert torch.equal(out[0], x[0])
    for n in (1, 2):
        d = torch.arange(-2, 3, dtype=torch.float64)
        k = torch.exp(-d**2 / (2 * sigma[n] ** 2))
        k = k / k.sum()
        pad = torch.nn.functional.pad(x[n : n + 1], (2, 2, 2, 2), mode="replicate")[0]
        ref = torch.zeros(2, 7, 7, dtype=torch.float64)
        for i in range(7):
            for j in range(7):
                ref[:, i, j] = (pad[:, i : i + 5, j : j + 5] * torch.outer(k, k)).sum(dim=(1, 2))
        assert torch.allclose(out[n], ref, atol=1e-12)
    # a constant image stays constant
    assert torch.allclose(gaussian_blur(torch.full((1, 1, 6, 6), 2.5), torch.tensor([1.0]), 5), torch.full((1, 1, 6, 6), 2.5))


def test_apply_is_the_documented_composition():
    aug = MultiCropAugment(brightness=0.5, contrast=0.5, blur_prob=1.0, blur_sigma=(0.5, 1.0), noise_std=0.3)
    x = images(B=3)
    p = aug.sample(3, (1, 8, 8), torch.Generator().manual_seed(2))
    views = aug.apply(x, p)
    for v in range(2):
        c = resample_crops(x, p["theta"][:, v])
        m = c.mean(dim=(1, 2, 3), keepdim=True)
        j = p["gain"][:, v].view(3, 1, 1, 1) * (c - m) + m + p["shift"][:, v].view(3, 1, 1, 1)
        ref = gaussian_blur(j, p["sigma"][:, v], aug.kernel_size(8, 8)) + p["noise"][:, v]
        assert torch.allclose(views[v], ref, atol=1e-6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(global_scale=(0.8, 0.2)), "global_scale"),
    (dict(local_scale=(0.0, 0.2)), "local_scale"),
    (dict(contrast=1.0), "contrast"),
    (dict(blur_prob=1.5), "blur_prob"),
    (dict(local_crops=-1), "local_crops"),
    (dict(global_crops=0), "global_crops"),
])
def test_bad_settings_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiCropAugment(**kwargs)


def test_bad_inputs_are_rejected():
    aug = MultiCropAugment()
    p = aug.sample(2, (1, 8, 8), torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"expected \(3, 2, 2, 3\)"):
        aug.apply(images(B=3), p)
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        aug.apply(torch.zeros(2, 8, 8), p)
    with pytest.raises(ValueError, match="kernel_size"):
        gaussian_blur(images(), torch.zeros(5), kernel_size=4)
    with pytest.raises(ValueError, match="batch_size"):
        aug.sample(0, (1, 8, 8), torch.Generator())
