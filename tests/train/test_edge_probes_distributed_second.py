"""Edge probes of multi-process data-parallel training (``diffusionformer.train.distributed`` and the Trainer's use of it).

The two-process tests start two fresh interpreters (no fork) that join a Gloo group through ``MASTER_ADDR`` /
``MASTER_PORT`` and run a worker script written to ``tmp_path``.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from train_tiny_tasks import launch_gloo_ranks


_WORKER_HEADER = textwrap.dedent('''
    import json, os, sys
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from diffusionformer.train import Trainer, TrainConfig, seed_everything, read_metrics

    torch.set_num_threads(1)
    RANK = int(os.environ["RANK"])
    OUT = sys.argv[1]


    class Kill(Exception):
        pass


    class Task:
        """y = x W + noise; ``fail_at`` raises in train_batch on every rank, as a kill would."""

        def __init__(self, fail_at=None):
            g = torch.Generator().manual_seed(7)
            self.w = torch.randn(3, 2, generator=g)
            self.fail_at = fail_at

        def train_batch(self, step, generator, batch_size):
            if step == self.fail_at:
                raise Kill(step)
            x = torch.randn(batch_size, 3, generator=generator)
            # rank 1's half of the batch has much larger targets: per-rank window sums differ a lot
            scale = torch.ones(batch_size, 1)
            scale[batch_size // 2:] = 5.0
            return {"x": x, "y": (x @ self.w + 0.1 * torch.randn(batch_size, 2, generator=generator)) * scale}

        def loss(self, model, batch):
            pred = model(batch["x"])
            return F.mse_loss(pred, batch["y"]), {"mae": (pred - batch["y"]).abs().mean()}

        def evaluate(self, model, max_batches):
            return {"loss": 0.0}


    def model():
        seed_everything(0)
        return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))


    def config(**kw):
        base = dict(max_steps=6, lr_decay_steps=6, batch_size=8, lr=1e-2, min_lr=1e-3, warmup_steps=1,
                    grad_clip=1.0, eval_interval=6, log_interval=2, checkpoint_interval=3, seed=0, device="cpu",
                    progress=False)
        base.update(kw)
        return TrainConfig(**base)


    dist.init_process_group("gloo")  # the Trainer uses this group as is: several runs in one launch
''')


def _launch(tmp_path: Path, body: str, world_size: int = 2, timeout: float = 90.0) -> Path:
    """Run ``_WORKER_HEADER + body`` as ``world_size`` fresh processes of one Gloo group; return the out dir."""
    script = tmp_path / "worker.py"
    script.write_text(_WORKER_HEADER + textwrap.dedent(body) + "\ndist.destroy_process_group()\n")
    out = tmp_path / "out"
    out.mkdir()
    launch_gloo_ranks(script, [str(out)], tmp_path, world_size, timeout)
    return out


@pytest.mark.slow
def test_bug_ddp_resume_window_of_every_rank(tmp_path):
    """Bug: the checkpoint held rank 0's running log-window sums only, and a resumed run loaded them on every rank,
    so the first train record after a resume (whose window the checkpoint had cut) averaged rank 0's pre-checkpoint
    sums twice instead of each rank's own: its loss differed from the uninterrupted run's."""
    out = _launch(tmp_path, '''
        Trainer(model(), Task(), config(), os.path.join(OUT, "whole")).fit()
        try:
            Trainer(model(), Task(fail_at=4), config(), os.path.join(OUT, "killed")).fit()
        except Kill:
            pass
        else:
            raise AssertionError("no kill")
        resumed = model()
        Trainer(resumed, Task(), config(), os.path.join(OUT, "killed"), resume=True).fit()
        torch.save(resumed.state_dict(), os.path.join(OUT, f"resumed_rank{RANK}.pt"))
    ''')
    import torch

    from diffusionformer.train import load_checkpoint, read_metrics

    whole = [r for r in read_metrics(out / "whole") if r["split"] == "train"]
    resumed = [r for r in read_metrics(out / "killed") if r["split"] == "train"]
    assert [r["step"] for r in whole] == [r["step"] for r in resumed] == [2, 4, 6]
    for a, b in zip(whole, resumed):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6), (a["step"], a["loss"], b["loss"])
        assert b["metrics"]["mae"] == pytest.approx(a["metrics"]["mae"], rel=1e-6), a["step"]
    final = load_checkpoint(out / "whole" / "checkpoint.pt")["model"]
    for rank in range(2):  # every rank resumed to the same weights, bit for bit
        replica = torch.load(out / f"resumed_rank{rank}.pt", weights_only=True)
        assert all(torch.equal(replica[k], final[k]) for k in final)
    # rank 0 alone wrote files
    assert sorted(p.name for p in (out / "whole").iterdir()) == ["checkpoint.pt", "metrics.jsonl", "summary.json"]
    assert json.loads((out / "whole" / "summary.json").read_text())["world_size"] == 2
