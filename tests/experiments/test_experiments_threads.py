"""Thread sizing of the runner: one worker's torch threads = --threads, $OMP_NUM_THREADS, or cores // workers."""

from __future__ import annotations

import json

import pytest
import torch

from diffusionformer.experiments.cli import main as cli_main
from diffusionformer.experiments.threads import WORKERS_ENV, ThreadPlan, available_cores, plan_threads


@pytest.mark.parametrize("cores,workers", [(c, w) for c in (1, 2, 3, 8, 16, 64) for w in (1, 2, 3, 4, 5, 16, 100)])
def test_cores_are_split_evenly_among_workers_with_at_least_one_thread(cores, workers):
    plan = plan_threads(cores=cores, workers=workers, environ={})
    # independent statement of the rule: the largest t >= 1 with t * workers <= cores (or 1 when cores < workers)
    expected = max([t for t in range(1, cores + 1) if t * workers <= cores], default=1)
    assert plan == ThreadPlan(expected, cores, workers, "cores // workers")


def test_explicit_threads_win_then_omp_num_threads_then_the_split():
    env = {"OMP_NUM_THREADS": "3", WORKERS_ENV: "2"}
    assert plan_threads(threads=5, cores=8, environ=env) == ThreadPlan(5, 8, 2, "--threads")
    assert plan_threads(cores=8, environ=env) == ThreadPlan(3, 8, 2, "OMP_NUM_THREADS")
    assert plan_threads(cores=8, environ={WORKERS_ENV: "2"}) == ThreadPlan(4, 8, 2, "cores // workers")
    assert plan_threads(cores=8, environ={"OMP_NUM_THREADS": " "}).source == "cores // workers"  # blank = unset


def test_workers_come_from_the_flag_then_the_env_then_torchrun():
    env = {WORKERS_ENV: "4", "LOCAL_WORLD_SIZE": "2"}
    assert plan_threads(workers=8, cores=16, environ=env).workers == 8
    assert plan_threads(cores=16, environ=env).workers == 4
    assert plan_threads(cores=16, environ={"LOCAL_WORLD_SIZE": "2"}).workers == 2
    assert plan_threads(cores=16, environ={}).workers == 1


@pytest.mark.parametrize("kwargs,env,err,match", [
    ({"threads": 0}, {}, ValueError, r"--threads: expected a positive int, got 0"),
    ({"threads": True}, {}, TypeError, r"--threads: expected a positive int, got True"),
    ({"threads": 1.5}, {}, TypeError, r"--threads: expected a positive int, got float"),
    ({"workers": -1}, {}, ValueError, r"--workers: expected a positive int, got -1"),
    ({}, {WORKERS_ENV: "two"}, ValueError, r"\$DIFFUSIONFORMER_WORKERS: expected a positive int, got 'two'"),
    ({}, {"OMP_NUM_THREADS": "0"}, ValueError, r"\$OMP_NUM_THREADS: expected a positive int, got 0"),
])
def test_bad_counts_say_what_was_expected(kwargs, env, err, match):
    with pytest.raises(err, match=match):
        plan_threads(cores=2, environ=env, **kwargs)


def test_available_cores_is_the_affinity_mask():
    import os

    n = available_cores()
    assert n >= 1
    if hasattr(os, "sched_getaffinity"):
        assert n == len(os.sched_getaffinity(0))


def test_describe_says_the_choice_and_how_to_change_it():
    text = plan_threads(cores=2, workers=2, environ={}).describe()
    assert text.startswith("torch threads: 1 per worker (2 cores // 2 workers;") and "--threads N" in text


def test_run_sets_and_prints_the_threads(tmp_path, capsys, monkeypatch):
    """The CLI applies the plan before training and tells the user; a 1-step run keeps the test quick."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    want = 2 if before == 1 else 1  # not the count already set (xdist workers start with 1, see tests/conftest.py)
    toml = tmp_path / "t.toml"
    toml.write_text(
        'name = "thr"\nseeds = [0]\n[[tasks]]\nname = "digits"\ndataset = "digits"\nmodel = "vit-digits"\n'
        'model_overrides = { dim = 8, depth = 1, num_heads = 2 }\n'
        '[tasks.train]\nmax_steps = 1\nbatch_size = 4\nwarmup_steps = 0\n'
        '[[operators]]\nname = "attention"\n'
    )
    try:
        assert cli_main(["run", str(toml), "--out", str(tmp_path / "res"), "--no-progress", "--threads", str(want)]) == 0
        # trained with them (the manifest records the count), the caller's count back after main()
        assert json.loads((tmp_path / "res" / "thr" / "manifest.json").read_text())["torch_threads"] == want
        assert torch.get_num_threads() == before
        err = capsys.readouterr().err
        assert f"torch threads: {want} per worker (from --threads" in err
        assert f"status {toml} --out {tmp_path / 'res'}" in err  # where to follow the runs
    finally:
        torch.set_num_threads(before)
