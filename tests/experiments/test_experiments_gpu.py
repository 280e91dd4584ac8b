"""Runner on a GPU: device and precision checks, bf16 autocast, concurrent workers, config keys.

Everything here runs on CPU: CUDA is simulated as missing (``torch.cuda.is_available`` patched),
and the bf16 path is the CPU autocast, which goes through the same ``TrainConfig.amp`` switch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.cli import main as cli_main
from diffusionformer.experiments.gpu import check_device, precision_amp, worker_argv
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.train import read_metrics

TINY = """\
name = "tiny"
seeds = [0, 1]
{top}
[[tasks]]
name = "digits"
dataset = "digits"
model = "vit-digits"
model_overrides = {{ dim = 16, depth = 2, num_heads = 2 }}
[tasks.train]
max_steps = 6
batch_size = 16
lr = 1e-3
eval_interval = 3
log_interval = 2
checkpoint_interval = 3
{train}
[[operators]]
name = "attention"

[[operators]]
name = "lap"
laplacian_heads = "half"

[[operators]]
name = "heat"
heads = "attention:1,heat(t=0.5, learnable=True, steps=2):1"
"""


def _toml(tmp_path: Path, top: str = "", train: str = "") -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(top=top, train=train))
    return path


# ----------------------------------------------------------------------------- device
@pytest.mark.parametrize("spec", ["tpu", "cuda:x", "gpu", "", "cpu:0:1"])
def test_unknown_device_is_a_value_error(spec):
    with pytest.raises(ValueError, match="expected 'auto', 'cpu', 'cuda' or 'cuda:N'"):
        check_device(spec)


def test_device_must_be_a_string():
    with pytest.raises(TypeError, match="device"):
        check_device(0)  # type: ignore[arg-type]


def test_cuda_without_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"torch.cuda.is_available\(\) is False.*--device cpu"):
        check_device("cuda")
    with pytest.raises(ValueError, match="is_available"):
        check_device("cuda:1")
    assert check_device("cuda", available=False) == torch.device("cuda")  # spelling only
    assert check_device("cpu") == torch.device("cpu") and check_device("auto") is None


def test_cuda_index_beyond_the_devices_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"2 CUDA device\(s\)"):
        check_device("cuda:2")


def test_cli_refuses_cuda_before_loading_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    toml = _toml(tmp_path)
    out = tmp_path / "res"
    assert cli_main(["run", str(toml), "--out", str(out), "--device", "cuda", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "torch.cuda.is_available() is False" in err
    assert not out.exists()  # refused before any folder, data or model
    assert cli_main(["run", str(toml), "--out", str(out), "--device", "tpu", "--no-progress"]) == 2
    assert "got 'tpu'" in capsys.readouterr().err
    # the config's own device is checked the same way
    toml = _toml(tmp_path, top='device = "cuda"')
    assert cli_main(["run", str(toml), "--out", str(out), "--no-progress"]) == 2
    assert "is_available() is False" in capsys.readouterr().err
    with pytest.raises(ValueError, match="is_available"):
        run_experiment(load_experiment_config(toml), out, progress=False)
    assert not out.exists()


def test_cli_parses_precision_and_workers(tmp_path, capsys):
    toml = _toml(tmp_path)
    with pytest.raises(SystemExit):
        cli_main(["run", str(toml), "--precision", "fp16"])
    assert "invalid choice: 'fp16'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["run", str(toml), "--workers", "two"])
    assert cli_main(["run", str(toml), "--out", str(tmp_path / "r"), "--workers", "0", "--no-progress"]) == 2
    assert "--workers: expected an int >= 1, got 0" in capsys.readouterr().err
    assert cli_main(["run", str(toml), "--out", str(tmp_path / "r"), "--workers", "2", "--restart"]) == 2
    assert "--restart with --workers" in capsys.readouterr().err


def test_worker_argv_drops_workers_only():
    argv = ["run", "c.toml", "--set", "seeds=[0]", "--workers", "4", "--device", "cuda", "--precision", "bf16"]
    assert worker_argv(argv) == ["run", "c.toml", "--set", "seeds=[0]", "--device", "cuda", "--precision", "bf16",
                                 "--no-progress"]


# ----------------------------------------------------------------------------- precision and config keys
def test_precision_sets_amp_where_the_task_does_not(tmp_path):
    assert {p: precision_amp(p) for p in ("bf16", "fp32", "auto")} == {"bf16": "bf16", "fp32": "off", "auto": "auto"}
    cfg = load_experiment_config(_toml(tmp_path, top='precision = "bf16"'))
    assert cfg.tasks[0].train["amp"] == "bf16"
    cfg = load_experiment_config(_toml(tmp_path, top='precision = "fp32"', train='amp = "bf16"'))
    assert cfg.tasks[0].train["amp"] == "bf16"  # the task's own setting wins
    assert "amp" not in load_experiment_config(_toml(tmp_path)).tasks[0].train  # no key: nothing changes
    with pytest.raises(ValueError, match="precision: expected one of"):
        load_experiment_config(_toml(tmp_path, top='precision = "fp16"'))
    with pytest.raises(ValueError, match="got 'gpu'"):
        load_experiment_config(_toml(tmp_path, top='device = "gpu"'))
    assert load_experiment_config(_toml(tmp_path, top='device = "cuda:0"')).device == "cuda:0"  # spelling only


def test_primary_names_settings_other_than_the_baseline(tmp_path):
    cfg = load_experiment_config(_toml(tmp_path, top='primary = ["lap", "heat"]'))
    assert cfg.primary == ["lap", "heat"]
    with pytest.raises(ValueError, match=r"unknown operator setting 'ppr'"):
        load_experiment_config(_toml(tmp_path, top='primary = ["lap", "ppr"]'))
    with pytest.raises(ValueError, match="'attention' is the baseline"):
        load_experiment_config(_toml(tmp_path, top='primary = ["attention"]'))
    # keeping only some settings keeps the primary contrasts that still run
    kept = load_experiment_config(_toml(tmp_path, top='primary = ["lap", "heat"]'), ["operators=attention,heat"])
    assert kept.primary == ["heat"]


@pytest.mark.skipif(not torch.amp.is_autocast_available("cpu"), reason="this torch has no CPU autocast")
def test_bf16_autocast_path_on_cpu(tmp_path):
    """--precision bf16 runs the training under bf16 autocast (here the CPU one): the losses
    differ from the fp32 run's by bf16 rounding, not more, and the summary says bf16."""
    toml = _toml(tmp_path)
    finals = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / precision
        code = cli_main(["run", str(toml), "--out", str(out), "--precision", precision, "--no-progress",
                         "--set", "operators=attention", "--set", "seeds=[0]"])
        assert code == 0
        rdir = run_dir(out / "tiny", "digits", "attention", 0)
        summary = json.loads((rdir / "summary.json").read_text())
        assert summary["amp"] == ("bf16" if precision == "bf16" else "off")
        assert json.loads((rdir / "run_config.json").read_text())["train"]["amp"] == precision_amp(precision)
        finals[precision] = [r["loss"] for r in read_metrics(rdir / "metrics.jsonl") if r["split"] == "train"]
    a, b = torch.tensor(finals["fp32"]), torch.tensor(finals["bf16"])
    assert torch.isfinite(b).all()
    assert not torch.equal(a, b)  # autocast was on
    torch.testing.assert_close(b, a, rtol=0.05, atol=0.05)  # and only rounding apart


def test_workers_share_the_runs_and_each_run_trains_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    class NoTraining:  # this process must only read what its worker processes trained
        def __init__(self, *args, **kwargs):
            raise AssertionError("the parent process trained a run")

    monkeypatch.setattr("diffusionformer.experiments.runner.Trainer", NoTraining)
    toml = _toml(tmp_path)
    out = tmp_path / "res"
    code = cli_main(["run", str(toml), "--out", str(out), "--workers", "2", "--no-progress"])
    assert code == 0, capsys.readouterr()
    root = out / "tiny"
    logs = sorted((root / "workers").glob("worker*.log"))
    assert [p.name for p in logs] == ["worker0.log", "worker1.log"]
    for op in ("attention", "lap", "heat"):
        for seed in (0, 1):
            rdir = run_dir(root, "digits", op, seed)
            summary = json.loads((rdir / "summary.json").read_text())
            assert summary["status"] == "completed" and summary["resumed_from"] is None
            steps = [r["step"] for r in read_metrics(rdir / "metrics.jsonl") if r["split"] == "train"]
            assert steps == sorted(set(steps)), (op, seed, steps)  # one writer per run
            assert not (rdir / ".lock").exists()
    assert len(json.loads((root / "results.json").read_text())["runs"]) == 6
    assert all("results:" in p.read_text() for p in logs)  # both workers ran to the end


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_bf16_runs_with_two_workers_on_one_gpu(tmp_path, monkeypatch):
    """For a GPU sitting: the whole path (config device and precision, two workers on one GPU)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    toml = _toml(tmp_path, top='device = "cuda"\nprecision = "bf16"')
    out = tmp_path / "res"
    assert cli_main(["run", str(toml), "--out", str(out), "--workers", "2", "--no-progress"]) == 0
    for op in ("attention", "lap", "heat"):
        for seed in (0, 1):
            summary = json.loads((run_dir(out / "tiny", "digits", op, seed) / "summary.json").read_text())
            assert summary["status"] == "completed" and summary["amp"] == "bf16"
            assert summary["device"].startswith("cuda")
