"""Edge-case probes of ``diffusionformer.train``'s building blocks: optim, schedule, checkpoint,
rng, metrics, loggers, config (and the trainer's resume of a doctored checkpoint).

Probed: damaged, truncated, hostile and foreign checkpoint files; a checkpoint holding types that
``weights_only`` refuses; non-finite parameters in a checkpoint; NaN/inf/NumPy values in the metrics
writers; CSV rows with extra cells; logger names given as a string, twice or misspelt; numbers beyond
the float range in ``TrainConfig``; case-only typos of config keys and devices; NaN steps and
negative warm-up in ``cosine_lr``; NumPy seeds; wrong argument types for the optimizer and RNG helpers.

Found and fixed (tests whose docstring starts with "Bug:"):

* ``load_checkpoint`` loaded a file whose tensor bytes had changed on disk (one flipped byte) without
  a word: ``torch.load`` does not check the zip CRC-32s, so corrupt weights trained on.
* a checkpoint holding a type ``weights_only`` refuses (a NumPy array from ``get_extra_state``) was
  called "truncated, corrupt ... Delete it": the advice loses an intact file.
* resuming from a checkpoint with NaN parameters ended in ``NonFiniteLossError`` calling that file
  "the last good checkpoint".
* ``read_metrics_csv`` on a row with more cells than the header raised a bare ``AttributeError``.
* ``open_loggers("jsonl", d)`` said "got 'j'"; ``["jsonl", "jsonl"]`` wrote every record twice;
  a misspelt name had no "did you mean".
* ``MetricsLog.append`` of NumPy scalars: "Object of type float32 is not JSON serializable".
* ``TrainConfig(lr=10**400)``: a bare ``OverflowError``; ``from_dict({"LR": ...})`` and
  ``device="CPU"`` had no "did you mean".
* ``cosine_lr(nan, ...)`` returned NaN; a negative ``warmup_steps`` gave a schedule without a peak.
* ``param_groups(model.parameters(), ...)``, ``build_optimizer(..., "cpu")`` / a dict config,
  ``capture_rng_state("cpu")``: bare ``AttributeError``; ``restore_rng_state({})``: bare ``KeyError``.
* ``seed_everything(np.int64(3))`` was refused although ``TrainConfig.seed`` takes NumPy ints.
"""

from __future__ import annotations

import math
import random
import zipfile

import numpy as np
import pytest
import torch
from torch import nn
from train_tiny_tasks import RegressionTask, TinyMLP, tiny_config

from diffusionformer.train import (
    CheckpointError,
    MetricsLog,
    Trainer,
    TrainConfig,
    build_optimizer,
    capture_rng_state,
    cosine_lr,
    open_loggers,
    param_groups,
    read_metrics,
    read_metrics_csv,
    restore_rng_state,
    save_checkpoint,
    seed_everything,
)
from diffusionformer.train.checkpoint import CHECKPOINT_FORMAT, load_checkpoint
from diffusionformer.train.loggers import CSVLog

CPU = torch.device("cpu")


def _payload(**extra):
    return {"format": CHECKPOINT_FORMAT, "step": 1, "model": {"w": torch.arange(256.0)},
            "optimizer": {"state": {}, "param_groups": []}, "rng": {}, "config": {}, **extra}


def _record(step, **kw):
    return {"step": step, "split": "train", "loss": 0.5, "lr": 0.1, "metrics": {}, "elapsed": 1.0,
            "time": 2.0, **kw}


# ----------------------------------------------------------------------------- checkpoint
def test_a_flipped_byte_in_tensor_data_is_a_checkpoint_error(tmp_path):
    """Bug: one byte of a saved tensor changed on disk (bit rot, a bad copy) loaded silently as other
    numbers: torch.load does not check the zip's CRC-32s. Now a CheckpointError names the entry."""
    path = save_checkpoint(tmp_path / "c.pt", _payload())
    raw = bytearray(path.read_bytes())
    at = raw.find(torch.arange(256.0).numpy().tobytes())
    assert at > 0
    raw[at + 100] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"is corrupt: its entry 'archive/data/0' fails its CRC-32 check"):
        load_checkpoint(path)
    assert path.read_bytes() == bytes(raw)


def test_a_checkpoint_saved_without_crcs_still_loads(tmp_path):
    """Pins: torch.serialization.set_crc32_options(False) writes CRC 0; such files are not called corrupt."""
    assert torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        path = save_checkpoint(tmp_path / "c.pt", _payload())
    finally:
        torch.serialization.set_crc32_options(True)
    assert {info.CRC for info in zipfile.ZipFile(path).infolist()} == {0}
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.arange(256.0))


def test_a_type_that_weights_only_refuses_is_not_called_damage(tmp_path):
    """Bug: a checkpoint holding a NumPy array (a module's get_extra_state) was "unreadable: truncated,
    corrupt ... Delete it (or resume from another copy)": the advice deletes an intact file."""
    path = save_checkpoint(tmp_path / "c.pt", _payload(model={"w": torch.ones(2), "_extra_state": np.arange(3)}))
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match=r"is unreadable: it holds objects .* refuses \(.*Unsupported global.*\); not damage") as info:
        load_checkpoint(path)
    assert "Delete it" not in str(info.value) and "add_safe_globals" in str(info.value)
    assert path.read_bytes() == before


def test_resuming_from_a_checkpoint_with_nan_parameters_is_a_checkpoint_error(tmp_path):
    """Bug: a checkpoint holding NaN weights resumed, then failed with NonFiniteLossError saying "the last
    good checkpoint .../bad.pt (step 2) was kept" about the file that was the cause."""
    torch.manual_seed(0)
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=2, lr_decay_steps=4), tmp_path / "a").fit()
    payload = load_checkpoint(tmp_path / "a" / "checkpoint.pt")
    payload["model"]["fc1.weight"][0, 0] = float("nan")
    bad = save_checkpoint(tmp_path / "bad.pt", payload)
    trainer = Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=4, lr_decay_steps=4), tmp_path / "b",
                      resume=bad)
    with pytest.raises(CheckpointError, match=r"expected finite parameters .*got NaN or inf in \['fc1.weight'\]"):
        trainer.fit()
    assert not (tmp_path / "b" / "checkpoint.pt").exists()


# ----------------------------------------------------------------------------- loggers / metrics
def test_a_csv_row_with_more_cells_than_the_header_is_named(tmp_path):
    """Bug: read_metrics_csv raised a bare AttributeError ('NoneType' object has no attribute 'startswith')."""
    path = tmp_path / "metrics.csv"
    path.write_text("step,split,loss,lr,elapsed,time\n1,train,0.5,0.1,1,2\n2,train,0.5,0.1,1,2,extra\n")
    with pytest.raises(ValueError, match=r"metrics\.csv:3: not a metrics row .*1 more cell\(s\) than the header"):
        read_metrics_csv(path)


@pytest.mark.parametrize("names, error, match", [
    ("jsonl", TypeError, r"got the str 'jsonl'"),
    (["jsonl", "csv", "jsonl"], ValueError, r"expected distinct names, got \['jsonl'\] more than once"),
    (["jsonl", "cvs"], ValueError, r"got 'cvs' \(did you mean 'csv'\?\)"),
])
def test_open_loggers_refuses_a_string_repeats_and_names_a_typo(tmp_path, names, error, match):
    """Bug: a str was read letter by letter ("got 'j'"), a repeated "jsonl" wrote every record twice
    into metrics.jsonl, and a misspelt name had no "did you mean"."""
    with pytest.raises(error, match=match):
        open_loggers(names, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_numpy_scalars_are_written_to_the_jsonl_log(tmp_path):
    """Bug: MetricsLog.append of np.float32 / np.int64 values raised "Object of type float32 is not JSON
    serializable" (the CSV writer beside it took them); a NumPy NaN is null like a Python one."""
    log = MetricsLog(tmp_path / "m.jsonl")
    log.append(_record(np.int64(3), loss=np.float32(0.5), lr=np.float32("nan"), metrics={"a": np.float16(2)}))
    log.close()
    assert read_metrics(tmp_path / "m.jsonl") == [_record(3, lr=None, metrics={"a": 2.0})]


def test_non_finite_values_and_non_str_metric_names_survive_reopen_and_append(tmp_path):
    """Pins: NaN/inf are empty cells / null, metric names are str, a second writer on the same files
    appends (widening the CSV header) and both logs read back the same records."""
    group = open_loggers(["jsonl", "csv"], tmp_path)
    group.append(_record(1, loss=float("nan"), lr=float("inf"), metrics={1: 2.0, "a,b\n": -0.0}))
    group.close()
    group = open_loggers(["jsonl", "csv"], tmp_path)
    group.append(_record(2, metrics={"new": 3}))
    group.close()
    expected = [_record(1, loss=None, lr=None, metrics={"1": 2.0, "a,b\n": -0.0}), _record(2, metrics={"new": 3.0})]
    assert read_metrics(tmp_path) == read_metrics_csv(tmp_path) == expected
    assert math.copysign(1.0, read_metrics_csv(tmp_path)[0]["metrics"]["a,b\n"]) == -1.0
    assert CSVLog(tmp_path / "metrics.csv").truncate(1) == 1


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize("field", ["lr", "weight_decay", "grad_clip"])
def test_an_int_beyond_the_float_range_is_a_value_error(field):
    """Bug: TrainConfig(lr=10**400) raised float()'s bare "OverflowError: int too large to convert to float"."""
    with pytest.raises(ValueError, match=rf"TrainConfig\.{field}: expected a finite float, got int beyond"):
        TrainConfig(**{field: 10**400})


def test_case_only_typos_get_a_did_you_mean():
    """Bug: from_dict({"LR": ...}) and device="CPU" listed the choices without "did you mean" (the
    close-match search was case-sensitive, so an upper-case spelling matched nothing)."""
    with pytest.raises(ValueError, match=r"unknown TrainConfig key 'LR' \(did you mean 'lr'\?\)"):
        TrainConfig.from_dict({"LR": 1e-3})
    with pytest.raises(ValueError, match=r"got 'CPU' \(did you mean 'cpu'\?\)"):
        TrainConfig(device="CPU")


def test_numpy_values_round_trip_through_to_dict():
    """Pins: NumPy numbers are stored as the Python numbers they equal, and to_dict/from_dict round-trip."""
    cfg = TrainConfig(max_steps=np.int64(7), lr=np.float32(0.5), betas=np.array([0.5, 0.25]), seed=np.uint32(2**32 - 1),
                      loggers=["jsonl", "csv"])
    assert (type(cfg.max_steps), type(cfg.lr), cfg.betas, cfg.seed) == (int, float, (0.5, 0.25), 2**32 - 1)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg and hash(TrainConfig.from_dict(cfg.to_dict())) == hash(cfg)


# ----------------------------------------------------------------------------- schedule
def test_cosine_lr_against_hand_values():
    """Pins: W=2, D=6: lr (s+1)/3 in the warm-up, the peak at s=W, the midpoint at s=4, the floor from s=D;
    W=D=3: the warm-up then the floor."""
    got = [cosine_lr(s, lr=2.0, min_lr=0.5, warmup_steps=2, decay_steps=6) for s in range(8)]
    expected = [2 / 3, 4 / 3, 2.0, 0.5 + 0.75 * (1 + math.sqrt(0.5)), 1.25, 0.5 + 0.75 * (1 - math.sqrt(0.5)), 0.5, 0.5]
    assert got == pytest.approx(expected, abs=1e-15)
    assert [cosine_lr(s, lr=1.0, min_lr=0.0, warmup_steps=3, decay_steps=3) for s in range(5)] == [0.25, 0.5, 0.75, 0, 0]


@pytest.mark.parametrize("kwargs, match", [
    (dict(step=float("nan")), r"expected step >= 0, got nan"),
    (dict(step=0, warmup_steps=-2), r"expected warmup_steps >= 0, got -2"),
])
def test_cosine_lr_refuses_a_nan_step_and_a_negative_warmup(kwargs, match):
    """Bug: cosine_lr(nan, ...) fell through every branch and returned a NaN learning rate; warmup_steps=-2
    gave 0.65, 0.35, ... (a decay that starts before step 0, never reaching lr)."""
    args = dict(lr=1.0, min_lr=0.0, warmup_steps=2, decay_steps=3) | kwargs
    with pytest.raises(ValueError, match=match):
        cosine_lr(args.pop("step"), **args)


# ----------------------------------------------------------------------------- optim / rng argument types
@pytest.mark.parametrize("call, match", [
    (lambda: param_groups(nn.Linear(2, 2).parameters(), 0.1), r"param_groups: expected model to be an nn.Module, got generator"),
    (lambda: build_optimizer(nn.Linear(2, 2), TrainConfig(), "cpu"), r"build_optimizer: expected device to be a torch.device"),
    (lambda: build_optimizer(nn.Linear(2, 2), {"lr": 1e-3}, CPU), r"build_optimizer: expected config to be a TrainConfig, got dict"),
    (lambda: capture_rng_state("cpu"), r"capture_rng_state: expected device to be a torch.device .*got str \('cpu'\)"),
])
def test_wrong_argument_types_are_named(call, match):
    """Bug: each raised a bare AttributeError ("'generator' object has no attribute 'modules'", "'str' object
    has no attribute 'type'", "'dict' object has no attribute 'weight_decay'") naming no argument."""
    with pytest.raises(TypeError, match=match):
        call()


def test_restore_rng_state_of_a_foreign_dict_is_a_value_error():
    """Bug: restore_rng_state({}, cpu) raised a bare KeyError: 'python'."""
    with pytest.raises(ValueError, match=r"expected a state from capture_rng_state, got a dict without \['python'"):
        restore_rng_state({}, CPU)


def test_seed_everything_takes_a_numpy_int():
    """Bug: seed_everything(np.int64(3)) was "expected an int in [0, 2**32), got np.int64(3)" although
    TrainConfig.seed takes NumPy ints (a sweep grid's); it now seeds as seed_everything(3)."""
    seed_everything(3)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    seed_everything(np.int64(3))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    with pytest.raises(ValueError, match="expected an int in"):
        seed_everything(np.float64(3.0))


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    """Pins: every generator (with NumPy's and Python's cached Gaussians) continues identically after
    capture -> torch.save -> torch.load(weights_only=True) -> restore."""
    g = torch.Generator().manual_seed(5)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.gauss(0, 1), np.random.randn()  # leave a cached Gaussian in each
    torch.save(capture_rng_state(CPU, g), tmp_path / "rng.pt")

    def draw():
        return (random.gauss(0, 1), np.random.randn(), torch.rand(2).tolist(), torch.rand(2, generator=g).tolist())

    expected = draw()
    restore_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True), CPU, g)
    assert draw() == expected


def test_tensorboard_log_writes_numpy_scalars_like_the_other_logs(tmp_path):
    """Bug: ``TensorBoardLog.append`` dropped NumPy scalars (``np.float32`` accuracy, ``np.int64`` count) without a
    word, while the jsonl and csv logs write them: TensorBoard lacked curves the other logs had. A NumPy bool and a
    non-finite value stay out, as a Python bool and NaN do."""
    from diffusionformer.train import TensorBoardLog

    class _Writer:
        def __init__(self):
            self.scalars = []

        def add_scalar(self, tag, value, global_step):
            self.scalars.append((tag, value, global_step))

        def flush(self):
            pass

    log = TensorBoardLog(tmp_path / "tb", active=False)  # no tensorboard here: a stand-in writer
    log.active, log._writer = True, _Writer()
    log.append({"split": "eval", "step": 3, "loss": np.float64(0.5), "lr": None,
                "metrics": {"acc": np.float32(0.25), "n": np.int64(7), "flag": np.bool_(True), "bad": np.float32("nan")}})
    assert log._writer.scalars == [("eval/loss", 0.5, 3), ("eval/acc", 0.25, 3), ("eval/n", 7.0, 3)]
