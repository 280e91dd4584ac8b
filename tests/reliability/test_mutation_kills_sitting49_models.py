"""Mutation audit (sitting 49) of the model core: models/gpt.py, models/vit.py, models/graph_transformer.py,
models/dino.py, models/common.py and nn/block.py (the lines sitting 47's new-code audit did not cover): tests that
kill mutants the earlier tests left alive (each docstring names the mutant). No GPU is used.

98 mutants (gpt.py 17, vit.py 16, graph_transformer.py 16, dino.py 17, common.py 17, block.py 15; in block.py the lines
sitting 47 audited were left out: make_mlp, the gated MLPs, reset_parameters): 85 killed by earlier tests (the modules'
test files, tests/models, tests/ssl, tests/core, tests/nn and the doctests), 11 survivors killed here (gpt.py 3,
vit.py 1, graph_transformer.py 2, dino.py 3, common.py 1, block.py 1), 2 equivalent:

* gpt.py ``forward`` ``F.cross_entropy(flat, targets, ignore_index=-100)`` -> without ``ignore_index``: -100 is
  ``F.cross_entropy``'s default ``ignore_index``, the same loss and gradient.
* graph_transformer.py ``_global_sized`` ``max(int(counts.max()), 1)`` -> ``int(counts.max())``: the count is 0 only
  for a call without nodes (a ``GraphBlock`` on ``x`` of shape ``(0, D)``; the model's forward returns before its
  blocks then), where the padded ``(G, 0, D)`` and ``(G, 1, D)`` layouts hold no node and the gather back by an
  empty index is ``(0, D)`` either way (run by hand: same shape, backward fine).

(graph_transformer.py's ``batch = batch.long()`` mutant is ``batch = batch``: deleting the line left an empty
``if`` block, a syntax error, not counted.)
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.models import DiffusionGPT, GPTConfig


def _gpt(**kw) -> DiffusionGPT:
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(**{"vocab_size": 11, "block_size": 8, "n_layer": 1, "n_head": 2, "n_embd": 16, **kw}))


def test_kills_gpt_assign_load_keeps_the_embedding_entry():
    """kills: models/gpt.py ``_load_from_state_dict`` ``self._tie_from_head = emb is None and isinstance(head, Tensor)``
    -> ``isinstance(head, Tensor)`` (a tied model loaded with ``assign=True`` from a state dict holding both entries
    took the head's tensor as its embedding: the tensors ``assign`` hands over were not the ones named
    ``tok_emb.weight``). Only the head alone in the state dict makes the embedding follow the head."""
    src = _gpt()
    sd = {k: v.clone() for k, v in src.state_dict().items()}  # two equal tensors, as torch.load of a copy gives
    dst = _gpt()
    dst.load_state_dict(sd, assign=True)
    assert dst.lm_head.weight is dst.tok_emb.weight
    assert dst.tok_emb.weight.data_ptr() == sd["tok_emb.weight"].data_ptr()
    assert dst.tok_emb.weight.data_ptr() != sd["lm_head.weight"].data_ptr()
    alone = {k: v for k, v in sd.items() if k != "tok_emb.weight"}  # the head alone: the embedding follows it
    dst2 = _gpt()
    dst2.load_state_dict(alone, assign=True, strict=False)
    assert dst2.tok_emb.weight is dst2.lm_head.weight
    assert dst2.tok_emb.weight.data_ptr() == alone["lm_head.weight"].data_ptr()


def test_kills_gpt_block_size_one_beyond_the_position_embeddings():
    """kills: models/gpt.py ``_block_size`` ``size > self.pos_emb.num_embeddings`` -> ``size > num_embeddings + 1``
    (``config.block_size`` raised by one after building passed; a context of that length then failed with a bare
    IndexError inside ``nn.Embedding``). Equal to the table's size is fine."""
    model = _gpt()
    model.config.block_size = 9  # built with 8 position embeddings
    with pytest.raises(ValueError, match=r"config\.block_size=9 exceeds the 8 position embeddings"):
        model(torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(ValueError, match=r"config\.block_size=9 exceeds the 8 position embeddings"):
        model.generate(torch.zeros(1, 8, dtype=torch.long), 1)
    model.config.block_size = 8
    assert model(torch.zeros(1, 8, dtype=torch.long))[0].shape == (1, 8, 11)


def test_kills_gpt_generate_refuses_one_row_of_only_minus_inf():
    """kills: models/gpt.py ``generate`` ``logits.isneginf().all(dim=-1).any()`` -> ``logits.isneginf().all()`` (a
    batch where one sequence's logits were -inf for every token and another's finite: greedy decoding gave the
    first sequence token 0, as if chosen)."""
    model = _gpt().eval()
    real_forward = model.forward

    def forward(idx, targets=None, **kw):
        logits, loss = real_forward(idx, targets, **kw)
        return logits.index_fill(0, torch.tensor([1]), float("-inf")), loss  # sequence 1: every token removed

    model.forward = forward
    idx = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with pytest.raises(ValueError, match=r"logits are -inf for every token at new token 0 of 2"):
        model.generate(idx, 2, temperature=0.0)
    with pytest.raises(ValueError, match=r"-inf for every token"):
        model.generate(idx, 2, temperature=1.0, generator=torch.Generator().manual_seed(0))


def _vit(**kw):
    from diffusionformer.models import DiffusionViT, ViTConfig

    torch.manual_seed(0)
    return DiffusionViT(ViTConfig(**{"input_size": (8, 8), "patch_size": 2, "dim": 16, "depth": 2, "num_heads": 2,
                                     **kw}))


def test_kills_vit_mean_pool_of_a_fully_padded_sample_is_zero():
    """kills: models/vit.py ``forward_features`` ``keep.sum(dim=1).clamp(min=1)`` -> ``keep.sum(dim=1)`` (a sample
    whose patches are all padding pooled to 0 / 0 = NaN, and its NaN logits reached the loss; the promise: it pools
    to zeros). The other sample's features are the mean over its real patches."""
    vit = _vit(pool="mean").eval()
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    pad = torch.zeros(2, 16, dtype=torch.bool)
    pad[0] = True  # sample 0: every patch padded
    pad[1, 10:] = True
    feats = vit.forward_features(x, key_padding_mask=pad)
    assert torch.equal(feats[0], torch.zeros(16))
    tokens = vit.forward_tokens(x, key_padding_mask=pad)
    torch.testing.assert_close(feats[1], tokens[1, :10].mean(dim=0))


def _gt(**kw):
    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    torch.manual_seed(0)
    return DiffusionGraphTransformer(GraphTransformerConfig(**{"in_channels": 3, "num_classes": 2, "dim": 8,
                                                              "num_heads": 2, **kw}))


_PATH = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])  # an undirected path 0 - 1 - 2 - 3


def test_kills_gt_graph_task_without_nodes_or_batch_is_one_empty_graph():
    """kills: models/graph_transformer.py ``forward`` ``1 if N == 0 else num_graphs`` -> ``num_graphs`` (a graph-task
    call with no node and no ``batch``, one empty graph as the docstring says, gave ``(0, num_classes)``: no graph at
    all). Its logits are the head of a zero readout: the head's bias."""
    model = _gt(task="graph").eval()
    out = model(torch.zeros(0, 3), torch.zeros(2, 0, dtype=torch.long))
    assert out.shape == (1, 2)
    torch.testing.assert_close(out[0], model.head.bias.detach())


def test_kills_graph_block_refuses_edge_attr_without_edge_dim():
    """kills: models/graph_transformer.py ``GraphBlock.forward`` the ``self.edge_proj is None and edge_attr is not
    None`` check dropped (a block built without ``edge_dim`` ignored the edge features it was given, without a word;
    the model checks its own config, the block alone did not)."""
    from diffusionformer.models import GraphBlock

    torch.manual_seed(0)
    block = GraphBlock(8, 2)
    with pytest.raises(ValueError, match=r"GraphBlock: got edge_attr, but the block was built without edge_dim"):
        block(torch.randn(4, 8), _PATH, edge_attr=torch.randn(6, 3))


def test_kills_dino_center_of_one_row_per_sample_is_refused():
    """kills: models/dino.py ``center_sharpen`` ``(center.dim() == 2 and center.shape[0] != 1)`` dropped (a ``(B, K)``
    centre, a per-sample batch of logits passed by mistake, was subtracted row by row: each sample got its own
    "centre" and the targets of ``dino_loss`` were silently different)."""
    from diffusionformer.models.dino import center_sharpen, dino_loss

    logits = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"center must have shape \(K,\) or \(1, K\), got \(3, 4\)"):
        center_sharpen(logits[0], logits[0], 0.5)
    with pytest.raises(ValueError, match=r"center must have shape \(K,\) or \(1, K\), got \(3, 4\)"):
        dino_loss(torch.randn(3, 3, 4), logits, logits[0], 0.1, 0.04)
    torch.testing.assert_close(center_sharpen(logits[0], logits[0, :1], 0.5),
                               torch.softmax((logits[0] - logits[0, :1]) / 0.5, dim=-1))


def test_kills_knn_refuses_a_label_equal_to_num_classes():
    """kills: models/dino.py ``knn_classify`` ``hi >= num_classes`` -> ``hi > num_classes`` (a label equal to
    ``num_classes`` passed the check and failed in ``scatter_add_`` with torch's bare index error)."""
    from diffusionformer.models.dino import knn_classify

    bank = torch.eye(3)
    with pytest.raises(ValueError, match=r"bank_labels must lie in \[0, num_classes=2\), got labels in \[0, 2\]"):
        knn_classify(bank, torch.tensor([0, 1, 2]), bank, num_classes=2, k=1)


def test_kills_dino_config_momentum_one_is_allowed():
    """kills: models/dino.py ``DINOConfig.__post_init__`` ``0.0 <= self.momentum <= 1.0`` -> ``< 1.0`` (momentum 1, a
    frozen teacher, inside the documented [0, 1], was refused)."""
    from diffusionformer.models.dino import DINOConfig

    assert DINOConfig(input_size=(8, 8), patch_size=4, dim=8, depth=1, num_heads=2, momentum=1.0).momentum == 1.0
    with pytest.raises(ValueError, match=r"momentum must lie in \[0, 1\], got 1\.5"):
        DINOConfig(input_size=(8, 8), patch_size=4, dim=8, depth=1, num_heads=2, momentum=1.5)


def test_kills_gnn_refuses_an_edge_index_sized_one_node_larger():
    """kills: models/common.py ``_sized_edge_index`` ``s > num_nodes`` -> ``s > num_nodes + 1`` (a PyG ``EdgeIndex``
    of ``sparse_size`` ``(N + 1, N + 1)``, a graph of one more node than ``x`` has rows, was resized to ``(N, N)``
    without a word). Sized ``(N, N)`` it runs, as the plain edges."""
    pyg = pytest.importorskip("torch_geometric")
    from diffusionformer.models import GCN, GCNConfig

    torch.manual_seed(0)
    model = GCN(GCNConfig(in_channels=3, hidden=8, num_classes=2)).eval()
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match=r"an EdgeIndex of sparse_size \(5, 5\) describes more nodes than x has rows "
                                         r"\(N=4\)"):
        model(x, pyg.EdgeIndex(_PATH, sparse_size=(5, 5)))
    torch.testing.assert_close(model(x, pyg.EdgeIndex(_PATH, sparse_size=(4, 4))), model(x, _PATH))


def test_kills_block_takes_a_dropout_rate_of_one():
    """kills: nn/block.py ``_check_rate`` ``0.0 <= p <= 1.0`` -> ``0.0 <= p < 1.0`` (a dropout of 1, inside the
    ``[0, 1]`` that ``torch.nn.Dropout`` and the docstring take, was refused by Block and the MLPs). Rate 1 drops the
    whole MLP output in training; 1.5 is refused, naming the argument."""
    from diffusionformer.nn import Block, Mlp

    torch.manual_seed(0)
    mlp = Mlp(4, 8, dropout=1.0).train()
    assert torch.equal(mlp(torch.randn(3, 4)), torch.zeros(3, 4))
    assert Block(8, 2, dropout=1.0).drop1.p == 1.0
    with pytest.raises(ValueError, match=r"dropout must lie in \[0, 1\], got 1\.5"):
        Block(8, 2, dropout=1.5)
