"""Edge-case probes of the analysis package, third round (metrics, spectral, capture).

Each ``Bug:`` test pins a defect a user met (the docstring says what they saw); ``Pins:`` tests fix legal edge
cases that already work, checked against independent float64 references (numpy, explicit formulas).
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

from diffusionformer.analysis import (
    capture_dataset,
    dirichlet_energy,
    frequency_response,
    high_frequency_ratio,
    mean_pairwise_cosine,
    pca_token_rgb,
    rank_collapse_residual,
    variance_ratio,
)
from diffusionformer.models import DiffusionViT, ViTConfig


def _tokens() -> torch.Tensor:
    return torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def _references(X: np.ndarray, P: np.ndarray) -> dict[str, np.ndarray]:
    """Float64 definitions: explicit pairwise sums and numpy SVDs, one sequence at a time."""
    mu = X.reshape(-1, X.shape[-1]).mean(0)
    out: dict[str, list[float]] = {k: [] for k in ("ratio", "hfr", "svd", "cos", "uniform", "dense")}
    for x in X:
        T = len(x)
        xc = x - x.mean(0)
        out["ratio"].append((xc**2).sum() / ((x - mu) ** 2).sum())
        out["hfr"].append(np.linalg.norm(xc) / np.linalg.norm(x))
        s = np.linalg.svd(x, compute_uv=False)
        out["svd"].append(np.sqrt((s[1:] ** 2).sum() / (s**2).sum()))
        u = x / np.linalg.norm(x, axis=1, keepdims=True)
        g = u @ u.T
        out["cos"].append((g.sum() - np.trace(g)) / (T * (T - 1)))
        d2 = ((x[:, None] - x[None]) ** 2).sum(-1)
        out["uniform"].append(0.5 * (d2 / T).sum() / (x**2).sum())
        out["dense"].append(0.5 * (P * d2).sum() / (x**2).sum())
    return {k: np.array(v) for k, v in out.items()}


@pytest.mark.parametrize("scale", [1e20, 1e-22, 1e-30])
def test_bug_scale_free_metrics_of_float32_tokens_at_extreme_scales(scale: float) -> None:
    """Bug: the scale-free token metrics squared float32 tokens first, so finite tokens of magnitude 1e20 gave NaN
    (inf / inf) for variance_ratio, high_frequency_ratio, rank_collapse_residual(svd) and the normalised
    dirichlet_energy (dense, uniform and sparse), and mean_pairwise_cosine 0 (a token norm of inf); tokens of
    magnitude 1e-22 gave variance_ratio 1 and 1e-30 gave 0 everywhere (the squares underflowed), though each of these
    is a ratio that the scale of the tokens does not change."""
    X64 = _tokens()
    P = torch.softmax(torch.randn(5, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64), -1)
    ref = _references(X64.numpy(), P.numpy())
    X = (X64 * scale).float()
    tol = dict(rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(variance_ratio(X).double().numpy(), ref["ratio"], **tol)
    np.testing.assert_allclose(high_frequency_ratio(X).double().numpy(), ref["hfr"], **tol)
    np.testing.assert_allclose(rank_collapse_residual(X, "svd").double().numpy(), ref["svd"], **tol)
    np.testing.assert_allclose(dirichlet_energy(X).double().numpy(), ref["uniform"], **tol)
    np.testing.assert_allclose(dirichlet_energy(X, P.float()).double().numpy(), ref["dense"], **tol)
    T = 5
    full = torch.ones(T, T).nonzero().T  # complete graph with self loops, weights 1/T: the uniform energy
    ei = torch.cat([full, full + T], dim=1)
    got = dirichlet_energy(X, edge_index=ei, edge_weight=torch.full((ei.shape[1],), 1 / T))
    np.testing.assert_allclose(got.double().numpy(), ref["uniform"], **tol)
    if scale > 1:  # tiny tokens fall under eps = 1e-12 by design (cosine 0); big ones must not
        np.testing.assert_allclose(mean_pairwise_cosine(X).double().numpy(), ref["cos"], **tol)
    np.testing.assert_allclose(mean_pairwise_cosine(X, eps=1e-40).double().numpy(), ref["cos"], **tol)


def test_mean_pairwise_cosine_still_treats_tokens_below_eps_as_zero() -> None:
    """Pins: a token of norm below eps has cosine 0 with the others (the pairs still count in the mean)."""
    X = torch.tensor([[[1.0, 0.0], [2.0, 0.0], [1e-13, 0.0]]])
    assert float(mean_pairwise_cosine(X)) == pytest.approx(2 / 6)
    assert float(mean_pairwise_cosine(X, eps=1e-14)) == pytest.approx(1.0)


@pytest.mark.parametrize("scale", [1e20, 1e-30])
def test_bug_pca_token_rgb_of_float32_tokens_at_extreme_scales(scale: float) -> None:
    """Bug: pca_token_rgb formed Z^T Z of the float32 tokens, so tokens of magnitude 1e20 died with
    'linalg.eigh: The algorithm failed to converge' (an inf Gram matrix), and tokens of magnitude 1e-30 gave a
    different image (the Gram matrix underflowed), though the min-max scaled map does not depend on the scale."""
    X = _tokens()[:, :4]
    ref = pca_token_rgb(X, (2, 2))
    np.testing.assert_allclose(pca_token_rgb((X * scale).float(), (2, 2)).double().numpy(), ref.numpy(), atol=1e-4)


def test_bug_sparse_dirichlet_energy_of_batched_tokens_checks_num_graphs() -> None:
    """Bug: dirichlet_energy(X of shape (B, T, D), edge_index=..., num_graphs=5) ignored num_graphs and returned B
    energies, while for X (N, D) a num_graphs that does not fit is refused."""
    X = torch.randn(2, 3, 4)
    ei = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match=r"num_graphs must be None or B = 2 .*got 5"):
        dirichlet_energy(X, edge_index=ei, num_graphs=5)
    assert torch.equal(dirichlet_energy(X, edge_index=ei, num_graphs=2), dirichlet_energy(X, edge_index=ei))


def test_bug_frequency_response_refuses_nan_coefficients_and_points() -> None:
    """Bug: frequency_response with a NaN coefficient or a NaN point returned tensor([nan]) silently, while every
    other function of the analysis names a NaN input."""
    with pytest.raises(ValueError, match="coeffs holds NaN or inf values"):
        frequency_response(torch.tensor([float("nan"), 1.0]), torch.tensor([0.5]))
    with pytest.raises(ValueError, match="lambdas holds NaN or inf values"):
        frequency_response(torch.tensor([1.0, -1.0]), torch.tensor([complex(float("nan"), 0.0)]))
    assert frequency_response(torch.tensor([1, -1]), torch.tensor([0.25])).item() == 0.75  # integer coefficients


def test_bug_capture_of_a_ddp_wrapped_model() -> None:
    """Bug: capture_dataset(DistributedDataParallel(vit), ...) (the model as the trainer holds it) was refused with
    'got DistributedDataParallel with no attribute `blocks`'; the hooks now go on the wrapped model's blocks and the
    capture equals that of the bare model."""
    dist = torch.distributed
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group of the caller")
    torch.manual_seed(0)
    vit = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, dim=8, depth=2, num_heads=2))
    x = torch.randn(3, 1, 8, 8)
    ref = capture_dataset(vit, [x], attentions=True)
    # an in-memory store: no port (another test process may hold any free port found) and no environment variables
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(vit)
        vit.train()
        got = capture_dataset(ddp, [x], attentions=True)
    finally:
        dist.destroy_process_group()
    assert got.layers == ref.layers
    for layer in ref.layers:
        torch.testing.assert_close(got.states[layer], ref.states[layer])
    torch.testing.assert_close(got.attentions[1], ref.attentions[1])
    assert vit.training and all(m.training for m in vit.modules())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in vit.modules())


def test_scale_free_metrics_keep_their_gradient() -> None:
    """Pins: the exact power-of-two rescaling of the scale-free metrics passes the gradient (torch.ldexp(x, e) itself
    gives x a zero gradient), checked by finite differences in float64."""
    X = torch.randn(2, 4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2), requires_grad=True)
    P = torch.softmax(torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3)), -1)
    ei = torch.tensor([[0, 1, 2, 5, 6], [1, 2, 0, 6, 7]])
    assert torch.autograd.gradcheck(
        lambda x: (dirichlet_energy(x), dirichlet_energy(x, P), dirichlet_energy(x, edge_index=ei),
                   high_frequency_ratio(x), mean_pairwise_cosine(x), variance_ratio(x), rank_collapse_residual(x, "svd"),
                   pca_token_rgb(x, (2, 2))), (X,))
