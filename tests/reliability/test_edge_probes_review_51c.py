"""Review probes of the evening's changes (51c): ``ppr_steps_for_tolerance`` settling its ``K`` on the bound
``PPROperator`` checks, for an ``alpha`` so small that ``1.0 - alpha`` rounds far from (or to) ``1 - alpha``."""

from __future__ import annotations

import contextlib
import signal
import sys

import pytest

from diffusionformer.operators import PPROperator
from diffusionformer.operators.ppr import ppr_steps_for_tolerance


@contextlib.contextmanager
def _deadline(seconds: float):
    """Fail (not hang) a call that runs past ``seconds``: SIGALRM interrupts a pure-Python loop between bytecodes."""
    def _raise(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


needs_alarm = pytest.mark.skipif(sys.platform == "win32" or not hasattr(signal, "setitimer"),
                                 reason="SIGALRM deadline")


@needs_alarm
def test_ppr_steps_for_a_tiny_alpha_ends():
    """Bug: ``ppr_steps_for_tolerance`` settled the logarithm's ``K`` on the float bound ``2.0 * (1.0 - alpha) ** K``
    by stepping ``K`` one at a time; for ``alpha`` below about 6e-17 ``1.0 - alpha`` is 1, the bound stays 2, and with
    a ``tol`` just below 2 (a ``K`` of 56 from the logarithm) the loop never ended: ``PPROperator(alpha=1e-17,
    tol=1.999999999999999)`` (default ``steps=10``, whose refusal names the ``K`` that would do) hung."""
    tol = 1.999999999999999
    with _deadline(5.0):
        assert ppr_steps_for_tolerance(1e-17, tol) == 56  # the logarithm's K, as before the settling
        with pytest.raises(ValueError, match="exceeds tol"):
            PPROperator(alpha=1e-17, tol=tol)


@needs_alarm
def test_ppr_steps_for_a_small_alpha_settles_in_a_few_steps():
    """Bug: from ``log1p(-alpha)`` the settling loop started ``1e-16 / alpha`` (relative) off the ``K`` of the bound
    it checks, ``1.0 - alpha`` being rounded: ``alpha=1e-16`` with ``tol=2 (1 - 2e-7)`` stepped ``K`` down 2e8 times
    (20 s and more) from 2e9 to 1801440031; the start is now the logarithm of the rounded base itself."""
    alpha, tol = 1e-16, 2 * (1 - 2e-7)
    with _deadline(2.0):
        K = ppr_steps_for_tolerance(alpha, tol)
    assert K == 1801440031
    assert 2.0 * (1.0 - alpha) ** K <= tol < 2.0 * (1.0 - alpha) ** (K - 1)  # the smallest K the check passes


@pytest.mark.parametrize("alpha, tol, expected", [(0.95, 0.1, 2), (0.5, 1e-3, 11), (0.2, 1e-4, 45), (1.0, 1e-4, 1)])
def test_ppr_steps_unchanged_for_ordinary_alphas(alpha, tol, expected):
    """The settled ``K`` of ordinary ``alpha`` is the smallest that ``PPROperator``'s check passes."""
    K = ppr_steps_for_tolerance(alpha, tol)
    assert K == expected
    assert 2.0 * (1.0 - alpha) ** K <= tol
    assert K == 1 or 2.0 * (1.0 - alpha) ** (K - 1) > tol
