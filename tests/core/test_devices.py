"""Every operator and layer on every available device against a float64 CPU reference.

Runs on ``cpu`` everywhere (float32 against float64) and also on ``cuda`` where a GPU is
visible, so the same assertions check the CUDA paths (SDPA kernels, scatter on GPU, autocast)
whenever the suite runs on a GPU machine.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer import DiffusionAttention, build_operator, list_operators
from diffusionformer.operators import operator_class
from diffusionformer.testing import apply_operator_dense, apply_operator_sparse, random_qkv

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# every registered operator, with the parameters it declares for tests (``example_kwargs``: they
# differ from the defaults where a default hides a code path, e.g. learnable times): a new
# operator is tested here with no list to edit
OPERATORS = {name: dict(operator_class(name).example_kwargs) for name in list_operators()}


def test_every_registered_operator_is_covered():
    assert sorted(OPERATORS) == sorted(list_operators())
    for name, kwargs in OPERATORS.items():  # the declared parameters build the operator
        assert build_operator(name, num_heads=3, **kwargs).name == name


def _close(actual: torch.Tensor, expected: torch.Tensor, tol: float = 2e-4) -> None:
    torch.testing.assert_close(actual.detach().double().cpu(), expected.detach().double().cpu(), atol=tol, rtol=tol)


def _pair(make, device: str) -> tuple[torch.nn.Module, torch.nn.Module]:  # noqa: ANN001
    """``make()`` twice: a float64 CPU reference and a float32 copy of its weights on ``device``."""
    torch.manual_seed(0)
    ref = make().double()
    module = make()
    module.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ref.state_dict().items()})
    return ref, module.to(device)


def _ops(name: str, device: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    return _pair(lambda: build_operator(name, num_heads=3, **OPERATORS[name]), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["sdpa", "matrix"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_dense_operator_matches_float64_cpu(name, causal, backend, device):
    ref, op = _ops(name, device)
    q, k, v = random_qkv(2, 3, 17, 8, seed=1)
    expected = apply_operator_dense(ref, q, k, v, backend="matrix", is_causal=causal)
    got = apply_operator_dense(op, *(t.float().to(device) for t in (q, k, v)), backend=backend, is_causal=causal)
    assert got.device.type == device and got.dtype == torch.float32
    _close(got, expected)


SPARSE = sorted(n for n in OPERATORS if build_operator(n, num_heads=1, **OPERATORS[n]).supports_sparse)


@pytest.mark.parametrize("name", sorted(set(OPERATORS) - set(SPARSE)))
def test_dense_only_operators_are_refused_by_the_sparse_layer(name):
    layer = DiffusionAttention(8, 2, heads=f"{name}:1,attention:1")
    with pytest.raises(ValueError, match="does not support the sparse back-end"):
        layer(torch.randn(4, 8), edge_index=torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]))


def test_only_the_exact_kernels_are_dense_only():
    # matrix_exp and the PPR solve need the whole matrix
    assert sorted(set(OPERATORS) - set(SPARSE)) == ["heat-exact", "ppr-exact"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", SPARSE)
def test_sparse_operator_matches_float64_cpu(name, device):
    ref, op = _ops(name, device)
    gen = torch.Generator().manual_seed(2)
    n = 40
    src, dst = torch.randint(0, n, (2, 300), generator=gen)
    loops = torch.arange(n)
    edge_index = torch.unique(torch.stack([torch.cat([src, loops]), torch.cat([dst, loops])]), dim=1)
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in random_qkv(1, 3, n, 8, seed=3))  # (N, H, C)
    expected = apply_operator_sparse(ref, q, k, v, edge_index)
    got = apply_operator_sparse(op, *(t.float().to(device) for t in (q, k, v)), edge_index.to(device))
    assert got.device.type == device
    _close(got, expected)


HEADS = ["attention:2,laplacian:2", "attention:2,heat(t=0.5, learnable=True, steps=4):2",
         "attention:2,polynomial(steps=3, init='attention'):2", "attention:2,ppr(alpha=0.2, steps=4):2",
         "differential:2,attnscale(omega=0.3):1,ppr-exact(alpha=0.3):1",
         "grand-nl(steps=2, method='rk4'):2,polynomial(steps=3, init=[0.1, 0.2, 0.3, 0.4], basis='chebyshev'):2"]


def _layers(heads: str, device: str, **kwargs) -> tuple[DiffusionAttention, DiffusionAttention]:
    return _pair(lambda: DiffusionAttention(16, 4, heads, **kwargs), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("heads", HEADS)
def test_layer_forward_and_gradients_match_float64_cpu(heads, device):
    """Values, input gradients and every parameter gradient, with padding and a causal mask."""
    ref, layer = _layers(heads, device, causal=True)
    x = torch.randn(3, 12, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    pad = torch.zeros(3, 12, dtype=torch.bool)
    pad[1, 9:] = True  # a padded tail
    xr = x.clone().requires_grad_(True)
    xd = x.float().to(device).requires_grad_(True)
    out_r = ref(xr, key_padding_mask=pad)
    out_d = layer(xd, key_padding_mask=pad.to(device))
    _close(out_d, out_r)
    w = torch.randn(out_r.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    (out_r * w).sum().backward()
    (out_d * w.float().to(device)).sum().backward()
    _close(xd.grad, xr.grad, 5e-4)
    grads_r = dict(ref.named_parameters())
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.device.type == device, name
        _close(p.grad, grads_r[name].grad, 5e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_layer_matches_float64_cpu(device):
    ref, layer = _layers(HEADS[1], device)
    n = 30
    gen = torch.Generator().manual_seed(6)
    edge_index = torch.unique(torch.cat([torch.randint(0, n, (2, 150), generator=gen),
                                         torch.arange(n).repeat(2, 1)], dim=1), dim=1)
    x = torch.randn(n, 16, dtype=torch.float64, generator=gen)
    _close(layer(x.float().to(device), edge_index=edge_index.to(device)), ref(x, edge_index=edge_index))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("heads", HEADS)
def test_bfloat16_autocast_stays_near_float32(heads, device):
    """Mixed precision (the trainer's ``amp = "auto"`` on CUDA): finite, and within bf16 rounding."""
    _, layer = _layers(heads, device, causal=True)
    x = torch.randn(2, 32, 16, generator=torch.Generator().manual_seed(7)).to(device)
    full = layer(x)
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        low = layer(x)
    assert torch.isfinite(low).all()
    err = (low.float() - full).norm() / full.norm()
    assert err < 0.05, f"relative error {err:.3g} under bf16 autocast"


def _model_pair(name: str, device: str, **overrides):
    from diffusionformer.models import create_model

    ref, model = _pair(lambda: create_model(name, dropout=0.0, **overrides), device)
    return ref.eval(), model.eval()


@pytest.mark.parametrize("device", DEVICES)
def test_models_match_float64_cpu(device):
    """The three model families end to end: a GPT's loss, a ViT's logits, a graph transformer's logits."""
    gen = torch.Generator().manual_seed(8)
    ref, gpt = _model_pair("gpt-char-tiny", device, vocab_size=20, block_size=16, n_layer=2, n_head=4, n_embd=32,
                           heads="attention:2,heat(t=0.5, learnable=True, steps=4):1,laplacian:1")
    idx = torch.randint(0, 20, (3, 16), generator=gen)
    logits_r, loss_r = ref(idx, idx)
    logits_d, loss_d = gpt(idx.to(device), idx.to(device))
    _close(logits_d, logits_r, 5e-4)
    _close(loss_d, loss_r, 5e-4)

    ref, vit = _model_pair("vit-digits", device, dim=16, depth=2, num_heads=4, heads="attention:2,ppr(alpha=0.2, steps=4):2")
    images = torch.rand(4, 1, 8, 8, generator=gen, dtype=torch.float64)
    _close(vit(images.float().to(device)), ref(images), 5e-4)

    ref, gt = _model_pair("graph-node-small", device, in_channels=5, num_classes=3,
                          heads="attention:2,polynomial(steps=3, init='attention'):2")
    n = 25
    edge_index = torch.unique(torch.randint(0, n, (2, 100), generator=gen), dim=1)
    x = torch.randn(n, 5, generator=gen, dtype=torch.float64)
    _close(gt(x.float().to(device), edge_index.to(device)), ref(x, edge_index), 5e-4)
