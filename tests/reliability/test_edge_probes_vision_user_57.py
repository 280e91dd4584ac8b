"""Edge probes of a vision / self-supervised researcher: ViT and DINO with diffusion heads, the image loaders and
augmentations (sitting 57, round 2).

Bugs found (each test named ``test_bug_*``):

* ``DiffusionViT.attention_rollout`` took no ``normalize``, the option of the function it wraps: passed by name it
  reached every attention layer as a keyword argument and failed as ``DiffusionAttention.forward() got an unexpected
  keyword argument 'normalize'``, although the rollout's own error (rows of ``kind="operator"`` maps of Laplacian
  heads summing to 0) tells the caller to pass ``normalize=False``;
* ``MultiCropAugment()(images, generator)`` of an empty batch (``B = 0``, e.g. the filtered tail of a dataset) failed as
  "batch_size must be a positive int, got 0", an argument the caller never passed, where ``random_crop_flip``,
  ``resample_crops``, ``gaussian_blur``, the ViT and DINO all take an empty batch.

Checked without finding a bug: a non-square ViT with mixed heads, layer scale, cls and mean pooling against timm's
ViT equations written out in float64; every dense back-end against the others with RoPE 2-D and padding masks;
gradcheck of the ViT with heat, PPR, polynomial and exact-heat heads; channels_last, float64, CPU bf16 autocast,
``torch.compile``, ``torch.export``, inference mode, pickling, meta-device construction with ``reset_parameters``;
attention maps and rollout on grid graphs of a non-square patch grid; DINO's teacher equal to its student for every
registered operator, its loss falling over 8 steps on staged MNIST, the Trainer with CPU bf16, a teacher backbone
loaded into a classifier; the CIFAR-10 JPEG loader's labels and per-channel statistics; ``gaussian_blur`` against
``scipy.ndimage.gaussian_filter``; ``linear_probe_accuracy`` against scikit-learn's ``RidgeClassifier``.
"""

import pytest
import torch

from diffusionformer.data.augment import MultiCropAugment
from diffusionformer.models import DiffusionViT, ViTConfig, attention_rollout


def _vit(**over) -> DiffusionViT:
    torch.manual_seed(0)
    cfg = dict(input_size=(8, 12), in_channels=3, patch_size=4, dim=16, depth=2, num_heads=2)
    return DiffusionViT(ViTConfig(**{**cfg, **over})).eval()


def test_bug_vit_attention_rollout_takes_the_functions_normalize():
    vit = _vit(heads="laplacian:2")  # non-square images, 2 x 3 patches and a class token
    x = torch.randn(2, 3, 8, 12)
    # the refusal names normalize=False as a way out ...
    with pytest.raises(ValueError, match="normalize=False"):
        vit.attention_rollout(x, kind="operator", residual=1.0)
    # ... which the method now takes, as the function does
    got = vit.attention_rollout(x, kind="operator", residual=1.0, normalize=False)
    want = attention_rollout(vit.attention_maps(x, kind="operator"), residual=1.0, normalize=False)
    assert got.shape == (2, 7, 7) and torch.equal(got, want)
    mixed = _vit(heads="attention:1,laplacian:1")
    for normalize in (True, False):
        want = attention_rollout(mixed.attention_maps(x), residual=0.5, normalize=normalize)
        assert torch.equal(mixed.attention_rollout(x, normalize=normalize), want)
    assert torch.equal(mixed.attention_rollout(x), attention_rollout(mixed.attention_maps(x)))


@pytest.mark.parametrize("noise_std", [0.0, 0.1])
def test_bug_multicrop_views_of_an_empty_batch(noise_std):
    aug = MultiCropAugment(local_crops=2, blur_prob=0.5, noise_std=noise_std)
    g = torch.Generator().manual_seed(0)
    views = aug(torch.randn(0, 3, 8, 12), g)
    assert views.shape == (4, 0, 3, 8, 12) and views.dtype == torch.float32
    # no draw was taken from the caller's generator: the next batch's views are those of a fresh seed
    x = torch.randn(2, 3, 8, 12)
    assert torch.equal(aug(x, g), aug(x, torch.Generator().manual_seed(0)))
    assert aug(torch.randn(0, 1, 8, 8, dtype=torch.float64), g).dtype == torch.float64
    with pytest.raises(TypeError, match="floating-point"):  # still refused as a non-empty batch is
        aug(torch.zeros(0, 1, 8, 8, dtype=torch.uint8), g)
    with pytest.raises(TypeError, match="Generator"):
        aug(torch.randn(0, 1, 8, 8), 0)


def test_attention_maps_kind_in_another_case_gets_a_hint():
    """Bug (sitting 57): ``attention_maps(x, kind="p")`` said only "expected kind 'P' or 'operator'"."""
    vit, x = _vit(), torch.zeros(1, 3, 8, 12)
    with pytest.raises(ValueError, match=r"got 'p' \(did you mean 'P'\?\)"):
        vit.attention_maps(x, kind="p")
    with pytest.raises(ValueError, match=r"got 'operater' \(did you mean 'operator'\?\)"):
        vit.attention_maps(x, kind="operater")
