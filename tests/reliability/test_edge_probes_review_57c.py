"""Review of 04822a6 (``assert_operator`` checks that ``build_operator(op.spec())`` rebuilds the operator): the
harness promises an ``AssertionError`` naming the law that fails, also when an operator's own ``spec_kwargs()``
or the constructor it hands the spec back to fails with an error of another type."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.operators import DiffusionOperator, register_operator, unregister_operator
from diffusionformer.testing import assert_operator


class _Table(DiffusionOperator):
    """A fixed two-term operator looked up by ``kind`` (a research operator's table of presets)."""

    name = "probe57c-table"
    TABLE = {"half": (0.5, 0.5), "mostly-p": (0.2, 0.8)}

    def __init__(self, kind: str = "half", num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.kind = kind
        self._static = self.TABLE[kind]  # an unknown kind: KeyError
        self.register_buffer("_c", torch.tensor(self._static, dtype=torch.float64), persistent=False)

    @property
    def degree(self) -> int:
        return 1

    def coefficients(self) -> torch.Tensor:
        return self._c

    def static_coefficients(self) -> tuple[float, ...]:
        return self._static


class _TableWrongKind(_Table):
    name = "probe57c-table-wrong"

    def spec_kwargs(self) -> dict:
        return {"kind": self.kind.upper()}  # written in another case than the table's keys


class _TableAsserts(_Table):
    name = "probe57c-table-asserts"

    def __init__(self, kind: str = "half", num_heads: int = 1) -> None:
        assert kind in self.TABLE, f"unknown kind {kind}"  # research code's bare assert
        super().__init__(kind, num_heads)

    def spec_kwargs(self) -> dict:
        return {"kind": "Half"}


class _TableBrokenSpec(_Table):
    name = "probe57c-table-broken"

    def spec_kwargs(self) -> dict:
        return {"kind": self.preset}  # no such attribute: AttributeError


@pytest.fixture
def registered():
    names = []

    def reg(cls):
        register_operator(cls)
        names.append(cls.name)

    yield reg
    for name in names:
        unregister_operator(name)


def test_a_spec_whose_constructor_raises_a_key_error_is_a_failed_law(registered):
    # the check caught TypeError, ValueError and RuntimeError only: the constructor's KeyError 'HALF' came out bare,
    # naming neither the operator nor its spec
    registered(_TableWrongKind)
    with pytest.raises(AssertionError, match=r"probe57c-table-wrong: spec\(\) \"probe57c-table-wrong\(kind='HALF'\)\" "
                                             r"does not rebuild it \(KeyError: 'HALF'\).*spec_kwargs"):
        assert_operator("probe57c-table-wrong")


def test_a_spec_refused_by_a_bare_assert_of_the_constructor_names_the_spec(registered):
    # an AssertionError of the constructor's own came out as the harness's verdict, with no word of spec()
    registered(_TableAsserts)
    with pytest.raises(AssertionError, match=r"probe57c-table-asserts: spec\(\) .* does not rebuild it "
                                             r"\(AssertionError: unknown kind Half"):
        assert_operator("probe57c-table-asserts")


def test_a_spec_kwargs_that_raises_is_a_failed_law(registered):
    # assert_operator did not call spec() before 04822a6: such an operator passed, then met a bare AttributeError
    registered(_TableBrokenSpec)
    with pytest.raises(AssertionError, match=r"probe57c-table-broken: spec\(\) raised AttributeError: .*preset"):
        assert_operator("probe57c-table-broken")


def test_a_table_operator_whose_spec_rebuilds_it_passes(registered):
    class _TableWithSpec(_Table):
        name = "probe57c-table-spec"

        def spec_kwargs(self) -> dict:
            return {"kind": self.kind}

    registered(_TableWithSpec)
    assert_operator("probe57c-table-spec", kind="mostly-p")
    assert_operator("probe57c-table-spec", kind="mostly-p", dtype=torch.float32)


def test_a_polynomial_initialised_from_a_trained_operator_records_the_coefficients_it_started_from():
    # the spec recorded the trained heat's constructor arguments (t=0.7) though theta started from the trained
    # t=2.0's coefficients: a model rebuilt from its config (the next fold, a rerun) started elsewhere, and the
    # rebuilt operator's reset_parameters() went to another point than the original's
    from diffusionformer.operators import build_operator

    heat = build_operator("heat", t=0.7, steps=2, learnable=True)
    with torch.no_grad():
        heat.t.fill_(2.0)
    poly = build_operator("polynomial", steps=3, init=heat)
    rebuilt = build_operator(poly.spec())
    torch.testing.assert_close(rebuilt.theta, poly.theta, rtol=0, atol=0)
    rebuilt.reset_parameters()
    poly.reset_parameters()
    torch.testing.assert_close(rebuilt.theta, poly.theta, rtol=0, atol=0)
    # an untrained instance keeps its readable spec
    fresh = build_operator("polynomial", steps=3, init=build_operator("heat", t=0.7, steps=2, learnable=True))
    assert fresh.spec() == "polynomial(steps=3, init=\"heat(t=0.7, steps=2, method='taylor', learnable=True)\")"
