"""Probe 57j: docs theory walk, round 2.

Every formula, bound and numeric claim of ``docs/theory/*.rst``, ``docs/tutorials/*.rst`` and the CPU claims of
``docs/performance.md`` was checked in float64 against independent references (explicit matrices, matrix powers,
``torch.linalg.matrix_exp``, ``torch.linalg.solve``/``inv``, eigendecompositions), at the edges the pages name (causal
masks, key padding, rows without keys, ``t = 0``, ``alpha = 1``, ``K = 0``); every doctest page ran under the Sphinx
doctest builder and every plot / ``df-exec`` / ``df-table`` block and cheap shell command ran as written. The
existing ``test_theory_claims.py`` and the results/performance claim tests already hold almost all of it.

Found and fixed (``test_bug_...``):

- ``docs/theory/rivals.rst`` said that apart from ``ppr-exact`` every operator of its table "needs more than the
  polynomial engine offers, and says so with capability flags"; the table's Chebyshev ``polynomial`` is a polynomial
  in :math:`P` run by the engine and sets no flag.
- ``docs/theory/rivals.rst`` said GRAND-nl's Euler with ``t=1, steps=1`` "is one attention step". Only where the rows
  of :math:`P` sum to one: at a row without keys the bias-free integration leaves the value bias ``b_v`` (the
  model-space equation, as the page says), where an attention head outputs 0.
- ``HeatOperator``: a fixed ``t`` below ``min_t`` is refused, while the docstring said ``min_t`` bounds a *learned*
  ``t``; the error named no way out (``heat(t=-3)`` needs ``min_t=-3`` or lower).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.operators import HeatOperator, operator_class

ROOT = Path(__file__).resolve().parents[2]
RIVALS = (ROOT / "docs" / "theory" / "rivals.rst").read_text(encoding="utf-8")
FLAGS = ("needs_uniform_map", "needs_layer_state", "needs_second_map", "reprojects_each_step")
F64 = torch.float64


def _flat(text: str) -> str:
    return " ".join(text.split())


def _paragraph_after_table(text: str) -> str:
    """The first unindented paragraph after the page's ``list-table``."""
    blocks = text.split(".. list-table::", 1)[1].split("\n\n")
    return _flat(next(b for b in blocks[1:] if b.strip() and not b.startswith(" ")))


def test_bug_rivals_page_does_not_put_the_chebyshev_polynomial_among_the_flagged_operators():
    names = re.findall(r"^   \* - ``([a-z-]+)\(", RIVALS, flags=re.M)
    assert {"ppr-exact", "polynomial", "attnscale", "differential", "grand-nl"} <= set(names), names
    paragraph = _paragraph_after_table(RIVALS)
    for name in names:
        cls = operator_class(name)
        flags = [flag for flag in FLAGS if getattr(cls, flag)]
        if flags:  # the paragraph explains every flag an operator of the table sets
            assert all(f"``{flag}``" in paragraph for flag in flags), (name, flags)
        else:  # an operator without flags must be named as one of the exceptions, not lumped with the others
            assert f"``{name}``" in paragraph, (name, paragraph)


def _pair(bias_shift: float = 0.5) -> tuple[DiffusionAttention, DiffusionAttention]:
    torch.manual_seed(57)
    attn = DiffusionAttention(8, 2, heads="attention:2", dtype=F64)
    grand = DiffusionAttention(8, 2, heads="grand-nl(t=1.0, steps=1, method='euler'):2", dtype=F64)
    with torch.no_grad():
        attn.qkv.bias.add_(bias_shift)  # biases that matter: the value bias is what the keyless rows differ by
        for name, p in attn.named_parameters():
            grand.get_parameter(name).copy_(p)
    return attn.eval(), grand.eval()


def test_bug_grand_nl_one_euler_step_is_attention_only_where_rows_sum_to_one():
    attn, grand = _pair()
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1), dtype=F64)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True
    ring = torch.tensor([[4, 0, 1, 2, 3], [0, 1, 2, 3, 4]])  # every node has an incoming edge
    for kwargs in ({}, {"is_causal": True}, {"key_padding_mask": pad}):
        torch.testing.assert_close(grand(x, **kwargs), attn(x, **kwargs), rtol=0, atol=1e-12)
    torch.testing.assert_close(grand(x[0], edge_index=ring), attn(x[0], edge_index=ring), rtol=0, atol=1e-12)
    allowed = torch.ones(5, 5, dtype=torch.bool)
    allowed[3] = False  # query 3 sees no key: P's row 3 is zero
    y_attn, y_grand = attn(x, attn_mask=allowed), grand(x, attn_mask=allowed)
    b_v = attn.qkv.bias[16:]
    with torch.no_grad():
        torch.testing.assert_close(y_attn[:, 3], attn.out_proj.bias.expand(2, 8), rtol=0, atol=1e-12)  # P v = 0
        torch.testing.assert_close(y_grand[:, 3], attn.out_proj(b_v).expand(2, 8), rtol=0, atol=1e-12)  # X(1) = 0
    keep = [0, 1, 2, 4]
    torch.testing.assert_close(y_grand[:, keep], y_attn[:, keep], rtol=0, atol=1e-12)
    sentence = next(s for s in _flat(RIVALS).split(". ") if "is one attention step" in s)
    assert "sum to one" in sentence and "b_v" in sentence, sentence


def test_bug_heat_below_min_t_says_how_to_allow_it():
    with pytest.raises(ValueError, match=r"t=-3\.0 is below min_t=-2\.0.*pass min_t=-3\.0 or lower"):
        HeatOperator(t=-3.0)
    assert HeatOperator(t=-3.0, min_t=-3.0, steps=None).coefficients()[0] > 1.0  # e^{|t|}: sharpening
    doc = _flat(HeatOperator.__doc__ or "")
    min_t_doc = doc.split("min_t:", 1)[1].split("num_heads:", 1)[0]
    assert "refused" in min_t_doc and "learned" in min_t_doc, min_t_doc
