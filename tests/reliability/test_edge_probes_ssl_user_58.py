"""Edge probes of a self-supervised (DINO) user's second walk: one whole ``DINOTask`` update (EMA, temperature
warm-up, multi-crop views, loss, centre) and its k-NN evaluation against float64 references written from
facebookresearch/dino (``DINOLoss``, ``cosine_scheduler``, the EMA of ``main_dino.py``, ``eval_knn``), learned heads in
the EMA teacher, the teacher backbone's attention maps with Laplacian heads, and ``update_teacher`` at the
momenta 0 and 1. Tests whose docstring starts with "Bug:" failed before their fix.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from diffusionformer.data.ssl import SSLConfig
from diffusionformer.models import DINO, DINOConfig

_DATA_SETTINGS = dict(input_size=(8, 8), patch_size=4, dim=16, depth=2, num_heads=2, out_dim=12, head_hidden=16,
                      head_bottleneck=8)


def _tiny_dino(**over) -> DINO:
    torch.manual_seed(0)
    return DINO(DINOConfig(**{**_DATA_SETTINGS, "laplacian_heads": 1, **over}))


def _reference_loss(student, teacher, center, student_temp, teacher_temp):
    """DINOLoss.forward on (V, B, K) logits: each teacher chunk against every other student chunk."""
    t = F.softmax((teacher - center) / teacher_temp, dim=-1)
    total, n = 0.0, 0
    for iq in range(t.shape[0]):
        for v in range(student.shape[0]):
            if v != iq:
                total = total + torch.sum(-t[iq] * F.log_softmax(student[v] / student_temp, dim=-1), dim=-1).mean()
                n += 1
    return total / n


def _reference_momentum(step, base, total):
    """dino.utils.cosine_scheduler(base, 1, ...)[step]."""
    return 1.0 + 0.5 * (base - 1.0) * (1.0 + math.cos(math.pi * step / total))


def _task(dino, **ssl):
    """A DINOTask on random 8 x 8 images of 3 classes, 24 per split."""
    from diffusionformer.data.base import ClassificationData
    from diffusionformer.experiments.tasks import DINOTask

    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(24, 1, 8, 8, generator=g) for _ in range(3)]
    ys = [torch.randint(0, 3, (24,), generator=g) for _ in range(3)]
    data = ClassificationData("probe", "image", xs[0], ys[0], xs[1], ys[1], xs[2], ys[2], 3, (1, 8, 8))
    return DINOTask(data, dino, eval_batch_size=8, ssl=SSLConfig(**ssl))


# ---------------------------------------------------------------------------- one update, float64 reference
def test_one_task_update_matches_dino_ema_warmup_multicrop_loss_and_centre():
    dino = _tiny_dino(heads="attention:1,heat(learnable=True, steps=3):1", laplacian_heads=None, momentum=0.9,
                      schedule_steps=10, warmup_teacher_temp=0.02, teacher_temp=0.05, warmup_teacher_temp_steps=4)
    task = _task(dino, local_crops=2)
    with torch.no_grad():  # a student that has moved away from its teacher, a non-zero centre
        for p in dino.student.parameters():
            p.add_(0.05 * torch.randn_like(p))
        dino.center.normal_()
    step = 3
    batch = task.train_batch(step, torch.Generator().manual_seed(1), 5)
    views = task.augment.apply(batch["images"], {k: v for k, v in batch.items() if k not in ("images", "step")})
    assert views.shape[0] == 4  # 2 global + 2 local crops
    student_params = {n: p.detach().double() for n, p in dino.student.named_parameters()}
    assert any("operators" in n for n in student_params)  # the learned heat times follow the EMA too
    teacher = copy.deepcopy(dino.teacher).double()
    m = _reference_momentum(step - 1, 0.9, 10)  # the EMA after update step - 1
    with torch.no_grad():
        for name, buf in teacher.named_buffers():
            if name in student_params:
                buf.mul_(m).add_((1 - m) * student_params[name])
    student = copy.deepcopy(dino.student).double()
    center = dino.center.detach().double().clone()
    loss, metrics = task.loss(dino, batch)
    tau_t = 0.02 + (0.05 - 0.02) * step / 4
    with torch.no_grad():
        t = teacher(views[:2].double().flatten(0, 1)).view(2, 5, -1)  # the teacher sees the 2 global views only
        s = student(views.double().flatten(0, 1)).view(4, 5, -1)
        ref = _reference_loss(s, t, center, 0.1, tau_t)
        ref_center = 0.9 * center + 0.1 * t.reshape(-1, 12).mean(0, keepdim=True)
    assert metrics["teacher_temp"] == pytest.approx(tau_t)
    assert metrics["momentum"] == pytest.approx(_reference_momentum(step, 0.9, 10))
    assert float(loss.detach()) == pytest.approx(float(ref), rel=1e-5)
    torch.testing.assert_close(dino.center.double(), ref_center, rtol=1e-5, atol=1e-6)
    for name, buf in dino.teacher.named_buffers():
        torch.testing.assert_close(buf.double(), teacher.get_buffer(name), rtol=1e-5, atol=1e-6)


def test_task_knn_evaluation_is_dino_eval_knn_on_the_teacher_features():
    dino = _tiny_dino()
    task = _task(dino, knn_k=5, knn_temperature=0.07)
    with torch.no_grad():  # teacher != student: the bank must come from the teacher
        for p in dino.student.parameters():
            p.add_(0.5 * torch.randn_like(p))
    center = dino.center.clone()
    out = task.evaluate(dino, None)
    teacher = copy.deepcopy(dino.teacher.backbone).double()
    with torch.no_grad():
        bank = F.normalize(teacher.forward_features(task.data.x_train.double()), dim=1)
        for split in ("val", "test"):
            x, y = task.data.split(split)
            sim, idx = (F.normalize(teacher.forward_features(x.double()), dim=1) @ bank.T).topk(5, dim=1)
            votes = torch.zeros(x.shape[0], 3, dtype=torch.float64)
            votes.scatter_add_(1, task.data.y_train[idx], (sim / 0.07).exp())
            assert out[f"knn_{split}_acc"] == pytest.approx((votes.argmax(1) == y).double().mean().item())
    assert torch.equal(dino.center, center)  # the evaluation does not move the centre
    assert math.isfinite(out["loss"])


def test_teacher_attention_maps_of_laplacian_heads_are_identity_minus_p():
    dino = _tiny_dino()
    x = torch.randn(3, 1, 8, 8)
    P = dino.backbone.attention_maps(x, "P")
    ops = dino.backbone.attention_maps(x, "operator")
    for p, op in zip(P, ops):  # head 0 attention (P), head 1 Laplacian (I - P)
        torch.testing.assert_close(op[:, 0], p[:, 0])
        torch.testing.assert_close(op[:, 1], torch.eye(p.shape[-1]) - p[:, 1])
        torch.testing.assert_close(p.sum(-1), torch.ones_like(p.sum(-1)))
    assert dino.backbone.attention_rollout(x).shape == (3, 5, 5)  # 4 patches + the class token


# ---------------------------------------------------------------------------- update_teacher at momenta 0 and 1
def test_bug_update_teacher_at_momentum_0_copies_a_non_finite_teacher():
    """Bug: ``update_teacher(0.0)``, documented (ssl tutorial) as copying the student into the teacher, computed
    ``0 * teacher + student``: a teacher holding NaN or inf (a diverged run, ``to_empty`` memory) stayed NaN."""
    dino = _tiny_dino()
    with torch.no_grad():
        for buf in dino.teacher.buffers():
            buf.fill_(float("nan"))
    dino.update_teacher(0.0)
    for name, p in dino.student.named_parameters():
        assert torch.equal(dino.teacher.get_buffer(name), p.detach()), name


def test_bug_update_teacher_at_momentum_1_leaves_the_teacher_unchanged():
    """Bug: at momentum 1 (the end of the cosine schedule) ``update_teacher`` computed ``teacher + 0 * student``:
    an inf in the student made the teacher NaN, where the EMA of momentum 1 keeps the teacher as it is."""
    dino = _tiny_dino()
    before = {n: b.clone() for n, b in dino.teacher.named_buffers()}
    with torch.no_grad():
        next(dino.student.parameters()).fill_(float("inf"))
    dino.update_teacher(1.0)
    for name, buf in dino.teacher.named_buffers():
        assert torch.equal(buf, before[name]), name
