"""Review probes of the afternoon commits (helper 54j): the DDP gradient check under gradient accumulation, a train
metric only some ranks report across a checkpoint that cuts its log window, and ``_bit_equal``'s dense copy.

One launch of two Gloo ranks (``launch_gloo_ranks`` of tests/train/train_tiny_tasks.py, no fork) runs the DDP
scenarios, each writing what it saw as soon as it ends.
"""

from __future__ import annotations

import functools
import importlib.util
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]

_WORKER = textwrap.dedent('''
    import datetime, json, os, sys
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from diffusionformer.train import Trainer, TrainConfig, read_metrics

    RANK = int(os.environ["RANK"])
    OUT = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))


    def config(**kw):
        base = dict(max_steps=1, batch_size=8, lr=3e-2, min_lr=1e-3, warmup_steps=1, grad_clip=0.0, eval_interval=0,
                    log_interval=1, checkpoint_interval=0, seed=0, device="cpu", progress=False)
        base.update(kw)
        return TrainConfig(**base)


    class Net(torch.nn.Module):
        """A regression body and an auxiliary head (``aux``) the task calls on some micro-batches only."""

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.body = torch.nn.Linear(3, 4, dtype=torch.float64)
            self.aux = torch.nn.Linear(4, 1, dtype=torch.float64)

        def forward(self, x):
            return self.body(x)


    class Task:
        """``aux_on``: the loss calls (1-based, counted over the run) that also use the auxiliary head; ``extra``:
        metrics of a batch."""

        def __init__(self, aux_on=lambda call: False, extra=lambda batch: {}, stop_at=None):
            self.aux_on, self.extra, self.stop_at, self.calls = aux_on, extra, stop_at, 0

        def train_batch(self, step, generator, batch_size):
            if step == self.stop_at:
                raise KeyboardInterrupt(f"killed at update {step}")
            x = torch.randn(batch_size, 3, generator=generator, dtype=torch.float64)
            return {"x": x, "y": x @ torch.arange(12.0, dtype=torch.float64).view(3, 4), "step": step}

        def loss(self, model, batch):
            self.calls += 1
            h = model(batch["x"])
            loss = F.mse_loss(h, batch["y"])
            if self.aux_on(self.calls):
                loss = loss + model.module.aux(h).pow(2).mean()
            return loss, dict(self.extra(batch))

        def evaluate(self, model, max_batches):
            return {}


    def scenario(name, fn):
        try:
            got = {"ok": fn()}
        except Exception as err:
            got = {"error": f"{type(err).__name__}: {err}"}
        with open(os.path.join(OUT, f"{name}_rank{RANK}.json"), "w") as f:
            json.dump(got, f)


    def fit(name, task, **kw):
        model = Net()
        Trainer(model, task, config(**kw), os.path.join(OUT, name)).fit()
        torch.save(model.state_dict(), os.path.join(OUT, f"{name}_rank{RANK}.pt"))
        return "completed"


    # 2 micro-batches per update: the head on the first (no_sync) only, then on the last (the averaged one) only
    scenario("aux_first", lambda: fit("aux_first", Task(aux_on=lambda call: call % 2 == 1), grad_accum_steps=2))
    scenario("aux_last", lambda: fit("aux_last", Task(aux_on=lambda call: call % 2 == 0), grad_accum_steps=2))

    # "rare" on rank 1 only, its value the update's index; a window of 4 cut by the checkpoint of update 2
    rare = lambda batch: {"rare": float(batch["step"])} if RANK == 1 else {}
    def resumed():
        for name, stop_at, resume in (("whole", None, False), ("cut", 3, False), ("cut", None, True)):
            try:
                Trainer(Net().body, Task(extra=rare, stop_at=stop_at), config(max_steps=4, log_interval=4,
                        checkpoint_interval=2), os.path.join(OUT, name), resume=resume).fit()
            except KeyboardInterrupt:
                pass
        return {name: [r["metrics"] for r in read_metrics(os.path.join(OUT, name)) if r["split"] == "train"]
                for name in ("whole", "cut")}
    scenario("rare", resumed)
    sys.stdout.flush()
    os._exit(0)
''')


@functools.cache
def _tiny_tasks() -> Any:
    """tests/train/train_tiny_tasks.py (loaded by path: tests/train is not on this folder's path)."""
    spec = importlib.util.spec_from_file_location("_tiny_tasks_54j", REPO / "tests" / "train" / "train_tiny_tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> Path:
    return _tiny_tasks().launch_scenarios(_WORKER, tmp_path_factory.mktemp("review54j"))


def _scenario(out: Path, name: str) -> list[dict]:
    return _tiny_tasks().read_scenario(out, name)


@pytest.mark.slow
def test_bug_a_parameter_used_only_before_the_last_micro_batch_is_refused(ranks):
    """Bug: under gradient accumulation DDP averages only the last micro-batch's backward (the others run under
    ``no_sync``), and a bucket only once every parameter in it got a gradient in that backward. The DDP gradient
    check read ``p.grad is None``: an auxiliary head used on the first micro-batch only kept the gradient that one
    left, so the check passed, no bucket was averaged and a 1-update run ended "completed" with replicas that differ
    in every weight (the body's too). Now the gradients are compared with those before the last backward: the head
    is named on every rank; used on the last micro-batch only, the run trains with equal replicas."""
    for rank, result in enumerate(_scenario(ranks, "aux_first")):
        error = result.get("error", "")
        assert error.startswith("ValueError:"), result
        assert "['aux.weight', 'aux.bias']" in error and f"rank {rank}" in error, error
    got = _scenario(ranks, "aux_last")
    assert got[0] == got[1] == {"ok": "completed"}, got
    r0, r1 = (torch.load(ranks / f"aux_last_rank{r}.pt", weights_only=True) for r in range(2))
    assert all(torch.equal(r0[k], r1[k]) for k in r0)


@pytest.mark.slow
def test_bug_a_metric_of_one_rank_resumes_to_the_uninterrupted_record(ranks):
    """Bug: a train metric only rank 1 reports (its value the update's index: 0, 1, 2, 3) logged 1.5 over a window of
    4 updates, but 1.0 where the checkpoint of update 2 cut that window and the run resumed: the checkpoint saved
    rank 1's part (0 + 1 over 2 updates), every rank loaded it, and at the log rank 0, which never reported the
    metric, counted as reporting it with that carried part alone (mean of 0.5 and rank 1's 1.5). Now a rank that
    holds a name only as the resumed checkpoint's is left out of its mean where another rank added to it."""
    got = _scenario(ranks, "rare")
    assert got[0] == got[1] and "ok" in got[0], got
    logs = got[0]["ok"]
    assert logs["whole"] == [{"rare": 1.5}], logs
    assert logs["cut"] == logs["whole"], logs


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """The aten operators run under it, with the element counts of their tensor outputs."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append((str(func), out.numel() if isinstance(out, torch.Tensor) else 0))
        return out


def test_bug_checkpoint_comparison_copies_no_contiguous_tensor():
    """Bug: ``_bit_equal`` (``assert_same_checkpoint_weights``) cloned every tensor of both state dicts before its
    byte view (to mend a one-element view of stride 2, whose byte view failed), where ``contiguous()`` had copied
    none of a checkpoint's contiguous weights: a comparison of two large checkpoints held a copy of each tensor
    twice over. Now only a tensor whose flat view lacks unit stride is copied; that view and an expanded one-element
    tensor still compare by their bytes."""
    from diffusionformer.testing.faults import _bit_equal

    a = torch.randn(256, 64)
    b = a.clone()
    with _Ops() as mode:
        assert _bit_equal(a, b)
    copies = [(op, n) for op, n in mode.ops if n >= a.numel()]
    assert [op for op, _ in copies if "clone" in op or "copy" in op] == [], mode.ops
    strided = torch.arange(4.0)[::2][:1]  # shape (1,), stride (2,): contiguous as it is
    assert strided.stride() == (2,) and strided.is_contiguous()
    assert _bit_equal(strided, torch.zeros(1)) and not _bit_equal(strided, torch.tensor([-0.0]))
    assert _bit_equal(torch.tensor(3.0).expand(1), torch.tensor([3.0]))
    base = torch.randn(3, 4)
    assert _bit_equal(base.t(), base.t().contiguous())  # a transposed view: copied by contiguous(), compared
    assert _bit_equal(torch.empty(0, 3).t(), torch.empty(3, 0))
