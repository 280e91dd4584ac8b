"""End-to-end GPT training step: ``DiffusionGPT`` vs a plain nanoGPT-style GPT of equal size.

Config of nanoGPT's Shakespeare-char CPU run: 4 layers, 4 heads, width 128, block 64,
batch 12, vocabulary 65, no dropout, tied embeddings. One training step is forward,
cross-entropy, backward, ``AdamW.step()`` and ``zero_grad()`` on random token ids.
``DiffusionGPT`` runs with attention heads only and with ``laplacian_heads=2`` (the seed
paper's layout: the last two heads of every layer are Laplacian); the baseline below is
nanoGPT's ``model.py`` reduced to what this config uses, on
:func:`torch.nn.functional.scaled_dot_product_attention`.

Target (issue 7): training throughput >= 0.95x the plain baseline.

Run: ``python benchmarks/bench_gpt.py [--quick] [--device cpu|cuda]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import _common as C
from diffusionformer.models import DiffusionGPT, GPTConfig


@dataclass
class PlainConfig:
    vocab_size: int = 65
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128


class CausalSelfAttention(nn.Module):
    def __init__(self, c: PlainConfig) -> None:
        super().__init__()
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd)
        self.n_head = c.n_head

    def forward(self, x: Tensor) -> Tensor:
        B, T, D = x.size()
        q, k, v = self.c_attn(x).split(D, dim=2)
        q = q.view(B, T, self.n_head, D // self.n_head).transpose(1, 2)  # (B, H, T, C)
        k = k.view(B, T, self.n_head, D // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, D // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, D)  # (B, T, D)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, c: PlainConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class PlainBlock(nn.Module):
    def __init__(self, c: PlainConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.n_embd)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c.n_embd)
        self.mlp = MLP(c)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class PlainGPT(nn.Module):
    """nanoGPT's GPT (no dropout, tied embeddings), the baseline."""

    def __init__(self, c: PlainConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd)
        self.h = nn.ModuleList(PlainBlock(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.n_layer) if name.endswith("c_proj.weight") else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        B, T = idx.size()
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main(argv: list[str] | None = None) -> C.Report:
    args = C.parse_args(__doc__.splitlines()[0], argv)
    rep = C.Report("bench_gpt", "GPT training step: DiffusionGPT vs plain PyTorch GPT", args)
    dev = args.device
    pc = PlainConfig()
    batch = 12
    torch.manual_seed(0)
    models = {
        "plain (F.sdpa)": PlainGPT(pc),
        "DiffusionGPT attention": DiffusionGPT(GPTConfig(vocab_size=pc.vocab_size, block_size=pc.block_size, n_layer=pc.n_layer,
                                                         n_head=pc.n_head, n_embd=pc.n_embd)),
        "DiffusionGPT laplacian_heads=2": DiffusionGPT(GPTConfig(vocab_size=pc.vocab_size, block_size=pc.block_size,
                                                                 n_layer=pc.n_layer, n_head=pc.n_head, n_embd=pc.n_embd,
                                                                 laplacian_heads=2)),
    }
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, pc.vocab_size, (batch, pc.block_size), generator=g).to(dev)
    targets = torch.randint(0, pc.vocab_size, (batch, pc.block_size), generator=g).to(dev)
    steps = {}
    params = {}
    for name, m in models.items():
        m.to(dev).train()
        params[name] = sum(p.numel() for p in m.parameters())
        steps[name] = C.train_step(m, torch.optim.AdamW(m.parameters(), lr=1e-4), idx, targets)
    rounds = args.rounds or (5 if args.quick else 21)
    t = C.measure(steps, device=dev, rounds=rounds, block_s=0.0 if args.quick else 0.1, warmup=3)
    tokens = batch * pc.block_size
    base = "plain (F.sdpa)"
    rows = []
    for name in models:
        r = C.ratio(t, base, name)  # throughput ratio = baseline time / time
        rows.append([name, params[name], C.ms(t[name].median), f"{tokens / t[name].median:.0f}",
                     "1 (baseline)" if name == base else C.rfmt(r), "" if name == base else C.check(r[0] >= 0.95)])
        rep.rows.append({"model": name, "params": params[name], "step_s": t[name].median,
                         "tokens_per_s": tokens / t[name].median, "throughput_vs_plain": None if name == base else r})
    rep.table(f"Training step (forward + backward + AdamW), batch {batch} x block {pc.block_size} = {tokens} tokens, "
              f"{pc.n_layer} layers, {pc.n_head} heads, width {pc.n_embd}; median of {rounds} interleaved rounds; "
              "throughput ratio = baseline step time / step time [IQR]",
              ["model", "parameters", "step ms", "tokens/s", "throughput vs plain", ">= 0.95"], rows)
    rep.write()
    return rep


if __name__ == "__main__":
    main()
