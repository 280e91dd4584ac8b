"""Edge probes of the trainer, checkpoints, schedule and optimizer groups (eighth pass).

Bug found:

* ``load_checkpoint`` checked every zip entry's CRC-32 but caught only ``zipfile.BadZipFile`` while reading an entry:
  a flipped bit in an entry's name length (local header: ``UnicodeDecodeError``) or compression method (central
  directory: ``zlib.error``) fell through to "not a zip, let torch.load judge", and ``torch.load`` (which checks
  neither) loaded shifted or other bytes as the tensor: a silently different model, optimizer and RNG state.
"""

from __future__ import annotations

import math
import os
import struct
import zipfile

import pytest
import torch
from torch import nn
from train_tiny_tasks import RegressionTask, SimulatedKill, TinyMLP, tiny_config

from diffusionformer.train import (
    CheckpointError,
    Trainer,
    cosine_lr,
    load_checkpoint,
    param_groups,
    read_metrics,
    save_checkpoint,
    seed_everything,
)
from diffusionformer.train.checkpoint import CHECKPOINT_FORMAT
from diffusionformer.train.loggers import read_metrics_csv


def _payload() -> dict:
    return {"format": CHECKPOINT_FORMAT, "step": 1, "model": {"w": torch.arange(16.0), "b": torch.ones(3)},
            "optimizer": {}, "rng": {}, "config": {}}


def _entry(path, suffix: str) -> zipfile.ZipInfo:
    with zipfile.ZipFile(path) as archive:
        return next(i for i in archive.infolist() if i.filename.endswith(suffix))


def _central_record(data: bytes, name: str) -> int:
    pos = data.index(b"PK\x01\x02")
    while data[pos:pos + 4] == b"PK\x01\x02":
        nlen, xlen, clen = struct.unpack("<3H", data[pos + 28:pos + 34])
        if data[pos + 46:pos + 46 + nlen].decode() == name:
            return pos
        pos += 46 + nlen + xlen + clen
    raise AssertionError(name)


@pytest.mark.parametrize("where", ["local name length", "central compression method"])
def test_bug_checkpoint_with_a_damaged_entry_header_is_refused(tmp_path, where):
    """Bug: a flipped bit in a zip entry's header (the local name length, or the compression method in the central
    directory) loaded without a word: the CRC check caught only BadZipFile, the UnicodeDecodeError / zlib.error
    passed as "not a zip", and torch.load read other bytes as the tensor."""
    path = save_checkpoint(tmp_path / "c.pt", _payload())
    good = load_checkpoint(path)["model"]["w"]
    data = bytearray(path.read_bytes())
    info = _entry(path, "data/0")
    assert torch.equal(torch.load(path, weights_only=True)["model"]["w"], good)
    if where == "local name length":
        data[info.header_offset + 26] ^= 0x80  # the name length's high bit of its low byte: 14 -> 142
    else:
        data[_central_record(bytes(data), info.filename) + 10] ^= 0x08  # stored (0) -> deflated (8)
    path.write_bytes(bytes(data))
    try:  # what torch.load alone makes of it: an error or, as found, other numbers
        loaded = torch.load(path, weights_only=True)["model"]
    except Exception:
        loaded = None
    assert loaded is None or not all(torch.equal(loaded[k], v) for k, v in _payload()["model"].items())
    with pytest.raises(CheckpointError, match=r"is corrupt: its entry '.*data/0' cannot be read"):
        load_checkpoint(path)
    assert path.read_bytes() == bytes(data)  # left untouched


def test_checkpoint_crc_failure_message_is_kept(tmp_path):
    path = save_checkpoint(tmp_path / "c.pt", _payload())
    data = bytearray(path.read_bytes())
    info = _entry(path, "data/0")
    nlen, xlen = struct.unpack("<2H", data[info.header_offset + 26:info.header_offset + 30])
    data[info.header_offset + 30 + nlen + xlen + 5] ^= 1  # a byte of the tensor data itself
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"is corrupt: its entry '.*data/0' fails its CRC-32 check"):
        load_checkpoint(path)


def test_checkpoint_holding_a_reduce_to_os_system_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    for legacy in (False, True):
        path = tmp_path / f"evil{legacy}.pt"
        torch.save({**_payload(), "evil": Evil()}, path, _use_new_zipfile_serialization=not legacy)
        with pytest.raises(CheckpointError, match="unreadable"):
            load_checkpoint(path)
    assert not marker.exists()


def test_every_truncation_of_a_checkpoint_is_a_checkpoint_error(tmp_path):
    data = save_checkpoint(tmp_path / "c.pt", _payload()).read_bytes()
    for n in range(0, len(data), 97):
        (tmp_path / "t.pt").write_bytes(data[:n])
        with pytest.raises(CheckpointError):
            load_checkpoint(tmp_path / "t.pt")


# ---------------------------------------------------------------- exact resume, combinations not pinned elsewhere
def _run(out, cfg, task, *, resume=False, seed=0) -> Trainer:
    seed_everything(seed)
    trainer = Trainer(TinyMLP(), task, cfg, out, resume=resume)
    trainer.fit()
    return trainer


def _same(a, b, where=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def _strip(records):
    return [(r["step"], r["split"], r["loss"], r["lr"], r["metrics"]) for r in records]


@pytest.mark.parametrize("kill", [3, 4, 8])  # warm-up end (W=3), a checkpoint that cuts a log window, decay end
def test_resume_with_accumulation_active_clipping_and_schedule_boundaries_is_exact(tmp_path, kill):
    # grad_accum 2, clipping that bites (0.05), eval every 4, checkpoint every 3, log every 2: none divides another
    cfg = tiny_config(max_steps=10, warmup_steps=3, lr_decay_steps=8, grad_clip=0.05, grad_accum_steps=2,
                      eval_interval=4, checkpoint_interval=3, log_interval=2, loggers=["jsonl", "csv"])
    ref = _run(tmp_path / "ref", cfg, RegressionTask())
    out = tmp_path / "killed"
    with pytest.raises(SimulatedKill):
        _run(out, cfg, RegressionTask(fail_at=kill))
    task = RegressionTask()
    resumed = _run(out, cfg, task, resume=True, seed=99)
    assert task.steps_seen == list(range(kill // 3 * 3, 10))
    _same(resumed.model.state_dict(), ref.model.state_dict())
    new, old = load_checkpoint(out / "checkpoint.pt"), load_checkpoint(tmp_path / "ref" / "checkpoint.pt")
    for key in ("optimizer", "rng", "window", "last_train"):
        if key == "last_train":
            _same(new[key]["metrics"], old[key]["metrics"])
        else:
            _same(new[key], old[key], key)
    assert _strip(read_metrics(out)) == _strip(read_metrics(tmp_path / "ref"))
    assert _strip(read_metrics_csv(out)) == _strip(read_metrics_csv(tmp_path / "ref"))  # no row twice, none lost


# ---------------------------------------------------------------- schedule and decay groups vs references
def test_cosine_lr_matches_a_float64_formula_at_every_boundary():
    for W, D in [(0, 0), (0, 1), (1, 1), (3, 3), (3, 4), (3, 8), (5, 100)]:
        for s in sorted({0, max(W - 1, 0), W, W + 1, max(D - 1, 0), D, D + 1, D + 7}):
            lr, lo = 3e-4, 3e-5
            if s < W:
                want = lr * (s + 1) / (W + 1)
            elif s >= D:
                want = lo
            else:
                want = lo + 0.5 * (1 + math.cos(math.pi * (s - W) / (D - W))) * (lr - lo)
            got = cosine_lr(s, lr=lr, min_lr=lo, warmup_steps=W, decay_steps=D)
            assert type(got) is float and abs(got - want) <= 1e-18, (W, D, s, got, want)
        if D > W:
            assert cosine_lr(W, lr=lr, min_lr=lo, warmup_steps=W, decay_steps=D) == lr  # the peak, exactly


def test_nanogpt_rule_decays_exactly_the_params_of_dim_at_least_two():
    model = nn.Sequential(nn.Embedding(7, 4), nn.Conv1d(4, 4, 3), nn.Linear(4, 4), nn.LayerNorm(4))
    model.register_parameter("scalar", nn.Parameter(torch.zeros(())))
    model.register_parameter("frozen", nn.Parameter(torch.zeros(2, 2), requires_grad=False))
    groups = param_groups(model, 0.1, rule="nanogpt")
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    want_decay = sorted(n for n, p in params.items() if p.dim() >= 2)
    assert sorted(groups[0]["names"]) == want_decay and groups[0]["weight_decay"] == 0.1
    assert sorted(groups[1]["names"]) == sorted(set(params) - set(want_decay)) and groups[1]["weight_decay"] == 0.0
