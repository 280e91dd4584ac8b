"""diffusionformer: transformer attention heads as diffusion operators on token graphs.

Every head applies a polynomial (or power series) in its row-stochastic attention matrix
``P``: attention ``P``, the Laplacian head ``I - P`` (Zhang & Papyan, arXiv 2602.09297), heat
kernels ``exp(-t (I - P))``, personalised PageRank and learned polynomials, on dense token
sequences or sparse graphs.
"""

from importlib.metadata import PackageNotFoundError, version as _version

from diffusionformer import functional
from diffusionformer._imports import _lazy_exports
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

# Imported on first use (PEP 562): ``import diffusionformer`` stays light, and the models and the
# experiment runner (data sets, plots) load only when one of their names is asked for.
_LAZY = {
    "DiffusionGPT": "diffusionformer.models",
    "DiffusionGraphTransformer": "diffusionformer.models",
    "DiffusionViT": "diffusionformer.models",
    "LoadedRun": "diffusionformer.experiments.reload",
    "create_model": "diffusionformer.models",
    "load_run": "diffusionformer.experiments.reload",
}


__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)  # later look-ups skip the hook


__all__ = [
    "AttentionIntermediates",
    "DiffusionAttention",
    "DiffusionGPT",
    "DiffusionGraphTransformer",
    "DiffusionOperator",
    "DiffusionViT",
    "LoadedRun",
    "__version__",
    "build_operator",
    "create_model",
    "functional",
    "list_operators",
    "load_run",
    "register_operator",
]
