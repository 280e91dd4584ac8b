"""The experiment runner: strict configs, overrides, end-to-end runs, resume, failures, torchrun."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from diffusionformer.experiments import load_experiment_config, parse_override
from diffusionformer.experiments.cli import main as cli_main
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.train import read_metrics

REPO = Path(__file__).resolve().parents[2]


def tiny_config(**extra):
    cfg = {
        "name": "tiny",
        "seeds": [0],
        "tasks": [{
            "name": "digits",
            "dataset": "digits",
            "model": "vit-digits",
            "model_overrides": {"dim": 16, "depth": 2, "num_heads": 2},
            "train": {"max_steps": 6, "batch_size": 16, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 3,
                      "log_interval": 2, "checkpoint_interval": 2},
        }],
        "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": "half"}],
    }
    cfg.update(extra)
    return cfg


def test_shipped_configs_validate():
    configs = sorted((REPO / "experiments" / "configs").glob("*.toml"))
    assert configs, "no configs shipped"
    for path in configs:
        cfg = load_experiment_config(path)
        assert cfg.tasks and cfg.operators and cfg.seeds


@pytest.mark.parametrize(
    "mutate,err,match",
    [
        (lambda c: c.update(sedes=[0]), ValueError, r"unknown key 'sedes'.*did you mean 'seeds'"),
        (lambda c: c["tasks"][0].update(datset="digits"), ValueError, "unknown key 'datset'"),
        (lambda c: c["tasks"][0].update(select_by=""), ValueError, "select_by must be an evaluation key"),
        (lambda c: c["tasks"][0].update(reach={"val_acc": 0.9, "test_acc": 0.9}), ValueError, "reach must be one evaluation key"),
        (lambda c: c["tasks"][0].update(reach={"val_acc": float("nan")}), ValueError, "finite threshold"),
        (lambda c: c["tasks"][0]["train"].update(max_step=5), ValueError, "unknown TrainConfig key 'max_step'"),
        (lambda c: c["tasks"][0]["train"].update(max_steps="5"), TypeError, "max_steps"),
        (lambda c: c["tasks"][0]["train"].update(seed=3), ValueError, "top-level `seeds`"),
        (lambda c: c.update(seeds="0"), TypeError, "expected a list"),
        (lambda c: c["operators"].append({"name": "lap"}), ValueError, "duplicate operator setting names"),
        (lambda c: c["operators"][1].update(heads="attention:1,laplacian:1"), ValueError, "not both"),
        (lambda c: c["operators"][1].update(laplacian_heads="most"), ValueError, "'half'"),
        (lambda c: c.update(tasks=[]), ValueError, "at least one task"),
        (lambda c: c["tasks"][0].update(folds=1), ValueError, "folds must be an int >= 2"),
        (lambda c: c["tasks"][0].update(folds=2), ValueError, r"cover every fold.*runs per fold: \[1, 0\]"),
        (lambda c: c["tasks"][0].update(folds=2, dataset_options={"fold": 0}), ValueError,
         "seed sets fold; remove it from dataset_options"),
    ],
)
def test_bad_configs_are_rejected_with_the_key_named(mutate, err, match):
    cfg = tiny_config()
    mutate(cfg)
    with pytest.raises(err, match=match):
        load_experiment_config(cfg)


def test_every_problem_of_a_config_is_reported_at_once():
    """Unknown keys, mistyped values and range checks of several tables come in one error, each named."""
    from diffusionformer.config import ConfigErrors

    cfg = tiny_config(descripton="typo")
    cfg["operators"][1]["hedas"] = 1
    cfg["tasks"][0]["metric"] = 3
    cfg["tasks"].append({**cfg["tasks"][0], "name": "second", "metric": "val_acc", "eval_batch_size": 0})
    cfg["tasks"].append({**cfg["tasks"][0], "name": "third", "metric": "val_acc", "folds": 1})
    with pytest.raises(ConfigErrors) as info:
        load_experiment_config(cfg)
    problems = info.value.problems
    assert len(problems) == 5, problems
    expected = [r"config: unknown key 'descripton'.*did you mean 'description'", r"config.operators\[1\]: unknown key 'hedas'",
                r"config.tasks\[0\].metric: expected a string, got int 3", r"task 'second': eval_batch_size must be positive",
                r"task 'third': folds must be an int >= 2"]
    for pattern in expected:
        assert sum(bool(re.search(pattern, p)) for p in problems) == 1, (pattern, problems)
    assert str(info.value).startswith("config: 5 problems:\n  - ")
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)  # callers catching either keep working
    # a single problem keeps its own type and message
    with pytest.raises(TypeError, match=r"^config.tasks\[0\].metric: expected a string, got int 3$"):
        load_experiment_config(tiny_config(tasks=[{**tiny_config()["tasks"][0], "metric": 3}]))


def test_overrides_go_through_the_same_validator(tmp_path):
    cfg = load_experiment_config(tiny_config(), ["tasks.digits.train.max_steps=3", "seeds=[4, 5]", "operators=lap"])
    assert cfg.tasks[0].train["max_steps"] == 3 and cfg.seeds == [4, 5] and [o.name for o in cfg.operators] == ["lap"]
    with pytest.raises(ValueError, match="no entry named 'digitz'"):
        load_experiment_config(tiny_config(), ["tasks.digitz.train.max_steps=3"])
    with pytest.raises(ValueError, match="unknown TrainConfig key 'max_stepz'"):
        load_experiment_config(tiny_config(), ["tasks.digits.train.max_stepz=3"])
    with pytest.raises(ValueError, match="key.path=value"):
        parse_override("seeds")
    with pytest.raises(FileNotFoundError):
        load_experiment_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [")
    with pytest.raises(ValueError, match="invalid TOML"):
        load_experiment_config(bad)


def test_end_to_end_and_resume_skips_finished_runs(tmp_path):
    raw = tiny_config()
    raw["tasks"][0]["select_by"] = "val_acc"
    cfg = load_experiment_config(raw)
    results = run_experiment(cfg, tmp_path, progress=False)
    assert [r.status for r in results] == ["completed", "completed"]
    out = tmp_path / "tiny"
    for name in ("results.md", "results.json", "manifest.json", "plots/digits_curves.png", "plots/digits_final.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    table = (out / "results.md").read_text()
    assert "| attention |" in table and "| lap |" in table and "test_acc" in table and "at best val_acc" in table
    data = json.loads((out / "results.json").read_text())
    for r in data["runs"]:  # the selected evaluation is one of the two logged ones (steps 3 and 6)
        evals = {rec["step"]: rec["metrics"] for rec in read_metrics(run_dir(out, "digits", r["operator"], 0) / "metrics.jsonl")
                 if rec["split"] == "eval"}
        assert sorted(evals) == [3, 6] and r["selected_step"] in evals
        assert r["selected_value"] == evals[r["selected_step"]]["test_acc"]
        assert evals[r["selected_step"]]["val_acc"] == max(m["val_acc"] for m in evals.values())
    assert len(data["runs"]) == 2 and all(0.0 <= r["value"] <= 1.0 for r in data["runs"])
    # Laplacian heads do not change the parameter count
    assert data["runs"][0]["num_parameters"] == data["runs"][1]["num_parameters"]
    ckpt = run_dir(out, "digits", "attention", 0) / "checkpoint.pt"
    mtime = ckpt.stat().st_mtime_ns
    # a resumed comparison keeps the commits of earlier invocations (here: a fake older one)
    first_manifest = json.loads((out / "manifest.json").read_text())
    older = {**first_manifest, "git_commit": "0ld0c0mm17", "git_commits": ["0ld0c0mm17"]}
    (out / "manifest.json").write_text(json.dumps(older))
    again = run_experiment(cfg, tmp_path, progress=False)
    assert ckpt.stat().st_mtime_ns == mtime  # not retrained
    assert [r.value for r in again] == [r.value for r in results]
    # an invocation that trained nothing adds nothing to the provenance
    assert json.loads((out / "manifest.json").read_text()) == older
    # one that trains a run (here: the Laplacian run, removed) adds its commit
    shutil.rmtree(run_dir(out, "digits", "lap", 0))
    run_experiment(cfg, tmp_path, progress=False)
    assert ckpt.stat().st_mtime_ns == mtime  # the attention run is still not retrained
    # publish: a docs page with the table and figures, and no checkpoint copied
    from diffusionformer.experiments.publish import publish_experiment

    with pytest.warns(RuntimeWarning, match="add tiny.md to a toctree"):  # a docs folder without index.md
        page = publish_experiment(cfg, tmp_path, tmp_path / "docs", config_path="tiny.toml")
    text = page.read_text()
    assert "| attention |" in text and "tiny/plots/digits_curves.png" in text and "Machine" in text
    try:
        from PIL import Image
    except ImportError:
        pass
    else:  # figures are reduced to a palette, same size in pixels
        with Image.open(tmp_path / "docs" / "tiny" / "plots" / "digits_curves.png") as small, \
                Image.open(out / "plots" / "digits_curves.png") as full:
            assert small.mode == "P" and small.size == full.size
    assert (tmp_path / "docs" / "tiny" / "plots" / "digits_final.png").is_file()
    assert not list((tmp_path / "docs").rglob("*.pt"))
    # the manifest records the git commit (None outside a checkout); the page says which
    from diffusionformer.experiments.runner import git_commit

    manifest = json.loads((out / "manifest.json").read_text())
    assert "git_commit" in manifest and manifest["git_commit"] == git_commit()
    assert git_commit(tmp_path) is None  # not a checkout
    if manifest["git_commit"]:
        assert manifest["git_commits"] == ["0ld0c0mm17", manifest["git_commit"]]
        assert (f"**Git commits:** `0ld0c0mm17`, `{manifest['git_commit']}` (the invocations of `run` that "
                f"trained this comparison and recorded their commit ran at these 2 commits, in this order; the last at "
                f"`{manifest['git_commit']}`)") in text
    from diffusionformer.experiments.publish import _commit_line

    assert _commit_line({"git_commit": "abc", "git_commits": ["abc"]}) == "- **Git commit:** `abc`"
    assert "not recorded" in _commit_line({})
    # per-run metric logs as small JSON, equal to the run's metrics.jsonl
    for op in ("attention", "lap"):
        log = json.loads((tmp_path / "docs" / "tiny" / "logs" / "digits" / op / "seed0.json").read_text())
        records = read_metrics(run_dir(out, "digits", op, 0) / "metrics.jsonl")
        evals = [r for r in records if r["split"] == "eval"]
        assert log["eval"]["step"] == [r["step"] for r in evals] == [3, 6]
        assert log["eval"]["val_acc"] == [pytest.approx(r["metrics"]["val_acc"], abs=1e-6) for r in evals]
        assert log["train"]["loss"] == [pytest.approx(r["loss"], abs=1e-6) for r in records if r["split"] == "train"]
    assert "Per-run metric logs:** 2 files" in text and "primary" in text.lower()
    # regenerating the page from the published files keeps them and gives the same tables
    published = sorted(p.relative_to(tmp_path / "docs") for p in (tmp_path / "docs").rglob("*"))
    again_page = publish_experiment(cfg, tmp_path / "docs", tmp_path / "docs", config_path="tiny.toml")
    assert sorted(p.relative_to(tmp_path / "docs") for p in (tmp_path / "docs").rglob("*")) == published
    assert again_page.read_text() == text
    # a reading written by hand at the end of the page survives a rebuild, and the logs read back as the records
    from diffusionformer.experiments.publish import READING_MARKER, read_run_log

    again_page.write_text(text + "\n" + READING_MARKER + "\n\nOur reading.\n")
    assert publish_experiment(cfg, tmp_path / "docs", tmp_path / "docs", config_path="tiny.toml").read_text() == (
        text + "\n" + READING_MARKER + "\n\nOur reading.\n")
    for op in ("attention", "lap"):
        back = read_run_log(tmp_path / "docs" / "tiny" / "logs" / "digits" / op / "seed0.json")
        records = read_metrics(run_dir(out, "digits", op, 0) / "metrics.jsonl")
        assert [(r["split"], r["step"]) for r in back] == [(r["split"], r["step"]) for r in records]
        for b, r in zip(back, records):  # a metric named like a column (an evaluation's "loss") is that column
            # 9 significant digits: statistics recomputed from the published logs match the run folders' digits
            assert b.get("loss") == pytest.approx(r.get("loss"), rel=1e-8, abs=0)
            metrics = {k: v for k, v in r.get("metrics", {}).items() if k not in ("step", "loss", "lr", "elapsed")}
            assert b["metrics"] == pytest.approx(metrics, rel=1e-8, abs=0)


def test_changed_definition_under_the_same_name_is_refused(tmp_path):
    cfg = load_experiment_config(tiny_config(), ["operators=lap"])
    run_experiment(cfg, tmp_path, progress=False)
    changed = load_experiment_config(tiny_config(), ["operators=lap", "operators.lap.laplacian_heads=2"])
    with pytest.raises(ValueError, match="different model_config.*--restart"):
        run_experiment(changed, tmp_path, progress=False)
    longer = load_experiment_config(tiny_config(), ["operators=lap", "tasks.digits.train.max_steps=8"])
    with pytest.raises(ValueError, match="different train"):
        run_experiment(longer, tmp_path, progress=False)
    assert run_experiment(changed, tmp_path, progress=False, resume=False)[0].status == "completed"


def test_killed_run_resumes_to_the_same_weights(tmp_path):
    from diffusionformer.experiments.tasks import ClassificationTask
    from diffusionformer.testing import assert_same_checkpoint_weights, interrupt_on_call

    cfg = load_experiment_config(tiny_config(), ["operators=attention"])
    run_experiment(cfg, tmp_path / "clean", progress=False)
    with interrupt_on_call(ClassificationTask, "loss", 5), pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "killed", progress=False)
    rdir = run_dir(tmp_path / "killed" / "tiny", "digits", "attention", 0)
    assert (rdir / "checkpoint.pt").is_file() and not (rdir / "summary.json").exists()
    run_experiment(cfg, tmp_path / "killed", progress=False)
    assert_same_checkpoint_weights(run_dir(tmp_path / "clean" / "tiny", "digits", "attention", 0) / "checkpoint.pt",
                                   rdir / "checkpoint.pt")


def test_nan_loss_fails_the_run_clearly_and_keeps_the_checkpoint(tmp_path, monkeypatch, capsys):
    from diffusionformer.experiments import tasks as task_module

    original = task_module.ClassificationTask.loss
    calls = {"n": 0}

    def nan_loss(self, model, batch):
        calls["n"] += 1
        loss, metrics = original(self, model, batch)
        return (loss * float("nan") if calls["n"] >= 4 else loss), metrics

    monkeypatch.setattr(task_module.ClassificationTask, "loss", nan_loss)
    cfg_path = tmp_path / "cfg.json"
    config = tiny_config()
    config["operators"] = [{"name": "attention"}]
    import tomllib  # noqa: F401  (python >= 3.11 in CI)

    toml = tmp_path / "tiny.toml"
    toml.write_text(_to_toml(config))
    code = cli_main(["run", str(toml), "--out", str(tmp_path / "res"), "--no-progress"])
    assert code == 1
    err = capsys.readouterr()
    assert "non-finite" in (err.out + err.err).lower() and "last good checkpoint" in (err.out + err.err)
    rdir = run_dir(tmp_path / "res" / "tiny", "digits", "attention", 0)
    saved = torch.load(rdir / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 2 and all(torch.isfinite(v).all() for v in saved["model"].values() if v.is_floating_point())
    del cfg_path


def test_cli_errors_are_clear(tmp_path, capsys, monkeypatch):
    toml = tmp_path / "t.toml"
    cfg = tiny_config()
    cfg["tasks"][0]["dataset"] = "tinyshakespeare"
    cfg["tasks"][0]["model"] = "gpt-char-tiny"
    cfg["tasks"][0]["model_overrides"] = {}
    toml.write_text(_to_toml(cfg))
    monkeypatch.delenv("DIFFUSIONFORMER_DATA", raising=False)
    code = cli_main(["run", str(toml), "--out", str(tmp_path / "r"), "--data-root", str(tmp_path / "nowhere"), "--no-progress"])
    assert code == 2
    assert "tinyshakespeare" in capsys.readouterr().err
    cfg = tiny_config()
    cfg["tasks"][0]["dataset"] = "digitz"
    toml.write_text(_to_toml(cfg))
    assert cli_main(["run", str(toml), "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    assert "unknown dataset" in capsys.readouterr().err.lower()


def test_corrupt_checkpoint_fails_its_run_only_and_says_to_delete_it(tmp_path, capsys):
    cfg = tiny_config()  # two settings: the corrupt run is the first
    toml = tmp_path / "t.toml"
    toml.write_text(_to_toml(cfg))
    rdir = run_dir(tmp_path / "r" / "tiny", "digits", "attention", 0)
    rdir.mkdir(parents=True)
    (rdir / "checkpoint.pt").write_bytes(b"not a checkpoint")
    assert cli_main(["run", str(toml), "--out", str(tmp_path / "r"), "--no-progress"]) == 1
    out = capsys.readouterr()
    text = out.out + out.err
    assert f"Delete {rdir / 'checkpoint.pt'}" in text and "1 run(s) failed" in out.err
    assert (rdir / "checkpoint.pt").read_bytes() == b"not a checkpoint"  # left untouched
    other = run_dir(tmp_path / "r" / "tiny", "digits", "lap", 0)
    assert json.loads((other / "summary.json").read_text())["status"] == "completed"  # the next run still trained
    (rdir / "checkpoint.pt").unlink()  # as the message says: that run alone trains again
    assert cli_main(["run", str(toml), "--out", str(tmp_path / "r"), "--no-progress"]) == 0


@pytest.mark.slow
def test_torchrun_two_processes_runs_the_same_config(tmp_path):
    cfg = tiny_config()
    cfg["operators"] = [{"name": "attention"}]
    toml = tmp_path / "t.toml"
    toml.write_text(_to_toml(cfg))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
           "-m", "diffusionformer.experiments", "run", str(toml), "--out", str(tmp_path / "ddp"), "--no-progress"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir(tmp_path / "ddp" / "tiny", "digits", "attention", 0) / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2
    single = run_experiment(load_experiment_config(cfg), tmp_path / "single", progress=False)
    a = torch.load(run_dir(tmp_path / "ddp" / "tiny", "digits", "attention", 0) / "checkpoint.pt", weights_only=True)
    b = torch.load(run_dir(tmp_path / "single" / "tiny", "digits", "attention", 0) / "checkpoint.pt", weights_only=True)
    for key, value in a["model"].items():
        assert torch.allclose(value, b["model"][key], atol=1e-5), key
    assert single[0].status == "completed"


def _to_toml(cfg: dict) -> str:
    """A minimal TOML writer for the test configs (tables, arrays of tables, inline values)."""

    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        raise TypeError(v)

    lines = [f"{k} = {value(v)}" for k, v in cfg.items() if not (isinstance(v, list) and v and isinstance(v[0], dict))]
    for key in ("tasks", "operators"):
        for entry in cfg.get(key, []):
            lines.append(f"[[{key}]]")
            lines += [f"{k} = {value(v)}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"


def test_table_reports_the_paired_difference_with_ci_df_p_wilcoxon_and_holm():
    import statistics

    from scipy import stats as sps

    from diffusionformer.experiments.runner import RunResult, aggregate, format_table, welch_t

    raw = tiny_config(seeds=[0, 1, 2])
    raw["operators"].append({"name": "lap1", "laplacian_heads": 1})
    cfg = load_experiment_config(raw)
    vals = {"attention": [0.80, 0.82, 0.84], "lap": [0.86, 0.87, 0.91], "lap1": [0.79, 0.83, 0.84]}
    runs = [RunResult("digits", op, s, "completed", "test_acc", v) for op, vs in vals.items() for s, v in enumerate(vs)]
    a, b = vals["lap"], vals["attention"]
    t = (statistics.fmean(a) - statistics.fmean(b)) / ((statistics.variance(a) + statistics.variance(b)) / 3) ** 0.5
    assert welch_t(a, b) == pytest.approx(t) and t == pytest.approx(3.1334, abs=1e-4)  # still exported
    text = format_table(aggregate(runs), cfg)
    head = next(line for line in text.splitlines() if line.startswith("| operator |"))
    assert head.split(" | ")[2:8] == ["Δ vs attention", "95% CI", "df", "p", "p Wilcoxon", "p Holm"]
    row = next(line for line in text.splitlines() if line.startswith("| lap |")).split(" | ")
    ref = sps.ttest_rel(a, b)
    ci = ref.confidence_interval(0.95)
    p1 = sps.ttest_rel(vals["lap1"], b).pvalue
    assert row[2:8] == ["+0.0600", f"[{ci.low:+.4f}, {ci.high:+.4f}]", "2", f"{ref.pvalue:.3f}", "0.250",
                        f"**{min(1.0, 2 * min(ref.pvalue, p1)):.3f}**"]  # Holm over the page's 2 comparisons, bold < 0.05
    assert "p Holm: p adjusted by Holm's method" in text and "every comparison is exploratory" in text
    compact = format_table(aggregate(runs), cfg, compact=True)
    assert "| operator | test_acc mean ± std | Δ vs attention | 95% CI | p | p Holm |" in compact and "df" not in compact


def test_primary_contrasts_are_validated_marked_and_adjusted_among_themselves():
    from scipy import stats as sps

    from diffusionformer.experiments.compare import contrasts
    from diffusionformer.experiments.runner import RunResult, aggregate, format_table

    raw = tiny_config(seeds=[0, 1, 2])
    raw["operators"].append({"name": "lap1", "laplacian_heads": 1})
    for bad, msg in ((["lapp"], "unknown operator setting 'lapp' (did you mean 'lap'?)"), (["digit:lap"], "unknown task 'digit' (did you mean 'digits'?)"),
                     (["attention"], "is the baseline"), (["lap", "lap"], "duplicate")):
        with pytest.raises(ValueError, match=re.escape(msg)):
            load_experiment_config({**raw, "primary": bad})
    cfg = load_experiment_config({**raw, "primary": ["digits:lap"]})
    assert cfg.primary_contrasts() == {("digits", "lap")}
    vals = {"attention": [0.80, 0.82, 0.84], "lap": [0.86, 0.87, 0.91], "lap1": [0.79, 0.83, 0.84]}
    runs = [RunResult("digits", op, s, "completed", "test_acc", v) for op, vs in vals.items() for s, v in enumerate(vs)]
    found = {c.setting: c for c in contrasts(aggregate(runs), cfg)}
    p = {op: sps.ttest_rel(vals[op], vals["attention"]).pvalue for op in ("lap", "lap1")}
    assert found["lap"].role == "primary" and found["lap"].p_holm == pytest.approx(p["lap"])  # a family of one
    assert found["lap1"].role == "exploratory" and found["lap1"].p_holm == pytest.approx(min(1, 2 * max(p.values())))
    text = format_table(aggregate(runs), cfg)
    assert "| role |" in text and "| primary |" in text and "| exploratory |" in text


def test_reach_reports_the_first_step_at_the_threshold_over_the_runs_that_got_there(tmp_path):
    from diffusionformer.experiments.publish import _load_runs
    from diffusionformer.experiments.runner import RunResult, aggregate, first_reach, format_table

    raw = tiny_config()
    raw["tasks"][0]["reach"] = {"val_acc": 0.5}
    cfg = load_experiment_config(raw)
    task = cfg.tasks[0]
    evals = [{"split": "eval", "step": s, "metrics": {"val_acc": a, "val_loss": 1 - a}} for s, a in [(3, 0.3), (6, 0.5), (9, 0.7)]]
    train = [{"split": "train", "step": 4, "metrics": {"val_acc": 0.9}}]  # training records never count
    assert first_reach(train + evals, task) == 6
    assert first_reach(evals[:1], task) is None
    loss_task = load_experiment_config(raw, ['tasks.digits.reach={val_loss = 0.4}']).tasks[0]
    assert first_reach(evals, loss_task) == 9  # loss keys must fall to the threshold
    steps = {("attention", 0): 500, ("attention", 1): 1000, ("attention", 2): 1500,
             ("lap", 0): 2000, ("lap", 1): None, ("lap", 2): None}
    runs = [RunResult("digits", op, s, "completed", "test_acc", 0.5 + 0.01 * s, reach_step=v) for (op, s), v in steps.items()]
    lines = format_table(aggregate(runs), cfg).splitlines()
    at = lines.index("#### digits: steps to val_acc ≥ 0.5")
    lines = lines[at:]
    assert lines[2].startswith("| operator | steps mean ± std") and lines[3].count("|") == lines[2].count("|")
    assert "| 1000 ± 500 (3 of 3) |" in next(line for line in lines if line.startswith("| attention |"))
    assert "| 2000 (1 of 3) | n/a |" in next(line for line in lines if line.startswith("| lap |"))  # censored: no test
    never = [RunResult("digits", "lap", s, "completed", "test_acc", 0.5) for s in range(3)]
    assert "| never (0 of 3) |" in format_table(aggregate(never), cfg)
    steps.update({("lap", 1): 2500, ("lap", 2): 2500})  # all reached: paired differences 1500, 1500, 1000
    runs = [RunResult("digits", op, s, "completed", "test_acc", 0.5 + 0.01 * s, reach_step=v) for (op, s), v in steps.items()]
    tables = format_table(aggregate(runs), cfg).split("#### ")
    lap = next(line for line in tables[1].splitlines() if line.startswith("| lap |"))
    from scipy import stats as sps
    ref = sps.ttest_rel([2000, 2500, 2500], [500, 1000, 1500])
    assert f"| 2333 ± 289 (3 of 3) | +1333 | [{ref.confidence_interval().low:+.0f}, " in lap
    assert f" | 2 | {ref.pvalue:.3f} | 0.250 |" in lap
    # results written before `reach` was set get their steps from the run logs when published
    results = run_experiment(load_experiment_config(tiny_config()), tmp_path, progress=False)
    assert all(r.reach_step is None for r in results)
    anything = load_experiment_config(raw, ["tasks.digits.reach={val_acc = 0.0}"])  # met at the first evaluation
    assert [r.reach_step for r in _load_runs(anything, tmp_path / "tiny")] == [3, 3]


def test_summary_table_signs_differences_so_that_positive_is_better(tmp_path):
    from dataclasses import asdict

    from diffusionformer.experiments.publish import summary_table
    from diffusionformer.experiments.runner import RunResult

    raw = tiny_config(seeds=[0, 1, 2])
    raw["tasks"].append({**raw["tasks"][0], "name": "lm", "metric": "val_loss"})
    cfg = load_experiment_config(raw)
    vals = {("digits", "attention"): [0.80, 0.82, 0.84], ("digits", "lap"): [0.86, 0.87, 0.91],
            ("lm", "attention"): [2.0, 2.1, 2.2], ("lm", "lap"): [2.1]}
    metric = {"digits": "test_acc", "lm": "val_loss"}  # each task's (a row of another metric is refused)
    runs = [asdict(RunResult(task, op, s, "completed", metric[task], v))
            for (task, op), vs in vals.items() for s, v in enumerate(vs)]
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "results.json").write_text(json.dumps({"runs": runs, "summary": []}))
    lines = summary_table([cfg], tmp_path).splitlines()
    from scipy import stats as sps
    p = sps.ttest_rel(vals[("digits", "lap")], vals[("digits", "attention")]).pvalue
    assert lines[0] == "| task | metric (baseline mean) | lap |"
    # Holm over the table: the lm cell has no test and counts as p = 1 in a family of 2
    assert lines[2] == f"| tiny / digits | test_acc (0.8200) | **+0.0600 (p {p:.3f}; Holm {min(1, 2 * p):.3f})** |"
    assert lines[3] == "| tiny / lm | val_loss (2.1000) | -0.1000 (p n/a; Holm n/a) [1 vs 3 seeds] |"  # one pair, loss up
    assert lines[-1] == "2 comparisons; p < 0.05 unadjusted: 1; after Holm: 1; after Benjamini-Hochberg: 1."
    assert "**" not in summary_table([cfg], tmp_path, alpha=0.01).splitlines()[2]
    with pytest.warns(DeprecationWarning, match="Holm"):
        summary_table([cfg], tmp_path, strong=2.8)


def _two_task_config():
    raw = tiny_config(seeds=[0, 1])
    second = json.loads(json.dumps(raw["tasks"][0]))
    second["name"] = "digits-b"
    raw["tasks"].append(second)
    raw["operators"] = [{"name": "attention"}]
    return load_experiment_config(raw)


def test_tasks_filter_trains_only_those_and_results_keep_the_others(tmp_path):
    cfg = _two_task_config()
    with pytest.raises(ValueError, match=r"unknown task.*'digitz'.*\['digits', 'digits-b'\]"):
        run_experiment(cfg, tmp_path, progress=False, tasks=["digitz"])
    first = run_experiment(cfg, tmp_path, progress=False, tasks=["digits-b"])
    assert [(r.task, r.seed) for r in first] == [("digits-b", 0), ("digits-b", 1)]
    assert not run_dir(tmp_path / "tiny", "digits", "attention", 0).exists()
    second = run_experiment(cfg, tmp_path, progress=False, tasks=["digits"])
    # config order, and the runs of the other invocation read back unchanged
    assert [(r.task, r.seed) for r in second] == [("digits", 0), ("digits", 1), ("digits-b", 0), ("digits-b", 1)]
    assert [r.value for r in second[2:]] == [r.value for r in first]
    data = json.loads((tmp_path / "tiny" / "results.json").read_text())
    assert [(r["task"], r["seed"]) for r in data["runs"]] == [(r.task, r.seed) for r in second]
    assert {row["task"]: row["n"] for row in data["summary"]} == {"digits": 2, "digits-b": 2}


@contextlib.contextmanager
def _locked_by_a_live_process(rdir):
    """``rdir/.lock`` held by a sleeping child process (killed on exit); yields its pid."""
    rdir.mkdir(parents=True, exist_ok=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (rdir / ".lock").write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname()}))
        yield sleeper.pid
    finally:
        sleeper.kill()
        sleeper.wait()


def test_run_held_by_a_live_process_is_skipped_and_a_stale_lock_is_taken_over(tmp_path):
    cfg = load_experiment_config(tiny_config(), ["operators=attention", "seeds=[0, 1]"])
    out = tmp_path / "tiny"
    held = run_dir(out, "digits", "attention", 0)
    with _locked_by_a_live_process(held) as pid:
        messages = []
        results = run_experiment(cfg, tmp_path, progress=False, log=messages.append)
        assert [r.seed for r in results] == [1]
        assert any("seed 0] skipped" in m and str(pid) in m for m in messages)
        assert not (held / "summary.json").exists() and (held / ".lock").is_file()
        assert not (run_dir(out, "digits", "attention", 1) / ".lock").exists()  # released after training
    # the holder is gone: its lock is stale and the run is trained now
    results = run_experiment(cfg, tmp_path, progress=False)
    assert [(r.seed, r.status) for r in results] == [(0, "completed"), (1, "completed")]
    assert not (held / ".lock").exists()
    # an unreadable lock is held while young (someone may be writing it) and stale when old
    cfg2 = load_experiment_config(tiny_config(), ["operators=attention", "seeds=[2]"])
    junk = run_dir(out, "digits", "attention", 2)
    junk.mkdir(parents=True)
    (junk / ".lock").write_text("{not json")
    assert run_experiment(cfg2, tmp_path, progress=False) == []  # skipped, not trained
    old = time.time() - 3600
    os.utime(junk / ".lock", (old, old))
    assert [r.seed for r in run_experiment(cfg2, tmp_path, progress=False)] == [2]


def test_two_workers_on_one_config_train_each_run_once(tmp_path):
    cfg = tiny_config(seeds=[0, 1, 2])
    cfg["tasks"][0]["train"]["max_steps"] = 20
    toml = tmp_path / "tiny.toml"
    toml.write_text(_to_toml(cfg))
    cmd = [sys.executable, "-m", "diffusionformer.experiments", "run", str(toml), "--out", str(tmp_path / "res"), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    out = tmp_path / "res" / "tiny"
    for op in ("attention", "lap"):
        for seed in (0, 1, 2):
            rdir = run_dir(out, "digits", op, seed)
            steps = [r["step"] for r in read_metrics(rdir / "metrics.jsonl") if r["split"] == "train"]
            assert steps == sorted(set(steps)), (op, seed, steps)  # one writer per log: no step twice
            assert json.loads((rdir / "summary.json").read_text())["status"] == "completed"
            assert not (rdir / ".lock").exists()
    assert len(json.loads((out / "results.json").read_text())["runs"]) == 6


def test_status_reports_completed_interrupted_running_and_missing_runs(tmp_path, capsys):
    from diffusionformer.experiments.runner import format_status, run_status
    from diffusionformer.experiments.tasks import ClassificationTask
    from diffusionformer.testing import interrupt_on_call

    raw = tiny_config(seeds=[0, 1, 2, 3])
    raw["operators"] = [{"name": "attention"}]
    cfg = load_experiment_config(raw)
    run_experiment(load_experiment_config(raw, ["seeds=[0]"]), tmp_path, progress=False)
    with interrupt_on_call(ClassificationTask, "loss", 5), pytest.raises(KeyboardInterrupt):
        run_experiment(load_experiment_config(raw, ["seeds=[1]"]), tmp_path, progress=False)
    held = run_dir(tmp_path / "tiny", "digits", "attention", 2)
    with _locked_by_a_live_process(held) as pid:
        rows = run_status(cfg, tmp_path)
        text = format_status(rows)
    assert [r["state"] for r in rows] == ["completed", "interrupted", "running", "missing"]
    assert rows[0]["step"] == 6 and rows[1]["step"] == 4 and rows[1]["max_steps"] == 6  # logged every 2 steps, killed in step 5
    assert rows[2]["holder"] == f"pid {pid} on {socket.gethostname()}"
    assert rows[1]["resumes_from"] == 4 and text.startswith(("1 of 4 runs completed; about ", "1 of 4 runs completed; less than a minute "))
    assert "| 1 | interrupted | 4 / 6 |" in text  # its checkpoint is at its last logged step: nothing more to say
    toml = tmp_path / "tiny.toml"
    toml.write_text(_to_toml(raw))
    assert cli_main(["status", str(toml), "--out", str(tmp_path)]) == 0
    assert "1 of 4 runs completed" in capsys.readouterr().out


def test_folds_give_each_seed_its_own_test_fold_and_analysis_follows(tmp_path, monkeypatch):
    """``folds = K``: the run of seed s trains on the folds other than s % K and tests on fold s % K."""
    import importlib.util

    from diffusionformer.data import load_dataset
    from diffusionformer.experiments.analyze import analyze_experiment

    spec = importlib.util.spec_from_file_location("df_test_writers", REPO / "tests" / "data" / "data_writers.py")
    writers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(writers)
    monkeypatch.setenv("DIFFUSIONFORMER_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "data"
    writers.write_tu_zip(root / "tudataset" / "MUTAG.zip", "MUTAG", node_labels=True)
    raw = {
        "name": "cv", "seeds": [0, 1],
        "tasks": [{"name": "mutag-cv", "dataset": "mutag", "model": "graph-graph-small", "folds": 2,
                   "dataset_options": {"verify": False}, "select_by": "val_acc",
                   "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2},
                   "train": {"max_steps": 4, "batch_size": 8, "warmup_steps": 0, "eval_interval": 2,
                             "log_interval": 2, "checkpoint_interval": 2}}],
        "operators": [{"name": "attention"}],
    }
    cfg = load_experiment_config(raw)
    import diffusionformer.experiments.runner as runner_mod

    seen = {}
    original = runner_mod._train_one

    def spy(rdir, task, setting, seed, data, *args):
        seen[seed] = (data.train_idx.clone(), data.test_idx.clone())
        return original(rdir, task, setting, seed, data, *args)

    monkeypatch.setattr(runner_mod, "_train_one", spy)
    results = run_experiment(cfg, tmp_path / "out", data_root=root, progress=False)
    assert [r.seed for r in results] == [0, 1]
    folds = [load_dataset("mutag", root=root, verify=False, fold=k, num_folds=2) for k in (0, 1)]
    for seed in (0, 1):
        train_idx, test_idx = seen[seed]
        assert torch.equal(test_idx, folds[seed].test_idx) and torch.equal(train_idx, folds[seed].train_idx)
        rdir = run_dir(tmp_path / "out" / "cv", "mutag-cv", "attention", seed)
        identity = json.loads((rdir / "run_config.json").read_text())
        assert (identity["folds"], identity["fold"]) == (2, seed)
    assert not set(seen[0][1].tolist()) & set(seen[1][1].tolist())  # disjoint test folds
    # a resumed run finds the same fold (its identity matches) and is not retrained
    again = run_experiment(cfg, tmp_path / "out", data_root=root, progress=False)
    assert [r.value for r in again] == [r.value for r in results]
    analysis = analyze_experiment(cfg, tmp_path / "out", data_root=root, progress=False)
    assert set(analysis["tasks"]["mutag-cv"]["operators"]["attention"]["seeds"]) == {"0", "1"}


def test_paired_t_cancels_fold_difficulty_that_welch_counts_as_noise():
    from diffusionformer.experiments.runner import RunResult, aggregate, format_table, paired_t, welch_t

    hard_easy = [0.60, 0.90, 0.70, 0.80]  # fold difficulty dominates the spread
    better = {k: v + 0.02 + 0.005 * (k % 2) for k, v in enumerate(hard_easy)}
    base = dict(enumerate(hard_easy))
    d = [better[k] - base[k] for k in range(4)]  # 0.02, 0.025, 0.02, 0.025
    expected = (sum(d) / 4) / (torch.tensor(d, dtype=torch.float64).std().item() / 2)
    assert paired_t(better, base) == pytest.approx(expected)
    assert abs(welch_t(list(better.values()), hard_easy)) < 0.3  # Welch sees only noise
    assert paired_t({0: 1.0, 1: 2.0}, {2: 0.0, 3: 1.0}) is None  # no shared folds
    cfg = load_experiment_config(tiny_config(seeds=[0, 1, 2, 3]))
    cfg.tasks[0].folds = 4
    runs = [RunResult(task="digits", operator=op, seed=s, metric="test_acc", value=v[s], status="completed")
            for op, v in (("attention", base), ("lap", better)) for s in range(4)]
    text = format_table(aggregate(runs), cfg)
    assert "4-fold cross-validation" in text and "Nadeau-Bengio" in text
    d = torch.tensor(d, dtype=torch.float64)
    nb = d.mean() / (d.std() * (1 / 4 + 1 / 3) ** 0.5)  # Nadeau-Bengio, n2/n1 = 1/(K-1)
    from scipy import stats as sps
    p = 2 * sps.t.sf(abs(nb.item()), 3)
    lap = next(line for line in text.splitlines() if line.startswith("| lap |")).split(" | ")
    assert lap[4:6] == ["3", f"{p:.3f}"]


def test_holm_family_is_every_task_of_a_page_per_quantity():
    from scipy import stats as sps

    from diffusionformer.experiments.compare import contrasts
    from diffusionformer.experiments.runner import RunResult, aggregate

    raw = tiny_config(seeds=[0, 1, 2])
    raw["tasks"][0]["select_by"] = "val_acc"
    raw["tasks"].append({**raw["tasks"][0], "name": "digits-b"})
    cfg = load_experiment_config(raw)
    final = {("digits", "attention"): [0.80, 0.82, 0.84], ("digits", "lap"): [0.86, 0.87, 0.91],
             ("digits-b", "attention"): [0.70, 0.75, 0.72], ("digits-b", "lap"): [0.71, 0.78, 0.72]}
    chosen = {k: [v + 0.01 * (i + 1) * (k[1] == "lap") for i, v in enumerate(vs)] for k, vs in final.items()}
    runs = [RunResult(task, op, s, "completed", "test_acc", v, selected_value=chosen[(task, op)][s], selected_step=3)
            for (task, op), vs in final.items() for s, v in enumerate(vs)]
    found = {(c.task, c.kind): c for c in contrasts(aggregate(runs), cfg)}
    assert sorted(found) == [("digits", "final"), ("digits", "selected"), ("digits-b", "final"), ("digits-b", "selected")]
    for kind, vals in (("final", final), ("selected", chosen)):
        p = {t: sps.ttest_rel(vals[(t, "lap")], vals[(t, "attention")]).pvalue for t in ("digits", "digits-b")}
        lo, hi = sorted(p, key=p.get)  # Holm with m = 2: 2 p_(1), then max(that, p_(2))
        assert found[(lo, kind)].p_holm == pytest.approx(min(1, 2 * p[lo]))
        assert found[(hi, kind)].p_holm == pytest.approx(max(min(1, 2 * p[lo]), p[hi]))
        assert found[("digits", kind)].diff.p == pytest.approx(p["digits"]) and found[("digits", kind)].role == "exploratory"
