"""The rival operators of issue 19 against float64 references written from their papers.

Each rival is checked in a layer (causal and padded, forward and backward), dense against
sparse where defined, and through the state a model threads from its first layer.
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer import DiffusionAttention, build_operator
from diffusionformer.operators import (
    DifferentialOperator,
    PolynomialOperator,
    chebyshev_matrix,
    lambda_init_schedule,
    ppr_coefficients,
)
from diffusionformer.ops.reference import dense_attention_reference, polynomial_reference
from diffusionformer.ops.reference_rivals import (
    attnscale_reference,
    chebyshev_reference,
    differential_reference,
    grand_nl_reference,
    neutreno_reference,
    ppr_exact_reference,
    rival_reference,
    uniform_matrix_reference,
    value_residual_reference,
)
from diffusionformer.ops.rivals import LayerState, RivalContext, uniform_average
from diffusionformer.testing import complete_edge_index

D, H, C, N, B = 16, 4, 4, 6, 2
f64 = torch.float64


def _qkv(layer: DiffusionAttention, x: torch.Tensor):
    Bx, Nx, _ = x.shape
    q, k, v = layer.qkv(x).view(Bx, Nx, 3, layer.num_heads, layer.head_dim).unbind(2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, N, C)


def _allowed(causal: bool, pad: torch.Tensor | None) -> torch.Tensor | None:
    allowed = torch.ones(N, N, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    allowed = allowed.expand(B, 1, N, N)
    if pad is not None:
        allowed = allowed & ~pad[:, None, None, :]
    return allowed


def _pad() -> torch.Tensor:
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[1, 4:] = True  # a padded tail in the second sequence
    return pad


def _layer_reference(layer, x, allowed, refs):
    """``out_proj([ref_g(q_g, k_g, v_g)]_g)`` with one reference function per head group."""
    q, k, v = _qkv(layer, x)
    outs = []
    for (s, c), ref in zip(layer._groups, refs):
        outs.append(ref(q[:, s : s + c], k[:, s : s + c], v[:, s : s + c]))
    y = torch.cat(outs, dim=1).transpose(1, 2).reshape(x.shape)
    return layer.out_proj(y)


def _attention_ref(allowed):
    return lambda q, k, v: dense_attention_reference(q, k, allowed=allowed) @ v


# ---------------------------------------------------------------------------------- references
def test_uniform_average_matches_explicit_dc_matrix():
    x = torch.randn(2, 3, N, 5, dtype=f64)
    allowed = torch.ones(N, N, dtype=torch.bool).tril()
    allowed[2] = False  # a row with no admissible key -> zero row
    assert torch.allclose(uniform_average(x, allowed), uniform_matrix_reference(N, allowed) @ x, atol=1e-14)
    assert torch.allclose(uniform_average(x, None), x.mean(-2, keepdim=True).expand_as(x))
    assert uniform_average(x, allowed)[..., 2, :].abs().max() == 0


def test_context_uniform_is_dc_on_dense_and_sparse_graphs():
    q, k, v = (torch.randn(1, 2, N, 4, dtype=f64) for _ in range(3))
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    ctx = RivalContext.dense(q, k, v, is_causal=True)
    assert torch.allclose(ctx.uniform(v), uniform_matrix_reference(N, causal) @ v, atol=1e-14)
    edges = complete_edge_index(N)
    edges = edges[:, edges[0] <= edges[1]]
    sctx = RivalContext.sparse(*(t[0].transpose(0, 1) for t in (q, k, v)), edges)
    assert torch.allclose(sctx.uniform(sctx.v), ctx.uniform(v), atol=1e-14)


# ---------------------------------------------------------------------------------- ppr-exact
def test_ppr_exact_is_the_limit_of_truncated_ppr():
    torch.manual_seed(0)
    P = dense_attention_reference(torch.randn(1, 2, N, 4, dtype=f64), torch.randn(1, 2, N, 4, dtype=f64))
    v = torch.randn(1, 2, N, 3, dtype=f64)
    exact = build_operator("ppr-exact", alpha=0.3, num_heads=2).apply_matrix(P, v)
    assert torch.allclose(exact, ppr_exact_reference(P, v, 0.3), atol=1e-12)
    # the series' weights in float64 (the operator keeps float32 ones for the layers, whose rounding, about
    # 1e-8, is above this tolerance for some inputs: unseeded, this test failed one run in 25)
    truncated = ppr_coefficients(torch.tensor(0.3, dtype=f64), 120)
    assert torch.allclose(polynomial_reference(P, v, truncated), exact, atol=1e-12)
    assert torch.allclose(build_operator("ppr", alpha=0.3, steps=120, num_heads=2).coefficients().double(),
                          truncated, rtol=1e-7, atol=0)
    # alpha (I - (1-alpha) P)^-1 1 = 1: the constant mode passes
    ones = torch.ones(1, 2, N, 1, dtype=f64)
    assert torch.allclose(build_operator("ppr-exact", alpha=0.05).apply_matrix(P, ones), ones, atol=1e-12)


def test_ppr_exact_refuses_the_sparse_backend_and_bad_alpha():
    layer = DiffusionAttention(D, H, heads="ppr-exact:2,attention:2")
    with pytest.raises(ValueError, match="does not support the sparse back-end"):
        layer(torch.randn(N, D), edge_index=complete_edge_index(N))
    with pytest.raises(ValueError, match=r"alpha must lie in \(0, 1\]"):
        build_operator("ppr-exact", alpha=0.0)


# ---------------------------------------------------------------------------------- chebyshev
def test_chebyshev_matrix_rows_are_the_chebyshev_polynomials():
    M = chebyshev_matrix(6)
    x = torch.linspace(-1, 1, 11, dtype=f64)
    powers = torch.stack([x**j for j in range(7)])  # (7, 11)
    for kk in range(7):
        assert torch.allclose(M[kk] @ powers, torch.cos(kk * torch.arccos(x)), atol=1e-12), kk


def test_chebyshev_basis_matches_matrix_recursion_and_keeps_the_init():
    torch.manual_seed(0)
    op = PolynomialOperator(steps=4, init=[0.3, -0.2, 0.5, 0.1, -0.4], num_heads=2, basis="chebyshev").double()
    # the monomial init is kept exactly: same function, other parameters
    assert torch.allclose(op.coefficients().detach(), torch.tensor([0.3, -0.2, 0.5, 0.1, -0.4], dtype=f64).expand(2, -1), atol=1e-6)
    with torch.no_grad():
        op.theta.copy_(torch.randn(2, 5, dtype=f64))
    P = dense_attention_reference(torch.randn(1, 2, N, 4, dtype=f64), torch.randn(1, 2, N, 4, dtype=f64))
    v = torch.randn(1, 2, N, 3, dtype=f64)
    assert torch.allclose(polynomial_reference(P, v, op.coefficients()), chebyshev_reference(P, v, op.theta), atol=1e-10)
    rebuilt = build_operator(op.spec(), num_heads=2)
    assert rebuilt.basis == "chebyshev" and "basis='chebyshev'" in op.spec()
    assert "basis" not in PolynomialOperator(steps=2).spec()  # existing specs unchanged
    with pytest.raises(ValueError, match="basis must be one of"):
        PolynomialOperator(steps=2, basis="legendre")


# ---------------------------------------------------------------------------------- layers vs references
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_rival_layers_match_float64_references(causal, padded):
    torch.manual_seed(1)
    x = torch.randn(B, N, D, dtype=f64)
    pad = _pad() if padded else None
    allowed = _allowed(causal, pad)
    heads = "attnscale(omega=0.7):1,ppr-exact(alpha=0.25):1,grand-nl(t=0.8, steps=3, method='rk4'):1,attention:1"
    layer = DiffusionAttention(D, H, heads=heads, causal=causal).double().eval()
    with torch.no_grad():
        layer.operators[0].omega.fill_(0.7)
    refs = [
        lambda q, k, v: attnscale_reference(q, k, v, torch.tensor([0.7]), allowed),
        lambda q, k, v: ppr_exact_reference(dense_attention_reference(q, k, allowed=allowed), v, 0.25),
        lambda q, k, v: grand_nl_reference(q, k, v, 0.8, 3, "rk4", allowed),
        _attention_ref(allowed),
    ]
    got = layer(x, key_padding_mask=pad)
    want = _layer_reference(layer, x, allowed, refs)
    rows = slice(None) if pad is None else ~pad  # padded query rows are unspecified for ppr-exact
    assert torch.allclose(got[rows], want[rows], atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_differential_layer_matches_the_papers_equations(causal):
    torch.manual_seed(2)
    x = torch.randn(B, N, D, dtype=f64)
    pad = _pad()
    allowed = _allowed(causal, pad)
    layer = DiffusionAttention(D, H, heads="differential(depth=3):2,attention:2", causal=causal).double().eval()
    op = layer.operators[0]
    with torch.no_grad():
        op.subln.weight.copy_(torch.rand(C, dtype=f64) + 0.5)
    lam_init = lambda_init_schedule(3)
    refs = [
        lambda q, k, v: differential_reference(q, k, v, op.lambda_q1, op.lambda_k1, op.lambda_q2, op.lambda_k2,
                                               op.subln.weight, lam_init, allowed),
        _attention_ref(allowed),
    ]
    got = layer(x, key_padding_mask=pad)
    assert torch.allclose(got, _layer_reference(layer, x, allowed, refs).detach(), atol=1e-10)


def _unilm_multihead_diffattn(x, wq, wk, wv, wo, lq1, lk1, lq2, lk2, gain, depth, num_heads):
    """The forward of microsoft/unilm ``Diff-Transformer/multihead_diffattn.py`` (no rotary, no GQA),
    transcribed with its layout: ``q.view(B, N, 2H, d)``, ``v.view(B, N, H, 2d)``, causal mask."""
    bsz, tgt_len, embed_dim = x.shape
    head_dim = embed_dim // num_heads // 2
    q = (x @ wq.T).view(bsz, tgt_len, 2 * num_heads, head_dim).transpose(1, 2) * head_dim**-0.5
    k = (x @ wk.T).view(bsz, tgt_len, 2 * num_heads, head_dim).transpose(1, 2)
    v = (x @ wv.T).view(bsz, tgt_len, num_heads, 2 * head_dim).transpose(1, 2)
    w = q @ k.transpose(-1, -2)
    w = w + torch.triu(torch.full((tgt_len, tgt_len), float("-inf"), dtype=x.dtype), 1)
    w = torch.softmax(w, dim=-1)
    lambda_init = 0.8 - 0.6 * math.exp(-0.3 * depth)
    lam = torch.exp((lq1 * lk1).sum()) - torch.exp((lq2 * lk2).sum()) + lambda_init
    w = w.view(bsz, num_heads, 2, tgt_len, tgt_len)
    attn = (w[:, :, 0] - lam * w[:, :, 1]) @ v
    attn = attn * torch.rsqrt(attn.pow(2).mean(-1, keepdim=True) + 1e-5) * gain  # RMSNorm(2d, eps=1e-5)
    attn = attn * (1 - lambda_init)
    return attn.transpose(1, 2).reshape(bsz, tgt_len, embed_dim) @ wo.T


def test_differential_layer_matches_the_reference_implementation_layout():
    torch.manual_seed(3)
    x = torch.randn(B, N, D, dtype=f64)
    layer = DiffusionAttention(D, H, heads="differential", causal=True, bias=False).double().eval()
    op = layer.operators[0]
    with torch.no_grad():
        op.subln.weight.copy_(torch.rand(C, dtype=f64) + 0.5)
    wq, wk, wv = layer.qkv.weight.chunk(3)
    state = LayerState()
    layer(x, state=state)  # depth 0
    got = layer(x, state=state)  # the same weights at depth 1: lambda_init from the state's depth
    want = _unilm_multihead_diffattn(x, wq, wk, wv, layer.out_proj.weight, op.lambda_q1, op.lambda_k1, op.lambda_q2,
                                     op.lambda_k2, op.subln.weight, 1, H)
    assert torch.allclose(got, want, atol=1e-10)
    assert not torch.allclose(layer(x), want, atol=1e-6)  # depth 0 without a state: another lambda_init


def test_differential_parameter_count_and_head_width():
    base = sum(p.numel() for p in DiffusionAttention(32, 4).parameters())
    layer = DiffusionAttention(32, 4, heads="attention:2,differential:2")
    assert sum(p.numel() for p in layer.parameters()) == base + 3 * 8  # 4 (C/2) lambda vectors + C RMSNorm gains
    with pytest.raises(ValueError, match="head_dim must be an even int"):
        DiffusionAttention(12, 4, heads="differential")  # C = 3
    with pytest.raises(ValueError, match="not bound to a head width"):
        DifferentialOperator().lambda_full()


def test_grand_nl_is_attention_after_one_unit_euler_step_and_evolves_the_model_state():
    torch.manual_seed(4)
    x = torch.randn(B, N, D, dtype=f64)
    one = DiffusionAttention(D, H, heads="grand-nl(t=1.0, steps=1)", causal=True).double()
    plain = DiffusionAttention(D, H, causal=True).double()
    plain.load_state_dict(one.state_dict())
    assert torch.allclose(one(x), plain(x), atol=1e-12)
    # the state in model space: X_h <- X_h + tau (P(X_h) - I) X_h with P(X_h) from the layer's
    # projections of X_h (re-projected every step), output X_h W_V,h: the same as evolving q, k, v
    layer = DiffusionAttention(D, H, heads="grand-nl(t=1.5, steps=4):2,attention:2", causal=True).double()
    W, b = layer.qkv.weight, layer.qkv.bias
    outs = []
    for h in range(2):
        X = x.clone()
        for _ in range(4):
            q = X @ W[h * C : (h + 1) * C].T + b[h * C : (h + 1) * C]
            k = X @ W[D + h * C : D + (h + 1) * C].T + b[D + h * C : D + (h + 1) * C]
            P = dense_attention_reference(q, k, allowed=torch.ones(N, N, dtype=torch.bool).tril())
            X = X + (1.5 / 4) * (P @ X - X)
        outs.append(X @ W[2 * D + h * C : 2 * D + (h + 1) * C].T + b[2 * D + h * C : 2 * D + (h + 1) * C])
    q, k, v = _qkv(layer, x)
    P = dense_attention_reference(q[:, 2:], k[:, 2:], allowed=torch.ones(N, N, dtype=torch.bool).tril())
    att = P @ v[:, 2:]  # (B, 2, N, C): the attention heads
    y = torch.cat([outs[0], outs[1], att[:, 0], att[:, 1]], dim=-1)
    assert torch.allclose(layer(x), layer.out_proj(y), atol=1e-10)


def test_grand_nl_with_qk_norm_renormalises_the_evolving_queries():
    torch.manual_seed(5)
    x = torch.randn(1, N, D, dtype=f64)
    layer = DiffusionAttention(D, H, heads="grand-nl(t=1.0, steps=2):4", qk_norm=True).double()
    with torch.no_grad():
        layer.q_norm.weight.uniform_(0.5, 1.5)
        layer.k_norm.bias.uniform_(-0.3, 0.3)
    raw = layer.qkv(x).view(1, N, 3, H, C)
    X = torch.cat([raw[:, :, 0], raw[:, :, 1], raw[:, :, 2]], dim=-1).transpose(1, 2)  # (1, H, N, 3C)
    for _ in range(2):
        P = dense_attention_reference(layer.q_norm(X[..., :C]), layer.k_norm(X[..., C : 2 * C]))
        X = X + 0.5 * (P @ X - X)
    want = layer.out_proj(X[..., 2 * C :].transpose(1, 2).reshape(1, N, D))
    assert torch.allclose(layer(x), want, atol=1e-10)


def test_grand_nl_adaptive_solver_needs_torchdiffeq():
    try:
        import torchdiffeq  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install torchdiffeq"):
            build_operator("grand-nl", method="dopri5")
    else:  # pragma: no cover - torchdiffeq is not a dependency
        op = build_operator("grand-nl", method="dopri5", t=0.5)
        q, k, v = (torch.randn(1, 1, N, 4, dtype=f64) for _ in range(3))
        ref = grand_nl_reference(q, k, v, 0.5, 200, "rk4")
        assert torch.allclose(op.apply_context(RivalContext.dense(q, k, v)), ref, atol=1e-5)


# ---------------------------------------------------------------------------------- layer state
def test_neutreno_and_value_residual_read_the_first_layers_values():
    torch.manual_seed(6)
    x0, x1 = torch.randn(B, N, D, dtype=f64), torch.randn(B, N, D, dtype=f64)
    first = DiffusionAttention(D, H, causal=True).double()
    second = DiffusionAttention(D, H, heads="neutreno(lam=0.6):2,value-residual(lam=0.5):1,attention:1",
                                causal=True).double()
    pad = _pad()
    allowed = _allowed(True, pad)
    state = LayerState()
    first(x0, key_padding_mask=pad, state=state)
    got = second(x1, key_padding_mask=pad, state=state)
    assert state.depth == 2
    v0 = _qkv(first, x0)[2]
    refs = [
        lambda q, k, v: neutreno_reference(q, k, v, v0[:, :2], 0.6, allowed),
        lambda q, k, v: value_residual_reference(q, k, v, v0[:, 2:3], 0.5, allowed),
        _attention_ref(allowed),
    ]
    assert torch.allclose(got, _layer_reference(second, x1, allowed, refs), atol=1e-10)
    # without a state (or as the first layer) both are plain attention
    plain = DiffusionAttention(D, H, causal=True).double()
    plain.load_state_dict(second.state_dict())
    assert torch.allclose(second(x1), plain(x1), atol=1e-12)
    assert torch.allclose(second(x1, state=LayerState()), plain(x1), atol=1e-12)


def test_layer_state_refuses_layers_of_another_shape():
    state = LayerState()
    DiffusionAttention(D, H)(torch.randn(1, N, D), state=state)
    with pytest.raises(ValueError, match="same batch, length, heads and head width"):
        DiffusionAttention(D, H, heads="neutreno")(torch.randn(1, N + 1, D), state=state)


def test_sparse_layer_state_matches_dense():
    torch.manual_seed(7)
    x0, x1 = torch.randn(1, N, D, dtype=f64), torch.randn(1, N, D, dtype=f64)
    first = DiffusionAttention(D, H).double()
    second = DiffusionAttention(D, H, heads="neutreno:2,value-residual:2").double()
    s_dense, s_sparse = LayerState(), LayerState()
    first(x0, state=s_dense)
    first(x0[0], edge_index=complete_edge_index(N), state=s_sparse)
    dense = second(x1, state=s_dense)[0]
    sparse = second(x1[0], edge_index=complete_edge_index(N), state=s_sparse)
    assert torch.allclose(dense, sparse, atol=1e-12)
    assert not torch.allclose(dense, second(x1)[0])


def test_causal_sparse_rivals_match_the_causal_dense_layer():
    # the sparse context drops the edges j > i through the public diffuse_sparse(is_causal=True)
    torch.manual_seed(8)
    x0, x1 = torch.randn(1, N, D, dtype=f64), torch.randn(1, N, D, dtype=f64)
    first = DiffusionAttention(D, H, causal=True).double()
    second = DiffusionAttention(D, H, heads="attnscale(omega=0.4):1,neutreno:1,differential:1,grand-nl(steps=2):1",
                                causal=True).double()
    s_dense, s_sparse = LayerState(), LayerState()
    first(x0, state=s_dense)
    first(x0[0], edge_index=complete_edge_index(N), state=s_sparse)
    dense = second(x1, state=s_dense)[0]
    sparse = second(x1[0], edge_index=complete_edge_index(N), state=s_sparse)
    torch.testing.assert_close(sparse, dense, atol=1e-12, rtol=0)
    second.causal, s_all = False, LayerState()  # the same layer and state on all edges differs
    first(x0[0], edge_index=complete_edge_index(N), state=s_all)
    assert not torch.allclose(second(x1[0], edge_index=complete_edge_index(N), state=s_all), dense)


# ---------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("heads", [
    "attnscale(omega=0.5):1,ppr-exact(alpha=0.3):1",
    "differential(depth=1):2",
    "grand-nl(t=0.7, steps=2, method='rk4'):1,neutreno:1",
    "value-residual:1,polynomial(steps=2, init=[0.2, 0.5, 0.3], basis='chebyshev'):1",
])
def test_gradcheck_float64_causal_padded(heads):
    torch.manual_seed(8)
    layer = DiffusionAttention(8, 2, heads=heads, causal=True).double()
    first = DiffusionAttention(8, 2).double()
    pad = torch.zeros(2, 4, dtype=torch.bool)
    pad[1, 3:] = True
    x = torch.randn(2, 4, 8, dtype=f64, requires_grad=True)
    x0 = torch.randn(2, 4, 8, dtype=f64, requires_grad=True)

    def run(x, x0, *params):
        state = LayerState()
        first(x0, key_padding_mask=pad, state=state)
        y = layer(x, key_padding_mask=pad, state=state)
        return y[~pad]  # padded query rows are unspecified

    params = [p for p in layer.parameters() if p.requires_grad]
    assert torch.autograd.gradcheck(run, (x, x0, *params), eps=1e-6, atol=1e-6)
    y = run(x, x0)
    y.sum().backward()
    learned = {n: p.grad for n, p in layer.named_parameters() if n.startswith("operators")}
    assert all(g is not None and torch.isfinite(g).all() for g in learned.values()), learned


# ---------------------------------------------------------------------------------- models
@pytest.mark.parametrize("heads", ["attention:1,neutreno:1", "differential:1,value-residual:1",
                                   "attnscale:1,grand-nl(steps=2):1"])
def test_every_model_family_runs_the_rivals(heads):
    from diffusionformer.models import create_model

    torch.manual_seed(9)
    gpt = create_model("gpt-char-tiny", vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, heads=heads)
    idx = torch.randint(0, 11, (2, 8))
    logits, loss = gpt(idx, idx)
    loss.backward()
    vit = create_model("vit-digits", dim=8, depth=2, num_heads=2, heads=heads)
    assert vit(torch.rand(2, 1, 8, 8)).shape[0] == 2
    gt = create_model("graph-node-small", in_channels=3, num_classes=2, dim=8, num_heads=2, heads=heads)
    assert gt(torch.randn(7, 3), complete_edge_index(7)).shape == (7, 2)


def test_gpt_threads_the_first_layers_values_to_later_layers():
    from diffusionformer.models import create_model

    torch.manual_seed(10)
    model = create_model("gpt-char-tiny", vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8,
                         heads=[None, "neutreno(lam=0.6):2"], dropout=0.0).double().eval()
    idx = torch.randint(0, 11, (2, 8))
    blocks = model.blocks
    h = model.tok_emb(idx) + model.pos_emb(torch.arange(8))
    v0 = _qkv(blocks[0].attn, blocks[0].norm1(h))[2]
    h = blocks[0](h)
    x1 = blocks[1].norm1(h)
    q, k, v = _qkv(blocks[1].attn, x1)
    allowed = torch.ones(8, 8, dtype=torch.bool).tril()
    a = blocks[1].attn.out_proj(neutreno_reference(q, k, v, v0, 0.6, allowed).transpose(1, 2).reshape(2, 8, 8))
    h = h + a
    h = h + blocks[1].mlp(blocks[1].norm2(h))
    want = model.lm_head(model.norm(h))
    assert torch.allclose(model(idx)[0], want, atol=1e-10)


def test_rival_reference_covers_every_rival():
    q, k, v = (torch.randn(1, 2, N, 4, dtype=f64) for _ in range(3))
    for name in ("ppr-exact", "attnscale", "neutreno", "value-residual", "differential", "grand-nl"):
        op = build_operator(name, num_heads=2)
        op.bind(head_dim=4)
        assert rival_reference(op.double(), q, k, v).shape == v.shape
    with pytest.raises(TypeError, match="no rival reference"):
        rival_reference(build_operator("heat"), q, k, v)


def test_recording_attentions_does_not_disturb_the_layer_state():
    from diffusionformer.analysis.capture import LayerRecorder
    from diffusionformer.models import create_model

    torch.manual_seed(11)
    model = create_model("gpt-char-tiny", vocab_size=11, block_size=8, n_layer=3, n_head=2, n_embd=8,
                         heads=[None, "neutreno:1,differential:1", "value-residual:2"], dropout=0.0).double().eval()
    idx = torch.randint(0, 11, (2, 8))
    plain = model(idx)[0]
    with LayerRecorder(model, attentions=True) as rec:
        recorded = model(idx)[0]
    assert torch.allclose(recorded, plain, atol=1e-12)
    assert sorted(rec.attentions) == [0, 1, 2]


@pytest.mark.parametrize("heads", ["differential(depth=2):1,attnscale(omega=0.4):1",
                                   "grand-nl(t=0.9, steps=2, method='rk4'):1,neutreno:1"])
def test_gradcheck_float64_sparse(heads):
    torch.manual_seed(12)
    layer = DiffusionAttention(8, 2, heads=heads).double()
    first = DiffusionAttention(8, 2).double()
    edges = complete_edge_index(5)
    edges = edges[:, (edges[0] + 2 * edges[1]) % 3 != 0]  # an irregular graph (some nodes lose in-edges)
    x = torch.randn(5, 8, dtype=f64, requires_grad=True)
    x0 = torch.randn(5, 8, dtype=f64, requires_grad=True)

    def run(x, x0):
        state = LayerState()
        first(x0, edge_index=edges, state=state)
        return layer(x, edge_index=edges, state=state)

    assert torch.autograd.gradcheck(run, (x, x0), eps=1e-6, atol=1e-6)
    # and the same graph as a dense mask gives the same output
    allowed = torch.zeros(5, 5, dtype=torch.bool)
    allowed[edges[1], edges[0]] = True
    s_dense, s_sparse = LayerState(), LayerState()
    first(x0[None], attn_mask=allowed, state=s_dense)
    dense = layer(x[None], attn_mask=allowed, state=s_dense)[0]
    rows = allowed.any(-1)
    assert torch.allclose(dense[rows], run(x, x0)[rows], atol=1e-10)
