"""Determinism and reproducibility across the library (edge probes, 42).

Already covered elsewhere: RNG capture/restore round trips and refusals (``tests/train``), exact resume across
task kinds (``test_edge_probes_resume_matrix.py``), the neighbour sampler's worker generators given a worker seed
(``tests/graph/test_edge_probes_neighbors.py``), generation with a generator, the augmentations leaving the global
RNG alone (``tests/ssl``), the engine under ``torch.use_deterministic_algorithms``.

Probed here: every model preset's initialisation from one seed, every head operator with attention dropout (dense
and sparse) run twice, under deterministic algorithms and at 1 vs 2 threads, and the neighbour loader's draws given
a ``generator=`` (shuffle, DataLoader workers) against the caller's global RNG.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from diffusionformer.data.neighbors import neighbor_loader
from diffusionformer.models import create_model, list_models
from diffusionformer.nn.attention import DiffusionAttention
from diffusionformer.operators import list_operators


_WORKER_SCRIPT = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from test_edge_probes_determinism_42 import _graph, _loader_draws
data = _graph()
for kwargs in ({"num_workers": 2}, {"shuffle": True, "num_workers": 2}, {"num_workers": 2, "persistent_workers": True}):
    a, kept_a = _loader_draws(data, 1, **kwargs)
    b, kept_b = _loader_draws(data, 2, **kwargs)
    print(kwargs, a == b, kept_a and kept_b, a[:5] != a[5:])
"""


def _graph(n: int = 40, e: int = 200) -> Data:
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, n, (2, e), generator=g)
    return Data(x=torch.randn(n, 3, generator=g), edge_index=ei, y=torch.zeros(n, dtype=torch.long))


def _loader_draws(data: Data, global_seed: int, **kwargs) -> tuple[list[list[int]], bool]:
    torch.manual_seed(global_seed)
    before = torch.get_rng_state()
    loader = neighbor_loader(data, [3, 2], batch_size=8, generator=torch.Generator().manual_seed(5),
                             force_torch=True, **kwargs)
    draws = [batch.n_id.tolist() for _ in range(2) for batch in loader]  # two epochs
    return draws, torch.equal(before, torch.get_rng_state())


def test_bug_neighbor_loader_with_a_generator_follows_it_not_the_global_rng():
    """Bug: ``neighbor_loader(..., generator=g)`` passed ``g`` to the sampler only. The DataLoader's shuffling and
    its workers' base seed (from which every worker's sampling generator is seeded) were drawn from torch's global
    RNG, so with ``shuffle=True`` or ``num_workers > 0`` the same ``g`` gave other batches after any
    ``torch.manual_seed`` of the caller, and iterating the loader advanced the caller's global RNG; and
    ``generator`` being taken, no DataLoader generator could be passed."""
    data = _graph()
    for kwargs in ({"shuffle": True}, {}):
        a, kept_a = _loader_draws(data, 1, **kwargs)
        b, kept_b = _loader_draws(data, 2, **kwargs)
        assert a == b, kwargs  # the batches follow the generator alone
        assert kept_a and kept_b, kwargs  # the caller's global RNG is not drawn from
        assert a[:5] != a[5:], kwargs  # the second epoch draws afresh
    # shuffled: every epoch is a permutation of the seeds (5 batches of 8), in another order
    draws, _ = _loader_draws(data, 1, shuffle=True)
    epochs = [[s for d in draws[i:i + 5] for s in d[:8]] for i in (0, 5)]
    assert all(sorted(e) == list(range(40)) for e in epochs) and epochs[0] != epochs[1]
    # DataLoader workers (forked): in a fresh interpreter, as tests here do not fork
    out = subprocess.run([sys.executable, "-c", _WORKER_SCRIPT, str(Path(__file__).parent)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3 and all(line.endswith("True True True") for line in lines), out.stdout


def test_bug_neighbor_loader_refuses_a_generator_beside_a_callers_sampler():
    """Bug: ``neighbor_loader(..., neighbor_sampler=own, generator=g)`` used ``own`` as is and dropped ``g`` without
    a word, so the caller believed the batches followed ``g``."""
    from diffusionformer.data.neighbors import TorchNeighborSampler

    data = _graph()
    own = TorchNeighborSampler(data, [2], torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="generator= seeds the sampler this function builds"):
        neighbor_loader(data, [2], batch_size=8, neighbor_sampler=own, generator=torch.Generator().manual_seed(1))
    assert next(iter(neighbor_loader(data, [2], batch_size=8, neighbor_sampler=own))).batch_size == 8


@contextlib.contextmanager
def _torch_mode(deterministic: bool, threads: int):
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.get_num_threads())
    torch.use_deterministic_algorithms(deterministic)
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.set_num_threads(before[2])


def _global_states():
    return torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()


def test_pins_every_preset_initialises_bit_identically_from_one_seed_without_numpy_or_python_draws():
    """Every registered preset: the same ``torch.manual_seed`` gives the same parameters and buffers, a building
    draws nothing from NumPy's or Python's global generator, and another seed gives other weights."""
    for name in list_models():
        built = []
        for seed in (0, 0, 1):
            torch.manual_seed(seed)
            _, np_before, py_before = _global_states()
            model = create_model(name)
            _, np_after, py_after = _global_states()
            assert np.array_equal(np_before, np_after) and py_before == py_after, name
            built.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        first, again, other = built
        assert first.keys() == again.keys(), name
        assert all(torch.equal(first[k], again[k]) for k in first), name
        assert any(not torch.equal(first[k], other[k]) for k in first if first[k].is_floating_point()), name


def _dropout_pass(spec: str, sparse: bool, deterministic: bool, threads: int, dropout_seed: int = 0):
    with _torch_mode(deterministic, threads):
        torch.manual_seed(0)
        layer = DiffusionAttention(16, 2, heads=f"attention:1,{spec}:1", dropout=0.05).double().train()
        x = torch.randn(*((7,) if sparse else (2, 7)), 16, dtype=torch.float64, requires_grad=True)
        torch.manual_seed(dropout_seed)
        if sparse:
            y = layer(x, edge_index=torch.tensor([[0, 1, 2, 3, 4, 5, 0, 2], [1, 2, 3, 4, 5, 6, 3, 5]]))
        else:
            y = layer(x)
        (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)).sum().backward()
        return [y.detach(), x.grad] + [p.grad for p in layer.parameters() if p.grad is not None]


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_pins_every_head_with_dropout_repeats_its_bits_under_deterministic_algorithms_and_any_thread_count(sparse):
    """Every registered operator beside an attention head, attention dropout on, forward and backward in float64:
    the same seed gives the same bits twice, ``torch.use_deterministic_algorithms(True)`` raises nowhere and gives
    the same bits, and two threads agree with one to float64 rounding."""
    for spec in list_operators():
        if spec == "ppr-exact" or (sparse and spec == "heat-exact"):  # refused: dropout above alpha; dense P only
            continue
        ref = _dropout_pass(spec, sparse, False, 1)
        for deterministic, threads in ((False, 1), (True, 1)):
            got = _dropout_pass(spec, sparse, deterministic, threads)
            assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True)), (spec, deterministic)
        got = _dropout_pass(spec, sparse, True, 2)
        for a, b in zip(ref, got, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12, msg=lambda m: f"{spec}: {m}")
        other = _dropout_pass(spec, sparse, False, 1, dropout_seed=1)  # and the dropout masks follow the seed
        assert not torch.equal(other[0], ref[0]), spec
