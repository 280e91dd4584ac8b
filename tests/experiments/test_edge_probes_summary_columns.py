"""``summary``'s columns: one per setting name and definition (and ``read_run_log``'s refusal of other files).

Bug (left open in sitting 37, closed in 38): ``summary_table`` keyed its columns by the setting's name alone, so a
name that two comparisons define differently (``lap`` with one Laplacian head in one, with two in another) shared
one column: the table read as one setting measured on two comparisons.
"""

from __future__ import annotations

import json

from diffusionformer.experiments.publish import summary_table
from experiments_tiny_configs import write_finished_study


def _study(out, name, settings, values):
    """A finished comparison ``name`` of one task; ``settings``: (name, laplacian_heads) pairs, the first the baseline."""
    return write_finished_study(out, name, [{"name": o, "laplacian_heads": k} for o, k in settings], values)


BASE = {0: 0.5, 1: 0.6, 2: 0.7}


def test_bug_one_name_defined_differently_by_two_comparisons_gets_two_columns(tmp_path):
    """Bug: ``lap`` (one Laplacian head in A, two in B) was one column holding both comparisons' cells."""
    a = _study(tmp_path, "A", [("attention", 0), ("lap", 1)], {"attention": BASE, "lap": {0: 0.6, 1: 0.7, 2: 0.8}})
    b = _study(tmp_path, "B", [("attention", 0), ("lap", 2)], {"attention": BASE, "lap": {0: 0.3, 1: 0.4, 2: 0.5}})
    lines = summary_table([a, b], tmp_path).splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["task", "metric (baseline mean)", "lap (A)", "lap (B)"]
    row_a = [c.strip() for c in lines[2].strip("|").split("|")]
    row_b = [c.strip() for c in lines[3].strip("|").split("|")]
    assert row_a[2].startswith("+0.1000") and row_a[3] == ""
    assert row_b[2] == "" and row_b[3].startswith("-0.2000")


def test_one_name_defined_alike_by_two_comparisons_keeps_one_column(tmp_path):
    a = _study(tmp_path, "A", [("attention", 0), ("lap", 1)], {"attention": BASE, "lap": {0: 0.6, 1: 0.7, 2: 0.8}})
    b = _study(tmp_path, "B", [("attention", 0), ("lap", 1)], {"attention": BASE, "lap": {0: 0.3, 1: 0.4, 2: 0.5}})
    lines = summary_table([a, b], tmp_path).splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["task", "metric (baseline mean)", "lap"]
    assert lines[2].split("|")[3].strip().startswith("+0.1000")
    assert lines[3].split("|")[3].strip().startswith("-0.2000")


def test_bug_read_run_log_refuses_an_object_of_other_keys(tmp_path):
    """Bug (found by a sitting-38 probe): ``read_run_log`` read any JSON object without ``train``/``eval`` (a
    ``results.json``, a config) as a log of no records, where its docstring promises a ValueError for a file that
    is not a run log; the empty log that ``write_run_log([])`` writes still reads as no records."""
    import pytest

    from diffusionformer.experiments.publish import read_run_log, write_run_log

    path = tmp_path / "seed0.json"
    path.write_text(json.dumps({"runs": [], "summary": []}))
    with pytest.raises(ValueError, match=r"expected the splits 'train' and 'eval', got \['runs', 'summary'\]"):
        read_run_log(path)
    assert read_run_log(write_run_log([], tmp_path / "seed1.json")) == []
