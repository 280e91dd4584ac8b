"""Edge-case probes of the analysis package, second round (metrics, spectral, capture, report, plots).

Each ``Bug:`` test pins a defect a user met (the docstring says what they saw); ``Pins:`` tests fix legal edge
cases that already work, checked against independent float64 references (numpy, explicit formulas).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from diffusionformer.analysis import (
    LayerCapture,
    LayerRecorder,
    capture_dataset,
    dirichlet_energy,
    eigenvalues_of,
    effective_rank,
    energy_top_k,
    frequency_response,
    high_frequency_ratio,
    layer_reports,
    linear_probe_accuracy,
    mean_pairwise_cosine,
    neural_collapse,
    next_token_nc1,
    pca_token_rgb,
    power_law_exponent,
    rank_collapse_residual,
    register_metric,
    stable_rank,
    token_singular_values,
    variance_ratio,
    within_sequence_variance,
)
from diffusionformer.models import DiffusionViT, ViTConfig


def _vit() -> DiffusionViT:
    torch.manual_seed(0)
    return DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, dim=8, depth=2, num_heads=2))


def _no_hooks(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def _pairwise_energy(x: np.ndarray, p: np.ndarray) -> float:
    """``1/2 sum_ij P_ij ||x_i - x_j||^2`` by explicit pairwise differences, float64."""
    diff = x[:, None, :] - x[None, :, :]
    return 0.5 * float((p * (diff**2).sum(-1)).sum())


def _cosine_ref(x: np.ndarray) -> float:
    T = len(x)
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    g = u @ u.T
    return float((g.sum() - np.trace(g)) / (T * (T - 1)))


# ---------------------------------------------------------------------------------------------- metrics


def test_bug_dirichlet_energy_of_self_loops_is_not_negative() -> None:
    """Bug: dirichlet_energy(X, P) with P = I (a head attending only to itself) returned a negative energy in float32
    (tensor([0., -0.0156, 0., 0.]) for tokens of scale 10; -2.9e-11 in float64), though E = 1/2 sum P_ij ||x_i -
    x_j||^2 >= 0 and a self loop has no difference: the diagonal entered both cancelling terms of the dense formula.
    Near-diagonal P lost 4 digits in float32 for the same reason."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(4, 64, 32, generator=g) * 10 + 100
    eye = torch.eye(64)
    assert torch.equal(dirichlet_energy(X, eye, normalized=False), torch.zeros(4))
    assert torch.equal(dirichlet_energy(X.double(), eye.double(), normalized=False), torch.zeros(4, dtype=torch.float64))
    near = 0.999 * eye + 0.001 / 64  # a near-diagonal head: float32 within 1e-6 of the float64 pairwise reference
    ref = [_pairwise_energy(x, near.double().numpy()) for x in X.double().numpy()]
    np.testing.assert_allclose(dirichlet_energy(X, near, normalized=False).numpy(), ref, rtol=1e-6)
    # a batched (B, T, T) P with a heavy diagonal, and a signed P (not row-stochastic): the same pairwise reference
    P = torch.rand(4, 64, 64, generator=g, dtype=torch.float64) * 1e-3 + torch.eye(64, dtype=torch.float64)
    P[0] -= 0.5e-3
    ref = [_pairwise_energy(x, p) for x, p in zip(X.double().numpy(), P.numpy())]
    np.testing.assert_allclose(dirichlet_energy(X.double(), P, normalized=False).numpy(), ref, rtol=1e-10)


def test_bug_sparse_dirichlet_energy_refuses_nan_edge_weights() -> None:
    """Bug: dirichlet_energy(X, edge_index=..., edge_weight=w) with a NaN or inf in w returned tensor([nan]), while a
    dense P with NaN is refused with 'P holds NaN or inf values'; complex weights were cast to real with a warning."""
    X = torch.randn(4, 2)
    ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="edge_weight holds NaN or inf values"):
            dirichlet_energy(X, edge_index=ei, edge_weight=torch.tensor([1.0, bad, 1.0]))
    with pytest.raises(TypeError, match="edge_weight must be real, got dtype torch.complex64"):
        dirichlet_energy(X, edge_index=ei, edge_weight=torch.ones(3, dtype=torch.complex64))
    # integer weights are still weights
    w = torch.tensor([1, 2, 3])
    Xd = X.double().numpy()
    ref = 0.5 * sum(int(w[k]) * ((Xd[ei[0, k]] - Xd[ei[1, k]]) ** 2).sum() for k in range(3))
    assert dirichlet_energy(X.double(), edge_index=ei, edge_weight=w, normalized=False).item() == pytest.approx(ref)


def test_bug_flags_of_the_analysis_refuse_numpy_bools_and_strings() -> None:
    """Bug: flags were read by truthiness: token_singular_values(X, pool="no") pooled, dirichlet_energy(normalized=
    "no") normalised, capture_dataset(keep_outputs="no") kept the outputs, plot_metric_by_depth(logy="no") drew a log
    axis; numpy bools passed silently, and LayerRecorder(attentions=np.True_) said 'attentions must be a bool, got
    bool'."""
    X = torch.randn(2, 3, 4)
    with pytest.raises(TypeError, match=r"pool must be a bool, got str \('no'\)"):
        token_singular_values(X, pool="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"pool must be a bool, got numpy.bool"):
        token_singular_values(X, pool=np.bool_(False))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"normalized must be a bool, got str"):
        dirichlet_energy(X, normalized="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"normalized must be a bool, got int"):
        dirichlet_energy(torch.randn(3, 2), edge_index=torch.tensor([[0], [1]]), normalized=1)  # type: ignore[arg-type]
    vit = _vit()
    with pytest.raises(TypeError, match=r"attentions must be a bool, got numpy.bool"):
        LayerRecorder(vit, attentions=np.bool_(True))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"keep_outputs must be a bool, got str \('no'\)"):
        capture_dataset(vit, [torch.randn(2, 1, 8, 8)], keep_outputs="no")  # type: ignore[arg-type]
    assert _no_hooks(vit) and vit.training
    with pytest.raises(TypeError, match=r"logy must be a bool, got str"):
        register_metric("probe_second_unused", group="smoothing", logy="no")  # type: ignore[arg-type]
    pytest.importorskip("matplotlib")
    from diffusionformer.analysis import plot_metric_by_depth, plot_spectra

    with pytest.raises(TypeError, match=r"logy must be a bool, got str"):
        plot_metric_by_depth({"a": [1.0, 2.0]}, "v", logy="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"normalize must be a bool, got numpy.bool"):
        plot_spectra({"a": torch.tensor([2.0, 1.0])}, normalize=np.bool_(False))  # type: ignore[arg-type]
    assert plot_metric_by_depth({"a": [1.0, 2.0]}, "v", logy=False).get_yscale() == "linear"


def test_bug_unknown_choices_say_did_you_mean() -> None:
    """Bug: a misspelt choice was refused without a hint: token_singular_values(center="seq") said only 'center
    must be one of (...)', rank_collapse_residual(method="SVD") 'method must be 'mean' or 'svd'' and reduction="meen"
    'reduction must be one of (...)'."""
    X = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match=r"center must be one of .*got 'sequnce' \(did you mean 'sequence'\?\)"):
        token_singular_values(X, center="sequnce")
    with pytest.raises(ValueError, match=r"method must be one of \('mean', 'svd'\), got 'svdd' \(did you mean 'svd'\?\)"):
        rank_collapse_residual(X, method="svdd")
    with pytest.raises(ValueError, match=r"reduction must be one of .*got 'meen' \(did you mean 'mean'\?\)"):
        within_sequence_variance(X, reduction="meen")
    with pytest.raises(ValueError, match=r"reduction must be one of .*'pooled'\), got 'poled' \(did you mean 'pooled'\?\)"):
        variance_ratio(X, reduction="poled")
    with pytest.raises(ValueError, match=r"center must be one of .*got None$"):
        token_singular_values(X, center=None)  # type: ignore[arg-type]


def test_bug_linear_probe_train_fraction_and_next_token_ignore_index_are_checked() -> None:
    """Bug: linear_probe_accuracy(train_fraction="0.5") died with the bare "'<' not supported between instances of
    'float' and 'str'", and next_token_nc1(ignore_index=1.5) (or -100.0 from a float config) silently dropped nothing
    when no id equals the float."""
    feats, labels = torch.randn(12, 3), torch.arange(12) % 2
    with pytest.raises(ValueError, match=r"train_fraction must be in \(0, 1\) \(a number\), got '0.5'"):
        linear_probe_accuracy(feats, labels, train_fraction="0.5")  # type: ignore[arg-type]
    assert linear_probe_accuracy(feats, labels, train_fraction=np.float64(0.5)) == linear_probe_accuracy(
        feats, labels, train_fraction=0.5)
    tokens, nxt = torch.randn(6, 2), torch.tensor([0, 0, 1, 1, 2, 2])
    with pytest.raises(TypeError, match=r"ignore_index must be an int or None, got float \(1.5\)"):
        next_token_nc1(tokens, nxt, ignore_index=1.5)  # type: ignore[arg-type]
    assert next_token_nc1(tokens, nxt, ignore_index=np.int64(2)) == next_token_nc1(tokens[:4], nxt[:4])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_smoothing_metrics_agree_with_float64_references_on_non_contiguous_batches(dtype: torch.dtype) -> None:
    """Pins: within-sequence variance, variance ratio (per sequence and pooled), mean pairwise cosine, the
    high-frequency ratio, both rank-collapse residuals and the dense/uniform Dirichlet energies equal explicit float64
    formulas, on a non-contiguous (transposed) batch."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(6, 5, 3, generator=g, dtype=torch.float64).transpose(0, 1).to(dtype)  # (5, 6, 3), a view
    assert not X.is_contiguous()
    Xn = X.double().numpy()
    tol = dict(rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-6 if dtype == torch.float32 else 1e-13)
    within = np.array([((x - x.mean(0)) ** 2).sum() / len(x) for x in Xn])
    mu = Xn.reshape(-1, 3).mean(0)
    total = np.array([((x - mu) ** 2).sum() / len(x) for x in Xn])
    np.testing.assert_allclose(within_sequence_variance(X).double().numpy(), within, **tol)
    np.testing.assert_allclose(variance_ratio(X).double().numpy(), within / total, **tol)
    assert float(variance_ratio(X, "pooled")) == pytest.approx(within.sum() / total.sum(), rel=1e-5)
    np.testing.assert_allclose(mean_pairwise_cosine(X).double().numpy(), [_cosine_ref(x) for x in Xn], **tol)
    hfr = [np.linalg.norm(x - x.mean(0)) / np.linalg.norm(x) for x in Xn]
    np.testing.assert_allclose(high_frequency_ratio(X).double().numpy(), hfr, **tol)
    np.testing.assert_allclose(rank_collapse_residual(X, "mean").double().numpy(), hfr, **tol)
    s = [np.linalg.svd(x, compute_uv=False) for x in Xn]
    svd = [np.sqrt((v[1:] ** 2).sum() / (v**2).sum()) for v in s]
    np.testing.assert_allclose(rank_collapse_residual(X, "svd").double().numpy(), svd, **tol)
    P = torch.softmax(torch.randn(5, 6, 6, generator=g), dim=-1).to(dtype)
    ref = [_pairwise_energy(x, p) / (x**2).sum() for x, p in zip(Xn, P.double().numpy())]
    np.testing.assert_allclose(dirichlet_energy(X, P).double().numpy(), ref, **tol)
    uniform = [_pairwise_energy(x, np.full((6, 6), 1 / 6)) / (x**2).sum() for x in Xn]
    np.testing.assert_allclose(dirichlet_energy(X).double().numpy(), uniform, **tol)


def test_metrics_of_one_token_equal_tokens_and_bad_values() -> None:
    """Pins: T = 1 and all-equal tokens (zero variance) give 0, never NaN; mean_pairwise_cosine needs T >= 2;
    NaN/inf tokens and half/bf16 tokens are refused by name."""
    one = torch.randn(3, 1, 4)
    for fn in (within_sequence_variance, variance_ratio, high_frequency_ratio, dirichlet_energy):
        assert torch.equal(fn(one), torch.zeros(3))
    equal = torch.full((2, 5, 3), 2.5)
    for fn in (within_sequence_variance, variance_ratio, high_frequency_ratio, dirichlet_energy):
        assert torch.equal(fn(equal), torch.zeros(2))
    assert torch.allclose(mean_pairwise_cosine(equal), torch.ones(2))
    assert torch.equal(rank_collapse_residual(equal, "svd"), torch.zeros(2))
    with pytest.raises(ValueError, match="needs T >= 2"):
        mean_pairwise_cosine(one)
    for bad in (float("nan"), float("inf")):
        X = torch.randn(2, 3, 4)
        X[1, 2, 0] = bad
        with pytest.raises(ValueError, match="X holds NaN or inf values"):
            within_sequence_variance(X)
    for dtype in (torch.float16, torch.bfloat16):
        with pytest.raises(TypeError, match=rf"X must be float32 or float64, got {dtype}"):
            high_frequency_ratio(torch.randn(2, 3, 4).to(dtype))


def test_neural_collapse_agrees_with_a_pseudo_inverse_reference_on_unbalanced_classes() -> None:
    """Pins: NC1 = tr(S_W S_B^+)/C with S_B around the sample mean (unbalanced classes), NC2 and NC4 equal a numpy
    reference with np.linalg.pinv, for D above and below C - 1; next_token_nc1 equals NC1 of the kept classes."""
    rng = np.random.default_rng(0)

    def ref(H: np.ndarray, y: np.ndarray) -> dict[str, float]:
        cls = np.unique(y)
        K, n = len(cls), len(H)
        M = np.stack([H[y == c].mean(0) for c in cls])
        R = H - M[np.searchsorted(cls, y)]
        Mc = M - H.mean(0)
        nc1 = np.trace(R.T @ R / n @ np.linalg.pinv(Mc.T @ Mc / K, rcond=1e-10, hermitian=True)) / K
        norms = np.linalg.norm(Mc, axis=1)
        U = Mc / norms[:, None]
        G = U @ U.T
        cos = G[np.triu_indices(K, 1)]
        etf = np.eye(K) - 1 / K
        near = cls[((H[:, None] - M[None]) ** 2).sum(-1).argmin(1)]
        return dict(nc1=nc1, equinorm=norms.std() / norms.mean(), equiangularity=cos.std(),
                    max_angle=np.abs(cos + 1 / (K - 1)).mean(),
                    etf_distance=np.linalg.norm(G / np.linalg.norm(G) - etf / np.linalg.norm(etf)),
                    ncc_agreement=(near == y).mean())

    for n, D, K in [(30, 5, 3), (40, 2, 4), (12, 10, 4)]:
        y = np.concatenate([np.arange(K), rng.integers(0, K, n - K)])
        H = rng.normal(size=(n, D)) + 2 * np.eye(max(K, D))[y][:, :D]
        got = neural_collapse(torch.tensor(H), torch.tensor(y)).as_dict()
        for key, value in ref(H, y).items():
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (n, D, K, key)
    H = rng.normal(size=(60, 4))
    nxt = rng.integers(0, 5, 60)
    nxt[:3] = 7  # a class of 3, dropped by min_count=4
    keep = np.isin(nxt, [c for c in np.unique(nxt) if (nxt == c).sum() >= 4])
    assert next_token_nc1(torch.tensor(H), torch.tensor(nxt), min_count=4) == pytest.approx(
        ref(H[keep], nxt[keep])["nc1"], rel=1e-9)


def test_linear_probe_agrees_with_a_closed_form_reference_in_both_forms() -> None:
    """Pins: the ridge probe (primal n >= D and dual n < D) predicts as numpy's solve of the centred normal
    equations with lam = ridge ||X||_F^2 / D."""
    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, 40)
    mask = np.arange(40) < 30

    def ref(X: np.ndarray) -> float:
        cls = np.unique(y[mask])
        xm = X[mask].mean(0)
        Xc = X[mask] - xm
        Y = (y[mask][:, None] == cls[None]).astype(float)
        lam = 1e-3 * (Xc**2).sum() / X.shape[1]
        W = np.linalg.solve(Xc.T @ Xc + lam * np.eye(X.shape[1]), Xc.T @ (Y - Y.mean(0)))
        return float((cls[((X[~mask] - xm) @ W + Y.mean(0)).argmax(1)] == y[~mask]).mean())

    for D in (6, 60):
        X = rng.normal(size=(40, D)) + np.eye(3)[y].repeat(D, axis=1)[:, :D] * 0.5
        assert linear_probe_accuracy(torch.tensor(X), torch.tensor(y), train_mask=torch.tensor(mask)) == ref(X)


# ---------------------------------------------------------------------------------------------- spectral


def test_spectral_quantities_agree_with_numpy() -> None:
    """Pins: token singular values (three centrings, pooled or not), effective/stable rank, energy share,
    power-law exponent (numpy polyfit), PCA token maps (numpy eigh), frequency response (numpy polyval) and
    eigenvalues (numpy eigvals) of batched, non-contiguous attention maps."""
    rng = np.random.default_rng(2)
    X = rng.normal(size=(3, 6, 4))
    Xt = torch.tensor(X)
    Xc = X - X.mean(1, keepdims=True)
    np.testing.assert_allclose(token_singular_values(Xt).numpy(), np.linalg.svd(Xc.reshape(-1, 4), compute_uv=False),
                               atol=1e-12)
    np.testing.assert_allclose(token_singular_values(Xt, center="global").numpy(),
                               np.linalg.svd((X - X.reshape(-1, 4).mean(0)).reshape(-1, 4), compute_uv=False), atol=1e-12)
    np.testing.assert_allclose(token_singular_values(Xt, center="none", pool=False).numpy(),
                               np.stack([np.linalg.svd(x, compute_uv=False) for x in X]), atol=1e-12)
    s = rng.random((2, 5))
    p = s / s.sum(-1, keepdims=True)
    np.testing.assert_allclose(effective_rank(torch.tensor(s)).numpy(), np.exp(-(p * np.log(p)).sum(-1)), rtol=1e-12)
    np.testing.assert_allclose(stable_rank(torch.tensor(s)).numpy(), (s**2).sum(-1) / (s**2).max(-1), rtol=1e-12)
    ss = -np.sort(-s, axis=-1)
    np.testing.assert_allclose(energy_top_k(torch.tensor(s), 2).numpy(),
                               (ss[:, :2] ** 2).sum(-1) / (ss**2).sum(-1), rtol=1e-12)
    for start, stop in [(1, 5), (2, 4)]:
        ref = [-np.polyfit(np.log(np.arange(start, stop + 1)), np.log(r[start - 1:stop] ** 2), 1)[0] for r in ss]
        np.testing.assert_allclose(power_law_exponent(torch.tensor(s), start, stop).numpy(), ref, rtol=1e-10)
    Z = rng.normal(size=(2, 6, 5))
    Zc = Z.reshape(-1, 5) - Z.reshape(-1, 5).mean(0)
    V = np.linalg.eigh(Zc.T @ Zc)[1][:, ::-1][:, :3]
    V = V * np.sign(V[np.abs(V).argmax(0), np.arange(3)])
    proj = Zc @ V
    rgb = (proj - proj.min(0)) / (proj.max(0) - proj.min(0))
    np.testing.assert_allclose(pca_token_rgb(torch.tensor(Z), (2, 3)).numpy(),
                               rgb.reshape(2, 2, 3, 3).transpose(0, 3, 1, 2), atol=1e-10)
    c, lam = rng.normal(size=(3, 4)), rng.normal(size=7)
    np.testing.assert_allclose(frequency_response(torch.tensor(c), torch.tensor(lam)).numpy(),
                               np.stack([np.polyval(r[::-1], lam) for r in c]), rtol=1e-12)
    P = torch.softmax(torch.randn(2, 3, 5, 5, generator=torch.Generator().manual_seed(0)), -1).transpose(-1, -2)
    ev = eigenvalues_of(P).numpy()
    ref = np.linalg.eigvals(P.double().numpy())
    for i in range(2):
        for j in range(3):
            np.testing.assert_allclose(np.sort_complex(ev[i, j]), np.sort_complex(ref[i, j]), atol=1e-12)
            assert np.all(np.diff(ev[i, j].real) <= 1e-12)


# ---------------------------------------------------------------------------------------------- capture


def test_bug_empty_layer_capture_says_it_holds_no_layers() -> None:
    """Bug: LayerCapture({}).num_examples raised a bare StopIteration (a RuntimeError inside a generator), and
    lengths() and drop_prefix(1) an 'IndexError: list index out of range'."""
    cap = LayerCapture({})
    for read in (lambda: cap.num_examples, cap.lengths, lambda: cap.drop_prefix(1)):
        with pytest.raises(ValueError, match="this LayerCapture holds no layers: states is empty"):
            read()
    assert cap.drop_prefix(0) is cap and cap.hidden_states == [] and cap.embeddings is None


def test_bug_capture_of_only_zero_sequence_batches_does_not_say_empty() -> None:
    """Bug: capture_dataset over batches that all held 0 sequences said only '`batches` was empty', though it drew
    them (a loader yielding empty batches, not an empty loader)."""
    vit = _vit()
    with pytest.raises(ValueError, match=r"`batches` was empty of sequences: its 2 batch\(es\) all held 0 sequences"):
        capture_dataset(vit, [torch.randn(0, 1, 8, 8)] * 2)
    with pytest.raises(ValueError, match="`batches` was empty$"):
        capture_dataset(vit, iter([]))
    assert _no_hooks(vit)


def test_capture_removes_every_hook_when_the_forward_or_a_hook_raises() -> None:
    """Pins: an exception from the forward call, from a block's post-hook (a block returning a tuple), from the
    attention recomputation of a pre-hook, or a KeyboardInterrupt from the loader leaves no hook behind and
    restores the training mode."""
    vit = _vit()
    vit.train()

    def fails(model: nn.Module, x: torch.Tensor) -> None:
        model(x)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        capture_dataset(vit, [torch.randn(2, 1, 8, 8)], attentions=True, forward=fails)
    assert _no_hooks(vit) and vit.training

    def interrupted():  # type: ignore[no-untyped-def]
        yield torch.randn(2, 1, 8, 8)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        capture_dataset(vit, interrupted(), max_examples=10, attentions=True)
    assert _no_hooks(vit) and vit.training

    class Pair(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x, x

    class PairModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([Pair()])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.blocks[0](x)[0]

    pair = PairModel()
    with pytest.raises(TypeError, match="block 0 returned tuple"):
        capture_dataset(pair, [torch.randn(2, 3, 4)])
    assert _no_hooks(pair)

    class BadAttn(nn.Module):
        def forward(self, x: torch.Tensor, **kwargs: object) -> torch.Tensor:
            raise ValueError("attention broke")

    class Blk(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn, self.norm1 = BadAttn(), nn.Identity()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    class BlkModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([Blk()])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.blocks[0](x)

    model = BlkModel()
    with pytest.raises(ValueError, match="attention broke"):
        capture_dataset(model, [torch.randn(2, 3, 4)], attentions=True)
    assert _no_hooks(model)


def test_capture_of_a_model_without_attention() -> None:
    """Pins: blocks without attention (plain nn.Linear) are captured layer by layer; attentions=True is a TypeError
    naming the block; the report leaves dirichlet_attention undefined (None)."""
    torch.manual_seed(0)

    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(3, 3), nn.Linear(3, 3)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return x

    model = Plain()
    x = torch.randn(2, 4, 3)
    cap = capture_dataset(model, [x])
    with torch.no_grad():
        torch.testing.assert_close(cap.states[2], model(x))
    with pytest.raises(TypeError, match="block 0 is a Linear"):
        capture_dataset(model, [x], attentions=True)
    assert _no_hooks(model)
    assert all(r.metrics["dirichlet_attention"] is None for r in layer_reports(cap))


# ---------------------------------------------------------------------------------------------- report


def test_bug_layer_reports_checks_the_shapes_of_states_and_mask() -> None:
    """Bug: layer_reports on a capture with B = 0 or T = 0 said 's must be non-empty, got shape (0,)' (an argument the
    user never passed), D = 0 'cannot reshape tensor of 0 elements', layers of different B 'repeats must have the same
    size'; a float mask or one of the wrong shape died in indexing, float labels were 'y must hold integer class
    labels', and a mask that is not a prefix ([T, F, T]) silently measured the padding instead of the last token."""
    for shape in ((0, 3, 2), (2, 0, 2), (2, 3, 0)):
        with pytest.raises(ValueError, match=r"capture.states\[0\] must hold tokens of shape \(B, T, D\).*got " + re.escape(str(shape))):
            layer_reports(LayerCapture({0: torch.zeros(shape)}))
    with pytest.raises(ValueError, match=r"capture.states\[1\] has \(3, 3\) \(B, T\) but capture.states\[0\] has \(2, 3\)"):
        layer_reports(LayerCapture({0: torch.randn(2, 3, 2), 1: torch.randn(3, 3, 2)}))
    X = torch.randn(2, 3, 2)
    with pytest.raises(ValueError, match=r"capture.mask must be a bool tensor of shape \(2, 3\).*torch.float32"):
        layer_reports(LayerCapture({0: X}, mask=torch.ones(2, 3)))
    with pytest.raises(ValueError, match=r"capture.mask must be a bool tensor of shape \(2, 3\).*of shape \(2, 2\)"):
        layer_reports(LayerCapture({0: X}, mask=torch.ones(2, 2, dtype=torch.bool)))
    with pytest.raises(ValueError, match="capture.mask must mark a prefix of each row.*row 0"):
        layer_reports(LayerCapture({0: X}, mask=torch.tensor([[True, False, True], [True, True, True]])))
    with pytest.raises(TypeError, match="capture.labels must be a tensor of integer class labels, got dtype torch.float32"):
        layer_reports(LayerCapture({0: torch.randn(4, 3, 2)}, labels=torch.tensor([0.0, 1.0, 0.0, 1.0])))
    # an empty row (an empty graph) is a prefix: still fine
    mask = torch.tensor([[True, True, False], [False, False, False], [True, True, True]])
    reports = layer_reports(LayerCapture({0: torch.randn(3, 3, 2) * mask.unsqueeze(-1)}, mask=mask))
    assert reports[0].metrics["within_variance"] is not None


def test_layer_reports_of_a_padded_capture_agree_with_per_sequence_references() -> None:
    """Pins: on a padded capture (lengths 4, 2, 1) the smoothing and spectral metrics equal float64 references
    computed on the real tokens of each sequence only (mean_cosine skips the one-token sequence); half-precision
    states are read in float64."""
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    X = (torch.randn(3, 4, 2, generator=g) * mask.unsqueeze(-1)).half()
    m = layer_reports(LayerCapture({0: X}, mask=mask))[0].metrics
    seqs = [X[i, : int(mask[i].sum())].double().numpy() for i in range(3)]
    assert m["within_variance"] == pytest.approx(np.mean([((x - x.mean(0)) ** 2).sum() / len(x) for x in seqs]))
    allt = np.concatenate(seqs)
    within = sum(((x - x.mean(0)) ** 2).sum() for x in seqs)
    assert m["variance_ratio"] == pytest.approx(within / ((allt - allt.mean(0)) ** 2).sum())
    assert m["mean_cosine"] == pytest.approx(np.mean([_cosine_ref(x) for x in seqs if len(x) > 1]))
    assert m["high_frequency_ratio"] == pytest.approx(
        np.mean([np.linalg.norm(x - x.mean(0)) / np.linalg.norm(x) for x in seqs]))
    assert m["dirichlet_complete"] == pytest.approx(
        np.mean([((x - x.mean(0)) ** 2).sum() / (x**2).sum() for x in seqs]))
    s = np.linalg.svd(np.concatenate([x - x.mean(0) for x in seqs]), compute_uv=False)
    assert m["stable_rank"] == pytest.approx((s**2).sum() / s.max() ** 2)
    p = s / s.sum()
    assert m["effective_rank"] == pytest.approx(np.exp(-(p * np.log(p)).sum()))
