"""Edge probes: a notebook's global torch state (set by earlier cells) meets the library.

Each probe sets one piece of process-wide state (default dtype or device, grad or inference mode, anomaly
detection, deterministic algorithms, matmul precision, warning filters, the user's seeded generators), calls the
library as a notebook user would (layers, the trainer, the experiment runner on the tiny digits config) and
compares with the same call in a clean state; every test puts the state back in a ``finally`` (tests/conftest.py
checks that none leaks).
"""

from __future__ import annotations

import json
import random
import sys
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from diffusionformer.experiments import (check_experiment, load_experiment_config, load_run, run_experiment,
                                         validate_experiment)
from diffusionformer.train import Trainer

TRAIN_TESTS = str(Path(__file__).resolve().parents[1] / "train")  # the trainer tests' tiny model and task
if TRAIN_TESTS not in sys.path:
    sys.path.insert(0, TRAIN_TESTS)
from train_tiny_tasks import RegressionTask, TinyMLP, tiny_config  # noqa: E402
from experiments_tiny_configs import TINY_DIGITS_TOML  # noqa: E402  (tests/reliability/conftest.py's path)


def _config(seeds=(0,)):
    raw = tomllib.loads(TINY_DIGITS_TOML)
    raw["seeds"] = list(seeds)
    raw["operators"] = raw["operators"][:1]
    return load_experiment_config(raw)


def _run(out, config=None, **kwargs):
    return run_experiment(config or _config(), out, progress=False, log=lambda m: None, **kwargs)


def _finals(results):
    return [(r.operator, r.seed, r.status, r.final) for r in results]


def _seed_callers_generators():
    torch.manual_seed(11)
    np.random.seed(12)
    random.seed(13)


def _callers_generators():
    return torch.get_rng_state(), np.random.get_state()[1].copy(), np.random.get_state()[2], random.getstate()


def _assert_same_generators(before):
    after = _callers_generators()
    assert torch.equal(before[0], after[0]), "torch's global generator changed"
    assert np.array_equal(before[1], after[1]) and before[2] == after[2], "NumPy's global generator changed"
    assert before[3] == after[3], "Python's random changed"


def _fit(out, **overrides):
    torch.manual_seed(0)
    model = TinyMLP()
    summary = Trainer(model, RegressionTask(), tiny_config(**overrides), out).fit()
    return summary["eval"]["loss"], [p.detach().clone() for p in model.parameters()]


# ---------------------------------------------------------------------------- the user's generators
def test_bug_run_experiment_puts_the_callers_generators_back(tmp_path):
    """Bug: ``run_experiment`` seeded Python's, NumPy's and torch's global generators with each run's seed (and drew
    from torch's building the models it checks) and left them there: after a notebook's ``torch.manual_seed(11)``, the
    cells after a comparison drew the last run's numbers, not their seed's. They are now put back on return, as
    they are by a run that reads its finished runs back (which also built, and drew)."""
    _seed_callers_generators()
    before = _callers_generators()
    first = _run(tmp_path / "a")
    _assert_same_generators(before)
    assert [r.status for r in first] == ["completed"]
    _run(tmp_path / "a")  # every run finished: read back
    _assert_same_generators(before)
    torch.manual_seed(5)  # the caller's streams do not reach the runs: each run seeds its own
    assert _finals(_run(tmp_path / "b")) == _finals(first)


def test_bug_trainer_fit_puts_the_callers_generators_back(tmp_path):
    """Bug: ``Trainer.fit`` seeded the global generators with ``config.seed`` and drew from them (dropout, the task's
    NumPy and Python jitter), and returned with them at the run's end: the caller's own ``torch.manual_seed`` stream
    was gone. They are now put back; the run itself still draws exactly what it drew (its weights are unchanged)."""
    clean_loss, clean_params = _fit(tmp_path / "a")
    torch.manual_seed(0)
    model = TinyMLP()
    _seed_callers_generators()
    before = _callers_generators()
    summary = Trainer(model, RegressionTask(), tiny_config(), tmp_path / "b").fit()
    _assert_same_generators(before)
    assert summary["eval"]["loss"] == clean_loss
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), clean_params))


@pytest.mark.parametrize("check", ["validate_experiment", "check_experiment"])
def test_bug_validating_a_config_does_not_draw_from_the_callers_generator(check):
    """Bug: ``validate_experiment`` / ``check_experiment`` built every run's model to check it, and each model's
    initialisation drew from torch's global generator: after ``torch.manual_seed(0)``, validating a config in a
    notebook cell changed the weights of the next model the user built."""
    from diffusionformer.models import create_model

    torch.manual_seed(0)
    reference = create_model("vit-digits", dim=8, depth=1, num_heads=2)
    torch.manual_seed(0)
    if check == "validate_experiment":
        assert validate_experiment(_config(), load_data=False) == []
    else:
        check_experiment(_config(), load_data=False)
    built = create_model("vit-digits", dim=8, depth=1, num_heads=2)
    assert all(torch.equal(a, b) for a, b in zip(built.state_dict().values(), reference.state_dict().values()))


def test_bug_load_run_does_not_draw_from_the_callers_generator(tmp_path, run_folder):
    """Bug: ``load_run`` built the run's model (an initialisation drawn from torch's global generator, then
    overwritten by the checkpoint's weights): loading a trained run in a notebook moved the user's seeded stream."""
    rdir, _ = run_folder(tmp_path / "r", dim=8)
    _seed_callers_generators()
    before = _callers_generators()
    load_run(rdir)
    _assert_same_generators(before)


def test_bug_preserve_rng_state_works_at_the_meta_default_device():
    """Bug: ``capture_rng_state`` made the Python generator's state with ``torch.tensor(...)`` at the caller's default
    device: inside ``with torch.device('meta')`` it was a meta tensor, and ``preserve_rng_state`` failed on exit
    with "Cannot copy out of meta tensor; no data!", the generators left advanced. The states are CPU tensors."""
    from diffusionformer.train import capture_rng_state, preserve_rng_state

    _seed_callers_generators()
    before = _callers_generators()
    with torch.device("meta"):
        state = capture_rng_state(torch.device("cpu"))
        with preserve_rng_state(torch.device("cpu")):
            torch.rand(3, device="cpu"), np.random.rand(), random.random()
    assert state["python"]["state"].device.type == "cpu"
    _assert_same_generators(before)


def test_bug_load_run_at_the_meta_default_device_loads_the_weights_to_map_location(tmp_path, run_folder):
    """Bug: ``load_run`` built the run's model at the caller's default device: at a notebook's
    ``torch.set_default_device('meta')`` (or inside ``with torch.device('meta')``) the checkpoint's weights were
    copied into meta parameters, a no-op with one torch warning per tensor, then it failed with "Tensor.item() cannot
    be called on meta tensors". The model is built on the CPU and goes to ``map_location`` as documented."""
    rdir, model = run_folder(tmp_path / "r", dim=8)
    with torch.device("meta"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # not one "copying ... to a meta parameter ... is a no-op"
            run = load_run(rdir)
    assert {p.device.type for p in run.model.parameters()} == {"cpu"}
    x = torch.rand(2, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(run.model(x), model(x))


# ---------------------------------------------------------------------------- grad and inference mode
def test_bug_trainer_fit_trains_when_the_caller_disabled_gradients(tmp_path):
    """Bug: after a notebook's ``torch.set_grad_enabled(False)`` (or inside ``torch.no_grad()``), ``Trainer.fit`` and
    ``run_experiment`` failed at step 0 with "task.loss: expected a loss that requires grad (computed from the model)",
    blaming the task. A training call now trains with gradients enabled (as evaluation runs under ``no_grad`` whatever
    the caller's mode) and gives the caller its grad mode back."""
    clean = _fit(tmp_path / "clean")
    torch.set_grad_enabled(False)
    try:
        loss, params = _fit(tmp_path / "off")
        assert not torch.is_grad_enabled()
        results = _run(tmp_path / "runs")
        assert not torch.is_grad_enabled()
    finally:
        torch.set_grad_enabled(True)
    assert loss == clean[0] and all(torch.equal(a, b) for a, b in zip(params, clean[1]))
    assert _finals(results) == _finals(_run(tmp_path / "runs-clean"))


@pytest.mark.parametrize("state", ["inference_mode", "meta"])
def test_bug_training_refuses_inference_mode_and_the_meta_default_device_by_name(tmp_path, state):
    """Bug: ``Trainer.fit`` inside ``torch.inference_mode()`` failed with "task.loss: expected a loss that requires
    grad" (blaming the task), and at the default device ``meta`` (``torch.set_default_device('meta')`` or a
    ``with torch.device('meta')`` block) with torch's "Cannot copy out of meta tensor; no data!";
    ``run_experiment`` there reported its dataset broken ("dataset 'digits' does not load: IndexError: index
    139808428991184 is out of bounds"). Both now say what is wrong, and the runner writes nothing."""
    torch.manual_seed(0)
    model, task = TinyMLP(), RegressionTask()
    ctx = torch.inference_mode() if state == "inference_mode" else torch.device("meta")
    match = r"inference_mode\(\)" if state == "inference_mode" else "default device that holds data, got 'meta'"
    with ctx:
        with pytest.raises(RuntimeError, match=rf"Trainer\.fit: expected .*{match}"):
            Trainer(model, task, tiny_config(), tmp_path / "fit").fit()
        with pytest.raises(RuntimeError, match=rf"run_experiment: expected .*{match}"):
            _run(tmp_path / "runs")
    assert not (tmp_path / "fit").exists() and not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------- default dtype
def test_bug_a_run_built_at_the_float64_default_is_not_read_back_as_the_configs_float32_run(tmp_path):
    """Bug: ``run_experiment`` at a notebook's ``torch.set_default_dtype(torch.float64)`` trained float64 models (the
    user's choice, followed) but recorded the identity of the config's float32 runs: a later ``run_experiment`` of
    the same config in a float32 process read the float64 run back as its own finished run (other numbers: loss
    2.30452 instead of 2.30415), and a seed trained at the other default was averaged with it in the table. The run
    now records ``"dtype": "float64"`` (float32 runs record none, keeping their identity), so either is refused by
    name."""
    torch.set_default_dtype(torch.float64)
    try:
        r64 = _run(tmp_path)
    finally:
        torch.set_default_dtype(torch.float32)
    rdir = tmp_path / "tiny" / "runs" / "digits" / "attention" / "seed0"
    assert json.loads((rdir / "run_config.json").read_text())["dtype"] == "float64"
    with pytest.raises(ValueError, match=r"different dtype \(float64 then float32: torch\.get_default_dtype\(\)"):
        _run(tmp_path)
    clean = _run(tmp_path / "clean")
    assert "dtype" not in json.loads((tmp_path / "clean" / "tiny" / "runs" / "digits" / "attention" / "seed0"
                                      / "run_config.json").read_text())
    assert r64[0].final["loss"] != clean[0].final["loss"]  # what the read-back passed off as the float32 run's
    # a second seed at the other default beside a finished one: not averaged with it
    torch.set_default_dtype(torch.float64)
    try:
        with pytest.raises(ValueError, match=r"seed0 holds a finished run .* different dtype"):
            _run(tmp_path / "clean", _config(seeds=(1,)))
    finally:
        torch.set_default_dtype(torch.float32)


def test_pins_float64_default_layers_match_float32_built_then_cast_layers():
    """Pin: a :class:`DiffusionAttention` built at the float64 default has float64 parameters and buffers only, and
    gives the same outputs, to the bit, as one built at float32 and cast with ``.double()`` (the float64 reference)."""
    from diffusionformer.nn import DiffusionAttention

    heads = ["attention", "heat(t=0.7)", "ppr", "polynomial"]
    torch.manual_seed(1)
    ref = DiffusionAttention(8, 4, heads=heads).double()
    torch.set_default_dtype(torch.float64)
    try:
        built = DiffusionAttention(8, 4, heads=heads)
    finally:
        torch.set_default_dtype(torch.float32)
    assert {t.dtype for t in [*built.parameters(), *built.buffers()] if t.is_floating_point()} == {torch.float64}
    built.load_state_dict(ref.state_dict())
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    assert torch.equal(built(x), ref(x))


# ---------------------------------------------------------------------------- flags that must not change a run
def _flag_states():
    def anomaly():
        torch.autograd.set_detect_anomaly(True)
        return lambda: torch.autograd.set_detect_anomaly(False)

    def deterministic(warn_only):
        def enter():
            torch.use_deterministic_algorithms(True, warn_only=warn_only)
            return lambda: torch.use_deterministic_algorithms(False)
        return enter

    def precision():
        torch.set_float32_matmul_precision("medium")
        return lambda: torch.set_float32_matmul_precision("highest")

    def errors():
        saved = warnings.filters[:]
        warnings.simplefilter("error")

        def exit_():
            warnings.filters[:] = saved
            warnings._filters_mutated()  # type: ignore[attr-defined]
        return exit_

    def printoptions():
        torch.set_printoptions(precision=1, sci_mode=True, threshold=3)
        return lambda: torch.set_printoptions(profile="default")

    def threads():
        before = torch.get_num_threads()
        torch.set_num_threads(2 if before == 1 else 1)
        return lambda: torch.set_num_threads(before)

    return {"anomaly": anomaly, "deterministic": deterministic(False), "deterministic-warn-only": deterministic(True),
            "matmul-precision-medium": precision, "warnings-error": errors, "printoptions": printoptions,
            "threads": threads}


def _global_flags():
    return (torch.is_anomaly_enabled(), torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(), torch.get_float32_matmul_precision(),
            torch.get_num_threads(), torch.get_default_dtype(), torch.is_grad_enabled(), len(warnings.filters),
            torch._tensor_str.PRINT_OPTS.precision)


@pytest.mark.parametrize("name", list(_flag_states()))
def test_pins_a_run_under_a_callers_global_flag_is_the_clean_run_and_leaves_the_flag(tmp_path, name):
    """Pin: anomaly detection, deterministic algorithms (also ``warn_only``), warnings turned into errors and print
    options give the clean run's numbers to the bit (nothing warns in a clean run, so nothing raises);
    ``set_float32_matmul_precision('medium')`` (bfloat16 matmuls where the CPU has them) and another thread count (other
    summation orders) the clean run's numbers up to rounding. Each flag is the caller's again afterwards (the runner
    changes none of them: only the command line sets the thread count, as tests/experiments pins)."""
    clean = _finals(_run(tmp_path / "clean"))
    exit_ = _flag_states()[name]()
    try:
        flags = _global_flags()
        results = _finals(_run(tmp_path / "flag"))
        assert _global_flags() == flags
    finally:
        exit_()
    if name in ("matmul-precision-medium", "threads"):
        assert [r[:3] for r in results] == [r[:3] for r in clean]
        assert results[0][3]["loss"] == pytest.approx(clean[0][3]["loss"], rel=1e-2)
    else:
        assert results == clean
