"""Edge-case probes from a CPU rehearsal of the issue-16 GPU study flow (``gpu_study.sh run`` calls A and B per
seed, each resuming from the previous call's archive, then ``publish`` with the same ``--set`` overrides).

Found and fixed (tests named ``test_bug_...``):

- ``publish_experiment`` (and ``publish --set ...``): a comparison run and published with ``--set`` overrides that
  change its runs (fewer steps, a smaller model, other seeds) got a page whose **Command** line named the bare config
  (``run experiments/configs/gpu_text.toml``) under the config file's description ("6 layers ... 5000 steps"): the
  page presented toy runs as the config's. The overrides ``publish`` was given (it refuses runs made with other
  train or model values, so they are the runs' own) are now written into the Command line.
- ``publish_experiment``: runs the config lists that did not finish (a call cut by its budget, whose settings the next
  call of the plan does not train; seeds never run) were published with exit 0 and not a word; it now warns, naming
  them.
- ``outputs.write_outputs``: ``results.md`` (copied into each call's ``$OUT``) keeps the rows of earlier invocations
  but its header named only this invocation's seeds ("Seeds: [2]." above rows of seeds 0-2); it names them all now.
"""

from __future__ import annotations

import shlex

import pytest
from experiments_tiny_configs import TINY_DIGITS_TOML

from diffusionformer.experiments.cli import main


def _command_line(page: str) -> str:
    return next(line for line in page.splitlines() if line.startswith("- **Command:**"))


def test_bug_published_page_names_the_set_overrides_of_its_runs(tmp_path, capsys):
    """Bug: ``run CONFIG --set tasks.digits.train.max_steps=1`` then ``publish CONFIG --set ...`` (the same override:
    without it publish refuses the runs) wrote "Command: `python -m diffusionformer.experiments run CONFIG`": the
    page said nothing of the override, so its runs read as the config's 2-step runs."""
    toml = tmp_path / "tiny.toml"
    toml.write_text(TINY_DIGITS_TOML)
    sets = ["--set", "tasks.digits.train.max_steps=1", "--set", "seeds=[0, 1]"]
    res = tmp_path / "res"
    assert main(["run", str(toml), "--out", str(res), "--no-progress", *sets]) == 0
    with pytest.warns(RuntimeWarning, match="index.md not found"):
        assert main(["publish", str(toml), "--out", str(res), "--to", str(tmp_path / "docs"), *sets]) == 0
    capsys.readouterr()
    line = _command_line((tmp_path / "docs" / "tiny.md").read_text())
    run = f"python -m diffusionformer.experiments run {toml} " + " ".join(
        f"--set {shlex.quote(v)}" for v in sets[1::2])
    assert f"`{run}`" in line, line
    assert "then `publish` with the same config and overrides" in line


def test_bug_publish_names_the_runs_it_publishes_without(tmp_path, capsys):
    """Bug: a GPU call cut by its budget (or a call left out) leaves runs unfinished; the next call of the plan trains
    other settings, so its ``status.md`` counts only its own (all finished), and ``publish`` wrote the page with
    exit 0 and not a word: only the page's "Runs: 24 of 50 finished" told that a whole seed of five settings (and
    the seeds the sitting did not run) was missing from the paired tests. It now warns, naming the runs."""
    toml = tmp_path / "tiny.toml"
    toml.write_text(TINY_DIGITS_TOML)
    res = tmp_path / "res"
    # call A: both settings of seed 0; call B: only the baseline of seed 1 (the other was cut)
    assert main(["run", str(toml), "--out", str(res), "--no-progress", "--set", "seeds=[0]"]) == 0
    assert main(["run", str(toml), "--out", str(res), "--no-progress", "--set", "seeds=[1]",
                 "--set", "operators=attention"]) == 0
    with pytest.warns(RuntimeWarning) as record:
        assert main(["publish", str(toml), "--out", str(res), "--to", str(tmp_path / "docs"),
                     "--set", "seeds=[0, 1]"]) == 0
    capsys.readouterr()
    said = [str(w.message) for w in record if "not finished" in str(w.message)]
    assert len(said) == 1 and "1 of 4 runs" in said[0] and "'lap' seed 1" in said[0], said
    # it names the user's line (here this test's call of main), not a line of the package (stacklevel=3 named cli.py)
    assert [w.filename for w in record if "not finished" in str(w.message)] == [__file__]
    # every run finished: no such warning
    assert main(["run", str(toml), "--out", str(res), "--no-progress", "--set", "seeds=[1]"]) == 0
    with pytest.warns(RuntimeWarning) as record:
        assert main(["publish", str(toml), "--out", str(res), "--to", str(tmp_path / "docs"),
                     "--set", "seeds=[0, 1]"]) == 0
    assert not [w for w in record if "not finished" in str(w.message)]


def test_bug_results_md_names_the_seeds_of_its_rows(tmp_path, capsys):
    """Bug: ``results.md`` (the table ``gpu_study.sh`` copies into ``$OUT`` after each call) keeps the finished runs
    of earlier invocations (``--set seeds=[0]``, then ``--set seeds=[1]``), yet its header said "Seeds: [1]." above
    rows of two seeds: the sitting read a one-seed table that was not one. It now names the seeds of its rows."""
    toml = tmp_path / "tiny.toml"
    toml.write_text(TINY_DIGITS_TOML)
    res = tmp_path / "res"
    for seed in (0, 1):
        assert main(["run", str(toml), "--out", str(res), "--no-progress", "--set", f"seeds=[{seed}]"]) == 0
    capsys.readouterr()
    text = (res / "tiny" / "results.md").read_text()
    assert "| 2 |" in text  # rows of both seeds
    assert "Seeds: [1]." not in text and "Seeds: [0, 1]" in text, text[:400]


def test_bug_analyze_warnings_name_the_users_line_under_the_cli(tmp_path, capsys):
    """Bug: ``analyze --partial``'s warnings (runs not trained yet, runs without checkpoints) had ``stacklevel=3``,
    right for a direct ``analyze_experiment`` call but naming a line of ``cli.py`` under the CLI, where the GPU
    calls run it; they now name the first line outside the package, as the package's other warnings do."""
    toml = tmp_path / "tiny.toml"
    toml.write_text(TINY_DIGITS_TOML)
    res = tmp_path / "res"
    assert main(["run", str(toml), "--out", str(res), "--no-progress", "--set", "seeds=[0]",
                 "--set", "operators=attention"]) == 0
    with pytest.warns(RuntimeWarning, match="not trained yet") as record:
        assert main(["analyze", str(toml), "--out", str(res), "--no-progress", "--partial", "--max-examples", "8",
                     "--set", "seeds=[0]"]) == 0
    capsys.readouterr()
    assert [w.filename for w in record if "not trained yet" in str(w.message)] == [__file__]
