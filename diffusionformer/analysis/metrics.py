r"""Token-geometry metrics: smoothing, collapse and separability of token representations.

These are the measurements of Zhang & Papyan, "Laplacian Heads Improve Transformers by
Smoothing Token Representations" (arXiv 2602.09297), as pure tensor functions.

Glossary (shared with the rest of the package):

- ``X`` tokens of shape ``(B, T, D)``: ``B`` sequences of ``T`` tokens with ``D`` features.
- ``C = I - (1/T) 1 1^T`` the ``T x T`` centring matrix; ``C X`` removes each sequence's mean
  token, i.e. keeps exactly the within-sequence variation that a Laplacian head ``I - P``
  acts on (``(I - P) 1 = 0``).
- ``x_bar = (1/T) X^T 1`` the mean token of one sequence.
- ``reduction`` over sequences: ``"none"`` returns one value per sequence ``(B,)``,
  ``"mean"`` and ``"sum"`` a 0-dim tensor.

Ratios whose denominator is zero (e.g. all tokens zero) are defined as ``0``: there is no
variation to measure, and no NaN escapes.
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from diffusionformer.config import _check_flag, _choice_hint, _value_type
from diffusionformer.ops._checks import check_index_range, checks_values

__all__ = [
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
]

_REDUCTIONS = ("none", "mean", "sum")


# ----------------------------------------------------------------------------------------
# Input checks and small helpers (shared with ``spectral.py``)
# ----------------------------------------------------------------------------------------


def _check_dense(x: Tensor, name: str, hint: str = "") -> None:
    """Refuse a sparse ``x`` by ``name`` (else a bare NotImplementedError, "aten::ne.Scalar ... SparseCPU", from the
    value checks that follow)."""
    if x.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {x.layout}: pass {name}.to_dense(){hint}")


def _check_float(x: object, name: str, ndims: tuple[int, ...], layout: str) -> Tensor:
    """Checks that ``x`` is a real floating tensor with one of the allowed ``ndims``."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {layout}, got {type(x).__name__}")
    _check_dense(x, name, " or a sparse graph as dirichlet_energy(X, edge_index=..., edge_weight=...)" if name == "P"
                 else "")
    if x.ndim not in ndims:
        raise ValueError(
            f"{name} must have shape {layout} ({' or '.join(map(str, ndims))} dims), "
            f"got shape {tuple(x.shape)} ({x.ndim} dims)"
        )
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor (float32/float64), got dtype {x.dtype}")
    if x.dtype in (torch.float16, torch.bfloat16):  # squares of activations overflow float16; bf16 keeps 3 digits
        raise TypeError(f"{name} must be float32 or float64, got {x.dtype}: pass {name}.float() "
                        "(capture_dataset keeps float32, or float64 for a float64 model)")
    if x.numel() == 0:
        raise ValueError(f"{name} must be non-empty, got shape {tuple(x.shape)}")
    if checks_values(x) and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} holds NaN or inf values: the metric is undefined for them (not 0)")
    return x


def _check_tokens(x: object, name: str = "X") -> Tensor:
    """Checks tokens of shape ``(B, T, D)``."""
    return _check_float(x, name, (3,), "(B, T, D)")


def _check_labels(y: object, n: int, name: str, per: str, device: torch.device) -> Tensor:
    """Checks integer labels of shape ``(n,)`` (one label per ``per``); moves them to ``device``."""
    if not isinstance(y, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of integer labels, got {type(y).__name__}")
    if y.is_floating_point() or y.is_complex():
        raise TypeError(f"{name} must hold integer class labels, got dtype {y.dtype}")
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError(
            f"{name} must have shape ({n},): one label per {per}, got shape {tuple(y.shape)}"
        )
    return y.to(device)


def _is_int(value: object) -> bool:
    """Whether ``value`` is an integer argument: a Python or numpy int (``np.int64`` from a sweep), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_choice(value: object, name: str, allowed: tuple[str, ...]) -> None:
    """``value`` must be one of ``allowed``: else a ValueError naming ``name``, with a "did you mean" when one is close."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}{_choice_hint(value, allowed)}")


def _check_reduction(reduction: str, allowed: tuple[str, ...] = _REDUCTIONS) -> None:
    _check_choice(reduction, "reduction", allowed)


def _reduce(values: Tensor, reduction: str) -> Tensor:
    _check_reduction(reduction)
    if reduction == "mean":
        return values.mean()
    if reduction == "sum":
        return values.sum()
    return values


def _safe_div(num: Tensor, den: Tensor) -> Tensor:
    """``num / den``, and ``0`` where ``den == 0`` (no variation to measure); a NaN stays NaN, never 0."""
    zero = den == 0
    return torch.where(zero, 0.0, num / torch.where(zero, torch.ones_like(den), den))


def _wide_dtype(x: Tensor) -> torch.dtype:
    """Accumulation dtype: float64, except on MPS which has no float64."""
    return torch.float32 if x.device.type == "mps" else torch.float64


def _times_pow2(x: Tensor, exponent: Tensor) -> Tensor:
    """``x * 2 ** exponent``, exact, in two factors (``2 ** 148`` is no float32) that carry no gradient:
    ``torch.ldexp(x, e)`` itself passes a zero gradient to ``x``."""
    half = torch.div(exponent, 2, rounding_mode="floor")
    one = torch.ones_like(exponent, dtype=x.dtype)
    return x * torch.ldexp(one, half) * torch.ldexp(one, exponent - half)


def _unit_scale(x: Tensor, dim: int | tuple[int, ...]) -> Tensor:
    """``x`` times the power of two that brings its largest ``|x|`` over ``dim`` into ``[0.5, 1)`` (exact, so results at
    ordinary scales are unchanged), for the scale-free ratios: the squares of finite float32 tokens over/underflow
    (|x| > 1e19: inf / inf = NaN; |x| < 1e-19: subnormal or 0)."""
    _, exponent = torch.frexp(x.detach().abs().amax(dim=dim, keepdim=True))  # 0 for an all-zero slice: left alone
    return _times_pow2(x, -exponent)


def _centre(x: Tensor, dim: int | tuple[int, ...] = 1) -> Tensor:
    """``C X`` for every sequence: subtract the mean token over ``dim`` (1: per sequence; ``(0, 1)``: the batch's).

    The first token is subtracted first (``C X = C (X - 1 x_1^T)``), so equal tokens centre to exactly 0: the rounded
    mean of ``T`` equal floats is not always that float (7 copies of a float32 token gave residues of ~1e-7 of it,
    a variance of 1e-13 and a noise spectrum of effective rank ~7 for completely collapsed tokens)."""
    dims = (dim,) if isinstance(dim, int) else dim
    first = x
    for d in dims:
        first = first.narrow(d, 0, 1)
    x = x - first
    return x - x.mean(dim=dims, keepdim=True)


# ----------------------------------------------------------------------------------------
# Within-sequence smoothing and collapse
# ----------------------------------------------------------------------------------------


def within_sequence_variance(X: Tensor, reduction: str = "none") -> Tensor:
    r"""Within-sequence variance ``V(X) = (1/T) ||C X||_F^2 = (1/T) sum_i ||x_i - x_bar||^2``.

    The total (trace) variance of the tokens of each sequence around their own mean: zero
    exactly when all tokens of the sequence are equal. Zhang & Papyan (arXiv 2602.09297)
    track it through depth to show that Laplacian heads smooth tokens without collapsing
    them.

    Args:
        X: tokens.
        reduction: ``"none"`` (per sequence), ``"mean"`` or ``"sum"`` over sequences.

    Shapes:
        X: ``(B, T, D)`` -> ``(B,)`` for ``reduction="none"``, else ``()``.

    Examples:
        >>> X = torch.tensor([[[1.0, 0.0], [-1.0, 0.0]], [[2.0, 2.0], [2.0, 2.0]]])
        >>> within_sequence_variance(X)
        tensor([1., 0.])
    """
    _check_tokens(X)
    _, T, _ = X.shape
    return _reduce(_centre(X).pow(2).sum(dim=(1, 2)) / T, reduction)


def variance_ratio(X: Tensor, reduction: str = "none") -> Tensor:
    r"""Share of the variance that lies within sequences, ``V_within / V_total``, in ``[0, 1]``.

    With ``mu = (1/(B T)) sum_{b,i} x_{b,i}`` the mean token of the whole batch,

    ``V_total(X_b) = (1/T) ||X_b - 1 mu^T||_F^2 = V_within(X_b) + ||x_bar_b - mu||^2``

    (law of total variance), so per sequence ``ratio_b = V_within(X_b) / V_total(X_b)``.
    A ratio near 0 means the sequence has collapsed to a point (its tokens differ only
    through the sequence mean); near 1 means its mean sits at the batch mean.

    Args:
        X: tokens.
        reduction: ``"none"`` (per-sequence ratios), ``"mean"`` (mean of the ratios),
            ``"sum"``, or ``"pooled"``: ``sum_b V_within(X_b) / sum_b V_total(X_b)``, the
            within-sequence fraction of the variance of all ``B T`` tokens.

    Shapes:
        X: ``(B, T, D)`` -> ``(B,)`` for ``reduction="none"``, else ``()``.

    Examples:
        >>> X = torch.tensor([[[1.0], [-1.0]], [[2.0], [2.0]], [[-2.0], [-2.0]]])
        >>> variance_ratio(X)
        tensor([1., 0., 0.])
        >>> variance_ratio(X, reduction="pooled")  # 1 / (1 + 4 + 4)
        tensor(0.1111)
    """
    _check_tokens(X)
    _check_reduction(reduction, _REDUCTIONS + ("pooled",))
    _, T, _ = X.shape
    X = _unit_scale(X, (0, 1, 2))  # one scale for the batch (the total variance is about the batch mean)
    mu = X.mean(dim=(0, 1))  # (D,)
    within = _centre(X).pow(2).sum(dim=(1, 2)) / T  # (B,)
    total = (X - mu).pow(2).sum(dim=(1, 2)) / T  # (B,)
    # within <= total exactly (law of total variance): a ratio over 1 by rounding (1 + 1 ulp for centred tokens) is 1
    if reduction == "pooled":
        return _safe_div(within.sum(), total.sum()).clamp(max=1.0)
    return _reduce(_safe_div(within, total).clamp(max=1.0), reduction)


def mean_pairwise_cosine(X: Tensor, reduction: str = "none", eps: float = 1e-12) -> Tensor:
    r"""Mean cosine similarity over ordered pairs of distinct tokens of a sequence.

    ``cos_bar(X) = 1/(T (T-1)) sum_{i != j} <x_i, x_j> / (||x_i|| ||x_j||)``, computed in
    ``O(T D)`` as ``(||sum_i u_i||^2 - sum_i ||u_i||^2) / (T (T-1))`` with ``u_i = x_i / ||x_i||``.
    It is 1 for identical (non-zero) tokens, the symptom of rank collapse studied by Dong,
    Cordonnier & Loukas (2021), and 0 for mutually orthogonal tokens. A zero token
    (``||x_i|| < eps``) has cosine 0 with every other token.

    Args:
        X: tokens, ``T >= 2``.
        reduction: ``"none"``, ``"mean"`` or ``"sum"`` over sequences.
        eps: norm below which a token counts as zero.

    Shapes:
        X: ``(B, T, D)`` -> ``(B,)`` for ``reduction="none"``, else ``()``.

    Examples:
        >>> X = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [2.0, 2.0]]])
        >>> mean_pairwise_cosine(X).round(decimals=4)
        tensor([0., 1.])
    """
    _check_tokens(X)
    _, T, _ = X.shape
    if T < 2:
        raise ValueError(f"mean_pairwise_cosine needs T >= 2 tokens per sequence, got T={T}")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not 0 < eps < float("inf"):
        # eps = 0 would divide a zero token by its zero norm: NaN, not the documented cosine 0
        raise ValueError(f"eps must be a positive finite float, got {eps!r}")
    _, exponent = torch.frexp(X.detach().abs().amax(dim=-1, keepdim=True))  # (B, T, 1): ||x|| of |x| > 1e19 is inf
    Xs = _times_pow2(X, -exponent)  # each token scaled exactly by a power of two, its largest entry in [0.5, 1)
    scaled = Xs.norm(dim=-1, keepdim=True)
    nonzero = _times_pow2(scaled.detach(), exponent) >= eps  # ||x|| >= eps (an inf norm is >= eps too)
    U = torch.where(nonzero, Xs / torch.where(scaled > 0, scaled, torch.ones_like(scaled)), 0.0)  # a token below eps: cosine 0 with the others
    off_diagonal = U.sum(dim=1).pow(2).sum(dim=-1) - U.pow(2).sum(dim=(1, 2))  # (B,)
    # in its range [-1/(T-1), 1]: identical tokens gave 1 + 5e-7 (float32) and 1 + 7e-16 (float64) by rounding
    return _reduce((off_diagonal / (T * (T - 1))).clamp(min=-1.0 / (T - 1), max=1.0), reduction)


def high_frequency_ratio(X: Tensor, reduction: str = "none") -> Tensor:
    r"""Share of the token signal that is not constant over the sequence, ``||C X||_F / ||X||_F``.

    In graph-signal terms, ``C X`` is ``X`` with its zero-frequency (constant) component on
    the complete token graph removed, so the ratio lies in ``[0, 1]``: 0 when all tokens are
    equal, 1 when the mean token is zero. It equals ``rank_collapse_residual(X, "mean")``
    and ``sqrt`` of the normalised uniform ``dirichlet_energy``.

    Args:
        X: tokens.
        reduction: ``"none"``, ``"mean"`` or ``"sum"`` over sequences.

    Shapes:
        X: ``(B, T, D)`` -> ``(B,)`` for ``reduction="none"``, else ``()``.

    Examples:
        >>> X = torch.tensor([[[3.0], [3.0]], [[1.0], [-1.0]]])
        >>> high_frequency_ratio(X)
        tensor([0., 1.])
    """
    _check_tokens(X)
    X = _unit_scale(X, (1, 2))
    num = _centre(X).pow(2).sum(dim=(1, 2)).sqrt()
    den = X.pow(2).sum(dim=(1, 2)).sqrt()
    return _reduce(_safe_div(num, den).clamp(max=1.0), reduction)  # ||C X|| <= ||X||: centred tokens gave 1 + 1 ulp


def rank_collapse_residual(X: Tensor, method: str = "mean", reduction: str = "none") -> Tensor:
    r"""Relative distance of the tokens to a rank-1 matrix, ``||X - X_1||_F / ||X||_F``.

    Dong, Cordonnier & Loukas, "Attention is not all you need: pure attention loses rank
    doubly exponentially with depth" (ICML 2021) measure collapse by the residual
    ``res(X) = X - 1 x^T`` with ``x = argmin_x ||X - 1 x^T||`` (they use a composite
    l1/l-inf norm; in the Frobenius norm used here the minimiser is the mean token).
    Two choices of the rank-1 approximation ``X_1``:

    - ``method="mean"``: ``X_1 = 1 x_bar^T``, "all rows equal"; the residual is
      ``||C X||_F / ||X||_F`` (identical to ``high_frequency_ratio``).
    - ``method="svd"``: ``X_1 = s_1 u_1 v_1^T``, the best rank-1 approximation
      (Eckart-Young); the residual is ``sqrt(sum_{i>=2} s_i^2) / sqrt(sum_i s_i^2)``. It is
      never larger than the ``"mean"`` residual, and is 0 also for tokens that are all
      multiples of one vector.

    Args:
        X: tokens.
        method: ``"mean"`` or ``"svd"``.
        reduction: ``"none"``, ``"mean"`` or ``"sum"`` over sequences.

    Shapes:
        X: ``(B, T, D)`` -> ``(B,)`` for ``reduction="none"``, else ``()``.

    Examples:
        >>> X = torch.tensor([[[1.0, 1.0], [2.0, 2.0]]])
        >>> rank_collapse_residual(X, "svd").round(decimals=4)
        tensor([0.])
        >>> round(rank_collapse_residual(X, "mean").item(), 4)
        0.3162
    """
    _check_tokens(X)
    if method == "mean":
        return high_frequency_ratio(X, reduction)
    _check_choice(method, "method", ("mean", "svd"))
    s2 = torch.linalg.svdvals(_unit_scale(X, (1, 2))).pow(2)  # (B, min(T, D)), descending
    return _reduce(_safe_div(s2[:, 1:].sum(dim=-1).sqrt(), s2.sum(dim=-1).sqrt()), reduction)


# ----------------------------------------------------------------------------------------
# Dirichlet energy on the token graph
# ----------------------------------------------------------------------------------------


def dirichlet_energy(
    X: Tensor,
    P: Tensor | None = None,
    *,
    edge_index: Tensor | None = None,
    edge_weight: Tensor | None = None,
    batch: Tensor | None = None,
    num_graphs: int | None = None,
    normalized: bool = True,
    reduction: str = "none",
) -> Tensor:
    r"""Dirichlet energy of tokens on a token graph, ``E = 1/2 sum_{i,j} P_ij ||x_i - x_j||^2``.

    ``P_ij`` is the weight of edge ``j -> i`` (an attention row ``i`` puts weight ``P_ij`` on
    token ``j``); ``P`` need not be symmetric or row-stochastic. The graph is one of

    - the complete graph with self loops and uniform weights ``P_ij = 1/T`` (default). Then
      ``sum_{i,j} ||x_i - x_j||^2 = 2 T ||C X||_F^2``, so exactly
      ``E = ||C X||_F^2 = T * within_sequence_variance(X)``;
    - a dense matrix ``P``, evaluated without forming pairwise differences as
      ``E = 1/2 sum_i (r_i + c_i) ||x_i||^2 - tr(X^T P X)`` with row sums ``r = P 1`` and column
      sums ``c = P^T 1`` (tokens are first centred per sequence and the diagonal of ``P`` is dropped,
      which leaves ``E`` unchanged because ``E`` depends only on differences and a self loop has
      none, and reduces cancellation: ``P = I`` gives exactly 0);
    - a sparse graph ``(edge_index, edge_weight)`` in PyTorch Geometric convention
      (``edge_index[0]`` = source ``j``, ``edge_index[1]`` = target ``i``):
      ``E = 1/2 sum_e w_e ||x_{src(e)} - x_{dst(e)}||^2``, accumulated per graph (an edge
      joining two graphs of ``batch`` counts for its target's graph).

    The scale-free version (``normalized=True``) divides by ``sum_i ||x_i||^2 = ||X||_F^2`` of
    the same sequence/graph, so that rescaling the tokens leaves it unchanged; it is
    ``0`` when all tokens are zero. With uniform weights it equals
    ``high_frequency_ratio(X) ** 2``. (This is the unnormalised-Laplacian energy
    ``tr(X^T L X)`` for symmetric ``P``; degree-normalised variants are not offered here.)

    Args:
        X: tokens ``(B, T, D)``; for a sparse graph also node features ``(N, D)``.
        P: dense edge weights; ``(T, T)`` is shared by all sequences (moved to ``X.device``).
        edge_index: sparse edges indexing the rows of ``X`` (``X`` of shape ``(B, T, D)`` is
            flattened to ``B T`` nodes, node ``b T + t`` being token ``t`` of sequence ``b``).
        edge_weight: weight of each edge; ones if omitted.
        batch: graph id of each node of ``X`` ``(N, D)``; all nodes form one graph if omitted.
        num_graphs: number of graphs in ``batch`` (default ``batch.max() + 1``).
        normalized: divide by ``||X||_F^2`` per sequence/graph.
        reduction: ``"none"``, ``"mean"`` or ``"sum"`` over sequences/graphs.

    Shapes:
        X: ``(B, T, D)`` (dense, complete) or ``(N, D)`` (sparse);
        P: ``(T, T)`` or ``(B, T, T)``; edge_index: ``(2, E)``; edge_weight: ``(E,)``;
        batch: ``(N,)``; output: ``(B,)`` or ``(num_graphs,)`` for ``reduction="none"``,
        else ``()``.

    Examples:
        >>> X = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
        >>> dirichlet_energy(X, normalized=False)  # uniform P = 1/2: 1/2 * 2 * 1/2 * 2
        tensor([1.])
        >>> P = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
        >>> dirichlet_energy(X, P, normalized=False)
        tensor([2.])
        >>> edge_index = torch.tensor([[0, 1], [1, 0]])
        >>> dirichlet_energy(X, edge_index=edge_index, normalized=True)
        tensor([1.])
    """
    if P is not None and edge_index is not None:
        raise ValueError("pass either a dense P or a sparse edge_index, not both")
    _check_flag(normalized, "normalized")
    if edge_index is not None:
        energy, norm2 = _sparse_dirichlet(X, edge_index, edge_weight, batch, num_graphs, normalized)
    else:
        if edge_weight is not None or batch is not None or num_graphs is not None:
            raise ValueError("edge_weight and batch are only used with edge_index"
                             + ("" if num_graphs is None else f" (and num_graphs, got {num_graphs!r})"))
        _check_tokens(X)
        B, T, _ = X.shape
        if normalized:  # scale-free: E / ||X||^2 of tokens of |x| > 1e19 was inf / inf = NaN in float32
            X = _unit_scale(X, (1, 2))
        Xc = _centre(X)
        if P is None:
            energy = Xc.pow(2).sum(dim=(1, 2))  # = T * within-sequence variance
        else:
            _check_float(P, "P", (2, 3), "(T, T) or (B, T, T)")
            if P.shape[-2:] != (T, T) or (P.ndim == 3 and P.shape[0] != B):
                expected = f"({T}, {T}) or ({B}, {T}, {T})"
                raise ValueError(f"P must have shape {expected} to match X, got {tuple(P.shape)}")
            # the diagonal (self loops) adds nothing to E, but twice to the cancelling terms below: P = I gave a
            # negative energy (-0.0156 for float32 tokens of scale 10), not 0
            # the two terms below cancel: in float32 two tokens at distance 1 but 1e4 from the mean had E = 0, not 1,
            # so they are accumulated in float64
            wide = _wide_dtype(X)
            Xw = Xc.to(wide)
            P = P.to(device=X.device, dtype=wide) * (1 - torch.eye(T, dtype=wide, device=X.device))
            sq = Xw.pow(2).sum(dim=-1)  # (B, T)
            degree = P.sum(dim=-1) + P.sum(dim=-2)  # (B, T) or (T,): r + c
            cross = (Xw * torch.matmul(P, Xw)).sum(dim=(1, 2))  # tr(X^T P X), (B,)
            energy = (0.5 * (degree * sq).sum(dim=-1) - cross).to(X.dtype)
            # a sum of non-negative terms where P >= 0: tokens constant on the clusters P joins gave -3e-16 (normalised),
            # not 0, from the cancelling terms above
            nonnegative = (P >= 0).flatten(-2).all(dim=-1)  # () or (B,)
            energy = torch.where(nonnegative, energy.clamp_min(0.0), energy)
        norm2 = X.pow(2).sum(dim=(1, 2))
    if normalized:
        energy = _safe_div(energy, norm2)
    return _reduce(energy, reduction)


_EDGE_CHUNK = 1 << 22  # gathered elements per chunk: bounds memory at O(chunk) not O(E D)


def _sparse_dirichlet(
    X: Tensor,
    edge_index: Tensor,
    edge_weight: Tensor | None,
    batch: Tensor | None,
    num_graphs: int | None,
    scale: bool = False,
) -> tuple[Tensor, Tensor]:
    """Per-graph Dirichlet energy and squared norm on a sparse graph (of ``X`` over its largest ``|x|`` if ``scale``)."""
    _check_float(X, "X", (2, 3), "(N, D) or (B, T, D)")
    if X.ndim == 3:
        if batch is not None:
            raise ValueError("batch is implied for X of shape (B, T, D); pass X as (N, D)")
        B, T, D = X.shape
        if num_graphs is not None and (not _is_int(num_graphs) or num_graphs != B):  # else silently B graphs
            raise ValueError(f"num_graphs must be None or B = {B} for X of shape (B, T, D) (one graph per sequence), "
                             f"got {num_graphs!r}")
        batch = torch.arange(B, device=X.device).repeat_interleave(T)
        num_graphs = B
        X = X.reshape(B * T, D)
    N, D = X.shape
    if not isinstance(edge_index, Tensor) or edge_index.ndim != 2 or edge_index.shape[0] != 2:
        got = tuple(edge_index.shape) if isinstance(edge_index, Tensor) else type(edge_index)
        raise ValueError(f"edge_index must have shape (2, E), got {got}")
    if edge_index.is_floating_point() or edge_index.is_complex() or edge_index.dtype == torch.bool:
        raise TypeError(f"edge_index must hold integer node ids, got dtype {edge_index.dtype}")
    check_index_range("edge_index", edge_index, "num_nodes", N)  # a negative id would wrap round silently
    E = edge_index.shape[1]
    if edge_weight is None:
        edge_weight = X.new_ones(E)
    elif not isinstance(edge_weight, Tensor) or edge_weight.shape != (E,):
        got = tuple(edge_weight.shape) if isinstance(edge_weight, Tensor) else type(edge_weight)
        raise ValueError(f"edge_weight must have shape ({E},), got {got}")
    elif edge_weight.is_complex():
        raise TypeError(f"edge_weight must be real, got dtype {edge_weight.dtype}")
    elif checks_values(edge_weight) and edge_weight.is_floating_point() and not bool(torch.isfinite(edge_weight).all()):
        # as a dense P with NaN: refused, not a NaN energy
        raise ValueError("edge_weight holds NaN or inf values: the metric is undefined for them (not 0)")
    if batch is None:
        if num_graphs is not None:  # else silently one graph, whatever num_graphs says
            raise ValueError(f"num_graphs counts the graphs of batch: pass batch too, got num_graphs={num_graphs!r} "
                             "and no batch")
        batch = torch.zeros(N, dtype=torch.long, device=X.device)
        num_graphs = 1
    else:
        batch = _check_labels(batch, N, "batch", "node of X", X.device)
        if num_graphs is None:
            num_graphs = int(batch.max()) + 1
        elif not _is_int(num_graphs) or num_graphs < 1:
            raise ValueError(f"num_graphs must be a positive int, got {num_graphs!r}")
        num_graphs = int(num_graphs)
        check_index_range("batch", batch, "num_graphs", num_graphs)  # else an IndexError from index_add_
    if scale:
        # each graph by its own power of two (the dense path scales each sequence): one scale for the batch took the
        # squares of a graph of tokens ~1e-20 beside one of ~1e3 (float32) to 0, and its energy to 0, not ~1
        peak = X.new_zeros(num_graphs).scatter_reduce_(0, batch, X.detach().abs().amax(dim=-1), "amax")
        shift = -torch.frexp(peak)[1][batch].unsqueeze(-1)  # (N, 1): the exponent of each node's graph
    else:
        shift = torch.zeros(N, 1, dtype=torch.int32, device=X.device)
    src, dst = edge_index.to(X.device).unbind(0)
    w = edge_weight.to(device=X.device, dtype=X.dtype)
    energy = X.new_zeros(num_graphs)
    step = max(1, _EDGE_CHUNK // max(D, 1))
    for start in range(0, E, step):
        s, d = src[start : start + step], dst[start : start + step]
        # both ends at the scale of the target's graph, which the edge counts for (also an edge between graphs)
        diff2 = (_times_pow2(X[s], shift[d]) - _times_pow2(X[d], shift[d])).pow(2).sum(dim=-1)  # (chunk,)
        energy.index_add_(0, batch[d], 0.5 * w[start : start + step] * diff2)
    norm2 = X.new_zeros(num_graphs).index_add_(0, batch, _times_pow2(X, shift).pow(2).sum(dim=-1))
    return energy, norm2


# ----------------------------------------------------------------------------------------
# ANOVA of token scatter: within sequence / between sequences of a class / between classes
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AnovaSplit:
    r"""Exact split of the token scatter into three nested parts (see ``anova_decomposition``).

    Each part is a trace of a scatter matrix divided by the number of tokens ``B T``, so
    ``total`` is the total variance of all tokens and
    ``total = within_sequence + between_sequence + between_class``.

    Args:
        total: ``(1/BT) sum_{b,i} ||x_{b,i} - mu||^2``.
        within_sequence: ``(1/BT) sum_{b,i} ||x_{b,i} - x_bar_b||^2``.
        between_sequence: ``(1/BT) sum_b T ||x_bar_b - m_{y_b}||^2`` (within class).
        between_class: ``(1/BT) sum_c n_c T ||m_c - mu||^2``.
        num_classes: number of distinct labels.
    """

    total: float
    within_sequence: float
    between_sequence: float
    between_class: float
    num_classes: int

    @property
    def fractions(self) -> tuple[float, float, float]:
        """``(within_sequence, between_sequence, between_class) / total`` (zeros if total is 0)."""
        if self.total <= 0:
            return (0.0, 0.0, 0.0)
        # at most 1 (the parts are non-negative and sum to total): one part of all the scatter gave 1 + 4e-16
        return (
            min(self.within_sequence / self.total, 1.0),
            min(self.between_sequence / self.total, 1.0),
            min(self.between_class / self.total, 1.0),
        )

    def as_dict(self) -> dict[str, float]:
        """Fields and fractions as a flat ``dict`` (for JSON logs)."""
        out: dict[str, float] = dict(asdict(self))
        names = ("within_sequence", "between_sequence", "between_class")
        for name, value in zip(names, self.fractions):
            out[f"{name}_fraction"] = value
        return out


def anova_decomposition(X: Tensor, y: Tensor) -> AnovaSplit:
    r"""Exact ANOVA split of the token sum of squares of labelled sequences.

    With ``mu`` the mean of all ``B T`` tokens, ``x_bar_b`` the mean token of sequence ``b``,
    ``m_c`` the mean token of all sequences of class ``c`` (``n_c`` of them), the sum of
    squares splits exactly (cross terms vanish because each deviation sums to zero inside
    the next level):

    ``sum_{b,i} ||x_{b,i} - mu||^2 = sum_{b,i} ||x_{b,i} - x_bar_b||^2``
    ``+ T sum_b ||x_bar_b - m_{y_b}||^2 + T sum_c n_c ||m_c - mu||^2``,

    i.e. total = within-sequence + between-sequences-within-class + between-class. All
    parts are divided by ``B T``. Smoothing heads (Zhang & Papyan, arXiv 2602.09297) shrink
    the first part; Neural Collapse (Papyan, Han & Donoho, PNAS 2020) makes the second
    vanish relative to the third. Accumulated in float64 (float32 on MPS).

    Args:
        X: tokens.
        y: class label of each sequence (any integer ids; one class is allowed).

    Shapes:
        X: ``(B, T, D)``; y: ``(B,)``.

    Examples:
        >>> X = torch.tensor([[[0.0], [2.0]], [[4.0], [6.0]], [[10.0], [12.0]], [[14.0], [16.0]]])
        >>> split = anova_decomposition(X, torch.tensor([0, 0, 1, 1]))
        >>> split.within_sequence, split.between_sequence, split.between_class
        (1.0, 4.0, 25.0)
        >>> split.total
        30.0
    """
    _check_tokens(X)
    B, T, D = X.shape
    y = _check_labels(y, B, "y", "sequence of X", X.device)
    # the equal-length case of the token-weighted split (one implementation; since ANALYSIS_VERSION 4, whose
    # reduction order moved this one's values by rounding)
    return _anova_of_lengths(X.reshape(B * T, D), torch.full((B,), T, device=X.device), y)


def _anova_of_lengths(tokens: Tensor, lengths: Tensor, y: Tensor) -> AnovaSplit:
    r""":func:`anova_decomposition` of sequences of unequal lengths (padded graphs): ``tokens`` ``(N, D)`` the real
    tokens of every sequence in order, ``lengths`` ``(B,)`` their counts (0: an empty sequence, left out), ``y``
    ``(B,)``. Each level weighs a mean by its tokens (``n_b`` for a sequence, ``N_c = sum_{b in c} n_b`` for a
    class, ``m_c`` the mean of the class's tokens), which keeps the split exact:
    ``sum ||x - mu||^2 = sum ||x_{b,i} - x_bar_b||^2 + sum_b n_b ||x_bar_b - m_{y_b}||^2 + sum_c N_c ||m_c - mu||^2``;
    with equal lengths it is :func:`anova_decomposition`'s. Accumulated in float64 (float32 on MPS)."""
    tokens = tokens.to(_wide_dtype(tokens))
    keep = lengths > 0
    n = lengths[keep].to(tokens.dtype)  # (B', )
    seq = torch.repeat_interleave(torch.arange(n.shape[0], device=tokens.device), lengths[keep])  # (N,)
    N, D = tokens.shape
    seq_mean = tokens.new_zeros(n.shape[0], D).index_add_(0, seq, tokens) / n.unsqueeze(-1)  # (B', D)
    _, inv, _ = torch.unique(y[keep], return_inverse=True, return_counts=True)
    K = int(inv.max()) + 1 if inv.numel() else 0
    class_n = n.new_zeros(K).index_add_(0, inv, n)  # tokens per class
    class_mean = tokens.new_zeros(K, D).index_add_(0, inv, seq_mean * n.unsqueeze(-1)) / class_n.unsqueeze(-1)
    mu = tokens.mean(dim=0)
    within = (tokens - seq_mean[seq]).pow(2).sum() / N
    between_seq = (n.unsqueeze(-1) * (seq_mean - class_mean[inv]).pow(2)).sum() / N
    between_class = (class_n.unsqueeze(-1) * (class_mean - mu).pow(2)).sum() / N
    total = (tokens - mu).pow(2).sum() / N
    values = torch.stack([total, within, between_seq, between_class]).tolist()
    return AnovaSplit(*values, num_classes=K)


# ----------------------------------------------------------------------------------------
# Neural Collapse (Papyan, Han & Donoho 2020) and next-token separability
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NeuralCollapse:
    r"""Neural Collapse statistics of labelled features (see ``neural_collapse``).

    Args:
        num_classes: number of classes ``C`` used.
        nc1: ``tr(S_W S_B^+) / C``; 0 when every feature equals its class mean, ``inf`` when the
            class means coincide while the features spread around them (no collapse at all).
        equinorm: ``std_c ||m_c - mu|| / mean_c ||m_c - mu||``; 0 for equal norms.
        equiangularity: ``std_{c < c'} cos(m_c - mu, m_c' - mu)``; 0 for equal angles.
        max_angle: ``mean_{c < c'} |cos(m_c - mu, m_c' - mu) + 1/(C-1)|``; 0 for a simplex.
        etf_distance: Frobenius distance of the normalised Gram matrix of the normalised
            centred class means to that of a simplex ETF; 0 for a simplex ETF.
        ncc_agreement: agreement of the nearest-class-centre classifier with the given
            predictions (NC4), or its accuracy on the labels if none were given.
    """

    num_classes: int
    nc1: float
    equinorm: float
    equiangularity: float
    max_angle: float
    etf_distance: float
    ncc_agreement: float

    def as_dict(self) -> dict[str, float]:
        """Fields as a ``dict`` (for JSON logs)."""
        return dict(asdict(self))


def _class_statistics(H: Tensor, inv: Tensor, K: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Class counts ``(K,)``, class means ``(K, D)``, global mean ``(D,)``, residuals ``(n, D)``.

    The global mean is the count-weighted mean of the class means taken around the first, ``m_0 + sum_c n_c (m_c -
    m_0) / n``: where the class means coincide it is exactly that mean, so the centred means are exactly 0
    (``H.mean`` rounded apart from them: float64 features of three classes with one mean had an NC1 of 3e30, not inf).
    """
    counts = torch.bincount(inv, minlength=K).to(H.dtype)  # (K,)
    means = H.new_zeros(K, H.shape[1]).index_add_(0, inv, H) / counts.unsqueeze(-1)
    mu = means[0] + (counts / counts.sum()) @ (means - means[0])
    return counts, means, mu, H - means[inv]


def _nc1(residual: Tensor, centred_means: Tensor, rtol: float) -> Tensor:
    r"""``tr(S_W S_B^+) / C`` with ``S_W = R^T R / n`` and ``S_B = M^T M / C``, in ``C``-dim space.

    With ``M = U diag(s) V^T``, ``S_B^+ = V diag(C / s^2) V^T`` on singular values above
    ``rtol * s_max`` (at most ``C - 1`` of them: the centred means are linearly dependent), so
    ``tr(S_W S_B^+) = sum_k (C / s_k^2) ||R v_k||^2 / n`` and no ``D x D`` matrix is formed.
    """
    if isinstance(rtol, bool) or not isinstance(rtol, numbers.Real) or not 0 <= rtol < 1:
        # rtol < 0 keeps zero singular values (an infinite S_B^+); NaN or rtol >= 1 keeps none (nc1 = inf)
        raise ValueError(f"rtol must be a number in [0, 1), got {rtol!r}")
    n = residual.shape[0]
    K = centred_means.shape[0]
    _, s, Vh = torch.linalg.svd(centred_means, full_matrices=False)  # s: (r,), Vh: (r, D)
    keep = (s > rtol * s[0]) & (torch.arange(s.shape[0], device=s.device) < K - 1)
    inv_eig = torch.where(keep, K / torch.where(keep, s, torch.ones_like(s)).pow(2), 0.0)
    projected = (residual @ Vh.T).pow(2).sum(dim=0) / n  # v_k^T S_W v_k, (r,)
    nc1 = (inv_eig * projected).sum() / K
    # coinciding class means with spread inside the classes: no collapse at all (the limit is +inf), not 0
    within = residual.pow(2).sum() / n
    return torch.where(keep.any() | (within == 0), nc1, torch.full_like(nc1, float("inf")))


def neural_collapse(
    H: Tensor,
    y: Tensor,
    predictions: Tensor | None = None,
    rtol: float | None = None,
) -> NeuralCollapse:
    r"""Neural Collapse metrics NC1, NC2 and NC4 of Papyan, Han & Donoho (PNAS 2020).

    For features ``h_i`` with labels ``y_i`` in ``C`` classes, class means ``m_c``, global mean
    ``mu = (1/n) sum_i h_i``, ``S_W = (1/n) sum_i (h_i - m_{y_i})(h_i - m_{y_i})^T`` and
    ``S_B = (1/C) sum_c (m_c - mu)(m_c - mu)^T``:

    - NC1 (variability collapse): ``tr(S_W S_B^+) / C`` with the Moore-Penrose
      pseudo-inverse on singular values above ``rtol`` relative to the largest.
    - NC2 (simplex ETF), on the centred means ``m_c - mu``: ``equinorm`` = std/mean of their
      norms; ``equiangularity`` = std of their pairwise cosines; ``max_angle`` =
      mean ``|cos + 1/(C-1)|``; ``etf_distance`` =
      ``|| G / ||G||_F - (I - 11^T/C) / ||I - 11^T/C||_F ||_F`` with ``G = M M^T`` the Gram
      matrix of the normalised centred means (rows of ``M``; ``||I - 11^T/C||_F = sqrt(C-1)``).
      Normalising each mean makes ``etf_distance`` depend on angles only; norms are
      measured by ``equinorm``. Standard deviations are population ones (divide by the
      count); a centred mean of norm 0 has cosine 0 with all others.
    - NC4 (nearest-class-centre): fraction of samples where
      ``argmin_c ||h_i - m_c||`` equals ``predictions`` (the network's own predictions;
      Papyan et al. report the mismatch ``1 - agreement``); without ``predictions`` it is the
      accuracy of the NCC classifier on ``y``.

    Sequence means (mean token per sequence) are the features used by Zhang & Papyan
    (arXiv 2602.09297). Computed in float64 (float32 on MPS); classes are the distinct
    values of ``y``.

    Args:
        H: features, one row per sample.
        y: integer labels; at least 2 distinct classes.
        predictions: predicted labels in the same label space as ``y``.
        rtol: relative cut-off for the pseudo-inverse, in ``[0, 1)``; default
            ``max(C, D) * eps`` of ``H.dtype``.

    Shapes:
        H: ``(n, D)``; y, predictions: ``(n,)``.

    Examples:
        >>> H = torch.tensor([[1.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0]])
        >>> nc = neural_collapse(H, torch.tensor([0, 0, 1, 1]))
        >>> nc.nc1, nc.equinorm, nc.etf_distance, nc.ncc_agreement
        (0.0, 0.0, 0.0, 1.0)
    """
    _check_float(H, "H", (2,), "(n, D)")
    n, D = H.shape
    y = _check_labels(y, n, "y", "row of H", H.device)
    if predictions is not None:
        predictions = _check_labels(predictions, n, "predictions", "row of H", H.device)
    classes, inv = torch.unique(y, return_inverse=True)
    K = classes.shape[0]
    if K < 2:
        raise ValueError(f"neural_collapse needs at least 2 classes, got {K}")
    if rtol is None:
        rtol = max(K, D) * torch.finfo(H.dtype).eps
    eps = torch.finfo(H.dtype).eps
    # every statistic is scale-free: float64 features of |h| > 1e154 squared to inf and of |h| < 1e-162 to 0 (NaN)
    H = _unit_scale(H.to(_wide_dtype(H)), dim=(0, 1))
    _, means, mu, residual = _class_statistics(H, inv, K)
    centred = means - mu  # (K, D)
    nc1 = _nc1(residual, centred, rtol)

    norms = centred.norm(dim=-1)  # (K,)
    equinorm = _safe_div(norms.std(correction=0), norms.mean())
    nonzero = norms > eps * norms.max()  # a mean at the global mean has no direction
    # divided by the norm itself where it counts: clamp_min(1e-30) left the means of features of scale 1e-32 of norm
    # ~1e-2, not 1 (cosines ~0: a wrong equiangularity, max_angle and etf_distance)
    unit = torch.where(nonzero.unsqueeze(-1), centred / torch.where(nonzero, norms, 1.0).unsqueeze(-1), 0.0)
    gram = unit @ unit.T  # (K, K)
    iu = torch.triu_indices(K, K, offset=1, device=H.device)
    cosines = gram[iu[0], iu[1]]
    equiangularity = cosines.std(correction=0)
    max_angle = (cosines + 1.0 / (K - 1)).abs().mean()
    etf = torch.eye(K, dtype=H.dtype, device=H.device) - 1.0 / K
    etf_distance = (_safe_div(gram, gram.norm()) - etf / (K - 1) ** 0.5).norm()

    nearest = classes[torch.cdist(H, means).argmin(dim=-1)]  # (n,)
    reference = y if predictions is None else predictions
    agreement = (nearest == reference).to(H.dtype).mean()
    values = torch.stack([nc1, equinorm, equiangularity, max_angle, etf_distance, agreement])
    return NeuralCollapse(K, *values.tolist())


def next_token_nc1(
    tokens: Tensor,
    next_token: Tensor,
    min_count: int = 2,
    ignore_index: int | None = None,
    rtol: float | None = None,
) -> float:
    r"""NC1 of token representations grouped by the token that follows them.

    ``NC1 = tr(S_W S_B^+) / C`` (Papyan, Han & Donoho 2020; see ``neural_collapse``) with
    class ``c`` = next-token id: small values mean that contexts predicting the same token
    are tightly clustered and separated from the others, the language-model analogue of
    Neural Collapse used by Zhang & Papyan (arXiv 2602.09297). Classes with fewer than
    ``min_count`` examples are dropped before computing the statistics (a singleton class
    has no within-class spread and would only dilute ``S_W``).

    Args:
        tokens: token representations; ``(B, T, D)`` is flattened to ``(B T, D)``.
        next_token: id of the next token for each row of ``tokens``.
        min_count: minimum number of examples for a class to be kept (``>= 1``).
        ignore_index: id to drop before counting (e.g. ``-100`` padding targets).
        rtol: pseudo-inverse cut-off, as in ``neural_collapse``.

    Shapes:
        tokens: ``(N, D)`` or ``(B, T, D)``; next_token: ``(N,)`` or ``(B, T)``.

    Examples:
        >>> tokens = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [5.0, 5.0]])
        >>> next_token_nc1(tokens, torch.tensor([7, 7, 3, 3, 9]), min_count=2)
        0.0
    """
    _check_float(tokens, "tokens", (2, 3), "(N, D) or (B, T, D)")
    if tokens.ndim == 3:
        B, T, D = tokens.shape
        if not isinstance(next_token, Tensor) or next_token.shape != (B, T):
            got = tuple(next_token.shape) if isinstance(next_token, Tensor) else type(next_token)
            raise ValueError(f"next_token must have shape ({B}, {T}) to match tokens, got {got}")
        tokens, next_token = tokens.reshape(B * T, D), next_token.reshape(B * T)
    N, D = tokens.shape
    next_token = _check_labels(next_token, N, "next_token", "row of tokens", tokens.device)
    if not _is_int(min_count) or min_count < 1:
        raise ValueError(f"min_count must be an integer >= 1, got {min_count!r}")
    if ignore_index is not None:
        if not _is_int(ignore_index):  # a float such as 1.5 or -100.5 matches no id: nothing was dropped, silently
            raise TypeError(f"ignore_index must be an int or None, got {_value_type(ignore_index)} ({ignore_index!r})")
        keep = next_token.long() != ignore_index  # in int64: uint8 ids compared with -100 wrapped it to id 156
        tokens, next_token = tokens[keep], next_token[keep]
    _, inv, counts = torch.unique(next_token, return_inverse=True, return_counts=True)
    keep = counts[inv] >= min_count
    _, inv = torch.unique(inv[keep], return_inverse=True)
    K = int(counts.ge(min_count).sum())
    if K < 2:
        raise ValueError(
            f"next_token_nc1 needs at least 2 next-token classes with >= {min_count} examples, "
            f"got {K}"
        )
    if rtol is None:
        rtol = max(K, D) * torch.finfo(tokens.dtype).eps
    H = _unit_scale(tokens[keep].to(_wide_dtype(tokens)), dim=(0, 1))  # scale-free, as neural_collapse
    _, means, mu, residual = _class_statistics(H, inv, K)
    return float(_nc1(residual, means - mu, rtol))


# ----------------------------------------------------------------------------------------
# Linear probe
# ----------------------------------------------------------------------------------------


def linear_probe_accuracy(
    features: Tensor,
    labels: Tensor,
    *,
    train_fraction: float = 0.8,
    seed: int = 0,
    ridge: float = 1e-3,
    train_mask: Tensor | None = None,
) -> float:
    r"""Held-out accuracy of a closed-form ridge-regression probe on one-hot targets.

    On the training rows, with features and one-hot targets centred by their training
    means (this fits the intercept), the probe is

    ``W = argmin ||X W - Y||_F^2 + lam ||W||_F^2 = (X^T X + lam I)^{-1} X^T Y``
    ``   = X^T (X X^T + lam I)^{-1} Y`` (dual form, used when ``n_train < D``),

    with ``lam = ridge * ||X||_F^2 / D`` (``ridge`` times the mean eigenvalue of ``X^T X``),
    which makes the probe invariant to rescaling the features. A held-out row is
    predicted as the training class with the largest score; rows whose class never occurs
    in training count as errors. The classical linear-probe protocol (Alain & Bengio 2016)
    with a least-squares classifier; no sklearn. Computed in float64 (float32 on MPS).

    Args:
        features: one row per example.
        labels: integer class of each row; at least 2 distinct classes in training.
        train_fraction: share of rows (chosen by a seeded random permutation) used for
            training; ignored if ``train_mask`` is given.
        seed: seed of the permutation (a CPU ``torch.Generator``; identical on all devices).
        ridge: relative ridge penalty ``> 0``.
        train_mask: explicit split, ``True`` for training rows.

    Shapes:
        features: ``(N, D)``; labels, train_mask: ``(N,)``.

    Examples:
        >>> x = torch.tensor([[-2.0], [-1.0], [1.0], [2.0], [-1.5], [1.5]])
        >>> y = torch.tensor([0, 0, 1, 1, 0, 1])
        >>> mask = torch.tensor([True, True, True, True, False, False])
        >>> linear_probe_accuracy(x, y, train_mask=mask)
        1.0
    """
    _check_float(features, "features", (2,), "(N, D)")
    N, D = features.shape
    labels = _check_labels(labels, N, "labels", "row of features", features.device)
    if isinstance(ridge, bool) or not isinstance(ridge, numbers.Real) or not ridge > 0:
        raise ValueError(f"ridge must be > 0 (a real number), got {ridge!r}")
    if not _is_int(seed):
        raise TypeError(f"seed must be an int (numpy ints too), got {type(seed).__name__} ({seed!r})")
    seed = int(seed)  # torch.Generator.manual_seed refuses numpy ints
    if train_mask is None:
        if isinstance(train_fraction, bool) or not isinstance(train_fraction, numbers.Real) \
                or not 0.0 < train_fraction < 1.0:  # a string: a bare "'<' not supported" TypeError
            raise ValueError(f"train_fraction must be in (0, 1) (a number), got {train_fraction!r}")
        if N < 2:
            raise ValueError(f"linear_probe_accuracy needs at least 2 rows to split, got {N}")
        n_train = min(max(round(train_fraction * N), 1), N - 1)
        generator = torch.Generator().manual_seed(seed)
        perm = torch.randperm(N, generator=generator).to(features.device)
        train_idx, test_idx = perm[:n_train], perm[n_train:]
    else:
        if not isinstance(train_mask, Tensor) or train_mask.dtype != torch.bool:
            got = train_mask.dtype if isinstance(train_mask, Tensor) else type(train_mask).__name__
            raise TypeError(f"train_mask must be a bool tensor, got {got}")
        if train_mask.shape != (N,):
            raise ValueError(f"train_mask must have shape ({N},), got {tuple(train_mask.shape)}")
        train_mask = train_mask.to(features.device)
        train_idx = train_mask.nonzero().squeeze(-1)
        test_idx = (~train_mask).nonzero().squeeze(-1)
        if train_idx.numel() == 0 or test_idx.numel() == 0:
            raise ValueError(
                f"train_mask must select at least one training and one test row, got "
                f"{train_idx.numel()} training and {test_idx.numel()} test rows"
            )
    X = features.to(_wide_dtype(features))
    classes, y_train = torch.unique(labels[train_idx], return_inverse=True)
    K = classes.shape[0]
    if K < 2:
        raise ValueError(f"linear_probe_accuracy needs at least 2 classes in training, got {K}")
    Xtr = X[train_idx]
    x_mean = Xtr.mean(dim=0)
    Xtr = Xtr - x_mean  # (n, D)
    Y = F.one_hot(y_train, K).to(X.dtype)  # (n, K)
    y_mean = Y.mean(dim=0)
    Y = Y - y_mean
    n = Xtr.shape[0]
    lam = ridge * Xtr.pow(2).sum() / D
    lam = torch.where(lam > 0, lam, torch.ones_like(lam) * ridge)  # constant features
    if n < D:
        gram = Xtr @ Xtr.T + lam * torch.eye(n, dtype=X.dtype, device=X.device)
        W = Xtr.T @ torch.linalg.solve(gram, Y)  # (D, K)
    else:
        gram = Xtr.T @ Xtr + lam * torch.eye(D, dtype=X.dtype, device=X.device)
        W = torch.linalg.solve(gram, Xtr.T @ Y)  # (D, K)
    scores = (X[test_idx] - x_mean) @ W + y_mean  # (n_test, K)
    predicted = classes[scores.argmax(dim=-1)]
    return float((predicted == labels[test_idx]).to(X.dtype).mean())
