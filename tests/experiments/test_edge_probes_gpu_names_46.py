"""Edge-case probes: runs of one comparison trained on GPUs of different models (a GPU call on an H100, another on an
H200), told apart by the GPU model each run records.

Found and fixed (tests named ``test_bug_...``):

- ``train.trainer.Trainer.fit``: ``summary.json`` recorded the device as ``"cuda:0"`` only, which names no GPU model;
  it now also records ``device_name`` (``torch.cuda.get_device_name`` on CUDA, null elsewhere).
- ``experiments.results``: ``RunResult`` had no GPU model; it now reads the summary's ``device_name`` (a string or
  null; another type is left out with a warning naming the file; a summary without it reads as before), keeps it in
  ``results.json`` and checks it there (``_row_problem``).
- ``tables.aggregate`` / ``format_table`` / ``publish_experiment``: a row whose seeds trained on an H100 and an H200
  averaged their run times as one device's ("mixed devices" only told CPU from CUDA), and the page's wall time summed
  their minutes unsaid. Such a row now gives the mean per GPU model, the page the minutes per GPU model; pages of
  runs whose summaries do not record the model (all published ones) are written byte for byte as before.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import RunResult, _row_problem, finished_runs, run_dir

INDEX = "# Results\n\n```{toctree}\n:maxdepth: 1\n\n```\n"
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def _config():
    return load_experiment_config({
        "name": "gpus", "seeds": [0, 1, 2],
        "tasks": [{"name": "d", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 4}}],
        "operators": [{"name": "base"}, {"name": "lap", "laplacian_heads": 1}]})


def _runs(out, devices):
    """Run folders of ``gpus`` by hand: ``devices[(op, seed)]`` is ``(device, device_name)`` of the summary
    (``device_name`` ``...``: the key absent, as in a summary written before it was recorded); the elapsed seconds are
    10 on an H100, 20 on an H200 or another cuda device, 100 on cpu."""
    for (op, seed), (device, name) in devices.items():
        rdir = run_dir(out, "d", op, seed)
        rdir.mkdir(parents=True)
        rec = {"step": 4, "split": "eval", "metrics": {"test_acc": 0.5 + seed / 10}}
        (rdir / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
        summary = {"status": "completed", "eval": rec, "num_parameters": 7, "device": device,
                   "elapsed": 100.0 if device == "cpu" else 10.0 if name == H100 else 20.0}
        if name is not ...:
            summary["device_name"] = name
        (rdir / "summary.json").write_text(json.dumps(summary))
    return finished_runs(out, _config())


def _all(device, name):
    return {(op, s): (device, name) for op in ("base", "lap") for s in (0, 1, 2)}


def _time_cells(text):
    return {ln.split("|")[1].strip(): ln.split("|")[-2].strip() for ln in text.splitlines()
            if ln.startswith("| base |") or ln.startswith("| lap |")}


def _publish(tmp_path, tag, devices):
    from diffusionformer.experiments.outputs import write_outputs
    from diffusionformer.experiments.publish import publish_experiment

    out = tmp_path / tag / "results"
    write_outputs(out / "gpus", _config(), _runs(out / "gpus", devices))
    docs = tmp_path / tag / "docs"
    docs.mkdir(parents=True)
    (docs / "index.md").write_text(INDEX)
    page = publish_experiment(_config(), out, docs).read_text()
    return page, (out / "gpus" / "results.md").read_text(), json.loads((out / "gpus" / "results.json").read_text())


class _Regression:
    """``y = x W`` on 4 features, batches from the trainer's generator."""

    def __init__(self):
        self.w = torch.randn(4, 2, generator=torch.Generator().manual_seed(0))

    def train_batch(self, step, generator, batch_size):
        x = torch.randn(batch_size, 4, generator=generator)
        return {"x": x, "y": x @ self.w}

    def loss(self, model, batch):
        return F.mse_loss(model(batch["x"]), batch["y"]), {}

    def evaluate(self, model, max_batches):
        x = torch.ones(3, 4)
        return {"loss": F.mse_loss(model(x), x @ self.w).item()}


def _fit(out_dir):
    from diffusionformer.train import Trainer, TrainConfig

    cfg = TrainConfig(max_steps=2, batch_size=4, lr=1e-2, eval_interval=2, log_interval=1, checkpoint_interval=2,
                      seed=0, device="cpu", progress=False)
    return Trainer(nn.Linear(4, 2), _Regression(), cfg, out_dir).fit()


def test_bug_the_summary_records_the_gpu_model(tmp_path, monkeypatch):
    """Bug: ``summary.json`` said ``"device": "cuda:0"`` for a run on an H100 and for one on an H200 alike, so nothing
    downstream could tell them apart. The trainer now writes ``device_name``: null on CPU (a real 2-step fit here),
    ``torch.cuda.get_device_name`` of the run's own device on CUDA (a stand-in records the device it is asked about:
    no CUDA here); the fit writes what the helper gives for its device."""
    from diffusionformer.train import trainer

    summary = _fit(tmp_path / "cpu")
    assert "device_name" in summary and summary["device_name"] is None and summary["device"] == "cpu"
    assert json.loads((tmp_path / "cpu" / "summary.json").read_text())["device_name"] is None

    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: asked.append(d) or H200)
    assert trainer._device_name(torch.device("cuda:1")) == H200 and asked == [torch.device("cuda:1")]
    assert trainer._device_name(torch.device("cpu")) is None and len(asked) == 1
    monkeypatch.setattr(trainer, "_device_name", lambda d: f"model of {d}")
    assert _fit(tmp_path / "named")["device_name"] == "model of cpu"
    assert json.loads((tmp_path / "named" / "summary.json").read_text())["device_name"] == "model of cpu"


def test_bug_run_results_read_the_gpu_model_and_check_it(tmp_path):
    """Bug: ``RunResult`` had no GPU model: a summary's ``device_name`` was dropped on the way to the tables. It is now
    read (a string or null); an old summary without it reads as None; a value of another type (``3``) is left out
    with a warning naming the file, as a bad ``elapsed`` is; ``results.json`` rows check it like ``device``."""
    runs = _runs(tmp_path / "out", _all("cuda:0", ...) | {("base", 0): ("cuda:0", H100), ("base", 1): ("cpu", None)})
    got = {(r.operator, r.seed): r.device_name for r in runs}
    assert got == {("base", 0): H100, ("base", 1): None, ("base", 2): None,
                   ("lap", 0): None, ("lap", 1): None, ("lap", 2): None}
    bad = tmp_path / "bad"
    _runs(bad, {("base", 0): ("cuda:0", H100)})
    spath = run_dir(bad, "d", "base", 0) / "summary.json"
    spath.write_text(json.dumps({**json.loads(spath.read_text()), "device_name": 3}))
    with pytest.warns(UserWarning, match=r"summary\.json: device_name must be a string or null, got 3"):
        (r,) = finished_runs(bad, _config())
    assert r.device_name is None and r.elapsed == 10.0
    row = {"task": "d", "operator": "base", "seed": 0, "status": "completed", "metric": "test_acc", "value": 0.5}
    assert _row_problem({**row, "device_name": H100}) is None and _row_problem({**row, "device_name": None}) is None
    assert _row_problem({**row, "device_name": ["H100"]}) == "device_name must be a string or null, got \"['H100']\""


def test_bug_time_per_run_over_two_gpu_models_says_so(tmp_path):
    """Bug: a row whose seeds trained on an H100 (10 s) and an H200 (20 s), both ``cuda:0``, showed "time/run (s)"
    13.3 as one device's time: "mixed devices" only told CPU from CUDA. It now names the GPU models with the mean of
    each (by hand: 10 and 20); the row all on one H100 (on cuda:0 and cuda:1) keeps its plain cell."""
    from diffusionformer.experiments.tables import aggregate, format_table

    devices = {(op, s): (f"cuda:{s % 2}", H100) for op in ("base", "lap") for s in (0, 1, 2)} | {("lap", 2): ("cuda:0", H200)}
    runs = _runs(tmp_path / "out", devices)
    rows = {r["operator"]: r for r in aggregate(runs)}
    assert "elapsed_by_device" not in rows["base"]
    assert rows["lap"]["elapsed_by_device"] == {H100: 10.0, H200: 20.0}
    cells = _time_cells(format_table(list(rows.values()), _config()))
    assert cells == {"base": "10.0", "lap": f"13.3 (mixed devices: {H100} 10.0, {H200} 20.0)"}
    # a GPU model beside a CPU run: the model names the GPU side
    mixed = aggregate(_runs(tmp_path / "cpu", {("base", 0): ("cuda:0", H200), ("base", 1): ("cpu", None)}))
    assert mixed[0]["elapsed_by_device"] == {H200: 20.0, "cpu": 100.0}


def test_bug_a_pages_wall_time_names_the_gpu_models(tmp_path):
    """Bug: the page's wall time summed an H100 call's and an H200 call's minutes as "X min in all" without a word,
    and nothing on it said which run used which GPU. With five H100 runs (10 s) and one H200 run (20 s) it now gives
    the minutes per model; ``results.json`` keeps each run's model, so a later ``publish`` (which reads it, not the
    run folders) still tells them apart."""
    from diffusionformer.experiments.publish import publish_experiment

    page, md, results = _publish(tmp_path, "mixed", _all("cuda:0", H100) | {("lap", 0): ("cuda:0", H200)})
    assert sorted(str(r["device_name"]) for r in results["runs"]) == [H100] * 5 + [H200]
    line = next(ln for ln in page.splitlines() if "Training wall time" in ln)
    assert f"1.2 min in all, of which 0.8 min on {H100}, 0.3 min on {H200} (per-run times" in line
    assert _time_cells(md)["lap"] == f"13.3 (mixed devices: {H100} 10.0, {H200} 20.0)"
    src = tmp_path / "mixed" / "results" / "gpus"
    for rdir in (src / "runs").rglob("seed*"):  # the run folders gone: the page from results.json alone
        (rdir / "summary.json").unlink()
    docs = tmp_path / "again"
    docs.mkdir()
    (docs / "index.md").write_text(INDEX)
    assert line in publish_experiment(_config(), src.parent, docs).read_text()


def test_pins_runs_without_the_gpu_model_write_as_before(tmp_path):
    """Summaries that do not record the GPU model (every published study's), or record one model for all, give the
    page, ``results.md`` and ``results.json`` summary of runs without the field byte for byte; a cuda run without a
    model beside one with it is not called mixed (it may be the same GPU); cpu beside cuda is split as before."""
    old = _publish(tmp_path, "old", _all("cuda:0", ...))
    assert "mixed" not in old[1] and "of which" not in old[0]
    for tag, devices in (("one", _all("cuda:0", H200)), ("some", _all("cuda:0", ...) | {("lap", 1): ("cuda:0", H200)}),
                         ("null", _all("cuda:0", None))):
        page, md, results = _publish(tmp_path, tag, devices)
        assert (page, md, results["summary"]) == (old[0], old[1], old[2]["summary"]), tag
    kinds = _publish(tmp_path, "kinds", _all("cpu", ...) | {("lap", 0): ("cuda:0", ...)})
    assert _time_cells(kinds[1])["lap"] == "73.3 (mixed devices: cpu 100.0, cuda 20.0)"
    assert "of which 8.3 min on cpu, 0.3 min on cuda (" in kinds[0]
    # a model on a cpu run (hand-edited) names no GPU: cpu runs "on an H100" and "on an H200" are still one device
    assert "mixed" not in _publish(tmp_path, "cpuname", _all("cpu", H100) | {("lap", 0): ("cpu", H200)})[1]


def test_pins_run_result_field_order_keeps_positional_callers():
    """``device_name`` is the last field: a ``RunResult`` built positionally (as ``_result_from_files`` and older
    callers do) keeps every earlier field where it was."""
    r = RunResult("t", "a", 0, "completed", "acc", 0.5, {}, 3, 1.0, {}, None, None, None, "cuda:0")
    assert (r.device, r.device_name) == ("cuda:0", None)
