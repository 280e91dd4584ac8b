"""Tests written in a mutation-testing audit of the rival operators' context and the dense back-end.

Each test kills a mutant of ``diffusionformer/ops/rivals.py`` (``RivalContext``,
``apply_context_groups``) or ``diffusionformer/ops/dense.py`` (argument checks, masks and their
causal folding, rows without keys, dtypes, the ``"auto"`` rule, the split and matrix paths) that the
rest of the suite let through (the docstring of each test names it), and checks the code against an
independent reference: explicit float64 softmax matrices and powers, hand-computed values and
the documented contract (bad input gets a clear error naming the argument). CPU only,
deterministic (seeded generators).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from diffusionformer.functional import dense_attention_reference, diffuse
from diffusionformer.ops import dense as _dense
from diffusionformer.ops.dense import (
    attention_matrix,
    choose_dense_backend,
    diffuse_with_weights,
    propagate_dense,
)
from diffusionformer.ops.rivals import RivalContext


def _qkv(B: int = 1, H: int = 2, N: int = 5, C: int = 4, seed: int = 0, dtype: torch.dtype = torch.float64):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, N, C, generator=g, dtype=torch.float64).to(dtype) for _ in range(3))


def _tril(N: int) -> Tensor:
    """Hand-built ``(N, N)`` bool lower triangle ``j <= i``, by explicit loops."""
    return torch.tensor([[j <= i for j in range(N)] for i in range(N)])


# ---------------------------------------------------------------------------- dense: argument checks
def test_q_and_k_of_different_head_widths_are_refused_by_name():
    """kills: dense.py _check_qk dropping ``q.shape[-1] != k.shape[-1]`` (SDPA's obscure error instead)"""
    q, _, v = _qkv(C=4)
    k = torch.zeros(1, 2, 5, 3, dtype=torch.float64)
    for call in (lambda: diffuse(q, k, v, [0.0, 1.0]), lambda: attention_matrix(q, k),
                 lambda: propagate_dense(q, k, v)):
        with pytest.raises(ValueError, match=r"q and k must share batch, heads and head_dim"):
            call()


def test_q_and_k_of_different_dtypes_are_refused_by_name():
    """kills: dense.py _check_qk dropping the dtype check of ``k`` against ``q``"""
    q, k, v = _qkv()
    for call in (lambda: diffuse(q, k.float(), v, [0.0, 1.0]), lambda: attention_matrix(q, k.float()),
                 lambda: propagate_dense(q, k.float(), v)):
        with pytest.raises(TypeError, match=r"q and k must have the same dtype, got torch.float64 and torch.float32"):
            call()


def test_values_of_another_length_are_refused_by_name():
    """kills: dense.py _check_v comparing only batch and heads of ``v`` with ``k`` (``[:3]`` -> ``[:2]``)"""
    q, k, _ = _qkv(N=5)
    v = torch.zeros(1, 2, 6, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"v must have shape \(B, H, M, C_v\) matching k \(1, 2, 5, 4\), got \(1, 2, 6, 4\)"):
        diffuse(q, k, v, [0.0, 1.0])


def test_values_of_another_dtype_are_refused_by_name():
    """kills: dense.py diffuse_with_weights dropping its dtype check of ``v`` against ``q``"""
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"v must have the dtype of q \(torch.float64\), got torch.float32"):
        diffuse(q, k, v.float(), [0.0, 1.0])
    with pytest.raises(TypeError, match=r"v must have the dtype of q \(torch.float64\), got torch.float32"):
        diffuse(q, k, v.float(), torch.tensor([0.2, 0.5, 0.3]), backend="matrix")


def test_is_causal_must_be_a_bool():
    """kills: dense.py normalise_mask dropping its bool check of ``is_causal`` (``1`` then reached SDPA as is)"""
    q, k, v = _qkv()
    for call in (lambda: diffuse(q, k, v, [0.0, 1.0], is_causal=1), lambda: attention_matrix(q, k, is_causal=1),
                 lambda: propagate_dense(q, k, v, is_causal=1)):
        with pytest.raises(TypeError, match=r"is_causal must be a bool, got int"):
            call()


# ---------------------------------------------------------------------------- dense: dtypes
def test_half_precision_attention_matrix_is_the_float32_softmax_rounded_once():
    """kills: dense.py _attention_matrix computing scores and softmax in the input dtype (``work = q.dtype``)
    and attention_matrix / diffuse_with_weights / _attention_matrix_heads returning the float32 ``P``
    instead of ``P`` in the input dtype"""
    q, k, v = _qkv(H=2, N=7, C=8, seed=5, dtype=torch.float32)
    q, k, v = (t * 3 for t in (q, k, v))  # peaked rows: bfloat16 scores would visibly change P
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    want = attention_matrix(qb.float(), kb.float()).bfloat16()  # the same numbers in float32, rounded once
    got = attention_matrix(qb, kb)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, want)
    _, P = diffuse_with_weights(qb, kb, vb, [0.0, 1.0], need_weights=True)
    assert P.dtype == torch.bfloat16 and torch.equal(P, want)
    Ph = _dense._attention_matrix_heads(qb, kb, (1,), None, False, 8**-0.5)
    assert Ph.dtype == torch.bfloat16 and torch.equal(Ph, want[:, 1:])


# ---------------------------------------------------------------------------- dense: rows without keys on any kernel
def _nan_row_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make SDPA behave as some GPU kernels do: NaN (not 0) in the rows of queries without an admissible key."""
    real = F.scaled_dot_product_attention

    def kernel(q, k, v, attn_mask=None, **kwargs):  # noqa: ANN001, ANN202
        y = real(q, k, v, attn_mask=attn_mask, **kwargs)
        if attn_mask is None:
            return y
        ok = attn_mask if attn_mask.dtype == torch.bool else attn_mask > float("-inf")
        return y.masked_fill(~ok.any(-1, keepdim=True), float("nan"))

    monkeypatch.setattr(F, "scaled_dot_product_attention", kernel)


def test_rows_without_keys_are_zero_whatever_the_fused_kernel_returns_there(monkeypatch):
    """kills: dense.py propagate_dense handing no row mask to _sdpa, _zero_rows returning the kernel's rows
    unchanged, and the static affine path building its SdpaBackend without the row mask (each correct on
    CPU kernels, which return 0 there, but NaN on the kernels that return NaN)"""
    q, k, v = _qkv(H=2, N=5, seed=10)
    allowed = torch.rand(1, 2, 5, 5, generator=torch.Generator().manual_seed(11)) > 0.3
    allowed[:, 0, 2] = False  # query 2 of head 0 has no key
    allowed[:, 1, 4] = False
    allowed[:, 0, [0, 1, 3, 4], 1] = True
    allowed[:, 1, :4, 1] = True
    P = dense_attention_reference(q, k, allowed=allowed)
    _nan_row_kernel(monkeypatch)
    assert F.scaled_dot_product_attention(q, k, v, attn_mask=allowed).isnan().any()  # the patched kernel does
    torch.testing.assert_close(propagate_dense(q, k, v, attn_mask=allowed), P @ v, rtol=0, atol=1e-12)
    for coeffs in ([1.0, -1.0], torch.tensor([1.0, -1.0], dtype=torch.float64), [0.2, 0.5, 0.3]):
        c = torch.as_tensor(coeffs, dtype=torch.float64)
        want = sum(c[i] * torch.linalg.matrix_power(P, i) @ v for i in range(len(c)))
        out = diffuse(q, k, v, coeffs, attn_mask=allowed, backend="sdpa")
        torch.testing.assert_close(out, want, rtol=0, atol=1e-12)


def test_split_paths_give_each_group_the_rows_without_keys_of_its_own_heads():
    """kills: dense.py _split_paths swapping the row masks of the affine heads and the K-step heads, and the
    auto back-end's materialised-P path taking every head's row mask for its K-step heads"""
    q, k, v = _qkv(H=3, N=6, seed=12)
    allowed = torch.rand(1, 3, 6, 6, generator=torch.Generator().manual_seed(13)) > 0.3
    allowed |= torch.eye(6, dtype=torch.bool)
    allowed[:, 0, 1] = False  # each head has its own query without keys
    allowed[:, 1, 4] = False
    allowed[:, 2, 2] = False
    P = dense_attention_reference(q, k, allowed=allowed)
    rows = [[1.0, -1.0, 0.0], [0.2, 0.5, 0.3], [0.0, 1.0, 0.0]]  # heads 0, 2 affine (degree 1), head 1 K-step
    c = torch.tensor(rows, dtype=torch.float64).view(1, 3, 3, 1, 1)
    want = sum(c[:, :, i] * torch.linalg.matrix_power(P, i) @ v for i in range(3))
    for backend in ("auto", "sdpa", "matrix"):
        out = diffuse(q, k, v, rows, attn_mask=allowed, degrees=[1, 2, 1], backend=backend)
        torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
        out = diffuse(q, k, v, c.view(3, 3), attn_mask=allowed, degrees=[1, 2, 1], backend=backend)
        torch.testing.assert_close(out, want, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------- dense: the back-end asked for
def test_matrix_backend_never_calls_the_fused_kernel_for_static_coefficients(monkeypatch):
    """kills: dense.py _diffuse_dense taking the fused affine path (degree <= 1) or the split path (mixed degrees)
    of static coefficients when ``backend="matrix"`` asked for the materialised ``P``"""
    q, k, v = _qkv(H=2, N=5, seed=14)
    P = dense_attention_reference(q, k, allowed=_tril(5))

    def refuse(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("backend='matrix' called the fused kernel")

    monkeypatch.setattr(F, "scaled_dot_product_attention", refuse)
    for rows, degrees in (([[1.0, -1.0], [0.0, 1.0]], None), ([[1.0, -1.0, 0.0], [0.2, 0.5, 0.3]], [1, 2])):
        c = torch.tensor(rows, dtype=torch.float64).view(1, 2, -1, 1, 1)
        want = sum(c[:, :, i] * torch.linalg.matrix_power(P, i) @ v for i in range(c.shape[2]))
        out = diffuse(q, k, v, rows, is_causal=True, backend="matrix", degrees=degrees)
        torch.testing.assert_close(out, want, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------- dense: the "auto" rule
def test_auto_materialises_p_for_the_k_step_heads_only(monkeypatch):
    """kills: dense.py _diffuse_dense materialising ``P`` for every head when ``"auto"`` picks ``"matrix"`` and
    one head of two needs ``K >= 2`` steps (``len(high) < H`` -> ``< H - 1``): the ``K <= 1`` head must keep the
    fused kernel (one call for it alone)"""
    q, k, v = _qkv(H=2, N=6, seed=18)
    c = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.5, 0.3]], dtype=torch.float64)
    P = dense_attention_reference(q, k)
    P0, P1, v0, v1 = P[:, 0], P[:, 1], v[:, 0], v[:, 1]
    want = torch.stack([P0 @ v0, 0.2 * v1 + 0.5 * P1 @ v1 + 0.3 * P1 @ P1 @ v1], 1)
    calls = []
    real = F.scaled_dot_product_attention

    def spy(q, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls.append(q.shape[1])
        return real(q, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    assert choose_dense_backend(6, 6, 2) == "matrix"
    torch.testing.assert_close(diffuse(q, k, v, c, degrees=[1, 2]), want, rtol=0, atol=1e-12)
    assert calls == [1]  # one fused call, for head 0 alone


def test_auto_rule_takes_the_entry_of_the_largest_listed_degree_not_above_k():
    """kills: dense.py choose_dense_backend looking up the smallest listed degree at or above ``K`` (K = 5..7
    would take the limit of K = 8) instead of the largest one at or below it"""
    for causal, limits in ((False, {2: 128, 3: 256, 4: 384, 5: 384, 6: 384, 7: 384, 8: 512, 13: 512}),
                           (True, {2: 64, 3: 128, 4: 256, 5: 256, 6: 256, 7: 256, 8: 384, 13: 384})):
        for K, n in limits.items():
            assert choose_dense_backend(n, n, K, is_causal=causal) == "matrix", (causal, K, n)
            assert choose_dense_backend(n, n + 1, K, is_causal=causal) == "sdpa", (causal, K, n)


def test_auto_rule_of_devices_other_than_cuda_is_the_cpu_rule():
    """kills: dense.py choose_dense_backend taking the CUDA rule for every device but ``"cpu"`` (the docstring:
    ``"cuda"`` uses the CUDA rule, any other type the CPU limits)"""
    for device_type in ("cpu", "mps", "xpu", "meta"):
        assert choose_dense_backend(64, 64, 4, device_type=device_type) == "matrix"
        assert choose_dense_backend(1024, 1024, 4, device_type=device_type) == "sdpa"


# ---------------------------------------------------------------------------- dense: the routing to Triton
def _fake_triton(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Replace the Triton back-end by a recorder (and its support check by "supported"): the routing rule of
    ``_try_triton`` alone, on any machine."""
    calls: list[dict] = []

    class Recorder:
        def __init__(self, q, k, is_causal, pad, scale, dropout_p, general):  # noqa: ANN001
            calls.append(dict(is_causal=is_causal, pad=pad, general=general))

        def diffuse(self, v, coeffs, degrees):  # noqa: ANN001, ANN202
            return torch.zeros_like(v)

    monkeypatch.setattr(_dense, "TritonBackend", Recorder)
    monkeypatch.setattr(_dense, "triton_unsupported", lambda *args: None)
    return calls


def test_auto_routing_to_triton_keeps_sdpa_only_for_plain_attention_and_large_heads(monkeypatch):
    """kills: dense.py _plain_attention ignoring ``c_0`` (``I + P`` heads taken for plain attention, kept off
    Triton) and _try_triton falling back at the head size limit itself (``>`` -> ``>=``)"""
    calls = _fake_triton(monkeypatch)
    q, k, v = _qkv(H=2, N=3, C=4, dtype=torch.float32)
    args = (None, False, 0.5, "auto")
    assert _dense._try_triton(q, k, v, ((0.0, 1.0), (0.0, 1.0)), *args, (1, 1), 0.0, False) is None
    assert _dense._try_triton(q, k, v, ((1.0, 1.0), (0.0, 1.0)), *args, (1, 1), 0.0, False) is not None
    assert _dense._try_triton(q, k, v, ((0.0, 1.0), (0.5, 1.0)), *args, (1, 1), 0.0, False) is not None
    limit = _dense.TRITON_AUTO_MAX_HEAD_DIM
    for C, taken in ((limit, True), (limit + 2, False)):
        t = torch.zeros(1, 1, 2, C)
        assert (_dense._try_triton(t, t, t, ((1.0, -1.0),), *args, (1,), 0.0, False) is not None) is taken, C
    assert len(calls) == 3


def test_triton_gets_key_padding_as_such_when_the_call_is_also_causal(monkeypatch):
    """kills: dense.py _try_triton folding ``is_causal`` into the mask it hands the kernels (a key padding mask
    then becomes a general (B, 1, N, N) mask: the kernels' cheaper key padding path is lost)"""
    calls = _fake_triton(monkeypatch)
    q, k, v = _qkv(B=2, H=2, N=4, C=4, dtype=torch.float32)
    keep = torch.tensor([[True, True, True, False], [True, True, False, False]]).view(2, 1, 1, 4)
    diffuse(q, k, v, [1.0, -1.0], attn_mask=keep, is_causal=True, backend="triton")
    (call,) = calls
    assert call["is_causal"] is True and call["general"] is None
    assert torch.equal(call["pad"], ~keep.view(2, 4))  # True = padding


# ---------------------------------------------------------------------------- rivals: the context
def test_dense_context_uniform_map_of_queries_and_keys_of_different_lengths():
    """kills: rivals.py RivalContext.dense taking the O(N) uniform map without ``N == M`` (it averages over
    keys and returns one row per key, not per query)"""
    g = torch.Generator().manual_seed(6)
    q = torch.randn(1, 2, 3, 4, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64) for _ in range(2))
    pad = torch.tensor([True, True, False, True, False]).view(1, 1, 1, 5)
    for mask, DC in ((None, torch.full((3, 5), 1 / 5, dtype=torch.float64)),
                     (pad, pad[0, 0].double().expand(3, 5) / 3)):
        ctx = RivalContext.dense(q, k, v, attn_mask=mask)
        torch.testing.assert_close(ctx.uniform(v), DC @ v, rtol=0, atol=1e-12)


def test_dense_context_key_padding_masks_of_two_and_three_dimensions():
    """kills: rivals.py RivalContext.dense handing a 2-D or 3-D key padding mask to the O(N) uniform map as is
    (not made 4-D: the map refuses it)"""
    _, k, v = _qkv(H=2, N=5, seed=7)
    keep = torch.tensor([True, False, True, True, False])
    DC = keep.double().expand(5, 5) / 3
    for mask in (keep.view(1, 5), keep.view(1, 1, 5)):
        for causal in (False, True):
            ctx = RivalContext.dense(k, k, v, attn_mask=mask, is_causal=causal)
            A = keep.expand(5, 5) & _tril(5) if causal else keep.expand(5, 5)
            want = (A.double() / A.sum(-1, keepdim=True).clamp_min(1)) @ v if causal else DC @ v
            torch.testing.assert_close(ctx.uniform(v), want, rtol=0, atol=1e-12)


def test_dense_context_attention_matrix_is_causal_and_drops_out():
    """kills: rivals.py RivalContext.attention_matrix dropping ``is_causal`` (a causal context without a mask)
    or its dropout on ``P`` (the dense-only operators read ``P`` there)"""
    q, k, v = _qkv(H=2, N=6, seed=8)
    P_ref = dense_attention_reference(q, k, allowed=_tril(6))
    ctx = RivalContext.dense(q, k, v, is_causal=True)
    torch.testing.assert_close(ctx.attention_matrix(), P_ref, rtol=0, atol=1e-12)
    ctx = RivalContext.dense(q, k, v, is_causal=True, dropout_p=0.5)
    torch.manual_seed(0)
    P = ctx.attention_matrix()
    kept = P != 0
    assert 0 < int(kept.sum()) < int((P_ref != 0).sum())  # some entries of P dropped, some kept
    torch.testing.assert_close(P[kept], 2.0 * P_ref[kept], rtol=0, atol=1e-12)  # kept ones scaled by 1 / (1 - p)


def test_sparse_context_takes_node_major_first_layer_values():
    """kills: rivals.py RivalContext.sparse keeping a node-major ``(N, G, C)`` ``v0`` as given (not made head-major
    like ``q``, ``k`` and ``v``: the context then refuses it as another layer's shape)"""
    from diffusionformer.testing import complete_edge_index

    q, k, v, v0 = (t[0].transpose(0, 1) for t in _qkv(H=2, N=5, seed=16) + _qkv(H=2, N=5, seed=17)[:1])
    for given in (v0, v0.transpose(0, 1).unsqueeze(0)):  # node-major (N, G, C) and head-major (1, G, N, C)
        ctx = RivalContext.sparse(q, k, v, complete_edge_index(5), v0=given)
        assert ctx.v0.shape == ctx.v.shape == (1, 2, 5, 4)
        assert torch.equal(ctx.v0[0], v0.transpose(0, 1))


# ---------------------------------------------------------------------------- rivals: in a layer
def test_a_context_operator_output_in_another_dtype_is_cast_to_the_layer_dtype():
    """kills: rivals.py apply_context_groups adding a context operator's output to the layer's heads without
    casting it to their dtype (an operator that computes in float64 in a float32 layer: index_add refuses)"""
    from diffusionformer import DiffusionAttention
    from diffusionformer.operators.attnscale import AttnScaleOperator

    class Float64AttnScale(AttnScaleOperator):  # a user's operator that returns its heads in float64
        def apply_context(self, ctx):  # noqa: ANN001, ANN202
            return super().apply_context(ctx).double()

    torch.manual_seed(34)
    x = torch.randn(2, 5, 8)
    plain = DiffusionAttention(8, 2, heads=["attention", AttnScaleOperator(omega=0.5)])
    wide = DiffusionAttention(8, 2, heads=["attention", Float64AttnScale(omega=0.5)])
    wide.load_state_dict(plain.state_dict())
    y = wide(x)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, plain(x), rtol=0, atol=0)


def test_apply_context_groups_refuses_a_mask_with_another_number_of_heads():
    """kills: rivals.py _slice_heads dropping its check of the mask's heads against the layer's (a 3-head mask
    on a 4-head layer then gives the group of heads 2, 3 the mask's head 2 alone, silently)"""
    from diffusionformer import DiffusionAttention
    from diffusionformer.ops.rivals import apply_context_groups

    torch.manual_seed(35)
    layer = DiffusionAttention(8, 4, heads="attention:2,attnscale(omega=0.5):2")
    x = torch.randn(1, 5, 8)
    q, k, v = (torch.randn(1, 4, 5, 2) for _ in range(3))
    mask = torch.ones(1, 3, 5, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"attn_mask has 3 heads, the layer 4"):
        apply_context_groups(layer, torch.zeros_like(v), x, q, k, v, entered=(0, None), mask=mask)


# ---------------------------------------------------------------------------- defects found by the audit
def test_sparse_context_refuses_an_is_causal_that_is_not_a_bool():
    """Bug: RivalContext.sparse turned ``is_causal`` into ``bool(is_causal)``, so ``is_causal="no"`` built a causal
    context (the dense context and diffuse_sparse raise a TypeError); now a TypeError naming it."""
    from diffusionformer.testing import complete_edge_index

    q, k, v = (t[0].transpose(0, 1) for t in _qkv(H=2, N=4))
    for bad in ("no", 1, None):
        with pytest.raises(TypeError, match=r"is_causal must be a bool, got"):
            RivalContext.sparse(q, k, v, complete_edge_index(4), is_causal=bad)
    with pytest.raises(TypeError, match=r"is_causal must be a bool, got int"):
        RivalContext.dense(*_qkv(H=2, N=4), is_causal=1)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_contexts_refuse_inputs_of_the_wrong_rank_by_name(sparse):
    """Bug: RivalContext.dense unpacked ``q.shape`` into four names (a bare "not enough values to unpack" for a
    node-major (N, G, C) input) and RivalContext.sparse took a head-major (B, G, N, C) input unchecked (a 5-D
    context whose first propagation refused a reshuffled tensor); now a ValueError naming the tensor and its
    layout."""
    from diffusionformer.testing import complete_edge_index

    q4, k4, v4 = _qkv(H=2, N=4)
    q3, k3, v3 = (t[0].transpose(0, 1) for t in (q4, k4, v4))
    if sparse:
        with pytest.raises(ValueError, match=r"q must have shape \(N, G, C\) \(3 dims\), got shape \(1, 2, 4, 4\)"):
            RivalContext.sparse(q4, k3, v3, complete_edge_index(4))
        with pytest.raises(ValueError, match=r"v must have shape \(N, G, C\)"):
            RivalContext.sparse(q3, k3, v4, complete_edge_index(4))
    else:
        with pytest.raises(ValueError, match=r"q must have shape \(B, G, N, C\) \(4 dims\), got shape \(4, 2, 4\)"):
            RivalContext.dense(q3, k4, v4)
        with pytest.raises(ValueError, match=r"k must have shape \(B, G, N, C\)"):
            RivalContext.dense(q4, k3, v4)
