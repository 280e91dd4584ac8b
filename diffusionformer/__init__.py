"""diffusionformer: transformer attention heads as diffusion operators on token graphs.

Every head applies a polynomial (or power series) in its row-stochastic attention matrix
``P``: attention ``P``, the Laplacian head ``I - P`` (Zhang & Papyan, arXiv 2602.09297), heat
kernels ``exp(-t (I - P))``, personalised PageRank and learned polynomials, on dense token
sequences or sparse graphs.
"""

from importlib.metadata import PackageNotFoundError, version as _version

from diffusionformer import functional
from diffusionformer.nn import AttentionIntermediates, DiffusionAttention
from diffusionformer.operators import (
    DiffusionOperator,
    build_operator,
    list_operators,
    register_operator,
)

try:
    __version__ = _version("diffusionformer")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"

__all__ = [
    "AttentionIntermediates",
    "DiffusionAttention",
    "DiffusionOperator",
    "__version__",
    "build_operator",
    "functional",
    "list_operators",
    "register_operator",
]
