"""Mutation audit (sitting 47, commits fbddebc..ea88867) of the library code added that day: reset_parameters,
the positional edge_index shorthand, gated MLPs, config name normalisation, the runner's new model fields and
``show``, GPT.generate's generator check: tests that kill mutants the day's tests left alive (each docstring names
the mutant). No GPU is used.

75 mutants of the changed lines (nn/_weights.py 10, nn/block.py 21, nn/attention.py 7, operators 8 (base.py 2,
differential.py 2, attnscale.py 1, heat.py 1, ppr.py 1, polynomial.py 1), models/gpt.py 7, models/dino.py 6,
models/graph_transformer.py 4, models/vit.py 3, models/gcn.py 2, models/common.py 2, experiments/results.py 4,
experiments/cli.py 1): 67 killed by earlier tests (65 by the day's, 2 by older files: Block's ``bias=bias`` to
make_mlp by tests/models/test_models_nanogpt_equivalence.py, DINO ``_ema_pairs``'s ``if moved`` by
tests/reliability/test_edge_probes_module_api_43.py), 8 survivors killed here, 0 equivalent.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from diffusionformer.nn import DiffusionAttention, make_mlp
from diffusionformer.nn._weights import _stored_weight
from diffusionformer.operators.differential import DifferentialOperator

EDGES = torch.tensor([[0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 2]])


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


class _BufferOnly(nn.Module):
    """A frozen linear map stored as buffers (no parameter, no tensor ``weight``)."""

    def __init__(self, lin: nn.Linear) -> None:
        super().__init__()
        self.register_buffer("w", lin.weight.detach().clone())
        self.register_buffer("b", lin.bias.detach().clone())

    def forward(self, x):
        return nn.functional.linear(x, self.w, self.b)


def test_kills_stored_weight_reads_buffers_too():
    """kills: nn/_weights.py ``_stored_weight`` ``chain(m.parameters(), m.buffers())`` -> ``m.parameters()`` (a
    replaced module whose tensors are buffers, e.g. a frozen adapter, raised "has no tensor 'weight'")."""
    frozen = _BufferOnly(nn.Linear(3, 2).double())
    assert _stored_weight(frozen) is frozen.w
    # in a layer: a float64 buffer-only qkv is the device and dtype a later-bound operator is put in
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 2, "attention").double()
    layer.qkv = _BufferOnly(layer.qkv)
    layer.operators[0] = DifferentialOperator()
    layer(_x(2, 5, 16).double())
    assert all(p.dtype == torch.float64 for p in layer.operators[0].parameters())


class _Int8Linear(nn.Module):
    """A hand-quantized linear map: int8 weights and a float64 scale, all buffers."""

    def __init__(self, lin: nn.Linear) -> None:
        super().__init__()
        scale = lin.weight.detach().abs().max() / 127
        self.register_buffer("q", torch.round(lin.weight.detach() / scale).to(torch.int8))
        self.register_buffer("scale", scale.double())

    def forward(self, x):
        return nn.functional.linear(x, self.q.to(self.scale.dtype) * self.scale)


def test_kills_stored_weight_skips_integer_tensors():
    """kills: nn/_weights.py ``_stored_weight`` ``if t.is_floating_point()`` dropped (a replaced module whose first
    tensor is an int8 weight gave int8 as the dtype to cast inputs to and to bind operators in)."""
    mod = _Int8Linear(nn.Linear(4, 3))
    assert _stored_weight(mod) is mod.scale and _stored_weight(mod).dtype == torch.float64


class _Triple(nn.Module):
    """A parameter-free qkv: q = k = v = x."""

    def forward(self, x):
        return torch.cat([x, x, x], dim=-1)


def test_kills_bind_reads_the_layers_device_through_owner():
    """kills: nn/attention.py ``_refresh_plan`` ``_stored_weight(self.qkv, owner=self)`` -> ``_stored_weight(self.qkv)``
    (an operator bound after qkv was replaced by a parameter-free module, e.g. a quantized one: TypeError instead of
    the layer's device and dtype)."""
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 2, "attention").double()
    layer.qkv = _Triple()
    layer.operators[0] = DifferentialOperator()
    out = layer(_x(2, 5, 16).double())
    assert out.dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in layer.operators[0].parameters())


def test_kills_tensor_graph_with_is_causal_is_refused():
    """kills: nn/attention.py ``_forward_routed`` ``or is_causal`` dropped from the tensor-graph conflict check
    (``attn(x, edge_index, is_causal=True)`` was not refused as a tensor graph with a shorthand)."""
    attn = DiffusionAttention(16, 4, "attention")
    with pytest.raises(ValueError, match="a tensor given as graph is read as edge_index"):
        attn(_x(5, 16), EDGES, is_causal=True)


def test_kills_complex_tensor_graph_is_refused():
    """kills: nn/attention.py ``_forward_routed`` ``or graph.is_complex()`` dropped (a complex tensor in the graph's
    place was taken as edge indices, and failed later without saying it was read as edge_index)."""
    attn = DiffusionAttention(16, 4, "attention")
    with pytest.raises(TypeError, match=r"read as edge_index.*got dtype torch.complex64"):
        attn(_x(5, 16), EDGES.to(torch.complex64))


def test_kills_make_mlp_refuses_a_non_string_kind():
    """kills: nn/block.py ``make_mlp`` ``if not isinstance(kind, str)`` -> ``if False`` (an int kind raised
    AttributeError "'int' object has no attribute 'lower'", not naming the choices)."""
    with pytest.raises(TypeError, match=r"make_mlp: kind must be one of \('gelu', 'swiglu', 'geglu'\), got int"):
        make_mlp(3, 8, 4.0)


def test_kills_make_mlp_hint_compares_the_name_as_read():
    """kills: nn/block.py ``make_mlp`` ``_choice_hint(key, ...)`` -> ``_choice_hint(kind, ...)`` (the did-you-mean
    compared the raw spelling, so "S_W_I_G_L_U_X_X" got no hint though it is read as "swigluxx", as the configs'
    check (``_check_block_options``) hints it)."""
    with pytest.raises(ValueError, match=r"did you mean 'swiglu'"):
        make_mlp("S_W_I_G_L_U_X_X", 8, 4.0)


@pytest.mark.parametrize("norm", ["rmsnorm", "RMS_Norm"])
def test_kills_gpt_bias_false_keeps_rmsnorm(norm):
    """kills: models/gpt.py ``if not c.bias and c.norm == "layernorm":`` -> ``if not c.bias:`` (a ``bias=False``
    RMSNorm GPT got bias-free LayerNorms in place of its RMSNorms)."""
    from diffusionformer.models import DiffusionGPT, GPTConfig

    gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16, norm=norm, bias=False))
    norms = [gpt.norm, gpt.blocks[0].norm1, gpt.blocks[0].norm2]
    assert all(type(m) is nn.RMSNorm for m in norms), [type(m).__name__ for m in norms]
    ln = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16, norm="Layer_Norm",
                                bias=False))
    assert type(ln.norm) is nn.LayerNorm and ln.norm.bias is None
