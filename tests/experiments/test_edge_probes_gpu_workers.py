"""Edge-case probes of the runner's GPU and worker paths: ``--device``/``--precision`` checks, worker planning
(``run_workers``, ``worker_argv``, ``plan_threads``), mini-batch node tasks, ``load_run`` and the one-call GPU
script ``experiments/scripts/gpu_study.sh`` (stage, resume from a results tarball, pack).

Probed without a GPU: misspelt, cased, indexed and foreign device names; the ``available`` flag; precision names;
worker counts and start intervals of every type; thread plans from flags and environment variables; numpy numbers
in mini-batch configs and tasks; ``load_run`` of checkpoints missing or mistyping each entry, of damaged
``run_config.json``/``summary.json``/``metrics.jsonl`` and with ``map_location`` naming a CUDA device that is not
there; the GPU script with ``--set`` overrides. What held: the checkpoint and run-file checks of ``load_run``,
``worker_argv``'s refusal of abbreviations, the lock handling of killed workers (stale locks are taken over; the
script's tarball leaves out locks and checkpoints, and an unfinished run restarts from step 0 with its partial log
truncated) and GNU tar's own refusal of ``..`` members.

Found and fixed (tests named ``test_bug_...``):

- ``check_device``: a misspelt device (``"cdua"``, ``"CUDA:1"``, ``"gpu"``) had no "did you mean" (``TrainConfig``'s
  device has one); ``available`` took any truthy value (``"no"`` checked for CUDA, a numpy ``False`` skipped it).
- ``run_workers``: a numpy worker count was refused ("expected an int >= 1, got np.int64(2)"); a start interval
  that is not a finite number of seconds >= 0 failed after the first worker had started (``"1"``: a bare
  ``'>' not supported``, ``inf``: ``OverflowError``) or was taken silently (``-1``, ``nan``).
- ``MiniBatchConfig``/``NodeMiniBatchTask``: numpy ints (a sweep grid's) were refused as "must be a positive int,
  got np.int64(8)", against the policy that a count takes any integral number.
- ``load_run(map_location="cuda")`` on a machine without that CUDA device built the whole model, then failed in
  ``model.to`` with torch's bare ``AssertionError`` (or "invalid device ordinal").
- ``gpu_study.sh``: the comparison's folder was named from the config alone, so a call with ``--set name=...``
  packed nothing ("no results folder") or an older comparison, and never resumed from its own tarball.
- ``run_experiment``: an exported but blank ``RANK`` (read as rank 0 by the cli) stopped the run with
  "invalid literal for int() with base 10: ''"; a malformed ``WORLD_SIZE`` gave the same unnamed message.
- ``write_outputs``: one ``results.json`` row it could not read (a newer version's key, a hand edit) dropped every
  earlier call's rows from ``results.json`` and ``results.md``, though their runs were finished on disk.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------- gpu.check_device
@pytest.mark.parametrize("spec, meant", [("cdua", "cuda"), ("CUDA", "cuda"), ("CUDA:1", "cuda:1"), ("Cpu", "cpu"),
                                         ("gpu", "cuda"), ("cuda:0 ", "cuda:0"), ("AUTO", "auto")])
def test_bug_check_device_says_did_you_mean(spec, meant):
    """Bug: ``check_device("cdua")`` (``run --device cdua``, a config's ``device``) said only "expected 'auto',
    'cpu', 'cuda' or 'cuda:N', got 'cdua'", where ``TrainConfig(device="cdua")`` says "did you mean 'cuda'"; a
    misspelt, cased or spaced device now gets the device meant (its index kept, ``gpu`` read as ``cuda``)."""
    from diffusionformer.experiments.gpu import check_device

    for available in (True, False):
        with pytest.raises(ValueError, match=rf"got {spec!r} \(did you mean {meant!r}\?\)$"):
            check_device(spec, available=available)


@pytest.mark.parametrize("spec", ["tpu", "xpu", "mps", "meta", "xyzzy"])
def test_a_device_of_another_kind_is_not_suggested_a_cpu(spec):
    """A device torch knows under another kind (``xpu``, ``mps``) or a name close to none gets no hint: ``tpu`` is
    not a misspelt ``cpu``."""
    from diffusionformer.experiments.gpu import check_device

    with pytest.raises(ValueError, match=rf"got {spec!r}$"):
        check_device(spec, available=False)


@pytest.mark.parametrize("available", ["no", np.False_, np.True_, 1, None])
def test_bug_check_device_available_must_be_a_bool(available):
    """Bug: ``check_device("cuda", available=np.False_)`` skipped the check that the GPU exists, and
    ``available="no"`` made it (a truthy string); the flag is now a Python bool, a numpy one named ``numpy.bool``."""
    from diffusionformer.experiments.gpu import check_device

    with pytest.raises(TypeError, match=r"^check_device: available must be a bool, got "):
        check_device("cuda", available=available)
    if isinstance(available, np.bool_):
        with pytest.raises(TypeError, match=r"got numpy\.bool"):
            check_device("cpu", available=available)
    assert check_device("cuda", available=False) == torch.device("cuda")


def test_precision_and_device_checks_hold(monkeypatch):
    """Held: every precision name maps to its ``amp``; a CUDA index beyond the devices names the range."""
    from diffusionformer.experiments.gpu import check_device, precision_amp

    assert [precision_amp(p) for p in ("bf16", "fp32", "auto")] == ["bf16", "off", "auto"]
    with pytest.raises(ValueError, match=r"got 'FP32' \(did you mean 'fp32'\?\)$"):
        precision_amp("FP32")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ValueError, match=r"has 2 CUDA device\(s\) \(cuda:0 \.\. cuda:1\)$"):
        check_device("cuda:2")


# ---------------------------------------------------------------------------- gpu.run_workers
def test_bug_run_workers_takes_a_numpy_worker_count(tmp_path, procs):
    """Bug: ``run_workers(argv, np.int64(2), ...)`` (a count from a sweep grid) was refused with the contradictory
    "expected an int >= 1, got np.int64(2)"; it now starts two workers, each told ``2`` workers."""
    from diffusionformer.experiments.gpu import WORKER_ENV, run_workers
    from diffusionformer.experiments.threads import WORKERS_ENV

    codes = run_workers(["run", "c.toml"], np.int64(2), tmp_path / "w", stagger=0, log=lambda _: None)
    assert codes == [0, 0] and len(procs.started) == 2
    assert [(p.env[WORKERS_ENV], p.env[WORKER_ENV]) for p in procs.started] == [("2", "0/2"), ("2", "1/2")]
    with pytest.raises(ValueError, match=r"workers: expected an int >= 1, got np\.False_"):
        run_workers(["run", "c.toml"], np.False_, tmp_path / "w", stagger=0, log=lambda _: None)


@pytest.mark.parametrize("stagger", ["1", float("inf"), float("nan"), -1.0, True, None])
def test_bug_run_workers_checks_the_start_interval_before_starting_a_worker(tmp_path, procs, stagger):
    """Bug: a start interval that is no finite number of seconds >= 0 was found only after the first worker had
    started (``"1"``: a bare "'>' not supported between instances of 'str' and 'int'", ``inf``: an
    ``OverflowError`` from ``time.sleep``; the started worker was then stopped) or taken silently (``-1``, ``nan``:
    no interval). It is now a ValueError naming ``stagger`` before anything starts."""
    from diffusionformer.experiments.gpu import run_workers

    with pytest.raises(ValueError, match=r"^stagger: expected a finite number of seconds >= 0, got "):
        run_workers(["run", "c.toml"], 2, tmp_path / "w", stagger=stagger, log=lambda _: None)
    assert procs.started == []


def test_run_workers_accepts_a_zero_or_numpy_interval(tmp_path, procs, monkeypatch):
    import time

    from diffusionformer.experiments.gpu import run_workers

    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    assert run_workers(["run", "c.toml"], 3, tmp_path / "w", stagger=np.float32(0.5), log=lambda _: None) == [0] * 3
    assert slept == [0.5, 0.5]
    assert run_workers(["run", "c.toml"], 2, tmp_path / "w", stagger=0, log=lambda _: None) == [0, 0]
    assert slept == [0.5, 0.5]


def test_worker_argv_held():
    """Held: ``--workers`` and its value go in either spelling, an abbreviation is refused, ``--no-progress`` once."""
    from diffusionformer.experiments.gpu import worker_argv

    assert worker_argv(["run", "c", "--workers", "4", "--set", "seeds=[0]", "--workers=2", "--no-progress"]) == \
        ["run", "c", "--set", "seeds=[0]", "--no-progress"]
    with pytest.raises(ValueError, match=r"'--worker=2' abbreviates --workers"):
        worker_argv(["run", "c", "--worker=2"])


# ---------------------------------------------------------------------------- threads.plan_threads
def test_thread_plans_computed_by_hand():
    """Held: threads = --threads, else the first count of $OMP_NUM_THREADS, else max(1, cores // workers)."""
    from diffusionformer.experiments.threads import plan_threads

    cases = [(dict(cores=16, workers=3), {}, 5), (dict(cores=2, workers=5), {}, 1),
             (dict(cores=16), {"DIFFUSIONFORMER_WORKERS": " 4 ", "LOCAL_WORLD_SIZE": "8"}, 4),
             (dict(cores=16), {"DIFFUSIONFORMER_WORKERS": "  ", "LOCAL_WORLD_SIZE": "8"}, 2),
             (dict(cores=16, threads=3), {"OMP_NUM_THREADS": "6"}, 3), (dict(cores=16), {"OMP_NUM_THREADS": "6,2"}, 6)]
    for kwargs, env, threads in cases:
        assert plan_threads(environ=env, **kwargs).threads == threads, (kwargs, env)


# ---------------------------------------------------------------------------- minibatch
def _nodes():
    from diffusionformer.data import load_dataset

    return load_dataset("csbm", num_nodes=40, avg_degree=4.0, homophily=0.9, seed=1)


def test_bug_minibatch_config_and_task_take_numpy_ints():
    """Bug: ``MiniBatchConfig(np.int64(8), [np.int64(2)])`` and ``NodeMiniBatchTask(data, [2], np.int64(4),
    eval_batch_size=np.int64(3))`` were refused ("must be a positive int, got np.int64(8)"), though a count takes
    any integral number (``TrainConfig`` and the model configs read them); they are stored as Python ints, so the
    config serialises and compares like one written with ints. A numpy bool stays refused."""
    import json

    from diffusionformer.experiments.minibatch import MiniBatchConfig, NodeMiniBatchTask

    cfg = MiniBatchConfig(np.int64(8), [np.int64(2), np.int32(-1)])
    assert cfg == MiniBatchConfig(8, [2, -1]) and type(cfg.batch_size) is int
    assert [type(k) for k in cfg.num_neighbors] == [int, int]
    assert json.loads(json.dumps(cfg.to_dict())) == {"batch_size": 8, "num_neighbors": [2, -1], "eval": "full"}
    one = MiniBatchConfig(np.int64(8), np.int64(3))
    assert one.num_neighbors == 3 and type(one.num_neighbors) is int
    with pytest.raises(ValueError, match=r"minibatch\.num_neighbors must be"):
        MiniBatchConfig(8, [np.True_])
    with pytest.raises(ValueError, match=r"minibatch\.batch_size must be a positive int"):
        MiniBatchConfig(np.True_, [2])

    task = NodeMiniBatchTask(_nodes(), [np.int64(2)], np.int64(4), eval="sampled", eval_batch_size=np.int64(3))
    assert (task.batch_size, task.eval_batch_size, task.num_neighbors) == (4, 3, [2])
    assert [type(v) for v in (task.batch_size, task.eval_batch_size, *task.num_neighbors)] == [int, int, int]
    seeds = task.seeds(torch.Generator().manual_seed(0))
    assert seeds.numel() == 4 and bool(_nodes().data.train_mask[seeds].all())
    with pytest.raises(ValueError, match=r"batch_size must be a positive int, got np\.True_"):
        NodeMiniBatchTask(_nodes(), [2], np.True_)


# ---------------------------------------------------------------------------- reload.load_run
@pytest.mark.parametrize("cuda, count, spec, have", [
    (False, 0, "cuda", r"no CUDA device \(torch\.cuda\.is_available\(\) is False\)"),
    (True, 1, "cuda:1", r"1 CUDA device\(s\) \(cuda:0 \.\. cuda:0\)"),
    (True, 2, torch.device("cuda", 5), r"2 CUDA device\(s\) \(cuda:0 \.\. cuda:1\)"),
])
def test_bug_load_run_names_a_cuda_map_location_this_machine_lacks(tmp_path, monkeypatch, cuda, count, spec, have):
    """Bug: ``load_run(path, map_location="cuda")`` on a machine without that CUDA device read the run, built the
    whole model and then failed in ``model.to`` with torch's bare ``AssertionError: Torch not compiled with CUDA
    enabled`` (or "invalid device ordinal"); it is now a ValueError naming ``map_location`` before anything is read
    (here: before the missing run folder is noticed)."""
    from diffusionformer.experiments.reload import load_run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    with pytest.raises(ValueError, match=rf"^load_run: map_location '{torch.device(spec)}' asked for, but this "
                                         rf"machine has {have}; use map_location='cpu'$"):
        load_run(tmp_path / "missing", map_location=spec)
    with pytest.raises(FileNotFoundError):  # a device it has: on to the run folder
        load_run(tmp_path / "missing", map_location="cuda:0" if cuda else "cpu")


# ---------------------------------------------------------------------------- experiments/scripts/gpu_study.sh
_FAKE_PY = """#!/usr/bin/env bash
# python for gpu_study.sh: the CUDA check, the runner's `run` and `status` are stood in for (no torch, no
# training); the comparison's name is read by python
if [ "$1" = "-m" ] && [ "$2" = "diffusionformer.experiments" ] && [ "$3" = "run" ]; then
  out=""; prev=""; for a in "$@"; do [ "$prev" = "--out" ] && out="$a"; prev="$a"; done
  mkdir -p "$out/renamed/runs/t/a/seed0"
  if [ -f "$out/renamed/runs/t/a/seed0/summary.json" ]; then echo "resumed: finished run skipped"; else
    echo '{"status": "completed"}' > "$out/renamed/runs/t/a/seed0/summary.json"; echo "trained"; fi
  echo "| table |" > "$out/renamed/results.md"
  exit 0
fi
[ "$1" = "-m" ] && [ "$3" = "status" ] && { echo "status $*"; exit 0; }
[ "$1" = "-" ] && { cat > /dev/null; exit 0; }  # the CUDA check (ALLOW_CPU=1 would pass it)
exec "%s" "$@"
"""


@pytest.mark.slow  # two calls of the script, each reading the config in a fresh python
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_bug_gpu_study_packs_and_resumes_the_comparison_a_set_renames(tmp_path):
    """Bug: ``gpu_study.sh run CONFIG N --set name=renamed`` named the comparison from the config alone
    (``gpu_probe``), so it looked for ``results-gpu_probe.tar.gz`` to resume from and packed
    ``<results>/gpu_probe``: the runs of ``renamed`` were trained, then left unpacked ("no results folder"), and
    the next call never resumed them. The name now takes the ``--set`` overrides (``--set=...`` too, which status
    gets as well)."""
    config = tmp_path / "c.toml"
    config.write_text('name = "gpu_probe"\nseeds = [0]\n[[tasks]]\nname = "t"\ndataset = "digits"\n'
                      'model = "vit-digits"\n[[operators]]\nname = "a"\nheads = "attention:4"\n')
    fake = tmp_path / "py"
    fake.write_text(_FAKE_PY % sys.executable)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    data = tmp_path / "data"
    data.mkdir()

    def call(results, *overrides):
        env = {**os.environ, "PY": str(fake), "ALLOW_CPU": "1", "OUT": str(tmp_path / "out"), "RESULTS": str(results),
               "DATA": str(data), "UNPACKED": str(tmp_path / "unpacked"), "BUDGET": "60",
               "DIFFUSIONFORMER_CACHE": str(tmp_path / "cache")}  # UNPACKED: not the script's /tmp/df-data
        return subprocess.run(["bash", str(REPO / "experiments/scripts/gpu_study.sh"), "run", str(config), "2",
                               *overrides], env=env, capture_output=True, text=True, timeout=300)

    first = call(tmp_path / "res1", "--set", 'name="renamed"', "--set=seeds=[0]")
    assert first.returncode == 0, first.stderr
    packed = tmp_path / "out" / "results-renamed.tar.gz"
    assert packed.is_file(), first.stdout
    with tarfile.open(packed) as tar:
        assert "renamed/runs/t/a/seed0/summary.json" in tar.getnames()
    assert (tmp_path / "out" / "status.md").read_text().split() == [
        "status", "-m", "diffusionformer.experiments", "status", str(config), "--set", 'name="renamed"', "--set",
        "seeds=[0]", "--out", str(tmp_path / "res1")]

    shutil.copy(packed, data / packed.name)  # the next call, on a fresh machine, resumes from it
    second = call(tmp_path / "res2", "--set", 'name="renamed"')
    assert second.returncode == 0, second.stderr
    assert f"resuming from {data}/results-renamed.tar.gz" in second.stdout
    assert "resumed: finished run skipped" in (tmp_path / "out" / "run.log").read_text()


# ---------------------------------------------------------------------------- runner: RANK / WORLD_SIZE
_TINY_RUN = """\
name = "tiny"
seeds = [0]
[[tasks]]
name = "digits"
dataset = "digits"
model = "vit-digits"
model_overrides = { dim = 16, depth = 1, num_heads = 2 }
[tasks.train]
max_steps = 2
batch_size = 16
eval_interval = 2
log_interval = 1
checkpoint_interval = 2
[[operators]]
name = "attention"
"""


def test_bug_a_blank_rank_trains_instead_of_failing_in_the_runner(tmp_path, monkeypatch, capsys):
    """Bug: ``RANK= diffusionformer run CONFIG`` (an exported but blank ``RANK``; the cli reads it as rank 0)
    stopped in ``run_experiment`` with ``error: invalid literal for int() with base 10: ''`` (the runner read
    ``RANK`` and ``WORLD_SIZE`` with a bare ``int``). A blank ``RANK`` is now rank 0, as unset; a malformed
    ``WORLD_SIZE`` is named."""
    from diffusionformer.experiments.cli import main as cli_main

    config = tmp_path / "tiny.toml"
    config.write_text(_TINY_RUN)
    out = tmp_path / "res"
    monkeypatch.setenv("RANK", "")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert cli_main(["run", str(config), "--out", str(out), "--no-progress", "--threads", "1"]) == 0, \
        capsys.readouterr().err
    rows = __import__("json").loads((out / "tiny" / "results.json").read_text())["runs"]
    assert [(r["task"], r["operator"], r["seed"], r["status"]) for r in rows] == [("digits", "attention", 0, "completed")]
    monkeypatch.setenv("WORLD_SIZE", "two")
    assert cli_main(["run", str(config), "--out", str(out), "--no-progress", "--threads", "1"]) == 2
    assert ("error: WORLD_SIZE: expected an integer number of processes (as torchrun sets it), got 'two'"
            in capsys.readouterr().err)


# ---------------------------------------------------------------------------- outputs: results.json rows
def test_bug_one_bad_row_of_results_json_no_longer_drops_the_other_calls_rows(tmp_path):
    """Bug: ``write_outputs`` keeps the rows of an earlier call (``--set seeds=[0]``, then ``--set seeds=[1]``: one
    GPU call per seed, resumed from a results tarball) while their runs are finished on disk, but one row it could
    not read (a key of a newer version, a hand edit, a non-object) made it drop every earlier row: seeds 0 and 1
    vanished from ``results.json`` and ``results.md`` though both runs were finished. Now only that row is
    dropped (keys it does not know are left out), and a row whose seed is not an int (``"0"``, which names seed
    0's folder too) is not counted twice."""
    import json

    from diffusionformer.experiments.config import load_experiment_config
    from diffusionformer.experiments.outputs import write_outputs
    from diffusionformer.experiments.results import RunResult, run_dir

    out = tmp_path / "cmp"
    for seed in (0, 1, 2):
        rdir = run_dir(out, "t", "a", seed)
        rdir.mkdir(parents=True)
        (rdir / "summary.json").write_text(json.dumps({"status": "completed"}))
    row = {"task": "t", "operator": "a", "status": "completed", "metric": "acc"}
    (out / "results.json").write_text(json.dumps({"runs": [
        {**row, "seed": 0, "value": 0.5}, {**row, "seed": 1, "value": 0.75, "newer_field": [1]},
        [1, 2], {"task": "t", "seed": 9}, {**row, "seed": "2", "value": 0.0}]}))
    config = load_experiment_config({"name": "cmp", "seeds": [2], "operators": [{"name": "a"}], "tasks": [
        {"name": "t", "dataset": "digits", "model": "vit-digits", "metric": "acc"}]})
    write_outputs(out, config, [RunResult("t", "a", 2, "completed", "acc", 1.0)])
    rows = json.loads((out / "results.json").read_text())["runs"]
    assert sorted((r["seed"], r["value"]) for r in rows) == [(0, 0.5), (1, 0.75), (2, 1.0)]
    # by hand: mean (0.5 + 0.75 + 1.0) / 3 = 0.75, sample std sqrt((0.25^2 + 0 + 0.25^2) / 2) = 0.25, 3 seeds
    assert "| a | 0.7500 ± 0.2500 | 3 |" in (out / "results.md").read_text()
