r"""Seeded image augmentation in plain torch: random resized crops, jitter, blur, noise.

The views of self-supervised training (DINO, Caron et al., ICCV 2021; SimCLR's augmentation
pipeline, Chen et al., ICML 2020) without torchvision. Randomness and pixels are split:
:meth:`MultiCropAugment.sample` draws every random number of a batch from a
``torch.Generator`` (on the CPU, in a fixed order) into small parameter tensors, and
:meth:`MultiCropAugment.apply` turns images and parameters into views on the images' device.
So a training batch can carry its augmentation as data (bit-identical after a resume) and the
pixel work runs on the accelerator.

A view of image ``x`` is

.. math::
    v = \mathrm{noise}\big(\mathrm{blur}_\sigma\big(g\,(c - \bar c) + \bar c + \delta\big)\big),
    \qquad c = \mathrm{crop}_\theta(x),

where ``crop`` resamples the box ``theta`` back to the full image size (bilinear), ``g`` is a
contrast gain, ``delta`` an intensity shift (in the data's units: standard deviations for
normalised images) and ``\bar c`` the view's mean. All views keep the input's size ``(H, W)``,
so a ViT with a fixed patch grid can take them; small "local" crops are therefore upsampled.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from diffusionformer.config import _check_flag

from .splits import _require_generator

__all__ = ["MultiCropAugment", "crop_boxes", "gaussian_blur", "random_crop_flip", "resample_crops"]

_DRAWS = 8  # uniforms per view: area, log-ratio, centre x, centre y, flip, shift, gain, blur
#: the most crops of each kind per image: every view is a full input the model runs on (DINO takes 2 global and up
#: to 10 local), and a count past int64 failed only at the first draw, in torch's C++ overflow with its backtrace
_MAX_CROPS = 1024


def _check_range(name: str, value: tuple[float, float], low: float, high: float) -> None:
    ok = (isinstance(value, tuple) and len(value) == 2
          and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value))
    if not ok or not (low <= value[0] <= value[1] <= high):
        raise ValueError(f"{name} must be a pair (a, b) with {low} <= a <= b <= {high}, got {value!r}")
    if not math.isfinite(value[1]):  # an infinite ratio gives NaN crops, an infinite blur no kernel
        raise ValueError(f"{name} must be a pair of finite numbers (a, b) with {low} <= a <= b, got {value!r}")


def _float_pair(value: object) -> object:
    """A pair of real numbers (numpy ones too) as a tuple of Python floats; anything else as given,
    for :func:`_check_range` to name."""
    try:
        items = tuple(value)  # type: ignore[arg-type]
    except TypeError:
        return value
    if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in items):
        return tuple(float(v) for v in items)
    return items


def _require_tensor(images: object, owner: str) -> None:
    """Refuse images that are not a tensor (a numpy array) before ``.dim()`` fails with an AttributeError."""
    if not isinstance(images, Tensor):
        raise TypeError(f"{owner} expects images as a tensor (B, C, H, W), got {type(images).__name__} "
                        f"(convert with torch.as_tensor)")


def _check_images(images: Tensor, owner: str) -> None:
    """Refuse non-float images before ``affine_grid``/``conv2d`` blame ``theta`` or the kernel."""
    if not images.is_floating_point():
        raise TypeError(f"{owner} expects floating-point images, got {images.dtype} (convert them with "
                        f".float() first)")


def crop_boxes(u: Tensor, scale: tuple[float, float], ratio: tuple[float, float]) -> Tensor:
    r"""Affine matrices of random resized crops from uniforms ``u`` (torchvision's area and log-ratio law, one draw).

    A crop covers a fraction ``s ~ U(scale)`` of the image area with aspect ratio
    ``r = w / h``, ``log r ~ U(log ratio)``: side fractions ``w = sqrt(s r)``,
    ``h = sqrt(s / r)`` (clipped to 1, where torchvision draws again up to 10 times and then
    falls back to a central crop: a fixed number of uniforms per view keeps resumes exact), centre
    uniform among the boxes that fit. In the
    normalised coordinates of :func:`torch.nn.functional.affine_grid` (the image spans
    ``[-1, 1]``) the output pixel ``p`` reads the input at ``diag(±w, h) p + (c_x, c_y)``; the sign
    is a horizontal flip.

    Args:
        u: uniforms in ``[0, 1]``: area, log-ratio, centre x, centre y and (optional) flip
            sign (``u[:, 4] < 0.5``: flip; pass 1 to never flip).
        scale: range of the area fraction, within ``(0, 1]``.
        ratio: range of the aspect ratio ``w / h`` of the side fractions: on an ``H x W`` image the crop's
            aspect ratio in pixels is ``r W / H`` (torchvision's ``ratio`` is in pixels; the two agree on square
            images), so a view resampled to ``H x W`` is stretched by ``1 / r`` whatever the image's shape.

    Shapes:
        ``u``: ``(N, 5)`` -> ``(N, 2, 3)``.

    Examples:
        >>> u = torch.tensor([[1.0, 0.5, 0.5, 0.5, 1.0], [0.0, 0.5, 0.0, 1.0, 0.0]])
        >>> crop_boxes(u, scale=(0.25, 1.0), ratio=(1.0, 1.0))
        tensor([[[ 1.0000,  0.0000,  0.0000],
                 [ 0.0000,  1.0000,  0.0000]],
        <BLANKLINE>
                [[-0.5000,  0.0000, -0.5000],
                 [ 0.0000,  0.5000,  0.5000]]])
    """
    if not isinstance(u, Tensor) or not u.is_floating_point():  # bool uniforms lost every flip (True < 0.5 is False)
        raise TypeError(f"crop_boxes expects uniforms u as a floating-point tensor (N, 5), got "
                        f"{u.dtype if isinstance(u, Tensor) else type(u).__name__}")
    if u.dim() != 2 or u.shape[1] != 5:
        raise ValueError(f"crop_boxes expects uniforms of shape (N, 5), got {tuple(u.shape)}")
    if u.device.type == "cpu" and not torch.compiler.is_compiling():  # on CPU, where it costs no sync
        bad = ~((u >= 0) & (u <= 1))  # NaN too
        if bool(bad.any()):  # a uniform outside [0, 1] put the box (partly) outside the image
            raise ValueError(f"crop_boxes expects uniforms u in [0, 1], got {u[bad][:4].tolist()} "
                             f"(row {int(bad.nonzero()[0, 0])} first)")
    _check_range("scale", tuple(scale), 1e-6, 1.0)
    _check_range("ratio", tuple(ratio), 1e-6, math.inf)
    area = scale[0] + (scale[1] - scale[0]) * u[:, 0]
    log_r = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * u[:, 1]
    r = torch.exp(log_r)
    w = torch.sqrt(area * r).clamp(max=1.0)
    h = torch.sqrt(area / r).clamp(max=1.0)
    cx = (1.0 - w) * (2.0 * u[:, 2] - 1.0)
    cy = (1.0 - h) * (2.0 * u[:, 3] - 1.0)
    sign = torch.where(u[:, 4] < 0.5, -1.0, 1.0).to(u.dtype)
    zero = torch.zeros_like(w)
    return torch.stack([torch.stack([sign * w, zero, cx], -1), torch.stack([zero, h, cy], -1)], dim=1)


def resample_crops(images: Tensor, theta: Tensor) -> Tensor:
    r"""Crop each image to its box ``theta`` and resample it to the full size (bilinear).

    Args:
        images: ``(N, C, H, W)``.
        theta: affine matrices from :func:`crop_boxes` (any device: moved to the images').

    Shapes:
        ``(N, C, H, W), (N, 2, 3) -> (N, C, H, W)``.

    Examples:
        >>> x = torch.arange(16.0).view(1, 1, 4, 4)
        >>> identity = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
        >>> torch.allclose(resample_crops(x, identity), x, atol=1e-5)
        True
        >>> flip = torch.tensor([[[-1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
        >>> torch.allclose(resample_crops(x, flip), x.flip(-1), atol=1e-5)
        True
    """
    _require_tensor(images, "resample_crops")
    if not isinstance(theta, Tensor):
        raise TypeError(f"resample_crops expects theta as a tensor (N, 2, 3), got {type(theta).__name__}")
    if images.dim() != 4 or theta.shape != (images.shape[0], 2, 3):
        raise ValueError(f"resample_crops expects images (N, C, H, W) and theta (N, 2, 3), got "
                         f"{tuple(images.shape)} and {tuple(theta.shape)}")
    _check_images(images, "resample_crops")
    if theta.device.type == "cpu" and not torch.compiler.is_compiling():  # on CPU, where it costs no sync
        bad = ~torch.isfinite(theta).flatten(1).all(dim=1)
        if bool(bad.any()):  # grid_sample read a NaN box as a plausible image (border pixels), no NaN
            raise ValueError(f"resample_crops: theta must be finite, got a non-finite box for image "
                             f"{int(bad.nonzero()[0, 0])} of {theta.shape[0]}")
    if images.numel() == 0:  # affine_grid refuses a size with a zero
        return images.clone()
    # the sampling grid in float32 at least: in bfloat16/float16 neighbouring pixel centres of a 64-pixel side
    # rounded to one coordinate (views off by up to a whole pixel value, NaN at some sizes)
    gdt = torch.promote_types(images.dtype, torch.float32)
    grid = F.affine_grid(theta.to(device=images.device, dtype=gdt), list(images.shape), align_corners=False)
    out = F.grid_sample(images.to(gdt), grid, mode="bilinear", padding_mode="border", align_corners=False)
    return out.to(images.dtype)


def gaussian_blur(images: Tensor, sigma: Tensor, kernel_size: int) -> Tensor:
    r"""Separable Gaussian blur with one width per image: ``k(d) \propto exp(-d^2 / 2 sigma^2)``.

    ``sigma = 0`` leaves an image unchanged (the kernel is a delta). Borders are replicated.

    Args:
        images: ``(N, C, H, W)``.
        sigma: per-image standard deviation in pixels, ``>= 0``.
        kernel_size: odd kernel side ``k``.

    Shapes:
        ``(N, C, H, W), (N,) -> (N, C, H, W)``.

    Examples:
        >>> x = torch.zeros(2, 1, 5, 5); x[:, :, 2, 2] = 1.0
        >>> y = gaussian_blur(x, torch.tensor([0.0, 1.0]), kernel_size=3)
        >>> torch.equal(y[0], x[0]), round(float(y[1].sum()), 6), round(float(y[1, 0, 2, 2]), 4)
        (True, 1.0, 0.2042)
    """
    if not isinstance(images, Tensor) or not isinstance(sigma, Tensor):
        raise TypeError(f"gaussian_blur expects tensors images (N, C, H, W) and sigma (N,), got "
                        f"{type(images).__name__} and {type(sigma).__name__}")
    if images.dim() != 4 or sigma.shape != (images.shape[0],):
        raise ValueError(f"gaussian_blur expects images (N, C, H, W) and sigma (N,), got "
                         f"{tuple(images.shape)} and {tuple(sigma.shape)}")
    if isinstance(kernel_size, bool) or not isinstance(kernel_size, numbers.Integral) or kernel_size < 1 \
            or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be a positive odd int, got {kernel_size!r}")
    kernel_size = int(kernel_size)
    _check_images(images, "gaussian_blur")
    if not sigma.is_floating_point() and sigma.dtype != torch.int64 and sigma.dtype != torch.int32:
        raise TypeError(f"gaussian_blur: sigma must be a real tensor of widths in pixels, got {sigma.dtype}")
    if sigma.device.type == "cpu" and not torch.compiler.is_compiling():  # on CPU, where it costs no sync
        bad = ~((sigma >= 0) & torch.isfinite(sigma))
        if bool(bad.any()):  # a negative width was clamped to no blur, a NaN one gave NaN images
            raise ValueError(f"gaussian_blur: sigma must be finite and >= 0, got {sigma[bad][:4].tolist()} "
                             f"(image {int(bad.nonzero()[0])} first)")
    if images.numel() == 0:  # conv2d refuses an empty batch of N * C = 0 channels
        return images.clone()
    N, C, H, W = images.shape
    half = kernel_size // 2
    kdt = torch.promote_types(images.dtype, torch.float32)  # in float16 the clamped s**2 = 1e-12 is 0: a NaN kernel
    d = torch.arange(-half, half + 1, device=images.device, dtype=kdt)
    s = sigma.to(device=images.device, dtype=kdt).clamp(min=1e-6).unsqueeze(1)  # (N, 1)
    k = torch.exp(-(d**2) / (2 * s**2))
    k = (k / k.sum(dim=1, keepdim=True)).to(images.dtype).repeat_interleave(C, dim=0)  # (N C, k)
    x = F.pad(images.reshape(1, N * C, H, W), (half, half, half, half), mode="replicate")
    x = F.conv2d(x, k.view(N * C, 1, kernel_size, 1), groups=N * C)  # along H
    x = F.conv2d(x, k.view(N * C, 1, 1, kernel_size), groups=N * C)  # along W
    return x.view(N, C, H, W)


@dataclass(frozen=True)
class MultiCropAugment:
    r"""DINO's multi-crop views (2 global + ``local_crops`` local), all at the input size.

    Every view is a random resized crop (:func:`crop_boxes`: area fraction ``global_scale``
    or ``local_scale``, aspect ratio ``ratio``, horizontal flip with ``flip_prob``), then a
    contrast gain ``g ~ U(1 - contrast, 1 + contrast)`` about the view's mean and a shift
    ``delta ~ U(-brightness, brightness)``, then with ``blur_prob`` a Gaussian blur with
    ``sigma ~ U(blur_sigma)`` pixels, then Gaussian noise of std ``noise_std``. Views
    ``0, 1`` are the global crops (the teacher's inputs), views ``2 ..`` the local ones.

    Args:
        global_crops: number of global crops (``1 .. 1024``; DINO uses 2).
        local_crops: number of local crops (``0 .. 1024``; DINO uses up to 10).
        global_scale, local_scale: area fraction ranges.
        ratio: aspect-ratio range, of the side fractions (:func:`crop_boxes`; in pixels on square images only).
        flip_prob: probability of a horizontal flip (0 for digits).
        brightness: half-width of the intensity shift.
        contrast: half-width of the contrast gain around 1 (``< 1``).
        blur_prob: probability of a blur.
        blur_sigma: range of the blur's standard deviation, in pixels.
        noise_std: std of additive Gaussian noise (0: none).

    Shapes:
        :meth:`sample` ``-> {"theta": (B, V, 2, 3), "gain": (B, V), "shift": (B, V),
        "sigma": (B, V)[, "noise": (B, V, C, H, W)]}``; :meth:`apply`
        ``(B, C, H, W) -> (V, B, C, H, W)``.

    Examples:
        >>> aug = MultiCropAugment(local_crops=1, blur_prob=0.5)
        >>> x = torch.randn(3, 1, 8, 8)
        >>> views = aug(x, torch.Generator().manual_seed(0))
        >>> views.shape
        torch.Size([3, 3, 1, 8, 8])
        >>> torch.equal(views, aug(x, torch.Generator().manual_seed(0)))
        True
    """

    global_crops: int = 2
    local_crops: int = 0
    global_scale: tuple[float, float] = (0.4, 1.0)
    local_scale: tuple[float, float] = (0.1, 0.4)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_prob: float = 0.0
    brightness: float = 0.4
    contrast: float = 0.4
    blur_prob: float = 0.5
    blur_sigma: tuple[float, float] = (0.1, 1.0)
    noise_std: float = 0.0

    def __post_init__(self) -> None:
        for name in ("global_crops", "local_crops"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < (1 if name == "global_crops" else 0):
                raise ValueError(f"MultiCropAugment.{name} must be an int >= {1 if name == 'global_crops' else 0}, got {v!r}")
            if v > _MAX_CROPS:
                raise ValueError(f"MultiCropAugment.{name} must be at most {_MAX_CROPS} (crops per image, each a view "
                                 f"at the input size), got {v!r}")
            object.__setattr__(self, name, int(v))
        for name in ("global_scale", "local_scale", "ratio", "blur_sigma"):
            object.__setattr__(self, name, _float_pair(getattr(self, name)))
        _check_range("MultiCropAugment.global_scale", self.global_scale, 1e-6, 1.0)
        _check_range("MultiCropAugment.local_scale", self.local_scale, 1e-6, 1.0)
        _check_range("MultiCropAugment.ratio", self.ratio, 1e-6, math.inf)
        _check_range("MultiCropAugment.blur_sigma", self.blur_sigma, 0.0, math.inf)
        for name, high in (("flip_prob", 1.0), ("blur_prob", 1.0), ("contrast", 1.0 - 1e-12),
                           ("brightness", math.inf), ("noise_std", math.inf)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0.0 <= v <= high:
                raise ValueError(f"MultiCropAugment.{name} must lie in [0, {high:g}], got {v!r}")
            if not math.isfinite(v):  # an infinite brightness or noise_std made every view inf or NaN
                raise ValueError(f"MultiCropAugment.{name} must be finite, got {v!r}")
            object.__setattr__(self, name, float(v))  # a numpy number as the Python float it equals

    @property
    def num_views(self) -> int:
        """``V = global_crops + local_crops``."""
        return self.global_crops + self.local_crops

    def kernel_size(self, height: int, width: int) -> int:
        """Odd blur kernel side: ``2 ceil(3 sigma_max) + 1``, at most the image's smaller side."""
        k = 2 * math.ceil(3 * self.blur_sigma[1]) + 1
        side = min(height, width)
        return max(1, min(k, side if side % 2 else side - 1))

    def sample(self, batch_size: int, image_shape: tuple[int, int, int], generator: torch.Generator) -> dict[str, Tensor]:
        """Draw the augmentation parameters of ``batch_size`` images from ``generator`` (CPU).

        Args:
            batch_size: ``B``.
            image_shape: ``(C, H, W)`` (for the noise).
            generator: a CPU ``torch.Generator``; draws happen in a fixed order.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        batch_size = int(batch_size)  # a numpy int (a count takes any integral number) as the Python int it equals
        if len(image_shape) != 3:
            raise ValueError(f"image_shape must be (C, H, W), got {image_shape!r}")
        _require_generator(generator, "MultiCropAugment.sample")
        B, V, G = batch_size, self.num_views, self.global_crops
        u = torch.rand(B, V, _DRAWS, generator=generator)
        flip = torch.where(u[..., 4] < self.flip_prob, 0.0, 1.0)  # crop_boxes flips where < 0.5
        crop_u = torch.cat([u[..., :4], flip.unsqueeze(-1)], dim=-1)
        theta = torch.cat([
            crop_boxes(crop_u[:, :G].reshape(-1, 5), self.global_scale, self.ratio).view(B, G, 2, 3),
            crop_boxes(crop_u[:, G:].reshape(-1, 5), self.local_scale, self.ratio).view(B, V - G, 2, 3),
        ], dim=1)
        shift = self.brightness * (2.0 * u[..., 5] - 1.0)
        gain = 1.0 + self.contrast * (2.0 * u[..., 6] - 1.0)
        lo, hi = self.blur_sigma
        # the blur's coin is u[..., 7] < blur_prob; its width reuses the same uniform, rescaled
        coin = u[..., 7] < self.blur_prob
        sigma = torch.where(coin, lo + (hi - lo) * u[..., 7] / max(self.blur_prob, 1e-12), 0.0)
        params = {"theta": theta, "gain": gain, "shift": shift, "sigma": sigma}
        if self.noise_std > 0:
            params["noise"] = self.noise_std * torch.randn(B, V, *image_shape, generator=generator)
        return params

    def apply(self, images: Tensor, params: dict[str, Tensor]) -> Tensor:
        """The views of ``images`` for parameters from :meth:`sample` (on the images' device)."""
        _require_tensor(images, "MultiCropAugment.apply")
        if images.dim() != 4:
            raise ValueError(f"MultiCropAugment.apply expects images (B, C, H, W), got {tuple(images.shape)}")
        if not images.is_floating_point():
            raise TypeError(f"MultiCropAugment.apply expects floating-point images (crops are resampled "
                            f"bilinearly), got {images.dtype}")
        B, C, H, W = images.shape
        V = self.num_views
        theta = params.get("theta")
        if isinstance(theta, Tensor) and theta.shape != (B, V, 2, 3):
            raise ValueError(f"augmentation parameters are for theta {tuple(theta.shape)}, expected ({B}, {V}, 2, 3)")
        shapes = {"theta": (B, V, 2, 3), "gain": (B, V), "shift": (B, V)}  # a missing theta was a bare KeyError
        if self.blur_prob > 0:
            shapes["sigma"] = (B, V)
        if "noise" in params:  # parameters carried without noise apply none
            shapes["noise"] = (B, V, C, H, W)
        for key, shape in shapes.items():  # parameters drawn for another batch or image size
            got = params.get(key)
            if not isinstance(got, Tensor) or tuple(got.shape) != shape:
                got = "missing" if got is None else tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__
                raise ValueError(f"augmentation parameter {key!r} must have shape {shape} for images "
                                 f"{tuple(images.shape)}, got {got} (draw it with sample(B, (C, H, W), generator))")
        dev, dt = images.device, images.dtype
        x = images.unsqueeze(1).expand(B, V, C, H, W).reshape(B * V, C, H, W)
        x = resample_crops(x, theta.reshape(B * V, 2, 3))
        gain = params["gain"].to(device=dev, dtype=dt).reshape(B * V, 1, 1, 1)
        shift = params["shift"].to(device=dev, dtype=dt).reshape(B * V, 1, 1, 1)
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        x = gain * (x - mean) + mean + shift
        if self.blur_prob > 0:
            x = gaussian_blur(x, params["sigma"].reshape(B * V), self.kernel_size(H, W))
        if "noise" in params:
            x = x + params["noise"].to(device=dev, dtype=dt).reshape(B * V, C, H, W)
        return x.view(B, V, C, H, W).transpose(0, 1)

    def __call__(self, images: Tensor, generator: torch.Generator) -> Tensor:
        """``apply(images, sample(B, (C, H, W), generator))``; an empty batch gives empty views ``(V, 0, C, H, W)``
        and draws nothing from ``generator``."""
        # checked here: a list failed on ``.shape`` (AttributeError), and (C, H, W) images met sample's
        # "image_shape must be (C, H, W)", about an argument the caller never passed
        _require_tensor(images, "MultiCropAugment")
        if images.dim() != 4:
            raise ValueError(f"MultiCropAugment expects images (B, C, H, W), got {tuple(images.shape)} (a single "
                             f"image: images.unsqueeze(0))")
        if images.shape[0] == 0:
            # sample() draws for B >= 1 ("batch_size must be a positive int, got 0", an argument the caller never
            # passed): the empty views take the parameters' shapes from a throwaway draw, none from ``generator``
            _require_generator(generator, "MultiCropAugment")
            # None (torch's global generator, as sample takes it) had no .device: nor is the global one drawn from
            throwaway = torch.Generator() if generator is None else torch.Generator(generator.device)
            params = self.sample(1, tuple(images.shape[1:]), throwaway)
            return self.apply(images, {key: value[:0] for key, value in params.items()})
        return self.apply(images, self.sample(images.shape[0], tuple(images.shape[1:]), generator))


def random_crop_flip(images: Tensor, generator: torch.Generator, *, padding: int = 4, flip: bool = True) -> Tensor:
    r"""The supervised CIFAR augmentation: pad, take a random crop of the original size, flip.

    .. math::
        v_b = \mathrm{flip}^{f_b}\big(\mathrm{pad}_p(x_b)[\,i_b : i_b + H,\; j_b : j_b + W\,]\big),
        \qquad i_b, j_b \sim \mathcal U\{0, \dots, 2p\},\; f_b \sim \mathrm{Bernoulli}(1/2)

    with zero padding (the mean colour for standardised images) and a horizontal flip
    (He et al., "Deep Residual Learning", CVPR 2016, section 4.2; the ViT-CIFAR recipes). The
    offsets ``(i_b, j_b)`` and then the flips are drawn from ``generator`` in that order.

    Args:
        images: ``(B, C, H, W)``.
        generator: CPU generator of the offsets and flips.
        padding: ``p >= 0`` pixels on every side (``0``: no crop).
        flip: flip each image left-right with probability 1/2.

    Shapes:
        ``(B, C, H, W) -> (B, C, H, W)``.

    Examples:
        >>> x = torch.arange(16.0).view(1, 1, 4, 4)
        >>> torch.equal(random_crop_flip(x, torch.Generator().manual_seed(0), padding=0, flip=False), x)
        True
    """
    _require_tensor(images, "random_crop_flip")
    if images.dim() != 4:
        raise ValueError(f"random_crop_flip: expected images of shape (B, C, H, W), got {tuple(images.shape)}")
    if isinstance(padding, bool) or not isinstance(padding, numbers.Integral) or padding < 0:
        raise ValueError(f"random_crop_flip: padding must be an int >= 0, got {padding!r}")
    padding = int(padding)
    _check_flag(flip, "random_crop_flip: flip")
    _require_generator(generator, "random_crop_flip")
    B, C, H, W = images.shape
    offsets = torch.randint(0, 2 * padding + 1, (B, 2), generator=generator)
    flips = torch.rand(B, generator=generator) < 0.5 if flip else torch.zeros(B, dtype=torch.bool)
    out = images
    if padding > 0:
        padded = F.pad(images, (padding, padding, padding, padding))
        rows = (offsets[:, 0, None] + torch.arange(H)).to(images.device)  # (B, H)
        cols = (offsets[:, 1, None] + torch.arange(W)).to(images.device)  # (B, W)
        b = torch.arange(B, device=images.device)[:, None, None]
        out = padded.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)  # (B, C, H, W)
    if flip:
        out = torch.where(flips.to(images.device)[:, None, None, None], out.flip(-1), out)
    return out.contiguous()
