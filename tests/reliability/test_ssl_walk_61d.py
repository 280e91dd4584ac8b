"""Walk 61d: a self-supervised vision researcher trains a tiny DINO on the staged CIFAR-10 through the runner, reads
it back with ``load_run`` and uses its backbones as feature extractors on new images.

Checked against independent hand computations: the k-NN vote of DINO's ``eval_knn.py`` (cosine, ``k``, ``T = 0.07``,
``exp(s / T)`` weights, ties to the smaller class), the linear probe, DINO's loss, centring and schedules (momentum
cosine 0.996 -> 1, teacher temperature warm-up), multi-crop routing (global views to the teacher only, all views to
the student) and ``set_input_size`` against a bicubic reference (timm's ``resample_abs_pos_embed``).

Bug found: ``knn_classify`` normalised the features as they came: the squared norm of finite float32 features of
size ~1e20 overflowed (every feature normalised to 0) and that of ~1e-20 underflowed (to the 1e-12 floor of
``F.normalize``), so every cosine was ~0 and the neighbours were picked among ties: silently wrong predictions.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from diffusionformer.models import DiffusionViT, ViTConfig
from diffusionformer.models.dino import (DINO, DINOConfig, center_sharpen, cosine_momentum, dino_loss, knn_classify,
                                         teacher_temperature)

_REPO = Path(__file__).resolve().parents[2]
STAGED = next((p for p in (Path(os.environ.get("DIFFUSIONFORMER_DATA") or _REPO / "nowhere"), _REPO.parent / "shared"
                           / "data") if (p / "SHA256SUMS").is_file()), _REPO / "nowhere")


def _hand_knn(bank, bank_y, queries, num_classes, k, T):
    """DINO's eval_knn.py, one query at a time in float64: top-k cosines, votes exp(s / T), ties to the smaller
    class."""
    bank = bank.double() / bank.double().norm(dim=1, keepdim=True)
    queries = queries.double() / queries.double().norm(dim=1, keepdim=True)
    out = []
    for row in queries @ bank.T:
        order = sorted(range(row.shape[0]), key=lambda i: -float(row[i]))[:k]
        score = [0.0] * num_classes
        for i in order:
            score[int(bank_y[i])] += math.exp(float(row[i]) / T)
        out.append(max(range(num_classes), key=lambda c: (score[c], -c)))
    return torch.tensor(out)


def _quiet(_):
    return None


@pytest.mark.skipif(not (STAGED / "cifar10_jpg" / "train.zip").is_file(),
                    reason="the staged CIFAR-10 files (../shared/data) are absent")
def test_pins_a_tiny_dino_on_cifar10_through_the_runner_reloads_and_scores_as_hand_knn_and_probe(tmp_path):
    from diffusionformer.analysis import linear_probe_accuracy
    from diffusionformer.data import load_dataset
    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments.reload import load_run
    from diffusionformer.experiments.runner import run_dir, run_experiment
    from diffusionformer.experiments.tasks import build_task
    from diffusionformer.train import read_metrics

    options = {"limit_train": 120, "limit_test": 40}
    cfg = load_experiment_config({"name": "w", "seeds": [0], "operators": [{"name": "attention"}], "tasks": [{
        "name": "d", "dataset": "cifar10", "model": "dino-digits", "metric": "knn_val_acc", "dataset_options": options,
        "eval_batch_size": 64, "ssl": {"local_crops": 2, "knn_k": 5},
        "model_overrides": {"input_size": [32, 32], "in_channels": 3, "patch_size": 8, "dim": 16, "depth": 1,
                            "num_heads": 2, "out_dim": 16, "head_hidden": 16, "head_bottleneck": 8,
                            "schedule_steps": 4, "warmup_teacher_temp": 0.02, "warmup_teacher_temp_steps": 2},
        "train": {"max_steps": 4, "batch_size": 4, "lr": 3e-3, "eval_interval": 4, "log_interval": 1,
                  "checkpoint_interval": 4}}]})
    [result] = run_experiment(cfg, tmp_path, data_root=str(STAGED), progress=False, log=_quiet)
    rd = run_dir(tmp_path / "w", "d", "attention", 0)
    train = [r for r in read_metrics(rd) if r["split"] == "train"]
    # the schedules of updates 0 .. 3: momentum 0.99 at the first (DINO's cosine_scheduler), tau_t 0.02 -> 0.04
    assert [r["metrics"]["momentum"] for r in train] == [cosine_momentum(s, 0.99, 4) for s in range(4)]
    assert train[0]["metrics"]["momentum"] == 0.99
    assert [r["metrics"]["teacher_temp"] for r in train] == [0.02, 0.03, 0.04, 0.04]

    run = load_run(rd)
    dino = run.model
    data = load_dataset("cifar10", root=STAGED, seed=0, **options)
    task = build_task(data, dino, eval_batch_size=64, ssl=dino.task_config)
    scores = task.evaluate(dino, None)
    assert scores["knn_test_acc"] == result.final["knn_test_acc"]
    with torch.no_grad():
        bank = dino(data.x_train)
        test = dino(data.x_test)
        assert torch.equal(bank, dino.backbone.forward_features(data.x_train))  # the teacher's features
    hand = _hand_knn(bank, data.y_train, test, data.num_classes, 5, 0.07)
    assert torch.equal(knn_classify(bank, data.y_train, test, data.num_classes, k=5, temperature=0.07), hand)
    assert scores["knn_test_acc"] == pytest.approx((hand == data.y_test).double().mean().item(), abs=1e-7)
    # the linear probe: ridge on centred one-hot targets, lam = 1e-3 ||X||^2 / D, as a float64 normal-equation solve
    x, y = bank.double(), data.y_train
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    tr, te = perm[: round(0.8 * len(y))], perm[round(0.8 * len(y)):]
    classes = torch.unique(y[tr])
    Y = (y[tr, None] == classes[None]).double()
    xm, ym = x[tr].mean(0), Y.mean(0)
    xc = x[tr] - xm
    W = torch.linalg.solve(xc.T @ xc + 1e-3 * xc.pow(2).sum() / x.shape[1] * torch.eye(x.shape[1]), xc.T @ (Y - ym))
    pred = classes[((x[te] - xm) @ W + ym).argmax(1)]
    assert linear_probe_accuracy(bank, y, seed=0) == pytest.approx((pred == y[te]).double().mean().item())

    # multi-crop: the teacher sees the 2 global views only, the student all 4
    seen = {"teacher": [], "student": []}
    for name in seen:
        getattr(dino, name).register_forward_pre_hook(lambda m, a, name=name: seen[name].append(a[0]))
    dino.train()
    batch = task.train_batch(1, torch.Generator().manual_seed(0), 3)
    views = task._views(batch)
    task.loss(dino, batch)
    assert torch.equal(seen["teacher"][0], views[:2].flatten(0, 1))
    assert torch.equal(seen["student"][0], views.flatten(0, 1))


def test_pins_dino_loss_centring_and_schedules_against_the_papers_equations():
    torch.manual_seed(0)
    s, t, c = torch.randn(4, 3, 5, dtype=torch.float64), torch.randn(2, 3, 5, dtype=torch.float64), torch.randn(1, 5)
    terms = [-(torch.softmax((t[i] - c.double()) / 0.04, -1) * torch.log_softmax(s[j] / 0.1, -1)).sum(-1).mean()
             for i in range(2) for j in range(4) if i != j]
    assert dino_loss(s, t, c, 0.1, 0.04).item() == pytest.approx(sum(terms).item() / len(terms), rel=1e-12)
    assert torch.allclose(center_sharpen(t, c, 0.04), torch.softmax((t - c.double()) / 0.04, -1))
    dino = DINO(DINOConfig(input_size=(8, 8), patch_size=4, dim=8, depth=1, num_heads=2, out_dim=5, head_hidden=8,
                           head_bottleneck=4))
    dino.center.copy_(c)
    dino.update_center(t.float())
    assert torch.allclose(dino.center, 0.9 * c + 0.1 * t.float().reshape(-1, 5).mean(0))
    assert cosine_momentum(0, 0.996, 10) == 0.996 and cosine_momentum(10, 0.996, 10) == 1.0
    assert cosine_momentum(9, 0.996, 10) == pytest.approx(1 - 0.004 * (1 + math.cos(math.pi * 9 / 10)) / 2)
    assert [teacher_temperature(i, 0.07, 0.04, 3) for i in range(5)] == pytest.approx([0.04, 0.05, 0.06, 0.07, 0.07])


@pytest.mark.parametrize(("old", "new"), [((32, 32), (16, 16)), ((32, 32), (48, 24)), ((16, 24), (40, 8))])
@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_pins_set_input_size_against_a_bicubic_reference(old, new, pool):
    vit = DiffusionViT(ViTConfig(input_size=old, patch_size=8, dim=8, depth=1, num_heads=2, pool=pool))
    pos = vit.pos_embed.detach().clone()
    prefix = 1 if pool == "cls" else 0
    grid = pos[:, prefix:].reshape(1, old[0] // 8, old[1] // 8, 8).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=(new[0] // 8, new[1] // 8), mode="bicubic", align_corners=False, antialias=True)
    expected = torch.cat([pos[:, :prefix], grid.permute(0, 2, 3, 1).reshape(1, -1, 8)], dim=1)
    assert torch.equal(vit.set_input_size(new).pos_embed, expected)
    assert vit(torch.randn(2, 1, *new)).shape == (2, 10)


@pytest.mark.parametrize("scale", [1e25, 1e-25])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bug_knn_classify_is_scale_free_for_huge_and_tiny_finite_features(scale, dtype):
    """Bug: the squared norms of float32 features of size 1e25 overflowed (every feature normalised to 0) and those
    of 1e-25 underflowed (to ``F.normalize``'s 1e-12 floor): every cosine was ~0, the neighbours were picked among
    ties and the predictions were silently wrong. Now each row is first scaled by a power of two (exact)."""
    torch.manual_seed(0)
    bank, queries = torch.randn(50, 8, dtype=dtype), torch.randn(20, 8, dtype=dtype)
    labels = torch.randint(0, 3, (50,))
    expected = _hand_knn(bank, labels, queries, 3, 5, 0.07)
    assert torch.equal(knn_classify(bank, labels, queries, 3, k=5), expected)
    big = 1e300 if dtype == torch.float64 and scale > 1 else 1e-300 if dtype == torch.float64 else scale
    assert torch.equal(knn_classify(bank * big, labels, queries * big, 3, k=5), expected)
