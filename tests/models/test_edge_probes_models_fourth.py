"""Edge probes of the models (fourth pass): the GPT's tied embedding through ``load_state_dict``, the graph
readout of GCN/GIN on a node-less graph, the preset registry's "did you mean" for DINO's task settings, and
``attention_rollout``'s numpy residual."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from diffusionformer.models import GCN, GIN, DiffusionGPT, GCNConfig, GINConfig, GPTConfig, create_model, model_config
from diffusionformer.models.vit import attention_rollout


def _gpt(**kw) -> DiffusionGPT:
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(**{**dict(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8), **kw}))


def _saved(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_bug_gpt_tied_model_refuses_an_untied_state_dict() -> None:
    """Bug: a ``tie_weights=True`` GPT loaded a ``tie_weights=False`` model's state dict without a word: both
    entries went into the one shared tensor, the head's last, so the token embedding was silently replaced by
    the other model's output head. Now a RuntimeError (what the checkpoint loaders catch) names the tie, and
    no weight is written."""
    tied, untied = _gpt(), _gpt(tie_weights=False)
    with torch.no_grad():
        untied.lm_head.weight.add_(1.0)
    before = {k: v.clone() for k, v in tied.state_dict().items()}
    with pytest.raises(RuntimeError, match=r"lm_head.weight is tied to tok_emb.weight \(tie_weights=True\)"):
        tied.load_state_dict(untied.state_dict())
    assert all(torch.equal(before[k], v) for k, v in tied.state_dict().items())
    # the other way round is fine: an untied model takes the shared tensor for both
    untied.load_state_dict(tied.state_dict())
    assert torch.equal(untied.tok_emb.weight, tied.tok_emb.weight)
    assert torch.equal(untied.lm_head.weight, tied.tok_emb.weight)


def test_bug_gpt_load_with_assign_keeps_the_tie() -> None:
    """Bug: ``load_state_dict(sd, assign=True)`` (loading into a model built on the meta device) made the
    head and the embedding two parameters: ``num_parameters()`` counted the table twice and an optimiser
    would train them apart. The tie is restored after every load."""
    ref = _gpt()
    sd = _saved(ref.state_dict())
    for build in (_gpt, lambda: DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))):
        with torch.device("meta" if build is not _gpt else "cpu"):
            model = build()
        model.load_state_dict(sd, assign=True)
        assert model.lm_head.weight is model.tok_emb.weight
        assert model.num_parameters() == ref.num_parameters()
        assert len(list(model.parameters())) == len(list(ref.parameters()))
        idx = torch.randint(0, 11, (2, 8))
        torch.testing.assert_close(model(idx)[0], ref(idx)[0], rtol=0, atol=0)


def test_gpt_tied_state_dict_round_trip_pinned() -> None:
    """Pins: a tied model's own state dict (through ``torch.save``/``torch.load``, even holding NaN after a
    divergence) loads into a fresh tied model, which stays tied and gives the same logits."""
    ref = _gpt()
    fresh = _gpt()
    with torch.no_grad():
        fresh.tok_emb.weight.mul_(0.0)
    fresh.load_state_dict(_saved(ref.state_dict()))
    assert fresh.lm_head.weight is fresh.tok_emb.weight
    idx = torch.randint(0, 11, (2, 8))
    torch.testing.assert_close(fresh(idx)[0], ref(idx)[0], rtol=0, atol=0)
    with torch.no_grad():
        ref.tok_emb.weight[0, 0] = float("nan")
    fresh.load_state_dict(_saved(ref.state_dict()))
    assert bool(fresh.tok_emb.weight[0, 0].isnan())


@pytest.mark.parametrize("make", [lambda: GCN(GCNConfig(in_channels=3, task="graph")),
                                  lambda: GIN(GINConfig(in_channels=3))], ids=["gcn", "gin"])
def test_bug_gnn_graph_readout_of_no_node_without_batch_is_one_graph(make) -> None:
    """Bug: GCN/GIN with ``task="graph"`` on ``x`` of shape ``(0, F)`` and no ``batch`` returned ``(0, C)``:
    no graph at all, where a call without ``batch`` holds one graph (as ``num_graphs`` is checked, and as the
    graph transformer answers: the logits of one empty graph). Now ``(1, C)``, the ``num_graphs=1`` answer."""
    model = make().eval()
    x, edges = torch.zeros(0, 3), torch.zeros(2, 0, dtype=torch.long)
    out = model(x, edges)
    assert out.shape == (1, 2)
    torch.testing.assert_close(out, model(x, edges, torch.zeros(0, dtype=torch.long), num_graphs=1))
    # one node without batch: still one graph, as before
    assert model(torch.randn(1, 3), edges).shape == (1, 2)


@pytest.mark.parametrize("key, close", [("local_crop", "local_crops"), ("knn_kk", "knn_k"),
                                        ("blur_sigm", "blur_sigma")])
def test_bug_dino_preset_misspelt_task_setting_gets_a_did_you_mean(key: str, close: str) -> None:
    """Bug: ``model_config("dino-digits", local_crop=2)`` (a task setting, misspelt) listed DINOConfig's fields
    with no "did you mean": the close name is a field of the task's SSLConfig. Now it is named, with where it
    belongs; misspelt model fields keep their hint."""
    for call in (model_config, create_model):
        with pytest.raises(ValueError, match=rf"unknown key {key!r} \(did you mean {close!r}\? a setting of the task, "
                                             r"SSLConfig"):
            call("dino-digits", **{key: 2})
    with pytest.raises(ValueError, match=r"did you mean 'momentum'\?"):
        model_config("dino-digits", momentun=0.9)


def test_bug_attention_rollout_reads_a_numpy_residual() -> None:
    """Bug: ``attention_rollout(maps, residual=np.float32(0.5))`` (or ``np.int64(1)``) was refused as "expected
    residual in (0, 1], got np.float32(0.5)"; numpy numbers are read as the numbers they equal. Bools stay
    refused."""
    P = torch.tensor([[[[0.25, 0.75], [0.5, 0.5]]]], dtype=torch.float64)
    for numpy_value, value in ((np.float32(0.5), 0.5), (np.int64(1), 1.0)):
        torch.testing.assert_close(attention_rollout([P, P], residual=numpy_value),
                                   attention_rollout([P, P], residual=value))
    with pytest.raises(ValueError, match="residual"):
        attention_rollout([P], residual=True)
