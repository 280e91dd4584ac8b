"""Fresh-eyes review of the late-morning changes (helper 53n): ``_powers``/``_Pow`` and its callers."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.operators import build_operator
from diffusionformer.operators.ppr import ppr_coefficients


@pytest.mark.parametrize("steps", [257, 300, 1024])
def test_ppr_coefficients_bfloat16_past_256_steps(steps: int) -> None:
    """Bug: PPR's exponent table ``k = 0 .. K`` was made in alpha's dtype: in bfloat16 (integers exact only up to
    256) ``k = 299`` read as 300, so for ``K > 256`` a bfloat16 PPR (``model.bfloat16()``) raised ``1 - alpha`` to
    wrong powers and gave several terms the "last" weight ``(1 - alpha)^K`` (no factor alpha): at ``K = 300``,
    ``alpha = 0.01`` the weight of ``P^299`` was 0.029 instead of 0.0005 and the weights summed to 0.89, silently."""
    alpha = torch.tensor(0.01, dtype=torch.bfloat16)
    c = ppr_coefficients(alpha, steps)
    assert c.dtype == torch.bfloat16 and c.shape == (steps + 1,)
    # the reference from the same bfloat16 alpha, computed in float64 and rounded once (1 - alpha rounded to bfloat16
    # put the last weight of K = 1024 83% low: test_edge_probes_precision_55)
    a = alpha.double()
    keep = 1 - a
    k = torch.arange(steps + 1, dtype=torch.float64)
    ref = (keep**k * torch.where(k == steps, 1.0, a)).to(torch.bfloat16)
    torch.testing.assert_close(c, ref, rtol=2e-2, atol=0.0)

    op = build_operator("ppr", alpha=0.01, steps=steps, learnable=True).bfloat16()
    weights = op.coefficients()
    assert float(weights.detach().double().sum()) == pytest.approx(1.0, abs=2e-2)
    weights.double().sum().backward()
    assert op.alpha_logit.grad is not None and torch.isfinite(op.alpha_logit.grad).all()
