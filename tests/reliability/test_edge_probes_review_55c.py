"""Review of 220973f (load_run's recorded ``--import`` hint, register_dataset's ``root``), 51b6d94
(anova_decomposition through _anova_of_lengths), 8a9354d (docs of ``--set`` tables) and 3e0cfd2 (a config key's
home table, ``_key_home``/``_build_table``): each ``test_bug_`` test failed before its fix."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import pytest
import torch

_RUN = {"model": "vit-digits", "model_config": {"bogus1": 1, "bogus2": 2}}
_RAW = {"name": "review", "seeds": [0], "operators": [{"name": "attention"}],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 1}}]}


def _run_dir(tmp_path, command: str):
    """A run folder in the runner's layout below a manifest recording ``command``."""
    rdir = tmp_path / "runs" / "t" / "op" / "seed0"
    rdir.mkdir(parents=True)
    (rdir / "run_config.json").write_text(json.dumps(_RUN))
    (tmp_path / "manifest.json").write_text(json.dumps({"command": command}))
    return rdir


def test_bug_load_run_keeps_the_error_type_when_it_names_the_recorded_import(tmp_path):
    """Bug: with the hint, a run config of several problems raised a bare ``ValueError``, no longer the
    ``ConfigErrors`` (a ``TypeError`` too, with its ``problems``) the same folder raises without a manifest."""
    from diffusionformer.config import ConfigErrors
    from diffusionformer.experiments.reload import load_run

    rdir = _run_dir(tmp_path, "__main__.py run c.toml --import ops.py")
    with pytest.raises(ConfigErrors) as info:
        load_run(rdir)
    assert isinstance(info.value, TypeError) and len(info.value.problems) == 2
    assert str(info.value).endswith("; the run was made with --import ops.py "
                                    f"({tmp_path / 'manifest.json'}): import what registers its names before load_run")


@pytest.mark.parametrize("module", ["/home/me/My Ops/ops.py", r"C:\work\ops.py", "ops.py"])
def test_bug_the_recorded_import_hint_names_the_module_given(tmp_path, monkeypatch, module):
    """Bug: the manifest recorded the command as its words joined by spaces, which the hint split as a shell would:
    ``--import "/home/me/My Ops/ops.py"`` was named ``--import /home/me/My``, ``C:\\work\\ops.py`` lost its
    backslashes, and any word with an apostrophe (``--out "Bob's runs"``) left no hint at all. The manifest now
    records a command a shell reads back word for word."""
    from diffusionformer.experiments import load_experiment_config, outputs
    from diffusionformer.experiments.reload import _recorded_imports_hint

    argv = ["/usr/bin/__main__.py", "run", "c.toml", "--out", "Bob's runs", "--import", module, "--set", "seeds=[0]"]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(outputs, "git_commit", lambda path=None: "abc")
    command = outputs.manifest(load_experiment_config(_RAW))["command"]
    assert command.startswith("__main__.py run c.toml --out ")
    rdir = _run_dir(tmp_path, command)
    quoted = module if module == "ops.py" else f"'{module}'"
    assert _recorded_imports_hint(rdir).startswith(f"; the run was made with --import {quoted} (")


@dataclass
class _MySSL:
    """A user's task settings: ``batch_size`` is one of its own keys (also a key of [tasks.train])."""

    batch_size: int = 32
    knn_k: int = 5


@pytest.fixture
def my_ssl_preset():
    from diffusionformer.models import get_preset, register_model, unregister_model

    dino = get_preset("dino-digits")
    register_model("probe55q-ssl", dino.model_cls, dino.config_cls, task_config_cls=_MySSL, **dino.defaults)
    yield "probe55q-ssl"
    unregister_model("probe55q-ssl")


def test_bug_a_key_of_a_users_task_settings_is_not_refused_as_misplaced(my_ssl_preset):
    """Bug: ``[tasks.ssl]`` keys were judged against the built-in SSLConfig, not the preset's own
    ``task_config_cls``: ``batch_size = 16``, a key of the user's class, was refused as "'batch_size' is a key of
    [tasks.train] and of [tasks.minibatch]". A key unknown to the user's class still names its home."""
    from diffusionformer.experiments.config import TaskConfig

    task = TaskConfig(name="t", dataset="digits", model=my_ssl_preset, ssl={"batch_size": 16})
    assert task.ssl == {"batch_size": 16}
    with pytest.raises(ValueError, match=r"ssl: unknown key 'lr' \('lr' is a key of \[tasks.train\]\)"):
        TaskConfig(name="t", dataset="digits", model=my_ssl_preset, ssl={"lr": 0.1})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_anova_decomposition_matches_the_direct_split_up_to_rounding(dtype):
    """The equal-length case of _anova_of_lengths (51b6d94) against the split written out per level (the code it
    replaced): the same parts to rounding, the same class count, one class and ``B = 1``/``T = 1`` included."""
    from diffusionformer.analysis import anova_decomposition

    g = torch.Generator().manual_seed(0)
    for B, T, labels in [(6, 5, [3, -1, 3, 7, -1, 3]), (1, 4, [2]), (5, 1, [0, 1, 0, 1, 1]), (4, 3, [9, 9, 9, 9])]:
        X = (torch.randn(B, T, 3, generator=g) * 100 + 7).to(dtype)
        y = torch.tensor(labels)
        Xw = X.double()
        _, inv, counts = torch.unique(y, return_inverse=True, return_counts=True)
        mu, seq = Xw.mean(dim=(0, 1)), Xw.mean(dim=1)
        cls = Xw.new_zeros(len(counts), 3).index_add_(0, inv, seq) / counts.unsqueeze(-1)
        want = [(Xw - mu).pow(2).mean() * 3, (Xw - seq.unsqueeze(1)).pow(2).mean() * 3,
                (seq - cls[inv]).pow(2).sum() / B, (counts.unsqueeze(-1) * (cls - mu).pow(2)).sum() / B]
        got = anova_decomposition(X, y)
        assert got.num_classes == len(counts)
        parts = [got.total, got.within_sequence, got.between_sequence, got.between_class]
        assert parts == pytest.approx([float(w) for w in want], rel=1e-9, abs=1e-9 * got.total)
