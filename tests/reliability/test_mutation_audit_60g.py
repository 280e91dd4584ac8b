"""Tests written in a mutation audit (60g) of the rivals' float64 references (``ops/reference_rivals.py``), the exact
PPR operator (``operators/ppr_exact.py``), edge features in the scores (``nn/edge_features.py``) and the structural
masks and edge lists of sequence graphs (``graph/_structure.py``).

Each test kills a mutant the suite let through, or one it killed only by comparing the code with a reference that
the same mutation could have broken too; it checks against an independent expectation (an ODE solved by
``scipy.integrate.solve_ivp``, masks and edge sets written out by loops, explicit float64 matrices), never against
the code under test. Mutants judged equivalent are listed at the end of the file.
CPU only, deterministic (seeded generators), no network, no files.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.integrate import solve_ivp

from diffusionformer.ops.reference_rivals import (chebyshev_reference, grand_nl_reference, neutreno_reference,
                                                  value_residual_reference)

f64 = torch.float64


def _grand_nl_exact(q, k, v, t, allowed):
    """``v(t)`` of :math:`\\dot X = (P(X) - I) X`, ``X = [q | k | v]`` of one head, ``P(X)`` the masked softmax of
    ``q k^T / sqrt(C)``, integrated by scipy's DOP853 at a tolerance of 1e-13 (numpy, float64)."""
    N, C = q.shape
    A = np.asarray(allowed, dtype=bool)

    def field(_t, x):
        X = x.reshape(N, 3 * C)
        s = np.where(A, X[:, :C] @ X[:, C : 2 * C].T / np.sqrt(C), -np.inf)
        e = np.exp(s - s.max(1, keepdims=True))
        return ((e / e.sum(1, keepdims=True)) @ X - X).ravel()

    x0 = np.concatenate([np.asarray(q), np.asarray(k), np.asarray(v)], axis=1).ravel()
    sol = solve_ivp(field, (0.0, t), x0, method="DOP853", rtol=1e-13, atol=1e-13)
    return sol.y[:, -1].reshape(N, 3 * C)[:, 2 * C :]


def test_grand_nl_reference_rk4_converges_at_fourth_order_to_the_ode_solution():
    """Mutants of ``grand_nl_reference``'s RK4 stages (``b = f(X + tau a)``, ``d = f(X + tau b)``, weight ``2 d``)
    were killed only by the layer agreeing with the reference (both could carry the same slip; the reference's own
    test checks Euler alone). Here the reference is checked against the ODE's solution: RK4's error shrinks about
    16-fold per halved step, Euler's about 2-fold, and both tend to the solution."""
    g = torch.Generator().manual_seed(3)
    N, C, t = 5, 2, 2.0
    q, k, v = (torch.randn(1, 1, N, C, generator=g, dtype=f64) for _ in range(3))
    allowed = torch.ones(N, N, dtype=torch.bool).tril()
    exact = _grand_nl_exact(q[0, 0].numpy(), k[0, 0].numpy(), v[0, 0].numpy(), t, allowed.numpy())

    def err(steps, method):
        return np.abs(grand_nl_reference(q, k, v, t, steps, method, allowed)[0, 0].numpy() - exact).max()

    e8, e16 = err(8, "rk4"), err(16, "rk4")
    assert e16 < 1e-6 and 10.0 < e8 / e16 < 30.0, (e8, e16)
    u8, u16 = err(8, "euler"), err(16, "euler")
    assert u16 < 0.05 and 1.6 < u8 / u16 < 2.5, (u8, u16)


def test_chebyshev_reference_is_cos_k_arccos_on_a_diagonal_matrix():
    r"""``chebyshev_reference`` was checked only against the operator's own ``chebyshev_matrix`` (mutants of its
    recursion, ``T_{k+1} = P T_k - T_{k-1}``, ``+ T_{k-1}``, ``T_1 = 2 P``, were killed only by that agreement).
    On a diagonal ``P = diag(x)``, ``|x| <= 1``, the Chebyshev polynomials are :math:`T_k(x) = \cos(k \arccos x)`."""
    x = torch.tensor([-1.0, -0.6, 0.0, 0.3, 0.9, 1.0], dtype=f64)
    N, K = x.numel(), 4
    P = torch.diag(x).expand(1, 2, N, N)
    v = torch.arange(1.0, 2 * N * 2 + 1, dtype=f64).reshape(1, 2, N, 2)
    theta = torch.tensor([[0.5, -1.0, 2.0, 0.25, -0.75], [0.0, 0.0, 0.0, 0.0, 1.0]], dtype=f64)  # (H, K + 1)
    T = torch.stack([torch.cos(k * torch.arccos(x)) for k in range(K + 1)])  # (K + 1, N)
    expected = (theta @ T)[None, :, :, None] * v  # f(x_i) v_i per head
    assert torch.allclose(chebyshev_reference(P, v, theta), expected, atol=1e-12)


def test_neutreno_and_value_residual_references_on_uniform_causal_rows_by_hand():
    """``neutreno_reference`` and ``value_residual_reference`` were checked only against the layers (a swapped
    ``v - v0``, ``(1 - lam)`` for ``lam`` or ``lam v + v0`` in the reference, made the same way in an operator, would
    pass). With ``q = k = 0`` and a causal mask, ``P`` averages the first ``i + 1`` rows, so NeuTRENO (Nguyen et
    al. 2023) is ``mean_{j<=i} v_j + lam (v0_i - v_i)`` and ResFormer (Zhou et al. 2024)
    ``mean_{j<=i} (v_j + lam v0_j)``."""
    N, C, lam = 4, 2, 0.3
    q = k = torch.zeros(1, 1, N, C, dtype=f64)
    v = torch.tensor([[1.0, -2.0], [3.0, 0.5], [-1.0, 4.0], [2.0, 2.0]], dtype=f64)
    v0 = torch.tensor([[0.0, 1.0], [-2.0, 1.0], [5.0, -3.0], [1.0, 0.0]], dtype=f64)
    allowed = torch.ones(N, N, dtype=torch.bool).tril()

    def causal_mean(rows):
        return torch.stack([rows[: i + 1].mean(0) for i in range(N)])

    neu = causal_mean(v) + lam * (v0 - v)
    res = causal_mean(v + lam * v0)
    V, V0 = v[None, None], v0[None, None]
    assert torch.allclose(neutreno_reference(q, k, V, V0, lam, allowed)[0, 0], neu, atol=1e-12)
    assert torch.allclose(value_residual_reference(q, k, V, V0, lam, allowed)[0, 0], res, atol=1e-12)
    # the first layer (no v0): plain attention
    assert torch.allclose(neutreno_reference(q, k, V, None, lam, allowed)[0, 0], causal_mean(v), atol=1e-12)
    assert torch.allclose(value_residual_reference(q, k, V, None, lam, allowed)[0, 0], causal_mean(v), atol=1e-12)


# Mutants left alive, judged equivalent or not observable (no test):
# - reference_rivals.uniform_matrix_reference: ``rows >= 0`` for ``rows > 0`` in the outer where: a row without
#   admissible keys is all zeros, so ``A / 1`` is the same zero row.
# - ppr_exact._solve: always ``torch.diagonal_scatter`` (never the in-place copy): same values, one more copy;
#   ``P.diagonal(dim1=-1, dim2=-2)``: the same diagonal.
# - edge_features: ``k.index_select`` before the cast to the working dtype: the forward is exact (half -> float32),
#   only the rounding of the key gradient's scatter-sum changes; no difference beyond noise was measurable on CPU;
#   ``check_coefficients`` dropped: ``layer._coefficients()`` is already (H, K+1), finite (the operator's rows are
#   checked by ``head_coefficients``) and in the working dtype after ``.to(work)``.
# - graph._structure: ``w = min(window, N)`` in structural_edges (offsets past N - 1 are filtered by ``keep``);
#   replicate_edges without its ``B == 1`` shortcut (the shift is zero). ``indexing="xy"`` (edges grouped by source)
#   survived the covering test files but is killed by the doctests of ``graph.builders.complete`` and
#   ``AttentionGraph.to_sparse``.
