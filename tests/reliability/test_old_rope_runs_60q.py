"""Task 60q: run folders written before 41b9968, whose ``run_config.json`` left ``rope_base`` out at 100.0 or 10000.0
for every model (a ViT at 10000, a GPT at 100: not the model's own default), are read by ``load_run`` at the base the
checkpoint's model record holds, not refused as an edited ``run_config.json``. No GPU."""

from __future__ import annotations

import json

import pytest
import torch

from diffusionformer.experiments import load_experiment_config, load_run
from diffusionformer.experiments.results import run_dir
from diffusionformer.experiments.runner import run_experiment
from diffusionformer.nn import RotaryEmbedding
from diffusionformer.train import CheckpointError
from experiments_tiny_configs import TINY_ROPE_TASKS as TASKS, TINY_TRAIN as TRAIN




@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``trained(model, rope_base)``: the folder of a 2-step run of ``TASKS[model]`` at ``rope_base`` (made once)."""
    runs = {}

    def make(model: str, rope_base: float):
        if (model, rope_base) not in runs:
            root = tmp_path_factory.mktemp(f"{model}_{int(rope_base)}")
            raw = {"name": "tiny", "seeds": [0], "tasks": [{**TASKS[model], "train": TRAIN}],
                   "operators": [{"name": "rope", "model_overrides": {"rope_base": rope_base}}]}
            run_experiment(load_experiment_config(raw), root, progress=False, log=lambda s: None)
            runs[model, rope_base] = run_dir(root / "tiny", "t", "rope", 0)
        return runs[model, rope_base]
    return make


def _as_before_41b9968(rdir, base_written=None):
    """``rdir``'s ``run_config.json`` as the runner wrote it before 41b9968: ``rope_base`` left out at 100.0 or 10000.0
    (``base_written``: another value there instead, a hand edit)."""
    path = rdir / "run_config.json"
    identity = json.loads(path.read_text(encoding="utf-8"))
    identity["model_config"].pop("rope_base")
    if base_written is not None:
        identity["model_config"]["rope_base"] = base_written
    path.write_text(json.dumps(identity), encoding="utf-8")


@pytest.mark.parametrize("model, base", [("vit", 10000.0), ("gpt", 100.0)])
def test_bug_load_run_reads_an_old_run_at_the_other_models_rope_base(trained, tmp_path, model, base):
    """Bug: a ViT at base 10000 was rebuilt at its own base 100 (a GPT at 100 at its 10000) and refused, "config
    rope_base: checkpoint 10000.0, now 100.0; was run_config.json edited?", though nothing was edited: the old runner
    left both bases out for every model."""
    import shutil

    rdir = tmp_path / "seed0"
    shutil.copytree(trained(model, base), rdir)
    assert json.loads((rdir / "run_config.json").read_text(encoding="utf-8"))["model_config"]["rope_base"] == base
    _as_before_41b9968(rdir)
    run = load_run(rdir)
    assert run.config.rope_base == base and run.model.config.rope_base == base
    assert {m.base for m in run.model.modules() if isinstance(m, RotaryEmbedding)} == {base}
    saved = torch.load(rdir / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]
    assert set(saved) == set(run.model.state_dict())
    assert all(torch.equal(saved[k], v) for k, v in run.model.state_dict().items())


@pytest.mark.parametrize("written", [100.0, 1000.0])
def test_a_rope_base_run_config_json_names_is_still_checked(trained, tmp_path, written):
    """A ``rope_base`` that ``run_config.json`` holds is the run's (never replaced by the checkpoint's): edited to
    another value, the run is refused as before."""
    import shutil

    rdir = tmp_path / "seed0"
    shutil.copytree(trained("vit", 10000.0), rdir)
    _as_before_41b9968(rdir, base_written=written)
    with pytest.raises(CheckpointError, match=rf"rope_base: checkpoint 10000\.0, now {written}.*edited"):
        load_run(rdir)


def test_only_the_two_old_defaults_are_taken_from_the_checkpoint(trained, tmp_path):
    """Base 1000 was never left out: a ``run_config.json`` without it is refused as before (rebuilt at the default)."""
    import shutil

    rdir = tmp_path / "seed0"
    shutil.copytree(trained("vit", 1000.0), rdir)
    _as_before_41b9968(rdir)
    with pytest.raises(CheckpointError, match=r"rope_base: checkpoint 1000\.0, now 100\.0.*edited"):
        load_run(rdir)
