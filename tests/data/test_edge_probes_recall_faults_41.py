"""Edge probes of the associative-recall generator, the simulated kills and the CPU memory helper (probe 41)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from diffusionformer.data.recall import load_assoc_recall, make_assoc_recall
from diffusionformer.testing import cpu_allocations, interrupt_on_call


# ------------------------------------------------------------------------------------------------- faults


class _Sized:
    def __len__(self) -> int:
        return 3


class _Net(torch.nn.Module):
    def forward(self, x):
        return x + 1


@pytest.mark.parametrize("owner, name, call", [
    (_Net(), "__call__", lambda m: m(torch.zeros(1))),
    (_Sized(), "__len__", len),
])
def test_bug_interrupt_on_call_refuses_a_special_method_patched_on_an_instance(owner, name, call):
    """Bug: ``interrupt_on_call(model, "__call__", 1)`` (or ``"__len__"`` of an object) patched the instance's
    ``__dict__``, but ``model(x)`` and ``len(obj)`` look special methods up on the type: the patch was never
    called, no kill came (``seen["calls"]`` stayed 0) and the test meant to check resuming silently checked
    nothing. The call is now refused, naming the class to patch; patching the class kills as documented."""
    with pytest.raises(TypeError, match=r"looked up on the class.*patch the class instead"):
        with interrupt_on_call(owner, name, 1):
            pass
    assert name not in vars(owner)  # nothing left behind
    with interrupt_on_call(type(owner), name, 2) as seen:
        call(owner)
        with pytest.raises(KeyboardInterrupt):
            call(owner)
    assert seen["calls"] == 2
    call(owner)  # restored


def test_pins_interrupt_on_call_kills_a_module_instances_forward_through_its_call():
    """``model(x)`` reaches ``forward`` through the instance: patching the instance kills the chosen call and
    leaves neither the instance nor its class changed."""
    net, other = _Net(), _Net()
    with interrupt_on_call(net, "forward", 2) as seen:
        assert float(net(torch.zeros(1))) == 1.0
        assert float(other(torch.zeros(1))) == 1.0  # another instance is not patched
        with pytest.raises(KeyboardInterrupt, match="call 2"):
            net(torch.zeros(1))
    assert seen["calls"] == 2
    assert "forward" not in vars(net) and float(net(torch.zeros(1))) == 1.0


# ------------------------------------------------------------------------------------------------- memory


def test_pins_cpu_allocations_leaves_no_profiler_running_when_the_call_raises():
    """An exception inside the measured call propagates and stops the profiler: the next measurement works
    (profilers do not nest) and counts its own allocation exactly."""
    def failing():
        torch.empty(64)
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        cpu_allocations(failing)
    assert not torch.autograd._profiler_enabled()
    out, changes, _ = cpu_allocations(lambda: torch.empty(100, dtype=torch.float64).fill_(0.0))
    assert out.shape == (100,) and sum(changes) == 800


# ------------------------------------------------------------------------------------------------- recall


def _numpy_check(x: np.ndarray, y: np.ndarray, P: int, V: int, Q: int) -> None:
    """Every row against the module docstring, position by position, in numpy."""
    N, T = x.shape
    assert T == 2 * P + Q and y.shape == x.shape
    for n in range(N):
        keys, values, queries = x[n, 0:2 * P:2], x[n, 1:2 * P:2], x[n, 2 * P:]
        assert len(np.unique(keys)) == P and keys.min() >= 0 and keys.max() < V // 2
        assert values.min() >= V // 2 and values.max() < V
        assert len(np.unique(queries)) == Q
        assert (y[n, :2 * P] == -100).all()
        for i, q in enumerate(queries):
            (j,) = np.flatnonzero(keys == q)
            assert y[n, 2 * P + i] == values[j]


@pytest.mark.parametrize("N, P, V, Q", [(6, 1, 4, 1), (6, 2, 4, 2), (5, 3, 7, 3), (4, 5, 11, 2), (3, 1, 5, 1)])
def test_pins_recall_rows_follow_the_docstring_at_the_smallest_sizes(N, P, V, Q):
    """Smallest vocabularies (``V = 4``, odd ``V``), ``P = V // 2`` and ``Q = P``: each row checked in numpy; the
    same generator state gives the same data."""
    x, y = make_assoc_recall(N, P, V, torch.Generator().manual_seed(V + Q), num_queries=Q)
    assert x.dtype == y.dtype == torch.int64
    _numpy_check(x.numpy(), y.numpy(), P, V, Q)
    again = make_assoc_recall(N, P, V, torch.Generator().manual_seed(V + Q), num_queries=Q)
    assert torch.equal(again[0], x) and torch.equal(again[1], y)


@pytest.mark.parametrize("arg", ["num_examples", "num_pairs", "vocab_size", "num_queries"])
def test_bug_recall_refuses_a_bool_tensor_as_a_size(arg):
    """Bug: a Python ``True`` and a ``np.True_`` were refused as sizes ("must be an int") but a 0-d bool tensor,
    whose ``__index__`` gives 1, was taken as 1: ``make_assoc_recall(torch.tensor(True), ...)`` made one example,
    ``num_pairs=torch.tensor(True)`` one pair, ``num_queries=torch.tensor(True)`` one query, silently (the
    docstring of ``_as_count``: "anything else, bool included, is a TypeError")."""
    sizes = dict(num_examples=3, num_pairs=2, vocab_size=8, num_queries=1)
    sizes[arg] = torch.tensor(True)
    with pytest.raises((TypeError, ValueError), match=f"{arg} must be an int"):
        make_assoc_recall(sizes["num_examples"], sizes["num_pairs"], sizes["vocab_size"],
                          torch.Generator().manual_seed(0), num_queries=sizes["num_queries"])
    with pytest.raises((TypeError, ValueError), match=f"{arg} must be an int"):
        load_assoc_recall(**{**dict(num_examples=20, num_pairs=2, vocab_size=8), arg: torch.tensor(True)})
    # an int tensor of any integer dtype is still the int it equals
    sizes[arg] = torch.tensor(1 if arg == "num_queries" else 8 if arg == "vocab_size" else 2, dtype=torch.uint8)
    x, _ = make_assoc_recall(sizes["num_examples"], sizes["num_pairs"], sizes["vocab_size"],
                             torch.Generator().manual_seed(0), num_queries=sizes["num_queries"])
    assert x.dtype == torch.int64 and x.shape[1] == 2 * int(sizes["num_pairs"]) + int(sizes["num_queries"])
