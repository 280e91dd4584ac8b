"""Edge probes of the DINO loss, schedules and EMA state, checked against float64 re-implementations of
facebookresearch/dino's ``DINOLoss`` (main_dino.py) and of the paper's equations."""

from __future__ import annotations

import io

import pytest
import torch

from diffusionformer.models.dino import DINO, DINOConfig, dino_loss


def _reference_dino_loss(student, teacher, center, tau_s, tau_t):
    """main_dino.py's DINOLoss.forward in float64: teacher chunk iq vs student chunk v, v != iq."""
    s = student.double() / tau_s
    t = torch.softmax((teacher.double() - center.double()) / tau_t, dim=-1).detach()
    total, n = 0.0, 0
    for iq in range(t.shape[0]):
        for v in range(s.shape[0]):
            if v == iq:
                continue
            total = total + torch.sum(-t[iq] * torch.log_softmax(s[v], dim=-1), dim=-1).mean()
            n += 1
    return total / n


def _logits(vs, vt, b=5, k=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(vs, b, k, generator=g) * 3, torch.randn(vt, b, k, generator=g) * 3,
            torch.randn(k, generator=g) * 0.2)


@pytest.mark.parametrize("amp_dtype", [torch.bfloat16, torch.float16])
def test_bug_dino_loss_stays_float32_under_autocast(amp_dtype):
    """Bug: under bf16/fp16 autocast dino_loss ran its einsum as a low-precision matmul (bf16 loss, off by 0.1)."""
    student, teacher, center = _logits(4, 2, b=8, k=256)
    student.requires_grad_(True)
    s64 = student.detach().double().requires_grad_(True)
    ref = _reference_dino_loss(s64, teacher, center, 0.1, 0.04)
    ref.backward()
    try:
        with torch.autocast("cpu", dtype=amp_dtype):
            out = dino_loss(student, teacher, center, 0.1, 0.04)
    except RuntimeError as exc:  # a torch without this CPU autocast dtype
        pytest.skip(str(exc))
    out.backward()
    assert out.dtype == torch.float32  # trainer docs: "reductions, norms and the loss in float32"
    assert abs(out.item() - ref.item()) <= 1e-5 * abs(ref.item())
    torch.testing.assert_close(student.grad.double(), s64.grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("vs,vt", [(2, 2), (2, 1), (6, 2), (5, 3)])
def test_pins_dino_loss_and_gradient_match_dinoloss_float64(vs, vt):
    """0 local crops (Vs = Vt = 2), one teacher view, local crops: value and student gradient in float64;
    the teacher and the centre get none."""
    student, teacher, center = _logits(vs, vt)
    s, t, c = (x.double().requires_grad_(True) for x in (student, teacher, center))
    out = dino_loss(s, t, c, 0.1, 0.04)
    out.backward()
    s_ref = student.double().requires_grad_(True)
    ref = _reference_dino_loss(s_ref, teacher, center, 0.1, 0.04)
    ref.backward()
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=0)
    torch.testing.assert_close(s.grad, s_ref.grad, rtol=1e-10, atol=1e-14)
    assert t.grad is None and c.grad is None


def _tiny_dino():
    return DINO(DINOConfig(input_size=(8, 8), patch_size=2, dim=16, depth=1, num_heads=2, laplacian_heads=1,
                           out_dim=12, head_hidden=16, head_bottleneck=8, center_momentum=0.8))


def test_pins_ema_center_and_state_dict_round_trip_resume_exactly():
    """EMA and centre match the float64 equations; a state-dict round trip then continues bit-identically."""
    torch.manual_seed(0)
    a = _tiny_dino()
    with torch.no_grad():
        for p in a.student.parameters():
            p.add_(torch.randn_like(p))
    teacher0 = {n: b.double().clone() for n, b in a.teacher.named_buffers()}
    a.update_teacher(0.75)
    for n, p in a.student.named_parameters():
        torch.testing.assert_close(dict(a.teacher.named_buffers())[n].double(),
                                   0.75 * teacher0[n] + 0.25 * p.detach().double(), rtol=1e-6, atol=1e-7)
    logits = torch.randn(2, 3, 12)
    a.update_center(logits)
    torch.testing.assert_close(a.center.double(), 0.2 * logits.double().reshape(-1, 12).mean(0, keepdim=True),
                               rtol=1e-6, atol=1e-7)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    torch.manual_seed(1)
    b = _tiny_dino()
    b.load_state_dict(torch.load(buf))
    for m in (a, b):
        m.update_teacher(0.9)
        m.update_center(logits * 2)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    x = torch.randn(2, 1, 8, 8)
    assert torch.equal(a(x, output="teacher"), b(x, output="teacher"))

