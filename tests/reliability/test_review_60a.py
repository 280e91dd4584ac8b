"""Review 60a of 514df20, 815c980, cd60044 and 2aaa48f, as a reviewer who assumes each has a bug.

- 514df20 (``reload._recorded_imports``, shared by ``load_run``, ``run`` and ``analyze``): the ``--import`` modules a
  manifest records were read as every ``--import m`` first, then every ``--import=m``, so a command made with
  ``--import=first.py --import second.py`` was named with its modules in the other order (the hint asks to give
  "the same --import", and a module may look up what an earlier one registered); and ``run``/``analyze`` given a
  recorded module in another spelling (``./ops.py`` or the dotted ``ops`` for ``ops.py``) still named it among the
  modules to give.
- 815c980, cd60044, 2aaa48f: no bug fixed here (each rewritten lock/runner test fails with the behaviour it pins
  broken; the shared helper's stray comment put back above ``TINY_GAPS_TOML``).
"""

from __future__ import annotations

import json
import sys

import pytest
from experiments_tiny_configs import TINY_DIGITS_TOML

from diffusionformer.experiments.cli import main
from diffusionformer.experiments.reload import _recorded_imports


# ---------------------------------------------------------------------------- 514df20: the recorded --import modules
def test_bug_recorded_imports_keep_the_order_of_the_command_in_both_spellings(tmp_path):
    """Bug: ``['second.py', 'third', 'first.py']`` (the ``--import m`` words first, the ``--import=m`` ones after)."""
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"command": "python -m diffusionformer.experiments run c.toml --import=first.py "
                                               "--import second.py --set seeds=[0] --import third --import"}))
    assert _recorded_imports(manifest) == ["first.py", "second.py", "third"]


def test_bug_run_without_the_imports_names_them_in_the_recorded_order(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out" / "tiny").mkdir(parents=True)
    (tmp_path / "out" / "tiny" / "manifest.json").write_text(json.dumps(
        {"command": "python -m diffusionformer.experiments run c.toml --import=base60a.py --import ext60a.py"}))
    (tmp_path / "c.toml").write_text(TINY_DIGITS_TOML.replace('model = "vit-digits"', 'model = "vit-60a"'))
    assert main(["run", "c.toml", "--out", "out", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'vit-60a'" in err
    assert "(the comparison out/tiny was made with --import base60a.py --import ext60a.py (" in err


@pytest.mark.parametrize("spelling", ["./ops60a.py", "ops60a"])
def test_bug_a_recorded_import_given_in_another_spelling_is_not_named(tmp_path, monkeypatch, capsys, spelling):
    """Bug: "made with --import ops60a.py --import regs60a.py ...: give this command the same --import", where this
    command imported ops60a.py already (as ``./ops60a.py``, or as the dotted ``ops60a`` found in the current folder)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out" / "tiny").mkdir(parents=True)
    (tmp_path / "out" / "tiny" / "manifest.json").write_text(json.dumps(
        {"command": "python -m diffusionformer.experiments run c.toml --import ops60a.py --import regs60a.py"}))
    (tmp_path / "ops60a.py").write_text("")
    (tmp_path / "c.toml").write_text(TINY_DIGITS_TOML.replace('model = "vit-digits"', 'model = "vit-60a"'))
    try:
        assert main(["run", "c.toml", "--out", "out", "--import", spelling, "--no-progress"]) == 2
    finally:
        sys.modules.pop("ops60a", None)
    err = capsys.readouterr().err
    assert "unknown model 'vit-60a'" in err
    assert "(the comparison out/tiny was made with --import regs60a.py (out/tiny/manifest.json): " in err
