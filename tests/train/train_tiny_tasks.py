"""Tiny models and tasks shared by the trainer tests and the DDP worker script."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from diffusionformer.train import TrainConfig


class FakeSummaryWriter:
    """A stand-in ``SummaryWriter`` (tensorboard is optional) that records how it was opened (``opened``: the
    ``purge_step`` of every writer made; reset it in a test) and what it was given (``scalars``)."""

    opened: list[int | None] = []

    def __init__(self, log_dir: Any, purge_step: int | None = None) -> None:
        FakeSummaryWriter.opened.append(purge_step)
        self.scalars: list[tuple[str, float, int]] = []

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        self.scalars.append((tag, value, global_step))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class SimulatedKill(Exception):
    """Raised by a task to stop a run at a chosen step, as a kill would."""


class TinyMLP(nn.Module):
    """``Linear -> GELU -> Dropout -> LayerNorm -> Linear``: decayed and non-decayed params."""

    def __init__(self, in_dim: int = 4, hidden: int = 16, out_dim: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden)
        self.drop = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(self.drop(F.gelu(self.fc1(x)))))


class RegressionTask:
    """``y = x W + 0.1 noise`` with batches drawn from the trainer's generator.

    ``global_rng=True`` also multiplies the loss by a jitter drawn from NumPy's and Python's
    global generators, so a resume that forgets to restore them is caught. ``eval`` draws from
    torch's global RNG on purpose (the trainer must isolate it).
    """

    def __init__(
        self,
        *,
        in_dim: int = 4,
        out_dim: int = 2,
        fail_at: int | None = None,
        nan_at: int | None = None,
        global_rng: bool = True,
        target_scale: float = 1.0,
    ) -> None:
        g = torch.Generator().manual_seed(1234)
        self.w = torch.randn(in_dim, out_dim, generator=g)
        self.x_eval = torch.randn(32, in_dim, generator=g)
        self.y_eval = self.x_eval @ self.w * target_scale
        self.in_dim = in_dim
        self.fail_at = fail_at
        self.nan_at = nan_at
        self.global_rng = global_rng
        self.target_scale = target_scale
        self.steps_seen: list[int] = []
        self.eval_calls: list[int | None] = []

    def train_batch(self, step: int, generator: torch.Generator, batch_size: int) -> dict[str, Any]:
        if self.fail_at is not None and step == self.fail_at:
            raise SimulatedKill(f"killed at step {step}")
        self.steps_seen.append(step)
        x = torch.randn(batch_size, self.in_dim, generator=generator)
        y = x @ self.w * self.target_scale + 0.1 * torch.randn(batch_size, self.w.shape[1], generator=generator)
        if self.nan_at is not None and step == self.nan_at:
            x[0, 0] = float("nan")
        return {"x": x, "y": y}

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        pred = model(batch["x"])
        loss = F.mse_loss(pred.float(), batch["y"])
        if self.global_rng:
            loss = loss * (1.0 + 1e-3 * (float(np.random.rand()) + random.random()))
        return loss, {"mae": (pred.float() - batch["y"]).abs().mean(), "one": 1.0}

    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, float]:
        self.eval_calls.append(max_batches)
        device = next(model.parameters()).device
        _ = torch.rand(3), np.random.rand(), random.random()  # must not leak into training
        pred = model(self.x_eval.to(device)).float()
        return {"loss": F.mse_loss(pred, self.y_eval.to(device)).item(), "n": 32}


def tiny_config(**overrides: Any) -> TrainConfig:
    """A 10-step CPU config with every feature on (warm-up, clipping, eval, checkpoints)."""
    base = dict(max_steps=10, batch_size=8, lr=1e-2, min_lr=1e-3, weight_decay=0.1, warmup_steps=2,
                grad_clip=1.0, eval_interval=5, log_interval=1, checkpoint_interval=3, seed=0,
                device="cpu", progress=False)
    base.update(overrides)
    return TrainConfig(**base)


def fit_on_threads(root: Any, threads: int, resume: bool, **config: Any) -> dict:
    """``Trainer(TinyMLP(dropout=0), RegressionTask(global_rng=False), tiny_config(**config), root).fit()`` from
    ``seed_everything(0)``, with ``threads`` torch threads during the fit (the caller's count restored after)."""
    from diffusionformer.train import Trainer, seed_everything

    seed_everything(0)
    trainer = Trainer(TinyMLP(dropout=0.0), RegressionTask(global_rng=False), tiny_config(**config), root,
                      resume=resume)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return trainer.fit()
    finally:
        torch.set_num_threads(before)


def ddp_config(**overrides: Any) -> TrainConfig:
    """The config shared by the 2-process run and its single-process reference."""
    base = dict(max_steps=6, batch_size=8, lr=1e-2, min_lr=1e-3, warmup_steps=1, grad_clip=1.0,
                eval_interval=3, log_interval=2, checkpoint_interval=3, seed=0, device="cpu",
                progress=False)
    base.update(overrides)
    return TrainConfig(**base)


class InfGrad(torch.autograd.Function):
    """Zero forward, infinite gradient: a finite loss whose update is not."""

    @staticmethod
    def forward(ctx, x):
        return torch.zeros_like(x)

    @staticmethod
    def backward(ctx, g):
        return torch.full_like(g, float("inf"))


class InfGradAt(RegressionTask):
    """A regression task whose update ``bad`` has an infinite gradient (and a finite loss)."""

    def __init__(self, bad: int, global_rng: bool = True) -> None:
        super().__init__(global_rng=global_rng)
        self.bad, self.step = bad, None

    def train_batch(self, step, generator, batch_size):
        self.step = step
        return super().train_batch(step, generator, batch_size)

    def loss(self, model, batch):
        loss, metrics = super().loss(model, batch)
        if self.step == self.bad:
            loss = loss + InfGrad.apply(model.fc2.weight).sum()
        return loss, metrics


class CorruptingEval(RegressionTask):
    """An ``evaluate`` that writes an infinity into the weights on its second call (non-finite
    parameters without a non-finite loss or gradient)."""

    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, float]:
        out = super().evaluate(model, max_batches)
        if len(self.eval_calls) == 2:
            with torch.no_grad():
                model.fc2.bias.fill_(float("inf"))
        return out


def fp16_supported() -> bool:
    """Whether this torch build has fp16 autocast and a GradScaler on CPU."""
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            y = nn.Linear(2, 2)(torch.randn(3, 2))
        torch.amp.GradScaler("cpu")
        return y.dtype == torch.float16
    except (RuntimeError, TypeError, ValueError):
        return False


# ---------------------------------------------------------------- multi-process launches (the DDP tests)
REPO = Path(__file__).resolve().parents[2]
#: the torchrun variables a test's own environment must not pass on to the ranks it starts
DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
             "TORCHELASTIC_RUN_ID")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for ``MASTER_PORT``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# runs a worker script as `python script args` would (its folder first on sys.path), then leaves without the
# interpreter's teardown: Gloo's may abort a process at exit ("terminate called without an active exception",
# pytorch/pytorch#179291; seen once each in CI runs of sitting 38 and 41), after the rank's work is done and checked
# by its files and output; an exception in the script still exits 1 with its traceback
_RUN_THEN_LEAVE = ("import os, runpy, sys; sys.argv = sys.argv[1:]; sys.path[0] = os.path.dirname(os.path.abspath("
                   "sys.argv[0])); runpy.run_path(sys.argv[0], run_name='__main__'); sys.stdout.flush(); "
                   "sys.stderr.flush(); os._exit(0)")


def launch_gloo_ranks(script: Path, args: list[str], cwd: Path, world_size: int = 2, timeout: float = 90.0) -> list[str]:
    """Run ``script args`` as ``world_size`` fresh interpreters (no fork) of one process group (``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` set, one thread each, this checkout first on the
    path); every rank must exit 0. Returns each rank's output (stdout and stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world_size))
    procs = [subprocess.Popen([sys.executable, "-c", _RUN_THEN_LEAVE, str(script), *args], cwd=cwd,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world_size)]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, text) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {r} failed:\n{text[-4000:]}"
    return outputs


#: the end of a rank's script that runs a comparison (``runner``, ``cfg``, ``results``, ``out`` and ``rank`` defined
#: before it; ``json`` and ``time`` imported): its statuses, log and error written to ``out/rank<r>.json``
RUN_EXPERIMENT_RECORD = '''t0 = time.perf_counter()
record = {"error": None, "log": [], "status": None}
try:
    done = runner.run_experiment(cfg, results, progress=False, log=record["log"].append)
    record["status"] = [r.status for r in done]
except BaseException as err:
    record["error"] = f"{type(err).__name__}: {err}"
record["seconds"] = time.perf_counter() - t0
(out / f"rank{rank}.json").write_text(json.dumps(record))
'''


def launch_scenarios(worker: str, tmp: Path, timeout: float = 90.0) -> Path:
    """Write ``worker`` to ``tmp/worker.py`` and run it on two ranks (:func:`launch_gloo_ranks`) with the folder
    ``tmp/out`` as its argument, into which it writes ``<scenario>_rank<r>.json`` as each scenario ends; returns that
    folder. A rank that failed is recorded in its ``launch_error.txt``, not raised: each test reads the scenarios
    that finished (:func:`read_scenario`)."""
    script = tmp / "worker.py"
    script.write_text(worker)
    out = tmp / "out"
    out.mkdir()
    try:
        launch_gloo_ranks(script, [str(out)], tmp, timeout=timeout)
    except AssertionError as err:  # a rank that failed: each test reads the scenarios that finished
        (out / "launch_error.txt").write_text(str(err))
    return out


def read_scenario(out: Path, name: str, world_size: int = 2) -> list[dict]:
    """Each rank's record of scenario ``name`` from a :func:`launch_scenarios` folder; a scenario that did not finish
    on a rank fails with the launch's error."""
    got = []
    for rank in range(world_size):
        path = out / f"{name}_rank{rank}.json"
        if not path.exists():
            launch = out / "launch_error.txt"
            raise AssertionError(f"scenario {name} did not finish on rank {rank}: "
                                 f"{launch.read_text()[-3000:] if launch.exists() else 'no file'}")
        got.append(json.loads(path.read_text()))
    return got
