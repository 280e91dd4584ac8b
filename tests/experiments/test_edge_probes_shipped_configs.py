"""Edge probes of the shipped experiment configs and the command-line flows run on them.

Validation of every shipped config, did-you-mean of a mistyped ``--set`` and resuming are pinned
elsewhere (``test_edge_probes_config_strict.py``, ``test_experiments_runner.py``); these pin what a
tiny run published without its overrides does, and the configs' stated arithmetic and status.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.cli import main
from diffusionformer.experiments.publish import summary_table
from experiments_tiny_configs import TINY_DIGITS_TOML

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "experiments" / "configs"


def _config(name: str) -> dict:
    return tomllib.loads((CONFIGS / f"{name}.toml").read_text(encoding="utf-8"))


def _task(config: dict, name: str) -> dict:
    return next(t for t in config["tasks"] if t["name"] == name)


def test_bug_publish_refuses_runs_made_with_another_train_config(tmp_path, capsys):
    """Bug: runs trained with ``--set`` overrides (here 1 step instead of the config's 2) were published
    by ``publish`` without them as the config's runs ("2 of 2 finished", the config's command), while
    ``status`` on the same config counted them as not completed; ``publish`` now refuses, naming what changed
    (and ``summary`` warns, naming the same remedies)."""
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY_DIGITS_TOML, encoding="utf-8")
    out, docs = tmp_path / "res", tmp_path / "docs"
    short = ["--set", "tasks.digits.train.max_steps=1", "--set", "tasks.digits.train.eval_interval=1"]
    assert main(["run", str(cfg), *short, "--out", str(out), "--no-progress", "--set", "operators=attention"]) == 0
    capsys.readouterr()
    assert main(["publish", str(cfg), "--set", "operators=attention", "--out", str(out), "--to", str(docs)]) == 2
    err = capsys.readouterr().err
    assert "another train" in err and "max_steps: 1 then 2" in err and "--set" in err
    assert not (docs / "tiny.md").exists()
    # summary reads them, with a warning that says so
    with pytest.warns(UserWarning, match=r"summary: 1 finished run\(s\) of 'tiny' were made with another train .*max_steps"):
        summary_table([load_experiment_config(cfg)], out)
    # with the overrides the runs were made with, the page is written
    with pytest.warns(RuntimeWarning, match="toctree"):
        assert main(["publish", str(cfg), *short, "--set", "operators=attention", "--out", str(out), "--to", str(docs)]) == 0
    assert "**Runs:** 1 of 1 finished" in (docs / "tiny.md").read_text(encoding="utf-8")


def test_bug_a_published_config_does_not_say_it_was_not_run_yet():
    """Bug: study_rivals.toml's comment said "Not run yet." while docs/results/study-rivals.md published
    all 72 of its runs."""
    for path in sorted(CONFIGS.glob("*.toml")):
        name = tomllib.loads(path.read_text(encoding="utf-8"))["name"]
        page = ROOT / "docs" / "results" / f"{name}.md"
        if page.is_file():
            assert "not run yet" not in path.read_text(encoding="utf-8").lower(), path.name


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.stem)
def test_published_pages_count_the_runs_of_their_config(path):
    config = tomllib.loads(path.read_text(encoding="utf-8"))
    page = ROOT / "docs" / "results" / f"{config['name']}.md"
    if not page.is_file():
        pytest.skip(f"{config['name']} has no results page")
    text = page.read_text(encoding="utf-8")
    expected = len(config["tasks"]) * len(config["operators"]) * len(config["seeds"])
    m = re.search(r"\*\*Runs:\*\* (\d+) of (\d+) finished \(tasks x operator settings x seeds (\[[^\]]*\])\)", text)
    assert m is not None
    assert int(m.group(2)) == expected and m.group(3) == str(config["seeds"])
    assert f"**Config:** `experiments/configs/{path.name}`" in text


def _passes(task: dict, chars: int) -> float:
    train = task["train"]
    return train["max_steps"] * train["batch_size"] * task["model_overrides"]["block_size"] / chars


def test_the_overfit_configs_state_their_passes_over_the_text():
    assert round(_passes(_task(_config("study_overfit"), "shakespeare-5k"), 5000)) == 92
    assert round(_passes(_task(_config("study_overfit_dropout"), "shakespeare-5k"), 5000)) == 92
    assert round(_passes(_task(_config("study_overfit_long"), "shakespeare-20k-dropout"), 20000)) == 92
    size = _config("study_overfit_size")
    assert round(_passes(_task(size, "shakespeare-20k"), 20000)) == 23
    assert math.isclose(round(_passes(_task(size, "shakespeare-100k"), 100000), 1), 4.6)
    # "15 runs" / "30 runs" of the header comments
    for name, runs in [("study_overfit", 15), ("study_overfit_dropout", 15), ("study_overfit_long", 15),
                       ("study_overfit_size", 30)]:
        c = _config(name)
        assert len(c["tasks"]) * len(c["operators"]) * len(c["seeds"]) == runs, name
        assert f"{runs} runs" in (CONFIGS / f"{name}.toml").read_text(encoding="utf-8")


def test_the_stated_epochs_seeds_and_budgets_match_the_configs():
    cifar = _task(_config("study_vision"), "cifar10")["train"]
    assert round(cifar["max_steps"] * cifar["batch_size"] / 45000, 1) == 8.5
    gpu = _task(_config("gpu_vision"), "cifar10")["train"]
    assert gpu["max_steps"] == 14000 and round(gpu["max_steps"] * gpu["batch_size"] / 45000) == 40
    recall = _config("study_recall")
    assert len(recall["seeds"]) == 6 and "6 seeds" in recall["description"]
    assert _task(recall, "mqar")["train"]["max_steps"] == 6000 and "6,000 steps" in recall["description"]
    sweep = _config("sweep_cora_gt")
    assert len(sweep["seeds"]) == 2 and {t["train"]["max_steps"] for t in sweep["tasks"]} == {300}
    assert len(_config("default")["seeds"]) == 3 and "3 seeds each" in _config("default")["description"]
    ssl = _task(_config("study_ssl"), "mnist-dino")
    assert ssl["model_overrides"]["schedule_steps"] == ssl["train"]["max_steps"]  # "keep schedule_steps = max_steps"


def test_cross_validation_configs_keep_the_budgets_they_say_they_share():
    """study_graph_cv = study_graph's MUTAG/PROTEINS tasks + folds; tu_cv = baselines' TU tasks + folds."""
    for cv, base in [("study_graph_cv", "study_graph"), ("tu_cv", "baselines")]:
        cvc, basec = _config(cv), _config(base)
        for task in cvc["tasks"]:
            assert task.get("folds") == 10
            assert {k: v for k, v in task.items() if k != "folds"} == _task(basec, task["name"]), (cv, task["name"])
        assert len(cvc["seeds"]) == 10
    assert _config("study_graph_cv")["operators"] == _config("study_graph")["operators"]


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.stem)
def test_primary_contrasts_name_settings_other_than_the_baseline(path):
    config = tomllib.loads(path.read_text(encoding="utf-8"))
    names = [o["name"] for o in config["operators"]]
    for primary in config.get("primary", []):
        assert primary in names[1:], (path.name, primary)
