"""Vision / self-supervised researcher's probes (helper 55h): ViT, DINO, augmentations and image loaders at small
sizes on CPU, compared with independent references where one exists."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.data import load_dataset


@pytest.mark.parametrize("limit_test", [None, 6])
def test_bug_cifar_zip_test_split_is_not_class_sorted(tmp_path, cache, data_writers, limit_test):
    """The JPEG archives list the test images class by class (the staged test.zip: 1,000 airplanes first), and the
    loader kept that order, where the official test_batch is shuffled: any prefix of x_test (DINOTask's k-NN test
    accuracy under eval_steps reads the first eval_steps * eval_batch_size images) held the first class only."""
    root = tmp_path / "root"
    for split in ("train", "test"):
        data_writers.write_image_zip(root / "cifar10_jpg" / f"{split}.zip", split, per_class=8)
    data = load_dataset("cifar10", root=root, verify=False, normalize=False, limit_test=limit_test)
    y = data.y_test
    assert not torch.equal(y, y.sort().values), f"test labels in class order: {y.tolist()}"
    again = load_dataset("cifar10", root=root, verify=False, normalize=False, limit_test=limit_test)
    assert torch.equal(again.y_test, y) and torch.equal(again.x_test, data.x_test)  # seeded: the same order
    # the images still carry their own labels (the classes are solid colours: red cat, blue airplane, green dog)
    colour = data.x_test.mean(dim=(2, 3)).argmax(dim=1)  # 0 red, 1 green, 2 blue
    assert torch.equal(colour, torch.tensor([2, 0, 1])[y])


@pytest.mark.parametrize("images, error, match", [
    ([[[[0.0]]]], TypeError, r"MultiCropAugment expects images as a tensor \(B, C, H, W\), got list"),
    (torch.zeros(2, 8, 8), ValueError, r"MultiCropAugment expects images \(B, C, H, W\), got \(2, 8, 8\)"),
])
def test_bug_multicrop_call_names_the_images_it_was_given(images, error, match):
    """``aug(images, generator)``: a list was an AttributeError on ``.shape``, and images without a batch dimension
    were refused as "image_shape must be (C, H, W)", an argument of sample() the caller never passed."""
    from diffusionformer.data.augment import MultiCropAugment

    with pytest.raises(error, match=match):
        MultiCropAugment()(images, torch.Generator().manual_seed(0))
