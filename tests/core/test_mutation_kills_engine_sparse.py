"""Tests written in a mutation-testing audit of the engine and the sparse back-end.

Each test kills a mutant of ``diffusionformer/ops`` (``engine.py``, ``csr.py``, ``sparse.py``,
``scatter.py``, ``uniform_map.py``, ``_checks.py``) or of ``diffusionformer/testing/harness.py``
that the rest of the suite let through (the docstring of each test names it) and checks the
code against an independent reference: explicit float64 edge-softmax matrices and their powers,
PyG's ``softmax``, hand-computed values, and the documented contract (bad input gets a clear
``ValueError``/``TypeError`` naming the argument). CPU only, deterministic (seeded generators).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor
from torch_geometric.utils import softmax as pyg_softmax

from diffusionformer.functional import diffuse, diffuse_sparse, edge_attention, propagate_sparse
from diffusionformer.operators import AttnScaleOperator, DiffusionOperator
from diffusionformer.ops.csr import sddmm_heads, spmm_heads
from diffusionformer.ops.engine import combine_affine, static_coefficients
from diffusionformer.ops.scatter import scatter_max, scatter_sum, segment_softmax
from diffusionformer.ops.sparse import diffuse_sparse_with_weights
from diffusionformer.ops.uniform_map import uniform_mean
from diffusionformer.testing import assert_operator

f64 = torch.float64


def _nodes(N: int = 5, H: int = 2, C: int = 4, seed: int = 0, dtype: torch.dtype = f64) -> tuple[Tensor, Tensor, Tensor]:
    """Node-major ``(N, H, C)`` queries, keys and values."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(N, H, C, generator=g, dtype=f64).to(dtype) for _ in range(3))  # type: ignore[return-value]


def _edges() -> Tensor:
    """A small graph in no particular order: a self-loop, a duplicate-free mix, node 4 without in-edges."""
    return torch.tensor([[1, 0, 2, 3, 0, 4, 2], [0, 1, 1, 2, 3, 3, 0]])


def _explicit_P(q: Tensor, k: Tensor, ei: Tensor, N: int) -> Tensor:
    """The edge softmax as an explicit float64 ``(H, N, N)`` matrix, built entry by entry."""
    H, C = q.shape[1], q.shape[2]
    P = torch.zeros(H, N, N, dtype=f64)
    for h in range(H):
        for i in range(N):
            srcs = [int(j) for j, t in zip(ei[0], ei[1]) if int(t) == i]
            if not srcs:
                continue
            s = torch.stack([q[i, h].double() @ k[j, h].double() / math.sqrt(C) for j in srcs])
            w = torch.exp(s - s.max())
            for j, wj in zip(srcs, w / w.sum()):
                P[h, i, j] += wj
    return P


# ---------------------------------------------------------------------------- engine: static coefficients
@pytest.mark.parametrize("coeffs", [[[True, 0.5]], [True, 0.5]], ids=["rows", "shared"])
def test_static_coefficients_refuse_bools(coeffs):
    """kills: engine._static_rows accepting bools as numbers (the ``not isinstance(c, bool)`` of the rows
    branch, and of the shared ``(K+1,)`` branch, dropped)"""
    with pytest.raises(TypeError, match="must hold numbers"):
        static_coefficients(coeffs, 1)


def test_static_coefficients_first_cached_under_inference_mode_still_train():
    """kills: engine.static_tensor building its cached tensor without ``torch.inference_mode(False)`` (an
    inference tensor, which autograd refuses to save, is then reused by a later training call)"""
    q, k, v = _nodes(seed=1)
    ei = _edges()
    rows = [[0.4375, 0.3125, 0.25], [0.8125, -0.5625, 0.75]]  # values used nowhere else: the cache is cold
    with torch.inference_mode():
        first = diffuse_sparse(q, k, v, ei, rows)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = diffuse_sparse(qg, kg, vg, ei, rows)
    P = _explicit_P(q, k, ei, 5)
    c = torch.tensor(rows, dtype=f64)
    vh = v.transpose(0, 1)
    ref = (c[:, 0, None, None] * vh + c[:, 1, None, None] * (P @ vh) + c[:, 2, None, None] * (P @ P @ vh)).transpose(0, 1)
    torch.testing.assert_close(first, ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    (gv,) = torch.autograd.grad(out.sum(), vg)  # d/dv of sum_h c0 1^T v + c1 1^T P v + c2 1^T P^2 v
    ones = torch.ones(2, 1, 5, dtype=f64)
    want = (c[:, 0, None, None] * ones + c[:, 1, None, None] * (ones @ P) + c[:, 2, None, None] * (ones @ P @ P))
    torch.testing.assert_close(gv, want.transpose(1, 2).transpose(0, 1).expand_as(gv), atol=1e-12, rtol=0)


def test_combine_affine_inplace_false_leaves_p_v_untouched():
    """kills: engine.combine_affine ignoring ``inplace=False`` without autograd history (``copy = grad``), so
    the propagated values ``y``, which a caller keeps to rebuild the output, are overwritten"""
    g = torch.Generator().manual_seed(2)
    y, v = torch.randn(2, 3, 4, 2, generator=g, dtype=f64), torch.randn(2, 3, 4, 2, generator=g, dtype=f64)
    for runs in [((1, 3, 1.0, -1.0),), ((0, 2, 0.1, 0.7),)]:  # exact columns; and 0.1 (no column path in float32)
        for dtype in (f64, torch.float32):
            yy, vv = y.to(dtype), v.to(dtype)
            keep = yy.clone()
            out = combine_affine(yy, vv, runs, inplace=False)
            assert torch.equal(yy, keep)
            a, b, c0, c1 = runs[0]
            want = keep.double().clone()
            want[..., a:b, :] = c0 * vv.double()[..., a:b, :] + c1 * keep.double()[..., a:b, :]
            torch.testing.assert_close(out.double(), want, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------- csr kernels
def test_sddmm_dense_gather_branch_on_a_rectangular_pattern():
    """kills: csr.sddmm_heads' dense-gather branch (more entries than cells) flattening the cell of an entry
    with the number of rows R instead of the number of columns M (equal on every square pattern)"""
    g = torch.Generator().manual_seed(3)
    R, M = 2, 3
    rows = [0, 0, 0, 0, 1, 1, 1]  # E = 7 > R M = 6 (duplicates): the dense-gather branch
    col = torch.tensor([2, 0, 2, 1, 1, 0, 2])
    crow = torch.tensor([0, 4, 7])
    a, b = torch.randn(2, R, 3, generator=g, dtype=f64), torch.randn(2, M, 3, generator=g, dtype=f64)
    want = torch.stack([torch.stack([a[h, r] @ b[h, c] for r, c in zip(rows, col.tolist())]) for h in range(2)])
    torch.testing.assert_close(sddmm_heads(crow, col, a, b), want, atol=1e-12, rtol=0)
    # the sampled_addmm branch on a rectangular pattern, for comparison
    torch.testing.assert_close(sddmm_heads(crow[:2].clone(), col[:4], a, b), want[:, :4], atol=1e-12, rtol=0)


def test_spmm_heads_without_entries_is_zero_whatever_the_allocator_returns():
    """kills: csr.spmm_heads returning its uninitialised output for a pattern without entries (``out.zero_()``
    dropped)"""
    crow = torch.zeros(7, dtype=torch.long)
    x = torch.ones(3, 6, 5, dtype=f64)
    for _ in range(20):  # freed NaN blocks of the output's size: an uninitialised output shows them
        junk = torch.full((3, 6, 5), float("nan"), dtype=f64)
        del junk
        out = spmm_heads(crow, torch.zeros(0, dtype=torch.long), torch.zeros(3, 0, dtype=f64), x, 6)
        assert torch.equal(out, torch.zeros(3, 6, 5, dtype=f64))


# ---------------------------------------------------------------------------- sparse: validation
def _bad_sparse_calls():
    q, k, v = _nodes(N=3, seed=4, dtype=torch.float32)
    ei = torch.tensor([[0, 1], [1, 2]])
    c = torch.tensor([0.5, 0.5])
    return [
        ("edge index equal to N", ValueError, r"edge_index values must lie in \[0, num_nodes=3\), got range \[0, 3\]",
         lambda: diffuse_sparse(q, k, v, torch.tensor([[0, 3], [1, 1]]), c)),
        ("negative edge index", ValueError, r"edge_index values must lie in \[0, num_nodes=3\), got range \[-1, 1\]",
         lambda: diffuse_sparse(q, k, v, torch.tensor([[0, -1], [1, 1]]), c)),
        ("q and k widths", ValueError, r"q and k must have the same shape \(N, H, C\), got \(3, 2, 4\) and \(3, 2, 3\)",
         lambda: diffuse_sparse(q, k[..., :3], v, ei, c)),
        ("q and k dtypes", TypeError, "q and k must have the same dtype, got torch.float32 and torch.float64",
         lambda: diffuse_sparse(q, k.double(), v, ei, c)),
        ("num_nodes float", TypeError, "num_nodes must be an int or None, got float",
         lambda: diffuse_sparse(q, k, v, ei, c, num_nodes=3.0)),
        ("v heads", ValueError, r"v must have shape \(N, H, C_v\) with \(N, H\) = \(3, 2\), got \(3, 1, 4\)",
         lambda: diffuse_sparse(q, k, v[:, :1], ei, c)),
        ("v dtype", TypeError, r"v must have the dtype of q \(torch.float32\), got torch.float64",
         lambda: diffuse_sparse(q, k, v.double(), ei, c)),
        ("need_weights int", TypeError, r"need_weights must be a bool, got int \(1\)",
         lambda: diffuse_sparse_with_weights(q, k, v, ei, c, need_weights=1)),
        ("is_causal int", TypeError, "is_causal must be a bool, got int",
         lambda: diffuse_sparse(q, k, v, ei, c, is_causal=1)),
        ("weights heads", ValueError, r"weights must have shape \(E, H\) = \(2, 2\), got \(2, 1\)",
         lambda: propagate_sparse(torch.ones(2, 1), v, ei)),
        ("weights edges", ValueError, r"weights must have shape \(E, H\) = \(2, 2\), got \(3, 2\)",
         lambda: propagate_sparse(torch.ones(3, 2), v, ei)),
        ("coeffs 3-d", ValueError, r"coeffs must have shape \(K\+1,\) or \(H, K\+1\), got shape \(1, 2, 2\)",
         lambda: diffuse_sparse(q, k, v, ei, torch.ones(1, 2, 2))),
        ("coeffs no column", ValueError, "coeffs must have at least one column",
         lambda: diffuse_sparse(q, k, v, ei, torch.ones(2, 0))),
        ("degree bool", TypeError, r"degrees must be a sequence of ints, one per head; got \[True, 1\]",
         lambda: diffuse_sparse(q, k, v, ei, c, degrees=[True, 1])),
        ("degree negative", ValueError, r"every degree must lie in \[0, K=1\], got \[-1, 1\]",
         lambda: diffuse_sparse(q, k, v, ei, c, degrees=[-1, 1])),
        ("degrees count", ValueError, r"degrees must list one integer per head \(H=2\), got 3",
         lambda: diffuse_sparse(q, k, v, ei, c, degrees=[1, 1, 1])),
        ("degrees bytes", TypeError, "degrees must be a sequence of ints, one per head, or None",
         lambda: diffuse_sparse(q, k, v, ei, c, degrees=b"\x01\x01")),
        ("static degree above K", ValueError, r"every degree must lie in \[0, K=1\], got \[2, 2\]",
         lambda: diffuse_sparse(q, k, v, ei, [0.5, 0.5], degrees=[2, 2])),
        ("head dim 0", ValueError, "q and k must have a head dimension C >= 1, got C=0",
         lambda: diffuse_sparse(q[..., :0], k[..., :0], v, ei, c)),
        ("scale nan", ValueError, "scale must be finite, got nan",
         lambda: diffuse_sparse(q, k, v, ei, c, scale=float("nan"))),
        ("scale bool", TypeError, "scale must be a float or None, got bool",
         lambda: diffuse_sparse(q, k, v, ei, c, scale=True)),
        ("dropout bool", ValueError, "dropout_p must lie in \\[0, 1\\), got False",
         lambda: diffuse_sparse(q, k, v, ei, c, dropout_p=False)),
    ]


@pytest.mark.parametrize("i", range(len(_bad_sparse_calls())), ids=[c[0] for c in _bad_sparse_calls()])
def test_bad_sparse_inputs_are_refused_naming_the_argument(i):
    """kills: sparse.check_edge_index accepting an index equal to N (``hi >= N`` -> ``hi > N``) or a negative one
    (``lo < 0`` dropped); _check_nodes dropping the q/k shape or dtype test; _check_num_nodes dropping its type test;
    diffuse_sparse_with_weights dropping the v shape, v dtype, need_weights or is_causal test; propagate_sparse
    dropping either half of its weights shape test; _checks.check_coefficients accepting a 3-d tensor or one
    without a column; check_degrees accepting bools, negative degrees, the wrong count or bytes;
    check_layout allowing static degrees up to K+1; check_scale accepting C = 0, NaN or a bool; check_dropout
    accepting False"""
    _, err, match, call = _bad_sparse_calls()[i]
    with pytest.raises(err, match=match):
        call()


def test_dense_float_mask_with_plus_inf_is_refused():
    """kills: _checks.check_attn_mask refusing NaN but not +inf in a float (additive) mask"""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 1, 3, 2, generator=g) for _ in range(3))
    mask = torch.zeros(3, 3)
    mask[0, 1] = float("inf")
    with pytest.raises(ValueError, match="entries must be finite or -inf"):
        diffuse(q, k, v, [0.0, 1.0], attn_mask=mask)


def test_dense_attn_mask_that_would_widen_the_scores_is_refused():
    """kills: _checks.check_attn_mask accepting any mask that broadcasts with the scores (a (2, 1) mask against
    N = M = 1 would widen the output to two queries)"""
    q = torch.ones(1, 1, 1, 2)
    with pytest.raises(ValueError, match=r"attn_mask must be broadcastable to \(B, H, N, M\) = \(1, 1, 1, 1\), got shape \(2, 1\)"):
        diffuse(q, q, q, [0.0, 1.0], attn_mask=torch.ones(2, 1, dtype=torch.bool))


# ---------------------------------------------------------------------------- sparse: values
def test_edge_attention_returns_the_input_dtype_on_the_csr_path():
    """kills: sparse.edge_attention returning the float32 working dtype for half-precision inputs (csr path)"""
    q, k, _ = _nodes(seed=6, dtype=torch.bfloat16)
    ei = _edges()
    for backend in ("csr", "native"):
        w = edge_attention(q, k, ei, backend=backend)
        assert w.dtype == torch.bfloat16, backend
        P = _explicit_P(q, k, ei, 5)
        want = P[:, ei[1], ei[0]].t()
        assert (w.double() - want).abs().max() < 2**-8


def test_static_degree_zero_coefficients_on_the_sparse_engine():
    """kills: sparse._diffuse_sparse sending static coefficients of one column (K = 0) to the affine pass
    (``len(coeffs[0]) == 2`` -> ``<= 2``), which reads a second column that does not exist"""
    q, k, v = _nodes(seed=7)
    for backend in ("csr", "native"):
        torch.testing.assert_close(diffuse_sparse(q, k, v, _edges(), [[0.5], [-2.0]], backend=backend),
                                   v * torch.tensor([0.5, -2.0], dtype=f64).view(1, 2, 1), atol=0, rtol=0)


@pytest.mark.parametrize("backend", ["csr", "native"])
def test_sparse_bfloat16_static_loop_accumulates_in_float32(backend):
    """kills: sparse._diffuse_sparse building static coefficients in the input dtype (bfloat16) instead of the
    float32 working dtype"""
    N = 4
    q = torch.zeros(N, 1, 8, dtype=torch.bfloat16)
    v = torch.full((N, 1, 8), 1.5, dtype=torch.bfloat16)  # every node sees every node: P^k v = 1.5 exactly
    ei = torch.stack(torch.meshgrid(torch.arange(N), torch.arange(N), indexing="ij")).reshape(2, -1)
    out = diffuse_sparse(q, q, v, ei, [0.1, 0.2, 0.3], backend=backend)  # 1.5 * 0.6 = 0.9, rounded once
    want = torch.tensor(0.9, dtype=f64).to(torch.bfloat16)
    assert torch.equal(out, want.expand_as(out)), out.flatten()[0].item()


@pytest.mark.parametrize("backend", ["csr", "native"])
def test_sparse_dropout_drops_edge_weights(backend):
    """kills: CsrBackend.propagate / NativeBackend.propagate ignoring ``dropout_p`` (no dropout on the edge weights)"""
    q, k, v = _nodes(N=6, seed=8)
    ei = torch.stack(torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")).reshape(2, -1)
    c = torch.tensor([0.0, 1.0], dtype=f64)
    P = _explicit_P(q, k, ei, 6)
    plain = (P @ v.transpose(0, 1)).transpose(0, 1)
    torch.testing.assert_close(diffuse_sparse(q, k, v, ei, c, backend=backend), plain, atol=1e-12, rtol=0)
    torch.manual_seed(0)
    dropped = diffuse_sparse(q, k, v, ei, c, dropout_p=0.5, backend=backend)
    assert not torch.allclose(dropped, plain, atol=1e-3)
    # unbiased: the mean over many draws approaches P v (kept weights are scaled by 1 / (1 - p))
    torch.manual_seed(1)
    mean = sum(diffuse_sparse(q, k, v, ei, c, dropout_p=0.5, backend=backend) for _ in range(200)) / 200
    assert (mean - plain).abs().max() < 0.25


# ---------------------------------------------------------------------------- scatter
@pytest.mark.parametrize("fn", [scatter_sum, scatter_max, segment_softmax], ids=lambda f: f.__name__)
def test_scatter_primitives_refuse_bad_indices(fn):
    """kills: scatter._check_index dropping its 1-D, integer dtype, row count or non-negative size test"""
    src = torch.zeros(3)
    with pytest.raises(ValueError, match=r"index must be 1-D of shape \(E,\), got shape \(1, 3\)"):
        fn(src, torch.zeros(1, 3, dtype=torch.long), 2)
    with pytest.raises(TypeError, match="index must be an integer tensor"):
        fn(src, torch.zeros(3), 2)
    with pytest.raises(ValueError, match="src has 3, index has 2"):
        fn(src, torch.zeros(2, dtype=torch.long), 2)
    size_name = "num_nodes" if fn is segment_softmax else "dim_size"
    with pytest.raises(ValueError, match=f"{size_name} must be non-negative, got -1"):
        fn(src, torch.zeros(3, dtype=torch.long), -1)


@pytest.mark.parametrize("fn", [scatter_sum, scatter_max, segment_softmax], ids=lambda f: f.__name__)
@pytest.mark.parametrize("index", [[0, 3], [-1, 0], [3, 3]])
def test_scatter_primitives_refuse_indices_out_of_range(fn, index):
    """Bug: an index outside [0, dim_size) failed inside ``index_add_`` / ``scatter_reduce_`` with an error naming
    neither ``index`` nor ``dim_size`` ("index out of range in self"); on CPU it is now checked first, as
    ``check_edge_index`` does, and the message gives the range found. Edge values at the bounds still pass."""
    size_name = "num_nodes" if fn is segment_softmax else "dim_size"
    with pytest.raises(ValueError, match=rf"index values must lie in \[0, {size_name}=3\), got range \[{min(index)}, {max(index)}\]"):
        fn(torch.tensor([1.0, 2.0]), torch.tensor(index), 3)
    assert torch.equal(scatter_sum(torch.tensor([1.0, 2.0]), torch.tensor([0, 2]), 3), torch.tensor([1.0, 0.0, 2.0]))
    assert scatter_sum(torch.zeros(0), torch.zeros(0, dtype=torch.long), 0).shape == (0,)


def test_scatter_max_of_negative_scores_ignores_the_zero_fill():
    """kills: scatter.scatter_max including the zero-filled output in the maximum (``include_self=True``), so a
    bucket of negative values has maximum 0 and a segment softmax of very negative scores underflows to 0"""
    got = scatter_max(torch.tensor([-3.0, -1.0, -7.0]), torch.tensor([0, 0, 2]), 3)
    assert torch.equal(got, torch.tensor([-1.0, 0.0, -7.0]))
    src = torch.tensor([[-1000.0], [-1001.0], [-2000.0]], dtype=f64)
    index = torch.tensor([0, 0, 1])
    w = segment_softmax(src, index, 2)
    torch.testing.assert_close(w, pyg_softmax(src, index, num_nodes=2), atol=1e-12, rtol=0)
    torch.testing.assert_close(w.flatten(), torch.tensor([1 / (1 + math.exp(-1)), 1 / (1 + math.e), 1.0], dtype=f64))


def test_scatter_max_is_returned_without_gradient_history():
    """kills: scatter.scatter_max not detaching its input (the documented result has no gradient history)"""
    x = torch.tensor([1.0, 2.0, 0.5], requires_grad=True)
    m = scatter_max(x, torch.tensor([0, 0, 1]), 2)
    assert not m.requires_grad and torch.equal(m, torch.tensor([2.0, 0.5]))


def test_segment_softmax_of_bfloat16_scores_is_computed_in_float32():
    """kills: scatter.segment_softmax computing half-precision scores in their own dtype (not float32)"""
    g = torch.Generator().manual_seed(9)
    index = torch.arange(8).repeat_interleave(16)  # 8 segments of 16 edges: sums far from the exp's values
    src = (torch.randn(128, 2, generator=g) * 3).to(torch.bfloat16)
    got = segment_softmax(src, index, 8)
    assert got.dtype == torch.bfloat16
    want = pyg_softmax(src.double(), index, num_nodes=8)
    # float32 sums, one rounding to bfloat16: within half a bfloat16 ulp of the float64 value (plus float32 slack)
    ulp = torch.finfo(torch.bfloat16).eps * want.abs().clamp_min(2**-126)
    assert ((got.double() - want).abs() <= 0.5 * ulp * (1 + 1e-3)).all()


# ---------------------------------------------------------------------------- uniform map
def test_uniform_mean_refuses_a_key_mask_of_three_dimensions():
    """kills: uniform_map.uniform_mean dropping its 4-dimension test of ``key_mask``"""
    x = torch.randn(1, 1, 4, 2)
    with pytest.raises(ValueError, match=r"key_mask must have shape \(B, G, 1, M\) with M = 4, got \(1, 1, 4\)"):
        uniform_mean(x, torch.ones(1, 1, 4, dtype=torch.bool))


@pytest.mark.parametrize("shape", [(3, 1, 1, 4), (1, 2, 1, 4)], ids=["batch-3-for-2", "groups-2-for-1"])
def test_uniform_mean_refuses_a_key_mask_for_other_batches_or_groups(shape):
    """Bug: uniform_mean took a key_mask whose batch or group size was neither 1 nor x's: a batch of 3 for 2
    failed with a bare broadcasting RuntimeError, and 2 groups for 1 silently widened the output to
    (B, 2, M, C) instead of the documented (B, G, M, C). Now a ValueError naming the expected shape."""
    x = torch.randn(2, 1, 4, 3)
    with pytest.raises(ValueError, match=r"key_mask must have shape \(B or 1, G or 1, 1, M\) = \(2 or 1, 1 or 1, 1, 4\)"):
        uniform_mean(x, torch.ones(shape, dtype=torch.bool))
    # the admissible shapes still broadcast: (1, 1, 1, M) and (B, G, 1, M)
    keys = torch.tensor([True, False, True, True]).view(1, 1, 1, 4)
    want = (x * keys.transpose(-1, -2)).sum(-2, keepdim=True) / 3
    torch.testing.assert_close(uniform_mean(x, keys), want.expand_as(x))
    torch.testing.assert_close(uniform_mean(x, keys.expand(2, 1, 1, 4)), want.expand_as(x))


# ---------------------------------------------------------------------------- the property harness
class _SlightlyOff(DiffusionOperator):
    """Attention in the coefficients (sparse path) but ``P v + 1e-6 v`` as a matrix (dense path)."""

    name = "slightly-off-test"
    is_polynomial = False
    degree = 1

    def coefficients(self) -> Tensor:
        return torch.tensor([0.0, 1.0])

    def apply_matrix(self, P: Tensor, v: Tensor) -> Tensor:
        return P @ v + 1e-6 * v


class _SeesTheFuture(_SlightlyOff):
    """``P v`` plus the mean of every value (also the later ones); dense only."""

    supports_sparse = False

    def apply_matrix(self, P: Tensor, v: Tensor) -> Tensor:
        return P @ v + 0.5 * v.mean(-2, keepdim=True)


class _PositionDependent(_SeesTheFuture):
    """``P v`` plus a term that grows with the position: causal, but not permutation-equivariant."""

    def apply_matrix(self, P: Tensor, v: Tensor) -> Tensor:
        pos = torch.arange(v.shape[-2], dtype=v.dtype).view(-1, 1)
        return P @ v + 0.1 * pos


class _WrongStatic(DiffusionOperator):
    name = "wrong-static-test"
    degree = 1

    def coefficients(self) -> Tensor:
        return torch.tensor([0.0, 1.0])

    def static_coefficients(self):
        return (0.5, 0.5)


class _WrongShape(_WrongStatic):
    degree = 2

    def static_coefficients(self):
        return None


class _NotFinite(_WrongShape):
    degree = 1

    def coefficients(self) -> Tensor:
        return torch.tensor([0.0, float("nan")])


class _EdgeOrderSensitive(AttnScaleOperator):
    """AttnScale, plus ``1e-3`` on the sparse path whenever the edges are not sorted by (target, source)."""

    def apply_context(self, ctx) -> Tensor:  # noqa: ANN001
        out = super().apply_context(ctx)
        if ctx.is_sparse:
            ei = ctx._edge_index
            key = ei[1] * ctx.v.shape[2] + ei[0]
            out = out + 1e-3 * float(not bool((key[1:] >= key[:-1]).all()))
        return out


@pytest.mark.parametrize("op,match", [
    (_SlightlyOff(), r"sparse vs dense \(causal=False\): max abs difference"),
    (_SeesTheFuture(), "causal output before position 1 saw the future"),
    (_PositionDependent(), "dense output is not permutation-equivariant"),
    (_WrongStatic(), r"static_coefficients\(\) disagrees with coefficients\(\)"),
    (_WrongShape(), r"coefficients have shape \(2, 2\), expected \(2, 3\)"),
    (_NotFinite(), "coefficients are not finite"),
    (_EdgeOrderSensitive(omega=0.7), "sparse output depends on edge order"),
], ids=["tolerance", "causality", "permutation", "static", "shape", "finite", "edge-order"])
def test_assert_operator_names_the_law_a_broken_operator_breaks(op, match):
    """kills: harness.assert_operator with a float64 tolerance of 1e-4 instead of 1e-10, without its causality,
    dense permutation, static-coefficient, coefficient-shape, finiteness or edge-order law, or comparing the sparse
    output with itself instead of the dense one"""
    with pytest.raises(AssertionError, match=match):
        assert_operator(op)
