"""Edge probes from a newcomer's walk through the README, the tutorials and the command line's --help (task 51d)."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.cli import _parser, main
from diffusionformer.experiments.publish import publish_experiment
from diffusionformer.train import TrainConfig

DEFAULT_TOML = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "default.toml"


def _raw() -> dict:
    return {
        "name": "nc",
        "seeds": [0],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
                   "train": {"max_steps": 2, "batch_size": 8, "warmup_steps": 0}}],
        "operators": [{"name": "attention"}],
    }


def test_max_steps_below_the_warmup_names_max_steps_and_the_remedy():
    """Bug: ``--set tasks.digits.train.max_steps=20`` on the default config (warmup_steps 40) was refused as
    ``TrainConfig.lr_decay_steps: expected lr_decay_steps (None = max_steps) >= warmup_steps (40), got 20``: it
    named a field the user never set and not what to change. It names max_steps now, and the two remedies."""
    with pytest.raises(ValueError) as info:
        TrainConfig.from_dict({"max_steps": 20, "warmup_steps": 40})
    text = str(info.value)
    assert "TrainConfig.max_steps: expected max_steps >= warmup_steps (40)" in text and "got 20" in text
    assert "lower warmup_steps or set lr_decay_steps" in text
    # an lr_decay_steps given is still the field named
    with pytest.raises(ValueError, match=r"TrainConfig\.lr_decay_steps: expected .*>= warmup_steps \(40\), got 30"):
        TrainConfig.from_dict({"max_steps": 100, "warmup_steps": 40, "lr_decay_steps": 30})


def test_publish_before_run_names_the_run_command_with_the_same_set_and_out(tmp_path):
    """Bug: ``publish CONFIG --set seeds=[0] --out tiny`` before ``run`` said to run
    ``python -m diffusionformer.experiments run CONFIG`` first, without the --set and --out: copied, that trains the
    config as its file has it (the README's main job: 18 runs, into results/) instead of the comparison meant."""
    cfg = load_experiment_config(_raw())
    out = tmp_path / "my results"
    with pytest.raises(FileNotFoundError) as info:
        publish_experiment(cfg, out, tmp_path / "docs", config_path="nc.toml", overrides=["seeds=[0]"],
                           imports=["mine.py"])
    want = (f"run nc.toml --import mine.py --set 'seeds=[0]' --out {shlex.quote(str(out))}` first")
    assert want in str(info.value), str(info.value)
    with pytest.raises(FileNotFoundError) as info:  # the default --out is not spelt out
        publish_experiment(cfg, "results", tmp_path / "docs", config_path="nc.toml")
    assert "run nc.toml` first" in str(info.value), str(info.value)


def test_analyze_says_where_it_wrote(tmp_path, monkeypatch, capsys):
    """Bug: ``analyze CONFIG`` ended printing nothing but its thread line (``run`` names its results.md and plots):
    a newcomer had to guess that the tables and figures went to ``<out>/<name>/analysis/``."""
    import diffusionformer.experiments.analyze as analyze

    def fake(config, out_root, **kwargs):  # what analyze_experiment writes, without trained runs to measure
        adir = Path(out_root) / config.name / "analysis"
        (adir / "plots").mkdir(parents=True)
        (adir / "plots" / "digits_smoothing.png").write_bytes(b"")
        (adir / "README.md").write_text("# Token geometry\n")
        (adir / "metrics.json").write_text("{}")
        return {}

    monkeypatch.setattr(analyze, "analyze_experiment", fake)
    assert main(["analyze", str(DEFAULT_TOML), "--out", str(tmp_path), "--no-progress", "--threads", "1"]) == 0
    adir = tmp_path / "default" / "analysis"
    assert f"analysis: {adir}/README.md, {adir}/metrics.json, plots in {adir}/plots/" in capsys.readouterr().out


@pytest.mark.parametrize(("command", "flags"), [("status", ["--set"]), ("publish", ["--set"]),
                                                ("analyze", ["--set", "--out", "--data-root"])])
def test_every_option_of_status_publish_analyze_has_a_help_text(command, flags):
    """Bug: ``status --help``, ``publish --help`` and ``analyze --help`` listed ``--set KEY=VALUE`` (and analyze its
    ``--out`` and ``--data-root``) with no text at all: nothing said that they must repeat run's --set and --out."""
    sub = _parser()._subparsers._group_actions[0].choices[command]
    helps = {a.option_strings[0]: a.help for a in sub._actions if a.option_strings}
    for flag in flags:
        assert helps[flag], f"{command} {flag} has no help text"


def test_status_of_runs_made_with_set_overrides_says_to_repeat_the_set():
    """Bug: after ``run CONFIG --set tasks.digits.train.max_steps=20``, ``status CONFIG`` (the --set forgotten) named
    every run "made with another train (...): `run --restart` redoes it": the one remedy offered deletes the runs,
    when repeating the --set reads them. A line under the count now says both."""
    from diffusionformer.experiments.tables import format_status

    row = {"task": "digits", "operator": "attention", "seed": 0, "state": "completed", "step": 20, "max_steps": 400,
           "holder": None, "elapsed": 1.0, "changed": "train (max_steps: 20 then 400)", "resumes_from": 20}
    lines = format_status([row, {**row, "seed": 1}]).splitlines()
    assert lines[0].startswith("0 of 2 runs completed; about ")
    assert lines[1].startswith("2 run(s) were made with another config than this one (below): if they were run "
                               "with --set overrides or --import, give status the same ones; else `run --restart`"), lines[1]
    assert "were made with another config" not in format_status([{**row, "changed": None}])


def test_status_of_an_out_folder_that_does_not_exist_says_so(tmp_path, capsys):
    """Bug: ``status CONFIG`` after ``run CONFIG --out tiny`` (the --out forgotten, or misspelt) listed every run as
    missing, "0 of 18 runs completed", exactly as for a comparison not yet started: nothing said that the results
    folder it read does not exist."""
    out = tmp_path / "nothere"
    assert main(["status", str(DEFAULT_TOML), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("0 of 18 runs completed")
    assert f"note: {out / 'default'} does not exist: nothing was run into --out {str(out)!r} yet" in captured.err
    (out / "default").mkdir(parents=True)  # a comparison started: no note
    assert main(["status", str(DEFAULT_TOML), "--out", str(out)]) == 0
    assert "note:" not in capsys.readouterr().err


@pytest.mark.parametrize(("value", "hint"), [("Half", " (did you mean 'half'?)"), ("half2", "")])
def test_a_bad_laplacian_heads_string_is_named(value, hint, capsys):
    """Bug: ``--set operators.laplacian-half.laplacian_heads=Half`` (or ``half2``) was refused with "laplacian_heads
    must be an int, a list or 'half'": the value given was not named, and a case slip got no "did you mean"."""
    assert main(["show", str(DEFAULT_TOML), "--set", f"operators.laplacian-half.laplacian_heads={value}"]) == 2
    want = f"laplacian_heads must be an int, a list or 'half', got {value!r}{hint}\n"
    assert capsys.readouterr().err.endswith(want)


def test_run_without_matplotlib_does_not_point_at_plots_it_did_not_draw(tmp_path, monkeypatch, capsys):
    """Bug: without matplotlib, ``run`` said "plots skipped: ..." and then ended with "results: ..., plots in
    <out>/<name>/plots/": that folder was there (made before matplotlib is imported) but empty."""
    import diffusionformer.experiments.plots as plots

    def no_matplotlib(*args, **kwargs):
        raise ImportError('plots need matplotlib: pip install "diffusionformer[plot]"')

    monkeypatch.setattr(plots, "_figure", no_matplotlib)
    from experiments_tiny_configs import TINY_DIGITS_TOML

    toml = tmp_path / "tiny.toml"
    toml.write_text(TINY_DIGITS_TOML)
    out = tmp_path / "res"
    assert main(["run", str(toml), "--out", str(out), "--no-progress", "--threads", "1"]) == 0
    captured = capsys.readouterr()
    assert "plots skipped: plots need matplotlib" in captured.err
    last = captured.out.splitlines()[-1]
    folder = out / "tiny"
    assert last.startswith(f"results: {folder}/results.md, {folder}/results.json, no plots (see above) "), last
