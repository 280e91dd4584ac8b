"""Review of sitting 56's commits (load_dataset's Python numbers, result files read back, sparse value checks through
``checks_values``) and kills of live mutants of ``tables.format_status``.

* ``diffuse_sparse(..., backend="csr")`` while :func:`~torch.fx.experimental.proxy_tensor.make_fx` traces the call
  failed deep in the CSR kernels ("Sparse CSR tensors do not have strides"; before the sortedness test went through
  ``checks_values``, "trying to get value out of a tracing tensor"), while ``"auto"`` takes the gather-scatter path
  there and an explicit ``"csr"`` is refused by name inside ``torch.func`` transforms and on meta or fake tensors.
* ``load_dataset`` handed a loader an option whose default is ``None`` as the numpy number given
  (``limit=np.int64(3)``), where the tutorial promises Python numbers (``torch.Generator().manual_seed`` refuses one).
* ``format_status``: a completed run stopped before its ``max_steps`` (early stopping) is timed per step it did; a
  run made with another config is charged a full ``max_steps`` whatever step it reached, and is not counted among
  the completed runs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from diffusionformer.data import ClassificationData, load_dataset, register_dataset, unregister_dataset
from diffusionformer.experiments.tables import format_status
from diffusionformer.functional import diffuse_sparse


@pytest.fixture
def review56_loader():
    seen: dict[str, object] = {}

    @register_dataset("review56", kind="image")
    def _load(*, seed, limit=None, scale=None):
        seen.update(limit=limit, scale=scale)
        g = torch.Generator().manual_seed(seed if limit is None else limit)  # refuses a numpy int
        x = torch.randn(4, 1, 2, 2, generator=g)
        y = torch.tensor([0, 1, 0, 1])
        return ClassificationData("review56", "image", x, y, x, y, x, y, num_classes=2, input_shape=(1, 2, 2))

    yield seen
    unregister_dataset("review56")


def test_bug_numpy_options_with_a_none_default_reach_a_loader_as_python_numbers(review56_loader):
    """Bug: an option whose default is ``None`` (``limit: int | None = None``, as the MNIST and CIFAR-10 loaders
    have) was passed on as the numpy number given (a sweep grid's ``np.int64``), so a loader seeding a generator with
    it failed with torch's bare "an integer is required"; the options with a number default reached it as Python
    numbers, as the tutorial says of every option."""
    data = load_dataset("review56", limit=np.int64(3), scale=np.float32(0.5))
    assert type(review56_loader["limit"]) is int and review56_loader["limit"] == 3
    assert type(review56_loader["scale"]) is float and review56_loader["scale"] == 0.5
    assert torch.equal(data.x_train, load_dataset("review56", limit=3).x_train)


def _sparse_inputs():
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 2, 3) for _ in range(3))
    edge_index = torch.tensor([[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 1, 2]])
    return q, k, v, edge_index


@pytest.mark.parametrize("is_causal", [False, True])
def test_bug_csr_backend_under_make_fx_is_refused_by_name(is_causal):
    """Bug: an explicit ``backend="csr"`` under ``make_fx`` ran into the CSR kernels and failed with torch's
    "Sparse CSR tensors do not have strides", naming neither the back-end nor the remedy."""
    q, k, v, edge_index = _sparse_inputs()

    def f(q, k, v, e, backend):
        return diffuse_sparse(q, k, v, e, [[0.5, 0.3, 0.2]] * 2, backend=backend, is_causal=is_causal)

    with pytest.raises(ValueError, match=r"backend='csr' cannot run while make_fx traces.*'auto' or 'native'"):
        make_fx(lambda *a: f(*a, "csr"))(q, k, v, edge_index)
    # the remedy the message names traces and replays to the eager CSR result
    traced = make_fx(lambda *a: f(*a, "auto"))(q, k, v, edge_index)
    torch.testing.assert_close(traced(q, k, v, edge_index), f(q, k, v, edge_index, "csr"))


_BASE = {"task": "t", "operator": "attention", "holder": None, "resumes_from": None, "changed": None}


def test_kills_status_times_an_early_stopped_run_per_step_it_did():
    """kills: tables.py ``format_status`` ``r["elapsed"] / max(r["step"], 1)`` -> ``/ max(r["max_steps"], 1)``. A
    completed run stopped at step 4 of 10 in 240 s took 60 s a step (not 24): the run not started yet has 10 steps,
    600 s = 10 min, left (the mutant said 4 min)."""
    rows = [
        {**_BASE, "seed": 0, "state": "completed", "step": 4, "max_steps": 10, "elapsed": 240.0},
        {**_BASE, "seed": 1, "state": "interrupted", "step": 0, "max_steps": 10, "elapsed": None, "resumes_from": 0},
    ]
    first = format_status(rows).splitlines()[0]
    assert first == "1 of 2 runs completed; about 10 min of training left on one worker.", first


def test_kills_status_charges_a_changed_run_full_steps_and_does_not_count_it_completed():
    """kills: tables.py ``format_status`` ``per_step * (r["max_steps"] if r.get("changed") else ...)`` -> the
    remaining steps for every run, and ``done = sum(r["state"] == "completed" and not r.get("changed") ...)`` ->
    without ``not r.get("changed")``. At 60 s a step, the changed run stopped at step 4 and the changed completed one
    at step 10 are both redone from step 0 by ``run --restart``: 2 x 10 x 60 s = 20 min (the first mutant charged
    6 + 0 steps, 6 min); only the unchanged run is completed (the second mutant said 2 of 3)."""
    rows = [
        {**_BASE, "seed": 0, "state": "completed", "step": 10, "max_steps": 10, "elapsed": 600.0},
        {**_BASE, "seed": 1, "state": "interrupted", "step": 4, "max_steps": 10, "elapsed": None, "resumes_from": 4,
         "changed": "train (lr)"},
        {**_BASE, "seed": 2, "state": "completed", "step": 10, "max_steps": 10, "elapsed": 600.0,
         "changed": "train (lr)"},
    ]
    lines = format_status(rows).splitlines()
    assert lines[0] == "1 of 3 runs completed; about 20 min of training left on one worker.", lines[0]
    assert lines[1].startswith("2 run(s) were made with another config than this one"), lines[1]
