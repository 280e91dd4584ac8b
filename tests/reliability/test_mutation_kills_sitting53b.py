"""Sitting 53 mutation audit (helper 53h): pins for the morning's new code (the evaluation loops' device sums,
``heat_steps_for_tolerance``'s settling on the bound, PPR's fixed-alpha bound, ``_label``, sizes past
``sys.maxsize``, ...) that its own tests left free, each checked against an expectation computed independently."""

from __future__ import annotations

import math
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data

from diffusionformer.data.base import GraphSetData, SequenceTaskData, TextData
from diffusionformer.experiments.tasks import (_EVAL_SEED, ClassificationTask, GraphClassificationTask,
                                               SequenceLMTask, TextLMTask)
from diffusionformer.operators import DiffusionOperator
from diffusionformer.operators.heat import MAX_STEPS, heat_steps_for_tolerance, heat_truncation_error
from experiments_eval_models import LM, GraphSum, Signal, signals  # tests/reliability/conftest.py's path


# ------------------------------------------------------------------ the evaluation loops' float64 device sums
def _reference(logits, y):
    """Mean cross-entropy and accuracy of float64 ``logits`` (rows of ``y`` = -100 ignored), computed by hand."""
    keep = y != -100
    logits, y = logits[keep].double(), y[keep]
    lp = logits - logits.logsumexp(-1, keepdim=True)
    return float(-lp[torch.arange(len(y)), y].mean()), float((logits.argmax(-1) == y).double().mean())


def test_pin_classification_sums_are_a_python_float_running_sum_bit_for_bit():
    """Pin: batches of one, the device sum in float64 gives the very bits of a Python float running sum of the
    per-batch losses (a float32 running sum drifts in the last bits)."""
    torch.manual_seed(0)
    data, model = signals(40), Signal()
    out = ClassificationTask(data, 1).evaluate(model, None)
    total, hits = 0.0, 0
    with torch.no_grad():
        for i in range(40):
            logits = model(data.x_val[i : i + 1]).float()
            total += float(F.cross_entropy(logits, data.y_val[i : i + 1], reduction="sum"))
            hits += int(logits.argmax(-1) == data.y_val[i])
    assert out["loss"] == total / 40 and out["val_acc"] == hits / 40


def test_pin_a_split_of_one_example_is_scored():
    """Pin: a split of one example has a loss and an accuracy (only an empty split is NaN)."""
    torch.manual_seed(0)
    data, model = signals(1), Signal()
    with torch.no_grad():
        loss, acc = _reference(model(data.x_val), data.y_val)
    out = ClassificationTask(data, 4).evaluate(model, None)
    assert out["loss"] == pytest.approx(loss, rel=1e-6) and out["val_acc"] == acc


def test_pin_sequence_scores_average_over_the_targets_not_the_positions():
    """Pin: SequenceLMTask's loss and accuracy are means over the scored targets (ignore_index left out), batch by
    batch as over the whole split."""
    g = torch.Generator().manual_seed(3)
    xs = [torch.randint(0, 5, (6, 4), generator=g) for _ in range(3)]
    ys = [torch.randint(0, 5, (6, 4), generator=g) for _ in range(3)]
    for y in ys:
        y[0, :3] = -100
        y[4, 1:] = -100
    data = SequenceTaskData("q", xs[0], ys[0], xs[1], ys[1], xs[2], ys[2], 5)
    torch.manual_seed(0)
    model = LM()
    with torch.no_grad():
        loss, acc = _reference(model(xs[1])[0].flatten(0, 1), ys[1].flatten())
    for size in (1, 4):
        out = SequenceLMTask(data, size).evaluate(model, None)
        assert out["loss"] == pytest.approx(loss, rel=1e-6) and out["val_acc"] == pytest.approx(acc, abs=1e-12)


def test_pin_graph_scores_are_the_loss_and_accuracy_of_the_split():
    """Pin: GraphClassificationTask's val loss and accuracy, batch by batch, are those of the whole split."""
    g = torch.Generator().manual_seed(5)
    edges = torch.tensor([[0, 1], [1, 2]])
    graphs = [Data(x=torch.randn(3, 2, generator=g), edge_index=edges, y=torch.tensor([i % 2])) for i in range(15)]
    split = torch.arange(15).view(3, 5)
    data = GraphSetData("g", graphs, split[0], split[1], split[2], 2, 2)
    torch.manual_seed(0)
    model = GraphSum()
    with torch.no_grad():
        logits = torch.stack([model.lin(graphs[int(i)].x).sum(0) for i in split[1]])
    loss, acc = _reference(logits, torch.tensor([int(graphs[int(i)].y) for i in split[1]]))
    assert 0.0 < acc < 1.0, acc  # a loss and an accuracy that differ
    out = GraphClassificationTask(data, 2).evaluate(model, None)
    assert out["val_loss"] == pytest.approx(loss, rel=1e-6) and out["val_acc"] == pytest.approx(acc, abs=1e-12)


def test_pin_text_loss_is_the_mean_of_its_batches_losses():
    """Pin: TextLMTask's split loss is the mean of its ``eval_batches`` batch losses (windows drawn from
    ``_EVAL_SEED``), to float64 precision."""
    torch.manual_seed(0)
    data = TextData("t", torch.randint(0, 5, (64,)), torch.randint(0, 5, (64,)), 5, list("abcde"))
    model = LM()
    out = TextLMTask(data, 4, eval_batch_size=2, eval_batches=3).evaluate(model, None)
    for split in ("train", "val"):
        g = torch.Generator().manual_seed(_EVAL_SEED)
        with torch.no_grad():
            losses = [float(model(*data.get_batch(split, 2, 4, g))[1]) for _ in range(3)]
        assert out[f"{split}_loss"] == pytest.approx(sum(losses) / 3, rel=1e-12), split


# ------------------------------------------------------------------ heat_steps_for_tolerance, Euler
def _smallest_euler_steps(t: float, tol: float) -> int | None:
    """The smallest ``K >= max(1, t)`` whose Euler bound ``heat_truncation_error(t, K, 'euler')`` is at most
    ``tol``, by brute force over every ``K`` (``None`` past ``MAX_STEPS``)."""
    for K in range(max(1, math.ceil(t)), MAX_STEPS + 1):
        if float(heat_truncation_error(torch.tensor(t, dtype=torch.float64), K, "euler")) <= tol:
            return K
    return None


def _euler_bound(t: float, K: int) -> float:
    return float(heat_truncation_error(torch.tensor(t, dtype=torch.float64), K, "euler"))


def test_pin_euler_steps_are_at_least_t_for_a_loose_tolerance():
    """Pin: with a tolerance the bound meets at ``K = 1`` already, a non-integer ``t = 1.5`` still gets
    ``K = ceil(t) = 2`` (fewer steps than ``t`` make the unstable product HeatOperator refuses), not ``floor(t)``."""
    assert _euler_bound(1.5, 1) <= 100.0  # K = 1 meets the tolerance: only K >= t rules it out
    assert heat_steps_for_tolerance(1.5, 100.0, "euler") == 2


@pytest.mark.parametrize("t, K", [(-0.376, 1), (-0.376, MAX_STEPS), (0.822, 1), (2.5, 3)])
def test_pin_euler_steps_settle_on_the_bound_at_the_ends_of_the_range(t, K):
    """Pin: a tolerance equal to the Euler bound at ``K`` gives that ``K`` at both ends of the range: the smallest
    allowed ``K`` (``max(1, ceil(t))``; the rounded estimate said one more) and ``MAX_STEPS`` (the estimate said
    ``MAX_STEPS + 1``), as a brute-force search over the bound finds."""
    tol = _euler_bound(t, K)
    assert _smallest_euler_steps(t, tol) == K
    assert heat_steps_for_tolerance(t, tol, "euler") == K


def test_pin_euler_steps_refuse_a_tolerance_one_ulp_under_the_bound_at_max_steps():
    """Pin: a tolerance one ulp under the Euler bound at ``MAX_STEPS`` (the estimate rounds to exactly
    ``MAX_STEPS``) is out of reach: a ValueError, not ``K = MAX_STEPS`` whose bound is over the tolerance."""
    t = 0.822
    tol = math.nextafter(_euler_bound(t, MAX_STEPS), 0.0)
    assert _smallest_euler_steps(t, tol) is None
    with pytest.raises(ValueError, match=f"needs more than {MAX_STEPS} steps|K=257 > {MAX_STEPS}"):
        heat_steps_for_tolerance(t, tol, "euler")


def test_pin_euler_steps_name_a_finite_estimate_past_the_cap():
    """Pin: an estimate past ``MAX_STEPS`` that a float holds is named (``K=... > 256``); only one past float's range
    reads "more than 256"."""
    with pytest.raises(ValueError, match=rf"needs K=[0-9.e+]+ > {MAX_STEPS} steps"):
        heat_steps_for_tolerance(1.0, 1e-299, "euler")
    with pytest.raises(ValueError, match=f"needs more than {MAX_STEPS} steps"):
        heat_steps_for_tolerance(1.0, 1e-308, "euler")


# ------------------------------------------------------------------ heat_truncation_error, Taylor, t < 0
def test_pin_negative_time_taylor_bound_is_e_to_2t_times_the_poisson_tail():
    """Pin: for ``t < 0`` the Taylor bound is ``e^(2|t|) Pr[Poisson(|t|) > K]``, the tail summed here term by term
    (no cancellation), to 1e-13 relative; within ``MAX_STEPS`` and past it (the incomplete-gamma branch, checked as
    the ratio to ``t > 0``'s bound)."""
    a, K = 1.3, 4
    tail = math.exp(-a) * math.fsum(a**k / math.factorial(k) for k in range(K + 1, 60))
    got = float(heat_truncation_error(torch.tensor(-a, dtype=torch.float64), K))
    assert got == pytest.approx(math.exp(2 * a) * tail, rel=1e-13, abs=0.0)
    positive = float(heat_truncation_error(torch.tensor(a, dtype=torch.float64), K))
    assert positive == pytest.approx(tail, rel=1e-13, abs=0.0)
    steps = MAX_STEPS + 100
    pos, neg = (float(heat_truncation_error(torch.tensor(s * 300.0, dtype=torch.float64), steps)) for s in (1, -1))
    assert 0.0 < pos < 1.0 and neg / pos == pytest.approx(math.exp(600.0), rel=1e-12)


# ------------------------------------------------------------------ PPROperator.truncation_error, fixed alpha
def test_pin_fixed_alpha_ppr_bound_is_the_python_float_on_the_operators_device():
    """Pin: a fixed alpha's bound is ``2 (1 - alpha)^K`` as Python floats compute it (torch's pow of a float64
    tensor by an int differs by an ulp here), float64, on the operator's device (meta: no values)."""
    from diffusionformer.operators.ppr import PPROperator

    op = PPROperator(alpha=0.433, steps=3)
    bound = op.truncation_error()
    assert bound.dtype == torch.float64 and float(bound) == 2.0 * (1.0 - 0.433) ** 3
    assert float(2.0 * torch.tensor(1.0 - 0.433, dtype=torch.float64) ** 3) != float(bound)  # the ulp it avoids
    assert op.to("meta").truncation_error().device.type == "meta"


# ------------------------------------------------------------------ operators.base._label
def test_pin_an_unnamed_operator_is_named_by_its_qualified_class_name():
    """Pin: an unregistered operator class defined inside another is named by its qualified name
    (``Outer.Inner``), not the bare class name shared by every such nested class."""
    from diffusionformer.operators import DiffusionOperator
    from diffusionformer.operators.base import _label

    class Outer:
        class Inner(DiffusionOperator):
            is_polynomial = False
            degree = 0

    op = Outer.Inner()
    assert _label(op) == Outer.Inner.__qualname__ and _label(op).endswith("Outer.Inner")


# ------------------------------------------------------------------ models.common.check_positive_int
def test_pin_sizes_up_to_sys_maxsize_pass_and_one_more_is_refused():
    """Pin: ``sys.maxsize`` is the largest size accepted (it fits an index); ``sys.maxsize + 1`` is a ValueError
    naming the field and the value."""
    from diffusionformer.models.common import check_positive_int

    check_positive_int("cfg", depth=sys.maxsize)
    with pytest.raises(ValueError, match=rf"^cfg\.depth must be a positive int of at most {sys.maxsize}.*"
                                         rf"got {sys.maxsize + 1}$"):
        check_positive_int("cfg", depth=sys.maxsize + 1)


# ------------------------------------------------------------------ experiments.build._check_graph_model
def test_pin_graph_model_check_sees_an_operator_replaced_after_the_layer_was_built():
    """Pin: the runner's graph-model check reads the layer's plan for its operators now: an operator put in
    (``attn.operators[i] = op``) after the model was built, that needs a dense ``P``, is refused as the layer's own
    sparse call refuses it (a plan left stale accepted it), before any forward refreshed that plan."""
    from types import SimpleNamespace

    from diffusionformer.experiments.build import _check_graph_model
    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig
    from diffusionformer.operators import build_operator

    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, dim=8, depth=1, num_heads=2,
                                                             heads="attention:1,heat:1"))
    task = SimpleNamespace(name="k", model="graph-node-small")
    _check_graph_model(task, model)  # both operators sparse: accepted
    model.blocks[0].attn.operators[1] = build_operator("heat-exact")
    with pytest.raises(ValueError, match="^task 'k': model 'graph-node-small' layer 0 has operator 'heat-exact', "
                                         "which needs a dense P"):
        _check_graph_model(task, model)
    with pytest.raises(ValueError, match="does not support the sparse back-end"):
        model(torch.randn(4, 3), torch.tensor([[0, 1, 2], [1, 2, 3]]))


# ------------------------------------------------------------------ config.check_value's union branch
def test_pin_union_names_the_bad_item_of_its_one_container_arm():
    """Pin: the one arm of a union that takes the value's kind of container gives its own error, naming the item:
    a tuple for ``tuple[int, ...] | None`` (a list arm only is not enough), a table for a dataclass arm."""
    import dataclasses

    from diffusionformer.config import check_value

    @dataclasses.dataclass
    class Table:
        x: int = 1

    for value in ((1, "x"), [1, "x"]):
        with pytest.raises(TypeError, match=r"^w\[1\]: expected an int, got str 'x'$"):
            check_value(value, tuple[int, ...] | None, "w")
    with pytest.raises(TypeError, match=r"^w\.x: expected an int, got str 'a'$"):
        check_value({"x": "a"}, Table | None, "w")


@pytest.mark.parametrize("value, tp, expected", [
    ([1, "x"], list[int] | tuple[float, ...], "w: expected list | tuple, got list [1, 'x']"),  # two arms fit
    ("abc", list[int] | None, "w: expected list | None, got str 'abc'"),  # no arm of its kind
    ([1], dict[str, int] | None, "w: expected dict | None, got list [1]"),
])
def test_pin_union_keeps_its_own_error_unless_exactly_one_arm_is_of_the_values_kind(value, tp, expected):
    """Pin: where no arm, or more than one, is of the value's container kind, the union's error names the union
    (which arm's item error is meant is unknown, or none is)."""
    from diffusionformer.config import check_value

    with pytest.raises(TypeError) as info:
        check_value(value, tp, "w")
    assert str(info.value) == expected


# ------------------------------------------------------------------ experiments.validate._out_of_memory
def test_pin_out_of_memory_is_told_by_type_or_by_message():
    """Pin: torch's OutOfMemoryError whatever its text, and a RuntimeError saying "out of memory" (MPS) or "can't
    allocate memory" (the CPU allocator), are allocation failures; another RuntimeError is not."""
    from diffusionformer.experiments.validate import _out_of_memory

    assert _out_of_memory(torch.OutOfMemoryError("Tried to allocate 2.00 GiB"))
    assert _out_of_memory(RuntimeError("MPS backend out of memory (MPS allocated: 1.00 GB)"))
    assert _out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: can't allocate "
                                       "memory: you tried to allocate 8796093022208 bytes."))
    assert not _out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"))


_TINY = """
name = "tiny"
seeds = [0]

[[tasks]]
name = "digits"
dataset = "digits"
model = "vit-digits"
metric = "test_acc"
model_overrides = { dim = 16, depth = 1, num_heads = 2, mlp_ratio = 1.0 }
[tasks.train]
max_steps = 2
batch_size = 16
eval_interval = 2

[[operators]]
name = "attention"
"""


def test_pin_a_runtime_error_that_is_no_allocation_failure_is_not_a_config_problem(tmp_path, monkeypatch):
    """Pin: only an allocation failure while building a model is read as "too large for this machine's memory";
    another RuntimeError (a bug in a model) propagates as it is, not reported as a size problem."""
    from diffusionformer.experiments import validate as validate_module
    from diffusionformer.experiments.config import load_experiment_config

    path = tmp_path / "c.toml"
    path.write_text(_TINY, encoding="utf-8")
    config = load_experiment_config(path)
    assert validate_module.validate_experiment(config, load_data=False) == []

    def broken(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)")

    monkeypatch.setattr(validate_module, "_resolve_model", broken)
    with pytest.raises(RuntimeError, match="^mat1 and mat2 shapes"):
        validate_module.validate_experiment(config, load_data=False)



def test_pin_an_overflow_while_building_a_model_is_a_config_problem(tmp_path, monkeypatch):
    """Pin: a bare OverflowError while building a model (a size no index holds) is reported as too large, naming
    the task, the setting and the overrides, not raised."""
    from diffusionformer.experiments import validate as validate_module
    from diffusionformer.experiments.config import load_experiment_config

    path = tmp_path / "c.toml"
    path.write_text(_TINY, encoding="utf-8")

    def overflowing(*args, **kwargs):
        raise OverflowError("cannot fit 'int' into an index-sized integer")

    monkeypatch.setattr(validate_module, "_resolve_model", overflowing)
    problems = validate_module.validate_experiment(load_experiment_config(path), load_data=False)
    assert problems == ["task 'digits' / setting 'attention': model 'vit-digits' cannot be built with model_overrides "
                        "{'dim': 16, 'depth': 1, 'num_heads': 2, 'mlp_ratio': 1.0}, too large for this machine's "
                        "memory: OverflowError: cannot fit 'int' into an index-sized integer"]


def test_pin_a_model_that_is_not_implemented_is_its_own_problem(tmp_path, monkeypatch):
    """Pin: a NotImplementedError while building a model (a RuntimeError subclass, but no allocation failure) is a
    problem of its task and setting in its own words, neither raised nor read as "too large"."""
    from diffusionformer.experiments import validate as validate_module
    from diffusionformer.experiments.config import load_experiment_config

    path = tmp_path / "c.toml"
    path.write_text(_TINY, encoding="utf-8")

    def unimplemented(*args, **kwargs):
        raise NotImplementedError("this model has no sparse back-end")

    monkeypatch.setattr(validate_module, "_resolve_model", unimplemented)
    problems = validate_module.validate_experiment(load_experiment_config(path), load_data=False)
    assert problems == ["task 'digits' / setting 'attention': NotImplementedError: this model has no sparse back-end"]

# ------------------------------------------------------------------ experiments.results._nothing_to_continue
def test_pin_a_run_has_something_to_continue_once_it_wrote_a_checkpoint_or_a_summary(tmp_path):
    """Pin: a run folder with neither a checkpoint nor ``summary.json`` has nothing to continue; either one alone
    (a run killed after its first checkpoint, a finished run whose checkpoint was deleted), or a link of either name
    whose target is gone, is something (not silently restarted under another config)."""
    import os

    from diffusionformer.experiments.results import _nothing_to_continue
    from diffusionformer.train.checkpoint import CHECKPOINT_NAME

    assert _nothing_to_continue(tmp_path)
    (tmp_path / "run_config.json").write_text("{}", encoding="utf-8")
    (tmp_path / "metrics.jsonl").write_text("", encoding="utf-8")
    assert _nothing_to_continue(tmp_path)
    for name in (CHECKPOINT_NAME, "summary.json"):
        rdir = tmp_path / name.replace(".", "_")
        rdir.mkdir()
        (rdir / name).write_bytes(b"x")
        assert not _nothing_to_continue(rdir), name
        link = tmp_path / f"link_{name.replace('.', '_')}"
        link.mkdir()
        try:
            os.symlink(tmp_path / "gone", link / name)
        except (OSError, NotImplementedError):  # pragma: no cover - no symlinks here
            continue
        assert not _nothing_to_continue(link), name


# ------------------------------------------------------------------ experiments.config._check_path_name
def test_pin_an_invisible_character_is_named_by_its_four_digit_code_point_and_name():
    """Pin: the refused format character is named as Unicode writes it, ``U+`` and at least four hex digits, then
    its name: a soft hyphen (U+00AD, category Cf) reads "U+00AD SOFT HYPHEN", not "U+AD"."""
    import unicodedata

    from diffusionformer.experiments.config import _check_path_name

    assert unicodedata.category("\u00ad") == "Cf"
    with pytest.raises(ValueError, match=r"holds U\+00AD SOFT HYPHEN$"):
        _check_path_name("setting name", "soft\u00adhyphen")
    with pytest.raises(ValueError, match=r"holds U\+200D ZERO WIDTH JOINER$"):  # the first of two, named
        _check_path_name("setting name", "a\u200db\u200bc")


# ------------------------------------------------------------------ bugs
@pytest.mark.parametrize("override, value, words", [
    ("dim", 2**61, ["Storage size calculation overflowed"]),  # under sys.maxsize: its bytes overflow int64
    ("dim", 2**62, ["Storage size calculation overflowed"]),
    ("mlp_ratio", 1e300, ["Overflow when unpacking long long"]),  # a hidden width of 1.6e301
])
def test_bug_a_size_whose_bytes_overflow_int64_is_a_config_problem(tmp_path, capsys, override, value, words):
    """Bug: a model size under ``sys.maxsize`` whose storage overflows torch's int64 byte count (``dim = 2**61``:
    "RuntimeError: Storage size calculation overflowed") was no allocation failure to ``_out_of_memory``, so it
    escaped the check that builds every run's model: ``show`` and ``run`` ended in a traceback naming neither the
    task, the setting nor the override (the very case the check was made for, one size class up). And an
    ``mlp_ratio`` whose hidden width overflows int64 was reported with torch's C++ backtrace (some 60 lines of
    frames) and without the overrides. Both are now "too large for this machine's memory", naming the overrides,
    on one line."""
    from diffusionformer.experiments.cli import main
    from diffusionformer.experiments.config import load_experiment_config
    from diffusionformer.experiments.validate import validate_experiment

    path = tmp_path / "c.toml"
    path.write_text(_TINY, encoding="utf-8")
    setting = f"tasks.digits.model_overrides.{override}={value!r}"
    problems = validate_experiment(load_experiment_config(path, [setting]), load_data=False)
    assert len(problems) == 1, problems
    problem = problems[0]
    assert problem.startswith("task 'digits' / setting 'attention': model 'vit-digits' cannot be built with "
                              "model_overrides {'dim': "), problem
    assert f"'{override}': {value!r}" in problem and "too large for this machine's memory" in problem, problem
    assert all(w in problem for w in words) and "\n" not in problem and "frame #" not in problem, problem
    rc = main(["show", str(path), "--set", setting])
    text = "".join(capsys.readouterr())
    assert rc == 2 and "too large for this machine's memory" in text and "Traceback" not in text, text


# ------------------------------------------------------------------ the layer's planned degree; init's skip
class _Grown(DiffusionOperator):
    """A polynomial ``sum_k theta_k P^k`` whose degree is its attribute ``steps``."""

    def __init__(self, steps: int = 2, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.steps = steps
        self.theta = nn.Parameter(torch.randn(num_heads, steps + 1))

    @property
    def degree(self) -> int:
        return self.steps

    def coefficients(self) -> torch.Tensor:
        return self.theta


def test_pin_a_grown_degree_names_the_heads_of_its_group_by_their_index():
    """Pin: the refusal of an operator whose degree grew in place names the layer's heads it covers by their index
    in the layer (heads 2 and 3 after two attention heads), not counted from 0 within its group."""
    from diffusionformer.nn.attention import DiffusionAttention

    torch.manual_seed(0)
    grown = _Grown(2, num_heads=2)
    layer = DiffusionAttention(8, 4, heads=["attention", "attention", grown, grown])
    x = torch.randn(1, 5, 8)
    layer(x)
    assert any(o is grown for o in layer.operators)
    grown.steps = 3
    grown.theta = nn.Parameter(torch.randn(2, 4))
    with pytest.raises(ValueError, match=r"has degree 3, but the layer planned its heads \[2, 3\] for degree 2"):
        layer(x)


def test_pin_initialisation_keeps_an_operators_nested_submodules():
    """Pin: ``init_transformer_weights`` leaves every module inside an operator as its constructor made it, nested
    ones (``op.gate[0]``, a Linear in a Sequential) too; the model's own Linear is drawn anew."""
    from diffusionformer.models.common import init_transformer_weights

    class Gated(_Grown):
        def __init__(self) -> None:
            super().__init__(1)
            self.gate = nn.Sequential(nn.Linear(3, 3))

    torch.manual_seed(0)
    model = nn.Module()
    model.op, model.lin = Gated(), nn.Linear(3, 3)
    kept = [p.detach().clone() for p in model.op.parameters()]
    drawn = model.lin.weight.detach().clone()
    init_transformer_weights(model, 1, std=0.02)
    assert all(torch.equal(a, b) for a, b in zip(kept, model.op.parameters()))
    assert not torch.equal(drawn, model.lin.weight) and float(model.lin.bias.detach().abs().sum()) == 0.0


def test_pin_zero_sum_lives_on_the_given_device():
    """Pin: an evaluation loop's running sum is made on the model's device (meta here: no values), float64."""
    from diffusionformer.experiments._metrics import _zero_sum

    z = _zero_sum(torch.device("meta"))
    assert z.device.type == "meta" and z.dtype == torch.float64 and z.shape == ()
    assert float(_zero_sum(torch.device("cpu"))) == 0.0


def test_pin_too_large_names_the_overrides_the_model_was_built_with(tmp_path):
    """Pin: the "too large" problem names the model overrides the model was built with: a setting's own override
    of a size the task also sets (``depth``) wins over the task's, as in the model."""
    from diffusionformer.experiments.config import load_experiment_config
    from diffusionformer.experiments.validate import validate_experiment

    path = tmp_path / "c.toml"
    path.write_text(_TINY + f"model_overrides = {{ depth = {sys.maxsize} }}\n", encoding="utf-8")
    problems = validate_experiment(load_experiment_config(path), load_data=False)
    assert len(problems) == 1 and "too large for this machine's memory" in problems[0], problems
    assert f"{{'dim': 16, 'depth': {sys.maxsize}, 'num_heads': 2, 'mlp_ratio': 1.0}}" in problems[0], problems
