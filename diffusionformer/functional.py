"""Functional interface: the kernels behind :class:`~diffusionformer.DiffusionAttention`.

``diffusionformer.functional`` is to :class:`~diffusionformer.DiffusionAttention` what
:func:`torch.nn.functional.scaled_dot_product_attention` is to :class:`torch.nn.MultiheadAttention`.
"""

from diffusionformer.ops import *  # noqa: F401,F403
from diffusionformer.ops import __all__  # noqa: F401
