"""User walk 59o: a researcher adds a new diffusion operator (each test's docstring says what was wrong)."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.operators import (DiffusionOperator, HeatOperator, build_operator, list_operators,
                                      register_operator, unregister_operator)


class _LazyWalk(DiffusionOperator):
    """``f(P) = (1 - a) I + a P``, a fixed lazy random walk."""

    name = "walk59o-lazy"

    def __init__(self, a: float = 0.5, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.a = float(a)
        self._static = (1.0 - self.a, self.a)
        self.register_buffer("_c", torch.tensor(self._static), persistent=False)

    @property
    def degree(self) -> int:
        return 1

    def coefficients(self) -> torch.Tensor:
        return self._c

    def static_coefficients(self) -> tuple[float, ...]:
        return self._static

    def spec_kwargs(self) -> dict:
        return {"a": self.a}


@pytest.fixture
def lazy_walk():
    """``_LazyWalk`` registered for the test, unregistered afterwards."""
    register_operator(_LazyWalk)
    try:
        yield _LazyWalk
    finally:
        unregister_operator("walk59o-lazy")


def test_a_subclass_registered_without_a_name_of_its_own_is_not_told_to_unregister_its_parent(lazy_walk):
    """Bug: a subclass of a registered operator (a built-in's or a user's) decorated with ``@register_operator``
    without a ``name`` of its own inherits its parent's, and the refusal read "operator name 'heat' is already
    registered by HeatOperator; to replace it (a class defined again), call unregister_operator('heat') first":
    advice for a notebook cell run twice, which here unregistered the built-in (or the parent) the new operator
    derives from. The message says that the name is inherited and how to give the class its own; the registry is
    left as it was, and the subclass registers once it is named."""

    class LearnedHeat(HeatOperator):
        def coefficients(self):
            return 2 * super().coefficients()

    with pytest.raises(ValueError, match=r"^LearnedHeat has no registry name of its own: it inherits 'heat' from "
                                         r"HeatOperator.*register_operator\(name=") as err:
        register_operator(LearnedHeat)
    assert "unregister_operator" not in str(err.value)
    assert type(build_operator("heat")) is HeatOperator and "LearnedHeat" not in repr(list_operators())

    class Lazier(lazy_walk):  # a user's registered parent, two levels up the same way
        pass

    class Laziest(Lazier):
        aliases = ("walk59o-laziest-alias",)

    with pytest.raises(ValueError, match=r"^Laziest has no registry name of its own: it inherits 'walk59o-lazy' "
                                         r"from _LazyWalk"):
        register_operator(Laziest)
    assert "walk59o-laziest-alias" not in str(list_operators()) and type(build_operator("walk59o-lazy")) is lazy_walk
    try:
        register_operator(Laziest, name="walk59o-laziest")
        assert build_operator("walk59o-laziest-alias(a=0.25)").spec() == "walk59o-laziest(a=0.25)"
    finally:
        unregister_operator("walk59o-laziest")


def test_a_class_defined_again_is_still_told_how_to_replace_it(lazy_walk):
    """The notebook advice stays where it applies: a class that declares the taken name itself (a cell run twice)
    is told to unregister the holder first."""

    class Again(DiffusionOperator):
        name = "walk59o-lazy"
        degree = 0

        def coefficients(self):
            return torch.ones(1)

    with pytest.raises(ValueError, match=r"already registered by _LazyWalk; to replace it .*"
                                         r"unregister_operator\('walk59o-lazy'\) first"):
        register_operator(Again)
