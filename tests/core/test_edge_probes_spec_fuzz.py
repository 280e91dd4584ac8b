"""Seeded fuzzing of operator and head spec strings: round trips, and mutations refused by name (probe round)."""

from __future__ import annotations

import random
from typing import Iterator

import pytest
import torch

from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.heads import format_head_spec, parse_heads, resolve_layer_heads, split_top_level
from diffusionformer.operators import DiffusionOperator, build_operator, operator_class
from diffusionformer.operators.registry import register_operator, unregister_operator

_TAG = "probe-spec-fuzz-tag"


@pytest.fixture
def tag_operator() -> Iterator[type[DiffusionOperator]]:
    """A user operator with a free-text argument (a string value may hold any character of the spec syntax)."""

    class Tagged(DiffusionOperator):
        degree = 0

        def __init__(self, tag: str = "", num_heads: int = 1) -> None:
            super().__init__(num_heads)
            self.tag = tag

        def spec_kwargs(self) -> dict:
            return {"tag": self.tag}

        def coefficients(self) -> torch.Tensor:
            return torch.ones(1)

    register_operator(Tagged, name=_TAG)
    try:
        yield Tagged
    finally:
        unregister_operator(_TAG)


_TAGS = ["{H}", "{half}:", "a{b}", "}", "x)y", "(", "a,b", "p:q", "'", '"', "a\\'b", "[", "{{H}}"]


@pytest.mark.parametrize("tag", _TAGS)
def test_bug_quoted_value_is_not_a_template(tag_operator: type, tag: str) -> None:
    """Bug: format_head_spec formatted the whole spec string, quoted values included: a string value '{H}' became
    '2' silently, and 'a{b}' or '}' was refused as an unknown template ("only the templates {H} and {half}")."""
    spec = build_operator(_TAG, tag=tag).spec()
    assert format_head_spec(f"{spec}:{{half}},attention:{{half}}", 4) == f"{spec}:2,attention:2"
    layer = DiffusionAttention(16, 4, heads=f"{spec}:{{half}},attention:{{half}}")
    assert layer.operators[0].tag == tag
    (layout,) = resolve_layer_heads(1, 2, heads=[f"attention:1,{spec}:1"])
    assert DiffusionAttention(8, 2, heads=layout).operators[1].tag == tag


@pytest.mark.parametrize("tag", _TAGS)
def test_bug_quoted_bracket_does_not_split_items(tag_operator: type, tag: str) -> None:
    """Bug: split_top_level and the count split counted brackets inside quoted values: "tag='x)y'" or "tag='('"
    in a first item merged it with the next ("cannot parse operator spec \\"...'):1,attention\\"")."""
    spec = build_operator(_TAG, tag=tag).spec()
    assert split_top_level(f"{spec}:1,attention:1") == [f"{spec}:1", "attention:1"]
    groups = parse_heads(f"{spec}:1, laplacian:2", 3)
    assert [(g.operator.name, g.start, g.count) for g in groups] == [(_TAG, 0, 1), ("laplacian", 1, 2)]
    assert groups[0].operator.tag == tag
    layer = DiffusionAttention(8, 2, heads=f"{spec}:1,attention:1")
    rebuilt = DiffusionAttention(8, 2, heads=layer.heads_spec())  # the layer's own spec rebuilds it
    assert rebuilt.heads_spec() == layer.heads_spec() and rebuilt.operators[0].tag == tag


def test_an_unterminated_quote_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="cannot parse operator spec"):
        parse_heads("heat(method='taylor):2,attention:{half}", 4)


# --- seeded round trips over the registry -------------------------------------------------------------------------

_OPTIONS: dict[str, dict[str, list]] = {
    "heat": {"t": [0.5, 1, 2.0, 1e-1, 0.0, -0.5], "steps": [1, 4], "learnable": [True, False],
             "method": ["taylor", "euler"]},
    "heat-exact": {"t": [0.5, 1, 0.7], "learnable": [True, False]},
    "ppr": {"alpha": [0.1, 0.2, 1.0, 1], "steps": [1, 3], "learnable": [True, False]},
    "ppr-exact": {"alpha": [0.1, 0.5, 1]},
    "polynomial": {"steps": [2], "init": ["attention", "laplacian", [0.1, -0.5, 0.25], "heat(t=0.5, steps=2)"],
                   "basis": ["monomial", "chebyshev"]},
    "grand-nl": {"t": [0.5, 1], "steps": [1, 2], "method": ["euler", "rk4"]},
    "attnscale": {"omega": [0.0, 0.4, -0.3, 1], "learnable": [True, False]},
    "neutreno": {"lam": [0.0, 0.6, 1]},
    "value-residual": {"lam": [0.0, 0.5, 1.0]},
    "differential": {"depth": [None, 0, 3], "head_dim": [None, 8]},
    "attention": {},
    "laplacian": {},
}


def _number(rng: random.Random, v: object) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return rng.choice([repr(v), f'"{v}"']) if isinstance(v, str) else repr(v)
    if isinstance(v, int):
        return rng.choice([str(v), f"({v})", f"+{v}" if v >= 0 else str(v)])
    return rng.choice([repr(v), f"{v:e}", f"{v:.17g}", f"{v:E}"])


def _spelling(rng: random.Random, name: str) -> str:
    written = rng.choice([name, *operator_class(name).aliases])
    return rng.choice([written, written.upper(), written.title(), written.replace("-", "_"), f" {written} "])


def _random_spec(rng: random.Random) -> tuple[str, str, dict]:
    name = rng.choice(sorted(_OPTIONS))
    kwargs = {k: rng.choice(v) for k, v in _OPTIONS[name].items() if rng.random() < 0.7}
    if kwargs.get("method") == "euler":  # the Euler heat kernel has no automatic step count for long times
        kwargs.setdefault("steps", 4)
    items = list(kwargs.items())
    rng.shuffle(items)
    sep = rng.choice([",", ", ", " , ", ",\n"])
    text = _spelling(rng, name)
    if items or rng.random() < 0.3:
        args = sep.join(f"{k}{rng.choice(['=', ' = '])}{_number(rng, v)}" for k, v in items)
        text += f"({args}{rng.choice(['', ',']) if items else ''})"
    return text, name, kwargs


def _valid_spec(rng: random.Random) -> str:
    while True:
        text = _random_spec(rng)[0]
        try:
            build_operator(text)
        except ValueError:  # e.g. a learnable ppr with alpha=1
            continue
        return text


def _same(a: DiffusionOperator, b: DiffusionOperator) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return (type(a) is type(b) and a.spec() == b.spec() and a.num_heads == b.num_heads and sa.keys() == sb.keys()
            and all(torch.equal(sa[k], sb[k]) for k in sa))


def _seeded(build):  # noqa: ANN001, ANN202 - random initial values (differential's lambdas) drawn alike
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build()


def test_random_operator_specs_build_what_the_arguments_build() -> None:
    rng, refused = random.Random(20261205), 0
    for _ in range(300):
        text, name, kwargs = _random_spec(rng)
        heads = rng.choice([1, 2])
        try:
            direct = _seeded(lambda: operator_class(name)(**kwargs, num_heads=heads))
        except (ValueError, TypeError) as err:  # a combination the constructor refuses: the spec is refused alike
            with pytest.raises(type(err)) as info:
                build_operator(text, num_heads=heads)
            assert str(err) in str(info.value)
            refused += 1
            continue
        built = _seeded(lambda: build_operator(text, num_heads=heads))
        assert _same(built, direct), (text, built.spec(), direct.spec())
        assert _same(_seeded(lambda: build_operator(direct.spec(), num_heads=heads)), direct), direct.spec()
    assert refused < 60  # the generator mostly writes valid operators


def test_random_head_layouts_round_trip_through_heads_spec() -> None:
    rng = random.Random(7)
    for _ in range(60):
        H = rng.choice([1, 2, 3, 4])
        counts, left = [], H
        while left:
            counts.append(rng.randint(1, left))
            left -= counts[-1]
        items = [(_valid_spec(rng), c) for c in counts]
        if rng.random() < 0.2:
            items.insert(rng.randrange(len(items) + 1), (_valid_spec(rng), 0))
        pad = lambda: rng.choice(["", " ", "\t"])  # noqa: E731
        text = ",".join(f"{pad()}{s}{pad()}:{pad()}{c}{pad()}" for s, c in items)
        groups = parse_heads(text, H)
        expected = [(build_operator(s, num_heads=c).spec(), c) for s, c in items if c]
        assert [(g.operator.spec(), g.count) for g in groups] == expected, text
        assert [g.start for g in groups] == [sum(c for _, c in expected[:i]) for i in range(len(expected))]
        layer = DiffusionAttention(8 * H, H, heads=text)
        assert DiffusionAttention(8 * H, H, heads=layer.heads_spec()).heads_spec() == layer.heads_spec()


# --- mutations of valid specs: refused by name, never a raw Python error nor silently accepted --------------------

_BAD_HEADS = {
    "heat(t=0.5:2,attention:2": "cannot parse",
    "heat(t=0.5)):2,attention:2": "cannot parse",
    "heat(t=0.5, t=1):4": "given twice",
    "heat(tt=0.5):4": "unknown argument 'tt'",
    "heat(t=0.5)(steps=2):4": "one pair of parentheses",
    "attention:": "must be an integer",
    "attention::4": "unknown operator",
    "attention:2.0,laplacian:2": "must be an integer",
    "attention:-1,laplacian:5": "non-negative",
    "attention:2,laplacian:1": "assigns 3 heads",
    "attention:2,laplacian": "assigns 3 heads",
    "attention:\uff12,laplacian:2": "must be an integer",
    "attention\uff1a4": "unknown operator",
    "h\u0435at:4": "did you mean 'heat'",
    "heat(t=0\uff0e5):4": "invalid character",
    "attention:{h}": "only the templates",
    "attention:{H": "only the templates",
    "heat(t=(0.5)):2,heat((t=0.5)):2": "cannot parse",
    "heat(0.5):4": "key=value",
    "heat(t=f(1)):4": "Python literal",
    "bogus:0,attention:4": "unknown operator 'bogus'",
    "heat(num_heads=2):4": "num_heads must be 1",
    "": "empty head specification",
    ",": "empty head specification",
    "attention:2 # comment,laplacian:2": "must be an integer",
}


@pytest.mark.parametrize("spec, message", sorted(_BAD_HEADS.items()))
def test_mutated_head_specs_are_refused_by_name(spec: str, message: str) -> None:
    with pytest.raises((ValueError, TypeError)) as info:
        parse_heads(spec, 4)
    assert message in str(info.value), str(info.value)


def test_random_mutations_raise_value_or_type_errors_only() -> None:
    rng = random.Random(11)
    junk = ["(", ")", ",", ":", "=", "'", '"', "{", "}", "[", "]", "\u2212", "\uff08", "\u200b", "0", "-", " ", "x"]
    for _ in range(300):
        text = ",".join(f"{_random_spec(rng)[0]}:1" for _ in range(2))
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(text) + 1)
            op = rng.random()
            text = (text[:i] + rng.choice(junk) + text[i:]) if op < 0.5 else (text[:i] + text[i + 1:])
        try:
            parse_heads(text, 2)
        except (ValueError, TypeError):
            pass
