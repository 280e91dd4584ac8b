"""A TOML / experiment-runner power user's walk through the strict-config promise: every kind of wrong value, at
every nesting level and through ``--set``, is refused before anything trains, naming the key path and the value,
with nothing written under ``--out``; configs that differ only in comments, key order or inline-vs-table spelling
are one run identity, and a changed config under an existing results folder is told, not mixed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diffusionformer.experiments.cli import main
from diffusionformer.experiments.config import load_experiment_config
from diffusionformer.experiments.validate import validate_experiment
from experiments_tiny_configs import TINY_DIGITS_USER_TOML as _BASE  # tests/reliability/conftest.py's path


def _config(tmp_path: Path, text: str = _BASE, name: str = "c.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _run(capsys, *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def _refused(capsys, tmp_path: Path, *argv: str) -> str:
    """Run ``argv`` (a ``run`` command writing to ``tmp_path / 'out'``): refused, and nothing written."""
    out = tmp_path / "out"
    rc, text = _run(capsys, "run", *argv, "--out", str(out), "--no-progress")
    assert rc == 2, text
    assert not out.exists(), sorted(out.rglob("*"))
    return text


# --------------------------------------------------------------------------------------------------- bugs fixed


@pytest.mark.parametrize("override, words", [
    ("tasks.digits.model_overrides.depth=99999999999999999999", ["depth", "99999999999999999999"]),
    ("operators.lap.model_overrides.depth=99999999999999999999", ["depth", "99999999999999999999"]),
])
def test_size_beyond_an_index_is_a_config_problem(tmp_path, capsys, override, words):
    """Bug: a model size beyond an index (``depth = 10**20`` in ``model_overrides``) passed the config checks as a
    positive int, then ``run`` and ``show`` ended in a traceback, ``OverflowError: cannot fit 'int' into an
    index-sized integer`` (from ``[spec] * depth``), naming neither the key, the task nor the setting."""
    path = _config(tmp_path)
    text = _refused(capsys, tmp_path, str(path), "--set", override)
    assert "nothing was trained" in text and "setting 'lap'" in text
    assert all(w in text for w in words), text
    rc, text = _run(capsys, "show", str(path), "--set", override)
    assert rc == 2 and all(w in text for w in words), text


@pytest.mark.parametrize("override, word", [
    ("tasks.digits.model_overrides.depth=1000000000000", "MemoryError"),  # a list of 10**12 layer specs
    ("tasks.digits.model_overrides.dim=1099511627776", "allocate"),  # a 2**40-wide patch embedding: 16 TiB
])
def test_model_too_large_to_build_is_a_config_problem(tmp_path, capsys, override, word):
    """Bug: a model too large to build (``dim = 2**40``, ``depth = 10**12``) ended ``run`` and ``show`` in a
    traceback of torch's allocator (``RuntimeError: ... can't allocate memory``) or a bare ``MemoryError``, from
    the check that builds every run's model, naming neither the task, the setting nor the overrides: the check
    caught only ``TypeError``, ``ValueError`` and ``NotImplementedError``."""
    config = load_experiment_config(_config(tmp_path), [override])
    problems = validate_experiment(config, load_data=False)
    assert len(problems) == 2, problems  # each setting's model, each named
    for problem, setting in zip(problems, ("attention", "lap")):
        assert f"task 'digits' / setting '{setting}'" in problem and word in problem, problem
        assert override.rpartition(".")[2].split("=")[0] in problem  # the override, key and value, is named
    _refused(capsys, tmp_path, str(_config(tmp_path)), "--set", override)


@pytest.mark.parametrize("value, where, expected", [
    ('{ val_acc = "0.5" }', "reach['val_acc']", "expected a float, got str '0.5'"),
    ("{ val_acc = true }", "reach['val_acc']", "expected a float, got bool True"),
])
def test_optional_table_names_its_bad_item(tmp_path, capsys, value, where, expected):
    """Bug: a table or list field that may be unset (``reach: dict[str, float] | None``) refused a bad item with
    the self-contradictory "reach: expected dict | None, got dict {'val_acc': '0.5'}", naming neither the item nor
    what it should be: the union's check dropped the error of the arm (dict) the value is of."""
    text = _refused(capsys, tmp_path, str(_config(tmp_path)), "--set", f"tasks.digits.reach={value}")
    assert f"tasks[0].{where}: {expected}" in text, text
    assert "expected dict | None" not in text


def test_optional_list_names_its_bad_item(tmp_path, capsys):
    """Bug: a bad item of a per-layer ``laplacian_heads`` list was refused as "laplacian_heads: expected int | str |
    list | None, got list [1.5]", as if a list were not allowed; it names the item and its types now."""
    text = _refused(capsys, tmp_path, str(_config(tmp_path)), "--set", "operators.lap.laplacian_heads=[1.5]")
    assert "operators[1].laplacian_heads[0]: expected int | str, got float 1.5" in text, text


# ------------------------------------------------------------------------------------- the promise, held


@pytest.mark.parametrize("old, new, words", [
    ("seeds = [0]", "seeds = [0]\nseed = 1", ["unknown key 'seed'", "did you mean 'seeds'"]),
    ('metric = "test_acc"', 'metric = "test_acc"\nmetrc = 1', ["tasks[0]: unknown key 'metrc'", "did you mean 'metric'"]),
    ("max_steps = 2", "max_steps = 2\nmax_step = 2", ["unknown TrainConfig key 'max_step'", "did you mean 'max_steps'"]),
    ("dim = 16", "dimm = 16", ["unknown key 'dimm'", "did you mean 'dim'"]),
    ('laplacian_heads = "half"', 'laplacian_heads = "half"\nlaplacian_head = 1', ["operators[1]: unknown key"]),
    ("max_steps = 2", "max_steps = 2.0", ["max_steps: expected int, got float (2.0)"]),
    ("max_steps = 2", "max_steps = true", ["max_steps: expected int, got bool (True)"]),
    ("max_steps = 2", 'max_steps = "2"', ["max_steps: expected int, got str ('2')"]),
    ("max_steps = 2", "max_steps = 0", ["max_steps: expected an int >= 1, got 0"]),
    ("max_steps = 2", "max_steps = 2\nlr = nan", ["lr: expected a finite float, got nan"]),
    ("max_steps = 2", "max_steps = 2\nlr = -inf", ["lr: expected a finite float, got -inf"]),
    ("batch_size = 16", "batch_size = 0", ["batch_size: expected an int >= 1, got 0"]),
    ("dim = 16", "dim = true", ["dim: expected an int, got bool True"]),
    ("mlp_ratio = 1.0", "mlp_ratio = nan", ["mlp_ratio must be a finite float, got nan"]),
    ("seeds = [0]", "seeds = []", ["at least one task, one operator setting and one seed"]),
    ("seeds = [0]", "seeds = [0, 0]", ["duplicate seeds: [0, 0]"]),
    ("seeds = [0]", "seeds = [true]", ["seeds[0]: expected an int, got bool True"]),
    ("seeds = [0]", "seeds = [-1]", ["TrainConfig.seed: expected an int >= 0, got -1"]),
    ('name = "lap"', 'name = "attention"', ["duplicate operator setting names: ['attention']"]),
    ('name = "lap"', 'name = "Attention"', ["'attention' and 'Attention' differ only in case"]),
    ('name = "lap"', 'name = "attention "', ["got 'attention '"]),
    ('name = "lap"', 'name = "a/b"', ["got 'a/b'"]),
    ('name = "lap"', 'name = ".."', ["got '..'"]),
    ('name = "tiny"', 'name = "../tiny"', ["experiment name", "got '../tiny'"]),
    ("max_steps = 2", "max_steps = 2\nmax_steps = 3", ["invalid TOML"]),
    ('metric = "test_acc"', 'metric = "test_accc"', ["metric 'test_accc'", "did you mean 'test_acc'"]),
    ('metric = "test_acc"', 'metric = "test_acc"\nreach = {val_acc = nan}', ["finite threshold"]),
    ('metric = "test_acc"', 'metric = "test_acc"\ndata_seed = 18446744073709551616', ["data_seed must be an int"]),
    ('laplacian_heads = "half"', "laplacian_heads = 5", ["laplacian_heads[0] must be an int in [0, 2], got 5"]),
])
def test_wrong_toml_refused_before_training(tmp_path, capsys, old, new, words):
    """Each wrong TOML value is refused by ``run`` naming the key and the value, and nothing is written."""
    assert old in _BASE
    text = _refused(capsys, tmp_path, str(_config(tmp_path, _BASE.replace(old, new, 1))))
    assert all(w in text for w in words), text


@pytest.mark.parametrize("override, words", [
    ("tasks.digitz.train.lr=0.1", ["no entry named 'digitz'", "did you mean 'digits'"]),
    ("tasks.digits.train.lr=nan", ["lr: expected a finite float, got nan"]),
    ("tasks.digits.train.max_steps='3'", ["max_steps: expected int, got str ('3')"]),
    ("tasks.digits.train.betas=[0.9, 1.5]", ["betas[1]: expected a float in [0, 1), got 1.5"]),
    ("seeds.0=1", ["cannot set a key inside a list"]),
    ("operators=lapp", ["no operators named ['lapp']", "did you mean 'lap'"]),
    ("tasks.digits.train.max_steps", ["must look like key.path=value"]),
])
def test_wrong_set_refused_before_training(tmp_path, capsys, override, words):
    text = _refused(capsys, tmp_path, str(_config(tmp_path)), "--set", override)
    assert all(w in text for w in words), text


def test_comment_order_and_inline_spelling_are_one_identity_and_a_change_is_told(tmp_path, capsys):
    """Comments, key order and an inline table spelt as a table resume the finished runs; a changed budget is
    refused naming the change, and the finished run is left as it was."""
    out = str(tmp_path / "out")
    rc, text = _run(capsys, "run", str(_config(tmp_path)), "--out", out, "--no-progress")
    assert rc == 0, text
    summary = tmp_path / "out" / "tiny" / "runs" / "digits" / "lap" / "seed0" / "summary.json"
    before = summary.read_bytes()
    same = (_BASE.replace("max_steps = 2\nbatch_size = 16", "# a comment\nbatch_size = 16  # why\nmax_steps = 2")
            .replace("model_overrides = { dim = 16, depth = 1, num_heads = 2, mlp_ratio = 1.0 }\n", "")
            .replace("[tasks.train]", "[tasks.model_overrides]\nmlp_ratio = 1.0\nnum_heads = 2\ndepth = 1\ndim = 16\n"
                     "[tasks.train]"))
    rc, text = _run(capsys, "run", str(_config(tmp_path, same, "same.toml")), "--out", out, "--no-progress")
    assert rc == 0, text
    assert summary.read_bytes() == before  # resumed as finished, not trained again
    changed = _config(tmp_path, _BASE.replace("max_steps = 2", "max_steps = 3"), "changed.toml")
    rc, text = _run(capsys, "run", str(changed), "--out", out, "--no-progress")
    assert rc == 2 and "max_steps: 2 then 3" in text and "--restart" in text, text
    assert summary.read_bytes() == before


def test_run_stopped_before_its_first_checkpoint_starts_again_under_the_corrected_config(tmp_path, capsys):
    """Bug: a run that stopped before its first checkpoint (a batch too large for the memory, fixed by lowering
    ``batch_size``) left its ``run_config.json`` behind, and the corrected config was refused, "holds a run ...
    made with a different train (batch_size: ... then 16); pass --restart", though nothing of that run could be
    continued and ``--restart`` discards and retrains every run of the chosen tasks. It starts again, told."""
    out = str(tmp_path / "out")
    rc, text = _run(capsys, "run", str(_config(tmp_path)), "--out", out, "--no-progress")
    assert rc == 0, text
    rdir = tmp_path / "out" / "tiny" / "runs" / "digits" / "lap" / "seed0"
    (rdir / "checkpoint.pt").unlink()  # as a run killed before its first checkpoint leaves it: a log, no checkpoint
    (rdir / "summary.json").unlink()
    other = tmp_path / "out" / "tiny" / "runs" / "digits" / "attention" / "seed0" / "summary.json"
    before = other.read_bytes()
    lower = _config(tmp_path, _BASE.replace("batch_size = 16", "batch_size = 8"), "lower.toml")
    # the lap run alone: it starts again, the finished attention run is left as it is
    rc, text = _run(capsys, "run", str(lower), "--out", out, "--no-progress", "--set", "operators=lap")
    assert rc == 0, text
    assert "batch_size: 16 then 8" in text and "stopped before its first checkpoint" in text, text
    assert json.loads((rdir / "summary.json").read_text())["status"] == "completed"
    assert json.loads((rdir / "run_config.json").read_text())["train"]["batch_size"] == 8
    steps = [json.loads(line)["step"] for line in (rdir / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["split"] == "train"]
    assert steps == [1, 2], steps  # the log of the earlier run is not kept beside the new one's
    assert other.read_bytes() == before
    rc, text = _run(capsys, "run", str(lower), "--out", out, "--no-progress")  # a finished run: still refused
    assert rc == 2 and "batch_size: 16 then 8" in text and "--restart" in text, text


def test_status_does_not_advise_restart_for_a_run_stopped_before_its_first_checkpoint(tmp_path, capsys):
    """Bug: ``status`` reported a run that stopped before its first checkpoint, under a corrected config, as "made
    with another train (batch_size: 16 then 8): `run --restart` redoes it", where a plain ``run`` starts it again
    (and ``--restart`` retrains every run of the task); a finished run of another budget is still reported."""
    out = str(tmp_path / "out")
    rc, text = _run(capsys, "run", str(_config(tmp_path)), "--out", out, "--no-progress")
    assert rc == 0, text
    rdir = tmp_path / "out" / "tiny" / "runs" / "digits" / "lap" / "seed0"
    (rdir / "checkpoint.pt").unlink()
    (rdir / "summary.json").unlink()
    lower = _config(tmp_path, _BASE.replace("batch_size = 16", "batch_size = 8"), "lower.toml")
    rc, text = _run(capsys, "status", str(lower), "--out", out)
    assert rc == 0, text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    lap = [line for line in rows if line.startswith("| lap |")]
    attention = [line for line in rows if line.startswith("| attention |")]
    assert lap and attention, text
    assert "batch_size" not in lap[0] and "--restart" not in lap[0], lap
    assert "batch_size: 16 then 8" in attention[0] and "--restart" in attention[0], attention


@pytest.mark.parametrize("name, char", [
    ("atten\u200btion", "U+200B ZERO WIDTH SPACE"),  # prints as the baseline's name
    ("lap\u202eabc", "U+202E RIGHT-TO-LEFT OVERRIDE"),  # prints as "lapcba"
    ("lap\ufeff", "U+FEFF ZERO WIDTH NO-BREAK SPACE"),
])
def test_invisible_characters_in_a_name_refused(tmp_path, capsys, name, char):
    """Bug: a setting named ``"atten\\u200btion"`` (a zero-width space inside) was accepted beside ``attention``:
    two run folders and two table rows that print alike; a right-to-left override made a name print as another.
    The names' check refused control characters (category Cc) and whitespace, not these format characters (Cf)."""
    text = _refused(capsys, tmp_path, str(_config(tmp_path, _BASE.replace('name = "lap"', f'name = "{name}"'))))
    assert "operator setting name must not hold invisible format characters" in text and char in text, text



def test_bug_only_allocation_failures_read_as_a_model_too_large():
    """Bug: any RuntimeError whose text held "out of memory" (a bug's own error, a user model's "ran out of memory
    budget") was reported as "cannot be built ..., too large for this machine's memory" instead of raised. Only
    torch's OutOfMemoryError and its CPU allocator's error are allocation failures."""
    import torch

    from diffusionformer.experiments.validate import _out_of_memory

    try:
        torch.empty(2**62, dtype=torch.uint8)
    except RuntimeError as exc:  # the CPU allocator's own text, whatever this torch's wording around it
        assert _out_of_memory(exc), exc
    assert _out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not _out_of_memory(RuntimeError("my cache ran out of memory budget: a bug"))
    assert not _out_of_memory(RuntimeError("shape mismatch"))
