"""Progress of a comparison: a bar over runs and, nested under it, a bar over each run's steps."""

from __future__ import annotations

import io

import pytest

import diffusionformer.experiments.runner as runner_mod
import diffusionformer.train.trainer as trainer_mod
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.runner import run_experiment


def _config():
    return load_experiment_config({
        "name": "prog",
        "seeds": [0, 1],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
                   "train": {"max_steps": 4, "batch_size": 8, "warmup_steps": 0, "eval_interval": 2,
                             "log_interval": 2, "checkpoint_interval": 4}}],
        "operators": [{"name": "attention"}],
    })


class _Bar:
    """Records what the runner and the trainer ask of tqdm."""

    made: list["_Bar"] = []

    def __init__(self, *args, **kwargs):
        self.kwargs = kwargs
        self.n = kwargs.get("initial", 0)
        self.postfix: dict[str, str] = {}
        self.closed = False
        _Bar.made.append(self)

    def update(self, k=1):
        self.n += k

    def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
        self.postfix = {**(ordered_dict or {}), **kwargs}

    def set_postfix_str(self, s="", refresh=True):
        self.postfix_str = s

    def close(self):
        self.closed = True


@pytest.fixture
def bars(monkeypatch):
    _Bar.made = []
    monkeypatch.setattr(runner_mod, "tqdm", _Bar)
    monkeypatch.setattr(trainer_mod, "tqdm", _Bar)
    return _Bar.made


def test_each_run_gets_a_step_bar_under_the_runs_bar(tmp_path, bars):
    run_experiment(_config(), tmp_path, progress=True, log=lambda s: None)
    outer, *inner = bars
    assert outer.kwargs["unit"] == "run" and outer.kwargs["total"] == 2 and outer.n == 2 and not outer.kwargs["disable"]
    assert len(inner) == 2  # one per run
    for bar in inner:
        assert bar.kwargs["unit"] == "step" and bar.kwargs["total"] == 4 and bar.n == 4 and bar.closed
        assert bar.kwargs["leave"] is None  # nested bars disappear when their run ends; tqdm shows rate and ETA
        assert bar.kwargs["disable"] is None  # shown on a terminal
        assert {"loss", "lr", "eval_loss"} <= set(bar.postfix)  # the latest train loss stays beside the eval loss
        assert float(bar.postfix["loss"]) > 0
    assert outer.closed


def test_no_progress_disables_both_bars(tmp_path, bars):
    run_experiment(_config(), tmp_path, progress=False, log=lambda s: None)
    assert len(bars) == 3 and all(b.kwargs["disable"] is True for b in bars)


def test_a_real_nested_bar_reports_steps_per_second_and_eta():
    """What tqdm prints for the trainer's bar arguments: steps, rate in step/s and the time left."""
    from tqdm import tqdm

    out = io.StringIO()
    with tqdm(total=3, file=out, desc="runs", unit="run") as runs:
        bar = tqdm(total=10, file=out, desc="train", unit="step", leave=None, mininterval=0)
        for _ in range(4):
            bar.update(1)
        bar.set_postfix({"loss": "2.31"})
        text = out.getvalue()
        bar.close()
        runs.update(1)
    assert "4/10" in text and "step/s" in text and "loss=2.31" in text and "<" in text  # elapsed<remaining


def test_bug_bars_stay_off_when_stderr_is_not_a_terminal(tmp_path, capsys):
    """Bug: the runs bar was created with ``disable=False`` whenever progress was on, so ``run c.toml 2> log`` (or a
    batch job's captured stderr) filled the log with the bar's carriage-return redraws; like the step bars it is
    now shown on a terminal only (tqdm's ``disable=None``), read back from a real run's captured stderr."""
    run_experiment(_config(), tmp_path, progress=True, log=lambda s: None)
    err = capsys.readouterr().err
    assert "\r" not in err and "run/s" not in err and "prog:" not in err, err[:200]
