"""Edge probes of the image data and augmentations: every augmentation against an explicit float64 formula,
CIFAR-10 JPEG decoding and MNIST IDX parsing against independent readers (the staged root where present),
hostile image zips and IDX files, and the registry's refusals (the ``test_bug_*`` tests pin bugs fixed here)."""

from __future__ import annotations

import gzip
import io
import math
import stat
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from diffusionformer.data import CorruptDataError, load_dataset
from diffusionformer.data.augment import MultiCropAugment, crop_boxes, gaussian_blur, random_crop_flip
from diffusionformer.data.cifar10 import CIFAR10_CLASSES, _zip_members, read_image_zip
from diffusionformer.data.idx import IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC, parse_idx, read_idx
from diffusionformer.data.images import build_image_data

PIL_Image = pytest.importorskip("PIL.Image")


# ------------------------------------------------------------------ float64 references of the augmentations


def _bilinear_ref(img: np.ndarray, th: np.ndarray) -> np.ndarray:
    """grid_sample(bilinear, border, align_corners=False) of affine_grid(th), written out pixel by pixel."""
    C, H, W = img.shape
    out = np.zeros_like(img)
    for i in range(H):
        for j in range(W):
            gx, gy = (2 * j + 1) / W - 1, (2 * i + 1) / H - 1
            x = th[0, 0] * gx + th[0, 1] * gy + th[0, 2]
            y = th[1, 0] * gx + th[1, 1] * gy + th[1, 2]
            ix = min(max(((x + 1) * W - 1) / 2, 0.0), W - 1.0)
            iy = min(max(((y + 1) * H - 1) / 2, 0.0), H - 1.0)
            x0, y0 = math.floor(ix), math.floor(iy)
            x1, y1 = min(x0 + 1, W - 1), min(y0 + 1, H - 1)
            wx, wy = ix - x0, iy - y0
            out[:, i, j] = (img[:, y0, x0] * (1 - wx) * (1 - wy) + img[:, y0, x1] * wx * (1 - wy)
                            + img[:, y1, x0] * (1 - wx) * wy + img[:, y1, x1] * wx * wy)
    return out


def _blur_ref(img: np.ndarray, sigma: float, k: int) -> np.ndarray:
    """Separable normalised Gaussian of side k, edge-replicated borders; sigma = 0 is the identity."""
    if sigma == 0:
        return img.copy()
    C, H, W = img.shape
    h = k // 2
    d = np.arange(-h, h + 1, dtype=np.float64)
    ker = np.exp(-d**2 / (2 * sigma * sigma))
    ker /= ker.sum()
    p = np.pad(img, ((0, 0), (h, h), (h, h)), mode="edge")
    rows = sum(ker[a] * p[:, a:a + H, :] for a in range(k))
    return sum(ker[a] * rows[:, :, a:a + W] for a in range(k))


def test_random_crop_flip_matches_pad_slice_flip_for_the_same_draws():
    """v_b = flip^f_b(pad_p(x_b)[i:i+H, j:j+W]) with (i, j) then f drawn from the generator in that order;
    dtype kept (float64 and uint8), same seed same views, another seed other views."""
    x = torch.randn(6, 3, 5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out = random_crop_flip(x, torch.Generator().manual_seed(3), padding=2)
    g = torch.Generator().manual_seed(3)
    off = torch.randint(0, 5, (6, 2), generator=g)
    flips = torch.rand(6, generator=g) < 0.5
    for b in range(6):
        crop = np.pad(x[b].numpy(), ((0, 0), (2, 2), (2, 2)))[:, off[b, 0]:off[b, 0] + 5, off[b, 1]:off[b, 1] + 7]
        assert np.array_equal(out[b].numpy(), crop[:, :, ::-1] if flips[b] else crop)
    assert out.dtype == torch.float64 and flips.any() and not flips.all()
    u8 = torch.randint(0, 256, (4, 3, 6, 6), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    a = random_crop_flip(u8, torch.Generator().manual_seed(7), padding=3)
    assert a.dtype == torch.uint8 and torch.equal(a, random_crop_flip(u8, torch.Generator().manual_seed(7), padding=3))
    assert not torch.equal(a, random_crop_flip(u8, torch.Generator().manual_seed(8), padding=3))


def test_crop_boxes_match_the_area_ratio_formula():
    """w = min(sqrt(s r), 1), h = min(sqrt(s / r), 1), centre (1 - w)(2u - 1), sign -1 where u4 < 0.5."""
    u = torch.rand(50, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    scale, ratio = (0.1, 0.9), (0.5, 3.0)
    theta = crop_boxes(u, scale, ratio)
    for k in range(50):
        a = scale[0] + (scale[1] - scale[0]) * float(u[k, 0])
        r = math.exp(math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * float(u[k, 1]))
        w, h = min(math.sqrt(a * r), 1.0), min(math.sqrt(a / r), 1.0)
        sign = -1.0 if u[k, 4] < 0.5 else 1.0
        want = [[sign * w, 0.0, (1 - w) * (2 * float(u[k, 2]) - 1)], [0.0, h, (1 - h) * (2 * float(u[k, 3]) - 1)]]
        assert np.allclose(theta[k].numpy(), want, rtol=0, atol=1e-14)


def test_gaussian_blur_matches_the_separable_kernel_even_wider_than_the_image():
    x = torch.randn(3, 2, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    sigma = [0.0, 0.7, 2.5]
    for k in (1, 3, 9):
        y = gaussian_blur(x, torch.tensor(sigma, dtype=torch.float64), k)
        for i, s in enumerate(sigma):
            assert np.allclose(y[i].numpy(), _blur_ref(x[i].numpy(), s, k), rtol=0, atol=1e-13)
    assert gaussian_blur(x.float(), torch.tensor([1, 0, 2]), 3).dtype == torch.float32


def test_multicrop_views_match_crop_jitter_blur_noise_in_float64_and_per_image():
    """Each view = blur(g (c - mean c) + mean c + delta) + noise, c the bilinear crop, with the drawn parameters;
    applying the parameters image by image gives the batch's views; the same seed gives the same parameters."""
    aug = MultiCropAugment(local_crops=2, flip_prob=0.5, blur_prob=0.7, noise_std=0.1, blur_sigma=(0.2, 1.3))
    B, C, H, W = 3, 2, 9, 7
    x = torch.randn(B, C, H, W, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    p = aug.sample(B, (C, H, W), torch.Generator().manual_seed(5))
    q = aug.sample(B, (C, H, W), torch.Generator().manual_seed(5))
    assert all(torch.equal(p[key], q[key]) for key in p)
    out = aug.apply(x, p)
    assert out.shape == (4, B, C, H, W) and out.dtype == torch.float64
    k = aug.kernel_size(H, W)
    for b in range(B):
        for v in range(4):
            c = _bilinear_ref(x[b].numpy(), p["theta"][b, v].double().numpy())
            m = c.mean()
            c = float(p["gain"][b, v]) * (c - m) + m + float(p["shift"][b, v])
            want = _blur_ref(c, float(p["sigma"][b, v]), k) + p["noise"][b, v].double().numpy()
            assert np.allclose(out[v, b].numpy(), want, rtol=0, atol=1e-12)
        one = aug.apply(x[b:b + 1], {key: val[b:b + 1] for key, val in p.items()})
        assert torch.allclose(one, out[:, b:b + 1], rtol=0, atol=1e-12)
    # the blur's coin and width share one uniform: sigma in [lo, hi) where it blurs, else exactly 0
    s = aug.sample(400, (1, 4, 4), torch.Generator().manual_seed(0))["sigma"]
    on = s > 0
    assert 0.6 < float(on.float().mean()) < 0.8 and float(s[on].min()) >= 0.2 and float(s[on].max()) < 1.3
    assert aug(x.float(), torch.Generator().manual_seed(0)).dtype == torch.float32


# -------------------------------------------------------------------------------------- build_image_data


def _build(images, labels, **kw):
    n = len(images)
    splits = (torch.arange(n - 4), torch.arange(n - 4, n - 2), torch.arange(n - 2, n))
    return build_image_data("t", images, labels, splits, num_classes=3, normalize=kw.pop("normalize", False),
                            meta={}, **kw)


def test_bug_build_image_data_refuses_a_label_count_other_than_the_image_count():
    """Bug: 12 labels for 10 images (or 8) were accepted: the splits index both tensors, so each image was silently
    paired with whatever label sat at its index, the extra labels dropped (or an IndexError named no argument)."""
    images = torch.zeros(10, 1, 2, 2, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"^build_image_data: labels must have one entry per image, got 12 labels "
                                         r"for 10 images$"):
        _build(images, torch.arange(12) % 3)
    with pytest.raises(ValueError, match="got 8 labels for 10 images"):
        _build(images, torch.arange(8) % 3)
    assert _build(images, torch.arange(10) % 3).y_train.tolist() == [0, 1, 2, 0, 1, 2]


def test_bug_build_image_data_refuses_a_scale_that_is_not_positive_and_finite():
    """Bug: ``scale=0`` made every pixel NaN, ``scale=-1`` inverted the images and ``scale=inf`` zeroed them, all
    without a word (with ``normalize=False``)."""
    images = torch.full((10, 1, 2, 2), 128, dtype=torch.uint8)
    labels = torch.arange(10) % 3
    for bad in (0.0, -1.0, float("nan"), float("inf"), True, "255"):
        with pytest.raises(ValueError, match=r"^build_image_data: scale must be a positive finite number, got "):
            _build(images, labels, scale=bad)
    assert torch.equal(_build(images, labels, scale=256).x_train, torch.full((6, 1, 2, 2), 0.5))


def test_normalisation_uses_the_training_split_population_statistics():
    x = torch.randint(0, 256, (30, 3, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    data = _build(x, torch.arange(30) % 3, normalize=True)
    train = (x[:26].float() / 255).double().numpy()  # the float32 pixels, their statistics in float64
    mean, std = train.mean(axis=(0, 2, 3)), train.std(axis=(0, 2, 3))
    assert np.allclose(data.mean, mean, rtol=0, atol=1e-12) and np.allclose(data.std, std, rtol=0, atol=1e-7)
    want = ((x[26:28].float() / 255).double().numpy() - mean[:, None, None]) / std[:, None, None]
    assert np.allclose(data.x_val.numpy(), want, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------- hostile image zips


def _encoded(arr: np.ndarray, mode: str = "RGB", fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    PIL_Image.fromarray(arr).convert(mode).save(buf, format=fmt)
    return buf.getvalue()


def _zip(path: Path, entries) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in entries:
            zf.writestr(name, data)
    return path


_RGB = np.random.RandomState(0).randint(0, 256, (8, 8, 3), dtype=np.uint8)


def test_other_8_bit_modes_are_converted_to_rgb_like_pillow_does(tmp_path):
    """Grey, RGBA, palette, 1-bit and CMYK entries decode to PIL's own ``convert("RGB")`` pixels."""
    for mode, fmt in (("L", "PNG"), ("RGBA", "PNG"), ("P", "PNG"), ("1", "PNG"), ("CMYK", "JPEG"), ("L", "JPEG")):
        data = _encoded(_RGB, mode, fmt)
        x, y, classes = read_image_zip(_zip(tmp_path / f"{mode}{fmt}.zip", [("train/cat/0.img.png", data)]), "train")
        want = np.asarray(PIL_Image.open(io.BytesIO(data)).convert("RGB")).transpose(2, 0, 1)
        assert x.dtype == torch.uint8 and np.array_equal(x[0].numpy(), want), (mode, fmt)


def test_bug_a_16_bit_png_is_refused_instead_of_clipped_to_255(tmp_path):
    """Bug: a 16-bit grey PNG (mode ``I;16``) went through ``convert("RGB")``, which clips at 255: pixels of
    4000..60000 all became 255 (a white image) without a word. Samples wider than 8 bits are refused now."""
    grey16 = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000)
    buf = io.BytesIO()
    PIL_Image.fromarray(grey16).save(buf, format="PNG")
    path = _zip(tmp_path / "deep.zip", [("train/cat/0.png", _encoded(_RGB)), ("train/dog/0.png", buf.getvalue())])
    with pytest.raises(CorruptDataError, match=r"cannot decode 'train/dog/0\.png' as JPEG or PNG: mode 'I;16' has "
                                               r"samples wider than 8 bits"):
        read_image_zip(path, "train")


def test_bug_entries_without_a_class_folder_name_are_refused(tmp_path):
    """Bug: ``train/../x.jpg`` and ``train//x.jpg`` were read as images of classes ``'..'`` and ``''``, which sort
    before every real class name: every label shifted by one or two and ``num_classes`` grew, silently."""
    for odd in ("train/../x.png", "train//x.png", "train/./x.png"):
        path = _zip(tmp_path / "odd.zip", [(odd, _encoded(_RGB)), ("train/cat/0.png", _encoded(_RGB))])
        with pytest.raises(CorruptDataError, match=r"entry '.*' has no class folder name"):
            read_image_zip(path, "train")
    # names outside '<split>/<class>/<file>' (a leading '../', deeper folders) are not entries of the split
    path = _zip(tmp_path / "ok.zip", [("../train/cat/0.png", _encoded(_RGB)), ("train/cat/a/0.png", _encoded(_RGB)),
                                      ("train/cat/0.png", _encoded(_RGB))])
    x, y, classes = read_image_zip(path, "train")
    assert classes == ["cat"] and x.shape == (1, 3, 8, 8)


def test_a_symlink_entry_and_a_zip_bomb_are_refused_without_inflating(tmp_path):
    path = tmp_path / "link.zip"
    with zipfile.ZipFile(path, "w") as zf:
        info = zipfile.ZipInfo("train/cat/0.png")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(CorruptDataError, match="cannot decode 'train/cat/0.png'"):
        read_image_zip(path, "train")
    # a deflated entry whose headers declare 600 MiB is refused from the declared size, before inflating; one
    # whose headers declare 100 B while it inflates to 1 MiB is read no further than 100 B (its CRC then fails)
    for declared, why in ((600 * 2**20, r"declares 629145600 B uncompressed, more than any image file"),
                          (100, r"cannot decode 'train/cat/0.png'")):
        bomb = _zip_declaring(tmp_path / f"bomb{declared}.zip", "train/cat/0.png", bytes(2**20), declared)
        with pytest.raises(CorruptDataError, match=why):
            read_image_zip(bomb, "train")


def _zip_declaring(path: Path, name: str, data: bytes, declared: int) -> Path:
    """A deflated one-entry zip whose local and central headers declare ``declared`` uncompressed bytes."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(name, data)
    raw = bytearray(path.read_bytes())
    local, central = raw.index(b"PK\x03\x04"), raw.index(b"PK\x01\x02")
    struct.pack_into("<I", raw, local + 22, declared)
    struct.pack_into("<I", raw, central + 24, declared)
    path.write_bytes(bytes(raw))
    return path


def test_a_png_declaring_a_huge_size_in_a_few_bytes_is_refused(tmp_path):
    """60000 x 60000 declared in ~60 bytes: Pillow's decompression-bomb limit refuses it before decoding."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    for side in (60000, 14000):  # above 2x MAX_IMAGE_PIXELS (an error) and between 1x and 2x (only a warning)
        png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
               + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
        with pytest.raises(CorruptDataError, match="decompression bomb"):
            read_image_zip(_zip(tmp_path / f"b{side}.zip", [("train/cat/0.png", png)]), "train")


# ------------------------------------------------------------------------------------------- IDX files


def _idx_by_hand(raw: bytes) -> np.ndarray:
    magic, = struct.unpack(">I", raw[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    values = struct.unpack(f">{math.prod(dims)}B", raw[4 + 4 * ndim:])
    return np.array(values, dtype=np.uint8).reshape(dims)


def test_idx_parsing_matches_a_struct_reader_and_refuses_hostile_headers(tmp_path):
    arr = np.random.RandomState(1).randint(0, 256, (3, 4, 5), dtype=np.uint8)
    raw = struct.pack(">IIII", IDX_IMAGES_MAGIC, 3, 4, 5) + arr.tobytes()
    assert np.array_equal(parse_idx(raw, expected_magic=IDX_IMAGES_MAGIC).numpy(), _idx_by_hand(raw))
    f32 = struct.pack(">II", 0x0D01, 3) + struct.pack(">3f", 1.5, -2.0, 3.25)
    assert parse_idx(f32).tolist() == [1.5, -2.0, 3.25]
    with pytest.raises(CorruptDataError, match=r"IDX file truncated"):
        parse_idx(raw[:-1])
    with pytest.raises(CorruptDataError, match=r"bad IDX magic number 0x00000803, expected 0x00000801"):
        parse_idx(raw, expected_magic=IDX_LABELS_MAGIC)
    with pytest.raises(CorruptDataError, match=r"bad IDX magic number 0x01000803"):
        parse_idx(b"\x01" + raw[1:])
    huge = struct.pack(">IIII", IDX_IMAGES_MAGIC, 2**31, 2**31, 2**31) + bytes(16)  # 2**93 B declared
    (tmp_path / "huge").write_bytes(huge)
    (tmp_path / "huge.gz").write_bytes(gzip.compress(huge))
    with pytest.raises(CorruptDataError, match="IDX file truncated"):
        read_idx(tmp_path / "huge")
    with pytest.raises(CorruptDataError, match="more than deflate can expand"):
        read_idx(tmp_path / "huge.gz")
    (tmp_path / "cut.gz").write_bytes(gzip.compress(raw)[:-12])
    with pytest.raises(CorruptDataError, match="corrupt or truncated gzip file"):
        read_idx(tmp_path / "cut.gz")


def test_staged_mnist_test_files_match_a_struct_reader_and_the_normalisation_statistics(real_root):
    raw_dir = real_root / "mnist" / "MNIST" / "raw"
    for name in ("t10k-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz"):
        raw = gzip.decompress((raw_dir / name).read_bytes())
        assert np.array_equal(read_idx(raw_dir / name).numpy(), _idx_by_hand(raw))
    data = load_dataset("mnist", root=real_root, limit_train=600, limit_test=50, val_size=100)
    plain = load_dataset("mnist", root=real_root, limit_train=600, limit_test=50, val_size=100, normalize=False)
    train = plain.x_train.double().numpy()
    assert data.mean == pytest.approx((train.mean(),), abs=1e-9) and data.std == pytest.approx((train.std(),), abs=1e-7)
    assert len(data.y_train) == 500 and len(data.y_test) == 50 and torch.equal(data.y_test, plain.y_test)
    assert np.allclose(data.x_test.numpy(), (plain.x_test.double().numpy() - train.mean()) / train.std(), atol=1e-5)


# ----------------------------------------------------------------------------------------- staged CIFAR-10


def test_staged_cifar10_zips_decode_like_pillow_with_sorted_class_labels(real_root):
    folder = real_root / "cifar10_jpg"
    for split, per_class in (("train", 5000), ("test", 1000)):
        with zipfile.ZipFile(folder / f"{split}.zip") as zf:
            members = _zip_members(zf, split)
        assert len(members) == 10 * per_class and sorted({c for c, _ in members}) == CIFAR10_CLASSES
    picks = torch.tensor([0, 999, 1000, 4321, 9999])
    x, y, classes = read_image_zip(folder / "test.zip", "test", picks)
    assert classes == CIFAR10_CLASSES == sorted(CIFAR10_CLASSES) and y.tolist() == [0, 0, 1, 4, 9]
    with zipfile.ZipFile(folder / "test.zip") as zf:
        for k, i in enumerate(picks.tolist()):
            cls, name = members_test = _zip_members(zf, "test")[i]
            assert name == f"test/{cls}/{i % 1000:04d}.jpg", members_test
            with PIL_Image.open(io.BytesIO(zf.read(name))) as im:
                want = np.asarray(im.convert("RGB")).transpose(2, 0, 1)
            assert np.array_equal(x[k].numpy(), want)


# ------------------------------------------------------------------------------------------------ registry


def test_registry_names_close_matches_and_refuses_bad_options():
    with pytest.raises(ValueError, match=r"unknown dataset 'cifar' \(did you mean 'cifar10'\?\); valid names: "):
        load_dataset("cifar")
    with pytest.raises(ValueError, match=r"unknown dataset 'digitz' \(did you mean 'digits'\?\)"):
        load_dataset("digitz")
    with pytest.raises(TypeError, match=r"unknown option\(s\) 'normalise' \(did you mean 'normalize'\?\)"):
        load_dataset("digits", normalise=False)
    with pytest.raises(TypeError, match=r"option 'normalize' must be a bool"):
        load_dataset("digits", normalize="no")
    with pytest.raises(ValueError, match=r"source must be 'auto', 'pickle' or 'jpg', got 'JPG' \(did you mean 'jpg'\?\)"):
        load_dataset("cifar10", root=Path("/nonexistent"), source="JPG")
    with pytest.raises(TypeError, match="dataset name must be a str"):
        load_dataset(None)


@pytest.mark.parametrize("name", ["cifar10", "mnist"])
@pytest.mark.parametrize("option", ["limit_train", "limit_test"])
def test_bug_limit_options_are_named_and_checked_before_any_file(name, option, tmp_path):
    """Bug: a bad ``limit_train`` / ``limit_test`` was found only after the files were read (and the CIFAR zips
    hashed), and the error said "limit must be an int", a name the caller never passed (sitting 33)."""
    from diffusionformer.data import load_dataset

    with pytest.raises(TypeError, match=rf"load_{name}: {option} must be an int, got '5'"):
        load_dataset(name, root=tmp_path, **{option: "5"})  # an empty root: no file to read before the check
    with pytest.raises(ValueError, match=rf"load_{name}: {option} must be >= 1 or None, got 0"):
        load_dataset(name, root=tmp_path, **{option: 0})
