"""Edge-case probes of back-end selection, the dense engine's caches and ``ops.recompute`` (second pass).

Found and fixed (each pinned by a "Bug:" test below):

* the process-wide caches of device tensors (``engine.static_tensor``, ``engine._head_columns``, the Triton
  back-end's ``_static_tensor`` and ``_degree_mask``, heat's ``_taylor_table``, PPR's ``_ppr_table``) cached
  what they built under a :class:`~torch._subclasses.fake_tensor.FakeTensorMode` (a dry run): after one, every
  real call with those coefficients failed, and a dry run after a real call failed too;
* ``ops._checks.checks_values`` read the values of fake tensors (a fake tensor reports the CPU device), so a
  dry run of ``diffuse`` with a coefficient tensor or a float mask failed with ``DataDependentOutputException``;
* ``choose_dense_backend(..., device_type="cuda:0")`` (``str(q.device)``) applied the CPU rule silently;
* ``recompute_saved`` rebuilt a ``z`` that had been changed in place inside the block (a forward pre-hook of
  the output projection adding to its input): the projection's weight gradient was silently wrong.

Also checked and found right (no test added beyond the agreement test below): every dense back-end against
explicit float64 matrices for bool / float / ``-inf``-row / key-padding masks, causal, batch 0, ``N = 0`` and
``N = 1``, non-contiguous inputs, mixed degrees and static or tensor coefficients; float32 and float64
gradients of ``q``, ``k``, ``v`` and a float mask on ``sdpa`` and ``matrix`` with fully masked rows;
``uniform_mean`` against explicit averages for every mask broadcast; the caches' keys (floats only where
``True == 1.0`` could collide; ``-0.0`` and ``0.0`` share entries, a difference of the sign of zero only).
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from diffusionformer import DiffusionAttention
from diffusionformer.functional import diffuse
from diffusionformer.operators import heat, ppr
from diffusionformer.ops import engine
from diffusionformer.ops.dense import choose_dense_backend
from diffusionformer.ops.recompute import recompute_saved
from diffusionformer.ops.triton import backend as triton_backend

CPU = torch.device("cpu")


def _explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, coeffs: list[float],
              mask: torch.Tensor | None = None) -> torch.Tensor:
    """``sum_k c_k P^k v`` in float64 with an explicit ``P = softmax(q k^T / sqrt(C) + mask)`` (a float mask, ``-inf``
    = no key; a zero row where no key is admissible)."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if mask is not None:
        s = s + mask.double()
    P = torch.softmax(s, dim=-1).nan_to_num(0.0)
    out, x = torch.zeros_like(v), v
    for c in coeffs:
        out, x = out + c * x, P @ x
    return out


@pytest.mark.parametrize("helper, args", [
    (engine.static_tensor, (((0.125, 0.625, 0.25),), CPU, torch.float32)),
    (engine._head_columns, (((0, 1, 0.75, -0.5),), 2, CPU, torch.float32)),
    (triton_backend._static_tensor, (((0.375, 0.5, 0.125),), (2,), CPU)),
    (triton_backend._degree_mask, ((1, 3, 2), 4, CPU)),
    (heat._taylor_table, (7, CPU)),
    (ppr._ppr_table, (7, CPU, torch.float32)),
])
def test_bug_device_tensor_caches_keep_fake_and_real_tensors_apart(helper, args):
    """Bug: these caches of device tensors stored the fake tensor built under a ``FakeTensorMode`` (a dry run):
    every later real call got it ("Please convert all Tensors to FakeTensors first" for ever after), and a dry
    run after a real call got the cached real tensor (the same error, in fake mode)."""
    helper.cache_clear()
    real = helper(*args)
    with FakeTensorMode():
        fake = helper(*args)
    again = helper(*args)
    for r, f, a in zip(*(t if isinstance(t, tuple) else (t,) for t in (real, fake, again))):
        assert isinstance(f, FakeTensor) and not isinstance(r, FakeTensor) and not isinstance(a, FakeTensor)
        assert a is r  # the real entry is still cached and still used
    assert helper.cache_info().currsize == 1


@pytest.mark.parametrize("coeffs", [[0.125, 0.625, 0.25], [0.75, -0.5]])  # K-step (static_tensor), affine (columns)
def test_bug_a_dry_run_under_fake_tensor_mode_leaves_real_calls_working(coeffs):
    """Bug: ``diffuse`` with static coefficients under ``FakeTensorMode`` cached a fake coefficient tensor; the same
    call on real tensors afterwards failed ("Please convert all Tensors to FakeTensors first"), and a dry run after
    a real call failed the same way. Each order now works and the real result is the float64 reference."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 3) for _ in range(3))
    want = _explicit(q, k, v, coeffs)
    for _ in range(2):  # real, fake, real, fake
        torch.testing.assert_close(diffuse(q, k, v, coeffs).double(), want, atol=1e-6, rtol=1e-6)
        with FakeTensorMode() as mode:
            out = diffuse(*(mode.from_tensor(t) for t in (q, k, v)), coeffs)
        assert isinstance(out, FakeTensor) and out.shape == v.shape


def test_bug_a_layer_dry_run_under_fake_tensor_mode_leaves_it_working():
    """Bug: a ``FakeTensorMode`` dry run of a layer with Laplacian and learned heat heads (static columns, the heat
    operator's Taylor table) cached fake tensors, and the layer failed on real inputs ever after."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 4, heads="laplacian:2,heat(t=0.5, steps=5, learnable=True):2")
    x = torch.randn(2, 3, 8)
    want = layer(x)
    with FakeTensorMode() as mode:
        fakes = {n: mode.from_tensor(t) for n, t in [*layer.named_parameters(), *layer.named_buffers()]}
        with torch.nn.utils.stateless._reparametrize_module(layer, fakes):
            out = layer(mode.from_tensor(x))
    assert isinstance(out, FakeTensor) and out.shape == x.shape
    torch.testing.assert_close(layer(x), want)


@pytest.mark.parametrize("kwargs", [
    lambda: {"coeffs": torch.tensor([0.5, 0.3, 0.2])},
    lambda: {"coeffs": [0.5, 0.5], "attn_mask": torch.zeros(4, 4)},
])
def test_bug_value_checks_skip_fake_tensors(kwargs):
    """Bug: the value checks of the entry points (finite coefficients, a float mask without NaN) ran on fake CPU
    tensors, which have no values: a dry run of ``diffuse`` failed with ``DataDependentOutputException``."""
    with FakeTensorMode():
        q = torch.randn(1, 2, 4, 4)
        for backend in ("sdpa", "matrix", "auto"):
            out = diffuse(q, q, q, **kwargs(), backend=backend)
            assert isinstance(out, FakeTensor) and out.shape == q.shape


def test_bug_choose_dense_backend_refuses_a_device_with_an_index():
    """Bug: ``choose_dense_backend(1024, 1024, 4, device_type=str(q.device))`` with ``q`` on ``cuda:0`` applied the
    CPU rule silently (``"cuda:0" != "cuda"``) and returned ``"sdpa"`` where the CUDA rule gives ``"matrix"``."""
    assert choose_dense_backend(1024, 1024, 4, device_type="cuda") == "matrix"
    with pytest.raises(ValueError, match=r"device_type must be a device type .* got 'cuda:0' \(use 'cuda'\)"):
        choose_dense_backend(1024, 1024, 4, device_type="cuda:0")


def test_bug_recompute_saved_keeps_a_z_changed_in_place_inside_the_block():
    """Bug: ``z`` changed in place inside ``recompute_saved`` before an operation saved it was still stored as the
    recipe, so the backward pass rebuilt the unchanged ``z``: ``w.grad`` was silently that of ``z`` before the
    change (the saved-tensor hooks bypass autograd's in-place check)."""
    a = torch.randn(3, requires_grad=True)
    w = torch.randn(2, 3, requires_grad=True)
    z = a * 2.0
    with recompute_saved(z, lambda: a.detach() * 2.0):
        z.add_(1.0)
        y = torch.nn.functional.linear(z, w)
    y.sum().backward()
    torch.testing.assert_close(w.grad, (a.detach() * 2.0 + 1.0).expand(2, 3))


def test_bug_recompute_with_an_in_place_pre_hook_on_the_projection_gives_the_plain_gradients():
    """Bug: ``DiffusionAttention(recompute=True)`` with a forward pre-hook on ``out_proj`` that adds to its input in
    place (activation steering) gave a wrong ``out_proj.weight.grad`` on the affine path (Laplacian heads): the
    backward pass rebuilt the combined output without the hook's change."""
    def steer(module, args):
        args[0].add_(0.5)

    grads = []
    for recompute in (False, True):
        torch.manual_seed(0)
        layer = DiffusionAttention(8, 2, heads="attention:1,laplacian:1", recompute=recompute)
        layer.out_proj.register_forward_pre_hook(steer)
        layer(torch.randn(2, 3, 8, requires_grad=True)).square().sum().backward()
        grads.append(layer.out_proj.weight.grad)
    torch.testing.assert_close(grads[1], grads[0], atol=0, rtol=0)


def test_recompute_saved_still_releases_an_unchanged_z():
    """Pins: without an in-place change ``z`` is stored as the recipe (``fn`` runs in the backward pass)."""
    a = torch.randn(3, requires_grad=True)
    w = torch.randn(2, 3, requires_grad=True)
    calls = []

    def fn():
        calls.append(1)
        return a.detach() * 2.0

    z = a * 2.0
    with recompute_saved(z, fn):
        y = torch.nn.functional.linear(z, w)
    y.sum().backward()
    assert calls == [1]
    torch.testing.assert_close(w.grad, (a.detach() * 2.0).expand(2, 3))


@pytest.mark.parametrize("backend", ["sdpa", "matrix", "auto"])
def test_mixed_degrees_with_empty_rows_batch_zero_and_strided_inputs_match_float64(backend):
    """Pins: heads of degree 1, 2 and 0 (static split path and the tensor loop), a float mask with a ``-inf`` row
    and a padded sequence, token-major (non-contiguous) inputs, and an empty batch, against explicit float64."""
    torch.manual_seed(1)
    rows = [[0.0, 1.0, 0.0], [0.2, 0.5, 0.3], [1.0, -1.0, 0.0]]
    degrees = [1, 2, 0]
    for B in (2, 0):
        q, k, v = (torch.randn(B, 5, 3, 4).transpose(1, 2) for _ in range(3))
        mask = torch.randn(B, 1, 5, 5)
        if B:
            mask[0, 0, 2] = float("-inf")
            mask[1, 0, :, :] = float("-inf")
        want = torch.cat([_explicit(q[:, h:h + 1], k[:, h:h + 1], v[:, h:h + 1],
                                    rows[h][:degrees[h] + 1], mask) for h in range(3)], dim=1)
        for coeffs in (rows, torch.tensor(rows)):
            got = diffuse(q, k, v, coeffs, attn_mask=mask, backend=backend, degrees=degrees, is_causal=False)
            torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=2e-6)
