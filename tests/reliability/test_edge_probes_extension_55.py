"""Edge probes (sitting 55e): a researcher extends the library as the docs tell her -- her own fixed ``P^2`` head,
a learned two-parameter head, a function of a materialised ``P`` computed in another precision, and bad
implementations of each -- and expects the layer to run them on every path or refuse them naming the operator."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from diffusionformer import DiffusionAttention
from diffusionformer.nn.kv_cache import LayerKVCache
from diffusionformer.operators import DiffusionOperator, register_operator, unregister_operator
from diffusionformer.ops.engine import Backend, affine, polynomial, select


class _TwoParam(DiffusionOperator):
    """``(1 - a - b) I + a P + b P^2`` with learned scalars ``a``, ``b``."""

    name = "probe55-two-param"

    def __init__(self, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.a = nn.Parameter(torch.tensor(0.3))
        self.b = nn.Parameter(torch.tensor(0.2))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.a.fill_(0.3)
            self.b.fill_(0.2)

    @property
    def degree(self) -> int:
        return 2

    def coefficients(self) -> torch.Tensor:
        return torch.stack([1 - self.a - self.b, self.a, self.b])


class _BadStatic(DiffusionOperator):
    """A fixed ``P`` head whose ``static_coefficients()`` a user got wrong (set per test)."""

    name = "probe55-bad-static"
    static: tuple = (0.0, 1.0)

    @property
    def degree(self) -> int:
        return 1

    def coefficients(self) -> torch.Tensor:
        return torch.tensor([0.0, 1.0])

    def static_coefficients(self) -> tuple:
        return self.static


class _TwoHop64(DiffusionOperator):
    """``P P v`` through :meth:`apply_matrix`, computed and returned in float64 whatever the input dtype."""

    name = "probe55-two-hop-64"
    is_polynomial = False
    supports_sparse = False

    def apply_matrix(self, P: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        P = P.double()
        return P @ (P @ v.double())


@pytest.fixture
def user_operators():
    classes = (_TwoParam, _BadStatic, _TwoHop64)
    for cls in classes:
        register_operator(cls)
    yield
    for cls in classes:
        unregister_operator(cls.name)
    _BadStatic.static = (0.0, 1.0)


@pytest.mark.parametrize("causal", [False, True])
def test_bug_a_matrix_operator_returning_another_dtype_is_refused_naming_it(user_operators, causal):
    """``apply_matrix`` of a user's operator that computes in float64 returned float64 for a float32 layer (which
    ``assert_operator(..., dtype=torch.float32)`` fails as a law): the layer's ``index_add`` failed with torch's
    "self (Float) and source (Double) must have the same scalar type", naming no operator, and cached decoding cast it
    back silently (so the two paths disagreed on what is allowed). Both now refuse it naming the operator."""
    layer = DiffusionAttention(8, 2, heads="probe55-two-hop-64:1,attention:1", causal=causal)
    x = torch.randn(2, 5, 8)
    match = (r"_TwoHop64\.apply_(causal_)?matrix\(P, v\) must return the output of its heads in the dtype of v "
             r"\(torch\.float32\), got torch\.float64")
    with pytest.raises(ValueError, match=match):
        layer(x)
    if causal:
        with pytest.raises(ValueError, match=match):
            layer(x[:, :1], cache=LayerKVCache())
    assert layer.double()(x.double()).dtype == torch.float64  # in float64 it is right


@pytest.mark.parametrize("graph", ["dense", "causal", "sparse", "cache"])
def test_bug_non_finite_learned_coefficients_name_the_operator(user_operators, graph):
    """A user's learned operator whose coefficients became NaN was refused with the engine's "coeffs must be finite,
    got [[nan, ...], [0.0, 1.0]]": all the layer's heads, naming neither the operator nor its parameters. The
    operator's :meth:`head_coefficients` (which the layer, cached decoding and edge-feature attention read) now
    names it."""
    layer = DiffusionAttention(8, 2, heads="probe55-two-param:1,attention:1", causal=graph == "cache")
    x = torch.randn(2, 4, 8)
    layer(x)  # finite: runs
    with torch.no_grad():
        layer.operators[0].a.fill_(float("nan"))
    with pytest.raises(ValueError, match=r"operator 'probe55-two-param': coeffs must be finite, got \[nan, nan, 0\.2"):
        if graph == "dense":
            layer(x)
        elif graph == "causal":
            layer(x, is_causal=True)
        elif graph == "sparse":
            layer(x[0], edge_index=torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]))
        else:
            layer(x[:, :1], cache=LayerKVCache())


_FINITE = r"must return finite numbers \(coeffs must be finite\), got "
_FLAT = r"must return a flat tuple of degree \+ 1 numbers \(c_0, \.\.\., c_K\), got "


@pytest.mark.parametrize("static, error, match", [
    ((float("inf"), 1.0), ValueError, _FINITE + r"\(inf, 1\.0\)"),
    ((float("nan"), 1.0), ValueError, _FINITE + r"\(nan, 1\.0\)"),
    (("zero", 1.0), TypeError, _FLAT + r"\('zero', 1\.0\)"),
    (((0.0, 1.0),), TypeError, _FLAT + r"\(\(0\.0, 1\.0\),\)"),
])
@pytest.mark.parametrize("heads", ["probe55-bad-static:2", "attention:1,probe55-bad-static:1",
                                   "probe55-two-param:1,probe55-bad-static:1"])
def test_bug_bad_static_coefficients_are_refused_naming_the_operator(user_operators, static, error, match, heads):
    """``static_coefficients()`` (which the layer trusts in place of ``coefficients()``) returning ``inf`` was refused
    with the engine's "coeffs must be finite, got [[0.0, 1.0], [inf, 1.0]]", a string with float()'s "could not
    convert string to float: 'zero'" and a nested tuple with "float() argument must be ... not 'tuple'", none naming
    the operator; all now name it, when the layer is built, whether every head is fixed or some are learned (the
    layer's affine heads)."""
    _BadStatic.static = static
    with pytest.raises(error, match=r"operator 'probe55-bad-static': static_coefficients\(\) " + match):
        DiffusionAttention(8, 2, heads=heads)


def test_bug_short_static_coefficients_pad_with_zeros_beside_a_learned_head(user_operators):
    """Fewer static coefficients than ``degree + 1`` are zero weights on the higher powers (the all-fixed layer pads
    them), but beside a learned head the layer's affine heads read ``c_1`` of a degree-1 head as ``st[1]``: building
    the layer raised a bare ``IndexError: tuple index out of range``. Both layouts now pad them alike."""
    _BadStatic.static = (0.5,)
    torch.manual_seed(0)
    x = torch.randn(1, 4, 8)
    for heads in ("probe55-bad-static:1,attention:1", "probe55-bad-static:1,probe55-two-param:1"):
        layer = DiffusionAttention(8, 2, heads=heads)
        v = layer.qkv(x).view(1, 4, 3, 2, 4)[:, :, 2, 0]  # head 0's values
        out = layer.out_proj.weight[:, :4] @ (0.5 * v[0]).T  # head 0 is 0.5 v; head 1 removed below
        layer.out_proj.weight.data[:, 4:] = 0
        torch.testing.assert_close(layer(x)[0], out.T + layer.out_proj.bias)


class _HeadMajor(Backend):
    """A user's back-end as the engine's docstring writes one: ``P`` given as ``(H, N, N)``, signals ``(H, N, C)``."""

    name = "probe55-head-major"
    head_axis = 0

    def __init__(self, P: torch.Tensor) -> None:
        self.P = P

    def propagate(self, x: torch.Tensor, heads: tuple[int, ...]) -> torch.Tensor:
        return select(self.P, heads, 0) @ x


class _FusedFirstHead(_HeadMajor):
    """Declares a fused affine pass, which returns the first head alone."""

    fused_affine = True

    def affine(self, v, c0, c1):  # noqa: ANN001, ANN201
        return (c0[0] * v + c1[0] * (self.P @ v))[:1]


def test_bug_a_fused_affine_pass_of_the_wrong_shape_is_refused_as_propagate_is():
    """A user back-end's ``propagate`` of the wrong shape is refused naming the back-end, but its fused ``affine``
    pass was returned unchecked: one head of three came back as the layer's output. Both are checked now; a right
    back-end agrees with explicit matrices."""
    torch.manual_seed(0)
    H, N, C = 3, 4, 2
    P = torch.rand(H, N, N, dtype=torch.float64).softmax(-1)
    v = torch.randn(H, N, C, dtype=torch.float64)
    c = torch.randn(H, 3, dtype=torch.float64)
    expected = torch.stack([c[h, 0] * v[h] + c[h, 1] * P[h] @ v[h] + c[h, 2] * P[h] @ P[h] @ v[h] for h in range(H)])
    torch.testing.assert_close(polynomial(_HeadMajor(P), v, c, (2, 2, 2)), expected)
    torch.testing.assert_close(affine(_HeadMajor(P), v, [0.5] * 3, [0.5] * 3), 0.5 * v + 0.5 * P @ v)
    with pytest.raises(ValueError, match=r"back-end 'probe55-head-major': affine\(v, c0, c1\) must return "
                                         r"c0 v \+ c1 P v, of the shape of x \(3, 4, 2\), got \(1, 4, 2\)"):
        affine(_FusedFirstHead(P), v, [0.5] * 3, [0.5] * 3)
