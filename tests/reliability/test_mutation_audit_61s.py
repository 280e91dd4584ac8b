"""Mutation audit 61s of the functional entry points (``diffusionformer.functional``: ``diffuse``,
``diffuse_with_weights``, ``diffuse_sparse``, re-exported from ``ops/dense.py`` and ``ops/sparse.py``) and of the
engine (``ops/engine.py``: head grouping, back-end choice, coefficient handling, masks, dropout, ``need_weights``).

Each test kills a mutant that the engine and functional tests let through (its docstring names the file and the
mutation) and checks the code against independent references: ``P`` built in float64 from ``exp`` of the scores
entry by entry, its explicit matrix powers, hand-written values, or a documented property. Mutants judged
equivalent are listed, with the reason, at the end of the file. CPU only, deterministic, tiny sizes.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from diffusionformer.functional import (
    diffuse,
    diffuse_sparse,
    diffuse_sparse_with_weights,
    diffuse_with_weights,
)
from diffusionformer.ops.engine import (
    Backend,
    affine,
    affine_runs,
    combine_affine,
    polynomial,
    split_heads,
    static_coefficients,
)

f64 = torch.float64


def _qkv(B: int = 1, H: int = 3, N: int = 4, C: int = 2, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, N, C, generator=g, dtype=f64) for _ in range(3))  # type: ignore[return-value]


def _explicit_P(q: Tensor, k: Tensor, allowed: Tensor | None = None) -> Tensor:
    """``softmax(q k^T / sqrt(C))`` over the admissible keys (``allowed``: bool, broadcastable to ``(B, H, N, N)``),
    as ``exp`` of the scores normalised row by row in float64; a zero row for a query without keys."""
    q, k = q.to(f64), k.to(f64)
    w = torch.exp((q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5)
    if allowed is not None:
        w = w * allowed.to(f64)
    s = w.sum(-1, keepdim=True)
    return torch.where(s > 0, w / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(w))


def _reference(P: Tensor, v: Tensor, rows: list[list[float]]) -> Tensor:
    """``sum_k c_{h,k} P_h^k v_h`` by explicit matrix powers in float64."""
    out = torch.zeros_like(v, dtype=f64)
    for h, row in enumerate(rows):
        power = torch.eye(P.shape[-1], dtype=f64).expand_as(P[:, h])
        for c in row:
            out[:, h] += c * (power @ v[:, h].to(f64))
            power = power @ P[:, h]
    return out


# ---------------------------------------------------------------------------- split_heads
def test_split_heads_of_a_token_major_tensor_gives_a_token_major_gradient() -> None:
    """engine.py ``split_heads``: ``t.stride(1) < t.stride(2)`` -> ``>`` (the values are the same either way; the
    documented point of the token-major split is the layout of the gradient, which the projection's ``view``
    then takes without a copy)."""
    x = torch.randn(2, 5, 4, 3, requires_grad=True)  # (B, N, H, C), as the layers' projections store it
    t = x.transpose(1, 2)  # (B, H, N, C) view, token-major
    seen = []
    t.register_hook(lambda g: seen.append(g.stride()))
    a, b = split_heads(t, (0, 1), (2, 3), 1)
    assert torch.equal(a, t[:, :2]) and torch.equal(b, t[:, 2:])
    (a.sum() * 2 + b.sum() * 3).backward()
    (g_stride,) = seen
    assert g_stride[1] < g_stride[2], f"gradient of a token-major tensor came head-major: strides {g_stride}"
    assert torch.equal(x.grad, torch.cat([torch.full((2, 5, 2, 3), 2.0), torch.full((2, 5, 2, 3), 3.0)], 2))


# ---------------------------------------------------------------------------- back-end output shapes
def test_polynomial_refuses_a_backend_result_of_the_wrong_shape_but_the_right_rank() -> None:
    """engine.py ``_shaped_as``: ``y.shape != x.shape`` -> ``y.dim() != x.dim()`` (a back-end that returns one
    token per sequence would broadcast into every row of the sum silently)."""

    class OneRow(Backend):
        name = "one-row"

        def propagate(self, x: Tensor, heads: tuple[int, ...]) -> Tensor:
            return x.mean(-2, keepdim=True)  # (B, H, 1, C): broadcasts against (B, H, N, C)

    v = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"must return P x, of the shape of x \(1, 2, 3, 4\), got \(1, 2, 1, 4\)"):
        polynomial(OneRow(), v, torch.tensor([[1.0, 1.0], [0.0, 1.0]]), (1, 1))


# ---------------------------------------------------------------------------- static coefficients
def test_a_tuple_of_bools_is_refused_even_after_the_equal_floats_were_cached() -> None:
    """engine.py ``static_coefficients``: ``type(r) is float`` -> ``type(r) in (float, bool)`` (``True == 1.0``
    and their hashes agree, so the cache handed the bools the rows of ``(1.0, 0.0)``)."""
    assert static_coefficients((1.0, 0.0), 2) == ((1.0, 0.0), (1.0, 0.0))  # cached now
    with pytest.raises(TypeError, match="must hold numbers"):
        static_coefficients((True, False), 2)


def test_flat_static_coefficients_refuse_bools() -> None:
    """engine.py ``_static_rows``: ``not isinstance(c, bool)`` dropped for a flat ``(K+1,)`` list (``[True, False]``
    became the rows ``(1.0, 0.0)``: a bool is no coefficient)."""
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"must hold numbers \(K\+1,\)"):
        diffuse(q, k, v, [True, False])


def test_one_static_row_is_shared_by_every_head() -> None:
    """engine.py ``_static_rows``: ``if len(rows) == 1: rows *= num_heads`` -> ``== 0`` (a ``(1, K+1)`` list was
    refused for ``H > 1``, although the docs accept it as a ``(1, K+1)`` tensor is)."""
    q, k, v = _qkv(H=3)
    P = _explicit_P(q, k)
    for row in ([1.0, -1.0], [0.5, 0.25, 0.25]):
        out = diffuse(q, k, v, [row])
        torch.testing.assert_close(out, _reference(P, v, [row] * 3))
        assert static_coefficients([row], 3) == (tuple(row),) * 3


def test_fewer_static_rows_than_heads_are_refused() -> None:
    """engine.py ``_static_rows``: ``len(rows) != num_heads`` -> ``len(rows) > num_heads`` (two rows for three heads
    were taken, the third head's coefficients silently missing)."""
    q, k, v = _qkv(H=3)
    with pytest.raises(ValueError, match=r"coeffs has 2 rows but the inputs have H=3 heads"):
        diffuse(q, k, v, [[0.0, 1.0], [1.0, -1.0]])


# ---------------------------------------------------------------------------- the affine pass
def test_laplacian_heads_around_an_attention_head_stay_separate_runs() -> None:
    """engine.py ``_affine_runs``: ``runs[-1][1] == h and runs[-1][2:] == (a, b)`` -> ``runs[-1][2:] == (a, b)``
    (heads 0 and 2 Laplacian around attention head 1 became one run ``0..2``: head 1 turned Laplacian)."""
    assert affine_runs((1.0, 0.0, 1.0), (-1.0, 1.0, -1.0)) == ((0, 1, 1.0, -1.0), (2, 3, 1.0, -1.0))
    q, k, v = _qkv(H=3)
    rows = [[1.0, -1.0], [0.0, 1.0], [1.0, -1.0]]
    torch.testing.assert_close(diffuse(q, k, v, rows), _reference(_explicit_P(q, k), v, rows))


# ---------------------------------------------------------------------------- path and back-end choice
def _complete_edges(N: int) -> Tensor:
    src, dst = torch.meshgrid(torch.arange(N), torch.arange(N), indexing="ij")
    return torch.stack([src.flatten(), dst.flatten()])


def test_degree_zero_static_coefficients_never_read_P() -> None:
    """dense.py ``_diffuse_dense`` and sparse.py ``_diffuse_sparse``: ``len(coeffs[0]) == 2`` -> ``<= 2`` (static
    rows of degree 0 took the affine path: one propagation and ``c0 v + 0 * P v``, where an infinite value of one
    token turned every other token's output into NaN; ``c0 v`` is exact)."""
    q, k, v = _qkv(N=4)
    v[0, 1, 0, 0] = float("inf")
    assert torch.equal(diffuse(q, k, v, [2.0]), 2.0 * v)
    qs, ks, vs = (t[0].transpose(0, 1) for t in (q, k, v))  # (N, H, C)
    assert torch.equal(diffuse_sparse(qs, ks, vs, _complete_edges(4), [2.0]), 2.0 * vs)


def test_backend_matrix_never_calls_the_fused_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """dense.py ``_diffuse_dense``: ``backend != "matrix"`` dropped from the static affine path or from the static
    split, and ``diffuse`` handing its back-end on as ``"sdpa"`` (``backend="matrix"`` materialises ``P``: the fused
    kernel must not run, whatever the coefficients)."""
    q, k, v = _qkv(H=3)
    P = _explicit_P(q, k)

    def refused(*args: object, **kwargs: object) -> Tensor:
        raise AssertionError("the fused kernel ran under backend='matrix'")

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", refused)
    rows = [[1.0, -1.0, 0.0], [0.5, 0.25, 0.25], [0.0, 1.0, 0.0]]
    for coeffs, degrees, ref_rows in (([1.0, -1.0], None, [[1.0, -1.0]] * 3), (rows, (1, 2, 1), rows)):
        out = diffuse(q, k, v, coeffs, degrees=degrees, backend="matrix")
        torch.testing.assert_close(out, _reference(P, v, ref_rows))


def test_static_split_picks_the_backend_for_the_highest_degree(monkeypatch: pytest.MonkeyPatch) -> None:
    """dense.py ``_split_paths``: ``max(deg_high)`` -> ``min(deg_high)`` (for ``N = 192`` a ``K = 8`` head beside a
    ``K = 2`` head is materialised by ``"auto"``; the rule for ``K = 2`` ran 8 fused calls instead of 1)."""
    calls = []
    fused = torch.nn.functional.scaled_dot_product_attention

    def counted(*args: object, **kwargs: object) -> Tensor:
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    q, k, v = (t.float() for t in _qkv(H=3, N=192))
    rows = [[1.0, -1.0] + [0.0] * 7, [0.5, 0.25, 0.25] + [0.0] * 6, [0.1] * 9]
    out = diffuse(q, k, v, rows, degrees=(1, 2, 8))
    assert len(calls) == 1  # the affine head's call; the K-step heads share one materialised P
    torch.testing.assert_close(out, _reference(_explicit_P(q, k), v, rows).float(), atol=1e-5, rtol=1e-4)


def test_per_head_masks_follow_their_heads_on_the_static_split() -> None:
    """dense.py ``_split_paths``: the mask's heads, or the rows-with-keys' heads, handed to the wrong group (the
    affine heads ``0, 1`` got the mask of heads ``0, 1`` for the ``K``-step heads too, or swapped row masks)."""
    q, k, v = _qkv(H=4, N=5)
    g = torch.Generator().manual_seed(3)
    allowed = torch.rand(1, 4, 5, 5, generator=g) < 0.6
    allowed[0, 0, 1] = False  # a query without keys in head 0 only
    allowed[0, 3, 2] = False  # and in head 3 only
    allowed[0, 2, 4] = True
    rows = [[1.0, -1.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.25, 0.25], [0.2, 0.3, 0.5]]
    out = diffuse(q, k, v, rows, degrees=(1, 1, 2, 2), attn_mask=allowed)
    torch.testing.assert_close(out, _reference(_explicit_P(q, k, allowed), v, rows))


def test_dropout_reaches_every_matrix_path() -> None:
    """dense.py: dropout lost on the ``need_weights`` matrix, on the ``K``-step heads ``"auto"`` materialises beside
    a degree-1 head, or in ``diffuse`` itself (with ``dropout_p = 0.5`` on a 4-token graph the output must differ
    from the undropped one; a mutant returns the undropped output exactly)."""
    q, k, v = _qkv(H=2, N=4)
    P = _explicit_P(q, k)
    c = torch.tensor([[0.5, 0.25, 0.25], [2.0, 1.0, 1.0]], dtype=f64)
    c1 = torch.tensor([[0.5, 0.25, 0.0], [2.0, 1.0, 1.0]], dtype=f64)
    calls = (
        lambda p: diffuse_with_weights(q, k, v, c, dropout_p=p, need_weights=True)[0],
        lambda p: diffuse(q, k, v, c, dropout_p=p, backend="matrix"),
        lambda p: diffuse(q, k, v, c1, dropout_p=p, degrees=(1, 2)),  # auto: head 1 alone materialises P
    )
    for call in calls:
        torch.manual_seed(0)
        dropped = call(0.5)
        undropped = call(0.0)
        assert not torch.allclose(dropped[:, 1], undropped[:, 1]), "dropout_p=0.5 changed nothing"
    torch.manual_seed(0)
    _, weights = diffuse_with_weights(q, k, v, c, dropout_p=0.5, need_weights=True)
    torch.testing.assert_close(weights, P)  # the weights returned are P itself, not a dropped copy


def test_half_precision_need_weights_returns_the_input_dtype() -> None:
    """dense.py ``diffuse_with_weights``/``_diffuse_dense`` and sparse.py ``_diffuse_sparse``: ``P`` (or ``out``)
    left in the float32 working dtype for bfloat16 inputs (documented: ``P`` in the input dtype)."""
    q, k, v = (t.to(torch.bfloat16) for t in _qkv(H=2, N=4))
    out, P = diffuse_with_weights(q, k, v, [0.5, 0.25, 0.25], need_weights=True)
    assert out.dtype == P.dtype == torch.bfloat16
    torch.testing.assert_close(P.double(), _explicit_P(q, k), atol=1e-2, rtol=1e-2)
    qs, ks, vs = (t[0].transpose(0, 1) for t in (q, k, v))
    out_s, w = diffuse_sparse_with_weights(qs, ks, vs, _complete_edges(4), [0.5, 0.25, 0.25])
    assert out_s.dtype == w.dtype == torch.bfloat16


def test_sparse_heads_stop_at_their_degree() -> None:
    """sparse.py ``_diffuse_sparse``: the per-head degrees replaced by the largest (a head of degree 1 then used its
    row's coefficient of ``P^2``, which the degrees say it does not use; dense and sparse must agree)."""
    q, k, v = _qkv(H=2, N=4)
    rows = [[0.0, 1.0, 3.0], [0.5, 0.25, 0.25]]
    used = [[0.0, 1.0, 0.0], [0.5, 0.25, 0.25]]
    ref = _reference(_explicit_P(q, k), v, used)
    torch.testing.assert_close(diffuse(q, k, v, torch.tensor(rows, dtype=f64), degrees=(1, 2)), ref)
    qs, ks, vs = (t[0].transpose(0, 1) for t in (q, k, v))
    out = diffuse_sparse(qs, ks, vs, _complete_edges(4), torch.tensor(rows, dtype=f64), degrees=(1, 2))
    torch.testing.assert_close(out, ref[0].transpose(0, 1))


def test_need_weights_with_static_degree_one_coefficients_returns_P() -> None:
    """dense.py ``_diffuse_dense``: ``not need_weights`` dropped from the static affine path (``[1, -1]`` with
    ``need_weights=True`` returned ``P = None``)."""
    q, k, v = _qkv(H=2)
    P = _explicit_P(q, k)
    out, weights = diffuse_with_weights(q, k, v, [1.0, -1.0], need_weights=True)
    torch.testing.assert_close(weights, P)
    torch.testing.assert_close(out, _reference(P, v, [[1.0, -1.0]] * 2))


# ---------------------------------------------------------------------------- combine_affine
def test_affine_with_inplace_false_leaves_the_propagated_signal_alone() -> None:
    """engine.py ``affine``: ``inplace=inplace`` -> ``inplace=None`` when handing it to ``combine_affine`` (without
    autograd history ``P v`` was overwritten although ``inplace=False`` promises it never is; the layers' replay of
    the kernel outputs reads it again)."""

    class Kept(Backend):
        name = "kept"

        def __init__(self, y: Tensor) -> None:
            self.y = y

        def propagate(self, x: Tensor, heads: tuple[int, ...]) -> Tensor:
            return self.y

    v = torch.randn(1, 2, 3, 4)
    y = torch.randn(1, 2, 3, 4)
    backend = Kept(y.clone())
    out = affine(backend, v, (1.0, 0.0), (-1.0, 1.0), inplace=False)
    assert torch.equal(backend.y, y)
    torch.testing.assert_close(out[:, 0], v[:, 0] - y[:, 0])
    assert torch.equal(out[:, 1], y[:, 1])


def test_half_precision_coefficients_not_exact_in_half_multiply_in_float32() -> None:
    """engine.py ``_head_columns``: ``_exact(a) and _exact(b)`` -> ``_exact(a)``, and ``_exact``'s significand one
    bit wider (a coefficient that float16 cannot hold, ``0.1`` or ``1 + 2**-11``, was rounded to float16 in the
    per-head columns; ``combine_affine`` documents float32 scalars). Cancellation shows the rounding."""
    h = torch.float16
    for c0, c1, v_val, y_val in ((1.0, 0.1, -100.0, 1000.0), (1.0 + 2.0**-11, 1.0, 2048.0, -2048.0)):
        v = torch.full((1, 1, 2, 1), v_val, dtype=h)  # (B, N, H, C): head 0 in the run, head 1 attention
        exact = c0 * v_val + c1 * y_val  # 0 and 1
        for grad in (False, True):
            y = torch.full((1, 1, 2, 1), y_val, dtype=h, requires_grad=grad)
            out = combine_affine(y, v, [(0, 1, c0, c1)])
            assert out[0, 0, 0, 0].item() == exact, (c0, c1, grad, out.flatten().tolist())
            assert out[0, 0, 1, 0].item() == y_val


def test_batched_gradients_of_the_affine_heads_with_gaps() -> None:
    """engine.py ``_affine_heads_backward_stock`` (the backward of ``AffineHeads`` under ``is_grads_batched``):
    ``g * c1`` and ``g * c0`` swapped, or the gap cursor set to ``start`` (heads outside the runs, before, between
    and after two runs whose coefficients float32 cannot hold, so that ``AffineHeads`` runs)."""
    g = torch.Generator().manual_seed(1)
    y = torch.randn(2, 3, 5, 2, generator=g, requires_grad=True)  # (B, N, H, C)
    v = torch.randn(2, 3, 5, 2, generator=g, requires_grad=True)
    runs = [(1, 2, 0.1, 0.3), (3, 4, 0.7, -0.2)]
    out = combine_affine(y, v, runs)
    grads = torch.randn(4, 2, 3, 5, 2, generator=g)
    dy, dv = torch.autograd.grad(out, (y, v), grads, is_grads_batched=True)
    c0 = torch.tensor([0.0, 0.1, 0.0, 0.7, 0.0]).view(5, 1)
    c1 = torch.tensor([1.0, 0.3, 1.0, -0.2, 1.0]).view(5, 1)
    torch.testing.assert_close(dy, grads * c1)
    torch.testing.assert_close(dv, grads * c0)


def test_combine_affine_inside_vmap_with_coefficients_not_exact_in_float32() -> None:
    """engine.py ``combine_affine`` under a ``torch.func`` transform: the rounded columns
    ``_head_columns(..., exact=False)`` -> ``exact=True`` (``None`` for ``0.1``: the call failed to unpack)."""
    y = torch.randn(3, 4, 2, 5, dtype=torch.float32)
    v = torch.randn(3, 4, 2, 5, dtype=torch.float32)
    runs = [(0, 1, 0.1, 0.3)]
    out = torch.func.vmap(lambda a, b: combine_affine(a, b, runs))(y, v)
    expected = torch.cat([0.1 * v.double()[..., :1, :] + 0.3 * y.double()[..., :1, :], y.double()[..., 1:, :]], -2)
    torch.testing.assert_close(out.double(), expected)


def test_queries_without_keys_get_zero_rows_whatever_the_kernel_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """dense.py ``_zero_rows``: the masked fill dropped (CPU's fused kernel already gives 0 on a query without an
    admissible key, some GPU kernels NaN; stood in for here by a kernel that writes NaN on such rows: the documented
    zero row of ``P`` must still come out, on the affine path and the loop)."""
    fused = torch.nn.functional.scaled_dot_product_attention

    def nan_rows(q: Tensor, k: Tensor, x: Tensor, attn_mask: Tensor | None = None, **kwargs: object) -> Tensor:
        y = fused(q, k, x, attn_mask=attn_mask, **kwargs)
        empty = (attn_mask == float("-inf")).all(-1, keepdim=True) if attn_mask.dtype != torch.bool \
            else ~attn_mask.any(-1, keepdim=True)
        return y.masked_fill(empty, float("nan"))

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", nan_rows)
    q, k, v = _qkv(H=2, N=4)
    allowed = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    allowed[0, 0, 2] = False  # query 2 has no key
    P = _explicit_P(q, k, allowed)
    for coeffs, rows in (([1.0, -1.0], [[1.0, -1.0]] * 2), (torch.tensor([0.5, 0.25, 0.25], dtype=f64),
                                                             [[0.5, 0.25, 0.25]] * 2)):
        out = diffuse(q, k, v, coeffs, attn_mask=allowed, backend="sdpa")
        torch.testing.assert_close(out, _reference(P, v, rows))


def test_sparse_causal_keeps_self_loops_and_earlier_sources() -> None:
    """sparse.py ``diffuse_sparse_with_weights``: ``edge_index[0] <= edge_index[1]`` -> ``<`` (``is_causal`` then
    dropped every self-loop too: node ``i`` no longer saw itself, and node 0 lost its only key)."""
    q, k, v = _qkv(H=2, N=4)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    rows = [[0.5, 0.25, 0.25]] * 2
    ref = _reference(_explicit_P(q, k, causal), v, rows)
    torch.testing.assert_close(diffuse(q, k, v, rows, is_causal=True), ref)
    qs, ks, vs = (t[0].transpose(0, 1) for t in (q, k, v))
    out, w = diffuse_sparse_with_weights(qs, ks, vs, _complete_edges(4), rows[0], is_causal=True)
    torch.testing.assert_close(out, ref[0].transpose(0, 1))
    src, dst = _complete_edges(4)
    torch.testing.assert_close(w, _explicit_P(q, k, causal)[0][:, dst, src].transpose(0, 1))


def test_dense_need_weights_is_causal() -> None:
    """dense.py ``_diffuse_dense``: the ``need_weights`` matrix built with ``is_causal=False`` (the returned ``P``
    and the output saw later tokens)."""
    q, k, v = _qkv(H=2, N=4)
    P = _explicit_P(q, k, torch.ones(4, 4, dtype=torch.bool).tril())
    rows = [[0.5, 0.25, 0.25]] * 2
    out, weights = diffuse_with_weights(q, k, v, rows[0], is_causal=True, need_weights=True)
    torch.testing.assert_close(weights, P)
    torch.testing.assert_close(out, _reference(P, v, rows))


def test_a_sparse_backend_name_is_refused_by_the_dense_entry() -> None:
    """dense.py ``diffuse_with_weights``: the back-end check widened to ``"csr"`` (a sparse back-end's name then ran
    the fused kernel silently instead of being refused with the hint to pass ``edge_index``)."""
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="backend must be one of"):
        diffuse(q, k, v, [1.0, -1.0], backend="csr")


def test_float64_inputs_stay_float64_under_autocast() -> None:
    """dense.py ``_autocast_dtype``: ``t.dtype != torch.float64`` dropped (float64 inputs under a bfloat16 autocast
    came back in bfloat16; autocast leaves float64 attention alone)."""
    q, k, v = _qkv(H=2, N=4)
    rows = [[0.5, 0.25, 0.25]] * 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = diffuse(q, k, v, rows[0])
    assert out.dtype == f64
    torch.testing.assert_close(out, _reference(_explicit_P(q, k), v, rows))


def test_half_precision_series_accumulate_in_float32() -> None:
    """dense.py ``_diffuse_dense``: ``work = work_dtype(v.dtype)`` -> ``v.dtype`` (the sum over 16 powers of a
    bfloat16 call on the fused kernel accumulated in bfloat16: each step rounded the running sum, max error 0.19
    here against 0.063 with the float32 accumulator, whose error is the bfloat16 rounding of each ``P^k v``)."""
    q, k, v = _qkv(H=2, N=8, C=4)
    c = torch.ones(17, dtype=f64)
    ref = diffuse(q, k, v, c, backend="matrix")
    out = diffuse(q.bfloat16(), k.bfloat16(), v.bfloat16(), c, backend="sdpa")
    assert out.dtype == torch.bfloat16
    assert (out.double() - ref).abs().max() < 0.1


def test_native_sparse_half_inputs_are_computed_in_float32() -> None:
    """sparse.py ``_diffuse_sparse``: the native path's ``vb = v.to(work)`` dropped (bfloat16 values were gathered,
    weighted and scattered in bfloat16; documented: half-precision inputs are computed in float32 and returned in
    their dtype, so the result is the float32 computation on the same inputs, rounded once)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(6, 2, 4, generator=g).bfloat16() for _ in range(3))
    edges = _complete_edges(6)
    for coeffs in ([0.1, 0.7], torch.tensor([0.3, 0.7, 0.1])):
        out = diffuse_sparse(q, k, v, edges, coeffs, backend="native")
        ref = diffuse_sparse(q.float(), k.float(), v.float(), edges, coeffs, backend="native")
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), ref.bfloat16().float(), atol=0.0, rtol=2.0**-8)


# ---------------------------------------------------------------------------- mutants judged equivalent
# engine.py ``_head_columns``: ``bits is None and exact`` -> ``bits is None``: ``bits`` is ``None`` only for dtypes
#   outside float16/bfloat16/float32/float64, which the entry points refuse.
# engine.py ``_head_columns``: ``stop > num_heads`` dropped: a run past ``H`` fails either way (a broadcast of the
#   longer columns, or ``narrow`` on the run-by-run path); ``affine_runs`` never makes one.
# engine.py ``split_heads``: ``len(head_runs(a)) == 1`` -> ``<= 1``: the loop never splits off an empty set of heads.
# dense.py ``_diffuse_dense``: ``0 < len(affine_heads[0]) < H`` -> ``<= H``: the layer hands over ``affine_heads``
#   only when fewer than ``H`` heads are affine.
# dense.py ``_diffuse_dense`` (auto, K-step heads materialised): ``degrees[h] == 1`` -> ``<= 1`` for the fused
#   group (a degree-0 head is never propagated: ``active_heads`` at step 1 leaves it out), and ``len(high) < H``
#   -> ``<= H`` (all heads K-step: the fused group is empty and gives ``c0 v``, the matrix group the rest).
# dense.py ``_split_paths``: the bool mask made additive for the ``"matrix"`` group too (the same ``P``: 0 and
#   ``-inf`` added instead of a masked fill; the rows without keys come from the original mask).
# dense.py ``_additive_cpu_mask``: ``-inf`` -> ``-1e9`` (``exp`` of it is 0 in float32/float64 and it is ``-inf``
#   in float16; rows without keys are zeroed from the row mask either way).
