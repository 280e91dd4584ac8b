"""Sitting 52 mutation audit, second pass (helper 52k): pins for the day's later code (``_edge_layout``'s shared CSR
layout, capture's ambiguous cut, ...) that its own tests left free, and the bugs found on the way."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.ops import csr
from diffusionformer.ops.csr import _edge_layout, _layout_key


@pytest.fixture(autouse=True)
def _no_shared_layout():
    csr._LAST_LAYOUT[0] = None
    yield
    csr._LAST_LAYOUT[0] = None


def _edges() -> torch.Tensor:
    return torch.tensor([[0, 1, 2, 0], [0, 1, 1, 2]])


# ----------------------------------------------------------------------------------- ops.csr._edge_layout
def test_bug_a_used_edge_index_buffer_can_still_be_swapped_by_load_state_dict():
    """Bug: the shared CSR layout held a weak reference to the ``edge_index`` tensor itself, and
    :func:`torch.utils.swap_tensors` refuses a tensor with a weak reference: after one sparse forward, a model's
    ``edge_index`` buffer could not be loaded by ``load_state_dict`` under
    ``torch.__future__.set_swap_module_params_on_conversion(True)`` ("Cannot swap t1 because it has weakref
    associated with it"). The layout now references the tensor's storage."""
    from diffusionformer.ops.sparse import propagate_sparse

    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("edge_index", _edges())

    model = Graph()
    x, w = torch.randn(3, 2, 4), torch.rand(4, 2)
    propagate_sparse(w, x, model.edge_index, num_nodes=3, backend="csr")
    new = torch.tensor([[1, 1, 2, 0], [0, 1, 1, 2]])
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.load_state_dict({"edge_index": new})
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)
    assert model.edge_index.tolist() == new.tolist()
    torch.testing.assert_close(propagate_sparse(w, x, model.edge_index, num_nodes=3, backend="csr"),
                               propagate_sparse(w, x, new.clone(), num_nodes=3, backend="csr"), rtol=0, atol=0)


def test_pin_the_layout_key_names_storage_geometry_version_and_node_count():
    """Pin: every part of the key (on an accelerator the key alone decides: no copy of the values is compared)."""
    e = _edges()
    assert _layout_key(e, 3) == (e.data_ptr(), e.device, e.dtype, (2, 4), (4, 1), 0, e._version, 3)
    view = torch.tensor([[9, 0, 1, 2, 0], [9, 0, 1, 1, 2]])[:, 1:]
    assert _layout_key(view, 5)[3:] == ((2, 4), (5, 1), 1, 0, 5)
    view.add_(0)
    assert _layout_key(view, 5)[6] == 1


class _Sub(torch.Tensor):
    pass


@pytest.mark.parametrize("case", ["subclass", "meta", "inference tensor", "inference mode", "dispatch mode",
                                  "compiling"])
def test_pin_no_layout_is_shared_where_the_key_is_none(case, monkeypatch):
    """Pin: each condition of ``_layout_key`` alone gives no key, and without a key every call builds its own
    layout (none is kept for a later call)."""
    from contextlib import nullcontext

    from torch.utils._python_dispatch import TorchDispatchMode

    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    e = _edges()
    context = nullcontext()
    if case == "subclass":
        e = e.as_subclass(_Sub)
    elif case == "meta":
        e = e.to("meta")
    elif case == "inference tensor":
        with torch.inference_mode():
            e = _edges()
    elif case == "inference mode":
        context = torch.inference_mode()
    elif case == "dispatch mode":
        context = Passing()
    else:
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with context:
        assert _layout_key(e, 3) is None
        assert _edge_layout(e, 3) is not _edge_layout(e, 3)
    assert csr._LAST_LAYOUT[0] is None


def test_pin_a_functorch_wrapped_edge_index_has_no_key():
    """Pin: a tensor batched by ``vmap`` (functorch-wrapped) gets no key."""
    keys = []

    def f(t):
        keys.append(_layout_key(t, 3))
        return t * 1

    torch.func.vmap(f)(torch.stack([_edges(), _edges()]))
    assert keys == [None]


def test_pin_a_layout_is_shared_with_the_same_tensor_only():
    """Pin: the same unmodified tensor gets the same layout; another tensor object over the same memory (``detach``,
    same key), the same tensor after an in-place write of equal values (a version bump) and another node count each
    get their own."""
    e = _edges()
    first = _edge_layout(e, 3)
    assert _edge_layout(e, 3) is first
    assert _edge_layout(e.detach(), 3) is not first
    again = _edge_layout(e, 3)
    e.add_(0)
    assert _edge_layout(e, 3) is not again
    last = _edge_layout(e, 3)
    assert _edge_layout(e, 4) is not last


def test_pin_a_layout_made_in_inference_mode_is_not_saved_by_a_training_backward():
    """Pin: an ordinary ``edge_index`` first used under inference mode, then for training through the weights'
    reordering (unsorted edges: ``index_select`` saves the layout's order for its backward), trains; a layout made
    under inference mode and shared failed ("Inference tensors cannot be saved for backward")."""
    from diffusionformer.ops.sparse import propagate_sparse

    e = torch.tensor([[0, 1, 2, 0], [2, 1, 1, 0]])
    x, w = torch.randn(3, 2, 4, requires_grad=True), torch.rand(4, 2, requires_grad=True)
    with torch.inference_mode():
        propagate_sparse(w.detach(), x.detach(), e, num_nodes=3, backend="csr")
    propagate_sparse(w, x, e, num_nodes=3, backend="csr").sum().backward()
    assert w.grad is not None and x.grad is not None


# ----------------------------------------------------------------------------------- models.gpt.crop_block_size
def test_pin_crop_block_size_to_the_same_size_is_allowed_and_a_crop_frees_the_rows():
    """Pin: ``block_size`` equal to the model's is in range (a no-op), ``numpy`` ints are ints; the cropped position
    embedding owns only its rows (a view of the old one kept, and saved, the whole table) and keeps its
    ``requires_grad``."""
    import numpy as np

    from diffusionformer.models import DiffusionGPT, GPTConfig

    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=16, n_layer=1, n_head=2, n_embd=16))
    model.crop_block_size(16)
    assert model.config.block_size == 16 and model.pos_emb.weight.shape == (16, 16)
    model.crop_block_size(np.int64(4))
    assert type(model.config.block_size) is int and model.config.block_size == 4
    w = model.pos_emb.weight
    assert w.untyped_storage().nbytes() == 4 * 16 * w.element_size()
    w.requires_grad_(False)  # a frozen position embedding stays frozen
    model.crop_block_size(2)
    assert not model.pos_emb.weight.requires_grad


def test_pin_generate_top_k_false_gets_no_hint_about_zero():
    """Pin: ``top_k=False`` (a bool, equal to 0) is refused without the hint meant for ``top_k=0``."""
    from diffusionformer.models import DiffusionGPT, GPTConfig

    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
    idx = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"got False$"):
        model.generate(idx, 1, top_k=False)
    with pytest.raises(ValueError, match=r"got 0 \(None samples from every token"):
        model.generate(idx, 1, top_k=0)


# ----------------------------------------------------------------------------------- train.optim._exempt_names
def test_pin_param_groups_read_the_hook_through_two_wrappers():
    """Pin: the wrapped model's ``no_weight_decay`` is looked for through every ``.module`` level (a DataParallel
    around a DataParallel), its names prefixed with the path to the hook's module."""
    from diffusionformer.models import create_model
    from diffusionformer.train import param_groups
    from diffusionformer.train.optim import _exempt_names

    vit = create_model("vit-digits")
    wrapped = torch.nn.DataParallel(torch.nn.DataParallel(vit))
    assert _exempt_names(wrapped) == {f"module.module.{n}" for n in vit.no_weight_decay()}
    bare = {g["weight_decay"]: sorted(g["names"]) for g in param_groups(vit, 0.1)}
    got = {g["weight_decay"]: sorted(n.removeprefix("module.module.") for n in g["names"])
           for g in param_groups(wrapped, 0.1)}
    assert got == bare and "pos_embed" in bare[0.0]


def test_bug_edges_freed_while_the_layout_lock_is_held_do_not_deadlock(monkeypatch):
    """Bug: the callback that drops the shared layout when its edges are freed took a plain ``threading.Lock``,
    which ``_edge_layout`` holds while it stores a new layout; a garbage collection run by an allocation there (the
    last edges only reachable from a reference cycle, e.g. a traceback's frames) freed them inside the lock, and
    the callback waited for ever on the lock its own thread held (seen with ``gc.set_threshold``). The lock is
    reentrant now. Simulated: the edges are freed while this thread holds the lock."""
    import gc
    import threading

    monkeypatch.setattr(csr, "_LAST_LAYOUT_LOCK", type(csr._LAST_LAYOUT_LOCK)())  # a stuck thread keeps its own
    done = []

    def run():
        e = _edges()
        _edge_layout(e, 3)
        with csr._LAST_LAYOUT_LOCK:
            del e
            gc.collect()
        done.append(csr._LAST_LAYOUT[0])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and done == [None]


# ----------------------------------------------------------------------------------- analysis.capture
def _vit():
    from diffusionformer.models import DiffusionViT, ViTConfig

    torch.manual_seed(0)
    return DiffusionViT(ViTConfig(input_size=(4, 8), patch_size=2, dim=8, depth=2, num_heads=2, num_classes=3,
                                  pool="mean", in_channels=1)).eval()


def test_pin_an_ambiguous_batch_keeps_per_token_labels_attention_and_float64_of_its_first_sequences():
    """Pin: a batch run whole (``B == T`` beside a shared ``(T, T)`` mask) keeps the per-token labels, the attention
    maps and the outputs of its first sequences only, equal to the capture of the batch cut by hand, in float64 for
    a float64 model (states, attention maps and outputs)."""
    from diffusionformer.analysis import capture_dataset

    vit = _vit().double()
    images, causal = torch.randn(8, 1, 4, 8, dtype=torch.float64), torch.ones(8, 8, dtype=torch.bool).tril()
    labels = torch.arange(64).view(8, 8)

    def run(model, inputs):
        return model(inputs[0], attn_mask=inputs[1])

    kw = dict(max_examples=3, forward=run, keep_outputs=True, attentions=True, max_attention_examples=2)
    got = capture_dataset(vit, [((images, causal), labels)], **kw)
    ref = capture_dataset(vit, [((images[:3], causal), labels[:3])], **kw)
    assert torch.equal(got.labels, labels[:3]) and torch.equal(ref.labels, got.labels)
    assert got.outputs.shape == (3, 3) and got.outputs.dtype == torch.float64
    torch.testing.assert_close(got.outputs, ref.outputs, rtol=0, atol=1e-12)
    for i in ref.attentions:
        assert got.attentions[i].shape == (2, 2, 8, 8) and got.attentions[i].dtype == torch.float64
        torch.testing.assert_close(got.attentions[i], ref.attentions[i], rtol=0, atol=1e-12)
    assert all(s.dtype == torch.float64 for s in got.states.values())


def test_pin_what_makes_a_cut_ambiguous():
    """Pin: only a tuple or list whose first entry has a batch dimension, and only another tensor of at least two
    dimensions that leads with ``B`` and has ``B`` in a later dimension (any of them) makes the cut ambiguous; the
    first entry itself does not count."""
    from diffusionformer.analysis.capture import _cut_is_ambiguous

    x, shared = torch.zeros(4, 4, 2), torch.ones(4, 4)
    assert _cut_is_ambiguous((x, shared)) and _cut_is_ambiguous([x, shared])
    assert _cut_is_ambiguous((x, torch.ones(4, 3, 4)))  # B in the last dimension only
    assert not _cut_is_ambiguous((x, torch.ones(4, 3)))  # a per-sequence (B, T) tensor with T != B
    assert not _cut_is_ambiguous((x, torch.ones(3, 4)))  # a shared tensor that does not lead with B
    assert not _cut_is_ambiguous((x, torch.ones(4), None, 2))  # 1-D: cut as per-sequence
    assert not _cut_is_ambiguous((torch.zeros(4, 4),))  # the first entry alone
    assert not _cut_is_ambiguous((torch.tensor(1.0), shared))  # no batch dimension to read
    assert not _cut_is_ambiguous(x) and not _cut_is_ambiguous(())


@pytest.mark.parametrize("name", ["backbone", "student", "model", "encoder"])
def test_pin_the_no_blocks_refusal_names_each_attribute_with_blocks(name):
    """Pin: each attribute the refusal looks in (a ModuleList or Sequential of blocks), and it looks inside a
    DataParallel wrapper."""
    from torch import nn

    from diffusionformer.analysis.capture import _blocks, _NoBlocks

    inner = nn.Module()
    inner.blocks = nn.Sequential(nn.Identity())
    outer = nn.Module()
    setattr(outer, name, inner)
    for model in (outer, nn.DataParallel(outer)):
        with pytest.raises(_NoBlocks, match=rf"capture model\.{name}, which has them"):
            _blocks(model)


# ----------------------------------------------------------------------------------- experiments.gaps.primary_table
def test_pin_primary_table_keeps_contrasts_whose_baseline_has_no_finished_run():
    """Pin: on a task where the named settings finished but the baseline did not, the named contrasts stay in
    Holm's family (n/a, p = 1), as on the page: four primary cells over two tasks, not two; a task without any
    finished run is left out."""
    from diffusionformer.experiments import gaps, load_experiment_config

    seeds = (0, 1, 2)
    cfg = load_experiment_config({
        "name": "ov", "seeds": list(seeds), "primary": ["lap", "heat"], "primary_quantities": ["final"],
        "tasks": [{"name": t, "dataset": "pydoc-chars", "model": "gpt-char-tiny", "metric": "val_loss"}
                  for t in ("t", "u", "v")],
        "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1},
                      {"name": "heat", "heads": "attention:{half},heat:{half}"}]})

    def values(vs):
        return {s: {"final_val": v, "final_train": 1.0, "final_gap": v - 1.0, "best_val": v, "best_step": 100.0,
                    "best_gap": 0.5} for s, v in zip(seeds, vs)}

    full = {"attention": values([2.0, 2.3, 2.1]), "lap": values([1.9, 2.2, 2.05]), "heat": values([2.1, 2.2, 2.0])}
    rows = {"t": full, "u": {"lap": full["lap"], "heat": full["heat"]}}  # every baseline run of u failed; v: none ran
    text = gaps.primary_table(cfg, "unused", ("final_val",), rows=rows)
    assert "adjusted over the 4 primary cells" in text
    (line,) = [x for x in text.splitlines() if x.startswith("| u, lap, final val loss")]
    assert [c.strip() for c in line.strip("|").split("|")][1:] == ["n/a"] * 7


# ----------------------------------------------------------------------------------- experiments.publish.summary_table
def test_pin_summary_table_gives_a_setting_without_any_run_no_cell(tmp_path):
    """Pin: a setting that has no run at all on a task (not run yet, unlike one whose runs all failed) has no cell
    there and stays out of Holm's family: three comparisons, not four."""
    import json

    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments.publish import summary_table
    from diffusionformer.experiments.results import RunResult

    seeds = (0, 1, 2)
    values = {("a", "attention"): [0.50, 0.52, 0.51], ("a", "lap"): [0.53, 0.56, 0.54],
              ("a", "half"): [0.51, 0.52, 0.53], ("b", "attention"): [0.70, 0.71, 0.69],
              ("b", "lap"): [0.72, 0.71, 0.74]}  # b:half never ran
    cfg = load_experiment_config({
        "name": "fam", "seeds": list(seeds),
        "tasks": [{"name": n, "dataset": "digits", "model": "vit-digits", "select_by": "val_acc"} for n in ("a", "b")],
        "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1},
                      {"name": "half", "laplacian_heads": "half"}]})
    runs = [RunResult(t, o, s, "completed", "test_acc", v, selected_value=v, selected_step=1)
            for (t, o), vs in values.items() for s, v in zip(seeds, vs)]
    src = tmp_path / "res" / cfg.name
    src.mkdir(parents=True)
    (src / "results.json").write_text(json.dumps({"runs": [r.__dict__ for r in runs], "summary": []}))
    text = summary_table([cfg], tmp_path / "res")
    assert "3 comparisons;" in text and "[0 vs 3 seeds]" not in text


def test_pin_sequential_blocks_stop_the_unwrapping():
    """Pin: a model whose ``blocks`` is an ``nn.Sequential`` is not unwrapped further through a ``module``
    attribute of its own."""
    from torch import nn

    from diffusionformer.analysis.capture import _blocks

    model = nn.Module()
    model.blocks = nn.Sequential(nn.Identity())
    model.module = nn.Linear(2, 2)
    assert _blocks(model) is model.blocks


def _graph_batch(pyg, edge_attr=True):
    graphs = []
    for n in (4, 3):
        ei = torch.tensor([[i for i in range(n)] + [(i + 1) % n for i in range(n)],
                           [(i + 1) % n for i in range(n)] + [i for i in range(n)]])
        graphs.append(pyg.data.Data(x=torch.randn(n, 3), edge_index=ei, edge_attr=torch.randn(ei.shape[1], 2),
                                    pe=torch.randn(n, 3), y=torch.tensor([n % 2])))
    return pyg.data.Batch.from_data_list(graphs)


def test_pin_the_default_graph_forward_reads_the_wrapped_models_config_and_passes_only_what_it_asks():
    """Pin: a DataParallel-wrapped graph transformer built with ``edge_dim`` / ``pe`` gets them (its config is the
    inner model's); one built without them is not given the batch's ``edge_attr`` / ``pe``; node-level outputs of a
    graph batch are kept whole (one row per node, not cut to the number of graphs)."""
    pyg = pytest.importorskip("torch_geometric")
    from diffusionformer.analysis import capture_dataset
    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    torch.manual_seed(0)
    batch = _graph_batch(pyg)
    with_features = DiffusionGraphTransformer(GraphTransformerConfig(
        in_channels=3, num_classes=2, dim=8, num_heads=2, depth=1, task="graph", edge_dim=2, pe="random_walk",
        pe_dim=3))
    cap = capture_dataset(torch.nn.DataParallel(with_features), [(batch, batch.y)])
    assert cap.states[1].shape[:2] == (2, 4)
    plain = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, num_heads=2,
                                                             depth=1, task="node"))
    seen = []
    plain.register_forward_pre_hook(lambda m, args, kwargs: seen.append(sorted(kwargs)), with_kwargs=True)
    cap = capture_dataset(plain, [(batch, None)], keep_outputs=True)
    assert "edge_attr" not in seen[0] and "pe" not in seen[0]
    assert cap.outputs.shape[0] == 7  # one row per node of the two graphs


def test_pin_a_graph_model_without_num_graphs_gets_its_edge_features_too():
    """Pin: the default forward of a model whose forward takes no ``num_graphs`` passes ``edge_attr`` / ``pe`` as
    its config asks."""
    pyg = pytest.importorskip("torch_geometric")
    from diffusionformer.analysis import capture_dataset
    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    inner = DiffusionGraphTransformer(GraphTransformerConfig(
        in_channels=3, num_classes=2, dim=8, num_heads=2, depth=1, task="graph", edge_dim=2, pe="random_walk",
        pe_dim=3))

    class NoCount(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.blocks, self.config = inner, inner.blocks, inner.config

        def forward(self, x, edge_index, batch, edge_attr=None, pe=None):
            return self.inner(x, edge_index, batch, edge_attr=edge_attr, pe=pe)

    batch = _graph_batch(pyg)
    cap = capture_dataset(NoCount(), [(batch, batch.y)])
    assert cap.states[1].shape[:2] == (2, 4)


def test_pin_an_ambiguous_batch_with_key_padding_keeps_its_first_sequences_mask():
    """Pin: a batch run whole with a ``key_padding_mask`` keeps the real-token mask of its first sequences only,
    equal to the capture of the batch cut by hand."""
    from diffusionformer.analysis import capture_dataset

    vit = _vit()
    images, pad = torch.randn(8, 1, 4, 8), torch.zeros(8, 8, dtype=torch.bool)
    pad[:, -2:] = True
    pad[0, -3] = True

    def run(model, inputs):
        return model(inputs[0], key_padding_mask=inputs[1])

    got = capture_dataset(vit, [((images, pad), None)], max_examples=2, forward=run)
    ref = capture_dataset(vit, [((images[:2], pad[:2]), None)], max_examples=2, forward=run)
    assert got.mask.shape == (2, 8) and torch.equal(got.mask, ref.mask) and int(got.mask.sum()) == 11
    torch.testing.assert_close(got.states[2], ref.states[2], rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------------- analysis anova of padded captures
def _padded():
    g = torch.Generator().manual_seed(0)
    lengths, labels = torch.tensor([3, 5, 0, 2, 4]), torch.tensor([0, 1, 1, 0, 2])
    mask = torch.arange(5) < lengths.unsqueeze(-1)
    X = torch.randn(5, 5, 3, generator=g, dtype=torch.float64).masked_fill(~mask.unsqueeze(-1), 0.0)
    return X, mask, lengths, labels


def test_pin_anova_of_lengths_accumulates_float32_tokens_in_float64():
    """Pin: float32 tokens far from the origin (a mean of 1e4, spread 1e-3) are split in float64: float32 sums
    moved the fractions in their third digit."""
    from diffusionformer.analysis.metrics import _anova_of_lengths

    X, mask, lengths, labels = _padded()
    tokens = (X[mask] * 1e-3 + 1e4).float()
    got = _anova_of_lengths(tokens, lengths, labels).fractions
    want = _anova_of_lengths(tokens.double(), lengths, labels).fractions
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-9, atol=0)


def test_pin_anova_of_a_padded_capture_is_scale_free():
    """Pin: a padded capture's ANOVA fractions of float64 tokens of 1e200 are those of the tokens at unit scale (the
    tokens are scaled by a power of two first: squares overflowed to inf / inf)."""
    from diffusionformer.analysis import LayerCapture
    from diffusionformer.analysis.report import layer_reports

    X, mask, lengths, labels = _padded()
    report = layer_reports(LayerCapture(states={0: X, 1: X * 1e200}, mask=mask, labels=labels))
    for key in ("anova_within_fraction", "anova_between_class_fraction"):
        assert report[1].metrics[key] == pytest.approx(report[0].metrics[key], rel=1e-9)


def test_pin_analysis_version_three_measures_version_two_caches_again():
    """Pin: ``ANALYSIS_VERSION`` moved to 3 with the padded graphs' ANOVA and float64 captures: a cache of version 2
    (ANOVA None for graphs) is not served."""
    from diffusionformer.experiments import analyze

    assert analyze.ANALYSIS_VERSION >= 3  # 4 since: the CIFAR-10 JPEG test split shuffled
