"""Mutation audit (sitting 48, commit adfe8a1) of the head-spec canonical form: ``_count_colon``, ``_split_count``,
``_item_as_read``, ``_spec_as_read`` and ``_layout_as_read`` in nn/heads.py, ``_names_as_read`` in nn/block.py, the
configs' ``__post_init__`` (models/gpt.py, vit.py, graph_transformer.py) and ``_setting_definition`` in
experiments/publish.py: tests that kill mutants the day's tests left alive (each docstring names the mutant). No GPU.

36 mutants of the changed lines (nn/heads.py 30, nn/block.py 2, models 3, experiments/publish.py 1): 20 killed by
earlier tests (tests/reliability/test_edge_probes_head_spec_identity_48.py 19, tests/core/test_edge_probes_spec_fuzz.py
1: ``_count_colon`` reading brackets inside quoted values), 2 by tests/reliability/test_edge_probes_head_spec_read_48.py
(a tuple layout read as a list; a tuple layout not read), 11 survivors killed here, 3 equivalent:

* ``_item_as_read``: dropping ``operator_class(back_name) is not cls or`` -- a registered name always resolves to
  its class (``register_operator`` refuses a name specs cannot read back);
* ``_spec_as_read``: ``except (ValueError, TypeError)`` -> ``except ValueError`` -- nothing under it raises TypeError
  any more (``parse_operator_spec`` reports an unhashable literal as ValueError);
* ``_names_as_read``: ``k == "heads"`` -> ``k in ("heads", "laplacian_heads")`` -- ints, ``"half"`` and lists of them
  read as given (``"half"`` names no operator; were one registered so, both sides of a comparison read alike).
"""

from __future__ import annotations

from types import MappingProxyType

import pytest

from diffusionformer.models import GPTConfig, ViTConfig
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.heads import _layout_as_read, _spec_as_read, parse_heads
from diffusionformer.operators import DiffusionOperator, register_operator, unregister_operator


def test_kills_count_colon_outside_brackets_only():
    """kills: nn/heads.py ``_count_colon`` ``ch == ":" and depth == 0`` -> ``ch == ":"`` (a dict argument,
    ``heat(t={{1: 2}})``, was refused as a head count ``'2})'`` instead of by heat's own "t must be a float")."""
    with pytest.raises(TypeError, match="t must be a float, got dict"):
        parse_heads("heat(t={{1: 2}})", 4)


def test_kills_count_colon_counts_braces():
    """kills: nn/heads.py ``_count_colon`` ``")]}"``/``"([{"`` -> ``")]"``/``"(["`` (an escaped-brace count,
    ``attention:{{a:b}}``, was reported as the count ``'b}'``: not what the user wrote)."""
    with pytest.raises(ValueError, match=r"got '\{a:b\}'"):
        parse_heads("attention:{{a:b}}", 4)


def test_kills_split_count_strips_the_item():
    """kills: nn/heads.py ``_split_count`` ``item[:i].strip()`` -> ``item[:i]`` (errors quoted an item with the
    space before its count: ``'heat(num_heads=3) ':2``)."""
    with pytest.raises(ValueError, match=r"head spec item 'heat\(num_heads=3\)':2"):
        parse_heads("attention:2, heat(num_heads=3) :2", 4)


def test_kills_item_as_read_writes_the_count_as_an_int():
    """kills: nn/heads.py ``_item_as_read`` ``f":{_split_count(item)[1]}"`` -> ``f":{count_text}"`` (``attention:02``
    and ``attention:2``, one model, were two configs and two runs)."""
    assert _spec_as_read("attention:02,laplacian:002") == "attention:2,laplacian:2"
    assert GPTConfig(n_head=4, n_embd=16, heads="attention:02,laplacian:2").heads == "attention:2,laplacian:2"


def test_kills_item_as_read_refuses_unknown_arguments():
    """kills: nn/heads.py ``_item_as_read`` dropping ``if _unknown_arguments(cls, kwargs): raise`` (a misspelt
    argument's spec was rewritten, ``Heat(tt=1)`` -> ``heat(tt=1)``, so the refusal quoted what the user never wrote)."""
    spec = "attention:2,Heat(tt=1):2"
    assert _spec_as_read(spec) == spec
    config = GPTConfig(n_head=4, n_embd=16, heads=spec)
    assert config.heads == spec
    with pytest.raises(TypeError, match="unknown argument 'tt'"):
        DiffusionAttention(16, 4, config.heads)


def test_kills_item_as_read_puts_extra_arguments_last():
    """kills: nn/heads.py ``_item_as_read`` ``(1, 0, k)`` -> ``(0, 0, k)`` (a ``**kwargs`` operator's extra
    arguments were sorted among its constructor's, so the spelling ``heads_spec()`` writes was not its own)."""

    class _Extra(DiffusionOperator):
        degree = 1

        def __init__(self, num_heads=1, alpha=0.1, **extra):
            super().__init__(num_heads=num_heads)
            self.alpha, self.extra = alpha, extra

        def coefficients(self):
            import torch
            return torch.tensor([1.0 - self.alpha, self.alpha])

        def spec_kwargs(self):
            return {"alpha": self.alpha, **self.extra}

    register_operator(_Extra, name="doc-extra48")
    try:
        layer = DiffusionAttention(16, 4, "Doc_Extra48(zeta=1, alpha=.2):4")
        written = layer.heads_spec()
        assert written == "doc-extra48(alpha=0.2, zeta=1):4"
        assert _spec_as_read(written) == written
        assert _spec_as_read("doc-extra48(zeta=1, alpha=0.2):4") == written
    finally:
        unregister_operator("doc-extra48")


def test_kills_item_as_read_checks_the_values_read_back():
    """kills: nn/heads.py ``_item_as_read`` dropping the ``repr`` read-back check (``t=-0.0-0j`` was written
    ``t=(-0+0j)``, which reads back as ``0j``: the "canonical" form was another value and not its own)."""
    for spec in ("heat(t=-0.0-0j):4", "heat(t=-(1e400j)):4"):
        read = _spec_as_read(spec)
        assert read == spec and _spec_as_read(read) == read
    assert _spec_as_read("heat(t=-0.0-0j):4") != _spec_as_read("heat(t=0j):4")


def test_kills_item_as_read_keeps_braces_out():
    """kills: nn/heads.py ``_item_as_read`` dropping ``or "{" in _mask_strings(text)`` (a set argument's spec,
    refused by the templates, was rewritten: ``Heat(t={1})`` -> ``heat(t={1})``, not what the user wrote)."""
    for spec in ("Heat(t={1}):4", "Poly(init={'a': 1}):4"):
        assert _spec_as_read(spec) == spec


def test_kills_spec_as_read_leaves_per_head_lists():
    """kills: nn/heads.py ``_spec_as_read`` dropping ``if not isinstance(spec, str): return spec`` (a one-head layer's
    per-head list ``["Laplacian"]`` was recorded as the spec string ``"laplacian"``)."""
    config = ViTConfig(num_heads=1, dim=16, depth=2, heads=[["Laplacian"], "I-P"])
    assert config.heads == [["Laplacian"], "laplacian"]
    assert _spec_as_read(["Laplacian"]) == ["Laplacian"]


def test_kills_spec_as_read_keeps_an_empty_spec_as_given():
    """kills: nn/heads.py ``_spec_as_read`` ``read if items and read != spec`` -> ``read if read != spec`` (an empty
    spec ``" , "`` was recorded as ``""``, and refused as that, not as written)."""
    assert _spec_as_read(" , ") == " , " and _spec_as_read(",") == ","
    assert GPTConfig(n_head=4, n_embd=16, heads=" , ").heads == " , "


def test_kills_layout_as_read_keeps_a_mapping_read_already():
    """kills: nn/heads.py ``_layout_as_read`` ``heads if all(...) else entries`` -> ``entries`` (a config given a
    read-only ``{layer: spec}`` mapping already read got a copy, not the mapping it was given)."""
    layout = MappingProxyType({"1": "laplacian:4"})
    assert _layout_as_read(layout) is layout
    assert ViTConfig(num_heads=4, dim=16, heads=layout).heads is layout
    assert _layout_as_read(MappingProxyType({"1": "I-P:4"})) == {"1": "laplacian:4"}
