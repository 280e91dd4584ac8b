"""Review 61u of 1176ee2: the braces of dict and set literals among operator arguments in head specs
(``format_head_spec``), and the registry's refusal of misspelt capability flags (``_check_flag_spelling``)."""

from __future__ import annotations

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.experiments.config import OperatorSetting
from diffusionformer.nn.heads import format_head_spec
from diffusionformer.operators import DiffusionOperator, list_operators, register_operator, unregister_operator


class _Powers(DiffusionOperator):
    r"""``f(P) = sum_k c_k P^k`` from a dict ``{power: c_k}`` (the powers it leaves out are 0)."""

    name = "review61u-powers"

    def __init__(self, powers: dict | None = None, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.powers = {0: 1.0, 2: -0.5} if powers is None else dict(powers)

    @property
    def degree(self) -> int:
        return max(self.powers)

    def coefficients(self) -> torch.Tensor:
        return torch.tensor([float(self.powers.get(k, 0.0)) for k in range(self.degree + 1)])

    def spec_kwargs(self) -> dict:
        return {"powers": self.powers}


@pytest.fixture
def powers_operator():
    register_operator(_Powers)
    yield
    unregister_operator(_Powers.name)


@pytest.mark.parametrize("spec, filled", [
    ("review61u-powers(powers={0: 1.0, 2: {half}}):{H}", "review61u-powers(powers={0: 1.0, 2: 2}):4"),
    ("review61u-powers(powers={{H}: 0.5, 1: 0.25}):{half},attention:{half}",
     "review61u-powers(powers={4: 0.5, 1: 0.25}):2,attention:2"),
    ("review61u-powers(powers={0: {H}, 1: '{H}'}):4", "review61u-powers(powers={0: 4, 1: '{H}'}):4"),
])
def test_bug_a_template_inside_a_dict_argument_is_filled(powers_operator, spec, filled):
    """Bug: a template inside a dict literal (``powers={0: 1.0, 2: {half}}``) was refused with "only the templates {H}
    and {half} are known (expected '}' before end of string)": the literal was no literal with its template in it, so
    its braces were left for ``str.format`` to read as one unknown template. Now it is read with its templates as
    numbers, and they are filled as everywhere else (a quoted ``'{H}'`` stays text)."""
    assert format_head_spec(spec, 4) == filled
    layer = DiffusionAttention(16, 4, heads=spec)
    assert layer.heads_spec().startswith(filled.split(":")[0])
    setting = OperatorSetting(name="powers", heads=spec)  # an experiments config's setting, its {H} per task
    assert setting.overrides(4)["heads"] == filled


def test_literals_without_templates_and_unknown_templates_are_as_before(powers_operator):
    assert format_head_spec("review61u-powers(powers={0: 1.0, 2: -0.5}):{half}", 4) == \
        "review61u-powers(powers={0: 1.0, 2: -0.5}):2"
    assert format_head_spec("review61u-powers(powers={{0: {H}}}):2", 4) == "review61u-powers(powers={0: 4}):2"
    with pytest.raises(ValueError, match=r"only the templates \{H\} and \{half\} are known"):
        format_head_spec("review61u-powers(powers={0: {quarter}}):{H}", 4)


def _register(cls):
    try:
        register_operator(cls)
    finally:
        if cls.name in list_operators():
            unregister_operator(cls.name)


@pytest.mark.parametrize("attr", ["_is_polynomial", "_supports_sparse", "_needs_second_map"])
def test_bug_a_private_attribute_of_ones_own_is_no_misspelt_flag(attr):
    """Bug: a private bool of one's own named after a public flag (``_is_polynomial = True``, say a cache of what the
    instance decided) was refused at registration as a misspelling of ``is_polynomial``: the leading underscore is
    one letter, so every such name was "a slip"."""
    cls = type("Private", (DiffusionOperator,), {"name": "review61u-private", attr: True})
    _register(cls)  # no error


def test_a_private_near_miss_of_a_private_flag_is_still_refused():
    cls = type("NearPrivate", (DiffusionOperator,), {"name": "review61u-near", "_takes_float32_p": True})
    with pytest.raises(ValueError, match=r"did you mean '_takes_float32_P'"):
        _register(cls)


class _NotPolynomial:
    is_polynomial = False
    supports_kv_cache = False


class _Misspelt:
    is_polynomal = False


@pytest.mark.parametrize("mixin, match", [
    (_NotPolynomial, r"_NotPolynomial sets the capability flag is_polynomial = False, but comes after "
                     r"DiffusionOperator in the bases"),
    (_Misspelt, r"class attribute 'is_polynomal' = False .*did you mean 'is_polynomial'"),
])
def test_bug_a_flag_on_a_mixin_after_diffusion_operator_is_refused(mixin, match):
    """Bug: only the classes before :class:`DiffusionOperator` in the MRO were looked at, so a mixin placed after it
    (``class Op(DiffusionOperator, Mixin)``) passed with a misspelt flag; and a correctly spelt flag on it was
    shadowed by ``DiffusionOperator``'s default: the operator registered with ``is_polynomial`` True, without a
    word."""
    cls = type("Mixed", (DiffusionOperator, mixin), {"name": "review61u-mixed"})
    with pytest.raises(ValueError, match=match):
        _register(cls)
    first = type("MixinFirst", (mixin, DiffusionOperator), {"name": "review61u-first"})
    if mixin is _NotPolynomial:
        _register(first)  # before DiffusionOperator: its flags are the ones read
        assert first.is_polynomial is False
    # a mixin after it that sets a flag to the default changes nothing and registers
    _register(type("Same", (DiffusionOperator, type("Defaults", (), {"is_polynomial": True})),
                   {"name": "review61u-same"}))
