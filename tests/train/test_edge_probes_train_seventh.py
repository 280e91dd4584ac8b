"""Edge-case probes, seventh pass: loggers.py, metrics.py, schedule.py, optim.py, batch.py (the bugs found are fixed
here). References: the csv and json modules reading the written files back, torch.optim.AdamW with explicit groups."""

from __future__ import annotations

import csv
import json
import math
from collections import namedtuple

import numpy as np
import pytest
import torch
from torch import nn
from train_tiny_tasks import FakeSummaryWriter

from diffusionformer.train import (
    CSVLog,
    MetricsLog,
    TensorBoardLog,
    TrainConfig,
    build_optimizer,
    cosine_lr,
    open_loggers,
    param_groups,
    read_metrics,
    read_metrics_csv,
    to_device,
)
from diffusionformer.train.loggers import LogGroup

HEADER = "step,split,loss,lr,elapsed,time\r\n"


def _rows(steps) -> str:
    return "".join(f"{s},train,0.5,0.1,1.0,2.0\r\n" for s in steps)


def _cells(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def _record(step, **metrics):
    return {"step": step, "split": "train", "loss": 0.5, "lr": 0.1, "metrics": metrics, "elapsed": 1.0, "time": 2.0}


# ----------------------------------------------------------------------------- loggers.py: damaged metrics.csv
@pytest.mark.parametrize("cell", ["split", "loss", "time"])
def test_bug_csv_truncate_drops_the_rows_an_unclosed_quote_hid(tmp_path, cell):
    """Bug: a damaged byte read as an opening quote (row 3) made one cell of the rest of the file; the row kept its
    decimal step, so ``CSVLog.truncate(8)`` kept it, and with it the rows of steps 9 and 10 inside that cell: the
    resumed run logged steps 9 and 10 again (twice in the table) and ``read_metrics_csv`` could not read it."""
    path = tmp_path / "metrics.csv"
    column = ["step", "split", "loss", "lr", "elapsed", "time"].index(cell)
    damaged = ["3", "train", "0.5", "0.1", "1.0", "2.0"]
    damaged[column] = '"' + damaged[column]
    path.write_text(HEADER + _rows([1, 2]) + ",".join(damaged) + "\r\n" + _rows(range(4, 11)), encoding="utf-8",
                    newline="")
    log = CSVLog(path)
    log.truncate(8)
    log.append(_record(9))
    cells = _cells(path)
    assert cells[0] == HEADER.strip().split(",") and all(len(row) == 6 for row in cells)
    assert [int(row[0]) for row in cells[1:]] == [1, 2, 9]
    assert [r["step"] for r in read_metrics_csv(path)] == [1, 2, 9]


def test_bug_csv_truncate_resumes_past_an_unclosed_quote_beyond_the_csv_field_limit(tmp_path):
    """Bug: the same quote with more than 128 KiB after it stopped the resume in ``CSVLog.truncate`` with csv's
    bare "_csv.Error: field larger than field limit (131072)"; ``read_metrics_csv`` raised it too, naming no file.
    The rows before the damaged one are kept, and reading names the file and the line."""
    path = tmp_path / "metrics.csv"
    path.write_text(HEADER + _rows([1, 2]) + '3,train,"0.5,0.1,1.0,2.0\r\n' + _rows(range(4, 6001)),
                    encoding="utf-8", newline="")
    with pytest.raises(ValueError, match=r"metrics\.csv:\d+: not a metrics row \(Error: field larger"):
        read_metrics_csv(path)
    CSVLog(path).truncate(5000)
    assert [r["step"] for r in read_metrics_csv(path)] == [1, 2]


def test_csv_truncate_still_keeps_odd_splits_and_drops_only_a_torn_last_row(tmp_path):
    """Pins, beside the fix above: a quoted split holding a comma and a newline is a sound row; a last row cut
    short (no line end) is dropped; a row short of cells (a hand edit) is dropped, not written back padded."""
    path = tmp_path / "metrics.csv"
    path.write_text(HEADER + '1,"a,\r\nb",0.5,0.1,1.0,2.0\r\n2,train,0.5\r\n' + _rows([3]) + "4,train,0.5,0.1,1",
                    encoding="utf-8", newline="")
    assert CSVLog(path).truncate(10) == 2
    assert [(r["step"], r["split"]) for r in read_metrics_csv(path)] == [(1, "a,\r\nb"), (3, "train")]


# ----------------------------------------------------------------------------- loggers.py: values
def test_bug_csv_writes_numpy_ints_as_the_ints_they_equal(tmp_path):
    """Bug: a NumPy int metric went through float() into its CSV cell: np.int64(2**53 + 1) was written
    "9007199254740992.0" and np.uint64(2**64 - 1) "1.8446744073709552e+19", where the JSON-lines log (and the CSV
    cell of a Python int) hold the exact value."""
    values = {"a": np.int64(2**53 + 1), "b": np.uint64(2**64 - 1), "c": 2**53 + 1, "d": np.int8(-7)}
    log = open_loggers(["jsonl", "csv"], tmp_path)
    log.append(_record(1, **values))
    log.close()
    header, row = _cells(tmp_path / "metrics.csv")
    from_csv = {name[len("metrics."):]: int(cell) for name, cell in zip(header, row) if name.startswith("metrics.")}
    from_jsonl = json.loads((tmp_path / "metrics.jsonl").read_text(encoding="utf-8"))["metrics"]
    assert from_csv == from_jsonl == {k: int(v) for k, v in values.items()}


def test_bug_tensorboard_log_skips_an_int_beyond_the_float_range(tmp_path):
    """Bug: ``TensorBoardLog.append`` of a metric ``10**400`` (which the JSON-lines and CSV logs write) raised
    ``math.isfinite``'s bare "OverflowError: int too large to convert to float" and wrote none of the record's
    scalars; it is skipped like a non-finite value, and the others are written as Python floats."""
    log = TensorBoardLog(tmp_path / "tb", active=False)
    log.active, log._writer_cls = True, FakeSummaryWriter
    log.append(_record(3, huge=10**400, n=np.int64(5), acc=np.float32(0.25)))
    scalars = sorted(log._writer.scalars)
    assert scalars == [("train/acc", 0.25, 3), ("train/loss", 0.5, 3), ("train/lr", 0.1, 3), ("train/n", 5.0, 3)]
    assert all(type(value) is float for _, value, _ in scalars)


class _FailingClose:
    def append(self, record):
        pass

    def truncate(self, max_step):
        return 0

    def close(self):
        raise OSError("No space left on device")


def test_bug_log_group_closes_every_writer_when_one_close_fails(tmp_path):
    """Bug: ``LogGroup.close`` stopped at the first writer whose close raised (a TensorBoard writer on a full
    disk, listed first in ``loggers``): the JSON-lines log after it kept its file open (a leaked handle, a
    ResourceWarning). Every writer is closed now and the first error raised after."""
    jsonl = MetricsLog(tmp_path / "metrics.jsonl")
    group = LogGroup([_FailingClose(), jsonl])
    group.append(_record(1))
    handle = jsonl._file
    with pytest.raises(OSError, match="No space left"):
        group.close()
    assert handle.closed and jsonl._file is None
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]


# ----------------------------------------------------------------------------- schedule.py
@pytest.mark.parametrize("name", ["lr", "min_lr"])
def test_bug_cosine_lr_names_an_int_beyond_the_float_range(name):
    """Bug: ``cosine_lr(..., lr=10**400)`` raised ``math.isfinite``'s bare "OverflowError: int too large to convert
    to float" (TrainConfig names the same value: "expected a finite float, got int beyond the float range")."""
    kwargs = {"lr": 1.0, "min_lr": 0.0, name: 10**400}
    with pytest.raises(ValueError, match=rf"cosine_lr: expected {name} a finite float, got an int beyond"):
        cosine_lr(3, warmup_steps=2, decay_steps=5, **kwargs)


def test_cosine_lr_edges_match_the_formula_written_out():
    """Pins: step 0, the warm-up's end, past the decay's end, min_lr above lr (a rising cosine, as nanoGPT's get_lr
    gives) and lr 0."""
    def ref(s, lr, lo, w, d):
        if s < w:
            return lr * (s + 1) / (w + 1)
        if s >= d:
            return lo
        return lo + 0.5 * (1 + math.cos(math.pi * (s - w) / (d - w))) * (lr - lo)

    for lr, lo, w, d in [(1.0, 0.1, 3, 9), (0.1, 1.0, 2, 6), (0.0, 0.0, 1, 4), (2.0, 0.5, 0, 1), (1.0, 0.2, 4, 4)]:
        for s in [0, max(w - 1, 0), w, d - 1, d, d + 1, 10 * d + 7]:
            assert cosine_lr(s, lr=lr, min_lr=lo, warmup_steps=w, decay_steps=d) == pytest.approx(
                ref(s, lr, lo, w, d), rel=1e-15, abs=1e-18)


# ----------------------------------------------------------------------------- optim.py
def test_bug_no_weight_decay_that_is_not_a_method_is_named():
    """Bug: a model with ``no_weight_decay = {"pos"}`` (a set of names, not timm's method) made ``param_groups``
    raise a bare "TypeError: 'set' object is not callable", naming neither the model nor the hook."""

    class Model(nn.Module):
        no_weight_decay = {"pos"}

        def __init__(self):
            super().__init__()
            self.pos = nn.Parameter(torch.zeros(2, 2))

    with pytest.raises(TypeError, match=r"Model\.no_weight_decay: expected a method returning parameter names .*"
                                        r"got set \(\{'pos'\}\)"):
        param_groups(Model(), 0.1)


class _Odd(nn.Module):
    """Tied embedding/head, a frozen layer, size-0 parameters and a buffer."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 4)
        self.head = nn.Linear(4, 5, bias=False)
        self.head.weight = self.emb.weight
        self.lin = nn.Linear(4, 4)
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        self.empty2 = nn.Parameter(torch.empty(0, 3))
        self.empty1 = nn.Parameter(torch.empty(0))
        self.register_buffer("buf", torch.ones(4, 4))


@pytest.mark.parametrize("rule", ["default", "nanogpt"])
def test_build_optimizer_steps_as_adamw_with_explicit_groups(rule):
    """Pins: tied weights once, frozen parameters and buffers left out, size-0 parameters by their dim; three steps
    equal torch.optim.AdamW over groups written out by hand."""
    torch.manual_seed(0)
    ours, ref = _Odd(), _Odd()
    ref.load_state_dict(ours.state_dict())
    cfg = TrainConfig(max_steps=3, lr=0.05, weight_decay=0.3, betas=(0.8, 0.9), weight_decay_rule=rule, device="cpu")
    opt = build_optimizer(ours, cfg, torch.device("cpu"))
    embed_decayed = rule == "nanogpt"
    decay = [ref.lin.weight, ref.empty2] + ([ref.emb.weight] if embed_decayed else [])
    rest = [ref.lin.bias, ref.empty1] + ([] if embed_decayed else [ref.emb.weight])
    opt_ref = torch.optim.AdamW([{"params": decay, "weight_decay": 0.3}, {"params": rest, "weight_decay": 0.0}],
                                lr=0.05, betas=(0.8, 0.9))
    assert sorted(len(g["params"]) for g in opt.param_groups) == sorted([len(decay), len(rest)])
    x = torch.randint(0, 5, (6,))
    for model, o in ((ours, opt), (ref, opt_ref)):
        for _ in range(3):
            o.zero_grad()
            (model.head(model.lin(model.emb(x)) + model.frozen(model.buf[:1])).square().mean()).backward()
            o.step()
    for (name, a), b in zip(ours.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), name
    assert ours.head.weight is ours.emb.weight


# ----------------------------------------------------------------------------- batch.py
def test_to_device_moves_nested_named_and_structured_batches():
    """Pins on the meta device (CPU-only): a named tuple with a field called ``to``, a ``torch.return_types``
    struct sequence, a tuple subclass of ints (``torch.Size``) and a PyG ``Data`` inside a list."""
    meta = torch.device("meta")
    Edge = namedtuple("Edge", ["frm", "to"])
    moved = to_device({"e": Edge(torch.ones(2), torch.zeros(2)), "m": torch.max(torch.randn(3, 2), 0),
                       "size": torch.Size([2, 3]), "n": 3}, meta)
    assert type(moved["e"]) is Edge and moved["e"].frm.is_meta and moved["e"].to.is_meta
    assert type(moved["m"]).__name__ == "max" and moved["m"].values.is_meta and moved["m"].indices.is_meta
    assert moved["size"] == torch.Size([2, 3]) and moved["n"] == 3
    pyg = pytest.importorskip("torch_geometric.data")
    data = pyg.Data(x=torch.ones(2, 3), edge_index=torch.tensor([[0], [1]]))
    (out,) = to_device([data], meta)
    assert out.x.is_meta and out.edge_index.is_meta  # moved by its own .to (PyG's: in place)


def test_bug_fit_shuts_the_process_group_down_when_a_logger_close_fails(tmp_path, monkeypatch):
    """Bug: ``Trainer.fit`` closed the loggers, then shut the distributed context down, in one ``finally``: a
    logger whose close raised (a full disk) skipped ``ctx.shutdown()`` and left the process group up."""
    from train_tiny_tasks import RegressionTask, TinyMLP, tiny_config

    from diffusionformer.train import Trainer
    from diffusionformer.train import distributed, loggers

    calls = []
    monkeypatch.setattr(distributed.DistContext, "shutdown", lambda self: calls.append("shutdown"))

    def failing_close(self):
        raise OSError("No space left on device")

    monkeypatch.setattr(loggers.LogGroup, "close", failing_close)
    with pytest.raises(OSError, match="No space left"):
        Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=2), tmp_path).fit()
    assert calls == ["shutdown"]
