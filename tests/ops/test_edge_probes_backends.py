"""Edge-case probes of the engine's extension points (the operator registry, user back-ends and
context operators, back-end names) and of the agreement of every back-end with explicit float64
matrices: ``P = softmax(q k^T / sqrt(C) + mask)`` (a zero row where no key is admissible), then
each operator's formula from its docstring, under causal and padding masks with fully masked
rows, ``N = 1``, bf16 autocast and float64 gradchecks. Triton runs under the interpreter
(``conftest.py``), at tiny sizes.
"""

from __future__ import annotations

import copy
import importlib.util
import math

import pytest
import torch
from torch import Tensor

from diffusionformer import DiffusionAttention
from diffusionformer.functional import diffuse, diffuse_sparse
from diffusionformer.operators import (
    DiffusionOperator,
    HeatOperator,
    build_operator,
    list_operators,
    operator_class,
    register_operator,
    unregister_operator,
)
from diffusionformer.ops.engine import Backend, polynomial, select
from diffusionformer.ops.rivals import LayerState
from diffusionformer.testing import apply_operator_dense

HAS_TRITON = importlib.util.find_spec("triton") is not None


class _Halfway(DiffusionOperator):
    """``(I + P) / 2``: a minimal user operator."""

    degree = 1

    def coefficients(self) -> Tensor:
        return torch.tensor([0.5, 0.5])


@pytest.fixture
def registered():
    """Registers operators for one test and unregisters them afterwards, whatever happens."""
    names: list[str] = []

    def register(cls: type, **kwargs) -> type:
        register_operator(cls, **kwargs)
        names.append(cls.name)
        return cls

    yield register
    for n in names:
        if n in list_operators():
            unregister_operator(n)


# ---------------------------------------------------------------------------- the registry
def test_a_subclass_of_a_registered_operator_registers_under_its_own_name(registered):
    """Bug: ``@register_operator(name="my-heat") class MyHeat(HeatOperator)`` raised "operator name
    'heat-kernel' is already registered by HeatOperator": the subclass claimed its parent's aliases."""

    class MyHeat(HeatOperator):
        pass

    registered(MyHeat, name="my-heat")
    assert MyHeat.aliases == () and HeatOperator.aliases == ("heat-kernel", "exp", "diffusion")
    assert type(build_operator("my_heat(t=0.5, steps=3)")) is MyHeat
    assert type(build_operator("heat-kernel")) is HeatOperator
    layer = DiffusionAttention(8, 2, heads="attention:1,my-heat(t=0.5, steps=3):1")
    assert layer.head_operator_names == ["attention", "my-heat"]


def test_registering_one_class_under_a_second_name_is_refused(registered):
    """Bug: registering a class again under another name renamed it: instances built by the first name
    wrote the second in their spec, and once that was unregistered the spec failed with "unknown operator
    'half-b' (did you mean 'half-b'?)"."""

    class Half(_Halfway):
        pass

    registered(Half, name="half-a")
    with pytest.raises(ValueError, match=r"Half is already registered as 'half-a'.*aliases"):
        registered(Half, name="half-b")
    assert Half.name == "half-a" and "half-b" not in list_operators()
    op = build_operator("half-a")
    assert type(build_operator(op.spec())) is Half
    # after unregistering, the class may be registered again (under any name)
    unregister_operator("half-a")
    registered(Half, name="half-c", aliases=("hc",))
    assert type(build_operator("HC")) is Half


@pytest.mark.parametrize("name", ["a(b)", "half:2", "half,quarter", "{H}", "x[0]", "True"])
@pytest.mark.parametrize("as_alias", [False, True], ids=["name", "alias"])
def test_names_specs_cannot_read_are_refused_when_registering(registered, name, as_alias):
    """Bug: names with spec syntax (``a(b)``, ``half:2``, ``{H}``, ``true``) were registered, and then
    neither ``build_operator`` nor a head spec could name the operator ("arguments must be given as
    key=value", "invalid operator name")."""

    class Named(_Halfway):
        pass

    kwargs = {"name": "named-ok", "aliases": (name,)} if as_alias else {"name": name}
    with pytest.raises(ValueError, match="cannot read as a name"):
        registered(Named, **kwargs)
    assert "named-ok" not in list_operators() and Named.name == ""


def test_legal_unusual_names_round_trip_through_specs_and_head_specs(registered):
    """Pins: names with digits, '=', dots or non-ASCII letters, and any spelling of an alias, are read back."""
    for i, name in enumerate(["1", "x=1", "v1.5", "héat"]):
        cls = registered(type(f"Odd{i}", (_Halfway,), {}), name=name, aliases=(f"odd alias {i}",))
        assert type(build_operator(name)) is cls and type(build_operator(f"ODD_ALIAS-{i}")) is cls
        assert type(build_operator(cls().spec())) is cls
    layer = DiffusionAttention(8, 4, heads="1:1,x=1:1,v1.5:1,héat:1")
    assert layer.head_operator_names == ["1", "x=1", "v1.5", "héat"]


@pytest.mark.parametrize("coeffs, err, match", [
    (torch.tensor([1.0, 0.5], dtype=torch.complex64), TypeError, "must be a real tensor, got torch.complex64"),
    (torch.tensor([True, False]), TypeError, "must be a real tensor, got torch.bool"),
    (torch.zeros(0), ValueError, "at least one column"),
    (torch.zeros(1, 0), ValueError, "at least one column"),
], ids=["complex", "bool", "empty", "empty-rows"])
def test_user_coefficients_that_are_not_real_weights_are_refused(registered, coeffs, err, match):
    """Bug: a user operator's complex coefficients lost their imaginary part (a ComplexWarning only), bools
    were read as 0/1, and an empty ``(0,)`` made every head output 0, silently, in the layer."""

    class Bad(DiffusionOperator):
        degree = 1

        def coefficients(self) -> Tensor:
            return coeffs

    registered(Bad, name="bad-coefficients")
    layer = DiffusionAttention(8, 2, heads="attention:1,bad-coefficients:1")
    with pytest.raises(err, match=match):
        layer(torch.randn(2, 3, 8))
    with pytest.raises(err, match=match):
        Bad().head_coefficients(2)


def test_integer_and_shorter_user_coefficients_still_work(registered):
    """Pins: integer coefficients are exact weights, and fewer than ``degree + 1`` are zero-padded."""

    class IntLaplacian(DiffusionOperator):
        degree = 2

        def coefficients(self) -> Tensor:
            return torch.tensor([1, -1])

    registered(IntLaplacian, name="int-laplacian")
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads="int-laplacian:1,laplacian:1")
    x = torch.randn(2, 3, 8)
    ref = copy.deepcopy(layer)
    ref.operators[0] = build_operator("laplacian")
    torch.testing.assert_close(layer(x), ref(x))


# ---------------------------------------------------------------------------- user back-ends, context operators
class _Truncating(Backend):
    """A user back-end whose ``propagate`` drops feature columns: a wrong shape that broadcasts."""

    name = "truncating"

    def __init__(self, P: Tensor) -> None:
        self.P = P

    def propagate(self, x: Tensor, heads) -> Tensor:
        return (select(self.P, heads, 1) @ x)[..., :1]


def test_a_user_backend_returning_a_wrong_shape_is_named():
    """Bug: a user back-end whose ``propagate`` returned ``(B, H, N, 1)`` for ``(B, H, N, C)`` inputs was
    broadcast into the sum: a result of the right shape and wrong values, no error."""
    P = torch.softmax(torch.randn(1, 2, 3, 3), -1)
    v = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"back-end 'truncating': propagate\(x, heads\) must return P x.*\(1, 2, 3, 4\), "
                                         r"got \(1, 2, 3, 1\)"):
        polynomial(_Truncating(P), v, torch.ones(2, 3), (2, 2))
    from diffusionformer.ops.engine import affine

    with pytest.raises(ValueError, match="back-end 'truncating'"):
        affine(_Truncating(P), v, (1.0, 1.0), (-1.0, -1.0))


@pytest.mark.parametrize("result, match", [
    (lambda ctx: ctx.v[..., :1], r"shape of ctx.v \(2, 1, 4, 4\), got \(2, 1, 4, 1\)"),
    (lambda ctx: ctx.v[:1], r"got \(1, 1, 4, 4\)"),
    (lambda ctx: None, "got NoneType"),
    (lambda ctx: ctx.v.long(), "torch.int64"),
], ids=["columns", "batch", "none", "integer"])
def test_a_context_operator_returning_a_wrong_output_is_named(registered, result, match):
    """Bug: a user context operator whose ``apply_context`` returned a wrong shape, ``None`` or integers
    failed inside ``index_add`` ("source tensor shape must match ...", "'NoneType' object has no attribute
    'to'") without naming the operator, or had its integers cast silently."""

    class Ctx(DiffusionOperator):
        is_polynomial = False
        needs_uniform_map = True
        degree = 0

        def apply_context(self, ctx):
            return result(ctx)

    registered(Ctx, name="bad-context")
    layer = DiffusionAttention(8, 2, heads="attention:1,bad-context:1")
    with pytest.raises(ValueError, match=r"Ctx.apply_context\(ctx\) must return the output of its heads.*" + match):
        layer(torch.randn(2, 4, 8))


@pytest.mark.parametrize("call, bad, hint", [
    ("dense", "Matrix", "did you mean 'matrix'"),
    ("dense", "tritn", "did you mean 'triton'"),
    ("dense", "csr", "'csr' is a back-end of sparse graphs: pass edge_index"),
    ("sparse", "nativ", "did you mean 'native'"),
    ("sparse", "torch-scatter", "did you mean 'torch_scatter'"),
    ("sparse", "sdpa", "'sdpa' is a back-end of dense"),
])
def test_misspelt_backend_names_get_a_did_you_mean(call, bad, hint):
    """Bug: ``backend="Matrix"`` or ``"nativ"`` got only the list of valid names, and ``"csr"`` passed to the
    dense API did not say that it is a sparse back-end."""
    q = torch.randn(3, 2, 4)
    with pytest.raises(ValueError, match="backend must be one of .*" + hint):
        if call == "dense":
            diffuse(q[None], q[None], q[None], [0.0, 1.0], backend=bad)
        else:
            diffuse_sparse(q, q, q, torch.tensor([[0, 1], [1, 2]]), [0.0, 1.0], backend=bad)


# ---------------------------------------------------------------------------- agreement with float64 matrices
def _explicit_P(q: Tensor, k: Tensor, allowed: Tensor) -> Tensor:
    """``softmax(q k^T / sqrt(C))`` over the allowed keys in float64, a zero row where there is none."""
    q, k = q.double(), k.double()
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~allowed, float("-inf"))
    e = torch.exp(s - s.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0)) * allowed
    return e / e.sum(-1, keepdim=True).clamp_min(1e-300)


def _powers(P: Tensor, v: Tensor, c: list[float]) -> Tensor:
    out, x = c[0] * v, v
    for ck in c[1:]:
        x = P @ x
        out = out + ck * x
    return out


def _explicit(spec: str, P: Tensor, v: Tensor) -> Tensor:
    """Each operator's formula (its docstring) applied with explicit float64 matrices."""
    v = v.double()
    eye = torch.eye(P.shape[-1], dtype=torch.float64)
    t, a = 0.7, 0.2
    formulas = {
        "attention": lambda: P @ v,
        "laplacian": lambda: v - P @ v,
        "heat": lambda: _powers(P, v, [math.exp(-t) * t**j / math.factorial(j) for j in range(5)]),
        "heat-euler": lambda: _powers(P, v, [math.comb(4, j) * (1 - t / 4) ** (4 - j) * (t / 4) ** j for j in range(5)]),
        "heat-exact": lambda: torch.linalg.matrix_exp(-t * (eye - P)) @ v,
        "ppr": lambda: _powers(P, v, [a * (1 - a) ** j for j in range(4)] + [(1 - a) ** 4]),
        "ppr-exact": lambda: a * torch.linalg.solve(eye - (1 - a) * P, v),
        "polynomial": lambda: _powers(P, v, [0.1, 0.6, 0.2, 0.1]),
        "chebyshev": lambda: _powers(P, v, [0.1, 0.6, 0.2, 0.1]),
    }
    return formulas[spec]()


_SPECS = {
    "attention": "attention",
    "laplacian": "laplacian",
    "heat": "heat(t=0.7, steps=4, learnable=True)",
    "heat-euler": "heat(t=0.7, steps=4, method='euler')",
    "heat-exact": "heat-exact(t=0.7)",
    "ppr": "ppr(alpha=0.2, steps=4, learnable=True)",
    "ppr-exact": "ppr-exact(alpha=0.2)",
    "polynomial": "polynomial(steps=3, init=[0.1, 0.6, 0.2, 0.1])",
    "chebyshev": "polynomial(steps=3, init=[0.1, 0.6, 0.2, 0.1], basis='chebyshev')",
}
_DENSE = ["sdpa", "matrix", "auto"] + (["triton"] if HAS_TRITON else [])


def _graphs(B: int, N: int) -> dict[str, tuple[dict, Tensor]]:
    """Masks with fully masked rows: ``(call kwargs, allowed (B, 1, N, N))``."""
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    lead = torch.ones(B, 1, 1, N, dtype=torch.bool)
    lead[0, ..., :2] = False  # causal: rows 0, 1 of sequence 0 have no admissible key
    full = torch.ones(B, 1, 1, N, dtype=torch.bool)
    full[-1] = False  # a fully padded sequence
    window = (torch.arange(N)[:, None] - torch.arange(N)[None, :]).abs() <= 1
    window[N // 2] = False  # one query with no key
    return {
        "causal+lead-padding": ({"is_causal": True, "attn_mask": lead}, causal & lead),
        "padded-sequence": ({"attn_mask": full}, full.expand(B, 1, N, N)),
        "window-empty-row": ({"attn_mask": window}, window.expand(B, 1, N, N)),
    }


@pytest.fixture
def engines(request):
    """The dense back-ends; Triton's kernels interpreted on CPU (the ``triton_kernels`` fixture)."""
    if HAS_TRITON:
        request.getfixturevalue("triton_kernels")
    return _DENSE


@pytest.mark.parametrize("name", sorted(_SPECS))
def test_every_polynomial_and_exact_operator_on_every_dense_backend_matches_explicit_float64(engines, name):
    """Pins: causal + leading padding, a padded sequence and an empty window row, and N = 1, on every dense
    back-end (fully masked rows output ``c_0 v``, or the exact operators' value of a zero row of ``P``), and
    under bf16 autocast."""
    torch.manual_seed(0)
    op = build_operator(_SPECS[name], num_heads=2)
    for N, graphs in ((5, _graphs(2, 5)), (1, {"single-token": ({"is_causal": True}, torch.ones(2, 1, 1, 1, dtype=torch.bool))})):
        q, k, v = (torch.randn(2, 2, N, 4) for _ in range(3))
        for label, (kwargs, allowed) in graphs.items():
            expected = _explicit(name, _explicit_P(q, k, allowed), v)
            for backend in engines:
                if backend == "triton" and not op.is_polynomial:
                    continue  # non-polynomial operators apply a matrix function to a materialised P
                got = apply_operator_dense(op, q, k, v, backend=backend, **kwargs)
                torch.testing.assert_close(got.double(), expected, atol=2e-6, rtol=2e-6,
                                           msg=lambda m: f"{name} {label} N={N} {backend}: {m}")
                if label != "causal+lead-padding":
                    continue  # bf16 autocast: one graph with empty rows is enough (the interpreter is slow)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    low = apply_operator_dense(op, q, k, v, backend=backend, **kwargs)
                assert torch.isfinite(low).all()
                torch.testing.assert_close(low.double(), expected, atol=3e-2, rtol=3e-2,
                                           msg=lambda m: f"{name} {label} N={N} {backend} bf16 autocast: {m}")


@pytest.mark.parametrize("name", ["heat", "laplacian"])  # learned (a tensor) and static coefficients
def test_float64_gradients_on_dense_and_sparse_backends_with_rows_without_keys(name):
    """Pins: gradcheck of ``q``, ``k``, ``v`` and the learned coefficients in float64 on the sdpa, matrix, csr
    and native back-ends, with queries that have no admissible key (dense) or no incoming edge (sparse)."""
    torch.manual_seed(1)
    op = build_operator(_SPECS[name], num_heads=2).double()
    c = op.head_coefficients(2).detach().clone().requires_grad_(True)
    static = [float(x) for x in c[0].detach()] if name == "laplacian" else None
    B, H, N, C = 2, 2, 4, 3
    q, k, v = (torch.randn(B, H, N, C, dtype=torch.float64, requires_grad=True) for _ in range(3))
    window = torch.ones(B, 1, N, N, dtype=torch.bool).tril()
    window[1, :, 2] = False  # query 2 of sequence 1 has no key
    for backend in ("sdpa", "matrix"):
        torch.autograd.gradcheck(lambda q, k, v, c: diffuse(q, k, v, static or c, attn_mask=window, backend=backend),
                                 (q, k, v, c))
    qs, ks, vs = (t[0].transpose(0, 1).detach().clone().requires_grad_(True) for t in (q, k, v))  # (N, H, C)
    edge_index = torch.tensor([[0, 1, 2, 0, 1], [1, 1, 2, 0, 0]])  # node 3 receives no edge
    for backend in ("csr", "native"):
        for is_causal in (False, True):
            torch.autograd.gradcheck(
                lambda q, k, v, c: diffuse_sparse(q, k, v, edge_index, static or c, backend=backend, is_causal=is_causal),
                (qs, ks, vs, c))


def _spec(name: str) -> str:
    return build_operator(name, **dict(operator_class(name).example_kwargs)).spec()


@pytest.mark.parametrize("name", [n for n in list_operators() if build_operator(n).uses_context])
def test_rival_layers_agree_on_every_dense_backend_with_padded_sequences_and_one_token(engines, name):
    """Pins: a layer with a rival head (context operator) gives the float64 matrix layer's output on every
    dense back-end for a fully padded sequence, causal leading padding and N = 1 (finite everywhere)."""
    torch.manual_seed(2)
    ref = DiffusionAttention(16, 2, heads=f"heat(t=0.5, steps=3):1,{_spec(name)}:1", backend="matrix").double()
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1] = True
    lead = torch.zeros(2, 5, dtype=torch.bool)
    lead[0, :2] = True
    calls = [(5, {"key_padding_mask": pad}), (5, {"key_padding_mask": lead, "is_causal": True}), (1, {"is_causal": True})]
    for N, kwargs in calls:
        x = torch.randn(2, N, 16, dtype=torch.float64)
        state = (lambda: LayerState()) if build_operator(name).needs_layer_state else (lambda: None)
        expected = ref(x, state=state(), **kwargs)
        for backend in engines:
            layer = copy.deepcopy(ref).float()
            layer.backend = backend
            got = layer(x.float(), state=state(), **kwargs)
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got.double(), expected, atol=2e-5, rtol=2e-5,
                                       msg=lambda m: f"{name} {sorted(kwargs)} N={N} {backend}: {m}")


def test_functional_diffuse_takes_integer_coefficient_tensors():
    """Bug: ``diffuse(q, k, v, torch.tensor([1, -1]))`` (the Laplacian head ``I - P``) was refused ("coeffs must be
    floating point") while the list ``[1, -1]`` and the layers' integer coefficients were accepted. It now gives
    exactly what the float coefficients give, checked against an explicit float64 ``I - P``."""
    from diffusionformer.ops.dense import diffuse

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    out = diffuse(q, k, v, torch.tensor([1, -1]), backend="matrix")
    p = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1)
    torch.testing.assert_close(out, v - p @ v)
    torch.testing.assert_close(out, diffuse(q, k, v, torch.tensor([1.0, -1.0]), backend="matrix"), rtol=0, atol=0)
