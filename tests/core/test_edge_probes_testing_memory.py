"""Edge probes of the public testing utilities: simulated kills (faults), random inputs (graphs), CPU memory."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from diffusionformer.testing import cpu_allocations, interrupt_on_call, random_qkv


class _Callable:
    def __call__(self, x):
        return x + 1


class _Holder:
    sqrt = math.sqrt  # a builtin: no descriptor, called without ``self`` through an instance
    biggest = functools.partial(max, 0)
    plus_one = _Callable()


@pytest.mark.parametrize("name, arg, want", [("sqrt", 4.0, 2.0), ("biggest", 3, 3), ("plus_one", 1, 2)])
def test_bug_interrupt_on_call_keeps_non_descriptor_callables_unbound(name, arg, want):
    """Bug: a callable class attribute that is no descriptor (a builtin, a ``functools.partial``, an object with
    ``__call__``) was replaced by a plain-function wrapper, so while patched ``instance.name(x)`` passed the
    instance as an extra argument (``TypeError``) instead of calling the original with ``x``."""
    original = vars(_Holder)[name]
    with interrupt_on_call(_Holder, name, 3) as seen:
        assert getattr(_Holder(), name)(arg) == want
        assert getattr(_Holder, name)(arg) == want
        with pytest.raises(KeyboardInterrupt, match=f"simulated kill in {name} \\(call 3\\)"):
            getattr(_Holder(), name)(arg)
        assert seen["calls"] == 3
    assert vars(_Holder)[name] is original and getattr(_Holder(), name)(arg) == want


def test_interrupt_on_call_on_an_instance_with_a_non_descriptor_callable():
    obj = _Holder()
    with interrupt_on_call(obj, "sqrt", 2):
        assert obj.sqrt(9.0) == 3.0
        with pytest.raises(KeyboardInterrupt):
            obj.sqrt(9.0)
    assert vars(obj) == {} and obj.sqrt(16.0) == 4.0


def test_bug_random_qkv_names_a_seed_too_large_for_the_generator():
    """Bug: seed=2**64 passed the check and reached ``manual_seed``, whose ``ValueError: Overflow when unpacking
    long long`` named no argument; the largest valid seed, 2**64 - 1, still works."""
    with pytest.raises(ValueError, match=r"seed must be < 2\*\*64, got 18446744073709551616"):
        random_qkv(1, 1, 1, 1, seed=2**64)
    q, _, _ = random_qkv(1, 1, 1, 1, seed=2**64 - 1)
    assert torch.equal(q, random_qkv(1, 1, 1, 1, seed=np.uint64(2**64 - 1))[0])


def test_random_qkv_leaves_the_global_rng_alone_and_is_deterministic():
    state = torch.get_rng_state()
    a, b = random_qkv(seed=7), random_qkv(seed=7)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    g = torch.Generator().manual_seed(7)
    want = [torch.randn(2, 3, 6, 4, generator=g, dtype=torch.float64) for _ in range(3)]
    assert all(torch.equal(x, y) for x, y in zip(a, want))


def test_cpu_allocations_totals_follow_the_changes_and_frees_inside_count():
    def fn():
        kept = torch.empty(1000, dtype=torch.uint8)
        tmp = torch.empty(4000, dtype=torch.uint8)
        del tmp
        return kept

    _, changes, totals = cpu_allocations(fn)
    assert all(totals[i] - totals[i - 1] == changes[i] for i in range(1, len(changes)))
    assert sum(changes) == 1000  # what the call still holds
    assert max(totals) - (totals[0] - changes[0]) == 5000  # the peak, the freed temporary included
    with pytest.raises(ZeroDivisionError):
        cpu_allocations(lambda: 1 / 0)
    assert not torch.autograd._profiler_enabled()  # the profiler stopped also when fn raised
