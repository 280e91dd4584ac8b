"""DINO's pieces against hand computations: EMA, centring and sharpening, the loss, k-NN, the model."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.models import DINO, DINOConfig, create_model, dino_loss, knn_classify, learned_operator_parameters
from diffusionformer.models.dino import center_sharpen, cosine_momentum, teacher_temperature

TINY = dict(dim=16, depth=2, num_heads=2, out_dim=12, head_hidden=16, head_bottleneck=8)


def tiny(**over) -> DINO:
    torch.manual_seed(0)
    return create_model("dino-digits", **{**TINY, **over})


def test_teacher_is_a_copy_in_buffers_and_state_dict():
    model = tiny()
    student_params = dict(model.student.named_parameters())
    teacher = dict(model.teacher.named_buffers())
    assert set(student_params) <= set(teacher)
    for name, p in student_params.items():
        assert torch.equal(p, teacher[name]) and teacher[name].data_ptr() != p.data_ptr()
    # only the student is trained and counted
    assert {n.split(".")[0] for n, _ in model.named_parameters()} == {"student"}
    state = model.state_dict()
    assert "center" in state and all(f"teacher.{n}" in state for n in student_params)
    # the runner's operator settings reach the backbone of both networks
    lap = tiny(laplacian_heads=1)
    assert lap.backbone.blocks[0].attn.heads_spec() == "attention:1,laplacian:1"
    assert lap.student.backbone.blocks[1].attn.heads_spec() == "attention:1,laplacian:1"
    heat = tiny(heads="attention:1,heat(t=0.5, learnable=True, steps=2):1")
    assert sorted(learned_operator_parameters(heat)) == [
        f"student.backbone.blocks.{i}.attn.operators.1.t" for i in range(2)]
    base = sum(p.numel() for p in tiny().parameters())
    assert sum(p.numel() for p in lap.parameters()) == base
    assert sum(p.numel() for p in heat.parameters()) == base + 2


def test_ema_update_is_m_teacher_plus_one_minus_m_student():
    model = tiny()
    with torch.no_grad():
        for p in model.student.parameters():
            p.add_(torch.randn_like(p))
    before = {n: b.clone() for n, b in model.teacher.named_buffers()}
    student = {n: p.detach().clone() for n, p in model.student.named_parameters()}
    m = 0.7
    model.update_teacher(m)
    after = dict(model.teacher.named_buffers())
    for name, s in student.items():
        assert torch.allclose(after[name], m * before[name] + (1 - m) * s, atol=1e-6), name
    for name in set(before) - set(student):  # operator constants are not averaged
        assert torch.equal(after[name], before[name])
    model.update_teacher(0.0)
    assert all(torch.equal(dict(model.teacher.named_buffers())[n], s) for n, s in student.items())
    with pytest.raises(ValueError, match="momentum"):
        model.update_teacher(1.5)


def test_center_update_is_an_ema_of_the_batch_mean():
    model = tiny(center_momentum=0.8)
    c0 = torch.randn(1, 12)
    model.center.copy_(c0)
    logits = torch.randn(2, 5, 12)
    model.update_center(logits)
    assert torch.allclose(model.center, 0.8 * c0 + 0.2 * logits.reshape(10, 12).mean(0, keepdim=True), atol=1e-6)


def test_center_sharpen_by_hand():
    t = torch.tensor([[2.0, 0.0, -1.0]], dtype=torch.float64)
    c = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)
    tau = 0.5
    z = [(2 - 1) / tau, (0 + 1) / tau, (-1 - 0) / tau]  # [2, 2, -2]
    e = [math.exp(v) for v in z]
    expected = torch.tensor([[v / sum(e) for v in e]], dtype=torch.float64)
    assert torch.allclose(center_sharpen(t, c, tau), expected, atol=1e-15)
    # centring removes any constant shift of the teacher; sharpening lowers the entropy
    assert torch.allclose(center_sharpen(t + 3.0, c + 3.0, tau), expected, atol=1e-15)
    p_sharp, p_soft = center_sharpen(t, c, 0.1), center_sharpen(t, c, 1.0)
    ent = lambda p: float(-(p * p.log()).sum())  # noqa: E731
    assert ent(p_sharp) < ent(p_soft)


def test_dino_loss_equals_an_explicit_float64_reference():
    g = torch.Generator().manual_seed(0)
    Vs, Vt, B, K = 4, 2, 3, 6
    s = torch.randn(Vs, B, K, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(Vt, B, K, generator=g, dtype=torch.float64)
    c = torch.randn(K, generator=g, dtype=torch.float64)
    ts, tt = 0.1, 0.04
    total, pairs = 0.0, 0
    for i in range(Vt):
        for j in range(Vs):
            if i == j:
                continue
            for b in range(B):
                zt = [(float(t[i, b, k]) - float(c[k])) / tt for k in range(K)]
                mt = max(zt)
                pt = [math.exp(z - mt) for z in zt]
                pt = [p / sum(pt) for p in pt]
                zs = [float(s.detach()[j, b, k]) / ts for k in range(K)]
                ms = max(zs)
                lse = ms + math.log(sum(math.exp(z - ms) for z in zs))
                total += -sum(pt[k] * (zs[k] - lse) for k in range(K)) / B
            pairs += 1
    loss = dino_loss(s, t, c, ts, tt)
    assert pairs == 6 and abs(float(loss.detach()) - total / pairs) < 1e-12
    loss.backward()
    assert s.grad is not None and torch.isfinite(s.grad).all()
    # identical student and teacher views are never paired: a student that copies the teacher on
    # view i only is not rewarded for it
    with pytest.raises(ValueError, match="student views"):
        dino_loss(s[:1], t[:1], c, ts, tt)
    with pytest.raises(ValueError, match="do not match"):
        dino_loss(s, t[:, :2], c, ts, tt)


def test_knn_on_a_separable_toy_set_and_against_a_brute_force_vote():
    # two well-separated classes on the circle: every query is classified correctly
    angles = torch.linspace(0, 2 * math.pi, 41)[:-1]
    pts = torch.stack([torch.cos(angles), torch.sin(angles)], 1)
    labels = (pts[:, 0] > 0).long()
    keep = pts[:, 0].abs() > 0.3
    bank, y = pts[keep] * torch.rand(int(keep.sum()), 1).add(0.5), labels[keep]  # scale does not matter
    queries = torch.tensor([[1.0, 0.1], [0.9, -0.4], [-1.0, 0.2], [-0.7, -0.6]])
    assert knn_classify(bank, y, queries, 2, k=5).tolist() == [1, 1, 0, 0]
    # random data: the weighted vote of a brute-force loop
    g = torch.Generator().manual_seed(1)
    bank, y, q = torch.randn(50, 4, generator=g), torch.randint(0, 3, (50,), generator=g), torch.randn(9, 4, generator=g)
    k, T = 7, 0.07
    expected = []
    for qi in q:
        sims = [float(torch.dot(qi, b) / (qi.norm() * b.norm())) for b in bank]
        top = sorted(range(50), key=lambda i: -sims[i])[:k]
        score = [sum(math.exp(sims[i] / T) for i in top if int(y[i]) == c) for c in range(3)]
        expected.append(max(range(3), key=lambda c: (score[c], -c)))
    assert knn_classify(bank, y, q, 3, k=k, temperature=T, chunk_size=4).tolist() == expected
    assert knn_classify(bank, y, q, 3, k=500).shape == (9,)  # k clipped to the bank
    with pytest.raises(ValueError, match="bank_labels"):
        knn_classify(bank, y[:3], q, 3)
    with pytest.raises(ValueError, match=r"\(N, D\)"):
        knn_classify(bank, y, q[:, :2], 3)


def test_schedules():
    assert cosine_momentum(0, 0.99, 10) == 0.99 and cosine_momentum(10, 0.99, 10) == 1.0
    ms = [cosine_momentum(s, 0.99, 10) for s in range(12)]
    assert all(a <= b for a, b in zip(ms, ms[1:]))
    assert abs(cosine_momentum(5, 0.9, 10) - 0.95) < 1e-12
    assert teacher_temperature(0, 0.07, 0.04, 0) == 0.07
    assert abs(teacher_temperature(3, 0.07, 0.04, 6) - 0.055) < 1e-12
    cfg = DINOConfig(input_size=(8, 8), patch_size=2, momentum=0.9, schedule_steps=4)
    assert cfg.momentum_at(0) == 0.9 and cfg.momentum_at(4) == 1.0


def test_forward_outputs_and_modes():
    model = tiny()
    x = torch.randn(3, 1, 8, 8)
    assert model(x).shape == (3, 16) and torch.equal(model(x), model.backbone.forward_features(x))
    assert model.forward_patch_tokens(x).shape == (3, 16, 16)
    out = model(x, output="student")
    assert out.shape == (3, 12) and out.abs().max() <= 1 + 1e-6 and out.requires_grad
    assert not model(x, output="teacher").requires_grad
    model.train()
    assert model.training and model.student.training and not model.teacher.training
    assert model.no_weight_decay() <= {n for n, _ in model.named_parameters()}
    with pytest.raises(ValueError, match="output must be"):
        model(x, output="logits")


@pytest.mark.parametrize("kwargs,err,match", [
    (dict(num_classes=10), ValueError, "num_classes must be 0"),
    (dict(input_size=(40,), patch_size=4), ValueError, r"\(H, W\)"),
    (dict(student_temp=0.0), ValueError, "student_temp"),
    (dict(center_momentum=1.0), ValueError, "center_momentum"),
    (dict(momentum=1.5), ValueError, "momentum"),
    (dict(laplacian_heads=3), ValueError, "laplacian_heads"),
    (dict(out_dim="12"), TypeError, "expected an int"),
])
def test_bad_configs(kwargs, err, match):
    with pytest.raises(err, match=match):
        create_model("dino-digits", **{**TINY, **kwargs})
    with pytest.raises(TypeError, match="DINOConfig"):
        DINO(create_model("vit-digits").config)


def test_bad_view_settings_given_to_the_model_still_fail_clearly():
    # views are SSLConfig settings now; as (deprecated) create_model overrides they are still validated
    with pytest.warns(DeprecationWarning, match="SSLConfig"), \
            pytest.raises(ValueError, match="SSLConfig: .*global_scale"):
        create_model("dino-digits", **TINY, global_crop_scale=(0.9, 0.1))
