"""Tests written in a mutation audit of ``experiments/compare.py`` (the contrasts of a results page, their Holm
families, the p-value and interval cells, the table legend) and ``graph/core.py`` (``AttentionGraph``: validation,
``attention_kwargs``, the conversions between the layouts).

Each test kills a mutant that the covering tests let through; its docstring names it (file and mutation). The
references are independent of the code: ``scipy.stats`` for the paired t test, Holm's adjustment worked out by hand,
and graphs written out as explicit float64 / bool dense matrices. Mutants judged equivalent are listed, with the
reason, at the end of the file. CPU only, deterministic, no network, no files.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.graph import AttentionGraph


# ----------------------------------------------------------------------------- graph/core.py: validation
def test_a_dense_allowed_matrix_that_is_not_square_is_refused_by_name():
    """Kills: core._validate_dense ``a.shape[-2:] == (N, N)`` -> ``a.shape[-1:] == (N,)`` (an ``(M, N)`` allowed
    matrix accepted, to fail later in a broadcast far from its cause)."""
    with pytest.raises(ValueError, match=r"allowed must have shape \(3, 3\) or \(B, 3, 3\), got \(2, 3\)"):
        AttentionGraph.dense(3, allowed=torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"allowed must have shape .*got \(2, 1, 3\)"):
        AttentionGraph.dense(3, allowed=torch.ones(2, 1, 3, dtype=torch.bool))


# ----------------------------------------------------------------------------- experiments/compare.py: p cells
@pytest.mark.parametrize("p, alpha", [(0.04969, 0.0497), (0.04989, 0.0499), (0.05029, 0.0503), (0.0496, 0.04961)])
def test_bug_a_p_next_to_0_05_keeps_its_side_of_an_alpha_next_to_it_too(p, alpha):
    """Bug: ``_format_p`` printed a p in [0.0495, 0.0505) with the digits that keep it on its side of 0.05 only, so
    next to another ``alpha`` (``summary_table(alpha=0.0497)``, whose docs promise each p "printed with the digits
    that keep it on its side of alpha") p = 0.04969, bold there, read "0.0497", not below 0.0497."""
    from diffusionformer.experiments.compare import _format_p

    text = _format_p(p, alpha)
    assert (float(text) < alpha) == (p < alpha), text
    assert (float(text) < 0.05) == (p < 0.05), text
    assert len(text) <= len(repr(p)) + 1  # no more digits than the value has


@pytest.mark.parametrize("p, text", [(0.00996, "0.010"), (0.0104, "0.010"), (0.0009996, "<0.001"), (0.0012, "0.001"),
                                     (0.04949, "0.049"), (0.0505, "0.051"), (0.5, "0.500"), (1.0, "1.000")])
def test_format_p_prints_three_decimals_away_from_0_05(p, text):
    """Kills: compare._format_p ``alpha: float = 0.05`` -> ``0.01`` (``format_p``, the page's cells, then kept a p on
    its side of 1%: 0.00996 printed "0.00996" where the docstring promises three decimals away from 0.05)."""
    from diffusionformer.experiments.compare import format_p

    assert format_p(p) == text


def test_the_class_token_hint_is_for_non_causal_graphs_only():
    """Kills: core.attention_kwargs ``x.shape[1] == N + 1 and not self.causal`` -> ``x.shape[1] == N + 1`` (a GPT's
    ``block_size + 1`` tokens, its inputs not shifted from its targets, told to add a class token)."""
    x = torch.zeros(2, 5, 8)
    with pytest.raises(ValueError, match=r"expects x of shape \(B, N=4, D\), got \(2, 5, 8\)$"):
        AttentionGraph.dense(4, causal=True).attention_kwargs(x)
    with pytest.raises(ValueError, match=r"got \(2, 5, 8\) \(one token more than N=4: a class token\?"):
        AttentionGraph.dense(4, window=1).attention_kwargs(x)


@pytest.mark.parametrize("shape", [(2, 3), (1, 2, 3), (4, 1, 2, 3)])
def test_an_attn_mask_whose_query_dimension_is_not_n_or_1_is_refused(shape):
    """Kills: core._validate_dense ``m.shape[-2:]`` -> ``m.shape[-1:]`` (an attn_mask with 2 query rows for N = 3
    accepted, to fail later in the kernel's broadcast, far from the graph that holds it)."""
    with pytest.raises(ValueError, match=r"attn_mask must be broadcastable to \(B, H, N, N\) with N=3"):
        AttentionGraph.dense(3, attn_mask=torch.zeros(shape))
    AttentionGraph.dense(3, attn_mask=torch.zeros(shape[:-2] + (1, 3)))  # a query dimension of 1 broadcasts


@pytest.mark.parametrize("edge_index, shape", [(torch.tensor([0, 1]), r"\(2,\)"),
                                               (torch.zeros(1, 3, 2, dtype=torch.long), r"\(1, 3, 2\)")],
                         ids=["one-pair-1d", "pair-lists-3d"])
def test_the_transpose_hint_is_only_for_a_two_dimensional_list_of_pairs(edge_index, shape):
    """Kills: core._edge_index_shape_error ``len(shape) == 2 and shape[1] == 2`` -> ``shape[-1] == 2`` (one pair as a
    1-D tensor, or a batch of pair lists, told to call ``.t()``, which leaves the first as it is and refuses the
    second)."""
    with pytest.raises(ValueError, match=rf"edge_index must have shape \(2, E\), got {shape}$"):
        AttentionGraph.sparse(edge_index, 3)
    with pytest.raises(ValueError, match=r"got \(3, 2\): a list of \(source, target\) pairs .* edge_index\.t\(\)"):
        AttentionGraph.sparse(torch.zeros(3, 2, dtype=torch.long), 3)


@pytest.mark.parametrize("x, digits, text", [(-0.00004, 4, "+0.0000"), (-0.00006, 4, "-0.0001"),
                                             (0.00004, 4, "+0.0000"), (-0.0004, 3, "+0.000"), (-0.0006, 3, "-0.001"),
                                             (-2.5e-9, 4, "+0.0000")])
def test_format_signed_rounds_to_its_digits_before_the_sign(x, digits, text):
    """Kills: compare.format_signed ``round(x, digits)`` -> ``round(x, digits + 1)`` (a difference that rounds to
    zero at the cell's digits but not at one more, -0.00004, printed "-0.0000": a sign the cell cannot show)."""
    from diffusionformer.experiments.compare import format_signed

    assert format_signed(x, digits) == text


# ----------------------------------------------------------------------------- equivalent mutants
# - core.dense_allowed ``A = A.expand(B, N, N)`` -> ``A.expand(B, N, N) if A.dim() == 2 else A``: a 3-D ``A`` comes
#   from a ``(B, N, N)`` allowed, whose B the validation made the graph's, so the expand was already the identity.
