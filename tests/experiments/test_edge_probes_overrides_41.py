"""``--set key=value`` values that open a TOML list, table or string and do not close it."""

from __future__ import annotations

import pytest

from diffusionformer.experiments.config import parse_override


@pytest.mark.parametrize("text", ["seeds=[", "seeds=[0, 1", "tasks.digits.train={max_steps = 5", "name='x",
                                  'name="x'])
def test_bug_an_unclosed_toml_value_is_a_parse_error_not_a_string(text):
    """Bug: a value that failed to parse as TOML was taken as a bare-word string, so ``--set 'seeds=['`` was
    reported later as "expected a list, got str '['" (and ``name='x`` named a comparison ``'x``); a value opening
    a list, table or quoted string is now refused as invalid TOML, naming it."""
    with pytest.raises(ValueError, match="is not valid TOML"):
        parse_override(text)


@pytest.mark.parametrize("text, want", [("seeds=[0, 1]", [0, 1]), ("name=tiny", "tiny"), ("name='x'", "x"),
                                        ("operators.h.heads=attention:2,heat(t=0.5):2", "attention:2,heat(t=0.5):2")])
def test_pins_valid_toml_and_bare_words_still_parse(text, want):
    """Pins: valid TOML values and bare words (head specs among them) parse as before."""
    assert parse_override(text)[1] == want
