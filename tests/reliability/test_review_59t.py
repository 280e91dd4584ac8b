"""Review 59t of 5751f72 and 4d3f294, as a reviewer who assumes each has a bug.

- 5751f72: ``check_task`` told a task's class given for an instance by its methods being plain functions
  (``types.FunctionType`` from ``inspect.getattr_static``): a class whose methods are other descriptors that bind the
  instance (``functools.partialmethod``, ``functools.lru_cache``/``cache``, a method of a C type) was still accepted
  and failed at the first step; and a class whose methods its metaclass provides (bound to the class: a valid task,
  which ``getattr_static`` finds on the metaclass) was refused.
- 4d3f294: the inherited-name refusal ("give it a name of its own") was limited to a holder in the class's MRO, so a
  *sibling* (another class inheriting its name from the same unregistered base) got the advice for a class defined
  again: unregister the holder first, which removes the other, unrelated operator.
"""

from __future__ import annotations

import functools

import pytest
import torch


# ---------------------------------------------------------------------------- 5751f72: the class given for a task
class _Meta(type):
    def train_batch(cls, step, generator, batch_size):
        return None

    def loss(cls, model, batch):
        return None

    def evaluate(cls, model, max_batches):
        return {}


def test_bug_a_task_class_whose_methods_bind_without_being_functions_was_accepted():
    """Bug: a class with ``partialmethod`` or ``lru_cache``'d methods (or methods of a C type) given for its instance
    passed ``check_task`` (not ``types.FunctionType``), and its first step failed with "missing 1 required positional
    argument: 'batch_size'". Refused, naming the class, as for plain functions."""
    from diffusionformer.train import check_task

    class Partial:
        train_batch = functools.partialmethod(lambda self, step, generator, batch_size, k: None, k=1)
        loss = functools.partialmethod(lambda self, model, batch, k: None, k=1)
        evaluate = functools.partialmethod(lambda self, model, max_batches, k: {}, k=1)

    class Cached:
        @functools.lru_cache
        def train_batch(self, step, generator, batch_size):
            return None

        @functools.cache
        def loss(self, model, batch):
            return None

        def evaluate(self, model, max_batches):
            return {}

    class OfC(dict):
        train_batch = loss = evaluate = dict.get

    for cls in (Partial, Cached, OfC):
        with pytest.raises(TypeError, match=rf"got the class {cls.__name__} itself \(instance methods: train_batch, "
                                            rf"loss, evaluate\): pass {cls.__name__}\(\.\.\.\)$"):
            check_task(cls)
    check_task(Partial())
    check_task(Cached())


def test_bug_a_task_class_whose_metaclass_provides_the_methods_was_refused():
    """Bug: methods of the metaclass are bound to the class (``Cls.train_batch(step, generator, batch_size)`` works),
    but ``getattr_static`` found them on the metaclass as functions and the class was refused as "the class itself".
    Static, class and bound methods of the class stay accepted."""
    from diffusionformer.train import check_task

    class ByMeta(metaclass=_Meta):
        pass

    check_task(ByMeta)
    assert ByMeta.train_batch(0, torch.Generator(), 4) is None

    class Holder:
        def method(self, *args):
            return None

    bound = Holder().method

    class Mixed:
        train_batch = staticmethod(lambda step, generator, batch_size: None)
        loss = bound

        @classmethod
        def evaluate(cls, model, max_batches):
            return {}

    check_task(Mixed)


# ---------------------------------------------------------------------------- 4d3f294: a sibling holds the name
def test_bug_a_sibling_inheriting_the_same_name_told_to_unregister_the_other():
    """Bug: ``Second(Base)``, where ``First(Base)`` already holds the name both inherit from the unregistered ``Base``,
    was told "already registered by First; to replace it (a class defined again), call unregister_operator(...)
    first", which removes ``First``, another operator. It is told to give itself a name (as before 4d3f294); the
    class defined again (same module and qualified name) keeps the replace advice."""
    from diffusionformer.operators import DiffusionOperator, register_operator, unregister_operator

    class Base(DiffusionOperator):
        name = "review59t-base"
        degree = 1

        def coefficients(self):
            return torch.tensor([0.5, 0.5])

    def cell():
        class First(Base):
            pass

        return First

    register_operator(cell())
    try:
        class Second(Base):
            pass

        with pytest.raises(ValueError, match=r"^Second has no registry name of its own: it inherits 'review59t-base' "
                                             r"from Base, which First holds; give it one"):
            register_operator(Second)

        class Mixin:
            pass

        class Third(Mixin, Base):  # a mixin first in its bases: a sibling all the same
            pass

        with pytest.raises(ValueError, match=r"^Third has no registry name of its own"):
            register_operator(Third)

        with pytest.raises(ValueError, match=r"already registered by First; to replace it \(a class defined again\)"):
            register_operator(cell())
    finally:
        unregister_operator("review59t-base")
