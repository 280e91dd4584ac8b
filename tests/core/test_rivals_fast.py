"""The rivals' structural fast paths against the float64 references, and proof that they are taken.

* ppr-exact under a causal call: ``I - (1 - alpha) P`` is lower triangular, so
  :meth:`~diffusionformer.operators.ExactPPROperator.apply_causal_matrix` solves by forward
  substitution (``torch.linalg.solve_triangular``) instead of the LU solve;
* AttnScale's uniform map ``DC v`` with no mask, a causal mask, key padding or both: a mean,
  cumulative mean or masked mean (:func:`~diffusionformer.ops.uniform_map.uniform_mean`) instead
  of a zero-score attention call.

"Taken" is checked by making the general path raise (``torch.linalg.solve``, the attention call)
and, the other way round, that every other call still takes the general path.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer import DiffusionAttention, build_operator
from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached
from diffusionformer.ops import rivals as rivals_mod
from diffusionformer.ops.reference import dense_attention_reference
from diffusionformer.ops.reference_rivals import attnscale_reference, ppr_exact_reference, uniform_matrix_reference
from diffusionformer.ops.rivals import RivalContext
from diffusionformer.ops.uniform_map import uniform_mean
from diffusionformer.testing import assert_operator

f64 = torch.float64
B, G, N, C = 3, 2, 6, 4
D, H = 16, 4


def _pad() -> torch.Tensor:
    """Key padding ``(B, N)``, True = padded: none, a padded head (row 0 sees no key), all padded."""
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[1, :2] = True  # left padding: causal rows 0 and 1 have no admissible key
    pad[2] = True  # a fully padded sequence
    return pad


def _allowed(causal: bool, pad: torch.Tensor | None) -> torch.Tensor | None:
    """The bool ``(B, 1, N, N)`` mask of admissible keys (``None``: all)."""
    if not causal and pad is None:
        return None
    allowed = torch.ones(B, 1, N, N, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool).tril()
    if pad is not None:
        allowed = allowed & ~pad[:, None, None, :]
    return allowed


def _raise(*args, **kwargs):
    raise AssertionError("the general path was taken")


# ---------------------------------------------------------------------------------- ppr-exact
def test_ppr_exact_causal_solve_matches_the_reference_on_rows_with_and_without_keys():
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, G, N, C, dtype=f64) for _ in range(3))
    allowed = _allowed(True, _pad())
    P = dense_attention_reference(q, k, allowed=allowed)  # zero rows where no key is admissible
    op = build_operator("ppr-exact", alpha=0.3, num_heads=G)
    got = op.apply_causal_matrix(P, v)
    torch.testing.assert_close(got, ppr_exact_reference(P, v, 0.3), rtol=0, atol=1e-12)
    torch.testing.assert_close(got[2], 0.3 * v[2], rtol=0, atol=1e-15)  # fully padded: P = 0, so alpha v


def test_ppr_exact_causal_solve_reads_only_the_lower_triangle():
    torch.manual_seed(1)
    P = torch.rand(1, 1, N, N, dtype=f64).tril()
    P = P / P.sum(-1, keepdim=True)
    v = torch.randn(1, 1, N, C, dtype=f64)
    op = build_operator("ppr-exact", alpha=0.2)
    noisy = P + torch.rand(N, N, dtype=f64).triu(1)  # the strictly upper part is never read
    torch.testing.assert_close(op.apply_causal_matrix(noisy, v), op.apply_matrix(P, v), rtol=0, atol=1e-12)


def _heads_to_layer(layer: DiffusionAttention, heads: torch.Tensor) -> torch.Tensor:
    """``out_proj`` of head-major ``(B, H, N, C)`` head outputs."""
    Bx, Hx, Nx, Cx = heads.shape
    return layer.out_proj(heads.transpose(1, 2).reshape(Bx, Nx, Hx * Cx))


def _layer_qkv(layer: DiffusionAttention, x: torch.Tensor):
    q, k, v = layer.qkv(x).view(x.shape[0], x.shape[1], 3, layer.num_heads, layer.head_dim).unbind(2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, N, C)


@pytest.mark.parametrize("padded", [False, True])
def test_causal_ppr_exact_layer_takes_the_triangular_solve(monkeypatch, padded):
    torch.manual_seed(2)
    layer = DiffusionAttention(D, H, heads="ppr-exact(alpha=0.25):4", causal=True).double().eval()
    x = torch.randn(B, N, D, dtype=f64)
    pad = _pad() if padded else None
    monkeypatch.setattr(torch.linalg, "solve", _raise)
    got = layer(x, key_padding_mask=pad)
    q, k, v = _layer_qkv(layer, x)
    P = dense_attention_reference(q, k, allowed=_allowed(True, pad))
    want = _heads_to_layer(layer, ppr_exact_reference(P, v, 0.25))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_non_causal_calls_keep_the_general_solve(monkeypatch):
    torch.manual_seed(3)
    layer = DiffusionAttention(D, H, heads="ppr-exact(alpha=0.25):4").double().eval()
    causal = DiffusionAttention(D, H, heads="ppr-exact(alpha=0.25):4", causal=True).double().eval()
    causal.load_state_dict(layer.state_dict())
    x = torch.randn(B, N, D, dtype=f64)
    pad = _pad()
    want_causal = causal(x, key_padding_mask=pad)
    monkeypatch.setattr(torch.linalg, "solve_triangular", _raise)
    q, k, v = _layer_qkv(layer, x)
    P = dense_attention_reference(q, k, allowed=_allowed(False, pad))
    got = layer(x, key_padding_mask=pad)  # key padding alone: P is not triangular
    torch.testing.assert_close(got, _heads_to_layer(layer, ppr_exact_reference(P, v, 0.25)), rtol=0, atol=1e-12)
    # a lower-triangular attn_mask without is_causal: the structure is not promised by the call
    tril = torch.ones(N, N, dtype=torch.bool).tril()
    torch.testing.assert_close(layer(x, key_padding_mask=pad, attn_mask=tril), want_causal, rtol=0, atol=1e-12)


def test_ppr_exact_cached_decoding_takes_the_triangular_solve(monkeypatch):
    torch.manual_seed(4)
    layer = DiffusionAttention(D, H, heads="ppr-exact(alpha=0.4):2,heat(steps=2):2", causal=True).double().eval()
    x = torch.randn(2, N, D, dtype=f64)
    want = layer(x)
    monkeypatch.setattr(torch.linalg, "solve", _raise)
    cache = LayerKVCache()
    got = torch.cat([attend_cached(layer, x[:, :3], cache)]
                    + [attend_cached(layer, x[:, i : i + 1], cache) for i in range(3, N)], dim=1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_the_harness_runs_the_causal_hook(monkeypatch):
    assert_operator("ppr-exact", alpha=0.3)
    monkeypatch.setattr(torch.linalg, "solve_triangular", _raise)
    with pytest.raises(AssertionError, match="general path"):
        assert_operator("ppr-exact", alpha=0.3)


# ---------------------------------------------------------------------------------- the uniform map
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_uniform_mean_is_the_dc_matrix(causal, padded):
    torch.manual_seed(5)
    x = torch.randn(B, G, N, C, dtype=f64)
    pad = _pad() if padded else None
    keys = None if pad is None else ~pad[:, None, None, :]
    allowed = _allowed(causal, pad)
    want = uniform_matrix_reference(N, allowed) @ x
    got = uniform_mean(x, keys, is_causal=causal)
    assert got.shape == x.shape and got.dtype == f64
    torch.testing.assert_close(got, want, rtol=0, atol=1e-14)
    if padded:  # rows without an admissible key are zero rows
        assert got[2].abs().max() == 0
        if causal:
            assert got[1, :, :2].abs().max() == 0


def test_uniform_mean_refuses_bad_masks():
    x = torch.randn(1, 1, N, C)
    with pytest.raises(TypeError, match="key_mask must be bool"):
        uniform_mean(x, torch.ones(1, 1, 1, N))
    with pytest.raises(ValueError, match=r"key_mask must have shape \(B, G, 1, M\) with M = 6, got \(1, 1, 6, 6\)"):
        uniform_mean(x, torch.ones(1, 1, N, N, dtype=torch.bool))
    with pytest.raises(ValueError, match="x must have shape"):
        uniform_mean(x[0])
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        uniform_mean(x, is_causal=1)


def _count_attention_calls(monkeypatch) -> list[int]:
    calls = [0]
    real = rivals_mod.propagate_dense

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(rivals_mod, "propagate_dense", counting)
    return calls


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_context_uniform_takes_the_reduction_and_equals_the_attention_call(monkeypatch, causal, padded):
    torch.manual_seed(6)
    q, k, v = (torch.randn(B, G, N, C, dtype=f64) for _ in range(3))
    pad = _pad() if padded else None
    mask = None if pad is None else ~pad[:, None, None, :]
    ctx = RivalContext.dense(q, k, v, attn_mask=mask, is_causal=causal)
    calls = _count_attention_calls(monkeypatch)
    fast = ctx.uniform(v)
    assert calls[0] == 0
    ctx._uniform_plan = None  # the general path: a zero-score attention call
    general = ctx.uniform(v)
    assert calls[0] == 1
    torch.testing.assert_close(fast, general, rtol=0, atol=1e-14)
    torch.testing.assert_close(fast, uniform_matrix_reference(N, _allowed(causal, pad)) @ v, rtol=0, atol=1e-14)


@pytest.mark.parametrize("mask", ["full-bool", "float", "per-query-keys"])
def test_context_uniform_keeps_the_attention_call_for_other_masks(monkeypatch, mask):
    torch.manual_seed(7)
    q, k, v = (torch.randn(1, G, N, C, dtype=f64) for _ in range(3))
    allowed = torch.rand(N, N) < 0.6
    allowed[:, 0] = True
    if mask == "full-bool":
        attn_mask = allowed
    elif mask == "float":  # a bias changes the weights of the zero scores: not a uniform map
        attn_mask = torch.randn(1, 1, 1, N, dtype=f64)
    else:  # a lower-triangular bool mask without is_causal: the structure is not promised by the call
        attn_mask = torch.ones(N, N, dtype=torch.bool).tril()
    ctx = RivalContext.dense(q, k, v, attn_mask=attn_mask)
    assert ctx._uniform_plan is None
    monkeypatch.setattr(rivals_mod, "uniform_mean", _raise)
    got = ctx.uniform(v)
    if mask != "float":
        torch.testing.assert_close(got, uniform_matrix_reference(N, attn_mask) @ v, rtol=0, atol=1e-14)
    else:
        torch.testing.assert_close(got, torch.softmax(attn_mask.expand(1, G, N, N), -1) @ v, rtol=0, atol=1e-14)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_uniform_under_bf16_autocast_has_the_attention_calls_dtype(causal, padded):
    torch.manual_seed(8)
    q, k, v = (torch.randn(B, G, 64, 8) for _ in range(3))
    pad = torch.zeros(B, 64, dtype=torch.bool)
    pad[1, :5] = True
    pad[2] = True
    mask = ~pad[:, None, None, :] if padded else None
    ctx = RivalContext.dense(q, k, v, attn_mask=mask, is_causal=causal)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast = ctx.uniform(v)
        plan, ctx._uniform_plan = ctx._uniform_plan, None
        general = ctx.uniform(v)
    assert plan is not None and fast.dtype == general.dtype == torch.bfloat16
    # the same bf16 values summed in float32: at most one bf16 rounding step apart
    torch.testing.assert_close(fast.float(), general.float(), rtol=8e-3, atol=1e-6)
    want = (uniform_matrix_reference(64, _allowed_n(causal, pad if padded else None, 64)) @ v.bfloat16().double())
    torch.testing.assert_close(fast.double(), want, rtol=8e-3, atol=1e-6)


def _allowed_n(causal: bool, pad: torch.Tensor | None, n: int) -> torch.Tensor:
    allowed = torch.ones(B, 1, n, n, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
    if pad is not None:
        allowed = allowed & ~pad[:, None, None, :]
    return allowed


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_attnscale_layer_makes_one_attention_call_and_matches_the_reference(monkeypatch, causal, padded):
    torch.manual_seed(9)
    layer = DiffusionAttention(D, H, heads="attnscale(omega=0.6):4", causal=causal).double().train()  # dropout 0
    x = torch.randn(B, N, D, dtype=f64)
    pad = _pad() if padded else None
    calls = _count_attention_calls(monkeypatch)
    got = layer(x, key_padding_mask=pad)
    assert calls[0] == 1  # P v; DC v is the reduction
    q, k, v = layer.qkv(x).view(B, N, 3, H, D // H).unbind(2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    heads = attnscale_reference(q, k, v, torch.full((H,), 0.6), _allowed(causal, pad))  # (B, H, N, C)
    want = layer.out_proj(heads.transpose(1, 2).reshape(B, N, D))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_attnscale_uniform_map_has_no_dropout():
    torch.manual_seed(10)
    q, k, v = (torch.randn(1, G, N, C, dtype=f64) for _ in range(3))
    ctx = RivalContext.dense(q, k, v, is_causal=True, dropout_p=0.9)
    torch.testing.assert_close(ctx.uniform(v), uniform_mean(v, is_causal=True), rtol=0, atol=0)


# ---------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_float64_fast_paths(monkeypatch, causal):
    torch.manual_seed(11)
    layer = DiffusionAttention(8, 2, heads="attnscale(omega=0.5):1,ppr-exact(alpha=0.3):1", causal=causal).double()
    pad = torch.zeros(3, 4, dtype=torch.bool)
    pad[1, :1] = True  # a causal row without keys
    pad[2] = True  # a fully padded sequence
    x = torch.randn(3, 4, 8, dtype=f64, requires_grad=True)
    calls = _count_attention_calls(monkeypatch)
    if causal:
        monkeypatch.setattr(torch.linalg, "solve", _raise)

    def run(x, *params):
        return layer(x, key_padding_mask=pad)

    params = [p for p in layer.parameters() if p.requires_grad]
    assert torch.autograd.gradcheck(run, (x, *params), eps=1e-6, atol=1e-6)
    calls[0] = 0
    run(x).sum().backward()
    assert calls[0] == 1  # the attnscale head's P v only
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)


# ----------------------------------------------------------------------------- ppr-exact and dropout on P
def test_ppr_exact_refuses_attention_dropout_at_or_above_alpha():
    """Inverted dropout scales kept entries by 1/(1-p): at p = alpha the causal first row makes
    I - (1 - alpha) P singular, so the layer refuses p >= alpha (at construction and when the
    settable ``dropout`` grows later) and trains at p < alpha."""
    op = build_operator("ppr-exact(alpha=0.2)")
    P = torch.zeros(1, 1, 3, 3, dtype=torch.float64)
    P[0, 0, 0, 0] = 1.0 / (1.0 - 0.2)  # the first causal row [1, 0, 0] after dropout keeps its entry
    P[0, 0, 1, :2] = 0.5
    P[0, 0, 2, :3] = 1.0 / 3.0
    system = torch.eye(3, dtype=torch.float64) - 0.8 * P[0, 0]
    assert torch.linalg.det(system).abs() < 1e-12  # why: singular at p = alpha
    with pytest.raises(ValueError, match=r"ppr-exact\(alpha=0.2\) with attention dropout 0.2"):
        op.check_attention_dropout(0.2)
    op.check_attention_dropout(0.19)
    with pytest.raises(ValueError, match="guaranteed invertible for dropout < alpha"):
        DiffusionAttention(16, 2, heads="attention:1,ppr-exact(alpha=0.2):1", causal=True, dropout=0.2)
    layer = DiffusionAttention(16, 2, heads="attention:1,ppr-exact(alpha=0.2):1", causal=True, dropout=0.15).train()
    for seed in range(20):
        torch.manual_seed(seed)
        assert torch.isfinite(layer(torch.randn(2, 6, 16))).all()
    layer.dropout = 0.3
    with pytest.raises(ValueError, match="attention dropout 0.3"):
        layer(torch.randn(2, 6, 16))
    layer.eval()  # no dropout in evaluation: nothing to refuse
    assert torch.isfinite(layer(torch.randn(2, 6, 16))).all()
