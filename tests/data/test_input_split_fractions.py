"""Split fractions that leave val or test empty are refused when the data loads.

An empty val or test part used to load fine and end the run with a ZeroDivisionError at its
first evaluation, after steps had trained.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.data import load_dataset
from diffusionformer.data.splits import require_heldout, stratified_split

pytest.importorskip("sklearn", reason="the digits dataset comes with scikit-learn")


@pytest.mark.parametrize("option, part", [("val_fraction", "val"), ("test_fraction", "test")])
def test_digits_refuses_a_zero_fraction_naming_the_option(option, part):
    with pytest.raises(ValueError, match=rf"digits: {option}=0\.0 leaves the {part} split empty \(0 of 1797 "
                                         rf"examples\).*use a larger {option}"):
        load_dataset("digits", **{option: 0.0})


def test_digits_refuses_a_fraction_too_small_for_one_example():
    # 0.002 of each class (about 180 digits) rounds to no example at all
    with pytest.raises(ValueError, match=r"digits: test_fraction=0\.002 leaves the test split empty"):
        load_dataset("digits", test_fraction=0.002)
    data = load_dataset("digits", val_fraction=0.003, test_fraction=0.2, normalize=False)  # 1 of each class
    assert data.meta["sizes"]["val"] == 10


def test_require_heldout_checks_the_parts_it_is_given():
    y = torch.tensor([0] * 5 + [1] * 5)
    require_heldout("toy", stratified_split(y, 0.2, 0.2, seed=0), 0.2, 0.2)
    with pytest.raises(ValueError, match=r"toy: test_fraction=0\.0 leaves the test split empty \(0 of 10"):
        require_heldout("toy", stratified_split(y, 0.2, 0.0, seed=0), 0.2, 0.0)
    # stratified_split itself still allows an empty part (the k-fold split asks for no test share)
    assert stratified_split(y, 0.2, 0.0, seed=0)[2].numel() == 0


@pytest.mark.parametrize("name, option, kwargs", [
    ("csbm", "val_fraction", {"num_nodes": 60, "val_fraction": 0.0}),
    ("csbm", "test_fraction", {"num_nodes": 60, "test_fraction": 0.0}),
    ("assoc-recall", "val_fraction", {"num_examples": 50, "val_fraction": 0.0}),
    ("assoc-recall", "test_fraction", {"num_examples": 50, "test_fraction": 0.001}),
])
def test_the_synthetic_loaders_refuse_an_empty_heldout_part(name, option, kwargs):
    with pytest.raises(ValueError, match=rf"{option}=\S+ leaves the (val|test) split empty"):
        load_dataset(name, **kwargs)
