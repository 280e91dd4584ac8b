"""Edge probes, ninth pass: splits helpers (index_to_mask, seeded_subset, per_class_split, normalize_channels)."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.data.splits import index_to_mask, normalize_channels, per_class_split, seeded_subset


def test_bug_index_to_mask_negative_index():
    """Bug: a negative index wrapped around silently (index -1 marked the last node of the mask)."""
    with pytest.raises(ValueError, match=r"index_to_mask: index values must lie in \[0, 4\), got -1"):
        index_to_mask(torch.tensor([0, -1]), 4)
    assert index_to_mask(torch.tensor([0, 3]), 4).tolist() == [True, False, False, True]
    assert index_to_mask(torch.tensor([], dtype=torch.long), 3).tolist() == [False, False, False]


def test_bug_seeded_subset_float_n():
    """Bug: a float ``n`` with ``limit=None`` returned ``arange(n)`` as float "indices" (11 of them for n=10.5),
    and a negative ``n`` was torch's bare "upper bound and lower bound inconsistent" error."""
    with pytest.raises(TypeError, match="n must be an int, got 10.5"):
        seeded_subset(10.5, None, seed=0)
    with pytest.raises(ValueError, match="n must be >= 0, got -5"):
        seeded_subset(-5, None, seed=0)
    assert seeded_subset(4, None, seed=0).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("bad", [True, "0.5", None])
def test_bug_per_class_split_fraction_type(bad):
    """Bug: ``val_fraction_of_rest=True`` was read as 1.0 (every remaining node in val, an empty test part) and
    ``"0.5"`` was a bare "'<=' not supported" TypeError; split_sizes refuses both by name."""
    with pytest.raises(ValueError, match=r"val fraction must be in \[0, 1\] \(a number\)"):
        per_class_split(torch.tensor([0, 0, 1, 1]), 1, bad, seed=0)


def _make_expanded():
    return torch.rand(1, 1, 2, 2, generator=torch.Generator().manual_seed(0)).expand(3, 1, 2, 2)


def _make_grad_leaf():
    return torch.rand(3, 1, 2, 2, generator=torch.Generator().manual_seed(0)).requires_grad_()


def _make_inference():
    with torch.inference_mode():
        return torch.ones(3, 1, 2, 2)


@pytest.mark.parametrize("make, why", [
    (_make_expanded, "share memory"), (_make_grad_leaf, "requires grad"), (_make_inference, "inference tensor")])
def test_bug_normalize_channels_unwritable_other(make, why):
    """Bug: an ``others`` tensor that cannot be modified in place (an expanded view, a leaf requiring grad, an
    inference tensor) failed only at its own ``sub_``, after ``x_train`` had already been standardised in place:
    the caller's training images were changed and the call raised."""
    x = torch.arange(8.0).view(2, 1, 2, 2)
    before = x.clone()
    with pytest.raises(ValueError, match=rf"others\[0\] cannot be normalised in place: .*{why}.*nothing was modified"):
        normalize_channels(x, make())
    assert torch.equal(x, before)


def test_normalize_channels_accepts_strided_views():
    """Permuted and sliced (non-contiguous but non-overlapping) tensors are still normalised."""
    base = torch.arange(48.0).view(2, 2, 3, 4)
    x = base.permute(0, 1, 3, 2)  # (2, 2, 4, 3), strides out of order
    other = torch.arange(96.0).view(4, 2, 3, 4)[::2]  # every other example
    ref_x, ref_o = x.clone(), other.clone()
    mean, std, (xn, on) = normalize_channels(x, other)
    m = torch.tensor(mean).view(1, 2, 1, 1).float()
    s = torch.tensor(std).view(1, 2, 1, 1).float()
    assert torch.allclose(xn, (ref_x - m) / s) and torch.allclose(on, (ref_o - m) / s)
