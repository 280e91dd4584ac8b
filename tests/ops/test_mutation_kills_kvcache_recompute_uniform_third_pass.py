"""Tests written in a third mutation-testing audit of the KV cache of causal decoding
(``nn/kv_cache.py``: ``LayerKVCache``, ``attend_cached``), the recomputation of a layer's combined
output in the backward pass (``ops/recompute.py``) and the ``O(N)`` uniform map of AttnScale
(``ops/uniform_map.py``).

Each test kills a mutant of the library code that the rest of the suite let through (its docstring
names it: file and mutation) and checks the code against an independent reference: positions and
rotated keys written out by hand, gradients of the same layer with and without the recomputation
compared by ``torch.autograd.grad``, and float64 means over admissible keys computed with explicit
loops. The earlier passes (``tests/core/test_mutation_kills_nn_heads.py``,
``tests/models/test_mutation_kills_attention_gpt_second_pass.py``, ``tests/core/test_mutation_kills_ops.py``,
``tests/ops/test_mutation_kills_engine_second_pass.py``, ``tests/ops/test_mutation_kills_sparse_second_pass.py``)
are not repeated. Mutants judged equivalent are listed, with the reason, at the end of the file.
CPU only, deterministic, no network, no files.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached
from diffusionformer.nn.rotary import RotaryEmbedding
from diffusionformer.ops.recompute import recompute_saved, wants_recompute
from diffusionformer.ops.uniform_map import uniform_mean

F64 = torch.float64


# ---------------------------------------------------------------------------- kv_cache.py
def test_default_rotary_positions_continue_from_the_cache():
    """kills: kv_cache.attend_cached placing the new tokens at ``start + 1 .. start + n`` by default (``torch.arange(
    start + 1, start + n + 1)``). Rotary attention depends only on position differences, so the outputs agree; the
    cache does not: it keeps the positions ``0 .. T - 1`` (written here by hand) and the keys rotated at them."""
    torch.manual_seed(0)
    rotary = RotaryEmbedding(4, base=50.0)
    layer = DiffusionAttention(16, 4, "neutreno:2,attention:2", causal=True, rotary=rotary).double()
    x = torch.randn(1, 5, 16, dtype=F64)
    cache = LayerKVCache()
    for a, b in [(0, 2), (2, 3), (3, 5)]:
        attend_cached(layer, x[:, a:b], cache)
    assert cache.positions.tolist() == [0, 1, 2, 3, 4]
    _, k, _ = layer._project(x, torch.tensor([0, 1, 2, 3, 4]), expand=False)  # keys rotated at the given positions
    torch.testing.assert_close(cache.keys, k.transpose(1, 2), rtol=0, atol=1e-12)


def test_every_operator_is_asked_whether_it_supports_a_cache():
    """kills: kv_cache.attend_cached asking only the first operator for ``supports_kv_cache``
    (``for op in layer.operators[:1]``): a second head group that cannot be cached must be refused by name."""
    layer = DiffusionAttention(8, 2, "attention:1,laplacian:1", causal=True)
    op = layer.operators[1]
    op.supports_kv_cache = False
    try:
        with pytest.raises(ValueError, match=rf"operator {op.name!r} does not support a KV cache"):
            attend_cached(layer, torch.randn(1, 3, 8), LayerKVCache())
    finally:
        del op.supports_kv_cache


def test_a_four_dimensional_input_is_refused_by_name():
    """kills: kv_cache.attend_cached testing ``x.dim() < 3`` instead of ``!= 3``: a 4-d ``x`` then fails later in
    the shape unpacking with Python's "too many values to unpack" instead of the named error."""
    layer = DiffusionAttention(8, 2, causal=True)
    with pytest.raises(ValueError, match=r"attend_cached: expected x of shape \(B, n, D\), got \(1, 1, 3, 8\)"):
        attend_cached(layer, torch.randn(1, 1, 3, 8), LayerKVCache())


# ---------------------------------------------------------------------------- recompute.py
def test_recompute_stands_aside_while_compiling(monkeypatch):
    """kills: recompute.wants_recompute without ``not torch.compiler.is_compiling()``: while compiling (simulated by
    patching ``torch.compiler.is_compiling``) the context must register no saved-tensor hook; ``fn`` is then never
    called and the gradients are those of autograd without it."""
    a = torch.tensor([1.0, -2.0, 3.0], dtype=F64, requires_grad=True)
    w = torch.tensor([[0.5, 1.0, -1.5], [2.0, 0.0, 1.0]], dtype=F64, requires_grad=True)
    calls = []

    def fn():
        calls.append(1)
        return a.detach() * 2.0

    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not wants_recompute()
    z = a * 2.0
    with recompute_saved(z, fn):
        y = torch.nn.functional.linear(z, w)
    gw, ga = torch.autograd.grad(y.sum(), (w, a))
    assert calls == []
    torch.testing.assert_close(gw, torch.tensor([[2.0, -4.0, 6.0]] * 2, dtype=F64), rtol=0, atol=0)
    torch.testing.assert_close(ga, 2.0 * w.detach().sum(0), rtol=0, atol=0)


# ---------------------------------------------------------------------------- uniform_map.py
def test_uniform_mean_refuses_a_five_dimensional_signal():
    """kills: uniform_map.uniform_mean testing ``x.dim() < 4`` instead of ``!= 4``: a 5-d signal would be averaged
    over its fourth axis without a word."""
    with pytest.raises(ValueError, match=r"x must have shape \(B, G, M, C\), got \(1, 1, 1, 3, 2\)"):
        uniform_mean(torch.ones(1, 1, 1, 3, 2))



def test_uniform_mean_of_bfloat16_rounds_once():
    """kills: uniform_map.uniform_mean rounding the sum to bfloat16 before dividing (``xs.sum(...).to(out_dtype) / M``
    instead of ``xs.mean(...)``): the mean of ``2.171875, -8.875, 1.0390625`` is ``-1.88802...`` (float64, by hand),
    which rounds to ``-1.890625`` in bfloat16; the rounded sum ``-5.65625`` divided by 3 gives ``-1.8828125``."""
    x = torch.tensor([2.171875, -8.875, 1.0390625], dtype=torch.bfloat16).view(1, 1, 3, 1)
    expected = torch.tensor((2.171875 - 8.875 + 1.0390625) / 3, dtype=F64).to(torch.bfloat16)
    assert expected.item() == -1.890625
    got = uniform_mean(x)
    assert got.dtype == torch.bfloat16
    assert got.flatten().tolist() == [-1.890625] * 3


def test_uniform_mean_counts_a_long_causal_key_mask_exactly_in_bfloat16():
    """kills: uniform_map.uniform_mean converting the key mask to the input dtype (``key_mask.to(x.dtype)``) instead
    of the working float32: counts above 256 are not exact in bfloat16 (259 becomes 260), so the causal mean of
    ones over 600 keys drifts from 1. Key 0 is masked: row 0 has no admissible key and is 0; every other row is 1."""
    M = 600
    x = torch.ones(1, 1, M, 2, dtype=torch.bfloat16)
    mask = torch.ones(1, 1, 1, M, dtype=torch.bool)
    mask[..., 0] = False
    got = uniform_mean(x, mask, is_causal=True)
    expected = torch.ones(1, 1, M, 2, dtype=torch.bfloat16)
    expected[:, :, 0] = 0.0
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, expected)


# ---------------------------------------------------------------------------- equivalent mutants
# 93 mutants were applied, one at a time (48 in kv_cache.py, 21 in recompute.py, 24 in uniform_map.py); every one
# is killed by the suite with this file except these, left alive because no input tells them from the code:
#
# - kv_cache._repeat calling ``repeat_interleave(H // G)`` also when ``G == H``: a repeat by 1 is a copy with the
#   same values.
# - kv_cache.attend_cached ``len(cache.powers) > step`` -> ``>= step``: after any call of a layer its cache holds
#   exactly ``K + 1`` powers, so ``len(cache.powers)`` is 0 (empty cache) or ``K + 1 > step``; the two differ only
#   for a cache built by a layer whose operators were later replaced by ones of a higher order, where the
#   cached powers are invalid anyway (both versions then fail or give undefined rows).
# - kv_cache.attend_cached assigning ``op.apply_causal_matrix(...)`` to the non-polynomial heads instead of adding
#   it to ``out``: those heads' coefficient rows are zero, so ``out`` is exactly 0 there for finite values.
# - uniform_map.uniform_mean counting the causal prefix in float32 for float64 inputs (already listed by the second
#   pass): counts below 2^24 are exact in float32 and the division promotes to float64.
# - uniform_map.uniform_mean ``count.clamp_min(1.0)`` -> ``clamp_min(0.5)``: counts are whole numbers, so only a
#   zero count is clamped, and its total is 0 (a masked key contributes ``0 * x``): ``0 / 0.5 == 0 / 1``.
