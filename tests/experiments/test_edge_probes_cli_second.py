"""Edge-case probes of the experiments command line, second round (``main(argv)`` of
``python -m diffusionformer.experiments``, in process).

Probed: ``--set`` values (``1e-3``, ``1_000``, ``0x10``, ``nan``, ``inf``, ``true``/``True``, quoted strings,
``=`` inside the value, a key set twice, unknown and misspelt keys, a newline in the value); misspelt commands,
options and choices (also in another case, and under the choice format of Python >= 3.12.8); an option given
before its command; ``--out`` naming a file, lying below a file, or holding a file in the comparison's place;
stdout a pipe whose reader has gone (``status c.toml | head``), buffered and unbuffered.

Found and fixed (tests named ``test_bug_...``):

- ``cli._Parser.error``: the did-you-mean of a misspelt command or choice read the choices from argparse's message
  as quoted words; Python 3.12.8 and 3.13.1 on print them bare (``choose from run, show``), so no hint was given.
- the CLI's did-you-mean (now ``config._closest_choice``, shared with ``_choice_hint``): ``--precision BF16`` got no hint (difflib is case-sensitive), unlike the package's other hints.
- ``cli._Parser.parse_args``: ``--no-progress run c.toml`` said ``did you mean '--no-progress'?`` of the option as
  typed; it now says the option belongs after the command.
- ``cli.main``: a closed stdout pipe (``status c.toml | head -3``) ended in a ``BrokenPipeError`` traceback with
  exit code 1 (or 120 from the flush at exit); it is now quiet with exit code 141 (128 + SIGPIPE).
- ``cli.main``: ``status --out <a file>/res`` and ``status`` with a file in place of ``<out>/<name>`` read every run
  as missing and exited 0; now one error (exit 2) for every command, as for ``--out <a file>``.
- ``config.parse_override``: ``--set 'seeds=[1]<newline>name="x"'`` kept ``seeds`` and dropped ``name`` silently.
"""

from __future__ import annotations

import argparse
import io
import os
import sys

import pytest

from experiments_tiny_configs import TINY_DIGITS_TOML
from diffusionformer.experiments import parse_override
from diffusionformer.experiments.cli import main

TOML = TINY_DIGITS_TOML


@pytest.fixture
def toml(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TOML, encoding="utf-8")
    return str(path)


def _usage_error(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.rstrip()


# ----------------------------------------------------------------------------- --set values
@pytest.mark.parametrize("override,shown", [
    ("tasks.digits.train.lr=1e-3", "lr = 0.001"),
    ("tasks.digits.train.max_steps=1_000", "max_steps = 1000"),
    ("tasks.digits.train.lr=0x10", "lr = 16"),  # TOML's hex int
    ("tasks.digits.metric='test_acc'", "metric test_acc"),
    ("tasks.digits.train.amp=bf16", "amp = \"bf16\""),  # a bare word is a string
])
def test_set_values_in_toml_syntax_are_applied(toml, capsys, override, shown):
    """Pins: ``--set`` values are TOML (underscores, exponents, hex, quoted strings; a bare word is a string)."""
    assert main(["show", toml, "--set", override]) == 0
    assert shown in capsys.readouterr().out


@pytest.mark.parametrize("override,message", [
    ("tasks.digits.train.lr=nan", "TrainConfig.lr: expected a finite float, got nan"),
    ("tasks.digits.train.lr=-inf", "TrainConfig.lr: expected a finite float, got -inf"),
    ("tasks.digits.train.max_steps=1e3", "TrainConfig.max_steps: expected int, got float (1000.0)"),
    ("tasks.digits.train.max_steps=true", "TrainConfig.max_steps: expected int, got bool (True)"),
    ("tasks.digits.train.amp=True", "expected one of ('auto', 'bf16', 'fp16', 'off'), got 'True'"),
    ("tasks.digits.train.max_stpes=3", "unknown TrainConfig key 'max_stpes' (did you mean 'max_steps'?)"),
    ("seds=[1]", "unknown key 'seds'"),
    ("seeds=[1", "the value '[1' is not valid TOML"),
    ("tasks.digitz.train.lr=1", "no entry named 'digitz' in tasks; available: ['digits'] (did you mean 'digits'?)"),
    ("name.x=3", "name is not a table, got 'tiny'"),
])
def test_bad_set_values_are_one_error_line(toml, capsys, override, message):
    """Pins: non-finite, mistyped, unknown and misspelt ``--set`` keys and values: exit 2, one named error."""
    assert main(["show", toml, "--set", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_a_key_set_twice_takes_the_last_and_equals_signs_stay_in_the_value(toml, capsys):
    """Pins: of two ``--set`` of one key the last wins; ``=`` after the first belongs to the value."""
    assert main(["show", toml, "--set", "seeds=[0]", "--set", "seeds=[1, 2]", "--set=name=a=b"]) == 0
    assert capsys.readouterr().out.startswith("a=b: 1 tasks x 2 operator settings x 2 seeds = 4 runs")


def test_bug_a_set_value_followed_by_another_key_is_refused(toml, capsys):
    """Bug: ``--set 'seeds=[1]<newline>name="x"'`` (two lines pasted into one --set) set ``seeds`` and dropped
    ``name = "x"`` without a word, the TOML document's second key being read and thrown away."""
    assert main(["show", toml, "--set", 'seeds=[1, 2]\nname="other"']) == 2
    err = capsys.readouterr().err
    assert "the value is followed by other TOML keys ('name'); give each key a --set of its own" in err
    assert parse_override("seeds=[1]  # a comment") == (["seeds"], [1])  # one key: as before


# ----------------------------------------------------------------------------- the parser
def _check_value_3_12_8(self, action, value):
    """argparse's ``_check_value`` as in Python 3.12.8 / 3.13.1 and later: the choices printed bare."""
    if action.choices is not None and value not in action.choices:
        raise argparse.ArgumentError(action, f"invalid choice: {value!r} (choose from "
                                             f"{', '.join(map(str, action.choices))})")


@pytest.mark.parametrize("argv,hint", [(["rn", "c.toml"], "did you mean 'run'?"),
                                       (["run", "c.toml", "--precision", "bf61"], "did you mean 'bf16'?")])
def test_bug_did_you_mean_survives_the_newer_choice_format(monkeypatch, capsys, argv, hint):
    """Bug: the hint read the choices from argparse's message as quoted words ('run', 'show'); from Python 3.12.8
    and 3.13.1 on the message prints them bare (``choose from run, show``), and ``rn`` got no hint."""
    monkeypatch.setattr(argparse.ArgumentParser, "_check_value", _check_value_3_12_8)
    err = _usage_error(capsys, argv)
    assert "invalid choice" in err and "(choose from " in err and "'run', " not in err and err.endswith(hint)


def test_bug_a_choice_in_another_case_gets_did_you_mean(capsys):
    """Bug: ``--precision BF16`` listed the choices with no hint (difflib is case-sensitive: 'BF16' and 'bf16'
    are only 50% alike), while the package's other hints match case-blind first."""
    err = _usage_error(capsys, ["run", "c.toml", "--precision", "BF16"])
    assert err.endswith("did you mean 'bf16'?")


def test_bug_an_option_given_before_its_command_is_said_so(capsys):
    """Bug: ``--no-progress run c.toml`` said ``unrecognized arguments: --no-progress (did you mean
    '--no-progress'?)``, suggesting what was typed; it now says the option goes after the command."""
    err = _usage_error(capsys, ["--no-progress", "run", "c.toml"])
    assert "did you mean" not in err
    assert err.endswith("unrecognized arguments: --no-progress (--no-progress: option(s) of 'run', to be given after it)")
    err = _usage_error(capsys, ["--out=r", "run", "c.toml", "--devise", "cpu"])
    assert err.endswith("(did you mean '--device' for '--devise'?) (--out: option(s) of 'run', to be given after it)")
    err = _usage_error(capsys, ["run", "c.toml", "--", "--device", "cpu"])  # after the command: a stray word only
    assert err.endswith("unrecognized arguments: --device cpu")


# ----------------------------------------------------------------------------- paths
def test_bug_out_below_a_file_or_a_file_in_the_comparisons_place_is_an_error(toml, tmp_path, capsys):
    """Bug: ``status --out notes.txt/res`` and ``status`` with a file at ``<out>/tiny`` read every run as missing
    and exited 0 (``run`` failed only on its first write); now one error, exit 2, for every command."""
    (tmp_path / "notes.txt").write_text("mine")
    below = tmp_path / "notes.txt" / "res"
    for argv in (["status", toml], ["run", toml, "--no-progress"], ["publish", toml, "--to", str(tmp_path / "d")]):
        assert main([*argv, "--out", str(below)]) == 2
        err = capsys.readouterr().err
        assert err == (f"error: --out {str(below)!r}: {str(tmp_path / 'notes.txt')!r} is a file, where the results "
                       f"folder should be a folder\n")
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "tiny").write_text("mine")
    assert main(["status", toml, "--out", str(tmp_path / "res")]) == 2
    assert capsys.readouterr().err == (f"error: --out {str(tmp_path / 'res')!r}: {str(tmp_path / 'res' / 'tiny')!r} "
                                       "is a file, where the results of 'tiny' should be a folder\n")
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "res" / "tiny").read_text() == "mine"
    assert main(["status", toml, "--out", str(tmp_path / "not yet")]) == 0  # absent: every run missing, as before


# ----------------------------------------------------------------------------- stdout a pipe
@pytest.mark.parametrize("buffered", [True, False])
def test_bug_a_closed_stdout_pipe_is_a_quiet_exit_141(monkeypatch, capsys, buffered):
    """Bug: ``list | head -1`` or ``status c.toml | head -3`` (the reader gone before the output is written) ended
    in a ``BrokenPipeError`` traceback with exit code 1 (120 when Python's flush at exit met it); now no message
    and exit code 141 (128 + SIGPIPE, as a shell reports a killed writer). Buffered stdout meets the broken pipe at
    the flush, unbuffered ($PYTHONUNBUFFERED) at the first print."""
    r, w = os.pipe()
    os.close(r)  # the reader is gone
    raw = open(w, "wb", buffering=0)
    stream = io.TextIOWrapper(io.BufferedWriter(raw) if buffered else raw, write_through=not buffered)
    monkeypatch.setattr(sys, "stdout", stream)
    try:
        assert main(["list"]) == 141
        stream.write("more")  # stdout's descriptor now leads to os.devnull: later writes are lost, not raised
        stream.flush()
    finally:
        monkeypatch.undo()
        stream.close()
    assert capsys.readouterr().err == ""


def test_a_broken_pipe_that_is_not_stdouts_still_raises(monkeypatch):
    """Pins: a ``BrokenPipeError`` with stdout's reader still there (another pipe broke) is not hidden as 141."""
    import diffusionformer.data

    def broken():
        raise BrokenPipeError(32, "Broken pipe")

    r, w = os.pipe()
    raw = open(w, "wb", buffering=0)
    stream = io.TextIOWrapper(raw, write_through=True)
    monkeypatch.setattr(sys, "stdout", stream)
    monkeypatch.setattr(diffusionformer.data, "list_datasets", broken)
    try:
        with pytest.raises(BrokenPipeError):
            main(["list"])
    finally:
        monkeypatch.undo()
        stream.close()
        os.close(r)
