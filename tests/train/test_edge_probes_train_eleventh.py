"""Edge-case probes (eleventh pass) of optimiser construction and checkpoint files.

References: json.loads/json.dumps of the expected lines, tempfile.mkstemp (the temporary a save of another path
makes in the same folder), hashlib digests of files, and torch.optim.AdamW's own state dict compared tensor by
tensor (``torch.equal``, dtypes, group flags). Also covers metrics.jsonl (byte order mark, keys equal as strings).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings

import pytest

import torch
from torch import nn

import diffusionformer.train.trainer as trainer_module
from diffusionformer.train import TrainConfig, Trainer
from diffusionformer.train.checkpoint import CHECKPOINT_FORMAT, load_checkpoint, save_checkpoint
from diffusionformer.train.metrics import MetricsLog, read_metrics
from diffusionformer.train.optim import build_optimizer
from train_tiny_tasks import RegressionTask, TinyMLP, tiny_config


def _payload(**extra):
    return {"format": CHECKPOINT_FORMAT, "step": 1, "model": {"w": torch.arange(3.0)}, "optimizer": {},
            "rng": {}, "config": {}, **extra}


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_bug_a_save_leaves_the_temporary_file_of_another_checkpoint_beside_it(tmp_path):
    """Bug: save_checkpoint("ck.pt") deleted the in-flight temporary of save_checkpoint("ck.pt.best") (same folder),
    whose os.replace then failed: its stale-file glob ".ck.pt.*.tmp" also matched ".ck.pt.best.XXXXXXXX.tmp"."""
    # what save_checkpoint(tmp_path / "ck.pt.best") holds between its torch.save and its os.replace
    fd, other = tempfile.mkstemp(prefix=".ck.pt.best.", suffix=".tmp", dir=tmp_path)
    os.write(fd, b"another checkpoint being written")
    os.close(fd)
    # and a temporary of ck.pt itself left by a hard kill: still removed
    fd, own = tempfile.mkstemp(prefix=".ck.pt.", suffix=".tmp", dir=tmp_path)
    os.close(fd)
    save_checkpoint(tmp_path / "ck.pt", _payload())
    assert os.path.exists(other), "the temporary of another checkpoint was deleted"
    assert not os.path.exists(own)
    assert load_checkpoint(tmp_path / "ck.pt")["step"] == 1


def test_pins_a_failed_replace_keeps_the_previous_checkpoint_byte_for_byte(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "checkpoint.pt", _payload(step=3))
    before = _digest(path)

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    try:
        save_checkpoint(path, _payload(step=4))
    except OSError as err:
        assert err.errno == 28
    else:
        raise AssertionError("the save did not fail")
    monkeypatch.undo()
    assert _digest(path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]
    assert load_checkpoint(path)["step"] == 3


def test_pins_adamw_state_round_trips_bit_exactly_through_a_checkpoint(tmp_path):
    """Moments, step counts (value and dtype) and every group entry (lr, betas, decay, names, fused/foreach/
    capturable flags) come back equal, and the next update is the same bit for bit."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 3), nn.LayerNorm(3))
    model[2].weight.requires_grad_(False)
    cfg = TrainConfig(max_steps=10, lr=1e-2, weight_decay=0.3, weight_decay_rule="nanogpt")
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    x = torch.tensor([0, 3, 4, 1])

    def step(m, o):
        o.zero_grad(set_to_none=True)
        m(x).pow(2).sum().backward()
        o.step()

    for _ in range(3):
        step(model, opt)
    path = save_checkpoint(tmp_path / "checkpoint.pt",
                           _payload(model=model.state_dict(), optimizer=opt.state_dict(), step=3))
    loaded = load_checkpoint(path)

    torch.manual_seed(1)  # other initial weights: everything must come from the file
    model2 = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 3), nn.LayerNorm(3))
    model2[2].weight.requires_grad_(False)
    model2.load_state_dict(loaded["model"])
    opt2 = build_optimizer(model2, cfg, torch.device("cpu"))
    opt2.load_state_dict(loaded["optimizer"])

    a, b = opt.state_dict(), opt2.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert {k for g in b["param_groups"] for k in g} >= {"fused", "foreach", "capturable", "names"}
    assert a["state"].keys() == b["state"].keys() and len(a["state"]) == 4  # the frozen LayerNorm gain has none
    for i in a["state"]:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            u, v = a["state"][i][key], b["state"][i][key]
            assert u.dtype == v.dtype and torch.equal(u, v), (i, key)
        assert b["state"][i]["step"].item() == 3.0
    step(model, opt)
    step(model2, opt2)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)


def test_bug_a_checkpoint_of_a_loop_kernel_run_resumes_onto_the_fused_kernel_with_its_step_layout(tmp_path,
                                                                                                   monkeypatch):
    """Bug: a checkpoint written by a non-fused AdamW (a CPU run; step counts kept as saved: float64 when the default
    dtype was float64) resumed onto the fused kernel build_optimizer picks on CUDA (``device`` may change on resume)
    kept those step tensors: torch's load_state_dict casts them by the FILE's fused/capturable flags, and the trainer
    then set fused=True, so the fused kernel got steps on the CPU / not float32 ("Expected all tensors to be on the same
    device ... state_steps"). Emulated on the CPU: the fused kernel is forced and the step layout is checked."""
    cfg = tiny_config(max_steps=4, checkpoint_interval=2, eval_interval=0, log_interval=2)
    torch.manual_seed(0)
    Trainer(TinyMLP(dropout=0.0), RegressionTask(global_rng=False),
            tiny_config(max_steps=2, lr_decay_steps=4, checkpoint_interval=2, eval_interval=0, log_interval=2),
            tmp_path / "run").fit()
    path = tmp_path / "run" / "checkpoint.pt"
    payload = load_checkpoint(path)
    assert all(g["fused"] is None for g in payload["optimizer"]["param_groups"])
    for state in payload["optimizer"]["state"].values():  # what a run under torch.set_default_dtype(float64) saves
        state["step"] = state["step"].to(torch.float64)
    save_checkpoint(path, payload)

    def fused_build(model, config, device):  # build_optimizer's choice on CUDA
        opt = build_optimizer(model, config, device)
        for group in opt.param_groups:
            group["fused"], group["foreach"] = True, None
        return opt

    monkeypatch.setattr(trainer_module, "build_optimizer", fused_build)
    torch.manual_seed(0)
    trainer = Trainer(TinyMLP(dropout=0.0), RegressionTask(global_rng=False), cfg, tmp_path / "run", resume=True)
    trainer.fit()
    opt = trainer.optimizer
    assert all(g["fused"] is True for g in opt.param_groups)
    steps = [(opt.state[p]["step"].dtype, opt.state[p]["step"].device, opt.state[p]["step"].item())
             for g in opt.param_groups for p in g["params"]]
    assert steps == [(torch.float32, p.device, 4.0) for g in opt.param_groups for p in g["params"]]


def test_bug_metrics_log_refuses_keys_equal_as_strings_instead_of_dropping_one(tmp_path):
    """Bug: MetricsLog.append({"metrics": {1: 0.5, "1": 0.7}}) wrote {"1": 0.7}: _plain turned the keys into strings
    in a dict, so one of the two values was lost without a word (json.dumps would at least have kept both)."""
    log = MetricsLog(tmp_path / "metrics.jsonl")
    try:
        with pytest.raises(ValueError, match="differ as strings"):
            log.append({"step": 1, "split": "train", "metrics": {1: 0.5, "1": 0.7}})
        log.append({"step": 2, "split": "train", "metrics": {1: 0.5, "2": 0.7}})
    finally:
        log.close()
    lines = (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [{"step": 2, "split": "train", "metrics": {"1": 0.5, "2": 0.7}}]


def test_bug_a_metrics_log_saved_with_a_byte_order_mark_keeps_its_first_record(tmp_path):
    """Bug: a metrics.jsonl re-saved by an editor with a UTF-8 byte order mark lost its first record: read_metrics
    skipped line 1 as malformed, and MetricsLog.truncate on resume rewrote the log without it."""
    path = tmp_path / "metrics.jsonl"
    records = [{"step": 1, "split": "train", "loss": 0.5}, {"step": 2, "split": "eval", "loss": 0.25},
               {"step": 3, "split": "train", "loss": 0.125}]
    body = "".join(json.dumps(r) + "\n" for r in records).encode("utf-8")
    path.write_bytes(b"\xef\xbb\xbf" + body)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_metrics(path) == records
        assert MetricsLog(path).truncate(2) == 1
    assert path.read_bytes() == body.rsplit(b"\n", 2)[0] + b"\n"  # records 1 and 2, whole, no mark
