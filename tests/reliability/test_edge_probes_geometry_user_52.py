"""Edge probes of diffusionformer.analysis from a token-geometry researcher's walk (task 52a): capture of GPT/ViT/graph
models, the metrics against float64 references written from their definitions, and the plots."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.analysis import (
    LayerCapture,
    LayerRecorder,
    capture_dataset,
    dirichlet_energy,
    effective_rank,
    layer_reports,
    mean_pairwise_cosine,
    plot_metric_by_depth,
    token_singular_values,
)
from diffusionformer.models import DiffusionGPT, DiffusionViT, GPTConfig, ViTConfig


def _gpt(**kw) -> DiffusionGPT:
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, **kw))


# ---------------------------------------------------------------------------------------------------- bugs


@pytest.mark.parametrize("attentions", [False, True])
def test_bug_capture_on_meta_device_names_the_cause(attentions):
    """Bug: capture_dataset of a model on the meta device (device="meta", or meta inputs) failed with torch's bare
    NotImplementedError "Cannot copy out of meta tensor; no data!" from inside the collector, naming neither the
    capture nor the meta device; now a ValueError that says the meta tensors hold no token values."""
    model = _gpt().to("meta")
    with pytest.raises(ValueError, match="meta device.*no values"):
        capture_dataset(model, [torch.randint(0, 11, (2, 8))], device="meta", attentions=attentions)
    with pytest.raises(ValueError, match="meta device"):
        capture_dataset(model, [torch.randint(0, 11, (2, 8)).to("meta")])
    # the hooks are gone and the recorder itself still records shapes on meta (documented: states as the block saw them)
    assert all(len(b._forward_hooks) == len(b._forward_pre_hooks) == 0 for b in model.blocks)
    with LayerRecorder(model) as rec:
        model(torch.randint(0, 11, (2, 8)).to("meta"))
    assert rec.states[2].is_meta and rec.states[2].shape == (2, 8, 16)


def test_bug_plot_metric_by_depth_draws_a_dict_at_its_layers_and_refuses_a_set():
    """Bug: plot_metric_by_depth drew a {layer: value} dict as its keys (the layer indices 0, 4, 8 plotted as the
    metric) and a set in hash order, without a word. A set is now a TypeError naming the setting; a dict draws each
    value at its layer (sitting 52: a capture of layers 0, 4, 8 is drawn there, not at 0, 1, 2), its keys sorted;
    a key that is not an int is refused."""
    pytest.importorskip("matplotlib")
    with pytest.raises(TypeError, match=r"results\['attention'\] must be an ordered sequence"):
        plot_metric_by_depth({"attention": {1.0, 0.5, 0.25}}, "variance")
    ax = plot_metric_by_depth({"attention": {8: 0.25, 0: 1.0, 4: 0.5}, "laplacian": [1.0, 0.9]}, "variance")
    assert ax.lines[0].get_xdata().tolist() == [0, 4, 8] and ax.lines[0].get_ydata().tolist() == [1.0, 0.5, 0.25]
    assert ax.lines[1].get_xdata().tolist() == [0, 1]
    with pytest.raises(TypeError, match=r"results\['attention'\]: a dict must map int layers to values, got the key"):
        plot_metric_by_depth({"attention": {"0": 1.0}}, "variance")


def test_bug_plot_frequency_response_names_the_head_without_a_polynomial():
    """Bug: the tutorial's plot_frequency_response({name: c for each head}) of a layer with a 'heat-exact' head (whose
    row of DiffusionAttention.coefficients() is NaN) failed with "coeffs holds NaN or inf values", naming an argument
    the caller never passed and not the head; the error now names named_coeffs[name] and says which heads have NaN
    coefficients."""
    pytest.importorskip("matplotlib")
    from diffusionformer.analysis import plot_frequency_response
    from diffusionformer.models import create_model

    attn = create_model("vit-digits", heads="attention:1,heat-exact:1,laplacian:2").blocks[0].attn
    coefficients = attn.coefficients().detach()
    curves = {f"head {h}: {n}": c for h, (n, c) in enumerate(zip(attn.head_operator_names, coefficients))}
    bad = next(name for name in curves if "heat-exact" in name)
    with pytest.raises(ValueError, match=rf"named_coeffs\['{bad}'\]: coeffs holds NaN.*'heat-exact'"):
        plot_frequency_response(curves)
    with pytest.raises(ValueError, match=r"named_coeffs\['h'\]: coeffs must be a tensor of shape"):
        plot_frequency_response({"h": torch.zeros(2, 2, 2)})
    kept = {name: c for name, c in curves.items() if name != bad}
    assert len(plot_frequency_response(kept).lines) == 3 + 1  # three heads and the zero line


def test_bug_capture_cut_keeps_shared_tensors_and_none_of_a_tuple_batch():
    """Bug: when max_examples cut the last batch of tuple inputs, capture_dataset sliced every element: a shared (T, T)
    attn_mask became (k, T) and the model refused "attn_mask must be broadcastable ... got shape (3, 5)", a shape the
    caller never made; a None in the tuple failed with "'NoneType' object is not subscriptable". Only the tensors of
    the batch's leading size are cut now."""
    torch.manual_seed(0)
    vit = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, dim=8, depth=2, num_heads=2))
    x = torch.randn(8, 1, 8, 8)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()  # shared by the batch: T = 5 tokens (class token + 4 patches)
    cap = capture_dataset(vit, [((x, causal), None)], forward=lambda m, b: m(b[0], attn_mask=b[1]), max_examples=3,
                          attentions=True)
    assert cap.states[0].shape == (3, 5, 8) and float(cap.attentions[0].triu(1).abs().max()) == 0.0
    vit.eval()
    with torch.no_grad():
        _, inter = vit.forward_tokens(x[:3], return_intermediates=True, attn_mask=causal)
    torch.testing.assert_close(cap.states[2], inter.hidden_states[-1])
    cap = capture_dataset(vit, [((x, None), None)], forward=lambda m, b: m(b[0], key_padding_mask=b[1]), max_examples=3)
    assert cap.num_examples == 3 and cap.mask is None


@pytest.mark.parametrize("center", ["sequence", "none"])
def test_bug_per_sequence_spectra_scaled_per_sequence(center):
    """Bug: token_singular_values(pool=False) scaled the whole batch by one power of two, so the spectrum of a
    sequence of float32 tokens ~1e-30 beside one of ~1e30 underflowed to all zeros (its effective rank 0, not ~2.5),
    though each spectrum is its own; now each sequence is scaled by its own power of two (exact)."""
    X = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0))
    X[0] *= 1e30
    X[1] *= 1e-30
    ref = token_singular_values(X.double(), center=center, pool=False)
    got = token_singular_values(X, center=center, pool=False)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=0.0)
    assert float(effective_rank(got[1])) > 2


def _capture_compiled(compiled: list, gpt) -> None:
    """Capture ``gpt`` after compiling ``compiled`` in place and running it once, against its uncompiled states."""
    idx = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, _, inter = gpt(idx, return_intermediates=True)
    for module in compiled:
        module.compile(backend="eager")
    with torch.no_grad():
        gpt(idx)  # compiled and run before the hooks exist
    impls = [module._compiled_call_impl for module in compiled]
    cap = capture_dataset(gpt, [idx], attentions=True)
    for layer in (1, 2):
        torch.testing.assert_close(cap.states[layer], inter.hidden_states[layer - 1])
    assert cap.attentions[1].shape == (2, 2, 8, 8)
    with LayerRecorder(gpt, layers=[2]) as rec, torch.no_grad():
        gpt(idx)
    torch.testing.assert_close(rec.states[2], inter.hidden_states[1])
    assert [module._compiled_call_impl for module in compiled] == impls  # compiled again after the capture
    assert all(len(b._forward_hooks) == len(b._forward_pre_hooks) == 0 for b in gpt.blocks)


def test_bug_capture_of_a_model_compiled_in_place():
    """Bug: a model compiled in place (model.compile(), nn.Module.compile) that had already run skipped the capture's
    hooks, and capture_dataset failed with "layers [0, 1, 2] were not recorded: did the forward call run
    model.blocks?" (it did), a LayerRecorder recording nothing at all; its compiled modules now run eagerly while the
    recorder is entered, and keep their compiled call afterwards."""
    gpt = _gpt().eval()
    _capture_compiled([gpt], gpt)


def test_capture_of_blocks_compiled_in_place():
    gpt = _gpt().eval()
    _capture_compiled(list(gpt.blocks), gpt)


@pytest.mark.parametrize("wrap", ["compile", "checkpoint_wrapper"])
def test_bug_capture_of_wrapped_blocks(wrap):
    """Bug: with model.blocks holding wrapped blocks (each block torch.compile'd on its own, or wrapped for activation
    checkpointing by checkpoint_wrapper), whose forward takes (*args, **kwargs), the capture hooks took the tuple of
    arguments for the tokens and failed with "'tuple' object has no attribute 'detach'"; the signature is now read
    through the wrapper, and a wrapper it cannot see through is a TypeError naming it."""
    gpt = _gpt().eval()
    idx = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, _, inter = gpt(idx, return_intermediates=True)
        ref = [b.attn(b.norm1(x), return_intermediates=True)[1].attn_weights
               for b, x in zip(gpt.blocks, [inter.embeddings, *inter.hidden_states])]
    if wrap == "compile":
        gpt.blocks = torch.nn.ModuleList(torch.compile(b, backend="eager") for b in gpt.blocks)
    else:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        gpt.blocks = torch.nn.ModuleList(checkpoint_wrapper(b) for b in gpt.blocks)
    cap = capture_dataset(gpt, [idx], attentions=True)
    torch.testing.assert_close(cap.states[0], inter.embeddings)
    for layer in (1, 2):
        torch.testing.assert_close(cap.states[layer], inter.hidden_states[layer - 1])
        torch.testing.assert_close(cap.attentions[layer - 1], ref[layer - 1])


def test_capture_refuses_a_block_wrapper_it_cannot_see_through():
    class Opaque(torch.nn.Module):
        def __init__(self, block):
            super().__init__()
            self.inner = block
            self.attn, self.norm1 = block.attn, block.norm1

        def forward(self, *args, **kwargs):
            return self.inner(*args, **kwargs)

    gpt = _gpt()
    gpt.blocks = torch.nn.ModuleList(Opaque(b) for b in gpt.blocks)
    with pytest.raises(TypeError, match=r"Opaque.forward takes \(\*args, \*\*kwargs\)"):
        capture_dataset(gpt, [torch.randint(0, 11, (2, 8))])
    assert all(len(b._forward_hooks) == len(b._forward_pre_hooks) == 0 for b in gpt.blocks)


# ---------------------------------------------------------------------------------------------------- checks


def _dirichlet_ref(X: torch.Tensor, P: torch.Tensor) -> float:
    """1/2 sum_ij P_ij ||x_i - x_j||^2 / ||X||_F^2 in float64, by the definition (directed P)."""
    X, P = X.double(), P.double()
    diff2 = (X[:, None, :] - X[None, :, :]).pow(2).sum(-1)
    return float(0.5 * (P * diff2).sum() / X.pow(2).sum())


def test_dirichlet_directed_dense_and_sparse_match_definition_with_isolated_node():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(5, 4, dtype=torch.float64, generator=g)
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 0, 0]])  # node 4 isolated, edges one-way
    w = torch.tensor([0.3, 0.5, 1.0, 2.0], dtype=torch.float64)
    P = torch.zeros(5, 5, dtype=torch.float64)
    P[edge_index[1], edge_index[0]] = w
    ref = _dirichlet_ref(X, P)
    assert math.isclose(float(dirichlet_energy(X, edge_index=edge_index, edge_weight=w)), ref, rel_tol=1e-12)
    assert math.isclose(float(dirichlet_energy(X[None], P)), ref, rel_tol=1e-12)


def test_vit_key_padding_capture_metrics_use_real_tokens_only():
    torch.manual_seed(0)
    vit = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, dim=8, depth=2, num_heads=2, num_classes=3))
    x = torch.randn(4, 1, 8, 8)
    pad = torch.zeros(4, 5, dtype=torch.bool)
    pad[1, 3:] = pad[2, 4:] = True
    cap = capture_dataset(vit, [((x, pad), torch.tensor([0, 1, 2, 1]))], attentions=True,
                          forward=lambda m, b: m(b[0], key_padding_mask=b[1]))
    assert cap.mask.sum(1).tolist() == [5, 3, 4, 5]
    m = layer_reports(cap)[2].metrics
    X, lens = cap.states[2].double(), cap.mask.sum(1).tolist()
    P = cap.attentions[1].double().mean(1)
    within = [float((X[b, :n] - X[b, :n].mean(0)).pow(2).sum() / n) for b, n in enumerate(lens)]
    energy = [_dirichlet_ref(X[b, :n], P[b, :n, :n]) for b, n in enumerate(lens)]
    assert math.isclose(m["within_variance"], sum(within) / 4, rel_tol=1e-9)
    assert math.isclose(m["dirichlet_attention"], sum(energy) / 4, rel_tol=1e-6)
    s = torch.linalg.svdvals(torch.cat([X[b, :n] - X[b, :n].mean(0) for b, n in enumerate(lens)]))
    p = s / s.sum()
    assert math.isclose(m["effective_rank"], float(torch.exp(-(p * p.log()).sum())), rel_tol=1e-9)


def test_cosine_and_effective_rank_edge_cases():
    X = torch.randn(1, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    X[0, 0] = 0  # a zero token: cosine 0 with every other token
    u = [t / t.norm() for t in X[0, 1:]]
    ref = sum(float(a @ b) for i, a in enumerate(u) for j, b in enumerate(u) if i != j) / 20
    assert math.isclose(float(mean_pairwise_cosine(X)), ref, rel_tol=1e-12)
    const = torch.full((2, 4, 3), 3.0)
    assert float(effective_rank(token_singular_values(const))) == 0.0  # all-zero spectrum: 0 (documented)
    assert token_singular_values(torch.randn(2, 1, 3)).abs().max() == 0  # one token: nothing within the sequence


def test_capture_restores_modes_and_hooks_after_an_error_in_the_forward():
    gpt = _gpt().train()

    def failing(model, batch):
        model(batch)
        raise KeyError("inside the capture")

    with pytest.raises(KeyError):
        capture_dataset(gpt, [torch.randint(0, 11, (2, 8))], forward=failing, attentions=True)
    assert gpt.training and all(m.training for m in gpt.modules()) and torch.is_grad_enabled()
    assert all(len(b._forward_hooks) == len(b._forward_pre_hooks) == 0 for b in gpt.blocks)


def test_bf16_model_capture_is_float32_and_reports():
    gpt = _gpt().to(torch.bfloat16)
    cap = capture_dataset(gpt, [torch.randint(0, 11, (2, 8))], attentions=True, keep_outputs=True)
    assert all(x.dtype == torch.float32 for x in cap.states.values()) and cap.attentions[0].dtype == torch.float32
    assert float(cap.attentions[0].triu(1).abs().max()) == 0.0  # causal P
    assert layer_reports(LayerCapture(cap.states))[-1].metrics["effective_rank"] > 1
