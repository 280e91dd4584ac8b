"""Tests written in a second-pass mutation-testing audit of the rival operators' context
(``diffusionformer/ops/rivals.py``: ``RivalContext`` built dense and sparse, its masks, causal handling,
uniform map and dropout, ``LayerState``) and of the float64 references the whole suite trusts
(``diffusionformer/ops/reference.py``, ``diffusionformer/ops/reference_rivals.py``).

The first-pass audits (``tests/core/test_mutation_kills_rivals_dense.py``,
``tests/core/test_mutation_kills_rival_operators.py``, ``tests/core/test_mutation_kills_operators_second_pass.py``)
pinned the rival formulas and the dense back-end; the mutants here aim at what they left open: an explicit
``scale`` given to a context, causal calls that also carry a key padding mask, rows without an admissible key,
sparse graphs with isolated nodes, dropout around the uniform map, and the references on inputs that are not
square, not symmetric or not float32-exact.

Each test kills a mutant of the library code that the rest of the suite let through (its docstring names it:
file and mutation) and checks the code against an independent reference: explicit softmax rows computed by
numpy loops with ``-inf`` masking, uniform averages by loops, ``scipy.linalg.expm`` and ``numpy.linalg.solve``,
and messages written out by hand. Mutants judged equivalent are listed, with the reason, at the end of the file.
The tests of the references check them on the cases the brief of this pass named (rows without keys, causal and
padding masks together, non-symmetric matrices, float64 times); the suite already killed the mutants listed in
their docstrings, which these tests kill on their own as well.
CPU only, deterministic (seeded generators), no network, no files.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.linalg import expm

from diffusionformer.ops.reference import dense_attention_reference, heat_kernel_reference, polynomial_reference
from diffusionformer.operators import AttnScaleOperator
from diffusionformer.ops.reference_rivals import ppr_exact_reference, rival_reference, uniform_matrix_reference
from diffusionformer.ops.rivals import RivalContext, uniform_average

f64 = torch.float64


def _t(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=f64) * scale


def _softmax_rows(q, k, allowed, scale):
    """Explicit softmax of each row of ``q k^T * scale``, masked entries set to ``-inf`` first; a row whose
    entries are all ``-inf`` is zero. numpy float64, one row at a time."""
    q, k = np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64)
    N, M = q.shape[-2], k.shape[-2]
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    A = np.broadcast_to(np.asarray(allowed, dtype=bool), lead + (N, M))
    out = np.zeros(lead + (N, M))
    for idx in np.ndindex(*lead):
        qi, ki = np.broadcast_to(q, lead + q.shape[-2:])[idx], np.broadcast_to(k, lead + k.shape[-2:])[idx]
        for i in range(N):
            row = np.array([float(qi[i] @ ki[j]) * scale if A[idx + (i, j)] else -np.inf for j in range(M)])
            if np.isneginf(row).all():
                continue
            e = np.exp(row - row.max())
            out[idx + (i,)] = e / e.sum()
    return out


def _uniform_rows(allowed, N):
    """``DC``: row ``i`` uniform over its admissible keys, zero without any; explicit loops."""
    A = np.broadcast_to(np.asarray(allowed, dtype=bool), (N, N)) if allowed is not None else np.ones((N, N), bool)
    out = np.zeros((N, N))
    for i in range(N):
        n = int(A[i].sum())
        for j in range(N):
            if A[i, j]:
                out[i, j] = 1.0 / n
    return out


# ---------------------------------------------------------------------------- rivals.py: the dense context
def test_dense_context_keeps_an_explicit_scale():
    """kills: rivals.py RivalContext.dense ``scale=C**-0.5 if scale is None else scale`` -> ``C**-0.5`` (an explicit
    scale ignored: the layer passes ``head_dim**-0.5``, which equals it, so only a direct caller sees it); and
    RivalContext.attention_matrix without ``scale=self.scale`` (the dense-only operators' ``P`` at ``C**-0.5``).
    Reference: explicit softmax rows with the given scale, numpy loops."""
    B, G, N, C = 1, 2, 4, 4
    q, k, v = _t(B, G, N, C, seed=1), _t(B, G, N, C, seed=2), _t(B, G, N, C, seed=3)
    ctx = RivalContext.dense(q, k, v, scale=0.9)
    assert ctx.scale == 0.9
    P = _softmax_rows(q.numpy(), k.numpy(), np.ones((N, N), bool), 0.9)
    np.testing.assert_allclose(ctx.propagate(v).numpy(), P @ v.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ctx.attention_matrix().numpy(), P, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("allowed_key", [True, False])
def test_dense_context_uniform_map_of_a_one_key_broadcast_mask(allowed_key):
    """kills: rivals.py RivalContext.dense taking the O(N) uniform map without ``attn_mask.shape[-1] == M`` (a bool
    mask ``(1, 1, 1, 1)`` broadcast over all keys then reaches ``uniform_mean``, which refuses it).
    Reference: the average over all keys (mask True) or zero rows (mask False), by loops."""
    N = 4
    q, k, v = _t(1, 1, N, 3, seed=4), _t(1, 1, N, 3, seed=5), _t(1, 1, N, 3, seed=6)
    mask = torch.tensor(allowed_key).view(1, 1, 1, 1)
    ctx = RivalContext.dense(q, k, v, attn_mask=mask, is_causal=True)
    allowed = np.tril(np.ones((N, N), bool)) & allowed_key
    np.testing.assert_allclose(ctx.uniform(v).numpy()[0, 0], _uniform_rows(allowed, N) @ v.numpy()[0, 0],
                               rtol=1e-12, atol=1e-14)
    P = _softmax_rows(q.numpy(), k.numpy(), allowed, 3**-0.5)
    np.testing.assert_allclose(ctx.propagate(v).numpy(), P @ v.numpy(), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------- rivals.py: the sparse context
# edges (source j, target i); node 3 has no incoming edge (isolated as a target), node 4 only a later source
_EDGES = [(0, 0), (1, 0), (2, 0), (0, 1), (2, 1), (4, 1), (1, 2), (2, 2), (4, 2), (3, 4), (4, 4)]


def _edge_allowed(N, causal):
    A = np.zeros((N, N), bool)
    for j, i in _EDGES:
        if not causal or j <= i:
            A[i, j] = True
    return A


@pytest.mark.parametrize("causal", [False, True])
def test_sparse_context_against_explicit_rows_with_an_isolated_node(causal):
    """kills: rivals.py RivalContext.sparse ``scale=C**-0.5 if scale is None else scale`` -> ``C**-0.5``; its
    ``_is_causal = bool(is_causal)`` -> ``False``; RivalContext.attend's sparse path with coefficients
    ``[0, 1] -> [0, 1, 0]`` or without its dropout (below).
    Reference: softmax over each node's in-edges (``-inf`` elsewhere) by numpy loops; node 3, without
    in-edges, gives a zero row."""
    N, G, C = 5, 2, 4
    q, k, v = _t(N, G, C, seed=7), _t(N, G, C, seed=8), _t(N, G, C, seed=9)
    ei = torch.tensor(_EDGES, dtype=torch.long).t().contiguous()
    ctx = RivalContext.sparse(q, k, v, ei, is_causal=causal, scale=0.7)
    assert ctx.is_sparse and ctx.scale == 0.7
    A = _edge_allowed(N, causal)
    qh, kh, vh = (t.transpose(0, 1).numpy() for t in (q, k, v))  # (G, N, C)
    P = _softmax_rows(qh, kh, A, 0.7)
    out = ctx.propagate(ctx.v).numpy()[0]
    np.testing.assert_allclose(out, P @ vh, rtol=1e-10, atol=1e-12)
    assert np.all(out[:, 3] == 0.0)
    np.testing.assert_allclose(ctx.uniform(ctx.v).numpy()[0], _uniform_rows(A, N) @ vh, rtol=1e-10, atol=1e-12)
    # another scale for one call
    P2 = _softmax_rows(qh, kh, A, 0.25)
    np.testing.assert_allclose(ctx.attend(ctx.q, ctx.k, ctx.v, scale=0.25).numpy()[0], P2 @ vh, rtol=1e-10, atol=1e-12)


def test_sparse_context_drops_out_in_attend_but_not_in_uniform():
    """kills: rivals.py RivalContext.attend's sparse path passing ``dropout_p=0`` (dropout lost on graphs);
    RivalContext.uniform without setting ``dropout_p = 0`` for its call, or without restoring it afterwards.
    Reference: the uniform map by loops (exact despite ``dropout_p = 0.5``); ``attend`` with dropout differs from
    the dropout-free rows and, seeded, is reproducible; ``dropout_p`` is 0.5 again after ``uniform``."""
    N, G, C = 5, 1, 4
    q, k, v = _t(N, G, C, seed=10), _t(N, G, C, seed=11), _t(N, G, C, seed=12)
    ei = torch.tensor(_EDGES, dtype=torch.long).t().contiguous()
    ctx = RivalContext.sparse(q, k, v, ei, dropout_p=0.5)
    vh = v.transpose(0, 1).numpy()
    A = _edge_allowed(N, False)
    torch.manual_seed(0)
    np.testing.assert_allclose(ctx.uniform(ctx.v).numpy()[0], _uniform_rows(A, N) @ vh, rtol=1e-10, atol=1e-12)
    assert ctx.dropout_p == 0.5
    P = _softmax_rows(q.transpose(0, 1).numpy(), k.transpose(0, 1).numpy(), A, C**-0.5)
    torch.manual_seed(0)
    out = ctx.propagate(ctx.v).numpy()[0]
    assert not np.allclose(out, P @ vh)


def test_dense_context_uniform_of_a_general_mask_ignores_and_keeps_dropout():
    """kills: rivals.py RivalContext.uniform without ``dropout_p = 0`` for its zero-score attention call, or without
    restoring ``dropout_p`` in ``finally`` (the dense-only ``attention_matrix`` then stops dropping out).
    Reference: the uniform map of the (non key-padding) mask by loops; ``attention_matrix`` of a
    ``dropout_p = 0.5`` context has zeros or doubled entries of the explicit softmax."""
    N, C = 5, 4
    q, k, v = _t(1, 1, N, C, seed=13), _t(1, 1, N, C, seed=14), _t(1, 1, N, C, seed=15)
    allowed = np.array([[(i + j) % 3 != 0 for j in range(N)] for i in range(N)])
    allowed[2] = False  # a row without keys
    ctx = RivalContext.dense(q, k, v, attn_mask=torch.tensor(allowed), dropout_p=0.5)
    torch.manual_seed(1)
    np.testing.assert_allclose(ctx.uniform(v).numpy()[0, 0], _uniform_rows(allowed, N) @ v.numpy()[0, 0],
                               rtol=1e-12, atol=1e-14)
    assert ctx.dropout_p == 0.5
    P = _softmax_rows(q.numpy(), k.numpy(), allowed, C**-0.5)[0, 0]
    torch.manual_seed(2)
    Pd = ctx.attention_matrix().numpy()[0, 0]
    assert np.all(np.isclose(Pd, 0.0) | np.isclose(Pd, 2 * P))
    assert not np.allclose(Pd, P)


def test_sparse_context_takes_node_major_raw_queries_and_keys():
    """kills: rivals.py RivalContext.sparse keeping node-major ``q_raw`` / ``k_raw`` ``(N, G, C)`` as given (not made
    head-major ``(1, G, N, C)`` like ``q``, ``k``: GRAND-nl then evolves a state of the wrong layout).
    Reference: the raw tensors transposed by hand, element by element."""
    N, G, C = 5, 2, 3
    q, k, v = _t(N, G, C, seed=16), _t(N, G, C, seed=17), _t(N, G, C, seed=18)
    qr, kr = _t(N, G, C, seed=19), _t(N, G, C, seed=20)
    ei = torch.tensor(_EDGES, dtype=torch.long).t().contiguous()
    ctx = RivalContext.sparse(q, k, v, ei, q_raw=qr, k_raw=kr)
    assert tuple(ctx.q_raw.shape) == tuple(ctx.k_raw.shape) == (1, G, N, C)
    for n in range(N):
        for g in range(G):
            assert torch.equal(ctx.q_raw[0, g, n], qr[n, g]) and torch.equal(ctx.k_raw[0, g, n], kr[n, g])
            assert torch.equal(ctx.q[0, g, n], q[n, g])


# ---------------------------------------------------------------------------- reference.py
def test_dense_attention_reference_against_explicit_rows_with_causal_padding_and_empty_rows():
    """kills: reference.py dense_attention_reference returning ``e / z`` (NaN in rows without an admissible key);
    the exponentials not masked (``e = s.exp()``); the default ``allowed`` made lower-triangular; the scores
    computed in float32 before the float64 softmax.
    Reference: explicit softmax rows with ``-inf`` masking (numpy loops), on causal + key padding masks where
    query 0 has no key, and on ``N != M`` queries and keys without a mask."""
    B, G, N, C = 2, 2, 5, 4
    q, k = _t(B, G, N, C, seed=21, scale=3.0) + 1.0 / 3.0, _t(B, G, N, C, seed=22, scale=3.0)
    causal = np.tril(np.ones((N, N), bool))
    pad = np.ones((B, 1, 1, N), bool)
    pad[0, 0, 0, 0] = False  # batch 0: key 0 padded, so query 0 has no key under the causal mask
    pad[1, 0, 0, 3] = False
    allowed = causal & pad
    P = dense_attention_reference(q, k, allowed=torch.tensor(allowed))
    expected = _softmax_rows(q.numpy(), k.numpy(), allowed, C**-0.5)
    assert not np.isnan(P.numpy()).any()
    np.testing.assert_allclose(P.numpy(), expected, rtol=1e-13, atol=1e-15)
    assert np.all(P.numpy()[0, :, 0] == 0.0)
    # queries and keys of different lengths, no mask
    q2, k2 = _t(3, C, seed=23), _t(6, C, seed=24)
    np.testing.assert_allclose(dense_attention_reference(q2, k2, scale=0.8).numpy(),
                               _softmax_rows(q2.numpy(), k2.numpy(), np.ones((3, 6), bool), 0.8), rtol=1e-13)


def test_polynomial_reference_of_a_non_symmetric_p_with_more_coefficients_than_heads():
    """kills: reference.py polynomial_reference ``total @ v -> total^T @ v``; the loop over ``coeffs.shape[0]``
    instead of ``coeffs.shape[-1]`` (per-head coefficients ``(H, K+1)`` with ``H < K+1`` lose their last terms).
    Reference: ``sum_k c[h, k] P^k v`` with numpy matrix powers, per head."""
    B, H, N, C = 1, 2, 4, 3
    g = np.random.default_rng(0)
    P = g.random((B, H, N, N))
    P /= P.sum(-1, keepdims=True)
    v = g.standard_normal((B, H, N, C))
    coeffs = np.array([[0.5, -1.0, 2.0, 0.25], [1.0, 0.3, -0.7, 1.5]])
    expected = np.zeros((B, H, N, C))
    for h in range(H):
        M = sum(coeffs[h, kk] * np.linalg.matrix_power(P[0, h], kk) for kk in range(4))
        expected[0, h] = M @ v[0, h]
    out = polynomial_reference(torch.tensor(P), torch.tensor(v), torch.tensor(coeffs))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12, atol=1e-13)


def test_heat_kernel_reference_keeps_the_time_in_float64():
    """kills: reference.py heat_kernel_reference ``torch.as_tensor(t, dtype=float64) -> float32`` (``t = 0.1`` then
    becomes ``0.100000001490...``, a 1e-8 relative error in a reference that fast paths meet at 1e-10).
    Reference: ``scipy.linalg.expm(-0.1 (I - P)) v`` on a non-symmetric ``P``."""
    g = np.random.default_rng(1)
    N = 5
    P = g.random((N, N)) * 8.0
    v = g.standard_normal((N, 2))
    expected = expm(-0.1 * (np.eye(N) - P)) @ v
    np.testing.assert_allclose(heat_kernel_reference(torch.tensor(P), torch.tensor(v), 0.1).numpy(), expected,
                               rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------- reference_rivals.py
def test_uniform_matrix_reference_and_uniform_average_of_a_non_symmetric_mask():
    """kills: reference_rivals.py uniform_matrix_reference counting each row's keys over the columns
    (``A.sum(-2)``) or making the mask lower-triangular.
    Reference: row ``i`` uniform over its admissible keys by loops; a row without keys is zero
    (``uniform_average`` agrees, row by row)."""
    N = 5
    A = np.array([[(j - i) % N in (1, 3) for j in range(N)] for i in range(N)])  # keys after and before the query
    A[4] = False
    DC = uniform_matrix_reference(N, torch.tensor(A)).numpy()
    np.testing.assert_allclose(DC, _uniform_rows(A, N), rtol=1e-15)
    x = _t(1, 1, N, 2, seed=25)
    np.testing.assert_allclose(uniform_average(x, torch.tensor(A)).numpy()[0, 0], _uniform_rows(A, N) @ x.numpy()[0, 0],
                               rtol=1e-13, atol=1e-15)


def test_ppr_exact_reference_of_a_non_symmetric_p_against_a_linear_solve():
    """kills: reference_rivals.py ppr_exact_reference inverting ``I - (1 - alpha) P^T``.
    Reference: ``alpha x`` with ``(I - (1 - alpha) P) x = v`` from ``numpy.linalg.solve``."""
    g = np.random.default_rng(2)
    N = 5
    P = g.random((N, N)) ** 3
    P /= P.sum(-1, keepdims=True)
    v = g.standard_normal((N, 3))
    expected = 0.15 * np.linalg.solve(np.eye(N) - 0.85 * P, v)
    np.testing.assert_allclose(ppr_exact_reference(torch.tensor(P), torch.tensor(v), 0.15).numpy(), expected,
                               rtol=1e-12, atol=1e-13)


def test_rival_reference_of_attnscale_takes_the_mask():
    """kills: reference_rivals.py rival_reference calling ``attnscale_reference`` without ``allowed`` (the reference
    of a masked AttnScale head then averages and attends over every key).
    Reference: ``(DC + (1 + omega_h) (P - DC)) v`` from explicit softmax rows and uniform rows (numpy loops),
    causal and key padding together, one query without a key."""
    B, G, N, C = 1, 2, 5, 4
    q, k, v = _t(B, G, N, C, seed=26), _t(B, G, N, C, seed=27), _t(B, G, N, C, seed=28)
    op = AttnScaleOperator(omega=0.5, num_heads=G)
    allowed = np.tril(np.ones((N, N), bool)) & np.array([False, True, True, False, True])
    P = _softmax_rows(q.numpy(), k.numpy(), allowed, C**-0.5)[0]
    DC = _uniform_rows(allowed, N)
    expected = np.stack([(DC + 1.5 * (P[h] - DC)) @ v.numpy()[0, h] for h in range(G)])
    out = rival_reference(op, q, k, v, allowed=torch.tensor(allowed))
    np.testing.assert_allclose(out.numpy()[0], expected, rtol=1e-12, atol=1e-13)
    assert np.all(out.numpy()[0, :, 0] == 0.0)


# ---------------------------------------------------------------------------- equivalent mutants
# 50 mutants were applied (27 in rivals.py, 7 in reference.py, 16 in reference_rivals.py); 41 were killed by the
# suite before this file, 6 more by this file (rivals.py: the explicit scale ignored by the dense and by the sparse
# context and by ``attention_matrix``, the dense uniform map without ``shape[-1] == M``, node-major
# ``q_raw``/``k_raw`` kept as given; reference_rivals.py: AttnScale's reference without the mask). The three
# survivors are equivalent:
# - rivals.py RivalContext.attend's sparse coefficients ``[0, 1] -> [0, 1, 0]``: a zero weight on ``P^2 x`` adds
#   exact zeros (one more propagation, the same values).
# - rivals.py RivalContext.uniform ``width = x.shape[-1] if dense else 1`` -> ``1``: the zero queries and keys give
#   zero scores at any width; the width only chooses SDPA's fused or unfused kernel.
# - rivals.py RivalContext.attend's padding rule ``Cq != Cx and (Cq > Cx or 2 Cq >= Cx or M >= 512)`` -> ``Cq != Cx``:
#   zero columns change no score ``q k^T`` (the scale is explicit) and the output is cut back to ``Cx``; the rule
#   only picks the faster kernel.
