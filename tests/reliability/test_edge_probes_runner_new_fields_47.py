"""Edge probes of the experiment path with the new model field ``mlp`` (47): TOML and ``--set`` overrides, run
identity, resume, status, publish and reload of gated-MLP runs.

Probed by hand (all fine, no change): a task- or setting-level ``mlp = "SwiGLU"`` (or ``--set
operators.glu.model_overrides.mlp=SwiGLU``) validates and trains GPT, graph transformer, ViT and DINO runs that
record ``"mlp": "swiglu"``; a typo is refused before anything trains with a "did you mean" naming the task and
setting; an interrupted swiglu run resumes bit-identical to one trained straight through; ``load_run`` rebuilds
the gated MLPs and loads the checkpoint's weights exactly; ``analyze`` and ``publish`` read the runs; every shipped
config still validates (none sets ``mlp``, so their identities keep no ``mlp`` key). Found: ``status`` and
``publish`` took a ``mlp = "swiglu"`` run read without its override (the config's GELU) as completed with this
config, and ``publish`` wrote it under the GELU config (``run`` refused it); ``show`` printed a setting defined by
``model_overrides`` alone (or their ``--set``) as it printed the baseline.
"""

from __future__ import annotations

import json

import pytest
import torch

from diffusionformer.experiments import load_experiment_config, load_run, publish_experiment, run_status
from diffusionformer.experiments.results import run_dir
from diffusionformer.experiments.runner import _run_identity, run_experiment
from diffusionformer.experiments.validate import validate_experiment
from diffusionformer.models import create_model
from diffusionformer.train import TrainConfig


def _raw(glu: dict | None = None, task_overrides: dict | None = None) -> dict:
    """A two-setting comparison of a width-8 ViT on digits (2 steps); ``glu``: the second setting's model overrides."""
    return {
        "name": "tiny", "seeds": [0],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2, **(task_overrides or {})},
                   "train": {"max_steps": 2, "batch_size": 8, "warmup_steps": 0, "eval_interval": 2,
                             "log_interval": 1, "checkpoint_interval": 2}}],
        "operators": [{"name": "attention"}, {"name": "glu", "model_overrides": dict(glu or {})}],
    }


@pytest.fixture(scope="module")
def swiglu_runs(tmp_path_factory):
    """The comparison run with ``glu``'s ``mlp = "SwiGLU"``: the results root."""
    root = tmp_path_factory.mktemp("mlp")
    run_experiment(load_experiment_config(_raw({"mlp": "SwiGLU"})), root, progress=False, log=lambda s: None)
    return root


def test_bug_status_and_publish_tell_a_swiglu_run_from_the_configs_gelu(swiglu_runs, tmp_path):
    """Bug: a run made with a setting's ``mlp = "swiglu"`` (e.g. ``run --set operators.glu.model_overrides.mlp=swiglu``)
    and read by ``status`` / ``publish`` without it (the config's GELU) was "completed" with this config: the check
    took every field of the stored model config as a data size, so ``mlp`` came back as the run's own ``"swiglu"``;
    ``publish`` put the SwiGLU numbers on the GELU config's page (its command reproducing other runs), while ``run``
    refused the very same run as made with another model config."""
    rows = {r["operator"]: r for r in run_status(load_experiment_config(_raw()), swiglu_runs)}
    assert rows["attention"]["changed"] is None
    assert rows["glu"]["changed"] is not None and "mlp: 'swiglu'" in rows["glu"]["changed"], rows["glu"]
    with pytest.raises(ValueError, match=r"publish: 1 finished run\(s\) .*mlp: 'swiglu'"):
        publish_experiment(load_experiment_config(_raw()), swiglu_runs, tmp_path / "docs")
    # read with the override, spelt any way make_mlp reads it, the runs are this config's
    for spelling in ("swiglu", "Swi-GLU", "SWIGLU"):
        rows = run_status(load_experiment_config(_raw({"mlp": spelling}, {"mlp": "GELU"})), swiglu_runs)
        assert [r["changed"] for r in rows] == [None, None], (spelling, rows)
    rows = run_status(load_experiment_config(_raw({"mlp": "geglu"})), swiglu_runs)
    assert rows[1]["changed"] == "model_config (mlp: 'swiglu' then 'geglu')"


def test_a_swiglu_run_records_its_mlp_and_reloads_with_its_weights(swiglu_runs):
    """The run folder records the MLP as read; ``load_run`` rebuilds the gated MLP and its weights exactly."""
    rdir = run_dir(swiglu_runs / "tiny", "digits", "glu", 0)
    stored = json.loads((rdir / "run_config.json").read_text(encoding="utf-8"))["model_config"]
    assert stored["mlp"] == "swiglu"
    base = json.loads((run_dir(swiglu_runs / "tiny", "digits", "attention", 0) / "run_config.json").read_text(encoding="utf-8"))["model_config"]
    assert "mlp" not in base  # at its default: out of the identity, as before the field existed
    run = load_run(rdir)
    assert run.config.mlp == "swiglu" and type(run.model.blocks[0].mlp).__name__ == "GatedMlp"
    saved = torch.load(rdir / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]
    assert set(saved) == set(run.model.state_dict())
    assert all(torch.equal(saved[k], v) for k, v in run.model.state_dict().items())


@pytest.mark.parametrize("preset", ["gpt-char-tiny", "vit-digits", "graph-node-small"])
def test_the_identity_of_gelu_is_that_of_a_run_made_before_mlp_existed(preset):
    """``mlp = "gelu"`` / ``"GELU"`` leave a run's identity as it was before the field; ``"swiglu"`` is in it."""
    from diffusionformer.experiments.config import TaskConfig

    task = TaskConfig("t", "digits", preset)
    train = TrainConfig(max_steps=2)
    before = _run_identity(task, create_model(preset), train)
    assert "mlp" not in before["model_config"]
    for spelling in ("gelu", "GELU", "Ge_LU"):
        assert _run_identity(task, create_model(preset, mlp=spelling), train) == before
    swiglu = _run_identity(task, create_model(preset, mlp="SwiGLU"), train)
    assert swiglu["model_config"] == {**before["model_config"], "mlp": "swiglu"}


@pytest.mark.parametrize("where", ["task", "setting"])
def test_a_misspelt_mlp_is_refused_before_anything_trains(where):
    """``mlp = "swiglue"`` in a task's or a setting's model overrides: a problem naming where, with a did-you-mean."""
    raw = _raw({"mlp": "swiglue"}) if where == "setting" else _raw(task_overrides={"mlp": "swiglue"})
    problems = validate_experiment(load_experiment_config(raw), load_data=False)
    settings = ["glu"] if where == "setting" else ["attention", "glu"]
    assert len(problems) == len(settings), problems
    for setting, problem in zip(settings, problems):
        assert problem.startswith(f"task 'digits' / setting '{setting}': ") and "mlp" in problem
        assert "got 'swiglue' (did you mean 'swiglu'?)" in problem


def test_a_set_override_of_mlp_reaches_the_setting():
    """``--set operators.glu.model_overrides.mlp=swiglu`` (a bare word: a string) sets the setting's MLP."""
    config = load_experiment_config(_raw(), ["operators.glu.model_overrides.mlp=SwiGLU",
                                             "tasks.digits.model_overrides.mlp=geglu"])
    assert config.operators[1].model_overrides == {"mlp": "SwiGLU"}
    assert config.tasks[0].model_overrides["mlp"] == "geglu"
    assert validate_experiment(config, load_data=False) == []


_TOML = """name = "tiny"
seeds = [0]
[[tasks]]
name = "digits"
dataset = "digits"
model = "vit-digits"
model_overrides = {dim = 8, depth = 1, num_heads = 2}
[tasks.train]
max_steps = 2
[[operators]]
name = "attention"
[[operators]]
name = "glu"
model_overrides = {mlp = "swiglu"}
"""


def test_bug_show_prints_a_settings_model_overrides(tmp_path, capsys):
    """Bug: ``show`` printed each setting as ``heads=... laplacian_heads=...`` only, so a setting defined by its
    ``model_overrides`` alone (``mlp = "swiglu"``) printed exactly as the GELU baseline, and a ``--set`` of a
    setting's or task's model (``--set operators.glu.model_overrides.mlp=geglu``) did not show, while a ``--set`` of
    the training values did."""
    from diffusionformer.experiments.cli import main

    path = tmp_path / "tiny.toml"
    path.write_text(_TOML, encoding="utf-8")
    assert main(["show", str(path), "--set", "operators.glu.model_overrides.mlp=geglu",
                 "--set", "tasks.digits.model_overrides.mlp=SwiGLU"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2] == "  operator attention: heads=None laplacian_heads=None"  # no overrides: as before
    assert lines[-1] == "  operator glu: heads=None laplacian_heads=None model_overrides={mlp = \"geglu\"}"
    assert lines[1].endswith(", model_overrides {dim = 8, depth = 1, num_heads = 2, mlp = \"SwiGLU\"}"), lines[1]
