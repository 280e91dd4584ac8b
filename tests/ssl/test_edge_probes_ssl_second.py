"""Second edge-case pass over self-supervised vision: ``knn_classify``, the augmentations and ``build_task``'s DINO wiring.

Probed (and found right): the teacher/student equality at initialisation and after an EMA step with momentum 0 for
every registered operator (learnable heat/PPR time included) and after a state-dict round trip;
``random_crop_flip`` against a per-image loop (uint8 and float, padding larger than the image); the multi-crop views
of tiny and non-square images (1x1, 1x5, 3x2) in float64; the k-NN vote against a float64 brute-force reference.

Found and fixed:
* ``knn_classify`` summed ``exp(s / T)`` in float32: for ``T`` below about 0.0113 (``SSLConfig`` accepts any positive
  temperature) a neighbour with cosine similarity near 1 gave an infinite vote, every such class tied at inf and the
  smallest class index won, whatever the neighbours said.
* ``knn_classify`` accepted int16 / uint8 labels (its check asks for integer labels) and then failed inside
  ``scatter_add_`` ("Expected dtype int32/int64 for index").
* ``gaussian_blur`` (and so ``MultiCropAugment`` with ``blur_prob > 0``) on float16 images built the kernel in float16,
  where the clamped ``sigma**2 = 1e-12`` of an unblurred view is 0: the kernel was 0/0 and the view all NaN.
* ``build_task(..., ssl=...)`` on a DINO model dropped ``augment`` and ``label_smoothing`` without a word, while the
  same call without ``ssl`` refuses them.
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.data.augment import MultiCropAugment, gaussian_blur
from diffusionformer.data.base import ClassificationData
from diffusionformer.experiments.tasks import DINOTask, build_task
from diffusionformer.models.dino import DINO, DINOConfig, knn_classify

TINY = dict(input_size=(8, 8), patch_size=2, dim=16, depth=1, num_heads=2, out_dim=8, head_hidden=16,
            head_bottleneck=4)


def _knn_reference(bank, labels, queries, num_classes, k, temperature):
    """The weighted vote written out in float64 with Python's exact-ish log-sum-exp comparison."""
    out = []
    for q in queries.double():
        sims = [float(torch.dot(q, b) / (q.norm() * b.norm())) for b in bank.double()]
        top = sorted(range(len(sims)), key=lambda i: -sims[i])[:k]
        m = max(sims[i] for i in top)
        scores = [sum(math.exp((sims[i] - m) / temperature) for i in top if int(labels[i]) == c)
                  for c in range(num_classes)]
        out.append(max(range(num_classes), key=lambda c: (scores[c], -c)))
    return torch.tensor(out)


# ----------------------------------------------------------------------------- knn_classify
@pytest.mark.parametrize("temperature", [0.07, 0.01, 0.002])
def test_bug_knn_small_temperature_overflow(temperature):
    """Bug: the votes exp(s / T) overflowed float32 for T < ~0.0113: a class-1 neighbour with similarity 1 and a
    class-0 one with similarity 0.95 both voted inf, and the tie went to class 0 (the reference says class 1)."""
    bank = torch.tensor([[1.0, 0.0], [0.95, math.sqrt(1 - 0.95**2)]])
    labels = torch.tensor([1, 0])
    q = torch.tensor([[1.0, 0.0]])
    assert knn_classify(bank, labels, q, 2, k=2, temperature=temperature).tolist() == [1]
    g = torch.Generator().manual_seed(0)
    bank, queries = torch.randn(30, 6, generator=g), torch.randn(12, 6, generator=g)
    labels = torch.randint(0, 4, (30,), generator=g)
    got = knn_classify(bank, labels, queries, 4, k=7, temperature=temperature, chunk_size=5)
    assert torch.equal(got, _knn_reference(bank, labels, queries, 4, 7, temperature))


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8, torch.int32])
def test_bug_knn_small_integer_labels(dtype):
    """Bug: int16 / uint8 labels passed the "integer class labels" check and then failed in scatter_add_ with
    "Expected dtype int32/int64 for index"."""
    g = torch.Generator().manual_seed(1)
    bank, queries = torch.randn(20, 5, generator=g), torch.randn(6, 5, generator=g)
    labels = torch.randint(0, 3, (20,), generator=g)
    want = knn_classify(bank, labels, queries, 3, k=4)
    got = knn_classify(bank, labels.to(dtype), queries, 3, k=4)
    assert got.dtype == torch.int64 and torch.equal(got, want)


# ----------------------------------------------------------------------------- augmentations
def test_bug_blur_float16_nan():
    """Bug: in float16 the kernel of sigma = 0 (every unblurred view) was exp(-0 / 0) = NaN: sigma clamped to 1e-6
    squares to 0 there, so gaussian_blur and MultiCropAugment returned all-NaN views."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 8, 8, generator=g)
    sigma = torch.tensor([0.0, 1e-4, 0.8])
    y16 = gaussian_blur(x.half(), sigma, kernel_size=5)
    assert y16.dtype == torch.float16 and torch.isfinite(y16).all()
    assert torch.equal(y16[:2], x.half()[:2])  # sigma ~ 0: a delta kernel, the image unchanged
    torch.testing.assert_close(y16.float(), gaussian_blur(x, sigma, kernel_size=5), atol=5e-3, rtol=5e-3)
    aug = MultiCropAugment(local_crops=1, blur_prob=0.5)
    params = aug.sample(3, (2, 8, 8), torch.Generator().manual_seed(3))
    assert bool((params["sigma"] == 0).any())  # some views are not blurred
    v16 = aug.apply(x.half(), params)
    assert torch.isfinite(v16).all()
    torch.testing.assert_close(v16.float(), aug.apply(x, params), atol=2e-2, rtol=2e-2)


def test_multicrop_tiny_and_non_square_images_float64():
    aug = MultiCropAugment(local_crops=2, blur_prob=1.0, blur_sigma=(0.5, 3.0), noise_std=0.1, flip_prob=0.5)
    for shape in [(2, 1, 1, 1), (2, 3, 1, 5), (1, 2, 3, 2)]:
        x = torch.randn(shape, dtype=torch.float64)
        v = aug(x, torch.Generator().manual_seed(0))
        assert v.shape == (4, *shape) and v.dtype == torch.float64 and torch.isfinite(v).all()


# ----------------------------------------------------------------------------- the DINO module and task wiring
@pytest.mark.parametrize("heads", ["heat(learnable=True):1,attention:1", "ppr(learnable=True):1,attention:1",
                                   "neutreno:1,attention:1", "attnscale:1,attention:1"])
def test_teacher_follows_student_exactly_with_learned_operators(heads):
    torch.manual_seed(0)
    dino = DINO(DINOConfig(**{**TINY, "depth": 2}, heads=heads)).eval()
    x = torch.randn(3, 1, 8, 8)
    assert torch.equal(dino(x, output="teacher"), dino(x, output="student"))
    with torch.no_grad():
        for p in dino.student.parameters():
            p.add_(0.1 * torch.randn_like(p))
    dino.update_teacher(0.0)
    assert torch.equal(dino(x, output="teacher"), dino(x, output="student"))
    twin = DINO(dino.config).eval()
    twin.load_state_dict(dino.state_dict())
    assert torch.equal(twin(x, output="teacher"), dino(x, output="teacher"))


def _toy_data():
    x = torch.randn(4, 1, 8, 8)
    y = torch.tensor([0, 1, 0, 1])
    return ClassificationData("toy-images", "image", x, y, x, y, x, y, num_classes=2, input_shape=(1, 8, 8))


@pytest.mark.parametrize("extra", [dict(augment={"crop_padding": 4}), dict(label_smoothing=0.1)])
def test_bug_build_task_ssl_drops_supervised_options(extra):
    """Bug: build_task(data, dino, ssl=..., augment=... or label_smoothing=...) returned a DINOTask and dropped the
    supervised options silently; without ssl the same call refuses them."""
    model = DINO(DINOConfig(**TINY))
    with pytest.raises(ValueError, match="augment and label_smoothing apply to supervised classification only"):
        build_task(_toy_data(), model, **extra)
    with pytest.raises(ValueError, match=r"augment and label_smoothing .* \(ssl given\)"):
        build_task(_toy_data(), model, ssl={"local_crops": 1}, **extra)
    assert isinstance(build_task(_toy_data(), model, ssl={"local_crops": 1}), DINOTask)
