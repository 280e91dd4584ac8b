"""The tiny digits comparison the command-line tests share (two settings, 2 steps of a width-8 ViT).

Imported by the test modules (``tests/experiments/conftest.py`` puts this folder on ``sys.path``: pytest runs
with ``--import-mode=importlib``) at module level, where their ``parametrize`` lists read it.
"""

from pathlib import Path

TINY_DIGITS_TOML = '''name = "tiny"
seeds = [0]
[[tasks]]
name = "digits"
dataset = "digits"
model = "vit-digits"
model_overrides = {dim = 8, depth = 1, num_heads = 2}
[tasks.train]
max_steps = 2
batch_size = 8
warmup_steps = 0
eval_interval = 2
log_interval = 1
checkpoint_interval = 2
[[operators]]
name = "attention"
[[operators]]
name = "lap"
laplacian_heads = 1
'''


def tiny_digits_config(operators: int | None = None):
    """``TINY_DIGITS_TOML`` loaded as an ``ExperimentConfig``, keeping its first ``operators`` settings (all: None)."""
    import dataclasses
    import tomllib

    from diffusionformer.experiments import load_experiment_config

    config = load_experiment_config(tomllib.loads(TINY_DIGITS_TOML))
    return config if operators is None else dataclasses.replace(config, operators=config.operators[:operators])


def leave_own_lock_in_place(monkeypatch, config, out, match: str = "is left in place"):
    """Run ``config`` into ``out`` with every lock release failing (a read-only run folder: chmod does not stop
    root), which raises a ``PermissionError`` matching ``match``; this process's lock of the first run is left in
    place: its path is returned."""
    import pytest

    from diffusionformer.experiments import runner
    from diffusionformer.experiments.results import run_dir
    from diffusionformer.experiments.store import LOCK_NAME

    def unremovable(rdir):
        raise PermissionError(13, "Permission denied", str(Path(rdir) / LOCK_NAME))

    with monkeypatch.context() as patch:
        patch.setattr(runner, "_release_lock", unremovable)
        with pytest.raises(PermissionError, match=match):
            runner.run_experiment(config, out, progress=False, log=lambda m: None)
    return run_dir(Path(out) / config.name, config.tasks[0].name, config.operators[0].name, config.seeds[0]) / LOCK_NAME


# a two-seed character-LM comparison whose run folders the gaps tests write by hand (no training)
TINY_GAPS_TOML = """name = "g"
seeds = [0, 1]
[[tasks]]
name = "t"
dataset = "pydoc-chars"
model = "gpt-char-tiny"
metric = "val_loss"
[[operators]]
name = "attention"
[[operators]]
name = "lap"
laplacian_heads = 1
"""


# (train, val) loss at steps 100, 200, 300 per (setting, seed) of a gap study: the best val loss is not the final one
GAP_CURVES = {
    ("attention", 0): [(2.0, 2.5), (1.5, 2.4), (1.0, 2.9)],
    ("attention", 1): [(2.1, 2.6), (1.4, 2.3), (0.9, 3.0)],
    ("attention", 2): [(2.0, 2.4), (1.6, 2.45), (1.1, 2.8)],
    ("lap", 0): [(2.1, 2.5), (1.6, 2.35), (1.2, 2.6)],
    ("lap", 1): [(2.2, 2.6), (1.5, 2.3), (1.2, 2.7)],
    ("lap", 2): [(2.0, 2.4), (1.7, 2.4), (1.3, 2.65)],
}


def write_gap_run(rdir, evals, **summary):
    """A finished run folder ``rdir`` the gaps tests read, written by hand (no training): ``summary.json``
    (``status`` completed, plus ``summary``) and ``metrics.jsonl`` of one eval record per ``(step, train_loss,
    val_loss)`` of ``evals``."""
    import json

    rdir.mkdir(parents=True)
    (rdir / "summary.json").write_text(json.dumps({"status": "completed", **summary}))
    (rdir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "split": "eval", "metrics": {"train_loss": t, "val_loss": v}}) + "\n"
        for s, t, v in evals))


def write_finished_study(out, name, operators, values, task_overrides=None):
    """A finished comparison ``name`` of one digits task ``t`` written under ``out`` by hand (no training), and its
    config: ``operators`` its ``[[operators]]`` tables (the first the baseline), ``values[setting][seed]`` each run's
    test_acc (a run folder with its log and summary, and a row of ``results.json``); seeds 0-2."""
    import json

    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments.results import RunResult, run_dir

    src = out / name
    rows = []
    for op in [o["name"] for o in operators]:
        for s, v in values[op].items():
            rdir = run_dir(src, "t", op, s)
            rdir.mkdir(parents=True)
            rec = {"step": 2, "split": "eval", "metrics": {"test_acc": v}}
            (rdir / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
            (rdir / "summary.json").write_text(json.dumps({"status": "completed", "eval": rec}))
            rows.append(RunResult("t", op, s, "completed", "test_acc", v, dict(rec["metrics"]), 10, 1.0))
    (src / "results.json").write_text(json.dumps({"runs": [r.__dict__ for r in rows], "summary": []}))
    return load_experiment_config({
        "name": name, "seeds": [0, 1, 2], "operators": operators,
        "tasks": [{"name": "t", "dataset": "digits", "model": "vit-digits", "metric": "test_acc",
                   "model_overrides": task_overrides or {}, "train": {"max_steps": 4}}]})


def write_lock(rdir, text: str, age: float = 0.0):
    """Writes ``text`` as the run folder ``rdir``'s lock file (the folder made), ``age`` seconds old; returns its
    path."""
    import os
    import time

    from diffusionformer.experiments import store

    rdir.mkdir(parents=True, exist_ok=True)
    path = rdir / store.LOCK_NAME
    path.write_text(text)
    if age:
        os.utime(path, (time.time() - age, time.time() - age))
    return path


#: a training budget of two steps that evaluates and checkpoints at the end (runs of a user's tiny model)
TINY_TRAIN = {"max_steps": 2, "batch_size": 8, "warmup_steps": 0, "eval_interval": 2, "log_interval": 1,
              "checkpoint_interval": 2}
#: the smallest ViT of the 8 x 8 digits
TINY_VIT = dict(input_size=(8, 8), patch_size=2, num_classes=10, dim=8, depth=1, num_heads=2)

# a digits comparison as a user writes it (the config-author tests edit its text: keys moved, misspelt, retyped)
TINY_DIGITS_USER_TOML = """
name = "tiny"
seeds = [0]

[[tasks]]
name = "digits"
dataset = "digits"
model = "vit-digits"
metric = "test_acc"
model_overrides = { dim = 16, depth = 1, num_heads = 2, mlp_ratio = 1.0 }
[tasks.train]
max_steps = 2
batch_size = 16
eval_interval = 2
log_interval = 1

[[operators]]
name = "attention"

[[operators]]
name = "lap"
laplacian_heads = "half"
"""


# a finished comparison of two settings on three seeds whose result files the result-file tests damage
FINISHED_OPS = [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}]
FINISHED_VALUES = {"attention": {0: 0.5, 1: 0.6, 2: 0.7}, "lap": {0: 0.55, 1: 0.65, 2: 0.8}}


def finished_study(tmp_path):
    """``(out, config, results.json)`` of :func:`write_finished_study` "h" of ``FINISHED_OPS`` under
    ``tmp_path / "results"``."""
    out = tmp_path / "results"
    config = write_finished_study(out, "h", FINISHED_OPS, FINISHED_VALUES)
    return out, config, out / "h" / "results.json"


# a python for experiments/scripts/gpu_study.sh (``% sys.executable``): run, status and analyze say what they were
# given (one line each); the CUDA check passes; the rest (the comparison's name, the --set of --precision) is read by
# the real python
_GPU_STUDY_STAND_IN_PY = """#!/usr/bin/env bash
case "$1 $3" in
  "-m run") exit 0 ;;
  "-m status"|"-m analyze") printf '%%s\\n' "$@"; exit 0 ;;
  "- "*) cat > /dev/null; exit 0 ;;
esac
exec "%s" "$@"
"""


def run_gpu_study_stand_in(tmp_path, config, *args):
    """``gpu_study.sh run CONFIG 1 *args`` with the stand-in python above, its folders under ``tmp_path``:
    ``(the finished process, its $OUT)``, where ``status.md`` and ``analyze.log`` hold the argv of those commands."""
    import os
    import stat
    import subprocess
    import sys
    from pathlib import Path

    fake = tmp_path / "py"
    fake.write_text(_GPU_STUDY_STAND_IN_PY % sys.executable)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "out"
    env = {**os.environ, "PY": str(fake), "ALLOW_CPU": "1", "OUT": str(out), "RESULTS": str(tmp_path / "res"),
           "DATA": str(tmp_path / "data"), "UNPACKED": str(tmp_path / "unpacked"), "BUDGET": "60",
           "DIFFUSIONFORMER_CACHE": str(tmp_path / "cache")}
    script = Path(__file__).resolve().parents[2] / "experiments" / "scripts" / "gpu_study.sh"
    done = subprocess.run(["bash", str(script), "run", str(config), "1", *args], env=env, capture_output=True,
                          text=True, timeout=300)
    return done, out


def play_torchrun_rank(monkeypatch, rank: int, trainer) -> None:
    """This process as rank ``rank`` of a 2-process torchrun job for the runner: no process group joined, rank 0's
    broadcasts stand-ins that change nothing (so a rank other than 0 reads each of rank 0's readings as ``None``: no
    lock holder, no finished run), and ``trainer`` as the runner's ``Trainer``."""
    import torch.distributed as tdist

    from diffusionformer.experiments import runner as runner_mod

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setattr(runner_mod, "_maybe_init_distributed", lambda device: None)
    monkeypatch.setattr(tdist, "broadcast_object_list", lambda objects, src: None)
    monkeypatch.setattr(runner_mod, "Trainer", trainer)


def learned_quad_source(name: str) -> str:
    """The source of a user's ``--import`` module registering a degree-2 operator ``name`` (coefficients 1, -1, 0.5):
    written into a folder by the tests of recorded ``--import`` modules."""
    return f'''
import torch

from diffusionformer.operators import DiffusionOperator, register_operator


@register_operator
class LearnedQuad(DiffusionOperator):
    name = "{name}"

    def __init__(self, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self._static = (1.0, -1.0, 0.5)
        self.register_buffer("_c", torch.tensor(self._static), persistent=False)

    @property
    def degree(self) -> int:
        return 2

    def coefficients(self) -> torch.Tensor:
        return self._c

    def static_coefficients(self) -> tuple[float, ...]:
        return self._static
'''


def tiny_text_lm_config():
    """A one-run language-modelling comparison on pydoc-chars (no data root needed): a 1-layer GPT of 6 steps,
    checkpoints every 2, evaluations at 3 and 6: small enough to kill, resume and analyse in a test."""
    from diffusionformer.experiments import load_experiment_config

    return load_experiment_config({
        "name": "lm", "seeds": [0], "operators": [{"name": "attention"}],
        "tasks": [{"name": "t", "dataset": "pydoc-chars", "model": "gpt-char-tiny", "metric": "val_loss",
                   "eval_batch_size": 4, "model_overrides": {"n_layer": 1, "n_head": 2, "n_embd": 8,
                                                             "block_size": 8},
                   "train": {"max_steps": 6, "batch_size": 4, "lr": 1e-2, "eval_steps": 1, "eval_interval": 3,
                             "checkpoint_interval": 2, "log_interval": 2}}]})


#: a tiny task of each model class with RoPE (the ViT's own rope_base is 100, the GPT's 10000), trained for
#: TINY_TRAIN's steps: the rope_base identity tests' runs
TINY_ROPE_TASKS = {
    "vit": {"name": "t", "dataset": "digits", "model": "vit-digits",
            "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2, "rope": True}},
    "gpt": {"name": "t", "dataset": "pydoc-chars", "model": "gpt-char-tiny", "metric": "val_loss",
            "model_overrides": {"n_embd": 8, "n_layer": 1, "n_head": 2, "block_size": 16, "rope": True}},
}
