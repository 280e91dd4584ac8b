"""Edge probes of the experiments command line (sixth pass): options of another command, empty gaps paths."""

from __future__ import annotations

import json

import pytest

from diffusionformer.experiments.cli import main
from diffusionformer.experiments.gaps import main as gaps_main
from diffusionformer.experiments.runner import run_dir
from experiments_tiny_configs import TINY_DIGITS_TOML, TINY_GAPS_TOML


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_DIGITS_TOML)
    return path


@pytest.mark.parametrize("argv, option, wrong", [
    (["show", "{cfg}", "--out", "r"], "--out", "--set"),
    (["analyze", "{cfg}", "--restart"], "--restart", "--data-root"),
    (["analyze", "{cfg}", "--tasks", "digits"], "--tasks", "--threads"),
    (["summary", "{cfg}", "--restart"], "--restart", "--selected"),
])
def test_bug_an_option_of_another_command_is_not_called_a_misspelling(tiny, capsys, argv, option, wrong):
    """Bug: `show c.toml --out r` said "did you mean '--set'?" (and `summary --set` '--selected', `analyze --restart`
    '--data-root'): an exact option of another command was taken for a misspelt one of this command."""
    with pytest.raises(SystemExit) as exc:
        main([a.format(cfg=tiny) for a in argv])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"unrecognized arguments: {option}" in captured.err
    assert f"did you mean {wrong!r}" not in captured.err
    assert f"{option} is an option of " in captured.err and f"not of {argv[0]!r}" in captured.err


def test_bug_another_commands_option_beside_a_misspelt_one_gets_both_notes(tiny, capsys):
    """Bug: `show c.toml --out r --sett x` offered '--set' for both words; only the misspelt one is close to an option
    of `show`, the other is an option of other commands."""
    with pytest.raises(SystemExit):
        main(["show", str(tiny), "--out", "r", "--sett", "x"])
    err = capsys.readouterr().err
    assert "did you mean '--set' for '--sett'?" in err and "'--set' for '--out'" not in err
    assert "--out is an option of 'run'" in err and "'summary'" in err and "not of 'show'" in err


_GAP_CFG = TINY_GAPS_TOML.replace("seeds = [0, 1]\n", "seeds = [0, 1]\nprimary = [\"lap\"]\n")


def _gap_results(root):
    for op, shift in (("attention", 0.0), ("lap", 0.25)):
        for seed in (0, 1):
            rdir = run_dir(root / "g", "t", op, seed)
            rdir.mkdir(parents=True)
            (rdir / "summary.json").write_text(json.dumps({"status": "completed"}))
            rec = {"step": 10, "split": "eval", "metrics": {"train_loss": 1.0 + seed, "val_loss": 2.0 + seed + shift}}
            (rdir / "metrics.jsonl").write_text(json.dumps(rec) + "\n")


@pytest.mark.parametrize("flag", ["--page", "--out"])
def test_bug_gaps_with_an_empty_page_or_out_is_refused(tmp_path, capsys, monkeypatch, flag):
    """Bug: `gaps c.toml --page "$UNSET"` printed the tables and exited 0, the page it was asked to write never
    written (an empty --page read as no --page); `--out ""` read the current folder. ``run`` refuses both."""
    cfg = tmp_path / "g.toml"
    cfg.write_text(_GAP_CFG)
    _gap_results(tmp_path / "res")
    monkeypatch.chdir(tmp_path / "res")  # --out "" would find the results here
    args = {"--out": str(tmp_path / "res"), "--page": None, flag: ""}
    argv = [str(cfg)] + [x for k, v in args.items() if v is not None for x in (k, v)]
    assert gaps_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"error: {flag}: expected a" in captured.err and "empty path" in captured.err


def test_pins_gaps_table_numbers_reread_from_the_logs(tmp_path, capsys):
    cfg = tmp_path / "g.toml"
    cfg.write_text(_GAP_CFG)
    _gap_results(tmp_path / "res")
    assert gaps_main([str(cfg), "--out", str(tmp_path / "res")]) == 0
    out = capsys.readouterr().out
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 11 and cells[0] in ("attention", "lap (primary)"):
            rows[cells[0]] = cells
    # val - train is 1.0 (attention) and 1.25 (lap) for both seeds; val: 2, 3 and 2.25, 3.25
    assert rows["attention"][1] == "2" and rows["attention"][2] == f"{2.5:.4f} ± {2 ** -0.5:.4f}"
    assert rows["attention"][4] == "1.0000 ± 0.0000" and rows["lap (primary)"][4] == "1.2500 ± 0.0000"
    assert rows["lap (primary)"][5] == "+0.2500" and rows["lap (primary)"][6] == "+0.2500"


@pytest.mark.parametrize("where", ["out", "comparison"])
def test_bug_summary_with_a_file_as_out_says_so(tiny, tmp_path, capsys, where):
    """Bug: `summary c.toml --out FILE` (or a file in the comparison folder's place) said "no results ...; run the
    comparisons first": summary returned before the --out checks every other command makes."""
    out = tmp_path / "res"
    if where == "out":
        out.write_text("x")
    else:
        out.mkdir()
        (out / "tiny").write_text("x")
    assert main(["summary", str(tiny), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "run the comparisons first" not in captured.err
    assert ("got the file" in captured.err) if where == "out" else ("is a file, where the results of 'tiny'" in captured.err)


def test_bug_summary_takes_the_set_its_comparisons_were_run_with(tiny, tmp_path, capsys):
    """Bug: ``summary`` took no ``--set``, so a comparison run with ``run --set ...`` could only be summarised under
    the config's own values (its runs reported as made with another train config); ``--set`` now applies to every
    config, as for ``status``, ``publish`` and ``analyze``."""
    res = str(tmp_path / "res")
    override = ["--set", "tasks.digits.train.batch_size=4"]
    assert main(["run", str(tiny), "--out", res, "--no-progress", *override]) == 0
    capsys.readouterr()
    with pytest.warns(UserWarning, match=r"made with another train or model config .*batch_size: 4 then 8"):
        main(["summary", str(tiny), "--out", res])
    capsys.readouterr()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["summary", str(tiny), "--out", res, *override]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["| task | metric (baseline mean) | lap |", "|---|---|---|"]
    assert lines[2].startswith("| tiny / digits | test_acc (")
