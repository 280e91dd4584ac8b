"""Review probes of the changes of sitting 48: the ``--set tasks=``/``operators=`` filter's primary contrasts."""

from __future__ import annotations

import pytest

from diffusionformer.experiments.config import load_experiment_config


def _config(operators):
    return {"name": "x", "seeds": [0], "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits"}],
            "operators": operators, "primary": ["c"]}


@pytest.mark.parametrize("bad_name", [["b"], {"b": 1}])
def test_filter_dropping_a_setting_with_an_unhashable_name(bad_name):
    """Bug: an ``operators=`` filter dropping a setting whose name is a list or a table (not a string) raised a bare
    ``TypeError: unhashable type`` from apply_overrides (the dropped names were put in a set); the filter drops that
    entry as any other it does not name, and the config runs the kept settings and primary contrasts (without the
    filter the config reports the name at its place, ``operators[1].name``)."""
    data = _config([{"name": "a"}, {"name": bad_name}, {"name": "c"}])
    with pytest.raises(TypeError, match=r"operators\[1\]\.name"):
        load_experiment_config(data)
    config = load_experiment_config(data, ["operators=a,c"])
    assert [s.name for s in config.operators] == ["a", "c"]
    assert list(config.primary) == ["c"]
