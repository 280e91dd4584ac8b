"""Half ppr-exact layer: ``P`` for the ppr-exact heads only, against ``P`` for every head and all-attention.

The layout ``"attention:4,ppr-exact(alpha=0.2):4"`` of ``bench_rivals.py`` (``DiffusionAttention(D=256,
H=8)``, causal, ``B = 2048 / N`` sequences, same projection weights), timed alone in three versions
interleaved in the same rounds:

* ``attention``: the all-attention layer (the baseline of ``bench_rivals.py``);
* ``ppr-half``: the layer as it runs now (``backend="auto"``): one fused SDPA call for the 4
  attention heads, ``P`` materialised for the 4 ppr-exact heads only;
* ``ppr-half, full P``: the same layer with ``backend="matrix"``, which materialises ``P`` for all
  8 heads and multiplies it into the attention heads' values: the path every layer with a
  non-polynomial head took before.

Forward in eval mode under ``torch.no_grad()``, forward+backward in train mode (dropout 0).

Run: ``python benchmarks/bench_matrix_heads.py --threads 1 --clock cpu [--quick] [--out DIR]``.
"""

from __future__ import annotations

import torch

import _common as C
from diffusionformer import DiffusionAttention

D, H = 256, 8
HALF = f"attention:{H // 2},ppr-exact(alpha=0.2):{H // 2}"


def main(argv: list[str] | None = None) -> C.Report:
    args = C.parse_args(__doc__.splitlines()[0], argv)
    rep = C.Report("bench_matrix_heads", "Half ppr-exact layer: P for the ppr-exact heads only", args)
    sizes = [256] if args.quick else [256, 1024]
    rounds = args.rounds or (3 if args.quick else 7)
    torch.manual_seed(0)
    rows = []
    for N in sizes:
        B = max(1, 2048 // N)
        base = DiffusionAttention(D, H, causal=True).to(args.device)
        mods = {"attention": base}
        for name, backend in (("ppr-half", "auto"), ("ppr-half, full P", "matrix")):
            layer = DiffusionAttention(D, H, heads=HALF, causal=True, backend=backend).to(args.device)
            layer.load_state_dict(base.state_dict(), strict=False)
            mods[name] = layer
        x = torch.randn(B, N, D, device=args.device)
        for backward in (False, True):
            for m in mods.values():
                m.train(backward)
            t = C.measure(C.step_callables(mods, x, backward), device=args.device, rounds=rounds)
            mode = "fwd+bwd" if backward else "fwd"
            for name in ("ppr-half", "ppr-half, full P"):
                r = C.ratio(t, name, "attention")
                rows.append([name, N, B, mode, C.ms(t["attention"].median), C.ms(t[name].median), C.rfmt(r)])
                rep.rows.append({"layer": name, "N": N, "B": B, "mode": mode, "attention_s": t["attention"].median,
                                 "layer_s": t[name].median, "layer/attention": r})
    rep.table(f"D={D}, H={H}, `{HALF}`, causal; times in ms (median of {rounds} interleaved rounds); ratios are "
              "medians of paired per-round ratios [inter-quartile range] against the all-attention layer",
              ["layer", "N", "B", "mode", "attention ms", "layer ms", "layer / attention"], rows)
    rep.write()
    return rep


if __name__ == "__main__":
    main()
