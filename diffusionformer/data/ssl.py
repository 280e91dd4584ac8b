r"""Settings of the self-supervised (DINO) task: the views it trains on and its k-NN evaluation.

They belong to the task, not to the model: :class:`~diffusionformer.models.DINOConfig` holds the
networks, the loss and the teacher's schedule; :class:`SSLConfig` holds how training images
become views (:class:`~diffusionformer.data.augment.MultiCropAugment`, 2 global crops +
``local_crops`` local ones) and how frozen features are scored: the k-NN classifier
(Wu et al., CVPR 2018; DINO's protocol) of a query ``q`` over the training bank ``{(b_i, y_i)}``

.. math::
    \hat y(q) = \arg\max_c \sum_{i \in \mathrm{top}_k(q)} [y_i = c]\, \exp(\cos(q, b_i) / T),

with ``k = knn_k`` and ``T = knn_temperature``.

In an experiment config they are the task's ``ssl`` table (``[tasks.ssl]``); a model preset may
carry its own defaults (``dino-digits`` blurs less: ``blur_sigma = (0.1, 0.6)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from diffusionformer.config import _python_numbers, document_fields
from diffusionformer.data.augment import MultiCropAugment

__all__ = ["SSLConfig", "SSL_KEYS"]

#: the MultiCropAugment options that SSLConfig names otherwise
_FIELD_OF_OPTION = {"global_scale": "global_crop_scale", "local_scale": "local_crop_scale", "ratio": "crop_ratio"}


@document_fields
@dataclass
class SSLConfig:
    """Views and k-NN evaluation of the self-supervised task (see the module docstring).

    Examples:
        >>> cfg = SSLConfig(local_crops=2, blur_sigma=(0.1, 0.6))
        >>> aug = cfg.augmentation()
        >>> aug.global_crops + aug.local_crops, aug.blur_sigma
        (4, (0.1, 0.6))
        >>> SSLConfig(knn_k=0)
        Traceback (most recent call last):
        ...
        ValueError: SSLConfig.knn_k must be an int >= 1, got 0
    """

    local_crops: int = 0  #: local crops besides the 2 global ones (0: two-crop training; at most 1024)
    global_crop_scale: tuple[float, float] = (0.4, 1.0)  #: area fraction of global crops
    local_crop_scale: tuple[float, float] = (0.1, 0.4)  #: area fraction of local crops
    crop_ratio: tuple[float, float] = (0.75, 1.3333333333333333)  #: aspect-ratio range of crops
    flip_prob: float = 0.0  #: horizontal flips (0 for digits)
    brightness: float = 0.4  #: intensity shift half-width (data units)
    contrast: float = 0.4  #: contrast gain half-width around 1
    blur_prob: float = 0.5  #: probability of a Gaussian blur
    blur_sigma: tuple[float, float] = (0.1, 1.0)  #: blur std range, pixels
    noise_std: float = 0.0  #: additive Gaussian noise
    knn_k: int = 20  #: neighbours of the k-NN evaluation
    knn_temperature: float = 0.07  #: temperature of the k-NN votes

    def __post_init__(self) -> None:
        _python_numbers(self)  # a sweep grid's numpy numbers are read as the Python numbers they equal
        if isinstance(self.knn_k, bool) or not isinstance(self.knn_k, int) or self.knn_k < 1:
            raise ValueError(f"SSLConfig.knn_k must be an int >= 1, got {self.knn_k!r}")
        t = self.knn_temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < math.inf:
            raise ValueError(f"SSLConfig.knn_temperature must be positive and finite, got {t!r}")
        v = self.local_crops
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"SSLConfig.local_crops must be an int >= 0, got {v!r}")
        aug = self.augmentation()  # validates the view settings, naming the field
        # the pairs as the tuples of floats they stand for: a list (or numpy array) was kept as given, so an SSLConfig
        # with [0.4, 1.0] differed from the default (0.4, 1.0), and an array made == raise
        for field, option in (("global_crop_scale", "global_scale"), ("local_crop_scale", "local_scale"),
                              ("crop_ratio", "ratio"), ("blur_sigma", "blur_sigma")):
            setattr(self, field, getattr(aug, option))

    def augmentation(self) -> MultiCropAugment:
        """The :class:`~diffusionformer.data.augment.MultiCropAugment` of the views."""
        try:
            return MultiCropAugment(
                global_crops=2, local_crops=self.local_crops, global_scale=self.global_crop_scale,
                local_scale=self.local_crop_scale, ratio=self.crop_ratio, flip_prob=self.flip_prob,
                brightness=self.brightness, contrast=self.contrast, blur_prob=self.blur_prob,
                blur_sigma=self.blur_sigma, noise_std=self.noise_std)
        except ValueError as exc:
            message = str(exc)
            for option, field in _FIELD_OF_OPTION.items():  # "MultiCropAugment.ratio" named no key of an ssl table
                if message.startswith(f"MultiCropAugment.{option} "):
                    message = f"{field} (MultiCropAugment.{option}){message[len('MultiCropAugment.' + option):]}"
            raise ValueError(f"SSLConfig: {message}") from None


#: the field names of :class:`SSLConfig` (settings that were ``DINOConfig`` fields before)
SSL_KEYS: tuple[str, ...] = tuple(f.name for f in fields(SSLConfig))
