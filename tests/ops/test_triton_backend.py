"""The Triton back-end of the engine (``backend="triton"``) against float64 references and the matrix back-end.

The whole layer (:class:`~diffusionformer.DiffusionAttention` with attention, Laplacian, heat,
PPR and learned heat heads, affine and K-step heads interleaved) and the functional entry point,
causal and key-padded (rows with no admissible key included), forward and backward (inputs,
weights and the learned heat time). On CPU the kernels run under the Triton interpreter
(``conftest.py``), so sizes are tiny; without triton every test is skipped.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from torch import Tensor

from diffusionformer import DiffusionAttention
from diffusionformer.functional import diffuse, diffuse_with_weights
from diffusionformer.ops import engine
from diffusionformer.ops.triton import backend as triton_backend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
requires_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install 'triton>=3.6'; Linux wheels only)",
)

pytestmark = [requires_triton, pytest.mark.usefixtures("triton_kernels")]

MIXED = "attention:1,laplacian:1,heat(t=1.0, steps=4):1,ppr(steps=5):1,heat(t=0.5, learnable=True):1,attention:1"


def explicit_P(q: Tensor, k: Tensor, is_causal: bool, pad: Tensor | None) -> Tensor:
    """float64 softmax matrix, a zero row where no key is admissible; ``(B, H, N, N)``."""
    q, k = q.double(), k.double()
    B, H, N, C = q.shape
    keep = torch.ones(B, 1, N, N, dtype=torch.bool, device=q.device)
    if is_causal:
        keep = keep & torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
    if pad is not None:
        keep = keep & ~pad[:, None, None, :]
    s = (q @ k.transpose(-2, -1) / C**0.5).masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True).clamp_min(-1e300).nan_to_num(0.0)
    e = torch.exp(s - m) * keep
    return e / e.sum(-1, keepdim=True).clamp_min(1e-300)


def poly_reference(P: Tensor, v: Tensor, coeffs: Tensor, degrees) -> Tensor:
    """``sum_{j <= d_h} c_{h,j} P_h^j v_h`` in float64, head by head."""
    v, coeffs = v.double(), coeffs.double()
    outs = []
    for h, d in enumerate(degrees):
        y, o = v[:, h], coeffs[h, 0] * v[:, h]
        for j in range(1, d + 1):
            y = P[:, h] @ y
            o = o + coeffs[h, j] * y
        outs.append(o)
    return torch.stack(outs, 1)


def layer_reference(layer: DiffusionAttention, x: Tensor, is_causal: bool, pad: Tensor | None) -> Tensor:
    """The layer's math in float64 with explicit ``P`` (its weights and coefficients, none of its kernels)."""
    B, N, D = x.shape
    H, C = layer.num_heads, layer.head_dim
    qkv = torch.nn.functional.linear(x.double(), layer.qkv.weight.double(), layer.qkv.bias.double())
    q, k, v = qkv.view(B, N, 3, H, C).unbind(2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out = poly_reference(explicit_P(q, k, is_causal, pad), v, layer.coefficients().double(), layer._degrees)
    return torch.nn.functional.linear(out.transpose(1, 2).reshape(B, N, D), layer.out_proj.weight.double(),
                                      layer.out_proj.bias.double())


def padding(B: int, N: int) -> Tensor:
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[0, N - 4:] = True  # trailing padding
    pad[-1, :2] = True  # leading padding: with is_causal rows 0..1 have no admissible key
    return pad.to(DEVICE)


def grads(out: Tensor, inputs: list[Tensor], g: Tensor) -> list[Tensor]:
    return list(torch.autograd.grad(out, inputs, g.to(out.dtype)))


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
def test_mixed_layer_matches_float64_and_the_matrix_backend(is_causal, padded):
    torch.manual_seed(0)
    B, N, D, H = 2, 13, 48, 6
    layer = DiffusionAttention(D, H, MIXED, backend="triton").to(DEVICE)
    ref_layer = copy.deepcopy(layer)
    ref_layer.backend = "matrix"
    x = torch.randn(B, N, D, device=DEVICE, requires_grad=True)
    pad = padding(B, N) if padded else None
    out = layer(x, key_padding_mask=pad, is_causal=is_causal)
    mat = ref_layer(x, key_padding_mask=pad, is_causal=is_causal)
    ref = layer_reference(layer, x, is_causal, pad)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, mat, atol=1e-5, rtol=1e-5)

    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    params = [layer.qkv.weight, layer.out_proj.weight, layer.operators[4].t]
    ref_params = [ref_layer.qkv.weight, ref_layer.out_proj.weight, ref_layer.operators[4].t]
    got = grads(out, [x] + params, g)
    want_mat = grads(mat, [x] + ref_params, g)
    want = grads(ref, [x] + params, g.double())
    for name, a, b, c in zip(("dx", "dW_qkv", "dW_out", "dt"), got, want, want_mat):
        tol = 1e-4 * (1 + b.abs().max().item())
        torch.testing.assert_close(a.double(), b.double(), atol=tol, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
        torch.testing.assert_close(a, c, atol=tol, rtol=1e-4, msg=lambda m, n=name: f"{n} vs matrix: {m}")
    assert got[-1].abs().item() > 0  # the learned heat time gets a gradient


@pytest.mark.parametrize("static", [True, False], ids=["static", "tensor"])
def test_functional_interleaved_heads_respect_degrees(static):
    # K-step heads 0 and 2 (not one run), affine heads 1, 3 and 4; the tensor coefficients are
    # non-zero beyond each head's degree, which the engine (and so the back-end) must ignore
    torch.manual_seed(3)
    B, H, N, C = 2, 5, 11, 8
    q, k, v = (torch.randn(B, H, N, C, device=DEVICE, requires_grad=True) for _ in range(3))
    rows = [[0.2, 0.3, 0.4, 0.1], [1.0, -1.0, 0.5, 0.5], [0.1, 0.2, 0.7, 0.9], [0.0, 1.0, 0.3, 0.2],
            [0.5, 0.0, 0.3, 0.3]]
    degrees = (2, 1, 3, 1, 0)
    coeffs = rows if static else torch.tensor(rows, device=DEVICE, requires_grad=True)
    out = diffuse(q, k, v, coeffs, degrees=degrees, is_causal=True, backend="triton")
    mat = diffuse(q, k, v, coeffs, degrees=degrees, is_causal=True, backend="matrix")
    c = torch.tensor(rows, dtype=torch.float64, device=DEVICE)
    ref = poly_reference(explicit_P(q, k, True, None), v, c if static else coeffs, degrees)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, mat, atol=1e-5, rtol=1e-5)
    assert out.transpose(1, 2).is_contiguous()  # (B, N, H, C) storage: the layer's reshape is free
    inputs = [q, k, v] + ([] if static else [coeffs])
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    got = grads(out, inputs, g)
    for name, a, b in zip(("dq", "dk", "dv", "dcoeffs"), got, grads(ref, inputs, g.double())):
        torch.testing.assert_close(a.double(), b.double(), atol=1e-4, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    if not static:
        dc = got[3]
        beyond = torch.arange(4, device=DEVICE)[None, :] > torch.tensor(degrees, device=DEVICE)[:, None]
        assert dc[beyond].abs().max().item() == 0.0  # powers a head does not use get no gradient


@pytest.mark.parametrize("degrees", [(1, 1, 0), (3, 2, 3), (0, 0, 0)], ids=["affine", "kstep", "K0"])
def test_functional_single_group_layouts(degrees):
    torch.manual_seed(5)
    B, H, N, C = 1, 3, 9, 4
    q, k, v = (torch.randn(B, H, N, C, device=DEVICE) for _ in range(3))
    K = max(degrees)
    coeffs = torch.rand(H, K + 1, device=DEVICE) + 0.1
    pad = torch.tensor([[False] * 6 + [True] * 3], device=DEVICE)
    mask = ~pad[:, None, None, :]  # bool key mask (True = attend), the form the layer folds padding into
    out = diffuse(q, k, v, coeffs, degrees=degrees, attn_mask=mask, backend="triton")
    ref = poly_reference(explicit_P(q, k, False, pad), v, coeffs, degrees)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_backend_plugs_into_the_generic_engine():
    torch.manual_seed(6)
    B, H, N, C = 1, 3, 10, 8
    q, k, v = (torch.randn(B, H, N, C, device=DEVICE) for _ in range(3))
    be = triton_backend.TritonBackend(q, k, True, None, C**-0.5)
    P = explicit_P(q, k, True, None)
    c = torch.tensor([[0.5, 0.3, 0.2], [1.0, -1.0, 0.0], [0.0, 1.0, 0.0]], device=DEVICE)
    out = engine.polynomial(be, v, c, (2, 1, 1))
    torch.testing.assert_close(out.double(), poly_reference(P, v, c, (2, 1, 1)), atol=1e-5, rtol=1e-5)
    aff = engine.affine(be, v, (0.0, 1.0, 0.5), (1.0, -1.0, 0.5))
    want = poly_reference(P, v, torch.tensor([[0.0, 1.0], [1.0, -1.0], [0.5, 0.5]]), (1, 1, 1))
    torch.testing.assert_close(aff.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(attn_mask=torch.zeros(7, 7, requires_grad=True)), "float attn_mask that requires grad"),
        (dict(need_weights=True), "need_weights"),
    ],
    ids=["learned-mask", "weights"],
)
def test_explicit_triton_names_the_unsupported_feature(kwargs, match):
    q, k, v = (torch.randn(1, 2, 7, 4, device=DEVICE) for _ in range(3))
    kwargs = {n: (t.to(DEVICE) if isinstance(t, Tensor) else t) for n, t in kwargs.items()}
    with pytest.raises(ValueError, match=f"backend='triton' does not support .*{match}"):
        diffuse_with_weights(q, k, v, [0.0, 1.0], backend="triton", **kwargs)
    # the same inputs on the other back-ends still work
    diffuse_with_weights(q, k, v, [0.0, 1.0], backend="matrix", **kwargs)


def test_explicit_triton_rejects_float64_and_ragged_value_sizes():
    q, k = (torch.randn(1, 2, 7, 4, device=DEVICE, dtype=torch.float64) for _ in range(2))
    with pytest.raises(ValueError, match="dtype torch.float64"):
        diffuse(q, k, q, [0.0, 1.0], backend="triton")
    q, k, v = q.float(), k.float(), torch.randn(1, 2, 7, 6, device=DEVICE)
    with pytest.raises(ValueError, match="values of head size 6 != the query head size 4"):
        diffuse(q, k, v, [0.0, 1.0], backend="triton")


@pytest.mark.skipif(DEVICE != "cuda", reason="backend='auto' takes Triton for CUDA tensors only")
def test_auto_on_cuda_takes_triton_only_when_enabled(monkeypatch):
    import diffusionformer.ops.dense as dense

    calls = []
    real = triton_backend.TritonBackend.diffuse
    monkeypatch.setattr(triton_backend.TritonBackend, "diffuse",
                        lambda self, *a: calls.append(1) or real(self, *a))
    q, k, v = (torch.randn(1, 2, 16, 8, device="cuda") for _ in range(3))
    assert dense.TRITON_IN_AUTO is False  # off until measured on a GPU (issue 15)
    diffuse(q, k, v, [1.0, -1.0], is_causal=True)
    assert calls == []
    monkeypatch.setattr(dense, "TRITON_IN_AUTO", True)
    diffuse(q, k, v, [1.0, -1.0], is_causal=True)
    assert calls == [1]
    diffuse(q, k, v, [0.0, 1.0], is_causal=True)  # all plain attention: the stock SDPA kernel stays
    assert calls == [1]
    mask = torch.randn(16, 16, device="cuda")
    out = diffuse(q, k, v, [1.0, -1.0], attn_mask=mask)  # a float mask is supported: Triton
    assert calls == [1, 1]
    torch.testing.assert_close(out, diffuse(q, k, v, [1.0, -1.0], attn_mask=mask, backend="matrix"), atol=1e-5,
                               rtol=1e-5)
    diffuse(q, k, v, [1.0, -1.0], attn_mask=mask.clone().requires_grad_())  # a learned mask: fallback
    assert calls == [1, 1]


def test_auto_rule_keeps_sdpa_for_all_attention_only():
    # the rule behind "auto" once the device is CUDA (private helper, run here on any device)
    from diffusionformer.ops.dense import _try_triton

    q, k, v = (torch.randn(1, 2, 6, 4, device=DEVICE) for _ in range(3))
    args = (None, False, 0.5, "auto")
    assert _try_triton(q, k, v, ((0.0, 1.0, 0.0), (0.0, 1.0, 0.0)), *args, (1, 1), 0.0, False) is None
    for rows, degrees in [(((0.0, 1.0), (1.0, -1.0)), (1, 1)), (((0.0, 1.0, 0.5), (0.0, 1.0, 0.0)), (2, 1))]:
        out = _try_triton(q, k, v, rows, *args, degrees, 0.0, False)
        torch.testing.assert_close(out, diffuse(q, k, v, list(map(list, rows)), degrees=degrees, scale=0.5,
                                                backend="matrix"), atol=1e-5, rtol=1e-5)
    with_dropout = _try_triton(q, k, v, ((0.0, 1.0), (1.0, -1.0)), *args, (1, 1), 0.5, False)  # dropout: Triton too
    assert with_dropout is not None and with_dropout.shape == v.shape
    big = torch.randn(1, 2, 3, 136, device=DEVICE)  # head size above TRITON_AUTO_MAX_HEAD_DIM: fall back
    assert _try_triton(big, big, big, ((0.0, 1.0), (1.0, -1.0)), *args, (1, 1), 0.0, False) is None


def test_auto_on_cpu_never_takes_triton(monkeypatch):
    if DEVICE != "cpu":
        pytest.skip("CPU rule")

    def boom(self, *a):
        raise AssertionError("auto took the Triton back-end on CPU")

    monkeypatch.setattr(triton_backend.TritonBackend, "diffuse", boom)
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    diffuse(q, k, v, [1.0, -1.0])


def test_torch_compile_fullgraph_captures_the_kernels():
    # the kernels are custom operators: fullgraph=True captures the layer (static coefficients,
    # affine and K-step heads) and the back-end with learned coefficients, forward and backward
    torch.manual_seed(7)
    layer = DiffusionAttention(32, 4, "attention:2,laplacian:1,heat(t=1.0, steps=3):1", backend="triton", causal=True)
    layer = layer.to(DEVICE)
    x = torch.randn(2, 9, 32, device=DEVICE, requires_grad=True)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    (dx,) = torch.autograd.grad(out.square().sum(), x)
    want = layer(x)
    (want_dx,) = torch.autograd.grad(want.square().sum(), x)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(dx, want_dx, atol=1e-6, rtol=1e-6)

    B, H, N, C = 1, 3, 8, 4
    q, k, v = (torch.randn(B, H, N, C, device=DEVICE, requires_grad=True) for _ in range(3))
    c = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.5, 0.3], [1.0, -1.0, 0.0]], device=DEVICE, requires_grad=True)
    fn = lambda q, k, v, c: triton_backend.TritonBackend(q, k, False, None, C**-0.5).diffuse(v, c, (1, 2, 1))  # noqa: E731
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, c)
    got = torch.autograd.grad(out.sum(), (q, k, v, c))
    ref = poly_reference(explicit_P(q, k, False, None), v, c, (1, 2, 1))
    want = torch.autograd.grad(ref.sum(), (q, k, v, c))
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b.double(), atol=1e-4, rtol=1e-4)


def _registered_polynomial_operators() -> list[str]:
    from diffusionformer import build_operator, list_operators
    from diffusionformer.operators import operator_class

    names = []
    for name in list_operators():
        op = build_operator(name, num_heads=3, **dict(operator_class(name).example_kwargs))
        if op.is_polynomial and not (op.needs_second_map or op.needs_layer_state or op.reprojects_each_step):
            names.append(name)
    return sorted(names)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", _registered_polynomial_operators())
def test_every_registered_polynomial_operator_runs_on_the_triton_backend(name, causal):
    # new registry entries are covered for free (the float64 reference is the matrix back-end)
    from diffusionformer import build_operator
    from diffusionformer.operators import operator_class
    from diffusionformer.testing import apply_operator_dense, random_qkv

    op = build_operator(name, num_heads=3, **dict(operator_class(name).example_kwargs))
    q, k, v = random_qkv(2, 3, 11, 8, seed=1)
    expected = apply_operator_dense(copy.deepcopy(op).double(), q, k, v, backend="matrix", is_causal=causal)
    got = apply_operator_dense(op.to(DEVICE), *(t.float().to(DEVICE) for t in (q, k, v)), backend="triton",
                               is_causal=causal)
    torch.testing.assert_close(got.double().cpu(), expected.double(), atol=1e-5, rtol=1e-5)
