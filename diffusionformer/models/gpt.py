r"""``DiffusionGPT``: a causal character/token language model with diffusion heads (nanoGPT layout)."""

from __future__ import annotations

import numbers
import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diffusionformer.config import _check_flag, _python_numbers, document_fields
from diffusionformer.nn.block import Block, _name_key, make_norm, resolve_layer_heads
from diffusionformer.nn.heads import _layout_as_read, _own_operators
from diffusionformer.ops._checks import checks_values
from diffusionformer.ops.rivals import LayerState
from diffusionformer.nn.attention import set_recompute
from diffusionformer.nn.kv_cache import LayerKVCache
from diffusionformer.nn._weights import _reset_children, _stored_weight
from diffusionformer.nn.rotary import RotaryEmbedding
from diffusionformer._files import load_error_text, weights_only_refusal, zip_damage
from diffusionformer._modes import _evaluating
from diffusionformer.models.common import (ModelIntermediates, _check_block_options, _check_bools, _check_mlp_ratio, _check_rope_base,
                                           check_positive_int, check_probability, init_transformer_weights)
from diffusionformer.models.sampling import top_k_filter, top_p_filter

__all__ = ["DiffusionGPT", "GPTConfig"]


@document_fields
@dataclass
class GPTConfig:
    """Configuration of :class:`DiffusionGPT` (defaults: nanoGPT's Shakespeare-char CPU setting)."""

    vocab_size: int = 65  #: number of token ids
    block_size: int = 64  #: maximum context length T
    n_layer: int = 4  #: depth L
    n_head: int = 4  #: heads per layer H
    n_embd: int = 128  #: width D
    dropout: float = 0.0  #: dropout on embeddings, attention probabilities and residual branches
    bias: bool = True  #: biases in Linear layers and LayerNorms (False: nanoGPT's ``bias=False``)
    mlp_ratio: float = 4.0  #: MLP hidden width / D
    norm: str = "layernorm"  #: "layernorm" or "rmsnorm"
    qk_norm: bool = False  #: LayerNorm on queries and keys
    tie_weights: bool = True  #: share the token embedding and the output head
    heads: Any = None  #: head spec for every layer, a per-layer list, or {layer: spec}; an operator is copied per layer
    laplacian_heads: int | str | list[int | str] | None = None  #: trailing Laplacian heads per layer; "half": n_head // 2
    backend: str = "auto"  #: dense back-end of the attention
    rope: bool = False  #: rotary q/k positions (RoFormer) instead of learned absolute positions
    rope_base: float = 10000.0  #: RoPE frequency base
    n_kv_head: int | None = None  #: key/value heads (GQA; 1 = multi-query; None = n_head)
    zero_init_proj: bool = False  #: zero-initialise the attention and MLP output projections
    recompute: bool = False  #: attention layers form their combined head output again in the backward pass (less memory)
    mlp: str = "gelu"  #: MLP: "gelu" (GPT-2's), "swiglu" (LLaMA's gated SiLU) or "geglu"; gated ones 2/3 as wide (about the same parameters)

    def __post_init__(self) -> None:
        _python_numbers(self)  # a sweep grid's numpy numbers are read as Python numbers
        check_positive_int("GPTConfig", vocab_size=self.vocab_size, block_size=self.block_size, n_layer=self.n_layer,
                           n_head=self.n_head, n_embd=self.n_embd)
        _check_mlp_ratio("GPTConfig", self.n_embd, self.mlp_ratio)
        check_probability("GPTConfig", dropout=self.dropout)
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"GPTConfig: n_head={self.n_head} must divide n_embd={self.n_embd}")
        resolve_layer_heads(self.n_layer, self.n_head, self.heads, self.laplacian_heads)
        self.heads = _layout_as_read(self.heads)  # recorded as read, as norm and mlp: one spelling of one layout
        self.norm, self.mlp = _check_block_options("GPTConfig", norm=self.norm, backend=self.backend, mlp=self.mlp)
        _check_bools("GPTConfig", bias=self.bias, qk_norm=self.qk_norm, tie_weights=self.tie_weights, rope=self.rope,
                     zero_init_proj=self.zero_init_proj, recompute=self.recompute)
        if self.rope and (self.n_embd // self.n_head) % 2:
            raise ValueError(f"GPTConfig.rope: expected an even head dim n_embd/n_head, got {self.n_embd // self.n_head}")
        _check_rope_base("GPTConfig", self.rope_base)
        kv = self.n_kv_head
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or self.n_head % kv):
            raise ValueError(f"GPTConfig.n_kv_head: expected None or a positive int dividing n_head={self.n_head}, got {kv!r}")


class DiffusionGPT(nn.Module):
    r"""Causal language model whose attention heads are diffusion operators.

    .. math::
        h^0 = E_{tok}[x] + E_{pos}, \quad h^{l} = \mathrm{Block}_l(h^{l-1}), \quad
        \mathrm{logits} = \mathrm{Norm}(h^L) E_{tok}^\top

    (output head tied to the token embedding). Every operator is run on the causal token
    graph, so position ``i``'s logits never depend on tokens after ``i``.

    Options of the 2020s baselines (all off by default): ``rope=True`` replaces ``E_pos`` by
    rotary embeddings of ``q`` and ``k`` (:class:`~diffusionformer.nn.rotary.RotaryEmbedding`),
    applied before the operator, so every head type diffuses over rotated scores;
    ``n_kv_head`` shares key/value heads between groups of query heads (GQA / MQA);
    ``zero_init_proj`` starts every residual branch at zero. :meth:`generate` samples with
    top-k / nucleus filtering and can decode with a KV cache that also serves multi-step
    operators, and the non-polynomial heads and context rivals exactly by recomputation
    (:mod:`diffusionformer.nn.kv_cache`).

    Args:
        config: a :class:`GPTConfig`.

    Shapes:
        ``idx``: ``(B, T)`` int64 with ``T <= block_size`` -> logits ``(B, T, vocab_size)``.

    Examples:
        >>> model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16,
        ...                                laplacian_heads=1))
        >>> logits, loss = model(torch.randint(0, 11, (2, 8)), torch.randint(0, 11, (2, 8)))
        >>> logits.shape, loss.shape
        (torch.Size([2, 8, 11]), torch.Size([]))
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = config
        c = config
        specs = _own_operators(resolve_layer_heads(c.n_layer, c.n_head, c.heads, c.laplacian_heads))
        # bias=False drops the LayerNorm biases too (nanoGPT's LayerNorm(ndim, bias=config.bias))
        norm: Any = c.norm
        if not c.bias and c.norm == "layernorm":  # recorded as read by the config
            norm = partial(nn.LayerNorm, bias=False)
        self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)
        self.pos_emb = None if c.rope else nn.Embedding(c.block_size, c.n_embd)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            Block(c.n_embd, c.n_head, spec, mlp_ratio=c.mlp_ratio, causal=True, qk_norm=c.qk_norm, bias=c.bias,
                  dropout=c.dropout, attn_dropout=c.dropout, norm_layer=norm, backend=c.backend,
                  num_kv_heads=c.n_kv_head, mlp_layer=c.mlp,
                  rotary=RotaryEmbedding(c.n_embd // c.n_head, c.rope_base) if c.rope else None)
            for spec in specs
        )
        self.norm = make_norm(norm, c.n_embd)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self._initialise()
        if c.recompute:
            set_recompute(self.blocks)
        if c.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
            self.register_load_state_dict_post_hook(_retie_head)

    @classmethod
    def from_nanogpt(cls, source: str | os.PathLike[str] | Mapping[str, Any], *,
                     model_args: Mapping[str, Any] | None = None, heads: Any = None,
                     laplacian_heads: int | str | list[int | str] | None = None,
                     **config_overrides: Any) -> DiffusionGPT:
        """A model holding the weights of a nanoGPT checkpoint (Karpathy's ``model.py`` / ``train.py``).

        nanoGPT's ``GPT`` is this model with attention heads (``tests/models/test_models_nanogpt_equivalence.py``
        checks logits, loss and gradients in float64): its parameters are renamed (``transformer.wte`` ->
        ``tok_emb``, ``transformer.h.{i}.attn.c_attn`` -> ``blocks.{i}.attn.qkv``, ...), its ``model_args``
        become the :class:`GPTConfig`, and ``heads`` / ``laplacian_heads`` then choose the operators each head
        applies to the loaded queries, keys and values, for fine-tuning. The tied token embedding and output head
        stay tied (a state dict that holds the shared tensor once, under either name, as safetensors'
        ``save_model`` writes it, loads into both); a ``bias=False`` checkpoint gives a model without biases.
        Operators with parameters of their own (a learned heat head's diffusion time, a polynomial head's
        coefficients) keep their initial values: nanoGPT has nothing to load into them. The model is on the CPU,
        in the dtype of the checkpoint's token embedding (float32 for nanoGPT's), in training mode.

        Args:
            source: the path of nanoGPT's ``ckpt.pt``, read with ``torch.load(weights_only=True)`` (no pickled
                code runs); the dict such a file holds (``{"model": state dict, "model_args": {...}, ...}``);
                or a bare nanoGPT state dict, given with ``model_args``. Keys prefixed ``_orig_mod.`` (saved from
                a ``torch.compile`` model) are read without the prefix; nanoGPT's causal-mask buffers
                (``attn.bias``, without flash attention) are skipped.
            model_args: nanoGPT's ``model_args`` (``n_layer``, ``n_head``, ``n_embd``, ``block_size``, ``bias``,
                ``vocab_size``, ``dropout``; missing ones take nanoGPT's defaults), only with a bare state dict.
            heads: the head spec of :class:`GPTConfig` (default: attention heads only, nanoGPT's model).
            laplacian_heads: trailing Laplacian heads per layer, as in :class:`GPTConfig` (``"half"``: half).
            **config_overrides: other :class:`GPTConfig` fields (``dropout``, ``backend``, ``recompute``, ...).
                ``n_layer``, ``n_head``, ``n_embd``, ``vocab_size``, ``block_size`` and ``bias`` fix the
                parameter shapes: given, they must equal the checkpoint's (:meth:`crop_block_size` after
                loading shortens the context, as nanoGPT's).

        Returns:
            A :class:`DiffusionGPT` holding the checkpoint's weights.

        Raises:
            ValueError: a file that ``weights_only`` refuses (load it yourself, only if you trust its source, and
                pass the dict) or that ``torch.load`` cannot read (damaged, truncated, not a checkpoint), a source
                of the wrong layout, an unknown ``model_args`` key or config field, an
                override of a shape field that differs from the checkpoint (or of ``norm``: nanoGPT's is
                LayerNorm), a nanoGPT parameter that is missing,
                unexpected or of the wrong shape (each named), an output head ``lm_head.weight`` that differs from
                the token embedding ``transformer.wte.weight`` (an untied model's) with ``tie_weights=True``, the
                default (pass ``tie_weights=False``).
            TypeError: a source that is neither a path nor a dict.

        Example::

            model = DiffusionGPT.from_nanogpt("out-shakespeare-char/ckpt.pt", laplacian_heads="half", dropout=0.1)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        """
        state, args = _read_nanogpt(source, model_args)
        fields = set(GPTConfig.__dataclass_fields__)
        unknown = sorted(set(config_overrides) - fields)
        if unknown:
            raise ValueError(f"from_nanogpt: unknown GPTConfig field(s) {unknown}; valid fields: {sorted(fields)}")
        for key in _NANOGPT_SHAPE_ARGS:
            if key in config_overrides and config_overrides[key] != args[key]:
                raise ValueError(f"from_nanogpt: {key}={config_overrides[key]!r} differs from the checkpoint's "
                                 f"{key}={args[key]!r}, which fixes the parameter shapes"
                                 + (" (model.crop_block_size(n) after loading shortens the context)"
                                    if key == "block_size" else ""))
        norm = config_overrides.get("norm", "layernorm")
        if not isinstance(norm, str) or _name_key(norm) != "layernorm":  # read as GPTConfig reads it: "LayerNorm" too
            # with bias=False an RMSNorm has the parameters of nanoGPT's LayerNorm: its gains loaded without a word
            # into another function of them (logits off by 0.16 in a small model)
            raise ValueError(f"from_nanogpt: norm={config_overrides['norm']!r}: nanoGPT's blocks normalise with "
                             "LayerNorm, whose weights are in the checkpoint; they would be loaded into another norm")
        config = GPTConfig(**{**args, **config_overrides, "heads": heads, "laplacian_heads": laplacian_heads})
        names = _nanogpt_names(config.n_layer)
        ours: dict[str, Tensor] = {}
        for key, value in state.items():
            if key not in names:
                raise ValueError(f"from_nanogpt: unexpected parameter {key!r} in the nanoGPT state dict (not one of "
                                 f"nanoGPT's GPT with n_layer={config.n_layer}, bias={config.bias})")
            ours[names[key]] = value
        if config.tie_weights:  # one tensor: a state dict that stores it once (safetensors' save_model) names either
            for name, partner in (("tok_emb.weight", "lm_head.weight"), ("lm_head.weight", "tok_emb.weight")):
                if name in ours and partner not in ours:
                    ours[partner] = ours[name]
        model = cls(config)
        dtype = ours["tok_emb.weight"].dtype if "tok_emb.weight" in ours else None
        if dtype is not None and dtype.is_floating_point:
            model = model.to(dtype)
        inverse = {b: a for a, b in names.items()}
        expected = model.state_dict()
        for name, tensor in expected.items():
            if name in ours:
                if tuple(ours[name].shape) != tuple(tensor.shape):
                    raise ValueError(f"from_nanogpt: {inverse[name]!r} has shape {tuple(ours[name].shape)}, expected "
                                     f"{tuple(tensor.shape)} for the model's {name!r}")
            elif ".attn.operators." not in name:  # an operator's own parameter keeps its initial value
                what = f"nanoGPT's {inverse[name]!r}" if name in inverse else f"{name!r} (no nanoGPT parameter)"
                raise ValueError(f"from_nanogpt: the checkpoint lacks {what}, which the model needs")
        for name in ours:
            if name not in expected:
                raise ValueError(f"from_nanogpt: unexpected parameter {inverse[name]!r} in the nanoGPT state dict "
                                 f"(the model this config builds has no {name!r})")
        if config.tie_weights and _untied_values(ours.get("tok_emb.weight"), ours.get("lm_head.weight")):
            # else load_state_dict's RuntimeError, in our parameter names, without the way out
            raise ValueError("from_nanogpt: the checkpoint's 'lm_head.weight' and 'transformer.wte.weight' hold "
                             "different values (an untied model's), but the model ties them (tie_weights=True, "
                             "nanoGPT's and the default); pass tie_weights=False to load the two apart")
        model.load_state_dict(ours, strict=False)
        return model

    def _initialise(self) -> None:
        """GPT-2's initialisation (:func:`init_transformer_weights`), then ``zero_init_proj``'s zeros."""
        c = self.config
        init_transformer_weights(self, c.n_layer)
        if c.zero_init_proj:
            for block in self.blocks:
                nn.init.zeros_(block.attn.out_proj.weight)
                fc2 = getattr(block.mlp, "fc2", None)
                if isinstance(fc2, nn.Linear):
                    nn.init.zeros_(fc2.weight)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise every parameter again, in place, as the constructor did: each part's own
        ``reset_parameters`` in construction order, then GPT-2's initialisation (``zero_init_proj`` included).
        Under one seed the model holds the values of a model built anew, a tied embedding included; parameters
        keep their identity (an optimizer holding them goes on).
        """
        shared = self.lm_head._parameters.get("weight")
        tied = shared is not None and shared is self.tok_emb._parameters.get("weight")
        if tied:  # built untied, the head drew into a tensor of its own, then took the embedding's: so here
            self.lm_head.weight = nn.Parameter(torch.empty_like(shared), requires_grad=shared.requires_grad)
        try:
            _reset_children(self, type(self).__name__)
            self._initialise()
        finally:
            if tied:
                self.lm_head.weight = shared

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any) -> None:
        # tied: both entries load into one tensor, the head's last, so a tie_weights=False model's state dict
        # replaced the token embedding by its output head, silently; refused before any weight is written
        emb, head = state_dict.get(prefix + "tok_emb.weight"), state_dict.get(prefix + "lm_head.weight")
        if self.config.tie_weights and _untied_values(emb, head):
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}: {prefix}lm_head.weight is "
                               f"tied to {prefix}tok_emb.weight (tie_weights=True), but the state dict holds different "
                               "values for the two (the weights of a tie_weights=False model?)")
        # tied, the head alone in the state dict (a shared tensor stored once, under its first name in sorted order,
        # as safetensors' save_model does): with assign=True the head took it, and _retie_head then put the old
        # embedding back in its place, the loaded weight dropped; now the embedding follows the head
        if self.config.tie_weights:  # read (and removed) by _retie_head, the post hook of a tied model
            self._tie_from_head = emb is None and isinstance(head, Tensor)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def _apply(self, fn: Any, recurse: bool = True) -> DiffusionGPT:  # type: ignore[override]
        # a conversion that makes new parameters (.to("meta"), torch.__future__'s
        # set_overwrite_module_params_on_conversion) converted the shared weight once per owner, into two
        # parameters: the tie was lost, the head counted and trained apart
        # only a tie in place before (both weights plain parameters, one tensor) is restored: a token embedding or
        # head under torch.nn.utils.parametrize or prune has a computed weight, which cannot be assigned as a
        # parameter (TypeError), and is left as torch leaves it
        emb, head = _own_weight(self.tok_emb), _own_weight(self.lm_head)
        tied = self.config.tie_weights and emb is not None and emb is head
        super()._apply(fn, recurse)
        if tied and self.lm_head.weight is not self.tok_emb.weight:
            self.lm_head.weight = self.tok_emb.weight
        return self

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Parameter count (shared weights counted once); optionally without position embeddings."""
        _check_flag(exclude_embeddings, "exclude_embeddings")
        n = sum(p.numel() for p in self.parameters())
        return n - self.pos_emb.weight.numel() if exclude_embeddings and self.pos_emb is not None else n

    def _embed(self, idx: Tensor, start: int = 0) -> Tensor:
        x = self.tok_emb(idx)  # (B, T, D)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(start, start + idx.shape[1], device=idx.device))
        return self.drop(x)

    def forward(
        self, idx: Tensor, targets: Tensor | None = None, *, return_intermediates: bool = False
    ) -> tuple[Tensor, Tensor | None] | tuple[Tensor, Tensor | None, ModelIntermediates]:
        """Logits for every position and, when ``targets`` are given, the mean cross-entropy.

        Args:
            idx: token ids ``(B, T)``.
            targets: next-token ids ``(B, T)``; ``-100`` entries are ignored.
            return_intermediates: also return the residual stream after every block.

        Returns:
            ``(logits, loss)`` (``loss`` is None without targets), plus :class:`ModelIntermediates`
            when asked.

        Raises:
            ValueError: a malformed ``idx`` or ``targets``; on CPU tensors also a token id
                outside ``[0, vocab_size)`` (checked only there: on an accelerator the check
                would synchronise with the host every step).
        """
        _check_flag(return_intermediates, "return_intermediates")
        self._check_idx(idx)
        B, T = idx.shape
        if T > self._block_size():
            raise ValueError(f"sequence length T={T} exceeds block_size={self.config.block_size}")
        if targets is not None and not isinstance(targets, Tensor):  # a numpy array's shape read "(2, 8), got (2, 8)"
            raise TypeError(f"targets must be a torch.Tensor of token ids, got {type(targets).__name__}")
        if targets is not None and targets.shape != idx.shape:
            raise ValueError(f"targets must have the shape of idx {tuple(idx.shape)}, got {tuple(targets.shape)}")
        if targets is not None and targets.device != idx.device:  # a meta target failed inside torch.nonzero
            raise ValueError(f"targets must be on idx's device {idx.device}, got {targets.device}")
        if targets is not None and targets.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"targets must be token ids (an integer tensor), got dtype {targets.dtype}; expected "
                             "int64 or int32" + _ids_hint("targets", targets))
        if targets is not None and checks_values(targets):  # CPU, eager, not batched by vmap (no host read there)
            _check_token_ids("targets", targets, self.config.vocab_size, ignore_index=-100)
        x = self._embed(idx)  # (B, T, D)
        inter = ModelIntermediates(embeddings=x) if return_intermediates else None
        state = LayerState()  # first layer's values and layer depth, for operators that read them
        for block in self.blocks:
            x = block(x, state=state)
            if inter is not None:
                inter.hidden_states.append(x)
        logits = self.lm_head(self.norm(x))  # (B, T, V)
        loss = None
        if targets is not None:
            flat = logits.flatten(0, 1)
            if flat.dtype in (torch.float16, torch.bfloat16):  # autocast: the loss in float32; float64 stays
                flat = flat.float()
            loss = F.cross_entropy(flat, targets.flatten().long(), ignore_index=-100)
        if inter is not None:
            return logits, loss, inter
        return logits, loss

    def _check_idx(self, idx: object) -> None:
        """``idx``: integer ``(B, T)`` with ``B, T >= 1`` on the model's device; on CPU also ids in ``[0, vocab_size)``."""
        if not isinstance(idx, Tensor) or idx.dtype not in (torch.int64, torch.int32) or idx.dim() != 2:
            # an int16 or uint16 tensor (nanoGPT's train.bin holds uint16 ids) was told it must be an integer tensor
            raise ValueError(f"idx must be an integer tensor (int64 or int32) of shape (B, T), got "
                             f"{getattr(idx, 'shape', idx)!r} with dtype {getattr(idx, 'dtype', None)}"
                             + _ids_hint("idx", idx))
        if idx.layout != torch.strided or idx.is_nested:  # else "ge: relation is indeterminate" from a jagged T
            raise ValueError(f"idx must be a dense (strided) tensor of shape (B, T), got "
                             f"{'a nested tensor' if idx.is_nested else 'a sparse tensor'} (layout {idx.layout}): pad "
                             "the sequences (idx.to_padded_tensor(pad_id)) or call the model on each sequence")
        if idx.shape[0] < 1 or idx.shape[1] < 1:
            raise ValueError(f"idx must hold at least one sequence of at least one token, got shape {tuple(idx.shape)}")
        device = _stored_weight(self.tok_emb, owner=self).device  # a quantized embedding: the model's device
        if idx.device != device:  # a meta idx on a CPU model gave CPU logits of garbage
            raise ValueError(f"idx must be on the model's device {device}, got {idx.device}")
        if checks_values(idx):  # no host sync on accelerators, no host read of ids batched by vmap
            _check_token_ids("idx", idx, self.config.vocab_size)

    def _block_size(self) -> int:
        """``config.block_size``, checked against the model: a value set after the model was built (the config is
        a plain dataclass) beyond its position embeddings failed with a bare IndexError inside ``nn.Embedding``."""
        size = self.config.block_size
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
            raise ValueError(f"config.block_size: expected a positive int, got {size!r}")
        size = int(size)
        if self.pos_emb is not None and size > self.pos_emb.num_embeddings:
            raise ValueError(f"config.block_size={size} exceeds the {self.pos_emb.num_embeddings} position embeddings "
                             "the model was built with (block_size changed after building?); build a new model")
        return size

    @torch.no_grad()
    def crop_block_size(self, block_size: int) -> None:
        """Shrink the context to ``block_size`` tokens, as nanoGPT's ``crop_block_size``: ``config.block_size``
        and, with learned positions, the position embedding (its first ``block_size`` rows kept), so that the
        state dict loads into ``DiffusionGPT(model.config)``. Lowering ``config.block_size`` alone kept every
        row. The model gets a config of its own (another model built from the same ``GPTConfig`` keeps its
        context). Call it before building an optimiser (the position embedding is a new parameter).

        Raises:
            ValueError: ``block_size`` is not an int in ``[1, config.block_size]`` (the model has no weights for
                more positions).
        """
        now = self._block_size()
        if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral) or not 1 <= block_size <= now:
            raise ValueError(f"crop_block_size: expected an int in [1, {now}] (the model's block_size), got "
                             f"{block_size!r}")
        block_size = int(block_size)
        if self.pos_emb is not None:
            old = self.pos_emb.weight
            # made outside inference mode: cropped under torch.inference_mode (a served model), the new weight was
            # an inference tensor, which a later load_state_dict or optimiser step refused to update in place
            with torch.inference_mode(False):
                self.pos_emb.weight = nn.Parameter(old[:block_size].clone(), requires_grad=old.requires_grad)
            self.pos_emb.num_embeddings = block_size
        # a copy: set in place, the config shared with another model built from it cut that model's context too
        self.config = replace(self.config, block_size=block_size)

    def new_cache(self) -> list[LayerKVCache]:
        """An empty KV cache, one :class:`~diffusionformer.nn.kv_cache.LayerKVCache` per block."""
        return [LayerKVCache() for _ in self.blocks]

    def forward_cached(self, idx: Tensor, cache: list[LayerKVCache]) -> Tensor:
        """Logits of new tokens ``idx`` that follow the tokens in ``cache`` (updated in place).

        Equal, up to rounding, to the last ``n`` rows of ``self(cat(past, idx))[0]`` for every
        head operator (see :mod:`diffusionformer.nn.kv_cache`). An eval-mode path: a model in
        training mode with dropout on the attention probabilities is refused (call ``.eval()``).

        Shapes:
            ``idx``: ``(B, n)`` with ``cache length + n <= block_size`` -> logits ``(B, n, vocab_size)``.
        """
        self._check_idx(idx)
        if not isinstance(cache, (list, tuple)) or not all(isinstance(c, LayerKVCache) for c in cache):
            raise TypeError(f"cache must be the list that new_cache() returns, got {type(cache).__name__}")
        if len(cache) != len(self.blocks):
            raise ValueError(f"cache: expected {len(self.blocks)} layer caches, got {len(cache)}")
        if len({id(c) for c in cache}) != len(cache):  # [LayerKVCache()] * n_layer: each layer read the others' rows
            raise ValueError("cache: expected one LayerKVCache per block, got the same LayerKVCache object for several "
                             "blocks (as [LayerKVCache()] * n_layer makes); start a new cache with new_cache()")
        lengths = [c.length for c in cache]
        # compared in turn, not as a set: under torch.compile a length is a symbolic size, which hashing would fix to
        # its value (one graph per decoding step)
        if any(n != lengths[0] for n in lengths[1:]):  # a call stopped between layers: rows at wrong positions
            raise ValueError(f"cache: expected the layer caches to hold the same number of tokens, got lengths {lengths} "
                             "(a forward_cached call was interrupted part-way); start a new cache with new_cache()")
        start = lengths[0]
        if start + idx.shape[1] > self._block_size():
            raise ValueError(
                f"forward_cached: expected cached + new tokens <= block_size={self.config.block_size}, "
                f"got {start} + {idx.shape[1]}"
            )
        x = self._embed(idx, start)
        # as in forward: the first layer leaves its values (of all cached and new tokens) and each
        # layer learns its depth, for the context operators that the cache serves by recomputation
        # (only they read the state: without them the incremental path copies nothing for it)
        uses_context = any(op.uses_context for block in self.blocks for op in block.attn.operators)
        state = LayerState() if uses_context else None
        for block, layer_cache in zip(self.blocks, cache):
            x = block(x, cache=layer_cache, state=state)
        return self.lm_head(self.norm(x))

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        *,
        top_p: float | None = None,
        use_cache: bool = False,
    ) -> Tensor:
        """Sample ``max_new_tokens`` tokens autoregressively (context cropped to ``block_size``).

        Args:
            idx: prompt ids ``(B, T0)``.
            max_new_tokens: number of tokens to append.
            temperature: softmax temperature; ``0`` picks the most likely token (greedy), ``inf``
                samples uniformly among the tokens that ``top_k`` keeps.
            top_k: sample among the ``top_k`` most likely tokens only.
            generator: random generator for reproducible sampling.
            top_p: nucleus sampling: sample among the fewest most likely tokens whose probability
                sums to at least ``top_p`` (:func:`~diffusionformer.models.sampling.top_p_filter`,
                applied after ``top_k``).
            use_cache: decode with a KV cache (:meth:`forward_cached`): the prompt is run once
                and each new token costs one row per layer and power of ``P`` instead of a full
                forward pass (heads that are not polynomials in ``P``, the context rivals among
                them, recompute their ``(T, T)`` maps over the cached tokens: exact, not
                incremental). Same tokens as without the cache (up to rounding ties). Once the
                context exceeds ``block_size`` the window slides, every position changes, and
                the cache is rebuilt from the cropped context at each step.

        Shapes:
            ``(B, T0) -> (B, T0 + max_new_tokens)``.
        """
        self._check_idx(idx)  # also when no token is asked for: a malformed prompt is never handed back
        # numpy numbers (a sweep grid's) are read as the Python numbers they equal; bools are refused
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not temperature >= 0:  # NaN too
            raise ValueError(f"temperature must be a non-negative float, got {temperature!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
            # top_k=0 turns top-k off in Hugging Face's generate: here that is None
            off = " (None samples from every token: top_k=0 is how Hugging Face's generate says so)" if (
                not isinstance(top_k, bool) and isinstance(top_k, numbers.Integral) and top_k == 0) else ""
            raise ValueError(f"top_k must be a positive int or None, got {top_k!r}{off}")
        if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real)
                                  or not 0.0 < top_p <= 1.0):
            raise ValueError(f"top_p must be a float in (0, 1] or None, got {top_p!r}")
        max_new_tokens, temperature = int(max_new_tokens), float(temperature)
        top_k = None if top_k is None else int(top_k)
        top_p = None if top_p is None else float(top_p)
        _check_flag(use_cache, "use_cache")
        # checked before any token is drawn: greedy decoding and max_new_tokens=0 never reach the sampler
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__} {generator!r}")
        weight = _stored_weight(self.tok_emb, owner=self)
        if generator is not None and temperature != 0 and torch.device(generator.device) != weight.device:
            # else torch.multinomial's "Expected a 'cuda' device type for generator but found 'cpu'" at the first draw
            raise ValueError(f"generator is on {generator.device} and the model on {weight.device}: sampling draws on the "
                             f"model's device, so give a generator there (torch.Generator(device={str(weight.device)!r}))")
        if max_new_tokens == 0:  # a new tensor, as for any other count: writing into it leaves the prompt
            return idx.clone()
        # every module's own mode, restored as it was (a submodule kept in eval mode, frozen, stays so) when the last
        # of the calls running at once with this model ends
        block_size = self._block_size()
        cache: list[LayerKVCache] | None = None
        T0 = idx.shape[1]
        with _evaluating(self):
            for _ in range(max_new_tokens):
                if not use_cache:
                    logits = self(idx[:, -block_size:])[0][:, -1, :]  # (B, V)
                elif cache is not None and cache[0].length < block_size:
                    logits = self.forward_cached(idx[:, -1:], cache)[:, -1, :]
                else:  # first step, or the window slid: (re)build the cache from the context
                    cache = self.new_cache()
                    logits = self.forward_cached(idx[:, -block_size:], cache)[:, -1, :]
                if logits.dtype in (torch.float16, torch.bfloat16):  # sampled in float32; float64 stays (a cast
                    logits = logits.float()  # to float32 tied logits that differ in float64: greedy took the first)
                # NaN: greedy took token 0, sampling failed in torch; +inf (an overflow): inf - inf = NaN when shifted
                # a row of -inf only (every token removed): greedy took token 0, sampling failed in torch (-inf - -inf)
                bad = None
                if checks_values(logits):
                    if bool((logits.isnan() | (logits == float("inf"))).any()):
                        bad = "NaN" if bool(logits.isnan().any()) else "+inf"
                    elif bool(logits.isneginf().all(dim=-1).any()):
                        bad = "-inf for every token"
                if bad is not None:
                    raise ValueError(f"generate: the model's logits are {bad} at new token {idx.shape[1] - T0} of "
                                     f"{max_new_tokens} (diverged or non-finite weights); no token can be chosen")
                if temperature == 0:
                    nxt = logits.argmax(dim=-1, keepdim=True)
                else:
                    # top_k on the logits before they are scaled (the same tokens for any temperature > 0): a huge
                    # temperature (inf, or above float32's range) scales every logit to 0, and all tokens tied with
                    # the k-th were kept, the whole vocabulary
                    if top_k is not None:
                        logits = top_k_filter(logits, top_k)
                    # shifted so the row maximum is 0: a tiny temperature gives -inf, never inf - inf = NaN;
                    # and the maximum stays 0 where the temperature rounds to 0 in float32 (1e-300: 0 / 0);
                    # removed tokens stay -inf (-inf / inf would be NaN)
                    # a temperature >= 1 scales first (|logits / t| <= |logits|): shifted first, logits of
                    # opposite signs near the dtype's range (3e38 and -3e38 in float32) differed by -inf, a token
                    # of probability e^-2 at t = 1e38 was never drawn
                    if temperature >= 1:
                        logits = torch.where(logits.isneginf(), logits, logits / temperature)
                    shifted = logits - logits.amax(dim=-1, keepdim=True)
                    if temperature < 1:
                        logits = torch.where((shifted == 0) | shifted.isneginf(), shifted, shifted / temperature)
                    else:
                        logits = shifted
                    if top_p is not None and top_p < 1.0:  # p = 1 keeps every token: no copy per step
                        logits = top_p_filter(logits, top_p)
                    probs = torch.softmax(logits, dim=-1)
                    nxt = torch.multinomial(probs, 1, generator=generator)
                idx = torch.cat([idx, nxt.to(idx.dtype)], dim=1)
        return idx


def _retie_head(model: nn.Module, incompatible_keys: Any) -> None:
    """After ``load_state_dict``: a tied head is the token embedding again (``assign=True`` made two parameters
    of the two entries, counted and trained apart)."""
    from_head = model.__dict__.pop("_tie_from_head", False)  # set by _load_from_state_dict
    emb, head = _own_weight(model.tok_emb), _own_weight(model.lm_head)
    if emb is None or head is None:  # a parametrized or pruned weight (a computed tensor): left as torch leaves it
        return
    if head is not emb:
        if from_head:  # only the head was in the state dict: the embedding takes the loaded weight
            model.tok_emb.weight = model.lm_head.weight
        else:
            model.lm_head.weight = model.tok_emb.weight


def _untied_values(emb: Any, head: Any) -> bool:
    """Whether a state dict's token embedding and output head are two tensors of different values, which a tied model
    cannot hold (NaN equal to NaN: a diverged model's own state dict loads; meta tensors have no values to compare)."""
    return (isinstance(emb, Tensor) and isinstance(head, Tensor) and emb is not head
            and "meta" not in (emb.device.type, head.device.type)
            and (emb.shape != head.shape
                 or not torch.allclose(emb, head.to(emb.device, emb.dtype), rtol=0.0, atol=0.0, equal_nan=True)))


def _own_weight(module: nn.Module) -> Tensor | None:
    """``module``'s weight when it is a plain parameter of its own; ``None`` under :mod:`torch.nn.utils.parametrize`
    (the weight is computed from ``parametrizations.weight``) or :mod:`torch.nn.utils.prune` (``weight_orig``)."""
    return module._parameters.get("weight")


def _ids_hint(name: str, ids: object) -> str:
    """A hint for token ids of another integer dtype (``int16``, ``uint8``, ``uint16``, ...): convert them; for one
    sequence of ids without its batch dimension (``TextData.encode`` returns one): add it."""
    if not isinstance(ids, Tensor) or ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        return ""
    if ids.dtype not in (torch.int64, torch.int32):
        return f" (convert the ids with {name}.long())"
    if ids.dim() == 1:
        return f" (one sequence: add the batch dimension, {name}[None])"
    return ""


def _check_token_ids(name: str, ids: Tensor, vocab_size: int, ignore_index: int | None = None) -> None:
    """Raise a ValueError naming ``name`` when an id lies outside ``[0, vocab_size)`` (``ignore_index`` allowed).

    Called on CPU tensors only: on an accelerator reading the minimum and maximum back would
    stall the stream every step, and the embedding kernel reports out-of-range ids itself.
    """
    if ids.numel() == 0:
        return
    valid = ids if ignore_index is None else ids[ids != ignore_index]
    if valid.numel() == 0:
        return
    lo, hi = int(valid.min()), int(valid.max())
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        extra = f" (or {ignore_index} to ignore a position)" if ignore_index is not None else ""
        raise ValueError(f"{name} holds token id {bad}, outside the vocabulary [0, {vocab_size}){extra}")


#: nanoGPT's ``model_args`` and their defaults (its ``GPTConfig``)
_NANOGPT_ARGS = {"block_size": 1024, "vocab_size": 50304, "n_layer": 12, "n_head": 12, "n_embd": 768, "dropout": 0.0,
                 "bias": True}
#: the ``model_args`` that fix parameter shapes: a config override must equal the checkpoint's
_NANOGPT_SHAPE_ARGS = ("n_layer", "n_head", "n_embd", "vocab_size", "block_size", "bias")


def _nanogpt_names(n_layer: int) -> dict[str, str]:
    """nanoGPT parameter name -> :class:`DiffusionGPT` parameter name, for ``n_layer`` blocks."""
    out = {"transformer.wte.weight": "tok_emb.weight", "transformer.wpe.weight": "pos_emb.weight",
           "transformer.ln_f.weight": "norm.weight", "transformer.ln_f.bias": "norm.bias",
           "lm_head.weight": "lm_head.weight"}
    parts = {"ln_1": "norm1", "attn.c_attn": "attn.qkv", "attn.c_proj": "attn.out_proj", "ln_2": "norm2",
             "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
    for i in range(n_layer):
        for a, b in parts.items():
            for kind in ("weight", "bias"):
                out[f"transformer.h.{i}.{a}.{kind}"] = f"blocks.{i}.{b}.{kind}"
    return out


def _nanogpt_value(value: Any) -> Any:
    """A numpy scalar of a checkpoint's ``model_args`` as the Python bool/int/float it equals; else ``value``."""
    if type(value).__module__ == "numpy" and getattr(value, "shape", None) == () and hasattr(value, "item"):
        return value.item()
    return value


def _nanogpt_unreadable(path: Any, err: BaseException) -> ValueError:
    """The error for a file that ``torch.load`` cannot read (not written by ``torch.save``, truncated, damaged)."""
    return ValueError(f"from_nanogpt: {os.fspath(path)} is not a readable torch.save file (truncated, damaged, or "
                      f"not a checkpoint); torch.load failed with {load_error_text(err)}")


def _read_nanogpt(source: Any, model_args: Any) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """``(state dict without _orig_mod. prefixes and causal-mask buffers, model_args with nanoGPT's defaults)``
    of :meth:`DiffusionGPT.from_nanogpt`'s ``source``."""
    if isinstance(source, (str, os.PathLike)):
        damage = zip_damage(source)  # torch.load reads a flipped bit in tensor data as other numbers
        if damage is not None:
            raise ValueError(f"from_nanogpt: {os.fspath(source)} is corrupt: {damage}")
        try:
            source = torch.load(source, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:
            what = weights_only_refusal(err, source)
            if what is None:  # damaged pickle bytes
                raise _nanogpt_unreadable(source, err) from err
            raise ValueError(f"from_nanogpt: {os.fspath(source)} holds objects that torch.load(weights_only=True) "
                             f"refuses ({what}); it was not loaded. Load it yourself with weights_only=False "
                             "only if you trust its source, and pass the dict") from err
        except OSError:  # missing, a directory, no permission: torch's own error names it
            raise
        except Exception as err:  # torch's unpickler raises KeyError, struct.error, ... on a damaged or foreign file
            raise _nanogpt_unreadable(source, err) from err
        if not isinstance(source, Mapping) or "model" not in source:
            raise ValueError("from_nanogpt: expected the file to hold nanoGPT's checkpoint dict with keys 'model' and "
                             f"'model_args', got {type(source).__name__}"
                             + (f" with keys {sorted(map(str, source))}" if isinstance(source, Mapping) else ""))
    if not isinstance(source, Mapping):
        raise TypeError(f"from_nanogpt: source must be a path, a nanoGPT checkpoint dict or a state dict, got "
                        f"{type(source).__name__}")
    if "model" in source:  # a checkpoint dict
        if model_args is not None:
            raise ValueError("from_nanogpt: model_args is for a bare state dict; the checkpoint holds its own "
                             "(pass config overrides as keywords instead)")
        if "model_args" not in source:
            raise ValueError(f"from_nanogpt: the checkpoint dict has no 'model_args' (keys {sorted(map(str, source))})")
        state, model_args = source["model"], source["model_args"]
        if not isinstance(state, Mapping):
            raise ValueError(f"from_nanogpt: checkpoint['model'] must be a state dict, got {type(state).__name__}")
    else:
        if model_args is None:
            raise ValueError("from_nanogpt: a bare state dict needs model_args= (nanoGPT's n_layer, n_head, n_embd, "
                             "block_size, bias, vocab_size, dropout)")
        state = source
    if not isinstance(model_args, Mapping):
        raise ValueError(f"from_nanogpt: model_args must be a dict, got {type(model_args).__name__}")
    unknown = sorted(set(model_args) - set(_NANOGPT_ARGS), key=str)
    if unknown:
        raise ValueError(f"from_nanogpt: unknown model_args key(s) {unknown}; nanoGPT's are {list(_NANOGPT_ARGS)}")
    # numpy numbers (np.int64, np.bool_) in a checkpoint's model_args, as nanoGPT's GPTConfig takes them
    args = {**_NANOGPT_ARGS, **{key: _nanogpt_value(value) for key, value in model_args.items()}}
    out: dict[str, Tensor] = {}
    prefix = "_orig_mod."
    for key, value in state.items():
        name = key[len(prefix):] if isinstance(key, str) and key.startswith(prefix) else key
        if not isinstance(value, Tensor):
            raise ValueError(f"from_nanogpt: state dict entry {key!r} must be a tensor, got {type(value).__name__}")
        parts = name.split(".") if isinstance(name, str) else []
        if len(parts) == 5 and parts[:2] == ["transformer", "h"] and parts[3:] == ["attn", "bias"]:
            continue  # the causal-mask buffer of nanoGPT's non-flash attention
        if name in out:
            raise ValueError(f"from_nanogpt: the state dict holds {name!r} twice (with and without {prefix!r})")
        out[name] = value
    return out, args
