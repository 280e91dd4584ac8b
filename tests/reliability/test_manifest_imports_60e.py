"""The ``--import`` modules a comparison's ``manifest.json`` records, which ``run``, ``analyze`` and ``load_run`` name
when an operator, model or dataset is unknown.

- A later ``run`` that trains without ``--import`` (it needs none: ``--set operators=attention``) rewrote the
  manifest's ``command``, and with it the only record of the import: ``run`` and ``load_run`` on the comparison
  then gave a bare "unknown operator". The manifest now keeps ``imports``, every module of every invocation, in the
  order first seen (an older manifest without it is read from its ``command``).
- Started as ``python -m diffusionformer.experiments``, the command was recorded as ``__main__.py run ...``, which no
  shell runs; it is now recorded as ``python -m diffusionformer.experiments run ...``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from experiments_tiny_configs import TINY_DIGITS_TOML, learned_quad_source, tiny_digits_config

import diffusionformer.experiments
from diffusionformer import load_run
from diffusionformer.experiments import outputs
from diffusionformer.experiments.cli import main
from diffusionformer.experiments.outputs import merged_manifest
from diffusionformer.experiments.reload import _recorded_imports
from diffusionformer.operators import list_operators, unregister_operator

MODULE = "quadops60e"

REGISTRATIONS = learned_quad_source("learned-quad-60e")

# the tiny digits comparison with a setting of the module's operator
QUAD_TOML = TINY_DIGITS_TOML.replace('name = "lap"\nlaplacian_heads = 1',
                                     'name = "quad"\nheads = "attention:1,learned-quad-60e:1"')


def _forget_module() -> None:
    sys.modules.pop(MODULE, None)
    if "learned-quad-60e" in list_operators():
        unregister_operator("learned-quad-60e")


@pytest.fixture(scope="module")
def rerun(tmp_path_factory):
    """The comparison trained with ``--import quadops60e.py``, then its attention setting trained for another seed
    without it (it needs none); the registrations dropped afterwards, as in a new process."""
    folder = tmp_path_factory.mktemp("import60e")
    (folder / f"{MODULE}.py").write_text(REGISTRATIONS)
    (folder / "quad.toml").write_text(QUAD_TOML)
    mp = pytest.MonkeyPatch()
    mp.chdir(folder)
    try:
        assert main(["run", "quad.toml", "--out", "out", "--import", f"{MODULE}.py", "--no-progress"]) == 0
        _forget_module()
        assert main(["run", "quad.toml", "--out", "out", "--set", "operators=attention", "--set", "seeds=[1]",
                     "--no-progress"]) == 0
    finally:
        _forget_module()
        mp.undo()
    yield folder
    _forget_module()


def test_bug_a_later_run_without_the_import_keeps_it_in_the_manifest(rerun):
    """Bug: the second invocation's command replaced the first's, and no field kept ``--import quadops60e.py``."""
    manifest = json.loads((rerun / "out" / "tiny" / "manifest.json").read_text())
    assert "--import" not in manifest["command"]  # the latest invocation's command, as before
    assert manifest["imports"] == [f"{MODULE}.py"]
    assert _recorded_imports(rerun / "out" / "tiny" / "manifest.json") == [f"{MODULE}.py"]


def test_bug_run_after_the_run_without_the_import_still_names_it(rerun, monkeypatch, capsys):
    """Bug: a bare "unknown operator 'learned-quad-60e'"."""
    monkeypatch.chdir(rerun)
    capsys.readouterr()
    assert main(["run", "quad.toml", "--out", "out", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "unknown operator 'learned-quad-60e'" in err
    assert (f"(the comparison out/tiny was made with --import {MODULE}.py (out/tiny/manifest.json): give this "
            "command the same --import)") in err


def test_bug_load_run_after_the_run_without_the_import_still_names_it(rerun):
    rdir = rerun / "out" / "tiny" / "runs" / "digits" / "quad" / "seed0"
    with pytest.raises(ValueError, match="unknown operator 'learned-quad-60e'") as info:
        load_run(rdir)
    assert f"; the run was made with --import {MODULE}.py (" in str(info.value)


def test_the_imports_of_every_invocation_are_kept_in_the_order_first_seen():
    first = {"command": "python -m diffusionformer.experiments run c.toml --import=a.py --import b",
             "imports": ["a.py", "b"]}
    second = {"command": "diffusionformer run c.toml --import c.py --import a.py", "imports": ["c.py", "a.py"]}
    assert merged_manifest(first, second)["imports"] == ["a.py", "b", "c.py"]
    assert merged_manifest(None, second)["imports"] == ["c.py", "a.py"]
    assert merged_manifest(merged_manifest(first, {"command": "diffusionformer run c.toml", "imports": []}),
                           second)["imports"] == ["a.py", "b", "c.py"]


@pytest.mark.parametrize("command", [
    "__main__.py run c.toml --import old.py --import=older",  # an older manifest's command without `imports`
    "python -m diffusionformer.experiments run c.toml --import old.py --import=older",
    "diffusionformer run c.toml --import old.py --import=older",  # the console script's
])
def test_a_manifest_without_imports_is_read_from_its_command(tmp_path, command):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"command": command, "git_commit": "abc"}))
    assert _recorded_imports(manifest) == ["old.py", "older"]
    merged = merged_manifest(json.loads(manifest.read_text()), {"command": "diffusionformer run c.toml --import n.py",
                                                                "imports": ["n.py"]})
    assert merged["imports"] == ["old.py", "older", "n.py"]


def test_a_damaged_imports_field_falls_back_to_the_command(tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"command": "diffusionformer run c.toml --import ops.py", "imports": "ops.py"}))
    assert _recorded_imports(manifest) == ["ops.py"]
    manifest.write_text(json.dumps({"command": "diffusionformer run c.toml", "imports": ["ops.py", 3, None]}))
    assert _recorded_imports(manifest) == ["ops.py"]


# ------------------------------------------------------------------------ the command of `python -m ...experiments`
def _package_main() -> str:
    return str(Path(diffusionformer.experiments.__file__).parent / "__main__.py")


def test_bug_python_m_records_a_command_a_shell_runs(monkeypatch):
    """Bug: ``__main__.py run c.toml ...`` (the file name of ``sys.argv[0]``, which ``python -m`` sets to the path of
    the package's ``__main__.py``)."""
    monkeypatch.setattr(sys, "argv", [_package_main(), "run", "c.toml", "--out", "Bob's runs", "--import", "ops.py"])
    command = outputs._command()
    assert command == "python -m diffusionformer.experiments run c.toml --out 'Bob'\"'\"'s runs' --import ops.py"
    monkeypatch.setattr(outputs, "git_commit", lambda path=None: "abc")
    assert outputs.manifest(tiny_digits_config())["imports"] == ["ops.py"]


@pytest.mark.parametrize("script", ["/venv/bin/diffusionformer", "/elsewhere/__main__.py"])
def test_another_script_keeps_its_file_name(monkeypatch, script):
    """The console script (``diffusionformer``) and a script of the same file name elsewhere are recorded as before."""
    monkeypatch.setattr(sys, "argv", [script, "run", "c.toml", "--import=ops.py"])
    assert outputs._command() == f"{Path(script).name} run c.toml --import=ops.py"
