"""Hostile experiment configs (round 61e): values that ``show`` accepted and that then failed a run once it had
trained, or that were refused with a message naming no key.

* ``eval_batch_size = 2**63`` passed every check (only ``< 1`` was refused), then the first evaluation of a text task,
  after its training steps, failed in torch with "Overflow when unpacking long long" and a C++ backtrace, naming no
  key; ``train.batch_size`` is bounded by ``sys.maxsize`` for that reason since round 58. Through the Python API a
  float or bool size was accepted (the task adapter refused it only at that task's first run) and a string raised
  a bare comparison ``TypeError``.
* ``reach = { val_acc = 90 }`` (a percentage, as the tables print accuracies) passed every check: each run trained to
  its end without reaching it and was reported censored; a negative threshold was met at every first evaluation.
* From Python, a task's ``model_overrides`` / ``dataset_options`` / ``train`` / ``augment`` or a setting's
  ``model_overrides`` that is not a table, or a ``metric`` that is not a string, was accepted and failed later with a
  bare "'int' object is not iterable" (or ``AttributeError``) naming neither the entry nor the key.
* ``laplacian_heads = "half"`` on a model of one head per layer is ``1 // 2 = 0`` heads: the setting trained the
  baseline's attention-only model under its own name, and its difference of exactly 0 was reported, without a word.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from diffusionformer.experiments import OperatorSetting, TaskConfig
from diffusionformer.experiments.cli import main
from experiments_tiny_configs import TINY_DIGITS_USER_TOML as _DIGITS  # tests/experiments, on the path (conftest.py)

# a text task: its evaluation draws eval_batch_size windows at once (an image task slices its split, any size fits)
_TEXT = """name = "g"
seeds = [0]
[[tasks]]
name = "t"
dataset = "pydoc-chars"
model = "gpt-char-tiny"
metric = "val_loss"
EXTRA
[tasks.train]
max_steps = 2
batch_size = 4
eval_interval = 2
eval_steps = 1
[[operators]]
name = "attention"
"""


@pytest.mark.parametrize("size", [sys.maxsize + 1, 10**30])
def test_eval_batch_size_past_a_tensor_size_refused_before_training(tmp_path, capsys, size):
    """Bug: ``eval_batch_size = 2**63`` passed ``run``'s checks; the text task trained, then its first evaluation
    failed in torch ("Overflow when unpacking long long", a C++ backtrace naming no key). Now the config is refused
    naming the task and the key, and nothing is written."""
    path = tmp_path / "c.toml"
    path.write_text(_TEXT.replace("EXTRA", f"eval_batch_size = {size}"), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert not out.exists(), sorted(out.rglob("*"))
    assert f"task 't': eval_batch_size must be positive, an int at most {sys.maxsize}" in captured.err, captured
    assert "Overflow" not in captured.out + captured.err, captured


@pytest.mark.parametrize("size", [2.5, True, "64"])
def test_eval_batch_size_not_an_int_refused_by_the_task_config(size):
    """Bug: ``TaskConfig(eval_batch_size=2.5)`` (or ``True``) was accepted, so ``run_experiment`` trained every task
    before it and then refused the task's adapter; ``"64"`` raised a bare "'<=' not supported between instances of
    'int' and 'str'". Now each is refused at once, naming the task and the key."""
    with pytest.raises(ValueError, match=rf"task 't': eval_batch_size must be positive, an int at most {sys.maxsize}"):
        TaskConfig("t", "digits", "vit-digits", eval_batch_size=size)


def test_eval_batch_size_of_a_numpy_int_is_the_int_it_equals():
    """The largest tensor size is accepted; a sweep grid's numpy int is kept as the Python int it equals (as
    ``data_seed``)."""
    assert TaskConfig("t", "digits", "vit-digits", eval_batch_size=sys.maxsize).eval_batch_size == sys.maxsize
    size = TaskConfig("t", "digits", "vit-digits", eval_batch_size=np.int64(8)).eval_batch_size
    assert type(size) is int and size == 8


def _show(tmp_path, capsys, text: str) -> tuple[int, str]:
    """``show`` of the config ``text``: its status and output."""
    path = tmp_path / "c.toml"
    path.write_text(text, encoding="utf-8")
    rc = main(["show", str(path)])
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


@pytest.mark.parametrize("threshold, words", [
    ("90", "reach {val_acc = 90}: val_acc is an accuracy, a fraction in [0, 1], so no run can reach it "
           "(a percentage? As a fraction: 0.9)"),
    ("1.5", "reach {val_acc = 1.5}: val_acc is an accuracy, a fraction in [0, 1], so no run can reach it "
            "(a percentage? As a fraction: 0.015)"),
    ("-0.5", "reach {val_acc = -0.5}: val_acc is an accuracy, a fraction in [0, 1], so every run meets it at once"),
])
def test_reach_of_an_accuracy_outside_0_1_refused_before_training(tmp_path, capsys, threshold, words):
    """Bug: ``reach = { val_acc = 90 }`` (a percentage, as the result tables print accuracies) passed ``show`` and
    ``run``: every run trained to its end without reaching it, and the steps-to-threshold table reported each one
    censored; a negative threshold was met at every first evaluation. Now both are refused naming the task."""
    text = _DIGITS.replace('metric = "test_acc"', f'metric = "test_acc"\nreach = {{ val_acc = {threshold} }}', 1)
    rc, out = _show(tmp_path, capsys, text)
    assert rc == 2 and f"task 'digits': {words}" in out, out


@pytest.mark.parametrize("reach", ["val_acc = 0.9", "val_acc = 1.0", "val_acc = 0", "loss = 5.0"])
def test_reach_of_an_accuracy_inside_0_1_accepted(tmp_path, capsys, reach):
    """The bounds are those of an accuracy (1.0 and 0 included); a loss threshold has none."""
    text = _DIGITS.replace('metric = "test_acc"', f'metric = "test_acc"\nreach = {{ {reach} }}', 1)
    rc, out = _show(tmp_path, capsys, text)
    assert rc == 0, out


@pytest.mark.parametrize("key, value, got", [
    ("model_overrides", 5, "int"), ("dataset_options", 5, "int"), ("train", 5, "int"), ("augment", ["flip"], "list"),
])
def test_task_table_of_another_type_refused_naming_the_key(key, value, got):
    """Bug: from Python (a sweep building its configs), ``TaskConfig(model_overrides=5)`` raised "'int' object is not
    iterable" and ``augment=["flip"]`` "'list' object has no attribute 'get'", naming neither the task nor the key
    (a TOML file is type-checked before the dataclass, ``ssl`` and ``minibatch`` were checked here already)."""
    with pytest.raises(TypeError, match=rf"^task 't': {key}: expected a table/dict, got {got}$"):
        TaskConfig("t", "digits", "vit-digits", **{key: value})


def test_task_metric_not_a_string_refused_naming_it():
    """Bug: ``TaskConfig(metric=3)`` was accepted; the check of the comparison then ended with "'int' object is not
    iterable", naming no task or key."""
    with pytest.raises(TypeError, match=r"^task 't': metric: expected a string, got int 3$"):
        TaskConfig("t", "digits", "vit-digits", metric=3)


@pytest.mark.parametrize("value, got", [(5, "int"), ([("dim", 8)], "list")])
def test_setting_model_overrides_of_another_type_refused_naming_it(value, got):
    """Bug: ``OperatorSetting("b", model_overrides=5)`` was accepted, then the check of every task failed with
    "'int' object has no attribute 'items'"; now refused at once, naming the setting and the key."""
    with pytest.raises(TypeError, match=rf"^operator setting 'b': model_overrides: expected a table/dict, got {got}$"):
        OperatorSetting("b", model_overrides=value)


_HALF_OF_ONE = "laplacian_heads = 'half' gives model 'vit-digits' no Laplacian head ('half' is H // 2 of its H heads"


def _half_warnings(recwarn) -> list[str]:
    return [str(w.message) for w in recwarn if _HALF_OF_ONE in str(w.message)]


def test_laplacian_heads_half_of_a_single_head_warned_once_by_run(tmp_path, capsys, recwarn):
    """Bug: ``laplacian_heads = "half"`` on a model of one head per layer is ``1 // 2 = 0`` Laplacian heads: the
    setting "lap" trained the baseline's attention-only model under its own name, and the table reported its
    difference to attention (exactly 0) as a result, without a word. Now ``run`` warns, once, naming task and
    setting (the per-task check before its runs does not repeat it)."""
    path = tmp_path / "c.toml"
    path.write_text(_DIGITS.replace("num_heads = 2", "num_heads = 1", 1), encoding="utf-8")
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    capsys.readouterr()
    found = _half_warnings(recwarn)
    assert len(found) == 1 and found[0].startswith("task 'digits' / setting 'lap': "), found


@pytest.mark.parametrize("heads, warned", [(1, 1), (2, 0), (3, 0)])
def test_laplacian_heads_half_warned_by_show_only_where_it_is_zero(tmp_path, capsys, recwarn, heads, warned):
    """``show`` warns as well; "half" of 2 or 3 heads is 1 Laplacian head, and no warning."""
    text = _DIGITS.replace("num_heads = 2", f"num_heads = {heads}", 1).replace("dim = 16", f"dim = {6 * heads}", 1)
    rc, out = _show(tmp_path, capsys, text)
    assert rc == 0, out
    assert len(_half_warnings(recwarn)) == warned, [str(w.message) for w in recwarn]
