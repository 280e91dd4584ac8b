"""Edge-case probes of the functional API, the operator registry and head-layout specs (probe round)."""

from __future__ import annotations

import re

import pytest
import torch

from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.heads import parse_heads
from diffusionformer.operators import DiffusionOperator, build_operator, list_operators, operator_class
from diffusionformer.operators.registry import parse_operator_spec, register_operator, unregister_operator


def _halfway() -> type[DiffusionOperator]:
    class Halfway(DiffusionOperator):
        degree = 1

        def coefficients(self) -> torch.Tensor:
            return torch.tensor([0.5, 0.5])

    return Halfway


def test_bug_per_head_list_num_heads_refused() -> None:
    """Bug: a per-head list entry 'heat(num_heads=3)' was built with num_heads=1 silently (the layer's num_heads=1
    overrode the spec's), while the same item in a spec string, 'heat(num_heads=3):1', is refused."""
    with pytest.raises(ValueError, match=r"num_heads must be 1 \(the item serves one head\), got 3"):
        parse_heads(["heat(num_heads=3)", "attention"], 2)
    with pytest.raises(ValueError, match=r"num_heads must be 1 \(the item serves one head\), got 3"):
        DiffusionAttention(8, 2, heads=["attention", "heat(learnable=True, num_heads=3)"])
    with pytest.raises(ValueError, match=r"'heat\(num_heads=3\)':1: num_heads must be 1 \(the item serves one head\)"):
        parse_heads("heat(num_heads=3):1,attention:1", 2)
    # num_heads=1, or none, is what a per-head entry is: still accepted
    groups = parse_heads(["heat(num_heads=1, learnable=True)", "attention", "ppr"], 3)
    assert [(g.operator.name, g.operator.num_heads, g.count) for g in groups] == [
        ("heat", 1, 1), ("attention", 1, 1), ("ppr", 1, 1)]


def test_bug_register_blank_alias_refused() -> None:
    """Bug: register_operator accepted an empty or blank alias ('' or '  '), documented as a ValueError: the operator
    was then what operator_class('') and any blank name resolved to."""
    for blank in ("", "   ", "\t"):
        cls = _halfway()
        with pytest.raises(ValueError, match=re.escape(f"Halfway: aliases must be non-empty names, got {blank!r}")):
            register_operator(cls, name="probe-blank-alias", aliases=("probe-ok", blank))
        assert "probe-blank-alias" not in list_operators()  # nothing half-registered
        with pytest.raises(ValueError, match="unknown operator"):
            operator_class("probe-ok")
    with pytest.raises(ValueError, match="unknown operator ''"):
        operator_class("")
    # aliases from a generator (read once) still register
    cls = register_operator(_halfway(), name="probe-gen-alias", aliases=(a for a in ("probe-g1", "Probe G2")))
    try:
        assert cls.aliases == ("probe-g1", "probe-g2")
        assert operator_class("probe_g2") is cls
    finally:
        unregister_operator("probe-gen-alias")
    assert "probe-gen-alias" not in list_operators()


def test_bug_parse_operator_spec_non_str() -> None:
    """Bug: parse_operator_spec(3) failed with re's "expected string or bytes-like object, got 'int'", which names
    no argument."""
    with pytest.raises(TypeError, match=r"operator spec must be a str, got int \(3\)"):
        parse_operator_spec(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"operator spec must be a str, got bytes"):
        parse_operator_spec(b"heat")  # type: ignore[arg-type]
    assert parse_operator_spec(" heat ( t=0.5 ) ") == ("heat", {"t": 0.5})
    assert build_operator("Heat_Exact").name == "heat-exact"
