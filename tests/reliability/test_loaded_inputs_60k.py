"""A trained run used on new inputs: ``LoadedRun.preprocessing`` (how the run's inputs were prepared, recorded by the
runner in ``preprocessing.json``) and ``DiffusionViT.set_input_size`` (the learned position embedding resampled to
another image size, as timm's ``resample_abs_pos_embed``)."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from diffusionformer.models import DiffusionViT, ViTConfig
from experiments_tiny_configs import TINY_DIGITS_TOML


def _trained_digits_run(tmp_path, steps: int = 100):
    """A width-16 ViT trained ``steps`` steps on digits (one setting, one seed) by the runner: its run folder."""
    from diffusionformer.experiments import load_experiment_config, run_experiment
    from diffusionformer.experiments.results import run_dir

    toml = (TINY_DIGITS_TOML.replace("max_steps = 2", f"max_steps = {steps}").replace("eval_interval = 2",
                                                                                      f"eval_interval = {steps}")
            .replace("checkpoint_interval = 2", f"checkpoint_interval = {steps}")
            .replace("warmup_steps = 0", "warmup_steps = 0\nlr = 0.03").replace("batch_size = 8", "batch_size = 32")
            .replace("dim = 8", "dim = 16"))
    config = load_experiment_config(tomllib.loads(toml))
    config = type(config)(**{**config.__dict__, "operators": config.operators[:1]})
    run_experiment(config, tmp_path, progress=False, log=lambda m: None)
    return run_dir(tmp_path / config.name, "digits", config.operators[0].name, 0)


def _raw_digits_test_split():
    """The digits test split of data seed 0 as raw pixels (0..16, float) and labels, built from scikit-learn's array
    and the library's split, not from the loaded dataset's (already prepared) tensors."""
    from sklearn.datasets import load_digits

    from diffusionformer.data.splits import stratified_split

    bunch = load_digits()
    pixels = torch.from_numpy(np.asarray(bunch.images, dtype=np.float32)).unsqueeze(1)
    labels = torch.from_numpy(np.asarray(bunch.target, dtype=np.int64))
    test_idx = stratified_split(labels, 0.1, 0.2, 0)[2]
    return pixels[test_idx], labels[test_idx]


def test_raw_test_images_prepared_as_a_loaded_run_records_give_its_recorded_test_accuracy(tmp_path):
    """A loaded run gave its model but not how its inputs were prepared (pixels / 16, then the training split's
    per-channel mean and std): a new image could not be classified without reloading the whole dataset."""
    from diffusionformer import load_run

    run = load_run(_trained_digits_run(tmp_path))
    prep = run.preprocessing
    assert prep["kind"] == "image" and prep["scale"] == 16.0 and len(prep["mean"]) == len(prep["std"]) == 1
    pixels, labels = _raw_digits_test_split()
    mean, std = (torch.tensor(prep[k]).view(-1, 1, 1) for k in ("mean", "std"))
    with torch.no_grad():
        predicted = run.model((pixels / prep["scale"] - mean) / std).argmax(dim=1)
    accuracy = (predicted == labels).double().mean().item()
    recorded = run.summary["eval"]["metrics"]["test_acc"]
    assert recorded > 0.25  # trained past chance: the comparison below can tell preparations apart
    assert accuracy == pytest.approx(recorded, abs=1e-12)
    with torch.no_grad():  # and unprepared pixels do not give it (the check can fail)
        raw = (run.model(pixels).argmax(dim=1) == labels).double().mean().item()
    assert raw != pytest.approx(recorded, abs=1e-12)


def test_an_older_run_folder_without_its_preprocessing_says_none_and_a_damaged_record_warns(tmp_path):
    """A run folder written before ``preprocessing.json`` existed loads with ``preprocessing`` None (nothing
    guessed); an unreadable one is named in a warning."""
    from diffusionformer import load_run

    rdir = _trained_digits_run(tmp_path, steps=2)
    (rdir / "preprocessing.json").unlink()
    assert load_run(rdir).preprocessing is None
    (rdir / "preprocessing.json").write_text('{"kind": "ima')
    with pytest.warns(UserWarning, match="preprocessing.json is unreadable"):
        assert load_run(rdir).preprocessing is None


def test_the_recorded_preprocessing_of_text_is_its_vocabulary_and_of_unnormalised_images_no_statistics():
    """Text runs record the vocabulary (token id -> character) a new prompt is encoded with (and, since 61i, each
    split's token count and hash: a fingerprint a resume compares); images loaded with ``normalize=False`` record
    their scale and no statistics."""
    from diffusionformer.data import load_dataset
    from diffusionformer.experiments.reload import _data_preprocessing, _tensor_sha256

    text = load_dataset("pydoc-chars")
    assert _data_preprocessing(text) == {"kind": "text", "itos": list(text.itos),
                                         "train_tokens": text.train.numel(), "train_sha256": _tensor_sha256(text.train),
                                         "val_tokens": text.val.numel(), "val_sha256": _tensor_sha256(text.val)}
    digits = load_dataset("digits", normalize=False)
    assert _data_preprocessing(digits) == {"kind": "image", "scale": 16.0, "mean": None, "std": None}


# ----------------------------------------------------------------------------------------- set_input_size
def _antialiased_bicubic_matrix(n_in: int, n_out: int) -> torch.Tensor:
    """``(n_out, n_in)`` weights of antialiased bicubic resampling by hand, as PIL's ``resize`` (what torch's
    ``antialias=True`` and so timm's ``resample_abs_pos_embed`` follow): the cubic kernel with a = -0.5, stretched
    by the shrink factor when shrinking, over half-pixel centres, taps outside the grid dropped and the rest
    renormalised; in float64."""
    a = -0.5

    def kernel(x: float) -> float:
        x = abs(x)
        if x < 1:
            return (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1
        return a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a if x < 2 else 0.0

    stretch = max(n_in / n_out, 1.0)
    w = torch.zeros(n_out, n_in, dtype=torch.float64)
    for o in range(n_out):
        centre = (o + 0.5) * n_in / n_out
        lo, hi = max(int(centre - 2 * stretch + 0.5), 0), min(int(centre + 2 * stretch + 0.5), n_in)
        for i in range(lo, hi):
            w[o, i] = kernel((i + 0.5 - centre) / stretch)
        w[o] /= w[o].sum()
    return w


def _vit(**kw) -> DiffusionViT:
    torch.manual_seed(0)
    return DiffusionViT(ViTConfig(**{"input_size": (8, 8), "patch_size": 2, "dim": 8, "depth": 1,
                                     "num_heads": 2, **kw}))


def test_set_input_size_upsamples_the_patch_grid_bicubically_and_keeps_the_class_token():
    """A loaded ViT could not take another image size (``expected images of shape (B, 1, 8, 8)``): its
    pos_embed is resampled over the 2-D grid, checked against bicubic weights written by hand."""
    vit = _vit().double()
    old = vit.pos_embed.detach().clone()  # (1, 1 + 4 * 4, D)
    assert vit.set_input_size((12, 16)) is vit
    assert vit.config.input_size == (12, 16) and vit.config.grid_size == (6, 8)
    new = vit.pos_embed.detach()
    assert new.shape == (1, 1 + 6 * 8, 8) and new.dtype == torch.float64 and vit.pos_embed.requires_grad
    torch.testing.assert_close(new[:, :1], old[:, :1], rtol=0, atol=0)
    grid = old[0, 1:].reshape(4, 4, 8)
    rows, cols = _antialiased_bicubic_matrix(4, 6), _antialiased_bicubic_matrix(4, 8)
    expected = torch.einsum("hi,wj,ijd->hwd", rows, cols, grid)
    torch.testing.assert_close(new[0, 1:].reshape(6, 8, 8), expected, rtol=1e-10, atol=1e-10)
    assert vit(torch.randn(2, 1, 12, 16, dtype=torch.float64)).shape == (2, 10)
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 1, 12, 16\)"):
        vit(torch.randn(2, 1, 8, 8, dtype=torch.float64))


def test_set_input_size_shrinks_with_antialiasing_as_timm_and_is_the_identity_at_the_same_size():
    vit = _vit(input_size=(16, 16), pool="mean")  # no class token: every row is the grid's
    old = vit.pos_embed.detach().clone()
    vit.set_input_size((16, 16))
    torch.testing.assert_close(vit.pos_embed.detach(), old, rtol=0, atol=0)
    vit.set_input_size((8, 4))
    grid = old[0].reshape(8, 8, 8).double()
    rows, cols = _antialiased_bicubic_matrix(8, 4), _antialiased_bicubic_matrix(8, 2)
    expected = torch.einsum("hi,wj,ijd->hwd", rows, cols, grid)
    torch.testing.assert_close(vit.pos_embed.detach()[0].reshape(4, 2, 8).double(), expected, rtol=1e-5, atol=1e-6)
    by_hand = F.interpolate(old.reshape(1, 8, 8, 8).permute(0, 3, 1, 2), size=(4, 2), mode="bicubic",
                            align_corners=False, antialias=True).permute(0, 2, 3, 1).reshape(1, 8, 8)
    torch.testing.assert_close(vit.pos_embed.detach(), by_hand)
    assert vit(torch.randn(2, 1, 8, 4)).shape == (2, 10)


def test_set_input_size_of_signals_rope_models_and_bad_sizes():
    signal = _vit(input_size=(8,), in_channels=3)
    old = signal.pos_embed.detach().clone().double()
    signal.set_input_size((12,))
    expected = torch.cat([old[0, :1], _antialiased_bicubic_matrix(4, 6) @ old[0, 1:]])
    torch.testing.assert_close(signal.pos_embed.detach()[0].double(), expected, rtol=1e-5, atol=1e-6)
    assert signal(torch.randn(2, 12, 3)).shape == (2, 10)
    rope = _vit(rope=True)  # no learned positions: the rotary ones follow the grid
    state = {k: v.clone() for k, v in rope.state_dict().items()}
    rope.set_input_size((4, 12))
    assert rope(torch.randn(2, 1, 4, 12)).shape == (2, 10) and rope.token_positions().shape == (1 + 12, 2)
    assert all(torch.equal(v, rope.state_dict()[k]) for k, v in state.items())
    vit = _vit()
    with pytest.raises(ValueError, match="must divide input_size"):
        vit.set_input_size((9, 8))
    with pytest.raises(ValueError, match=r"input_size of 2 dimension\(s\) like \(8, 8\), got \(8,\)"):
        vit.set_input_size((8,))
    assert vit.config.input_size == (8, 8) and vit.pos_embed.shape == (1, 17, 8)  # a refusal changed nothing


def test_set_input_size_keeps_a_teachers_buffer_a_buffer():
    """A DINO teacher holds its weights as buffers: its resampled position embedding stays one (not a new
    trainable parameter of the teacher)."""
    from diffusionformer.models.dino import DINO, DINOConfig

    torch.manual_seed(0)
    dino = DINO(DINOConfig(input_size=(8, 8), patch_size=2, dim=16, depth=1, num_heads=2))
    teacher = dino.teacher.backbone
    teacher.set_input_size((12, 12))
    assert "pos_embed" in dict(teacher.named_buffers()) and not list(teacher.parameters())
    assert teacher.pos_embed.shape == (1, 1 + 6 * 6, 16)
