"""Edge-case probes of the experiments command line, run as a user would (``main(argv)`` of
``python -m diffusionformer.experiments`` and of ``python -m diffusionformer.experiments.gaps``).

Probed: every subcommand's ``--help``; misspelt commands, options and choices; a missing config, a folder, an empty,
invalid, non-UTF-8 or duplicate-key TOML file, unknown keys and wrong types; paths with spaces and non-ASCII
letters; ``--out``/``--to``/``--page`` naming a file or a folder; ``run`` twice (idempotent), on a half-finished
results folder and on one made by a different config of the same name; ``summary`` of a comparison given twice,
of one never run and of one setting; ``publish`` with a truncated figure or manifest; figures interrupted while
being written.

Found and fixed (tests named ``test_bug_...``):

- ``cli``/``gaps``: a misspelt option said ``unrecognized arguments: --devise cpu`` under the top-level usage,
  a misspelt command or choice listed the choices only; both now say ``did you mean '--device'?`` (the option
  under its command's usage), as do ``--tasks``/``--set tasks=``/``operators=`` with an unknown name and
  ``gaps --primary`` with an unknown quantity.
- ``config``: a folder given as the config was only "not found"; the message now says it is a folder.
- ``summary``: a comparison given twice was counted twice (rows repeated, and Holm's family doubled, which
  changes every adjusted p); a wrong ``--out`` printed an empty, malformed table with exit code 0; a comparison
  of one setting gave a header of three columns over a separator of two.
- ``publish``: a truncated figure (a ``run`` interrupted while drawing) raised ``PIL.UnidentifiedImageError``
  with a traceback; a truncated ``manifest.json`` said ``error: Expecting value: line 2 column 1`` naming no
  file, and one holding a list raised ``AttributeError``.
- ``plots``/``gaps``: figures were written in place, so an interrupt while drawing left a torn PNG (which then
  broke ``publish``); they now replace the earlier figure only once whole.
- ``gaps``: ``--page`` naming a folder, or a path below a file, ended in an ``IsADirectoryError`` /
  ``NotADirectoryError`` traceback; both are one ``error:`` line with exit code 2.
- ``cli``: Ctrl-C printed a ``KeyboardInterrupt`` traceback (now one line on how to go on, exit 130);
  ``status --out <a file>`` read every run as missing and exited 0 (now one error for every command).
"""

from __future__ import annotations

import json
import pickle

import pytest

from experiments_tiny_configs import TINY_DIGITS_TOML
from diffusionformer.experiments.cli import main
from diffusionformer.experiments.gaps import main as gaps_main
from diffusionformer.experiments.results import RunResult, run_dir

TOML = TINY_DIGITS_TOML

GAPS_TOML = ('name = "g"\nseeds = [0, 1]\n[[tasks]]\nname = "t"\ndataset = "pydoc-chars"\nmodel = "gpt-char-tiny"\n'
             'metric = "val_loss"\n[[operators]]\nname = "attention"\n[[operators]]\nname = "lap"\nlaplacian_heads = 1\n')


def _toml(tmp_path, text=TOML, name="tiny.toml"):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


def _results(out, values, name="tiny", task="digits"):
    """``<out>/<name>/results.json`` holding completed runs ``{(setting, seed): test_acc}``."""
    src = out / name
    src.mkdir(parents=True, exist_ok=True)
    rows = [RunResult(task, op, seed, "completed", "test_acc", v, {"test_acc": v}, 10, 1.0).__dict__
            for (op, seed), v in values.items()]
    (src / "results.json").write_text(json.dumps({"runs": rows, "summary": []}))
    return src


def _error(capsys, code, expected):
    """The one ``error:`` line of a user error: exit ``expected``, no traceback."""
    assert code == expected
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# ----------------------------------------------------------------------------- the parser
@pytest.mark.parametrize("command", [[], ["run"], ["show"], ["status"], ["list"], ["summary"], ["publish"], ["analyze"]])
def test_every_subcommand_has_help(command, capsys):
    """Pins: ``--help`` of the program and of each command exits 0 and prints its usage."""
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: diffusionformer {' '.join(command)}".rstrip())


def test_bug_a_misspelt_option_names_the_closest_under_its_commands_usage(tmp_path, capsys):
    """Bug: ``run c.toml --devise cpu`` said ``diffusionformer: error: unrecognized arguments: --devise cpu`` under
    the top-level usage (which lists no option of ``run``), with no hint."""
    toml = _toml(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["run", toml, "--devise", "cpu"])
    err = _error(capsys, info.value.code, 2)
    assert "usage: diffusionformer run" in err
    assert err.rstrip().endswith("unrecognized arguments: --devise cpu (did you mean '--device'?)")
    with pytest.raises(SystemExit):
        main(["run", toml, "--devise=cpu", "--work", "2"])
    assert "(did you mean '--device' for '--devise', '--workers' for '--work'?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["list", "extra"])  # a stray positional: no hint to give, the message as before
    assert capsys.readouterr().err.rstrip().endswith("diffusionformer list: error: unrecognized arguments: extra")


@pytest.mark.parametrize("argv,hint", [(["rn", "c.toml"], "did you mean 'run'?"),
                                       (["statsu", "c.toml"], "did you mean 'status'?"),
                                       (["run", "c.toml", "--precision", "bf61"], "did you mean 'bf16'?")])
def test_bug_a_misspelt_command_or_choice_gets_did_you_mean(argv, hint, capsys):
    """Bug: ``rn`` or ``--precision bf61`` listed the choices but did not say which one was meant."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = _error(capsys, info.value.code, 2)
    assert "invalid choice" in err and err.rstrip().endswith(hint)


def test_bug_gaps_misspelt_option_and_quantity_get_did_you_mean(tmp_path, capsys):
    """Bug: ``gaps --primry`` said only ``unrecognized arguments``; ``--primary final_vall`` listed the quantities
    without the close one."""
    toml = _toml(tmp_path, GAPS_TOML, "g.toml")
    with pytest.raises(SystemExit) as info:
        gaps_main([toml, "--primry", "final_val"])
    assert "(did you mean '--primary'?)" in _error(capsys, info.value.code, 2)
    err = _error(capsys, gaps_main([toml, "--primary", "final_vall"]), 2)
    assert err.rstrip().endswith("got ['final_vall'] (did you mean 'final_val'?)")


def test_bug_unknown_task_names_get_did_you_mean(tmp_path, capsys):
    """Bug: ``--tasks digitz``, ``--set tasks=digitz`` and ``--set operators=lapp`` listed the names without the
    close one."""
    toml = _toml(tmp_path)
    err = _error(capsys, main(["run", toml, "--tasks", "digitz", "--out", str(tmp_path / "r"), "--no-progress"]), 2)
    assert "unknown task(s) ['digitz']" in err and "(did you mean 'digits'?)" in err
    assert not (tmp_path / "r").exists()  # refused before anything is written
    err = _error(capsys, main(["show", toml, "--set", "tasks=digitz"]), 2)
    assert "no tasks named ['digitz']" in err and "(did you mean 'digits'?)" in err
    err = _error(capsys, main(["show", toml, "--set", "operators=attention,lapp"]), 2)
    assert "no operators named ['lapp']" in err and "(did you mean 'lap'?)" in err


# ----------------------------------------------------------------------------- config files
def test_bug_a_config_that_is_a_folder_is_named_a_folder(tmp_path, capsys):
    """Bug: ``show experiments/configs`` (a folder) said only ``experiment config '...' not found``, though the path
    exists; it now says the path is a folder (and names a TOML file in it)."""
    folder = tmp_path / "configs"
    folder.mkdir()
    err = _error(capsys, main(["show", str(folder)]), 2)
    assert err == f"error: experiment config {str(folder)!r} not found: that path is a folder, expected a TOML file\n"
    _toml(folder, name="a.toml")
    err = _error(capsys, main(["status", str(folder)]), 2)
    assert f"that path is a folder, expected a TOML file such as {str(folder / 'a.toml')!r}" in err


@pytest.mark.parametrize("text,match", [
    ("", "missing required key 'name'"),
    ("name = [", "invalid TOML"),
    ('name = "a"\nname = "b"\n', "invalid TOML: Cannot overwrite a value"),
    (TOML.replace("seeds = [0]", "seeds = [0]\nsedes = [1]"), "unknown key 'sedes'.*did you mean 'seeds'"),
    (TOML.replace("max_steps = 2", 'max_steps = "2"'), r"max_steps: expected int, got str \('2'\)"),
    (b"\xff\xfe", "not UTF-8 text"),
])
def test_bad_config_files_are_one_error_line(tmp_path, capsys, text, match):
    """Pins: empty, invalid, duplicate-key, non-UTF-8 configs, unknown keys and wrong types: exit 2, one
    ``error:`` naming the problem, no traceback (``show`` and ``run`` alike)."""
    import re

    path = tmp_path / "c.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    for argv in (["show", str(path)], ["run", str(path), "--out", str(tmp_path / "r")]):
        err = _error(capsys, main(argv), 2)
        assert re.search(match, err), err
    assert not (tmp_path / "r").exists()


# ----------------------------------------------------------------------------- run end to end
def test_run_twice_is_idempotent_and_a_changed_config_is_refused(tmp_path, capsys):
    """Pins: ``run`` of a tiny config from a path with spaces and non-ASCII letters exits 0; a second ``run`` trains
    nothing and leaves every file byte for byte; ``status`` says completed; after a run's summary is lost (a
    half-finished folder) ``run`` finishes it; the same name with another budget is refused (exit 2) naming the
    change."""
    toml = _toml(tmp_path / "my cönfigs", name="tiny ü.toml")
    out = tmp_path / "rés ults"
    argv = ["run", toml, "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    files = {p: p.read_bytes() for p in sorted((out / "tiny").rglob("*")) if p.is_file()}
    assert (out / "tiny" / "results.md").is_file() and (out / "tiny" / "plots" / "digits_curves.png").is_file()
    assert main(argv) == 0
    assert {p: p.read_bytes() for p in sorted((out / "tiny").rglob("*")) if p.is_file()} == files
    capsys.readouterr()
    assert main(["status", toml, "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("2 of 2 runs completed")
    (run_dir(out / "tiny", "digits", "lap", 0) / "summary.json").unlink()
    assert main(argv) == 0 and (run_dir(out / "tiny", "digits", "lap", 0) / "summary.json").is_file()
    capsys.readouterr()
    changed = _toml(tmp_path, TOML.replace("max_steps = 2", "max_steps = 3"), "changed.toml")
    err = _error(capsys, main(["run", changed, "--out", str(out), "--no-progress"]), 2)
    assert "made with a different train (max_steps: 2 then 3)" in err


# ----------------------------------------------------------------------------- summary
def test_bug_summary_of_a_comparison_given_twice_is_refused(tmp_path, capsys):
    """Bug: ``summary c.toml c.toml`` listed every row twice and took Holm's adjustment over the doubled family
    (each adjusted p multiplied by up to twice the number of contrasts), with exit code 0."""
    toml = _toml(tmp_path)
    _results(tmp_path / "res", {("attention", 0): 0.5, ("lap", 0): 0.6})
    err = _error(capsys, main(["summary", toml, toml, "--out", str(tmp_path / "res")]), 2)
    assert "comparison(s) ['tiny'] given more than once" in err


def test_bug_summary_with_no_results_is_an_error_not_an_empty_table(tmp_path, capsys):
    """Bug: ``summary c.toml --out wrong`` printed ``| task | metric (baseline mean) |  |`` over a two-column
    separator and "0 comparisons", with exit code 0."""
    toml = _toml(tmp_path)
    err = _error(capsys, main(["summary", toml, "--out", str(tmp_path / "wrong")]), 2)
    assert "summary: no results under" in err and str(tmp_path / "wrong" / "tiny" / "results.json") in err
    assert capsys.readouterr().out == ""


def test_bug_summary_of_a_one_setting_comparison_is_a_well_formed_table(tmp_path, capsys):
    """Bug: a comparison of one operator setting (no contrast) gave the header ``| task | metric (baseline mean) |  |``
    (three cells) over the separator ``|---|---|`` (two), which markdown renders as no table."""
    toml = _toml(tmp_path, TOML.split("[[operators]]\nname = \"lap\"")[0])
    _results(tmp_path / "res", {("attention", 0): 0.5})
    assert main(["summary", toml, "--out", str(tmp_path / "res")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == ["| task | metric (baseline mean) |", "|---|---|", "| tiny / digits | test_acc (0.5000) |"]


def test_summary_of_two_settings_keeps_its_table(tmp_path, capsys):
    """Pins: the cells of a two-setting summary (the header and rows rebuilt one cell per setting)."""
    raw = TOML.replace("seeds = [0]", "seeds = [0, 1, 2]")
    toml = _toml(tmp_path, raw)
    _results(tmp_path / "res", {("attention", 0): 0.5, ("attention", 1): 0.5, ("attention", 2): 0.52,
                                ("lap", 0): 0.51, ("lap", 1): 0.54, ("lap", 2): 0.54})
    assert main(["summary", toml, "--out", str(tmp_path / "res")]) == 0
    lines = capsys.readouterr().out.splitlines()
    from scipy import stats

    p = stats.ttest_rel([0.51, 0.54, 0.54], [0.5, 0.5, 0.52]).pvalue
    assert lines[:3] == ["| task | metric (baseline mean) | lap |", "|---|---|---|",
                         f"| tiny / digits | test_acc (0.5067) | +0.0233 (p {p:.3f}; Holm {p:.3f}) |"]


# ----------------------------------------------------------------------------- publish
def test_bug_publish_with_a_torn_figure_names_it(tmp_path, capsys):
    """Bug: a figure truncated by an interrupted ``run`` made ``publish`` end in a
    ``PIL.UnidentifiedImageError`` traceback; it is now one error naming the figure, and the earlier page and its
    files stay as they were."""
    pytest.importorskip("PIL")
    toml = _toml(tmp_path)
    src = _results(tmp_path / "res", {("attention", 0): 0.5, ("lap", 0): 0.6})
    docs = tmp_path / "docs"
    (docs / "tiny").mkdir(parents=True)
    (docs / "tiny" / "old.txt").write_text("earlier")
    (src / "plots").mkdir()
    (src / "plots" / "digits_curves.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    err = _error(capsys, main(["publish", toml, "--out", str(tmp_path / "res"), "--to", str(docs)]), 2)
    assert f"{src / 'plots' / 'digits_curves.png'}: not a readable PNG figure" in err and "`run` the comparison" in err
    assert sorted(p.name for p in docs.iterdir()) == ["tiny"] and (docs / "tiny" / "old.txt").read_text() == "earlier"


@pytest.mark.parametrize("manifest,why", [('{"cuda":', "JSONDecodeError"), ("[1, 2]", "a JSON list")])
def test_bug_publish_with_a_bad_manifest_names_it(tmp_path, capsys, manifest, why):
    """Bug: a truncated ``manifest.json`` gave ``error: Expecting value: line 1 column 9 (char 8)`` naming no file;
    one holding a list raised ``AttributeError: 'list' object has no attribute 'get'`` with a traceback."""
    toml = _toml(tmp_path)
    src = _results(tmp_path / "res", {("attention", 0): 0.5, ("lap", 0): 0.6})
    (src / "manifest.json").write_text(manifest)
    err = _error(capsys, main(["publish", toml, "--out", str(tmp_path / "res"), "--to", str(tmp_path / "docs")]), 2)
    assert f"{src / 'manifest.json'} is not the manifest of a comparison ({why}" in err
    assert not (tmp_path / "docs").exists() or not any((tmp_path / "docs").iterdir())


# ----------------------------------------------------------------------------- figures written whole
def _interrupted_savefig(monkeypatch):
    """Make matplotlib's ``Figure.savefig`` write a few bytes to its target and then raise ``KeyboardInterrupt``."""
    from matplotlib.figure import Figure

    def torn(self, fname, *args, **kwargs):
        with open(fname, "wb") as f:
            f.write(b"\x89PNG torn")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", torn)


def test_bug_an_interrupted_figure_leaves_the_earlier_one_whole(tmp_path, monkeypatch, write_run):
    """Bug: ``plot_experiment`` drew straight into ``plots/<task>_curves.png``, so a Ctrl-C while drawing left a
    torn PNG; the earlier figure now stays whole and no temporary is left behind."""
    pytest.importorskip("matplotlib")
    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments.plots import plot_experiment

    config = load_experiment_config(_toml(tmp_path))
    out = tmp_path / "tiny"
    record = {"step": 2, "split": "eval", "loss": 1.0, "metrics": {"test_acc": 0.5}}
    results = []
    for op in ("attention", "lap"):
        write_run(out, "digits", op, 0, [{**record, "split": "train"}, record])
        results.append(RunResult("digits", op, 0, "completed", "test_acc", 0.5, {"test_acc": 0.5}))
    written = plot_experiment(out, config, results)
    before = {p.name: p.read_bytes() for p in written}
    assert all(b.startswith(b"\x89PNG\r\n") for b in before.values())
    _interrupted_savefig(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        plot_experiment(out, config, results)
    assert {p.name: p.read_bytes() for p in (out / "plots").iterdir()} == before


def _gap_runs(root):
    for op in ("attention", "lap"):
        for seed in (0, 1):
            rdir = run_dir(root / "g", "t", op, seed)
            rdir.mkdir(parents=True)
            (rdir / "summary.json").write_text(json.dumps({"status": "completed"}))
            (rdir / "metrics.jsonl").write_text("".join(
                json.dumps({"step": 100 * (i + 1), "split": "eval",
                            "metrics": {"train_loss": 2.0 - 0.1 * i - 0.01 * seed, "val_loss": 2.5 - 0.05 * i}}) + "\n"
                for i in range(3)))


def test_bug_gaps_page_that_is_a_folder_or_below_a_file_is_one_error(tmp_path, capsys):
    """Bug: ``gaps --page docs`` (a folder) ended in ``IsADirectoryError`` and ``--page notes.txt/g.md`` in
    ``NotADirectoryError``, each with a traceback; both are now one ``error:`` line with exit code 2."""
    toml = _toml(tmp_path, GAPS_TOML, "g.toml")
    _gap_runs(tmp_path / "res")
    (tmp_path / "docs").mkdir()
    err = _error(capsys, gaps_main([toml, "--out", str(tmp_path / "res"), "--page", str(tmp_path / "docs")]), 2)
    assert err == f"error: --page: expected the results page (a markdown file), got the folder {str(tmp_path / 'docs')!r}\n"
    (tmp_path / "notes.txt").write_text("x")
    err = _error(capsys, gaps_main([toml, "--out", str(tmp_path / "res"), "--page", str(tmp_path / "notes.txt" / "g.md")]), 2)
    assert err.startswith("error: ") and "Not a directory" in err


def test_bug_gaps_interrupted_while_drawing_keeps_the_published_figure(tmp_path, capsys, monkeypatch):
    """Bug: ``gaps --page`` drew ``<name>/plots/<task>_gap.png`` beside the page in place, so an interrupt while
    drawing tore the published figure; a second ``gaps`` gives the same page (idempotent)."""
    pytest.importorskip("matplotlib")
    toml = _toml(tmp_path, GAPS_TOML, "g.toml")
    _gap_runs(tmp_path / "res")
    page = tmp_path / "docs ü" / "g.md"
    page.parent.mkdir()
    page.write_text("# g\n")
    argv = [toml, "--out", str(tmp_path / "res"), "--page", str(page)]
    assert gaps_main(argv) == 0
    text, png = page.read_text(), (page.parent / "g" / "plots" / "t_gap.png").read_bytes()
    assert gaps_main(argv) == 0 and page.read_text() == text
    _interrupted_savefig(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        gaps_main(argv)
    assert page.read_text() == text and (page.parent / "g" / "plots" / "t_gap.png").read_bytes() == png
    assert [p.name for p in (page.parent / "g" / "plots").iterdir()] == ["t_gap.png"]


@pytest.mark.parametrize("command", ["run", "publish"])
def test_bug_ctrl_c_is_one_line_and_exit_130(tmp_path, capsys, monkeypatch, command):
    """Bug: Ctrl-C in any command printed Python's ``KeyboardInterrupt`` traceback; it is now one line saying how
    to go on (for ``run``: finished runs are kept, an unfinished one resumes) and exit 130, as a shell reports
    SIGINT."""
    from diffusionformer.experiments import publish, runner

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_experiment", interrupted)
    monkeypatch.setattr(publish, "publish_experiment", interrupted)
    try:
        code = main([command, _toml(tmp_path), "--out", str(tmp_path / "res")])
    except KeyboardInterrupt:  # caught here: escaping, it would stop the whole test session
        pytest.fail("KeyboardInterrupt escaped main")
    err = _error(capsys, code, 130)
    assert f"interrupted: `{command}` stopped; run the same command again" in err
    assert ("resumes from its last checkpoint" in err) == (command == "run")


@pytest.mark.parametrize("command", ["status", "run", "publish"])
def test_bug_out_that_is_a_file_is_one_error(tmp_path, capsys, command):
    """Bug: ``status --out notes.txt`` (a file) reported every run "missing" and exited 0; every command that reads
    or writes the results folder now says the path is a file, exit 2, and leaves the file as it was."""
    (tmp_path / "notes.txt").write_text("mine")
    err = _error(capsys, main([command, _toml(tmp_path), "--out", str(tmp_path / "notes.txt")]), 2)
    assert err == f"error: --out: expected the results folder, got the file {str(tmp_path / 'notes.txt')!r}\n"
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("below", [False, True])
def test_bug_publish_to_a_file_is_one_error(tmp_path, capsys, below):
    """Bug: ``publish c.toml --to notes.txt`` (a file, or a path below one) ended in "[Errno 20] Not a directory"
    with no word of which option was wrong. It now names ``--to``, exit 2, and leaves the file as it was."""
    (tmp_path / "notes.txt").write_text("mine")
    to = tmp_path / "notes.txt" / "results" if below else tmp_path / "notes.txt"
    err = _error(capsys, main(["publish", _toml(tmp_path), "--out", str(tmp_path / "res"), "--to", str(to)]), 2)
    assert err == (f"error: --to: expected the docs folder of the results pages, got {str(to)!r}, "
                   f"which is or lies below a file\n")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_bug_status_names_runs_made_with_another_training_config(tmp_path, capsys):
    """Bug: after ``max_steps = 2`` became ``4`` in the config, ``status`` still said "2 of 2 runs completed" and
    "2 / 4" steps, while ``run`` refused both runs ("made with a different train (max_steps: 2 then 4)"). ``status``
    now says what changed and that ``run --restart`` redoes them, counts them as not done, and times their steps."""
    out = str(tmp_path / "res")
    assert main(["run", _toml(tmp_path), "--out", out, "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["status", _toml(tmp_path), "--out", out]) == 0
    before = capsys.readouterr().out
    assert before.startswith("2 of 2 runs completed; about 0 min of training left") and "another" not in before
    longer = _toml(tmp_path, TOML.replace("max_steps = 2", "max_steps = 4"))
    assert main(["status", longer, "--out", out]) == 0
    after = capsys.readouterr().out
    assert after.startswith("0 of 2 runs completed")
    assert after.count("| completed, made with another train (max_steps: 2 then 4): `run --restart` redoes it | 2 / 4 |") == 2
    err = _error(capsys, main(["run", longer, "--out", out, "--no-progress"]), 2)
    assert "made with a different train (max_steps: 2 then 4)" in err


def test_bug_a_killed_writers_hidden_figure_folder_is_swept_by_the_next_write(tmp_path):
    """Bug: a process killed while saving a figure left ``plots/.<figure>.XXXX.tmp/`` behind for good (the hidden
    folder keeps it out of ``plots/*.png``, but every kill added one). The next write of that figure now removes
    leftovers older than ten minutes; a fresh one (a writer still busy) and other figures' are kept."""
    import os

    from diffusionformer.experiments.plots import _replace_when_written

    plots = tmp_path / "plots"
    plots.mkdir()
    stale, fresh, other = (plots / ".a_curves.png.old1abcd.tmp", plots / ".a_curves.png.new1abcd.tmp",
                           plots / ".b_curves.png.old2abcd.tmp")
    for d in (stale, fresh, other):
        d.mkdir()
        (d / "x.png").write_bytes(b"torn")
    hour_ago = os.stat(stale).st_mtime - 3600
    for d in (stale, other):
        os.utime(d, (hour_ago, hour_ago))
    with _replace_when_written(plots / "a_curves.png") as tmp:
        tmp.write_bytes(b"whole")
    assert (plots / "a_curves.png").read_bytes() == b"whole"
    assert sorted(p.name for p in plots.iterdir()) == sorted(["a_curves.png", fresh.name, other.name])


def test_bug_a_whole_checkpoint_of_a_refused_type_is_not_advised_away(tmp_path):
    """Bug: a whole checkpoint holding a type ``torch.load(weights_only=True)`` refuses (a NumPy array from a
    module's ``get_extra_state``) got the advice for a damaged one, "Delete ... to train this run again", which
    loses a good file. The advice now says the file is whole and how to allow the type; deleting is the second
    choice."""
    import numpy as np
    import torch

    from diffusionformer.experiments.runner import _not_resumed_advice
    from diffusionformer.train import CheckpointError
    from diffusionformer.train.checkpoint import load_checkpoint

    path = tmp_path / "checkpoint.pt"
    torch.save({"model": {"extra": np.zeros(2)}}, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    advice = _not_resumed_advice(info.value, "runs/a/checkpoint.pt", "this")
    assert advice.startswith("runs/a/checkpoint.pt is whole: allow the type it names "
                             "(torch.serialization.add_safe_globals)")
    assert advice.endswith("or delete it to train this run again from step 0.")
    damaged = CheckpointError("truncated")
    damaged.__cause__ = pickle.UnpicklingError("invalid load key, 'x'.")
    assert _not_resumed_advice(damaged, "runs/a/checkpoint.pt", "this").startswith("Delete runs/a/checkpoint.pt")
