"""Edge probes of layers and models under PyTorch's dispatch and tensor-subclass machinery: models built inside a
``FakeTensorMode``, ``torch.nested`` jagged batches, ``__torch_function__`` subclasses on the sparse path, and the
FLOPs ``FlopCounterMode`` counts for K-step heads."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from diffusionformer import functional
from diffusionformer.models import DiffusionGPT, DiffusionGraphTransformer, GPTConfig, GraphTransformerConfig
from diffusionformer.nn import DiffusionAttention

pytestmark = [pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")]

MIXED = "attention:2,laplacian:1,heat(t=1.0, steps=3):1,ppr(steps=4):1"
EDGES = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 0, 2], [1, 2, 3, 4, 5, 6, 0, 3, 2]])


def _gpt(heads: str = MIXED) -> DiffusionGPT:
    return DiffusionGPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=5, n_embd=40, heads=heads))


class _LoggingTensor(torch.Tensor):
    """A user's minimal ``__torch_function__`` subclass: counts the calls and defers to torch."""

    calls = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(torch.Tensor)


@pytest.mark.parametrize("spec", [MIXED, "heat(t=-0.5, steps=6):1,ppr(alpha=0.3, steps=3, learnable=True):1,"
                                  "heat(t=0.5, steps=4, method='euler'):1,polynomial(steps=2):1,attention:1"])
def test_bug_models_built_inside_fake_tensor_mode(spec):
    """Bug: building a layer or a model with heat or PPR heads inside a ``FakeTensorMode`` (a dry run for shapes or
    memory, with no real weights) raised ``DataDependentOutputException: aten._local_scalar_dense``: the constructors
    read their fixed coefficients and the truncation bound as Python floats from tensors made under the mode (fake
    ones). They are read from real CPU tensors now, as under ``with torch.device("meta")``; the fake model's output
    has the real shape, and models built afterwards outside the mode give the outputs they gave before."""
    torch.manual_seed(0)
    real_layer = DiffusionAttention(40, 5, heads=spec).eval()
    real_gpt = _gpt(spec).eval()
    x, idx = torch.randn(2, 9, 40), torch.randint(0, 11, (2, 12))
    with torch.no_grad():
        want_layer, want_gpt = real_layer(x), real_gpt(idx)[0]
    with FakeTensorMode() as mode:
        layer = DiffusionAttention(40, 5, heads=spec).eval()  # raised
        gpt = _gpt(spec).eval()
        out = layer(mode.from_tensor(x))
        logits, _ = gpt(mode.from_tensor(idx))
    assert isinstance(out, FakeTensor) and out.shape == want_layer.shape
    assert isinstance(logits, FakeTensor) and logits.shape == want_gpt.shape
    for fake_op, real_op in zip(layer.operators, real_layer.operators):  # the same Python floats as a real build
        assert fake_op.static_coefficients() == real_op.static_coefficients()
    torch.manual_seed(0)
    fresh_layer, fresh_gpt = DiffusionAttention(40, 5, heads=spec).eval(), _gpt(spec).eval()
    with torch.no_grad():
        assert torch.equal(fresh_layer(x), want_layer) and torch.equal(fresh_gpt(idx)[0], want_gpt)
        assert type(real_layer(x)) is torch.Tensor and torch.equal(real_layer(x), want_layer)


def _jagged(*lengths: int, width: int = 40, layout=torch.jagged) -> torch.Tensor:
    return torch.nested.nested_tensor([torch.randn(n, width) for n in lengths], layout=layout)


@pytest.mark.parametrize("layout", [torch.jagged, torch.strided])
@pytest.mark.parametrize("heads, kwargs", [(MIXED, {}), (MIXED, {"is_causal": True}), (None, {}),
                                           (MIXED, {"edge_index": EDGES[:, :2]})])
def test_bug_nested_tensor_input_is_a_clear_error_naming_x(layout, heads, kwargs):
    """Bug: a ``torch.nested`` batch given to ``DiffusionAttention`` failed inside torch with messages that name no
    argument: "unsupported: <class 'NestedIntNode'>" (mixed heads, jagged), "No viable backend for
    scaled_dot_product_attention was found" (all-attention), "NestedTensorImpl doesn't support sizes. Please file an
    issue." (strided layout), "sparse input x must have shape (N, D), got (1, j4, 40)" (edge_index). It is a TypeError
    naming ``x`` and the way out (pad and mask, or one sequence per call)."""
    layer = DiffusionAttention(40, 5, heads=heads).eval()
    with pytest.raises(TypeError, match=r"x must be a dense \(strided\) tensor, got a nested tensor .*to_padded_tensor"):
        layer(_jagged(3, 5, layout=layout), **kwargs)
    x = torch.randn(1, 5, 40)  # the layer still runs on dense tokens
    assert layer(x[0] if "edge_index" in kwargs else x, **kwargs).shape[-1] == 40


@pytest.mark.parametrize("layout", [torch.jagged, torch.strided])
def test_bug_nested_token_ids_and_nested_functional_inputs_are_clear_errors(layout):
    """Bug: ``DiffusionGPT`` given jagged token ids raised "ge: relation is indeterminate" from a symbolic length, and
    ``functional.diffuse`` given a strided nested ``q`` raised "NestedTensorImpl doesn't support sizes. Please file an
    issue.", a jagged one a hint, ``q.to_dense()``, that fails for jagged tensors. Both now name the argument and
    point to ``to_padded_tensor``."""
    gpt = _gpt().eval()
    ids = torch.nested.nested_tensor([torch.randint(0, 11, (3,)), torch.randint(0, 11, (5,))], layout=layout)
    with pytest.raises(ValueError, match=r"idx must be a dense \(strided\) tensor .*nested tensor"):
        gpt(ids)
    q = torch.nested.nested_tensor([torch.randn(5, 3, 8), torch.randn(5, 4, 8)], layout=layout)
    for coeffs in ([[0.0, 1.0]] * 5, [[0.0, 0.5, 0.5]] * 5):
        with pytest.raises(TypeError, match=r"q must be a dense \(strided\) tensor, got a nested tensor .*"
                                            r"q\.to_padded_tensor"):
            functional.diffuse(q, q, q, coeffs)


@pytest.mark.parametrize("backend", ["auto", "csr"])
@pytest.mark.parametrize("heads", [None, MIXED, "differential:1,attention:4"])
def test_bug_sparse_layer_takes_a_torch_function_subclass(backend, heads):
    """Bug: a sparse call (CSR back-end, the default) on a ``__torch_function__`` subclass of ``Tensor`` (a user's
    logging tensor) failed with "Sparse CSR tensors do not have strides": torch wrapped every result in the subclass,
    the CSR matrices of the kernels included. ``diffuse_sparse`` now takes such inputs as one function call, as
    torch's functional API does; values and gradients equal the plain tensor's and the output comes back as the
    subclass, as on the dense path."""
    torch.manual_seed(0)
    layer = DiffusionAttention(40, 5, heads=heads)
    x = torch.randn(7, 40)
    ref_x = x.clone().requires_grad_()
    ref = layer(ref_x, edge_index=EDGES) if backend == "auto" else None
    if ref is None:
        q = ref_x.view(7, 5, 8)
        ref = functional.diffuse_sparse(q, q, q, EDGES, [0.0, 0.5, 0.5], backend=backend)
    ref.sum().backward()
    sub_x = x.clone().as_subclass(_LoggingTensor).requires_grad_()
    if backend == "auto":
        got = layer(sub_x, edge_index=EDGES)
    else:
        q = sub_x.view(7, 5, 8)
        got = functional.diffuse_sparse(q, q, q, EDGES, [0.0, 0.5, 0.5], backend=backend)
    got.sum().backward()
    assert type(got) is _LoggingTensor
    torch.testing.assert_close(_plain(got), ref, rtol=0, atol=0)
    torch.testing.assert_close(_plain(sub_x.grad), ref_x.grad, rtol=0, atol=0)


def test_bug_graph_transformer_takes_a_torch_function_subclass():
    """Bug: ``DiffusionGraphTransformer`` on node features of a ``__torch_function__`` subclass failed inside the CSR
    kernels ("Sparse CSR tensors do not have strides"); it now gives the plain tensor's output, as the subclass."""
    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=6, dim=40, depth=2, num_heads=5,
                                                             heads=MIXED)).eval()
    x = torch.randn(7, 6)
    want = model(x, EDGES)
    got = model(x.as_subclass(_LoggingTensor), EDGES)
    want, got = (want[0], got[0]) if isinstance(want, tuple) else (want, got)
    assert type(got) is _LoggingTensor
    torch.testing.assert_close(_plain(got), want, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["auto", "matrix", "sdpa"])
def test_pins_dense_torch_function_subclass_keeps_type_values_and_gradients(backend):
    """A dense mixed layer (affine, K-step heads, training with its AffineHeads path) on a logging subclass: the
    plain tensor's values and gradients, returned as the subclass, and the subclass saw the calls."""
    torch.manual_seed(0)
    layer = DiffusionAttention(40, 5, heads=MIXED, backend=backend).train()
    x = torch.randn(2, 9, 40)
    ref_x = x.clone().requires_grad_()
    ref = layer(ref_x)
    ref.square().sum().backward()
    sub_x = x.clone().as_subclass(_LoggingTensor).requires_grad_()
    before = _LoggingTensor.calls
    got = layer(sub_x)
    got.square().sum().backward()
    assert type(got) is _LoggingTensor and _LoggingTensor.calls > before
    torch.testing.assert_close(_plain(got), ref, rtol=0, atol=0)
    torch.testing.assert_close(_plain(sub_x.grad), ref_x.grad, rtol=0, atol=0)


def test_pins_flop_counter_counts_one_product_per_step_and_head():
    """Under ``FlopCounterMode`` the matrix back-end costs the scores ``Q K^T`` once per head and one ``(N x N) @
    (N x C)`` product per step of every head (attention and Laplacian: 1, heat: 3, PPR: 4), never ``K`` steps for
    every head; the count equals that sum, the output is unchanged, and later plain calls give the same bits."""
    torch.manual_seed(0)
    B, N, D, H = 2, 16, 40, 5
    C = D // H
    layer = DiffusionAttention(D, H, heads=MIXED, backend="matrix").eval()
    x = torch.randn(B, N, D)
    want = layer(x)
    with FlopCounterMode(display=False) as counter:
        got = layer(x)
    flops = counter.get_flop_counts()["Global"]
    product = 2 * B * N * N * C  # one (N x N) @ (N x C) product (or Q K^T) of one head
    steps = 1 + 1 + 1 + 3 + 4
    assert flops[torch.ops.aten.bmm] == product * (H + steps)
    assert flops[torch.ops.aten.addmm] == 2 * B * N * D * (3 * D) + 2 * B * N * D * D  # qkv and output projections
    assert torch.equal(got, want) and torch.equal(layer(x), want)


def _clear_tensor_caches() -> None:
    from diffusionformer.operators import heat as _heat
    from diffusionformer.operators import ppr as _ppr
    from diffusionformer.ops import engine as _engine

    for fn in (_engine.static_tensor, _engine._head_columns, _heat._taylor_table, _ppr._ppr_table):
        fn.cache_clear()


@pytest.mark.parametrize("call", ["dense", "dense-learned", "dense-train", "sparse", "sparse-causal", "gpt"])
def test_bug_real_model_runs_inside_a_meta_device_context(call):
    """Bug: a CPU layer or model called inside ``with torch.device("meta")`` (deferred init of another model under
    way) raised "Cannot copy out of meta tensor; no data!" (dense) or "Could not run 'aten::sparse_sampled_addmm.out'
    with arguments from the 'SparseCsrMeta' backend" (sparse): the cached coefficient and power tables, and the CSR
    matrices, were made on the default device (meta there) and then copied to the inputs' device, instead of on it.
    They are made on the inputs' device now: the call gives the bits it gives outside the context, on CPU."""
    torch.manual_seed(0)
    spec = "heat(t=1.0, steps=3, learnable=True):2,ppr(steps=4, learnable=True):1,laplacian:2" if "learned" in call \
        else MIXED
    layer = DiffusionAttention(40, 5, heads=spec, causal=call == "sparse-causal").train(call == "dense-train")
    gpt = _gpt().eval()
    x, nodes, idx = torch.randn(2, 9, 40), torch.randn(7, 40), torch.randint(0, 11, (2, 9))

    def run() -> torch.Tensor:
        torch.manual_seed(1)
        if call == "gpt":
            return gpt(idx)[0]
        return layer(nodes, edge_index=EDGES) if call.startswith("sparse") else layer(x)

    want = run()
    _clear_tensor_caches()
    try:
        with torch.device("meta"):
            got = run()
    finally:
        _clear_tensor_caches()
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, want, rtol=0, atol=0)
