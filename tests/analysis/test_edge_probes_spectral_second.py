"""Edge probes (second pass) of ``analysis.spectral``: PCA token maps of fewer tokens than colour channels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffusionformer.analysis import pca_token_rgb


@pytest.mark.parametrize("shape, grid", [((1, 2, 5), (1, 2)), ((1, 1, 5), (1, 1)), ((2, 1, 4), (1, 1)),
                                         ((1, 2, 2), (2, 1))])
def test_bug_pca_token_rgb_of_fewer_than_three_tokens(shape: tuple[int, int, int], grid: tuple[int, int]) -> None:
    """Bug: pca_token_rgb with fewer than 3 tokens in the batch (B T < 3) but D >= 3 died with "RuntimeError: shape
    '[1, 1, 2, 3]' is invalid for input of size 4": the SVD gives only min(B T, D) components, but the missing
    channels were padded for D < 3 only. Now the missing channels are 0, as for D < 3."""
    X = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    rgb = pca_token_rgb(X, grid)
    B, T, D = shape
    assert rgb.shape == (B, 3, *grid)
    Z = X.reshape(B * T, D).numpy()
    Z = Z - Z.mean(axis=0)
    if B * T == 2:  # rank 1 after centring: channel 0 is 0 and 1 (min-max), the others 0
        _, _, Vt = np.linalg.svd(Z, full_matrices=False)
        v = Vt[0] * np.sign(Vt[0][np.abs(Vt[0]).argmax()])
        p = Z @ v
        expected = (p - p.min()) / (p.max() - p.min())
        np.testing.assert_allclose(rgb[:, 0].reshape(-1).numpy(), expected, atol=1e-12)
        assert sorted(rgb[:, 0].reshape(-1).tolist()) == [0.0, 1.0]
        assert torch.equal(rgb[:, 1:], torch.zeros_like(rgb[:, 1:]))
    else:  # one token: no variation at all
        assert torch.equal(rgb, torch.zeros_like(rgb))
