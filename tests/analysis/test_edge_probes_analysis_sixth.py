"""Edge probes of the token-geometry and spectral analysis, sixth round (float64 references from the docstrings)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffusionformer.analysis import (
    LayerCapture,
    dirichlet_energy,
    effective_rank,
    layer_reports,
    next_token_nc1,
)


def _effective_rank_reference(s: np.ndarray) -> float:
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def test_bug_effective_rank_of_singular_values_at_extreme_scales() -> None:
    """Bug: effective_rank summed the raw singular values, so float32 values of 1e37 (sum > 3.4e38) or float64 ones
    of 1e307 overflowed to inf, every p_i became 0 and the effective rank read 1 (a rank-1 matrix) instead of 6.94;
    stable_rank and energy_top_k already scaled by the largest value first."""
    base = np.arange(1.0, 9.0)
    ref = _effective_rank_reference(base)
    for scale, dtype in ((1e37, torch.float32), (1e-40, torch.float32), (1e307, torch.float64)):
        got = effective_rank(torch.tensor(base * scale, dtype=dtype))
        assert got.dtype == dtype
        assert float(got) == pytest.approx(ref, rel=1e-5), (scale, dtype)
    # batched rows of different scales; an all-zero row is still 0, ordinary values are unchanged
    s = torch.tensor([[3e37, 3e37, 3e37, 0.0], [0.0, 0.0, 0.0, 0.0], [4.0, 3.0, 2.0, 1.0]], dtype=torch.float32)
    got = effective_rank(s)
    assert got[0].item() == pytest.approx(3.0, rel=1e-6)
    assert got[1].item() == 0.0
    assert got[2].item() == pytest.approx(_effective_rank_reference(np.array([4.0, 3.0, 2.0, 1.0])), rel=1e-6)
    assert effective_rank(torch.tensor([[1.0, 1.0, 1.0, 1.0], [5.0, 0.0, 0.0, 0.0]])).tolist() == [4.0, 1.0]


def test_bug_dense_dirichlet_energy_moves_P_to_the_device_of_X() -> None:
    """Bug: a dense P on another device than the tokens (a CPU graph, tokens on an accelerator) failed inside matmul
    with torch's "Tensor on device meta is not on the expected device cpu!" naming no argument, while the sparse
    path moves edge_index and edge_weight to X's device; P is now moved too (meta tokens stand in for an accelerator)."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(2, 4, 3, generator=g, dtype=torch.float64)
    P = torch.rand(4, 4, generator=g, dtype=torch.float64) - 0.3  # not symmetric, signed, with a diagonal
    for normalized in (False, True):
        out = dirichlet_energy(X.to("meta"), P, normalized=normalized)
        assert out.device.type == "meta" and out.shape == (2,)
    # the values on one device: the explicit double sum 1/2 sum_ij P_ij ||x_i - x_j||^2 (over ||X||_F^2)
    Xn, Pn = X.numpy(), P.numpy()
    diff2 = ((Xn[:, :, None, :] - Xn[:, None, :, :]) ** 2).sum(-1)  # (B, T, T)
    energy = 0.5 * (Pn[None] * diff2).sum(axis=(1, 2))
    np.testing.assert_allclose(dirichlet_energy(X, P, normalized=False).numpy(), energy, rtol=1e-12)
    np.testing.assert_allclose(dirichlet_energy(X, P).numpy(), energy / (Xn**2).sum(axis=(1, 2)), rtol=1e-12)


def test_bug_uint8_labels_of_id_156_are_not_dropped_as_ignore_index() -> None:
    """Bug: next_token_nc1(ignore_index=-100) and the report's token-label metrics compared the labels with -100 in
    their own dtype, and for uint8 ids (bytes of a byte-level model) -100 wraps to 156: every token whose label is 156
    was silently dropped (token_nc1 2.26 instead of 5.21, a different probe); they now compare in int64."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randn(12, 3, generator=g)
    ids = torch.tensor([1, 1, 156, 156, 2, 2, 156, 1, 2, 156, 1, 2])
    ref = next_token_nc1(tokens, ids)
    assert next_token_nc1(tokens, ids.to(torch.uint8), ignore_index=-100) == pytest.approx(ref, rel=1e-12)
    assert next_token_nc1(tokens, ids.to(torch.uint8)) == pytest.approx(ref, rel=1e-12)
    # ignore_index still drops what it names
    dropped = next_token_nc1(tokens, ids.to(torch.uint8), ignore_index=156)
    keep = ids != 156
    assert dropped == pytest.approx(next_token_nc1(tokens[keep], ids[keep]), rel=1e-12)

    X = torch.randn(4, 6, 3, generator=g)
    labels = torch.tensor([[1, 156, 1, 156, 2, 2]] * 4)
    want = layer_reports(LayerCapture({0: X}, labels=labels))[0].metrics
    got = layer_reports(LayerCapture({0: X}, labels=labels.to(torch.uint8)))[0].metrics
    for key in ("token_nc1", "token_probe_acc"):
        assert got[key] == pytest.approx(want[key], rel=1e-12), key


def test_bug_uint8_token_and_node_labels_are_padded_with_ignore_index():
    """Bug: capture_dataset padded per-token (and per-node) labels with -100 in the labels' own dtype: uint8 labels
    (byte ids) of sequences of unequal lengths failed in torch ("cannot be converted to type uint8_t without
    overflow"); now they are read as int64 ids, equal to the int64 capture."""
    from diffusionformer.analysis import capture_dataset
    from diffusionformer.models import DiffusionGPT, GPTConfig

    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=300, block_size=8, n_layer=1, n_head=2, n_embd=16))
    x1, x2 = torch.randint(0, 300, (2, 6)), torch.randint(0, 300, (2, 4))
    y1 = torch.tensor([[156, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 255]])
    y2 = torch.tensor([[156, 2, 3, 4], [5, 6, 7, 0]])
    wide = capture_dataset(model, [(x1, y1), (x2, y2)])
    narrow = capture_dataset(model, [(x1, y1.to(torch.uint8)), (x2, y2.to(torch.uint8))])
    assert narrow.labels.dtype == torch.int64 and torch.equal(narrow.labels, wide.labels)
    assert narrow.labels[2:, 4:].eq(-100).all() and narrow.labels[0, 0] == 156
