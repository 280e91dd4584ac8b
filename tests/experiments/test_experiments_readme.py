"""What a newcomer reads: the README's table has the layout ``run`` prints (the compact table); ``--help`` explains ``--set``."""

from __future__ import annotations

import re
from pathlib import Path

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.runner import RunResult, aggregate, format_table

REPO = Path(__file__).resolve().parents[2]


def _readme_table() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"```\n(### digits .*?)```", text, re.S)
    assert block, "the README has no fenced table of the main job"
    return block.group(1).rstrip("\n").split("\n")


def _printed_table() -> list[str]:
    config = load_experiment_config(REPO / "experiments" / "configs" / "default.toml")
    runs = [RunResult(t.name, o.name, s, "completed", t.metric, 0.5 + 0.01 * s, num_parameters=1000, elapsed=10.0 + s)
            for t in config.tasks for o in config.operators for s in config.seeds]
    return format_table(aggregate(runs), config, compact=True).rstrip("\n").split("\n")


def test_readme_table_has_the_printed_layout():
    readme, printed = _readme_table(), _printed_table()
    assert len(readme) == len(printed)
    for mine, theirs in zip(readme, printed):
        if theirs.startswith(("###", "| operator", "|---")) or not theirs.startswith("|"):
            assert mine == theirs  # headings, column names, separator rows, blank lines and the legend verbatim
        else:
            assert mine.count("|") == theirs.count("|")  # same cells
            assert mine.split("|")[1] == theirs.split("|")[1]  # same operator, in the same order


def test_run_help_says_that_set_operators_selects_by_name(capsys):
    import pytest

    from diffusionformer.experiments.cli import main

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "operators=NAME,... keep only the named tasks / operator settings" in text
    assert "--threads N" in text and "--workers N" in text
    # and it does what the help says
    config = load_experiment_config(REPO / "experiments" / "configs" / "default.toml",
                                    ["operators=attention,laplacian-half"])
    assert [o.name for o in config.operators] == ["attention", "laplacian-half"]
