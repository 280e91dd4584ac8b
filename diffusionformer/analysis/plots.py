r"""Figures for token geometry: PCA token maps, frequency responses, metrics by depth, spectra.

matplotlib is imported lazily (the ``plot`` extra: ``pip install 'diffusionformer[plot]'``).
Figures are built with ``matplotlib.figure.Figure`` directly, not through ``pyplot``: no
global backend or figure state is touched, nothing is shown, and figures are freed like
any object. Save them with ``fig.savefig(path)`` (``ax.figure.savefig(path)`` for the
functions that return an ``Axes``); they display inline in Jupyter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from diffusionformer.analysis.metrics import _check_flag, _is_int
from diffusionformer.analysis.spectral import frequency_response

if TYPE_CHECKING:  # pragma: no cover - typing only
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "plot_pca_token_maps",
    "plot_frequency_response",
    "plot_metric_by_depth",
    "plot_spectra",
]


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as err:  # pragma: no cover - depends on the environment
        from diffusionformer._imports import matplotlib_error

        raise matplotlib_error(
            err,
            "diffusionformer.analysis.plots needs matplotlib; install the `plot` extra: "
            "pip install 'diffusionformer[plot]'",
            "diffusionformer.analysis.plots needs",
        ) from err
    return Figure


def _check_mapping(value: object, name: str, what: str) -> None:
    """A TypeError naming ``name`` unless ``value`` is a mapping (a list or tensor raised a bare AttributeError
    ``'list' object has no attribute 'items'``)."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping of {what}, got {type(value).__name__}")


def _new_axes(ax: Axes | None, figsize: tuple[float, float] = (5.0, 3.5)) -> Axes:
    if ax is not None:
        return ax
    return _figure_class()(figsize=figsize, layout="constrained").add_subplot()


def _plain(name: object) -> str:
    """``name`` as literal text: each ``$`` escaped (matplotlib reads ``"lr $10^-3$"`` as mathtext, and fails to draw
    ``"a$\\b$"``)."""
    return str(name).replace("$", r"\$")


def _legend(ax: Axes, named: list[tuple[Any, str]], **kwargs: Any) -> None:
    """``ax.legend(**kwargs)`` that lists every ``(artist, label)`` of ``named``: matplotlib leaves out an artist whose
    label starts with ``_`` (its mark of an unlabelled one), so a setting named ``"_base"`` had a line and no entry."""
    mine = {id(artist) for artist, _ in named}
    handles, labels = ax.get_legend_handles_labels()  # the caller's own artists on a given ax first
    pairs = [(h, lab) for h, lab in zip(handles, labels) if id(h) not in mine] + named
    ax.legend([h for h, _ in pairs], [lab for _, lab in pairs], **kwargs)


def _relegend(ax: Axes, **kwargs: Any) -> None:
    """Draw ``ax``'s legend again with ``kwargs`` (a font size, columns) and the same entries: a plain
    ``ax.legend(fontsize=7)`` after one of the functions here rebuilt it from the labels, without the names that
    start with ``_``."""
    old = ax.get_legend()
    if old is None:  # nothing listed yet
        ax.legend(**kwargs)
        return
    handles = getattr(old, "legend_handles", None)  # matplotlib >= 3.7
    if handles is None:  # pragma: no cover - matplotlib 3.6
        handles = old.legendHandles
    ax.legend(list(handles), [t.get_text() for t in old.get_texts()], **kwargs)


def _to_image(x: Tensor) -> Any:
    """``(C, H, W)`` or ``(H, W)`` tensor -> numpy ``(H, W[, 3])`` in [0, 1] for ``imshow`` (min-max scaled)."""
    x = x.detach().to(device="cpu", dtype=torch.float64)
    if x.ndim == 3:
        if x.shape[0] == 1:
            x = x[0]
        elif x.shape[0] == 3:
            x = x.permute(1, 2, 0)
        else:
            raise ValueError(f"images must have 1 or 3 channels, got shape {tuple(x.shape)}")
    finite = x[torch.isfinite(x)]  # a NaN min or max would blank the whole panel: scale by the finite pixels
    lo, hi = (finite.min(), finite.max()) if finite.numel() else (0.0, 0.0)
    x = ((x - lo) / (hi - lo)).clamp(0.0, 1.0) if hi > lo else torch.where(x.isnan(), x, torch.zeros_like(x))
    return x.numpy()  # NaN pixels stay NaN (drawn blank), +-inf ones at the ends of the range


def plot_pca_token_maps(
    images: Tensor,
    maps: Mapping[str, Tensor],
    *,
    max_images: int = 4,
    cell_size: float = 2.0,
) -> Figure:
    r"""Tiles inputs beside their PCA token maps, one row per image and one column per model.

    Column 0 shows the input (min-max scaled for display), column ``1 + m`` the RGB map of
    model ``m`` from ``pca_token_rgb`` as it is (patch grid shown with nearest-neighbour pixels;
    not scaled again per image, so colours compare across the rows; NaN pixels are blank).

    Args:
        images: inputs, channels first (1 or 3 channels) or greyscale ``(B, H, W)``.
        maps: model name -> its PCA map of the same images, values in ``[0, 1]``.
        max_images: number of rows (the first ``min(B, max_images)`` images).
        cell_size: size of one panel in inches.

    Shapes:
        images: ``(B, C, H, W)`` or ``(B, H, W)``; each map: ``(B', 3, h, w)`` with ``B' >= rows``.

    Examples:
        >>> fig = plot_pca_token_maps(torch.rand(2, 3, 8, 8), {"attention": torch.rand(2, 3, 2, 2)})
        >>> len(fig.axes)
        4
    """
    if not isinstance(images, Tensor) or images.ndim not in (3, 4):
        got = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(f"images must have shape (B, C, H, W) or (B, H, W), got {got}")
    if 0 in images.shape[-2:]:  # else numpy's "zero-size array to reduction operation minimum" from inside imshow
        raise ValueError(f"images must have H, W >= 1, got shape {tuple(images.shape)}")
    if images.is_complex():  # the float64 cast would keep the real part with only a warning
        raise TypeError(f"images must be real, got dtype {images.dtype}")
    _check_mapping(maps, "maps", "model name -> PCA map")
    if not maps:
        raise ValueError("maps must name at least one model's PCA map, got none")
    if not _is_int(max_images):  # a float or bool would reach fig.subplots as a row count
        raise TypeError(f"max_images must be an int, got {type(max_images).__name__} ({max_images!r})")
    rows = min(images.shape[0], int(max_images))
    if rows < 1:
        raise ValueError(f"need at least one image and max_images >= 1, got {rows} rows")
    for name, m in maps.items():
        if not isinstance(m, Tensor) or m.ndim != 4 or m.shape[1] != 3 or m.shape[0] < rows:
            got = tuple(m.shape) if isinstance(m, Tensor) else type(m).__name__
            raise ValueError(f"maps[{name!r}] must have shape (B >= {rows}, 3, h, w), got {got}")
        if 0 in m.shape[2:]:  # else numpy's "zero-size array to reduction operation minimum" from inside imshow
            raise ValueError(f"maps[{name!r}] must have a patch grid h, w >= 1, got shape {tuple(m.shape)}")
        if m.is_complex():
            raise TypeError(f"maps[{name!r}] must be real RGB values in [0, 1], got dtype {m.dtype}")
        drawn = m[:rows].detach().double()
        outside = ~((drawn >= 0) & (drawn <= 1)) & ~drawn.isnan()  # NaN: a blank pixel
        if bool(outside.any()):  # drawn as given: a map scaled per image would lose the batch's common scale
            bad = float(drawn[outside][0])
            raise ValueError(f"maps[{name!r}] must hold RGB values in [0, 1] (as pca_token_rgb gives), got "
                             f"{int(outside.sum())} values outside, e.g. {bad}")
    cols = 1 + len(maps)
    fig = _figure_class()(figsize=(cell_size * cols, cell_size * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    titles = ["input", *maps.keys()]
    panels = [images, *maps.values()]
    for r in range(rows):
        for c, (title, panel) in enumerate(zip(titles, panels)):
            ax = axes[r][c]
            # the input min-max scaled; a map as it is: pca_token_rgb scales over the batch so that colours
            # compare across images (a smoothed image's low contrast included), which a per-panel scale undid
            rgb = panel[r].detach().to("cpu", torch.float64).permute(1, 2, 0).numpy() if c else None
            ax.imshow(_to_image(panel[r]) if c == 0 else rgb, cmap="gray", interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(_plain(title))
    return fig


def plot_frequency_response(
    named_coeffs: Mapping[str, Tensor],
    ax: Axes | None = None,
    *,
    num_points: int = 201,
) -> Axes:
    r"""Plots ``f(lambda) = sum_k c_k lambda^k`` on ``lambda in [-1, 1]``, one line per operator.

    Real ``lambda`` in ``[-1, 1]`` covers the spectrum of a row-stochastic ``P`` that is
    similar to a symmetric matrix (e.g. a reversible random walk on an undirected graph).
    Attention maps are not symmetric in general and then have complex eigenvalues in the
    unit disc, which this plot does not show; evaluate ``frequency_response`` at
    ``eigenvalues_of(P)`` for those. ``lambda = 1`` is the constant (zero-frequency) mode.

    Args:
        named_coeffs: operator name -> coefficients ``(K+1,)``, or ``(G, K+1)`` for one
            line per head (labelled ``name[g]``).
        ax: axes to draw on; a new figure if omitted.
        num_points: number of evaluation points.

    Shapes:
        coefficients: ``(K+1,)`` or ``(G, K+1)``.

    Examples:
        >>> ax = plot_frequency_response({"attention": torch.tensor([0.0, 1.0]),
        ...                               "laplacian": torch.tensor([1.0, -1.0])})
        >>> ax.get_legend_handles_labels()[1]
        ['attention', 'laplacian']
    """
    _check_mapping(named_coeffs, "named_coeffs", "operator name -> coefficients")
    if not named_coeffs:
        raise ValueError("named_coeffs must hold at least one operator, got none")
    if not _is_int(num_points) or num_points < 2:
        raise ValueError(f"num_points must be an integer >= 2, got {num_points!r}")
    for name, coeffs in named_coeffs.items():
        if not isinstance(coeffs, Tensor):
            raise ValueError(f"named_coeffs[{name!r}] must be a tensor of shape (K+1,) or (G, K+1), "
                            f"got {type(coeffs).__name__}")
    ax = _new_axes(ax)
    lam = torch.linspace(-1.0, 1.0, int(num_points), dtype=torch.float64)
    named = []
    for name, coeffs in named_coeffs.items():
        try:
            response = frequency_response(coeffs.detach(), lam).cpu()
        except ValueError as err:  # else "coeffs holds NaN ...", naming neither named_coeffs nor the operator
            hint = (" (DiffusionAttention.coefficients() gives rows of NaN for the heads that are no polynomial in P, "
                    "such as 'heat-exact' and 'ppr-exact': leave those heads out)") if "NaN" in str(err) else ""
            raise ValueError(f"named_coeffs[{name!r}]: {err}{hint}") from None
        if response.is_complex():
            raise ValueError(f"named_coeffs[{name!r}] must be real for a real-axis plot")
        rows = response.unsqueeze(0) if response.ndim == 1 else response
        for g, row in enumerate(rows):
            label = _plain(name if response.ndim == 1 else f"{name}[{g}]")
            named += [(line, label) for line in ax.plot(lam.numpy(), row.numpy(), label=label)]
    ax.axhline(0.0, color="0.7", linewidth=0.8)
    ax.set_xlabel(r"eigenvalue $\lambda$ of $P$")
    ax.set_ylabel(r"$f(\lambda)$")
    _legend(ax, named)
    return ax


def plot_metric_by_depth(
    results: Mapping[str, Sequence[float]],
    ylabel: str,
    ax: Axes | None = None,
    *,
    xlabel: str = "layer",
    logy: bool = False,
) -> Axes:
    r"""Plots a metric against depth, one line per operator setting.

    Point ``l`` of each list is drawn at ``x = l`` (layer index as given, e.g. 0 = embedding
    output); a ``{layer: value}`` dict draws each value at its layer (e.g. a capture of layers
    0, 4 and 8).

    Args:
        results: setting name -> metric value per layer, in layer order (a list, tuple or 1-D tensor), or
            a ``{layer: value}`` dict with int layers (a set is a ``TypeError``: it has no order).
        ylabel: name of the metric.
        ax: axes to draw on; a new figure if omitted.
        xlabel: x-axis label.
        logy: logarithmic y axis (kept linear when no value is positive, e.g. a metric that is
            zero at every depth, where a log axis has nothing to show).

    A value ``None`` (a metric :func:`~diffusionformer.analysis.layer_reports` leaves undefined at
    that layer) is a gap in the line, like NaN.

    Examples:
        >>> ax = plot_metric_by_depth({"attention": [1.0, 0.5, 0.2]}, ylabel="variance")
        >>> ax.lines[0].get_ydata().tolist()
        [1.0, 0.5, 0.2]
    """
    _check_mapping(results, "results", "setting name -> metric value per layer")
    if not results:
        raise ValueError("results must hold at least one setting, got none")
    _check_flag(logy, "logy")  # logy="no" is truthy: a log axis where a linear one was asked for
    ax = _new_axes(ax)
    positive = False
    named = []
    for name, values in results.items():
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__") or getattr(values, "ndim", 1) != 1:
            # a string "12" would plot the digits; a scalar failed with "'float' object is not iterable"
            got = f"shape {tuple(values.shape)}" if hasattr(values, "shape") else type(values).__name__
            raise TypeError(f"results[{name!r}] must be a sequence of numbers, one per layer, got {got}")
        if isinstance(values, (set, frozenset)):  # iterated, a set gave its values in no order
            raise TypeError(f"results[{name!r}] must be an ordered sequence of numbers, one per layer, or a "
                            f"{{layer: value}} dict, got {type(values).__name__}")
        if isinstance(values, Mapping):  # iterated, a dict gave its keys: the layer indices drawn as the metric
            bad = [k for k in values if not _is_int(k)][:1]
            if bad:
                raise TypeError(f"results[{name!r}]: a dict must map int layers to values, got the key {bad[0]!r}")
            ordered = sorted(values.items(), key=lambda item: int(item[0]))
            layers, values = [int(k) for k, _ in ordered], [v for _, v in ordered]
        else:
            layers = None
        try:
            values = [float("nan") if v is None else float(v) for v in values]
        except (TypeError, ValueError) as err:  # else "could not convert string to float: 'x'", no setting named
            raise TypeError(f"results[{name!r}] must hold real numbers (or None), one per layer: {err}") from None
        positive = positive or any(v > 0 for v in values)
        label = _plain(name)
        xs = range(len(values)) if layers is None else layers
        named += [(line, label) for line in ax.plot(xs, values, marker="o", markersize=3, label=label)]
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logy and positive:
        ax.set_yscale("log")
    _legend(ax, named)
    return ax


def plot_spectra(
    spectra: Mapping[str, Tensor],
    ax: Axes | None = None,
    *,
    normalize: bool = True,
) -> Axes:
    r"""Log-log plot of singular values against their rank ``i = 1, 2, ...``.

    A power law ``s_i^2 ~ i^{-alpha}`` is a straight line of slope ``-alpha/2`` (see
    ``power_law_exponent``). With ``normalize`` each spectrum is divided by its largest
    value so that decay rates compare at a glance. Zero and non-finite values (a diverged run)
    are dropped (no log); negative values are refused. The axes stay linear when nothing is left
    to draw (every spectrum zero, e.g. fully collapsed tokens, or non-finite).

    Args:
        spectra: name -> singular values (any order; sorted descending here).
        ax: axes to draw on; a new figure if omitted.
        normalize: plot ``s_i / s_1``.

    Shapes:
        each spectrum: ``(R,)``.

    Examples:
        >>> ax = plot_spectra({"attention": torch.tensor([4.0, 2.0, 1.0])})
        >>> ax.lines[0].get_ydata().tolist()
        [1.0, 0.5, 0.25]
    """
    _check_mapping(spectra, "spectra", "name -> singular values")
    if not spectra:
        raise ValueError("spectra must hold at least one spectrum, got none")
    _check_flag(normalize, "normalize")
    ax = _new_axes(ax)
    named = []
    drawn = False
    for name, s in spectra.items():
        if not isinstance(s, Tensor) or s.ndim != 1:
            got = tuple(s.shape) if isinstance(s, Tensor) else type(s).__name__
            raise ValueError(f"spectra[{name!r}] must have shape (R,), got {got}")
        if s.is_complex():  # the cast below would keep the real part with only a warning
            raise TypeError(f"spectra[{name!r}] must hold real singular values, got dtype {s.dtype}")
        s = s.detach().to(device="cpu", dtype=torch.float64)
        if bool((s < 0).any()):  # dropped with the zeros, a negative value would shift every later rank
            raise ValueError(f"spectra[{name!r}] must hold non-negative singular values, got {int((s < 0).sum())} "
                             f"negative values (min {float(s.min())})")
        s = s.sort(descending=True).values
        s = s[torch.isfinite(s) & (s > 0)]  # an inf s_1 would make s / s_1 all 0 and NaN: nothing drawn
        if normalize and s.numel() > 0:
            s = s / s[0]
        drawn = drawn or s.numel() > 0
        label = _plain(name)
        named += [(line, label) for line in ax.plot(torch.arange(1, s.numel() + 1).numpy(), s.numpy(), label=label)]
    if drawn:  # log axes over only empty lines made savefig fail ("Data cannot be log-scaled")
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("rank $i$")
    ax.set_ylabel(r"$s_i / s_1$" if normalize else r"$s_i$")
    _legend(ax, named)
    return ax
