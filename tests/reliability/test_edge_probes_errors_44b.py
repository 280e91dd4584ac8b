"""Edge probes (44b): user-facing errors, follow-ups of earlier probes.

House rule (STYLE.md): a user input error is a ValueError/TypeError that names the argument and says what was
expected and what came, never a bare torch/Python error from three layers down, and never a silent result.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from diffusionformer.functional import segment_softmax
from diffusionformer.train.schedule import cosine_lr


def _writers():
    """tests/data/data_writers.py (writers of small valid dataset files), loaded by path."""
    spec = importlib.util.spec_from_file_location(
        "df_44b_writers", Path(__file__).resolve().parents[1] / "data" / "data_writers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- 1. segment_softmax's num_nodes
def test_bug_segment_softmax_names_num_nodes_not_dim_size():
    """Bug: ``segment_softmax(src, index, num_nodes)`` reported a bad ``num_nodes`` as "dim_size must be ..." and an
    index out of range as "[0, dim_size=2)": an argument the caller never passed (that of ``scatter_sum``)."""
    src, index = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 1, 0])
    with pytest.raises(ValueError, match=r"^num_nodes must be non-negative, got -1$"):
        segment_softmax(src, index, -1)
    with pytest.raises(TypeError, match=r"^num_nodes must be an int, got float \(2\.0\)$"):
        segment_softmax(src, index, 2.0)
    with pytest.raises(ValueError, match=r"^index values must lie in \[0, num_nodes=1\), got range \[0, 1\]$"):
        segment_softmax(src, index, 1)
    torch.testing.assert_close(segment_softmax(src, index, 2),
                               torch.tensor([math.exp(-2) / (1 + math.exp(-2)), 1.0, 1 / (1 + math.exp(-2))]))


# ----------------------------------------------------------------------------- 2. load_dataset num_folds
@pytest.mark.parametrize("num_folds", [-1, 0, 1])
def test_bug_tu_num_folds_is_checked_without_a_fold(tmp_path, monkeypatch, num_folds):
    """Bug: ``load_dataset("mutag", num_folds=-1)`` (``fold`` left at None) loaded the 80/10/10 split without a
    word: ``num_folds`` was only checked inside the k-fold split, when ``fold`` was given."""
    from diffusionformer.data import load_dataset

    monkeypatch.setenv("DIFFUSIONFORMER_CACHE", str(tmp_path / "cache"))
    _writers().write_tu_zip(tmp_path / "tudataset" / "MUTAG.zip", "MUTAG", node_labels=True)
    with pytest.raises(ValueError, match=rf"num_folds must be an int >= 2, got {num_folds}"):
        load_dataset("mutag", root=tmp_path, verify=False, num_folds=num_folds)
    data = load_dataset("mutag", root=tmp_path, verify=False, num_folds=2)  # a valid count without a fold: as before
    assert data.meta["split"].startswith("stratified, seed=0")


# ----------------------------------------------------------------------------- 3. cosine_lr's step
@pytest.mark.parametrize("step, err, match", [
    ("x", TypeError, r"cosine_lr: expected step an int >= 0, got str \('x'\)"),
    (None, TypeError, r"cosine_lr: expected step an int >= 0, got NoneType \(None\)"),
    (True, TypeError, r"cosine_lr: expected step an int >= 0, got bool \(True\)"),
    (1.5, ValueError, r"cosine_lr: expected step a whole number of updates, got 1\.5"),
    (math.inf, ValueError, r"cosine_lr: expected step a whole number of updates, got inf"),
])
def test_bug_cosine_lr_refuses_a_step_that_counts_no_updates(step, err, match):
    """Bug: a step ``"x"`` or ``None`` raised Python's "'>=' not supported between instances of ..." (naming no
    argument); ``1.5`` came back as a learning rate between two updates' and ``inf`` as ``min_lr``, silently."""
    kw = dict(lr=1.0, min_lr=0.1, warmup_steps=2, decay_steps=6)
    with pytest.raises(err, match=match):
        cosine_lr(step, **kw)
    with pytest.raises(TypeError, match=r"cosine_lr: expected warmup_steps an int >= 0, got NoneType"):
        cosine_lr(0, **{**kw, "warmup_steps": None})
    # whole numbers of any numeric type keep their value
    assert cosine_lr(3.0, **kw) == cosine_lr(np.int64(3), **kw) == cosine_lr(3, **kw)


# ----------------------------------------------------------------------------- 4. non-modules / non-mappings
def test_bug_module_helpers_name_a_non_module():
    """Bug: ``set_recompute([...])`` raised "'list' object has no attribute 'modules'" and
    ``learned_operator_parameters({...})`` "'dict' object has no attribute 'named_parameters'"."""
    from diffusionformer.models.common import learned_operator_parameters
    from diffusionformer.nn import Block, set_recompute

    with pytest.raises(TypeError, match=r"^set_recompute: expected module to be an nn\.Module, got list$"):
        set_recompute([Block(8, 2)])
    with pytest.raises(TypeError, match=r"^learned_operator_parameters: expected model to be an nn\.Module, got dict$"):
        learned_operator_parameters(dict(Block(8, 2).state_dict()))
    assert set_recompute(Block(8, 2, heads="attention:1,laplacian:1")) == 1


@pytest.mark.parametrize("call, match", [
    (lambda p: p.plot_metric_by_depth([[1.0, 0.5]], "variance"), r"^results must be a mapping of .*, got list$"),
    (lambda p: p.plot_spectra(torch.ones(2, 3)), r"^spectra must be a mapping of .*, got Tensor$"),
    (lambda p: p.plot_frequency_response([torch.tensor([0.0, 1.0])]), r"^named_coeffs must be a mapping of .*, got list$"),
    (lambda p: p.plot_pca_token_maps(torch.rand(1, 3, 4, 4), [torch.rand(1, 3, 2, 2)]),
     r"^maps must be a mapping of .*, got list$"),
])
def test_bug_plots_name_a_non_mapping(call, match):
    """Bug: the plots that take ``name -> values`` raised "'list' object has no attribute 'items'" for a list (and
    "Boolean value of Tensor with more than one value is ambiguous" for a tensor) naming no argument."""
    pytest.importorskip("matplotlib")
    from diffusionformer.analysis import plots

    with pytest.raises(TypeError, match=match):
        call(plots)


# ----------------------------------------------------------------------------- 5. save_checkpoint payload
def test_bug_save_checkpoint_names_a_payload_that_is_no_mapping(tmp_path):
    """Bug: ``save_checkpoint(path, None)`` raised "'NoneType' object is not iterable" from ``dict(payload)``, and
    only after it had made the destination's folder."""
    from diffusionformer.train import save_checkpoint

    with pytest.raises(TypeError, match=r"^save_checkpoint: expected payload to be a mapping .*got NoneType$"):
        save_checkpoint(tmp_path / "sub" / "c.pt", None)
    assert not (tmp_path / "sub").exists()


# ----------------------------------------------------------------------------- 6. param_groups rule hint
def test_bug_param_groups_suggests_the_rule_meant():
    """Bug: a misspelt ``rule`` got no "did you mean", unlike every other choice of the package."""
    from diffusionformer.train.optim import param_groups

    with pytest.raises(ValueError, match=r"got 'nanogtp' \(did you mean 'nanogpt'\?\)$"):
        param_groups(nn.Linear(2, 2), 0.1, rule="nanogtp")
    with pytest.raises(ValueError, match=r"got 'xyz'$"):  # nothing close: no hint
        param_groups(nn.Linear(2, 2), 0.1, rule="xyz")


# ----------------------------------------------------------------------------- 7. neighbor_loader seeds
def _graph():
    from torch_geometric.data import Data

    return Data(x=torch.arange(4.0).view(4, 1), edge_index=torch.tensor([[1, 2, 3, 0], [0, 0, 0, 1]]))


@pytest.mark.parametrize("input_nodes, err, match", [
    (torch.tensor([0, 7]), ValueError, r"input_nodes ids must lie in \[0, num_nodes=4\), got range \[0, 7\]"),
    (torch.tensor([True, False]), ValueError, r"a bool input_nodes mask needs one entry per node \(num_nodes=4\), got 2"),
    (torch.tensor([0.5]), TypeError, r"expected input_nodes integer node ids or a bool mask, got dtype torch\.float32"),
    (torch.tensor([[0, 1]]), ValueError, r"expected input_nodes of shape \(B,\)"),
])
def test_bug_neighbor_loader_checks_input_nodes_when_built(input_nodes, err, match):
    """Bug: ``input_nodes`` was checked only by the sampler, at the batch that held a bad id (with ``shuffle``, any
    batch of any epoch), and a bool mask shorter than the graph was accepted silently (its nonzero entries read as
    node ids of the first nodes)."""
    from diffusionformer.data.neighbors import neighbor_loader

    with pytest.raises(err, match=rf"^neighbor_loader: {match}"):
        neighbor_loader(_graph(), [-1], batch_size=1, input_nodes=input_nodes, force_torch=True)


def test_bug_neighbor_loader_names_batch_size():
    """Bug: ``batch_size=None`` built a loader whose first batch failed with "TorchNeighborSampler: expected seed
    node ids of shape (B,), got ()": a message about the seeds, for a missing batch size."""
    from diffusionformer.data.neighbors import neighbor_loader

    with pytest.raises(TypeError, match=r"^neighbor_loader: expected batch_size a positive int .*got NoneType"):
        neighbor_loader(_graph(), [-1], batch_size=None, force_torch=True)
    with pytest.raises(ValueError, match=r"^neighbor_loader: expected batch_size a positive int .*got int \(0\)"):
        neighbor_loader(_graph(), [-1], batch_size=0, force_torch=True)
    mask = torch.tensor([True, False, True, False])  # a full-length mask and a list of ids still load
    assert [b.n_id[: b.batch_size].tolist() for b in neighbor_loader(_graph(), [-1], batch_size=2, input_nodes=mask,
                                                                      force_torch=True)] == [[0, 2]]
    assert [b.n_id[: b.batch_size].tolist() for b in neighbor_loader(_graph(), [-1], batch_size=1, input_nodes=[3, 1],
                                                                      force_torch=True)] == [[3], [1]]


# ----------------------------------------------------------------------------- 8. attention_maps of context heads
@pytest.mark.parametrize("op", ["neutreno", "attnscale", "differential", "grand-nl", "value-residual"])
def test_bug_attention_maps_operator_names_a_context_head(op):
    """Bug: ``DiffusionViT.attention_maps(x, kind="operator")`` of a model with a context operator (one the layer
    calls through ``apply_context()``) ran the whole pass, then raised a bare ``NotImplementedError`` from the
    operator's ``coefficients()`` naming neither the call nor what works instead."""
    from diffusionformer.models import DiffusionViT, ViTConfig

    torch.manual_seed(0)
    model = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, dim=16, depth=2, num_heads=2,
                                   heads=f"attention:1,{op}:1"))
    x = torch.randn(1, 1, 8, 8)
    with pytest.raises(ValueError, match=rf"attention_maps: kind='operator' .*block 0's '{op}' heads \[1\] .*"
                                         r"use kind='P'"):
        model.attention_maps(x, kind="operator")
    maps = model.attention_maps(x, kind="P")  # what works instead
    assert len(maps) == 2 and maps[0].shape == (1, 2, 5, 5)


# ----------------------------------------------------------------------------- 9. names with a leading '.'
@pytest.mark.parametrize("which", ["experiment", "task", "setting"])
@pytest.mark.parametrize("name", [".x.previous", ".x.publishing", ".hidden"])
def test_bug_names_with_a_leading_dot_are_refused(which, name):
    """Bug: a comparison named ``.x.previous`` was accepted, yet that is the folder publishing comparison ``x``
    steps its published files aside to and deletes (``publish.py``): publishing ``x`` removed the published
    ``.x.previous`` comparison; the case-twin checks skip hidden entries as well."""
    from diffusionformer.experiments.config import load_experiment_config

    cfg = {"name": "probe", "seeds": [0],
           "tasks": [{"name": "a", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 4}}],
           "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}]}
    if which == "experiment":
        cfg["name"] = name
    elif which == "task":
        cfg["tasks"][0]["name"] = name
    else:
        cfg["operators"][1]["name"] = name
    with pytest.raises(ValueError, match=r"must not start with '\.'") as err:
        load_experiment_config(cfg)
    assert repr(name) in str(err.value)
    cfg["name"], cfg["tasks"][0]["name"], cfg["operators"][1]["name"] = "x.previous", "a.b", "lap.v2"
    load_experiment_config(cfg)  # dots inside stay valid
