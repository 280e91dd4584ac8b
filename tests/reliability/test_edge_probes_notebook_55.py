"""Edge probes of a notebook user (helper 55s): ``diffusionformer.experiments.cli.main`` called several times in one
long-lived process must leave the process's global state as it found it."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch

from diffusionformer.experiments.cli import main
from experiments_tiny_configs import TINY_DIGITS_TOML


def _toml(tmp_path) -> str:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_DIGITS_TOML, encoding="utf-8")
    return str(path)


def test_bug_main_gives_the_callers_warning_formatter_back(tmp_path, capsys):
    """Bug: ``warnings.catch_warnings`` restores the filters and ``showwarning``, not ``formatwarning``; after one
    ``main([...])`` every later warning of the notebook printed as ``warning: <message>``, without its file, line and
    category."""
    before = warnings.formatwarning
    assert main(["show", _toml(tmp_path)]) == 0
    assert warnings.formatwarning is before
    assert main(["status", str(tmp_path / "missing.toml")]) == 2  # an error line: the same
    assert warnings.formatwarning is before
    capsys.readouterr()


def test_bug_main_gives_the_callers_torch_thread_count_back(tmp_path, capsys):
    """Bug: ``run --threads N`` (or $OMP_NUM_THREADS, cores // workers) set torch's thread count for the rest of the
    notebook's process; the command sizes its own threads, the caller's count comes back when it returns."""
    before = torch.get_num_threads()
    mine = 2 if before == 1 else 1
    try:
        torch.set_num_threads(mine)
        code = main(["run", _toml(tmp_path), "--out", str(tmp_path / "out"), "--no-progress",
                     "--threads", str(3 - mine)])
        assert code == 0 and torch.get_num_threads() == mine
    finally:
        torch.set_num_threads(before)
    capsys.readouterr()


@pytest.mark.parametrize("module, names", [("diffusionformer.operators.registry", ("_REGISTRY", "_ALIASES")),
                                           ("diffusionformer.data.registry", ("_REGISTRY",))])
def test_bug_reloading_a_registry_keeps_the_registered_names(module, names):
    """Bug: ``importlib.reload`` of the operator or dataset registry (a notebook's habit after editing a file) made
    new, empty registries, while the modules that had registered into them at import are not run again: every
    operator was unknown (``unknown operator 'heat'; valid names: []``), every dataset too."""
    from diffusionformer.data import list_datasets
    from diffusionformer.operators import build_operator, list_operators

    registry = importlib.import_module(module)
    saved = {n: dict(getattr(registry, n)) for n in names}
    operators, datasets = list_operators(), list_datasets()
    try:
        importlib.reload(registry)
        assert list_operators() == operators and list_datasets() == datasets
        assert type(build_operator("heat")).__name__ == "HeatOperator"
    finally:  # the registries as they were, whatever the reload did
        for n, before in saved.items():
            getattr(registry, n).clear()
            getattr(registry, n).update(before)
