"""Dense layer cost: mixed attention/Laplacian heads vs all-attention vs ``nn.MultiheadAttention``.

Three layers with the same weights (``D = 256``, ``H = 8``): ``nn.MultiheadAttention``
(``batch_first=True``, ``need_weights=False``; causal runs pass the causal mask with
``is_causal=True``), ``DiffusionAttention`` with all heads attention, and
``DiffusionAttention(heads="attention:6,laplacian:2")`` (the seed paper's layout). Forward is
timed in eval mode under ``torch.no_grad()``; forward+backward in train mode (dropout 0) with
a gradient for the input. ``B = max(1, 2048 // N)`` sequences per call.

Targets (issue 7): mixed <= 1.03x all-attention; all-attention <= 1.05x ``nn.MultiheadAttention``.

Run: ``python benchmarks/bench_dense.py [--quick] [--device cpu|cuda]``.
"""

from __future__ import annotations

import torch
from torch import nn

import _common as C
from diffusionformer import DiffusionAttention

D, H = 256, 8
MIXED = "attention:6,laplacian:2"


def layers(N: int, causal: bool, device: str) -> dict[str, nn.Module]:
    mha = nn.MultiheadAttention(D, H, batch_first=True).to(device)
    att = DiffusionAttention.from_multihead_attention(mha, causal=causal)
    mix = DiffusionAttention.from_multihead_attention(mha, heads=MIXED, causal=causal)
    return {"mha": mha, "attention": att, "mixed": mix}


def callables(mods: dict[str, nn.Module], x: torch.Tensor, causal: bool, backward: bool) -> dict[str, object]:
    N = x.shape[1]
    mask = nn.Transformer.generate_square_subsequent_mask(N, device=x.device) if causal else None
    mha = mods["mha"]

    def run_mha(inp: torch.Tensor) -> torch.Tensor:
        return mha(inp, inp, inp, need_weights=False, attn_mask=mask, is_causal=causal)[0]

    runners = {"mha": run_mha, "attention": mods["attention"], "mixed": mods["mixed"]}
    return C.step_callables(runners, x, backward)


def main(argv: list[str] | None = None) -> C.Report:
    args = C.parse_args(__doc__.splitlines()[0], argv)
    rep = C.Report("bench_dense", "Dense layer: mixed attention/Laplacian vs all-attention vs nn.MultiheadAttention", args)
    sizes = [64, 256] if args.quick else [64, 256, 1024, 2048]
    rounds = args.rounds or (3 if args.quick else 7)
    torch.manual_seed(0)
    rows = []
    worst = {"attention/mha": 0.0, "mixed/attention": 0.0}
    for N in sizes:
        B = max(1, 2048 // N)
        for causal in (False, True):
            mods = layers(N, causal, args.device)
            x = torch.randn(B, N, D, device=args.device)
            for backward in (False, True):
                for m in mods.values():
                    m.train(backward)
                t = C.measure(callables(mods, x, causal, backward), device=args.device, rounds=rounds)
                r_att = C.ratio(t, "attention", "mha")
                r_mix = C.ratio(t, "mixed", "attention")
                worst["attention/mha"] = max(worst["attention/mha"], r_att[0])
                worst["mixed/attention"] = max(worst["mixed/attention"], r_mix[0])
                mode = "fwd+bwd" if backward else "fwd"
                rows.append([N, B, "yes" if causal else "no", mode, C.ms(t["mha"].median), C.ms(t["attention"].median),
                             C.ms(t["mixed"].median), C.rfmt(r_att), C.check(r_att[0] <= 1.05), C.rfmt(r_mix),
                             C.check(r_mix[0] <= 1.03)])
                rep.rows.append({"N": N, "B": B, "causal": causal, "mode": mode,
                                 **{f"{k}_s": v.median for k, v in t.items()},
                                 "attention/mha": r_att, "mixed/attention": r_mix})
    rep.table(f"D={D}, H={H}, mixed = {MIXED!r}; times in ms (median of {rounds} interleaved rounds); "
              "ratios are medians of paired per-round ratios [inter-quartile range]",
              ["N", "B", "causal", "mode", "MHA ms", "attention ms", "mixed ms", "attention / MHA", "<= 1.05",
               "mixed / attention", "<= 1.03"], rows)
    rep.note(f"Worst medians over the grid: attention/MHA {worst['attention/mha']:.3f} (target 1.05), "
             f"mixed/attention {worst['mixed/attention']:.3f} (target 1.03).")
    rep.write()
    return rep


if __name__ == "__main__":
    main()
