"""Probes of the dense attention path under masks (no bug found: these pin the behaviour checked)."""

import pytest
import torch
import torch.nn as nn

from diffusionformer.nn.attention import DiffusionAttention

B, N, D, H = 2, 5, 16, 4


def _reference_mixed(layer: DiffusionAttention, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """heat-exact:1, attention:2, ppr-exact:1 from an explicit float64 P (masked entries removed, empty rows zero)."""
    C = D // H
    q, k, v = (t.view(B, N, H, C).transpose(1, 2) for t in layer.qkv(x).split(D, -1))
    s = (q @ k.transpose(-1, -2)) / C**0.5
    P = torch.softmax(s.masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0)
    eye = torch.eye(N, dtype=torch.float64)
    y = torch.cat([torch.matrix_exp(P[:, :1] - eye) @ v[:, :1], P[:, 1:3] @ v[:, 1:3],
                   0.1 * torch.linalg.solve(eye - 0.9 * P[:, 3:], v[:, 3:])], dim=1)
    return layer.out_proj(y.transpose(1, 2).reshape(B, N, D))


@pytest.mark.parametrize("backend", ["matrix", "sdpa", "auto"])
@pytest.mark.parametrize("causal", [False, True])
def test_non_polynomial_heads_under_per_head_mask_padding_and_causal_match_float64(backend, causal):
    torch.manual_seed(0)
    x = torch.randn(B, N, D, dtype=torch.float64)
    attend = torch.rand(B, H, N, N) < 0.6
    attend[..., 0] = True
    attend[1, 3, 2] = False  # a query row without keys in one head
    pad = torch.tensor([[False] * 4 + [True], [False] * 5])
    layer = DiffusionAttention(D, H, "heat-exact:1,attention:2,ppr-exact:1", backend=backend,
                               causal=causal).double().eval()
    y, inter = layer(x, attn_mask=attend, key_padding_mask=pad, return_intermediates=True)
    keep = attend & ~pad[:, None, None, :]
    if causal:
        keep = keep & torch.ones(N, N, dtype=torch.bool).tril()
    assert torch.allclose(y, _reference_mixed(layer, x, keep), atol=1e-12)
    assert torch.allclose(layer(x, attn_mask=attend, key_padding_mask=pad), y, atol=1e-12)


@pytest.mark.parametrize("heads", ["heat:2,polynomial:2", "heat-exact:2,ppr-exact:2", "differential:4"])
@pytest.mark.parametrize("backend", ["matrix", "sdpa"])
def test_padded_tokens_carry_no_mass_into_kept_rows(heads, backend):
    torch.manual_seed(1)
    x = torch.randn(B, 6, D, dtype=torch.float64)
    pad = torch.zeros(B, 6, dtype=torch.bool)
    pad[0, 4:] = True
    x2 = x.clone()
    x2[pad] = 10 * torch.randn(int(pad.sum()), D, dtype=torch.float64)
    layer = DiffusionAttention(D, H, heads, backend=backend).double().eval()
    y = layer(x, key_padding_mask=pad)
    assert torch.allclose(y[~pad], layer(x2, key_padding_mask=pad)[~pad], atol=1e-12)
    assert torch.allclose(y[0, :4], layer(x[:1, :4])[0], atol=1e-12)  # as if the padding were cut off
    assert torch.isfinite(layer(x, key_padding_mask=torch.ones(B, 6, dtype=torch.bool))).all()


def test_bool_and_float_masks_with_padding_match_multihead_attention_weights():
    torch.manual_seed(2)
    mha = nn.MultiheadAttention(D, H, batch_first=True, dtype=torch.float64).eval()
    layer = DiffusionAttention.from_multihead_attention(mha).eval()
    x = torch.randn(B, N, D, dtype=torch.float64)
    pad = torch.tensor([[False] * 3 + [True] * 2, [False] * 5])
    blocked = torch.rand(N, N) < 0.3
    blocked.fill_diagonal_(False)
    y, w = mha(x, x, x, key_padding_mask=pad, attn_mask=blocked, average_attn_weights=False)
    yd, inter = layer(x, key_padding_mask=pad, attn_mask=~blocked, return_intermediates=True)
    assert torch.allclose(yd, y, atol=1e-12) and torch.allclose(inter.attn_weights, w, atol=1e-12)
    per_head = torch.randn(B * H, N, N, dtype=torch.float64)
    y = mha(x, x, x, attn_mask=per_head, need_weights=False)[0]
    for backend in ("matrix", "sdpa"):
        layer.backend = backend
        assert torch.allclose(layer(x, attn_mask=per_head.view(B, H, N, N)), y, atol=1e-12)


def test_gradcheck_through_masks_with_an_empty_query_row():
    torch.manual_seed(3)
    layer = DiffusionAttention(8, 2, "heat-exact:1,heat:1", backend="sdpa").double()
    attend = torch.ones(4, 4, dtype=torch.bool)
    attend[1] = False
    pad = torch.tensor([[False, False, False, True]])
    x = torch.randn(1, 4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: layer(z, attn_mask=attend, key_padding_mask=pad), (x,))
