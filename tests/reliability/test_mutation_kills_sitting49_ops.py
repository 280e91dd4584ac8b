"""Mutation audit (sitting 49) of the ops engines: ops/dense.py, ops/engine.py, ops/sparse.py, ops/recompute.py,
ops/rivals.py, ops/uniform_map.py, ops/_checks.py and ops/reference.py: tests that kill mutants the earlier tests
left alive (each docstring names the mutant). No GPU is used; the references are float64 matrices built by hand
(softmax with masks, ``c_0 I + c_1 P`` and ``P^2``, the edge softmax of a two-node graph) or explicit derivatives.

96 mutants (dense.py 17, engine.py 15, sparse.py 12, recompute.py 12, rivals.py 10, uniform_map.py 10, _checks.py 12,
reference.py 8): 75 killed by earlier tests (the modules' doctests and the earlier audits included), 15 survivors
killed here (dense.py 4, engine.py 1, sparse.py 1, recompute.py 4, rivals.py 1, _checks.py 2, reference.py 2), 6
equivalent; no survivor was a library bug (each was a gap in the tests), so the library is unchanged:

* dense.py ``_diffuse_dense`` ``0 < len(affine_heads[0]) < H`` -> ``<= H``: the only caller that passes
  ``affine_heads`` (:class:`~diffusionformer.nn.DiffusionAttention`) builds the plan only when it covers fewer than
  ``H`` heads (``if heads and len(heads) < self.num_heads``), so the plan never holds every head.
* dense.py ``_diffuse_dense`` (``"auto"`` materialising ``P`` for some heads) ``low = (... degrees[h] == 1)`` ->
  ``<= 1``: a degree-0 head in ``low`` is propagated zero times by ``polynomial``; its output ``c_0 v`` is already
  in the accumulator (``out = v * c[0]``), so both give the same bits.
* engine.py ``_head_runs`` ``runs[-1][1] == h`` -> ``>= h``: head subsets are strictly increasing (the documented
  contract of every head tuple), so the last run's stop, the previous head plus one, is never above ``h``.
* engine.py ``_coefficient_blocks`` ``act == prev`` -> ``len(act) == len(prev)``: the heads active at a step are a
  subset of the previous step's (degrees only drop out as the step grows; step 1's ``prev`` is every head), so
  equal lengths mean equal tuples.
* rivals.py ``RivalContext.attend`` the zero-padding of ``q``, ``k``, ``x`` to one width dropped: zero columns change
  no score (the scale is explicit) and are sliced off the output, so only the SDPA kernel chosen (fused or the
  slower math path) changes, not the values.
* reference.py ``_matrix_exp`` ``matrix_exp(A.expand(2, N, N))[0]`` -> ``[1]``: both matrices of the batch are the
  same copy of ``A``, computed by the same batched code path.
"""

from __future__ import annotations

import pytest
import torch


def _dense_P(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The float64 row-stochastic ``softmax(q k^T / sqrt(C) + bias)`` built by hand (no library code)."""
    q, k = q.double(), k.double()
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if bias is not None:
        s = s + bias.double()
    s = s - s.amax(-1, keepdim=True)
    e = s.exp()
    return e / e.sum(-1, keepdim=True)


def test_kills_choose_dense_backend_negative_sizes_refused():
    """kills: ops/dense.py ``choose_dense_backend`` ``if value < 0:`` -> ``if value < -1:`` (a size of -1, e.g. a
    ``q.shape[2] - 1`` gone wrong, was answered ``"matrix"``, as if -4 elements fit the limit). Each argument."""
    from diffusionformer.ops.dense import choose_dense_backend

    for args, name in (((-1, 4, 2), "num_queries"), ((4, -1, 2), "num_keys"), ((4, 4, -1), "max_degree")):
        with pytest.raises(ValueError, match=rf"{name} must be a non-negative int, got -1"):
            choose_dense_backend(*args)
    assert choose_dense_backend(0, 0, 0) == "sdpa"  # 0 is allowed: the boundary itself


def test_kills_diffuse_refuses_non_square_P_with_static_attention():
    """kills: ops/dense.py ``_check_v`` ``if q.shape[2] != k.shape[2]:`` dropped (N queries against M != N keys with
    static plain-attention coefficients returned the one-step attention ``(B, H, N, C)`` silently: diffusion applies
    ``P`` repeatedly, so the documented contract is a square ``P``)."""
    from diffusionformer.ops.dense import diffuse, diffuse_with_weights

    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 2)
    for coeffs in ([0.0, 1.0], [1.0, -1.0], torch.tensor([0.0, 1.0])):
        with pytest.raises(ValueError, match=r"P must be square.*got N=3 and M=5"):
            diffuse(q, k, v, coeffs)
    with pytest.raises(ValueError, match=r"P must be square"):
        diffuse_with_weights(q, k, v, [0.0, 1.0], need_weights=True)


def test_kills_autocast_float16_clamps_large_finite_biases():
    """kills: ops/dense.py ``_normalise_mask`` ``if info.max < torch.finfo(attn_mask.dtype).max:`` -> ``>`` (under a
    CPU float16 autocast a row of finite -1e9 biases overflowed to -inf in float16 and became a masked row: output 0
    instead of attention over the row, which the docstring of ``diffuse`` promises "still attends"). Checked against
    the float64 softmax built by hand (a constant bias on a row cancels in the softmax)."""
    from diffusionformer.ops.dense import diffuse

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g) for _ in range(3))
    mask = torch.zeros(1, 1, 4, 4)
    mask[..., 1, :] = -1e9  # every key of row 1 equally penalised: P's row 1 is the unmasked softmax
    mask[..., 2, 3] = float("-inf")
    want = _dense_P(q, k, torch.where(mask == -1e9, 0.0, mask)) @ v.double()
    with torch.autocast("cpu", dtype=torch.float16):
        P = _dense_P(q, k, torch.where(mask == -1e9, 0.0, mask))
        two_step = 0.5 * v.double() + 0.25 * P @ v.double() + 0.25 * P @ P @ v.double()
        for coeffs, ref in (([0.0, 1.0], want), (torch.tensor([0.0, 1.0]), want), ([0.5, 0.25, 0.25], two_step)):
            out = diffuse(q, k, v, coeffs, attn_mask=mask)
            assert out.dtype == torch.float16
            torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
            assert out[..., 1, :].abs().sum() > 0.1  # the row still attends


def test_kills_sdpa_replay_refuses_a_step_out_of_order():
    """kills: ops/dense.py ``_SdpaReplay.propagate`` ``if y.shape != x.shape:`` dropped (a replay asked for the
    recorded steps in another order, e.g. a combination that propagates its head groups the other way round, handed
    back the recorded output of another head set: the rebuilt tensor of ``ops.recompute`` was then silently wrong or
    failed later with a broadcast error that names nothing). The recorded rows are zeroed as on the forward pass."""
    from diffusionformer.ops.dense import _SdpaReplay

    two_heads, one_head = torch.randn(1, 2, 3, 4), torch.randn(1, 1, 3, 4)
    row_ok = torch.tensor([True, False, True]).view(1, 1, 3, 1)
    replay = _SdpaReplay([(two_heads, None), (one_head, row_ok)])
    assert torch.equal(replay.propagate(torch.empty(1, 2, 3, 4), (0, 1)), two_heads)
    got = replay.propagate(torch.empty(1, 1, 3, 4), (1,))
    assert torch.equal(got, one_head.masked_fill(~row_ok, 0.0))
    replay = _SdpaReplay([(two_heads, None), (one_head, None)])
    with pytest.raises(RuntimeError, match=r"step 1 recorded \(1, 2, 3, 4\) but is asked for \(1, 1, 3, 4\)"):
        replay.propagate(torch.empty(1, 1, 3, 4), (1,))


@pytest.mark.parametrize("inplace", [None, False])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_kills_combine_affine_run_past_the_last_head_never_widens_the_output(inplace, requires_grad):
    """kills: ops/engine.py ``_head_columns`` ``if stop > num_heads or ...`` dropped (a run past the last head grew the
    Python coefficient lists beyond ``H``; with one head the ``(L, 1)`` columns broadcast against ``(1, C)`` and
    ``combine_affine`` returned an output with ``L`` heads instead of refusing the run). The same run inside the
    heads is combined as ``c0 v + c1 y`` (hand-computed)."""
    from diffusionformer.ops.engine import combine_affine

    g = torch.Generator().manual_seed(0)
    y, v = torch.randn(1, 3, 1, 2, generator=g), torch.randn(1, 3, 1, 2, generator=g)
    with pytest.raises(RuntimeError, match=r"exceeds dimension size \(1\)"):
        combine_affine(y.clone().requires_grad_(requires_grad), v, [(0, 2, 1.0, -1.0)], inplace=inplace)
    out = combine_affine(y.clone().requires_grad_(requires_grad), v, [(0, 1, 0.5, 2.0)], inplace=inplace)
    torch.testing.assert_close(out, 0.5 * v + 2.0 * y, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.bool])
def test_kills_sparse_edge_index_of_a_narrow_or_bool_dtype_refused(dtype):
    """kills: ops/sparse.py ``check_edge_index`` ``edge_index.dtype not in (torch.int64, torch.int32)`` -> a tuple that
    also holds uint8, int16 and bool (a bool ``(2, E)`` tensor, e.g. a mask passed by mistake, became edges between
    nodes 0 and 1 through ``.long()``; a uint8 one wraps node ids past 255). Every public entry point refuses it;
    the same edges as int32 are taken (checked against the hand-built edge softmax of a two-node graph)."""
    from diffusionformer.ops.sparse import diffuse_sparse, edge_attention, propagate_sparse

    q, k, v = torch.zeros(2, 1, 4), torch.zeros(2, 1, 4), torch.tensor([[[1.0]], [[3.0]]])
    edges = torch.tensor([[0, 1, 1], [1, 1, 0]])
    msg = rf"edge_index must be an integer tensor \(int64 or int32\), got {dtype}"
    with pytest.raises(TypeError, match=msg):
        edge_attention(q, k, edges.to(dtype))
    with pytest.raises(TypeError, match=msg):
        propagate_sparse(torch.ones(3, 1), v, edges.to(dtype))
    with pytest.raises(TypeError, match=msg):
        diffuse_sparse(q, k, v, edges.to(dtype), [0.0, 1.0])
    # node 1 <- {0, 1} equally (zero scores), node 0 <- {1}: P = [[0, 1], [1/2, 1/2]]
    out = diffuse_sparse(q, k, v, edges.to(torch.int32), [0.0, 1.0])
    assert out.flatten().tolist() == [3.0, 2.0]


def test_kills_recompute_saved_keeps_views_in_the_gaps_of_a_strided_z():
    """kills: ops/recompute.py ``_span`` ``dense = dense and stride == expected`` -> ``dense = dense``, and
    ``_RecomputeSaved`` ``if z_dense and lo <= first and last <= hi:`` -> ``if lo <= first and last <= hi:`` (a view of
    z's base lying in the gaps between z's rows, here ``base[0:3, 3:]`` beside ``z = base[:, :3]``, was stored as a
    recipe on z: rebuilt from ``fn()``, which holds z's elements only, it read the gaps, and the weight gradient of a
    linear layer on it was silently wrong). Reference: the same graph without the context."""
    from diffusionformer.ops.recompute import recompute_saved

    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 6, dtype=torch.float64, generator=g, requires_grad=True)
    w0 = torch.randn(2, 3, dtype=torch.float64, generator=g)

    def fn() -> torch.Tensor:  # z's values, shape, strides and dtype; nothing in the gaps between its rows
        out = torch.zeros(21, dtype=torch.float64).as_strided((4, 3), (6, 1))
        return out.copy_(a.detach()[:, :3] * 2.0)

    grads = []
    for use_context in (False, True):
        w = w0.clone().requires_grad_(True)
        base = a * 2.0
        z, gap = base[:, :3], base[0:3, 3:]
        if use_context:
            with recompute_saved(z, fn):
                y = torch.nn.functional.linear(gap, w).sum() + torch.nn.functional.linear(z, w).sum()
        else:
            y = torch.nn.functional.linear(gap, w).sum() + torch.nn.functional.linear(z, w).sum()
        y.backward()
        grads.append(w.grad)
    want = (a.detach()[0:3, 3:] * 2.0).sum(0) + (a.detach()[:, :3] * 2.0).sum(0)  # d/dw of sum(x w^T): column sums
    torch.testing.assert_close(grads[0], want.expand(2, 3), rtol=0, atol=1e-12)
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


def test_kills_recompute_saved_keeps_a_view_of_z_with_another_dtype():
    """kills: ops/recompute.py ``_RecomputeSaved`` pack ``if t.dtype is dtype and (...)`` -> ``if (...)`` (a view of z
    in another dtype, ``torch.view_as_real`` of a complex z, shares z's base: it was stored as a recipe on z and
    rebuilt in z's complex dtype, so the gradient of the weight it multiplies was not its real parts).
    Reference: ``dL/dw = t`` for ``L = sum(t * w)``."""
    from diffusionformer.ops.recompute import recompute_saved

    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, dtype=torch.complex128, generator=g, requires_grad=True)
    w = torch.randn(2, dtype=torch.float64, generator=g, requires_grad=True)
    z = a * 2.0
    t = torch.view_as_real(z)[0]  # (2,) float64: the real and imaginary parts of z[0]
    with recompute_saved(z, lambda: a.detach() * 2.0):
        loss = (t * w).sum()
    loss.backward()
    assert w.grad is not None and w.grad.dtype == torch.float64
    torch.testing.assert_close(w.grad, torch.view_as_real(a.detach() * 2.0)[0], rtol=0, atol=0)


def test_kills_recompute_saved_empty_z_spans_no_element():
    """kills: ops/recompute.py ``_span`` ``return first, first - 1, True`` -> ``return first, first, True`` (an empty
    z was taken to span the element at its offset, so a one-element view of z's base there, ``base[0, 0:1]`` beside
    ``z = base[:, :0]``, was stored as a recipe on z and rebuilt from ``fn()``, which holds no element of it: the
    gradient of the weight it multiplies came out 0). Reference: ``dL/dw = t`` for ``L = sum(t * w)``."""
    from diffusionformer.ops.recompute import recompute_saved

    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(1, dtype=torch.float64, generator=g, requires_grad=True)
    base = a * 2.0
    z, t = base[:, :0], base[0, 0:1]
    # z's shape (2, 0), strides (3, 1) and dtype, over a storage of zeros (z has no element to rebuild)
    with recompute_saved(z, lambda: torch.zeros(1, dtype=torch.float64).as_strided((2, 0), (3, 1))):
        loss = (t * w).sum() + (z.sum(1) * w).sum()
    loss.backward()
    torch.testing.assert_close(w.grad, a.detach()[0, 0:1] * 2.0, rtol=0, atol=0)


@pytest.mark.parametrize("bad", [3, -1])
def test_kills_index_range_checked_for_a_single_index(bad):
    """kills: ops/_checks.py ``check_index_range`` ``index.numel() > 0`` -> ``index.numel() > 1`` (a one-element index
    was never checked: ``scatter_sum`` of one message to node 3 of 3, or to node -1, reached the kernel, which fails
    without naming the argument or, for -1, wraps to the last node silently). An empty index is still taken."""
    from diffusionformer.ops._checks import check_index_range
    from diffusionformer.ops.scatter import scatter_sum

    with pytest.raises(ValueError, match=rf"index values must lie in \[0, dim_size=3\), got range \[{bad}, {bad}\]"):
        scatter_sum(torch.ones(1, 2), torch.tensor([bad]), 3)
    with pytest.raises(ValueError, match=rf"got range \[{bad}, {bad}\]"):
        check_index_range("index", torch.tensor([bad]), "dim_size", 3)
    check_index_range("index", torch.tensor([], dtype=torch.long), "dim_size", 3)
    assert scatter_sum(torch.ones(1, 2), torch.tensor([2]), 3).tolist() == [[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]


def test_kills_backend_hint_for_a_misspelt_name_shared_by_both_kinds():
    """kills: ops/_checks.py ``_backend_hint`` ``if name in other and name not in valid:`` -> ``if name in other:``
    (``backend="AUTO"``, a misspelling of a name both engines share, was explained as "a back-end of sparse graphs"
    on the dense path and of "dense (B, H, N, C) inputs" on the sparse one, instead of "did you mean 'auto'?"). A
    name of the other kind only keeps its note."""
    from diffusionformer.ops.dense import diffuse
    from diffusionformer.ops.sparse import diffuse_sparse

    q = k = v = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match=r"got 'AUTO' \(did you mean 'auto'\?\)$"):
        diffuse(q, k, v, [0.0, 1.0], backend="AUTO")
    with pytest.raises(ValueError, match=r"got 'csr' \('csr' is a back-end of sparse graphs: pass edge_index\)$"):
        diffuse(q, k, v, [0.0, 1.0], backend="csr")
    qs = torch.zeros(2, 1, 4)
    edges = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match=r"got 'AUTO' \(did you mean 'auto'\?\)$"):
        diffuse_sparse(qs, qs, qs, edges, [0.0, 1.0], backend="AUTO")


def test_kills_layer_state_negative_depth_refused():
    """kills: ops/rivals.py ``LayerState.__post_init__`` ``... or depth < 0`` dropped (``LayerState(depth=-1)``, built
    by hand, was taken: the first layer then read depth -1, which differential attention's ``lambda_init`` schedule
    turns into a value no layer of the model has). Depth 0 stays the default and is taken."""
    from diffusionformer.ops.rivals import LayerState

    with pytest.raises(ValueError, match=r"LayerState\.depth: expected a non-negative int, got -1"):
        LayerState(depth=-1)
    state = LayerState(depth=0)
    assert state.enter(torch.ones(1, 1, 2, 1)) == (0, None) and state.depth == 1


def test_kills_dense_attention_reference_fully_masked_row_has_zero_gradients():
    """kills: ops/reference.py ``dense_attention_reference`` ``m = torch.where(torch.isfinite(m), m, 0)`` dropped (a row
    with no allowed key kept the shift ``-inf``: its masked entries became ``exp(-inf - -inf) = exp(nan)`` in the
    branch ``torch.where`` discards, whose backward ``0 * nan`` is NaN: the final gradients stay finite, the ``where``
    drops it, but under ``torch.autograd.detect_anomaly()``, the tool for hunting NaN gradients, the backward pass
    raised "Function 'ExpBackward0' returned nan values" for a model with nothing wrong, against the docstring's "zero,
    with zero gradients"). Reference: the hand-built softmax of the allowed rows."""
    from diffusionformer.ops.reference import dense_attention_reference

    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    allowed = torch.tensor([[True, True, False], [False, False, False], [True, True, True]])
    P = dense_attention_reference(q, k, allowed=allowed)
    want = _dense_P(q.detach(), k.detach(), torch.zeros(3, 3).masked_fill(~allowed, float("-inf")).double())
    want[1] = 0.0
    torch.testing.assert_close(P.detach(), want, rtol=0, atol=1e-15)
    with pytest.warns(UserWarning, match="Anomaly Detection"), torch.autograd.detect_anomaly():
        (P * torch.arange(9.0, dtype=torch.float64).view(3, 3)).sum().backward()  # no NaN in any backward step
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
    assert torch.equal(q.grad[1], torch.zeros(4, dtype=torch.float64))  # the empty row's query gets no gradient


def test_kills_dense_attention_reference_without_keys_is_empty():
    """kills: ops/reference.py ``dense_attention_reference`` ``if s.shape[-1] == 0: return s.clone()`` dropped (with no
    key, M = 0, the row maximum over no entry raised torch's "reduction dim -1 to have non-zero size" instead of the
    ``(N, 0)`` matrix ``torch.softmax`` gives)."""
    from diffusionformer.ops.reference import dense_attention_reference

    P = dense_attention_reference(torch.randn(2, 1, 3, 4), torch.randn(2, 1, 0, 4))
    assert P.shape == (2, 1, 3, 0) and P.dtype == torch.float64
    assert P.shape == torch.softmax(torch.empty(2, 1, 3, 0), -1).shape
