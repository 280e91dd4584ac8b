r"""``DiffusionViT``: a vision transformer (images or 1-D signals) with diffusion heads."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from diffusionformer.config import _check_flag, _choice_hint, _python_numbers, document_fields
from diffusionformer.nn.block import Block, make_norm, resolve_layer_heads
from diffusionformer.nn.heads import _layout_as_read, _own_operators
from diffusionformer.nn._weights import _reset_children, _stored_weight
from diffusionformer.ops.rivals import LayerState
from diffusionformer.nn.rotary import RotaryEmbedding, RotaryEmbedding2D
from diffusionformer._modes import _evaluating
from diffusionformer.models.common import (ModelIntermediates, _check_block_options, _check_bools, _check_mlp_ratio, _check_rope_base,
                                           check_positive_int, check_probability, init_transformer_weights)

__all__ = ["DiffusionViT", "ViTConfig", "attention_rollout"]


@document_fields
@dataclass
class ViTConfig:
    """Configuration of :class:`DiffusionViT`.

    ``input_size`` of length 2 means images ``(C, H, W)``; of length 1, signals ``(T, C)``
    (e.g. MNIST-1D, ``(40, 1)``), cut into patches of ``patch_size`` samples.
    """

    input_size: tuple[int, ...] = (28, 28)  #: (H, W) for images, (T,) for 1-D signals
    in_channels: int = 1  #: image channels / signal features
    patch_size: int = 4  #: patch side (images) or length (signals); must divide input_size
    num_classes: int = 10  #: classifier outputs (0: no head, features only)
    dim: int = 64  #: width D
    depth: int = 4  #: number of blocks L
    num_heads: int = 4  #: heads per layer H
    mlp_ratio: float = 2.0  #: MLP hidden width / D
    pool: Literal["cls", "mean"] = "cls"  #: class token or mean of patch tokens
    qk_norm: bool = False  #: LayerNorm on queries and keys
    dropout: float = 0.0  #: dropout on residual branches and embeddings
    attn_dropout: float = 0.0  #: dropout on attention probabilities
    drop_path: float = 0.0  #: stochastic depth, linearly increasing to this value
    layer_scale: float | None = None  #: LayerScale init (None: off)
    norm: str = "layernorm"  #: "layernorm" (torch's eps 1e-5; timm's ViT uses 1e-6) or "rmsnorm"
    heads: Any = None  #: head spec for every layer, a per-layer list, or {layer: spec}; an operator is copied per layer
    laplacian_heads: int | str | list[int | str] | None = None  #: trailing Laplacian heads per layer; "half": H // 2
    backend: str = "auto"  #: dense back-end of the attention
    rope: bool = False  #: 2-D rotary q/k positions (1-D for signals) instead of the learned pos_embed
    rope_base: float = 100.0  #: RoPE frequency base
    mlp: str = "gelu"  #: MLP: "gelu", "swiglu" (gated SiLU) or "geglu"; gated ones 2/3 as wide (about the same parameters)

    def __post_init__(self) -> None:
        _python_numbers(self)  # a sweep grid's numpy numbers are read as Python numbers
        where = type(self).__name__  # DINOConfig's errors name DINOConfig
        if not isinstance(self.input_size, (tuple, list)):
            raise TypeError(f"{where}.input_size must be (H, W) or (T,) positive ints, got {self.input_size!r}")
        self.input_size = tuple(self.input_size)
        check_positive_int(where, in_channels=self.in_channels, patch_size=self.patch_size, dim=self.dim,
                           depth=self.depth, num_heads=self.num_heads)
        _check_mlp_ratio(where, self.dim, self.mlp_ratio)
        check_probability(where, dropout=self.dropout, attn_dropout=self.attn_dropout, drop_path=self.drop_path)
        if len(self.input_size) not in (1, 2) or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in self.input_size):
            raise ValueError(f"{where}.input_size must be (H, W) or (T,) positive ints, got {self.input_size}")
        if any(s % self.patch_size for s in self.input_size):
            raise ValueError(f"{where}.patch_size={self.patch_size} must divide input_size={self.input_size}")
        if self.dim % self.num_heads:
            raise ValueError(f"{where}: num_heads={self.num_heads} must divide dim={self.dim}")
        if isinstance(self.num_classes, bool) or not isinstance(self.num_classes, int):
            raise TypeError(f"{where}.num_classes must be an int >= 0 (0: no head), "
                            f"got {type(self.num_classes).__name__} {self.num_classes!r}")
        if self.num_classes < 0:
            raise ValueError(f"{where}.num_classes must be >= 0, got {self.num_classes}")
        if self.pool not in ("cls", "mean"):
            raise ValueError(f"{where}.pool must be 'cls' or 'mean', got {self.pool!r}{_choice_hint(self.pool, ('cls', 'mean'))}")
        resolve_layer_heads(self.depth, self.num_heads, self.heads, self.laplacian_heads)
        self.heads = _layout_as_read(self.heads)  # recorded as read, as norm and mlp: one spelling of one layout
        self.norm, self.mlp = _check_block_options(where, norm=self.norm, backend=self.backend,
                                                   layer_scale=self.layer_scale, mlp=self.mlp)
        _check_bools(where, qk_norm=self.qk_norm, rope=self.rope)
        multiple = 4 if len(self.input_size) == 2 else 2
        if self.rope and (self.dim // self.num_heads) % multiple:
            raise ValueError(f"{where}.rope: expected a head dim dim/num_heads divisible by {multiple}, "
                             f"got {self.dim // self.num_heads}")
        _check_rope_base(where, self.rope_base)

    @property
    def grid_size(self) -> tuple[int, ...]:
        """Patch grid: ``(H/p, W/p)`` or ``(T/p,)``."""
        return tuple(s // self.patch_size for s in self.input_size)

    @property
    def num_patches(self) -> int:
        return math.prod(self.grid_size)


class DiffusionViT(nn.Module):
    r"""Vision transformer whose heads are diffusion operators (Dosovitskiy et al., 2021 layout).

    .. math::
        z^0 = [x_{cls};\, x_p^1 E; \dots; x_p^T E] + E_{pos}, \quad z^l = \mathrm{Block}_l(z^{l-1}),
        \quad y = W\, \mathrm{pool}(\mathrm{Norm}(z^L))

    Args:
        config: a :class:`ViTConfig`.

    Shapes:
        images ``(B, C, H, W)`` or signals ``(B, T, C)`` -> logits ``(B, num_classes)``;
        :meth:`forward_tokens` -> ``(B, [1 +] num_patches, D)``; :meth:`forward_patch_tokens`
        -> ``(B, num_patches, D)`` (for self-supervised heads and PCA maps).

    Examples:
        >>> vit = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=2, dim=16, depth=2, num_heads=2,
        ...                              heads={1: "attention:1,heat(learnable=True, steps=3):1"}))
        >>> vit(torch.randn(3, 1, 8, 8)).shape
        torch.Size([3, 10])
        >>> vit.forward_patch_tokens(torch.randn(3, 1, 8, 8)).shape
        torch.Size([3, 16, 16])
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        if not isinstance(config, ViTConfig):
            raise TypeError(f"config must be a ViTConfig, got {type(config).__name__}")
        self.config = c = config
        specs = _own_operators(resolve_layer_heads(c.depth, c.num_heads, c.heads, c.laplacian_heads))
        conv = nn.Conv2d if len(c.input_size) == 2 else nn.Conv1d
        self.patch_embed = conv(c.in_channels, c.dim, kernel_size=c.patch_size, stride=c.patch_size)
        self.num_prefix = 1 if c.pool == "cls" else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.dim)) if c.pool == "cls" else None
        self.pos_embed = None if c.rope else nn.Parameter(torch.zeros(1, c.num_patches + self.num_prefix, c.dim))
        self.drop = nn.Dropout(c.dropout)
        rates = [c.drop_path * i / max(c.depth - 1, 1) for i in range(c.depth)]
        rope_cls = RotaryEmbedding2D if len(c.input_size) == 2 else RotaryEmbedding
        self.blocks = nn.ModuleList(
            Block(c.dim, c.num_heads, spec, mlp_ratio=c.mlp_ratio, qk_norm=c.qk_norm, dropout=c.dropout,
                  attn_dropout=c.attn_dropout, drop_path=r, layer_scale=c.layer_scale, norm_layer=c.norm,
                  backend=c.backend, rotary=rope_cls(c.dim // c.num_heads, c.rope_base) if c.rope else None,
                  mlp_layer=c.mlp)
            for spec, r in zip(specs, rates)
        )
        self.norm = make_norm(c.norm, c.dim)
        self.head = nn.Linear(c.dim, c.num_classes) if c.num_classes > 0 else nn.Identity()
        self._initialise()

    def _initialise(self) -> None:
        """GPT-2's initialisation (:func:`init_transformer_weights`), then truncated-normal position embedding
        and class token, std 0.02 (timm's position embedding; timm draws its class token from N(0, 1e-6) since
        v0.6); the patch convolution keeps torch's default initialisation, as timm's."""
        init_transformer_weights(self, self.config.depth)
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise every parameter again, in place, as the constructor did: each part's own
        ``reset_parameters`` in construction order (the patch embedding's, the blocks'), then the model's
        initialisation; under one seed the values of a model built anew."""
        _reset_children(self, type(self).__name__)
        self._initialise()

    def no_weight_decay(self) -> set[str]:
        """Parameters excluded from weight decay (timm convention)."""
        return {"pos_embed", "cls_token"} & {name for name, _ in self.named_parameters()}

    @torch.no_grad()
    def set_input_size(self, input_size: tuple[int, ...]) -> DiffusionViT:
        """Take inputs of another size from now on: ``config.input_size`` becomes ``input_size`` and the learned
        position embedding of the patch grid is resampled to the new grid, in place (a loaded model classifies
        larger or smaller images than it was trained on; the patch size and every weight but ``pos_embed`` stay).

        As timm's ``resample_abs_pos_embed``: bicubic over the 2-D grid of patch embeddings (``align_corners=False``,
        ``antialias=True``: PIL's cubic kernel, widened when shrinking), the class token's row kept as it is; a 1-D
        signal's grid is resampled along its length. A model with ``rope=True`` has no learned positions (its rotary
        positions follow the grid) and only takes the new size. ``pos_embed`` becomes a new tensor: an optimiser
        built before holds the old one. A :class:`~diffusionformer.models.DINO` has two backbones, the teacher's
        (``dino.backbone``) and the student's (``dino.student.backbone``): its EMA step needs both resized, and
        ``dino.config.input_size`` follows the student's.

        Args:
            input_size: ``(H, W)`` for images, ``(T,)`` for signals, each a multiple of ``patch_size``.

        Returns:
            the model itself.

        Shapes:
            pos_embed: ``(1, prefix + prod(grid), D)`` -> ``(1, prefix + prod(grid'), D)``, ``grid'`` the new
            ``input_size // patch_size`` (``prefix`` 1 with a class token, else 0).

        Raises:
            TypeError: ``input_size`` is not a tuple or list (a bare ``32``).
            ValueError: ``input_size`` is not a valid ``ViTConfig.input_size`` of this model (another number of
                dimensions, not positive ints, not a multiple of ``patch_size``).

        Examples:
            >>> vit = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=2, dim=16, depth=1, num_heads=2))
            >>> vit.set_input_size((12, 8)).pos_embed.shape   # 1 class token + a 6 x 4 grid
            torch.Size([1, 25, 16])
            >>> vit(torch.randn(3, 1, 12, 8)).shape
            torch.Size([3, 10])
        """
        import dataclasses

        old = self.config
        if isinstance(input_size, (tuple, list)) and len(input_size) != len(old.input_size):
            raise ValueError(f"DiffusionViT.set_input_size: expected an input_size of {len(old.input_size)} "
                             f"dimension(s) like {tuple(old.input_size)}, got {tuple(input_size)}")
        config = dataclasses.replace(old, input_size=input_size)  # its checks: a tuple of multiples of patch_size
        if self.pos_embed is not None and config.grid_size != old.grid_size:
            pos = self.pos_embed
            prefix, grid = pos[:, : self.num_prefix], pos[:, self.num_prefix :]
            grid = grid.to(torch.promote_types(grid.dtype, torch.float32))  # half weights resampled in float32
            size_from, size_to = [(1, *g) if len(g) == 1 else g for g in (old.grid_size, config.grid_size)]
            grid = grid.reshape(1, *size_from, -1).permute(0, 3, 1, 2)  # (1, D, gh, gw)
            grid = nn.functional.interpolate(grid, size=size_to, mode="bicubic", align_corners=False, antialias=True)
            grid = grid.permute(0, 2, 3, 1).reshape(1, -1, pos.shape[-1]).to(pos.dtype)  # (1, gh' gw', D) row-major
            pos_embed = torch.cat([prefix, grid], dim=1)
            # a buffer stays one (a DINO teacher's weights are buffers)
            self.pos_embed = (nn.Parameter(pos_embed, requires_grad=pos.requires_grad)
                              if isinstance(pos, nn.Parameter) else pos_embed)
        self.config = config
        return self

    def _embed(self, x: Tensor) -> Tensor:
        c = self.config
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a Tensor of images (B, C, H, W) or signals (B, T, C), got {type(x).__name__}")
        if not x.is_floating_point():  # uint8 pixels: the patch convolution would fail on the dtype
            raise TypeError(f"x must be a floating-point tensor (e.g. uint8 images scaled to floats), got dtype {x.dtype}")
        x = x.to(_stored_weight(self.patch_embed, owner=self).dtype)  # as the graph transformer reads its x: float64 data, float32 model
        if len(c.input_size) == 2:
            expected = (c.in_channels, *c.input_size)
            if x.dim() != 4 or tuple(x.shape[1:]) != expected:
                raise ValueError(f"expected images of shape (B, {expected[0]}, {expected[1]}, {expected[2]}), got {tuple(x.shape)}")
            tokens = self.patch_embed(x).flatten(2).transpose(1, 2)  # (B, T, D), row-major patches
        else:
            expected = (c.input_size[0], c.in_channels)
            if x.dim() != 3 or tuple(x.shape[1:]) != expected:
                raise ValueError(f"expected signals of shape (B, {expected[0]}, {expected[1]}), got {tuple(x.shape)}")
            tokens = self.patch_embed(x.transpose(1, 2)).transpose(1, 2)  # (B, T, D)
        if self.cls_token is not None:
            tokens = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), tokens], dim=1)
        return self.drop(tokens + self.pos_embed if self.pos_embed is not None else tokens)

    def token_positions(self, device: torch.device | None = None) -> Tensor:
        """RoPE positions of the tokens: patch ``(r, c)`` of the row-major grid at ``(r + 1, c + 1)``
        and the class token at ``(0, 0)`` (no rotation), ``(N, 2)``; for signals patch ``t`` at
        ``t + 1``, ``(N,)``."""
        grid = self.config.grid_size
        if len(grid) == 2:
            rows, cols = torch.meshgrid(torch.arange(grid[0], device=device), torch.arange(grid[1], device=device),
                                        indexing="ij")
            pos = torch.stack([rows.flatten(), cols.flatten()], dim=1) + 1
            return torch.cat([torch.zeros(self.num_prefix, 2, dtype=pos.dtype, device=device), pos])
        return torch.arange(1 - self.num_prefix, grid[0] + 1, device=device)

    def forward_tokens(self, x: Tensor, *, return_intermediates: bool = False, _before_block: Any = None,
                       **attn_kwargs: Any) -> Any:
        """All output tokens after the final norm (class token first when ``pool="cls"``)."""
        _check_flag(return_intermediates, "return_intermediates")
        z = self._embed(x)
        if self.config.rope and "positions" not in attn_kwargs:
            attn_kwargs["positions"] = self.token_positions(z.device)
        inter = ModelIntermediates(embeddings=z) if return_intermediates else None
        attn_kwargs = {"state": LayerState(), **attn_kwargs}  # first layer's values and depth, for the rivals
        for block in self.blocks:
            if _before_block is not None:  # attention_maps: each block's input, without hooks on the model
                _before_block(block, z, attn_kwargs)
            z = block(z, **attn_kwargs)
            if inter is not None:
                inter.hidden_states.append(z)
        z = self.norm(z)
        return (z, inter) if inter is not None else z

    @staticmethod
    def _tensor_only(where: str, attn_kwargs: dict[str, Any]) -> None:
        """``return_intermediates=True`` reached :meth:`forward_tokens` through ``attn_kwargs`` and its
        ``(z, intermediates)`` tuple was then sliced as a tensor: a bare "tuple indices" ``TypeError``."""
        if attn_kwargs.get("return_intermediates") is True:
            raise ValueError(f"DiffusionViT.{where}: return_intermediates=True is an argument of forward_tokens, and "
                             f"{where} returns a tensor only; call forward_tokens(x, return_intermediates=True) for "
                             "the residual stream after every block")

    def forward_patch_tokens(self, x: Tensor, **attn_kwargs: Any) -> Tensor:
        """Patch tokens only, ``(B, num_patches, D)``, in row-major grid order."""
        self._tensor_only("forward_patch_tokens", attn_kwargs)
        return self.forward_tokens(x, **attn_kwargs)[:, self.num_prefix :]

    def forward_features(self, x: Tensor, **attn_kwargs: Any) -> Tensor:
        """Pooled representation ``(B, D)``: the class token or the mean patch token (over the real patches when
        ``key_padding_mask``, or a ``graph`` with one, marks padded patches)."""
        self._tensor_only("forward_features", attn_kwargs)
        z = self.forward_tokens(x, **attn_kwargs)
        if self.cls_token is not None:
            return z[:, 0]
        graph = attn_kwargs.get("graph")
        pad = attn_kwargs.get("key_padding_mask")  # an explicit None: the graph's mask, as the attention reads it
        if pad is None:
            pad = getattr(graph, "key_padding_mask", None)
        if pad is None:
            return z.mean(dim=1)
        # the mean over the real patch tokens: a padded patch's pixels reached the pooled features (and the logits)
        # through its own token; a fully padded sample pools to zeros
        keep = ~pad.expand(z.shape[:2]).unsqueeze(-1)  # (B, N, 1); the attention layers checked the mask
        return torch.where(keep, z, 0).sum(dim=1) / keep.sum(dim=1).clamp(min=1).to(z.dtype)

    def forward(self, x: Tensor, **attn_kwargs: Any) -> Tensor:
        self._tensor_only("forward", attn_kwargs)
        return self.head(self.forward_features(x, **attn_kwargs))

    @torch.no_grad()
    def attention_maps(self, x: Tensor, kind: str = "P", **attn_kwargs: Any) -> list[Tensor]:
        r"""Per layer, the token-mixing matrices of every head, ``L`` tensors ``(B, H, N, N)``.

        ``kind="P"``: the attention matrices :math:`P_{l,h}` (row-stochastic). ``kind="operator"``:
        the matrices the heads actually apply, :math:`f_{l,h}(P_{l,h})` (``I - P`` for a
        Laplacian head, the heat kernel for a heat head), from each operator's
        :meth:`~diffusionformer.operators.DiffusionOperator.apply_matrix` (a ValueError for a model with
        heads that call ``apply_context()`` instead, e.g. ``neutreno``, ``attnscale``, ``differential``).
        They are recomputed from each block's input as :class:`~diffusionformer.analysis.LayerRecorder` does, in eval mode
        (without hooks on the model: other threads' calls of it are neither recorded nor slowed).

        Args:
            x: images or signals, as :meth:`forward`.
            kind: ``"P"`` or ``"operator"``.
            **attn_kwargs: passed on to :meth:`forward_tokens` (and so to every block's attention).
        """
        from diffusionformer.analysis.capture import LayerRecorder, _split_block_call

        if kind not in ("P", "operator"):
            raise ValueError(f"attention_maps: expected kind 'P' or 'operator', got {kind!r}"
                             f"{_choice_hint(kind, ('P', 'operator'))}")
        if kind == "operator":  # checked before the pass: else a bare NotImplementedError from coefficients()
            for i, block in enumerate(self.blocks):
                for op, (s, c) in zip(block.attn.operators, block.attn._groups):
                    if op.uses_context:
                        name = getattr(op, "name", type(op).__name__)
                        raise ValueError(
                            f"attention_maps: kind='operator' needs heads that apply a matrix f(P) to their values; "
                            f"block {i}'s {name!r} heads {list(range(s, s + c))} combine them with other state "
                            "(the layer calls its apply_context(): a second attention map, the uniform average or "
                            "an earlier layer's values), so they apply no such matrix; use kind='P' for the "
                            "attention matrices")
        maps: list[Tensor] = []

        def record(block: nn.Module, z: Tensor, kwargs: dict[str, Any]) -> None:
            # what LayerRecorder(attentions=True) recomputes, but called by this pass alone: hooks on the model
            # fired in every thread's forward (maps of another thread's input) and raced with its hook dictionaries
            _, call_kwargs, _ = _split_block_call(block, (z,), kwargs)
            maps.append(LayerRecorder._recompute(block, z, call_kwargs).attn_weights)

        # each module's own mode restored: ``self.train(was_training)`` put a submodule kept in eval (a frozen
        # block) of a training model back in training mode; by the last of the calls running at once (threads)
        with _evaluating(self):
            self.forward_tokens(x, _before_block=record, **attn_kwargs)
        if kind == "P":
            return maps
        out = []
        for block, P in zip(self.blocks, maps):
            eye = torch.eye(P.shape[-1], dtype=P.dtype, device=P.device).expand_as(P)
            parts = [op.apply_matrix(P[:, s : s + c], eye[:, s : s + c])
                     for op, (s, c) in zip(block.attn.operators, block.attn._groups)]
            out.append(torch.cat(parts, dim=1))
        return out

    def attention_rollout(self, x: Tensor, kind: str = "P", residual: float = 0.5, normalize: bool = True,
                          **attn_kwargs: Any) -> Tensor:
        """:func:`attention_rollout` of :meth:`attention_maps` (``residual`` and ``normalize`` are the function's):
        ``(B, N, N)``; row 0 of a ``pool="cls"`` model is the class token's relevance of every token."""
        # normalize is the function's: in attn_kwargs it reached every attention layer as an unknown keyword argument,
        # although the function's refusal of rows summing to 0 names normalize=False as the way out
        return attention_rollout(self.attention_maps(x, kind, **attn_kwargs), residual=residual, normalize=normalize)


def attention_rollout(maps: list[Tensor], residual: float = 0.5, normalize: bool = True) -> Tensor:
    r"""Attention rollout (Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020).

    .. math::
        \tilde A_l = (1 - r)\, I + r\, \tfrac{1}{H} \textstyle\sum_h A_{l,h}, \qquad
        \tilde A_l \leftarrow \tilde A_l / \tilde A_l \mathbf 1 \ \text{(rows, when ``normalize``)}, \qquad
        R = \tilde A_L \cdots \tilde A_1,

    the residual connection mixed in with weight ``1 - r`` (``r = 0.5`` in the paper).

    Args:
        maps: per layer ``(B, H, N, N)`` (e.g. :meth:`DiffusionViT.attention_maps`), first layer first.
        residual: ``r`` in ``(0, 1]``: the weight of the attention against the identity.
        normalize: renormalise each layer's rows to sum to 1.

    Shapes:
        ``L x (B, H, N, N) -> (B, N, N)``.

    Examples:
        >>> P = torch.tensor([[[[0.0, 1.0], [1.0, 0.0]]]])       # one layer, one head: swap
        >>> attention_rollout([P, P], residual=1.0)[0]
        tensor([[1., 0.],
                [0., 1.]])
    """
    if isinstance(maps, Tensor):  # `not maps` of a stacked (L, B, H, N, N) tensor failed as "Boolean value ... ambiguous"
        raise TypeError(f"attention_rollout: expected a list of per-layer maps (B, H, N, N), got a Tensor of shape "
                        f"{tuple(maps.shape)} (pass list(maps) for a stack of layers)")
    if isinstance(maps, nn.Module):  # attention_rollout(model, x): the function takes maps, the method a model's input
        raise TypeError(f"attention_rollout: expected a list of per-layer maps (B, H, N, N), got a "
                        f"{type(maps).__name__} (for a model's rollout of an input, call model.attention_rollout(x))")
    if not maps:
        raise ValueError("attention_rollout: expected at least one layer's maps, got none")
    if isinstance(residual, Tensor):  # its repr printed whole in the error below
        raise TypeError(f"attention_rollout: expected residual a float in (0, 1], got a Tensor of shape "
                        f"{tuple(residual.shape)}")
    if isinstance(residual, bool) or not isinstance(residual, numbers.Real) or not 0.0 < residual <= 1.0:  # numpy too
        raise ValueError(f"attention_rollout: expected residual in (0, 1], got {residual!r}")
    residual = float(residual)
    _check_flag(normalize, "attention_rollout: normalize")
    rollout = None
    for i, A in enumerate(maps):
        if not isinstance(A, Tensor) or not A.is_floating_point():
            raise TypeError(f"attention_rollout: maps[{i}] must be a floating-point tensor (B, H, N, N), got "
                            + (f"dtype {A.dtype}" if isinstance(A, Tensor) else type(A).__name__))
        if A.dim() != 4 or A.shape[-1] != A.shape[-2]:
            raise ValueError(f"attention_rollout: expected maps of shape (B, H, N, N), got {tuple(A.shape)}")
        if A.shape[1] < 1:  # a mean over no head: an all-NaN rollout
            raise ValueError(f"attention_rollout: maps[{i}] has no head (H = 0), shape {tuple(A.shape)}; expected H >= 1")
        if rollout is not None and (A.shape[0], A.shape[-1]) != tuple(rollout.shape[:2]):
            raise ValueError(f"attention_rollout: maps[{i}] has shape {tuple(A.shape)}, the layers before it "
                             f"(B, N) = {tuple(rollout.shape[:2])}")
        if rollout is not None and (A.dtype, A.device) != (rollout.dtype, rollout.device):  # else a bare matmul error
            raise ValueError(f"attention_rollout: maps[{i}] has dtype {A.dtype} on {A.device}, the layers before it "
                             f"{rollout.dtype} on {rollout.device}; pass every layer's maps in one dtype, on one device")
        eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
        layer = (1.0 - residual) * eye + residual * A.mean(dim=1)  # (B, N, N)
        if normalize:
            sums = layer.sum(dim=-1, keepdim=True)
            # a row summing to 0 (operator maps I - P of Laplacian heads with residual=1, an all-zero row) made the
            # rollout NaN or ~1/eps: refused (the sync is one per layer, in an analysis function)
            if bool((sums.abs() <= torch.finfo(sums.dtype).eps ** 0.5 * layer.abs().sum(dim=-1, keepdim=True)).any()):
                raise ValueError(f"attention_rollout: a row of layer {i}'s mixed map (1 - residual) I + residual "
                                 f"mean_h A sums to 0 and cannot be renormalised (residual={residual}; maps whose "
                                 f"rows sum to 0, e.g. kind='operator' of Laplacian heads); pass a residual < 1 or "
                                 f"normalize=False")
            layer = layer / sums
        rollout = layer if rollout is None else layer @ rollout
    assert rollout is not None
    return rollout
