"""Edge cases left noted by the earlier probes, now fixed (each "Bug:" test fails with its fix reverted).

* ``DiffusionGraphTransformer`` refused a batch with no node (``from_edge_index``: "num_nodes must be >= 1")
  even with ``num_graphs`` given, where GCN and GIN return the logits of empty graphs; it now does as they do.
* ``dino_loss`` on an empty batch returned NaN (``0 / 0``) as the loss; now a ValueError naming ``B``.
* ``TextData.decode([True])`` decoded ``True`` as token 1; bools are refused as other non-ints are.
* ``check_value`` named a numpy bool's type ``bool``: "expected a bool, got bool np.True_" (a contradiction); it
  now names ``numpy.bool`` as ``is_causal`` already did (one helper, ``config._value_type``).
* ``neural_collapse`` / ``next_token_nc1`` took a negative, NaN or >= 1 ``rtol`` (a NaN or >= 1 cut-off keeps no
  direction: nc1 = inf, silently); now a ValueError.
* ``LayerRecorder(layers=torch.tensor([0, 2]))`` was refused with "got tensor(0)"; an integer tensor of indices
  is now read as the ints it holds.
* ``DiffusionAttention(backend="Matrix")`` (or a misspelt ``layer.backend`` set later) got no "did you mean", and
  ``backend="csr"`` did not say it is a sparse back-end, as the functional API now does.
* A user operator whose ``apply_matrix`` / ``apply_causal_matrix`` returned a wrong shape failed inside
  ``index_add`` (layer and cached decoding) with torch's message, naming no operator; now a ValueError naming it.
* ``generate(idx, 0)`` returned the prompt tensor itself (writing into the result wrote into the prompt).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.nn import global_add_pool, global_max_pool, global_mean_pool

from diffusionformer.analysis.capture import LayerRecorder
from diffusionformer.analysis.metrics import neural_collapse, next_token_nc1
from diffusionformer.config import check_value
from diffusionformer.data import load_dataset
from diffusionformer.data.text import char_text_data
from diffusionformer.models import GCN, DiffusionGPT, GCNConfig, GPTConfig
from diffusionformer.models.dino import dino_loss
from diffusionformer.models.graph_transformer import DiffusionGraphTransformer, GraphTransformerConfig
from diffusionformer.nn import DiffusionAttention

_NO_EDGE = torch.zeros(2, 0, dtype=torch.long)
_NO_ID = torch.zeros(0, dtype=torch.long)


@pytest.mark.parametrize("global_attention", [False, True])
@pytest.mark.parametrize("pool", ["mean", "max", "add"])
def test_bug_graph_transformer_reads_out_a_batch_with_no_node(pool, global_attention):
    """Bug: a graph batch with no node raised "num_nodes must be >= 1" even with ``num_graphs=2``; it now gives
    the logits of two empty graphs: the head of a zero readout (PyG's pools give 0 for an empty graph), the
    same numbers an empty graph gets beside a non-empty one, by hand from the head's weights."""
    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, task="graph", pool=pool,
                                                             global_attention=global_attention)).eval()
    out = model(torch.zeros(0, 3), _NO_EDGE, _NO_ID, num_graphs=2, max_num_nodes=4)
    by_hand = model.head.bias.detach().expand(2, 2)  # head(0) = its bias
    torch.testing.assert_close(out, by_hand)
    beside = model(torch.randn(2, 3), torch.tensor([[0], [1]]), torch.tensor([0, 0]), num_graphs=2)
    torch.testing.assert_close(beside[1], by_hand[0])
    pyg_pool = {"mean": global_mean_pool, "max": global_max_pool, "add": global_add_pool}[pool]
    assert torch.equal(pyg_pool(torch.zeros(0, 4), _NO_ID, 2), torch.zeros(2, 4))  # the premise, from PyG


def test_bug_graph_transformer_no_node_shapes_match_gcn():
    """Bug: as above; the shapes now follow GCN's for every way of naming the graphs: node logits ``(0, C)``;
    graph logits for ``num_graphs`` graphs, one graph without ``batch``, none with an empty ``batch`` alone.
    The intermediates hold the empty stream per block, gradients flow, and an edge in an empty batch is refused."""
    for task in ("node", "graph"):
        ours = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, task=task))
        gcn = GCN(GCNConfig(in_channels=3, num_classes=2, task=task))
        for batch, num_graphs in ((_NO_ID, 2), (_NO_ID, None)):
            got = ours(torch.zeros(0, 3), _NO_EDGE, batch, num_graphs=num_graphs)
            assert got.shape == gcn(torch.zeros(0, 3), _NO_EDGE, batch, num_graphs=num_graphs).shape
        assert ours(torch.zeros(0, 3), _NO_EDGE).shape == ((1, 2) if task == "graph" else (0, 2))
    out, inter = ours(torch.zeros(0, 3), _NO_EDGE, return_intermediates=True)
    assert [h.shape for h in inter.hidden_states] == [(0, ours.config.dim)] * ours.config.depth
    out.sum().backward()
    assert ours.head.bias.grad is not None
    with pytest.raises(ValueError, match=r"no node holds no edge, expected shape \(2, 0\), got \(2, 1\)"):
        ours(torch.zeros(0, 3), torch.zeros(2, 1, dtype=torch.long))


def test_bug_dino_loss_refuses_an_empty_batch():
    """Bug: ``dino_loss`` with ``B = 0`` returned NaN (the batch mean of nothing); now a ValueError naming B."""
    with pytest.raises(ValueError, match="at least one sample and one output dimension, got B=0, K=4"):
        dino_loss(torch.zeros(3, 0, 4), torch.zeros(2, 0, 4), torch.zeros(4), 0.1, 0.04)
    assert torch.isfinite(dino_loss(torch.zeros(3, 1, 4), torch.zeros(2, 1, 4), torch.zeros(4), 0.1, 0.04))


def test_bug_decode_refuses_bools():
    """Bug: ``decode([True])`` read True as token 1 ('b'); bools (a list or a bool tensor) are now refused."""
    data = char_text_data("toy", "abcabcabca")
    assert data.decode([1, np.int64(2)]) == "bc"
    for bad in ([True], torch.tensor([True, False])):
        with pytest.raises(ValueError, match=r"decode expects token ids in \[0, 3\), got \[True"):
            data.decode(bad)


def test_bug_numpy_bool_option_names_its_full_type():
    """Bug: a numpy bool for a bool option read "expected a bool, got bool np.True_"; the type is now named
    ``numpy.bool``, and builtins keep their short names."""
    with pytest.raises(TypeError, match=r"^x: expected a bool, got numpy\.bool_? np\.True_$"):
        check_value(np.True_, bool, "x")
    with pytest.raises(TypeError, match=r"^x: expected an int, got str 'a'$"):
        check_value("a", int, "x")
    want = r"option 'normalize' must be a bool \(default True\), got numpy\.bool_? np\.True_$"
    with pytest.raises(TypeError, match=want):
        load_dataset("mnist", normalize=np.True_)


@pytest.mark.parametrize("rtol", [-1e-3, float("nan"), 1.0, True])
def test_bug_neural_collapse_refuses_a_meaningless_rtol(rtol):
    """Bug: a NaN or >= 1 ``rtol`` kept no direction of the pseudo-inverse (nc1 = inf, silently) and a negative one
    kept the zero singular values; both functions now refuse it. ``rtol=0`` (keep every non-zero direction) runs
    and equals the default here (the class means span C - 1 directions well above the cut-off)."""
    H, y = torch.randn(20, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0)), torch.arange(20) % 3
    with pytest.raises(ValueError, match=r"rtol must be a number in \[0, 1\)"):
        neural_collapse(H, y, rtol=rtol)
    with pytest.raises(ValueError, match=r"rtol must be a number in \[0, 1\)"):
        next_token_nc1(H, y, rtol=rtol)
    assert neural_collapse(H, y, rtol=0.0).nc1 == pytest.approx(neural_collapse(H, y).nc1, rel=1e-12)


def test_bug_layer_recorder_reads_a_tensor_of_layer_indices():
    """Bug: ``layers=torch.tensor([0, 2])`` was refused with "got tensor(0)"; it now records layers 0 and 2, as the
    list does (a float tensor stays refused)."""
    gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16))
    for layers in (torch.tensor([0, 2]), torch.tensor(2)):
        with LayerRecorder(gpt, layers=layers) as rec:
            gpt(torch.randint(0, 11, (1, 8)))
        assert sorted(rec.states) == layers.reshape(-1).tolist()
    with pytest.raises(ValueError, match="layers must hold residual-stream indices"):
        LayerRecorder(gpt, layers=torch.tensor([0.0]))


def test_bug_layer_backend_names_get_did_you_mean():
    """Bug: a misspelt back-end of the layer listed the valid names only; it now names the close one, at
    construction and when the attribute is set later, and says when the name is a sparse back-end's."""
    with pytest.raises(ValueError, match=r"got 'Matrix' \(did you mean 'matrix'\?\)$"):
        DiffusionAttention(8, 2, backend="Matrix")
    with pytest.raises(ValueError, match=r"got 'csr' \('csr' is a back-end of sparse graphs\)$"):
        DiffusionAttention(8, 2, backend="csr")
    layer = DiffusionAttention(8, 2)
    layer.backend = "sdp"
    with pytest.raises(ValueError, match=r"got 'sdp' \(did you mean 'sdpa'\?\)$"):
        layer(torch.zeros(1, 3, 8))


def _bad_matrix_operator():
    from diffusionformer.operators import DiffusionOperator

    class HalfWidth(DiffusionOperator):  # a user operator that drops half of each head's channels
        name = "half-width-probe"
        is_polynomial = False

        def apply_matrix(self, P, v):
            return (P @ v)[..., : v.shape[-1] // 2]

        def apply_causal_matrix(self, P, v):
            return self.apply_matrix(P, v)

    return HalfWidth()


def test_bug_a_wrong_shaped_apply_matrix_is_named():
    """Bug: a user operator's ``apply_matrix`` returning ``(..., C // 2)`` failed inside ``index_add`` with torch's
    message alone; the layer and cached decoding now name the operator, the method and both shapes."""
    from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached

    layer = DiffusionAttention(8, 2, heads=["attention", _bad_matrix_operator()])
    causal_layer = DiffusionAttention(8, 2, heads=["attention", _bad_matrix_operator()], causal=True)
    want = r"HalfWidth\.apply{}_matrix\(P, v\) must return .* shape of v \(1, 1, 3, 4\), got \(1, 1, 3, 2\)"
    with pytest.raises(ValueError, match=want.format("")):
        layer(torch.zeros(1, 3, 8))
    with pytest.raises(ValueError, match=want.format("_causal")):
        layer(torch.zeros(1, 3, 8), is_causal=True)
    with pytest.raises(ValueError, match=want.format("_causal")):
        attend_cached(causal_layer, torch.zeros(1, 3, 8), LayerKVCache())


def test_bug_generate_zero_new_tokens_returns_a_new_tensor():
    """Bug: ``generate(idx, 0)`` returned ``idx`` itself; it now returns an equal, separate tensor."""
    gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
    prompt = torch.tensor([[1, 2, 3]])
    out = gpt.generate(prompt, 0)
    assert torch.equal(out, prompt) and out.data_ptr() != prompt.data_ptr()
    out[0, 0] = 7
    assert prompt.tolist() == [[1, 2, 3]]


def test_capture_dataset_misspelt_device_is_named_with_a_suggestion():
    """Bug: ``capture_dataset(model, batches, device="cdua")`` raised torch's RuntimeError listing every device type
    ("Expected one of cpu, cuda, ipu, xpu, ..."), with no word of which argument was wrong. It now names ``device``
    and suggests ``'cuda'``; a correct device still captures."""
    from diffusionformer.analysis.capture import capture_dataset

    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"device: .*got 'cdua' \(did you mean 'cuda'\?\)"):
        capture_dataset(model, [torch.zeros(1, 2)], device="cdua")
    with pytest.raises(ValueError, match="device: .*got 3.5"):
        capture_dataset(model, [torch.zeros(1, 2)], device=3.5)


def test_load_run_misspelt_map_location_is_named_before_anything_is_read(tmp_path):
    """Bug: ``load_run(path, map_location="cdua")`` read the run config, built the model and loaded the checkpoint,
    then failed in ``model.to`` with torch's RuntimeError listing every device type. It is now checked first (a
    missing run directory is not even looked at) and named with a "did you mean"."""
    from diffusionformer import load_run

    with pytest.raises(ValueError, match=r"^map_location: .*got 'cdua' \(did you mean 'cuda'\?\)$"):
        load_run(tmp_path / "no-such-run", map_location="cdua")
