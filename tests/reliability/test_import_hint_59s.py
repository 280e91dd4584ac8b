"""``run`` (and ``analyze``) on a comparison made with ``--import MODULE``, again without it: the operator, model or
dataset the module registers is unknown, and the error now names the ``--import`` the comparison's
``manifest.json`` recorded (as ``load_run`` did already), only for unknown names and only where this command lacks it.
"""

from __future__ import annotations

import json
import sys

import pytest
from experiments_tiny_configs import TINY_DIGITS_TOML, learned_quad_source

from diffusionformer.data import list_datasets, unregister_dataset
from diffusionformer.experiments.cli import main
from diffusionformer.operators import list_operators, unregister_operator

MODULE = "quadops59s"

REGISTRATIONS = learned_quad_source("learned-quad-59s") + '''
from diffusionformer.data import register_dataset
from diffusionformer.data.images import load_digits


@register_dataset("digits-59s", kind="image")
def load(*, seed: int = 0):
    return load_digits(seed=seed)
'''

# the tiny digits comparison with a setting of the module's operator
QUAD_TOML = TINY_DIGITS_TOML.replace('name = "lap"\nlaplacian_heads = 1',
                                     'name = "quad"\nheads = "attention:1,learned-quad-59s:1"')
# the same on the module's dataset (plain operators)
DATA_TOML = TINY_DIGITS_TOML.replace('name = "tiny"', 'name = "tinydata"').replace(
    'dataset = "digits"', 'dataset = "digits-59s"')


def _forget_module() -> None:
    sys.modules.pop(MODULE, None)
    if "learned-quad-59s" in list_operators():
        unregister_operator("learned-quad-59s")
    if "digits-59s" in list_datasets():
        unregister_dataset("digits-59s")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Both comparisons trained (2 steps) into ``out`` with ``--import quadops59s.py``; the registrations dropped
    afterwards, as in a new process."""
    folder = tmp_path_factory.mktemp("import59s")
    (folder / f"{MODULE}.py").write_text(REGISTRATIONS)
    (folder / "quad.toml").write_text(QUAD_TOML)
    (folder / "data.toml").write_text(DATA_TOML)
    mp = pytest.MonkeyPatch()
    mp.chdir(folder)
    try:
        for config in ("quad.toml", "data.toml"):
            assert main(["run", config, "--out", "out", "--import", f"{MODULE}.py", "--no-progress"]) == 0
    finally:
        _forget_module()
        mp.undo()
    yield folder
    _forget_module()


def test_bug_run_again_without_the_import_names_the_recorded_one(trained, monkeypatch, capsys):
    """Bug: a bare "unknown operator 'learned-quad-59s'", not saying the comparison was made with --import."""
    monkeypatch.chdir(trained)
    capsys.readouterr()
    assert main(["run", "quad.toml", "--out", "out", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "unknown operator 'learned-quad-59s'" in err
    assert (f"(the comparison out/tiny was made with --import {MODULE}.py (out/tiny/manifest.json): give this "
            "command the same --import)") in err
    assert "nothing was trained" in err and "Traceback" not in err


def test_bug_run_again_without_the_import_names_it_for_an_unknown_dataset(trained, monkeypatch, capsys):
    monkeypatch.chdir(trained)
    capsys.readouterr()
    assert main(["run", "data.toml", "--out", "out", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "unknown dataset 'digits-59s'" in err and f"was made with --import {MODULE}.py (" in err


def test_bug_analyze_without_the_import_names_it_for_an_unknown_dataset(trained, monkeypatch, capsys):
    """Bug: analyze loads the task's data before any run (whose load_run names the import): a bare "unknown
    dataset"."""
    monkeypatch.chdir(trained)
    capsys.readouterr()
    assert main(["analyze", "data.toml", "--out", "out", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "unknown dataset 'digits-59s'" in err
    assert (f"; the comparison out/tinydata was made with --import {MODULE}.py (out/tinydata/manifest.json): "
            "give this command the same --import") in err


def test_analyze_of_an_unknown_operator_keeps_load_runs_one_hint(trained, monkeypatch, capsys):
    monkeypatch.chdir(trained)
    capsys.readouterr()
    assert main(["analyze", "quad.toml", "--out", "out", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "unknown operator 'learned-quad-59s'" in err and err.count("--import") == 1
    assert "import what registers its names before load_run" in err


def test_with_the_import_given_run_resumes_without_a_hint(trained, monkeypatch, capsys):
    monkeypatch.chdir(trained)
    try:
        assert main(["run", "quad.toml", "--out", "out", "--import", f"{MODULE}.py", "--no-progress"]) == 0
    finally:
        _forget_module()
    assert "error" not in capsys.readouterr().err


def _config(tmp_path, text):
    (tmp_path / "c.toml").write_text(text)
    return str(tmp_path / "c.toml")


def test_no_folder_yet_no_hint_and_nothing_written(tmp_path, capsys):
    config = _config(tmp_path, QUAD_TOML)
    assert main(["run", config, "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "unknown operator 'learned-quad-59s'" in err and "--import" not in err.partition("error:")[2]
    assert not (tmp_path / "out").exists()


def _manifest(tmp_path, name, content):
    """``out/<name>/manifest.json`` holding ``content`` (as latin-1 bytes: a non-ASCII character is not UTF-8)."""
    folder = tmp_path / "out" / name
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_bytes(content.encode("latin-1"))
    return folder / "manifest.json"


@pytest.mark.parametrize("content", [
    '{"command": "python -m diffusionformer.experiments run c.toml --import mo',  # torn
    json.dumps({"command": ["run", "--import", "mine.py"]}),  # not a string
    json.dumps(["--import", "mine.py"]),  # not an object
    "{\"command\": \"run --import \xff\"}",  # not UTF-8 once written as latin-1
    json.dumps({"command": None}),
], ids=["torn", "list-command", "not-an-object", "not-utf8", "no-command"])
def test_a_damaged_manifest_is_no_crash_and_no_hint(tmp_path, capsys, content):
    _manifest(tmp_path, "tiny", content)
    assert main(["run", _config(tmp_path, QUAD_TOML), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err.partition("error: ")[2]
    assert err.startswith("config 'tiny'") and "unknown operator 'learned-quad-59s'" in err
    assert "--import" not in err and "Traceback" not in err


def test_bug_an_unknown_model_names_the_import_this_command_lacks_not_those_given(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    manifest = _manifest(tmp_path, "tiny", json.dumps(
        {"command": "python -m diffusionformer.experiments run c.toml --import given59s.py --import=regs59s.py"}))
    config = _config(tmp_path, TINY_DIGITS_TOML.replace('model = "vit-digits"', 'model = "vit-59s"'))
    (tmp_path / "given59s.py").write_text("")
    try:
        assert main(["run", config, "--out", "out", "--import", "given59s.py", "--no-progress"]) == 2
    finally:
        sys.modules.pop("given59s", None)
    err = capsys.readouterr().err
    assert "unknown model 'vit-59s'" in err
    assert (f"(the comparison out/tiny was made with --import regs59s.py ({manifest.relative_to(tmp_path)}): "
            "give this command the same --import)") in err


def test_another_problem_gets_no_hint(tmp_path, capsys):
    _manifest(tmp_path, "tiny", json.dumps({"command": "run c.toml --import regs59s.py"}))
    config = _config(tmp_path, TINY_DIGITS_TOML.replace("laplacian_heads = 1", "laplacian_heads = 5"))
    assert main(["run", config, "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err.partition("error: ")[2]
    assert err.startswith("config 'tiny'") and "laplacian_heads[0]" in err and "--import" not in err
