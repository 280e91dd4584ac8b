"""Shared fixtures of the benchmark-script tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """The scripts' ``main`` sets ``torch.set_num_threads(--threads)``: give the rest of the session its count back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)
