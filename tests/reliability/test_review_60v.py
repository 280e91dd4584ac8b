"""Review 60v: ``DINO.update_teacher`` through ``torch._foreach_*`` (1ba1a3b).

``torch._foreach_mul_`` rounds a Python momentum to a float16/bfloat16 teacher's dtype on CPU (0.99 to 0.98828 in
bfloat16), where ``Tensor.mul_`` multiplies in float32: ``m + (1 - m) != 1``, so a half-precision teacher (a DINO
cast to bfloat16, whose trainer updates it in its own dtype) drifted off a student that stood still.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.models.dino import DINO, DINOConfig


def _dino(dtype: torch.dtype) -> DINO:
    torch.manual_seed(0)
    return DINO(DINOConfig(input_size=(8, 8), patch_size=2, dim=16, depth=1, num_heads=2, laplacian_heads=1,
                           out_dim=8, head_hidden=16, head_bottleneck=8)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_teacher_ema_is_the_per_parameter_step(dtype):
    dino = _dino(dtype)
    with torch.no_grad():
        for p in dino.student.parameters():
            p.add_(torch.randn_like(p))
    expected = [t.clone().mul_(0.9).add_(s.detach(), alpha=1.0 - 0.9) for t, s in dino._ema_pairs("test")]
    dino.update_teacher(0.9)
    assert all(torch.equal(t, e) for (t, _), e in zip(dino._ema_pairs("test"), expected))


def test_bfloat16_teacher_stays_on_a_still_student():
    dino = _dino(torch.bfloat16)
    dino.update_teacher(0.0)  # the teacher is the student's copy
    for _ in range(100):
        dino.update_teacher(0.99)  # an EMA of a constant is that constant
    teacher = torch.cat([t.double().flatten() for t, _ in dino._ema_pairs("test")])
    student = torch.cat([s.detach().double().flatten() for _, s in dino._ema_pairs("test")])
    assert (teacher - student).norm() / student.norm() < 1e-3  # 2.2e-2 when the momentum was rounded to 0.98828


def test_teacher_of_half_and_float32_parts_is_the_per_parameter_step():
    dino = _dino(torch.float32)
    dino.teacher.head.to(torch.bfloat16)  # a bfloat16 head beside a float32 backbone: both paths in one update
    expected = [t.clone().mul_(0.7).add_(s.detach(), alpha=1.0 - 0.7) for t, s in dino._ema_pairs("test")]
    dino.update_teacher(0.7)
    assert {t.dtype for t, _ in dino._ema_pairs("test")} == {torch.float32, torch.bfloat16}
    assert all(torch.equal(t, e) for (t, _), e in zip(dino._ema_pairs("test"), expected))
