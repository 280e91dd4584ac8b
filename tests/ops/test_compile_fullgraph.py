"""``torch.compile(fullgraph=True)`` captures every registered operator (issue 15, item 4).

Each test compiles with a counting ``aot_eager`` back-end (dynamo capture and AOT autograd,
no C++ compile): ``fullgraph=True`` turns any graph break into an error, and the counter
checks that exactly one graph was captured and that the compiled code (not an eager
fallback) ran. Outputs and the gradients of the input and of every parameter (the learned
coefficients included) must equal the eager ones, in float64. The registry-wide test
iterates :func:`~diffusionformer.operators.list_operators`, so a newly registered operator
is covered without a new test. One test runs the default inductor back-end on CPU when a
C++ compiler is found.

Value checks that read tensors on the host (the finiteness of learned parameters and
coefficients, the bounds of ``edge_index``) run in eager mode on CPU only
(:func:`~diffusionformer.ops._checks.checks_values`); ``test_value_checks_run_in_eager_mode_only``
pins both sides. Static coefficients of ``K``-step heads are copied to the device once, not at
every call (``test_static_coefficients_are_built_once_and_train_after_inference_mode``).
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

from diffusionformer import DiffusionAttention, list_operators
from diffusionformer.models.gpt import DiffusionGPT, GPTConfig
from diffusionformer.models.graph_transformer import DiffusionGraphTransformer, GraphTransformerConfig
from diffusionformer.models.vit import DiffusionViT, ViTConfig
from diffusionformer.operators import operator_class
from diffusionformer.ops.engine import static_tensor
from diffusionformer.ops.rivals import LayerState

pytestmark = [pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`"),
              pytest.mark.usefixtures("fresh_dynamo")]  # tests/ops/conftest.py


class _Layers(nn.Module):
    """Attention layers sharing one :class:`LayerState`: with two, operators that read the first
    layer's values (NeuTRENO, value residuals) also run as a later layer."""

    def __init__(self, heads: str, causal: bool, depth: int = 1, dim: int = 16, num_heads: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DiffusionAttention(dim, num_heads, heads, causal=causal) for _ in range(depth))

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        state = LayerState()
        for layer in self.layers:
            x = x + layer(x, key_padding_mask=key_padding_mask, state=state)
        return x


def _loss(y: torch.Tensor) -> torch.Tensor:
    # a weighted sum: every output element gets a distinct gradient
    return (y * torch.linspace(-1.0, 1.0, y.numel(), dtype=y.dtype).view_as(y)).sum()


def _run(fn, model: nn.Module, inputs: tuple, loss=_loss) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Output and gradients (of the float inputs that require them and of the parameters)."""
    model.zero_grad(set_to_none=True)
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            t.grad = None
    out = fn(*inputs)
    loss(out).backward()
    y = out[0] if isinstance(out, tuple) else out
    grads = {f"input{i}": t.grad.clone() for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.requires_grad}
    grads.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    return y.detach(), grads


def assert_compiles_like_eager(model: nn.Module, *inputs, loss=_loss, backend: str = "aot_eager",
                               rtol: float | None = None, atol: float | None = None) -> None:
    """``torch.compile(model, fullgraph=True)`` captures one graph whose outputs and gradients equal eager mode's."""
    want, want_grads = _run(model, model, inputs, loss)
    counter = CompileCounterWithBackend(backend)
    got, got_grads = _run(torch.compile(model, fullgraph=True, backend=counter), model, inputs, loss)
    assert counter.frame_count == 1, f"expected one captured graph, got {counter.frame_count}"
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    assert got_grads.keys() == want_grads.keys()
    assert len(want_grads) > 1  # the input and the parameters
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, rtol=rtol, atol=atol, msg=lambda m: f"gradient of {name}: {m}")


def _tokens(causal_padding: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    if not causal_padding:
        return x, None
    # the second sequence has two padded positions
    return x, torch.tensor([[False] * 5, [False, False, False, True, True]])


@pytest.mark.parametrize("layout", ["causal", "padded"])
@pytest.mark.parametrize("name", list_operators())
def test_every_registered_operator_compiles_fullgraph(name, layout, example_spec):
    torch.manual_seed(0)
    depth = 2 if operator_class(name).needs_layer_state else 1
    model = _Layers(f"attention:1,{example_spec(name)}:1", causal=layout == "causal", depth=depth).double()
    x, kpm = _tokens(layout == "padded")
    assert_compiles_like_eager(model, x, kpm)


# variants beside the registry's examples (which already learn heat's t, polynomial's theta,
# AttnScale's omega and the differential lambdas): fixed heat (static coefficients of degree 3),
# learned exact heat, learned PPR, the Chebyshev basis
@pytest.mark.parametrize("spec, learned", [
    ("heat(t=0.5, steps=3)", False),
    ("heat-exact(t=0.5, learnable=True)", True),
    ("ppr(alpha=0.2, steps=3, learnable=True)", True),
    ("polynomial(steps=2, basis='chebyshev')", True),
])
def test_variants_compile_fullgraph(spec, learned):
    torch.manual_seed(1)
    model = _Layers(f"laplacian:1,{spec}:1", causal=True).double()  # causal and padded
    x, kpm = _tokens(True)
    assert_compiles_like_eager(model, x, kpm)
    assert any(True for _ in model.layers[0].operators[1].parameters()) == learned


_AFFINE = "attention:2,laplacian:1,heat(t=0.5, steps=1):1"  # static, degree 1: one fused call, combined in place
_K_STEP = "attention:1,laplacian:1,heat(t=0.5, steps=3):1,ppr(alpha=0.2, steps=2):1"


@pytest.mark.parametrize("heads, backend", [(_AFFINE, "auto"), (_K_STEP, "sdpa"), (_K_STEP, "matrix")])
def test_inference_and_dense_backends_compile_fullgraph(heads, backend):
    # no autograd history: the affine heads are combined in place; K-step heads on each back-end
    torch.manual_seed(2)
    layer = DiffusionAttention(24, 4, heads, causal=True, backend=backend).double().eval()
    x = torch.randn(2, 6, 24, dtype=torch.float64)
    with torch.no_grad():
        want = layer(x)
        counter = CompileCounterWithBackend("aot_eager")
        got = torch.compile(layer, fullgraph=True, backend=counter)(x)
    assert counter.frame_count == 1
    torch.testing.assert_close(got, want)


def test_sparse_layer_compiles_fullgraph():
    # sparse "auto" takes the gather-scatter back-end while compiling (dynamo cannot trace CSR tensors)
    torch.manual_seed(3)
    layer = DiffusionAttention(24, 4, "attention:1,laplacian:1,heat(t=0.5, steps=3, learnable=True):1,"
                               "polynomial(steps=2):1", causal=True).double()
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 2, 5, 1, 3], [1, 2, 3, 4, 5, 6, 0, 0, 2, 6, 3]])

    class Sparse(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x, edge_index=edge_index)

    assert_compiles_like_eager(Sparse(), torch.randn(7, 24, dtype=torch.float64, requires_grad=True))


def test_gpt_compiles_fullgraph():
    torch.manual_seed(4)
    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=3, n_embd=24,
                                   heads="attention:1,laplacian:1,heat(t=0.5, steps=3, learnable=True):1")).double()
    idx, targets = torch.randint(0, 11, (2, 8)), torch.randint(0, 11, (2, 8))
    assert_compiles_like_eager(model, idx, targets, loss=lambda out: out[1])


def test_vit_compiles_fullgraph():
    torch.manual_seed(5)
    model = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, dim=16, depth=2, num_heads=2, num_classes=3,
                                   heads="laplacian:1,heat(t=0.5, learnable=True):1")).double()
    assert_compiles_like_eager(model, torch.randn(2, 1, 8, 8, dtype=torch.float64, requires_grad=True))


def test_graph_transformer_compiles_fullgraph():
    # local (sparse) attention; global_attention=True pads graphs with to_dense_batch, whose size is data-dependent
    torch.manual_seed(7)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=5, dim=16, num_heads=2, depth=1, task="node",
                                                             heads="laplacian:1,heat(t=0.5, learnable=True):1")).double()
    x = torch.randn(9, 5, dtype=torch.float64, requires_grad=True)
    edge_index = torch.tensor([[0, 1, 2, 3, 1, 4, 5, 6, 7, 8, 6], [1, 2, 3, 0, 3, 5, 6, 7, 8, 4, 8]])
    assert_compiles_like_eager(model, x, edge_index)


def _cxx_compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


@pytest.mark.slow
@pytest.mark.skipif(_cxx_compiler() is None, reason="inductor on CPU needs a C++ compiler (g++, c++ or clang++)")
def test_inductor_compiles_a_mixed_layer():
    torch.manual_seed(6)
    layer = DiffusionAttention(16, 4, "attention:2,laplacian:1,heat(t=0.5, steps=3, learnable=True):1", causal=True)
    x = torch.randn(2, 6, 16, requires_grad=True)
    assert_compiles_like_eager(layer, x, backend="inductor", rtol=1e-4, atol=1e-5)


def test_value_checks_run_in_eager_mode_only():
    # eager CPU: a non-finite learned parameter is a clear error; compiled: no host read, NaN flows through
    layer = DiffusionAttention(8, 2, "attention:1,heat(t=0.5, steps=2, learnable=True):1").double()
    with torch.no_grad():
        layer.operators[1].t.fill_(float("nan"))
    x = torch.randn(1, 4, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="not finite"):
        layer(x)
    out = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
    assert torch.isnan(out).any()


def test_static_coefficients_are_built_once_and_train_after_inference_mode():
    # static K-step coefficients become a device tensor once per (rows, device, dtype): a fresh host tensor
    # copied every call would be a blocking copy on an accelerator; the cached one must not be an
    # inference tensor, or a training call after an inference_mode call could not save it for backward
    static_tensor.cache_clear()
    layer = DiffusionAttention(16, 2, "attention:1,heat(t=0.5, steps=3):1")
    x = torch.randn(2, 5, 16)
    with torch.inference_mode():
        want = layer(x)
    built = static_tensor.cache_info().misses
    x.requires_grad_(True)
    y = layer(x)
    y.sum().backward()
    assert static_tensor.cache_info().misses == built == 1
    torch.testing.assert_close(y.detach(), want)
    assert x.grad is not None and torch.isfinite(x.grad).all()
