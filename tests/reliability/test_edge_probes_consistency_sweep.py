"""Consistency sweep over the whole package: flags and choice names.

Probed and fixed:

* Flags must be Python bools, and the error names the full type: a numpy bool reads ``numpy.bool``, not the
  contradictory "must be a bool, got bool" that ``type(x).__name__`` gave (or only ``np.True_``, from ``{x!r}``).
  Every flag check now uses ``diffusionformer.config._value_type`` (``graph._checks._check_flag`` for the graph
  builders, ``operators.base.check_flag`` for the operators, ``train.config._check_bool`` for ``TrainConfig``).
* Flags that were not checked at all: ``DiffusionAttention(qk_norm=..., bias=...)`` (and so ``Block``) and
  ``Mlp(bias=...)`` took ``"no"`` as True (a bias and q/k norms where none were asked); ``ClassificationTask``'s
  ``augment={"flip": "no"}`` flipped every batch (``bool("no")``) and ``crop_padding=1.5`` padded 1, silently.
* ``grid(self_loops=1)`` said "self_loops and cls_token must be bools" (which one? what value?); a dense
  ``AttentionGraph(checked="no")`` said "checked=False applies to sparse graphs" (it was not False); a sparse one with
  ``causal=np.True_`` said "causal belongs to the dense layout".
* Unknown choice names get a "did you mean": one helper, ``diffusionformer.config._choice_hint`` (case-insensitive
  match first: ``"Sparse"`` -> ``'sparse'``, ``"BF16"`` -> ``'bf16'``; then ``difflib``), at every "must be one of" /
  "expected one of" / "must be 'a' or 'b'" site that had none.
"""

from __future__ import annotations

import typing

import numpy as np
import pytest
import torch

from diffusionformer.analysis.report import list_metrics, register_metric
from diffusionformer.config import check_value
from diffusionformer.data.base import ClassificationData, _check_split
from diffusionformer.data.cifar10 import load_cifar10
from diffusionformer.data.registry import list_datasets, register_dataset
from diffusionformer.experiments.config import TaskConfig
from diffusionformer.experiments.gpu import precision_amp
from diffusionformer.experiments.minibatch import MiniBatchConfig
from diffusionformer.experiments.tasks import ClassificationTask, find_adapter
from diffusionformer.graph import AttentionGraph, complete, grid, knn, sliding_window
from diffusionformer.graph.export import _reduce_heads, grid_layout
from diffusionformer.models import GCNConfig, GraphTransformerConfig, ViTConfig
from diffusionformer.models.dino import DINO
from diffusionformer.nn import DiffusionAttention, set_recompute
from diffusionformer.nn.block import Block, Mlp, make_norm
from diffusionformer.operators import build_operator
from diffusionformer.operators.attnscale import AttnScaleOperator
from diffusionformer.operators.heat import HeatOperator, heat_coefficients, heat_steps_for_tolerance
from diffusionformer.operators.polynomial import PolynomialOperator
from diffusionformer.ops.dense import diffuse_with_weights
from diffusionformer.train.config import TrainConfig, resolve_amp


def _images(kind: str = "image") -> ClassificationData:
    x, y = torch.zeros(4, 1, 4, 4), torch.tensor([0, 1, 0, 1])
    return ClassificationData("toy", kind, x, y, x, y, x, y, num_classes=2, input_shape=(1, 4, 4))


_q = torch.zeros(1, 1, 3, 2)

#: ``name -> call(flag)``: every public flag of the sweep, through the public call that takes it
BOOL_SITES: dict[str, typing.Callable[[object], object]] = {
    "need_weights": lambda v: diffuse_with_weights(_q, _q, _q, [1.0, 0.5], need_weights=v),
    "causal (DiffusionAttention)": lambda v: DiffusionAttention(8, 2, causal=v),
    "recompute": lambda v: DiffusionAttention(8, 2, recompute=v),
    "qk_norm": lambda v: DiffusionAttention(8, 2, qk_norm=v),
    "bias (DiffusionAttention)": lambda v: DiffusionAttention(8, 2, bias=v),
    "bias (Block)": lambda v: Block(8, 2, bias=v),
    "bias (Mlp)": lambda v: Mlp(8, bias=v),
    "enabled": lambda v: set_recompute(DiffusionAttention(8, 2), v),
    "cls_token (grid_layout)": lambda v: grid_layout(2, 2, cls_token=v),
    "causal (dense AttentionGraph)": lambda v: AttentionGraph.dense(3, causal=v),
    "checked (dense AttentionGraph)": lambda v: AttentionGraph("dense", seq_len=3, checked=v),
    "checked (sparse AttentionGraph)": lambda v: AttentionGraph.sparse(torch.tensor([[0], [1]]), 2, checked=v),
    "causal (sparse AttentionGraph)": lambda v: AttentionGraph("sparse", edge_index=torch.tensor([[0], [1]]),
                                                               num_nodes=2, causal=v),
    "self_loops (knn)": lambda v: knn(torch.randn(4, 2), 2, self_loops=v),
    "self_loops (complete)": lambda v: complete(3, self_loops=v),
    "causal (sliding_window)": lambda v: sliding_window(3, 1, causal=v),
    "self_loops (grid)": lambda v: grid(2, 2, self_loops=v),
    "cls_token (grid)": lambda v: grid(2, 2, cls_token=v),
    "learnable (heat)": lambda v: HeatOperator(learnable=v),
    "learnable (heat-exact)": lambda v: build_operator("heat-exact", learnable=v),
    "learnable (ppr)": lambda v: build_operator("ppr", learnable=v),
    "learnable (attnscale)": lambda v: AttnScaleOperator(learnable=v),
    "compile": lambda v: TrainConfig(compile=v),
    "progress": lambda v: TrainConfig(progress=v),
    "flip (ClassificationTask)": lambda v: ClassificationTask(_images(), augment={"flip": v}),
    "flip (TaskConfig)": lambda v: TaskConfig(name="t", dataset="digits", model="vit-tiny", augment={"flip": v}),
}


@pytest.mark.parametrize("site", list(BOOL_SITES))
def test_bug_flags_name_numpy_bool_and_refuse_strings(site: str):
    """Bug: a numpy bool given as a flag read "must be a bool, got bool" (``type(x).__name__``) or only ``np.True_``
    at these sites; ``qk_norm``, ``bias`` (attention, block, MLP) and ``ClassificationTask``'s ``augment.flip`` were not
    checked at all ("no" read as True); ``grid`` named neither the flag nor the value, and a dense graph's
    ``checked="no"`` was "checked=False applies to sparse graphs". Each now refuses a non-bool naming ``numpy.bool``."""
    call = BOOL_SITES[site]
    flag = site.split(" ")[0]
    with pytest.raises((TypeError, ValueError)) as info:
        call(np.True_)
    message = str(info.value)
    assert "numpy.bool" in message and flag in message, message
    assert "got bool" not in message
    with pytest.raises((TypeError, ValueError), match=rf"{flag}.*str \('no'\)"):
        call("no")


def test_bug_classification_task_crop_padding_must_be_an_int():
    """Bug: ``ClassificationTask(augment={"crop_padding": 1.5})`` padded ``int(1.5) = 1`` at the first batch, silently
    (the experiment config checks it; the task built directly did not)."""
    with pytest.raises(ValueError, match=r"crop_padding must be an int >= 0, got float \(1.5\)"):
        ClassificationTask(_images(), augment={"crop_padding": 1.5})
    task = ClassificationTask(_images(), augment={"crop_padding": np.int64(1), "flip": True})  # numpy ints are ints
    x, _ = task.train_batch(0, torch.Generator().manual_seed(0), 2)
    assert x.shape == (2, 1, 4, 4)


#: ``name -> (call with a near-miss name, the choice it should suggest)``
CHOICE_SITES: dict[str, tuple[typing.Callable[[], object], str]] = {
    "layout": (lambda: complete(3, layout="Sparse"), "sparse"),
    "knn metric": (lambda: knn(torch.randn(4, 2), 2, metric="cosin"), "cosine"),
    "grid metric": (lambda: grid(2, 2, metric="Manhattan"), "manhattan"),
    "export head": (lambda: _reduce_heads(torch.rand(1, 2, 3, 3), "Mean"), "mean"),
    "polynomial basis": (lambda: PolynomialOperator(basis="chebychev"), "chebyshev"),
    "heat method": (lambda: HeatOperator(method="Taylor"), "taylor"),
    "heat_coefficients method": (lambda: heat_coefficients(torch.ones(1), 2, method="eulr"), "euler"),
    "heat_steps_for_tolerance method": (lambda: heat_steps_for_tolerance(1.0, 1e-3, method="taylr"), "taylor"),
    "TrainConfig.amp": (lambda: TrainConfig(amp="BF16"), "bf16"),
    "TrainConfig.weight_decay_rule": (lambda: TrainConfig(weight_decay_rule="nanogtp"), "nanogpt"),
    "TrainConfig.loggers": (lambda: TrainConfig(loggers=["jsonl", "CSV"]), "csv"),
    "resolve_amp": (lambda: resolve_amp("FP16", torch.device("cpu")), "fp16"),
    "GraphTransformerConfig.pe": (lambda: GraphTransformerConfig(pe="laplacain"),
                                  "laplacian"),
    "GCNConfig.task": (lambda: GCNConfig(task="Graph"), "graph"),
    "ViTConfig.pool": (lambda: ViTConfig(pool="CLS"), "cls"),
    "DINO output": (lambda: DINO.forward(None, None, output="Student"), "student"),
    "make_norm": (lambda: make_norm("layernrom", 8), "layernorm"),
    "MiniBatchConfig.eval": (lambda: MiniBatchConfig(batch_size=8, num_neighbors=[2], eval="Sampled"), "sampled"),
    "precision_amp": (lambda: precision_amp("BF16"), "bf16"),
    "find_adapter hook": (lambda: find_adapter(None, None, "Task"), "task"),
    "ClassificationTask augment key": (lambda: ClassificationTask(_images(), augment={"flipp": True}), "flip"),
    "split": (lambda: _check_split("tset"), "test"),
    "ClassificationData.kind": (lambda: _images("Image"), "image"),
    "register_dataset kind": (lambda: register_dataset("probe-x", kind="graphs"), "graph"),
    "list_datasets kind": (lambda: list_datasets("Node"), "node"),
    "load_cifar10 source": (lambda: load_cifar10(root=None, source="Pickle"), "pickle"),
    "register_metric group": (lambda: register_metric("probe_metric", group="spectra"), "spectral"),
    "list_metrics group": (lambda: list_metrics("Smoothing"), "smoothing"),
    "check_value Literal": (lambda: check_value("Dense", typing.Literal["dense", "sparse"], "X.layout"), "dense"),
}


@pytest.mark.parametrize("site", list(CHOICE_SITES))
def test_bug_choice_names_get_did_you_mean(site: str):
    """Bug: an unknown choice name ("Sparse", "BF16", "cosin", ...) was refused with the list of choices but no
    "did you mean", the project's rule for unknown names, at each of these sites."""
    call, expected = CHOICE_SITES[site]
    with pytest.raises(ValueError, match=rf"\(did you mean '{expected}'\?\)"):
        call()


def test_choice_hint_rules():
    """The shared helper: case-insensitive first, then difflib; nothing for non-strings or far names."""
    from diffusionformer.config import _choice_hint  # here: the bug tests above run (and fail) without it

    assert _choice_hint("Sparse", ("dense", "sparse")) == " (did you mean 'sparse'?)"
    assert _choice_hint("BF16", ("auto", "bf16", "fp16", "off")) == " (did you mean 'bf16'?)"
    assert _choice_hint("RANDOM_WALK", (None, "laplacian", "random_walk")) == " (did you mean 'random_walk'?)"
    assert _choice_hint("LAPLACIN", (None, "laplacian")) == " (did you mean 'laplacian'?)"
    assert _choice_hint(1, ("dense", "sparse")) == ""
    assert _choice_hint(None, (None, "laplacian")) == ""
    assert _choice_hint("zzzz", ("dense", "sparse")) == ""
    with pytest.raises(ValueError, match=r"got 'sum_'$"):  # near none of the choices: no hint
        GCNConfig(pool="sum_")
