"""Edge probes of the non-GPT models and the image data (third pass): ViT, DINO, GCN, GIN, the graph
transformer, the augmentations and ``build_image_data``; legal cases pinned against independent references
(``nn.MultiheadAttention`` with copied weights, GIN's update by hand, DINO's loss, EMA and centre by loops)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from diffusionformer.data.augment import MultiCropAugment, random_crop_flip
from diffusionformer.data.images import build_image_data
from diffusionformer.models import GCN, GIN, DiffusionGraphTransformer, DiffusionViT, GCNConfig, GINConfig
from diffusionformer.models import GraphTransformerConfig, ViTConfig
from diffusionformer.models.dino import DINO, DINOConfig, DINOHead, cosine_momentum, dino_loss, knn_classify
from diffusionformer.models.vit import attention_rollout

F64 = torch.float64


def _dino() -> DINO:
    torch.manual_seed(0)
    return DINO(DINOConfig(input_size=(4, 4), patch_size=2, dim=8, depth=1, num_heads=2, out_dim=6, head_hidden=8,
                           head_bottleneck=4))


# --- graph models -----------------------------------------------------------------------------------------------


def test_bug_gin_train_eps_refuses_non_bools():
    """Bug: ``GINConfig(train_eps="no")`` was accepted and read as true (a learned epsilon), and a numpy bool was
    accepted; both are refused now, the numpy one named ``numpy.bool``, as every flag of the package."""
    with pytest.raises(TypeError, match=r"^GINConfig\.train_eps: expected bool, got str 'no'$"):
        GINConfig(train_eps="no")
    with pytest.raises(TypeError, match=r"GINConfig\.train_eps: expected bool, got numpy\.bool_? np\.True_"):
        GINConfig(train_eps=np.True_)
    assert GINConfig(train_eps=True).train_eps is True


@pytest.mark.parametrize("make", [lambda: GCN(GCNConfig(in_channels=3, task="graph")),
                                  lambda: GIN(GINConfig(in_channels=3)),
                                  lambda: DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, task="graph"))],
                         ids=["gcn", "gin", "graph_transformer"])
def test_bug_int32_batch_reads_out_as_the_int64_one(make):
    """Bug: an int32 ``batch`` passes the models' check (int64 or int32 graph ids) but the graph readout failed
    inside PyG's scatter with "expected scalar type Long but found Int"; it now gives the int64 batch's logits."""
    torch.manual_seed(0)
    model = make().eval()
    x, ei = torch.randn(4, 3), torch.tensor([[0, 1], [1, 0]])
    batch = torch.tensor([0, 0, 1, 1])
    want = model(x, ei, batch)
    torch.testing.assert_close(model(x, ei, batch.int()), want, rtol=0, atol=0)
    # three readout rows instead of two: the head's matmul may take another BLAS kernel (last bits differ)
    torch.testing.assert_close(model(x, ei, batch.int(), num_graphs=3)[:2], want, rtol=1e-5, atol=1e-6)


def test_gin_matches_its_update_by_hand_with_isolated_nodes_and_an_empty_graph():
    """Reference: ``h' = MLP((1 + eps) h + sum_{j -> i} h_j)`` per layer, sum readout of every layer's
    representation through its own head; node 5 isolated, node 0 with a self-loop, graph 1 empty."""
    torch.manual_seed(0)
    model = GIN(GINConfig(in_channels=3, num_classes=2, hidden=4, num_layers=3, train_eps=True)).double()
    with torch.no_grad():
        for conv in model.convs:
            conv.eps.fill_(0.3)
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm1d)):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2.0)
    model.eval()
    x = torch.randn(6, 3, dtype=F64)
    ei = torch.tensor([[0, 1, 1, 2, 3, 4, 0], [1, 0, 2, 1, 4, 3, 0]])
    batch = torch.tensor([0, 0, 0, 2, 2, 2])
    A = torch.zeros(6, 6, dtype=F64)
    for s, d in ei.t().tolist():
        A[d, s] += 1
    hs, h = [x], x
    for conv in model.convs:
        h = conv.nn(1.3 * h + A @ h)
        hs.append(h)
    pooled = [torch.stack([h[:3].sum(0), torch.zeros_like(h[0]), h[3:].sum(0)]) for h in hs]
    want = sum(head(p) for head, p in zip(model.heads, pooled))
    torch.testing.assert_close(model(x, ei, batch), want)


# --- ViT --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pool,channels", [("cls", 1), ("mean", 3)])
def test_vit_matches_a_hand_built_vit_on_multihead_attention(pool, channels):
    """Reference: patches by ``unfold`` (row-major, non-square grid), ``nn.MultiheadAttention`` with the
    layer's weights, pre-norm blocks with an exact-GELU MLP, final norm, pooling, head; float64."""
    torch.manual_seed(0)
    vit = DiffusionViT(ViTConfig(input_size=(8, 12), patch_size=4, dim=16, depth=2, num_heads=4,
                                 in_channels=channels, pool=pool, num_classes=5)).double().eval()
    x = torch.randn(2, channels, 8, 12, dtype=F64)
    p = x.unfold(2, 4, 4).unfold(3, 4, 4).permute(0, 2, 3, 1, 4, 5).reshape(2, 6, channels * 16)
    z = p @ vit.patch_embed.weight.reshape(16, -1).T + vit.patch_embed.bias
    if pool == "cls":
        z = torch.cat([vit.cls_token.expand(2, -1, -1), z], 1)
    z = z + vit.pos_embed
    for blk in vit.blocks:
        mha = nn.MultiheadAttention(16, 4, batch_first=True).double()
        with torch.no_grad():
            mha.in_proj_weight.copy_(blk.attn.qkv.weight)
            mha.in_proj_bias.copy_(blk.attn.qkv.bias)
            mha.out_proj.weight.copy_(blk.attn.out_proj.weight)
            mha.out_proj.bias.copy_(blk.attn.out_proj.bias)
        h = blk.norm1(z)
        z = z + mha(h, h, h, need_weights=False)[0]
        z = z + blk.mlp.fc2(F.gelu(blk.mlp.fc1(blk.norm2(z))))
    z = vit.norm(z)
    want = vit.head(z[:, 0] if pool == "cls" else z.mean(1))
    torch.testing.assert_close(vit(x), want)


def test_bug_attention_rollout_normalize_refuses_non_bools():
    """Bug: ``attention_rollout(maps, normalize="no")`` renormalised the rows (a truthy string) and a numpy bool
    passed; both are refused now, naming ``normalize`` and the full type."""
    P = torch.tensor([[[[0.5, 0.5], [0.0, 1.0]]]])
    with pytest.raises(TypeError, match=r"^attention_rollout: normalize must be a bool, got str \('no'\)$"):
        attention_rollout([P], normalize="no")
    with pytest.raises(TypeError, match=r"got numpy\.bool_? \(np\.False_\)$"):
        attention_rollout([P], normalize=np.False_)
    torch.testing.assert_close(attention_rollout([P], residual=1.0, normalize=False), P[:, 0])


def test_bug_attention_rollout_docstring_math_has_no_tab_characters():
    """Bug: the docstring's math held TAB characters where ``\\tilde``, ``\\tfrac``, ``\\textstyle`` and ``\\text``
    were meant (a ``\\t`` escape written out), so the rendered formula read "ilde A_l = ... rac{1}{H}"."""
    doc = attention_rollout.__doc__
    assert "\t" not in doc
    assert r"\tilde A_l = (1 - r)\, I + r\, \tfrac{1}{H} \textstyle\sum_h A_{l,h}" in doc


# --- DINO -------------------------------------------------------------------------------------------------------


def test_dino_loss_ema_and_centre_match_their_formulas_by_loops():
    """Reference: the loss as a double loop over (teacher view i, student view j != i); the EMA and the centre
    by their update rules; the teacher gets no gradient and is deterministic with dropout in train mode."""
    torch.manual_seed(0)
    S, T, c = torch.randn(4, 3, 6, dtype=F64), torch.randn(2, 3, 6, dtype=F64), torch.randn(6, dtype=F64)
    terms = [(-(torch.softmax((T[i] - c) / 0.05, -1) * torch.log_softmax(S[j] / 0.1, -1)).sum(-1)).mean()
             for i in range(2) for j in range(4) if i != j]
    torch.testing.assert_close(dino_loss(S, T, c, 0.1, 0.05), torch.stack(terms).mean())
    dino = _dino()
    x = torch.randn(2, 1, 4, 4)
    out = dino(x, output="student")
    assert not dino(x, output="teacher").requires_grad and all(n.startswith("student.") for n, _ in dino.named_parameters())
    with torch.no_grad():
        for p in dino.student.parameters():
            p.add_(torch.randn_like(p))
    before = {n: b.clone() for n, b in dino.teacher.named_buffers()}
    dino.update_teacher(0.75)
    for n, p in dino.student.named_parameters():
        torch.testing.assert_close(dino.teacher.get_buffer(n), 0.75 * before[n] + 0.25 * p.detach())
    c0, logits = dino.center.clone(), torch.randn(2, 3, 6)
    dino.update_center(logits)
    torch.testing.assert_close(dino.center, 0.9 * c0 + 0.1 * logits.reshape(-1, 6).mean(0))
    assert out.shape == (2, 6)
    assert cosine_momentum(25, 0.99, 100) == pytest.approx(1 - 0.01 * (1 + math.cos(math.pi / 4)) / 2)


def test_bug_dino_head_sizes_must_be_ints():
    """Bug: ``DINOHead(8.0, 5)`` failed inside ``torch.empty`` ("type must be tuple of ints, but got float") and
    ``layers=2.5`` with "can't multiply sequence by non-int"; both now name the argument."""
    with pytest.raises(TypeError, match=r"^DINOHead\.in_dim must be a positive int, got float 8\.0$"):
        DINOHead(8.0, 5)
    with pytest.raises(TypeError, match=r"^DINOHead\.layers must be a positive int, got float 2\.5$"):
        DINOHead(8, 5, layers=2.5)
    with pytest.raises(ValueError, match=r"^DINOHead\.hidden must be a positive int, got 0$"):
        DINOHead(8, 5, hidden=0)


def test_bug_knn_classify_refuses_a_nan_temperature():
    """Bug: ``temperature=nan`` passed the ``temperature <= 0`` check: every vote was NaN and every query was
    predicted class 0, silently (a k-NN accuracy equal to class 0's share)."""
    bank = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match=r"k must be >= 1 and temperature > 0, got k=1, temperature=nan"):
        knn_classify(bank, torch.tensor([0, 1]), bank, 2, k=1, temperature=float("nan"))
    torch.testing.assert_close(knn_classify(bank, torch.tensor([0, 1]), bank, 2, k=1, temperature=np.float32(0.1)),
                               torch.tensor([0, 1]))


def test_bug_knn_classify_names_non_integer_k_num_classes_and_labels():
    """Bug: ``k=2.5`` and ``k=True`` failed in ``topk`` ("must be int, not float/bool"), ``num_classes=2.0`` in
    ``torch.zeros`` and float labels in ``scatter_add_`` ("Expected dtype int32/int64 for index"), naming nothing of
    knn_classify's; numpy ints keep working."""
    bank, labels = torch.eye(3), torch.tensor([0, 1, 0])
    with pytest.raises(TypeError, match=r"^knn_classify: k must be an int, got float 2\.5$"):
        knn_classify(bank, labels, bank, 2, k=2.5)
    with pytest.raises(TypeError, match=r"^knn_classify: k must be an int, got bool True$"):
        knn_classify(bank, labels, bank, 2, k=True)
    with pytest.raises(TypeError, match=r"^knn_classify: num_classes must be an int, got float 2\.0$"):
        knn_classify(bank, labels, bank, 2.0)
    with pytest.raises(TypeError, match=r"^bank_labels must be integer class labels, got dtype torch\.float32$"):
        knn_classify(bank, labels.float(), bank, 2)
    assert knn_classify(bank, labels, bank, np.int64(2), k=np.int64(1)).tolist() == [0, 1, 0]


def test_bug_dino_momenta_refuse_bools():
    """Bug: ``update_teacher(True)`` copied the teacher onto itself as momentum 1 and ``cosine_momentum(0, True,
    10)`` returned 1.0: a bool is no number in this package."""
    dino = _dino()
    with pytest.raises(ValueError, match=r"^momentum must lie in \[0, 1\], got True$"):
        dino.update_teacher(True)
    with pytest.raises(ValueError, match=r"^base must lie in \[0, 1\], got True$"):
        cosine_momentum(0, True, 10)


# --- augmentation and image data ----------------------------------------------------------------------------------


def test_bug_random_crop_flip_flip_refuses_non_bools():
    """Bug: ``random_crop_flip(x, g, flip="no")`` flipped images (a truthy string) and ``flip=np.False_`` passed;
    both are refused now, naming ``flip`` and the full type."""
    x = torch.arange(16.0).view(1, 1, 4, 4)
    g = torch.Generator().manual_seed(0)
    with pytest.raises(TypeError, match=r"^random_crop_flip: flip must be a bool, got str \('no'\)$"):
        random_crop_flip(x, g, padding=0, flip="no")
    with pytest.raises(TypeError, match=r"got numpy\.bool_? \(np\.False_\)$"):
        random_crop_flip(x, g, padding=0, flip=np.False_)


def test_random_crop_flip_matches_its_draws_by_hand():
    """Reference: offsets then flips drawn from the generator in that order, zero padding, crop, flip."""
    x = torch.arange(32.0).view(2, 1, 4, 4)
    g = torch.Generator().manual_seed(3)
    off = torch.randint(0, 3, (2, 2), generator=g)
    flips = torch.rand(2, generator=g) < 0.5
    want = []
    for b in range(2):
        crop = F.pad(x[b], (1, 1, 1, 1))[:, off[b, 0]: off[b, 0] + 4, off[b, 1]: off[b, 1] + 4]
        want.append(crop.flip(-1) if flips[b] else crop)
    assert torch.equal(random_crop_flip(x, torch.Generator().manual_seed(3), padding=1), torch.stack(want))


@pytest.mark.parametrize("name", ["brightness", "noise_std"])
def test_bug_multicrop_refuses_infinite_brightness_and_noise(name):
    """Bug: ``MultiCropAugment(brightness=inf)`` (or ``noise_std=inf``) was accepted, and every view came out
    inf or NaN; it is refused now, naming the setting."""
    with pytest.raises(ValueError, match=rf"^MultiCropAugment\.{name} must be finite, got inf$"):
        MultiCropAugment(**{name: float("inf")})
    assert getattr(MultiCropAugment(**{name: np.float32(0.5)}), name) == 0.5


def test_bug_multicrop_sample_takes_a_numpy_batch_size():
    """Bug: ``sample(np.int64(2), ...)`` was refused as "batch_size must be a positive int, got np.int64(2)"; a
    count takes any integral number in this package. The draws equal the Python int's; a bool stays refused."""
    aug = MultiCropAugment(local_crops=1)
    got = aug.sample(np.int64(2), (1, 4, 4), torch.Generator().manual_seed(0))
    want = aug.sample(2, (1, 4, 4), torch.Generator().manual_seed(0))
    assert all(torch.equal(got[k], want[k]) for k in want)
    with pytest.raises(ValueError, match="batch_size must be a positive int, got True"):
        aug.sample(True, (1, 4, 4), torch.Generator())


def _images(labels: torch.Tensor, **kw):
    images = torch.randint(0, 256, (10, 1, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    splits = (torch.arange(6), torch.arange(6, 8), torch.arange(8, 10))
    return build_image_data("t", images, labels, splits, num_classes=2, normalize=False, meta={}, **kw)


def test_bug_build_image_data_checks_its_labels():
    """Bug: float labels were truncated by the int64 cast (1.5 became class 1, silently), labels outside
    ``[0, num_classes)`` and a ``(N, 1)`` label column were accepted and failed only in training. Each is refused
    now; the test labels of a separate test set are checked too."""
    y = torch.arange(10) % 2
    with pytest.raises(TypeError, match=r"^build_image_data: labels must be integer class labels, got dtype torch\.float32$"):
        _images(y.float() + 0.5)
    with pytest.raises(ValueError, match=r"^build_image_data: labels must lie in \[0, num_classes=2\), got labels in \[5, 6\]$"):
        _images(y + 5)
    with pytest.raises(ValueError, match=r"labels must be 1-D, got shape \(10, 1\)"):
        _images(y[:, None])
    test = (torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match=r"^build_image_data: test labels must lie in \[0, num_classes=2\), got labels in \[0, 2\]$"):
        _images(y, test=test)
    data = _images(y.int())
    assert data.y_train.dtype == torch.int64 and data.y_train.tolist() == [0, 1, 0, 1, 0, 1]
