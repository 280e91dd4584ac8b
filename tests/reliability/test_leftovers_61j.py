"""Task 61j: three leftovers. (1) ``status``, ``run`` and the tables opened the checkpoint of every run with RoPE on
at its model's default ``rope_base`` (left out of the identity) to tell it from a folder written before 41b9968;
(2) a CSV table listed before ``"jsonl"`` in ``loggers`` kept the row of the log's torn last line at a resume; (3)
two recorded models sharing a block each recorded the other's calls. No GPU."""

from __future__ import annotations

import json

import pytest
import torch

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import finished_runs, run_dir, run_status
from diffusionformer.experiments.runner import run_experiment


# ---- (1) a RoPE run at its model's default base is read without opening its checkpoint ------------------------------

_TRAIN = {"max_steps": 2, "batch_size": 8, "warmup_steps": 0, "eval_interval": 2, "log_interval": 1,
          "checkpoint_interval": 2}


def _gpt_config(rope_base: float | None = None):
    """A tiny GPT with RoPE on, at GPT's own base (``None``) or at ``rope_base``."""
    task = {"name": "t", "dataset": "pydoc-chars", "model": "gpt-char-tiny", "metric": "val_loss", "train": _TRAIN,
            "model_overrides": {"n_embd": 8, "n_layer": 1, "n_head": 2, "block_size": 16, "rope": True}}
    setting = {"name": "rope"} if rope_base is None else {"name": "rope", "model_overrides": {"rope_base": rope_base}}
    return load_experiment_config({"name": "tiny", "seeds": [0], "tasks": [task], "operators": [setting]})


def _counting_loads(monkeypatch) -> list:
    """Every ``torch.load`` call from now on, by its path."""
    calls = []
    load = torch.load

    def counted(f, *args, **kwargs):
        calls.append(str(f))
        return load(f, *args, **kwargs)
    monkeypatch.setattr(torch, "load", counted)
    return calls


@pytest.mark.parametrize("rope_base", [None, 100.0])
def test_bug_status_run_and_tables_open_no_checkpoint_of_a_rope_run(tmp_path, monkeypatch, rope_base):
    """Bug: a run folder of a RoPE model at its default base (``run_config.json`` left ``rope_base`` out) was told from
    one written before 41b9968 by its checkpoint: ``status``, ``run``'s skip and ``finished_runs`` each memory-mapped
    it. ``run_config.json`` records the base of a RoPE model now, so only a folder without it is read so."""
    config = _gpt_config(rope_base)
    (first,) = run_experiment(config, tmp_path, progress=False, log=lambda s: None)
    rdir = run_dir(tmp_path / "tiny", "t", "rope", 0)
    calls = _counting_loads(monkeypatch)
    assert [(r["state"], r["changed"]) for r in run_status(config, tmp_path)] == [("completed", None)]
    assert [r.seed for r in finished_runs(tmp_path / "tiny", config, [])] == [0]
    (again,) = run_experiment(config, tmp_path, progress=False, log=lambda s: None)
    assert (again.status, again.value) == ("completed", first.value)
    assert not [c for c in calls if c.endswith("checkpoint.pt")], calls
    recorded = json.loads((rdir / "run_config.json").read_text(encoding="utf-8"))["model_config"]
    assert recorded["rope_base"] == (10000.0 if rope_base is None else rope_base)
    monkeypatch.undo()
    other = _gpt_config(100.0 if rope_base is None else None)  # the other base: still another run
    (row,) = run_status(other, tmp_path)
    assert row["changed"] is not None and "rope_base" in row["changed"]


# ---- (2) a resume after a torn last line of metrics.jsonl: the CSV table listed before the log drops that row too ----

def _record(step, segment=0):
    return {"step": step, "split": "train", "loss": 1.0 / step, "lr": 0.1, "metrics": {"acc": step / 8},
            "elapsed": float(step), "time": 100.0 + 1000 * segment + step}


def _killed_in_the_log_write(out, order, step):
    """Records 1 to ``step`` through ``order``'s writers, killed while ``metrics.jsonl`` took the last: a writer listed
    before the log wrote it whole, the log a line cut short, a writer after it nothing."""
    from diffusionformer.train.loggers import CSVLog, open_loggers

    log = open_loggers(order, out)
    for s in range(1, step):
        log.append(_record(s))
    log.close()
    if order.index("csv") < order.index("jsonl"):
        CSVLog(out / "metrics.csv").append(_record(step))
    with open(out / "metrics.jsonl", "ab") as f:
        f.write(json.dumps(_record(step)).encode()[:20])


@pytest.mark.parametrize("resumed", [["csv", "jsonl"], ["jsonl", "csv"], ["jsonl"]])
@pytest.mark.parametrize("order", [["csv", "jsonl"], ["jsonl", "csv"]])
def test_bug_a_csv_listed_before_the_log_keeps_no_row_of_its_torn_last_line(tmp_path, order, resumed):
    """Bug: killed while ``metrics.jsonl`` wrote step 4's line (its checkpoint at 4 kept), a CSV table listed before
    the log in ``loggers`` held step 4's whole row; the resume dropped the log's torn line but kept that row as a
    damaged line's (the only copy of a record): the table held a record the log did not, and one listed after the
    log never does. Either order, and the table off at the resume then on again, now hold the log's rows."""
    from diffusionformer.train import read_metrics, read_metrics_csv
    from diffusionformer.train.loggers import open_loggers

    _killed_in_the_log_write(tmp_path, order, 4)
    log = open_loggers(resumed, tmp_path)
    log.truncate(4)
    log.append(_record(5, segment=1))
    log.close()
    if "csv" not in resumed:  # the table off for that segment: on again at the next resume
        log = open_loggers(["jsonl", "csv"], tmp_path)
        log.truncate(5)
        log.close()
    steps = [(r["step"], r["time"]) for r in read_metrics(tmp_path)]
    assert steps == [(1, 101.0), (2, 102.0), (3, 103.0), (5, 1105.0)]
    assert [(r["step"], r["time"]) for r in read_metrics_csv(tmp_path)] == steps


def test_the_row_of_a_damaged_last_line_that_is_whole_is_kept(tmp_path):
    """A last line damaged in place (a line end still there: no write in flight) keeps the table's row, the only copy
    of its record left, as any damaged line's (review 60t); a table listed after the log keeps its last row beside a
    torn line of the next record."""
    from diffusionformer.train import read_metrics_csv
    from diffusionformer.train.loggers import open_loggers

    log = open_loggers(["csv", "jsonl"], tmp_path)
    for s in range(1, 5):
        log.append(_record(s))
    log.close()
    path = tmp_path / "metrics.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][:12] + b"\n")
    log = open_loggers(["csv", "jsonl"], tmp_path)
    log.truncate(4)
    log.close()
    assert [r["step"] for r in read_metrics_csv(tmp_path)] == [1, 2, 3, 4]
    other = tmp_path / "other"
    _killed_in_the_log_write(other, ["jsonl", "csv"], 5)
    lines = (other / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    (other / "metrics.jsonl").write_bytes(b"".join(lines[:3]) + lines[3][:12] + b"\n" + lines[4])  # 4 damaged, 5 torn
    log = open_loggers(["jsonl", "csv"], other)
    with pytest.warns(UserWarning, match="malformed"):
        log.truncate(5)
    log.close()
    assert [r["step"] for r in read_metrics_csv(other)] == [1, 2, 3, 4]


# ---- (3) two recorded models sharing a block: each recorder records its own model's calls only ---------------------

def _two_gpts():
    from diffusionformer.models import DiffusionGPT, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16)
    student, teacher = DiffusionGPT(config), DiffusionGPT(config)
    teacher.blocks[1] = student.blocks[1]  # one block shared
    return student, teacher


class _Wrapper(torch.nn.Module):
    """A model of its own over another's ``blocks`` (the same ModuleList, not a copy)."""

    def __init__(self, model):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.blocks = model.blocks

    def forward(self, h):
        h = self.proj(h)
        for block in self.blocks:
            h = block(h)
        return h


def _states(model, inputs):
    from diffusionformer.analysis.capture import LayerRecorder

    with LayerRecorder(model) as rec:
        model(inputs)
    return rec.states


def test_bug_two_recorded_models_sharing_a_block_each_record_their_own_calls():
    """Bug: with a recorder on a student and one on a teacher sharing its last block, the teacher's pass overwrote
    the student's recorder's last layer with the teacher's tokens (and a wrapper over a model's ``blocks`` overwrote
    every layer of the model's recorder, and the other way round): each recorder now holds its own model's pass."""
    from diffusionformer.analysis.capture import LayerRecorder

    student, teacher = _two_gpts()
    x, y = torch.randint(0, 11, (3, 8)), torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(1))
    alone_s, alone_t = _states(student, x), _states(teacher, y)
    with LayerRecorder(student) as rs, LayerRecorder(teacher) as rt:
        for _ in range(2):  # either order, and a count of the shared block's calls left right
            student(x)
            teacher(y)
            for rec, alone in ((rs, alone_s), (rt, alone_t)):
                assert sorted(rec.states) == [0, 1, 2]
                for layer in alone:
                    torch.testing.assert_close(rec.states[layer], alone[layer], rtol=0, atol=0)
    wrapper = _Wrapper(student)
    h = torch.randn(3, 8, 16)
    alone_w = _states(wrapper, h)
    with LayerRecorder(student) as rs, LayerRecorder(wrapper) as rw:
        wrapper(h)
        student(x)
        wrapper(h)
        for rec, alone in ((rs, alone_s), (rw, alone_w)):
            for layer in alone:
                torch.testing.assert_close(rec.states[layer], alone[layer], rtol=0, atol=0)


def test_a_recorder_still_records_a_shared_blocks_calls_outside_any_recorded_pass():
    """A call outside every recorded pass (``forward_cached``, or a model not recorded) is recorded as before, and a
    recorder exited no longer counts as recording (its model's passes do not hide the calls from another)."""
    from diffusionformer.analysis.capture import _RECORDING, LayerRecorder

    student, teacher = _two_gpts()
    x = torch.randint(0, 11, (3, 8))
    with LayerRecorder(student) as rs:
        pass
    assert rs not in _RECORDING
    with LayerRecorder(teacher) as rt:
        student(x)  # the student's pass: no recorder of it on now, the shared block's call is recorded
        assert sorted(rt.states) == [2]
    assert not _RECORDING
