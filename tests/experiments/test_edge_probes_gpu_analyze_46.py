"""Probe 46: the token-geometry analysis inside the GPU call of ``experiments/scripts/gpu_study.sh run`` (its
results archive carries no ``checkpoint.pt``, so ``analyze`` can only measure a GPU-trained run in the call that
trained it), and ``analyze`` reading back, from their ``analysis_cache.pt``, the runs of earlier calls whose
checkpoints stayed on the GPU machine.

Rehearsed on CPU (not a test: minutes): ``ALLOW_CPU=1 bash experiments/scripts/gpu_study.sh run
experiments/configs/gpu_text.toml 1 --set seeds=[0] --set device=cpu --set precision=fp32 --set
operators=attention,laplacian-half --set tasks.shakespeare-char.model_overrides={n_layer=2,...}
--set tasks.shakespeare-char.train={max_steps=20,...}``, then the same with ``operators=heat-learned`` and the
first call's archive in ``$DATA``, then ``publish``.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
from experiments_tiny_configs import TINY_DIGITS_TOML

from diffusionformer.experiments import analyze as A
from diffusionformer.experiments import load_experiment_config, run_experiment

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "scripts" / "gpu_study.sh"

# a stand-in python: the CUDA check passes, the comparison's name comes from the real config loader; ``run`` and
# ``analyze`` record their arguments, ``run`` writes a finished run with its checkpoint, ``analyze`` its outputs, a
# killed writer's leftover temporary, and then sleeps $FAKE_ANALYZE_SLEEP seconds (a slow analysis)
_FAKE_PY = """#!/usr/bin/env bash
if [ "$1" = "-m" ] && [ "$3" = "run" ]; then
  echo "run $*" >> "$FAKE_CALLS"
  while [ $# -gt 0 ]; do [ "$1" = "--out" ] && out="$2"; shift; done
  mkdir -p "$out/probe/runs/t/a/seed0"
  echo '{"status": "completed", "step": 2}' > "$out/probe/runs/t/a/seed0/summary.json"
  head -c 100000 /dev/zero > "$out/probe/runs/t/a/seed0/checkpoint.pt"
  exit 0
fi
if [ "$1" = "-m" ] && [ "$3" = "analyze" ]; then
  echo "analyze $*" >> "$FAKE_CALLS"
  while [ $# -gt 0 ]; do [ "$1" = "--out" ] && out="$2"; shift; done
  mkdir -p "$out/probe/analysis/plots"
  echo '{}' > "$out/probe/analysis/metrics.json"
  echo 'cache' > "$out/probe/runs/t/a/seed0/analysis_cache.pt"
  echo 'torn' > "$out/probe/analysis/.metrics.json.x1.tmp"
  exec sleep "${FAKE_ANALYZE_SLEEP:-0}"
fi
[ "$1" = "-m" ] && [ "$3" = "status" ] && { echo "status"; exit 0; }
[ "$1" = "-" ] && { cat > /dev/null; exit 0; }
exec "%s" "$@"
"""


def _script(tmp_path: Path, **extra: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    config = tmp_path / "c.toml"
    config.write_text('name = "probe"\nseeds = [0, 1]\n[[tasks]]\nname = "t"\ndataset = "digits"\n'
                      'model = "vit-digits"\n[[operators]]\nname = "a"\nheads = "attention:4"\n'
                      '[[operators]]\nname = "b"\nheads = "attention:4"\n')
    fake = tmp_path / "py"
    fake.write_text(_FAKE_PY % sys.executable)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "data").mkdir(exist_ok=True)
    calls = tmp_path / "calls.txt"
    calls.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "ANALYZE"))}
    env.update(PY=str(fake), ALLOW_CPU="1", OUT=str(tmp_path / "out"), RESULTS=str(tmp_path / "res"),
               DATA=str(tmp_path / "data"), UNPACKED=str(tmp_path / "unpacked"), BUDGET="100",
               DIFFUSIONFORMER_CACHE=str(tmp_path / "cache"), FAKE_CALLS=str(calls))
    env.update(extra)
    res = subprocess.run(["bash", str(SCRIPT), "run", str(config), "1", "--set", "seeds=[0]", "--set",
                          "operators=a", "--set", "tasks.t.train.max_steps=2"],
                         env=env, capture_output=True, text=True, timeout=120)
    return res, calls.read_text().splitlines() if calls.is_file() else []


def _members(tmp_path: Path) -> list[str]:
    with tarfile.open(tmp_path / "out" / "results-probe.tar.gz") as tar:
        return sorted(tar.getnames())


def _left(stdout: str) -> int:
    line = next(x for x in stdout.splitlines() if x.startswith("setup: "))
    return int(line.split("for at most ")[1].split()[0])


@pytest.mark.slow  # the script reads the config in a fresh python
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None or shutil.which("timeout") is None,
                    reason="needs bash, tar and timeout")
def test_bug_run_analyses_the_finished_runs_before_packing(tmp_path):
    """Bug: ``gpu_study.sh run`` packed the results without ``checkpoint.pt`` and never analysed them, so ``analyze``
    (which needs a run's weights) could never measure a run trained in a GPU call. Now the call keeps
    ``ANALYZE_RESERVE`` seconds of its budget, runs ``analyze --partial`` over every finished run of the comparison
    (the call's ``--set`` options without its ``seeds=``/``operators=`` selections) before packing, and packs
    ``analysis/`` and each run's ``analysis_cache.pt``, not the temporaries of a writer it cut."""
    res, calls = _script(tmp_path, ANALYZE_RESERVE="30")
    assert res.returncode == 0, res.stdout + res.stderr
    assert _left(res.stdout) <= 70, res.stdout  # 100 s less the 30 s kept for the analysis
    assert [c.split()[0] for c in calls] == ["run", "analyze"], calls
    analyze = calls[1].split()
    assert "--partial" in analyze and "--threads" in analyze and "tasks.t.train.max_steps=2" in analyze, analyze
    assert "seeds=[0]" not in analyze and "operators=a" not in analyze, analyze
    assert " --max-examples 128 " in calls[1], calls  # ANALYZE_ARGS' default
    members = _members(tmp_path)
    assert "probe/analysis/metrics.json" in members and "probe/runs/t/a/seed0/analysis_cache.pt" in members, members
    assert not any(m.endswith((".tmp", "checkpoint.pt")) for m in members), members
    assert (tmp_path / "out" / "analyze.log").is_file()

    res, calls = _script(tmp_path, ANALYZE_ARGS="")  # analyze's own defaults; no reserve by default: the training
    assert res.returncode == 0 and "--max-examples" not in calls[1], calls  # of a call sized for the budget is kept
    assert _left(res.stdout) > 70, res.stdout

    res, calls = _script(tmp_path, ANALYZE="0")  # off: the training has the whole budget, nothing analyses
    assert res.returncode == 0, res.stdout + res.stderr
    assert [c.split()[0] for c in calls] == ["run"], calls
    assert _left(res.stdout) > 70, res.stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None or shutil.which("timeout") is None,
                    reason="needs bash, tar and timeout")
def test_bug_a_slow_analysis_is_cut_by_the_budget_and_the_results_still_packed(tmp_path):
    """Bug (with the analysis in the call): an analysis running past the budget would take the device call past its
    600 s limit and bring nothing back. It is now cut (SIGINT, then SIGKILL) at ``BUDGET`` seconds from the start,
    the training's exit code stays the script's, and the results are packed without the cut writer's leftovers."""
    res, calls = _script(tmp_path, BUDGET="25", ANALYZE_RESERVE="20", FAKE_ANALYZE_SLEEP="300")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "analyze exit code 124" in res.stdout, res.stdout
    members = _members(tmp_path)
    assert "probe/analysis/metrics.json" in members and not any(m.endswith(".tmp") for m in members), members

    res, calls = _script(tmp_path, BUDGET="3", ANALYZE_RESERVE="1")  # no time left: said, not started
    assert res.returncode == 0, res.stdout + res.stderr
    assert [c.split()[0] for c in calls] == ["run"], calls
    assert "analysis skipped" in res.stdout, res.stdout

    # bad settings are refused before anything runs (BUDGET=9m, which timeout took, failed in bash arithmetic
    # mid-way; ANALYZE=true turned the analysis off silently; a reserve of the whole budget left no training)
    for env, said in ((dict(ANALYZE_RESERVE="a minute"), "ANALYZE_RESERVE must be a whole number of seconds"),
                      (dict(BUDGET="9m"), "BUDGET must be a whole number of seconds, got '9m'"),
                      (dict(ANALYZE="true"), "ANALYZE must be 0 or 1, got 'true'"),
                      (dict(BUDGET="60", ANALYZE_RESERVE="60"), "leaves no training time")):
        res, calls = _script(tmp_path, **env)
        assert res.returncode == 2 and said in res.stderr and calls == [], (env, res.stderr)


def _config():
    return load_experiment_config(tomllib.loads(TINY_DIGITS_TOML.replace(  # learned heat times to read back
        "laplacian_heads = 1", "heads = \"attention:1,heat(t=0.5, learnable=True, steps=2):1\"")))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    run_experiment(_config(), root, progress=False)
    return root


def test_bug_runs_without_checkpoints_are_read_from_their_analysis_cache(tiny, tmp_path):
    """Bug: a completed run whose checkpoint is gone (a ``gpu_study.sh`` results archive: the call that trained it
    analysed it, its ``analysis_cache.pt`` came back) was skipped by ``analyze --partial`` (refused without), so the
    analysis of the next call, or of this checkout, rewrote ``metrics.json`` without every earlier call's runs
    although their measurements were at hand. Such a run is now read from its cache when that was made with the same
    settings at the run's final step (learned operator parameters included); a cache of other settings still
    skips it."""
    shutil.copytree(tiny / "tiny", tmp_path / "tiny")
    first = A.analyze_experiment(_config(), tmp_path, max_examples=8, progress=False, plots=False, device="cpu")
    runs = tmp_path / "tiny" / "runs" / "digits"
    for rdir in runs.glob("*/seed0"):
        (rdir / "checkpoint.pt").unlink()  # as the archive brings them back
    again = A.analyze_experiment(_config(), tmp_path, max_examples=8, progress=False, plots=False, device="cpu")
    assert again["skipped_runs"] == []
    assert sorted(again["tasks"]["digits"]["operators"]) == ["attention", "lap"]
    for op in again["tasks"]["digits"]["operators"].values():  # measured elsewhere: no checkpoint path named
        assert op["seeds"]["0"].pop("checkpoint") is None
    for op in first["tasks"]["digits"]["operators"].values():
        assert op["seeds"]["0"].pop("checkpoint").endswith("checkpoint.pt")
    assert json.dumps(again["tasks"], sort_keys=True) == json.dumps(first["tasks"], sort_keys=True)
    assert again["tasks"]["digits"]["operators"]["lap"]["seeds"]["0"]["learned_operators"] == \
        first["tasks"]["digits"]["operators"]["lap"]["seeds"]["0"]["learned_operators"]

    with pytest.warns(RuntimeWarning, match="marked completed but its checkpoint"):  # other settings: not cached
        with pytest.raises(FileNotFoundError, match="no finished run of 'tiny'"):
            A.analyze_experiment(_config(), tmp_path, max_examples=4, progress=False, plots=False, device="cpu",
                                 partial=True)
    with pytest.raises(FileNotFoundError, match="marked completed but its checkpoint"):
        A.analyze_experiment(_config(), tmp_path, max_examples=4, progress=False, plots=False, device="cpu")


def test_bug_a_cache_of_another_step_or_without_learned_parameters_is_not_read(tiny, tmp_path):
    """Bug guard of the above: a weightless run's cache is read only when it was made at the step its
    ``summary.json`` says the run finished at and holds the learned operator parameters (a cache written before
    they were stored gets them at the next analysis that has the checkpoint)."""
    import torch

    shutil.copytree(tiny / "tiny", tmp_path / "tiny")
    A.analyze_experiment(_config(), tmp_path, max_examples=8, progress=False, plots=False, device="cpu")
    rdir = tmp_path / "tiny" / "runs" / "digits" / "lap" / "seed0"
    cache = rdir / "analysis_cache.pt"
    blob = torch.load(cache, weights_only=True)
    assert isinstance(blob["learned"], dict) and blob["learned"]
    torch.save({"key": blob["key"], "result": blob["result"]}, cache)  # an older cache: no learned parameters
    A.analyze_experiment(_config(), tmp_path, max_examples=8, progress=False, plots=False, device="cpu")
    assert torch.load(cache, weights_only=True)["learned"] == blob["learned"]  # added from the checkpoint

    settings = {k: v for k, v in blob["key"].items() if k not in ("step", "size", "mtime_ns")}
    (rdir / "checkpoint.pt").unlink()
    assert A._weightless_cache(rdir, settings) is not None
    torch.save({**blob, "key": {**blob["key"], "step": blob["key"]["step"] - 1}}, cache)
    assert A._weightless_cache(rdir, settings) is None
    torch.save({"key": blob["key"], "result": blob["result"]}, cache)
    assert A._weightless_cache(rdir, settings) is None
