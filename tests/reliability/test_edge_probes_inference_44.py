"""Edge probes: serving a model under ``torch.inference_mode`` and then training it again.

A served model is moved or cast (``model.to(device)``, ``model.float()``), given a checkpoint
(``load_state_dict``) or called for the first time inside ``torch.inference_mode()``; stock torch
modules keep their parameters and buffers normal tensors there whenever the cast changes nothing,
and a copy into them stays a normal tensor. The operators' own rebuilt caches (fixed coefficients,
fixed constants, the Chebyshev basis) and the parameters a layer binds lazily must do the same, or
a later training step or ``load_state_dict`` is refused.
"""

from __future__ import annotations

import copy
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators import build_operator
from diffusionformer.operators.differential import DifferentialOperator


def _grads(layer: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    layer.zero_grad(set_to_none=True)
    y = layer(x)
    y.square().sum().backward()
    return y.detach(), {n: p.grad for n, p in layer.named_parameters()}


def _inference_tensors(module: torch.nn.Module) -> list[str]:
    return [n for n, t in (*module.named_parameters(), *module.named_buffers()) if t.is_inference()]


@pytest.mark.parametrize("cast", ["to", "double"])
def test_bug_chebyshev_basis_rebuilt_by_a_cast_under_inference_mode_still_trains(cast):
    """Bug: ``PolynomialOperator._apply`` rebuilt the Chebyshev basis ``_basis`` at every cast, also a cast that
    changes nothing (``model.to("cpu")`` of a CPU model, ``model.double()`` of a float64 one) made inside
    ``torch.inference_mode()`` while serving: the basis became an inference tensor and every later training step
    failed in ``coefficients()`` with "Inference tensors cannot be saved for backward" (stock modules keep their
    tensors). Now the gradients equal those of the same layer that never saw inference mode (float64, exact)."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads="polynomial(steps=3, basis='chebyshev'):1,attention:1").double()
    fresh = copy.deepcopy(layer)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.inference_mode():
        layer.to("cpu") if cast == "to" else layer.double()
        layer(x)
    y, grads = _grads(layer, x)  # raised
    y_ref, grads_ref = _grads(fresh, x)
    assert torch.equal(y, y_ref)
    assert grads.keys() == grads_ref.keys()
    for name in grads_ref:
        assert grads[name] is not None and torch.equal(grads[name], grads_ref[name]), name
    assert _inference_tensors(layer) == []


@pytest.mark.parametrize("spec", ["heat", "ppr", "heat-exact", "attnscale(learnable=False)"])
@pytest.mark.parametrize("prep", ["to", "load"])
def test_bug_fixed_constants_rebuilt_under_inference_mode_take_a_later_load_state_dict(spec, prep):
    """Bug: ``DiffusionOperator._apply`` and ``_restore_constants`` rebuilt the fixed constants (heat's and
    heat-exact's ``t``, PPR's ``_alpha``, a fixed AttnScale's ``omega``) and the fixed coefficients ``_c`` as new
    tensors; under ``torch.inference_mode()`` (a served model moved with ``.to`` or given a checkpoint with
    ``load_state_dict``) they were inference tensors, so the next ``load_state_dict`` outside inference mode
    (resuming training from a checkpoint) failed with "Inplace update to inference tensor outside InferenceMode is
    not allowed", where a stock module loads. Now the constants stay normal tensors and load as before."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads=spec)
    state = copy.deepcopy(layer.state_dict())
    with torch.inference_mode():
        if prep == "to":
            layer.to("cpu")
        else:
            layer.load_state_dict(state)
    layer.load_state_dict(state)  # raised
    for name, value in state.items():
        assert torch.equal(layer.state_dict()[name], value), name
    assert _inference_tensors(layer) == []


def test_bug_operator_bound_by_a_first_call_under_inference_mode_gets_trainable_parameters():
    """Bug: a layer binds an operator that needs the head width (differential attention's ``lambda_*`` and
    ``subln``) when it first plans with it; an operator put into ``layer.operators`` and first used by a call
    under ``torch.inference_mode()`` got its new parameters as inference tensors, and the next training step
    failed with "Inference tensors cannot be saved for backward" (and an optimizer could not update them).
    Now the gradients equal those of the same layer bound outside inference mode (float64, exact)."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads="attention:1,heat:1").double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    layer.operators[0] = build_operator("differential", num_heads=1)
    fresh = copy.deepcopy(layer)
    torch.manual_seed(1)  # bind draws the lambdas: the same draws for both layers
    with torch.inference_mode():
        served = layer(x)
    torch.manual_seed(1)
    with torch.no_grad():
        assert torch.equal(fresh(x), served)
    y, grads = _grads(layer, x)  # raised
    y_ref, grads_ref = _grads(fresh, x)
    assert torch.equal(y, y_ref)
    assert grads.keys() == grads_ref.keys() and any("lambda" in n for n in grads)
    for name in grads_ref:
        assert grads[name] is not None and torch.equal(grads[name], grads_ref[name]), name
    torch.optim.SGD(layer.parameters(), lr=0.1).step()  # the parameters can be updated outside inference mode
    assert _inference_tensors(layer) == []


class _PausingDifferential(DifferentialOperator):
    """Differential attention that pauses its first bind between setting ``head_dim`` and making ``lambda_q1``."""

    def __setattr__(self, name, value):
        if name == "lambda_q1" and not _PAUSE["entered"].is_set():
            _PAUSE["entered"].set()
            _PAUSE["other_done"].wait(timeout=2.0)  # the other call runs now, if it is not held back
        super().__setattr__(name, value)


_PAUSE: dict[str, threading.Event] = {}


def test_bug_threads_calling_a_layer_whose_operators_were_replaced_share_one_complete_plan():
    """Bug: a layer remakes its plan (and binds new operators) on the first call after ``layer.operators[i]`` was
    replaced; two eval calls from two threads both remade it, and the second, finding differential attention's
    ``head_dim`` already set by the first thread's unfinished ``bind``, ran before its ``lambda_*`` parameters
    existed: "AttributeError: 'DifferentialOperator' object has no attribute 'lambda_q1'" in one serving thread.
    Now one thread makes the plan while the others wait for it, and both calls equal the serial calls."""
    _PAUSE.update(entered=threading.Event(), other_done=threading.Event())
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 4, heads="attention:2,heat:2").double().eval()
    layer.operators[0] = _PausingDifferential(num_heads=2)
    xs = [torch.randn(2, 5, 8, dtype=torch.float64), torch.randn(3, 7, 8, dtype=torch.float64)]

    def first():
        with torch.no_grad():
            return layer(xs[0])

    def second():
        _PAUSE["entered"].wait(timeout=10.0)
        try:
            with torch.no_grad():
                return layer(xs[1])
        finally:
            _PAUSE["other_done"].set()

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(first), pool.submit(second)]
        results = [f.result() for f in futures]  # raised AttributeError
    assert _PAUSE["entered"].is_set()
    with torch.no_grad():
        for x, got in zip(xs, results):
            assert torch.equal(got, layer(x))
