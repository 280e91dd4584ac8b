"""Review 60t: ``metrics.csv`` through resumes (``LogGroup.truncate`` / ``CSVLog._refill``) and
``experiments._metrics.full_graph_metrics``.

A property over random sequences of Trainer segments (loggers with or without ``"csv"``, log and evaluation
intervals, killed in an update or finished, one ``metrics.jsonl`` line damaged or none): the final table holds the
final log's records and, beside them, exactly the records of damaged lines that a segment with the table on wrote
(the table's copy was the only one left), in the order they were written.
"""

from __future__ import annotations

import importlib.util
import json
import math
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diffusionformer.data import load_dataset
from diffusionformer.train import load_checkpoint, read_metrics, read_metrics_csv

_spec = importlib.util.spec_from_file_location("_resume_matrix_60t",
                                               Path(__file__).with_name("test_edge_probes_resume_matrix.py"))
_matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_matrix)  # its tiny tasks, config and killing task (imported, not collected)

_MAX_STEPS = 6


@pytest.fixture(scope="module")
def data():
    return {"karate": load_dataset("karate", seed=0)}


def _as_csv_reads(record):
    """A log record as ``read_metrics_csv`` gives it back (numbers as floats, non-numbers left out)."""
    number = (lambda v: None if v is None else float(v))
    metrics = {k: float(v) for k, v in (record.get("metrics") or {}).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {"step": int(record["step"]), "split": record["split"], "loss": number(record.get("loss")),
            "lr": number(record.get("lr")), "metrics": metrics, "elapsed": number(record.get("elapsed")),
            "time": number(record.get("time"))}


def _run_segments(out, d, segments):
    """Run ``segments``; return the records of damaged lines whose row the table must keep."""
    in_table = {}  # a record's time -> whether the CSV table got its row (written with the table on, or
    # copied from the log by a resume with the table on while its line was sound)
    pending = []  # damaged records of segments with the table on, not yet past a resume's cut
    kept = []
    for i, (csv_on, log_interval, eval_interval, kill_at, damage) in enumerate(segments):
        start = load_checkpoint(out / "checkpoint.pt")["step"] if (out / "checkpoint.pt").exists() else 0
        kept += [r for r in pending if r["step"] <= start]  # a damaged line past the checkpoint is cut anyway
        pending = []
        path = out / "metrics.jsonl"
        if csv_on and i > 0:  # the resume writes the table again from the log
            for line in path.read_bytes().splitlines() if path.exists() else []:
                if line.startswith(b"{") and line.endswith(b"}"):
                    in_table[json.loads(line)["time"]] = True
        config = _matrix._config(max_steps=_MAX_STEPS, lr_decay_steps=_MAX_STEPS, checkpoint_interval=2,
                                 log_interval=log_interval, eval_interval=eval_interval,
                                 loggers=("jsonl", "csv") if csv_on else ("jsonl",))
        _matrix._fit("gcn-node", d, out, config, resume=i > 0, at_step=kill_at)
        lines = path.read_bytes().splitlines(keepends=True) if path.exists() else []
        for line in lines:
            in_table.setdefault(json.loads(line)["time"], csv_on)
        if damage is not None and lines:
            j = damage % len(lines)
            record = json.loads(lines[j])
            lines[j] = lines[j][:12] + b"\n"  # no longer JSON
            path.write_bytes(b"".join(lines))
            if in_table[record["time"]]:
                pending.append(record)
    return kept + pending  # after the last segment no resume cuts: its damaged row stays


_SEGMENT = st.tuples(st.booleans(), st.sampled_from([1, 2, 4]), st.sampled_from([0, 2, 3]),
                     st.sampled_from([None, 2, 3, 4, 5, 6]), st.one_of(st.none(), st.integers(0, 20)))


@settings(max_examples=25, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(segments=st.lists(_SEGMENT, min_size=1, max_size=4))
def test_the_csv_table_is_the_log_plus_the_rows_of_its_damaged_lines_over_random_resumes(tmp_path_factory, data,
                                                                                           segments):
    *rest, (_, log_interval, eval_interval, _, damage) = segments
    segments = [*rest, (True, log_interval, eval_interval, None, damage)]  # the last: the table on, to the end
    out = tmp_path_factory.mktemp("run")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # damaged lines are skipped with a warning
        damaged = _run_segments(out, data, segments)
        log = [_as_csv_reads(r) for r in read_metrics(out)]
    expected = sorted(log + [_as_csv_reads(r) for r in damaged], key=lambda r: r["time"])
    assert [r["time"] for r in log] == sorted(r["time"] for r in log)  # the log in the order it was written
    assert read_metrics_csv(out) == expected, segments


def _record(step, split="train", segment=0):
    return {"step": step, "split": split, "loss": 1.0 / step, "lr": 0.1, "metrics": {"acc": step / 8},
            "elapsed": float(step), "time": 100.0 + 1000 * segment + step}


def test_bug_the_row_of_a_damaged_last_line_is_kept_when_the_log_goes_on_without_the_table(tmp_path):
    """Bug: a run logged steps 1 to 4 with the table on (checkpoint at 4), went on to 6 with it off, and its log's
    line of step 4 was damaged; resumed with the table on, ``_refill`` dropped the table's row of step 4 (the only
    copy of that record left): no row followed it in the table, which it read as a killed segment's row left in a
    table off at a resume. Now a table off at a resume is cut back to the checkpoint as the log is, so every row the
    log lacks is a damaged line's and is kept."""
    from diffusionformer.train.loggers import open_loggers

    log = open_loggers(["jsonl", "csv"], tmp_path)
    for step in range(1, 5):
        log.append(_record(step))
    log.close()
    log = open_loggers(["jsonl"], tmp_path)  # resumed at 4 with the table off, to the end
    log.truncate(4)
    for step in (5, 6):
        log.append(_record(step, segment=1))
    log.close()
    path = tmp_path / "metrics.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3][:12] + b"\n"  # step 4's line damaged
    path.write_bytes(b"".join(lines))
    log = open_loggers(["jsonl", "csv"], tmp_path)
    with pytest.warns(UserWarning, match="skipping a malformed metrics line"):
        log.truncate(6)
    log.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 5, 6]
    assert [(r["step"], r["time"]) for r in read_metrics_csv(tmp_path)] == \
        [(1, 101.0), (2, 102.0), (3, 103.0), (4, 104.0), (5, 1105.0), (6, 1106.0)]


def test_a_table_off_at_a_resume_is_cut_back_to_the_checkpoint(tmp_path):
    """The run's ``metrics.csv``, not written by a resume (``"csv"`` dropped from ``loggers``), loses the killed
    segment's rows past the checkpoint as the log does (the steps replayed are never in it twice)."""
    from diffusionformer.train.loggers import open_loggers

    log = open_loggers(["jsonl", "csv"], tmp_path)
    for step in range(1, 7):  # killed after step 6; the checkpoint is at step 4
        log.append(_record(step))
    log.close()
    log = open_loggers(["jsonl"], tmp_path)
    log.truncate(4)
    log.close()
    assert [r["step"] for r in read_metrics_csv(tmp_path)] == [1, 2, 3, 4]


class _Logits(torch.nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.logits = logits

    def forward(self, x, edge_index):
        return self.logits + self.weight


def _node_data(n=500):
    from torch_geometric.data import Data

    from diffusionformer.data.base import NodeData

    every = torch.ones(n, dtype=torch.bool)
    graph = Data(x=torch.zeros(n, 1), edge_index=torch.zeros(2, 0, dtype=torch.long),
                 y=torch.zeros(n, dtype=torch.long), train_mask=every, val_mask=every.clone(), test_mask=every.clone())
    return NodeData(name="t", data=graph, num_classes=2, num_features=1, kind="node")


def test_pins_full_graph_metrics_exact_fractions_nan_for_an_empty_split_and_index_masks():
    """350 of 500 right is 0.7 exactly (float32's mean read 0.699999988); a split emptied after the dataset was built
    reads NaN loss and accuracy, without a warning or an error; a split given as node ids counts its ids (the old
    ``int(mask.sum())`` summed them)."""
    from diffusionformer.experiments._metrics import full_graph_metrics

    logits = torch.zeros(500, 2)
    logits[:350, 0] = 1.0
    logits[350:, 1] = 1.0
    data = _node_data()
    data.data.test_mask = torch.zeros(500, dtype=torch.bool)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = full_graph_metrics(_Logits(logits), data)
    assert out["val_acc"] == 0.7 and out["loss"] == out["val_loss"]
    assert math.isnan(out["test_acc"]) and math.isnan(out["test_loss"])
    data.data.val_mask = torch.arange(340, 360)  # 10 right of 20
    assert full_graph_metrics(_Logits(logits), data)["val_acc"] == 0.5
