r"""Pre-norm transformer blocks and the per-layer head composition.

A block is the two-line pre-norm residual of ViT / GPT-2:

.. math::
    x \leftarrow x + \mathrm{DropPath}(\gamma_1 \odot \mathrm{Attn}(\mathrm{Norm}_1(x))), \qquad
    x \leftarrow x + \mathrm{DropPath}(\gamma_2 \odot \mathrm{MLP}(\mathrm{Norm}_2(x))),

with optional LayerScale :math:`\gamma` (Touvron et al., 2021) and stochastic depth
(Huang et al., 2016). The attention is a :class:`~diffusionformer.nn.DiffusionAttention`, so
each head can be attention, Laplacian, heat, PPR or a learned polynomial.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable

import torch
from torch import Tensor, nn

from diffusionformer.config import _check_flag, _choice_hint
from diffusionformer.graph.core import AttentionGraph
from diffusionformer.nn._factory import _cast_part, _check_factory, _on_device
from diffusionformer.nn._skip import is_noop
from diffusionformer.nn._weights import _reset_children
from diffusionformer.nn.attention import DiffusionAttention, _not_a_tensor
from diffusionformer.nn.heads import _layout_as_read
from diffusionformer.nn.heads import resolve_layer_heads  # noqa: F401  (re-exported: its historical home)
from diffusionformer.ops._checks import _in_vmap, check_dropout

__all__ = ["Block", "DropPath", "GatedMlp", "LayerScale", "Mlp", "make_mlp", "make_norm"]


def make_norm(norm: str | Callable[[int], nn.Module], dim: int) -> nn.Module:
    """Build a normalisation layer: ``"layernorm"``, ``"rmsnorm"`` or a callable ``dim -> Module``.

    Examples:
        >>> make_norm("rmsnorm", 8)
        RMSNorm((8,), eps=None, elementwise_affine=True)
    """
    return _make_norm(norm, dim, None, None)


def _make_norm(norm: str | Callable[[int], nn.Module], dim: int, device: torch.device | None,
               dtype: torch.dtype | None) -> nn.Module:
    """:func:`make_norm` with torch's factory arguments (checked by the caller, :func:`_check_factory`): a named norm
    is built with them, a callable's module under ``with torch.device(device)`` and cast to ``dtype``."""
    # else dim=0 builds a LayerNorm(0) silently, -1 is torch's "negative dimension" and 1.5 "'float' object is not
    # iterable", none naming dim
    dim = _check_width(dim, "make_norm: dim")
    if isinstance(norm, nn.Module):  # else norm(dim) runs its forward on the int: "argument 'input' must be Tensor"
        raise TypeError(f"norm must be 'layernorm', 'rmsnorm' or a callable dim -> Module (a class or factory, "
                        f"called with dim), got the instance {norm!r}")
    if callable(norm) and not isinstance(norm, str):
        with _on_device(device):
            return _cast_part(_checked_module(norm(dim), "norm"), device, dtype)
    if not isinstance(norm, str):
        raise TypeError(f"norm must be 'layernorm', 'rmsnorm' or a callable, got {type(norm).__name__}")
    key = _name_key(norm)
    if key == "layernorm":
        return nn.LayerNorm(dim, device=device, dtype=dtype)
    if key == "rmsnorm":
        return nn.RMSNorm(dim, device=device, dtype=dtype)
    raise ValueError(f"unknown norm {norm!r}{_choice_hint(key, ('layernorm', 'rmsnorm'))}; expected 'layernorm' or 'rmsnorm'")


def _checked_module(built: object, name: str) -> nn.Module:
    """What the callable ``name`` built, when it is an ``nn.Module`` (a layer calls its parts through ``_modules``,
    where a plain function is missing: ``KeyError('norm1')`` at the first call), else a TypeError naming it."""
    if not isinstance(built, nn.Module):
        raise TypeError(f"{name} must be a callable dim -> Module, and it returned {type(built).__name__} ({built!r})")
    return built


def _check_width(dim: object, name: str) -> int:
    """A layer width as a Python int >= 1 (numpy ints too), else a ValueError naming it: ``nn.Linear`` and
    ``torch.full`` fail on a str or float with "argument 'size' ...", and build a module of width 0 silently."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim < 1:
        raise ValueError(f"{name} must be a positive int, got {dim!r}")
    return int(dim)


def _check_rate(p: object, name: str) -> float:
    """A dropout rate of :class:`torch.nn.Dropout` as a float in ``[0, 1]`` (numpy reals too), else a ValueError
    naming it: ``nn.Dropout`` accepts NaN and fails only at the first training step."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {p!r}")
    return float(p)


def _mlp_arguments(where: str, dim: Any, hidden_dim: Any, default: Callable[[int], int], bias: Any, dropout: Any,
                   act_layer: Any, example: str) -> tuple[int, int, float]:
    """An MLP constructor's ``(dim, hidden_dim, dropout)`` checked, as Python numbers (a sweep's numpy ones too);
    ``hidden_dim=None`` takes ``default(dim)``; ``where`` names the class in the errors, ``example`` an activation
    class for the message refusing an instance."""
    dim = _check_width(dim, f"{where}: dim")
    if not isinstance(act_layer, type) and isinstance(act_layer, nn.Module):  # act_layer() would call its forward
        raise TypeError(f"{where}: act_layer must be a module class such as {example} (it is instantiated here), "
                        f"got the instance {act_layer!r}")
    if hidden_dim is None:
        hidden_dim = default(dim)
    elif isinstance(hidden_dim, bool) or not isinstance(hidden_dim, numbers.Integral) or hidden_dim < 1:
        raise ValueError(f"{where}: hidden_dim must be a positive int or None, got {hidden_dim!r}")
    _check_flag(bias, f"{where}: bias")
    return dim, int(hidden_dim), _check_rate(dropout, f"{where}: dropout")


class Mlp(nn.Module):
    r"""Two-layer perceptron :math:`W_2\, \sigma(W_1 x + b_1) + b_2` with GELU and dropout.

    Args:
        dim: input and output width ``D``.
        hidden_dim: hidden width (default ``4 D``).
        bias: biases in both layers.
        dropout: dropout after the second layer.
        act_layer: activation module class.
        device: where the parameters are created (torch's factory argument; ``"meta"`` allocates nothing).
        dtype: floating-point dtype the layers are initialised in (as :class:`torch.nn.Linear`'s); an activation
            with parameters is built in the default dtype and cast.

    Shapes:
        ``(..., D) -> (..., D)``.
    """

    def __init__(self, dim: int, hidden_dim: int | None = None, *, bias: bool = True, dropout: float = 0.0,
                 act_layer: type[nn.Module] = nn.GELU, device: torch.device | str | int | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        dim, hidden_dim, dropout = _mlp_arguments("Mlp", dim, hidden_dim, lambda d: 4 * d, bias, dropout, act_layer,
                                                   "nn.GELU")
        device, dtype = _check_factory(device, dtype, "Mlp")
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias, device=device, dtype=dtype)
        with _on_device(device):
            self.act = _cast_part(act_layer(), device, dtype)
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias, device=device, dtype=dtype)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.act(self.fc1(x))))

    def reset_parameters(self) -> None:
        """Both layers initialised again, in place, as the constructor did (:meth:`torch.nn.Linear.reset_parameters`)."""
        _reset_children(self, type(self).__name__)


class GatedMlp(nn.Module):
    r"""Gated-linear-unit MLP :math:`W_2\,\big(\sigma(W_g x) \odot W_u x\big)` with dropout (Shazeer, "GLU
    Variants Improve Transformer", 2020): SwiGLU with ``act_layer=nn.SiLU`` (LLaMA's MLP), GEGLU with
    ``nn.GELU``.

    ``fc1`` holds :math:`W_g` and :math:`W_u` stacked (rows ``[:hidden_dim]`` the gate, ``[hidden_dim:]`` the
    up projection: one matrix product), ``fc2`` is :math:`W_2`, the residual projection that GPT-2's
    initialisation scales (:func:`~diffusionformer.models.init_transformer_weights`) as :class:`Mlp`'s.

    Args:
        dim: input and output width ``D``.
        hidden_dim: gated width (default ``int(8 D / 3)``: about the parameters of a ``4 D`` :class:`Mlp`, LLaMA's
            choice before its rounding).
        bias: biases in both layers.
        dropout: dropout after the second layer.
        act_layer: activation module class of the gate.
        device: where the parameters are created (torch's factory argument; ``"meta"`` allocates nothing).
        dtype: floating-point dtype the layers are initialised in (as :class:`torch.nn.Linear`'s); an activation
            with parameters is built in the default dtype and cast.

    Shapes:
        ``(..., D) -> (..., D)``.

    Examples:
        >>> mlp = GatedMlp(6, 4)
        >>> mlp.fc1.weight.shape, mlp(torch.randn(2, 6)).shape
        (torch.Size([8, 6]), torch.Size([2, 6]))
    """

    def __init__(self, dim: int, hidden_dim: int | None = None, *, bias: bool = True, dropout: float = 0.0,
                 act_layer: type[nn.Module] = nn.SiLU, device: torch.device | str | int | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        dim, hidden_dim, dropout = _mlp_arguments("GatedMlp", dim, hidden_dim, lambda d: max(1, 8 * d // 3), bias,
                                                   dropout, act_layer, "nn.SiLU")
        device, dtype = _check_factory(device, dtype, "GatedMlp")
        self.hidden_dim = hidden_dim
        self.fc1 = nn.Linear(dim, 2 * hidden_dim, bias=bias, device=device, dtype=dtype)
        with _on_device(device):
            self.act = _cast_part(act_layer(), device, dtype)
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias, device=device, dtype=dtype)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.fc1(x).chunk(2, dim=-1)
        return self.drop(self.fc2(self.act(gate) * up))

    def reset_parameters(self) -> None:
        """Both layers initialised again, in place, as the constructor did (:meth:`torch.nn.Linear.reset_parameters`)."""
        _reset_children(self, type(self).__name__)


#: ``mlp_layer`` names of :class:`Block` (and the model configs' ``mlp``): the classic GELU MLP, SwiGLU, GEGLU
_MLP_KINDS = ("gelu", "swiglu", "geglu")


def _name_key(name: str) -> str:
    """A norm or MLP name as :func:`make_norm` and :func:`make_mlp` read it (case, ``_`` and ``-`` ignored):
    ``"SwiGLU"`` is ``"swiglu"``, ``"RMS_Norm"`` is ``"rmsnorm"``."""
    return name.lower().replace("_", "").replace("-", "")


def _names_as_read(config: dict[str, Any]) -> dict[str, Any]:
    """A model config as a dict, with ``norm`` and ``mlp`` (:func:`_name_key`) and the head specs of ``heads``
    (:func:`~diffusionformer.nn.heads._layout_as_read`: ``"Attention:2, I-P:2"`` is ``"attention:2,laplacian:2"``)
    as the configs record them: a run identity or a checkpoint's model record written while they were kept as spelt
    names the same model."""
    return {k: _name_key(v) if k in ("norm", "mlp") and isinstance(v, str) else _layout_as_read(v) if k == "heads"
            else v for k, v in config.items()}


def make_mlp(kind: str, dim: int, mlp_ratio: float, *, bias: bool = True, dropout: float = 0.0) -> nn.Module:
    """The MLP ``kind`` names (``"gelu"``, ``"swiglu"``, ``"geglu"``; case, ``_`` and ``-`` ignored): ``"gelu"`` a :class:`Mlp` of width ``int(dim * mlp_ratio)``;
    ``"swiglu"``/``"geglu"`` a :class:`GatedMlp` of width ``int(2 dim mlp_ratio / 3)`` (at least 1), which
    holds about the parameters of the GELU MLP of the same ratio (LLaMA's 2/3; the weight matrices exactly when 3
    divides ``dim * mlp_ratio``, the gated first layer's bias a third wider).

    Examples:
        >>> make_mlp("swiglu", 12, 4.0).fc1.weight.shape      # gate and up: 2 x 32 rows
        torch.Size([64, 12])
    """
    return _make_mlp(kind, dim, mlp_ratio, bias, dropout, None, None)


def _make_mlp(kind: str, dim: int, mlp_ratio: float, bias: bool, dropout: float, device: torch.device | None,
              dtype: torch.dtype | None) -> nn.Module:
    """:func:`make_mlp` with torch's factory arguments (checked by the caller), passed to the MLP."""
    if not isinstance(kind, str):
        raise TypeError(f"make_mlp: kind must be one of {_MLP_KINDS}, got {type(kind).__name__} ({kind!r})")
    key = _name_key(kind)
    # else a negative ratio built a width-1 gated MLP without a word, NaN failed in int(), and the GELU MLP's
    # error named hidden_dim: Block's check, for make_mlp called alone
    if isinstance(mlp_ratio, bool) or not isinstance(mlp_ratio, numbers.Real) or not 0 < mlp_ratio < float("inf"):
        raise ValueError(f"make_mlp: mlp_ratio must be a positive, finite float, got {mlp_ratio!r}")
    dim = _check_width(dim, "make_mlp: dim")
    if int(dim * mlp_ratio) < 1:  # as Block and the configs refuse it, for every kind (not a width-1 gated MLP)
        raise ValueError(f"make_mlp: mlp_ratio={mlp_ratio!r} gives an MLP width int(dim * mlp_ratio) = "
                         f"{int(dim * mlp_ratio)} for dim={dim}; expected a width >= 1")
    if key == "gelu":
        return Mlp(dim, int(dim * mlp_ratio), bias=bias, dropout=dropout, device=device, dtype=dtype)
    if key in ("swiglu", "geglu"):
        return GatedMlp(dim, max(1, int(2 * dim * mlp_ratio / 3)), bias=bias, dropout=dropout,
                        act_layer=nn.SiLU if key == "swiglu" else nn.GELU, device=device, dtype=dtype)
    raise ValueError(f"unknown mlp kind {kind!r}{_choice_hint(key, _MLP_KINDS)}; expected one of {_MLP_KINDS}")


class LayerScale(nn.Module):
    r"""Per-channel residual gain :math:`\gamma \odot x` initialised at ``init`` (CaiT).

    Args:
        dim: width ``D``.
        init: the initial gain of every channel.
        device: where ``gamma`` is created (torch's factory argument; ``"meta"`` allocates nothing).
        dtype: floating-point dtype of ``gamma``.

    Shapes:
        ``(..., D) -> (..., D)``.
    """

    def __init__(self, dim: int, init: float = 1e-5, *, device: torch.device | str | int | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        dim = _check_width(dim, "LayerScale: dim")
        if isinstance(init, bool) or not isinstance(init, numbers.Real) or not math.isfinite(init):  # numpy reals too
            raise ValueError(f"LayerScale: init (layer_scale) must be a finite float, got {init!r}")
        device, dtype = _check_factory(device, dtype, "LayerScale")
        self._init = float(init)
        self.gamma = nn.Parameter(torch.full((dim,), self._init, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """``gamma`` back to ``init`` in every channel, in place."""
        self.gamma.fill_(self._init)

    def extra_repr(self) -> str:
        # print(model) showed a bare "LayerScale()": neither the width nor the init (1e-5 vs 0.1) it was built with
        return f"{self.gamma.shape[-1]}, init={self._init}"


class DropPath(nn.Module):
    r"""Stochastic depth: drop the whole residual branch of a sample with probability ``p``.

    Kept samples are scaled by ``1 / (1 - p)``; identity in eval mode.

    Shapes:
        ``(B, ...) -> (B, ...)`` (sparse inputs ``(N, D)`` are treated as one sample).
    """

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = check_dropout(p, "drop path probability")

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        # the attribute is settable (a stochastic-depth schedule): 1.0 gave x * 0 / 0 = NaN everywhere, and -0.5 was
        # refused by bernoulli_ as "p=1.5"
        p = check_dropout(self.p, "DropPath.p")
        shape = (x.shape[0],) + (1,) * (x.dim() - 1) if x.dim() > 2 else (1,) * x.dim()  # keeps x's shape
        if not torch.compiler.is_compiling() and _in_vmap():
            # vmap(randomness="different") refuses in-place randomness on the unbatched mask ("Cannot ask for different
            # inplace randomness on an unbatched tensor"), x batched or not (Monte Carlo samples of one input: vmap
            # over a dummy); out of place it draws one per sample. Only under vmap:
            # bernoulli of a tensor of probabilities draws other float32 bits than bernoulli_(p) (torch.func.grad
            # under a seed draws the mask loss.backward() does)
            keep = torch.bernoulli(torch.full(shape, 1 - p, device=x.device, dtype=x.dtype))
        else:
            keep = torch.empty(shape, device=x.device, dtype=x.dtype).bernoulli_(1 - p)
        return x * keep / (1 - p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Block(nn.Module):
    """Pre-norm transformer block with a :class:`DiffusionAttention` and an MLP.

    Args:
        dim: width ``D``.
        num_heads: ``H``.
        heads: head operators of this layer (see :class:`DiffusionAttention`).
        mlp_ratio: MLP hidden width as a multiple of ``D``.
        causal: causal attention.
        qk_norm: LayerNorm on queries and keys.
        bias: biases in projections and MLP.
        dropout: dropout after the attention output projection and the MLP.
        attn_dropout: dropout on attention probabilities.
        drop_path: stochastic-depth probability.
        layer_scale: LayerScale init value, or ``None`` for none.
        norm_layer: ``"layernorm"``, ``"rmsnorm"`` or a callable ``dim -> Module``.
        mlp_layer: ``"gelu"`` (the default :class:`Mlp`), ``"swiglu"`` or ``"geglu"`` (a :class:`GatedMlp`
            of about the same parameter count, :func:`make_mlp`), or a callable ``dim -> Module``.
        backend: dense back-end of the attention.
        num_kv_heads: key/value heads of the attention (grouped-query attention; ``None`` = ``num_heads``).
        rotary: rotary embedding applied to the attention's ``q`` and ``k`` (:mod:`diffusionformer.nn.rotary`).
        device: where the parameters and buffers are created (torch's factory argument, as
            :class:`torch.nn.TransformerEncoderLayer`'s; ``"meta"`` allocates nothing: ``to_empty`` then
            :meth:`reset_parameters`). Passed to every part; a ``norm_layer`` or ``mlp_layer`` callable's module is
            built under ``with torch.device(device)``.
        dtype: floating-point dtype of the parameters, passed to every part (see :class:`DiffusionAttention`); a
            ``norm_layer`` or ``mlp_layer`` callable's module is built in the default dtype and cast.

    Shapes:
        ``x``: ``(B, N, D)`` dense or ``(N, D)`` with a sparse graph (or ``edge_index``) -> same shape.

    Examples:
        >>> blk = Block(16, 4, heads="attention:3,laplacian:1")
        >>> blk(torch.randn(2, 5, 16)).shape
        torch.Size([2, 5, 16])
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        heads: Any = None,
        *,
        mlp_ratio: float = 4.0,
        causal: bool = False,
        qk_norm: bool = False,
        bias: bool = True,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        drop_path: float = 0.0,
        layer_scale: float | None = None,
        norm_layer: str | Callable[[int], nn.Module] = "layernorm",
        mlp_layer: str | Callable[[int], nn.Module] | None = None,
        backend: str = "auto",
        num_kv_heads: int | None = None,
        rotary: nn.Module | None = None,
        device: torch.device | str | int | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        dim = _check_width(dim, "dim")  # else an error from mlp_ratio's check; a numpy int from a sweep: an int here
        if mlp_layer is not None and not callable(mlp_layer) and not isinstance(mlp_layer, str):
            # else "'int' object is not callable"
            raise TypeError(f"mlp_layer must be None, one of {_MLP_KINDS} or a callable dim -> Module, "
                            f"got {type(mlp_layer).__name__}")
        if isinstance(mlp_layer, nn.Module):  # else mlp_layer(dim) runs its forward on the int
            raise TypeError(f"mlp_layer must be None, one of {_MLP_KINDS} or a callable dim -> Module (a class or "
                            f"factory, called with dim), "
                            f"got the instance {mlp_layer!r}")
        if isinstance(mlp_ratio, bool) or not isinstance(mlp_ratio, numbers.Real):
            raise TypeError(f"mlp_ratio must be a float, got {type(mlp_ratio).__name__} ({mlp_ratio!r})")
        dropout = _check_rate(dropout, "dropout")
        if not 0 < mlp_ratio < float("inf") or int(dim * mlp_ratio) < 1:
            raise ValueError(f"mlp_ratio must be positive and finite with an MLP width int(dim * mlp_ratio) >= 1, "
                             f"got {mlp_ratio} for dim={dim}")
        device, dtype = _check_factory(device, dtype, "Block")
        factory = {"device": device, "dtype": dtype}
        self.norm1 = _make_norm(norm_layer, dim, device, dtype)
        self.attn = DiffusionAttention(dim, num_heads, heads, causal=causal, qk_norm=qk_norm, bias=bias,
                                       dropout=attn_dropout, backend=backend, num_kv_heads=num_kv_heads,
                                       rotary=rotary, **factory)
        self.drop1 = nn.Dropout(dropout)
        self.ls1 = LayerScale(dim, layer_scale, **factory) if layer_scale is not None else nn.Identity()
        self.norm2 = _make_norm(norm_layer, dim, device, dtype)
        if mlp_layer is None or isinstance(mlp_layer, str):
            self.mlp = _make_mlp("gelu" if mlp_layer is None else mlp_layer, dim, mlp_ratio, bias, dropout, device,
                                 dtype)
        else:
            with _on_device(device):
                self.mlp = _cast_part(_checked_module(mlp_layer(dim), "mlp_layer"), device, dtype)
        self.ls2 = LayerScale(dim, layer_scale, **factory) if layer_scale is not None else nn.Identity()
        # != 0, not > 0: a negative or NaN rate reaches DropPath's range check instead of switching stochastic depth off
        self.drop_path = DropPath(drop_path) if drop_path != 0 else nn.Identity()

    def reset_parameters(self) -> None:
        """Initialise the block's parameters again, in place, as its constructor did: each part (norms,
        attention with its operators, LayerScale, MLP) by its ``reset_parameters``, in construction order, so
        that under one seed the block holds the values of a block built anew. A custom ``norm_layer`` or
        ``mlp_layer`` module with parameters must define ``reset_parameters`` (else a TypeError names it).
        """
        _reset_children(self, type(self).__name__)

    def forward(self, x: Tensor, graph: AttentionGraph | Tensor | None = None, **attn_kwargs: Any) -> Tensor:
        """``x`` after the block; ``graph`` (or the shorthands of :meth:`DiffusionAttention.forward`) goes to the attention.

        ``ls1``, ``ls2`` and ``drop_path`` that are off (hook-free ``nn.Identity``) are skipped, not
        called (:func:`~diffusionformer.nn._skip.is_noop`): the same result for a module call less each.
        """
        if not isinstance(x, Tensor):  # else the norm's "argument 'input' must be Tensor, not tuple"
            raise _not_a_tensor(x, "Block: ")
        if isinstance(x, Tensor) and not x.is_floating_point():  # else "mixed dtype (CPU)" from the norm
            raise TypeError(f"Block: x must be a floating-point tensor, got {x.dtype}")
        if isinstance(x, Tensor) and x.dim() >= 1 and x.shape[-1] != self.attn.dim:  # else the norm's bare
            # "Given normalized_shape=[8], expected input with shape [*, 8]", naming neither the block nor dim
            raise ValueError(f"Block: x must have last dimension dim={self.attn.dim}, got shape {tuple(x.shape)}")
        if attn_kwargs.get("return_intermediates"):  # else dropout() refuses the (y, inter) tuple
            raise ValueError(f"Block: return_intermediates={attn_kwargs['return_intermediates']!r} is an argument of "
                             "DiffusionAttention, and a block returns its output only; call "
                             "block.attn(block.norm1(x), ..., return_intermediates=True) for the attention's intermediates")
        m = self._modules
        ls1, ls2, drop_path = m["ls1"], m["ls2"], m["drop_path"]
        y = m["drop1"](m["attn"](m["norm1"](x), graph, **attn_kwargs))
        if not is_noop(ls1):
            y = ls1(y)
        skip_path = is_noop(drop_path)
        x = x + (y if skip_path else drop_path(y))
        y = m["mlp"](m["norm2"](x))
        if not is_noop(ls2):
            y = ls2(y)
        return x + (y if skip_path else drop_path(y))
