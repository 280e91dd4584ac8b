"""Warnings hygiene: normal use warns nothing under ``-W error``; the library's own warnings name the user's line."""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch


def _writers():
    """``tests/data/data_writers.py`` (tiny files in the benchmark formats), loaded by path as tests/data does."""
    name = "diffusionformer_tests_data_writers"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "data" / "data_writers.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_bug_compile_of_mixed_heads_warns_nothing_of_ours():
    """Bug: ``torch.compile`` of a model with mixed heads (``laplacian_heads=1``, ``[["ppr", "laplacian"]]``, a graph
    transformer) warned at every compile "Dynamo detected a call to a `functools.lru_cache`-wrapped function at
    'engine.py:166'" (and at a dozen more call sites: the engine's head-run, plan and degree helpers are
    ``lru_cache``-wrapped, and dynamo traces the wrapped function anyway): under ``-W error`` (pytest's
    ``-W error``) the compiled forward raised InternalTorchDynamoError. The caches are now bypassed while dynamo
    traces, and the compiled models give the eager outputs."""
    from diffusionformer.models import DiffusionGPT, DiffusionGraphTransformer, GPTConfig, GraphTransformerConfig

    torch.manual_seed(0)
    idx = torch.randint(0, 11, (2, 8))
    x, ei = torch.randn(6, 4), torch.tensor([[0, 1, 2, 3, 4, 5, 1], [1, 2, 3, 4, 5, 0, 3]])
    cases = [
        (DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16, laplacian_heads=1)),
         (idx, idx), lambda out: out[0]),
        (DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16,
                                heads=[["ppr", "laplacian"]])), (idx, idx), lambda out: out[0]),
        (DiffusionGraphTransformer(GraphTransformerConfig(in_channels=4, num_classes=2, dim=16, depth=1, num_heads=2,
                                                          laplacian_heads=1)), (x, ei), lambda out: out),
    ]
    for model, args, first in cases:
        model.eval()  # no dropout: the compiled output is the eager one
        torch._dynamo.reset()
        compiled = torch.compile(model)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = first(compiled(*args))
            out.sum().backward()
        ours = [str(w.message) for w in caught if "lru_cache" in str(w.message) or "diffusionformer" in w.filename]
        assert ours == []
        torch.testing.assert_close(out, first(model(*args)), atol=1e-5, rtol=1e-5)


def test_bug_cache_refused_warning_names_the_users_line(tmp_path, monkeypatch):
    """Bug: a damaged decoded-image cache file is refused and rebuilt with a UserWarning whose ``stacklevel=2``
    named the loader's own line (``diffusionformer/data/cifar10.py:336``) rather than the user's
    ``load_dataset(...)`` call, which ``warnings.filterwarnings(module=...)`` and the "file:line" of the message
    need. It now names the first frame outside the package, for every loader depth."""
    pytest.importorskip("PIL", reason="Pillow decodes the JPEG archives")
    from diffusionformer.data import load_dataset

    w = _writers()
    w.write_image_zip(tmp_path / "cifar10_jpg" / "train.zip", "train", per_class=2)
    w.write_image_zip(tmp_path / "cifar10_jpg" / "test.zip", "test", per_class=2)
    cache = tmp_path / "cache"
    monkeypatch.setenv("DIFFUSIONFORMER_CACHE", str(cache))
    opts = dict(root=tmp_path, verify=False, normalize=False, val_size=2, source="jpg")
    first = load_dataset("cifar10", **opts)
    files = sorted((cache / "cifar10").glob("*.pt"))
    assert len(files) == 2
    for f in files:
        f.write_bytes(b"not a zip file")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = load_dataset("cifar10", **opts)
    refused = [w for w in caught if "cached file refused" in str(w.message)]
    assert len(refused) == 2
    assert [(w.category, w.filename) for w in refused] == [(UserWarning, __file__)] * 2
    assert torch.equal(first.x_test, again.x_test)


def test_bug_minibatch_hops_warning_names_the_users_line():
    """Bug: ``build_task(data, model, minibatch={...})`` with fewer sampled hops than the model propagates warned
    (rightly) with ``stacklevel=2`` from ``NodeMiniBatchTask.for_model``, which named ``build_task``'s own line in
    ``diffusionformer/experiments/tasks.py`` instead of the user's call. Both entry points now name the caller."""
    from diffusionformer.data import load_dataset
    from diffusionformer.experiments.minibatch import NodeMiniBatchTask
    from diffusionformer.experiments.tasks import build_task
    from diffusionformer.models import create_model

    data = load_dataset("karate")
    model = create_model("graph-node-small", in_channels=data.num_features, num_classes=data.num_classes, depth=2)
    minibatch = {"batch_size": 4, "num_neighbors": [3]}
    for make in (lambda: build_task(data, model, minibatch=minibatch),
                 lambda: NodeMiniBatchTask.for_model(data, model, minibatch)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            make()
        hops = [w for w in caught if "num_neighbors samples 1 hop" in str(w.message)]
        assert [(w.category, w.filename) for w in hops] == [(UserWarning, __file__)]


def test_bug_results_file_warnings_name_the_users_line(tmp_path):
    """Bug: ``finished_runs(out, config)`` over a run whose summary.json holds a mistyped ``elapsed`` or whose
    learned-operator file is unreadable warned (rightly) with fixed stacklevels counted for another caller: the
    warnings named ``finished_runs``'s own line in ``diffusionformer/experiments/results.py``, not the user's call
    (``run_status`` got it right by luck of depth). They now name the user's line from every entry point."""
    import json

    from diffusionformer.experiments.config import load_experiment_config
    from diffusionformer.experiments.results import finished_runs, run_dir, run_status

    cfg = load_experiment_config({"name": "x", "tasks": [{"name": "d", "dataset": "digits", "model": "vit-digits"}],
                                  "operators": [{"name": "attention"}], "seeds": [0]})
    rdir = run_dir(tmp_path / "x", "d", "attention", 0)
    rdir.mkdir(parents=True)
    summary = {"status": "completed", "step": 10, "elapsed": "long", "num_parameters": 3,
               "eval": {"split": "eval", "step": 10, "metrics": {"test_acc": 0.5}}}
    (rdir / "summary.json").write_text(json.dumps(summary))
    (rdir / "learned_operators.json").write_text("{not json")
    for call in (lambda: finished_runs(tmp_path / "x", cfg), lambda: run_status(cfg, tmp_path)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        assert any("elapsed must be a finite number" in str(w.message) for w in caught)
        assert [w.filename for w in caught] == [__file__] * len(caught)


def test_bug_ssl_model_overrides_deprecation_reaches_script_users(tmp_path):
    """Bug: ``load_experiment_config`` of a config giving DINO's ``local_crops`` among ``model_overrides`` warned
    with a DeprecationWarning at ``stacklevel=4``, counted for a direct ``TaskConfig(...)``: through the loader it
    named ``diffusionformer/config.py``, and Python's default filters show a DeprecationWarning only when it names
    ``__main__``, so a script (``python run.py``) never saw the deprecation. It now names the user's line."""
    import subprocess
    import textwrap

    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent("""\
        from diffusionformer.experiments.config import load_experiment_config
        cfg = {"name": "x", "seeds": [0], "operators": [{"name": "attention"}],
               "tasks": [{"name": "d", "dataset": "digits", "model": "dino-digits",
                          "model_overrides": {"local_crops": 2}}]}
        load_experiment_config(cfg)
    """))
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # Python's default filters
    env["PYTHONPATH"] = str(root) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "DeprecationWarning: task 'd': model_overrides ['local_crops']" in done.stderr
    assert f"{script}:5: DeprecationWarning" in done.stderr


def test_bug_validation_warnings_name_the_users_line_through_check_experiment():
    """Bug: ``check_experiment(config)`` (and the runner, which validates each task first) relayed the DINO
    momentum-schedule warning of ``validate_experiment`` with ``stacklevel=3``, counted for a direct
    ``validate_experiment`` call: it named ``diffusionformer/experiments/validate.py`` (check_experiment's own
    line). Both public functions now name the user's line."""
    from diffusionformer.experiments.config import load_experiment_config
    from diffusionformer.experiments.validate import check_experiment, validate_experiment

    cfg = load_experiment_config({"name": "x", "seeds": [0], "operators": [{"name": "attention"}],
                                  "tasks": [{"name": "d", "dataset": "digits", "model": "dino-digits",
                                             "metric": "knn_test_acc", "train": {"max_steps": 7}}]})
    for call in (lambda: validate_experiment(cfg), lambda: check_experiment(cfg)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        schedule = [w for w in caught if "momentum schedule" in str(w.message)]
        assert [(w.category, w.filename) for w in schedule] == [(UserWarning, __file__)]


def test_bug_resume_over_malformed_metrics_lines_warns_at_the_users_fit(tmp_path):
    """Bug: resuming ``Trainer(..., resume=True).fit()`` over a metrics.jsonl with a malformed line warned
    "skipping a malformed metrics line" with ``stacklevel=3``, counted for ``read_metrics``: through the trainer's
    log truncation it named ``diffusionformer/train/trainer.py``. It now names the user's ``fit()`` line, and
    ``read_metrics`` still names its caller."""
    from torch import nn

    from diffusionformer.train import Trainer, TrainConfig, read_metrics

    class Task:
        def train_batch(self, step, generator, batch_size):
            return {"x": torch.randn(batch_size, 2, generator=generator)}

        def loss(self, model, batch):
            loss = model(batch["x"]).pow(2).mean()
            return loss, {}

        def evaluate(self, model, max_batches):
            return {"val_loss": 0.0}

    def config(steps):
        return TrainConfig(max_steps=steps, batch_size=4, lr_decay_steps=4, eval_interval=0, log_interval=1,
                           checkpoint_interval=2, device="cpu", progress=False)

    Trainer(nn.Linear(2, 1), Task(), config(2), tmp_path).fit()
    log = tmp_path / "metrics.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:1] + ["not json", '{"a": 1}'] + lines[1:]) + "\n")
    for call in (lambda: Trainer(nn.Linear(2, 1), Task(), config(4), tmp_path, resume=True).fit(),
                 lambda: read_metrics(log)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        skipped = [w for w in caught if "skipping a" in str(w.message)]
        assert len(skipped) == 2
        assert [w.filename for w in skipped] == [__file__] * 2
        log.write_text("\n".join(lines[:1] + ["not json", '{"a": 1}'] + lines[1:]) + "\n")


def test_bug_setting_ssl_override_deprecation_names_the_users_line():
    """Bug: an operator setting passing DINO's ``local_crops`` among its ``model_overrides`` (deprecated) warned
    from ``split_task_settings`` with ``stacklevel=3``, right for ``create_model(...)`` but through
    ``validate_experiment`` (and the runner) it named ``diffusionformer/experiments/validate.py``: a
    DeprecationWarning that names no ``__main__`` line is hidden by Python's default filters. It now names the
    user's line from every entry point; ``create_model`` keeps naming its caller."""
    from diffusionformer.experiments.config import load_experiment_config
    from diffusionformer.experiments.validate import validate_experiment
    from diffusionformer.models import create_model

    cfg = load_experiment_config({
        "name": "x", "seeds": [0], "operators": [{"name": "attention", "model_overrides": {"local_crops": 2}}],
        "tasks": [{"name": "d", "dataset": "digits", "model": "dino-digits", "metric": "knn_test_acc",
                   "model_overrides": {"schedule_steps": 1000}, "train": {"max_steps": 1000}}]})
    for call in (lambda: validate_experiment(cfg), lambda: create_model("dino-digits", local_crops=2)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        moved = [w for w in caught if "['local_crops'] are settings of the task" in str(w.message)]
        assert [(w.category, w.filename) for w in moved] == [(DeprecationWarning, __file__)]
