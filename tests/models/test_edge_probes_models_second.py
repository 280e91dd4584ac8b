"""Edge probes of the models (second pass): GPT targets and sampling arguments, graph models' devices,
preset names; a few legal edge cases pinned against independent references (float64 GCN by hand,
``F.cross_entropy`` by hand)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffusionformer.models import GCN, GIN, DiffusionGPT, DiffusionGraphTransformer, GCNConfig, GINConfig, GPTConfig
from diffusionformer.models import GraphTransformerConfig
from diffusionformer.models.registry import create_model


def _gpt() -> DiffusionGPT:
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, laplacian_heads=1)).eval()


_X = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
_EI = torch.tensor([[0, 1, 1, 2, 3], [1, 0, 2, 1, 3]])  # node 3: a self-loop, node 4: isolated


# --- DiffusionGPT ---------------------------------------------------------------------------------------------


def test_gpt_targets_as_numpy_array_named_as_a_type() -> None:
    """Bug: targets given as a numpy array raised "targets must have the shape of idx (2, 8), got (2, 8)"."""
    idx = torch.randint(0, 11, (2, 8))
    with pytest.raises(TypeError, match=r"targets must be a torch.Tensor of token ids, got ndarray"):
        _gpt()(idx, idx.numpy())


def test_gpt_targets_on_another_device_named() -> None:
    """Bug: meta targets with CPU ids failed inside torch.nonzero with a NotImplementedError naming no argument."""
    idx = torch.randint(0, 11, (2, 8))
    with pytest.raises(ValueError, match=r"targets must be on idx's device cpu, got meta"):
        _gpt()(idx, idx.to("meta"))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_gpt_generate_refuses_a_generator_that_is_not_one(temperature: float) -> None:
    """Bug: generate(generator=3) was accepted silently with temperature=0 (and max_new_tokens=0), and otherwise
    failed inside torch.multinomial ("multinomial(): argument 'generator' must be torch.Generator")."""
    with pytest.raises(TypeError, match=r"generator must be a torch.Generator or None, got int 3"):
        _gpt().generate(torch.zeros(1, 1, dtype=torch.long), 2, temperature=temperature, generator=3)


def test_gpt_generate_names_a_numpy_bool_use_cache() -> None:
    """Bug: use_cache=numpy.bool_(True) (a sweep grid's) was refused as "use_cache must be a bool, got bool", which
    reads as a contradiction. Numpy bools stay refused, as for every flag of the package (a ``numpy.bool`` is not
    read as a flag), and the message names the numpy type."""
    model, idx = _gpt(), torch.tensor([[1], [2]])
    with pytest.raises(TypeError, match=r"use_cache must be a bool, got numpy\.bool"):
        model.generate(idx, 4, use_cache=np.bool_(True))


def test_gpt_loss_with_ignored_targets_pins_cross_entropy_by_hand() -> None:
    """Pins: the loss with -100 targets is the mean float64 negative log-likelihood of the other positions;
    all positions ignored gives NaN, as F.cross_entropy (and nanoGPT) does."""
    model = _gpt()
    idx = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(1))
    tg = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(2))
    tg[0, :3] = -100
    logits, loss = model(idx, tg)
    logp = logits.double().log_softmax(-1).reshape(-1, 11)
    keep = tg.reshape(-1) != -100
    ref = -logp[keep].gather(1, tg.reshape(-1)[keep, None]).mean()
    assert loss is not None and abs(loss.item() - ref.item()) < 1e-5
    assert torch.isnan(model(idx, torch.full_like(tg, -100))[1])


def test_gpt_generate_generator_determinism_pinned() -> None:
    """Pins: the same generator seed gives the same tokens; a second call on the advanced generator differs."""
    model, idx = _gpt(), torch.tensor([[3], [4]])
    g = torch.Generator().manual_seed(1)
    a = model.generate(idx, 20, generator=g)
    b = model.generate(idx, 20, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and not torch.equal(a, model.generate(idx, 20, generator=g))


# --- graph models ---------------------------------------------------------------------------------------------


def _graph_models() -> list[torch.nn.Module]:
    torch.manual_seed(0)
    return [GCN(GCNConfig(in_channels=3, num_classes=2, task="graph")).eval(),
            GIN(GINConfig(in_channels=3, num_classes=2)).eval(),
            DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, task="graph")).eval()]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["gcn", "gin", "graph_transformer"])
def test_graph_models_name_an_edge_index_on_another_device(which: int) -> None:
    """Bug: a meta edge_index with CPU features failed inside torch.nonzero with a NotImplementedError."""
    with pytest.raises(ValueError, match=r"edge_index must be on x's device cpu, got meta"):
        _graph_models()[which](_X, _EI.to("meta"))


@pytest.mark.parametrize("which", [0, 1, 2], ids=["gcn", "gin", "graph_transformer"])
def test_graph_models_name_a_batch_on_another_device(which: int) -> None:
    """Bug: a meta batch failed with "Tensor.item() cannot be called on meta tensors" (GCN, GIN) or advice to
    build the graph with checked=False (graph transformer)."""
    with pytest.raises(ValueError, match=r"batch must be on x's device cpu, got meta"):
        _graph_models()[which](_X, _EI, torch.tensor([0, 0, 0, 0, 1]).to("meta"))


def test_gcn_layer_pins_float64_hand_computation() -> None:
    """Pins: one GCN layer equals D^-1/2 (A + I) D^-1/2 X W^T + b computed by hand in float64, with a self-loop
    kept at weight 1, an isolated node, and int32 edge_index."""
    torch.manual_seed(0)
    model = GCN(GCNConfig(in_channels=3, num_classes=2, num_layers=1, dropout=0.0)).double().eval()
    x = _X.double()
    A = torch.zeros(5, 5, dtype=torch.float64)
    for s, t in _EI.t().tolist():
        A[t, s] += 1
    A += torch.diag((torch.diag(A) == 0).double())
    d = A.sum(1).rsqrt()
    ref = d[:, None] * A * d[None] @ x @ model.convs[0].lin.weight.t() + model.convs[0].bias
    torch.testing.assert_close(model(x, _EI), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model(x, _EI.int()), ref, rtol=1e-12, atol=1e-12)


# --- registry -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["VIT-MNIST", "VIT_MNIST"])
def test_create_model_did_you_mean_ignores_case_and_separators(name: str) -> None:
    """Bug: create_model("VIT-MNIST") listed every preset but gave no "did you mean 'vit-mnist'?"."""
    with pytest.raises(ValueError, match=r"did you mean 'vit-mnist'\?"):
        create_model(name)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_gpt_generate_on_nan_logits_is_named(temperature) -> None:
    """Bug: a model whose logits were NaN (diverged weights) generated token 0 at every step with greedy decoding,
    silently, and failed in ``torch.multinomial`` ("probability tensor contains either inf, nan") when sampling.
    Both now name the NaN logits and the step."""
    model, idx = _gpt(), torch.tensor([[1], [2]])
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    with pytest.raises(ValueError, match=r"logits are NaN at new token 0 of 3"):
        model.generate(idx, 3, temperature=temperature, generator=torch.Generator().manual_seed(0))
