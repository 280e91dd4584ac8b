"""Seeded k-fold splits: partitions, stratification, determinism, bad input."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.data.splits import stratified_kfold_split


@pytest.mark.parametrize("num_folds", [2, 3, 10])
def test_kfold_tiles_the_data_and_keeps_class_shares(num_folds):
    labels = torch.tensor([0] * 37 + [1] * 11 + [2] * 52)[torch.randperm(100, generator=torch.Generator().manual_seed(0))]
    counts = labels.bincount()
    sizes = []
    tests = []
    for k in range(num_folds):
        train, val, test = stratified_kfold_split(labels, num_folds, k, 0.1, seed=7)
        assert sorted(torch.cat([train, val, test]).tolist()) == list(range(100))
        per_class = labels[test].bincount(minlength=3)
        # each class is dealt round-robin: floor or ceil of its share per fold
        assert bool(((per_class == counts // num_folds) | (per_class == -(-counts // num_folds))).all())
        # the inner val split is stratified over the other folds only
        rest = counts - per_class
        expected_val = torch.floor(0.1 * rest.double() + 0.5).long()
        assert labels[val].bincount(minlength=3).tolist() == expected_val.tolist()
        sizes.append(test.numel())
        tests.append(test)
    assert max(sizes) - min(sizes) <= 1
    assert sorted(torch.cat(tests).tolist()) == list(range(100))


def test_kfold_is_seeded():
    y = torch.arange(40) % 4
    a = stratified_kfold_split(y, 5, 1, 0.2, seed=0)
    b = stratified_kfold_split(y, 5, 1, 0.2, seed=0)
    c = stratified_kfold_split(y, 5, 1, 0.2, seed=1)
    assert all(torch.equal(x, z) for x, z in zip(a, b))
    assert not torch.equal(a[2].sort().values, c[2].sort().values)


def test_kfold_bad_input():
    y = torch.arange(10) % 2
    with pytest.raises(ValueError, match="num_folds must be"):
        stratified_kfold_split(y, 1, 0, 0.1, seed=0)
    with pytest.raises(ValueError, match="fold must be an int in"):
        stratified_kfold_split(y, 5, -1, 0.1, seed=0)
    with pytest.raises(ValueError, match="at least 11 items"):
        stratified_kfold_split(y, 11, 0, 0.1, seed=0)
    with pytest.raises(ValueError, match="labels must be 1-D"):
        stratified_kfold_split(y.view(2, 5), 2, 0, 0.1, seed=0)
    with pytest.raises(ValueError, match="val_fraction"):
        stratified_kfold_split(y, 2, 0, 1.0, seed=0)
