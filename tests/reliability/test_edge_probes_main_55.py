"""Edge probes of sitting 55 found outside the helpers' rounds (each test failed before its fix)."""

import pytest
import torch

from diffusionformer.analysis import LayerCapture, layer_reports


def test_bug_layer_reports_of_a_capture_with_no_real_token_says_so():
    """Bug: a capture whose mask marks no real token (every token padding) failed inside a spectrum with "s must be
    non-empty, got shape (0,)", naming an argument the user never passed; one real token still measures."""
    states = {0: torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(0)),
              1: torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(1))}
    mask = torch.zeros(2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"capture.mask marks no real token \(all 8 are padding\)"):
        layer_reports(LayerCapture(states=states, mask=mask, labels=torch.tensor([0, 1])))
    mask[1, 0] = True
    reports = layer_reports(LayerCapture(states=states, mask=mask, labels=torch.tensor([0, 1])))
    assert [r.metrics["within_variance"] for r in reports] == [0.0, 0.0]
