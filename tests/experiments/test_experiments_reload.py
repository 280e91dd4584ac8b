"""``load_run``: a run trained by the runner comes back as the same model, config and metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import diffusionformer
from diffusionformer.experiments import load_experiment_config, run_experiment
from diffusionformer.experiments.runner import build_model, run_dir, task_data
from diffusionformer.models import DiffusionGPT, DiffusionViT, GPTConfig, ViTConfig
from diffusionformer.train import CheckpointError, read_metrics

REPO = Path(__file__).resolve().parents[2]


def _config(name="reload"):
    return load_experiment_config({
        "name": name,
        "seeds": [1],
        "tasks": [
            {"name": "digits", "dataset": "digits", "model": "vit-digits",
             "model_overrides": {"dim": 16, "depth": 2, "num_heads": 2},
             "train": {"max_steps": 5, "batch_size": 8, "warmup_steps": 0, "eval_interval": 5, "log_interval": 1,
                       "checkpoint_interval": 5}},
            {"name": "text", "dataset": "pydoc-chars", "model": "gpt-char-tiny", "metric": "val_loss",
             "model_overrides": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
             "train": {"max_steps": 3, "batch_size": 4, "warmup_steps": 0, "eval_interval": 3, "eval_steps": 1,
                       "log_interval": 1, "checkpoint_interval": 3}},
        ],
        "operators": [{"name": "heat", "heads": "attention:1,heat(t=0.5, learnable=True, steps=3):1"}],
    })


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("reload")
    cfg = _config()
    run_experiment(cfg, root, progress=False, log=lambda s: None)
    return cfg, root / cfg.name


def test_round_trip_gives_the_trained_weights_outputs_config_and_metrics(trained):
    cfg, out = trained
    task, setting, seed = cfg.tasks[0], cfg.operators[0], cfg.seeds[0]
    rdir = run_dir(out, task.name, setting.name, seed)
    run = diffusionformer.load_run(rdir)

    # independent rebuild: the runner's own build_model with the checkpoint's weights
    data = task_data(task, seed, None, {})
    ref = build_model(task, setting, data)
    payload = torch.load(rdir / "checkpoint.pt", map_location="cpu", weights_only=True)
    ref.load_state_dict(payload["model"])
    ref.eval()

    assert isinstance(run.model, DiffusionViT) and isinstance(run.config, ViTConfig) and not run.model.training
    assert run.config == ref.config and run.preset == "vit-digits" and run.step == 5 and run.path == rdir
    for (name, a), (_, b) in zip(run.model.state_dict().items(), payload["model"].items()):
        assert torch.equal(a, b), name
    x = data.split("test")[0][:7]
    with torch.no_grad():
        torch.testing.assert_close(run.model(x).double(), ref(x).double(), rtol=0, atol=0)
    fresh = build_model(task, setting, data).eval()  # untrained weights give other outputs: the test can fail
    with torch.no_grad():
        assert not torch.allclose(fresh(x), run.model(x))

    assert run.metrics == read_metrics(rdir / "metrics.jsonl")
    assert [r["step"] for r in run.metrics if r["split"] == "train"] == [1, 2, 3, 4, 5]
    assert run.summary == json.loads((rdir / "summary.json").read_text()) and run.summary["status"] == "completed"
    assert run.train_config.max_steps == 5 and run.train_config.seed == seed
    assert "vit-digits" in repr(run) and "step=5" in repr(run)


def test_a_gpt_run_comes_back_and_generates_the_same_text(trained):
    cfg, out = trained
    task, setting, seed = cfg.tasks[1], cfg.operators[0], cfg.seeds[0]
    rdir = run_dir(out, task.name, setting.name, seed)
    run = diffusionformer.load_run(rdir / "checkpoint.pt")  # a file in the run directory works too
    ref = build_model(task, setting, task_data(task, seed, None, {}))
    ref.load_state_dict(torch.load(rdir / "checkpoint.pt", weights_only=True)["model"])
    ref.eval()
    assert isinstance(run.model, DiffusionGPT) and isinstance(run.config, GPTConfig) and run.config.block_size == 16
    idx = torch.randint(0, run.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(run.model(idx)[0].double(), ref(idx)[0].double(), rtol=0, atol=0)


def test_errors_name_what_is_missing(trained, tmp_path):
    with pytest.raises(FileNotFoundError, match="expected a run directory"):
        diffusionformer.load_run(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="run_config.json"):
        diffusionformer.load_run(tmp_path)
    cfg, out = trained
    rdir = run_dir(out, cfg.tasks[0].name, cfg.operators[0].name, cfg.seeds[0])
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "run_config.json").write_text((rdir / "run_config.json").read_text())
    with pytest.raises(FileNotFoundError, match="checkpoint"):
        diffusionformer.load_run(broken)
    ident = json.loads((rdir / "run_config.json").read_text())
    ident["model_config"]["dim"] = 32  # weights of a width-16 model no longer fit
    (broken / "run_config.json").write_text(json.dumps(ident))
    (broken / "checkpoint.pt").write_bytes((rdir / "checkpoint.pt").read_bytes())
    with pytest.raises(CheckpointError, match="do not fit"):
        diffusionformer.load_run(broken)
    ident["model"] = "vit-digitz"
    (broken / "run_config.json").write_text(json.dumps(ident))
    with pytest.raises(ValueError, match="did you mean 'vit-digits'"):
        diffusionformer.load_run(broken)


def test_top_level_names_are_the_subpackage_objects():
    from diffusionformer import (DiffusionGPT as G, DiffusionGraphTransformer as T, DiffusionViT as V, LoadedRun,
                                 create_model, load_run)
    from diffusionformer import experiments, models

    assert (G, T, V, create_model) == (models.DiffusionGPT, models.DiffusionGraphTransformer, models.DiffusionViT,
                                       models.create_model)
    assert (load_run, LoadedRun) == (experiments.load_run, experiments.LoadedRun)
    assert {"create_model", "load_run", "DiffusionGPT"} <= set(dir(diffusionformer)) & set(diffusionformer.__all__)
    with pytest.raises(AttributeError, match="has no attribute 'create_modle'"):
        diffusionformer.create_modle  # noqa: B018


def test_import_stays_light_and_star_import_exports_the_lazy_names():
    """``import diffusionformer`` loads neither the models nor the runner until a name is used."""
    code = (
        "import sys, diffusionformer\n"
        "assert 'diffusionformer.models' not in sys.modules, 'models imported eagerly'\n"
        "assert 'diffusionformer.experiments' not in sys.modules, 'runner imported eagerly'\n"
        "import diffusionformer.models, diffusionformer.data\n"
        "assert 'torch_geometric' not in sys.modules, 'PyG imported eagerly'\n"
        "from diffusionformer import *\n"
        "assert create_model('gpt-char-tiny').__class__ is DiffusionGPT\n"
        "assert callable(load_run)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO,
                   env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": ""})
