"""``--import MODULE`` of the command line: a user's registrations (datasets, model presets) made known to every
command and to the workers of ``run --workers N``, with clear errors for a module that is missing, fails, or whose
file name clashes with an imported module."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from diffusionformer.data import list_datasets, unregister_dataset
from diffusionformer.experiments.cli import main
from diffusionformer.models import list_models, unregister_model

REGISTRATIONS = '''
import torch

from diffusionformer.data import ClassificationData, register_dataset
from diffusionformer.models import DiffusionViT, ViTConfig, register_model


@register_dataset("{prefix}-blobs", kind="image")
def load_blobs(*, seed, num_train=32):
    g = torch.Generator().manual_seed(seed)

    def split(n):
        y = torch.randint(0, 2, (n,), generator=g)
        x = torch.randn(n, 1, 4, 4, generator=g, dtype=torch.float32)
        x[:, :, 1:-1, 1:-1] += 2.0 * y.view(-1, 1, 1, 1)
        return x, y

    return ClassificationData("{prefix}-blobs", "image", *split(num_train), *split(16), *split(16),
                              num_classes=2, input_shape=(1, 4, 4))


class TinyViT(DiffusionViT):
    pass


register_model("{prefix}-vit", TinyViT, ViTConfig, "tiny", input_size=(4, 4), patch_size=2, dim=8, depth=1,
               num_heads=2)
'''

CONFIG = '''
name = "{prefix}"
seeds = [0, 1]
operators = [{{ name = "attention" }}, {{ name = "laplacian", heads = "attention:1,laplacian:1" }}]

[[tasks]]
name = "pixels"
dataset = "{prefix}-blobs"
model = "{prefix}-vit"
metric = "test_acc"

[tasks.train]
max_steps = 4
batch_size = 8
lr = 0.01
warmup_steps = 0
eval_interval = 4
log_interval = 4
checkpoint_interval = 4
'''


@pytest.fixture
def user_module(tmp_path, request):
    """A registrations file ``<name>.py`` and a config naming what it registers; both and the module are removed
    afterwards (registries are per process)."""
    name = f"regs51_{request.node.name.split('[')[0][-20:]}"
    prefix = name.replace("_", "-")
    (tmp_path / f"{name}.py").write_text(REGISTRATIONS.format(prefix=prefix))
    (tmp_path / "c.toml").write_text(CONFIG.format(prefix=prefix))
    yield tmp_path, name, prefix
    sys.modules.pop(name, None)
    if f"{prefix}-vit" in list_models():
        unregister_model(f"{prefix}-vit")
    if f"{prefix}-blobs" in list_datasets():
        unregister_dataset(f"{prefix}-blobs")


def test_without_import_the_config_names_are_unknown_and_with_a_file_they_are_known(user_module, capsys):
    folder, name, prefix = user_module
    assert main(["show", str(folder / "c.toml")]) == 2
    assert f"{prefix}-blobs" in capsys.readouterr().err
    assert main(["show", str(folder / "c.toml"), "--import", str(folder / f"{name}.py")]) == 0
    assert f"task pixels: {prefix}-blobs -> {prefix}-vit" in capsys.readouterr().out
    assert sys.modules[name].TinyViT.__module__ == name  # the class's spec names the file's module
    # again in one process (a notebook calling main twice): imported once, no "already registered"
    assert main(["list", "--import", str(folder / f"{name}.py")]) == 0
    out = capsys.readouterr().out
    assert f"{prefix}-blobs" in out and f"{prefix}-vit" in out


def test_a_dotted_name_is_found_in_the_current_folder(user_module, monkeypatch, capsys):
    folder, name, prefix = user_module
    monkeypatch.chdir(folder)
    # the `diffusionformer` script's sys.path lacks the current folder; `python -m` has it
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(folder))])
    assert main(["show", "c.toml", "--import", name]) == 0
    assert str(folder) not in sys.path  # put back as found
    assert f"{prefix}-vit" in capsys.readouterr().out


@pytest.mark.parametrize("spec, words", [
    ("no_such_module_51", "no module named 'no_such_module_51' in the current folder"),
    ("no_such_pkg_51.regs", "no module named 'no_such_pkg_51'"),
    ("my-regs", "expected a dotted module name"),
    ("", "got an empty string"),
    ("missing51.py", "no such file"),
    ("regs.txt/", "expected a .py file"),
])
def test_a_module_that_is_not_there_is_one_error_line(tmp_path, monkeypatch, capsys, spec, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text("name = 'x'\n")
    assert main(["show", "c.toml", "--import", spec]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and err.startswith("error: --import")


def test_an_error_inside_the_module_shows_its_traceback_and_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text("name = 'x'\n")
    (tmp_path / "broken51.py").write_text("import os\n\nraise RuntimeError('my own bug')\n")
    (tmp_path / "missing_dep51.py").write_text("import not_installed_dep_51\n")
    (tmp_path / "our_name51.py").write_text("from diffusionformer.no_such_part import x\n")
    for spec, words in (("broken51.py", "RuntimeError: my own bug"),
                        ("missing_dep51", "No module named 'not_installed_dep_51'"),
                        ("our_name51.py", "diffusionformer.no_such_part")):
        assert main(["show", "c.toml", "--import", spec]) == 2
        err = capsys.readouterr().err
        assert "Traceback" in err and f"{spec.removesuffix('.py')}.py" in err  # the user's own line
        assert f"error: --import {spec!r} failed" in err and words in err
        assert spec.removesuffix(".py") not in sys.modules  # a failed import leaves no half module


def test_a_file_whose_name_clashes_or_is_no_identifier_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text("name = 'x'\n")
    (tmp_path / "json.py").write_text("raise RuntimeError('must not run')\n")
    (tmp_path / "my-regs.py").write_text("raise RuntimeError('must not run')\n")
    assert main(["show", "c.toml", "--import", "json.py"]) == 2
    err = capsys.readouterr().err
    assert "a module named 'json' is imported already" in err and "must not run" not in err
    assert main(["show", "c.toml", "--import", "my-regs.py"]) == 2
    err = capsys.readouterr().err
    assert "must be a Python identifier (e.g. my_regs.py)" in err and "must not run" not in err


def test_workers_get_the_import_and_train_every_run(user_module, monkeypatch, capsys):
    """Without --import passed on, each worker refuses the unknown names and this process trains all four runs."""
    folder, name, prefix = user_module
    monkeypatch.chdir(folder)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    code = main(["run", "c.toml", "--import", f"{name}.py", "--workers", "2", "--out", "res", "--no-progress",
                 "--threads", "1"])
    assert code == 0, capsys.readouterr().err
    logs = [(folder / "res" / prefix / "workers" / f"worker{k}.log").read_text() for k in range(2)]
    # each worker knew the names: a worker without them says "unknown model ...; nothing was trained" and exits 2
    assert all("results:" in log and "unknown" not in log and "nothing was trained" not in log for log in logs), logs
    assert "results:" in capsys.readouterr().out


# ---------------------------------------------------------------------------- a non-float32 default dtype
@pytest.mark.filterwarnings("ignore:.*index.md not found:RuntimeWarning")
def test_bug_a_page_of_float64_runs_names_the_default_dtype_and_import_reaches_them(tmp_path, monkeypatch, capsys):
    """Bug: runs built at a notebook's ``torch.set_default_dtype(torch.float64)`` were published on a page whose only
    command (``run <config>``) trains float32 runs, with nothing saying so. The page now names the default dtype, and
    the command line reaches those runs through ``--import`` of a module that sets it (``status`` counts them
    completed, ``run`` trains nothing again); without it they are another identity."""
    import torch

    from diffusionformer.experiments import load_experiment_config, publish_experiment, run_experiment
    from experiments_tiny_configs import TINY_DIGITS_TOML

    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text(TINY_DIGITS_TOML)
    (tmp_path / "set64_51.py").write_text("import torch\n\ntorch.set_default_dtype(torch.float64)\n")
    config = load_experiment_config(tmp_path / "c.toml")
    torch.set_default_dtype(torch.float64)
    try:
        run_experiment(config, "res", progress=False, log=lambda m: None)
        page = publish_experiment(config, "res", tmp_path / "docs", config_path="c.toml").read_text()
        assert "- **Default dtype:** float64: the runs were built after `torch.set_default_dtype(torch.float64)`" \
            in page
        assert main(["status", "c.toml", "--out", "res", "--import", "set64_51.py"]) == 0
        assert capsys.readouterr().out.startswith("2 of 2 runs completed")
    finally:
        torch.set_default_dtype(torch.float32)
        sys.modules.pop("set64_51", None)
    assert main(["status", "c.toml", "--out", "res"]) == 0  # a float32 process: the runs are of another dtype
    assert "0 of 2 runs completed" in capsys.readouterr().out
    run_experiment(config, "res32", progress=False, log=lambda m: None)
    page = publish_experiment(config, "res32", tmp_path / "docs32", config_path="c.toml").read_text()
    assert "Default dtype" not in page  # float32: no line


@pytest.mark.filterwarnings("ignore:.*index.md not found:RuntimeWarning")
def test_bug_the_published_command_names_the_import_the_config_needs(user_module, monkeypatch, capsys):
    """Bug: ``publish --import regs.py`` wrote the page's command as ``run c.toml``, which cannot read a config
    naming the module's registrations; the command now names the ``--import`` (before any ``--set``)."""
    folder, name, prefix = user_module
    monkeypatch.chdir(folder)
    args = ["c.toml", "--import", f"{name}.py", "--out", "res"]
    assert main(["run", *args, "--no-progress", "--set", "seeds=[0]"]) == 0
    assert main(["publish", *args, "--to", "docs", "--set", "seeds=[0]"]) == 0
    page = (folder / "docs" / f"{prefix}.md").read_text()
    assert (f"- **Command:** `python -m diffusionformer.experiments run c.toml --import {name}.py --set 'seeds=[0]'` "
            "(add `--data-root <root>` for standard benchmarks), then `publish` with the same config and `--import` "
            "modules and overrides") in page


@pytest.mark.parametrize("kwargs", [{"imports": "regs.py"}, {"overrides": "seeds=[0]"}, {"imports": [Path("r.py")]}])
def test_bug_publish_refuses_a_str_for_a_list_of_options(tmp_path, kwargs):
    """Bug: ``publish_experiment(..., imports="regs.py")`` wrote ``--import r --import e ...`` (a letter each) into
    the page's command; a str, or a list holding other than str, is refused before anything is read."""
    from diffusionformer.experiments import load_experiment_config, publish_experiment
    from experiments_tiny_configs import TINY_DIGITS_TOML

    (tmp_path / "c.toml").write_text(TINY_DIGITS_TOML)
    with pytest.raises(TypeError, match=r"publish_experiment: (imports|overrides) must be a list of str"):
        publish_experiment(load_experiment_config(tmp_path / "c.toml"), tmp_path / "res", tmp_path / "docs", **kwargs)

