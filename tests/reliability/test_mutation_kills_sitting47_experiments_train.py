"""Mutation audit (sitting 47) of experiments/tables.py, experiments/outputs.py, experiments/reload.py,
experiments/build.py, train/distributed.py, train/rng.py and train/schedule.py: tests that kill mutants the earlier
tests left alive (each docstring names the mutant). No GPU is used.

64 mutants (tables.py 10, outputs.py 9, reload.py 8, build.py 9, distributed.py 9, rng.py 11, schedule.py 8):
50 killed by earlier tests, 12 survivors killed here, 2 equivalent:

* build.py ``_check_data_overrides`` ``value >= sizes[key]`` -> ``value > sizes[key]``: a vocab_size equal to the
  data's falls through to ``_same(value, sizes[key])``, which allows an equal value anyway.
* outputs.py ``_other_finished_rows`` ``and not isinstance(r.seed, bool)`` dropped: ``_row`` has already dropped a
  row whose seed is not an int or is a bool (``results._row_problem``), so no bool seed reaches the check.
"""

from __future__ import annotations

import math
import random
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist

from diffusionformer.experiments.outputs import _row, merged_manifest
from diffusionformer.experiments.reload import _build_in_saved_dtype, _check_summary_step, _runs_below
from diffusionformer.experiments.tables import _contrast_cells, aggregate, format_status
from diffusionformer.train import distributed
from diffusionformer.train.distributed import DistContext, shard_batch
from diffusionformer.train.rng import seed_everything
from diffusionformer.train.schedule import cosine_lr


def test_kills_cosine_lr_decay_before_warmup_accepted():
    """kills: train/schedule.py ``cosine_lr`` ``if not decay_steps >= warmup_steps:`` -> ``if not decay_steps >=
    warmup_steps - 1:`` (decay_steps = warmup_steps - 1, against the documented ``D >= W``, gave a schedule that
    jumps from the warm-up straight to the floor, without a word)."""
    with pytest.raises(ValueError, match=r"decay_steps >= warmup_steps \(3\), got 2"):
        cosine_lr(0, lr=1.0, min_lr=0.0, warmup_steps=3, decay_steps=2)
    # the boundary D = W is allowed (documented): warm-up, then the floor
    assert [cosine_lr(s, lr=1.0, min_lr=0.0, warmup_steps=3, decay_steps=3) for s in range(5)] == \
        [0.25, 0.5, 0.75, 0.0, 0.0]


def test_kills_seed_everything_folding_large_seeds():
    """kills: train/rng.py ``seed_everything`` ``seed = int(seed)`` -> ``seed = int(seed) % 2**31`` (a seed in
    [2**31, 2**32), which it documents as valid, seeded the streams of another seed). Checked against each
    library's own seeding: ``random.Random(s)``, ``np.random.RandomState(s)`` and ``torch.Generator().manual_seed(s)``."""
    s = 2**31 + 7
    seed_everything(s)
    got = (random.random(), np.random.random_sample(), torch.rand(3))
    g = torch.Generator().manual_seed(s)
    assert got[0] == random.Random(s).random()
    assert got[1] == np.random.RandomState(s).random_sample()
    assert torch.equal(got[2], torch.rand(3, generator=g))


def test_kills_shard_batch_empty_tensor_beside_a_batch():
    """kills: train/distributed.py ``shard_batch`` ``if len({shape[0] for shape in shapes.values() if shape[0]}) >
    1`` -> ``... for shape in shapes.values()}) > 1`` (an empty tensor, which splits into empty ones, beside (B, ...)
    tensors was refused as a batch of two first sizes)."""
    batch = {"x": torch.arange(4), "none": torch.empty(0, 3)}
    got = shard_batch(batch, rank=1, world_size=2)
    assert torch.equal(got["x"], torch.tensor([2, 3]))
    assert got["none"].shape == (0, 3)


def test_kills_raise_on_every_rank_names_the_lowest_failing_rank(monkeypatch):
    """kills: train/distributed.py ``_raise_on_every_rank`` ``rank = min(causes)`` -> ``rank = max(causes)`` (with
    ranks 1 and 2 of 3 failing, rank 0's error named rank 2's cause; the lowest failing rank is the one every
    rank's message names alike). A real ``HashStore`` stands for the group's store; no process group."""
    store = dist.HashStore()
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: store)
    monkeypatch.setattr(distributed, "_agreements", iter([5]))
    monkeypatch.setattr(DistContext, "barrier", lambda self: None)
    store.set("diffusionformer/failed/5/2", "OSError: disk full")
    store.set("diffusionformer/failed/5/1", "ValueError: bad row")
    ctx = DistContext(0, 3, 0, torch.device("cpu"))
    with pytest.raises(RuntimeError, match=r"writing the summary failed on rank 1 \(ValueError: bad row\); rank 0"):
        distributed._raise_on_every_rank(ctx, None, "writing the summary")


def test_kills_merged_manifest_counting_a_bool_world_size():
    """kills: experiments/outputs.py ``_merged`` ``isinstance(c, kind) and not isinstance(c, bool) and c not in
    seen`` -> ``isinstance(c, kind) and c not in seen`` (a hand-edited manifest's ``world_sizes: [true, 2]`` listed
    ``True`` as a number of processes, and hid this invocation's 1, equal to it)."""
    got = merged_manifest({"world_sizes": [True, 2]}, {"world_size": 1})
    assert got["world_sizes"] == [2, 1]


@pytest.mark.parametrize("summary", [{"status": "completed", "step": 3},
                                     {"status": "interrupted", "last_checkpoint_step": 3}])
def test_kills_load_run_summary_of_an_earlier_step_is_named(summary):
    """kills: experiments/reload.py ``_check_summary_step`` ``said != step`` -> ``said > step`` (a summary.json of an
    earlier step than the checkpoint, an older summary beside a newer checkpoint, described other weights than
    run.model without the warning)."""
    with pytest.warns(UserWarning, match=r"reports step 3 .* holds step 5"):
        _check_summary_step(summary, 5, Path("summary.json"), Path("checkpoint.pt"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check_summary_step(summary, 3, Path("summary.json"), Path("checkpoint.pt"))


def test_kills_holm_p_bold_at_exactly_the_level():
    """kills: experiments/tables.py ``_contrast_cells`` ``c.p_holm < 0.05`` -> ``c.p_holm <= 0.05`` (a Holm p of
    exactly 0.05, not significant at the 5% level, was marked bold: the tables bold it only below 0.05)."""
    diff = SimpleNamespace(mean=0.1, low=None, high=None, df=3.0, p=0.01, p_wilcoxon=0.1)
    at = _contrast_cells(SimpleNamespace(p_holm=0.05, diff=diff), 4, True)
    below = _contrast_cells(SimpleNamespace(p_holm=0.0499, diff=diff), 4, True)
    assert "**" not in at[-1] and below[-1] == "**0.0499**", (at, below)


def test_kills_status_estimate_of_changed_and_early_stopped_runs():
    """kills: experiments/tables.py ``format_status`` ``per_step * (r["max_steps"] if r.get("changed") else
    max(...))`` -> ``per_step * max(r["max_steps"] - done_steps, 0)`` (a finished run made with another definition,
    which ``run --restart`` redoes from step 0, counted no time left), and ``r["elapsed"] / max(r["step"], 1)`` ->
    ``/ max(r["max_steps"] or 1, 1)`` (a run that finished before its max_steps, early-stopped, was timed per planned
    step, not per step done). By hand: per step 600 / 5 = 1200 / 10 = 120 s; left (10 - 4) * 120 for the interrupted
    run + 10 * 120 for the changed one = 1920 s = 32 min."""
    base = dict(task="t", operator="a", holder=None)
    rows = [
        {**base, "seed": 0, "state": "completed", "step": 5, "max_steps": 10, "elapsed": 600.0},
        {**base, "seed": 1, "state": "interrupted", "step": 4, "max_steps": 10, "elapsed": None, "resumes_from": 4},
        {**base, "seed": 2, "state": "completed", "step": 10, "max_steps": 10, "elapsed": 1200.0, "changed": "lr"},
    ]
    first = format_status(rows).splitlines()[0]
    assert first == "1 of 3 runs completed; about 32 min of training left on one worker.", first


def test_kills_runs_below_ellipsis_only_past_the_limit(tmp_path):
    """kills: experiments/reload.py ``_runs_below`` ``" ..." if len(found) > limit`` -> ``>= limit`` (exactly
    ``limit`` run directories, all named, were said to have more after them)."""
    for seed in range(3):
        rdir = tmp_path / "runs" / "t" / "a" / f"seed{seed}"
        rdir.mkdir(parents=True)
        (rdir / "run_config.json").write_text("{}")
    assert _runs_below(tmp_path, limit=3).endswith(f"{tmp_path / 'runs' / 't' / 'a' / 'seed2'}?)")
    assert _runs_below(tmp_path, limit=2).endswith(f"{tmp_path / 'runs' / 't' / 'a' / 'seed1'} ...?)")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kills_build_in_saved_dtype_only_float32_or_float64(dtype):
    """kills: experiments/reload.py ``_build_in_saved_dtype`` ``len(saved) != 1 or not saved <= {torch.float32,
    torch.float64} or ...`` -> ``len(saved) != 1 or ...`` (a checkpoint of half-precision parameters came back as a
    half-precision model, against the documented float32 or float64: the weights load into the default dtype)."""
    state = {"weight": torch.ones(3, 2, dtype=dtype), "bias": torch.zeros(3, dtype=dtype)}
    model = _build_in_saved_dtype(lambda config: torch.nn.Linear(2, 3), None, state)
    assert {p.dtype for p in model.parameters()} == {torch.get_default_dtype()}
    state64 = {k: v.double() for k, v in state.items()}
    assert {p.dtype for p in _build_in_saved_dtype(lambda c: torch.nn.Linear(2, 3), None, state64).parameters()} \
        == {torch.float64}


def test_kills_results_row_null_metric_read_back_as_nan():
    """kills: experiments/outputs.py ``_row`` ``row.value = math.nan`` dropped (a completed run's NaN metric, written
    as null in strict JSON, was read back from results.json as None: as if the run had no evaluation, no longer
    counted as non-finite in the kept rows' table)."""
    data = {"task": "t", "operator": "a", "seed": 0, "status": "completed", "metric": "acc", "value": None,
            "final": {"acc": None}}
    row = _row(data)
    assert row is not None and math.isnan(row.value)
    assert aggregate([row])[0]["non_finite"] == 1
    assert _row({**data, "final": {}}).value is None  # no evaluation of the metric: None, as written
