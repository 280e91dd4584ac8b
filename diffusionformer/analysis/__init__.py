r"""Token-geometry analysis: how attention and diffusion heads shape token representations.

Pure metrics (``metrics``), spectral tools (``spectral``) and figures (``plots``, needs the
``plot`` extra) for the measurements of Zhang & Papyan, "Laplacian Heads Improve
Transformers by Smoothing Token Representations" (arXiv 2602.09297): within-sequence
variance and collapse, Dirichlet energy, ANOVA of token scatter, Neural Collapse of
sequence means, next-token separability, token spectra, PCA token maps and the frequency
response of polynomial operators.
"""

from __future__ import annotations

from diffusionformer.analysis.metrics import (
    AnovaSplit,
    NeuralCollapse,
    anova_decomposition,
    dirichlet_energy,
    high_frequency_ratio,
    linear_probe_accuracy,
    mean_pairwise_cosine,
    neural_collapse,
    next_token_nc1,
    rank_collapse_residual,
    variance_ratio,
    within_sequence_variance,
)
from diffusionformer.analysis.plots import (
    plot_frequency_response,
    plot_metric_by_depth,
    plot_pca_token_maps,
    plot_spectra,
)
from diffusionformer.analysis.spectral import (
    effective_rank,
    eigenvalues_of,
    energy_top_k,
    frequency_response,
    pca_token_rgb,
    power_law_exponent,
    stable_rank,
    token_singular_values,
)

__all__ = [
    # metrics
    "within_sequence_variance",
    "variance_ratio",
    "mean_pairwise_cosine",
    "high_frequency_ratio",
    "rank_collapse_residual",
    "dirichlet_energy",
    "AnovaSplit",
    "anova_decomposition",
    "NeuralCollapse",
    "neural_collapse",
    "next_token_nc1",
    "linear_probe_accuracy",
    # spectral
    "token_singular_values",
    "effective_rank",
    "stable_rank",
    "energy_top_k",
    "power_law_exponent",
    "pca_token_rgb",
    "frequency_response",
    "eigenvalues_of",
    # plots (matplotlib imported on first use)
    "plot_pca_token_maps",
    "plot_frequency_response",
    "plot_metric_by_depth",
    "plot_spectra",
]

# capture (forward hooks over model.blocks) and per-layer reports
from diffusionformer.analysis.capture import LayerCapture, LayerRecorder, capture_dataset, pad_by_batch  # noqa: E402
from diffusionformer.analysis.report import (  # noqa: E402
    LayerReport,
    LayerView,
    Metric,
    layer_reports,
    list_metrics,
    register_metric,
    unregister_metric,
)

__all__ += [
    "LayerCapture",
    "LayerRecorder",
    "capture_dataset",
    "pad_by_batch",
    "LayerReport",
    "layer_reports",
    # the metric registry: adding a metric = one registered function
    "LayerView",
    "Metric",
    "list_metrics",
    "register_metric",
    "unregister_metric",
]
