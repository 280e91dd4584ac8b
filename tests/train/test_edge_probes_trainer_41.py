"""Edge probes of the trainer from a user's side (41st pass): the precision of the train log window."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.testing import assert_same_checkpoint_weights, interrupt_on_call
from diffusionformer.train import Trainer, read_metrics, seed_everything
from train_tiny_tasks import RegressionTask, TinyMLP, tiny_config


class _Float64(RegressionTask):
    """A float64 regression whose loss is scaled by ``scale``; it records every loss in float64 and returns a Python
    float metric (1/3), a float64 tensor metric (the unscaled loss plus 1e-12) and an int64 count (2**24 + 1)."""

    def __init__(self, scale: float) -> None:
        super().__init__(global_rng=False)
        self.scale, self.losses = scale, []

    def loss(self, model, batch):
        pred = model(batch["x"].double())
        base = torch.nn.functional.mse_loss(pred, batch["y"].double())
        self.losses.append(float(base.detach()) * self.scale)
        return base * self.scale, {"third": 1.0 / 3.0, "fine": base.detach() + 1e-12,
                                   "count": torch.tensor(2**24 + 1)}

    def evaluate(self, model, max_batches):
        return {"third": 1.0 / 3.0}


@pytest.mark.parametrize("accum", [1, 2])
def test_bug_train_log_keeps_float64_losses_and_python_float_metrics(tmp_path, accum):
    """Bug: the train log window was summed in float32 (``.float()`` on the loss and every metric, Python numbers as
    float32 tensors), so a float64 run whose loss was finite beyond 3.4e38 logged ``loss`` and ``grad_norm`` as inf
    (``null`` in metrics.jsonl) although the run went on as finite, a float64 loss or metric was logged rounded to
    float32, a Python float metric 1/3 came back as 0.3333333432674408 in the train record (the eval record of
    the same 1/3 kept it exact), and an int64 count 2**24 + 1 as 2**24."""
    seed_everything(0)
    model = TinyMLP(dropout=0.0).double()
    task = _Float64(scale=1e39)
    cfg = tiny_config(max_steps=2, warmup_steps=0, eval_interval=0, log_interval=1, grad_accum_steps=accum)
    summary = Trainer(model, task, cfg, tmp_path).fit()
    train = [r for r in read_metrics(tmp_path) if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2] and summary["status"] == "completed"
    for i, record in enumerate(train):
        want = sum(task.losses[accum * i: accum * (i + 1)]) / accum  # the float64 mean over the micro-batches
        assert math.isfinite(record["loss"]) and record["loss"] == pytest.approx(want, rel=1e-12)
        assert record["metrics"]["third"] == 1.0 / 3.0 and record["metrics"]["count"] == 2**24 + 1
        assert record["metrics"]["fine"] == pytest.approx(want / 1e39 + 1e-12, rel=1e-12)
        assert math.isfinite(record["metrics"]["grad_norm"]) and record["metrics"]["grad_norm"] > 1e38
    assert summary["train"]["loss"] == train[-1]["loss"]


def test_pins_a_float64_run_killed_inside_a_log_window_resumes_to_the_same_log_and_weights(tmp_path):
    """A float64 run with a Python float metric, killed after a checkpoint that cut a log window (checkpoint every
    3 updates, a record every 4), resumes to the uninterrupted run's records (every value but the clocks) and
    weights, bit for bit: the window sums keep their own dtypes through the checkpoint."""
    cfg = tiny_config(max_steps=9, warmup_steps=0, eval_interval=0, log_interval=4, checkpoint_interval=3)

    def fit(out, resume=False):
        seed_everything(0)
        return Trainer(TinyMLP(dropout=0.0).double(), _Float64(scale=1.0), cfg, out, resume=resume).fit()

    fit(tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt), interrupt_on_call(_Float64, "loss", 8):
        fit(tmp_path / "cut")
    fit(tmp_path / "cut", resume=True)

    def records(out):
        return [{k: v for k, v in r.items() if k not in ("elapsed", "time")} for r in read_metrics(out)]

    assert records(tmp_path / "cut") == records(tmp_path / "whole")
    assert [r["step"] for r in records(tmp_path / "whole") if r["split"] == "train"] == [4, 8, 9]
    assert_same_checkpoint_weights(tmp_path / "whole" / "checkpoint.pt", tmp_path / "cut" / "checkpoint.pt")


@pytest.mark.parametrize("max_steps", [1, 5, 7])
def test_pins_eval_log_and_checkpoint_cadence_against_the_documented_rule(tmp_path, max_steps):
    """Evaluations at every multiple of eval_interval up to max_steps and always at the last update (0 = only there),
    train records likewise for log_interval, whether or not the interval divides max_steps or exceeds it; the
    checkpoint on disk is the last update's."""
    for e in (0, 1, 3, 7, 9):
        for li in (1, 2, 4):
            out = tmp_path / f"e{e}l{li}"
            seed_everything(0)
            cfg = tiny_config(max_steps=max_steps, warmup_steps=0, eval_interval=e, log_interval=li,
                              checkpoint_interval=2)
            Trainer(TinyMLP(), RegressionTask(), cfg, out).fit()
            recs = read_metrics(out)
            want_eval = sorted({s for s in range(1, max_steps + 1) if e and s % e == 0} | {max_steps})
            want_log = sorted({s for s in range(1, max_steps + 1) if s % li == 0} | {max_steps})
            assert [r["step"] for r in recs if r["split"] == "eval"] == want_eval, (e, li)
            assert [r["step"] for r in recs if r["split"] == "train"] == want_log, (e, li)
            assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == max_steps


def test_pins_no_progress_output_when_stderr_and_stdout_are_not_terminals(tmp_path):
    """progress=True shows a bar "only on a terminal": a run in a fresh interpreter whose stdout and stderr are pipes
    writes nothing to either (no carriage-return bar frames in a batch job's log)."""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from train_tiny_tasks import RegressionTask, TinyMLP, tiny_config\n"
        "from diffusionformer.train import Trainer, seed_everything\n"
        "seed_everything(0)\n"
        "cfg = tiny_config(progress=True, max_steps=3, warmup_steps=0)\n"
        "Trainer(TinyMLP(), RegressionTask(), cfg, sys.argv[2]).fit()\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("TQDM_")}
    env["PYTHONPATH"] = str(here.parents[1]) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONWARNINGS"] = "ignore"
    done = subprocess.run([sys.executable, "-c", code, str(here), str(tmp_path / "run")], capture_output=True,
                          env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout == b"" and done.stderr == b"", (done.stdout[-500:], done.stderr[-500:])
    assert (tmp_path / "run" / "summary.json").exists()
