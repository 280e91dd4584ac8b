"""Edge-case probes of deferred initialisation: operators, layers and model presets built under
``with torch.device("meta")``, then given their weights by ``to_empty`` + ``load_state_dict`` or by
``load_state_dict(..., assign=True)``, compared in float64 with an identically configured model built normally.

Probed: every registered operator (its ``example_kwargs``, and learnable / tolerance-chosen / Chebyshev
variants) inside a ``DiffusionAttention`` layer, every model preset (with fixed, learned and polynomial heads
where the family takes ``heads``), ``to_empty`` without a load, casts (``.float()``, ``.double()``) before and
after the load, ``copy.deepcopy``, ``repr`` and a forward pass on the meta device (shape inference).
``to_empty`` was already right (``DiffusionOperator._apply`` rebuilds the fixed coefficients ``_c`` and
restores the fixed constants, so no cache is left holding ``empty``'s memory).

Found and fixed (each pinned by a "Bug:" test below):

* ``ppr``, ``heat`` and ``polynomial`` raised in their constructors under a meta device (``.tolist()`` /
  ``.item()`` / ``torch.isfinite(...).all()`` read values of meta tensors): no deferred init of such a model;
* after ``load_state_dict(..., assign=True)`` the non-persistent caches (``_c``, the Chebyshev ``_basis``)
  stayed on meta, and the first call failed "Cannot copy out of meta tensor" (a layer with fixed heads only
  ran, its fused path not reading ``_c``, with meta buffers left in the model);
* float64 weights assigned to a float32 layer kept float32-rounded fixed coefficients (off by ~1e-9 from the
  float64 model, which ``.double()`` makes exact);
* ``repr`` / ``print`` of a meta-built model raised (``.item()`` / ``.tolist()`` on meta in ``extra_repr``);
* a forward pass on the meta device raised for ``attnscale`` (``torch.is_autocast_enabled("meta")``).
"""

from __future__ import annotations

import copy

import pytest
import torch

from diffusionformer.models import DINO, DiffusionGPT, DiffusionViT, create_model, list_models
from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators import list_operators, operator_class
from diffusionformer.operators.heat import HeatOperator
from diffusionformer.operators.polynomial import PolynomialOperator, chebyshev_matrix
from diffusionformer.operators.ppr import PPROperator

DIM, HEADS = 32, 4  # head_dim 8: differential's example (head_dim=8) fits

#: variants the example kwargs do not reach: learned parameters, steps chosen by tolerance, the Chebyshev basis
VARIANTS = [
    "ppr(alpha=0.2, steps=4, learnable=True)",
    "ppr(alpha=0.3, steps=None)",
    "heat(t=0.5, learnable=True)",
    "heat(t=1.0)",
    "heat(t=0.5, steps=3, method='euler', tol=0.9)",
    "polynomial(steps=8, init='heat(t=1.0)', basis='chebyshev')",
    "polynomial(steps=2, init='ppr(alpha=0.3, steps=2)')",
    "attnscale(learnable=False, omega=0.25)",
    "heat-exact(t=0.3, learnable=True)",
]


def _example_spec(name: str) -> str:
    kwargs = operator_class(name).example_kwargs
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")" if kwargs else name


SPECS = [_example_spec(n) for n in list_operators()] + VARIANTS


def _layer(spec: str) -> DiffusionAttention:
    return DiffusionAttention(DIM, HEADS, heads=f"{spec}:2,attention:2")


def _pair(spec: str) -> tuple[DiffusionAttention, DiffusionAttention]:
    """(reference built normally in float64, the same layer built on meta)."""
    torch.manual_seed(0)
    ref = _layer(spec).double().eval()
    with torch.device("meta"):
        lazy = _layer(spec)
    return ref, lazy


def _x() -> torch.Tensor:
    return torch.randn(2, 5, DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def _no_meta(module: torch.nn.Module) -> None:
    left = [n for n, t in (*module.named_parameters(), *module.named_buffers()) if t.is_meta]
    assert not left, left


@pytest.mark.parametrize("spec", SPECS)
def test_bug_meta_construction_then_to_empty_matches(spec):
    """Bug: PPROperator, HeatOperator and PolynomialOperator raised in their constructors under
    ``with torch.device("meta")`` ("Cannot copy out of meta tensor" from ``.tolist()``, "Tensor.item() cannot be
    called on meta tensors" from the truncation check): a model with such heads could not be built deferred."""
    ref, lazy = _pair(spec)
    assert lazy.qkv.weight.is_meta
    lazy = lazy.to_empty(device="cpu").double()
    lazy.load_state_dict(ref.state_dict())
    _no_meta(lazy)
    x = _x()
    assert torch.equal(lazy.eval()(x), ref(x))


@pytest.mark.parametrize("spec", SPECS)
def test_bug_meta_construction_then_assign_load_matches(spec):
    """Bug: ``load_state_dict(ref.state_dict(), assign=True)`` into a meta-built layer left the non-persistent
    fixed coefficients ``_c`` (in no state dict) on meta: the first call failed "Cannot copy out of meta tensor"
    (and float64 weights met float32-rounded coefficients)."""
    ref, lazy = _pair(spec)
    lazy.load_state_dict(ref.state_dict(), assign=True)
    _no_meta(lazy)
    x = _x()
    assert torch.equal(lazy.eval()(x), ref(x))
    # a cast afterwards keeps the caches exact
    lazy.float().double()
    assert torch.equal(lazy(x), ref(x))


@pytest.mark.parametrize("spec", ["ppr(alpha=0.2, steps=4)", "heat(t=0.7)", "laplacian"])
def test_bug_assign_float64_weights_give_float64_coefficients(spec):
    """Bug: float64 weights assigned (``assign=True``) to a float32 layer kept the float32-rounded fixed
    coefficients: the layer ran in float64 but was off by ~1e-9 from the same model cast with ``.double()``."""
    torch.manual_seed(0)
    ref = DiffusionAttention(DIM, HEADS, heads=f"{spec}:2,polynomial:2").double().eval()
    layer = DiffusionAttention(DIM, HEADS, heads=f"{spec}:2,polynomial:2").eval()
    layer.load_state_dict(ref.state_dict(), assign=True)
    assert layer.operators[0]._c.dtype == torch.float64
    x = _x()
    assert torch.equal(layer(x), ref(x))


def test_bug_standalone_operator_assign_load_materialises_caches():
    """Bug: a meta-built operator given its state by ``assign=True`` kept ``_c`` / the Chebyshev basis on meta
    (``coefficients()`` returned a meta tensor)."""
    for cls, kwargs in ((PPROperator, {"alpha": 0.25, "steps": 5}), (HeatOperator, {"t": 0.5, "steps": 6}),
                        (PolynomialOperator, {"steps": 4, "init": [0.5, 0.2, 0.1, 0.1, 0.1], "basis": "chebyshev"})):
        ref = cls(**kwargs)
        with torch.device("meta"):
            op = cls(**kwargs)
        op.load_state_dict(ref.state_dict(), assign=True)
        _no_meta(op)
        assert torch.equal(op.coefficients(), ref.coefficients()), cls.__name__
    assert torch.equal(op._basis, chebyshev_matrix(4, torch.float32))


def test_bug_meta_model_repr():
    """Bug: ``repr`` (``print(model)``) of a meta-built layer raised from the operators' ``extra_repr``
    (``Tensor.item()`` / ``.tolist()`` on meta tensors)."""
    heads = ("ppr(alpha=0.2, steps=4):1,heat(t=0.5, learnable=True):1,attnscale:1,heat-exact(t=0.3):1,"
             "ppr(alpha=0.2, steps=4, learnable=True):1,heat(t=1.0):1,polynomial:1,attention:1")
    with torch.device("meta"):
        layer = DiffusionAttention(DIM, 8, heads=heads)
    text = repr(layer)
    assert "PPROperator(alpha=<meta ()>, steps=4" in text
    assert "HeatOperator(t=<meta (1,)>" in text and "ExactHeatOperator(t=<meta (1,)>" in text
    assert "AttnScaleOperator(omega=<meta (1,)>" in text
    # a layer with values prints them as before
    assert "PPROperator(alpha=0.2, steps=4" in repr(DiffusionAttention(DIM, 8, heads=heads))


@pytest.mark.parametrize("spec", SPECS)
def test_bug_meta_forward_shape_inference(spec):
    """Bug: a forward pass of a meta-built layer on a meta input (shape inference, FLOP counting) raised for
    attnscale: ``torch.is_autocast_enabled("meta")`` ("unknown device type for autocast")."""
    with torch.device("meta"):
        layer = _layer(spec)
    y = layer(torch.empty(2, 5, DIM, device="meta"))
    assert y.is_meta and y.shape == (2, 5, DIM)


@pytest.mark.parametrize("spec", ["attention", "ppr(alpha=0.2, steps=4)", "heat(t=0.7)", "heat-exact(t=0.3)",
                                  "polynomial(steps=3, init='laplacian', basis='chebyshev')",
                                  "attnscale(omega=0.5, learnable=False)"])
def test_to_empty_rebuilds_caches_and_fixed_constants(spec):
    """``to_empty`` leaves parameters uninitialised but rebuilds the caches and fixed constants exactly
    (no buffer holds ``empty``'s memory), in float32 and after ``.double()``."""
    with torch.device("meta"):
        lazy = _layer(spec)
    normal = _layer(spec)
    lazy.to_empty(device="cpu")
    for dtype in (torch.float32, torch.float64):
        lazy.to(dtype)
        normal.to(dtype)
        fixed = dict(normal.named_buffers())
        for name, buf in lazy.named_buffers():
            assert buf.dtype == fixed[name].dtype and torch.equal(buf, fixed[name]), name


@pytest.mark.parametrize("spec", ["ppr(alpha=0.2, steps=4)",
                                  "polynomial(steps=6, init='heat(t=0.5)', basis='chebyshev')",
                                  "heat(t=0.5, learnable=True)"])
def test_deepcopy_of_meta_and_loaded_layers(spec):
    """``copy.deepcopy`` of a meta-built layer stays on meta; of a loaded one (either way) gives the same outputs."""
    ref, lazy = _pair(spec)
    twin = copy.deepcopy(lazy)
    assert twin.qkv.weight.is_meta
    twin.load_state_dict(ref.state_dict(), assign=True)
    lazy = lazy.to_empty(device="cpu").double()
    lazy.load_state_dict(ref.state_dict())
    x = _x()
    for m in (copy.deepcopy(twin), copy.deepcopy(lazy)):
        _no_meta(m)
        assert torch.equal(m.eval()(x), ref(x))


# ---------------------------------------------------------------------------------------------- model presets
SMALL = {"gpt": dict(n_layer=2, n_embd=32), "vit": dict(depth=2, dim=32), "graph": dict(depth=2, dim=32),
         "gcn": dict(hidden=8), "gin": dict(hidden=8, num_layers=3), "dino": dict(depth=2, dim=32)}
MIXED = "ppr(alpha=0.2, steps=3):1,heat(t=0.5, learnable=True):1,polynomial(steps=2, basis='chebyshev'):1,attention:1"


def _inputs(model):
    g = torch.Generator().manual_seed(0)
    c = model.config
    if isinstance(model, DiffusionGPT):
        return (torch.randint(0, c.vocab_size, (2, min(c.block_size, 8)), generator=g),)
    if isinstance(model, (DiffusionViT, DINO)):
        shape = (2, c.in_channels, *c.input_size) if len(c.input_size) == 2 else (2, c.input_size[0], c.in_channels)
        return (torch.randn(*shape, generator=g, dtype=torch.float64),)
    x = torch.randn(9, c.in_channels, generator=g, dtype=torch.float64)
    edges = torch.cat([torch.randint(0, 5, (2, 12), generator=g), torch.randint(5, 9, (2, 8), generator=g)], dim=1)
    return (x, edges, torch.tensor([0] * 5 + [1] * 4))


def _preset(name, **kw):
    return create_model(name, **SMALL[name.split("-")[0]], **kw)


def _out(model, inputs):
    out = model(*inputs)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("name", list_models())
def test_bug_every_preset_meta_init(name):
    """Bug: a preset whose heads include ppr, heat or polynomial operators could not be built under a meta device,
    and any preset loaded with ``assign=True`` kept meta coefficient buffers (failing on the first mixed-head
    call); now both deferred routes give the float64 reference's outputs exactly."""
    kw = {"heads": MIXED} if name.split("-")[0] in ("gpt", "vit", "graph", "dino") else {}
    torch.manual_seed(0)
    ref = _preset(name, **kw).double().eval()
    inputs = _inputs(ref)
    expected = _out(ref, inputs)
    for assign in (False, True):
        with torch.device("meta"):
            lazy = _preset(name, **kw)
        if assign:
            lazy.load_state_dict(ref.state_dict(), assign=True)
        else:
            lazy = lazy.to_empty(device="cpu").double()
            lazy.load_state_dict(ref.state_dict())
        _no_meta(lazy)
        assert torch.equal(_out(lazy.eval(), inputs), expected), (name, assign)
