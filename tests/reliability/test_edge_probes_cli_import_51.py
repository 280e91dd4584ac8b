"""Edge probes of ``--import MODULE`` on the command line (experiments/cli.py ``_import_module``) and of the published
page's "Default dtype" line (experiments/publish.py ``_default_dtype_line``): bugs found, and pins of what the
tests of tests/experiments/test_cli_import_51.py left free."""

from __future__ import annotations

import sys

import pytest
import torch

from diffusionformer.data import list_datasets, unregister_dataset
from diffusionformer.experiments.cli import main
from diffusionformer.models import list_models, unregister_model
from diffusionformer.operators import list_operators

HALFWAY = '''
import torch

from diffusionformer.data import ClassificationData, register_dataset
from diffusionformer.models import DiffusionViT, ViTConfig, register_model
from diffusionformer.operators import DiffusionOperator, register_operator


@register_dataset("half51-blobs", kind="image")
def load_blobs(*, seed):
    raise NotImplementedError


class Half51ViT(DiffusionViT):
    pass


register_model("half51-vit", Half51ViT, ViTConfig, "tiny", input_size=(4, 4), patch_size=2, dim=8, depth=1,
               num_heads=2)


@register_operator(name="half51-op", aliases=("half51-alias",))
class Half51Op(DiffusionOperator):
    pass


from diffusionformer.analysis import register_metric
from diffusionformer.experiments.tasks import task_adapter

register_metric("half51_metric", group="smoothing")(lambda view: None)


class Half51Data:
    pass


task_adapter(ViTConfig, Half51Data)(lambda data: {{}})


torch.set_default_dtype(torch.float64)
{tail}
'''


@pytest.fixture
def clean_half51():
    yield
    for name in ("half51", "half51_pkg"):
        sys.modules.pop(name, None)
    if "half51-vit" in list_models():
        unregister_model("half51-vit")
    if "half51-blobs" in list_datasets():
        unregister_dataset("half51-blobs")
    if "half51-op" in list_operators():
        from diffusionformer.operators import unregister_operator

        unregister_operator("half51-op")
    from diffusionformer.analysis import list_metrics, unregister_metric
    from diffusionformer.experiments import tasks

    if "half51_metric" in [m.key for m in list_metrics()]:
        unregister_metric("half51_metric")
    for key in [k for k in tasks._ADAPTERS if k[1].__name__ == "Half51Data"]:
        del tasks._ADAPTERS[key]
    torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("dotted", [False, True])
def test_bug_a_module_failing_halfway_leaves_no_registration_for_main_called_again(tmp_path, monkeypatch, capsys,
                                                                                   clean_half51, dotted):
    """Bug: a module that registered a dataset, a model preset and an operator (and set the default dtype) and then
    failed left all of it in this process: a notebook calling main() again after fixing the file got
    "dataset 'half51-blobs' is already registered" (from the module's first line, not the bug it had fixed), and
    the process kept building float64 runs. A failed import now puts the registries and the dtype back."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text("name = 'x'\n")
    spec = "half51" if dotted else "half51.py"
    (tmp_path / "half51.py").write_text(HALFWAY.format(tail="raise RuntimeError('my bug, line 30')"))
    assert main(["list", "--import", spec]) == 2
    err = capsys.readouterr().err
    assert "my bug, line 30" in err and f"error: --import {spec!r} failed: RuntimeError: my bug, line 30" in err
    assert err.rstrip().endswith("(traceback above)")
    assert "half51-blobs" not in list_datasets() and "half51-vit" not in list_models()
    assert "half51-op" not in list_operators() and torch.get_default_dtype() == torch.float32
    assert "half51" not in sys.modules
    from diffusionformer.analysis import list_metrics
    from diffusionformer.experiments import tasks
    from diffusionformer.operators import operator_class
    from diffusionformer.operators.base import _DECLARED

    assert not any(c.__name__ == "Half51Op" for c in _DECLARED)  # the class's declared name kept for unregister

    with pytest.raises(ValueError, match="half51-alias"):
        operator_class("half51-alias")
    assert "half51_metric" not in [m.key for m in list_metrics()]
    assert not any(d.__name__ == "Half51Data" for _, d in tasks._ADAPTERS)
    (tmp_path / "half51.py").write_text(HALFWAY.format(tail=""))  # fixed: the second call works
    sys.path_importer_cache.clear()
    import importlib

    importlib.invalidate_caches()
    assert main(["list", "--import", spec]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "half51-blobs" in out and "half51-vit" in out and "half51-op" in out
    assert torch.get_default_dtype() == torch.float64  # a module imported whole keeps what it set


@pytest.mark.parametrize("code, shown", [(3, "sys.exit(3)"), (None, "sys.exit()"),
                                         ("'usage: x'", "sys.exit('usage: x')")])
def test_bug_a_module_calling_sys_exit_is_one_error_line(tmp_path, monkeypatch, capsys, code, shown):
    """Bug: a module that calls ``sys.exit`` at its top (a script whose own code is not under
    ``if __name__ == "__main__":``) ended the command silently with the script's exit code (0 for ``sys.exit()``:
    a ``run`` that trained nothing read as success), and a notebook's main() raised SystemExit. It is now the
    one error line of a failed import, exit 2, and leaves nothing registered."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text("name = 'x'\n")
    (tmp_path / "script51.py").write_text(
        "import sys\nfrom diffusionformer.data import register_dataset\n\n"
        "register_dataset('script51-data', kind='image')(lambda *, seed: None)\n"
        f"sys.exit({'' if code is None else code})\n")
    try:
        assert main(["show", "c.toml", "--import", "script51.py"]) == 2
    finally:
        err = capsys.readouterr().err
        if "script51-data" in list_datasets():
            unregister_dataset("script51-data")
            pytest.fail("the module's registration was left")
        sys.modules.pop("script51", None)
    assert f"error: --import 'script51.py' failed: it called {shown} while being imported" in err
    assert 'if __name__ == "__main__":' in err


def test_bug_a_dotted_name_of_an_imported_module_is_not_the_file_in_the_current_folder(tmp_path, monkeypatch,
                                                                                          capsys):
    """Bug: ``--import copy`` with the user's ``copy.py`` (or ``tomllib/``, ``random.py`` ...) in the current folder
    silently took the module of that name imported already (the standard library's), so the file's registrations
    never ran and the config's names were "unknown"; ``--import copy.py`` refused it clearly. The dotted name is now
    refused the same way, naming both files."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text("name = 'x'\n")
    (tmp_path / "copy.py").write_text("raise RuntimeError('must not run')\n")
    (tmp_path / "tomllib").mkdir()
    (tmp_path / "tomllib" / "__init__.py").write_text("raise RuntimeError('must not run')\n")
    (tmp_path / "tomllib" / "regs.py").write_text("raise RuntimeError('must not run')\n")
    for spec, top, what in (("copy", "copy", "file"), ("tomllib.regs", "tomllib", "folder")):
        assert main(["show", "c.toml", "--import", spec]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --import {spec!r}: a module named {top!r} is imported already (from ")
        assert f"rename the {what}" in err and str(tmp_path) in err and "must not run" not in err
    assert sys.modules["copy"].__file__ != str(tmp_path / "copy.py")


def test_pin_a_dotted_name_of_the_file_imported_already_is_no_clash(tmp_path, monkeypatch, capsys):
    """Pin: the module imported already from the current folder's own file (main() called again, or the same file
    given as a path and a dotted name) is taken as it is: no clash, no second import."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text("name = 'x'\n")
    (tmp_path / "once51.py").write_text("import builtins\n"
                                        "builtins.once51_count = getattr(builtins, 'once51_count', 0) + 1\n")
    import builtins

    try:
        assert main(["list", "--import", "once51.py", "--import", "once51"]) == 0, capsys.readouterr().err
        assert main(["list", "--import", "once51"]) == 0
        assert builtins.once51_count == 1
    finally:
        sys.modules.pop("once51", None)
        builtins.__dict__.pop("once51_count", None)


@pytest.mark.parametrize("argv", [["--import", "regs51", "show", "c.toml"], ["--import=regs51", "list"]])
def test_bug_import_before_the_command_says_where_it_goes(argv, capsys):
    """Bug: ``diffusionformer --import regs run c.toml`` (the flag before the command, as with git's ``-C``) was
    "invalid choice: 'regs51' (choose from 'run', 'show' ...)", the module taken for a command. It now says that
    ``--import`` goes after the command."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--import goes after the command, e.g. diffusionformer run CONFIG --import MODULE" in err
    assert "invalid choice" not in err


def test_bug_a_blank_import_is_named_as_it_is(capsys):
    """Bug: ``--import " "`` (a variable holding spaces) was refused as "got an empty string", which it is not."""
    assert main(["list", "--import", "  "]) == 2
    assert capsys.readouterr().err == "error: --import: expected a module name or a .py file, got only spaces '  '\n"


# ---------------------------------------------------------------------------- pins (mutation audit)
@pytest.mark.parametrize("spec, words", [
    ("pkg51.my-regs", "--import 'pkg51.my-regs': expected a dotted module name (mypackage.registrations) or a .py"),
    ("dir51.py", "--import 'dir51.py': no such file (from "),
    ("1regs51.py", "must be a Python identifier (e.g. regs51.py)"),
    ("123.py", "must be a Python identifier (e.g. mod.py)"),
    ("sys.py", "--import 'sys.py': a module named 'sys' is imported already (built in); rename the file"),
    ("sys", "--import 'sys': a module named 'sys' is imported already (built in), not "),
    ("no_such_module_51", "or on sys.path; give a .py file's path, or install the package"),
])
def test_pin_the_refusals_name_the_value_and_what_to_do(tmp_path, monkeypatch, capsys, spec, words):
    """Pin: each refusal's words (a blank name, a dotted name with a bad part, a folder named like a .py file, a
    file name that is no identifier and its suggested name, a clash with a built-in module, as a file and as a dotted
    name), and nothing of the files run."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text("name = 'x'\n")
    (tmp_path / "dir51.py").mkdir()
    for name in ("1regs51.py", "123.py", "sys.py"):
        (tmp_path / name).write_text("raise RuntimeError('must not run')\n")
    assert main(["show", "c.toml", "--import", spec]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and "must not run" not in err
    if spec == "dir51.py":
        assert f"(from {tmp_path})" in err


def test_pin_a_file_importing_its_sibling_from_another_folder_and_given_twice(tmp_path, monkeypatch, capsys):
    """Pin: a file finds its own folder's modules (as a script does) from another current folder, which leaves
    ``sys.path`` as it was; the same file given again by another spelling is imported once."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "sib51.py").write_text("import builtins\nbuiltins.sib51_count = "
                                                 "getattr(builtins, 'sib51_count', 0) + 1\n")
    (tmp_path / "sub" / "user51e.py").write_text("import sib51\n")
    (tmp_path / "c.toml").write_text("name = 'x'\n")
    monkeypatch.chdir(tmp_path)
    path = list(sys.path)
    import builtins

    try:
        assert main(["list", "--import", "sub/user51e.py", "--import", "./sub/../sub/user51e.py",
                     "--import", str(tmp_path / "sub" / "user51e.py")]) == 0, capsys.readouterr().err
        assert builtins.sib51_count == 1 and sys.path == path
    finally:
        for name in ("sib51", "user51e"):
            sys.modules.pop(name, None)
        builtins.__dict__.pop("sib51_count", None)


@pytest.mark.parametrize("spec", ["selfref51.py", "selfref51"])
def test_pin_an_import_error_of_the_module_own_code_is_its_traceback(tmp_path, monkeypatch, capsys, spec):
    """Pin: a ModuleNotFoundError raised by the module's own code (``import selfref51.py``, the file's own name
    with its suffix; a ``ModuleNotFoundError`` of no module name) is the user's error, shown with its traceback and
    "(traceback above)", not "no module named ... in the current folder"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text("name = 'x'\n")
    body = "import selfref51.py\n" if spec.endswith(".py") else "raise ModuleNotFoundError('my own words')\n"
    (tmp_path / "selfref51.py").write_text(body)
    try:
        assert main(["show", "c.toml", "--import", spec]) == 2
    finally:
        sys.modules.pop("selfref51", None)
    err = capsys.readouterr().err
    assert "Traceback" in err and f"error: --import {spec!r} failed: ModuleNotFoundError: " in err
    assert err.rstrip().endswith("(traceback above)") and "in the current folder" not in err


def test_pin_the_default_dtype_line_in_full():
    """Pin: the page's line under a non-float32 default dtype, word for word (how to reach the runs: a module given
    with --import), and no line at float32."""
    from diffusionformer.experiments.publish import _default_dtype_line

    assert _default_dtype_line() == []
    torch.set_default_dtype(torch.float64)
    try:
        assert _default_dtype_line() == [
            "- **Default dtype:** float64: the runs were built after `torch.set_default_dtype(torch.float64)` (give "
            "the command a module that sets it with `--import`); the command alone trains float32 runs"]
    finally:
        torch.set_default_dtype(torch.float32)
