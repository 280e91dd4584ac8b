"""Edge-case probes of the experiments command line, fifth round (``main(argv)`` in process).

Probed (by hand in fresh interpreters, then pinned here where not pinned before): ``--out`` / ``--to`` / the
config / ``--data-root`` naming a file, a missing folder, a name too long for the file system, a path with spaces
and non-ASCII letters, a config whose name starts with ``-``; ``--set`` with ``inf`` / ``nan`` / ints beyond 64
bits / negative seeds / empty strings / quoted keys holding dots / inline tables / arrays of tables; options given
twice (``--out``: the last wins, ``--tasks``: extended, duplicates harmless); ``status`` / ``analyze`` /
``summary`` on a comparison whose results folder is absent; exit codes and stdout against stderr.

Found and fixed (tests named ``test_bug_...``):

- ``cli._main``: a path too long for the file system (``--out``, ``--to``, the config; ``[Errno 36] File name
  too long``, a plain ``OSError``) ended in a traceback with exit code 1, while the ``OSError`` subclasses
  (``FileNotFoundError``, ``PermissionError``, ...) were one ``error:`` line with exit code 2. Every ``OSError``
  is now one line and exit 2, except a ``BrokenPipeError``, which ``main`` still turns into the quiet exit 141.
- ``cli._main``: ``show --data-root PATH`` with ``PATH`` a file, a missing or an empty folder exited 0, though
  the tutorial says "pass ``--data-root`` to check the data too" (and ``run`` with the same flag refuses it): a
  misspelt data root was taken for data not yet downloaded. A given ``--data-root`` is now checked; without one,
  ``show`` still resolves missing data from the preset's sizes.

Found, not changed: ``run -- -c.toml`` prints the hint ``status -c.toml``, which argparse reads as an option;
a config named like an option is too rare to justify a ``--`` in every hint.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from experiments_tiny_configs import TINY_DIGITS_TOML
from diffusionformer.experiments.cli import main

MNIST_TOML = TINY_DIGITS_TOML.replace('dataset = "digits"', 'dataset = "mnist"').replace("vit-digits", "vit-mnist")


def _toml(folder: Path, text: str = TINY_DIGITS_TOML, name: str = "tiny.toml") -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text, encoding="utf-8")
    return str(folder / name)


def _error(capsys, code):
    """The ``error:`` message of a user error: exit 2, no traceback, nothing on stdout."""
    assert code == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == ""
    assert captured.err.startswith("error: ")
    return captured.err


@pytest.mark.parametrize("where", ["status --out", "summary --out", "publish --to", "show config"])
def test_bug_a_path_too_long_for_the_file_system_is_one_error_line(tmp_path, capsys, where):
    """Bug: a path whose name is too long for the file system (``--out``, ``--to`` or the config) ended in an
    ``OSError: [Errno 36] File name too long`` traceback with exit code 1; ``FileNotFoundError`` and the other
    ``OSError`` subclasses were already one ``error:`` line with exit code 2."""
    toml = _toml(tmp_path)
    long = str(tmp_path / ("a" * 300))
    argv = {"status --out": ["status", toml, "--out", long], "summary --out": ["summary", toml, "--out", long],
            "publish --to": ["publish", toml, "--to", long], "show config": ["show", long + ".toml"]}[where]
    err = _error(capsys, main(argv))
    assert "too long" in err and err.count("\n") == 1


def test_bug_an_os_error_in_a_run_is_one_line_but_a_broken_pipe_is_not(tmp_path, capsys, monkeypatch):
    """Bug: an ``OSError`` that is none of the caught subclasses (read-only file system, no space left) ended in
    a traceback with exit 1. Pins: a ``BrokenPipeError`` of stdout still reaches ``main``'s quiet exit 141."""
    import diffusionformer.experiments.results as results

    toml = _toml(tmp_path)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "res"))

    monkeypatch.setattr(results, "run_status", read_only)
    err = _error(capsys, main(["status", toml, "--out", str(tmp_path / "res")]))
    assert err == f"error: [Errno 30] Read-only file system: {str(tmp_path / 'res')!r}\n"

    def gone(*args, **kwargs):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr(results, "run_status", gone)
    monkeypatch.setattr("diffusionformer.experiments.cli._stdout_gone", lambda: True)
    assert main(["status", toml, "--out", str(tmp_path / "res")]) == 141
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("root", ["a file", "a missing folder", "an empty folder"])
def test_bug_show_checks_a_data_root_it_is_given(tmp_path, capsys, monkeypatch, root):
    """Bug: ``show c.toml --data-root PATH`` with ``PATH`` a file, a missing folder or a folder without the
    dataset's files exited 0 ("pass --data-root to check the data too", says the tutorial), while ``run`` with
    the same ``--data-root`` refused it: a misspelt data root was taken for data not yet downloaded."""
    monkeypatch.delenv("DIFFUSIONFORMER_DATA", raising=False)
    toml = _toml(tmp_path, MNIST_TOML)
    path = tmp_path / "data"
    if root == "a file":
        path.write_text("x", encoding="utf-8")
    elif root == "an empty folder":
        path.mkdir()
    err = _error(capsys, main(["show", toml, "--data-root", str(path)]))
    assert "1 problem(s)" in err and "mnist" in err and str(path) in err
    # without --data-root, missing data is still not a problem of show (resolved from the preset's sizes)
    assert main(["show", toml]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("tiny: 1 tasks x 2 operator settings x 1 seeds = 2 runs\n")


def test_paths_with_spaces_and_non_ascii_letters_run_and_are_quoted_in_the_hint(tmp_path, capsys):
    """Pins: a config and a results root with spaces and non-ASCII letters: ``run`` writes there, its status hint
    quotes both (a shell can paste it), and ``status`` reads them back; the table is on stdout."""
    folder = tmp_path / "my ü dir"
    toml = _toml(folder, name="tï ny.toml")
    out = str(folder / "rés ults")
    assert main(["run", toml, "--out", out, "--no-progress", "--threads", "1", "--set", "operators=attention"]) == 0
    captured = capsys.readouterr()
    assert f"status '{toml}' --set operators=attention --out '{out}'\n" in captured.err
    assert "| attention |" in captured.out and "Traceback" not in captured.err
    assert (Path(out) / "tiny" / "results.json").is_file()
    assert main(["status", toml, "--out", out, "--set", "operators=attention"]) == 0
    assert capsys.readouterr().out.startswith("1 of 1 runs completed")


@pytest.mark.parametrize("override, match", [
    ("seeds=[inf]", "seeds[0]: expected an int, got float inf"),
    ("seeds=[nan]", "seeds[0]: expected an int, got float nan"),
    ("seeds=[99999999999999999999999]", "expected an int <= 4294967295, got 99999999999999999999999"),
    ("seeds=[-1]", "expected an int >= 0, got -1"),
    ('name=""', "experiment name must be a non-empty string"),
    ('"a.b"=1', "unknown key 'a.b'"),
    ("tasks.digits.train.lr=nan", "TrainConfig.lr: expected a finite float, got nan"),
    ("operators.lap.laplacian_heads=inf", "laplacian_heads: expected int | str | list | None, got float inf"),
    ('tasks.digits.model_overrides={dim=8, "x.y"=1}', "unknown key 'x.y'"),
    ('device=""', "device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got ''"),
])
def test_set_values_at_the_edges_of_toml_are_one_error(tmp_path, capsys, override, match):
    """Pins: ``--set`` values that TOML parses but the config refuses (non-finite floats, ints beyond any
    range, empty strings, quoted keys holding dots) are ``error:`` lines with exit 2, nothing on stdout."""
    toml = _toml(tmp_path)
    assert match in _error(capsys, main(["show", toml, "--set", override]))


def test_options_given_twice_take_the_last_or_add_up(tmp_path, capsys):
    """Pins: ``--out`` given twice takes the last; ``--tasks`` given twice (the same name) trains it once."""
    toml = _toml(tmp_path)
    first, last = tmp_path / "first", tmp_path / "last"
    assert main(["run", toml, "--out", str(first), "--out", str(last), "--no-progress", "--threads", "1",
                 "--tasks", "digits", "--tasks", "digits"]) == 0
    capsys.readouterr()
    assert not first.exists() and (last / "tiny" / "results.json").is_file()
    assert main(["status", toml, "--out", str(last)]) == 0
    assert capsys.readouterr().out.startswith("2 of 2 runs completed")
