"""Edge probes of the published statistics (seventh pass): the summary table's bold cells at an ``alpha`` other
than 0.05 (``format_p`` guarded only 0.05 against rounding across the level)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.publish import summary_table
from diffusionformer.experiments.results import RunResult

scipy_stats = pytest.importorskip("scipy.stats")

_BASE = [0.5, 0.5, 0.5, 0.5]


def _raw(name):
    return {"name": name, "seeds": [0, 1, 2, 3],
            "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 6}}],
            "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": "half"}]}


def _summary_cell(tmp_path, name, lap, alpha):
    """The one cell of a summary over a comparison of ``lap`` against a constant baseline, paired over four seeds."""
    runs = [asdict(RunResult("digits", op, s, "completed", "test_acc", v))
            for op, vs in (("attention", _BASE), ("lap", lap)) for s, v in enumerate(vs)]
    (tmp_path / name).mkdir()
    (tmp_path / name / "results.json").write_text(json.dumps({"runs": runs, "summary": []}))
    line = summary_table([load_experiment_config(_raw(name))], tmp_path, alpha=alpha).splitlines()[2]
    return line.split("|")[3].strip()


def test_bug_a_summary_cell_on_either_side_of_alpha_never_reads_the_same(tmp_path):
    """Bug: ``summary_table(alpha=0.01)`` printed p with three decimals (only 0.05 had more digits near it): a Holm p
    of 0.00996 (bold, significant) and one of 0.0104 (not) both read "0.010", so a bold "Holm 0.010" and a plain one
    sat in the same table; at ``alpha=0.0005``, 0.0004 (bold) and 0.0007 (not) both read "<0.001"."""
    from diffusionformer.experiments.compare import _format_p, format_p

    below = [0.51, 0.512, 0.519894, 0.511]
    above = [0.51, 0.512, 0.520068, 0.511]
    p_below, p_above = (scipy_stats.ttest_rel(v, _BASE).pvalue for v in (below, above))
    assert p_below < 0.01 < p_above and round(p_below, 3) == round(p_above, 3) == 0.01
    bold, plain = _summary_cell(tmp_path, "b", below, 0.01), _summary_cell(tmp_path, "a", above, 0.01)
    assert bold.startswith("**") and not plain.startswith("**")
    shown = [float(cell.split("Holm ")[1].split(")")[0]) for cell in (bold, plain)]
    assert shown[0] < 0.01 <= shown[1]
    # the default level reads as before
    assert _summary_cell(tmp_path, "c", below, 0.05) == f"**+0.0132 (p {p_below:.3f}; Holm {p_below:.3f})**"
    assert [_format_p(p, 0.0005) for p in (0.0004, 0.0007, 0.0)] == ["0.0004", "0.0007", "<0.001"]
    assert [_format_p(p, 0.1) for p in (0.0996, 0.1004, 0.0004)] == ["0.0996", "0.100", "<0.001"]
    assert [_format_p(p) for p in (0.0004, 0.0123, 0.0498, 0.049996)] == [format_p(p) for p in
                                                                           (0.0004, 0.0123, 0.0498, 0.049996)]


@pytest.mark.parametrize("alpha", [0, 1.5, 5, -0.05, "0.05", True, float("nan")])
def test_bug_summary_alpha_outside_0_1_is_named(tmp_path, alpha):
    """Bug: ``summary_table(alpha=5)`` marked every cell bold and counted all "p < 5" as significant, ``alpha=0``
    none, and ``alpha="0.05"`` failed deep inside with "'<' not supported between ... 'str'"."""
    runs = [asdict(RunResult("digits", op, s, "completed", "test_acc", 0.5 + 0.01 * s * (op == "lap")))
            for op in ("attention", "lap") for s in range(4)]
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "results.json").write_text(json.dumps({"runs": runs, "summary": []}))
    with pytest.raises(ValueError, match="alpha must be a probability in \\(0, 1\\].*got"):
        summary_table([load_experiment_config(_raw("x"))], tmp_path, alpha=alpha)
