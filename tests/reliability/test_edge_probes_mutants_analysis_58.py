"""Tests from a mutation audit of ``analysis/report.py``, ``analysis/spectral.py`` and ``data/idx.py``.

Each test kills a mutant that every test covering these modules let through; its docstring names the mutant
(file and mutation) and checks the code against an independent reference: spectra built by hand, least squares
in float64 NumPy. Mutants judged equivalent are listed, with the reason, at the end of the file. CPU only,
deterministic, no files.
"""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from diffusionformer.analysis import LayerCapture, layer_reports, pca_token_rgb, register_metric, unregister_metric
from diffusionformer.data import CorruptDataError
from diffusionformer.data.idx import IDX_LABELS_MAGIC, read_idx, read_idx_bytes


def _tokens_with_spectrum(s: list[float]) -> torch.Tensor:
    """One sequence of ``2 R`` tokens ``+s_j e_j`` and ``-s_j e_j`` in ``R`` dims: mean 0, so its centred
    singular values are exactly ``sqrt(2) s_j``."""
    R = len(s)
    rows = [sign * s_j * np.eye(R)[j] for j, s_j in enumerate(s) for sign in (1.0, -1.0)]
    return torch.tensor(np.stack(rows), dtype=torch.float64).unsqueeze(0)  # (1, 2R, R)


def _alpha_by_numpy(s: np.ndarray) -> float:
    """``alpha`` of ``log s_i^2 ~ beta - alpha log i`` by NumPy's least squares, over all of ``s`` (descending)."""
    i = np.arange(1, len(s) + 1, dtype=np.float64)
    slope, _ = np.polyfit(np.log(i), np.log(s.astype(np.float64) ** 2), 1)
    return -float(slope)


def test_power_law_alpha_fits_every_rank_above_1e_6_of_the_largest():
    """Mutant report.py ``_RANK_RTOL = 1e-6`` -> ``1e-3``: the module docstring says the exponent is fitted over the
    ranks above ``1e-6`` of the largest singular value; singular values at 1e-4 and 1e-5 of it are in the fit."""
    s = [1.0, 1e-2, 1e-4, 1e-5]
    rep = layer_reports(LayerCapture({0: _tokens_with_spectrum(s)}))[0]
    np.testing.assert_allclose(rep.singular_values.numpy(), np.sqrt(2) * np.array(s), rtol=1e-5)
    assert rep.metrics["power_law_alpha"] == pytest.approx(_alpha_by_numpy(np.array(s)), rel=1e-9)
    # below 1e-6 of s_1 a singular value is left out of the fit (and a fit of fewer than 3 ranks is None)
    rep = layer_reports(LayerCapture({0: _tokens_with_spectrum([1.0, 1e-2, 1e-4, 1e-7])}))[0]
    assert rep.metrics["power_law_alpha"] == pytest.approx(_alpha_by_numpy(np.array([1.0, 1e-2, 1e-4])), rel=1e-9)
    assert layer_reports(LayerCapture({0: _tokens_with_spectrum([1.0, 1e-2, 1e-7])}))[0].metrics[
        "power_law_alpha"] is None


def test_pca_token_rgb_uses_the_matrix_rank_tolerance_of_the_larger_dimension():
    """Mutant spectral.py ``S[:q] > max(B * T, D) * eps * S[:1]`` -> ``min(B * T, D)``: the docstring fixes the
    numerical rank by ``torch.linalg.matrix_rank``'s tolerance, ``max(m, n) eps s_1``. 1000 tokens in 3 dims whose
    third singular value is 1e-14 s_1 (above ``3 eps s_1``, below ``1000 eps s_1``) have numerical rank 2 (NumPy's
    ``matrix_rank`` uses the same rule): their third channel is 0, not rounding noise stretched to [0, 1]."""
    g = np.random.default_rng(0)
    half = np.linalg.qr(g.standard_normal((500, 3)))[0] * np.array([1.0, 0.3, 1e-14])  # orthogonal columns
    Z = np.concatenate([half, -half])  # mean exactly 0: the centred tokens are Z itself
    assert np.linalg.matrix_rank(Z) == 2
    rgb = pca_token_rgb(torch.tensor(Z).unsqueeze(0), (25, 40))
    assert rgb.shape == (1, 3, 25, 40)
    assert torch.equal(rgb[0, 2], torch.zeros(25, 40, dtype=torch.float64))
    for c in (0, 1):  # the two real components span the full range
        assert float(rgb[0, c].min()) == 0.0 and float(rgb[0, c].max()) == 1.0


@pytest.mark.parametrize("gzipped", [False, True])
def test_read_idx_of_a_file_cut_inside_its_magic_number_is_corrupt(tmp_path, gzipped):
    """Mutant idx.py ``_read_declared``: ``len(head) < 4`` -> ``len(head) < 3``: a file of the 3 bytes
    ``00 00 08`` (an IDX magic number cut before its ``ndim`` byte; the format needs 4) is a CorruptDataError
    naming the file, not an IndexError from reading the missing ``ndim`` byte."""
    path = tmp_path / ("cut-idx1-ubyte.gz" if gzipped else "cut-idx1-ubyte")
    raw = bytes([0x00, 0x00, 0x08])
    path.write_bytes(gzip.compress(raw) if gzipped else raw)
    assert read_idx_bytes(path) == raw
    with pytest.raises(CorruptDataError, match=r"cut-idx1-ubyte.*not an IDX file \(only 3 bytes\)"):
        read_idx(path, expected_magic=IDX_LABELS_MAGIC)


def test_a_registered_metric_sees_a_numpy_probe_seed_as_a_python_int():
    """Mutant report.py ``layer_reports``: ``probe_seed = int(probe_seed)`` dropped: the built-in probes convert the
    seed again, but ``LayerView.probe_seed`` (an ``int``) is what a registered metric reads, and
    ``torch.Generator.manual_seed`` refuses a NumPy integer."""
    seen = []

    @register_metric("probe58b_seeded", group="smoothing")
    def _seeded(view):
        seen.append(view.probe_seed)
        return float(torch.rand((), generator=torch.Generator().manual_seed(view.probe_seed)))

    try:
        X = torch.arange(12.0, dtype=torch.float64).reshape(2, 3, 2)
        value = layer_reports(LayerCapture({0: X}), probe_seed=np.int64(7))[0].metrics["probe58b_seeded"]
    finally:
        unregister_metric("probe58b_seeded")
    assert type(seen[0]) is int and seen == [7]
    assert value == float(torch.rand((), generator=torch.Generator().manual_seed(7)))


# Mutants judged equivalent (no test can tell them apart beyond rounding):
# - spectral.py power_law_exponent: ``log_s2 - log_s2.mean(...)`` dropped: ``log_i`` is centred, so
#   ``sum_i log_i (log_s2 - m) = sum_i log_i log_s2``.
# - spectral.py power_law_exponent: ``.sum()`` -> ``.mean()`` in numerator and denominator: the same ``n`` cancels.
# - spectral.py token_singular_values: ``amax(dim=(1, 2))`` -> ``amax(dim=2).amax(dim=1)``: the same maximum.
# - report.py _spectrum_summary: ``s[0] > 0`` -> ``s[0] >= 0``: for ``s[0] == 0`` no rank passes ``s > rtol s[0]``,
#   so ``r = 0 < 3`` and the exponent stays None.
# - idx.py parse_idx: ``(magic >> 8) & 0xFF`` -> ``magic >> 8``: the magic is refused unless ``magic >> 16 == 0``.
