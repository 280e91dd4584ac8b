r"""``DiffusionGPT``: a causal character/token language model with diffusion heads (nanoGPT layout)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diffusionformer.config import document_fields
from diffusionformer.nn.block import Block, make_norm, resolve_layer_heads
from diffusionformer.ops.rivals import LayerState
from diffusionformer.models.common import ModelIntermediates, check_positive, check_probability, init_transformer_weights

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
    bias: bool = True  #: biases in Linear layers and norms
    mlp_ratio: float = 4.0  #: MLP hidden width / D
    norm: str = "layernorm"  #: "layernorm" or "rmsnorm"
    qk_norm: bool = False  #: LayerNorm on queries and keys
    tie_weights: bool = True  #: share the token embedding and the output head
    heads: Any = None  #: head spec for every layer, a per-layer list, or {layer: spec}
    laplacian_heads: int | list[int] | None = None  #: trailing Laplacian heads per layer (seed paper layout)
    backend: str = "auto"  #: dense back-end of the attention

    def __post_init__(self) -> None:
        check_positive("GPTConfig", vocab_size=self.vocab_size, block_size=self.block_size, n_layer=self.n_layer,
                       n_head=self.n_head, n_embd=self.n_embd, mlp_ratio=self.mlp_ratio)
        check_probability("GPTConfig", dropout=self.dropout)
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"GPTConfig: n_head={self.n_head} must divide n_embd={self.n_embd}")
        resolve_layer_heads(self.n_layer, self.n_head, self.heads, self.laplacian_heads)


class DiffusionGPT(nn.Module):
    r"""Causal language model whose attention heads are diffusion operators.

    .. math::
        h^0 = E_{tok}[x] + E_{pos}, \quad h^{l} = \mathrm{Block}_l(h^{l-1}), \quad
        \mathrm{logits} = \mathrm{Norm}(h^L) E_{tok}^\top

    (output head tied to the token embedding). Every operator is run on the causal token
    graph, so position ``i``'s logits never depend on tokens after ``i``.

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
        specs = resolve_layer_heads(c.n_layer, c.n_head, c.heads, c.laplacian_heads)
        self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)
        self.pos_emb = nn.Embedding(c.block_size, c.n_embd)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            Block(c.n_embd, c.n_head, spec, mlp_ratio=c.mlp_ratio, causal=True, qk_norm=c.qk_norm, bias=c.bias,
                  dropout=c.dropout, attn_dropout=c.dropout, norm_layer=c.norm, backend=c.backend)
            for spec in specs
        )
        self.norm = make_norm(c.norm, c.n_embd)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        init_transformer_weights(self, c.n_layer)
        if c.tie_weights:
            self.lm_head.weight = self.tok_emb.weight

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Parameter count (shared weights counted once); optionally without position embeddings."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.pos_emb.weight.numel() if exclude_embeddings else n

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
        if not isinstance(idx, Tensor) or idx.dtype not in (torch.int64, torch.int32) or idx.dim() != 2:
            raise ValueError(f"idx must be an integer tensor of shape (B, T), got {getattr(idx, 'shape', idx)!r}"
                             f" with dtype {getattr(idx, 'dtype', None)}")
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length T={T} exceeds block_size={self.config.block_size}")
        if targets is not None and targets.shape != idx.shape:
            raise ValueError(f"targets must have the shape of idx {tuple(idx.shape)}, got {tuple(targets.shape)}")
        if targets is not None and targets.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"targets must be token ids (an integer tensor), got dtype {targets.dtype}")
        if idx.device.type == "cpu" and not torch.compiler.is_compiling():  # no host sync on accelerators
            _check_token_ids("idx", idx, self.config.vocab_size)
            if targets is not None:
                _check_token_ids("targets", targets, self.config.vocab_size, ignore_index=-100)
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))  # (B, T, D)
        inter = ModelIntermediates(embeddings=x) if return_intermediates else None
        state = LayerState()  # first layer's values and layer depth, for operators that read them
        for block in self.blocks:
            x = block(x, state=state)
            if inter is not None:
                inter.hidden_states.append(x)
        logits = self.lm_head(self.norm(x))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten().long(), ignore_index=-100)
        if inter is not None:
            return logits, loss, inter
        return logits, loss

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Sample ``max_new_tokens`` tokens autoregressively (context cropped to ``block_size``).

        Args:
            idx: prompt ids ``(B, T0)``.
            max_new_tokens: number of tokens to append.
            temperature: softmax temperature; ``0`` picks the most likely token (greedy).
            top_k: sample among the ``top_k`` most likely tokens only.
            generator: random generator for reproducible sampling.

        Shapes:
            ``(B, T0) -> (B, T0 + max_new_tokens)``.
        """
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError(f"temperature must be a non-negative float, got {temperature!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
        was_training = self.training
        self.eval()
        try:
            for _ in range(max_new_tokens):
                context = idx[:, -self.config.block_size :]
                logits = self(context)[0][:, -1, :].float()  # (B, V)
                if temperature == 0:
                    nxt = logits.argmax(dim=-1, keepdim=True)
                else:
                    logits = logits / temperature
                    if top_k is not None:
                        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                        logits = logits.masked_fill(logits < kth, float("-inf"))
                    probs = torch.softmax(logits, dim=-1)
                    nxt = torch.multinomial(probs, 1, generator=generator)
                idx = torch.cat([idx, nxt.to(idx.dtype)], dim=1)
        finally:
            self.train(was_training)
        return idx


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
