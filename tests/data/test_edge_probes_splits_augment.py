"""Edge probes of the splits (k-fold, seeds) and the image augmentations (probe round)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from diffusionformer.data import load_dataset
from diffusionformer.data.augment import MultiCropAugment, random_crop_flip, resample_crops
from diffusionformer.data.splits import generator, stratified_kfold_split


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**64, np.int64(-1)])
def test_bug_split_seed_outside_the_generator_range_is_named(seed):
    """Bug: ``generator(-1)`` (every split, ``load_dataset(..., seed=-1)``) silently gave the data of seed
    ``2**64 - 1`` (torch wraps negative seeds), and ``seed=2**64`` failed with torch's "Overflow when unpacking long
    long", naming no argument."""
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*64 - 1\].*got -?\d+"):
        generator(seed)
    with pytest.raises(ValueError, match="seed must be an int in"):
        load_dataset("assoc-recall", num_examples=20, num_pairs=2, vocab_size=8, seed=seed)


def test_split_seeds_at_the_ends_of_the_range_and_numpy_ints_still_work():
    top = torch.randint(100, (4,), generator=generator(2**64 - 1))
    assert torch.equal(top, torch.randint(100, (4,), generator=generator(np.uint64(2**64 - 1))))
    assert torch.equal(torch.randint(100, (4,), generator=generator(0)),
                       torch.randint(100, (4,), generator=generator(np.int32(0))))


@pytest.mark.parametrize("call", [
    lambda x: random_crop_flip(x, torch.Generator().manual_seed(0)),
    lambda x: resample_crops(x, torch.zeros(1, 2, 3)),
    lambda x: MultiCropAugment()(x, torch.Generator().manual_seed(0)),
])
def test_bug_augmentations_name_images_that_are_not_a_tensor(call):
    """Bug: a numpy batch of images crashed ``random_crop_flip``, ``resample_crops`` and ``MultiCropAugment.apply``
    with "AttributeError: 'numpy.ndarray' object has no attribute 'dim'" instead of naming the type."""
    with pytest.raises(TypeError, match=r"expects images as a tensor .*got ndarray \(convert with torch.as_tensor\)"):
        call(np.zeros((1, 1, 4, 4), dtype=np.float32))


def test_kfold_with_odd_labels_and_dtypes_matches_sklearn_counts_and_val_shares():
    """Negative, non-contiguous and huge labels in int8/int64/bool, classes smaller than the fold count: every
    fold's count of each class is the one sklearn's StratifiedKFold gives (floor or ceil of n_c / K, as a multiset),
    the test folds tile range(N), and val holds floor(f n_rest + 1/2) of each class of the other folds."""
    skl = pytest.importorskip("sklearn.model_selection")
    rng = np.random.default_rng(0)
    cases = [
        torch.tensor([-7, -7, -7, 3, 3, 100, 100, 100, 100, 100, 0], dtype=torch.int8),
        torch.as_tensor(rng.choice([-(2**40), 5, 2**40], size=23)),
        torch.tensor([True, False, False, True, True, False, True]),
        torch.tensor([9] * 9 + [4]),  # a class of one item, fewer members than folds
    ]
    for y in cases:
        n, K, vf = y.numel(), 3, 0.25
        tests = []
        for k in range(K):
            tr, va, te = stratified_kfold_split(y, K, k, vf, seed=5)
            assert sorted(torch.cat([tr, va, te]).tolist()) == list(range(n))
            assert tr.dtype == va.dtype == te.dtype == torch.long
            tests.append(te)
            for c in torch.unique(y).tolist():
                rest = int((y == c).sum() - (y[te] == c).sum())
                assert int((y[va] == c).sum()) == math.floor(vf * rest + 0.5), (y, k, c)
        assert sorted(torch.cat(tests).tolist()) == list(range(n))
        y_np = y.long().numpy()
        ref = [te for _, te in skl.StratifiedKFold(K, shuffle=True, random_state=0).split(np.zeros(n), y_np)] \
            if min(np.unique(y_np, return_counts=True)[1]) >= K else None
        for c in torch.unique(y).tolist():
            ours = sorted(int((y[t] == c).sum()) for t in tests)
            nc = int((y == c).sum())
            assert ours == sorted([nc // K + (i < nc % K) for i in range(K)]), (y, c, ours)
            if ref is not None:  # sklearn warns (and still deals) when a class is smaller than K
                assert ours == sorted(int((y_np[t] == int(c)).sum()) for t in ref)
