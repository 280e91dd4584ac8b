"""CSV and TensorBoard metrics writers beside metrics.jsonl."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
from train_tiny_tasks import RegressionTask, SimulatedKill, TinyMLP, tiny_config

from diffusionformer.train import (
    CSVLog,
    MetricsLog,
    Trainer,
    TrainConfig,
    open_loggers,
    read_metrics,
    read_metrics_csv,
    seed_everything,
)

HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


def _fit(out, task=None, resume=False, **overrides):
    seed_everything(0)
    cfg = tiny_config(**overrides)
    return Trainer(TinyMLP(), task or RegressionTask(), cfg, out, resume=resume).fit()


def test_csv_round_trips_the_jsonl_records(tmp_path):
    _fit(tmp_path, loggers=["jsonl", "csv"])
    records = read_metrics(tmp_path)
    assert len(records) == 12  # 10 train + 2 eval
    assert read_metrics_csv(tmp_path / "metrics.csv") == records
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header == ["step", "split", "loss", "lr", "elapsed", "time", "metrics.grad_norm", "metrics.loss",
                      "metrics.mae", "metrics.n", "metrics.one"]


def test_csv_is_cut_back_on_resume(tmp_path):
    with pytest.raises(SimulatedKill):
        _fit(tmp_path, task=RegressionTask(fail_at=7), loggers=["jsonl", "csv"])
    # the checkpoint is at step 6; rows 7.. would be replayed
    _fit(tmp_path, resume=True, loggers=["jsonl", "csv"])
    rows = read_metrics_csv(tmp_path)
    assert [r["step"] for r in rows if r["split"] == "train"] == list(range(1, 11))
    assert rows == read_metrics(tmp_path)


def test_csv_widens_its_header_for_new_metrics(tmp_path):
    log = CSVLog(tmp_path / "m.csv")
    log.append({"step": 1, "split": "train", "loss": 1.5, "lr": 0.1, "metrics": {"b": 2.0}, "elapsed": 1.0,
                "time": 9.0})
    log.append({"step": 2, "split": "eval", "loss": float("nan"), "lr": 0.1, "metrics": {"a": 0.25},
                "elapsed": 2.0, "time": 10.0})
    log.append({"step": 3, "split": "train", "loss": 0.1 + 0.2, "lr": 0.05, "metrics": {"b": 1e-300},
                "elapsed": 3.0, "time": 11.0})
    text = (tmp_path / "m.csv").read_text().splitlines()
    assert text[0] == "step,split,loss,lr,elapsed,time,metrics.a,metrics.b"
    rows = read_metrics_csv(tmp_path / "m.csv")
    assert [r["metrics"] for r in rows] == [{"b": 2.0}, {"a": 0.25}, {"b": 1e-300}]
    assert rows[1]["loss"] is None  # non-finite -> empty cell, as JSON's null
    assert rows[2]["loss"] == 0.1 + 0.2  # floats round-trip exactly
    assert log.truncate(1) == 2 and [r["step"] for r in read_metrics_csv(tmp_path / "m.csv")] == [1]
    # a new writer on the same file (a resumed run) keeps the header and appends
    CSVLog(tmp_path / "m.csv").append({"step": 2, "split": "train", "loss": 1.0, "lr": 0.1, "metrics": {"a": 3.0},
                                       "elapsed": 4.0, "time": 12.0})
    assert [r["metrics"] for r in read_metrics_csv(tmp_path / "m.csv")] == [{"b": 2.0}, {"a": 3.0}]


def test_a_line_that_is_not_utf8_is_skipped_like_a_malformed_line(tmp_path):
    """Bug: one metrics.jsonl line with bytes that are not UTF-8 (a damaged disk block) made
    ``read_metrics`` and the resume's ``MetricsLog.truncate`` fail with a bare ``UnicodeDecodeError``
    naming no file; it is now skipped with the malformed-line warning and every other record kept."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "split": "train"}\n\xff\xfe{"step": 2}\n{"step": 3, "split": "eval"}\n')
    with pytest.warns(UserWarning, match=r"metrics.jsonl:2: skipping a malformed metrics line"):
        assert read_metrics(tmp_path) == [{"step": 1, "split": "train"}, {"step": 3, "split": "eval"}]
    with pytest.warns(UserWarning, match=r"metrics.jsonl:2:"):
        assert MetricsLog(path).truncate(1) == 1
    assert path.read_text(encoding="utf-8") == '{"step": 1, "split": "train"}\n'


@pytest.mark.parametrize("line", ['{"split": "eval", "metrics": {"val_acc": 0.9}}',
                                  '{"step": "20", "split": "eval", "metrics": {}}',
                                  '{"step": true, "split": "eval", "metrics": {}}',
                                  '{"step": 20, "metrics": {}}',
                                  '{"step": 20, "split": "eval", "metrics": null}',
                                  '[20, "eval"]'],
                         ids=["no-step", "string-step", "bool-step", "no-split", "null-metrics", "a-list"])
def test_a_line_that_is_not_a_metrics_record_is_skipped_with_a_warning(tmp_path, line):
    """Bug: a JSON line without an integer step, a split or a metrics mapping (a hand-edited or damaged
    log) was returned by ``read_metrics``, and the experiment readers built on it (``select_evaluation``,
    ``first_reach``, the gap and curve plots) failed on it with a bare ``KeyError``, ``ValueError`` or
    ``AttributeError``; such a line is now skipped with a warning naming the file and line."""
    good = ['{"step": 10, "split": "eval", "metrics": {"val_acc": 0.5}}', '{"step": 30, "split": "train"}']
    (tmp_path / "metrics.jsonl").write_text("\n".join([good[0], line, good[1]]) + "\n")
    with pytest.warns(UserWarning, match=r"metrics\.jsonl:2: skipping a line that is not a metrics record"):
        records = read_metrics(tmp_path)
    assert records == [{"step": 10, "split": "eval", "metrics": {"val_acc": 0.5}}, {"step": 30, "split": "train"}]


def test_a_damaged_csv_is_a_clear_error_to_read_and_no_obstacle_to_resume(tmp_path):
    """Bug: ``read_metrics_csv`` on a row that is not a metrics row raised a bare ``ValueError``
    ("could not convert string to float") or ``TypeError`` naming no file, and on bytes that are not
    UTF-8 a bare ``UnicodeDecodeError``, which also stopped ``CSVLog.truncate`` (the resume). Reading
    now names the file and line; the resume reads a damaged byte as U+FFFD and drops a row it spoils."""
    path = tmp_path / "metrics.csv"
    header = "step,split,loss,lr,elapsed,time\n"
    path.write_text(header + "1,train,0.5,0.1,1.0,2.0\n2,train,zero,0.1,1.0,2.0\n")
    with pytest.raises(ValueError, match=r"metrics\.csv:3: not a metrics row \(ValueError"):
        read_metrics_csv(path)
    path.write_text(header + "1,train,0.5\n")  # a short row: the missing cells read as None
    with pytest.raises(ValueError, match=r"metrics\.csv:2: not a metrics row \(TypeError"):
        read_metrics_csv(path)
    path.write_bytes(header.encode() + b"1,train,0.5,0.1,1.0,2.0\n\xff2,train,0.5,0.1,1.0,2.0\n"
                     b"3,eval,0.25,0.1,1.0,2.0\n")
    with pytest.raises(ValueError, match=r"metrics\.csv: not UTF-8 text"):
        read_metrics_csv(path)
    assert CSVLog(path).truncate(3) == 1  # the row whose step the byte spoiled
    assert [r["step"] for r in read_metrics_csv(path)] == [1, 3]


def test_inactive_writers_write_nothing(tmp_path):
    log = open_loggers(["jsonl", "csv", "tensorboard"], tmp_path, active=False)
    log.append({"step": 1, "split": "train", "loss": 1.0, "lr": 0.1, "metrics": {}, "elapsed": 0.0, "time": 0.0})
    log.close()
    assert list(tmp_path.iterdir()) == []


def test_loggers_config_validation_and_round_trip():
    cfg = TrainConfig.from_dict({"loggers": ["jsonl", "csv"]})
    assert cfg.loggers == ("jsonl", "csv") and cfg.to_dict()["loggers"] == ["jsonl", "csv"]
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"including 'jsonl'.*got \['csv'\]"):
        TrainConfig(loggers=["csv"])
    with pytest.raises(ValueError, match=r"got \['jsonl', 'wandb'\]"):
        TrainConfig(loggers=["jsonl", "wandb"])
    with pytest.raises(ValueError, match="distinct"):
        TrainConfig(loggers=["jsonl", "jsonl"])
    with pytest.raises(TypeError, match="expected a list of names"):
        TrainConfig(loggers="jsonl,csv")


def test_tensorboard_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    with pytest.raises(ModuleNotFoundError, match="pip install tensorboard"):
        _fit(tmp_path, loggers=["jsonl", "tensorboard"])
    assert not (tmp_path / "metrics.jsonl").exists()  # failed before training


class _FakeWriter:
    instances: list[_FakeWriter] = []

    def __init__(self, log_dir: str, purge_step: int | None = None) -> None:
        self.log_dir, self.purge_step, self.scalars, self.closed = log_dir, purge_step, [], False
        _FakeWriter.instances.append(self)

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        self.scalars.append((tag, value, global_step))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_tensorboard_writer_calls_with_a_stand_in_summary_writer(tmp_path, monkeypatch):
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = _FakeWriter  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    _FakeWriter.instances.clear()
    with pytest.raises(SimulatedKill):
        _fit(tmp_path, task=RegressionTask(fail_at=7), loggers=["jsonl", "tensorboard"])
    _fit(tmp_path, resume=True, loggers=["jsonl", "tensorboard"])
    first, second = _FakeWriter.instances
    assert first.log_dir == str(tmp_path / "tensorboard") and first.closed and second.closed
    assert first.purge_step is None and second.purge_step == 7  # events after the checkpoint (6) go
    records = read_metrics(tmp_path)
    expected = set()
    for r in records:
        expected |= {(f"{r['split']}/loss", r["loss"], r["step"]), (f"{r['split']}/lr", r["lr"], r["step"])}
        expected |= {(f"{r['split']}/{k}", v, r["step"]) for k, v in r["metrics"].items() if k != "loss"}
    written = {s for s in second.scalars} | {s for s in first.scalars if s[2] <= 6}
    assert written == expected


@pytest.mark.skipif(not HAS_TENSORBOARD, reason="the optional tensorboard package is not installed")
def test_tensorboard_event_files(tmp_path):  # pragma: no cover - needs tensorboard
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _fit(tmp_path, loggers=["jsonl", "tensorboard"])
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    losses = [e.value for e in acc.Scalars("train/loss")]
    assert losses == pytest.approx([r["loss"] for r in read_metrics(tmp_path) if r["split"] == "train"])


def test_loggers_and_accumulation_are_selectable_in_an_experiment_toml(tmp_path):
    from diffusionformer.experiments.config import load_experiment_config, train_config

    path = tmp_path / "exp.toml"
    path.write_text(
        'name = "demo"\nseeds = [0]\n[[operators]]\nname = "attention"\n'
        '[[tasks]]\nname = "t"\ndataset = "csbm"\nmodel = "graph-node-small"\n'
        '[tasks.train]\nmax_steps = 4\ngrad_accum_steps = 2\namp = "fp16"\nloggers = ["jsonl", "csv", "tensorboard"]\n'
    )
    cfg = load_experiment_config(path)
    tc = train_config(cfg.tasks[0], seed=0)
    assert tc.loggers == ("jsonl", "csv", "tensorboard") and tc.grad_accum_steps == 2 and tc.amp == "fp16"
