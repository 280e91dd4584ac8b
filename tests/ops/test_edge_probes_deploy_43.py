"""Edge probes of deployment-style tracing: ``torch.export`` (strict and not, with dynamic shapes),
``torch.fx`` and ``torch.compile(dynamic=True)`` of layers and models, against eager and float64."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators import heat as _heat
from diffusionformer.operators import ppr as _ppr
from diffusionformer.ops import engine as _engine

pytestmark = [pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")]

MIXED = "attention:2,laplacian:1,heat(t=1.0, steps=3):1,ppr(steps=4):1"


def _clear_tensor_caches() -> None:
    for fn in (_engine.static_tensor, _engine._head_columns, _heat._taylor_table, _ppr._ppr_table):
        fn.cache_clear()


@pytest.fixture
def clean_tensor_caches():
    _clear_tensor_caches()
    yield
    _clear_tensor_caches()  # a failing run must not leave fake tensors behind for the other tests


@pytest.mark.parametrize("causal", [False, True])
def test_bug_nonstrict_export_caches_fake_tensors(clean_tensor_caches, causal):
    """Bug: ``engine._tensor_cache`` bypassed its ``lru_cache`` under a dispatch mode only when
    ``torch.compiler.is_compiling()`` was false, but that is true during a non-strict
    ``torch.export.export`` (torch's default), which runs the Python code itself under a
    ``FakeTensorMode``. The fake static-coefficient / Taylor / PPR tables were cached, so every later
    eager call of the layer returned a ``FakeTensor`` (``.item()`` then raised a data-dependent
    guard error) and a second export failed with "fake tensor in the exported program constant's list".
    """
    torch.manual_seed(0)
    layer = DiffusionAttention(20, 5, heads=MIXED, causal=causal).eval()
    ref = DiffusionAttention(20, 5, heads=MIXED, causal=causal).eval().double()
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(2, 7, 20)
    dims = ({0: torch.export.Dim("B", min=1, max=8), 1: torch.export.Dim("N", min=2, max=32)},)
    ep = torch.export.export(layer, (x,), dynamic_shapes=dims, strict=False)
    eager = layer(x)
    assert type(eager) is torch.Tensor and not isinstance(eager, FakeTensor)
    torch.testing.assert_close(eager.double(), ref(x.double()), atol=1e-5, rtol=1e-4)
    ep2 = torch.export.export(layer, (x,), dynamic_shapes=dims, strict=False)  # raised before
    for b, n in [(2, 7), (3, 11), (1, 2)]:
        xx = torch.randn(b, n, 20)
        want = ref(xx.double())
        for prog in (ep, ep2):
            torch.testing.assert_close(prog.module()(xx).double(), want, atol=1e-5, rtol=1e-4)


class _Masked(torch.nn.Module):
    def __init__(self, kind: str, causal: bool) -> None:
        super().__init__()
        self.kind = kind
        self.attn = DiffusionAttention(20, 5, heads=MIXED, causal=causal)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.attn(x, **{self.kind: mask})


@pytest.mark.parametrize("kind", ["key_padding_mask", "attn_mask"])
def test_bug_nonstrict_export_with_a_mask_and_dynamic_length(kind):
    """Bug: with a mask and a dynamic sequence length, non-strict ``torch.export.export`` (torch's
    default) failed in ``AttentionGraph``'s validation with "seq_len must be an int, got SymInt"
    (``graph._checks.check_int`` refused the symbolic ``x.shape[1]`` the layer passes itself), although
    the same export without a mask, and with ``strict=True``, works. The exported program must equal
    the float64 eager layer at other batch sizes and lengths."""
    torch.manual_seed(1)
    model = _Masked(kind, causal=kind == "attn_mask").eval()
    ref = _Masked(kind, causal=kind == "attn_mask").eval().double()
    ref.load_state_dict(model.state_dict())
    B, N = torch.export.Dim("B", min=1, max=8), torch.export.Dim("N", min=2, max=32)

    def mask(b: int, n: int) -> torch.Tensor:
        if kind == "key_padding_mask":
            m = torch.rand(b, n) < 0.3
            m[:, 0] = False
            return m
        return torch.randn(n, n)

    dims = ({0: B, 1: N}, {0: B, 1: N} if kind == "key_padding_mask" else {0: N, 1: N})
    ep = torch.export.export(model, (torch.randn(2, 7, 20), mask(2, 7)), dynamic_shapes=dims, strict=False)
    for b, n in [(2, 7), (3, 11), (1, 3)]:
        x, m = torch.randn(b, n, 20), mask(b, n)
        got = ep.module()(x, m).double()
        want = ref(x.double(), m if m.dtype == torch.bool else m.double())
        if kind == "key_padding_mask":
            got, want = got[~m], want[~m]  # padded query rows are unspecified
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_pins_check_int_still_refuses_non_integers_and_small_values():
    """Pin: the symbolic-size branch of ``check_int`` leaves the eager checks as they were."""
    from diffusionformer.graph._checks import check_int

    assert check_int("n", 3, 1) == 3 and type(check_int("n", 3, 1)) is int
    for bad in (True, 2.0, "3"):
        with pytest.raises(TypeError, match="n must be an int"):
            check_int("n", bad, 1)
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        check_int("n", 0, 1)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("warm", [False, True])
def test_bug_jit_trace_of_a_k_step_layer_fails_its_own_check(clean_tensor_caches, warm):
    """Bug: ``torch.jit.trace`` of a layer with ``K``-step heads raised ``TracingCheckError: Graphs
    differed across invocations`` with its default ``check_trace=True``: ``engine.combine_affine`` chose
    ``addcmul(..., out=y)`` or the out-of-place ``addcmul`` by ``requires_grad``, and the tracer's check
    re-traces under ``torch.no_grad()``; and ``engine._tensor_cache`` recorded the operations building a
    static table in the first trace and a constant (a cache hit) in the second. While tracing it now
    takes the out-of-place operation (the same bits), as it does while compiling, and builds the tables
    uncached. The trace must equal the float64 eager layer."""
    torch.manual_seed(2)
    spec = "attention:1,laplacian:1,heat(t=1.0, steps=3):1,ppr(steps=4):1"
    layer = DiffusionAttention(16, 4, heads=spec).eval()
    ref = DiffusionAttention(16, 4, heads=spec).eval().double()
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(2, 7, 16)
    if warm:  # the tables cached by an eager call first
        layer(x)
    traced = torch.jit.trace(layer, (x,))
    x2 = torch.randn(2, 7, 16)
    torch.testing.assert_close(traced(x2).double(), ref(x2.double()), atol=1e-5, rtol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(traced(x2).double(), ref(x2.double()), atol=1e-5, rtol=1e-4)


class _Sparse(torch.nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.attn = DiffusionAttention(20, 5, heads=MIXED, causal=causal)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.attn(x, edge_index=edge_index)


@pytest.mark.parametrize("causal", [False, True])
def test_bug_nonstrict_export_of_a_sparse_layer_with_dynamic_sizes(causal):
    """Bug: non-strict ``torch.export.export`` of a sparse layer with a dynamic number of nodes failed
    with "num_nodes must be an int or None, got SymInt" (``ops.sparse._check_num_nodes``) and then
    "dim_size must be an int, got torch.SymInt" (``ops.scatter``), checks of the sizes the layer
    passes itself; ``strict=True`` worked. The program must equal the float64 eager layer on other
    graphs (other ``N`` and ``E``)."""
    torch.manual_seed(3)
    model, ref = _Sparse(causal).eval(), _Sparse(causal).eval().double()
    ref.load_state_dict(model.state_dict())
    dims = ({0: torch.export.Dim("N", min=2, max=64)}, {1: torch.export.Dim("E", min=2, max=512)})
    ep = torch.export.export(model, (torch.randn(7, 20), torch.randint(0, 7, (2, 20))), dynamic_shapes=dims,
                             strict=False)
    for n, e in [(7, 20), (11, 40), (5, 3)]:
        x, ei = torch.randn(n, 20), torch.randint(0, n, (2, e))
        torch.testing.assert_close(ep.module()(x, ei).double(), ref(x.double(), ei), atol=1e-5, rtol=1e-4)
