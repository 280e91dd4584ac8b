"""Edge probes (ninth pass) of the training loggers, RNG capture/restore, batch moves and the schedule."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from diffusionformer.train import capture_rng_state, restore_rng_state
from diffusionformer.train.batch import to_device
from diffusionformer.train.loggers import CSV_NAME, open_loggers, read_metrics_csv
from diffusionformer.train.metrics import read_metrics
from diffusionformer.train.schedule import cosine_lr

CPU = torch.device("cpu")


def _record(step, metrics, loss=0.5):
    return {"step": step, "split": "train", "loss": loss, "lr": 0.1, "metrics": metrics, "elapsed": 1.0,
            "time": 2.0}


def _damaged(state, entry):
    state = {k: (dict(v) if isinstance(v, dict) else v) for k, v in state.items()}
    if entry == "torch":  # a state of another torch version / generator kind: another size
        state["torch"] = torch.zeros(3, dtype=torch.uint8)
    elif entry == "generator":
        state["generator"] = torch.zeros(3, dtype=torch.uint8)
    elif entry == "numpy-keys":
        state["numpy"]["keys"] = state["numpy"]["keys"][:10]
    else:  # numpy-name
        state["numpy"]["name"] = "PCG64"
    return state


@pytest.mark.parametrize("entry", ["torch", "generator", "numpy-keys", "numpy-name"])
def test_bug_restore_rng_state_puts_back_the_generators_when_a_state_does_not_fit(entry):
    """Bug: ``restore_rng_state`` set Python's, NumPy's (and torch's) generators one after the other, so a later
    entry that did not fit (a torch state of another size, a batch-generator state of another size, NumPy keys cut
    short) raised a bare ``RuntimeError``/``IndexError``/``ValueError`` naming no entry with the earlier generators
    already rewound to the saved state. The generators are now as they were, and the error names the function."""
    generator = torch.Generator().manual_seed(1)
    state = _damaged(capture_rng_state(CPU, generator), entry)
    random.seed(9), np.random.seed(9), torch.manual_seed(9), generator.manual_seed(9)
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state(), generator.get_state())
    with pytest.raises(ValueError, match="restore_rng_state: expected the states capture_rng_state writes, got one "
                                         "that does not fit"):
        restore_rng_state(state, CPU, generator)
    assert random.getstate() == before[0]
    assert np.array_equal(np.random.get_state()[1], before[1])
    assert torch.equal(torch.get_rng_state(), before[2])
    assert torch.equal(generator.get_state(), before[3])


def test_bug_csv_log_reads_a_table_a_spreadsheet_saved_with_a_byte_order_mark(tmp_path):
    """Bug: a ``metrics.csv`` saved again by a spreadsheet (Excel's "CSV UTF-8" starts it with a byte-order mark)
    had the first column ``\\ufeffstep``: ``read_metrics_csv`` called every row "not a metrics row", and a resume
    dropped every row (none had a ``step``) while ``metrics.jsonl`` kept them, then appended under a header naming
    ``step`` twice."""
    log = open_loggers(["jsonl", "csv"], tmp_path)
    for step in range(1, 5):
        log.append(_record(step, {"acc": step / 10}))
    log.close()
    path = tmp_path / CSV_NAME
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert [r["step"] for r in read_metrics_csv(tmp_path)] == [1, 2, 3, 4]
    log = open_loggers(["jsonl", "csv"], tmp_path)
    assert log.truncate(2) == 2
    log.append(_record(3, {"acc": 0.3}))
    log.close()
    assert path.read_text(encoding="utf-8").splitlines()[0] == "step,split,loss,lr,elapsed,time,metrics.acc"
    csv_rows = [(r["step"], r["metrics"]) for r in read_metrics_csv(tmp_path)]
    assert csv_rows == [(r["step"], r["metrics"]) for r in read_metrics(tmp_path)]
    assert csv_rows == [(1, {"acc": 0.1}), (2, {"acc": 0.2}), (3, {"acc": 0.3})]


def test_csv_and_jsonl_keep_the_same_steps_on_resume_with_changing_keys_odd_names_and_non_finite_values(tmp_path):
    """Pins: records whose metric keys change between steps (names needing quoting included), with non-finite
    values, are cut back to the same steps in both logs, and a closed group closed again and appended to goes on."""
    names = ["a,b", 'q"x', "line\nbreak", "cr\rx", " lead"]
    log = open_loggers(["jsonl", "csv"], tmp_path)
    for step in range(1, 7):
        log.append(_record(step, {names[step % len(names)]: float(step), "nan": math.nan},
                           loss=math.inf if step == 2 else 0.5))
    log.close()
    log.close()
    log = open_loggers(["jsonl", "csv"], tmp_path)
    assert log.truncate(3) == 3
    log.close()
    log.append(_record(4, {"new": 4.0}))
    log.close()
    jsonl, table = read_metrics(tmp_path), read_metrics_csv(tmp_path)
    assert [r["step"] for r in jsonl] == [r["step"] for r in table] == [1, 2, 3, 4]
    for j, c in zip(jsonl, table):
        assert c["loss"] == j["loss"]  # inf: null and an empty cell, both None
        assert c["metrics"] == {k: v for k, v in j["metrics"].items() if v is not None}


def test_rng_capture_restore_continues_bit_identically_to_an_uninterrupted_run():
    """Pins: capture mid-stream, draw, restore: the continuation of every generator (Python, NumPy, torch CPU and a
    batch generator; CUDA absent) is bit-identical to the uninterrupted one."""
    generator = torch.Generator().manual_seed(3)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)

    def draw():
        return (random.random(), random.gauss(0, 1), np.random.randn(3).tolist(), torch.randn(4).tolist(),
                torch.randint(0, 10**9, (3,), generator=generator).tolist())

    draw()
    state = capture_rng_state(CPU, generator)
    uninterrupted = [draw() for _ in range(3)]
    restore_rng_state(state, CPU, generator)
    assert [draw() for _ in range(3)] == uninterrupted


def test_to_device_keeps_dtypes_and_containers_of_a_nested_batch_on_the_cpu():
    """Pins: a nested dict/list/tuple batch keeps its dtypes, container types and plain leaves."""
    batch = {"x": torch.ones(2, dtype=torch.float16), "y": [torch.arange(3), (torch.zeros(1, dtype=torch.bool), 7)],
             "s": torch.Size([2, 3]), "name": "b"}
    out = to_device(batch, CPU)
    assert out["x"].dtype == torch.float16 and out["y"][0].dtype == torch.int64
    assert type(out["y"]) is list and type(out["y"][1]) is tuple and out["y"][1][1] == 7
    assert out["y"][1][0].dtype == torch.bool and out["s"] == torch.Size([2, 3]) and out["name"] == "b"


@pytest.mark.parametrize("lr, min_lr", [(0.3, 0.1), (1e-3, 1e-5), (0.1, 0.1), (1.0, 0.0)])
def test_cosine_lr_matches_a_float64_reference_at_every_boundary(lr, min_lr):
    """Pins: warm-up 0, decay_steps == warmup, steps past the end and min_lr == lr against the formula in float64;
    the peak is ``lr`` itself at ``s = W`` when ``D > W``."""
    for w in range(4):
        for d in range(w, w + 4):
            for s in range(d + 3):
                if s < w:
                    expected = lr * (s + 1) / (w + 1)
                elif s >= d:
                    expected = min_lr
                else:
                    expected = min_lr + 0.5 * (1 + math.cos(math.pi * (s - w) / (d - w))) * (lr - min_lr)
                assert cosine_lr(s, lr=lr, min_lr=min_lr, warmup_steps=w, decay_steps=d) == expected
            if d > w:
                assert cosine_lr(w, lr=lr, min_lr=min_lr, warmup_steps=w, decay_steps=d) == lr
