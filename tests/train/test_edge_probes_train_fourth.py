"""Edge probes of diffusionformer.train (fourth pass): schedule, optimizer groups, RNG, resume, distributed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils.rnn import pack_sequence
from train_tiny_tasks import RegressionTask, SimulatedKill, TinyMLP, tiny_config

from diffusionformer.train import Trainer, cosine_lr, param_groups, read_metrics, seed_everything
from diffusionformer.train.distributed import init_distributed, shard_batch


def _round_trip_weights_only(obj, path):
    torch.save(obj, path)
    return torch.load(path, weights_only=True)


def _adamw_state_after_one_step(groups, lr=None):
    model_params = [p for g in groups for p in g["params"]]
    optimizer = torch.optim.AdamW(groups, lr=1e-3)
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    sum(p.sum() for p in model_params).backward()
    optimizer.step()
    return optimizer.state_dict()


def _hand_cosine_lr(s, lr, min_lr, warmup, decay):
    """nanoGPT's get_lr in float64, with its division by zero at decay == warmup read as the floor."""
    if s < warmup:
        return lr * (s + 1) / (warmup + 1)
    if s > decay or decay == warmup:
        return min_lr
    ratio = (s - warmup) / (decay - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


@pytest.mark.parametrize(("warmup", "decay"), [(0, 1), (1, 1), (3, 3), (0, 7), (2, 7), (6, 7)])
def test_cosine_lr_matches_the_hand_formula_at_every_step(warmup, decay):
    for s in range(decay + 3):
        got = cosine_lr(s, lr=3e-4, min_lr=1e-5, warmup_steps=warmup, decay_steps=decay)
        assert got == pytest.approx(_hand_cosine_lr(s, 3e-4, 1e-5, warmup, decay), rel=1e-15, abs=0.0), s


def test_bug_cosine_lr_returns_python_floats_and_refuses_non_finite_rates(tmp_path):
    """Bug: cosine_lr gave back NumPy scalars for a NumPy step or rate (np.float64 in the warm-up, np.float32 min_lr at
    the floor): set as an optimizer's lr, they made its state_dict unloadable with torch.load(weights_only=True). A NaN
    or infinite lr / min_lr came back as the learning rate without a word."""
    kwargs = dict(lr=1e-3, min_lr=np.float32(1e-4), warmup_steps=2, decay_steps=5)
    values = [cosine_lr(np.int64(s), **kwargs) for s in range(7)]
    assert all(type(v) is float for v in values), [type(v) for v in values]
    assert values[0] == pytest.approx(1e-3 / 3) and values[-1] == pytest.approx(1e-4)
    state = _adamw_state_after_one_step([{"params": [nn.Parameter(torch.ones(2))]}], lr=values[0])
    assert _round_trip_weights_only(state, tmp_path / "opt.pt")["param_groups"][0]["lr"] == values[0]
    for bad in ({"lr": float("nan")}, {"lr": float("inf")}, {"min_lr": float("nan")}, {"min_lr": -float("inf")}):
        name = next(iter(bad))
        with pytest.raises(ValueError, match=rf"cosine_lr: expected {name} a finite float, got"):
            cosine_lr(0, **{**dict(lr=1e-3, min_lr=0.0, warmup_steps=1, decay_steps=3), **bad})


def test_bug_param_groups_numpy_weight_decay_leaves_a_loadable_optimizer_state(tmp_path):
    """Bug: param_groups(model, np.float64(0.1)) (a sweep grid's rate) stored the NumPy scalar in the decayed group:
    the AdamW state_dict built on it failed torch.load(weights_only=True), the way every checkpoint is read."""
    for weight_decay in (np.float64(0.1), np.float32(0.25), np.int64(0)):
        groups = param_groups(nn.Linear(3, 3), weight_decay)
        assert type(groups[0]["weight_decay"]) is float and groups[0]["weight_decay"] == float(weight_decay)
        loaded = _round_trip_weights_only(_adamw_state_after_one_step(groups), tmp_path / "opt.pt")
        assert loaded["param_groups"][0]["weight_decay"] == float(weight_decay)


def test_param_groups_rules_partition_the_trainable_parameters_once():
    """Every trainable parameter in exactly one group, a tied embedding once, frozen ones in none; "nanogpt" is
    nanoGPT's configure_optimizers (every tensor with dim >= 2 decayed)."""

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(7, 4)
            self.block = nn.Linear(4, 4)
            self.norm = nn.LayerNorm(4)
            self.frozen = nn.Linear(4, 4)
            self.frozen.requires_grad_(False)
            self.head = nn.Linear(4, 7, bias=False)
            self.head.weight = self.emb.weight

    model = Tied()
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    for rule in ("default", "nanogpt"):
        groups = param_groups(model, 0.1, rule=rule)
        ids = [id(p) for g in groups for p in g["params"]]
        assert len(ids) == len(set(ids)) and set(ids) == trainable, rule
        decayed = set(groups[0]["names"])
        nanogpt = {n for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2}
        assert decayed == (nanogpt if rule == "nanogpt" else {"block.weight"}), rule
        assert all(g["weight_decay"] == (0.1 if i == 0 else 0.0) for i, g in enumerate(groups))


def test_bug_init_distributed_names_a_malformed_local_rank_of_an_existing_group(monkeypatch):
    """Bug: with a process group the caller had initialised, init_distributed read LOCAL_RANK with a bare int():
    "invalid literal for int() with base 10: 'x'" (and took LOCAL_RANK=-1, cuda:-1 on a GPU), where dist_env names
    the variable and its value. A blank LOCAL_RANK of this one-process group is unset, as dist_env reads it in a
    one-process run (it was refused here, which the "" case pinned); with several processes it is refused
    (tests/reliability/test_edge_probes_fixes_56c.py)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for raw in (None, ""):
            if raw is None:
                monkeypatch.delenv("LOCAL_RANK", raising=False)
            else:
                monkeypatch.setenv("LOCAL_RANK", raw)
            ctx = init_distributed("cpu")
            assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.owns_group) == (0, 1, 0, False)
        for raw in ("x", "-1"):
            monkeypatch.setenv("LOCAL_RANK", raw)
            with pytest.raises(ValueError, match=rf"expected LOCAL_RANK an int >= 0 .*got LOCAL_RANK='{raw}'"):
                init_distributed("cpu")
    finally:
        dist.destroy_process_group()


def test_a_single_process_gloo_group_trains_as_no_group(tmp_path):
    """A caller's one-process Gloo group: no DDP wrapper, the group is left alive, the weights equal a plain run."""
    seed_everything(0)
    plain = Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=3), tmp_path / "plain")
    plain.fit()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        seed_everything(0)
        grouped = Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=3), tmp_path / "group")
        assert grouped.fit()["world_size"] == 1
        assert dist.is_initialized()  # not the trainer's to destroy
    finally:
        dist.destroy_process_group()
    for (name, a), b in zip(plain.model.state_dict().items(), grouped.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_bug_shard_batch_refuses_a_packed_sequence():
    """Bug: shard_batch sliced each field of a PackedSequence (a named tuple) along dim 0: its data rows are time steps
    of every sequence, so a shard or micro-batch was a corrupt sequence (batch_sizes [4, 2] over 4 rows, indices out of
    range: an RNN failed with "INDICES element is out of DATA bounds" far from the cause, or ran on garbage)."""
    packed = pack_sequence([torch.ones(4, 1), torch.ones(2, 1), torch.ones(1, 1), torch.ones(1, 1)],
                           enforce_sorted=False)
    assert shard_batch({"x": packed}, 0, 1)["x"] is packed  # one shard: the batch as it is
    for rank in (0, 1):
        with pytest.raises(TypeError, match="got a PackedSequence .*give the task a shard_batch"):
            shard_batch({"x": packed, "y": torch.zeros(4)}, rank, 2)


@pytest.mark.parametrize("overrides", [dict(grad_accum_steps=2, amp="bf16"), dict(grad_clip=0.0, log_interval=3)])
def test_resume_at_every_step_boundary_is_bit_exact(tmp_path, overrides):
    """Train N steps == train k, kill, resume to N, for every k: bit-equal weights and the same metrics log."""
    n = 4
    cfg = tiny_config(max_steps=n, checkpoint_interval=1, eval_interval=2, **overrides)

    def run(out, task, resume=False, seed=0):
        seed_everything(seed)
        trainer = Trainer(TinyMLP(), task, cfg, out, resume=resume)
        trainer.fit()
        return trainer

    def records(out):
        return [(r["step"], r["split"], r["loss"], r["lr"], r["metrics"]) for r in read_metrics(out)]

    reference = run(tmp_path / "ref", RegressionTask())
    for k in range(1, n):
        out = tmp_path / f"k{k}"
        with pytest.raises(SimulatedKill):
            run(out, RegressionTask(fail_at=k))
        resumed = run(out, RegressionTask(), resume=True, seed=7)
        for (name, a), b in zip(reference.model.state_dict().items(), resumed.model.state_dict().values()):
            assert torch.equal(a, b), (k, name)
        assert records(out) == records(tmp_path / "ref"), k


class _NumpyLeafTask(RegressionTask):
    """A batch holding NumPy scalars next to its tensors (a loss scale, a count, a flag)."""

    def train_batch(self, step, generator, batch_size):
        batch = super().train_batch(step, generator, batch_size)
        batch.update(scale=np.float32(1.0), count=np.int64(batch_size), flag=np.bool_(True))
        return batch

    def loss(self, model, batch):
        loss, metrics = super().loss(model, {"x": batch["x"], "y": batch["y"]})
        return loss * float(batch["scale"]), metrics


def test_bug_numpy_scalar_leaves_are_shared_by_shards_and_micro_batches(tmp_path):
    """Bug: shard_batch refused a NumPy scalar leaf ("expected tensors, dict/list/tuple containers or plain values, got
    float32"): a task whose batch held np.float32(1.0) trained with grad_accum_steps=1 and failed with 2."""
    batch = {"x": torch.arange(4), "scale": np.float32(0.5), "count": np.int64(4), "flag": np.bool_(True)}
    part = shard_batch(batch, 1, 2)
    assert torch.equal(part["x"], torch.tensor([2, 3]))
    assert all(part[k] is batch[k] for k in ("scale", "count", "flag"))
    cfg = tiny_config(max_steps=2, grad_accum_steps=2)
    seed_everything(0)
    assert Trainer(TinyMLP(), _NumpyLeafTask(), cfg, tmp_path / "run").fit()["status"] == "completed"


def test_bug_to_device_keeps_the_attributes_of_a_userdict_batch():
    """Bug: ``to_device`` rebuilt every mapping as a plain ``dict``: a ``UserDict`` batch with attribute access (a
    tokenizer's encoding, ``batch.input_ids``) or a ``defaultdict`` came back without its attributes or factory.
    Rebuilt with its type now (sitting 33)."""
    from collections import UserDict

    from diffusionformer.train.batch import to_device

    class Encoding(UserDict):
        def __getattr__(self, name):
            try:
                return self.data[name]
            except KeyError:
                raise AttributeError(name) from None

    out = to_device(Encoding(input_ids=torch.ones(2, dtype=torch.long)), torch.device("meta"))
    assert isinstance(out, Encoding) and out.input_ids.device.type == "meta"
