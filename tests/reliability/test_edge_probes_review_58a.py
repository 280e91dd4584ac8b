"""Review probes of three commits (helper 58e): one row of coefficients shared by every head (9d60a7a), rank 0's
readings of the results folder under torchrun (f5ce051) and the did-you-mean of a misspelt config path (0640ac4).

Found: (1) under torchrun each rank still refused a run from its own reading of its finished sibling seeds (and of the
run's own ``run_config.json``): a worker sharing the comparison that finished a sibling between two ranks' reads made
one rank raise the "holds a finished run ... made with a different" ValueError alone while the other went on to its
next collective, and the job hung (killed here at 60 s). The identity checks are now rank 0's reading, their refusal
raised on every rank. (2) The did-you-mean of a misspelt config path suggested a folder named ``*.toml`` beside it,
which the loader then refuses as "a folder, expected a TOML file".
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch

TRAIN_TESTS = str(Path(__file__).resolve().parents[1] / "train")  # the 2-rank launcher of the trainer tests
if TRAIN_TESTS not in sys.path:
    sys.path.insert(0, TRAIN_TESTS)
from train_tiny_tasks import launch_gloo_ranks  # noqa: E402

TRAIN = {"max_steps": 2, "batch_size": 8, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 2, "log_interval": 1,
         "checkpoint_interval": 2, "device": "cpu"}
RAW = {"name": "w58e", "seeds": [0, 1], "operators": [{"name": "attention"}], "tasks": [
    {"name": "digits", "dataset": "digits", "model": "vit-digits",
     "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2}, "train": TRAIN}]}

_WORKER = '''
import json, os, sys, time
from pathlib import Path

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments import runner

out, raw = Path(sys.argv[1]), json.loads(sys.argv[2])
rank = int(os.environ["RANK"])
cfg = load_experiment_config(raw, [])
if rank == 0:  # rank 0 looked at seed 1 before the other worker wrote its final summary
    real = runner._completed
    seen = []

    def before_the_worker_finished(rdir):
        if rdir.name != "seed1" or seen:
            return real(rdir)
        seen.append(rdir)
        return False
    runner._completed = before_the_worker_finished
t0 = time.perf_counter()
record = {"error": None}
try:
    runner.run_experiment(cfg, out / "results", progress=False, log=lambda m: None)
except BaseException as err:
    record["error"] = f"{type(err).__name__}: {err}"
record["seconds"] = time.perf_counter() - t0
(out / f"rank{rank}.json").write_text(json.dumps(record))
'''


@pytest.mark.slow
def test_bug_a_sibling_finished_between_two_ranks_reads_is_refused_on_every_rank(tmp_path):
    """Seed 1 of the comparison was finished by another worker under another learning rate while a 2-rank job ran
    seed 0: rank 0 read seed 1 as unfinished, rank 1 as finished, and rank 1 alone refused seed 0 (its finished
    sibling would be averaged with it) while rank 0 went on: the job hung. Rank 0's reading decides for both ranks
    (here: seed 0 trains, then seed 1's own run is refused on both ranks, with one message)."""
    from diffusionformer.experiments import load_experiment_config, run_experiment

    other = {**RAW, "seeds": [1], "tasks": [{**RAW["tasks"][0], "train": {**TRAIN, "lr": 2e-3}}]}
    out = tmp_path / "out"
    run_experiment(load_experiment_config(other, []), out / "results", progress=False, log=lambda m: None)
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    t0 = time.perf_counter()
    launch_gloo_ranks(script, [str(out), json.dumps(RAW)], tmp_path, timeout=60.0)  # it hung: killed at 60 s
    seconds = time.perf_counter() - t0
    rank0, rank1 = (json.loads((out / f"rank{r}.json").read_text()) for r in range(2))
    assert rank0["error"] is not None and rank0["error"] == rank1["error"], (rank0, rank1)
    assert rank0["error"].startswith("ValueError: ") and "seed1 holds a run of task 'digits'" in rank0["error"]
    assert (out / "results" / "w58e" / "runs" / "digits" / "attention" / "seed0" / "summary.json").is_file()
    assert seconds < 60


def test_bug_did_you_mean_of_a_misspelt_config_names_a_file_not_a_folder(tmp_path):
    """``configs/defualt.toml`` beside a folder ``default.toml`` (and no such file) suggested that folder, which the
    loader refuses as "a folder, expected a TOML file"; a regular file beside it is still suggested."""
    from diffusionformer.experiments import load_experiment_config

    (tmp_path / "default.toml").mkdir()
    with pytest.raises(FileNotFoundError) as info:
        load_experiment_config(tmp_path / "defualt.toml")
    assert str(info.value) == f"experiment config {str(tmp_path / 'defualt.toml')!r} not found"
    (tmp_path / "defaults.toml").write_text("")
    with pytest.raises(FileNotFoundError, match="did you mean .*defaults.toml'"):
        load_experiment_config(tmp_path / "defualt.toml")


@pytest.mark.parametrize("backend", ["matrix", "sdpa"])
def test_one_row_of_coefficients_trains_like_every_head_s_row(backend):
    """A ``(1, K+1)`` learned row shared by H=3 heads: its gradient is ``(1, K+1)``, the sum of the per-head rows'
    gradients of the same coefficients given as ``(H, K+1)``; the static rows ``[[...]]`` give the same output."""
    from diffusionformer.functional import diffuse

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 4, 2, generator=g, dtype=torch.float64) for _ in range(3))
    for init in ([[0.5, -0.25, 0.75]], [[0.25, 1.5]]):
        row = torch.tensor(init, dtype=torch.float64, requires_grad=True)
        rows = row.detach().expand(3, -1).clone().requires_grad_()
        out, ref = diffuse(q, k, v, row, backend=backend), diffuse(q, k, v, rows, backend=backend)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(diffuse(q, k, v, init, backend=backend), ref)
        (out * v).sum().backward()
        (ref * v).sum().backward()
        assert row.grad.shape == (1, len(init[0]))
        torch.testing.assert_close(row.grad, rows.grad.sum(0, keepdim=True))
