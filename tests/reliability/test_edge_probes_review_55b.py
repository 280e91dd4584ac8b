"""Review of b5c2c75, fb0c87a, b596c84, 7060451 and 7113fb5 (helper 55n): the CIFAR-10 JPEG test order with and
without ``limit_test``, analysis caches of the old order, and the half precision of a capture read where its pass
runs."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
import torch

from diffusionformer.data import load_dataset
from diffusionformer.data.paths import CACHE_ENV


def _png(value: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (value, 255 - value, value // 2)).save(buf, format="PNG")
    return buf.getvalue()


def _write_zip(path: Path, split: str, per_class: int) -> None:
    """``<split>/<class>/NNNN.png``, every image its own lossless colour (an image names its position)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for c, name in enumerate(("airplane", "cat", "dog")):
            for i in range(per_class):
                zf.writestr(f"{split}/{name}/{i:04d}.png", _png(10 * (c * per_class + i)))


@pytest.mark.parametrize("warm", [False, True])
def test_bug_cifar_zip_test_subset_keeps_the_whole_splits_order(tmp_path, monkeypatch, warm):
    """b596c84 shuffled the zips' test split after the ``limit_test`` subset was taken: the subset came in a
    permutation of its own (``randperm(limit_test)``), so ``limit_test=6`` was not the first 6 images, nor in the
    order, of the whole split, unlike the train/val carve and the pickled test_batch's subset (a subsequence of the
    whole split). It is now the whole split's first ``limit_test`` images, with a cold cache or a warm one."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    root = tmp_path / "root"
    for split in ("train", "test"):
        _write_zip(root / "cifar10_jpg" / f"{split}.zip", split, per_class=8)
    if warm:  # the first load caches the decoded split
        load_dataset("cifar10", root=root, seed=3, verify=False, normalize=False)
    limited = load_dataset("cifar10", root=root, seed=3, verify=False, normalize=False, limit_test=6)
    whole = load_dataset("cifar10", root=root, seed=3, verify=False, normalize=False)
    assert not torch.equal(whole.y_test, whole.y_test.sort().values)  # shuffled, as b596c84 wants
    assert torch.equal(limited.x_test, whole.x_test[:6]) and torch.equal(limited.y_test, whole.y_test[:6])


def test_bug_analysis_caches_of_the_class_ordered_cifar_test_split_are_not_served():
    """``analyze`` serves ``<run>/analysis_cache.pt`` while its key (checkpoint, settings, ``ANALYSIS_VERSION``)
    matches. b596c84 reordered the CIFAR-10 zips' test split, so the 512 held-out images (a seeded subset of the
    split's positions) and the PCA maps' first 4 (airplanes, then) are other images: a cache made before, kept
    beside runs measured after it (a growing comparison, or a gpu_study.sh archive read from its caches), mixed two
    held-out sets in one table without a word. The version moved to 4 with it."""
    from diffusionformer.experiments import analyze

    assert analyze.ANALYSIS_VERSION >= 4


def _vit():
    from diffusionformer.models import DiffusionViT, ViTConfig

    torch.manual_seed(0)
    return DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, dim=8, depth=2, num_heads=2))


def _bf16(model, x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(x)


def _fp32(model, x):
    with torch.autocast("cpu", enabled=False):
        return model(x)


def test_bug_capture_precision_is_that_of_the_pass_not_of_the_loop_around_it():
    """7113fb5 read autocast where capture_dataset collects a pass, outside ``forward``: a ``forward`` callable that
    autocasts to bfloat16 gave tokens with bfloat16 rounding and no ``extra["precision"]`` (layer_reports fitted the
    power law to the rounding noise), and one that switches autocast off inside an outer bfloat16 autocast gave exact
    float32 tokens marked "bfloat16" (the fit cut at 2^-8 of the top singular value). It is read as each layer's
    tokens are recorded."""
    from diffusionformer.analysis import capture_dataset

    vit, batches = _vit(), [(torch.randn(3, 1, 8, 8), torch.tensor([0, 1, 2]))]
    assert capture_dataset(vit, batches, forward=_bf16).extra.get("precision") == "bfloat16"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert capture_dataset(vit, batches).extra.get("precision") == "bfloat16"  # unchanged
        assert "precision" not in capture_dataset(vit, batches, forward=_fp32).extra
        assert "precision" not in capture_dataset(vit.double(), [(batches[0][0].double(), batches[0][1])]).extra
