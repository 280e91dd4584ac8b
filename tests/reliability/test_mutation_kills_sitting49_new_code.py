"""Mutation audit (sitting 49, commits fe10dcb..950388d) of the library code added that day: the operator
spec/subclass rules (``DiffusionOperator.__init_subclass__``, ``_registered_class``, ``_INERT``, ``spec()``), a
polynomial started from an unregistered operator, the registry's clash message, the harness's
``_has_rival_formula``, ``_check_learned_parameters_reach`` and head_coefficients errors, and the extension-point
checks (register_dataset/load_dataset, register_metric/``_checked_value``, TaskAdapter/register_task_adapter/
model_overrides_for_data, the runs' ``model_class`` identity and ``_comparable``, LogGroup, bare tuple/list config
fields, register_model): tests that kill mutants the day's tests left alive (each docstring names the mutant). No
GPU is used.

96 hand mutants of the changed lines, one at a time (operators/base.py ``__init_subclass__`` 6,
``_registered_class``/``_INERT`` 7, ``spec()`` 4; operators/polynomial.py 6; operators/registry.py clash message 2;
testing/harness.py ``_has_rival_formula``/``_reference`` 6, ``_check_learned_parameters_reach`` 8, class name and
head_coefficients errors 3; data/registry.py 11; analysis/report.py 10; experiments/tasks.py 9; experiments/runner.py
+ results.py + outputs.py 11; train/loggers.py 7; config.py 3; models/registry.py 3): 74 killed by earlier tests (71
by the day's ``*_49*.py`` files, 3 by older ones: polynomial's ``isinstance(init, DiffusionOperator) and`` dropped by
tests/core/test_mutation_kills_heat_ppr_polynomial.py, the harness's ``or op.uses_context`` dropped by
tests/core/test_registry.py, ``GraphSetData`` dropped from data/registry.py ``_CONTAINERS`` by
tests/data/test_mutation_kills_loaders_registries.py), 20 survivors killed here, 2 equivalent; no library bug.

Equivalent mutants:

* operators/base.py ``__init_subclass__`` ``and hook_owner is not DiffusionOperator`` dropped: the class then gets
  ``DiffusionOperator``'s own hook (the same function object it already resolved to) written into its ``__dict__``.
  Every lookup (``getattr``, the harness's identity test) is unchanged, and ``_registered_class`` cannot tell: the
  class that gets it already defines the method (or takes it from a mixin or ancestor that is itself not inert), so
  it was not inert before either.
* testing/harness.py ``_APPLY_HOOKS`` without ``"apply_matrix"``: ``ExactPPROperator`` is the only rival applied
  through ``apply_matrix`` (the others through ``apply_context``), and a subclass that redefines ``apply_matrix``
  without its causal hook gets the default hook from ``__init_subclass__``, so ``apply_causal_matrix`` already
  differs from the parent's and the subclass gets its own reference. Only a class that redefines ``apply_matrix``
  while binding ``apply_causal_matrix = ExactPPROperator.apply_causal_matrix`` differs: a correct one passes both
  ways, and an incorrect one fails both ways (the formula at ``causal=False``, or its own ``apply_matrix`` against
  the parent's causal solve at ``causal=True``).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from diffusionformer.operators import (AttnScaleOperator, DiffusionOperator, ExactPPROperator, LaplacianOperator,
                                       PolynomialOperator, build_operator)
from diffusionformer.testing import assert_operator


def test_kills_inert_repr_in_INERT():
    """kills: operators/base.py ``_INERT`` ``"__repr__"`` dropped (a subclass of a registered operator that only
    defines ``__repr__``, as the spec() docstring promises it may, wrote ``<unregistered ...>``: its layer's
    heads_spec and checkpoint records no longer rebuilt the model)."""

    class Shown(LaplacianOperator):
        def __repr__(self) -> str:
            return "Shown()"

    assert Shown().spec() == "laplacian"
    assert build_operator(Shown().spec()).spec() == "laplacian"


class _TwoRows(LaplacianOperator):
    """An unregistered two-head operator whose heads differ only after the first coefficient."""

    def coefficients(self):
        return torch.tensor([[1.0, -1.0], [1.0, -2.0]], device=self._c.device, dtype=self._c.dtype)


def test_kills_polynomial_from_unregistered_per_head_rows():
    """kills: operators/polynomial.py ``PolynomialOperator.__init__`` ``(theta == theta[0]).all()`` -> ``.any()``
    and ``(theta[0] if ... else theta)`` -> ``theta[0]`` (a polynomial started from an unregistered operator whose
    heads differ recorded only head 0's coefficients: its spec rebuilt head 1 as ``v - P v``, not ``v - 2 P v``)."""
    op = _TwoRows(num_heads=2)
    poly = PolynomialOperator(steps=2, init=op, num_heads=2)
    assert poly.spec() == "polynomial(steps=2, init=[[1.0, -1.0, 0.0], [1.0, -2.0, 0.0]])"
    again = build_operator(poly.spec(), num_heads=2)
    expected = torch.tensor([[1.0, -1.0, 0.0], [1.0, -2.0, 0.0]], dtype=torch.float64)  # by hand
    torch.testing.assert_close(again.coefficients().detach().double(), expected)


class _BadSolve(ExactPPROperator):
    """ppr-exact whose private solve is off by 1.5 (its apply_* methods are ExactPPROperator's)."""

    def _solve(self, P, v, *, lower_triangular):
        return 1.5 * super()._solve(P, v, lower_triangular=lower_triangular)


def test_kills_rival_formula_identity_test():
    """kills: testing/harness.py ``_has_rival_formula`` ``getattr(type(op), hook) is getattr(base, hook)`` -> ``is
    not`` (a plain ppr-exact, or a subclass that keeps its apply_* methods, was judged by its own float64 path, so a
    subclass with a broken private helper passed :func:`assert_operator`)."""
    with pytest.raises(AssertionError, match="float64 reference"):
        assert_operator(_BadSolve(alpha=0.5))


class _HalfAlphaCausal(ExactPPROperator):
    """A correct PPR operator with teleport ``alpha / 2``, redefining its causal hook (consistently)."""

    def _solve(self, P, v, *, lower_triangular):
        return ExactPPROperator(alpha=self.alpha / 2)._solve(P, v, lower_triangular=lower_triangular)

    def apply_causal_matrix(self, P, v):
        return self._solve(P, v, lower_triangular=True)


class _DoubledScale(AttnScaleOperator):
    """AttnScale with the high-frequency part scaled by ``1 + 2 omega``: redefines apply_context."""

    def apply_context(self, ctx):
        w = 2 * self.omega.to(ctx.v.dtype).view(1, -1, 1, 1)
        pv, dc = ctx.propagate(ctx.v), ctx.uniform(ctx.v)
        return dc + (1.0 + w) * (pv - dc)


@pytest.mark.parametrize("op", [_HalfAlphaCausal(alpha=0.5), _DoubledScale(omega=0.3, learnable=False)],
                         ids=["apply_causal_matrix", "apply_context"])
def test_kills_apply_hooks_listed(op):
    """kills: testing/harness.py ``_APPLY_HOOKS`` without ``"apply_causal_matrix"`` and without ``"apply_context"``
    (a subclass of a rival that redefines how it is applied through that hook alone was held to its parent's
    formula: a correct operator failed :func:`assert_operator`)."""
    assert_operator(op)


def test_kills_learned_parameters_allow_unused():
    """kills: testing/harness.py ``_check_learned_parameters_reach`` ``allow_unused=True`` -> ``False`` (an operator
    with one parameter used and one never used got torch's bare RuntimeError "One of the differentiated Tensors
    appears to not have been used", not the failed law naming the unused parameter)."""

    class Leftover(DiffusionOperator):
        degree = 1

        def __init__(self, num_heads: int = 1) -> None:
            super().__init__(num_heads)
            self.w = nn.Parameter(torch.tensor(0.3))
            self.u = nn.Parameter(torch.tensor(0.5))  # never used

        def coefficients(self):
            return torch.stack([1.0 - self.w, self.w])

        def reset_parameters(self):
            with torch.no_grad():
                self.w.fill_(0.3)
                self.u.fill_(0.5)

    with pytest.raises(AssertionError, match=r"learned parameters \['u'\]"):
        assert_operator(Leftover(num_heads=2))


def test_kills_register_dataset_positional_only_parameters():
    """kills: data/registry.py ``register_dataset`` positional kinds ``(POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD)``
    -> ``(POSITIONAL_OR_KEYWORD,)`` (a loader with a positional-only parameter was registered, and load_dataset,
    which passes keywords, failed with "missing 1 required positional argument")."""
    from diffusionformer.data import list_datasets, register_dataset

    def loader(size, /, *, seed=0):
        return None

    with pytest.raises(TypeError, match=r"loader for 'probe49m-posonly' must take keyword-only arguments, "
                                        r"got \['size'\]"):
        register_dataset("probe49m-posonly", kind="image")(loader)
    assert "probe49m-posonly" not in list_datasets()


def test_kills_register_dataset_var_positional():
    """kills: data/registry.py ``register_dataset`` variadic kinds ``(VAR_POSITIONAL, VAR_KEYWORD)`` ->
    ``(VAR_KEYWORD,)`` (a loader taking ``*sizes`` was registered: its options, read from keyword-only parameters
    with defaults, were incomplete, and what it took positionally was never passed)."""
    from diffusionformer.data import list_datasets, register_dataset

    def loader(*sizes, seed=0):
        return None

    with pytest.raises(TypeError, match=r"not take \*args or \*\*kwargs; got \['sizes'\]"):
        register_dataset("probe49m-star", kind="image")(loader)
    assert "probe49m-star" not in list_datasets()


def test_kills_register_metric_panel_is_an_integer_not_a_bool():
    """kills: analysis/report.py ``register_metric`` ``_is_int(panel)`` -> ``isinstance(panel, int)`` (``panel=True``
    was stored and drawn as panel 1, while a sweep's ``numpy.int64`` panel was refused)."""
    import numpy as np

    from diffusionformer.analysis import report as R

    with pytest.raises(TypeError, match=r"metric 'probe49m_panel': panel must be an int or None, got bool \(True\)"):
        R.register_metric("probe49m_panel", group="smoothing", panel=True)
    R.register_metric("probe49m_panel", group="smoothing", panel=np.int64(2))(lambda view: 1.0)
    try:
        assert R._METRICS["probe49m_panel"].panel == 2
    finally:
        R.unregister_metric("probe49m_panel")


def test_kills_task_adapter_checks_analysed():
    """kills: experiments/tasks.py ``TaskAdapter.__post_init__`` hooks without ``"analysed"`` (``analysed=3`` was
    stored, and the analysis of every run failed later with "'int' object is not callable")."""
    from diffusionformer.experiments.tasks import TaskAdapter

    with pytest.raises(TypeError, match=r"TaskAdapter: analysed must be a function or None, got int \(3\)"):
        TaskAdapter(analysed=3)
    assert TaskAdapter(analysed=lambda model: model).analysed is not None


def test_kills_model_overrides_for_data_returns_a_fresh_dict():
    """kills: experiments/tasks.py ``model_overrides_for_data`` ``return dict(overrides)`` -> ``return overrides``
    (a public function annotated ``-> dict`` handed back the adapter's own mapping: a read-only ``MappingProxyType``
    came back as is, and a caller editing the dict it got edited the adapter's constant for every later run)."""
    import dataclasses
    import types

    from diffusionformer.data import load_dataset
    from diffusionformer.data.base import NodeData
    from diffusionformer.experiments import tasks as T

    @dataclasses.dataclass
    class Cfg:
        hidden: int = 1

    fixed = {"hidden": 4}
    T.register_task_adapter(Cfg, NodeData, T.TaskAdapter(overrides=lambda data: fixed))
    try:
        got = T.model_overrides_for_data(load_dataset("karate"), Cfg)
        assert type(got) is dict and got == {"hidden": 4}
        got["hidden"] = 8
        assert fixed == {"hidden": 4}
    finally:
        T._ADAPTERS.pop((Cfg, NodeData))
    T.register_task_adapter(Cfg, NodeData, T.TaskAdapter(overrides=lambda data: types.MappingProxyType({"hidden": 2})))
    try:
        assert type(T.model_overrides_for_data(load_dataset("karate"), Cfg)) is dict
    finally:
        T._ADAPTERS.pop((Cfg, NodeData))


class _VariantA:
    class Net(nn.Module):
        """A user's model, as ``_VariantB.Net`` under the same class ``__name__``."""

        def __init__(self) -> None:
            super().__init__()
            self.config = None


class _VariantB:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = None


def test_kills_run_identity_model_class_by_qualname():
    """kills: experiments/runner.py ``_run_identity`` ``type(model).__qualname__`` -> ``__name__`` (two user classes
    of one module that share a ``__name__``, ``_VariantA.Net`` and ``_VariantB.Net`` or two factories' local
    ``Net``, were one run: the second's rerun was skipped as finished and reported the first's results)."""
    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments.config import train_config
    from diffusionformer.experiments.runner import _run_identity

    task = load_experiment_config({"name": "q", "seeds": [0], "operators": [{"name": "attention"}],
                                   "tasks": [{"name": "t", "dataset": "digits", "model": "vit-digits"}]}).tasks[0]
    a = _run_identity(task, _VariantA.Net(), train_config(task, 0))
    b = _run_identity(task, _VariantB.Net(), train_config(task, 0))
    assert a["model_class"] == f"{__name__}._VariantA.Net" and b["model_class"] == f"{__name__}._VariantB.Net"
    assert a != b


_TRAIN = {"max_steps": 2, "batch_size": 8, "warmup_steps": 0, "eval_interval": 2, "log_interval": 1,
          "checkpoint_interval": 2}
_TINY_VIT = dict(input_size=(8, 8), patch_size=2, num_classes=10, dim=8, depth=1, num_heads=2)


def test_kills_legacy_custom_run_kept_beside_a_seed_run_later(tmp_path):
    """kills: experiments/results.py ``finished_runs`` ``not _same_definition(_definition(ident), now)`` ->
    ``_definition(ident) != now`` and experiments/outputs.py ``_other_finished_rows`` ``_same_definition(...)`` ->
    ``_definition(ident) == now[...]`` (a user's-model run recorded before ``model_class`` joined the identity was
    dropped from results.json when another seed ran later in its own invocation, "--set seeds=[1]", and left out of
    the comparison's runs with a warning, though it is the same run)."""
    import json
    import warnings

    from diffusionformer.experiments import load_experiment_config, run_experiment
    from diffusionformer.experiments.results import finished_runs
    from diffusionformer.models import DiffusionViT, ViTConfig, register_model
    from diffusionformer.models import registry as MR

    class MyViT(DiffusionViT):
        pass

    def config(seeds):
        return load_experiment_config({"name": "legacy", "seeds": list(seeds), "operators": [{"name": "attention"}],
                                       "tasks": [{"name": "t", "dataset": "digits", "model": "probe49m-vit",
                                                  "train": _TRAIN}]})

    register_model("probe49m-vit", MyViT, ViTConfig, **_TINY_VIT)
    try:
        run_experiment(config([0]), tmp_path, progress=False, log=lambda s: None)
        path = tmp_path / "legacy" / "runs" / "t" / "attention" / "seed0" / "run_config.json"
        stored = json.loads(path.read_text())
        del stored["model_class"]  # as an earlier release recorded it
        path.write_text(json.dumps(stored))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            later = run_experiment(config([1]), tmp_path, progress=False, log=lambda s: None)
            rows = json.loads((tmp_path / "legacy" / "results.json").read_text())["runs"]
            assert sorted(r["seed"] for r in rows) == [0, 1]
            both = finished_runs(tmp_path / "legacy", config([0, 1]), later)
        assert [r.seed for r in both] == [0, 1]
    finally:
        MR._PRESETS.pop("probe49m-vit", None)


def test_kills_log_group_refuses_one_iterable_writer():
    """kills: train/loggers.py ``LogGroup.__init__`` ``alone = callable(...truncate...) and callable(...close...)``
    -> ``alone = False`` (one in-memory writer that is itself a list, passed without a list around it, was taken as
    a sequence of writers: an empty one gave a group of no writers, and training logged nothing, without an error)."""
    from diffusionformer.train.loggers import LogGroup

    class ListLog(list):
        """An in-memory metrics writer: its records are its items."""

        def truncate(self, step):
            del self[:]

        def close(self):
            pass

    with pytest.raises(TypeError, match=r"expected a sequence of metrics writers, got ListLog \(\[\]\)"):
        LogGroup(ListLog())
    group = LogGroup([ListLog()])
    group.append({"step": 1, "loss": 0.5})
    assert group.writers[0] == [{"step": 1, "loss": 0.5}]


def test_kills_log_group_keeps_the_writers_of_a_generator():
    """kills: train/loggers.py ``LogGroup.__init__`` ``writers = list(writers)`` dropped (writers given as a
    generator were used up by the method checks: the group kept none, and training logged nothing) and ``alone =
    ...truncate... and ...close...`` -> ``or`` (a generator, which has ``close()``, was refused as one writer)."""
    from diffusionformer.train.loggers import LogGroup

    class Memory:
        def __init__(self):
            self.records = []

        def append(self, record):
            self.records.append(dict(record))

        def truncate(self, step):
            pass

        def close(self):
            pass

    a, b = Memory(), Memory()
    group = LogGroup(w for w in (a, b))
    group.append({"step": 1})
    assert group.writers == [a, b] and a.records == b.records == [{"step": 1}]


def test_kills_bare_list_config_field():
    """kills: config.py ``check_value`` ``tp in (tuple, list)`` -> ``tp in (tuple,)`` (a user's config field annotated
    with a bare ``list`` refused the tuple a Python caller passed, "expected list, got tuple", where a ``list[int]``
    field read it as a list)."""
    import dataclasses

    from diffusionformer.config import check_value, config_from_dict

    @dataclasses.dataclass
    class Cfg:
        widths: list = dataclasses.field(default_factory=lambda: [4])

    assert config_from_dict(Cfg, {"widths": (8, 16)}).widths == [8, 16]
    assert check_value((8, 16), list, "widths") == [8, 16] == check_value((8, 16), list[int], "widths")


def test_kills_register_model_clash_names_the_registered_class():
    """kills: models/registry.py ``register_model`` ``(by {_PRESETS[name].model_cls!r})`` dropped from the clash
    message (a preset name registered again, a notebook cell run twice, did not say which class holds it)."""
    from diffusionformer.models import DiffusionViT, ViTConfig, register_model
    from diffusionformer.models import registry as MR

    class HeldViT(DiffusionViT):
        pass

    register_model("probe49m-held", HeldViT, ViTConfig, **_TINY_VIT)
    try:
        with pytest.raises(ValueError, match=r"model preset 'probe49m-held' is already registered \(by <class '.*"
                                             r"HeldViT'>\)"):
            register_model("probe49m-held", DiffusionViT, ViTConfig, **_TINY_VIT)
    finally:
        MR._PRESETS.pop("probe49m-held", None)
