"""Edge-case probes of the experiments command line, fourth round: ``python -m diffusionformer.experiments`` as a
newcomer meets it.

Probed in fresh interpreters (by hand; the tests below call ``main(argv)`` in process, as a fresh interpreter
takes about 4 s to import the package): every subcommand and its ``--help``; a config that does not exist, a
folder, a TOML syntax error (line and column named), not UTF-8, mistyped values; ``--workers 0/-1``,
``--threads 0/-1``, ``--set`` without ``=`` or with an empty key, ``--tasks`` with no name, ``--max-examples 0``;
a misspelt and a missing command; ``status``/``publish``/``analyze``/``summary`` before any run, ``summary`` of
one config and of one config given twice; stdout against stderr (tables only on stdout, with ``> file``); stdout
piped to a reader that has gone (``| true``, buffered and unbuffered: exit 141, no traceback); colours (none are
used). All behaved, except:

Found and fixed (tests named ``test_bug_...``):

- ``config.load_experiment_config``: an empty config path (``run "$CONFIG"`` with ``CONFIG`` unset) said
  ``experiment config '.' not found: that path is a folder``, naming a path the user never gave.
- ``cli._main``: ``--out ""`` / ``--to ""`` (an unset variable) silently wrote the results, or the docs page and
  its folder, into the current folder (``Path("")`` is ``.``); refused now, naming the option.
- ``cli.main``: a warning of the library (``publish`` without ``index.md``, ...) showed as Python prints it: the
  library's file path and line, the category and the source line of the call (``page = publish_experiment(...)``);
  it is now one ``warning: <message>`` line.

Found, not changed: ``run`` draws its bar over runs on stderr also when stderr is not a terminal (``2> log``
holds the bar's ``\\r`` frames), while each run's step bar is hidden there; with few frames per run and no other
per-run line in such a log, this reads as a choice, not a bug.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

import diffusionformer.experiments.config as config_mod
from experiments_tiny_configs import TINY_DIGITS_TOML
from diffusionformer.experiments.cli import main


def _toml(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.toml").write_text(TINY_DIGITS_TOML, encoding="utf-8")
    return str(folder / "tiny.toml")


def _error(capsys, code):
    """The one ``error:`` line of a user error: exit 2, no traceback, nothing on stdout."""
    assert code == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == ""
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1
    return captured.err


@pytest.mark.parametrize("command", ["run", "show", "status", "publish", "analyze", "summary"])
def test_bug_an_empty_config_path_is_called_empty(tmp_path, capsys, monkeypatch, command):
    """Bug: ``run ""`` (``run "$CONFIG"`` with ``CONFIG`` unset) said ``experiment config '.' not found: that path
    is a folder, expected a TOML file such as 'tiny.toml'``: ``Path("")`` is the current folder, a path the user
    never gave."""
    _toml(tmp_path)
    monkeypatch.chdir(tmp_path)
    err = _error(capsys, main([command, ""]))
    assert "empty" in err and "'.'" not in err and "folder" not in err
    with pytest.raises(FileNotFoundError, match="empty"):
        config_mod.load_experiment_config("")


@pytest.mark.parametrize("argv", [["run", "{toml}", "--out", "", "--no-progress"], ["status", "{toml}", "--out", ""],
                                  ["summary", "{toml}", "--out", ""], ["publish", "{toml}", "--out", "", "--to", "d"],
                                  ["publish", "{toml}", "--to", ""], ["analyze", "{toml}", "--out", ""]])
def test_bug_an_empty_out_or_to_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch, argv):
    """Bug: ``--out ""`` (``--out "$RESULTS"`` with ``RESULTS`` unset) trained into ``./tiny`` of the current folder,
    and ``status``/``summary`` read from there, with exit 0; ``publish --to ""`` wrote the page into the current
    folder. ``Path("")`` is ``.``: the empty path is refused now, naming the option."""
    toml = _toml(tmp_path / "cfg")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    flag = "--to" if argv[-2:] == ["--to", ""] else "--out"
    err = _error(capsys, main([a.format(toml=toml) for a in argv]))
    assert err == f"error: {flag}: expected a folder, got an empty path\n"
    assert list(work.iterdir()) == []


def _show(message, category, filename, lineno, file=None, line=None):
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def test_bug_a_library_warning_is_one_line_without_the_library_source(tmp_path, capsys, monkeypatch):
    """Bug: a warning of the library reached the user as Python prints it, e.g. ``.../diffusionformer/experiments/
    cli.py:245: RuntimeWarning: docs/index.md not found: ...`` followed by the source line
    ``page = publish_experiment(config, args.out, args.to, config_path=args.config)``; it is one
    ``warning: <message>`` line now, and the caller's warning formatter is left as it was."""
    def warn_then_fail(path, overrides=None):
        warnings.warn("docs/index.md not found: add tiny.md to a toctree", RuntimeWarning, stacklevel=2)
        raise ValueError("stop here")

    monkeypatch.setattr(config_mod, "load_experiment_config", warn_then_fail)
    before = warnings.formatwarning
    with warnings.catch_warnings():  # pytest records warnings; show them on stderr, as a fresh interpreter does
        warnings.simplefilter("always")
        warnings.showwarning = _show  # what Python's own showwarning does, under pytest's recorder
        code = main(["status", _toml(tmp_path)])
    assert code == 2 and warnings.formatwarning is before
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("warning: docs/index.md not found: add tiny.md to a toctree\n"
                            "error: stop here\n")


def test_a_recorded_warning_still_reaches_the_recorder(tmp_path, monkeypatch):
    """``pytest.warns`` (a ``catch_warnings(record=True)``) around ``main`` still sees the library's warnings."""
    def warn_then_fail(path, overrides=None):
        warnings.warn("recorded", RuntimeWarning, stacklevel=2)
        raise ValueError("stop here")

    monkeypatch.setattr(config_mod, "load_experiment_config", warn_then_fail)
    with pytest.warns(RuntimeWarning, match="recorded"):
        assert main(["status", _toml(tmp_path)]) == 2
