"""Edge-case probes of the layers' parts: the KV cache, rotary embeddings, edge features, head layouts,
skipped modules, sampling (``generate``, ``top_k`` / ``top_p``) and ``recompute_saved``.

Probed against independent float64 references: cached decoding (prompt, then token by token; every
operator of the registry, with RoPE, GQA and q/k norm) vs the full forward; ``generate`` with and
without the cache across ``block_size`` (greedy and seeded sampling); RoPE (1-D, 2-D, float and
large positions) vs explicit rotation matrices; ``edge_feature_attention`` vs per-edge scores, a
per-target softmax and ``P^k v`` written out (duplicate edges, self-loops, nodes without in-edges,
GQA, q/k norm, K-step heads).
"""

from __future__ import annotations

import pytest


# --- tests of the /tmp/pj helper ---------------------------------------------------------------------------
# (generation, recompute_saved, is_noop, edge features; every import local to its test: the file is shared)


def test_bug_is_noop_sees_a_forward_replaced_on_the_instance():
    """Bug: ``is_noop`` called an ``nn.Identity`` whose ``forward`` was replaced on the instance (as
    ``accelerate``'s ``add_hook_to_module`` does) a no-op, so the layers skipped the replacement: a q-norm
    slot wrapped by a tool was never called, and the layer's output ignored it."""
    import torch
    from torch import nn

    from diffusionformer.nn import DiffusionAttention
    from diffusionformer.nn._skip import is_noop

    m = nn.Identity()
    m.forward = lambda t: t * 0
    assert not is_noop(m)
    assert is_noop(nn.Identity())
    layer = DiffusionAttention(8, 2)
    x = torch.randn(1, 4, 8, generator=torch.Generator().manual_seed(0))
    plain = layer(x)
    layer.q_norm.forward = lambda t: t * 0  # every query 0: uniform attention, another output
    assert not torch.allclose(layer(x), plain)
    assert torch.allclose(layer(x), layer._modules["out_proj"](
        layer._project(x)[2].mean(1, keepdim=True).expand(1, 4, 2, 4).reshape(1, 4, 8)))


@pytest.mark.parametrize("bad", [float("nan"), -0.5, True])
def test_bug_edge_feature_attention_checks_the_dropout_attribute(bad):
    """Bug: ``edge_feature_attention`` read ``layer.dropout`` unchecked: a NaN or negative value was silently
    no dropout and ``True`` dropped every weight of ``P`` (``F.dropout(p=True)``), where the layer's own
    calls refuse them ("dropout must lie in [0, 1)")."""
    import torch

    from diffusionformer.nn import DiffusionAttention, edge_feature_attention

    layer = DiffusionAttention(8, 2, "heat(steps=2):2").train()
    layer.dropout = bad
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
    with pytest.raises(ValueError, match=r"dropout must lie in \[0, 1\), got"):
        layer(x, edge_index=ei)
    with pytest.raises(ValueError, match=r"dropout must lie in \[0, 1\), got"):
        edge_feature_attention(layer, x, ei, torch.zeros(3, 8))


@pytest.mark.parametrize("temperature", [float("inf"), 1e300])
def test_bug_generate_keeps_top_k_at_a_huge_temperature(temperature):
    """Bug: ``generate`` divided the logits by the temperature before ``top_k``: at ``inf`` (or any temperature
    beyond float32's range) every logit became 0, all tokens tied with the ``k``-th, and ``top_k=2`` sampled
    the whole vocabulary. The ``k`` most likely tokens do not depend on the temperature."""
    import torch

    from diffusionformer.models import DiffusionGPT, GPTConfig

    torch.manual_seed(0)
    m = DiffusionGPT(GPTConfig(vocab_size=11, block_size=6, n_layer=1, n_head=2, n_embd=8))
    idx = torch.zeros(200, 1, dtype=torch.long)
    top2 = set(m(idx[:1])[0][0, -1].topk(2).indices.tolist())
    for use_cache in (False, True):
        out = m.generate(idx, 1, temperature=temperature, top_k=2, use_cache=use_cache,
                         generator=torch.Generator().manual_seed(0))
        assert set(out[:, -1].tolist()) == top2  # uniform over the two: both drawn among 200 samples


@pytest.mark.parametrize("z_rows, other_rows", [((0, 3), (3, 6)), ((3, 6), (0, 3)), ((2, 5), (0, 1))])
def test_bug_recompute_saved_keeps_the_rest_of_a_larger_base(z_rows, other_rows):
    """Bug: ``recompute_saved`` took every saved tensor sharing ``z``'s base for a view of ``z``: where ``z``
    was a slice of a larger tensor, another slice of it was stored as a recipe too and rebuilt from ``fn()``
    (``z``'s elements alone), so the backward pass failed ("setStorage: ... out of bounds", "invalid storage
    offset"). Only views within ``z`` are rebuilt now; the gradients equal those without the context."""
    import torch
    import torch.nn.functional as F

    from diffusionformer.ops.recompute import recompute_saved

    g = torch.Generator().manual_seed(0)
    a = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    (lo, hi), (olo, ohi) = z_rows, other_rows

    def grads(recompute: bool) -> tuple[torch.Tensor, torch.Tensor]:
        base = a * 2.0
        z, other = base[lo:hi], base[olo:ohi]
        if recompute:
            with recompute_saved(z, lambda: a.detach()[lo:hi] * 2.0):
                y = F.linear(z, w).sum() + (F.linear(other, w) ** 2).sum()
        else:
            y = F.linear(z, w).sum() + (F.linear(other, w) ** 2).sum()
        return torch.autograd.grad(y, (a, w))

    for want, got in zip(grads(False), grads(True)):
        assert torch.equal(want, got)


def test_bug_attend_cached_refuses_positions_without_a_rotary_embedding():
    """Bug: ``attend_cached(layer, x, cache, positions=...)`` on a layer without ``rotary`` ignored the
    positions silently, where the layer's forward refuses them."""
    import torch

    from diffusionformer.nn import DiffusionAttention, LayerKVCache, attend_cached

    layer = DiffusionAttention(8, 2, causal=True)
    x = torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match="positions would be ignored"):
        layer(x, positions=torch.arange(3))
    with pytest.raises(ValueError, match="attend_cached: positions=.*positions would be ignored"):
        attend_cached(layer, x, LayerKVCache(), positions=torch.arange(3))


def test_bug_rotary_names_positions_on_another_device():
    """Bug: ``RotaryEmbedding`` with ``positions`` on another device than ``x`` failed inside the rotation with
    torch's bare "Tensor on device cpu is not on the expected device meta!", naming neither argument."""
    import torch

    from diffusionformer.nn import RotaryEmbedding, RotaryEmbedding2D

    with pytest.raises(ValueError, match=r"RotaryEmbedding: expected positions on the device of x \(meta\), got cpu"):
        RotaryEmbedding(4)(torch.zeros(3, 1, 4, device="meta"), torch.arange(3))
    with pytest.raises(ValueError, match=r"RotaryEmbedding2D: expected positions on the device of x \(cpu\), got meta"):
        RotaryEmbedding2D(4)(torch.zeros(3, 1, 4), torch.zeros(3, 2, device="meta"))


# --- tests of the second helper (J2): head-spec grammar, float64 generation, 2-D rotary in the cache ---------
# (its imports are private aliases at the top of its section: the file is shared)
import math as _math
import re as _re

import pytest as _pytest
import torch as _torch

from diffusionformer.models import DiffusionGPT as _GPT, GPTConfig as _GPTConfig
from diffusionformer.nn.attention import DiffusionAttention as _Attention
from diffusionformer.nn.edge_features import edge_feature_attention as _edge_attention
from diffusionformer.nn.heads import format_head_spec as _format, parse_heads as _parse, resolve_layer_heads as _resolve
from diffusionformer.nn.kv_cache import LayerKVCache as _Cache
from diffusionformer.nn.rotary import RotaryEmbedding2D as _Rope2D
from diffusionformer.operators import build_operator as _build


def _groups(spec, num_heads):
    return [(g.operator.name, g.start, g.count) for g in _parse(spec, num_heads)]


def test_bug_generate_keeps_float64_logits():
    """Bug: ``generate`` cast the last logits to float32 whatever the model's dtype: a float64 model whose two
    best logits differ by 1e-10 (relative) saw them tied and greedy decoding took the first, not the model's
    argmax. Now only float16/bfloat16 logits are cast up; float64 ones stay."""
    _torch.manual_seed(0)
    model = _GPT(_GPTConfig(vocab_size=3, block_size=8, n_layer=1, n_head=2, n_embd=8, tie_weights=False)).double()
    model.eval()
    prompt = _torch.tensor([[1, 2]])
    with _torch.no_grad():
        h = model.norm(model.blocks[0](model._embed(prompt)))[0, -1]
        u = h / h.norm()  # logit 0 = |h| > 0, logit 1 = |h| (1 + 1e-10): token 1 is the argmax in float64
        model.lm_head.weight.copy_(_torch.stack([u, u * (1 + 1e-10), -u]))
        assert int(model(prompt)[0][0, -1].argmax()) == 1
    for use_cache in (False, True):
        assert model.generate(prompt, 1, temperature=0, use_cache=use_cache)[0, -1].item() == 1


@_pytest.mark.parametrize("count", ["1_0", "+10", "\u0661\u0660"])
def test_bug_head_count_is_ascii_digits(count):
    """Bug: the count after ':' was read by ``int()``, which also takes '1_0' (ten), '+10' and Arabic-Indic
    digits, so a typo such as 'attention:1_0' gave a layer of ten heads. The grammar is now ASCII digits 0-9
    (blanks around them allowed), anything else is named."""
    with _pytest.raises(ValueError, match=r"head count after ':' must be an integer, got "):
        _parse(f"attention:{count}", 10)
    assert _groups("attention: 4 ,laplacian:06", 10) == [("attention", 0, 4), ("laplacian", 4, 6)]
    with _pytest.raises(ValueError, match=r"head count must be non-negative, got -0 in 'attention:-0'"):
        _parse("attention:-0,laplacian:10", 10)


@_pytest.mark.parametrize("key", ["1_0", " 1", "+1", "\u0661"])
def test_bug_dict_layer_keys_are_ascii_integers(key):
    """Bug: a string key of a ``{layer: spec}`` dict (TOML's keys) was read by ``int()``: '1_0' named layer 10,
    ' 1' and '+1' layer 1. Keys are now an optional '-' and ASCII digits; the rest is named."""
    with _pytest.raises(ValueError, match=r"got the key " + _re.escape(repr(key))):
        _resolve(12, 2, {key: "laplacian:2"})
    assert _resolve(12, 2, {"10": "laplacian:2", "-1": "laplacian:2"})[10:] == ["laplacian:2", "laplacian:2"]


def test_bug_bytes_heads_are_refused_as_bytes():
    """Bug: ``resolve_layer_heads(heads=b"laplacian:2")`` read the bytes as a per-layer list of ints and said
    "a per-layer heads list must have 2 entries (one per layer), got 11"; ``parse_heads`` already refuses
    bytes. Now a TypeError names bytes."""
    with _pytest.raises(TypeError, match=r"got bytes b'laplacian:2' \(decode it to a str\)"):
        _resolve(2, 2, b"laplacian:2")
    with _pytest.raises(TypeError, match="got bytearray"):
        _GPTConfig(n_layer=2, n_head=2, n_embd=8, heads=bytearray(b"laplacian:2"))


@_pytest.mark.parametrize("spec", ["attention:{H[0]}", "attention:{half.x}"])
def test_bug_a_template_with_an_index_or_attribute_is_named(spec):
    """Bug: a template such as '{H[0]}' escaped ``format_head_spec`` as Python's bare TypeError "'int' object
    is not subscriptable" (and '{half.x}' as an AttributeError); now the ValueError of unknown templates."""
    with _pytest.raises(ValueError, match=r"only the templates \{H\} and \{half\} are known"):
        _format(spec, 4)


def test_bug_one_head_instance_message_says_what_it_expects():
    """Bug: an instance built for 2 heads given for 1 head read "...covers 1 consecutive heads (starting at
    head 0); expected 1 or 1". Now "expected 1"."""
    op = _build("heat", num_heads=2)
    with _pytest.raises(ValueError, match=r"covers 1 consecutive heads \(starting at head 0\); expected 1$"):
        _parse([op, "attention"], 2)


def test_bug_cached_2d_rotary_names_its_missing_positions():
    """Bug: a causal layer with a 2-D rotary decoded through a cache without ``positions=`` was refused with
    "expected positions of shape (N, 2), got (2,)", positions the caller never gave (the cache built an arange).
    Now the rotary's own default answers ("expected explicit (N, 2) positions"), as the uncached forward does;
    with explicit grid positions the cache still equals the full forward."""
    layer = _Attention(8, 2, causal=True, rotary=_Rope2D(4)).double().eval()
    x = _torch.randn(1, 3, 8, dtype=_torch.float64, generator=_torch.Generator().manual_seed(0))
    for call in (lambda: layer(x), lambda: layer(x, cache=_Cache())):
        with _pytest.raises(ValueError, match=r"expected explicit \(N, 2\) positions"):
            call()
    grid = _torch.tensor([[0, 0], [0, 1], [1, 0]])
    cache = _Cache()
    out = _torch.cat([layer(x[:, :2], cache=cache, positions=grid[:2]), layer(x[:, 2:], cache=cache, positions=grid[2:])], 1)
    _torch.testing.assert_close(out, layer(x, positions=grid), rtol=0, atol=1e-12)


def test_bug_rotary2d_base_error_names_the_2d_class():
    """Bug: ``RotaryEmbedding2D(8, base=0.5)`` was refused as "RotaryEmbedding: expected base ...", the 1-D
    class's name; now the message names RotaryEmbedding2D, as its head_dim message does."""
    with _pytest.raises(ValueError, match=r"^RotaryEmbedding2D: expected base a finite float > 1, got 0.5$"):
        _Rope2D(8, base=0.5)


def test_rotary2d_matches_explicit_rotation_matrices():
    """Pins: 2-D RoPE equals an explicit block-diagonal rotation (first half by the row, second by the column)."""
    C, base = 8, 50.0
    x = _torch.randn(2, 3, 2, C, dtype=_torch.float64, generator=_torch.Generator().manual_seed(1))
    pos = _torch.tensor([[0, 0], [2, 5], [7, 1]])
    ref = _torch.empty_like(x)
    for n in range(3):
        R = _torch.zeros(C, C, dtype=_torch.float64)
        for i in range(C // 2):
            j, p = i % (C // 4), pos[n, 0 if i < C // 4 else 1]
            th = float(p) * base ** (-2 * j / (C // 2))
            R[2 * i:2 * i + 2, 2 * i:2 * i + 2] = _torch.tensor([[_math.cos(th), -_math.sin(th)],
                                                                [_math.sin(th), _math.cos(th)]], dtype=_torch.float64)
        ref[:, n] = x[:, n] @ R.T
    _torch.testing.assert_close(_Rope2D(C, base=base)(x, pos), ref, rtol=0, atol=1e-12)


@_pytest.mark.parametrize("heads,kw", [("attention:1,laplacian:1", {}), ("heat(t=0.6, steps=3):1,ppr(alpha=0.3, steps=2):1", {}),
                                       ("polynomial(steps=2):2", {"num_kv_heads": 1}), ("attention:2", {"qk_norm": True})])
def test_edge_feature_attention_matches_per_edge_formulas(heads, kw):
    """Pins: scores q_i (k_j + e_ij) / sqrt(C) per edge (duplicate edges and self loops included), a softmax over
    each target's edges, the dense P built from them and f(P) v per head, in float64."""
    g = _torch.Generator().manual_seed(2)
    N, D, H = 5, 8, 2
    C = D // H
    ei = _torch.tensor([[0, 1, 2, 3, 4, 1, 1, 0, 2], [1, 2, 0, 0, 4, 2, 0, 0, 3]])
    E = ei.shape[1]
    layer = _Attention(D, H, heads=heads, **kw).double().eval()
    with _torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * _torch.randn(p.shape, generator=g, dtype=p.dtype))
    x, ek = _torch.randn(N, D, dtype=_torch.float64, generator=g), _torch.randn(E, D, dtype=_torch.float64, generator=g)
    y, P = _edge_attention(layer, x, ei, ek, return_weights=True)
    with _torch.no_grad():
        q, k, v = layer._project(x)
        coeffs = layer._coefficients()
    out = _torch.zeros(N, H, C, dtype=_torch.float64)
    for h in range(H):
        s = [float(q[ei[1, e], h] @ (k[ei[0, e], h] + ek[e].view(H, C)[h])) / _math.sqrt(C) for e in range(E)]
        Pe, Pm = [0.0] * E, _torch.zeros(N, N, dtype=_torch.float64)
        for i in range(N):
            into = [e for e in range(E) if ei[1, e] == i]
            z = sum(_math.exp(s[e]) for e in into)
            for e in into:
                Pe[e] = _math.exp(s[e]) / z
                Pm[i, ei[0, e]] += Pe[e]
        _torch.testing.assert_close(P[:, h], _torch.tensor(Pe, dtype=_torch.float64), rtol=0, atol=1e-12)
        cur, acc = v[:, h], coeffs[h, 0] * v[:, h]
        for step in range(1, coeffs.shape[1]):
            cur = Pm @ cur
            acc = acc + coeffs[h, step] * cur
        out[:, h] = acc
    _torch.testing.assert_close(y, layer.out_proj(out.reshape(N, D)), rtol=0, atol=1e-12)


@_pytest.mark.parametrize("kw", [dict(temperature=0.3), dict(temperature=3.0), dict(top_k=2), dict(top_p=0.5),
                                 dict(top_k=3, top_p=0.7, temperature=0.7), dict(top_k=100)])
def test_sampling_matches_a_reference_loop_with_and_without_cache(kw):
    """Pins: temperature, top-k (above the vocabulary too) and top-p sampling, cached or not, draw the tokens of a
    loop written here (full forward, float64 filters, the same generator)."""
    _torch.manual_seed(0)
    model = _GPT(_GPTConfig(vocab_size=7, block_size=4, n_layer=2, n_head=2, n_embd=8,
                            heads="attention:1,heat(t=0.5):1")).eval()
    with _torch.no_grad():
        for p in model.parameters():
            p.mul_(8)  # sharp logits: the temperature and the filters matter
    prompt = _torch.randint(0, 7, (3, 2), generator=_torch.Generator().manual_seed(4))
    T, k, pp = kw.get("temperature", 1.0), kw.get("top_k"), kw.get("top_p")
    idx, g = prompt, _torch.Generator().manual_seed(5)
    with _torch.no_grad():
        for _ in range(8):
            lg = model(idx[:, -4:])[0][:, -1].double() / T
            if k is not None:
                lg = lg.masked_fill(lg < lg.topk(min(k, 7)).values[:, -1:], float("-inf"))
            if pp is not None:
                srt, order = lg.softmax(-1).sort(-1, descending=True)
                drop = (srt.cumsum(-1) - srt) >= pp
                drop[:, 0] = False
                lg = lg.masked_fill(_torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
            idx = _torch.cat([idx, _torch.multinomial(lg.softmax(-1).float(), 1, generator=g)], 1)
    for use_cache in (False, True):
        out = model.generate(prompt, 8, generator=_torch.Generator().manual_seed(5), use_cache=use_cache, **kw)
        assert _torch.equal(out, idx)
