"""Review of b6f3cd5 and 659fdba (``main(argv)`` recorded as the manifest's command through a ContextVar, the command
quoted with ``shlex.join``, load_run's ``--import`` hint keeping the error's type): each ``test_bug_`` test failed
before its fix."""

from __future__ import annotations

import json
import sys


def _run_dir(tmp_path, command: str):
    """A run folder in the runner's layout below a manifest recording ``command``."""
    rdir = tmp_path / "runs" / "t" / "op" / "seed0"
    rdir.mkdir(parents=True)
    (tmp_path / "manifest.json").write_text(json.dumps({"command": command}))
    return rdir


def test_bug_main_without_argv_inside_main_with_argv_records_its_own_command_line(monkeypatch):
    """Bug: ``main()`` (no argv: it runs ``sys.argv``) called while an outer ``main(argv)`` ran (a user's --import
    module, a notebook cell) recorded the outer call's argv as its manifest's command: a command it did not run."""
    from diffusionformer.experiments import cli, outputs

    seen = []

    def fake(argv):
        if argv is not None:
            return cli.main(None)
        seen.append(outputs._command())
        return 0

    monkeypatch.setattr(sys, "argv", ["/bin/diffusionformer-experiments", "run", "inner.toml"])
    monkeypatch.setattr(cli, "_main_with_warnings", fake)
    assert cli.main(["run", "outer.toml"]) == 0
    assert seen == ["diffusionformer-experiments run inner.toml"]
    assert outputs._MAIN_ARGV.get() is None


def test_bug_an_old_unquoted_manifest_with_an_apostrophe_still_names_its_import(tmp_path):
    """Bug: manifests written before the command was quoted joined its words with spaces; one with an apostrophe in a
    word (``--out "Bob's runs"``) did not split as a shell's words, so load_run's hint named no ``--import`` at all."""
    from diffusionformer.experiments.reload import _recorded_imports_hint

    rdir = _run_dir(tmp_path, "__main__.py run c.toml --out Bob's runs --import ops.py --import=more")
    assert _recorded_imports_hint(rdir).startswith("; the run was made with --import ops.py --import more (")


class _NamedError(ValueError):
    """A user's error whose message is its own ``__str__`` (as ``UnicodeDecodeError``'s), not its ``args``."""

    def __init__(self, name: str) -> None:
        super().__init__(name, "unknown")
        self.name = name

    def __str__(self) -> str:
        return f"{self.args[1]} operator {self.name!r}"


def test_bug_the_recorded_import_hint_reaches_an_error_with_its_own_str(tmp_path):
    """Bug: the hint was written into the error's ``args``, which an error with a ``__str__`` of its own (a user
    operator's, ``UnicodeError``'s) does not show: its message lost the hint, or failed to print at all (a ``__str__``
    reading ``args[1]``: IndexError). Such an error is now a ValueError with the hint, from the original."""
    import pytest

    from diffusionformer.experiments.reload import _naming_recorded_imports

    rdir = _run_dir(tmp_path, "__main__.py run c.toml --import ops.py")
    original = _NamedError("mine")
    with pytest.raises(ValueError) as info, _naming_recorded_imports(rdir):
        raise original
    assert str(info.value).startswith("unknown operator 'mine'; the run was made with --import ops.py (")
    assert info.value.__cause__ is original and str(original) == "unknown operator 'mine'"
