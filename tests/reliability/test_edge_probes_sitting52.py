"""Sitting 52: bugs found on the issues' "Left" list, each test failing before its fix."""

from __future__ import annotations

import sys

import pytest

from diffusionformer.data import list_datasets, unregister_dataset
from diffusionformer.experiments.cli import main

HELPER = '''
from diffusionformer.data import register_dataset


@register_dataset("helper52-blobs", kind="image")
def load_blobs(*, seed):
    raise NotImplementedError
'''


@pytest.fixture
def clean_helper52():
    yield
    for name in [n for n in sys.modules if n.partition(".")[0] in ("pkg52", "ext52")]:
        sys.modules.pop(name, None)
    if "helper52-blobs" in list_datasets():
        unregister_dataset("helper52-blobs")


def test_bug_a_failed_import_forgets_the_users_helper_modules(tmp_path, monkeypatch, capsys, clean_helper52):
    """Bug: ``--import pkg52.regs`` whose module imported the user's helper ``pkg52.helpers`` (which registers a
    dataset) and then failed had its registrations undone, but ``pkg52`` and ``pkg52.helpers`` stayed imported: a
    notebook calling main() again with the file fixed found the helper imported already, its code never ran again,
    and the dataset it registers was unknown. The user's own modules a failed import brought in are now forgotten
    with their registrations; installed packages imported on the way stay."""
    monkeypatch.chdir(tmp_path)
    pkg = tmp_path / "pkg52"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text(HELPER)
    site = tmp_path / ".venv" / "lib" / "python3" / "site-packages"  # a virtual environment in the folder
    (site / "ext52").mkdir(parents=True)
    (site / "ext52" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    (pkg / "regs.py").write_text("import ext52\nimport pkg52.helpers\nraise RuntimeError('my bug')\n")
    assert main(["list", "--import", "pkg52.regs"]) == 2
    assert "--import 'pkg52.regs' failed: RuntimeError: my bug" in capsys.readouterr().err
    assert "helper52-blobs" not in list_datasets()
    assert "pkg52.helpers" not in sys.modules and "pkg52" not in sys.modules
    assert "ext52" in sys.modules and "diffusionformer.data" in sys.modules  # installed, ours: kept
    (pkg / "regs.py").write_text("import pkg52.helpers\n")  # fixed
    assert main(["list", "--import", "pkg52.regs"]) == 0
    assert "helper52-blobs" in capsys.readouterr().out
    assert "helper52-blobs" in list_datasets()


def test_bug_pyg_edge_weight_passed_third_is_named():
    """Bug: ``model(x, edge_index, edge_weight)``, the call of PyG's ``GCNConv``, read the edge weights as ``batch``
    and failed with "batch must have shape (N,) = (4,), got (3,)" (or, with as many edges as nodes, "must hold
    integer graph ids ... got dtype torch.float32"), naming no edge weights; the error now says that the third
    argument is batch and where weighted edges go. An integer batch of the wrong shape keeps its message."""
    import torch

    from diffusionformer.models import GCN, GCNConfig, GIN, GINConfig

    x = torch.randn(4, 3)
    ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
    for model in (GCN(GCNConfig(in_channels=3, hidden=4)), GIN(GINConfig(in_channels=3, hidden=4))):
        with pytest.raises(ValueError, match=r"got \(3,\) \(the third positional argument is batch, the graph id of "
                                             r"each node: edge weights are not taken there"):
            model(x, ei, torch.rand(3))
        with pytest.raises(TypeError, match=r"got dtype torch.float32 \(the third positional argument is batch"):
            model(x, torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]), torch.rand(4))
        with pytest.raises(ValueError, match=r"got \(3,\)$"):
            model(x, ei, torch.zeros(3, dtype=torch.long))


def test_bug_heat_truncation_error_of_huge_steps_holds_no_terms_per_step():
    """Bug: ``heat_truncation_error(t, steps)`` summed the Poisson terms up to ``2 * steps + 400`` whatever
    ``steps``: past the operators' cap (256) that held 2 x steps float64s (``steps=10**12``: 16 TB, an allocation
    error). Past the cap the tail is now the regularised incomplete gamma, raised by 1e-8 relative so that it is
    still a bound: checked against mpmath's (50 digits), never below it."""
    import torch

    from diffusionformer.operators import heat_truncation_error

    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    for t, steps in [(290.0, 300), (250.0, 257), (1e4, 10**4), (-20.0, 300)]:
        got = float(heat_truncation_error(torch.tensor(t, dtype=torch.float64), steps))
        exact = mpmath.gammainc(steps + 1, 0, abs(t), regularized=True) * (mpmath.e ** (2 * abs(t)) if t < 0 else 1)
        assert float(exact) <= got <= float(exact) * (1 + 2e-8), (t, steps, got, float(exact))
    huge = heat_truncation_error(torch.tensor([1.0, -3.0, 1e12], dtype=torch.float64), 10**12)
    assert huge.dtype == torch.float64 and huge[:2].tolist() == [0.0, 0.0] and 0.49 < float(huge[2]) < 0.51


@pytest.mark.parametrize("rope", [False, True])
def test_crop_block_size_gives_a_model_its_own_config_loads(rope):
    """New (sitting 52), for a bug: the way to crop a loaded GPT's context was to lower ``model.config.block_size``,
    which kept every row of the position embedding: its state dict then failed to load into
    ``DiffusionGPT(model.config)`` (torch's size mismatch). ``crop_block_size`` (nanoGPT's name) keeps the first rows;
    logits on contexts that fit are unchanged, and a larger size than the model has is refused."""
    import torch

    from diffusionformer.models import DiffusionGPT, GPTConfig

    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=16, rope=rope,
                                   laplacian_heads=1)).eval()
    idx = torch.randint(0, 11, (2, 8))
    before = model(idx)[0]
    first_rows = None if rope else model.pos_emb.weight[:8].clone()
    model.crop_block_size(8)
    assert model.config.block_size == 8
    torch.testing.assert_close(model(idx)[0], before, rtol=0, atol=0)
    fresh = DiffusionGPT(model.config)
    fresh.load_state_dict(model.state_dict())  # failed with a size mismatch of pos_emb.weight before
    if not rope:
        assert torch.equal(model.pos_emb.weight, first_rows) and model.pos_emb.weight.requires_grad
        assert model.pos_emb.num_embeddings == 8
    with pytest.raises(ValueError, match=r"sequence length T=9 exceeds block_size=8"):
        model(torch.randint(0, 11, (1, 9)))
    assert model.generate(idx, 3).shape == (2, 11)  # the window slides over the cropped context
    for bad in (9, 0, 4.0, True):
        with pytest.raises(ValueError, match=r"crop_block_size: expected an int in \[1, 8\]"):
            model.crop_block_size(bad)


def test_bug_top_k_zero_is_told_that_none_turns_it_off():
    """Bug: ``generate(top_k=0)``, Hugging Face's way to turn top-k off, was refused with "top_k must be a positive
    int or None, got 0" alone; the error now says that None samples from every token."""
    import torch

    from diffusionformer.models import DiffusionGPT, GPTConfig

    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))
    with pytest.raises(ValueError, match=r"got 0 \(None samples from every token: top_k=0 is how Hugging Face"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 1, top_k=0)
    with pytest.raises(ValueError, match=r"got -1$"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 1, top_k=-1)


def test_bug_from_nanogpt_refuses_another_norm():
    """Bug: ``from_nanogpt(..., norm="rmsnorm")`` of a ``bias=False`` checkpoint loaded nanoGPT's LayerNorm gains into
    RMSNorm without a word (the parameters have the same names and shapes), another function of them; it is now
    refused. ``norm="layernorm"`` (the checkpoint's own) is taken."""
    import torch

    from diffusionformer.models import DiffusionGPT, GPTConfig
    from diffusionformer.models.gpt import _nanogpt_names

    source = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, bias=False))
    ours = source.state_dict()
    state = {theirs: ours[mine] for theirs, mine in _nanogpt_names(1).items() if mine in ours}
    args = {"vocab_size": 11, "block_size": 8, "n_layer": 1, "n_head": 2, "n_embd": 8, "bias": False}
    with pytest.raises(ValueError, match=r"norm='rmsnorm': nanoGPT's blocks normalise with LayerNorm"):
        DiffusionGPT.from_nanogpt(state, model_args=args, norm="rmsnorm")
    loaded = DiffusionGPT.from_nanogpt(state, model_args=args, norm="layernorm").eval()
    idx = torch.randint(0, 11, (1, 5))
    torch.testing.assert_close(loaded(idx)[0], source.eval()(idx)[0], rtol=0, atol=0)


def test_capture_takes_sequential_blocks_and_points_a_dino_at_its_backbone():
    """Bug: ``capture_dataset`` refused a model whose ``blocks`` is an ``nn.Sequential`` (timm's ViT keeps its blocks
    so), though its forward calls each block as the ModuleList models do; and a DINO model was refused without a
    word of its ``backbone``, which has the blocks. Sequential blocks are now recorded (checked against running the
    blocks by hand) and the refusal names the attribute that has blocks."""
    import torch
    from torch import nn

    from diffusionformer.analysis import capture_dataset
    from diffusionformer.models import create_model

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return x + torch.tanh(self.lin(x))

    class Timmish(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(Block(), Block())
            self.head = nn.Linear(4, 3)

        def forward(self, x):
            return self.head(self.blocks(x).mean(1))

    torch.manual_seed(0)
    model, x = Timmish(), torch.randn(5, 6, 4)
    cap = capture_dataset(model, [(x, torch.zeros(5, dtype=torch.long))])
    expected = [x, model.blocks[0](x), model.blocks[1](model.blocks[0](x))]
    for layer in range(3):
        torch.testing.assert_close(cap.states[layer], expected[layer].detach(), rtol=0, atol=0)
    with pytest.raises(TypeError, match=r"got DINO with no attribute `blocks`: capture model\.backbone, which has"):
        capture_dataset(create_model("dino-digits"), [(torch.randn(2, 1, 8, 8), None)])


def _anova_loops(seqs, labels):
    """Reference: the three parts of the token sum of squares from explicit loops over sequences of any length
    (each mean weighted by its tokens), float64, divided by the token count."""
    import numpy as np

    tokens = np.concatenate(seqs)
    mu = tokens.mean(0)
    classes = sorted(set(labels))
    class_mean = {c: np.concatenate([s for s, y in zip(seqs, labels) if y == c]).mean(0) for c in classes}
    within = sum(((s - s.mean(0)) ** 2).sum() for s in seqs)
    between_seq = sum(len(s) * ((s.mean(0) - class_mean[y]) ** 2).sum() for s, y in zip(seqs, labels))
    between_class = sum(sum(len(s) for s, y in zip(seqs, labels) if y == c) * ((class_mean[c] - mu) ** 2).sum()
                        for c in classes)
    total = ((tokens - mu) ** 2).sum()
    return [v / len(tokens) for v in (total, within, between_seq, between_class)]


def test_bug_anova_fractions_of_padded_graphs_are_measured_exactly():
    """Bug (a gap): the ANOVA fractions of a padded capture (graphs of unequal sizes) were ``None`` in
    ``layer_reports`` and every published graph analysis, though the split is exact with each mean weighted by
    its tokens. They are now computed (checked against explicit loops; equal lengths give
    ``anova_decomposition``'s split; an empty graph is left out)."""
    import torch

    from diffusionformer.analysis import anova_decomposition
    from diffusionformer.analysis.capture import LayerCapture
    from diffusionformer.analysis.metrics import _anova_of_lengths
    from diffusionformer.analysis.report import layer_reports

    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([3, 5, 0, 2, 4])
    labels = torch.tensor([0, 1, 1, 0, 2])
    X = torch.randn(5, 5, 3, generator=g, dtype=torch.float64)
    mask = torch.arange(5) < lengths.unsqueeze(-1)
    X = X.masked_fill(~mask.unsqueeze(-1), 0.0)
    seqs = [X[b, : lengths[b]].numpy() for b in range(5) if lengths[b] > 0]
    kept = [int(labels[b]) for b in range(5) if lengths[b] > 0]
    split = _anova_of_lengths(X[mask], lengths, labels)
    expected = _anova_loops(seqs, kept)
    got = [split.total, split.within_sequence, split.between_sequence, split.between_class]
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64),
                               rtol=1e-12, atol=0)
    assert abs(sum(got[1:]) - got[0]) < 1e-12 and split.num_classes == 3
    same = torch.randn(4, 3, 2, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1])
    a, b = _anova_of_lengths(same.reshape(-1, 2), torch.full((4,), 3), y), anova_decomposition(same, y)
    torch.testing.assert_close(torch.tensor(a.fractions, dtype=torch.float64),
                               torch.tensor(b.fractions, dtype=torch.float64), rtol=1e-12, atol=0)

    cap = LayerCapture(states={0: X.float(), 1: (2 * X).float()}, mask=mask, labels=labels)
    report = layer_reports(cap)[1]
    fractions = _anova_of_lengths(2 * X[mask], lengths, labels).fractions
    assert report.metrics["anova_within_fraction"] == pytest.approx(fractions[0], rel=1e-6)
    assert report.metrics["anova_between_class_fraction"] == pytest.approx(fractions[2], rel=1e-6)


def test_bug_capture_of_a_graph_transformer_with_edge_features_and_pe_passes_them():
    """Bug: ``capture_dataset`` of a graph transformer built with ``edge_dim`` and ``pe`` on PyG batches called
    ``model(b.x, b.edge_index, b.batch)`` and failed asking for ``edge_attr`` (and ``pe``), which the batches
    held; the default forward now passes them where the model's config asks for them. The captured final layer
    equals the model's own forward with them (checked by its intermediates)."""
    import torch

    pyg = pytest.importorskip("torch_geometric")
    from diffusionformer.analysis import capture_dataset
    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, num_heads=2, depth=1,
                                                             task="graph", edge_dim=2, pe="random_walk", pe_dim=3))
    graphs = []
    for n in (4, 3):
        ei = torch.tensor([[i for i in range(n)] + [(i + 1) % n for i in range(n)],
                           [(i + 1) % n for i in range(n)] + [i for i in range(n)]])
        graphs.append(pyg.data.Data(x=torch.randn(n, 3), edge_index=ei, edge_attr=torch.randn(ei.shape[1], 2),
                                    pe=torch.randn(n, 3), y=torch.tensor([n % 2])))
    batch = pyg.data.Batch.from_data_list(graphs)
    cap = capture_dataset(model, [(batch, batch.y)])
    model.eval()
    with torch.no_grad():
        _, inter = model(batch.x, batch.edge_index, batch.batch, edge_attr=batch.edge_attr, pe=batch.pe,
                         return_intermediates=True)
    last = inter.hidden_states[-1]
    torch.testing.assert_close(cap.states[1][0, :4], last[:4].float(), rtol=0, atol=0)
    torch.testing.assert_close(cap.states[1][1, :3], last[4:].float(), rtol=0, atol=0)


def test_bug_param_groups_of_a_data_parallel_wrapper_exempt_the_inner_models_names():
    """Bug: ``param_groups(DataParallel(vit))`` (DistributedDataParallel likewise) found no ``no_weight_decay``
    hook (the wrappers do not forward attribute look-ups) and decayed the position embedding and class token
    without a word; the wrapped model's hook is now read, its names prefixed ``module.``, giving the groups of the
    bare model."""
    import torch

    from diffusionformer.models import create_model
    from diffusionformer.train import param_groups

    vit = create_model("vit-digits")
    wrapped = torch.nn.DataParallel(vit)  # on the CPU: a plain wrapper with the same attribute look-up as DDP
    bare = {g["weight_decay"]: sorted(g["names"]) for g in param_groups(vit, 0.1)}
    got = {g["weight_decay"]: sorted(n.removeprefix("module.") for n in g["names"]) for g in param_groups(wrapped, 0.1)}
    assert got == bare and "pos_embed" in bare[0.0] and "cls_token" in bare[0.0]


def test_bug_a_shared_mask_of_a_batch_with_as_many_sequences_as_tokens_is_not_cut():
    """Bug: ``capture_dataset`` cut the last batch to fit ``max_examples`` by cutting every tensor of the tuple
    whose leading size is the batch size: with as many sequences as tokens (``B == T``) a shared ``(T, T)`` mask
    was cut too, to ``(1, T)`` for one example, which broadcast its first row over every query: silently wrong
    states (found by the mutation audit of sitting 52). Such a batch now runs whole and its first sequences'
    records are kept: equal to the capture of the batch cut by hand."""
    import torch

    from diffusionformer.analysis import capture_dataset
    from diffusionformer.models import DiffusionViT, ViTConfig

    torch.manual_seed(0)
    vit = DiffusionViT(ViTConfig(input_size=(4, 8), patch_size=2, dim=8, depth=2, num_heads=2, num_classes=3,
                                 pool="mean", in_channels=1)).eval()
    images = torch.randn(8, 1, 4, 8)  # 8 patches: B == T == 8
    causal = torch.ones(8, 8, dtype=torch.bool).tril()

    def run(model, inputs):
        return model(inputs[0], attn_mask=inputs[1])

    got = capture_dataset(vit, [((images, causal), None)], max_examples=1, forward=run, keep_outputs=True)
    ref = capture_dataset(vit, [((images[:1], causal), None)], max_examples=1, forward=run, keep_outputs=True)
    for layer in ref.states:
        torch.testing.assert_close(got.states[layer], ref.states[layer], rtol=0, atol=1e-6)
    assert got.states[2].shape[0] == 1 and got.outputs.shape == ref.outputs.shape == (1, 3)
