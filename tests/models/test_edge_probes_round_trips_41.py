"""Round trips over every registered operator and model preset, at tiny sizes: deepcopy, pickling,
state dicts, casts to float64, empty and one-token inputs, mode switches and reprs (float64 references)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from diffusionformer.models import DiffusionGPT, DiffusionGraphTransformer, DiffusionViT, GPTConfig
from diffusionformer.models import GraphTransformerConfig, ViTConfig
from diffusionformer.models.registry import create_model, list_models
from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators import build_operator, list_operators, operator_class
from diffusionformer.ops.rivals import LayerState


def _spec(name: str) -> str:
    kwargs = operator_class(name).example_kwargs
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")" if kwargs else name


#: every registered operator with its example arguments, and variants whose caches differ (fixed coefficients,
#: a Chebyshev basis, fixed constants in buffers, a differential operator bound by its layer)
_SPECS = [_spec(n) for n in list_operators()] + [
    "heat(t=0.5, steps=3)", "polynomial(steps=2, init='laplacian', basis='chebyshev')", "ppr(alpha=0.3)",
    "attnscale(omega=0.4, learnable=False)", "differential",
]


def _name(spec: str) -> str:
    return spec.split("(")[0]


def _perturb(module: nn.Module) -> None:
    """Move every parameter off its initial value (so that a lost or re-initialised one shows)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def _build(kind: str, spec: str) -> nn.Module:
    torch.manual_seed(0)
    heads = f"attention:1,{spec}:1"
    if kind == "gpt":
        return DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, heads=heads, rope=True))
    if kind == "vit":
        return DiffusionViT(ViTConfig(input_size=(4, 4), patch_size=2, num_classes=3, dim=16, depth=2, num_heads=2,
                                      heads=heads, rope=True))
    return DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, dim=16, depth=2, num_heads=2,
                                                            heads=heads))


def _inputs(kind: str, dtype: torch.dtype = torch.float64) -> tuple:
    g = torch.Generator().manual_seed(1)
    if kind == "gpt":
        return (torch.randint(0, 11, (2, 5), generator=g),)
    if kind == "vit":
        return (torch.randn(2, 1, 4, 4, generator=g, dtype=dtype),)
    return torch.randn(5, 3, generator=g, dtype=dtype), torch.tensor([[0, 1, 2, 3, 1, 2], [1, 2, 3, 4, 0, 0]])


def _out(model: nn.Module, args: tuple) -> torch.Tensor:
    y = model(*args)
    return y[0] if isinstance(y, tuple) else y


def _low_precision_tensors(module: nn.Module) -> list[str]:
    """Every floating tensor reachable as an attribute of a submodule (parameters, buffers, caches, tensors in
    lists and dicts) that is not float64."""
    bad = []
    for name, sub in module.named_modules():
        for key, value in vars(sub).items():
            items = (value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple))
                     else [("", value)])
            for k, v in items:
                if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype != torch.float64:
                    bad.append(f"{name}.{key}[{k}]: {v.dtype}")
    return bad


_CASES = [(kind, s) for kind in ("gpt", "vit", "graph") for s in _SPECS
          if kind != "graph" or (operator_class(_name(s)).supports_sparse and "exact" not in s)]


@pytest.mark.parametrize(("kind", "spec"), _CASES, ids=[f"{k}-{s}" for k, s in _CASES])
def test_pins_copies_state_dicts_and_float64_casts_of_every_operator_in_every_model_kind(kind, spec, tmp_path):
    """A deepcopy, a pickled copy, a fresh model given the state dict, a model built in float64 and a float32
    model cast to float64 after a float32 call all give the float64 model's outputs; no float32 cache is left."""
    model = _build(kind, spec).double()
    _perturb(model)
    model.eval()
    args = _inputs(kind)
    with torch.no_grad():
        y = _out(model, args)
        assert torch.equal(_out(copy.deepcopy(model), args), y)
        torch.save(model, tmp_path / "model.pt")
        assert torch.equal(_out(torch.load(tmp_path / "model.pt", weights_only=False).eval(), args), y)
        fresh = _build(kind, spec).double()
        fresh.load_state_dict(model.state_dict(), strict=True)
        assert torch.equal(_out(fresh.eval(), args), y)

        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            built64 = _build(kind, spec)
        finally:
            torch.set_default_dtype(old)
        built64.load_state_dict(model.state_dict())
        torch.testing.assert_close(_out(built64.eval(), args), y, rtol=0, atol=1e-12)

        cast = _build(kind, spec).eval()
        _out(cast, tuple(a.float() if a.is_floating_point() else a for a in args))  # any cache made in float32
        cast.double()
        assert _low_precision_tensors(cast) == []
        cast.load_state_dict(model.state_dict())
        torch.testing.assert_close(_out(cast, args), y, rtol=0, atol=1e-12)

        model.train()
        model.eval()
        model.requires_grad_(False)
        assert torch.equal(_out(model, args), y)


def _tiny(name: str) -> dict:
    family = name.split("-")[0]
    return {
        "gpt": dict(n_layer=1, n_head=2, n_embd=8, block_size=8),
        "vit": dict(depth=1, num_heads=2, dim=8),
        "dino": dict(depth=1, num_heads=2, dim=8, out_dim=8, head_hidden=8, head_bottleneck=4),
        "graph": dict(depth=1, num_heads=2, dim=8, in_channels=3),
        "gcn": dict(hidden=4, in_channels=3),
        "gin": dict(hidden=4, num_layers=2, in_channels=3),
    }[family]


def _preset_inputs(name: str, model: nn.Module, batch: int) -> tuple:
    g = torch.Generator().manual_seed(1)
    if name.startswith("gpt"):
        return (torch.randint(0, 10, (batch, 5), generator=g),)
    if name.startswith(("vit", "dino")):
        c = model.config
        shape = (batch, c.input_size[0], c.in_channels) if len(c.input_size) == 1 else (batch, c.in_channels,
                                                                                          *c.input_size)
        return (torch.randn(*shape, generator=g, dtype=torch.float64),)
    n = 5 if batch else 0
    edges = torch.tensor([[0, 1, 3, 1, 2, 4], [1, 2, 4, 0, 0, 3]]) if n else torch.zeros(2, 0, dtype=torch.long)
    graph_ids = torch.tensor([0, 0, 0, 1, 1]) if n else torch.zeros(0, dtype=torch.long)
    return torch.randn(n, 3, generator=g, dtype=torch.float64), edges, graph_ids


@pytest.mark.parametrize("name", list_models())
def test_pins_every_preset_round_trips_and_refuses_a_state_dict_of_other_shapes(name, tmp_path):
    """Presets at tiny sizes: deepcopy, pickle, strict state dict and float64 build agree with the float64
    model; an empty batch gives an empty output (GPT refuses it by name); another width is a size mismatch."""
    kw = _tiny(name)
    torch.manual_seed(0)
    model = create_model(name, **kw).double()
    _perturb(model)
    model.eval()
    args = _preset_inputs(name, model, 2)
    with torch.no_grad():
        y = _out(model, args)
        assert torch.equal(_out(copy.deepcopy(model), args), y)
        torch.save(model, tmp_path / "model.pt")
        assert torch.equal(_out(torch.load(tmp_path / "model.pt", weights_only=False), args), y)
        torch.manual_seed(1)
        fresh = create_model(name, **kw).double()
        fresh.load_state_dict(model.state_dict(), strict=True)
        assert torch.equal(_out(fresh.eval(), args), y)
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            built64 = create_model(name, **kw)
        finally:
            torch.set_default_dtype(old)
        built64.load_state_dict(model.state_dict())
        assert _low_precision_tensors(built64) == []
        torch.testing.assert_close(_out(built64.eval(), args), y, rtol=0, atol=1e-12)
        model.train()
        model.eval()
        model.requires_grad_(False)
        assert torch.equal(_out(model, args), y)
        assert type(model).__name__ in repr(model)

        empty = _preset_inputs(name, model, 0)
        if name.startswith("gpt"):
            with pytest.raises(ValueError, match="at least one sequence"):
                model(*empty)
        else:
            assert _out(model, empty).shape[0] == 0
    wider = dict(kw)
    for key in ("n_embd", "dim", "hidden"):
        if key in wider:
            wider[key] *= 2
    with pytest.raises(RuntimeError, match="size mismatch"):
        create_model(name, **wider).load_state_dict(model.state_dict())


_ONE_TOKEN = [s for s in _SPECS if not build_operator(s).uses_context]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("spec", _ONE_TOKEN)
def test_pins_one_token_gives_the_sum_of_the_coefficients_times_v(spec, causal):
    """With one token ``P = [[1]]``, so ``f(P) v = (sum_k c_k) v`` (``exp(0) = 1`` and ``alpha / alpha = 1`` for the
    exact kernels): the layer against that float64 reference; a batch of none gives an empty output."""
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 2, heads=f"{spec}:2", causal=causal).double()
    _perturb(layer)
    layer.eval()
    x = torch.randn(3, 1, 16, dtype=torch.float64)
    op = layer.operators[0]
    total = (op.head_coefficients(2).detach().double().sum(-1) if op.is_polynomial
             else torch.ones(2, dtype=torch.float64))
    v = layer.qkv(x)[..., 32:].reshape(3, 1, 2, 8)
    reference = layer.out_proj((v * total.view(1, 1, 2, 1)).reshape(3, 1, 16))
    torch.testing.assert_close(layer(x), reference, rtol=0, atol=1e-12)
    for shape in ((0, 4, 16), (2, 0, 16)):
        assert layer(torch.randn(shape, dtype=torch.float64)).shape == shape


@pytest.mark.parametrize("spec", _SPECS)
def test_pins_reprs_name_the_operator(spec):
    """``repr`` of an operator names its class, a layer's its heads spec with the registry name."""
    op = build_operator(spec, num_heads=2)
    assert type(op).__name__ in repr(op)
    layer = DiffusionAttention(16, 2, heads=f"{spec}:2")
    state = {"state": LayerState()} if op.needs_layer_state else {}
    layer(torch.randn(1, 3, 16), **state)
    assert f"heads='{_name(spec)}" in repr(layer) or f'heads="{_name(spec)}' in repr(layer)


def test_bug_repr_of_a_layer_whose_operator_was_replaced_by_a_non_operator_does_not_crash():
    """Bug: ``layer.operators[1] = nn.Identity()`` (a wrong module swapped in) made ``print(layer)``, and so
    ``print(model)``, raise ``AttributeError: 'Identity' object has no attribute 'spec'`` from ``heads_spec``, the
    tool one reaches for to see what went wrong; an appended extra operator was silently left out of
    ``heads_spec`` (which checkpoints record), describing a layer that cannot run."""
    layer = DiffusionAttention(16, 2, heads="attention:1,heat:1")
    layer.operators[1] = nn.Identity()
    text = repr(layer)
    assert "Identity()" in text and "expected DiffusionOperator modules, got Identity" in text
    with pytest.raises(TypeError, match="expected DiffusionOperator modules, got Identity"):
        layer.heads_spec()

    layer = DiffusionAttention(16, 2, heads="attention:1,heat:1")
    layer.operators.append(build_operator("ppr"))
    with pytest.raises(ValueError, match="expected 2 operators"):
        layer.heads_spec()
    assert "expected 2 operators" in repr(layer)
