"""Edge probes and review findings of sitting 49 (each test's docstring says what was wrong)."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators.basic import LaplacianOperator


def _float64_heads(layer: DiffusionAttention, x: torch.Tensor, weights: list[tuple[float, ...]]) -> torch.Tensor:
    """The layer's output with head ``h`` computing ``sum_k weights[h][k] P^k v`` from explicit float64 matrices."""
    B, N, E = x.shape
    H = layer.num_heads
    C = E // H
    x = x.double()
    q, k, v = (x @ layer.qkv.weight.double().T + layer.qkv.bias.double()).split(E, dim=-1)
    q, k, v = (t.view(B, N, H, C).transpose(1, 2) for t in (q, k, v))
    P = torch.softmax(q @ k.transpose(-2, -1) / C ** 0.5, dim=-1)
    heads = []
    for h, c in enumerate(weights):
        out, term = torch.zeros_like(v[:, h]), v[:, h]
        for ck in c:
            out = out + ck * term
            term = P[:, h] @ term
        heads.append(out)
    o = torch.stack(heads, 1).transpose(1, 2).reshape(B, N, E)
    return o @ layer.out_proj.weight.double().T + layer.out_proj.bias.double()


@pytest.mark.parametrize("static_too", [False, True])
def test_subclass_overriding_coefficients_alone_is_not_run_with_its_parents_constants(static_too):
    """Bug: a subclass of a fixed operator that redefined ``coefficients()`` alone (``LaplacianOperator`` returning
    ``(1, -2)``) kept its parent's ``static_coefficients()`` ``(1, -1)``: the layer's fused path trusted those, so the
    heads computed ``v - P v`` while ``layer.coefficients()`` and ``return_intermediates`` said ``v - 2 P v``. Such a
    class has no static coefficients now (the layer reads ``coefficients()``); one that defines both keeps its own."""

    class Steeper(LaplacianOperator):
        def coefficients(self):
            return torch.tensor([1.0, -2.0], device=self._c.device, dtype=self._c.dtype)

        if static_too:
            def static_coefficients(self):
                return (1.0, -2.0)

    op = Steeper()
    assert op.static_coefficients() == ((1.0, -2.0) if static_too else None)
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, ["attention", op]).eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        got = layer(x)
        want = _float64_heads(layer, x, [(0.0, 1.0), (1.0, -2.0)])
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert LaplacianOperator().static_coefficients() == (1.0, -1.0)  # the parent keeps its fast path


def test_registering_a_class_defined_again_says_how_to_replace_it():
    """Bug: a notebook cell that defines and registers an operator, run twice, failed with "operator name 'x' is
    already registered by X" and no word of the way out; the message names ``unregister_operator`` now (with the
    registered name, also when the clash is on an alias), and registering after it works."""
    from diffusionformer.operators import register_operator, unregister_operator

    def define():
        class Halfway(LaplacianOperator):
            aliases = ("half-way-alias",)

            def coefficients(self):
                return torch.tensor([0.5, -0.5], device=self._c.device, dtype=self._c.dtype)

        return Halfway

    register_operator(define(), name="review49-halfway")
    try:
        with pytest.raises(ValueError, match=r"already registered by Halfway; to replace it .*"
                                             r"unregister_operator\('review49-halfway'\) first"):
            register_operator(define(), name="review49-halfway")
        with pytest.raises(ValueError, match=r"'half-way-alias' is already registered by Halfway; .*"
                                             r"unregister_operator\('review49-halfway'\)"):
            register_operator(define(), name="review49-other")
        unregister_operator("review49-halfway")
        register_operator(define(), name="review49-halfway")
    finally:
        unregister_operator("review49-halfway")


@pytest.mark.parametrize("coefficients, what", [
    (lambda: torch.tensor([[1.0, -1.0]] * 3), "3 rows for 2 heads"),
    (lambda: torch.tensor([True, False]), "bool"),
    (lambda: torch.ones(1, 2, 2), "3-d"),
])
def test_harness_reports_coefficients_that_cannot_serve_the_heads_as_a_failed_law(coefficients, what):
    """Bug: ``assert_operator`` promises an ``AssertionError`` naming the law an operator breaks, yet coefficients
    that cannot serve its heads (``(G, K+1)`` with ``G`` not the operator's heads, bool, 3-d) escaped as the
    layer's ``ValueError``/``TypeError``, which a caller catching the harness's failures (a registry-wide sweep)
    took for a bad call of its own."""
    from diffusionformer.testing import assert_operator

    class Odd(LaplacianOperator):
        def coefficients(self):
            return coefficients()

    with pytest.raises(AssertionError, match=r"coefficients\(\) cannot serve 2 heads: "):
        assert_operator(Odd(num_heads=2), num_heads=2)


def test_an_unregistered_operator_class_is_not_written_as_its_parent():
    """Bug: a head of an unregistered subclass (``Steeper(LaplacianOperator)``, running ``v - 2 P v``) wrote its
    parent's spec ``laplacian``, so ``heads_spec()``, the layer's repr and a checkpoint's model record read
    ``laplacian:1``: a resume with plain Laplacian heads was accepted as the same model, and the spec "rebuilt" the
    parent; a direct subclass of DiffusionOperator wrote ``":1"``. Such a class is written
    ``<unregistered module.Class>`` now: named, not rebuildable (build_operator says unknown operator)."""
    from diffusionformer.operators import DiffusionOperator, build_operator
    from diffusionformer.train.checkpoint import model_record, model_record_differences

    class Steeper(LaplacianOperator):
        def coefficients(self):
            return torch.tensor([1.0, -2.0], device=self._c.device, dtype=self._c.dtype)

    class Direct(DiffusionOperator):
        degree = 1

        def coefficients(self):
            return torch.tensor([0.5, 0.5])

    torch.manual_seed(0)
    steep = DiffusionAttention(8, 2, ["attention", Steeper()])
    plain = DiffusionAttention(8, 2, "attention:1,laplacian:1")
    where = f"{__name__}.test_an_unregistered_operator_class_is_not_written_as_its_parent.<locals>"
    assert steep.heads_spec() == f"attention:1,<unregistered {where}.Steeper>:1"
    assert "<unregistered" in repr(steep)
    assert DiffusionAttention(8, 2, [Direct(), "attention"]).heads_spec() == f"<unregistered {where}.Direct>:1,attention:1"
    diffs = model_record_differences(model_record(steep), model_record(plain))
    assert diffs and "heads of : checkpoint" in diffs[0] and "Steeper" in diffs[0]
    assert model_record_differences(model_record(steep), model_record(
        DiffusionAttention(8, 2, ["attention", Steeper()]))) == []
    with pytest.raises(ValueError, match="unknown operator"):
        build_operator(Steeper().spec())
    assert LaplacianOperator().spec() == "laplacian" and build_operator("heat(t=0.5)").spec().startswith("heat(")


def test_generated_and_inert_subclasses_keep_the_registered_spec():
    """Bug (found before it landed): the first cut of the ``<unregistered ...>`` spec took the class that
    ``torch.nn.utils.parametrize`` generates for a parametrized operator (``ParametrizedHeatOperator``, which adds no
    behaviour) for a class never registered, so a model with a parametrized learnable time wrote a spec that rebuilds
    nothing and its checkpoints no longer matched the unparametrized model's. Classes that add no behaviour (torch's
    wrappers, a subclass that only sets a docstring) are their registered parent; one overriding a private helper
    is not."""
    from torch.nn.utils import parametrize

    from diffusionformer.operators import build_operator
    from diffusionformer.train.checkpoint import model_record, model_record_differences

    class Positive(torch.nn.Module):
        def forward(self, t):
            return t.abs()

    layer = DiffusionAttention(8, 2, "attention:1,heat(t=0.5, learnable=True):1")
    before = model_record(layer)
    parametrize.register_parametrization(layer.operators[1], "t", Positive())
    assert type(layer.operators[1]).__name__ == "ParametrizedHeatOperator"
    assert layer.heads_spec() == "attention:1,heat(t=0.5, steps=6, method='taylor', learnable=True):1"
    assert model_record_differences(before, model_record(layer)) == []
    assert build_operator(layer.operators[1].spec()).spec() == layer.operators[1].spec()

    class Documented(LaplacianOperator):
        """A Laplacian head under another class name: nothing else."""

    class Helper(LaplacianOperator):
        def _apply(self, fn, recurse=True):
            return super()._apply(fn, recurse)

    assert Documented().spec() == "laplacian"
    assert Helper().spec().startswith("<unregistered ")


def test_a_subclass_changing_only_constructor_defaults_keeps_a_rebuildable_spec():
    """Bug (found before it landed): the ``<unregistered ...>`` spec also took a subclass that only changes its
    parent's constructor defaults (``MyHeat(HeatOperator)`` with ``t=2.0``) or its repr for another operator, so its
    spec, which ``heat(t=2.0, ...)`` rebuilds exactly, no longer rebuilt anything and checkpoints of such models saved
    before no longer resumed. A constructor builds the parent's operator (its ``spec_kwargs`` write the values)."""
    from diffusionformer.operators import build_operator
    from diffusionformer.operators.heat import HeatOperator

    class MyHeat(HeatOperator):
        def __init__(self, num_heads: int = 1) -> None:
            super().__init__(t=2.0, learnable=True, num_heads=num_heads)

        def extra_repr(self) -> str:
            return "my heat"

    op = MyHeat()
    assert op.spec().startswith("heat(t=2.0")
    rebuilt = build_operator(op.spec())
    torch.testing.assert_close(rebuilt.coefficients(), op.coefficients())
