"""Edge probes of ``load_run`` (experiments/reload.py) and the checkpoint's model record (train/checkpoint.py):
the caller's default dtype, a damaged model record, devices, edited run files, checkpoints of other runs, a
locked run folder and a graph node task's round trip."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from diffusionformer import load_run
from diffusionformer.train import CheckpointError
from diffusionformer.train.checkpoint import model_record, model_record_differences, save_checkpoint


def _images():
    return torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def _rewrite_checkpoint(rdir, **changes):
    payload = torch.load(rdir / "checkpoint.pt", map_location="cpu", weights_only=True)
    payload.update(changes)
    save_checkpoint(rdir / "checkpoint.pt", payload)


def test_bug_load_run_builds_the_model_in_the_dtype_of_the_checkpoint(tmp_path, run_folder):
    """Bug: ``load_run`` under the caller's ``torch.set_default_dtype(torch.float64)`` built the model in float64 and
    copied the float32 weights into it: the model came back float64 (its fixed operator coefficients recomputed in
    float64), with outputs that were not the trained model's; a float64 run read at the float32 default was cut to
    float32 without a word."""
    rdir, model = run_folder(tmp_path / "f32", dim=8, heads="attention:1,heat(t=0.5):1")
    x = _images()
    with torch.no_grad():
        want = model(x)
    torch.set_default_dtype(torch.float64)
    try:
        run = load_run(rdir)
        assert torch.get_default_dtype() == torch.float64  # the caller's default is left as it was
    finally:
        torch.set_default_dtype(torch.float32)
    assert {p.dtype for p in run.model.parameters()} == {torch.float32}
    assert {b.dtype for n, b in run.model.named_buffers() if n.endswith("._c")} == {torch.float32}  # t: float64
    with torch.no_grad():
        assert torch.equal(run.model(x), want)

    # a float64 run (trained under the float64 default) comes back in float64 at the float32 default
    torch.set_default_dtype(torch.float64)
    try:
        rdir64, model64 = run_folder(tmp_path / "f64", dim=8, heads="attention:1,heat(t=0.5):1")
    finally:
        torch.set_default_dtype(torch.float32)
    run64 = load_run(rdir64)
    assert torch.get_default_dtype() == torch.float32
    assert {p.dtype for p in run64.model.parameters()} == {torch.float64}
    with torch.no_grad():
        assert torch.equal(run64.model(x.double()), model64(x.double()))


@pytest.mark.parametrize("record", ["vit", ["class"], {"class": "x", "config": [1, 2], "heads": {}},
                                    {"class": "x", "config": {}, "heads": "attention:2"}])
def test_bug_load_run_refuses_a_damaged_model_record(tmp_path, run_folder, record):
    """Bug: a checkpoint whose ``model_record`` is not the trainer's mapping of mappings (a str, a list, a list of
    config values) loaded without any check, as if it were an older checkpoint without a record; the trainer itself
    refuses to resume from such a file."""
    rdir, _ = run_folder(tmp_path / "run", dim=8)
    _rewrite_checkpoint(rdir, model_record=record)
    with pytest.raises(CheckpointError, match="expected a model record as the trainer saves"):
        load_run(rdir)


def test_older_checkpoint_without_a_model_record_loads_bit_for_bit_pins(tmp_path, run_folder):
    """Pins: a checkpoint written before model records (no ``model_record`` key) loads, unchecked, exactly."""
    rdir, model = run_folder(tmp_path / "run", dim=8)
    payload = torch.load(rdir / "checkpoint.pt", map_location="cpu", weights_only=True)
    del payload["model_record"]
    save_checkpoint(rdir / "checkpoint.pt", payload)
    run = load_run(rdir)
    with torch.no_grad():
        assert torch.equal(run.model(_images()), model(_images()))


@pytest.mark.parametrize("where", ["cpu", "cpu:0", torch.device("cpu", 0)])
def test_cpu_device_spellings_load_bit_for_bit_pins(tmp_path, run_folder, where):
    """Pins: ``map_location`` as ``'cpu'``, ``'cpu:0'`` or a ``torch.device`` gives the same model, in eval mode."""
    rdir, model = run_folder(tmp_path / "run", dim=8)
    run = load_run(rdir, map_location=where)
    assert not run.model.training and next(run.model.parameters()).device.type == "cpu"
    with torch.no_grad():
        assert torch.equal(run.model(_images()), model(_images()))


@pytest.mark.parametrize("field, value", [("dropout", 0.25), ("heads", "attention:2")])
def test_an_edited_model_field_of_the_same_shapes_is_refused_by_name_pins(tmp_path, run_folder, field, value):
    """Pins: a ``run_config.json`` whose model field was edited to one that keeps every weight's shape is refused,
    naming the field and both values."""
    rdir, _ = run_folder(tmp_path / "run", dim=8)
    ident = json.loads((rdir / "run_config.json").read_text())
    was = ident["model_config"][field]
    ident["model_config"][field] = value
    (rdir / "run_config.json").write_text(json.dumps(ident))
    with pytest.raises(CheckpointError, match="was run_config.json edited") as info:
        load_run(rdir)
    assert f"config {field}: checkpoint {was!r}, now {value!r}" in str(info.value)


def test_checkpoints_of_other_runs_of_a_comparison_pins(tmp_path, run_folder):
    """Pins: the checkpoint of another seed of the same setting (the same model record) loads; that of another
    setting whose weights have the same shapes (Laplacian vs attention heads) is refused by its head layout."""
    a, _ = run_folder(tmp_path / "a", dim=8, heads="attention:1,laplacian:1")
    torch.manual_seed(1)
    b, _ = run_folder(tmp_path / "b", dim=8, heads="attention:1,laplacian:1")
    c, _ = run_folder(tmp_path / "c", dim=8, heads="attention:2")
    shutil.copy(b / "checkpoint.pt", a / "checkpoint.pt")
    assert load_run(a).step == 3
    shutil.copy(c / "checkpoint.pt", a / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="heads of blocks.0.attn"):
        load_run(a)


def test_a_run_folder_locked_by_a_live_worker_loads_read_only_pins(tmp_path, run_folder):
    """Pins: a run still held by a worker (its ``.lock``, a half-written last metrics line) loads, and ``load_run``
    writes nothing into the folder (nor takes or removes the lock)."""
    import os

    rdir, model = run_folder(tmp_path / "run", dim=8)
    (rdir / ".lock").write_text(json.dumps({"pid": os.getpid(), "host": "here"}))
    (rdir / "metrics.jsonl").write_text('{"split": "train", "step": 1, "loss": 1.0}\n{"split": "tr')
    before = {p.name: p.read_bytes() for p in rdir.iterdir()}
    run = load_run(rdir)
    assert {p.name: p.read_bytes() for p in rdir.iterdir()} == before
    with torch.no_grad():
        assert torch.equal(run.model(_images()), model(_images()))


def test_model_record_differences_against_a_hand_written_list_pins():
    """Pins: class first, then config fields and head layouts each in sorted order, a side's missing key as None."""
    saved = {"class": "m.A", "config": {"dim": 8, "b": 1, "only_saved": 2}, "heads": {"x.1": [1], "x.0": [2]}}
    now = {"class": "m.B", "config": {"dim": 16, "b": 1, "only_now": 3}, "heads": {"x.0": [3], "x.1": [1]}}
    assert model_record_differences(saved, now) == [
        "class: checkpoint m.A, now m.B",
        "config dim: checkpoint 8, now 16",
        "config only_now: checkpoint None, now 3",
        "config only_saved: checkpoint 2, now None",
        "heads of x.0: checkpoint [2], now [3]",
    ]
    assert model_record_differences(saved, now, limit=2)[-1] == "... and 3 more"
    lin = torch.nn.Linear(2, 3)
    assert model_record_differences(model_record(lin), model_record(lin)) == []


def test_a_trained_graph_node_run_reloads_to_the_same_outputs_pins(tmp_path):
    """Pins: a karate node-classification run trained by the runner (a learned heat head) reloads, in eval mode, to
    the runner's own rebuild with the checkpoint's weights: the same outputs bit for bit on the full graph."""
    from diffusionformer.experiments import load_experiment_config, run_experiment
    from diffusionformer.experiments.runner import build_model, run_dir, task_data

    cfg = load_experiment_config({
        "name": "k", "seeds": [0],
        "tasks": [{"name": "k", "dataset": "karate", "model": "graph-node-small",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
                   "train": {"max_steps": 1, "warmup_steps": 0, "eval_interval": 1, "log_interval": 1,
                             "checkpoint_interval": 1}}],
        "operators": [{"name": "heat", "heads": "attention:1,heat(t=0.5, learnable=True, steps=3):1"}],
    })
    run_experiment(cfg, tmp_path, progress=False, log=lambda s: None)
    task, setting = cfg.tasks[0], cfg.operators[0]
    rdir = run_dir(tmp_path / "k", task.name, setting.name, 0)
    run = load_run(rdir)
    data = task_data(task, 0, None, {})
    ref = build_model(task, setting, data)
    ref.load_state_dict(torch.load(rdir / "checkpoint.pt", map_location="cpu", weights_only=True)["model"])
    ref.eval()
    graph = data.data
    with torch.no_grad():
        assert torch.equal(run.model(graph.x, graph.edge_index), ref(graph.x, graph.edge_index))
    assert run.summary["status"] == "completed" and run.step == 1
