"""Rival operators (issue 19): each one's layer cost against the all-attention layer.

One ``DiffusionAttention(D=256, H=8)`` per candidate, all with the same projection weights:
all heads attention (the baseline) and, for every rival, the layer with half its heads
running the rival (``"attention:4,<rival>:4"``) and, for the operators meant to replace every
head (differential, attnscale, neutreno, value residual), the layer with all heads running it.
Layer-state operators (NeuTRENO, value residual) are timed as a later layer: the call gets a
:class:`~diffusionformer.ops.rivals.LayerState` that already holds a first layer's values.
Forward in eval mode under ``torch.no_grad()``, forward+backward in train mode (dropout 0),
causal, ``B = max(1, 2048 // N)`` sequences per call. The parameter column is the layer's
parameter count minus the all-attention layer's (``D=256``: 263,168 parameters).

There is no target: the table reports the price of each rival (the expected costs are in
``docs/theory/rivals.rst``: two fused calls for differential, one fused call and a (cumulative)
mean for attnscale, ``K`` or ``4K`` re-attentions of a 3x wider state for GRAND-nl, an ``O(N^3)``
solve for ppr-exact, ``O(N^2)`` per column under a causal mask).

Run: ``python benchmarks/bench_rivals.py [--quick] [--device cpu|cuda]``.
"""

from __future__ import annotations

import torch
from torch import nn

import _common as C
from diffusionformer import DiffusionAttention
from diffusionformer.ops.rivals import LayerState

D, H = 256, 8
RIVALS = {
    "ppr-exact(alpha=0.2)": ("half",),
    "polynomial(steps=3, basis='chebyshev')": ("half",),
    "attnscale": ("half", "all"),
    "neutreno": ("half", "all"),
    "value-residual": ("half", "all"),
    "differential": ("half", "all"),
    "grand-nl(steps=2, method='euler')": ("half",),
    "grand-nl(steps=2, method='rk4')": ("half",),
}


def layers(causal: bool, device: str) -> dict[str, nn.Module]:
    base = DiffusionAttention(D, H, causal=causal).to(device)
    mods: dict[str, nn.Module] = {"attention": base}
    for rival, layouts in RIVALS.items():
        for layout in layouts:
            heads = f"attention:{H // 2},{rival}:{H // 2}" if layout == "half" else f"{rival}:{H}"
            layer = DiffusionAttention(D, H, heads=heads, causal=causal).to(device)
            layer.load_state_dict(base.state_dict(), strict=False)  # same projections; operator parameters own
            mods[heads] = layer
    return mods


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def with_state(layer: nn.Module, v0: torch.Tensor) -> object:
    def run(inp: torch.Tensor) -> torch.Tensor:
        state = LayerState(first_values=v0, depth=1)  # a later layer of a model
        return layer(inp, state=state)
    return run


def main(argv: list[str] | None = None) -> C.Report:
    args = C.parse_args(__doc__.splitlines()[0], argv)
    rep = C.Report("bench_rivals", "Rival operators: layer cost against all-attention", args)
    sizes = [64, 256] if args.quick else [64, 256, 1024]
    rounds = args.rounds or (3 if args.quick else 5)
    torch.manual_seed(0)
    rows = []
    for N in sizes:
        B = max(1, 2048 // N)
        mods = layers(True, args.device)
        x = torch.randn(B, N, D, device=args.device)
        v0 = torch.randn(B, H, N, D // H, device=args.device)
        for backward in (False, True):
            for m in mods.values():
                m.train(backward)
            runners = {name: (with_state(m, v0) if any(op.needs_layer_state for op in m.operators) else m)
                       for name, m in mods.items()}
            t = C.measure(C.step_callables(runners, x, backward), device=args.device, rounds=rounds)
            mode = "fwd+bwd" if backward else "fwd"
            base_params = n_params(mods["attention"])
            for name in mods:
                if name == "attention":
                    continue
                r = C.ratio(t, name, "attention")
                dp = n_params(mods[name]) - base_params
                rows.append([f"`{name}`", N, B, mode, f"{dp:+d}", C.ms(t["attention"].median), C.ms(t[name].median),
                             C.rfmt(r)])
                rep.rows.append({"heads": name, "N": N, "B": B, "mode": mode, "params_delta": dp,
                                 "attention_s": t["attention"].median, "rival_s": t[name].median,
                                 "rival/attention": r})
    rep.table(f"D={D}, H={H}, causal; times in ms (median of {rounds} interleaved rounds); ratios are medians of "
              "paired per-round ratios [inter-quartile range] against the all-attention layer of the same run",
              ["heads", "N", "B", "mode", "params vs attention", "attention ms", "rival ms",
               "rival / attention"], rows)
    rep.write()
    return rep


if __name__ == "__main__":
    main()
