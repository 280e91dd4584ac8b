"""Edge probes of the vision and self-supervised models: DiffusionViT against a hand-built float64 reference,
DINO's EMA/centre/state, head layouts, GCN/GIN against explicit formulas, and the bugs found on the way."""

from __future__ import annotations

import io
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from diffusionformer.models.dino import DINO, DINOConfig, cosine_momentum, dino_loss, teacher_temperature
from diffusionformer.models.gcn import GCN, GCNConfig
from diffusionformer.models.gin import GIN, GINConfig
from diffusionformer.models.registry import create_model
from diffusionformer.models.vit import DiffusionViT, ViTConfig, attention_rollout
from diffusionformer.nn.heads import parse_heads


def _perturb(model: nn.Module, scale: float = 0.2) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))


def _vit_reference(m: DiffusionViT, x: torch.Tensor) -> torch.Tensor:
    """Float64 ViT: patches by unfold + matmul, class token, position embedding, pre-norm blocks with
    ``nn.MultiheadAttention`` holding the model's weights."""
    c = m.config
    B, p = x.shape[0], c.patch_size
    W = m.patch_embed.weight.reshape(c.dim, -1)
    if len(c.input_size) == 2:
        cols = F.unfold(x, kernel_size=p, stride=p).transpose(1, 2)  # (B, T, C p p)
    else:  # signals (B, T, C): patch t holds samples t p .. t p + p - 1, channel-major like the Conv1d weight
        cols = x.reshape(B, c.input_size[0] // p, p, c.in_channels).transpose(2, 3).reshape(B, -1, c.in_channels * p)
    z = cols @ W.T + m.patch_embed.bias
    if m.cls_token is not None:
        z = torch.cat([m.cls_token.expand(B, -1, -1), z], dim=1)
    z = z + m.pos_embed
    for blk in m.blocks:
        mha = nn.MultiheadAttention(c.dim, c.num_heads, batch_first=True).double()
        with torch.no_grad():
            mha.in_proj_weight.copy_(blk.attn.qkv.weight)
            mha.in_proj_bias.copy_(blk.attn.qkv.bias)
            mha.out_proj.weight.copy_(blk.attn.out_proj.weight)
            mha.out_proj.bias.copy_(blk.attn.out_proj.bias)
        h = F.layer_norm(z, (c.dim,), blk.norm1.weight, blk.norm1.bias)
        z = z + mha(h, h, h, need_weights=False)[0]
        h = F.layer_norm(z, (c.dim,), blk.norm2.weight, blk.norm2.bias)
        z = z + F.linear(F.gelu(F.linear(h, blk.mlp.fc1.weight, blk.mlp.fc1.bias)), blk.mlp.fc2.weight, blk.mlp.fc2.bias)
    z = F.layer_norm(z, (c.dim,), m.norm.weight, m.norm.bias)
    feat = z[:, 0] if m.cls_token is not None else z.mean(dim=1)
    return F.linear(feat, m.head.weight, m.head.bias)


@pytest.mark.parametrize("cfg, shape", [
    (dict(input_size=(8, 12), in_channels=3, patch_size=4, num_heads=4), (2, 3, 8, 12)),  # non-square, RGB
    (dict(input_size=(8, 8), in_channels=2, patch_size=2, num_heads=2, pool="mean"), (3, 2, 8, 8)),
    (dict(input_size=(12,), in_channels=2, patch_size=3, num_heads=2), (3, 12, 2)),  # signals
])
def test_vit_attention_heads_equal_a_float64_multihead_attention_reference(cfg, shape):
    torch.manual_seed(0)
    m = DiffusionViT(ViTConfig(dim=16, depth=2, num_classes=5, **cfg)).double().eval()
    _perturb(m)
    x = torch.randn(shape, dtype=torch.float64)
    torch.testing.assert_close(m(x), _vit_reference(m, x), rtol=0, atol=1e-12)


def test_vit_refuses_other_sizes_non_dividing_patches_and_integer_images():
    with pytest.raises(ValueError, match="must divide input_size"):
        ViTConfig(input_size=(10, 10), patch_size=4)
    m = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=2, dim=16, depth=1, num_heads=2))
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 1, 8, 8\), got \(2, 1, 16, 16\)"):
        m(torch.randn(2, 1, 16, 16))  # no silent position-embedding interpolation
    with pytest.raises(TypeError, match="floating-point"):
        m(torch.zeros(2, 1, 8, 8, dtype=torch.uint8))
    assert m(torch.full((1, 1, 8, 8), float("nan"))).isnan().all()  # NaN propagates, never hidden


def test_dino_ema_centre_no_teacher_gradient_and_state_dict_round_trip():
    torch.manual_seed(0)
    cfg = DINOConfig(input_size=(8, 8), patch_size=2, dim=16, depth=2, num_heads=2, out_dim=12, head_hidden=16,
                     head_bottleneck=8, laplacian_heads=1)
    d = DINO(cfg)
    _perturb(d.student, 1.0)
    teacher0 = {k: v.clone() for k, v in d.teacher.state_dict().items()}
    student = {k: v.detach().clone() for k, v in d.student.state_dict().items()}
    d.update_teacher(0.7)
    for k, v in d.teacher.state_dict().items():
        torch.testing.assert_close(v, 0.7 * teacher0[k] + 0.3 * student[k])
    logits = torch.randn(2, 3, 12)
    d.update_center(logits)
    torch.testing.assert_close(d.center, 0.1 * logits.reshape(-1, 12).mean(0, keepdim=True))
    x = torch.randn(3, 1, 8, 8)
    (d(x, output="student").sum() + d(x, output="teacher").sum() + d(x).sum()).backward()
    assert not [n for n, _ in d.named_parameters() if n.startswith("teacher")]
    assert all(b.grad is None and not b.requires_grad for b in d.teacher.buffers())
    buf = io.BytesIO()
    torch.save(d.state_dict(), buf)
    buf.seek(0)
    d2 = DINO(cfg)
    d2.load_state_dict(torch.load(buf))
    assert torch.equal(d2.center, d.center)
    for output in ("features", "student", "teacher"):
        assert torch.equal(d.eval()(x, output=output), d2.eval()(x, output=output))


def test_dino_loss_equals_the_pairwise_cross_entropy_and_schedule_boundaries():
    S, T = torch.randn(5, 4, 12, dtype=torch.float64), torch.randn(2, 4, 12, dtype=torch.float64)
    C = torch.randn(12, dtype=torch.float64)
    pairs = [(i, j) for i in range(2) for j in range(5) if i != j]
    ref = sum(-(torch.softmax((T[i] - C) / 0.04, -1) * torch.log_softmax(S[j] / 0.1, -1)).sum(-1).mean()
              for i, j in pairs) / len(pairs)
    torch.testing.assert_close(dino_loss(S, T, C, 0.1, 0.04), ref)
    assert [teacher_temperature(s, 0.07, 0.04, 10) for s in (0, 10, 11)] == [0.04, 0.07, 0.07]
    assert [cosine_momentum(s, 0.996, 10) for s in (0, 10, 11)] == [0.996, 1.0, 1.0]


def test_bug_dino_schedules_refuse_bad_lengths_and_nan_steps():
    """Bug: ``cosine_momentum(step, base, total_steps)`` took ``total_steps=0`` or ``-5`` (momentum 1 from the
    first step: a frozen teacher), ``teacher_temperature`` a negative ``warmup_steps`` (read as no warm-up), and
    both a NaN ``step`` (a NaN momentum or temperature), silently."""
    for total in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match=r"^total_steps must be a positive int, got "):
            cosine_momentum(0, 0.9, total)
    with pytest.raises(ValueError, match=r"^warmup_steps must be an int >= 0, got -5$"):
        teacher_temperature(0, 0.07, 0.04, -5)
    with pytest.raises(ValueError, match=r"^step must be >= 0, got nan$"):
        cosine_momentum(float("nan"), 0.9, 10)
    with pytest.raises(ValueError, match=r"^step must be >= 0, got nan$"):
        teacher_temperature(float("nan"), 0.07, 0.04, 10)
    assert teacher_temperature(3, 0.07, 0.04, 0) == 0.07  # no warm-up is still valid
    assert cosine_momentum(5, 0.9, 10) == pytest.approx(0.95)


def test_head_layout_strings():
    def layout(spec, H=4):
        return [(g.operator.name, g.start, g.count) for g in parse_heads(spec, H)]

    assert layout("  attention : 2 ,  laplacian:2 ") == [("attention", 0, 2), ("laplacian", 2, 2)]
    assert layout("attention:4,laplacian:0") == [("attention", 0, 4)]
    assert layout("attention:2,attention:2") == [("attention", 0, 2), ("attention", 2, 2)]
    with pytest.raises(ValueError, match="assigns 3 heads but the layer has num_heads=4"):
        layout("attention:2,laplacian:1")
    with pytest.raises(ValueError, match="did you mean 'laplacian'"):
        layout("attention:2,laplacan:2")
    with pytest.raises(ValueError, match="did you mean 'laplacian'"):
        layout("attention:4,lapla:0")  # a zero count still names a misspelt operator
    with pytest.raises(ValueError, match="must be non-negative"):
        layout("attention:6,laplacian:-2")


def test_registry_unknown_presets_and_wrongly_typed_overrides():
    with pytest.raises(ValueError, match="did you mean 'vit-mnist'"):
        create_model("VIT_MNIST")
    with pytest.raises(TypeError, match=r"model 'vit-mnist'\.dim: expected an int, got str '64'"):
        create_model("vit-mnist", dim="64")
    with pytest.raises(TypeError, match=r"qk_norm: expected a bool, got int 1"):
        create_model("vit-mnist", qk_norm=1)


def _dense_adjacency(edge_index: torch.Tensor, n: int) -> torch.Tensor:
    A = torch.zeros(n, n, dtype=torch.float64)
    for j, i in edge_index.T.tolist():  # message j -> i
        A[i, j] += 1.0
    return A


def test_gcn_and_gin_equal_their_formulas():
    torch.manual_seed(0)
    ei = torch.tensor([[0, 1, 1, 2, 3, 4, 5, 2], [1, 0, 2, 1, 4, 3, 5, 2]])  # self-loops on 2 and 5
    x, batch = torch.randn(6, 3, dtype=torch.float64), torch.tensor([0, 0, 0, 1, 1, 1])
    A = _dense_adjacency(ei, 6)
    A_hat = A.clone()
    A_hat.fill_diagonal_(1.0)  # add_remaining_self_loops: an existing self-loop keeps weight 1
    d = A_hat.sum(1) ** -0.5
    A_hat = d[:, None] * A_hat * d[None, :]
    gcn = GCN(GCNConfig(in_channels=3, num_classes=2, task="graph", hidden=5, num_layers=3)).double().eval()
    _perturb(gcn)
    h = x
    for conv in gcn.convs:
        h = F.relu(A_hat @ h @ conv.lin.weight.T + conv.bias)
    ref = torch.stack([h[:3].mean(0), h[3:].mean(0), torch.zeros(5, dtype=h.dtype)]) @ gcn.head.weight.T + gcn.head.bias
    torch.testing.assert_close(gcn(x, ei, batch, num_graphs=3), ref)

    gin = GIN(GINConfig(in_channels=3, num_classes=2, hidden=5, num_layers=3, train_eps=True)).double()
    _perturb(gin)
    gin.eval()

    def bn(m, t):
        return (t - m.running_mean) / torch.sqrt(m.running_var + m.eps) * m.weight + m.bias

    hs, h = [x], x
    for conv in gin.convs:
        s = conv.nn
        z = (1 + conv.eps) * h + A @ h
        z = F.relu(bn(s[1], z @ s[0].weight.T + s[0].bias))
        h = F.relu(bn(s[4], z @ s[3].weight.T + s[3].bias))
        hs.append(h)
    ref = sum(torch.stack([hh[:3].sum(0), hh[3:].sum(0)]) @ head.weight.T + head.bias for head, hh in zip(gin.heads, hs))
    torch.testing.assert_close(gin(x, ei, batch), ref)


def test_bug_attention_rollout_refuses_rows_summing_to_zero():
    """Bug: ``attention_rollout(..., residual=1.0)`` renormalised each row by its sum even when it was 0: the
    operator maps ``I - P`` of a Laplacian layer (``DiffusionViT.attention_rollout(kind="operator")``) or an
    all-zero row gave a NaN rollout (or entries ~1/eps from the round-off of a zero sum), silently."""
    torch.manual_seed(0)
    m = DiffusionViT(ViTConfig(input_size=(4, 4), patch_size=2, dim=8, depth=2, num_heads=2, laplacian_heads=2))
    x = torch.randn(2, 1, 4, 4)
    with pytest.raises(ValueError, match=r"^attention_rollout: a row of layer 0's mixed map .* sums to 0"):
        m.attention_rollout(x, kind="operator", residual=1.0)
    with pytest.raises(ValueError, match="sums to 0"):
        attention_rollout([torch.zeros(1, 1, 3, 3)], residual=1.0)
    assert m.attention_rollout(x, kind="operator", residual=0.5).isfinite().all()  # rows sum to 0.5: fine
    assert attention_rollout([torch.zeros(1, 1, 3, 3)], residual=1.0, normalize=False).eq(0).all()
    # the attention maps: the rollout equals the product of the mixed, renormalised layers
    P = m.attention_maps(x)
    ref = torch.eye(5).expand(2, 5, 5)
    for A in P:
        layer = 0.5 * torch.eye(5) + 0.5 * A.mean(1)
        ref = (layer / layer.sum(-1, keepdim=True)) @ ref
    torch.testing.assert_close(attention_rollout(P), ref)


def test_bug_attention_rollout_names_malformed_maps():
    """Bug: ``attention_rollout`` given a stacked ``(L, B, H, N, N)`` tensor failed with "Boolean value of Tensor
    with more than one value is ambiguous", a non-tensor entry with an AttributeError, integer maps inside
    ``mean``, and layers of different ``B`` or ``N`` inside the matrix product, none naming the argument."""
    P = torch.rand(2, 1, 1, 3, 3)
    with pytest.raises(TypeError, match=r"^attention_rollout: expected a list of per-layer maps .* got a Tensor "
                                        r"of shape \(2, 1, 1, 3, 3\)"):
        attention_rollout(P)
    torch.testing.assert_close(attention_rollout(list(P)), attention_rollout([P[0], P[1]]))
    with pytest.raises(TypeError, match=r"^attention_rollout: maps\[0\] must be a floating-point tensor .* got list$"):
        attention_rollout([[1.0]])
    with pytest.raises(TypeError, match=r"maps\[1\] must be a floating-point tensor .* got dtype torch.int64"):
        attention_rollout([P[0], torch.ones(1, 1, 3, 3, dtype=torch.long)])
    with pytest.raises(ValueError, match=r"^attention_rollout: maps\[1\] has shape \(1, 1, 4, 4\), the layers "
                                         r"before it \(B, N\) = \(1, 3\)$"):
        attention_rollout([P[0], torch.rand(1, 1, 4, 4)])
    with pytest.raises(ValueError, match=r"maps\[1\] has shape \(2, 1, 3, 3\)"):
        attention_rollout([P[0], torch.rand(2, 1, 3, 3)])
    assert math.isfinite(float(attention_rollout((P[0],)).sum()))


@pytest.mark.parametrize("kind", ["gcn", "gin"])
def test_bug_gcn_gin_check_the_shape_of_a_sparse_adjacency(kind):
    """Bug: a torch sparse adjacency passed GCN/GIN's checks unseen: one of the wrong size failed inside torch's
    sparse matmul with no word of ``edge_index`` (sitting 33). The right one (PyG's ``adj_t``) equals the edge list."""
    from diffusionformer.models import GCN, GCNConfig
    from diffusionformer.models.gin import GIN, GINConfig

    torch.manual_seed(0)
    model = (GCN(GCNConfig(in_channels=3, num_classes=2, dropout=0.0)) if kind == "gcn"
             else GIN(GINConfig(in_channels=3, num_classes=2, task="node", dropout=0.0))).double().eval()
    x = torch.randn(4, 3, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3, 1], [1, 0, 3, 2, 2]])
    adj_t = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1], dtype=torch.float64), (4, 4))
    torch.testing.assert_close(model(x, adj_t), model(x, ei))
    wrong = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1], dtype=torch.float64), (4, 5))
    with pytest.raises(ValueError, match=r"edge_index: a sparse adjacency \(adj_t\) must have shape \(N, N\) = \(4, 4\), got \(4, 5\)"):
        model(x, wrong)
