"""Edge-case probes of reduced-precision training (helper 55l): a user training in bfloat16/float16 on the CPU.

Probed against float64 references, with tolerances from the dtype's epsilon ``eps`` (bfloat16 2**-7, float16
2**-10; outputs and gradients compared as ``max |x - x64| / max |x64|``): every registered operator's layer in
bf16/fp16 (cast models and autocast of float32 ones; dense auto/sdpa/matrix, causal or not; sparse native/csr)
forward and backward, large ``K`` (``heat(t=1, steps=32)``, ``ppr(alpha=0.1, steps=50)``, Euler heat): outputs
and input gradients within ``2 eps``, parameter gradients within ``4 eps`` (graph max pooling: ties of rounded
values broken elsewhere); learned operator parameters and their gradients float32 under autocast;
``recompute=True`` under autocast bit-identical to ``recompute=False``; KV-cache decoding of a ``DiffusionGPT`` in
bf16/fp16 (every operator, rivals included) within ``1 eps`` of the full forward in the same precision; graph
transformers (pooling, global attention, edge features, PE) cast to half; the learned coefficients of a
half-precision operator (float32, within the rounding of the half-precision parameter itself).

Found and fixed (tests whose docstring starts with "Bug:"):

* ``ppr_coefficients`` of a half-precision ``alpha`` computed ``1 - alpha`` and its powers in that precision: the
  rounding of ``1 - alpha`` (bfloat16 keeps 8 bits) grew ``K``-fold, so the weights of ``alpha = 0.01, K = 100``
  summed to 0.90 in bfloat16 (1.015 in float16) instead of one, and differed by up to 16% from those
  ``PPROperator`` computes for the same ``alpha`` (in float64). They are now computed in float32 at least and
  rounded to ``alpha``'s dtype once.
* ``layer_reports`` of a capture of a bfloat16 model (cast, or under autocast) fitted ``power_law_alpha`` over every
  singular value above ``1e-6`` of the largest, bfloat16's rounding noise included: the exact zeros of a rank-20
  ViT embedding read about ``1e-3``, and the exponent was 5.7 instead of float64's 2.1. ``capture_dataset`` now
  records the half precision in ``extra["precision"]`` and the spectra count ranks above that precision's epsilon.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.analysis import capture_dataset, layer_reports, power_law_exponent
from diffusionformer.models import DiffusionViT, ViTConfig
from diffusionformer.operators import build_operator
from diffusionformer.operators.ppr import ppr_coefficients


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("alpha", "steps"), [(0.01, 100), (0.05, 50), (0.1, 50), (0.01, 300)])
def test_bug_ppr_coefficients_of_a_half_alpha_are_its_float64_weights_rounded_once(dtype, alpha, steps):
    """Bug: ``ppr_coefficients(alpha, K)`` of a bfloat16 ``alpha = 0.01`` gave weights summing to 0.90 at
    ``K = 100`` (float16: 1.015), not one as documented: ``1 - alpha`` was rounded to the half precision and
    raised to the ``K``-th power there. Bound: each weight within one rounding of the float64 weight of the same
    ``alpha`` value (relative ``eps``, plus one float32 rounding per power), so the sum within ``eps`` of one."""
    eps = torch.finfo(dtype).eps
    a = torch.tensor(alpha, dtype=dtype)
    c = ppr_coefficients(a, steps)
    assert c.dtype == dtype and c.shape == (steps + 1,)
    ref = ppr_coefficients(a.double(), steps)  # the same alpha value, float64 throughout
    torch.testing.assert_close(c.double(), ref, rtol=eps, atol=0.0)
    assert abs(float(c.double().sum()) - 1.0) <= eps
    # a half-precision operator's weights (computed from its alpha in float64) are the function's of that alpha
    op = build_operator("ppr", alpha=alpha, steps=steps, learnable=True).to(dtype)
    op_alpha = op.alpha.detach()
    assert op_alpha.dtype == dtype
    torch.testing.assert_close(ppr_coefficients(op_alpha, steps).double(), op.coefficients().detach().double(),
                               rtol=eps, atol=0.0)


def test_ppr_coefficients_of_a_half_alpha_keep_their_gradient():
    """Bug (same cause): the gradient in a bfloat16 ``alpha = 0.05`` of ``K = 50`` weights was 2% off float64's (the
    powers of a rounded ``1 - alpha``). It flows through the float32 computation, comes back in ``alpha``'s dtype and
    matches float64's within two roundings of it (``2 eps``)."""
    a = torch.tensor([0.05, 0.2], dtype=torch.bfloat16, requires_grad=True)
    w = torch.linspace(-1.0, 1.0, 51)
    (ppr_coefficients(a, 50).float() * w).sum().backward()
    a64 = a.detach().double().requires_grad_()
    (ppr_coefficients(a64, 50) * w.double()).sum().backward()
    assert a.grad.dtype == torch.bfloat16
    torch.testing.assert_close(a.grad.double(), a64.grad, rtol=2 * torch.finfo(torch.bfloat16).eps, atol=0.0)


def test_ppr_coefficients_of_float32_and_float64_alpha_unchanged():
    """Float32 and float64 ``alpha`` keep their own dtype and values (the documented example)."""
    c = ppr_coefficients(torch.tensor(0.5), 2)
    assert c.dtype == torch.float32 and c.tolist() == [0.5, 0.25, 0.25]
    a = torch.tensor(0.1, dtype=torch.float64)
    k = torch.arange(51, dtype=torch.float64)
    ref = torch.where(k == 50, 1.0, a) * (1 - a) ** k
    torch.testing.assert_close(ppr_coefficients(a, 50), ref, rtol=1e-14, atol=0.0)


def _vit_captures():
    torch.manual_seed(0)
    cfg = ViTConfig(input_size=(8, 8), in_channels=1, patch_size=4, num_classes=3, dim=32, depth=2, num_heads=4,
                    heads="attention:2,heat(t=1.0, steps=8):2")
    model = DiffusionViT(cfg).double().eval()
    x, y = torch.randn(24, 1, 8, 8, dtype=torch.float64), torch.randint(0, 3, (24,))
    ref = capture_dataset(model, [(x, y)])
    cast = capture_dataset(model.to(torch.bfloat16), [(x.to(torch.bfloat16), y)])
    model.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = capture_dataset(model, [(x.float(), y)])
    return ref, cast, auto


def test_bug_layer_reports_of_a_bfloat16_capture_fit_no_rounding_noise():
    """Bug: the embedding layer of this ViT has rank 20 of 32 (12 singular values ~1e-16 of the largest in float64);
    captured from the bfloat16 model they read ~1e-3 (its rounding), above the fixed rank cut ``1e-6``, and
    ``power_law_alpha`` was fitted over them: 5.7 (autocast: 6.0) against float64's 2.1. Bound: above
    ``eps = 2**-7`` of the largest singular value the half-precision spectra are float64's to about ``eps``, so on
    every layer the exponent is float64's fit over those same ranks (the ranks that bfloat16 resolves) within 10%
    (a log-log slope over ~20 ranks)."""
    ref, cast, auto = _vit_captures()
    assert "precision" not in ref.extra
    assert cast.extra["precision"] == "bfloat16" and auto.extra["precision"] == "bfloat16"
    assert cast.states[0].dtype == torch.float32
    eps = torch.finfo(torch.bfloat16).eps
    for report in layer_reports(ref):
        s = report.singular_values
        want = float(power_law_exponent(s, start=1, stop=int((s > eps * s[0]).sum())))
        for cap in (cast, auto):
            got = layer_reports(cap)[cap.layers.index(report.layer)].metrics["power_law_alpha"]
            assert got == pytest.approx(want, rel=0.1), (report.layer, got, want)


def test_float32_captures_keep_the_fixed_rank_cut():
    """A float32 capture outside autocast records no precision, and its report is what it was (rank cut 1e-6)."""
    torch.manual_seed(0)
    model = DiffusionViT(ViTConfig(input_size=(8, 8), in_channels=1, patch_size=4, num_classes=3, dim=16, depth=1,
                                   num_heads=2)).eval()
    x = torch.randn(6, 1, 8, 8)
    cap = capture_dataset(model, [x])
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        again = capture_dataset(model, [x])
    assert "precision" not in cap.extra and "precision" not in again.extra
