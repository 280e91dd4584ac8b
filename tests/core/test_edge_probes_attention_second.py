"""Edge probes (second pass) of DiffusionAttention, head layouts and the KV cache against independent references.

No bug was found in this pass: these pin promises that hold, each against a reference that does not share the
layer's code (torch.nn.MultiheadAttention, an explicit float64 per-head formula, the full causal forward).
"""

from __future__ import annotations

import copy
import io
import math
import pickle

import pytest
import torch
from torch import nn

from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.kv_cache import LayerKVCache

D, H = 16, 4


def _reference(layer: DiffusionAttention, x: torch.Tensor, keep: torch.Tensor | None = None,
               causal: bool = False) -> torch.Tensor:
    """The layer in float64, head by head: f_h(P_h) v_h with f_h written out (matrix powers, matrix_exp, inverse)."""
    x = x.double()
    B, N, _ = x.shape
    C, G = layer.head_dim, layer.num_kv_heads
    qkv = x @ layer.qkv.weight.double().T + layer.qkv.bias.double()
    q = qkv[..., : H * C].view(B, N, H, C).transpose(1, 2)
    k = qkv[..., H * C : (H + G) * C].view(B, N, G, C).transpose(1, 2).repeat_interleave(H // G, 1)
    v = qkv[..., (H + G) * C :].view(B, N, G, C).transpose(1, 2).repeat_interleave(H // G, 1)
    allowed = torch.ones(N, N, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    if keep is not None:
        allowed = allowed & keep
    P = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(C)).masked_fill(~allowed, float("-inf")), -1)
    eye = torch.eye(N, dtype=torch.float64)
    heads = []
    for op, (s, c) in zip(layer.operators, layer._groups):
        for j in range(c):
            Ph = P[:, s + j]
            if op.name == "heat-exact":
                F = torch.linalg.matrix_exp(-float(op.t.view(-1)[0]) * (eye - Ph))
            elif op.name == "ppr-exact":
                F = op.alpha * torch.linalg.inv(eye - (1 - op.alpha) * Ph)
            else:
                co = op.head_coefficients(c).double()[j]
                F = sum(co[m] * torch.linalg.matrix_power(Ph, m) for m in range(len(co)))
            heads.append(F @ v[:, s + j])
    out = torch.stack(heads, 1).transpose(1, 2).reshape(B, N, D)
    return out @ layer.out_proj.weight.double().T + layer.out_proj.bias.double()


@pytest.mark.parametrize("batch_first", [True, False])
def test_matches_multihead_attention_padding_weights_and_masks(batch_first):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(D, H, batch_first=batch_first).double().eval()
    layer = DiffusionAttention.from_multihead_attention(mha).eval()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    xm = x if batch_first else x.transpose(0, 1)
    back = (lambda t: t) if batch_first else (lambda t: t.transpose(0, 1))
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[1, 3:] = True
    ref, w = mha(xm, xm, xm, key_padding_mask=kpm, need_weights=True, average_attn_weights=False)
    y, inter = layer(x, key_padding_mask=kpm, return_intermediates=True)
    torch.testing.assert_close(y, back(ref))
    torch.testing.assert_close(inter.attn_weights, w)
    _, w_avg = mha(xm, xm, xm, key_padding_mask=kpm, need_weights=True, average_attn_weights=True)
    torch.testing.assert_close(inter.attn_weights.mean(1), w_avg)
    # a float key_padding_mask (MultiheadAttention's additive form) is refused, naming the dtype
    with pytest.raises(TypeError, match="key_padding_mask.*float64"):
        layer(x, key_padding_mask=torch.zeros(2, 5, dtype=torch.float64))
    # 2-D bool mask: MultiheadAttention's True = blocked is the negation of the layer's True = attend
    blocked = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    ref, _ = mha(xm, xm, xm, attn_mask=blocked, need_weights=False)
    torch.testing.assert_close(layer(x, attn_mask=~blocked), back(ref))
    torch.testing.assert_close(layer(x, is_causal=True), back(ref))
    # 3-D float mask (B * H, N, N): taken once viewed as (B, H, N, N); as given, refused with that hint
    am = torch.randn(2 * H, 5, 5, dtype=torch.float64)
    ref, _ = mha(xm, xm, xm, attn_mask=am, need_weights=False)
    torch.testing.assert_close(layer(x, attn_mask=am.view(2, H, 5, 5)), back(ref))
    with pytest.raises(ValueError, match=r"attn_mask.view\(2, 4, 5, 5\)"):
        layer(x, attn_mask=am)


@pytest.mark.parametrize("spec", [
    "attention:1,laplacian:1,heat(t=0.7):1,ppr(alpha=0.3):1",
    "heat-exact(t=0.4):1,ppr-exact(alpha=0.2):1,attention:1,heat(t=1.3, steps=3, learnable=True):1",
    "laplacian:2,ppr(alpha=0.1, learnable=True):2",
])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("backend", ["auto", "matrix"])
def test_mixed_layouts_match_float64_per_head_formula(spec, kv_heads, backend):
    torch.manual_seed(1)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1, 4:] = True
    per_head = (torch.rand(1, H, 6, 6) > 0.3) | torch.eye(6, dtype=torch.bool)
    for causal in (False, True):
        layer = DiffusionAttention(D, H, heads=spec, num_kv_heads=kv_heads, causal=causal, backend=backend).double()
        torch.testing.assert_close(layer(x), _reference(layer, x, causal=causal), rtol=0, atol=1e-10)
        torch.testing.assert_close(layer(x, key_padding_mask=kpm),
                                   _reference(layer, x, (~kpm)[:, None, None, :], causal), rtol=0, atol=1e-10)
        torch.testing.assert_close(layer(x, attn_mask=per_head), _reference(layer, x, per_head, causal),
                                   rtol=0, atol=1e-10)
    layer = layer.float()  # float32 within float32 rounding of the same formula
    torch.testing.assert_close(layer(x.float()).double(), _reference(layer, x, causal=True), rtol=0, atol=1e-4)


def test_per_layer_head_maps_match_the_formula_layer_by_layer():
    from diffusionformer.nn.heads import resolve_layer_heads

    specs = resolve_layer_heads(3, H, heads={0: "heat-exact(t=0.3):{half},attention:{half}", -1: "ppr(alpha=0.4):{H}"})
    assert specs == ["heat-exact(t=0.3):2,attention:2", None, "ppr(alpha=0.4):4"]
    torch.manual_seed(2)
    x = torch.randn(1, 5, D, dtype=torch.float64)
    for spec in specs:
        layer = DiffusionAttention(D, H, heads=spec, num_kv_heads=2).double()
        torch.testing.assert_close(layer(x), _reference(layer, x), rtol=0, atol=1e-10)
        x = layer(x).detach()


@pytest.mark.parametrize("spec", [
    "attention:1,laplacian:1,heat(t=0.7):1,ppr(alpha=0.3):1", "polynomial:4", "heat-exact:2,ppr-exact:2",
    "heat(t=0.5, learnable=True):2,ppr(alpha=0.2, learnable=True):2", "differential:4", "neutreno:4",
    "value-residual:4", "grand-nl:4", "attnscale:4",
])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_cached_decoding_token_by_token_equals_full_causal_forward(spec, kv_heads):
    torch.manual_seed(2)
    layer = DiffusionAttention(D, H, heads=spec, num_kv_heads=kv_heads, causal=True).double().eval()
    x = torch.randn(2, 7, D, dtype=torch.float64)
    cache = LayerKVCache()
    assert layer(x[:, :0], cache=cache).shape == (2, 0, D) and cache.length == 0  # an empty call leaves it empty
    ys = [layer(x[:, :3], cache=cache)] + [layer(x[:, t : t + 1], cache=cache) for t in range(3, 7)]
    assert cache.length == 7
    torch.testing.assert_close(torch.cat(ys, 1), layer(x), rtol=0, atol=1e-10)


@pytest.mark.parametrize("source,target", [
    ("attention:4", "heat(t=0.5):4"),  # a buffer the source has not
    ("heat(t=0.5):4", "heat(t=0.9):4"),  # a fixed t is architecture
    ("heat(t=0.5, learnable=True):4", "heat(t=0.5):4"),
    ("heat(t=0.5, learnable=True):4", "heat(t=0.5, learnable=True, num_heads=1):4"),
    ("ppr(alpha=0.2, learnable=True):2,attention:2", "attention:2,ppr(alpha=0.2, learnable=True):2"),
    ("heat(t=0.5, learnable=True):2,heat(t=0.5, learnable=True):2", "heat(t=0.5, learnable=True):4"),
    ("polynomial(steps=2):4", "polynomial(steps=3):4"),
    ("heat-exact(t=0.5):4", "heat-exact(t=0.6):4"),
    ("ppr(alpha=0.2):4", "ppr(alpha=0.3):4"),
    ("differential:4", "attention:4"),
])
def test_state_dict_between_different_layouts_is_refused(source, target):
    with pytest.raises(RuntimeError):
        DiffusionAttention(D, H, heads=target).load_state_dict(DiffusionAttention(D, H, heads=source).state_dict())


def test_state_dict_round_trips_through_heads_spec_and_dtypes():
    torch.manual_seed(3)
    x = torch.randn(1, 5, D)
    layer = DiffusionAttention(D, H, heads="heat(t=0.5, learnable=True):2,ppr-exact(alpha=0.3):1,polynomial(steps=2):1")
    rebuilt = DiffusionAttention(D, H, heads=layer.heads_spec())
    rebuilt.load_state_dict(layer.state_dict())
    torch.testing.assert_close(rebuilt(x), layer(x), rtol=0, atol=0)
    # a fixed t rounded by .float()/.half() still loads into a layer built with that t
    for spec in ("heat-exact(t=0.7):4", "heat(t=0.7):4", "ppr(alpha=0.3):4"):
        DiffusionAttention(D, H, heads=spec).load_state_dict(DiffusionAttention(D, H, heads=spec).half().state_dict())
    with pytest.raises(RuntimeError, match="size mismatch for qkv.weight"):
        DiffusionAttention(D, H).load_state_dict(DiffusionAttention(D, H, num_kv_heads=2).state_dict())


@pytest.mark.slow  # torch.compile: a few seconds on CPU
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_compile_of_a_small_mixed_layer_matches_eager():
    torch.manual_seed(4)
    layer = DiffusionAttention(D, H, heads="attention:1,laplacian:1,heat(t=0.5, learnable=True):1,ppr-exact:1",
                               num_kv_heads=2).eval()
    x = torch.randn(2, 5, D)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(layer, fullgraph=False, backend="eager")
        torch.testing.assert_close(compiled(x, is_causal=True), layer(x, is_causal=True), rtol=0, atol=0)
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("spec", [None, "attention:1,laplacian:1,heat(t=0.5, learnable=True):1,ppr-exact:1"])
def test_deepcopy_pickle_and_torch_save_give_independent_equal_layers(spec):
    torch.manual_seed(5)
    layer = DiffusionAttention(D, H, heads=spec, causal=True).eval()
    x = torch.randn(2, 5, D)
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer)), torch.load(buf, weights_only=False)):
        torch.testing.assert_close(other(x), layer(x), rtol=0, atol=0)
        assert all(a is b for a, b in zip(other._plan_key, other.operators))  # the plan follows the copies
        assert not any(a is b for a, b in zip(other.operators, layer.operators))
        with torch.no_grad():
            for p in other.parameters():
                p.add_(0.1)
        assert not torch.equal(other(x), layer(x))
