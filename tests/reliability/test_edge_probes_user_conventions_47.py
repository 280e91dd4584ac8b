"""Sitting 47: the layers and models against what a PyTorch / PyG user expects of a module.

Submodules replaced the way users replace them (an adapter wrapping a projection, as LoRA does;
:func:`torch.ao.quantization.quantize_dynamic`'s ``Linear``, whose ``weight`` is a packed method) run as the
plain module would; PyG's :func:`torch_geometric.nn.inits.reset` resets a model as its own ``reset_parameters``.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from diffusionformer.models import (GIN, DiffusionGraphTransformer, DiffusionViT, GINConfig, GraphBlock,
                                    GraphTransformerConfig, ViTConfig)
from diffusionformer.nn import Block, DiffusionAttention
from diffusionformer.nn._weights import _stored_weight

LEARNED = "ppr(alpha=0.2, steps=2, learnable=True):1,heat(t=0.5, learnable=True, steps=2):1,attention:2"
EDGES = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]])


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class _Adapter(nn.Module):
    """A hand-written low-rank adapter around a Linear (LoRA's shape): ``base(x) + x A^T B^T``, ``B`` zero at first,
    so the wrapped module starts as the plain one. It has no ``weight`` of its own."""

    def __init__(self, base: nn.Linear, rank: int = 2) -> None:
        super().__init__()
        self.A = nn.Parameter(torch.randn(rank, base.in_features, generator=_g(1)))
        self.B = nn.Parameter(torch.zeros(base.out_features, rank))
        self.base = base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.A.t() @ self.B.t()


def test_adapter_wrapped_projections_of_a_layer_with_learned_operators():
    """Bug: a layer with learned operators whose ``qkv`` was wrapped by an adapter without a ``weight`` attribute
    raised "AttributeError: '_Adapter' object has no attribute 'weight'" (the layer read ``qkv.weight`` for the
    device and dtype of its coefficients); a layer of fixed operators ran. Now it runs as the plain layer, and the
    adapter trains."""
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, LEARNED)
    x = torch.randn(2, 5, 16, generator=_g())
    ref = layer(x)
    layer.qkv, layer.out_proj = _Adapter(layer.qkv), _Adapter(layer.out_proj)
    out = layer(x)
    assert torch.allclose(out, ref, atol=1e-6)
    out.square().sum().backward()
    assert layer.qkv.B.grad is not None and layer.qkv.B.grad.abs().sum() > 0
    assert layer.operators[0].alpha_logit.grad is not None


def test_adapter_wrapped_input_embedding_of_the_graph_transformer():
    """Bug: ``DiffusionGraphTransformer`` with its ``embed`` wrapped by an adapter raised AttributeError (it cast
    ``x`` to ``embed.weight``'s dtype); now it casts to the adapter's (its first floating-point parameter's)."""
    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=6, dim=16, depth=1, heads=LEARNED)).eval()
    x = torch.randn(5, 6, generator=_g()).double()  # float64 features into a float32 model: cast, as unwrapped
    ref = model(x, EDGES)
    model.embed = _Adapter(model.embed)
    assert torch.allclose(model(x, EDGES), ref, atol=1e-6)


def _quantize_dynamic():
    q = getattr(torch.ao.quantization, "quantize_dynamic", None)
    if q is None or torch.backends.quantized.engine == "none":
        pytest.skip("torch.ao.quantization.quantize_dynamic is not available in this torch build")
    return q


@pytest.mark.parametrize("family", ["vit", "graph", "gin"])
def test_quantize_dynamic_models_run(family):
    """Bug: after ``torch.ao.quantization.quantize_dynamic(model, {nn.Linear})`` a ViT with learned operators
    raised "AttributeError: 'function' object has no attribute 'device'" (the quantized Linear's ``weight`` is a
    method), and the graph transformer and GIN raised the same at their input cast. Now they run, near the float
    model (int8 weights)."""
    quantize = _quantize_dynamic()
    torch.manual_seed(0)
    if family == "vit":
        model = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, dim=32, depth=2, heads=LEARNED))
        args = (torch.randn(2, 1, 8, 8, generator=_g()),)
    elif family == "graph":
        model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=6, dim=16, depth=1, heads=LEARNED,
                                                                 global_attention=True))
        args = (torch.randn(5, 6, generator=_g()), EDGES)
    else:
        model = GIN(GINConfig(in_channels=6, hidden=8, num_layers=2))
        args = (torch.randn(5, 6, generator=_g()), EDGES)
    model.eval()
    ref = model(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation
        quantized = quantize(model, {nn.Linear}, dtype=torch.qint8)
        out = quantized(*args)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert torch.allclose(out, ref, atol=0.1)


def test_a_module_holding_no_floating_tensor_is_named():
    """Bug: a module with nothing to read the device and dtype from raised a bare AttributeError from torch; now a
    TypeError naming the module (and the holder's tensor is read when one is given)."""
    with pytest.raises(TypeError, match=r"Identity has no tensor 'weight' and no floating-point parameter"):
        _stored_weight(nn.Identity())
    assert _stored_weight(nn.Identity(), owner=nn.Linear(2, 2).double()).dtype == torch.float64


@pytest.mark.parametrize("build", [lambda: DiffusionAttention(16, 4, LEARNED), lambda: Block(16, 4, LEARNED),
                                   lambda: GraphBlock(16, 4, LEARNED, global_attention=True)],
                         ids=["attention", "block", "graph-block"])
def test_pyg_inits_reset_is_the_modules_reset(build):
    """PyG's ``torch_geometric.nn.inits.reset(module)`` (what PyG's own models call on their children) resets a
    layer to the values of one built anew under the same seed."""
    inits = pytest.importorskip("torch_geometric.nn.inits")
    torch.manual_seed(3)
    new = build()
    torch.manual_seed(4)
    module = build()
    torch.manual_seed(3)
    inits.reset(module)
    a, b = module.state_dict(), new.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
