"""Mutation audit (sitting 54, helper 54i) of train/rng.py, train/optim.py, train/metrics.py, models/_graph_pe.py,
operators/differential.py, operators/grand.py, ops/reference_rivals.py, graph/interop.py, graph/builders.py and
ops/_checks.py. Each test kills a mutant the earlier tests let live (its docstring names it, "Kills: ...").

109 hand mutants (flipped comparisons, off-by-one bounds, dropped checks, swapped halves or arguments, changed
constants, early returns removed), one at a time, each restored from a cp backup, run against the module's doctests and
the test files that name it (mutation-kill files first; compile / DDP / docs-build files only where a mutant lived
past the others): module mutants / killed before / new kills here / equivalent:
rng.py 12/11/1/0, optim.py 13/13/0/0, metrics.py 12/10/2/0, _graph_pe.py 10/9/0/1, differential.py 10/8/2/0,
grand.py 10/9/1/0, reference_rivals.py 12/10/0/2, interop.py 9/9/0/0, builders.py 10/8/1/1, _checks.py 11/11/0/0;
in all 98 killed before, 7 killed here, 4 equivalent, no bug.

Equivalent:

* reference_rivals.py ``chebyshev_reference`` ``while len(T) < K + 1`` -> ``<=``: one more ``T_k`` is built, and the
  sum over ``k < K + 1`` never reads it.
* reference_rivals.py ``grand_nl_reference`` ``scale=C**-0.5`` dropped: ``dense_attention_reference``'s default scale
  is ``1 / sqrt`` of the width of the queries it gets, ``X[..., :C]``: the same ``C**-0.5``.
* _graph_pe.py ``_RandomWalkPE`` ``sparse = N > 2000`` -> ``N > 20``: the CSR path sums repeated entries as the dense
  ``index_put_(accumulate=True)`` does (the point of the class), so both paths give the same PE up to rounding.
* builders.py ``grid`` (sparse) ``r = math.isqrt(bound)`` for the Euclidean metric -> ``r = bound``: a wider square of
  offsets, whose extra offsets ``_within`` drops (their squared length exceeds ``bound``); only more work.
"""

from __future__ import annotations

import codecs
import json
import random
import warnings

import pytest
import torch
from torch.nn import functional as F

from diffusionformer.graph import GRID_METRICS, grid
from diffusionformer.operators import DifferentialOperator, NonlinearDiffusionOperator
from diffusionformer.ops.rivals import RivalContext
from diffusionformer.train.metrics import MetricsLog, read_metrics
from diffusionformer.train.rng import capture_rng_state, restore_rng_state


def test_grand_nl_at_time_zero_returns_the_values_without_attending():
    """Kills: operators/grand.py ``apply_context`` the ``if self.t == 0.0: return ctx.v`` early return dropped.

    At ``t = 0`` the flow is the identity: the head's output is ``v`` itself, and no attention map is computed (the
    mutant ran ``steps`` RK4 steps of size 0, ``4 K`` attention calls for nothing)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, 2) for _ in range(3))
    ctx = RivalContext.dense(q, k, v)

    def attend(*args, **kwargs):
        raise AssertionError("grand-nl at t=0 attended")

    ctx.attend = attend
    assert NonlinearDiffusionOperator(t=0.0, steps=3, method="rk4").apply_context(ctx) is v


def test_read_metrics_skips_an_editors_byte_order_mark(tmp_path):
    """Kills: train/metrics.py ``_parse_lines`` ``.removeprefix(codecs.BOM_UTF8)`` dropped.

    A log saved by an editor that writes a UTF-8 byte order mark: its first line is still the first record (the
    mutant warned "skipping a malformed metrics line" and lost step 1)."""
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 1, "split": "train", "loss": 0.5}, {"step": 2, "split": "eval", "loss": 0.25}]
    path.write_bytes(codecs.BOM_UTF8 + "".join(json.dumps(r) + "\n" for r in lines).encode())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_metrics(tmp_path) == lines


def test_differential_reset_parameters_resets_the_output_norms_gain():
    """Kills: operators/differential.py ``reset_parameters`` ``self.subln.reset_parameters()`` dropped.

    Its docstring: the four lambda vectors are drawn again and the output RMSNorm's weight goes back to 1."""
    op = DifferentialOperator(head_dim=4)
    with torch.no_grad():
        op.subln.weight.fill_(3.0)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(op, name).fill_(7.0)
    op.reset_parameters()
    assert torch.equal(op.subln.weight, torch.ones(4))
    assert all(bool((getattr(op, n).abs() < 7.0).all()) for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"))


@pytest.mark.parametrize("metric", GRID_METRICS)
@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_grid_takes_an_integer_radius_beyond_the_float_range(metric, layout):
    """Kills: graph/builders.py ``_check_grid`` ``r = float(min(radius, h + w))`` -> ``r = float(radius)``.

    An int radius is any size (``numbers.Integral`` is accepted, only a float inf is refused); no two patches are
    ``h + w`` apart, so ``10**400`` joins every pair, as ``h + w`` does (the mutant: "int too large to convert to
    float")."""
    huge, full = grid(2, 3, 10**400, metric=metric, layout=layout), grid(2, 3, 5, metric=metric, layout=layout)
    if layout == "dense":
        assert torch.equal(huge.dense_allowed(), full.dense_allowed())
    else:
        assert torch.equal(huge.edge_index, full.edge_index)


def test_metrics_log_appends_after_truncate_reach_the_rewritten_file(tmp_path):
    """Kills: train/metrics.py ``MetricsLog.truncate`` ``self.close()`` dropped.

    ``truncate`` replaces the file (``os.replace``): a handle left open from earlier appends points at the replaced
    file, so every record appended after a resume would vanish."""
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in (1, 2):
        log.append({"step": step, "split": "train", "loss": 1.0})
    assert log.truncate(1) == 1
    log.append({"step": 3, "split": "train", "loss": 1.0})
    log.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 3]


def test_restore_rng_state_names_the_missing_torch_state():
    """Kills: train/rng.py ``restore_rng_state`` ``("python", "numpy", "torch")`` -> ``("python", "numpy")``.

    A state without its torch entry is refused up front, naming it (the mutant failed part-way, with a bare
    ``KeyError: 'torch'`` inside the "does not fit" message), and the generators are left as they were."""
    state = capture_rng_state(torch.device("cpu"))
    del state["torch"]
    random.seed(5)
    before = random.random()
    random.seed(5)
    with pytest.raises(ValueError, match=r"expected a state from capture_rng_state, got a dict without \['torch'\]"):
        restore_rng_state(state, torch.device("cpu"))
    assert random.random() == before


def test_differential_normalises_a_bfloat16_head_in_float32():
    """Kills: operators/differential.py ``apply_context`` ``work = torch.float64 if ... else torch.float32`` ->
    ``work = y.dtype``.

    The RMSNorm of a half-precision head runs in float32 (its mean of squares, its gain), cast back once at the end:
    bit for bit the float32 norm of the same ``y``, not a norm rounded to bfloat16 at every step."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 1, 16, 8).to(torch.bfloat16) for _ in range(3))
    op = DifferentialOperator(head_dim=8, depth=3)
    with torch.no_grad():
        op.subln.weight.copy_(torch.linspace(0.5, 1.5, 8))
    ctx = RivalContext.dense(q, k, v)
    got = op.apply_context(ctx)
    lam = op.lambda_full(0).to(torch.bfloat16)
    y = ctx.attend(q[..., :4], k[..., :4], v, scale=0.5) - lam * ctx.attend(q[..., 4:], k[..., 4:], v, scale=0.5)
    want = F.rms_norm(y.float(), (8,), op.subln.weight.float(), 1e-5) * (1.0 - op.init_value(0))
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, want.to(torch.bfloat16))
