"""Edge probes of the spellings of norm/mlp names across the experiments' tables (sitting 47)."""

from __future__ import annotations

import json

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.publish import summary_table
from diffusionformer.experiments.results import run_dir
from experiments_tiny_configs import write_finished_study

BASE = {0: 0.5, 1: 0.6, 2: 0.7}


def _study(out, name, settings, values, task_overrides=None):
    """A finished comparison ``name`` of one task; ``settings``: (name, model_overrides) pairs, the first the
    baseline."""
    return write_finished_study(out, name, [{"name": o, "model_overrides": m} for o, m in settings], values,
                                task_overrides)


def _header(tmp_path, a_setting, b_setting, task=None):
    a = _study(tmp_path, "A", [("attention", {}), ("x", a_setting)], {"attention": BASE, "x": {0: 0.6, 1: 0.7, 2: 0.8}},
               task)
    b = _study(tmp_path, "B", [("attention", {}), ("x", b_setting)], {"attention": BASE, "x": {0: 0.3, 1: 0.4, 2: 0.5}},
               task)
    lines = summary_table([a, b], tmp_path).splitlines()
    return [c.strip() for c in lines[0].strip("|").split("|")], lines


def test_bug_summary_one_column_for_two_spellings_of_one_mlp(tmp_path):
    """Bug: ``summary_table`` keyed a setting's column by its definition as written, so ``mlp = "SwiGLU"`` in one
    comparison and ``mlp = "swiglu"`` in another (one model: the configs read names with case, ``_`` and ``-``
    ignored) got a column each, headed as if the two comparisons defined the setting differently."""
    header, lines = _header(tmp_path, {"mlp": "SwiGLU", "norm": "RMS_Norm"}, {"mlp": "swiglu", "norm": "rmsnorm"})
    assert header == ["task", "metric (baseline mean)", "x"]
    assert lines[2].split("|")[3].strip().startswith("+0.1000")
    assert lines[3].split("|")[3].strip().startswith("-0.2000")


def test_bug_summary_one_column_for_a_new_field_at_its_default_and_absent(tmp_path):
    """Bug: ``{}`` and ``{mlp = "gelu"}`` (the default MLP: one model, and one run identity) got two columns."""
    header, _ = _header(tmp_path, {}, {"mlp": "GELU"})
    assert header == ["task", "metric (baseline mean)", "x"]


def test_summary_keeps_two_columns_for_two_models(tmp_path):
    header, _ = _header(tmp_path, {"mlp": "swiglu"}, {"mlp": "geglu"})
    assert header == ["task", "metric (baseline mean)", "x (A)", "x (B)"]


def test_summary_default_mlp_differs_from_absent_under_a_task_that_sets_another(tmp_path):
    """``{mlp = "gelu"}`` under tasks of ``mlp = "swiglu"`` builds a GELU model where ``{}`` builds a SwiGLU one."""
    header, _ = _header(tmp_path, {}, {"mlp": "gelu"}, {"mlp": "swiglu"})
    assert header == ["task", "metric (baseline mean)", "x (A)", "x (B)"]


def _tiny(model_overrides):
    return load_experiment_config({
        "name": "tiny", "seeds": [0],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2},
                   "train": {"max_steps": 2, "batch_size": 16, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 2,
                             "log_interval": 1, "checkpoint_interval": 1}}],
        "operators": [{"name": "rms", "model_overrides": model_overrides}]})


def _as_spelt_before(rdir):
    """The run as a library of yesterday wrote it: ``norm`` and ``mlp`` kept as spelt in ``run_config.json`` and in
    the checkpoint's model record."""
    import torch

    ident = json.loads((rdir / "run_config.json").read_text())
    ident["model_config"].update(norm="RMSNorm", mlp="SwiGLU")
    (rdir / "run_config.json").write_text(json.dumps(ident))
    payload = torch.load(rdir / "checkpoint.pt", weights_only=True)
    payload["model_record"]["config"].update(norm="RMSNorm", mlp="SwiGLU")
    torch.save(payload, rdir / "checkpoint.pt")


def test_bug_load_run_of_a_run_recorded_with_rmsnorm_as_spelt(tmp_path):
    """Bug: a run whose config and checkpoint recorded ``norm = "RMSNorm"`` (as spelt, before the configs recorded
    names as read) was refused by ``load_run``: its model, rebuilt as ``"rmsnorm"``, differed from the checkpoint's
    model record ("written by a different model ... was run_config.json edited?"), though it is the same model."""
    from diffusionformer.experiments.reload import load_run
    from diffusionformer.experiments.runner import run_experiment

    run_experiment(_tiny({"norm": "RMSNorm", "mlp": "SwiGLU"}), tmp_path)
    rdir = run_dir(tmp_path / "tiny", "digits", "rms", 0)
    _as_spelt_before(rdir)
    run = load_run(rdir)
    assert (run.config.norm, run.config.mlp) == ("rmsnorm", "swiglu")


def test_bug_trainer_resumes_a_checkpoint_recorded_with_swiglu_as_spelt():
    """Bug: the trainer's resume check compared the checkpoint's model record with the model's field by field, so a
    checkpoint written while ``mlp = "SwiGLU"`` was kept as spelt was "written by a different model" than the same
    model configured now (``"swiglu"``): an interrupted run could not be taken up again."""
    from diffusionformer.models import model_config
    from diffusionformer.models.vit import DiffusionViT
    from diffusionformer.train.checkpoint import model_record, model_record_differences

    model = DiffusionViT(model_config("vit-digits", dim=16, depth=1, num_heads=2, norm="RMSNorm", mlp="SwiGLU"))
    now = model_record(model)
    saved = json.loads(json.dumps(now))
    saved["config"].update(norm="RMS_Norm", mlp="SwiGLU")
    assert model_record_differences(saved, now) == []
    saved["config"].update(mlp="geglu")  # another model all the same
    assert model_record_differences(saved, now) == ["config mlp: checkpoint 'geglu', now 'swiglu'"]


def test_bug_model_config_backend_in_capitals_gets_a_hint():
    """Bug: the model configs read ``norm``/``mlp`` with case ignored but ``backend`` exactly (by design: the ops
    take it so), and a ``backend = "SDPA"`` was refused without the "did you mean 'sdpa'?" that ``"Auto"`` got: the
    hint compared the name as typed, capitals and all."""
    import pytest

    from diffusionformer.models import model_config

    with pytest.raises(ValueError, match=r"ViTConfig\.backend: .*got 'SDPA' \(did you mean 'sdpa'\?\)"):
        model_config("vit-digits", backend="SDPA")
