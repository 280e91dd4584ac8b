"""Edge probes of the experiments command line as a power user drives it (sitting 56): ``run --precision`` and the
``status`` command it prints, ``publish`` of a comparison analysed while it was still being run."""

from __future__ import annotations

import shlex

import pytest

from diffusionformer.experiments.cli import main
from experiments_tiny_configs import TINY_DIGITS_TOML


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(TINY_DIGITS_TOML)
    return "tiny.toml"


def _status_hint(err: str) -> list[str]:
    line = next(x for x in err.splitlines() if "from another shell: " in x)
    argv = shlex.split(line.split("from another shell: ")[1])
    assert argv[:3] == ["python", "-m", "diffusionformer.experiments"]
    return argv[3:]


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_bug_status_command_printed_by_run_precision_reads_its_runs_as_completed(tiny, capsys, precision):
    """Bug: ``run c.toml --precision bf16`` printed "from another shell: ... status c.toml" without the precision;
    that command read every run the same ``run`` finished as "completed, made with another train (amp: 'bf16' then
    'auto'): `run --restart` redoes it", advice that discards good runs."""
    assert main(["run", tiny, "--no-progress", "--out", "res", "--precision", precision, "--threads", "1"]) == 0
    argv = _status_hint(capsys.readouterr().err)
    assert argv[:2] == ["status", tiny]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 of 2 runs completed")
    assert "another train" not in out and "--restart" not in out


def test_bug_publish_says_the_analysis_left_out_runs_finished_since(tiny, capsys):
    """Bug: ``analyze --partial`` while the comparison was being run, then ``publish`` once every run had finished:
    the page's token-geometry tables were those of the partial analysis (no row of setting 'lap', which had not
    finished then), with no word on the page or on stderr; publish now warns, naming the runs it left out."""
    run = ["run", tiny, "--no-progress", "--out", "res", "--threads", "1"]
    assert main([*run, "--set", "operators=attention"]) == 0
    assert main(["analyze", tiny, "--out", "res", "--partial", "--no-progress", "--threads", "1"]) == 0
    assert main(run) == 0  # the comparison finishes: 'lap' trained
    with pytest.warns(RuntimeWarning, match="token-geometry analysis") as caught:
        assert main(["publish", tiny, "--out", "res", "--to", "docs"]) == 0
    text = " ".join(str(w.message) for w in caught if "token-geometry" in str(w.message))
    assert text.startswith("publish: the token-geometry analysis")
    assert "1 of the 2 finished runs" in text and "'digits' / 'lap' seed 0" in text and "`analyze`" in text
    assert main(["analyze", tiny, "--out", "res", "--no-progress", "--threads", "1"]) == 0  # analysed again: all
    with pytest.warns(RuntimeWarning) as caught:  # the page's toctree warning
        assert main(["publish", tiny, "--out", "res", "--to", "docs"]) == 0
    assert not [w for w in caught if "token-geometry" in str(w.message)]


@pytest.mark.parametrize("value", ['[{name = "x", laplacian_heads = 1}]', '["lap", {name = "x"}]', "[[\"lap\"]]"])
@pytest.mark.parametrize("key", ["operators", "tasks"])
def test_bug_set_of_a_list_of_tables_for_operators_says_it_keeps_names(tiny, capsys, key, value):
    """Bug: ``--set 'operators=[{name="x", laplacian_heads=1}]'`` (a new setting in the config's TOML form) said "no
    operators named [{'name': 'x', 'laplacian_heads': 1}]; available: ['attention', 'lap']", as if a table were a
    misspelt name; ``operators=`` and ``tasks=`` keep the entries they name, and now say that names are expected."""
    assert main(["show", tiny, "--set", f"{key}={value}"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{key}=NAME,... keeps only the {key} named" in captured.err
    assert "expected names" in captured.err and "no {key} named" not in captured.err
    assert f"[[{key}]]" in captured.err  # where a new entry goes


def test_bug_messages_of_failed_runs_go_to_stderr_and_do_not_contradict(tiny, capsys):
    """Bug: ``run`` printed "2 run(s) failed; see the messages above" on stderr, but the messages were on stdout
    (with ``> table.txt`` nothing was above it), and each said "training stopped and no checkpoint had been
    written.. The last good checkpoint is kept in <folder>.": two periods, and a checkpoint that does not exist."""
    code = main(["run", tiny, "--no-progress", "--out", "res", "--threads", "1",
                 "--set", "tasks.digits.train.lr=1e30", "--set", "tasks.digits.train.max_steps=20"])
    captured = capsys.readouterr()
    assert code == 1
    assert "stopped:" not in captured.out and "| attention |" in captured.out  # the table stays on stdout
    err = captured.err
    assert err.index("[digits / attention / seed 0] stopped: non-finite") < err.index("2 run(s) failed")
    assert "[digits / lap / seed 0] stopped: non-finite" in err
    assert "written.." not in err and "last good checkpoint" not in err
    assert "no checkpoint had been written (run folder res/tiny/runs/digits/lap/seed0)." in err
