"""The layers' combined head outputs are rebuilt in the backward pass, not kept (``ops.recompute``, issue 15).

A layer whose heads are not all plain attention forms ``z`` (``c0 v + c1 P v``, sums of powers, the
merge of head groups) and projects it; autograd would keep ``z`` for the projection's weight
gradient, one activation of the layer's full width more than nanoGPT's attention keeps. Checked
here: the same bits with and without the recomputation (outputs and every gradient: the rebuilt
``z`` is formed by the forward's operations on the forward's tensors), the memory it releases
(measured with the profiler's allocation counter on CPU, where allocation sizes are exact), no
reference cycle that would hold tensors until the garbage collector runs, and the cases where it
stands aside (activation checkpointing, ``retain_graph``).
"""

from __future__ import annotations

import gc
from typing import Callable

import pytest
import torch
import torch.nn.functional as F

from diffusionformer import DiffusionAttention
from diffusionformer.ops.recompute import recompute_saved
from diffusionformer.testing import cpu_allocations

LAYOUTS = [
    "attention:3,laplacian:3",  # the layer's own affine path
    "attention:3,polynomial(steps=1):3",  # learned affine heads: the loop
    "attention:4,heat(t=1.0, steps=4):2",  # fixed affine heads split from K-step heads
    "laplacian:2,ppr(steps=5):2,attention:2",
    "attention:3,heat(t=0.5, learnable=True):3",  # learned K-step heads beside fixed affine heads
    "polynomial(steps=3):6",  # the loop alone
    "attention:3,heat-exact:3",  # a non-polynomial group: z is kept as before
]


def _run(layer: DiffusionAttention, x: torch.Tensor, recompute: bool, autocast: bool, mask: str,
         seed: int = 0) -> list[torch.Tensor]:
    layer.recompute = recompute
    try:
        layer.zero_grad(set_to_none=True)
        x.grad = None
        kw = {}
        if mask == "padding":
            pad = torch.zeros(x.shape[0], x.shape[1], dtype=torch.bool)
            pad[0, -3:] = True
            kw["key_padding_mask"] = pad
        torch.manual_seed(seed)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = layer(x, **kw)
        (y.float() ** 2).sum().backward()
        return [y.detach()] + [p.grad.clone() for p in layer.parameters()] + [x.grad.clone()]
    finally:
        layer.recompute = False


@pytest.mark.parametrize("heads", LAYOUTS)
@pytest.mark.parametrize("backend", ["auto", "sdpa"])
@pytest.mark.parametrize("mask", ["causal", "none", "padding"])
@pytest.mark.parametrize("autocast", [False, True])
def test_same_bits_with_and_without_the_recomputation(heads, backend, mask, autocast):
    torch.manual_seed(0)
    layer = DiffusionAttention(48, 6, heads, causal=mask == "causal", bias=False, backend=backend)
    x = torch.randn(2, 9, 48, requires_grad=True)
    on = _run(layer, x, True, autocast, mask)
    off = _run(layer, x, False, autocast, mask)
    for a, b in zip(on, off):
        assert torch.equal(a, b)


@pytest.mark.parametrize("heads", ["attention:3,laplacian:3", "attention:4,heat(t=1.0, steps=4):2"])
def test_same_bits_with_dropout_on_P(heads):
    # the replay returns the forward's (dropped-out) propagations: no new random numbers are drawn
    torch.manual_seed(0)
    layer = DiffusionAttention(48, 6, heads, causal=True, bias=False, backend="sdpa", dropout=0.3).train()
    x = torch.randn(2, 9, 48, requires_grad=True)
    on = _run(layer, x, True, False, "causal", seed=5)
    off = _run(layer, x, False, False, "causal", seed=5)
    for a, b in zip(on, off):
        assert torch.equal(a, b)


def _held_after(fn: Callable[[], object]) -> int:
    """Bytes allocated by ``fn()`` and still held when it returns (its result kept), from the profiler."""
    result, changes, _ = cpu_allocations(fn)
    del result
    return sum(changes)


def _forward_held(heads: str, recompute: bool, autocast: bool) -> tuple[int, int]:
    """Bytes one layer's forward keeps for the backward pass (output included), and its output's bytes."""
    torch.manual_seed(0)
    layer = DiffusionAttention(64, 4, heads, causal=True, bias=False, backend="sdpa", recompute=recompute)
    x = torch.randn(2, 32, 64, requires_grad=True)

    def fwd() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return layer(x)
    fwd()  # caches (head columns, plans) filled outside the measurement
    out = []
    held = _held_after(lambda: out.append(fwd()))
    return held, out[0].nbytes


@pytest.mark.parametrize("autocast", [False, True])
def test_laplacian_heads_keep_what_attention_heads_keep(autocast):
    attention, _ = _forward_held("attention:4", True, autocast)
    laplacian, _ = _forward_held("attention:2,laplacian:2", True, autocast)
    kept, z_bytes = _forward_held("attention:2,laplacian:2", False, autocast)
    assert laplacian == attention  # nanoGPT's attention keeps no combined output either
    assert kept == laplacian + z_bytes  # without the recomputation: z, one activation of the layer's width


@pytest.mark.parametrize("heads", ["attention:2,heat(t=1.0, steps=4):2", "heat(t=0.5, learnable=True):4"])
def test_k_step_layers_release_the_combined_output(heads):
    on, z_bytes = _forward_held(heads, True, True)
    off, _ = _forward_held(heads, False, True)
    assert off - on == z_bytes


def test_no_reference_cycle_keeps_tensors_past_the_backward_pass():
    # a cycle through the rebuild closure would hold the layer's tensors until the garbage collector ran
    torch.manual_seed(0)
    layer = DiffusionAttention(64, 4, "attention:2,heat(t=1.0, steps=4):2", causal=True, bias=False, backend="sdpa",
                               recompute=True)
    x = torch.randn(2, 32, 64, requires_grad=True)

    def step() -> None:
        layer(x).square().sum().backward()

    step()
    enabled = gc.isenabled()
    gc.disable()
    try:
        layer.zero_grad(set_to_none=True)
        x.grad = None
        held = _held_after(step)
    finally:
        if enabled:
            gc.enable()
    grads = sum(p.grad.nbytes for p in layer.parameters()) + x.grad.nbytes
    assert held == grads


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_gives_the_plain_gradients(reentrant):
    torch.manual_seed(0)
    layer = DiffusionAttention(48, 6, "attention:4,heat(t=1.0, steps=4):2", causal=True, bias=False, backend="sdpa")
    x = torch.randn(2, 9, 48, requires_grad=True)
    plain = _run(layer, x, True, False, "causal")
    layer.recompute = True
    layer.zero_grad(set_to_none=True)
    x.grad = None
    y = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=reentrant)
    (y.float() ** 2).sum().backward()
    for a, b in zip(plain, [y.detach()] + [p.grad for p in layer.parameters()] + [x.grad]):
        assert torch.equal(a, b)


def test_retain_graph_rebuilds_at_every_backward_pass():
    torch.manual_seed(0)
    layer = DiffusionAttention(48, 6, "attention:3,laplacian:3", causal=True, bias=False, recompute=True)
    x = torch.randn(2, 9, 48, requires_grad=True)
    loss = layer(x).square().sum()
    loss.backward(retain_graph=True)
    first = [p.grad.clone() for p in layer.parameters()]
    loss.backward()
    for g, p in zip(first, layer.parameters()):
        assert torch.equal(p.grad, 2 * g)


@pytest.mark.parametrize("heads", ["attention:3,laplacian:3", "attention:4,heat(t=1.0, steps=4):2"])
def test_second_order_gradients_equal_the_kept_output(heads):
    # a gradient penalty: the weight gradient is differentiated again (create_graph=True)
    res = []
    for recompute in (False, True):
        torch.manual_seed(0)
        layer = DiffusionAttention(24, 6, heads, causal=True, bias=False, backend="sdpa", recompute=recompute).double()
        x = torch.randn(2, 5, 24, dtype=torch.float64, requires_grad=True)
        (g,) = torch.autograd.grad(layer(x).square().sum(), layer.out_proj.weight, create_graph=True)
        g.square().sum().backward()
        res.append([p.grad for p in layer.parameters()] + [x.grad])
    for a, b in zip(*res):
        assert torch.equal(a, b)


def test_torch_func_transforms_run_without_the_hooks():
    # torch.func refuses saved-tensor hooks: inside a transform the layer keeps its output as autograd would
    from torch.func import functional_call, grad

    torch.manual_seed(0)
    layer = DiffusionAttention(24, 6, "attention:3,laplacian:3", causal=True, bias=False, recompute=True)
    x = torch.randn(2, 5, 24)
    params = {k: v.detach() for k, v in layer.named_parameters()}
    grads = grad(lambda p: functional_call(layer, p, (x,)).square().sum())(params)
    layer(x).square().sum().backward()
    for name, p in layer.named_parameters():
        torch.testing.assert_close(grads[name], p.grad)


def test_where_saved_tensor_hooks_are_disabled_the_output_is_kept():
    torch.manual_seed(0)
    layer = DiffusionAttention(24, 6, "attention:3,laplacian:3", causal=True, bias=False, recompute=True)
    x = torch.randn(2, 5, 24, requires_grad=True)
    with torch.autograd.graph.disable_saved_tensors_hooks("a library that owns the hooks"):
        layer(x).square().sum().backward()  # registering a hook here would raise with that message
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_a_saved_view_is_rebuilt_at_its_offset():
    a = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(3, 2, requires_grad=True)
    z = a * 2.0
    with recompute_saved(z, lambda: a.detach() * 2.0):
        y = F.linear(z[1:, 2:4], w)  # saves a view of z that starts inside it
    y.sum().backward()
    assert torch.equal(w.grad, (a.detach()[1:, 2:4] * 2.0).sum(0).expand(3, 2))


def test_a_recomputation_that_changes_the_layout_is_refused():
    a = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(3, 6, requires_grad=True)
    z = a * 2.0
    with recompute_saved(z, lambda: (a.detach() * 2.0).t().contiguous().t()):  # the same values, column-major
        y = F.linear(z, w)
    with pytest.raises(RuntimeError, match="must repeat the forward's operations"):
        y.sum().backward()


def test_bad_arguments_are_refused_with_their_names():
    with pytest.raises(TypeError, match="z must be a tensor"):
        recompute_saved([1.0], lambda: torch.zeros(1))
    with pytest.raises(TypeError, match="fn must be callable"):
        recompute_saved(torch.zeros(1), torch.zeros(1))


def test_nothing_is_recorded_without_autograd_history():
    layer = DiffusionAttention(48, 6, "attention:3,laplacian:3", causal=True, bias=False, recompute=True)
    x = torch.randn(2, 9, 48)
    with torch.no_grad():
        a = layer(x)
    layer.recompute = False
    with torch.no_grad():
        b = layer(x)
    assert torch.equal(a, b)


def test_off_by_default_and_set_on_a_whole_model():
    from diffusionformer.models import DiffusionGPT, GPTConfig
    from diffusionformer.nn import set_recompute

    cfg = GPTConfig(vocab_size=11, n_layer=3, n_head=2, n_embd=16, laplacian_heads=1)
    model = DiffusionGPT(cfg)
    layers = [m for m in model.modules() if isinstance(m, DiffusionAttention)]
    assert len(layers) == 3 and not any(m.recompute for m in layers)
    assert set_recompute(model) == 3 and all(m.recompute for m in layers)
    assert all(m.recompute for m in DiffusionGPT(GPTConfig(**{**cfg.__dict__, "recompute": True})).modules()
               if isinstance(m, DiffusionAttention))
    with pytest.raises(TypeError, match="recompute must be a bool"):
        DiffusionAttention(16, 2, recompute=1)
    with pytest.raises(TypeError, match="GPTConfig.recompute"):
        GPTConfig(vocab_size=11, recompute="yes")
