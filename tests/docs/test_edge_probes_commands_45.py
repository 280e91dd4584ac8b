"""Probes of the shell commands and plain Python blocks the docs tell a user to run.

The ``$ python -m diffusionformer.experiments ...`` lines of the tutorials' console blocks, the README's
bash block and the ``gpu_study.sh run`` lines are parsed by the CLI's own parser (and the ``show`` ones
run, since ``show`` trains nothing), so a renamed option or operator setting fails here rather than in a
user's shell. The README's ``load_run`` block and the SSL tutorial's ``build_task`` block run in
tests/docs/test_docs_snippets_run.py.
"""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_MODULE = "diffusionformer.experiments"


def _console_commands(relpath: str) -> list[str]:
    """The ``$ ...`` lines of the console blocks of ``relpath``, continuation lines joined, comments cut."""
    lines = (ROOT / relpath).read_text(encoding="utf-8").splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        if s.startswith("$ "):
            cmd = s[2:]
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1].rstrip() + " " + lines[i].strip()
            out.append(cmd)
        i += 1
    return out


def _readme_bash_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    cmds: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            for part in line.split("&&"):
                cmds.append(part.strip())
    return cmds


def _split(cmd: str) -> list[str]:
    return shlex.split(cmd, comments=True)


def _cli_argvs() -> list[tuple[str, list[str]]]:
    """(where, argv of the experiments CLI) for every documented command that runs it."""
    found: list[tuple[str, list[str]]] = []
    pages = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "tutorials").glob("*.rst"))
    cmds = [(p, c) for p in pages for c in _console_commands(p)] + [("README.md", c) for c in _readme_bash_commands()]
    for where, cmd in cmds:
        argv = _split(cmd)
        if argv[:3] == ["python", "-m", _MODULE]:
            found.append((where, argv[3:]))
        elif argv[:1] == ["torchrun"] and _MODULE in argv:
            found.append((where, argv[argv.index(_MODULE) + 1:]))
        elif argv[:2] == ["bash", "experiments/scripts/gpu_study.sh"] and argv[2:3] == ["run"]:
            # gpu_study.sh run CONFIG WORKERS [run options]
            found.append((where, ["run", argv[3]] + argv[5:]))
    return found


def test_pins_docs_experiment_commands_parse():
    """Every documented ``python -m diffusionformer.experiments`` command (and torchrun / gpu_study.sh's run
    options) parses with the CLI's parser: subcommand and options exist, values are accepted."""
    from diffusionformer.experiments.cli import _parser

    argvs = _cli_argvs()
    subs = {a[0] for _, a in argvs}
    assert {"list", "show", "run", "analyze", "summary", "status"} <= subs, subs
    for where, argv in argvs:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                _parser().parse_args(argv)
        except SystemExit as e:  # argparse's error
            pytest.fail(f"{where}: {shlex.join(argv)} does not parse ({e.code}): {err.getvalue()}")


def test_pins_docs_show_commands_validate(monkeypatch):
    """The documented ``show`` commands, and ``show`` with the ``--set`` of the documented gpu_study.sh runs
    (operator settings named there must exist in the config), exit 0."""
    from diffusionformer.experiments.cli import main

    monkeypatch.chdir(ROOT)
    argvs = [a for _, a in _cli_argvs() if a[0] == "show"]
    argvs += [["show", a[1]] + [x for x in a[2:]] for _, a in _cli_argvs()
              if a[0] == "run" and "gpu_" in a[1]]
    assert len(argvs) >= 4, argvs
    for argv in argvs:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            rc = main(argv)
        assert rc == 0, (argv, out.getvalue())


def test_bug_status_help_names_failed():
    """Bug: ``--help`` described ``status`` as listing runs "completed, running, interrupted, missing", while it
    (and the README) also reports ``failed`` runs (stopped by a non-finite loss)."""
    from diffusionformer.experiments.cli import _parser

    p = _parser()
    sub = next(a for a in p._actions if a.__class__.__name__ == "_SubParsersAction")
    helps = {c.dest: c.help for c in sub._choices_actions}
    for state in ("completed", "running", "failed", "interrupted", "missing"):
        assert state in helps["status"], helps["status"]
