"""Edge probes (third pass) of the image augmentation and its neighbours: the in-place per-channel
normalisation given tensors that share memory, and the classification task's ``augment`` option."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.data.base import ClassificationData
from diffusionformer.data.splits import normalize_channels
from diffusionformer.experiments.tasks import ClassificationTask


def _reference(x: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """Float64 standardisation of ``x`` with the population mean and std of ``stats``, per channel."""
    s = stats.double()
    mean = s.mean(dim=(0, 2, 3), keepdim=True)
    std = s.var(dim=(0, 2, 3), unbiased=False, keepdim=True).sqrt()
    return (x.double() - mean) / std


@pytest.mark.parametrize("other", ["view", "same"])
def test_bug_normalize_channels_refuses_others_sharing_memory_with_x_train(other):
    """Bug: normalize_channels modifies its tensors in place one after another, so a val split that was a view of
    the training images (``x[:2]``) or the training tensor passed again was standardised twice, silently:
    ``(((x - m) / s) - m) / s``, and the training images themselves came out wrong where they overlapped."""
    x = torch.tensor([0.0, 1.0, 2.0, 3.0]).view(4, 1, 1, 1)
    before = x.clone()
    val = x[:2] if other == "view" else x
    with pytest.raises(ValueError, match=r"others\[0\] shares memory with x_train.*clone"):
        normalize_channels(x, val)
    assert torch.equal(x, before)  # refused before anything was modified


def test_disjoint_slices_of_one_buffer_are_still_normalised_once():
    """Slices of one buffer that do not overlap (train = data[:6], val = data[6:]) are distinct tensors: each is
    standardised once with the training statistics, as the float64 reference says."""
    data = torch.arange(16.0).view(8, 2, 1, 1) ** 1.5
    ref_train, ref_val = _reference(data[:6], data[:6]), _reference(data[6:], data[:6])
    mean, std, (xt, xv) = normalize_channels(data[:6], data[6:])
    torch.testing.assert_close(xt.double(), ref_train, rtol=0, atol=1e-5)
    torch.testing.assert_close(xv.double(), ref_val, rtol=0, atol=1e-5)
    torch.testing.assert_close(data[6:].double(), ref_val, rtol=0, atol=1e-5)  # in place, in the shared buffer


@pytest.mark.parametrize("augment", [True, ["flip"], "flip"])
def test_bug_classification_augment_that_is_not_a_dict_is_named(augment):
    """Bug: ClassificationTask(data, augment=True) (or a list, a string) failed inside dict() with "'bool' object is
    not iterable" or "dictionary update sequence element #0 has length 4; 2 is required", naming no argument."""
    x = torch.rand(4, 1, 4, 4)
    y = torch.tensor([0, 1, 0, 1])
    data = ClassificationData("toy", "image", x, y, x, y, x, y, num_classes=2, input_shape=(1, 4, 4))
    with pytest.raises(TypeError, match=r"augment must be a dict .* got (bool|list|str)"):
        ClassificationTask(data, augment=augment)
    task = ClassificationTask(data, augment={"crop_padding": 1, "flip": True})  # a dict still works
    xb, yb = task.train_batch(0, torch.Generator().manual_seed(0), 3)
    assert xb.shape == (3, 1, 4, 4) and yb.shape == (3,)
