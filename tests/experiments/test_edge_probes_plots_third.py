"""Edge probes of ``experiments.plots`` (third pass): the figures' numbers read back from real matplotlib (Agg)
objects and compared with float64 numpy means / population stds of hand-written ``metrics.jsonl`` logs."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from diffusionformer.experiments import load_experiment_config  # noqa: E402
from diffusionformer.experiments import plots  # noqa: E402
from diffusionformer.experiments.results import RunResult  # noqa: E402


def _cfg(seeds=(0, 1), settings=2):
    return load_experiment_config({
        "name": "mk", "seeds": list(seeds),
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
                   "train": {"max_steps": 2, "batch_size": 8, "warmup_steps": 0}}],
        "operators": [{"name": "attention"}] + [{"name": f"lap{i}", "laplacian_heads": 1} for i in range(settings - 1)],
    })


def _log(out, op, seed, records):
    rdir = out / "runs" / "digits" / op / f"seed{seed}"
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _tr(step, loss):
    return {"step": step, "split": "train", "loss": loss, "metrics": {}}


def _ev(step, acc):
    return {"step": step, "split": "eval", "loss": 1.0, "metrics": {"test_acc": acc}}


@pytest.fixture
def made(monkeypatch):
    """The real matplotlib figures ``plot_experiment`` makes, kept to read their artists back."""
    figs = []
    real = plots._figure

    def keep(*args, **kwargs):
        fig = real(*args, **kwargs)
        figs.append(fig)
        return fig

    monkeypatch.setattr(plots, "_figure", keep)
    return figs


def _lines(ax):
    return [(line.get_label(), np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float))
            for line in ax.get_lines()]


def test_bug_a_failed_runs_relogged_step_reads_as_its_last_record_in_step_order(tmp_path, made):
    """Bug: a failed run's partial curve was drawn in log order with every record, so a log that re-logged step 1
    after step 2 (a resume that was not truncated) drew a dotted line running back from step 2 to step 1 with both
    values of step 1; the curve now holds each step once, its last record, in step order."""
    out = tmp_path / "mk"
    _log(out, "attention", 0, [_tr(1, 1.0), _tr(2, 0.5), _ev(2, 0.5)])
    _log(out, "attention", 1, [_tr(1, 1.5), _tr(2, 1.2), _tr(1, 1.4)])
    results = [RunResult("digits", "attention", 0, "completed", "test_acc", 0.5),
               RunResult("digits", "attention", 1, "failed: killed", "test_acc", None)]
    plots.plot_experiment(out, _cfg(settings=1), results)
    (_, x, y), = [line for line in _lines(made[0].axes[0]) if "failed" in line[0]]
    assert x.tolist() == [1.0, 2.0] and y.tolist() == [1.4, 1.2]


def test_bug_a_relogged_step_whose_last_record_is_nan_does_not_fall_back_to_the_stale_one(tmp_path, made):
    """Bug: ``_series`` dropped the non-finite values before taking a step's last record, so a step logged twice,
    first 9.0 and last null (NaN), entered the mean with the stale 9.0 the resume had replaced; the last record is
    taken first, and a step whose last value is not finite is left out (the band over the steps both seeds have)."""
    out = tmp_path / "mk"
    _log(out, "attention", 0, [_tr(1, 1.0), _tr(2, 9.0), _tr(3, 0.2), _tr(2, None), _tr(3, 0.3), _ev(3, 0.5)])
    _log(out, "attention", 1, [_tr(1, 2.0), _tr(2, 1.0), _tr(3, 0.5), _ev(3, 0.7)])
    results = [RunResult("digits", "attention", s, "completed", "test_acc", a) for s, a in ((0, 0.5), (1, 0.7))]
    plots.plot_experiment(out, _cfg(settings=1), results)
    loss_ax = made[0].axes[0]
    (_, x, m), = _lines(loss_ax)
    want = np.array([[1.0, 0.3], [2.0, 0.5]], dtype=np.float64)  # steps 1 and 3; step 2 has no value of seed 0
    assert x.tolist() == [1.0, 3.0]
    np.testing.assert_allclose(m, want.mean(0), rtol=0, atol=1e-12)
    verts = loss_ax.collections[0].get_paths()[0].vertices
    sd = want.std(0)  # population std, as the docs of gap_curves say of all the comparison's figures
    for xv, lo, hi in zip([1.0, 3.0], want.mean(0) - sd, want.mean(0) + sd):
        at = verts[np.isclose(verts[:, 0], xv), 1]
        assert at.min() == pytest.approx(lo, abs=1e-12) and at.max() == pytest.approx(hi, abs=1e-12)


def test_bug_a_single_seeds_point_stands_on_its_mean_marker(tmp_path, made):
    """Bug: the final figure spread a setting's seed points by ``np.linspace(-0.12, 0.12, n)``, which for one seed is
    ``[-0.12]``: a lone run's point stood beside its setting's marker (x = i - 0.12, not i)."""
    out = tmp_path / "mk"
    _log(out, "attention", 0, [_tr(1, 1.0), _ev(1, 0.5)])
    _log(out, "attention", 1, [_tr(1, 1.0), _ev(1, 0.7)])
    _log(out, "lap0", 0, [_tr(1, 1.0), _ev(1, 0.6)])
    results = [RunResult("digits", "attention", 0, "completed", "test_acc", 0.5),
               RunResult("digits", "attention", 1, "completed", "test_acc", 0.7),
               RunResult("digits", "lap0", 0, "completed", "test_acc", 0.6),
               RunResult("digits", "lap0", 1, "failed: killed", "test_acc", None)]
    plots.plot_experiment(out, _cfg(), results)
    from matplotlib.collections import PathCollection
    points = [c.get_offsets().tolist() for c in made[1].axes[0].collections if isinstance(c, PathCollection)]
    assert points == [[[-0.12, 0.5], [0.12, 0.7]], [[1.0, 0.6]]]
    # and the mean markers / error bars: sample std (ddof=1) of the two, none for one seed
    ys = [line.get_ydata().tolist() for line in made[1].axes[0].get_lines()]
    sd = float(np.std([0.5, 0.7], ddof=1))
    assert ys[0] == pytest.approx([0.6]) and ys[1:3] == [pytest.approx([0.6 - sd]), pytest.approx([0.6 + sd])]


def test_pins_seeds_of_different_lengths_band_over_the_shared_steps_and_no_figure_left_open(tmp_path, made):
    """A seed that logged fewer steps (a shorter completed run) limits the band to the steps every seed logged, with
    the mean and population std of those seeds there; the duplicate step of a resumed log reads as its last record;
    ``plot_experiment`` uses no pyplot figure, so none is left open, and no temporary folder is left beside the PNGs."""
    import matplotlib.pyplot as plt
    open_before = plt.get_fignums()  # another test file in this worker may have left a pyplot figure open
    out = tmp_path / "mk"
    _log(out, "attention", 0, [_tr(1, 1.0), _tr(2, 0.8), _tr(2, 0.6), _tr(3, 0.4), _ev(3, 0.5)])
    _log(out, "attention", 1, [_tr(1, 1.2), _tr(2, 0.9), _ev(2, 0.7)])
    _log(out, "attention", 2, [_tr(2, 1.1), _tr(3, 0.1), _ev(3, 0.9)])
    results = [RunResult("digits", "attention", s, "completed", "test_acc", a)
               for s, a in ((0, 0.5), (1, 0.7), (2, 0.9))]
    written = plots.plot_experiment(out, _cfg(seeds=(0, 1, 2), settings=1), results)
    (label, x, m), = _lines(made[0].axes[0])
    assert label == "attention (n=3)" and x.tolist() == [2.0]
    want = np.array([0.6, 0.9, 1.1], dtype=np.float64)
    assert m.tolist() == pytest.approx([want.mean()], abs=1e-12)
    ys = made[0].axes[0].collections[0].get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(want.mean() - want.std()) and ys.max() == pytest.approx(want.mean() + want.std())
    assert plt.get_fignums() == open_before
    assert sorted(p.name for p in (out / "plots").iterdir()) == ["digits_curves.png", "digits_final.png"] == \
        sorted(p.name for p in written)


def test_bug_eleven_settings_do_not_draw_alike(tmp_path, made):
    """Bug: the figures coloured setting ``i`` with ``f"C{i}"``, and matplotlib's cycle has ten colours, so the 11th
    setting drew as the 1st (same colour, same solid line, same "o" marker) and the two could not be told apart;
    past ten settings the line style (curves) and marker (final plot) change, read back from the artists."""
    from matplotlib.colors import to_rgba

    out = tmp_path / "mk"
    cfg = _cfg(seeds=(0,), settings=12)
    names = [s.name for s in cfg.operators]
    results = []
    for k, name in enumerate(names):
        _log(out, name, 0, [_tr(1, 1.0 + k), _tr(2, 0.5 + k), _ev(2, 0.1 * k)])
        results.append(RunResult("digits", name, 0, "completed", "test_acc", 0.01 * k))
    plots.plot_experiment(out, cfg, results)
    curves, final = made[0].axes[0], made[1].axes[0]
    looks = {line.get_label(): (to_rgba(line.get_color()), line.get_linestyle()) for line in curves.get_lines()}
    assert len(looks) == 12 and len(set(looks.values())) == 12
    assert all(style != ":" for _, style in looks.values())  # dotted stays a failed run's mark
    points = [(to_rgba(line.get_color()), line.get_marker()) for line in final.get_lines()
              if line.get_marker() not in ("_", "None", "", None)]  # the mean points (not errorbar caps)
    assert len(points) == 12 and len(set(points)) == 12
