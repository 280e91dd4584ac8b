"""Mutation audit (59p) of the two least-audited library modules with logic of their own: ``_modes.py``
(:func:`_evaluating`, the eval mode shared by concurrent read-only passes) and ``train/task.py`` (:func:`check_task`).
Before this audit the mutation tests named each in one or two files (``_modes.py`` 5 mutants in sitting 47,
``train/task.py`` 6 in sitting 48 and 5 in the tasks/minibatch second pass).

44 mutants (``_modes.py`` 22, ``train/task.py`` 22), run against the covering tests (the two modules' users:
``generate``, ``attention_maps``, ``capture_dataset``, ``analyze_run``, ``Trainer``; and ``task.py``'s doctest):
31 killed by earlier tests, 13 survived; 6 of them killed here; 5 more mutants of the fix below, all killed here.
One real bug, fixed:

* ``check_task`` accepted the task's *class* given where an instance belongs (``Trainer(model, MyTask, ...)``): its
  methods are plain functions, callable, so the check passed and the first training step failed with
  ``MyTask.train_batch() missing 1 required positional argument: 'batch_size'`` (the trainer passes all three; the
  step went to ``self``). It is now refused, naming the class; a class whose methods are static or class methods
  (a task as a namespace) is still a task.

Survivors left alive:

* equivalent: ``model.eval()`` -> ``model.train(False)`` (what ``eval`` is); ``module.training = mode`` ->
  ``module.train(mode)`` (``modules()`` lists a parent before its children, so each module's own mode is set last; it
  differs only for a module that overrides ``train``); ``weakref.WeakKeyDictionary()`` -> ``{}`` (an entry lives
  only while a call runs: every user is a plain function whose ``finally`` removes it); ``del _EVAL_HOLDS[model]`` ->
  ``_EVAL_HOLDS.pop(model, None)``; ``if hold[0] == 0`` -> ``if hold[0] == 0 and hold[1]`` (``modules()`` always
  lists the model itself).
* not deterministically killable: the lock dropped around the exit's ``hold[0] -= 1`` and ``if hold[0] == 0`` (a race
  between two bytecodes of two threads, which no test can force without a hook between them).
* not pinned: ``model.eval()`` on every call instead of the first (differs only when the user switches the model
  back to training while another call is evaluating it, a race of the user's own, where the mutant is no worse).

Found, not fixed: holds are kept per model object, so concurrent calls on two models that share modules (a wrapper
and the model inside it) do not join: when the wrapper's call ends first it puts the inner model's modules back in
training mode while the inner call still runs, and the inner call then leaves them in eval mode (a per-module hold
count would fix it; a design change to a concurrency helper, for a rare use).
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from torch import nn

from diffusionformer._modes import _evaluating
from diffusionformer.train import TrainConfig, Trainer, check_task


def _train_batch(self, step, generator, batch_size):
    return None


def _loss(self, model, batch):
    return None


def _evaluate(self, model, max_batches):
    return {}


class _Task:
    train_batch, loss, evaluate = _train_batch, _loss, _evaluate


# ---------------------------------------------------------------------------- train/task.py
def test_bug_check_task_refuses_the_task_class_given_for_an_instance(tmp_path):
    """A task's class passed where its instance belongs: its methods are functions (callable), so ``check_task``
    accepted it and the first step failed with "train_batch() missing 1 required positional argument: 'batch_size'"
    (``step`` had gone to ``self``). Refused at construction, naming the class."""
    whose = r"got the class _Task itself \(instance methods: train_batch, loss, evaluate\): pass _Task\(\.\.\.\)$"
    with pytest.raises(TypeError, match=whose):
        check_task(_Task)
    with pytest.raises(TypeError, match=r"got the class _Task itself"):
        Trainer(nn.Linear(2, 2), _Task, TrainConfig(max_steps=1), tmp_path / "run")
    check_task(_Task())


def test_check_task_accepts_a_class_whose_methods_need_no_instance():
    """Pin for the fix above: a class used as a namespace of static (or class) methods follows the protocol (its
    methods take exactly the trainer's arguments), so it is not refused for being a class; one instance method
    among them is refused, naming that one (kills the check refusing only a class with all three, and the message
    listing all three)."""

    class Namespace:
        train_batch = staticmethod(lambda step, generator, batch_size: None)
        loss = staticmethod(lambda model, batch: None)

        @classmethod
        def evaluate(cls, model, max_batches):
            return {}

    check_task(Namespace)

    class OneUnbound(Namespace):
        loss = _loss

    with pytest.raises(TypeError, match=r"got the class OneUnbound itself \(instance methods: loss\): pass"):
        check_task(OneUnbound)


def test_check_task_reads_methods_and_shard_batch_given_as_instance_attributes():
    """kills: task.py ``getattr(task, name, None)`` -> ``getattr(type(task), name, None)`` (a task whose methods are
    instance attributes, a ``SimpleNamespace`` of functions, refused as missing all three) and ``getattr(task,
    "shard_batch", None)`` -> ``getattr(type(task), ...)`` (a non-callable ``shard_batch`` set on the instance let
    through to the trainer, which calls it under DDP)."""
    methods = dict(train_batch=lambda step, generator, batch_size: None, loss=lambda model, batch: None,
                   evaluate=lambda model, max_batches: {})
    check_task(SimpleNamespace(**methods))
    check_task(SimpleNamespace(**methods, shard_batch=lambda batch, rank, world_size: batch))
    with pytest.raises(TypeError, match=r"^task\.shard_batch: expected a callable, got str$"):
        check_task(SimpleNamespace(**methods, shard_batch="rows"))


def test_check_task_refuses_none_naming_its_type():
    """kills: task.py ``if missing:`` -> ``if missing and task is not None:`` (``None`` has none of the methods: the
    docstring's TypeError naming the missing methods, not a task that fails at the first step)."""
    with pytest.raises(TypeError, match=r"got NoneType missing train_batch, loss, evaluate$"):
        check_task(None)


def test_check_task_message_says_what_was_expected_and_where_it_is_described():
    """kills: task.py the message's "(see diffusionformer.train.Task)" dropped, and its expected list made the
    missing methods (``', '.join(_REQUIRED)`` -> ``', '.join(missing)``): the error says what is expected (the whole
    protocol, where it is described) and what came (the type, the methods it lacks)."""

    class NoLoss:
        train_batch, evaluate = _train_batch, _evaluate

    with pytest.raises(TypeError) as info:
        check_task(NoLoss())
    assert str(info.value) == ("task: expected an object with callable train_batch, loss, evaluate (see "
                               "diffusionformer.train.Task), got NoLoss missing loss")


# ---------------------------------------------------------------------------- _modes.py
class _SlowToList(nn.Module):
    """A model whose first ``modules()`` call (the one ``_evaluating`` makes to save every module's mode) takes a
    while, so that a second call can come while the first is saving."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5)
        self.saving = threading.Event()
        self._slow = True

    def modules(self):
        if self._slow:
            self._slow = False
            self.saving.set()
            time.sleep(0.3)
        return super().modules()


def test_evaluating_a_second_call_while_the_first_saves_the_modes_joins_it():
    """kills: _modes.py the lock dropped around ``_EVAL_HOLDS.get(model)`` .. ``hold[0] += 1``: a second call made
    while the first was saving the modes found no hold, made its own, and when it ended put training mode back while
    the first was still running (the docstring: the modes come back "when the last of the calls running at once
    ends"); the first then failed to remove its hold (KeyError)."""
    model = _SlowToList().train()
    errors, seen = [], {}
    b_in, b_release, a_in, a_check = (threading.Event() for _ in range(4))

    def first():
        try:
            with _evaluating(model):
                a_in.set()
                a_check.wait(10)
                seen["first"] = [m.training for m in model.modules()]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def second():
        try:
            with _evaluating(model):
                b_in.set()
                b_release.wait(10)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    a = threading.Thread(target=first)
    a.start()
    assert model.saving.wait(10)
    b = threading.Thread(target=second)
    b.start()
    assert a_in.wait(10) and b_in.wait(10)
    b_release.set()
    b.join(10)
    a_check.set()
    a.join(10)
    assert not a.is_alive() and not b.is_alive()
    assert errors == []
    assert seen["first"] == [False, False]  # still evaluating after the second call ended
    assert [m.training for m in model.modules()] == [True, True]
