"""Fixes from the models audit: nucleus sampling at p = 1 and near 1, top-k's k, duplicate edges beyond
N^2 in the sparse attention, global attention over an unsorted batch, bias-free q/k norms, int config sizes."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.models import (
    DINOConfig,
    GCNConfig,
    GINConfig,
    DiffusionGPT,
    DiffusionGraphTransformer,
    DiffusionViT,
    GPTConfig,
    GraphTransformerConfig,
    ViTConfig,
    top_k_filter,
    top_p_filter,
)
from diffusionformer.models.common import check_positive_int
from diffusionformer.models.graph_transformer import GraphBlock
from diffusionformer.nn import DiffusionAttention
from diffusionformer.ops.csr import sddmm_heads


# ---- 1. top_p_filter: p = 1 keeps every token, p < 1 summed exactly ---------------------------------------------


def _reference_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Kept mask from float64 probabilities and exactly rounded prefix sums (math.fsum)."""
    keep = torch.zeros_like(logits, dtype=torch.bool)
    for b in range(logits.shape[0]):
        probs = torch.softmax(logits[b].double(), -1).tolist()
        order = sorted(range(len(probs)), key=lambda j: -probs[j])
        before: list[float] = []
        for r, j in enumerate(order):
            if r > 0 and math.fsum(before) >= p:
                break
            keep[b, j] = True
            before.append(probs[j])
    return keep


@pytest.mark.parametrize("logits", [
    torch.tensor([[0.0, -40.0]]),  # 1 - e^-40 rounds to 1 even in float64
    torch.tensor([[0.0, -30.0]]),
    torch.tensor([[0.0, -17.0, -17.0]], dtype=torch.float64),
    torch.randn(1, 50304, generator=torch.Generator().manual_seed(0)) * 3,
], ids=["two-tokens-40", "two-tokens-30", "float64-tail", "gpt2-vocab"])
@pytest.mark.parametrize("p", [1.0, 1])
def test_top_p_one_keeps_every_token(logits, p):
    out = top_p_filter(logits, p)
    assert out.isfinite().all()
    assert torch.equal(out, logits)


def test_top_p_below_one_sums_the_mass_exactly():
    # true mass before the 2nd token: 1 - 8.3e-8 < p; in float32 it rounds to >= p and dropped the token
    logits = torch.tensor([[0.0, -17.0, -17.0]], dtype=torch.float64)
    p = 1 - 5e-8
    assert _reference_top_p(logits, p).tolist() == [[True, True, False]]
    assert top_p_filter(logits, p).isfinite().tolist() == [[True, True, False]]
    wide = torch.randn(2, 2000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    for q in (0.5, 0.99, 0.99999, 0.999999):
        assert torch.equal(top_p_filter(wide, q).isfinite(), _reference_top_p(wide, q)), q


def test_top_p_below_one_keeps_its_other_behaviour():
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log()
    assert top_p_filter(logits, 0.75).isfinite().tolist() == [[True, True, False]]
    assert top_p_filter(logits, 1e-6).isfinite().tolist() == [[True, False, False]]  # at least one token
    ties = torch.zeros(1, 4)  # four equal tokens: 0.25 each, p = 0.5 keeps two
    assert int(top_p_filter(ties, 0.5).isfinite().sum()) == 2
    with pytest.raises(ValueError, match=r"top_p: expected a float in \(0, 1\]"):
        top_p_filter(logits, 1.5)


# ---- 6. top_k_filter validates k ---------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, -1, 1.5, 2.0, True, None, "2"])
def test_top_k_filter_rejects_a_bad_k(k):
    with pytest.raises(ValueError, match=r"top_k: expected a positive int, got"):
        top_k_filter(torch.tensor([[1.0, 3.0, 2.0, 0.0]]), k)


def test_top_k_filter_still_filters():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert top_k_filter(logits, 2).isfinite().tolist() == [[False, True, True, False]]
    assert torch.equal(top_k_filter(logits, 10), logits)  # k clipped to V


# ---- 2. duplicate edges beyond N^2 in the sparse attention -------------------------------------------------------


def _multiset_attention_reference(attn: DiffusionAttention, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
    """float64 softmax over each target's incoming edge list, every duplicate its own exp term."""
    N, D = x.shape
    H = attn.num_heads
    C = D // H
    q, k, v = (x @ attn.qkv.weight.T + attn.qkv.bias).split(D, -1)
    q, k, v = (t.view(N, H, C) for t in (q, k, v))
    out = torch.zeros(N, H, C, dtype=x.dtype)
    for i in range(N):
        srcs = edge_index[0][edge_index[1] == i]
        if len(srcs):
            s = (q[i][None] * k[srcs]).sum(-1) / math.sqrt(C)  # (e, H)
            out[i] = (s.softmax(0)[..., None] * v[srcs]).sum(0)
    return out.reshape(N, D) @ attn.out_proj.weight.T + attn.out_proj.bias


@pytest.mark.parametrize("edges", [
    [[0, 0], [0, 0]],  # one node, self loop twice: E = 2 > N^2 = 1
    [[0, 0, 0, 1, 1], [0, 0, 1, 0, 1]],  # E = 5 > 4
    [[0, 0, 0, 0, 1], [1, 1, 1, 0, 1]],
    [[0, 0, 0, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1, 0, 1]],  # E = 8, unsorted
    [[0, 0, 1], [1, 1, 0]],  # E <= N^2 (worked before)
], ids=["1-node-x2", "E5-a", "E5-b", "E8-unsorted", "E3"])
def test_sparse_attention_counts_every_duplicate_edge(edges):
    torch.manual_seed(0)
    attn = DiffusionAttention(8, 2).double()
    ei = torch.tensor(edges)
    x = torch.randn(int(ei.max()) + 1, 8, dtype=torch.float64)
    torch.testing.assert_close(attn(x, edge_index=ei), _multiset_attention_reference(attn, x, ei), rtol=0, atol=1e-12)


def test_sparse_attention_gradients_with_duplicates_beyond_n_squared():
    torch.manual_seed(0)
    attn = DiffusionAttention(4, 2, heads="attention:1,heat:1").double()
    ei = torch.tensor([[0, 0, 0, 1, 1, 0], [1, 1, 1, 0, 1, 0]])
    x = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: attn(t, edge_index=ei), (x,))


def test_sddmm_heads_with_more_entries_than_cells():
    crow = torch.tensor([0, 3, 5])  # row 0: cols 1, 1, 1; row 1: cols 0, 0 (E = 5 > R * M = 4)
    col = torch.tensor([1, 1, 1, 0, 0])
    a = torch.randn(3, 2, 4, dtype=torch.float64)
    b = torch.randn(3, 2, 4, dtype=torch.float64)
    rows = torch.tensor([0, 0, 0, 1, 1])
    expected = (a[:, rows] * b[:, col]).sum(-1)
    torch.testing.assert_close(sddmm_heads(crow, col, a, b), expected, rtol=0, atol=1e-14)


def test_graph_transformer_runs_with_duplicate_edges_beyond_n_squared():
    torch.manual_seed(0)
    m = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, num_heads=2)).double().eval()
    out = m(torch.randn(2, 3, dtype=torch.float64), torch.tensor([[0, 0, 0], [1, 1, 1]]))  # + 2 self loops: E = 5
    assert out.shape == (2, 2) and out.isfinite().all()


# ---- 3. global attention without sizes checks that batch is sorted -----------------------------------------------


@pytest.mark.parametrize("task", ["node", "graph"])
@pytest.mark.parametrize("batch", [[1, 0, 1, 1], [1, 1, 0, 0], [0, 1, 0, 1]])
def test_global_attention_rejects_an_unsorted_batch_without_sizes(task, batch):
    torch.manual_seed(1)
    m = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, num_heads=2, task=task,
                                                         global_attention=True)).double().eval()
    x = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="batch: expected sorted graph ids"):
        m(x, torch.zeros(2, 0, dtype=torch.long), torch.tensor(batch))


def test_graph_block_global_attention_checks_the_batch():
    torch.manual_seed(0)
    block = GraphBlock(8, 2, global_attention=True).double()
    x = torch.randn(4, 8, dtype=torch.float64)
    loops = torch.arange(4).repeat(2, 1)
    with pytest.raises(ValueError, match="batch: expected sorted graph ids"):
        block(x, loops, torch.tensor([1, 0, 1, 1]))
    with pytest.raises(ValueError, match="batch: expected non-negative graph ids"):
        block(x, loops, torch.tensor([-1, -1, 0, 0]))
    # a sorted batch (empty graph 1 included) still gives the sized path's result
    batch = torch.tensor([0, 0, 2, 2])
    torch.testing.assert_close(block(x, loops, batch), block(x, loops, batch, max_num_nodes=2, num_graphs=3),
                               rtol=0, atol=1e-12)


# ---- 4. bias=False drops the q/k LayerNorm biases ----------------------------------------------------------------


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_gpt_bias_false_has_no_bias_parameters_with_qk_norm(norm):
    m = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, bias=False, qk_norm=True,
                               norm=norm))
    assert [n for n, _ in m.named_parameters() if n.endswith("bias")] == []
    assert m(torch.randint(0, 11, (1, 5)))[0].isfinite().all()


def test_attention_qk_norm_follows_bias_and_keeps_the_bias_true_keys():
    free = DiffusionAttention(8, 2, qk_norm=True, bias=False)
    assert free.q_norm.bias is None and free.k_norm.bias is None
    assert free.q_norm.weight.shape == (4,)
    keys = set(DiffusionAttention(8, 2, qk_norm=True).state_dict())
    assert {"q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias", "qkv.bias", "out_proj.bias"} <= keys
    gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, qk_norm=True))
    assert {"blocks.0.attn.q_norm.bias", "blocks.0.attn.k_norm.bias"} <= set(gpt.state_dict())


# ---- 5. config sizes must be ints --------------------------------------------------------------------------------


@pytest.mark.parametrize("make,field", [
    (lambda v: GPTConfig(vocab_size=v), "GPTConfig.vocab_size"),
    (lambda v: GPTConfig(n_embd=v), "GPTConfig.n_embd"),
    (lambda v: GPTConfig(n_layer=v), "GPTConfig.n_layer"),
    (lambda v: GPTConfig(block_size=v), "GPTConfig.block_size"),
    (lambda v: ViTConfig(dim=v), "ViTConfig.dim"),
    (lambda v: ViTConfig(in_channels=v), "ViTConfig.in_channels"),
    (lambda v: ViTConfig(num_classes=v), "ViTConfig.num_classes"),
    (lambda v: GraphTransformerConfig(in_channels=v), "GraphTransformerConfig.in_channels"),
    (lambda v: GraphTransformerConfig(num_classes=v), "GraphTransformerConfig.num_classes"),
    (lambda v: GraphTransformerConfig(depth=v), "GraphTransformerConfig.depth"),
    (lambda v: GraphTransformerConfig(edge_dim=v), "GraphTransformerConfig.edge_dim"),
    (lambda v: GraphTransformerConfig(pe_dim=v), "GraphTransformerConfig.pe_dim"),
    (lambda v: GCNConfig(hidden=v), "GCNConfig.hidden"),
    (lambda v: GCNConfig(num_layers=v), "GCNConfig.num_layers"),
    (lambda v: GCNConfig(in_channels=v), "GCNConfig.in_channels"),
    (lambda v: GINConfig(hidden=v), "GINConfig.hidden"),
    (lambda v: GINConfig(num_layers=v), "GINConfig.num_layers"),
    (lambda v: GINConfig(num_classes=v), "GINConfig.num_classes"),
    (lambda v: DINOConfig(out_dim=v), "DINOConfig.out_dim"),
    (lambda v: DINOConfig(head_layers=v), "DINOConfig.head_layers"),
    (lambda v: DINOConfig(schedule_steps=v), "DINOConfig.schedule_steps"),
])
@pytest.mark.parametrize("value", [2.0, 2.5, True])
def test_config_sizes_must_be_ints(make, field, value):
    with pytest.raises(TypeError, match=rf"{field} must be .*int"):
        make(value)


def test_config_size_values_and_float_fields():
    with pytest.raises(ValueError, match=r"GPTConfig.n_layer must be a positive int, got 0"):
        GPTConfig(n_layer=0)
    with pytest.raises(ValueError, match=r"GraphTransformerConfig.dim must be a positive int, got -8"):
        GraphTransformerConfig(dim=-8)
    with pytest.raises(TypeError, match=r"X.size must be a positive int, got float 3.0"):
        check_positive_int("X", size=3.0)
    with pytest.raises(ValueError, match=r"GCNConfig.num_layers must be a positive int, got 0"):
        GCNConfig(num_layers=0)
    with pytest.raises(ValueError, match=r"GINConfig.num_layers must be >= 2"):
        GINConfig(num_layers=1)
    # float fields stay floats (DINO's temperatures among them)
    assert DINOConfig(student_temp=1, teacher_temp=0.5).student_temp == 1
    gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, mlp_ratio=1.5))
    assert gpt.blocks[0].mlp.fc1.out_features == 12
    vit = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, dim=8, depth=1, num_heads=2, num_classes=0,
                                 mlp_ratio=2.5))
    assert vit(torch.randn(1, 1, 8, 8)).shape[-1] == 8
    graph = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, num_heads=2,
                                                             mlp_ratio=0.5))
    assert graph(torch.randn(3, 3), torch.tensor([[0, 1], [1, 2]])).shape == (3, 2)
