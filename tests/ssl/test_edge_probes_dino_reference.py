"""DINO against an independent float64 transcription of the reference implementation.

Reference: facebookresearch/dino (Apache-2.0), ``main_dino.py`` (``DINOLoss.forward`` /
``DINOLoss.update_center``, the teacher EMA in ``train_one_epoch``), ``utils.py``
(``cosine_scheduler``) and ``vision_transformer.py`` (``DINOHead``: l2-normalised bottleneck,
``weight_norm`` last layer with ``weight_g`` fixed to 1). The formulas below are re-written in
float64 from those files; no code of the reference is imported.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from diffusionformer.data import ClassificationData
from diffusionformer.experiments.tasks import DINOTask
from diffusionformer.models import create_model
from diffusionformer.models.dino import DINOHead, cosine_momentum

TINY = dict(dim=16, depth=1, num_heads=2, out_dim=12, head_hidden=16, head_bottleneck=8)


def _ref_dino_loss(student_output, teacher_output, center, student_temp, teacher_temp, ncrops):
    """DINOLoss.forward (main_dino.py) in float64: batch-major chunks, 2 teacher chunks, v == iq skipped."""
    student_out = (student_output.double() / student_temp).chunk(ncrops)
    teacher_out = F.softmax((teacher_output.double() - center.double()) / teacher_temp, dim=-1).chunk(2)
    total, n = 0.0, 0
    for iq, q in enumerate(teacher_out):
        for v in range(len(student_out)):
            if v == iq:
                continue
            total = total + torch.sum(-q * F.log_softmax(student_out[v], dim=-1), dim=-1).mean()
            n += 1
    return total / n


def _ref_center(center, teacher_output, center_momentum):
    """DINOLoss.update_center (one process): EMA of the batch mean of the teacher's outputs."""
    batch_center = teacher_output.double().sum(dim=0, keepdim=True) / len(teacher_output)
    return center.double() * center_momentum + batch_center * (1 - center_momentum)


def _ref_cosine_scheduler(base_value, final_value, total_iters):
    """utils.cosine_scheduler without warm-up: ``final + (base - final) (1 + cos(pi i / N)) / 2``, i < N."""
    return [final_value + 0.5 * (base_value - final_value) * (1 + math.cos(math.pi * i / total_iters))
            for i in range(total_iters)]


def _task(local_crops: int, **over):
    torch.manual_seed(0)
    model = create_model("dino-digits", **{**TINY, **over})
    x, y = torch.randn(5, 1, 8, 8), torch.zeros(5, dtype=torch.long)
    data = ClassificationData("toy", "image", x, y, x, y, x, y, num_classes=2, input_shape=(1, 8, 8))
    return model, DINOTask(data, model, ssl={"local_crops": local_crops})


@pytest.mark.parametrize("batch_size, local_crops, step", [(1, 1, 0), (3, 1, 3), (2, 0, 7), (1, 2, 9)])
def test_task_loss_and_centre_match_the_reference(batch_size, local_crops, step):
    """One DINOTask step (odd and even view counts, B = 1) equals DINOLoss on the same logits, with the
    teacher temperature of the warm-up, and the centre moves AFTER the loss with this step's teacher output."""
    model, task = _task(local_crops, warmup_teacher_temp=0.07, teacher_temp=0.04, warmup_teacher_temp_steps=6)
    with torch.no_grad():
        model.center.normal_()
        for p in model.student.parameters():  # a student that differs from the teacher
            p.add_(0.05 * torch.randn_like(p))
    batch = task.train_batch(step, torch.Generator().manual_seed(1), batch_size)
    views = task._views(batch)  # (V, B, C, H, W)
    ncrops = views.shape[0]
    assert ncrops == 2 + local_crops
    twin = copy.deepcopy(model)
    if step > 0:
        twin.update_teacher(twin.config.momentum_at(step - 1))
    # the reference's batch-major layout: the teacher sees the 2 global crops only, the student all crops
    with torch.no_grad():
        teacher_out = twin(views[:2].flatten(0, 1), output="teacher")
        student_out = twin(views.flatten(0, 1), output="student")
    temp = 0.07 + (0.04 - 0.07) * step / 6 if step < 6 else 0.04
    center0 = model.center.clone()
    expected = _ref_dino_loss(student_out, teacher_out, center0, 0.1, temp, ncrops)
    loss, metrics = task.loss(model, batch)
    assert metrics["teacher_temp"] == pytest.approx(temp, rel=1e-12)
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-6, abs=1e-6)
    assert torch.allclose(model.center.double(), _ref_center(center0, teacher_out, 0.9), atol=1e-6)
    # only the student gets gradients; the teacher's weights are plain tensors without history
    loss.backward()
    assert all(p.grad is not None for p in model.student.head.parameters())
    assert not any(b.requires_grad for b in model.teacher.buffers())


def test_teacher_ema_follows_the_reference_momentum_schedule():
    """momentum_at(i) is utils.cosine_scheduler(base, 1, ...)[i] for every update, and 1 from T on."""
    base, total = 0.996, 7
    ref = _ref_cosine_scheduler(base, 1.0, total)
    assert [cosine_momentum(i, base, total) for i in range(total)] == pytest.approx(ref, rel=0, abs=1e-15)
    assert cosine_momentum(total, base, total) == 1.0 and cosine_momentum(0, base, total) == base
    model, task = _task(0, momentum=base, schedule_steps=total)
    with torch.no_grad():
        for p in model.student.parameters():
            p.add_(torch.randn_like(p))
    teacher = {n: b.double().clone() for n, b in model.teacher.named_buffers()}
    student = {n: p.detach().double() for n, p in model.student.named_parameters()}
    batch = task.train_batch(4, torch.Generator().manual_seed(0), 1)
    task.loss(model, batch)  # step 4: the EMA with the momentum that followed update 3
    m = ref[3]
    after = dict(model.teacher.named_buffers())
    for name, s in student.items():  # param_k = m param_k + (1 - m) param_q
        assert torch.allclose(after[name].double(), m * teacher[name] + (1 - m) * s, atol=1e-6), name


def test_head_equals_the_weight_normalised_reference_head():
    """DINOHead = last_layer(normalize(mlp(x))) with last_layer a weight_norm Linear (no bias), weight_g = 1:
    outputs and gradients of the prototypes (weight_v) agree in float64."""
    torch.manual_seed(1)
    head = DINOHead(8, 5, hidden=16, bottleneck=4, layers=3).double()
    v = head.prototypes.detach().clone().requires_grad_(True)
    x = torch.randn(3, 8, dtype=torch.float64)
    z = F.normalize(head.mlp(x), dim=-1, p=2)
    w = v / v.norm(dim=1, keepdim=True)  # weight_norm(dim=0): g * v / ||v||, g = 1 frozen
    ref = z.detach() @ w.T
    out = head(x)
    assert torch.allclose(out, ref, atol=1e-14)
    target = torch.randn(3, 5, dtype=torch.float64)
    (out * target).sum().backward()
    (ref * target).sum().backward()
    assert torch.allclose(head.prototypes.grad, v.grad, atol=1e-14)
    one = DINOHead(8, 5, hidden=16, bottleneck=4, layers=1)  # nlayers=1: a single Linear(in, bottleneck)
    assert [type(m).__name__ for m in one.mlp] == ["Linear"] and one.mlp[0].out_features == 4
