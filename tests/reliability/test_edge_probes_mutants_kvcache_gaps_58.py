"""Mutation audit of ``nn/kv_cache.py`` and ``experiments/gaps.py``: checks against independent references.

The primary-contrast table of the gap study is read back and compared with ``scipy.stats`` (paired t, exact
Wilcoxon, the t interval) and Holm's adjustment computed by hand; cached decoding is compared with the float64 full
forward of the same layer for every split of the tokens into calls, long prompts formed a block of rows at a time
included.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.experiments.config import load_experiment_config
from diffusionformer.experiments.gaps import primary_table
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn import kv_cache as _kv
from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached

_STUDY = ('name = "g"\nseeds = [0, 1, 2, 3, 4]\nprimary = ["lap", "lap2"]\nprimary_quantities = ["final"]\n[[tasks]]\n'
          'name = "t"\ndataset = "pydoc-chars"\nmodel = "gpt-char-tiny"\nmetric = "val_loss"\n[[operators]]\n'
          'name = "attention"\n[[operators]]\nname = "lap"\nlaplacian_heads = 1\n[[operators]]\nname = "lap2"\n'
          'laplacian_heads = 2\n')

# per setting: (final_val, final_gap) per seed 0..4; the baseline misses no seed, lap2 misses seed 4 (unpaired)
_TABLE = {
    "attention": [(2.50, 0.40), (2.61, 0.45), (2.47, 0.38), (2.55, 0.50), (2.58, 0.41)],
    "lap": [(2.41, 0.31), (2.57, 0.33), (2.40, 0.37), (2.42, 0.35), (2.50, 0.30)],
    "lap2": [(2.52, 0.47), (2.60, 0.36), (2.49, 0.45), (2.51, 0.52)],
}


def _rows():
    return {"t": {s: {seed: {"final_val": v, "final_gap": g, "final_train": v - g, "best_val": v - 0.05,
                             "best_step": 100.0, "best_gap": g - 0.01}
                      for seed, (v, g) in enumerate(values)} for s, values in _TABLE.items()}}


def _cells(text):
    """``{contrast: [Δ, CI, t, df, p, p Wilcoxon, p Holm]}`` of the primary table's rows."""
    out = {}
    for line in text.splitlines():
        if line.startswith("| t,") or line.startswith("| *exploratory:* t,"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[cells[0]] = cells[1:]
    return out


def test_primary_table_equals_scipy_paired_t_wilcoxon_and_hand_holm(tmp_path):
    """Independent reference for the gap study's primary cells (kills: the sign of Δ, the pairing over shared seeds,
    df, the CI bounds, Wilcoxon shown as t's p, Holm's family, order and pairing with its cells)."""
    stats = pytest.importorskip("scipy.stats")
    cfg = tmp_path / "g.toml"
    cfg.write_text(_STUDY)
    config = load_experiment_config(str(cfg))
    table = primary_table(config, tmp_path, ("final_val", "final_gap"), rows=_rows())
    cells = _cells(table)
    base = _TABLE["attention"]
    expected, raw = {}, []
    for setting in ("lap", "lap2"):
        for q, label in ((0, "final val loss"), (1, "final gap")):
            mine = _TABLE[setting]
            n = len(mine)  # the seeds both have: the baseline has every seed
            a, b = [m[q] for m in mine], [base[i][q] for i in range(n)]
            d = [x - y for x, y in zip(a, b)]
            res = stats.ttest_rel(a, b)
            low, high = res.confidence_interval(0.95)
            w = stats.wilcoxon(d, method="exact").pvalue
            expected[f"t, {setting}, {label}"] = (sum(d) / n, low, high, res.statistic, n - 1, res.pvalue, w)
            raw.append((f"t, {setting}, {label}", res.pvalue))
    # Holm by hand: sorted ascending, (m - j) p_(j) for j = 0.., running maximum, capped at 1
    holm, running = {}, 0.0
    for j, (name, p) in enumerate(sorted(raw, key=lambda r: r[1])):
        running = max(running, min(1.0, (len(raw) - j) * p))
        holm[name] = running
    assert set(expected) <= set(cells), table
    for name, (mean, low, high, t, df, p, w) in expected.items():
        delta, ci, t_cell, df_cell, p_cell, w_cell, holm_cell = cells[name]
        assert float(delta) == pytest.approx(mean, abs=5e-5), name
        assert ci == f"[{low:+.4f}, {high:+.4f}]", name
        assert float(t_cell) == pytest.approx(t, abs=5e-3), name
        assert int(df_cell) == df, name
        assert float(p_cell) == pytest.approx(p, rel=0.05), name
        assert float(w_cell) == pytest.approx(w, rel=0.05), name  # two significant digits
        assert float(holm_cell) == pytest.approx(holm[name], rel=0.05), name
    assert "adjusted over the 4 primary cells" in table
    assert all(c[-1] == "" for k, c in cells.items() if k.startswith("*exploratory:*"))


def _layer(spec, kv_heads=1):
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 2, spec, causal=True, num_kv_heads=kv_heads).double().eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "operators" in name:
                p.add_(0.3 * torch.randn_like(p))
    return layer


@pytest.mark.parametrize("spec", ["heat(steps=4):1,laplacian:1", "polynomial(steps=0,init=[0.7]):2",
                                  "ppr(steps=3):1,heat-exact:1"])
@pytest.mark.parametrize("rows", [None, 2 * 2 * 9])  # default; one row of P per block at T = 9 (blocked prompt)
def test_cached_chunks_equal_the_float64_full_forward(spec, rows, monkeypatch):
    """Reference: the layer's full forward in float64; every split of 9 tokens into calls gives its rows (the second
    call's long chunk formed a block of rows at a time reads the powers the first call cached)."""
    layer = _layer(spec)
    x = torch.randn(2, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    if rows is not None:
        monkeypatch.setattr(_kv, "_ROWS_OF_P", rows)
    with torch.no_grad():
        full = layer(x)
        for chunks in ([9], [1] * 9, [3, 6], [5, 1, 3]):
            cache, outs, s = LayerKVCache(), [], 0
            for c in chunks:
                outs.append(attend_cached(layer, x[:, s : s + c], cache))
                s += c
            torch.testing.assert_close(torch.cat(outs, 1), full, rtol=0, atol=1e-12, msg=f"{spec} {chunks}")
