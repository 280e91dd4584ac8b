"""Every number of the comparison tables of the published results pages, re-derived with numpy/scipy.

A statistician's review of ``docs/results/*.md`` (issue 16): for each page, the per-run values of
``docs/results/<name>/results.json`` and its config (``experiments/configs/*.toml``, matched by ``name``) give,
independently of ``diffusionformer.experiments``, every cell the page prints: mean ± sample std (ddof 1) per
setting; and for each setting against the first, over the seeds both have, Δ, the t interval, df = n - 1, the
two-sided paired t p (``scipy.stats.ttest_rel``; Nadeau-Bengio's variance ``(1/n + 1/(K-1)) s²`` for k-fold
tasks), the exact Wilcoxon signed-rank p (zeros dropped, ties mid-ranked, all ``2^n`` sign patterns counted), and
Holm's adjustment over the page's family: the contrasts of one quantity (final, at the best ``select_by``
evaluation, steps to ``reach``), the primary ones (``primary`` on ``primary_quantities``) among the primary ones of that quantity.

What the review found: every cell of the 14 pages matches, and so do both cross-study tables of ``index.md``
(``summary``), the over-fitting pages' primary-contrast tables (from their published logs), the pages republished
from the published folders (``publish ... --out docs/results``: only the config path differs) and the numbers of the
index's prose. The Wilcoxon p is only reproduced with the pages' own reading of float32 metrics: test accuracies of
the same count of graphs or nodes differ in the last bits (``0.0526315789473684`` and ``0.0526315789473685`` are
both 1/19), so the differences are rounded to 6 decimals before ranking and before asking whether they spread;
ranking the raw floats (``scipy.stats.wilcoxon`` on them) breaks those ties and gives other p (0.531 instead of 0.633
for study-graph-cv / mutag / laplacian-1), and the raw floats of csbm-h0.9 / polynomial (+1.5 points on every seed)
give a paired t p of 2e-12 where the page, rightly, says n/a.

The test fails when a page drifts from its data or from the statistics its legend states (a page not republished
after a change of ``results.json`` or of the statistics code).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import tomllib
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from experiments_references import holm_reference  # noqa: E402 (tests/experiments, on sys.path via conftest)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
CONFIGS = ROOT / "experiments" / "configs"
PAGES = sorted(p.stem for p in RESULTS.glob("*.md") if p.stem != "index")
KINDS = ("final", "selected", "reach")
VALUE_KEY = {"final": "value", "selected": "selected_value", "reach": "reach_step"}


@lru_cache(maxsize=None)
def _configs() -> dict[str, dict]:
    out = {}
    for path in CONFIGS.glob("*.toml"):
        raw = tomllib.loads(path.read_text())
        out[raw["name"]] = raw
    return out


def _tables(page: str) -> dict[tuple[str, str], dict[str, dict[str, str]]]:
    """``{(task, kind): {setting: {column: cell}}}`` of the comparison tables of a page."""
    out: dict[tuple[str, str], dict[str, dict[str, str]]] = {}
    key, cols = None, None
    for line in (RESULTS / f"{page}.md").read_text().splitlines():
        heading = (re.match(r"^## (\S+) \(.*\): \S+, (?:higher|lower) is better$", line),
                   re.match(r"^### (\S+): .* at best \S+$", line), re.match(r"^### (\S+): steps to ", line))
        if line.startswith("#"):
            key = next(((m.group(1), kind) for m, kind in zip(heading, KINDS) if m), None)
            cols = None
        elif key and line.startswith("| operator |"):
            cols = [c.strip() for c in line.strip("|").split("|")]
        elif key and cols and line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out.setdefault(key, {})[cells[0]] = dict(zip(cols, cells))
    return out


def _wilcoxon(d: list[float]) -> float:
    nz = [x for x in d if x != 0.0]
    if not nz:
        return 1.0
    ranks = stats.rankdata(np.abs(nz))
    w = ranks[np.array(nz) > 0].sum()
    null = np.array([ranks[list(signs)].sum() for signs in itertools.product([False, True], repeat=len(nz))])
    return min(1.0, 2 * min(np.mean(null <= w + 1e-9), np.mean(null >= w - 1e-9)))


def _paired(a: dict[int, float], b: dict[int, float], folds: int | None) -> dict:
    seeds = sorted(set(a) & set(b))
    x, y = np.array([a[s] for s in seeds], float), np.array([b[s] for s in seeds], float)
    d, n = x - y, len(seeds)
    # float32 metrics of order 1 carry about 7 digits: differences equal to 6 decimals are equal (the pages' stated
    # resolution is 1e-6 of each pair's values; rounding is an independent stand-in that agrees on these data)
    resolved = [round(v, 6) + 0.0 for v in d]
    out = {"mean": d.mean(), "df": n - 1, "pw": _wilcoxon(resolved)}
    if len(set(resolved)) == 1:  # no spread: t undefined, unless every difference is zero (t = 0, p = 1)
        m = 0.0 if resolved[0] == 0.0 else d.mean()
        return {**out, "mean": m, "p": 1.0 if m == 0.0 else None, "low": m, "high": m}
    if folds is None:
        test = stats.ttest_rel(x, y)
        p, se = test.pvalue, d.std(ddof=1) / math.sqrt(n)
    else:
        se = d.std(ddof=1) * math.sqrt(1 / n + 1 / (folds - 1))
        p = 2 * stats.t.sf(abs(d.mean() / se), n - 1)
    half = stats.t.ppf(0.975, n - 1) * se
    return {**out, "p": p, "low": d.mean() - half, "high": d.mean() + half}


def _fmt_p(p: float | None) -> str:
    if p is None:
        return "n/a"
    if p < 0.001:
        return "<0.001"
    return f"{p:.4f}" if 0.0495 <= p < 0.0505 else f"{p:.3f}"


def _signed(x: float, digits: int) -> str:
    return f"{round(x, digits) + 0.0:+.{digits}f}"


def _runs(page: str) -> list[dict]:
    return [r for r in json.loads((RESULTS / page / "results.json").read_text())["runs"] if r["status"] == "completed"]


@pytest.mark.parametrize("page", PAGES)
def test_every_cell_of_a_results_page_is_rederived_from_its_published_runs(page):
    cfg = _configs()[page]
    runs, tables = _runs(page), _tables(page)
    settings = [o["name"] for o in cfg["operators"]]
    base = settings[0]
    primary = cfg.get("primary", [])
    primary_kinds = cfg.get("primary_quantities", list(KINDS))
    contrasts = []  # (kind, primary, derived, printed row)
    for task in cfg["tasks"]:
        name = task["name"]
        kinds = ["final"] + ["selected"] * bool(task.get("select_by")) + ["reach"] * bool(task.get("reach"))
        for kind in kinds:
            table = tables[(name, kind)]
            assert list(table) == settings, (page, name, kind)

            def values(setting, kind=kind, name=name):
                return {r["seed"]: r[VALUE_KEY[kind]] for r in runs if r["task"] == name and r["operator"] == setting}

            for setting in settings:
                got, row = values(setting), table[setting]
                finite = [v for v in got.values() if v is not None]
                if kind == "reach":
                    spread = f" ± {np.std(finite, ddof=1):.0f}" if len(finite) > 1 else ""
                    want = f"{np.mean(finite):.0f}{spread} ({len(finite)} of {len(got)})"
                    assert row["steps mean ± std (runs that reached it)"] == want, (page, name, setting)
                else:
                    want = f"{np.mean(finite):.4f} ± {np.std(finite, ddof=1):.4f}"
                    assert row[next(c for c in row if c.endswith("mean ± std"))] == want, (page, name, kind, setting)
                if setting == base or f"Δ vs {base}" not in row:
                    continue
                censored = kind == "reach" and None in [*got.values(), *values(base).values()]
                derived = None if censored else _paired(got, values(base), task.get("folds"))
                named = (setting in primary or f"{name}:{setting}" in primary) and kind in primary_kinds
                contrasts.append((kind, named, derived, row, (page, name, kind, setting)))
    for kind in KINDS:
        family = [c for c in contrasts if c[0] == kind]
        # Holm over every contrast of the quantity; a primary one over the primary contrasts of the quantity alone
        for members in (family, [c for c in family if c[1]]):
            for c, adjusted in zip(members, holm_reference([None if c[2] is None else c[2]["p"] for c in members])):
                c[3]["_holm"] = adjusted
        for _, _, derived, row, where in family:
            if derived is None:  # censored steps: no test, every statistic n/a
                cells = (f"Δ vs {base}", "95% CI", "df", "p", "p Wilcoxon", "p Holm")
                assert {row[k] for k in cells} == {"n/a"}, where
                continue
            digits = 0 if kind == "reach" else 4
            want = {f"Δ vs {base}": _signed(derived["mean"], digits),
                    "95% CI": f"[{_signed(derived['low'], digits)}, {_signed(derived['high'], digits)}]",
                    "df": str(derived["df"]), "p": _fmt_p(derived["p"]), "p Wilcoxon": _fmt_p(derived["pw"]),
                    "p Holm": _fmt_p(None if derived["p"] is None else row["_holm"])}
            assert {k: row[k].strip("*") for k in want} == want, where
            assert row["p Holm"].startswith("**") == (derived["p"] is not None and row["_holm"] < 0.05), where


def test_the_pages_of_the_study_all_have_their_published_runs_and_config():
    assert len(PAGES) == 14
    for page in PAGES:
        assert page in _configs() and (RESULTS / page / "results.json").is_file(), page
