"""Edge-case probes: every operator family under reduced precision on CPU (autocast, half modules, float64).

Probed against float64 (the same layer converted with ``.double()``, explicit softmax matrices ``P``, powers of
``P``, :func:`torch.matrix_exp` and :func:`torch.linalg.solve`): ``torch.autocast("cpu")`` in bfloat16 and
float16 with float32 modules, modules converted with ``.bfloat16()`` / ``.half()``, float64 throughout; masked
rows, causal first rows and logits scaled by 20; the dense back-ends ``auto`` / ``sdpa`` / ``matrix`` and the
sparse ``auto`` / ``csr`` / ``native``; learned parameters set to NaN or inf.

Nothing wrong was found: outputs stay within ~3e-2 (relative to the largest output) of float64 in bf16 and fp16,
half modules return their dtype, learned parameters keep float32 and finite gradients, non-finite parameters
are refused. One bug (``test_bug_*`` below): the output dtype under autocast depended on the back-end.
"""

from __future__ import annotations

import copy

import pytest
import torch

import diffusionformer.functional as F
from diffusionformer import DiffusionAttention
from diffusionformer.operators import build_operator, list_operators, operator_class

F64 = torch.float64
LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _specs() -> list[str]:
    return [build_operator(n, **dict(operator_class(n).example_kwargs)).spec() for n in list_operators()]


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def _reference(q, k, v, coeffs, allowed):
    """``sum_k c_k P^k v`` with an explicit float64 softmax (rows without keys: zero rows of ``P``)."""
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    P = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
    c = torch.as_tensor(coeffs, dtype=F64).expand(q.shape[1], -1)
    out, x = torch.zeros_like(v), v
    for j in range(c.shape[1]):
        out, x = out + c[:, j].view(1, -1, 1, 1) * x, P @ x
    return out


@pytest.mark.parametrize("spec", _specs())
@pytest.mark.parametrize("mode", ["fp16-autocast", "bf16-module", "fp16-module"])
@pytest.mark.parametrize("causal", [False, True])
def test_low_precision_layer_matches_float64(spec, mode, causal):
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 2, heads=f"{spec}:2", causal=causal)
    with torch.no_grad():
        layer.qkv.weight.mul_(4.0)  # large logits
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[0, -3:] = True
    x = torch.randn(2, 12, 16)
    if mode == "fp16-autocast":
        want = copy.deepcopy(layer).double()(x.double(), key_padding_mask=mask)
        with torch.autocast("cpu", dtype=torch.float16):
            got = layer(x, key_padding_mask=mask)
        assert got.dtype == torch.float16
    else:
        dt = LOW[mode[:4]]
        layer, x = layer.to(dt), x.to(dt)
        want = copy.deepcopy(layer).double()(x.double(), key_padding_mask=mask)  # the same rounded weights
        got = layer(x, key_padding_mask=mask)
        assert got.dtype == dt and all(p.dtype == dt for p in layer.parameters())
    assert torch.isfinite(got).all()
    assert _rel(got, want) <= 3e-2
    got.float().square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.dtype == p.dtype and torch.isfinite(p.grad).all(), name


def test_float64_layer_keeps_float64_and_backends_agree():
    torch.manual_seed(0)
    x = torch.randn(2, 9, 16, dtype=F64)
    for spec in _specs():
        outs = []
        for backend in ("auto", "sdpa", "matrix"):
            torch.manual_seed(1)
            layer = DiffusionAttention(16, 2, heads=f"{spec}:2", backend=backend, causal=True).double()
            outs.append(layer(x))
            assert outs[-1].dtype == F64
        for y in outs[1:]:
            assert (y - outs[0]).abs().max() <= 1e-12 * outs[0].abs().max(), spec


@pytest.mark.parametrize("coeffs", [[0.0, 1.0], [1.0, -1.0], [0.3, 0.3, 0.2, 0.2],
                                    [[0.1, 0.9, 0.0], [1.0, -1.0, 0.0], [0.2, 0.3, 0.5]], "tensor"])
@pytest.mark.parametrize("low", ["bf16", "fp16"])
def test_dense_backends_agree_under_autocast_with_masked_and_causal_rows(coeffs, low):
    torch.manual_seed(0)
    B, H, N, C = 2, 3, 9, 4
    q, k, v = (torch.randn(B, H, N, C) for _ in range(3))
    q = q * 5.0
    mask = torch.ones(B, H, N, N, dtype=torch.bool)
    mask[0, :, 2, :] = False  # a query without keys
    mask[1, :, :, -2:] = False
    c = torch.tensor([0.5, 0.25, 0.25]) if coeffs == "tensor" else coeffs
    want = _reference(q, k, v, c, mask & torch.ones(N, N, dtype=torch.bool).tril())
    for backend in ("auto", "sdpa", "matrix"):
        with torch.autocast("cpu", dtype=LOW[low]):
            got = F.diffuse(q, k, v, c, attn_mask=mask, is_causal=True, backend=backend)
        assert got.dtype == LOW[low], backend  # what F.scaled_dot_product_attention returns under autocast
        assert torch.isfinite(got).all() and _rel(got, want) <= 3e-2, backend


@pytest.mark.parametrize("mode", ["bf16-autocast", "fp16-autocast", "bf16", "fp16", "float64"])
def test_sparse_backends_agree_in_reduced_precision(mode):
    torch.manual_seed(0)
    N, H, C = 10, 2, 4
    q, k, v = (torch.randn(N, H, C) for _ in range(3))
    ei = torch.randint(0, N, (2, 30))
    c = [0.3, 0.3, 0.2, 0.2]
    want = F.diffuse_sparse(q.double(), k.double(), v.double(), ei, c, backend="native")
    for backend in ("auto", "csr", "native"):
        if mode.endswith("autocast"):
            with torch.autocast("cpu", dtype=LOW[mode[:4]]):
                got = F.diffuse_sparse(q, k, v, ei, c, backend=backend)
            tol = 1e-5
        else:
            dt = F64 if mode == "float64" else LOW[mode]
            got = F.diffuse_sparse(q.to(dt), k.to(dt), v.to(dt), ei, c, backend=backend)
            assert got.dtype == dt
            tol = 1e-12 if dt == F64 else 3e-2
        assert _rel(got, want) <= tol, backend


@pytest.mark.parametrize("spec", ["heat-exact(t=5.0)", "ppr-exact(alpha=0.01)"])
@pytest.mark.parametrize("low", ["bf16", "fp16"])
def test_exact_operators_under_autocast_match_matrix_exp_and_solve(spec, low):
    torch.manual_seed(0)
    op = build_operator(spec, num_heads=2)
    P = torch.softmax(torch.randn(1, 2, 8, 8) * 3, -1)
    v = torch.randn(1, 2, 8, 3)
    eye = torch.eye(8, dtype=F64)
    if spec.startswith("heat"):
        want = torch.matrix_exp(-5.0 * (eye - P.double())) @ v.double()
    else:
        want = 0.01 * torch.linalg.solve(eye - 0.99 * P.double(), v.double())
    with torch.autocast("cpu", dtype=LOW[low]):
        got = op.apply_matrix(P, v)
    assert got.dtype in (torch.float32, LOW[low]) and _rel(got, want) <= 2e-2


_LEARNED = ["heat(t=0.7, steps=4, learnable=True)", "heat-exact(t=0.7, learnable=True)",
            "ppr(alpha=0.2, steps=4, learnable=True)", "polynomial(steps=3, init=[0.1, 0.6, 0.2, 0.1])",
            "attnscale(omega=0.4, learnable=True)", "differential(depth=2)"]


@pytest.mark.parametrize("spec", _LEARNED)
@pytest.mark.parametrize("mode", ["bf16-autocast", "fp16-autocast", "bf16", "float64"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_learned_parameters_are_refused_in_every_precision(spec, mode, value):
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 2, heads=f"{spec}:2")
    name, p = next((n, p) for n, p in layer.named_parameters() if n.startswith("operators."))
    with torch.no_grad():
        p.view(-1)[0] = value
    x = torch.randn(2, 6, 16)
    with pytest.raises(ValueError, match="finite"):
        if mode.endswith("autocast"):
            with torch.autocast("cpu", dtype=LOW[mode[:4]]):
                layer(x)
        else:
            dt = F64 if mode == "float64" else LOW[mode]
            layer.to(dt)(x.to(dt))


@pytest.mark.parametrize("coeffs", [[0.0, 1.0], [0.3, 0.3, 0.2, 0.2], [[1.0, -1.0, 0.0], [0.2, 0.3, 0.5]], "tensor"])
@pytest.mark.parametrize("backend", ["auto", "sdpa", "matrix"])
def test_bug_diffuse_output_dtype_under_autocast_does_not_depend_on_the_back_end(coeffs, backend):
    """Bug: under autocast, ``functional.diffuse`` on float32 inputs returned bfloat16 on the affine path of static
    coefficients with ``"sdpa"``/``"auto"`` but float32 with ``"matrix"``, with tensor coefficients, with ``K``-step
    heads, and on the split path (so ``"auto"`` changed its output dtype with ``N``). Every dense path now returns
    what ``F.scaled_dot_product_attention`` returns under autocast; float64 inputs stay float64."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    c = torch.tensor([[0.5, 0.25, 0.25], [0.0, 1.0, 0.0]], requires_grad=True) if coeffs == "tensor" else coeffs
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = F.diffuse(q, k, v, c, is_causal=True, backend=backend)
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        wide = F.diffuse(q.double(), k.double(), v.double(), c, is_causal=True, backend=backend)
    assert got.dtype == sdpa.dtype == torch.bfloat16
    assert wide.dtype == F64
    want = _reference(q, k, v, c.detach() if coeffs == "tensor" else c, torch.ones(6, 6, dtype=torch.bool).tril())
    assert _rel(got, want) <= 3e-2
    if coeffs == "tensor":
        got.float().sum().backward()
        assert c.grad is not None and c.grad.dtype == torch.float32 and torch.isfinite(c.grad).all()


def test_bug_triton_back_end_under_autocast_returns_the_autocast_dtype(triton_kernels):
    """Bug: ``backend="triton"`` ran float32 inputs under autocast in float32 and returned float32, where every
    other dense back-end (and the fused kernel it stands in for) returns the autocast dtype; it now casts the
    inputs as autocast casts those of ``F.scaled_dot_product_attention``, and gradients reach them in float32."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16, requires_grad=True) for _ in range(3))
    coeffs = [[1.0, -1.0, 0.0], [0.2, 0.3, 0.5]]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = F.diffuse(q, k, v, coeffs, is_causal=True, backend="triton")
        other = F.diffuse(q, k, v, coeffs, is_causal=True, backend="matrix")
    assert got.dtype == other.dtype == torch.bfloat16
    want = _reference(q.detach(), k.detach(), v.detach(), coeffs, torch.ones(8, 8, dtype=torch.bool).tril())
    assert _rel(got, want) <= 3e-2
    got.float().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.float32 and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_weights_under_autocast_keep_the_input_dtype_as_attention_matrix():
    """``need_weights=True`` under autocast: the output in the autocast dtype (every back-end's), ``P`` in the
    input dtype, as documented and as :func:`~diffusionformer.ops.dense.attention_matrix` returns it."""
    from diffusionformer.ops.dense import attention_matrix, diffuse_with_weights

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, P = diffuse_with_weights(q, k, v, [0.5, 0.5], is_causal=True, need_weights=True)
        ref = attention_matrix(q, k, is_causal=True)
    assert out.dtype == torch.bfloat16 and P.dtype == ref.dtype == torch.float32
    assert (P - ref).abs().max() <= 1e-2
