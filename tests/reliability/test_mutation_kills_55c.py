"""Mutation audit, sitting 55c: experiments/gpu.py, data/registry.py, experiments/reload.py, experiments/store.py,
experiments/threads.py. Each test kills a mutant the suite let live (or pins a bug fixed with it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from diffusionformer.operators import list_operators

_OP_MODULE = '''
from diffusionformer.operators import register_operator
from diffusionformer.operators.basic import AttentionOperator


@register_operator(name="probe55c-op")
class Probe55cOp(AttentionOperator):
    pass
'''

_CONFIG = '''
name = "imp"
seeds = [0]
[[operators]]
name = "mine"
heads = "probe55c-op"
[[tasks]]
name = "t"
dataset = "digits"
model = "vit-digits"
train = {max_steps = 1, batch_size = 8, eval_interval = 0}
'''


@pytest.fixture
def probe55c_op():
    yield
    sys.modules.pop("probe55c_ops", None)
    if "probe55c-op" in list_operators():
        from diffusionformer.operators import unregister_operator

        unregister_operator("probe55c-op")


def _run_imported(tmp_path, monkeypatch, module: str):
    """``run c.toml --import MODULE`` (the operator module written at ``tmp_path / module``) from ``tmp_path`` through
    ``main(argv)``; its run folder."""
    from diffusionformer.experiments.cli import main

    (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / module).write_text(_OP_MODULE)
    (tmp_path / "c.toml").write_text(_CONFIG)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "c.toml", "--out", "res", "--import", module, "--no-progress"]) == 0
    return tmp_path / "res" / "imp" / "runs" / "t" / "mine" / "seed0"


def _assert_load_run_names_the_import(rdir, tmp_path, recorded: str) -> None:
    """Without the operator registered, ``load_run`` of ``rdir`` fails naming the recorded ``--import``."""
    from diffusionformer.experiments.reload import load_run
    from diffusionformer.operators import unregister_operator

    unregister_operator("probe55c-op")
    with pytest.raises(ValueError, match="unknown operator 'probe55c-op'") as info:
        load_run(rdir)
    assert str(info.value).endswith(f"; the run was made with --import {recorded} "
                                    f"({tmp_path / 'res' / 'imp' / 'manifest.json'}): import what registers its "
                                    "names before load_run")


def test_bug_load_run_of_an_imported_operator_names_the_recorded_import(tmp_path, monkeypatch, probe55c_op):
    """Bug: a run made with ``run CONFIG --import MODULE`` (a user's operator), read back by ``load_run`` without that
    module, failed with a bare "unknown operator 'probe55c-op'", though the comparison's ``manifest.json`` records the
    command and its ``--import``. The error now names it."""
    from diffusionformer.experiments.reload import load_run

    rdir = _run_imported(tmp_path, monkeypatch, "probe55c_ops.py")
    assert type(load_run(rdir).model).__name__ == "DiffusionViT"  # with the module imported: loads
    _assert_load_run_names_the_import(rdir, tmp_path, "probe55c_ops.py")


@pytest.mark.parametrize("default", ["none", "given"])
def test_bug_a_loader_taking_root_registered_without_needs_root_is_refused(default):
    """Bug: a loader with a ``root`` parameter registered without ``needs_root=True`` never gets the root:
    ``load_dataset(name, root="/data")`` failed with the loader's own "missing 1 required keyword-only argument:
    'root'" (the root given!), or with a default the root given was silently ignored. Registration now refuses it."""
    from diffusionformer.data import list_datasets, register_dataset

    if default == "none":
        def loader(*, seed, root):
            raise AssertionError("never called")
    else:
        def loader(*, seed, root=None):
            raise AssertionError("never called")
    with pytest.raises(TypeError, match=r"^loader for 'probe55c-rooted' takes a 'root' parameter, which only a "
                                        r"dataset registered with needs_root=True is passed"):
        register_dataset("probe55c-rooted", kind="image")(loader)
    assert "probe55c-rooted" not in list_datasets()


# ----------------------------------------------------------------------------- experiments/gpu.py
def test_check_device_with_an_index_is_not_suggested_auto():
    """``auto`` takes no index: ``"AUTO:1"`` is refused without a "did you mean 'auto'?" (which is no device with an
    index either); kills the mutant offering ``auto`` to a spec with ``:``."""
    from diffusionformer.experiments.gpu import check_device

    with pytest.raises(ValueError) as info:
        check_device("AUTO:1", available=False)
    assert str(info.value) == "device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got 'AUTO:1'"
    with pytest.raises(ValueError, match=r"got 'AUTO' \(did you mean 'auto'\?\)$"):  # without an index: suggested
        check_device("AUTO", available=False)


# ----------------------------------------------------------------------------- experiments/reload.py
def test_load_run_refuses_a_device_kind_this_torch_cannot_use_before_reading_anything(tmp_path):
    """``map_location="mps"`` off a Mac is refused by name before the run folder is read (here: none at all); kills
    the mutant that lets ``mps`` through to a bare torch error once the model is built."""
    import torch

    from diffusionformer.experiments.reload import load_run

    if torch.backends.mps.is_available():
        pytest.skip("mps is usable here")
    with pytest.raises(ValueError, match=r"^load_run: map_location 'mps' asked for, but this torch cannot use it "):
        load_run(tmp_path / "no-such-run", map_location="mps")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A finished one-step run of the library's ``vit-digits`` (its directory; copy it before changing it)."""
    from diffusionformer.experiments import load_experiment_config, run_experiment

    out = tmp_path_factory.mktemp("run55c")
    config = load_experiment_config({"name": "r", "seeds": [0], "operators": [{"name": "attention"}],
                                     "tasks": [{"name": "t", "dataset": "digits", "model": "vit-digits",
                                                "train": {"max_steps": 1, "batch_size": 8, "eval_interval": 0}}]})
    run_experiment(config, out, progress=False, log=lambda s: None)
    return out / "r" / "runs" / "t" / "attention" / "seed0"


def _copy_run(src, tmp_path):
    import shutil

    return Path(shutil.copytree(src, tmp_path / "runs" / "t" / "attention" / "seed0"))


def test_load_run_compares_the_train_config_but_not_what_a_resume_may_change(tiny_run, tmp_path):
    """``run_config.json``'s train table with a raised ``max_steps`` (a field a resume may change) and another ``amp``
    (recorded as asked, saved as resolved) or a field the checkpoint's config lacks still loads; another ``seed`` is
    another run's checkpoint. Kills the mutants comparing the resumable fields, ``amp`` or a field one side lacks."""
    import json

    from diffusionformer.experiments.reload import load_run
    from diffusionformer.train import CheckpointError

    rdir = _copy_run(tiny_run, tmp_path)
    ident = json.loads((rdir / "run_config.json").read_text())
    ident["train"].update(max_steps=50, checkpoint_interval=7, amp="bf16", added_later=1)
    (rdir / "run_config.json").write_text(json.dumps(ident))
    assert load_run(rdir).step == 1
    ident["train"]["seed"] = 3
    (rdir / "run_config.json").write_text(json.dumps(ident))
    with pytest.raises(CheckpointError, match=r"trained under another train config \(seed: checkpoint 0, "
                                              r"run_config.json 3\)"):
        load_run(rdir)


def test_an_empty_model_record_of_another_type_is_damaged_not_missing():
    """A checkpoint whose ``model_record`` is ``[]`` is damaged (as the trainer refuses it), not an older checkpoint
    without one, and so is a record whose ``config`` is a list; kills the mutants ``saved is None`` -> ``not saved``
    and the dropped check of its ``config``/``heads`` entries."""
    from torch import nn

    from diffusionformer.experiments.reload import _check_model_record
    from diffusionformer.train import CheckpointError

    with pytest.raises(CheckpointError, match=r"expected a model record as the trainer saves .*got list \(\[\]\)$"):
        _check_model_record([], nn.Linear(2, 3), Path("c.pt"), Path("run_config.json"))
    saved = {"class": "torch.nn.modules.linear.Linear", "config": ["dim", 3], "heads": {}}  # a list as its config
    with pytest.raises(CheckpointError, match=r"expected a model record as the trainer saves .*got dict "):
        _check_model_record(saved, nn.Linear(2, 3), Path("c.pt"), Path("run_config.json"))


def test_runs_below_an_output_root_names_three_runs_of_an_experiment(tmp_path):
    """``load_run`` of a results root (``--out``) names the run directories of the experiment below it, three of
    them without "..."; kills the mutants dropping the ``*/runs/*/*/seed*`` pattern or lowering the limit."""
    from diffusionformer.experiments.reload import _runs_below

    runs = [tmp_path / "exp" / "runs" / "t" / "op" / f"seed{k}" for k in range(3)]
    for rdir in runs:
        rdir.mkdir(parents=True)
        (rdir / "run_config.json").write_text("{}")
    assert _runs_below(tmp_path) == f" (did you mean a run directory below it: {', '.join(map(str, runs))}?)"


def test_a_summary_step_that_is_a_bool_is_not_compared():
    """A ``summary.json`` whose ``step`` is ``true`` (no step) raises no step-mismatch warning; kills the mutant that
    compares a bool as an int."""
    import warnings

    from diffusionformer.experiments.reload import _check_summary_step

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check_summary_step({"status": "completed", "step": True}, 5, Path("summary.json"), Path("checkpoint.pt"))


# ----------------------------------------------------------------------------- data/registry.py
def test_load_dataset_refuses_an_option_of_another_type_than_its_default():
    """``val_fraction="0.1"`` (a string from a shell) is refused by name and kind; kills the mutants that skip the
    option type check or call a float default "a float" (an int passes too)."""
    from diffusionformer.data import load_dataset

    with pytest.raises(TypeError) as info:
        load_dataset("assoc-recall", num_examples=20, num_pairs=2, vocab_size=8, val_fraction="0.1")
    assert str(info.value) == ("load_dataset('assoc-recall'): option 'val_fraction' must be a number (default 0.1), "
                               "got str '0.1'")


def test_load_dataset_suggests_the_option_a_misspelt_one_is_near():
    """``num_exampels`` is named with the option it is near; kills the mutant raising the hint's cutoff."""
    from diffusionformer.data import load_dataset

    with pytest.raises(TypeError, match=r"^load_dataset\('assoc-recall'\) got unknown option\(s\) 'num_exampels' "
                                        r"\(did you mean 'num_examples'\?\); valid options: "):
        load_dataset("assoc-recall", num_exampels=20)


def test_load_dataset_passes_the_seed_to_the_loader():
    """Another seed draws other examples; kills the mutant calling every loader with ``seed=0``."""
    import torch

    from diffusionformer.data import load_dataset

    def draw(seed):
        return load_dataset("assoc-recall", num_examples=20, num_pairs=2, vocab_size=8, seed=seed).x_train

    assert torch.equal(draw(1), draw(1)) and not torch.equal(draw(0), draw(1))


# ----------------------------------------------------------------------------- experiments/threads.py
def test_plan_threads_refuses_one_past_a_c_int():
    """``--threads 2**31`` is one past what ``torch.set_num_threads`` takes (a C int): refused by name, while
    ``2**31 - 1`` is planned; likewise ``$OMP_NUM_THREADS``. Kills the mutants raising the limit by one or dropping
    it for ``$OMP_NUM_THREADS``."""
    from diffusionformer.experiments.threads import plan_threads

    assert plan_threads(threads=2**31 - 1, cores=2, environ={}).threads == 2**31 - 1
    with pytest.raises(ValueError, match=r"^--threads: expected a positive int of at most 2147483647 "):
        plan_threads(threads=2**31, cores=2, environ={})
    with pytest.raises(ValueError, match=r"^\$OMP_NUM_THREADS: expected a positive int of at most 2147483647 "):
        plan_threads(cores=2, environ={"OMP_NUM_THREADS": str(2**31)})


def test_recorded_imports_hint_reads_both_spellings_and_only_the_runner_layout(tmp_path):
    """Every ``--import`` of the manifest's command is named, ``--import=NAME`` too; a folder outside the runner's
    ``runs/<task>/<operator>/seed<k>`` layout gets no hint (its "manifest" is no comparison's)."""
    import json

    from diffusionformer.experiments.reload import _recorded_imports_hint

    (tmp_path / "manifest.json").write_text(json.dumps({"command": "__main__.py run c.toml --import a.py --import=b"}))
    hint = _recorded_imports_hint(tmp_path / "runs" / "t" / "op" / "seed0")
    assert hint.startswith(f"; the run was made with --import a.py --import b ({tmp_path / 'manifest.json'}): ")
    assert _recorded_imports_hint(tmp_path / "other" / "t" / "op" / "seed0") == ""


# found with the hint below (helper 55p)
def test_bug_main_argv_is_the_command_the_manifest_records(tmp_path, monkeypatch, probe55c_op):
    """Bug: ``manifest.json`` recorded the command from ``sys.argv``, so ``main(argv)`` called from Python (a test, a
    notebook) recorded the caller's command line (pytest's), not ``argv``; ``load_run``'s "--import" hint, which reads
    the recorded command, then named nothing. ``main(argv)`` records ``python -m diffusionformer.experiments <argv>``
    (quoted for a shell: a folder with a space stays one word), and the hint names its --import."""
    monkeypatch.setattr(sys, "argv", ["pytest", "-q", "tests"])  # the caller's own command line
    rdir = _run_imported(tmp_path, monkeypatch, "my ops/probe55c_ops.py")
    manifest = json.loads((tmp_path / "res" / "imp" / "manifest.json").read_text())
    assert manifest["command"] == ("python -m diffusionformer.experiments run c.toml --out res "
                                   "--import 'my ops/probe55c_ops.py' --no-progress")
    _assert_load_run_names_the_import(rdir, tmp_path, "'my ops/probe55c_ops.py'")
