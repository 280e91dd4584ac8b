"""Edge-case probes of the task adapters, their metrics, the paired comparisons, the model builder, the validator
and the token-geometry analysis of ``diffusionformer.experiments``.

Probed: every adapter's evaluation against float64 references (batches of one, empty splits, all targets
ignored, NaN logits, label smoothing 0 and near 1, NumPy scalars), ``eval_batch_size``/``max_examples`` of zero,
negative, float or bool; paired contrasts against ``scipy.stats.ttest_rel`` (one seed, identical values,
NaN seeds, seed sets that differ between settings); data-derived overrides given as NumPy ints; the validator
on misspelt task names, dataset options and kinds and on options the adapter refuses; ``analyze`` on
truncated, foreign or missing checkpoints, damaged caches, a task without finished runs and one seed.

Found and fixed (tests named ``test_bug_...``):

- ``tasks``: ``eval_batch_size=-1`` made every evaluation report a loss and an accuracy of exactly 0.0 (no
  batch was scored), ``0`` raised ``range() arg 3 must not be zero``; ``heldout_batches`` said "limit must be
  >= 1" for ``max_examples=0``. All name the argument now.
- ``_metrics``/``tasks``: NaN logits were scored as predictions (``argmax`` picks the NaN's class), so a
  diverged evaluation read as an accuracy equal to that class's share of the labels next to a NaN loss;
  the accuracy is NaN now, as the loss.
- ``tasks``: ``label_smoothing=np.float32(0.1)`` was refused as "must be a float in [0, 1)".
- ``validate``: ``tasks=["typo"]`` checked nothing and reported no problem, and ``tasks="cora"`` picked every
  task whose name is a substring of it; a misspelt dataset option and ``evaluation_keys`` with a misspelt kind
  had no "did you mean"; ``augment``/``label_smoothing`` on node, text or DINO tasks (and ``augment`` on
  sequences) passed the check and failed only when that task's first run started.
- ``build``: a padded ``vocab_size`` given as a NumPy int was refused, where the same Python int is allowed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data

from diffusionformer.data.base import ClassificationData, GraphSetData, NodeData, SequenceTaskData
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments._metrics import accuracy
from diffusionformer.experiments.compare import contrasts
from diffusionformer.experiments.results import RunResult
from diffusionformer.experiments.tables import aggregate
from diffusionformer.experiments.tasks import (ClassificationTask, GraphClassificationTask, NodeTask, SequenceLMTask,
                                               build_task, heldout_batches)
from diffusionformer.experiments.validate import evaluation_keys, validate_experiment

NAN = float("nan")


class _Linear(nn.Module):
    """Logits of a flattened signal (T, F) -> C; ``fill`` replaces them (e.g. NaN)."""

    def __init__(self, T=3, F=2, C=3, fill=None):
        super().__init__()
        self.lin = nn.Linear(T * F, C)
        self.fill = fill

    def forward(self, x):
        out = self.lin(x.flatten(1))
        return out if self.fill is None else torch.full_like(out, self.fill)


class _LM(nn.Module):
    def __init__(self, V=5, fill=None):
        super().__init__()
        self.emb = nn.Embedding(V, V)
        self.fill = fill

    def forward(self, x, y=None):
        logits = self.emb(x)
        if self.fill is not None:
            logits = torch.full_like(logits, self.fill)
        loss = None if y is None else F.cross_entropy(logits.flatten(0, 1), y.flatten())
        return logits, loss


class _Graph(nn.Module):
    def __init__(self, fill=None):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.fill = fill

    def forward(self, x, edge_index, batch=None):
        h = self.lin(x)
        if batch is not None:
            from torch_geometric.utils import scatter

            h = scatter(h, batch, 0, reduce="mean")
        return h if self.fill is None else torch.full_like(h, self.fill)


def _signals(sizes=(5, 4, 3), seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, 3, 2, generator=g) for n in sizes]
    ys = [torch.randint(0, 3, (n,), generator=g) for n in sizes]
    return ClassificationData("s", "sequence", xs[0], ys[0], xs[1], ys[1], xs[2], ys[2], 3, (3, 2))


def _sequences(fill=None):
    g = torch.Generator().manual_seed(1)
    xs = [torch.randint(0, 5, (n, 4), generator=g) for n in (3, 2, 2)]
    ys = [torch.randint(0, 5, (n, 4), generator=g) for n in (3, 2, 2)]
    ys = [y if fill is None else torch.full_like(y, fill) for y in ys]
    ys[1][0, :2] = -100  # a few ignored positions
    return SequenceTaskData("q", xs[0], ys[0], xs[1], ys[1], xs[2], ys[2], 5)


def _graphs():
    g = torch.Generator().manual_seed(2)
    graphs = [Data(x=torch.randn(3, 2, generator=g), edge_index=torch.tensor([[0, 1], [1, 2]]), y=torch.tensor([i % 2]))
              for i in range(6)]
    return GraphSetData("g", graphs, torch.tensor([0, 1, 2]), torch.tensor([3]), torch.tensor([4, 5]), 2, 2)


def _nodes():
    masks = [torch.tensor(m, dtype=torch.bool) for m in ([1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1])]
    data = Data(x=torch.randn(4, 2, generator=torch.Generator().manual_seed(3)),
                edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]), y=torch.tensor([0, 1, 0, 1]),
                train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])
    return NodeData("n", data, 2, 2)


def _ref(logits, y):
    """float64 cross-entropy and accuracy by hand."""
    lg = logits.detach().double()
    lp = lg - lg.logsumexp(-1, keepdim=True)
    return float(-lp[torch.arange(len(y)), y].mean()), float((lg.argmax(-1) == y).double().mean())


# ----------------------------------------------------------------------------- tasks: pins
@pytest.mark.parametrize("eval_batch_size", [1, 2, 512])
def test_classification_evaluate_matches_a_float64_reference_for_any_batch_size(eval_batch_size):
    """Pins: the summed per-batch losses of ClassificationTask (batches of one included) equal one float64 pass,
    and an empty split is NaN (not a perfect 0.0)."""
    data, model = _signals(), _Linear()
    out = ClassificationTask(data, eval_batch_size).evaluate(model, None)
    for split, keys in (("val", ("loss", "val_acc")), ("test", ("test_loss", "test_acc"))):
        x, y = data.split(split)
        loss, acc = _ref(model(x), y)
        assert out[keys[0]] == pytest.approx(loss, rel=1e-6) and out[keys[1]] == pytest.approx(acc, abs=1e-12)
    empty = ClassificationTask(_signals((5, 0, 0))).evaluate(model, None)
    assert all(math.isnan(v) for v in empty.values())


def test_label_smoothing_loss_is_the_smoothed_cross_entropy_of_a_batch_of_one():
    """Pins: (1 - eps) (-log p_y) + eps mean_c(-log p_c) by hand, on a batch of one, for eps near 1 and 0."""
    data, model = _signals(), _Linear()
    x, y = data.x_train[:1], data.y_train[:1]
    lp = model(x).double().log_softmax(-1)[0]
    for eps in (0.0, 0.999):
        loss, metrics = ClassificationTask(data, label_smoothing=eps).loss(model, (x, y))
        ref = (1 - eps) * -lp[y[0]] + eps * -lp.mean()
        assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
        assert metrics["acc"].item() == float(lp.argmax() == y[0])


def test_sequence_lm_scores_only_targets_and_all_ignored_is_nan():
    """Pins: SequenceLMTask scores the non-ignored positions (float64 reference); every target ignored gives NaN."""
    data, model = _sequences(), _LM()
    out = SequenceLMTask(data, 1).evaluate(model, None)
    logits, y = model(data.x_val)[0].flatten(0, 1), data.y_val.flatten()
    keep = y != -100
    loss, acc = _ref(logits[keep], y[keep])
    assert out["loss"] == pytest.approx(loss, rel=1e-6) and out["val_acc"] == pytest.approx(acc)
    ignored = SequenceLMTask(_sequences(fill=-100)).evaluate(model, None)
    assert all(math.isnan(v) for v in ignored.values())


# ----------------------------------------------------------------------------- tasks: bugs
@pytest.mark.parametrize("make", [
    lambda n: ClassificationTask(_signals(), n),
    lambda n: SequenceLMTask(_sequences(), n),
    lambda n: GraphClassificationTask(_graphs(), n),
    lambda n: build_task(_signals(), _Linear(), eval_batch_size=n),
    lambda n: build_task(_nodes(), _Graph(), eval_batch_size=n),
], ids=["classification", "sequence_lm", "graph", "build_task", "build_task_node"])
def test_bug_eval_batch_size_below_one_or_not_an_int_is_named(make):
    """Bug: ``eval_batch_size=-1`` scored no batch and reported loss = accuracy = 0.0 for every split
    (ClassificationTask, GraphClassificationTask), ``0`` raised ``range() arg 3 must not be zero`` and ``2.0``
    "'float' object cannot be interpreted as an integer". Each is refused naming eval_batch_size."""
    for bad, err in ((-1, ValueError), (0, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(err, match="eval_batch_size must be a positive int"):
            make(bad)
    assert make(np.int64(2)) is not None  # a NumPy int is an int


def test_bug_heldout_batches_names_max_examples_and_batch_size():
    """Bug: ``heldout_batches(..., max_examples=0, ...)`` said "limit must be >= 1 or None, got 0" (a name the
    caller never used) and ``batch_size=0`` raised ``range() arg 3 must not be zero``."""
    data, model = _signals(), _Linear()
    with pytest.raises(ValueError, match="max_examples must be a positive int, got 0"):
        heldout_batches(data, model, "test", 0, 2)
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        heldout_batches(data, model, "test", 2, 0)
    batches, _ = heldout_batches(data, model, "test", np.int64(3), 2)
    assert sum(b[0].shape[0] for b in batches) == 3


def test_bug_nan_logits_have_no_accuracy():
    """Bug: NaN logits were scored as predictions (``argmax`` returns the NaN's index, class 0 here), so a
    diverged evaluation reported an accuracy equal to class 0's share of the labels (0.5 below) beside a NaN loss,
    in ``accuracy`` and in every adapter's evaluation. The accuracy is NaN now, as the loss."""
    assert math.isnan(accuracy(torch.full((4, 3), NAN), torch.tensor([0, 1, 2, 0])).item())
    logits = torch.tensor([[1.0, 2.0, 0.0], [0.0, NAN, 0.0]])  # one NaN logit: no prediction for that row
    assert math.isnan(accuracy(logits, torch.tensor([1, 1])).item())
    assert accuracy(torch.tensor([[1.0, math.inf, 0.0]]), torch.tensor([1])).item() == 1.0  # inf is a prediction
    data = _signals()
    data.y_val.zero_()
    data.y_test.zero_()
    outs = [ClassificationTask(data).evaluate(_Linear(fill=NAN), None),
            SequenceLMTask(_sequences(fill=0)).evaluate(_LM(fill=NAN), None),
            GraphClassificationTask(_graphs()).evaluate(_Graph(fill=NAN), None),
            NodeTask(_nodes()).evaluate(_Graph(fill=NAN), None)]
    for out in outs:
        assert all(math.isnan(v) for v in out.values()), out
    loss, metrics = ClassificationTask(data).loss(_Linear(fill=NAN), (data.x_val, data.y_val))
    assert math.isnan(loss.item()) and math.isnan(metrics["acc"].item())
    from diffusionformer.experiments.minibatch import NodeMiniBatchTask

    sampled = NodeMiniBatchTask(_nodes(), [-1], batch_size=1, eval="sampled").evaluate(_Graph(fill=NAN), None)
    assert all(math.isnan(v) for v in sampled.values()), sampled  # the sampled evaluation of mini-batch training


def test_bug_label_smoothing_accepts_numpy_floats():
    """Bug: ``label_smoothing=np.float32(0.1)`` (from a sweep) was refused: "label_smoothing must be a float in
    [0, 1), got np.float32(0.1)"; Python floats were accepted. Values outside [0, 1) are still refused."""
    task = build_task(_signals(), _Linear(), label_smoothing=np.float32(0.25))
    assert task.label_smoothing == 0.25 and type(task.label_smoothing) is float
    for bad in (1.0, np.float32(1.0), NAN, -0.1):
        with pytest.raises(ValueError, match="label_smoothing must be a float in"):
            ClassificationTask(_signals(), label_smoothing=bad)


# ----------------------------------------------------------------------------- compare: pins
def _config(seeds=(0, 1, 2), operators=("attention", "lap"), **task):
    return load_experiment_config({
        "name": "probe", "seeds": list(seeds),
        "tasks": [{"name": "d", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 2}, **task}],
        "operators": [{"name": o} for o in operators],
    })


def _rows(values):
    return aggregate([RunResult("d", op, seed, "completed", "test_acc", v, {"test_acc": v})
                      for (op, seed), v in values.items()])


def test_contrast_pairs_only_shared_finite_seeds_as_scipy_ttest_rel():
    """Pins: seeds one setting lacks and NaN seeds drop out of the pairing; t, p and the CI are
    ``scipy.stats.ttest_rel`` on the remaining pairs; identical values give p = 1, one shared seed no test."""
    st = pytest.importorskip("scipy.stats")
    values = {("attention", 0): 0.50, ("attention", 1): 0.61, ("attention", 2): 0.55, ("attention", 3): 0.4,
              ("lap", 0): 0.62, ("lap", 1): 0.70, ("lap", 2): NAN, ("lap", 3): 0.47, ("lap", 9): 0.9}
    (c,) = contrasts(_rows(values), _config(seeds=(0, 1, 2, 3, 9)))
    a, b = [0.62, 0.70, 0.47], [0.50, 0.61, 0.4]
    ref = st.ttest_rel(a, b)
    ci = ref.confidence_interval(0.95)
    d = c.diff
    assert d.n == 3 and d.df == 2 and d.mean == pytest.approx(np.mean(np.subtract(a, b)))
    assert (d.t, d.p, d.low, d.high) == pytest.approx((ref.statistic, ref.pvalue, ci.low, ci.high), rel=1e-9)
    same = contrasts(_rows({(o, s): 0.5 for o in ("attention", "lap") for s in range(3)}), _config())[0].diff
    assert (same.mean, same.p, same.low, same.high) == (0.0, 1.0, 0.0, 0.0)
    one = contrasts(_rows({("attention", 0): 0.5, ("lap", 0): 0.6}), _config(seeds=(0,)))[0]
    assert one.diff.n == 1 and one.diff.p is None and one.p_holm is None


# ----------------------------------------------------------------------------- validate and build: bugs
def _val_config(**task):
    spec = {"name": "d", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 2},
            "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2}}
    spec.update(task)
    return load_experiment_config({"name": "probe", "seeds": [0], "tasks": [spec], "operators": [{"name": "attention"}]})


def test_bug_validate_refuses_task_names_it_does_not_have():
    """Bug: ``validate_experiment(config, tasks=["digts"])`` checked nothing and returned no problem (a clean
    bill), and ``tasks="dxx"`` (a string) checked task ``"d"``, a substring of it."""
    config = _val_config()
    with pytest.raises(ValueError, match=r"no task\(s\) \['dd'\] \(did you mean 'd'\?\); its tasks: \['d'\]"):
        validate_experiment(config, tasks=["dd"], load_data=False)
    with pytest.raises(TypeError, match="tasks must be a list of task names, got 'dxx'"):
        validate_experiment(config, tasks="dxx", load_data=False)
    assert validate_experiment(config, tasks=("d",), load_data=False) == []
    assert validate_experiment(config, tasks=[], load_data=False) == []


def test_bug_misspelt_dataset_option_and_kind_say_did_you_mean():
    """Bug: a misspelt dataset option was reported as "dataset 'digits' has no option(s) ['normalise']; its
    options: [...]" and ``evaluation_keys("imagee", ...)`` listed the kinds, neither with a "did you mean"."""
    (problem,) = validate_experiment(_val_config(dataset_options={"normalise": True}), load_data=False)
    assert "['normalise'] (did you mean 'normalize'?)" in problem
    with pytest.raises(ValueError, match=r"got 'imagee' \(did you mean 'image'\?\)"):
        evaluation_keys("imagee", "vit-digits")


@pytest.mark.parametrize("task, words", [
    ({"dataset": "karate", "model": "gcn-2layer", "model_overrides": {}, "label_smoothing": 0.1},
     ["label_smoothing applies to supervised classification", "'karate' is of kind 'node'"]),
    ({"dataset": "pydoc-chars", "model": "gpt-char-tiny", "model_overrides": {}, "metric": "val_loss",
      "augment": {"flip": True}, "label_smoothing": 0.1},
     ["augment and label_smoothing apply to supervised", "of kind 'text'", "drop them"]),
    ({"model": "dino-digits", "model_overrides": {}, "metric": "knn_test_acc", "augment": {"flip": True}},
     ["augment applies to supervised classification (image or sequence data, not DINO)", "'dino-digits'"]),
    ({"dataset": "mnist1d", "model": "vit-mnist1d", "model_overrides": {}, "augment": {"crop_padding": 1}},
     ["augment (random crops and flips) needs images", "'mnist1d' is of kind 'sequence'"]),
])
def test_bug_validate_reports_options_the_task_adapter_refuses(task, words):
    """Bug: ``augment``/``label_smoothing`` on a node, text or DINO task (and ``augment`` on sequences) passed
    ``check_experiment``; the comparison started and failed only when that task's first run built its adapter
    ("augment and label_smoothing apply to supervised classification only"), after the earlier tasks trained."""
    (problem,) = validate_experiment(_val_config(**task), load_data=False)
    for w in words:
        assert w in problem
    assert validate_experiment(_val_config(label_smoothing=0.1, augment={"flip": True}), load_data=False) == []


def test_bug_a_padded_vocab_size_may_be_a_numpy_int():
    """Bug: ``model_overrides = {vocab_size = np.int64(128)}`` (a padded vocabulary, from a sweep) was refused
    as changing the data's vocabulary (103), while the Python int 128 was allowed."""
    from diffusionformer.experiments.build import _check_data_overrides

    task = _val_config().tasks[0]
    _check_data_overrides({"vocab_size": 103}, {"vocab_size": np.int64(128)}, task, "model_overrides")
    with pytest.raises(ValueError, match="sets vocab_size = 80"):
        _check_data_overrides({"vocab_size": 103}, {"vocab_size": 80}, task, "model_overrides")
