"""torch's factory keyword arguments ``device=`` and ``dtype=`` on the public nn layers.

Every :mod:`torch.nn` layer takes them, and :func:`torch.nn.utils.skip_init` calls a layer class with
``device="meta"``. The references are torch's own layers (``nn.Linear(..., dtype=)`` drawn under the same seed), a
layer built with no keyword arguments (its state dict, its ``.to(dtype)``, its ``.double()`` forward) and the
layer's own ``reset_parameters`` contract (under one seed a reset layer equals one built anew).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from diffusionformer.nn import (Block, DiffusionAttention, GatedMlp, LayerScale, Mlp, RotaryEmbedding,
                                RotaryEmbedding2D)
from diffusionformer.operators import build_operator

#: heads with learned parameters (heat's t, the polynomial's theta, differential attention's lambdas and RMSNorm
#: made by bind), fixed float64 constants (ppr's alpha), coefficient caches (ppr's _c, Chebyshev's basis)
HEADS = ("heat(t=0.3, learnable=True):1,polynomial(steps=2, basis='chebyshev'):1,differential:1,"
         "ppr(alpha=0.2, steps=3):1")


def _cases():
    """``(name, class, args, kwargs, input width)`` of each public layer with parameters (rotary: none)."""
    return [
        ("attention", DiffusionAttention, (16, 4, HEADS), {"qk_norm": True, "rotary": RotaryEmbedding(4)}, 16),
        ("attention-plain", DiffusionAttention, (16, 4), {}, 16),
        ("block", Block, (16, 4, HEADS), {"layer_scale": 0.1, "mlp_layer": "swiglu", "rotary": RotaryEmbedding(4)},
         16),
        ("block-rmsnorm", Block, (16, 4, "heat(t=0.5, learnable=True):2,attention:2"), {"norm_layer": "rmsnorm"}, 16),
        ("mlp", Mlp, (8,), {"act_layer": nn.PReLU}, 8),  # an activation with a parameter
        ("gated-mlp", GatedMlp, (8,), {}, 8),
        ("layer-scale", LayerScale, (8, 0.5), {}, 8),
    ]


CASES = _cases()
IDS = [c[0] for c in CASES]


def _tensors(m: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(m.named_parameters()), **dict(m.named_buffers())}


def _assert_same_state(a: nn.Module, b: nn.Module) -> None:
    sa, sb = _tensors(a), _tensors(b)
    assert sa.keys() == sb.keys()
    for name in sa:
        assert sa[name].dtype == sb[name].dtype and sa[name].device == sb[name].device, name
        assert torch.equal(sa[name], sb[name]), name


@pytest.mark.parametrize("name,cls,args,kwargs,width", CASES, ids=IDS)
def test_meta_device_allocates_nothing_and_resets_to_a_fresh_layer(name, cls, args, kwargs, width):
    """Bug: the nn layers took no ``device=`` (every torch.nn layer does): a model could not be built on the meta
    device through the constructor (deferred initialisation), ``DiffusionAttention(64, 4, device="meta")`` was
    "unexpected keyword argument 'device'"."""
    torch.manual_seed(0)
    m = cls(*args, device="meta", **kwargs)
    assert all(t.is_meta for t in _tensors(m).values()), [n for n, t in _tensors(m).items() if not t.is_meta]
    m.to_empty(device="cpu")
    torch.manual_seed(1)
    m.reset_parameters()
    torch.manual_seed(1)
    ref = cls(*args, **kwargs)  # under one seed a reset layer equals one built anew
    _assert_same_state(m, ref)
    x = torch.randn(2, 5, width)
    torch.testing.assert_close(m(x), ref(x), rtol=0, atol=0)


@pytest.mark.parametrize("name,cls,args,kwargs,width", CASES, ids=IDS)
def test_skip_init(name, cls, args, kwargs, width):
    """Bug: ``torch.nn.utils.skip_init(layer_class, ...)`` failed ("Module must support a 'device' arg to skip
    initialization"): it builds the layer with ``device="meta"`` and then ``to_empty``. The skipped layer, given a
    built one's state dict, computes what that one computes (the caches in no state dict rebuilt)."""
    m = nn.utils.skip_init(cls, *args, **kwargs)
    assert all(t.device.type == "cpu" for t in _tensors(m).values())
    torch.manual_seed(2)
    ref = cls(*args, **kwargs)
    m.load_state_dict(ref.state_dict())
    _assert_same_state(m, ref)
    x = torch.randn(2, 5, width)
    torch.testing.assert_close(m(x), ref(x), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["float64", "bfloat16"])
@pytest.mark.parametrize("name,cls,args,kwargs,width", CASES, ids=IDS)
def test_dtype_of_parameters_and_buffers(name, cls, args, kwargs, width, dtype):
    """Bug: the nn layers took no ``dtype=``: a float64 or bfloat16 layer had to be built in float32 and cast.
    Now every floating parameter is in ``dtype`` and every buffer in the dtype ``layer.to(dtype)`` gives it (an
    operator's fixed constants and coefficient caches stay float64 or float32, never half)."""
    m = cls(*args, dtype=dtype, **kwargs)
    for pname, p in m.named_parameters():
        assert p.dtype == dtype, pname
    cast = cls(*args, **kwargs).to(dtype)
    assert {n: t.dtype for n, t in _tensors(m).items()} == {n: t.dtype for n, t in _tensors(cast).items()}
    assert m(torch.randn(2, 5, width, dtype=dtype)).dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["float64", "bfloat16"])
def test_projections_initialised_in_dtype_as_torch_linear(dtype):
    """Bug: no ``dtype=``; with it, the projections and MLP layers are initialised in that dtype as torch's
    ``nn.Linear(..., dtype=)`` is (the same draws under one seed), not drawn in float32 and rounded."""
    torch.manual_seed(3)
    attn = DiffusionAttention(16, 4, dtype=dtype)
    torch.manual_seed(3)
    qkv = nn.Linear(16, 48, dtype=dtype)
    out = nn.Linear(16, 16, dtype=dtype)
    assert torch.equal(attn.qkv.weight, qkv.weight) and torch.equal(attn.out_proj.weight, out.weight)
    torch.manual_seed(4)
    mlp = Mlp(8, 16, dtype=dtype)
    torch.manual_seed(4)
    fc1, fc2 = nn.Linear(8, 16, dtype=dtype), nn.Linear(16, 8, dtype=dtype)
    assert torch.equal(mlp.fc1.weight, fc1.weight) and torch.equal(mlp.fc2.bias, fc2.bias)


@pytest.mark.parametrize("name,cls,args,kwargs,width", CASES, ids=IDS)
def test_float64_layer_forward_equals_the_float64_reference(name, cls, args, kwargs, width):
    """Bug: no ``dtype=``. A ``dtype=torch.float64`` layer given a float32 layer's state dict computes what that
    layer cast with ``.double()`` computes (learned operators included; the fixed constants in float64)."""
    torch.manual_seed(5)
    layer32 = cls(*args, **kwargs)
    layer64 = cls(*args, dtype=torch.float64, **kwargs)
    layer64.load_state_dict(layer32.state_dict())
    ref = layer32.double()
    _assert_same_state(layer64, ref)
    x = torch.randn(2, 5, width, dtype=torch.float64)
    torch.testing.assert_close(layer64(x), ref(x), rtol=0, atol=0)


@pytest.mark.parametrize("name,cls,args,kwargs,width", CASES, ids=IDS)
def test_defaults_unchanged(name, cls, args, kwargs, width):
    """Bug: ``device="cpu", dtype=torch.float32`` were refused as unexpected keywords; given explicitly they build
    the layer built without them, draw for draw (same parameters, same generator state after)."""
    torch.manual_seed(6)
    ref = cls(*args, **kwargs)
    after_ref = torch.rand(4)
    torch.manual_seed(6)
    m = cls(*args, device="cpu", dtype=torch.float32, **kwargs)
    assert torch.equal(torch.rand(4), after_ref)
    _assert_same_state(m, ref)


def test_given_operator_instances_and_rotary_follow_device_and_dtype():
    """Bug: no ``device=``/``dtype=``; with them, operator instances given in ``heads`` (and the rotary module) are
    moved and cast as ``layer.to(device, dtype)`` would move them: every tensor of the layer on meta, in float64."""
    op = build_operator("heat(t=0.5, learnable=True)", num_heads=2)
    attn = DiffusionAttention(16, 4, [op, op, "attention", "laplacian"], rotary=RotaryEmbedding(4), device="meta")
    assert all(t.is_meta for t in _tensors(attn).values()) and op.t.is_meta
    op = build_operator("polynomial(steps=2)", num_heads=1)
    attn = DiffusionAttention(16, 4, [op] * 4, dtype=torch.float64)
    assert op.theta.dtype == torch.float64 and attn.coefficients().dtype == torch.float64
    op = build_operator("heat(t=0.5, learnable=True)", num_heads=1).double()  # given in float64: cast as asked
    DiffusionAttention(16, 4, [op] * 4, dtype=torch.float32)
    assert op.t.dtype == torch.float32


def test_non_float_buffers_kept_and_callables_built_on_device():
    """Bug: no factory arguments; with them, a ``norm_layer`` callable's module is built on the device and cast as
    ``.to(dtype)`` casts: BatchNorm's integer ``num_batches_tracked`` stays int64."""
    blk = Block(16, 4, norm_layer=nn.BatchNorm1d, mlp_layer=lambda d: nn.Linear(d, d), device="meta",
                dtype=torch.float64)
    assert all(t.is_meta for t in _tensors(blk).values())
    assert blk.norm1.num_batches_tracked.dtype == torch.int64 and blk.norm1.weight.dtype == torch.float64
    assert blk.mlp.weight.dtype == torch.float64


@pytest.mark.parametrize("cls,head_dim", [(RotaryEmbedding, 4), (RotaryEmbedding2D, 8)])
def test_rotary_takes_factory_kwargs(cls, head_dim):
    """Bug: the rotary embeddings took no ``device=``/``dtype=`` (``skip_init`` refused them, and a model builder
    passing torch's factory arguments to every part failed on them). They hold no tensors: checked, no effect."""
    rope = nn.utils.skip_init(cls, head_dim)
    plain = cls(head_dim)
    x = torch.randn(3, 1, head_dim, dtype=torch.float64)
    pos = torch.tensor([[0, 0], [0, 1], [1, 0]]) if cls is RotaryEmbedding2D else None
    assert torch.equal(rope(x, pos), plain(x, pos))
    assert torch.equal(cls(head_dim, device="meta", dtype=torch.bfloat16)(x, pos), plain(x, pos))
    with pytest.raises(TypeError, match="torch.int32"):
        cls(head_dim, dtype=torch.int32)


@pytest.mark.parametrize("cls,args", [(DiffusionAttention, (16, 4)), (Block, (16, 4)), (Mlp, (8,)),
                                      (GatedMlp, (8,)), (LayerScale, (8,)), (RotaryEmbedding, (4,))])
def test_bad_factory_kwargs_are_refused_by_name(cls, args):
    """Bug: no factory arguments. Bad ones are refused naming the argument and the value: torch's ``nn.Linear``
    says "argument 'dtype' must be torch.dtype, not str" for ``"float32"`` and "Only Tensors of floating point and
    complex dtype can require gradients" for ``torch.int64``."""
    with pytest.raises(TypeError, match=r"dtype must be a torch\.dtype.*'float32'"):
        cls(*args, dtype="float32")
    with pytest.raises(TypeError, match=r"floating-point.*torch\.int64"):
        cls(*args, dtype=torch.int64)
    with pytest.raises(TypeError, match=r"floating-point.*torch\.complex64"):
        cls(*args, dtype=torch.complex64)
    with pytest.raises(RuntimeError, match=r"device='cpux'.*Expected one of"):
        cls(*args, device="cpux")
    with pytest.raises(TypeError, match="device must be"):
        cls(*args, device=True)


def test_from_multihead_attention_refuses_device_and_dtype():
    """Bug: ``from_multihead_attention(mha, dtype=...)`` passed ``dtype`` to the constructor and then moved the
    layer to the module's weights: the argument was dropped without a word. It is copied from the module."""
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    with pytest.raises(TypeError, match=r"device, dtype are copied from the nn\.MultiheadAttention.*\.to\(\)"):
        DiffusionAttention.from_multihead_attention(mha, device="cpu", dtype=torch.float64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bfloat16_layer():
    """Bug: ``DiffusionAttention(64, 4, device="cuda", dtype=torch.bfloat16)`` was refused; now every tensor of the
    layer is made on the GPU (the operators' too) and the layer runs there."""
    blk = Block(64, 4, "heat(t=0.5, learnable=True):2,attention:2", device="cuda", dtype=torch.bfloat16)
    assert all(t.device.type == "cuda" for t in _tensors(blk).values())
    assert blk(torch.randn(2, 7, 64, device="cuda", dtype=torch.bfloat16)).dtype == torch.bfloat16
