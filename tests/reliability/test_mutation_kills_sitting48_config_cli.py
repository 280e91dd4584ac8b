"""Mutation audit (sitting 48) of experiments/config.py (the strict experiment-config validation and the ``--set``
overrides), experiments/cli.py (run/show/status/summary/publish argument handling) and experiments/minibatch.py:
tests that kill mutants the earlier tests left alive (each docstring names the mutant). CPU only, no staged data,
no process forked (the command line is called in-process through its ``main``).

66 hand mutants (config.py 20, cli.py 26, minibatch.py 20): 59 killed by earlier tests, 7 survivors. Killed here:
config.py 3 (``_check_path_name`` byte limit ``>`` -> ``>=``; ``_entry_end`` ``len(keyed) == 1`` -> ``>= 1``; the
primary-contrast filter of ``apply_overrides`` ``settings_kept = [...][1:]`` -> ``[...]``, which showed a bug, fixed
here: see the "Bug:" test), cli.py 2 (``show``'s task and operator lines without their model_overrides),
minibatch.py 1 (``check_num_neighbors`` without its ``hops == 0`` branch).

One survivor is left alive, not equivalent but not pinned on purpose: config.py ``_folded`` ``.casefold()`` ->
``.lower()``. The two differ only on full case foldings such as ``"ß"`` -> ``"ss"`` or the final sigma; whether
``straße`` and ``STRASSE`` are one folder on macOS (APFS) and Windows (NTFS upcase table) is doubtful (NTFS does not
fold ``ß`` to ``ss``), so casefold() is at worst over-strict (it refuses a pair of names that might not collide), and
a test would freeze that choice rather than a documented contract.
"""

from __future__ import annotations

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.config import apply_overrides


def _raw(**extra):
    """A valid one-task, one-setting comparison as a plain dict (what a TOML file parses to)."""
    raw = {"name": "m48", "seeds": [0],
           "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                      "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2}, "train": {"max_steps": 2}}],
           "operators": [{"name": "attention"}]}
    raw.update(extra)
    return raw


def test_kills_config_name_of_exactly_the_byte_limit_is_taken():
    """kills: experiments/config.py ``_check_path_name`` ``if size > _MAX_NAME_BYTES`` -> ``size >=`` (a name of
    exactly 200 bytes, the documented "at most 200 bytes in UTF-8", was refused). The bytes are counted in UTF-8:
    100 two-byte characters are 200 bytes and load; one more byte is refused, naming the size."""
    ok = "\u00e9" * 100  # 200 bytes in UTF-8, 100 characters
    cfg = load_experiment_config(_raw(name=ok, tasks=[{**_raw()["tasks"][0], "name": "a" * 200}]))
    assert cfg.name == ok and cfg.tasks[0].name == "a" * 200
    with pytest.raises(ValueError, match=r"experiment name must be at most 200 bytes in UTF-8 .* got 201 bytes"):
        load_experiment_config(_raw(name=ok + "x"))


def test_kills_config_override_path_ambiguous_between_two_keyed_names_goes_to_the_shortest():
    """kills: experiments/config.py ``_entry_end`` ``keyed[0] if len(keyed) == 1`` -> ``len(keyed) >= 1`` (the
    documented rule: a name followed by a field of the entry wins only when it is the one such name, "else the
    shortest"; with tasks ``a``, ``a.b`` and ``a.b.train`` the path ``tasks.a.b.train.train.max_steps`` fits ``a.b``
    (followed by ``train``) and ``a.b.train`` (followed by ``train``) alike, and the mutant picked ``a.b``).
    An unambiguous path still goes to its one keyed name."""
    raw = {"tasks": [{"name": n} for n in ("a", "a.b", "a.b.train")]}
    out = apply_overrides(raw, ["tasks.a.b.train.train.max_steps=5"])
    assert out["tasks"] == [{"name": "a", "b": {"train": {"train": {"max_steps": 5}}}}, {"name": "a.b"},
                            {"name": "a.b.train"}]
    out = apply_overrides(raw, ["tasks.a.b.train.lr=0.1"])  # only a.b is followed by a field (train)
    assert out["tasks"] == [{"name": "a"}, {"name": "a.b", "train": {"lr": 0.1}}, {"name": "a.b.train"}]


@pytest.mark.parametrize("keep", [["tasks=digits"], ["operators=attention,lap"]])
@pytest.mark.parametrize("primary, error", [
    (["attention"], r"primary contrast 'attention': 'attention' is the baseline every contrast is taken against"),
    (["lpa"], r"primary contrast 'lpa': unknown operator setting 'lpa' \(did you mean 'lap'\?\)"),
    (["digts:lap"], r"primary contrast 'digts:lap': unknown task 'digts' \(did you mean 'digits'\?\)"),
])
def test_bug_a_bad_primary_contrast_is_refused_under_a_name_filter_too(keep, primary, error):
    """Bug: ``--set tasks=NAME`` / ``--set operators=NAME,...`` (``apply_overrides``) kept only the primary contrasts
    naming a kept non-baseline setting and a kept task, so a contrast the config refuses without the filter (one on
    the baseline, a misspelt setting or task) was dropped without a word by any filter, even one that keeps every
    task or setting: the comparison ran and was published with other primary contrasts than its file names, and
    ``show`` said the config was fine. Found by the mutant ``settings_kept = [...][1:]`` -> ``[...]`` surviving.
    Now only the contrasts of the entries the filter drops go; the rest are validated as written."""
    raw = _raw(operators=[{"name": "attention"}, {"name": "lap", "laplacian_heads": 1},
                          {"name": "heat", "heads": "heat:{H}"}], primary=primary)
    with pytest.raises(ValueError, match=error):
        load_experiment_config(raw)
    with pytest.raises(ValueError, match=error):
        load_experiment_config(raw, keep)
    # the contrasts of the entries a filter drops still go, and those of the kept ones stay
    raw = _raw(operators=raw["operators"], primary=["heat", "digits:lap"])
    assert load_experiment_config(raw, ["operators=attention,lap"]).primary == ["digits:lap"]
    assert load_experiment_config(raw, ["tasks=digits"]).primary == ["heat", "digits:lap"]
    assert load_experiment_config(raw, ["operators=lap,heat"]).primary == []  # the baseline dropped: none runs


def test_kills_minibatch_an_int_num_neighbors_for_a_model_of_no_hops_is_a_problem():
    """kills: experiments/minibatch.py ``check_num_neighbors`` ``if hops == 0:`` branch dropped (an int
    ``num_neighbors`` for a model whose every head has degree 0 resolved to no hops at all, ``[]``: not a problem at
    the check before anything trains, but a refusal of the sampler when the run started). A list is a problem
    there either way (more hops than R = 0); with R = 1 the int is one hop."""
    from diffusionformer.experiments.minibatch import MiniBatchConfig, check_num_neighbors, resolve_num_neighbors

    problem, warning = check_num_neighbors(MiniBatchConfig(8, 10), 0)
    assert warning is None and problem.startswith("the model propagates R = 0 hops")
    assert "num_neighbors = 10 has nothing to sample" in problem
    with pytest.raises(ValueError, match=r"R = 0 hops .* train it full-batch"):
        resolve_num_neighbors(MiniBatchConfig(8, 10), 0)
    assert check_num_neighbors(MiniBatchConfig(8, [10]), 0)[0] is not None
    assert resolve_num_neighbors(MiniBatchConfig(8, 10), 1) == [10]


_SHOW_TOML = """
name = "m48show"
seeds = [0]

[[tasks]]
name = "digits"
dataset = "digits"
model = "vit-digits"
model_overrides = { dim = 8, depth = 1, num_heads = 2 }
train = { max_steps = 2 }

[[operators]]
name = "attention"

[[operators]]
name = "swiglu"
model_overrides = { mlp = "swiglu" }
"""


def test_kills_cli_show_prints_each_settings_model_overrides(tmp_path, capsys):
    """kills: experiments/cli.py ``_main`` (show) the operator line's ``{model}`` dropped (a setting defined by its
    model_overrides alone printed as the baseline does, ``heads=None laplacian_heads=None``, so the two listed
    runs looked alike). The baseline, without overrides, prints none; the task line prints its own."""
    from diffusionformer.experiments.cli import main

    toml = tmp_path / "c.toml"
    toml.write_text(_SHOW_TOML)
    assert main(["show", str(toml)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "m48show: 1 tasks x 2 operator settings x 1 seeds = 2 runs"
    assert "  operator attention: heads=None laplacian_heads=None" in out
    assert "  operator swiglu: heads=None laplacian_heads=None model_overrides={mlp = \"swiglu\"}" in out
    assert any(line.startswith("  task digits: digits -> vit-digits, metric test_acc, train {max_steps = 2}, "
                               "model_overrides {dim = 8, depth = 1, num_heads = 2}") for line in out), out
