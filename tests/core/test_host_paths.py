"""The layer paths that cut per-call host work, each checked against a float64 reference.

* ``DiffusionAttention``'s fused affine path (fixed ``a I + b P`` heads, complete or causal
  graph): one SDPA call and the token-major combination, without the functional API's checks;
* the per-layer plan, made once and refreshed when ``layer.operators`` is changed;
* hook-free ``nn.Identity`` placeholders (``Block.ls1``/``ls2``/``drop_path``, ``q_norm``/``k_norm``)
  skipped, not called, while hooked ones and replaced ones still run.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from diffusionformer import DiffusionAttention
from diffusionformer.functional import dense_attention_reference, diffuse, polynomial_reference
from diffusionformer.nn import Block
from diffusionformer.nn._skip import is_noop
from diffusionformer.nn.rotary import RotaryEmbedding
from diffusionformer.operators import build_operator
from diffusionformer.ops import dense as _dense
from diffusionformer.testing import reference_qkv

D, H = 16, 4


def reference(layer: DiffusionAttention, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """The layer in float64 from its weights: q/k norm, rotary, explicit softmax, ``sum_k c_k P^k v``."""
    B, N, _ = x.shape
    C = layer.head_dim
    q, k, v = reference_qkv(layer, x.double())  # (B, N, H, C), key/value heads repeated for GQA
    q, k = layer._transform_qk(q, k)  # the layer's own q/k norm and rotary, per head (their own tests cover them)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, N, C)
    allowed = torch.ones(N, N, dtype=torch.bool).tril() if causal else None
    P = dense_attention_reference(q, k, allowed=allowed, scale=C**-0.5)
    out = polynomial_reference(P, v, layer.coefficients().double())
    y = out.transpose(1, 2).reshape(B, N, D) @ layer.out_proj.weight.double().t()
    return y + layer.out_proj.bias.double() if layer.out_proj.bias is not None else y


class _NoChecks:
    """Make the functional entry fail while active: the call must not reach it."""

    def __enter__(self) -> None:
        self.saved = _dense._diffuse_checked
        _dense._diffuse_checked = self.fail

    def __exit__(self, *exc: object) -> None:
        _dense._diffuse_checked = self.saved

    @staticmethod
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("the layer left its fused affine path")


AFFINE_LAYOUTS = [None, "attention:2,laplacian:2", "laplacian:4", "laplacian:1,attention:2,heat(t=0.3, steps=1):1",
                  "heat(t=0.5, steps=1, method='euler'):2,attention:2"]


@pytest.mark.parametrize("heads", AFFINE_LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extra", [{}, {"num_kv_heads": 2}, {"qk_norm": True}, {"rotary": "rope"}])
def test_fused_affine_path_matches_a_float64_reference_with_gradients(heads, causal, extra):
    torch.manual_seed(0)
    if extra.get("rotary") == "rope":
        extra = {"rotary": RotaryEmbedding(D // H)}
    layer = DiffusionAttention(D, H, heads, causal=causal, **extra).double()
    if "qk_norm" in extra:  # non-trivial norm weights
        with torch.no_grad():
            layer.q_norm.weight.uniform_(0.5, 1.5)
            layer.k_norm.bias.uniform_(-0.5, 0.5)
    assert layer._affine_runs is not None
    x = torch.randn(2, 5, D, dtype=torch.float64, requires_grad=True)
    with _NoChecks():
        y = layer(x)
        with torch.no_grad():  # inference: the combination runs in place
            torch.testing.assert_close(layer(x), y.detach(), rtol=0, atol=0)
    xr = x.detach().clone().requires_grad_()
    ref = reference(layer, xr, causal)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-12)
    g = torch.randn_like(ref)
    y.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("heads", AFFINE_LAYOUTS[1:])
def test_fused_affine_path_draws_the_dropout_of_the_functional_api(heads):
    torch.manual_seed(0)
    layer = DiffusionAttention(D, H, heads, causal=True, dropout=0.3).double().train()
    x = torch.randn(2, 6, D, dtype=torch.float64)
    torch.manual_seed(7)
    with _NoChecks():
        y = layer(x)
    q, k, v = (t.transpose(1, 2) for t in layer._project(x))
    torch.manual_seed(7)
    out = diffuse(q, k, v, list(layer._static_coefficients), is_causal=True, dropout_p=0.3)
    torch.testing.assert_close(y, layer.out_proj(out.transpose(1, 2).reshape(2, 6, D)), rtol=0, atol=0)


def test_masks_intermediates_and_multi_step_heads_leave_the_fused_path():
    torch.manual_seed(0)
    x = torch.randn(2, 5, D)
    layer = DiffusionAttention(D, H, "attention:2,laplacian:2")
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with _NoChecks():
        for kwargs in ({"key_padding_mask": pad}, {"attn_mask": torch.ones(5, 5, dtype=torch.bool)},
                       {"return_intermediates": True}):
            with pytest.raises(AssertionError, match="left its fused affine path"):
                layer(x, **kwargs)
        heat = DiffusionAttention(D, H, "attention:2,heat(t=1.0, steps=3):2")
        assert heat._affine_runs is None
        with pytest.raises(AssertionError, match="left its fused affine path"):
            heat(x)
        layer.backend = "matrix"
        with pytest.raises(AssertionError, match="left its fused affine path"):
            layer(x)


@pytest.mark.parametrize("heads", ["attention:2,laplacian:2", "attention:2,heat(t=1.0, steps=2):2"])
def test_settable_backend_and_dropout_are_still_checked_on_every_path(heads):
    layer = DiffusionAttention(D, H, heads).train()
    x = torch.randn(1, 3, D)
    layer.backend = "fast"
    with pytest.raises(ValueError, match="backend must be one of"):
        layer(x)
    layer.backend = "auto"
    layer.dropout = 1.5
    with pytest.raises(ValueError, match=r"^dropout must lie in \[0, 1\), got 1.5"):  # the attribute's name
        layer(x)
    layer.eval()  # no dropout at inference: nothing to check
    assert layer(x).shape == x.shape


def test_plan_is_refreshed_when_an_operator_is_replaced():
    torch.manual_seed(0)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    layer = DiffusionAttention(D, H, "attention:2,laplacian:2", causal=True).double()
    before = layer(x)
    torch.testing.assert_close(before, reference(layer, x, True))
    layer.operators[1] = build_operator("heat(t=0.7, steps=3)", num_heads=2).double()
    assert layer.heads_spec().startswith("attention:2,heat(")
    after = layer(x)
    assert layer.max_degree == 3 and layer._degrees == (1, 1, 3, 3) and layer._affine_runs is None
    torch.testing.assert_close(layer.coefficients()[2:, 3], torch.full((2,), 0.7**3 / 6 * torch.exp(torch.tensor(-0.7)).item(),
                                                                       dtype=torch.float64))
    torch.testing.assert_close(after, reference(layer, x, True), rtol=1e-10, atol=1e-12)
    assert not torch.allclose(after, before)
    layer.operators = nn.ModuleList([build_operator("attention", num_heads=2), build_operator("attention", num_heads=2)])
    torch.testing.assert_close(layer(x), reference(layer, x, True), rtol=1e-10, atol=1e-12)
    assert layer._affine_runs == ()


def test_a_replaced_operator_list_that_does_not_fit_the_heads_is_refused():
    layer = DiffusionAttention(D, H, "attention:2,laplacian:2")
    x = torch.randn(1, 3, D)
    layer.operators.append(build_operator("attention", num_heads=1))
    with pytest.raises(ValueError, match="expected 2 operators, one per head group"):
        layer(x)
    del layer.operators[2]
    layer.operators[1] = build_operator("heat(t=0.5, learnable=True)", num_heads=3)
    with pytest.raises(ValueError, match="has num_heads=3 but covers 2 heads"):
        layer(x)


class _CountIdentity:
    """Count calls of ``nn.Identity.forward`` while active."""

    def __enter__(self) -> "_CountIdentity":
        self.calls = 0
        self.saved = nn.Identity.forward

        def forward(mod: nn.Identity, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return x
        nn.Identity.forward = forward
        return self

    def __exit__(self, *exc: object) -> None:
        nn.Identity.forward = self.saved


def _block_reference(blk: Block, x: torch.Tensor, gamma1: torch.Tensor | None = None) -> torch.Tensor:
    a = blk.attn(blk.norm1(x))
    x = x + (a if gamma1 is None else a * gamma1)
    return x + blk.mlp(blk.norm2(x))


def test_block_skips_hook_free_identities_and_calls_hooked_or_replaced_ones():
    torch.manual_seed(0)
    blk = Block(D, H, "attention:3,laplacian:1").double().eval()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    assert is_noop(blk.ls1) and is_noop(blk.drop_path) and is_noop(blk.attn.q_norm)
    with _CountIdentity() as count:
        y = blk(x)
    assert count.calls == 0  # ls1, ls2, drop_path (twice), q_norm, k_norm: all skipped
    torch.testing.assert_close(y, _block_reference(blk, x), rtol=0, atol=0)

    seen = []
    handle = blk.ls1.register_forward_hook(lambda mod, inp, out: seen.append("ls1"))
    with _CountIdentity() as count:
        torch.testing.assert_close(blk(x), y, rtol=0, atol=0)
    assert seen == ["ls1"] and count.calls == 1
    handle.remove()

    handle = nn.modules.module.register_module_forward_pre_hook(lambda mod, inp: seen.append(type(mod).__name__))
    try:
        with _CountIdentity() as count:
            blk(x)
    finally:
        handle.remove()
    assert count.calls == 6 and seen.count("Identity") == 6  # a global hook sees every module, as before

    from diffusionformer.nn.block import LayerScale

    blk.ls1 = LayerScale(D, 0.5).double()  # replaced after construction: called from now on
    torch.testing.assert_close(blk(x), _block_reference(blk, x, torch.full((D,), 0.5, dtype=torch.float64)))


def test_identity_subclasses_are_called():
    class Tagged(nn.Identity):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1.0

    blk = Block(D, H).double().eval()
    x = torch.randn(1, 3, D, dtype=torch.float64)
    blk.drop_path = Tagged()
    assert not is_noop(blk.drop_path)
    x1 = x + blk.attn(blk.norm1(x)) + 1.0  # both residual branches pass through drop_path
    torch.testing.assert_close(blk(x), x1 + blk.mlp(blk.norm2(x1)) + 1.0)
