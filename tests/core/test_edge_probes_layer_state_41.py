"""Edge probes of a :class:`~diffusionformer.ops.rivals.LayerState` shared by layers whose call raises: the state
is left as the failed call found it, so the layers after it read the depth and first values a clean pass gives
(compared with the same layers run with a fresh state, float64)."""

from __future__ import annotations

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.ops.rivals import LayerState
from diffusionformer.testing import complete_edge_index


def _layers(heads="neutreno:2,differential:2", causal=False):
    torch.manual_seed(0)
    return [DiffusionAttention(16, 4, heads=heads, causal=causal).double().eval() for _ in range(3)]


def test_bug_dense_call_that_raises_after_entering_leaves_the_state_as_it_was():
    """Bug: the dense path entered the state (depth + 1, first values recorded) before its back-end check and its
    computation, so a call that raised there (here a mistyped ``backend``) moved the shared state on: retried, the
    layer ran as layer 2 with the failed call's values as NeuTRENO's v0, and its output differed from a clean pass."""
    a, b, c = _layers()
    x = torch.randn(2, 5, 16, dtype=torch.double)
    clean = LayerState()
    want = c(b(a(x, state=clean), state=clean), state=clean)

    state = LayerState()
    h = a(x, state=state)
    b.backend = "sdpaa"
    with pytest.raises(ValueError, match="backend"):
        b(torch.randn(2, 5, 16, dtype=torch.double), state=state)  # other values: a first layer would record them
    assert state.depth == 1 and torch.equal(state.first_values, clean.first_values)
    b.backend = "auto"
    got = c(b(h, state=state), state=state)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert state.depth == 3


def test_bug_first_layer_that_raises_records_no_values():
    """Bug: a first layer whose call raised left its values in the state as the model's v0 (and depth 1), so the
    retried pass read them instead of its own."""
    (a, *_), state = _layers(), LayerState()
    a.backend = "nope"
    with pytest.raises(ValueError):
        a(torch.randn(1, 4, 16, dtype=torch.double), state=state)
    assert state.depth == 0 and state.first_values is None


def test_bug_sparse_call_that_raises_after_entering_leaves_the_state_as_it_was():
    """Bug: the sparse path entered the state before the edge check, so edges naming a node past N raised with
    the state moved on (depth 1, the failed call's values recorded)."""
    a, *_ = _layers(heads="neutreno:2,attention:2")
    state = LayerState()
    x = torch.randn(5, 16, dtype=torch.double)
    bad = complete_edge_index(5).clone()
    bad[0, 0] = 5  # node 5 of 0..4
    with pytest.raises((ValueError, IndexError)):
        a(x, edge_index=bad, state=state)
    assert state.depth == 0 and state.first_values is None
    a(x, edge_index=complete_edge_index(5), state=state)
    assert state.depth == 1 and state.first_values is not None
