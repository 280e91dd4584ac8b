"""Edge probes of a self-supervised (DINO) user's walk: docs/tutorials/ssl.rst, then models/dino.py,
data/ssl.py, data/augment.py and the DINO task of the experiment runner.

The reference checks are written from the DINO paper (Caron et al., ICCV 2021) and its reference code
(facebookresearch/dino: ``DINOLoss``, the EMA teacher, ``eval_knn``'s weighted vote), in float64 and
independently of the library. Tests whose docstring starts with "Bug:" failed before their fix.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from diffusionformer.data.ssl import SSLConfig
from diffusionformer.models import DINO, DINOConfig, dino_loss, knn_classify


def _tiny_dino(**over) -> DINO:
    torch.manual_seed(0)
    cfg = dict(input_size=(8, 8), patch_size=4, dim=16, depth=1, num_heads=2, laplacian_heads=1, out_dim=12,
               head_hidden=16, head_bottleneck=8)
    return DINO(DINOConfig(**{**cfg, **over}))


def _reference_loss(student, teacher, center, student_temp, teacher_temp):
    """facebookresearch/dino's DINOLoss.forward on (V, B, K) logits: the teacher's chunks against every other
    student chunk, each pair's batch mean, averaged over the pairs."""
    s = list(student / student_temp)
    t = list(F.softmax((teacher - center) / teacher_temp, dim=-1))
    total, n = 0.0, 0
    for iq, q in enumerate(t):
        for v, sv in enumerate(s):
            if v == iq:
                continue
            total = total + torch.sum(-q * F.log_softmax(sv, dim=-1), dim=-1).mean()
            n += 1
    return total / n


def _reference_knn(bank, labels, queries, num_classes, k, temperature):
    """DINO's eval_knn.knn_classifier (one chunk): cosine top-k, votes exp(s / T) per class."""
    bank, queries = F.normalize(bank, dim=1), F.normalize(queries, dim=1)
    sim, idx = (queries @ bank.T).topk(k, dim=1)
    one_hot = torch.zeros(queries.shape[0] * k, num_classes, dtype=torch.float64)
    one_hot.scatter_(1, labels[idx].view(-1, 1), 1)
    votes = (one_hot.view(queries.shape[0], k, num_classes) * sim.div(temperature).exp().unsqueeze(-1)).sum(1)
    return votes.argmax(1)


# ---------------------------------------------------------------------------- references (float64)
@pytest.mark.parametrize("views", [2, 3, 6])
def test_dino_loss_matches_the_reference_loss_on_fixed_logits(views):
    g = torch.Generator().manual_seed(views)
    s = 3 * torch.randn(views, 5, 16, generator=g, dtype=torch.float64)
    t = 3 * torch.randn(2, 5, 16, generator=g, dtype=torch.float64)
    c = torch.randn(1, 16, generator=g, dtype=torch.float64)
    got = dino_loss(s, t, c, 0.1, 0.04)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, _reference_loss(s, t, c, 0.1, 0.04), rtol=1e-12, atol=0)


def test_center_and_ema_updates_match_the_reference_and_touch_the_teacher_only():
    dino = _tiny_dino(center_momentum=0.9).double()
    with torch.no_grad():
        for p in dino.student.parameters():
            p.add_(torch.randn_like(p))
        dino.center.copy_(torch.randn_like(dino.center))
    c0 = dino.center.clone()
    teacher_logits = torch.randn(2, 3, 12, dtype=torch.float64)
    dino.update_center(teacher_logits)
    torch.testing.assert_close(dino.center, 0.9 * c0 + 0.1 * teacher_logits.reshape(6, 12).mean(0, keepdim=True),
                               rtol=1e-14, atol=1e-15)
    before = {n: b.clone() for n, b in dino.teacher.named_buffers()}
    student = {n: p.clone() for n, p in dino.student.named_parameters()}
    dino.update_teacher(0.7)
    for name, b in dino.teacher.named_buffers():
        want = 0.7 * before[name] + 0.3 * student[name] if name in student else before[name]
        torch.testing.assert_close(b, want, rtol=1e-14, atol=1e-15)
    assert all(torch.equal(p, student[n]) for n, p in dino.student.named_parameters())
    assert not any(b.requires_grad for b in dino.teacher.buffers())


def test_knn_classify_matches_dino_eval_knn_by_brute_force():
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        bank = torch.randn(40, 6, generator=g, dtype=torch.float64)
        labels = torch.randint(0, 4, (40,), generator=g)
        queries = torch.randn(30, 6, generator=g, dtype=torch.float64)
        for k in (1, 5, 20):
            for temperature in (0.005, 0.07, 0.5):
                got = knn_classify(bank, labels, queries, 4, k=k, temperature=temperature, chunk_size=7)
                assert torch.equal(got, _reference_knn(bank, labels, queries, 4, k, temperature))


def test_multicrop_views_are_seeded_and_differ_per_view():
    aug = SSLConfig(local_crops=3, flip_prob=0.5, noise_std=0.1).augmentation()
    x = torch.randn(2, 1, 8, 8)
    a = aug(x, torch.Generator().manual_seed(3))
    assert torch.equal(a, aug(x, torch.Generator().manual_seed(3)))
    assert not torch.equal(a, aug(x, torch.Generator().manual_seed(4)))
    assert a.shape == (5, 2, 1, 8, 8)
    assert all(not torch.allclose(a[i], a[j]) for i in range(5) for j in range(i + 1, 5))


# ---------------------------------------------------------------------------- bugs
def test_bug_dino_loss_on_half_precision_logits_is_taken_in_float32():
    """Bug: dino_loss computed in the logits' dtype, so bf16 logits (a bf16 model, or the student's and teacher's
    head outputs under CPU autocast, which leaves softmax in bf16) gave a bfloat16 loss off by ~0.1% (29.5 for
    29.459) with a rounded gradient, where CUDA autocast (softmax in float32) and the reference gave float32; the
    library's other losses upcast half-precision logits (_wide)."""
    g = torch.Generator().manual_seed(0)
    s = torch.randn(4, 64, 256, generator=g).bfloat16()
    t = torch.randn(2, 64, 256, generator=g).bfloat16()
    c = torch.zeros(1, 256)
    want = _reference_loss(s.double(), t.double(), c.double(), 0.1, 0.04)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = dino_loss(s, t, c, 0.1, 0.04)
    plain = dino_loss(s, t, c, 0.1, 0.04)
    for got in (under_autocast, plain):
        assert got.dtype == torch.float32
        assert abs(float(got) - float(want)) < 1e-5 * float(want)


def test_bug_sslconfig_keeps_its_pairs_as_tuples_of_floats():
    """Bug: SSLConfig kept a pair field given as a list or a numpy array as given (ViTConfig.input_size and
    TrainConfig.betas become tuples): SSLConfig(global_crop_scale=[0.4, 1.0]) compared unequal to SSLConfig(), the
    same settings, and an array made == raise "The truth value of an array ... is ambiguous"."""
    cfg = SSLConfig(global_crop_scale=[0.4, 1.0], local_crop_scale=np.array([0.1, 0.4]), crop_ratio=[3 / 4, 4 / 3],
                    blur_sigma=[np.float32(0.5), 1])
    assert cfg.global_crop_scale == (0.4, 1.0) and cfg.local_crop_scale == (0.1, 0.4)
    assert cfg.blur_sigma == (0.5, 1.0) and all(type(v) is float for v in cfg.blur_sigma)
    assert cfg == SSLConfig(blur_sigma=(0.5, 1.0))


def test_bug_runner_warns_once_of_a_momentum_schedule_shorter_or_longer_than_the_run(tmp_path):
    """Bug: a DINO task whose schedule_steps differ from train.max_steps warned twice on one run_experiment: once in
    the check of the whole config and again in the check of the task with its data (the runner silenced the
    repeat of the minibatch warnings only)."""
    from diffusionformer.experiments import load_experiment_config, run_experiment

    config = load_experiment_config({
        "name": "ssl", "seeds": [0], "operators": [{"name": "attention"}],
        "tasks": [{"name": "d", "dataset": "digits", "model": "dino-digits", "metric": "knn_test_acc",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2, "out_dim": 8, "head_hidden": 8,
                                       "head_bottleneck": 4, "schedule_steps": 50},
                   "train": {"max_steps": 1, "batch_size": 4, "eval_interval": 1, "eval_steps": 1,
                             "checkpoint_interval": 1, "log_interval": 1}}]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_experiment(config, tmp_path, progress=False, log=lambda _: None)
    schedule = [w for w in caught if "DINO momentum schedule" in str(w.message)]
    assert len(schedule) == 1, [str(w.message) for w in schedule]
